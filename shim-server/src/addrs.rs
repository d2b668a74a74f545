//! Which attachment holds each address, per network: a delegate that hands out an address
//! another attachment of the network already holds is refused (156), as an agent conflict is.
//!
//! Why: two allocators on one range (two host-local `dataDir`s, a delegate store wiped or not
//! the one dipamd sees) once gave two pods the same IP, both committed, and the conflict
//! counter stayed at 0. Only the agent's addresses were checked, through their own index.
//!
//! The index is an in-memory hint, never the truth: each network's part is loaded from the
//! ledger when first needed, every commit claims its addresses, every DEL forgets them. A
//! holder found in the index is confirmed against the ledger (a point read, served from the
//! store's cache) before anything is refused; a holder that no longer holds the address (its
//! record went through a path that does not tell the index: GC, recovery, the warm pool's
//! take) makes the network be read again once, so a missed update costs a scan, never a
//! missed conflict. The check and the claim are one step under the index's lock, so two ADDs
//! racing with the same address cannot both pass.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Mutex,
};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Ledger, StoreError};

use crate::delegate::config::result_addrs;

#[derive(Debug, Default)]
pub struct AddrIndex {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// network -> address -> holder.
    nets: HashMap<String, HashMap<IpAddr, AttachmentKey>>,
    /// Networks whose part was loaded from the ledger.
    loaded: HashSet<String>,
}

/// What [`AddrIndex::claim`] found: the addresses are the attachment's now, or one is held by
/// another attachment of the network (as the ledger has it).
#[derive(Debug)]
pub enum Claimed {
    Done,
    Held(IpAddr, Box<AttachmentRecord>),
}

/// What [`AddrIndex::try_claim`] found.
enum Claim {
    Done,
    /// The address is held by this attachment, confirmed by the ledger.
    Held(IpAddr, Box<AttachmentRecord>),
    /// The index named a holder the ledger does not confirm: read the network again.
    Stale,
}

/// Whether `holder` (as the ledger has it) still holds `ip`. A record in `adding` holds the
/// address it claimed here while its ADD is under way (its result is not written yet); after
/// a failed release it stays `adding`, and the delegate may indeed still hold the address.
fn holds(holder: &AttachmentRecord, ip: &IpAddr) -> bool {
    holder.state == AttachmentState::Adding
        || holder
            .result
            .as_ref()
            .is_some_and(|r| result_addrs(r).contains(ip))
}

impl AddrIndex {
    /// Replaces `network`'s part with what `records` hold.
    fn load(&self, network: &str, records: &[AttachmentRecord]) {
        let mut map = HashMap::new();
        for rec in records {
            for ip in rec.result.as_ref().map(result_addrs).unwrap_or_default() {
                map.insert(ip, rec.key.clone());
            }
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.nets.insert(network.to_owned(), map);
        inner.loaded.insert(network.to_owned());
    }

    fn loaded(&self, network: &str) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.loaded.contains(network)
    }

    /// Checks and claims `ips` for `rec` in one step. `trust_index`: a holder the ledger does
    /// not confirm is a stale entry only worth a rescan (false after the rescan: it is then
    /// simply replaced).
    fn try_claim(
        &self,
        ledger: &Ledger,
        rec: &AttachmentRecord,
        ips: &[IpAddr],
        rescanned: bool,
    ) -> Result<Claim, StoreError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let net = inner.nets.entry(rec.key.network.clone()).or_default();
        for ip in ips {
            let Some(holder) = net.get(ip).filter(|h| **h != rec.key) else {
                continue;
            };
            match ledger.get(holder)? {
                Some(h) if holds(&h, ip) => return Ok(Claim::Held(*ip, Box::new(h))),
                _ if !rescanned => return Ok(Claim::Stale),
                _ => {}
            }
        }
        for ip in ips {
            net.insert(*ip, rec.key.clone());
        }
        Ok(Claim::Done)
    }

    /// Claims the addresses of `rec`'s result for it, or names the attachment of the same
    /// network that holds one of them. `list` reads a network's records from the ledger
    /// (off the async workers).
    pub async fn claim<F, Fut>(
        &self,
        ledger: &Ledger,
        rec: &AttachmentRecord,
        list: F,
    ) -> Result<Claimed, crate::error::ShimError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<AttachmentRecord>, crate::error::ShimError>>,
    {
        let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
        if ips.is_empty() {
            return Ok(Claimed::Done);
        }
        let network = &rec.key.network;
        let mut rescanned = false;
        if !self.loaded(network) {
            self.load(network, &list(network.clone()).await?);
            rescanned = true;
        }
        loop {
            match self.try_claim(ledger, rec, &ips, rescanned)? {
                Claim::Done => return Ok(Claimed::Done),
                Claim::Held(ip, holder) => return Ok(Claimed::Held(ip, holder)),
                Claim::Stale => {
                    self.load(network, &list(network.clone()).await?);
                    rescanned = true;
                }
            }
        }
    }

    /// Drops `key`'s addresses (its record is gone: DEL, rollback).
    pub fn forget(&self, key: &AttachmentKey, result: Option<&serde_json::Value>) {
        let ips = result.map(result_addrs).unwrap_or_default();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(net) = inner.nets.get_mut(&key.network) {
            for ip in ips {
                if net.get(&ip) == Some(key) {
                    net.remove(&ip);
                }
            }
        }
    }
}
