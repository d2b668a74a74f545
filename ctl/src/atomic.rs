//! Atomic, durable file replacement for dipamctl's installs (the plugin, conflists, man
//! pages): a temporary file in the target's directory, fsync, rename, fsync of the directory.
//! A runtime never sees a partial plugin or conflist, and a crash leaves at most a dot file.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// One file put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub path: PathBuf,
    /// False when the target already held exactly these bytes and was left alone.
    pub changed: bool,
}

/// Puts `bytes` at `dir/name` with `mode`, atomically and durably; leaves an identical file
/// alone.
pub fn replace_atomically(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> io::Result<Placed> {
    let target = dir.join(name);
    if fs::read(&target).is_ok_and(|old| old == bytes)
        && fs::metadata(&target).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode)
    {
        return Ok(Placed {
            path: target,
            changed: false,
        });
    }
    if !dir.is_dir() {
        fs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    // Unique per process and call, so two installers never write into one temporary file; a
    // crash leaves a dot file behind that no runtime loads or execs.
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            // Not executable until complete: nothing may run a partial binary.
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &target)?;
        sync_dir(dir)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Placed {
        path: target,
        changed: true,
    })
}

/// Makes a rename or a new entry in `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
