//! A real dipamd process on a temp socket and temp state directory. SIGKILLed on drop; its
//! log is printed when the test that owns it fails.

use std::{
    io::Write,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

use serde_json::Value;
use tempfile::TempDir;

use crate::bins;

pub struct Dipamd {
    pub dir: TempDir,
    child: Option<Child>,
    extra: Vec<String>,
    /// Run dipamd inside this named netns (`ip netns exec`) instead of the test's own.
    netns: Option<String>,
    /// Run dipamd through this command (e.g. `setpriv --bounding-set ...`), which execs it.
    wrapper: Vec<String>,
    /// A command that sets up dipamd's environment and execs the rest (the wrapper, then
    /// dipamd): a private mount namespace for a delegate with fixed paths ([`Self::enter`]).
    enter: Vec<String>,
    /// Run this dipamd binary instead of the harness's (dipam-bench's `--alt-dipamd`).
    binary: Option<PathBuf>,
    /// Processes started so far (each marked in the log).
    starts: u32,
    /// dipamd's `--cni-path` (where it finds the delegates it runs on its own: the agent's
    /// and the pool's); the harness's binaries and Debian's plugins when `None`.
    cni_path: Option<String>,
    /// The delegate store a lab's pods use: allowed to non-root callers
    /// (`--non-root-data-dir`), as a node allows its own.
    store: Option<PathBuf>,
    /// Flags of the deployment dipamd is started like (shapes::Deployment), after the test's
    /// own; kept across [`Self::set_flags`].
    shape: Vec<String>,
}

impl Dipamd {
    /// Starts dipamd and waits until it answers on its socket.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let mut d = Self::unstarted(extra);
        d.spawn();
        d
    }

    /// A dipamd whose directory exists (to write a conflist into) but which is not running
    /// yet: call `start_again`.
    pub fn unstarted(extra: &[&str]) -> Self {
        let dir = crate::temp_dir("dipamd-");
        Self {
            dir,
            child: None,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            netns: None,
            wrapper: Vec::new(),
            enter: Vec::new(),
            binary: None,
            starts: 0,
            cni_path: None,
            store: None,
            shape: Vec::new(),
        }
    }

    /// Runs `path` instead of the harness's dipamd from the next start on: another build,
    /// compared with this one in the same run.
    pub fn use_binary(&mut self, path: &Path) {
        self.binary = Some(path.to_owned());
    }

    /// dipamd's `--cni-path` from the next start on (e.g. [`crate::peers::cni_path`] for
    /// today's plugins).
    pub fn set_cni_path(&mut self, path: &str) {
        self.cni_path = Some(path.to_owned());
    }

    /// dipamd's `--non-root-data-dir` from the next start on (kept across [`Self::set_flags`]).
    pub fn set_store(&mut self, dir: &Path) {
        self.store = Some(dir.to_owned());
    }

    /// Starts the next dipamd through `argv` (a program that execs the rest of its command
    /// line, such as `setpriv` with a capability set): dipamd then runs with exactly the
    /// restrictions a deployment gives it.
    pub fn run_under(&mut self, argv: &[String]) {
        assert!(
            self.netns.is_none(),
            "run_under and run_in_netns do not combine"
        );
        self.wrapper = argv.to_vec();
    }

    /// Starts the next dipamd (and its wrapper, if any) through `argv`, a program that sets up
    /// an environment and execs the rest of its command line: e.g. the private mount namespace
    /// the real azure-vnet-ipam needs ([`crate::azure::AzureNode::wrapper`]). Independent of
    /// [`Self::run_under`], which then runs inside it.
    pub fn enter(&mut self, argv: &[String]) {
        assert!(
            self.netns.is_none(),
            "enter and run_in_netns do not combine"
        );
        self.enter = argv.to_vec();
    }

    /// Replaces the extra flags used by the next start.
    pub fn set_flags(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
    }

    /// The test's own flags for the next start.
    pub fn flags(&self) -> &[String] {
        &self.extra
    }

    /// Flags of the deployment the next start is shaped like, after the test's own.
    pub fn set_shape_flags(&mut self, flags: Vec<String>) {
        self.shape = flags;
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("dipamd.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Overwrites 4 KiB in the middle of sled's log (`<state-dir>/db`) with 0xff: damage a
    /// stopped dipamd must refuse at its next start (docs/cfp.md §7.5).
    pub fn garble_ledger(&self) {
        let db = self.state_dir().join("db");
        let mut bytes = std::fs::read(&db).expect("read the ledger");
        let (mid, len) = (bytes.len() / 2, bytes.len());
        for b in &mut bytes[mid.saturating_sub(2048)..(mid + 2048).min(len)] {
            *b = 0xff;
        }
        std::fs::write(&db, bytes).expect("write the ledger");
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("dipamd.log")
    }

    /// Starts the next dipamd inside the named netns (its socket stays a path the test's
    /// processes reach): a daemon that does not share the plugin's netns.
    pub fn run_in_netns(&mut self, name: &str) {
        self.netns = Some(name.to_owned());
    }

    /// The dipamd command line this guard uses, for tests that run a second instance.
    pub fn command(&self) -> Command {
        let bin = self.binary.clone().unwrap_or_else(|| bins::bin("dipamd"));
        let mut cmd = match &self.netns {
            None => {
                let argv: Vec<&std::ffi::OsStr> = self
                    .enter
                    .iter()
                    .chain(&self.wrapper)
                    .map(std::ffi::OsStr::new)
                    .chain(std::iter::once(bin.as_os_str()))
                    .collect();
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
        };
        cmd.arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--cni-path")
            .arg(self.cni_path.clone().unwrap_or_else(bins::cni_path))
            .args(
                self.store
                    .iter()
                    .flat_map(|d| [std::ffi::OsStr::new("--non-root-data-dir"), d.as_os_str()]),
            )
            .args(["--log-level", "debug"])
            // The evidence pass (on by default) frees a pod whose netns is gone: most tests'
            // pods name a netns that never existed (/var/run/netns/none) and are not about
            // it. Off unless the test turns it on; a given binary (an older dipamd) may not
            // know the flag.
            .args(if self.binary.is_none() {
                &["--dead-after", "0"][..]
            } else {
                &[]
            })
            .args(&self.extra)
            .args(&self.shape);
        cmd
    }

    fn spawn(&mut self) {
        self.spawn_unready();
        self.wait_ready();
    }

    fn spawn_unready(&mut self) {
        let mut log = crate::cmd::append_log(&self.log_path());
        // Every start is marked in the one log file, so that a crash test's failure shows
        // which dipamd wrote what, before and after each restart (replay.rs).
        self.starts += 1;
        let _ = writeln!(
            log,
            "===== dipamd start #{} (harness wall clock {} ms) =====",
            self.starts,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default()
        );
        self.child = Some(crate::cmd::spawn_daemon(&mut self.command(), log));
    }

    fn wait_ready(&mut self) {
        // The longest start a test allows (stores.rs: 30 s, a DaemonSet-shaped dipamd whose
        // agent's start-up CHECKs each wait --delegate-timeout on a hung store).
        let started = Instant::now();
        let deadline = started + Duration::from_secs(30);
        while Instant::now() < deadline {
            if UnixStream::connect(self.socket()).is_ok() {
                eprintln!(
                    "dipamd start #{} serving after {} ms",
                    self.starts,
                    started.elapsed().as_millis()
                );
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("dipamd exited during start ({status}):\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("dipamd did not start serving within 30 s:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as the OOM killer or a node crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            // A delegate dipamd was forking at that moment holds a copy of the listening
            // socket until its exec closes it: until then a connect still succeeds, and the
            // next start's readiness check would take the old socket for the new dipamd's
            // (seen with azure-vnet-ipam, whose agent checks fork often, and with the warm
            // pool's refills at load 150, where 2 s were not enough: chaos seed
            // 1795918605112563098). Wait it out.
            let deadline = Instant::now() + Duration::from_secs(10);
            while UnixStream::connect(self.socket()).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.terminate_within(Duration::from_secs(10))
    }

    /// SIGTERM, and panic (after a SIGKILL, as systemd's stop timeout would) unless dipamd
    /// exits within `limit`; returns the exit status.
    pub fn terminate_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("dipamd is running");
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "dipamd did not exit within {limit:?} of SIGTERM:\n{}",
                    tail(&self.log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An upgrade as a package manager with `systemctl restart`, or a DaemonSet's rolling
    /// update, performs it: a new dipamd binary is installed (a copy of the running one at a
    /// new path, so that the old process keeps its own), then SIGTERM, then the new binary
    /// starts on the same socket and state directory. Panics unless the old dipamd exits
    /// cleanly within `limit`; returns once the new one serves.
    pub fn upgrade(&mut self, limit: Duration) {
        let next = self.dir.path().join(format!("dipamd-{}", self.starts + 1));
        let running = self.binary.clone().unwrap_or_else(|| bins::bin("dipamd"));
        std::fs::copy(&running, &next)
            .unwrap_or_else(|e| panic!("install {}: {e}", next.display()));
        let status = self.terminate_within(limit);
        assert!(
            status.success(),
            "dipamd exited with {status}:\n{}",
            tail(&self.log(), 40)
        );
        if running.starts_with(self.dir.path()) {
            let _ = std::fs::remove_file(&running);
        }
        self.binary = Some(next);
        self.spawn();
    }

    /// Starts dipamd again on the same socket and state directory.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "dipamd is still running");
        self.spawn();
    }

    /// Starts dipamd again without waiting for it to serve: for a start a crash point may end
    /// at any moment, before or after the socket answers.
    pub fn start_again_unwaited(&mut self) {
        assert!(self.child.is_none(), "dipamd is still running");
        self.spawn_unready();
    }

    /// Leaves in the (stopped) dipamd's state what it notes for a delegate it runs, as a
    /// dipamd killed mid-exec leaves it: one 64-byte slot (shim-server's
    /// delegate/survivors.rs), `<pid> <first tick> <last tick>` of the delegate's start.
    pub fn plant_exec_slot(&self, pid: u32, first_tick: u64, last_tick: u64) {
        let mut slot = format!("{pid} {first_tick} {last_tick}").into_bytes();
        slot.resize(63, b' ');
        slot.push(b'\n');
        let exec = self.state_dir().join("exec");
        std::fs::create_dir_all(&exec).expect("create the exec directory");
        std::fs::write(exec.join("slots"), &slot).expect("write the exec slot");
    }

    /// The check `name` of `dipamctl doctor --json` (which exits 1 when a check fails).
    #[track_caller]
    pub fn doctor_check(&self, name: &str) -> Value {
        let out = self.ctl(&["doctor", "--json"]);
        let checks: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor --json: {e}: {out:?}"));
        crate::named(&checks, name).clone()
    }

    /// `dipamctl --socket S <args>`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl_at(&self.socket(), args)
    }

    /// `dipamctl gc --conflist CONFLIST --valid VALID <extra>`: an operator's GC against the
    /// list of attachments in the file `valid`.
    pub fn gc_valid(&self, conflist: &Path, valid: &Path, extra: &[&str]) -> Output {
        let (conflist, valid) = (conflist.display().to_string(), valid.display().to_string());
        let mut args = vec![
            "gc",
            "--conflist",
            conflist.as_str(),
            "--valid",
            valid.as_str(),
        ];
        args.extend_from_slice(extra);
        self.ctl(&args)
    }

    /// The ledger, through `dipamctl attachments --json`.
    pub fn ledger(&self) -> Vec<Value> {
        let v = crate::cmd::json(&self.ctl(&["attachments", "--json"]));
        v.as_array().cloned().unwrap_or_default()
    }

    /// Ledger entries of `network` as (container ID, bare IP) pairs, sorted.
    pub fn ledger_pairs(&self, network: &str) -> Vec<(String, String)> {
        let mut v: Vec<_> = self
            .ledger_ips(network)
            .into_iter()
            .map(|(id, _, ip)| (id, ip))
            .collect();
        v.sort();
        v
    }

    /// The ledger of `network` as the delegate sees it: (container ID, bare IP), sorted, with a
    /// pod served from the warm pool under the pool entry's key (its `delegateKey`).
    pub fn delegate_pairs(&self, network: &str) -> Vec<(String, String)> {
        delegate_pairs_in(&self.ledger(), network)
    }

    /// Waits (up to 30 s) until `network` is at rest: no record of it in flight, and the
    /// ledger read through delegate keys equal to `store` (the delegate's own view) on two
    /// reads 300 ms apart. A warm pool releases its surplus and refills in the background
    /// after a start, so a check that reads the ledger and then the store without this can
    /// see a release land between the two. Returns false when it never settled (the
    /// caller's assertions then show how they disagree).
    pub fn wait_settled(&self, network: &str, store: impl Fn() -> Vec<(String, String)>) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            let now = self.delegate_pairs(network);
            let busy = self
                .ledger()
                .iter()
                .any(|a| a["network"] == network && a["state"] != "committed");
            if !busy && now == last && now == store() {
                return true;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(300));
        }
        false
    }

    /// Ledger entries as (container ID, ifname, bare IP) triples, sorted.
    pub fn ledger_ips(&self, network: &str) -> Vec<(String, String, String)> {
        let mut out: Vec<_> = self
            .ledger()
            .iter()
            .filter(|a| a["network"] == network)
            .flat_map(|a| {
                let cid = a["containerID"].as_str().unwrap_or_default().to_owned();
                let ifname = a["ifname"].as_str().unwrap_or_default().to_owned();
                bare_ips(a).map(move |ip| (cid.clone(), ifname.clone(), ip))
            })
            .collect();
        out.sort();
        out
    }
}

/// The addresses of a ledger record (`dipamctl attachments --json`), without their prefix
/// length.
fn bare_ips(record: &Value) -> impl Iterator<Item = String> + use<> {
    let ips = record["ips"].as_array().cloned().unwrap_or_default();
    ips.into_iter()
        .filter_map(|ip| Some(ip.as_str()?.split('/').next()?.to_owned()))
}

impl Drop for Dipamd {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "----- dipamd log ({}) -----\n{}\n----- end of dipamd log -----",
                self.log_path().display(),
                tail(&self.log(), 80)
            );
        }
    }
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `dipamctl --socket SOCKET <args>`, whether or not a dipamd serves there.
pub fn ctl_at(socket: &Path, args: &[&str]) -> Output {
    Command::new(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run dipamctl")
}

/// `dipamctl install --wrap FILE --cni-bin-dir BIN --plugin <the built dipam>` and `extra`
/// (`--in-place` adopts the conflist where it lies, as the README tells a node to).
pub fn install_wrap(socket: &Path, file: &Path, bin: &Path, extra: &[&str]) -> Output {
    let plugin = bins::bin("dipam");
    let path = |p: &'_ Path| p.to_str().expect("a UTF-8 path").to_owned();
    let (file, bin, plugin) = (path(file), path(bin), path(&plugin));
    let mut args = vec!["install", "--wrap", &file, "--cni-bin-dir", &bin];
    args.extend(["--plugin", &plugin]);
    args.extend(extra);
    ctl_at(socket, &args)
}

/// `dipamctl recover` of the ledger in `state_dir` (dipamd down), rebuilt from the delegate
/// store of `conflist`'s network with the plugins in `cni_path`: its `--json` report, the
/// command having succeeded.
pub fn recover(state_dir: &Path, conflist: &Path, cni_path: &str) -> Value {
    crate::cmd::json(
        &Command::new(bins::bin("dipamctl"))
            .arg("recover")
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--conflist")
            .arg(conflist)
            .args(["--cni-path", cni_path, "--json"])
            .output()
            .expect("run dipamctl recover"),
    )
}

/// True when nothing listens on `path` any more (and the file is gone).
pub fn socket_gone(path: &Path) -> bool {
    !path.exists() && UnixStream::connect(path).is_err()
}

/// GET /metrics on a dipamd metrics socket (`--metrics-socket`): the whole HTTP answer,
/// asserted to be a 200.
pub fn scrape_socket(path: &Path) -> String {
    use std::io::{Read, Write};
    let mut s = UnixStream::connect(path).expect("connect to the metrics socket");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: dipamd\r\nConnection: close\r\n\r\n")
        .expect("send the scrape");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the scrape");
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out
}

/// CNI requests dipamd is serving now, every verb together (`dipam_requests_in_flight`).
pub fn requests_in_flight(scrape: &str) -> i64 {
    scrape
        .lines()
        .filter(|l| l.starts_with("dipam_requests_in_flight{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum()
}

/// The ledger `entries` (`dipamctl attachments --json`) of `network` as the delegate sees
/// them: (container ID, bare IP), sorted, with a pod served from the warm pool under the pool
/// entry's key (its `delegateKey`).
pub fn delegate_pairs_in(entries: &[serde_json::Value], network: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = entries
        .iter()
        .filter(|a| a["network"] == network)
        .flat_map(|a| {
            let id = a["delegateKey"]["containerID"]
                .as_str()
                .or(a["containerID"].as_str())
                .unwrap_or_default()
                .to_owned();
            bare_ips(a).map(move |ip| (id.clone(), ip))
        })
        .collect();
    out.sort();
    out
}
