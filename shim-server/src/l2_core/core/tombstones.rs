//! The tombstones of recent DELs (the stale-ADD rule, F4): by key, the issue time of the last
//! DEL on the boot clock and when to forget it; at most [`TOMBSTONE_MAX`], each for
//! [`TOMBSTONE_TTL`]. The core keeps two sets: root's, which bind every caller's ADDs, and
//! non-root callers' by (uid, key), which bind only that caller's (Core::bury).
//!
//! Every DEL buries a key, so burying must not cost more as tombstones pile up: a node that
//! churns pods holds tens of thousands within the TTL, and a sweep of all of them on every
//! DEL (as the first version did) made each DEL pay for every pod deleted in the last ten
//! minutes. The expiries are kept in the order they were set (one TTL for all, on a
//! monotonic clock, so that order is expiry order): expired and surplus ones leave from the
//! front, in amortised constant time per DEL.
//!
//! A tombstone holds the key's 128-bit tag (l1_leaves/tag.rs), not the key, and the issue's
//! boot id shared with the tombstone before it: a full set holds 203 bytes a tombstone at its
//! peak, where the key and the stamp copied into the table and the queue made it 621 (the
//! counting allocator, `a_full_set_holds_a_tag_per_tombstone_not_the_key`;
//! docs/performance.md run 42, lever 13). Two
//! keys sharing a tag (about 2^-97 at the bound, and no caller can aim at it) would let one
//! key's DEL refuse the other's ADD issued before it, with code 3, which the runtime retries.

use std::{
    collections::{HashMap, VecDeque, hash_map::Entry},
    hash::Hash,
    marker::PhantomData,
    sync::Arc,
    time::{Duration, Instant},
};

use dipam_state::BootStamp;

use crate::l1_leaves::tag::{Tag, Tagger};

/// How long a DEL is remembered against stale ADDs; longer than any runtime's CNI timeout.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// The most tombstones kept: bounds memory under churn.
pub const TOMBSTONE_MAX: usize = 65_536;

/// A DEL's issue time as a tombstone keeps it: the boot id is shared with the tombstones
/// before it (one boot's DELs, nearly always).
#[derive(Debug, Clone)]
struct Issued {
    boot_id: Arc<str>,
    ns: u64,
}

/// Keyed by `K`: the attachment's key for root's DELs, which bind every caller's ADDs, and
/// (uid, key) for a non-root caller's, which bind only that caller's (Core::bury says why).
#[derive(Debug)]
pub struct Tombstones<K> {
    /// key's tag -> (issue time of its last DEL, when to forget it).
    by_key: HashMap<Tag, (Issued, Instant)>,
    /// (expiry, key's tag) in the order they were set. A key buried again has an older entry
    /// here too, which no longer matches `by_key` and is skipped when it comes up.
    order: VecDeque<(Instant, Tag)>,
    tagger: Tagger,
    _key: PhantomData<fn(&K)>,
}

impl<K> Default for Tombstones<K> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            order: VecDeque::new(),
            tagger: Tagger::default(),
            _key: PhantomData,
        }
    }
}

impl<K: Hash> Tombstones<K> {
    /// Remembers a DEL of `key` issued at `issued`, at `now`.
    pub fn bury(&mut self, key: &K, issued: BootStamp, now: Instant) {
        self.expire(now);
        self.shrink();
        let tag = self.tagger.tag(key);
        if !self.by_key.contains_key(&tag) {
            while self.by_key.len() >= TOMBSTONE_MAX && self.pop_front() {}
        }
        let until = now + TOMBSTONE_TTL;
        let issued = self.issued(issued);
        match self.by_key.entry(tag) {
            Entry::Vacant(v) => {
                v.insert((issued, until));
            }
            Entry::Occupied(mut o) => {
                let (last, at) = o.get_mut();
                // The latest DEL is the one an ADD must postdate.
                if crate::l1_leaves::order::before(Some(&last.stamp()), Some(&issued.stamp()))
                    == Some(true)
                {
                    *last = issued;
                }
                *at = until;
            }
        }
        self.order.push_back((until, tag));
        // Keys buried again and again leave their old entries behind: compact once they are
        // as many as the live ones, which keeps this amortised constant time too.
        if self.order.len() > 2 * self.by_key.len().max(1024) {
            let by_key = &self.by_key;
            self.order
                .retain(|(until, t)| by_key.get(t).is_some_and(|(_, u)| u == until));
        }
    }

    /// The issue time of the last DEL of `key`, if still remembered at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<BootStamp> {
        self.by_key
            .get(&self.tagger.tag(key))
            .filter(|(_, until)| *until > now)
            .map(|(issued, _)| issued.stamp())
    }

    /// `issued` as a tombstone keeps it: its boot id shared with the newest tombstone's when
    /// they are the same boot's.
    fn issued(&self, issued: BootStamp) -> Issued {
        let newest = self
            .order
            .back()
            .and_then(|(_, t)| self.by_key.get(t))
            .map(|(i, _)| &i.boot_id)
            .filter(|b| ***b == *issued.boot_id);
        Issued {
            boot_id: newest.map_or_else(|| Arc::from(issued.boot_id), Arc::clone),
            ns: issued.ns,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Gives back the room a faster churn left once a quarter of it is in use: the tombstones
    /// number the DELs of the last [`TOMBSTONE_TTL`], so the tables follow the rate of DELs,
    /// and without this they kept the size of the fastest ten minutes ever seen (~300 bytes a
    /// DEL, docs/performance.md run 42). A shrink follows at least three quarters of the
    /// entries' expiry, so it stays amortised constant time per DEL.
    fn shrink(&mut self) {
        if self.by_key.capacity() > 4 * self.by_key.len().max(1024) {
            self.by_key.shrink_to_fit();
        }
        if self.order.capacity() > 4 * self.order.len().max(1024) {
            self.order.shrink_to_fit();
        }
    }

    /// Drops every tombstone whose time has passed at `now`.
    fn expire(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(until, _)| *until <= now) {
            self.pop_front();
        }
    }

    /// Drops the oldest entry of `order`, and its tombstone if the entry is its current one;
    /// false when there is nothing left.
    fn pop_front(&mut self) -> bool {
        let Some((until, tag)) = self.order.pop_front() else {
            return false;
        };
        if self.by_key.get(&tag).is_some_and(|(_, u)| *u == until) {
            self.by_key.remove(&tag);
        }
        true
    }
}

impl Issued {
    fn stamp(&self) -> BootStamp {
        BootStamp {
            boot_id: self.boot_id.to_string(),
            ns: self.ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use dipam_state::AttachmentKey;

    use super::*;

    fn key(i: usize) -> AttachmentKey {
        AttachmentKey::new("n", format!("c{i}"), "eth0")
    }

    fn stamp(ns: u64) -> BootStamp {
        BootStamp {
            boot_id: "b".into(),
            ns,
        }
    }

    #[test]
    fn a_tombstone_lives_its_ttl_and_a_second_del_extends_it() {
        let mut t = Tombstones::<AttachmentKey>::default();
        let t0 = Instant::now();
        t.bury(&key(1), stamp(10), t0);
        assert_eq!(t.get(&key(1), t0).map(|s| s.ns), Some(10));
        let later = t0 + TOMBSTONE_TTL / 2;
        t.bury(&key(1), stamp(20), later);
        // Past the first expiry, the second DEL's keeps it, with the later issue time.
        let past_first = t0 + TOMBSTONE_TTL + Duration::from_secs(1);
        t.bury(&key(2), stamp(30), past_first);
        assert_eq!(t.get(&key(1), past_first).map(|s| s.ns), Some(20));
        let past_second = later + TOMBSTONE_TTL + Duration::from_secs(1);
        t.bury(&key(3), stamp(40), past_second);
        assert_eq!(t.get(&key(1), past_second), None);
        assert_eq!(t.len(), 2, "key 1 expired, 2 and 3 are left");
    }

    #[test]
    fn the_oldest_go_first_above_the_bound_and_reburied_keys_stay_bounded() {
        let mut t = Tombstones::<AttachmentKey>::default();
        let t0 = Instant::now();
        for i in 0..TOMBSTONE_MAX + 10 {
            t.bury(
                &key(i),
                stamp(i as u64),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(t.len(), TOMBSTONE_MAX);
        assert!(t.get(&key(9), t0).is_none(), "the oldest went");
        assert!(t.get(&key(10), t0).is_some());
        // One key buried a million times holds one tombstone and a bounded queue.
        let mut one = Tombstones::<AttachmentKey>::default();
        for i in 0..1_000_000u64 {
            one.bury(&key(0), stamp(i), t0 + Duration::from_nanos(i));
        }
        assert_eq!(one.len(), 1);
        assert!(one.order.len() <= 2 * 1024 + 1, "{}", one.order.len());
    }

    /// A full set of tombstones, of keys as runtimes make them (a 64-digit container ID) and
    /// DELs of one boot: what it holds per tombstone at its peak, by the counting allocator:
    /// 203 bytes. Holding the keys and the stamps themselves, it took 621.
    #[test]
    fn a_full_set_holds_a_tag_per_tombstone_not_the_key() {
        use crate::testing::held;
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let t0 = Instant::now();
        let boot = "4f2c9b1e-8d3a-4c57-9e61-0b7a2d5f3c88";
        let (t, peak) = held::measure(&rt, async move {
            let mut t = Tombstones::<AttachmentKey>::default();
            for i in 0..TOMBSTONE_MAX {
                let key = AttachmentKey::new("density", format!("{i:064x}"), "eth0");
                let at = BootStamp {
                    boot_id: boot.into(),
                    ns: i as u64,
                };
                t.bury(&key, at, t0 + Duration::from_micros(i as u64));
            }
            t
        });
        assert_eq!(t.len(), TOMBSTONE_MAX);
        let per = peak / TOMBSTONE_MAX;
        eprintln!("{TOMBSTONE_MAX} tombstones: peak {peak} B, {per} B a tombstone");
        assert!(
            per <= 260,
            "{per} B a tombstone at the peak ({peak} B in all)"
        );
    }

    #[test]
    fn the_tables_shrink_when_the_churn_slows() {
        let mut t = Tombstones::<AttachmentKey>::default();
        let t0 = Instant::now();
        // A fast churn: 20,000 DELs within the TTL.
        for i in 0..20_000 {
            t.bury(
                &key(i),
                stamp(i as u64),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert!(t.by_key.capacity() >= 20_000);
        // Then a slow one: the fast churn's tombstones expire, and the tables follow.
        let slow = t0 + TOMBSTONE_TTL + Duration::from_secs(1);
        for i in 0..100 {
            t.bury(
                &key(100_000 + i),
                stamp(0),
                slow + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(t.len(), 100);
        assert!(t.by_key.capacity() <= 4 * 1024, "{}", t.by_key.capacity());
        assert!(t.order.capacity() <= 4 * 1024, "{}", t.order.capacity());
    }
}
