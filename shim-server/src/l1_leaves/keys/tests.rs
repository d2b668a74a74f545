//! Every key dipamd makes is reserved, and refused to a runtime with code 4.

use super::*;

#[test]
fn every_key_dipamd_makes_is_refused_to_a_runtime() {
    for role in ROLES {
        for fam in ["ipv4", "ipv6"] {
            let id = agent_id(role, fam, "node-1.example");
            assert!(
                crate::l1_leaves::validate::container_id(&id).is_ok(),
                "{id}"
            );
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
    let c = claim_id("egress-1", "n1");
    assert_eq!(c, "dipam-claim-egress-1-n1");
    assert!(crate::l1_leaves::validate::container_id(&c).is_ok());
    assert_eq!(internal(&c), Some(Internal::Claim));
    assert!(refuse_runtime("ADD", &c).is_err());
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
    let e = crate::l1_leaves::error::ShimError::from(
        refuse_runtime("ADD", &agent_id("router", "ipv4", "n1")).unwrap_err(),
    );
    let (code, details) = e.code_and_details();
    assert_eq!(code, 4);
    let msg = e.to_string();
    assert!(msg.contains("dipam-router-ipv4-n1"), "{msg}");
    assert!(msg.contains("router"), "{msg}");
    assert!(details.contains(PREFIX), "{details}");
}
