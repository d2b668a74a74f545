//! dipamd: flags, start-up order, signals.
//!
//! Start-up order matters for crash safety: open the store (which also refuses a second dipamd
//! on the same state directory), replay interrupted operations, and only then bind the socket
//! and serve.

mod flags;
mod metrics_bind;
pub mod paths;
mod sockets;

use std::{path::PathBuf, sync::Arc, time::Duration};

use clap::Parser;
use tracing::{error, info};

mod phase;
mod pool_args;
mod warm;

use flags::check_flags;

use crate::{
    l2_core::core::Identity,
    l2_core::delegate::Executor,
    l3_clients::agent::{self, AgentConfig, Family, ROLES, conflist::Source},
    l3_clients::divergence,
    l3_clients::gc::GcPolicy,
    l3_clients::spool,
    l5_node::node::Node,
    l6_transport::server,
    l7_daemon::logging::{self, LogFormat},
};

/// dipamd: the dipam shim daemon.
///
/// Serves "CNI over gRPC" to the dipam plugin on a unix socket, runs the delegated IPAM plugin
/// (host-local, azure-vnet-ipam, ...) exactly as a container runtime would, and records every
/// attachment in a ledger (sled, under --state-dir) before answering.
// The doc comments below are clap's help text (plain text, shown by --help and the man
// pages): `<name>` there is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Parser)]
// A repeated flag takes its last value instead of failing the parse: the systemd unit's
// ExecStart, an older copy of it or a drop-in may name a flag that the operator's DIPAMD_OPTS
// names again, and a refused command line under Restart=always is a crash loop with no IPAM
// on the node. Repeatable flags (--allow-uid, --agent-roles, ...) still add up.
#[command(name = "dipamd", version, args_override_self = true)]
pub struct Args {
    /// Unix socket to serve on (created mode 0600, root only).
    #[arg(long, env = "DIPAM_SOCKET", default_value = "/run/dipam/dipam.sock")]
    pub socket: PathBuf,
    /// Where the ledger lives. It must persist across reboots (not tmpfs).
    #[arg(long, env = "DIPAM_STATE_DIR", default_value = "/var/lib/dipam")]
    pub state_dir: PathBuf,
    /// Where the plugin spools DELs while dipamd is unreachable; drained before serving.
    /// dipamd publishes it beside the socket (<socket>.spool), where the plugin finds it:
    /// the conflist needs no spoolDir. Default: <state-dir>/spool.
    #[arg(long, env = "DIPAM_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Directories searched for delegate plugins after the request's CNI_PATH (colon-separated).
    #[arg(
        long,
        env = "DIPAM_CNI_PATH",
        default_value = "/opt/cni/bin:/usr/lib/cni"
    )]
    pub cni_path: String,
    /// Kill a delegate exec that has not finished after this many seconds. One ADD may need
    /// four execs (VERSION probe, cleanup of an interrupted operation, ADD, rollback DEL); the
    /// default keeps even that within the plugin's 55 s wait.
    #[arg(long, env = "DIPAM_DELEGATE_TIMEOUT", default_value_t = 10.0)]
    pub delegate_timeout: f64,
    /// The network config that supplies the delegate for the agent's own addresses (a
    /// .conflist or .conf file). It may appear after dipamd starts: dipamd waits and watches.
    #[arg(long, env = "DIPAM_CONFLIST", conflicts_with = "conf_dir")]
    pub conflist: Option<PathBuf>,
    /// Instead of --conflist: the CNI config directory, searched for the network named by
    /// --network (libcni order: lexical by file name).
    #[arg(long, env = "DIPAM_CONF_DIR", requires = "network")]
    pub conf_dir: Option<PathBuf>,
    /// The network to take from --conf-dir.
    #[arg(long, env = "DIPAM_NETWORK")]
    pub network: Option<String>,
    /// This node's name; part of the agent addresses' container IDs (dipam-<role>-<family>-<node>)
    /// and the warm pool's (dipam-pool-<node>-<n>). Defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Agent roles to hold an address for, comma-separated: router, health, ingress. A role
    /// removed here is released at the next start.
    #[arg(long, env = "DIPAM_AGENT_ROLES", value_delimiter = ',')]
    pub agent_roles: Vec<String>,
    /// Address families for each agent role, comma-separated: ipv4, ipv6.
    #[arg(
        long,
        env = "DIPAM_AGENT_FAMILIES",
        value_delimiter = ',',
        default_value = "ipv4"
    )]
    pub agent_families: Vec<String>,
    /// K8S_POD_NAMESPACE given to the delegate for agent addresses and warm-pool entries.
    #[arg(long, default_value = "kube-system")]
    pub agent_namespace: String,
    /// Seconds between checks that the delegate still holds the agent's addresses.
    #[arg(long, default_value_t = 60.0)]
    pub agent_check_interval: f64,
    /// GC never frees an attachment younger than this many seconds: a pod being created while
    /// GC runs keeps its address. 30 s, so that the runtime-aware GC frees a sandbox that
    /// died at once (a failed RunPodSandbox) within 60 s: grace plus two passes.
    #[arg(long, default_value_t = DEFAULT_GC_GRACE.as_secs_f64())]
    pub gc_grace: f64,
    /// GC refuses to free more than this share (0-1) of a network's pod attachments at once, at
    /// any size (the only pod of a network too); `dipamctl gc --force` overrides it once.
    #[arg(long, default_value_t = 0.5)]
    pub gc_max_free_share: f64,
    /// Accept a GC whose valid list is empty, null or absent (it frees every pod of the network).
    #[arg(long)]
    pub gc_allow_empty: bool,
    /// Delegate DELs a GC runs at a time (1-64). GC locks only what it frees, so pods' ADDs
    /// go on beside it; more at once mostly queue on the delegate's own lock and the CPUs.
    #[arg(long, default_value_t = crate::l3_clients::gc::DEFAULT_PARALLEL, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub gc_parallel: u16,
    /// Seconds between comparisons of the ledger with the delegate's own store (0: never).
    #[arg(long, default_value_t = 300.0)]
    pub reconcile_interval: f64,
    /// Let the reconcile free reservations the delegate holds that dipamd never recorded
    /// (otherwise it only reports them).
    #[arg(long)]
    pub reconcile_free: bool,
    /// The container runtime's CRI socket, e.g. unix:///run/containerd/containerd.sock. Turns
    /// on the runtime-aware GC: every --reconcile-interval dipamd lists the runtime's pod
    /// sandboxes and frees the attachments made through CRI whose sandbox two consecutive
    /// passes did not find (containerd never sends a CNI GC). Off by default. Give it only the
    /// runtime that makes every CRI attachment on this node's networks (docs/cfp.md §7.4).
    /// Empty: off (the shipped unit sets containerd's; `DIPAM_CRI_ENDPOINT=` turns it off).
    #[arg(long, env = "DIPAM_CRI_ENDPOINT", value_name = "unix:///PATH")]
    pub cri_endpoint: Option<String>,
    /// Seconds between the runtime-aware GC's passes (with --cri-endpoint; above 0). Two
    /// passes in a row must miss a sandbox, so an attachment whose pod is gone is freed
    /// within 2 × this after its sandbox went (--gc-grace + 2 × this after its ADD).
    #[arg(long, env = "DIPAM_RUNTIME_GC_INTERVAL", default_value_t = DEFAULT_RUNTIME_GC_INTERVAL.as_secs_f64())]
    pub runtime_gc_interval: f64,
    /// The warm pool's watermarks (pool_args.rs).
    #[command(flatten)]
    pub pool: pool_args::PoolArgs,
    /// Seconds between the two looks at the node that must both find a pod's attachment
    /// dead (no network namespace holds its address, no host route leads to it, the runtime
    /// lists no such sandbox, its network namespace is gone) before dipamd frees it (0: never;
    /// docs/cfp.md §7.4, "Dead attachments"). The agent's and the warm pool's, those in
    /// flight and those younger than --gc-grace are never freed so.
    #[arg(long, default_value_t = crate::l3_clients::gc::evidence::DEFAULT_DEAD_AFTER as f64)]
    pub dead_after: f64,
    /// Where the kernel's boot id is read (tests simulate a reboot with another file).
    #[arg(long, hide = true, default_value = crate::l1_leaves::order::BOOT_ID_FILE)]
    pub boot_id_file: PathBuf,
    /// Fault injection (test builds only): SIGKILL dipamd the first time it reaches POINT.
    #[cfg(feature = "fault-injection")]
    #[arg(long, value_name = "POINT")]
    pub crash_at: Option<String>,
    /// Fault injection (test builds only): hold dipamd's work at POINT until FILE exists
    /// (POINT=FILE; fault.rs).
    #[cfg(feature = "fault-injection")]
    #[arg(long, value_name = "POINT=FILE")]
    pub pause_at: Option<String>,
    /// Give the socket this group (name or gid) and mode 0660 instead of root-only 0600. With
    /// --users-socket, that socket gets the group and --socket stays root-only.
    #[arg(long)]
    pub socket_group: Option<String>,
    /// A second socket, for the non-root callers of --socket-group (mode 0660, that group):
    /// --socket then stays root-only (0600), so that no group member can fill the listen
    /// backlog root's pods connect through. Needs --socket-group; non-root callers name this
    /// path as their config's `socketPath`.
    #[arg(long, requires = "socket_group")]
    pub users_socket: Option<PathBuf>,
    /// Also accept requests from these uids (SO_PEERCRED), besides root; repeatable. Such a
    /// caller is confined (docs/cfp.md, "Threat model"): the delegate is searched only in
    /// --cni-path, only --non-root-delegate types run for it, it may CHECK, DEL and list only
    /// the attachments it added, and it may not send GC or use the Admin and Agent services.
    #[arg(long = "allow-uid")]
    pub allow_uids: Vec<u32>,
    /// Also allow these uids the Admin and Agent services (dipamctl, the network agent),
    /// besides root; repeatable. They see every attachment. Implies --allow-uid.
    #[arg(long = "admin-uid")]
    pub admin_uids: Vec<u32>,
    /// Delegate types dipamd runs for a non-root caller (repeatable, or comma-separated).
    /// dipamd runs every delegate as root with the caller's config, so only IPAM plugins
    /// that touch nothing but their own store belong here.
    #[arg(
        long = "non-root-delegate",
        value_delimiter = ',',
        default_value = "host-local"
    )]
    pub non_root_delegates: Vec<String>,
    /// host-local `dataDir`s a non-root caller may name, besides host-local's default
    /// /var/lib/cni/networks (repeatable). Each must be writable by root only along its whole
    /// path; one that is not is left out, with an error logged at start. Any other dataDir is refused
    /// to a non-root caller: host-local runs as root and follows links in it.
    #[arg(long = "non-root-data-dir")]
    pub non_root_data_dirs: Vec<PathBuf>,
    /// Per non-root uid (--allow-uid, --admin-uid): attachments its records may hold in the
    /// ledger. More ADDs are refused with code 155. Root is never limited by it.
    #[arg(long, default_value_t = crate::l1_leaves::quota::Limits::default().records)]
    pub non_root_max_records: usize,
    /// Per non-root uid: bytes its records may take in the ledger (its ADDs in flight
    /// included). More ADDs are refused with code 155. Kept far below the commit journal's
    /// 4 MiB cap, so one caller can never make the ledger refuse commits for everyone.
    #[arg(long, default_value_t = crate::l1_leaves::quota::Limits::default().bytes)]
    pub non_root_max_bytes: u64,
    /// Per non-root uid: operations running or waiting at once; more are refused at once with
    /// code 155.
    #[arg(long, default_value_t = crate::l1_leaves::quota::Limits::default().in_flight)]
    pub non_root_max_in_flight: usize,
    /// Per non-root uid: operations running at once (all non-root uids together at most
    /// half of the ADD slots; a non-root operation never uses the slots held for root's
    /// releases). More wait, as long as --max-queue's waiters do.
    #[arg(long, default_value_t = crate::l1_leaves::quota::Limits::default().slots)]
    pub non_root_max_slots: usize,
    /// Operations run at once (a quarter is held for DEL, CHECK and GC).
    #[arg(long, default_value_t = 16)]
    pub max_concurrent: usize,
    /// Requests allowed to wait for a slot; beyond that dipamd answers "try again later".
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// gRPC connections one non-root uid (--allow-uid, --admin-uid) may hold at once; more
    /// are closed at accept. Root is bounded only by the descriptor budget (the soft
    /// RLIMIT_NOFILE, raised to the hard limit at start, less a reserve of 256 for delegates
    /// and the ledger).
    #[arg(long, default_value_t = crate::l1_leaves::listen::DEFAULT_PER_UID)]
    pub max_connections_per_uid: usize,
    /// Metrics connections (TCP and unix socket, each) open at once; more wait in the
    /// kernel's backlog.
    #[arg(long, default_value_t = crate::l1_leaves::listen::DEFAULT_METRICS)]
    pub metrics_max_connections: usize,
    /// Serve Prometheus metrics on this address (HOST:PORT). Off by default; only loopback
    /// addresses unless --metrics-allow-remote.
    #[arg(long)]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Accept a non-loopback --metrics-address.
    #[arg(long)]
    pub metrics_allow_remote: bool,
    /// Accept a --state-dir on tmpfs or ramfs. Without it dipamd starts with a WARN and is
    /// not ready (status, health, CNI STATUS say why): a reboot empties such a ledger while
    /// the delegate's store keeps every reservation.
    #[arg(long, env = "DIPAM_ALLOW_VOLATILE_STATE")]
    pub allow_volatile_state: bool,
    /// Accept a --socket in a directory any user may write (e.g. /tmp). Without it dipamd
    /// starts with a WARN and is not ready: another user's socket there would receive the
    /// pods' requests, and the plugin refuses a spool published there (DELs made while
    /// dipamd is down fail with code 11).
    #[arg(long, env = "DIPAM_ALLOW_SHARED_SOCKET_DIR")]
    pub allow_shared_socket_dir: bool,
    /// Serve Prometheus metrics on this unix socket (mode 0600) instead of, or as well as, TCP.
    #[arg(long)]
    pub metrics_socket: Option<PathBuf>,
    /// After SIGTERM (or SIGINT), let the requests in flight finish for at most this many
    /// seconds, then exit. Agent watches end at once with UNAVAILABLE. Keep systemd's
    /// TimeoutStopSec and the DaemonSet's terminationGracePeriodSeconds above it.
    #[arg(long, env = "DIPAM_SHUTDOWN_TIMEOUT", default_value_t = server::DEFAULT_DRAIN.as_secs_f64())]
    pub shutdown_timeout: f64,
    /// Log format on stderr.
    #[arg(long, env = "DIPAM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, tracing syntax (e.g. "info", "debug", "dipam_shim=debug").
    #[arg(long, env = "DIPAM_LOG", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Store(#[from] dipam_state::StoreError),
    #[error("{0}")]
    Serve(#[from] server::ServeError),
    #[error("{0}")]
    Usage(String),
    #[error("start-up replay failed: {0}")]
    Replay(#[from] crate::l1_leaves::error::ShimError),
}

/// dipamd's start, phase by phase, then serving until SIGTERM or SIGINT. The order is the
/// crash-safety argument of docs/cfp.md §8: nothing is served before the ledger is open and
/// every interrupted operation and spooled DEL is replayed.
pub async fn run(args: Args) -> Result<(), DaemonError> {
    logging::init(args.log_format, &args.log_level);
    // Before anything opens a descriptor: the budget every listener shares (listen.rs).
    let budget = crate::l1_leaves::listen::Budget::new(crate::l1_leaves::listen::raise_nofile());
    let flags = check_flags(&args)?;
    let spool = publish_spool(&args)?;
    // Beside the socket by the dipamd that holds its lock, before the ledger opens: a dipamd
    // that crash-loops on its ledger still tells the offline tools where everything is. The
    // socket's directory is read by non-root tooling too (0644, as the spool pointer).
    let record = paths::record(&args, &spool.dir);
    if spool.socket_lock.is_some() {
        let at = crate::l1_leaves::paths_record::beside_socket(&args.socket);
        paths::leave(at, record.clone(), 0o644).await;
    }
    crate::l1_leaves::fault::pause("start-before-ledger").await;
    let store: Arc<dyn dipam_state::Store> = Arc::new(dipam_state::open(&args.state_dir)?);
    // Held until dipamd exits.
    let Some(_socket_lock) = spool.socket_lock else {
        return Err(server::ServeError::InUse {
            path: args.socket.clone(),
        }
        .into());
    };
    // In the state directory by the dipamd that holds the ledger's lock (and the socket's);
    // private (0600) like everything there (perms.rs).
    paths::leave(
        crate::l1_leaves::paths_record::in_state_dir(&args.state_dir),
        record,
        0o600,
    )
    .await;
    let (executor, kills_denied) = executor(&args, flags.dirs);
    let observed = observe(&args, &store);
    let node = assemble(
        &args,
        store,
        executor,
        observed.events,
        flags.agent,
        &spool.dir,
    );
    for denied in kills_denied {
        node.denials.note("start-up", denied);
    }
    attach_parts(
        &node,
        &args,
        (flags.pool, flags.pool_node),
        observed.history,
        flags.runtime,
    );
    note_spool(&node, spool.inherited, spool.unpublished, &spool.dir);
    replay_before_serving(&node, &args, &spool.dir).await?;
    let sockets = sockets::listen(&args).await?;
    // DELs the plugin spooled during the start (it could not connect until now) are released
    // before the first ADD is accepted; connections wait in the backlog meanwhile.
    let late = crate::l5_node::replay::spool::drain_all(&node, &spool.dir).await;
    if late != spool::Drained::default() {
        info!(released = late.released, kept = late.kept, failed = late.failed, spool = %spool.dir.display(), "DELs spooled during start replayed");
    }
    info!(socket = %args.socket.display(), spool = %spool.dir.display(), cni_path = %args.cni_path, "serving");
    // A non-root caller's interrupted operations never hold the socket closed (replay/).
    tokio::spawn(crate::l5_node::replay::interrupted::replay_non_root(
        Arc::clone(&node),
    ));
    spawn_background(&node, &args, observed.metrics.as_ref(), spool.dir, &budget).await?;
    serve(node, &args, sockets, &budget).await
}

/// The last phase: the sockets served, each connection through the shared descriptor budget
/// and the peer checks, until SIGTERM or SIGINT; then the history's queue is written.
async fn serve(
    node: Arc<Node>,
    args: &Args,
    sockets: sockets::Sockets<impl std::future::Future<Output = ()> + Send + 'static>,
    budget: &Arc<crate::l1_leaves::listen::Budget>,
) -> Result<(), DaemonError> {
    let peers = crate::l1_leaves::access::PeerCheck {
        allow_uids: args.allow_uids.clone(),
        admin_uids: args.admin_uids.clone(),
    };
    let gate = |name| {
        crate::l1_leaves::listen::Gate::new(name, Arc::clone(budget), None)
            .with_peers(Arc::new(peers.clone()), args.max_connections_per_uid)
    };
    let users = sockets
        .users
        .map(|(l, path)| server::Listener::new(l, gate("grpc-users"), path, true));
    info!(
        connections = budget.limit(),
        per_uid = args.max_connections_per_uid,
        "connection budget"
    );
    // Written at the clean stop below: the history is batched, and what is queued when the
    // server has drained would otherwise be lost to the exit (docs/troubleshooting.md).
    let history = node.history.get().cloned();
    server::serve(
        node,
        server::Listener::new(
            sockets.root,
            gate("grpc"),
            args.socket.clone(),
            sockets.unlink,
        ),
        users,
        peers,
        Duration::from_secs_f64(args.shutdown_timeout),
        // Twice the quota: a request over the quota still reaches its handler, which names
        // the flag (155); only past this is one answered unread (server/bodies.rs).
        args.non_root_max_in_flight.saturating_mul(2),
        sockets.stop,
    )
    .await?;
    if let Some(h) = history {
        h.flush().await;
    }
    Ok(())
}

/// The socket's lock and the DEL spool, published beside the socket.
struct Spool {
    /// `None`: another dipamd holds the socket.
    socket_lock: Option<nix::fcntl::Flock<std::fs::File>>,
    dir: PathBuf,
    /// The spool a previous dipamd of this socket published, whose DELs are taken over.
    inherited: Option<PathBuf>,
    /// Why the spool could not be published, for status and doctor.
    unpublished: Option<String>,
}

/// Phase 2: the spool is published beside the socket before the ledger is opened: a dipamd
/// that cannot open its ledger (and restarts until an operator acts) still takes DELs into
/// the spool it will drain, instead of leaving the plugin to fail them. Only the dipamd that
/// holds the socket's lock publishes, so a second one (other state directory, same socket)
/// cannot divert the DELs of the one serving.
fn publish_spool(args: &Args) -> Result<Spool, DaemonError> {
    let spool_dir = spool_dir_of(args);
    let socket_lock = spool::lock_socket(&args.socket).map_err(|e| {
        DaemonError::Usage(format!(
            "cannot lock {}: {e}",
            dipam_proto::spool::lock_path(&args.socket).display()
        ))
    })?;
    let dir = spool::create(&spool_dir).map_err(|e| {
        DaemonError::Usage(format!(
            "cannot create --spool-dir {}: {e}",
            spool_dir.display()
        ))
    })?;
    let (inherited, unpublished) = match &socket_lock {
        None => (None, None),
        Some(_) => match spool::publish(&args.socket, &dir) {
            Ok(prev) => (prev, None),
            Err(e) => {
                let why = format!(
                    "cannot publish the spool in {}: {e}",
                    dipam_proto::spool::pointer_path(&args.socket).display()
                );
                tracing::error!("{why}; DELs made while dipamd is down will fail with code 11");
                (None, Some(why))
            }
        },
    };
    Ok(Spool {
        socket_lock,
        dir,
        inherited,
        unpublished,
    })
}

/// Phase 3: the delegate executor. Delegates a killed predecessor left running finish (or
/// die) first, so none can complete after the replay's DEL; the kills refused are returned
/// for doctor.
fn executor(args: &Args, dirs: Vec<PathBuf>) -> (Executor, Vec<String>) {
    let tracker = crate::l2_core::delegate::survivors::Tracker::new(
        crate::l2_core::delegate::survivors::dir_in(&args.state_dir),
    );
    let kills_denied = tracker.settle(Duration::from_secs_f64(args.delegate_timeout));
    let mut executor = Executor::new(dirs, Duration::from_secs_f64(args.delegate_timeout));
    executor.non_root_kinds = args
        .non_root_delegates
        .iter()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    executor.non_root_data_dirs = non_root_data_dirs(args);
    executor.tracker = Some(tracker);
    (executor, kills_denied)
}

/// The `dataDir`s a non-root caller may name: host-local's default and --non-root-data-dir,
/// each only if root alone can write it along its path (one missing from an open directory
/// such as /tmp is made by root first). Checked again at each use (Executor::allow_store):
/// removed later, it could be made again by a caller. Only with --allow-uid do they matter.
fn non_root_data_dirs(args: &Args) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(
        crate::l2_core::delegate::store::DEFAULT_DATA_DIR,
    )];
    dirs.extend(args.non_root_data_dirs.iter().cloned());
    dirs.dedup();
    dirs.retain(
        |d| match crate::l2_core::delegate::store::root_only_dir_remade(d) {
            Ok(()) => true,
            Err(why) => {
                if !args.allow_uids.is_empty() || !args.admin_uids.is_empty() {
                    tracing::error!(
                        dir = %d.display(),
                        why = %why,
                        "not a dataDir for non-root callers: make it root-owned and writable by \
                         root only along its whole path"
                    );
                }
                false
            }
        },
    );
    dirs
}

/// The observers and the events handle that reaches them.
struct Observed {
    metrics: Option<Arc<crate::l4_observers::metrics::Metrics>>,
    history: crate::l4_observers::history::Sink,
    events: crate::l1_leaves::events::Events,
}

/// Phase 4: the observers. The metrics registry listens to the events of every part
/// (metrics/mod.rs); without a metrics listener nothing listens and emitting costs nothing. The
/// explain history listens too: every request and exec is recorded for `dipamctl explain`;
/// its drops are counted by the metrics.
fn observe(args: &Args, store: &Arc<dyn dipam_state::Store>) -> Observed {
    let metrics = (args.metrics_address.is_some() || args.metrics_socket.is_some())
        .then(|| Arc::new(crate::l4_observers::metrics::Metrics::new()));
    let counters: Vec<Arc<dyn crate::l1_leaves::events::Observer>> = metrics
        .iter()
        .map(|m| Arc::clone(m) as Arc<dyn crate::l1_leaves::events::Observer>)
        .collect();
    let history = crate::l4_observers::history::start(dipam_state::Ledger::from_arc(store.clone()));
    let recorder = crate::l4_observers::history::Recorder::new(
        history.clone(),
        crate::l1_leaves::events::Events::new(counters.clone()),
    );
    let mut observers = counters;
    observers.push(Arc::new(recorder));
    Observed {
        metrics,
        history,
        events: crate::l1_leaves::events::Events::new(observers),
    }
}

/// Phase 5: the daemon's context, from the flags.
fn assemble(
    args: &Args,
    store: Arc<dyn dipam_state::Store>,
    mut executor: Executor,
    events: crate::l1_leaves::events::Events,
    agent: Option<AgentConfig>,
    spool_dir: &std::path::Path,
) -> Arc<Node> {
    executor.events = events;
    Node::new(
        store,
        executor,
        Identity {
            socket: args.socket.clone(),
            state_dir: args.state_dir.clone(),
            spool_dir: spool_dir.to_path_buf(),
        },
        agent,
        GcPolicy {
            grace: Duration::from_secs_f64(args.gc_grace.max(0.0)),
            max_free_share: args.gc_max_free_share.clamp(0.0, 1.0),
            allow_empty: args.gc_allow_empty,
            parallel: usize::from(args.gc_parallel),
        },
        crate::l1_leaves::access::Admission::with_quotas(
            args.max_concurrent,
            args.max_queue,
            Duration::from_secs(10),
            crate::l1_leaves::quota::Limits {
                records: args.non_root_max_records,
                bytes: args.non_root_max_bytes,
                in_flight: args.non_root_max_in_flight,
                slots: args.non_root_max_slots,
            },
        ),
    )
}

/// Phase 6: the optional parts: the warm pool's settings, the history's writer, the
/// runtime-aware GC and the veth teardown worker.
fn attach_parts(
    node: &Node,
    args: &Args,
    (marks, pool_node): (crate::l3_clients::pool::sizing::Watermarks, String),
    history: crate::l4_observers::history::Sink,
    runtime: Option<crate::l3_clients::gc::runtime::cri::CriClient>,
) {
    let _ = node.startup.set(crate::l7_daemon::startup_checks::check(
        &args.state_dir,
        &args.socket,
        crate::l7_daemon::startup_checks::Accepted {
            volatile_state: args.allow_volatile_state,
            shared_socket_dir: args.allow_shared_socket_dir,
        },
    ));
    node.pool.configure(crate::l3_clients::pool::PoolConfig {
        marks,
        batch: crate::l3_clients::pool::BATCH,
        node: pool_node,
        namespace: args.agent_namespace.clone(),
    });
    let _ = node.history.set(history);
    if let Some(client) = runtime {
        let _ = node
            .gc
            .runtime
            .set(crate::l3_clients::gc::runtime::RuntimeGc::new(Arc::new(
                client,
            )));
    }
    // Without the worker, main-mode plugins simply delete their veths themselves (slower
    // DEL, same outcome), so a failure here is a warning, not a reason not to serve.
    match crate::l3_clients::teardown::Teardown::start(
        node.denials.clone(),
        node.core.events.clone(),
    ) {
        Ok(td) => {
            let _ = node.teardown.set(td);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the veth teardown worker; plugins will delete pod veths themselves")
        }
    }
}

/// The spool's condition, for status, doctor and the drain.
fn note_spool(
    node: &Node,
    inherited: Option<PathBuf>,
    unpublished: Option<String>,
    spool_dir: &std::path::Path,
) {
    if let Ok(mut u) = node.spool.unpublished.lock() {
        *u = unpublished;
    }
    if let Some(prev) = inherited
        && let Ok(mut i) = node.spool.inherited.lock()
    {
        info!(previous = %prev.display(), spool = %spool_dir.display(), "a previous dipamd of this socket published another spool; its DELs are taken over");
        i.push(prev);
    }
}

/// Phase 7: everything that must happen before the first request: the ledger's census,
/// the replay of interrupted operations, the spooled DELs, the warm pool's and the agent's
/// addresses, and the first comparison with the delegate's store.
async fn replay_before_serving(
    node: &Node,
    args: &Args,
    spool_dir: &std::path::Path,
) -> Result<(), DaemonError> {
    // Each phase's time at debug level: what a start with many records spends where
    // (docs/performance.md, "Density").
    let phase = phase::Phase::new();
    warm::census(node).await?;
    phase.done("census");
    // First: what died in a reboot goes before anything else may meet its addresses.
    let boot = crate::l5_node::replay::reboot::boot_id(&args.boot_id_file);
    crate::l5_node::replay::reboot::release_earlier_boot(node, boot.as_deref()).await?;
    phase.done("earlier boot");
    let replay = crate::l5_node::replay::interrupted::replay(node).await?;
    phase.done("interrupted operations");
    // Releases the plugin could not deliver while dipamd was down, before any ADD can take
    // their addresses' place (F3).
    let drained = crate::l5_node::replay::spool::drain_all(node, spool_dir).await;
    if drained != spool::Drained::default() {
        info!(released = drained.released, kept = drained.kept, failed = drained.failed, spool = %spool_dir.display(), "spooled DELs replayed");
    }
    let attachments = node.core.ledger(|l| l.count()).await?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        state_dir = %args.state_dir.display(),
        attachments,
        replayed = replay.released,
        replay_failed = replay.failed,
        "ledger open"
    );
    // After the replay: entries it could not release, and every entry when the pool is off,
    // are released by the refiller; the rest are ready to hand out.
    crate::l3_clients::pool::refill::init(&node.refiller()).await?;
    phase.done("warm pool");
    // The agent's addresses before the first pod, when the conflist is there: otherwise a pod
    // could take the address the agent held before this restart.
    let reconciler = node.reconciler();
    agent::reconcile::init(&reconciler).await?;
    agent::reconcile::pass(&reconciler).await?;
    phase.done("agent");
    // Before the first ADD: a delegate store that cannot be trusted must refuse it.
    if let Err(e) = divergence::round(&node.watch(), false).await {
        tracing::warn!(error = %e, "first ledger/store reconcile failed");
    }
    phase.done("store reconcile");
    warm::probe_delegates(node).await;
    phase.done("delegates probed");
    // What the start's passes freed goes back to the system now, not after the first idle
    // spell (trim.rs: 10 s without a request, which a runtime polling STATUS more often
    // never has; docs/performance.md, run 29).
    let _ = tokio::task::spawn_blocking(|| {
        // SAFETY: malloc_trim only releases free memory to the OS; it is thread-safe.
        unsafe { libc::malloc_trim(0) }
    })
    .await;
    phase.done("heap trimmed");
    Ok(())
}

/// Phase 9: the background tasks (the agent's checks, the metrics listeners, the pool's
/// refiller, the spool's tick, the reconcile with the delegate's store, the runtime-aware
/// GC).
async fn spawn_background(
    node: &Arc<Node>,
    args: &Args,
    metrics: Option<&Arc<crate::l4_observers::metrics::Metrics>>,
    spool_dir: PathBuf,
    budget: &Arc<crate::l1_leaves::listen::Budget>,
) -> Result<(), DaemonError> {
    let metrics_gate = |name| {
        crate::l1_leaves::listen::Gate::new(
            name,
            Arc::clone(budget),
            Some(args.metrics_max_connections),
        )
    };
    tokio::spawn(crate::l1_leaves::trim::run());
    tokio::spawn(agent::reconcile::run(
        node.reconciler(),
        Duration::from_secs_f64(args.agent_check_interval.max(1.0)),
    ));
    // Bound in the background: the metrics never decide whether dipamd serves (metrics_bind.rs).
    if let Some(m) = metrics {
        if let Some(addr) = args.metrics_address {
            metrics_bind::spawn_tcp(node, m, addr, metrics_gate("metrics-tcp"));
        }
        if let Some(path) = &args.metrics_socket {
            metrics_bind::spawn_unix(node, m, path.clone(), metrics_gate("metrics-unix"));
        }
    }
    tokio::spawn(crate::l3_clients::pool::refill::run(node.refiller()));
    tokio::spawn(crate::l5_node::replay::spool::run(
        Arc::clone(node),
        spool_dir,
        Duration::from_secs(5),
    ));
    tokio::spawn(divergence::run(
        node.watch(),
        Duration::from_secs_f64(args.reconcile_interval.max(0.0)),
        args.reconcile_free,
    ));
    tokio::spawn(crate::l3_clients::gc::evidence::run(
        node.collector(),
        Duration::from_secs_f64(args.dead_after.max(0.0)),
    ));
    if let Some(rt) = node.gc.runtime.get() {
        info!(endpoint = %rt.client.endpoint(), every_s = args.runtime_gc_interval, grace_s = args.gc_grace, "runtime-aware GC on");
        tokio::spawn(crate::l3_clients::gc::runtime::pass::run(
            node.collector(),
            Duration::from_secs_f64(args.runtime_gc_interval),
        ));
    }
    Ok(())
}

/// `--gc-grace`'s default: long enough for a runtime to list a sandbox after its CNI ADD
/// (containerd lists it within a second), short enough for the leak bound below.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(30);

/// `--runtime-gc-interval`'s default. With [`DEFAULT_GC_GRACE`], an attachment whose pod is
/// gone is freed within 30 + 2 × 10 = 50 s of its ADD, or 20 s of its sandbox's removal,
/// on a runtime that never sends a CNI GC (containerd); each pass is one ListPodSandbox and
/// a read of the ledger (docs/performance.md).
pub const DEFAULT_RUNTIME_GC_INTERVAL: Duration = Duration::from_secs(10);

/// After the server has stopped, how long dipamd's exit waits for work still running on
/// blocking threads (a ledger commit, a delegate exec cut short by the drain) before the
/// process ends anyway. Either is safe to abandon: a commit is atomic and a delegate is
/// waited for by the next start.
pub const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Files dipamd creates are its own: the ledger, the journal and the history name every
/// pod's container ID, netns path and addresses, which are no other local user's business
/// (docs/cfp.md, "Threat model"). Call before any thread starts: the umask is per process.
pub fn private_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// glibc's allocator, tuned for a small, bursty daemon. Call before any thread starts.
///
/// - One malloc arena instead of glibc's one per core-thread: per-thread arenas let dipamd's
///   RSS creep from ~17 to ~27 MiB over thousands of attachments (docs/performance.md).
/// - A fixed mmap threshold of [`MMAP_THRESHOLD`]: every block that large is mapped on its
///   own and unmapped when freed. glibc's default threshold moves up to the size of each
///   mapped block freed (to 32 MiB), after which a GC's sets, a listing's reply and the
///   ledger's reads came from the heap and left their pages there: at 10,000 attachments
///   dipamd's RSS in every phase of the density bench was 5-7 MiB above what it held, and
///   the CNI GC's phase peaked at 69.4 MiB (docs/performance.md, run 48). Fixing it also
///   fixes the trim threshold at glibc's 128 KiB, so a freed top of the heap goes back too.
pub fn tune_allocator() {
    // SAFETY: mallopt only changes glibc's allocator tuning; it is called before any other
    // thread exists, so nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
    }
}

/// The size from which a block gets a mapping of its own ([`tune_allocator`]): glibc's
/// default starting point, kept there.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

fn spool_dir_of(args: &Args) -> PathBuf {
    args.spool_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("spool"))
}

/// The agent settings from the flags; `None` when no conflist source is configured.
fn agent_config(args: &Args) -> Result<Option<AgentConfig>, DaemonError> {
    let source = match (&args.conflist, &args.conf_dir, &args.network) {
        (Some(p), _, _) => Source::File(p.clone()),
        (None, Some(dir), Some(network)) => Source::Dir {
            dir: dir.clone(),
            network: network.clone(),
        },
        _ => {
            if args.agent_roles.iter().any(|r| !r.is_empty()) {
                return Err(DaemonError::Usage(
                    "--agent-roles needs the network that supplies the delegate: --conflist \
                     PATH, or --conf-dir DIR --network NAME"
                        .into(),
                ));
            }
            return Ok(None);
        }
    };
    let mut roles = std::collections::BTreeSet::new();
    for r in args
        .agent_roles
        .iter()
        .map(|r| r.trim())
        .filter(|r| !r.is_empty())
    {
        if !ROLES.contains(&r) {
            return Err(DaemonError::Usage(format!(
                "--agent-roles: unknown role {r:?} (roles: {})",
                ROLES.join(", ")
            )));
        }
        roles.insert(r.to_owned());
    }
    let mut families = Vec::new();
    for f in &args.agent_families {
        let fam = Family::parse(f.trim()).ok_or_else(|| {
            DaemonError::Usage(format!("--agent-families: {f:?} is not ipv4 or ipv6"))
        })?;
        if !families.contains(&fam) {
            families.push(fam);
        }
    }
    let node = node_name(args)?;
    Ok(Some(AgentConfig {
        node,
        roles,
        families,
        source,
        namespace: args.agent_namespace.clone(),
    }))
}

/// `--node-name`, or the host name; it becomes part of container IDs, so it is checked.
fn node_name(args: &Args) -> Result<String, DaemonError> {
    let node = match &args.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
    };
    if !agent::valid_node_name(&node) {
        return Err(DaemonError::Usage(format!(
            "--node-name {node:?} cannot be part of a CNI container ID (letters, digits, '_', \
             '.', '-', starting with a letter or digit)"
        )));
    }
    Ok(node)
}

/// Installs the SIGTERM and SIGINT handlers now, and returns a future that resolves when
/// either arrives (also one that arrived before it is first polled).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            error!("cannot install signal handlers; stop dipamd with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
    }
}

#[cfg(test)]
mod tests;
