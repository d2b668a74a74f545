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

/// Trims the heap after each burst, forever.
pub async fn run() {
    let mut seen = ACTIVITY.load(Ordering::Relaxed);
    let mut trimmed_at = seen;
    loop {
        tokio::time::sleep(IDLE).await;
        let now = ACTIVITY.load(Ordering::Relaxed);
        if now == seen && now != trimmed_at {
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
