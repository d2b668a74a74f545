//! The bundle's name and its tar.gz, written whole or not at all.

use std::path::Path;

use crate::error::ArchiveError;

/// The node's name, for the bundle's file name.
pub(super) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}

/// The bundle's name stamp (`20261124T071500Z`) and its RFC 3339 time to the second.
pub(super) fn utc_at(ms: u64) -> (String, String) {
    let rfc = dipam_shim::l1_leaves::clock::rfc3339_ms(ms);
    let stamp: String = rfc[..19]
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    (format!("{stamp}Z"), format!("{}Z", &rfc[..19]))
}

/// Writes the tar.gz: to a temporary file beside the target, 0600, then renamed, so that a
/// bundle that exists is whole.
///
/// Run as root, often in a directory others can write (`/tmp`, a shared working directory).
/// The temporary file is made new, never opened if it exists and never through a link
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`), under a name no one can plant ahead (the pid and the
/// clock's nanoseconds, tried again if taken), and the rename replaces a link planted at the
/// target rather than writing through it. Before, the fixed name `bundle.tar.partial` (the
/// target's last extension replaced) was opened with truncate: another user's link there
/// (in a directory without the sticky bit, or with `fs.protected_symlinks=0`) made root
/// truncate and overwrite the file it pointed at.
pub(super) fn write_archive(
    path: &Path,
    files: &[(String, Vec<u8>)],
    root: &str,
) -> Result<(), ArchiveError> {
    let (tmp, f) = create_temp(path)?;
    let written = fill(f, files, root).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|source| ArchiveError::File {
            path: path.to_owned(),
            source,
        })
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// How many names [`create_temp`] tries before it gives up: each is taken only if someone
/// guessed it (or a run of this pid in the same nanosecond left it).
const TEMP_TRIES: u32 = 16;

/// A new temporary file beside `path` (`.NAME.PID.NANOS.partial`, 0600), made by this call.
fn create_temp(path: &Path) -> Result<(std::path::PathBuf, std::fs::File), ArchiveError> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".to_owned());
    let mut tries = 0;
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.{}.{nanos:09}.partial", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < TEMP_TRIES => {
                tries += 1;
            }
            Err(source) => return Err(ArchiveError::File { path: tmp, source }),
        }
    }
}

/// The archive's entries, compressed into `f` and synced.
fn fill(f: std::fs::File, files: &[(String, Vec<u8>)], root: &str) -> Result<(), ArchiveError> {
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = dipam_shim::l1_leaves::clock::now();
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(mtime);
        h.set_cksum();
        tar.append_data(&mut h, format!("{root}/{name}"), bytes.as_slice())
            .map_err(|source| ArchiveError::Add {
                name: name.clone(),
                source,
            })?;
    }
    let gz = tar.into_inner().map_err(ArchiveError::Finish)?;
    let f = gz.finish().map_err(ArchiveError::Finish)?;
    f.sync_all().map_err(ArchiveError::Finish)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Links planted at every name a bundle once used (the target, and the target with its last extension `partial`) are
    /// never written through: the victim keeps its bytes, and the target becomes the bundle.
    #[test]
    fn planted_links_are_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "root's\n").unwrap();
        let target = dir.path().join("bundle.tar.gz");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        std::os::unix::fs::symlink(&victim, target.with_extension("partial")).unwrap();
        write_archive(&target, &[("a".into(), b"x".to_vec())], "r").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's\n");
        let meta = std::fs::symlink_metadata(&target).unwrap();
        assert!(meta.is_file(), "the link was replaced by the bundle");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Nothing but the planted `.partial` link and the victim are left beside it.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".partial") && n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_time_stamp_is_utc_civil_time() {
        let (stamp, rfc) = utc_at(dipam_shim::l1_leaves::clock::now_ms());
        assert_eq!(stamp.len(), "20261124T071500Z".len(), "{stamp}");
        assert!(rfc.ends_with('Z') && rfc.len() == 20, "{rfc}");
        assert_eq!(&stamp[..4], &rfc[..4]);
    }
}
