//! The cluster's own credentials, made fresh for each cluster: a CA, the API server's serving
//! certificate, a client certificate per component (the identities Kubernetes' default RBAC
//! and the Node authorizer expect: `system:node:<node>` in `system:nodes` for the kubelet,
//! `system:kube-controller-manager`, `system:kube-scheduler`, `system:kube-proxy`), an admin
//! in `system:masters` for the test's kubectl and for the API server's calls to the kubelet,
//! and the service-account signing key pair. Kubeconfigs name the files.

use std::path::{Path, PathBuf};

use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The in-cluster address of the `kubernetes` Service: the first of the service range.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

pub struct Pki {
    pub dir: PathBuf,
}

/// Signs `p` as a TLS leaf (server or client, by `usage`) with a fresh key and writes
/// `FILE.crt` and `FILE.key`: the API server's and every component's certificate alike.
fn sign_leaf(
    dir: &Path,
    file: &str,
    mut p: CertificateParams,
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'static, KeyPair>,
) {
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("a leaf key");
    let cert = p
        .signed_by(&key, issuer)
        .unwrap_or_else(|e| panic!("{file} certificate: {e}"));
    write(dir, &format!("{file}.crt"), &cert.pem());
    write(dir, &format!("{file}.key"), &key.serialize_pem());
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("write {name}: {e}"));
}

impl Pki {
    /// Makes everything in `dir` for a node named `node` whose API server answers on
    /// `server_ip`.
    pub fn create(dir: &Path, node: &str, server_ip: &str) -> Self {
        std::fs::create_dir_all(dir).expect("pki dir");
        let (ca_pem, ca_key, issuer) = crate::kubeapi::new_ca("dipam-test-cluster-ca");
        write(dir, "ca.crt", &ca_pem);
        write(dir, "ca.key", &ca_key);

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
        sign_leaf(
            dir,
            "apiserver",
            server,
            ExtendedKeyUsagePurpose::ServerAuth,
            &issuer,
        );

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
            sign_leaf(dir, file, p, ExtendedKeyUsagePurpose::ClientAuth, &issuer);
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
