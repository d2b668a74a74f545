//! Delegates that outlive a killed dipamd.
//!
//! When dipamd is SIGKILLed mid-exec, the delegate keeps running. If it finished after the
//! next start's replay DEL, it would hold an address nobody records (F1). Killing it with
//! dipamd (PR_SET_PDEATHSIG) is worse: host-local creates its reservation file first and
//! writes the owner into it second, so a kill in between leaves an empty file that no DEL
//! ever matches — a permanent leak. So every running delegate is noted in `<state-dir>/exec/`
//! (its pid and start time, which tell a reused pid apart), and the next start waits for the
//! survivors to finish — killing only one that outlives the delegate timeout — before it
//! replays anything.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracing::{info, warn};

/// The kernel's start time of `pid` (clock ticks since boot), field 22 of /proc/<pid>/stat.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Notes running delegates.
#[derive(Debug, Clone)]
pub struct Tracker {
    dir: PathBuf,
}

impl Tracker {
    pub fn new(dir: PathBuf) -> Self {
        let _ = std::fs::create_dir_all(&dir);
        Self { dir }
    }

    /// Notes `pid` until the returned guard is dropped. Not fsynced: it only matters across a
    /// process crash, which leaves the page cache intact; a node crash ends the delegate too.
    pub fn note(&self, pid: u32) -> Noted {
        let path = self.dir.join(pid.to_string());
        if let Some(t) = start_time(pid) {
            let _ = std::fs::write(&path, t.to_string());
        }
        Noted { path }
    }

    /// Waits for every delegate a previous dipamd left running, killing those that outlive
    /// `timeout`, then forgets them.
    pub fn settle(&self, timeout: Duration) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            let path = e.path();
            let pid: Option<u32> = e.file_name().to_string_lossy().parse().ok();
            let noted: Option<u64> = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if let (Some(pid), Some(noted)) = (pid, noted) {
                wait_or_kill(pid, noted, timeout);
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn wait_or_kill(pid: u32, noted: u64, timeout: Duration) {
    let alive = || start_time(pid) == Some(noted);
    if !alive() {
        return;
    }
    info!(
        pid,
        "waiting for a delegate left running by the previous dipamd"
    );
    let deadline = Instant::now() + timeout;
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive() {
        warn!(pid, "delegate outlived the delegate timeout; killing it");
        // SAFETY: kill(2) on a pid whose start time matches the delegate we noted.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
        while alive() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Removes its note on drop.
pub struct Noted {
    path: PathBuf,
}

impl Drop for Noted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The tracker's directory under a state directory.
pub fn dir_in(state_dir: &Path) -> PathBuf {
    state_dir.join("exec")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_survivor_and_ignores_stale_notes() {
        let d = tempfile::tempdir().unwrap();
        let t = Tracker::new(d.path().join("exec"));
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let noted = t.note(child.id());
        std::mem::forget(noted); // as if dipamd died with the delegate running
        // A note for a pid that is not (or no longer) what was noted.
        std::fs::write(d.path().join("exec").join("999999"), "1").unwrap();
        let started = Instant::now();
        let reaper = std::thread::spawn(move || child.wait());
        t.settle(Duration::from_secs(5));
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "did not wait"
        );
        assert!(
            reaper.join().unwrap().unwrap().success(),
            "was killed instead"
        );
        assert_eq!(std::fs::read_dir(d.path().join("exec")).unwrap().count(), 0);
    }

    #[test]
    fn kills_one_that_outlives_the_timeout() {
        let d = tempfile::tempdir().unwrap();
        let t = Tracker::new(d.path().join("exec"));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::mem::forget(t.note(child.id()));
        let reaper = std::thread::spawn(move || child.wait());
        t.settle(Duration::from_millis(100));
        assert!(!reaper.join().unwrap().unwrap().success());
    }
}
