//! Churn (`--sections churn`): ADD/DEL cycles beside a ledger of live attachments, with
//! dipamd's RSS and the ledger's and journal's bytes sampled every tenth of the run, RSS and
//! the ledger's bytes also read every [`POLL`] for each interval's medians (issue 39: memory
//! and disk stay bounded, the journal compacts). `--churn-rate` holds the cycles to
//! one rate: dipamd's tables of the last ten minutes' ADDs and DELs are as large as the rate
//! makes them, so only a run at one rate tells growth with the cycles from a rate that moved
//! (docs/performance.md run 43: a run whose rate doubled read 1.22x).

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use dipam_lifecycle::{Attachment, Runtime};
use serde_json::{Value, json};

use super::super::{Opts, Report, Res, fan_out, loadavg, mib, r3, ratio, rss_kib};
use super::{Kind, Node, disk_bytes};

/// How long dipamd remembers a DEL and an ADD (shim-server `core/tombstones.rs`
/// `TOMBSTONE_TTL`, `core/births.rs` `RETAIN`): its tables of them fill for this long under a
/// steady churn, then hold the last ten minutes' cycles.
const REMEMBERED: Duration = Duration::from_secs(600);

/// How often RSS and the ledger's bytes are read between two samples. One reading lands on
/// whatever transient it meets: at 18 cycles a second dipamd's heap in use moved by 4–6 MB
/// between two of its trims, and sled's files by a few segments (run 46); the median of an
/// interval's readings is its level, and the targets compare levels.
const POLL: Duration = Duration::from_secs(5);

pub struct ChurnSample {
    pub cycles: usize,
    pub rss_kib: u64,
    pub ledger: u64,
    pub journal: u64,
    pub secs: f64,
    /// The medians of the readings since the sample before, this one's included.
    pub rss_median_kib: u64,
    pub ledger_median: u64,
    pub polls: usize,
}

impl ChurnSample {
    /// Cycles a second since the sample before (0 for the first).
    fn rate_since(&self, before: Option<&ChurnSample>) -> f64 {
        match before {
            Some(b) if self.secs > b.secs => (self.cycles - b.cycles) as f64 / (self.secs - b.secs),
            _ => 0.0,
        }
    }
}

pub struct Churn {
    pub live: usize,
    pub cycles: usize,
    /// The rate asked for (0: none).
    pub rate: usize,
    pub samples: Vec<ChurnSample>,
    pub load: Vec<f64>,
}

/// `--churn-cycles` ADD/DEL cycles (two at a time) on `--churn-live` live attachments.
pub fn churn(rt: &Runtime, opts: &Opts) -> Res<Churn> {
    let mut node = Node::start(opts, &[])?;
    let live: Vec<Attachment> = (0..opts.churn_live)
        .map(|i| node.att(Kind::Live, 0, i))
        .collect();
    super::super::progress!("churn: filling {} live attachments", live.len());
    node.fill(rt, &live)?;
    node.live = live;
    node.restart(rt, false, &[])?;
    let (pid, state) = (node.d.pid(), node.d.state_dir());
    let t = Instant::now();
    let poller = Poller::start(pid, state.clone(), t);
    let read = |cycles: usize| sample(cycles, pid, &state, t, poller.take());
    let mut samples = vec![read(0)];
    let step = (opts.churn_cycles / 10).max(1);
    let mut done = 0;
    let list = node.list().clone();
    // With a rate, each cycle starts no sooner than 1 / rate after the one before, whichever
    // worker takes it; one that falls behind is not made up for by a burst above the rate.
    let gap = match opts.churn_rate {
        0 => Duration::ZERO,
        r => Duration::from_secs_f64(1.0 / r as f64),
    };
    let next = Mutex::new(Instant::now());
    let pace = || {
        let slot = match next.lock() {
            Ok(mut n) => {
                let slot = (*n).max(Instant::now());
                *n = slot + gap;
                slot
            }
            Err(_) => return,
        };
        std::thread::sleep(slot.saturating_duration_since(Instant::now()));
    };
    while done < opts.churn_cycles {
        let batch: Vec<Attachment> = (done..(done + step).min(opts.churn_cycles))
            .map(|i| node.att(Kind::Churn, 0, i))
            .collect();
        fan_out(&batch, 2, |a| {
            pace();
            let r = rt
                .ipam(&list, 0, "ADD", a, None)
                .map_err(|e| format!("churn ADD: {e}"))?;
            rt.ipam(&list, 0, "DEL", a, Some(&r))
                .map(|_| ())
                .map_err(|e| format!("churn DEL: {e}"))
        })?;
        done += batch.len();
        let s = read(done);
        super::super::progress!(
            "churn: {done}/{} cycles in {:.0} s ({:.1}/s): RSS {:.1} MiB (median {:.1}), ledger {} KiB (median {}), journal {} KiB",
            opts.churn_cycles,
            s.secs,
            s.rate_since(samples.last()),
            mib(s.rss_kib),
            mib(s.rss_median_kib),
            s.ledger / 1024,
            s.ledger_median / 1024,
            s.journal / 1024
        );
        samples.push(s);
    }
    drop(poller);
    let held: HashSet<String> = node
        .d
        .ledger_pairs(&node.network())
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    if held.len() != node.live.len() {
        return Err(format!(
            "after the churn the ledger holds {} attachments, expected {}",
            held.len(),
            node.live.len()
        ));
    }
    Ok(Churn {
        live: opts.churn_live,
        cycles: opts.churn_cycles,
        rate: opts.churn_rate,
        samples,
        load: loadavg(),
    })
}

/// One reading of dipamd's RSS and the ledger's allocated bytes.
struct Poll {
    rss_kib: u64,
    ledger: u64,
}

impl Poll {
    /// A reading now, and the journal's bytes in use read with it.
    fn read(pid: Option<u32>, state: &std::path::Path) -> (Self, u64) {
        let (l, j) = disk_bytes(state);
        let poll = Self {
            rss_kib: rss_kib(pid).0,
            ledger: l.1,
        };
        (poll, j.0)
    }
}

/// Reads [`Poll`]s every [`POLL`] on a thread of its own, until dropped.
struct Poller {
    polls: Arc<Mutex<Vec<Poll>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    fn start(pid: Option<u32>, state: PathBuf, t: Instant) -> Self {
        let polls = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&polls), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut next = t;
            while !s.load(Ordering::SeqCst) {
                if Instant::now() >= next {
                    let (poll, _) = Poll::read(pid, &state);
                    if let Ok(mut v) = p.lock() {
                        v.push(poll);
                    }
                    next += POLL;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            polls,
            stop,
            thread: Some(thread),
        }
    }

    /// The readings since the last take.
    fn take(&self) -> Vec<Poll> {
        self.polls
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sample after `cycles`: the readings of this instant, and the medians of `polls` (the
/// interval's) with this instant's.
fn sample(
    cycles: usize,
    pid: Option<u32>,
    state: &std::path::Path,
    t: Instant,
    mut polls: Vec<Poll>,
) -> ChurnSample {
    let (now, journal) = Poll::read(pid, state);
    let (rss_kib, ledger) = (now.rss_kib, now.ledger);
    polls.push(now);
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    ChurnSample {
        cycles,
        rss_kib,
        ledger,
        journal,
        secs: t.elapsed().as_secs_f64(),
        rss_median_kib: median(polls.iter().map(|p| p.rss_kib).collect()),
        ledger_median: median(polls.iter().map(|p| p.ledger).collect()),
        polls: polls.len(),
    }
}

impl Report {
    pub fn churn(&mut self, c: &Churn) {
        self.churn_table(c);
        self.churn_levels(c);
        let max_journal = c
            .samples
            .iter()
            .map(|s| s.journal)
            .max()
            .unwrap_or_default();
        self.target(
            "journal compacts under churn (largest sample)",
            format!("{} KiB", max_journal / 1024),
            "<= 4096 KiB",
            max_journal <= 4 << 20,
        );
        let samples: Vec<Value> = c
            .samples
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let rate = s.rate_since(i.checked_sub(1).map(|b| &c.samples[b]));
                json!({"cycles": s.cycles, "secs": r3(s.secs), "rss_kib": s.rss_kib,
                       "ledger_allocated_bytes": s.ledger, "journal_bytes": s.journal,
                       "cycles_per_sec": r3(rate), "rss_median_kib": s.rss_median_kib,
                       "ledger_median_allocated_bytes": s.ledger_median,
                       "readings": s.polls})
            })
            .collect();
        self.json.insert(
            "churn".into(),
            json!({"live": c.live, "cycles": c.cycles, "rate_asked": c.rate,
                   "loadavg_end": c.load, "samples": samples}),
        );
    }

    /// The samples, each with the cycles a second since the one before and the medians of
    /// its interval's readings.
    fn churn_table(&mut self, c: &Churn) {
        let paced = match c.rate {
            0 => "as fast as the node goes".to_owned(),
            r => format!("held to {r} a second"),
        };
        self.line(format!(
            "\nChurn: {} ADD/DEL cycles on {} live attachments (2 at a time, {paced}; load at the end {:?}; medians of a reading every {} s since the sample before)",
            c.cycles,
            c.live,
            c.load,
            POLL.as_secs()
        ));
        self.line(format!(
            "{:>8} {:>8} {:>6} {:>8} {:>8} {:>11} {:>11} {:>11}",
            "cycles", "s", "/s", "RSS MiB", "median", "ledger KiB", "median", "journal KiB"
        ));
        let mut before: Option<&ChurnSample> = None;
        for s in &c.samples {
            self.line(format!(
                "{:>8} {:>8.0} {:>6.1} {:>8.1} {:>8.1} {:>11} {:>11} {:>11}",
                s.cycles,
                s.secs,
                s.rate_since(before),
                mib(s.rss_kib),
                mib(s.rss_median_kib),
                s.ledger / 1024,
                s.ledger_median / 1024,
                s.journal / 1024
            ));
            before = Some(s);
        }
    }

    /// RSS and the ledger's bytes: the last interval's level against the first interval that
    /// begins at least REMEMBERED into the churn. Until then dipamd's tables of the last ten
    /// minutes' ADDs and DELs, and its caches, are still filling to the size the churn's rate
    /// gives them (docs/performance.md run 42), and growth then is not growth with the cycles.
    fn churn_levels(&mut self, c: &Churn) {
        let Some(last) = c.samples.last() else {
            return;
        };
        let first = c
            .samples
            .windows(2)
            .find(|w| w[0].secs >= REMEMBERED.as_secs_f64())
            .map(|w| &w[1])
            .filter(|s| s.cycles < last.cycles);
        let Some(first) = first else {
            let why = "the run was shorter than two intervals after the ten minutes dipamd remembers ADDs and DELs";
            self.target(
                "RSS and ledger bytes under churn",
                why.into(),
                "a longer run",
                false,
            );
            return;
        };
        let from = format!("the interval to {} ({:.0} s)", first.cycles, first.secs);
        self.target(
            format!("RSS (median) after {} churn cycles / {from}", c.cycles),
            format!(
                "{:.2}x ({:.1} vs {:.1} MiB)",
                ratio(last.rss_median_kib as f64, first.rss_median_kib as f64),
                mib(last.rss_median_kib),
                mib(first.rss_median_kib)
            ),
            "<= 1.10x",
            last.rss_median_kib as f64 <= 1.1 * first.rss_median_kib as f64,
        );
        self.target(
            format!(
                "ledger bytes (median) after {} churn cycles / {from}",
                c.cycles
            ),
            format!(
                "{:.2}x ({} vs {} KiB)",
                ratio(last.ledger_median as f64, first.ledger_median as f64),
                last.ledger_median / 1024,
                first.ledger_median / 1024
            ),
            "<= 1.10x",
            last.ledger_median as f64 <= 1.1 * first.ledger_median as f64,
        );
    }
}
