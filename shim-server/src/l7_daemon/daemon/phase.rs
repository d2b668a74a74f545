//! What each phase of the start costs, in time and memory, logged at debug level as it ends:
//! at 10,000 attachments the start took 1.4 s and left dipamd at 176 MiB, and these lines say
//! which phase (docs/performance.md, "Density", run 29).

use std::{sync::Mutex, time::Instant};

/// The start-up phases' clock.
pub struct Phase(Mutex<Instant>);

impl Phase {
    pub fn new() -> Self {
        Self(Mutex::new(Instant::now()))
    }

    /// Logs `name`'s time since the previous phase ended, and the memory now.
    pub fn done(&self, name: &str) {
        let Ok(mut at) = self.0.lock() else { return };
        let (rss_kib, heap_kib) = crate::l1_leaves::trim::memory();
        tracing::debug!(
            phase = name,
            elapsed_ms = at.elapsed().as_secs_f64() * 1e3,
            cpu_ms = cpu_ms(),
            rss_kib,
            heap_kib,
            "start-up phase done"
        );
        *at = Instant::now();
    }
}

/// The CPU time dipamd has used since it started (user and system, every thread), in ms:
/// on a loaded machine the wall-clock time of a phase measures the scheduler, its CPU time
/// what the phase costs.
pub fn cpu_ms() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the struct it is given.
    let failed = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0;
    if failed {
        return 0.0;
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}
