//! What a test does with a [`Cluster`]: the shipped DaemonSet applied, Deployments of
//! sleeping pods started and timed, the ledger and host-local's store read from the node.
//! tests/kubernetes.rs (the DaemonSet's life on a node) and tests/density.rs (a dense node,
//! measured) share them.

// A test harness: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::Cluster;
use crate::bins;

/// The shipped DaemonSet, as kubectl names it.
pub const DS: &str = "daemonset/dipam";
/// dipamd's socket in the shipped DaemonSet.
pub const SOCKET: &str = "/run/dipam/dipam.sock";

/// Applies deploy/kubernetes as shipped, through a kustomization that only sets the image
/// and appends `args` to dipamd's command (none: the DaemonSet exactly as shipped).
pub fn apply_shipped(c: &Cluster, args: &[&str]) {
    apply_kustomized(c, "kubernetes", &[], args);
}

/// Applies the shipped kustomization in deploy/`dir` (deploy/kubernetes, whose
/// `Kustomization` names dipam.yaml, or an overlay beside it such as
/// deploy/kubernetes-azure-vnet-ipam) as deploy/README.md says: a kustomization of the
/// test's names it in `resources:`, sets the image and appends `args` to dipamd's command.
/// `edits` are (from, to) replacements in that directory's kustomization, what its comments
/// tell an operator to set; each must occur exactly once.
pub fn apply_kustomized(c: &Cluster, dir: &str, edits: &[(&str, &str)], args: &[&str]) {
    let deploy = c.dir.path().join("deploy");
    let target = if dir == "kubernetes" {
        "kubernetes/Kustomization".to_owned()
    } else {
        format!("{dir}/kustomization.yaml")
    };
    let mut files = vec![
        "kubernetes/dipam.yaml".to_owned(),
        "kubernetes/Kustomization".to_owned(),
    ];
    if !files.contains(&target) {
        files.push(target.clone());
    }
    for file in &files {
        let mut text =
            std::fs::read_to_string(bins::workspace().join("deploy").join(file)).unwrap();
        if *file == target {
            for (from, to) in edits {
                assert_eq!(
                    text.matches(from).count(),
                    1,
                    "{from:?} once in deploy/{file}"
                );
                text = text.replacen(from, to, 1);
            }
        }
        let to = deploy.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, text).unwrap();
    }
    let k = c.dir.path().join("kustomize");
    std::fs::create_dir_all(&k).unwrap();
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - ../deploy/{dir}\nimages:\n  - name: dipam\n    newName: {}\n    newTag: {}\n",
        super::DIPAM_IMAGE,
        super::DIPAM_TAG
    );
    if !args.is_empty() {
        text.push_str(
            "patches:\n  - target:\n      kind: DaemonSet\n      name: dipam\n    patch: |-\n",
        );
        for arg in args {
            text.push_str(&format!(
                "      - op: add\n        path: /spec/template/spec/containers/0/command/-\n\
                 \x20       value: {arg}\n"
            ));
        }
    }
    std::fs::write(k.join("kustomization.yaml"), text).unwrap();
    c.kubectl_ok(&["apply", "-k", &k.to_string_lossy()]);
}

pub fn ready(obj: &Value) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The DaemonSet's pod, once Ready.
pub fn wait_daemonset_ready(c: &Cluster, secs: u64) -> Value {
    c.wait_for("the DaemonSet's pod to be Ready", secs, |c| {
        let pods = c.get_json(&[
            "pods",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=dipam",
        ]);
        let items = pods["items"].as_array()?.clone();
        (items.len() == 1
            && ready(&items[0])
            && items[0]["metadata"]["deletionTimestamp"].is_null())
        .then(|| items[0].clone())
    })
}

/// `dipamctl ARGS` inside the DaemonSet's dipamd container (`kubectl exec`: the image has no
/// shell, dipamctl is exec'd directly).
pub fn dipamctl_in_pod(c: &Cluster, args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "-n",
        "kube-system",
        "exec",
        DS,
        "-c",
        "dipamd",
        "--",
        "dipamctl",
    ];
    all.extend_from_slice(args);
    all.extend(["--socket", SOCKET]);
    c.kubectl(&all)
}

/// The ledger, read on the node through dipamd's socket.
pub fn ledger(c: &Cluster) -> Vec<Value> {
    let out = std::process::Command::new(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(c.node.path(SOCKET))
        .args(["attachments", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "dipamctl attachments: {out:?}");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap()
}

pub fn ips_of(a: &Value) -> Vec<String> {
    a["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip.as_str().unwrap().split('/').next().unwrap().to_owned())
        .collect()
}

/// host-local's reservations on the node: the addresses with a file in its store.
pub fn host_local_store(c: &Cluster) -> BTreeSet<String> {
    let dir = c.node.path("/var/lib/cni/networks/dipam");
    std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect()
}

/// The agent's addresses in the ledger.
pub fn agent_ips(c: &Cluster) -> BTreeSet<String> {
    ledger(c)
        .iter()
        .filter(|a| a["owner"].as_str().unwrap_or_default().starts_with("agent"))
        .flat_map(ips_of)
        .collect()
}

pub fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: default
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: sleep
          image: {image}
          imagePullPolicy: Never
          command: [sleep, '2147483647']
",
        image = super::BUSYBOX_IMAGE
    )
}

pub fn apply_text(c: &Cluster, name: &str, text: &str) {
    let f = c.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&f, text).unwrap();
    c.kubectl_ok(&["apply", "-f", &f.to_string_lossy()]);
}

/// The Deployment's pods once `n` are Ready (and no other is left): (name, IP).
pub fn wait_pods_ready(c: &Cluster, app: &str, n: usize, secs: u64) -> Vec<(String, String)> {
    c.wait_for(&format!("{n} pods of {app} to be Ready"), secs, |c| {
        let pods = c.get_json(&["pods", "-l", &format!("app={app}")]);
        let items = pods["items"].as_array()?.clone();
        (items.len() == n && items.iter().all(ready)).then(|| {
            items
                .iter()
                .map(|p| {
                    (
                        p["metadata"]["name"].as_str().unwrap().to_owned(),
                        p["status"]["podIP"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
    })
}

/// Create-to-Ready latency of each of `n` pods of a new Deployment `app`, as a watch sees the
/// events (stamped on arrival: the API's own timestamps have whole seconds), then the
/// Deployment deleted and its pods gone.
pub fn pod_start_latencies(c: &Cluster, app: &str, n: u32) -> Vec<Duration> {
    start_burst(c, app, n, 300).ready
}

/// What a burst of pods cost: each pod's create-to-Ready, containerd's RunPodSandbox for each
/// (the CNI ADD happens inside it), and the sandboxes that failed on the way.
pub struct Burst {
    /// Create-to-Ready of each pod, sorted.
    pub ready: Vec<Duration>,
    /// RunPodSandbox of each sandbox that was made, sorted, from containerd's log.
    pub sandbox: Vec<Duration>,
    /// `FailedCreatePodSandBox` events of the burst's pods (each a failed CNI ADD or a
    /// runtime error the kubelet retried).
    pub failures: u64,
    /// dipamd's handler time of each ADD of the burst's pods, sorted, from its log in the
    /// node's /var/log/pods (empty when the pods went through another network): the part of
    /// RunPodSandbox that is dipam's.
    pub dipamd_add: Vec<Duration>,
}

/// `kubectl get pods -w` of one app's pods, each line sent with the instant it arrived.
struct PodWatch {
    child: std::process::Child,
    reader: std::thread::JoinHandle<()>,
}

impl PodWatch {
    fn spawn(c: &Cluster, app: &str, tx: std::sync::mpsc::Sender<(Instant, String)>) -> Self {
        use std::io::BufRead as _;
        let template =
            "jsonpath={.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}";
        let mut child = c
            .kubectl_command(&[
                "get",
                "pods",
                "-l",
                &format!("app={app}"),
                "-w",
                "-o",
                template,
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Self { child, reader }
    }

    /// The watch's exit status, once kubectl has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.reader.join();
    }
}

/// A Deployment `app` of `n` pods created at once; returns when every pod is Ready (at most
/// `secs`), after deleting the Deployment and waiting for its pods to go.
pub fn start_burst(c: &Cluster, app: &str, n: u32, secs: u64) -> Burst {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watch = PodWatch::spawn(c, app, tx.clone());
    std::thread::sleep(Duration::from_secs(1));
    apply_text(c, app, &deployment(app, n));
    let mut created = std::collections::BTreeMap::new();
    let mut ready_at = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while ready_at.len() < n as usize {
        assert!(
            Instant::now() < deadline,
            "{app}: {} of {n} pods Ready in {secs} s\n{}",
            ready_at.len(),
            c.diagnostics()
        );
        let Ok((at, line)) = rx.recv_timeout(Duration::from_secs(1)) else {
            // A watch the API server ended (it did once under a 250-pod burst, at load 20)
            // is started again: its first lines list every pod as it is now, and a pod's
            // creation keeps the first time it was seen.
            if let Some(status) = watch.exited() {
                eprintln!("{app}: the pod watch ended ({status}); watching again");
                watch = PodWatch::spawn(c, app, tx.clone());
            }
            continue;
        };
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        created.entry(name.to_owned()).or_insert(at);
        if words.next() == Some("True") {
            ready_at.entry(name.to_owned()).or_insert(at);
        }
    }
    watch.stop();
    let failures = sandbox_failures(c, app);
    c.kubectl_ok(&["delete", "deployment", app, "--wait=true"]);
    c.wait_for(&format!("{app}'s pods to go"), secs, |c| {
        c.get_json(&["pods", "-l", &format!("app={app}")])["items"]
            .as_array()?
            .is_empty()
            .then_some(())
    });
    let mut ready: Vec<_> = ready_at
        .iter()
        .map(|(k, r)| r.duration_since(created[k]))
        .collect();
    ready.sort();
    Burst {
        ready,
        sandbox: run_pod_sandbox_times(&c.log_of("containerd.err"), app),
        failures,
        dipamd_add: dipamd_add_times(&dipamd_logs(c), app),
    }
}

/// Every log file of the DaemonSet's dipam pods on the node (the kubelet's CRI log format,
/// one line per dipamd line), read after a burst; a rollout's earlier pods are included while
/// their files remain.
fn dipamd_logs(c: &Cluster) -> String {
    let mut text = String::new();
    let pods = c.node.path("/var/log/pods");
    for dir in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
        if !dir
            .file_name()
            .to_string_lossy()
            .starts_with("kube-system_dipam-")
        {
            continue;
        }
        for container in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for file in std::fs::read_dir(container.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                text.push_str(&std::fs::read_to_string(file.path()).unwrap_or_default());
            }
        }
    }
    text
}

/// dipamd's handler time of each ADD of `app`'s pods: its `ok` lines (JSON, as the DaemonSet
/// logs) whose span is an ADD and whose `pod` is one of `app`'s, each behind the
/// kubelet's `<time> <stream> <tag> ` prefix. Sorted.
pub fn dipamd_add_times(log: &str, app: &str) -> Vec<Duration> {
    // A Deployment's pod is `<app>-<replica set hash>-<pod hash>`: the app is what is left
    // without the two hashes (`dense-again-...` is not `dense`'s).
    let of_app = |pod: &str| {
        let name = pod.split_once('/').map_or(pod, |(_, n)| n);
        name.rsplitn(3, '-').nth(2) == Some(app)
    };
    let mut out: Vec<Duration> = log
        .lines()
        .filter_map(|line| {
            let json = &line[line.find('{')?..];
            let v: Value = serde_json::from_str(json).ok()?;
            let fields = &v["fields"];
            let ours = fields["message"] == "ok"
                && v["span"]["command"] == "ADD"
                && of_app(fields["pod"].as_str()?);
            if !ours {
                return None;
            }
            Some(Duration::from_secs_f64(
                fields["elapsed_ms"].as_f64()? / 1000.0,
            ))
        })
        .collect();
    out.sort();
    out
}

/// The `FailedCreatePodSandBox` events of `app`'s pods, each counted as often as it recurred.
fn sandbox_failures(c: &Cluster, app: &str) -> u64 {
    let events = c.get_json(&[
        "events",
        "--field-selector",
        "reason=FailedCreatePodSandBox",
    ]);
    let prefix = format!("{app}-");
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["involvedObject"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|e| e["count"].as_u64().unwrap_or(1))
        .sum()
}

/// RunPodSandbox's time for each sandbox of `app`'s pods, sorted, from containerd 2's log
/// (logrus text): from `time="...T01:02:03.456789Z" ... msg="RunPodSandbox for name:\"<pod>\"
/// uid:...` to the same pod's `... returns sandbox id ...`. A start that failed is left out
/// (the failure count has it), and the retry's start replaces it.
pub fn run_pod_sandbox_times(log: &str, app: &str) -> Vec<Duration> {
    let marker = format!("RunPodSandbox for name:\\\"{app}-");
    let mut started: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in log.lines() {
        let Some(at) = line.find(&marker) else {
            continue;
        };
        let rest = &line[at + marker.len() - app.len() - 1..];
        let Some(name) = rest.split('\\').next() else {
            continue;
        };
        let Some(t) = seconds_of_day(line) else {
            continue;
        };
        if line.contains("returns sandbox id") {
            if let Some(s) = started.remove(name) {
                out.push(Duration::from_secs_f64((t - s).max(0.0)));
            }
        } else if !line.contains("failed") {
            started.insert(name.to_owned(), t);
        }
    }
    out.sort();
    out
}

/// The time of day of a logrus line's `time="<RFC 3339>"`, in seconds (a burst never spans
/// midnight on the scale of the seconds it takes).
fn seconds_of_day(line: &str) -> Option<f64> {
    let t = line.split("time=\"").nth(1)?;
    let clock = t.split('T').nth(1)?;
    let clock = clock.split(['Z', '+', '"']).next()?;
    let mut parts = clock.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The `p`th percentile of `sorted` (nearest rank).
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// Applies a JSON patch to the DaemonSet and waits for the rollout and its pod to be Ready.
pub fn patch_daemonset(c: &Cluster, patch: &str) {
    c.kubectl_ok(&["-n", "kube-system", "patch", DS, "--type=json", "-p", patch]);
    rollout_status(c);
    wait_daemonset_ready(c, 120);
}

/// Waits (up to 300 s) for the DaemonSet's rollout to finish.
pub fn rollout_status(c: &Cluster) {
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        DS,
        "--timeout=300s",
    ]);
}

/// Pod start latencies of 20 pods with `conflist` placed before dipam's.
pub fn latencies_with(
    c: &Cluster,
    conf: &std::path::Path,
    conflist: &Value,
    app: &str,
) -> Vec<Duration> {
    burst_with(c, conf, conflist, app, 20, 300).ready
}

/// [`start_burst`] with `conflist` placed before dipam's (the lexically first conflist
/// containerd loads), then removed.
pub fn burst_with(
    c: &Cluster,
    conf: &std::path::Path,
    conflist: &Value,
    app: &str,
    n: u32,
    secs: u64,
) -> Burst {
    std::fs::write(conf, conflist.to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let b = start_burst(c, app, n, secs);
    std::fs::remove_file(conf).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as the kubelet writes a container's stderr: an ADD of the app's pod, its DEL,
    /// another app's ADD, a STATUS, and a line that is not JSON.
    #[test]
    fn dipamd_add_times_are_the_apps_adds() {
        let line = |verb: &str, pod: &str, ms: f64| {
            format!(
                r#"2026-11-29T14:00:00.1Z stderr F {{"timestamp":"x","level":"INFO","fields":{{"message":"ok","pod":"{pod}","elapsed_ms":{ms}}},"span":{{"command":"{verb}"}}}}"#
            )
        };
        let log = [
            line("ADD", "default/dense-7c9-abc", 4.5),
            line("DEL", "default/dense-7c9-abc", 9.0),
            line("ADD", "default/dense-again-7c9-x", 7.0),
            line("ADD", "default/dense-7c9-def", 2.5),
            line("STATUS", "-", 0.1),
            "2026-11-29T14:00:00.1Z stderr F starting".to_owned(),
        ]
        .join("\n");
        assert_eq!(
            dipamd_add_times(&log, "dense"),
            [Duration::from_micros(2500), Duration::from_micros(4500)]
        );
    }

    /// Lines as containerd 2.4.2 writes them: a failed start, its retry, another pod's start
    /// that never returned, and another app's pod.
    #[test]
    fn run_pod_sandbox_times_pairs_each_start_with_its_return() {
        let log = [
            r#"time="2026-11-29T01:49:42.000000000Z" level=info msg="RunPodSandbox for name:\"web-1\" uid:\"u\" namespace:\"default\"""#,
            r#"time="2026-11-29T01:49:43.000000000Z" level=error msg="RunPodSandbox for name:\"web-1\" uid:\"u\" namespace:\"default\" failed, error" error="cni""#,
            r#"time="2026-11-29T01:49:44.000000000Z" level=info msg="RunPodSandbox for name:\"web-1\" uid:\"u\" namespace:\"default\"""#,
            r#"time="2026-11-29T01:49:44.000000000Z" level=info msg="RunPodSandbox for name:\"web-2\" uid:\"v\" namespace:\"default\"""#,
            r#"time="2026-11-29T01:49:45.000000000Z" level=info msg="RunPodSandbox for name:\"webx-1\" uid:\"w\" namespace:\"default\"""#,
            r#"time="2026-11-29T01:49:46.500000000Z" level=info msg="RunPodSandbox for name:\"web-1\" uid:\"u\" namespace:\"default\" returns sandbox id \"abc\"""#,
            r#"time="2026-11-29T01:49:47.000000000Z" level=info msg="RunPodSandbox for name:\"webx-1\" uid:\"w\" namespace:\"default\" returns sandbox id \"def\"""#,
        ]
        .join("\n");
        assert_eq!(
            run_pod_sandbox_times(&log, "web"),
            vec![Duration::from_millis(2500)]
        );
    }
}
