//! dipamd's own attachment keys: the one place that names them and reserves them.
//!
//! dipamd holds addresses for itself under container IDs it makes up: the agent's (router,
//! health, ingress) and the warm pool's entries. A runtime's ADD under one of them would be
//! answered with dipamd's address (two holders for one IP), and its DEL would release an
//! address the agent or a pod still uses while `dipamctl agent list` says ready. So every
//! container ID dipamd makes for itself starts with [`PREFIX`], is built only here, and every
//! runtime ADD, CHECK and DEL whose container ID starts with [`PREFIX`] is refused
//! ([`refuse_runtime`], called first by each CNI handler), whether or not its family is known
//! to this build: a family added later is reserved the day it is built here, and an ID of a
//! family this build does not know (a newer dipamd's) is refused too.
//!
//! The rule is by container ID, not (container ID, ifname): azure-vnet-ipam keys its
//! reservations by container ID alone, so `dipam-router-ipv4-<node>` with any ifname would
//! reach the router's address. Runtimes never make such IDs: containerd, CRI-O and podman
//! use 64 hexadecimal digits.

/// Every container ID dipamd makes for itself starts with this.
pub const PREFIX: &str = "dipam-";
/// The warm pool's entries: `dipam-pool-<node>-<n>`.
pub const POOL_PREFIX: &str = "dipam-pool-";

/// The roles dipamd can hold an address for (agent/): their keys are made here.
pub const ROLES: [&str; 3] = ["router", "health", "ingress"];

/// The families of dipamd's own keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Internal {
    /// An agent address: `dipam-<role>-<family>-<node>`, ifname `<role>`.
    Agent { role: String },
    /// A warm-pool entry: `dipam-pool-<node>-<n>`, ifname `eth0`.
    Pool,
    /// Under [`PREFIX`] but of no family this build makes (a newer dipamd's, or a made-up
    /// one): reserved all the same.
    Unknown,
}

impl std::fmt::Display for Internal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Agent { role } => write!(f, "the agent's {role} address"),
            Self::Pool => f.write_str("a warm-pool entry"),
            Self::Unknown => f.write_str("dipamd's own addresses"),
        }
    }
}

/// The container ID of the agent's `role` address of `family` ("ipv4", "ipv6") on `node`.
pub fn agent_id(role: &str, family: &str, node: &str) -> String {
    format!("{PREFIX}{role}-{family}-{node}")
}

/// The container ID of the warm pool's entry `n` on `node`.
pub fn pool_id(node: &str, n: u64) -> String {
    format!("{POOL_PREFIX}{node}-{n}")
}

/// The family of one of dipamd's own container IDs; `None` for any other ID.
pub fn internal(container_id: &str) -> Option<Internal> {
    let rest = container_id.strip_prefix(PREFIX)?;
    if container_id.starts_with(POOL_PREFIX) {
        return Some(Internal::Pool);
    }
    let agent = ROLES.iter().find(|r| {
        rest.strip_prefix(**r)
            .and_then(|t| t.strip_prefix('-'))
            .is_some_and(|t| t.starts_with("ipv4-") || t.starts_with("ipv6-"))
    });
    Some(match agent {
        Some(role) => Internal::Agent {
            role: (*role).to_owned(),
        },
        None => Internal::Unknown,
    })
}

/// A runtime's ADD, CHECK or DEL of one of dipamd's own keys; `ShimError::Reserved` once it
/// crosses into the error boundary (error.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub command: String,
    pub container_id: String,
    pub family: Internal,
}

/// Refuses a runtime's ADD, CHECK or DEL (`command`) of one of dipamd's own keys (code 4:
/// the CNI_CONTAINERID a runtime may not use). dipamd's own operations on these keys do not
/// come through the CNI handlers.
pub fn refuse_runtime(command: &str, container_id: &str) -> Result<(), Reserved> {
    match internal(container_id) {
        None => Ok(()),
        Some(family) => Err(Reserved {
            command: command.to_owned(),
            container_id: container_id.to_owned(),
            family,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_dipamd_makes_is_refused_to_a_runtime() {
        for role in ROLES {
            for fam in ["ipv4", "ipv6"] {
                let id = agent_id(role, fam, "node-1.example");
                assert!(crate::validate::container_id(&id).is_ok(), "{id}");
                assert_eq!(internal(&id), Some(Internal::Agent { role: role.into() }));
                for cmd in ["ADD", "CHECK", "DEL"] {
                    assert!(refuse_runtime(cmd, &id).is_err(), "{cmd} {id}");
                }
            }
        }
        let p = pool_id("n1", 7);
        assert_eq!(p, "dipam-pool-n1-7");
        assert_eq!(internal(&p), Some(Internal::Pool));
        assert!(refuse_runtime("DEL", &p).is_err());
        // A family this build does not make is reserved too.
        assert_eq!(internal("dipam-egress-ipv4-n1"), Some(Internal::Unknown));
        assert!(refuse_runtime("ADD", "dipam-x").is_err());
        // No agent role can be mistaken for the pool's prefix.
        assert!(!ROLES.contains(&"pool"));
    }

    #[test]
    fn runtime_ids_pass() {
        for id in [
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "pod-1",
            "dipam",
            "Dipam-router-ipv4-n1",
            "my-dipam-pod",
            "cilium-ingress-node1",
        ] {
            assert_eq!(internal(id), None, "{id}");
            assert!(refuse_runtime("ADD", id).is_ok(), "{id}");
        }
    }

    #[test]
    fn refusal_is_code_4_and_names_the_family() {
        let e = crate::error::ShimError::from(
            refuse_runtime("ADD", &agent_id("router", "ipv4", "n1")).unwrap_err(),
        );
        let (code, details) = e.code_and_details();
        assert_eq!(code, 4);
        let msg = e.to_string();
        assert!(msg.contains("dipam-router-ipv4-n1"), "{msg}");
        assert!(msg.contains("router"), "{msg}");
        assert!(details.contains(PREFIX), "{details}");
    }
}
