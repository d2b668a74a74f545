//! Every override deploy/README.md and the unit's own comments document for the shipped
//! systemd unit (deploy/systemd/dipamd.service) starts dipamd, and takes effect: a flag in
//! /etc/default/dipamd's DIPAMD_OPTS, a DIPAM_* variable there, and a flag given twice (a
//! drop-in's or an older unit's ExecStart= plus the operator's DIPAMD_OPTS). A refused
//! command line is, under the unit's Restart=always, a restart every 2 s and no IPAM on the
//! node.
//!
//! Not through systemd itself (a test machine's or container's PID 1 need not be systemd, and
//! a system unit would use the host's /run/dipam and /var/lib/dipam): dipamd is started with
//! the argv and environment systemd would give it, computed from the unit's Environment=,
//! EnvironmentFile= and ExecStart= lines (dipam_lifecycle::unit_file, which refuses syntax it
//! does not emulate), under the unit's capability bounding set and NoNewPrivileges
//! (setpriv), with temporary paths instead of /run/dipam and /var/lib/dipam.

use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    bins, require_root, shapes::shipped_unit_setpriv, unit_file, unit_file::Unit,
};
use serde_json::Value;
use tempfile::TempDir;

/// The ExecStart= dipam's unit shipped before its defaults moved to Environment=: a copy
/// of it left in /etc/systemd/system, or a drop-in written after it, still passes these.
const OLD_EXEC_START: &str = "ExecStart=/usr/local/bin/dipamd \\
    --socket /run/dipam/dipam.sock \\
    --state-dir /var/lib/dipam \\
    --spool-dir /var/lib/dipam/spool \\
    --cni-path /opt/cni/bin:/usr/lib/cni \\
    --log-format text \\
    $DIPAMD_OPTS
EnvironmentFile=-/etc/default/dipamd
";

struct Node {
    dir: TempDir,
}

impl Node {
    fn new() -> Self {
        let dir = dipam_lifecycle::temp_dir("dipam-unit-");
        Self { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn p(&self, p: &str) -> String {
        self.path(p).display().to_string()
    }
}

/// dipamd started as systemd would start `unit` with `file` as /etc/default/dipamd.
struct Started {
    child: Child,
    log: PathBuf,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
}

impl Started {
    fn new(node: &Node, unit: &Unit, file: &str) -> Self {
        let env = unit.environment_with(Some(file));
        let argv = unit.argv(&env);
        assert_eq!(argv[0], "/usr/local/bin/dipamd", "{argv:?}");
        let log = node.path("dipamd.log");
        let out = File::create(&log).expect("create the log file");
        let setpriv = shipped_unit_setpriv();
        let child = Command::new(&setpriv[0])
            .args(&setpriv[1..])
            .arg(bins::bin("dipamd"))
            .args(&argv[1..])
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file handle"))
            .stderr(out)
            .spawn()
            .expect("start dipamd");
        Self {
            child,
            log,
            argv,
            env,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn context(&self) -> String {
        format!(
            "argv {:?}\nenvironment {:?}\n----- dipamd log -----\n{}",
            self.argv,
            self.env,
            self.log()
        )
    }

    /// `dipamctl status --json --ready --socket SOCKET` once dipamd serves; a dipamd that
    /// exits instead (the refused command line systemd would restart forever) fails the test.
    fn status(&mut self, socket: &Path) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "dipamd exited ({st}) instead of serving:\n{}",
                    self.context()
                );
            }
            let out = Command::new(bins::bin("dipamctl"))
                .args(["status", "--json", "--ready", "--socket"])
                .arg(socket)
                .env_clear()
                .output()
                .expect("run dipamctl");
            if out.status.success() {
                return serde_json::from_slice(&out.stdout).expect("dipamctl status --json");
            }
            assert!(
                Instant::now() < deadline,
                "dipamd does not serve on {} within 60 s: {}\n{}",
                socket.display(),
                String::from_utf8_lossy(&out.stderr),
                self.context()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every log line dipamd wrote is JSON (true) or none is (false).
    fn logs_json(&self) -> bool {
        let log = self.log();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            !lines.is_empty(),
            "dipamd logged nothing:\n{}",
            self.context()
        );
        let json = lines
            .iter()
            .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v.is_object()))
            .count();
        assert!(
            json == 0 || json == lines.len(),
            "mixed log formats:\n{}",
            self.context()
        );
        json == lines.len()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("{}", self.context());
        }
    }
}

/// The shipped unit's defaults, with this test's paths in place of /run and /var/lib:
/// the environment file every case starts from.
fn paths_file(node: &Node) -> String {
    format!(
        "# /etc/default/dipamd\nDIPAM_SOCKET={}\nDIPAM_STATE_DIR=\"{}\"\nDIPAM_CNI_PATH={}\n",
        node.p("run/dipam.sock"),
        node.p("lib"),
        node.p("cni-bin"),
    )
}

fn status_paths(s: &Value) -> (PathBuf, PathBuf, PathBuf) {
    let p = |v: &Value| PathBuf::from(v.as_str().unwrap_or_else(|| panic!("{s}")));
    (p(&s["socket"]), p(&s["stateDir"]), p(&s["spool"]["dir"]))
}

#[test]
fn the_unit_without_options_logs_text_at_the_defaults_it_names() {
    require_root!();
    let node = Node::new();
    let unit = unit_file::shipped();
    // The unit names its defaults (the runtime's conflist must use the same socket).
    assert_eq!(
        unit.setting("--socket", "DIPAM_SOCKET").as_deref(),
        Some("/run/dipam/dipam.sock")
    );
    assert_eq!(
        unit.setting("--state-dir", "DIPAM_STATE_DIR").as_deref(),
        Some("/var/lib/dipam")
    );
    let mut d = Started::new(&node, &unit, &paths_file(&node));
    let s = d.status(&node.path("run/dipam.sock"));
    assert_eq!(
        status_paths(&s),
        (
            node.path("run/dipam.sock"),
            node.path("lib"),
            node.path("lib/spool")
        )
    );
    assert!(!d.logs_json(), "the unit's default is --log-format text");
}

#[test]
fn log_format_json_in_dipamd_opts() {
    require_root!();
    let node = Node::new();
    let file = paths_file(&node) + "DIPAMD_OPTS=\"--log-format json\"\n";
    let mut d = Started::new(&node, &unit_file::shipped(), &file);
    d.status(&node.path("run/dipam.sock"));
    assert!(d.logs_json(), "--log-format json did not take effect");
}

#[test]
fn state_dir_and_socket_in_dipamd_opts_beat_the_variables() {
    require_root!();
    let node = Node::new();
    let file = paths_file(&node)
        + &format!(
            "DIPAMD_OPTS=\"--state-dir {}  --socket {}\"\n",
            node.p("moved-lib"),
            node.p("moved.sock")
        );
    let mut d = Started::new(&node, &unit_file::shipped(), &file);
    let s = d.status(&node.path("moved.sock"));
    assert_eq!(
        status_paths(&s),
        (
            node.path("moved.sock"),
            node.path("moved-lib"),
            node.path("moved-lib/spool")
        )
    );
    assert!(node.path("moved-lib/spool").is_dir());
    assert!(
        !node.path("lib").exists() && !node.path("run/dipam.sock").exists(),
        "dipamd also used the environment file's paths"
    );
}

#[test]
fn dipam_variables_in_the_environment_file() {
    require_root!();
    let node = Node::new();
    // No DIPAMD_OPTS at all: the variables replace the unit's Environment= defaults.
    let file = format!(
        "DIPAM_SOCKET={}\nDIPAM_STATE_DIR={}\nDIPAM_SPOOL_DIR={}\nDIPAM_LOG_FORMAT=json\n",
        node.p("v.sock"),
        node.p("v-lib"),
        node.p("v-spool"),
    );
    let mut d = Started::new(&node, &unit_file::shipped(), &file);
    let s = d.status(&node.path("v.sock"));
    assert_eq!(
        status_paths(&s),
        (
            node.path("v.sock"),
            node.path("v-lib"),
            node.path("v-spool")
        )
    );
    assert!(d.logs_json(), "DIPAM_LOG_FORMAT=json did not take effect");
}

#[test]
fn a_flag_repeated_in_dipamd_opts_takes_the_last_value() {
    require_root!();
    let node = Node::new();
    let file = paths_file(&node)
        + &format!(
            "DIPAMD_OPTS=\"--log-format text --socket {} --log-format json --socket {}\"\n",
            node.p("first.sock"),
            node.p("last.sock")
        );
    let mut d = Started::new(&node, &unit_file::shipped(), &file);
    let s = d.status(&node.path("last.sock"));
    assert_eq!(status_paths(&s).0, node.path("last.sock"));
    assert!(!node.path("first.sock").exists());
    assert!(d.logs_json());
}

#[test]
fn an_older_unit_with_flags_on_exec_start_still_takes_the_operators_options() {
    require_root!();
    let node = Node::new();
    let old = unit_file::parse(OLD_EXEC_START);
    let file = format!(
        "DIPAMD_OPTS=\"--socket {} --state-dir {} --spool-dir {} --cni-path {} --log-format json\"\n",
        node.p("old.sock"),
        node.p("old-lib"),
        node.p("old-lib/spool"),
        node.p("cni-bin"),
    );
    let mut d = Started::new(&node, &old, &file);
    assert!(
        d.argv.iter().filter(|a| *a == "--socket").count() == 2,
        "the case repeats the flags: {:?}",
        d.argv
    );
    let s = d.status(&node.path("old.sock"));
    assert_eq!(
        status_paths(&s),
        (
            node.path("old.sock"),
            node.path("old-lib"),
            node.path("old-lib/spool")
        )
    );
    assert!(d.logs_json());
}
