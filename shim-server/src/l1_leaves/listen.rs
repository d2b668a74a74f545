//! Accepting connections without letting any caller starve dipamd (docs/cfp.md, "Threat
//! model"). Every listener (the gRPC socket, the metrics TCP address and unix socket) accepts
//! through a [`Gate`]:
//!
//! - **Descriptors in reserve.** dipamd raises its soft `RLIMIT_NOFILE` to the hard limit at
//!   start ([`raise_nofile`]) and then lets connections use all but [`RESERVE`] of it. Once
//!   that budget is used, the listeners stop accepting (new connections wait in the kernel's
//!   backlog) instead of letting a flood take the descriptors a delegate exec or a ledger
//!   commit needs: an unprivileged flood of the metrics port once made root ADDs fail with
//!   "Too many open files".
//! - **A cap per listener**, and on the gRPC socket per non-root uid: a peer that is neither
//!   root nor allowed is dropped at accept, from its `SO_PEERCRED`, before a byte of HTTP/2 is
//!   read; an allowed uid holds at most `--max-connections-per-uid`. Root is bounded only by
//!   the descriptor budget, so root's pods always reach dipamd. A dropped peer first gets a
//!   fixed answer written, never parsed ([`Refusal::frames`]): its client then reports why
//!   (the plugin's code 155, not 11 "transport error").
//! - **Back-off on accept errors**, with the warning rate-limited: a loop that retried at once
//!   wrote 10.9 million warning lines in 35 s.
//! - **Timeouts on the connection** ([`Guarded`]): a connection that sends nothing within
//!   [`HANDSHAKE`] of its accept, or nothing (not even a keepalive ACK) for [`IDLE`] after,
//!   is closed, so idle connections cannot hold the budget.

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
    time::{Instant, Sleep},
};
use tracing::{info, warn};

/// Descriptors kept out of the connections' reach: the ledger's files, the delegates' pipes
/// and /dev/null (three or four per exec, up to --max-concurrent at once), the runtime's CRI
/// socket, the spool, the history and the netns handles of the teardown worker.
pub const RESERVE: usize = 256;

/// How long a new connection may stay silent before its first byte (the HTTP/2 preface or an
/// HTTP/1 request line).
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// How long an established connection may send nothing at all. The gRPC server pings every
/// [`KEEPALIVE`]; a live client's ACK counts, so only a dead or hostile peer reaches this.
pub const IDLE: Duration = Duration::from_secs(60);

/// The gRPC server's HTTP/2 keepalive ping interval; a ping unanswered for [`KEEPALIVE`]
/// closes the connection.
pub const KEEPALIVE: Duration = Duration::from_secs(20);

/// Default cap on gRPC connections held by one non-root uid (--max-connections-per-uid).
pub const DEFAULT_PER_UID: usize = 32;

/// Default cap on metrics connections (--metrics-max-connections).
pub const DEFAULT_METRICS: usize = 16;

/// Raises the soft descriptor limit to the hard one: the default soft 1024 is what a flood
/// exhausted while the hard limit allowed 20,000. Returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let before = lim.rlim_cur;
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                info!(
                    from = before,
                    to = lim.rlim_max,
                    "raised the soft descriptor limit to the hard limit"
                );
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// The descriptors all listeners share: the soft limit less [`RESERVE`].
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    open: AtomicUsize,
    freed: Notify,
}

impl Budget {
    /// A budget for a process whose soft descriptor limit is `nofile`.
    pub fn new(nofile: u64) -> Arc<Self> {
        let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
        // At least a few connections even under a tiny limit, so dipamd stays reachable.
        let limit = nofile.saturating_sub(RESERVE).max(8);
        Arc::new(Self {
            limit,
            open: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// Connections the budget allows.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Connections open now, over every listener.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until one more connection fits, then takes it.
    async fn take(self: &Arc<Self>) -> Slot {
        loop {
            let freed = self.freed.notified();
            let now = self.open.load(Ordering::SeqCst);
            if now < self.limit
                && self
                    .open
                    .compare_exchange(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                return Slot {
                    budget: Some(Arc::clone(self)),
                    listener: None,
                    uid: None,
                };
            }
            if now >= self.limit {
                freed.await;
            }
        }
    }
}

/// One accepted connection's share of the budget, the listener's cap and its uid's cap;
/// given back when the connection is dropped.
pub struct Slot {
    budget: Option<Arc<Budget>>,
    listener: Option<tokio::sync::OwnedSemaphorePermit>,
    uid: Option<(Arc<PerUid>, u32)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(b) = self.budget.take() {
            b.open.fetch_sub(1, Ordering::SeqCst);
            b.freed.notify_waiters();
        }
        if let Some((per, uid)) = self.uid.take() {
            per.release(uid);
        }
        // A connection that never made a request (a flood of idle or half-sent ones) leaves
        // buffers behind as well: let the heap trimmer give them back (trim.rs).
        crate::l1_leaves::trim::touch();
    }
}

/// Connections held per non-root uid.
#[derive(Debug, Default)]
struct PerUid {
    max: usize,
    held: Mutex<HashMap<u32, usize>>,
}

impl PerUid {
    fn try_take(&self, uid: u32) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(uid).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    fn release(&self, uid: u32) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                held.remove(&uid);
            }
        }
    }
}

/// A warning logged at most once per [`Throttle::EVERY`], with the number it stood for.
#[derive(Debug)]
pub struct Throttle {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl Throttle {
    pub const EVERY: Duration = Duration::from_secs(10);

    /// Whether to log now; if so, how many were not logged since the last time.
    pub fn due(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Self::EVERY) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Why a peer is dropped at accept, as its client learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Neither root nor an allowed uid (or no credentials at all).
    NotAllowed,
    /// The uid holds --max-connections-per-uid connections already.
    PerUidCap,
}

/// How long a dropped peer's connection stays open after its answer, so that its client
/// reads the answer: closing at once lets the client's own preface hit a closed socket
/// (EPIPE), and h2 then reports the failed write instead of the GOAWAY.
pub const LINGER: Duration = Duration::from_secs(2);

/// What a dropped peer may send while it lingers, discarded unread.
const LINGER_BYTES: usize = 64 << 10;

/// Dropped peers lingering at once; past this, a dropped peer is closed right after its
/// answer, so a flood of refused connections holds no more than this many descriptors.
const LINGERING: usize = 4;

impl Refusal {
    /// The HTTP/2 server preface (an empty SETTINGS frame, RFC 9113 §3.4) and a GOAWAY
    /// (§6.8: last stream 0, so no request was processed) whose error code the client maps
    /// by kind: INADEQUATE_SECURITY (0xc; gRPC's PERMISSION_DENIED, grpc/doc/PROTOCOL-HTTP2.md)
    /// for a peer that is not allowed, ENHANCE_YOUR_CALM (0xb; RESOURCE_EXHAUSTED) for one
    /// over its cap. The debug data says why, for a client that prints it. Fixed bytes: dipamd
    /// writes them and never reads, let alone parses, what the peer sends.
    pub fn frames(self) -> Vec<u8> {
        let (code, debug): (u32, &[u8]) = match self {
            Self::NotAllowed => (
                0xc,
                b"dipamd: this uid is not root and not in --allow-uid or --admin-uid",
            ),
            Self::PerUidCap => (
                0xb,
                b"dipamd: this uid holds --max-connections-per-uid connections already",
            ),
        };
        let mut out = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
        let len = u32::try_from(8 + debug.len()).unwrap_or(8).to_be_bytes();
        out.extend_from_slice(&len[1..]);
        out.extend_from_slice(&[7, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(debug);
        out
    }
}

/// Who may connect, as decided at accept from the peer's credentials.
pub trait Admit: Send + Sync {
    /// Whether a peer with this uid may use the listener at all.
    fn allows(&self, uid: u32) -> bool;
}

/// What a listener lets in: the shared descriptor budget, a cap on this listener (None: the
/// budget alone), and for a unix socket the peer check and the per-uid cap.
pub struct Gate {
    name: &'static str,
    budget: Arc<Budget>,
    listener: Option<Arc<tokio::sync::Semaphore>>,
    peers: Option<Arc<dyn Admit>>,
    per_uid: Arc<PerUid>,
    lingering: Arc<tokio::sync::Semaphore>,
    refused: Throttle,
    errors: Throttle,
    capped: Throttle,
}

impl Gate {
    /// A gate on `name`'s listener taking from `budget`, holding at most `max` connections
    /// (None: only the budget bounds it).
    pub fn new(name: &'static str, budget: Arc<Budget>, max: Option<usize>) -> Self {
        Self {
            name,
            budget,
            listener: max.map(|m| Arc::new(tokio::sync::Semaphore::new(m.max(1)))),
            peers: None,
            per_uid: Arc::default(),
            lingering: Arc::new(tokio::sync::Semaphore::new(LINGERING)),
            refused: Throttle::default(),
            errors: Throttle::default(),
            capped: Throttle::default(),
        }
    }

    /// Drops a peer `peers` refuses at accept, and caps each non-root uid at `per_uid`
    /// connections (root is never capped by uid).
    pub fn with_peers(mut self, peers: Arc<dyn Admit>, per_uid: usize) -> Self {
        self.peers = Some(peers);
        self.per_uid = Arc::new(PerUid {
            max: per_uid.max(1),
            held: Mutex::default(),
        });
        self
    }

    /// Waits for room, then for the next connection `accept` yields, backing off on errors.
    async fn room(&self) -> Slot {
        let mut slot = self.budget.take().await;
        if let Some(sem) = &self.listener {
            if let Ok(p) = Arc::clone(sem).try_acquire_owned() {
                slot.listener = Some(p);
            } else {
                if let Some(n) = self.capped.due() {
                    warn!(
                        listener = self.name,
                        suppressed = n,
                        "connection cap reached; new connections wait"
                    );
                }
                slot.listener = Arc::clone(sem).acquire_owned().await.ok();
            }
        }
        slot
    }

    /// Handles an accept error: waits `backoff` (doubling it up to a second) and logs at most
    /// once per [`Throttle::EVERY`].
    async fn backoff(&self, e: &io::Error, backoff: &mut Duration) {
        if let Some(n) = self.errors.due() {
            warn!(listener = self.name, error = %e, suppressed = n, "accept failed; backing off");
        }
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
    }

    /// The unix peer's verdict: the slot it may hold, or why it is dropped (logged
    /// throttled).
    fn admit_peer(&self, uid: Option<u32>, mut slot: Slot) -> Result<Slot, Refusal> {
        let Some(peers) = &self.peers else {
            return Ok(slot);
        };
        let refuse = |why: &str, refusal| {
            if let Some(n) = self.refused.due() {
                warn!(listener = self.name, uid = ?uid, suppressed = n, "connection dropped at accept: {why}");
            }
            Err(refusal)
        };
        match uid {
            Some(0) => Ok(slot),
            Some(u) if peers.allows(u) => {
                if self.per_uid.try_take(u) {
                    slot.uid = Some((Arc::clone(&self.per_uid), u));
                    Ok(slot)
                } else {
                    refuse(
                        "the uid holds --max-connections-per-uid connections already",
                        Refusal::PerUidCap,
                    )
                }
            }
            Some(_) => refuse(
                "not root and not in --allow-uid / --admin-uid",
                Refusal::NotAllowed,
            ),
            None => refuse("no peer credentials", Refusal::NotAllowed),
        }
    }

    /// Answers a dropped peer with [`Refusal::frames`] and closes its connection: at once
    /// when [`LINGERING`] others are lingering already, else once the peer closes its end,
    /// has sent [`LINGER_BYTES`], or [`LINGER`] has passed. What it sends is discarded.
    fn turn_away(&self, stream: tokio::net::UnixStream, refusal: Refusal) {
        // A fresh socket's send buffer holds the few bytes; if not, the peer gets nothing.
        let _ = stream.try_write(&refusal.frames());
        let Ok(permit) = Arc::clone(&self.lingering).try_acquire_owned() else {
            return;
        };
        // The peer reads our end's EOF after the answer: its client stops waiting at once.
        let Ok(std) = stream.into_std() else {
            return;
        };
        let _ = std.shutdown(std::net::Shutdown::Write);
        let Ok(mut stream) = tokio::net::UnixStream::from_std(std) else {
            return;
        };
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 4096];
            let mut read = 0;
            let drain = async {
                while let Ok(n @ 1..) = stream.read(&mut buf).await {
                    read += n;
                    if read >= LINGER_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
            drop(permit);
        });
    }

    /// The next admitted unix connection.
    pub async fn accept_unix(
        &self,
        listener: &tokio::net::UnixListener,
    ) -> Guarded<tokio::net::UnixStream> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let slot = self.room().await;
            match listener.accept().await {
                Ok((stream, _)) => {
                    backoff = Duration::from_millis(5);
                    let uid = stream.peer_cred().ok().map(|c| c.uid());
                    match self.admit_peer(uid, slot) {
                        Ok(slot) => return Guarded::new(stream, slot),
                        Err(refusal) => self.turn_away(stream, refusal),
                    }
                }
                Err(e) => {
                    drop(slot);
                    self.backoff(&e, &mut backoff).await;
                }
            }
        }
    }

    /// The next TCP connection, for a listener whose connections can make room (the metrics
    /// port): the shared budget is taken first, the listener's cap only once a connection has
    /// been accepted. At the cap, `make_room` asks one of the listener's connections to close
    /// (the oldest that has not sent its request) and the new one takes its place; when new
    /// ones waited in the backlog instead, idle connections held by anyone kept every scrape
    /// waiting behind them. At most one accepted connection waits for its place.
    pub async fn accept_tcp_making_room(
        &self,
        listener: &tokio::net::TcpListener,
        make_room: impl Fn() -> bool,
    ) -> Guarded<tokio::net::TcpStream> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let mut slot = self.budget.take().await;
            match listener.accept().await {
                Ok((stream, _)) => {
                    if let Some(sem) = &self.listener {
                        let permit = match Arc::clone(sem).try_acquire_owned() {
                            Ok(p) => Some(p),
                            Err(_) => {
                                if !make_room()
                                    && let Some(n) = self.capped.due()
                                {
                                    warn!(
                                        listener = self.name,
                                        suppressed = n,
                                        "connection cap reached and every connection is \
                                         answering; the new one waits"
                                    );
                                }
                                Arc::clone(sem).acquire_owned().await.ok()
                            }
                        };
                        slot.listener = permit;
                    }
                    return Guarded::new(stream, slot);
                }
                Err(e) => {
                    drop(slot);
                    self.backoff(&e, &mut backoff).await;
                }
            }
        }
    }
}

/// What an HTTP/2 client may send before it acknowledges dipamd's SETTINGS: its preface and
/// SETTINGS, a request's headers and the 65,535 bytes of DATA the protocol's initial window
/// allows. dipamd's own limits (server/mod.rs: the header list, frame and window sizes) bind a
/// client only from its acknowledgement on (RFC 9113 §6.5.3); until then h2 accepts header
/// blocks up to 16 MiB, and 300 connections that never acknowledged, each sending a 256 KiB
/// header block, took RSS from 48 to 220 MiB.
pub const BEFORE_SETTINGS_ACK: u64 = 128 << 10;

/// Follows the HTTP/2 frames a client sends until it acknowledges the server's SETTINGS.
#[derive(Debug, Default)]
struct H2Watch {
    /// Bytes read so far.
    read: u64,
    /// Bytes of the current frame's payload (or the preface) still to skip.
    skip: u64,
    /// The partial frame header.
    head: Vec<u8>,
    acked: bool,
}

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: u64 = 24;

impl H2Watch {
    fn new() -> Self {
        Self {
            skip: PREFACE_LEN,
            ..Self::default()
        }
    }

    /// Takes `bytes` just read; Err when the client sent too much without acknowledging.
    fn feed(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        if self.acked {
            return Ok(());
        }
        self.read += bytes.len() as u64;
        while !bytes.is_empty() && !self.acked {
            if self.skip > 0 {
                let n = usize::try_from(self.skip)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.skip -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let need = 9 - self.head.len();
            let n = need.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.head.len() == 9 {
                let h = std::mem::take(&mut self.head);
                let len = u64::from(h[0]) << 16 | u64::from(h[1]) << 8 | u64::from(h[2]);
                // SETTINGS (type 4) with the ACK flag (1).
                self.acked = h[3] == 4 && h[4] & 1 == 1;
                self.skip = len;
            }
        }
        if !self.acked && self.read > BEFORE_SETTINGS_ACK {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "HTTP/2 client sent too much before acknowledging the server's SETTINGS",
            ));
        }
        Ok(())
    }
}

/// A connection holding its [`Slot`], closed when it stays silent too long: [`HANDSHAKE`]
/// before its first byte, [`IDLE`] after. On the gRPC socket it is also closed when the client
/// sends more than [`BEFORE_SETTINGS_ACK`] before acknowledging the server's SETTINGS.
pub struct Guarded<S> {
    inner: S,
    _slot: Slot,
    silent: Pin<Box<Sleep>>,
    started: bool,
    h2: Option<H2Watch>,
}

impl<S> Guarded<S> {
    fn new(inner: S, slot: Slot) -> Self {
        Self {
            inner,
            _slot: slot,
            silent: Box::pin(tokio::time::sleep(HANDSHAKE)),
            started: false,
            h2: None,
        }
    }

    /// Follows the client's HTTP/2 frames until its SETTINGS ACK (the gRPC socket).
    pub fn http2(mut self) -> Self {
        self.h2 = Some(H2Watch::new());
        self
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    if let Some(w) = self.h2.as_mut() {
                        w.feed(&buf.filled()[before..])?;
                    }
                    self.started = true;
                    let at = Instant::now() + IDLE;
                    self.silent.as_mut().reset(at);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.silent.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let what = if self.started {
                        "connection silent too long"
                    } else {
                        "connection sent nothing after its accept"
                    };
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
                }
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.resize(9 + len, 0);
        f
    }

    #[test]
    fn h2_watch_bounds_what_comes_before_the_settings_ack() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        // A well-behaved client: preface, SETTINGS, HEADERS, a window of DATA, then the ACK
        // (split across reads), then anything.
        let mut w = H2Watch::new();
        let mut bytes = preface.to_vec();
        bytes.extend(frame(4, 0, 12));
        bytes.extend(frame(1, 4, 300));
        bytes.extend(frame(0, 0, 16384).repeat(4));
        bytes.extend(frame(4, 1, 0));
        for chunk in bytes.chunks(7) {
            w.feed(chunk).unwrap();
        }
        assert!(w.acked);
        w.feed(&vec![0; 1 << 20]).unwrap();
        // A client that never acknowledges and keeps sending header blocks.
        let mut w = H2Watch::new();
        w.feed(preface).unwrap();
        let flood = frame(9, 0, 16384);
        let sent = (0..20).map(|_| w.feed(&flood)).find(Result::is_err);
        assert!(sent.is_some(), "the flood was not cut");
    }

    /// What a tonic client dialling as the plugin and dipamctl do learns from a connection
    /// that is turned away, as the plugin reads it: from the call's own error when the
    /// GOAWAY reached h2 in time, else by probing (dipam_proto::probe_refusal). The flag says
    /// whether the call's own error told.
    async fn ask(path: &std::path::Path) -> (Option<dipam_proto::Refused>, bool) {
        // A refusal is read within a second or two; a hang here is the defect under test
        // (a client left waiting on a turned-away connection), so it fails, never stalls,
        // naming the step that hung.
        let step = std::sync::Mutex::new("connect");
        match tokio::time::timeout(Duration::from_secs(20), ask_once(path, &step)).await {
            Ok(seen) => seen,
            Err(_) => panic!(
                "a turned-away client waited 20 s without learning why, in its {}",
                step.lock().unwrap()
            ),
        }
    }

    async fn ask_once(
        path: &std::path::Path,
        step: &std::sync::Mutex<&'static str>,
    ) -> (Option<dipam_proto::Refused>, bool) {
        use dipam_proto::{refused_at_accept, v1::cni_client::CniClient};
        let seen = match dipam_proto::connect(path).await {
            Err(e) => refused_at_accept(&e),
            Ok(ch) => {
                *step.lock().unwrap() = "call";
                let e = CniClient::new(ch)
                    .status(dipam_proto::v1::CniRequest::default())
                    .await
                    .unwrap_err();
                refused_at_accept(&e)
            }
        };
        if seen.is_some() {
            return (seen, true);
        }
        *step.lock().unwrap() = "probe";
        let path = path.to_owned();
        let probed = tokio::task::spawn_blocking(move || {
            dipam_proto::probe_refusal(&path, dipam_proto::PROBE_TIMEOUT)
        });
        (probed.await.unwrap(), false)
    }

    /// Whether `n` lingering places are free within `within`.
    async fn places_reach(gate: &Gate, n: usize, within: Duration) -> bool {
        let until = std::time::Instant::now() + within;
        loop {
            if gate.lingering.available_permits() == n {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (3 s at most) until `n` lingering places are free.
    async fn free_places(gate: &Gate, n: usize) {
        for _ in 0..300 {
            if gate.lingering.available_permits() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never {n} free lingering places");
    }

    /// A real tonic/h2 client turned away reads dipamd's refusal by kind, never a bare
    /// transport error: whether the GOAWAY reaches it before or after its request (then it
    /// probes), and whether the connection lingers or (past [`LINGERING`] lingering ones)
    /// closes at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turned_away_client_reads_why() {
        use dipam_proto::Refused;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let gate = Arc::new(Gate::new("grpc", Budget::new(4096), None));
        let refusal = Arc::new(Mutex::new(Refusal::NotAllowed));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = {
            let (gate, refusal) = (Arc::clone(&gate), Arc::clone(&refusal));
            let accepted = Arc::clone(&accepted);
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let r = *refusal.lock().unwrap();
                    gate.turn_away(stream, r);
                }
            })
        };
        // A client dials twice at most: its channel's one connection, then the probe's. A
        // channel that dialled again on finding its connection closed kept a refused client
        // dialling and waiting (dipam_proto::connect says why).
        let ask_counted = |label: String| {
            let (path, accepted) = (&path, Arc::clone(&accepted));
            async move {
                let before = accepted.load(std::sync::atomic::Ordering::SeqCst);
                let seen = ask(path).await;
                let dialled = accepted.load(std::sync::atomic::Ordering::SeqCst) - before;
                assert!(dialled <= 2, "{label}: the client dialled {dialled} times");
                seen
            }
        };
        let mut told = 0;
        for i in 0..100 {
            let (got, by_call) = ask_counted(format!("connection {i}")).await;
            assert_eq!(got, Some(Refused::NotAllowed), "connection {i}");
            told += usize::from(by_call);
        }
        eprintln!("the call's own error told the refusal {told} times of 100; the probe the rest");
        *refusal.lock().unwrap() = Refusal::PerUidCap;
        assert_eq!(
            ask_counted("per-uid cap".into()).await.0,
            Some(Refused::TooManyConnections)
        );
        // Silent peers that never close take every lingering place: the next ones are
        // answered and closed at once.
        *refusal.lock().unwrap() = Refusal::NotAllowed;
        // The clients above close at once; their places come back.
        free_places(&gate, LINGERING).await;
        let silent: Vec<_> = (0..LINGERING)
            .map(|_| std::os::unix::net::UnixStream::connect(&path).unwrap())
            .collect();
        // Usually every place is taken now; not asserted: a tonic channel of the asks above
        // may reconnect once and hold a place for a moment, and the silent peer turned away
        // meanwhile does not linger (seen: 1 place left, never 0, in 2 of 12 loaded runs and
        // once in CI). What a client reads is asserted below either way.
        let all_taken = places_reach(&gate, 0, Duration::from_secs(3)).await;
        eprintln!("silent peers took every lingering place: {all_taken}");
        for i in 0..100 {
            assert_eq!(
                ask_counted(format!("unlingered {i}")).await.0,
                Some(Refused::NotAllowed),
                "unlingered {i}"
            );
        }
        drop(silent);
        server.abort();
    }

    #[test]
    fn per_uid_cap_counts_and_releases() {
        let p = PerUid {
            max: 2,
            held: Mutex::default(),
        };
        assert!(p.try_take(1000));
        assert!(p.try_take(1000));
        assert!(
            !p.try_take(1000),
            "a third connection of one uid is refused"
        );
        assert!(p.try_take(1001), "another uid has its own cap");
        p.release(1000);
        assert!(p.try_take(1000), "a closed connection gives its place back");
    }

    #[tokio::test]
    async fn the_budget_stops_at_its_limit_and_resumes_on_close() {
        let b = Budget::new(RESERVE as u64 + 8);
        assert_eq!(b.limit(), 8);
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(b.take().await);
        }
        let waiting = tokio::time::timeout(Duration::from_millis(50), b.take()).await;
        assert!(waiting.is_err(), "a ninth connection must wait");
        held.pop();
        let got = tokio::time::timeout(Duration::from_secs(1), b.take()).await;
        assert!(got.is_ok(), "a freed place is taken");
        assert_eq!(b.open(), 8);
    }

    #[test]
    fn throttle_logs_once_per_period_and_counts_the_rest() {
        let t = Throttle::default();
        assert_eq!(t.due(), Some(0));
        assert_eq!(t.due(), None);
        assert_eq!(t.due(), None);
        *t.last.lock().unwrap() = Some(Instant::now() - Throttle::EVERY);
        assert_eq!(t.due(), Some(2));
    }
}
