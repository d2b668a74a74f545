//! What `dipamctl install` checks on the node before it installs a conflist, beyond the
//! conflist's own validity: that every plugin chained in it and every container runtime
//! installed on the node can take its cniVersion, and that the IPAM dipam delegates to is
//! installed where dipamd looks for it.
//!
//! Each of these fails every pod's ADD on the node, after the conflist is in place
//! (docs/sources.md §16): Debian 12's portmap and ptp (plugins 1.1.1) refuse a 1.1.0 config
//! ("plugin portmap does not support config version"), containerd 1.6/1.7 and podman 4
//! (libcni v1.1) cannot parse a 1.1.0 result ("unsupported CNI result version"), and a missing
//! delegate fails dipamd's exec of it. The plugins are asked, not assumed: `CNI_COMMAND=VERSION`
//! is answered by every CNI plugin with the versions it supports (SPEC.md §2, VERSION). The
//! runtimes are found in PATH and asked `--version`; a runtime not in PATH (an init container
//! sees none of the host's) is not checked, and the install's 1.1.0 warning stays for that case.
//!
//! One chain fails on every node, whatever is installed: an interface-creating plugin
//! (bridge, ptp, macvlan, ...) after dipam as the main plugin. Such a plugin ignores the
//! prevResult on ADD and creates the pod's interface, named CNI_IFNAME, itself, which dipam
//! already made: the reference bridge fails every ADD with "container veth name (\"eth0\")
//! ... already exists" (docs/compatibility.md; tests/lifecycle/tests/runtimes/libcni.rs).

use std::{
    ffi::OsStr,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use dipam_proto::cni::SUPPORTED_VERSIONS;
use serde_json::Value;

/// How long a plugin may take to answer VERSION: it prints a constant, so anything slower is
/// a plugin that hangs, and `install` must not hang with it.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

const FORCE_HINT: &str = "(--force=CHECK installs it anyway, CHECK naming what to override: \
                          cni-version, missing or chaining; --force alone overrides all three)";

/// The dipam plugin's type, never probed: it takes every version dipam supports.
const DIPAM: &str = "dipam";

/// The reference plugins that create the pod's interface themselves (their README's "Main:
/// interface-creating", docs/sources.md §17): after dipam's main mode, each finds CNI_IFNAME
/// taken.
const INTERFACE_CREATING: &[&str] = &[
    "bridge",
    "ptp",
    "macvlan",
    "ipvlan",
    "vlan",
    "host-device",
    "dummy",
    "tap",
];

/// One reason the conflist would fail on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error(
        "plugins[{index}] ({kind}, {path}) does not take cniVersion {version}: asked with CNI \
         VERSION it supports {}", supported.join(", ")
    )]
    PluginVersion {
        index: usize,
        kind: String,
        path: PathBuf,
        version: String,
        supported: Vec<String>,
    },
    #[error("plugins[{index}] ({kind}, {path}) did not answer CNI VERSION: {reason}")]
    PluginUnanswered {
        index: usize,
        kind: String,
        path: PathBuf,
        reason: ProbeError,
    },
    #[error(
        "plugins[{index}]: {role} {kind:?} is not installed: no executable {kind} in {}",
        dirs_list(dirs)
    )]
    NotInstalled {
        index: usize,
        role: &'static str,
        kind: String,
        dirs: Vec<PathBuf>,
    },
    #[error(
        "{runtime} {found} reads this conf dir ({path}; {reads}): {why}, so every pod's ADD \
         would fail at cniVersion {version}"
    )]
    Runtime {
        runtime: &'static str,
        found: String,
        path: PathBuf,
        reads: String,
        why: &'static str,
        version: String,
        /// The highest version it takes.
        max: &'static str,
    },
    #[error(
        "plugins[{index}] ({kind}) follows dipam as the main plugin (plugins[{main}]): {kind} \
         creates the pod's interface itself, which dipam has already created, so every pod's \
         ADD would fail at {kind} (\"container veth name ... already exists\"); use {kind} \
         with dipam as its IPAM instead (\"ipam\": {{\"type\": \"dipam\", \"delegate\": \
         ...}}, as in conflist/bridge-dipam-host-local.conflist), or dipam alone"
    )]
    InterfaceAfterMainMode {
        index: usize,
        main: usize,
        kind: String,
    },
}

fn dirs_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why `install` refused: every problem, and the cniVersion to use instead, if one fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub problems: Vec<Problem>,
    /// The highest cniVersion dipam, every chained plugin and every runtime found take, when
    /// a version is what is wrong.
    pub use_version: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the conflist would fail on this node:")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        if let Some(v) = &self.use_version {
            write!(
                f,
                "\nuse \"cniVersion\": \"{v}\", which they all take (1.1.0 only adds CNI GC \
                 and STATUS, which only containerd 2.0.1+ and CRI-O 1.32+ send)"
            )?;
        }
        if self
            .problems
            .iter()
            .any(|p| matches!(p, Problem::NotInstalled { .. }))
        {
            write!(
                f,
                "\ninstall the missing plugin (Debian: apt-get install \
                 containernetworking-plugins), or name the directory it is in with --cni-path"
            )?;
        }
        write!(f, "\n{FORCE_HINT}")
    }
}

impl std::error::Error for Refusal {}

/// `dipamctl install`'s flags for these checks.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeCheckArgs {
    /// Install the conflist despite the checks named (comma-separated): `cni-version` (a
    /// chained plugin, or a runtime that reads --conf-dir, cannot take its cniVersion),
    /// `missing` (a chained plugin or the delegate IPAM is not installed, or does not
    /// answer VERSION), `chaining` (an interface plugin after dipam as the main plugin).
    /// `--force` alone overrides all three. What was overridden is printed as a warning;
    /// every check not named still refuses.
    #[arg(
        long,
        value_name = "CHECKS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "all",
        value_delimiter = ','
    )]
    force: Vec<Force>,
    /// Where the conflist's plugins and its delegate IPAM are looked for, besides
    /// --cni-bin-dir: dipamd's --cni-path (colon-separated).
    #[arg(long, value_name = "DIRS", default_value = DEFAULT_CNI_PATH)]
    cni_path: String,
}

/// A check `--force` overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Force {
    /// Every check.
    All,
    /// A chained plugin or a runtime that cannot take the cniVersion.
    CniVersion,
    /// A plugin or the delegate that is not installed or does not answer.
    Missing,
    /// An interface plugin after dipam as the main plugin.
    Chaining,
}

impl Problem {
    /// The check this problem fails, as `--force` names it.
    fn check(&self) -> Force {
        match self {
            Self::PluginVersion { .. } | Self::Runtime { .. } => Force::CniVersion,
            Self::PluginUnanswered { .. } | Self::NotInstalled { .. } => Force::Missing,
            Self::InterfaceAfterMainMode { .. } => Force::Chaining,
        }
    }
}

/// dipamd's default --cni-path, where it looks for delegates.
pub const DEFAULT_CNI_PATH: &str = "/opt/cni/bin:/usr/lib/cni";

impl NodeCheckArgs {
    /// The check, judging by `runtimes`: those that read the conf dir (conf_readers.rs).
    pub fn resolve(self, runtimes: Vec<Runtime>) -> NodeCheck {
        NodeCheck {
            force: self.force,
            dirs: std::env::split_paths(&self.cni_path).collect(),
            runtimes,
        }
    }
}

/// The checks `install` makes of a conflist on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCheck {
    /// The checks `--force` overrides.
    pub force: Vec<Force>,
    /// Where plugins are looked for after the CNI bin directory.
    pub dirs: Vec<PathBuf>,
    pub runtimes: Vec<Runtime>,
}

impl NodeCheck {
    /// `Err` with the refusal, or with --force `Ok(Some)` with it for a warning.
    pub fn run(&self, conflist: &[u8], cni_bin_dir: &Path) -> Result<Option<String>, Refusal> {
        let mut dirs = vec![cni_bin_dir.to_owned()];
        dirs.extend(self.dirs.iter().filter(|d| *d != cni_bin_dir).cloned());
        let forced = |p: &Problem| {
            self.force
                .iter()
                .any(|f| *f == Force::All || *f == p.check())
        };
        match check(conflist, &dirs, &self.runtimes) {
            Ok(()) => Ok(None),
            // Every problem overridden: the refusal becomes the warning (without the hint to
            // use --force, which was used).
            Err(r) if r.problems.iter().all(forced) => {
                Ok(Some(r.to_string().replace(&format!("\n{FORCE_HINT}"), "")))
            }
            Err(r) => Err(r),
        }
    }
}

/// A container runtime found on the node, with the highest cniVersion it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub name: &'static str,
    pub version: String,
    pub path: PathBuf,
    /// The highest cniVersion whose result it parses; `None`: every version dipam speaks.
    pub max: Option<&'static str>,
    pub why: &'static str,
    /// How it is known to read the conf dir (conf_readers.rs).
    pub reads: String,
}

impl Runtime {
    /// With how it is known to read the conf dir.
    pub fn reading(mut self, reads: String) -> Self {
        self.reads = reads;
        self
    }
}

/// The runtimes dipam knows the cniVersion limits of: containerd before 2, podman 4 and
/// CRI-O before 1.32 are built on libcni v1.1, which cannot parse a 1.1.0 result
/// (docs/sources.md §1, §10.4, §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    Containerd,
    Podman,
    Crio,
}

impl RuntimeKind {
    /// Its binary's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Podman => "podman",
            Self::Crio => "crio",
        }
    }

    /// Its binary in `path` (a PATH value), if installed there.
    pub fn in_path(self, path: &OsStr) -> Option<PathBuf> {
        std::env::split_paths(path)
            .map(|d| d.join(self.name()))
            .find(|p| is_executable(p))
    }

    /// The runtime `run --version` says it is, shown as `path`; `None` when it does not say.
    pub fn judge(self, run: &Path, path: &Path) -> Option<Runtime> {
        // The first (major, minor) whose libcni parses a 1.1.0 result.
        let (first_ok, why) = match self {
            Self::Containerd => (
                (2, 0),
                "containerd before 2.0 (libcni v1.1) cannot parse a 1.1.0 result",
            ),
            Self::Podman => (
                (5, 0),
                "podman 4 (libcni v1.1, its CNI backend) cannot parse a 1.1.0 result",
            ),
            Self::Crio => (
                (1, 32),
                "CRI-O before 1.32 (libcni v1.1, through ocicni before v0.4.3) cannot parse a 1.1.0 result",
            ),
        };
        let version = runtime_version(run)?;
        let mut parts = version
            .split(['.', '-', '~', '+'])
            .map(|p| p.parse::<u32>().ok());
        let at = (parts.next().flatten(), parts.next().flatten().unwrap_or(0));
        Some(Runtime {
            name: self.name(),
            max: at
                .0
                .filter(|major| (*major, at.1) < first_ok)
                .map(|_| "1.0.0"),
            version,
            path: path.to_owned(),
            why,
            reads: String::new(),
        })
    }
}

/// The runtimes installed in `path` (a PATH value) that dipam knows the limits of, whatever
/// directory they read (conf_readers.rs chooses among them).
pub fn find_runtimes(path: &OsStr) -> Vec<Runtime> {
    [
        RuntimeKind::Containerd,
        RuntimeKind::Podman,
        RuntimeKind::Crio,
    ]
    .into_iter()
    .filter_map(|k| k.in_path(path).and_then(|bin| k.judge(&bin, &bin)))
    .collect()
}

/// `containerd --version` prints "containerd github.com/containerd/containerd 1.6.20~ds1 …"
/// (v2: "… containerd/v2 v2.4.2 …"); `podman --version` "podman version 4.3.1"; `crio
/// --version` "crio version 1.36.3" and then more lines. The first
/// word that starts with a digit (after an optional `v`) is the version.
fn runtime_version(bin: &Path) -> Option<String> {
    let out = run_with_timeout(Command::new(bin).arg("--version"), None).ok()?;
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .skip(1)
        .map(|w| w.strip_prefix('v').unwrap_or(w))
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_owned)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A plugin's binary in the first of `dirs` that has it, as a runtime and dipamd find it.
fn find_plugin(kind: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if kind.contains('/') || kind.is_empty() {
        return None;
    }
    dirs.iter().map(|d| d.join(kind)).find(|p| is_executable(p))
}

/// Why a plugin gave no usable answer to CNI VERSION (or `--version`). Kept as text where
/// the cause is an I/O error, so that a [`Problem`] compares equal in tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Io(String),
    #[error("no answer within {}s", VERSION_TIMEOUT.as_secs())]
    Timeout,
    #[error("{status}: {stdout}")]
    Exit { status: String, stdout: String },
    #[error("its answer is not JSON ({error}): {answer:?}")]
    NotJson { error: String, answer: String },
    #[error("its answer has no supportedVersions: {0}")]
    NoVersions(Value),
}

impl From<std::io::Error> for ProbeError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

/// The versions `bin` supports, from its answer to CNI VERSION.
pub fn plugin_versions(bin: &Path, version: &str) -> Result<Vec<String>, ProbeError> {
    let stdin = serde_json::json!({ "cniVersion": version }).to_string();
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("CNI_COMMAND", "VERSION")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let out = run_with_timeout(&mut cmd, Some(stdin.as_bytes()))?;
    let v: Value = serde_json::from_slice(&out).map_err(|e| ProbeError::NotJson {
        error: e.to_string(),
        answer: String::from_utf8_lossy(&out).into_owned(),
    })?;
    v["supportedVersions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .ok_or_else(|| ProbeError::NoVersions(v.clone()))
}

/// Runs `cmd` with `stdin`, and returns its stdout if it exits 0 within the timeout.
fn run_with_timeout(cmd: &mut Command, stdin: Option<&[u8]>) -> Result<Vec<u8>, ProbeError> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin that exits without reading gives EPIPE: its exit status says the rest.
        let _ = pipe.write_all(stdin.unwrap_or_default());
    }
    let deadline = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        match child.try_wait()? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProbeError::Timeout);
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let mut out = Vec::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut out)?;
    }
    if !status.success() {
        return Err(ProbeError::Exit {
            status: status.to_string(),
            stdout: String::from_utf8_lossy(&out).trim().to_owned(),
        });
    }
    Ok(out)
}

/// The plugins a conflist runs, by index: each chained plugin's type and the IPAM a non-dipam
/// plugin runs itself (both get the conflist's version from the runtime), and the IPAM dipam
/// delegates to (dipamd converts its results, so only its presence matters).
#[derive(Debug, Default)]
struct Plugins {
    chained: Vec<(usize, String)>,
    delegates: Vec<(usize, String)>,
}

fn plugins_of(list: &Value) -> Plugins {
    let mut p = Plugins::default();
    for (i, plugin) in list["plugins"].as_array().into_iter().flatten().enumerate() {
        let kind = plugin["type"].as_str().unwrap_or_default();
        let ipam = plugin["ipam"]["type"].as_str().unwrap_or_default();
        if kind == DIPAM {
            p.delegates.push((i, ipam.to_owned()));
            continue;
        }
        p.chained.push((i, kind.to_owned()));
        if ipam == DIPAM {
            if let Some(d) = plugin["ipam"]["delegate"]["type"].as_str() {
                p.delegates.push((i, d.to_owned()));
            }
        } else if !ipam.is_empty() {
            p.chained.push((i, ipam.to_owned()));
        }
    }
    p
}

/// The interface-creating plugins chained after dipam as the main plugin.
fn interfaces_after_main_mode(list: &Value) -> Vec<Problem> {
    let plugins = list["plugins"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let Some(main) = plugins.iter().position(|p| p["type"] == DIPAM) else {
        return Vec::new();
    };
    plugins
        .iter()
        .enumerate()
        .skip(main + 1)
        .filter_map(|(index, p)| {
            let kind = p["type"].as_str()?;
            INTERFACE_CREATING
                .contains(&kind)
                .then(|| Problem::InterfaceAfterMainMode {
                    index,
                    main,
                    kind: kind.to_owned(),
                })
        })
        .collect()
}

/// Checks `conflist` (already valid for dipam) against the plugins in `dirs` and the
/// `runtimes` found on the node; `Ok` when every pod's ADD can work as far as that shows.
pub fn check(conflist: &[u8], dirs: &[PathBuf], runtimes: &[Runtime]) -> Result<(), Refusal> {
    let Ok(list) = serde_json::from_slice::<Value>(conflist) else {
        return Ok(());
    };
    let version = list["cniVersion"].as_str().unwrap_or_default().to_owned();
    let plugins = plugins_of(&list);
    let mut problems = interfaces_after_main_mode(&list);
    // The versions every probed plugin and runtime take, narrowed as they answer.
    let mut fits: Vec<&str> = SUPPORTED_VERSIONS.to_vec();
    for (index, kind) in &plugins.chained {
        let Some(path) = find_plugin(kind, dirs) else {
            problems.push(Problem::NotInstalled {
                index: *index,
                role: "the chained plugin",
                kind: kind.clone(),
                dirs: dirs.to_vec(),
            });
            continue;
        };
        match plugin_versions(&path, &version) {
            Ok(supported) => {
                fits.retain(|v| supported.iter().any(|s| s == v));
                if !supported.contains(&version) {
                    problems.push(Problem::PluginVersion {
                        index: *index,
                        kind: kind.clone(),
                        path,
                        version: version.clone(),
                        supported,
                    });
                }
            }
            Err(reason) => problems.push(Problem::PluginUnanswered {
                index: *index,
                kind: kind.clone(),
                path,
                reason,
            }),
        }
    }
    for (index, kind) in &plugins.delegates {
        if find_plugin(kind, dirs).is_none() {
            problems.push(Problem::NotInstalled {
                index: *index,
                role: "the delegate IPAM",
                kind: kind.clone(),
                dirs: dirs.to_vec(),
            });
        }
    }
    for r in runtimes {
        let Some(max) = r.max else { continue };
        let rank = |v: &str| SUPPORTED_VERSIONS.iter().position(|s| *s == v);
        fits.retain(|v| rank(v) <= rank(max));
        if rank(&version) > rank(max) {
            problems.push(Problem::Runtime {
                runtime: r.name,
                found: r.version.clone(),
                path: r.path.clone(),
                reads: r.reads.clone(),
                why: r.why,
                version: version.clone(),
                max,
            });
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let version_is_wrong = problems
        .iter()
        .any(|p| matches!(p, Problem::PluginVersion { .. } | Problem::Runtime { .. }));
    Err(Refusal {
        problems,
        use_version: version_is_wrong
            .then(|| fits.last().map(|v| (*v).to_owned()))
            .flatten(),
    })
}

/// Waits until a script a test just wrote can be exec'd (it ran once; see `text_busy`).
#[cfg(test)]
pub(crate) fn wait_until_runnable(p: &Path) {
    crate::text_busy::retry(&p, || Command::new(p).stdin(Stdio::null()).output());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A plugin that answers VERSION with `versions`, as the reference plugins' skel does.
    fn plugin(dir: &Path, name: &str, versions: &[&str]) {
        let list = serde_json::to_string(versions).unwrap();
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\ncat >/dev/null\necho '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":{list}}}'\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        wait_until_runnable(&p);
    }

    const OLD: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

    fn main_mode(version: &str, chained: &str) -> Vec<u8> {
        let mut v = serde_json::json!({
            "cniVersion": version, "name": "n",
            "plugins": [{"type": "dipam", "ipam": {"type": "host-local"}}],
        });
        if !chained.is_empty() {
            v["plugins"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"type": chained}));
        }
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn a_chained_plugin_that_stops_at_1_0_0_refuses_1_1_0_and_names_1_0_0() {
        let d = tempfile::tempdir().unwrap();
        plugin(d.path(), "host-local", OLD);
        plugin(d.path(), "portmap", OLD);
        let dirs = [d.path().to_owned()];
        let r = check(&main_mode("1.1.0", "portmap"), &dirs, &[]).unwrap_err();
        assert_eq!(r.use_version.as_deref(), Some("1.0.0"));
        let text = r.to_string();
        assert!(
            text.contains("plugins[1] (portmap") && text.contains("\"cniVersion\": \"1.0.0\""),
            "{text}"
        );
        assert!(text.contains("--force"), "{text}");
        assert_eq!(check(&main_mode("1.0.0", "portmap"), &dirs, &[]), Ok(()));
        // A delegate that stops at 1.0.0 is fine at 1.1.0: dipamd converts its results.
        assert_eq!(check(&main_mode("1.1.0", ""), &dirs, &[]), Ok(()));
    }

    #[test]
    fn an_interface_plugin_after_main_mode_is_refused_naming_ipam_mode() {
        let d = tempfile::tempdir().unwrap();
        plugin(d.path(), "host-local", OLD);
        plugin(d.path(), "bridge", OLD);
        plugin(d.path(), "portmap", OLD);
        let dirs = [d.path().to_owned()];
        let r = check(&main_mode("1.0.0", "bridge"), &dirs, &[]).unwrap_err();
        assert_eq!(r.use_version, None, "no version would help");
        assert_eq!(
            r.problems,
            vec![Problem::InterfaceAfterMainMode {
                index: 1,
                main: 0,
                kind: "bridge".into()
            }]
        );
        let text = r.to_string();
        assert!(
            text.contains("plugins[1] (bridge) follows dipam as the main plugin (plugins[0])")
                && text.contains("bridge-dipam-host-local.conflist")
                && text.contains("--force"),
            "{text}"
        );
        // portmap after main mode is the shipped chain; bridge over dipam's IPAM is fine.
        assert_eq!(check(&main_mode("1.0.0", "portmap"), &dirs, &[]), Ok(()));
        let ipam_mode = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [
            {"type": "bridge", "ipam": {"type": "dipam", "delegate": {"type": "host-local"}}},
        ]});
        assert_eq!(
            check(&serde_json::to_vec(&ipam_mode).unwrap(), &dirs, &[]),
            Ok(())
        );
    }

    #[test]
    fn a_missing_delegate_or_chained_plugin_is_named_with_the_directories() {
        let d = tempfile::tempdir().unwrap();
        let dirs = [d.path().to_owned()];
        let r = check(&main_mode("1.0.0", "portmap"), &dirs, &[]).unwrap_err();
        assert_eq!(r.use_version, None, "no version would help");
        assert_eq!(r.problems.len(), 2, "{r}");
        let text = r.to_string();
        assert!(
            text.contains("the delegate IPAM \"host-local\" is not installed")
                && text.contains(&d.path().display().to_string()),
            "{text}"
        );
    }

    #[test]
    fn an_old_runtime_refuses_1_1_0_and_a_new_one_does_not() {
        let d = tempfile::tempdir().unwrap();
        plugin(d.path(), "host-local", OLD);
        let dirs = [d.path().to_owned()];
        let old = Runtime {
            name: "containerd",
            version: "1.6.20~ds1".into(),
            path: "/usr/bin/containerd".into(),
            max: Some("1.0.0"),
            why: "old",
            reads: "runs as pid 1".into(),
        };
        let r = check(&main_mode("1.1.0", ""), &dirs, std::slice::from_ref(&old)).unwrap_err();
        assert_eq!(r.use_version.as_deref(), Some("1.0.0"));
        assert!(r.to_string().contains("containerd 1.6.20~ds1"), "{r}");
        assert_eq!(
            check(&main_mode("1.0.0", ""), &dirs, std::slice::from_ref(&old)),
            Ok(())
        );
        let new = Runtime {
            version: "2.4.2".into(),
            max: None,
            ..old
        };
        assert_eq!(check(&main_mode("1.1.0", ""), &dirs, &[new]), Ok(()));
    }

    #[test]
    fn runtimes_are_found_in_path_with_their_versions() {
        let d = tempfile::tempdir().unwrap();
        for (name, line) in [
            (
                "containerd",
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1",
            ),
            ("podman", "podman version 5.2.0"),
        ] {
            let p = d.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\necho '{line}'\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            wait_until_runnable(&p);
        }
        let found = find_runtimes(d.path().as_os_str());
        let short: Vec<_> = found
            .iter()
            .map(|r| (r.name, r.version.as_str(), r.max))
            .collect();
        assert_eq!(
            short,
            vec![
                ("containerd", "1.6.20~ds1", Some("1.0.0")),
                ("podman", "5.2.0", None)
            ]
        );
        assert!(find_runtimes(OsStr::new("/nonexistent")).is_empty());
    }
}
