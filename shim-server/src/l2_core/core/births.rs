//! Which attachments an ADD finished after a given instant: the rule that keeps a GC from
//! freeing an attachment that began after the GC did (docs/cfp.md §7.4, "Born after the GC").
//!
//! A runtime's valid list, and the runtime-aware GC's sandbox list, describe the node at the
//! instant they were made: neither can name a pod the runtime started after. dipamd reads its
//! ledger later (after the collection lock, the delegate's probe and reading the delegate's
//! store: milliseconds, seconds behind a large GC), so an ADD that committed in between looked
//! exactly like a stale record: committed, not in the list, its key no longer locked, and
//! with `--gc-grace 0` (or once the wall clock stepped forward) not young either. It was freed
//! while its pod ran, and the next pod got its address.
//!
//! The rule, exact and free of the wall clock: every runtime ADD (fresh, repeated, or served
//! from the warm pool) stamps its key with CLOCK_BOOTTIME as its last act under the key's lock
//! ([`Births::stamp_on_drop`]). A GC has a start instant on the same clock ([`GcStart`]: the
//! CNI GC plugin's `issued_at`, else when the request arrived; the runtime-aware GC's, before
//! it asked the runtime). A key stamped at or after that instant is kept. GC checks it under
//! the key's lock, right before it marks the record `deleting` (gc/collect/mod.rs), so no ADD can
//! slip between the check and the release: one still running holds the lock (kept as
//! in-flight), one done has stamped. CLOCK_BOOTTIME never steps, counts suspend, and is the
//! same clock in every process of a boot, so the plugin's stamp and dipamd's compare.
//!
//! Bounded in time and size: stamps older than [`RETAIN`] are dropped, and at most [`MAX`]
//! are held. What was dropped is remembered as a watermark, the newest stamp ever dropped;
//! at start it is the instant the tracker was made, since it knows nothing of the ADDs an
//! earlier dipamd ran. A key without a stamp, for a GC that began at or before the watermark,
//! may have been born after the GC: [`Born::Unknown`], and the GC keeps it.
//!
//! A stamp is held under the key's 128-bit tag (l1_leaves/tag.rs), not the key: a full table
//! holds 75 bytes a stamp at its peak, where the key's three strings made it 308 (the
//! counting allocator, `a_full_table_holds_a_tag_per_stamp_not_the_key`; docs/performance.md
//! run 42, lever 13). Two keys sharing a tag (about 2^-97 at the bound, and no caller can aim
//! at it) would only make one look born when the other was: kept, never freed.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use dipam_state::{AttachmentKey, BootStamp};

use crate::l1_leaves::tag::{Tag, Tagger};

/// How long an ADD's stamp is kept: far longer than a GC's plan and releases take (a GC of
/// 1,000 attachments runs for seconds, docs/performance.md run 15).
pub const RETAIN: Duration = Duration::from_secs(600);
/// The most stamps held (one per key ADDed within [`RETAIN`]): bounds memory under churn.
pub const MAX: usize = 65_536;
/// Stamps between two sweeps of the expired ones.
const SWEEP_EVERY: u32 = 1024;

/// A reading of the boot clock in nanoseconds; `None` if it cannot be read.
pub type Clock = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// CLOCK_BOOTTIME in nanoseconds.
pub fn boot_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    u64::try_from(t.tv_sec())
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(t.tv_nsec()).ok()?)
}

/// When process `pid` was started (forked), on the boot clock in nanoseconds, rounded down
/// to its clock tick: field 22 of `/proc/<pid>/stat`, which the kernel keeps on CLOCK_BOOTTIME
/// in USER_HZ ticks. `None` if the process is gone or unreadable.
pub fn process_start_ns(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and ')': fields are counted from the last ')'.
    let rest = text.get(text.rfind(')')? + 1..)?;
    let ticks: u64 = rest.split_ascii_whitespace().nth(19)?.parse().ok()?;
    let hz = match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as u64,
        _ => 100,
    };
    ticks.checked_mul(1_000_000_000 / hz)
}

/// When a GC began, on the boot clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcStart(pub u64);

/// Whether a key's attachment was born (its last ADD finished) at or after a GC's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Born {
    /// Its last ADD finished before the GC began: the valid list speaks for it.
    Before,
    /// Its last ADD finished at or after the GC's start: the list cannot speak for it.
    After,
    /// Not known (its stamp may have been dropped, or made by an earlier dipamd): kept.
    Unknown,
}

pub struct Births {
    clock: Clock,
    tagger: Tagger,
    inner: Mutex<Inner>,
}

struct Inner {
    /// A key's tag -> its last ADD's end.
    stamps: HashMap<Tag, u64>,
    /// The newest stamp dropped, or the tracker's creation.
    forgotten: u64,
    since_sweep: u32,
}

impl std::fmt::Debug for Births {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Births").finish_non_exhaustive()
    }
}

impl Default for Births {
    fn default() -> Self {
        Self::with_clock(Box::new(boot_ns))
    }
}

impl Births {
    /// A tracker on `clock` (tests drive their own).
    pub fn with_clock(clock: Clock) -> Self {
        // It knows nothing of what happened before it existed. A clock that cannot be read
        // makes every GC start 0 and every stamp the latest: everything is kept.
        let made = clock().unwrap_or(u64::MAX);
        Self {
            clock,
            tagger: Tagger::default(),
            inner: Mutex::new(Inner {
                stamps: HashMap::new(),
                forgotten: made,
                since_sweep: 0,
            }),
        }
    }

    /// Stamps `key` now: an ADD on it finished (or is finishing) under its lock.
    pub fn stamp(&self, key: &AttachmentKey) {
        self.stamp_tag(self.tagger.tag(key));
    }

    fn stamp_tag(&self, tag: Tag) {
        // Unreadable: the latest possible, which every GC keeps.
        let now = (self.clock)().unwrap_or(u64::MAX);
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let at = g.stamps.entry(tag).or_insert(now);
        *at = (*at).max(now);
        g.since_sweep += 1;
        if g.stamps.len() > MAX || g.since_sweep >= SWEEP_EVERY {
            g.sweep(now);
        }
    }

    /// Stamps `key` now and again when the returned guard is dropped: hold it for the whole
    /// of a runtime's ADD, dropped before the key's lock is.
    pub fn stamp_on_drop<'a>(&'a self, key: &AttachmentKey) -> StampOnDrop<'a> {
        let tag = self.tagger.tag(key);
        self.stamp_tag(tag);
        StampOnDrop { births: self, tag }
    }

    /// A GC's start: the earliest of now, the instant its plugin says it started (`issued`,
    /// on this boot's clock) and the kernel's start time of the plugin's process (`process`,
    /// [`process_start_ns`]). Never later than now: a stamp from the future would let the GC
    /// free what began before it. The process start comes first because a plugin exec'd on a
    /// busy node may wait tens of milliseconds for a CPU before it reads the clock, and an
    /// ADD started beside it can finish meanwhile (seen at a load average of 30).
    pub fn gc_began(&self, issued: Option<&BootStamp>, process: Option<u64>) -> GcStart {
        let Some(now) = (self.clock)() else {
            return GcStart(0);
        };
        let plugin = issued
            .filter(|s| Some(s.boot_id.as_str()) == crate::l1_leaves::order::current_boot_id())
            .map(|s| s.ns);
        GcStart(
            [Some(now), plugin, process]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now),
        )
    }

    /// Whether `key` was born at or after `start`.
    pub fn born(&self, key: &AttachmentKey, start: GcStart) -> Born {
        let tag = self.tagger.tag(key);
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.stamps.get(&tag) {
            Some(&at) if at >= start.0 => Born::After,
            _ if g.forgotten >= start.0 => Born::Unknown,
            _ => Born::Before,
        }
    }

    /// Stamps held (status, tests).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .map(|g| g.stamps.len())
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Drops the stamps older than [`RETAIN`], then, above [`MAX`], the oldest down to three
    /// quarters of it; the watermark rises to the newest dropped.
    fn sweep(&mut self, now: u64) {
        self.since_sweep = 0;
        let cutoff = now.saturating_sub(RETAIN.as_nanos() as u64);
        let mut newest_dropped = None::<u64>;
        self.stamps.retain(|_, &mut at| {
            let keep = at >= cutoff;
            if !keep {
                newest_dropped = newest_dropped.max(Some(at));
            }
            keep
        });
        if self.stamps.len() > MAX {
            let mut ats: Vec<u64> = self.stamps.values().copied().collect();
            let drop = self.stamps.len() - MAX * 3 / 4;
            let (_, &mut threshold, _) = ats.select_nth_unstable(drop - 1);
            self.stamps.retain(|_, &mut at| at > threshold);
            newest_dropped = newest_dropped.max(Some(threshold));
        }
        if let Some(t) = newest_dropped {
            self.forgotten = self.forgotten.max(t);
        }
        // The stamps number the ADDs of the last RETAIN, so the table follows the rate of
        // ADDs: give back the room a faster churn left, rather than keep the size of the
        // fastest ten minutes ever seen (docs/performance.md run 42). A sweep runs every
        // SWEEP_EVERY stamps, so this rehash is amortised.
        if self.stamps.capacity() > 4 * self.stamps.len().max(SWEEP_EVERY as usize) {
            self.stamps.shrink_to_fit();
        }
    }
}

/// [`Births::stamp_on_drop`]'s guard.
pub struct StampOnDrop<'a> {
    births: &'a Births,
    tag: Tag,
}

impl Drop for StampOnDrop<'_> {
    fn drop(&mut self) {
        self.births.stamp_tag(self.tag);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };

    use super::*;

    fn clocked(start: u64) -> (Births, Arc<AtomicU64>) {
        let t = Arc::new(AtomicU64::new(start));
        let c = t.clone();
        (
            Births::with_clock(Box::new(move || Some(c.load(Ordering::SeqCst)))),
            t,
        )
    }

    fn key(c: &str) -> AttachmentKey {
        AttachmentKey::new("net", c, "eth0")
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_key_stamped_at_or_after_the_start_is_born_after() {
        let (b, t) = clocked(100 * S);
        t.store(200 * S, Ordering::SeqCst);
        b.stamp(&key("before"));
        t.store(300 * S, Ordering::SeqCst);
        let gc = b.gc_began(None, None);
        assert_eq!(gc, GcStart(300 * S));
        b.stamp(&key("same-instant"));
        t.store(301 * S, Ordering::SeqCst);
        b.stamp(&key("after"));
        assert_eq!(b.born(&key("before"), gc), Born::Before);
        assert_eq!(b.born(&key("same-instant"), gc), Born::After);
        assert_eq!(b.born(&key("after"), gc), Born::After);
        // Never ADDed since this dipamd started, and the GC began after it did.
        assert_eq!(b.born(&key("old"), gc), Born::Before);
        // A GC that began before this tracker existed cannot know: kept.
        assert_eq!(b.born(&key("old"), GcStart(50 * S)), Born::Unknown);
    }

    #[test]
    fn a_guard_stamps_again_when_the_add_ends() {
        let (b, t) = clocked(100 * S);
        let guard = b.stamp_on_drop(&key("a"));
        let gc = GcStart(150 * S);
        t.store(150 * S, Ordering::SeqCst);
        // The ADD began before the GC: while it runs, its key lock speaks for it.
        assert_eq!(b.born(&key("a"), gc), Born::Before);
        drop(guard); // it finished after the GC began
        assert_eq!(b.born(&key("a"), gc), Born::After);
    }

    #[test]
    fn the_plugins_instant_is_used_but_never_one_from_the_future_or_another_boot() {
        let (b, _t) = clocked(500 * S);
        let Some(boot) = crate::l1_leaves::order::current_boot_id() else {
            return; // no /proc: nothing to compare with
        };
        let at = |ns| BootStamp {
            boot_id: boot.to_owned(),
            ns,
        };
        assert_eq!(b.gc_began(Some(&at(400 * S)), None), GcStart(400 * S));
        assert_eq!(b.gc_began(Some(&at(900 * S)), None), GcStart(500 * S));
        let other = BootStamp {
            boot_id: "another-boot".into(),
            ns: 1,
        };
        assert_eq!(b.gc_began(Some(&other), None), GcStart(500 * S));
        assert_eq!(b.gc_began(None, None), GcStart(500 * S));
    }

    #[test]
    fn the_plugins_process_start_comes_first() {
        let (b, _t) = clocked(500 * S);
        assert_eq!(b.gc_began(None, Some(450 * S)), GcStart(450 * S));
        assert_eq!(b.gc_began(None, Some(900 * S)), GcStart(500 * S));
        // This process's own start is on the boot clock, before now.
        let me = process_start_ns(std::process::id()).expect("our own /proc/<pid>/stat");
        let now = boot_ns().unwrap();
        assert!(me <= now && now - me < 3600 * S, "{me} vs {now}");
    }

    #[test]
    fn expired_stamps_go_and_a_gc_older_than_them_keeps_everything() {
        let (b, t) = clocked(S);
        t.store(10 * S, Ordering::SeqCst);
        b.stamp(&key("early"));
        let old_gc = GcStart(5 * S);
        t.store(10 * S + RETAIN.as_nanos() as u64 + S, Ordering::SeqCst);
        for i in 0..SWEEP_EVERY {
            b.stamp(&key(&format!("k{i}")));
        }
        assert_eq!(b.len(), SWEEP_EVERY as usize, "the expired stamp stayed");
        // Dropped: a GC that began before it can no longer tell.
        assert_eq!(b.born(&key("early"), old_gc), Born::Unknown);
        let new_gc = b.gc_began(None, None);
        assert_eq!(b.born(&key("early"), new_gc), Born::Before);
    }

    #[test]
    fn the_size_is_bounded_and_what_overflowed_is_unknown() {
        let (b, t) = clocked(S);
        let gc = GcStart(2 * S);
        for i in 0..(MAX as u64 + 10) {
            t.store(2 * S + i, Ordering::SeqCst);
            b.stamp(&key(&format!("k{i}")));
        }
        assert!(b.len() <= MAX, "{}", b.len());
        // k0 was dropped, and born after the GC's start: not known, never "before".
        assert_eq!(b.born(&key("k0"), gc), Born::Unknown);
        assert_eq!(
            b.born(&key(&format!("k{}", MAX as u64 + 9)), gc),
            Born::After
        );
    }

    #[test]
    fn the_table_shrinks_when_the_churn_slows() {
        let (b, t) = clocked(S);
        // A fast churn: 20,000 ADDs within RETAIN.
        for i in 0..20_000u64 {
            t.store(S + i, Ordering::SeqCst);
            b.stamp(&key(&format!("fast{i}")));
        }
        let capacity = || b.inner.lock().unwrap().stamps.capacity();
        assert!(capacity() >= 20_000);
        // Then a slow one: the fast churn's stamps expire, and the table follows.
        t.store(2 * S + RETAIN.as_nanos() as u64, Ordering::SeqCst);
        for i in 0..SWEEP_EVERY {
            b.stamp(&key(&format!("slow{i}")));
        }
        assert_eq!(b.len(), SWEEP_EVERY as usize);
        assert!(capacity() <= 8 * SWEEP_EVERY as usize, "{}", capacity());
    }

    /// A full table, of keys as runtimes make them (a 64-digit container ID): what it holds
    /// per stamp at its peak, by the counting allocator: 75 bytes. Held under the keys
    /// themselves, the stamps took 308.
    #[test]
    fn a_full_table_holds_a_tag_per_stamp_not_the_key() {
        use crate::testing::held;
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let (b, t) = clocked(S);
        let (b, peak) = held::measure(&rt, async move {
            for i in 0..MAX as u64 {
                t.store(S + i, Ordering::SeqCst);
                b.stamp(&AttachmentKey::new("density", format!("{i:064x}"), "eth0"));
            }
            b
        });
        assert_eq!(b.len(), MAX);
        let per = peak / MAX;
        eprintln!("{MAX} stamps: peak {peak} B, {per} B a stamp");
        assert!(per <= 100, "{per} B a stamp at the peak ({peak} B in all)");
    }

    #[test]
    fn an_unreadable_clock_keeps_everything() {
        let b = Births::with_clock(Box::new(|| None));
        b.stamp(&key("a"));
        let gc = b.gc_began(None, None);
        assert_eq!(gc, GcStart(0));
        assert_eq!(b.born(&key("a"), gc), Born::After);
        assert_eq!(b.born(&key("b"), gc), Born::Unknown);
    }
}
