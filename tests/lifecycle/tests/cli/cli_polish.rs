//! dipamctl and dipamd as a shell user meets them: `--version` names the git commit the
//! binaries were built from (shim-server/build.rs); output cut off by its reader
//! (`dipamctl attachments --json | head -1`) ends quietly, with status 0 and nothing on
//! stderr; every failure under `--json` is one JSON document on stderr with the exit status
//! it has without; usage errors exit 2 (docs/configuration.md, "Exit status and errors");
//! `--socket` and `--json` are taken only by the commands that use them, before or after the
//! command's name; `agent watch` stamps each list; and `recover` and `gc` show progress on a
//! real terminal (a pty, through util-linux `script`), and nothing under `--json` or a pipe.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::{BufRead, BufReader},
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::fs::PermissionsExt,
    },
    path::Path,
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use dipam_lifecycle::{AgentLab, Dipamd, Fixture, bins, named, require_root};
use serde_json::{Value, json};

/// The commit build.rs finds: `git rev-parse` in the checkout the binaries were built from,
/// `DIPAM_GIT_COMMIT` when a build sets it, "unknown" outside git.
fn expected_commit() -> String {
    if let Some(c) = std::env::var_os("DIPAM_GIT_COMMIT").filter(|c| !c.is_empty()) {
        return c.to_string_lossy().into_owned();
    }
    Command::new("git")
        .arg("-C")
        .arg(bins::workspace())
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

#[test]
fn version_names_the_git_commit() {
    let commit = expected_commit();
    for name in ["dipamd", "dipamctl"] {
        let out = Command::new(bins::bin(name))
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {} ({commit})\n", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn a_closed_pipe_is_quiet() {
    require_root!();
    let dipamd = Dipamd::start();
    // A pipe whose reader is already gone: every write to it fails with EPIPE, as when
    // `head -1` has exited.
    let mut fds = [0; 2];
    // SAFETY: pipe writes two new descriptors into the array we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created by pipe and are owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    for args in [
        &["attachments", "--json"][..],
        &["attachments"][..],
        &["status", "--json"][..],
    ] {
        let out = Command::new(bins::bin("dipamctl"))
            .arg("--socket")
            .arg(dipamd.socket())
            .args(args)
            .stdout(Stdio::from(write.try_clone().unwrap()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
    // The same command with a reader prints its answer: the quiet exit is the pipe's doing.
    let out = dipamd.ctl(&["attachments", "--json"]);
    assert!(out.status.success() && !out.stdout.is_empty(), "{out:?}");
}

fn dipamctl(args: &[&str]) -> Output {
    Command::new(bins::bin("dipamctl"))
        .args(args)
        .env_remove("DIPAM_SOCKET")
        .output()
        .unwrap()
}

/// The one JSON document a failure under --json leaves on stderr: exactly one line.
#[track_caller]
fn json_error(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
    let v: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(v["error"]["details"].is_object(), "{v}");
    v["error"].clone()
}

/// Runs `args` (dipamctl's, program first) on a pseudo-terminal, as a person at a terminal
/// would: util-linux `script` gives the command a pty for stdin, stdout and stderr, and
/// prints everything the command wrote to it. Returns the exit status and that transcript.
fn on_terminal(args: &[&str], term: &str) -> (Option<i32>, String) {
    let quote = |a: &str| format!("'{}'", a.replace('\'', "'\\''"));
    let mut line = quote(&bins::bin("dipamctl").display().to_string());
    for a in args {
        line.push(' ');
        line.push_str(&quote(a));
    }
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command", &line, "/dev/null"])
        .env("TERM", term)
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What a failure looks like, with and without --json: (what, argv, exit status, code).
#[test]
fn a_failure_under_json_is_one_json_document_on_stderr_with_the_same_status() {
    require_root!();
    let dipamd = Dipamd::start();
    let sock = dipamd.socket().display().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let bad_valid = tmp.path().join("valid.json");
    std::fs::write(&bad_valid, r#"[{"containerId":"abc","ifname":"eth0"}]"#).unwrap();
    let bad_valid = bad_valid.display().to_string();
    let state = tmp.path().join("state").display().to_string();
    let missing = tmp.path().join("missing.conflist").display().to_string();
    let cases: Vec<(&str, Vec<&str>, i32, &str)> = vec![
        (
            "dipamd unreachable",
            vec!["status", "--socket", "/nonexistent/dipam.sock"],
            1,
            "unreachable",
        ),
        (
            "dipamd refuses (a gRPC status)",
            vec!["agent", "allocate", "dns", "--socket", &sock],
            1,
            "rpc",
        ),
        (
            "a usage error clap finds",
            vec!["status", "--socket", &sock, "--frob"],
            2,
            "usage",
        ),
        (
            "a flag the command does not take",
            vec!["completions", "bash", "--socket", &sock],
            2,
            "usage",
        ),
        (
            "an unusable input file",
            vec!["gc", "--socket", &sock, "--valid", &bad_valid, "--dry-run"],
            1,
            "input",
        ),
        (
            "a local command failing",
            vec!["recover", "--state-dir", &state, "--conflist", &missing],
            1,
            "failed",
        ),
    ];
    for (what, args, status, code) in &cases {
        let plain = dipamctl(args);
        assert_eq!(plain.status.code(), Some(*status), "{what}: {plain:?}");
        let stderr = String::from_utf8_lossy(&plain.stderr);
        if *status == 2 {
            assert!(
                stderr.starts_with("error: ") && stderr.contains("Usage: dipamctl"),
                "{what}: {stderr}"
            );
        } else {
            assert!(
                stderr.starts_with("dipamctl: ") && stderr.lines().count() == 1,
                "{what}: {stderr}"
            );
        }
        assert!(plain.stdout.is_empty(), "{what}: {plain:?}");

        let mut with_json = args.clone();
        with_json.push("--json");
        let out = dipamctl(&with_json);
        assert_eq!(out.status.code(), Some(*status), "{what} --json: {out:?}");
        assert!(
            out.stdout.is_empty(),
            "{what}: stdout is the answer's: {out:?}"
        );
        let e = json_error(&out);
        assert_eq!(e["code"], *code, "{what}: {e}");
        if *status == 1 {
            // The same words as without --json.
            assert_eq!(
                format!("dipamctl: {}\n", e["message"].as_str().unwrap()),
                stderr,
                "{what}"
            );
        }
        match *code {
            "unreachable" => assert_eq!(e["details"]["socket"], "/nonexistent/dipam.sock"),
            "rpc" => assert!(e["details"]["grpcCode"].as_str().is_some(), "{e}"),
            "usage" => assert!(
                e["details"]["usage"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("dipamctl ")),
                "{e}"
            ),
            _ => {}
        }
    }
    // --json before the command's name, the form scripts used when it was global.
    let out = dipamctl(&["--json", "status", "--socket", "/nonexistent/dipam.sock"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_error(&out)["code"], "unreachable");

    // A doctor check fails (the socket readable by all): the report is the one document on
    // stdout, the failure the one on stderr.
    std::fs::set_permissions(dipamd.socket(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let plain = dipamd.ctl(&["doctor"]);
    assert_eq!(plain.status.code(), Some(1), "{plain:?}");
    assert!(String::from_utf8_lossy(&plain.stdout).contains("FAIL socket is private"));
    let out = dipamd.ctl(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let checks: Value = serde_json::from_slice(&out.stdout).unwrap();
    let socket_check = named(&checks, "socket is private");
    assert_eq!(socket_check["ok"], false, "{checks}");
    let e = json_error(&out);
    assert_eq!(e["code"], "failed");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("doctor check(s) failed"),
        "{e}"
    );
}

#[test]
fn usage_errors_exit_2_and_the_flags_go_where_they_are_used() {
    require_root!();
    let dipamd = Dipamd::start();
    let sock = dipamd.socket().display().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let (bin_dir, conf_dir) = (tmp.path().join("bin"), tmp.path().join("conf"));
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    let conflist = tmp.path().join("c.conflist");
    std::fs::write(
        &conflist,
        Fixture::load("dipam-host-local-1.1.0.conflist")
            .list
            .to_string(),
    )
    .unwrap();
    let (bin_dir_s, conf_dir_s, conflist_s) = (
        bin_dir.display().to_string(),
        conf_dir.display().to_string(),
        conflist.display().to_string(),
    );
    let install = |extra: &[&str]| {
        let mut v = vec![
            "install",
            "--cni-bin-dir",
            &bin_dir_s,
            "--conf-dir",
            &conf_dir_s,
        ];
        v.extend_from_slice(extra);
        v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>()
    };
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("an unknown command", owned(&["frobnicate"])),
        (
            "an unknown flag",
            owned(&["status", "--socket", &sock, "--frob"]),
        ),
        (
            "a value clap does not accept",
            owned(&["completions", "csh"]),
        ),
        ("a missing argument", owned(&["explain", "--socket", &sock])),
        (
            "--socket on a command that reaches no dipamd",
            owned(&["completions", "bash", "--socket", &sock]),
        ),
        (
            "--socket before such a command",
            owned(&["--socket", &sock, "completions", "bash"]),
        ),
        (
            "flags that exclude each other",
            owned(&["gc", "--socket", &sock, "--from-runtime", "--use-ledger"]),
        ),
        (
            "a label that is not KEY=VALUE",
            owned(&[
                "agent", "claim", "x", "--label", "novalue", "--socket", &sock,
            ]),
        ),
        ("--in-place without --wrap", install(&["--in-place"])),
        (
            "--ranges-from-node with an API server it may not use",
            install(&[
                "--conflist",
                &conflist_s,
                "--ranges-from-node",
                "n1",
                "--kube-api",
                "http://10.0.0.1:6443",
            ]),
        ),
    ];
    for (what, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = dipamctl(&args);
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
        assert!(out.stdout.is_empty(), "{what}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // clap's own message, or dipamctl's for what only shows once the line is parsed.
        assert!(
            stderr.starts_with("error: ") || stderr.starts_with("dipamctl: "),
            "{what}: {stderr}"
        );
    }
    // Nothing was installed by the refused installs.
    assert_eq!(std::fs::read_dir(&bin_dir).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&conf_dir).unwrap().count(), 0);

    // What was valid when the flags were global still works; the documented form puts them
    // after the command; DIPAM_SOCKET stands for --socket, and --socket wins over it.
    let status = |out: Output| {
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["socket"], json!(sock), "{v}");
    };
    status(dipamctl(&["--socket", &sock, "--json", "status"]));
    status(dipamctl(&[&format!("--socket={sock}"), "status", "--json"]));
    status(dipamctl(&["status", "--json", "--socket", &sock]));
    status(
        Command::new(bins::bin("dipamctl"))
            .args(["status", "--json"])
            .env("DIPAM_SOCKET", &sock)
            .output()
            .unwrap(),
    );
    status(
        Command::new(bins::bin("dipamctl"))
            .args(["status", "--json", "--socket", &sock])
            .env("DIPAM_SOCKET", "/nonexistent/dipam.sock")
            .output()
            .unwrap(),
    );
    let listed = |out: Output| {
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["addresses"].is_array(), "{v}");
    };
    listed(dipamctl(&["agent", "--socket", &sock, "--json", "list"]));
    listed(dipamctl(&["--json", "agent", "list", "--socket", &sock]));

    // A command's help lists the flags it takes; the top level's lists neither.
    let help = |args: &[&str]| {
        let out = dipamctl(args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let h = help(&["status", "--help"]);
    assert!(h.contains("--socket") && h.contains("--json"), "{h}");
    // recover reads the record of dipamd's paths beside the socket.
    let h = help(&["recover", "--help"]);
    assert!(h.contains("--socket") && h.contains("--json"), "{h}");
    let h = help(&["completions", "--help"]);
    assert!(!h.contains("--socket") && !h.contains("--json"), "{h}");
    let h = help(&["--help"]);
    assert!(
        !h.contains("--socket <") && h.contains("Exit status"),
        "{h}"
    );
    // The completion script still offers both where they apply.
    let script = help(&["completions", "bash"]);
    assert!(script.contains("--socket") && script.contains("--json"));
}

/// Reads `child`'s stdout on a thread, line by line, so that the test can wait for a line
/// without blocking forever on a watch that printed nothing.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// An RFC 3339 UTC time with milliseconds (`2026-11-24T07:15:00.007Z`) as ms since the epoch.
fn parse_rfc3339_ms(s: &str) -> u64 {
    assert_eq!(s.len(), 24, "{s}");
    assert!(
        s.ends_with('Z') && &s[10..11] == "T" && &s[19..20] == ".",
        "{s}"
    );
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, mo, d) = (n(0..4), n(5..7), n(8..10));
    // days_from_civil (H. Hinnant), as dipamd's clock.rs inverts it.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    u64::try_from(secs * 1000 + n(20..23)).unwrap()
}

#[test]
fn agent_watch_stamps_each_list_with_when_it_came() {
    require_root!();
    let lab = AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let sock = lab.dipamd.socket();
    let spawn = |json: bool| {
        let mut c = Command::new(bins::bin("dipamctl"));
        c.args(["agent", "watch", "--socket"]).arg(&sock);
        if json {
            c.arg("--json");
        }
        c.stdout(Stdio::piped()).spawn().unwrap()
    };
    let wait = Duration::from_secs(30);
    let before = now_ms();
    let mut table = spawn(false);
    let mut json = spawn(true);
    let (table_lines, json_lines) = (lines_of(&mut table), lines_of(&mut json));

    // The table: a line with the time and generation, then the list.
    let head = table_lines.recv_timeout(wait).unwrap();
    let (at, generation) = head.split_once("  generation ").unwrap();
    let at = parse_rfc3339_ms(at);
    assert!(generation.parse::<u64>().is_ok(), "{head}");
    assert!(
        table_lines.recv_timeout(wait).unwrap().starts_with("NAME"),
        "{head}"
    );
    // JSON: `at` and `atMs` on each line, the same instant.
    let first: Value = serde_json::from_str(&json_lines.recv_timeout(wait).unwrap()).unwrap();
    let first_ms = first["atMs"].as_u64().unwrap();
    assert_eq!(parse_rfc3339_ms(first["at"].as_str().unwrap()), first_ms);
    let after = now_ms();
    for t in [at, first_ms] {
        assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
    }

    // A change: the next list has its own, later time.
    lab.agent(&["allocate", "health"]);
    let next: Value = loop {
        let v: Value = serde_json::from_str(&json_lines.recv_timeout(wait).unwrap()).unwrap();
        if v.to_string().contains("health") {
            break v;
        }
    };
    assert!(next["atMs"].as_u64().unwrap() >= first_ms, "{next}");
    assert!(
        next["generation"].as_u64() > first["generation"].as_u64(),
        "{next}"
    );
    for mut c in [table, json] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// host-local's store for `n` pods, written as host-local writes it (one file per address,
/// `<containerID>\r\n<ifname>`), and a conflist that points at it.
fn store_with_pods(dir: &Path, n: usize) -> std::path::PathBuf {
    let fx = Fixture::load("dipam-host-local-1.1.0.conflist")
        .unique_name()
        .with_subnet("10.251.0.0/16")
        .with_delegate_state(&dir.join("data"));
    let net = dir.join("data").join(fx.name());
    std::fs::create_dir_all(&net).unwrap();
    for i in 0..n {
        std::fs::write(
            net.join(format!("10.251.{}.{}", i / 250, i % 250 + 2)),
            format!("{:064x}\r\neth0", i + 1),
        )
        .unwrap();
    }
    let conflist = dir.join("net.conflist");
    std::fs::write(&conflist, fx.list.to_string()).unwrap();
    conflist
}

#[test]
fn recover_shows_its_count_on_a_terminal_and_nothing_otherwise() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let conflist = store_with_pods(tmp.path(), 40);
    let conflist = conflist.to_str().unwrap();
    let cni_path = bins::cni_path();
    let recover = |state: &str, json: bool| {
        let state = tmp.path().join(state).display().to_string();
        let mut v = vec![
            "recover".to_owned(),
            "--state-dir".into(),
            state,
            "--conflist".into(),
            conflist.to_owned(),
            "--cni-path".into(),
            cni_path.clone(),
        ];
        if json {
            v.push("--json".into());
        }
        v
    };

    // A terminal: the count is drawn, then erased (carriage return, erase line) before the
    // result, which stands alone on its line.
    let args = recover("state-tty", false);
    let (status, transcript) = on_terminal(&strs(&args), "xterm");
    assert_eq!(status, Some(0), "{transcript}");
    assert!(transcript.contains("reservations 0/40"), "{transcript:?}");
    let (progress, result) = transcript
        .rsplit_once("\r\x1b[2K")
        .unwrap_or_else(|| panic!("not erased: {transcript:?}"));
    assert!(progress.contains("/40"), "{transcript:?}");
    assert_eq!(
        result.trim_end(),
        "recovered 40 pod and 0 agent attachment(s)"
    );

    // Under --json, on the same terminal: the document alone.
    let args = recover("state-json", true);
    let (status, transcript) = on_terminal(&strs(&args), "xterm");
    assert_eq!(status, Some(0), "{transcript}");
    assert!(!transcript.contains("reservations"), "{transcript:?}");
    let v: Value = serde_json::from_str(&transcript.replace("\r\n", "\n")).unwrap();
    assert_eq!(v["pods"], 40);

    // A terminal that cannot erase a line: nothing drawn.
    let args = recover("state-dumb", false);
    let (status, transcript) = on_terminal(&strs(&args), "dumb");
    assert_eq!(status, Some(0), "{transcript}");
    assert!(!transcript.contains("reservations"), "{transcript:?}");

    // A pipe: stderr stays empty.
    let args = recover("state-pipe", false);
    let out = dipamctl(&strs(&args));
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "recovered 40 pod and 0 agent attachment(s)\n"
    );
}

#[test]
fn gc_shows_a_spinner_on_a_terminal_and_nothing_otherwise() {
    require_root!();
    let lab = AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let sock = lab.dipamd.socket().display().to_string();
    let gc = ["gc", "--socket", &sock, "--use-ledger", "--dry-run"];

    let (status, transcript) = on_terminal(&gc, "xterm");
    assert_eq!(status, Some(0), "{transcript}");
    let (progress, result) = transcript
        .rsplit_once("\r\x1b[2K")
        .unwrap_or_else(|| panic!("no spinner erased: {transcript:?}"));
    assert!(progress.contains("planning in dipamd"), "{transcript:?}");
    assert!(result.starts_with("KIND"), "{transcript:?}");
    assert!(result.contains("would be freed"), "{transcript:?}");

    // --from-runtime too, even when it fails (dipamd runs without --cri-endpoint): the
    // spinner is erased before the error.
    let (status, transcript) = on_terminal(
        &["gc", "--socket", &sock, "--from-runtime", "--dry-run"],
        "xterm",
    );
    assert_eq!(status, Some(1), "{transcript}");
    let (progress, result) = transcript
        .rsplit_once("\r\x1b[2K")
        .unwrap_or_else(|| panic!("no spinner erased: {transcript:?}"));
    assert!(progress.contains("gc --from-runtime"), "{transcript:?}");
    assert!(result.contains("--cri-endpoint"), "{transcript:?}");

    let mut json = gc.to_vec();
    json.push("--json");
    let (status, transcript) = on_terminal(&json, "xterm");
    assert_eq!(status, Some(0), "{transcript}");
    assert!(!transcript.contains("dipamd ["), "{transcript:?}");
    let v: Value = serde_json::from_str(&transcript.replace("\r\n", "\n")).unwrap();
    assert_eq!(v["dryRun"], true);

    let out = dipamctl(&gc);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
}
