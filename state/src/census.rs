//! What dipamd asks of the whole ledger on a request's path, kept beside it instead of read
//! from it: how many records there are, which uid created each and how large it is, and
//! which attachments use a container ID. Each of these was one scan of every record per
//! request: a non-root ADD counted its uid's records and looked for its container ID in
//! every record, and `dipamctl status` counted them all, so at 2,500 attachments a
//! non-root ADD and a status call paid for 2,500 decoded records (docs/performance.md).
//!
//! The census is built from one scan (dipamd does it at start, before serving) and then
//! follows every commit [`Ledger`](crate::Ledger) makes: a put replaces the key's entry, a
//! delete drops it. Both are keyed by the attachment, so an update is idempotent, and the
//! census is exact as long as the commits of one key are not concurrent (dipamd writes a key
//! only under that key's lock). Nothing of it is on disk: a restart or a crash rebuilds it
//! from the ledger, which is the truth.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use crate::record::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};

/// Who holds a recorded address, for the per-network counts (`dipamctl status`'s ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Pod,
    Agent,
    Pool,
}

/// A count per holder: the addresses one group of records holds in one family, or its
/// records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub pods: u64,
    pub agent: u64,
    pub pool: u64,
}

impl Held {
    fn slot(&mut self, h: Holder) -> &mut u64 {
        match h {
            Holder::Pod => &mut self.pods,
            Holder::Agent => &mut self.agent,
            Holder::Pool => &mut self.pool,
        }
    }
}

/// Records that share a network, a creator and a delegate config (less its per-pod parts):
/// the same delegate store, so one of them stands for all when dipamd needs the config.
/// `dipamctl status` counted its ranges by reading every record of every network (and
/// decoding every record's config to find the networks): 1.3 s at 2,500 attachments.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub network: String,
    pub creator_uid: Option<u32>,
    /// A digest of the delegate's type and config without `runtimeConfig`, `args` and
    /// `prevResult` (what differs from pod to pod and never moves the store).
    pub config: u64,
}

/// One group's addresses and members.
#[derive(Debug, Default)]
pub struct Group {
    /// Recorded addresses per family.
    pub v4: Held,
    pub v6: Held,
    /// Its records per holder, in any state: an ADD not yet answered (`adding`) holds no
    /// address yet but will, and a `deleting` one still does until its DEL is done. The warm
    /// pool sizes itself by these (pool/census.rs), which once decoded every record of the
    /// network per refill round to count them.
    pub records: Held,
    members: HashSet<Arc<AttachmentKey>>,
}

impl Group {
    /// A member whose record carries the group's config.
    pub fn sample(&self) -> Option<&AttachmentKey> {
        self.members.iter().next().map(|k| &**k)
    }

    /// How many records the group holds.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// The digest a record's group is keyed by (see [`GroupKey::config`]).
fn config_digest(delegate_type: &str, config: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    delegate_type.hash(&mut h);
    match serde_json::from_str::<serde_json::Value>(config) {
        Ok(serde_json::Value::Object(mut m)) => {
            for per_pod in ["runtimeConfig", "args", "prevResult"] {
                m.remove(per_pod);
            }
            serde_json::Value::Object(m).to_string().hash(&mut h);
        }
        _ => config.hash(&mut h),
    }
    h.finish()
}

/// The families of a normalized result's addresses (`ips[].address`, `10.0.0.5/24`).
fn families(result: Option<&serde_json::Value>) -> (u64, u64) {
    let mut out = (0, 0);
    let ips = result
        .and_then(|r| r.get("ips"))
        .and_then(serde_json::Value::as_array);
    for ip in ips.into_iter().flatten() {
        let Some(addr) = ip.get("address").and_then(serde_json::Value::as_str) else {
            continue;
        };
        match addr.split('/').next().unwrap_or_default().parse() {
            Ok(std::net::IpAddr::V4(_)) => out.0 += 1,
            Ok(std::net::IpAddr::V6(_)) => out.1 += 1,
            Err(_) => {}
        }
    }
    out
}

/// What the census keeps of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The non-root uid whose ADD created it (None: root, the agent, the pool).
    pub creator_uid: Option<u32>,
    /// Its size as encoded in the ledger.
    pub bytes: u64,
    /// The container ID the delegate holds it under, when not the key's.
    pub delegate_cid: Option<String>,
    /// The group it belongs to (one allocation its members share), who holds its addresses
    /// and how many of each family.
    pub group: Arc<GroupKey>,
    pub holder: Holder,
    pub addrs: (u64, u64),
    /// Where its operation stands: the start's replay looks for those not committed
    /// without reading every record.
    pub state: AttachmentState,
}

impl Entry {
    fn of(rec: &AttachmentRecord, bytes: u64) -> Self {
        let delegate_cid = rec
            .delegate_key
            .as_ref()
            .filter(|d| d.container_id != rec.key.container_id)
            .map(|d| d.container_id.clone());
        Self {
            creator_uid: rec.creator_uid,
            bytes,
            delegate_cid,
            group: Arc::new(GroupKey {
                network: rec.key.network.clone(),
                creator_uid: rec.creator_uid,
                config: config_digest(&rec.delegate_type, &rec.delegate_config),
            }),
            holder: match rec.owner {
                Owner::Pod => Holder::Pod,
                Owner::Agent { .. } => Holder::Agent,
                Owner::Pool => Holder::Pool,
            },
            addrs: families(rec.result.as_ref()),
            state: rec.state,
        }
    }
}

/// The counts, as one view under the census's lock.
///
/// Each record's key is one allocation that the entries, its group's members and the
/// container-ID index share, and a container ID used by one attachment (nearly every one)
/// holds a one-element list: they held three copies of every key and a hash set per
/// container ID, ~1.1 KB per record, 11.3 MB at 10,000 attachments, for the life of dipamd
/// (docs/performance.md, run 48).
#[derive(Debug, Default)]
pub struct Counts {
    entries: HashMap<Arc<AttachmentKey>, Entry>,
    /// uid -> (records, bytes) of the records it created.
    by_uid: HashMap<u32, (usize, u64)>,
    /// container ID (the key's or the delegate's) -> the attachments using it.
    by_cid: HashMap<Box<str>, Vec<Arc<AttachmentKey>>>,
    /// The records' groups (same network, creator and store), with their addresses.
    groups: HashMap<Arc<GroupKey>, Group>,
}

impl Counts {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The records `uid` created and their bytes.
    pub fn of_uid(&self, uid: u32) -> (usize, u64) {
        self.by_uid.get(&uid).copied().unwrap_or_default()
    }

    /// The entry of `key`'s record, if there is one.
    pub fn entry(&self, key: &AttachmentKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The attachments whose key or delegate key uses container ID `cid`, with their
    /// creators.
    pub fn using_container_id<'a>(
        &'a self,
        cid: &str,
    ) -> impl Iterator<Item = (&'a AttachmentKey, Option<u32>)> + 'a {
        self.by_cid
            .get(cid)
            .into_iter()
            .flatten()
            .filter_map(|k| self.entries.get(k).map(|e| (&**k, e.creator_uid)))
    }

    /// The keys of the records whose entry `pred` accepts, sorted: what a pass over a few
    /// kinds of record (those not committed, the pool's, the agent's) reads instead of every
    /// record ([`Ledger::select`](crate::Ledger::select)).
    pub fn keys_where(&self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<AttachmentKey> {
        let mut keys: Vec<AttachmentKey> = self
            .entries
            .iter()
            .filter(|(_, e)| pred(e))
            .map(|(k, _)| AttachmentKey::clone(k))
            .collect();
        keys.sort();
        keys
    }

    /// Whether any record's entry `pred` accepts (no keys gathered).
    pub fn any(&self, pred: impl FnMut(&Entry) -> bool) -> bool {
        self.entries.values().any(pred)
    }

    /// Every container ID a record uses (its key's, or the delegate's when that differs).
    pub fn container_ids(&self) -> impl Iterator<Item = &str> {
        self.by_cid.keys().map(|c| &**c)
    }

    /// Every group of records, with its addresses per family and holder.
    pub fn groups(&self) -> impl Iterator<Item = (&GroupKey, &Group)> {
        self.groups.iter().map(|(k, g)| (&**k, g))
    }

    /// The group `key`, if it has members.
    pub fn group(&self, key: &GroupKey) -> Option<&Group> {
        self.groups.get(key)
    }

    /// The records of `network` per holder, in any state, over all its groups (creators and
    /// configs): one visit per group, never per record.
    pub fn records_of(&self, network: &str) -> Held {
        let mut out = Held::default();
        for g in self.groups.iter().filter(|(k, _)| k.network == network) {
            out.pods += g.1.records.pods;
            out.agent += g.1.records.agent;
            out.pool += g.1.records.pool;
        }
        out
    }

    fn insert(&mut self, key: AttachmentKey, mut entry: Entry) {
        self.remove(&key);
        let key = Arc::new(key);
        // The group's key, shared by its members' entries.
        if let Some((k, _)) = self.groups.get_key_value(&*entry.group) {
            entry.group = Arc::clone(k);
        }
        let g = self.groups.entry(Arc::clone(&entry.group)).or_default();
        *g.v4.slot(entry.holder) += entry.addrs.0;
        *g.v6.slot(entry.holder) += entry.addrs.1;
        *g.records.slot(entry.holder) += 1;
        g.members.insert(Arc::clone(&key));
        if let Some(uid) = entry.creator_uid {
            let t = self.by_uid.entry(uid).or_default();
            t.0 += 1;
            t.1 += entry.bytes;
        }
        for cid in std::iter::once(&key.container_id).chain(entry.delegate_cid.as_ref()) {
            let using = self.by_cid.entry(cid.as_str().into()).or_default();
            // The key's own ID and its delegate's may be the same text: listed once.
            if !using.iter().any(|k| Arc::ptr_eq(k, &key)) {
                using.push(Arc::clone(&key));
                using.shrink_to_fit();
            }
        }
        self.entries.insert(key, entry);
    }

    fn remove(&mut self, key: &AttachmentKey) {
        let Some(old) = self.entries.remove(key) else {
            return;
        };
        if let Some(g) = self.groups.get_mut(&*old.group) {
            *g.v4.slot(old.holder) -= old.addrs.0;
            *g.v6.slot(old.holder) -= old.addrs.1;
            *g.records.slot(old.holder) -= 1;
            g.members.remove(key);
            if g.members.is_empty() {
                self.groups.remove(&*old.group);
            }
        }
        if let Some(uid) = old.creator_uid
            && let Some(t) = self.by_uid.get_mut(&uid)
        {
            t.0 -= 1;
            t.1 -= old.bytes;
            if t.0 == 0 {
                self.by_uid.remove(&uid);
            }
        }
        for cid in std::iter::once(&key.container_id).chain(old.delegate_cid.as_ref()) {
            if let Some(using) = self.by_cid.get_mut(cid.as_str()) {
                using.retain(|k| **k != *key);
                if using.is_empty() {
                    self.by_cid.remove(cid.as_str());
                }
            }
        }
    }
}

/// The census of one ledger, shared by its clones; built on first use.
#[derive(Debug, Default)]
pub(crate) struct Census {
    counts: Mutex<Option<Counts>>,
    /// Full scans the census made (tests: a request must not cause one).
    scans: std::sync::atomic::AtomicU64,
}

/// One change a commit made, applied once the commit succeeded.
pub(crate) enum Change {
    Put(AttachmentKey, Entry),
    Gone(AttachmentKey),
}

impl Change {
    pub(crate) fn put(rec: &AttachmentRecord, bytes: usize) -> Self {
        Change::Put(rec.key.clone(), Entry::of(rec, bytes as u64))
    }
}

impl Census {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Counts>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the counts, building them first with `scan` if they were never built:
    /// `scan` hands every record and its encoded size, one at a time, to the function it is
    /// given, so no more than one record is decoded at once (at 10,000 attachments the start
    /// once held every record decoded, twice: docs/performance.md, run 29). Whether the
    /// counts were built by this call is returned beside `f`'s answer.
    pub(crate) fn with<R, E>(
        &self,
        scan: impl FnOnce(&mut dyn FnMut(&AttachmentRecord, usize)) -> Result<(), E>,
        f: impl FnOnce(&Counts) -> R,
    ) -> Result<(R, bool), E> {
        let mut counts = self.lock();
        let mut built_now = false;
        if counts.is_none() {
            // Built under the lock: a commit that lands during the scan applies its change
            // after it (it waits for the lock), and a change is idempotent.
            let mut built = Counts::default();
            scan(&mut |rec, bytes| built.insert(rec.key.clone(), Entry::of(rec, bytes as u64)))?;
            self.scans
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *counts = Some(built);
            built_now = true;
        }
        Ok((f(counts.as_ref().expect("built above")), built_now))
    }

    /// Applies what a successful commit changed; nothing while the census is not built (its
    /// scan will read the commit).
    pub(crate) fn apply(&self, changes: Vec<Change>) {
        let mut counts = self.lock();
        let Some(c) = counts.as_mut() else {
            return;
        };
        for change in changes {
            match change {
                Change::Put(k, e) => c.insert(k, e),
                Change::Gone(k) => c.remove(&k),
            }
        }
    }

    pub(crate) fn scans(&self) -> u64 {
        self.scans.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use crate::{AttachmentKey, DelegateKey, Durability, Ledger, MemStore, Store, Tree};

    /// What a fresh scan of the ledger would count: the census must always agree with it.
    fn rebuilt(store: std::sync::Arc<MemStore>) -> Vec<(Option<u32>, usize, u64)> {
        now(&Ledger::from_arc(store))
    }

    fn now(l: &Ledger<MemStore>) -> Vec<(Option<u32>, usize, u64)> {
        let mut out: Vec<_> = [None, Some(7), Some(8)]
            .into_iter()
            .map(|uid| {
                let (n, b) = match uid {
                    Some(u) => l.census(|c| c.of_uid(u)).unwrap(),
                    None => (l.count().unwrap(), 0),
                };
                (uid, n, b)
            })
            .collect();
        out.sort();
        out
    }

    /// Every write path of the ledger keeps the census equal to a rebuild from the records,
    /// with no scan after the first; the container-ID index follows the delegate's key too.
    #[test]
    fn the_census_follows_every_commit_without_scanning() {
        let store = std::sync::Arc::new(MemStore::new());
        let l = Ledger::from_arc(store.clone());
        assert_eq!(l.count().unwrap(), 0);
        assert_eq!(l.census_scans(), 1);
        let mut a = crate::suite::record("n", "a", "eth0");
        a.creator_uid = Some(7);
        let mut b = crate::suite::record("n", "b", "eth0");
        b.creator_uid = Some(7);
        b.delegate_config = "x".repeat(5000);
        let mut c = crate::suite::record("m", "a", "eth0");
        c.creator_uid = Some(8);
        l.put(&a).unwrap();
        l.put_all(&[b.clone(), c.clone()], Durability::SurvivesPowerCut)
            .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        let (n, bytes) = l.census(|c| c.of_uid(7)).unwrap();
        assert_eq!(n, 2);
        assert!(bytes > 5000, "{bytes}");
        assert_eq!(l.census(|c| c.using_container_id("a").count()).unwrap(), 2);
        // A pooled attachment handed to a pod: the delegate's container ID names it too.
        let mut taken = crate::suite::record("n", "pod", "eth0");
        taken.delegate_key = Some(DelegateKey {
            container_id: "dipam-pool-1".into(),
            ifname: "eth0".into(),
            netns: String::new(),
            cni_args: String::new(),
        });
        l.put_removing(&taken, &a.key, Durability::SurvivesPowerCut)
            .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        let pool: Vec<_> = l
            .census(|c| {
                c.using_container_id("dipam-pool-1")
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap();
        assert_eq!(pool, vec![taken.key.clone()]);
        // Replacing a record counts it once, with its new size.
        b.delegate_config.clear();
        l.put(&b).unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        l.remove(&b.key).unwrap();
        l.remove_all(
            &[c.key.clone(), AttachmentKey::new("x", "y", "z")],
            Durability::SurvivesPowerCut,
        )
        .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        assert_eq!(l.census(|c| c.of_uid(7)).unwrap(), (0, 0));
        assert_eq!(l.census(|c| c.using_container_id("a").count()).unwrap(), 0);
        assert_eq!(l.census_scans(), 1, "a commit made the census scan again");
        assert_eq!(store.len(Tree::Attachments).unwrap(), l.count().unwrap());
    }

    /// The groups as a comparable list: (group, v4, v6, members, records per holder).
    type Groups = Vec<(
        crate::GroupKey,
        crate::Held,
        crate::Held,
        usize,
        crate::Held,
    )>;

    fn groups<S: Store + ?Sized>(l: &Ledger<S>) -> Groups {
        let mut out: Groups = l
            .census(|c| {
                c.groups()
                    .map(|(k, g)| (k.clone(), g.v4, g.v6, g.len(), g.records))
                    .collect()
            })
            .unwrap();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// A network's records per holder, in any state, counted from the records themselves:
    /// what `Counts::records_of` must always equal.
    fn records_scanned<S: Store + ?Sized>(l: &Ledger<S>, network: &str) -> crate::Held {
        let mut out = crate::Held::default();
        for r in l.list(Some(network)).unwrap() {
            match r.owner {
                crate::Owner::Pod => out.pods += 1,
                crate::Owner::Agent { .. } => out.agent += 1,
                crate::Owner::Pool => out.pool += 1,
            }
        }
        out
    }

    /// `Counts::records_of` equals a count of the records in every network (one absent),
    /// and is `n` in network "n".
    fn records_per_holder<S: Store + ?Sized>(l: &Ledger<S>, n: crate::Held) {
        for net in ["n", "m", "absent"] {
            assert_eq!(
                l.census(|c| c.records_of(net)).unwrap(),
                records_scanned(l, net),
                "{net}"
            );
        }
        assert_eq!(l.census(|c| c.records_of("n")).unwrap(), n);
    }

    /// Records of two networks, a second config, a non-root creator, the agent and the pool,
    /// IPv4 and IPv6: what `dipamctl status`'s ranges are counted from.
    fn mixed() -> Vec<crate::AttachmentRecord> {
        let mut out = Vec::new();
        for i in 0..6 {
            let mut r = crate::suite::record("n", &format!("p{i}"), "eth0");
            // Per-pod parts of the config do not split a group.
            r.delegate_config = format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"host-local","args":{{"i":{i}}},"runtimeConfig":{{"x":{i}}}}}"#
            );
            out.push(r);
        }
        let mut dual = crate::suite::record("n", "dual", "eth0");
        dual.result =
            Some(serde_json::json!({"ips":[{"address":"10.1.0.9/24"},{"address":"fd00::9/64"}]}));
        out.push(dual);
        let mut agent = crate::suite::record("n", "agent", "eth0");
        agent.owner = crate::Owner::Agent {
            role: "router".into(),
        };
        out.push(agent);
        let mut pool = crate::suite::record("n", "dipam-pool-x-1", "eth0");
        pool.owner = crate::Owner::Pool;
        out.push(pool);
        let mut other = crate::suite::record("n", "other-store", "eth0");
        other.delegate_config =
            r#"{"cniVersion":"1.0.0","name":"n","type":"host-local","ipam":{"dataDir":"/x"}}"#
                .into();
        out.push(other);
        let mut uid = crate::suite::record("n", "mine", "eth0");
        uid.creator_uid = Some(1000);
        out.push(uid);
        let mut adding = crate::suite::record("m", "adding", "eth0");
        adding.result = None;
        adding.state = crate::AttachmentState::Adding;
        out.push(adding);
        // A DEL under way: its address is still held until the delegate's DEL is done.
        let mut deleting = crate::suite::record("m", "deleting", "eth0");
        deleting.state = crate::AttachmentState::Deleting;
        out.push(deleting);
        out
    }

    /// The per-group address counts follow every commit (put, replace, batch, the pool's
    /// take, delete) and always equal a rebuild from the records; per-pod parts of the config
    /// do not split a group.
    #[test]
    fn the_groups_follow_every_commit_and_equal_a_rebuild() {
        let store = std::sync::Arc::new(MemStore::new());
        let l = Ledger::from_arc(store.clone());
        assert!(groups(&l).is_empty());
        let recs = mixed();
        l.put_all(&recs, Durability::SurvivesPowerCut).unwrap();
        let g = groups(&l);
        assert_eq!(g, groups(&Ledger::from_arc(store.clone())));
        let n: Vec<_> = g.iter().filter(|x| x.0.network == "n").collect();
        // Root's default config, the other store, uid 1000.
        assert_eq!(n.len(), 3, "{g:#?}");
        let main = n.iter().find(|x| x.3 == 9).expect("one group of 9");
        assert_eq!(
            (main.1, main.2),
            (
                crate::Held {
                    pods: 7,
                    agent: 1,
                    pool: 1
                },
                crate::Held {
                    pods: 1,
                    agent: 0,
                    pool: 0
                }
            ),
            "{g:#?}"
        );
        // An ADD not yet answered holds no address, but belongs to its group and counts as a
        // record (the warm pool counts it as in use); a DEL under way still holds its own.
        let m = g.iter().find(|x| x.0.network == "m").unwrap();
        let (one, two) = (
            crate::Held {
                pods: 1,
                ..Default::default()
            },
            crate::Held {
                pods: 2,
                ..Default::default()
            },
        );
        assert_eq!((m.1, m.3, m.4), (one, 2, two), "{g:#?}");
        records_per_holder(
            &l,
            crate::Held {
                pods: 9,
                agent: 1,
                pool: 1,
            },
        );
        // The pool's take: the pool's record leaves, a pod's arrives, in one commit.
        let mut taken = crate::suite::record("n", "taker", "eth0");
        taken.delegate_key = Some(DelegateKey {
            container_id: "dipam-pool-x-1".into(),
            ifname: "eth0".into(),
            netns: String::new(),
            cni_args: String::new(),
        });
        l.put_removing(&taken, &recs[8].key, Durability::SurvivesPowerCut)
            .unwrap();
        // A result replaced (an ADD answered), a record removed, a batch removed.
        let mut answered = recs[11].clone();
        answered.result = Some(serde_json::json!({"ips":[{"address":"10.2.0.1/24"}]}));
        l.put(&answered).unwrap();
        l.remove(&recs[0].key).unwrap();
        l.remove_all(
            &[recs[1].key.clone(), recs[10].key.clone()],
            Durability::SurvivesPowerCut,
        )
        .unwrap();
        let g = groups(&l);
        assert_eq!(g, groups(&Ledger::from_arc(store.clone())));
        let main = g
            .iter()
            .find(|x| x.0.network == "n" && x.0.creator_uid.is_none() && x.3 == 7);
        assert_eq!(
            main.map(|x| x.1),
            Some(crate::Held {
                pods: 6,
                agent: 1,
                pool: 0
            }),
            "{g:#?}"
        );
        assert_eq!(g.iter().filter(|x| x.0.network == "n").count(), 2, "{g:#?}");
        // The records per holder followed the take (a pool record became a pod's), the
        // answer (still `adding`) and the removals, and equal a count of the records.
        records_per_holder(
            &l,
            crate::Held {
                pods: 7,
                agent: 1,
                pool: 0,
            },
        );
        assert_eq!(l.census(|c| c.records_of("m")).unwrap().pods, 2);
        assert_eq!(l.census_scans(), 1, "a commit made the census scan again");
    }

    /// After a restart the counts are rebuilt from the records sled and the journal hold:
    /// commits that reached only the journal (a kill before sled wrote them) are replayed
    /// before the census is built, so the counts cannot drift from the records.
    #[test]
    fn the_groups_after_a_restart_are_the_records_with_the_journal_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let recs = mixed();
        let before = {
            let l = Ledger::new(crate::sled_store::SledStore::open(dir.path()).unwrap());
            l.put_all(&recs, Durability::SurvivesProcessCrash).unwrap();
            l.remove(&recs[3].key).unwrap();
            groups(&l)
        };
        let l = Ledger::new(crate::sled_store::SledStore::open(dir.path()).unwrap());
        assert_eq!(groups(&l), before);
        // Two commits that only the journal holds, as a kill leaves them.
        drop(l);
        let text =
            std::fs::read_to_string(dir.path().join(crate::sled_store::WITNESS_FILE)).unwrap();
        let seq: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (mut journal, _, _) = crate::journal::Journal::open(dir.path()).unwrap();
        let mut put = crate::Batch::new();
        let mut dual = recs[6].clone();
        dual.key.container_id = "dual-2".into();
        put.put(
            Tree::Attachments,
            dual.key.encode().unwrap(),
            serde_json::to_vec(&dual).unwrap(),
        );
        journal.append(seq + 1, &put).unwrap();
        let mut gone = crate::Batch::new();
        gone.delete(Tree::Attachments, recs[7].key.encode().unwrap());
        journal.append(seq + 2, &gone).unwrap();
        drop(journal);
        let l = Ledger::new(crate::sled_store::SledStore::open(dir.path()).unwrap());
        let after = groups(&l);
        let main = |g: &Groups| {
            g.iter()
                .find(|x| x.0.network == "n" && x.0.creator_uid.is_none() && x.3 >= 8)
                .map(|x| (x.1, x.2, x.3))
        };
        let (v4, v6, n) = main(&before).unwrap();
        assert_eq!(
            main(&after),
            Some((
                crate::Held {
                    pods: v4.pods + 1,
                    agent: v4.agent - 1,
                    pool: v4.pool
                },
                crate::Held {
                    pods: v6.pods + 1,
                    ..v6
                },
                n
            )),
            "{before:#?}\n{after:#?}"
        );
        assert_eq!(l.count().unwrap(), recs.len() - 1);
    }
}
