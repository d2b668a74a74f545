//! Per-attachment serialization: every operation on one (network, container ID, ifname) runs
//! alone, while different attachments proceed in parallel. containerd sets up `lo` and `eth0`
//! of one pod concurrently (docs/sources.md §5), so the lock is per attachment, not per
//! container.
//!
//! GC locks what it frees, not the network (docs/cfp.md §7.4, "Locking"): it takes the key
//! lock of each attachment it releases, and only when the lock is free ([`KeyLocks::try_lock`]:
//! a key with an operation in flight is kept, never waited for), so a pod ADD on the network
//! never waits for a GC of 1,000 stale attachments. Two things remain network-wide:
//! - one GC per network at a time ([`KeyLocks::collection`]), so two collections never plan
//!   against each other's half-done work;
//! - the delegate's own GC (CNI 1.1), which frees everything its valid list does not name: it
//!   runs with the network held exclusively ([`KeyLocks::exclusive`]; every key lock holds its
//!   network's lock shared), so no ADD can start between the list and the delegate's GC. That
//!   is one exec, not the whole collection.
//!
//! GC also yields: [`KeyLocks::operations`] counts the operations in flight on a network (ADD,
//! DEL, CHECK, the pool's and the agent's; everything that takes a key with [`KeyLocks::lock`]),
//! and while there is one, GC starts no second delegate DEL (gc/collect/mod.rs). host-local takes
//! one lock per network directory for every ADD and DEL and walks the whole directory under
//! it, so each extra DEL in flight is one more walk an ADD may queue behind, and one more
//! process for the CPUs (docs/performance.md, run 13).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use dipam_state::AttachmentKey;
use tokio::sync::{
    Mutex as AsyncMutex, OwnedMutexGuard, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock,
};

#[derive(Debug, Default)]
pub struct KeyLocks {
    map: Mutex<HashMap<AttachmentKey, Arc<AsyncMutex<()>>>>,
    /// One per network; a node has a handful, so entries are never dropped.
    nets: Mutex<HashMap<String, Arc<RwLock<()>>>>,
    /// One GC at a time per network; as few entries as `nets`.
    collections: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Operations holding or awaiting a key lock ([`KeyLocks::lock`]), per network.
    operations: Mutex<HashMap<String, usize>>,
}

/// Held while one operation runs on a key; the entry is dropped from the map when nobody
/// else waits for it, so the map stays as small as the set of keys in flight.
pub struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: AttachmentKey,
    guard: Option<OwnedMutexGuard<()>>,
    _net: OwnedRwLockReadGuard<()>,
    /// Counted in [`KeyLocks::operations`] (a [`KeyLocks::lock`], not GC's try).
    _op: Option<Operation<'a>>,
}

/// One operation counted in [`KeyLocks::operations`] from the moment it asks for its key
/// until its guard goes; dropped with a cancelled wait too.
struct Operation<'a> {
    locks: &'a KeyLocks,
    network: String,
}

impl Drop for Operation<'_> {
    fn drop(&mut self) {
        let mut ops = self
            .locks
            .operations
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = ops.get_mut(&self.network) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                ops.remove(&self.network);
            }
        }
    }
}

impl KeyLocks {
    fn net(&self, network: &str) -> Arc<RwLock<()>> {
        let mut nets = self.nets.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(nets.entry(network.to_owned()).or_default())
    }

    /// Waits for every operation on `network` to finish and keeps new ones out while held.
    /// Never take a key lock while holding this (it would wait for itself).
    pub async fn exclusive(&self, network: &str) -> OwnedRwLockWriteGuard<()> {
        self.net(network).write_owned().await
    }

    /// Held by a GC of `network` for its whole run: GCs of one network run one after the
    /// other (a second one plans only once the first has freed what it chose), while ADD,
    /// DEL and CHECK do not take it.
    pub async fn collection(&self, network: &str) -> OwnedMutexGuard<()> {
        let m = {
            let mut c = self.collections.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(c.entry(network.to_owned()).or_default())
        };
        m.lock_owned().await
    }

    /// The key's lock if nobody holds or awaits it, without waiting: GC frees only what no
    /// operation is touching (an ADD, DEL or CHECK in flight on the key keeps it), and it never
    /// queues behind a runtime's request. `None` also while the network is held exclusively.
    pub fn try_lock(&self, key: &AttachmentKey) -> Option<KeyGuard<'_>> {
        let net = self.net(&key.network).try_read_owned().ok()?;
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if map.contains_key(key) {
                // Held or awaited by someone else.
                return None;
            }
            Arc::clone(map.entry(key.clone()).or_default())
        };
        // Fresh, and inserted under the map's lock: nobody else can hold it yet.
        let guard = m.try_lock_owned().ok();
        let guard = KeyGuard {
            locks: self,
            key: key.clone(),
            guard,
            _net: net,
            _op: None,
        };
        guard.guard.is_some().then_some(guard)
    }

    /// Operations holding or awaiting a key of `network` ([`Self::lock`]'s callers; GC's own
    /// keys are not counted).
    pub fn operations(&self, network: &str) -> usize {
        self.operations
            .lock()
            .map(|o| o.get(network).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    pub async fn lock(&self, key: &AttachmentKey) -> KeyGuard<'_> {
        *self
            .operations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.network.clone())
            .or_default() += 1;
        let op = Operation {
            locks: self,
            network: key.network.clone(),
        };
        let net = self.net(&key.network).read_owned().await;
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(key.clone()).or_default())
        };
        let guard = m.lock_owned().await;
        KeyGuard {
            locks: self,
            key: key.clone(),
            guard: Some(guard),
            _net: net,
            _op: Some(op),
        }
    }

    /// Keys with an operation in flight (held or awaited).
    pub fn in_flight(&self) -> Vec<AttachmentKey> {
        self.map
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_key_is_serialized_and_the_map_empties() {
        let locks = Arc::new(KeyLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let key = AttachmentKey::new("n", "c", "eth0");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside, max, key) =
                    (locks.clone(), inside.clone(), max.clone(), key.clone());
                tokio::spawn(async move {
                    let _g = locks.lock(&key).await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(max.load(Ordering::SeqCst), 1);
        assert!(locks.in_flight().is_empty());
    }

    #[tokio::test]
    async fn exclusive_waits_for_the_network_and_blocks_it() {
        let locks = Arc::new(KeyLocks::default());
        let k = AttachmentKey::new("n", "a", "eth0");
        let held = locks.lock(&k).await;
        let excl = tokio::time::timeout(Duration::from_millis(100), locks.exclusive("n")).await;
        assert!(excl.is_err(), "GC must wait for the ADD in flight");
        drop(held);
        let g = locks.exclusive("n").await;
        let other_net = tokio::time::timeout(
            Duration::from_millis(100),
            locks.lock(&AttachmentKey::new("m", "a", "eth0")),
        )
        .await;
        assert!(other_net.is_ok(), "other networks are not blocked");
        let same = tokio::time::timeout(Duration::from_millis(100), locks.lock(&k)).await;
        assert!(same.is_err(), "ADD waits while GC runs");
        drop(g);
    }

    #[tokio::test]
    async fn different_keys_do_not_wait() {
        let locks = KeyLocks::default();
        let _a = locks.lock(&AttachmentKey::new("n", "a", "eth0")).await;
        let b = tokio::time::timeout(
            Duration::from_millis(200),
            locks.lock(&AttachmentKey::new("n", "b", "eth0")),
        )
        .await;
        assert!(b.is_ok());
    }

    #[tokio::test]
    async fn try_lock_takes_only_a_free_key_and_never_waits() {
        let locks = KeyLocks::default();
        let k = AttachmentKey::new("n", "a", "eth0");
        let held = locks.lock(&k).await;
        assert!(locks.try_lock(&k).is_none(), "took a held key");
        // A refused try leaves no entry behind that would look like an operation.
        drop(held);
        assert!(locks.in_flight().is_empty());
        let mine = locks.try_lock(&k).expect("a free key");
        assert_eq!(locks.in_flight(), vec![k.clone()]);
        let other = tokio::time::timeout(Duration::from_millis(100), locks.lock(&k)).await;
        assert!(other.is_err(), "the key was not held");
        drop(mine);
        assert!(locks.in_flight().is_empty());
        // While the network is held exclusively, nothing is taken.
        let excl = locks.exclusive("n").await;
        assert!(locks.try_lock(&k).is_none());
        drop(excl);
        assert!(locks.try_lock(&k).is_some());
    }

    #[tokio::test]
    async fn one_collection_per_network_and_none_blocks_a_key() {
        let locks = KeyLocks::default();
        let first = locks.collection("n").await;
        let second = tokio::time::timeout(Duration::from_millis(100), locks.collection("n")).await;
        assert!(second.is_err(), "two GCs of one network at once");
        let other = tokio::time::timeout(Duration::from_millis(100), locks.collection("m")).await;
        assert!(other.is_ok(), "another network's GC waited");
        let add = tokio::time::timeout(
            Duration::from_millis(100),
            locks.lock(&AttachmentKey::new("n", "a", "eth0")),
        )
        .await;
        assert!(add.is_ok(), "an ADD waited for a GC");
        drop(first);
    }

    #[tokio::test]
    async fn operations_are_counted_per_network_but_not_gc_tries() {
        let locks = KeyLocks::default();
        let a = locks.lock(&AttachmentKey::new("n", "a", "eth0")).await;
        let _gc = locks
            .try_lock(&AttachmentKey::new("n", "g", "eth0"))
            .unwrap();
        assert_eq!(locks.operations("n"), 1);
        assert_eq!(locks.operations("m"), 0);
        // A waiter counts from the moment it asks; a cancelled wait stops counting.
        let wait = tokio::time::timeout(
            Duration::from_millis(50),
            locks.lock(&AttachmentKey::new("n", "a", "eth0")),
        )
        .await;
        assert!(wait.is_err());
        assert_eq!(locks.operations("n"), 1);
        drop(a);
        assert_eq!(locks.operations("n"), 0);
    }
}
