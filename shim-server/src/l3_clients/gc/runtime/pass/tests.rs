//! The runtime-aware GC against an in-memory twin of a CRI runtime, the in-memory ledger and a
//! scripted delegate that logs every call: the two-pass rule, the valid set, and every
//! refusal, without a runtime.

use std::sync::{Arc, Mutex};

use dipam_state::CriPod;
use serde_json::json;

use super::*;
use crate::l5_node::node::Node;
use crate::{
    l3_clients::gc::runtime::{Listing, Sandboxes},
    testing::{add_as, node_with, record, request, script},
};

/// ADD hands out 10.9.0.2, .3, ...
const ADD: &str = r#"ADD)
  n=$(cat "$d/next" 2>/dev/null || echo 2); echo $((n + 1)) > "$d/next"
  echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.9.0.$n/24\"}]}" ;;
"#;

/// The in-memory twin of a CRI runtime: answers what the test last told it to.
struct Twin(Mutex<Result<Vec<String>, ListError>>);

impl Twin {
    fn lists(&self, ids: &[&str]) {
        *self.0.lock().unwrap() = Ok(ids.iter().map(|s| (*s).to_owned()).collect());
    }
    fn fails(&self, e: ListError) {
        *self.0.lock().unwrap() = Err(e);
    }
}

impl Sandboxes for Twin {
    fn endpoint(&self) -> &str {
        "unix:///twin.sock"
    }
    fn list(&self) -> Listing<'_> {
        let answer = self.0.lock().unwrap().clone();
        Box::pin(async move { answer })
    }
}

struct Bench {
    dir: tempfile::TempDir,
    node: Arc<Node>,
    twin: Arc<Twin>,
}

impl Bench {
    async fn new(records: Vec<AttachmentRecord>) -> Self {
        let (dir, node) = node_with(&script(ADD), records).await;
        let twin = Arc::new(Twin(Mutex::new(Ok(Vec::new()))));
        node.gc
            .runtime
            .set(RuntimeGc::new(twin.clone() as Arc<dyn Sandboxes>))
            .unwrap();
        Self { dir, node, twin }
    }

    async fn pass(&self) -> Report {
        pass(&self.node.collector(), self.rt(), false, false, KEPT_LIMIT)
            .await
            .unwrap()
    }

    async fn dry_run(&self) -> Report {
        pass(&self.node.collector(), self.rt(), true, false, KEPT_LIMIT)
            .await
            .unwrap()
    }

    fn rt(&self) -> &RuntimeGc {
        self.node.gc.runtime.get().unwrap()
    }

    /// The delegate DELs run so far, by container ID.
    fn dels(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("DEL ").map(str::to_owned))
            .collect()
    }

    fn has(&self, cid: &str) -> bool {
        self.node
            .core
            .lookup(&AttachmentKey::new("net", cid, "eth0"))
            .unwrap()
            .is_some()
    }
}

const OLD: u64 = 1000; // seconds; older than the default grace (60 s)

fn rec(cid: &str, owner: Owner, cri: bool, state: AttachmentState, age: u64) -> AttachmentRecord {
    AttachmentRecord {
        cri_pod: cri.then(|| CriPod {
            namespace: "default".into(),
            name: format!("pod-{cid}"),
            uid: format!("uid-{cid}"),
        }),
        ..record(cid, owner, state, now() - age)
    }
}

fn pod(cid: &str) -> AttachmentRecord {
    rec(cid, Owner::Pod, true, AttachmentState::Committed, OLD)
}

fn keep_codes(r: &Report) -> Vec<(String, String)> {
    let mut v: Vec<_> = r
        .kept
        .iter()
        .map(|i| (i.container_id.clone(), i.keep.join(",")))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn only_what_two_consecutive_passes_miss_is_freed_and_only_if_made_through_cri() {
    let b = Bench::new(vec![
        pod("running"),
        pod("stale"),
        rec("podman", Owner::Pod, false, AttachmentState::Committed, OLD),
        rec("young", Owner::Pod, true, AttachmentState::Committed, 0),
        rec("busy", Owner::Pod, true, AttachmentState::Adding, OLD),
        rec(
            "dipam-router-ipv4-n1",
            Owner::Agent {
                role: "router".into(),
            },
            false,
            AttachmentState::Committed,
            OLD,
        ),
        rec(
            "dipam-pool-n1-0",
            Owner::Pool,
            false,
            AttachmentState::Committed,
            OLD,
        ),
        // Enough live CRI pods that freeing one stays inside the default share (50%).
        pod("live-1"),
        pod("live-2"),
    ])
    .await;
    b.twin.lists(&["running", "live-1", "live-2", "not-ours"]);

    // First pass: "stale" is missed once, nothing is freed.
    let first = b.pass().await;
    assert!(first.refused.is_none(), "{:?}", first.refused);
    assert_eq!(first.sandboxes, 4);
    assert!(first.items.is_empty(), "{:?}", first.items);
    assert!(b.dels().is_empty());
    assert_eq!(
        keep_codes(&first),
        vec![
            ("busy".into(), "in-flight".into()),
            ("dipam-pool-n1-0".into(), "pool".into()),
            ("dipam-router-ipv4-n1".into(), "agent".into()),
            ("live-1".into(), "listed".into()),
            ("live-2".into(), "listed".into()),
            ("podman".into(), "not-cri".into()),
            ("running".into(), "listed".into()),
            ("stale".into(), "first-miss".into()),
            ("young".into(), "grace".into()),
        ]
    );
    {
        let s = b.rt().state.lock().unwrap();
        assert_eq!((s.passes, s.pending, s.kept_grace, s.freed), (1, 1, 1, 0));
    }

    // The dry run says what the next pass frees, and changes nothing.
    let plan = b.dry_run().await;
    assert_eq!(plan.items.len(), 1);
    assert_eq!(plan.items[0].container_id, "stale");
    assert_eq!(plan.items[0].outcome, "planned");
    assert_eq!(plan.items[0].pod_name, "pod-stale");
    assert!(
        plan.items[0].reason.contains("default/pod-stale"),
        "{}",
        plan.items[0].reason
    );
    assert!(b.dels().is_empty() && b.has("stale"));
    assert_eq!(b.rt().state.lock().unwrap().passes, 1);

    // Second pass: missed again, freed through the delegate's DEL; nothing else.
    let second = b.pass().await;
    assert_eq!(second.items.len(), 1, "{:?}", second.items);
    assert_eq!(second.items[0].outcome, "freed", "{:?}", second.items[0]);
    assert_eq!(b.dels(), vec!["stale".to_owned()]);
    assert!(!b.has("stale"));
    for kept in [
        "running",
        "podman",
        "young",
        "busy",
        "dipam-router-ipv4-n1",
        "dipam-pool-n1-0",
    ] {
        assert!(b.has(kept), "{kept} was freed");
    }
    // The attachment made outside CRI stays however many passes miss it.
    for _ in 0..3 {
        b.pass().await;
    }
    assert!(b.has("podman"));
    assert_eq!(b.dels(), vec!["stale".to_owned()]);
    let s = b.rt().status();
    assert_eq!((s.passes, s.freed, s.refusals), (5, 1, 0));
    assert!(s.refusing.is_empty());
}

#[tokio::test]
async fn a_sandbox_listed_again_restarts_the_count() {
    let b = Bench::new(vec![pod("a"), pod("b"), pod("c")]).await;
    b.twin.lists(&["a", "b"]);
    b.pass().await; // c: first miss
    b.twin.lists(&["a", "b", "c"]);
    b.pass().await; // c listed: the chain is broken
    b.twin.lists(&["a", "b"]);
    let r = b.pass().await; // c: a first miss again
    assert!(r.items.is_empty(), "{:?}", r.items);
    assert!(b.has("c") && b.dels().is_empty());
    let r = b.pass().await;
    assert_eq!(r.items[0].outcome, "freed");
    assert!(!b.has("c"));
}

#[tokio::test]
async fn an_unreachable_or_failing_runtime_frees_nothing_and_breaks_the_chain() {
    let b = Bench::new(vec![pod("a"), pod("b"), pod("c")]).await;
    b.twin.lists(&["a", "b"]);
    b.pass().await; // c: first miss
    for (e, code) in [
        (
            ListError::Unreachable {
                endpoint: "unix:///twin.sock".into(),
                reason: "Connection refused".into(),
            },
            "unreachable",
        ),
        (
            ListError::Answered {
                endpoint: "unix:///twin.sock".into(),
                code: "Internal".into(),
                message: "boom".into(),
            },
            "error",
        ),
    ] {
        b.twin.fails(e);
        for _ in 0..2 {
            let r = b.pass().await;
            assert_eq!(r.refused.as_ref().map(|r| r.code), Some(code));
            assert!(r.items.is_empty());
        }
        let s = b.rt().status();
        assert_eq!(s.refusing, code);
        assert!(
            s.refusing_detail.contains("nothing is freed"),
            "{}",
            s.refusing_detail
        );
        // The dry run shows the refusal too.
        assert_eq!(b.dry_run().await.refused.map(|r| r.code), Some(code));
    }
    assert!(b.has("c") && b.dels().is_empty());
    // Back: the chain starts over, so c is a first miss, not freed at once.
    b.twin.lists(&["a", "b"]);
    let r = b.pass().await;
    assert!(r.refused.is_none() && r.items.is_empty(), "{:?}", r.items);
    assert!(b.rt().status().refusing.is_empty());
    assert!(b.has("c"));
    assert_eq!(b.rt().status().refusals, 4);
}

#[tokio::test]
async fn an_empty_list_is_refused_only_while_the_ledger_holds_cri_attachments() {
    let b = Bench::new(vec![pod("a"), pod("b")]).await;
    b.twin.lists(&[]);
    for _ in 0..3 {
        let r = b.pass().await;
        assert_eq!(r.refused.as_ref().map(|r| r.code), Some("empty"));
    }
    assert!(b.has("a") && b.has("b") && b.dels().is_empty());
    let s = b.rt().status();
    assert_eq!((s.refusing.as_str(), s.refusals), ("empty", 3));
    assert!(
        s.refusing_detail
            .contains("2 attachment(s) made through CRI"),
        "{}",
        s.refusing_detail
    );

    // Only attachments made outside CRI: an empty list is an ordinary answer.
    let b = Bench::new(vec![rec(
        "podman",
        Owner::Pod,
        false,
        AttachmentState::Committed,
        OLD,
    )])
    .await;
    b.twin.lists(&[]);
    let r = b.pass().await;
    assert!(r.refused.is_none(), "{:?}", r.refused);
    b.pass().await;
    assert!(b.has("podman"));
}

#[tokio::test]
async fn freeing_too_large_a_share_of_the_node_takes_force_and_keeps_the_chain() {
    // Two of three CRI attachments missed: more than the default 50%.
    let b = Bench::new(vec![pod("a"), pod("b"), pod("c")]).await;
    b.twin.lists(&["a"]);
    b.pass().await;
    let r = b.pass().await;
    assert_eq!(r.refused.as_ref().map(|r| r.code), Some("share"));
    assert_eq!(r.items.len(), 2);
    assert!(r.items.iter().all(|i| i.outcome == "planned"));
    assert!(b.has("b") && b.has("c") && b.dels().is_empty());
    assert_eq!(b.rt().status().refusing, "share");
    // The operator's forced pass frees them: the chain survived the share refusal.
    let r = pass(&b.node.collector(), b.rt(), false, true, KEPT_LIMIT)
        .await
        .unwrap();
    assert!(r.refused.is_none());
    assert!(
        r.items.iter().all(|i| i.outcome == "freed"),
        "{:?}",
        r.items
    );
    let mut dels = b.dels();
    dels.sort();
    assert_eq!(dels, vec!["b".to_owned(), "c".to_owned()]);
    assert!(b.has("a"));
}

#[tokio::test]
async fn an_add_through_cri_is_recorded_as_such_and_becomes_eligible() {
    let b = Bench::new(vec![pod("x1"), pod("x2"), pod("x3")]).await;
    let sandbox = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let mut req = request(sandbox, "1.0.0", json!({}));
    req.cni_args = format!(
        "K8S_POD_UID=7f1c;IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_NAMESPACE=shop"
    );
    add_as(&b.node, crate::l1_leaves::access::Caller::ROOT, req)
        .await
        .unwrap();
    let mut podman = request("podman-1", "1.0.0", json!({}));
    podman.cni_args =
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=podman-1;K8S_POD_INFRA_CONTAINER_ID=podman-1;K8S_POD_NAME=podman-1".into();
    add_as(&b.node, crate::l1_leaves::access::Caller::ROOT, podman)
        .await
        .unwrap();
    let key = AttachmentKey::new("net", sandbox, "eth0");
    let got = b.node.core.lookup(&key).unwrap().unwrap();
    assert_eq!(
        got.cri_pod,
        Some(CriPod {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "7f1c".into()
        })
    );
    let podman = b
        .node
        .core
        .lookup(&AttachmentKey::new("net", "podman-1", "eth0"))
        .unwrap()
        .unwrap();
    assert_eq!(podman.cri_pod, None);
    // Shown by the operator's listing.
    let list = crate::l5_node::rpc::admin::attachments::run(
        &b.node,
        crate::l1_leaves::access::Caller::ROOT,
        dipam_proto::v1::ListAttachmentsRequest::default(),
    )
    .await
    .unwrap();
    let a = list
        .attachments
        .iter()
        .find(|a| a.container_id == sandbox)
        .unwrap();
    assert_eq!(
        (
            a.pod_namespace.as_str(),
            a.pod_name.as_str(),
            a.pod_uid.as_str()
        ),
        ("shop", "web-0", "7f1c")
    );
    // Both are young: kept by grace, and counted as such only for the one made through CRI.
    b.twin.lists(&["x1", "x2", "x3"]);
    let r = b.pass().await;
    let codes = keep_codes(&r);
    assert!(
        codes.contains(&(sandbox.to_owned(), "grace".to_owned())),
        "{codes:?}"
    );
    assert!(
        codes.contains(&("podman-1".to_owned(), "not-cri,grace".to_owned())),
        "{codes:?}"
    );
    assert_eq!(b.rt().status().kept_grace, 1);
}

#[tokio::test]
async fn without_cri_endpoint_the_rpc_says_how_to_turn_it_on() {
    let (_d, node) = node_with(&script(ADD), Vec::new()).await;
    let e = crate::l5_node::rpc::admin::runtime_gc::run(&node, Default::default())
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::Config { .. }), "{e:?}");
    assert!(e.to_string().contains("--cri-endpoint"), "{e}");
}

/// On a dense node (real sled on disk, 3,000 pods made through CRI): a pass holds the few
/// records it frees and the keys it missed, not the ledger, and the timer's passes keep no
/// line per record kept. They once held every record and a kept line for each, every 10 s:
/// at 10,000 attachments they set dipamd's high-water mark (docs/performance.md, run 32).
#[test]
fn a_pass_on_a_dense_node_holds_what_it_frees_not_the_ledger() {
    use crate::testing::{dense, held};
    const N: usize = 3_000;
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let (d, _) = dense::pods(N);
    let twin = Arc::new(Twin(Mutex::new(Ok(Vec::new()))));
    d.node
        .gc
        .runtime
        .set(RuntimeGc::new(twin.clone() as Arc<dyn Sandboxes>))
        .unwrap();
    let gone = [3, 1_500, 2_999];
    let listed = dense::listed_but(N, &gone);
    twin.lists(&listed.iter().map(String::as_str).collect::<Vec<_>>());
    let node = d.node.clone();
    let rt_gc = node.gc.runtime.get().unwrap();
    let whole = d.whole(&rt);

    // The timer's first pass: each unlisted one missed once, nothing freed, nothing listed.
    let (first, first_peak) = held::measure(&rt, async {
        pass_with(&node.collector(), rt_gc, false, false, 0)
            .await
            .unwrap()
    });
    assert!(first.refused.is_none(), "{:?}", first.refused);
    assert!(first.items.is_empty() && first.kept.is_empty(), "{first:?}");
    assert_eq!(rt_gc.state.lock().unwrap().pending, gone.len() as u64);
    // What the next pass would free: exactly those the runtime no longer lists.
    let (next, next_peak) = held::measure(&rt, async {
        pass_with(&node.collector(), rt_gc, true, false, 0)
            .await
            .unwrap()
    });
    let mut planned: Vec<String> = next.items.iter().map(|i| i.container_id.clone()).collect();
    planned.sort();
    let mut want: Vec<String> = gone.iter().map(|&i| dense::cid(i)).collect();
    want.sort();
    assert_eq!(planned, want);
    assert!(next.items.iter().all(|i| i.outcome == "planned"));
    eprintln!("ledger decoded: {whole} B; the passes' peaks: {first_peak} B, {next_peak} B");
    for peak in [first_peak, next_peak] {
        assert!(
            peak * 10 < whole,
            "a pass held {peak} B at its peak; the ledger takes {whole} B decoded"
        );
    }
    // `dipamctl gc --from-runtime --dry-run` counts every attachment kept, by reason, and
    // lists none unless asked; asked, at most its limit, the unlisted ones first.
    let (counted, counted_peak) =
        held::measure(&rt, pass(&node.collector(), rt_gc, true, false, 0));
    let counted = counted.unwrap();
    assert!(counted.kept.is_empty(), "{} kept lines", counted.kept.len());
    assert_eq!(counted.kept_total, (N - gone.len()) as u64);
    assert_eq!(
        counted.kept_by_reason.get("listed"),
        Some(&((N - gone.len()) as u64))
    );
    let (listed_kept, listed_peak) =
        held::measure(&rt, pass(&node.collector(), rt_gc, true, false, usize::MAX));
    let listed_kept = listed_kept.unwrap();
    assert_eq!(listed_kept.kept.len(), KEPT_LIMIT);
    assert_eq!(listed_kept.kept_total, (N - gone.len()) as u64);
    // What the reply held before: a line for every attachment kept.
    let (every, every_peak) = held::measure(&rt, async {
        pass_with(&node.collector(), rt_gc, true, false, usize::MAX)
            .await
            .unwrap()
    });
    assert_eq!(every.kept.len(), N - gone.len());
    drop(every);
    eprintln!(
        "dry runs at {N}: every kept line (before) {every_peak} B; counts only (the default \
         now) {counted_peak} B; {KEPT_LIMIT} kept lines (the cap) {listed_peak} B"
    );
    assert!(counted_peak < listed_peak && listed_peak < every_peak);
    assert!(
        counted_peak * 3 < every_peak,
        "{counted_peak} B vs {every_peak} B"
    );
}

/// The counts cover every attachment kept, under each of its reasons; the lines, at most the
/// limit asked, put those the runtime does not list (or that something else keeps) first.
#[tokio::test]
async fn the_report_counts_every_kept_attachment_and_lists_the_unusual_first() {
    let b = Bench::new(vec![pod("s1"), pod("s2"), pod("s3"), pod("gone")]).await;
    b.twin.lists(&["s1", "s2", "s3"]);
    let r = pass(&b.node.collector(), b.rt(), true, false, 2)
        .await
        .unwrap();
    assert_eq!(r.kept_total, 4, "{r:?}");
    assert_eq!(r.kept_by_reason.get("listed"), Some(&3), "{r:?}");
    assert_eq!(r.kept_by_reason.get("first-miss"), Some(&1), "{r:?}");
    let lines: Vec<&str> = r.kept.iter().map(|i| i.container_id.as_str()).collect();
    assert_eq!(lines, ["gone", "s1"], "{r:?}");
    let none = pass(&b.node.collector(), b.rt(), true, false, 0)
        .await
        .unwrap();
    assert!(none.kept.is_empty() && none.kept_total == 4, "{none:?}");
}

/// The timer's pass waits for a GC that is freeing (it holds a slot of `Gc::running` from
/// its read to its end), so that the two never hold the ledger's worth of plans at once;
/// it runs once the GC ends. A real clock: the pass reads the ledger on the blocking pool.
#[tokio::test]
async fn the_timers_pass_waits_for_a_freeing_gc() {
    let b = Bench::new(vec![pod("c1")]).await;
    b.twin.lists(&["c1"]);
    let passes = || b.rt().state.lock().unwrap().passes;
    let gc = Arc::clone(&b.node.gc.running)
        .acquire_owned()
        .await
        .unwrap();
    let timer = tokio::spawn(run(b.node.collector(), Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(passes(), 0, "a pass ran while a GC was freeing");
    drop(gc);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while passes() == 0 {
        assert!(
            std::time::Instant::now() < until,
            "no pass 20 s after the GC ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(passes(), 1);
    timer.abort();
}

/// The wait is bounded: GCs that never stop do not stop the runtime-aware GC; with none
/// under way it does not wait at all; one that ends is followed within a poll or so (the
/// upper bounds are loose for a loaded machine, far below the bound they tell apart).
#[tokio::test]
async fn the_wait_for_gcs_is_bounded_and_none_without_them() {
    let running = Arc::new(tokio::sync::Semaphore::new(crate::l3_clients::gc::RUNNING));
    let poll = Duration::from_millis(10);
    assert_eq!(
        settle(&running, poll, Duration::from_secs(60)).await,
        Duration::ZERO
    );
    let held = Arc::clone(&running).acquire_many_owned(2).await.unwrap();
    let most = Duration::from_millis(300);
    let waited = settle(&running, poll, most).await;
    assert!(
        waited >= most && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // One that ends after 300 ms, with a bound of a minute: the pass follows it.
    let ends = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
    });
    let waited = settle(&running, poll, Duration::from_secs(60)).await;
    ends.await.unwrap();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
}
