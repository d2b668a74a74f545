//! The DEL spool's contract between the plugin (which writes it while dipamd cannot be reached)
//! and dipamd (which replays it): where the spool is, what may be in it, and how both sides
//! open it.
//!
//! **Where.** dipamd publishes its spool directory in a small file beside the socket it
//! serves, `<socket>.spool` (the *pointer*). The plugin knows the socket (`socketPath`), so
//! it finds the spool without a second setting, and a spool that nobody drains cannot be
//! configured: a conflist `spoolDir` and dipamd's `--spool-dir`/`--state-dir` can no longer
//! disagree. The pointer outlives dipamd (it is never removed: the socket's directory stays
//! across restarts, `RuntimeDirectoryPreserve=yes` / the DaemonSet's hostPath), so a DEL made
//! while dipamd is down or restarting still finds it. Where there is no pointer (dipamd has
//! not run since boot, or the conflist names a socket no dipamd serves) nothing would read a
//! spooled DEL, and the plugin fails the DEL with code 11 (try again later) instead.
//!
//! **Which directory.** The pointer carries the directory's device and inode, and the plugin
//! spools only into the directory with that identity. A dipamd in a container whose spool is
//! not the host's directory at the same path (a missing hostPath mount) is thereby detected
//! instead of written past.
//!
//! **Trust.** dipamd runs as root and replays what it finds, so the rule for the pointer, the
//! spool directory and every spooled file is the same: owned by root, not writable by group
//! or others, never reached through a symbolic link (`O_NOFOLLOW` at every component, each
//! checked on the open descriptor, so nothing can be swapped between check and use). The
//! directories above may be world-writable only with the sticky bit (`/tmp`). The spool
//! directory is created 0700 and its files 0600.

use std::{
    ffi::OsStr,
    fs::File,
    io::{Read, Write},
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{OFlag, open, openat, renameat},
    sys::stat::{FileStat, Mode, fstat},
    unistd::{UnlinkatFlags, fsync, unlinkat},
};

/// The spool file format version.
pub const FORMAT: u32 = 1;

/// The pointer's format version.
pub const POINTER_FORMAT: u32 = 1;

/// The subdirectory of the spool where files that can never be replayed are moved.
pub const QUARANTINE: &str = "failed";

/// The largest spool file dipamd reads: a DEL carries a network config of at most 1 MiB.
pub const MAX_FILE_BYTES: i64 = 4 << 20;

/// The largest pointer the plugin reads.
const MAX_POINTER_BYTES: i64 = 64 << 10;

/// Where dipamd serving `socket` publishes its spool directory.
pub fn pointer_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".spool");
    PathBuf::from(p)
}

/// The lock a dipamd holds while it serves `socket`, so that a second dipamd on the same
/// socket (with another state directory) cannot overwrite the pointer of the one serving.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Whether a dipamd holds the lock of `socket` ([`lock_path`]) now: one is running for it,
/// starting (it takes the lock before it opens its ledger, seconds before it serves on a
/// loaded node) or draining (it unlinked the socket at SIGTERM). Read from `/proc/locks`, so
/// the caller needs no access to the root-only lock file and never takes the lock itself (a
/// probe that did would make a starting dipamd find the socket in use). The kernel lists
/// only the locks of processes this caller's PID namespace can see: the runtime's plugin on
/// the host sees a DaemonSet's dipamd. False when anything cannot be read.
pub fn lock_held(socket: &Path) -> bool {
    let Ok(m) = nix::sys::stat::stat(&lock_path(socket)) else {
        return false;
    };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return false;
    };
    let id = format!(
        "{:02x}:{:02x}:{}",
        nix::sys::stat::major(m.st_dev),
        nix::sys::stat::minor(m.st_dev),
        m.st_ino
    );
    locks_name(&locks, &id)
}

/// Whether `/proc/locks` text `locks` lists a held `flock(2)` lock on the file `id`
/// (`MAJOR:MINOR:INODE` as the kernel prints it). Waiters (`->`) hold nothing.
fn locks_name(locks: &str, id: &str) -> bool {
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:00:5678 0 EOF"
        f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&id)
    })
}

/// What the pointer says: the spool directory, as a path and as an identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    pub dir: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

impl Pointer {
    /// The pointer's JSON text.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "format": POINTER_FORMAT,
            "spoolDir": self.dir.to_string_lossy(),
            "dev": self.dev,
            "ino": self.ino,
        })
        .to_string()
    }

    /// Parses a pointer's text.
    pub fn parse(text: &[u8]) -> Result<Self, BadPointer> {
        let v: serde_json::Value = serde_json::from_slice(text).map_err(BadPointer::Json)?;
        if v["format"].as_u64() != Some(u64::from(POINTER_FORMAT)) {
            return Err(BadPointer::Format(v["format"].to_string()));
        }
        let dir = v["spoolDir"]
            .as_str()
            .filter(|d| d.starts_with('/'))
            .ok_or(BadPointer::NoDir)?;
        let (Some(dev), Some(ino)) = (v["dev"].as_u64(), v["ino"].as_u64()) else {
            return Err(BadPointer::NoIdentity);
        };
        Ok(Self {
            dir: PathBuf::from(dir),
            dev,
            ino,
        })
    }

    /// Whether `st` is the directory this pointer names.
    pub fn names(&self, st: &FileStat) -> bool {
        st.st_dev == self.dev && st.st_ino == self.ino
    }
}

/// Why a spool pointer's text is not one this build reads.
#[derive(Debug, thiserror::Error)]
pub enum BadPointer {
    #[error("not a spool pointer: {0}")]
    Json(#[source] serde_json::Error),
    #[error("unknown spool pointer format {0}")]
    Format(String),
    #[error("the spool pointer names no absolute spoolDir")]
    NoDir,
    #[error("the spool pointer carries no directory identity")]
    NoIdentity,
}

/// Why a path fails the spool's trust rule, or cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: Errno },
    #[error("{} is a symbolic link, and the spool never follows one", path.display())]
    Link { path: PathBuf },
    #[error("{} is not a {want}", path.display())]
    Kind { path: PathBuf, want: &'static str },
    #[error("{} is owned by uid {uid}, not by root", path.display())]
    Owner { path: PathBuf, uid: u32 },
    #[error("{} has mode {mode:04o}: writable by group or others", path.display())]
    Mode { path: PathBuf, mode: u32 },
    #[error("{} is {size} bytes, more than a spooled DEL can be", path.display())]
    Size { path: PathBuf, size: i64 },
}

impl Untrusted {
    /// The path does not exist (as opposed to existing and failing the rule).
    pub fn not_found(&self) -> bool {
        matches!(
            self,
            Self::Io {
                source: Errno::ENOENT,
                ..
            }
        )
    }
}

/// The rule. `dir` says what kind the path must be; `last` whether it is the spool (or
/// pointer) itself, where even a sticky world-writable directory is refused.
fn check(st: &FileStat, path: &Path, dir: bool, last: bool) -> Result<(), Untrusted> {
    let kind = st.st_mode & libc::S_IFMT;
    let (want, ok) = if dir {
        ("directory", kind == libc::S_IFDIR)
    } else {
        ("regular file", kind == libc::S_IFREG)
    };
    if !ok {
        return Err(Untrusted::Kind {
            path: path.to_owned(),
            want,
        });
    }
    if st.st_uid != 0 {
        return Err(Untrusted::Owner {
            path: path.to_owned(),
            uid: st.st_uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 && (last || mode & libc::S_ISVTX == 0) {
        return Err(Untrusted::Mode {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(Errno) -> Untrusted + '_ {
    move |source| match source {
        Errno::ELOOP => Untrusted::Link {
            path: path.to_owned(),
        },
        source => Untrusted::Io {
            path: path.to_owned(),
            source,
        },
    }
}

/// Opens `child` in `parent` as a directory without following a link.
fn open_child_dir(parent: &OwnedFd, child: &OsStr, path: &Path) -> Result<OwnedFd, Untrusted> {
    openat(
        parent,
        child,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        // O_NOFOLLOW|O_DIRECTORY on a link may report ENOTDIR rather than ELOOP.
        let link = nix::sys::stat::fstatat(parent, child, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
        if link { Errno::ELOOP } else { e }
    })
    .map_err(io(path))
}

/// Opens the directory `name` inside `parent` (at `parent_path`) without following a link,
/// if it meets the rule strictly: the quarantine inside the spool.
pub fn open_subdir(parent: &OwnedFd, parent_path: &Path, name: &str) -> Result<OwnedFd, Untrusted> {
    let path = parent_path.join(name);
    let fd = open_child_dir(parent, OsStr::new(name), &path)?;
    check(&fstat(&fd).map_err(io(&path))?, &path, true, true)?;
    Ok(fd)
}

/// Opens the absolute directory `dir` one component at a time without following links,
/// checking each on its descriptor: every directory above must be root's and not writable by
/// group or others (unless sticky), and `dir` itself must meet the rule strictly.
pub fn open_dir(dir: &Path) -> Result<OwnedFd, Untrusted> {
    if !dir.is_absolute() {
        return Err(Untrusted::Kind {
            path: dir.to_owned(),
            want: "absolute path",
        });
    }
    let root = Path::new("/");
    let mut fd = open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io(root))?;
    let names: Vec<&OsStr> = dir
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::ParentDir => Some(Err(())),
            _ => None,
        })
        .collect::<Result<_, _>>()
        .map_err(|()| Untrusted::Kind {
            path: dir.to_owned(),
            want: "path without `..`",
        })?;
    check(&fstat(&fd).map_err(io(root))?, root, true, names.is_empty())?;
    let mut cur = PathBuf::from("/");
    for (i, name) in names.iter().enumerate() {
        cur.push(name);
        let next = open_child_dir(&fd, name, &cur)?;
        check(
            &fstat(&next).map_err(io(&cur))?,
            &cur,
            true,
            i + 1 == names.len(),
        )?;
        fd = next;
    }
    Ok(fd)
}

/// Opens `name` in the directory `dir` (at `dir_path`) for reading, if it is a regular file
/// that meets the rule and is small enough to be a spooled DEL. Never follows a link, never
/// blocks on a FIFO.
pub fn open_file(dir: &OwnedFd, dir_path: &Path, name: &OsStr) -> Result<File, Untrusted> {
    let path = dir_path.join(name);
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io(&path))?;
    let st = fstat(&fd).map_err(io(&path))?;
    check(&st, &path, false, true)?;
    if st.st_size > MAX_FILE_BYTES {
        return Err(Untrusted::Size {
            path,
            size: st.st_size,
        });
    }
    Ok(File::from(fd))
}

/// Reads the pointer published beside `socket`, checking it and the directory chain above it
/// by the rule.
pub fn read_pointer(socket: &Path) -> Result<Pointer, Untrusted> {
    let path = pointer_path(socket);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Untrusted::Kind {
            path,
            want: "file in a directory",
        });
    };
    // The socket's directory may be reached through a link an administrator made
    // (/var/run -> /run); the walk below then checks the real directories.
    let parent = std::fs::canonicalize(parent).map_err(|e| Untrusted::Io {
        path: parent.to_owned(),
        source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    let dir = open_dir(&parent)?;
    let mut f = open_file(&dir, &parent, name)?;
    let st = fstat(f.as_fd()).map_err(io(&path))?;
    if st.st_size > MAX_POINTER_BYTES {
        return Err(Untrusted::Size {
            path,
            size: st.st_size,
        });
    }
    let mut text = Vec::new();
    f.read_to_end(&mut text).map_err(|e| Untrusted::Io {
        path: path.clone(),
        source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })?;
    Pointer::parse(&text).map_err(|_| Untrusted::Kind {
        path,
        want: "spool pointer (unreadable contents)",
    })
}

/// Writes `body` durably as `name` into `dir`: a temporary name opened exclusively without
/// following links (mode `mode`), fsync, rename into place, fsync of the directory. After it
/// returns, the file survives a crash of the node.
pub fn write_file(dir: &OwnedFd, name: &str, body: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = format!(".tmp-{name}");
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )?;
    let written = (|| {
        let mut f = File::from(fd);
        f.write_all(body)?;
        f.sync_all()?;
        renameat(dir, tmp.as_str(), dir, name)?;
        fsync(dir)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// Removes `name` from `dir` (the entry itself, never a link's target) durably.
pub fn remove(dir: &OwnedFd, name: &OsStr) -> std::io::Result<()> {
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
    fsync(dir)?;
    Ok(())
}

/// The identity of an open directory.
pub fn identity(fd: &OwnedFd) -> std::io::Result<(u64, u64)> {
    let st = fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The spool file names waiting in `dir`, oldest first (names sort by issue time).
/// Temporary files (a plugin still writing) and the quarantine are left out.
pub fn pending(dir: &OwnedFd) -> std::io::Result<Vec<std::ffi::OsString>> {
    let dup = dir.as_fd().try_clone_to_owned()?;
    let mut d = nix::dir::Dir::from_fd(dup)?;
    let mut names: Vec<std::ffi::OsString> = d
        .iter()
        .filter_map(Result::ok)
        .map(|e| {
            use std::os::unix::ffi::OsStrExt;
            OsStr::from_bytes(e.file_name().to_bytes()).to_owned()
        })
        .filter(|n| {
            let s = n.to_string_lossy();
            s.ends_with(".json") && !s.starts_with('.')
        })
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn pointer_round_trips_and_sits_beside_the_socket() {
        let p = Pointer {
            dir: "/srv/dipam/spool".into(),
            dev: 7,
            ino: 9,
        };
        assert_eq!(Pointer::parse(p.to_json().as_bytes()).unwrap(), p);
        assert!(Pointer::parse(b"{}").is_err());
        assert!(Pointer::parse(br#"{"format":1,"spoolDir":"rel","dev":1,"ino":1}"#).is_err());
        assert_eq!(
            pointer_path(Path::new("/run/dipam/dipam.sock")),
            PathBuf::from("/run/dipam/dipam.sock.spool")
        );
    }

    #[test]
    fn the_rule_refuses_links_loose_modes_and_foreign_owners() {
        if !root() {
            eprintln!("skipped: needs root (files owned by root)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let spool = t.path().join("spool");
        std::fs::create_dir(&spool).unwrap();
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
        let fd = open_dir(&spool).unwrap();
        write_file(&fd, "a.json", b"{}", 0o600).unwrap();
        assert_eq!(
            pending(&fd).unwrap(),
            vec![std::ffi::OsString::from("a.json")]
        );
        assert!(open_file(&fd, &spool, OsStr::new("a.json")).is_ok());

        std::os::unix::fs::symlink(spool.join("a.json"), spool.join("b.json")).unwrap();
        assert!(matches!(
            open_file(&fd, &spool, OsStr::new("b.json")),
            Err(Untrusted::Link { .. })
        ));
        std::fs::write(spool.join("c.json"), "{}").unwrap();
        std::fs::set_permissions(spool.join("c.json"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        assert!(matches!(
            open_file(&fd, &spool, OsStr::new("c.json")),
            Err(Untrusted::Mode { .. })
        ));
        std::fs::write(spool.join("d.json"), "{}").unwrap();
        std::os::unix::fs::chown(spool.join("d.json"), Some(65534), None).unwrap();
        assert!(matches!(
            open_file(&fd, &spool, OsStr::new("d.json")),
            Err(Untrusted::Owner { uid: 65534, .. })
        ));

        // The directory itself, and a link anywhere on the way to it.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&spool, &link).unwrap();
        assert!(matches!(open_dir(&link), Err(Untrusted::Link { .. })));
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(open_dir(&spool), Err(Untrusted::Mode { .. })));
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&spool, Some(65534), None).unwrap();
        assert!(matches!(open_dir(&spool), Err(Untrusted::Owner { .. })));
        assert!(open_dir(&t.path().join("missing")).unwrap_err().not_found());
    }

    #[test]
    fn a_held_socket_lock_is_seen_from_proc_locks_and_only_while_held() {
        let t = tempfile::tempdir().unwrap();
        let socket = t.path().join("dipam.sock");
        assert!(!lock_held(&socket), "no lock file");
        let file = std::fs::File::create(lock_path(&socket)).unwrap();
        assert!(!lock_held(&socket), "a lock file nobody locks");
        let held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        assert!(lock_held(&socket));
        // Another file's lock is not this socket's.
        assert!(!lock_held(&t.path().join("other.sock")));
        drop(held);
        assert!(!lock_held(&socket));
        // A waiter's line holds nothing.
        assert!(!locks_name(
            "1: FLOCK  ADVISORY  WRITE 9 fd:00:77 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 8 fd:00:78 0 EOF\n",
            "fd:00:78"
        ));
        assert!(locks_name(
            "1: FLOCK  ADVISORY  WRITE 9 fd:00:77 0 EOF\n",
            "fd:00:77"
        ));
    }
}
