//! Whether each metrics listener is bound, for `dipamctl doctor` and the
//! `dipam_metrics_listener_up` gauge. The metrics listeners never decide whether dipamd
//! serves pods (docs/cfp.md, "Threat model"): any local user or hostNetwork pod may bind a
//! loopback port first, and when a taken `--metrics-address` ended dipamd's start, every
//! restart (an upgrade, a crash, a reboot) became a crash loop with no pod networking on the
//! node. dipamd now serves, logs, and keeps trying to bind in the background (daemon/).

use std::{
    collections::VecDeque,
    fmt::Display,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::oneshot;

/// How often a metrics listener's bind is tried again.
pub const RETRY: Duration = Duration::from_secs(2);

/// One configured metrics listener's condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// `tcp` (--metrics-address) or `unix` (--metrics-socket).
    pub kind: &'static str,
    /// The address or path, as configured.
    pub address: String,
    pub bound: bool,
    /// Why the last bind failed (empty once bound).
    pub error: String,
    /// Binds tried so far.
    pub attempts: u64,
}

/// Every configured metrics listener (none without --metrics-address / --metrics-socket).
#[derive(Debug, Default)]
pub struct Listeners {
    all: Mutex<Vec<Listener>>,
}

impl Listeners {
    /// Notes one bind's outcome for `kind` on `address`.
    pub fn note(&self, kind: &'static str, address: &str, outcome: Result<(), &dyn Display>) {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        let at = match all.iter().position(|l| l.kind == kind) {
            Some(i) => i,
            None => {
                all.push(Listener {
                    kind,
                    address: address.to_owned(),
                    bound: false,
                    error: String::new(),
                    attempts: 0,
                });
                all.len() - 1
            }
        };
        let l = &mut all[at];
        l.attempts += 1;
        l.bound = outcome.is_ok();
        l.error = outcome.err().map(ToString::to_string).unwrap_or_default();
    }

    /// The listeners' conditions now.
    pub fn snapshot(&self) -> Vec<Listener> {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A metrics listener's connections that have not sent their request head yet, oldest
/// first: the ones that may be closed to make room for a new connection at the listener's
/// cap. A scrape sends its request as soon as it connects and is answered in milliseconds,
/// so it is never in here for long; a connection that sends nothing stays here until its
/// head timeout (5 s) or until a newer connection needs its place.
#[derive(Debug, Default)]
pub struct Unrequested {
    next: AtomicU64,
    waiting: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
}

impl Unrequested {
    /// A new connection: its id, and what resolves if it is asked to make room.
    pub fn enter(&self) -> (u64, oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().push_back((id, tx));
        (id, rx)
    }

    /// Connection `id` sent its request head, or ended: it is no longer asked to make room.
    pub fn leave(&self, id: u64) {
        self.lock().retain(|(i, _)| *i != id);
    }

    /// Asks the oldest connection without a request to close; false if there is none.
    pub fn evict_oldest(&self) -> bool {
        let mut waiting = self.lock();
        while let Some((_, tx)) = waiting.pop_front() {
            if tx.send(()).is_ok() {
                return true;
            }
        }
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, oneshot::Sender<()>)>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_connection_without_a_request_makes_room() {
        let u = Unrequested::default();
        let (a, mut ra) = u.enter();
        let (_b, mut rb) = u.enter();
        let (_c, mut rc) = u.enter();
        // a sent its request: b is now the oldest without one.
        u.leave(a);
        assert!(u.evict_oldest());
        assert!(rb.try_recv().is_ok(), "b was asked to close");
        assert!(ra.try_recv().is_err() && rc.try_recv().is_err());
        // c ended by itself (its receiver dropped): nothing is left to evict.
        drop(rc);
        assert!(!u.evict_oldest());
    }

    #[test]
    fn a_listener_is_waiting_until_a_bind_succeeds() {
        let l = Listeners::default();
        assert!(l.snapshot().is_empty());
        l.note("tcp", "127.0.0.1:9", Err(&"Address in use"));
        l.note("tcp", "127.0.0.1:9", Err(&"Address in use"));
        let s = &l.snapshot()[0];
        assert!(!s.bound && s.attempts == 2 && s.error.contains("in use"));
        l.note("tcp", "127.0.0.1:9", Ok(()));
        let s = &l.snapshot()[0];
        assert!(s.bound && s.error.is_empty() && s.attempts == 3);
    }
}
