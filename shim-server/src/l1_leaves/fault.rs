//! Crash points for fault-injection tests, compiled in only with the `fault-injection` feature
//! (the lifecycle tests build dipamd with it; release builds never contain it).
//!
//! `dipamd --crash-at POINT` makes the daemon SIGKILL itself the first time it reaches POINT:
//! exactly what an OOM kill or a node crash at that instant would leave behind.

/// The points, in the order an ADD or DEL passes them; then the warm pool's take (right after
/// the commit that hands an entry to a pod) and release (after the entry is marked
/// `deleting`, and after it is forgotten); then GC's (gc/collect/mod.rs): right after the first
/// chunk of stale records is marked `deleting`, and before the first group commit that
/// forgets released records (other DELs still running). A pool entry's fill passes the ADD
/// points. At start, after a reboot: right after the first pod of the earlier boot is freed
/// (replay/reboot/mod.rs), before the new boot id is written.
pub const POINTS: &[&str] = &[
    "add-after-intent",
    "add-after-exec",
    "add-before-commit",
    "add-after-commit",
    "del-after-mark",
    "del-after-exec",
    "pool-after-take",
    "pool-release-after-mark",
    "pool-after-release",
    "gc-after-mark",
    "gc-before-forget",
    "reboot-after-release",
];

/// The points where `dipamd --pause-at POINT=FILE` holds the daemon's work until FILE exists
/// (deleted again when it goes on): a window a test must hit every time, not by luck. GC's
/// `gc-before-read` is after the GC began and before it reads the ledger (gc/collect/mod.rs);
/// `start-before-ledger` is a start that holds the socket's lock and has not opened its
/// ledger yet (daemon/mod.rs): the seconds a loaded node's start takes, made as long as a
/// test needs.
pub const PAUSE_POINTS: &[&str] = &["gc-before-read", "start-before-ledger"];

#[cfg(feature = "fault-injection")]
static ARMED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[cfg(feature = "fault-injection")]
static PAUSE: std::sync::OnceLock<(String, std::path::PathBuf)> = std::sync::OnceLock::new();

/// A `--crash-at` or `--pause-at` dipamd cannot arm.
#[cfg(feature = "fault-injection")]
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("--pause-at {0:?}: expected POINT=FILE")]
    PauseSpec(String),
    #[error("unknown pause point {0:?}; points: {points}", points = PAUSE_POINTS.join(", "))]
    UnknownPause(String),
    #[error("unknown crash point {0:?}; points: {points}", points = POINTS.join(", "))]
    UnknownCrash(String),
}

/// Arms a pause point: `POINT=FILE` (once per process).
#[cfg(feature = "fault-injection")]
pub fn arm_pause(spec: &str) -> Result<(), FaultError> {
    let (point, file) = spec
        .split_once('=')
        .filter(|(_, f)| !f.is_empty())
        .ok_or_else(|| FaultError::PauseSpec(spec.to_owned()))?;
    if !PAUSE_POINTS.contains(&point) {
        return Err(FaultError::UnknownPause(point.to_owned()));
    }
    let _ = PAUSE.set((point.to_owned(), file.into()));
    Ok(())
}

/// Reached pause point `point`: if it is the armed one, waits until its file exists (60 s at
/// most), deletes it and goes on.
pub async fn pause(point: &str) {
    #[cfg(feature = "fault-injection")]
    if let Some((armed, file)) = PAUSE.get()
        && armed == point
    {
        tracing::warn!(point, file = %file.display(), "fault injection: pausing until the file exists");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !tokio::fs::try_exists(file).await.unwrap_or(false)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let _ = tokio::fs::remove_file(file).await;
        tracing::warn!(point, "fault injection: resumed");
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}

/// Arms `point` (once per process).
#[cfg(feature = "fault-injection")]
pub fn arm(point: &str) -> Result<(), FaultError> {
    if !POINTS.contains(&point) {
        return Err(FaultError::UnknownCrash(point.to_owned()));
    }
    let _ = ARMED.set(point.to_owned());
    Ok(())
}

/// Whether `point` is the armed one: for a point that first lets something else happen (see
/// `add-before-commit` in core/attach.rs).
pub fn armed(point: &str) -> bool {
    #[cfg(feature = "fault-injection")]
    return ARMED.get().is_some_and(|p| p == point);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = point;
        false
    }
}

/// Reached `point`: dies here if it is the armed one.
#[inline]
pub fn hit(point: &str) {
    #[cfg(feature = "fault-injection")]
    if armed(point) {
        tracing::error!(point, "fault injection: SIGKILL now");
        // SIGKILL to our own pid cannot be caught, so nothing runs after it.
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}
