//! The agent API as clients other than dipam's own use it (docs/agent-api.md):
//! - `grpc.health.v1.Health` is SERVING exactly when a CNI STATUS succeeds (a node waiting for
//!   its conflist is neither), a Watch hears the change, and SIGTERM with a health watch open
//!   still ends dipamd within its drain (NOT_SERVING, then UNAVAILABLE);
//! - server reflection (v1 and v1alpha) lists dipam.v1 and the health service;
//! - the Go module (api/, through examples/go-agent's tests) and an agent written in Python with
//!   grpcio (its stubs generated from proto/ by grpcio-tools at test time) run the same table
//!   of steps, tests/lifecycle/agent-scenarios.json, against a real dipamd with the real
//!   host-local (src/scenario.rs): health, reflection, List, Watch, a role allocated and
//!   released, a claim at a requested IP with labels, dipamd SIGKILLed under the watch and
//!   the watch resumed on the next dipamd with the same addresses, the claim unclaimed, and
//!   the codes of refused requests. The Go one also runs its worked example agent across a
//!   SIGKILL. Go runs in both shapes an agent meets: as root against dipamd under the shipped
//!   unit's capability set, and as a non-root uid that dipamd's --admin-uid and
//!   --socket-group let in. Python, with no `:authority` override, as root.
//!
//! The Python venv comes from tests/deps.sh (under `$DIPAM_TEST_CACHE`, default
//! /var/cache/dipam-tests); when deps.sh could not install it, it recorded why and the Python
//! test skips, printing that; when deps.sh has not run at all, it fails. Go is the machine's
//! (tests/peers/build.sh needs it too); the Go test binary is built from the Go module proxy.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use dipam_lifecycle::{
    AgentLab, Attachment, bins, cmd, deps, golang,
    nobody::NOBODY,
    require_root,
    restrictions::shipped_unit,
    scenario::{self, Scenario},
};
use serde_json::json;
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

/// Python stubs for dipam.v1, generated from proto/ now, as an agent author would: the Agent
/// service's file alone is all an agent needs.
fn python_stubs(python: &Path) -> tempfile::TempDir {
    let out = dipam_lifecycle::temp_dir("dipam-pystubs-");
    let proto = bins::workspace().join("proto");
    cmd::run(
        Command::new(python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(&proto)
            .arg(format!("--python_out={}", out.path().display()))
            .arg(format!("--grpc_python_out={}", out.path().display()))
            .arg("dipam/v1/agent.proto"),
    );
    assert!(out.path().join("dipam/v1/agent_pb2_grpc.py").is_file());
    out
}

#[test]
fn a_python_grpcio_agent_runs_the_scenarios_with_no_authority_override() {
    require_root!();
    let Some(python) = python() else { return };
    let mut lab = AgentLab::new("ptp-dipam-host-local.conflist", "router,health", &[]);
    lab.wait_ready(2);
    let stubs = python_stubs(&python);
    let sc = Scenario::new(&lab, "egress-python");
    let mut cmd = Command::new(&python);
    cmd.arg(bins::workspace().join("tests/lifecycle/python/agent_client.py"))
        .arg("--socket")
        .arg(lab.dipamd.socket())
        .arg("--stubs")
        .arg(stubs.path())
        .arg("--scenarios")
        .arg(sc.table())
        .arg("--protocol-version")
        .arg(dipam_proto::PROTOCOL_VERSION.to_string())
        .args(["--claim", &sc.claim, "--claim-ip", &sc.claim_ip])
        .args(["--other-ip", &sc.other_ip]);
    let summary = scenario::drive(&mut lab, cmd, "the Python agent");
    scenario::assert_summary(&lab, &summary, &sc);
    // The connection was served under the authority it sent, not refused: nothing in the
    // log about a protocol error.
    assert!(!lab.dipamd.log().contains("PROTOCOL_ERROR"));
}

/// Runs the Go module's tests (the scenario table, then the worked example across a SIGKILL)
/// against `lab`'s dipamd, as `uid` (None: root), and checks what they saw.
fn run_go(mut lab: AgentLab, uid: Option<&str>) {
    lab.wait_ready(2);
    let sc = Scenario::new(&lab, "egress-go");
    let bin = golang::test_binary("examples/go-agent", sc.dir.path(), "go-agent.test");
    let mut cmd = match uid {
        Some(uid) => {
            // The socket's directory is opened so that the socket's own mode and group and
            // dipamd's peer check decide (as a DaemonSet shares /run/dipam).
            std::fs::set_permissions(
                lab.dipamd.dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
            let mut c = Command::new("setpriv");
            c.args(["--reuid", uid, "--regid", uid, "--clear-groups", "--"])
                .arg(&bin)
                .env("HOME", sc.dir.path());
            c
        }
        None => Command::new(&bin),
    };
    cmd.args(["-test.v", "-test.count=1", "-test.timeout=5m"])
        .env("DIPAM_SOCKET", lab.dipamd.socket())
        .env("DIPAM_SCENARIOS", sc.table())
        .env("DIPAM_CLAIM", &sc.claim)
        .env("DIPAM_CLAIM_IP", &sc.claim_ip)
        .env("DIPAM_OTHER_IP", &sc.other_ip)
        .env("DIPAM_EXAMPLE_IP", &sc.example_ip);
    let summary = scenario::drive(&mut lab, cmd, "the Go module's tests");
    scenario::assert_summary(&lab, &summary, &sc);
    let example = &summary["example"];
    assert_eq!(
        example["before"]["addresses"], example["after"]["addresses"],
        "{summary}"
    );
    assert_ne!(
        example["before"]["instance"], example["after"]["instance"],
        "{summary}"
    );
    assert!(
        example["after"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "egress-example"
                && a["ip"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{}/", sc.example_ip))),
        "{summary}"
    );
}

#[test]
fn the_go_module_and_its_example_agent_as_root_under_the_shipped_unit() {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.write_conflist();
    lab.set_roles("router,health", &[]);
    // Every start of the test, the restarts after SIGKILL included, under the unit's set.
    lab.dipamd.run_under(&shipped_unit().setpriv());
    lab.dipamd.start_again();
    run_go(lab, None);
}

#[test]
fn the_go_module_and_its_example_agent_as_a_non_root_admin_uid() {
    require_root!();
    let flags = ["--socket-group", NOBODY, "--admin-uid", NOBODY];
    let lab = AgentLab::new("ptp-dipam-host-local.conflist", "router,health", &flags);
    run_go(lab, Some(NOBODY));
}
