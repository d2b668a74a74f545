//! Delegates that outlive a killed dipamd (the survivors; not to be confused with orphaned
//! reservations, which are addresses no ledger record accounts for, divergence/).
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
//! (`/proc/<pid>/stat`) lies in that window. It is one `pwrite` into a slot of
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

/// What /proc/<pid>/stat says about a process: its state letter (field 3) and the kernel's
/// start time (clock ticks since boot, field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    state: char,
    start: u64,
}

impl Stat {
    /// Whether the process can still run code. A zombie (Z) has exited and only waits for
    /// its parent to reap it, which may never happen (a container whose PID 1 does not
    /// reap); X (and x, on older kernels) is a process being torn down. Neither can still
    /// write a reservation, so neither is worth waiting for, and SIGKILL changes nothing
    /// about them.
    fn runs(self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the text of /proc/<pid>/stat. The command name (field 2) is in parentheses and may
/// itself contain spaces and parentheses (a process may name itself anything up to 15 bytes,
/// `prctl(PR_SET_NAME)`), so the fields are counted from the *last* `)`: nothing after it
/// can contain one.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_ascii_whitespace();
    let mut state_field = fields.next()?.chars();
    let state = state_field.next()?;
    if state_field.next().is_some() {
        return None;
    }
    // Fields 4..=21 lie between the state and the start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start })
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The kernel's start time of `pid` (clock ticks since boot), field 22 of /proc/<pid>/stat.
#[cfg(test)]
fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start)
}

/// The clock `/proc/<pid>/stat`'s start time is counted in: CLOCK_BOOTTIME, in clock ticks
/// (USER_HZ), rounded down as the kernel does.
pub fn ticks_now() -> u64 {
    // CLOCK_BOOTTIME exists on every Linux dipam runs on (2.6.39+).
    let Ok(ts) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) else {
        return 0;
    };
    let hz = match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as u64,
        _ => 100,
    };
    let ns = ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64;
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
            return Noted {
                slot: None,
                keep_if_abandoned: false,
            };
        };
        let slot = {
            let Ok(mut free) = self.inner.free.lock() else {
                return Noted {
                    slot: None,
                    keep_if_abandoned: false,
                };
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
            keep_if_abandoned: false,
        }
    }

    /// Waits for every delegate a previous dipamd left running, killing those that outlive
    /// `timeout`, then forgets them. Returns the kills the kernel refused for lack of a
    /// privilege (a delegate running as another user, and no CAP_KILL), for status and doctor.
    pub fn settle(&self, timeout: Duration) -> Vec<String> {
        let mut denied = Vec::new();
        let mut wait = |pid, started, timeout| {
            if let Err(e) = wait_or_kill(pid, started, timeout) {
                denied.push(format!(
                    "killing delegate pid {pid} left by the previous dipamd: {e}"
                ));
            }
        };
        if let Some(file) = &self.inner.slots {
            let path = self.inner.dir.join(SLOTS_FILE);
            for (pid, since, until) in std::fs::read(&path)
                .unwrap_or_default()
                .chunks(SLOT)
                .filter_map(parse_slot)
            {
                wait(pid, since..=until, timeout);
            }
            let _ = file.set_len(0);
        }
        let Ok(entries) = std::fs::read_dir(&self.inner.dir) else {
            return denied;
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
                wait(pid, noted..=noted, timeout);
            }
            let _ = std::fs::remove_file(&path);
        }
        denied
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

/// How long to wait for a delegate to disappear after SIGKILL. The kernel ends a killed
/// process at once unless it is stuck in an uninterruptible sleep (state D, e.g. on a hung
/// NFS mount); a start must not wait on that forever. A delegate still running after it is
/// left alone: its note is dropped and its late result, if any, is what the start-up replay
/// and the periodic reconcile exist for.
pub const KILL_WAIT: Duration = Duration::from_secs(2);

/// Waits (at most `timeout`, then [`KILL_WAIT`] after a SIGKILL) for the delegate noted as
/// `pid`, started within `started`, to stop running. Fails only when the kernel refused the
/// kill for lack of a privilege; a delegate that outlives every bound is logged and left.
fn wait_or_kill(
    pid: u32,
    started: std::ops::RangeInclusive<u64>,
    timeout: Duration,
) -> Result<(), std::io::Error> {
    // A reused pid (start time outside the window) is someone else's process; a zombie is a
    // delegate that has finished (see [`Stat::runs`]).
    let alive = || stat(pid).is_some_and(|s| started.contains(&s.start) && s.runs());
    if !alive() {
        return Ok(());
    }
    info!(
        pid,
        "waiting for a delegate left running by the previous dipamd"
    );
    let deadline = Instant::now() + timeout;
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !alive() {
        return Ok(());
    }
    warn!(pid, "delegate outlived the delegate timeout; killing it");
    // The pid's start time is that of the delegate we noted: it is not a reused pid.
    if let Err(errno) = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        let e = std::io::Error::from(errno);
        warn!(pid, error = %e, "cannot kill the delegate; starting without waiting for it");
        return match e.raw_os_error() {
            Some(errno) if crate::l1_leaves::privilege::is_denial(errno) => Err(e),
            _ => Ok(()),
        };
    }
    let deadline = Instant::now() + KILL_WAIT;
    while alive() {
        if Instant::now() >= deadline {
            warn!(
                pid,
                state = stat(pid).map(|s| s.state.to_string()).unwrap_or_default(),
                "delegate still running after SIGKILL; starting without it"
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Frees its slot on drop, unless it was kept for a delegate still running
/// ([`Noted::kept_if_abandoned`]).
pub struct Noted {
    slot: Option<(Arc<Inner>, u64)>,
    keep_if_abandoned: bool,
}

impl Noted {
    /// A note that stays in the file when it is dropped before [`Noted::finish`]: for a
    /// delegate that keeps running after the future awaiting it is dropped (an ADD, which is
    /// never signalled for that, exec.rs). A dipamd stopping drops that future; the note then
    /// is what makes the next start wait for the delegate before it replays the ADD. Cleared,
    /// that note let the replay release the ADD while host-local was still to reserve: the
    /// reservation it then wrote was no one's, and the runtime's retry failed (CNI error 999,
    /// "duplicate allocation") (shutdown.rs, a request that outlasts the drain).
    pub fn kept_if_abandoned(mut self, keep: bool) -> Self {
        self.keep_if_abandoned = keep;
        self
    }

    /// The delegate has ended, or was killed: its note goes.
    pub fn finish(mut self) {
        self.keep_if_abandoned = false;
    }
}

impl Drop for Noted {
    fn drop(&mut self) {
        if self.keep_if_abandoned {
            // Left for the successor; its slot number is not reused by this dipamd, which
            // is stopping (an ADD's future is dropped only then: it runs in its own task).
            return;
        }
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

    /// An ADD's note survives the drop of the future awaiting it (dipamd stopping while the
    /// delegate runs), so the successor waits for the delegate; a finished one's goes.
    #[test]
    fn an_abandoned_adds_note_stays_for_the_successor() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        let t = Tracker::new(dir.clone());
        let (mut child, since) = sleeper("0.3");
        drop(t.note(child.id(), since).kept_if_abandoned(true));
        t.note(std::process::id(), 0)
            .kept_if_abandoned(true)
            .finish();
        let notes: Vec<_> = std::fs::read(dir.join(SLOTS_FILE))
            .unwrap()
            .chunks(SLOT)
            .filter_map(parse_slot)
            .map(|(pid, ..)| pid)
            .collect();
        assert_eq!(
            notes,
            [child.id()],
            "the abandoned note went, or the finished one stayed"
        );
        let reaper = std::thread::spawn(move || child.wait());
        let waited = settle_as_successor(&dir, Duration::from_secs(5));
        assert!(waited >= Duration::from_millis(150), "did not wait");
        assert!(reaper.join().unwrap().unwrap().success());
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

    /// A /proc/<pid>/stat line with `comm` and `state`, start time 4242 (field 22).
    fn stat_line(comm: &str, state: char) -> String {
        let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
        fields[22 - 4] = "4242".into();
        format!("1234 ({comm}) {state} {}\n", fields.join(" "))
    }

    #[test]
    fn stat_parsing_survives_any_command_name() {
        for comm in [
            "host-local",
            "a b c",
            "(sd-pam)",
            ") Z 1 2 3",
            "x) (y",
            "((((",
            "))))",
            "",
        ] {
            for state in ['S', 'R', 'D', 'Z', 'X'] {
                assert_eq!(
                    parse_stat(&stat_line(comm, state)),
                    Some(Stat { state, start: 4242 }),
                    "comm {comm:?} state {state}"
                );
            }
        }
        // What the kernel writes for this very process parses, and says it runs.
        let me = stat(std::process::id()).unwrap();
        assert!(me.runs() && me.start > 0, "{me:?}");
    }

    #[test]
    fn stat_parsing_refuses_what_is_not_a_stat_line() {
        for bad in [
            "",
            "1234",
            "1234 (comm",
            "1234 (comm) S 1 2",
            "1234 (comm) SZ 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22",
            "1234 (comm) S 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 x",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn zombies_and_dead_processes_do_not_run() {
        for (state, runs) in [
            ('R', true),
            ('S', true),
            ('D', true),
            ('T', true),
            ('t', true),
            ('I', true),
            ('Z', false),
            ('X', false),
            ('x', false),
        ] {
            assert_eq!(Stat { state, start: 1 }.runs(), runs, "state {state}");
        }
    }

    /// Runs `f` on a thread and fails the test if it has not returned within `limit` (a
    /// regression here is a hang, not a slow test).
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .expect("settle did not return: it waits on a process that can never run again")
    }

    #[test]
    fn an_unreaped_zombie_is_not_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        let (mut child, since) = sleeper("0");
        std::mem::forget(Tracker::new(dir.clone()).note(child.id(), since));
        // Not reaped: it stays a zombie (state Z) until the wait below.
        let pid = child.id();
        while stat(pid).is_some_and(Stat::runs) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(stat(pid).map(|s| s.state), Some('Z'));
        // A delegate timeout no test would sit through: only not waiting passes.
        let waited = within(Duration::from_secs(30), move || {
            settle_as_successor(&dir, Duration::from_secs(3600))
        });
        assert!(waited < Duration::from_secs(30));
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn the_wait_after_the_kill_ends_even_if_nobody_reaps() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("exec");
        let (mut child, since) = sleeper("30");
        std::mem::forget(Tracker::new(dir.clone()).note(child.id(), since));
        // Nobody reaps it until settle returns: after SIGKILL it is a zombie, which the
        // old loop counted as alive forever.
        within(Duration::from_secs(20), move || {
            settle_as_successor(&dir, Duration::from_millis(100))
        });
        assert!(!child.wait().unwrap().success());
    }
}
