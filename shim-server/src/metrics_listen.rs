//! Whether each metrics listener is bound, for `dipamctl doctor` and the
//! `dipam_metrics_listener_up` gauge. The metrics listeners never decide whether dipamd
//! serves pods (docs/cfp.md, "Threat model"): any local user or hostNetwork pod may bind a
//! loopback port first, and when a taken `--metrics-address` ended dipamd's start, every
//! restart (an upgrade, a crash, a reboot) became a crash loop with no pod networking on the
//! node. dipamd now serves, logs, and keeps trying to bind in the background (daemon/).

use std::{sync::Mutex, time::Duration};

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
    pub fn note(&self, kind: &'static str, address: &str, outcome: Result<(), String>) {
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
        l.error = outcome.err().unwrap_or_default();
    }

    /// The listeners' conditions now.
    pub fn snapshot(&self) -> Vec<Listener> {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_waiting_until_a_bind_succeeds() {
        let l = Listeners::default();
        assert!(l.snapshot().is_empty());
        l.note("tcp", "127.0.0.1:9", Err("Address in use".into()));
        l.note("tcp", "127.0.0.1:9", Err("Address in use".into()));
        let s = &l.snapshot()[0];
        assert!(!s.bound && s.attempts == 2 && s.error.contains("in use"));
        l.note("tcp", "127.0.0.1:9", Ok(()));
        let s = &l.snapshot()[0];
        assert!(s.bound && s.error.is_empty() && s.attempts == 3);
    }
}
