//! The RPC flows against the in-memory ledger and a scripted delegate (a shell script that
//! records each call and answers as told), so every branch runs without root.

use std::{os::unix::fs::PermissionsExt, path::Path, sync::Arc, time::Duration};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, MemStore, Owner};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::{check, del};
use crate::l1_leaves::access::Caller;
use crate::{
    l1_leaves::error::ShimError,
    l5_node::node::Node,
    l5_node::replay::interrupted as replay,
    testing::{add_as, add_early_replies, request, scripted_node, scripted_node_with},
};

/// Non-root callers against the same flows.
mod access;

const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
cat > "$d/stdin-$CNI_COMMAND"
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}' ;;
ADD)
  if [ -f "$d/slow-add" ]; then sleep 0.4; fi
  if [ -f "$d/fail-add" ]; then cat "$d/fail-add"; exit 1; fi
  if [ -f "$d/garbage-add" ]; then echo 'this is not json'; exit 0; fi
  if [ -f "$d/panic-add" ]; then echo 'panic: runtime error' >&2; exit 2; fi
  # A fresh address per ADD, .2 first, as an IPAM hands them out (dipamd refuses a duplicate).
  n=$(cat "$d/next" 2>/dev/null || echo 2); echo $((n + 1)) > "$d/next"
  echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.9.0.$n/24\",\"gateway\":\"10.9.0.1\"}],\"dns\":{}}"
  if [ -f "$d/slow-add" ]; then touch "$d/add-done"; fi
  if [ -f "$d/linger-add" ]; then sleep 0.5; touch "$d/exited"; fi
  if [ -f "$d/more-add" ]; then sleep 0.1; echo 'and one more thing'; fi
  if [ -f "$d/exit-add" ]; then sleep 0.1; exit 1; fi ;;
DEL)
  if [ -f "$d/fail-del" ]; then echo '{"code":999,"msg":"release failed"}'; exit 1; fi ;;
esac
"#;

struct Bench {
    dir: TempDir,
    node: Arc<Node>,
    /// The shim's store, for its test knobs (commit counts, injected faults).
    store: Arc<MemStore>,
}

impl Bench {
    fn new() -> Self {
        Self::with_store(MemStore::new())
    }

    fn with_store(store: MemStore) -> Self {
        let store = Arc::new(store);
        let (dir, node) = scripted_node(SCRIPT, store.clone());
        Self { dir, node, store }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("VERSION"))
            .map(str::to_owned)
            .collect()
    }

    fn touch(&self, name: &str, content: &str) {
        std::fs::write(self.path(name), content).unwrap();
    }

    fn record(&self, cid: &str) -> Option<AttachmentRecord> {
        self.node
            .core
            .ledger
            .get(&AttachmentKey::new("net", cid, "eth0"))
            .unwrap()
    }
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn read(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[tokio::test]
async fn add_commits_and_converts_to_the_config_version() {
    let b = Bench::new();
    let out = add_as(&b.node, Caller::ROOT, request("c1", "1.1.0", json!({})))
        .await
        .unwrap();
    let v = json_of(&out);
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(v["ips"][0]["address"], "10.9.0.2/24");
    // The delegate stops at 1.0.0 and got 1.0.0, with ipam swapped for the delegate object.
    let sent = read(&b.path("stdin-ADD"));
    assert_eq!(sent["cniVersion"], "1.0.0");
    assert_eq!(sent["ipam"]["type"], "fake-ipam");
    let rec = b.record("c1").unwrap();
    assert_eq!(rec.state, AttachmentState::Committed);
    assert_eq!(rec.owner, Owner::Pod);
    assert_eq!(rec.delegate_version, "1.0.0");
    // The intent went to the disk, the pod's result only into the kernel (Durability).
    assert_eq!(b.store.process_commits(), 1);

    let legacy = json_of(
        &add_as(&b.node, Caller::ROOT, request("c2", "0.4.0", json!({})))
            .await
            .unwrap(),
    );
    assert_eq!(legacy["ips"][0]["version"], "4");
}

#[tokio::test]
async fn the_agents_result_goes_to_the_disk() {
    let b = Bench::new();
    let p = b
        .node
        .prepare(request("agent", "1.0.0", json!({})), true, Caller::ROOT)
        .unwrap();
    let owner = Owner::Agent {
        role: "router".into(),
    };
    crate::l2_core::core::attach::attach(
        &b.node.core,
        &p,
        owner.clone(),
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    .unwrap();
    assert_eq!(b.record("agent").unwrap().owner, owner);
    // It must outlive a reboot (the agent comes back expecting it): no Process commit.
    assert_eq!(b.store.process_commits(), 0);
}

#[tokio::test]
async fn repeated_add_answers_from_the_ledger_and_changed_config_is_refused() {
    let b = Bench::new();
    let first = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    let again = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(b.calls(), vec!["ADD c1"]);
    let changed = request(
        "c1",
        "1.0.0",
        json!({"runtimeConfig": {"ips": ["10.9.0.7"]}}),
    );
    let e = add_as(&b.node, Caller::ROOT, changed).await.unwrap_err();
    assert!(matches!(e, ShimError::ExistsWithOtherConfig { .. }), "{e}");
    assert_eq!(b.calls(), vec!["ADD c1"]);
}

#[tokio::test]
async fn delegate_error_passes_through_and_leaves_no_record() {
    let b = Bench::new();
    b.touch(
        "fail-add",
        r#"{"code":999,"msg":"no IP addresses available","details":"range full"}"#,
    );
    let e = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap_err();
    let ShimError::Delegate(f) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(f.code, 999);
    assert_eq!(f.msg, "no IP addresses available");
    assert!(b.record("c1").is_none());
    // A clean CNI error means the delegate holds nothing: no rollback DEL.
    assert_eq!(b.calls(), vec!["ADD c1"]);
}

/// The result is taken up as soon as the delegate has written it (delegate::exec::collect):
/// committed while the delegate is still exiting.
#[tokio::test]
async fn the_result_is_committed_while_the_delegate_exits() {
    let b = Bench::new();
    b.touch("linger-add", "");
    let node = b.node.clone();
    let adding = tokio::spawn(async move {
        add_as(&node, Caller::ROOT, request("c1", "1.0.0", json!({}))).await
    });
    let started = std::time::Instant::now();
    while b
        .record("c1")
        .is_none_or(|r| r.state != AttachmentState::Committed)
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never committed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !b.path("exited").exists(),
        "committed only after the delegate exited"
    );
    let out: Value = serde_json::from_slice(&adding.await.unwrap().unwrap()).unwrap();
    assert_eq!(out["ips"][0]["address"], "10.9.0.2/24");
    assert!(b.path("exited").exists());
    assert_eq!(b.calls(), vec!["ADD c1"]);
}

/// A result is success only with exit 0 and nothing else written: a delegate that wrote a
/// result and then failed, or kept writing, holds an address it never stood by. Released,
/// even though the result was already committed.
#[tokio::test]
async fn a_result_the_delegate_does_not_stand_by_is_rolled_back() {
    for (flag, expect) in [("exit-add", "status 1"), ("more-add", "wrote more")] {
        let b = Bench::new();
        b.touch(flag, "");
        let e = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains(expect), "{flag}: {e:?}");
        assert_eq!(b.calls(), vec!["ADD c1", "DEL c1"], "{flag}");
        assert!(b.record("c1").is_none(), "{flag}");
    }
}

#[tokio::test]
async fn garbage_from_the_delegate_is_rolled_back() {
    let b = Bench::new();
    b.touch("garbage-add", "");
    let e = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::DelegateBadOutput { .. }), "{e:?}");
    assert_eq!(b.calls(), vec!["ADD c1", "DEL c1"]);
    assert!(b.record("c1").is_none());
}

#[tokio::test]
async fn a_delegate_that_dies_with_only_stderr_is_rolled_back() {
    let b = Bench::new();
    b.touch("panic-add", "");
    let e = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap_err();
    let ShimError::Delegate(f) = &e else {
        panic!("{e:?}")
    };
    assert!(f.msg.contains("panic"), "{e:?}");
    assert_eq!(b.calls(), vec!["ADD c1", "DEL c1"]);
    assert!(b.record("c1").is_none());
}

#[tokio::test]
async fn a_missing_delegate_is_not_rolled_back() {
    let b = Bench::new();
    let mut req = request("c1", "1.0.0", json!({}));
    req.stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.0.0", "name": "net", "type": "ptp",
        "ipam": {"type": "dipam", "delegate": {"type": "not-installed"}}
    }))
    .unwrap();
    let e = add_as(&b.node, Caller::ROOT, req).await.unwrap_err();
    assert!(matches!(e, ShimError::DelegateNotFound { .. }), "{e:?}");
    assert!(b.calls().is_empty());
    assert!(b.record("c1").is_none());
}

#[tokio::test]
async fn gc_without_a_list_is_refused() {
    let b = Bench::new();
    let shapes = [
        json!({}),
        json!({"cni.dev/valid-attachments": null}),
        json!({"cni.dev/valid-attachments": []}),
    ];
    // No pod recorded on the network: nothing such a GC could free, so it succeeds and runs
    // nothing (CRI-O's start-up GC of a network without pods sends null, docs/cfp.md §7.4).
    for extra in shapes.clone() {
        super::gc::run(&b.node, Caller::ROOT, None, request("", "1.1.0", extra))
            .await
            .unwrap_or_else(|e| panic!("a GC of a network without pods: {e:?}"));
    }
    assert!(
        b.calls().is_empty(),
        "a GC with nothing to free runs nothing"
    );
    // With a pod on the network, a list that names nothing would free it: refused.
    add_as(&b.node, Caller::ROOT, request("c1", "1.1.0", json!({})))
        .await
        .unwrap();
    let before = b.calls().len();
    for extra in shapes {
        let e = super::gc::run(&b.node, Caller::ROOT, None, request("", "1.1.0", extra))
            .await
            .unwrap_err();
        assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
    }
    assert_eq!(
        b.node
            .gc
            .stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert_eq!(b.calls().len(), before, "a refused GC runs nothing");
    assert!(b.record("c1").is_some(), "the pod keeps its address");
}

/// While the ledger cannot take commits (a full disk), CNI STATUS answers 50 with the cause,
/// dipamctl status is not ready and says why (and still answers), and doctor fails a check;
/// once commits succeed again all three say so.
#[tokio::test]
async fn a_ledger_that_cannot_commit_is_reported_everywhere() {
    let metrics = Arc::new(crate::l4_observers::metrics::Metrics::new());
    let store = Arc::new(MemStore::new());
    let (dir, node) = scripted_node_with(
        SCRIPT,
        store.clone(),
        crate::l1_leaves::events::Events::new(vec![metrics.clone()]),
    );
    let b = Bench { dir, node, store };
    // What a scrape shows after dipamd's periodic tick (replay/spool.rs `report`) has sampled the
    // ledger: the fault can clear with no commit to report it.
    let scrape = || {
        crate::l5_node::replay::spool::report(&b.node, &b.dir.path().join("spool"));
        metrics.render()
    };
    let full = "the ledger in /var/lib/dipam cannot be written (3s ago): No space left on device \
                (os error 28); dipamd keeps retrying (the file system is full)";
    b.store.set_fault(Some(full));
    let e = super::status::run(&b.node, Caller::ROOT, request("", "1.1.0", json!({})))
        .await
        .unwrap_err();
    match &e {
        ShimError::NotReady { missing } => assert_eq!(missing, &vec![full.to_string()]),
        other => panic!("expected NotReady, got {other:?}"),
    }
    assert_eq!(e.code_and_details().0, 50);
    let st = super::admin::status::run(&b.node, false).await.unwrap();
    assert!(!st.ready);
    assert_eq!(st.not_ready.first().map(String::as_str), Some(full));
    let doctor = super::admin::doctor::run(&b.node, false).await.unwrap();
    let check = doctor
        .checks
        .iter()
        .find(|c| c.name == "ledger takes commits")
        .unwrap();
    assert!(!check.ok && check.detail == full && check.fix.contains("free space"));
    assert!(scrape().contains("\ndipam_ledger_writable 0\n"));

    b.store.set_fault(None);
    let st = super::admin::status::run(&b.node, false).await.unwrap();
    assert!(
        !st.not_ready.iter().any(|l| l.contains("ledger")),
        "{:?}",
        st.not_ready
    );
    let doctor = super::admin::doctor::run(&b.node, false).await.unwrap();
    assert!(
        doctor
            .checks
            .iter()
            .any(|c| c.name == "ledger takes commits" && c.ok)
    );
    assert!(scrape().contains("\ndipam_ledger_writable 1\n"));
}

#[tokio::test]
async fn a_failed_commit_rolls_the_delegate_back() {
    let b = Bench::new();
    // The intent commits; committing the result fails (a full disk): the delegate's
    // allocation is released and the intent dropped, so nothing is held that nobody knows of.
    b.store.fail_commits_after(1, 1);
    let e = add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::Store(_)), "{e:?}");
    assert_eq!(b.calls(), vec!["ADD c1", "DEL c1"]);
    assert!(b.record("c1").is_none());

    // The intent itself cannot be written: the delegate never runs.
    b.store.fail_commits_after(0, 1);
    let e = add_as(&b.node, Caller::ROOT, request("c2", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::Store(_)), "{e:?}");
    assert!(!b.calls().contains(&"ADD c2".to_string()));
}

#[tokio::test]
async fn del_of_unknown_runs_the_delegate_and_failed_del_keeps_the_record() {
    let b = Bench::new();
    del::run(&b.node, Caller::ROOT, request("ghost", "1.0.0", json!({})))
        .await
        .unwrap();
    assert_eq!(b.calls(), vec!["DEL ghost"]);

    add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    b.touch("fail-del", "");
    let e = del::run(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::Delegate(_)), "{e:?}");
    assert_eq!(b.record("c1").unwrap().state, AttachmentState::Deleting);

    std::fs::remove_file(b.path("fail-del")).unwrap();
    del::run(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    assert!(b.record("c1").is_none());
}

#[tokio::test]
async fn check_compares_prev_result_with_the_ledger() {
    let b = Bench::new();
    let res = json_of(
        &add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
            .await
            .unwrap(),
    );
    check::run(
        &b.node,
        Caller::ROOT,
        request("c1", "1.0.0", json!({ "prevResult": res })),
    )
    .await
    .unwrap();
    assert!(b.calls().contains(&"CHECK c1".to_string()));
    let mut wrong = res.clone();
    wrong["ips"][0]["address"] = json!("10.9.0.3/24");
    let e = check::run(
        &b.node,
        Caller::ROOT,
        request("c1", "1.0.0", json!({ "prevResult": wrong })),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ShimError::PrevResultMismatch { .. }), "{e:?}");
    let e = check::run(
        &b.node,
        Caller::ROOT,
        request("c9", "1.0.0", json!({ "prevResult": res })),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ShimError::NoRecord { .. }), "{e:?}");
}

#[tokio::test]
async fn replay_releases_interrupted_operations_and_keeps_committed_ones() {
    let b = Bench::new();
    add_as(&b.node, Caller::ROOT, request("keep", "1.0.0", json!({})))
        .await
        .unwrap();
    add_as(&b.node, Caller::ROOT, request("half", "1.0.0", json!({})))
        .await
        .unwrap();
    let mut half = b.record("half").unwrap();
    half.state = AttachmentState::Adding;
    half.result = None;
    b.node.core.ledger.put(&half).unwrap();

    let r = replay::replay(&b.node).await.unwrap();
    assert_eq!(r.released, 1);
    assert!(b.record("half").is_none());
    assert!(b.record("keep").is_some());
    assert_eq!(b.calls().last().map(String::as_str), Some("DEL half"));
}

#[tokio::test]
async fn protocol_negotiation_serves_newer_and_refuses_older() {
    let b = Bench::new();
    let mut newer = request("c1", "1.0.0", json!({}));
    newer.protocol_version = dipam_proto::PROTOCOL_VERSION + 5;
    assert!(add_as(&b.node, Caller::ROOT, newer).await.is_ok());
    let mut older = request("c2", "1.0.0", json!({}));
    older.protocol_version = 0;
    let e = add_as(&b.node, Caller::ROOT, older).await.unwrap_err();
    assert_eq!(
        e.into_reply().unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
}

#[tokio::test]
async fn identifiers_are_validated_before_any_key_or_exec() {
    let b = Bench::new();
    for (cid, ifname) in [
        ("../etc", "eth0"),
        ("c1", "a/b"),
        ("", "eth0"),
        ("c\u{0}1", "eth0"),
    ] {
        let mut req = request(cid, "1.0.0", json!({}));
        req.ifname = ifname.into();
        let e = add_as(&b.node, Caller::ROOT, req).await.unwrap_err();
        assert!(
            matches!(e, ShimError::BadEnv(_)),
            "{cid:?} {ifname:?}: {e:?}"
        );
    }
    assert!(b.calls().is_empty());
}

#[tokio::test]
async fn a_stale_add_cannot_resurrect_and_a_stale_del_cannot_release() {
    let b = Bench::new();
    // Ordered by the boot clock; the wall clock (issued_at_ms) runs backwards here, as after
    // a step back, and must not matter.
    let boot = crate::l1_leaves::order::current_boot_id()
        .unwrap()
        .to_owned();
    let at = |ns: u64| {
        let mut r = request("c1", "1.0.0", json!({}));
        r.issued_at_ms = 10_000 - ns;
        r.issued_at = (ns != 0).then(|| dipam_proto::v1::BootStamp {
            boot_id: boot.clone(),
            ns,
        });
        r
    };
    add_as(&b.node, Caller::ROOT, at(1_000)).await.unwrap();
    // A DEL issued before that ADD (replayed late from the spool) leaves it alone.
    del::run(&b.node, Caller::ROOT, at(500)).await.unwrap();
    assert!(b.record("c1").is_some());
    assert_eq!(b.calls(), vec!["ADD c1"]);
    // The real DEL, then an ADD that had been issued before it arrives late: refused (3).
    del::run(&b.node, Caller::ROOT, at(2_000)).await.unwrap();
    let e = add_as(&b.node, Caller::ROOT, at(1_500)).await.unwrap_err();
    assert!(matches!(e, ShimError::StaleAdd { .. }), "{e:?}");
    assert!(b.record("c1").is_none());
    // A new ADD issued after the DEL is an ordinary ADD.
    add_as(&b.node, Caller::ROOT, at(3_000)).await.unwrap();
    assert!(b.record("c1").is_some());
    // Plugins before the ordering field (no stamp) are never judged stale.
    del::run(&b.node, Caller::ROOT, at(0)).await.unwrap();
    assert!(b.record("c1").is_none());
}

#[tokio::test]
async fn spooled_dels_are_drained_and_unusable_ones_quarantined() {
    let b = Bench::new();
    add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    let spool = b.path("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let req = request("c1", "1.0.0", json!({}));
    let good = json!({
        "format": 1, "requestId": "r", "issuedAtMs": crate::l1_leaves::clock::now_ms(), "command": "DEL",
        "containerId": "c1", "netns": "", "ifname": "eth0", "cniArgs": "", "cniPath": "",
        "mode": 1, "stdin": String::from_utf8(req.stdin).unwrap(),
    });
    std::fs::write(spool.join("0001-a.json"), good.to_string()).unwrap();
    std::fs::write(spool.join("0002-b.json"), "{ not json").unwrap();
    std::fs::write(spool.join(".tmp-0003-c.json"), "partial").unwrap();
    let d = crate::l5_node::replay::spool::drain(&b.node, &spool).await;
    assert_eq!(d.released, 1);
    assert_eq!(d.failed, 1);
    assert!(b.record("c1").is_none());
    assert!(crate::l3_clients::spool::pending(&spool).is_empty());
    assert!(spool.join("failed").join("0002-b.json").exists());
}

/// The spool trust rule (docs/cfp.md §7.8) and "start fresh": only root's regular files are
/// replayed, a link at `failed` is moved aside and never written through, and a DEL for a key
/// the ledger lacks still reaches the delegate (whose store dipamd cannot read here).
#[tokio::test]
async fn spool_replays_only_roots_files_and_releases_keys_the_ledger_lacks() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (spool files owned by root)");
        return;
    }
    let b = Bench::new();
    let spool = b.path("spool");
    std::fs::create_dir(&spool).unwrap();
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
    let del = |cid: &str| {
        let req = request(cid, "1.0.0", json!({}));
        json!({
            "format": 1, "requestId": "r", "issuedAtMs": crate::l1_leaves::clock::now_ms(), "command": "DEL",
            "containerId": cid, "netns": "", "ifname": "eth0", "cniArgs": "",
            "cniPath": "", "mode": 1, "stdin": String::from_utf8(req.stdin).unwrap(),
        })
        .to_string()
    };
    std::fs::write(spool.join("0001-gone.json"), del("gone")).unwrap();
    let outside = b.path("outside.json");
    std::fs::write(&outside, del("viaLink")).unwrap();
    std::os::unix::fs::symlink(&outside, spool.join("0002-link.json")).unwrap();
    std::fs::write(spool.join("0003-nobody.json"), del("nobody")).unwrap();
    std::os::unix::fs::chown(spool.join("0003-nobody.json"), Some(65534), Some(65534)).unwrap();
    std::fs::write(spool.join("0004-loose.json"), del("loose")).unwrap();
    std::fs::set_permissions(
        spool.join("0004-loose.json"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let elsewhere = b.path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, spool.join("failed")).unwrap();

    let d = crate::l5_node::replay::spool::drain(&b.node, &spool).await;
    assert_eq!((d.released, d.failed, d.kept), (1, 3, 0), "{d:?}");
    assert_eq!(
        b.calls(),
        vec!["DEL gone"],
        "only root's own file reached the delegate"
    );
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "the link was followed"
    );
    let failed = spool.join("failed");
    assert!(std::fs::symlink_metadata(&failed).unwrap().is_dir());
    let mut q: Vec<String> = std::fs::read_dir(&failed)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    q.sort();
    assert_eq!(q, ["0002-link.json", "0003-nobody.json", "0004-loose.json"]);
    assert!(
        std::fs::symlink_metadata(failed.join("0002-link.json"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link itself is quarantined, not its target"
    );
    assert!(outside.exists());
    assert!(std::fs::read_dir(&spool).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".untrusted-failed-")
    }));
    assert_eq!(
        b.node
            .spool
            .quarantined
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );

    // A spool directory writable by others is not read at all.
    std::fs::write(spool.join("0005-later.json"), del("later")).unwrap();
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = crate::l5_node::replay::spool::drain(&b.node, &spool).await;
    assert_eq!(d, crate::l3_clients::spool::Drained::default());
    assert!(
        b.node
            .spool
            .untrusted()
            .unwrap()
            .contains("writable by group or others")
    );
    assert_eq!(b.calls(), vec!["DEL gone"]);
}

/// AddEarly (main mode): a fresh result comes first, marked pending, then the ADD's outcome;
/// answers that are durable already, and errors, are the one reply.
#[tokio::test]
async fn add_early_sends_the_result_before_its_commit_and_then_the_outcome() {
    use dipam_proto::v1::{CniReply, cni_reply::Outcome};

    let b = Bench::new();
    let replies = |cid: &'static str| add_early_replies(&b.node, request(cid, "1.0.0", json!({})));
    let result_of = |r: &CniReply| match &r.outcome {
        Some(Outcome::Result(bytes)) => json_of(bytes),
        other => panic!("not a result: {other:?}"),
    };

    let fresh = replies("c1").await;
    assert_eq!(fresh.len(), 2, "{fresh:?}");
    assert!(fresh[0].pending_commit);
    assert_eq!(result_of(&fresh[0])["ips"][0]["address"], "10.9.0.2/24");
    assert!(!fresh[1].pending_commit);
    assert_eq!(result_of(&fresh[1]), result_of(&fresh[0]));
    assert_eq!(fresh[1].replayed, Some(false));
    assert_eq!(b.record("c1").unwrap().state, AttachmentState::Committed);

    // Repeated: answered from the ledger, durable already.
    let again = replies("c1").await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(!again[0].pending_commit);
    assert_eq!(again[0].replayed, Some(true));

    // The commit fails after the early result went out: the outcome is the error, and the
    // delegate's allocation is released, so the plugin's undo leaves nothing anywhere.
    b.store.fail_commits_after(1, 1);
    let failed = replies("c2").await;
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].pending_commit);
    assert!(
        matches!(&failed[1].outcome, Some(Outcome::Error(e)) if e.code != 0),
        "{failed:?}"
    );
    assert!(b.calls().contains(&"DEL c2".to_string()), "{:?}", b.calls());
    assert!(b.record("c2").is_none());

    // A delegate error is the one reply: nothing was early.
    b.touch("fail-add", r#"{"code":7,"msg":"no free address"}"#);
    let refused = replies("c3").await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(matches!(&refused[0].outcome, Some(Outcome::Error(e)) if e.code == 7));
}

/// A unary ADD whose plugin leaves while the delegate works (its handler dropped, as when a
/// runtime's timeout kills the plugin): the delegate runs to its end, never signalled, and
/// the ADD is then rolled back by the delegate's DEL, under the key's lock, leaving no
/// record. Before, the dropped handler SIGKILLed the delegate mid-ADD and left `adding`.
#[tokio::test]
async fn an_add_whose_plugin_leaves_runs_to_its_end_and_is_rolled_back() {
    use dipam_proto::v1::cni_server::Cni;
    let b = Bench::new();
    b.touch("slow-add", "");
    let svc = crate::l6_transport::service::Service(Arc::clone(&b.node));
    let mut req = tonic::Request::new(request("c1", "1.0.0", json!({})));
    req.extensions_mut().insert(Caller::ROOT);
    let left = tokio::time::timeout(Duration::from_millis(150), svc.add(req)).await;
    assert!(left.is_err(), "the ADD ended before its plugin left");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while b.calls() != ["ADD c1", "DEL c1"] || b.record("c1").is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "calls {:?}, record {:?}",
            b.calls(),
            b.record("c1").map(|r| r.state)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        b.path("add-done").exists(),
        "the delegate was killed mid-ADD"
    );
    // The key is free again: the runtime's retry gets a fresh ADD.
    std::fs::remove_file(b.path("slow-add")).unwrap();
    add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    assert_eq!(b.calls(), vec!["ADD c1", "DEL c1", "ADD c1"]);
}

/// A delegate that hands out an address another pod of the network holds (two allocators on
/// one range) is refused with 156 and released, as an agent conflict is; the holder keeps it.
#[tokio::test]
async fn a_duplicate_address_from_the_delegate_is_refused() {
    let b = Bench::new();
    add_as(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    b.touch("next", "2");
    let e = add_as(&b.node, Caller::ROOT, request("c2", "1.0.0", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(e, ShimError::Conflict { .. }), "{e:?}");
    assert_eq!(e.code_and_details().0, 156);
    assert!(b.record("c2").is_none());
    assert!(b.record("c1").is_some());
    assert_eq!(b.calls(), vec!["ADD c1", "ADD c2", "DEL c2"]);
    assert_eq!(
        b.node
            .agent
            .conflicts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Once c1 is gone, its address may go to another pod.
    del::run(&b.node, Caller::ROOT, request("c1", "1.0.0", json!({})))
        .await
        .unwrap();
    b.touch("next", "2");
    add_as(&b.node, Caller::ROOT, request("c3", "1.0.0", json!({})))
        .await
        .unwrap();
}
