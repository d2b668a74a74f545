//! A private containerd, driven through the CRI API as kubelet drives it.
//!
//! [`Containerd::start`] runs Debian's containerd (1.6) with everything of its own under a temp
//! directory: `root`, `state`, the gRPC and ttrpc sockets, the CRI plugin's `cni.conf_dir`
//! (one conflist, `max_conf_num = 1`) and `cni.bin_dir` (dipam's plugins beside the reference
//! plugins: CRI passes this one directory as CNI_PATH), and a `sandbox_image` imported offline.
//! What it cannot move, and what this guard therefore cleans by name on drop: the shims'
//! sockets in /run/containerd/s, runc's state in /run/containerd/runc/k8s.io, the pods'
//! network namespaces in /var/run/netns and the cgroups runc made. The CRI client is the
//! `k8s-cri` crate (cri-api's generated bindings), over the unix socket.
//!
//! There is no registry: the image is a docker-archive tar built here from busybox-static
//! (one layer: /bin/busybox, an applet symlink tree, /etc/passwd; a config whose Cmd sleeps
//! forever; manifest.json with its RepoTags), cached under `$DIPAM_TEST_CACHE` (default
//! /var/cache/dipam-tests) and `ctr -n k8s.io image import`ed. It is the sandbox (pause)
//! image and the pods' container image both.
//!
//! Facts the configuration relies on are in docs/sources.md §10.2 (containerd 1.6).

use std::{
    collections::BTreeSet,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    ImageStatusRequest, ListPodSandboxRequest, PodSandboxConfig, PodSandboxStatusRequest,
    PodSandboxStatusResponse, PortMapping, RemovePodSandboxRequest, StartContainerRequest,
    StatusRequest, StopPodSandboxRequest, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use serde_json::Value;
use tempfile::TempDir;
use tonic::{Status, transport::Channel};

use crate::{bins, cmd::run, cri::Cri};

pub(crate) mod config;
mod process;
pub use process::delete_netns;

/// The image every pod and container runs (the sandbox image too): busybox sleeping forever.
/// Fully qualified, as CRI normalises image names.
pub const IMAGE: &str = "docker.io/library/dipam-busybox:test";

/// containerd's own directory for shim sockets, runc state and fifos, whatever its `state`.
const RUN_DIR: &str = "/run/containerd";

/// Why containerd cannot run here, if it cannot: the only reasons to skip (`require!`).
pub fn unavailable() -> Option<String> {
    if !crate::is_root() {
        return Some("containerd tests need root (a rootful containerd with CNI)".into());
    }
    for tool in [
        "containerd",
        "ctr",
        "containerd-shim-runc-v2",
        "runc",
        "tar",
    ] {
        if which(tool).is_none() {
            return Some(format!(
                "{tool} is not installed (tests/deps.sh installs containerd, runc and busybox-static)"
            ));
        }
    }
    if busybox().is_none() {
        return Some("busybox is not installed (tests/deps.sh installs busybox-static)".into());
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn busybox() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A pod sandbox as the test made it: CreateContainer needs its config again.
#[derive(Debug, Clone)]
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
}

impl Pod {
    pub fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
    }
}

/// A private containerd and a CRI client to it. Stops every pod (through CRI, so that their
/// DELs reach dipam), then kills containerd and its shims and cleans up on drop: keep the
/// dipamd it calls alive until then (declare this guard after the dipamd's).
pub struct Containerd {
    dir: TempDir,
    build: Build,
    child: Option<Child>,
    cri: Cri,
    /// Every sandbox and container ID made through this guard, to clean up by name.
    ids: Mutex<BTreeSet<String>>,
}

/// Which containerd: Debian's 1.6 (config format 2), or a 2.x built from its Go module by
/// tests/deps.sh (format 3: the CRI plugin is split into `io.containerd.cri.v1.images`,
/// `io.containerd.cri.v1.runtime` and `io.containerd.grpc.v1.cri`; containerd's
/// `docs/cri/config.md`).
#[derive(Debug, Clone)]
pub struct Build {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    /// A directory holding this build's `containerd-shim-runc-v2`, put first in containerd's
    /// PATH (where it looks the shim up); `None`: the one in PATH.
    pub shim_dir: Option<PathBuf>,
    /// The config format: 2 for 1.x, 3 for 2.x.
    pub format: u32,
    /// For logs and the compatibility matrix, e.g. `containerd 1.6 (Debian)`.
    pub label: String,
}

impl Build {
    /// Debian's containerd (1.6), from PATH.
    pub fn debian() -> Self {
        Self {
            containerd: which("containerd").unwrap_or_else(|| PathBuf::from("containerd")),
            ctr: which("ctr").unwrap_or_else(|| PathBuf::from("ctr")),
            shim_dir: None,
            format: 2,
            label: "containerd (Debian)".into(),
        }
    }

    /// containerd 2.x from the peers tests/deps.sh built: `containerd`, `ctr` and
    /// `containerd-shim-runc-v2`, in that order.
    pub fn from_peers(peers: &[crate::peers::Peer]) -> Self {
        let by = |n: &str| {
            peers
                .iter()
                .find(|p| p.name == n)
                .unwrap_or_else(|| panic!("no peer {n} given"))
        };
        let shim = by("containerd-shim-runc-v2");
        Self {
            containerd: by("containerd").path.clone(),
            ctr: by("ctr").path.clone(),
            shim_dir: shim.path.parent().map(Path::to_path_buf),
            format: 3,
            label: by("containerd").label(),
        }
    }
}

impl Containerd {
    /// Starts Debian's containerd with an empty conf_dir (pods then fail until
    /// [`Self::set_conflist`]) and the image imported.
    pub fn start() -> Self {
        Self::start_build(Build::debian())
    }

    /// Starts `build` the same way.
    pub fn start_build(build: Build) -> Self {
        let dir = crate::temp_dir("containerd-");
        let d = dir.path();
        for sub in ["root", "state", "net.d", "bin", "logs"] {
            std::fs::create_dir_all(d.join(sub)).expect("containerd's directories");
        }
        link_plugins(&d.join("bin"));
        let text = if build.format >= 3 {
            config::config_v3(d)
        } else {
            config::config(d)
        };
        std::fs::write(d.join("config.toml"), text).expect("containerd config");
        let child = process::spawn(d, &build);
        let cri = Cri::unix(d.join("containerd.sock"), "containerd");
        let mut c = Self {
            dir,
            build,
            child: Some(child),
            cri,
            ids: Mutex::new(BTreeSet::new()),
        };
        c.wait_ready();
        c.import_image();
        c
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Which containerd this is.
    pub fn build(&self) -> &Build {
        &self.build
    }

    /// Puts `path` in bin_dir as `name`, in place of the one linked at start (a plugin of
    /// another version: Debian's ptp 1.1.1 refuses a 1.1.0 config).
    pub fn use_plugin(&self, name: &str, path: &Path) {
        let link = self.bin_dir().join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(path, &link).expect("link a plugin into bin_dir");
    }

    /// containerd's own PID (for `dipamd --cri-endpoint` tests that restart it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether CRI's Status reports NetworkReady, and its reason and message when not.
    pub fn network_ready(&self) -> Result<(bool, String), Status> {
        self.cri.network_ready()
    }

    /// The gRPC socket (CRI's endpoint: `unix://` + this).
    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The CRI plugin's `cni.conf_dir`.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir().join("net.d")
    }

    /// The CRI plugin's `cni.bin_dir`: CNI_PATH of every call it makes.
    pub fn bin_dir(&self) -> PathBuf {
        self.dir().join("bin")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr --address <this containerd> <args>` (for work outside CRI, e.g. `-n k8s.io
    /// containers ls`, or `run --cni`, which uses /etc/cni/net.d and /opt/cni/bin, not this
    /// guard's conf_dir and bin_dir).
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.build.ctr)
            .arg("--address")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("run ctr")
    }

    /// Runs a future on this guard's runtime (callable from several threads at once).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.cri.block_on(f)
    }

    /// A CRI RuntimeService client (cheap: it shares the connection).
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        self.cri.runtime()
    }

    fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.cri.channel())
    }

    /// Runs `f` with a fresh client, bounded by [`crate::cri::CALL_TIMEOUT`].
    fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.cri.call(f)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.call(|mut c| async move { c.status(StatusRequest { verbose: false }).await })
            {
                Ok(s) => {
                    let runtime_ready = s
                        .status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .any(|c| c.r#type == "RuntimeReady" && c.status);
                    if runtime_ready {
                        return;
                    }
                    last = format!("{s:?}");
                }
                Err(e) => last = e.to_string(),
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("containerd exited during start ({status}):\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "containerd did not become ready within 30 s (last: {last}):\n{}",
            tail(&self.log(), 60)
        );
    }

    fn import_image(&self) {
        let tar = image_tar();
        let out = self.ctr(&["-n", "k8s.io", "images", "import", &tar.to_string_lossy()]);
        assert!(
            out.status.success(),
            "ctr images import {}: {}{}",
            tar.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // CRI learns of the image through containerd's events: wait until it sees it, so that
        // RunPodSandbox never tries to pull the sandbox image.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut images = self.images();
            let seen = self.block_on(async move {
                images
                    .image_status(ImageStatusRequest {
                        image: Some(ImageSpec {
                            image: IMAGE.into(),
                            ..Default::default()
                        }),
                        verbose: false,
                    })
                    .await
            });
            if matches!(&seen, Ok(r) if r.get_ref().image.is_some()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CRI does not see {IMAGE} 20 s after its import: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes `list` the one network of the CRI plugin and waits until CRI has loaded it.
    ///
    /// containerd 1.6 reloads conf_dir on fsnotify WRITE, RENAME and REMOVE events but
    /// ignores CREATE (docs/sources.md §10.2), and a file renamed into the directory is a
    /// CREATE. So the file is written under a name libcni skips inside conf_dir and renamed
    /// there, as `dipamctl install` does: the old name's RENAME makes containerd reload, and
    /// CRI never reads half a file.
    pub fn set_conflist(&self, list: &Value) {
        let name = list["name"].as_str().unwrap_or("net");
        let path = self.conf_dir().join(format!("10-{name}.conflist"));
        for e in std::fs::read_dir(self.conf_dir())
            .expect("read conf_dir")
            .flatten()
        {
            if e.path() != path {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let tmp = self.conf_dir().join(".conflist.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(list).expect("JSON")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename the conflist into place");
        self.wait_loaded(list);
    }

    /// Waits until CRI uses `list` for new pods.
    #[track_caller]
    pub fn wait_loaded(&self, list: &Value) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let loaded = self.loaded_network();
            if loaded.as_ref() == Some(list) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CRI did not load the conflist within 20 s; it has {loaded:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The conflist CRI uses for pods now (its verbose Status's `cniconfig`), if any.
    pub fn loaded_network(&self) -> Option<Value> {
        let s = self
            .call(|mut c| async move { c.status(StatusRequest { verbose: true }).await })
            .ok()?;
        let cni: Value = serde_json::from_str(s.info.get("cniconfig")?).ok()?;
        // Networks[0] is containerd's own loopback; the conf_dir's network follows.
        cni["Networks"]
            .as_array()?
            .iter()
            .map(|n| &n["Config"])
            .find(|c| c["Name"] != "cni-loopback")
            .and_then(|c| serde_json::from_str(c["Source"].as_str()?).ok())
    }

    /// A pod config named `name` (namespace `default`, a unique UID) with these
    /// (host port, container port) TCP mappings.
    pub fn pod_config(&self, name: &str, ports: &[(u16, u16)]) -> PodSandboxConfig {
        PodSandboxConfig {
            port_mappings: ports
                .iter()
                .map(|&(host, container)| PortMapping {
                    protocol: k8s_cri::v1::Protocol::Tcp as i32,
                    container_port: container.into(),
                    host_port: host.into(),
                    host_ip: String::new(),
                })
                .collect(),
            ..crate::cri::pod_config(name, &self.dir().join("logs"))
        }
    }

    /// RunPodSandbox with `config`: the CNI ADD happens inside it.
    pub fn run_pod_with(&self, config: PodSandboxConfig) -> Result<Pod, Status> {
        let id = self.cri.run_pod_sandbox(config.clone())?;
        self.remember(&id);
        Ok(Pod { id, config })
    }

    /// RunPodSandbox for a pod named `name`, with no port mappings.
    pub fn run_pod(&self, name: &str) -> Result<Pod, Status> {
        self.run_pod_with(self.pod_config(name, &[]))
    }

    /// CreateContainer + StartContainer: a container in `pod` sleeping forever (something to
    /// ExecSync in). Returns its ID.
    pub fn start_sleeper(&self, pod: &Pod) -> Result<String, Status> {
        let req = CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "sleeper".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "2147483647".into()],
                log_path: format!("{}-sleeper.log", pod.id),
                ..Default::default()
            }),
            sandbox_config: Some(pod.config.clone()),
        };
        let id = self
            .call(|mut c| async move { c.create_container(req).await })?
            .container_id;
        self.remember(&id);
        let start = StartContainerRequest {
            container_id: id.clone(),
        };
        self.call(|mut c| async move { c.start_container(start).await })?;
        Ok(id)
    }

    /// ExecSync `cmd` in `container`: (exit code, stdout, stderr).
    pub fn exec_sync(
        &self,
        container: &str,
        cmd: &[&str],
    ) -> Result<(i32, String, String), Status> {
        let req = ExecSyncRequest {
            container_id: container.into(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 30,
        };
        let r = self.call(|mut c| async move { c.exec_sync(req).await })?;
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        ))
    }

    crate::cri::sandbox_calls!();

    /// PodSandboxStatus, verbose (its `info` holds containerd's view, with the netns path
    /// and the pause process's pid).
    pub fn pod_status(&self, id: &str) -> Result<PodSandboxStatusResponse, Status> {
        self.cri.pod_status(id, true)
    }

    /// The pid of the pod's sandbox (pause) process, from containerd's verbose status.
    pub fn pause_pid(&self, id: &str) -> Option<i32> {
        let s = self.pod_status(id).ok()?;
        let info: Value = serde_json::from_str(s.info.get("info")?).ok()?;
        info["pid"].as_i64().and_then(|p| i32::try_from(p).ok())
    }

    /// The pod's network namespace path, from containerd's verbose status.
    pub fn netns_path(&self, id: &str) -> Option<String> {
        netns_of(&self.pod_status(id).ok()?)
    }

    fn remember(&self, id: &str) {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.to_owned());
    }

    /// Processes whose command line names this containerd's socket: its shims
    /// (`containerd-shim-runc-v2 -namespace k8s.io -id ID -address SOCKET`).
    fn shims(&self) -> Vec<i32> {
        let socket = self.socket();
        let needle = socket.as_os_str().as_encoded_bytes();
        procs()
            .into_iter()
            .filter(|&pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    let mut args = c.split(|b| *b == 0);
                    let is_shim = args.next().is_some_and(|a0| {
                        Path::new(std::ffi::OsStr::from_bytes(a0))
                            .file_name()
                            .is_some_and(|n| n.as_bytes().starts_with(b"containerd-shim"))
                    });
                    is_shim && args.any(|a| a == needle)
                })
            })
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- containerd log ({}) -----\n{}\n----- end of containerd log -----",
                self.dir().join("containerd.log").display(),
                tail(&self.log(), 60)
            );
        }
        // Through CRI first, so that every pod's DELs reach the CNI plugins (and dipam frees
        // what it holds). Bounded: containerd may be wedged by the test.
        let mut c = self.runtime();
        let cleanup = async move {
            let mut seen = Vec::new();
            let Ok(pods) = c
                .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                .await
            else {
                return seen;
            };
            for p in pods.into_inner().items {
                let netns = c
                    .pod_sandbox_status(PodSandboxStatusRequest {
                        pod_sandbox_id: p.id.clone(),
                        verbose: true,
                    })
                    .await
                    .ok()
                    .and_then(|s| netns_of(s.get_ref()));
                seen.push((p.id.clone(), netns));
                let _ = c
                    .stop_pod_sandbox(StopPodSandboxRequest {
                        pod_sandbox_id: p.id.clone(),
                    })
                    .await;
                let _ = c
                    .remove_pod_sandbox(RemovePodSandboxRequest {
                        pod_sandbox_id: p.id,
                    })
                    .await;
            }
            seen
        };
        let seen = self
            .cri
            .block_on(async { tokio::time::timeout(Duration::from_secs(60), cleanup).await })
            .unwrap_or_default();
        let mut netns = Vec::new();
        for (id, ns) in seen {
            self.remember(&id);
            netns.extend(ns);
        }
        let shims = self.shims();
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child we have not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Left over only when CRI could not remove a pod: the shims' children (each pod's
        // processes), then the shims.
        for shim in shims.iter().chain(&self.shims()) {
            for kid in children(*shim) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(kid, libc::SIGKILL) };
            }
            // SAFETY: as above.
            unsafe { libc::kill(*shim, libc::SIGKILL) };
        }
        unmount_under(self.dir());
        let ids = std::mem::take(
            &mut *self
                .ids
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for id in &ids {
            let _ = std::fs::remove_dir_all(Path::new(RUN_DIR).join("runc/k8s.io").join(id));
            remove_cgroups(id);
            // A shim's socket: /run/containerd/s/<sha256 of "<address>/<namespace>/<id>">
            // (containerd's runtime/v2/shim `SocketAddress`), one per sandbox.
            let key = format!("{}/k8s.io/{id}", self.socket().display());
            let _ = std::fs::remove_file(Path::new(RUN_DIR).join("s").join(sha256_of(&key)));
        }
        // Left over only when CRI could not stop a pod: its netns (a bind mount of a file).
        for ns in netns.iter().filter(|ns| Path::new(ns).exists()) {
            if let Ok(c) = std::ffi::CString::new(ns.as_bytes()) {
                // SAFETY: umount2 with a valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
            let _ = std::fs::remove_file(ns);
        }
    }
}

/// The netns path in a verbose PodSandboxStatus (containerd's `info`: the runtime spec).
fn netns_of(status: &PodSandboxStatusResponse) -> Option<String> {
    let info: Value = serde_json::from_str(status.info.get("info")?).ok()?;
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")?["path"]
        .as_str()
        .map(str::to_owned)
}

/// The CRI plugin's bin_dir: dipam's binaries and the reference plugins, symlinked (CRI
/// passes one directory as CNI_PATH).
pub(crate) fn link_plugins(bin: &Path) {
    for dir in [bins::dir(), Path::new(bins::REFERENCE_PLUGINS)] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let target = e.path();
            let is_exe = std::fs::metadata(&target).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            });
            let link = bin.join(e.file_name());
            if is_exe && !link.exists() {
                std::os::unix::fs::symlink(&target, &link).expect("symlink a plugin into bin_dir");
            }
        }
    }
}

/// The image as a docker-archive tar, built once per busybox binary and cached.
pub(crate) fn image_tar() -> PathBuf {
    let busybox = busybox().expect("busybox (checked by unavailable())");
    let meta = std::fs::metadata(&busybox).expect("stat busybox");
    let cache = std::env::var_os("DIPAM_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/dipam-tests"));
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    // v1: the layout below; bump it when the image changes.
    let tar = cache.join(format!("containerd-busybox-v1-{}-{mtime}.tar", meta.len()));
    if tar.is_file() {
        return tar;
    }
    std::fs::create_dir_all(&cache).expect("create the test cache");
    let work = tempfile::Builder::new()
        .prefix("image-")
        .tempdir_in(&cache)
        .expect("temp dir in the test cache");
    let w = work.path();
    let rootfs = w.join("rootfs");
    for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "root"] {
        std::fs::create_dir_all(rootfs.join(d)).expect("rootfs dirs");
    }
    std::fs::copy(&busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in [
        "sh", "ip", "ping", "sleep", "cat", "ls", "nc", "wget", "hostname", "true",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("applet");
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    )
    .expect("passwd");
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
    let archive = w.join("archive");
    std::fs::create_dir_all(archive.join("layer")).expect("archive dir");
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
        ])
        .arg(&rootfs)
        .arg("-cf")
        .arg(archive.join("layer/layer.tar"))
        .arg("."));
    let diff_id = sha256(&archive.join("layer/layer.tar"));
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin"],
            "Cmd": ["sleep", "2147483647"],
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    });
    std::fs::write(
        archive.join("config.json"),
        serde_json::to_vec(&config).expect("JSON"),
    )
    .expect("config.json");
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": [IMAGE],
        "Layers": ["layer/layer.tar"],
    }]);
    std::fs::write(
        archive.join("manifest.json"),
        serde_json::to_vec(&manifest).expect("JSON"),
    )
    .expect("manifest.json");
    let partial = w.join("image.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&archive)
        .arg("-cf")
        .arg(&partial)
        .args(["manifest.json", "config.json", "layer"]));
    // Renamed into place: a concurrent test never reads half a tar.
    std::fs::rename(&partial, &tar).expect("rename the image into the cache");
    tar
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The SHA-256 of `text`, in hex (empty when sha256sum cannot run).
fn sha256_of(text: &str) -> String {
    use std::io::Write as _;
    let Ok(mut child) = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    else {
        return String::new();
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(text.as_bytes());
    }
    child
        .wait_with_output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
}

fn procs() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The pids whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    procs()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Detaches every mount under `dir`, deepest first (rootfs overlays, the sandboxes' shm).
pub(crate) fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2 with a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// runc's cgroups for `id` (cgroupfs driver: `<controller>/k8s.io/<id>`), when runc could not
/// remove them itself.
fn remove_cgroups(id: &str) {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join("k8s.io").join(id)];
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        dirs.push(e.path().join("k8s.io").join(id));
    }
    for d in dirs {
        let _ = std::fs::remove_dir(d);
    }
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
