//! CHECK of main mode: what prevResult promises about the pod's interface, and the comparison
//! with what the kernel has, without touching the kernel.
//!
//! As the spec asks (§CHECK, docs/sources.md §2.6) and ptp does: the interface named
//! CNI_IFNAME whose `sandbox` equals CNI_NETNS (exact string) must exist in the netns, be a
//! veth with the MAC from prevResult, and hold every address prevResult assigns to it; every
//! route of prevResult must exist. What later plugins added (addresses, routes) is tolerated:
//! only absence is an error. dipam also checks the host end it created: present, same MAC,
//! with its route to each pod address; without it the pod is cut off.

use std::net::IpAddr;

use ipnet::IpNet;
use rscni_types::types::CNIResult;

use crate::{
    datapath::plan::{TABLE_MAIN, host_prefix},
    error::PluginError,
};

/// A route as prevResult lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedRoute {
    pub dst: IpNet,
    /// Checked only when prevResult names it: a route without `gw` may come from an earlier
    /// plugin with its own idea of the gateway.
    pub gw: Option<IpAddr>,
    pub table: u32,
}

/// What prevResult says must exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub ifname: String,
    pub mac: String,
    pub addrs: Vec<IpNet>,
    pub routes: Vec<ExpectedRoute>,
    /// The host end: name and MAC, when prevResult lists it right before the container end
    /// (where dipam puts it).
    pub host: Option<(String, String)>,
    /// Host routes to the pod's addresses.
    pub host_routes: Vec<IpNet>,
}

/// A route as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedRoute {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub table: u32,
    pub oif: Option<u32>,
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkState {
    pub index: u32,
    pub kind: String,
    pub mac: String,
    pub addrs: Vec<IpNet>,
    pub routes: Vec<ObservedRoute>,
}

/// What the kernel has: the container end (with every route of its netns) and the host end
/// (with the host's routes through it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    pub container: Option<LinkState>,
    pub host: Option<LinkState>,
}

impl Expected {
    /// Reads the expectations for (`ifname`, `netns`) from prevResult (code 163 when
    /// prevResult does not describe such an interface at all).
    pub fn from_prev(prev: &CNIResult, ifname: &str, netns: &str) -> Result<Self, PluginError> {
        let idx = prev
            .interfaces
            .iter()
            .position(|i| i.name == ifname && i.sandbox.as_deref() == Some(netns))
            .ok_or_else(|| {
                PluginError::CheckFailed(vec![format!(
                    "prevResult lists no interface {ifname} with sandbox {netns}"
                )])
            })?;
        let container = &prev.interfaces[idx];
        let host = idx
            .checked_sub(1)
            .map(|h| &prev.interfaces[h])
            .filter(|h| h.sandbox.as_deref().is_none_or(str::is_empty))
            .map(|h| (h.name.clone(), h.mac.clone()));
        let addrs: Vec<IpNet> = prev
            .ips
            .iter()
            .filter(|ip| ip.interface.map(|i| i as usize) == Some(idx))
            .map(|ip| ip.address)
            .collect();
        let host_routes = if host.is_some() {
            addrs.iter().map(|a| host_prefix(a.addr())).collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            ifname: ifname.to_owned(),
            mac: container.mac.clone(),
            addrs,
            routes: prev
                .routes
                .iter()
                .map(|r| ExpectedRoute {
                    dst: r.dst.trunc(),
                    gw: r.gw,
                    table: r.table.unwrap_or(TABLE_MAIN),
                })
                .collect(),
            host,
            host_routes,
        })
    }
}

fn same_mac(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Everything that differs, in words an operator can act on; empty when CHECK passes.
pub fn compare(expected: &Expected, observed: &Observed) -> Vec<String> {
    let mut problems = Vec::new();
    let name = &expected.ifname;
    match &observed.container {
        None => problems.push(format!("interface {name} is missing from the netns")),
        Some(c) => {
            if c.kind != "veth" {
                problems.push(format!("{name} is a {:?} link, not a veth", c.kind));
            }
            if !expected.mac.is_empty() && !same_mac(&c.mac, &expected.mac) {
                problems.push(format!(
                    "{name} has MAC {}, prevResult says {}",
                    c.mac, expected.mac
                ));
            }
            for a in &expected.addrs {
                if !c.addrs.contains(a) {
                    problems.push(format!("{name} lacks address {a}"));
                }
            }
            for r in &expected.routes {
                let found = c.routes.iter().any(|o| {
                    o.dst == r.dst && o.table == r.table && r.gw.is_none_or(|gw| o.gw == Some(gw))
                });
                if !found {
                    let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
                    problems.push(format!("the netns lacks route {}{via}", r.dst));
                }
            }
        }
    }
    if let Some((host_name, host_mac)) = &expected.host {
        match &observed.host {
            None => problems.push(format!("host interface {host_name} is missing")),
            Some(h) => {
                if !host_mac.is_empty() && !same_mac(&h.mac, host_mac) {
                    problems.push(format!(
                        "host interface {host_name} has MAC {}, prevResult says {host_mac}",
                        h.mac
                    ));
                }
                for dst in &expected.host_routes {
                    let found = h
                        .routes
                        .iter()
                        .any(|o| o.dst == *dst && o.oif == Some(h.index));
                    if !found {
                        problems.push(format!("the host lacks route {dst} dev {host_name}"));
                    }
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn prev() -> CNIResult {
        serde_json::from_value(json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "dp0123456789a", "mac": "aa:bb:cc:00:00:01"},
                {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "sandbox": "/var/run/netns/p"}
            ],
            "ips": [{"address": "10.77.1.5/24", "gateway": "10.77.1.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0"}]
        }))
        .unwrap()
    }

    fn route(dst: &str, gw: Option<&str>, oif: u32) -> ObservedRoute {
        ObservedRoute {
            dst: dst.parse().unwrap(),
            gw: gw.map(|g| g.parse().unwrap()),
            table: TABLE_MAIN,
            oif: Some(oif),
        }
    }

    fn healthy() -> Observed {
        Observed {
            container: Some(LinkState {
                index: 2,
                kind: "veth".into(),
                mac: "AA:BB:CC:00:00:02".into(),
                addrs: vec!["10.77.1.5/24".parse().unwrap()],
                routes: vec![
                    route("10.77.1.1/32", None, 2),
                    route("0.0.0.0/0", Some("10.77.1.1"), 2),
                ],
            }),
            host: Some(LinkState {
                index: 40,
                kind: "veth".into(),
                mac: "aa:bb:cc:00:00:01".into(),
                addrs: vec!["10.77.1.1/32".parse().unwrap()],
                routes: vec![route("10.77.1.5/32", None, 40)],
            }),
        }
    }

    fn expected() -> Expected {
        Expected::from_prev(&prev(), "eth0", "/var/run/netns/p").unwrap()
    }

    #[test]
    fn reads_the_container_entry_and_the_host_end_before_it() {
        let e = expected();
        assert_eq!(e.mac, "aa:bb:cc:00:00:02");
        assert_eq!(e.addrs, vec!["10.77.1.5/24".parse::<IpNet>().unwrap()]);
        assert_eq!(
            e.host,
            Some(("dp0123456789a".into(), "aa:bb:cc:00:00:01".into()))
        );
        assert_eq!(
            e.host_routes,
            vec!["10.77.1.5/32".parse::<IpNet>().unwrap()]
        );
        assert_eq!(e.routes[0].gw, None);
    }

    #[test]
    fn sandbox_and_name_must_both_match() {
        for (ifname, netns) in [("eth1", "/var/run/netns/p"), ("eth0", "/var/run/netns/q")] {
            let err = Expected::from_prev(&prev(), ifname, netns).unwrap_err();
            assert_eq!(err.to_cni(false).code, 163);
        }
    }

    #[test]
    fn healthy_passes_and_extras_are_tolerated() {
        assert_eq!(compare(&expected(), &healthy()), Vec::<String>::new());
        let mut more = healthy();
        let c = more.container.as_mut().unwrap();
        c.addrs.push("10.99.0.1/32".parse().unwrap());
        c.routes.push(route("192.0.2.0/24", Some("10.77.1.1"), 2));
        assert!(compare(&expected(), &more).is_empty());
    }

    #[test]
    fn every_difference_is_named() {
        let mut broken = healthy();
        let c = broken.container.as_mut().unwrap();
        c.kind = "dummy".into();
        c.mac = "aa:bb:cc:00:00:99".into();
        c.addrs.clear();
        c.routes.retain(|r| r.dst.prefix_len() != 0);
        broken.host.as_mut().unwrap().routes.clear();
        let problems = compare(&expected(), &broken);
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(problems[0].contains("not a veth"));
        assert!(problems[1].contains("has MAC aa:bb:cc:00:00:99"));
        assert!(problems[2].contains("lacks address 10.77.1.5/24"));
        assert!(problems[3].contains("lacks route 0.0.0.0/0"));
        assert!(problems[4].contains("10.77.1.5/32 dev dp0123456789a"));

        let gone = Observed::default();
        let problems = compare(&expected(), &gone);
        assert_eq!(
            problems,
            vec![
                "interface eth0 is missing from the netns".to_string(),
                "host interface dp0123456789a is missing".to_string()
            ]
        );
    }

    #[test]
    fn an_explicit_route_gateway_must_match() {
        let mut p = prev();
        p.routes[0].gw = Some("10.77.1.254".parse().unwrap());
        let e = Expected::from_prev(&p, "eth0", "/var/run/netns/p").unwrap();
        let problems = compare(&e, &healthy());
        assert_eq!(
            problems,
            vec!["the netns lacks route 0.0.0.0/0 via 10.77.1.254"]
        );
    }
}
