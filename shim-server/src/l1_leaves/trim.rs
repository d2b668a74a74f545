//! Giving freed memory back to the system, after a burst of work and during a long one.
//!
//! glibc keeps freed heap pages for reuse, so after a burst (a node starting a hundred pods,
//! a GC of a thousand stale attachments) dipamd's RSS stays at the burst's high-water mark
//! although the memory is free. `malloc_trim(0)` returns it. Called when dipamd has been idle
//! for a whole [`IDLE`] after some activity, and, while requests never stop for that long,
//! at most once every [`BUSY_EVERY`]: under continuous churn the free chunks scattered
//! through dipamd's one arena (daemon/mod.rs, `tune_allocator`) kept their pages, and its RSS
//! climbed with the cycles while the memory in use did not (docs/performance.md, run 42).
//! Never on the request path, and not repeatedly while nothing happens.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::time::Instant;

/// How long without requests counts as "the burst is over".
pub const IDLE: Duration = Duration::from_secs(10);

/// The longest dipamd goes without a trim while requests keep coming. A trim of dipamd's
/// heap under churn took 0.2-3.4 ms, median 0.5 (docs/performance.md run 42): once every
/// 30 s, under 0.01 % of one core, and at most one request in 30 s waits behind it.
pub const BUSY_EVERY: Duration = Duration::from_secs(30);

static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// Notes that a request was served.
pub fn touch() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
}

/// How often the activity counter is looked at.
const TICK: Duration = Duration::from_secs(1);

/// When to trim, from the activity counter read every tick.
#[derive(Debug)]
struct Schedule {
    /// The counter at the last tick, and at the last trim.
    seen: u64,
    trimmed_at: u64,
    /// Since when the counter has not moved; when the last trim ran.
    quiet_since: Instant,
    last_trim: Instant,
}

impl Schedule {
    fn new(activity: u64, now: Instant) -> Self {
        Self {
            seen: activity,
            trimmed_at: activity,
            quiet_since: now,
            last_trim: now,
        }
    }

    /// Whether to trim now, the counter reading `activity`, and why: only if something was
    /// served since the last trim, and then once the burst is over ([`IDLE`]) or, if it goes
    /// on, once [`BUSY_EVERY`] has passed since the last trim.
    fn due(&mut self, activity: u64, now: Instant) -> Option<&'static str> {
        if activity != self.seen {
            self.quiet_since = now;
        }
        self.seen = activity;
        if activity == self.trimmed_at {
            return None;
        }
        let why = if now.duration_since(self.quiet_since) >= IDLE {
            "idle"
        } else if now.duration_since(self.last_trim) >= BUSY_EVERY {
            "busy"
        } else {
            return None;
        };
        self.trimmed_at = activity;
        self.last_trim = now;
        Some(why)
    }
}

/// Trims the heap forever: between IDLE and IDLE + TICK after a burst's last request, and
/// every BUSY_EVERY (to a TICK) while requests go on.
pub async fn run() {
    let mut schedule = Schedule::new(ACTIVITY.load(Ordering::Relaxed), Instant::now());
    loop {
        tokio::time::sleep(TICK).await;
        if let Some(why) = schedule.due(ACTIVITY.load(Ordering::Relaxed), Instant::now()) {
            // malloc_trim walks the heap; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(move || trim(why)).await;
        }
    }
}

/// Trims the heap, and says at debug level what it gave back and what it took.
fn trim(why: &'static str) {
    let (rss_before_kib, heap_kib) = memory();
    let at = std::time::Instant::now();
    // SAFETY: malloc_trim only releases free memory to the OS; it is thread-safe.
    unsafe { libc::malloc_trim(0) };
    let took_us = at.elapsed().as_micros() as u64;
    let (rss_kib, _) = memory();
    tracing::debug!(
        why,
        rss_before_kib,
        rss_kib,
        heap_kib,
        took_us,
        "heap trimmed"
    );
}

/// dipamd's resident memory and the heap's bytes in use (KiB): their difference is what the
/// allocator holds free (fragmentation, or freed but not returned), the rest what dipamd keeps.
pub fn memory() -> (u64, u64) {
    // SAFETY: sysconf only reads a system setting.
    let page_kib = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64 / 1024;
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page_kib);
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    (rss, ((info.uordblks + info.hblkhd) / 1024) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = TICK;

    #[test]
    fn a_burst_is_trimmed_once_when_it_is_over() {
        let start = Instant::now();
        let mut s = Schedule::new(0, start);
        // Five seconds of requests, then silence.
        let mut trims = Vec::new();
        for tick in 1..=40u32 {
            let activity = u64::from(tick.min(5));
            if s.due(activity, start + T * tick).is_some() {
                trims.push(tick);
            }
        }
        // Quiet since tick 5: due at 5 + IDLE, and never again with no new request.
        assert_eq!(trims, vec![5 + IDLE.as_secs() as u32]);
    }

    #[test]
    fn continuous_requests_are_trimmed_every_busy_every() {
        let start = Instant::now();
        let mut s = Schedule::new(0, start);
        let mut trims = Vec::new();
        let ticks = 3 * BUSY_EVERY.as_secs() as u32 + 1;
        for tick in 1..=ticks {
            if s.due(u64::from(tick) * 40, start + T * tick).is_some() {
                trims.push(tick);
            }
        }
        let every = BUSY_EVERY.as_secs() as u32;
        assert_eq!(trims, vec![every, 2 * every, 3 * every]);
    }

    #[test]
    fn nothing_served_is_never_trimmed() {
        let start = Instant::now();
        let mut s = Schedule::new(7, start);
        let ticks = 2 * BUSY_EVERY.as_secs() as u32;
        assert!((1..=ticks).all(|tick| s.due(7, start + T * tick).is_none()));
    }

    #[test]
    fn a_burst_ending_just_after_a_busy_trim_is_trimmed_again_when_idle() {
        let start = Instant::now();
        let mut s = Schedule::new(0, start);
        let every = BUSY_EVERY.as_secs() as u32;
        let mut trims = Vec::new();
        // Requests until two ticks after the first busy trim, then silence.
        for tick in 1..=every + 20 {
            let activity = u64::from(tick.min(every + 2));
            if s.due(activity, start + T * tick).is_some() {
                trims.push(tick);
            }
        }
        assert_eq!(trims, vec![every, every + 2 + IDLE.as_secs() as u32]);
    }
}
