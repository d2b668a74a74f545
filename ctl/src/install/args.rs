//! `dipamctl install`'s command line: its flags (`Args`) and the `Options` they give, with
//! what the command line itself gets wrong (a flag that needs another) as a usage error.

use std::path::{Path, PathBuf};

use super::{
    DEFAULT_CNI_BIN_DIR, DEFAULT_CONF_DIR, DEFAULT_NAME, Options,
    node_ranges::RangesFrom,
    wrap_files::{Direction, Output},
};
use crate::{
    compat,
    error::ArgsError,
    kube::{self, ApiConfig, Backoff},
    wrap::{self, Choice},
};

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
    ) -> Result<Self, ArgsError> {
        let ranges = match a.ranges_from_node {
            None => None,
            Some(_) if a.conflist.is_none() && a.wrap.is_none() => {
                return Err(ArgsError::RangesWithoutConflist);
            }
            Some(node) => Some(RangesFrom {
                api: ApiConfig::resolve(
                    a.kube_api.as_deref(),
                    a.kube_token_file,
                    a.kube_ca_file,
                    &env,
                )?,
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
                    .ok_or_else(|| ArgsError::Socket(socket.to_owned()))?
                    .to_owned(),
            )
        };
        // Judged against the runtimes that read this very conf dir (ctl/conf_readers.rs).
        let readers = crate::conf_readers::readers(
            &a.conf_dir,
            std::ffi::OsStr::new(env("PATH").as_deref().unwrap_or_default()),
            &crate::conf_readers::Host::default(),
        );
        let node_check = a.node_check.resolve(readers);
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
            node_check: Some(node_check),
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
