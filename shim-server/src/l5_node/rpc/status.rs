//! STATUS (spec 1.1 §STATUS): answers whether dipamd can serve ADD now.
//!
//! - 50 (not available): the ledger cannot take commits (a full disk: every ADD and DEL
//!   would fail until it can again), the delegate binary is missing or did not answer VERSION, the agent's
//!   conflist is not there yet, or an agent address could not be established, or the
//!   delegate's own STATUS failed (spec: a plugin that depends on a delegated IPAM MUST send it
//!   STATUS and fail if it fails).
//! - 51 (not available, and existing pods may have limited connectivity): the delegate's store
//!   lacks addresses the ledger records for running pods (it was wiped, or dipamd does not see
//!   the runtime's state directory), so those addresses may be handed out a second time and
//!   two pods would answer for one IP.
//!
//! Cheap by design: containerd 2.x calls STATUS on every kubelet status poll. Everything here
//! is in memory, the VERSION probe is cached, the divergence comes from the periodic
//! reconcile, and the delegate's own STATUS answer is remembered for a few seconds.

use std::time::{Duration, Instant};

use dipam_proto::v1::CniRequest;
use rscni_types::version::SpecVersion;

use crate::{l1_leaves::error::ShimError, l5_node::node::Node};

const DELEGATE_STATUS_TTL: Duration = Duration::from_secs(5);

pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    req: CniRequest,
) -> Result<Vec<u8>, ShimError> {
    let p = node.prepare(req, false, caller)?;
    node_checks(node)?;
    delegate_checks(node, &p).await?;
    Ok(Vec::new())
}

/// What makes dipamd unable to serve ADD whatever the network: the ledger, the delegate's
/// store as the last reconcile found it, the agent's addresses. In memory, so cheap.
pub fn node_checks(node: &Node) -> Result<(), ShimError> {
    if let Some(fault) = node.core.ledger.store().fault() {
        return Err(ShimError::NotReady {
            missing: vec![fault],
        });
    }
    let missing = node
        .gc
        .stats
        .missing
        .load(std::sync::atomic::Ordering::Relaxed);
    if missing > 0 {
        return Err(ShimError::LimitedConnectivity {
            reasons: vec![format!(
                "the delegate's store lacks {missing} address(es) the ledger records; they may \
                 be handed out twice. Check that dipamd sees the runtime's delegate state \
                 directory (host-local: /var/lib/cni/networks) and that it is persistent; \
                 `dipamctl attachments` lists them"
            )],
        });
    }
    let mut not_ready = node.agent.not_ready();
    not_ready.extend(node.startup.get().into_iter().flatten().cloned());
    if !not_ready.is_empty() {
        return Err(ShimError::NotReady { missing: not_ready });
    }
    Ok(())
}

/// The network's delegate: it answers VERSION, and, when it speaks 1.1, its own STATUS
/// (remembered for a few seconds).
async fn delegate_checks(node: &Node, p: &crate::l2_core::core::Prepared) -> Result<(), ShimError> {
    let probe = node
        .core
        .exec
        .probe(&p.dc.kind, &p.req.cni_path)
        .await
        .map_err(|e| ShimError::NotReady {
            missing: vec![e.to_string()],
        })?;
    if probe.supported.is_empty() {
        return Err(ShimError::NotReady {
            missing: vec![format!(
                "delegate {} at {} did not answer VERSION",
                p.dc.kind,
                probe.path.display()
            )],
        });
    }
    if probe.supported.contains(&SpecVersion::new(1, 1, 0)) {
        // A non-root caller's config is its own (docs/cfp.md §8.3): its answer must not
        // stand for root's network for the next few seconds, nor root's for its. It is
        // remembered for that uid alone, so that its STATUS calls never cost an exec each
        // (1,024 of them once ran 827 delegates as root at once).
        let key = cache_key(&p.dc.kind, p.caller);
        let cached = node.status_cache.lock().ok().and_then(|c| {
            c.get(&key)
                .filter(|(at, _)| at.elapsed() < DELEGATE_STATUS_TTL)
                .map(|(_, r)| r.clone())
        });
        let failure = match cached {
            Some(r) => r,
            None => {
                let stdin = p.dc.bytes_for(None)?;
                let r = node
                    .core
                    .run_delegate(p, &probe, "STATUS", stdin)
                    .await
                    .err()
                    .map(|e| e.to_string());
                if let Ok(mut c) = node.status_cache.lock() {
                    // Entries of callers gone quiet go: the map holds one per uid at most.
                    c.retain(|_, (at, _)| at.elapsed() < DELEGATE_STATUS_TTL);
                    c.insert(key, (Instant::now(), r.clone()));
                }
                r
            }
        };
        if let Some(why) = failure {
            return Err(ShimError::NotReady {
                missing: vec![format!("delegate {} STATUS: {why}", p.dc.kind)],
            });
        }
    }
    Ok(())
}

/// Where a delegate's STATUS answer is remembered: by its type for root, by its type and
/// the uid for a non-root caller (never read for root's readiness).
fn cache_key(kind: &str, caller: crate::l1_leaves::access::Caller) -> String {
    if caller.is_root() {
        kind.to_owned()
    } else {
        format!("{kind}\0{}", caller.uid)
    }
}

/// The delegates whose own STATUS failed within the last few seconds, as root's callers of
/// STATUS (a runtime, the health service) saw it: for readiness when no network config is at
/// hand.
pub fn recent_delegate_failures(node: &Node) -> Vec<String> {
    let Ok(cache) = node.status_cache.lock() else {
        return Vec::new();
    };
    let mut out: Vec<String> = cache
        .iter()
        .filter(|(kind, (at, _))| !kind.contains('\0') && at.elapsed() < DELEGATE_STATUS_TTL)
        .filter_map(|(kind, (_, r))| {
            r.as_ref()
                .map(|why| format!("delegate {kind} STATUS: {why}"))
        })
        .collect();
    out.sort();
    out
}
