//! `dipamctl support-bundle`: one tar.gz holding what a bug report about dipam needs, made so
//! that it can be run on a broken node: every part has a time limit, a part that fails is
//! noted in the bundle's `MANIFEST.json` (with the reason) and the others are still taken.
//!
//! The parts:
//! - dipamd's own view: `status`, `doctor`, `attachments` and `agent list`, each exactly as
//!   `dipamctl … --json` prints it (the commands run in-process), and `explain` for the
//!   ledger's containers (the most recently updated 50) plus any `--explain ID`;
//! - the metrics scrape (`--metrics-url`, or dipamd's own `--metrics-address`);
//! - the last `--log-lines` lines of dipamd's log, wherever it goes: `--log-file`, else the
//!   file dipamd's stderr is redirected to (`/proc/PID/fd/2`), else the journal of
//!   `--journal-unit`; the manifest says which (`source`), and a journal without entries is
//!   a failed part, never an empty log;
//! - with dipamd not answering (or `--offline`), the offline doctor (offline.rs): the ledger
//!   read from a copy, the DEL spool's files, the conflists and the delegates;
//! - dipamd's command line (its flags), found from the socket's peer (SO_PEERCRED), the
//!   versions of dipamctl and dipamd, the kernel and the OS;
//! - the conflists in `--conf-dir`, whole;
//! - the delegate's store, as file names only: host-local names each reservation by its
//!   address and keeps the container ID inside, which the ledger already shows.
//!
//! A part that failed or came out empty is marked failed with the reason, never ok: with
//! dipamd down, its own view, `explain` and the metrics are failed parts, and the offline
//! doctor is what the bundle holds instead.
//!
//! Nothing is redacted: every part is what an operator of the node can already read, and what
//! a maintainer needs to follow a pod's story. The bundle is written 0600, since it holds
//! container IDs and pod names.

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    client,
    error::{ArchiveError, CtlError},
    offline, output,
};

// The doc comments below are clap's help text (plain text, shown by --help and the man
// pages): `<name>` there is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the bundle. Default: dipam-support-<host>-<UTC time>.tar.gz in the
    /// current directory.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// dipamd's log file, whose last lines go in the bundle. Default: the file dipamd's stderr
    /// goes to, if it is one, else the journal of --journal-unit.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The systemd unit whose journal is read when no --log-file is given.
    #[arg(long, value_name = "UNIT", default_value = "dipamd")]
    pub journal_unit: String,
    /// How many of the log's last lines to take.
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub log_lines: usize,
    /// The CNI configuration directory whose conflists go in the bundle.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    pub conf_dir: PathBuf,
    /// Where to scrape dipamd's metrics: http://HOST:PORT/metrics or unix:PATH. Default: the
    /// --metrics-socket or --metrics-address on dipamd's command line, if it has one.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Also explain this container ID (repeatable). The ledger's containers are explained
    /// anyway, the 50 most recently updated.
    #[arg(long = "explain", value_name = "ID")]
    pub explain: Vec<String>,
    /// The time limit of each part, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub part_timeout: u64,
    #[command(flatten)]
    pub offline: offline::Args,
}

/// How many of the ledger's containers get an `explain`.
const EXPLAINED: usize = 50;

/// One part's outcome, as MANIFEST.json lists it.
struct Entry {
    part: String,
    file: Option<String>,
    error: Option<String>,
    /// Where the part came from, when it has more than one possible source (the log).
    source: Option<String>,
    took: Duration,
}

/// The bundle being made: its files in memory until the end (each is bounded: log lines,
/// explained containers), the manifest, and the progress display.
struct Bundle {
    files: Vec<(String, Vec<u8>)>,
    entries: Vec<Entry>,
    limit: Duration,
    progress: bool,
    total: usize,
}

impl Bundle {
    /// Runs one part under the time limit and keeps what it made, or why it made nothing.
    async fn part<F>(&mut self, part: &str, file: &str, work: F)
    where
        F: std::future::Future<Output = Result<Vec<u8>, String>>,
    {
        self.part_from(part, file, async { work.await.map(|b| (b, None)) })
            .await;
    }

    /// [`Self::part`] for a part that also says which source it was taken from.
    async fn part_from<F>(&mut self, part: &str, file: &str, work: F)
    where
        F: std::future::Future<Output = Result<(Vec<u8>, Option<String>), String>>,
    {
        let n = self.entries.len() + 1;
        if self.progress {
            eprint!("[{n}/{}] {part} … ", self.total);
        }
        let started = Instant::now();
        let outcome = match tokio::time::timeout(self.limit, work).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {} s", self.limit.as_secs())),
        };
        let took = started.elapsed();
        if self.progress {
            match &outcome {
                Ok(_) => eprintln!("ok ({} ms)", took.as_millis()),
                Err(e) => eprintln!("FAILED: {e}"),
            }
        }
        let (file, error, source) = match outcome {
            Ok((bytes, source)) => {
                self.files.push((file.to_owned(), bytes));
                (Some(file.to_owned()), None, source)
            }
            Err(e) => (None, Some(e), None),
        };
        self.entries.push(Entry {
            part: part.to_owned(),
            file,
            error,
            source,
            took,
        });
    }

    /// The manifest; `made_ms`: when the bundle was begun, Unix ms.
    fn manifest(&self, made_ms: u64) -> Value {
        let (made, made_ms) = crate::clock::json_time(made_ms);
        json!({
            "madeAt": made,
            "madeAtMs": made_ms,
            "dipamctlVersion": env!("CARGO_PKG_VERSION"),
            "parts": self.entries.iter().map(|e| json!({
                "part": e.part,
                "file": e.file,
                "ok": e.error.is_none(),
                "error": e.error,
                "source": e.source,
                "durationMs": e.took.as_millis() as u64,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Blocking work on a thread of its own, waited for under the part's limit. A detached
/// thread, not `spawn_blocking`: a read stuck on a FIFO or a hung filesystem must not keep
/// dipamctl from exiting once the bundle is written.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.await
        .map_err(|_| "the worker thread panicked".to_owned())?
}

/// Runs `dipamctl --socket S --json <argv>` in-process and returns what it printed. A command
/// that printed something and then failed (doctor with a failing check) still gives its
/// output; the failure is noted after it.
async fn dipamctl(socket: &Path, argv: &[&str]) -> Result<Vec<u8>, String> {
    let mut full: Vec<String> = vec!["dipamctl".into(), "--socket".into()];
    full.push(socket.display().to_string());
    full.push("--json".into());
    full.extend(argv.iter().map(|s| (*s).to_owned()));
    let args = super::parse(env!("CARGO_PKG_VERSION"), &full).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    // Boxed: `run` dispatches here, and an async call cycle needs one indirection.
    let result = Box::pin(super::run(args, &mut buf)).await;
    match result {
        Ok(()) => Ok(buf),
        Err(e) if !buf.is_empty() => {
            let _ = writeln!(buf, "// dipamctl: {e}");
            Ok(buf)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// dipamd's pid, from the socket's peer credentials: the process that listens is the one
/// whose flags and log matter, whatever its unit or pod is called. A dipamd that holds the
/// ledger in `state_dir` without listening (starting, or stuck before it serves) is found
/// through the ledger's lock instead.
fn dipamd_pid(socket: &Path, state_dir: &Path) -> Result<i32, String> {
    let stream = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            return offline::ledger_holder(state_dir)
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| {
                    format!(
                        "connect to {}: {e}; and no process holds the ledger in {}",
                        socket.display(),
                        state_dir.display()
                    )
                });
        }
    };
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("SO_PEERCRED on {}: {e}", socket.display()))?;
    Ok(cred.pid())
}

/// dipamd's command line, one argument per line.
fn cmdline(pid: i32) -> Result<Vec<String>, String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| format!("/proc/{pid}/cmdline: {e}"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
}

/// The value of `flag` on a command line (`--flag value` or `--flag=value`).
fn flag_value(argv: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_owned)
        }
    })
}

/// Where dipamd serves its metrics: `--metrics-url` if given, else its `--metrics-socket` or
/// `--metrics-address` as its command line says.
fn metrics_target(url: Option<&str>, argv: Option<&[String]>) -> Option<String> {
    if let Some(u) = url {
        return Some(u.to_owned());
    }
    let argv = argv?;
    flag_value(argv, "--metrics-socket")
        .map(|p| format!("unix:{p}"))
        .or_else(|| flag_value(argv, "--metrics-address").map(|a| format!("http://{a}/metrics")))
}

/// GET on dipamd's plain-HTTP metrics endpoint: `http://HOST:PORT/PATH` (dipamd serves metrics
/// on loopback, without TLS) or `unix:PATH`.
async fn scrape(target: &str) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (host, path) = if let Some(p) = target.strip_prefix("unix:") {
        ("localhost", ("metrics", p))
    } else {
        let rest = target.strip_prefix("http://").ok_or_else(|| {
            format!("{target}: only http:// and unix: metrics targets are supported")
        })?;
        let (host, path) = rest.split_once('/').unwrap_or((rest, "metrics"));
        (host, (path, ""))
    };
    let req = format!(
        "GET /{} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n",
        path.0
    );
    let mut all = Vec::new();
    if path.1.is_empty() {
        let mut s = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| format!("connect to {host}: {e}"))?;
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        s.read_to_end(&mut all).await.map_err(|e| e.to_string())?;
    } else {
        let mut s = tokio::net::UnixStream::connect(path.1)
            .await
            .map_err(|e| format!("connect to {}: {e}", path.1))?;
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        s.read_to_end(&mut all).await.map_err(|e| e.to_string())?;
    }
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP header in the answer")?;
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.lines().next().unwrap_or_default().to_owned();
    if !status.contains(" 200") {
        return Err(format!("{target}: {status}"));
    }
    Ok(all[split + 4..].to_vec())
}

/// The last `n` lines of a file, read on its own thread.
async fn tail_file(path: PathBuf, n: usize) -> Result<Vec<u8>, String> {
    blocking(move || {
        let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        Ok(lines[from..].join("\n").into_bytes())
    })
    .await
}

/// The last `n` lines of a unit's journal.
async fn journal(unit: &str, n: usize) -> Result<Vec<u8>, String> {
    let out = tokio::process::Command::new("journalctl")
        .args(["--no-pager", "-o", "short-iso-precise", "-u", unit, "-n"])
        .arg(n.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("journalctl: {e} (give --log-file instead)"))?;
    if !out.status.success() {
        return Err(format!(
            "journalctl -u {unit}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// host-local's store directories named by the conflists: every object with
/// `"type": "host-local"` (a plain IPAM, dipam's `delegate`, or main mode's `ipam`) keeps its
/// reservations in `<dataDir or /var/lib/cni/networks>/<network name>`.
fn host_local_dirs(lists: &[(String, Vec<u8>)]) -> Vec<PathBuf> {
    fn walk(v: &Value, network: &str, out: &mut Vec<PathBuf>) {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some("host-local") {
                    // Read as host-local reads it (delegate/keys.rs).
                    let base = crate::delegate::keys::get(v, "dataDir")
                        .and_then(Value::as_str)
                        .unwrap_or("/var/lib/cni/networks");
                    out.push(Path::new(base).join(network));
                }
                m.values().for_each(|x| walk(x, network, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, network, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (_, bytes) in lists {
        if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
            let network = v["name"].as_str().unwrap_or_default().to_owned();
            walk(&v, &network, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The names (and sizes) of the files in each store directory: never their contents.
fn store_listing(dirs: &[PathBuf]) -> Value {
    let listed: Vec<Value> = dirs
        .iter()
        .map(|d| match std::fs::read_dir(d) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                json!({"dir": d, "files": names})
            }
            Err(e) => json!({"dir": d, "error": e.to_string()}),
        })
        .collect();
    Value::Array(listed)
}

/// The ledger's containers, most recently updated first, without repeats.
fn recent_containers(attachments: &[u8]) -> Vec<String> {
    let mut v: Vec<Value> = serde_json::from_slice::<Value>(attachments)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    v.sort_by_key(|a| std::cmp::Reverse(a["updatedAtMs"].as_u64().unwrap_or_default()));
    let mut ids: Vec<String> = Vec::new();
    for a in v {
        if let Some(id) = a["containerID"].as_str()
            && !ids.iter().any(|x| x == id)
        {
            ids.push(id.to_owned());
        }
    }
    ids.truncate(EXPLAINED);
    ids
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}

/// UTC time as `20261124T071500Z` (file names) and RFC 3339 (the manifest).
/// The bundle's name stamp (`20261124T071500Z`) and its RFC 3339 time to the second.
fn utc_at(ms: u64) -> (String, String) {
    let rfc = crate::clock::rfc3339_ms(ms);
    let stamp: String = rfc[..19]
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    (format!("{stamp}Z"), format!("{}Z", &rfc[..19]))
}

/// Writes the tar.gz: to a temporary file beside the target, 0600, then renamed, so that a
/// bundle that exists is whole.
fn write_archive(path: &Path, files: &[(String, Vec<u8>)], root: &str) -> Result<(), ArchiveError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("partial");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|source| ArchiveError::File {
            path: tmp.clone(),
            source,
        })?;
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = crate::clock::now();
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(mtime);
        h.set_cksum();
        tar.append_data(&mut h, format!("{root}/{name}"), bytes.as_slice())
            .map_err(|source| ArchiveError::Add {
                name: name.clone(),
                source,
            })?;
    }
    let gz = tar.into_inner().map_err(ArchiveError::Finish)?;
    let f = gz.finish().map_err(ArchiveError::Finish)?;
    f.sync_all().map_err(ArchiveError::Finish)?;
    std::fs::rename(&tmp, path).map_err(|source| ArchiveError::File {
        path: path.to_owned(),
        source,
    })
}

pub async fn run(
    args: Args,
    socket: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let made_ms = crate::clock::now_ms();
    let (stamp, _) = utc_at(made_ms);
    let root = format!("dipam-support-{}-{stamp}", hostname());
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{root}.tar.gz")));
    let mut b = Bundle {
        files: Vec::new(),
        entries: Vec::new(),
        limit: Duration::from_secs(args.part_timeout.max(1)),
        progress: !json && std::io::stderr().is_terminal(),
        total: 12,
    };

    // Asked once up front: with dipamd down, its own view is replaced by the offline one.
    let down = if args.offline.offline {
        Some("--offline given".to_owned())
    } else {
        client::connect(socket).await.err().map(|e| e.to_string())
    };
    daemon_parts(&mut b, socket, down.as_deref()).await;
    explain_part(&mut b, socket, &args.explain, down.as_deref()).await;
    host_parts(&mut b, socket, &args).await;
    config_parts(&mut b, &args).await;
    offline_part(&mut b, socket, &args, down).await;
    let manifest = write(&mut b, made_ms, &path, &root)?;
    report(out, json, manifest, &b.entries, &path)
}

/// What dipamd answers: its status, doctor, attachments and the agent's list. `down`: why
/// dipamd is not asked (each part fails with it).
async fn daemon_parts(b: &mut Bundle, socket: &Path, down: Option<&str>) {
    for (part, argv) in [
        ("status", &["status"][..]),
        ("doctor", &["doctor"][..]),
        ("attachments", &["attachments"][..]),
        ("agent list", &["agent", "list"][..]),
    ] {
        let file = format!("{}.json", argv.join("-"));
        match down {
            Some(why) => b.part(part, &file, async { Err(why.to_owned()) }).await,
            None => b.part(part, &file, dipamctl(socket, argv)).await,
        }
    }
}

/// With dipamd not answering: the offline doctor's report (offline.rs), from the node's
/// files.
async fn offline_part(b: &mut Bundle, socket: &Path, args: &Args, down: Option<String>) {
    let Some(reason) = down else {
        return;
    };
    let (a, s, c) = (
        args.offline.clone(),
        socket.to_owned(),
        args.conf_dir.clone(),
    );
    b.part("offline doctor", "offline-doctor.json", async {
        blocking(move || {
            let report = offline::inspect(reason, &a, &s, &c, &std::env::temp_dir());
            serde_json::to_vec_pretty(&report.to_json()).map_err(|e| e.to_string())
        })
        .await
    })
    .await;
}

/// `explain` of the most recent containers and of the ones asked for (`extra`). Failed, not
/// an empty `{}`, when dipamd is `down`, when there is nothing to explain, and when every
/// explain failed.
async fn explain_part(b: &mut Bundle, socket: &Path, extra: &[String], down: Option<&str>) {
    if let Some(why) = down {
        let why = why.to_owned();
        return b.part("explain", "explain.json", async { Err(why) }).await;
    }
    let mut ids = b
        .files
        .iter()
        .find(|(n, _)| n == "attachments.json")
        .map(|(_, a)| recent_containers(a))
        .unwrap_or_default();
    ids.extend(extra.iter().cloned());
    ids.dedup();
    b.part("explain", "explain.json", async {
        if ids.is_empty() {
            return Err(
                "nothing to explain: no attachment in the ledger and no --explain ID".into(),
            );
        }
        let mut all = serde_json::Map::new();
        let mut last_error = None;
        for id in &ids {
            let one = dipamctl(socket, &["explain", id]).await;
            let v = match one {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
                Err(e) => {
                    last_error = Some(e.clone());
                    json!({"error": e})
                }
            };
            all.insert(id.clone(), v);
        }
        if let Some(e) = last_error.filter(|_| all.values().all(|v| v.get("error").is_some())) {
            return Err(format!("every explain failed; the last: {e}"));
        }
        serde_json::to_vec_pretty(&Value::Object(all)).map_err(|e| e.to_string())
    })
    .await;
}

/// dipamd's command line and versions, its metrics and its log.
async fn host_parts(b: &mut Bundle, socket: &Path, args: &Args) {
    let (owned, state_dir) = (socket.to_owned(), args.offline.state_dir.clone());
    let pid = blocking(move || dipamd_pid(&owned, &state_dir)).await;
    let argv = match &pid {
        Ok(pid) => {
            let pid = *pid;
            blocking(move || cmdline(pid)).await
        }
        Err(e) => Err(e.clone()),
    };
    let daemon_version = b
        .files
        .iter()
        .find(|(n, _)| n == "status.json")
        .and_then(|(_, s)| serde_json::from_slice::<Value>(s).ok())
        .map_or(Value::Null, |s| s["daemonVersion"].clone());
    b.part("dipamd command line and versions", "versions.json", async {
        let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let v = json!({
            "dipamctl": env!("CARGO_PKG_VERSION"),
            "dipamd": daemon_version,
            "dipamdCommandLine": argv.as_ref().map_or_else(|e| json!({"error": e}), |a| json!(a)),
            "kernel": kernel.trim(),
            "osRelease": os.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|s| s.trim_matches('"')),
        });
        serde_json::to_vec_pretty(&v).map_err(|e| e.to_string())
    })
    .await;

    let target = metrics_target(args.metrics_url.as_deref(), argv.as_deref().ok());
    b.part("metrics", "metrics.txt", async {
        match (&target, &argv) {
            (Some(t), _) => scrape(t).await,
            (None, Err(e)) => Err(format!(
                "dipamd's command line, which says where it serves metrics, is unknown ({e}); \
                 give --metrics-url"
            )),
            (None, Ok(_)) => Err(
                "dipamd has neither --metrics-socket nor --metrics-address, and no \
                 --metrics-url was given"
                    .into(),
            ),
        }
    })
    .await;

    let (file, unit, n) = (
        args.log_file.clone(),
        args.journal_unit.clone(),
        args.log_lines,
    );
    b.part_from("log", "dipamd.log", log(file, pid.ok(), unit, n))
        .await;
}

/// dipamd's log, wherever it goes: `file` (--log-file); else the file dipamd's stderr is
/// redirected to (a unit's `StandardError=file:`, a shell's `2>>`), found through its
/// `/proc/PID/fd/2`; else the unit's journal. Returns the lines and which source they came
/// from; a journal without entries for the unit is a failure that says where else to look.
async fn log(
    file: Option<PathBuf>,
    pid: Option<i32>,
    unit: String,
    n: usize,
) -> Result<(Vec<u8>, Option<String>), String> {
    if let Some(f) = file {
        let source = format!("--log-file {}", f.display());
        return Ok((tail_file(f, n).await?, Some(source)));
    }
    if let Some(pid) = pid {
        let fd = PathBuf::from(format!("/proc/{pid}/fd/2"));
        // A regular file only: a pipe or a socket (the journal's stream, a terminal) cannot be
        // read back, and reading a FIFO would take what dipamd's reader should get.
        if std::fs::metadata(&fd).is_ok_and(|m| m.is_file()) {
            let target = std::fs::read_link(&fd).unwrap_or_else(|_| fd.clone());
            let source = format!("dipamd's stderr (pid {pid}): {}", target.display());
            return Ok((tail_file(fd, n).await?, Some(source)));
        }
    }
    let lines = journal(&unit, n).await?;
    let text = String::from_utf8_lossy(&lines);
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.starts_with("-- "))
    {
        return Err(format!(
            "the journal has no entries for unit {unit}{}: dipamd logs elsewhere; give \
             --log-file (or --journal-unit)",
            if pid.is_none() {
                ", and no running dipamd was found to read its stderr"
            } else {
                ", and dipamd's stderr is not a file"
            }
        ));
    }
    Ok((lines, Some(format!("journal of unit {unit}"))))
}

/// The CNI config directory's conflists and the names in the delegate's store.
async fn config_parts(b: &mut Bundle, args: &Args) {
    let dir = args.conf_dir.clone();
    let lists = blocking(move || super::offline::conflists(&dir)).await;
    b.part("conflists", "conflists.json", async {
        let lists = lists.as_ref().map_err(Clone::clone)?;
        let v: serde_json::Map<String, Value> = lists
            .iter()
            .map(|(n, bytes)| {
                let parsed = serde_json::from_slice(bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into()));
                (n.clone(), parsed)
            })
            .collect();
        serde_json::to_vec_pretty(&json!({"dir": args.conf_dir, "files": v}))
            .map_err(|e| e.to_string())
    })
    .await;
    let dirs = host_local_dirs(lists.as_deref().unwrap_or_default());
    b.part(
        "delegate store (names only)",
        "delegate-store.json",
        async {
            blocking(move || {
                serde_json::to_vec_pretty(&store_listing(&dirs)).map_err(|e| e.to_string())
            })
            .await
        },
    )
    .await;
}

/// The archive: every part and the manifest. Returns the manifest.
fn write(b: &mut Bundle, made_ms: u64, path: &Path, root: &str) -> Result<Value, CtlError> {
    let manifest = b.manifest(made_ms);
    let mut files = std::mem::take(&mut b.files);
    files.push((
        "MANIFEST.json".into(),
        serde_json::to_vec_pretty(&manifest).unwrap_or_default(),
    ));
    write_archive(path, &files, root)?;
    Ok(manifest)
}

/// What the bundle holds, part by part, and where it is.
fn report(
    out: &mut dyn Write,
    json: bool,
    manifest: Value,
    entries: &[Entry],
    path: &Path,
) -> Result<(), CtlError> {
    let failed = entries.iter().filter(|e| e.error.is_some()).count();
    if json {
        let mut v = manifest;
        v["bundle"] = json!(path);
        output::json(out, &v)?;
    } else {
        let rows: Vec<[String; 3]> = entries
            .iter()
            .map(|e| {
                [
                    e.part.clone(),
                    if e.error.is_none() {
                        "ok".into()
                    } else {
                        "FAILED".into()
                    },
                    e.error
                        .clone()
                        .unwrap_or_else(|| e.file.clone().unwrap_or_default()),
                ]
            })
            .collect();
        output::table(out, ["PART", "OUTCOME", "FILE OR REASON"], &rows)?;
        writeln!(
            out,
            "wrote {} ({} part(s), {failed} failed: noted in MANIFEST.json)",
            path.display(),
            entries.len()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_metrics_target_comes_from_the_flag_or_dipamds_command_line() {
        let a = argv("dipamd --state-dir /s --metrics-address 127.0.0.1:9646");
        assert_eq!(
            metrics_target(None, Some(&a)).as_deref(),
            Some("http://127.0.0.1:9646/metrics")
        );
        let a =
            argv("dipamd --metrics-socket=/run/dipam/metrics.sock --metrics-address 127.0.0.1:1");
        assert_eq!(
            metrics_target(None, Some(&a)).as_deref(),
            Some("unix:/run/dipam/metrics.sock")
        );
        assert_eq!(
            metrics_target(Some("http://x:1/m"), Some(&a)).as_deref(),
            Some("http://x:1/m")
        );
        assert_eq!(metrics_target(None, Some(&argv("dipamd"))), None);
        assert_eq!(metrics_target(None, None), None);
        // A flag at the end with no value is not a value.
        assert_eq!(
            flag_value(&argv("dipamd --metrics-address"), "--metrics-address"),
            None
        );
    }

    #[test]
    fn host_local_stores_are_found_wherever_the_conflist_puts_host_local() {
        let lists = vec![
            (
                "10-wrapped.conflist".to_owned(),
                br#"{"name":"podnet","plugins":[{"type":"ptp","ipam":{"type":"dipam",
                    "delegate":{"type":"host-local","dataDir":"/data"}}}]}"#
                    .to_vec(),
            ),
            (
                "20-main.conflist".to_owned(),
                br#"{"name":"main","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#
                    .to_vec(),
            ),
            ("30-broken.conf".to_owned(), b"{not json".to_vec()),
        ];
        assert_eq!(
            host_local_dirs(&lists),
            vec![
                PathBuf::from("/data/podnet"),
                PathBuf::from("/var/lib/cni/networks/main")
            ]
        );
    }

    #[test]
    fn explained_containers_are_the_most_recent_without_repeats() {
        let mut v: Vec<Value> = (0..60)
            .map(|i| json!({"containerID": format!("c{i}"), "updatedAtMs": i}))
            .collect();
        v.push(json!({"containerID": "c59", "updatedAtMs": 1}));
        let ids = recent_containers(&serde_json::to_vec(&v).unwrap());
        assert_eq!(ids.len(), EXPLAINED);
        assert_eq!(ids[0], "c59");
        assert_eq!(ids.iter().filter(|i| *i == "c59").count(), 1);
        assert!(recent_containers(b"not json").is_empty());
    }

    #[test]
    fn the_time_stamp_is_utc_civil_time() {
        let (stamp, rfc) = utc_at(crate::clock::now_ms());
        assert_eq!(stamp.len(), "20261124T071500Z".len(), "{stamp}");
        assert!(rfc.ends_with('Z') && rfc.len() == 20, "{rfc}");
        assert_eq!(&stamp[..4], &rfc[..4]);
    }
}
