//! Agent claims: named address requests beyond the CFP's three roles (an egress IP per policy,
//! a static node IP, an ingress IP per listener), with the same guarantees as the roles.
//!
//! A claim is a name (unique per node and, since dipamd manages one agent network, per
//! network), a family, an optional requested IP and labels. Its spec is kept in the ledger's
//! settings (`agent/claim/<name>`, JSON) *before* anything is allocated: a crash at any point
//! after the spec is written is finished by the next reconcile pass, and a crash before it
//! leaves nothing. Its address is a ledger record owned by `agent:claim:<name>` under dipamd's
//! own key `dipam-claim-<name>-<node>` (keys/), so GC protection, the pod-conflict check (156),
//! CHECK-based restore and re-establishment apply to it exactly as to a role's.
//!
//! Every check here runs before the request touches the ledger, a log span or an error
//! message: lengths first (RESOURCE_EXHAUSTED, nothing echoed), then syntax (INVALID_ARGUMENT,
//! at most 64 characters quoted).

use std::{collections::BTreeMap, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::{Family, ROLES};
use crate::{
    l1_leaves::error::ShimError,
    l1_leaves::validate::{bounded, shown},
};

/// Where claim specs live among the ledger's settings.
pub const CLAIM_SETTING: &str = "agent/claim/";

/// Limits of the Claim request (docs/cfp.md §7.6). A name is a DNS label (RFC 1123): it
/// becomes part of a container ID, and agents name addresses after Kubernetes objects.
pub mod limits {
    pub const NAME: usize = 63;
    pub const LABELS: usize = 16;
    pub const LABEL_KEY: usize = 63;
    pub const LABEL_VALUE: usize = 256;
    /// Claims per node: each is a delegate reservation and a CHECK per reconcile pass.
    pub const CLAIMS: usize = 64;
    /// An IP address in text is at most 45 bytes (IPv4-mapped IPv6).
    pub const IP: usize = 64;
}

/// One claim as kept in the ledger's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimSpec {
    pub family: String,
    /// The requested address; `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl ClaimSpec {
    pub fn family(&self) -> Family {
        Family::parse(&self.family).unwrap_or(Family::V4)
    }
}

/// A claim request after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    pub spec: ClaimSpec,
}

/// The predefined claims' names: `<role>-<family>` (router-ipv4, ...), and the roles
/// themselves, which would read as one.
pub fn reserved(name: &str) -> bool {
    ROLES.iter().any(|r| {
        name == *r
            || name
                .strip_prefix(r)
                .and_then(|t| t.strip_prefix('-'))
                .is_some_and(|f| Family::parse(f).is_some())
    })
}

/// Checks a claim's name: bounded, a DNS label, not a predefined claim's.
pub fn name(name: &str) -> Result<(), ShimError> {
    bounded("the claim name", name.as_bytes(), limits::NAME, 7)?;
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(ShimError::Invalid {
            msg: format!("invalid claim name {}", shown(name)),
            details: "a claim name is 1-63 characters of a-z, 0-9 and '-', starting and \
                      ending with a letter or digit (a DNS label)"
                .into(),
        });
    }
    if reserved(name) {
        return Err(ShimError::Invalid {
            msg: format!("claim name {name:?} is reserved"),
            details: format!(
                "the roles ({}) and \"<role>-ipv4\"/\"<role>-ipv6\" are the predefined claims; \
                 enable a role with Allocate (dipamctl agent allocate ROLE) or --agent-roles",
                ROLES.join(", ")
            ),
        });
    }
    Ok(())
}

/// Validates a Claim request. `family` is the proto enum's value (0: unspecified).
pub fn validate(
    raw_name: &str,
    family: i32,
    ip: &str,
    labels: &std::collections::HashMap<String, String>,
) -> Result<Claim, ShimError> {
    name(raw_name)?;
    bounded("the requested IP", ip.as_bytes(), limits::IP, 7)?;
    if labels.len() > limits::LABELS {
        return Err(ShimError::TooMany {
            what: "labels",
            count: labels.len(),
            limit: limits::LABELS,
        });
    }
    let mut kept = BTreeMap::new();
    for (k, v) in labels {
        bounded("a label key", k.as_bytes(), limits::LABEL_KEY, 7)?;
        bounded("a label value", v.as_bytes(), limits::LABEL_VALUE, 7)?;
        let key_ok = k
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
            && k.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && k.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
        if !key_ok {
            return Err(ShimError::Invalid {
                msg: format!("invalid label key {}", shown(k)),
                details: "a label key is 1-63 characters of A-Z, a-z, 0-9, '-', '_', '.' and \
                          '/', starting and ending with a letter or digit"
                    .into(),
            });
        }
        if v.chars().any(char::is_control) {
            return Err(ShimError::Invalid {
                msg: format!("label {k:?} has a control character in its value"),
                details: "label values are printable text of at most 256 bytes".into(),
            });
        }
        kept.insert(k.clone(), v.clone());
    }
    let requested = if ip.is_empty() {
        None
    } else {
        let parsed: IpAddr = ip.parse().map_err(|_| ShimError::Invalid {
            msg: format!("invalid requested IP {}", shown(ip)),
            details: "give one address without a prefix length, e.g. 10.0.0.5 or fd00::5, or \
                      leave it empty for any"
                .into(),
        })?;
        if parsed.is_unspecified() || parsed.is_multicast() || parsed.is_loopback() {
            return Err(ShimError::Invalid {
                msg: format!("requested IP {parsed} cannot be claimed"),
                details: "an unspecified, loopback or multicast address is never a delegate's \
                          to hand out"
                    .into(),
            });
        }
        Some(parsed)
    };
    use dipam_proto::v1::AddressFamily;
    let fam = match AddressFamily::try_from(family) {
        Ok(AddressFamily::Ipv4) => Family::V4,
        Ok(AddressFamily::Ipv6) => Family::V6,
        Ok(AddressFamily::Unspecified) => match requested {
            Some(IpAddr::V6(_)) => Family::V6,
            _ => Family::V4,
        },
        Err(_) => {
            return Err(ShimError::Invalid {
                msg: format!("unknown address family {family}"),
                details: "ADDRESS_FAMILY_IPV4 (1) or ADDRESS_FAMILY_IPV6 (2), or unspecified \
                          (0) for the requested IP's family, else IPv4"
                    .into(),
            });
        }
    };
    if let Some(ip) = requested
        && !fam.matches(&ip)
    {
        return Err(ShimError::Invalid {
            msg: format!("requested IP {ip} is not {}", fam.as_str()),
            details: "the requested IP must be of the claim's family".into(),
        });
    }
    Ok(Claim {
        name: raw_name.to_owned(),
        spec: ClaimSpec {
            family: fam.as_str().to_owned(),
            ip: requested,
            labels: kept,
        },
    })
}

/// Every claim spec in the ledger's settings, by name. A spec dipamd cannot read (written by
/// a newer version) is skipped with a warning rather than released: its address stays held.
pub fn decode_all(settings: Vec<(String, String)>) -> BTreeMap<String, ClaimSpec> {
    let mut out = BTreeMap::new();
    for (key, value) in settings {
        let name = key.trim_start_matches(CLAIM_SETTING).to_owned();
        match serde_json::from_str::<ClaimSpec>(&value) {
            Ok(spec) => {
                out.insert(name, spec);
            }
            Err(e) => tracing::warn!(claim = %name, error = %e, "unreadable claim spec; skipped"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::l1_leaves::error::ShimError;

    fn labels(n: usize) -> HashMap<String, String> {
        (0..n).map(|i| (format!("k{i}"), "v".into())).collect()
    }

    #[test]
    fn names() {
        for ok in ["egress-1", "a", "ingress-listener-443", "x9"] {
            assert!(name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "Upper", "a_b", "a.b", "a/b", "é"] {
            assert!(matches!(name(bad), Err(ShimError::Invalid { .. })), "{bad}");
        }
        for r in ["router", "router-ipv4", "health-ipv6", "ingress"] {
            assert!(matches!(name(r), Err(ShimError::Invalid { .. })), "{r}");
        }
        // Too long is RESOURCE_EXHAUSTED's, and the value is never echoed.
        let long = "a".repeat(1 << 20);
        let e = name(&long).unwrap_err();
        assert!(matches!(e, ShimError::TooLarge { .. }));
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn families_ips_and_labels() {
        let c = validate("e", 0, "fd00::5", &HashMap::new()).unwrap();
        assert_eq!(c.spec.family, "ipv6");
        let c = validate("e", 0, "", &HashMap::new()).unwrap();
        assert_eq!((c.spec.family.as_str(), c.spec.ip), ("ipv4", None));
        assert!(matches!(
            validate("e", 1, "fd00::5", &HashMap::new()),
            Err(ShimError::Invalid { .. })
        ));
        assert!(matches!(
            validate("e", 9, "", &HashMap::new()),
            Err(ShimError::Invalid { .. })
        ));
        for bad in ["10.0.0.1/24", "x", "0.0.0.0", "127.0.0.1", "224.0.0.1"] {
            assert!(
                matches!(
                    validate("e", 0, bad, &HashMap::new()),
                    Err(ShimError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            validate("e", 0, &"1".repeat(100), &HashMap::new()),
            Err(ShimError::TooLarge { .. })
        ));
        assert!(validate("e", 0, "", &labels(16)).is_ok());
        assert!(matches!(
            validate("e", 0, "", &labels(17)),
            Err(ShimError::TooMany { .. })
        ));
        let mut l = HashMap::new();
        l.insert("bad key".into(), "v".into());
        assert!(matches!(
            validate("e", 0, "", &l),
            Err(ShimError::Invalid { .. })
        ));
        let mut l = HashMap::new();
        l.insert("k".into(), "a\nb".into());
        assert!(matches!(
            validate("e", 0, "", &l),
            Err(ShimError::Invalid { .. })
        ));
        let mut l = HashMap::new();
        l.insert("app.example/purpose".into(), "egress for ns/a".into());
        let c = validate("e", 2, "", &l).unwrap();
        assert_eq!(c.spec.labels.len(), 1);
        assert_eq!(c.spec.family, "ipv6");
    }

    #[test]
    fn specs_round_trip_and_unreadable_ones_are_skipped() {
        let spec = ClaimSpec {
            family: "ipv4".into(),
            ip: Some("10.0.0.5".parse().unwrap()),
            labels: BTreeMap::from([("a".into(), "b".into())]),
        };
        let all = decode_all(vec![
            (
                format!("{CLAIM_SETTING}x"),
                serde_json::to_string(&spec).unwrap(),
            ),
            (format!("{CLAIM_SETTING}y"), "{".into()),
        ]);
        assert_eq!(all.len(), 1);
        assert_eq!(all["x"], spec);
    }
}
