//! `Admin.RuntimeGc` (`dipamctl gc --from-runtime`): the runtime-aware GC's next pass planned
//! now (`--dry-run`), or one pass run now, under the same rules as the timer's.

use dipam_proto::v1::{KeepCount, RuntimeGcReply, RuntimeGcRequest};

use crate::{l1_leaves::error::ShimError, l3_clients::gc::runtime::pass, l5_node::node::Node};

/// One pass now, or (dry run) what the next pass would free and keep, and why. A pass run
/// here is a pass like any other: it frees only what the pass before it missed too, and it
/// counts as the previous pass for the next one.
pub async fn run(node: &Node, req: RuntimeGcRequest) -> Result<RuntimeGcReply, ShimError> {
    let rt = node.gc.runtime.get().ok_or_else(|| ShimError::Config {
        msg: "dipamd runs without --cri-endpoint: the runtime-aware GC is off".into(),
        details: "start dipamd with --cri-endpoint unix:///run/containerd/containerd.sock (the \
                  runtime's CRI socket) to collect what the runtime's sandboxes no longer name; \
                  `dipamctl gc --valid FILE` collects one network by a list you give"
            .into(),
    })?;
    let report = pass::pass(
        &node.collector(),
        rt,
        req.dry_run,
        req.force,
        req.kept_limit as usize,
    )
    .await?;
    let (refused, refused_detail) = report
        .refused
        .map(|r| (r.code.to_owned(), r.detail))
        .unwrap_or_default();
    Ok(RuntimeGcReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        endpoint: report.endpoint,
        refused,
        refused_detail,
        sandboxes: report.sandboxes as u64,
        items: report.items,
        kept: report.kept,
        kept_total: report.kept_total,
        kept_by_reason: report
            .kept_by_reason
            .into_iter()
            .map(|(reason, count)| KeepCount {
                reason: reason.into(),
                count,
            })
            .collect(),
    })
}
