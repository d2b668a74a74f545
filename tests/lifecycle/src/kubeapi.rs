//! A stand-in for the Kubernetes API server, for `dipamctl install --ranges-from-node`. It
//! follows the real contract for the one call dipamctl makes:
//!
//! - HTTPS only, with a certificate for 127.0.0.1 and `kubernetes.default.svc` signed by a CA
//!   made for this server (written as `ca.crt`, as the kubelet mounts the cluster CA), plus an
//!   unrelated CA (`other-ca.crt`) a client must refuse to trust it with;
//! - `Authorization: Bearer <token>`: an unknown or missing token is 401 Unauthorized; a known
//!   token without permission is 403 Forbidden, checked before the object is looked up, as
//!   the API server authenticates, then authorizes, then reads;
//! - `GET /api/v1/nodes/NAME` answers the Node object (a real node's shape: metadata, spec
//!   with `podCIDR`/`podCIDRs` once assigned, status), or 404 with a `Status` whose reason is
//!   NotFound;
//! - every error body is a `Status` object (`kind: Status`, `code`, `reason`, `message`),
//!   with the messages the API server writes.
//!
//! One connection at a time, `Connection: close`; it records every request so that tests can
//! assert what dipamctl sent. Stopped (and its thread joined) on drop.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tempfile::TempDir;

/// What a service account token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `get` on `nodes` (dipam's ClusterRole).
    GetNodes,
    /// Authenticated, but bound to no role that allows it.
    Nothing,
}

/// One request as the stand-in received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Value>,
    tokens: BTreeMap<String, (String, Access)>,
    requests: Vec<Request>,
}

pub struct KubeApi {
    pub dir: TempDir,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A CA: its certificate and key (PEM) and what signs with it.
pub(crate) fn new_ca(name: &str) -> (String, String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert.pem(), key.serialize_pem(), Issuer::new(params, key))
}

impl KubeApi {
    /// Starts the server on 127.0.0.1 with a fresh CA, and a token (in `token_file()`) that
    /// may get nodes.
    pub fn start() -> Self {
        let dir = crate::temp_dir("kubeapi-");
        let (ca_pem, _, issuer) = new_ca("kubernetes");
        let (other_pem, _, _) = new_ca("another-cluster");
        std::fs::write(dir.path().join("ca.crt"), &ca_pem).expect("write ca.crt");
        std::fs::write(dir.path().join("other-ca.crt"), &other_pem).expect("write other-ca.crt");

        let mut params = CertificateParams::new(vec![
            "kubernetes".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "localhost".to_owned(),
        ])
        .expect("server params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("127.0.0.1")));
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &issuer).expect("server certificate");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("server TLS config");

        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop, config) = (state.clone(), stop.clone(), Arc::new(config));
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(tcp) = conn {
                        // A client that refuses the certificate ends the handshake: nothing
                        // to answer.
                        let _ = serve(tcp, config.clone(), &state);
                    }
                }
            })
        };
        let api = Self {
            dir,
            addr,
            state,
            stop,
            thread: Some(thread),
        };
        api.add_token("dipam-token", Access::GetNodes);
        api
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// What the kubelet would inject: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
    pub fn service_env(&self) -> [(&'static str, String); 2] {
        [
            ("KUBERNETES_SERVICE_HOST", self.addr.ip().to_string()),
            ("KUBERNETES_SERVICE_PORT", self.addr.port().to_string()),
        ]
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A CA that did not sign this server's certificate.
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.path().join("other-ca.crt")
    }

    /// The file holding the token that may get nodes.
    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("dipam-token")
    }

    /// A directory laid out as the kubelet mounts a pod's service account at
    /// /var/run/secrets/kubernetes.io/serviceaccount: `token` (may get nodes), `ca.crt`,
    /// `namespace`.
    pub fn serviceaccount_dir(&self) -> PathBuf {
        let dir = self.dir.path().join("serviceaccount");
        std::fs::create_dir_all(&dir).expect("serviceaccount dir");
        std::fs::copy(self.token_file(), dir.join("token")).expect("token");
        std::fs::copy(self.ca_file(), dir.join("ca.crt")).expect("ca.crt");
        std::fs::write(dir.join("namespace"), "kube-system").expect("namespace");
        dir
    }

    /// Registers `token` with `access` and writes it to a file named after it, returned.
    pub fn add_token(&self, token: &str, access: Access) -> PathBuf {
        let path = self.dir.path().join(token);
        std::fs::write(&path, format!("{token}\n")).expect("write token");
        self.lock().tokens.insert(
            token.to_owned(),
            (format!("system:serviceaccount:kube-system:{token}"), access),
        );
        path
    }

    /// Writes `token` to a file without registering it (a token of another cluster, or
    /// revoked).
    pub fn unknown_token(&self, token: &str) -> PathBuf {
        let path = self.dir.path().join(token);
        std::fs::write(&path, token).expect("write token");
        path
    }

    /// Creates or replaces node `name` with `pod_cidrs` (none: a node that registered but has
    /// no range yet, as before the node IPAM controller got to it).
    pub fn set_node(&self, name: &str, pod_cidrs: &[&str]) {
        let mut spec = json!({"providerID": format!("kind://docker/cluster/{name}")});
        if let Some(first) = pod_cidrs.first() {
            spec["podCIDR"] = json!(first);
            spec["podCIDRs"] = json!(pod_cidrs);
        }
        self.set_node_object(name, spec);
    }

    /// Creates or replaces node `name` with exactly this `spec` (e.g. only the legacy
    /// `podCIDR`, as an API server before 1.16 serves it).
    pub fn set_node_object(&self, name: &str, spec: Value) {
        let mut st = self.lock();
        let version = st.nodes.len() + st.requests.len() + 1000;
        let node = json!({
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": format!("6a1c1a5e-0000-4000-8000-{:012}", version),
                "resourceVersion": version.to_string(),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "192.0.2.10"},
                    {"type": "Hostname", "address": name},
                ],
                "conditions": [{
                    "type": "Ready", "status": "False", "reason": "KubeletNotReady",
                    "message": "container runtime network not ready: NetworkReady=false \
                                reason:NetworkPluginNotReady message:Network plugin returns \
                                error: cni plugin not initialized",
                }],
                "nodeInfo": {"kubeletVersion": "v1.33.0", "containerRuntimeVersion": "containerd://1.7.24"},
            },
        });
        st.nodes.insert(name.to_owned(), node);
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `Status` failure body, as the API server writes it.
fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}

/// The answer to one request: status code and body.
fn answer(st: &State, req: &Request) -> (u16, Value) {
    let user = req
        .authorization
        .as_deref()
        .and_then(|h| h.strip_prefix("Bearer "))
        .and_then(|t| st.tokens.get(t));
    let Some((user, access)) = user else {
        return (401, status(401, "Unauthorized", "Unauthorized", None));
    };
    let Some(name) = req.path.strip_prefix("/api/v1/nodes/") else {
        return (
            404,
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ),
        );
    };
    if req.method != "GET" || *access != Access::GetNodes {
        let verb = req.method.to_lowercase();
        return (
            403,
            status(
                403,
                "Forbidden",
                &format!(
                    "nodes \"{name}\" is forbidden: User \"{user}\" cannot {verb} resource \
                     \"nodes\" in API group \"\" at the cluster scope"
                ),
                Some(json!({"name": name, "kind": "nodes"})),
            ),
        );
    }
    match st.nodes.get(name) {
        Some(node) => (200, node.clone()),
        None => (
            404,
            status(
                404,
                "NotFound",
                &format!("nodes \"{name}\" not found"),
                Some(json!({"name": name, "kind": "nodes"})),
            ),
        ),
    }
}

fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    state: &Mutex<State>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
    );
    let mut authorization = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            authorization = Some(v.trim().to_owned());
        }
    }
    let req = Request {
        method,
        path,
        authorization,
    };
    let (code, body) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.requests.push(req.clone());
        answer(&st, &req)
    };
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        _ => "Not Found",
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Audit-Id: 00000000-0000-4000-8000-000000000000\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes())?;
    tls.write_all(&body)?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}
