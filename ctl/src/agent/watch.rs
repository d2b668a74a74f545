//! `dipamctl agent watch`: the agent's address list now and after every change, across
//! dipamd's restarts.

use std::{io::Write, path::Path};

use dipam_proto::v1::{AgentListRequest, agent_client::AgentClient};
use tonic::transport::Channel;

use super::print_agent;
use crate::{CtlError, client, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Exit (status 1, with the reason) when dipamd ends the watch or goes away.
    #[arg(long)]
    no_reconnect: bool,
}

/// The longest pause between two attempts to reach dipamd again during a watch.
const WATCH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// `dipamctl agent watch`: prints every list the watch delivers. dipamd ends a watch with
/// UNAVAILABLE when it stops (gRPC's "try again"), and a restart is routine (every upgrade,
/// every `systemctl restart`), so the watch reconnects by default, announcing it on stderr,
/// and the new dipamd's first message is its full list; so it does when the connection
/// breaks (dipamd killed). Any other status from dipamd ends the watch.
pub async fn run(
    args: Args,
    socket: &Path,
    first: AgentClient<Channel>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let no_reconnect = args.no_reconnect;
    let mut first = Some(first);
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        let agent = match first.take() {
            Some(agent) => agent,
            None => match client::connect(socket).await {
                Ok(ch) => AgentClient::new(ch),
                Err(e) => {
                    if no_reconnect {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(WATCH_RETRY_MAX);
                    continue;
                }
            },
        };
        let ended = watch_once(agent, json, out).await?;
        pause = std::time::Duration::from_millis(100);
        // A status with a local cause never came from dipamd: the connection broke (dipamd
        // was killed, or crashed). Like UNAVAILABLE, that calls for a reconnect.
        let lost = std::error::Error::source(&ended).is_some();
        if !(ended.code() == tonic::Code::Unavailable || lost) || no_reconnect {
            return Err(if lost {
                CtlError::Failed(format!(
                    "the connection to dipamd was lost ({})",
                    ended.message()
                ))
            } else {
                CtlError::Rpc(ended)
            });
        }
        output::warn(
            json,
            &format!(
                "the watch ended ({}); reconnecting to {}",
                if lost {
                    format!("the connection to dipamd was lost: {}", ended.message())
                } else {
                    ended.message().to_owned()
                },
                socket.display()
            ),
        );
    }
}

/// One watch stream, until it ends: the status it ended with (a stream that ends without
/// one counts as UNAVAILABLE: dipamd went away).
async fn watch_once(
    mut client: AgentClient<Channel>,
    json: bool,
    out: &mut dyn Write,
) -> Result<tonic::Status, CtlError> {
    let mut stream = match client
        .watch(AgentListRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Ok(s),
    };
    loop {
        match stream.message().await {
            Ok(Some(item)) => {
                print_agent(
                    &item,
                    Some(dipam_shim::l1_leaves::clock::now_ms()),
                    json,
                    out,
                )?;
                out.flush()?;
            }
            Ok(None) => return Ok(tonic::Status::unavailable("dipamd closed the watch")),
            Err(s) => return Ok(s),
        }
    }
}
