//! The DEL spool, dipamd's side (the plugin writes it: plugin/src/spool.rs; the contract and
//! the trust rule: `dipam_proto::spool`).
//!
//! - **Published**: at start dipamd creates its spool 0700 and publishes it beside the socket
//!   it serves (`<socket>.spool`), holding `<socket>.lock` so that a second dipamd on the same
//!   socket cannot overwrite it. The plugin spools only there, so plugin and dipamd agree
//!   without a second setting; a spool published by a previous dipamd of this socket (other
//!   flags) is drained too and its files are moved into this one.
//! - **Drained** at start before anything is served (repeated until a pass finds nothing new,
//!   and once more after the socket is bound), then every few seconds.
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
    collections::{BTreeMap, HashMap, HashSet},
    ffi::{OsStr, OsString},
    io::Read,
    os::fd::OwnedFd,
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use dipam_proto::{
    spool::{self, Pointer, QUARANTINE},
    v1::CniRequest,
};
use nix::{
    fcntl::{Flock, FlockArg, OFlag, open, renameat},
    sys::stat::{Mode, mkdirat},
    unistd::fsync,
};
use serde::Deserialize;
use tracing::{error, info, warn};

use crate::{delegate::store, error::ShimError, rpc, shim::Shim};

/// The plugin's spool file (format 1).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spooled {
    format: u32,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    issued_at_ms: u64,
    /// On the boot clock (order.rs); absent from plugins before it.
    #[serde(default)]
    issued_at: Option<SpooledStamp>,
    command: String,
    container_id: String,
    #[serde(default)]
    netns: String,
    ifname: String,
    #[serde(default)]
    cni_args: String,
    #[serde(default)]
    cni_path: String,
    #[serde(default)]
    mode: i32,
    stdin: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpooledStamp {
    boot_id: String,
    ns: u64,
}

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

fn set(m: &Mutex<Option<String>>, v: Option<String>) {
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

/// Opens `dir` by the rule, recording the outcome for status/doctor/metrics.
fn open_checked(shim: &Shim, dir: &Path) -> Option<OwnedFd> {
    match spool::open_dir(dir) {
        Ok(fd) => {
            set(&shim.spool.untrusted, None);
            Some(fd)
        }
        Err(e) if e.not_found() => None,
        Err(e) => {
            if shim.spool.untrusted().is_none() {
                error!(spool = %dir.display(), error = %e, "the DEL spool fails the spool rule (root-owned, not writable by group or others, no links); nothing in it is replayed until it is fixed");
            }
            set(&shim.spool.untrusted, Some(e.to_string()));
            None
        }
    }
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

/// The quarantine, opened without following a link. Whatever else is at its name (a link, a
/// file, a directory failing the rule) is moved aside within the spool, never written
/// through, and a fresh 0700 directory takes its place.
fn open_quarantine(fd: &OwnedFd, dir: &Path) -> Result<OwnedFd, String> {
    match spool::open_subdir(fd, dir, QUARANTINE) {
        Ok(q) => return Ok(q),
        Err(e) if e.not_found() => {}
        Err(e) => {
            let aside = format!(".untrusted-{QUARANTINE}-{}", crate::clock::now_ms());
            renameat(fd, QUARANTINE, fd, aside.as_str())
                .map_err(|r| format!("{e}; moving it aside failed: {r}"))?;
            error!(spool = %dir.display(), problem = %e, moved_to = %aside, "the spool's quarantine was not a directory meeting the spool rule; moved aside unread");
        }
    }
    match mkdirat(fd, QUARANTINE, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(format!("creating {}: {e}", dir.join(QUARANTINE).display())),
    }
    spool::open_subdir(fd, dir, QUARANTINE).map_err(|e| e.to_string())
}

fn quarantine(shim: &Shim, fd: &OwnedFd, dir: &Path, name: &OsStr, why: &str) {
    let file = dir.join(name);
    let moved = open_quarantine(fd, dir).and_then(|q| {
        renameat(fd, name, &q, name).map_err(|e| e.to_string())?;
        let _ = fsync(&q);
        let _ = fsync(fd);
        Ok(())
    });
    match moved {
        Ok(()) => {
            shim.spool.quarantined.fetch_add(1, Ordering::Relaxed);
            shim.events.emit(crate::events::Event::SpoolQuarantined);
            warn!(file = %file.display(), why, "spooled DEL not replayed; moved to {QUARANTINE}/");
        }
        Err(e) => {
            error!(file = %file.display(), why, error = %e, "spooled DEL not replayed, and it could not be quarantined; left in place");
        }
    }
}

/// Reads one spool file by the rule; quarantines it when it fails.
fn read_file(shim: &Shim, fd: &OwnedFd, dir: &Path, name: &OsStr) -> Option<Spooled> {
    let bytes = spool::open_file(fd, dir, name)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            let mut b = Vec::new();
            f.take(spool::MAX_FILE_BYTES as u64)
                .read_to_end(&mut b)
                .map(|_| b)
                .map_err(|e| e.to_string())
        });
    let parsed = bytes
        .and_then(|b| serde_json::from_slice::<Spooled>(&b).map_err(|e| e.to_string()))
        .and_then(|s| {
            if s.format == spool::FORMAT && s.command == "DEL" {
                Ok(s)
            } else {
                Err(format!("format {} command {:?}", s.format, s.command))
            }
        });
    match parsed {
        Ok(s) => Some(s),
        Err(why) => {
            quarantine(shim, fd, dir, name, &why);
            None
        }
    }
}

/// Whether the delegate's own store proves it holds nothing for this request's key, so its
/// DEL has nothing to release. Only a store dipamd can read (host-local's) proves it; the
/// answer for each store directory is read once per drain.
fn provably_nothing_held(
    p: &crate::shim::Prepared,
    cache: &mut HashMap<PathBuf, Option<HashSet<(String, String)>>>,
) -> bool {
    let Some(dir) = store::readable_dir(&p.dc.kind, &p.dc.conf, &p.dc.network) else {
        return false;
    };
    let held = cache.entry(dir.clone()).or_insert_with(|| {
        store::reservations(&dir)
            .ok()
            .map(|rs| rs.into_iter().map(|r| (r.container_id, r.ifname)).collect())
    });
    let Some(held) = held else {
        return false;
    };
    let (cid, ifname) = (&p.req.container_id, &p.req.ifname);
    // A legacy id-only reservation names no interface: it may be this one's.
    !held.contains(&(cid.clone(), ifname.clone())) && !held.contains(&(cid.clone(), String::new()))
}

/// Replays every spooled DEL in `dir`.
pub async fn drain(shim: &Shim, dir: &Path) -> Drained {
    let mut out = Drained::default();
    let Some(fd) = open_checked(shim, dir) else {
        return out;
    };
    let names = match spool::pending(&fd) {
        Ok(n) => n,
        Err(e) => {
            warn!(spool = %dir.display(), error = %e, "cannot list the DEL spool");
            return out;
        }
    };
    let mut stores = HashMap::new();
    for name in names {
        let Some(s) = read_file(shim, &fd, dir, &name) else {
            out.failed += 1;
            continue;
        };
        // The file passed the rule, so a root process wrote it: the plugin, run by the
        // runtime as root. Its CNI_PATH is that caller's, as on a live DEL.
        let req = CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: s.request_id,
            command: s.command,
            container_id: s.container_id,
            netns: s.netns,
            ifname: s.ifname,
            cni_args: s.cni_args,
            cni_path: s.cni_path,
            stdin: s.stdin.into_bytes(),
            mode: s.mode,
            issued_at_ms: s.issued_at_ms,
            issued_at: s.issued_at.map(|b| dipam_proto::v1::BootStamp {
                boot_id: b.boot_id,
                ns: b.ns,
            }),
            retired_link: None,
        };
        let what = format!("{}/{}", req.container_id, req.ifname);
        // A key the ledger does not hold still gets the delegate's DEL, as a live DEL does:
        // the ledger may be younger than the attachment (moved aside and started afresh,
        // restored from a backup). Only when the delegate's own store proves it holds
        // nothing for the key is the exec skipped, which keeps the drain (run before
        // serving) fast after a runtime retried ADDs in a tight loop while dipamd was down.
        if let Ok(p) = shim.prepare(req.clone(), true, crate::access::Caller::ROOT)
            && let Ok(None) = shim.lookup(&p.key)
            && provably_nothing_held(&p, &mut stores)
        {
            let _ = spool::remove(&fd, &name);
            tracing::debug!(attachment = %what, "spooled DEL for an attachment neither dipamd nor the delegate holds");
            out.released += 1;
            continue;
        }
        match rpc::del::run(shim, crate::access::Caller::ROOT, req).await {
            Ok(_) => {
                let _ = spool::remove(&fd, &name);
                info!(attachment = %what, file = %dir.join(&name).display(), "spooled DEL replayed");
                out.released += 1;
            }
            Err(
                e @ (ShimError::Decode(_)
                | ShimError::Config { .. }
                | ShimError::BadEnv(_)
                | ShimError::Reserved { .. }
                | ShimError::Version(_)),
            ) => {
                quarantine(shim, &fd, dir, &name, &e.to_string());
                out.failed += 1;
            }
            Err(e) => {
                warn!(attachment = %what, error = %e, "spooled DEL failed; kept for the next drain");
                out.kept += 1;
            }
        }
    }
    out
}

/// Moves the files waiting in a spool a previous dipamd of this socket published into ours
/// (`to`): a DEL spooled there, even in the moment before this dipamd's pointer replaced the
/// old one, is replayed here. Files failing the rule stay there, quarantined.
pub fn adopt(shim: &Shim, from: &Path, to: &Path) -> usize {
    let (Some(src), Ok(dst)) = (
        spool::open_dir(from).ok(),
        spool::open_dir(to).map_err(|e| e.to_string()),
    ) else {
        return 0;
    };
    let mut moved = 0;
    for name in spool::pending(&src).unwrap_or_default() {
        let Ok(mut f) = spool::open_file(&src, from, &name) else {
            quarantine(shim, &src, from, &name, "fails the spool rule");
            continue;
        };
        let done = match renameat(&src, name.as_os_str(), &dst, name.as_os_str()) {
            Ok(()) => fsync(&dst)
                .and_then(|()| fsync(&src))
                .map_err(std::io::Error::from),
            // Another file system: copy durably, then remove the original.
            Err(nix::errno::Errno::EXDEV) => {
                let mut body = Vec::new();
                f.read_to_end(&mut body)
                    .and_then(|_| spool::write_file(&dst, &name.to_string_lossy(), &body, 0o600))
                    .and_then(|()| spool::remove(&src, &name))
            }
            Err(e) => Err(e.into()),
        };
        match done {
            Ok(()) => moved += 1,
            Err(e) => {
                warn!(from = %from.join(&name).display(), error = %e, "cannot move a spooled DEL from the previous spool; retried later");
            }
        }
    }
    if moved > 0 {
        info!(from = %from.display(), to = %to.display(), moved, "spooled DELs taken over from the spool a previous dipamd of this socket published");
    }
    moved
}

/// Drains `dir` (after taking over inherited spools) until a pass finds nothing new: DELs
/// spooled while the drain runs are released too. Bounded, so a plugin spooling in a loop
/// cannot hold dipamd's start forever; the periodic drain takes the rest.
pub async fn drain_all(shim: &Shim, dir: &Path) -> Drained {
    let mut total = Drained::default();
    for _ in 0..8 {
        for from in shim.spool.inherited() {
            adopt(shim, &from, dir);
        }
        let d = drain(shim, dir).await;
        total.released += d.released;
        total.failed += d.failed;
        total.kept = d.kept;
        if d.released + d.failed == 0 {
            break;
        }
    }
    report(shim, dir);
    total
}

/// Reports the spool's gauges, and whether the ledger takes commits: plugins write spool
/// files while dipamd runs and the store recovers from a full disk in the background, so
/// both are sampled here, at start and on every tick of [`run`] (docs/metrics.md).
pub fn report(shim: &Shim, dir: &Path) {
    use crate::events::Event;
    shim.events.emit(Event::SpoolDepth(depth(dir) as u64));
    shim.events
        .emit(Event::SpoolUntrusted(shim.spool.untrusted().is_some()));
    shim.events
        .emit(Event::SpoolMismatched(shim.spool.mismatched().len() as u64));
    shim.report_writable();
}

/// Drains every `every` until the process ends.
pub async fn run(shim: std::sync::Arc<Shim>, dir: PathBuf, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        for from in shim.spool.inherited() {
            adopt(&shim, &from, &dir);
        }
        if depth(&dir) > 0 || shim.spool.untrusted().is_some() {
            drain(&shim, &dir).await;
        }
        report(&shim, &dir);
    }
}

/// The spool as `dipamctl status` shows it.
pub fn status(shim: &Shim) -> dipam_proto::v1::SpoolStatus {
    let dir = &shim.identity.spool_dir;
    dipam_proto::v1::SpoolStatus {
        dir: dir.display().to_string(),
        pointer: spool::pointer_path(&shim.identity.socket)
            .display()
            .to_string(),
        depth: depth(dir) as u64,
        quarantined: shim.spool.quarantined.load(Ordering::Relaxed),
        untrusted: spool::open_dir(dir)
            .err()
            .filter(|e| !e.not_found())
            .map(|e| e.to_string())
            .unwrap_or_default(),
        unpublished: shim.spool.unpublished().unwrap_or_default(),
        mismatched: shim
            .spool
            .mismatched()
            .into_iter()
            .map(|(n, d)| format!("{n}: {d}"))
            .collect(),
        inherited: shim
            .spool
            .inherited()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    }
}

/// Names in `dir` that [`drain`] would consider (for tests and tools).
pub fn pending(dir: &Path) -> Vec<OsString> {
    spool::open_dir(dir)
        .ok()
        .and_then(|fd| spool::pending(&fd).ok())
        .unwrap_or_default()
}
