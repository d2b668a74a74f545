use dipam_state::{AttachmentKey, MemStore};

use super::*;
use crate::testing::{node_with, record as rec, request, script, scripted_node};

/// A GC asked for by an operator: `dry_run` and `force` as `dipamctl gc` gives them.
fn run<'a>(
    dc: &'a DelegateConf,
    cni_path: &'a str,
    valid: Valid,
    began: GcStart,
    dry_run: bool,
    force: bool,
) -> Request<'a> {
    Request {
        dc,
        cni_path,
        valid,
        began,
        mode: Mode::of(dry_run, force),
        by: crate::l1_leaves::events::FreedBy::Operator,
        list_kept: true,
    }
}

async fn bench(
    records: Vec<AttachmentRecord>,
) -> (
    tempfile::TempDir,
    std::sync::Arc<crate::l5_node::node::Node>,
    DelegateConf,
) {
    let (dir, node) = node_with(&script(""), records).await;
    let dc = node
        .prepare(
            request("", "1.1.0", json!({})),
            false,
            crate::l1_leaves::access::Caller::ROOT,
        )
        .unwrap()
        .dc;
    (dir, node, dc)
}

fn list(ids: &[&str]) -> Valid {
    Valid::List(
        ids.iter()
            .map(|c| ((*c).to_owned(), "eth0".to_owned()))
            .collect(),
    )
}

#[tokio::test]
async fn a_plan_says_why_it_keeps_each_attachment() {
    let old = now() - 1000; // older than the default grace (60 s)
    let (_d, node, dc) = bench(vec![
        rec("listed", Owner::Pod, AttachmentState::Committed, old),
        rec("stale", Owner::Pod, AttachmentState::Committed, old),
        rec("young", Owner::Pod, AttachmentState::Committed, now()),
        rec("busy", Owner::Pod, AttachmentState::Adding, old),
        rec(
            "dipam-router-ipv4-n1",
            Owner::Agent {
                role: "router".into(),
            },
            AttachmentState::Committed,
            old,
        ),
        rec(
            "dipam-pool-n1-0",
            Owner::Pool,
            AttachmentState::Committed,
            old,
        ),
    ])
    .await;
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["listed"]),
            node.core.births.gc_began(None, None),
            true,
            false,
        ),
    )
    .await
    .unwrap();
    let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
    assert_eq!(freed, vec!["stale"]);
    assert_eq!(plan.items[0].outcome, "planned");
    let mut kept: Vec<_> = plan
        .kept
        .iter()
        .map(|i| {
            assert_eq!(i.outcome, "kept");
            assert!(!i.reason.is_empty());
            (i.container_id.as_str(), i.keep.join(","))
        })
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        vec![
            ("busy", "in-flight".to_owned()),
            ("dipam-pool-n1-0", "pool".to_owned()),
            ("dipam-router-ipv4-n1", "agent".to_owned()),
            ("listed", "valid-list".to_owned()),
            ("young", "grace".to_owned()),
        ]
    );
    assert!(
        node.core
            .lookup(&AttachmentKey::new("net", "stale", "eth0"))
            .unwrap()
            .is_some(),
        "a dry run freed"
    );
}

/// The rule of core/births.rs against the wall clock stepping either way between an ADD
/// and a GC. Ages come from the wall clock (`created_at`), so a step forward makes a pod
/// ADDed a moment ago look an hour old (outside any grace period), and a step back makes
/// one look as if it were ADDed in the future. Neither decides: a pod whose ADD finished
/// after the GC began is kept, and one that finished before is freed, whatever the
/// grace, through the plan and through the check under the key's lock.
#[tokio::test]
async fn an_add_finished_after_the_gc_began_is_kept_whatever_the_wall_clock_says() {
    let stepped_forward = now() - 3600;
    let stepped_back = now() + 3600;
    let (_d, node, dc) = bench(vec![
        rec(
            "keep",
            Owner::Pod,
            AttachmentState::Committed,
            stepped_forward,
        ),
        rec(
            "before",
            Owner::Pod,
            AttachmentState::Committed,
            stepped_forward,
        ),
        rec(
            "before-back",
            Owner::Pod,
            AttachmentState::Committed,
            stepped_back,
        ),
        rec(
            "fwd",
            Owner::Pod,
            AttachmentState::Committed,
            stepped_forward,
        ),
        rec("back", Owner::Pod, AttachmentState::Committed, stepped_back),
    ])
    .await;
    for c in ["keep", "before", "before-back"] {
        node.core
            .births
            .stamp(&AttachmentKey::new("net", c, "eth0"));
    }
    std::thread::sleep(std::time::Duration::from_millis(2));
    let began = node.core.births.gc_began(None, None);
    for c in ["fwd", "back"] {
        node.core
            .births
            .stamp(&AttachmentKey::new("net", c, "eth0"));
    }
    // The default grace (60 s). Stepped forward, a pod born after the GC began would have
    // been freed as an hour old; stepped back, everything looks young (kept by grace,
    // as before).
    let plan = collect(
        &node.collector(),
        run(&dc, "", list(&["keep"]), began, true, true),
    )
    .await
    .unwrap();
    let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
    assert_eq!(freed, vec!["before"], "{:?}", plan.kept);
    let codes = |c: &str| {
        let k = plan.kept.iter().find(|k| k.container_id == c).unwrap();
        k.keep.join(",")
    };
    assert_eq!(codes("fwd"), BORN_AFTER_GC);
    assert_eq!(codes("back"), format!("{BORN_AFTER_GC},grace"));
    assert_eq!(codes("before-back"), "grace");
    let fwd = plan.kept.iter().find(|k| k.container_id == "fwd").unwrap();
    assert!(fwd.reason.contains("after this GC began"), "{}", fwd.reason);
    // The check under the key's lock, for an ADD that finishes between the plan and the
    // mark: planned stale, then stamped, then kept.
    let planned = node
        .core
        .lookup(&AttachmentKey::new("net", "before", "eth0"))
        .unwrap()
        .unwrap();
    node.core.births.stamp(&planned.key);
    let c = node.collector();
    let (jobs, skipped) = mark(&c, vec![(0, planned.clone())], began).await;
    assert!(jobs.is_empty());
    assert!(
        matches!(skipped.as_slice(), [(0, Released::Busy(BORN_AFTER_GC, _))]),
        "marked an attachment born after the GC"
    );
    assert_eq!(
        node.core.lookup(&planned.key).unwrap().unwrap().state,
        AttachmentState::Committed
    );
    // The real GC frees nothing: "before" was ADDed again after it began (above), and
    // the rest are born after it or young.
    let plan = collect(
        &node.collector(),
        run(&dc, "", list(&["keep"]), began, false, true),
    )
    .await
    .unwrap();
    let freed: Vec<_> = plan
        .items
        .iter()
        .filter(|i| i.outcome == "freed")
        .map(|i| i.container_id.as_str())
        .collect();
    assert!(freed.is_empty(), "{freed:?}");
    for c in ["keep", "before", "before-back", "fwd", "back"] {
        assert!(
            node.core
                .lookup(&AttachmentKey::new("net", c, "eth0"))
                .unwrap()
                .is_some(),
            "{c} was freed"
        );
    }
}

/// A freeing GC past the [`RUNNING`] slots (every slot held, as by GCs running on other
/// networks) waits for one with its caller; a caller that gives up meanwhile leaves nothing
/// behind: nothing marked or freed then, and no GC run on its behalf once a slot is free.
/// The same GC sent again with a slot free frees.
#[tokio::test]
async fn a_gc_waiting_for_a_slot_leaves_nothing_when_its_caller_gives_up() {
    let old = now() - 1000;
    let (_d, node, dc) = bench(vec![
        rec("keep", Owner::Pod, AttachmentState::Committed, old),
        rec("stale", Owner::Pod, AttachmentState::Committed, old),
    ])
    .await;
    let c = node.collector();
    let stale = AttachmentKey::new("net", "stale", "eth0");
    let state =
        |node: &crate::l5_node::node::Node| node.core.lookup(&stale).unwrap().map(|r| r.state);
    let slots = std::sync::Arc::clone(&c.gc.running)
        .acquire_many_owned(u32::try_from(RUNNING).unwrap())
        .await
        .unwrap();
    let began = node.core.births.gc_began(None, None);
    let waiting = collect(&c, run(&dc, "", list(&["keep"]), began, false, true));
    let gave_up = tokio::time::timeout(std::time::Duration::from_millis(300), waiting).await;
    assert!(gave_up.is_err(), "a GC ran with every slot held");
    assert_eq!(state(&node), Some(AttachmentState::Committed));
    drop(slots);
    // Time for a GC left behind to run, had the caller's wait been handed to dipamd.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        state(&node),
        Some(AttachmentState::Committed),
        "a GC ran for a caller that left"
    );
    assert_eq!(c.gc.running.available_permits(), RUNNING);
    let plan = collect(&c, run(&dc, "", list(&["keep"]), began, false, true))
        .await
        .unwrap();
    assert_eq!(plan.items.len(), 1);
    assert_eq!(plan.items[0].outcome, "freed", "{:?}", plan.items[0]);
    assert_eq!(state(&node), None);
}

#[tokio::test]
async fn freeing_all_of_a_small_network_takes_force() {
    let old = now() - 1000;
    // One pod, not in the list: 1 of 1.
    let (_d, node, dc) = bench(vec![rec(
        "only",
        Owner::Pod,
        AttachmentState::Committed,
        old,
    )])
    .await;
    let e = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["other"]),
            node.core.births.gc_began(None, None),
            false,
            false,
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
    assert!(
        node.core
            .lookup(&AttachmentKey::new("net", "only", "eth0"))
            .unwrap()
            .is_some()
    );
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["other"]),
            node.core.births.gc_began(None, None),
            false,
            true,
        ),
    )
    .await
    .unwrap();
    assert_eq!(plan.items[0].outcome, "freed", "{:?}", plan.items);
    assert!(
        node.core
            .lookup(&AttachmentKey::new("net", "only", "eth0"))
            .unwrap()
            .is_none()
    );

    // Two pods: both is refused, one of two is not.
    let (_d, node, dc) = bench(vec![
        rec("a", Owner::Pod, AttachmentState::Committed, old),
        rec("b", Owner::Pod, AttachmentState::Committed, old),
    ])
    .await;
    assert!(
        collect(
            &node.collector(),
            run(
                &dc,
                "",
                list(&["other"]),
                node.core.births.gc_began(None, None),
                false,
                false
            )
        )
        .await
        .is_err()
    );
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["a"]),
            node.core.births.gc_began(None, None),
            false,
            false,
        ),
    )
    .await
    .unwrap();
    assert_eq!(plan.items.len(), 1);
    assert_eq!(plan.items[0].container_id, "b");
    assert_eq!(plan.items[0].outcome, "freed");
}

/// A delegate whose DEL takes a while and logs how many DELs were running at once.
const SLOW_DEL: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
DEL)
  touch "$d/running.$CNI_CONTAINERID"
  ls "$d" | grep -c '^running\.' >> "$d/concurrency"
  sleep 0.05
  rm -f "$d/running.$CNI_CONTAINERID"
  echo "DEL $CNI_CONTAINERID" >> "$d/calls"
  ;;
esac
"#;

fn rec_ip(cid: &str, ip: &str, created_at: u64) -> AttachmentRecord {
    AttachmentRecord {
        result: Some(json!({"cniVersion":"1.0.0","ips":[{"address": format!("{ip}/24")}]})),
        ..rec(cid, Owner::Pod, AttachmentState::Committed, created_at)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_records_are_released_in_parallel_bounded_and_forgotten() {
    let old = now() - 1000;
    let (dir, node) = scripted_node(SLOW_DEL, std::sync::Arc::new(MemStore::new()));
    let stale = CHUNK * 2 + 5; // more than one chunk of marks
    for i in 0..=stale {
        let r = rec_ip(
            &format!("c{i:03}"),
            &format!("10.9.{}.{}", i / 200, 1 + i % 200),
            old,
        );
        node.core.ledger(move |l| l.put(&r)).await.unwrap();
    }
    let dc = node
        .prepare(
            request("", "1.1.0", json!({})),
            false,
            crate::l1_leaves::access::Caller::ROOT,
        )
        .unwrap()
        .dc;
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["c000"]),
            node.core.births.gc_began(None, None),
            false,
            true,
        ),
    )
    .await
    .unwrap();
    assert_eq!(plan.items.len(), stale);
    assert!(
        plan.items.iter().all(|i| i.outcome == "freed"),
        "{:?}",
        plan.items
    );
    let left = node.core.ledger(|l| l.list(None)).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key.container_id, "c000");
    let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
    assert_eq!(
        calls.lines().count(),
        stale,
        "each stale record DELed once: {calls}"
    );
    let most = std::fs::read_to_string(dir.path().join("concurrency"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .max()
        .unwrap();
    let parallel = node.gc.policy.parallel;
    assert!(
        most <= parallel,
        "{most} DELs at once, more than {parallel}"
    );
    assert!(most >= 2, "the DELs never overlapped");
    // Nothing is left marked as being released.
    assert!(
        !node
            .core
            .addrs
            .is_releasing("net", &"10.9.0.5".parse().unwrap())
    );
    assert!(node.core.locks.in_flight().is_empty());
}

#[tokio::test]
async fn a_stale_record_whose_key_an_operation_holds_is_kept() {
    let old = now() - 1000;
    let (_d, node, dc) = bench(vec![
        rec("keep", Owner::Pod, AttachmentState::Committed, old),
        rec("a", Owner::Pod, AttachmentState::Committed, old),
        rec("b", Owner::Pod, AttachmentState::Committed, old),
    ])
    .await;
    let busy = AttachmentKey::new("net", "a", "eth0");
    let held = node.core.locks.lock(&busy).await;
    // Planned while held: kept, and said why.
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["keep"]),
            node.core.births.gc_began(None, None),
            true,
            true,
        ),
    )
    .await
    .unwrap();
    assert_eq!(plan.items.len(), 1, "{:?}", plan.items);
    assert!(
        plan.kept
            .iter()
            .any(|k| k.container_id == "a" && k.keep == vec!["in-flight".to_owned()])
    );
    let plan = collect(
        &node.collector(),
        run(
            &dc,
            "",
            list(&["keep"]),
            node.core.births.gc_began(None, None),
            false,
            true,
        ),
    )
    .await
    .unwrap();
    assert_eq!(plan.items.len(), 1);
    assert_eq!(plan.items[0].container_id, "b");
    assert_eq!(plan.items[0].outcome, "freed");
    assert!(
        node.core.lookup(&busy).unwrap().is_some(),
        "freed under a held key"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_on_the_network_does_not_wait_for_the_gc() {
    let old = now() - 1000;
    let (_dir, node) = scripted_node(SLOW_DEL, std::sync::Arc::new(MemStore::new()));
    for i in 0..40 {
        let r = rec_ip(&format!("s{i:02}"), &format!("10.9.0.{}", 10 + i), old);
        node.core.ledger(move |l| l.put(&r)).await.unwrap();
    }
    let dc = node
        .prepare(
            request("", "1.1.0", json!({})),
            false,
            crate::l1_leaves::access::Caller::ROOT,
        )
        .unwrap()
        .dc;
    let gc = {
        let (node, dc) = (node.clone(), dc.clone());
        tokio::spawn(async move {
            collect(
                &node.collector(),
                run(
                    &dc,
                    "",
                    list(&["s00"]),
                    node.core.births.gc_began(None, None),
                    false,
                    true,
                ),
            )
            .await
        })
    };
    // Once the GC is releasing, another key of the network locks at once: GC holds
    // the keys it frees, not the network.
    while node.core.locks.in_flight().is_empty() {
        tokio::task::yield_now().await;
    }
    let other = AttachmentKey::new("net", "a-new-pod", "eth0");
    let got = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        node.core.locks.lock(&other),
    )
    .await;
    assert!(got.is_ok(), "an ADD's key lock waited for the GC");
    assert!(!gc.is_finished(), "the GC was over before the check");
    drop(got);
    let plan = gc.await.unwrap().unwrap();
    assert!(plan.items.iter().all(|i| i.outcome == "freed"));
}

/// A CNI GC on a node of 3,000 pods (real sled, real host-local and its directory) that the
/// runtime's valid list names all but three of: it frees exactly those three and, at its
/// peak, holds a fraction of what the network's records take decoded. It held every record
/// (config, result) while it planned and released (docs/performance.md, run 32: 131-140 MiB
/// at 10,000 during a CNI GC of 250). And it holds each name once: with the valid set, the
/// delegate's keep set, the records' delegate keys and the store's reservations each owning
/// every id, and an entry per kept record, it held ~900 B per attachment at its peak (2.70
/// MB at 3,000; 10.7 MB at 10,000); with one shared copy of each name 420-440 B (1.27-1.33 MB; 4.5
/// MB at 10,000), against a bound of 640 (run 44).
#[test]
fn a_gc_on_a_dense_node_holds_what_it_frees_not_the_ledger() {
    use crate::testing::{dense, held};
    const N: usize = 3_000;
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let (d, records, conf) = host_local_node(N);
    for (i, r) in records.iter().enumerate() {
        d.reserve(dense::ip(i), &format!("{}\r\neth0", r.key.container_id));
    }
    drop(records);
    let gone = [3, 1_500, 2_999];
    let dc = DelegateConf {
        kind: "host-local".into(),
        network: dense::NET.into(),
        version: SpecVersion::new(1, 0, 0),
        conf,
    };
    let whole = d.whole(&rt);
    let c = d.node.collector();
    let began = c.core.births.gc_began(None, None);
    let (plan, peak) = held::measure(&rt, async {
        // The list made inside the measure, as the GC's arrival hands it over (rpc/gc.rs):
        // what the GC keeps of it, and how long, counts.
        let valid = dense::listed_but(N, &gone)
            .into_iter()
            .map(|c| (c, "eth0".to_owned()))
            .collect();
        let gc = Request {
            dc: &dc,
            cni_path: "",
            valid: Valid::List(valid),
            began,
            mode: Mode::Free,
            by: crate::l1_leaves::events::FreedBy::CniGc,
            list_kept: false,
        };
        collect(&c, gc).await
    });
    let plan = plan.unwrap();
    let mut freed: Vec<&str> = plan
        .items
        .iter()
        .map(|i| {
            assert_eq!(
                (i.kind.as_str(), i.outcome.as_str()),
                ("ledger", "freed"),
                "{i:?}"
            );
            i.container_id.as_str()
        })
        .collect();
    freed.sort_unstable();
    let mut want: Vec<String> = gone.iter().map(|&i| dense::cid(i)).collect();
    want.sort();
    assert_eq!(freed, want);
    // A CNI GC's reply carries no line per kept record: it makes none (only `dipamctl gc`
    // prints them), and what it keeps is all still there.
    assert!(plan.kept.is_empty(), "{} kept lines", plan.kept.len());
    let left = rt.block_on(crate::testing::ledger_ids(&d.node));
    assert_eq!(left.len(), N - gone.len());
    for &i in &gone {
        assert!(!left.contains(&dense::cid(i)));
        assert!(
            !d.data
                .join(dense::NET)
                .join(dense::ip(i).to_string())
                .exists()
        );
    }
    eprintln!(
        "ledger decoded: {whole} B; the GC's peak: {peak} B ({} B per attachment)",
        peak / N
    );
    assert!(
        peak * 3 < whole,
        "the GC held {peak} B at its peak; the ledger takes {whole} B decoded"
    );
    assert!(
        peak < 640 * N,
        "the GC held {peak} B at its peak, {} B per attachment: more than one copy of each \
         name?",
        peak / N
    );
}

/// host-local's legacy id-only files (no ifname) are compared by container ID, against the
/// records' delegate keys and the valid set (the id sets are made only when the store has
/// such a file): one naming a recorded container is no orphan, one naming a listed container
/// that no record knows is kept for the list, and one naming neither is an orphan. A dry run
/// (real sled, Debian's `host-local`, which has no GC of its own, so its store is compared).
#[test]
fn legacy_id_only_reservations_match_by_container_id() {
    use crate::testing::dense;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (d, _records, conf) = host_local_node(2);
    let (recorded, listed, unknown) = (dense::cid(0), dense::cid(7), dense::cid(8));
    d.reserve(dense::ip(0), &recorded);
    d.reserve(dense::ip(1), &format!("{}\r\neth0", dense::cid(1)));
    d.reserve(dense::ip(7), &listed);
    d.reserve(dense::ip(8), &unknown);
    let dc = DelegateConf {
        kind: "host-local".into(),
        network: dense::NET.into(),
        version: SpecVersion::new(1, 0, 0),
        conf,
    };
    let c = d.node.collector();
    let valid = Valid::List(
        [0, 1, 7]
            .map(|i| (dense::cid(i), "eth0".to_owned()))
            .to_vec(),
    );
    let began = c.core.births.gc_began(None, None);
    let plan = rt
        .block_on(collect(&c, run(&dc, "", valid, began, true, false)))
        .unwrap();
    let orphan = |cid: &str| -> Vec<&GcItem> {
        plan.items
            .iter()
            .chain(&plan.kept)
            .filter(|i| i.kind == "orphan" && i.container_id == cid)
            .collect()
    };
    assert!(orphan(&recorded).is_empty(), "{plan:?}");
    let kept = orphan(&listed);
    assert_eq!(kept.len(), 1, "{plan:?}");
    assert_eq!(
        (kept[0].outcome.as_str(), kept[0].keep.clone()),
        ("kept", vec!["valid-list".to_owned()])
    );
    // Freed unless the node shows it in use (liveness.rs): either way, planned as an orphan.
    assert_eq!(orphan(&unknown).len(), 1, "{plan:?}");
    assert!(
        plan.items.iter().all(|i| i.outcome == "planned"),
        "{plan:?}"
    );
}

/// A dense node of `n` records with Debian's `host-local` on its CNI path, and the records and
/// their delegate config. Debian's host-local (1.1.1) speaks CNI up to 1.0.0: the records were
/// added at that version, and a GC compares its store (it has no GC of its own).
fn host_local_node(
    n: usize,
) -> (
    crate::testing::dense::Dense,
    Vec<AttachmentRecord>,
    serde_json::Value,
) {
    use crate::testing::dense;
    const HOST_LOCAL: &str = "/usr/lib/cni/host-local";
    assert!(
        std::path::Path::new(HOST_LOCAL).exists(),
        "{HOST_LOCAL} is missing: tests/deps.sh installs it"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("data");
    let mut conf = dense::config(&data);
    conf["cniVersion"] = json!("1.0.0");
    let records: Vec<AttachmentRecord> = (0..n)
        .map(|i| AttachmentRecord {
            delegate_config: conf.to_string(),
            delegate_version: "1.0.0".into(),
            ..dense::record(i, &data)
        })
        .collect();
    let d = dense::node(&records, dir);
    let bin = d.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(HOST_LOCAL, bin.join("host-local")).unwrap();
    (d, records, conf)
}
