//! The gRPC client: one connection per try, one call, one deadline; a call dipamd did not
//! serve is tried again within it (crate::retry).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dipam_proto::v1::{CniReply, CniRequest, cni_client::CniClient, cni_reply::Outcome};
use rscni_types::types::Cmd;

use crate::{
    error::PluginError,
    retry::{self, Budget},
};

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

/// Sends `req` for `cmd` within `budget` and turns the reply into an [`Answer`] or a
/// [`PluginError`].
pub fn call_reply(
    socket: &Path,
    budget: Budget,
    cmd: Cmd,
    req: CniRequest,
) -> Result<Answer, PluginError> {
    let rt = runtime(socket)?;
    let reply = rt.block_on(retry::until_served(
        budget,
        |left| within(socket, left, exchange(socket, cmd, req.clone())),
        |e| refused(socket, e),
        || dipam_proto::spool::lock_held(socket),
    ))?;
    outcome(reply)
}

/// `e`, or dipamd's refusal at accept when that is what broke the call: a non-root caller
/// whose connection ended without an answer asks dipamd why (docs/cfp.md §8.3). Root is
/// never refused at accept, and a connection lost to a dipamd restart stays what it was
/// (11, retried; a DEL spooled), as does anything dipamd answered.
fn refused(socket: &Path, e: PluginError) -> PluginError {
    let uid = nix::unistd::getuid();
    if uid.is_root() || !e.daemon_unreachable() {
        return e;
    }
    let seen = match &e {
        PluginError::Rpc { status, .. } => dipam_proto::refused_at_accept(status),
        _ => None,
    };
    match seen.or_else(|| dipam_proto::probe_refusal(socket, dipam_proto::PROBE_TIMEOUT)) {
        Some(why) => PluginError::Refused {
            socket: socket.to_owned(),
            uid: uid.as_raw(),
            why,
        },
        None => e,
    }
}

/// What a main-mode ADD (`AddEarly`) got first from dipamd.
pub enum Early {
    /// The ADD's outcome: a replayed answer (durable already), any error, or the answer of
    /// an older dipamd (plain `Add`).
    Done(Answer),
    /// A fresh result whose commit is still running: configure the pod with it, but print it
    /// only once [`Pending::finish`] says the ADD succeeded.
    Pending(Answer, Box<Pending>),
}

/// The rest of an `AddEarly` stream: its last reply, the ADD's outcome.
pub struct Pending {
    rt: tokio::runtime::Runtime,
    stream: tonic::Streaming<CniReply>,
    socket: PathBuf,
    deadline: Instant,
}

impl Pending {
    /// Waits for the ADD's outcome. A stream that ends without it (dipamd died before or
    /// during the commit) is a failure the runtime should retry: whatever was configured
    /// with the early result must be undone.
    pub fn finish(mut self) -> Result<Answer, PluginError> {
        let socket = self.socket.clone();
        let left = self.deadline.saturating_duration_since(Instant::now());
        let last = self.rt.block_on(within(&socket, left, async {
            self.stream
                .message()
                .await
                .map_err(|status| PluginError::Rpc {
                    socket: socket.clone(),
                    status,
                })
        }))?;
        match last {
            Some(reply) => outcome(reply),
            None => Err(PluginError::Rpc {
                socket,
                status: tonic::Status::unavailable(
                    "dipamd ended the ADD without its outcome (it stopped during the commit)",
                ),
            }),
        }
    }
}

/// Sends a main-mode ADD as `AddEarly`, falling back to `Add` on a dipamd that predates it.
/// A try that is cut off before the first reply (dipamd restarting) is tried again: nothing
/// was configured with it yet.
pub fn call_add_early(
    socket: &Path,
    budget: Budget,
    req: CniRequest,
) -> Result<Early, PluginError> {
    let deadline = budget.deadline;
    let rt = runtime(socket)?;
    let first = rt.block_on(retry::until_served(
        budget,
        |left| within(socket, left, first_reply(socket, req.clone())),
        |e| refused(socket, e),
        || dipam_proto::spool::lock_held(socket),
    ))?;
    match first {
        (reply, Some(stream)) if reply.pending_commit => Ok(Early::Pending(
            outcome(reply)?,
            Box::new(Pending {
                rt,
                stream,
                socket: socket.to_owned(),
                deadline,
            }),
        )),
        (reply, _) => outcome(reply).map(Early::Done),
    }
}

/// One try of an `AddEarly`: its first reply, and the stream its outcome comes on.
async fn first_reply(
    socket: &Path,
    req: CniRequest,
) -> Result<(CniReply, Option<tonic::Streaming<CniReply>>), PluginError> {
    let mut client = connect(socket).await?;
    let rpc = |status| PluginError::Rpc {
        socket: socket.to_owned(),
        status,
    };
    match client.add_early(req.clone()).await {
        Ok(stream) => {
            let mut stream = stream.into_inner();
            match stream.message().await.map_err(rpc)? {
                Some(reply) => Ok((reply, Some(stream))),
                None => Err(rpc(tonic::Status::unavailable(
                    "dipamd ended the ADD without an answer",
                ))),
            }
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            let reply = client.add(req).await.map_err(rpc)?;
            Ok((reply.into_inner(), None))
        }
        Err(status) => Err(rpc(status)),
    }
}

/// The plugin's I/O runtime: one thread, this one.
fn runtime(socket: &Path) -> Result<tokio::runtime::Runtime, PluginError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| PluginError::Unreachable {
            socket: socket.to_owned(),
            reason: format!("cannot start the I/O runtime: {e}"),
            kind: None,
            waited: None,
        })
}

/// `f`, or a deadline error after `timeout`.
async fn within<T>(
    socket: &Path,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, PluginError>>,
) -> Result<T, PluginError> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(PluginError::Rpc {
            socket: socket.to_owned(),
            status: tonic::Status::deadline_exceeded(format!(
                "no answer within {:.0}s",
                timeout.as_secs_f64()
            )),
        }),
    }
}

/// A reply as an [`Answer`], or its CNI error.
fn outcome(reply: CniReply) -> Result<Answer, PluginError> {
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

async fn connect(socket: &Path) -> Result<CniClient<tonic::transport::Channel>, PluginError> {
    let channel = dipam_proto::connect(socket)
        .await
        .map_err(|e| PluginError::Unreachable {
            socket: socket.to_owned(),
            reason: dipam_proto::root_cause(&e),
            kind: dipam_proto::io_kind(&e),
            waited: None,
        })?;
    Ok(CniClient::new(channel))
}

async fn exchange(socket: &Path, cmd: Cmd, req: CniRequest) -> Result<CniReply, PluginError> {
    let mut client = connect(socket).await?;
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
