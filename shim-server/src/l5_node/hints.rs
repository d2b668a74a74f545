//! The fixes dipamd and dipamctl name where the obvious guess would point the wrong way.

/// `explain NAMESPACE/NAME` finds a pod by name only in the attachments recorded from a CRI
/// ADD, which is one that carried all four K8S_POD_* keys (cri_args.rs): naming two of them
/// sent operators of podman (which sends only K8S_POD_NAME) looking for the wrong cause.
/// The four keys are cri_args.rs's (the test below checks).
pub const POD_BY_NAME: &str = "a pod is known by name only when its runtime sent all four of K8S_POD_NAMESPACE, \
     K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID and K8S_POD_UID in CNI_ARGS (a CRI runtime: \
     containerd, CRI-O; podman sends only K8S_POD_NAME); see `dipamctl attachments`, or \
     explain its container ID";

/// doctor's fix for the agent's conflist: a file that is there but names no dipam plugin is
/// adopted with `install --wrap`, not installed again; a missing one is installed.
pub fn agent_conflist_fix(
    waiting: &str,
    source: &crate::l3_clients::agent::conflist::Source,
) -> String {
    if waiting.contains(crate::l3_clients::agent::conflist::NO_DIPAM) {
        let source = match source {
            crate::l3_clients::agent::conflist::Source::File(p) => p.display().to_string(),
            // The message names the file the directory held.
            crate::l3_clients::agent::conflist::Source::Dir { .. } => "FILE".into(),
        };
        format!(
            "put dipam in front of its IPAM: `dipamctl install --wrap {source} --in-place` \
             (dipamd picks the rewritten file up)"
        )
    } else {
        "install the network's conflist (dipamd watches for it)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l1_leaves::cri_args;

    #[test]
    fn the_pod_hint_names_every_key_a_cri_add_carries() {
        for k in [
            cri_args::NAMESPACE,
            cri_args::NAME,
            cri_args::INFRA,
            cri_args::UID,
        ] {
            assert!(POD_BY_NAME.contains(k), "{k}");
        }
    }
}
