//! A hostile local user, as a real process running as nobody (uid 65534, through `setpriv`):
//! it opens many connections to one of dipamd's listeners and holds them until dropped. The
//! attacker is Debian's python3 (installed by tests/deps.sh), its soft descriptor limit
//! raised to the hard one, so that it can hold more connections than dipamd lets in.

use std::{
    io::{BufRead, BufReader},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use crate::nobody::NOBODY;

/// The attacker: `mode` is `bind HOST PORT` (it listens on that TCP port, accepting nothing),
/// `churn PATH SECONDS` (for that long it connects to the socket without waiting, as fast as
/// it can, keeping the last N connections open; it reports `held 0` at once),
/// `tcp HOST PORT`, `unix PATH`, or `headers PATH SIZE` (an HTTP/2
/// preface and settings, then a HEADERS frame and CONTINUATION frames of SIZE bytes in all,
/// never ended). It opens N connections (each given 0.1 s; it stops after 50 misses: a full backlog drops the rest), prints
/// `held <count> cut <count>`, then holds them until its stdin closes. A connection is cut
/// when it was made but dipamd closed it (or stopped reading it) before its header block was
/// all sent: for `headers`, dipamd bounding what a connection may make it read.
const SCRIPT: &str = r#"
import os, socket, struct, sys, time, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
mode, n = sys.argv[1], int(sys.argv[2])
def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
if mode == "churn":
    end = time.time() + float(sys.argv[4])
    print("held", 0, flush=True)
    held = []
    while time.time() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(sys.argv[3])
        except OSError:
            pass
        held.append(s)
        if len(held) > n:
            held.pop(0).close()
    sys.stdin.read()
    sys.exit(0)
if mode == "bind":
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((sys.argv[3], int(sys.argv[4])))
    s.listen(1)
    print("held", 1, flush=True)
    sys.stdin.read()
    sys.exit(0)
held = []
misses = 0
cut = 0
for i in range(n):
    if misses >= 50:
        break
    connected = False
    try:
        if mode == "tcp":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(0.1)
            s.connect((sys.argv[3], int(sys.argv[4])))
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(0.1)
            s.connect(sys.argv[3])
        connected = True
        if mode == "headers":
            size = int(sys.argv[4])
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
            chunk = 16384
            s.sendall(frame(1, 0, 1, b"\x00" * chunk))
            sent = chunk
            while sent < size:
                s.sendall(frame(9, 0, 1, b"\x00" * chunk))
                sent += chunk
        held.append(s)
    except OSError:
        if connected:
            cut += 1
        else:
            misses += 1
print("held", len(held), "cut", cut, flush=True)
sys.stdin.read()
"#;

/// A python3 script running as nobody; killed when dropped (its connections close).
pub struct Attacker {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Attacker {
    /// Starts `script` with `args` as nobody, and returns it with the first line it prints
    /// (its report, once it has done what it holds).
    pub fn start(script: &str, args: &[String]) -> (Self, String) {
        let mut child = Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
            .args(["/usr/bin/python3", "-c", script])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("setpriv (util-linux) and /usr/bin/python3");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the attacker's report");
        (Self { child, stdin }, line)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running attacker; its connections close when it is dropped.
pub struct Flood {
    _attacker: Attacker,
    /// Connections it managed to open (connect succeeded) and holds.
    pub held: usize,
    /// Connections it opened that dipamd closed, or stopped reading, before the attacker had
    /// sent what it meant to (`headers` mode).
    pub cut: usize,
    /// How long opening them took.
    pub took: Duration,
}

impl Flood {
    /// Starts the attacker as nobody with `args` (see `SCRIPT`) and waits until it holds
    /// its connections.
    pub fn start(args: &[&str]) -> Self {
        let started = Instant::now();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (attacker, line) = Attacker::start(SCRIPT, &args);
        // `held N cut M`; the bind and churn modes report `held N` alone.
        let counts: Vec<usize> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let (held, cut) = match counts[..] {
            [held] => (held, 0),
            [held, cut] => (held, cut),
            _ => panic!("the attacker did not report: {line:?}"),
        };
        Self {
            _attacker: attacker,
            held,
            cut,
            took: started.elapsed(),
        }
    }
}

/// Descriptors `pid` has open now.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// `pid`'s resident set in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// `pid`'s peak resident set in KiB (0 once it is gone).
pub fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// The `field` line of /proc/`pid`/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `pid`'s soft and hard descriptor limits.
pub fn nofile(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default();
    let mut n = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    (n.next().unwrap_or(0), n.next().unwrap_or(0))
}

/// The hard descriptor limit of this process: what `prlimit` may give a child without
/// CAP_SYS_RESOURCE (a container running the tests may lack it).
pub fn own_hard_nofile() -> u64 {
    nofile(std::process::id()).1
}
