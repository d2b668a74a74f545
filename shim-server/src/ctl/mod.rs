//! dipamctl: the operator's view of dipamd. Every command prints a table for people or, with
//! --json, one JSON document for scripts.

use std::{io::Write, path::PathBuf};

use clap::{Parser, Subcommand};
use dipam_proto::v1::{
    AgentListReply, AgentListRequest, AgentRoleRequest, DoctorRequest, ExplainRequest,
    GcAttachment, GcRequest, ListAttachmentsRequest, StatusRequest, admin_client::AdminClient,
    agent_client::AgentClient,
};
use serde_json::json;

pub mod completions;
pub mod install;
pub mod recover;

/// dipamctl: inspect the dipam shim daemon (dipamd).
#[derive(Debug, Parser)]
#[command(name = "dipamctl", version, about, long_about)]
pub struct Args {
    /// dipamd's unix socket.
    #[arg(
        long,
        global = true,
        env = "DIPAM_SOCKET",
        default_value = "/run/dipam/dipam.sock"
    )]
    pub socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Is dipamd ready? Versions, uptime, state directory, attachment count, delegates seen.
    Status {
        /// Exit non-zero unless dipamd is ready (for readiness probes).
        #[arg(long)]
        ready: bool,
    },
    /// Every attachment in the ledger: network, container, interface, owner, state, addresses.
    Attachments {
        /// Only this network.
        #[arg(long)]
        network: Option<String>,
        /// Only this owner: "pod", "agent", "agent:<role>", or "pool" (the warm pool's entries).
        #[arg(long)]
        owner: Option<String>,
    },
    /// Every check of dipamd's configuration and state, with what to fix; exits non-zero when
    /// one fails.
    Doctor,
    /// A container's attachments and the full history of what dipamd did for it: every
    /// request with its outcome, every delegate exec with argv, environment, exit status,
    /// stderr excerpt and duration.
    Explain {
        /// The container ID (CNI_CONTAINERID).
        container_id: String,
    },
    /// Offline: rebuild the ledger from host-local's own store, with dipamd stopped. A corrupt
    /// ledger is moved aside (never deleted); a healthy one is only added to, with --force.
    Recover {
        /// dipamd's --state-dir.
        #[arg(long, default_value = "/var/lib/dipam")]
        state_dir: PathBuf,
        /// The network's conflist (says how host-local is configured, and where its store is).
        #[arg(long)]
        conflist: PathBuf,
        /// Where to find the delegate plugin (colon-separated).
        #[arg(long, default_value = "/opt/cni/bin:/usr/lib/cni")]
        cni_path: String,
        /// Add to a ledger that opens fine.
        #[arg(long)]
        force: bool,
    },
    /// The agent's own addresses (router, health, ingress).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Garbage-collect one network: free what is neither valid nor protected. Agent-owned,
    /// in-flight and young attachments are always kept. Try --dry-run first.
    Gc {
        /// The network's conflist (default: dipamd's --conflist).
        #[arg(long)]
        conflist: Option<PathBuf>,
        /// JSON file with the valid attachments, as a runtime sends them:
        /// [{"containerID":"...","ifname":"eth0"}, ...]. Each entry must have exactly these
        /// two keys (case-sensitive); any other entry refuses the whole GC.
        #[arg(long, conflicts_with = "use_ledger")]
        valid: Option<PathBuf>,
        /// Treat everything in the ledger as valid: frees only reservations the delegate holds
        /// that dipamd never recorded.
        #[arg(long)]
        use_ledger: bool,
        /// Show what would be freed and what is kept, and why; free nothing.
        #[arg(long)]
        dry_run: bool,
        /// Run even if it would free more than dipamd's --gc-max-free-share of the network's
        /// pods (e.g. the only pod of a network). Check the list with --dry-run first.
        #[arg(long)]
        force: bool,
    },
    /// Put the dipam plugin into the CNI bin directory and, with --conflist, a network config
    /// into the CNI config directory, each atomically (temporary file, fsync, rename), plugin
    /// first. A conflist that dipam would refuse is refused here. Needs no dipamd.
    Install {
        /// The CNI bin directory (the runtime's CNI_PATH).
        #[arg(long, default_value = install::DEFAULT_CNI_BIN_DIR)]
        cni_bin_dir: PathBuf,
        /// The CNI config directory.
        #[arg(long, default_value = install::DEFAULT_CONF_DIR)]
        conf_dir: PathBuf,
        /// The conflist to validate and install; without it only the plugin is installed.
        #[arg(long)]
        conflist: Option<PathBuf>,
        /// The conflist's file name in --conf-dir (runtimes use the lexically first network).
        #[arg(long, default_value = install::DEFAULT_NAME)]
        name: String,
        /// The plugin binary to install (default: the dipam next to this dipamctl).
        #[arg(long)]
        plugin: Option<PathBuf>,
    },
    /// Print dipamctl's completion script for a shell, e.g.
    /// `dipamctl completions bash > /etc/bash_completion.d/dipamctl`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: completions::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Every agent address: role, family, IP, gateway, state.
    List,
    /// Enable a role now and wait for its addresses (kept across restarts until the
    /// configured --agent-roles change).
    Allocate {
        /// router, health or ingress.
        role: String,
    },
    /// Disable a role now and wait until its addresses are released.
    Release {
        /// router, health or ingress.
        role: String,
    },
    /// Print the list now and again after every change, until interrupted.
    ///
    /// When dipamd stops or restarts, the watch reconnects (a note goes to stderr) and prints
    /// the new dipamd's full list first; with --no-reconnect it exits non-zero instead.
    Watch {
        /// Exit (status 1, with the reason) when dipamd ends the watch or goes away.
        #[arg(long)]
        no_reconnect: bool,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot reach dipamd at {}: {reason} (is dipamd running? is --socket right?)", socket.display())]
    Unreachable { socket: PathBuf, reason: String },
    #[error("dipamd: {}", .0.message())]
    Rpc(tonic::Status),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

pub async fn run(args: Args, out: &mut dyn Write) -> Result<(), CtlError> {
    // Local commands: install runs in an init container before any dipamd exists.
    match &args.command {
        Command::Install {
            cni_bin_dir,
            conf_dir,
            conflist,
            name,
            plugin,
        } => {
            let opts = install::Options {
                cni_bin_dir: cni_bin_dir.clone(),
                conf_dir: conf_dir.clone(),
                conflist: conflist.clone(),
                name: name.clone(),
                plugin: plugin.clone(),
            };
            return install::run(&opts, args.json, out).map_err(CtlError::Failed);
        }
        Command::Completions { shell } => {
            completions::write(*shell, out)?;
            return Ok(());
        }
        _ => {}
    }
    if let Command::Recover {
        state_dir,
        conflist,
        cni_path,
        force,
    } = &args.command
    {
        let dirs = cni_path
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        let r = recover::run(state_dir, conflist, dirs, *force)
            .await
            .map_err(CtlError::Failed)?;
        if args.json {
            let v = json!({
                "movedAside": r.moved_aside.as_ref().map(|p| p.display().to_string()),
                "spoolKept": r.spool_kept,
                "pods": r.pods, "agent": r.agent, "skipped": r.skipped,
            });
            writeln!(out, "{v:#}")?;
        } else {
            if let Some(p) = &r.moved_aside {
                writeln!(out, "old ledger moved to {}", p.display())?;
            }
            if r.spool_kept {
                writeln!(
                    out,
                    "DEL spool kept in {}: dipamd replays it at its next start",
                    state_dir.join("spool").display()
                )?;
            }
            writeln!(
                out,
                "recovered {} pod and {} agent attachment(s)",
                r.pods, r.agent
            )?;
            for s in &r.skipped {
                writeln!(out, "skipped: {s}")?;
            }
        }
        return Ok(());
    }
    let channel = dipam_proto::connect(&args.socket)
        .await
        .map_err(|e| CtlError::Unreachable {
            socket: args.socket.clone(),
            reason: root_cause(&e),
        })?;
    let mut admin = AdminClient::new(channel.clone());
    match args.command {
        Command::Recover { .. } | Command::Install { .. } | Command::Completions { .. } => {
            return Ok(());
        }
        Command::Agent(AgentCommand::Watch { no_reconnect }) => {
            return watch(&args.socket, channel, no_reconnect, args.json, out).await;
        }
        Command::Agent(cmd) => return agent(AgentClient::new(channel), cmd, args.json, out).await,
        Command::Explain { container_id } => {
            let r = admin
                .explain(ExplainRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    container_id: container_id.clone(),
                })
                .await
                .map_err(CtlError::Rpc)?
                .into_inner();
            let events: Vec<serde_json::Value> = r
                .events
                .iter()
                .filter_map(|e| serde_json::from_str(e).ok())
                .collect();
            if args.json {
                let v = json!({
                    "containerID": container_id,
                    "attachments": r.attachments.iter().map(|a| json!({
                        "network": a.network, "ifname": a.ifname, "owner": a.owner,
                        "state": a.state, "ips": a.ips, "delegate": a.delegate_type,
                        "containerID": a.container_id,
                        "delegateKey": (!a.delegate_container_id.is_empty()).then(|| json!({
                            "containerID": a.delegate_container_id, "ifname": a.delegate_ifname,
                        })),
                    })).collect::<Vec<_>>(),
                    "events": events,
                    "eventsDropped": r.events_dropped,
                });
                writeln!(out, "{v:#}")?;
                return Ok(());
            }
            writeln!(out, "container {container_id}")?;
            if r.attachments.is_empty() {
                writeln!(out, "  no attachment in the ledger now")?;
            }
            for a in &r.attachments {
                // A warm-pool ID finds the pod its address went to.
                let mut note = String::new();
                if a.container_id != container_id {
                    note.push_str(&format!(", container {}", a.container_id));
                }
                if !a.delegate_container_id.is_empty() {
                    note.push_str(&format!(
                        ", held by the delegate as {}/{} (warm pool)",
                        a.delegate_container_id, a.delegate_ifname
                    ));
                }
                writeln!(
                    out,
                    "  {}/{}: {} {} via {} ({}){note}",
                    a.network,
                    a.ifname,
                    a.state,
                    a.ips.join(","),
                    a.delegate_type,
                    a.owner,
                )?;
            }
            writeln!(out, "history ({} event(s), oldest first):", events.len())?;
            for e in &events {
                let at = e["atMs"].as_u64().unwrap_or_default();
                let ms = e["durationMs"].as_f64().unwrap_or_default();
                match e["kind"].as_str() {
                    Some("exec") => {
                        writeln!(
                            out,
                            "  {at} exec {} {} ({:.1} ms): {}{}",
                            e["argv"][0].as_str().unwrap_or_default(),
                            e["env"]["CNI_COMMAND"].as_str().unwrap_or_default(),
                            ms,
                            e["exit"]
                                .as_str()
                                .or(e["error"].as_str())
                                .unwrap_or_default(),
                            e["stderr"]
                                .as_str()
                                .filter(|s| !s.is_empty())
                                .map(|s| format!("; stderr: {s}"))
                                .unwrap_or_default()
                        )?;
                        writeln!(out, "      env: {}", e["env"])?;
                    }
                    _ => writeln!(
                        out,
                        "  {at} {} {}/{} request {} ({:.1} ms): {}{}",
                        e["op"].as_str().unwrap_or_default(),
                        e["network"].as_str().unwrap_or_default(),
                        e["ifname"].as_str().unwrap_or_default(),
                        e["requestId"].as_str().unwrap_or_default(),
                        ms,
                        e["outcome"].as_str().unwrap_or_default(),
                        e["msg"]
                            .as_str()
                            .map(|m| format!(" (code {}: {m})", e["code"]))
                            .unwrap_or_default()
                    )?,
                }
            }
            return Ok(());
        }
        Command::Doctor => {
            let reply = admin
                .doctor(DoctorRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                })
                .await
                .map_err(CtlError::Rpc)?
                .into_inner();
            let failed = reply.checks.iter().filter(|c| !c.ok).count();
            if args.json {
                let v: Vec<_> = reply
                    .checks
                    .iter()
                    .map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix}))
                    .collect();
                writeln!(out, "{:#}", serde_json::Value::Array(v))?;
            } else {
                for c in &reply.checks {
                    writeln!(
                        out,
                        "{} {}: {}",
                        if c.ok { "ok  " } else { "FAIL" },
                        c.name,
                        c.detail
                    )?;
                    if !c.ok && !c.fix.is_empty() {
                        writeln!(out, "       fix: {}", c.fix)?;
                    }
                }
                writeln!(out, "{} check(s), {failed} failed", reply.checks.len())?;
            }
            if failed > 0 {
                return Err(CtlError::Failed(format!("{failed} doctor check(s) failed")));
            }
            return Ok(());
        }
        Command::Gc {
            conflist,
            valid,
            use_ledger,
            dry_run,
            force,
        } => {
            let (config, mode) = match &conflist {
                Some(path) => {
                    let text = std::fs::read(path)
                        .map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
                    let base = crate::agent::conflist::parse(path, &text, None)
                        .map_err(|m| CtlError::Input(m.to_string()))?;
                    let bytes = serde_json::to_vec(&base.request)
                        .map_err(|e| CtlError::Input(e.to_string()))?;
                    (bytes, base.mode)
                }
                None => (Vec::new(), dipam_proto::v1::Mode::Unspecified),
            };
            let valid = match &valid {
                Some(path) => {
                    let text = std::fs::read(path)
                        .map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
                    let v: serde_json::Value = serde_json::from_slice(&text)
                        .map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
                    // Checked here, entry by entry, so that the operator sees which entry
                    // is wrong before anything reaches dipamd (which checks again).
                    let source = path.display().to_string();
                    crate::gc::parse_list(&v, &source)
                        .map_err(|e| CtlError::Input(format!("{}; {}", e.msg, e.details)))?
                        .into_iter()
                        .map(|(container_id, ifname)| GcAttachment {
                            container_id,
                            ifname,
                        })
                        .collect()
                }
                None => Vec::new(),
            };
            let reply = admin
                .gc(GcRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    config,
                    mode: mode as i32,
                    valid,
                    use_ledger,
                    dry_run,
                    force,
                })
                .await
                .map_err(CtlError::Rpc)?
                .into_inner();
            let fields = |i: &dipam_proto::v1::GcItem| {
                json!({
                    "kind": i.kind, "containerID": i.container_id, "ifname": i.ifname,
                    "ips": i.ips, "reason": i.reason, "outcome": i.outcome, "error": i.error,
                    "keep": i.keep,
                })
            };
            if args.json {
                let v = json!({
                    "network": reply.network,
                    "dryRun": dry_run,
                    "refused": reply.refused,
                    "items": reply.items.iter().map(fields).collect::<Vec<_>>(),
                    "kept": reply.kept.iter().map(fields).collect::<Vec<_>>(),
                });
                writeln!(out, "{v:#}")?;
            } else if reply.refused.is_empty() {
                // A dry run lists what stays too, so that an operator can see why a pod is not
                // freed (or that one the runtime still runs is missing from the list).
                let shown = if dry_run {
                    reply.items.iter().chain(reply.kept.iter()).collect()
                } else {
                    reply.items.iter().collect::<Vec<_>>()
                };
                let rows: Vec<[String; 6]> = shown
                    .iter()
                    .map(|i| {
                        [
                            i.kind.clone(),
                            short(&i.container_id),
                            i.ifname.clone(),
                            i.ips.join(","),
                            if i.error.is_empty() {
                                i.outcome.clone()
                            } else {
                                format!("{}: {}", i.outcome, i.error)
                            },
                            i.reason.clone(),
                        ]
                    })
                    .collect();
                table(
                    out,
                    ["KIND", "CONTAINER", "IFNAME", "IPS", "OUTCOME", "REASON"],
                    &rows,
                )?;
                writeln!(
                    out,
                    "{} {}, {} kept in network {}",
                    reply.items.len(),
                    if dry_run {
                        "would be freed"
                    } else {
                        "collected"
                    },
                    reply.kept.len(),
                    reply.network
                )?;
            }
            if !reply.refused.is_empty() {
                return Err(CtlError::Failed(format!(
                    "GC of {} refused: {}",
                    reply.network, reply.refused
                )));
            }
            return Ok(());
        }
        Command::Status { ready } => {
            let s = admin
                .get_status(StatusRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                })
                .await
                .map_err(CtlError::Rpc)?
                .into_inner();
            if args.json {
                let v = json!({
                    "ready": s.ready,
                    "notReady": s.not_ready,
                    "daemonVersion": s.daemon_version,
                    "protocol": {"daemon": s.protocol_version, "daemonMin": s.min_protocol_version, "client": dipam_proto::PROTOCOL_VERSION, "plugins": s.plugin_protocols},
                    "socket": s.socket,
                    "stateDir": s.state_dir,
                    "attachments": s.attachments,
                    "uptimeSeconds": s.uptime_seconds,
                    "conflist": s.conflist,
                    "conflictsDetected": s.conflicts_detected,
                    "divergence": {"missing": s.divergence_missing, "orphans": s.divergence_orphans},
                    "gc": {"freed": s.gc_freed, "refused": s.gc_refused},
                    "agentReestablished": s.agent_reestablished,
                    "warmPool": {
                        "size": s.warm_pool, "hits": s.pool_hits, "misses": s.pool_misses,
                        "bypassed": s.pool_bypassed,
                        "pools": s.pools.iter().map(|p| json!({
                            "network": p.network, "configDigest": p.config_digest,
                            "ready": p.ready, "target": p.target, "hits": p.hits,
                            "misses": p.misses, "refillFailures": p.refill_failures,
                            "lastError": p.last_error, "source": p.source,
                        })).collect::<Vec<_>>(),
                    },
                    "delegates": s.delegates.iter().map(|d| json!({"type": d.r#type, "path": d.path, "supportedVersions": d.supported_versions})).collect::<Vec<_>>(),
                    "teardown": {
                        "by": s.teardown, "deleted": s.teardown_deleted,
                        "failures": s.teardown_failures, "lastError": s.teardown_last_error,
                    },
                    "privilegeFailures": {
                        "count": s.privilege_failures, "lastError": s.privilege_last_error,
                    },
                    "spool": s.spool.as_ref().map(|p| json!({
                        "dir": p.dir, "pointer": p.pointer, "depth": p.depth,
                        "quarantined": p.quarantined, "untrusted": p.untrusted,
                        "unpublished": p.unpublished, "mismatched": p.mismatched,
                        "inherited": p.inherited,
                    })),
                });
                writeln!(out, "{v:#}")?;
            } else {
                writeln!(
                    out,
                    "ready:        {}",
                    if s.ready {
                        "yes".to_string()
                    } else {
                        format!("no ({})", s.not_ready.join("; "))
                    }
                )?;
                writeln!(
                    out,
                    "daemon:       dipamd {} (protocol v{}, serves v{}+; this client v{})",
                    s.daemon_version,
                    s.protocol_version,
                    s.min_protocol_version,
                    dipam_proto::PROTOCOL_VERSION
                )?;
                if !s.plugin_protocols.is_empty() {
                    writeln!(
                        out,
                        "plugins:      protocol {} seen since start",
                        s.plugin_protocols
                            .iter()
                            .map(|v| format!("v{v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )?;
                }
                writeln!(out, "socket:       {}", s.socket)?;
                writeln!(out, "state dir:    {}", s.state_dir)?;
                writeln!(out, "attachments:  {}", s.attachments)?;
                if let Some(p) = &s.spool {
                    writeln!(
                        out,
                        "spool:        {} ({} DEL(s) waiting, {} quarantined since start; \
                         published in {})",
                        p.dir, p.depth, p.quarantined, p.pointer
                    )?;
                    for problem in [&p.untrusted, &p.unpublished]
                        .into_iter()
                        .filter(|x| !x.is_empty())
                    {
                        writeln!(out, "  problem: {problem}")?;
                    }
                    for m in &p.mismatched {
                        writeln!(
                            out,
                            "  mismatch: network {m} names a spoolDir dipamd does not drain \
                             (the plugin ignores it)"
                        )?;
                    }
                    for i in &p.inherited {
                        writeln!(out, "  inherited: {i} (a previous dipamd's spool)")?;
                    }
                }
                if !s.conflist.is_empty() {
                    writeln!(out, "conflist:     {}", s.conflist)?;
                }
                writeln!(
                    out,
                    "conflicts:    {} refused, {} agent addresses re-established",
                    s.conflicts_detected, s.agent_reestablished
                )?;
                writeln!(
                    out,
                    "divergence:   {} recorded address(es) missing from the delegate's store, \
                     {} unrecorded reservation(s)",
                    s.divergence_missing, s.divergence_orphans
                )?;
                writeln!(
                    out,
                    "gc:           {} freed, {} refused",
                    s.gc_freed, s.gc_refused
                )?;
                if s.warm_pool > 0 || !s.pools.is_empty() {
                    writeln!(
                        out,
                        "warm pool:    {} per network; {} ADDs served from it, {} found it empty, \
                         {} bypassed it (own addresses)",
                        s.warm_pool, s.pool_hits, s.pool_misses, s.pool_bypassed
                    )?;
                    for p in &s.pools {
                        writeln!(
                            out,
                            "  {}: {}/{} ready (config {}, from {}){}",
                            p.network,
                            p.ready,
                            p.target,
                            p.config_digest.get(..12).unwrap_or(&p.config_digest),
                            if p.source.is_empty() {
                                "an older config: releasing"
                            } else {
                                p.source.as_str()
                            },
                            if p.refill_failures > 0 {
                                format!(
                                    "; refill failed {} time(s), retrying: {}",
                                    p.refill_failures, p.last_error
                                )
                            } else {
                                String::new()
                            }
                        )?;
                    }
                }
                writeln!(
                    out,
                    "veths:        deleted by {}; {} deleted, {} failed{}",
                    s.teardown,
                    s.teardown_deleted,
                    s.teardown_failures,
                    if s.teardown_last_error.is_empty() {
                        String::new()
                    } else {
                        format!(" (last: {})", s.teardown_last_error)
                    }
                )?;
                writeln!(
                    out,
                    "privileges:   {} operation(s) not permitted{}",
                    s.privilege_failures,
                    if s.privilege_last_error.is_empty() {
                        String::new()
                    } else {
                        format!(" (last: {})", s.privilege_last_error)
                    }
                )?;
                writeln!(out, "uptime:       {}s", s.uptime_seconds)?;
                for d in &s.delegates {
                    writeln!(
                        out,
                        "delegate:     {} at {} (CNI {})",
                        d.r#type,
                        d.path,
                        d.supported_versions.join(", ")
                    )?;
                }
            }
            if ready && !s.ready {
                return Err(CtlError::Failed(format!(
                    "dipamd is not ready: {}",
                    s.not_ready.join("; ")
                )));
            }
        }
        Command::Attachments { network, owner } => {
            let list = admin
                .list_attachments(ListAttachmentsRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    network: network.unwrap_or_default(),
                    owner: owner.unwrap_or_default(),
                })
                .await
                .map_err(CtlError::Rpc)?
                .into_inner();
            if args.json {
                let v: Vec<_> = list
                    .attachments
                    .iter()
                    .map(|a| {
                        json!({
                            "network": a.network, "containerID": a.container_id, "ifname": a.ifname,
                            "owner": a.owner, "state": a.state, "delegate": a.delegate_type,
                            "ips": a.ips, "netns": a.netns, "configDigest": a.config_digest,
                            "createdAt": a.created_at, "updatedAt": a.updated_at,
                            "creatorUid": a.creator_uid,
                            "delegateKey": (!a.delegate_container_id.is_empty()).then(|| json!({
                                "containerID": a.delegate_container_id, "ifname": a.delegate_ifname,
                            })),
                            "result": serde_json::from_str::<serde_json::Value>(&a.result_json).unwrap_or(serde_json::Value::Null),
                        })
                    })
                    .collect();
                writeln!(out, "{:#}", serde_json::Value::Array(v))?;
            } else {
                let rows: Vec<[String; 7]> = list
                    .attachments
                    .iter()
                    .map(|a| {
                        [
                            a.network.clone(),
                            short(&a.container_id),
                            a.ifname.clone(),
                            a.owner.clone(),
                            a.state.clone(),
                            if a.delegate_container_id.is_empty() {
                                a.delegate_type.clone()
                            } else {
                                format!(
                                    "{} as {}/{}",
                                    a.delegate_type, a.delegate_container_id, a.delegate_ifname
                                )
                            },
                            a.ips.join(","),
                        ]
                    })
                    .collect();
                table(
                    out,
                    [
                        "NETWORK",
                        "CONTAINER",
                        "IFNAME",
                        "OWNER",
                        "STATE",
                        "DELEGATE",
                        "IPS",
                    ],
                    &rows,
                )?;
                writeln!(out, "{} attachment(s)", rows.len())?;
            }
        }
    }
    Ok(())
}

async fn agent(
    mut client: AgentClient<tonic::transport::Channel>,
    cmd: AgentCommand,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let v = dipam_proto::PROTOCOL_VERSION;
    let reply = match cmd {
        AgentCommand::List => {
            client
                .list(AgentListRequest {
                    protocol_version: v,
                })
                .await
        }
        AgentCommand::Allocate { role } => {
            client
                .allocate(AgentRoleRequest {
                    protocol_version: v,
                    role,
                })
                .await
        }
        AgentCommand::Release { role } => {
            client
                .release(AgentRoleRequest {
                    protocol_version: v,
                    role,
                })
                .await
        }
        AgentCommand::Watch { .. } => return Ok(()),
    };
    let reply = reply.map_err(CtlError::Rpc)?.into_inner();
    print_agent(&reply, json, out)?;
    Ok(())
}

/// The longest pause between two attempts to reach dipamd again during a watch.
const WATCH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// `dipamctl agent watch`: prints every list the watch delivers. dipamd ends a watch with
/// UNAVAILABLE when it stops (gRPC's "try again"), and a restart is routine (every upgrade,
/// every `systemctl restart`), so the watch reconnects by default, announcing it on stderr,
/// and the new dipamd's first message is its full list; so it does when the connection
/// breaks (dipamd killed). Any other status from dipamd ends the watch.
async fn watch(
    socket: &std::path::Path,
    first: tonic::transport::Channel,
    no_reconnect: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let mut channel = Some(first);
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        let ch = match channel.take() {
            Some(ch) => ch,
            None => match dipam_proto::connect(socket).await {
                Ok(ch) => ch,
                Err(e) => {
                    if no_reconnect {
                        return Err(CtlError::Unreachable {
                            socket: socket.to_owned(),
                            reason: root_cause(&e),
                        });
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(WATCH_RETRY_MAX);
                    continue;
                }
            },
        };
        let ended = watch_once(AgentClient::new(ch), json, out).await?;
        pause = std::time::Duration::from_millis(100);
        // A status with a local cause never came from dipamd: the connection broke (dipamd
        // was killed, or crashed). Like UNAVAILABLE, that calls for a reconnect.
        let lost = std::error::Error::source(&ended).is_some();
        if !(ended.code() == tonic::Code::Unavailable || lost) || no_reconnect {
            return Err(if lost {
                CtlError::Failed(format!(
                    "the connection to dipamd was lost ({})",
                    ended.message()
                ))
            } else {
                CtlError::Rpc(ended)
            });
        }
        eprintln!(
            "dipamctl: the watch ended ({}); reconnecting to {}",
            if lost {
                format!("the connection to dipamd was lost: {}", ended.message())
            } else {
                ended.message().to_owned()
            },
            socket.display()
        );
    }
}

/// One watch stream, until it ends: the status it ended with (a stream that ends without
/// one counts as UNAVAILABLE: dipamd went away).
async fn watch_once(
    mut client: AgentClient<tonic::transport::Channel>,
    json: bool,
    out: &mut dyn Write,
) -> Result<tonic::Status, CtlError> {
    let mut stream = match client
        .watch(AgentListRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Ok(s),
    };
    loop {
        match stream.message().await {
            Ok(Some(item)) => {
                print_agent(&item, json, out)?;
                out.flush()?;
            }
            Ok(None) => return Ok(tonic::Status::unavailable("dipamd closed the watch")),
            Err(s) => return Ok(s),
        }
    }
}

fn print_agent(r: &AgentListReply, json: bool, out: &mut dyn Write) -> std::io::Result<()> {
    if json {
        let v = json!({
            "generation": r.generation,
            "waiting": r.waiting,
            "addresses": r.addresses.iter().map(|a| json!({
                "role": a.role, "family": a.family, "ip": a.ip, "gateway": a.gateway,
                "state": a.state, "network": a.network, "containerID": a.container_id,
                "ifname": a.ifname, "message": a.message,
            })).collect::<Vec<_>>(),
        });
        return writeln!(out, "{v}");
    }
    if !r.waiting.is_empty() {
        writeln!(out, "{}", r.waiting)?;
    }
    let rows: Vec<[String; 6]> = r
        .addresses
        .iter()
        .map(|a| {
            [
                a.role.clone(),
                a.family.clone(),
                if a.ip.is_empty() {
                    "-".into()
                } else {
                    a.ip.clone()
                },
                if a.gateway.is_empty() {
                    "-".into()
                } else {
                    a.gateway.clone()
                },
                a.state.clone(),
                a.message.clone(),
            ]
        })
        .collect();
    table(
        out,
        ["ROLE", "FAMILY", "IP", "GATEWAY", "STATE", "MESSAGE"],
        &rows,
    )
}

/// Container IDs are 64 hex characters from containerd; 16 identify one on a node. Other IDs
/// (dipam's agent slots, podman names) are shown whole.
fn short(id: &str) -> String {
    if id.len() > 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        format!("{}…", &id[..16])
    } else {
        id.to_owned()
    }
}

fn table<const N: usize>(
    out: &mut dyn Write,
    head: [&str; N],
    rows: &[[String; N]],
) -> std::io::Result<()> {
    let mut width = head.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    writeln!(out, "{}", line(head.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
