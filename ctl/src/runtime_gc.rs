//! `dipamctl gc --from-runtime [--dry-run] [--force]`: the runtime-aware GC's next pass, planned
//! (what it would free and keep, and why) or run now.

use std::io::Write;

use dipam_proto::v1::{RuntimeGcItem, RuntimeGcReply, RuntimeGcRequest, admin_client::AdminClient};
use serde_json::json;
use tonic::transport::Channel;

use super::{
    error::CtlError,
    output::{self, GcRow, Progress, table},
};

pub async fn run(
    channel: Channel,
    dry_run: bool,
    force: bool,
    json: bool,
    progress: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    // A pass lists the runtime's sandboxes and frees item by item before dipamd answers.
    let spinner = Progress::spinner(
        progress,
        if dry_run {
            "gc --from-runtime: planning the next pass in dipamd"
        } else {
            "gc --from-runtime: one pass in dipamd"
        },
    );
    let reply = AdminClient::new(channel)
        .runtime_gc(RuntimeGcRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            dry_run,
            force,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    drop(spinner);
    print(&reply, dry_run, json, out)?;
    if !reply.refused.is_empty() {
        return Err(CtlError::Failed(format!(
            "the runtime-aware GC refused ({}): {}",
            reply.refused, reply.refused_detail
        )));
    }
    Ok(())
}

fn pod(i: &RuntimeGcItem) -> String {
    if i.pod_name.is_empty() {
        "-".into()
    } else {
        format!("{}/{}", i.pod_namespace, i.pod_name)
    }
}

fn print(
    reply: &RuntimeGcReply,
    dry_run: bool,
    json: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let fields = |i: &RuntimeGcItem| {
        let mut v = GcRow::from(i).json();
        v.insert("network".into(), json!(i.network));
        v.insert("owner".into(), json!(i.owner));
        v.insert(
            "pod".into(),
            json!((!i.pod_uid.is_empty()).then(|| json!({
                "namespace": i.pod_namespace, "name": i.pod_name, "uid": i.pod_uid,
            }))),
        );
        serde_json::Value::Object(v)
    };
    if json {
        let v = json!({
            "endpoint": reply.endpoint,
            "dryRun": dry_run,
            "refused": reply.refused,
            "refusedDetail": reply.refused_detail,
            "sandboxes": reply.sandboxes,
            "items": reply.items.iter().map(fields).collect::<Vec<_>>(),
            "kept": reply.kept.iter().map(fields).collect::<Vec<_>>(),
        });
        return output::json(out, &v);
    }
    if !reply.refused.is_empty() && reply.items.is_empty() {
        writeln!(
            out,
            "runtime {}: refused ({}): {}",
            reply.endpoint, reply.refused, reply.refused_detail
        )?;
        return Ok(());
    }
    // What goes first, then what stays: an operator looking for why a pod's attachment is
    // not freed (or is) finds it with its reason.
    let rows: Vec<[String; 7]> = reply
        .items
        .iter()
        .chain(reply.kept.iter())
        .map(|i| {
            let [container, ifname, ips, outcome, reason] = GcRow::from(i).cells();
            [
                i.network.clone(),
                container,
                ifname,
                pod(i),
                ips,
                outcome,
                reason,
            ]
        })
        .collect();
    table(
        out,
        [
            "NETWORK",
            "CONTAINER",
            "IFNAME",
            "POD",
            "IPS",
            "OUTCOME",
            "REASON",
        ],
        &rows,
    )?;
    let gone = reply.items.iter().filter(|i| i.outcome != "kept").count();
    writeln!(
        out,
        "runtime {}: {} sandbox(es) listed; {gone} {}, {} kept",
        reply.endpoint,
        reply.sandboxes,
        if dry_run {
            "would be freed by the next pass"
        } else {
            "collected"
        },
        reply.kept.len() + reply.items.len() - gone,
    )?;
    if !reply.refused.is_empty() {
        writeln!(out, "refused ({}): {}", reply.refused, reply.refused_detail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> RuntimeGcReply {
        let it = |cid: &str, outcome: &str, keep: &[&str], reason: &str| RuntimeGcItem {
            network: "net-a".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            ips: vec!["10.1.0.5/24".into()],
            owner: "pod".into(),
            pod_namespace: "shop".into(),
            pod_name: format!("pod-{cid}"),
            pod_uid: format!("uid-{cid}"),
            outcome: outcome.into(),
            keep: keep.iter().map(|k| (*k).to_owned()).collect(),
            reason: reason.into(),
            error: String::new(),
        };
        RuntimeGcReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            refused: String::new(),
            refused_detail: String::new(),
            sandboxes: 3,
            items: vec![it("gone", "planned", &[], "missed twice")],
            kept: vec![
                it(
                    "live",
                    "kept",
                    &["listed"],
                    "the runtime lists its pod sandbox",
                ),
                it("new", "kept", &["first-miss"], "missed once"),
            ],
        }
    }

    #[test]
    fn the_plan_shows_what_goes_and_what_stays_with_the_pod_and_why() {
        let mut out = Vec::new();
        print(&reply(), true, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("NETWORK  CONTAINER  IFNAME  POD"),
            "{text}"
        );
        assert!(
            lines[1].contains("shop/pod-gone") && lines[1].contains("planned"),
            "{text}"
        );
        assert!(
            lines[2].contains("live") && lines[2].contains("lists its pod sandbox"),
            "{text}"
        );
        assert!(
            text.contains("3 sandbox(es) listed; 1 would be freed by the next pass, 2 kept"),
            "{text}"
        );

        let mut out = Vec::new();
        print(&reply(), true, true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["dryRun"], true);
        assert_eq!(v["items"][0]["pod"]["uid"], "uid-gone");
        assert_eq!(v["kept"][1]["keep"][0], "first-miss");

        let mut refused = reply();
        refused.items.clear();
        refused.kept.clear();
        refused.refused = "unreachable".into();
        refused.refused_detail = "cannot reach the runtime".into();
        let mut out = Vec::new();
        print(&refused, true, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("refused (unreachable): cannot reach the runtime"),
            "{text}"
        );
    }
}
