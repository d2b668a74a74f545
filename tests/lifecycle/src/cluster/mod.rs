//! A real single-node Kubernetes cluster, private to one test: etcd (Debian's), the API server,
//! controller manager, scheduler, kube-proxy (iptables), the kubelet and containerd 2, all at
//! the versions tests/peers/pins builds (docs/compatibility.md), all in the node's network
//! namespace with their usual ports, the kubelet and containerd also in the node's mount
//! namespace (src/cluster/node.rs says why and what is private). Nothing is pulled: the
//! images are imported offline (src/cluster/images.rs).
//!
//! The controller manager runs the node IPAM controller (`--allocate-node-cidrs`,
//! `--cluster-cidr`), so the Node gets `spec.podCIDRs`, which the DaemonSet's init container
//! reads through the `kubernetes` Service (kube-proxy's DNAT to the API server).
//!
//! Differences from a production node, each because of this sandbox, none touching what
//! dipam sees: the kubelet's `cgroupRoot` is a private one (pods' cgroups never mix with the
//! machine's); `oomScoreAdj: 0` (root here lacks CAP_SYS_RESOURCE, which lowering it needs);
//! containerd's `restrict_oom_score_adj` for the same reason; the kubelet's API is
//! authorized AlwaysAllow for the API server's client certificate (no webhook); image GC and
//! eviction thresholds are out of the way (the images cannot be pulled again).
//! The kubelet sets kernel tunables of its own (vm.overcommit_memory, kernel.panic, ...);
//! their values are put back on drop.

mod images;
mod node;
mod pki;
pub mod workload;

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

pub use images::{BUSYBOX_IMAGE, DIPAM_IMAGE, DIPAM_TAG, PAUSE_IMAGE};
pub use node::{NODE_IP, Node};
pub use pki::{KUBERNETES_SERVICE_IP, Pki, SERVICE_RANGE};
use serde_json::Value;
use tempfile::TempDir;

use crate::peers::Peer;

/// The node's name (its Node object, the kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "dipam-node";
/// Debian's etcd (tests/deps.sh installs etcd-server).
pub const ETCD: &str = "/usr/bin/etcd";
/// The cluster's pod range; the node gets the first block of it, of `Sizing::node_mask`.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// containerd's CRI socket, at the path the shipped DaemonSet's `--cri-endpoint` names.
pub const CRI_SOCKET: &str = "/run/containerd/containerd.sock";

/// The peers a cluster needs, by name (tests/peers/pins).
pub const PEERS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "host-local",
    "portmap",
    "loopback",
    "ptp",
    "pause",
];

/// The kernel tunables the kubelet sets at start (pkg/kubelet/cm `setupKernelTunables`).
const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why no cluster can start on this machine, if none can: Debian's etcd is missing (for
/// `require!`).
pub fn etcd_missing() -> Option<String> {
    (!Path::new(ETCD).is_file())
        .then(|| format!("{ETCD} is missing (tests/deps.sh installs etcd-server)"))
}

/// How many pods the node takes (the kubelet's `maxPods`) and the size of the pod range it
/// gets for them (the controller manager's `--node-cidr-mask-size`): a density run needs more
/// than the upstream default of 110 pods in a /24.
#[derive(Clone, Copy, Debug)]
pub struct Sizing {
    pub max_pods: u32,
    pub node_mask: u8,
}

impl Default for Sizing {
    /// The upstream defaults: 110 pods, a /24.
    fn default() -> Self {
        Self {
            max_pods: 110,
            node_mask: 24,
        }
    }
}

pub struct Cluster {
    sizing: Sizing,
    control: Vec<Proc>,
    node_procs: Vec<Proc>,
    peers: Vec<Peer>,
    sysctls: Vec<(String, String)>,
    pub pki: Pki,
    pub node: Node,
    pub dir: TempDir,
}

impl Cluster {
    /// Starts the control plane and the node (containerd with the images, the kubelet), and
    /// waits until the Node is registered with a pod CIDR. The node is NotReady until a CNI
    /// config is installed.
    pub fn start(peers: Vec<Peer>) -> Self {
        Self::start_sized(peers, Sizing::default())
    }

    /// [`Cluster::start`] with a node of `sizing`.
    pub fn start_sized(peers: Vec<Peer>, sizing: Sizing) -> Self {
        let dir = crate::temp_dir("cluster-");
        std::fs::create_dir_all(dir.path().join("logs")).expect("logs dir");
        let t = Instant::now();
        let images = [
            images::dipam_archive(dir.path()),
            images::pause_archive(&by(&peers, "pause").path, dir.path()),
            crate::containerd::image_tar(),
        ];
        eprintln!("cluster: images built in {:?}", t.elapsed());
        let node = Node::create(dir.path());
        let pki = Pki::create(&dir.path().join("pki"), NODE_NAME, NODE_IP);
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .filter_map(|k| {
                let v = std::fs::read_to_string(format!("/proc/sys/{k}")).ok()?;
                Some(((*k).to_owned(), v.trim().to_owned()))
            })
            .collect();
        let mut c = Self {
            sizing,
            control: Vec::new(),
            node_procs: Vec::new(),
            peers,
            sysctls,
            pki,
            node,
            dir,
        };
        c.install_plugins();
        c.start_control_plane();
        eprintln!("cluster: API server ready after {:?}", t.elapsed());
        c.start_node();
        for archive in &images {
            c.import(archive);
        }
        c.start_kubelet();
        c.wait_for("the node to register with a pod CIDR", 120, |c| {
            c.node_object()
                .and_then(|n| n["spec"]["podCIDR"].as_str().map(str::to_owned))
        });
        eprintln!("cluster: node registered after {:?}", t.elapsed());
        c
    }

    fn peer(&self, name: &str) -> PathBuf {
        by(&self.peers, name).path.clone()
    }

    fn log(&self, name: &str) -> File {
        File::create(self.dir.path().join("logs").join(format!("{name}.log"))).expect("log file")
    }

    /// A component's log so far.
    pub fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    fn spawn(&self, name: &'static str, mount: bool, program: &Path, args: &[String]) -> Proc {
        let mut cmd = self.node.command(mount, program);
        cmd.args(args)
            .env("PATH", self.path_env())
            .stdin(Stdio::null())
            .stdout(self.log(name))
            .stderr(self.log(&format!("{name}.err")));
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc { name, child }
    }

    /// containerd finds its shim in PATH; kube-proxy its iptables.
    fn path_env(&self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.peer("containerd-shim-runc-v2")
                .parent()
                .expect("a directory")
                .display()
        )
    }

    /// The node's /opt/cni/bin, as an installer of the node would leave it: the reference
    /// plugins' release binaries (static, so dipamd's image, which has no libc, can run
    /// host-local). dipam itself is put there by the DaemonSet's init container.
    fn install_plugins(&self) {
        let bin = self.node.path("/opt/cni/bin");
        for p in ["host-local", "portmap", "loopback", "ptp"] {
            std::fs::copy(self.peer(p), bin.join(p)).expect("install a plugin");
        }
    }

    /// Puts the peer `name` (one of those the cluster was given) into the node's
    /// /opt/cni/bin, as a node's installer does for a delegate the network names: dipamd runs
    /// it from there (the DaemonSet's `--cni-path`). Static, like the reference plugins.
    pub fn install_cni_plugin(&self, name: &str) {
        let to = self.node.path("/opt/cni/bin").join(name);
        std::fs::copy(self.peer(name), &to)
            .unwrap_or_else(|e| panic!("install {name} as {}: {e}", to.display()));
    }

    fn start_control_plane(&mut self) {
        let d = self.dir.path().display().to_string();
        let f = |n: &str| self.pki.file(n);
        let etcd = self.spawn(
            "etcd",
            false,
            Path::new(ETCD),
            &strings(&[
                "--data-dir",
                &format!("{d}/etcd"),
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=default=http://127.0.0.1:2380",
            ]),
        );
        self.control.push(etcd);
        let apiserver = self.spawn(
            "kube-apiserver",
            false,
            &self.peer("kube-apiserver"),
            &strings(&[
                "--etcd-servers=http://127.0.0.1:2379",
                &format!("--advertise-address={NODE_IP}"),
                "--bind-address=0.0.0.0",
                "--secure-port=6443",
                &format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                &format!("--client-ca-file={}", f("ca.crt")),
                &format!("--tls-cert-file={}", f("apiserver.crt")),
                &format!("--tls-private-key-file={}", f("apiserver.key")),
                &format!("--kubelet-client-certificate={}", f("admin.crt")),
                &format!("--kubelet-client-key={}", f("admin.key")),
                // The node's host name resolves nowhere here: reach the kubelet (exec, logs)
                // at its InternalIP.
                "--kubelet-preferred-address-types=InternalIP",
                &format!("--service-account-key-file={}", f("sa.pub")),
                &format!("--service-account-signing-key-file={}", f("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                &format!("--cert-dir={d}/apiserver"),
                "--profiling=false",
            ]),
        );
        self.control.push(apiserver);
        self.wait_for("the API server to be ready", 180, |c| {
            let out = c.kubectl(&["get", "--raw", "/readyz"]);
            out.status.success().then_some(())
        });
        self.start_controllers();
    }

    fn start_controllers(&mut self) {
        let f = |n: &str| self.pki.file(n);
        let cm = f("controller-manager.kubeconfig");
        let manager = self.spawn(
            "kube-controller-manager",
            false,
            &self.peer("kube-controller-manager"),
            &strings(&[
                &format!("--kubeconfig={cm}"),
                &format!("--authentication-kubeconfig={cm}"),
                &format!("--authorization-kubeconfig={cm}"),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--allocate-node-cidrs=true",
                &format!("--cluster-cidr={CLUSTER_CIDR}"),
                &format!("--node-cidr-mask-size={}", self.sizing.node_mask),
                &format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                &format!("--service-account-private-key-file={}", f("sa.key")),
                &format!("--root-ca-file={}", f("ca.crt")),
                &format!("--cluster-signing-cert-file={}", f("ca.crt")),
                &format!("--cluster-signing-key-file={}", f("ca.key")),
                "--use-service-account-credentials=true",
            ]),
        );
        self.control.push(manager);
        let s = f("scheduler.kubeconfig");
        let scheduler = self.spawn(
            "kube-scheduler",
            false,
            &self.peer("kube-scheduler"),
            &strings(&[
                &format!("--kubeconfig={s}"),
                &format!("--authentication-kubeconfig={s}"),
                &format!("--authorization-kubeconfig={s}"),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
            ]),
        );
        self.control.push(scheduler);
        // Conntrack limits left as they are (0): the node's netns is the test's, and the
        // global table is the machine's.
        let proxy = self.spawn(
            "kube-proxy",
            false,
            &self.peer("kube-proxy"),
            &strings(&[
                &format!("--kubeconfig={}", f("kube-proxy.kubeconfig")),
                "--proxy-mode=iptables",
                &format!("--hostname-override={NODE_NAME}"),
                &format!("--cluster-cidr={CLUSTER_CIDR}"),
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--metrics-bind-address=127.0.0.1:10249",
                "--oom-score-adj=0",
            ]),
        );
        self.control.push(proxy);
    }

    /// containerd 2 in the node's namespaces, CRI on the host's usual socket path.
    fn start_node(&mut self) {
        let config = self.dir.path().join("containerd.toml");
        std::fs::write(&config, containerd_config(self.dir.path())).expect("containerd config");
        let p = self.spawn(
            "containerd",
            true,
            &self.peer("containerd"),
            &strings(&["--config", &config.to_string_lossy(), "--log-level", "info"]),
        );
        self.node_procs.push(p);
        let sock = self.node.path(CRI_SOCKET);
        self.wait_for("containerd's socket", 60, |_| sock.exists().then_some(()));
    }

    /// `ctr -n k8s.io images import ARCHIVE` in the node.
    fn import(&self, archive: &Path) {
        crate::cmd::run(
            self.node
                .command(true, &self.peer("ctr"))
                .args(["--address", CRI_SOCKET, "-n", "k8s.io", "images", "import"])
                .arg(archive),
        );
    }

    fn start_kubelet(&mut self) {
        let config = self.dir.path().join("kubelet.yaml");
        std::fs::write(&config, self.kubelet_config()).expect("kubelet config");
        let p = self.spawn(
            "kubelet",
            true,
            &self.peer("kubelet"),
            &strings(&[
                &format!("--config={}", config.display()),
                &format!("--kubeconfig={}", self.pki.file("kubelet.kubeconfig")),
                &format!("--hostname-override={NODE_NAME}"),
                &format!("--node-ip={NODE_IP}"),
                "--root-dir=/var/lib/kubelet",
                "--v=2",
            ]),
        );
        self.node_procs.push(p);
    }

    fn kubelet_config(&self) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
address: {NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
containerRuntimeEndpoint: unix://{CRI_SOCKET}
failSwapOn: false
oomScoreAdj: 0
clusterDomain: cluster.local
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
maxPods: {max_pods}
",
            max_pods = self.sizing.max_pods,
            ca = self.pki.file("ca.crt"),
            cgroup = self.node.cgroup,
        )
    }

    /// Restarts the node as a power loss would: the kubelet, containerd and every pod
    /// (dipamd's too) SIGKILLed, the node's volatile state gone (the pods' network
    /// namespaces, /run), then containerd and the kubelet started again. The control plane
    /// and kube-proxy keep running (they are elsewhere in a real cluster).
    pub fn reboot_node(&mut self) {
        self.node.kill_all();
        for p in &mut self.node_procs {
            p.kill();
        }
        self.node_procs.clear();
        self.node.reboot_cleanup();
        self.start_node();
        self.start_kubelet();
    }

    /// `kubectl --kubeconfig <admin> ARGS` in the node's network namespace, unbounded (a
    /// watch).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut c = self.node.command(false, &self.peer("kubectl"));
        c.arg(format!(
            "--kubeconfig={}",
            self.pki.file("admin.kubeconfig")
        ))
        .args(args);
        c
    }

    /// `kubectl --kubeconfig <admin> ARGS` in the node's network namespace, bounded.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.node
            .command(false, Path::new("/usr/bin/timeout"))
            .arg("360")
            .arg(self.peer("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.pki.file("admin.kubeconfig")
            ))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl ARGS`, which must succeed; its stdout.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        crate::cmd::ok_named(&format!("kubectl {args:?}"), &self.kubectl(args))
    }

    /// `kubectl get ARGS -o json`, parsed.
    #[track_caller]
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).expect("kubectl's JSON")
    }

    /// The Node object, if registered.
    pub fn node_object(&self) -> Option<Value> {
        let out = self.kubectl(&["get", "node", NODE_NAME, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// Polls `f` until it gives a value, for at most `secs`; on timeout the panic names
    /// `what` and shows the components' logs' tails.
    #[track_caller]
    pub fn wait_for<T>(&self, what: &str, secs: u64, mut f: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "waited {secs} s for {what}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tail of every component's log, for a failure report.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for name in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "containerd",
            "kubelet",
        ] {
            let log = self.log_of(&format!("{name}.err"));
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
            out.push_str(&format!("----- {name} -----\n{tail}\n"));
        }
        out.push_str(&format!(
            "logs in {}\n",
            self.dir.path().join("logs").display()
        ));
        out
    }
}

fn by<'a>(peers: &'a [Peer], name: &str) -> &'a Peer {
    peers
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no peer {name} given"))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// containerd 2's configuration (format 3) for the node: its state at the host's usual
/// /run/containerd (the node's private copy), its root under the test's directory (kept
/// across a node restart, as /var/lib/containerd is), the CNI directories at the host's
/// usual paths, which the DaemonSet writes.
fn containerd_config(d: &Path) -> String {
    let root = d.join("containerd-root").display().to_string();
    crate::containerd::config::config_v3_at(
        &root,
        "/run/containerd",
        CRI_SOCKET,
        PAUSE_IMAGE,
        "/opt/cni/bin",
        "/etc/cni/net.d",
    )
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The components' logs outlive the cluster on a failure (or when asked with
        // DIPAM_CLUSTER_LOGS=DIR): the cluster's directory goes with it.
        let keep = std::env::var_os("DIPAM_CLUSTER_LOGS")
            .map(PathBuf::from)
            .or_else(|| {
                std::thread::panicking().then(|| {
                    std::env::temp_dir().join(format!("dipam-cluster-logs-{}", std::process::id()))
                })
            });
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
        if let Some(to) = keep {
            let _ = std::fs::create_dir_all(&to);
            for e in std::fs::read_dir(self.dir.path().join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let _ = std::fs::copy(e.path(), to.join(e.file_name()));
            }
            eprintln!("cluster: the components' logs are kept in {}", to.display());
        }
        self.node.kill_all_quietly();
        for p in self
            .node_procs
            .iter_mut()
            .chain(self.control.iter_mut().rev())
        {
            eprintln!("cluster: stopping {}", p.name);
            p.kill();
        }
        for (k, v) in &self.sysctls {
            let _ = std::fs::write(format!("/proc/sys/{k}"), v);
        }
    }
}
