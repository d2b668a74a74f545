//! The two ways a node starts dipamd, for the attacker tests (docs/cfp.md §8.3): each case
//! runs against a dipamd under the shipped systemd unit's restrictions and against one
//! started like the shipped DaemonSet (deploy/kubernetes/dipam.yaml), both read from the
//! shipped files:
//!
//! - **the unit**: its capability bounding set and `NoNewPrivileges` (restrictions.rs) and its
//!   `LimitNOFILE`;
//! - **the DaemonSet**: its dipamd container's arguments (every flag the manifest passes, its
//!   paths mapped onto the lab's), its `NODE_NAME`, its `securityContext` (drop ALL, add what
//!   it adds, no privilege escalation), `hostNetwork` (the test's own network namespace),
//!   a container runtime's descriptor limit (soft 1024 under a hard 4096), and its volume
//!   mounts: dipamd runs in a private mount namespace in which only what the manifest mounts
//!   writable (the state directory, the socket's directory, the CNI store) can be written.
//!
//! The test's own flags win over the manifest's same flag (a test that needs the runtime-aware
//! GC on its containerd passes its own `--cri-endpoint`).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{Lab, bins, flood, restrictions, shapes};

/// How a node starts dipamd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// deploy/systemd/dipamd.service.
    ShippedUnit,
    /// deploy/kubernetes/dipam.yaml.
    DaemonSet,
}

/// What a started deployment exposes beyond the lab's socket.
#[derive(Debug, Default)]
pub struct Started {
    /// The loopback TCP port of `--metrics-address` (the DaemonSet's).
    pub metrics_port: Option<u16>,
}

/// The node name the DaemonSet's `$(NODE_NAME)` stands for.
pub const NODE_NAME: &str = "dipam-test-node";

/// A container runtime's default descriptor limit (SOFT:HARD for prlimit): the soft limit
/// dipamd must raise.
pub const CONTAINER_NOFILE: &str = "1024:4096";

impl Deployment {
    pub const BOTH: [Self; 2] = [Self::ShippedUnit, Self::DaemonSet];

    pub fn name(self) -> &'static str {
        match self {
            Self::ShippedUnit => "the shipped unit",
            Self::DaemonSet => "the DaemonSet",
        }
    }

    /// A lab for `conflist` whose dipamd has `flags` and is started as this deployment
    /// starts it.
    pub fn lab(self, conflist: &str, flags: &[&str]) -> Lab {
        let mut lab = Lab::with_flags(conflist, flags);
        self.start(&mut lab, None, &[]);
        lab
    }

    /// Restarts `lab`'s dipamd as this deployment starts it. `nofile` (SOFT:HARD) replaces
    /// the deployment's descriptor limit; `writable` are further directories the deployment
    /// would have writable (a `--non-root-data-dir` the DaemonSet would mount under
    /// /var/lib/cni). The socket's directory is opened to every user, so that its own mode,
    /// group and dipamd's peer check are what count; returns once dipamd is ready (the
    /// DaemonSet's agent addresses allocated).
    pub fn start(self, lab: &mut Lab, nofile: Option<&str>, writable: &[&Path]) -> Started {
        let bench = Bench::new(&mut lab.dipamd, &lab.fx, &lab.data);
        self.start_bench(bench, nofile, writable)
    }

    /// [`Self::start`] for an [`crate::AgentLab`], whose own flags (`--conflist`, its roles,
    /// its node name) win over the DaemonSet's.
    pub fn start_agent_lab(self, lab: &mut crate::AgentLab) -> Started {
        let bench = Bench::new(&mut lab.dipamd, &lab.fx, &lab.data);
        self.start_bench(bench, None, &[])
    }

    fn start_bench(self, mut lab: Bench<'_>, nofile: Option<&str>, writable: &[&Path]) -> Started {
        lab.dipamd.kill9();
        let (started, limit, caps) = match self {
            Self::ShippedUnit => {
                lab.dipamd.set_shape_flags(Vec::new());
                lab.dipamd.enter(&[]);
                (
                    Started::default(),
                    shipped_nofile(),
                    restrictions::shipped_unit(),
                )
            }
            Self::DaemonSet => {
                let started = daemonset(&mut lab, writable);
                (
                    started,
                    CONTAINER_NOFILE.to_owned(),
                    restrictions::daemonset_restrictions(),
                )
            }
        };
        let limit = nofile.map_or(limit, str::to_owned);
        let mut argv = vec![
            "prlimit".to_owned(),
            format!("--nofile={limit}"),
            "--".into(),
        ];
        argv.extend(caps.setpriv());
        lab.dipamd.run_under(&argv);
        lab.dipamd.start_again();
        // The shape really applies: the kernel's view of dipamd.
        let pid = lab.dipamd.pid().expect("dipamd runs");
        assert_eq!(
            shapes::bounding_mask(pid),
            Some(caps.mask()),
            "dipamd's capability bounding set under {}",
            self.name()
        );
        if self == Self::DaemonSet {
            assert!(
                root_read_only(pid),
                "dipamd started like the DaemonSet can write the host's /"
            );
        }
        std::fs::set_permissions(
            lab.dipamd.dir.path(),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("open the socket's directory");
        wait_ready(&lab, self);
        started
    }
}

/// What [`Deployment::start`] needs of a bench: its dipamd, the conflist its pods use and
/// the delegate's store directory.
struct Bench<'a> {
    dipamd: &'a mut crate::Dipamd,
    list: &'a Value,
    data: &'a Path,
}

impl<'a> Bench<'a> {
    fn new(
        dipamd: &'a mut crate::Dipamd,
        fx: &'a crate::Fixture,
        data: &'a tempfile::TempDir,
    ) -> Self {
        Self {
            dipamd,
            list: &fx.list,
            data: data.path(),
        }
    }
}

/// The shipped unit's `LimitNOFILE` (SOFT:HARD for prlimit), within this process's own hard
/// limit (raising it needs CAP_SYS_RESOURCE, which a container running the tests may lack).
pub fn shipped_nofile() -> String {
    let unit = std::fs::read_to_string(bins::workspace().join("deploy/systemd/dipamd.service"))
        .expect("read the shipped unit");
    let n = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("LimitNOFILE="))
        .expect("the shipped unit sets LimitNOFILE")
        .trim()
        .parse::<u64>()
        .expect("LimitNOFILE is a number")
        .min(flood::own_hard_nofile());
    format!("{n}:{n}")
}

/// The DaemonSet's dipamd container.
fn container() -> Value {
    let ds = crate::restrictions::shipped_daemonset();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostNetwork"], true,
        "the DaemonSet runs on the host's network"
    );
    pod["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "dipamd")
        .cloned()
        .expect("a dipamd container")
}

/// Sets `lab`'s dipamd up as the DaemonSet's container: its flags, its env and its mounts.
fn daemonset(lab: &mut Bench<'_>, writable: &[&Path]) -> Started {
    let c = container();
    let dir = lab.dipamd.dir.path().to_owned();
    let mut started = Started::default();
    let own: Vec<String> = lab.dipamd.flags().to_vec();
    let command: Vec<String> = c["command"]
        .as_array()
        .expect("the container's command")
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect();
    assert_eq!(command[0], "dipamd");
    let mut flags = Vec::new();
    for pair in command[1..].chunks(2) {
        let [flag, value] = pair else {
            panic!("the DaemonSet's dipamd flags come in pairs: {command:?}");
        };
        if own.contains(flag) {
            continue;
        }
        let mapped = match flag.as_str() {
            // The harness's own paths for these.
            "--state-dir" | "--socket" | "--cni-path" => continue,
            "--spool-dir" => {
                let rest = Path::new(value)
                    .strip_prefix("/var/lib/dipam")
                    .expect("the spool lives in the state directory's volume");
                lab.dipamd.state_dir().join(rest).display().to_string()
            }
            "--conflist" => {
                let name = Path::new(value).file_name().expect("a file name");
                let net_d = dir.join("net.d");
                std::fs::create_dir_all(&net_d).expect("the conflist's directory");
                let path = net_d.join(name);
                std::fs::write(&path, lab.list.to_string()).expect("write the conflist");
                path.display().to_string()
            }
            "--node-name" => value.replace("$(NODE_NAME)", NODE_NAME),
            "--metrics-address" => {
                let port = free_port();
                started.metrics_port = Some(port);
                format!("127.0.0.1:{port}")
            }
            // Nothing listens there: the runtime-aware GC refuses ("unreachable"), as on a
            // node whose runtime's socket is elsewhere.
            "--cri-endpoint" => format!("unix://{}", dir.join("containerd.sock").display()),
            "--agent-roles" | "--log-format" => value.clone(),
            other => panic!("the DaemonSet passes {other} {value}: map it here"),
        };
        flags.push(flag.clone());
        flags.push(mapped);
    }
    lab.dipamd.set_shape_flags(flags);
    let mut rw: Vec<PathBuf> = vec![dir.clone(), lab.data.to_owned()];
    rw.extend(writable.iter().map(|p| p.to_path_buf()));
    for m in c["volumeMounts"].as_array().expect("volumeMounts") {
        let at = m["mountPath"].as_str().expect("a mountPath");
        let known = ["/var/lib/cni", "/run/dipam", "/var/lib/dipam"];
        assert!(
            m["readOnly"] == true || known.contains(&at),
            "the DaemonSet mounts {at} writable: map it onto the lab's paths here"
        );
    }
    let mut enter: Vec<String> = [
        "env",
        &format!("NODE_NAME={NODE_NAME}"),
        "unshare",
        "-m",
        "--propagation",
        "private",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    enter.extend(shapes::protect_system_strict(&dir, &rw));
    lab.dipamd.enter(&enter);
    started
}

/// Whether `/` is mounted read-only in `pid`'s mount namespace (mountinfo's mount point,
/// field 5, and its per-mount options, field 6).
fn root_read_only(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.get(4) == Some(&"/"))
        .any(|f| f.get(5).is_some_and(|o| o.split(',').any(|o| o == "ro")))
}

/// A loopback TCP port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Waits (60 s at most) until `dipamctl status --ready` says dipamd is ready: the agent's
/// addresses, where the deployment names an agent conflist, are allocated before the test
/// compares the ledger with the store.
fn wait_ready(lab: &Bench<'_>, d: Deployment) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = lab.dipamd.ctl(&["status", "--ready"]);
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "dipamd started like {} never became ready: {}\n{}",
            d.name(),
            String::from_utf8_lossy(&out.stdout),
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
