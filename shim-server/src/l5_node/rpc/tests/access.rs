//! Non-root callers against the RPC flows (docs/cfp.md, "Threat model"): what they may exec,
//! which records they may touch and see, and what the services refuse them. The lifecycle
//! test `security.rs` runs the same as a real uid against a real dipamd.

use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use dipam_proto::v1::ListAttachmentsRequest;
use dipam_state::{AttachmentKey, AttachmentRecord, MemStore};
use serde_json::json;
use tempfile::TempDir;

use crate::l5_node::rpc::{admin, check, del, gc};
use crate::testing::{add_as, request};
use crate::{
    l1_leaves::access::Caller,
    l1_leaves::error::{ShimError, codes},
    l2_core::delegate::Executor,
    l5_node::node::Node,
};

/// Records each call in `calls` next to itself, tagged with its directory's `tag`.
const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$(cat "$d/tag") $CNI_COMMAND $CNI_CONTAINERID" >> "$d/../calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
ADD)
  # A fresh address per ADD, as an IPAM hands them out (dipamd refuses a duplicate).
  n=$(cat "$d/../next" 2>/dev/null || echo 2); echo $((n + 1)) > "$d/../next"
  echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.9.0.$n/24\"}]}" ;;
esac
"#;

const USER: Caller = Caller {
    uid: 1000,
    admin: false,
};
const OTHER: Caller = Caller {
    uid: 1001,
    admin: false,
};

struct Bench {
    dir: TempDir,
    node: Arc<Node>,
}

/// dipamd's own directory `trusted/` and a caller's `mine/`, each with a `fake-ipam`.
fn bench() -> Bench {
    bench_on(Arc::new(MemStore::new()))
}

fn bench_on(store: Arc<dyn dipam_state::Store>) -> Bench {
    let dir = tempfile::tempdir().unwrap();
    for tag in ["trusted", "mine"] {
        let d = dir.path().join(tag);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("tag"), tag).unwrap();
        std::fs::write(d.join("fake-ipam"), SCRIPT).unwrap();
        std::fs::set_permissions(d.join("fake-ipam"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    let mut exec = Executor::new(vec![dir.path().join("trusted")], Duration::from_secs(10));
    exec.non_root_kinds = vec!["fake-ipam".into()];
    let node =
        crate::testing::node_on_with(store, exec, crate::l3_clients::gc::GcPolicy::default());
    Bench { dir, node }
}

impl Bench {
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.contains("VERSION"))
            .map(str::to_owned)
            .collect()
    }

    fn record(&self, network: &str, cid: &str) -> Option<AttachmentRecord> {
        self.node
            .core
            .ledger
            .get(&AttachmentKey::new(network, cid, "eth0"))
            .unwrap()
    }

    fn mine(&self) -> String {
        self.dir.path().join("mine").display().to_string()
    }
}

fn forbidden(e: ShimError) -> String {
    assert!(matches!(e, ShimError::Forbidden { .. }), "{e:?}");
    let (code, details) = e.code_and_details();
    assert_eq!(code, codes::PERMISSION_DENIED);
    assert!(!details.is_empty());
    e.to_string()
}

/// Point 1 of the threat model: a non-root caller's CNI_PATH never chooses the binary root
/// runs, nor what the ledger keeps for replays; root's still does.
#[tokio::test]
async fn a_non_root_callers_cni_path_never_picks_the_binary() {
    let b = bench();
    let mut req = request("u1", "1.0.0", json!({}));
    req.cni_path = format!("{}:/nonexistent", b.mine());
    add_as(&b.node, USER, req).await.unwrap();
    assert_eq!(b.calls(), vec!["trusted ADD u1"]);
    let rec = b.record("net", "u1").unwrap();
    assert_eq!(rec.creator_uid, Some(1000));
    assert_eq!(
        rec.cni_path, "",
        "the caller's directories are not recorded"
    );

    // dipamd's own directory named in CNI_PATH is kept.
    let trusted = b.dir.path().join("trusted").display().to_string();
    let mut req = request("u2", "1.0.0", json!({}));
    req.cni_path = format!("{}:{trusted}", b.mine());
    add_as(&b.node, USER, req).await.unwrap();
    assert_eq!(b.record("net", "u2").unwrap().cni_path, trusted);

    // Root's CNI_PATH is the runtime's, used as sent.
    let mut req = request("r1", "1.0.0", json!({}));
    req.cni_path = b.mine();
    add_as(&b.node, Caller::ROOT, req).await.unwrap();
    assert_eq!(b.calls().last().unwrap(), "mine ADD r1");
    assert_eq!(b.record("net", "r1").unwrap().creator_uid, None);
}

/// A non-root caller's ADD reads its quotas and the container IDs in use from the ledger's
/// census, and the address index was built at start: with 300 records in the ledger, no ADD
/// (non-root or root, the first of its network after the start included), no refusal, and
/// no status count reads more than one record. Each scanned every record before (1.3 s of
/// `dipamctl status` and 437 ms of a first ADD at 2,500, docs/performance.md); the quotas
/// still count what the ledger held before the start.
#[tokio::test]
async fn no_add_and_no_status_count_scans_the_ledger() {
    let store = Arc::new(crate::testing::CountingStore::default());
    let b = bench_on(store.clone());
    for i in 0..300 {
        let mut r = crate::testing::record(
            &format!("old{i}"),
            dipam_state::Owner::Pod,
            dipam_state::AttachmentState::Committed,
            1,
        );
        r.result = Some(
            json!({"cniVersion":"1.0.0","ips":[{"address": format!("10.8.{}.{}/16", i / 200, i % 200 + 2)}]}),
        );
        r.creator_uid = (i < 3).then_some(1000);
        b.node.core.ledger.put(&r).unwrap();
    }
    let uid_max = b.node.admission.quotas.limits().records;
    b.node.core.index_ledger().await.unwrap();
    let at_start = store.scans.load(std::sync::atomic::Ordering::SeqCst);
    for i in 0..4 {
        add_as(&b.node, USER, request(&format!("u{i}"), "1.0.0", json!({})))
            .await
            .unwrap();
    }
    add_as(&b.node, Caller::ROOT, request("r0", "1.0.0", json!({})))
        .await
        .unwrap();
    // A container ID another caller uses is refused from the census too.
    let e = add_as(&b.node, OTHER, request("u0", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(forbidden(e).contains("another caller"));
    assert_eq!(b.node.core.ledger.count().unwrap(), 305);
    assert_eq!(
        b.node.core.ledger.census(|c| c.of_uid(1000).0).unwrap(),
        7,
        "the 3 records from before the start and the 4 ADDs (quota {uid_max})"
    );
    // `dipamctl status` (its ranges from the census, its doctor count without the stores'
    // comparisons) reads one record per group of the census, not every record.
    let st = super::super::admin::status::run(&b.node, false)
        .await
        .unwrap();
    let pods: u64 = st.ranges.iter().map(|r| r.pods).sum();
    assert_eq!(pods, 297 + 1, "root's 297 records and r0: {:?}", st.ranges);
    assert!(
        st.ranges
            .iter()
            .all(|r| r.counted == "ledger" && r.orphans.is_none())
    );
    super::super::admin::doctor::run(&b.node, true)
        .await
        .unwrap();
    assert_eq!(st.attachments, 305);
    assert_eq!(
        store.scans.load(std::sync::atomic::Ordering::SeqCst),
        at_start,
        "a request read every record"
    );
}

#[tokio::test]
async fn a_non_root_caller_runs_only_the_allowed_delegate_types() {
    let b = bench();
    let req = request(
        "u1",
        "1.0.0",
        json!({"ipam": {"type": "dipam", "delegate": {"type": "host-device"}}}),
    );
    let msg = forbidden(add_as(&b.node, USER, req).await.unwrap_err());
    assert!(msg.contains("host-device"), "{msg}");
    assert!(b.calls().is_empty());
}

/// A non-root caller touches only what it created: root's attachments and other callers'
/// stay, whatever verb it sends.
#[tokio::test]
async fn a_non_root_caller_may_check_and_del_only_its_own() {
    let b = bench();
    let prev = json!({"prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/24"}]}});
    add_as(&b.node, Caller::ROOT, request("root1", "1.0.0", json!({})))
        .await
        .unwrap();

    forbidden(
        del::run(&b.node, USER, request("root1", "1.0.0", json!({})))
            .await
            .unwrap_err(),
    );
    forbidden(
        check::run(&b.node, USER, request("root1", "1.0.0", prev.clone()))
            .await
            .unwrap_err(),
    );
    // Its own ADD under root's key: refused, not answered with root's result.
    forbidden(
        add_as(&b.node, USER, request("root1", "1.0.0", json!({})))
            .await
            .unwrap_err(),
    );
    // Under root's container ID in another network: refused too (delegates release by ID).
    let other_net = request("root1", "1.0.0", json!({"name": "net2"}));
    let msg = forbidden(add_as(&b.node, USER, other_net).await.unwrap_err());
    assert!(msg.contains("container ID"), "{msg}");
    assert!(b.record("net2", "root1").is_none());
    assert_eq!(b.calls(), vec!["trusted ADD root1"]);
    assert!(b.record("net", "root1").is_some());

    // A key with no record: nothing of the caller's, the delegate is not run; an ADD issued
    // before that DEL still cannot bring the key back.
    let earlier_add = request("ghost", "1.0.0", json!({}));
    tokio::time::sleep(Duration::from_millis(2)).await;
    del::run(&b.node, USER, request("ghost", "1.0.0", json!({})))
        .await
        .unwrap();
    assert_eq!(b.calls().len(), 1);
    let e = add_as(&b.node, USER, earlier_add).await.unwrap_err();
    assert!(matches!(e, ShimError::StaleAdd { .. }), "{e:?}");
    assert_eq!(b.calls().len(), 1);

    // Its own: CHECK and DEL work, and no one else's uid may.
    let u1 = add_as(&b.node, USER, request("u1", "1.0.0", json!({})))
        .await
        .unwrap();
    // Its own address (the fake hands out a fresh one per ADD).
    let prev = json!({ "prevResult": serde_json::from_slice::<serde_json::Value>(&u1).unwrap() });
    forbidden(
        del::run(&b.node, OTHER, request("u1", "1.0.0", json!({})))
            .await
            .unwrap_err(),
    );
    check::run(&b.node, USER, request("u1", "1.0.0", prev))
        .await
        .unwrap();
    del::run(&b.node, USER, request("u1", "1.0.0", json!({})))
        .await
        .unwrap();
    assert!(b.record("net", "u1").is_none());
    // Root may act on anyone's.
    add_as(&b.node, USER, request("u2", "1.0.0", json!({})))
        .await
        .unwrap();
    del::run(&b.node, Caller::ROOT, request("u2", "1.0.0", json!({})))
        .await
        .unwrap();
    assert!(b.record("net", "u2").is_none());
}

/// A non-root DEL of a key it holds nothing under, stamped a day ahead (issue 38 §3): it
/// succeeds and does nothing; root's and another uid's ADDs of that key are served (its
/// tombstone binds its own uid alone), and its own ADD issued after it is served too (the
/// stamp was clamped to dipamd's now). Before, root's ADD of the key failed with 3 for ten
/// minutes.
#[tokio::test]
async fn a_non_root_del_from_the_future_blocks_no_one_elses_add() {
    let b = bench();
    let ahead = |cid: &str| {
        let mut r = request(cid, "1.0.0", json!({}));
        if let Some(s) = r.issued_at.as_mut() {
            s.ns += 86_400_000_000_000;
        }
        r
    };
    for cid in ["roots", "others", "own"] {
        del::run(&b.node, USER, ahead(cid)).await.unwrap();
    }
    assert!(b.calls().is_empty(), "nothing of the caller's to release");
    tokio::time::sleep(Duration::from_millis(2)).await;
    add_as(&b.node, Caller::ROOT, request("roots", "1.0.0", json!({})))
        .await
        .unwrap();
    add_as(&b.node, OTHER, request("others", "1.0.0", json!({})))
        .await
        .unwrap();
    add_as(&b.node, USER, request("own", "1.0.0", json!({})))
        .await
        .unwrap();
    for cid in ["roots", "others", "own"] {
        assert!(b.record("net", cid).is_some(), "{cid}");
    }
    // Root's DEL from the future is clamped as well: root's next ADD is served.
    del::run(&b.node, Caller::ROOT, ahead("roots"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    add_as(&b.node, Caller::ROOT, request("roots", "1.0.0", json!({})))
        .await
        .unwrap();
    assert!(b.record("net", "roots").is_some());
}

#[tokio::test]
async fn gc_is_roots_and_the_listing_shows_a_caller_its_own() {
    let b = bench();
    add_as(&b.node, Caller::ROOT, request("root1", "1.0.0", json!({})))
        .await
        .unwrap();
    add_as(&b.node, USER, request("u1", "1.0.0", json!({})))
        .await
        .unwrap();
    let mut gc_req = request("", "1.1.0", json!({"cni.dev/valid-attachments": []}));
    gc_req.container_id.clear();
    forbidden(gc::run(&b.node, USER, None, gc_req).await.unwrap_err());
    assert!(b.record("net", "root1").is_some());

    let listed = |c: Caller| {
        let node = Arc::clone(&b.node);
        async move {
            let mut ids: Vec<_> =
                admin::attachments::run(&node, c, ListAttachmentsRequest::default())
                    .await
                    .unwrap()
                    .attachments
                    .into_iter()
                    .map(|a| (a.container_id, a.creator_uid))
                    .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(listed(USER).await, vec![("u1".to_owned(), Some(1000))]);
    assert!(listed(OTHER).await.is_empty());
    let admin = Caller {
        uid: 1002,
        admin: true,
    };
    assert_eq!(listed(admin).await.len(), 2);
    assert_eq!(listed(Caller::ROOT).await.len(), 2);
}

/// A GC whose list names nothing asks whether the network has a pod from the census: no
/// record is read (it read every network's records, the whole ledger, per such GC), and
/// only a pod on that network counts, not the warm pool's or the agent's entries there, nor
/// a pod on another network.
#[tokio::test]
async fn a_gc_that_names_nothing_reads_no_record() {
    use dipam_state::{AttachmentState as S, Owner};
    let store = Arc::new(crate::testing::CountingStore::default());
    let b = bench_on(store.clone());
    let mut elsewhere = crate::testing::record("p-other", Owner::Pod, S::Committed, 1);
    elsewhere.key.network = "other".into();
    let recs = [
        crate::testing::record("dipam-pool-x-1", Owner::Pool, S::Committed, 1),
        crate::testing::record(
            "agent",
            Owner::Agent {
                role: "router".into(),
            },
            S::Committed,
            1,
        ),
        elsewhere,
    ];
    b.node
        .core
        .ledger
        .put_all(&recs, dipam_state::Durability::SurvivesPowerCut)
        .unwrap();
    b.node.core.index_ledger().await.unwrap();
    let scans = || store.scans.load(std::sync::atomic::Ordering::SeqCst);
    let before = scans();
    let names_nothing = || {
        let mut r = request("", "1.1.0", json!({"cni.dev/valid-attachments": []}));
        r.container_id.clear();
        r
    };
    gc::run(&b.node, Caller::ROOT, None, names_nothing())
        .await
        .expect("no pod on the network: nothing to free, a success");
    assert_eq!(scans(), before, "the GC read the ledger");
    let pod = crate::testing::record("p1", Owner::Pod, S::Committed, 1);
    b.node.core.ledger.put(&pod).unwrap();
    let e = gc::run(&b.node, Caller::ROOT, None, names_nothing())
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
    assert_eq!(scans(), before, "the GC read the ledger");
}

/// The services: Admin and Agent for root and --admin-uid only; a request that carries no
/// peer credentials is the least trusted caller, never root.
#[tokio::test]
async fn admin_and_agent_services_need_an_admin() {
    use dipam_proto::v1::{
        AgentListRequest, AgentRoleRequest, StatusRequest, admin_server::Admin, agent_server::Agent,
    };
    let b = bench();
    let svc = crate::l6_transport::service::Service(Arc::clone(&b.node));
    let with = |c: Option<Caller>| {
        let mut r = tonic::Request::new(StatusRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            stores: false,
        });
        if let Some(c) = c {
            r.extensions_mut().insert(c);
        }
        r
    };
    for c in [None, Some(USER)] {
        let e = svc.get_status(with(c)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let mut r = tonic::Request::new(AgentListRequest::default());
        if let Some(c) = c {
            r.extensions_mut().insert(c);
        }
        let e = Agent::list(&svc, r).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    let admin = Caller {
        uid: 1002,
        admin: true,
    };
    svc.get_status(with(Some(admin))).await.unwrap();

    // Bad and oversized input to the Agent service: the right code, never the input echoed.
    let role = |role: String| {
        let mut r = tonic::Request::new(AgentRoleRequest {
            role,
            protocol_version: dipam_proto::PROTOCOL_VERSION,
        });
        r.extensions_mut().insert(Caller::ROOT);
        r
    };
    let e = svc.allocate(role("x".repeat(1 << 20))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().len() < 200, "{}", e.message().len());
    let e = svc.allocate(role("y".repeat(200))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().len() < 300, "{}", e.message());
}

/// Records written before the creator's uid existed are root's, and root's records keep
/// their exact bytes (the field is not written when absent).
#[test]
fn records_without_a_creator_are_roots() {
    let key = AttachmentKey::new("net", "c1", "eth0");
    let rec = AttachmentRecord {
        key,
        owner: dipam_state::Owner::Pod,
        state: dipam_state::AttachmentState::Committed,
        delegate_type: "host-local".into(),
        delegate_version: "1.0.0".into(),
        delegate_config: "{}".into(),
        netns: String::new(),
        cni_args: String::new(),
        cni_path: String::new(),
        result: None,
        config_digest: String::new(),
        request_id: String::new(),
        created_at: 0,
        updated_at: 0,
        issued_ms: 0,
        issued_at: None,
        delegate_key: None,
        creator_uid: None,
        cri_pod: None,
    };
    let text = serde_json::to_value(&rec).unwrap();
    assert!(text.get("creator_uid").is_none(), "{text}");
    let back: AttachmentRecord = serde_json::from_value(text).unwrap();
    assert!(USER.owns(Some(1000)) && !USER.owns(back.creator_uid));
    assert!(Caller::ROOT.owns(Some(1000)));
}

/// dipamd's start reads every record once: the census, the address index and the metrics'
/// counts come from one pass that decodes one record at a time, and the replay of
/// interrupted operations, the warm pool's start and the agent's passes read only their own
/// records, through the census. Each of those read (and held) every record before: 1.4 s
/// and 176 MiB at 10,000 attachments (docs/performance.md, run 29).
#[tokio::test]
async fn the_start_reads_the_ledger_once() {
    use dipam_state::{AttachmentState as S, Owner};
    let store = Arc::new(crate::testing::CountingStore::default());
    let b = bench_on(store.clone());
    let put = |cid: &str, owner: Owner, state: S, ip: Option<String>| {
        let mut r = crate::testing::record(cid, owner, state, 1);
        r.result = ip.map(|ip| json!({"cniVersion":"1.0.0","ips":[{"address": ip}]}));
        r
    };
    let mut recs: Vec<AttachmentRecord> = (0..300)
        .map(|i| {
            let ip = format!("10.8.{}.{}/16", i / 200, i % 200 + 2);
            put(&format!("old{i}"), Owner::Pod, S::Committed, Some(ip))
        })
        .collect();
    recs.push(put("int0", Owner::Pod, S::Adding, None));
    recs.push(put(
        "int1",
        Owner::Pod,
        S::Deleting,
        Some("10.8.3.1/16".into()),
    ));
    let mut theirs = put("intu", Owner::Pod, S::Adding, None);
    theirs.creator_uid = Some(1000);
    recs.push(theirs);
    recs.push(put(
        "dipam-pool-x-7",
        Owner::Pool,
        S::Committed,
        Some("10.8.3.2/16".into()),
    ));
    let role = Owner::Agent {
        role: "router".into(),
    };
    recs.push(put("agent", role, S::Committed, Some("10.8.3.3/16".into())));
    b.node
        .core
        .ledger
        .put_all(&recs, dipam_state::Durability::SurvivesPowerCut)
        .unwrap();
    let scans = || store.scans.load(std::sync::atomic::Ordering::SeqCst);
    let before = scans();

    let by = b.node.core.index_ledger().await.unwrap();
    assert_eq!(scans(), before + 1, "the census and the index read it once");
    assert_eq!(by.get(&("pod".into(), "net".into())), Some(&303));
    let replay = crate::l5_node::replay::interrupted::replay(&b.node)
        .await
        .unwrap();
    assert_eq!((replay.released, replay.failed), (2, 0));
    crate::l3_clients::pool::refill::init(&b.node.refiller())
        .await
        .unwrap();
    let reconciler = b.node.reconciler();
    crate::l3_clients::agent::reconcile::init(&reconciler)
        .await
        .unwrap();
    crate::l3_clients::agent::reconcile::pass(&reconciler)
        .await
        .unwrap();
    assert_eq!(scans(), before + 1, "a start-up pass read every record");

    // Root's interrupted operations went; the non-root caller's waits for its own replay.
    assert!(b.record("net", "int0").is_none() && b.record("net", "int1").is_none());
    assert!(b.record("net", "intu").is_some());
    // The agent's address, kept unmanaged, is indexed: no pod may take it.
    let agent_ip: std::net::IpAddr = "10.8.3.3".parse().unwrap();
    assert!(b.node.agent.owner_of(&agent_ip).is_some());
    assert_eq!(b.node.core.ledger.count().unwrap(), 303);
}
