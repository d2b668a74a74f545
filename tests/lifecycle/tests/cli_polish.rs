//! dipamctl and dipamd as a shell user meets them: `--version` names the git commit the
//! binaries were built from (shim-server/build.rs), and output cut off by its reader
//! (`dipamctl attachments --json | head -1`) ends quietly, with status 0 and nothing on
//! stderr.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::fd::{FromRawFd, OwnedFd},
    process::{Command, Stdio},
};

use dipam_lifecycle::{Dipamd, bins, require_root};

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
