//! A GC run: plan what to keep and why, refuse what an interlock forbids, and release the
//! rest through the delegate.

use std::{collections::HashSet, time::SystemTime};

use dipam_proto::v1::GcItem;
use dipam_state::{AttachmentRecord, AttachmentState, Owner};
use rscni_types::version::SpecVersion;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::*;
use crate::{
    clock::now,
    delegate::{
        Invocation,
        config::{DelegateConf, result_ips},
        store,
    },
    error::ShimError,
    node::Node,
};

/// Plans and (unless `dry_run`) runs GC of the network of `dc`. `force` overrides the share
/// interlock (`dipamctl gc --force`); nothing else does.
pub async fn collect(
    node: &Node,
    dc: &DelegateConf,
    cni_path: &str,
    valid: Valid,
    dry_run: bool,
    force: bool,
) -> Result<Plan, ShimError> {
    let network = dc.network.clone();
    let _exclusive = node.locks.exclusive(&network).await;
    let net = network.clone();
    let records: Vec<AttachmentRecord> = node.ledger(move |l| l.list(Some(&net))).await?;
    let t = now();
    let grace = node.gc.grace.as_secs();

    let listed: HashSet<(String, String)> = match &valid {
        Valid::List(l) => l.iter().cloned().collect(),
        Valid::Ledger => records
            .iter()
            .map(|r| (r.key.container_id.clone(), r.key.ifname.clone()))
            .collect(),
    };
    // Every reason a record is kept, as (code, text) for `dipamctl gc --dry-run`.
    let reasons = |r: &AttachmentRecord| {
        let mut why: Vec<(&str, String)> = Vec::new();
        if listed.contains(&(r.key.container_id.clone(), r.key.ifname.clone())) {
            why.push((
                "valid-list",
                match valid {
                    Valid::List(_) => "in the valid list".into(),
                    Valid::Ledger => "in the ledger (--use-ledger)".into(),
                },
            ));
        }
        match &r.owner {
            Owner::Agent { role } => why.push(("agent", format!("the agent's {role} address"))),
            Owner::Pool => why.push(("pool", "a warm-pool entry".into())),
            Owner::Pod => {}
        }
        if r.state != AttachmentState::Committed {
            why.push((
                "in-flight",
                format!(
                    "an operation is in flight or was interrupted (state {})",
                    r.state.as_str()
                ),
            ));
        }
        let old = t.saturating_sub(r.created_at);
        if old < grace {
            why.push((
                "grace",
                format!(
                    "added {} ago, inside the grace period (--gc-grace {grace}s)",
                    age(old)
                ),
            ));
        }
        why
    };
    let mut keep: HashSet<(String, String)> = HashSet::new();
    let mut kept_items = Vec::new();
    let mut stale: Vec<&AttachmentRecord> = Vec::new();
    for r in &records {
        let why = reasons(r);
        if why.is_empty() {
            stale.push(r);
            continue;
        }
        keep.insert((r.key.container_id.clone(), r.key.ifname.clone()));
        kept_items.push(kept(
            "ledger",
            &r.key.container_id,
            &r.key.ifname,
            r.result.as_ref().map(result_ips).unwrap_or_default(),
            why,
        ));
    }
    keep.extend(listed.iter().cloned());
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
    // The share interlock (calico#5044: a bad list once freed every healthy pod). It holds at
    // every size: freeing the only pod of a network, or both of two, is exactly what a
    // truncated list does, so it takes an operator's --force (or --gc-max-free-share 1).
    if !force && !stale.is_empty() && stale.len() as f64 > node.gc.max_free_share * pods as f64 {
        node.gc_stats
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        node.events.emit(crate::events::Event::GcRefused);
        return Err(ShimError::GcRefused {
            network,
            reason: format!(
                "it would free {} of the network's {pods} pod attachments, more than the \
                 allowed share {:.0}% (dipamd --gc-max-free-share; `dipamctl gc --force \
                 --dry-run` shows what it would free, and without --dry-run frees it)",
                stale.len(),
                node.gc.max_free_share * 100.0
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

    let (probe, send) = node.resolve(dc, cni_path).await?;
    let native_gc = probe.supported.contains(&SpecVersion::new(1, 1, 0));
    // Orphans: in the delegate's own store, unknown to the ledger and to the valid set.
    let mut orphans = Vec::new();
    if !native_gc && let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &network) {
        let known: HashSet<(String, String)> = records.iter().map(delegate_pair).collect();
        let known_ids: HashSet<&str> = known.iter().map(|(c, _)| c.as_str()).collect();
        let keep_ids: HashSet<&str> = delegate_keep.iter().map(|(c, _)| c.as_str()).collect();
        let reservations = store::reservations(&dir)
            .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
        for r in reservations {
            let pair = (r.container_id.clone(), r.ifname.clone());
            // Legacy id-only files (empty ifname) match by container ID.
            let (recorded, listed) = if r.ifname.is_empty() {
                (
                    known_ids.contains(r.container_id.as_str()),
                    keep_ids.contains(r.container_id.as_str()),
                )
            } else {
                (known.contains(&pair), delegate_keep.contains(&pair))
            };
            if recorded {
                // The ledger's record stands for it (kept or collected above).
                continue;
            }
            let age = r
                .modified
                .and_then(|m| SystemTime::now().duration_since(m).ok());
            let young = age.is_some_and(|d| d < node.gc.grace);
            if listed || young {
                let mut why = Vec::new();
                if listed {
                    why.push((
                        "valid-list",
                        format!(
                            "held by {} and in the valid list, unknown to dipamd",
                            dc.kind
                        ),
                    ));
                }
                if young {
                    why.push((
                        "grace",
                        format!(
                            "reserved {} ago, inside the grace period (--gc-grace {grace}s)",
                            self::age(age.map_or(0, |d| d.as_secs()))
                        ),
                    ));
                }
                kept_items.push(kept(
                    "orphan",
                    &r.container_id,
                    &r.ifname,
                    vec![r.ip.to_string()],
                    why,
                ));
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
        return Ok(Plan {
            items,
            kept: kept_items,
        });
    }

    let mut n = 0;
    for rec in stale {
        let it = &mut items[n];
        n += 1;
        let outcome = node.release(rec).await;
        finish(node, it, outcome);
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
            path: node.exec.delegate_cni_path(cni_path),
            stdin: serde_json::to_vec(&conf).map_err(|e| ShimError::Internal(e.to_string()))?,
            ..Invocation::default()
        };
        node.exec.call(&dc.kind, &probe, &inv).await?;
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
                path: node.exec.delegate_cni_path(cni_path),
                stdin: d.bytes_for(send)?,
                ..Invocation::default()
            };
            node.exec.call(&dc.kind, &probe, &inv).await.map(|_| ())
        }
        .await;
        finish(node, it, outcome);
    }
    Ok(Plan {
        items,
        kept: kept_items,
    })
}

fn finish(node: &Node, it: &mut GcItem, outcome: Result<(), ShimError>) {
    match outcome {
        Ok(()) => {
            it.outcome = "freed".into();
            node.gc_stats
                .freed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            node.events.emit(crate::events::Event::GcFreed(1));
            info!(kind = %it.kind, container_id = %it.container_id, ifname = %it.ifname, ips = ?it.ips, reason = %it.reason, "GC freed");
        }
        Err(e) => {
            it.outcome = "failed".into();
            it.error = e.to_string();
            warn!(kind = %it.kind, container_id = %it.container_id, error = %e, "GC could not free; carrying on");
        }
    }
}

#[cfg(test)]
mod tests {
    use dipam_state::{AttachmentKey, MemStore};

    use super::*;
    use crate::rpc::tests::{request, scripted_node};

    const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
"#;

    fn rec(cid: &str, owner: Owner, state: AttachmentState, created_at: u64) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey::new("net", cid, "eth0"),
            owner,
            state,
            delegate_type: "fake-ipam".into(),
            delegate_version: "1.0.0".into(),
            delegate_config: r#"{"cniVersion":"1.0.0","name":"net","type":"fake-ipam"}"#.into(),
            netns: String::new(),
            cni_args: String::new(),
            cni_path: String::new(),
            result: Some(json!({"cniVersion":"1.0.0","ips":[{"address":"10.9.0.9/24"}]})),
            config_digest: String::new(),
            request_id: "t".into(),
            created_at,
            updated_at: created_at,
            issued_ms: 0,
            issued_at: None,
            delegate_key: None,
            creator_uid: None,
        }
    }

    async fn bench(
        records: Vec<AttachmentRecord>,
    ) -> (tempfile::TempDir, std::sync::Arc<Node>, DelegateConf) {
        let (dir, node) = scripted_node(SCRIPT, std::sync::Arc::new(MemStore::new()));
        for r in records {
            node.ledger(move |l| l.put(&r)).await.unwrap();
        }
        let dc = node
            .prepare(
                request("", "1.1.0", json!({})),
                false,
                crate::access::Caller::ROOT,
            )
            .unwrap()
            .dc;
        (dir, node, dc)
    }

    fn list(ids: &[&str]) -> Valid {
        Valid::List(
            ids.iter()
                .map(|c| ((*c).to_owned(), "eth0".to_owned()))
                .collect(),
        )
    }

    #[tokio::test]
    async fn a_plan_says_why_it_keeps_each_attachment() {
        let old = now() - 1000; // older than the default grace (60 s)
        let (_d, node, dc) = bench(vec![
            rec("listed", Owner::Pod, AttachmentState::Committed, old),
            rec("stale", Owner::Pod, AttachmentState::Committed, old),
            rec("young", Owner::Pod, AttachmentState::Committed, now()),
            rec("busy", Owner::Pod, AttachmentState::Adding, old),
            rec(
                "dipam-router-ipv4-n1",
                Owner::Agent {
                    role: "router".into(),
                },
                AttachmentState::Committed,
                old,
            ),
            rec(
                "dipam-pool-n1-0",
                Owner::Pool,
                AttachmentState::Committed,
                old,
            ),
        ])
        .await;
        let plan = collect(&node, &dc, "", list(&["listed"]), true, false)
            .await
            .unwrap();
        let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
        assert_eq!(freed, vec!["stale"]);
        assert_eq!(plan.items[0].outcome, "planned");
        let mut kept: Vec<_> = plan
            .kept
            .iter()
            .map(|i| {
                assert_eq!(i.outcome, "kept");
                assert!(!i.reason.is_empty());
                (i.container_id.as_str(), i.keep.join(","))
            })
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            vec![
                ("busy", "in-flight".to_owned()),
                ("dipam-pool-n1-0", "pool".to_owned()),
                ("dipam-router-ipv4-n1", "agent".to_owned()),
                ("listed", "valid-list".to_owned()),
                ("young", "grace".to_owned()),
            ]
        );
        assert!(
            node.lookup(&AttachmentKey::new("net", "stale", "eth0"))
                .unwrap()
                .is_some(),
            "a dry run freed"
        );
    }

    #[tokio::test]
    async fn freeing_all_of_a_small_network_takes_force() {
        let old = now() - 1000;
        // One pod, not in the list: 1 of 1.
        let (_d, node, dc) = bench(vec![rec(
            "only",
            Owner::Pod,
            AttachmentState::Committed,
            old,
        )])
        .await;
        let e = collect(&node, &dc, "", list(&["other"]), false, false)
            .await
            .unwrap_err();
        assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
        assert!(
            node.lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_some()
        );
        let plan = collect(&node, &dc, "", list(&["other"]), false, true)
            .await
            .unwrap();
        assert_eq!(plan.items[0].outcome, "freed", "{:?}", plan.items);
        assert!(
            node.lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_none()
        );

        // Two pods: both is refused, one of two is not.
        let (_d, node, dc) = bench(vec![
            rec("a", Owner::Pod, AttachmentState::Committed, old),
            rec("b", Owner::Pod, AttachmentState::Committed, old),
        ])
        .await;
        assert!(
            collect(&node, &dc, "", list(&["other"]), false, false)
                .await
                .is_err()
        );
        let plan = collect(&node, &dc, "", list(&["a"]), false, false)
            .await
            .unwrap();
        assert_eq!(plan.items.len(), 1);
        assert_eq!(plan.items[0].container_id, "b");
        assert_eq!(plan.items[0].outcome, "freed");
    }
}
