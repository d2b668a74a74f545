//! A command a test needs to succeed: when it fails, the test fails saying which command it
//! was, how it ended and what it printed, so the report names the step that broke.

use std::process::{Command, Output};

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
