//! Typed attachment records over any [`Store`]: the daemon's view of the ledger.
//!
//! One record per CNI attachment, keyed the way the CNI spec identifies an attachment
//! (network name, container id, ifname), stored as JSON in [`Tree::Attachments`].

use std::fmt;
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::{
    Batch, Durability, Store, StoreError, Tree,
    census::{Census, Change, Counts, Entry as CensusEntry, GroupKey, Held},
    record::{AttachmentKey, AttachmentRecord},
};

/// Typed access to the attachment records of a [`Store`].
///
/// Cheap to clone (it shares the store through an `Arc`), so each tokio task can hold its
/// own. Every method blocks; call it from `spawn_blocking`.
///
/// The store is shared as `Arc<dyn Store>` by default (`Ledger` alone): dipamd names no
/// store type outside this crate, and a store call costs one indirect call, small beside
/// the work it does. A concrete `Ledger<S>` stays available for tests of one store.
pub struct Ledger<S: Store + ?Sized = dyn Store> {
    store: Arc<S>,
    /// Counts kept beside the records (census.rs), shared by the clones.
    census: Arc<Census>,
}

impl<S: Store + ?Sized> Clone for Ledger<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            census: Arc::clone(&self.census),
        }
    }
}

impl<S: Store + fmt::Debug + ?Sized> fmt::Debug for Ledger<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("store", &self.store)
            .finish()
    }
}

/// Adds `rec`, encoded, to `batch` under its key; returns the census's change.
fn put_record(batch: &mut Batch, rec: &AttachmentRecord) -> Result<Change, StoreError> {
    let value = serde_json::to_vec(rec)
        .map_err(|e| StoreError::Backend(format!("cannot encode record {}: {e}", rec.key)))?;
    let change = Change::put(rec, value.len());
    batch.put(Tree::Attachments, rec.key.encode()?, value);
    Ok(change)
}

impl<S: Store> Ledger<S> {
    /// Wraps `store`.
    pub fn new(store: S) -> Self {
        Self {
            store: Arc::new(store),
            census: Arc::default(),
        }
    }

    /// The same ledger, its store's type erased.
    pub fn erased(self) -> Ledger {
        Ledger {
            store: self.store,
            census: self.census,
        }
    }
}

impl Ledger {
    /// Wraps `store`, its type erased: what dipamd holds.
    pub fn shared(store: impl Store) -> Self {
        Self {
            store: Arc::new(store),
            census: Arc::default(),
        }
    }
}

impl<S: Store + ?Sized> Ledger<S> {
    /// Wraps a store that is already shared.
    pub fn from_arc(store: Arc<S>) -> Self {
        Self {
            store,
            census: Arc::default(),
        }
    }

    /// Commits `batch` and, once it is committed, tells the census what it changed.
    fn commit_counted(
        &self,
        batch: Batch,
        durability: Durability,
        changes: Vec<Change>,
    ) -> Result<(), StoreError> {
        self.store.commit_with(batch, durability)?;
        self.census.apply(changes);
        Ok(())
    }

    /// The record for `key`, if any.
    pub fn get(&self, key: &AttachmentKey) -> Result<Option<AttachmentRecord>, StoreError> {
        let raw_key = key.encode()?;
        self.store
            .get(Tree::Attachments, &raw_key)?
            .map(|value| decode_record(&raw_key, &value))
            .transpose()
    }

    /// Inserts or replaces the record under `rec.key`; durable (on the disk) when it returns.
    pub fn put(&self, rec: &AttachmentRecord) -> Result<(), StoreError> {
        self.put_with(rec, Durability::SurvivesPowerCut)
    }

    /// [`Ledger::put`], as durable as `durability` says (see [`Durability`] for when the disk
    /// may wait).
    pub fn put_with(
        &self,
        rec: &AttachmentRecord,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        let change = put_record(&mut batch, rec)?;
        self.commit_counted(batch, durability, vec![change])
    }

    /// Writes `rec` and removes the record under `gone` in one atomic commit, as durable as
    /// `durability` says: both happen or neither does. The warm pool hands an entry to a pod
    /// this way, so there is no moment at which the address belongs to both or to neither.
    pub fn put_removing(
        &self,
        rec: &AttachmentRecord,
        gone: &AttachmentKey,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.delete(Tree::Attachments, gone.encode()?);
        let change = put_record(&mut batch, rec)?;
        self.commit_counted(batch, durability, vec![Change::Gone(gone.clone()), change])
    }

    /// Writes every record of `recs` in one atomic commit, as durable as `durability` says:
    /// GC marks a batch of stale records `deleting` with one disk write, not one per record.
    pub fn put_all(
        &self,
        recs: &[AttachmentRecord],
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        let changes = recs
            .iter()
            .map(|rec| put_record(&mut batch, rec))
            .collect::<Result<_, _>>()?;
        self.commit_counted(batch, durability, changes)
    }

    /// Removes the records of `keys` in one atomic commit, as durable as `durability` says.
    /// Removing an absent key is `Ok`.
    pub fn remove_all(
        &self,
        keys: &[AttachmentKey],
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        for key in keys {
            batch.delete(Tree::Attachments, key.encode()?);
        }
        let changes = keys.iter().cloned().map(Change::Gone).collect();
        self.commit_counted(batch, durability, changes)
    }

    /// Removes the record for `key`; durable when it returns. Removing an absent key is `Ok`.
    pub fn remove(&self, key: &AttachmentKey) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.delete(Tree::Attachments, key.encode()?);
        self.commit_counted(
            batch,
            Durability::SurvivesPowerCut,
            vec![Change::Gone(key.clone())],
        )
    }

    /// Every record, or only those of `network`, sorted by key.
    pub fn list(&self, network: Option<&str>) -> Result<Vec<AttachmentRecord>, StoreError> {
        self.list_where(network, |_| true)
    }

    /// The records (of `network`, or all) that `keep` accepts, sorted by key, decoded one at
    /// a time: the others are never held, so a pass that wants a few kinds of record holds
    /// those, not the ledger.
    pub fn list_where(
        &self,
        network: Option<&str>,
        mut keep: impl FnMut(&AttachmentRecord) -> bool,
    ) -> Result<Vec<AttachmentRecord>, StoreError> {
        let mut out = Vec::new();
        self.for_each(network, |rec, _| {
            if keep(&rec) {
                out.push(rec);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// One page of a listing (`dipamctl attachments`): the first `limit` (at least 1)
    /// records (of `network`, or all) after the key `after` that `keep` accepts, in key
    /// order, decoding one at a time and stopping once the page is full and one more
    /// accepted record shows there are more; with the key the next page starts after
    /// (`None`: this page is the last). A listing thus holds a page, never the ledger, and
    /// a record present throughout it is listed once whatever is added or removed between
    /// pages (not a snapshot: those may or may not be).
    pub fn page(
        &self,
        network: Option<&str>,
        after: Option<&[u8]>,
        limit: usize,
        mut keep: impl FnMut(&AttachmentRecord) -> bool,
    ) -> Result<(Vec<AttachmentRecord>, Option<Vec<u8>>), StoreError> {
        let limit = limit.max(1);
        let prefix = match network {
            Some(n) => AttachmentKey::network_prefix(n)?,
            None => Vec::new(),
        };
        let mut out = Vec::new();
        let mut next = None;
        self.store
            .visit_after(Tree::Attachments, &prefix, after, &mut |k, v| {
                let rec = decode_record(k, v)?;
                if !keep(&rec) {
                    return Ok(ControlFlow::Continue(()));
                }
                if out.len() == limit {
                    next = out
                        .last()
                        .map(|r: &AttachmentRecord| r.key.encode())
                        .transpose()?;
                    return Ok(ControlFlow::Break(()));
                }
                out.push(rec);
                Ok(ControlFlow::Continue(()))
            })?;
        Ok((out, next))
    }

    /// Hands every record (of `network`, or all) and its encoded size to `visit`, in key
    /// order, decoding one at a time and reading the store a page at a time
    /// ([`Store::visit_prefix`]).
    pub fn for_each(
        &self,
        network: Option<&str>,
        mut visit: impl FnMut(AttachmentRecord, usize) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let prefix = match network {
            Some(n) => AttachmentKey::network_prefix(n)?,
            None => Vec::new(),
        };
        self.store
            .visit_prefix(Tree::Attachments, &prefix, &mut |k, v| {
                visit(decode_record(k, v)?, v.len())
            })
    }

    /// The records whose census entry `pred` accepts, sorted by key: one point read each,
    /// no scan (the census is built by one if it never was). A record removed since the
    /// census named it is left out. The start's passes over the records not committed, the
    /// pool's and the agent's read these instead of the whole ledger (docs/performance.md,
    /// run 29).
    pub fn select(
        &self,
        pred: impl FnMut(&CensusEntry) -> bool,
    ) -> Result<Vec<AttachmentRecord>, StoreError> {
        let keys = self.census(|c| c.keys_where(pred))?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(rec) = self.get(&key)? {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Builds the census (if it never was) and hands every record to `visit`, in one pass
    /// over the store that decodes one record at a time: dipamd's start builds its address
    /// index and metrics from the same read as the census, instead of reading the ledger
    /// again and holding it whole.
    pub fn index(&self, mut visit: impl FnMut(&AttachmentRecord)) -> Result<(), StoreError> {
        let (_, built_now) = self.census.with(
            |add| {
                self.for_each(None, |rec, bytes| {
                    visit(&rec);
                    add(&rec, bytes);
                    Ok(())
                })
            },
            |_| (),
        )?;
        if !built_now {
            self.for_each(None, |rec, _| {
                visit(&rec);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Number of records, from the census (built by one scan if it never was).
    pub fn count(&self) -> Result<usize, StoreError> {
        self.census(|c| c.len())
    }

    /// Runs `f` on the census (census.rs): the counts dipamd needs of every record without
    /// reading them. The first call builds it from one scan; dipamd makes that call at start.
    pub fn census<R>(&self, f: impl FnOnce(&Counts) -> R) -> Result<R, StoreError> {
        self.census
            .with(
                |add| {
                    self.for_each(None, |rec, bytes| {
                        add(&rec, bytes);
                        Ok(())
                    })
                },
                f,
            )
            .map(|(r, _)| r)
    }

    /// Each group of records the census keeps (same network, creator and delegate config,
    /// census.rs) with its addresses per family (IPv4, IPv6) and one of its records, in the
    /// order of those records' keys: what dipamd needs of every network and config (`dipamctl
    /// status`, doctor, the reconcile's scopes) for one read per group instead of every
    /// record. A sample deleted meanwhile is replaced by another member; a group emptied
    /// meanwhile is left out.
    pub fn groups(&self) -> Result<Vec<(GroupKey, [Held; 2], AttachmentRecord)>, StoreError> {
        let sample = |k: &GroupKey| {
            self.census(|c| {
                c.group(k)
                    .and_then(|g| Some((g.sample()?.clone(), [g.v4, g.v6])))
            })
        };
        let keys: Vec<GroupKey> = self.census(|c| c.groups().map(|(k, _)| k.clone()).collect())?;
        let mut out = Vec::new();
        for key in keys {
            // A few tries: each miss is a member deleted between the census and the read.
            for _ in 0..3 {
                let Some((member, held)) = sample(&key)? else {
                    break;
                };
                if let Some(rec) = self.get(&member)? {
                    out.push((key, held, rec));
                    break;
                }
            }
        }
        out.sort_by(|a, b| a.2.key.cmp(&b.2.key));
        Ok(out)
    }

    /// How many full scans the census made (tests: no request may cause one).
    pub fn census_scans(&self) -> u64 {
        self.census.scans()
    }

    /// The underlying store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// A small named setting kept beside the ledger (e.g. the last address an agent role
    /// held), in the meta tree under `setting/<name>`.
    pub fn setting(&self, name: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .store
            .get(Tree::Meta, &setting_key(name))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Writes (`Some`) or clears (`None`) a setting, durably.
    pub fn set_setting(&self, name: &str, value: Option<&str>) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        match value {
            Some(v) => batch.put(Tree::Meta, setting_key(name), v.as_bytes().to_vec()),
            None => batch.delete(Tree::Meta, setting_key(name)),
        };
        self.store.commit(batch)
    }

    /// Every setting whose name starts with `prefix`, as (name, value).
    pub fn settings(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let full = setting_key(prefix);
        let strip = setting_key("").len();
        Ok(self
            .store
            .scan_prefix(Tree::Meta, &full)?
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(&k[strip..]).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect())
    }
}

/// Settings live in the meta tree beside the schema version, under their own prefix.
fn setting_key(name: &str) -> Vec<u8> {
    format!("setting/{name}").into_bytes()
}

/// Parses a record and checks that it is filed under its own key, so a record copied to the
/// wrong key is reported instead of silently answering for another attachment.
fn decode_record(raw_key: &[u8], value: &[u8]) -> Result<AttachmentRecord, StoreError> {
    let fail = |detail: String| StoreError::Decode {
        tree: Tree::Attachments.name(),
        key: raw_key.escape_ascii().to_string(),
        detail,
    };
    let rec: AttachmentRecord = serde_json::from_slice(value).map_err(|e| fail(e.to_string()))?;
    let key = AttachmentKey::decode(raw_key)?;
    if rec.key != key {
        return Err(fail(format!("record says its key is {}", rec.key)));
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AttachmentState, CriPod, DelegateKey, Owner};

    #[test]
    fn settings_round_trip_and_scan_by_prefix() {
        let l = Ledger::new(crate::MemStore::new());
        l.set_setting("agent/ip/a", Some("10.0.0.2")).unwrap();
        l.set_setting("agent/ip/b", Some("10.0.0.3")).unwrap();
        l.set_setting("other", Some("x")).unwrap();
        assert_eq!(
            l.setting("agent/ip/a").unwrap().as_deref(),
            Some("10.0.0.2")
        );
        assert_eq!(
            l.settings("agent/ip/").unwrap(),
            vec![
                ("agent/ip/a".to_string(), "10.0.0.2".to_string()),
                ("agent/ip/b".to_string(), "10.0.0.3".to_string())
            ]
        );
        l.set_setting("agent/ip/a", None).unwrap();
        assert_eq!(l.setting("agent/ip/a").unwrap(), None);
        // Settings are not attachments.
        assert_eq!(l.count().unwrap(), 0);
    }

    #[test]
    fn key_round_trips_and_displays() {
        let key = AttachmentKey::new("net-a", "ABC-def_1.2", "eth0");
        let raw = key.encode().unwrap();
        assert_eq!(raw, b"net-a\0ABC-def_1.2\0eth0");
        assert_eq!(AttachmentKey::decode(&raw).unwrap(), key);
        assert_eq!(key.to_string(), "net-a/ABC-def_1.2/eth0");

        let empty = AttachmentKey::new("", "", "");
        assert_eq!(
            AttachmentKey::decode(&empty.encode().unwrap()).unwrap(),
            empty
        );
    }

    #[test]
    fn key_with_nul_is_rejected() {
        for key in [
            AttachmentKey::new("a\0b", "c", "d"),
            AttachmentKey::new("a", "b\0", "d"),
            AttachmentKey::new("a", "b", "\0"),
        ] {
            assert!(
                matches!(key.encode(), Err(StoreError::InvalidKey(_))),
                "{key:?}"
            );
        }
        // Without the check these two would collide as "a\0b\0c\0d".
        assert!(AttachmentKey::new("a\0b", "c", "d").encode().is_err());
        assert!(AttachmentKey::new("a", "b\0c", "d").encode().is_err());
    }

    #[test]
    fn malformed_keys_do_not_decode() {
        for raw in [
            &b"only-one"[..],
            b"two\0parts",
            b"four\0parts\0are\0many",
            b"bad\0utf8\0\xff",
        ] {
            let err = AttachmentKey::decode(raw).unwrap_err();
            assert!(
                matches!(
                    err,
                    StoreError::Decode {
                        tree: "attachments",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
    }

    #[test]
    fn records_without_a_delegate_key_keep_their_bytes_and_old_ones_decode() {
        let rec = crate::suite::record("n", "c", "eth0");
        let text = serde_json::to_string(&rec).unwrap();
        assert!(!text.contains("delegate_key"), "{text}");
        // A record as written before the field existed.
        let old: AttachmentRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(old.delegate_key, None);
        assert_eq!(old.delegate_ids(), ("c", "eth0"));
        assert_eq!(old.delegate_env(), ("/var/run/netns/x", "K8S_POD_NAME=p"));

        let mut pooled = rec.clone();
        pooled.delegate_key = Some(DelegateKey {
            container_id: "dipam-pool-n1-7".into(),
            ifname: "eth0".into(),
            netns: "/run/dipam/pool-netns/dipam-pool-n1-7".into(),
            cni_args: "IgnoreUnknown=1".into(),
        });
        let back: AttachmentRecord =
            serde_json::from_str(&serde_json::to_string(&pooled).unwrap()).unwrap();
        assert_eq!(back, pooled);
        assert_eq!(back.delegate_ids(), ("dipam-pool-n1-7", "eth0"));
        assert_eq!(back.cri_pod, None);
        assert_eq!(
            back.delegate_env(),
            ("/run/dipam/pool-netns/dipam-pool-n1-7", "IgnoreUnknown=1")
        );
    }

    #[test]
    fn the_cri_pod_is_written_only_when_present_and_old_records_read_without_it() {
        let rec = crate::suite::record("n", "c", "eth0");
        let text = serde_json::to_string(&rec).unwrap();
        assert!(!text.contains("cri_pod"), "{text}");
        let mut cri = rec.clone();
        cri.cri_pod = Some(CriPod {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: "0b5c1a7e-0000-4000-8000-000000000001".into(),
        });
        let text = serde_json::to_string(&cri).unwrap();
        assert!(
            text.contains(r#""cri_pod":{"namespace":"default","name":"web-0","#),
            "{text}"
        );
        let back: AttachmentRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, cri);
        // A record as an older dipamd wrote it (no field at all) reads as not made through CRI.
        let mut old: serde_json::Value = serde_json::to_value(&rec).unwrap();
        old.as_object_mut().unwrap().remove("cri_pod");
        let old: AttachmentRecord = serde_json::from_value(old).unwrap();
        assert_eq!(old.cri_pod, None);
    }

    #[test]
    fn put_removing_is_one_commit() {
        let l = Ledger::new(crate::MemStore::new());
        let entry = crate::suite::record("n", "dipam-pool-x-1", "eth0");
        l.put(&entry).unwrap();
        let pod = crate::suite::record("n", "pod", "eth0");
        l.store().fail_next_commits(1);
        assert!(
            l.put_removing(&pod, &entry.key, Durability::SurvivesProcessCrash)
                .is_err()
        );
        assert_eq!(l.get(&entry.key).unwrap(), Some(entry.clone()));
        assert_eq!(l.get(&pod.key).unwrap(), None);
        l.put_removing(&pod, &entry.key, Durability::SurvivesProcessCrash)
            .unwrap();
        assert_eq!(l.get(&entry.key).unwrap(), None);
        assert_eq!(l.get(&pod.key).unwrap(), Some(pod));
    }

    #[test]
    fn put_all_and_remove_all_are_one_commit_each() {
        let l = Ledger::new(crate::MemStore::new());
        let recs: Vec<_> = (0..5)
            .map(|i| crate::suite::record("n", &format!("c{i}"), "eth0"))
            .collect();
        l.store().fail_next_commits(1);
        assert!(l.put_all(&recs, Durability::SurvivesPowerCut).is_err());
        assert_eq!(l.count().unwrap(), 0, "a failed batch wrote part of itself");
        l.put_all(&recs, Durability::SurvivesPowerCut).unwrap();
        assert_eq!(l.list(Some("n")).unwrap(), recs);
        let keys: Vec<_> = recs[..3].iter().map(|r| r.key.clone()).collect();
        l.store().fail_next_commits(1);
        assert!(
            l.remove_all(&keys, Durability::SurvivesProcessCrash)
                .is_err()
        );
        assert_eq!(l.count().unwrap(), 5);
        l.remove_all(&keys, Durability::SurvivesProcessCrash)
            .unwrap();
        assert_eq!(l.list(Some("n")).unwrap(), recs[3..].to_vec());
        // Absent keys, and an empty batch, are fine.
        l.remove_all(&keys, Durability::SurvivesProcessCrash)
            .unwrap();
        l.put_all(&[], Durability::SurvivesPowerCut).unwrap();
    }

    #[test]
    fn labels_and_serde_names() {
        assert_eq!(Owner::Pod.label(), "pod");
        assert_eq!(
            Owner::Agent {
                role: "router".into()
            }
            .label(),
            "agent:router"
        );
        assert_eq!(serde_json::to_string(&Owner::Pod).unwrap(), r#""pod""#);
        assert_eq!(Owner::Pool.label(), "pool");
        assert_eq!(serde_json::to_string(&Owner::Pool).unwrap(), r#""pool""#);
        assert_eq!(
            serde_json::to_string(&Owner::Agent {
                role: "health".into()
            })
            .unwrap(),
            r#"{"agent":{"role":"health"}}"#
        );
        for state in [
            AttachmentState::Adding,
            AttachmentState::Committed,
            AttachmentState::Deleting,
        ] {
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{}\"", state.as_str())
            );
        }
    }
}
