//! `Admin.Explain` (`dipamctl explain`): one container's ledger records and its recorded
//! history.

use dipam_proto::v1::{ExplainReply, ExplainRequest};

use crate::{error::ShimError, node::Node};

/// `dipamctl explain`: the container's ledger records and its recorded history. A warm-pool ID
/// also finds the pod its address went to (the delegate's executions are recorded under it).
///
/// `namespace/name` names a Kubernetes pod instead: the attachment made for it through CRI
/// (its sandbox's container ID) is explained, the most recently updated if there are several.
pub async fn run(node: &Node, req: ExplainRequest) -> Result<ExplainReply, ShimError> {
    let cid = match req.container_id.split_once('/') {
        Some((namespace, name)) => pod_container(node, namespace, name).await?,
        None => {
            crate::validate::container_id(&req.container_id)?;
            req.container_id.clone()
        }
    };
    // What completed before this call is in the history before it is read.
    if let Some(h) = node.history.get() {
        h.flush().await;
    }
    let (records, events) = node
        .core
        .ledger(move |l| {
            let records: Vec<_> = l
                .list(None)?
                .into_iter()
                .filter(|r| r.key.container_id == cid || r.delegate_ids().0 == cid)
                .collect();
            Ok((records, crate::history::read(l, &cid)?))
        })
        .await?;
    let all = super::list_from(records, "");
    Ok(ExplainReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: all,
        events: events.iter().map(ToString::to_string).collect(),
        events_dropped: node.history.get().map_or(0, crate::history::Sink::dropped),
    })
}

/// The container ID of the ledger's attachment for pod `namespace/name` (recorded from the
/// K8S_POD_* keys of a CRI runtime's ADD).
async fn pod_container(node: &Node, namespace: &str, name: &str) -> Result<String, ShimError> {
    let (ns, n) = (namespace.to_owned(), name.to_owned());
    let found = node
        .core
        .ledger(move |l| {
            Ok(l.list(None)?
                .into_iter()
                .filter(|r| {
                    r.cri_pod
                        .as_ref()
                        .is_some_and(|p| p.namespace == ns && p.name == n)
                })
                .max_by_key(|r| r.updated_at)
                .map(|r| r.key.container_id))
        })
        .await?;
    found.ok_or_else(|| {
        ShimError::GcInput(crate::error::InputError {
            msg: format!(
                "no attachment in the ledger for pod {}/{}",
                crate::validate::shown(namespace),
                crate::validate::shown(name)
            ),
            details: crate::hints::POD_BY_NAME.into(),
        })
    })
}
