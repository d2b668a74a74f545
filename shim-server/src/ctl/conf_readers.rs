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
//! - podman's CNI backend: `[network] network_config_dir` of containers.conf (the system's
//!   /usr/share/containers/containers.conf, then /etc/containers/containers.conf and its
//!   .d drop-ins); default /etc/cni/net.d; with `network_backend = "netavark"` it reads no
//!   CNI directory at all (containers.conf(5)).
//!
//! A running containerd is judged by the binary it runs and the config its command line
//! names (read from /proc); an installed one that does not run, by its binary in PATH and
//! its default config, since it reads that directory once started. Where a config cannot be
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
    let running = running_containerds(host);
    for (pid, exe, config) in &running {
        let dir = containerd_conf_dir(&host.file(config));
        if canonical(&dir) == want
            && let Some(r) = RuntimeKind::Containerd.judge(&host.proc.join(pid).join("exe"), exe)
        {
            found.push(r.reading(format!(
                "runs as pid {pid} with {} (cni conf_dir {})",
                config.display(),
                dir.display()
            )));
        }
    }
    for kind in [RuntimeKind::Containerd, RuntimeKind::Podman] {
        let Some(bin) = kind.in_path(path) else {
            continue;
        };
        // A running binary is judged above, by the config it runs with.
        if running
            .iter()
            .any(|(_, exe, _)| canonical(exe) == canonical(&bin))
        {
            continue;
        }
        let (dir, source) = match kind {
            RuntimeKind::Containerd => {
                let config = PathBuf::from("/etc/containerd/config.toml");
                (containerd_conf_dir(&host.file(&config)), config)
            }
            RuntimeKind::Podman => match podman_conf_dir(host) {
                Some(found) => found,
                // netavark: podman reads no CNI directory.
                None => continue,
            },
        };
        if canonical(&dir) == want
            && let Some(r) = kind.judge(&bin, &bin)
        {
            found.push(r.reading(format!(
                "installed, not running; its config {} names {}",
                source.display(),
                dir.display()
            )));
        }
    }
    found
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

/// Every running containerd: (pid, its binary, the config it was started with).
fn running_containerds(host: &Host) -> Vec<(String, PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(&host.proc) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.to_owned();
            pid.parse::<u32>().ok()?;
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            let exe = PathBuf::from(exe.to_string_lossy().trim_end_matches(" (deleted)"));
            (exe.file_name()? == "containerd").then_some(())?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, exe, config_flag(&cmdline)))
        })
        .collect()
}

/// The `--config`/`-c` of a containerd command line (NUL-separated), else its default.
fn config_flag(cmdline: &[u8]) -> PathBuf {
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a
            .strip_prefix("--config=")
            .or_else(|| a.strip_prefix("-c="))
        {
            return PathBuf::from(v);
        }
        if (a == "--config" || a == "-c")
            && let Some(v) = it.next()
        {
            return PathBuf::from(v);
        }
    }
    PathBuf::from("/etc/containerd/config.toml")
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
}
