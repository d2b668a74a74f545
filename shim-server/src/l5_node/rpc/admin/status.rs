//! `Admin.GetStatus` (`dipamctl status`): dipamd's readiness, with the reasons it is not
//! ready, and its counters, pools, delegates and paths.

use std::sync::atomic::Ordering::Relaxed;

use dipam_proto::v1::{DelegateInfo, RangeStatus, StatusReply};

use crate::{l1_leaves::error::ShimError, l1_leaves::events::RangeCount, l5_node::node::Node};

fn range_status(c: RangeCount) -> RangeStatus {
    RangeStatus {
        network: c.network,
        family: c.family.to_owned(),
        size: c.size,
        pods: c.pods,
        agent: c.agent,
        pool: c.pool,
        orphans: c.orphans,
        free: c.free,
        ranges: c.ranges,
        unknown: c.unknown,
    }
}

/// The status as dipamd sees it now: readiness first, then every counter.
pub async fn run(node: &Node) -> Result<StatusReply, ShimError> {
    let mut not_ready = node.agent.not_ready();
    not_ready.extend(node.startup.get().into_iter().flatten().cloned());
    // A ledger that cannot take commits (a full disk) fails every ADD and DEL: that is the
    // first thing status must say, and counting must not fail the whole report.
    if let Some(fault) = node.core.ledger.store().fault() {
        not_ready.insert(0, fault);
    }
    let attachments = match node.core.ledger(|l| l.count()).await {
        Ok(n) => n as u64,
        Err(e) => {
            not_ready.push(format!("cannot count the attachments: {e}"));
            0
        }
    };
    // Looked at now, not at the last reconcile: what the operator asks about is the node as it
    // is. A network whose store cannot be read is left out, and the log says why.
    let ranges = match crate::l3_clients::divergence::ranges(&node.watch()).await {
        Ok(r) => r.into_iter().map(range_status).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot count the ranges for status");
            Vec::new()
        }
    };
    Ok(StatusReply {
        ranges,
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        min_protocol_version: dipam_proto::MIN_PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        ready: not_ready.is_empty(),
        not_ready,
        conflicts_detected: node.agent.conflicts.load(Relaxed),
        agent_reestablished: node.agent.reestablished.load(Relaxed),
        divergence_missing: node.gc.stats.missing.load(Relaxed),
        divergence_orphans: node.gc.stats.orphans.load(Relaxed),
        divergence_unrecorded_alive: node.gc.stats.unrecorded_alive.load(Relaxed),
        gc_refused: node.gc.stats.refused.load(Relaxed),
        gc_freed: node.gc.stats.freed.load(Relaxed),
        warm_pool: node.pool.marks().target as u32,
        pool_minimum: node.pool.marks().minimum as u32,
        pool_max_above: node.pool.marks().max_above as u32,
        pool_release_after_ms: node.pool.marks().release_after.as_millis() as u64,
        pool_hits: node.pool.hits.load(Relaxed),
        pool_misses: node.pool.misses.load(Relaxed),
        pool_bypassed: node.pool.bypassed.load(Relaxed),
        pools: node.pool.status(),
        teardown_deleted: node
            .teardown
            .get()
            .map_or(0, |t| t.stats.deleted.load(Relaxed)),
        teardown_failures: node
            .teardown
            .get()
            .map_or(0, |t| t.stats.failures.load(Relaxed)),
        teardown_last_error: node
            .teardown
            .get()
            .map(|t| t.stats.last_error())
            .unwrap_or_default(),
        teardown: crate::l3_clients::teardown::who(node.teardown.get()),
        privilege_failures: node.denials.count(),
        privilege_last_error: node.denials.last(),
        spool: Some(crate::l3_clients::spool::status(
            &node.spool,
            &node.core.identity,
        )),
        runtime_gc: node.gc.runtime.get().map(|r| r.status()),
        plugin_protocols: {
            let bits = node.core.plugin_protocols.load(Relaxed);
            (0..64).filter(|v| bits & (1 << v) != 0).collect()
        },
        conflist: node
            .agent
            .config
            .as_ref()
            .map(|c| c.source.to_string())
            .unwrap_or_default(),
        state_dir: node.core.identity.state_dir.display().to_string(),
        socket: node.core.identity.socket.display().to_string(),
        attachments,
        uptime_seconds: node.started.elapsed().as_secs(),
        delegates: node
            .core
            .exec
            .probed()
            .into_iter()
            .map(delegate_info)
            .collect(),
    })
}

/// A delegate dipamd has probed: its type (the binary's name), path and CNI versions.
fn delegate_info(p: crate::l2_core::delegate::Probe) -> DelegateInfo {
    DelegateInfo {
        r#type: p
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: p.path.display().to_string(),
        supported_versions: p.supported.iter().map(ToString::to_string).collect(),
    }
}
