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

/// The prefix of a live dipam host veth's alias (`dipam <network> <container ID> <ifname>`).
pub const ALIAS_PREFIX: &str = "dipam ";

/// The longest alias dipam sets. The kernel takes up to IFALIASZ - 1 (255) bytes, but a
/// 255-byte alias sent through rtnetlink was refused with ERANGE (main-mode ADDs of container
/// IDs of 232+ characters failed with 162); the spec sets no limit on container IDs, so the
/// alias is kept well inside the limit instead.
pub const ALIAS_MAX: usize = 240;

/// How long a part of the alias may stay before it is shortened (the container ID and the
/// network get what the other parts leave, this much at least).
const PART_MIN: usize = 64;

/// `part` as is when it has at most `max` bytes, else its first bytes, `~` and 12 hex
/// digits of its SHA-256: still readable in `ip -d link`, still distinct per attachment.
fn shorten(part: &str, max: usize) -> String {
    if part.len() <= max {
        return part.to_owned();
    }
    let hash: String = Sha256::digest(part.as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut keep = max.saturating_sub(hash.len() + 1);
    while !part.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}~{hash}", &part[..keep])
}

/// `<prefix><network> <container ID> <ifname>` within [`ALIAS_MAX`] bytes: the container ID
/// (and, if it is very long, the network) shortened by [`shorten`] when the whole does not
/// fit. Only the prefix is ever parsed back (dipamd's teardown matches the retired prefix);
/// the rest is for operators.
fn alias(prefix: &str, network: &str, container_id: &str, ifname: &str) -> String {
    let full = format!("{prefix}{network} {container_id} {ifname}");
    if full.len() <= ALIAS_MAX {
        return full;
    }
    // Two spaces, the prefix and the ifname (at most 15 bytes) are fixed.
    let room = ALIAS_MAX.saturating_sub(prefix.len() + ifname.len() + 2);
    let network = shorten(network, room.saturating_sub(PART_MIN).max(PART_MIN));
    let container_id = shorten(container_id, room.saturating_sub(network.len()));
    let alias = format!("{prefix}{network} {container_id} {ifname}");
    // Unreachable with a valid ifname; never hand the kernel more than it takes.
    let mut end = alias.len().min(ALIAS_MAX);
    while !alias.is_char_boundary(end) {
        end -= 1;
    }
    alias[..end].to_owned()
}

/// The alias (`ip link` shows it as "alias ...") set on the host veth: which attachment it
/// belongs to, for operators (`dipam <network> <container ID> <ifname>`, a long container ID
/// shortened, see [`ALIAS_MAX`]).
pub fn host_alias(network: &str, container_id: &str, ifname: &str) -> String {
    alias(ALIAS_PREFIX, network, container_id, ifname)
}

/// The alias of a host veth retired by DEL (kernel::retire_host_veth): the retired prefix
/// dipamd's sweep looks for, then the attachment, for operators.
pub fn retired_alias(network: &str, container_id: &str, ifname: &str) -> String {
    alias(
        dipam_proto::retired::ALIAS_PREFIX,
        network,
        container_id,
        ifname,
    )
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
        let retired = retired_alias("n", "c", "eth0");
        assert!(retired.starts_with(dipam_proto::retired::ALIAS_PREFIX));
        assert!(retired.ends_with("n c eth0"));
        // A 64-character ID with a long network name is kept whole.
        let id64 = "f".repeat(64);
        let net = "n".repeat(100);
        assert_eq!(
            host_alias(&net, &id64, "eth0"),
            format!("dipam {net} {id64} eth0")
        );
    }

    /// Container IDs have no length limit in the spec: any alias stays within the kernel's,
    /// keeps its prefix, the start of each part and the ifname, and two long IDs that share
    /// their start still get different aliases.
    #[test]
    fn a_long_alias_is_shortened_readably() {
        for (net, id, ifname) in [
            ("podnet", "a".repeat(232), "eth0"),
            ("podnet", "a".repeat(5000), "eth0"),
            (&*"n".repeat(300), "c".repeat(300), "averylongname15"),
            ("net", "é".repeat(200), "eth0"),
        ] {
            for (alias, prefix) in [
                (host_alias(net, &id, ifname), "dipam "),
                (
                    retired_alias(net, &id, ifname),
                    dipam_proto::retired::ALIAS_PREFIX,
                ),
            ] {
                assert!(alias.len() <= ALIAS_MAX, "{}: {alias}", alias.len());
                assert!(alias.starts_with(prefix), "{alias}");
                assert!(alias.ends_with(&format!(" {ifname}")), "{alias}");
                let id_start: String = id.chars().take(20).collect();
                assert!(alias.contains(&id_start), "{alias}");
            }
        }
        let a = host_alias("podnet", &format!("{}1", "a".repeat(300)), "eth0");
        let b = host_alias("podnet", &format!("{}2", "a".repeat(300)), "eth0");
        assert_ne!(a, b);
    }
}
