use std::{sync::Arc, time::Duration};

use super::*;

/// Every series name in the exposition (samples, with their suffixes stripped back to the
/// family the HELP and TYPE lines name).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or_default();
            ["_bucket", "_count", "_sum", "_total"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

/// A call counts while its handle lives, and no longer once dropped: a DEL whose plugin
/// left drops its future, and an ADD's rollback ends with its task.
#[test]
fn a_call_is_in_flight_until_its_handle_is_dropped() {
    let m = Arc::new(Metrics::new());
    let events = crate::l1_leaves::events::Events::new(vec![
        Arc::clone(&m) as Arc<dyn crate::l1_leaves::events::Observer>
    ]);
    let line = |m: &Metrics, op: &str| {
        m.render().lines().find_map(|l| {
            l.strip_prefix(&format!("dipam_requests_in_flight{{op=\"{op}\"}} "))
                .map(str::to_owned)
        })
    };
    let add = events.in_flight("ADD");
    let del = events.in_flight("DEL");
    let second = events.in_flight("ADD");
    assert_eq!(line(&m, "ADD").as_deref(), Some("2"));
    drop(add);
    drop(del);
    assert_eq!(line(&m, "ADD").as_deref(), Some("1"));
    assert_eq!(line(&m, "DEL").as_deref(), Some("0"));
    drop(second);
    assert_eq!(line(&m, "ADD").as_deref(), Some("0"));
}

#[test]
fn events_render_with_help_and_type_on_every_series() {
    let m = Metrics::new();
    let record = serde_json::Value::Null;
    for code in ["0", "0", "152"] {
        m.observe(&Event::Request {
            op: "ADD",
            code,
            took: Duration::from_millis(3),
            container_id: "c",
            record: &record,
        });
    }
    m.observe(&Event::InFlight {
        op: "ADD",
        delta: 1,
    });
    m.observe(&Event::Exec {
        delegate: "host-local",
        command: "ADD",
        took: Duration::from_micros(1500),
        container_id: "c",
        record: &record,
    });
    m.observe(&Event::LedgerOp {
        took: Duration::from_micros(400),
    });
    m.observe(&Event::Attachments {
        network: "n\"1",
        owner: "pod",
        count: 3,
    });
    m.observe(&Event::AttachmentDelta {
        network: "n\"1",
        owner: "pod",
        delta: -1,
    });
    m.observe(&Event::AgentAddresses(&[("held", 2), ("lost", 1)]));
    m.observe(&Event::AgentAddresses(&[("held", 3)]));
    m.observe(&Event::PoolLevels(&[
        ("n", "d1", 4, 8, 3),
        ("n", "d0", 1, 0, 0),
    ]));
    m.observe(&Event::PoolLevels(&[("n", "d1", 5, 8, 3)]));
    m.observe(&Event::PoolRefilled);
    m.observe(&Event::PoolRequest { outcome: "hit" });
    // A family renders only once it has a series: the metrics listener's, bound.
    m.listener_up("tcp", true);
    m.observe(&Event::GcFreed(2));
    m.observe(&Event::SpoolDepth(7));
    m.observe(&Event::LedgerWritable(true));
    m.observe(&Event::Divergence {
        missing: 1,
        orphans: 0,
        alive: 0,
    });
    let hl = crate::l1_leaves::events::RangeCount {
        network: "net1".into(),
        family: "ipv4",
        size: Some(253),
        pods: 3,
        agent: 1,
        pool: 0,
        orphans: Some(1),
        free: Some(248),
        ..Default::default()
    };
    let v6 = crate::l1_leaves::events::RangeCount {
        family: "ipv6",
        size: Some(u64::MAX),
        free: Some(u64::MAX - 1),
        ..hl.clone()
    };
    let opaque = crate::l1_leaves::events::RangeCount {
        network: "az".into(),
        family: "ipv4",
        pods: 2,
        unknown: "azure-vnet-ipam keeps its ranges to itself".into(),
        ..Default::default()
    };
    m.observe(&Event::Ranges(&[hl.clone(), v6, opaque.clone()]));
    // Whole: the IPv6 row is gone, and so are its series.
    m.observe(&Event::Ranges(&[hl, opaque]));
    m.observe(&Event::RuntimeGcPass {
        freed: 0,
        kept_grace: 0,
        refusing: Some("unreachable"),
    });
    m.observe(&Event::RuntimeGcPass {
        freed: 2,
        kept_grace: 1,
        refusing: None,
    });
    let out = m.render();
    for want in [
        "dipam_requests_total{op=\"ADD\",code=\"0\"} 2",
        "dipam_requests_total{op=\"ADD\",code=\"152\"} 1",
        "dipam_request_duration_seconds_bucket{le=\"0.0025\",op=\"ADD\"} 0",
        "dipam_request_duration_seconds_bucket{le=\"0.005\",op=\"ADD\"} 3",
        "dipam_request_duration_seconds_count{op=\"ADD\"} 3",
        "dipam_requests_in_flight{op=\"ADD\"} 1",
        "dipam_delegate_exec_duration_seconds_count{delegate=\"host-local\",command=\"ADD\"} 1",
        "dipam_ledger_op_duration_seconds_bucket{le=\"0.001\"} 1",
        "dipam_ledger_op_duration_seconds_count 1",
        "dipam_attachments{owner=\"pod\",network=\"n\\\"1\"} 2",
        "dipam_agent_addresses{state=\"held\"} 3",
        "dipam_pool_ready{network=\"n\",digest=\"d1\"} 5",
        "dipam_pool_target{network=\"n\",digest=\"d1\"} 8",
        "dipam_pool_in_use{network=\"n\",digest=\"d1\"} 3",
        "dipam_pool_refills_total 1",
        "dipam_pool_requests_total{outcome=\"hit\"} 1",
        "\ndipam_gc_freed_total 2\n",
        "\ndipam_gc_refused_total 0\n",
        "\ndipam_stale_dels_total 0\n",
        "\ndipam_crossed_dels_total 0\n",
        "\ndipam_spool_depth 7\n",
        "\ndipam_ledger_writable 1\n",
        "\ndipam_divergence_missing 1\n",
        "\ndipam_history_events_dropped_total 0\n",
        "\ndipam_runtime_gc_passes_total 2\n",
        "\ndipam_runtime_gc_freed_total 2\n",
        "\ndipam_runtime_gc_kept_grace 1\n",
        "\ndipam_runtime_gc_refusing 0\n",
        "dipam_runtime_gc_refusals_total{reason=\"unreachable\"} 1",
        "dipam_runtime_gc_refusals_total{reason=\"empty\"} 0",
        "dipam_range_size{network=\"net1\",family=\"ipv4\"} 253.0",
        "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"pod\"} 3.0",
        "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"agent\"} 1.0",
        "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"orphan\"} 1.0",
        "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"free\"} 248.0",
        "dipam_range_addresses{network=\"az\",family=\"ipv4\",state=\"pod\"} 2.0",
        "# TYPE dipam_requests counter",
        "# TYPE dipam_attachments gauge",
        "# TYPE dipam_request_duration_seconds histogram",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // Whole updates drop what is gone.
    assert!(!out.contains("state=\"lost\""), "{out}");
    assert!(!out.contains("digest=\"d0\""), "{out}");
    assert!(!out.contains("family=\"ipv6\""), "{out}");
    // What is not known has no series: no size, orphans or free for an opaque delegate.
    assert!(!out.contains("dipam_range_size{network=\"az\""), "{out}");
    for state in ["orphan", "free"] {
        assert!(
            !out.contains(&format!("network=\"az\",family=\"ipv4\",state=\"{state}\"")),
            "{out}"
        );
    }
    assert!(out.ends_with("# EOF\n"), "{out}");
    // Every series has its HELP and TYPE.
    let names = families(&out);
    assert_eq!(names.len(), 41, "{names:?}");
    for name in &names {
        assert!(
            out.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
        assert!(
            out.contains(&format!("# TYPE {name} ")),
            "no TYPE for {name}"
        );
    }
    for help in out.lines().filter(|l| l.starts_with("# HELP ")) {
        assert!(help.ends_with('.') && !help.ends_with(".."), "{help:?}");
    }
    // docs/metrics.md lists every series (with its labels and meaning), and nothing else.
    let doc = include_str!("../../../../docs/metrics.md");
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `dipam_"))
        .filter_map(|l| l.split('`').next())
        .map(|n| {
            let n = format!("dipam_{n}");
            n.strip_suffix("_total").map(str::to_owned).unwrap_or(n)
        })
        .collect();
    assert_eq!(documented, names, "docs/metrics.md's table vs the registry");
}
