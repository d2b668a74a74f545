//! `Admin.Gc` (`dipamctl gc`): the operator's GC of one network.

use dipam_proto::v1::{CniRequest, GcReply, GcRequest, Mode};

use crate::{
    error::ShimError,
    gc::{self, Valid},
    node::Node,
};

/// `dipamctl gc`: one network, the operator's valid list or the ledger as the valid set, and
/// a dry run that frees nothing.
pub async fn run(node: &Node, req: GcRequest) -> Result<GcReply, ShimError> {
    // The operator made the valid list before asking: nothing born since is freed.
    let began = node.core.births.gc_began(None, None);
    let p = prepare(node, &req.config, req.mode, "dipamctl-gc")?;
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
        let list = gc::parse_list(&entries, "valid").map_err(|e| {
            node.gc
                .stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            node.core.events.emit(crate::events::Event::GcRefused);
            ShimError::GcInput(e)
        })?;
        if list.is_empty() && !node.gc.policy.allow_empty {
            node.gc
                .stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            node.core.events.emit(crate::events::Event::GcRefused);
            return Err(ShimError::GcRefused {
                network: p.dc.network.clone(),
                reason: "no valid attachments given, which would free every pod of the \
                         network; pass --valid FILE or --use-ledger"
                    .into(),
            });
        }
        Valid::List(list)
    };
    let network = p.dc.network.clone();
    match gc::collect::collect(
        &node.collector(),
        &p.dc,
        "",
        valid,
        began,
        gc::collect::Run {
            dry_run: req.dry_run,
            force: req.force,
            by: crate::events::FreedBy::Operator,
        },
    )
    .await
    {
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
) -> Result<crate::core::Prepared, ShimError> {
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
        crate::access::Caller::ROOT,
    )
}
