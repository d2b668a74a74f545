//! `Admin.Explain` (`dipamctl explain`): one container's ledger records and its recorded
//! history, found by what an operator has in hand: the container ID, a unique prefix of it
//! (crictl prints 13 characters), a Kubernetes pod as `namespace/name`, or an IP address
//! (from an alert or a packet capture).

use std::net::IpAddr;

use dipam_proto::v1::{ExplainReply, ExplainRequest};
use dipam_state::{AttachmentRecord, Ledger, StoreError, Tree};
use serde_json::Value;

use crate::{
    l1_leaves::error::{InputError, ShimError},
    l2_core::delegate::config::result_addrs,
    l5_node::node::Node,
};

/// The shortest ID prefix taken: shorter ones match too much to be what anyone meant.
const MIN_PREFIX: usize = 4;

/// `dipamctl explain`: the container's ledger records and its recorded history. A warm-pool ID
/// also finds the pod its address went to (the delegate's executions are recorded under it).
///
/// `namespace/name` names a Kubernetes pod instead: the attachment made for it through CRI
/// (its sandbox's container ID) is explained, the most recently updated if there are several.
/// An IP explains the container that holds it now, else the last one the history shows it
/// given to, and lists every container the history shows it given to.
pub async fn run(node: &Node, req: ExplainRequest) -> Result<ExplainReply, ShimError> {
    // What completed before this call is in the history before it is read.
    if let Some(h) = node.history.get() {
        h.flush().await;
    }
    let asked = req.container_id;
    let (cid, earlier, records, events) = node
        .core
        .ledger(move |l| {
            let records = l.list(None)?;
            let (cid, earlier) = match resolve(l, &records, &asked)? {
                Ok(found) => found,
                Err(e) => return Ok(Err(e)),
            };
            let mine: Vec<_> = records
                .into_iter()
                .filter(|r| r.key.container_id == cid || r.delegate_ids().0 == cid)
                .collect();
            let events = crate::l4_observers::history::read(l, &cid)?;
            Ok(Ok((cid, earlier, mine, events)))
        })
        .await??;
    Ok(ExplainReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: super::list_from(records, ""),
        events: events.iter().map(ToString::to_string).collect(),
        events_dropped: node
            .history
            .get()
            .map_or(0, crate::l4_observers::history::Sink::dropped),
        container_id: cid,
        earlier_holders: earlier,
    })
}

/// The container `asked` names, and (for an IP) every container the history shows holding it.
fn resolve(
    l: &Ledger,
    records: &[AttachmentRecord],
    asked: &str,
) -> Result<Result<(String, Vec<String>), ShimError>, StoreError> {
    if let Some((namespace, name)) = asked.split_once('/') {
        return Ok(pod_container(records, namespace, name).map(|c| (c, Vec::new())));
    }
    if let Ok(ip) = asked.parse::<IpAddr>() {
        return by_ip(l, records, ip);
    }
    if let Err(e) = crate::l1_leaves::validate::container_id(asked) {
        return Ok(Err(e));
    }
    Ok(by_prefix(l, records, asked).map(|c| (c, Vec::new())))
}

/// The container holding `ip` now, else the last the history shows it given to; and all of
/// those the history shows, oldest first.
fn by_ip(
    l: &Ledger,
    records: &[AttachmentRecord],
    ip: IpAddr,
) -> Result<Result<(String, Vec<String>), ShimError>, StoreError> {
    let earlier = holders_in_history(l, ip)?;
    let now = records
        .iter()
        .filter(|r| {
            r.result
                .as_ref()
                .is_some_and(|v| result_addrs(v).contains(&ip))
        })
        .max_by_key(|r| r.updated_at)
        .map(|r| r.key.container_id.clone());
    Ok(match now.or_else(|| earlier.last().cloned()) {
        Some(cid) => Ok((cid, earlier)),
        None => Err(not_found(
            format!("no attachment holds {ip} and the history shows it given to no container"),
            "an IP is found while a container holds it, and afterwards while the history keeps \
             that container's requests (the last 64 of each of 1024 containers); check the IP, \
             or run `dipamctl attachments` to list what the ledger holds"
                .into(),
        )),
    })
}

/// The containers whose recorded requests returned `ip`, oldest first (by their first event
/// giving it). History keys are `<container ID>\0<time><seq>`, so the scan is per container.
fn holders_in_history(l: &Ledger, ip: IpAddr) -> Result<Vec<String>, StoreError> {
    let mut seen: Vec<(u64, String)> = Vec::new();
    for (key, value) in l.store().scan_prefix(Tree::History, b"")? {
        let Some(cid) = key.split(|b| *b == 0).next() else {
            continue;
        };
        let Ok(event) = serde_json::from_slice::<Value>(&value) else {
            continue;
        };
        let gave = event
            .get("result")
            .is_some_and(|r| result_addrs(r).contains(&ip));
        let cid = String::from_utf8_lossy(cid).into_owned();
        if gave && !seen.iter().any(|(_, c)| *c == cid) {
            seen.push((event["atMs"].as_u64().unwrap_or_default(), cid));
        }
    }
    seen.sort();
    Ok(seen.into_iter().map(|(_, c)| c).collect())
}

/// `asked` itself when the ledger or the history knows it; else the one ledger container
/// whose ID starts with it. Several is an error naming them: guessing would explain the
/// wrong pod.
fn by_prefix(l: &Ledger, records: &[AttachmentRecord], asked: &str) -> Result<String, ShimError> {
    let known = records.iter().any(|r| r.key.container_id == asked)
        || crate::l4_observers::history::read(l, asked).is_ok_and(|e| !e.is_empty());
    if known || asked.len() < MIN_PREFIX {
        return Ok(asked.to_owned());
    }
    let mut matches: Vec<&str> = records
        .iter()
        .map(|r| r.key.container_id.as_str())
        .filter(|c| c.starts_with(asked))
        .collect();
    matches.sort_unstable();
    matches.dedup();
    match matches.as_slice() {
        [] => Ok(asked.to_owned()),
        [one] => Ok((*one).to_owned()),
        many => Err(not_found(
            format!(
                "{} containers start with {}",
                many.len(),
                crate::l1_leaves::validate::shown(asked)
            ),
            format!(
                "give more of the ID: {}",
                many.iter().take(8).copied().collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// The container ID of the ledger's attachment for pod `namespace/name` (recorded from the
/// K8S_POD_* keys of a CRI runtime's ADD).
fn pod_container(
    records: &[AttachmentRecord],
    namespace: &str,
    name: &str,
) -> Result<String, ShimError> {
    records
        .iter()
        .filter(|r| {
            r.cri_pod
                .as_ref()
                .is_some_and(|p| p.namespace == namespace && p.name == name)
        })
        .max_by_key(|r| r.updated_at)
        .map(|r| r.key.container_id.clone())
        .ok_or_else(|| {
            not_found(
                format!(
                    "no attachment in the ledger for pod {}/{}",
                    crate::l1_leaves::validate::shown(namespace),
                    crate::l1_leaves::validate::shown(name)
                ),
                crate::l5_node::hints::POD_BY_NAME.into(),
            )
        })
}

fn not_found(msg: String, details: String) -> ShimError {
    ShimError::GcInput(InputError { msg, details })
}
