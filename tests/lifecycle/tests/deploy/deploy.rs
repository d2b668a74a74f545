//! The packaging in deploy/ agrees with the binaries it runs: the DaemonSet manifest parses,
//! mounts exactly the host directories the CFP says must be shared, each at the path dipamd
//! and the plugin use on the host; and every flag the manifest and the systemd unit pass
//! exists (a renamed flag breaks this test, not a node). No root needed.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use dipam_lifecycle::{bins, cmd, unit_file, yaml};
use serde_json::Value;

/// The host directories a dipam node needs, and nothing else: the CNI plugins, the CNI
/// configs, the delegate's store (host-local), dipamd's socket and dipamd's ledger + spool,
/// and the directory of containerd's CRI socket (`--cri-endpoint`, the runtime-aware GC;
/// tests/deploy/manifests.rs checks that the flag and this mount agree).
const HOST_DIRS: [&str; 6] = [
    "/opt/cni/bin",
    "/etc/cni/net.d",
    "/var/lib/cni",
    "/run/dipam",
    "/var/lib/dipam",
    "/run/containerd",
];

/// Where host-local keeps its store unless `dataDir` says otherwise.
const HOST_LOCAL_STORE: &str = "/var/lib/cni/networks";

fn manifest() -> Vec<Value> {
    let path = bins::workspace().join("deploy/kubernetes/dipam.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    yaml::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<_> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind} in the manifest");
    found[0]
}

fn pod_spec(docs: &[Value]) -> &Value {
    &kind(docs, "DaemonSet")["spec"]["template"]["spec"]
}

fn container<'a>(docs: &'a [Value], list: &str, name: &str) -> &'a Value {
    pod_spec(docs)[list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry named {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// A container's argv: command then args.
fn argv(c: &Value) -> Vec<String> {
    let mut v = strings(&c["command"]);
    v.extend(strings(&c["args"]));
    v
}

/// The `--flag value` and `--flag=value` pairs of an argv (bare flags get "").
fn flags(argv: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut it = argv.iter().peekable();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--") else {
            continue;
        };
        if let Some((f, v)) = flag.split_once('=') {
            out.push((format!("--{f}"), v.to_owned()));
        } else if it.peek().is_some_and(|n| !n.starts_with("--")) {
            out.push((a.clone(), it.next().unwrap().clone()));
        } else {
            out.push((a.clone(), String::new()));
        }
    }
    out
}

fn flag<'a>(flags: &'a [(String, String)], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .find(|(f, _)| f == name)
        .map(|(_, v)| v.as_str())
}

/// `path` is `dir` or inside it (component-wise, so /var/lib/cnix is not in /var/lib/cni).
fn within(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

/// The hostPath of each volume, by volume name.
fn host_paths(docs: &[Value]) -> Vec<(String, String)> {
    pod_spec(docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v["hostPath"].is_null())
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                v["hostPath"]["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Where `path` (as the container sees it) is on the host: through the container's mount of
/// a hostPath volume that holds it, or `None` when no hostPath mount holds it.
fn on_host(docs: &[Value], c: &Value, path: &Path) -> Option<PathBuf> {
    let hosts = host_paths(docs);
    c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let mount = Path::new(m["mountPath"].as_str()?);
            let (_, host) = hosts.iter().find(|(n, _)| m["name"] == n.as_str())?;
            let rest = path.strip_prefix(mount).ok()?;
            Some((mount.components().count(), Path::new(host).join(rest)))
        })
        // The innermost mount wins, as in the kernel.
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, p)| p)
}

/// The mount that holds `path` is a hostPath mounted at the host's own path, writable when
/// `rw`: dipamd sees exactly what the plugin and the runtime see on the host.
#[track_caller]
fn assert_same_path_on_host(docs: &[Value], c: &Value, path: &Path, rw: bool, what: &str) {
    assert_eq!(
        on_host(docs, c, path).as_deref(),
        Some(path),
        "{what}: {} must be the host's {} (a hostPath mounted at the same path)",
        path.display(),
        path.display()
    );
    if rw {
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| within(path, Path::new(m["mountPath"].as_str().unwrap())))
            .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
            .unwrap();
        assert_ne!(
            mount["readOnly"],
            true,
            "{what}: {} must be writable",
            path.display()
        );
    }
}

/// The dipam plugin object of a conflist, and where its own keys live (IPAM or main mode).
fn dipam_keys(list: &Value) -> (&Value, &Value) {
    let p = &list["plugins"][dipam_lifecycle::fixture::dipam_plugin_index(list)];
    if p["type"] == "dipam" {
        (p, &p["ipam"])
    } else {
        (&p["ipam"], &p["ipam"]["delegate"])
    }
}

#[test]
fn manifest_parses_into_a_configmap_and_a_daemonset_in_kube_system() {
    let docs = manifest();
    // The namespaced documents, in kube-system, and the RBAC that lets the init container
    // read its node's pod CIDRs, which is cluster-scoped (nodes are).
    assert_eq!(docs.len(), 5, "{docs:#?}");
    for d in &docs {
        assert!(d["apiVersion"].is_string(), "{d:#}");
        if d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding" {
            assert!(d["metadata"].get("namespace").is_none(), "{d:#}");
        } else {
            assert_eq!(d["metadata"]["namespace"], "kube-system", "{d:#}");
        }
    }
    for k in [
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        kind(&docs, k);
    }
    let ds = kind(&docs, "DaemonSet");
    assert_eq!(ds["apiVersion"], "apps/v1");
    let selector = ds["spec"]["selector"]["matchLabels"].as_object().unwrap();
    for (k, v) in selector {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v);
    }
    let spec = pod_spec(&docs);
    assert_eq!(spec["hostNetwork"], true);
    // Not privileged: a bounded capability set, which tests/security/privileges.rs runs dipamd under.
    let sc = &container(&docs, "containers", "dipamd")["securityContext"];
    assert_eq!(sc["privileged"], false, "{sc:#}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{sc:#}"
    );
    // The node's network depends on dipam: it must run on tainted and NotReady nodes.
    assert!(
        spec["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["operator"] == "Exists" && t.get("key").is_none()),
        "{:#}",
        spec["tolerations"]
    );
}

#[test]
fn host_paths_are_the_shared_directories_mounted_where_dipamd_uses_them() {
    let docs = manifest();
    let hosts: BTreeSet<String> = host_paths(&docs).into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        hosts,
        HOST_DIRS.iter().map(|s| (*s).to_owned()).collect(),
        "hostPath volumes"
    );

    let d = container(&docs, "containers", "dipamd");
    let argv = argv(d);
    assert_eq!(argv[0], "dipamd");
    let f = flags(&argv);
    let need =
        |name: &str| PathBuf::from(flag(&f, name).unwrap_or_else(|| panic!("dipamd needs {name}")));
    let state = need("--state-dir");
    let socket = need("--socket");
    let conflist = need("--conflist");
    let spool = flag(&f, "--spool-dir").map_or_else(|| state.join("spool"), PathBuf::from);
    assert_same_path_on_host(&docs, d, &state, true, "--state-dir (the ledger)");
    assert_same_path_on_host(&docs, d, &spool, true, "--spool-dir");
    assert_same_path_on_host(
        &docs,
        d,
        socket.parent().unwrap(),
        true,
        "--socket's directory",
    );
    assert_same_path_on_host(
        &docs,
        d,
        conflist.parent().unwrap(),
        false,
        "--conflist's directory",
    );
    for dir in flag(&f, "--cni-path").unwrap().split(':') {
        assert_same_path_on_host(&docs, d, Path::new(dir), false, "--cni-path");
    }
    // The CFP's worst case: host-local's store must be the host's, at the same path.
    assert_same_path_on_host(
        &docs,
        d,
        Path::new(HOST_LOCAL_STORE),
        true,
        "host-local's store",
    );
    // Every hostPath dipamd mounts is at the host's path: nothing is shared under another
    // name, where the runtime and dipamd would see different files.
    for m in d["volumeMounts"].as_array().unwrap() {
        if let Some((_, host)) = host_paths(&docs).into_iter().find(|(n, _)| m["name"] == *n) {
            assert_eq!(m["mountPath"].as_str().unwrap(), host, "{m}");
        }
    }
    // The node name comes from the downward API.
    assert_eq!(flag(&f, "--node-name"), Some("$(NODE_NAME)"));
    let env = d["env"].as_array().unwrap();
    let node = env.iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");

    // The probes ask the dipamd this container runs.
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let cmd = strings(&d[probe]["exec"]["command"]).join(" ");
        assert!(cmd.contains("dipamctl"), "{probe}: {cmd}");
        assert!(
            cmd.contains(&format!("--socket {}", socket.display())),
            "{probe}: {cmd}"
        );
        assert!(cmd.contains(" status"), "{probe}: {cmd}");
    }
    // `dipamctl status` exits 0 even when not ready: readiness needs `--ready`, and runs
    // without a shell (the image has none: deploy/Containerfile, tests/deploy/image.rs).
    let ready = strings(&d["readinessProbe"]["exec"]["command"]);
    assert_eq!(ready[0], "dipamctl", "{ready:?}");
    assert!(ready.iter().any(|w| w == "--ready"), "{ready:?}");
}

#[test]
fn init_container_installs_the_conflist_dipamd_reads_and_the_plugin_it_serves() {
    let docs = manifest();
    let init = container(&docs, "initContainers", "install");
    let init_argv = argv(init);
    assert_eq!(init_argv[..2], ["dipamctl", "install"]);
    let f = flags(&init_argv);
    let bin_dir = on_host(&docs, init, Path::new(flag(&f, "--cni-bin-dir").unwrap()))
        .expect("--cni-bin-dir is on a hostPath");
    assert_eq!(bin_dir, Path::new("/opt/cni/bin"));
    let conf_dir = on_host(&docs, init, Path::new(flag(&f, "--conf-dir").unwrap()))
        .expect("--conf-dir is on a hostPath");
    let name = flag(&f, "--name").unwrap();
    let d = flags(&argv(container(&docs, "containers", "dipamd")));
    assert_eq!(
        conf_dir.join(name),
        Path::new(flag(&d, "--conflist").unwrap()),
        "dipamd must read the conflist the init container installs"
    );
    // The runtime's CNI_PATH (the host's /opt/cni/bin) is where the plugin goes, and where
    // dipamd finds the delegates.
    assert!(
        flag(&d, "--cni-path")
            .unwrap()
            .split(':')
            .any(|p| p == "/opt/cni/bin")
    );

    // The conflist comes from the ConfigMap, mounted whole.
    let source = Path::new(flag(&f, "--conflist").unwrap());
    let mount = init["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| within(source, Path::new(m["mountPath"].as_str().unwrap())))
        .expect("--conflist is on a mount");
    let volume = pod_spec(&docs)["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let cm = kind(&docs, "ConfigMap");
    assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);
    let key = source.file_name().unwrap().to_str().unwrap();
    let text = cm["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap has no {key}"));
    let list: Value = serde_json::from_str(text).expect("the ConfigMap's conflist is JSON");

    // Its dipam keys name dipamd's socket, and no spool: the plugin finds the spool dipamd
    // publishes beside the socket (both mounted at the host's paths, checked above). Its
    // delegate keeps its store where the host's is.
    let (keys, delegate) = dipam_keys(&list);
    assert_eq!(
        keys["socketPath"].as_str(),
        flag(&d, "--socket"),
        "socketPath must be dipamd's --socket"
    );
    assert!(
        keys.get("spoolDir").is_none(),
        "the conflist needs no spoolDir (the plugin finds dipamd's spool beside the socket)"
    );
    if delegate["type"] == "host-local" {
        let store = delegate["dataDir"].as_str().unwrap_or(HOST_LOCAL_STORE);
        assert!(
            within(Path::new(store), Path::new("/var/lib/cni")),
            "{store}"
        );
    }
}

/// `<bin> --help`, which must succeed.
fn help(bin: &str, args: &[&str]) -> String {
    let out = cmd::run(Command::new(bins::bin(bin)).args(args).arg("--help"));
    String::from_utf8(out.stdout).unwrap()
}

/// `help` names `flag` as a whole word (so `--socket` does not match `--socket-group`).
#[track_caller]
fn assert_mentions(help: &str, flag: &str, who: &str) {
    let found = help.match_indices(flag).any(|(i, _)| {
        !help[i + flag.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    assert!(
        found,
        "{who} passes {flag}, which --help does not list:\n{help}"
    );
}

/// Runs `argv` with `--help` appended: clap parses every argument before it (rejecting an
/// unknown flag or a bad value such as `--log-format jsn`) and then prints help instead of
/// starting anything.
#[track_caller]
fn assert_parses(bin: &str, argv: &[String], who: &str) {
    let out = Command::new(bins::bin(bin))
        .args(argv)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{who}: {bin} rejects {argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_flag_the_manifest_and_the_unit_pass_exists() {
    let docs = manifest();
    let dipamd_help = help("dipamd", &[]);

    let d = argv(container(&docs, "containers", "dipamd"));
    for (f, _) in flags(&d) {
        assert_mentions(&dipamd_help, &f, "the DaemonSet");
    }
    assert_parses("dipamd", &d[1..], "the DaemonSet");

    let shipped = unit_file::shipped();
    // Without the operator's $DIPAMD_OPTS (unit_overrides.rs starts it with them).
    let unit = shipped.argv(&BTreeMap::new());
    assert!(unit[0].ends_with("/dipamd"), "{unit:?}");
    for (f, _) in flags(&unit) {
        assert_mentions(&dipamd_help, &f, "dipamd.service");
    }
    assert_parses("dipamd", &unit[1..], "dipamd.service");
    // The unit's defaults are variables dipamd reads (a misspelt one would be ignored).
    for (var, _) in &shipped.environment {
        assert!(
            dipamd_help.contains(&format!("[env: {var}=")),
            "dipamd.service sets {var}, which dipamd does not read"
        );
    }

    let init = argv(container(&docs, "initContainers", "install"));
    let install_help = help("dipamctl", &["install"]);
    for (f, _) in flags(&init) {
        assert_mentions(&install_help, &f, "the init container");
    }
    assert_parses("dipamctl", &init[1..], "the init container");

    let status_help = help("dipamctl", &["status"]);
    let d = container(&docs, "containers", "dipamd");
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let cmd = strings(&d[probe]["exec"]["command"]);
        let words: Vec<String> = cmd
            .join(" ")
            .split_whitespace()
            .filter(|w| w.starts_with("--"))
            .map(str::to_owned)
            .collect();
        for w in words {
            assert_mentions(&status_help, &w, probe);
        }
    }
}

#[test]
fn the_unit_can_write_where_dipamd_and_its_delegates_write() {
    let text =
        std::fs::read_to_string(bins::workspace().join("deploy/systemd/dipamd.service")).unwrap();
    let values = |key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .flat_map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(values("Type"), ["simple"]);
    assert_eq!(values("Restart"), ["always"]);
    assert_eq!(values("ProtectSystem"), ["strict"]);
    // Delegates in flight are not killed with dipamd (see the unit's comment).
    assert_eq!(values("KillMode"), ["process"]);
    let mut writable: Vec<PathBuf> = values("ReadWritePaths")
        .iter()
        .map(|p| PathBuf::from(p.trim_start_matches('-')))
        .collect();
    writable.extend(
        values("StateDirectory")
            .iter()
            .map(|d| Path::new("/var/lib").join(d)),
    );
    writable.extend(
        values("RuntimeDirectory")
            .iter()
            .map(|d| Path::new("/run").join(d)),
    );

    let unit = unit_file::shipped();
    let state = PathBuf::from(
        unit.setting("--state-dir", "DIPAM_STATE_DIR")
            .unwrap_or_else(|| "/var/lib/dipam".into()),
    );
    let spool = unit
        .setting("--spool-dir", "DIPAM_SPOOL_DIR")
        .map_or_else(|| state.join("spool"), PathBuf::from);
    let socket = PathBuf::from(
        unit.setting("--socket", "DIPAM_SOCKET")
            .unwrap_or_else(|| "/run/dipam/dipam.sock".into()),
    );
    for (what, path) in [
        ("--state-dir", state.as_path()),
        ("--spool-dir", spool.as_path()),
        ("--socket's directory", socket.parent().unwrap()),
        ("host-local's store", Path::new(HOST_LOCAL_STORE)),
    ] {
        assert!(
            writable.iter().any(|w| within(path, w)),
            "{what} {} is read-only under ProtectSystem=strict; writable: {writable:?}",
            path.display()
        );
    }
}

/// dipamd's shutdown drain: the --shutdown-timeout `set`, or the default --help shows.
fn shutdown_drain(set: Option<String>) -> f64 {
    if let Some(v) = set {
        return v.parse().unwrap();
    }
    let help = help("dipamd", &[]);
    let at = help
        .find("--shutdown-timeout")
        .expect("dipamd --shutdown-timeout");
    let rest = &help[at..];
    let default = &rest[rest.find("[default: ").unwrap() + "[default: ".len()..];
    default[..default.find(']').unwrap()].parse().unwrap()
}

/// dipamd exits at most this long after its drain (daemon::EXIT_WAIT).
const EXIT_WAIT_SECONDS: f64 = 1.0;

/// systemd and the kubelet send SIGKILL when a stop outlasts their timeout: both must leave
/// dipamd its whole drain, or a routine restart cuts requests short for nothing.
#[test]
fn stop_timeouts_exceed_the_shutdown_drain() {
    let text =
        std::fs::read_to_string(bins::workspace().join("deploy/systemd/dipamd.service")).unwrap();
    let stop: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .expect("the unit sets TimeoutStopSec")
        .trim()
        .parse()
        .unwrap();
    let drain = shutdown_drain(
        unit_file::shipped().setting("--shutdown-timeout", "DIPAM_SHUTDOWN_TIMEOUT"),
    );
    assert!(
        stop > drain + EXIT_WAIT_SECONDS,
        "TimeoutStopSec={stop} does not exceed dipamd's drain of {drain} s"
    );
    let docs = manifest();
    let grace = pod_spec(&docs)["terminationGracePeriodSeconds"]
        .as_f64()
        .expect("the DaemonSet sets terminationGracePeriodSeconds");
    let d = argv(container(&docs, "containers", "dipamd"));
    let drain = shutdown_drain(flag(&flags(&d), "--shutdown-timeout").map(str::to_owned));
    assert!(
        grace > drain + EXIT_WAIT_SECONDS,
        "terminationGracePeriodSeconds {grace} does not exceed dipamd's drain of {drain} s"
    );
}

/// A rollout replaces dipamd one node at a time, old pod first: with the grace period above
/// and the SIGTERM drain, each node's CNI calls see only a restart (ADDs 11 and retried, DELs
/// spooled; deploy/README.md, "Upgrades"). A surge pod would find the ledger locked by the
/// old one and crash-loop; more than one node at a time widens the window for nothing.
#[test]
fn rolling_update_replaces_one_node_at_a_time() {
    let docs = manifest();
    let strategy = &kind(&docs, "DaemonSet")["spec"]["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate", "{strategy}");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], 1, "{strategy}");
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 0, "{strategy}");
}

/// The long flags a `--help` text lists (option lines start with spaces, then `-x, --flag`
/// or `--flag`).
fn listed_flags(help: &str) -> Vec<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ','])
                .find(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().unwrap_or(w).to_owned())
        })
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .collect()
}

/// The subcommands a clap `--help` text lists under "Commands:".
fn listed_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// docs/configuration.md is the reference for every flag and command: one added to a
/// binary without a line there fails here.
#[test]
fn configuration_reference_names_every_flag_command_and_key() {
    let doc = std::fs::read_to_string(bins::workspace().join("docs/configuration.md")).unwrap();
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    // A flag anywhere as a whole word (tables and synopses both count).
    let flag_named = |flag: &str| {
        doc.match_indices(flag).any(|(i, m)| {
            !doc[..i].chars().next_back().is_some_and(word_char)
                && !doc[i + m.len()..].chars().next().is_some_and(word_char)
        })
    };
    // A command or key as the start of a code span: prose may use the same word.
    let named = |word: &str| {
        doc.match_indices(&format!("`{word}"))
            .any(|(i, m)| !doc[i + m.len()..].chars().next().is_some_and(word_char))
    };
    // Test builds have dipamd's crash points; release builds, which the doc describes, do not.
    for flag in listed_flags(&help("dipamd", &[])) {
        assert!(
            flag == "--crash-at" || flag_named(&flag),
            "docs/configuration.md does not describe dipamd {flag}"
        );
    }
    let top = help("dipamctl", &[]);
    for flag in listed_flags(&top) {
        assert!(flag_named(&flag), "docs/configuration.md: dipamctl {flag}");
    }
    for cmd in listed_commands(&top) {
        assert!(named(&cmd), "docs/configuration.md: dipamctl {cmd}");
        let sub = help("dipamctl", &[&cmd]);
        for flag in listed_flags(&sub) {
            assert!(
                flag_named(&flag),
                "docs/configuration.md: dipamctl {cmd} {flag}"
            );
        }
        for subcmd in listed_commands(&sub) {
            assert!(
                named(&format!("{cmd} {subcmd}")),
                "docs/configuration.md: dipamctl {cmd} {subcmd}"
            );
        }
    }
    // The plugin's keys, as its own help lists them, plus the spool key it shares with
    // dipamd.
    let plugin = Command::new(bins::bin("dipam"))
        .arg("--help")
        .output()
        .unwrap();
    let plugin = String::from_utf8(plugin.stdout).unwrap();
    let keys: Vec<&str> = plugin
        .lines()
        .skip_while(|l| !l.starts_with("Config keys"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .chain(["spoolDir"])
        .collect();
    assert!(keys.len() > 3, "{plugin}");
    for key in keys {
        assert!(named(key), "docs/configuration.md: plugin key {key}");
    }
}

#[test]
fn yaml_subset_parser_reads_what_it_knows_and_refuses_the_rest() {
    let text = r#"# comment
---
a: 1
b: "two: 2" # trailing comment
c: 'it''s'
d:
  - x
  - k: v
    l: [p, "q r", 3]
  -
    - nested
e: |
  line one
    indented

  after blank
f: |-
  stripped
g: {}
h: []
i: true
j: null
k:
- same-indent sequence
---
second: doc
"#;
    let docs = yaml::parse(text).unwrap();
    assert_eq!(
        docs,
        vec![
            serde_json::json!({
                "a": 1, "b": "two: 2", "c": "it's",
                "d": ["x", {"k": "v", "l": ["p", "q r", 3]}, ["nested"]],
                "e": "line one\n  indented\n\nafter blank\n",
                "f": "stripped",
                "g": {}, "h": [], "i": true, "j": null,
                "k": ["same-indent sequence"],
            }),
            serde_json::json!({"second": "doc"}),
        ]
    );
    for bad in [
        "a: &anchor 1",
        "a: *alias",
        "a: !tag x",
        "a: >\n  folded",
        "a: |+\n  kept\n",
        "a: {b: c}",
        "a: b: c",
        "a: yes",
        "a: 1\na: 2",
        "a:\n  b\n  c",
        "a: 1\n   b: 2",
        "\ta: 1",
        "a: \"unterminated",
    ] {
        assert!(yaml::parse(bad).is_err(), "accepted {bad:?}");
    }
}
