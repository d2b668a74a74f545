//! Identifier checks applied before a value touches a ledger key, a path or a delegate's
//! environment (reference/cni-spec.md §2.9). The plugin checks the same rules; dipamd does not
//! trust that it did (any local root process can speak to the socket).

use crate::error::ShimError;

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the rule libcni applies to container IDs and network names.
fn is_valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

pub fn network_name(s: &str) -> Result<(), ShimError> {
    if s.is_empty() {
        return Err(ShimError::Config {
            msg: "missing network name".into(),
            details: "the network config needs a \"name\"".into(),
        });
    }
    if !is_valid_name(s) {
        return Err(ShimError::Config {
            msg: format!("invalid characters found in network name: {s}"),
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
    if !is_valid_name(s) {
        return Err(ShimError::BadEnv(format!(
            "invalid characters in containerID: {s}"
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
    if s.len() > 15
        || s == "."
        || s == ".."
        || s.chars().any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(ShimError::BadEnv(format!("invalid interface name: {s:?}")));
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
}
