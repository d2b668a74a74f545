//! Runs a CNI plugin the way libcni does (pkg/invoke): the CNI_* environment, the config on
//! stdin, stdout and stderr captured separately, a timeout, and a retry on "text file busy"
//! (docs/sources.md §3.1, §6).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
};
use tracing::{debug, warn};

use crate::l1_leaves::error::{DelegateFailure, ShimError, excerpt};

/// One call of a delegate: the CNI environment and stdin.
#[derive(Debug, Clone, Default)]
pub struct Invocation {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    /// CNI_PATH for the delegate (colon-separated).
    pub path: String,
    pub stdin: Vec<u8>,
    /// For the history only: which request and network this exec serves, and the non-root
    /// caller it serves (None: root).
    pub request_id: String,
    pub network: String,
    pub uid: Option<u32>,
    /// The warm pool's own work (a refill's ADD, an entry's release): run at a lower CPU
    /// priority ([`BACKGROUND_NICE`]), so that on a busy node it yields to the pods' ADDs.
    pub background: bool,
}

/// How much lower than dipamd's the priority of the warm pool's delegate execs is. A refill
/// made during a burst of pods is the same host-local exec a pod's ADD would have made: on a
/// node whose CPUs the burst's plugins already fill, at equal priority it took as much CPU as
/// it saved the pod it serves (docs/performance.md, "IPAM mode: where a pooled ADD's time
/// goes"). Niced, it runs in the gaps the pods leave and keeps the pool filled at rest, the
/// way the ENI IPAMs fill theirs off the pods' path. Since a niced exec holding `host-local`'s
/// store lock would hold up a pod's DEL behind it, it starts only once its network has no
/// pod exec in flight, or unniced past a bound (yielding.rs).
pub const BACKGROUND_NICE: libc::c_int = 10;

/// What the process did.
#[derive(Debug)]
pub struct Output {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

impl Output {
    /// "exited with status 1" / "killed by signal 9": for error details.
    pub fn describe_exit(&self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match (self.status.code(), self.status.signal()) {
            (Some(c), _) => format!("exited with status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended abnormally".into(),
        }
    }
}

/// libcni retries exec up to 6 times, 1 s apart, on ETXTBSY (a binary being replaced while
/// it is exec'd, e.g. during a plugin upgrade). Shorter steps suffice here: the window is the
/// installer's rename.
const TEXT_BUSY_RETRIES: u32 = 6;
const TEXT_BUSY_BACKOFF: Duration = Duration::from_millis(200);

/// Finds `kind` as a regular file in `dirs`, in order (libcni `FindInPath`).
pub fn find(kind: &str, dirs: &[PathBuf]) -> Result<PathBuf, ShimError> {
    if kind.is_empty() || kind.contains('/') || kind == "." || kind == ".." {
        return Err(ShimError::Config {
            msg: format!("invalid delegate plugin type {kind:?}"),
            details: "a plugin type is a file name in the CNI bin directories, without a path"
                .into(),
        });
    }
    dirs.iter()
        .map(|d| d.join(kind))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file()))
        .ok_or_else(|| ShimError::DelegateNotFound {
            kind: kind.to_owned(),
            searched: dirs.to_vec(),
        })
}

/// How long a delegate killed for its timeout or its output is waited for, to reap it.
const REAP_AFTER_KILL: Duration = Duration::from_secs(1);

/// Execs `binary` with `inv`, killing it after `timeout`.
pub async fn run(
    kind: &str,
    binary: &Path,
    inv: &Invocation,
    timeout: Duration,
    tracker: Option<&super::survivors::Tracker>,
) -> Result<Output, ShimError> {
    run_gated(
        kind,
        binary,
        inv,
        timeout,
        tracker,
        std::future::ready(Ok(())),
        None,
    )
    .await
    .into_result()
}

/// How a gated exec ([`run_gated`]) ended.
#[derive(Debug)]
pub enum Gated {
    /// The gate failed: the delegate was killed before it read its config, so it did nothing.
    GateFailed(ShimError),
    /// The gate passed and the delegate ran (or could not start): its outcome, as from [`run`].
    Ran(Result<Output, ShimError>),
}

impl Gated {
    /// The outcome for a caller to whom a failed gate is just another error.
    pub fn into_result(self) -> Result<Output, ShimError> {
        match self {
            Self::GateFailed(e) => Err(e),
            Self::Ran(out) => out,
        }
    }
}

/// Like [`run`], but the delegate gets its config on stdin only once `gate` has succeeded.
///
/// Why: a CNI plugin can do nothing before it has read its config (skel reads all of stdin
/// before dispatching; the config names the store, the ranges, everything), yet a Go
/// delegate spends most of its ~2.5 ms exec starting its runtime. So dipamd spawns the
/// delegate first and makes its write-ahead intent durable meanwhile (`gate`), instead of
/// paying the commit's fdatasync and the exec one after the other. The ordering that crash
/// safety rests on is kept: no delegate acts before its intent is durable. If `gate` fails
/// the delegate is killed without ever seeing its config, and if dipamd dies before writing
/// it, the delegate reads EOF and exits without acting.
///
/// With `peek`, the delegate's stdout is sent there the moment it holds one complete JSON
/// document (`collect`), typically its result, while the delegate is still exiting.
///
/// [`Gated::GateFailed`] when the gate failed (the delegate never got its config).
pub async fn run_gated(
    kind: &str,
    binary: &Path,
    inv: &Invocation,
    timeout: Duration,
    tracker: Option<&super::survivors::Tracker>,
    gate: impl std::future::Future<Output = Result<(), ShimError>>,
    peek: Option<Peek>,
) -> Gated {
    let started = Instant::now();
    let mut attempt = 0;
    // The clock tick the delegate starts at or after, for its note (survivors.rs).
    let mut since = 0;
    let mut child = loop {
        let mut cmd = command(binary, inv);
        if tracker.is_some() {
            since = super::survivors::ticks_now();
        }
        match cmd.spawn() {
            Ok(child) => break child,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < TEXT_BUSY_RETRIES => {
                attempt += 1;
                warn!(delegate = kind, attempt, "text file busy; retrying exec");
                tokio::time::sleep(TEXT_BUSY_BACKOFF).await;
            }
            Err(source) => {
                // The gate still decides what the caller sees first: an intent that could
                // not be written is the caller's error, whatever the exec would have done.
                if let Err(e) = gate.await {
                    return Gated::GateFailed(e);
                }
                return Gated::Ran(Err(ShimError::DelegateSpawn {
                    kind: kind.to_owned(),
                    path: binary.to_owned(),
                    source,
                }));
            }
        }
    };
    // Noted while it runs, so that a dipamd killed now makes its successor wait for it; and
    // noted before it gets its config, so before it can act. One pwrite, on this task.
    let pid = child.id();
    if inv.background {
        lower_priority(kind, pid);
    }
    let noted = pid
        .zip(tracker)
        .map(|(pid, t)| t.note(pid, since).kept_if_abandoned(inv.command == "ADD"));
    let gate = gate.await;
    if let Err(e) = gate {
        // It has not read a byte of config: killing it cannot leave anything half-done.
        let _ = child.start_kill();
        let _ = child.wait().await;
        if let Some(n) = noted {
            n.finish();
        }
        return Gated::GateFailed(e);
    }
    feed(&mut child, inv);
    let remaining = timeout.saturating_sub(started.elapsed());
    let collected = tokio::time::timeout(remaining, collect(&mut child, peek)).await;
    if !matches!(collected, Ok(Ok(_))) {
        // dipamd's own limits, never its caller leaving: past --delegate-timeout the delegate
        // is hung (host-local's create and write of a reservation are two syscalls back to
        // back, so a hung one waits on its store lock, before any file exists), and one that
        // writes more than a result is broken. Left running, either would hold its key's lock
        // and a process for good. An ADD it interrupts is rolled back by DEL like any failed
        // one, and a blank reservation left anyway is reported and freed by the reconcile
        // (divergence/).
        let _ = child.start_kill();
        // Reaped here, not left a zombie until tokio's orphan queue runs on some later
        // SIGCHLD; bounded, since a process in uninterruptible sleep dies only when it wakes.
        let _ = tokio::time::timeout(REAP_AFTER_KILL, child.wait()).await;
    }
    if let Some(n) = noted {
        n.finish();
    }
    Gated::Ran(outcome(kind, binary, inv, timeout, started, pid, collected))
}

/// The delegate's command: the CNI variables, as from a runtime, and a PATH to find helpers
/// (host-local and iptables-based plugins shell out); nothing else of dipamd's environment
/// leaks into it.
fn command(binary: &Path, inv: &Invocation) -> Command {
    let mut cmd = Command::new(binary);
    cmd.env_clear()
        .env("CNI_COMMAND", &inv.command)
        .env("CNI_CONTAINERID", &inv.container_id)
        .env("CNI_NETNS", &inv.netns)
        .env("CNI_IFNAME", &inv.ifname)
        .env("CNI_ARGS", &inv.args)
        .env("CNI_PATH", &inv.path)
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // An ADD is never signalled because the future that awaits it was dropped (its RPC's
        // caller left, dipamd stopping): host-local killed between its O_EXCL create of
        // `<store>/<ip>` and writing the owner leaves an empty reservation that no DEL
        // matches, an address lost for good. It runs to its end, reaped by tokio once
        // abandoned, and a dipamd that stops meanwhile has its successor wait for it
        // (survivors.rs). Other commands reserve nothing (VERSION, CHECK, STATUS) or are
        // retried whole (DEL, GC): abandoned, they are killed, so that callers who leave
        // cannot pile up processes.
        .kill_on_drop(inv.command != "ADD");
    cmd
}

/// Lowers the CPU priority of the delegate `pid` by [`BACKGROUND_NICE`] below dipamd's own
/// (an operator who runs dipamd niced keeps the pool below it). Set from here, after the
/// exec, rather than in the child before it (`pre_exec` forces a full fork of dipamd): a Go
/// delegate spends its first milliseconds starting its runtime, and the priority is set
/// before it gets its config. Best effort: a delegate left at dipamd's priority only competes
/// as it used to.
fn lower_priority(kind: &str, pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| libc::id_t::try_from(p).ok()) else {
        return;
    };
    let nice = own_nice().saturating_add(BACKGROUND_NICE).min(MAX_NICE);
    // SAFETY: setpriority(2) takes integers only and touches none of this process's memory.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, nice) };
    if rc != 0 {
        debug!(delegate = kind, pid, error = %std::io::Error::last_os_error(), "could not lower a pool delegate's priority");
    }
}

/// The weakest priority Linux has.
const MAX_NICE: libc::c_int = 19;

/// dipamd's own nice value (0 when it cannot be read).
pub fn own_nice() -> libc::c_int {
    // getpriority(2) may return -1 as a value: errno tells an error apart.
    nix::errno::Errno::clear();
    // SAFETY: getpriority(2) takes integers only and touches none of this process's memory.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if n == -1 && nix::errno::Errno::last_raw() != 0 {
        return 0;
    }
    n
}

/// Writes the config to the delegate's stdin.
fn feed(child: &mut Child, inv: &Invocation) {
    if let Some(mut stdin) = child.stdin.take() {
        let input = inv.stdin.clone();
        // A delegate may exit without reading stdin; a broken pipe is then not our error.
        let mut write = Box::pin(async move {
            let _ = stdin.write_all(&input).await;
        });
        // A config fits the pipe's buffer (64 KiB): written here and now. A task of its own
        // (for a larger one) may wake the other worker, a hand-off the delegate's start pays.
        if futures_util::FutureExt::now_or_never(write.as_mut()).is_none() {
            tokio::spawn(write);
        }
    }
}

/// What the delegate's run came to: its output, or why there is none usable (too much
/// output, a failed wait, the timeout).
fn outcome(
    kind: &str,
    binary: &Path,
    inv: &Invocation,
    timeout: Duration,
    started: Instant,
    pid: Option<u32>,
    collected: Result<std::io::Result<std::process::Output>, tokio::time::error::Elapsed>,
) -> Result<Output, ShimError> {
    match collected {
        Ok(Ok(out)) => {
            let elapsed = started.elapsed();
            debug!(
                delegate = kind,
                command = %inv.command,
                pid,
                status = ?out.status,
                elapsed_ms = crate::l1_leaves::clock::log_ms(elapsed),
                "delegate exec finished"
            );
            Ok(Output {
                status: out.status,
                stdout: out.stdout,
                stderr: out.stderr,
                elapsed,
            })
        }
        // Killed (run_gated) for writing too much: unreadable output, 154. It may have
        // acted first, so an ADD's caller releases it as after any garbage (core/attach.rs).
        Ok(Err(source))
            if source
                .get_ref()
                .is_some_and(|e| e.downcast_ref::<TooMuchOutput>().is_some()) =>
        {
            warn!(delegate = kind, command = %inv.command, pid, limit = MAX_STDOUT, "delegate wrote more than its stdout limit; killed it");
            Err(ShimError::DelegateBadOutput {
                kind: kind.to_owned(),
                command: inv.command.clone(),
                exit: format!("killed by dipamd: {source}, the limit for a CNI result"),
                stdout: String::new(),
                stderr: String::new(),
            })
        }
        Ok(Err(source)) => Err(ShimError::DelegateSpawn {
            kind: kind.to_owned(),
            path: binary.to_owned(),
            source,
        }),
        // run_gated SIGKILLs it.
        Err(_) => Err(ShimError::DelegateTimeout {
            kind: kind.to_owned(),
            command: inv.command.clone(),
            timeout,
            stderr: String::new(),
        }),
    }
}

/// Where a delegate's stdout goes the moment it holds one complete JSON document.
pub type Peek = tokio::sync::oneshot::Sender<Vec<u8>>;

/// The most a delegate may write to stdout. A CNI result or error is a few KiB (a dual-stack
/// result with routes and DNS stays under 4 KiB); a delegate that writes more is broken, and
/// read without a limit it took dipamd to 114 MB with 100 MB of output. Beyond this the
/// delegate is killed and the call fails with 154, like any other unreadable output.
pub const MAX_STDOUT: usize = 1 << 20;

/// How much of a delegate's stderr is kept: its end, where a Go plugin's reason usually is
/// (error::excerpt quotes the last few hundred bytes). A chatty stderr is not a failure; the
/// rest is read and dropped, so the delegate never blocks on a full pipe.
pub const MAX_STDERR: usize = 64 << 10;

/// A delegate's output that outgrew [`MAX_STDOUT`]; carried in an `io::Error` out of
/// `collect`.
#[derive(Debug, thiserror::Error)]
#[error("it wrote more than {limit} bytes to stdout")]
pub struct TooMuchOutput {
    pub limit: usize,
}

/// A result larger than this is not peeked (each peek parses all of stdout so far); it is
/// taken up at the delegate's exit instead.
const PEEK_MAX: usize = 64 << 10;

/// `Child::wait_with_output`, which also hands stdout to `peek` as soon as it parses as one
/// complete JSON document.
///
/// Why: a CNI plugin writes its result and then exits, and a Go delegate's exit (tearing
/// down its threads and its address space) takes another 0.2-0.3 ms on the benchmark
/// machine before its stdout reaches EOF and its status can be reaped (perf sched,
/// docs/performance.md run 8). An ADD can use the result meanwhile; it still succeeds only
/// on exit 0 with the same stdout (core/attach.rs). A document that parses cannot be a prefix
/// of a longer one (serde_json refuses trailing non-whitespace), so a partial write is
/// never peeked.
async fn collect(child: &mut Child, peek: Option<Peek>) -> std::io::Result<std::process::Output> {
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // On an error (stdout over its limit) the caller kills it.
    let (status, stdout, stderr) = tokio::try_join!(
        child.wait(),
        read_all(stdout, peek, Limit::Fail(MAX_STDOUT)),
        read_all(stderr, None, Limit::KeepTail(MAX_STDERR))
    )?;
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// What [`read_all`] does with a stream that outgrows its limit.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// Fails with [`TooMuchOutput`] (stdout: a result that large is garbage).
    Fail(usize),
    /// Keeps reading, and keeps only the last this many bytes (stderr).
    KeepTail(usize),
}

async fn read_all(
    pipe: Option<impl AsyncRead + Unpin>,
    mut peek: Option<Peek>,
    limit: Limit,
) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let Some(mut pipe) = pipe else {
        return Ok(buf);
    };
    loop {
        buf.reserve(4096);
        if pipe.read_buf(&mut buf).await? == 0 {
            return Ok(buf);
        }
        match limit {
            Limit::Fail(max) if buf.len() > max => {
                return Err(std::io::Error::other(TooMuchOutput { limit: max }));
            }
            // Trimmed in steps of `max`, so that each byte is moved at most once or twice.
            Limit::KeepTail(max) if buf.len() > 2 * max => {
                buf.drain(..buf.len() - max);
            }
            _ => {}
        }
        if peek.is_some()
            && buf.len() <= PEEK_MAX
            && serde_json::from_slice::<serde::de::IgnoredAny>(&buf).is_ok()
        {
            let _ = peek.take().map(|tx| tx.send(buf.clone()));
        }
    }
}

/// Interprets a finished exec like libcni (pkg/invoke raw_exec): success is exit 0; a failure
/// carries a CNI error JSON on stdout, or else its stderr text is the message.
pub fn check(kind: &str, command: &str, out: &Output) -> Result<(), ShimError> {
    if out.status.success() {
        return Ok(());
    }
    #[derive(serde::Deserialize)]
    struct CniErr {
        #[serde(default)]
        code: u32,
        #[serde(default)]
        msg: String,
        #[serde(default)]
        details: String,
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stdout = stdout.trim();
    if stdout.is_empty() {
        let stderr = excerpt(&out.stderr);
        if stderr.is_empty() {
            return Err(ShimError::DelegateBadOutput {
                kind: kind.into(),
                command: command.into(),
                exit: out.describe_exit(),
                stdout: String::new(),
                stderr: String::new(),
            });
        }
        // libcni: "if stdout is empty, use stderr as the message".
        return Err(ShimError::Delegate(Box::new(DelegateFailure {
            kind: kind.into(),
            command: command.into(),
            code: crate::l1_leaves::error::codes::DELEGATE_BAD_OUTPUT,
            msg: stderr,
            details: String::new(),
            exit: out.describe_exit(),
            stderr: String::new(),
        })));
    }
    match serde_json::from_str::<CniErr>(stdout) {
        Ok(e) if !e.msg.is_empty() || e.code != 0 => {
            Err(ShimError::Delegate(Box::new(DelegateFailure {
                kind: kind.into(),
                command: command.into(),
                // Code 0 is reserved by the spec; Go's skel reports an untyped error as 999.
                code: if e.code == 0 { 999 } else { e.code },
                // Clipped here, where the delegate's text enters dipamd: the reply, the log
                // and the history all quote this (error.rs, DELEGATE_TEXT).
                msg: crate::l1_leaves::error::clip_delegate_text(e.msg),
                details: crate::l1_leaves::error::clip_delegate_text(e.details),
                exit: out.describe_exit(),
                stderr: excerpt(&out.stderr),
            })))
        }
        _ => Err(ShimError::DelegateBadOutput {
            kind: kind.into(),
            command: command.into(),
            exit: out.describe_exit(),
            stdout: excerpt(&out.stdout),
            stderr: excerpt(&out.stderr),
        }),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// An executable shell script `name` in `dir` running `body`: a delegate stand-in.
    pub(in crate::l2_core::delegate) fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn find_searches_in_order_and_rejects_paths() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let in_b = script(b.path(), "p", "true");
        let dirs = vec![a.path().to_owned(), b.path().to_owned()];
        assert_eq!(find("p", &dirs).unwrap(), in_b);
        let in_a = script(a.path(), "p", "true");
        assert_eq!(find("p", &dirs).unwrap(), in_a);
        assert!(matches!(
            find("missing", &dirs),
            Err(ShimError::DelegateNotFound { .. })
        ));
        assert!(matches!(find("../p", &dirs), Err(ShimError::Config { .. })));
    }

    #[tokio::test]
    async fn env_stdin_and_separate_streams() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "echo",
            "cat; echo \" $CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $CNI_NETNS\"; echo err >&2",
        );
        let inv = Invocation {
            command: "ADD".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/ns".into(),
            stdin: b"{\"x\":1}".to_vec(),
            ..Invocation::default()
        };
        let out = run("echo", &p, &inv, Duration::from_secs(5), None)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "{\"x\":1} ADD c1 eth0 /ns\n"
        );
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
        check("echo", "ADD", &out).unwrap();
    }

    /// The pool's execs run niced, a pod's at dipamd's own priority. The delegate reads its
    /// nice value (field 19 of /proc/self/stat) after its config: by then it is set.
    #[tokio::test]
    async fn the_pools_execs_run_at_a_lower_priority() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "nice",
            "cat >/dev/null; cut -d' ' -f19 /proc/$$/stat",
        );
        let nice = |background| {
            let p = p.clone();
            async move {
                let inv = Invocation {
                    background,
                    ..Invocation::default()
                };
                let out = run("nice", &p, &inv, Duration::from_secs(5), None)
                    .await
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<i32>()
                    .unwrap()
            }
        };
        let own = nice(false).await;
        let pooled = nice(true).await;
        assert_eq!(own, own_nice(), "a pod's exec at dipamd's priority");
        assert_eq!(pooled, (own + BACKGROUND_NICE).min(MAX_NICE));
    }

    #[tokio::test]
    async fn the_config_is_withheld_until_the_gate_succeeds() {
        let d = tempfile::tempdir().unwrap();
        let gate_done = d.path().join("gate-done");
        // The delegate reports whether the gate had finished when its config arrived.
        let p = script(
            d.path(),
            "probe",
            &format!(
                "cat >/dev/null; if [ -e {0} ]; then echo after; else echo before; fi",
                gate_done.display()
            ),
        );
        let gate = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::fs::write(&gate_done, b"").unwrap();
            Ok(())
        };
        let out = run_gated(
            "probe",
            &p,
            &Invocation::default(),
            Duration::from_secs(5),
            None,
            gate,
            None,
        )
        .await
        .into_result()
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "after\n");
    }

    /// stdout is peeked once it holds a whole document, written in pieces, and before the
    /// delegate has exited; the output is still all of it.
    #[tokio::test]
    async fn a_complete_document_is_peeked_before_the_exit() {
        let d = tempfile::tempdir().unwrap();
        let p = script(
            d.path(),
            "slow",
            "printf '{\"ips\":'; sleep 0.2; printf '[]}\\n'; sleep 0.5; echo bye >&2",
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inv = Invocation::default();
        let started = Instant::now();
        let run = run_gated(
            "slow",
            &p,
            &inv,
            Duration::from_secs(5),
            None,
            std::future::ready(Ok(())),
            Some(tx),
        );
        let peeked = async {
            let doc = rx.await.unwrap();
            (doc, started.elapsed())
        };
        let (out, (doc, at)) = tokio::join!(run, peeked);
        let out = out.into_result().unwrap();
        assert_eq!(
            doc, b"{\"ips\":[]}\n",
            "a partial write was peeked, or none"
        );
        assert!(
            at + Duration::from_millis(300) < out.elapsed,
            "peeked at {at:?}, the exec took {:?}",
            out.elapsed
        );
        assert_eq!(out.stdout, doc);
        assert_eq!(out.stderr, b"bye\n");
    }

    #[tokio::test]
    async fn a_failed_gate_kills_the_delegate_before_it_reads_its_config() {
        let d = tempfile::tempdir().unwrap();
        let acted = d.path().join("acted");
        let p = script(
            d.path(),
            "act",
            &format!("read line; echo \"$line\" > {}", acted.display()),
        );
        let inv = Invocation {
            stdin: b"{}\n".to_vec(),
            ..Invocation::default()
        };
        let gate = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err(ShimError::Internal("intent not durable".into()))
        };
        let Gated::GateFailed(e) =
            run_gated("act", &p, &inv, Duration::from_secs(5), None, gate, None).await
        else {
            panic!("the gate failed, yet the delegate was run");
        };
        assert!(matches!(e, ShimError::Internal(_)), "{e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!acted.exists(), "the delegate acted without its config");
    }

    /// stdout beyond its limit kills the delegate and fails with 154 (a garbage result);
    /// stderr beyond its limit is read to the end and only its tail kept.
    #[tokio::test]
    async fn output_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let flood = script(d.path(), "flood", "exec yes garbage");
        let e = run(
            "flood",
            &flood,
            &Invocation::default(),
            Duration::from_secs(30),
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ShimError::DelegateBadOutput { .. }), "{e}");
        assert_eq!(e.code_and_details().0, 154);
        let chatty = script(
            d.path(),
            "chatty",
            "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo the-end >&2; echo '{}'",
        );
        let out = run(
            "chatty",
            &chatty,
            &Invocation::default(),
            Duration::from_secs(30),
            None,
        )
        .await
        .unwrap();
        assert!(out.stderr.len() <= 2 * MAX_STDERR, "{}", out.stderr.len());
        assert!(out.stderr.ends_with(b"the-end\n"));
        assert_eq!(out.stdout, b"{}\n");
    }

    /// dipamd's own deadline kills a hung delegate, an ADD too (see run_gated for why).
    #[tokio::test]
    async fn a_hung_delegate_is_killed_at_the_timeout() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        let p = script(
            d.path(),
            "hang",
            &format!("echo $$ > {}; exec sleep 30", pid_file.display()),
        );
        for command in ["VERSION", "ADD"] {
            // The previous command's pid must not pass for this one's.
            let _ = std::fs::remove_file(&pid_file);
            let started = Instant::now();
            let inv = Invocation {
                command: command.into(),
                ..Invocation::default()
            };
            // 2 s, not less: on a loaded 2-core machine the shell can take longer than a
            // short timeout to write its pid, and the test then has no pid to check.
            let e = run("hang", &p, &inv, Duration::from_secs(2), None)
                .await
                .unwrap_err();
            assert!(matches!(e, ShimError::DelegateTimeout { .. }), "{e}");
            assert!(started.elapsed() < Duration::from_secs(15));
            let pid: i32 = std::fs::read_to_string(&pid_file)
                .unwrap_or_else(|e| panic!("{command}: the delegate wrote no pid within 2 s: {e}"))
                .trim()
                .parse()
                .unwrap();
            let gone = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
            });
            assert!(gone, "{command}: the hung delegate {pid} still runs");
        }
    }

    /// An ADD whose awaiting future is dropped (its caller left) runs to its end: killed
    /// between its create and its write, host-local leaves a reservation no DEL matches.
    /// Other commands are killed.
    #[tokio::test]
    async fn an_abandoned_add_runs_to_its_end_and_nothing_else_does() {
        let d = tempfile::tempdir().unwrap();
        for (command, finishes) in [("ADD", true), ("CHECK", false)] {
            let done = d.path().join(format!("done-{command}"));
            let p = script(
                d.path(),
                &format!("slow-{command}"),
                &format!("cat >/dev/null; sleep 0.3; touch {}", done.display()),
            );
            let inv = Invocation {
                command: command.into(),
                stdin: b"{}".to_vec(),
                ..Invocation::default()
            };
            let abandoned = tokio::time::timeout(
                Duration::from_millis(100),
                run("slow", &p, &inv, Duration::from_secs(5), None),
            )
            .await;
            assert!(
                abandoned.is_err(),
                "{command} ended before it was abandoned"
            );
            tokio::time::sleep(Duration::from_millis(800)).await;
            assert_eq!(done.exists(), finishes, "{command}");
        }
    }

    #[tokio::test]
    async fn failures_are_read_like_libcni() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            (
                "echo '{\"code\":999,\"msg\":\"dup\",\"details\":\"d\"}'; exit 1",
                Some(999),
            ),
            ("echo 'not json'; echo reason >&2; exit 2", None),
            ("echo 'only stderr' >&2; exit 1", Some(154)),
            ("kill -9 $$", None),
        ];
        for (i, (body, want)) in cases.iter().enumerate() {
            let p = script(d.path(), &format!("f{i}"), body);
            let out = run(
                "f",
                &p,
                &Invocation::default(),
                Duration::from_secs(5),
                None,
            )
            .await
            .unwrap();
            let e = check("f", "ADD", &out).unwrap_err();
            match (want, &e) {
                (Some(code), ShimError::Delegate(f)) => assert_eq!(*code, f.code),
                (None, ShimError::DelegateBadOutput { .. }) => {}
                _ => panic!("case {i}: {e:?}"),
            }
        }
    }
}
