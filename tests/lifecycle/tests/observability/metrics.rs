//! Prometheus metrics: off by default, on a unix socket or a loopback port when asked, never
//! on another address unless explicitly allowed; requests by op and code, latency histograms
//! (total and per delegate exec), attachments by owner and network, and the safety counters.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::{Read, Write},
    process::Stdio,
};

use dipam_lifecycle::{Lab, require_root};

fn scrape(stream: &mut dyn ReadWrite) -> String {
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: dipamd\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[test]
fn metrics_on_a_unix_socket_and_loopback_only() {
    require_root!();
    let sock_dir = tempfile::tempdir().unwrap();
    let msock = sock_dir.path().join("metrics.sock");
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &[
            "--metrics-socket",
            msock.to_str().unwrap(),
            "--metrics-address",
            &addr,
        ],
    );
    let (_ns, pod) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    let mut bad = lab.list().clone();
    bad["plugins"][0]["ipam"]["delegate"]["type"] = "not-installed".into();
    let (_n2, other) = lab.pod();
    assert_eq!(
        lab.rt.ipam(&bad, 0, "ADD", &other, None).unwrap_err().code,
        152
    );

    let text = scrape(&mut std::os::unix::net::UnixStream::connect(&msock).unwrap());
    for want in [
        "dipam_requests_total{op=\"ADD\",code=\"0\"} 1",
        "dipam_requests_total{op=\"ADD\",code=\"152\"} 1",
        "dipam_request_duration_seconds_count{op=\"ADD\"} 2",
        "dipam_delegate_exec_duration_seconds_count{delegate=\"host-local\",command=\"ADD\"} 1",
        &format!(
            "dipam_attachments{{owner=\"pod\",network=\"{}\"}} 1",
            lab.network()
        ),
        "dipam_gc_refused_total 0",
        "dipam_conflicts_total 0",
        "dipam_spool_depth 0",
        "dipam_spool_quarantined_total 0",
        "dipam_spool_untrusted 0",
        "dipam_spool_mismatched_networks 0",
        "dipam_intents_replayed_total 0",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let tcp = scrape(&mut std::net::TcpStream::connect(&addr).unwrap());
    assert!(tcp.contains("dipam_requests_total"));
    // OpenMetrics text, and every sample's family has its HELP and TYPE.
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{text}"
    );
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert!(body.ends_with("# EOF\n"), "{body}");
    for sample in body.lines().filter(|l| !l.starts_with('#')) {
        let name = sample.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        for kind in ["HELP", "TYPE"] {
            assert!(
                body.contains(&format!("# {kind} {family} ")),
                "no {kind} for {sample:?} in:\n{body}"
            );
        }
    }
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, None).unwrap();
    // The gauge follows the DEL as it happens: the scrape reads no ledger.
    let after = scrape(&mut std::os::unix::net::UnixStream::connect(&msock).unwrap());
    let gone = format!(
        "dipam_attachments{{owner=\"pod\",network=\"{}\"}} 0",
        lab.network()
    );
    assert!(after.contains(&gone), "missing {gone:?} in:\n{after}");

    // Not loopback: refused unless explicitly allowed.
    let scratch = tempfile::tempdir().unwrap();
    let refused = std::process::Command::new(dipam_lifecycle::bins::bin("dipamd"))
        .arg("--socket")
        .arg(scratch.path().join("s.sock"))
        .arg("--state-dir")
        .arg(scratch.path().join("state"))
        .args(["--metrics-address", "0.0.0.0:9"])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not loopback"));
}
