//! A command a test needs to succeed: when it fails, the test fails saying which command it
//! was, how it ended and what it printed, so the report names the step that broke.

use std::{
    fs::File,
    path::Path,
    process::{Child, Command, Output, Stdio},
};

/// Runs `cmd` to its end and returns its output, failing the test if it did not succeed.
#[track_caller]
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    succeeded(&out, &format!("{cmd:?}"));
    out
}

/// The stdout of `out`, which must have succeeded; when it did not, the test fails with its
/// exit status, stdout and stderr.
#[track_caller]
pub fn ok(out: &Output) -> String {
    ok_named("the command", out)
}

/// [`ok`], naming in a failure what `out` was the output of (`kubectl [..]`, a script).
#[track_caller]
pub fn ok_named(what: &str, out: &Output) -> String {
    succeeded(out, what);
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// The stdout of `out`, which must have succeeded, as the JSON document it must be
/// (`dipamctl ... --json`).
#[track_caller]
pub fn json(out: &Output) -> serde_json::Value {
    let stdout = ok(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[track_caller]
fn succeeded(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `path` opened for appending: one log across a daemon's restarts, each start's lines after
/// the last's, so that a failure's report shows them in order.
pub fn append_log(path: &Path) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("log {}: {e}", path.display()))
}

/// Starts `cmd` as one of the harness's daemons (containerd, CRI-O, dipamd): no stdin, its
/// stderr appended to `log` (see [`append_log`]), nothing on the test's own output.
pub fn spawn_daemon(cmd: &mut Command, log: File) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

/// Starts `cmd` with stdin, stdout and stderr piped: a plugin or a client the test talks to.
pub fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}
