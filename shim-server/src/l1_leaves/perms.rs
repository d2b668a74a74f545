//! The modes of what dipamd keeps on disk. The ledger, its journal and the history name every
//! pod's container ID, netns path and addresses: no other local user may read them
//! (docs/cfp.md, "Threat model"). dipamd runs with umask 0077 (daemon/), creates its state
//! directory 0700, narrows what an older dipamd left readable, and `dipamctl doctor` reports
//! anything that is still looser.

use std::{
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Creates `dir` mode 0700, or narrows an existing one to 0700 along with every file and
/// directory under it that dipamd's user owns (an older dipamd created them 0755 and 0644).
/// `skip` (the spool directory, whose own rules spool/ applies) is not descended into.
/// Entries owned by someone else, and symbolic links, are left alone: dipamd does not chmod
/// what it did not make, and a link could point anywhere.
pub fn private_state_dir(dir: &Path, skip: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    for (path, mode) in walk(dir, skip)? {
        let owner = std::fs::symlink_metadata(&path)?.uid();
        if owner == me && mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7700))?;
        }
    }
    Ok(())
}

/// Doctor's check that the state directory is private (online and offline alike): the
/// ledger, journal and history name every pod's container ID, netns path and addresses.
pub fn private_check(dir: &Path, skip: &Path) -> dipam_proto::v1::DoctorCheck {
    let loose = loose(dir, skip);
    let detail = if loose.is_empty() {
        format!(
            "{}: directories 0700, files 0600 or narrower",
            dir.display()
        )
    } else {
        let shown: Vec<String> = loose
            .iter()
            .take(5)
            .map(|(p, m)| format!("{} mode {m:o}", p.display()))
            .collect();
        format!(
            "{} entr{} readable beyond root: {}{}",
            loose.len(),
            if loose.len() == 1 { "y" } else { "ies" },
            shown.join(", "),
            if loose.len() > 5 { ", ..." } else { "" }
        )
    };
    dipam_proto::v1::DoctorCheck::new(
        "state directory is private",
        loose.is_empty(),
        detail,
        "any local user can read pod container IDs, netns paths and addresses there: \
         chmod -R go-rwx the state directory (dipamd narrows what it owns at its next start)",
    )
}

/// What under `dir` (itself included, `skip` and links excluded) group or others may
/// access, with its mode.
pub fn loose(dir: &Path, skip: &Path) -> Vec<(PathBuf, u32)> {
    walk(dir, skip)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, mode)| mode & 0o077 != 0)
        .collect()
}

/// Every directory and regular file under `dir` with its permission bits; symbolic links
/// are neither followed nor listed.
fn walk(dir: &Path, skip: &Path) -> std::io::Result<Vec<(PathBuf, u32)>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let meta = std::fs::symlink_metadata(&d)?;
        if !meta.is_dir() {
            continue;
        }
        out.push((d.clone(), meta.permissions().mode() & 0o7777));
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                if path != skip {
                    todo.push(path);
                }
            } else if meta.is_file() {
                out.push((path, meta.permissions().mode() & 0o7777));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_state_dir_is_narrowed_and_links_and_the_spool_are_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("state");
        std::fs::create_dir_all(dir.join("exec")).unwrap();
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        std::fs::write(dir.join("db"), b"x").unwrap();
        std::fs::write(dir.join("exec/slots"), b"x").unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        for (p, m) in [
            (dir.clone(), 0o755),
            (dir.join("exec"), 0o755),
            (dir.join("spool"), 0o755),
            (dir.join("db"), 0o644),
            (dir.join("exec/slots"), 0o666),
            (outside.clone(), 0o644),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        }
        let spool = dir.join("spool");
        assert_eq!(loose(&dir, &spool).len(), 4);
        private_state_dir(&dir, &spool).unwrap();
        assert!(loose(&dir, &spool).is_empty(), "{:?}", loose(&dir, &spool));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("db")), 0o600);
        assert_eq!(mode(&dir.join("exec/slots")), 0o600);
        // Not dipamd's to change here.
        assert_eq!(mode(&spool), 0o755);
        assert_eq!(mode(&outside), 0o644);
    }
}
