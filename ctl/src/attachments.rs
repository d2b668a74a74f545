//! `dipamctl attachments`: every attachment in the ledger (network, container, interface,
//! owner, state, delegate, addresses), optionally of one network or one owner.

use std::io::Write;

use dipam_proto::v1::{Attachment, ListAttachmentsRequest, admin_client::AdminClient};
use serde_json::json;
use tonic::transport::Channel;

use super::{
    error::CtlError,
    output::{self, short, table},
};

// The doc comments below are clap's help text (plain text, shown by --help and the man
// pages): `<name>` there is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this network.
    #[arg(long)]
    network: Option<String>,
    /// Only this owner: "pod", "agent", "agent:<role>", or "pool" (the warm pool's entries).
    #[arg(long)]
    owner: Option<String>,
    /// Attachments asked of dipamd per request (it sends at most 1000 a reply). The listing
    /// is read a page at a time and printed whole at the end; it is not a snapshot: an
    /// attachment present for the whole listing appears exactly once, one added or removed
    /// meanwhile may or may not.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1000))]
    page_size: u32,
}

/// Every page of the listing `args` asks for, in key order.
async fn list(args: Args, channel: Channel) -> Result<Vec<Attachment>, CtlError> {
    let mut client = AdminClient::new(channel);
    let mut all = Vec::new();
    let mut page_token = Vec::new();
    loop {
        let page = client
            .list_attachments(ListAttachmentsRequest {
                protocol_version: dipam_proto::PROTOCOL_VERSION,
                network: args.network.clone().unwrap_or_default(),
                owner: args.owner.clone().unwrap_or_default(),
                page_size: args.page_size,
                page_token,
            })
            .await
            .map_err(CtlError::Rpc)?
            .into_inner();
        all.extend(page.attachments);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let list = list(args, channel).await?;
    if json {
        let v: Vec<_> = list
            .iter()
            .map(|a| {
                let (created, created_ms) =
                    dipam_shim::l1_leaves::clock::json_time(dipam_shim::l1_leaves::clock::ms_or_secs(a.created_at_ms, a.created_at));
                let (updated, updated_ms) =
                    dipam_shim::l1_leaves::clock::json_time(dipam_shim::l1_leaves::clock::ms_or_secs(a.updated_at_ms, a.updated_at));
                json!({
                    "network": a.network, "containerID": a.container_id, "ifname": a.ifname,
                    "owner": a.owner, "state": a.state, "delegate": a.delegate_type,
                    "ips": a.ips, "netns": a.netns, "configDigest": a.config_digest,
                    "createdAt": created, "createdAtMs": created_ms,
                    "updatedAt": updated, "updatedAtMs": updated_ms,
                    "creatorUid": a.creator_uid,
                    "pod": (!a.pod_uid.is_empty()).then(|| json!({
                        "namespace": a.pod_namespace, "name": a.pod_name, "uid": a.pod_uid,
                    })),
                    "delegateKey": (!a.delegate_container_id.is_empty()).then(|| json!({
                        "containerID": a.delegate_container_id, "ifname": a.delegate_ifname,
                    })),
                    "result": serde_json::from_str::<serde_json::Value>(&a.result_json).unwrap_or(serde_json::Value::Null),
                })
            })
            .collect();
        output::json(out, &serde_json::Value::Array(v))?;
    } else {
        let rows: Vec<[String; 8]> = list
            .iter()
            .map(|a| {
                [
                    a.network.clone(),
                    short(&a.container_id),
                    a.ifname.clone(),
                    a.owner.clone(),
                    a.state.clone(),
                    if a.delegate_container_id.is_empty() {
                        a.delegate_type.clone()
                    } else {
                        format!(
                            "{} as {}/{}",
                            a.delegate_type, a.delegate_container_id, a.delegate_ifname
                        )
                    },
                    a.ips.join(","),
                    // The pod, for an attachment made through CRI.
                    if a.pod_name.is_empty() {
                        "-".to_owned()
                    } else {
                        format!("{}/{}", a.pod_namespace, a.pod_name)
                    },
                ]
            })
            .collect();
        table(
            out,
            [
                "NETWORK",
                "CONTAINER",
                "IFNAME",
                "OWNER",
                "STATE",
                "DELEGATE",
                "IPS",
                "POD",
            ],
            &rows,
        )?;
        writeln!(out, "{} attachment(s)", rows.len())?;
    }
    Ok(())
}
