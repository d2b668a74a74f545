//! Identifier checks applied before a value touches a ledger key, a path or a delegate's
//! environment (docs/sources.md §2.9). The plugin checks the same rules; dipamd does not
//! trust that it did (any local root process can speak to the socket).

use crate::l1_leaves::error::ShimError;

/// How much of a rejected value an error quotes. Errors travel back in gRPC status messages
/// (HTTP/2 headers) and CNI error JSON: a 1 MiB value echoed there broke the client, and
/// anything longer than this is no help to a reader anyway.
const SHOWN: usize = 64;

/// `s` quoted for an error message: at most `SHOWN` (64) characters, then its length.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

/// At most `limit` bytes of `s`, cut at a character boundary.
pub fn clip(s: &str, limit: usize) -> String {
    let mut end = s.len().min(limit);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Limits per request field. The CNI values come from the runtime's environment: a
/// container ID is 64 hex digits in practice, a netns a path (PATH_MAX), CNI_ARGS a few
/// key=value pairs. The config is bounded by the plugin's own 1 MiB limit.
pub mod limits {
    pub const CONTAINER_ID: usize = 1024;
    pub const IFNAME: usize = dipam_proto::cni::names::IFNAME_MAX;
    pub const NETNS: usize = 4096;
    pub const CNI_ARGS: usize = 64 << 10;
    pub const CNI_PATH: usize = 64 << 10;
    pub const REQUEST_ID: usize = 256;
    pub const CONFIG: usize = 1 << 20;
    /// A GC's config: its valid list names every attachment of the node (access.rs).
    pub const GC_CONFIG: usize = 16 << 20;
    pub const NETWORK: usize = 1024;
    /// Agent roles, owners and other short names in the operator and agent APIs.
    pub const NAME: usize = 256;
}

/// Refuses a field beyond its limit before it is looked at, stored or echoed.
pub fn bounded(what: &'static str, value: &[u8], limit: usize, code: u32) -> Result<(), ShimError> {
    if value.len() > limit {
        return Err(ShimError::TooLarge {
            what,
            len: value.len(),
            limit,
            code,
        });
    }
    Ok(())
}

/// The size checks of a CNI request, all before any other use of its values.
pub fn request_sizes(req: &dipam_proto::v1::CniRequest) -> Result<(), ShimError> {
    bounded(
        "CNI_CONTAINERID",
        req.container_id.as_bytes(),
        limits::CONTAINER_ID,
        4,
    )?;
    bounded("CNI_IFNAME", req.ifname.as_bytes(), limits::IFNAME, 4)?;
    bounded("CNI_NETNS", req.netns.as_bytes(), limits::NETNS, 4)?;
    bounded("CNI_ARGS", req.cni_args.as_bytes(), limits::CNI_ARGS, 4)?;
    bounded("CNI_PATH", req.cni_path.as_bytes(), limits::CNI_PATH, 4)?;
    bounded(
        "request id",
        req.request_id.as_bytes(),
        limits::REQUEST_ID,
        4,
    )?;
    let config = if req.command == "GC" {
        limits::GC_CONFIG
    } else {
        limits::CONFIG
    };
    bounded("the network config", &req.stdin, config, 7)?;
    Ok(())
}

/// libcni's rule for container IDs and network names, shared with the plugin.
use dipam_proto::cni::names::is_valid_name;

pub fn network_name(s: &str) -> Result<(), ShimError> {
    if s.is_empty() {
        return Err(ShimError::Config {
            msg: "missing network name".into(),
            details: "the network config needs a \"name\"".into(),
        });
    }
    bounded("the network name", s.as_bytes(), limits::NETWORK, 7)?;
    if !is_valid_name(s) {
        return Err(ShimError::Config {
            msg: format!("invalid characters found in network name: {}", shown(s)),
            details: "allowed: letters, digits, '_', '.', '-', starting with a letter or digit"
                .into(),
        });
    }
    Ok(())
}

pub fn container_id(s: &str) -> Result<(), ShimError> {
    if s.is_empty() {
        return Err(ShimError::BadEnv(
            "required env variables [CNI_CONTAINERID] missing".into(),
        ));
    }
    bounded("CNI_CONTAINERID", s.as_bytes(), limits::CONTAINER_ID, 4)?;
    if !is_valid_name(s) {
        return Err(ShimError::BadEnv(format!(
            "invalid characters in containerID: {}",
            shown(s)
        )));
    }
    Ok(())
}

pub fn ifname(s: &str) -> Result<(), ShimError> {
    if s.is_empty() {
        return Err(ShimError::BadEnv(
            "required env variables [CNI_IFNAME] missing".into(),
        ));
    }
    if dipam_proto::cni::names::check_ifname(s).is_err() {
        return Err(ShimError::BadEnv(format!(
            "invalid interface name: {}",
            shown(s)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(container_id("ABC_def.1-2").is_ok());
        for bad in ["", "-a", "a b", "a/b", "a\0b", "é"] {
            assert!(container_id(bad).is_err(), "{bad:?}");
            assert!(network_name(bad).is_err(), "{bad:?}");
        }
        assert!(ifname("eth0").is_ok());
        for bad in ["", ".", "..", "a/b", "a:b", "a b", "sixteen-chars-xx"] {
            assert!(ifname(bad).is_err(), "{bad:?}");
        }
    }

    /// A huge value is refused by its size and never quoted whole.
    #[test]
    fn huge_values_are_refused_without_echo() {
        let huge = "x".repeat(1 << 20);
        for e in [
            container_id(&huge).unwrap_err(),
            network_name(&huge).unwrap_err(),
            ifname(&huge).unwrap_err(),
        ] {
            assert!(e.to_string().len() < 200, "{}", e.to_string().len());
            let (_, details) = e.code_and_details();
            assert!(details.len() < 400);
        }
        assert!(matches!(
            container_id(&huge),
            Err(ShimError::TooLarge { code: 4, .. })
        ));
        let bad = format!("-{}", "y".repeat(1000));
        let e = container_id(&bad).unwrap_err().to_string();
        assert!(e.contains("(1001 bytes)") && e.len() < 200, "{e}");
        assert_eq!(
            shown("é".repeat(100).as_str())
                .chars()
                .filter(|c| *c == 'é')
                .count(),
            64
        );
    }
}
