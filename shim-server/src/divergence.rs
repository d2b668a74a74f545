//! The periodic reconcile between the ledger and the delegate's own store. containerd does not
//! call CNI GC yet, so without this nothing would notice a reservation leaked outside dipamd,
//! or a delegate store that was wiped or is not the one the runtime sees (F7, F22).
//!
//! It reports, and frees nothing unless dipamd runs with --reconcile-free (then it collects
//! the orphans, in ledger-as-valid mode, exactly as `dipamctl gc --use-ledger` would).

use std::{collections::HashSet, sync::Arc, sync::atomic::Ordering, time::Duration};

use dipam_state::{AttachmentState, Store};
use rscni_types::version::SpecVersion;
use tracing::{info, warn};

use crate::{
    delegate::{
        config::{DelegateConf, result_addrs},
        store,
    },
    error::ShimError,
    gc::{self, Valid},
    shim::Shim,
};

/// One network's divergence.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// Committed records whose address the delegate's store does not hold.
    pub missing: Vec<String>,
    /// Reservations the ledger does not know.
    pub orphans: Vec<String>,
}

/// The delegate configs of every network dipamd knows: the agent's conflist, and one recorded
/// config per network in the ledger.
async fn networks<S: Store>(shim: &Shim<S>) -> Result<Vec<DelegateConf>, ShimError> {
    let mut out: Vec<DelegateConf> = Vec::new();
    if let Some(cfg) = &shim.agent.config
        && let Ok(base) = cfg.source.load()
        && let Ok(bytes) = serde_json::to_vec(&base.request)
        && let Ok(dc) = DelegateConf::from_request(&bytes, base.mode)
    {
        out.push(dc);
    }
    for rec in shim.ledger(|l| l.list(None)).await? {
        if out.iter().any(|d| d.network == rec.key.network) {
            continue;
        }
        if let Ok(conf) = serde_json::from_str(&rec.delegate_config) {
            out.push(DelegateConf {
                kind: rec.delegate_type.clone(),
                network: rec.key.network.clone(),
                version: rec.delegate_version.parse().unwrap_or(SpecVersion::CURRENT),
                conf,
            });
        }
    }
    Ok(out)
}

/// Compares one network's ledger with its delegate's store (host-local only: the one whose
/// store dipamd can read).
pub async fn check<S: Store>(
    shim: &Shim<S>,
    dc: &DelegateConf,
) -> Result<Option<Divergence>, ShimError> {
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &dc.network) else {
        return Ok(None);
    };
    let net = dc.network.clone();
    let records = shim.ledger(move |l| l.list(Some(&net))).await?;
    let held = store::reservations(&dir)
        .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
    let held_pairs: HashSet<(String, std::net::IpAddr)> = held
        .iter()
        .map(|r| (r.container_id.clone(), r.ip))
        .collect();
    let known: HashSet<(String, String)> = records
        .iter()
        .map(|r| (r.key.container_id.clone(), r.key.ifname.clone()))
        .collect();
    let known_ids: HashSet<&str> = known.iter().map(|(c, _)| c.as_str()).collect();
    let mut d = Divergence::default();
    for r in records
        .iter()
        .filter(|r| r.state == AttachmentState::Committed)
    {
        for ip in r.result.as_ref().map(result_addrs).unwrap_or_default() {
            if !held_pairs.contains(&(r.key.container_id.clone(), ip)) {
                d.missing.push(format!("{ip} ({})", r.key));
            }
        }
    }
    for r in &held {
        let ours = if r.ifname.is_empty() {
            known_ids.contains(r.container_id.as_str())
        } else {
            known.contains(&(r.container_id.clone(), r.ifname.clone()))
        };
        if !ours {
            d.orphans
                .push(format!("{} ({} {})", r.ip, r.container_id, r.ifname));
        }
    }
    Ok(Some(d))
}

/// One reconcile round over every known network; updates the status counters.
pub async fn round<S: Store>(shim: &Shim<S>, free: bool) -> Result<(), ShimError> {
    let (mut missing, mut orphans) = (0u64, 0u64);
    for dc in networks(shim).await? {
        let Some(d) = check(shim, &dc).await? else {
            continue;
        };
        if !d.missing.is_empty() {
            warn!(network = %dc.network, missing = ?d.missing, "the delegate's store lacks addresses the ledger records: it was wiped, or dipamd and the runtime do not see the same state directory; these addresses may be handed out twice");
        }
        if !d.orphans.is_empty() {
            warn!(network = %dc.network, orphans = ?d.orphans, "the delegate's store holds reservations dipamd never recorded");
            if free {
                let items = gc::collect(shim, &dc, "", Valid::Ledger, false).await?;
                let freed = items.iter().filter(|i| i.outcome == "freed").count();
                info!(network = %dc.network, freed, "reconcile freed orphaned reservations");
            }
        }
        missing += d.missing.len() as u64;
        orphans += d.orphans.len() as u64;
    }
    shim.gc_stats.missing.store(missing, Ordering::Relaxed);
    shim.gc_stats.orphans.store(orphans, Ordering::Relaxed);
    Ok(())
}

/// The loop; `every` zero disables it.
pub async fn run<S: Store>(shim: Arc<Shim<S>>, every: Duration, free: bool) {
    if every.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = round(&shim, free).await {
            warn!(error = %e, "ledger/store reconcile failed");
        }
    }
}
