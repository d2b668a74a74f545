//! DELs that cross networks: a runtime's DEL of a container dipamd holds on another network
//! only. That is what a conflist swapped under running pods looks like (its network renamed,
//! or another file sorted first): the runtime DELs the pods through the new network, the
//! delegate finds nothing there and the DEL "succeeds", while the addresses stay held on the
//! old one. Nothing is freed here (a container may well be attached to two networks, and
//! the runtime-aware GC frees what no sandbox uses); the DEL is seen at once instead: a WARN
//! naming both networks, a metric (`dipam_crossed_dels_total`) and a doctor line.
//!
//! Finding a container on other networks means reading the whole ledger (keys lead with
//! the network), so the DEL never waits for it: keys are queued (bounded) and one task looks
//! them up in batches, one read of the ledger per batch, off the request's path.

use std::sync::{
    Arc, Mutex, OnceLock,
    atomic::{AtomicU64, Ordering},
};

use dipam_state::AttachmentKey;
use tokio::sync::mpsc;
use tracing::warn;

use crate::l2_core::core::Core;

/// DELs waiting to be looked up; past this a DEL is not looked at (and counted as such).
const QUEUE: usize = 256;

/// The last crossed DEL seen, for the doctor.
#[derive(Debug, Clone)]
pub struct Sighting {
    pub container_id: String,
    /// The network the DEL named.
    pub del_network: String,
    /// Where dipamd holds the container.
    pub held_on: Vec<String>,
}

/// The watcher's handle: what it has seen, and the queue to its task.
#[derive(Debug, Default)]
pub struct Crossed {
    seen: AtomicU64,
    skipped: AtomicU64,
    last: Mutex<Option<Sighting>>,
    tx: OnceLock<mpsc::Sender<AttachmentKey>>,
}

impl Crossed {
    /// Crossed DELs seen since start, and the last one.
    pub fn seen(&self) -> (u64, Option<Sighting>) {
        let last = self.last.lock().map(|l| l.clone()).unwrap_or_default();
        (self.seen.load(Ordering::Relaxed), last)
    }

    /// DELs not looked at because the queue was full.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Looks, later and off the caller's path, for `key`'s container on other networks.
    /// Called from a DEL of a key the ledger does not hold.
    pub fn look(self: &Arc<Self>, core: &Arc<Core>, key: &AttachmentKey) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(watch(self.clone(), core.clone(), rx));
            tx
        });
        if tx.try_send(key.clone()).is_err() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn saw(&self, core: &Core, sighting: Sighting) {
        warn!(
            container = %sighting.container_id,
            del_network = %sighting.del_network,
            held_on = %sighting.held_on.join(","),
            "DEL for a container dipamd holds on another network only: its addresses there \
             stay held (was the conflist swapped under running pods? see docs/troubleshooting.md)"
        );
        self.seen.fetch_add(1, Ordering::Relaxed);
        core.events
            .emit(crate::l1_leaves::events::Event::CrossedDel);
        if let Ok(mut last) = self.last.lock() {
            *last = Some(sighting);
        }
    }
}

/// The task: takes what is queued, reads the ledger once per batch, reports each crossing.
async fn watch(crossed: Arc<Crossed>, core: Arc<Core>, mut rx: mpsc::Receiver<AttachmentKey>) {
    let mut batch = Vec::with_capacity(QUEUE);
    while rx.recv_many(&mut batch, QUEUE).await > 0 {
        let keys = std::mem::take(&mut batch);
        // The census names every attachment using a container ID: no read of the records
        // (this read every record per batch, docs/performance.md, run 32).
        let found = core
            .ledger(move |l| {
                l.census(|c| {
                    keys.into_iter()
                        .filter_map(|k| {
                            let mut held_on: Vec<String> = c
                                .using_container_id(&k.container_id)
                                .filter(|(o, _)| {
                                    o.container_id == k.container_id && o.network != k.network
                                })
                                .map(|(o, _)| o.network.clone())
                                .collect();
                            held_on.sort();
                            held_on.dedup();
                            (!held_on.is_empty()).then_some(Sighting {
                                container_id: k.container_id,
                                del_network: k.network,
                                held_on,
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await;
        match found {
            Ok(sightings) => sightings.into_iter().for_each(|s| crossed.saw(&core, s)),
            Err(e) => warn!(error = %e, "could not look for DELs that crossed networks"),
        }
    }
}
