//! CRI-O (built from its Go module by tests/deps.sh, with Debian's conmon and runc; see
//! docs/compatibility.md), driven through CRI (src/crio.rs): the runtime that sends a real CNI
//! GC. At start it waits for the plugin's STATUS, then sends GC on each network of its
//! network directory with the sandboxes it restored as the valid list, `null` for a network
//! without any (docs/sources.md §10.4). dipamd runs under the shipped systemd unit's
//! capability set, on non-default socket, state and spool paths, with the agent's router and
//! a claim allocated beside the pods, at cniVersion 1.1.0.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{
    AgentLab, Fixture, Lab, Subnet,
    crio::Crio,
    examples, require, require_peers,
    shapes::{Seeded, churn_while_killing, retry, shipped_unit_setpriv},
    unique,
};
use serde_json::Value;

/// dipamd with the agent (role `router`) on a main-mode conflist at 1.1.0, and a CRI-O whose
/// network directory holds that conflist and a second dipam network no pod uses. Fields drop
/// in order: CRI-O first, so that its last DELs reach dipamd.
struct Bench {
    crio: Crio,
    lab: AgentLab,
    /// The network no pod uses (CRI-O's GC sends it `null`).
    idle: String,
    _idle_subnet: Subnet,
}

impl Bench {
    /// Everything written; dipamd started when `dipamd_up`; CRI-O not started.
    fn new(dipamd_up: bool) -> Option<Self> {
        Self::with(dipamd_up, |_| Vec::new(), false)
    }

    /// dipamd up and CRI-O started on it: where a test with nothing to set first begins.
    fn running() -> Option<Self> {
        let mut b = Self::new(true)?;
        b.start_crio();
        Some(b)
    }

    /// As [`Self::new`], with dipamd's further flags from `flags` (given CRI-O's socket), and
    /// in its own PID namespace when `own_pid_ns` (the DaemonSet without hostPID: it sees
    /// none of the pods' processes, nor, in its private mounts, their pinned namespaces).
    fn with(
        dipamd_up: bool,
        flags: impl FnOnce(&std::path::Path) -> Vec<String>,
        own_pid_ns: bool,
    ) -> Option<Self> {
        let peers = dipam_lifecycle::peers::all(module_path!(), &["crio", "pinns"])?;
        let crio = Crio::new(&peers[0], &peers[1]);
        let mut lab = AgentLab::unstarted("dipam-host-local-1.1.0.conflist");
        lab.fx = lab.fx.clone().with_version("1.1.0");
        lab.write_conflist();
        let spool = lab.dipamd.dir.path().join("elsewhere/spool");
        let spool = spool.display().to_string();
        let mut all = vec![
            "--spool-dir".to_owned(),
            spool,
            "--gc-grace".into(),
            "0".into(),
        ];
        all.extend(flags(&crio.dir().join("crio.sock")));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        lab.set_roles("router", &all);
        if own_pid_ns {
            let unshare = ["unshare", "-p", "-f", "--kill-child", "--mount-proc"];
            lab.dipamd.enter(&unshare.map(str::to_owned));
        }
        lab.dipamd.run_under(&shipped_unit_setpriv());
        crio.write_conflist("10", &lab.fx.list);
        let idle_subnet = Subnet::claim("10.77");
        let idle = lab.fx.clone().unique_name().with_subnet(&idle_subnet.cidr);
        crio.write_conflist("20", &idle.list);
        if dipamd_up {
            lab.dipamd.start_again();
            lab.wait_ready(1);
        }
        Some(Self {
            crio,
            lab,
            idle: idle.name(),
            _idle_subnet: idle_subnet,
        })
    }

    /// Starts CRI-O and waits until its NetworkReady (its first STATUS succeeded).
    fn start_crio(&mut self) {
        self.crio.start();
        wait_for(30, "NetworkReady", || {
            self.crio.network_ready().is_ok_and(|(r, _)| r)
        });
    }

    fn pods_in_ledger(&self) -> Vec<(String, String)> {
        self.lab
            .ledger()
            .into_iter()
            .filter(|(id, _)| !id.starts_with("dipam-"))
            .collect()
    }

    fn claim(&self, name: &str) -> Value {
        let out = self.lab.dipamd.ctl(&["agent", "claim", name, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["claim"]["state"], "ready", "{v:#}");
        v["claim"].clone()
    }
}

/// Waits for `what` (checked every 200 ms) for up to `secs`.
#[track_caller]
fn wait_for(secs: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pods at 1.1.0; two of them lose their DELs (dipamd is SIGKILLed and the plugin cannot
/// spool: CRI-O then marks their network stopped, drops its result cache and never sends
/// those DELs again); CRI-O restarts and its start-up GC frees exactly those two. The
/// agent's router and claim are never freed, and the network without pods (`null` list)
/// is answered with success, freeing nothing.
#[test]
fn the_start_up_gc_frees_exactly_the_lost_dels() {
    require!(dipam_lifecycle::crio::unavailable());
    let Some(mut b) = Bench::running() else {
        return;
    };
    b.claim("egress");
    let agent = b.lab.addresses();
    assert_eq!(agent.len(), 2);
    let pods: Vec<String> = (0..5)
        .map(|i| {
            b.crio
                .run_pod(&format!("web-{i}"))
                .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", b.lab.dipamd.log()))
        })
        .collect();
    let ledger = b.pods_in_ledger();
    assert_eq!(ledger.len(), 5, "{ledger:?}");
    for id in &pods {
        let ip = b.crio.pod_ip(id).expect("CRI reports the pod's IP");
        assert!(ledger.contains(&(id.clone(), ip)), "{id}: {ledger:?}");
    }
    b.lab.assert_agree();

    // The lost DELs: dipamd down, and its spool out of reach (its pointer beside the socket
    // gone, as after /run was emptied), so the plugin fails them with 11.
    b.lab.dipamd.kill9();
    let pointer = format!("{}.spool", b.lab.dipamd.socket().display());
    std::fs::remove_file(&pointer).unwrap();
    let lost = &pods[..2];
    for id in lost {
        let e = b.crio.stop_pod(id).unwrap_err();
        assert!(e.message().contains("network"), "{e}");
        b.crio
            .remove_pod(id)
            .unwrap_or_else(|e| panic!("remove {id}: {e}"));
    }
    b.lab.dipamd.start_again();
    b.lab.wait_ready(2);
    assert_eq!(
        b.pods_in_ledger().len(),
        5,
        "nothing released the lost ones yet"
    );
    // A second stop of a lost pod sends nothing: CRI-O removed it.
    assert!(
        b.crio
            .list_pods()
            .unwrap()
            .iter()
            .all(|p| !lost.contains(&p.id))
    );

    // CRI-O restarts: it restores the three, waits for STATUS, then GCs.
    b.crio.kill9();
    b.crio.start();
    wait_for(60, "the start-up GC frees the two lost pods", || {
        b.pods_in_ledger().len() == 3
    });
    let left: Vec<String> = b.pods_in_ledger().into_iter().map(|(id, _)| id).collect();
    let mut kept = pods[2..].to_vec();
    kept.sort();
    let mut left_sorted = left.clone();
    left_sorted.sort();
    assert_eq!(left_sorted, kept, "exactly the lost ones are freed");
    assert_eq!(
        b.lab.addresses(),
        agent,
        "the agent's router and claim are kept"
    );
    b.lab.assert_agree();
    for id in &pods[2..] {
        assert!(b.crio.pod_ip(id).is_some(), "{id} lost its address");
    }
    let log = b.lab.dipamd.log();
    assert!(
        log.contains("names nothing") && log.contains(&b.idle),
        "CRI-O's GC of the network without pods (null) is answered: {}",
        log.lines()
            .filter(|l| l.contains("GC"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let crio_log = b.crio.log();
    assert!(
        !crio_log.contains("Garbage collect stale network resources during server startup failed"),
        "CRI-O's start-up GC failed:\n{}",
        crio_log
            .lines()
            .filter(|l| l.contains("GC") || l.contains("arbage"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The no-false-free rows CRI-O owns (docs/cfp.md §7.4), with every look dipamd makes at
/// its most eager: the runtime-aware GC on CRI-O's socket every second (with hostPID; without
/// it the evidence pass alone), the evidence pass's two looks 2 s apart, the grace period
/// (30 s) as shipped, which the pods have outlived by the time CRI-O restarts. A pod whose
/// DEL was lost (dipamd down, its spool out of reach; CRI-O removes the pod anyway) is freed
/// through the runtime's list within 60 s.
/// CRI-O is then SIGKILLed and kept down for 6 s (its list unreachable: the looks prove
/// nothing) and started again: it restores the two running pods and sends its start-up GC
/// with them as the valid list. Neither, nor the agent's router and claim, is freed in the
/// 20 s of passes that follow, and each keeps its address.
fn crio_restored_pods_are_never_freed(own_pid_ns: bool) {
    require!(dipam_lifecycle::crio::unavailable());
    // Without hostPID, the evidence pass alone (the runtime-aware GC's next pass after the
    // one at start is an hour away): what it makes of the runtime's list is the question.
    let interval = if own_pid_ns { "3600" } else { "1" };
    let flags = |sock: &std::path::Path| {
        [
            "--cri-endpoint",
            &format!("unix://{}", sock.display()),
            "--runtime-gc-interval",
            interval,
            "--dead-after",
            "2",
            // The grace period as shipped: it is the rule that keeps a pod whose sandbox the
            // runtime does not list yet (CRI-O lists it once RunPodSandbox returns, which
            // took over a second here under load, beyond two one-second passes).
            "--gc-grace",
            "30",
            "--metrics-socket",
            &sock
                .with_file_name("dipamd-metrics.sock")
                .display()
                .to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let Some(mut b) = Bench::with(true, flags, own_pid_ns) else {
        return;
    };
    if own_pid_ns {
        let outer = b.lab.dipamd.pid().unwrap();
        assert!(
            child_in_another_pid_namespace(outer),
            "dipamd runs in its own PID namespace"
        );
    }
    b.start_crio();
    b.claim("egress");
    let agent = b.lab.addresses();
    let pods: Vec<String> = (0..3)
        .map(|i| b.crio.run_pod(&format!("web-{i}")).unwrap())
        .collect();
    let added = Instant::now();
    let ips: Vec<String> = pods.iter().map(|id| b.crio.pod_ip(id).unwrap()).collect();
    let (lost, live) = (&pods[0], &pods[1..]);
    b.lab.dipamd.kill9();
    let pointer = format!("{}.spool", b.lab.dipamd.socket().display());
    std::fs::remove_file(&pointer).unwrap();
    assert!(b.crio.stop_pod(lost).is_err(), "the DEL is lost");
    b.crio.remove_pod(lost).unwrap();
    b.lab.dipamd.start_again();
    b.lab.wait_ready(2);
    let since = Instant::now();
    wait_for(60, "the lost pod freed through the runtime's list", || {
        b.pods_in_ledger().iter().all(|(id, _)| id != lost)
    });
    let freed_by = freed_by(&b.lab.dipamd, lost);
    eprintln!(
        "own PID namespace {own_pid_ns}: the lost pod freed by {freed_by} after {:?}",
        since.elapsed()
    );
    let by: &[&str] = if own_pid_ns {
        &["evidence"]
    } else {
        &["runtime-gc", "evidence"]
    };
    assert!(by.contains(&freed_by.as_str()), "freed by {freed_by}");
    let msock = b.crio.dir().join("dipamd-metrics.sock");
    let gcs_served = || -> u64 {
        requests(&msock, "GC")
            .iter()
            .filter(|(code, _)| code == "0")
            .map(|(_, n)| n)
            .sum()
    };
    let gcs_before = gcs_served();
    // Every look from here on judges the running pods too: they are past the grace period.
    if let Some(left) = Duration::from_secs(31).checked_sub(added.elapsed()) {
        std::thread::sleep(left);
    }
    b.crio.kill9();
    std::thread::sleep(Duration::from_secs(6));
    b.start_crio();
    let crio_back = Instant::now();
    while crio_back.elapsed() < Duration::from_secs(20) {
        let ledger = b.pods_in_ledger();
        for (id, ip) in live.iter().zip(&ips[1..]) {
            assert!(
                ledger.contains(&(id.clone(), ip.clone())),
                "own PID namespace {own_pid_ns}: the live pod {id} ({ip}) was freed: {ledger:?}\n{}",
                b.lab.dipamd.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    for (id, ip) in live.iter().zip(&ips[1..]) {
        assert_eq!(b.crio.pod_ip(id).as_ref(), Some(ip), "CRI-O restored {id}");
    }
    assert_eq!(
        b.lab.addresses(),
        agent,
        "the agent's router and claim are kept"
    );
    b.lab.assert_agree();
    // CRI-O's start-up GC (one per network of its directory) reached dipamd and was answered
    // with success, and freed none of the above.
    assert!(
        gcs_served() > gcs_before,
        "CRI-O's start-up GC reached dipamd: {:?}",
        requests(&msock, "GC")
    );
    assert!(
        !b.crio
            .log()
            .contains("Garbage collect stale network resources during server startup failed"),
        "CRI-O's start-up GC failed"
    );
}

/// Whether a child of `pid` (`unshare -f`'s: dipamd) runs in a PID namespace other than this
/// process's.
fn child_in_another_pid_namespace(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let own = ns("self");
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        ppid == Some(pid) && ns(&name).is_some() && ns(&name) != own
    })
}

/// Who freed `cid`'s attachment, as its history (`dipamctl explain`) says.
fn freed_by(dipamd: &dipam_lifecycle::Dipamd, cid: &str) -> String {
    let out = dipamd.ctl(&["explain", cid, "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["kind"] == "freed")
        .and_then(|e| e["by"].as_str())
        .unwrap_or("nothing")
        .to_owned()
}

/// Under the shipped unit (the host's PID namespace): the pods' namespaces, routes and
/// CRI-O's list all speak.
#[test]
fn a_pod_crio_restored_is_never_freed_by_any_look_unit() {
    crio_restored_pods_are_never_freed(false);
}

/// As the DaemonSet without hostPID: dipamd in its own PID namespace sees none of the pods'
/// processes and none of their pinned namespaces; only CRI-O's list counts, and while CRI-O
/// is down the look is incomplete and proves nothing. The lost pod is still freed, by the
/// evidence pass through the list.
#[test]
fn a_pod_crio_restored_is_never_freed_by_any_look_without_host_pid() {
    crio_restored_pods_are_never_freed(true);
}

/// CRI-O started while dipamd is down: NetworkReady is false and a RunPodSandbox (from
/// crictl, as an operator would) waits; once dipamd is back, STATUS succeeds and the pod
/// runs with an address from the ledger.
#[test]
fn pods_wait_while_dipamd_is_down_and_run_once_it_is_back() {
    require!(dipam_lifecycle::crio::unavailable());
    let crictl = require_peers!("crictl").remove(0);
    let Some(mut b) = Bench::new(false) else {
        return;
    };
    b.crio.start();
    let (ready, why) = b.crio.network_ready().unwrap();
    assert!(!ready, "NetworkReady with dipamd down: {why}");
    let pod = b.crio.dir().join("waits.json");
    std::fs::write(
        &pod,
        serde_json::to_vec(&serde_json::json!({
            "metadata": {"name": "waits", "namespace": "default",
                         "uid": dipam_lifecycle::unique("uid"), "attempt": 0},
            "log_directory": b.crio.dir().join("pods"),
            "linux": {},
        }))
        .unwrap(),
    )
    .unwrap();
    let endpoint = format!("unix://{}", b.crio.dir().join("crio.sock").display());
    let waiter = std::process::Command::new(&crictl.path)
        .args(["--runtime-endpoint", &endpoint, "--timeout", "120s", "runp"])
        .arg(&pod)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waiter = std::sync::Arc::new(std::sync::Mutex::new(waiter));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        waiter.lock().unwrap().try_wait().unwrap().is_none(),
        "RunPodSandbox did not wait for the plugin"
    );

    b.lab.dipamd.start_again();
    b.lab.wait_ready(1);
    let child = std::sync::Arc::try_unwrap(waiter)
        .unwrap()
        .into_inner()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "crictl runp: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let ip = b.crio.pod_ip(&id).expect("the pod has an address");
    assert!(
        b.pods_in_ledger().contains(&(id, ip)),
        "{:?}",
        b.lab.ledger()
    );
    wait_for(30, "NetworkReady", || {
        b.crio.network_ready().is_ok_and(|(r, _)| r)
    });
    b.lab.assert_agree();
}

/// dipamd SIGKILLed at random moments while CRI-O runs, stops and removes pods through CRI
/// (a failed RunPodSandbox retried under a new name, as kubelet retries), with an agent
/// watching. Afterwards everything converges: no sandbox left, no pod in the ledger, the
/// router's address unchanged, host-local's store exactly the ledger, and the watch saw
/// every restart in order. The seed and kill points are printed; dipamd's log follows a
/// failure.
#[test]
fn sigkill_mid_traffic_converges_and_leaks_nothing() {
    require!(dipam_lifecycle::crio::unavailable());
    let Some(mut b) = Bench::running() else {
        return;
    };
    let mut rng = Seeded::new("crio sigkill_mid_traffic_converges_and_leaks_nothing");
    let router = b.lab.addresses();
    let watch = b.lab.watch();
    let crio = &b.crio;
    let cycle = |_: u32| {
        let id = retry("RunPodSandbox", 60, || crio.run_pod(&unique("churn")));
        retry("StopPodSandbox", 60, || crio.stop_pod(&id));
        retry("RemovePodSandbox", 60, || crio.remove_pod(&id));
    };
    let cycles = churn_while_killing(&mut b.lab.dipamd, &mut rng, 6, &cycle);
    eprintln!("{cycles} pod cycles across 6 SIGKILLs (seed {})", rng.seed);
    assert!(cycles > 0, "no pod ran");
    b.lab.wait_ready(1);
    assert_eq!(b.lab.addresses(), router, "seed {}", rng.seed);
    assert!(b.crio.list_pods().unwrap().is_empty(), "sandboxes left");
    b.lab.assert_converged(1, &format!("seed {}", rng.seed));
    watch.finish_across_restarts();
}

/// `dipam_requests_total` samples of dipamd's metrics (`--metrics-socket`) for `op`, as
/// (code, count).
fn requests(socket: &std::path::Path, op: &str) -> Vec<(String, u64)> {
    use std::io::{Read, Write};
    // The metrics listener is bound in the background, after the socket serves (a held
    // metrics address never decides whether dipamd serves): wait for it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("metrics socket {}: {e}", socket.display()),
        }
    };
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: dipamd\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let prefix = format!("dipam_requests_total{{op=\"{op}\",code=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (code, count) = rest.split_once("\"} ")?;
            Some((code.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

/// Every 1.1.0 example the project shows (`conflist/dipam-host-local-1.1.0.conflist`, read
/// as shipped by src/examples.rs; only the name, socket, delegate store and subnet changed)
/// under CRI-O, the runtime it is for: CRI-O's one STATUS (it polls only until the first
/// success) reaches dipam and succeeds, NetworkReady follows it, and its one start-up GC
/// (a `null` valid list: nothing to restore) is answered with success, freeing nothing; a pod sandbox gets an address the ledger and host-local record, and CRI's
/// pod IP is the ledger's; stopping and removing it frees it. dipamd runs under the shipped
/// unit's capability set.
#[test]
fn crio_runs_every_1_1_0_example() {
    require!(dipam_lifecycle::crio::unavailable());
    let Some(peers) = dipam_lifecycle::peers::all(module_path!(), &["crio", "pinns"]) else {
        return;
    };
    let list: Vec<_> = examples::all()
        .into_iter()
        .filter(|e| e.version() == "1.1.0")
        .collect();
    assert!(
        list.iter()
            .any(|e| e.source == "conflist/dipam-host-local-1.1.0.conflist"),
        "{:?}",
        list.iter().map(|e| &e.source).collect::<Vec<_>>()
    );
    for e in &list {
        eprintln!("--- {}", e.source);
        let metrics = tempfile::tempdir().unwrap();
        let msock = metrics.path().join("metrics.sock");
        let mut lab = Lab::from_fixture(
            Fixture {
                list: e.list.clone(),
            },
            &["--metrics-socket", msock.to_str().unwrap()],
        );
        lab.dipamd.run_under(&shipped_unit_setpriv());
        lab.dipamd.restart();
        assert!(requests(&msock, "STATUS").is_empty() && requests(&msock, "GC").is_empty());
        let mut crio = Crio::new(&peers[0], &peers[1]);
        crio.write_conflist("10", lab.list());
        crio.start();
        wait_for(30, "NetworkReady", || {
            crio.network_ready().is_ok_and(|(r, _)| r)
        });
        // STATUS before anything else, then GC once STATUS succeeded (with no sandbox to
        // restore, its valid list is null: dipam frees nothing and says so).
        wait_for(30, "CRI-O's start-up GC", || {
            requests(&msock, "GC").iter().any(|(code, _)| code == "0")
        });
        // dipamd was up before CRI-O: its first STATUS succeeded, and it polls no more
        // (cni_status_grace_period 0, the default: docs/sources.md §10.4).
        let status = requests(&msock, "STATUS");
        assert_eq!(status, vec![("0".to_owned(), 1)], "{}", e.source);
        let gc = requests(&msock, "GC");
        assert_eq!(
            gc,
            vec![("0".to_owned(), 1)],
            "{}: one GC at start",
            e.source
        );
        assert!(
            lab.dipamd.log().contains("names nothing"),
            "{}: the null GC is answered",
            e.source
        );

        let id = crio
            .run_pod("example")
            .unwrap_or_else(|err| panic!("{}: {err}\n{}", e.source, lab.dipamd.log()));
        let ledger = lab.ledger();
        assert_eq!(ledger.len(), 1, "{}: {ledger:?}", e.source);
        assert_eq!(ledger[0].0, id, "{}", e.source);
        assert!(lab.subnet.contains(&ledger[0].1), "{ledger:?}");
        assert_eq!(crio.pod_ip(&id), Some(ledger[0].1.clone()), "{}", e.source);
        lab.assert_agree();
        crio.stop_pod(&id).unwrap();
        crio.remove_pod(&id).unwrap();
        assert!(lab.ledger().is_empty(), "{}: {:?}", e.source, lab.ledger());
        assert!(lab.delegate_store().is_empty(), "{}", e.source);
        // CRI's Status is answered from that first STATUS: no further CNI STATUS (unlike
        // containerd 2, which sends one per CRI Status), and no further GC.
        for _ in 0..3 {
            assert!(crio.network_ready().unwrap().0);
        }
        assert_eq!(requests(&msock, "STATUS"), status, "{}", e.source);
        assert_eq!(requests(&msock, "GC"), gc, "{}", e.source);
        eprintln!(
            "{}: CRI-O sent STATUS {status:?}, GC {:?}",
            e.source,
            requests(&msock, "GC")
        );
        drop(crio);
    }
}

/// `dipamctl install` judges a conflist by the runtime that reads the conf dir, found from the
/// runtime's own configuration: a running CRI-O whose `network_dir` a drop-in of its
/// `--config-dir` moved to a non-default directory. Installing a 1.1.0 conflist there names
/// CRI-O 1.36.3 (the pid it runs as, the drop-in that set the directory) as the reader that
/// takes every cniVersion, and gives no blanket 1.1.0 warning; the directory its `--config`
/// file names, overridden, is read by no runtime.
#[test]
fn install_is_judged_by_the_running_crio_that_reads_its_network_dir() {
    dipam_lifecycle::require_root!();
    let Some(peers) = dipam_lifecycle::peers::all(module_path!(), &["crio", "pinns"]) else {
        return;
    };
    let mut crio = Crio::new(&peers[0], &peers[1]);
    let net = crio.dir().join("node-c/net.d");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(
        crio.dir().join("conf.d/50-network.conf"),
        format!("[crio.network]\nnetwork_dir = \"{}/\"\n", net.display()),
    )
    .unwrap();
    crio.start();
    let pid = crio.pid().unwrap();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src.conflist");
    let fx = Fixture::load("dipam-host-local-1.1.0.conflist").with_version("1.1.0");
    std::fs::write(&src, serde_json::to_vec_pretty(&fx.list).unwrap()).unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let install = |conf_dir: &std::path::Path| {
        std::process::Command::new(dipam_lifecycle::bins::bin("dipamctl"))
            .args(["install", "--no-man-pages", "--json", "--plugin"])
            .arg(dipam_lifecycle::bins::bin("dipam"))
            .arg("--cni-bin-dir")
            .arg(&bin)
            .arg("--conf-dir")
            .arg(conf_dir)
            .arg("--conflist")
            .arg(&src)
            .args(["--cni-path", &dipam_lifecycle::bins::cni_path()])
            .output()
            .unwrap()
    };
    let out = install(&net);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let readers = v["readers"].as_array().unwrap();
    assert_eq!(readers.len(), 1, "{v:#}");
    let r = &readers[0];
    assert_eq!(r["runtime"], "crio", "{v:#}");
    assert_eq!(r["version"], "1.36.3", "{v:#}");
    assert_eq!(r["maxCniVersion"], Value::Null, "{v:#}");
    let reads = r["reads"].as_str().unwrap();
    assert!(
        reads.contains(&format!("runs as pid {pid} with ")) && reads.contains("50-network.conf"),
        "{reads}"
    );
    assert!(!err.contains("cannot parse a 1.1.0 result"), "{err}");
    assert!(net.join("10-dipam.conflist").is_file());
    // The network_dir of its --config file is overridden: CRI-O does not read it.
    let out = install(&crio.conf_dir());
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["readers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["runtime"] != "crio"),
        "{v:#}"
    );
}
