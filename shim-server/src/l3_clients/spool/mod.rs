//! The DEL spool, dipamd's side (the plugin writes it: plugin/src/spool.rs; the contract and
//! the trust rule: `dipam_proto::spool`).
//!
//! - **Published**: at start dipamd creates its spool 0700 and publishes it beside the socket
//!   it serves (`<socket>.spool`), holding `<socket>.lock` so that a second dipamd on the same
//!   socket cannot overwrite it. The plugin spools only there, so plugin and dipamd agree
//!   without a second setting; a spool published by a previous dipamd of this socket (other
//!   flags) is drained too and its files are moved into this one.
//! - **Drained** at start before anything is served (repeated until a pass finds nothing new,
//!   and once more after the socket is bound), then every few seconds: replay/spool.rs, above
//!   the DEL RPC it replays through. This module is the spool's state and files only.
//! - **Trusted** only as far as the rule goes: dipamd runs as root and would run the delegate
//!   (from the file's CNI_PATH) that a spool file names, so a file is replayed only if it is a
//!   regular file, owned by root, not writable by group or others, in a directory meeting the
//!   same rule, all checked on open descriptors without following a link. A file that fails
//!   is quarantined in `failed/` (itself opened without following a link; anything else found
//!   at that name is moved aside, never written through). A spool directory that fails the
//!   rule is not read at all: status, doctor and metrics say so.
//!
//! A drained DEL carries the time its plugin started, so del::run ignores it if the key has
//! since been added again: a late replay never releases a newer attachment. A file that can
//! never succeed (not a DEL, not parseable, a config dipamd rejects) is quarantined and
//! logged, so it neither blocks the spool nor disappears silently.

use std::{
    collections::{BTreeMap, HashSet},
    ffi::OsString,
    os::fd::OwnedFd,
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
    sync::{Mutex, atomic::AtomicU64},
};

use dipam_proto::spool::{self, Pointer, QUARANTINE};
use nix::{
    fcntl::{Flock, FlockArg, OFlag, open, renameat},
    sys::stat::{Mode, mkdirat},
};
use tracing::{error, warn};

/// What a drain did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    pub released: usize,
    pub kept: usize,
    pub failed: usize,
}

/// Networks whose config names a `spoolDir` are remembered up to this many.
const MAX_MISMATCHES: usize = 64;

/// What status, doctor and metrics show about the spool.
#[derive(Debug, Default)]
pub struct SpoolState {
    /// Why the spool directory fails the rule (nothing in it is replayed), if it does.
    pub untrusted: Mutex<Option<String>>,
    /// Why the spool could not be published beside the socket, if it could not.
    pub unpublished: Mutex<Option<String>>,
    /// Files moved to `failed/` since start.
    pub quarantined: AtomicU64,
    /// Networks whose config names a `spoolDir` that is not this spool: network -> spoolDir.
    pub mismatched: Mutex<BTreeMap<String, String>>,
    /// `spoolDir` values known to name this spool (not re-checked per request).
    same: Mutex<HashSet<String>>,
    /// Spools a previous dipamd of this socket published: their files are moved into this one.
    pub inherited: Mutex<Vec<PathBuf>>,
}

pub(crate) fn set(m: &Mutex<Option<String>>, v: Option<String>) {
    if let Ok(mut g) = m.lock() {
        *g = v;
    }
}

fn get(m: &Mutex<Option<String>>) -> Option<String> {
    m.lock().ok().and_then(|g| g.clone())
}

impl SpoolState {
    pub fn untrusted(&self) -> Option<String> {
        get(&self.untrusted)
    }

    pub fn unpublished(&self) -> Option<String> {
        get(&self.unpublished)
    }

    pub fn mismatched(&self) -> BTreeMap<String, String> {
        self.mismatched
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    pub fn inherited(&self) -> Vec<PathBuf> {
        self.inherited.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Remembers whether a request's config names a `spoolDir` other than `ours`. The plugin
    /// no longer uses the key (it spools where dipamd published), but an operator who set it
    /// believes DELs go there: that belief is reported, not silently ignored.
    pub fn note_config(&self, stdin: &[u8], network: &str, ours: &Path) {
        if !stdin.windows(8).any(|w| w == b"spoolDir") {
            return;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(stdin) else {
            return;
        };
        // A path longer than PATH_MAX names nothing; it is not kept either.
        let Some(dir) = v["spoolDir"]
            .as_str()
            .or_else(|| v["ipam"]["spoolDir"].as_str())
            .filter(|d| d.len() <= 4096)
        else {
            return;
        };
        if self.same.lock().is_ok_and(|s| s.contains(dir)) {
            return;
        }
        let same = match (std::fs::metadata(dir), std::fs::metadata(ours)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if same {
            if let Ok(mut s) = self.same.lock()
                && s.len() < MAX_MISMATCHES
            {
                s.insert(dir.to_owned());
            }
            if let Ok(mut m) = self.mismatched.lock() {
                m.remove(network);
            }
        } else if let Ok(mut m) = self.mismatched.lock()
            && m.get(network).is_none_or(|d| d != dir)
            && (m.len() < MAX_MISMATCHES || m.contains_key(network))
        {
            warn!(network, spool_dir = dir, ours = %ours.display(), "the network config's spoolDir is not dipamd's spool; the plugin ignores it and spools to dipamd's");
            m.insert(network.to_owned(), dir.to_owned());
        }
    }
}

/// The exclusive lock on `<socket>.lock`, held while this dipamd runs: `None` when another
/// process holds it (another dipamd serves, or is starting on, this socket).
pub fn lock_socket(socket: &Path) -> std::io::Result<Option<Flock<std::fs::File>>> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let fd = open(
        &spool::lock_path(socket),
        OFlag::O_CREAT | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    match Flock::lock(std::fs::File::from(fd), FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// Creates the spool directory (0700) and returns its canonical path: the one published, so
/// that the plugin's walk to it meets no link.
pub fn create(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::canonicalize(dir)
}

/// Publishes `dir` as the spool of the dipamd serving `socket` (the caller holds the socket's
/// lock). Returns the spool a previous dipamd of this socket published, if it is another
/// directory: DELs may wait there.
pub fn publish(socket: &Path, dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let previous = spool::read_pointer(socket).ok();
    let m = std::fs::metadata(dir)?;
    let pointer = Pointer {
        dir: dir.to_owned(),
        dev: m.dev(),
        ino: m.ino(),
    };
    let path = spool::pointer_path(socket);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("the socket path has no directory"));
    };
    let parent_fd: OwnedFd = std::fs::File::open(parent)?.into();
    // 0644: the plugin may run as a user that can read the pointer but not write the spool
    // (it then gets code 11 with a reason, not a silent loss).
    spool::write_file(
        &parent_fd,
        &name.to_string_lossy(),
        pointer.to_json().as_bytes(),
        0o644,
    )?;
    // The previous spool counts only while its path still leads to that very directory.
    // One that is gone from its path (a state directory moved aside with its spool inside)
    // cannot be found: say so, since DELs may wait in it.
    Ok(previous.and_then(|p| {
        if p.dev == pointer.dev && p.ino == pointer.ino {
            return None;
        }
        match spool::open_dir(&p.dir).and_then(|fd| {
            spool::identity(&fd).map_err(|e| spool::Untrusted::Io {
                path: p.dir.clone(),
                source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })
        }) {
            Ok((dev, ino)) if dev == p.dev && ino == p.ino => Some(p.dir),
            _ => {
                error!(previous = %p.dir.display(), "the spool the previous dipamd of this socket published is no longer at its path (moved aside with its state directory?); DELs spooled there are not replayed until its *.json files are moved into this dipamd's spool");
                None
            }
        }
    }))
}

/// Spool files waiting in `dir` (0 when it cannot be opened by the rule).
pub fn depth(dir: &Path) -> usize {
    spool::open_dir(dir)
        .ok()
        .and_then(|fd| spool::pending(&fd).ok())
        .map_or(0, |v| v.len())
}

/// What `doctor` reports about the quarantine: files in it, and anything wrong with it.
pub fn quarantine_state(dir: &Path) -> (usize, Option<String>) {
    let Ok(fd) = spool::open_dir(dir) else {
        return (0, None);
    };
    match spool::open_subdir(&fd, dir, QUARANTINE) {
        Ok(q) => (
            nix::dir::Dir::from_fd(q)
                .map(|mut d| {
                    d.iter()
                        .filter_map(Result::ok)
                        .filter(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
                        .count()
                })
                .unwrap_or(0),
            None,
        ),
        Err(e) if e.not_found() => (0, None),
        Err(e) => (0, Some(e.to_string())),
    }
}

/// Why the spool's quarantine could not be opened: nothing is moved into it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuarantineError {
    #[error("{0}; moving it aside failed: {1}")]
    NotMovedAside(spool::Untrusted, nix::errno::Errno),
    #[error("creating {}: {errno}", path.display())]
    Create {
        path: std::path::PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("{0}")]
    Untrusted(#[from] spool::Untrusted),
    #[error("{0}")]
    Move(nix::errno::Errno),
}

/// The quarantine, opened without following a link. Whatever else is at its name (a link, a
/// file, a directory failing the rule) is moved aside within the spool, never written
/// through, and a fresh 0700 directory takes its place.
pub(crate) fn open_quarantine(fd: &OwnedFd, dir: &Path) -> Result<OwnedFd, QuarantineError> {
    match spool::open_subdir(fd, dir, QUARANTINE) {
        Ok(q) => return Ok(q),
        Err(e) if e.not_found() => {}
        Err(e) => {
            let aside = format!(
                ".untrusted-{QUARANTINE}-{}",
                crate::l1_leaves::clock::now_ms()
            );
            renameat(fd, QUARANTINE, fd, aside.as_str())
                .map_err(|r| QuarantineError::NotMovedAside(e.clone(), r))?;
            error!(spool = %dir.display(), problem = %e, moved_to = %aside, "the spool's quarantine was not a directory meeting the spool rule; moved aside unread");
        }
    }
    match mkdirat(fd, QUARANTINE, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => {
            return Err(QuarantineError::Create {
                path: dir.join(QUARANTINE),
                errno: e,
            });
        }
    }
    Ok(spool::open_subdir(fd, dir, QUARANTINE)?)
}

/// Names in `dir` that the drain (`crate::l5_node::replay::spool::drain`) would consider (for tests and tools).
pub fn pending(dir: &Path) -> Vec<OsString> {
    spool::open_dir(dir)
        .ok()
        .and_then(|fd| spool::pending(&fd).ok())
        .unwrap_or_default()
}

/// The spool as `dipamctl status` shows it.
pub fn status(
    state: &SpoolState,
    identity: &crate::l2_core::core::Identity,
) -> dipam_proto::v1::SpoolStatus {
    let dir = &identity.spool_dir;
    dipam_proto::v1::SpoolStatus {
        dir: dir.display().to_string(),
        pointer: spool::pointer_path(&identity.socket).display().to_string(),
        depth: depth(dir) as u64,
        quarantined: state.quarantined.load(std::sync::atomic::Ordering::Relaxed),
        untrusted: spool::open_dir(dir)
            .err()
            .filter(|e| !e.not_found())
            .map(|e| e.to_string())
            .unwrap_or_default(),
        unpublished: state.unpublished().unwrap_or_default(),
        mismatched: state
            .mismatched()
            .into_iter()
            .map(|(n, d)| format!("{n}: {d}"))
            .collect(),
        inherited: state
            .inherited()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    }
}
