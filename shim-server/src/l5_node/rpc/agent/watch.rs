//! `Agent.Watch` (`dipamctl agent watch`): the agent's list, then every change, until the
//! watcher goes away or dipamd stops.

use std::sync::Arc;

use dipam_proto::v1::AgentListReply;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::l5_node::node::Node;

/// The message of the UNAVAILABLE that ends every `Agent.Watch` when dipamd stops (server/mod.rs
/// closes the watches).
pub const STOPPING: &str =
    "dipamd is shutting down; reconnect: the next dipamd sends the full list first";

/// The current list first, then every change: an agent that (re)connects never misses the
/// state it must act on. The forwarding task ends when the watcher goes away, or with
/// UNAVAILABLE when dipamd stops: the stream must end for the server to drain, and UNAVAILABLE
/// is the code that tells a gRPC client to reconnect (the next dipamd sends the full list
/// first).
pub fn run(node: Arc<Node>) -> ReceiverStream<Result<AgentListReply, Status>> {
    let mut rx = node.agent.subscribe();
    let (tx, out) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let closed = node.agent.watches_closed();
        tokio::pin!(closed);
        loop {
            let current = rx.borrow_and_update().clone();
            let next = async { tx.send(Ok(current)).await.is_ok() && rx.changed().await.is_ok() };
            tokio::select! {
                biased;
                () = &mut closed => {
                    let _ = tx.send(Err(Status::unavailable(STOPPING))).await;
                    return;
                }
                more = next => if !more { return },
            }
        }
    });
    ReceiverStream::new(out)
}
