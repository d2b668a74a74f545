//! The gRPC client: one connection, one call, one deadline.

use std::{path::Path, time::Duration};

use dipam_proto::v1::{CniReply, CniRequest, cni_client::CniClient, cni_reply::Outcome};
use rscni_types::types::Cmd;

use crate::error::PluginError;

/// What dipamd answered, when it answered with success.
#[derive(Debug, Default)]
pub struct Answer {
    /// The result bytes (empty for verbs without output).
    pub result: Vec<u8>,
    /// DEL: dipamd took over deleting the request's retired link.
    pub retired_link_taken: bool,
    /// ADD: answered from the ledger (a repeated ADD); `None` from daemons that do not say.
    pub replayed: Option<bool>,
}

/// Sends `req` for `cmd` and turns the reply into an [`Answer`] or a [`PluginError`].
pub fn call_reply(
    socket: &Path,
    timeout: Duration,
    cmd: Cmd,
    req: CniRequest,
) -> Result<Answer, PluginError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| PluginError::Unreachable {
            socket: socket.to_owned(),
            reason: format!("cannot start the I/O runtime: {e}"),
        })?;
    let reply = rt.block_on(async {
        match tokio::time::timeout(timeout, exchange(socket, cmd, req)).await {
            Ok(r) => r,
            Err(_) => Err(PluginError::Rpc {
                socket: socket.to_owned(),
                status: tonic::Status::deadline_exceeded(format!(
                    "no answer within {:.0}s",
                    timeout.as_secs_f64()
                )),
            }),
        }
    })?;
    let (retired_link_taken, replayed) = (reply.retired_link_taken, reply.replayed);
    let answer = |result| Answer {
        result,
        retired_link_taken,
        replayed,
    };
    match reply.outcome {
        Some(Outcome::Result(bytes)) => Ok(answer(bytes)),
        Some(Outcome::Error(e)) => Err(PluginError::Cni {
            code: e.code,
            msg: e.msg,
            details: e.details,
        }),
        None => Ok(answer(Vec::new())),
    }
}

async fn exchange(socket: &Path, cmd: Cmd, req: CniRequest) -> Result<CniReply, PluginError> {
    let channel = dipam_proto::connect(socket)
        .await
        .map_err(|e| PluginError::Unreachable {
            socket: socket.to_owned(),
            reason: root_cause(&e),
        })?;
    let mut client = CniClient::new(channel);
    let reply = match cmd {
        Cmd::Add => client.add(req).await,
        Cmd::Del => client.del(req).await,
        Cmd::Check => client.check(req).await,
        Cmd::Gc => client.gc(req).await,
        Cmd::Status | Cmd::Version => client.status(req).await,
    };
    reply
        .map(tonic::Response::into_inner)
        .map_err(|status| PluginError::Rpc {
            socket: socket.to_owned(),
            status,
        })
}

/// The innermost error text ("No such file or directory (os error 2)"): what an operator
/// needs, without tonic's "transport error" wrapping.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
