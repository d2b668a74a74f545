//! CNI GC: the runtime's valid list, checked and made safe, then collected (gc/collect/mod.rs): through
//! the delegate's own GC where it has one, emulated where it has none.
//!
//! - Every entry of the list must be exactly `{containerID, ifname}`; one that is not refuses
//!   the whole GC with code 7, naming the entry (gc::valid_input).
//! - A list that names nothing (empty, null, or absent) is refused with code 170 unless
//!   dipamd runs with --gc-allow-empty: cnitool sends no list meaning "everything is stale",
//!   libcni sends null for a runtime's empty GCArgs (CRI-O, for a network without pods), and
//!   either would free every pod of the network. Where the ledger holds no pod attachment on
//!   the network there is nothing it could free: such a GC succeeds and frees nothing.
//! - Agent-owned, warm-pool, in-flight and young attachments, and those an ADD finished after
//!   the runtime invoked the plugin (core/births.rs), are added to the valid set, and a
//!   GC that would free more than the allowed share of the network's pods is refused (170).

use dipam_proto::v1::CniRequest;

use crate::{
    l1_leaves::error::ShimError,
    l2_core::core::{Core, Prepared},
    l3_clients::gc::{self, Valid, ValidInput},
    l5_node::node::Node,
};

pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    peer: Option<u32>,
    req: CniRequest,
) -> Result<Vec<u8>, ShimError> {
    // When the runtime started the plugin, after it made the valid list: the plugin's
    // process start (the kernel's, from its pid), else its own stamp. Nothing an ADD finished
    // since then is freed, whatever the grace period and the wall clock (core/births.rs).
    let started = peer.and_then(crate::l2_core::core::births::process_start_ns);
    let (mut p, input) = arrive(node, caller, req)?;
    let began = node.core.births.gc_began(p.issued.as_ref(), started);
    // GC frees every attachment of the network that is not in the list: every caller's.
    if !p.caller.is_root() {
        return Err(ShimError::Forbidden {
            msg: format!("uid {} may not send GC", p.caller.uid),
            details: "GC frees the attachments of every caller on the network; only root may \
                      send it. Nothing was freed"
                .into(),
        });
    }
    let admission = gc::admit::Admission::new(&node.gc, &node.core.events, &p.dc.network);
    let input = admission.input(input)?;
    // From here the list lives in `input` alone. The GC holds its config for its whole run
    // (and its task owns a copy); at 10,000 pods the runtime's lists, parsed and raw, were
    // megabytes of it (docs/performance.md, run 39). A delegate's own GC is sent the
    // augmented list it is given (collect/mod.rs), never the runtime's. (Only a request
    // [`arrive`] read the old way still has them here.)
    if let Some(conf) = p.dc.conf.as_object_mut() {
        conf.remove(gc::VALID_KEY);
        conf.remove(gc::LEGACY_KEY);
    }
    drop(std::mem::take(&mut p.req.stdin));
    let names_nothing = !matches!(&input, ValidInput::List(l) if !l.is_empty());
    if names_nothing && !node.gc.policy.allow_empty && !has_pods(&node.core, &p.dc.network).await? {
        // Nothing a list could have named: freeing nothing is the only answer, and a success
        // keeps a runtime's start-up GC of a network without pods (CRI-O sends null) from
        // reporting a failure. The delegate's store is not swept: a list that names nothing
        // vouches for nothing in it.
        tracing::info!(
            network = %p.dc.network,
            list = input.describe(),
            "GC with a list that names nothing, on a network with no pod attachments: nothing \
             to free"
        );
        return Ok(Vec::new());
    }
    let names = format!("the valid-attachments list is {}", input.describe());
    let list = match input {
        ValidInput::List(l) => l,
        ValidInput::Absent | ValidInput::Null => Vec::new(),
    };
    let list = admission.non_empty(
        list,
        &names,
        " (start dipamd with --gc-allow-empty to accept that)",
    )?;
    let gc = gc::collect::Request {
        dc: &p.dc,
        cni_path: &p.req.cni_path,
        valid: Valid::List(list),
        began,
        mode: gc::collect::Mode::Free,
        by: crate::l1_leaves::events::FreedBy::CniGc,
        list_kept: false,
    };
    let plan = gc::collect::collect(&node.collector(), gc).await?;
    let failed: Vec<String> = plan
        .items
        .iter()
        .filter(|i| i.outcome == "failed")
        .map(|i| format!("{}/{}: {}", i.container_id, i.ifname, i.error))
        .collect();
    if failed.is_empty() {
        Ok(Vec::new())
    } else {
        Err(ShimError::GcIncomplete {
            network: p.dc.network.clone(),
            freed: plan.items.iter().filter(|i| i.outcome == "freed").count(),
            failed,
        })
    }
}

/// The request prepared, and its valid list read. A root caller's request is split first
/// (gc/input.rs): the lists read from its text into pairs, the core handed the config
/// without them, so the lists are never a `serde_json::Value` (at 10,000 pods that `Value`
/// took dipamd's RSS from 58 to 74 MiB, docs/performance.md runs 39 and 41). Any request
/// that path does not take whole, or whose config the core refuses, is read as before (the
/// config parsed whole, then [`gc::valid_input`]): every refusal reads as it always did.
fn arrive(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    mut req: CniRequest,
) -> Result<(Prepared, Result<ValidInput, gc::InputError>), ShimError> {
    if caller.is_root() && crate::l1_leaves::validate::request_sizes(&req).is_ok() {
        let stdin = std::mem::take(&mut req.stdin);
        if let Some((config, input)) = gc::input::read(&stdin) {
            let split = CniRequest {
                stdin: config,
                ..req.clone()
            };
            if let Ok(p) = node.prepare(split, false, caller) {
                return Ok((p, Ok(input)));
            }
        }
        req.stdin = stdin;
    }
    let p = node.prepare(req, false, caller)?;
    let input = gc::valid_input(&p.dc.conf);
    Ok((p, input))
}

/// Whether the ledger holds a pod attachment (not the agent's, not the warm pool's) on
/// `network`: what a GC whose list names nothing would free. From the census, which keeps
/// each record's network and holder: no record is read, where reading the ledger made every
/// such GC (a runtime's start-up GC of each network) hold all of it.
async fn has_pods(core: &Core, network: &str) -> Result<bool, ShimError> {
    let network = network.to_owned();
    core.ledger(move |l| {
        l.census(|c| c.any(|e| e.holder == dipam_state::Holder::Pod && e.group.network == network))
    })
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        l1_leaves::access::Caller,
        testing::{held, request, script, scripted_node},
    };

    /// libcni's GC at 9,750 pods (the list under both keys) as dipamd's GC receives it: what
    /// its arrival (the request prepared, the list read, the GC's set made) holds at its
    /// peak, read the old way (the config a `Value`, twice for an IPAM-mode request) and
    /// split. Also: both give the same set, and the config the GC keeps has no list.
    #[test]
    fn a_gc_of_9750_pods_arrives_without_its_lists_as_a_value() {
        const PODS: usize = 9_750;
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let (_d, node) = scripted_node(&script(""), Default::default());
        let list: Vec<serde_json::Value> = (0..PODS)
            .map(|i| json!({"containerID": format!("{i:064x}"), "ifname": "eth0"}))
            .collect();
        let req = || CniRequest {
            command: "GC".into(),
            ..request(
                "",
                "1.1.0",
                json!({gc::VALID_KEY: list, gc::LEGACY_KEY: list}),
            )
        };
        let set = |input: ValidInput| {
            let ValidInput::List(l) = input else { panic!() };
            l.into_iter()
                .collect::<std::collections::HashSet<(String, String)>>()
        };
        // Made before each measure: the request as it arrives from the wire.
        let (first, second) = (req(), req());
        drop(list);
        let (old, old_peak) = held::measure(&rt, async {
            let p = node.prepare(first, false, Caller::ROOT).unwrap();
            set(gc::valid_input(&p.dc.conf).unwrap())
        });
        let (new, new_peak) = held::measure(&rt, async {
            let (p, input) = arrive(&node, Caller::ROOT, second).unwrap();
            assert!(
                p.dc.conf.get(gc::VALID_KEY).is_none() && p.dc.conf.get(gc::LEGACY_KEY).is_none()
            );
            (set(input.unwrap()), p.dc.network.clone())
        });
        assert_eq!((old, "net".to_owned()), new);
        eprintln!(
            "GC arrival at {PODS} pods, both keys: read the old way {old_peak} B at the peak, \
             split {new_peak} B"
        );
        assert!(
            new_peak * 3 < old_peak,
            "split: {new_peak} B; the old way: {old_peak} B"
        );
        // A list the split does not take is read the old way, and refused in its words.
        let bad = CniRequest {
            command: "GC".into(),
            ..request(
                "",
                "1.1.0",
                json!({gc::VALID_KEY: [{"containerID": "a", "ifname": "eth0", "x": 1}]}),
            )
        };
        let (_, input) = arrive(&node, Caller::ROOT, bad).unwrap();
        let e = input.unwrap_err();
        assert!(
            e.msg
                .starts_with("cni.dev/valid-attachments[0] is not a valid attachment"),
            "{e}"
        );
    }
}
