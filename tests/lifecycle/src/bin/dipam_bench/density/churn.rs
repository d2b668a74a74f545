//! Churn (`--sections churn`): ADD/DEL cycles beside a ledger of live attachments, with
//! dipamd's RSS and the ledger's and journal's bytes read every tenth of the run (issue 39:
//! memory and disk stay bounded, the journal compacts). `--churn-rate` holds the cycles to
//! one rate: dipamd's tables of the last ten minutes' ADDs and DELs are as large as the rate
//! makes them, so only a run at one rate tells growth with the cycles from a rate that moved
//! (docs/performance.md run 43: a run whose rate doubled read 1.22x).

use std::{
    collections::HashSet,
    sync::Mutex,
    time::{Duration, Instant},
};

use dipam_lifecycle::{Attachment, Runtime};
use serde_json::{Value, json};

use super::super::{Opts, Report, Res, fan_out, loadavg, mib, r3, ratio, rss_kib};
use super::{Kind, Node, disk_bytes};

/// How long dipamd remembers a DEL and an ADD (shim-server `core/tombstones.rs`
/// `TOMBSTONE_TTL`, `core/births.rs` `RETAIN`): its tables of them fill for this long under a
/// steady churn, then hold the last ten minutes' cycles.
const REMEMBERED: std::time::Duration = std::time::Duration::from_secs(600);

pub struct ChurnSample {
    pub cycles: usize,
    pub rss_kib: u64,
    pub ledger: u64,
    pub journal: u64,
    pub secs: f64,
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
    let read = |node: &Node, cycles: usize, t: &Instant| {
        let (l, j) = disk_bytes(&node.d.state_dir());
        ChurnSample {
            cycles,
            rss_kib: rss_kib(node.d.pid()).0,
            ledger: l.1,
            journal: j.0,
            secs: t.elapsed().as_secs_f64(),
        }
    };
    let t = Instant::now();
    let mut samples = vec![read(&node, 0, &t)];
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
        let s = read(&node, done, &t);
        super::super::progress!(
            "churn: {done}/{} cycles in {:.0} s ({:.1}/s): RSS {:.1} MiB, ledger {} KiB, journal {} KiB",
            opts.churn_cycles,
            s.secs,
            s.rate_since(samples.last()),
            mib(s.rss_kib),
            s.ledger / 1024,
            s.journal / 1024
        );
        samples.push(s);
    }
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

impl Report {
    pub fn churn(&mut self, c: &Churn) {
        let paced = match c.rate {
            0 => "as fast as the node goes".to_owned(),
            r => format!("held to {r} a second"),
        };
        self.line(format!(
            "\nChurn: {} ADD/DEL cycles on {} live attachments (2 at a time, {paced}; load at the end {:?})",
            c.cycles, c.live, c.load
        ));
        self.line(format!(
            "{:>8} {:>8} {:>6} {:>8} {:>11} {:>11}",
            "cycles", "s", "/s", "RSS MiB", "ledger KiB", "journal KiB"
        ));
        let mut before: Option<&ChurnSample> = None;
        for s in &c.samples {
            self.line(format!(
                "{:>8} {:>8.0} {:>6.1} {:>8.1} {:>11} {:>11}",
                s.cycles,
                s.secs,
                s.rate_since(before),
                mib(s.rss_kib),
                s.ledger / 1024,
                s.journal / 1024
            ));
            before = Some(s);
        }
        let Some(last) = c.samples.last() else {
            return;
        };
        // Measured from the first sample at least REMEMBERED into the churn (and after its
        // first tenth): until then dipamd's tables of the last ten minutes' ADDs and DELs,
        // and its caches, are still filling to the size the churn's rate gives them
        // (docs/performance.md run 42), and growth then is not growth with the cycles.
        let Some(first) = c
            .samples
            .iter()
            .skip(1)
            .find(|s| s.secs >= REMEMBERED.as_secs_f64())
            .filter(|s| s.cycles < last.cycles)
        else {
            let why = "the run was shorter than the ten minutes dipamd remembers ADDs and DELs";
            self.target(
                "RSS and ledger bytes under churn",
                why.into(),
                "a longer run",
                false,
            );
            return;
        };
        let from = format!("after {} ({:.0} s)", first.cycles, first.secs);
        self.target(
            format!("RSS after {} churn cycles / {from}", c.cycles),
            format!(
                "{:.2}x ({:.1} vs {:.1} MiB)",
                ratio(last.rss_kib as f64, first.rss_kib as f64),
                mib(last.rss_kib),
                mib(first.rss_kib)
            ),
            "<= 1.10x",
            last.rss_kib as f64 <= 1.1 * first.rss_kib as f64,
        );
        self.target(
            format!("ledger bytes after {} churn cycles / {from}", c.cycles),
            format!(
                "{:.2}x ({} vs {} KiB)",
                ratio(last.ledger as f64, first.ledger as f64),
                last.ledger / 1024,
                first.ledger / 1024
            ),
            "<= 1.10x",
            last.ledger as f64 <= 1.1 * first.ledger as f64,
        );
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
                       "cycles_per_sec": r3(rate)})
            })
            .collect();
        self.json.insert(
            "churn".into(),
            json!({"live": c.live, "cycles": c.cycles, "rate_asked": c.rate,
                   "loadavg_end": c.load, "samples": samples}),
        );
    }
}
