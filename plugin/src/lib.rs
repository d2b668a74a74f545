//! The dipam CNI plugin. It validates what the runtime sent (docs/sources.md §2), answers
//! VERSION itself, and forwards every other verb to dipamd over gRPC ("CNI over RPC"), which
//! runs the delegated IPAM and records the attachment. As the main plugin it also builds the
//! pod's datapath (a veth pair, addresses, routes: `datapath`). See docs/cfp.md.
//!
//! Output discipline: stdout carries exactly one CNI result or error JSON; logs go to stderr.

pub mod client;
pub mod cmd;
pub mod conf;
pub mod datapath;
pub mod env;
pub mod error;
pub mod help;
pub mod lock;
pub mod retry;
pub mod spool;

use std::io::{Read, Write};

use rscni_types::types::Cmd;
use serde_json::json;

use crate::{
    cmd::Ctx,
    conf::PluginConf,
    env::CmdArgs,
    error::{CniError, PluginError},
};

/// Runs one plugin invocation and returns the process exit code. Everything the process
/// would read from its surroundings is injected so that tests drive it in memory.
pub fn run(
    argv: &[String],
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32 {
    if argv
        .iter()
        .skip(1)
        .any(|a| a == "--help" || a == "-h" || a == "help")
    {
        let _ = writeln!(stdout, "{}", help::text());
        return 0;
    }
    if argv.iter().skip(1).any(|a| a == "--version" || a == "-V") {
        let _ = writeln!(stdout, "dipam {}", env!("CARGO_PKG_VERSION"));
        return 0;
    }
    let command = match env::command(getenv) {
        Ok(Some(c)) => c,
        // skel's "about" mode: no CNI_COMMAND prints what the plugin is, on stderr.
        Ok(None) => {
            let _ = writeln!(
                stderr,
                "dipam {}: CNI plugin forwarding to dipamd\nCNI protocol versions supported: \
                 {}\n(run `dipam --help` for more)",
                env!("CARGO_PKG_VERSION"),
                dipam_proto::cni::supported_versions_list()
            );
            return 0;
        }
        Err(e) => return emit_error(stdout, "", &e.to_cni(false)),
    };

    let mut input = Vec::new();
    // A network config is a few KiB; refuse to hold (and send) more than dipamd accepts.
    let read = stdin
        .take(max_config_bytes(command) + 1)
        .read_to_end(&mut input);
    if command == Cmd::Version {
        let _ = writeln!(stdout, "{}", cmd::version::reply(&input));
        return 0;
    }
    let is_status = command == Cmd::Status;
    let version = conf::error_version(&input);
    let outcome = read
        .map_err(PluginError::Stdin)
        .and_then(|_| dispatch(command, getenv, &input));
    match outcome {
        Ok(out) => {
            if !out.is_empty() {
                let _ = stdout.write_all(&out);
                let _ = stdout.write_all(b"\n");
            }
            let _ = stdout.flush();
            0
        }
        Err(e) => emit_error(stdout, &version, &e.to_cni(is_status)),
    }
}

/// The largest network config the plugin reads (dipamd's request limit is the same).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The largest GC config: its `cni.dev/valid-attachments` names every attachment of the
/// node (about 100 bytes each, CNI spec 1.1 §GC), so 1 MiB refused a GC above about 5,300
/// pods; 16 MiB is room for 160,000, and dipamd accepts the same (access.rs).
pub const MAX_GC_CONFIG_BYTES: u64 = 16 << 20;

/// The config limit of `command`.
pub fn max_config_bytes(command: Cmd) -> u64 {
    if command == Cmd::Gc {
        MAX_GC_CONFIG_BYTES
    } else {
        MAX_CONFIG_BYTES
    }
}

fn dispatch(
    command: Cmd,
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
) -> Result<Vec<u8>, PluginError> {
    let max = max_config_bytes(command);
    if stdin.len() as u64 > max {
        return Err(PluginError::Config {
            msg: format!("network config larger than {} MiB", max >> 20),
            details: "a network config is a few KiB; check what the runtime writes on stdin".into(),
        });
    }
    // Order as in the reference skel: environment first, then the config.
    let args = CmdArgs::from_env(command, getenv)?;
    let conf = PluginConf::parse(stdin, command)?;
    let request_id = request_id();
    let ctx = Ctx {
        args: &args,
        conf: &conf,
        stdin,
        request_id: &request_id,
        issued_at_ms: wall_clock_ms(),
        issued_at: boot_stamp(),
    };
    match command {
        Cmd::Add => cmd::add::run(&ctx),
        Cmd::Del if conf.self_delegated => {
            eprintln!(
                "dipam: DEL of a config that names dipam as its own delegate: nothing can have \
                 been allocated through it; fix ipam.delegate.type"
            );
            Ok(Vec::new())
        }
        Cmd::Del => cmd::del::run(&ctx),
        Cmd::Check => cmd::check::run(&ctx),
        Cmd::Gc => cmd::gc::run(&ctx),
        Cmd::Status => cmd::status::run(&ctx),
        Cmd::Version => Ok(cmd::version::reply(stdin).to_string().into_bytes()),
    }
}

/// The wall-clock stamp a request carries (Unix ms): for logs and the spool's file names only;
/// nothing is ordered by it, since the wall clock steps (tests/lifecycle/tests/daemon/clock.rs steps
/// the machine's clock to prove it).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Now, on the clock dipamd orders a key's operations by: CLOCK_BOOTTIME, which is never
/// set or stepped (unlike the wall clock, which NTP or an operator may step back), with the
/// boot id that makes it comparable across processes of one boot. `None` if either cannot be
/// read: dipamd then leaves the request unordered (a DEL runs).
pub fn boot_stamp() -> Option<dipam_proto::v1::BootStamp> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let ns = u64::try_from(t.tv_sec())
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(t.tv_nsec()).ok()?)?;
    Some(dipam_proto::v1::BootStamp {
        boot_id: boot_id.trim().to_owned(),
        ns,
    })
}

/// Prints a CNI error on stdout (where libcni reads it) carrying the config's cniVersion
/// (spec §5 "Error"), and returns the non-zero exit code.
fn emit_error(stdout: &mut dyn Write, version: &str, e: &CniError) -> i32 {
    let mut body = json!({ "code": e.code, "msg": e.msg });
    if !version.is_empty() {
        body["cniVersion"] = json!(version);
    }
    if !e.details.is_empty() {
        body["details"] = json!(e.details);
    }
    let _ = writeln!(stdout, "{body}");
    let _ = stdout.flush();
    1
}

/// A per-invocation id that dipamd logs with everything it does for this call, so one grep
/// follows a pod's ADD from the plugin through dipamd into the delegate exec.
fn request_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{:08x}{:08x}",
        std::process::id(),
        (nanos & 0xffff_ffff) as u32
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::Value;

    use super::*;

    fn invoke(env: &[(&str, &str)], stdin: &str) -> (i32, Value) {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let getenv = move |k: &str| map.get(k).cloned();
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = run(
            &["dipam".into()],
            &getenv,
            &mut stdin.as_bytes(),
            &mut out,
            &mut err,
        );
        let v = serde_json::from_slice(&out).unwrap_or(Value::Null);
        (code, v)
    }

    #[test]
    fn version_needs_no_daemon_and_no_stdin() {
        let (code, v) = invoke(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(code, 0);
        assert_eq!(v["supportedVersions"].as_array().map(Vec::len), Some(5));
    }

    #[test]
    fn errors_carry_the_config_version_and_exit_non_zero() {
        let (code, v) = invoke(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "eth0"),
            ],
            r#"{"cniVersion":"0.4.0","name":"n"}"#,
        );
        assert_eq!(code, 1);
        assert_eq!(v["code"], 4);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert!(v["msg"].as_str().unwrap().contains("CNI_NETNS"), "{v}");
    }

    #[test]
    fn del_with_the_daemon_down_is_spooled_where_dipamd_drains_or_fails_with_11() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("dipam.sock");
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{{"type":"dipam","socketPath":"{}","timeoutSeconds":1,"delegate":{{"type":"host-local"}}}}}}"#,
            socket.display()
        );
        let env = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        // No dipamd ever served this socket: nothing would replay a spooled DEL.
        let (code, v) = invoke(&env, &conf);
        assert_eq!(code, 1);
        assert_eq!(v["code"], 11, "{v}");
        assert!(
            v["details"]
                .as_str()
                .unwrap()
                .contains("no dipamd has published a spool"),
            "{v}"
        );
        // dipamd published its spool beside the socket (and is down now).
        let spool = dir.path().join("state").join("spool");
        std::fs::create_dir_all(&spool).unwrap();
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
        let m = std::fs::metadata(&spool).unwrap();
        let pointer = dipam_proto::spool::Pointer {
            dir: spool.clone(),
            dev: m.dev(),
            ino: m.ino(),
        };
        std::fs::write(dipam_proto::spool::pointer_path(&socket), pointer.to_json()).unwrap();
        let (code, v) = invoke(&env, &conf);
        assert_eq!(code, 0, "{v}");
        let files: Vec<_> = std::fs::read_dir(&spool).unwrap().collect();
        assert_eq!(files.len(), 1);
        // ADD is never spooled: it needs an answer.
        let (code, _) = invoke(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", "/x"),
            ],
            &conf,
        );
        assert_eq!(code, 1);
    }

    #[test]
    fn unreachable_daemon_is_11_for_add_and_50_for_status() {
        let conf = r#"{"cniVersion":"1.1.0","name":"n","type":"ptp","ipam":{"type":"dipam","socketPath":"/nonexistent/dipam.sock","timeoutSeconds":1,"delegate":{"type":"host-local"}}}"#;
        let (code, v) = invoke(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", "/var/run/netns/x"),
            ],
            conf,
        );
        assert_eq!(code, 1);
        assert_eq!(v["code"], 11, "{v}");
        assert!(
            v["details"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/dipam.sock")
        );
        let (code, v) = invoke(&[("CNI_COMMAND", "STATUS")], conf);
        assert_eq!(code, 1);
        assert_eq!(v["code"], 50, "{v}");
    }
}
