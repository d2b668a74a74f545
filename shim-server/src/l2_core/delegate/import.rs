//! A reservation in host-local's store as a ledger record: what `dipamctl recover` (offline,
//! a lost ledger) and adoption (online, running pods dipamd never saw) both write. The store
//! says which (container ID, ifname) holds which address; the network's config says the
//! prefix and gateway the pod was given, which host-local's file does not keep.

use std::net::IpAddr;

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
use serde_json::{Value, json};

use super::config::DelegateConf;

/// The request ID of a record adoption wrote (`adopt.rs`): a pod dipamd never saw add.
pub const ADOPTED: &str = "adopted";

/// The prefix length and gateway of `ip` under host-local's `ranges` in `conf`.
pub fn placement(conf: &Value, ip: IpAddr) -> Option<(u8, String)> {
    conf["ipam"]["ranges"]
        .as_array()?
        .iter()
        .flat_map(|set| set.as_array().into_iter().flatten())
        .find_map(|r| {
            let net: ipnet::IpNet = r["subnet"].as_str()?.parse().ok()?;
            if !net.contains(&ip) {
                return None;
            }
            let gw =
                r["gateway"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| match net.network() {
                        IpAddr::V4(n) => std::net::Ipv4Addr::from(u32::from(n) + 1).to_string(),
                        IpAddr::V6(n) => std::net::Ipv6Addr::from(u128::from(n) + 1).to_string(),
                    });
            Some((net.prefix_len(), gw))
        })
}

/// The agent role of a container ID dipamd gave an agent address, if it is one.
pub fn agent_role(container_id: &str) -> Option<String> {
    match crate::l1_leaves::keys::internal(container_id)? {
        crate::l1_leaves::keys::Internal::Agent { role } => Some(role),
        // A claim's name cannot be told from the node name in its container ID; "claim"
        // keeps it the agent's (never freed by GC, never handed to a pod), and the next
        // reconcile pass keeps or releases it by its key.
        crate::l1_leaves::keys::Internal::Claim => Some("claim".into()),
        _ => None,
    }
}

/// How the delegate is to be run for the records made: the config bytes and the version
/// dipamd would send it (its probe's choice).
#[derive(Debug, Clone)]
pub struct Delegate<'a> {
    pub dc: &'a DelegateConf,
    pub config: String,
    pub version: String,
}

/// The record of `ips`, held by the delegate under (`container_id`, `ifname`), and the
/// addresses left out (outside every configured range). `None` when none is left.
pub fn record(
    d: &Delegate<'_>,
    container_id: &str,
    ifname: &str,
    ips: &[IpAddr],
    request_id: &str,
    at: u64,
) -> (Option<AttachmentRecord>, Vec<IpAddr>) {
    let mut entries = Vec::new();
    let mut outside = Vec::new();
    for ip in ips {
        match placement(&d.dc.conf, *ip) {
            Some((prefix, gw)) => {
                entries.push(json!({"address": format!("{ip}/{prefix}"), "gateway": gw}));
            }
            None => outside.push(*ip),
        }
    }
    if entries.is_empty() {
        return (None, outside);
    }
    let owner = match agent_role(container_id) {
        Some(role) => Owner::Agent { role },
        None => Owner::Pod,
    };
    let rec = AttachmentRecord {
        key: AttachmentKey::new(&d.dc.network, container_id, ifname),
        owner,
        state: AttachmentState::Committed,
        delegate_type: d.dc.kind.clone(),
        delegate_version: d.version.clone(),
        delegate_config: d.config.clone(),
        netns: String::new(),
        cni_args: String::new(),
        cni_path: String::new(),
        result: Some(json!({ "ips": entries })),
        config_digest: d.dc.digest(),
        request_id: request_id.into(),
        created_at: at,
        updated_at: at,
        issued_ms: 0,
        issued_at: None,
        delegate_key: None,
        creator_uid: None,
        cri_pod: None,
    };
    (Some(rec), outside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids_and_placement() {
        assert_eq!(
            agent_role("dipam-router-ipv4-node1").as_deref(),
            Some("router")
        );
        assert_eq!(
            agent_role("dipam-health-ipv6-n.x").as_deref(),
            Some("health")
        );
        assert_eq!(agent_role("dipam-routerx-ipv4-n"), None);
        assert_eq!(agent_role("abc"), None);
        let conf = json!({"ipam":{"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00::/64","gateway":"fd00::fe"}]]}});
        assert_eq!(
            placement(&conf, "10.1.0.9".parse().unwrap()),
            Some((24, "10.1.0.1".into()))
        );
        assert_eq!(
            placement(&conf, "fd00::5".parse().unwrap()),
            Some((64, "fd00::fe".into()))
        );
        assert_eq!(placement(&conf, "10.2.0.1".parse().unwrap()), None);
    }
}
