//! `dipamctl agent claim NAME [--family ipv4|ipv6] [--ip ADDR] [--label KEY=VALUE]...`

use std::io::Write;

use dipam_proto::v1::{AddressFamily, ClaimReply, ClaimRequest, agent_client::AgentClient};
use serde_json::json;
use tonic::transport::Channel;

use super::{address_json, row};
use crate::{CtlError, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The claim's name, unique on the node: a DNS label (a-z, 0-9, '-').
    name: String,
    /// ipv4 or ipv6; default: the family of --ip, else ipv4.
    #[arg(long, value_parser = ["ipv4", "ipv6"])]
    family: Option<String>,
    /// The address to hold (no prefix length); default: any the delegate hands out.
    #[arg(long)]
    ip: Option<String>,
    /// What the address is for, KEY=VALUE; repeat for more.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
}

/// One `--label KEY=VALUE`; anything else is a usage error (exit 2), refused before dipamd
/// is asked.
fn label(l: &str) -> Result<(String, String), NotKeyValue> {
    l.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| NotKeyValue(l.to_owned()))
}

/// A `--label` without `=`: clap prints it as the reason of its usage error.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not KEY=VALUE")]
struct NotKeyValue(String);

pub async fn run(
    args: Args,
    mut client: AgentClient<Channel>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let labels: std::collections::HashMap<_, _> = args.labels.into_iter().collect();
    let family = match args.family.as_deref() {
        Some("ipv4") => AddressFamily::Ipv4,
        Some("ipv6") => AddressFamily::Ipv6,
        _ => AddressFamily::Unspecified,
    };
    let reply = client
        .claim(ClaimRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            name: args.name,
            family: family as i32,
            ip: args.ip.unwrap_or_default(),
            labels,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    print_outcome(&reply, json, out)
}

/// The caller's claim, then its outcome as the exit status: ready is success; failed and
/// pending are not (the claim is recorded when pending, or failed for a reason other than a
/// requested IP someone holds, and dipamd keeps trying).
pub(crate) fn print_outcome(
    reply: &ClaimReply,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let Some(a) = reply.claim.as_ref() else {
        return Err(CtlError::Failed("dipamd answered without the claim".into()));
    };
    if json {
        output::json(
            out,
            &json!({
                "generation": reply.generation,
                "instanceID": reply.instance_id,
                "claim": address_json(a),
            }),
        )?;
    } else {
        output::table(
            out,
            ["NAME", "FAMILY", "IP", "STATE", "LABELS", "MESSAGE"],
            &[row(a)],
        )?;
    }
    match a.state.as_str() {
        "ready" | "released" => Ok(()),
        state => Err(CtlError::Failed(format!(
            "claim {:?} is {state}: {}",
            a.name, a.message
        ))),
    }
}
