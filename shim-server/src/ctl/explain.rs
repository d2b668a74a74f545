//! `dipamctl explain <container-id>`: a container's attachments and the full history of what
//! dipamd did for it: every request with its outcome, every delegate exec with argv,
//! environment, exit status, stderr excerpt and duration.

use std::io::Write;

use dipam_proto::v1::{ExplainReply, ExplainRequest, admin_client::AdminClient};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{error::CtlError, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// What names the container: its ID (CNI_CONTAINERID) or a unique prefix of it (as
    /// crictl prints them, 4 characters at least); a Kubernetes pod as NAMESPACE/NAME (for
    /// attachments a CRI runtime made, which carry the pod's name); or an IP address (the
    /// container that holds it now, else the last one the history shows it given to, and
    /// every earlier one).
    container_id: String,
}

pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let asked = args.container_id;
    let r = AdminClient::new(channel)
        .explain(ExplainRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            container_id: asked.clone(),
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    // What the IP, prefix or pod name resolved to (an older dipamd leaves it empty).
    let container_id = if r.container_id.is_empty() {
        asked.clone()
    } else {
        r.container_id.clone()
    };
    let events: Vec<serde_json::Value> = r
        .events
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    // An ID dipamd knows nothing of is most often a typo or another node's pod: a script
    // must not take an empty answer for "this container is fine".
    if r.attachments.is_empty() && events.is_empty() {
        return Err(CtlError::Failed(format!(
            "dipamd knows nothing of container {container_id:?}: no attachment in the ledger \
             and no history (the history keeps the last requests of each container; \
             `dipamctl attachments` lists the ledger's)"
        )));
    }
    if json {
        output::json(out, &to_json(&container_id, &r, events))?;
    } else {
        table(&container_id, &r, &events, out)?;
    }
    Ok(())
}

fn to_json(container_id: &str, r: &ExplainReply, events: Vec<Value>) -> Value {
    json!({
        "containerID": container_id,
        "earlierHolders": r.earlier_holders,
        "attachments": r.attachments.iter().map(|a| json!({
            "network": a.network, "ifname": a.ifname, "owner": a.owner,
            "state": a.state, "ips": a.ips, "delegate": a.delegate_type,
            "containerID": a.container_id,
            "pod": (!a.pod_uid.is_empty()).then(|| json!({
                "namespace": a.pod_namespace, "name": a.pod_name, "uid": a.pod_uid,
            })),
            "delegateKey": (!a.delegate_container_id.is_empty()).then(|| json!({
                "containerID": a.delegate_container_id, "ifname": a.delegate_ifname,
            })),
        })).collect::<Vec<_>>(),
        // Each event keeps `atMs` (Unix ms, for scripts) and gains `at` (RFC 3339, for people).
        "events": events.into_iter().map(|mut e| {
            if let Some(ms) = e["atMs"].as_u64() {
                e["at"] = crate::clock::rfc3339_ms(ms).into();
            }
            e
        }).collect::<Vec<_>>(),
        "eventsDropped": r.events_dropped,
    })
}

fn table(
    container_id: &str,
    r: &ExplainReply,
    events: &[Value],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(out, "container {container_id}")?;
    if !r.earlier_holders.is_empty() {
        writeln!(
            out,
            "  the history shows the address given to: {}",
            r.earlier_holders.join(", ")
        )?;
    }
    if r.attachments.is_empty() {
        writeln!(out, "  no attachment in the ledger now")?;
    }
    for a in &r.attachments {
        // A warm-pool ID finds the pod its address went to.
        let mut note = String::new();
        if a.container_id != container_id {
            note.push_str(&format!(", container {}", a.container_id));
        }
        if !a.pod_uid.is_empty() {
            note.push_str(&format!(
                ", made through CRI for pod {}/{} (uid {})",
                a.pod_namespace, a.pod_name, a.pod_uid
            ));
        }
        if !a.delegate_container_id.is_empty() {
            note.push_str(&format!(
                ", held by the delegate as {}/{} (warm pool)",
                a.delegate_container_id, a.delegate_ifname
            ));
        }
        writeln!(
            out,
            "  {}/{}: {} {} via {} ({}){note}",
            a.network,
            a.ifname,
            a.state,
            a.ips.join(","),
            a.delegate_type,
            a.owner,
        )?;
    }
    writeln!(out, "history ({} event(s), oldest first):", events.len())?;
    for e in events {
        event(e, out)?;
    }
    Ok(())
}

/// One history event on one line (an exec adds its environment on a second).
fn event(e: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let at = crate::clock::rfc3339_ms(e["atMs"].as_u64().unwrap_or_default());
    let ms = e["durationMs"].as_f64().unwrap_or_default();
    match e["kind"].as_str() {
        Some("exec") => {
            writeln!(
                out,
                "  {at} exec {} {} ({:.1} ms): {}{}",
                e["argv"][0].as_str().unwrap_or_default(),
                e["env"]["CNI_COMMAND"].as_str().unwrap_or_default(),
                ms,
                e["exit"]
                    .as_str()
                    .or(e["error"].as_str())
                    .unwrap_or_default(),
                e["stderr"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(|s| format!("; stderr: {s}"))
                    .unwrap_or_default()
            )?;
            writeln!(out, "      env: {}", e["env"])?;
        }
        Some("freed") => writeln!(
            out,
            "  {at} freed {}/{} {} by {}: {}",
            e["network"].as_str().unwrap_or_default(),
            e["ifname"].as_str().unwrap_or_default(),
            e["ips"],
            e["by"].as_str().unwrap_or_default(),
            e["reason"].as_str().unwrap_or_default()
        )?,
        _ => writeln!(
            out,
            "  {at} {} {}/{} request {} ({:.1} ms): {}{}",
            e["op"].as_str().unwrap_or_default(),
            e["network"].as_str().unwrap_or_default(),
            e["ifname"].as_str().unwrap_or_default(),
            e["requestId"].as_str().unwrap_or_default(),
            ms,
            e["outcome"].as_str().unwrap_or_default(),
            e["msg"]
                .as_str()
                .map(|m| format!(" (code {}: {m})", e["code"]))
                .unwrap_or_default()
        )?,
    }
    Ok(())
}
