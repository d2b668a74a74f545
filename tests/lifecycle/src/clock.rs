//! A real step of the machine's wall clock (CLOCK_REALTIME), as NTP or an operator makes one,
//! undone on drop. Everything on the machine sees it: the plugin, dipamd and host-local. The
//! binaries are static, so a per-process fake clock (libfaketime) cannot reach them, and only
//! the real step proves that no outcome depends on the wall clock.
//!
//! The test that holds one must run alone in its test binary (`tests/daemon/clock.rs`): a test
//! binary's tests run in parallel, and cargo runs the binaries one after another.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The wall clock stepped by a signed number of milliseconds until dropped. On drop the wall
/// clock is set to where it would be without the step: its reading at the step plus the time
/// elapsed on the monotonic clock since, so the machine does not keep the step.
pub struct ClockStep {
    wall_before: Duration,
    at: Instant,
}

impl ClockStep {
    /// Steps the wall clock by `ms` (negative: back). Needs CAP_SYS_TIME.
    pub fn by_ms(ms: i64) -> Self {
        let at = Instant::now();
        let wall_before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the wall clock is after 1970");
        let target = if ms < 0 {
            wall_before - Duration::from_millis(ms.unsigned_abs())
        } else {
            wall_before + Duration::from_millis(ms.unsigned_abs())
        };
        set_wall(target).expect("step the wall clock (needs CAP_SYS_TIME)");
        Self { wall_before, at }
    }
}

impl Drop for ClockStep {
    fn drop(&mut self) {
        let now = self.wall_before + self.at.elapsed();
        if let Err(e) = set_wall(now) {
            eprintln!("could not undo a wall clock step: {e}; the clock is off by the step");
        }
    }
}

fn set_wall(t: Duration) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `ts` is a valid, initialised timespec that outlives the call.
    let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
