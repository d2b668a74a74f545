//! `Admin.GetStatus` (`dipamctl status`): dipamd's readiness, with the reasons it is not
//! ready, and its counters, pools, delegates and paths.

use dipam_proto::v1::{DelegateInfo, StatusReply};

use crate::{error::ShimError, node::Node};

pub async fn run(shim: &Node) -> Result<StatusReply, ShimError> {
    let mut not_ready = shim.agent.not_ready();
    // A ledger that cannot take commits (a full disk) fails every ADD and DEL: that is the
    // first thing status must say, and counting must not fail the whole report.
    if let Some(fault) = shim.ledger.store().fault() {
        not_ready.insert(0, fault);
    }
    let attachments = match shim.ledger(|l| l.count()).await {
        Ok(n) => n as u64,
        Err(e) => {
            not_ready.push(format!("cannot count the attachments: {e}"));
            0
        }
    };
    Ok(StatusReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        min_protocol_version: dipam_proto::MIN_PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        ready: not_ready.is_empty(),
        not_ready,
        conflicts_detected: shim
            .agent
            .conflicts
            .load(std::sync::atomic::Ordering::Relaxed),
        agent_reestablished: shim
            .agent
            .reestablished
            .load(std::sync::atomic::Ordering::Relaxed),
        divergence_missing: shim
            .gc_stats
            .missing
            .load(std::sync::atomic::Ordering::Relaxed),
        divergence_orphans: shim
            .gc_stats
            .orphans
            .load(std::sync::atomic::Ordering::Relaxed),
        gc_refused: shim
            .gc_stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        gc_freed: shim
            .gc_stats
            .freed
            .load(std::sync::atomic::Ordering::Relaxed),
        warm_pool: shim.pool.size() as u32,
        pool_hits: shim.pool.hits.load(std::sync::atomic::Ordering::Relaxed),
        pool_misses: shim.pool.misses.load(std::sync::atomic::Ordering::Relaxed),
        pool_bypassed: shim
            .pool
            .bypassed
            .load(std::sync::atomic::Ordering::Relaxed),
        pools: shim.pool.status(),
        teardown_deleted: shim.teardown.get().map_or(0, |t| {
            t.stats.deleted.load(std::sync::atomic::Ordering::Relaxed)
        }),
        teardown_failures: shim.teardown.get().map_or(0, |t| {
            t.stats.failures.load(std::sync::atomic::Ordering::Relaxed)
        }),
        teardown_last_error: shim
            .teardown
            .get()
            .map(|t| t.stats.last_error())
            .unwrap_or_default(),
        teardown: crate::teardown::who(shim.teardown.get()),
        privilege_failures: shim.denials.count(),
        privilege_last_error: shim.denials.last(),
        spool: Some(crate::spool::drain::status(shim)),
        plugin_protocols: {
            let bits = shim
                .plugin_protocols
                .load(std::sync::atomic::Ordering::Relaxed);
            (0..64).filter(|v| bits & (1 << v) != 0).collect()
        },
        conflist: shim
            .agent
            .config
            .as_ref()
            .map(|c| c.source.to_string())
            .unwrap_or_default(),
        state_dir: shim.identity.state_dir.display().to_string(),
        socket: shim.identity.socket.display().to_string(),
        attachments,
        uptime_seconds: shim.started.elapsed().as_secs(),
        delegates: shim
            .exec
            .probed()
            .into_iter()
            .map(|p| DelegateInfo {
                r#type: p
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: p.path.display().to_string(),
                supported_versions: p.supported.iter().map(ToString::to_string).collect(),
            })
            .collect(),
    })
}
