//! `dipamctl gc --from-runtime [--dry-run] [--force] [--kept [N]]`: the runtime-aware GC's
//! next pass, planned (what it would free, and how many it keeps and why) or run now. The
//! kept attachments themselves only with `--kept`, at most N of them: at 10,000 attachments
//! a line for each was megabytes of dipamd's reply (docs/performance.md, run 41).

use std::io::Write;

use dipam_proto::v1::{RuntimeGcItem, RuntimeGcReply, RuntimeGcRequest, admin_client::AdminClient};
use serde_json::json;
use tonic::transport::Channel;

use super::{
    error::CtlError,
    output::{self, GcRow, Progress, table},
};

/// What the operator asks of the pass.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub dry_run: bool,
    pub force: bool,
    /// How many kept attachments to list (0: the counts only).
    pub kept: u32,
}

pub async fn run(
    channel: Channel,
    ask: Ask,
    json: bool,
    progress: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let Ask {
        dry_run,
        force,
        kept,
    } = ask;
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
            kept_limit: kept,
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

/// How many the pass keeps: every one of them, listed or not (a dipamd older than the
/// counts sends none, and every kept line).
fn kept_total(reply: &RuntimeGcReply) -> u64 {
    reply.kept_total.max(reply.kept.len() as u64)
}

/// "listed 9740, first-miss 5": the reasons, most common first.
fn by_reason(reply: &RuntimeGcReply) -> String {
    let mut counts: Vec<(&str, u64)> = reply
        .kept_by_reason
        .iter()
        .map(|k| (k.reason.as_str(), k.count))
        .collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    counts
        .iter()
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
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
    let more = kept_total(reply) - reply.kept.len() as u64;
    if json {
        let by_reason: serde_json::Map<String, serde_json::Value> = reply
            .kept_by_reason
            .iter()
            .map(|k| (k.reason.clone(), json!(k.count)))
            .collect();
        let v = json!({
            "endpoint": reply.endpoint,
            "dryRun": dry_run,
            "refused": reply.refused,
            "refusedDetail": reply.refused_detail,
            "sandboxes": reply.sandboxes,
            "items": reply.items.iter().map(fields).collect::<Vec<_>>(),
            "kept": reply.kept.iter().map(fields).collect::<Vec<_>>(),
            "keptTotal": kept_total(reply),
            "keptByReason": by_reason,
            "keptNotListed": more,
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
    // What goes first, then what stays (as many as --kept asked): an operator looking for
    // why a pod's attachment is not freed (or is) finds it with its reason.
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
    if !rows.is_empty() {
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
    }
    if !reply.kept.is_empty() && more > 0 {
        writeln!(
            out,
            "and {more} more kept, not listed (--kept N lists up to N)"
        )?;
    }
    let gone = reply.items.iter().filter(|i| i.outcome != "kept").count() as u64;
    let kept = kept_total(reply) + reply.items.len() as u64 - gone;
    let reasons = by_reason(reply);
    writeln!(
        out,
        "runtime {}: {} sandbox(es) listed; {gone} {}, {kept} kept{}",
        reply.endpoint,
        reply.sandboxes,
        if dry_run {
            "would be freed by the next pass"
        } else {
            "collected"
        },
        if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({reasons})")
        },
    )?;
    if reply.kept.is_empty() && kept > 0 {
        writeln!(
            out,
            "(--kept lists the kept attachments, with their pod and reasons)"
        )?;
    }
    if !reply.refused.is_empty() {
        writeln!(out, "refused ({}): {}", reply.refused, reply.refused_detail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use dipam_proto::v1::KeepCount;

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
            kept_total: 5,
            kept_by_reason: vec![
                KeepCount {
                    reason: "first-miss".into(),
                    count: 1,
                },
                KeepCount {
                    reason: "listed".into(),
                    count: 4,
                },
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
        assert!(text.contains("and 3 more kept, not listed"), "{text}");
        assert!(
            text.contains(
                "3 sandbox(es) listed; 1 would be freed by the next pass, 5 kept (listed 4, \
                 first-miss 1)"
            ),
            "{text}"
        );

        let mut out = Vec::new();
        print(&reply(), true, true, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["dryRun"], true);
        assert_eq!(v["items"][0]["pod"]["uid"], "uid-gone");
        assert_eq!(v["kept"][1]["keep"][0], "first-miss");
        assert_eq!(v["keptTotal"], 5);
        assert_eq!(v["keptByReason"]["listed"], 4);
        assert_eq!(v["keptNotListed"], 3);

        // Without --kept: the plan and the counts, no line per kept attachment.
        let mut counts = reply();
        counts.kept.clear();
        let mut out = Vec::new();
        print(&counts, true, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            !text.contains("pod-live") && text.contains("pod-gone"),
            "{text}"
        );
        assert!(text.contains("5 kept (listed 4, first-miss 1)"), "{text}");
        assert!(text.contains("--kept lists the kept attachments"), "{text}");

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
