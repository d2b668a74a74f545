//! What a refill round counts before it plans: a network's other attachments, the free
//! addresses of its delegate's range, and the agent addresses still waiting for one.

use std::net::IpAddr;

use super::Template;
use crate::{
    l1_leaves::error::ShimError,
    l2_core::core::Core,
    l2_core::delegate::{
        ranges::{self, Family},
        store,
    },
};

/// One network's count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count {
    /// Records that are not the pool's (pods, agent), in any state.
    pub in_use: usize,
    /// Free addresses in the delegate's range: the smallest of its families'.
    pub range_free: Option<usize>,
}

/// Counts `network` as its template `t` describes its delegate.
pub async fn count(core: &Core, network: &str, t: &Template) -> Result<Count, ShimError> {
    Ok(Count {
        in_use: in_use(core, network).await?,
        range_free: range_free(network, t).await,
    })
}

/// The network's records that are not the pool's, in any state (an ADD not yet answered
/// will hold an address; a DEL under way still does), from the ledger's census (kept by
/// every commit, state/src/census.rs): no record is read. Each refill round once decoded
/// every record of the network to count them, at 10,000 attachments as many decoded records
/// per round held at once.
async fn in_use(core: &Core, network: &str) -> Result<usize, ShimError> {
    let net = network.to_owned();
    let held = core
        .ledger(move |l| l.census(|c| c.records_of(&net)))
        .await?;
    Ok(usize::try_from(held.pods + held.agent).unwrap_or(usize::MAX))
}

/// host-local's free addresses: its ranges' size less the addresses its store has taken in
/// them. `None` for a delegate whose ranges or store dipamd cannot read: that pool is not
/// range-guarded.
///
/// This must read the store, not the ledger: the store holds addresses the ledger does not
/// (an ADD in flight is in the store before its result is in the ledger, a reservation left
/// by a crash or another runtime is in the store only), and counting those as free would let
/// the pool take the range's last addresses, the ones a pod's ADD needs. What it reads is the
/// least that keeps that exact: the directory's names (one per address host-local took), not
/// the files, with nothing held per entry ([`store::fold_taken`]).
async fn range_free(network: &str, t: &Template) -> Option<usize> {
    let ranges = ranges::host_local(&t.conf["ipam"]).ok()?;
    let dir = store::readable_dir(&t.kind, &t.conf, network)?;
    let families = ranges.families();
    let taken = store::fold_taken(dir, (ranges, [0u128; 2]), |(ranges, n), ip| {
        if ranges.hands_out(ip) {
            n[usize::from(Family::of(ip) == Family::V6)] += 1;
        }
    })
    .await
    .ok()?;
    let (ranges, used) = taken;
    families
        .iter()
        .map(|f| {
            let used = used[usize::from(*f == Family::V6)];
            usize::try_from(ranges.size(*f).saturating_sub(used)).unwrap_or(usize::MAX)
        })
        .min()
}

/// An agent address or claim that has none yet: its network, and the IP it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub network: String,
    pub requested: Option<IpAddr>,
}

/// The agent's addresses that wait (pending, failed): the pool yields to them.
pub fn agent_waiting(agent: &crate::l3_clients::agent::Agent) -> Vec<Waiting> {
    agent
        .snapshot()
        .addresses
        .into_iter()
        .filter(|a| a.ip.is_empty() && matches!(a.state.as_str(), "pending" | "failed"))
        .map(|a| Waiting {
            network: a.network,
            requested: a.requested_ip.parse().ok(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! A refill round's count on a dense node: real sled on disk, 3,000 records shaped as a
    //! runtime's pods leave them, host-local's real directory layout with a file per address.

    use std::net::IpAddr;

    use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};

    use super::*;
    use crate::testing::{
        dense::{self, NET},
        held,
    };

    const N: usize = 3_000;

    /// A record of `NET` (or `network`) under `cid`, as pod 0's but for its key.
    fn other(data: &std::path::Path, network: &str, cid: &str) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey::new(network, cid, "eth0"),
            ..dense::record(0, data)
        }
    }

    /// The count is exact: every record that is not the pool's, in any state (the agent's,
    /// an ADD not yet answered, a DEL under way), none of another network; and every address
    /// host-local took in the range (a reservation no record has yet, an orphan, a blank
    /// file), none outside it. It reads no record (the census answers) and holds next to
    /// nothing: each round once decoded every record of the network.
    #[test]
    fn a_refill_count_on_a_dense_node_is_exact_and_reads_no_record() {
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let (dir, data, mut records) = dense::unsaved(N);
        let mut agent = other(&data, NET, "agent-1");
        agent.owner = Owner::Agent {
            role: "router".into(),
        };
        let mut adding = other(&data, NET, "adding-1");
        (adding.state, adding.result) = (AttachmentState::Adding, None);
        let mut deleting = other(&data, NET, "deleting-1");
        deleting.state = AttachmentState::Deleting;
        let pool: Vec<AttachmentRecord> = (0..5)
            .map(|i| AttachmentRecord {
                owner: Owner::Pool,
                ..other(&data, NET, &format!("dipam-pool-n1-{i}"))
            })
            .collect();
        records.extend([agent, adding, deleting, other(&data, "elsewhere", "x")]);
        records.extend(pool);
        let d = dense::node(&records, dir);
        drop(records);
        let pool_ip = |i: u8| -> IpAddr { format!("10.60.100.{i}").parse().unwrap() };
        for i in 0..N {
            d.reserve(dense::ip(i), &format!("{}\r\neth0", dense::cid(i)));
        }
        for i in 0..5 {
            d.reserve(pool_ip(i), &format!("dipam-pool-n1-{i}\r\neth0"));
        }
        // In the store only: an ADD in flight, an orphan, a blank file (host-local killed
        // between its create and its write). Each is an address host-local will not hand out.
        d.reserve(pool_ip(10), "inflight\r\neth0");
        d.reserve(pool_ip(11), "orphan\r\neth0");
        d.reserve(pool_ip(12), "");
        // Not addresses of the range: host-local's bookkeeping, an address outside it.
        d.reserve("10.61.0.5".parse().unwrap(), "outside\r\neth0");
        let store = data.join(NET);
        std::fs::write(store.join("lock"), "").unwrap();
        std::fs::write(store.join("last_reserved_ip.0"), "10.60.100.12").unwrap();
        let t = Template {
            digest: String::new(),
            kind: "host-local".into(),
            version: "1.1.0".into(),
            conf: dense::config(&data),
            cni_path: String::new(),
            mode: 0,
            source: "pod".into(),
        };
        let node = d.node.clone();
        let whole = d.whole(&rt);
        // dipamd builds the census at start, before serving.
        node.core.ledger.count().unwrap();
        let scans = node.core.ledger.census_scans();

        let (c, peak) = held::measure(&rt, count(&node.core, NET, &t));
        let c = c.expect("the network counts");
        assert_eq!(
            c.in_use,
            N + 3,
            "the pods, the agent, an ADD and a DEL in flight"
        );
        let size = ranges::host_local(&t.conf["ipam"])
            .unwrap()
            .size(Family::V4);
        assert_eq!(
            size, 65_533,
            "10.60.0.0/16 less its network, broadcast and gateway"
        );
        let taken = N + 5 + 3;
        assert_eq!(c.range_free, Some(65_533 - taken));
        assert_eq!(
            node.core.ledger.census_scans(),
            scans,
            "the count scanned the ledger"
        );
        eprintln!("whole network decoded: {whole} B; the count's peak: {peak} B");
        assert!(
            peak * 100 < whole,
            "the count held {peak} B at its peak, the network's records take {whole} B decoded"
        );
        // The census follows commits: a pod's record removed is counted by the next round,
        // without a scan.
        let gone = AttachmentKey::new(NET, dense::cid(1), "eth0");
        node.core.ledger.remove(&gone).unwrap();
        let c = rt.block_on(count(&node.core, NET, &t)).unwrap();
        assert_eq!(c.in_use, N + 2);
        assert_eq!(node.core.ledger.census_scans(), scans);
    }
}
