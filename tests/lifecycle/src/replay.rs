//! What a crash test prints when it fails, so that the failure can be replayed and read: the
//! seed (and how to run the test again with it), every kill point so far, and the whole log
//! of every dipamd the test ran, before and after each restart (one file, each start marked
//! by the harness, daemon.rs).
//!
//! The seed comes from `DIPAM_CHAOS_SEED` when it is set (read, never written: tests inject
//! nothing into the process environment), else from the clock.

use std::{
    path::PathBuf,
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

/// The environment variable a failed run's seed is given back through.
pub const SEED_VAR: &str = "DIPAM_CHAOS_SEED";

/// The seed of this run: `DIPAM_CHAOS_SEED` if set (decimal), else the clock's nanoseconds.
pub fn seed() -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_VAR}={s:?} is not a decimal u64")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// xorshift64, seeded from [`seed`]: enough randomness for a crash test's schedule, and the
/// same schedule again from the same seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Held for a crash test's whole run, declared after the `Lab` (so dropped before it, while
/// the log still exists): on a panic it prints the replay line, the kill points and the
/// dipamd logs in full.
pub struct Replay {
    test: String,
    seed: Option<u64>,
    logs: Vec<PathBuf>,
    kills: Mutex<Vec<String>>,
}

impl Replay {
    /// For `test` (its name in its test binary, `binary`), run with `seed` (None: the test is
    /// deterministic), whose dipamd logs to `log`.
    pub fn new(binary: &str, test: &str, seed: Option<u64>, log: PathBuf) -> Self {
        if let Some(seed) = seed {
            eprintln!("{test}: seed {seed} (replay: {SEED_VAR}={seed})");
        }
        Self {
            test: format!("--test {binary} -- --exact {test}"),
            seed,
            logs: vec![log],
            kills: Mutex::new(Vec::new()),
        }
    }

    /// Records a kill point (what the test killed, and when), printed on failure.
    pub fn kill(&self, point: impl Into<String>) {
        let point = point.into();
        eprintln!("kill: {point}");
        self.kills
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(point);
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kills = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        eprintln!("===== replay =====");
        match self.seed {
            Some(seed) => eprintln!(
                "seed {seed}: {SEED_VAR}={seed} cargo test -p dipam-lifecycle {}",
                self.test
            ),
            None => eprintln!("deterministic: cargo test -p dipam-lifecycle {}", self.test),
        }
        eprintln!("kill points ({}):", kills.len());
        for k in kills.iter() {
            eprintln!("  {k}");
        }
        for log in &self.logs {
            eprintln!(
                "----- full dipamd log, every start ({}) -----\n{}\n----- end of the full \
                 dipamd log -----",
                log.display(),
                std::fs::read_to_string(log).unwrap_or_else(|e| format!("(unreadable: {e})"))
            );
        }
        eprintln!("===== end of replay =====");
    }
}
