//! The ADD result of main mode: the IPAM's addresses, attached to the interfaces dipam made.
//!
//! Rules (spec §5 "ADD Success", docs/sources.md §4, §10):
//! - `interfaces` lists the host end first, then the container end with `sandbox` = CNI_NETNS
//!   (the exact string: CHECK and podman compare it), both with their MAC (podman parses it;
//!   missing = hard error);
//! - every IP from the IPAM points at the container end by index. podman ignores IPs without
//!   an index and rejects out-of-range ones, containerd panics at `index == len`;
//! - when chained after another plugin, its prevResult comes first, unchanged, and dipam's
//!   interfaces are appended (spec §ADD: "MUST pass it through or modify it"), so earlier
//!   indices stay valid;
//! - `dns`: the config's `dns` when set, else the IPAM's, else prevResult's (ptp's rule);
//! - printed in exactly the config's cniVersion: 0.3.x/0.4.0 with `ips[].version`, 1.x
//!   without; `interfaces[].mtu` only from 1.1.0 on, where the spec has it.

use rscni_types::{
    legacy,
    types::{CNIResult, CNIResultWithVersion, Dns, Interface},
    version::SpecVersion,
};

use crate::error::PluginError;

/// A link the datapath created, as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedLink {
    pub name: String,
    pub mac: String,
    pub mtu: u32,
}

/// Both ends of the pod's veth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub host: CreatedLink,
    pub container: CreatedLink,
}

fn dns_is_set(d: &Dns) -> bool {
    !d.nameservers.is_empty()
        || d.domain.as_ref().is_some_and(|s| !s.is_empty())
        || d.search.as_ref().is_some_and(|v| !v.is_empty())
        || d.options.as_ref().is_some_and(|v| !v.is_empty())
}

/// Builds the result for the runtime from `prev` (chained ADD), the IPAM's result and what the
/// datapath created in `netns`.
pub fn assemble(
    prev: Option<&CNIResult>,
    ipam: &CNIResult,
    created: &Created,
    netns: &str,
    conf_dns: Option<&Dns>,
    version: SpecVersion,
) -> CNIResult {
    let mut out = prev.cloned().unwrap_or_default();
    let with_mtu = version >= SpecVersion::new(1, 1, 0);
    let host_index = out.interfaces.len();
    out.interfaces.push(Interface {
        name: created.host.name.clone(),
        mac: created.host.mac.clone(),
        mtu: with_mtu.then_some(created.host.mtu),
        sandbox: None,
        socket_path: None,
        pci_id: None,
    });
    out.interfaces.push(Interface {
        name: created.container.name.clone(),
        mac: created.container.mac.clone(),
        mtu: with_mtu.then_some(created.container.mtu),
        sandbox: Some(netns.to_owned()),
        socket_path: None,
        pci_id: None,
    });
    let container_index = u32::try_from(host_index + 1).unwrap_or(u32::MAX);
    out.ips.extend(ipam.ips.iter().cloned().map(|mut ip| {
        ip.interface = Some(container_index);
        ip
    }));
    out.routes.extend(ipam.routes.iter().cloned());
    let dns = [
        conf_dns,
        ipam.dns.as_ref(),
        prev.and_then(|p| p.dns.as_ref()),
    ]
    .into_iter()
    .flatten()
    .find(|d| dns_is_set(d))
    .cloned();
    out.dns = dns;
    out
}

/// Serializes `result` in exactly `version`'s layout (spec §4.1).
pub fn render(version: SpecVersion, result: CNIResult) -> Result<Vec<u8>, PluginError> {
    let out = if version.is_legacy() {
        serde_json::to_vec(&legacy::CNIResult::new(version, result))
    } else {
        serde_json::to_vec(&CNIResultWithVersion::new(version, result))
    };
    out.map_err(|e| PluginError::Datapath {
        step: "printing the result".into(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn created() -> Created {
        Created {
            host: CreatedLink {
                name: "dp0123456789a".into(),
                mac: "aa:bb:cc:00:00:01".into(),
                mtu: 1500,
            },
            container: CreatedLink {
                name: "eth0".into(),
                mac: "aa:bb:cc:00:00:02".into(),
                mtu: 1500,
            },
        }
    }

    fn ipam() -> CNIResult {
        serde_json::from_value(json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.77.1.5/24", "gateway": "10.77.1.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        }))
        .unwrap()
    }

    fn v(s: &str) -> SpecVersion {
        s.parse().unwrap()
    }

    fn printed(version: &str, r: CNIResult) -> Value {
        serde_json::from_slice(&render(v(version), r).unwrap()).unwrap()
    }

    #[test]
    fn first_plugin_result_points_ips_at_the_container() {
        let r = assemble(
            None,
            &ipam(),
            &created(),
            "/var/run/netns/p",
            None,
            v("1.1.0"),
        );
        assert_eq!(
            printed("1.1.0", r),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "dp0123456789a", "mac": "aa:bb:cc:00:00:01", "mtu": 1500},
                    {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "mtu": 1500,
                     "sandbox": "/var/run/netns/p"}
                ],
                "ips": [{"address": "10.77.1.5/24", "gateway": "10.77.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0"}]
            })
        );
    }

    #[test]
    fn every_version_has_its_own_layout() {
        for ver in ["0.3.0", "0.3.1", "0.4.0"] {
            let r = assemble(None, &ipam(), &created(), "/n", None, v(ver));
            let p = printed(ver, r);
            assert_eq!(p["cniVersion"], ver);
            assert_eq!(p["ips"][0]["version"], "4", "{p}");
            assert_eq!(p["ips"][0]["interface"], 1);
            assert!(p["interfaces"][0].get("mtu").is_none(), "{p}");
        }
        let p = printed(
            "1.0.0",
            assemble(None, &ipam(), &created(), "/n", None, v("1.0.0")),
        );
        assert!(p["ips"][0].get("version").is_none(), "{p}");
        assert!(
            p["interfaces"][1].get("mtu").is_none(),
            "1.0.0 has no mtu: {p}"
        );
    }

    #[test]
    fn chained_after_another_plugin_appends_and_shifts_indices() {
        let prev: CNIResult = serde_json::from_value(json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "lo", "sandbox": "/n"}],
            "ips": [{"version": "4", "address": "127.0.0.1/8", "interface": 0}],
            "routes": [{"dst": "127.0.0.0/8"}],
            "dns": {"nameservers": ["10.0.0.10"]}
        }))
        .unwrap();
        let r = assemble(Some(&prev), &ipam(), &created(), "/n", None, v("0.4.0"));
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[0].name, "lo");
        assert_eq!(r.interfaces[2].name, "eth0");
        assert_eq!(
            r.ips[0].interface,
            Some(0),
            "the earlier IP keeps its index"
        );
        assert_eq!(r.ips[1].interface, Some(2));
        assert_eq!(r.routes.len(), 2);
        // The IPAM's dns is empty: prevResult's survives.
        assert_eq!(r.dns.unwrap().nameservers, vec!["10.0.0.10".to_string()]);
        // Every index is in range (containerd panics at index == len).
        assert!(
            r.ips
                .iter()
                .all(|ip| (ip.interface.unwrap() as usize) < r.interfaces.len())
        );
    }

    #[test]
    fn config_dns_overrides_the_ipams() {
        let mut with_dns = ipam();
        with_dns.dns = Some(Dns {
            nameservers: vec!["10.1.1.1".into()],
            ..Dns::default()
        });
        let conf = Dns {
            nameservers: vec!["10.2.2.2".into()],
            ..Dns::default()
        };
        let r = assemble(None, &with_dns, &created(), "/n", Some(&conf), v("1.0.0"));
        assert_eq!(r.dns.unwrap().nameservers, vec!["10.2.2.2".to_string()]);
        let r = assemble(
            None,
            &with_dns,
            &created(),
            "/n",
            Some(&Dns::default()),
            v("1.0.0"),
        );
        assert_eq!(r.dns.unwrap().nameservers, vec!["10.1.1.1".to_string()]);
    }
}
