//! The plugin binary `install` copies into the CNI bin directory: which file (the `dipam`
//! shipped beside dipamctl unless --plugin names one), proved to be the dipam plugin and to
//! run on this machine by its own `--version`, and put in place atomically.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{Options, PLUGIN_NAME};
use crate::{
    atomic::{Placed, replace_atomically},
    error::InstallError,
};

/// The plugin to install, read and checked: its bytes and its `--version` line.
pub(super) struct Plugin {
    pub(super) bytes: Vec<u8>,
    pub(super) version: String,
}

/// The `--plugin` step: the binary found, run once (`--version`) and read; nothing written.
pub(super) fn read(opts: &Options) -> Result<Plugin, InstallError> {
    let source = match &opts.plugin {
        Some(p) => p.clone(),
        None => default_plugin()?,
    };
    let version = plugin_version(&source)?;
    let bytes = fs::read(&source).map_err(|source_err| InstallError::ReadPlugin {
        path: source.clone(),
        source: source_err,
    })?;
    Ok(Plugin { bytes, version })
}

/// Puts the plugin into the CNI bin directory (mode 0755), atomically.
pub(super) fn place(opts: &Options, plugin: &Plugin) -> Result<Placed, InstallError> {
    replace_atomically(&opts.cni_bin_dir, PLUGIN_NAME, &plugin.bytes, 0o755).map_err(|source| {
        InstallError::PlacePlugin {
            dir: opts.cni_bin_dir.clone(),
            source,
        }
    })
}

/// The `dipam` shipped next to the running executable.
fn default_plugin() -> Result<PathBuf, InstallError> {
    let exe = std::env::current_exe().map_err(InstallError::NoExecutable)?;
    let dir = exe.parent().unwrap_or_else(|| Path::new("/"));
    Ok(dir.join(PLUGIN_NAME))
}

/// Runs `plugin --version` and expects "dipam <version>": it proves the file is the dipam
/// plugin (not dipamd or dipamctl given by mistake) and that it runs on this machine
/// (architecture, loader) before the runtime finds out on a pod.
fn plugin_version(plugin: &Path) -> Result<String, InstallError> {
    // A binary written moments ago may still be open for writing in a child forked
    // meanwhile (ETXTBSY until that child execs); libcni retries the same way.
    let mut attempt = 0;
    let out = loop {
        match Command::new(plugin).arg("--version").output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            other => break other,
        }
    }
    .map_err(|source| InstallError::PluginRun {
        path: plugin.to_owned(),
        source,
    })?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !line.starts_with("dipam ") {
        return Err(InstallError::NotThePlugin {
            path: plugin.to_owned(),
            line,
            status: out.status,
        });
    }
    Ok(line)
}
