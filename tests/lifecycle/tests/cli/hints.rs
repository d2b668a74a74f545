//! The hints an operator follows point the right way, each met as an operator meets it:
//! a non-root user's `dipamctl status`, `explain` of a mistyped ID and of a pod by name,
//! `doctor` on a conflist that does not use dipam yet, dipamd's log with metrics on, and the
//! README's "Operate it" section.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, process::Output};

use dipam_lifecycle::{Dipamd, Fixture, bins, nobody, require_root};
use serde_json::Value;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_non_root_caller_is_told_about_the_socket_group_not_that_dipamd_is_down() {
    require_root!();
    let d = Dipamd::start();
    // The socket's directory may be entered by anyone, as /run/dipam is; the socket is 0600.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let sock = d.socket().display().to_string();
    let ctl = bins::bin("dipamctl").display().to_string();
    let out = nobody::run(&[&ctl, "status", "--socket", &sock], &[], "");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        err.contains("--socket-group") && err.contains("--allow-uid"),
        "names the way in: {err}"
    );
    assert!(!err.contains("is dipamd running"), "dipamd runs: {err}");
    // With dipamd really down, the hint is still the other one.
    let gone = d.dir.path().join("none.sock").display().to_string();
    let err = stderr(
        &std::process::Command::new(bins::bin("dipamctl"))
            .args(["status", "--socket", &gone])
            .output()
            .unwrap(),
    );
    assert!(err.contains("is dipamd running?"), "{err}");
}

#[test]
fn explain_of_an_unknown_id_fails_and_a_pod_name_names_all_four_cri_args() {
    require_root!();
    let d = Dipamd::start();
    for json in [false, true] {
        let mut args = vec!["explain", "no-such-container"];
        if json {
            args.push("--json");
        }
        let out = d.ctl(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("knows nothing of container"), "{err}");
        assert!(out.stdout.is_empty(), "no answer on stdout");
    }
    let out = d.ctl(&["explain", "default/web-0"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for key in [
        "K8S_POD_NAMESPACE",
        "K8S_POD_NAME",
        "K8S_POD_INFRA_CONTAINER_ID",
        "K8S_POD_UID",
    ] {
        assert!(err.contains(key), "{key} in {err}");
    }
}

#[test]
fn doctor_says_install_wrap_for_a_conflist_without_dipam() {
    require_root!();
    // The node's own ptp + host-local conflist, before adoption: the example without dipam.
    let mut list = Fixture::load("ptp-dipam-host-local.conflist").list;
    let delegate = list["plugins"][0]["ipam"]["delegate"].clone();
    list["plugins"][0]["ipam"] = delegate;
    let mut d = Dipamd::unstarted(&[]);
    let file = d.dir.path().join("10-ptp.conflist");
    std::fs::write(&file, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
    let f = file.display().to_string();
    d.set_flags(&[
        "--conflist",
        &f,
        "--node-name",
        "hints-node",
        "--agent-roles",
        "router",
    ]);
    d.start_again();
    let check = d.doctor_check("agent conflist");
    assert_eq!(check["ok"], false, "{check}");
    let fix = check["fix"].as_str().unwrap();
    assert!(
        fix.contains(&format!("dipamctl install --wrap {f} --in-place")),
        "{fix}"
    );
}

#[test]
fn the_log_prints_addresses_not_options() {
    require_root!();
    let d = Dipamd::start_with(&["--metrics-address", "127.0.0.1:0"]);
    // The line is written as the listener starts, after the socket answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !d.log().contains("metrics on TCP") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("metrics on TCP"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("address=127.0.0.1:"), "{line}");
    assert!(!log.contains("Some("), "{log}");
}

#[test]
fn the_readme_operate_section_names_the_metrics_endpoint() {
    let readme = std::fs::read_to_string(bins::workspace().join("README.md")).unwrap();
    let start = readme.find("## Operate it").unwrap();
    let end = readme[start + 3..]
        .find("\n## ")
        .map_or(readme.len(), |e| start + 3 + e);
    let section = &readme[start..end];
    for w in ["--metrics-address", "/metrics", "docs/metrics.md"] {
        assert!(section.contains(w), "{w} in README's Operate it");
    }
}

/// `dipam_attachments`' owner label is a bounded set: claims made and released by name leave
/// no series per name behind, and their count returns to 0.
#[test]
fn claims_share_one_owner_label_in_the_attachments_metric() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let msock = dir.path().join("metrics.sock");
    let lab = dipam_lifecycle::AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router",
        &["--metrics-socket", msock.to_str().unwrap()],
    );
    lab.wait_ready(1);
    let scrape = || {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&msock).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: dipamd\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let net = lab.network();
    for i in 0..5 {
        lab.agent(&["claim", &format!("egress-{i}")]);
    }
    let text = scrape();
    assert!(
        text.contains(&format!(
            "dipam_attachments{{owner=\"agent:claim\",network=\"{net}\"}} 5"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "dipam_attachments{{owner=\"agent:router\",network=\"{net}\"}} 1"
        )),
        "{text}"
    );
    for i in 0..5 {
        lab.agent(&["unclaim", &format!("egress-{i}")]);
    }
    let text = scrape();
    assert!(
        !text.contains("agent:claim:"),
        "no series per claim name: {text}"
    );
    assert!(
        text.contains(&format!(
            "dipam_attachments{{owner=\"agent:claim\",network=\"{net}\"}} 0"
        )),
        "{text}"
    );
}

/// `explain` right after a failed ADD shows that ADD: history written in batches (up to a
/// second later) is flushed before explain reads it. Five times in a row, each at once.
#[test]
fn explain_right_after_a_failed_add_shows_it() {
    require_root!();
    let lab = dipam_lifecycle::Lab::new("ptp-dipam-host-local.conflist");
    let mut bad = lab.list().clone();
    bad["plugins"][0]["ipam"]["delegate"]["type"] = "not-installed".into();
    for _ in 0..5 {
        let (_ns, pod) = lab.pod();
        let err = lab.rt.ipam(&bad, 0, "ADD", &pod, None).unwrap_err();
        assert_eq!(err.code, 152, "{err:?}");
        let out = lab.dipamd.ctl(&["explain", &pod.container_id, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let failed_add = v["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["op"] == "ADD" && e["code"].as_u64() == Some(152));
        assert!(failed_add, "the failed ADD is in the history at once: {v}");
    }
}
