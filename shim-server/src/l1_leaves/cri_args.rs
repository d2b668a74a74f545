//! What a pod ADD's CNI_ARGS say about the Kubernetes pod it is for: whether it came through
//! a CRI runtime, and which pod (namespace, name, UID). The ledger keeps it (`cri_pod`), and
//! the runtime-aware GC (gc/runtime/) frees only attachments that carry it.
//!
//! A CRI runtime names the pod in CNI_ARGS: containerd's CRI plugin sends
//! `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID` (the sandbox ID, which is
//! also CNI_CONTAINERID) and `K8S_POD_UID`, plus `IgnoreUnknown=1`, in a different order on
//! each call (containerd internal/cri/server/sandbox_run.go, `cni.WithLabels`); CRI-O's ocicni
//! sends the same four. podman's CNI backend sends only `K8S_POD_NAME` (containers/common
//! libnetwork/cni/run.go, podman#12083) and `ctr run --cni` none. So an ADD is "made through CRI" only when all four are there,
//! well formed, and the infra container ID is the container ID: anything less is not, and an
//! attachment that is not is never freed by the runtime-aware GC. The values come from
//! whoever calls the socket and end up in the ledger, in logs and in dipamctl's output: each
//! is checked and bounded like any untrusted input (docs/cfp.md §7.4).

use dipam_state::CriPod;

/// The CNI_ARGS keys a CRI runtime sets.
pub const NAMESPACE: &str = "K8S_POD_NAMESPACE";
pub const NAME: &str = "K8S_POD_NAME";
pub const UID: &str = "K8S_POD_UID";
pub const INFRA: &str = "K8S_POD_INFRA_CONTAINER_ID";

/// Longest accepted pod UID: Kubernetes' are UUIDs (36), a static pod's a 32-digit hash.
const UID_MAX: usize = 128;

/// What is wrong with CNI_ARGS that name a pod, each value shown bounded
/// (`validate::shown`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotCri {
    #[error("{0} is given twice, with different values")]
    Twice(&'static str),
    #[error("{key} {0} is not a Kubernetes namespace name (1-63 of a-z, 0-9, '-')", key = NAMESPACE)]
    Namespace(String),
    #[error("{key} {0} is not a Kubernetes pod name (1-253 of a-z, 0-9, '-', '.')", key = NAME)]
    Name(String),
    #[error("{key} {0} is not a pod UID (1-{max} of letters, digits, '-')", key = UID, max = UID_MAX)]
    Uid(String),
    #[error(
        "{key} {0} is not CNI_CONTAINERID (a CRI runtime sends the sandbox ID as both)",
        key = INFRA
    )]
    Infra(String),
}

/// The pod an ADD with `cni_args` for `container_id` names, if it came through CRI.
///
/// `Ok(None)`: not a CRI ADD (some of the four keys are missing). `Err`: all four are there
/// but something is wrong with them (a repeated key, a value that is not a Kubernetes name,
/// an infra container ID that is not the container's); the text says what, bounded.
pub fn cri_pod(container_id: &str, cni_args: &str) -> Result<Option<CriPod>, NotCri> {
    let mut found: [Option<&str>; 4] = [None; 4];
    for pair in cni_args.split(';') {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let Some(i) = [NAMESPACE, NAME, UID, INFRA].iter().position(|k| *k == key) else {
            continue;
        };
        if found[i].is_some_and(|v| v != value) {
            return Err(NotCri::Twice([NAMESPACE, NAME, UID, INFRA][i]));
        }
        found[i] = Some(value);
    }
    let [Some(namespace), Some(name), Some(uid), Some(infra)] = found else {
        return Ok(None);
    };
    if !dns_label(namespace) {
        return Err(NotCri::Namespace(crate::l1_leaves::validate::shown(
            namespace,
        )));
    }
    if !dns_subdomain(name) {
        return Err(NotCri::Name(crate::l1_leaves::validate::shown(name)));
    }
    if uid.is_empty()
        || uid.len() > UID_MAX
        || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(NotCri::Uid(crate::l1_leaves::validate::shown(uid)));
    }
    if infra != container_id {
        return Err(NotCri::Infra(crate::l1_leaves::validate::shown(infra)));
    }
    Ok(Some(CriPod {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }))
}

/// [`cri_pod`] for a record about to be written: a pod ADD's pod, or nothing. A malformed
/// one is logged and not recorded (the ADD itself goes on: its CNI_ARGS are the delegate's
/// business), so the runtime-aware GC will never free that attachment.
pub fn for_record(
    owner: &dipam_state::Owner,
    key: &dipam_state::AttachmentKey,
    cni_args: &str,
) -> Option<CriPod> {
    if *owner != dipam_state::Owner::Pod {
        return None;
    }
    match cri_pod(&key.container_id, cni_args) {
        Ok(pod) => pod,
        Err(why) => {
            tracing::warn!(key = %key, "CNI_ARGS name a pod, but not as a CRI runtime does: {why}; the attachment is not recorded as made through CRI, so the runtime-aware GC will never free it");
            None
        }
    }
}

/// RFC 1123 label, as Kubernetes checks namespace names.
fn dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain, as Kubernetes checks pod names.
fn dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.split('.').all(|label| {
            !label.is_empty()
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

    const SANDBOX: &str = "4d1f0c1e9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

    fn args(parts: &[(&str, &str)]) -> String {
        let mut v: Vec<String> = parts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        v.push("IgnoreUnknown=1".into());
        v.join(";")
    }

    #[test]
    fn containerds_args_in_any_order_name_the_pod() {
        let parts = [
            (NAMESPACE, "kube-system"),
            (NAME, "coredns-5d78c9869d-x7k2p"),
            (INFRA, SANDBOX),
            (UID, "8a2f7c3e-1b4d-4e5f-9a6b-7c8d9e0f1a2b"),
        ];
        let want = CriPod {
            namespace: "kube-system".into(),
            name: "coredns-5d78c9869d-x7k2p".into(),
            uid: "8a2f7c3e-1b4d-4e5f-9a6b-7c8d9e0f1a2b".into(),
        };
        // containerd changes the order from call to call: every rotation and the reverse.
        for turn in 0..parts.len() {
            let mut p = parts.to_vec();
            p.rotate_left(turn);
            assert_eq!(cri_pod(SANDBOX, &args(&p)), Ok(Some(want.clone())));
            p.reverse();
            assert_eq!(cri_pod(SANDBOX, &args(&p)), Ok(Some(want.clone())));
        }
    }

    #[test]
    fn podman_ctr_and_dipamds_own_args_are_not_cri() {
        for a in [
            // podman's CNI backend: the container's name only.
            format!("IgnoreUnknown=1;{NAME}=web"),
            // Three of the four, without the UID.
            format!("IgnoreUnknown=1;{NAMESPACE}=web;{INFRA}={SANDBOX};{NAME}=web"),
            // ctr run --cni: none.
            String::new(),
            // The agent's and the warm pool's own ADDs.
            format!("IgnoreUnknown=1;{NAMESPACE}=kube-system;{NAME}=dipam-pool-n1-0"),
            // A stray key that only looks alike.
            format!("k8s_pod_uid=x;{NAMESPACE}=a;{NAME}=b;{INFRA}={SANDBOX}"),
        ] {
            assert_eq!(cri_pod(SANDBOX, &a), Ok(None), "{a}");
        }
    }

    #[test]
    fn malformed_cri_args_are_refused_with_a_bounded_reason() {
        let good = [
            (NAMESPACE, "default"),
            (NAME, "web-0"),
            (UID, "u-1"),
            (INFRA, SANDBOX),
        ];
        let huge = "a".repeat(1 << 16);
        for (key, bad, says) in [
            (NAMESPACE, "Default", "namespace"),
            (NAMESPACE, "-x", "namespace"),
            (NAMESPACE, &huge[..64], "namespace"),
            (NAME, "web_0", "pod name"),
            (NAME, "a..b", "pod name"),
            (NAME, &huge[..], "pod name"),
            (NAME, "", "pod name"),
            (UID, "", "pod UID"),
            (UID, "a b", "pod UID"),
            (UID, &huge[..129], "pod UID"),
            (INFRA, "another-sandbox", "CNI_CONTAINERID"),
        ] {
            let parts: Vec<(&str, &str)> = good
                .iter()
                .map(|(k, v)| if *k == key { (*k, bad) } else { (*k, *v) })
                .collect();
            let e = cri_pod(SANDBOX, &args(&parts)).unwrap_err().to_string();
            assert!(e.contains(says), "{key}={bad:.20}: {e}");
            assert!(e.len() < 300, "{}", e.len());
        }
        let twice = format!("{};{UID}=other", args(&good));
        assert!(matches!(cri_pod(SANDBOX, &twice), Err(NotCri::Twice(UID))));
        // The same value twice is harmless.
        let same = format!("{};{UID}=u-1", args(&good));
        assert!(cri_pod(SANDBOX, &same).unwrap().is_some());
    }

    #[test]
    fn only_pod_records_carry_a_pod() {
        let key = dipam_state::AttachmentKey::new("n", SANDBOX, "eth0");
        let a = args(&[
            (NAMESPACE, "default"),
            (NAME, "web-0"),
            (UID, "u-1"),
            (INFRA, SANDBOX),
        ]);
        assert!(for_record(&dipam_state::Owner::Pod, &key, &a).is_some());
        assert!(for_record(&dipam_state::Owner::Pool, &key, &a).is_none());
        let agent = dipam_state::Owner::Agent {
            role: "router".into(),
        };
        assert!(for_record(&agent, &key, &a).is_none());
        assert!(for_record(&dipam_state::Owner::Pod, &key, "IgnoreUnknown=1").is_none());
    }
}
