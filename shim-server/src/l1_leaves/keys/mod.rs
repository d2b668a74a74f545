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
    /// An agent claim: `dipam-claim-<name>-<node>`, ifname `claim`.
    Claim,
    /// Under [`PREFIX`] but of no family this build makes (a newer dipamd's, or a made-up
    /// one): reserved all the same.
    Unknown,
}

impl std::fmt::Display for Internal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Agent { role } => write!(f, "the agent's {role} address"),
            Self::Pool => f.write_str("a warm-pool entry"),
            Self::Claim => f.write_str("an agent claim's address"),
            Self::Unknown => f.write_str("dipamd's own addresses"),
        }
    }
}

/// The container ID of the agent's `role` address of `family` ("ipv4", "ipv6") on `node`.
pub fn agent_id(role: &str, family: &str, node: &str) -> String {
    format!("{PREFIX}{role}-{family}-{node}")
}

/// Agent claims' container IDs: `dipam-claim-<name>-<node>` (agent/claims.rs).
pub const CLAIM_PREFIX: &str = "dipam-claim-";

/// The container ID of the agent's claim `name` on `node`. Names are DNS labels and can
/// never be a role's (agent/claims.rs), so no claim's key is a role's.
pub fn claim_id(name: &str, node: &str) -> String {
    format!("{CLAIM_PREFIX}{name}-{node}")
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
    if container_id.starts_with(CLAIM_PREFIX) {
        return Some(Internal::Claim);
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
mod tests;
