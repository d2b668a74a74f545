//! The cluster's own credentials, made fresh for each cluster: a CA, the API server's serving
//! certificate, a client certificate per component (the identities Kubernetes' default RBAC
//! and the Node authorizer expect: `system:node:<node>` in `system:nodes` for the kubelet,
//! `system:kube-controller-manager`, `system:kube-scheduler`, `system:kube-proxy`), an admin
//! in `system:masters` for the test's kubectl and for the API server's calls to the kubelet,
//! and the service-account signing key pair. Kubeconfigs name the files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The in-cluster address of the `kubernetes` Service: the first of the service range.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

pub struct Pki {
    pub dir: PathBuf,
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("write {name}: {e}"));
}

impl Pki {
    /// Makes everything in `dir` for a node named `node` whose API server answers on
    /// `server_ip`.
    pub fn create(dir: &Path, node: &str, server_ip: &str) -> Self {
        std::fs::create_dir_all(dir).expect("pki dir");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "dipam-test-cluster-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        write(dir, "ca.crt", &ca_cert.pem());
        write(dir, "ca.key", &ca_key.serialize_pem());
        let issuer = Issuer::new(ca, ca_key);

        let mut names: Vec<String> = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
        ]
        .map(str::to_owned)
        .to_vec();
        names.push(node.to_owned());
        let mut server = CertificateParams::new(names).expect("server params");
        for ip in [KUBERNETES_SERVICE_IP, server_ip, "127.0.0.1"] {
            server
                .subject_alt_names
                .push(SanType::IpAddress(ip.parse().expect("an IP")));
        }
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("server key");
        let cert = server.signed_by(&key, &issuer).expect("server certificate");
        write(dir, "apiserver.crt", &cert.pem());
        write(dir, "apiserver.key", &key.serialize_pem());

        let node_user = format!("system:node:{node}");
        for (file, cn, org) in [
            ("admin", "dipam-test-admin", Some("system:masters")),
            ("kubelet", node_user.as_str(), Some("system:nodes")),
            ("controller-manager", "system:kube-controller-manager", None),
            ("scheduler", "system:kube-scheduler", None),
            ("kube-proxy", "system:kube-proxy", None),
        ] {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
            p.distinguished_name.push(DnType::CommonName, cn);
            if let Some(o) = org {
                p.distinguished_name.push(DnType::OrganizationName, o);
            }
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let key = KeyPair::generate().expect("client key");
            let cert = p.signed_by(&key, &issuer).expect("client certificate");
            write(dir, &format!("{file}.crt"), &cert.pem());
            write(dir, &format!("{file}.key"), &key.serialize_pem());
            write(
                dir,
                &format!("{file}.kubeconfig"),
                &kubeconfig(dir, file, server_ip),
            );
        }
        // The service-account token signer (ES256; the API server verifies with the public
        // half, the controller manager signs the legacy tokens with the private one).
        let sa = KeyPair::generate().expect("service account key");
        write(dir, "sa.key", &sa.serialize_pem());
        write(dir, "sa.pub", &sa.public_key_pem());
        Self {
            dir: dir.to_path_buf(),
        }
    }

    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn kubeconfig(dir: &Path, user: &str, server_ip: &str) -> String {
    let d = dir.display();
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: dipam-test
    cluster:
      server: https://{server_ip}:6443
      certificate-authority: {d}/ca.crt
users:
  - name: {user}
    user:
      client-certificate: {d}/{user}.crt
      client-key: {d}/{user}.key
contexts:
  - name: dipam-test
    context:
      cluster: dipam-test
      user: {user}
current-context: dipam-test
"
    )
}
