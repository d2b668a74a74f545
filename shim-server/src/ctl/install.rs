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
//! `--wrap FILE` adopts a conflist the node already has instead (the rewrite is `wrap.rs`):
//! the plugin is installed, then the wrapped conflist written beside FILE, or over it with
//! `--in-place` after a backup. `--unwrap FILE` writes the original back the same way and
//! leaves the plugin alone.
//!
//! `--ranges-from-node NODE` gives the installed (or wrapped) conflist's host-local this
//! node's own ranges, its Node object's `spec.podCIDRs` read from the API server (`kube.rs`,
//! the rewrite is `ranges.rs`). They are read after every local check and before anything is
//! written: a node whose podCIDR is not assigned yet gets nothing installed (with `--wait`,
//! not until it is), never a conflist with some other range.
//!
//! The man pages (`man.rs`: dipamctl's and each command's, dipamd's, dipam's) go under the
//! man directory beside dipamctl, `<dipamctl's directory>/../share/man` (so
//! /usr/local/share/man for /usr/local/bin/dipamctl), the one `man` searches for a command
//! found in PATH; each written as the plugin is, before it. `--man-dir` puts them elsewhere,
//! `--no-man-pages` skips them (an init container's own filesystem has no reader for them).

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::{Value, json};

pub use super::atomic::Placed;
use super::atomic::replace_atomically;
use super::{
    compat,
    kube::{self, ApiConfig, Backoff, PodCidrs},
    man, output, ranges,
    wrap::{self, Choice, Rewritten},
};

/// Where container runtimes look for plugins unless configured otherwise.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
/// Where container runtimes look for network configs unless configured otherwise.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The conflist's file name: runtimes take the lexically first network in the directory.
pub const DEFAULT_NAME: &str = "10-dipam.conflist";
/// The plugin's file name: the `"type"` a conflist names, so it is not configurable.
pub const PLUGIN_NAME: &str = "dipam";

// The cniVersions the plugin accepts (dipam_proto::cni); anything else fails every ADD
// with code 1, so it is refused here, before a runtime sees it.
use dipam_proto::cni::SUPPORTED_VERSIONS;

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

/// Where `--ranges-from-node` reads the node's pod CIDRs, and whether it waits for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangesFrom {
    pub node: String,
    pub api: ApiConfig,
    /// `--wait`: while the node has no podCIDR yet (or the API server does not answer), try
    /// again with this back-off instead of failing.
    pub wait: Option<Backoff>,
}

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

/// `dipamctl install`'s flags: the `Options`, with the runtimes' defaults.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The CNI bin directory (the runtime's CNI_PATH).
    #[arg(long, default_value = DEFAULT_CNI_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// The CNI config directory.
    #[arg(long, default_value = DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// The conflist to validate and install; without it only the plugin is installed.
    #[arg(long)]
    conflist: Option<PathBuf>,
    /// The conflist's file name in --conf-dir (runtimes use the lexically first network).
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
    /// The plugin binary to install (default: the dipam next to this dipamctl).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// Adopt the node's own conflist FILE: install the plugin, then rewrite only the plugin
    /// that carries the IPAM, so that its IPAM runs through dipamd: `"ipam": {...}` becomes
    /// `"ipam": {"type": "dipam", "delegate": {...}}`. Everything else stays byte for byte.
    /// dipamctl's --socket is written as socketPath when it is not the default. The result
    /// goes to FILE.dipam, --output or, with --in-place, over FILE. Refused (exit 1, with the
    /// reason): no IPAM, dipam already there, a cniVersion dipam cannot carry, invalid JSON,
    /// several IPAMs without --plugin-index.
    #[arg(long, value_name = "FILE", group = "adopt", conflicts_with_all = ["conflist", "name"])]
    wrap: Option<PathBuf>,
    /// Undo --wrap: the IPAM dipam delegates to goes back in dipam's place, giving the
    /// original's JSON value. The plugin binary is left alone. Output as for --wrap
    /// (FILE.unwrapped, --output, --in-place).
    #[arg(long, value_name = "FILE", group = "adopt", conflicts_with_all = ["conflist", "name", "plugin"])]
    unwrap: Option<PathBuf>,
    /// With --wrap/--unwrap: write the result to PATH instead of beside FILE.
    #[arg(
        long,
        value_name = "PATH",
        requires = "adopt",
        conflicts_with = "in_place"
    )]
    output: Option<PathBuf>,
    /// With --wrap/--unwrap: replace FILE itself, after copying it to FILE.pre-wrap
    /// (FILE.pre-unwrap). Both are written atomically.
    #[arg(long, requires = "adopt")]
    in_place: bool,
    /// With --wrap/--unwrap: the plugin to rewrite (its index in "plugins", from 0), when
    /// several carry an IPAM (or use dipam).
    #[arg(long, value_name = "N", requires = "adopt")]
    plugin_index: Option<usize>,
    /// With --wrap: the chosen plugin is an IPAM run as the main plugin (e.g. "type":
    /// "host-local"), and dipam takes its place as the main plugin, which also creates the
    /// pod's interface. With --unwrap: give a main-mode dipam's place back to its IPAM.
    #[arg(long, requires = "adopt")]
    main_mode: bool,
    /// Give host-local this node's own ranges: the Node object NODE's spec.podCIDRs (one
    /// range set per family; spec.podCIDR on API servers that have no podCIDRs), read from
    /// the Kubernetes API server with the pod's service account, replace host-local's ranges
    /// in the --conflist (or --wrap) conflist before it is installed. Needs `get` on `nodes`.
    /// In a DaemonSet NODE comes from the downward API (spec.nodeName). A node without a
    /// podCIDR fails (with --wait: waits); there is never a fallback to another range.
    #[arg(long, value_name = "NODE", conflicts_with = "unwrap")]
    ranges_from_node: Option<String>,
    /// With --ranges-from-node: while the node has no podCIDR yet or the API server is not
    /// answering, try again (1 s, doubling up to 30 s between attempts, one line on stderr per
    /// attempt saying why) instead of failing. A refused token, a missing permission or an
    /// unknown node still fail at once.
    #[arg(long, requires = "ranges_from_node")]
    wait: bool,
    /// With --ranges-from-node: the API server, https://HOST:PORT (default: in a pod,
    /// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
    #[arg(long, value_name = "URL", requires = "ranges_from_node")]
    kube_api: Option<String>,
    /// With --ranges-from-node: the bearer token to authenticate with.
    #[arg(long, value_name = "FILE", default_value = kube::TOKEN_FILE)]
    kube_token_file: PathBuf,
    /// With --ranges-from-node: the CA bundle the API server's certificate must chain to (and
    /// the only one trusted).
    #[arg(long, value_name = "FILE", default_value = kube::CA_FILE)]
    kube_ca_file: PathBuf,
    /// The man directory to install the man pages under, in man1/ and man8/ (default: the
    /// share/man beside dipamctl's bin directory, e.g. /usr/local/share/man for
    /// /usr/local/bin/dipamctl: where man looks for a command in PATH).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["no_man_pages", "unwrap"])]
    man_dir: Option<PathBuf>,
    /// Install no man pages.
    #[arg(long)]
    no_man_pages: bool,
    #[command(flatten)]
    node_check: compat::NodeCheckArgs,
}

impl Options {
    /// The options from the command line; `socket` is dipamctl's --socket, `env` the
    /// process environment (the in-cluster API server's address).
    pub fn from_args(
        a: Args,
        socket: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let ranges = match a.ranges_from_node {
            None => None,
            Some(_) if a.conflist.is_none() && a.wrap.is_none() => {
                return Err(
                    "--ranges-from-node writes host-local's ranges into a conflist: pass the \
                     conflist with --conflist (or the node's own with --wrap)"
                        .into(),
                );
            }
            Some(node) => Some(RangesFrom {
                api: ApiConfig::resolve(
                    a.kube_api.as_deref(),
                    a.kube_token_file,
                    a.kube_ca_file,
                    &env,
                )
                .map_err(|e| e.to_string())?,
                node,
                wait: a.wait.then(Backoff::default),
            }),
        };
        let adopt = match (a.wrap, a.unwrap) {
            (Some(f), _) => Some((Direction::Wrap, f)),
            (None, Some(f)) => Some((Direction::Unwrap, f)),
            (None, None) => None,
        };
        let socket = if socket == Path::new(wrap::DEFAULT_SOCKET) {
            None
        } else {
            Some(
                socket
                    .to_str()
                    .ok_or_else(|| format!("--socket {} is not UTF-8", socket.display()))?
                    .to_owned(),
            )
        };
        Ok(Self {
            cni_bin_dir: a.cni_bin_dir,
            conf_dir: a.conf_dir,
            conflist: a.conflist,
            name: a.name,
            plugin: a.plugin,
            adopt,
            output: match (a.output, a.in_place) {
                (Some(p), _) => Output::Path(p),
                (None, true) => Output::InPlace,
                (None, false) => Output::Beside,
            },
            choice: Choice {
                plugin: a.plugin_index,
                main_mode: a.main_mode,
            },
            socket,
            ranges,
            man_dir: match (a.no_man_pages, a.man_dir) {
                (true, _) => None,
                (false, Some(dir)) => Some(dir),
                (false, None) => Some(default_man_dir()),
            },
            node_check: Some(a.node_check.resolve(env("PATH"))),
        })
    }
}

/// The man directory beside the running dipamctl's bin directory (`PREFIX/bin/dipamctl`:
/// `PREFIX/share/man`), which man-db searches for every directory in PATH.
fn default_man_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .as_deref()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map_or_else(
            || PathBuf::from("/usr/local/share/man"),
            |prefix| prefix.join("share/man"),
        )
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
}

/// The node's pod CIDRs, as written into host-local's `ranges`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRanges {
    pub cidrs: PodCidrs,
    /// The plugin whose host-local got them.
    pub plugin: usize,
    /// What host-local had instead (compact JSON), or "".
    pub replaced: String,
}

impl NodeRanges {
    fn json(&self) -> Value {
        json!({
            "node": self.cidrs.node,
            "field": self.cidrs.field,
            "cidrs": self.cidrs.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "ranges": ranges::ranges_value(&self.cidrs.cidrs),
            "plugin": self.plugin,
            "replaced": (!self.replaced.is_empty()).then(|| {
                serde_json::from_str::<Value>(&self.replaced).unwrap_or(Value::Null)
            }),
        })
    }

    fn line(&self) -> String {
        format!(
            "ranges:    node {} {}: {} (host-local of plugins[{}])",
            self.cidrs.node, self.cidrs.field, self.cidrs, self.plugin
        )
    }
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

    fn json(&self) -> Value {
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

    fn print(&self, out: &mut dyn Write) -> io::Result<()> {
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

/// `dipamctl install`: installs, then prints what was done (a table line per file, or one
/// JSON document).
pub fn run(opts: &Options, json: bool, out: &mut dyn Write) -> Result<(), String> {
    if let Some((Direction::Unwrap, source)) = &opts.adopt {
        let prepared = prepare(opts, Direction::Unwrap, source)?;
        let a = write_adopted(prepared)?;
        let printed = if json {
            writeln!(out, "{:#}", json!({ "unwrapped": a.json() }))
        } else {
            a.print(out)
        };
        return printed.map_err(|e| format!("writing output: {e}"));
    }
    // Notes on stderr are JSON lines under --json, as a failure is (output::warn).
    let r = install_with(opts, |r| {
        node_pod_cidrs(r, |line| output::warn(json, line), std::thread::sleep)
    })?;
    if let Some(f) = &r.forced {
        output::warn(json, &format!("warning: installed with --force: {f}"));
    }
    if let Some(w) = opts
        .conflist
        .as_deref()
        .and_then(|p| fs::read(p).ok())
        .and_then(|b| version_warning(&b))
    {
        output::warn(json, &format!("warning: {w}"));
    }
    let state = |p: &Placed| if p.changed { "installed" } else { "unchanged" };
    let printed = if json {
        let v = json!({
            "plugin": {
                "path": r.plugin.path,
                "version": r.plugin_version,
                "changed": r.plugin.changed,
            },
            "conflist": r.conflist.as_ref().map(|(p, network)| json!({
                "path": p.path, "network": network, "changed": p.changed,
            })),
            "wrapped": r.adopted.as_ref().map(Adopted::json),
            "ranges": r.ranges.as_ref().map(NodeRanges::json),
            "manPages": r.man_pages.as_ref().map(|(dir, pages)| json!({
                "dir": dir,
                "pages": pages.iter().map(|p| json!({"path": p.path, "changed": p.changed})).collect::<Vec<_>>(),
            })),
        });
        writeln!(out, "{v:#}")
    } else {
        writeln!(
            out,
            "plugin:    {} ({}) {}",
            r.plugin.path.display(),
            r.plugin_version,
            state(&r.plugin)
        )
        .and_then(|()| match &r.ranges {
            Some(n) => writeln!(out, "{}", n.line()),
            None => Ok(()),
        })
        .and_then(|()| match &r.conflist {
            Some((p, network)) => writeln!(
                out,
                "conflist:  {} (network {network}) {}",
                p.path.display(),
                state(p)
            ),
            None => Ok(()),
        })
        .and_then(|()| match &r.adopted {
            Some(a) => a.print(out),
            None => Ok(()),
        })
        .and_then(|()| match &r.man_pages {
            Some((dir, pages)) => writeln!(
                out,
                "man:       {} pages in {} {}",
                pages.len(),
                dir.display(),
                if pages.iter().any(|p| p.changed) {
                    "installed"
                } else {
                    "unchanged"
                }
            ),
            None => Ok(()),
        })
    };
    printed.map_err(|e| format!("writing output: {e}"))
}

/// A conflist at 1.1.0 is valid and installs, but a runtime whose libcni cannot parse a 1.1.0
/// result fails every ADD with it (containerd 1.6 and 1.7, podman 4: docs/sources.md §1,
/// §10.2), after dipam allocated. Worth a warning, not a refusal: newer runtimes parse it.
pub fn version_warning(conflist: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(conflist).ok()?;
    (v.get("cniVersion")?.as_str()? == "1.1.0").then(|| {
        "the conflist is at cniVersion 1.1.0: containerd 1.6 and 1.7 and podman 4 (libcni \
         before v1.2) cannot parse a 1.1.0 result and fail every pod's ADD with \
         \"unsupported CNI result version\"; use 1.0.0 on nodes that run them"
            .to_owned()
    })
}

/// Validates everything first (so a bad conflist leaves the node untouched), then reads the
/// node's pod CIDRs (with --ranges-from-node; with --wait one stderr line per attempt), then
/// installs the plugin, then the conflist.
pub fn install(opts: &Options) -> Result<Report, String> {
    install_with(opts, |r| {
        node_pod_cidrs(r, |line| eprintln!("dipamctl: {line}"), std::thread::sleep)
    })
}

/// The node's pod CIDRs from the API server, as `r` says, waiting if it says so.
pub fn node_pod_cidrs(
    r: &RangesFrom,
    log: impl FnMut(&str),
    sleep: impl FnMut(Duration),
) -> Result<PodCidrs, String> {
    kube::wait_for_pod_cidrs(
        &r.node,
        r.wait,
        || kube::node_pod_cidrs(&r.api, &r.node),
        log,
        sleep,
    )
    .map_err(|e| format!("--ranges-from-node {}: {e}", r.node))
}

/// [`install`], with the node's pod CIDRs (asked only with --ranges-from-node, and only once
/// every local check passed) from `cidrs`.
pub fn install_with(
    opts: &Options,
    cidrs: impl FnOnce(&RangesFrom) -> Result<PodCidrs, String>,
) -> Result<Report, String> {
    validate_file_name(&opts.name)?;
    let source = match &opts.plugin {
        Some(p) => p.clone(),
        None => default_plugin()?,
    };
    let plugin_version = plugin_version(&source)?;
    let binary =
        fs::read(&source).map_err(|e| format!("reading the plugin {}: {e}", source.display()))?;
    let mut conflist = match &opts.conflist {
        Some(path) => {
            let bytes = fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let network =
                validate_conflist(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            Some((bytes, network))
        }
        None => None,
    };
    let mut adopted = match &opts.adopt {
        Some((Direction::Wrap, source)) => Some(prepare(opts, Direction::Wrap, source)?),
        Some((Direction::Unwrap, _)) => {
            return Err("--unwrap installs nothing: run it through `run`".into());
        }
        None => None,
    };
    let ranges = match &opts.ranges {
        None => None,
        Some(from) => Some(node_ranges(
            opts,
            cidrs(from)?,
            &mut conflist,
            &mut adopted,
        )?),
    };
    if let (Some((bytes, _)), Some(path)) = (&conflist, &opts.conflist) {
        has_ranges(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let forced = match (&conflist, &opts.conflist, &opts.node_check) {
        (Some((bytes, _)), Some(path), Some(check)) => check
            .run(bytes, &opts.cni_bin_dir)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        _ => None,
    };

    // The pages first: a man directory that cannot be written (a read-only /usr) fails the
    // install before the node's CNI setup changed, and --man-dir or --no-man-pages fixes it.
    let man_pages = match &opts.man_dir {
        Some(dir) => {
            let pages = man::pages();
            Some((
                dir.clone(),
                man::write_pages(&pages, |p| p.path_under(dir))?,
            ))
        }
        None => None,
    };
    let plugin =
        replace_atomically(&opts.cni_bin_dir, PLUGIN_NAME, &binary, 0o755).map_err(|e| {
            format!(
                "installing the plugin into {}: {e}",
                opts.cni_bin_dir.display()
            )
        })?;
    let conflist = match conflist {
        Some((bytes, network)) => {
            let placed =
                replace_atomically(&opts.conf_dir, &opts.name, &bytes, 0o644).map_err(|e| {
                    format!(
                        "installing {} into {}: {e}",
                        opts.name,
                        opts.conf_dir.display()
                    )
                })?;
            Some((placed, network))
        }
        None => None,
    };
    // After the plugin: the wrapped conflist names it.
    let adopted = adopted.map(write_adopted).transpose()?;
    Ok(Report {
        plugin,
        plugin_version,
        conflist,
        adopted,
        ranges,
        man_pages,
        forced,
    })
}

/// `--ranges-from-node`: the conflist (given, or the node's own being wrapped) with
/// host-local's ranges set to the node's pod CIDRs, validated as dipam would.
fn node_ranges(
    opts: &Options,
    cidrs: PodCidrs,
    conflist: &mut Option<(Vec<u8>, String)>,
    adopted: &mut Option<Prepared>,
) -> Result<NodeRanges, String> {
    let (source, text, only) = match (&*conflist, &*adopted) {
        (Some((bytes, _)), _) => (
            opts.conflist.clone().unwrap_or_default(),
            String::from_utf8(bytes.clone()).map_err(|e| format!("not UTF-8: {e}"))?,
            None,
        ),
        (None, Some(p)) => (
            p.source.clone(),
            p.rewritten.text.clone(),
            Some(p.rewritten.plugin),
        ),
        (None, None) => {
            return Err("--ranges-from-node needs --conflist or --wrap".into());
        }
    };
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", source.display());
    let with = ranges::set_ranges(&text, &cidrs.cidrs, only).map_err(|e| at(&e))?;
    validate_conflist(with.text.as_bytes()).map_err(|e| {
        at(&format!(
            "dipam would refuse the conflist with the node's ranges: {e}"
        ))
    })?;
    match (conflist, adopted) {
        (Some((bytes, _)), _) => *bytes = with.text.clone().into_bytes(),
        (None, Some(p)) => p.rewritten.text = with.text.clone(),
        (None, None) => {}
    }
    Ok(NodeRanges {
        cidrs,
        plugin: with.plugin,
        replaced: with.before,
    })
}

/// Every host-local that dipam runs has a range to hand out: a template written for
/// `--ranges-from-node` (deploy/kubernetes's ConfigMap) installed without it would fail every
/// pod's ADD ("no IP ranges specified"); it is refused here instead.
fn has_ranges(bytes: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    for (i, p) in v["plugins"].as_array().into_iter().flatten().enumerate() {
        let ipam = if p["type"] == PLUGIN_NAME {
            &p["ipam"]
        } else if p["ipam"]["type"] == PLUGIN_NAME {
            &p["ipam"]["delegate"]
        } else {
            continue;
        };
        let empty = |k: &str| match ipam.get(k) {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if ipam["type"] == "host-local" && empty("ranges") && empty("subnet") {
            return Err(format!(
                "plugins[{i}]: host-local has no ranges (nor subnet): give it this node's own \
                 with --ranges-from-node NODE, or write its ranges into the conflist"
            ));
        }
    }
    Ok(())
}

/// A rewrite computed and checked, not yet written.
struct Prepared {
    direction: Direction,
    source: PathBuf,
    original: Vec<u8>,
    rewritten: Rewritten,
    network: String,
    target: PathBuf,
    backup: Option<PathBuf>,
    mode: u32,
}

/// Reads `source`, rewrites it and checks the result; writes nothing.
fn prepare(opts: &Options, direction: Direction, source: &Path) -> Result<Prepared, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", source.display());
    let original = fs::read(source).map_err(|e| at(&e))?;
    let meta = fs::metadata(source).map_err(|e| at(&e))?;
    let text = std::str::from_utf8(&original).map_err(|e| at(&format!("not valid JSON: {e}")))?;
    let rewritten = match direction {
        Direction::Wrap => wrap::wrap(text, opts.choice, opts.socket.as_deref()),
        Direction::Unwrap => wrap::unwrap(text, opts.choice),
    }
    .map_err(|e| at(&e))?;
    let network = match direction {
        // The plugin's own checks: a wrapped config dipam would refuse is never written.
        Direction::Wrap => validate_conflist(rewritten.text.as_bytes())
            .map_err(|e| at(&format!("dipam would refuse the wrapped conflist: {e}")))?,
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
                return Err(format!(
                    "--output {} is FILE itself: use --in-place, which keeps a backup",
                    p.display()
                ));
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
fn write_adopted(p: Prepared) -> Result<Adopted, String> {
    let put = |path: &Path, bytes: &[u8]| {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{} is not a file name", path.display()))?;
        replace_atomically(dir, name, bytes, p.mode)
            .map_err(|e| format!("writing {}: {e}", path.display()))
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

/// The `dipam` shipped next to the running executable.
fn default_plugin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the running executable to locate dipam: {e}"))?;
    let dir = exe.parent().unwrap_or_else(|| Path::new("/"));
    Ok(dir.join(PLUGIN_NAME))
}

/// Runs `plugin --version` and expects "dipam <version>": it proves the file is the dipam
/// plugin (not dipamd or dipamctl given by mistake) and that it runs on this machine
/// (architecture, loader) before the runtime finds out on a pod.
fn plugin_version(plugin: &Path) -> Result<String, String> {
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
    .map_err(|e| {
        format!(
            "cannot run the plugin {}: {e} (pass the dipam binary built for this machine \
             with --plugin)",
            plugin.display()
        )
    })?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !line.starts_with("dipam ") {
        return Err(format!(
            "{} is not the dipam plugin: `--version` printed {line:?} ({})",
            plugin.display(),
            out.status
        ));
    }
    Ok(line)
}

/// A conflist's file name: a plain name that libcni loads as a list.
fn validate_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!(
            "--name {name:?} must be a plain file name, e.g. {DEFAULT_NAME}"
        ));
    }
    // libcni loads *.conf and *.json as a single plugin's config, which a list is not.
    if !name.ends_with(".conflist") {
        return Err(format!(
            "--name {name:?} must end in .conflist: runtimes read other extensions as a \
             single plugin's config"
        ));
    }
    Ok(())
}

/// Checks a conflist the way a runtime and the dipam plugin will, so that a mistake is
/// refused at install time instead of failing every pod. Returns the network name.
pub fn validate_conflist(bytes: &[u8]) -> Result<String, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or("a conflist must be a JSON object")?;
    let text = |key: &str| {
        obj.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let version = text("cniVersion").ok_or("cniVersion is missing")?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(format!(
            "cniVersion {version:?} is not one dipam accepts ({})",
            SUPPORTED_VERSIONS.join(", ")
        ));
    }
    let name = text("name").ok_or("name is missing")?;
    if !dipam_proto::cni::names::is_valid_name(name) {
        return Err(format!(
            "network name {name:?} is invalid (letters, digits, '_', '.', '-', starting with \
             a letter or digit)"
        ));
    }
    let plugins = obj
        .get("plugins")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .ok_or("plugins is missing or empty (is this a single plugin's .conf?)")?;
    let mut uses_dipam = false;
    for (i, p) in plugins.iter().enumerate() {
        let kind = p
            .get("type")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("plugins[{i}].type is missing"))?;
        let ipam = p.get("ipam");
        let ipam_type = ipam
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let keys = if kind == PLUGIN_NAME {
            if ipam_type.is_empty() || ipam_type == PLUGIN_NAME {
                return Err(format!(
                    "plugins[{i}]: dipam as the main plugin needs ipam.type: the real IPAM \
                     (host-local, azure-vnet-ipam, ...)"
                ));
            }
            p
        } else if ipam_type == PLUGIN_NAME {
            let delegate = ipam
                .and_then(|i| i.get("delegate"))
                .and_then(|d| d.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if delegate.is_empty() {
                return Err(format!(
                    "plugins[{i}]: dipam as the IPAM of {kind} needs ipam.delegate.type: the \
                     real IPAM (host-local, azure-vnet-ipam, ...)"
                ));
            }
            ipam.unwrap_or(p)
        } else {
            continue;
        };
        uses_dipam = true;
        check_dipam_keys(i, keys)?;
    }
    if !uses_dipam {
        return Err(
            "no plugin uses dipam: set \"type\": \"dipam\" (dipam as the main plugin) or \
             \"ipam\": {\"type\": \"dipam\", \"delegate\": {...}} (the IPAM of another plugin)"
                .into(),
        );
    }
    Ok(name.to_owned())
}

/// dipam's own keys, as the plugin checks them (code 7 at runtime otherwise).
fn check_dipam_keys(i: usize, keys: &Value) -> Result<(), String> {
    match keys.get("socketPath") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(other) => {
            return Err(format!(
                "plugins[{i}]: socketPath must be a non-empty string, got {other}"
            ));
        }
    }
    match keys.get("spoolDir") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.starts_with('/') => {}
        Some(other) => {
            return Err(format!(
                "plugins[{i}]: spoolDir must be an absolute path, got {other}"
            ));
        }
    }
    match keys.get("timeoutSeconds") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_f64().is_some_and(|s| s > 0.0 && s <= 3600.0) => {}
        Some(other) => {
            return Err(format!(
                "plugins[{i}]: timeoutSeconds must be a number of seconds between 0 and 3600, \
                 got {other}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};

    use super::*;

    /// A stand-in for the plugin: answers `--version` as dipam does.
    fn fake_plugin(dir: &Path, version: &str) -> PathBuf {
        let p = dir.join(format!("dipam-{version}"));
        fs::write(&p, format!("#!/bin/sh\necho \"dipam {version}\"\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    const MAIN: &str = r#"{"cniVersion":"1.0.0","name":"podnet","plugins":[
        {"type":"dipam","socketPath":"/run/dipam/dipam.sock","ipam":{"type":"host-local","ranges":[[{"subnet":"10.4.0.0/24"}]]}},
        {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

    struct Node {
        _tmp: tempfile::TempDir,
        src: PathBuf,
        opts: Options,
    }

    fn node() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        let opts = Options {
            cni_bin_dir: tmp.path().join("opt/cni/bin"),
            conf_dir: tmp.path().join("etc/cni/net.d"),
            plugin: Some(fake_plugin(&src, "1.0.0")),
            ..Options::default()
        };
        Node {
            _tmp: tmp,
            src,
            opts,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn installs_plugin_and_conflist_with_their_modes_and_nothing_else() {
        let mut n = node();
        let list = n.src.join("in.conflist");
        fs::write(&list, MAIN).unwrap();
        n.opts.conflist = Some(list);
        let r = install(&n.opts).unwrap();

        let plugin = n.opts.cni_bin_dir.join("dipam");
        assert_eq!(
            r.plugin,
            Placed {
                path: plugin.clone(),
                changed: true
            }
        );
        assert_eq!(r.plugin_version, "dipam 1.0.0");
        assert_eq!(
            fs::read(&plugin).unwrap(),
            fs::read(n.opts.plugin.as_ref().unwrap()).unwrap()
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&plugin), 0o755);
        let conf = n.opts.conf_dir.join(DEFAULT_NAME);
        assert_eq!(fs::read_to_string(&conf).unwrap(), MAIN);
        assert_eq!(mode(&conf), 0o644);
        assert_eq!(
            r.conflist,
            Some((
                Placed {
                    path: conf,
                    changed: true
                },
                "podnet".into()
            ))
        );
        // No temporary file is left behind.
        assert_eq!(names(&n.opts.cni_bin_dir), ["dipam"]);
        assert_eq!(names(&n.opts.conf_dir), [DEFAULT_NAME]);
    }

    #[test]
    fn a_second_install_changes_nothing_and_a_new_plugin_replaces_the_old() {
        let mut n = node();
        assert!(install(&n.opts).unwrap().plugin.changed);
        assert!(!install(&n.opts).unwrap().plugin.changed);

        // A process still running the old binary keeps it: the new one is a new inode.
        use std::os::unix::fs::MetadataExt;
        let target = n.opts.cni_bin_dir.join("dipam");
        let running = File::open(&target).unwrap();
        let old_inode = running.metadata().unwrap().ino();
        n.opts.plugin = Some(fake_plugin(&n.src, "2.0.0"));
        let r = install(&n.opts).unwrap();
        assert!(r.plugin.changed);
        assert_eq!(r.plugin_version, "dipam 2.0.0");
        assert_ne!(fs::metadata(&target).unwrap().ino(), old_inode);
        assert!(
            String::from_utf8(fs::read(&target).unwrap())
                .unwrap()
                .contains("2.0.0")
        );
        let out = spawn(
            Command::new(&target)
                .arg("--version")
                .stdout(std::process::Stdio::piped()),
        )
        .wait_with_output()
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "dipam 2.0.0");
    }

    /// Spawns `cmd`, retrying ETXTBSY: another test thread may have forked while a file
    /// this test just wrote was still open (the child holds it until it execs).
    fn spawn(cmd: &mut Command) -> std::process::Child {
        for _ in 0..50 {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other.unwrap(),
            }
        }
        panic!("{cmd:?}: text file busy for a second");
    }

    #[test]
    fn replaces_a_binary_that_is_running() {
        // Writing into a running executable fails with ETXTBSY; a rename does not. A real
        // ELF binary: a script's text is not what the kernel keeps busy.
        let n = node();
        fs::create_dir_all(&n.opts.cni_bin_dir).unwrap();
        let target = n.opts.cni_bin_dir.join("dipam");
        fs::copy("/bin/sleep", &target).unwrap();
        let mut child = spawn(Command::new(&target).arg("30"));
        let busy = OpenOptions::new().write(true).open(&target).unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::ETXTBSY));
        let r = install(&n.opts);
        let _ = child.kill();
        let _ = child.wait();
        assert!(r.unwrap().plugin.changed);
        assert!(String::from_utf8_lossy(&fs::read(&target).unwrap()).contains("dipam 1.0.0"));
    }

    #[test]
    fn a_bad_conflist_leaves_the_node_untouched() {
        let mut n = node();
        let list = n.src.join("bad.conflist");
        fs::write(
            &list,
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"}]}"#,
        )
        .unwrap();
        n.opts.conflist = Some(list);
        let e = install(&n.opts).unwrap_err();
        assert!(e.contains("no plugin uses dipam"), "{e}");
        assert!(!n.opts.cni_bin_dir.exists());
        assert!(!n.opts.conf_dir.exists());
    }

    #[test]
    fn refuses_what_is_not_the_dipam_plugin() {
        let mut n = node();
        let other = n.src.join("dipamd");
        fs::write(&other, "#!/bin/sh\necho \"dipamd 1.0.0\"\n").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        n.opts.plugin = Some(other);
        let e = install(&n.opts).unwrap_err();
        assert!(e.contains("is not the dipam plugin"), "{e}");
        n.opts.plugin = Some(n.src.join("missing"));
        let e = install(&n.opts).unwrap_err();
        assert!(e.contains("cannot run the plugin"), "{e}");
        assert!(!n.opts.cni_bin_dir.exists());
    }

    #[test]
    fn file_names_libcni_would_misread_are_refused() {
        for bad in [
            "",
            "a/b.conflist",
            ".hidden.conflist",
            "10-dipam.conf",
            "x.json",
        ] {
            assert!(validate_file_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_file_name("99-x.conflist").is_ok());
    }

    #[test]
    fn conflist_validation_follows_the_plugin() {
        let ok = |s: &str| validate_conflist(s.as_bytes());
        assert_eq!(ok(MAIN).unwrap(), "podnet");
        // IPAM mode, and the repository's own examples.
        assert_eq!(
            ok(r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}]}"#)
                .unwrap(),
            "n"
        );
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conflist");
        for e in fs::read_dir(&examples).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "conflist") {
                validate_conflist(&fs::read(&p).unwrap())
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            }
        }
        // The deliberately broken examples: all refused, except the one whose only fault is
        // a delegate missing on the node, which install cannot know.
        for e in fs::read_dir(examples.join("bad")).unwrap() {
            let p = e.unwrap().path();
            let r = validate_conflist(&fs::read(&p).unwrap());
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(
                r.is_ok(),
                name == "delegate-not-installed.conflist",
                "{name}: {r:?}"
            );
        }
        for (bad, why) in [
            ("not json", "not valid JSON"),
            ("[]", "JSON object"),
            (
                r#"{"name":"n","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
                "cniVersion",
            ),
            (
                r#"{"cniVersion":"2.0.0","name":"n","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
                "cniVersion \"2.0.0\"",
            ),
            (
                r#"{"cniVersion":"1.0.0","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
                "name is missing",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"a/b","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
                "network name",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"host-local"}}"#,
                "plugins is missing",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"ipam":{"type":"dipam"}}]}"#,
                "plugins[0].type",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam"}]}"#,
                "ipam.type",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","ipam":{"type":"dipam"}}]}"#,
                "ipam.type",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam"}}]}"#,
                "ipam.delegate.type",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","socketPath":5,"ipam":{"type":"host-local"}}]}"#,
                "socketPath",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","spoolDir":"spool","ipam":{"type":"host-local"}}]}"#,
                "spoolDir",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","timeoutSeconds":0,"delegate":{"type":"host-local"}}}]}"#,
                "timeoutSeconds",
            ),
        ] {
            let e = ok(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn wrap_in_place_keeps_a_backup_and_the_mode_and_unwrap_restores_the_bytes() {
        let mut n = node();
        fs::create_dir_all(&n.opts.conf_dir).unwrap();
        let file = n.opts.conf_dir.join("10-ptp.conflist");
        let own = r#"{"cniVersion":"1.0.0","name":"kubenet","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.4.0.0/24"}}]}"#;
        fs::write(&file, own).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        n.opts.adopt = Some((Direction::Wrap, file.clone()));
        n.opts.output = Output::InPlace;
        n.opts.socket = Some("/run/node/dipam.sock".into());
        let mut out = Vec::new();
        run(&n.opts, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("plugins[0] (ptp): host-local now runs through dipam"),
            "{text}"
        );
        assert!(
            n.opts.cni_bin_dir.join("dipam").is_file(),
            "the plugin comes first"
        );
        let backup = n.opts.conf_dir.join("10-ptp.conflist.pre-wrap");
        assert_eq!(fs::read_to_string(&backup).unwrap(), own);
        let wrapped: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            wrapped["plugins"][0]["ipam"]["socketPath"],
            "/run/node/dipam.sock"
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode(&file), mode(&backup)), (0o600, 0o600));

        // --output FILE itself is refused: --in-place is the way, with its backup.
        n.opts.adopt = Some((Direction::Unwrap, file.clone()));
        n.opts.output = Output::Path(file.clone());
        let e = run(&n.opts, false, &mut Vec::new()).unwrap_err();
        assert!(e.contains("use --in-place"), "{e}");
        // Beside: FILE.unwrapped, FILE untouched.
        n.opts.output = Output::Beside;
        let mut out = Vec::new();
        run(&n.opts, true, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["unwrapped"]["network"], "kubenet");
        let beside = n.opts.conf_dir.join("10-ptp.conflist.unwrapped");
        assert_eq!(fs::read_to_string(&beside).unwrap(), own);
        assert_eq!(v["unwrapped"]["path"], json!(beside));

        // A refused wrap installs nothing.
        let m = node();
        let mut opts = m.opts.clone();
        let e = {
            fs::write(&file, own.replace("1.0.0", "9.9.9")).unwrap();
            opts.adopt = Some((Direction::Wrap, file.clone()));
            install(&opts).unwrap_err()
        };
        assert!(e.contains("cniVersion \"9.9.9\""), "{e}");
        assert!(!opts.cni_bin_dir.exists());
    }

    fn from_node() -> RangesFrom {
        RangesFrom {
            node: "node-a".into(),
            api: ApiConfig {
                url: "https://127.0.0.1:1".into(),
                token_file: "/nonexistent/token".into(),
                ca_file: "/nonexistent/ca.crt".into(),
            },
            wait: None,
        }
    }

    fn answer(cidrs: &[&str]) -> PodCidrs {
        PodCidrs {
            node: "node-a".into(),
            cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            field: "spec.podCIDRs",
        }
    }

    /// The shipped DaemonSet's template: host-local without ranges.
    const TEMPLATE: &str = r#"{"cniVersion":"1.0.0","name":"dipam","plugins":[
        {"type":"dipam","socketPath":"/run/dipam/dipam.sock","ipam":{"type":"host-local","routes":[{"dst":"0.0.0.0/0"}]}}]}"#;

    #[test]
    fn ranges_from_the_node_go_into_the_installed_conflist_and_only_after_local_checks() {
        let mut n = node();
        let list = n.src.join("template.conflist");
        fs::write(&list, TEMPLATE).unwrap();
        n.opts.conflist = Some(list.clone());

        // Without the node's ranges the template is refused: it would fail every ADD.
        let e = install(&n.opts).unwrap_err();
        assert!(e.contains("host-local has no ranges"), "{e}");
        assert!(!n.opts.cni_bin_dir.exists());

        // The API's answer is what gets written, one range set per family.
        n.opts.ranges = Some(from_node());
        let r = install_with(&n.opts, |from| {
            assert_eq!(from.node, "node-a");
            Ok(answer(&["10.244.5.0/24", "fd00:5::/64"]))
        })
        .unwrap();
        let written: Value =
            serde_json::from_slice(&fs::read(n.opts.conf_dir.join(DEFAULT_NAME)).unwrap()).unwrap();
        assert_eq!(
            written["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet": "10.244.5.0/24"}], [{"subnet": "fd00:5::/64"}]])
        );
        assert_eq!(
            written["plugins"][0]["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}])
        );
        let nr = r.ranges.unwrap();
        assert_eq!((nr.plugin, nr.replaced.as_str()), (0, ""));
        assert!(
            nr.line()
                .contains("node node-a spec.podCIDRs: 10.244.5.0/24, fd00:5::/64")
        );

        // No range yet (or any failure to read it): nothing at all is installed.
        let mut m = node();
        m.opts.conflist = Some(list);
        m.opts.ranges = Some(from_node());
        let e =
            install_with(&m.opts, |_| Err("node node-a has no podCIDR yet".into())).unwrap_err();
        assert!(e.contains("no podCIDR yet"), "{e}");
        assert!(!m.opts.cni_bin_dir.exists() && !m.opts.conf_dir.exists());

        // A bad conflist is refused before the API server is asked.
        let bad = m.src.join("bad.conflist");
        fs::write(
            &bad,
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"}]}"#,
        )
        .unwrap();
        m.opts.conflist = Some(bad);
        let e = install_with(&m.opts, |_| panic!("asked the API server")).unwrap_err();
        assert!(e.contains("no plugin uses dipam"), "{e}");
    }

    #[test]
    fn ranges_from_the_node_compose_with_wrap() {
        let mut n = node();
        fs::create_dir_all(&n.opts.conf_dir).unwrap();
        let file = n.opts.conf_dir.join("10-ptp.conflist");
        let own = r#"{"cniVersion":"1.0.0","name":"kubenet","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.4.0.0/16"}}]}"#;
        fs::write(&file, own).unwrap();
        n.opts.adopt = Some((Direction::Wrap, file.clone()));
        n.opts.ranges = Some(from_node());
        let r = install_with(&n.opts, |_| Ok(answer(&["10.244.8.0/24"]))).unwrap();
        let wrapped: Value = serde_json::from_slice(
            &fs::read(n.opts.conf_dir.join("10-ptp.conflist.dipam")).unwrap(),
        )
        .unwrap();
        let d = &wrapped["plugins"][0]["ipam"];
        assert_eq!(d["type"], "dipam");
        assert_eq!(
            d["delegate"],
            json!({"type": "host-local", "ranges": [[{"subnet": "10.244.8.0/24"}]]})
        );
        assert_eq!(r.ranges.unwrap().replaced, r#"{"subnet":"10.4.0.0/16"}"#);
        // The original is untouched.
        assert_eq!(fs::read_to_string(&file).unwrap(), own);
    }

    #[test]
    fn ranges_from_node_needs_a_conflist_and_reads_the_in_cluster_environment() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let parse = |argv: &[&str]| {
            let mut full = vec!["install"];
            full.extend_from_slice(argv);
            Cli::try_parse_from(full).map(|c| c.args)
        };
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
            _ => None,
        };
        let sock = Path::new(wrap::DEFAULT_SOCKET);
        let a = parse(&["--ranges-from-node", "n1"]).unwrap();
        let e = Options::from_args(a, sock, env).unwrap_err();
        assert!(e.contains("pass the conflist with --conflist"), "{e}");
        let a = parse(&["--conflist", "x", "--ranges-from-node", "n1", "--wait"]).unwrap();
        let o = Options::from_args(a, sock, env).unwrap();
        let r = o.ranges.unwrap();
        assert_eq!(r.api.url, "https://10.96.0.1:443");
        assert_eq!(r.api.token_file, Path::new(kube::TOKEN_FILE));
        assert_eq!(r.api.ca_file, Path::new(kube::CA_FILE));
        assert_eq!(r.wait, Some(Backoff::default()));
        let a = parse(&["--conflist", "x", "--ranges-from-node", "n1"]).unwrap();
        let e = Options::from_args(a, sock, |_| None).unwrap_err();
        assert!(e.contains("--kube-api"), "{e}");
        assert!(parse(&["--conflist", "x", "--wait"]).is_err());
        assert!(parse(&["--unwrap", "x", "--ranges-from-node", "n"]).is_err());
    }

    #[test]
    fn a_1_1_0_conflist_gets_a_warning_and_older_ones_none() {
        let at = |v: &str| format!(r#"{{"cniVersion":"{v}","name":"n","plugins":[]}}"#);
        let w = version_warning(at("1.1.0").as_bytes()).expect("1.1.0 warns");
        assert!(w.contains("containerd 1.6"), "{w}");
        assert!(w.contains("unsupported CNI result version"), "{w}");
        for v in ["0.3.1", "0.4.0", "1.0.0"] {
            assert_eq!(version_warning(at(v).as_bytes()), None, "{v}");
        }
        assert_eq!(version_warning(b"not json"), None);
    }

    /// By default the pages go to the share/man beside dipamctl's bin directory (where man
    /// looks for a command in PATH); --man-dir moves them, --no-man-pages drops them.
    #[test]
    fn the_man_dir_is_beside_dipamctl_unless_told() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let opts = |argv: &[&str]| {
            let mut full = vec!["install"];
            full.extend_from_slice(argv);
            Cli::try_parse_from(full)
                .map(|c| Options::from_args(c.args, Path::new(wrap::DEFAULT_SOCKET), |_| None))
        };
        let exe = std::env::current_exe().unwrap();
        let prefix = exe.parent().unwrap().parent().unwrap();
        let man_dir = |argv: &[&str]| opts(argv).unwrap().unwrap().man_dir;
        assert_eq!(man_dir(&[]), Some(prefix.join("share/man")));
        assert_eq!(man_dir(&["--man-dir", "/m"]), Some(PathBuf::from("/m")));
        assert_eq!(man_dir(&["--no-man-pages"]), None);
        assert!(opts(&["--man-dir", "/m", "--no-man-pages"]).is_err());
    }

    /// The man pages go under --man-dir, in man1/ and man8/, atomically and with 0644; an
    /// identical page is left alone; --json names each; an unwritable man directory fails
    /// the install before the plugin is touched.
    #[test]
    fn man_pages_go_under_the_man_dir_before_the_plugin() {
        let mut n = node();
        let man_dir = n.src.join("share/man");
        n.opts.man_dir = Some(man_dir.clone());
        let mut out = Vec::new();
        run(&n.opts, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let count = man::pages().len();
        assert!(
            text.contains(&format!(
                "man:       {count} pages in {} installed",
                man_dir.display()
            )),
            "{text}"
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        for page in [
            "man1/dipamctl.1",
            "man1/dipamctl-install.1",
            "man8/dipamd.8",
            "man1/dipam.1",
        ] {
            assert_eq!(mode(&man_dir.join(page)), 0o644, "{page}");
        }
        assert_eq!(names(&man_dir.join("man8")), ["dipamd.8"]);
        assert_eq!(names(&man_dir.join("man1")).len(), count - 1);

        let mut out = Vec::new();
        run(&n.opts, true, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        let pages = v["manPages"]["pages"].as_array().unwrap();
        assert_eq!(pages.len(), count);
        assert!(pages.iter().all(|p| p["changed"] == false), "{v}");
        assert!(
            pages
                .iter()
                .any(|p| p["path"] == man_dir.join("man1/dipam.1").to_str().unwrap()),
            "{v}"
        );

        // A man directory that cannot be made: nothing is installed.
        let blocked = n.src.join("a-file");
        fs::write(&blocked, "").unwrap();
        fs::remove_file(n.opts.cni_bin_dir.join("dipam")).unwrap();
        n.opts.man_dir = Some(blocked.join("man"));
        let e = install(&n.opts).unwrap_err();
        assert!(e.contains("writing the man page"), "{e}");
        assert!(!n.opts.cni_bin_dir.join("dipam").exists());

        // Without a man directory (--no-man-pages), none: the JSON says null.
        n.opts.man_dir = None;
        let mut out = Vec::new();
        run(&n.opts, true, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["manPages"].is_null(), "{v}");
    }

    #[test]
    fn run_prints_a_line_per_file_or_json() {
        let mut n = node();
        let list = n.src.join("in.conflist");
        fs::write(&list, MAIN).unwrap();
        n.opts.conflist = Some(list);
        let mut out = Vec::new();
        run(&n.opts, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("(dipam 1.0.0) installed"), "{text}");
        assert!(text.contains("(network podnet) installed"), "{text}");
        let mut out = Vec::new();
        run(&n.opts, true, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["plugin"]["changed"], false);
        assert_eq!(v["conflist"]["network"], "podnet");
    }
}
