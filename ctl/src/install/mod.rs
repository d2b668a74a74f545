//! `dipamctl install`: puts the `dipam` plugin into the CNI bin directory and, optionally, a
//! network config into the CNI config directory, so that a container runtime never sees
//! either of them half-written.
//!
//! Both files are written the same way: a temporary file in the target directory, fsync,
//! the final mode, rename over the old file, fsync of the directory. A runtime that execs
//! `dipam` while it is replaced runs either the old binary or the new one (never a torn
//! one, and never ETXTBSY: the running old binary keeps its inode); one that lists the config
//! directory sees either no conflist or the whole one. The temporary names start with a dot
//! and end in `.tmp`, which libcni never loads as a network config.
//!
//! The plugin is installed first and the conflist second: the moment the conflist appears,
//! the runtime may use the network, and its `"type": "dipam"` must then already be there.
//!
//! `--wrap FILE` adopts a conflist the node already has instead (`wrap_files.rs`; the rewrite is `ctl/wrap.rs`):
//! the plugin is installed, then the wrapped conflist written beside FILE, or over it with
//! `--in-place` after a backup. `--unwrap FILE` writes the original back the same way and
//! leaves the plugin alone.
//!
//! `--ranges-from-node NODE` gives the installed (or wrapped) conflist's host-local this
//! node's own ranges, its Node object's `spec.podCIDRs` read from the API server (`node_ranges.rs`,
//! which asks `ctl/kube.rs` and rewrites with `ctl/ranges.rs`). They are read after every local check and before anything is
//! written: a node whose podCIDR is not assigned yet gets nothing installed (with `--wait`,
//! not until it is), never a conflist with some other range.
//!
//! The man pages (`man_pages.rs`, rendered by `ctl/man.rs`: dipamctl's and each command's, dipamd's, dipam's) go under the
//! man directory beside dipamctl, `<dipamctl's directory>/../share/man` (so
//! /usr/local/share/man for /usr/local/bin/dipamctl), the one `man` searches for a command
//! found in PATH; each written as the plugin is, before it. `--man-dir` puts them elsewhere,
//! `--no-man-pages` skips them (an init container's own filesystem has no reader for them).
//!
//! One file per step: `args.rs` (the command line), `binaries.rs`, `conflist.rs`,
//! `wrap_files.rs`, `node_ranges.rs`, `man_pages.rs`, `report.rs` (what is printed). Their
//! errors are in `ctl/error.rs`; every file is written through `ctl/atomic.rs`, which
//! `ctl/man.rs` shares.

use std::{fs, io::Write, path::PathBuf};

mod args;
mod binaries;
mod conflist;
mod man_pages;
mod node_ranges;
mod report;
mod wrap_files;

pub use args::Args;
use conflist::validate_file_name;
pub use conflist::{validate_conflist, version_warning};
pub use node_ranges::{NodeRanges, RangesFrom, node_pod_cidrs};
pub use wrap_files::{Adopted, Direction, Output};

pub use crate::atomic::Placed;
use crate::{compat, error::InstallError, kube::PodCidrs, output, wrap::Choice};

/// Where container runtimes look for plugins unless configured otherwise.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where container runtimes look for network configs unless configured otherwise.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The conflist's file name: runtimes take the lexically first network in the directory.
pub const DEFAULT_NAME: &str = "10-dipam.conflist";
/// The plugin's file name: the `"type"` a conflist names, so it is not configurable.
pub const PLUGIN_NAME: &str = "dipam";

/// What `dipamctl install` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The CNI bin directory (the runtime's CNI_PATH).
    pub cni_bin_dir: PathBuf,
    /// The CNI config directory.
    pub conf_dir: PathBuf,
    /// A conflist to install; none installs only the plugin.
    pub conflist: Option<PathBuf>,
    /// The conflist's file name in `conf_dir`.
    pub name: String,
    /// The plugin binary to copy; none means the `dipam` next to the running executable
    /// (dipam, dipamd and dipamctl are shipped together).
    pub plugin: Option<PathBuf>,
    /// `--wrap FILE` / `--unwrap FILE`: the node's own conflist to adopt or give back.
    pub adopt: Option<(Direction, PathBuf)>,
    /// Where the rewritten conflist goes.
    pub output: Output,
    /// Which plugin to rewrite, and whether dipam may be (or stop being) the main plugin.
    pub choice: Choice,
    /// dipamd's socket, when it is not the plugin's default (written into a wrapped config).
    pub socket: Option<String>,
    /// `--ranges-from-node NODE`: host-local's ranges from the node's pod CIDRs.
    pub ranges: Option<RangesFrom>,
    /// The man directory the pages go under (`man1/`, `man8/`); none installs none.
    pub man_dir: Option<PathBuf>,
    /// Whether the conflist is checked against this node's plugins and runtimes
    /// (`compat.rs`), and how; none checks nothing.
    pub node_check: Option<compat::NodeCheck>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cni_bin_dir: DEFAULT_CNI_BIN_DIR.into(),
            conf_dir: DEFAULT_CONF_DIR.into(),
            conflist: None,
            name: DEFAULT_NAME.into(),
            plugin: None,
            adopt: None,
            output: Output::Beside,
            choice: Choice::default(),
            socket: None,
            ranges: None,
            man_dir: None,
            node_check: None,
        }
    }
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub plugin: Placed,
    /// The plugin's own `--version` line, e.g. "dipam 0.1.0".
    pub plugin_version: String,
    /// The conflist and the network it defines, when one was installed.
    pub conflist: Option<(Placed, String)>,
    /// What --wrap did.
    pub adopted: Option<Adopted>,
    /// The ranges --ranges-from-node wrote.
    pub ranges: Option<NodeRanges>,
    /// The man pages, under the man directory.
    pub man_pages: Option<(PathBuf, Vec<Placed>)>,
    /// What `--force` installed despite (compat.rs), to print as a warning.
    pub forced: Option<String>,
    /// The runtimes found to read the conf dir, whose cniVersion limits judged the conflist
    /// (conf_readers.rs): said, so that an operator sees which runtime was judged.
    pub readers: Vec<compat::Runtime>,
}

/// `dipamctl install`: installs, then prints what was done (a table line per file, or one
/// JSON document).
pub fn run(opts: &Options, json: bool, out: &mut dyn Write) -> Result<(), InstallError> {
    if let Some((Direction::Unwrap, source)) = &opts.adopt {
        return wrap_files::unwrap(opts, source, json, out);
    }
    // Notes on stderr are JSON lines under --json, as a failure is (output::warn).
    let r = install_with(opts, |r| {
        node_pod_cidrs(r, |line| output::warn(json, line), std::thread::sleep)
    })?;
    if let Some(f) = &r.forced {
        output::warn(json, &format!("warning: installed with --force: {f}"));
    }
    // The general 1.1.0 warning is for a conf dir whose readers are unknown (an init
    // container sees none of the host's runtimes). Where they were found, the check judged
    // them (conf_readers.rs): a forced install's warning names those that cannot take it,
    // and saying it again in other words, or of runtimes that do not read this directory,
    // only misleads.
    let readers_known = opts
        .node_check
        .as_ref()
        .is_some_and(|c| !c.runtimes.is_empty());
    if let Some(w) = opts
        .conflist
        .as_deref()
        .filter(|_| !readers_known)
        .and_then(|p| fs::read(p).ok())
        .and_then(|b| version_warning(&b))
    {
        output::warn(json, &format!("warning: {w}"));
    }
    report::print(&r, json, out)?;
    Ok(())
}

/// Validates everything first (so a bad conflist leaves the node untouched), then reads the
/// node's pod CIDRs (with --ranges-from-node; with --wait one stderr line per attempt), then
/// installs the plugin, then the conflist.
pub fn install(opts: &Options) -> Result<Report, InstallError> {
    install_with(opts, |r| {
        node_pod_cidrs(r, |line| eprintln!("dipamctl: {line}"), std::thread::sleep)
    })
}

/// [`install`], with the node's pod CIDRs (asked only with --ranges-from-node, and only once
/// every local check passed) from `cidrs`.
pub fn install_with(
    opts: &Options,
    cidrs: impl FnOnce(&RangesFrom) -> Result<PodCidrs, InstallError>,
) -> Result<Report, InstallError> {
    // Every check first, writing nothing: a refusal leaves the node as it was.
    validate_file_name(&opts.name).map_err(InstallError::FileName)?;
    let plugin = binaries::read(opts)?;
    let mut conflist = conflist::read(opts)?;
    let mut adopted = wrap_files::prepare_wrap(opts)?;
    let ranges = node_ranges::apply(opts, cidrs, &mut conflist, &mut adopted)?;
    let forced = conflist::check_final(opts, conflist.as_ref())?;
    // Then the writes, each atomic: the pages, the plugin, and only then what names it.
    let man_pages = man_pages::write(opts)?;
    let placed_plugin = binaries::place(opts, &plugin)?;
    let conflist = conflist::place(opts, conflist)?;
    let adopted = adopted.map(wrap_files::write_adopted).transpose()?;
    let readers = opts
        .node_check
        .as_ref()
        .filter(|_| conflist.is_some())
        .map(|c| c.runtimes.clone())
        .unwrap_or_default();
    Ok(Report {
        plugin: placed_plugin,
        plugin_version: plugin.version,
        conflist,
        adopted,
        ranges,
        man_pages,
        forced,
        readers,
    })
}

#[cfg(test)]
mod tests;
