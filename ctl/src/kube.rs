//! This node's pod CIDRs, read from the Kubernetes API server for `dipamctl install
//! --ranges-from-node NODE`.
//!
//! The client does what in-cluster clients do (client-go's `rest.InClusterConfig`, the
//! Kubernetes documentation's "Accessing the Kubernetes API from a Pod"): the API server is
//! `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, variables the kubelet puts
//! into every container; it authenticates with the pod's service account token,
//! `/var/run/secrets/kubernetes.io/serviceaccount/token`, sent as `Authorization: Bearer`,
//! and trusts only the cluster's CA, `.../serviceaccount/ca.crt`. Each can be overridden
//! (`--kube-api`, `--kube-token-file`, `--kube-ca-file`) for use outside a pod. The token is
//! read again for every attempt: projected service account tokens are rotated by the kubelet,
//! and a wait can outlive one.
//!
//! The node's ranges are `spec.podCIDRs` (Kubernetes API reference, Node v1: "podCIDRs
//! represents the IP ranges assigned to the node for usage by Pods on that node. If this field
//! is specified, the 0th entry must match the podCIDR field. It may contain at most 1 value
//! for each of IPv4 and IPv6."), falling back to `spec.podCIDR` only when `podCIDRs` is absent
//! or empty, as API servers older than dual-stack (1.16) write only that field. A node with
//! neither has not been given a range yet (the node IPAM controller of kube-controller-manager,
//! `--allocate-node-cidrs`, does that after the node registers): it is an error, or with
//! `--wait` a reason to wait. There is no fallback to any other range: a range shared by two
//! nodes gives two pods the same address.

use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use ipnet::IpNet;
use serde_json::Value;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};

/// Where the kubelet mounts the pod's service account token.
pub const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Where the kubelet mounts the cluster's CA bundle.
pub const CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// How long one request may take, connect to last byte: an API server that does not answer
/// within it is unreachable for this attempt.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// A Node object is a few KiB; anything far larger is not one.
const MAX_BODY: u64 = 4 << 20;

/// Where the API server is and how to authenticate to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// `https://host:port`, without a trailing slash.
    pub url: String,
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
}

impl ApiConfig {
    /// The API server's address: `api` when given (`--kube-api`), else the in-cluster
    /// variables from `env`. A bare `host:port` gets `https://`; plain HTTP is refused (the
    /// bearer token would travel in clear).
    pub fn resolve(
        api: Option<&str>,
        token_file: PathBuf,
        ca_file: PathBuf,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, KubeError> {
        let url = match api {
            Some(a) if a.starts_with("https://") => a.trim_end_matches('/').to_owned(),
            Some(a) if a.contains("://") => {
                return Err(KubeError::Config(format!(
                    "--kube-api {a}: only https:// is supported (the service account token \
                     must not travel in clear)"
                )));
            }
            Some(a) if !a.is_empty() => format!("https://{}", a.trim_end_matches('/')),
            Some(_) => return Err(KubeError::Config("--kube-api is empty".into())),
            None => {
                let var = |k: &str| env(k).filter(|v| !v.is_empty());
                match (
                    var("KUBERNETES_SERVICE_HOST"),
                    var("KUBERNETES_SERVICE_PORT"),
                ) {
                    (Some(host), Some(port)) => {
                        // net.JoinHostPort: an IPv6 address needs brackets.
                        let host = if host.parse::<std::net::Ipv6Addr>().is_ok() {
                            format!("[{host}]")
                        } else {
                            host
                        };
                        format!("https://{host}:{port}")
                    }
                    _ => {
                        return Err(KubeError::Config(
                            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set, so \
                             this is not running in a pod: pass the API server with --kube-api \
                             https://HOST:PORT (and --kube-token-file, --kube-ca-file)"
                                .into(),
                        ));
                    }
                }
            }
        };
        Ok(Self {
            url,
            token_file,
            ca_file,
        })
    }
}

/// A node's pod CIDRs, at most one per family, in the API's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCidrs {
    pub node: String,
    pub cidrs: Vec<IpNet>,
    /// The field they came from: `spec.podCIDRs`, or `spec.podCIDR` on an old API server.
    pub field: &'static str,
}

impl fmt::Display for PodCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.cidrs.iter().map(ToString::to_string).collect();
        write!(f, "{}", list.join(", "))
    }
}

/// Why the node's pod CIDRs could not be read. Each says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    #[error("{0}")]
    Config(String),
    #[error(
        "reading the service account token {path}: {why} (in a pod: the pod's service account \
         token must be mounted, so automountServiceAccountToken must not be false; elsewhere \
         pass --kube-token-file)"
    )]
    Token { path: String, why: String },
    #[error(
        "the cluster CA {path}: {why} (in a pod it is mounted with the service account token; \
         elsewhere pass the CA that signed the API server's certificate with --kube-ca-file)"
    )]
    Ca { path: String, why: String },
    #[error(
        "the API server {url} refused the service account token from {token} (401 \
         Unauthorized{msg}): the token is invalid, expired or of a deleted service account; \
         check that the pod's serviceAccountName exists and its token is mounted, or pass a \
         valid --kube-token-file"
    )]
    Unauthorized {
        url: String,
        token: String,
        msg: String,
    },
    #[error(
        "the API server {url} forbids reading node {node} (403 Forbidden{msg}): the service \
         account needs `get` on `nodes` (a ClusterRole with apiGroups [\"\"], resources \
         [\"nodes\"], verbs [\"get\"], bound to it by a ClusterRoleBinding; \
         deploy/kubernetes/dipam.yaml has both)"
    )]
    Forbidden {
        url: String,
        node: String,
        msg: String,
    },
    #[error(
        "node {node} does not exist on the API server {url} (404 Not Found{msg}): NODE must be \
         this node's name as the cluster knows it (`kubectl get nodes`); in a DaemonSet take it \
         from the downward API: env NODE_NAME from fieldRef spec.nodeName, then \
         --ranges-from-node $(NODE_NAME)"
    )]
    NotFound {
        url: String,
        node: String,
        msg: String,
    },
    #[error(
        "TLS with the API server {url} failed: {why}: its certificate must be signed by the CA \
         in {ca} (in a pod, the cluster CA mounted with the service account token) and name \
         the address used (KUBERNETES_SERVICE_HOST or --kube-api)"
    )]
    Tls {
        url: String,
        ca: String,
        why: String,
    },
    /// Worth another attempt: the API server may be starting or briefly overloaded.
    #[error("the API server {url} is unreachable: {why}")]
    Unreachable { url: String, why: String },
    /// 429 and 5xx: worth another attempt.
    #[error("the API server {url} answered {status} for node {node}{msg}")]
    Unavailable {
        url: String,
        node: String,
        status: u16,
        msg: String,
    },
    #[error("the API server {url} answered {status} for node {node}{msg}")]
    Status {
        url: String,
        node: String,
        status: u16,
        msg: String,
    },
    #[error("node {node}: {why}")]
    BadNode { node: String, why: String },
    #[error(
        "node {node} has no podCIDR yet: the node IPAM controller assigns one after the node \
         registers (kube-controller-manager --allocate-node-cidrs=true with --cluster-cidr), \
         or a cloud's node controller does; without one there is no range of this node's own \
         to hand out (never a shared one)"
    )]
    NoPodCidr { node: String },
}

impl KubeError {
    /// Whether `--wait` tries again: a range not assigned yet, or an API server not answering
    /// now. A refused token, a missing permission, a wrong node name or a certificate the CA
    /// did not sign need someone to fix them; the init container then fails, and the kubelet
    /// restarts it with its own back-off.
    pub fn worth_waiting(&self) -> bool {
        matches!(
            self,
            KubeError::NoPodCidr { .. }
                | KubeError::Unreachable { .. }
                | KubeError::Unavailable { .. }
        )
    }
}

/// `GET /api/v1/nodes/NAME` once, and its pod CIDRs.
pub fn node_pod_cidrs(cfg: &ApiConfig, node: &str) -> Result<PodCidrs, KubeError> {
    if !is_dns_subdomain(node) {
        return Err(KubeError::Config(format!(
            "node name {node:?} is not a Kubernetes object name (lower-case letters, digits, \
             '-' and '.'); in a DaemonSet pass $(NODE_NAME) from the downward API"
        )));
    }
    let ca = read_ca(&cfg.ca_file)?;
    let token = read_token(&cfg.token_file)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            TlsConfig::builder()
                .provider(TlsProvider::Rustls)
                .root_certs(RootCerts::Specific(Arc::new(ca)))
                .unversioned_rustls_crypto_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .build(),
        )
        // Every status is answered here, with what to fix.
        .http_status_as_error(false)
        // The API server is reached directly, as the in-cluster service address.
        .proxy(None)
        .max_redirects(0)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .user_agent(concat!("dipamctl/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let url = format!("{}/api/v1/nodes/{node}", cfg.url);
    let mut resp = agent
        .get(&url)
        .header("Authorization", &format!("Bearer {token}"))
        .header("Accept", "application/json")
        .call()
        .map_err(|e| transport_error(cfg, e))?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_vec()
        .map_err(|e| transport_error(cfg, e))?;
    let msg = status_message(&body);
    let (url, node_name) = (cfg.url.clone(), node.to_owned());
    match status {
        200 => parse_node(node, &body),
        401 => Err(KubeError::Unauthorized {
            url,
            token: cfg.token_file.display().to_string(),
            msg,
        }),
        403 => Err(KubeError::Forbidden {
            url,
            node: node_name,
            msg,
        }),
        404 => Err(KubeError::NotFound {
            url,
            node: node_name,
            msg,
        }),
        429 | 500..=599 => Err(KubeError::Unavailable {
            url,
            node: node_name,
            status,
            msg,
        }),
        _ => Err(KubeError::Status {
            url,
            node: node_name,
            status,
            msg,
        }),
    }
}

/// How `--wait` paces its attempts: `first`, doubling up to `max` between attempts, for as
/// long as the reason is worth waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

/// The node's pod CIDRs; with `wait`, tries again while [`KubeError::worth_waiting`], saying
/// in one `log` line per attempt why it waits and for how long.
pub fn wait_for_pod_cidrs(
    node: &str,
    wait: Option<Backoff>,
    mut attempt: impl FnMut() -> Result<PodCidrs, KubeError>,
    mut log: impl FnMut(&str),
    mut sleep: impl FnMut(Duration),
) -> Result<PodCidrs, KubeError> {
    let mut delay = wait.map(|b| b.first);
    let mut n = 0u64;
    loop {
        n += 1;
        match attempt() {
            Ok(c) => return Ok(c),
            Err(e) => match (wait, delay) {
                (Some(b), Some(d)) if e.worth_waiting() => {
                    log(&format!(
                        "node {node}: attempt {n}: {e}; waiting {}s",
                        d.as_secs_f64()
                    ));
                    sleep(d);
                    delay = Some((d * 2).min(b.max));
                }
                _ => return Err(e),
            },
        }
    }
}

/// The pod CIDRs of a Node object (JSON, as the API serves it).
pub fn parse_node(node: &str, body: &[u8]) -> Result<PodCidrs, KubeError> {
    let bad = |why: String| KubeError::BadNode {
        node: node.to_owned(),
        why,
    };
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the API server's answer is not JSON: {e}")))?;
    if v["kind"] != "Node" {
        return Err(bad(format!(
            "the API server answered a {} where a Node was expected",
            v["kind"].as_str().unwrap_or("document without a kind")
        )));
    }
    if v["metadata"]["name"] != node {
        return Err(bad(format!(
            "the API server answered node {} instead",
            v["metadata"]["name"]
        )));
    }
    let spec = &v["spec"];
    let list: Vec<&str> = match &spec["podCIDRs"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|c| {
                c.as_str()
                    .ok_or_else(|| bad(format!("spec.podCIDRs holds {c}, not a CIDR string")))
            })
            .collect::<Result<_, _>>()?,
        other => return Err(bad(format!("spec.podCIDRs is {other}, not a list"))),
    };
    let (list, field) = if list.is_empty() {
        match &spec["podCIDR"] {
            Value::Null => (Vec::new(), "spec.podCIDR"),
            Value::String(s) if s.is_empty() => (Vec::new(), "spec.podCIDR"),
            Value::String(s) => (vec![s.as_str()], "spec.podCIDR"),
            other => return Err(bad(format!("spec.podCIDR is {other}, not a CIDR string"))),
        }
    } else {
        (list, "spec.podCIDRs")
    };
    if list.is_empty() {
        return Err(KubeError::NoPodCidr {
            node: node.to_owned(),
        });
    }
    let mut cidrs: Vec<IpNet> = Vec::new();
    for s in list {
        let net: IpNet = s
            .parse()
            .map_err(|e| bad(format!("{field} holds {s:?}: {e}")))?;
        if net.trunc() != net {
            return Err(bad(format!(
                "{field} holds {s}, which is not a network address ({} is)",
                net.trunc()
            )));
        }
        // host-local needs room for the gateway (the first address) and at least one pod.
        if net.max_prefix_len() - net.prefix_len() < 2 {
            return Err(bad(format!(
                "{field} holds {s}, too small for a gateway and a pod"
            )));
        }
        if cidrs
            .iter()
            .any(|c| c.addr().is_ipv4() == net.addr().is_ipv4())
        {
            return Err(bad(format!(
                "{field} holds two {} ranges; the API allows one per family",
                family(net.addr())
            )));
        }
        cidrs.push(net);
    }
    Ok(PodCidrs {
        node: node.to_owned(),
        cidrs,
        field,
    })
}

fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The `message` of a Kubernetes `Status` body, as ": message", or "".
fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(|m| format!(": {m}")))
        .unwrap_or_default()
}

/// A transport failure, told apart as a TLS failure (which needs fixing) or an unreachable
/// server (which `--wait` waits out).
fn transport_error(cfg: &ApiConfig, e: ureq::Error) -> KubeError {
    let tls = match &e {
        ureq::Error::Rustls(r) => Some(r.to_string()),
        ureq::Error::Tls(r) => Some((*r).to_owned()),
        ureq::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(ToString::to_string),
        _ => None,
    };
    match tls {
        Some(why) => KubeError::Tls {
            url: cfg.url.clone(),
            ca: cfg.ca_file.display().to_string(),
            why,
        },
        None => KubeError::Unreachable {
            url: cfg.url.clone(),
            why: e.to_string(),
        },
    }
}

fn read_token(path: &Path) -> Result<String, KubeError> {
    let err = |why: String| KubeError::Token {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(err("the file is empty".into()));
    }
    // It goes into a header: a control character would be a different request.
    if token.chars().any(|c| c.is_control() || c == ' ') {
        return Err(err("the token holds spaces or control characters".into()));
    }
    Ok(token.to_owned())
}

fn read_ca(path: &Path) -> Result<Vec<Certificate<'static>>, KubeError> {
    let err = |why: String| KubeError::Ca {
        path: path.display().to_string(),
        why,
    };
    let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item.map_err(|e| err(format!("not PEM: {e}")))? {
            PemItem::Certificate(c) => certs.push(c),
            _ => continue,
        }
    }
    if certs.is_empty() {
        return Err(err("it holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// A Kubernetes object name (RFC 1123 subdomain), which node names are; anything else would
/// also change the request's path.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(spec: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": "node-a"}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn pod_cidrs_come_from_pod_cidrs_then_the_legacy_field_and_never_from_elsewhere() {
        let dual = parse_node(
            "node-a",
            &node(serde_json::json!({
                "podCIDR": "10.244.3.0/24",
                "podCIDRs": ["10.244.3.0/24", "fd00:10:244:3::/64"],
            })),
        )
        .unwrap();
        assert_eq!(dual.to_string(), "10.244.3.0/24, fd00:10:244:3::/64");
        assert_eq!(dual.field, "spec.podCIDRs");
        // IPv6 first is kept first: the API's order is the primary family.
        let v6 = parse_node(
            "node-a",
            &node(serde_json::json!({"podCIDRs": ["fd00::/64", "10.1.0.0/24"]})),
        )
        .unwrap();
        assert_eq!(v6.to_string(), "fd00::/64, 10.1.0.0/24");
        let old = parse_node(
            "node-a",
            &node(serde_json::json!({"podCIDR": "10.9.0.0/24"})),
        )
        .unwrap();
        assert_eq!(
            (old.to_string().as_str(), old.field),
            ("10.9.0.0/24", "spec.podCIDR")
        );
        for empty in [
            serde_json::json!({}),
            serde_json::json!({"podCIDRs": []}),
            serde_json::json!({"podCIDR": ""}),
            serde_json::json!({"providerID": "x"}),
        ] {
            let e = parse_node("node-a", &node(empty.clone())).unwrap_err();
            assert!(matches!(e, KubeError::NoPodCidr { .. }), "{empty}: {e}");
            assert!(e.worth_waiting());
        }
    }

    #[test]
    fn a_node_object_that_is_not_usable_is_refused_with_the_reason() {
        for (spec, why) in [
            (
                serde_json::json!({"podCIDRs": ["10.0.0.5/24"]}),
                "not a network address",
            ),
            (
                serde_json::json!({"podCIDRs": ["10.0.0.0/31"]}),
                "too small",
            ),
            (serde_json::json!({"podCIDRs": ["nope"]}), "\"nope\""),
            (
                serde_json::json!({"podCIDRs": ["10.0.0.0/24", "10.1.0.0/24"]}),
                "two IPv4",
            ),
            (serde_json::json!({"podCIDRs": "10.0.0.0/24"}), "not a list"),
            (serde_json::json!({"podCIDRs": [5]}), "not a CIDR string"),
        ] {
            let e = parse_node("node-a", &node(spec.clone())).unwrap_err();
            assert!(e.to_string().contains(why), "{spec}: {e}");
            assert!(!e.worth_waiting());
        }
        let e = parse_node("node-b", &node(serde_json::json!({}))).unwrap_err();
        assert!(e.to_string().contains("instead"), "{e}");
        let e = parse_node("node-a", br#"{"kind":"Status","code":404}"#).unwrap_err();
        assert!(e.to_string().contains("a Status where a Node"), "{e}");
        assert!(parse_node("node-a", b"<html>").is_err());
    }

    #[test]
    fn the_api_server_comes_from_the_flag_or_the_in_cluster_environment() {
        let files = || (PathBuf::from("/t"), PathBuf::from("/c"));
        let none = |_: &str| None;
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
            _ => None,
        };
        let (t, c) = files();
        assert_eq!(
            ApiConfig::resolve(None, t, c, env).unwrap().url,
            "https://10.96.0.1:443"
        );
        let v6 = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".to_owned()),
            _ => None,
        };
        let (t, c) = files();
        assert_eq!(
            ApiConfig::resolve(None, t, c, v6).unwrap().url,
            "https://[fd00::1]:6443"
        );
        // The flag wins over the environment.
        let (t, c) = files();
        assert_eq!(
            ApiConfig::resolve(Some("api.example:6443/"), t, c, env)
                .unwrap()
                .url,
            "https://api.example:6443"
        );
        let (t, c) = files();
        let e = ApiConfig::resolve(None, t, c, none).unwrap_err();
        assert!(e.to_string().contains("--kube-api"), "{e}");
        let (t, c) = files();
        let e = ApiConfig::resolve(Some("http://x:80"), t, c, none).unwrap_err();
        assert!(e.to_string().contains("only https://"), "{e}");
    }

    #[test]
    fn wait_retries_only_what_time_can_fix_and_says_why_each_time() {
        let mut answers = vec![
            Err(KubeError::NoPodCidr { node: "n".into() }),
            Err(KubeError::Unreachable {
                url: "u".into(),
                why: "connection refused".into(),
            }),
            Err(KubeError::NoPodCidr { node: "n".into() }),
            Err(KubeError::NoPodCidr { node: "n".into() }),
            Err(KubeError::NoPodCidr { node: "n".into() }),
            Err(KubeError::NoPodCidr { node: "n".into() }),
            Ok(PodCidrs {
                node: "n".into(),
                cidrs: vec!["10.0.0.0/24".parse().unwrap()],
                field: "spec.podCIDRs",
            }),
        ]
        .into_iter();
        let (mut lines, mut slept) = (Vec::new(), Vec::new());
        let b = Backoff {
            first: Duration::from_secs(1),
            max: Duration::from_secs(8),
        };
        let got = wait_for_pod_cidrs(
            "n",
            Some(b),
            || answers.next().unwrap(),
            |l| lines.push(l.to_owned()),
            |d| slept.push(d.as_secs()),
        )
        .unwrap();
        assert_eq!(got.to_string(), "10.0.0.0/24");
        assert_eq!(slept, [1, 2, 4, 8, 8, 8], "bounded doubling");
        assert_eq!(lines.len(), 6);
        assert!(lines[0].starts_with("node n: attempt 1: node n has no podCIDR yet"));
        assert!(lines[1].contains("connection refused") && lines[1].ends_with("waiting 2s"));

        // Without --wait, and for what needs a person, the first error is the answer.
        let forbidden = || {
            Err(KubeError::Forbidden {
                url: "u".into(),
                node: "n".into(),
                msg: String::new(),
            })
        };
        let mut calls = 0;
        let e = wait_for_pod_cidrs(
            "n",
            Some(b),
            || {
                calls += 1;
                forbidden()
            },
            |_| {},
            |_| {},
        )
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(e.to_string().contains("`get` on `nodes`"), "{e}");
        let e = wait_for_pod_cidrs(
            "n",
            None,
            || Err(KubeError::NoPodCidr { node: "n".into() }),
            |_| panic!("no wait, no log"),
            |_| panic!("no wait"),
        )
        .unwrap_err();
        assert!(matches!(e, KubeError::NoPodCidr { .. }));
    }

    #[test]
    fn token_ca_and_node_name_are_checked_before_any_request() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = |token: &Path, ca: &Path| ApiConfig {
            url: "https://127.0.0.1:1".into(),
            token_file: token.to_owned(),
            ca_file: ca.to_owned(),
        };
        let (token, ca) = (dir.path().join("token"), dir.path().join("ca.crt"));
        let e = node_pod_cidrs(&cfg(&token, &ca), "node-a").unwrap_err();
        assert!(matches!(e, KubeError::Ca { .. }), "{e}");
        std::fs::write(&ca, "not pem").unwrap();
        let e = node_pod_cidrs(&cfg(&token, &ca), "node-a").unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = node_pod_cidrs(&cfg(&token, &ca), "Node_A").unwrap_err();
        assert!(e.to_string().contains("NODE_NAME"), "{e}");
        assert!(is_dns_subdomain("ip-10-0-0-1.ec2.internal"));
        for bad in ["", "a/b", "-a", "a..b", "../x", "A"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        for (text, why) in [("", "empty"), ("a b", "spaces"), ("a\u{7}", "control")] {
            std::fs::write(&token, text).unwrap();
            let e = read_token(&token).unwrap_err();
            assert!(e.to_string().contains(why), "{text:?}: {e}");
        }
        std::fs::write(&token, "abc.def\n").unwrap();
        assert_eq!(read_token(&token).unwrap(), "abc.def");
    }
}
