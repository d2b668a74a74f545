//! The operator's RPCs (the Admin service, dipamctl): one module per RPC.

pub mod adopt;
pub mod attachments;
pub mod doctor;
pub mod explain;
pub mod gc;
pub mod runtime_gc;
pub mod status;

use dipam_proto::v1::Attachment;

use crate::l2_core::delegate::config::result_ips;

/// Whether `r` passes the owner filter `owner` ("" for all; "agent" for every role; "pool"
/// for the warm pool's entries).
fn owned_by(r: &dipam_state::AttachmentRecord, owner: &str) -> bool {
    let label = r.owner.label();
    owner.is_empty()
        || label == owner
        || label
            .strip_prefix(owner)
            .is_some_and(|role| role.starts_with(':'))
}

/// Ledger records as wire attachments, filtered by owner (as [`owned_by`]).
fn list_from(records: Vec<dipam_state::AttachmentRecord>, owner: &str) -> Vec<Attachment> {
    records
        .into_iter()
        .filter(|r| owned_by(r, owner))
        .map(|r| Attachment {
            delegate_container_id: r
                .delegate_key
                .as_ref()
                .map(|d| d.container_id.clone())
                .unwrap_or_default(),
            delegate_ifname: r
                .delegate_key
                .as_ref()
                .map(|d| d.ifname.clone())
                .unwrap_or_default(),
            ips: r.result.as_ref().map(result_ips).unwrap_or_default(),
            result_json: r
                .result
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            network: r.key.network,
            container_id: r.key.container_id,
            ifname: r.key.ifname,
            owner: r.owner.label(),
            state: r.state.as_str().into(),
            delegate_type: r.delegate_type,
            config_digest: r.config_digest,
            netns: r.netns,
            created_at: r.created_at,
            updated_at: r.updated_at,
            created_at_ms: r.created_at.saturating_mul(1000),
            updated_at_ms: r.updated_at.saturating_mul(1000),
            creator_uid: r.creator_uid,
            pod_namespace: r
                .cri_pod
                .as_ref()
                .map(|p| p.namespace.clone())
                .unwrap_or_default(),
            pod_name: r
                .cri_pod
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            pod_uid: r
                .cri_pod
                .as_ref()
                .map(|p| p.uid.clone())
                .unwrap_or_default(),
        })
        .collect()
}
