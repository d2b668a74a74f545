//! The evidence pass on the in-memory ledger with a scripted delegate, and looks made to
//! order (liveness::fixed_with): what proves a pod dead, and the matrix of what must never be
//! freed (after Calico's kdd_ipam_gc_fv_test.go), each asserting the live address stays.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use dipam_state::{AttachmentState, CriPod, MemStore, Owner};
use serde_json::json;

use super::*;
use crate::{
    l1_leaves::events::{Event, Events, Observer},
    l3_clients::gc::GcPolicy,
    l3_clients::liveness::{fixed_with, seen_from_own_pid_namespace},
    l5_node::node::Node,
    testing::{ledger_ids, record, script, scripted_node_policy},
};

/// DEL succeeds; ADD hands out 10.9.0.9 (a dead pod's address, for the conflict case).
const DELEGATE: &str = r#"DEL) ;;
ADD) echo '{"cniVersion":"1.0.0","ips":[{"address":"10.9.0.9/24"}]}' ;;
"#;

/// Who freed what, as the history hears it.
#[derive(Default)]
struct Freed(Mutex<Vec<(String, String, String)>>);

impl Observer for Freed {
    fn observe(&self, event: &Event<'_>) {
        if let Event::Freed {
            by,
            container_id,
            record,
        } = event
            && let Ok(mut f) = self.0.lock()
        {
            f.push((
                by.as_str().to_owned(),
                (*container_id).to_owned(),
                record["reason"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
}

struct Bench {
    dir: tempfile::TempDir,
    node: Arc<Node>,
    freed: Arc<Freed>,
}

/// A pod record of `cid` holding `ip`, added an hour ago.
fn pod(cid: &str, ip: &str) -> AttachmentRecord {
    let mut r = record(
        cid,
        Owner::Pod,
        AttachmentState::Committed,
        crate::l1_leaves::clock::now() - 3600,
    );
    r.result = Some(json!({"cniVersion":"1.0.0","ips":[{"address": format!("{ip}/24")}]}));
    r
}

impl Bench {
    async fn new(grace: u64, records: Vec<AttachmentRecord>) -> Self {
        let freed = Arc::new(Freed::default());
        let (dir, node) = scripted_node_policy(
            &script(DELEGATE),
            Arc::new(MemStore::new()),
            Events::new(vec![freed.clone() as Arc<dyn Observer>]),
            GcPolicy {
                grace: Duration::from_secs(grace),
                ..GcPolicy::default()
            },
        );
        for r in records {
            node.core.ledger(move |l| l.put(&r)).await.unwrap();
        }
        Self { dir, node, freed }
    }

    /// One look that found `scan`, made now.
    async fn look(&self, scan: &Scan) -> u64 {
        let c = self.node.collector();
        let began = c.core.births.gc_began(None, None);
        judge(&c, scan, began, Duration::ZERO).await.unwrap()
    }

    async fn ledger(&self) -> Vec<String> {
        ledger_ids(&self.node).await
    }

    fn dels(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("DEL "))
            .map(str::to_owned)
            .collect()
    }
}

fn nothing_seen() -> Scan {
    fixed_with(&[], &[], None, &[])
}

#[tokio::test]
async fn a_pod_no_evidence_names_on_two_looks_is_released_and_its_history_says_why() {
    let b = Bench::new(0, vec![pod("dead", "10.9.0.9")]).await;
    assert_eq!(b.look(&nothing_seen()).await, 0, "one look proves nothing");
    assert_eq!(b.ledger().await, ["dead"]);
    assert_eq!(b.look(&nothing_seen()).await, 1);
    assert!(b.ledger().await.is_empty());
    assert_eq!(b.dels(), ["dead"], "released through the delegate");
    let freed = b.freed.0.lock().unwrap().clone();
    assert_eq!(freed.len(), 1, "{freed:?}");
    assert_eq!(freed[0].0, "evidence");
    assert_eq!(freed[0].1, "dead");
    assert!(
        freed[0].2.contains("two looks") && freed[0].2.contains("released through the delegate"),
        "{freed:?}"
    );
}

#[tokio::test]
async fn looks_closer_than_dead_after_free_nothing() {
    let b = Bench::new(0, vec![pod("dead", "10.9.0.9")]).await;
    let c = b.node.collector();
    for _ in 0..3 {
        let began = c.core.births.gc_began(None, None);
        let n = judge(&c, &nothing_seen(), began, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(n, 0);
    }
    assert_eq!(b.ledger().await, ["dead"]);
}

/// The matrix: each live attachment beside one dead pod, over two looks; only the dead one
/// goes.
#[tokio::test]
async fn no_live_attachment_is_ever_freed() {
    let mut agent = pod("agent-router", "10.9.0.2");
    agent.owner = Owner::Agent {
        role: "router".into(),
    };
    let mut claim = pod("agent-claim", "10.9.0.3");
    claim.owner = Owner::Agent {
        role: "claim:egress".into(),
    };
    let mut pool = pod("pool-1", "10.9.0.4");
    pool.owner = Owner::Pool;
    let mut adding = pod("in-flight", "10.9.0.5");
    adding.state = AttachmentState::Adding;
    adding.result = None;
    let mut deleting = pod("deleting", "10.9.0.6");
    deleting.state = AttachmentState::Deleting;
    let mut young = pod("young", "10.9.0.7");
    young.created_at = crate::l1_leaves::clock::now();
    let netns = pod("in-a-netns", "10.9.0.10");
    let routed = pod("routed", "10.9.0.11");
    let mut listed = pod("listed-unseen", "10.9.0.12");
    listed.cri_pod = Some(CriPod {
        namespace: "ns".into(),
        name: "p".into(),
        uid: "u".into(),
    });
    let locked = pod("locked", "10.9.0.13");
    let b = Bench::new(
        60,
        vec![
            agent,
            claim,
            pool,
            adding,
            deleting,
            young,
            netns,
            routed,
            listed,
            locked.clone(),
            pod("dead", "10.9.0.9"),
        ],
    )
    .await;
    // IPAM mode under bridge: the address is in the pod's netns, with no host route.
    let scan = fixed_with(
        &[("10.9.0.10", "the network namespace of process 7 (pause)")],
        &[("10.9.0.11", "veth1")],
        Some(&["listed-unseen"]),
        &[],
    );
    let _held = b.node.core.locks.try_lock(&locked.key).unwrap();
    b.look(&scan).await;
    assert_eq!(b.look(&scan).await, 1);
    let mut left = b.ledger().await;
    left.sort();
    assert_eq!(
        left,
        [
            "agent-claim",
            "agent-router",
            "deleting",
            "in-a-netns",
            "in-flight",
            "listed-unseen",
            "locked",
            "pool-1",
            "routed",
            "young"
        ]
    );
    assert_eq!(b.dels(), ["dead"]);
}

#[tokio::test]
async fn an_incomplete_look_proves_nothing_and_starts_every_chain_again() {
    let b = Bench::new(0, vec![pod("dead", "10.9.0.9")]).await;
    let partial = fixed_with(&[], &[], None, &["the host's routes could not be read"]);
    // dipamd in its own PID namespace, even with the runtime's list: nothing is proven.
    let own = seen_from_own_pid_namespace(fixed_with(&[], &[], Some(&["other"]), &[]));
    for scan in [&partial, &own] {
        assert_eq!(b.look(scan).await, 0);
        assert_eq!(b.look(scan).await, 0);
    }
    // Complete, partial, complete: the chain began again at the second complete look.
    b.look(&nothing_seen()).await;
    b.look(&partial).await;
    assert_eq!(b.look(&nothing_seen()).await, 0);
    assert_eq!(b.ledger().await, ["dead"]);
    assert_eq!(b.look(&nothing_seen()).await, 1);
}

/// An empty list from the runtime (restarting, restoring its state) while CRI pods are
/// recorded proves nothing; a pod alive in its netns survives a shrunken list.
#[tokio::test]
async fn an_empty_or_shrunken_runtime_list_frees_no_live_pod() {
    let cri = |mut r: AttachmentRecord| {
        r.cri_pod = Some(CriPod {
            namespace: "ns".into(),
            name: r.key.container_id.clone(),
            uid: "u".into(),
        });
        r
    };
    let b = Bench::new(
        0,
        vec![cri(pod("a", "10.9.0.20")), cri(pod("b", "10.9.0.21"))],
    )
    .await;
    let empty = fixed_with(&[], &[], Some(&[]), &[]);
    b.look(&empty).await;
    assert_eq!(b.look(&empty).await, 0);
    let shrunken = fixed_with(&[("10.9.0.21", "pause")], &[], Some(&["a"]), &[]);
    b.look(&shrunken).await;
    assert_eq!(b.look(&shrunken).await, 0);
    assert_eq!(b.ledger().await, ["a", "b"]);
}

/// The wall clock stepped forward an hour makes a pod look old; its ADD finished moments ago
/// on the boot clock, and it is kept.
#[tokio::test]
async fn a_clock_step_does_not_age_a_young_pod() {
    let stepped = pod("stepped", "10.9.0.9");
    let b = Bench::new(60, vec![stepped.clone()]).await;
    b.node.core.births.stamp(&stepped.key);
    b.look(&nothing_seen()).await;
    assert_eq!(b.look(&nothing_seen()).await, 0);
    assert_eq!(b.ledger().await, ["stepped"]);
}

/// An ADD that finishes after the look began (its record's key re-ADDed in between) is
/// judged by the next look, never by this one.
#[tokio::test]
async fn an_add_committed_after_the_look_began_is_kept() {
    let r = pod("racing", "10.9.0.9");
    let b = Bench::new(0, vec![r.clone()]).await;
    b.look(&nothing_seen()).await;
    let c = b.node.collector();
    let began = c.core.births.gc_began(None, None);
    std::thread::sleep(Duration::from_millis(5));
    c.core.births.stamp(&r.key);
    assert_eq!(
        judge(&c, &nothing_seen(), began, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    assert_eq!(b.ledger().await, ["racing"]);
}

/// A delegate that cannot release a dead pod and whose store dipamd cannot read (its state
/// went with the pod): the record is forgotten, so that no new pod is refused for it.
#[tokio::test]
async fn a_dead_pod_the_delegate_cannot_release_is_forgotten() {
    let freed = Arc::new(Freed::default());
    let (_dir, node) = scripted_node_policy(
        &script("DEL) echo '{\"code\":11,\"msg\":\"no state\"}'; exit 1 ;;\n"),
        Arc::new(MemStore::new()),
        Events::new(vec![freed.clone() as Arc<dyn Observer>]),
        GcPolicy {
            grace: Duration::ZERO,
            ..GcPolicy::default()
        },
    );
    let r = pod("gone", "10.9.0.9");
    node.core.ledger(move |l| l.put(&r)).await.unwrap();
    let c = node.collector();
    for _ in 0..2 {
        let began = c.core.births.gc_began(None, None);
        judge(&c, &nothing_seen(), began, Duration::ZERO)
            .await
            .unwrap();
    }
    assert_eq!(node.core.ledger(|l| l.count()).await.unwrap(), 0);
    let f = freed.0.lock().unwrap().clone();
    assert!(f[0].2.contains("forgotten"), "{f:?}");
}

/// At a conflict, a holder the real look of this machine cannot find (its netns, route and
/// sandbox all gone) is forgotten and the ADD served once more; an agent holder never is.
#[tokio::test]
async fn a_conflict_with_a_dead_holder_serves_the_add_again() {
    let mut dead = pod("dead-holder", "10.9.0.9");
    dead.netns = "/var/run/netns/gone-with-the-reboot".into();
    let b = Bench::new(60, vec![dead]).await;
    let added = crate::testing::add_as(
        &b.node,
        crate::l1_leaves::access::Caller::ROOT,
        crate::testing::request("new-pod", "1.0.0", json!({})),
    )
    .await;
    assert!(added.is_ok(), "{added:?}");
    assert_eq!(b.ledger().await, ["new-pod"]);
    let f = b.freed.0.lock().unwrap().clone();
    assert_eq!(f[0].0, "conflict", "{f:?}");
    assert!(!b.dels().contains(&"dead-holder".to_owned()), "never DELed");

    let mut agent = pod("agent-router", "10.9.0.9");
    agent.owner = Owner::Agent {
        role: "router".into(),
    };
    let b = Bench::new(60, vec![agent]).await;
    let refused = crate::testing::add_as(
        &b.node,
        crate::l1_leaves::access::Caller::ROOT,
        crate::testing::request("new-pod", "1.0.0", json!({})),
    )
    .await;
    assert!(
        matches!(refused, Err(ShimError::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(b.ledger().await, ["agent-router"]);
}

/// On a dense node (real sled on disk, 3,000 pods made through CRI, the runtime listing all
/// but three): a look holds the few records it finds dead, not the ledger (it once held
/// every record, twice per look: docs/performance.md, run 32), and starts the chain of
/// exactly those three.
#[test]
fn a_look_on_a_dense_node_holds_the_dead_not_the_ledger() {
    use crate::testing::{dense, held};
    const N: usize = 3_000;
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let (d, _) = dense::pods(N);
    let gone = [0, 1_234, 2_998];
    let listed = dense::listed_but(N, &gone);
    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
    let scan = fixed_with(&[], &[], Some(&listed), &[]);
    let node = d.node.clone();
    let whole = d.whole(&rt);

    let c = node.collector();
    let (freed, peak) = held::measure(&rt, async {
        let began = c.core.births.gc_began(None, None);
        judge(&c, &scan, began, Duration::from_secs(3600))
            .await
            .unwrap()
    });
    assert_eq!(freed, 0, "a first look proves nothing");
    let mut chain: Vec<String> =
        c.gc.evidence
            .first_dead
            .lock()
            .unwrap()
            .keys()
            .map(|k| k.container_id.clone())
            .collect();
    chain.sort();
    let mut want: Vec<String> = gone.iter().map(|&i| dense::cid(i)).collect();
    want.sort();
    assert_eq!(chain, want);
    eprintln!("ledger decoded: {whole} B; the look's peak: {peak} B");
    assert!(
        peak * 10 < whole,
        "a look held {peak} B at its peak; the ledger takes {whole} B decoded"
    );
}
