//! `dipamctl agent list|claim|unclaim|allocate|release|watch`: the agent's own addresses (its
//! claims, the router, health and ingress roles' among them) through dipamd's Agent service.

use std::io::Write;

use clap::Subcommand;
use dipam_proto::v1::{
    AgentAddress, AgentListReply, AgentListRequest, AgentRoleRequest, agent_client::AgentClient,
};
use serde_json::json;
use tonic::transport::Channel;

use super::{
    error::CtlError,
    output::{self, table},
};
use dipam_shim::l1_leaves::clock::rfc3339_ms;

pub mod claim;
pub mod unclaim;
pub mod watch;

/// `dipamctl agent [--socket PATH] [--json] <command>`: the flags are global within `agent`, so
/// they may come before or after the command's name.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub conn: super::Connection,
    #[command(flatten)]
    pub format: super::Format,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every claim (the roles' and the agent's): name, family, IP, state, labels, message.
    List,
    /// Claim a named address (an egress IP, a static node IP, an ingress IP per listener),
    /// optionally a specific one, and wait until it is held; exits non-zero when it could not
    /// be (the reason is printed). The same claim again answers the same address.
    Claim(claim::Args),
    /// Release a claim and forget it; waits until the delegate has released the address.
    Unclaim(unclaim::Args),
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

/// `channel` leads to `args.conn.socket`: a watch reconnects there when dipamd restarts.
pub async fn run(args: Args, channel: Channel, out: &mut dyn Write) -> Result<(), CtlError> {
    let (socket, json) = (&args.conn.socket, args.format.json);
    let mut client = AgentClient::new(channel);
    let v = dipam_proto::PROTOCOL_VERSION;
    let reply = match args.command {
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
        Command::Claim(args) => return claim::run(args, client, json, out).await,
        Command::Unclaim(args) => return unclaim::run(args, client, json, out).await,
    };
    let reply = reply.map_err(CtlError::Rpc)?.into_inner();
    print_agent(&reply, None, json, out)?;
    Ok(())
}

/// One address as JSON: the fields of `dipamctl agent list --json`'s entries.
pub(crate) fn address_json(a: &AgentAddress) -> serde_json::Value {
    let labels: std::collections::BTreeMap<_, _> = a.labels.iter().collect();
    json!({
        "name": a.name, "role": a.role, "family": a.family, "ip": a.ip, "gateway": a.gateway,
        "state": a.state, "network": a.network, "containerID": a.container_id,
        "ifname": a.ifname, "message": a.message, "labels": labels,
        "requestedIP": a.requested_ip, "changed": a.changed, "previousIP": a.previous_ip,
        "predefined": a.predefined,
    })
}

/// Labels as `k=v,k2=v2` for a table.
pub(crate) fn labels_text(a: &AgentAddress) -> String {
    let labels: std::collections::BTreeMap<_, _> = a.labels.iter().collect();
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One list, as a table or as one line of JSON (a watch prints one per change). `at`, the
/// time (ms since the epoch) a watch received it, goes first: an operator reading a long
/// watch sees when each change came (`at` in RFC 3339 UTC, `atMs` beside it in JSON).
fn print_agent(
    r: &AgentListReply,
    at: Option<u64>,
    json: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    if json {
        let mut v = json!({
            "generation": r.generation,
            "instanceID": r.instance_id,
            "waiting": r.waiting,
            "addresses": r.addresses.iter().map(address_json).collect::<Vec<_>>(),
        });
        if let Some(ms) = at {
            v["at"] = json!(rfc3339_ms(ms));
            v["atMs"] = json!(ms);
        }
        return output::json_line(out, &v);
    }
    if let Some(ms) = at {
        writeln!(out, "{}  generation {}", rfc3339_ms(ms), r.generation)?;
    }
    if !r.waiting.is_empty() {
        writeln!(out, "{}", r.waiting)?;
    }
    let rows: Vec<[String; 6]> = r.addresses.iter().map(row).collect();
    table(
        out,
        ["NAME", "FAMILY", "IP", "STATE", "LABELS", "MESSAGE"],
        &rows,
    )
}

/// A table row: a changed address says so, with the one it replaced.
pub(crate) fn row(a: &AgentAddress) -> [String; 6] {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    let mut message = a.message.clone();
    if a.changed {
        let note = format!("changed from {}", a.previous_ip);
        message = if message.is_empty() {
            note
        } else {
            format!("{note}; {message}")
        };
    }
    [
        dash(&a.name),
        a.family.clone(),
        dash(&a.ip),
        a.state.clone(),
        labels_text(a),
        message,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> AgentListReply {
        AgentListReply {
            generation: 7,
            instance_id: "i-1".into(),
            addresses: vec![AgentAddress {
                name: "router-ipv4".into(),
                family: "ipv4".into(),
                ip: "10.1.0.2".into(),
                state: "ready".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_watched_list_says_when_it_came_and_a_listed_one_does_not() {
        let at = 1_795_504_500_007;
        let mut out = Vec::new();
        print_agent(&list(), Some(at), false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("2026-11-24T07:15:00.007Z  generation 7"));
        assert!(lines.next().unwrap().starts_with("NAME"), "{text}");

        let mut out = Vec::new();
        print_agent(&list(), Some(at), true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["at"], "2026-11-24T07:15:00.007Z");
        assert_eq!(v["atMs"], at);

        let mut out = Vec::new();
        print_agent(&list(), None, true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v.get("at").is_none() && v.get("atMs").is_none(), "{v}");
        let mut out = Vec::new();
        print_agent(&list(), None, false, &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().starts_with("NAME"));
    }
}
