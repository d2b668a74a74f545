//! Delegates that outlive a killed dipamd.
//!
//! When dipamd is SIGKILLed mid-exec, the delegate keeps running. If it finished after the
//! next start's replay DEL, it would hold an address nobody records (F1). Killing it with
//! dipamd (PR_SET_PDEATHSIG) is worse: host-local creates its reservation file first and
//! writes the owner into it second, so a kill in between leaves an empty file that no DEL
//! ever matches — a permanent leak. So every running delegate is noted in
//! `<state-dir>/exec/`, and the next start waits for the survivors to finish — killing only
//! one that outlives the delegate timeout — before it replays anything.
//!
//! A note is the delegate's pid and the window of kernel clock ticks in which it was
//! started, which tells a reused pid apart: the kernel's start time of the process
//! (/proc/<pid>/stat) lies in that window. It is one `pwrite` into a slot of
//! [`SLOTS_FILE`], made on the request's own task: reading the start time back from /proc
//! waits for the exec in progress (~1 ms), and a file per delegate cost a create and an
//! unlink (two file-system metadata operations) on every pod's ADD and DEL
//! (docs/performance.md). Not fsynced: a note only matters across a process crash, which
//! leaves the page cache intact; a node crash ends the delegate too.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::{info, warn};

/// The notes' file in the tracker's directory: fixed-size slots, one per delegate in flight.
/// (Notes of dipamd versions before it are one file per pid, named by the pid, in the same
/// directory; [`Tracker::settle`] honours those too.)
pub const SLOTS_FILE: &str = "slots";

/// One slot: `<pid> <first tick> <last tick>`, space-padded, newline-terminated; all zeros
/// when free.
const SLOT: usize = 64;

/// The kernel's start time of `pid` (clock ticks since boot), field 22 of /proc/<pid>/stat.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The clock /proc/<pid>/stat's start time is counted in: CLOCK_BOOTTIME, in clock ticks
/// (USER_HZ), rounded down as the kernel does.
pub fn ticks_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; CLOCK_BOOTTIME
    // exists on every Linux dipam runs on (2.6.39+).
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        hz if hz > 0 => hz as u64,
        _ => 100,
    };
    let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    ns / (1_000_000_000 / hz)
}

/// Notes running delegates. Cheap to clone: clones share the slots.
#[derive(Debug, Clone)]
pub struct Tracker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// `None` if the file could not be opened: delegates then run unnoted (as they would
    /// with no state directory), and the failure was logged once.
    slots: Option<File>,
    /// Free slot numbers, and the number of slots ever used.
    free: Mutex<(Vec<u64>, u64)>,
}

impl Tracker {
    /// The tracker of the notes in `dir`. Call [`Tracker::settle`] before noting anything:
    /// notes left by a killed predecessor are in the same slots.
    pub fn new(dir: PathBuf) -> Self {
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(SLOTS_FILE);
        let slots = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .inspect_err(|e| {
                warn!(path = %path.display(), error = %e, "cannot note running delegates; a restart after a crash will not wait for them");
            })
            .ok();
        Self {
            inner: Arc::new(Inner {
                dir,
                slots,
                free: Mutex::new((Vec::new(), 0)),
            }),
        }
    }

    /// Notes `pid`, started at or after clock tick `since` ([`ticks_now`] read before the
    /// spawn), until the returned guard is dropped.
    pub fn note(&self, pid: u32, since: u64) -> Noted {
        let until = ticks_now();
        let Some(file) = &self.inner.slots else {
            return Noted { slot: None };
        };
        let slot = {
            let Ok(mut free) = self.inner.free.lock() else {
                return Noted { slot: None };
            };
            let (list, used) = &mut *free;
            list.pop().unwrap_or_else(|| {
                *used += 1;
                *used - 1
            })
        };
        let mut text = format!("{pid} {since} {until}").into_bytes();
        text.resize(SLOT - 1, b' ');
        text.push(b'\n');
        let _ = file.write_all_at(&text, slot * SLOT as u64);
        Noted {
            slot: Some((self.inner.clone(), slot)),
        }
    }

    /// Waits for every delegate a previous dipamd left running, killing those that outlive
    /// `timeout`, then forgets them.
    pub fn settle(&self, timeout: Duration) {
        if let Some(file) = &self.inner.slots {
            let path = self.inner.dir.join(SLOTS_FILE);
            for (pid, since, until) in std::fs::read(&path)
                .unwrap_or_default()
                .chunks(SLOT)
                .filter_map(parse_slot)
            {
                wait_or_kill(pid, since..=until, timeout);
            }
            let _ = file.set_len(0);
        }
        let Ok(entries) = std::fs::read_dir(&self.inner.dir) else {
            return;
        };
        // One file per pid, holding its start time: what dipamd wrote before the slots.
        for e in entries.filter_map(Result::ok) {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let path = e.path();
            let noted: Option<u64> = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            if let Some(noted) = noted {
                wait_or_kill(pid, noted..=noted, timeout);
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `(pid, first tick, last tick)` of a slot in use.
fn parse_slot(slot: &[u8]) -> Option<(u32, u64, u64)> {
    let text = std::str::from_utf8(slot).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let pid = fields.next()?.parse().ok()?;
    let since = fields.next()?.parse().ok()?;
    let until = fields.next()?.parse().ok()?;
    Some((pid, since, until))
}

fn wait_or_kill(pid: u32, started: std::ops::RangeInclusive<u64>, timeout: Duration) {
    let alive = || start_time(pid).is_some_and(|t| started.contains(&t));
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
        // SAFETY: kill(2) on a pid whose start time is that of the delegate we noted.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
        while alive() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Frees its slot on drop.
pub struct Noted {
    slot: Option<(Arc<Inner>, u64)>,
}

impl Drop for Noted {
    fn drop(&mut self) {
        let Some((inner, slot)) = self.slot.take() else {
            return;
        };
        if let Some(file) = &inner.slots {
            let _ = file.write_all_at(&[0; SLOT], slot * SLOT as u64);
        }
        if let Ok(mut free) = inner.free.lock() {
            free.0.push(slot);
        }
    }
}

/// The tracker's directory under a state directory.
pub fn dir_in(state_dir: &Path) -> PathBuf {
    state_dir.join("exec")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(secs: &str) -> (std::process::Child, u64) {
        let since = ticks_now();
        let child = std::process::Command::new("sleep")
            .arg(secs)
            .spawn()
            .unwrap();
        (child, since)
    }

    /// What a restarted dipamd does: a new tracker on the same directory settles.
    fn settle_as_successor(dir: &Path, timeout: Duration) -> Duration {
        let started = Instant::now();
        Tracker::new(dir.to_path_buf()).settle(timeout);
        started.elapsed()
    }

    #[test]
    fn a_successor_waits_for_a_survivor_and_ignores_stale_notes() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        let t = Tracker::new(dir.clone());
        let (mut child, since) = sleeper("0.3");
        let noted = t.note(child.id(), since);
        assert_eq!(start_time(child.id()).map(|s| s >= since), Some(true));
        std::mem::forget(noted); // as if dipamd died with the delegate running
        // This test's own pid, alive, but not started in the noted window: a reused pid.
        std::mem::forget(t.note(std::process::id(), u64::MAX - 1));
        // A finished delegate's slot is freed, and not waited for.
        drop(t.note(std::process::id(), 0));
        let reaper = std::thread::spawn(move || child.wait());
        let waited = settle_as_successor(&dir, Duration::from_secs(5));
        assert!(waited >= Duration::from_millis(200), "did not wait");
        assert!(waited < Duration::from_secs(4), "waited for a stale note");
        assert!(
            reaper.join().unwrap().unwrap().success(),
            "was killed instead"
        );
        // Settled notes are forgotten: the next start has nothing to wait for.
        assert_eq!(std::fs::metadata(dir.join(SLOTS_FILE)).unwrap().len(), 0);
    }

    #[test]
    fn slots_are_reused() {
        let d = tempfile::tempdir().unwrap();
        let t = Tracker::new(d.path().join("exec"));
        let a = t.note(1, 0);
        let b = t.note(2, 0);
        drop(a);
        let _c = t.note(3, 0);
        drop(b);
        let _d = t.note(4, 0);
        let notes: Vec<_> = std::fs::read(d.path().join("exec").join(SLOTS_FILE))
            .unwrap()
            .chunks(SLOT)
            .filter_map(parse_slot)
            .map(|(pid, ..)| pid)
            .collect();
        assert_eq!(notes, [3, 4]);
    }

    #[test]
    fn a_successor_honours_an_older_dipamds_notes() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        std::fs::create_dir_all(&dir).unwrap();
        let (mut child, _) = sleeper("0.3");
        let started = start_time(child.id()).unwrap();
        std::fs::write(dir.join(child.id().to_string()), started.to_string()).unwrap();
        let reaper = std::thread::spawn(move || child.wait());
        assert!(settle_as_successor(&dir, Duration::from_secs(5)) >= Duration::from_millis(200));
        assert!(reaper.join().unwrap().unwrap().success());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "only the slots file"
        );
    }

    #[test]
    fn kills_one_that_outlives_the_timeout() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        let (mut child, since) = sleeper("30");
        std::mem::forget(Tracker::new(dir.clone()).note(child.id(), since));
        let reaper = std::thread::spawn(move || child.wait());
        settle_as_successor(&dir, Duration::from_millis(100));
        assert!(!reaper.join().unwrap().unwrap().success());
    }
}
