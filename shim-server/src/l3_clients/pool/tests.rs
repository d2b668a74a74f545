//! The warm pool through the core and the RPCs: takes, refills, DEL and CHECK of pooled
//! pods, and a pool turned off at start.

use std::sync::{Arc, atomic::Ordering};

use dipam_proto::v1::CniRequest;
use dipam_state::{AttachmentState, Owner};

use super::refill::{init, step};
use crate::{l1_leaves::access::Caller, l5_node::node::Node, testing::add_as};
use std::time::Duration;

use dipam_proto::v1::Mode;
use dipam_state::MemStore;
use serde_json::json;
use tempfile::TempDir;

use super::*;
use crate::{
    l2_core::delegate::Executor,
    l5_node::rpc::{check, del},
};

/// A delegate that records each call and hands out 10.9.0.2, .3, ... in turn.
const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $CNI_ARGS" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}' ;;
ADD)
  if [ -f "$d/fail-add" ]; then echo '{"code":999,"msg":"no addresses"}'; exit 1; fi
  # The refiller makes entries concurrently: one counter update at a time.
  exec 9>"$d/lock"; flock 9
  n=$(cat "$d/n" 2>/dev/null || echo 1); n=$((n+1)); echo $n > "$d/n"
  echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.9.0.$n/24\",\"gateway\":\"10.9.0.1\"}]}" ;;
esac
"#;

struct Bench {
    dir: TempDir,
    node: Arc<Node>,
    store: Arc<MemStore>,
}

impl Bench {
    fn new(size: usize) -> Self {
        Self::with_marks(sizing::Watermarks::fixed(size))
    }

    fn with_marks(marks: sizing::Watermarks) -> Self {
        let store = Arc::new(MemStore::new());
        let (dir, node) = crate::testing::scripted_node(SCRIPT, store.clone());
        node.pool.configure(PoolConfig {
            marks,
            // One at a time: the scripted delegate's addresses follow the entries' order.
            batch: 1,
            node: "n1".into(),
            namespace: "kube-system".into(),
        });
        Self { dir, node, store }
    }

    /// Delegate calls other than VERSION, as "COMMAND CONTAINERID IFNAME ARGS".
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("VERSION"))
            .map(str::to_owned)
            .collect()
    }

    fn record(&self, cid: &str) -> Option<AttachmentRecord> {
        self.node
            .core
            .ledger
            .get(&AttachmentKey::new("net", cid, "eth0"))
            .unwrap()
    }

    fn entries(&self) -> Vec<AttachmentRecord> {
        self.node
            .core
            .ledger
            .list(None)
            .unwrap()
            .into_iter()
            .filter(|r| r.owner == Owner::Pool)
            .collect()
    }

    fn ready(&self) -> u32 {
        self.node.pool.status().iter().map(|p| p.ready).sum()
    }

    /// The refiller's rounds until it would sleep, as the background task runs them (a
    /// round that made entries plans again at once).
    async fn refill(&self) {
        settle(&self.node).await;
    }
}

/// Refiller rounds until one would sleep.
async fn settle(node: &Node) {
    for _ in 0..64 {
        if step(&node.refiller()).await > Duration::ZERO {
            return;
        }
    }
    panic!("the refiller never settles");
}

/// The RPC tests' request, with a netns and request id of the pod's own.
fn request(cid: &str, version: &str, extra: Value) -> CniRequest {
    CniRequest {
        request_id: format!("req-{cid}"),
        netns: format!("/var/run/netns/{cid}"),
        ..crate::testing::request(cid, version, extra)
    }
}

/// A pool of two: the first pod fills it (its own ADD goes to the delegate); the next
/// pod is answered from it with no delegate exec for the pod, in the request's version.
async fn filled(size: usize) -> Bench {
    let b = Bench::new(size);
    add_as(&b.node, Caller::ROOT, request("first", "1.0.0", json!({})))
        .await
        .unwrap();
    b.refill().await;
    assert_eq!(b.ready(), size as u32);
    b
}

#[tokio::test]
async fn a_pod_takes_an_entry_in_one_commit_without_a_delegate_exec() {
    let b = filled(2).await;
    let before = b.calls();
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(before[1].starts_with("ADD dipam-pool-n1-0 eth0 IgnoreUnknown=1;"));
    assert!(before[1].contains("K8S_POD_NAME=dipam-pool-n1-0"));

    // Only the first pod's result skipped the disk; the pool's own entries are on it.
    assert_eq!(b.store.process_commits(), 1);
    let out = add_as(&b.node, Caller::ROOT, request("pod", "1.1.0", json!({})))
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(v["ips"][0]["address"], "10.9.0.3/24");
    assert_eq!(b.calls(), before, "the pod's ADD ran the delegate");
    // The take, only into the kernel (Durability).
    assert_eq!(b.store.process_commits(), 2);

    let rec = b.record("pod").unwrap();
    assert_eq!(rec.owner, Owner::Pod);
    assert_eq!(rec.state, AttachmentState::Committed);
    assert_eq!(rec.netns, "/var/run/netns/pod");
    assert_eq!(rec.request_id, "req-pod");
    let d = rec.delegate_key.clone().unwrap();
    assert_eq!(
        (d.container_id.as_str(), d.ifname.as_str()),
        ("dipam-pool-n1-0", "eth0")
    );
    assert_eq!(d.netns, "/run/dipam/pool-netns/dipam-pool-n1-0");
    assert!(b.record("dipam-pool-n1-0").is_none(), "the entry stays");
    assert_eq!(b.entries().len(), 1);
    assert_eq!(b.node.pool.hits.load(Ordering::Relaxed), 1);

    // A repeated ADD is answered from the ledger, not from the pool again.
    let again = add_as(&b.node, Caller::ROOT, request("pod", "1.1.0", json!({})))
        .await
        .unwrap();
    assert_eq!(again, out);
    assert_eq!(b.entries().len(), 1);

    // The refiller brings it back to two.
    b.refill().await;
    assert_eq!(b.entries().len(), 2);
    assert!(
        b.calls()
            .last()
            .unwrap()
            .starts_with("ADD dipam-pool-n1-2 eth0")
    );
}

#[tokio::test]
async fn a_failed_take_commit_leaves_the_entry_in_the_pool() {
    let b = filled(2).await;
    let entries = b.entries();
    b.store.fail_next_commits(1);
    let e = add_as(&b.node, Caller::ROOT, request("pod", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(b.record("pod").is_none());
    assert_eq!(b.entries(), entries, "the pool lost or changed an entry");
    assert_eq!(b.ready(), 2);
    // The retry takes the same, oldest entry.
    add_as(&b.node, Caller::ROOT, request("pod", "1.0.0", json!({})))
        .await
        .unwrap();
    let d = b.record("pod").unwrap().delegate_key.unwrap();
    assert_eq!(d.container_id, entries[0].key.container_id);
}

/// A main-mode plugin (AddEarly) gets a pooled result before the take's commit, then the
/// outcome; when that commit fails, the outcome is the error and the entry stays.
#[tokio::test]
async fn an_early_take_answers_before_its_commit() {
    use dipam_proto::v1::cni_reply::Outcome;

    let b = filled(2).await;
    let replies = |cid: &'static str| {
        crate::testing::add_early_replies(&b.node, request(cid, "1.0.0", json!({})))
    };
    let entries = b.entries();
    b.store.fail_next_commits(1);
    let failed = replies("pod").await;
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].pending_commit);
    assert!(
        matches!(failed[1].outcome, Some(Outcome::Error(_))),
        "{failed:?}"
    );
    assert!(b.record("pod").is_none());
    assert_eq!(b.entries(), entries, "the pool lost or changed an entry");

    let before = b.calls();
    let taken = replies("pod").await;
    assert_eq!(taken.len(), 2, "{taken:?}");
    assert!(taken[0].pending_commit && !taken[1].pending_commit);
    assert_eq!(taken[0].outcome, taken[1].outcome);
    assert_eq!(b.calls(), before, "the pod's ADD ran the delegate");
    assert!(b.record("pod").unwrap().delegate_key.is_some());
}

#[tokio::test]
async fn del_and_check_of_a_pooled_pod_use_the_pool_key() {
    let b = filled(1).await;
    let out = add_as(&b.node, Caller::ROOT, request("pod", "1.0.0", json!({})))
        .await
        .unwrap();
    let prev: Value = serde_json::from_slice(&out).unwrap();
    check::run(
        &b.node,
        Caller::ROOT,
        request("pod", "1.0.0", json!({ "prevResult": prev.clone() })),
    )
    .await
    .unwrap();
    assert!(
        b.calls()
            .last()
            .unwrap()
            .starts_with("CHECK dipam-pool-n1-0 eth0 IgnoreUnknown=1;"),
        "{:?}",
        b.calls()
    );
    del::run(
        &b.node,
        Caller::ROOT,
        request("pod", "1.0.0", json!({ "prevResult": prev })),
    )
    .await
    .unwrap();
    assert!(
        b.calls()
            .last()
            .unwrap()
            .starts_with("DEL dipam-pool-n1-0 eth0 IgnoreUnknown=1;"),
        "{:?}",
        b.calls()
    );
    assert!(b.record("pod").is_none());
}

#[tokio::test]
async fn own_addresses_bypass_the_pool_and_pool_ids_are_reserved() {
    let b = filled(1).await;
    let mut req = request("ip-pod", "1.0.0", json!({}));
    req.cni_args = "IgnoreUnknown=1;IP=10.9.0.50".into();
    add_as(&b.node, Caller::ROOT, req).await.unwrap();
    assert!(b.calls().last().unwrap().starts_with("ADD ip-pod eth0"));
    add_as(
        &b.node,
        Caller::ROOT,
        request(
            "rc-pod",
            "1.0.0",
            json!({"runtimeConfig": {"ips": ["10.9.0.51/24"]}}),
        ),
    )
    .await
    .unwrap();
    assert!(b.calls().last().unwrap().starts_with("ADD rc-pod eth0"));
    assert_eq!(b.node.pool.bypassed.load(Ordering::Relaxed), 2);
    assert_eq!(b.entries().len(), 1, "a bypass took an entry");

    let calls = b.calls().len();
    let e = add_as(
        &b.node,
        Caller::ROOT,
        request("dipam-pool-n1-0", "1.0.0", json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code_and_details().0, 4, "{e}");
    let e = del::run(
        &b.node,
        Caller::ROOT,
        request("dipam-pool-n1-0", "1.0.0", json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code_and_details().0, 4, "{e}");
    assert_eq!(b.calls().len(), calls, "a runtime reached the pool's key");
    assert_eq!(b.entries().len(), 1);
}

#[tokio::test]
async fn per_pod_runtime_config_still_matches_and_a_new_config_replaces_the_pool() {
    let b = filled(1).await;
    add_as(&b.node, Caller::ROOT, request(
                "pm-pod",
                "1.0.0",
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 8080}]}, "args": {"cni": {"labels": []}}}),
            ),
        )
        .await
        .unwrap();
    assert!(b.record("pm-pod").unwrap().delegate_key.is_some());
    b.refill().await;
    let old = b.entries();
    assert_eq!(old.len(), 1);

    // The network's config changes: the next pod misses, and the old entry goes.
    let mut changed = request("new-pod", "1.0.0", json!({}));
    let mut conf: Value = serde_json::from_slice(&changed.stdin).unwrap();
    conf["ipam"]["delegate"]["subnet"] = json!("10.9.1.0/24");
    changed.stdin = serde_json::to_vec(&conf).unwrap();
    add_as(&b.node, Caller::ROOT, changed).await.unwrap();
    assert!(b.record("new-pod").unwrap().delegate_key.is_none());
    b.refill().await;
    let now = b.entries();
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].config_digest, old[0].config_digest);
    assert!(
        b.calls()
            .iter()
            .any(|c| c.starts_with(&format!("DEL {} eth0", old[0].key.container_id)))
    );
}

#[tokio::test]
async fn off_at_start_releases_every_entry_and_takes_none() {
    let b = filled(2).await;
    // The same ledger under a dipamd started with --warm-pool 0.
    let node = Node::new(
        Arc::new(MemStore::new()),
        Executor::new(vec![b.dir.path().to_owned()], Duration::from_secs(10)),
        b.node.core.identity.clone(),
        None,
        crate::l3_clients::gc::GcPolicy::default(),
        crate::l1_leaves::access::Admission::default(),
    );
    node.pool.configure(PoolConfig {
        marks: sizing::Watermarks::fixed(0),
        batch: 1,
        node: String::new(),
        namespace: "kube-system".into(),
    });
    for r in b.node.core.ledger.list(None).unwrap() {
        node.core.ledger.put(&r).unwrap();
    }
    for (name, value) in b.node.core.ledger.settings("").unwrap() {
        node.core.ledger.set_setting(&name, Some(&value)).unwrap();
    }
    assert_eq!(
        node.core.ledger.settings(TEMPLATE_SETTING).unwrap().len(),
        1
    );
    init(&node.refiller()).await.unwrap();
    add_as(&node, Caller::ROOT, request("pod", "1.0.0", json!({})))
        .await
        .unwrap();
    assert!(
        node.core
            .ledger
            .get(&AttachmentKey::new("net", "pod", "eth0"))
            .unwrap()
            .unwrap()
            .delegate_key
            .is_none()
    );
    step(&node.refiller()).await;
    let left: Vec<_> = node
        .core
        .ledger
        .list(None)
        .unwrap()
        .into_iter()
        .filter(|r| r.owner == Owner::Pool)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(node.core.ledger.settings(TEMPLATE_SETTING).unwrap(), vec![]);
}

#[test]
fn digests_ignore_per_pod_parts_and_own_ips_are_seen() {
    let dc = |extra: Value| {
        let req = request("x", "1.0.0", extra);
        DelegateConf::from_request(&req.stdin, Mode::Ipam).unwrap()
    };
    let plain = pool_digest(&dc(json!({})));
    assert_eq!(
        plain,
        pool_digest(&dc(
            json!({"runtimeConfig": {"portMappings": []}, "args": {"x": 1}})
        ))
    );
    assert_eq!(plain, pool_digest(&dc(json!({"cniVersion": "0.4.0"}))));
    assert_ne!(plain, pool_digest(&dc(json!({"mtu": 1400}))));
    let p = |extra: Value, args: &str| {
        let mut req = request("x", "1.0.0", extra);
        req.cni_args = args.into();
        let dc = DelegateConf::from_request(&req.stdin, Mode::Ipam).unwrap();
        let key = AttachmentKey::new("net", "x", "eth0");
        wants_own_ips(&Prepared {
            req,
            caller: crate::l1_leaves::access::Caller::ROOT,
            dc,
            key,
            issued: None,
        })
    };
    assert!(!p(json!({}), "IgnoreUnknown=1;K8S_POD_NAME=a"));
    assert!(p(json!({}), "IgnoreUnknown=1;IP=10.0.0.5"));
    assert!(!p(json!({}), "IP="));
    assert!(p(json!({"runtimeConfig": {"ips": ["10.0.0.5/24"]}}), ""));
    assert!(!p(json!({"runtimeConfig": {"ips": []}}), ""));
    assert!(p(json!({"args": {"cni": {"ips": ["10.0.0.5"]}}}), ""));
    assert_eq!(entry_number("dipam-pool-n1-17", "n1"), Some(17));
    assert_eq!(entry_number("dipam-pool-n1-x", "n1"), None);
    assert_eq!(entry_number("dipam-pool-n2-1", "n1"), None);
    assert_eq!(
        crate::l1_leaves::keys::internal("dipam-pool-anything"),
        Some(crate::l1_leaves::keys::Internal::Pool)
    );
}

/// A non-root caller's ADD on a pooled network (its delegate type allowed it, as
/// --non-root-delegate would), with a config of its own: never served from the pool, and its
/// config never becomes the template the pool is refilled with as root (docs/cfp.md §8.3):
/// the entry stays the one made from root's config.
#[tokio::test]
async fn a_non_root_callers_config_never_becomes_the_template() {
    let store = Arc::new(MemStore::new());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake-ipam");
    std::fs::write(&path, SCRIPT).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut exec = Executor::new(vec![dir.path().to_owned()], Duration::from_secs(10));
    exec.non_root_kinds = vec!["fake-ipam".into()];
    let node = crate::testing::node_on(store.clone(), exec);
    node.pool.configure(PoolConfig {
        marks: sizing::Watermarks::fixed(1),
        batch: 1,
        node: "n1".into(),
        namespace: "kube-system".into(),
    });
    let b = Bench { dir, node, store };
    add_as(&b.node, Caller::ROOT, request("first", "1.0.0", json!({})))
        .await
        .unwrap();
    b.refill().await;
    let before = b.entries();
    assert_eq!(before.len(), 1);

    let nobody = Caller {
        uid: 65534,
        admin: false,
    };
    let mut theirs = request("nobody-pod", "1.0.0", json!({}));
    let mut conf: Value = serde_json::from_slice(&theirs.stdin).unwrap();
    conf["ipam"]["delegate"]["subnet"] = json!("10.9.7.0/24");
    theirs.stdin = serde_json::to_vec(&conf).unwrap();
    add_as(&b.node, nobody, theirs).await.unwrap();
    let rec = b.record("nobody-pod").unwrap();
    assert!(rec.delegate_key.is_none(), "served from the pool: {rec:?}");
    assert_eq!(rec.creator_uid, Some(65534));
    b.refill().await;
    let after = b.entries();
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].config_digest, before[0].config_digest,
        "the pool took nobody's config as its template"
    );
    assert!(
        !b.calls().iter().any(|c| c.starts_with("DEL dipam-pool")),
        "root's entry was released for nobody's config: {:?}",
        b.calls()
    );
}

/// Demand raises the pool: every ADD that met it in the last 10 s adds one to the target, up
/// to --pool-max-above; `dipamctl status` shows the raised target and the network's pods.
#[tokio::test]
async fn recent_adds_raise_the_target_within_max_above() {
    let b = Bench::with_marks(sizing::Watermarks {
        target: 2,
        max_above: 3,
        ..sizing::Watermarks::default()
    });
    add_as(&b.node, Caller::ROOT, request("first", "1.0.0", json!({})))
        .await
        .unwrap();
    b.refill().await;
    // One ADD (a miss) in the window: 2 + 1.
    assert_eq!(b.ready(), 3);
    for i in 0..5 {
        add_as(
            &b.node,
            Caller::ROOT,
            request(&format!("p{i}"), "1.0.0", json!({})),
        )
        .await
        .unwrap();
        b.refill().await;
    }
    // Six ADDs: 2 + min(3, 6).
    let st = b.node.pool.status();
    assert_eq!((st[0].ready, st[0].target), (5, 5), "{st:?}");
    assert_eq!(st[0].in_use, 6);
    assert_eq!(st[0].hits, 5);
    assert_eq!(
        st[0].range_free, -1,
        "the scripted delegate's range is not known"
    );
    assert!(st[0].refills >= 10);
}

/// A pod's ADD the delegate refuses takes a pooled entry (the rescue): with the delegate out
/// of addresses and one entry ready but claimed when the pod looked, the pod still succeeds.
#[tokio::test]
async fn an_add_the_delegate_refuses_takes_a_pooled_entry() {
    let b = filled(1).await;
    std::fs::write(b.dir.path().join("fail-add"), "").unwrap();
    // The pod missed the pool (emulated: the entry is held aside while it looks), then the
    // delegate refused it.
    let entry = b
        .node
        .pool
        .claim("net", &b.node.pool.status()[0].config_digest)
        .unwrap();
    let p = b
        .node
        .prepare(request("pod", "1.0.0", json!({})), true, Caller::ROOT)
        .unwrap();
    let refused = crate::l2_core::core::attach::attach(
        &b.node.core,
        &p,
        Owner::Pod,
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    .unwrap_err();
    let digest = entry.config_digest.clone();
    b.node.pool.unclaim(&digest, entry);
    let served = take::rescue(
        &b.node.core,
        &b.node.pool,
        &p,
        &refused,
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    .unwrap()
    .expect("served from the pool");
    let v: Value = serde_json::from_slice(&served).unwrap();
    assert_eq!(v["ips"][0]["address"], "10.9.0.3/24");
    assert_eq!(b.record("pod").unwrap().owner, Owner::Pod);
    assert!(b.entries().is_empty());
    assert_eq!(b.node.pool.status()[0].rescues, 1);
    // With nothing pooled and nothing being made, the refusal stands.
    let q = b
        .node
        .prepare(request("late", "1.0.0", json!({})), true, Caller::ROOT)
        .unwrap();
    let none = take::rescue(
        &b.node.core,
        &b.node.pool,
        &q,
        &refused,
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    .unwrap();
    assert!(none.is_none());
}
