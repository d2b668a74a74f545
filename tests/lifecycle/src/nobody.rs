//! Runs a command as a real non-root caller, uid and gid 65534 ("nobody") with no
//! supplementary groups, through util-linux's `setpriv`: the shape of a rootless runtime or
//! any local user reaching dipamd's socket. The environment is cleared but for `PATH` and
//! what the caller passes, as a runtime passes a plugin only the CNI variables.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// uid and gid of the non-root caller.
pub const NOBODY: &str = "65534";

/// dipamd's flags that let nobody in: the socket's group and an allowed uid. Each test of a
/// non-root caller starts from this one set and adds the limit or store it is about.
pub const ALLOWED: [&str; 4] = ["--socket-group", NOBODY, "--allow-uid", NOBODY];

/// [`ALLOWED`] followed by `extra`: one flag list for [`crate::Lab::with_flags`].
pub fn allowed_and<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = ALLOWED.to_vec();
    flags.extend_from_slice(extra);
    flags
}

/// Runs `cmd` as nobody with `env`, writing `stdin` to it, and returns its output.
pub fn run(cmd: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .args(cmd)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())
        .expect("write the command's stdin");
    child.wait_with_output().expect("wait for the command")
}

/// nobody runs the dipam plugin as the IPAM plugin (as ptp would) for `cid`; its JSON answer
/// (`null` when it printed none).
pub fn ipam(command: &str, cid: &str, conf: &serde_json::Value) -> serde_json::Value {
    ipam_with_args(command, cid, "", conf)
}

/// [`ipam`] with `CNI_ARGS` (a CRI runtime's names the pod).
pub fn ipam_with_args(
    command: &str,
    cid: &str,
    args: &str,
    conf: &serde_json::Value,
) -> serde_json::Value {
    let dipam = crate::bins::bin("dipam").display().to_string();
    let out = run(
        &[&dipam],
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/nobodys"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", args),
            ("CNI_PATH", &crate::bins::cni_path()),
        ],
        &conf.to_string(),
    );
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}
