//! Giving freed memory back to the system once a burst of work is over.
//!
//! glibc keeps freed heap pages for reuse, so after a burst (a node starting a hundred pods,
//! a GC of a thousand stale attachments) dipamd's RSS stays at the burst's high-water mark
//! although the memory is free. `malloc_trim(0)` returns it. Called only when dipamd has been
//! idle for a whole [`IDLE`] after some activity: never on the request path, and not
//! repeatedly while nothing happens.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// How long without requests counts as "the burst is over".
pub const IDLE: Duration = Duration::from_secs(10);

static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// Notes that a request was served.
pub fn touch() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
}

/// How often the activity counter is looked at.
const TICK: Duration = Duration::from_secs(1);

/// Trims the heap after each burst, forever: between IDLE and IDLE + TICK after its last
/// request.
pub async fn run() {
    let mut seen = ACTIVITY.load(Ordering::Relaxed);
    let mut trimmed_at = seen;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(TICK).await;
        let now = ACTIVITY.load(Ordering::Relaxed);
        if now != seen {
            quiet_since = tokio::time::Instant::now();
        } else if now != trimmed_at && quiet_since.elapsed() >= IDLE {
            // malloc_trim walks the heap; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(|| {
                // SAFETY: malloc_trim only releases free memory to the OS; it is thread-safe.
                unsafe { libc::malloc_trim(0) }
            })
            .await;
            trimmed_at = now;
        }
        seen = now;
    }
}
