//! The agent API as clients other than dipam's own use it (docs/agent-api.md):
//! - `grpc.health.v1.Health` is SERVING exactly when a CNI STATUS succeeds (a node waiting for
//!   its conflist is neither), a Watch hears the change, and SIGTERM with a health watch open
//!   still ends dipamd within its drain (NOT_SERVING, then UNAVAILABLE);
//! - server reflection (v1 and v1alpha) lists dipam.v1 and the health service;
//! - an agent written in Python with grpcio, its stubs generated from proto/ by grpcio-tools
//!   at test time, works over the unix socket with no `:authority` override: health,
//!   reflection, List, Watch, a role allocated and released, a claim at a requested IP with
//!   labels made, seen ready on the watch, unclaimed and seen gone, and the codes of refused
//!   requests (tests/lifecycle/python/agent_client.py says what it checks).
//!
//! The Python venv comes from tests/deps.sh (under `$DIPAM_TEST_CACHE`, default
//! /var/cache/dipam-tests); when deps.sh could not install it, it recorded why and the Python
//! test skips, printing that; when deps.sh has not run at all, it fails.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use dipam_lifecycle::{AgentLab, Attachment, bins, deps, require_root};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const SERVING: i32 = ServingStatus::Serving as i32;
const NOT_SERVING: i32 = ServingStatus::NotServing as i32;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn health_check(socket: &Path, service: &str) -> Result<i32, tonic::Status> {
    let ch = dipam_proto::connect(socket).await.unwrap();
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
}

/// CNI STATUS as a 1.1 runtime sends it for the lab's network: `Ok` or the CNI code.
fn cni_status(lab: &AgentLab) -> Result<(), u64> {
    let mut list = lab.fx.list.clone();
    list["cniVersion"] = json!("1.1.0");
    lab.rt
        .ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
        .map(drop)
        .map_err(|e| e.code)
}

/// The services a reflection client is told of, through v1 and through v1alpha.
async fn reflected_services(socket: &Path) -> (Vec<String>, Vec<String>) {
    use tonic_reflection::pb::{v1, v1alpha};
    let ch = dipam_proto::connect(socket).await.unwrap();
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = v1::server_reflection_client::ServerReflectionClient::new(ch.clone())
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("v1: not a service list")
    };
    let mut one: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
    one.sort();
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = v1alpha::server_reflection_client::ServerReflectionClient::new(ch)
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
        stream.next().await.unwrap().unwrap().message_response
    else {
        panic!("v1alpha: not a service list")
    };
    let mut alpha: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
    alpha.sort();
    (one, alpha)
}

#[test]
fn health_is_serving_exactly_when_cni_status_succeeds_and_reflection_lists_the_api() {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.set_roles("router", &[]);
    let socket = lab.dipamd.socket();
    let rt = runtime();

    // Started before the conflist exists: STATUS answers 50, and health agrees for the
    // server, Cni and Agent; Admin answers (dipamctl status is how to learn why).
    lab.dipamd.start_again();
    assert_eq!(cni_status(&lab), Err(50));
    rt.block_on(async {
        for name in ["", "dipam.v1.Cni", "dipam.v1.Agent"] {
            assert_eq!(
                health_check(&socket, name).await.unwrap(),
                NOT_SERVING,
                "{name:?}"
            );
        }
        assert_eq!(
            health_check(&socket, "dipam.v1.Admin").await.unwrap(),
            SERVING
        );
        let unknown = health_check(&socket, "no.such.Service").await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    });

    // A watcher hears the change once the conflist appears and the router is established.
    let ch = rt.block_on(dipam_proto::connect(&socket)).unwrap();
    let mut watch = rt
        .block_on(HealthClient::new(ch).watch(HealthCheckRequest {
            service: String::new(),
        }))
        .unwrap()
        .into_inner();
    let log = lab.dipamd.log_path();
    let next = |watch: &mut tonic::Streaming<_>, what: &str| {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), watch.next()).await })
            .unwrap_or_else(|_| {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("{what}: no health message\n{log}")
            })
    };
    let first: tonic_health::pb::HealthCheckResponse = next(&mut watch, "first").unwrap().unwrap();
    assert_eq!(first.status, NOT_SERVING);
    lab.write_conflist();
    let second = next(&mut watch, "after the conflist").unwrap().unwrap();
    assert_eq!(second.status, SERVING);
    lab.wait_ready(1);
    assert_eq!(cni_status(&lab), Ok(()));
    rt.block_on(async {
        for name in ["", "dipam.v1.Cni", "dipam.v1.Agent", "dipam.v1.Admin"] {
            assert_eq!(
                health_check(&socket, name).await.unwrap(),
                SERVING,
                "{name:?}"
            );
        }
    });

    let (v1, v1alpha) = rt.block_on(reflected_services(&socket));
    for want in [
        "dipam.v1.Admin",
        "dipam.v1.Agent",
        "dipam.v1.Cni",
        "grpc.health.v1.Health",
    ] {
        assert!(v1.iter().any(|s| s == want), "v1 lists {v1:?}");
        assert!(
            v1alpha.iter().any(|s| s == want),
            "v1alpha lists {v1alpha:?}"
        );
    }

    // SIGTERM with the health watch open: dipamd still drains and exits (an open stream
    // would hold a graceful shutdown forever), and the watcher is told NOT_SERVING, then
    // UNAVAILABLE (reconnect), not a cut connection.
    assert!(lab.dipamd.terminate().success());
    let stopping = next(&mut watch, "on SIGTERM").unwrap().unwrap();
    assert_eq!(stopping.status, NOT_SERVING);
    let end = next(&mut watch, "the end").unwrap().unwrap_err();
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
}

/// The grpcio venv's python, or `None` (after saying why) when tests/deps.sh could not
/// install grpcio.
fn python() -> Option<PathBuf> {
    deps::venv_tool(module_path!(), "the grpcio venv", "grpcio", "bin/python")
}

/// Python stubs for dipam.v1, generated from proto/ now, as an agent author would.
fn python_stubs(python: &Path) -> tempfile::TempDir {
    let out = tempfile::Builder::new()
        .prefix("dipam-pystubs-")
        .tempdir()
        .unwrap();
    let proto = bins::workspace().join("proto");
    let protoc = Command::new(python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto)
        .arg(format!("--python_out={}", out.path().display()))
        .arg(format!("--grpc_python_out={}", out.path().display()))
        .arg("dipam/v1/dipam.proto")
        .output()
        .unwrap();
    assert!(
        protoc.status.success(),
        "grpc_tools.protoc: {}",
        String::from_utf8_lossy(&protoc.stderr)
    );
    assert!(out.path().join("dipam/v1/dipam_pb2_grpc.py").is_file());
    out
}

#[test]
fn a_python_grpcio_agent_works_with_no_authority_override() {
    require_root!();
    let Some(python) = python() else { return };
    let lab = AgentLab::new("ptp-dipam-host-local.conflist", "router,health", &[]);
    lab.wait_ready(2);
    let stubs = python_stubs(&python);
    // A requested IP inside the lab's /24 that neither role holds (host-local hands out the
    // lowest free addresses first).
    let claim_ip = format!("{}.200", lab.subnet.cidr.trim_end_matches(".0/24"));
    let out = Command::new(&python)
        .arg(
            bins::workspace()
                .join("tests/lifecycle/python/agent_client.py")
                .as_os_str(),
        )
        .arg("--socket")
        .arg(lab.dipamd.socket())
        .arg("--stubs")
        .arg(stubs.path())
        .arg("--protocol-version")
        .arg(dipam_proto::PROTOCOL_VERSION.to_string())
        .arg("--role")
        .arg("ingress")
        .arg("--claim")
        .arg("egress-python")
        .arg("--claim-ip")
        .arg(&claim_ip)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python agent failed:\n{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        lab.dipamd.log()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("summary: {e}: {stdout}"));

    // What the Python agent saw is what dipamctl sees.
    let rows = |v: &Value| -> Vec<(String, String, String, String)> {
        let mut r: Vec<_> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let s = |i: usize| a[i].as_str().unwrap().to_owned();
                (s(0), s(1), s(2), s(3))
            })
            .collect();
        r.sort();
        r
    };
    assert_eq!(rows(&summary["list"]), lab.addresses());
    assert_eq!(summary["health"], "SERVING");
    let allocated = summary["with_role"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a[0] == "ingress")
        .count();
    assert_eq!(allocated, 1, "{summary}");
    // The claim held the address it asked for, and was listed with it.
    let claimed = summary["claimed"].as_str().unwrap();
    assert_eq!(
        claimed.split('/').next(),
        Some(claim_ip.as_str()),
        "{summary}"
    );
    assert!(
        summary["claim_listed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a[0] == "egress-python" && a[1] == claimed && a[2] == "ready"),
        "{summary}"
    );
    // Refused requests answer the documented codes (docs/agent-api.md, Errors).
    let codes = &summary["codes"];
    assert_eq!(codes["unknown_role"], "INVALID_ARGUMENT", "{summary}");
    assert_eq!(codes["bad_name"], "INVALID_ARGUMENT", "{summary}");
    assert_eq!(codes["bad_ip"], "INVALID_ARGUMENT", "{summary}");
    assert_eq!(
        codes["no_protocol_version"], "FAILED_PRECONDITION",
        "{summary}"
    );
    // Released and unclaimed again: the ledger and the delegate's store hold the two roles
    // only, and nothing holds the claimed IP.
    assert_eq!(lab.addresses().len(), 2);
    assert_eq!(lab.delegate_store().len(), 2);
    lab.assert_agree();
    assert!(
        lab.delegate_store().iter().all(|(_, ip)| ip != &claim_ip),
        "{:?}",
        lab.delegate_store()
    );
    // The connection was served under the authority it sent, not refused: nothing in the
    // log about a protocol error.
    assert!(!lab.dipamd.log().contains("PROTOCOL_ERROR"));
}
