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
//!
//! An address whose release is in flight ([`AddrIndex::releasing`]: GC's, the warm pool's,
//! the agent's) is held by no one and by everyone: the delegate may already have freed it
//! (host-local unlinks its file before its DEL exits) while dipamd does not yet know that the
//! release succeeded. An ADD whose delegate hands out such an address waits until the release
//! is certain, then claims it as usual: it is never answered with an address whose release
//! could still fail, and never refused for a holder that is going away (docs/cfp.md §7.4).

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Mutex,
};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Ledger, StoreError};

use crate::l2_core::delegate::config::result_addrs;

#[derive(Debug)]
pub struct AddrIndex {
    inner: Mutex<Inner>,
    /// Bumped whenever a release ends: an ADD waiting for one looks again.
    released: tokio::sync::watch::Sender<u64>,
}

impl Default for AddrIndex {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            released: tokio::sync::watch::Sender::new(0),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// network -> address -> holder.
    nets: HashMap<String, HashMap<IpAddr, Holder>>,
    /// Networks whose part was loaded from the ledger.
    loaded: HashSet<String>,
    /// network -> address -> the attachment whose release of it is in flight.
    releasing: HashMap<String, HashMap<IpAddr, AttachmentKey>>,
}

/// Who the index says holds an address: the attachment's key and the request that made the
/// record the entry came from. A key is reused (a runtime retries an ADD under the same
/// container ID, the churn of a busy node), so the key alone confirmed an entry left by the
/// key's previous attachment against its next one: an ADD of that key still under way (its
/// record `adding`, which holds whatever it claims) made another pod's ADD fail with 156 for
/// an address nobody held (3 of 1,028 ADDs of the exact-range churn).
#[derive(Debug, Clone)]
struct Holder {
    key: AttachmentKey,
    request_id: String,
}

impl Holder {
    fn of(rec: &AttachmentRecord) -> Self {
        Self {
            key: rec.key.clone(),
            request_id: rec.request_id.clone(),
        }
    }

    /// Whether `rec` (as the ledger has it now) is the attachment this entry was made for.
    /// Records without a request ID (written before it was kept) match by key alone.
    fn is(&self, rec: &AttachmentRecord) -> bool {
        rec.key == self.key && (self.request_id.is_empty() || rec.request_id == self.request_id)
    }
}

/// An attachment's addresses marked as being released ([`AddrIndex::releasing`]); dropping it
/// ends the mark, whatever the release's outcome (a cancelled GC too), and wakes the ADDs
/// that wait for one of them.
#[must_use = "the addresses count as being released only while this lives"]
pub struct Releasing<'a> {
    index: &'a AddrIndex,
    key: AttachmentKey,
    ips: Vec<IpAddr>,
}

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        if self.ips.is_empty() {
            return;
        }
        {
            let mut inner = self.index.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(net) = inner.releasing.get_mut(&self.key.network) {
                for ip in &self.ips {
                    if net.get(ip) == Some(&self.key) {
                        net.remove(ip);
                    }
                }
                if net.is_empty() {
                    inner.releasing.remove(&self.key.network);
                }
            }
        }
        self.index.released.send_modify(|n| *n = n.wrapping_add(1));
    }
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
    /// Another attachment's release of the address is in flight: wait for it to end.
    Releasing(IpAddr, AttachmentKey),
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

/// Every network's part of the index, built from the ledger one record at a time (the
/// start's single read, `Core::index_ledger`), so that the records are never all held.
#[derive(Debug, Default)]
pub struct Loaded(HashMap<String, HashMap<IpAddr, Holder>>);

impl Loaded {
    /// Adds what `rec` holds; its network counts as loaded even when it holds nothing.
    pub fn add(&mut self, rec: &AttachmentRecord) {
        let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
        let map = match self.0.get_mut(&rec.key.network) {
            Some(map) => map,
            None => self.0.entry(rec.key.network.clone()).or_default(),
        };
        for ip in ips {
            map.insert(ip, Holder::of(rec));
        }
    }
}

impl AddrIndex {
    /// Replaces `network`'s part with what `records` hold.
    fn load<'a>(&self, network: &str, records: impl IntoIterator<Item = &'a AttachmentRecord>) {
        let mut map = HashMap::new();
        for rec in records {
            for ip in rec.result.as_ref().map(result_addrs).unwrap_or_default() {
                map.insert(ip, Holder::of(rec));
            }
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.nets.insert(network.to_owned(), map);
        inner.loaded.insert(network.to_owned());
    }

    /// Installs every network's part, built from the whole ledger one record at a time
    /// ([`Loaded`]), as dipamd does at start before it serves: the first ADD of a network
    /// after a start then claims through the index, instead of reading every record of its
    /// network (437 ms at 2,500 attachments, docs/performance.md). A network with no record
    /// yet is loaded when first needed, from an empty read.
    pub fn install(&self, loaded: Loaded) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (network, map) in loaded.0 {
            inner.loaded.insert(network.clone());
            inner.nets.insert(network, map);
        }
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
        if let Some(going) = inner.releasing.get(&rec.key.network)
            && let Some((ip, by)) = ips
                .iter()
                .find_map(|ip| going.get(ip).filter(|k| **k != rec.key).map(|k| (*ip, k)))
        {
            return Ok(Claim::Releasing(ip, by.clone()));
        }
        let net = inner.nets.entry(rec.key.network.clone()).or_default();
        for ip in ips {
            let Some(holder) = net.get(ip).filter(|h| h.key != rec.key) else {
                continue;
            };
            match ledger.get(&holder.key)? {
                Some(h) if holder.is(&h) && holds(&h, ip) => {
                    return Ok(Claim::Held(*ip, Box::new(h)));
                }
                _ if !rescanned => return Ok(Claim::Stale),
                _ => {}
            }
        }
        for ip in ips {
            net.insert(*ip, Holder::of(rec));
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
    ) -> Result<Claimed, crate::l1_leaves::error::ShimError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<
                Output = Result<Vec<AttachmentRecord>, crate::l1_leaves::error::ShimError>,
            >,
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
            // Subscribed before looking, so that a release ending in between is not missed.
            let mut ended = self.released.subscribe();
            match self.try_claim(ledger, rec, &ips, rescanned)? {
                Claim::Done => return Ok(Claimed::Done),
                Claim::Held(ip, holder) => return Ok(Claimed::Held(ip, holder)),
                Claim::Stale => {
                    self.load(network, &list(network.clone()).await?);
                    rescanned = true;
                }
                // A release lasts one delegate DEL (bounded by the delegate timeout) and the
                // commit that forgets its record; the mark ends even if its GC is cancelled.
                Claim::Releasing(ip, by) => {
                    tracing::debug!(key = %rec.key, %ip, releasing = %by, "the delegate handed out an address whose release is in flight; waiting for it to end");
                    let _ = ended.changed().await;
                }
            }
        }
    }

    /// Marks the addresses of `rec`'s result as being released by `rec`, until the returned
    /// guard is dropped: call it before the delegate's DEL starts, and drop the guard once
    /// the release is certain and the record forgotten (or the release failed).
    pub fn releasing(&self, rec: &AttachmentRecord) -> Releasing<'_> {
        let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
        self.releasing_ips(&rec.key, ips)
    }

    /// [`Self::releasing`] for addresses known otherwise (a reservation the delegate holds
    /// behind dipamd's back, released under its own key).
    pub fn releasing_ips(&self, key: &AttachmentKey, ips: Vec<IpAddr>) -> Releasing<'_> {
        if !ips.is_empty() {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let net = inner.releasing.entry(key.network.clone()).or_default();
            for ip in &ips {
                net.insert(*ip, key.clone());
            }
        }
        Releasing {
            index: self,
            key: key.clone(),
            ips,
        }
    }

    /// Whether the release of `ip` in `network` is in flight (tests, status).
    pub fn is_releasing(&self, network: &str, ip: &IpAddr) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .releasing
            .get(network)
            .is_some_and(|n| n.contains_key(ip))
    }

    /// Drops `key`'s addresses (its record is gone: DEL, rollback).
    pub fn forget(&self, key: &AttachmentKey, result: Option<&serde_json::Value>) {
        let ips = result.map(result_addrs).unwrap_or_default();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(net) = inner.nets.get_mut(&key.network) {
            for ip in ips {
                if net.get(&ip).is_some_and(|h| h.key == *key) {
                    net.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use dipam_state::{AttachmentRecord, MemStore, Owner};
    use serde_json::json;

    use super::*;

    fn rec(cid: &str, ip: &str) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey::new("net", cid, "eth0"),
            owner: Owner::Pod,
            state: AttachmentState::Committed,
            delegate_type: "host-local".into(),
            delegate_version: "1.0.0".into(),
            delegate_config: "{}".into(),
            netns: String::new(),
            cni_args: String::new(),
            cni_path: String::new(),
            result: Some(json!({"cniVersion":"1.0.0","ips":[{"address": format!("{ip}/24")}]})),
            config_digest: String::new(),
            request_id: "t".into(),
            created_at: 1,
            updated_at: 1,
            issued_ms: 0,
            issued_at: None,
            delegate_key: None,
            creator_uid: None,
            cri_pod: None,
        }
    }

    async fn claim(index: &AddrIndex, ledger: &Ledger, rec: &AttachmentRecord) -> Claimed {
        let l = ledger.clone();
        index
            .claim(ledger, rec, move |n| {
                let l = l.clone();
                async move {
                    l.list(Some(&n))
                        .map_err(crate::l1_leaves::error::ShimError::from)
                }
            })
            .await
            .unwrap()
    }

    /// The race GC's parallel releases open: the delegate frees an address (host-local
    /// unlinks its file) before its DEL exits, and hands it to an ADD. That ADD is answered
    /// only once the release is certain and the old record is gone, never refused for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_add_handed_an_address_being_released_waits_for_the_release() {
        let ledger = Ledger::shared(MemStore::new());
        let index = Arc::new(AddrIndex::default());
        let old = rec("old", "10.9.0.7");
        ledger.put(&old).unwrap();
        let new = rec("new", "10.9.0.7");
        let releasing = index.releasing(&old);
        assert!(index.is_releasing("net", &"10.9.0.7".parse().unwrap()));
        let waiter = {
            let (index, ledger, new) = (index.clone(), ledger.clone(), new.clone());
            tokio::spawn(async move { claim(&index, &ledger, &new).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "claimed while the release was in flight"
        );
        // The release succeeds: the record goes, then the mark.
        ledger.remove(&old.key).unwrap();
        index.forget(&old.key, old.result.as_ref());
        drop(releasing);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the ADD still waits after the release ended")
            .unwrap();
        assert!(matches!(got, Claimed::Done), "{got:?}");
        assert!(!index.is_releasing("net", &"10.9.0.7".parse().unwrap()));
    }

    /// A release that fails leaves the old record holding the address: the ADD that waited
    /// is then refused for it, as for any holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_release_still_holds_the_address() {
        let ledger = Ledger::shared(MemStore::new());
        let index = Arc::new(AddrIndex::default());
        let old = rec("old", "10.9.0.8");
        ledger.put(&old).unwrap();
        assert!(matches!(claim(&index, &ledger, &old).await, Claimed::Done));
        let releasing = index.releasing(&old);
        let waiter = {
            let (index, ledger) = (index.clone(), ledger.clone());
            let new = rec("new", "10.9.0.8");
            tokio::spawn(async move { claim(&index, &ledger, &new).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(releasing);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(&got, Claimed::Held(_, h) if h.key == old.key),
            "{got:?}"
        );
        // Its own attachment is never made to wait for itself.
        let _mine = index.releasing(&old);
        assert!(matches!(claim(&index, &ledger, &old).await, Claimed::Done));
    }

    /// An entry the index kept from a key's previous attachment (its DEL's forget lost to a
    /// rescan that listed the ledger just before) does not make the key's next attachment,
    /// still `adding`, the holder of an address it never claimed: the ADD handed that address
    /// is served, not refused with 156 (the exact-range churn failed 3 of 1,028 ADDs so).
    #[tokio::test]
    async fn a_reused_key_adding_again_holds_only_what_it_claims() {
        let ledger = Ledger::shared(MemStore::new());
        let index = AddrIndex::default();
        let first = rec("reused", "10.9.0.9");
        ledger.put(&first).unwrap();
        assert!(matches!(
            claim(&index, &ledger, &first).await,
            Claimed::Done
        ));
        // Its DEL: the record goes, but the index keeps the entry (the lost forget).
        ledger.remove(&first.key).unwrap();
        // The same key ADDs again: its intent, no result yet, another request.
        let mut again = rec("reused", "10.9.0.50");
        again.state = AttachmentState::Adding;
        again.result = None;
        again.request_id = "next".into();
        ledger.put(&again).unwrap();
        let other = rec("other", "10.9.0.9");
        let got = claim(&index, &ledger, &other).await;
        assert!(matches!(got, Claimed::Done), "{got:?}");
        // While an entry the same ADD made still counts: its own claim holds the address.
        let mut claimed = rec("reused", "10.9.0.51");
        claimed.request_id = "next".into();
        assert!(matches!(
            claim(&index, &ledger, &claimed).await,
            Claimed::Done
        ));
        let late = rec("late", "10.9.0.51");
        assert!(
            matches!(claim(&index, &ledger, &late).await, Claimed::Held(_, h) if h.key == again.key)
        );
    }
}
