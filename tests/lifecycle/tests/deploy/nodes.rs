//! One range per node, from the cluster: `dipamctl install --ranges-from-node NODE` against a
//! stand-in Kubernetes API server that follows the real contract (src/kubeapi.rs: HTTPS with
//! the cluster's CA, a bearer token, `GET /api/v1/nodes/NAME`, `Status` errors).
//!
//! - the DaemonSet's own init container command (deploy/kubernetes/dipam.yaml), run as the
//!   kubelet would run it: `$(NODE_NAME)` expanded from the downward API, the in-cluster
//!   KUBERNETES_SERVICE_HOST/PORT in its environment, the host's directories under /host;
//! - dual-stack (one range set per family) and an API server that only has `spec.podCIDR`;
//! - 401, 403, 404, a CA that did not sign the server, a node without podCIDR: each exits 1
//!   with what to fix, and installs nothing;
//! - `--wait`: a node without podCIDR makes install wait, one line per attempt saying why,
//!   and finish once the node IPAM controller (here: the test) assigns the range;
//! - two nodes, each with its own dipamd, state, socket and host-local store and its own Node
//!   object: 100 pods on each, every address in its node's podCIDR, none on both nodes, and
//!   after DEL nothing left in either ledger or store.
//!
//! No network namespace is needed for the install cases, but dipamd and the plugin's IPAM
//! calls are the real ones: root, like every lifecycle test.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead, BufReader},
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Attachment, Dipamd, Fixture, KubeApi, Runtime, Subnet, bins,
    cmd::ok,
    hostlocal,
    kubeapi::{Access, Request},
    named, require_root,
    runtime::result_ips,
    unique, yaml,
};
use ipnet::IpNet;
use serde_json::{Value, json};
use tempfile::TempDir;

/// The shipped DaemonSet manifest's documents.
fn manifest() -> Vec<Value> {
    let path = bins::workspace().join("deploy/kubernetes/dipam.yaml");
    yaml::parse(&fs::read_to_string(path).unwrap()).unwrap()
}

/// The shipped ConfigMap's conflist: the template every node's install starts from.
fn shipped_template() -> Value {
    let docs = manifest();
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    serde_json::from_str(cm["data"]["10-dipam.conflist"].as_str().unwrap()).unwrap()
}

/// A node's CNI directories, and a template conflist to install.
struct Node {
    dir: TempDir,
}

impl Node {
    fn new() -> Self {
        Self {
            dir: dipam_lifecycle::temp_dir("node-"),
        }
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("opt/cni/bin")
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("etc/cni/net.d")
    }

    fn installed(&self) -> Value {
        serde_json::from_slice(&fs::read(self.conf().join("10-dipam.conflist")).unwrap()).unwrap()
    }

    fn write_template(&self, list: &Value) -> PathBuf {
        let p = self.dir.path().join("template.conflist");
        fs::write(&p, serde_json::to_vec_pretty(list).unwrap()).unwrap();
        p
    }

    /// `dipamctl install --conflist TEMPLATE --ranges-from-node NODE ARGS` with the
    /// in-cluster environment of `api`, and `api`'s token and CA unless ARGS names others.
    fn install(&self, api: &KubeApi, template: &Path, node: &str, args: &[&str]) -> Output {
        self.command(api, template, node, args).output().unwrap()
    }

    fn command(&self, api: &KubeApi, template: &Path, node: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(bins::bin("dipamctl"));
        cmd.arg("install")
            .arg("--cni-bin-dir")
            .arg(self.bin())
            .arg("--conf-dir")
            .arg(self.conf())
            .arg("--conflist")
            .arg(template)
            .args(["--ranges-from-node", node])
            .args(args);
        if !args.contains(&"--kube-token-file") {
            cmd.arg("--kube-token-file").arg(api.token_file());
        }
        if !args.contains(&"--kube-ca-file") {
            cmd.arg("--kube-ca-file").arg(api.ca_file());
        }
        // What the kubelet injects; never the test process's own environment.
        cmd.env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .envs(api.service_env());
        cmd
    }

    /// Nothing was written: neither the plugin nor a network.
    #[track_caller]
    fn assert_untouched(&self) {
        assert!(!self.bin().exists(), "the plugin was installed");
        assert!(!self.conf().exists(), "a network was installed");
    }
}

#[track_caller]
fn refused(out: &Output, why: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for w in why {
        assert!(stderr.contains(w), "expected {w:?} in {stderr}");
    }
}

/// The dipam plugin's host-local ranges in an installed conflist (IPAM or main mode).
fn ranges(list: &Value) -> Value {
    let p = &list["plugins"][dipam_lifecycle::fixture::dipam_plugin_index(list)];
    if p["type"] == "dipam" {
        p["ipam"]["ranges"].clone()
    } else {
        p["ipam"]["delegate"]["ranges"].clone()
    }
}

/// The DaemonSet's init container, exactly as shipped, run as the kubelet runs it: its
/// `$(NODE_NAME)` from the downward API, the in-cluster variables in its environment, its
/// mounts (the host's directories, the ConfigMap) rooted in a temp dir. Only the service
/// account's token and CA paths are the stand-in's, since this machine has no
/// /var/run/secrets: the manifest itself names neither (manifests.rs checks that).
#[test]
fn the_daemonsets_init_container_installs_its_nodes_own_ranges() {
    require_root!();
    let api = KubeApi::start();
    api.set_node("worker-1", &["10.244.1.0/24"]);
    let docs = manifest();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let init = named(&pod["initContainers"], "install");
    let root = dipam_lifecycle::temp_dir("pod-");
    // Each mount of the init container, rooted under `root`; the ConfigMap's files in its.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in init["volumeMounts"].as_array().unwrap() {
        let path = m["mountPath"].as_str().unwrap().to_owned();
        let local = root.path().join(path.trim_start_matches('/'));
        fs::create_dir_all(&local).unwrap();
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        if let Some(cm_name) = volume["configMap"]["name"].as_str() {
            let cm = docs
                .iter()
                .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == cm_name)
                .unwrap();
            for (file, text) in cm["data"].as_object().unwrap() {
                fs::write(local.join(file), text.as_str().unwrap()).unwrap();
            }
        }
        mounts.push((path, local));
    }
    // The kubelet's $(VAR) expansion, from the container's own env (downward API here).
    let env = init["env"].as_array().unwrap();
    let node_field = env.iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(
        node_field["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let argv: Vec<String> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap().replace("$(NODE_NAME)", "worker-1");
            match mounts.iter().find(|(m, _)| a.starts_with(m.as_str())) {
                Some((m, local)) => local
                    .join(a[m.len()..].trim_start_matches('/'))
                    .to_string_lossy()
                    .into_owned(),
                None => a,
            }
        })
        .collect();
    assert_eq!(argv[..2], ["dipamctl", "install"]);
    let out = Command::new(bins::bin("dipamctl"))
        .args(&argv[1..])
        .arg("--kube-token-file")
        .arg(api.token_file())
        .arg("--kube-ca-file")
        .arg(api.ca_file())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .envs(api.service_env())
        .env("NODE_NAME", "worker-1")
        .output()
        .unwrap();
    let text = ok(&out);
    assert!(
        text.contains("ranges:    node worker-1 spec.podCIDRs: 10.244.1.0/24"),
        "{text}"
    );
    let host = |p: &str| root.path().join(p.trim_start_matches('/'));
    let conflist = host("/host/etc/cni/net.d/10-dipam.conflist");
    let list: Value = serde_json::from_slice(&fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(ranges(&list), json!([[{"subnet": "10.244.1.0/24"}]]));
    // The rest of the template is as shipped.
    let mut expected = shipped_template();
    expected["plugins"][0]["ipam"]["ranges"] = json!([[{"subnet": "10.244.1.0/24"}]]);
    assert_eq!(list, expected);
    assert!(host("/host/opt/cni/bin/dipam").is_file());
    // One request, as an in-cluster client makes it.
    assert_eq!(
        api.requests(),
        [Request {
            method: "GET".into(),
            path: "/api/v1/nodes/worker-1".into(),
            authorization: Some("Bearer dipam-token".into()),
        }]
    );
}

/// A dual-stack node gets one range set per family, in the API's order; an API server
/// older than podCIDRs (only `spec.podCIDR`) still gives the node its range; `--kube-api`
/// reaches the server without the in-cluster variables.
#[test]
fn dual_stack_legacy_pod_cidr_and_an_explicit_api_server() {
    require_root!();
    let api = KubeApi::start();
    api.set_node("dual", &["10.244.2.0/24", "fd00:10:244:2::/64"]);
    api.set_node_object("old", json!({"podCIDR": "10.244.3.0/24"}));

    let n = Node::new();
    let template = n.write_template(&shipped_template());
    let text = ok(&n.install(&api, &template, "dual", &["--json"]));
    let report: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        report["ranges"]["cidrs"],
        json!(["10.244.2.0/24", "fd00:10:244:2::/64"])
    );
    assert_eq!(
        ranges(&n.installed()),
        json!([[{"subnet": "10.244.2.0/24"}], [{"subnet": "fd00:10:244:2::/64"}]])
    );

    let n = Node::new();
    let mut cmd = n.command(&api, &template, "old", &["--kube-api", &api.url()]);
    // Outside a pod: no in-cluster variables at all.
    cmd.env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT");
    let text = ok(&cmd.output().unwrap());
    assert!(
        text.contains("node old spec.podCIDR: 10.244.3.0/24"),
        "{text}"
    );
    assert_eq!(
        ranges(&n.installed()),
        json!([[{"subnet": "10.244.3.0/24"}]])
    );

    // The dual-stack conflist works: one address of each family through dipamd.
    let store = tempfile::tempdir().unwrap();
    let dipamd = Dipamd::start();
    let n = Node::new();
    let fx = Fixture::load("ptp-dipam-host-local.conflist")
        .unique_name()
        .with_socket(&dipamd.socket())
        .with_delegate_state(store.path());
    let template = n.write_template(&fx.list);
    ok(&n.install(&api, &template, "dual", &[]));
    let list = n.installed();
    let rt = Runtime::new(format!("{}:{}", n.bin().display(), bins::cni_path()));
    let att = Attachment::new(&unique("dual"), "/var/run/netns/none");
    let result = rt.ipam(&list, 0, "ADD", &att, None).unwrap();
    let ips = result_ips(&result);
    assert_eq!(ips.len(), 2, "{result}");
    let nets: [IpNet; 2] = [
        "10.244.2.0/24".parse().unwrap(),
        "fd00:10:244:2::/64".parse().unwrap(),
    ];
    for ip in &ips {
        let ip: IpAddr = ip.parse().unwrap();
        assert!(nets.iter().any(|n| n.contains(&ip)), "{ip} not in {nets:?}");
    }
    assert_eq!(dipamd.ledger_ips(fx.name().as_str()).len(), 2);
    rt.ipam(&list, 0, "DEL", &att, None).unwrap();
    assert!(dipamd.ledger_pairs(&fx.name()).is_empty());
    assert!(hostlocal::reservations(store.path(), &fx.name()).is_empty());
}

/// Every failure a cluster can answer says what to fix, exits 1 and installs nothing; none
/// falls back to a range of its own.
#[test]
fn refusals_say_what_to_fix_and_install_nothing() {
    require_root!();
    let api = KubeApi::start();
    api.set_node("worker-1", &["10.244.1.0/24"]);
    api.set_node("fresh", &[]);
    let unknown = api.unknown_token("revoked-token");
    let no_rbac = api.add_token("no-rbac", Access::Nothing);
    let (unknown, no_rbac, other_ca) = (
        unknown.to_str().unwrap().to_owned(),
        no_rbac.to_str().unwrap().to_owned(),
        api.other_ca_file().to_str().unwrap().to_owned(),
    );
    let cases: Vec<(&str, &str, Vec<&str>, Vec<&str>)> = vec![
        (
            "401: a token the API server does not know",
            "worker-1",
            vec!["--kube-token-file", &unknown],
            vec![
                "401 Unauthorized",
                "refused the service account token",
                &unknown,
            ],
        ),
        (
            "403: no RBAC",
            "worker-1",
            vec!["--kube-token-file", &no_rbac],
            vec![
                "403 Forbidden",
                "cannot get resource \"nodes\"",
                "needs `get` on `nodes`",
                "ClusterRoleBinding",
            ],
        ),
        (
            "403 is not waited for",
            "worker-1",
            vec!["--kube-token-file", &no_rbac, "--wait"],
            vec!["403 Forbidden"],
        ),
        (
            "404: a node name that is not this node's",
            "worker-9",
            vec![],
            vec!["node worker-9 does not exist", "404", "spec.nodeName"],
        ),
        (
            "a CA that did not sign the API server's certificate",
            "worker-1",
            vec!["--kube-ca-file", &other_ca],
            vec!["TLS with the API server", "UnknownIssuer", &other_ca],
        ),
        (
            "a node without podCIDR, without --wait",
            "fresh",
            vec![],
            vec!["node fresh has no podCIDR yet", "--allocate-node-cidrs"],
        ),
    ];
    let template_list = shipped_template();
    for (what, node, args, why) in cases {
        let n = Node::new();
        let template = n.write_template(&template_list);
        let out = n.install(&api, &template, node, &args);
        eprintln!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
        refused(&out, &why);
        n.assert_untouched();
    }
    // No token was sent to the server with the wrong CA: it never got a request from it.
    let tokens: BTreeSet<Option<String>> = api
        .requests()
        .into_iter()
        .map(|r| r.authorization)
        .collect();
    assert_eq!(
        tokens,
        [
            Some("Bearer dipam-token".to_owned()),
            Some("Bearer no-rbac".to_owned()),
            Some("Bearer revoked-token".to_owned()),
        ]
        .into_iter()
        .collect()
    );
    // The template without the node's ranges is refused too (it would fail every ADD).
    let n = Node::new();
    let template = n.write_template(&template_list);
    let out = Command::new(bins::bin("dipamctl"))
        .args(["install", "--cni-bin-dir"])
        .arg(n.bin())
        .arg("--conf-dir")
        .arg(n.conf())
        .arg("--conflist")
        .arg(&template)
        .output()
        .unwrap();
    refused(&out, &["host-local has no ranges", "--ranges-from-node"]);
    n.assert_untouched();
}

/// `--wait`, as the init container runs it: while the node has no podCIDR, nothing is
/// installed and each attempt logs why it waits; once the range is assigned, install
/// finishes with it.
#[test]
fn wait_holds_the_install_until_the_node_has_its_range() {
    require_root!();
    let api = KubeApi::start();
    api.set_node("joining", &[]);
    let n = Node::new();
    let template = n.write_template(&shipped_template());
    let mut child = n
        .command(&api, &template, "joining", &["--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(
        first.starts_with("dipamctl: node joining: attempt 1: node joining has no podCIDR yet")
            && first.trim_end().ends_with("waiting 1s"),
        "{first}"
    );
    // Waiting, nothing installed.
    n.assert_untouched();
    api.set_node("joining", &["10.244.4.0/24"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "install still waiting with a podCIDR assigned"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(status.success(), "{status}: {first}{rest}");
    for line in rest.lines() {
        assert!(
            line.contains(": attempt ") && line.contains("waiting"),
            "{line}"
        );
    }
    assert_eq!(
        ranges(&n.installed()),
        json!([[{"subnet": "10.244.4.0/24"}]])
    );
    assert!(api.requests().len() >= 2);
}

/// One simulated node: its Node object's range, its own dipamd (state dir and socket in a
/// temp dir), its own host-local store, its CNI directories, and the runtime that execs the
/// plugin `install` put there.
struct SimNode {
    name: String,
    cidr: IpNet,
    _subnet: Subnet,
    dipamd: Dipamd,
    store: TempDir,
    node: Node,
    list: Value,
    rt: Runtime,
}

impl SimNode {
    fn new(api: &KubeApi, name: &str, network: &str, wrap: bool) -> Self {
        let subnet = Subnet::claim("10.77");
        api.set_node(name, &[&subnet.cidr]);
        let dipamd = Dipamd::start();
        let store = tempfile::tempdir().unwrap();
        let node = Node::new();
        // The same network on both nodes, as in a cluster; its range is set per node.
        let fx = Fixture::load("ptp-dipam-host-local.conflist")
            .with_name(network)
            .with_socket(&dipamd.socket())
            .with_delegate_state(store.path())
            .with_subnet("192.0.2.0/24");
        let list = if wrap {
            // The node's own conflist (ptp + host-local), adopted with its range replaced.
            let mut own = fx.list.clone();
            let delegate = own["plugins"][0]["ipam"]["delegate"].take();
            own["plugins"][0]["ipam"] = delegate;
            fs::create_dir_all(node.conf()).unwrap();
            let file = node.conf().join("10-ptp.conflist");
            fs::write(&file, serde_json::to_vec_pretty(&own).unwrap()).unwrap();
            let out = Command::new(bins::bin("dipamctl"))
                .arg("--socket")
                .arg(dipamd.socket())
                .args(["install", "--wrap"])
                .arg(&file)
                .arg("--in-place")
                .arg("--cni-bin-dir")
                .arg(node.bin())
                .args(["--ranges-from-node", name, "--kube-api", &api.url()])
                .arg("--kube-token-file")
                .arg(api.token_file())
                .arg("--kube-ca-file")
                .arg(api.ca_file())
                .output()
                .unwrap();
            ok(&out);
            serde_json::from_slice(&fs::read(&file).unwrap()).unwrap()
        } else {
            let template = node.write_template(&fx.list);
            ok(&node.install(api, &template, name, &[]));
            node.installed()
        };
        assert_eq!(ranges(&list), json!([[{"subnet": subnet.cidr}]]), "{name}");
        let rt = Runtime::new(format!("{}:{}", node.bin().display(), bins::cni_path()));
        Self {
            name: name.to_owned(),
            cidr: subnet.cidr.parse().unwrap(),
            _subnet: subnet,
            dipamd,
            store,
            node,
            list,
            rt,
        }
    }

    fn network(&self) -> String {
        self.list["name"].as_str().unwrap().to_owned()
    }

    fn pods(&self, n: usize) -> Vec<Attachment> {
        (0..n)
            .map(|i| Attachment::new(&format!("{}-pod-{i}", self.name), "/var/run/netns/none"))
            .collect()
    }

    fn ledger(&self) -> Vec<(String, String)> {
        self.dipamd.ledger_pairs(&self.network())
    }

    fn store(&self) -> Vec<(String, String)> {
        hostlocal::store_pairs(self.store.path(), &self.network())
    }
}

/// Two nodes of one cluster, each installed by `--ranges-from-node` (one from a template with
/// --conflist, one adopting its own ptp + host-local conflist with --wrap), 100 pods each
/// through the plugin they installed: every address in its node's podCIDR, no address on both
/// nodes, ledger and store agreeing on each; then DEL of every pod leaves both empty.
#[test]
fn two_nodes_hand_out_disjoint_addresses_from_their_own_pod_cidrs() {
    require_root!();
    const PODS: usize = 100;
    let api = KubeApi::start();
    let network = unique("cluster");
    let nodes = [
        SimNode::new(&api, "node-a", &network, false),
        SimNode::new(&api, "node-b", &network, true),
    ];
    assert_ne!(nodes[0].cidr, nodes[1].cidr);
    assert_ne!(nodes[0].node.dir.path(), nodes[1].node.dir.path());
    assert_ne!(nodes[0].dipamd.state_dir(), nodes[1].dipamd.state_dir());

    let pods: Vec<Vec<Attachment>> = nodes.iter().map(|n| n.pods(PODS)).collect();
    // Both nodes at once, as in a cluster.
    let per_node: Vec<Vec<IpAddr>> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .zip(&pods)
            .map(|(n, pods)| {
                s.spawn(move || {
                    pods.iter()
                        .map(|att| {
                            let r =
                                n.rt.ipam(&n.list, 0, "ADD", att, None)
                                    .unwrap_or_else(|e| panic!("{}: ADD: {e}", n.name));
                            let ips = result_ips(&r);
                            assert_eq!(ips.len(), 1, "{r}");
                            ips[0].parse::<IpAddr>().unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut seen: BTreeSet<IpAddr> = BTreeSet::new();
    for (n, ips) in nodes.iter().zip(&per_node) {
        let distinct: BTreeSet<&IpAddr> = ips.iter().collect();
        assert_eq!(distinct.len(), PODS, "{}: an address given twice", n.name);
        for ip in ips {
            assert!(
                n.cidr.contains(ip),
                "{}: {ip} outside its podCIDR {}",
                n.name,
                n.cidr
            );
            assert!(seen.insert(*ip), "{ip} handed out on both nodes");
        }
        let ledger = n.ledger();
        assert_eq!(ledger.len(), PODS, "{}", n.name);
        assert_eq!(
            ledger,
            n.store(),
            "{}: ledger (left) and host-local disagree",
            n.name
        );
    }
    assert_eq!(seen.len(), 2 * PODS);

    for (n, pods) in nodes.iter().zip(&pods) {
        for att in pods {
            n.rt.ipam(&n.list, 0, "DEL", att, None)
                .unwrap_or_else(|e| panic!("{}: DEL: {e}", n.name));
        }
    }
    for n in &nodes {
        assert!(n.ledger().is_empty(), "{}: {:?}", n.name, n.ledger());
        assert!(n.store().is_empty(), "{}: {:?}", n.name, n.store());
    }
    // Each node asked for its own Node object, once.
    let paths: Vec<String> = api.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/api/v1/nodes/node-a", "/api/v1/nodes/node-b"]);
}
