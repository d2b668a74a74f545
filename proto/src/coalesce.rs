//! One write for the frames a client's tasks queue together.
//!
//! A tonic client over HTTP/2 sends one unary call as five frames: the connection preface,
//! SETTINGS, HEADERS, DATA and an empty DATA that ends the stream. hyper queues them from
//! different tasks (the connection, the request's body pipe), and h2 flushes after each of
//! its polls, so the plain socket saw five `write`s, each of which can wake dipamd's worker
//! to read a part of the request and sleep again. On a loaded node every such wake-up waits
//! ~0.8 ms in the run queue (docs/performance.md, run 27), on the path of every pod's ADD.
//!
//! [`Coalesce`] holds what h2 flushes until a poll of the connection's task adds nothing more,
//! after the tasks that were ready beside it have queued their frames: a flush marks the bytes
//! held and wakes the task; a flush after a read (h2 reads at the start of every poll of the
//! connection) that finds no more bytes than the last one writes all of them in one call. The
//! request then leaves in one or two `write`s instead of five (run 31).
//!
//! What keeps it safe: a flush always asks for the task to be polled again, so held bytes
//! never wait on the peer; a flush that finds them held across several polls without a read
//! writes them anyway; more than `HOLD_LIMIT` bytes are written at once; a shutdown writes
//! them first. Reads are never delayed.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes held back: a large request (a 400 kB delegate config) goes out in writes of
/// about this size, as through the plain socket.
const HOLD_LIMIT: usize = 64 * 1024;

/// Flushes that may find bytes held without a read between them before they are written
/// anyway: a bound for a caller that flushes without reading (h2 reads once per poll).
const MAX_DEFERRALS: u8 = 8;

/// A stream whose flushes are written together on the task's next poll (module docs).
#[derive(Debug)]
pub struct Coalesce<S> {
    inner: S,
    held: Vec<u8>,
    /// Bytes of `held` already written (a partial write).
    sent: usize,
    /// Flushes that found `held` waiting since the last read.
    deferrals: u8,
    /// A read happened since the last deferral: the task was polled again.
    read_since: bool,
    /// How many bytes were held at the last deferral: more since then means the tasks beside
    /// the connection are still queuing frames.
    at_deferral: usize,
}

impl<S> Coalesce<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            held: Vec::new(),
            sent: 0,
            deferrals: 0,
            read_since: false,
            at_deferral: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes every held byte, or says Pending with the task registered for writability.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        self.deferrals = 0;
        self.at_deferral = 0;
        Poll::Ready(Ok(()))
    }

    /// Room for `more` bytes: what is held is written first once the limit would be passed.
    fn poll_room(&mut self, cx: &mut Context<'_>, more: usize) -> Poll<io::Result<()>> {
        if !self.held.is_empty() && self.held.len() + more > HOLD_LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.read_since = true;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_room(cx, data.len()))?;
        this.held.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        ready!(this.poll_room(cx, len))?;
        for b in bufs {
            this.held.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.held.is_empty() {
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        let quiet = this.read_since && this.held.len() == this.at_deferral;
        if !quiet && this.deferrals < MAX_DEFERRALS {
            // Held until a poll of the task adds nothing more (the request's body pipe queues
            // its DATA and end of stream a poll or two after the HEADERS); the wake makes
            // sure that poll comes.
            this.deferrals += 1;
            this.read_since = false;
            this.at_deferral = this.held.len();
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads nothing: what h2 does at the start of each poll of the connection.
    async fn poll_again(c: &mut Coalesce<tokio::net::UnixStream>) {
        let mut one = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_millis(5), c.read(&mut one));
        assert!(read.await.is_err(), "nothing to read yet");
    }

    /// Flushes are held while each poll adds bytes; the first flush of a poll that added
    /// nothing writes them in one piece, and the peer receives every byte in order.
    #[tokio::test]
    async fn held_until_a_poll_adds_nothing_then_written_once() {
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let mut c = Coalesce::new(a);
        c.write_all(b"preface").await.unwrap();
        c.flush().await.unwrap();
        c.write_all(b"-settings").await.unwrap();
        c.flush().await.unwrap();
        assert_eq!(c.held, b"preface-settings", "both flushes held");
        poll_again(&mut c).await;
        c.write_all(b"-request").await.unwrap();
        c.flush().await.unwrap();
        assert_eq!(
            c.held, b"preface-settings-request",
            "a poll that added bytes holds"
        );
        poll_again(&mut c).await;
        c.flush().await.unwrap();
        assert!(c.held.is_empty(), "a poll that added nothing writes");
        let mut got = vec![0u8; 24];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"preface-settings-request");
    }

    /// A caller that flushes without ever reading still gets its bytes out.
    #[tokio::test]
    async fn flushes_without_reads_write_after_a_bound() {
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let mut c = Coalesce::new(a);
        c.write_all(b"x").await.unwrap();
        for _ in 0..=MAX_DEFERRALS {
            c.flush().await.unwrap();
        }
        assert!(c.held.is_empty());
        let mut got = [0u8; 1];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"x");
    }

    /// More than the limit is written as it comes; a shutdown writes what is held.
    #[tokio::test]
    async fn large_writes_and_shutdown_drain() {
        let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            b.read_to_end(&mut all).await.unwrap();
            all
        });
        let mut c = Coalesce::new(a);
        let big = vec![7u8; 3 * HOLD_LIMIT + 5];
        for chunk in big.chunks(16 * 1024) {
            c.write_all(chunk).await.unwrap();
            assert!(c.held.len() <= HOLD_LIMIT);
        }
        c.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), big);
    }
}
