//! `dipamctl agent list|allocate|release|watch`: the agent's own addresses (router, health,
//! ingress) through dipamd's Agent service.

use std::{io::Write, path::Path};

use clap::Subcommand;
use dipam_proto::v1::{
    AgentListReply, AgentListRequest, AgentRoleRequest, agent_client::AgentClient,
};
use serde_json::json;
use tonic::transport::Channel;

use super::{
    CtlError,
    output::{self, table},
};

pub mod watch;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every agent address: role, family, IP, gateway, state.
    List,
    /// Enable a role now and wait for its addresses (kept across restarts until the
    /// configured --agent-roles change).
    Allocate {
        /// router, health or ingress.
        role: String,
    },
    /// Disable a role now and wait until its addresses are released.
    Release {
        /// router, health or ingress.
        role: String,
    },
    /// Print the list now and again after every change, until interrupted.
    ///
    /// When dipamd stops or restarts, the watch reconnects (a note goes to stderr) and prints
    /// the new dipamd's full list first; with --no-reconnect it exits non-zero instead.
    Watch(watch::Args),
}

/// `socket` is where `channel` leads: a watch reconnects there when dipamd restarts.
pub async fn run(
    cmd: Command,
    socket: &Path,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let mut client = AgentClient::new(channel);
    let v = dipam_proto::PROTOCOL_VERSION;
    let reply = match cmd {
        Command::List => {
            client
                .list(AgentListRequest {
                    protocol_version: v,
                })
                .await
        }
        Command::Allocate { role } => {
            client
                .allocate(AgentRoleRequest {
                    protocol_version: v,
                    role,
                })
                .await
        }
        Command::Release { role } => {
            client
                .release(AgentRoleRequest {
                    protocol_version: v,
                    role,
                })
                .await
        }
        Command::Watch(args) => return watch::run(args, socket, client, json, out).await,
    };
    let reply = reply.map_err(CtlError::Rpc)?.into_inner();
    print_agent(&reply, json, out)?;
    Ok(())
}

/// One list, as a table or as one line of JSON (a watch prints one per change).
fn print_agent(r: &AgentListReply, json: bool, out: &mut dyn Write) -> std::io::Result<()> {
    if json {
        let v = json!({
            "generation": r.generation,
            "waiting": r.waiting,
            "addresses": r.addresses.iter().map(|a| json!({
                "role": a.role, "family": a.family, "ip": a.ip, "gateway": a.gateway,
                "state": a.state, "network": a.network, "containerID": a.container_id,
                "ifname": a.ifname, "message": a.message,
            })).collect::<Vec<_>>(),
        });
        return output::json_line(out, &v);
    }
    if !r.waiting.is_empty() {
        writeln!(out, "{}", r.waiting)?;
    }
    let rows: Vec<[String; 6]> = r
        .addresses
        .iter()
        .map(|a| {
            [
                a.role.clone(),
                a.family.clone(),
                if a.ip.is_empty() {
                    "-".into()
                } else {
                    a.ip.clone()
                },
                if a.gateway.is_empty() {
                    "-".into()
                } else {
                    a.gateway.clone()
                },
                a.state.clone(),
                a.message.clone(),
            ]
        })
        .collect();
    table(
        out,
        ["ROLE", "FAMILY", "IP", "GATEWAY", "STATE", "MESSAGE"],
        &rows,
    )
}
