//! Paths that work at first and fail an operator later, looked at once at start: each found
//! is logged at WARN and becomes a reason dipamd is not ready (`dipamctl status`, gRPC health,
//! CNI STATUS), unless the flag that accepts it was given.
//!
//! - A ledger on tmpfs (or ramfs): a reboot empties it while the delegate's store
//!   (host-local's /var/lib/cni/networks) keeps every reservation, so after the reboot every
//!   address is an orphan dipamd knows nothing of, and the agent's addresses are lost
//!   (docs/cfp.md §7.5). `--allow-volatile-state` accepts it (a test node, a throwaway VM).
//! - A socket in a world-writable directory: any local user may put a socket of their own
//!   there first, or (without the sticky bit) replace dipamd's, and be handed every pod's
//!   CNI request; and the plugin refuses to spool into a spool published there
//!   (proto/src/spool.rs "Trust"), so every DEL made while dipamd is down fails with code 11.
//!   `--allow-shared-socket-dir` accepts it.

use std::{os::unix::fs::PermissionsExt, path::Path};

use tracing::warn;

/// `statfs(2)`'s f_type of tmpfs and ramfs (linux/magic.h).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// What the operator accepted with dipamd's flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct Accepted {
    pub volatile_state: bool,
    pub shared_socket_dir: bool,
}

/// The not-ready reasons for `state_dir` and `socket`, each logged at WARN; accepted ones are
/// logged too (at WARN, once) but make dipamd no less ready.
pub fn check(state_dir: &Path, socket: &Path, accepted: Accepted) -> Vec<String> {
    let mut reasons = Vec::new();
    if let Some(fs) = volatile_fs(state_dir) {
        let why = format!(
            "--state-dir {} is on {fs}: a reboot empties the ledger while the delegate's store \
             keeps every reservation, so every address becomes an orphan and the agent's \
             addresses are lost. Move it to a persistent file system (default /var/lib/dipam), \
             or pass --allow-volatile-state to accept it",
            state_dir.display()
        );
        report(why, accepted.volatile_state, &mut reasons);
    }
    if let Some((dir, mode)) = world_writable_parent(socket) {
        let why = format!(
            "--socket {} is in {}, which any user may write (mode {mode:04o}): another user's \
             socket there would receive every pod's CNI request, and the plugin refuses a \
             spool published there, so every DEL made while dipamd is down fails with code 11. \
             Use a directory only root may write (default /run/dipam), or pass \
             --allow-shared-socket-dir to accept it",
            socket.display(),
            dir.display()
        );
        report(why, accepted.shared_socket_dir, &mut reasons);
    }
    reasons
}

fn report(why: String, accepted: bool, reasons: &mut Vec<String>) {
    if accepted {
        warn!(accepted = true, "{why}");
    } else {
        warn!("{why}; dipamd is not ready until this is fixed");
        reasons.push(why);
    }
}

/// "tmpfs" or "ramfs" when `dir` is on one.
fn volatile_fs(dir: &Path) -> Option<&'static str> {
    let st = nix::sys::statfs::statfs(dir).ok()?;
    // The field's type differs between libcs and architectures.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    let kind = i64::from(st.filesystem_type().0 as i64);
    match kind {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// The socket's directory and its mode, when others may write it.
fn world_writable_parent(socket: &Path) -> Option<(std::path::PathBuf, u32)> {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => std::env::current_dir().ok()?,
    };
    let mode = std::fs::metadata(&dir).ok()?.permissions().mode() & 0o7777;
    (mode & 0o002 != 0).then_some((dir, mode))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_world_writable_socket_dir_is_a_reason_unless_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let sock = shared.join("d.sock");
        let r = check(tmp.path(), &sock, Accepted::default());
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("mode 1777") && r[0].contains("--allow-shared-socket-dir"),
            "{r:?}"
        );
        let ok = Accepted {
            shared_socket_dir: true,
            ..Accepted::default()
        };
        assert!(check(tmp.path(), &sock, ok).is_empty());
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check(tmp.path(), &sock, Accepted::default()).is_empty());
    }
}
