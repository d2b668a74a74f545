//! What a refill round counts before it plans: a network's other attachments, the free
//! addresses of its delegate's range, and the agent addresses still waiting for one.

use std::net::IpAddr;

use dipam_state::Owner;

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
    let net = network.to_owned();
    let records = core.ledger(move |l| l.list(Some(&net))).await?;
    let in_use = records.iter().filter(|r| r.owner != Owner::Pool).count();
    Ok(Count {
        in_use,
        range_free: range_free(network, t).await,
    })
}

/// host-local's free addresses: its ranges' size less the reservations its store holds in
/// them (an ADD in flight is in the store before it is in the ledger). `None` for a delegate
/// whose ranges or store dipamd cannot read: that pool is not range-guarded.
async fn range_free(network: &str, t: &Template) -> Option<usize> {
    let ranges = ranges::host_local(&t.conf["ipam"]).ok()?;
    let dir = store::readable_dir(&t.kind, &t.conf, network)?;
    let held = store::read(dir).await.ok()?;
    let families = ranges.families();
    families
        .iter()
        .map(|f| {
            let used = held
                .iter()
                .filter(|h| Family::of(h.ip) == *f && ranges.hands_out(h.ip))
                .count() as u128;
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
