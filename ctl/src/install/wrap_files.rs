//! The files of `--wrap FILE` and `--unwrap FILE`: the node's own conflist read, rewritten
//! (the rewrite itself is `ctl/wrap.rs`) and checked, then written beside FILE, to --output,
//! or over FILE after a backup, each atomically and with FILE's permissions.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use super::{Options, conflist::validate_conflist};
use crate::{
    atomic::{Placed, replace_atomically},
    error::{AdoptError, InstallError},
    wrap::{self, Rewritten},
};

/// Which way a conflist is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Wrap,
    Unwrap,
}

impl Direction {
    /// The suffix of the file written beside the original, and of the backup. Neither ends
    /// in .conf, .conflist or .json, so a runtime never loads it as a second network.
    fn suffixes(self) -> (&'static str, &'static str) {
        match self {
            Direction::Wrap => (".dipam", ".pre-wrap"),
            Direction::Unwrap => (".unwrapped", ".pre-unwrap"),
        }
    }
}

/// Where `--wrap`/`--unwrap` write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Output {
    /// FILE.dipam (FILE.unwrapped) beside FILE.
    #[default]
    Beside,
    /// `--output PATH`.
    Path(PathBuf),
    /// `--in-place`: over FILE, after copying it to FILE.pre-wrap (FILE.pre-unwrap).
    InPlace,
}

/// A conflist rewritten by --wrap or --unwrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    pub direction: Direction,
    pub source: PathBuf,
    pub output: Placed,
    /// The copy of the original, with --in-place.
    pub backup: Option<Placed>,
    pub network: String,
    /// The rewritten plugin's index, its main plugin's type and the IPAM.
    pub plugin: usize,
    pub main: String,
    pub delegate: String,
    pub mode: wrap::Mode,
}

impl Adopted {
    fn line(&self) -> String {
        let (verb, how) = match self.direction {
            Direction::Wrap => ("wrapped:  ", "now runs through dipam"),
            Direction::Unwrap => ("unwrapped:", "runs without dipam again"),
        };
        format!(
            "{verb} {} plugins[{}] ({}): {} {how} ({})",
            self.source.display(),
            self.plugin,
            self.main,
            self.delegate,
            self.mode
        )
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "direction": match self.direction { Direction::Wrap => "wrap", Direction::Unwrap => "unwrap" },
            "source": self.source,
            "path": self.output.path,
            "changed": self.output.changed,
            "backup": self.backup.as_ref().map(|b| &b.path),
            "network": self.network,
            "plugin": self.plugin,
            "main": self.main,
            "delegate": self.delegate,
            "mode": match self.mode { wrap::Mode::Ipam => "ipam", wrap::Mode::Main => "main" },
        })
    }

    pub(super) fn print(&self, out: &mut dyn Write) -> io::Result<()> {
        let state = if self.output.changed {
            "installed"
        } else {
            "unchanged"
        };
        writeln!(out, "{}", self.line())?;
        writeln!(
            out,
            "conflist:  {} (network {}) {state}",
            self.output.path.display(),
            self.network
        )?;
        if let Some(b) = &self.backup {
            writeln!(out, "backup:    {}", b.path.display())?;
        }
        Ok(())
    }
}

/// The `--wrap` step: the node's own conflist rewritten and checked, written only after the
/// plugin ([`write_adopted`]); none without --wrap. `--unwrap` installs nothing and goes
/// through [`super::run`] instead.
pub(super) fn prepare_wrap(opts: &Options) -> Result<Option<Prepared>, InstallError> {
    match &opts.adopt {
        Some((Direction::Wrap, source)) => Ok(Some(prepare(opts, Direction::Wrap, source)?)),
        Some((Direction::Unwrap, _)) => Err(InstallError::UnwrapInstalls),
        None => Ok(None),
    }
}

/// `--unwrap FILE`: the original written back, then what was done printed.
pub(super) fn unwrap(
    opts: &Options,
    source: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), InstallError> {
    let a = write_adopted(prepare(opts, Direction::Unwrap, source)?)?;
    if json {
        writeln!(out, "{:#}", json!({ "unwrapped": a.json() }))?;
    } else {
        a.print(out)?;
    }
    Ok(())
}

/// A rewrite computed and checked, not yet written.
pub(super) struct Prepared {
    direction: Direction,
    pub(super) source: PathBuf,
    original: Vec<u8>,
    pub(super) rewritten: Rewritten,
    network: String,
    target: PathBuf,
    backup: Option<PathBuf>,
    mode: u32,
}

/// Reads `source`, rewrites it and checks the result; writes nothing.
fn prepare(opts: &Options, direction: Direction, source: &Path) -> Result<Prepared, InstallError> {
    let at = |e: AdoptError| InstallError::Adopt {
        path: source.to_owned(),
        source: e,
    };
    let original = fs::read(source).map_err(|e| at(AdoptError::Io(e)))?;
    let meta = fs::metadata(source).map_err(|e| at(AdoptError::Io(e)))?;
    let text = std::str::from_utf8(&original).map_err(|e| at(AdoptError::NotUtf8(e)))?;
    let rewritten = match direction {
        Direction::Wrap => wrap::wrap(text, opts.choice, opts.socket.as_deref()),
        Direction::Unwrap => wrap::unwrap(text, opts.choice),
    }
    .map_err(|e| at(e.into()))?;
    let network = match direction {
        // The plugin's own checks: a wrapped config dipam would refuse is never written.
        Direction::Wrap => validate_conflist(rewritten.text.as_bytes())
            .map_err(|e| at(AdoptError::WrappedRefused(e)))?,
        Direction::Unwrap => serde_json::from_str::<Value>(&rewritten.text)
            .ok()
            .and_then(|v| v["name"].as_str().map(str::to_owned))
            .unwrap_or_default(),
    };
    let (suffix, backup_suffix) = direction.suffixes();
    let with = |suffix: &str| {
        let mut p = source.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let (target, backup) = match &opts.output {
        Output::Beside => (with(suffix), None),
        Output::Path(p) => {
            if fs::canonicalize(p).ok() == fs::canonicalize(source).ok() && p.exists() {
                return Err(InstallError::OutputIsSource(p.clone()));
            }
            (p.clone(), None)
        }
        Output::InPlace => (source.to_owned(), Some(with(backup_suffix))),
    };
    Ok(Prepared {
        direction,
        source: source.to_owned(),
        original,
        rewritten,
        network,
        target,
        backup,
        mode: meta.permissions().mode() & 0o7777,
    })
}

/// Writes a prepared rewrite: the backup first (so the original is never only in memory),
/// then the result, each atomically, with the original's permissions.
pub(super) fn write_adopted(p: Prepared) -> Result<Adopted, InstallError> {
    let put = |path: &Path, bytes: &[u8]| {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| InstallError::NotAFileName(path.to_owned()))?;
        replace_atomically(dir, name, bytes, p.mode).map_err(|source| InstallError::Write {
            path: path.to_owned(),
            source,
        })
    };
    let backup = match &p.backup {
        Some(b) => Some(put(b, &p.original)?),
        None => None,
    };
    let output = put(&p.target, p.rewritten.text.as_bytes())?;
    Ok(Adopted {
        direction: p.direction,
        source: p.source,
        output,
        backup,
        network: p.network,
        plugin: p.rewritten.plugin,
        main: p.rewritten.main,
        delegate: p.rewritten.delegate,
        mode: p.rewritten.mode,
    })
}
