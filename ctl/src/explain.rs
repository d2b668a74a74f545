//! `dipamctl explain <container-id>`: a container's attachments and the full history of what
//! dipamd did for it: every request with its outcome, every delegate exec with argv,
//! environment, exit status, stderr excerpt and duration, and who freed what. By IP, also
//! every earlier holding of the address, each with who freed it (the holders' histories).

use std::{io::Write, net::IpAddr};

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
    /// every holding of it the history shows: when given, and when, by whom and why freed).
    container_id: String,
}

pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let asked = args.container_id;
    let mut client = AdminClient::new(channel);
    let r = ask(&mut client, &asked).await?;
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
    let holdings = match asked.parse::<IpAddr>() {
        Ok(ip) => holdings_of(&mut client, ip, &container_id, &r, &events).await,
        Err(_) => Vec::new(),
    };
    if json {
        output::json(out, &to_json(&container_id, &r, events, &holdings))?;
    } else {
        table(&container_id, &r, &events, &holdings, out)?;
    }
    Ok(())
}

async fn ask(
    client: &mut AdminClient<Channel>,
    container_id: &str,
) -> Result<ExplainReply, CtlError> {
    Ok(client
        .explain(ExplainRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            container_id: container_id.to_owned(),
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner())
}

/// One container's holding of an address, as its history shows it.
#[derive(Debug, Clone, PartialEq)]
struct Holding {
    container_id: String,
    /// When a request of its was answered with the address (`None`: the history no longer
    /// keeps that request, only the freeing).
    given_at_ms: Option<u64>,
    /// When, by whom and why it was freed: the `freed` entry of its history.
    freed: Option<Value>,
    /// It holds the address now (its ledger record says so).
    now: bool,
    /// Why its history could not be read.
    error: Option<String>,
}

/// Every holding of `ip` by the containers the history shows it given to, oldest holder
/// first: each with who freed it. dipamd answers one container per request, so each earlier
/// holder's history is asked for in turn.
async fn holdings_of(
    client: &mut AdminClient<Channel>,
    ip: IpAddr,
    explained: &str,
    r: &ExplainReply,
    events: &[Value],
) -> Vec<Holding> {
    let mut out = Vec::new();
    let holds_now = |cid: &str| {
        r.attachments
            .iter()
            .any(|a| a.container_id == cid && a.ips.iter().any(|c| is_ip(c, ip)))
    };
    for cid in &r.earlier_holders {
        let theirs: Result<Vec<Value>, CtlError> = if cid == explained {
            Ok(events.to_vec())
        } else {
            ask(client, cid).await.map(|x| {
                x.events
                    .iter()
                    .filter_map(|e| serde_json::from_str(e).ok())
                    .collect()
            })
        };
        match theirs {
            Ok(ev) => out.extend(spans(cid, ip, &ev, holds_now(cid))),
            Err(e) => out.push(Holding {
                container_id: cid.clone(),
                given_at_ms: None,
                freed: None,
                now: false,
                error: Some(e.to_string()),
            }),
        }
    }
    out
}

/// The holdings of `ip` in one container's history (oldest first): opened by a request
/// answered with it, closed by the `freed` entry that names it. `now`: the last one open is
/// the holding of today.
fn spans(cid: &str, ip: IpAddr, events: &[Value], now: bool) -> Vec<Holding> {
    let names = |ips: &Value| {
        ips.as_array()
            .is_some_and(|a| a.iter().filter_map(Value::as_str).any(|c| is_ip(c, ip)))
    };
    let mut out: Vec<Holding> = Vec::new();
    let mut open: Option<Holding> = None;
    for e in events {
        let at = e["atMs"].as_u64();
        if e["kind"] == "freed" && names(&e["ips"]) {
            let mut h = open.take().unwrap_or(Holding {
                container_id: cid.to_owned(),
                given_at_ms: None,
                freed: None,
                now: false,
                error: None,
            });
            h.freed = Some(e.clone());
            out.push(h);
        } else if open.is_none()
            && e.get("result").is_some_and(|r| {
                dipam_shim::l2_core::delegate::config::result_addrs(r).contains(&ip)
            })
        {
            open = Some(Holding {
                container_id: cid.to_owned(),
                given_at_ms: at,
                freed: None,
                now: false,
                error: None,
            });
        }
    }
    if let Some(mut h) = open {
        h.now = now;
        out.push(h);
    }
    out
}

/// Whether `cidr` (`10.9.0.5/24`, or a bare address) is the address `ip`, however written.
fn is_ip(cidr: &str, ip: IpAddr) -> bool {
    cidr.split('/')
        .next()
        .and_then(|a| a.parse::<IpAddr>().ok())
        == Some(ip)
}

fn holding_json(h: &Holding) -> Value {
    let at = |ms: Option<u64>| ms.map(dipam_shim::l1_leaves::clock::rfc3339_ms);
    let freed_at = h.freed.as_ref().and_then(|f| f["atMs"].as_u64());
    json!({
        "containerID": h.container_id,
        "givenAtMs": h.given_at_ms, "givenAt": at(h.given_at_ms),
        "holdsNow": h.now,
        "freedAtMs": freed_at, "freedAt": at(freed_at),
        "freedBy": h.freed.as_ref().map(|f| f["by"].clone()),
        "reason": h.freed.as_ref().map(|f| f["reason"].clone()),
        "error": h.error,
    })
}

/// One holding on one line: when given, and when, by whom and why freed.
fn holding_line(h: &Holding) -> String {
    let given = h.given_at_ms.map_or_else(
        || "given before what the history keeps".to_owned(),
        |ms| format!("given {}", dipam_shim::l1_leaves::clock::rfc3339_ms(ms)),
    );
    let end = match (&h.freed, &h.error) {
        (_, Some(e)) => format!("its history could not be read: {e}"),
        (Some(f), _) => format!(
            "freed {} by {}: {}",
            dipam_shim::l1_leaves::clock::rfc3339_ms(f["atMs"].as_u64().unwrap_or_default()),
            f["by"].as_str().unwrap_or_default(),
            f["reason"].as_str().unwrap_or_default()
        ),
        (None, _) if h.now => "holds it now".to_owned(),
        (None, _) => "no freeing recorded (the history may have lost it: a dipamd killed \
                      within a second of it, or one older than the freed entries)"
            .to_owned(),
    };
    format!("{}: {given}; {end}", h.container_id)
}

fn to_json(
    container_id: &str,
    r: &ExplainReply,
    events: Vec<Value>,
    holdings: &[Holding],
) -> Value {
    json!({
        "containerID": container_id,
        "earlierHolders": r.earlier_holders,
        "holdings": holdings.iter().map(holding_json).collect::<Vec<_>>(),
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
                e["at"] = dipam_shim::l1_leaves::clock::rfc3339_ms(ms).into();
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
    holdings: &[Holding],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(out, "container {container_id}")?;
    if !holdings.is_empty() {
        writeln!(
            out,
            "  the history shows the address given to (oldest first):"
        )?;
        for h in holdings {
            writeln!(out, "    {}", holding_line(h))?;
        }
    } else if !r.earlier_holders.is_empty() {
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
    let at = dipam_shim::l1_leaves::clock::rfc3339_ms(e["atMs"].as_u64().unwrap_or_default());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holding_opens_at_the_answer_and_closes_at_its_freeing() {
        let ip: IpAddr = "10.9.0.5".parse().unwrap();
        let given = json!({"kind": "request", "op": "ADD", "atMs": 10,
            "result": {"ips": [{"address": "10.9.0.5/24"}]}});
        let other = json!({"kind": "freed", "by": "del", "atMs": 15, "ips": ["10.9.0.6/24"]});
        let freed = json!({"kind": "freed", "by": "runtime-gc", "atMs": 20,
            "ips": ["10.9.0.5/24"], "reason": "gone"});
        let again = json!({"kind": "request", "op": "ADD", "atMs": 30,
            "result": {"ips": [{"address": "10.9.0.5/24"}]}});
        let h = spans("c", ip, &[given, other, freed, again], true);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[0].given_at_ms, Some(10));
        assert_eq!(h[0].freed.as_ref().unwrap()["by"], "runtime-gc");
        assert!(!h[0].now);
        assert_eq!(h[1].given_at_ms, Some(30));
        assert!(h[1].freed.is_none() && h[1].now);
        assert!(holding_line(&h[0]).contains("by runtime-gc: gone"));
        assert!(holding_line(&h[1]).ends_with("holds it now"));
        // A freeing whose ADD the history no longer keeps still says who freed it.
        let only = json!({"kind": "freed", "by": "del", "atMs": 5, "ips": ["10.9.0.5/32"]});
        let h = spans("c", ip, &[only], false);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].given_at_ms, None);
        assert!(holding_line(&h[0]).contains("before what the history keeps"));
    }
}
