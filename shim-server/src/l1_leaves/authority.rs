//! Accepts the `:authority` that gRPC C-core clients (Python grpcio, Ruby, PHP, C++) send over
//! a unix socket: the percent-encoded socket path, e.g. `run%2Fdipam%2Fdipam.sock`
//! (grpc/grpc#34305, since grpcio 1.57). RFC 3986 §3.2.2 allows percent-encoding in a host
//! name, but the `http` crate's `Authority` refuses it, and h2, under hyper and tonic, resets
//! every such request with PROTOCOL_ERROR while it decodes the headers (h2
//! `server::Peer::convert_poll_message`), before any tower layer or handler runs. Without this
//! module every call of such a client fails with INTERNAL "RST_STREAM with error code 1"
//! unless it sets `grpc.default_authority`. grpc-java's socket-path authority (grpc-java#12664)
//! is refused the same way and fixed the same way.
//!
//! h2 has no option to relax that check, so the fix sits under it: each accepted connection
//! is read through a [`Rewriter`] that parses the client's HTTP/2 frames and decodes the first
//! request's headers (HPACK, RFC 7541). When that request's `:authority` is one the HTTP/2
//! server would refuse, every header block of the connection is re-encoded with
//! `:authority: localhost` (what grpc-go sends for unix targets) and all other headers
//! unchanged, as literals that do not use the server's dynamic table. Otherwise (dipam's own
//! plugin and dipamctl, Go clients, grpcurl, any client that sets an authority) the
//! connection is handed to the server untouched from then on, and costs one header decode.
//! The authority is not used for anything else by dipamd: a unix socket has one server.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a refused authority is replaced with.
pub const REPLACEMENT: &[u8] = b"localhost";

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value, which every HTTP/2 server accepts (RFC 9113
/// §6.5.2): rewritten header blocks are cut into frames of at most this size.
const MAX_FRAME: usize = 16_384;
/// The largest header block this module reads; h2 refuses far smaller header lists (16 KiB
/// by default in hyper), so a larger one is handed on untouched, or ends a rewritten
/// connection.
const MAX_BLOCK: usize = 256 * 1024;
/// SETTINGS_HEADER_TABLE_SIZE's initial value, which dipamd's server keeps: the largest HPACK
/// dynamic table a client may use (RFC 7541 §4.2).
const TABLE_SIZE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reading the connection preface.
    Preface,
    /// Waiting for the first header block, the one that decides.
    Inspect,
    /// The client sends an authority the server refuses: every header block is rewritten.
    Rewrite,
    /// Nothing to do for this connection: bytes pass unchanged.
    Through,
}

/// A header block being read: its HEADERS frame's stream, flags and priority, its fragments,
/// and (while still inspecting) its frames as received, to hand on unchanged.
#[derive(Debug)]
struct Block {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    raw: Vec<u8>,
}

/// The client-to-server half of one HTTP/2 connection, parsed to fix `:authority`. Pure: it
/// turns the bytes a client sent into the bytes the server should read.
pub struct Rewriter {
    mode: Mode,
    /// Received and not yet handed on.
    pending: Vec<u8>,
    /// Bytes of a frame that is not a header block still to hand on unchanged.
    skip: usize,
    block: Option<Block>,
    /// Mirrors the client's HPACK encoder: its dynamic table decides what later blocks mean.
    decoder: loona_hpack::Decoder<'static>,
    /// Header blocks rewritten so far (for tests and the log).
    pub rewritten: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("mode", &self.mode)
            .field("pending", &self.pending.len())
            .field("rewritten", &self.rewritten)
            .finish()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether the HTTP/2 server refuses `value` as an authority (the same parser h2 uses).
pub fn refused(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_err()
}

impl Rewriter {
    pub fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            mode: Mode::Preface,
            pending: Vec::new(),
            skip: 0,
            block: None,
            decoder,
            rewritten: 0,
        }
    }

    /// Whether the connection needs nothing more from this rewriter: everything received has
    /// been handed on and the rest passes unchanged.
    pub fn is_through(&self) -> bool {
        self.mode == Mode::Through && self.pending.is_empty()
    }

    /// The client closed its side: whatever is left goes to the server as it is (an
    /// incomplete frame, which the server reports).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.raw);
        }
        out.append(&mut self.pending);
        self.mode = Mode::Through;
    }

    /// Takes `input` from the client and appends what the server should read to `out`. An
    /// error ends the connection: a rewritten connection whose framing breaks cannot be
    /// handed on (the server's HPACK state no longer matches the client's).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.pending.extend_from_slice(input);
        loop {
            match self.mode {
                Mode::Through => {
                    out.append(&mut self.pending);
                    return Ok(());
                }
                Mode::Preface => {
                    let n = self.pending.len().min(PREFACE.len());
                    if self.pending[..n] != PREFACE[..n] {
                        // Not HTTP/2 with prior knowledge: the server answers it as it will.
                        self.mode = Mode::Through;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    out.extend(self.pending.drain(..PREFACE.len()));
                    self.mode = Mode::Inspect;
                }
                Mode::Inspect | Mode::Rewrite => {
                    if self.skip > 0 {
                        let n = self.skip.min(self.pending.len());
                        out.extend(self.pending.drain(..n));
                        self.skip -= n;
                        if self.pending.is_empty() {
                            return Ok(());
                        }
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let h = &self.pending[..FRAME_HEADER];
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let kind = h[3];
                    if kind != HEADERS && kind != CONTINUATION {
                        if self.block.is_some() {
                            // RFC 9113 §6.10: nothing may interleave a header block.
                            self.give_up(out)?;
                            continue;
                        }
                        out.extend(self.pending.drain(..FRAME_HEADER));
                        self.skip = len;
                        continue;
                    }
                    if len > MAX_BLOCK {
                        self.give_up(out)?;
                        continue;
                    }
                    if self.pending.len() < FRAME_HEADER + len {
                        return Ok(());
                    }
                    let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
                    self.header_frame(frame, out)?;
                }
            }
        }
    }

    /// Takes one HEADERS or CONTINUATION frame. Framing that RFC 9113 does not allow is
    /// handed on as it came (with the block it interrupts), for the server to report.
    fn header_frame(&mut self, frame: Vec<u8>, out: &mut Vec<u8>) -> io::Result<()> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        if kind == HEADERS {
            if self.block.is_some() {
                let open = self.block.take();
                return self.refuse(open, Some(&frame), out);
            }
            let mut body = payload;
            let mut pad = 0;
            if flags & PADDED != 0 {
                let Some((&p, rest)) = body.split_first() else {
                    return self.refuse(None, Some(&frame), out);
                };
                pad = usize::from(p);
                body = rest;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let Some(p) = body.get(..5) else {
                    return self.refuse(None, Some(&frame), out);
                };
                priority = Some([p[0], p[1], p[2], p[3], p[4]]);
                body = &body[5..];
            }
            if pad > body.len() {
                return self.refuse(None, Some(&frame), out);
            }
            let fragment = body[..body.len() - pad].to_vec();
            self.block = Some(Block {
                stream,
                flags: flags & (END_STREAM | PRIORITY),
                priority,
                fragment,
                raw: Vec::new(),
            });
        } else {
            match &mut self.block {
                Some(b) if b.stream == stream => b.fragment.extend_from_slice(payload),
                _ => {
                    let open = self.block.take();
                    return self.refuse(open, Some(&frame), out);
                }
            }
        }
        let inspecting = self.mode == Mode::Inspect;
        let Some(block) = self.block.as_mut() else {
            return Ok(());
        };
        if inspecting {
            block.raw.extend_from_slice(&frame);
        }
        if block.fragment.len() > MAX_BLOCK {
            let open = self.block.take();
            return self.refuse(open, None, out);
        }
        if flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.end_block(block, out)?;
        }
        Ok(())
    }

    /// [`Self::give_up_with`] `block`, then hands on `frame`, which it does not hold.
    fn refuse(
        &mut self,
        block: Option<Block>,
        frame: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        self.give_up_with(block, out)?;
        out.extend_from_slice(frame.unwrap_or_default());
        Ok(())
    }

    fn end_block(&mut self, block: Block, out: &mut Vec<u8>) -> io::Result<()> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = match self.decoder.decode(&block.fragment) {
            Ok(h) => h,
            Err(_) => {
                // The server's own decoder will say what is wrong with it.
                return self.give_up_with(Some(block), out);
            }
        };
        let bad = headers
            .iter()
            .any(|(n, v)| n.as_slice() == b":authority" && refused(v));
        if self.mode == Mode::Inspect && !bad {
            out.extend_from_slice(&block.raw);
            self.mode = Mode::Through;
            return Ok(());
        }
        if self.mode == Mode::Inspect {
            tracing::debug!(
                "client sends an :authority the HTTP/2 server refuses (a C-core gRPC client on a \
                 unix socket); its requests are read with :authority localhost"
            );
        }
        self.mode = Mode::Rewrite;
        for (n, v) in &mut headers {
            if n.as_slice() == b":authority" && refused(v) {
                *v = REPLACEMENT.to_vec();
            }
        }
        let mut encoded = Vec::new();
        for (n, v) in &headers {
            // Literal Header Field without Indexing, new name (RFC 7541 §6.2.2), strings not
            // Huffman-coded: nothing the server's dynamic table holds is referred to or added.
            encoded.push(0);
            for s in [n, v] {
                loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, &mut encoded)?;
                encoded.extend_from_slice(s);
            }
        }
        self.rewritten += 1;
        let prio = block.priority.map_or(0, |_| 5);
        let mut rest: &[u8] = &encoded;
        let mut first = true;
        loop {
            let room = if first { MAX_FRAME - prio } else { MAX_FRAME };
            let take = rest.len().min(room);
            let (chunk, tail) = rest.split_at(take);
            let end = if tail.is_empty() { END_HEADERS } else { 0 };
            let (kind, flags, extra) = if first {
                (
                    HEADERS,
                    block.flags | end,
                    block.priority.as_ref().map_or(&[][..], |p| &p[..]),
                )
            } else {
                (CONTINUATION, end, &[][..])
            };
            let len = extra.len() + chunk.len();
            out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
            out.extend_from_slice(&block.stream.to_be_bytes());
            out.extend_from_slice(extra);
            out.extend_from_slice(chunk);
            rest = tail;
            first = false;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    fn give_up(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let block = self.block.take();
        self.give_up_with(block, out)
    }

    /// The connection is not one this module understands. Before anything was rewritten the
    /// server gets the original bytes and answers as it would have; after, the server's HPACK
    /// state is no longer the client's, and the connection must end.
    fn give_up_with(&mut self, block: Option<Block>, out: &mut Vec<u8>) -> io::Result<()> {
        if self.mode == Mode::Rewrite {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "HTTP/2 framing the :authority rewrite cannot follow",
            ));
        }
        if let Some(b) = block {
            out.extend_from_slice(&b.raw);
        }
        self.mode = Mode::Through;
        Ok(())
    }
}

/// A server connection read through a [`Rewriter`]; writes pass unchanged. Once the first
/// request showed that the connection needs nothing, reads go straight to the socket.
pub struct Fixed<S> {
    inner: S,
    rewriter: Option<Box<Rewriter>>,
    out: Vec<u8>,
    at: usize,
}

impl<S> Fixed<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Some(Box::default()),
            out: Vec::new(),
            at: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Fixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.at);
                buf.put_slice(&this.out[this.at..this.at + n]);
                this.at += n;
                if this.at == this.out.len() {
                    this.out.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let Some(rw) = this.rewriter.as_mut() else {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            };
            if rw.is_through() {
                this.rewriter = None;
                this.out = Vec::new();
                continue;
            }
            let mut scratch = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                rw.finish(&mut this.out);
                this.rewriter = None;
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            rw.feed(rb.filled(), &mut this.out)?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Fixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The peer credentials the access check reads (access.rs) are the socket's.
impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Fixed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn request(authority: &[u8]) -> Headers {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/dipam.v1.Agent/List".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn encode(enc: &mut loona_hpack::Encoder<'_>, h: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        enc.encode(h.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// The server's view: every header block of `bytes` decoded by a fresh decoder, as h2's
    /// would be, with the non-header frames' types.
    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn server_reads(bytes: &[u8]) -> (Vec<Headers>, Vec<u8>) {
        assert!(bytes.starts_with(PREFACE));
        let mut rest = &bytes[PREFACE.len()..];
        let mut dec = loona_hpack::Decoder::new();
        let (mut blocks, mut others, mut block) = (Vec::new(), Vec::new(), Vec::new());
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let mut p = &rest[9..9 + len];
            if kind == HEADERS || kind == CONTINUATION {
                if kind == HEADERS && flags & PRIORITY != 0 {
                    p = &p[5..];
                }
                assert_eq!(flags & PADDED, 0);
                block.extend_from_slice(p);
                if flags & END_HEADERS != 0 {
                    blocks.push(dec.decode(&block).unwrap());
                    block.clear();
                }
            } else {
                others.push(kind);
            }
            rest = &rest[9 + len..];
        }
        (blocks, others)
    }

    fn feed_all(input: &[u8], chunk: usize) -> (Vec<u8>, Rewriter) {
        let mut rw = Rewriter::new();
        let mut out = Vec::new();
        for c in input.chunks(chunk) {
            rw.feed(c, &mut out).unwrap();
        }
        rw.finish(&mut out);
        (out, rw)
    }

    const SETTINGS: u8 = 0x4;
    const DATA: u8 = 0x0;

    #[test]
    fn refused_is_what_h2_refuses() {
        assert!(refused(b"tmp%2Fdipam%2Fdipam.sock"));
        assert!(refused(b"/run/dipam/dipam.sock"));
        assert!(!refused(b"localhost"));
        assert!(!refused(b"dipam.sock"));
        assert!(!refused(b"[::1]:50051"));
    }

    #[test]
    fn a_good_authority_passes_byte_for_byte_and_the_connection_is_left_alone() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(SETTINGS, 0, 0, &[]));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut enc, &request(b"localhost")),
        ));
        input.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
        // A later block with a refused authority is not looked at: one decode per connection.
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &encode(&mut enc, &request(b"a%2Fb")),
        ));
        for chunk in [1, 7, 4096] {
            let (out, rw) = feed_all(&input, chunk);
            assert_eq!(out, input, "chunk {chunk}");
            assert_eq!(rw.rewritten, 0);
            assert!(rw.is_through());
        }
    }

    #[test]
    fn a_refused_authority_becomes_localhost_in_every_block_and_nothing_else_changes() {
        let mut enc = loona_hpack::Encoder::new();
        let sock = b"tmp%2Fdipam-test%2Fdipam.sock";
        let mut input = PREFACE.to_vec();
        input.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]));
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut enc, &request(sock)),
        ));
        input.extend(frame(DATA, END_STREAM, 1, b"\0\0\0\0\x02\x08\x01"));
        // The second request refers to the first one's entries in the client's dynamic table
        // (the encoder indexes them): the rewriter must follow that table.
        let second = encode(&mut enc, &request(sock));
        assert!(
            second.iter().any(|&b| b >= 0x80 | 62),
            "the encoder refers to its dynamic table: {second:?}"
        );
        // A padded HEADERS with priority, its block split over a CONTINUATION.
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(&second[..2]);
        payload.extend_from_slice(&[0, 0, 0]);
        input.extend(frame(HEADERS, PADDED | PRIORITY, 3, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 3, &second[2..]));
        input.extend(frame(DATA, END_STREAM, 3, b"\0\0\0\0\0"));
        for chunk in [1, 5, 9, 4096] {
            let (out, rw) = feed_all(&input, chunk);
            assert_eq!(rw.rewritten, 2, "chunk {chunk}");
            let (blocks, others) = server_reads(&out);
            assert_eq!(others, vec![SETTINGS, DATA, DATA]);
            assert_eq!(blocks.len(), 2);
            for b in &blocks {
                assert_eq!(*b, request(b"localhost"), "chunk {chunk}");
            }
            // The DATA frames arrive intact.
            assert!(out.windows(7).any(|w| w == b"\0\0\0\0\x02\x08\x01"));
        }
    }

    #[test]
    fn a_large_rewritten_block_is_cut_into_frames_the_server_accepts() {
        let mut enc = loona_hpack::Encoder::new();
        let mut headers = request(b"a%2Fb");
        headers.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
        let block = encode(&mut enc, &headers);
        let mut input = PREFACE.to_vec();
        for (i, part) in block.chunks(MAX_FRAME).enumerate() {
            let last = (i + 1) * MAX_FRAME >= block.len();
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i == 0 { END_STREAM } else { 0 } | if last { END_HEADERS } else { 0 };
            input.extend(frame(kind, flags, 1, part));
        }
        let (out, _) = feed_all(&input, 1000);
        let mut rest = &out[PREFACE.len()..];
        let mut frames = 0;
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME);
            if frames == 0 {
                assert_eq!(rest[4] & END_STREAM, END_STREAM, "END_STREAM kept");
            }
            rest = &rest[9 + len..];
            frames += 1;
        }
        assert!(frames >= 3);
        let (blocks, _) = server_reads(&out);
        let mut want = request(b"localhost");
        want.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
        assert_eq!(blocks, vec![want]);
    }

    #[test]
    fn what_it_cannot_read_reaches_the_server_unchanged() {
        // Not HTTP/2.
        let http1 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(feed_all(http1, 3).0, http1);
        // A header block the HPACK decoder refuses (an index past both tables).
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f]));
        assert_eq!(feed_all(&input, 2).0, input);
        // A CONTINUATION with no HEADERS before it.
        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
        assert_eq!(feed_all(&input, 4).0, input);
        // Cut short: what came is handed on.
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0x82, 0x86]));
        input.truncate(input.len() - 1);
        assert_eq!(feed_all(&input, 4).0, input);
    }

    #[test]
    fn a_rewritten_connection_whose_framing_breaks_is_ended() {
        let mut enc = loona_hpack::Encoder::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut enc, &request(b"a%2Fb")),
        ));
        input.extend(frame(HEADERS, 0, 3, &encode(&mut enc, &request(b"a%2Fb"))));
        input.extend(frame(DATA, 0, 3, b"x"));
        let mut rw = Rewriter::new();
        let mut out = Vec::new();
        let err = rw.feed(&input, &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
