//! Names of what the datapath creates on the host, derived from the attachment alone.
//!
//! The host end of a pod's veth is named from (network, container ID, ifname), the key every
//! CNI operation carries (spec §2: "the tuple uniquely identifies an attachment"). DEL finds
//! the link again from the same three values, even with no prevResult, no netns and no state
//! of its own; ptp instead picks a random name and needs the netns to find its peer.

use sha2::{Digest, Sha256};

/// The prefix every dipam host veth carries, so that `ip link` shows whose they are.
pub const HOST_PREFIX: &str = "dp";

/// The host-side veth name: "dp" + the first 11 hex digits of SHA-256 over the attachment key,
/// 13 bytes in all (Linux allows 15). 44 bits make an accidental collision between two live
/// attachments on one node vanishingly unlikely (about 1 in 10^7 with 1000 pods).
pub fn host_ifname(network: &str, container_id: &str, ifname: &str) -> String {
    let mut h = Sha256::new();
    // NUL separators: ("ab","c") and ("a","bc") must not hash alike.
    for part in [network, container_id, ifname] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let hex: String = h
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{HOST_PREFIX}{}", &hex[..11])
}

/// The alias (`ip link` shows it as "alias ...") set on the host veth: which attachment it
/// belongs to, for operators; IFALIASZ allows 255 bytes, container IDs are 64.
pub fn host_alias(network: &str, container_id: &str, ifname: &str) -> String {
    let alias = format!("dipam {network} {container_id} {ifname}");
    alias.chars().take(255).collect()
}

/// The alias of a host veth retired by DEL (kernel::retire_host_veth): the retired prefix
/// dipamd's sweep looks for, then the attachment, for operators.
pub fn retired_alias(network: &str, container_id: &str, ifname: &str) -> String {
    let alias = format!(
        "{}{network} {container_id} {ifname}",
        dipam_proto::retired::ALIAS_PREFIX
    );
    alias.chars().take(255).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_short_and_distinct() {
        let a = host_ifname("podnet", "c1", "eth0");
        assert_eq!(a, host_ifname("podnet", "c1", "eth0"), "stable");
        assert_eq!(a.len(), 13);
        assert!(a.starts_with("dp"));
        assert!(a[2..].chars().all(|c| c.is_ascii_hexdigit()));
        // Each part of the key matters, and parts do not run into each other.
        for other in [
            host_ifname("podnet2", "c1", "eth0"),
            host_ifname("podnet", "c2", "eth0"),
            host_ifname("podnet", "c1", "eth1"),
            host_ifname("podnetc", "1", "eth0"),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn known_value() {
        // Pinned: a change would orphan every host veth of running pods at upgrade (their DEL
        // would look for a different name).
        assert_eq!(host_ifname("podnet", "c1", "eth0"), "dp5426cf442a8");
    }

    #[test]
    fn alias_names_the_attachment() {
        assert_eq!(host_alias("n", "c", "eth0"), "dipam n c eth0");
        assert_eq!(host_alias(&"x".repeat(300), "c", "eth0").len(), 255);
        let retired = retired_alias("n", "c", "eth0");
        assert!(retired.starts_with(dipam_proto::retired::ALIAS_PREFIX));
        assert!(retired.ends_with("n c eth0"));
        assert_eq!(retired_alias(&"x".repeat(300), "c", "eth0").len(), 255);
    }
}
