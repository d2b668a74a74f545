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

use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    time::{Duration, Instant},
};

use dipam_state::BootStamp;

/// How long a DEL is remembered against stale ADDs; longer than any runtime's CNI timeout.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);
/// The most tombstones kept: bounds memory under churn.
pub const TOMBSTONE_MAX: usize = 65_536;

/// Keyed by `K`: the attachment's key for root's DELs, which bind every caller's ADDs, and
/// (uid, key) for a non-root caller's, which bind only that caller's (Core::bury says why).
#[derive(Debug)]
pub struct Tombstones<K> {
    /// key -> (issue time of its last DEL, when to forget it).
    by_key: HashMap<K, (BootStamp, Instant)>,
    /// (expiry, key) in the order they were set. A key buried again has an older entry here
    /// too, which no longer matches `by_key` and is skipped when it comes up.
    order: VecDeque<(Instant, K)>,
}

impl<K> Default for Tombstones<K> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Tombstones<K> {
    /// Remembers a DEL of `key` issued at `issued`, at `now`.
    pub fn bury(&mut self, key: &K, issued: BootStamp, now: Instant) {
        self.expire(now);
        self.shrink();
        if !self.by_key.contains_key(key) {
            while self.by_key.len() >= TOMBSTONE_MAX && self.pop_front() {}
        }
        let until = now + TOMBSTONE_TTL;
        let entry = self
            .by_key
            .entry(key.clone())
            .or_insert((issued.clone(), now));
        // The latest DEL is the one an ADD must postdate.
        if crate::l1_leaves::order::before(Some(&entry.0), Some(&issued)) == Some(true) {
            entry.0 = issued;
        }
        entry.1 = until;
        self.order.push_back((until, key.clone()));
        // Keys buried again and again leave their old entries behind: compact once they are
        // as many as the live ones, which keeps this amortised constant time too.
        if self.order.len() > 2 * self.by_key.len().max(1024) {
            let by_key = &self.by_key;
            self.order
                .retain(|(until, k)| by_key.get(k).is_some_and(|(_, u)| u == until));
        }
    }

    /// The issue time of the last DEL of `key`, if still remembered at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<BootStamp> {
        self.by_key
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(issued, _)| issued.clone())
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
        let Some((until, key)) = self.order.pop_front() else {
            return false;
        };
        if self.by_key.get(&key).is_some_and(|(_, u)| *u == until) {
            self.by_key.remove(&key);
        }
        true
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
