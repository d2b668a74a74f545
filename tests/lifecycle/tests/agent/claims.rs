//! Agent claims (docs/cfp.md §7.6): named addresses an agent asks for, with the IP it wants,
//! held through the real delegates (host-local via `IP=`, the real azure-vnet-ipam via
//! `ipam.ipAddress`) by a dipamd under the shipped systemd unit's capability restrictions, on
//! non-default paths, with `dipamctl agent watch` watching. They survive SIGKILL restarts
//! unchanged, are never freed by a GC whose list omits them, never handed to a pod (a range
//! filled with pods never yields one), and a requested IP that someone holds is refused
//! naming the holder, with nothing left behind. A short deadline always answers
//! DEADLINE_EXCEEDED, and the work it cut off still finishes at once.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::HashMap,
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, NetNs, bins, require_root, runtime::result_ips,
    shapes::shipped_unit_setpriv,
};
use dipam_proto::v1::{
    AddressFamily, AgentListRequest, AgentRoleRequest, ClaimRequest, ClaimState, StatusRequest,
    UnclaimRequest, admin_client::AdminClient, agent_client::AgentClient,
};
use serde_json::{Value, json};

/// A ready agent lab holding the router, whose periodic check is an hour away: what happens
/// is the call under test's doing.
fn quiet_router_lab() -> AgentLab {
    let lab = lab(
        "ptp-dipam-host-local.conflist",
        "router",
        &["--agent-check-interval", "3600"],
        None,
    );
    lab.wait_ready(1);
    lab
}

/// An agent lab whose dipamd runs under the unit's restrictions, with `roles`, and the
/// delegate's ranges made by `ranges` from the lab's subnet (host-local), then started.
fn lab(
    conflist: &str,
    roles: &str,
    flags: &[&str],
    ranges: Option<&dyn Fn(&str) -> Value>,
) -> AgentLab {
    let mut lab = AgentLab::unstarted(conflist);
    if let Some(r) = ranges {
        lab.fx = lab.fx.clone().with_ranges(r(&lab.subnet.cidr));
    }
    lab.write_conflist();
    lab.set_roles(roles, flags);
    lab.dipamd.run_under(&shipped_unit_setpriv());
    lab.dipamd.start_again();
    lab
}

/// `<subnet base>.<host>`, e.g. host(lab, 200) = 10.77.3.200.
fn host(lab: &AgentLab, n: u8) -> String {
    format!("{}.{n}", lab.subnet.cidr.trim_end_matches(".0/24"))
}

/// `dipamctl agent <args> --json`: (exit success, parsed stdout, stderr).
fn agent(lab: &AgentLab, args: &[&str]) -> (bool, Value, String) {
    let mut all = vec!["agent"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = lab.dipamd.ctl(&all);
    (
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Claims through dipamctl and expects it ready; returns the claim.
#[track_caller]
fn claim_ready(lab: &AgentLab, args: &[&str]) -> Value {
    let mut all = vec!["claim"];
    all.extend_from_slice(args);
    let (ok, v, err) = agent(lab, &all);
    assert!(ok, "claim {args:?}: {err}\n{v:#}\n{}", lab.dipamd.log());
    assert_eq!(v["claim"]["state"], "ready", "{v:#}");
    v["claim"].clone()
}

/// The claims in `dipamctl agent list --json`, by name.
fn claims(lab: &AgentLab) -> (Value, HashMap<String, Value>) {
    let (ok, v, err) = agent(lab, &["list"]);
    assert!(ok, "{err}");
    let by = v["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a.clone()))
        .collect();
    (v, by)
}

fn bare(cidr: &Value) -> String {
    cidr.as_str().unwrap().split('/').next().unwrap().to_owned()
}

/// `dipamctl agent watch --json`, running until read or dropped (a watch reconnects forever:
/// a failing test must not leave one behind). A thread collects its messages as they come.
/// Two claims (one at a requested IP, with labels; one at any IP) beside the router: ready,
/// idempotent, listed with labels; unchanged across 10 SIGKILL restarts, the ledger and the
/// delegate's store agreeing after each; each restart a new instance id and a generation
/// above every earlier one; the watcher saw them; unclaim releases at once.
fn claims_survive_sigkills(conflist: &str) {
    let mut lab = lab(
        conflist,
        "router",
        &["--agent-check-interval", "3600"],
        None,
    );
    lab.wait_ready(1);
    let w = lab.watch();
    // .200 up: in host-local's range, and in the pool the azure node offers (.10 to .209),
    // where the router may hold any address.
    let held: Vec<String> = lab.delegate_store().into_iter().map(|(_, ip)| ip).collect();
    let want = (200..210)
        .map(|n| host(&lab, n))
        .find(|ip| !held.contains(ip))
        .unwrap();
    let egress_a = [
        "egress-a",
        "--ip",
        &want,
        "--label",
        "purpose=egress",
        "--label",
        "policy=ns-a/p1",
    ];
    let a = claim_ready(&lab, &egress_a);
    assert_eq!(bare(&a["ip"]), want, "{a:#}");
    assert_eq!(a["requestedIP"], want.as_str());
    let b = claim_ready(&lab, &["egress-b", "--family", "ipv4"]);
    assert_ne!(b["ip"], a["ip"]);
    // The same claim again: the same address (an agent restarting re-claims).
    let again = claim_ready(&lab, &egress_a);
    assert_eq!(again["ip"], a["ip"]);
    let (first, by) = claims(&lab);
    assert_eq!(by.len(), 3, "{first:#}");
    assert_eq!(by["egress-a"]["labels"]["purpose"], "egress");
    assert_eq!(by["router-ipv4"]["predefined"], true);
    assert_eq!(lab.delegate_store().len(), 3);
    lab.assert_agree();

    let addresses = lab.addresses();
    let mut generation = first["generation"].as_u64().unwrap();
    let mut instances = vec![first["instanceID"].as_str().unwrap().to_owned()];
    for i in 0..10 {
        lab.dipamd.kill9();
        lab.dipamd.start_again();
        lab.wait_ready(3);
        assert_eq!(lab.addresses(), addresses, "restart {i} changed a claim");
        assert_eq!(
            lab.delegate_store().len(),
            3,
            "restart {i} leaked or lost one"
        );
        lab.assert_agree();
        let (now, by) = claims(&lab);
        assert_eq!(by["egress-a"]["labels"]["policy"], "ns-a/p1");
        let g = now["generation"].as_u64().unwrap();
        assert!(
            g > generation,
            "restart {i}: generation {g} after {generation}"
        );
        generation = g;
        let id = now["instanceID"].as_str().unwrap().to_owned();
        assert!(!instances.contains(&id), "restart {i} kept the instance id");
        instances.push(id);
    }

    let (ok, v, err) = agent(&lab, &["unclaim", "egress-b"]);
    assert!(ok, "{err}");
    assert_eq!(v["claim"]["state"], "released");
    assert_eq!(
        lab.delegate_store().len(),
        2,
        "unclaim did not release at once"
    );
    let (ok, v, _) = agent(&lab, &["unclaim", "egress-b"]);
    assert!(
        ok && v["claim"]["state"] == "released",
        "unclaim is idempotent"
    );
    lab.assert_agree();

    // The watcher saw the claim, and orders messages by (instance, generation) across every
    // reconnect: never a generation that is not above the one before.
    let lines = w.finish();
    assert!(
        lines.iter().any(|l| l.to_string().contains(&want)),
        "{lines:?}"
    );
    let gens: Vec<u64> = lines
        .iter()
        .map(|l| l["generation"].as_u64().unwrap())
        .collect();
    assert!(gens.windows(2).all(|w| w[0] < w[1]), "{gens:?}");
}

#[test]
fn claims_survive_10_sigkills_host_local() {
    require_root!();
    claims_survive_sigkills("ptp-dipam-host-local.conflist");
}

#[test]
fn claims_survive_10_sigkills_azure() {
    require_root!();
    claims_survive_sigkills("ptp-dipam-azure.conflist");
}

/// CNI 1.1 GC through the plugin, with `valid` as the runtime's list.
fn gc(lab: &AgentLab, valid: Value) {
    dipam_lifecycle::runtime::settle_before_gc();
    lab.rt
        .ipam_gc(&lab.fx.list, valid)
        .unwrap_or_else(|e| panic!("GC: {e}"));
}

/// A claim at a requested IP in a range of 11 addresses: a GC whose list omits it (and one
/// that lists nothing) leaves it; pods fill the rest of the range and never get it; the
/// range is then exhausted, and the claim still holds its address.
#[test]
fn a_claim_is_never_freed_by_gc_nor_handed_to_a_pod() {
    require_root!();
    let small = |subnet: &str| {
        let net = subnet.trim_end_matches(".0/24");
        json!([[{
            "subnet": subnet,
            "rangeStart": format!("{net}.10"),
            "rangeEnd": format!("{net}.20"),
        }]])
    };
    let lab = lab(
        "ptp-dipam-host-local.conflist",
        "router",
        &["--gc-grace", "0", "--agent-check-interval", "3600"],
        Some(&small),
    );
    lab.wait_ready(1);
    let pinned = host(&lab, 15);
    claim_ready(&lab, &["pinned", "--ip", &pinned]);

    let ns = NetNs::new();
    let first = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let stale = Attachment::new(&dipam_lifecycle::unique("stale"), &ns.path());
    lab.rt.ipam(&lab.fx.list, 0, "ADD", &first, None).unwrap();
    lab.rt.ipam(&lab.fx.list, 0, "ADD", &stale, None).unwrap();
    // The runtime's list names one pod: the other pod goes, the claim (and router) stay.
    gc(&lab, json!([dipam_lifecycle::runtime::gc_entry(&first)]));
    assert!(
        !lab.delegate_store()
            .iter()
            .any(|(id, _)| *id == stale.container_id),
        "the GC freed nothing: this test would prove nothing"
    );
    let (_, by) = claims(&lab);
    assert_eq!(bare(&by["pinned"]["ip"]), pinned, "GC freed the claim");
    assert!(
        lab.delegate_store().iter().any(|(_, ip)| *ip == pinned),
        "GC released the claim's reservation"
    );

    // 11 addresses: router, pinned and the first pod hold three; pods get the other 8 and
    // then nothing.
    let mut pods = Vec::new();
    let exhausted = loop {
        let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
        match lab.rt.ipam(&lab.fx.list, 0, "ADD", &att, None) {
            Ok(r) => {
                let ip = result_ips(&r).remove(0);
                assert_ne!(ip, pinned, "a pod got the claimed address");
                pods.push((att, ip));
                assert!(pods.len() <= 11, "the range never ran out");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(pods.len(), 8, "{pods:?}");
    assert!(
        exhausted.to_string().contains("no IP addresses available")
            || exhausted.to_string().contains("no more"),
        "{exhausted}"
    );
    let (_, by) = claims(&lab);
    assert_eq!(by["pinned"]["state"], "ready");
    lab.assert_agree();
    for att in pods.iter().map(|(a, _)| a).chain([&first]) {
        lab.rt.ipam(&lab.fx.list, 0, "DEL", att, None).unwrap();
    }
}

/// A requested IP a pod holds, or another claim holds, is refused naming the holder; nothing
/// is recorded or allocated for the refused claim.
#[test]
fn a_taken_requested_ip_is_refused_naming_the_holder() {
    require_root!();
    let lab = lab("ptp-dipam-host-local.conflist", "router", &[], None);
    lab.wait_ready(1);
    let ns = NetNs::new();
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let pod_ip = result_ips(&lab.rt.ipam(&lab.fx.list, 0, "ADD", &pod, None).unwrap()).remove(0);
    let before = lab.delegate_store();

    let (ok, v, err) = agent(&lab, &["claim", "squatter", "--ip", &pod_ip]);
    assert!(!ok, "{v:#}");
    assert_eq!(v["claim"]["state"], "failed", "{v:#}");
    let msg = v["claim"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&pod_ip) && msg.contains(&pod.container_id),
        "the message names neither the IP nor the pod: {msg}"
    );
    assert!(err.contains("failed"), "{err}");
    let (_, by) = claims(&lab);
    assert!(!by.contains_key("squatter"), "a refused claim was recorded");
    assert_eq!(lab.delegate_store(), before, "a refused claim allocated");

    let mine = host(&lab, 222);
    claim_ready(&lab, &["first", "--ip", &mine]);
    let (ok, v, _) = agent(&lab, &["claim", "second", "--ip", &mine]);
    assert!(!ok);
    let msg = v["claim"]["message"].as_str().unwrap();
    assert!(msg.contains("\"first\""), "{msg}");
    let (_, by) = claims(&lab);
    assert!(!by.contains_key("second"));
    lab.assert_agree();
    lab.rt.ipam(&lab.fx.list, 0, "DEL", &pod, None).unwrap();
}

/// A claim the network cannot give says why in dipam's words and names the fix that applies
/// to a claim: a requested IP outside every range names the range (host-local's own text
/// names neither), and a v6 claim on a v4-only network names the claim, not
/// `--agent-families` (which configures the roles only). Nothing is held for either.
#[test]
fn an_impossible_claim_names_the_range_and_the_fix() {
    require_root!();
    let lab = lab("ptp-dipam-host-local.conflist", "router", &[], None);
    lab.wait_ready(1);
    let before = lab.delegate_store();

    let (ok, v, _) = agent(&lab, &["claim", "far", "--ip", "192.0.2.77"]);
    assert!(!ok, "{v:#}");
    let msg = v["claim"]["message"].as_str().unwrap();
    assert!(
        msg.contains("requested IP 192.0.2.77 is outside the network's ranges")
            && msg.contains(&lab.subnet.cidr)
            && msg.contains("claim \"far\""),
        "{msg}"
    );

    let (ok, v, _) = agent(&lab, &["claim", "six", "--family", "ipv6"]);
    assert!(!ok, "{v:#}");
    let msg = v["claim"]["message"].as_str().unwrap();
    assert!(
        msg.contains("no ipv6 range") && msg.contains("claim \"six\" asks for an ipv6 address"),
        "{msg}"
    );
    assert!(!msg.contains("--agent-families"), "{msg}");
    assert_eq!(
        lab.delegate_store(),
        before,
        "an impossible claim allocated"
    );
    lab.assert_agree();
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// An Agent client over a plain HTTP/2 connection to dipamd's socket: no tonic channel, so
/// no client-side timer of tonic's own (which reports its expiry as CANCELLED before any
/// answer can arrive). What it gets for an expired deadline is what dipamd answers, as grpcio
/// and Go clients see it.
async fn raw_agent(
    socket: &std::path::Path,
) -> AgentClient<
    impl tonic::client::GrpcService<
        tonic::body::Body,
        ResponseBody = hyper::body::Incoming,
        Error = hyper::Error,
        Future: Send,
    > + Clone,
> {
    let io = hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(socket).await.unwrap());
    let (send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    tokio::spawn(conn);
    let svc = tower::service_fn(move |mut req: hyper::Request<tonic::body::Body>| {
        let mut send = send.clone();
        // The URI tonic builds is relative: HTTP/2 wants a scheme and an authority.
        let path = req.uri().path().to_owned();
        *req.uri_mut() = format!("http://localhost{path}").parse().unwrap();
        async move {
            send.ready().await?;
            send.send_request(req).await
        }
    });
    AgentClient::new(svc)
}

fn request<T>(msg: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

fn claim_req(name: &str, ip: &str, labels: HashMap<String, String>) -> ClaimRequest {
    ClaimRequest {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        name: name.into(),
        family: AddressFamily::Unspecified as i32,
        ip: ip.into(),
        labels,
    }
}

/// Bad and oversized requests over the wire, as any gRPC client sends them: the code says
/// which (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ALREADY_EXISTS, FAILED_PRECONDITION), the
/// message never echoes the value, and the protocol_version rule is the same on every service.
#[test]
fn bad_requests_get_the_right_code_and_no_echo() {
    require_root!();
    let lab = lab("ptp-dipam-host-local.conflist", "router", &[], None);
    lab.wait_ready(1);
    let socket = lab.dipamd.socket();
    let taken = host(&lab, 77);
    let other = host(&lab, 78);
    block_on(async move {
        let ch = dipam_proto::connect(&socket).await.unwrap();
        let mut agent = AgentClient::new(ch.clone());
        let mut admin = AdminClient::new(ch);
        let huge = "n".repeat(1 << 20);
        let code = |r: Result<tonic::Response<_>, tonic::Status>| {
            let e = r
                .map(|_: tonic::Response<dipam_proto::v1::ClaimReply>| ())
                .unwrap_err();
            assert!(e.message().len() < 600, "{} bytes", e.message().len());
            assert!(!e.message().contains(&"n".repeat(100)), "echoed");
            e.code()
        };
        use tonic::Code;
        let none = HashMap::new;
        for (req, want) in [
            (claim_req("Bad_Name", "", none()), Code::InvalidArgument),
            (claim_req("router-ipv4", "", none()), Code::InvalidArgument),
            (
                claim_req("ok", "10.0.0.1/24", none()),
                Code::InvalidArgument,
            ),
            (claim_req("ok", "not-an-ip", none()), Code::InvalidArgument),
            (claim_req(&huge, "", none()), Code::ResourceExhausted),
            (
                claim_req(
                    "ok",
                    "",
                    (0..17).map(|i| (format!("k{i}"), "v".into())).collect(),
                ),
                Code::ResourceExhausted,
            ),
            (
                claim_req("ok", "", HashMap::from([("bad key".into(), "v".into())])),
                Code::InvalidArgument,
            ),
            (
                claim_req("ok", "", HashMap::from([("k".into(), huge.clone())])),
                Code::ResourceExhausted,
            ),
            (
                ClaimRequest {
                    family: 9,
                    ..claim_req("ok", "", none())
                },
                Code::InvalidArgument,
            ),
            (
                ClaimRequest {
                    family: AddressFamily::Ipv6 as i32,
                    ..claim_req("ok", "10.1.2.3", none())
                },
                Code::InvalidArgument,
            ),
            (
                ClaimRequest {
                    protocol_version: 0,
                    ..claim_req("ok", "", none())
                },
                Code::FailedPrecondition,
            ),
        ] {
            assert_eq!(
                code(agent.claim(req.clone()).await),
                want,
                "{:?}",
                req.name.get(..20)
            );
        }
        let r = agent
            .claim(claim_req("pinned", &taken, none()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.claim.unwrap().claim_state, ClaimState::Ready as i32);
        // The name is the claim's identity: another address under it is refused.
        assert_eq!(
            code(agent.claim(claim_req("pinned", &other, none())).await),
            Code::AlreadyExists
        );
        assert_eq!(
            code(
                agent
                    .unclaim(UnclaimRequest {
                        protocol_version: dipam_proto::PROTOCOL_VERSION,
                        name: "Nope!".into()
                    })
                    .await
            ),
            Code::InvalidArgument
        );
        // The protocol rule on every service.
        let e = agent
            .list(AgentListRequest {
                protocol_version: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        let e = admin
            .get_status(StatusRequest {
                protocol_version: 0,
                stores: false,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        admin
            .get_status(StatusRequest {
                protocol_version: dipam_proto::PROTOCOL_VERSION + 3,
                stores: false,
            })
            .await
            .unwrap();
    });
}

/// A caller whose deadline expires always gets DEADLINE_EXCEEDED (never CANCELLED), and what
/// it started still finishes, at once: the periodic check is an hour away, so only the
/// detached call itself can have done it.
#[test]
fn an_expired_deadline_is_one_code_and_the_work_still_finishes() {
    require_root!();
    let lab = quiet_router_lab();
    let socket = lab.dipamd.socket();
    block_on(async {
        let mut agent = raw_agent(&socket).await;
        let short = Some(Duration::from_millis(1));
        for i in 0..6 {
            let name = format!("quick-{i}");
            let e = agent
                .claim(request(claim_req(&name, "", HashMap::new()), short))
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "claim {i}: {e:?}");
        }
    });
    let converged = |what: &str, done: &dyn Fn(&HashMap<String, Value>) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, by) = claims(&lab);
            if done(&by) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {by:#?}\n{}",
                lab.dipamd.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // A 1 ms deadline can expire before dipamd accepted the claim (then nothing started, and
    // the caller's retry does it: claims are idempotent), or after (then it must finish). Which
    // one is a matter of timing, so: every claim dipamd accepted (its spec is recorded before
    // anything is allocated, and listed from then on) is established although nobody waited
    // for it, and at least one was accepted.
    std::thread::sleep(Duration::from_millis(500));
    let (_, by) = claims(&lab);
    let accepted: Vec<String> = (0..6)
        .map(|i| format!("quick-{i}"))
        .filter(|n| by.contains_key(n))
        .collect();
    assert!(
        !accepted.is_empty(),
        "no cut-off claim was accepted: {by:#?}"
    );
    converged("claims", &|by| {
        accepted
            .iter()
            .all(|n| by.get(n).is_some_and(|c| c["state"] == "ready"))
    });
    let role = |on: bool| {
        let socket = lab.dipamd.socket();
        block_on(async move {
            let mut agent = raw_agent(&socket).await;
            let req = request(
                AgentRoleRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    role: "router".into(),
                },
                Some(Duration::from_millis(1)),
            );
            let r = if on {
                agent.allocate(req).await
            } else {
                agent.release(req).await
            };
            assert_eq!(r.unwrap_err().code(), tonic::Code::DeadlineExceeded);
        });
    };
    role(false);
    converged("router released", &|by| !by.contains_key("router-ipv4"));
    role(true);
    converged("router allocated", &|by| {
        by.get("router-ipv4").is_some_and(|c| c["state"] == "ready")
    });
    assert_eq!(lab.delegate_store().len(), 1 + accepted.len());
    lab.assert_agree();
}

/// Where the upgrade fixture's host-local store lives: the path the ledger's records were
/// written with (their recorded delegate config names it, and a release replays that config),
/// so the test puts the store back exactly there. Never one of `Subnet::claim`'s subnets
/// (10.77.251.0/24 is beyond its 1..=250), and held by one test process at a time.
const UPGRADE_STORE: &str = "/run/dipam-lifecycle/upgrade-fixture";

/// Holds [`UPGRADE_STORE`] for one test; removes it on drop.
struct UpgradeStore(std::path::PathBuf);

impl UpgradeStore {
    fn take() -> Self {
        let lock = std::path::PathBuf::from(format!("{UPGRADE_STORE}.lock"));
        std::fs::create_dir_all("/run/dipam-lifecycle").unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mine = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
                .map(|mut f| {
                    use std::io::Write;
                    write!(f, "{}", std::process::id()).unwrap();
                })
                .is_ok();
            if mine {
                let _ = std::fs::remove_dir_all(UPGRADE_STORE);
                return Self(lock);
            }
            let owner = std::fs::read_to_string(&lock)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            if owner.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_file(&lock);
                continue;
            }
            assert!(
                Instant::now() < deadline,
                "{} is held by {owner:?}",
                lock.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for UpgradeStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(UPGRADE_STORE);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A node upgraded from the dipamd before claims keeps its role addresses: the ledger and
/// host-local store in `fixtures/agent-roles-before-claims.tar.gz` were written by that dipamd
/// (commit b8bbdaa: --agent-roles router,health,ingress on node-upgrade, network
/// dipam-upgrade, 10.77.251.0/24, then `dipamctl agent release health`; see
/// fixtures/README.md). This dipamd, under the unit's restrictions, serves the router and
/// ingress at the same addresses (CHECKed, not re-established), keeps health released,
/// takes a new claim beside them, survives a SIGKILL, and releases a role through the
/// records' own config.
#[test]
fn roles_keep_their_addresses_across_the_upgrade_to_claims() {
    require_root!();
    let _store = UpgradeStore::take();
    let mut d = dipam_lifecycle::Dipamd::unstarted(&[]);
    let unpacked = tempfile::tempdir().unwrap();
    let tar = bins::workspace().join("tests/lifecycle/fixtures/agent-roles-before-claims.tar.gz");
    let ok = Command::new("tar")
        .arg("-xzf")
        .arg(&tar)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::create_dir_all(UPGRADE_STORE).unwrap();
    std::fs::rename(
        unpacked.path().join("store"),
        format!("{UPGRADE_STORE}/store"),
    )
    .unwrap();
    std::fs::rename(unpacked.path().join("state"), d.state_dir()).unwrap();
    let store = std::path::Path::new(UPGRADE_STORE).join("store");
    let before = dipam_lifecycle::hostlocal::store_pairs(&store, "dipam-upgrade");
    assert_eq!(before.len(), 2, "{before:?}");

    let conflist = d.dir.path().join("10-dipam.conflist");
    let list = json!({
        "cniVersion": "1.0.0",
        "name": "dipam-upgrade",
        "plugins": [{
            "type": "ptp", "ipMasq": false, "mtu": 1500,
            "ipam": {
                "type": "dipam",
                "socketPath": d.socket(),
                "delegate": {
                    "type": "host-local",
                    "dataDir": store,
                    "ranges": [[{ "subnet": "10.77.251.0/24" }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                },
            },
        }],
    });
    std::fs::write(&conflist, serde_json::to_vec_pretty(&list).unwrap()).unwrap();
    let conflist = conflist.display().to_string();
    d.set_flags(&[
        "--conflist",
        &conflist,
        "--node-name",
        "node-upgrade",
        "--agent-roles",
        "router,health,ingress",
        "--agent-check-interval",
        "3600",
    ]);
    d.run_under(&shipped_unit_setpriv());
    d.start_again();

    let list = |d: &dipam_lifecycle::Dipamd| -> HashMap<String, Value> {
        let out = d.ctl(&["agent", "list", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["name"].as_str().unwrap().to_owned(), a.clone()))
            .collect()
    };
    let by = list(&d);
    assert_eq!(by.len(), 2, "{by:#?}\n{}", d.log());
    assert_eq!(by["router-ipv4"]["ip"], "10.77.251.4/24", "{by:#?}");
    assert_eq!(by["ingress-ipv4"]["ip"], "10.77.251.3/24", "{by:#?}");
    for a in by.values() {
        assert_eq!(a["state"], "ready", "{a}");
        assert_eq!(a["predefined"], true);
        assert_eq!(a["changed"], false);
    }
    let status: Value = serde_json::from_slice(&d.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["agentReestablished"], 0, "{status}");
    let after = dipam_lifecycle::hostlocal::store_pairs(&store, "dipam-upgrade");
    assert_eq!(after, before, "the upgrade touched the delegate's store");
    assert_eq!(d.ledger_pairs("dipam-upgrade"), after);

    // Claims beside the upgraded roles, across a SIGKILL.
    let out = d.ctl(&["agent", "claim", "extra", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.kill9();
    d.start_again();
    let again = list(&d);
    assert_eq!(again.len(), 3, "{again:#?}");
    for name in ["router-ipv4", "ingress-ipv4"] {
        assert_eq!(again[name]["ip"], by[name]["ip"]);
    }
    // A role released through the record the old dipamd wrote: its recorded config reaches
    // the same store.
    let out = d.ctl(&["agent", "release", "ingress"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now = dipam_lifecycle::hostlocal::store_pairs(&store, "dipam-upgrade");
    assert!(!now.iter().any(|(_, ip)| ip == "10.77.251.3"), "{now:?}");
    assert_eq!(d.ledger_pairs("dipam-upgrade"), now);
    assert_eq!(now.len(), 2, "{now:?}");
}

/// A claim whose address had to change (its reservation lost while dipamd was down, and the
/// address taken meanwhile by a reservation dipamd never made) is marked changed with the
/// address it had: the mark is kept across a restart and in every Watch message until a
/// client reads the claim with List, then cleared.
#[test]
fn a_changed_address_stays_marked_until_read() {
    require_root!();
    let mut lab = lab(
        "ptp-dipam-host-local.conflist",
        "router",
        &["--agent-check-interval", "3600"],
        None,
    );
    lab.wait_ready(1);
    let before = bare(&claim_ready(&lab, &["floating"])["ip"]);
    let w = lab.watch();
    let marked = |l: &Value| {
        l["addresses"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["name"] == "floating" && a["changed"] == true)
        })
    };
    w.wait_for("the claim", |l| l.to_string().contains(&before));
    lab.dipamd.kill9();
    // Another allocator took the address while dipamd was down.
    let file = lab.data.path().join(lab.network()).join(&before);
    std::fs::write(&file, "someone-else\r\neth0").unwrap();
    lab.dipamd.start_again();
    w.wait_for("the change", marked);
    let first = w.lines().last().unwrap()["instanceID"].clone();
    lab.dipamd.kill9();
    lab.dipamd.start_again();
    // The next dipamd's first message still carries the mark: nobody has read it.
    w.wait_for("the mark after a restart", |l| {
        l["instanceID"] != first && l["instanceID"] != Value::Null && marked(l)
    });

    let (_, by) = claims(&lab);
    let c = &by["floating"];
    assert_eq!(c["state"], "ready", "{c}");
    assert_ne!(bare(&c["ip"]), before, "{c}");
    assert_eq!(c["changed"], true, "{c}");
    assert_eq!(c["previousIP"], before.as_str(), "{c}");
    let (_, by) = claims(&lab);
    assert_eq!(
        by["floating"]["changed"], false,
        "read once: no longer news"
    );

    // Watchers learn the mark is gone (the read is a change of the list).
    w.wait_for("the mark cleared", |l| {
        l["addresses"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["name"] == "floating" && a["changed"] == false)
        }) && !l.to_string().contains(&format!("\"ip\":\"{before}/"))
    });
    drop(w);
    std::fs::remove_file(&file).unwrap();
    lab.assert_agree();
}

/// Sixteen claims at once on one connection: each reply is the caller's own claim, ready,
/// whatever else was claimed meanwhile (a reply that was the whole list once missed the
/// caller's own entry under concurrency), and no two share an address.
#[test]
fn concurrent_claims_each_get_their_own_outcome() {
    require_root!();
    let lab = quiet_router_lab();
    let socket = lab.dipamd.socket();
    let replies = block_on(async move {
        let agent = AgentClient::new(dipam_proto::connect(&socket).await.unwrap());
        let calls = (0..16).map(|i| {
            let mut agent = agent.clone();
            async move {
                agent
                    .claim(claim_req(&format!("c{i}"), "", HashMap::new()))
                    .await
                    .map(tonic::Response::into_inner)
            }
        });
        let mut out = Vec::new();
        let handles: Vec<_> = calls.map(tokio::spawn).collect();
        for h in handles {
            out.push(h.await.unwrap().unwrap());
        }
        out
    });
    let mut ips = Vec::new();
    for (i, r) in replies.iter().enumerate() {
        let c = r.claim.as_ref().unwrap();
        assert_eq!(
            c.name,
            format!("c{i}"),
            "a reply about someone else's claim"
        );
        assert_eq!(c.claim_state, ClaimState::Ready as i32, "{c:?}");
        ips.push(c.ip.clone());
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 16, "claims share an address");
    let (_, by) = claims(&lab);
    assert_eq!(by.len(), 17);
    lab.assert_agree();
}
