//! `Admin.GetStatus` (`dipamctl status`): dipamd's readiness, with the reasons it is not
//! ready, and its counters, pools, delegates and paths.

use std::sync::atomic::Ordering::Relaxed;

use dipam_proto::v1::{DelegateInfo, RangeStatus, StatusReply};

use crate::{l1_leaves::error::ShimError, l1_leaves::events::RangeCount, l5_node::node::Node};

fn range_status(c: RangeCount, counted: &str) -> RangeStatus {
    RangeStatus {
        counted: counted.to_owned(),
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

/// What keeps dipamd from being ready, the ledger's fault first.
fn not_ready(node: &Node) -> Vec<String> {
    let mut not_ready = node.agent.not_ready();
    not_ready.extend(node.startup.get().into_iter().flatten().cloned());
    // A ledger that cannot take commits (a full disk) fails every ADD and DEL: that is the
    // first thing status must say, and counting must not fail the whole report.
    if let Some(fault) = node.core.ledger.store().fault() {
        not_ready.insert(0, fault);
    }
    not_ready
}

/// The status as dipamd sees it now: readiness first, then every counter. `stores`: count the
/// ranges from the delegates' stores, read now (every reservation file), instead of the
/// ledger's census.
pub async fn run(node: &Node, stores: bool) -> Result<StatusReply, ShimError> {
    let mut not_ready = not_ready(node);
    let attachments = match node.core.ledger(|l| l.count()).await {
        Ok(n) => n as u64,
        Err(e) => {
            not_ready.push(format!("cannot count the attachments: {e}"));
            0
        }
    };
    // Counted now, never from the last reconcile: what the operator asks about is the node as
    // it is. By default from the ledger's census (kept at every commit: a status call costs the
    // same at 10 attachments as at 10,000); with `stores`, from the delegates' stores, which
    // also finds the orphans, at the price of reading every reservation (1.3 s at 2,500
    // attachments, docs/performance.md). A network whose store cannot be read is left out,
    // and the log says why.
    let counted = if stores {
        crate::l3_clients::divergence::ranges(&node.watch())
            .await
            .map(|r| (r, "store"))
    } else {
        ledger_ranges(node).await.map(|r| (r, "ledger"))
    };
    let ranges = match counted {
        Ok((r, how)) => r.into_iter().map(|c| range_status(c, how)).collect(),
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

/// Every root network's ranges counted from the ledger's census: per group of records (same
/// network, creator and delegate config), the addresses recorded for pods, the agent and the
/// pool; the size and the ranges from one member's config. Reads one record per group, never
/// the network's records nor the delegate's store. The store's orphans are not known here
/// (`orphans` is None) and `free` is the size less what the ledger records: the delegate
/// hands out no address outside its ranges, so it is `--stores`'s free plus the orphans.
async fn ledger_ranges(node: &Node) -> Result<Vec<RangeCount>, ShimError> {
    use std::collections::BTreeMap;

    use crate::l2_core::delegate::{config::DelegateConf, ranges::Family, store::readable_dir};

    let confs: Vec<(DelegateConf, [dipam_state::Held; 2], bool)> = node
        .core
        .ledger(|l| l.groups())
        .await?
        .into_iter()
        .filter_map(|(key, held, rec)| {
            Some((
                crate::l3_clients::gc::recorded_conf(&rec)?,
                held,
                key.creator_uid.is_none(),
            ))
        })
        .collect();
    let agent_conf = node.agent.delegate_conf();
    // One row set per root network and store: (network, store dir or the delegate's type).
    let scope = |dc: &DelegateConf| {
        let dir = readable_dir(&dc.kind, &dc.conf, &dc.network);
        (
            dc.network.clone(),
            dir.is_some(),
            dir.map_or(dc.kind.clone(), |d| d.display().to_string()),
        )
    };
    let mut rows: BTreeMap<(String, bool, String), (DelegateConf, [dipam_state::Held; 2])> =
        BTreeMap::new();
    for dc in agent_conf.into_iter() {
        rows.entry(scope(&dc)).or_insert((dc, Default::default()));
    }
    for (dc, _, root) in &confs {
        if *root {
            rows.entry(scope(dc))
                .or_insert((dc.clone(), Default::default()));
        }
    }
    // A readable store counts every record in it, whoever created it (as the store's
    // reservations are counted); otherwise root's records alone.
    for (dc, held, root) in confs {
        let key = scope(&dc);
        if let Some((_, sum)) = rows.get_mut(&key)
            && (key.1 || root)
        {
            for (s, h) in sum.iter_mut().zip(held) {
                s.pods += h.pods;
                s.agent += h.agent;
                s.pool += h.pool;
            }
        }
    }
    let mut out = Vec::new();
    for ((_, readable, _), (dc, held)) in rows {
        let ranges =
            readable.then(|| crate::l2_core::delegate::ranges::host_local(&dc.conf["ipam"]));
        for (f, h) in [Family::V4, Family::V6].into_iter().zip(held) {
            let covered = matches!(&ranges, Some(Ok(r)) if r.families().contains(&f));
            if !covered && h == dipam_state::Held::default() {
                continue;
            }
            let mut row = RangeCount {
                network: dc.network.clone(),
                family: f.as_str(),
                pods: h.pods,
                agent: h.agent,
                pool: h.pool,
                ..RangeCount::default()
            };
            match &ranges {
                Some(Ok(r)) => {
                    let size = u64::try_from(r.size(f)).unwrap_or(u64::MAX);
                    row.size = Some(size);
                    row.free = Some(size.saturating_sub(h.pods + h.agent + h.pool));
                    row.ranges = r.describe(f);
                }
                Some(Err(why)) => row.unknown = why.to_string(),
                None => {
                    row.unknown = format!(
                        "{} keeps its ranges and reservations to itself: dipamd counts only \
                         the addresses its ledger records",
                        dc.kind
                    );
                }
            }
            out.push(row);
        }
    }
    Ok(out)
}
