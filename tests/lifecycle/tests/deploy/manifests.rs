//! Every manifest in deploy/kubernetes validates against the Kubernetes API's own schemas, as
//! `kubectl apply` would check it before a node ever sees it: a misspelled field, a string
//! where the API wants a number, or a kind the API does not have fails here, not in a user's
//! cluster (where an unknown field is dropped with a warning at best, and the DaemonSet runs
//! without the setting it was meant to have).
//!
//! The validator is `kubernetes-validate` from PyPI, which bundles the API's OpenAPI schemas
//! per Kubernetes release; tests/deps.sh installs a pinned version into a venv under
//! `$DIPAM_TEST_CACHE` (default /var/cache/dipam-tests). It runs with `--strict`, which
//! rejects properties the schema does not define (without it a misspelled field passes).
//! When deps.sh could not install it, it records why and these tests skip, printing that;
//! when deps.sh has not run at all, they fail. No root needed, except for the azure mounts'
//! test, which runs the real azure-vnet-ipam to learn the paths it uses.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use dipam_lifecycle::{bins, deps, named, yaml};
use serde_json::Value;

/// The Kubernetes releases the manifests are validated against: 1.30, the oldest the
/// DaemonSet is written for (containerd 1.7-era nodes, the ConfigMap's cniVersion 1.0.0;
/// everything it uses is GA there), and 1.37, the newest the pinned validator bundles. A
/// field added after the first or removed before the second fails one of them.
const KUBERNETES: [&str; 2] = ["1.30.0", "1.37.0"];

/// The validator, or `None` (after saying why) when tests/deps.sh could not install it.
fn validator() -> Option<PathBuf> {
    deps::venv_tool(
        module_path!(),
        "kubernetes-validate",
        "kubernetes-validate",
        "bin/kubernetes-validate",
    )
}

macro_rules! require_validator {
    () => {
        match validator() {
            Some(exe) => exe,
            None => return,
        }
    };
}

/// Every YAML file under deploy/kubernetes, sorted.
fn manifest_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&bins::workspace().join("deploy/kubernetes"), &mut out);
    out.sort();
    out
}

/// The documents of a manifest file (comment-only documents dropped).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    yaml::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// How the validator names a resource it checked: `daemonset/dipam`.
fn resource(doc: &Value) -> String {
    let kind = doc["kind"].as_str().unwrap_or("<no kind>").to_lowercase();
    let name = doc["metadata"]["name"].as_str().unwrap_or("<no name>");
    format!("{kind}/{name}")
}

/// Runs the validator on `file` (holding `docs`) for Kubernetes `version`, and accepts only
/// this: exit 0, no line that is not INFO (an unknown kind is only a WARN with exit 0, and
/// would otherwise pass unchecked), and one "passed" line for every document.
fn verdict(exe: &Path, file: &Path, docs: &[Value], version: &str) -> Result<(), String> {
    let out = Command::new(exe)
        .args(["--strict", "--kubernetes-version", version])
        .arg(file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let fail = |why: &str| Err(format!("{} for {version}: {why}:\n{text}", file.display()));
    if !out.status.success() {
        return fail(&format!("the validator exited with {}", out.status));
    }
    if let Some(line) = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with("INFO "))
    {
        return fail(&format!("not clean: {line:?}"));
    }
    let minor = version.rsplit_once('.').unwrap().0;
    let passed = text.lines().filter(|l| l.contains(" passed for ")).count();
    if passed != docs.len() {
        return fail(&format!("{passed} passed of {} documents", docs.len()));
    }
    for doc in docs {
        let line = format!(
            "passed for resource {} against version {minor}",
            resource(doc)
        );
        if !text.contains(&line) {
            return fail(&format!("no {line:?}"));
        }
    }
    Ok(())
}

fn validator_version(exe: &Path) -> String {
    let out = Command::new(exe).arg("--version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Every document of every manifest (the DaemonSet, the ConfigMap, whatever else is added
/// there) validates against the schemas of each Kubernetes release in [`KUBERNETES`].
#[test]
fn every_manifest_validates_against_the_kubernetes_api_schemas() {
    let exe = require_validator!();
    let files = manifest_files();
    assert!(!files.is_empty(), "no manifests in deploy/kubernetes");
    let mut kinds = Vec::new();
    for file in &files {
        let docs = documents(file);
        assert!(!docs.is_empty(), "{}: no documents", file.display());
        for version in KUBERNETES {
            verdict(&exe, file, &docs, version).unwrap_or_else(|e| panic!("{e}"));
        }
        kinds.extend(docs.iter().map(|d| d["kind"].as_str().unwrap().to_owned()));
    }
    // The walk found what a node needs, so an emptied or misnamed file cannot pass by
    // validating nothing.
    for needed in [
        "DaemonSet",
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        assert!(
            kinds.iter().any(|k| k == needed),
            "no {needed} in {kinds:?}"
        );
    }
    eprintln!(
        "kubernetes-validate {}: {} documents in {} files valid for Kubernetes {KUBERNETES:?}",
        validator_version(&exe),
        kinds.len(),
        files.len()
    );
}

/// The check above can fail: copies of the DaemonSet manifest broken the ways a hand edit
/// breaks one are each refused, for every release.
#[test]
fn a_broken_manifest_fails_validation() {
    let exe = require_validator!();
    let path = bins::workspace().join("deploy/kubernetes/dipam.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edit = |from: &str, to: &str| {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from:?} is not in the manifest once"
        );
        text.replacen(from, to, 1)
    };
    let cases = [
        (
            "a misspelled field in the dipamd container",
            edit("\n          resources:\n", "\n          resource:\n"),
            "'resource' was unexpected",
        ),
        (
            "a number written as a string",
            edit(
                "terminationGracePeriodSeconds: 30\n",
                "terminationGracePeriodSeconds: \"30\"\n",
            ),
            "is not of type 'integer'",
        ),
        (
            "a kind the API does not have",
            edit("kind: ConfigMap\n", "kind: ConfigMaps\n"),
            "Couldn't find schema for kind ConfigMaps",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, broken, expected) in cases {
        let file = dir.path().join("dipam.yaml");
        std::fs::write(&file, &broken).unwrap();
        let docs = documents(&file);
        for version in KUBERNETES {
            let e = verdict(&exe, &file, &docs, version)
                .expect_err(&format!("{what}: validated for {version}"));
            assert!(e.contains(expected), "{what}: {e}");
        }
    }
}

/// Every document of every manifest.
fn all_documents() -> Vec<Value> {
    manifest_files().iter().flat_map(|f| documents(f)).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}: {found:#?}");
    found[0]
}

/// The DaemonSet's pod may do exactly what `dipamctl install --ranges-from-node` does, `GET
/// /api/v1/nodes/NAME`, and nothing else: its ServiceAccount is bound (by every binding that
/// names it) to one ClusterRole with one rule, `get` on core `nodes`. No list or watch (it
/// reads one node by name), no write, no other resource, no wildcard.
#[test]
fn rbac_is_exactly_get_on_nodes_for_the_daemonsets_service_account() {
    let docs = all_documents();
    let ds = one(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let sa = one(&docs, "ServiceAccount");
    let (name, namespace) = (&sa["metadata"]["name"], &sa["metadata"]["namespace"]);
    assert_eq!(
        pod["serviceAccountName"], *name,
        "the pod runs as the ServiceAccount"
    );
    assert_eq!(*namespace, ds["metadata"]["namespace"]);
    // The kubelet mounts the token unless one of them says not to.
    assert_ne!(pod["automountServiceAccountToken"], false);
    assert_ne!(sa["automountServiceAccountToken"], false);

    let subject =
        serde_json::json!({"kind": "ServiceAccount", "name": name, "namespace": namespace});
    let bindings: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .filter(|d| {
            d["subjects"]
                .as_array()
                .is_some_and(|s| s.contains(&subject))
        })
        .collect();
    assert_eq!(bindings.len(), 1, "{bindings:#?}");
    let binding = bindings[0];
    assert_eq!(binding["kind"], "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([subject]),
        "only the ServiceAccount"
    );
    assert_eq!(binding["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    let role = one(&docs, "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
        "exactly get on nodes"
    );
    assert!(role.get("aggregationRule").is_none());
    // Nothing else in the manifests grants anything.
    assert!(
        !docs.iter().any(|d| d["kind"] == "Role"),
        "no namespaced Role is needed"
    );
}

/// The init container is wired as `--ranges-from-node` needs: NODE from the downward API in
/// its own env (Kubernetes expands `$(NODE_NAME)` in a container's command from that
/// container's env only), `--wait` so that a node whose podCIDR is not assigned yet waits
/// instead of crash-looping, the in-cluster defaults for the API server, token and CA (no
/// override in the manifest), and a ConfigMap conflist with no range of its own to share.
#[test]
fn the_init_container_reads_its_own_nodes_ranges_and_waits_for_them() {
    let docs = all_documents();
    let pod = &one(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let init = named(&pod["initContainers"], "install");
    let argv: Vec<&str> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .chain(init["args"].as_array().into_iter().flatten())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[..2], ["dipamctl", "install"]);
    let at = argv
        .iter()
        .position(|a| *a == "--ranges-from-node")
        .expect("--ranges-from-node");
    assert_eq!(argv[at + 1], "$(NODE_NAME)");
    assert!(argv.contains(&"--wait"), "{argv:?}");
    for flag in ["--kube-api", "--kube-token-file", "--kube-ca-file"] {
        assert!(
            !argv.iter().any(|a| a.starts_with(flag)),
            "{flag}: the in-cluster default is the one that works in the pod"
        );
    }
    let env = init["env"].as_array().expect("the init container's env");
    let node = env
        .iter()
        .find(|e| e["name"] == "NODE_NAME")
        .expect("NODE_NAME in the init container's env");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");

    // The ConfigMap's conflist has no range: each node's comes from its Node object.
    let cm = one(&docs, "ConfigMap");
    let at = argv.iter().position(|a| *a == "--conflist").unwrap();
    let key = Path::new(argv[at + 1])
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let list: Value = serde_json::from_str(cm["data"][key].as_str().unwrap()).unwrap();
    let plugin = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "dipam")
        .expect("dipam in the ConfigMap's conflist");
    let ipam = &plugin["ipam"];
    assert_eq!(ipam["type"], "host-local");
    for key in ["ranges", "subnet", "rangeStart", "rangeEnd"] {
        assert!(
            ipam.get(key).is_none(),
            "a shared {key} in the template: {ipam:#}"
        );
    }
}

/// containerd's CRI socket, the DaemonSet's `--cri-endpoint` (docs/configuration.md).
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// A container's argv (command, then args) as `--flag value` pairs (`--flag=value` too).
fn flag_value(c: &Value, name: &str) -> Option<String> {
    let argv: Vec<&str> = c["command"]
        .as_array()
        .into_iter()
        .chain(c["args"].as_array())
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    argv.iter().enumerate().find_map(|(i, a)| {
        if *a == name {
            argv.get(i + 1).map(|v| (*v).to_owned())
        } else {
            a.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
                .map(str::to_owned)
        }
    })
}

/// The runtime-aware GC is on in the DaemonSet, and dipamd can reach the socket it names:
/// `--cri-endpoint` is a unix socket inside a hostPath volume mounted at the host's own path
/// (the runtime listens on the host's path; mounted elsewhere, dipamd would dial nothing),
/// read-only, and, being a directory of the runtime's, with the host's unmounts propagated
/// (it holds the containers' rootfs mounts, which this pod must not pin). Its type lets
/// dipamd start on a node where the directory is missing (another runtime): pods' networking
/// must not depend on the GC. `--runtime-gc-interval` stays above 0 (dipamd refuses
/// `--cri-endpoint` without it).
fn cri_endpoint_and_mount_agree(docs: &[Value]) -> Result<(), String> {
    let pod = &one(docs, "DaemonSet")["spec"]["template"]["spec"];
    let d = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "dipamd"))
        .ok_or("no dipamd container")?;
    let endpoint = flag_value(d, "--cri-endpoint").ok_or("dipamd has no --cri-endpoint")?;
    let socket = endpoint
        .strip_prefix("unix://")
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| format!("--cri-endpoint {endpoint} is not unix:///PATH"))?;
    if let Some(every) = flag_value(d, "--runtime-gc-interval")
        && every
            .parse::<f64>()
            .map_or(true, |s| s.is_nan() || s <= 0.0)
    {
        return Err(format!(
            "--runtime-gc-interval {every}: the GC would never run"
        ));
    }
    let mounts = d["volumeMounts"].as_array().ok_or("no volumeMounts")?;
    let (mount, volume) = mount_of(pod, mounts, Path::new(socket))?;
    let path = mount["mountPath"].as_str().unwrap_or_default();
    let host = &volume["hostPath"];
    if host["path"].as_str() != Some(path) {
        return Err(format!(
            "{socket} is mounted at {path} from {volume}: not a hostPath at the host's own path"
        ));
    }
    if mount["readOnly"] != true {
        return Err(format!("{path} is mounted writable: dipamd only connects"));
    }
    if path != socket {
        if mount["mountPropagation"] != "HostToContainer" {
            return Err(format!(
                "{path} is a directory of the runtime's, mounted without HostToContainer: \
                 this pod would pin the containers' rootfs mounts"
            ));
        }
        if host["type"] != "DirectoryOrCreate" {
            return Err(format!(
                "{path}'s hostPath type {}: dipamd would not start where it is missing",
                host["type"]
            ));
        }
    }
    Ok(())
}

/// The DaemonSet turns the runtime-aware GC on for containerd (whose socket path it names,
/// docs/configuration.md) and mounts that socket's directory the way dipamd can use it; and
/// the check refuses the ways a hand edit (for CRI-O, say) breaks the pair.
#[test]
fn the_cri_endpoint_and_the_runtime_socket_mount_agree() {
    let docs = all_documents();
    cri_endpoint_and_mount_agree(&docs).unwrap();
    let d = &one(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"];
    let d = named(d, "dipamd");
    assert_eq!(
        flag_value(d, "--cri-endpoint").as_deref(),
        Some(format!("unix://{CONTAINERD_SOCKET}").as_str())
    );

    let path = bins::workspace().join("deploy/kubernetes/dipam.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edit = |edits: &[(&str, &str)]| {
        let mut t = text.clone();
        for (from, to) in edits {
            assert_eq!(
                t.matches(from).count(),
                1,
                "{from:?} is not in the manifest once"
            );
            t = t.replacen(from, to, 1);
        }
        yaml::parse(&t).unwrap()
    };
    let cases: [(&str, Vec<Value>, &str); 6] = [
        (
            "the endpoint switched to CRI-O, the mount left",
            edit(&[(
                "- unix:///run/containerd/containerd.sock",
                "- unix:///var/run/crio/crio.sock",
            )]),
            "no volume mount holds /var/run/crio/crio.sock",
        ),
        (
            "the flag gone",
            edit(&[("            - --cri-endpoint\n", "")]),
            "no --cri-endpoint",
        ),
        (
            "mounted elsewhere in the container",
            edit(&[("mountPath: /run/containerd\n", "mountPath: /run/cri\n")]),
            "no volume mount holds",
        ),
        (
            "the host's directory is another one",
            edit(&[("path: /run/containerd\n", "path: /var/run/docker\n")]),
            "not a hostPath at the host's own path",
        ),
        (
            "without HostToContainer",
            edit(&[(
                "mountPropagation: HostToContainer\n",
                "mountPropagation: None\n",
            )]),
            "pin the containers' rootfs mounts",
        ),
        (
            "a type that stops dipamd where the directory is missing",
            edit(&[(
                "path: /run/containerd\n            type: DirectoryOrCreate\n",
                "path: /run/containerd\n            type: Directory\n",
            )]),
            "would not start where it is missing",
        ),
    ];
    for (what, docs, expected) in cases {
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let e = cri_endpoint_and_mount_agree(&docs).expect_err(what);
        assert!(e.contains(expected), "{what}: {e}");
    }
}

/// The shipped manifest with its `azure-*` volume mounts and volumes uncommented, as its
/// comment and docs/configuration.md tell an operator with azure-vnet-ipam to do: each
/// line from `# - name: azure-...` on, through the `#   ...` lines that continue it.
fn with_azure_mounts_uncommented(text: &str) -> String {
    let mut out = String::new();
    let mut open = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(rest) = trimmed.strip_prefix("# - name: azure-") {
            open = true;
            out.push_str(&format!("{indent}- name: azure-{rest}\n"));
        } else if open && trimmed.starts_with("#   ") {
            out.push_str(&format!("{indent}{}\n", &trimmed[2..]));
        } else {
            open = false;
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The host's path for a path as a node's processes name it: /var/run is /run (a symlink on
/// every systemd host), so the plugin's /var/run/X is the host's /run/X.
fn on_the_host(p: &Path) -> PathBuf {
    p.strip_prefix("/var/run")
        .map_or_else(|_| p.to_owned(), |rest| Path::new("/run").join(rest))
}

/// Every path of `paths` (as azure-vnet-ipam names them) reaches the host's own file through
/// the dipamd container's mounts: the innermost mount holding it is a hostPath volume whose
/// host directory is that file's on the host, writable where the plugin writes (all but
/// /etc/kubernetes), and a directory (the plugin replaces its state by renaming a temporary
/// file over it, which fails on a file mounted alone).
fn azure_paths_reach_the_host(docs: &[Value], paths: &[PathBuf]) -> Result<(), String> {
    let pod = &one(docs, "DaemonSet")["spec"]["template"]["spec"];
    let d = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "dipamd"))
        .ok_or("no dipamd container")?;
    let mounts = d["volumeMounts"].as_array().ok_or("no volumeMounts")?;
    // Every path's problem, so that one edit's every consequence is named.
    let problems: Vec<String> = paths
        .iter()
        .filter_map(|p| path_reaches_the_host(pod, mounts, p).err())
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The innermost of `mounts` holding `p`, as the kernel resolves it, and the pod's volume it
/// mounts.
fn mount_of<'a>(
    pod: &'a Value,
    mounts: &'a [Value],
    p: &Path,
) -> Result<(&'a Value, &'a Value), String> {
    let mount = mounts
        .iter()
        .filter(|m| m["mountPath"].as_str().is_some_and(|m| p.starts_with(m)))
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))
        .ok_or_else(|| format!("no volume mount holds {}", p.display()))?;
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .ok_or_else(|| format!("no volume {} for {}", mount["name"], mount["mountPath"]))?;
    Ok((mount, volume))
}

fn path_reaches_the_host(pod: &Value, mounts: &[Value], p: &Path) -> Result<(), String> {
    let (mount, volume) = mount_of(pod, mounts, p)
        .map_err(|e| format!("{e}: the plugin's file stays in the container"))?;
    let at = mount["mountPath"].as_str().unwrap_or_default();
    let host = volume["hostPath"]["path"]
        .as_str()
        .ok_or_else(|| format!("{} is in {volume}, not a hostPath", p.display()))?;
    let rest = p.strip_prefix(at).unwrap_or(p);
    if on_the_host(&Path::new(host).join(rest)) != on_the_host(p) {
        return Err(format!(
            "{} is mounted at {at} from the host's {host}: not the host's own {}",
            p.display(),
            on_the_host(p).display()
        ));
    }
    if Path::new(at) == p {
        return Err(format!(
            "{} is mounted alone: the plugin renames a temporary file over it",
            p.display()
        ));
    }
    if !p.starts_with("/etc/kubernetes") && mount["readOnly"] == true {
        return Err(format!("{} is mounted read-only at {at}", p.display()));
    }
    Ok(())
}

/// What the real azure-vnet-ipam (tests/deps.sh builds it) reads and writes on a node, as it
/// names them: it runs an ADD and a DEL in a private mount namespace whose /run, /var/log
/// and /etc are overlays (src/azure.rs), and every file it left in their upper layers is one
/// it writes; /etc/kubernetes/interfaces.json is the file-backed source it reads.
fn paths_the_real_azure_plugin_uses() -> Vec<PathBuf> {
    let node = dipam_lifecycle::azure::AzureNode::new(
        &dipam_lifecycle::peers::require("azure-vnet-ipam"),
        4,
    );
    for command in ["ADD", "DEL"] {
        let (ok, out) = node.exec(command, "manifest-probe", None);
        assert!(ok, "azure-vnet-ipam {command}: {out}");
    }
    let mut paths = vec![PathBuf::from("/etc/kubernetes/interfaces.json")];
    for (upper, named) in [("run", "/var/run"), ("log", "/var/log"), ("etc", "/etc")] {
        let root = node.dir().join(upper);
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let kind = e.file_type().unwrap();
                if kind.is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e.path().strip_prefix(&root).unwrap().to_owned();
                    // mount(8)'s own bookkeeping from the namespace's set-up, not the plugin's.
                    if !(upper == "run" && rel.starts_with("mount")) {
                        paths.push(Path::new(named).join(rel));
                    }
                }
            }
        }
    }
    paths.sort();
    paths
}

/// With azure-vnet-ipam as the delegate, the DaemonSet's `azure-*` mounts (commented out as
/// shipped, uncommented as its comment says) give the plugin, run by dipamd in the container,
/// the host's own state file, lock, logs and interfaces.json: every path the real plugin is
/// seen to use. As shipped (mounts commented), and with any one of the three left out or
/// mounted elsewhere, the check names the path that would stay in the container, where a
/// restart loses it and the host's azure-vnet never sees it (two pods, one address).
#[test]
fn the_daemonsets_azure_mounts_hold_every_path_the_real_plugin_uses() {
    // It runs the real azure-vnet-ipam.
    dipam_lifecycle::require_root!();
    let paths = paths_the_real_azure_plugin_uses();
    eprintln!("azure-vnet-ipam uses: {paths:?}");
    for want in [
        "/var/run/azure-vnet-ipam.json",
        "/var/log/azure-vnet-ipam.log",
    ] {
        assert!(paths.contains(&PathBuf::from(want)), "{want}: {paths:?}");
    }
    assert!(
        paths.iter().any(|p| p.starts_with("/var/run/azure-vnet/")),
        "its lock: {paths:?}"
    );
    let text =
        std::fs::read_to_string(bins::workspace().join("deploy/kubernetes/dipam.yaml")).unwrap();
    let parse = |t: &str| -> Vec<Value> {
        yaml::parse(t)
            .unwrap()
            .into_iter()
            .filter(|d| !d.is_null())
            .collect()
    };
    let on = with_azure_mounts_uncommented(&text);
    assert_eq!(
        on.matches("- name: azure-").count(),
        6,
        "three mounts and three volumes to uncomment"
    );
    azure_paths_reach_the_host(&parse(&on), &paths).unwrap();

    let e = azure_paths_reach_the_host(&parse(&text), &paths).unwrap_err();
    assert!(e.contains("no volume mount holds"), "as shipped: {e}");
    let edits = |pairs: &[(&str, &str)]| {
        let mut t = on.clone();
        for (from, to) in pairs {
            assert_eq!(t.matches(from).count(), 1, "{from:?} once");
            t = t.replacen(from, to, 1);
        }
        parse(&t)
    };
    let edit = |from: &str, to: &str| edits(&[(from, to)]);
    let cases: [(&str, Vec<Value>, &str); 5] = [
        (
            "no /var/run mount",
            edit(
                "            - name: azure-run\n              mountPath: /var/run\n",
                "",
            ),
            "no volume mount holds /var/run/azure-vnet",
        ),
        (
            "no /var/log mount",
            edit(
                "            - name: azure-log\n              mountPath: /var/log\n",
                "",
            ),
            "no volume mount holds /var/log/azure-vnet",
        ),
        (
            "no /etc/kubernetes mount",
            edit(
                "            - name: azure-kubernetes\n              mountPath: /etc/kubernetes\n              readOnly: true\n",
                "",
            ),
            "no volume mount holds /etc/kubernetes/interfaces.json",
        ),
        (
            "the state file mounted alone",
            edits(&[
                (
                    "mountPath: /var/run\n",
                    "mountPath: /var/run/azure-vnet-ipam.json\n",
                ),
                ("path: /run\n", "path: /run/azure-vnet-ipam.json\n"),
            ]),
            "/var/run/azure-vnet-ipam.json is mounted alone",
        ),
        (
            "the host's /var/log mounted read-only",
            edit(
                "mountPath: /var/log\n",
                "mountPath: /var/log\n              readOnly: true\n",
            ),
            "read-only",
        ),
    ];
    for (what, docs, expected) in cases {
        let e = azure_paths_reach_the_host(&docs, &paths).expect_err(what);
        assert!(e.contains(expected), "{what}: {e}");
    }
}

/// A CPU quantity in millicores ("100m", "0.5", "1"), as the API reads it.
fn millicores(q: &str) -> u64 {
    match q.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => (q.parse::<f64>().unwrap() * 1000.0).round() as u64,
    }
}

/// Every pod start on a node waits on its dipamd, which runs (with the host-local it execs)
/// in the DaemonSet pod's cgroup, whose share of a busy node comes from its CPU request. On a
/// real kubelet with a busy node, the 50m request shipped before made a 20-pod burst Ready
/// 1.1-1.7x later than the reference ptp + host-local; 100m put it on par
/// (docs/performance.md, run 17). Validation alone could never have caught that.
#[test]
fn the_daemonsets_cpu_request_keeps_pod_starts_on_par_with_the_reference() {
    assert_eq!(millicores("100m"), 100);
    assert_eq!(millicores("0.25"), 250);
    assert_eq!(millicores("1"), 1000);
    let docs = all_documents();
    let ds = one(&docs, "DaemonSet");
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let dipamd = containers
        .iter()
        .find(|c| c["name"] == "dipamd")
        .unwrap_or_else(|| panic!("no dipamd container in {containers:#?}"));
    let cpu = dipamd["resources"]["requests"]["cpu"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| {
            dipamd["resources"]["requests"]["cpu"]
                .as_f64()
                .map(|f| f.to_string())
        })
        .unwrap_or_else(|| panic!("dipamd requests no CPU: {:#?}", dipamd["resources"]));
    assert!(
        millicores(&cpu) >= 100,
        "dipamd's CPU request {cpu} is below 100m: pods on a busy node start later than \
         with the reference plugins (docs/performance.md, run 17)"
    );
}
