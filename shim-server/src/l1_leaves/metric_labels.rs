//! The `owner` label of `dipam_attachments`: a bounded set. The ledger's own label
//! (`Owner::label`) names each claim (`agent:claim:NAME`), and a label value per claim name
//! made one series per claim that outlived the claim (a Prometheus series lives as long as
//! the process reports it), without bound as agents claim and release names. Claims are
//! counted together as `agent:claim`; `dipamctl agent list` names them.

use dipam_state::Owner;

/// `pod`, `pool`, `agent:<role>` for a role, `agent:claim` for every claim.
pub fn owner(o: &Owner) -> String {
    match o {
        Owner::Agent { role } if role.starts_with(CLAIM_PREFIX) => "agent:claim".into(),
        other => other.label(),
    }
}

/// The role prefix of a claim (agent/mod.rs names claims so).
const CLAIM_PREFIX: &str = "claim:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_share_one_label_and_roles_keep_theirs() {
        let claim = |n: &str| Owner::Agent {
            role: crate::l3_clients::agent::claim_role(n),
        };
        assert_eq!(owner(&claim("egress-1")), "agent:claim");
        assert_eq!(owner(&claim("egress-2")), "agent:claim");
        let router = Owner::Agent {
            role: "router".into(),
        };
        assert_eq!(owner(&router), "agent:router");
        assert_eq!(owner(&Owner::Pod), "pod");
        assert_eq!(owner(&Owner::Pool), "pool");
    }
}
