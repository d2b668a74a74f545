//! Stopping and restarting dipamd the way systemd and a DaemonSet do it, with the agent
//! watching (the CFP's agent always has an `Agent.Watch` open):
//! - SIGTERM ends dipamd within its drain bound however many watches are open; each watch ends
//!   with UNAVAILABLE, and a watcher that reconnects gets the next dipamd's full list;
//! - a request in flight at SIGTERM finishes when it can within the drain, and one that cannot
//!   is cut short, converges at the next start (ledger and host-local agree) and is served by
//!   it when the plugin tries again; a request
//!   made during the drain is not taken by the draining dipamd but waits for the next one;
//! - after a kill -9, a delegate the previous dipamd left behind that has exited but was never
//!   reaped (a zombie) does not hold the next start.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Lab, Runtime, agentlab::addresses_of, bins, daemon::socket_gone, require_root,
};
use dipam_proto::v1::{AgentListRequest, agent_client::AgentClient};
use serde_json::Value;

/// dipamd's drain bound in these tests (`--shutdown-timeout`), and what the exit may take
/// beyond it (dipamd's own exit wait is 1 s; the rest is slack for a loaded machine).
const DRAIN: Duration = Duration::from_secs(3);
const EXIT_SLACK: Duration = Duration::from_secs(4);

fn drain_flag() -> [String; 2] {
    ["--shutdown-timeout".into(), DRAIN.as_secs_f64().to_string()]
}

/// (role, family, ip, state) of a watch message, sorted: what the agent acts on.
type Addresses = Vec<(String, String, String, String)>;

/// A `dipamctl agent watch --json` process; its stdout lines arrive on `lines`, its stderr
/// is kept in a file. Killed on drop.
struct CtlWatch {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl CtlWatch {
    fn start(socket: &Path, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let mut child = Command::new(bins::bin("dipamctl"))
            .arg("--socket")
            .arg(socket)
            .args(["agent", "watch", "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            stderr,
            _dir: dir,
        }
    }

    /// The next list the watch prints.
    fn next(&self, what: &str) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{what}: no list from dipamctl agent watch"));
        serde_json::from_str(&line).unwrap()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for CtlWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a gRPC watcher (the agent's own client, tonic) sees.
#[derive(Debug)]
enum Seen {
    List(Addresses),
    Ended(tonic::Code, String),
}

/// An agent's watch loop over tonic, on its own thread: watch, and on the end of a stream
/// report how it ended and connect again (as a gRPC client does on UNAVAILABLE).
fn grpc_watcher(socket: PathBuf) -> mpsc::Receiver<Seen> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            loop {
                let Ok(channel) = dipam_proto::connect(&socket).await else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                let mut client = AgentClient::new(channel);
                let req = AgentListRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                };
                let mut stream = match client.watch(req).await {
                    Ok(s) => s.into_inner(),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                };
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(list)) => {
                            let mut a: Addresses = list
                                .addresses
                                .iter()
                                .map(|a| {
                                    (
                                        a.role.clone(),
                                        a.family.clone(),
                                        a.ip.clone(),
                                        a.state.clone(),
                                    )
                                })
                                .collect();
                            a.sort();
                            if tx.send(Seen::List(a)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break Seen::Ended(tonic::Code::Ok, "no status".into()),
                        Err(s) => break Seen::Ended(s.code(), s.message().to_owned()),
                    }
                };
                if tx.send(ended).is_err() {
                    return;
                }
            }
        });
    });
    rx
}

fn next_seen(rx: &mpsc::Receiver<Seen>, what: &str) -> Seen {
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what}: the gRPC watcher saw nothing"))
}

/// An agent bench with router and health addresses, ready, with the drain bound set.
fn agent_lab(extra: &[&str]) -> (AgentLab, Addresses) {
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.write_conflist();
    let mut flags: Vec<String> = drain_flag().to_vec();
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    lab.set_roles("router,health", &refs);
    lab.dipamd.start_again();
    lab.wait_ready(2);
    let addrs = lab.addresses();
    assert!(addrs.iter().all(|a| a.3 == "ready" && !a.2.is_empty()));
    (lab, addrs)
}

/// SIGTERM ends dipamd within the drain bound, cleanly, and its socket goes.
fn stop(lab: &mut AgentLab) {
    let status = lab.dipamd.terminate_within(DRAIN + EXIT_SLACK);
    assert!(
        status.success(),
        "dipamd exited {status}:\n{}",
        lab.dipamd.log()
    );
    assert!(socket_gone(&lab.dipamd.socket()));
}

#[test]
fn sigterm_ends_dipamd_with_a_watch_open_and_the_watch_comes_back_whole() {
    require_root!();
    let (mut lab, addrs) = agent_lab(&[]);
    let watch = CtlWatch::start(&lab.dipamd.socket(), &[]);
    assert_eq!(addresses_of(&watch.next("first list")), addrs);

    stop(&mut lab);
    // The watch was ended, not cut: UNAVAILABLE with dipamd's reason, and dipamctl says it
    // reconnects instead of exiting.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !watch.stderr().contains("reconnecting") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = watch.stderr();
    assert!(
        said.contains("shutting down") && said.contains("reconnecting"),
        "dipamctl agent watch said: {said:?}"
    );

    lab.dipamd.start_again();
    // The next dipamd's first message is the whole list, the same addresses as before.
    assert_eq!(
        addresses_of(&watch.next("after the restart")),
        addrs,
        "the reconnected watch did not get the full list"
    );
    // A crash ends no watch politely: the connection just breaks. dipamctl reconnects then
    // too, and the next dipamd's list is whole again.
    lab.dipamd.kill9();
    lab.dipamd.start_again();
    assert_eq!(
        addresses_of(&watch.next("after a kill -9 and a start")),
        addrs
    );
    assert!(
        watch.stderr().contains("connection to dipamd was lost"),
        "{:?}",
        watch.stderr()
    );
    lab.assert_agree();
}

#[test]
fn sigterm_with_several_watches_ends_each_with_unavailable_and_all_reconnect() {
    require_root!();
    let (mut lab, addrs) = agent_lab(&[]);
    let socket = lab.dipamd.socket();
    let ctl: Vec<CtlWatch> = (0..3).map(|_| CtlWatch::start(&socket, &[])).collect();
    let once = CtlWatch::start(&socket, &["--no-reconnect"]);
    let grpc: Vec<_> = (0..2).map(|_| grpc_watcher(socket.clone())).collect();
    for w in ctl.iter().chain([&once]) {
        assert_eq!(addresses_of(&w.next("first list")), addrs);
    }
    for g in &grpc {
        match next_seen(g, "first list") {
            Seen::List(a) => assert_eq!(a, addrs),
            other => panic!("{other:?}"),
        }
    }

    for round in 0..2 {
        stop(&mut lab);
        for g in &grpc {
            match next_seen(g, "the stop") {
                Seen::Ended(code, msg) => assert_eq!(
                    code,
                    tonic::Code::Unavailable,
                    "round {round}: the watch ended with {code:?} {msg:?}"
                ),
                other => panic!("round {round}: {other:?}"),
            }
        }
        lab.dipamd.start_again();
        for g in &grpc {
            match next_seen(g, "the restart") {
                Seen::List(a) => assert_eq!(a, addrs, "round {round}: not the full list"),
                other => panic!("round {round}: {other:?}"),
            }
        }
        for w in &ctl {
            assert_eq!(
                addresses_of(&w.next("the restart")),
                addrs,
                "round {round}: dipamctl's watch did not come back whole"
            );
        }
    }
    // --no-reconnect: the first stop ended it, non-zero, saying why.
    let mut once = once;
    let status = once.child.wait().unwrap();
    assert!(!status.success());
    assert!(
        once.stderr().contains("shutting down"),
        "{:?}",
        once.stderr()
    );
    lab.assert_agree();
}

/// A copy of host-local that, for ADD, notes that it started and then sleeps `secs` first.
fn slow_host_local(dir: &Path, secs: u32) -> PathBuf {
    let started = dir.join("started");
    let script = format!(
        "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then : > '{}'; sleep {secs}; fi\nexec /usr/lib/cni/host-local \"$@\"\n",
        started.display()
    );
    let path = dir.join("host-local");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    started
}

/// A runtime whose CNI_PATH finds the slow host-local first (dipamd searches the request's
/// CNI_PATH before its own --cni-path).
fn slow_runtime(dir: &Path) -> Runtime {
    Runtime::new(format!("{}:{}", dir.display(), bins::cni_path()))
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_request_in_flight_at_sigterm_finishes_within_the_drain() {
    require_root!();
    let drain = drain_flag();
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &[&drain[0], &drain[1]]);
    let slow = tempfile::tempdir().unwrap();
    let started = slow_host_local(slow.path(), 2);
    let (_ns, pod) = lab.pod();
    let list = lab.list().clone();
    let rt = slow_runtime(slow.path());
    let add = std::thread::spawn(move || rt.ipam(&list, 0, "ADD", &pod, None));
    wait_for(&started);
    // SIGTERM now; the guard's terminate below only waits for the exit.
    // SAFETY: kill(2) on the dipamd this test started and has not reaped.
    unsafe {
        libc::kill(lab.dipamd.pid().unwrap() as libc::pid_t, libc::SIGTERM);
    }
    // While it drains, the socket's path is gone: the draining dipamd takes nothing new. A
    // call made now waits for the next dipamd (the plugin's wait, docs/cfp.md §8.4) instead
    // of queueing in the old one's backlog or failing.
    let socket = lab.dipamd.socket();
    let deadline = Instant::now() + Duration::from_secs(10);
    while socket.exists() {
        assert!(
            Instant::now() < deadline,
            "dipamd kept its socket after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (_ns2, late) = lab.pod();
    let late_list = lab.list().clone();
    let late_rt = Runtime::new(lab.rt.cni_path.clone());
    let late_add = std::thread::spawn(move || late_rt.ipam(&late_list, 0, "ADD", &late, None));
    let status = lab.dipamd.terminate_within(DRAIN + EXIT_SLACK);
    assert!(status.success(), "{}", lab.dipamd.log());
    let result = add.join().unwrap();
    assert!(
        result.is_ok(),
        "the ADD in flight was not drained: {}",
        result.unwrap_err()
    );
    assert!(
        !late_add.is_finished(),
        "the draining dipamd took a call made after SIGTERM"
    );
    lab.dipamd.start_again();
    late_add
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the ADD made during the drain failed: {e}"));
    assert_eq!(lab.ledger().len(), 2);
    lab.assert_agree();
}

#[test]
fn a_request_that_outlasts_the_drain_is_cut_short_and_converges() {
    require_root!();
    let drain = drain_flag();
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &[&drain[0], &drain[1]]);
    let slow = tempfile::tempdir().unwrap();
    // Longer than the drain, shorter than the delegate timeout (10 s).
    let started = slow_host_local(slow.path(), DRAIN.as_secs() as u32 + 3);
    let (_ns, pod) = lab.pod();
    let list = lab.list().clone();
    let rt = slow_runtime(slow.path());
    let retry = pod.clone();
    let add = std::thread::spawn(move || rt.ipam(&list, 0, "ADD", &pod, None));
    wait_for(&started);
    let status = lab.dipamd.terminate_within(DRAIN + EXIT_SLACK);
    assert!(status.success(), "{}", lab.dipamd.log());
    // Cut short without an answer, the plugin tries the ADD again once a dipamd serves.
    assert!(
        !add.is_finished(),
        "an ADD cut short by the drain failed instead of waiting for the next dipamd"
    );
    // The next start waits for the delegate left running, then completes or releases its
    // work before it serves: the plugin's second try is answered from what it decided (the
    // ledger's record, or a new allocation), and the ledger and host-local agree.
    lab.dipamd.start_again();
    add.join()
        .unwrap()
        .unwrap_or_else(|e| panic!("the ADD cut short was not served by the next dipamd: {e}"));
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    // The runtime's own repeat of the ADD gets the same attachment.
    lab.rt.ipam(lab.list(), 0, "ADD", &retry, None).unwrap();
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
}

/// The parent of an unreaped zombie; killed (which lets init reap both) on drop.
struct ZombieParent(Child);

impl Drop for ZombieParent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process that has exited but is never reaped: `sh` starts a short `sleep` in the
/// background and execs a long one, which never waits for it (the short one outlives the
/// exec, so `sh` cannot reap it first). Returns (the parent, the zombie's pid).
fn unreaped_zombie() -> (ZombieParent, u32) {
    let mut parent = ZombieParent(
        Command::new("sh")
            .args(["-c", "sleep 0.3 & echo $!; exec sleep 600"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(parent.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let mut fields = stat[stat.rfind(')').unwrap() + 2..].split_whitespace();
        let state = fields.next().unwrap();
        let ppid = fields.next().unwrap();
        let parent_comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap();
        if state == "Z" && parent_comm.trim() == "sleep" {
            return (parent, pid);
        }
        assert!(
            Instant::now() < deadline,
            "{pid} never became a zombie: {stat}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The kernel's start time of `pid` (field 22 of /proc/<pid>/stat).
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_zombie_delegate_left_by_a_killed_dipamd_does_not_hold_the_next_start() {
    require_root!();
    // A delegate timeout no start should ever sit through: before the fix the start waited
    // this long for the zombie, then forever after killing it (SIGKILL does not remove an
    // exited process).
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--delegate-timeout", "600"],
    );
    lab.dipamd.kill9();
    let (_parent, zombie) = unreaped_zombie();
    let ticks = start_ticks(zombie);
    lab.dipamd
        .plant_exec_slot(zombie, ticks.saturating_sub(1), ticks + 1);

    // Dipamd::start_again panics unless dipamd serves within 20 s.
    lab.dipamd.start_again();
    let log = lab.dipamd.log();
    assert!(
        !log.contains("waiting for a delegate left running"),
        "the start waited for the zombie {zombie}:\n{log}"
    );
    // Still a zombie: dipamd neither waited for it nor could it have removed it.
    assert!(std::fs::read_to_string(format!("/proc/{zombie}/stat")).is_ok());
    let (_ns, pod) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    lab.assert_agree();
}
