//! Garbage collection of one network: what the runtime's CNI GC asks for, what `dipamctl gc`
//! asks for, and what the periodic reconcile may do.
//!
//! The valid set is the union of the runtime's list, every agent-owned attachment, every
//! attachment with an operation in flight or interrupted (state `adding`/`deleting`), and every
//! attachment younger than the grace period: a pod being created while GC runs never loses
//! its address (whereabouts#207, F17). GC holds the network exclusively, so no ADD or DEL of
//! that network runs meanwhile (spec 1.1 §3).
//!
//! Collected are (1) committed pod records outside the valid set: released through the
//! delegate's DEL with their recorded config, then dropped from the ledger; and (2) for
//! delegates that implement GC (advertise 1.1.0), whatever their own GC frees when given the
//! augmented valid list under both keys; or, for host-local, which has no GC, the
//! reservations its store holds that are in neither the ledger nor the valid set: released by
//! running host-local's DEL for them, never by touching its files.
//!
//! Interlocks: a GC that would free more than `max_free_share` of the network's pod
//! attachments is refused whole (calico#5044: a bad list once freed every healthy pod).
//!
//! The warm pool's entries are always valid, like the agent's. A pod served from the pool is
//! matched against the runtime's list under its own key, but the delegate knows it by the
//! pool entry's key: the valid set handed to the delegate's GC, and the one its store is
//! compared with, name that key.

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use dipam_proto::v1::{GcItem, Mode};
use dipam_state::{AttachmentRecord, AttachmentState, Owner, Store};
use rscni_types::version::SpecVersion;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{
    delegate::{
        Invocation,
        config::{DelegateConf, result_ips},
        store,
    },
    error::ShimError,
    shim::{Shim, now},
};

/// GC safety settings (dipamd flags).
#[derive(Debug, Clone)]
pub struct GcPolicy {
    pub grace: Duration,
    pub max_free_share: f64,
    /// Accept an empty, null or absent valid list (it would free every pod of the network).
    pub allow_empty: bool,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            max_free_share: 0.5,
            allow_empty: false,
        }
    }
}

/// The share interlock only applies above this many attachments to free: on a node with two
/// pods, freeing one stale pod is half of them and entirely normal.
const SMALL_GC: usize = 2;

/// What counts as valid.
#[derive(Debug, Clone)]
pub enum Valid {
    /// The runtime's (or operator's) list of (container ID, ifname).
    List(Vec<(String, String)>),
    /// Everything the ledger knows: collect only what the delegate holds behind dipamd's back.
    Ledger,
}

/// Reads the valid list of a CNI GC request: `cni.dev/valid-attachments`, else the legacy
/// `cni.dev/attachments` (libcni 1.2.0-1.2.2 send only the first; 1.2.3+ both).
/// `None` when absent or null.
pub fn valid_list(conf: &Value) -> Option<Vec<(String, String)>> {
    let list = conf
        .get("cni.dev/valid-attachments")
        .filter(|v| !v.is_null())
        .or_else(|| conf.get("cni.dev/attachments").filter(|v| !v.is_null()))?
        .as_array()?;
    Some(
        list.iter()
            .filter_map(|a| {
                Some((
                    a["containerID"].as_str()?.to_owned(),
                    a["ifname"].as_str().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    )
}

fn item(kind: &str, cid: &str, ifname: &str, ips: Vec<String>, reason: String) -> GcItem {
    GcItem {
        kind: kind.into(),
        container_id: cid.into(),
        ifname: ifname.into(),
        ips,
        reason,
        outcome: "planned".into(),
        error: String::new(),
    }
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Plans and (unless `dry_run`) runs GC of the network of `dc`.
pub async fn collect<S: Store>(
    shim: &Shim<S>,
    dc: &DelegateConf,
    cni_path: &str,
    valid: Valid,
    dry_run: bool,
) -> Result<Vec<GcItem>, ShimError> {
    let network = dc.network.clone();
    let _exclusive = shim.locks.exclusive(&network).await;
    let net = network.clone();
    let records: Vec<AttachmentRecord> = shim.ledger(move |l| l.list(Some(&net))).await?;
    let t = now();
    let grace = shim.gc.grace.as_secs();

    let listed: HashSet<(String, String)> = match &valid {
        Valid::List(l) => l.iter().cloned().collect(),
        Valid::Ledger => records
            .iter()
            .map(|r| (r.key.container_id.clone(), r.key.ifname.clone()))
            .collect(),
    };
    let protected = |r: &AttachmentRecord| {
        matches!(r.owner, Owner::Agent { .. } | Owner::Pool)
            || r.state != AttachmentState::Committed
            || t.saturating_sub(r.created_at) < grace
    };
    let mut keep: HashSet<(String, String)> = listed.clone();
    for r in records.iter().filter(|r| protected(r)) {
        keep.insert((r.key.container_id.clone(), r.key.ifname.clone()));
    }

    let stale: Vec<&AttachmentRecord> = records
        .iter()
        .filter(|r| !keep.contains(&(r.key.container_id.clone(), r.key.ifname.clone())))
        .collect();
    // What the delegate is told to keep, and its store compared with: `keep` plus the
    // delegate's key of every kept record (a pod served from the warm pool).
    let delegate_pair = |r: &AttachmentRecord| {
        let (c, i) = r.delegate_ids();
        (c.to_owned(), i.to_owned())
    };
    let delegate_keep: HashSet<(String, String)> = keep
        .iter()
        .cloned()
        .chain(
            records
                .iter()
                .filter(|r| keep.contains(&(r.key.container_id.clone(), r.key.ifname.clone())))
                .map(delegate_pair),
        )
        .collect();
    let pods = records
        .iter()
        .filter(|r| r.owner == Owner::Pod && r.state == AttachmentState::Committed)
        .count();
    if stale.len() > SMALL_GC && stale.len() as f64 > shim.gc.max_free_share * pods as f64 {
        shim.gc_stats
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ShimError::GcRefused {
            network,
            reason: format!(
                "it would free {} of the network's {pods} pod attachments, more than the \
                 allowed share {:.0}% (dipamd --gc-max-free-share)",
                stale.len(),
                shim.gc.max_free_share * 100.0
            ),
        });
    }
    let mut items: Vec<GcItem> = stale
        .iter()
        .map(|r| {
            item(
                "ledger",
                &r.key.container_id,
                &r.key.ifname,
                r.result.as_ref().map(result_ips).unwrap_or_default(),
                format!(
                    "not in the valid list; added {} ago{}",
                    age(t.saturating_sub(r.created_at)),
                    r.delegate_key
                        .as_ref()
                        .map(|d| format!(
                            "; {} holds it as {}/{}",
                            r.delegate_type, d.container_id, d.ifname
                        ))
                        .unwrap_or_default()
                ),
            )
        })
        .collect();

    let (probe, send) = shim.resolve(dc, cni_path).await?;
    let native_gc = probe.supported.contains(&SpecVersion::new(1, 1, 0));
    // Orphans: in the delegate's own store, unknown to the ledger and to the valid set.
    let mut orphans = Vec::new();
    if !native_gc && let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &network) {
        let known: HashSet<(String, String)> = records.iter().map(delegate_pair).collect();
        let known_ids: HashSet<&str> = known
            .iter()
            .chain(delegate_keep.iter())
            .map(|(c, _)| c.as_str())
            .collect();
        let reservations = store::reservations(&dir)
            .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
        for r in reservations {
            let pair = (r.container_id.clone(), r.ifname.clone());
            let held = if r.ifname.is_empty() {
                known_ids.contains(r.container_id.as_str())
            } else {
                known.contains(&pair) || delegate_keep.contains(&pair)
            };
            let young = r
                .modified
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|d| d < shim.gc.grace);
            if held || young {
                continue;
            }
            items.push(item(
                "orphan",
                &r.container_id,
                &r.ifname,
                vec![r.ip.to_string()],
                format!(
                    "held by {} in {} but unknown to dipamd and not in the valid list",
                    dc.kind,
                    dir.display()
                ),
            ));
            orphans.push(r);
        }
    }
    if dry_run {
        return Ok(items);
    }

    let mut n = 0;
    for rec in stale {
        let it = &mut items[n];
        n += 1;
        let mut marked = rec.clone();
        marked.state = AttachmentState::Deleting;
        marked.updated_at = t;
        let outcome = async {
            shim.ledger(move |l| l.put(&marked)).await?;
            shim.release_recorded(rec).await?;
            let key = rec.key.clone();
            shim.ledger(move |l| l.remove(&key)).await
        }
        .await;
        finish(shim, it, outcome);
    }
    if native_gc {
        let mut conf = dc.conf.clone();
        let list: Vec<Value> = delegate_keep
            .iter()
            .map(|(c, i)| json!({"containerID": c, "ifname": i}))
            .collect();
        conf["cni.dev/valid-attachments"] = Value::Array(list.clone());
        conf["cni.dev/attachments"] = Value::Array(list);
        let inv = Invocation {
            command: "GC".into(),
            path: shim.exec.delegate_cni_path(cni_path),
            stdin: serde_json::to_vec(&conf).map_err(|e| ShimError::Internal(e.to_string()))?,
            ..Invocation::default()
        };
        shim.exec.call(&dc.kind, &probe, &inv).await?;
        info!(network = %network, delegate = %dc.kind, kept = delegate_keep.len(), "delegate GC run with the augmented valid list");
    }
    for (r, it) in orphans.iter().zip(items.iter_mut().skip(n)) {
        let mut conf = dc.conf.clone();
        if let Some(o) = conf.as_object_mut() {
            o.remove("cni.dev/valid-attachments");
            o.remove("cni.dev/attachments");
        }
        let d = DelegateConf { conf, ..dc.clone() };
        let outcome = async {
            let inv = Invocation {
                command: "DEL".into(),
                container_id: r.container_id.clone(),
                // host-local releases `<id>\r\n<ifname>`, and falls back to legacy id-only
                // files when nothing matches: any valid ifname reaches those.
                ifname: if r.ifname.is_empty() {
                    "eth0".into()
                } else {
                    r.ifname.clone()
                },
                path: shim.exec.delegate_cni_path(cni_path),
                stdin: d.bytes_for(send)?,
                ..Invocation::default()
            };
            shim.exec.call(&dc.kind, &probe, &inv).await.map(|_| ())
        }
        .await;
        finish(shim, it, outcome);
    }
    Ok(items)
}

fn finish<S: Store>(shim: &Shim<S>, it: &mut GcItem, outcome: Result<(), ShimError>) {
    match outcome {
        Ok(()) => {
            it.outcome = "freed".into();
            shim.gc_stats
                .freed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            info!(kind = %it.kind, container_id = %it.container_id, ifname = %it.ifname, ips = ?it.ips, reason = %it.reason, "GC freed");
        }
        Err(e) => {
            it.outcome = "failed".into();
            it.error = e.to_string();
            warn!(kind = %it.kind, container_id = %it.container_id, error = %e, "GC could not free; carrying on");
        }
    }
}

/// The mode a request config is in, for configs that did not come through the plugin.
pub fn mode_of(conf: &Value) -> Mode {
    if conf["ipam"]["type"] == "dipam" {
        Mode::Ipam
    } else {
        Mode::Main
    }
}

/// Counters for status.
#[derive(Debug, Default)]
pub struct GcStats {
    pub refused: std::sync::atomic::AtomicU64,
    pub freed: std::sync::atomic::AtomicU64,
    pub missing: std::sync::atomic::AtomicU64,
    pub orphans: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_list_reads_either_key_and_tells_absent_from_empty() {
        let both = json!({"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],
                          "cni.dev/attachments":[{"containerID":"zzz","ifname":"eth0"}]});
        assert_eq!(valid_list(&both), Some(vec![("a".into(), "eth0".into())]));
        let legacy = json!({"cni.dev/attachments":[{"containerID":"b","ifname":"eth1"}]});
        assert_eq!(valid_list(&legacy), Some(vec![("b".into(), "eth1".into())]));
        assert_eq!(
            valid_list(&json!({"cni.dev/valid-attachments": []})),
            Some(vec![])
        );
        assert_eq!(
            valid_list(&json!({"cni.dev/valid-attachments": null})),
            None
        );
        assert_eq!(valid_list(&json!({})), None);
    }
}
