//! One main-mode ADD or DEL per attachment at a time, across plugin processes.
//!
//! Why: a runtime that sends two identical ADDs at once (a bug, but it happens) once got one
//! success whose address the other call's rollback released, and one success with no eth0
//! because the other call's rollback deleted the shared host veth (its name derives from the
//! attachment, so both calls name the same link). dipamd serialises the IPAM side per
//! attachment, but the plugin's datapath work and its rollback happen outside dipamd's lock.
//! Held for the plugin's whole ADD (checks, veth, IPAM call, rollback) and DEL, the lock makes
//! the second ADD start after the first ended: it then finds the first one's interface and
//! fails with 160 while dipamd answers it from its ledger (`replayed`), so it keeps the
//! address and touches nothing; or, if the first one failed and undid itself, it starts
//! afresh. The loser never undoes the winner's work.
//!
//! The lock is `flock(2)` on `<DIR>/<host veth name>` (the name is unique per attachment and
//! is the very resource the calls share): released by the kernel when the process ends, even
//! by SIGKILL, so a killed plugin never leaves it held. DEL removes the file once the
//! attachment is gone; a file removed while another process waited on it is detected (its
//! inode is no longer the path's) and the lock taken again on the new file.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
};

use crate::error::PluginError;

/// Where the locks live: tmpfs, so nothing outlives a reboot (nor does any attachment).
pub const DIR: &str = "/run/dipam/attachment-locks";

/// How often a waiter tries again. Holders are done in milliseconds.
const POLL: Duration = Duration::from_millis(5);

/// A held attachment lock; released on drop.
pub struct Held {
    _lock: Flock<File>,
    path: PathBuf,
}

impl Held {
    /// Releases the lock and removes its file: for a DEL that left nothing of the attachment.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn failed(step: &str, e: impl std::fmt::Display) -> PluginError {
    PluginError::Datapath {
        step: step.to_owned(),
        reason: e.to_string(),
    }
}

/// Takes the lock `name` in `dir`, waiting at most `timeout` for another process to release
/// it (then code 11: the runtime retries).
pub fn acquire(dir: &Path, name: &str, timeout: Duration) -> Result<Held, PluginError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| failed(&format!("creating the lock directory {}", dir.display()), e))?;
    let path = dir.join(name);
    let deadline = Instant::now() + timeout;
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            // Empty, and never written: only its inode matters.
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| failed(&format!("opening the lock {}", path.display()), e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => {
                // A DEL may have removed the file between our open and our lock: a lock on
                // an unlinked file excludes no one. Only the file at `path` counts.
                let current = match (lock.metadata(), std::fs::metadata(&path)) {
                    (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
                    _ => false,
                };
                if current {
                    return Ok(Held { _lock: lock, path });
                }
            }
            Err((_, Errno::EWOULDBLOCK)) => {}
            Err((_, e)) => return Err(failed(&format!("locking {}", path.display()), e)),
        }
        if Instant::now() >= deadline {
            return Err(PluginError::Busy(format!(
                "another ADD or DEL of this attachment has held {} for {}s; the runtime may \
                 retry once it ends",
                path.display(),
                timeout.as_secs()
            )));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_removal_is_safe() {
        let d = tempfile::tempdir().unwrap();
        let a = acquire(d.path(), "dp0", Duration::from_secs(1)).unwrap();
        let busy = acquire(d.path(), "dp0", Duration::from_millis(30));
        assert!(matches!(busy, Err(PluginError::Busy(_))));
        assert_eq!(busy.err().map(|e| e.to_cni(false).code), Some(11));
        // Another attachment is not held up.
        let _other = acquire(d.path(), "dp1", Duration::from_millis(30)).unwrap();
        // A waiter gets it once the holder removes the file.
        let waiter = std::thread::spawn({
            let dir = d.path().to_owned();
            move || acquire(&dir, "dp0", Duration::from_secs(5)).map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(50));
        a.remove();
        waiter.join().unwrap().unwrap();
    }
}
