//! Operations dipamd could not do for lack of a privilege (EPERM, EACCES).
//!
//! dipamd runs with a bounded capability set (deploy/systemd/dipamd.service's
//! `CapabilityBoundingSet`, the DaemonSet's `capabilities`), and a set that is one capability
//! short does not stop it from serving: it fails one kind of operation, every time, in the log
//! only. Deleting retired veths without CAP_NET_ADMIN did exactly that, while `dipamctl doctor`
//! said all was well. So every such failure is counted here, with the last one's message, and
//! shown by `dipamctl status`, `dipamctl doctor` (a failing check) and the metrics
//! (`dipam_privilege_failures_total`).

use std::{
    fmt::Display,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tracing::warn;

use crate::l1_leaves::error::ShimError;

/// The failures since start: how many, and the last one.
#[derive(Debug, Default)]
pub struct Denials {
    count: AtomicU64,
    last: Mutex<String>,
    events: crate::l1_leaves::events::Events,
}

impl Denials {
    /// Counts that also report each failure as an event (the metrics).
    pub fn with_events(events: crate::l1_leaves::events::Events) -> Self {
        Self {
            events,
            ..Self::default()
        }
    }

    /// Records that `op` failed for lack of a privilege, with the error and what to do.
    pub fn note(&self, op: &str, error: impl Display) {
        let message = format!("{op}: {error}");
        warn!(%message, "operation not permitted: dipamd lacks a privilege it needs (deploy/README.md lists the capabilities and why)");
        self.count.fetch_add(1, Ordering::Relaxed);
        self.events
            .emit(crate::l1_leaves::events::Event::PrivilegeDenied);
        if let Ok(mut last) = self.last.lock() {
            *last = message;
        }
    }

    /// Records `e` if a missing privilege caused it (the delegate binary could not be run).
    pub fn note_error(&self, op: &str, e: &ShimError) {
        if let ShimError::DelegateSpawn { path, source, .. } = e
            && source.raw_os_error().is_some_and(is_denial)
        {
            self.note(
                &format!("{op}: running the delegate {}", path.display()),
                source,
            );
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The last failure's message; empty when there was none.
    pub fn last(&self) -> String {
        self.last.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// EPERM ("operation not permitted": a capability is missing) or EACCES ("permission
/// denied": file modes, or an LSM such as SELinux or AppArmor).
pub fn is_denial(errno: i32) -> bool {
    errno == libc::EPERM || errno == libc::EACCES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_keeps_the_last_message() {
        let d = Denials::default();
        assert_eq!((d.count(), d.last()), (0, String::new()));
        d.note("a", "first");
        d.note(
            "deleting a veth",
            std::io::Error::from_raw_os_error(libc::EPERM),
        );
        assert_eq!(d.count(), 2);
        assert!(d.last().starts_with("deleting a veth: "), "{}", d.last());
        assert!(d.last().contains("not permitted"), "{}", d.last());
    }

    #[test]
    fn only_a_denied_spawn_counts() {
        let d = Denials::default();
        let spawn = |errno| ShimError::DelegateSpawn {
            kind: "host-local".into(),
            path: "/opt/cni/bin/host-local".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        d.note_error("ADD", &spawn(libc::ENOENT));
        assert_eq!(d.count(), 0);
        d.note_error("ADD", &spawn(libc::EACCES));
        d.note_error("DEL", &spawn(libc::EPERM));
        assert_eq!(d.count(), 2);
        assert!(d.last().contains("/opt/cni/bin/host-local"), "{}", d.last());
        assert!(is_denial(libc::EPERM) && is_denial(libc::EACCES) && !is_denial(libc::ENODEV));
    }
}
