//! `Agent.Claim` and `Agent.Unclaim` (`dipamctl agent claim|unclaim`): a named address the
//! agent asks for, and its release.
//!
//! Calls finish what they start: once the request is valid, its work runs in a task of its
//! own, which the RPC only awaits. A caller that goes away, or whose deadline expires
//! (DEADLINE_EXCEEDED, service.rs), does not cut a claim off between the delegate's ADD and
//! its record, nor leave an unclaim half done: the work goes on to its end at once, and the
//! caller learns the outcome from List, Watch or the same call again (idempotent).

use std::sync::Arc;

use dipam_proto::v1::{ClaimReply, ClaimRequest, UnclaimRequest};

use crate::{
    l1_leaves::error::ShimError,
    l3_clients::agent::{claims, reconcile},
    l5_node::node::Node,
};

/// Runs `work` detached from the caller's request.
async fn detached<F>(work: F) -> Result<reconcile::Outcome, ShimError>
where
    F: std::future::Future<Output = Result<reconcile::Outcome, ShimError>> + Send + 'static,
{
    tokio::spawn(work)
        .await
        .map_err(|e| ShimError::Internal(format!("claim task: {e}")))?
}

fn reply(node: &Node, out: reconcile::Outcome) -> ClaimReply {
    let snap = node.agent.snapshot();
    ClaimReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        claim: Some(out.claim),
        generation: snap.generation,
        instance_id: snap.instance_id,
    }
}

pub async fn claim(node: Arc<Node>, req: ClaimRequest) -> Result<ClaimReply, ShimError> {
    let c = claims::validate(&req.name, req.family, &req.ip, &req.labels)?;
    let work = node.reconciler();
    let out = detached(async move { reconcile::claim(&work, c).await }).await?;
    Ok(reply(&node, out))
}

pub async fn unclaim(node: Arc<Node>, req: UnclaimRequest) -> Result<ClaimReply, ShimError> {
    claims::name(&req.name)?;
    let work = node.reconciler();
    let name = req.name;
    let out = detached(async move { reconcile::unclaim(&work, &name).await }).await?;
    Ok(reply(&node, out))
}
