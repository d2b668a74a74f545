//! A non-root neighbour on root's network (issue 28 §5, docs/cfp.md "Threat model"): an
//! allowed uid (nobody, 65534, a real process through setpriv, `--allow-uid`) adds under root's
//! network name, with container ID `0` (first in key order) and its own range in a store
//! dipamd allows it (`--non-root-data-dir`), against a dipamd under the shipped unit's
//! capability set with a reconcile every second. Its records decide nothing for root: root's
//! ADDs are never refused with 159, `dipamctl status` shows root's range, and a reservation
//! lost from its store makes neither CNI STATUS answer 51 nor health NOT_SERVING.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, time::Duration};

use dipam_lifecycle::{
    Attachment, Lab, Runtime,
    nobody::{self, NOBODY},
    require_root, shapes,
};
use serde_json::{Value, json};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn health(lab: &Lab) -> i32 {
    let socket = lab.dipamd.socket();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let ch = dipam_proto::connect(&socket).await.unwrap();
            HealthClient::new(ch)
                .check(HealthCheckRequest { service: "".into() })
                .await
                .unwrap()
                .into_inner()
                .status
        })
}

/// CNI STATUS as a 1.1 runtime sends it for root's network: `Ok` or the CNI code.
fn cni_status(lab: &Lab) -> Result<(), u64> {
    let mut list = lab.list().clone();
    list["cniVersion"] = json!("1.1.0");
    lab.rt
        .ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
        .map(drop)
        .map_err(|e| e.code)
}

fn status_json(lab: &Lab) -> Value {
    let out = lab.dipamd.ctl(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_non_root_callers_records_never_decide_for_roots_network() {
    require_root!();
    let theirs = tempfile::Builder::new()
        .prefix("nobodys-allowed-store-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = theirs.path().display().to_string();
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &[
            "--socket-group",
            NOBODY,
            "--allow-uid",
            NOBODY,
            "--reconcile-interval",
            "1",
            "--non-root-data-dir",
            &dir,
        ],
    );
    lab.dipamd.kill9();
    lab.dipamd.run_under(&shapes::shipped_unit_setpriv());
    lab.dipamd.start_again();
    std::fs::set_permissions(
        lab.dipamd.dir.path(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let net = lab.network();
    let (_ns, kept) = lab.pod();
    lab.rt.add(lab.list(), &kept).unwrap();

    // nobody under root's network name, container ID 0 first in key order, its own range.
    let their_subnet = format!("10.250.{}.0/24", std::process::id() % 250);
    let mut conf = Runtime::plugin_config(lab.list(), 0, None);
    conf["ipam"]["delegate"]["dataDir"] = json!(dir);
    conf["ipam"]["delegate"]["ranges"] = json!([[{ "subnet": their_subnet }]]);
    for cid in ["0", "nobody-2"] {
        let answer = nobody::ipam("ADD", cid, &conf);
        assert!(answer.get("code").is_none(), "{cid}: {answer}");
    }
    std::thread::sleep(Duration::from_secs(3));
    let failed = lab.add_and_del(5);
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());
    let status = status_json(&lab);
    let ranges = status["ranges"].to_string();
    eprintln!("root's ranges with nobody on its network: {ranges}");
    assert!(
        ranges.contains(lab.subnet.cidr.trim_end_matches("0/24")) && !ranges.contains("10.250."),
        "{ranges}"
    );

    // One of nobody's reservations is lost from its store (nobody cannot write there: the
    // loss is made by root, as a wipe of that directory would).
    let theirs_net = theirs.path().join(&net);
    let lost = std::fs::read_dir(&theirs_net)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.starts_with("nobody-2")))
        .expect("nobody-2's reservation");
    std::fs::remove_file(&lost).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let status = status_json(&lab);
    eprintln!(
        "after the loss: ready {} missing {} STATUS {:?} health {}",
        status["ready"],
        status["divergence"]["missing"],
        cni_status(&lab),
        health(&lab)
    );
    assert_eq!(cni_status(&lab), Ok(()), "{}", lab.dipamd.log());
    assert_eq!(health(&lab), ServingStatus::Serving as i32);
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["divergence"]["missing"], 0, "{status}");
    let failed = lab.add_and_del(5);
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());

    for cid in ["0", "nobody-2"] {
        let answer = nobody::ipam("DEL", cid, &conf);
        assert!(answer.get("code").is_none(), "{cid}: {answer}");
    }
    lab.rt.del(lab.list(), &kept).unwrap();
    lab.assert_agree();
    let left: Vec<_> = std::fs::read_dir(&theirs_net)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert!(left.is_empty(), "nobody's store still holds {left:?}");
}
