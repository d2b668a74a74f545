//! Which addresses host-local hands out, from its config: the size of a network's range per
//! family, for `dipamctl status` and the range metrics ("5/253 allocated").
//!
//! The rule is host-local's own (containernetworking/plugins 1.1.1, the version Debian 12
//! ships; `plugins/ipam/host-local/backend/allocator/range.go` `Range.Canonicalize` and
//! `allocator.go` `RangeIter.Next`, docs/sources.md §7.3), and the lifecycle tests check it
//! against the real binary by filling a range:
//!
//! - `ranges` is a list of range sets; the legacy single range (`subnet`, `rangeStart`,
//!   `rangeEnd`, `gateway` beside `type`) is one more set, put first (`config.go`).
//! - a range's subnet must be a network address (no host bits) and larger than a /31 (IPv4)
//!   or /127 (IPv6); otherwise host-local refuses the config, and so the size is unknown here.
//! - `rangeStart` defaults to the subnet's address + 1; `rangeEnd` to its last address, less
//!   one for IPv4 (the broadcast). Both are inclusive.
//! - `gateway` defaults to the subnet's address + 1; the iterator skips it wherever it falls
//!   in [rangeStart, rangeEnd].
//!
//! So a /24 with nothing else set hands out .2 to .254: 253 addresses.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

/// One range host-local allocates from, canonicalized as host-local does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// Whether host-local may hand out `ip` from this range.
    pub fn hands_out(&self, ip: IpAddr) -> bool {
        ip != self.gateway && self.start <= ip && ip <= self.end && same_family(ip, self.start)
    }

    /// How many addresses host-local hands out from it.
    pub fn size(&self) -> u128 {
        let span = num(self.end) - num(self.start) + 1;
        if self.start <= self.gateway && self.gateway <= self.end {
            span - 1
        } else {
            span
        }
    }

    pub fn family(&self) -> Family {
        Family::of(self.start)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The name status and metrics use: `ipv4` or `ipv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// Every range of a host-local config (the `ipam` object host-local receives).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ranges(pub Vec<Range>);

impl Ranges {
    /// The families the ranges cover, in order (IPv4 first).
    pub fn families(&self) -> Vec<Family> {
        let mut f: Vec<Family> = self.0.iter().map(Range::family).collect();
        f.sort();
        f.dedup();
        f
    }

    /// The addresses host-local hands out in `family`.
    pub fn size(&self, family: Family) -> u128 {
        self.0
            .iter()
            .filter(|r| r.family() == family)
            .map(Range::size)
            .sum()
    }

    pub fn hands_out(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|r| r.hands_out(ip))
    }

    /// The ranges of `family` as people write them: `10.1.0.2-10.1.0.254`, with the gateway
    /// when it falls inside (`, gateway 10.1.0.1 excluded`).
    pub fn describe(&self, family: Family) -> Vec<String> {
        self.0
            .iter()
            .filter(|r| r.family() == family)
            .map(|r| {
                let first = if r.start == r.gateway {
                    next(r.start)
                } else {
                    Some(r.start)
                };
                let last = if r.end == r.gateway {
                    prev(r.end)
                } else {
                    Some(r.end)
                };
                let (Some(first), Some(last)) = (first, last) else {
                    return format!("{}-{}", r.start, r.end);
                };
                if r.start < r.gateway && r.gateway < r.end {
                    format!("{first}-{last} (gateway {} excluded)", r.gateway)
                } else {
                    format!("{first}-{last}")
                }
            })
            .collect()
    }
}

/// Why host-local would refuse its `ipam` object's ranges (its config.go).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangesError {
    #[error("host-local's `ranges` must be a list of lists of ranges")]
    NotLists,
    #[error("host-local's config names no range (`ranges` or `subnet`)")]
    NoRange,
    #[error("host-local's range set {0} is empty")]
    EmptySet(usize),
    #[error("host-local's range set {0}: {1}")]
    Range(usize, RangeError),
    #[error(
        "host-local's ranges {a}-{b} and {c}-{d} overlap",
        a = .0.0,
        b = .0.1,
        c = .1.0,
        d = .1.1
    )]
    Overlap((IpAddr, IpAddr), (IpAddr, IpAddr)),
}

/// Why host-local would refuse one range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("a range needs a `subnet`")]
    NoSubnet,
    #[error("subnet {0:?} is not a CIDR")]
    NotCidr(String),
    #[error("network {0} is too small to allocate from")]
    TooSmall(IpNet),
    #[error(
        "network {0} has host bits set (its network address is {network})",
        network = .0.network()
    )]
    HostBits(IpNet),
    #[error("{0} {1:?} is not an address")]
    NotAnAddress(&'static str, String),
    #[error("{0} {1} is not in network {2}")]
    Outside(&'static str, IpAddr, IpNet),
    #[error("rangeEnd {end} is before rangeStart {start}")]
    Backwards { start: IpAddr, end: IpAddr },
}

/// host-local's ranges from its `ipam` object, or why host-local would refuse them (then the
/// size is unknown: dipam never shows a number host-local would not stand behind).
pub fn host_local(ipam: &Value) -> Result<Ranges, RangesError> {
    // config.go: the legacy range, when it names a subnet, is the first range set.
    let mut sets: Vec<Vec<&Value>> = Vec::new();
    if ipam.get("subnet").is_some_and(|s| !s.is_null()) {
        sets.push(vec![ipam]);
    }
    if let Some(listed) = ipam.get("ranges").filter(|r| !r.is_null()) {
        let Some(listed) = listed.as_array() else {
            return Err(RangesError::NotLists);
        };
        for set in listed {
            let Some(set) = set.as_array() else {
                return Err(RangesError::NotLists);
            };
            sets.push(set.iter().collect());
        }
    }
    if sets.is_empty() {
        return Err(RangesError::NoRange);
    }
    let mut out = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        if set.is_empty() {
            return Err(RangesError::EmptySet(i));
        }
        for r in set {
            out.push(range(r).map_err(|e| RangesError::Range(i, e))?);
        }
    }
    // config.go refuses overlapping ranges, within a set and across sets.
    for (i, a) in out.iter().enumerate() {
        for b in &out[i + 1..] {
            if a.family() == b.family() && a.start <= b.end && b.start <= a.end {
                return Err(RangesError::Overlap((a.start, a.end), (b.start, b.end)));
            }
        }
    }
    Ok(Ranges(out))
}

/// One range, as `Range.Canonicalize` makes it.
fn range(r: &Value) -> Result<Range, RangeError> {
    let subnet = r
        .get("subnet")
        .and_then(Value::as_str)
        .ok_or(RangeError::NoSubnet)?;
    let net: IpNet = subnet
        .parse()
        .map_err(|_| RangeError::NotCidr(subnet.to_owned()))?;
    if net.prefix_len() > net.max_prefix_len().saturating_sub(2) {
        return Err(RangeError::TooSmall(net));
    }
    if net.addr() != net.network() {
        return Err(RangeError::HostBits(net));
    }
    let ip_at = |key: &'static str| -> Result<Option<IpAddr>, RangeError> {
        match r.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => {
                let ip: IpAddr = s
                    .parse()
                    .map_err(|_| RangeError::NotAnAddress(key, s.to_owned()))?;
                if !net.contains(&ip) {
                    return Err(RangeError::Outside(key, ip, net));
                }
                Ok(Some(ip))
            }
        }
    };
    let first = next(net.network()).ok_or(RangeError::TooSmall(net))?;
    let gateway = ip_at("gateway")?.unwrap_or(first);
    let start = ip_at("rangeStart")?.unwrap_or(first);
    let end = match ip_at("rangeEnd")? {
        Some(e) => e,
        None => match net {
            IpNet::V4(_) => prev(net.broadcast()).ok_or(RangeError::TooSmall(net))?,
            IpNet::V6(_) => net.broadcast(),
        },
    };
    if end < start {
        return Err(RangeError::Backwards { start, end });
    }
    Ok(Range {
        start,
        end,
        gateway,
    })
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn num(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v) => u128::from(u32::from(v)),
        IpAddr::V6(v) => u128::from(v),
    }
}

fn next(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v) => u32::from(v).checked_add(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(v) => u128::from(v).checked_add(1).map(|n| IpAddr::V6(n.into())),
    }
}

fn prev(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v) => u32::from(v).checked_sub(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(v) => u128::from(v).checked_sub(1).map(|n| IpAddr::V6(n.into())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn size(ipam: Value, family: Family) -> u128 {
        host_local(&ipam).unwrap().size(family)
    }

    /// Each case was run through Debian 12's /usr/lib/cni/host-local (1.1.1), filling the
    /// range: the size is how many ADDs succeeded before "no IP addresses available".
    #[test]
    fn sizes_match_host_local() {
        use Family::*;
        // A /24: .2-.254 (.1 is the default gateway, .255 the broadcast).
        assert_eq!(
            size(json!({"ranges": [[{"subnet": "10.1.0.0/24"}]]}), V4),
            253
        );
        // IPv6 keeps its last address: fd00::2, fd00::3.
        assert_eq!(size(json!({"ranges": [[{"subnet": "fd00::/126"}]]}), V6), 2);
        // A gateway outside the default range excludes nothing: .1-.6.
        assert_eq!(
            size(
                json!({"ranges": [[{"subnet": "10.9.1.0/29", "gateway": "10.9.1.7"}]]}),
                V4
            ),
            6
        );
        // An explicit range may take the network and broadcast addresses; the gateway is
        // still skipped: .0, .2-.7.
        assert_eq!(
            size(
                json!({"ranges": [[{"subnet": "10.9.2.0/29", "rangeStart": "10.9.2.0", "rangeEnd": "10.9.2.7"}]]}),
                V4
            ),
            7
        );
        // A /30: .1-.2 less the gateway.
        assert_eq!(
            size(json!({"ranges": [[{"subnet": "10.9.3.0/30"}]]}), V4),
            1
        );
        // The legacy single range counts as a first set, beside `ranges`.
        let both = json!({"subnet": "10.2.0.0/29", "rangeStart": "10.2.0.3",
            "ranges": [[{"subnet": "10.3.0.0/29"}], [{"subnet": "fd01::/120"}]]});
        let r = host_local(&both).unwrap();
        assert_eq!(r.size(V4), 4 + 5);
        assert_eq!(r.size(V6), 254);
        assert_eq!(r.families(), vec![V4, V6]);
        assert_eq!(
            r.describe(V4),
            vec![
                "10.2.0.3-10.2.0.6".to_owned(),
                "10.3.0.2-10.3.0.6".to_owned()
            ]
        );
        assert!(r.hands_out("10.3.0.6".parse().unwrap()));
        assert!(!r.hands_out("10.3.0.1".parse().unwrap()));
        assert!(!r.hands_out("10.3.0.7".parse().unwrap()));
        let mid =
            host_local(&json!({"ranges": [[{"subnet": "10.4.0.0/29", "gateway": "10.4.0.3"}]]}))
                .unwrap();
        assert_eq!(
            mid.describe(V4),
            vec!["10.4.0.1-10.4.0.6 (gateway 10.4.0.3 excluded)".to_owned()]
        );
        // A /64 is counted exactly.
        assert_eq!(
            size(json!({"ranges": [[{"subnet": "fd02::/64"}]]}), V6),
            (1u128 << 64) - 2
        );
    }

    #[test]
    fn configs_host_local_refuses_have_no_size() {
        for (ipam, why) in [
            (
                json!({"ranges": [[{"subnet": "10.9.0.5/29"}]]}),
                "host bits",
            ),
            (
                json!({"ranges": [[{"subnet": "10.9.0.0/31"}]]}),
                "too small",
            ),
            (json!({"type": "host-local"}), "no range"),
            (
                json!({"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.8.0.1"}]]}),
                "not in network",
            ),
            (
                json!({"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "10.9.0.0/25"}]]}),
                "overlap",
            ),
            (json!({"ranges": "10.0.0.0/8"}), "list of lists"),
        ] {
            let e = host_local(&ipam).unwrap_err().to_string();
            assert!(e.contains(why), "{ipam}: {e}");
        }
    }
}
