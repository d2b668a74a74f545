//! A hostile neighbour on the node (docs/cfp.md, "Threat model"): a local user (nobody, uid
//! 65534, a real process through setpriv) floods dipamd's listeners while root's pods are
//! added and deleted through the real plugin chain. dipamd runs as a node runs it: under
//! the shipped unit's capability set and descriptor limit, or started like the DaemonSet
//! (metrics on loopback TCP, a container runtime's soft limit below the hard one). Each test
//! asserts that root's pods keep being served, nothing is lost, and prints its figures.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::{Read, Write},
    os::unix::fs::PermissionsExt,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Lab,
    flood::{self, Flood},
    nobody::NOBODY,
    require_root, shapes,
};

/// Restarts the lab's dipamd through `prlimit` with `nofile` (SOFT:HARD) and, when
/// `shipped`, the shipped unit's capability set (its `LimitNOFILE` is passed as `nofile`).
fn restart_as(lab: &mut Lab, nofile: &str, shipped: bool) {
    let mut argv = vec![
        "prlimit".to_owned(),
        format!("--nofile={nofile}"),
        "--".into(),
    ];
    if shipped {
        argv.extend(shapes::shipped_unit_setpriv());
    }
    lab.dipamd.kill9();
    lab.dipamd.run_under(&argv);
    lab.dipamd.start_again();
    // nobody must reach the socket: its own mode, group and the peer check are what count.
    std::fs::set_permissions(
        lab.dipamd.dir.path(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
}

/// The shipped unit's `LimitNOFILE` (SOFT:HARD for prlimit), within this process's own hard
/// limit (raising it needs CAP_SYS_RESOURCE, which a container running the tests may lack).
fn shipped_nofile() -> String {
    let unit = std::fs::read_to_string(
        dipam_lifecycle::bins::workspace().join("deploy/systemd/dipamd.service"),
    )
    .unwrap();
    let n = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("LimitNOFILE="))
        .expect("the shipped unit sets LimitNOFILE")
        .trim()
        .parse::<u64>()
        .unwrap()
        .min(flood::own_hard_nofile());
    format!("{n}:{n}")
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Issue 28 §2. Started like the DaemonSet (`--metrics-address` on loopback, reachable by
/// every local user; the container's soft descriptor limit 1024 below a hard 4096), dipamd
/// raises its soft limit, accepts at most --metrics-max-connections metrics connections and
/// keeps its descriptors for root's pods while nobody holds 1,500 connections to the port.
#[test]
fn a_metrics_port_flood_never_starves_root_pods() {
    require_root!();
    let port = 21_000 + (std::process::id() % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--metrics-address", &addr],
    );
    restart_as(&mut lab, "1024:4096", false);
    let pid = lab.dipamd.pid().unwrap();
    assert_eq!(
        flood::nofile(pid),
        (4096, 4096),
        "dipamd raises its soft descriptor limit to the hard one"
    );
    let fds_before = flood::open_fds(pid);
    let attacker = Flood::start(&["tcp", "1500", "127.0.0.1", &port.to_string()]);
    let fds_during = flood::open_fds(pid);
    let failed = lab.add_and_del(10);
    eprintln!(
        "metrics flood: attacker held {} connections (opened in {:?}); dipamd fds {} -> {}; \
         root pods failed: {}/10",
        attacker.held,
        attacker.took,
        fds_before,
        fds_during,
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());
    assert!(
        attacker.held >= 100,
        "the flood did not happen: {}",
        attacker.held
    );
    assert!(
        fds_during <= fds_before + 16 + 4,
        "metrics connections beyond the cap: {fds_before} -> {fds_during}"
    );
    drop(attacker);
    // The port serves again once the attacker leaves; no accept-error storm in the log.
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let out = scrape(port);
        if out.starts_with("HTTP/1.1 200") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let log = lab.dipamd.log();
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(log.lines().filter(|l| l.contains("accept failed")).count() <= 10);
    lab.assert_agree();
}

/// Issue 28 §3. A member of `--socket-group` who is not an allowed uid is dropped at accept
/// from its peer credentials, before any HTTP/2: 3,000 connections leave dipamd's descriptor
/// count where it was, root's pods are served, and the drop is logged (rate-limited).
/// dipamd runs under the shipped unit's capabilities and descriptor limit.
#[test]
fn a_refused_peer_is_dropped_at_accept() {
    require_root!();
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--socket-group", NOBODY]);
    restart_as(&mut lab, &shipped_nofile(), true);
    let pid = lab.dipamd.pid().unwrap();
    let sock = lab.dipamd.socket().display().to_string();
    let fds_before = flood::open_fds(pid);
    let attacker = Flood::start(&["unix", "3000", &sock]);
    let fds_during = flood::open_fds(pid);
    let failed = lab.add_and_del(10);
    eprintln!(
        "refused peer flood: {} connections in {:?}; dipamd fds {} -> {}; root pods failed: {}/10",
        attacker.held,
        attacker.took,
        fds_before,
        fds_during,
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());
    assert!(
        fds_during <= fds_before + 8,
        "refused connections are held: {fds_before} -> {fds_during}"
    );
    drop(attacker);
    let log = lab.dipamd.log();
    let dropped = log
        .lines()
        .filter(|l| l.contains("connection dropped at accept"))
        .count();
    assert!((1..=10).contains(&dropped), "{dropped} drop lines:\n{log}");
    lab.assert_agree();
}

/// Issue 28 §3. An allowed uid holds at most --max-connections-per-uid connections (its
/// further ones are closed at accept), and what its connections may make dipamd buffer before
/// a request is bounded: 300 connections each sending a 256 KiB header block that never ends
/// leave RSS within a few tens of MiB, and it comes back once the attacker leaves.
#[test]
fn an_allowed_uid_is_capped_and_its_header_flood_is_bounded() {
    require_root!();
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &[
            "--socket-group",
            NOBODY,
            "--allow-uid",
            NOBODY,
            "--max-connections-per-uid",
            "8",
        ],
    );
    restart_as(&mut lab, &shipped_nofile(), true);
    let pid = lab.dipamd.pid().unwrap();
    let sock = lab.dipamd.socket().display().to_string();
    let fds_before = flood::open_fds(pid);
    let attacker = Flood::start(&["unix", "500", &sock]);
    let fds_during = flood::open_fds(pid);
    let failed = lab.add_and_del(10);
    eprintln!(
        "allowed-uid flood: {} connections; dipamd fds {fds_before} -> {fds_during}; root pods \
         failed: {}/10",
        attacker.held,
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());
    assert!(
        fds_during <= fds_before + 8 + 4,
        "more than the per-uid cap is held: {fds_before} -> {fds_during}"
    );
    drop(attacker);

    // The header flood, with the per-uid cap opened up so that every connection gets in.
    lab.dipamd.kill9();
    lab.dipamd.set_flags(&[
        "--socket-group",
        NOBODY,
        "--allow-uid",
        NOBODY,
        "--max-connections-per-uid",
        "1000",
    ]);
    lab.dipamd.start_again();
    let pid = lab.dipamd.pid().unwrap();
    assert!(lab.add_and_del(3).is_empty());
    let rss_before = flood::rss_kib(pid);
    let attacker = Flood::start(&["headers", "300", &sock, &(256 << 10).to_string()]);
    let held = attacker.held;
    std::thread::sleep(Duration::from_secs(1));
    let rss_during = flood::rss_kib(pid);
    let failed = lab.add_and_del(10);
    drop(attacker);
    // The heap trimmer runs after 10 s without activity (trim.rs).
    std::thread::sleep(Duration::from_secs(14));
    let rss_after = flood::rss_kib(pid);
    eprintln!(
        "header flood: {held} connections sent their blocks; RSS {rss_before} KiB -> \
         {rss_during} KiB during -> {rss_after} KiB after; root pods failed: {}/10",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}\n{}", lab.dipamd.log());
    assert!(
        rss_during < rss_before + 64 * 1024,
        "RSS grew {rss_before} -> {rss_during} KiB"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "RSS did not come back: {rss_before} -> {rss_after} KiB"
    );
    lab.assert_agree();
}
