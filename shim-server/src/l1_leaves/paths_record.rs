//! The record of dipamd's effective paths, left on the node at every start so that the tools
//! that run with dipamd down (`dipamctl doctor`, `support-bundle`, `recover`) find the node's
//! real configuration instead of assuming the defaults: an operator with a stopped dipamd on
//! non-default paths was told "no ledger in /var/lib/dipam" (issue 43).
//!
//! **Where.** Two copies, each written whole: `<socket>.paths` beside the socket (as the spool
//! pointer is: the tools know the socket, `--socket` or its default), and `dipamd.paths` in
//! the state directory (for a tool given `--state-dir`). The socket's copy is written by the
//! dipamd that holds the socket's lock, before the ledger is opened, so that a dipamd that
//! crash-loops on its ledger still says where it is; the state directory's copy once the
//! ledger is open, that is by the one dipamd that holds the ledger's lock.
//!
//! **Trust.** dipamctl runs as root and acts on what it reads (`recover` moves a state
//! directory aside), so a record is believed only under the spool's rule
//! (dipam_proto::spool): a regular file owned by root, writable by no one else, reached
//! without a symbolic link through directories that only root may write (or sticky ones
//! above). Anything else is refused with a warning that names the problem, and the tools
//! fall back to the defaults, saying so. dipamd writes it to a temporary name opened
//! exclusively without following links, then renames it over the old one, so neither a
//! reader nor a link planted at the name ever sees or redirects a half-written record.

use std::{
    ffi::OsStr,
    io::{Read, Write},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use dipam_proto::spool::{self, Untrusted};
use nix::{
    errno::Errno,
    fcntl::{OFlag, openat, renameat},
    sys::stat::{Mode, fchmod},
    unistd::{UnlinkatFlags, fsync, unlinkat},
};
use serde::{Deserialize, Serialize};

/// The record's format version.
pub const FORMAT: u32 = 1;

/// The record's name in the state directory.
pub const IN_STATE_DIR: &str = "dipamd.paths";

/// The largest record read: a few paths.
const MAX_BYTES: u64 = 64 << 10;

/// Where the dipamd serving `socket` leaves its record.
pub fn beside_socket(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".paths");
    PathBuf::from(p)
}

/// Where the dipamd of `state_dir` leaves its record.
pub fn in_state_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(IN_STATE_DIR)
}

/// What dipamd was started with, as far as the offline tools need it: every path after its
/// defaults were applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub format: u32,
    /// dipamd's version.
    pub version: String,
    pub pid: u32,
    /// When it started (Unix ms).
    pub started_at_ms: u64,
    pub socket: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users_socket: Option<PathBuf>,
    pub state_dir: PathBuf,
    /// The DEL spool, canonical (as published beside the socket).
    pub spool_dir: PathBuf,
    /// Where a killed dipamd's delegates are tracked (`<state-dir>/exec`).
    pub exec_dir: PathBuf,
    /// `--cni-path`: where it finds delegates.
    pub cni_path: String,
    /// `--conflist`, or `--conf-dir` with `--network`: the network of the agent's addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflist: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conf_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_socket: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri_endpoint: Option<String>,
}

/// Why a record was not believed, or not found.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// It fails the trust rule, or cannot be opened (`not_found` tells which).
    #[error(transparent)]
    Untrusted(#[from] Untrusted),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is {size} bytes, more than a record of paths can be", path.display())]
    Size { path: PathBuf, size: u64 },
    #[error("{} is not a record of dipamd's paths: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
}

impl RecordError {
    /// There is no record there (as opposed to one that was refused).
    pub fn not_found(&self) -> bool {
        matches!(self, Self::Untrusted(u) if u.not_found())
    }
}

impl Record {
    pub fn to_json(&self) -> String {
        // A record of paths and numbers always serializes.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Parses a record's text (`path` for the error).
    pub fn parse(text: &[u8], path: &Path) -> Result<Self, RecordError> {
        let invalid = |why: String| RecordError::Invalid {
            path: path.to_owned(),
            why,
        };
        let r: Self = serde_json::from_slice(text).map_err(|e| invalid(e.to_string()))?;
        if r.format != FORMAT {
            return Err(invalid(format!("unknown format {}", r.format)));
        }
        for (name, p) in [
            ("socket", &r.socket),
            ("stateDir", &r.state_dir),
            ("spoolDir", &r.spool_dir),
        ] {
            if !p.is_absolute() {
                return Err(invalid(format!("{name} {} is not absolute", p.display())));
            }
        }
        Ok(r)
    }
}

/// Writes `record` as `path` (mode `mode`, whatever the umask): a temporary name in the same
/// directory, opened exclusively without following a link, fsync, rename over `path` (which
/// replaces a link planted there instead of writing through it), fsync of the directory.
pub fn write(path: &Path, record: &Record, mode: u32) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{}: not a file in a directory",
            path.display()
        )));
    };
    let dir: OwnedFd = std::fs::File::open(parent)?.into();
    let mut tmp = std::ffi::OsString::from(".tmp-");
    tmp.push(name);
    let tmp = Path::new(&tmp);
    // One a killed dipamd left would make the exclusive open fail at every start.
    match unlinkat(&dir, tmp, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let fd = openat(
        &dir,
        tmp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let written = (|| {
        // dipamd's umask (0077) would narrow the mode given to the open.
        fchmod(&fd, Mode::from_bits_truncate(mode))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(record.to_json().as_bytes())?;
        f.sync_all()?;
        renameat(&dir, tmp, &dir, name)?;
        fsync(&dir)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = unlinkat(&dir, tmp, UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// Reads the record at `path` if it meets the trust rule (module doc).
pub fn read(path: &Path) -> Result<Record, RecordError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(RecordError::Invalid {
            path: path.to_owned(),
            why: "not a file in a directory".into(),
        });
    };
    // The directory may be reached through a link an administrator made (/var/run -> /run);
    // the walk below then checks the real directories.
    let parent = std::fs::canonicalize(parent).map_err(|e| {
        RecordError::Untrusted(Untrusted::Io {
            path: parent.to_owned(),
            source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })
    })?;
    let dir = spool::open_dir(&parent)?;
    let mut f = spool::open_file(&dir, &parent, OsStr::new(name))?;
    let size = f
        .metadata()
        .map_err(|source| RecordError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    if size > MAX_BYTES {
        return Err(RecordError::Size {
            path: path.to_owned(),
            size,
        });
    }
    let mut text = Vec::new();
    f.read_to_end(&mut text)
        .map_err(|source| RecordError::Read {
            path: path.to_owned(),
            source,
        })?;
    Record::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn record(state: &Path) -> Record {
        Record {
            format: FORMAT,
            version: "0.0.0".into(),
            pid: 42,
            started_at_ms: 1,
            socket: state.join("d.sock"),
            users_socket: None,
            state_dir: state.to_owned(),
            spool_dir: state.join("spool"),
            exec_dir: state.join("exec"),
            cni_path: "/opt/cni/bin".into(),
            conflist: Some("/etc/x/10.conflist".into()),
            conf_dir: None,
            network: None,
            metrics_address: Some("127.0.0.1:9646".into()),
            metrics_socket: None,
            cri_endpoint: None,
        }
    }

    #[test]
    fn a_record_round_trips_and_a_wrong_one_is_refused() {
        let r = record(Path::new("/srv/dipam"));
        let p = Path::new("/x");
        assert_eq!(Record::parse(r.to_json().as_bytes(), p).unwrap(), r);
        assert!(Record::parse(b"{}", p).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        v["format"] = 2.into();
        let e = Record::parse(v.to_string().as_bytes(), p).unwrap_err();
        assert!(e.to_string().contains("unknown format 2"), "{e}");
        v["format"] = 1.into();
        v["stateDir"] = "relative".into();
        assert!(Record::parse(v.to_string().as_bytes(), p).is_err());
        assert_eq!(
            beside_socket(Path::new("/run/dipam/dipam.sock")),
            PathBuf::from("/run/dipam/dipam.sock.paths")
        );
    }

    #[test]
    fn a_record_is_written_whole_over_a_planted_link_and_refused_when_loose() {
        if !nix::unistd::geteuid().is_root() {
            // The rule wants files owned by root: as another user every record is refused.
            let t = tempfile::tempdir().unwrap();
            let p = t.path().join("r.paths");
            write(&p, &record(t.path()), 0o644).unwrap();
            assert!(matches!(read(&p), Err(RecordError::Untrusted(_))));
            return;
        }
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = t.path().join("r.paths");
        // A link planted at the name is replaced, never written through.
        let target = t.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let r = record(t.path());
        write(&p, &r, 0o644).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(read(&p).unwrap(), r);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // Writable by the group: refused, naming why.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = read(&p).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        let e = read(&p).unwrap_err();
        assert!(e.to_string().contains("not by root"), "{e}");
        assert!(read(&t.path().join("none")).unwrap_err().not_found());
    }
}
