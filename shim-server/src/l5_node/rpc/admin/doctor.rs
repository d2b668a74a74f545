//! `Admin.Doctor` (`dipamctl doctor`): every check of dipamd's configuration and state, each
//! with what was found and what to do. The misconfigurations the delegated-IPAM CFP warns
//! about come first.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use dipam_proto::v1::{DoctorCheck, DoctorReply};

use crate::{
    l1_leaves::error::ShimError,
    l2_core::delegate::{config::DelegateConf, store},
    l3_clients::divergence::{self, on_tmpfs},
    l3_clients::spool,
    l5_node::node::Node,
};

fn check(name: impl Into<String>, ok: bool, detail: impl Into<String>, fix: &str) -> DoctorCheck {
    DoctorCheck::new(name, ok, detail, fix)
}

/// The DEL spool: published where the plugin finds it, meeting the trust rule, drained, and
/// agreeing with every config that names a spoolDir.
fn spool_checks(node: &Node, checks: &mut Vec<DoctorCheck>) {
    let id = &node.core.identity;
    let st = spool::status(&node.spool, &node.core.identity);
    let published = dipam_proto::spool::read_pointer(&id.socket);
    let names_ours = published.as_ref().is_ok_and(|p| {
        std::fs::metadata(&id.spool_dir).is_ok_and(|m| m.dev() == p.dev && m.ino() == p.ino)
    });
    checks.push(check(
        "DEL spool published",
        names_ours,
        match &published {
            Ok(p) => format!("{} names {}", st.pointer, p.dir.display()),
            Err(_) if !st.unpublished.is_empty() => st.unpublished.clone(),
            Err(e) => e.to_string(),
        },
        "the plugin finds the spool through this file beside the socket, and fails a DEL with \
         code 11 while it is missing or wrong; restart dipamd, and check that nothing else \
         writes beside the socket",
    ));
    checks.push(check(
        "DEL spool meets the spool rule",
        st.untrusted.is_empty(),
        if st.untrusted.is_empty() {
            format!(
                "{} and every directory above it are root's and not writable by others",
                st.dir
            )
        } else {
            format!("{}; nothing in it is replayed", st.untrusted)
        },
        "chown root:root the directory and chmod 0700 it (no symbolic links on the way), then \
         review the files in it: dipamd replays only regular files owned by root, mode 0600",
    ));
    // Spooled DELs carry pods' container IDs, netns paths and configs: dipamd creates the
    // spool 0700, and a looser mode means someone changed it.
    let mode = std::fs::metadata(&id.spool_dir).map_or(0, |m| m.permissions().mode() & 0o777);
    checks.push(check(
        "DEL spool is private",
        mode & 0o077 == 0,
        format!("{} mode {mode:04o}", st.dir),
        "chmod 0700 the spool: only root needs it",
    ));
    checks.push(check(
        "DEL spool drained",
        st.depth == 0,
        format!("{} spooled DEL(s) in {}", st.depth, st.dir),
        "they are replayed every few seconds; if they stay, see dipamd's log",
    ));
    let (in_quarantine, problem) = spool::quarantine_state(&id.spool_dir);
    checks.push(check(
        "DEL spool quarantine",
        in_quarantine == 0 && problem.is_none(),
        match &problem {
            Some(p) => format!("{p} (moved aside unread at the next quarantine)"),
            None => format!(
                "{in_quarantine} file(s) in {}/{}",
                st.dir,
                dipam_proto::spool::QUARANTINE
            ),
        },
        "these spooled DELs were not replayed (dipamd's log says why for each: not a DEL, \
         unreadable, a link, not owned by root, writable by others); release their addresses \
         with a DEL if the pods are gone, then remove the files",
    ));
    checks.push(check(
        "network configs name no other spool",
        st.mismatched.is_empty(),
        if st.mismatched.is_empty() {
            "no config names a spoolDir other than dipamd's".to_owned()
        } else {
            format!(
                "spoolDir is not dipamd's spool in: {} (the plugin ignores it and spools to {})",
                st.mismatched.join(", "),
                st.dir
            )
        },
        "remove spoolDir from these configs: the plugin finds dipamd's spool beside the socket",
    ));
}

/// Every check, in the order the report shows them: the ledger and the socket, each
/// network's delegate and store, the agent, the runtime-aware GC, teardown, privileges, agent
/// records left without management, and the DEL spool. `skip_stores`: without the checks
/// that compare each store with the ledger (`dipamctl status`'s count: they read every
/// reservation and every record of the network).
pub async fn run(node: &Node, skip_stores: bool) -> Result<DoctorReply, ShimError> {
    let mut checks = Vec::new();
    let state_tmpfs = ledger_checks(node, &mut checks);
    for (dc, creator) in scopes(node, &mut checks).await {
        network_checks(node, &dc, creator, state_tmpfs, skip_stores, &mut checks).await;
    }
    agent_checks(node, &mut checks);
    runtime_gc_check(node, &mut checks);
    checks.push(teardown_check(node.teardown.get()));
    checks.push(privilege_check(node));
    checks.push(crossed_del_check(node));
    unmanaged_agent_check(node, &mut checks);
    spool_checks(node, &mut checks);
    metrics_checks(node, &mut checks);
    Ok(DoctorReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        checks,
    })
}

/// Each configured metrics listener bound (daemon/metrics_bind.rs: dipamd serves pods
/// without it, and retries its bind).
fn metrics_checks(node: &Node, checks: &mut Vec<DoctorCheck>) {
    for l in node.metrics_listeners.snapshot() {
        checks.push(check(
            format!("metrics listener bound ({})", l.kind),
            l.bound,
            if l.bound {
                format!("serving metrics on {}", l.address)
            } else {
                format!(
                    "{}: {} ({} binds tried; retried every {} s)",
                    l.address,
                    l.error,
                    l.attempts,
                    crate::l4_observers::metrics_listen::RETRY.as_secs()
                )
            },
            "something else holds the address: find it (ss -ltnp, or ss -lxp for a socket) and \
             stop it, or move --metrics-address / --metrics-socket; dipamd serves pods \
             meanwhile and binds as soon as the address is free",
        ));
    }
}

/// The ledger (persistent, taking commits), the socket and the state directory (private).
/// Returns whether the ledger is on tmpfs: a delegate store on tmpfs is then no worse.
fn ledger_checks(node: &Node, checks: &mut Vec<DoctorCheck>) -> bool {
    let id = &node.core.identity;
    let state_tmpfs = on_tmpfs(&id.state_dir);
    checks.push(check(
        "ledger is persistent",
        !state_tmpfs,
        format!(
            "{} is {}",
            id.state_dir.display(),
            if state_tmpfs {
                "on tmpfs"
            } else {
                "not on tmpfs"
            }
        ),
        "run dipamd with --state-dir on persistent storage (hostPath /var/lib/dipam)",
    ));

    let fault = node.core.ledger.store().fault();
    checks.push(check(
        "ledger takes commits",
        fault.is_none(),
        fault.unwrap_or_else(|| format!("{}: commits succeed", id.state_dir.display())),
        "free space on the file system holding --state-dir (`df -h` it); dipamd retries by \
         itself and serves again without a restart",
    ));

    let (mode, gid) = std::fs::metadata(&id.socket)
        .map(|m| (m.permissions().mode() & 0o777, m.gid()))
        .unwrap_or((0, 0));
    checks.push(check(
        "socket is private",
        mode == 0o600 || mode == 0o660,
        format!("{} mode {mode:o} group {gid}", id.socket.display()),
        "only root (or --socket-group) may reach the socket; check who changed its mode",
    ));

    // The ledger, journal and history name every pod's container ID, netns and addresses.
    checks.push(crate::l1_leaves::perms::private_check(
        &id.state_dir,
        &id.spool_dir,
    ));
    state_tmpfs
}

/// The scopes to check (gc::scopes: network, creator, delegate store), each with its own
/// config: a non-root caller's records under root's network name are checked as its own,
/// never as root's network (docs/cfp.md §8.3). A ledger that cannot be read fails a check
/// here and leaves none.
async fn scopes(node: &Node, checks: &mut Vec<DoctorCheck>) -> Vec<(DelegateConf, Option<u32>)> {
    // A ledger that cannot be read (its disk is full and the store is being reopened) fails
    // these checks, not the whole report: doctor is what the operator runs then.
    match crate::l3_clients::gc::scopes(&node.core, &node.agent).await {
        Ok(n) => n,
        Err(e) => {
            checks.push(check(
                "ledger is readable",
                false,
                e.to_string(),
                "see the \"ledger takes commits\" check and dipamd's log",
            ));
            Vec::new()
        }
    }
}

/// How a scope's checks are named: `network NAME` for root's, `network NAME (uid N)` for a
/// non-root caller's.
fn scope_name(dc: &DelegateConf, creator: Option<u32>) -> String {
    match creator {
        None => dc.network.clone(),
        Some(uid) => format!("{} (uid {uid})", dc.network),
    }
}

/// One scope: its delegate answers VERSION, its store is persistent and agrees with the
/// scope's records (divergence/).
async fn network_checks(
    node: &Node,
    dc: &DelegateConf,
    creator: Option<u32>,
    state_tmpfs: bool,
    skip_stores: bool,
    checks: &mut Vec<DoctorCheck>,
) {
    let net = &scope_name(dc, creator);
    match node.core.exec.probe(&dc.kind, "").await {
        Ok(p) => checks.push(check(
            format!("network {net}: delegate {}", dc.kind),
            !p.supported.is_empty(),
            format!(
                "{} supports CNI {}",
                p.path.display(),
                p.supported
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "the delegate binary did not answer VERSION; run it by hand with CNI_COMMAND=VERSION",
        )),
        Err(e) => checks.push(check(
            format!("network {net}: delegate {}", dc.kind),
            false,
            e.to_string(),
            "install the delegate plugin or add its directory to dipamd --cni-path",
        )),
    }
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &dc.network) else {
        checks.push(check(
            format!("network {net}: delegate store"),
            true,
            format!("{}'s store is not readable by dipamd; not checked", dc.kind),
            "",
        ));
        return;
    };
    let tmpfs = on_tmpfs(&dir);
    checks.push(check(
        format!("network {net}: delegate store is persistent"),
        !tmpfs || state_tmpfs,
        format!(
            "{} is {}",
            dir.display(),
            if tmpfs { "on tmpfs" } else { "not on tmpfs" }
        ),
        "put the delegate's dataDir on persistent storage, as dipamd's ledger is",
    ));
    if skip_stores {
        return;
    }
    let divergence = match divergence::check(&node.watch(), dc, creator).await {
        Ok(d) => d,
        Err(e) => {
            checks.push(check(
                format!("network {net}: delegate store agrees with the ledger"),
                false,
                e.to_string(),
                "see the \"ledger takes commits\" check and dipamd's log",
            ));
            None
        }
    };
    if let Some(d) = divergence {
        divergence_checks(dc, net, &dir, d, checks);
    }
}

/// What the store and the ledger disagree on: recorded addresses the store lacks, orphans,
/// running pods the ledger lacks, and a network refused for pod ADDs.
fn divergence_checks(
    dc: &DelegateConf,
    net: &str,
    dir: &std::path::Path,
    d: divergence::Divergence,
    checks: &mut Vec<DoctorCheck>,
) {
    checks.push(check(
        format!("network {net}: delegate store agrees with the ledger"),
        d.missing.is_empty(),
        if d.missing.is_empty() {
            format!("{}: every recorded address is held", dir.display())
        } else {
            format!(
                "{}: {} recorded address(es) missing: {}",
                dir.display(),
                d.missing.len(),
                d.missing.join(", ")
            )
        },
        "dipamd and the runtime must see the same persistent directory: mount the \
         host's /var/lib/cni/networks into dipamd at the same path",
    ));
    // Unrecorded reservations are told apart first (liveness.rs): only those nothing
    // on the node uses are offered for freeing; a running pod's is adopted.
    checks.push(check(
        format!("network {net}: no orphaned reservations"),
        d.orphans.is_empty(),
        if d.orphans.is_empty() {
            "no reservation is both unknown to the ledger and unused on the node".into()
        } else {
            format!(
                "{} orphan(s), held by {} but unknown to dipamd, and no network \
                 namespace, host route or runtime sandbox uses them: {}",
                d.orphans.len(),
                dc.kind,
                d.orphans.join(", ")
            )
        },
        "`dipamctl gc --use-ledger --dry-run` lists them; without --dry-run it frees \
         them (it checks each again, and keeps any a pod uses by then)",
    ));
    let adoptable = d.alive.len() + d.unverified.len();
    checks.push(check(
        format!("network {net}: running pods are recorded"),
        d.alive.is_empty(),
        if adoptable == 0 {
            "every reservation a running pod uses is in the ledger".into()
        } else {
            format!(
                "{adoptable} reservation(s) unknown to dipamd that are in use (or \
                 cannot be shown unused), kept and never freed: {}",
                d.alive
                    .iter()
                    .chain(&d.unverified)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        },
        "these are pods that ran before dipam was put in front of the IPAM: `dipamctl \
         adopt` records them now (dipamd also does at every reconcile); never free them",
    ));
    if let Some(why) = d.misconfigured {
        checks.push(check(
            format!("network {net}: serving ADD"),
            false,
            why,
            "fix the mount, then restart dipamd (or wait for the next reconcile)",
        ));
    }
}

/// The agent's conflist is found and each of its addresses is ready.
fn agent_checks(node: &Node, checks: &mut Vec<DoctorCheck>) {
    if let Some(cfg) = &node.agent.config {
        let snap = node.agent.snapshot();
        checks.push(check(
            "agent conflist",
            snap.waiting.is_empty(),
            if snap.waiting.is_empty() {
                format!("{} found", cfg.source)
            } else {
                snap.waiting.clone()
            },
            &crate::l5_node::hints::agent_conflist_fix(&snap.waiting, &cfg.source),
        ));
        for a in &snap.addresses {
            checks.push(check(
                format!("agent {} {} address", a.role, a.family),
                a.state == "ready",
                format!("{} {} {}", a.state, a.ip, a.message),
                "see dipamd's log for this role",
            ));
        }
    }
}

/// The runtime-aware GC, where it runs, trusts the runtime's list.
fn runtime_gc_check(node: &Node, checks: &mut Vec<DoctorCheck>) {
    if let Some(rt) = node.gc.runtime.get() {
        let s = rt.status();
        checks.push(check(
            "runtime-aware GC trusts the runtime's list",
            s.refusing.is_empty(),
            if !s.refusing.is_empty() {
                format!("refusing ({}): {}", s.refusing, s.refusing_detail)
            } else if s.passes == 0 {
                format!("{}: no pass yet", s.endpoint)
            } else {
                format!(
                    "{}: {} sandbox(es) at the last pass; {} freed, {} refused since start",
                    s.endpoint, s.sandboxes, s.freed, s.refusals
                )
            },
            match s.refusing.as_str() {
                "unreachable" => {
                    "check that the runtime runs and that --cri-endpoint names its CRI socket \
                     (containerd: unix:///run/containerd/containerd.sock; in a DaemonSet, mount \
                     it into dipamd); nothing is freed meanwhile"
                }
                "empty" => {
                    "--cri-endpoint must be the runtime that made the pods' attachments; if it \
                     is and it truly runs no pod, `dipamctl gc --from-runtime --dry-run` shows \
                     what it would free"
                }
                "share" => {
                    "`dipamctl gc --from-runtime --dry-run` lists what it would free; if that \
                     is right, `dipamctl gc --from-runtime --force` frees it"
                }
                _ => "see dipamd's log (runtime-aware GC) and the runtime's own log",
            },
        ));
    }
}

/// No runtime DELed a container through one network while dipamd holds it on another only
/// (crossed.rs): the mark of a conflist swapped under running pods.
fn crossed_del_check(node: &Node) -> DoctorCheck {
    let (seen, last) = node.crossed.seen();
    check(
        "no DEL named a network other than the one holding its container",
        seen == 0,
        match last {
            None => "none since start".to_owned(),
            Some(s) => format!(
                "{seen} since start; the last: container {} DELed on network {:?}, held on {}",
                s.container_id,
                s.del_network,
                s.held_on.join(", ")
            ),
        },
        "the conflist was most likely swapped (renamed network, or another file sorting \
         first) while pods ran: their DELs went to the new network and released nothing on \
         the old one. If those pods are gone, the runtime-aware GC (--cri-endpoint) frees \
         their addresses; `dipamctl explain <container>` shows each one's attachments",
    )
}

/// No operation dipamd tried lacked a privilege (a capability the unit or the DaemonSet
/// withholds).
fn privilege_check(node: &Node) -> DoctorCheck {
    let denied = node.denials.count();
    check(
        "no operation lacked a privilege",
        denied == 0,
        if denied == 0 {
            "every operation dipamd tried was permitted".to_owned()
        } else {
            format!(
                "{denied} operation(s) not permitted since start; last: {}",
                node.denials.last()
            )
        },
        "dipamd lacks a capability it needs: give it the set deploy/systemd/dipamd.service \
         (CapabilityBoundingSet) or deploy/kubernetes/dipam.yaml (capabilities) ships, and \
         check SELinux/AppArmor denials; then restart dipamd",
    )
}

/// Agent records kept while agent management is off.
fn unmanaged_agent_check(node: &Node, checks: &mut Vec<DoctorCheck>) {
    if node.agent.config.is_none() {
        // Agent records left from when agent management was on (agent/reconcile/mod.rs
        // keep_unmanaged): held, never a pod's, and released only by turning it back on.
        let kept: Vec<String> = node
            .agent
            .snapshot()
            .addresses
            .iter()
            .filter(|a| a.state == "kept")
            .map(|a| format!("{} {} {} ({})", a.role, a.family, a.ip, a.network))
            .collect();
        if !kept.is_empty() {
            checks.push(check(
                "agent records without agent management",
                false,
                format!("{} kept: {}", kept.len(), kept.join(", ")),
                "start dipamd with --conflist for their network and --agent-roles listing the \
                 roles to keep: the others are released; `dipamctl agent list` says why each is \
                 kept",
            ));
        }
    }
}

/// Retired pod veths (main mode): dipamd deletes them, or has handed that back to the plugins.
fn teardown_check(t: Option<&crate::l3_clients::teardown::Teardown>) -> DoctorCheck {
    use std::sync::atomic::Ordering;
    let by = crate::l3_clients::teardown::who(t);
    let Some(t) = t else {
        return check("retired veths are deleted", true, by, "");
    };
    let failing = t.stats.failing.load(Ordering::Relaxed);
    let failures = t.stats.failures.load(Ordering::Relaxed);
    check(
        "retired veths are deleted",
        !failing,
        format!(
            "deleted by {by}: {} deleted, {failures} failed since start{}",
            t.stats.deleted.load(Ordering::Relaxed),
            if failures == 0 {
                String::new()
            } else {
                format!("; last: {}", t.stats.last_error())
            }
        ),
        "pod veths dipamd could not delete stay on the host until their pod's netns goes; see \
         dipamd's log (teardown), and `ip -d link show` for links whose alias starts with \
         \"dipam-gone\"",
    )
}
