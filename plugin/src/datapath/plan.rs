//! What to install for an IPAM result, computed without touching the kernel.
//!
//! The shape is the reference ptp plugin's (docs/sources.md §6: containernetworking/plugins `plugins/main/ptp/ptp.go`): a point-to-point
//! veth whose host end answers for the gateway, so that every packet of the pod goes through
//! the host's routing table.
//!
//! Container side, for each IP from the IPAM result:
//! - the address with its prefix, exactly as the IPAM gave it (CHECK compares it), but
//!   without the kernel's automatic prefix route (`IFA_F_NOPREFIXROUTE`): the other pods of
//!   the subnet are not on this link, only the host is;
//! - `gateway/32` (`/128`) on-link (scope link), so that the gateway is reachable;
//! - `subnet via gateway`, in place of the prefix route ptp deletes;
//! - then every route of the IPAM result, a route without `gw` going via the gateway of an IP
//!   of its family (spec §5 "Routes": "if omitted, a default gateway is assumed"). dipam adds
//!   no default route of its own: as with ptp, the IPAM config decides (host-local's `routes`).
//!
//! Host side: the gateway address as a /32 (/128) on the host end, and a /32 (/128) route to
//! each pod address through it.

use std::net::IpAddr;

use ipnet::IpNet;
use rscni_types::types::CNIResult;

use crate::error::PluginError;

/// RT_SCOPE_LINK: the destination is directly on this link.
pub const SCOPE_LINK: u8 = 253;
/// RT_TABLE_MAIN.
pub const TABLE_MAIN: u32 = 254;

/// One route to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    /// Preferred source address (ptp sets the pod's address on the routes it makes).
    pub src: Option<IpAddr>,
    /// RT_SCOPE_* (0 = universe).
    pub scope: u8,
    pub table: Option<u32>,
    pub priority: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// The gateway is this veth's other end (`RTNH_F_ONLINK`): the kernel need not find a
    /// route to it. Without it, a second interface of the pod on the same subnet, whose own
    /// gateway /32 replaces this one's, makes the routes via the gateway fail
    /// (ENETUNREACH) while the two are set up concurrently.
    pub onlink: bool,
}

impl RouteSpec {
    fn new(dst: IpNet) -> Self {
        Self {
            dst: dst.trunc(),
            gw: None,
            src: None,
            scope: 0,
            table: None,
            priority: None,
            mtu: None,
            advmss: None,
            onlink: false,
        }
    }

    /// `dst` directly on the link (`ip route add <dst> dev <link> scope link`).
    pub fn on_link(dst: IpNet) -> Self {
        let mut r = Self::new(dst);
        r.scope = SCOPE_LINK;
        r
    }

    /// A route is identified by destination and table: a second one replaces the first.
    fn same_slot(&self, other: &Self) -> bool {
        self.dst == other.dst
            && self.table.unwrap_or(TABLE_MAIN) == other.table.unwrap_or(TABLE_MAIN)
    }

    pub fn describe(&self) -> String {
        let mut s = format!("route {}", self.dst);
        if let Some(gw) = self.gw {
            s.push_str(&format!(" via {gw}"));
        }
        if let Some(t) = self.table.filter(|t| *t != TABLE_MAIN) {
            s.push_str(&format!(" table {t}"));
        }
        s
    }
}

/// Everything the datapath installs for one attachment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub container_addrs: Vec<IpNet>,
    pub container_routes: Vec<RouteSpec>,
    pub host_addrs: Vec<IpNet>,
    /// Routes to the pod's addresses (host prefixes) via the host end of the veth.
    pub host_routes: Vec<IpNet>,
}

/// `addr` as a host prefix (/32 or /128).
pub fn host_prefix(addr: IpAddr) -> IpNet {
    IpNet::from(addr)
}

fn push_route(routes: &mut Vec<RouteSpec>, r: RouteSpec) {
    match routes.iter_mut().find(|x| x.same_slot(&r)) {
        Some(slot) => *slot = r,
        None => routes.push(r),
    }
}

impl Plan {
    /// The plan for `ipam`, or why it cannot be applied (code 164).
    pub fn new(ipam: &CNIResult) -> Result<Self, PluginError> {
        if ipam.ips.is_empty() {
            return Err(PluginError::IpamResult(
                "the IPAM plugin returned no IP address; a main plugin needs at least one \
                 (spec §4: \"IPAM plugin returned missing IP config\" in ptp)"
                    .into(),
            ));
        }
        let mut plan = Self::default();
        for ip in &ipam.ips {
            let addr = ip.address.addr();
            let gw = ip.gateway.ok_or_else(|| {
                PluginError::IpamResult(format!(
                    "{} has no gateway: dipam routes the pod through the host end of its veth, \
                     which takes the gateway address (as ptp does). Set a gateway in the IPAM \
                     config (host-local uses the subnet's first address by default)",
                    ip.address
                ))
            })?;
            if gw.is_ipv4() != addr.is_ipv4() || gw == addr {
                return Err(PluginError::IpamResult(format!(
                    "gateway {gw} cannot serve address {}",
                    ip.address
                )));
            }
            plan.container_addrs.push(ip.address);
            let mut on_link = RouteSpec::on_link(host_prefix(gw));
            on_link.src = Some(addr);
            push_route(&mut plan.container_routes, on_link);
            if ip.address.prefix_len() < ip.address.max_prefix_len() {
                let mut subnet = RouteSpec::new(ip.address.trunc());
                subnet.gw = Some(gw);
                subnet.src = Some(addr);
                subnet.onlink = true;
                push_route(&mut plan.container_routes, subnet);
            }
            if !plan.host_addrs.contains(&host_prefix(gw)) {
                plan.host_addrs.push(host_prefix(gw));
            }
            if !plan.host_routes.contains(&host_prefix(addr)) {
                plan.host_routes.push(host_prefix(addr));
            }
        }
        for r in &ipam.routes {
            let v4 = r.dst.addr().is_ipv4();
            let gw = r.gw.or_else(|| {
                ipam.ips
                    .iter()
                    .find(|ip| ip.address.addr().is_ipv4() == v4)
                    .and_then(|ip| ip.gateway)
            });
            let Some(gw) = gw else {
                return Err(PluginError::IpamResult(format!(
                    "route {} has no gw and the IPAM result has no {} address with a gateway",
                    r.dst,
                    if v4 { "IPv4" } else { "IPv6" }
                )));
            };
            if gw.is_ipv4() != v4 {
                return Err(PluginError::IpamResult(format!(
                    "route {} has a gateway of the other family ({gw})",
                    r.dst
                )));
            }
            let mut spec = RouteSpec::new(r.dst);
            spec.gw = Some(gw);
            spec.scope = r.scope.and_then(|s| u8::try_from(s).ok()).unwrap_or(0);
            spec.table = r.table;
            spec.priority = r.priority;
            spec.mtu = r.mtu;
            spec.advmss = r.advmss;
            // A route via one of the pod's own gateways goes through its veth; any other
            // gateway must be reachable, and the kernel says so if it is not.
            spec.onlink = ipam.ips.iter().any(|ip| ip.gateway == Some(gw));
            // The IPAM's word wins over the routes derived above (e.g. its own subnet route).
            push_route(&mut plan.container_routes, spec);
        }
        Ok(plan)
    }

    pub fn has_ipv6(&self) -> bool {
        self.container_addrs.iter().any(|a| a.addr().is_ipv6())
    }

    pub fn has_ipv4(&self) -> bool {
        self.container_addrs.iter().any(|a| a.addr().is_ipv4())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(json: &str) -> CNIResult {
        serde_json::from_str(json).unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn host_local_result_becomes_the_ptp_shape() {
        let p = Plan::new(&ipam(
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.77.1.5/24","gateway":"10.77.1.1"}],
                "routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#,
        ))
        .unwrap();
        assert_eq!(p.container_addrs, vec![net("10.77.1.5/24")]);
        let routes: Vec<String> = p.container_routes.iter().map(RouteSpec::describe).collect();
        assert_eq!(
            routes,
            vec![
                "route 10.77.1.1/32",
                "route 10.77.1.0/24 via 10.77.1.1",
                "route 0.0.0.0/0 via 10.77.1.1"
            ]
        );
        assert_eq!(p.container_routes[0].scope, SCOPE_LINK);
        assert_eq!(
            p.container_routes[0].src,
            Some("10.77.1.5".parse().unwrap())
        );
        assert_eq!(p.host_addrs, vec![net("10.77.1.1/32")]);
        assert_eq!(p.host_routes, vec![net("10.77.1.5/32")]);
        assert!(p.has_ipv4() && !p.has_ipv6());
    }

    #[test]
    fn dual_stack_routes_pick_the_gateway_of_their_family() {
        let p = Plan::new(&ipam(
            r#"{"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"},
                       {"address":"fd77::2/64","gateway":"fd77::1"}],
                "routes":[{"dst":"::/0"},{"dst":"192.0.2.0/24","gw":"10.0.0.254","priority":7,"table":100}]}"#,
        ))
        .unwrap();
        let v6default = p
            .container_routes
            .iter()
            .find(|r| r.dst == net("::/0"))
            .unwrap();
        assert_eq!(v6default.gw, Some("fd77::1".parse().unwrap()));
        let extra = p
            .container_routes
            .iter()
            .find(|r| r.dst == net("192.0.2.0/24"))
            .unwrap();
        assert_eq!(
            (extra.gw, extra.priority, extra.table),
            (Some("10.0.0.254".parse().unwrap()), Some(7), Some(100))
        );
        assert_eq!(p.host_addrs, vec![net("10.0.0.1/32"), net("fd77::1/128")]);
        assert_eq!(p.host_routes, vec![net("10.0.0.2/32"), net("fd77::2/128")]);
        assert!(p.has_ipv6());
    }

    #[test]
    fn ipam_routes_replace_derived_ones_with_the_same_destination() {
        let p = Plan::new(&ipam(
            r#"{"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"}],
                "routes":[{"dst":"10.0.0.0/24","gw":"10.0.0.9"},{"dst":"10.0.0.77/24"}]}"#,
        ))
        .unwrap();
        let subnet: Vec<_> = p
            .container_routes
            .iter()
            .filter(|r| r.dst == net("10.0.0.0/24"))
            .collect();
        // One slot; the last word (a host-bits dst, truncated) wins.
        assert_eq!(subnet.len(), 1);
        assert_eq!(subnet[0].gw, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(subnet[0].src, None);
    }

    #[test]
    fn unusable_results_are_code_164() {
        for bad in [
            r#"{"ips":[]}"#,
            r#"{"ips":[{"address":"10.0.0.2/24"}]}"#,
            r#"{"ips":[{"address":"10.0.0.2/24","gateway":"fd00::1"}]}"#,
            r#"{"ips":[{"address":"10.0.0.2/24","gateway":"10.0.0.1"}],"routes":[{"dst":"::/0"}]}"#,
        ] {
            let e = Plan::new(&ipam(bad)).unwrap_err().to_cni(false);
            assert_eq!(e.code, 164, "{bad}: {e:?}");
        }
    }

    #[test]
    fn host_prefix_results_need_no_subnet_route() {
        let p = Plan::new(&ipam(
            r#"{"ips":[{"address":"10.9.9.9/32","gateway":"169.254.1.1"}]}"#,
        ))
        .unwrap();
        assert_eq!(p.container_routes.len(), 1);
        assert_eq!(p.container_routes[0].dst, net("169.254.1.1/32"));
    }
}
