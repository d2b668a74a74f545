//! Reading a delegate's own store, for GC emulation and the ledger/store reconcile. Read only:
//! dipamd never edits a delegate's files; it frees a reservation by running the delegate's DEL.
//!
//! host-local keeps one file per reserved IP in `<dataDir or /var/lib/cni/networks>/<network>/`,
//! named by the IP and holding `<containerID>\r\n<ifname>`; legacy files hold only the ID;
//! `lock` and `last_reserved_ip.<n>` are bookkeeping (docs/sources.md §7.2).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde_json::Value;

/// One reservation in a delegate's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub ip: IpAddr,
    /// Empty for a blank reservation ([`Contents::blank`]).
    pub container_id: String,
    /// Empty for host-local's legacy id-only files.
    pub ifname: String,
    pub modified: Option<SystemTime>,
}

/// The (container ID, ifname) a delegate's store names a record's reservation by, as the
/// streamed passes over the ledger keep it (the reconcile's `Seen`, the GC plan's kept
/// entries): nothing when it is the record's own key's, the common case, else the pair (a
/// pod served from the warm pool: the pool entry's, `AttachmentRecord::delegate_ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldAs(Option<(String, String)>);

impl HeldAs {
    pub fn of(rec: &dipam_state::AttachmentRecord) -> Self {
        let (cid, ifname) = rec.delegate_ids();
        Self(
            (cid != rec.key.container_id || ifname != rec.key.ifname)
                .then(|| (cid.to_owned(), ifname.to_owned())),
        )
    }

    /// The pair the store names, given the record key's (container ID, ifname).
    pub fn ids<'a>(&'a self, cid: &'a str, ifname: &'a str) -> (&'a str, &'a str) {
        match &self.0 {
            Some((c, i)) => (c, i),
            None => (cid, ifname),
        }
    }

    /// The pair, where it is not the record key's.
    pub fn differs(&self) -> Option<&(String, String)> {
        self.0.as_ref()
    }

    /// The same, owned.
    pub fn into_differs(self) -> Option<(String, String)> {
        self.0
    }
}

/// The delegate keys of a network's ledger records: which reservations of the store they
/// account for. The delegate holds each attachment under its delegate key (a pod served from
/// the warm pool: the pool entry's), which is what its store names.
pub struct Known {
    pairs: std::collections::HashSet<(String, String)>,
    ids: std::collections::HashSet<String>,
}

impl Known {
    /// From each record's (container ID, ifname) as the delegate holds it.
    pub fn of_ids<'a>(ids: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self::of_pairs(
            ids.into_iter()
                .map(|(c, i)| (c.to_owned(), i.to_owned()))
                .collect(),
        )
    }

    /// The same, from pairs already owned (no copy of them is made).
    pub fn of_pairs(pairs: std::collections::HashSet<(String, String)>) -> Self {
        let ids = pairs.iter().map(|(c, _)| c.clone()).collect();
        Self { pairs, ids }
    }

    /// Whether a record accounts for `r`: by container ID alone for host-local's legacy
    /// id-only files, else by container ID and ifname.
    pub fn accounts_for(&self, r: &Reservation) -> bool {
        if r.ifname.is_empty() {
            self.ids.contains(&r.container_id)
        } else {
            self.pairs
                .contains(&(r.container_id.clone(), r.ifname.clone()))
        }
    }
}

/// host-local's directory for `network` under the delegate config `conf` (the config sent to
/// the delegate: `ipam` is host-local's own object).
pub fn host_local_dir(conf: &Value, network: &str) -> PathBuf {
    Path::new(data_dir(conf).unwrap_or(DEFAULT_DATA_DIR)).join(network)
}

/// host-local's default `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// The `dataDir` a delegate config names, if any, read as host-local reads it (keys.rs: the
/// last key that folds to `ipam`, then to `dataDir`), so that the store dipamd checks and
/// reads is the one host-local writes.
pub fn data_dir(conf: &Value) -> Option<&str> {
    use super::keys::get;
    get(get(conf, "ipam")?, "dataDir")?
        .as_str()
        .filter(|d| !d.is_empty())
}

/// Whether `dir` is a store directory that no one but root can change, from `/` down: every
/// existing component a directory (not a link) owned by root, and none writable by group or
/// others, except an intermediate one with the sticky bit (`/tmp`), where others cannot
/// replace root's entries. A missing tail is fine (host-local creates it, as root), unless
/// its first missing component is in such an open directory. host-local runs as root and
/// follows links for `lock` and `last_reserved_ip.*` in `<dir>/<network>`: in a directory a
/// caller could write, that caller would choose what root overwrites.
pub fn root_only_dir(dir: &Path) -> Result<(), Unsafe> {
    judge_dir(dir)
}

/// [`root_only_dir`], after making, as root, the first missing component of `dir` when it
/// is missing from an open (sticky) directory such as `/tmp`. A --non-root-data-dir removed
/// since dipamd started (by a tmp cleaner, an operator) could otherwise be made again by a
/// caller, with its own links in it; made by root first, it is root's. `mkdir` never follows
/// a link at its last component and fails if anything is there already: what a caller
/// planted first is then judged, and refused.
pub fn root_only_dir_remade(dir: &Path) -> Result<(), Unsafe> {
    use std::os::unix::fs::DirBuilderExt;
    match judge_dir(dir) {
        Err(Unsafe::MissingInOpen(first, _)) => {
            match std::fs::DirBuilder::new().mode(0o755).create(&first) {
                Ok(()) => tracing::info!(dir = %first.display(),
                    "made a missing --non-root-data-dir directory again, as root"),
                Err(e) => tracing::warn!(dir = %first.display(), error = %e,
                    "could not make a missing --non-root-data-dir directory"),
            }
            root_only_dir(dir)
        }
        other => other,
    }
}

/// Why a directory is not a safe store.
#[derive(Debug, thiserror::Error)]
pub enum Unsafe {
    /// This component is missing, in a directory others may create entries in.
    #[error("{1}")]
    MissingInOpen(PathBuf, String),
    #[error("{0}")]
    Other(String),
}

fn judge_dir(dir: &Path) -> Result<(), Unsafe> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !dir.is_absolute() {
        return Err(Unsafe::Other(format!(
            "{} is not an absolute path",
            dir.display()
        )));
    }
    let mut at = PathBuf::from("/");
    let parts: Vec<_> = dir.components().skip(1).collect();
    // Whether the parent is open to others (sticky): a missing entry there could be made by
    // anyone before host-local makes it.
    let mut parent_open = false;
    let mut check = |p: &Path, last: bool| -> Result<bool, Unsafe> {
        let meta = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && parent_open => {
                return Err(Unsafe::MissingInOpen(
                    p.to_owned(),
                    format!(
                        "{} is missing, and anyone may create it in its parent",
                        p.display()
                    ),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Unsafe::Other(format!("{}: {e}", p.display()))),
        };
        let mode = meta.permissions().mode();
        if !meta.is_dir() {
            return Err(Unsafe::Other(format!(
                "{} is not a directory (a link?)",
                p.display()
            )));
        }
        if meta.uid() != 0 {
            return Err(Unsafe::Other(format!(
                "{} is owned by uid {}, not root",
                p.display(),
                meta.uid()
            )));
        }
        if mode & 0o022 != 0 && (last || mode & 0o1000 == 0) {
            return Err(Unsafe::Other(format!(
                "{} is writable by group or others (mode {:o})",
                p.display(),
                mode & 0o7777
            )));
        }
        parent_open = mode & 0o022 != 0;
        Ok(true)
    };
    check(&at, parts.is_empty())?;
    for (i, c) in parts.iter().enumerate() {
        if !matches!(c, std::path::Component::Normal(_)) {
            return Err(Unsafe::Other(format!(
                "{} is not a plain path",
                dir.display()
            )));
        }
        at.push(c);
        if !check(&at, i + 1 == parts.len())? {
            break;
        }
    }
    Ok(())
}

/// The store dipamd can read for this delegate, if it knows the delegate's format.
pub fn readable_dir(kind: &str, conf: &Value, network: &str) -> Option<PathBuf> {
    (kind == "host-local").then(|| host_local_dir(conf, network))
}

/// The largest store entry read. host-local writes `<containerID>\r\n<ifname>`: at most a few
/// hundred bytes (container IDs and ifnames are bounded, validate.rs). A larger entry is not
/// host-local's: a link to a device of endless zeros once took dipamd to 1-2 GB per reconcile.
pub const MAX_ENTRY_BYTES: u64 = 4096;

/// How long one reading of a store may take. The directory may sit on a filesystem that hangs
/// (a dead NFS or FUSE mount); the reading thread is then abandoned, never an async worker.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Entries skipped because they were not regular files or were too large, since start.
static SKIPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SKIP_WARN: std::sync::LazyLock<crate::l1_leaves::listen::Throttle> =
    std::sync::LazyLock::new(crate::l1_leaves::listen::Throttle::default);

/// Entries skipped since start (not regular files, or larger than [`MAX_ENTRY_BYTES`]).
pub fn skipped() -> u64 {
    SKIPPED.load(std::sync::atomic::Ordering::Relaxed)
}

/// What one reading of a host-local directory found.
#[derive(Debug, Default)]
pub struct Contents {
    /// The reservations with an owner, by address.
    pub held: Vec<Reservation>,
    /// Blank reservations: a file named by an address that holds no owner (empty, blanks or
    /// NULs only, or not text). host-local writes the owner right after its O_EXCL create,
    /// under its store lock; one killed in between, or a power cut before the data reached
    /// the disk, leaves such a file, and no DEL ever matches it (host-local releases by
    /// owner): the address is lost until it is removed. Their `container_id` is empty.
    pub blank: Vec<Reservation>,
}

/// [`reservations`] on a blocking thread, under [`READ_TIMEOUT`]: callers are async tasks
/// that serve pods' ADDs, and the store is a directory dipamd does not own.
pub async fn read(dir: PathBuf) -> std::io::Result<Vec<Reservation>> {
    read_contents(dir).await.map(|c| c.held)
}

/// [`contents`] on a blocking thread, under [`READ_TIMEOUT`] (see [`read`]).
pub async fn read_contents(dir: PathBuf) -> std::io::Result<Contents> {
    off_thread(dir, contents).await
}

/// Folds every address host-local has taken in `dir` into `acc` with `add`, on a blocking
/// thread under [`READ_TIMEOUT`]: each directory entry named by an address, whatever it is
/// or holds. host-local takes an address by creating that name exclusively, so a name that
/// exists (a reservation, a blank one, anything else) is an address it will not hand out;
/// only the names are read, never the files, and nothing is kept per entry. What the warm
/// pool's range guard counts each refill round (pool/census.rs).
pub async fn fold_taken<A: Send + 'static>(
    dir: PathBuf,
    acc: A,
    add: fn(&mut A, IpAddr),
) -> std::io::Result<A> {
    off_thread(dir, move |d| {
        let mut acc = acc;
        let entries = match std::fs::read_dir(d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(acc),
            Err(e) => return Err(e),
        };
        for entry in entries {
            if let Some(ip) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
                add(&mut acc, ip);
            }
        }
        Ok(acc)
    })
    .await
}

/// Runs `job` on `dir` on a blocking thread, under [`READ_TIMEOUT`] (see [`read`]).
async fn off_thread<T: Send + 'static>(
    dir: PathBuf,
    job: impl FnOnce(&Path) -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let shown = dir.display().to_string();
    let task = tokio::task::spawn_blocking(move || job(&dir));
    match tokio::time::timeout(READ_TIMEOUT, task).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => Err(std::io::Error::other(format!("store task: {e}"))),
        Err(_) => {
            tracing::warn!(dir = %shown, "reading the delegate's store timed out; not used");
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("reading the store took more than {READ_TIMEOUT:?}"),
            ))
        }
    }
}

/// Every reservation in a host-local network directory. A missing directory is an empty
/// store (host-local creates it on first ADD). Blocking: call [`read`] from async code.
pub fn reservations(dir: &Path) -> std::io::Result<Vec<Reservation>> {
    contents(dir).map(|c| c.held)
}

/// Every reservation in a host-local network directory, and its blank ones
/// ([`Contents::blank`]), by address. Blocking: call [`read_contents`] from async code.
pub fn contents(dir: &Path) -> std::io::Result<Contents> {
    let mut out = Contents::default();
    visit(dir, &mut |e, blank| {
        let to = if blank { &mut out.blank } else { &mut out.held };
        to.push(e.into_reservation());
    })?;
    out.held.sort_by_key(|r| r.ip);
    out.blank.sort_by_key(|r| r.ip);
    Ok(out)
}

/// A reservation as the store's reader meets it, its names borrowed from the file's text
/// (see [`Reservation`]; both empty for a blank one).
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub ip: IpAddr,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub modified: Option<SystemTime>,
}

impl Held<'_> {
    pub fn into_reservation(self) -> Reservation {
        Reservation {
            ip: self.ip,
            container_id: self.container_id.to_owned(),
            ifname: self.ifname.to_owned(),
            modified: self.modified,
        }
    }
}

/// Folds the reservations with an owner in `dir` (the blank ones left out) into `acc` with
/// `add`, in the directory's order, on a blocking thread under [`READ_TIMEOUT`]: for a caller
/// that keeps its own form of each, without a `Vec` of [`Reservation`]s and two strings per
/// address first. At 10,000 pods that `Vec` was the largest part of a GC's peak: the store
/// read alone took 3.3 MB and RSS 4.6-5.5 MiB (docs/performance.md, run 48).
pub async fn fold_held<A: Send + 'static>(
    dir: PathBuf,
    acc: A,
    add: fn(&mut A, Held<'_>),
) -> std::io::Result<A> {
    off_thread(dir, move |d| {
        let mut acc = acc;
        visit(d, &mut |e, blank| {
            if !blank {
                add(&mut acc, e);
            }
        })?;
        Ok(acc)
    })
    .await
}

/// Hands every reservation in `dir` to `each`, one at a time, in the directory's order, with
/// whether it is blank ([`Contents::blank`]). A missing directory is an empty store
/// (host-local creates it on first ADD).
fn visit(dir: &Path, each: &mut dyn FnMut(Held<'_>, bool)) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        // Bookkeeping files, and anything not named by an address (host-local writes
        // IPv6 names with ':' on Linux).
        let Some(ip) = name.to_str().and_then(|n| n.parse::<IpAddr>().ok()) else {
            continue;
        };
        let (content, modified) = match entry_text(&entry.path()) {
            Ok(Some(read)) => read,
            Ok(None) => continue,
            Err(why) => {
                skip(dir, &name.to_string_lossy(), &why.to_string());
                continue;
            }
        };
        let (container_id, ifname, blank) = match owner_text(&content) {
            Some(text) => {
                let mut parts = text.split("\r\n");
                let container_id = parts.next().unwrap_or_default().trim();
                (container_id, parts.next().unwrap_or_default().trim(), false)
            }
            None => ("", "", true),
        };
        each(
            Held {
                ip,
                container_id,
                ifname,
                modified,
            },
            blank,
        );
    }
    Ok(())
}

/// The owner text of a reservation file, or `None` for a blank one ([`Contents::blank`]):
/// nothing but blanks and NULs (a power cut can leave a file of NULs), or not text.
fn owner_text(content: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(content).ok()?;
    let owner = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!owner.is_empty() && !owner.contains('\0')).then_some(text)
}

/// The youngest a blank reservation is reported or freed at. host-local writes the owner
/// within microseconds of the create, under its store lock, which [`free_blank`] takes too;
/// this keeps a blank file that another writer may still be filling out of every report.
pub const BLANK_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long [`free_blank`] tries host-local's store lock: one ADD or DEL holds it for
/// milliseconds; a hung one must not hang the reconcile.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Removes the blank reservation `r` (see [`Contents::blank`]) from the host-local
/// directory `dir`, under host-local's own store lock (flock on `<dir>/lock`, which every
/// host-local ADD holds from before its create to after its write): if it is still there,
/// still blank, and at least `min_age` old, no host-local is writing it, and no DEL ever will
/// match it. The one edit dipamd makes in a delegate's store: nothing but this removal frees
/// such an address. Ok(false): not removed (gone, no longer blank, young, or the lock busy).
/// Blocking.
pub fn free_blank(
    dir: &Path,
    r: &Reservation,
    min_age: std::time::Duration,
) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(dir.join("lock"))?;
    let lock = match flock_within(lock, LOCK_WAIT) {
        Some(l) => l,
        None => return Ok(false),
    };
    let path = dir.join(r.ip.to_string());
    let blank_now = match entry_text(&path) {
        Ok(Some((content, modified))) => {
            owner_text(&content).is_none()
                && modified
                    .and_then(|m| SystemTime::now().duration_since(m).ok())
                    .is_some_and(|age| age >= min_age)
        }
        Ok(None) | Err(_) => false,
    };
    let removed = blank_now && std::fs::remove_file(&path).is_ok();
    drop(lock);
    Ok(removed)
}

/// `file` flocked exclusively, tried until `wait` has passed.
fn flock_within(
    file: std::fs::File,
    wait: std::time::Duration,
) -> Option<nix::fcntl::Flock<std::fs::File>> {
    let until = std::time::Instant::now() + wait;
    let mut file = file;
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Some(locked),
            Err((back, _)) if std::time::Instant::now() < until => {
                file = back;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(_) => return None,
        }
    }
}

/// What a store entry is instead of one host-local wrote, for the skip warning.
#[derive(Debug, thiserror::Error)]
enum NotAnEntry {
    #[error("a symbolic link")]
    Link,
    #[error("{0}")]
    Stat(std::io::Error),
    #[error("not a regular file ({0:?})")]
    NotAFile(std::fs::FileType),
    #[error("{0} bytes, more than {MAX_ENTRY_BYTES}")]
    TooLarge(u64),
    /// It grew past the bound between its fstat and its read.
    #[error("more than {MAX_ENTRY_BYTES} bytes")]
    Grew,
}

/// An entry's bytes and mtime.
type Entry = (Vec<u8>, Option<SystemTime>);

/// One entry's text and mtime, read only as a regular file of at most [`MAX_ENTRY_BYTES`]:
/// opened without following a link (O_NOFOLLOW) and without waiting for a writer
/// (O_NONBLOCK: a FIFO planted in a store once froze dipamd, and after a restart kept it from
/// ever binding its socket). Ok(None): gone or unreadable (host-local removed it meanwhile).
/// Err: what it is instead, for the skip warning.
fn entry_text(path: &Path) -> Result<Option<Entry>, NotAnEntry> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(NotAnEntry::Link),
        Err(_) => return Ok(None),
    };
    let meta = file.metadata().map_err(NotAnEntry::Stat)?;
    if !meta.file_type().is_file() {
        return Err(NotAnEntry::NotAFile(meta.file_type()));
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(NotAnEntry::TooLarge(meta.len()));
    }
    // The size may change after fstat: the read itself is bounded too.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if file
        .take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return Ok(None);
    }
    if bytes.len() as u64 > MAX_ENTRY_BYTES {
        return Err(NotAnEntry::Grew);
    }
    Ok(Some((bytes, meta.modified().ok())))
}

/// Counts a skipped entry and warns, at most once per [`crate::l1_leaves::listen::Throttle::EVERY`]: a
/// store full of planted entries must not flood the log.
fn skip(dir: &Path, name: &str, why: &str) {
    let total = SKIPPED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if let Some(suppressed) = SKIP_WARN.due() {
        tracing::warn!(
            dir = %dir.display(),
            entry = %crate::l1_leaves::validate::shown(name),
            why,
            suppressed,
            total,
            "skipped a delegate store entry that is not a small regular file: host-local \
             writes only those, so it is not a reservation"
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_host_local_files_and_skips_bookkeeping() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("10.0.0.2"), "abc\r\neth0").unwrap();
        std::fs::write(d.path().join("10.0.0.3"), "legacy-id").unwrap();
        std::fs::write(d.path().join("fd00::2"), "v6\r\neth1").unwrap();
        std::fs::write(d.path().join("lock"), "").unwrap();
        std::fs::write(d.path().join("last_reserved_ip.0"), "10.0.0.3").unwrap();
        let r = reservations(d.path()).unwrap();
        let view: Vec<_> = r
            .iter()
            .map(|r| (r.ip.to_string(), r.container_id.as_str(), r.ifname.as_str()))
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.2".into(), "abc", "eth0"),
                ("10.0.0.3".into(), "legacy-id", ""),
                ("fd00::2".into(), "v6", "eth1")
            ]
        );
        assert!(reservations(&d.path().join("missing")).unwrap().is_empty());
    }

    /// The fold a GC reads the store with meets what `contents` lists as held, each once,
    /// with the same names, and none of the blank ones or the bookkeeping files.
    #[tokio::test]
    async fn the_fold_meets_every_held_reservation_and_no_blank_one() {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("10.0.0.2", "abc\r\neth0"),
            ("10.0.0.3", "legacy-id"),
            ("10.0.0.4", ""),
            ("10.0.0.5", " \r\n\0\0"),
            ("fd00::2", "v6\r\neth1"),
            ("lock", ""),
            ("last_reserved_ip.0", "10.0.0.3"),
        ] {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        let mut want: Vec<Reservation> = contents(d.path()).unwrap().held;
        assert_eq!(want.len(), 3);
        let mut met = fold_held(d.path().to_path_buf(), Vec::new(), |v, h| {
            v.push(h.into_reservation())
        })
        .await
        .unwrap();
        let key = |r: &Reservation| (r.ip, r.container_id.clone(), r.ifname.clone(), r.modified);
        met.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(
            met.iter().map(key).collect::<Vec<_>>(),
            want.iter().map(key).collect::<Vec<_>>()
        );
        let none = fold_held(d.path().join("missing"), 0usize, |n, _| *n += 1).await;
        assert_eq!(none.unwrap(), 0, "a missing store holds nothing");
    }

    /// Files that name no owner are blank reservations, and are freed only under
    /// host-local's lock, once old enough, and while still blank.
    #[test]
    fn blank_reservations_are_told_apart_and_freed_only_when_abandoned() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("10.0.0.2"), "abc\r\neth0").unwrap();
        std::fs::write(d.path().join("10.0.0.3"), "").unwrap();
        std::fs::write(d.path().join("10.0.0.4"), " \r\n\0\0").unwrap();
        std::fs::write(d.path().join("10.0.0.5"), [0xff, 0xfe]).unwrap();
        let c = contents(d.path()).unwrap();
        assert_eq!(c.held.len(), 1);
        let blank: Vec<String> = c.blank.iter().map(|r| r.ip.to_string()).collect();
        assert_eq!(blank, ["10.0.0.3", "10.0.0.4", "10.0.0.5"]);
        assert!(c.blank.iter().all(|r| r.container_id.is_empty()));
        let young = std::time::Duration::from_secs(3600);
        assert!(!free_blank(d.path(), &c.blank[0], young).unwrap());
        assert!(
            d.path().join("10.0.0.3").exists(),
            "a young blank was freed"
        );
        // host-local holds its lock: nothing is freed meanwhile.
        let held = std::fs::File::open(d.path().join("lock")).unwrap();
        let held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let zero = std::time::Duration::ZERO;
        assert!(!free_blank(d.path(), &c.blank[0], zero).unwrap());
        drop(held);
        assert!(free_blank(d.path(), &c.blank[0], zero).unwrap());
        assert!(!d.path().join("10.0.0.3").exists());
        // Written meanwhile: no longer blank, kept.
        std::fs::write(d.path().join("10.0.0.4"), "late\r\neth0").unwrap();
        assert!(!free_blank(d.path(), &c.blank[1], zero).unwrap());
        assert!(d.path().join("10.0.0.4").exists());
        assert!(d.path().join("10.0.0.2").exists());
    }

    #[test]
    fn data_dir_default_and_override() {
        assert_eq!(
            host_local_dir(&json!({"ipam":{"type":"host-local"}}), "n"),
            PathBuf::from("/var/lib/cni/networks/n")
        );
        assert_eq!(
            host_local_dir(&json!({"ipam":{"dataDir":"/x"}}), "n"),
            PathBuf::from("/x/n")
        );
        assert!(readable_dir("azure-vnet-ipam", &json!({}), "n").is_none());
    }

    #[test]
    fn only_root_only_directories_are_safe_stores() {
        assert!(root_only_dir(Path::new("/var/lib/cni/networks/missing/x")).is_ok());
        assert!(root_only_dir(Path::new("relative")).is_err());
        assert!(root_only_dir(Path::new("/var/../tmp")).is_err());
        // /tmp itself (sticky, 1777) is no store, though a root-only directory in it is.
        assert!(root_only_dir(Path::new("/tmp")).is_err());
        assert!(root_only_dir(Path::new("/tmp/dipam-missing-store")).is_err());
        let d = tempfile::tempdir().unwrap();
        assert!(root_only_dir(d.path()).is_ok());
        std::fs::create_dir(d.path().join("open")).unwrap();
        std::fs::set_permissions(
            d.path().join("open"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        assert!(root_only_dir(&d.path().join("open/x")).is_err());
        std::os::unix::fs::symlink("/var/lib", d.path().join("link")).unwrap();
        assert!(root_only_dir(&d.path().join("link")).is_err());
        std::fs::create_dir(d.path().join("theirs")).unwrap();
        nix::unistd::chown(
            &d.path().join("theirs"),
            Some(nix::unistd::Uid::from_raw(65534)),
            None,
        )
        .unwrap();
        assert!(root_only_dir(&d.path().join("theirs")).is_err());
    }

    /// A --non-root-data-dir missing from an open directory is made again by root, with its
    /// parents beyond it left to host-local; one a caller made first is refused, not adopted.
    #[test]
    fn a_missing_store_in_an_open_directory_is_made_by_root_and_a_planted_one_refused() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let store = open.join("store/deeper");
        assert!(root_only_dir(&store).is_err());
        assert!(root_only_dir_remade(&store).is_ok());
        let made = std::fs::symlink_metadata(open.join("store")).unwrap();
        assert!(made.is_dir() && made.uid() == 0 && made.mode() & 0o022 == 0);
        // Planted by a caller before root's next look: refused, and left as it is.
        let planted = open.join("planted");
        std::fs::create_dir(&planted).unwrap();
        nix::unistd::chown(&planted, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let why = root_only_dir_remade(&planted).unwrap_err();
        assert!(why.to_string().contains("65534"), "{why}");
        std::os::unix::fs::symlink("/etc", open.join("link")).unwrap();
        assert!(root_only_dir_remade(&open.join("link")).is_err());
        assert!(
            std::fs::symlink_metadata(open.join("link"))
                .unwrap()
                .is_symlink()
        );
    }

    #[test]
    fn skips_links_fifos_devices_and_large_files_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("10.0.0.2"), "abc\r\neth0").unwrap();
        nix::unistd::mkfifo(&d.path().join("10.0.0.3"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join("10.0.0.4")).unwrap();
        std::os::unix::fs::symlink(d.path().join("10.0.0.2"), d.path().join("10.0.0.5")).unwrap();
        std::fs::write(d.path().join("10.0.0.6"), vec![b'x'; 5000]).unwrap();
        let before = skipped();
        let r = reservations(d.path()).unwrap();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].container_id, "abc");
        assert!(skipped() >= before + 4);
    }
}
