//! What the reconcile compares of a network's records, read in one streamed pass of the
//! ledger: each record's key, the names its delegate holds it under, its addresses and the
//! few facts the verdicts need, never the record itself (its configs, CNI_ARGS and result,
//! 1–2 KiB each once decoded). The reconcile once held every record of the network twice
//! over (`list`, then two filtered clones): at 2,500 attachments the first reconcile at
//! start was the start's longest phase and raised dipamd's RSS by 27–31 MiB, its high-water
//! mark (docs/performance.md, runs 29 and 32).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Ledger, Owner, StoreError};

use crate::l2_core::delegate::{config::result_addrs, import, store::HeldAs};

/// Who holds a record's addresses, for the range counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Pod,
    Agent,
    Pool,
}

/// One record, as the reconcile compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub key: AttachmentKey,
    /// The (container ID, ifname) the delegate holds it under, when not the key's (a pod
    /// served from the warm pool holds the pool entry's).
    delegate: HeldAs,
    /// Its result's addresses.
    pub ips: Vec<IpAddr>,
    pub state: AttachmentState,
    pub holder: Holder,
    pub creator: Option<u32>,
    /// Recorded by adoption (read from the delegate's store, `delegate/import.rs`).
    pub adopted: bool,
    /// Whether its addresses live in the store being compared (its recorded config names
    /// that store).
    pub same_store: bool,
}

impl Seen {
    /// What the reconcile keeps of `rec`; `same_store`: whether its config names the store
    /// being compared.
    pub fn of(rec: &AttachmentRecord, same_store: bool) -> Self {
        Self {
            key: rec.key.clone(),
            delegate: HeldAs::of(rec),
            ips: rec.result.as_ref().map(result_addrs).unwrap_or_default(),
            state: rec.state,
            holder: match rec.owner {
                Owner::Pod => Holder::Pod,
                Owner::Agent { .. } => Holder::Agent,
                Owner::Pool => Holder::Pool,
            },
            creator: rec.creator_uid,
            adopted: rec.request_id == import::ADOPTED,
            same_store,
        }
    }

    /// The (container ID, ifname) the delegate holds it under (`AttachmentRecord::delegate_ids`).
    pub fn delegate_ids(&self) -> (&str, &str) {
        self.delegate.ids(&self.key.container_id, &self.key.ifname)
    }

    /// Whether it counts toward the "store holds none of the pod addresses" refusal: a
    /// committed pod record not adopted (an adopted one was read from that very store).
    pub fn counted_pod(&self) -> bool {
        self.state == AttachmentState::Committed && self.holder == Holder::Pod && !self.adopted
    }
}

/// The store a record's config names, remembered for the last config met: the records of a
/// network nearly always share one config string (a runtime sends each pod the same
/// conflist), so its JSON is parsed once, not once per record; a node whose configs differ
/// per pod pays what every record paid before, and nothing is held per config.
#[derive(Default)]
struct LastStore {
    kind: String,
    config: String,
    store: Option<PathBuf>,
}

impl LastStore {
    fn of(&mut self, rec: &mut AttachmentRecord) -> Option<&Path> {
        if rec.delegate_type != self.kind || rec.delegate_config != self.config {
            self.store = crate::l3_clients::gc::record_store(rec);
            self.kind = std::mem::take(&mut rec.delegate_type);
            self.config = std::mem::take(&mut rec.delegate_config);
        }
        self.store.as_deref()
    }
}

/// Every record of `network`, as the reconcile compares them, in key order, read a page at a
/// time and decoded one at a time (`Ledger::for_each`): nothing but the compact view is
/// held. `dir`: the store compared (None: one dipamd cannot read; no record is then of it).
pub fn read(l: &Ledger, network: &str, dir: Option<&Path>) -> Result<Vec<Seen>, StoreError> {
    let mut last = LastStore::default();
    let mut out = Vec::new();
    l.for_each(Some(network), |mut rec, _| {
        let same_store = dir.is_some() && last.of(&mut rec) == dir;
        out.push(Seen::of(&rec, same_store));
        Ok(())
    })?;
    Ok(out)
}
