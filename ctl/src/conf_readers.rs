//! Which container runtimes read the CNI configuration directory `install` writes to: the
//! ones whose cniVersion limits judge the conflist (compat.rs). A runtime in PATH that reads
//! another directory never sees the conflist, and judging by it refused good installs: a
//! 1.1.0 conflist for a directory containerd 2.4 reads was refused because Debian's
//! containerd 1.6 and podman 4 were also installed, reading /etc/cni/net.d.
//!
//! Each runtime names its directory in its own configuration:
//! - containerd: the CRI plugin's `cni.conf_dir` (config version 2:
//!   `[plugins."io.containerd.grpc.v1.cri".cni]`; version 3, containerd 2:
//!   `[plugins."io.containerd.cri.v1.runtime".cni]`), in the file given with `--config`/`-c`,
//!   else /etc/containerd/config.toml; default /etc/cni/net.d
//!   (<https://github.com/containerd/containerd/blob/main/docs/cri/config.md>);
//! - CRI-O: `[crio.network] network_dir` of its config (`--config`/`-c`, else
//!   /etc/crio/crio.conf) and then of every file under its drop-in directory
//!   (`--config-dir`/`-d`, else /etc/crio/crio.conf.d, walked in lexical order, a later file
//!   winning), which `--cni-config-dir` (or `CONTAINER_CNI_CONFIG_DIR`) overrides; default
//!   /etc/cni/net.d/ (crio.conf(5); cri-o v1.36.3 `internal/criocli/criocli.go`,
//!   `pkg/config/config.go` `UpdateFromPath`);
//! - podman's CNI backend: `[network] network_config_dir` of containers.conf (the system's
//!   /usr/share/containers/containers.conf, then /etc/containers/containers.conf and its
//!   .d drop-ins); default /etc/cni/net.d; with `network_backend = "netavark"` it reads no
//!   CNI directory at all (containers.conf(5)).
//!
//! A running containerd or CRI-O is judged by the binary it runs and the config its command
//! line names (read from /proc); an installed one that does not run, by its binary in PATH
//! and its default config, since it reads that directory once started. Where a config cannot be
//! read, the runtime is judged (the safe side: a refusal that names it, not a silent pass).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use super::compat::{Runtime, RuntimeKind};

/// CNI's default configuration directory (libcni's, and each runtime's default).
const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";

/// Where the host's files are: `/` and `/proc` on a node; a test's own tree in tests.
#[derive(Debug, Clone)]
pub struct Host {
    pub root: PathBuf,
    pub proc: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// The runtimes found (running, or installed in `path`) that read `conf_dir`, each with
/// how it is known to read it.
pub fn readers(conf_dir: &Path, path: &OsStr, host: &Host) -> Vec<Runtime> {
    let want = canonical(conf_dir);
    let mut found = Vec::new();
    let mut running = Vec::new();
    for kind in [RuntimeKind::Containerd, RuntimeKind::Crio] {
        for p in running_as(host, kind) {
            let (dir, how) = runtime_conf_dir(host, kind, &p.args, &p.environ);
            if canonical(&dir) == want
                && let Some(r) = kind.judge(&host.proc.join(&p.pid).join("exe"), &p.exe)
            {
                found.push(r.reading(format!(
                    "runs as pid {} with {how} (CNI directory {})",
                    p.pid,
                    dir.display()
                )));
            }
            running.push(p.exe);
        }
    }
    for kind in [
        RuntimeKind::Containerd,
        RuntimeKind::Crio,
        RuntimeKind::Podman,
    ] {
        let Some(bin) = kind.in_path(path) else {
            continue;
        };
        // A running binary is judged above, by the config it runs with.
        if running.iter().any(|exe| canonical(exe) == canonical(&bin)) {
            continue;
        }
        let (dir, source) = match kind {
            RuntimeKind::Podman => match podman_conf_dir(host) {
                Some((dir, file)) => (dir, file.display().to_string()),
                // netavark: podman reads no CNI directory.
                None => continue,
            },
            _ => runtime_conf_dir(host, kind, &[], &[]),
        };
        if canonical(&dir) == want
            && let Some(r) = kind.judge(&bin, &bin)
        {
            found.push(r.reading(format!(
                "installed, not running; its config {source} names {}",
                dir.display()
            )));
        }
    }
    found
}

/// The CNI directory a containerd or CRI-O started with `args` (its command line, after the
/// binary) and `environ` reads, and what said so.
fn runtime_conf_dir(
    host: &Host,
    kind: RuntimeKind,
    args: &[String],
    environ: &[String],
) -> (PathBuf, String) {
    let config = flag(args, &["--config", "-c"]);
    match kind {
        RuntimeKind::Crio => crio_network_dir(host, args, environ),
        _ => {
            let config = PathBuf::from(config.unwrap_or("/etc/containerd/config.toml"));
            let dir = containerd_conf_dir(&host.file(&config));
            (dir, config.display().to_string())
        }
    }
}

impl Host {
    /// `path` (absolute on the node) inside this host's root.
    fn file(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
}

/// A directory as the kernel resolves it (links, `..`, a trailing slash), or as given when
/// it does not exist.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.components().collect())
}

/// A running runtime: its pid, binary, arguments (after the binary) and environment.
struct Running {
    pid: String,
    exe: PathBuf,
    args: Vec<String>,
    environ: Vec<String>,
}

/// Every running process whose binary is `kind`'s.
fn running_as(host: &Host, kind: RuntimeKind) -> Vec<Running> {
    let Ok(entries) = std::fs::read_dir(&host.proc) else {
        return Vec::new();
    };
    let words = |b: Vec<u8>| -> Vec<String> {
        b.split(|c| *c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.to_owned();
            pid.parse::<u32>().ok()?;
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            let exe = PathBuf::from(exe.to_string_lossy().trim_end_matches(" (deleted)"));
            (exe.file_name()? == kind.name()).then_some(())?;
            let args = words(std::fs::read(e.path().join("cmdline")).ok()?);
            let environ = words(std::fs::read(e.path().join("environ")).unwrap_or_default());
            Some(Running {
                pid,
                exe,
                args: args.into_iter().skip(1).collect(),
                environ,
            })
        })
        .collect()
}

/// The value of the first of `names` in a command line (`--name V` or `--name=V`; urfave/cli
/// and Go's flag package also take a long name after a single dash).
fn flag<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let spellings: Vec<&str> = names
        .iter()
        .flat_map(|n| {
            [
                *n,
                n.strip_prefix('-')
                    .filter(|r| r.starts_with('-'))
                    .unwrap_or(n),
            ]
        })
        .collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for n in &spellings {
            if a == n {
                return it.next().map(String::as_str);
            }
            if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                return Some(v);
            }
        }
    }
    None
}

/// CRI-O's `network_dir` and what set it: `--cni-config-dir`, `CONTAINER_CNI_CONFIG_DIR`, the
/// last of its config and drop-ins to set it, else its default.
fn crio_network_dir(host: &Host, args: &[String], environ: &[String]) -> (PathBuf, String) {
    let from_env = |name: &str| {
        environ
            .iter()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    if let Some(d) = flag(args, &["--cni-config-dir"]) {
        return (PathBuf::from(d), "--cni-config-dir".into());
    }
    if let Some(d) = from_env("CONTAINER_CNI_CONFIG_DIR") {
        return (PathBuf::from(d), "CONTAINER_CNI_CONFIG_DIR".into());
    }
    let config = flag(args, &["--config", "-c"])
        .or_else(|| from_env("CONTAINER_CONFIG"))
        .unwrap_or("/etc/crio/crio.conf");
    let drop_ins = flag(args, &["--config-dir", "-d"]).unwrap_or("/etc/crio/crio.conf.d");
    let mut files = vec![PathBuf::from(config)];
    files.extend(walk(host, Path::new(drop_ins)));
    let mut dir = (
        PathBuf::from(DEFAULT_CONF_DIR),
        format!("{config} (its default)"),
    );
    for f in files {
        let set = std::fs::read_to_string(host.file(&f))
            .ok()
            .and_then(|t| t.parse::<toml::Table>().ok())
            .and_then(|d| {
                let d = d.get("crio")?.get("network")?.get("network_dir")?;
                d.as_str().map(PathBuf::from)
            });
        if let Some(d) = set {
            dir = (d, f.display().to_string());
        }
    }
    dir
}

/// Every file under `dir` (on the node), recursively, in lexical order (Go's filepath.Walk).
fn walk(host: &Host, dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<_> = std::fs::read_dir(host.file(dir))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| (e.file_name(), e.file_type().is_ok_and(|t| t.is_dir())))
        .collect();
    names.sort();
    names
        .into_iter()
        .flat_map(|(name, is_dir)| {
            let p = dir.join(name);
            if is_dir { walk(host, &p) } else { vec![p] }
        })
        .collect()
}

/// The CRI plugin's `cni.conf_dir` in a containerd config (any config version: the CRI
/// plugin's table is the one under `plugins` with a `cni` table), else the default.
fn containerd_conf_dir(config: &Path) -> PathBuf {
    let Ok(text) = std::fs::read_to_string(config) else {
        return PathBuf::from(DEFAULT_CONF_DIR);
    };
    let Ok(doc) = text.parse::<toml::Table>() else {
        return PathBuf::from(DEFAULT_CONF_DIR);
    };
    doc.get("plugins")
        .and_then(toml::Value::as_table)
        .into_iter()
        .flat_map(|plugins| plugins.values())
        .find_map(|p| p.get("cni")?.get("conf_dir")?.as_str().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONF_DIR))
}

/// podman's CNI directory and the file that set it (the last of containers.conf's files to
/// set `network_config_dir`); `None` when its backend is netavark.
fn podman_conf_dir(host: &Host) -> Option<(PathBuf, PathBuf)> {
    let mut files = vec![
        PathBuf::from("/usr/share/containers/containers.conf"),
        PathBuf::from("/etc/containers/containers.conf"),
    ];
    let drop_ins = host.file(Path::new("/etc/containers/containers.conf.d"));
    let mut extra: Vec<PathBuf> = std::fs::read_dir(drop_ins)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| PathBuf::from("/etc/containers/containers.conf.d").join(e.file_name()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    extra.sort();
    files.extend(extra);
    let mut dir = (
        PathBuf::from(DEFAULT_CONF_DIR),
        PathBuf::from("podman's default"),
    );
    let mut netavark = false;
    for f in files {
        let Some(net) = std::fs::read_to_string(host.file(&f))
            .ok()
            .and_then(|t| t.parse::<toml::Table>().ok())
            .and_then(|d| d.get("network").cloned())
        else {
            continue;
        };
        if let Some(backend) = net.get("network_backend").and_then(toml::Value::as_str) {
            netavark = backend == "netavark";
        }
        if let Some(d) = net.get("network_config_dir").and_then(toml::Value::as_str) {
            dir = (PathBuf::from(d), f);
        }
    }
    (!netavark).then_some(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    /// A fake node: a root with files, a /proc with processes, a PATH directory.
    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Self {
            let n = Self {
                dir: tempfile::tempdir().unwrap(),
            };
            for d in ["root", "proc", "bin"] {
                std::fs::create_dir_all(n.dir.path().join(d)).unwrap();
            }
            n
        }
        fn host(&self) -> Host {
            Host {
                root: self.dir.path().join("root"),
                proc: self.dir.path().join("proc"),
            }
        }
        fn file(&self, path: &str, text: &str) {
            let p = self.host().file(Path::new(path));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        /// A runtime binary printing `version` for `--version`.
        fn binary(&self, name: &str, version: &str) -> PathBuf {
            let p = self.dir.path().join("bin").join(name);
            std::fs::write(&p, format!("#!/bin/sh\necho \"{name} {version}\"\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            crate::compat::wait_until_runnable(&p);
            p
        }
        fn running(&self, pid: u32, exe: &Path, args: &[&str]) {
            let d = self.host().proc.join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            symlink(exe, d.join("exe")).unwrap();
            std::fs::write(d.join("cmdline"), args.join("\0")).unwrap();
        }
        fn path(&self) -> std::ffi::OsString {
            self.dir.path().join("bin").into_os_string()
        }
    }

    #[test]
    fn a_runtime_reading_another_directory_is_not_a_reader() {
        let n = Node::new();
        n.binary("containerd", "github.com/containerd/containerd 1.6.20~ds1");
        n.binary("podman", "version 4.3.1");
        // Both read /etc/cni/net.d (their defaults); the conflist goes elsewhere.
        let found = readers(Path::new("/etc/node-a/net.d"), &n.path(), &n.host());
        assert!(found.is_empty(), "{found:?}");
        let found = readers(Path::new(DEFAULT_CONF_DIR), &n.path(), &n.host());
        let names: Vec<_> = found.iter().map(|r| (r.name, r.version.as_str())).collect();
        assert_eq!(names, [("containerd", "1.6.20~ds1"), ("podman", "4.3.1")]);
    }

    #[test]
    fn a_running_containerd_is_judged_by_the_config_it_runs_with() {
        let n = Node::new();
        let v2 = n.binary("containerd", "github.com/containerd/containerd/v2 v2.4.2");
        n.file(
            "/etc/node-a/containerd.toml",
            "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nconf_dir = '/etc/node-a/net.d'\n",
        );
        n.running(
            4242,
            &v2,
            &["containerd", "--config", "/etc/node-a/containerd.toml"],
        );
        let found = readers(Path::new("/etc/node-a/net.d/"), OsStr::new(""), &n.host());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].name, found[0].version.as_str()),
            ("containerd", "2.4.2")
        );
        assert_eq!(found[0].max, None);
        assert!(found[0].reads.contains("pid 4242"), "{}", found[0].reads);
    }

    #[test]
    fn containerd_1_config_and_podman_drop_ins_are_read() {
        let n = Node::new();
        n.binary("containerd", "github.com/containerd/containerd 1.6.20~ds1");
        n.binary("podman", "version 4.3.1");
        n.file(
            "/etc/containerd/config.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nconf_dir = \"/srv/cni\"\n",
        );
        n.file(
            "/etc/containers/containers.conf.d/10-cni.conf",
            "[network]\nnetwork_config_dir = \"/srv/cni\"\n",
        );
        let found = readers(Path::new("/srv/cni"), &n.path(), &n.host());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|r| r.max == Some("1.0.0")));
        n.file(
            "/etc/containers/containers.conf.d/20-netavark.conf",
            "[network]\nnetwork_backend = \"netavark\"\n",
        );
        let found = readers(Path::new("/srv/cni"), &n.path(), &n.host());
        assert_eq!(found.len(), 1, "netavark reads no CNI directory: {found:?}");
    }

    #[test]
    fn a_running_crio_is_judged_by_its_network_dir_and_its_version() {
        let n = Node::new();
        let old = n.binary(
            "crio",
            "version 1.29.1\n   GitCommit: x\n   GoVersion: go1.22.5",
        );
        n.file(
            "/etc/node-b/crio.conf",
            "[crio.network]\nnetwork_dir = \"/etc/node-b/ignored\"\n",
        );
        // A drop-in under the drop-in directory's subdirectory wins over the config.
        n.file(
            "/etc/node-b/crio.d/sub/20-net.conf",
            "[crio.network]\nnetwork_dir = \"/etc/node-b/net.d/\"\n",
        );
        n.file("/etc/node-b/crio.d/10-other.conf", "[crio.runtime]\n");
        n.running(
            77,
            &old,
            &[
                "crio",
                "-c",
                "/etc/node-b/crio.conf",
                "--config-dir=/etc/node-b/crio.d",
            ],
        );
        let found = readers(Path::new("/etc/node-b/net.d"), OsStr::new(""), &n.host());
        assert_eq!(found.len(), 1, "{found:?}");
        let r = &found[0];
        assert_eq!(
            (r.name, r.version.as_str(), r.max),
            ("crio", "1.29.1", Some("1.0.0"))
        );
        assert!(
            r.reads
                .contains("pid 77 with /etc/node-b/crio.d/sub/20-net.conf"),
            "{}",
            r.reads
        );
        // Not the directory of its config, which a drop-in overrode.
        assert!(readers(Path::new("/etc/node-b/ignored"), OsStr::new(""), &n.host()).is_empty());
    }

    #[test]
    fn crios_command_line_beats_its_config_and_a_new_crio_takes_1_1_0() {
        let n = Node::new();
        let new = n.binary("crio", "version 1.36.3");
        n.file(
            "/etc/crio/crio.conf",
            "[crio.network]\nnetwork_dir = \"/etc/cni/other\"\n",
        );
        n.running(88, &new, &["crio", "--cni-config-dir", "/srv/crio-net"]);
        let found = readers(Path::new("/srv/crio-net"), OsStr::new(""), &n.host());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].version.as_str(), found[0].max), ("1.36.3", None));
        assert!(
            found[0].reads.contains("--cni-config-dir"),
            "{}",
            found[0].reads
        );
    }

    #[test]
    fn an_installed_crio_reads_its_default_config_and_drop_ins() {
        let n = Node::new();
        n.binary("crio", "version 1.30.4");
        // Nothing set: CRI-O's default, /etc/cni/net.d/.
        let found = readers(Path::new(DEFAULT_CONF_DIR), &n.path(), &n.host());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].max, Some("1.0.0"));
        n.file(
            "/etc/crio/crio.conf.d/50-net.conf",
            "[crio.network]\nnetwork_dir = \"/srv/cni\"\n",
        );
        let found = readers(Path::new("/srv/cni"), &n.path(), &n.host());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].reads.contains("50-net.conf"), "{}", found[0].reads);
    }
}
