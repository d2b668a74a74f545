//! The shapes nodes run dipamd in, for the tests against real peers: the shipped systemd
//! unit's capability set, non-default paths, and SIGKILL at random moments from a seed that
//! is printed (and replayed with `DIPAM_SEED`).

use std::path::{Path, PathBuf};

use crate::bins;

/// `setpriv` with the shipped unit's (deploy/systemd/dipamd.service) `CapabilityBoundingSet`
/// and `NoNewPrivileges`, execing what follows: dipamd runs with what the unit leaves it.
pub fn shipped_unit_setpriv() -> Vec<String> {
    crate::restrictions::shipped_unit().setpriv()
}

/// The `ReadWritePaths=` of the shipped unit and then of each drop-in in `dropins`, in that
/// order: lines add up, an empty one resets the list (systemd.exec(5)); a leading `-` (a path
/// that may be missing) is dropped.
pub fn unit_read_write_paths(dropins: &[&Path]) -> Vec<PathBuf> {
    let unit = bins::workspace().join("deploy/systemd/dipamd.service");
    let mut paths = Vec::new();
    for file in std::iter::once(unit.as_path()).chain(dropins.iter().copied()) {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for line in text.lines().map(str::trim) {
            let Some(v) = line.strip_prefix("ReadWritePaths=") else {
                continue;
            };
            if v.trim().is_empty() {
                paths.clear();
            }
            paths.extend(
                v.split_whitespace()
                    .map(|p| PathBuf::from(p.trim_start_matches('-'))),
            );
        }
    }
    paths
}

/// A command (`sh SCRIPT`) that applies the unit's `ProtectSystem=strict` to the mount
/// namespace it runs in and execs the rest of its command line: every mount read-only but
/// /proc, /sys, /dev and `writable` (each bound onto itself first, so that it is a mount of
/// its own, which stays writable). Run it in a private mount namespace only (e.g. as the
/// inner command of [`crate::azure::AzureNode::wrapper`]); the script lands in `dir`.
pub fn protect_system_strict(dir: &Path, writable: &[PathBuf]) -> Vec<String> {
    let rw: Vec<String> = writable.iter().map(|p| p.display().to_string()).collect();
    assert!(
        rw.iter().all(|p| !p.contains(char::is_whitespace)),
        "writable paths without white space: {rw:?}"
    );
    let script = format!(
        r#"set -eu
rw="{rw}"
for p in $rw; do
  [ -e "$p" ] && mount --bind "$p" "$p"
done
# Longest first is not needed: each mount's read-only flag is its own.
for m in $(awk '{{print $5}}' /proc/self/mountinfo | sort -u); do
  case "$m" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  keep=no
  for p in $rw; do
    case "$m" in "$p"|"$p"/*) keep=yes ;; esac
  done
  [ "$keep" = yes ] || mount -o remount,bind,ro "$m" || echo "sandbox: $m stays writable" >&2
done
exec "$@"
"#,
        rw = rw.join(" ")
    );
    let path = dir.join("protect-system-strict.sh");
    std::fs::write(&path, script).expect("write the sandbox script");
    vec!["sh".into(), path.display().to_string()]
}

/// The bounding set of a running process (`CapBnd` in /proc/PID/status), as a mask.
pub fn bounding_mask(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
}

/// A small deterministic generator (xorshift64*) whose seed is printed, so that a failing
/// run of a randomised test can be replayed exactly with `DIPAM_SEED=<seed>`.
pub struct Seeded {
    state: u64,
    pub seed: u64,
}

impl Seeded {
    /// Seeded from `DIPAM_SEED` when set, else from the clock; prints the seed.
    pub fn new(test: &str) -> Self {
        let seed = std::env::var("DIPAM_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{test}: DIPAM_SEED={seed} replays this run");
        Self {
            state: seed.max(1),
            seed,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Pods come and go through `cycle` (one whole pod lifecycle: it retries what a runtime
/// retries, and panics past its own deadline) on a thread of their own, while this thread
/// SIGKILLs `dipamd` `rounds` times, each after a pause drawn from `rng` (printed with the
/// seed, so that `DIPAM_SEED` replays the kill points), and starts it again after another.
/// Returns how many cycles completed.
pub fn churn_while_killing(
    dipamd: &mut crate::Dipamd,
    rng: &mut Seeded,
    rounds: u32,
    cycle: &(dyn Fn(u32) + Sync),
) -> u32 {
    churn_while(dipamd, rng, rounds, cycle, &mut |dipamd, rng, round, up| {
        let down = rng.below(1500);
        eprintln!(
            "round {round} (seed {}): SIGKILL after {up} ms up, {down} ms down",
            rng.seed
        );
        dipamd.kill9();
        std::thread::sleep(std::time::Duration::from_millis(down));
        dipamd.start_again();
    })
}

/// As [`churn_while_killing`], but each round is an upgrade ([`crate::Dipamd::upgrade`]: a
/// new binary installed, SIGTERM, start), which must end the old dipamd within `drain`.
pub fn churn_while_upgrading(
    dipamd: &mut crate::Dipamd,
    rng: &mut Seeded,
    rounds: u32,
    drain: std::time::Duration,
    cycle: &(dyn Fn(u32) + Sync),
) -> u32 {
    churn_while(dipamd, rng, rounds, cycle, &mut |dipamd, rng, round, up| {
        eprintln!(
            "round {round} (seed {}): upgrade after {up} ms up",
            rng.seed
        );
        dipamd.upgrade(drain);
    })
}

/// `cycle` on a thread of its own while this thread runs `restart` `rounds` times, each after
/// a pause drawn from `rng`. Returns how many cycles completed.
fn churn_while(
    dipamd: &mut crate::Dipamd,
    rng: &mut Seeded,
    rounds: u32,
    cycle: &(dyn Fn(u32) + Sync),
    restart: &mut dyn FnMut(&mut crate::Dipamd, &mut Seeded, u32, u64),
) -> u32 {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    /// Stops the cycles when dropped: also when `restart` panics (a dipamd that did not exit
    /// or start in time), which would otherwise leave the scope waiting forever for a worker
    /// that never stops, and the test hung with its failure unreported.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    let done = AtomicU32::new(0);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                cycle(done.load(Ordering::Relaxed));
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
        let _stop = StopOnDrop(&stop);
        for round in 0..rounds {
            let up = 300 + rng.below(2000);
            std::thread::sleep(std::time::Duration::from_millis(up));
            eprintln!("{} cycles so far", done.load(Ordering::Relaxed));
            restart(dipamd, rng, round, up);
        }
        // Traffic on the last dipamd too.
        std::thread::sleep(std::time::Duration::from_millis(1000));
        stop.store(true, Ordering::Relaxed);
        if let Err(p) = worker.join() {
            std::panic::resume_unwind(p);
        }
    });
    done.load(Ordering::Relaxed)
}

/// `op` until it succeeds, every 200 ms, for at most `secs`: what a kubelet does with a
/// failed sandbox call. Panics with the last error past the deadline.
#[track_caller]
pub fn retry<T, E: std::fmt::Display>(
    what: &str,
    secs: u64,
    mut op: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match op() {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("{what} kept failing for {secs} s: {e}"),
        }
    }
}
