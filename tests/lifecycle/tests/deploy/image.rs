//! The container image (deploy/Containerfile): built offline with podman, FROM scratch, from
//! the static binaries, and run the way deploy/kubernetes/dipam.yaml runs it: `dipamd
//! --version` and `dipamctl --help` answer; there is no shell in it; the init container's
//! command (taken from the manifest) reads its node's pod CIDR from the API server (a
//! stand-in, src/kubeapi.rs, reached over the host's network with the service account the
//! kubelet would mount) and installs the plugin and the ConfigMap's conflist with that range
//! into the host directories; dipamd runs with the manifest's arguments under the DaemonSet's
//! capabilities (drop ALL, add the three), becomes ready by the readiness probe's own exec
//! command (no `sh`), and drains on SIGTERM with exit status 0.
//!
//! Everything podman touches is private to the test (its own containers.conf, `--root`,
//! `--runroot`, `--tmpdir`), with no registry: the image is built from `FROM scratch` and
//! `COPY`. The binaries go into the build context stripped of debug info (a debug build is
//! ~400 MB; podman's vfs driver copies the image for every container).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    KubeApi, bins, mode, named,
    podman::{self, Podman},
    unique, yaml,
};
use serde_json::{Value, json};

/// Why the image cannot be built here, if it cannot.
fn unavailable() -> Option<String> {
    podman::unavailable(
        "rootful podman needs root",
        &["podman", "runc", "strip", "timeout"],
        "tests/deps.sh installs podman and runc",
    )
}

fn manifest() -> Vec<Value> {
    let text =
        std::fs::read_to_string(bins::workspace().join("deploy/kubernetes/dipam.yaml")).unwrap();
    yaml::parse(&text).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn container<'a>(docs: &'a [Value], list: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "DaemonSet")
        .and_then(|d| d["spec"]["template"]["spec"][list].as_array())
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry named {name} in the manifest"))
}

/// `-v HOST:PATH` for each of the container's volumeMounts, from `host(volume name)`.
fn mounts(c: &Value, host: impl Fn(&str) -> PathBuf) -> Vec<String> {
    let mut out = Vec::new();
    for m in c["volumeMounts"].as_array().unwrap() {
        let src = host(m["name"].as_str().unwrap());
        std::fs::create_dir_all(&src).unwrap();
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        out.push("-v".into());
        out.push(format!(
            "{}:{}{ro}",
            src.display(),
            m["mountPath"].as_str().unwrap()
        ));
    }
    out
}

/// The DaemonSet container's capabilities as podman flags.
fn capabilities(c: &Value) -> Vec<String> {
    let caps = &c["securityContext"]["capabilities"];
    let mut out = Vec::new();
    for d in strings(&caps["drop"]) {
        out.push(format!("--cap-drop={d}"));
    }
    for a in strings(&caps["add"]) {
        out.push(format!("--cap-add={a}"));
    }
    if c["securityContext"]["allowPrivilegeEscalation"] == false {
        out.push("--security-opt=no-new-privileges".into());
    }
    out
}

/// Container `c`'s command as the kubelet runs it on node-1: it expands `$(NODE_NAME)`,
/// which the downward API sets in a cluster.
fn command_on_node_1(c: &Value) -> Vec<String> {
    strings(&c["command"])
        .into_iter()
        .map(|a| a.replace("$(NODE_NAME)", "node-1"))
        .collect()
}

/// The build context: exactly the three binaries, without their debug info.
fn context(dir: &Path) {
    bins::copy_stripped(dir);
}

#[test]
fn the_image_builds_offline_and_runs_as_the_daemonset_runs_it() {
    dipam_lifecycle::require!(unavailable());
    let podman = Podman::new("image-", |_| None).removing_images();
    let ctx = podman.path("context");
    context(&ctx);
    let image = format!("localhost/{}:test", unique("dipam"));
    let containerfile = bins::workspace().join("deploy/Containerfile");
    podman.ok(&[
        "build",
        "--pull=never",
        "-f",
        containerfile.to_str().unwrap(),
        "-t",
        &image,
        ctx.to_str().unwrap(),
    ]);

    let run = |args: &[&str]| {
        let mut all = vec!["run", "--rm", "--network", "none", image.as_str()];
        all.extend_from_slice(args);
        podman.run(&all)
    };
    let version = run(&["dipamd", "--version"]);
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(version.status.success(), "{version:?}");
    assert!(
        text.starts_with("dipamd ") && text.contains(env!("CARGO_PKG_VERSION")),
        "{text}"
    );
    let help = run(&["dipamctl", "--help"]);
    assert!(help.status.success(), "{help:?}");
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("Usage: dipamctl"),
        "{help:?}"
    );
    // Nothing but dipam: no shell to exec into, so nothing in the pod may need one.
    assert!(!run(&["sh", "-c", "true"]).status.success());
    let config: Value = serde_json::from_str(&podman.ok(&["image", "inspect", &image])).unwrap();
    let layers = config[0]["RootFS"]["Layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "FROM scratch + one COPY: {config}");

    // The host's directories, each a temp dir standing in for the hostPath volume.
    let docs = manifest();
    let hostpath = |volume: &str| -> PathBuf {
        let spec =
            &docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"];
        let vol = named(&spec["volumes"], volume);
        match vol["hostPath"]["path"].as_str() {
            Some(p) => podman.path("host").join(p.trim_start_matches('/')),
            None => podman.path("configmap").join(volume),
        }
    };
    // The ConfigMap's files, as the kubelet projects them.
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let cm_dir = hostpath("conflist");
    std::fs::create_dir_all(&cm_dir).unwrap();
    for (name, text) in cm["data"].as_object().unwrap() {
        std::fs::write(cm_dir.join(name), text.as_str().unwrap()).unwrap();
    }
    // The node's own plugins: dipamd runs host-local from the host's /opt/cni/bin, in the
    // image, where there is no libc. The upstream release binaries nodes install there are
    // static; Debian's host-local is linked against glibc and cannot start in this image
    // ("exec /opt/cni/bin/host-local: No such file or directory", deploy/README.md says
    // so). The real host-local of today's plugins, built static by tests/deps.sh
    // (tests/peers/pins: CGO_ENABLED=0), is what such a node has there.
    let cni_bin = hostpath("cni-bin");
    std::fs::create_dir_all(&cni_bin).unwrap();
    // The ConfigMap's conflist chains portmap: a node that has host-local has it too, and
    // `dipamctl install` refuses a conflist whose chained plugins the node lacks.
    for name in ["host-local", "portmap"] {
        let peer = dipam_lifecycle::peers::require(name);
        std::fs::copy(&peer.path, cni_bin.join(name)).unwrap();
    }

    // The init container, exactly as the manifest runs it and as the kubelet runs it: on the
    // host's network (the pod's hostNetwork), $(NODE_NAME) from the downward API, the
    // in-cluster variables naming the API server, and the service account's token and CA
    // where the kubelet mounts them. The node's pod CIDR is the range the conflist gets.
    let api = KubeApi::start();
    api.set_node("node-1", &["10.244.0.0/24"]);
    let pod = &docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let init = container(&docs, "initContainers", "install");
    let mut args: Vec<String> = vec!["run".into(), "--rm".into(), "--network=host".into()];
    if init["securityContext"]["privileged"] == true {
        args.push("--privileged".into());
    }
    args.extend(mounts(init, hostpath));
    args.push("-v".into());
    args.push(format!(
        "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
        api.serviceaccount_dir().display()
    ));
    for (k, v) in api.service_env() {
        args.push("-e".into());
        args.push(format!("{k}={v}"));
    }
    args.push(image.clone());
    args.extend(command_on_node_1(init));
    podman.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        api.requests().len(),
        1,
        "the init container asked for its node"
    );
    let plugin = cni_bin.join("dipam");
    assert_eq!(mode(&plugin), 0o755);
    assert_eq!(
        std::fs::read(&plugin).unwrap(),
        std::fs::read(ctx.join("dipam")).unwrap(),
        "the image's own plugin"
    );
    let conflist = hostpath("cni-conf").join("10-dipam.conflist");
    let mut expected: Value =
        serde_json::from_str(cm["data"]["10-dipam.conflist"].as_str().unwrap()).unwrap();
    expected["plugins"][0]["ipam"]["ranges"] = json!([[{"subnet": "10.244.0.0/24"}]]);
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(&conflist).unwrap()).unwrap(),
        expected,
        "the ConfigMap's conflist with the node's range"
    );

    // dipamd, with the manifest's command, mounts and capabilities. NODE_NAME comes from the
    // downward API in a cluster; the kubelet expands $(NODE_NAME) in the command.
    let d = container(&docs, "containers", "dipamd");
    let name = unique("dipamd");
    let mut args: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--name".into(),
        name.clone(),
        "--network=none".into(),
    ];
    args.extend(capabilities(d));
    args.extend(mounts(d, hostpath));
    args.push(image.clone());
    args.extend(command_on_node_1(d));
    podman.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());

    // The readiness probe's exec command, run in the container as the kubelet runs it.
    let probe = strings(&d["readinessProbe"]["exec"]["command"]);
    assert_eq!(probe[0], "dipamctl", "exec'd directly, no shell: {probe:?}");
    let mut exec: Vec<String> = vec!["exec".into(), name.clone()];
    exec.extend(probe.iter().cloned());
    let exec: Vec<&str> = exec.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = podman.run(&exec);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready: {out:?}\nlogs: {}",
            podman.ok(&["logs", &name])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Ready means the agent's router and health addresses are held, in the host's store
    // (host-local's default dataDir, /var/lib/cni/networks/<network>).
    let store = hostpath("cni-state").join("networks/dipam");
    let held = std::fs::read_dir(&store)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().starts_with("10.244.0.")
        })
        .count();
    assert_eq!(held, 2, "router + health in {}", store.display());

    // SIGTERM (as the kubelet stops it): dipamd drains and exits 0, well inside the grace.
    podman.ok(&["stop", "--time", "25", &name]);
    let state: Value = serde_json::from_str(&podman.ok(&["inspect", &name])).unwrap();
    assert_eq!(
        state[0]["State"]["ExitCode"],
        0,
        "{}",
        podman.ok(&["logs", &name])
    );
}
