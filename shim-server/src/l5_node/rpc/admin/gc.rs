//! `Admin.Gc` (`dipamctl gc`): the operator's GC of one network.

use dipam_proto::v1::{CniRequest, GcReply, GcRequest, Mode};

use crate::{
    l1_leaves::error::ShimError,
    l3_clients::gc::{self, Valid},
    l5_node::node::Node,
};

/// `dipamctl gc`: one network, the operator's valid list or the ledger as the valid set, and
/// a dry run that frees nothing.
pub async fn run(node: &Node, req: GcRequest) -> Result<GcReply, ShimError> {
    // The operator made the valid list before asking: nothing born since is freed.
    let began = node.core.births.gc_began(None, None);
    let p = prepare(node, &req.config, req.mode, "dipamctl-gc")?;
    let admission = gc::admit::Admission::new(&node.gc, &node.core.events, &p.dc.network);
    let valid = if req.use_ledger {
        Valid::Ledger
    } else {
        // dipamctl checked the file; any local root process may call this RPC, so the entries
        // are checked again, by the same rule as a runtime's list.
        let entries = serde_json::Value::Array(
            req.valid
                .iter()
                .map(|a| serde_json::json!({"containerID": a.container_id, "ifname": a.ifname}))
                .collect(),
        );
        let list = admission.input(gc::parse_list(&entries, "valid"))?;
        Valid::List(admission.non_empty(
            list,
            "no valid attachments given",
            "; pass --valid FILE or --use-ledger",
        )?)
    };
    let network = p.dc.network.clone();
    let gc = gc::collect::Request {
        dc: &p.dc,
        cni_path: "",
        valid,
        began,
        mode: gc::collect::Mode::of(req.dry_run, req.force),
        by: crate::l1_leaves::events::FreedBy::Operator,
        // `dipamctl gc` prints every record kept, and why.
        list_kept: true,
    };
    match gc::collect::collect(&node.collector(), gc).await {
        Ok(plan) => Ok(GcReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            network,
            items: plan.items,
            refused: String::new(),
            kept: plan.kept,
        }),
        Err(ShimError::GcRefused { reason, .. }) => Ok(GcReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            network,
            items: Vec::new(),
            refused: reason,
            kept: Vec::new(),
        }),
        Err(e) => Err(e),
    }
}

/// The network an operator's RPC names: its request config (`config`, in `mode`), or dipamd's
/// own --conflist when empty; validated as a runtime's would be.
pub(super) fn prepare(
    node: &Node,
    config: &[u8],
    mode: i32,
    request_id: &str,
) -> Result<crate::l2_core::core::Prepared, ShimError> {
    let (stdin, mode) = if config.is_empty() {
        let base = node
            .agent
            .config
            .as_ref()
            .ok_or_else(|| ShimError::Config {
                msg: "no network config given".into(),
                details: "pass the network's conflist (--conflist FILE), or start dipamd with \
                          --conflist"
                    .into(),
            })?
            .source
            .load()
            .map_err(|m| ShimError::Config {
                msg: m.to_string(),
                details: String::new(),
            })?;
        (
            serde_json::to_vec(&base.request).map_err(|e| ShimError::Internal(e.to_string()))?,
            base.mode,
        )
    } else {
        (config.to_vec(), Mode::try_from(mode).unwrap_or(Mode::Ipam))
    };
    node.prepare(
        CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: request_id.into(),
            command: "GC".into(),
            stdin,
            mode: mode as i32,
            ..CniRequest::default()
        },
        false,
        crate::l1_leaves::access::Caller::ROOT,
    )
}
