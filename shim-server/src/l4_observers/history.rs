//! A bounded history of what dipamd did for each container, for `dipamctl explain`: every CNI
//! request with its outcome, and every delegate exec with its argv, environment, exit status,
//! an excerpt of its stderr and its duration (aws-vpc-cni#111: "why did ADD fail?").
//!
//! Events go through a bounded channel to one task that writes them to the ledger's history
//! tree in batches (one durable commit per second at most), so the request path never waits
//! for history. At most `PER_CONTAINER` events are kept per container, and for at most
//! `MAX_CONTAINERS` containers (those with the oldest last event go first): without the second
//! bound the tree grew with every pod the node ever ran, and sled's memory with it (dipamd's
//! idle RSS crept up by ~6 MiB per few thousand pods, docs/performance.md). A full channel
//! drops events (and counts them) rather than grow without bound. A crash loses at most the
//! last second of history, never an allocation.
//!
//! `explain` flushes the writer before it reads ([`Sink::flush`]): a request's events are
//! recorded before its reply is sent, so a request the caller has seen complete (a failed ADD
//! included) is always in the history explain shows.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use dipam_state::{Batch, Durability, Ledger, Tree};
use serde_json::Value;
use tokio::sync::mpsc;

/// Events kept per container.
pub const PER_CONTAINER: usize = 64;
/// Containers whose history is kept.
pub const MAX_CONTAINERS: usize = 1024;
/// Of those, the most one non-root caller's take (a quarter), and all non-root callers'
/// together (half): when the 1,024 were shared by all callers, one allowed uid churning
/// container IDs pushed every root pod's history out, and `explain` had nothing to say.
/// A container is a caller's when every event of it came from that caller; one root
/// touched is root's.
const fn per_uid(max: usize) -> usize {
    max / 4
}
const fn non_root(max: usize) -> usize {
    max / 2
}
/// Events waiting to be written; beyond that new ones are dropped.
const QUEUE: usize = 4096;
/// The longest string one event keeps (a delegate's message, CNI_ARGS, a netns path): the
/// rest is clipped, saying how long it was.
pub const MAX_STRING: usize = 1024;
/// The most one event takes in the history, serialized: one with more (a result with many
/// addresses and routes) keeps only its top-level scalar fields. Bounds `explain` to
/// [`PER_CONTAINER`] times this per container.
pub const MAX_EVENT: usize = 16 << 10;
/// The most one batch (one commit) takes: the history commits through the same journal as
/// the ledger, and failed ADDs echoing 0.9 MB values once took that journal past its cap, so
/// that root's own commits failed (docs/cfp.md, "Threat model").
pub const MAX_BATCH: usize = 1 << 20;

/// `body` within [`MAX_EVENT`]: its strings clipped to [`MAX_STRING`], and if that is not
/// enough, only its top-level fields that are not objects or arrays, marked `clipped`.
fn bounded(mut body: Value) -> Value {
    fn clip_strings(v: &mut Value) {
        match v {
            Value::String(s) if s.len() > MAX_STRING => {
                let mut end = MAX_STRING;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                *s = format!("{}... ({} bytes; clipped)", &s[..end], s.len());
            }
            Value::Array(a) => a.iter_mut().for_each(clip_strings),
            Value::Object(o) => o.values_mut().for_each(clip_strings),
            _ => {}
        }
    }
    clip_strings(&mut body);
    if body.to_string().len() <= MAX_EVENT {
        return body;
    }
    if let Value::Object(o) = &mut body {
        o.retain(|_, v| !v.is_object() && !v.is_array());
        o.insert("clipped".into(), Value::Bool(true));
    }
    body
}

/// One event; `body` is its JSON (kind, times, details).
#[derive(Debug, Clone)]
pub struct Event {
    pub container_id: String,
    pub body: Value,
}

/// What the writer receives: an event, or a request to write everything sent before it now
/// and say when that is done ([`Sink::flush`]).
#[derive(Debug)]
enum Msg {
    Event(Event),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// How long [`Sink::flush`] waits for the writer: explain must answer even if the ledger is
/// slow, with what is written by then.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Where events are sent. Cheap to clone; a no-op when history is off.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    tx: Option<mpsc::Sender<Msg>>,
    dropped: Arc<AtomicU64>,
    seq: Arc<AtomicU64>,
}

impl Sink {
    /// Records `body` for `container_id` (empty IDs, as in GC and STATUS, are not recorded).
    /// Returns false when the event was dropped because the writer fell behind.
    pub fn record(&self, container_id: &str, body: Value) -> bool {
        let Some(tx) = &self.tx else { return true };
        if container_id.is_empty() {
            return true;
        }
        let mut body = bounded(body);
        body["atMs"] = Value::from(crate::l1_leaves::clock::now_ms());
        body["seq"] = Value::from(self.seq.fetch_add(1, Ordering::Relaxed));
        let ev = Event {
            container_id: container_id.to_owned(),
            body,
        };
        if tx.try_send(Msg::Event(ev)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Returns once every event recorded before the call is in the ledger (or after
    /// `FLUSH_WAIT`). A request's events are recorded before its reply is sent, so `explain`
    /// flushing first shows a request that has completed, a failed ADD included, instead of
    /// an empty history until the writer's next batch (up to a second later).
    pub async fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (ack, done) = tokio::sync::oneshot::channel();
        let _ = tokio::time::timeout(FLUSH_WAIT, async move {
            if tx.send(Msg::Flush(ack)).await.is_ok() {
                let _ = done.await;
            }
        })
        .await;
    }
}

/// `CID\0` + when (16 digits of ms, 12 of sequence) + `uUID` for a non-root caller's event
/// (the event's `uid`): the index learns whose a container is from the keys alone.
fn key(container_id: &str, body: &Value) -> Vec<u8> {
    let uid = body["uid"]
        .as_u64()
        .map(|u| format!("u{u}"))
        .unwrap_or_default();
    format!(
        "{container_id}\0{:016}{:012}{uid}",
        body["atMs"].as_u64().unwrap_or_default(),
        body["seq"].as_u64().unwrap_or_default()
    )
    .into_bytes()
}

/// The length of a key's time part, after the separator.
const WHEN: usize = 28;

/// Of a root container's [`PER_CONTAINER`] events, the most other callers' may take.
const FOREIGN: usize = PER_CONTAINER / 4;

/// Whether `key` is of a non-root caller's event.
fn has_uid(key: &[u8]) -> bool {
    key.iter()
        .position(|b| *b == 0)
        .is_some_and(|sep| key.len() > sep + 1 + WHEN)
}

fn prefix(container_id: &str) -> Vec<u8> {
    format!("{container_id}\0").into_bytes()
}

/// The history as an [`crate::l1_leaves::events::Observer`]: it records every CNI request and every
/// delegate exec (their entries come with the events), and tells `dropped` when its writer
/// fell behind (the metrics count it). Nothing that emits knows of it.
pub struct Recorder {
    sink: Sink,
    dropped: crate::l1_leaves::events::Events,
}

impl Recorder {
    pub fn new(sink: Sink, dropped: crate::l1_leaves::events::Events) -> Self {
        Self { sink, dropped }
    }
}

impl crate::l1_leaves::events::Observer for Recorder {
    fn observe(&self, event: &crate::l1_leaves::events::Event<'_>) {
        use crate::l1_leaves::events::Event as E;
        let (container_id, record) = match event {
            E::Request {
                container_id,
                record,
                ..
            }
            | E::Exec {
                container_id,
                record,
                ..
            }
            | E::Freed {
                container_id,
                record,
                ..
            } => (*container_id, *record),
            _ => return,
        };
        if !container_id.is_empty() && !self.sink.record(container_id, record.clone()) {
            self.dropped.emit(E::HistoryDropped);
        }
    }

    fn wants_reports(&self) -> bool {
        false
    }
}

/// Starts the writer; returns the sink to record with.
pub fn start(ledger: Ledger) -> Sink {
    start_bounded(ledger, MAX_CONTAINERS)
}

/// The time of each container's last event and whose it is (from its keys), to know whose
/// history goes first when there are more than allowed. Built from the tree's keys on the
/// first write.
#[derive(Default)]
struct Index {
    built: bool,
    /// container -> (time part of its last key, its non-root caller; None: root's).
    last: std::collections::HashMap<String, (Vec<u8>, Option<u32>)>,
}

impl Index {
    fn note(&mut self, key: &[u8]) {
        let Some(sep) = key.iter().position(|b| *b == 0) else {
            return;
        };
        let cid = String::from_utf8_lossy(&key[..sep]);
        let rest = &key[sep + 1..];
        let (at, who) = rest.split_at(rest.len().min(WHEN));
        let uid = who
            .strip_prefix(b"u")
            .and_then(|u| std::str::from_utf8(u).ok()?.parse::<u32>().ok());
        match self.last.get_mut(cid.as_ref()) {
            Some((last, owner)) => {
                if last.as_slice() < at {
                    *last = at.to_vec();
                }
                // Root's once root touched it; else the latest caller's.
                if owner.is_some() {
                    *owner = uid;
                }
            }
            None => {
                self.last.insert(cid.into_owned(), (at.to_vec(), uid));
            }
        }
    }

    /// The containers beyond the bounds, oldest last event first; forgotten here: first each
    /// non-root caller's beyond [`per_uid`], then all non-root callers' beyond [`non_root`],
    /// then everyone's beyond `max`.
    fn evict(&mut self, max: usize) -> Vec<String> {
        let mut out = Vec::new();
        let uids: std::collections::BTreeSet<u32> =
            self.last.values().filter_map(|(_, o)| *o).collect();
        for uid in uids {
            out.extend(self.oldest_beyond(per_uid(max), |o| o == Some(uid)));
        }
        out.extend(self.oldest_beyond(non_root(max), |o| o.is_some()));
        out.extend(self.oldest_beyond(max, |_| true));
        out
    }

    /// The oldest of the containers whose owner `mine` takes, beyond `keep` of them;
    /// forgotten here.
    fn oldest_beyond(&mut self, keep: usize, mine: impl Fn(Option<u32>) -> bool) -> Vec<String> {
        let mut by_age: Vec<(&Vec<u8>, &String)> = self
            .last
            .iter()
            .filter(|(_, (_, o))| mine(*o))
            .map(|(cid, (at, _))| (at, cid))
            .collect();
        if by_age.len() <= keep {
            return Vec::new();
        }
        by_age.sort();
        let out: Vec<String> = by_age[..by_age.len() - keep]
            .iter()
            .map(|(_, cid)| (*cid).clone())
            .collect();
        for cid in &out {
            self.last.remove(cid);
        }
        out
    }
}

fn start_bounded(ledger: Ledger, max_containers: usize) -> Sink {
    let (tx, mut rx) = mpsc::channel::<Msg>(QUEUE);
    tokio::spawn(async move {
        let mut index = Some(Index::default());
        loop {
            let Some(first) = rx.recv().await else { return };
            let mut batch = Vec::new();
            let mut acks = Vec::new();
            let mut bytes = 0;
            match first {
                Msg::Event(ev) => {
                    bytes += ev.body.to_string().len();
                    batch.push(ev);
                }
                Msg::Flush(ack) => acks.push(ack),
            }
            // Gather what arrives within a second into one commit, of at most 512 events and
            // MAX_BATCH bytes; a flush writes at once.
            let deadline = tokio::time::sleep(Duration::from_secs(1));
            tokio::pin!(deadline);
            while acks.is_empty() && batch.len() < 512 && bytes < MAX_BATCH {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(Msg::Event(ev)) => {
                            bytes += ev.body.to_string().len();
                            batch.push(ev);
                        }
                        Some(Msg::Flush(ack)) => acks.push(ack),
                        None => break,
                    },
                    () = &mut deadline => break,
                }
            }
            if batch.is_empty() {
                for ack in acks {
                    let _ = ack.send(());
                }
                continue;
            }
            let ledger = ledger.clone();
            let mut idx = index.take().unwrap_or_default();
            index = tokio::task::spawn_blocking(move || {
                let _ = write(&ledger, &batch, &mut idx, max_containers);
                idx
            })
            .await
            .ok();
            for ack in acks {
                let _ = ack.send(());
            }
        }
    });
    Sink {
        tx: Some(tx),
        ..Sink::default()
    }
}

fn write(
    ledger: &Ledger,
    events: &[Event],
    index: &mut Index,
    max_containers: usize,
) -> Result<(), dipam_state::StoreError> {
    let store = ledger.store();
    if !index.built {
        for k in store.scan_keys(Tree::History, b"")? {
            index.note(&k);
        }
        index.built = true;
    }
    let mut batch = Batch::new();
    let mut touched: Vec<&str> = Vec::new();
    for ev in events {
        let k = key(&ev.container_id, &ev.body);
        index.note(&k);
        batch.put(Tree::History, k, ev.body.to_string().into_bytes());
        if !touched.contains(&ev.container_id.as_str()) {
            touched.push(&ev.container_id);
        }
    }
    // Into the kernel, not onto the disk (Durability::SurvivesProcessCrash): the history explains what
    // happened and survives a dipamd kill; a power cut may lose its last second, which is no
    // attachment's state. A synced batch, once a second, held up the commit of whichever ADD
    // came next by its fdatasync (docs/performance.md run 8).
    store.commit_with(batch, Durability::SurvivesProcessCrash)?;
    let mut prune = Batch::new();
    for cid in touched {
        let mut all = store.scan_keys(Tree::History, &prefix(cid))?;
        // In a root container, other callers' events (refused requests under its ID) keep
        // at most FOREIGN places, so they never push root's own events out.
        if index
            .last
            .get(cid)
            .is_some_and(|(_, owner)| owner.is_none())
        {
            let foreign: Vec<usize> = (0..all.len()).filter(|i| has_uid(&all[*i])).collect();
            if foreign.len() > FOREIGN {
                let gone = &foreign[..foreign.len() - FOREIGN];
                for i in gone {
                    prune.delete(Tree::History, all[*i].clone());
                }
                all = all
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !gone.contains(i))
                    .map(|(_, k)| k)
                    .collect();
            }
        }
        if all.len() > PER_CONTAINER {
            for k in &all[..all.len() - PER_CONTAINER] {
                prune.delete(Tree::History, k.clone());
            }
        }
    }
    for cid in index.evict(max_containers) {
        for k in store.scan_keys(Tree::History, &prefix(&cid))? {
            prune.delete(Tree::History, k);
        }
    }
    if !prune.is_empty() {
        store.commit_with(prune, Durability::SurvivesProcessCrash)?;
    }
    Ok(())
}

/// Every recorded event of `container_id`, oldest first.
pub fn read(ledger: &Ledger, container_id: &str) -> Result<Vec<Value>, dipam_state::StoreError> {
    Ok(ledger
        .store()
        .scan_prefix(Tree::History, &prefix(container_id))?
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use dipam_state::MemStore;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_event_is_bounded_whatever_it_holds() {
        let huge = "v".repeat(900_000);
        let ev = bounded(json!({"kind": "request", "msg": huge, "env": {"CNI_ARGS": huge}}));
        assert!(
            ev.to_string().len() < 4 * MAX_STRING,
            "{}",
            ev.to_string().len()
        );
        assert!(
            ev["msg"]
                .as_str()
                .unwrap()
                .ends_with("(900000 bytes; clipped)")
        );
        let many: Vec<String> = (0..2000).map(|i| format!("10.0.{i}.1/24")).collect();
        let ev = bounded(json!({"kind": "request", "code": 7, "result": {"ips": many}}));
        assert!(ev.to_string().len() <= MAX_EVENT);
        assert_eq!(ev["clipped"], true);
        assert_eq!(ev["code"], 7);
        let small = json!({"kind": "exec", "exit": "exited with status 0"});
        assert_eq!(bounded(small.clone()), small);
    }

    #[tokio::test]
    async fn events_are_written_in_order_and_bounded_per_container() {
        let ledger = Ledger::shared(MemStore::new());
        let sink = start(ledger.clone());
        for i in 0..(PER_CONTAINER + 10) {
            sink.record("c1", json!({"kind": "request", "i": i}));
        }
        sink.record("c2", json!({"kind": "exec"}));
        sink.record("", json!({"kind": "ignored"}));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let c1 = read(&ledger, "c1").unwrap();
        assert_eq!(c1.len(), PER_CONTAINER);
        assert_eq!(c1.last().unwrap()["i"], PER_CONTAINER + 9);
        assert_eq!(c1[0]["i"], 10, "the oldest go first");
        assert_eq!(read(&ledger, "c2").unwrap().len(), 1);
        // "c1" must not see "c10"'s events: the prefix ends at the separator.
        sink.record("c10", json!({"kind": "x"}));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(read(&ledger, "c1").unwrap().len(), PER_CONTAINER);
    }

    /// One allowed uid churning container IDs, and several together, never push root's
    /// containers out: each uid keeps at most a quarter, all of them half.
    #[tokio::test]
    async fn a_non_root_caller_takes_at_most_its_share_of_the_containers() {
        let ledger = Ledger::shared(MemStore::new());
        let sink = start_bounded(ledger.clone(), 16);
        for i in 0..6 {
            sink.record(&format!("root{i}"), json!({"kind": "request"}));
        }
        // An attacker's refused request under root's container: root's it stays.
        sink.record("root0", json!({"kind": "request", "uid": 1000}));
        tokio::time::sleep(Duration::from_millis(5)).await;
        for uid in [1000, 1001, 1002] {
            for i in 0..20 {
                sink.record(
                    &format!("u{uid}-{i}"),
                    json!({"kind": "request", "uid": uid}),
                );
            }
        }
        sink.flush().await;
        for i in 0..6 {
            assert!(
                !read(&ledger, &format!("root{i}")).unwrap().is_empty(),
                "root{i}"
            );
        }
        let kept = |uid: u32| {
            (0..20)
                .filter(|i| !read(&ledger, &format!("u{uid}-{i}")).unwrap().is_empty())
                .count()
        };
        let (a, b, c) = (kept(1000), kept(1001), kept(1002));
        assert!(a <= 4 && b <= 4 && c <= 4, "{a} {b} {c}");
        assert!(a + b + c <= 8, "{a} {b} {c}");
        // The newest of each uid are the ones kept.
        assert!(!read(&ledger, "u1002-19").unwrap().is_empty());
        // Under root's container ID, the others' events take at most FOREIGN places.
        for i in 0..PER_CONTAINER {
            sink.record("root1", json!({"kind": "request", "uid": 1000, "i": i}));
        }
        sink.flush().await;
        let root1 = read(&ledger, "root1").unwrap();
        assert_eq!(root1.len(), FOREIGN + 1, "root's own event is kept");
        assert!(root1[0].get("uid").is_none(), "{}", root1[0]);
        // An index rebuilt from the keys knows whose each container is.
        let mut idx = Index::default();
        for k in ledger.store().scan_keys(Tree::History, b"").unwrap() {
            idx.note(&k);
        }
        assert_eq!(idx.last["root0"].1, None);
        assert_eq!(idx.last["u1002-19"].1, Some(1002));
    }

    #[tokio::test]
    async fn only_the_most_recent_containers_keep_their_history() {
        let ledger = Ledger::shared(MemStore::new());
        // History an earlier run left: the index is built from the tree's keys.
        let old = Event {
            container_id: "old".into(),
            body: json!({"atMs": 1, "seq": 0}),
        };
        let mut idx = Index::default();
        write(&ledger, &[old], &mut idx, 100).unwrap();
        let sink = start_bounded(ledger.clone(), 3);
        for (i, cid) in ["a", "b", "c", "d"].iter().enumerate() {
            sink.record(cid, json!({"kind": "request", "i": i}));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            read(&ledger, "old").unwrap().is_empty(),
            "the oldest went first"
        );
        assert!(read(&ledger, "a").unwrap().is_empty());
        for cid in ["b", "c", "d"] {
            assert_eq!(read(&ledger, cid).unwrap().len(), 1, "{cid}");
        }
    }
}
