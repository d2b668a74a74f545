//! The density curve's report: the text tables, the targets (PASS/MISS), the JSON and the SVG.

use std::path::Path;

use serde_json::{Value, json};

use super::super::{Report, Res, Summary, mib, r3, ratio, summarize};
use super::{Density, Point, RANGE, plot};

/// Nearest-rank p50 and p99 of `v`, as "p50 / p99".
fn pp(s: &Summary) -> String {
    format!("{:7.2} {:7.2}", s.p50, s.p99)
}

impl Report {
    pub fn density(&mut self, d: &Density, svg: Option<&Path>) -> Res<()> {
        self.line(format!(
            "\nDensity: one node's ledger at N attachments (host-local {RANGE}, IPAM mode; ms)"
        ));
        let mut json_points = Vec::new();
        for verb in ["ADD", "CHECK", "DEL"] {
            self.line(format!(
                "{verb:<6} {:>6}  {:^15}  {:^15}  {:^15}  {:^15}",
                "N", "dipam p50/p99", "in dipamd", "dipam's own", "host-local"
            ));
            for (k, p) in d.points.iter().enumerate() {
                let (t, dl, own) = d.split(k, verb);
                let floor = match verb {
                    "ADD" => &p.floor_add,
                    "CHECK" => &p.floor_check,
                    _ => &p.floor_del,
                };
                self.line(format!(
                    "       {:>6}  {}  {}  {}  {}",
                    p.n,
                    pp(&summarize(&t)),
                    pp(&summarize(&dl)),
                    pp(&summarize(&own)),
                    pp(&summarize(floor))
                ));
            }
        }
        self.line(format!(
            "{:>6} {:>5} {:^15} {:^15} {:>6} {:>6} {:>7} {:>6} {:>7} {:>7} {:>9} {:>9} {:>7} {:>7}",
            "N",
            "load",
            "STATUS exec",
            "STATUS handler",
            "start",
            "crash",
            "1st ADD",
            "stop",
            "RSS MiB",
            "HWM",
            "ledger KiB",
            "journal",
            "status",
            "attach."
        ));
        for (k, p) in d.points.iter().enumerate() {
            let h = d.status_handler.get(k).cloned().unwrap_or_default();
            self.line(format!(
                "{:>6} {:>5.1} {} {} {:>6.0} {:>6.0} {:>7.1} {:>6.0} {:>7.1} {:>7.1} {:>9} {:>9} {:>7.1} {:>7.1}",
                p.n,
                p.load,
                pp(&summarize(&p.status_exec)),
                pp(&summarize(&h)),
                p.start_ms,
                p.crash_start_ms,
                p.first_add_ms,
                p.stop_ms,
                mib(p.rss_kib),
                mib(p.hwm_kib),
                p.ledger.1 / 1024,
                p.journal.0 / 1024,
                super::super::median(&p.ctl_status),
                super::super::median(&p.ctl_attachments),
            ));
        }
        self.line(
            "dipamd's RSS peak by phase, MiB (VmHWM reset at each phase's start; `start and \
             samples` is since the start):",
        );
        self.line(format!(
            "{:>6} {:>18} {:>18} {:>10} {:>12} {:>12}",
            "N", "start and samples", "status, attach.", "runtime GC", "CNI GC", "pooled run"
        ));
        for p in &d.points {
            self.line(format!(
                "{:>6} {:>18.1} {:>18.1} {:>10.1} {:>12.1} {:>12.1}",
                p.n,
                mib(p.hwm_kib),
                mib(p.peak_ctl_kib),
                mib(p.gc.peak_runtime_kib),
                mib(p.peak_gc_kib),
                mib(p.peak_pool_kib)
            ));
        }
        self.density_gc(d);
        self.density_pool(d);
        if let Some(why) = &d.failed {
            self.line(format!("the curve stopped early: {why}"));
        }
        for (k, p) in d.points.iter().enumerate() {
            json_points.push(point_json(d, k, p));
        }
        self.density_targets(d);
        self.json.insert(
            "density".into(),
            json!({"range": RANGE, "points": json_points, "failed": d.failed}),
        );
        if let Some(path) = svg {
            std::fs::write(path, plot::svg(d)).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// The GC table: each GC against its floor, and the CNI GC split by dipamd's log.
    fn density_gc(&mut self, d: &Density) {
        self.line(format!(
            "{:>6} {:>6} {:>9} {:>9} {:>6} {:>11} {:>11} {:>6}   {:>9} {:>8} {:>9} {:>7} {:>9} {:>6}",
            "N",
            "stale",
            "floor",
            "CNI GC",
            "ratio",
            "runtime 1st",
            "runtime 2nd",
            "ratio",
            "handler",
            "before",
            "DELs",
            "after",
            "DEL sum",
            "passes"
        ));
        for (k, p) in d.points.iter().enumerate() {
            let g = &p.gc;
            let s = d.gc_split.get(k).cloned().unwrap_or_default();
            self.line(format!(
                "{:>6} {:>6} {:>9.0} {:>9.0} {:>6.2} {:>11.0} {:>11.0} {:>6.2}   {:>9.0} {:>8.0} {:>9.0} {:>7.0} {:>9.0} {:>6}",
                p.n,
                g.stale,
                g.floor_ms,
                g.cni_gc_ms,
                ratio(g.cni_gc_ms, g.floor_ms),
                g.runtime_first_ms,
                g.runtime_second_ms,
                ratio(g.runtime_first_ms + g.runtime_second_ms, g.runtime_floor_ms),
                s.handler_ms,
                s.before_ms,
                s.dels_ms,
                s.after_ms,
                s.del_sum_ms,
                g.runtime_passes_beside
            ));
        }
        self.line(
            "  (the CNI GC's floor: the mean of host-local's DELs just before and just after it, \
             each on a copy of the directory made before it; CNI GC split by dipamd's log: `handler` its GC handler; `before` the read and plan \
             up to the first DEL; `DELs` first DEL's start to last DEL's end; `after` the last \
             forget; `DEL sum` the DELs' own times, 2 at a time; `passes` dipamd's own \
             runtime-aware passes that began during the CNI GC)",
        );
    }

    /// The pooled step (pooled.rs): watermarks, paced ADDs, against host-local's ADD.
    fn density_pool(&mut self, d: &Density) {
        let Some(first) = d.points.first() else {
            return;
        };
        let q = &first.pool;
        self.line(format!(
            "Pooled ADD: --pool-target {} --pool-max-above {}, bursts of {} pods every {} ms \
             (one ADD after another, never waiting for the pool); against host-local's own \
             ADD exec'd directly (ptp + host-local costs more: the ratio is conservative)",
            q.target, q.max_above, q.burst, q.period_ms
        ));
        self.line(format!(
            "{:>6} {:>10}  {:^15}  {:>10} {:>7}  {:>8}  {:>12} {:>9} {:>8}  {:^15}",
            "N",
            "hits/miss",
            "pooled p50/p99",
            "h-l p99",
            "ratio",
            "hits p99",
            "fewest ready",
            "target to",
            "kept up",
            "pooled DEL"
        ));
        for (k, p) in d.points.iter().enumerate() {
            let q = &p.pool;
            let (a, f) = (summarize(&q.add), summarize(&p.floor_add));
            self.line(format!(
                "{:>6} {:>5}/{:<4}  {}  {:>10.2} {:>7.2}  {:>8.2}  {:>12} {:>9} {:>8}  {}",
                p.n,
                q.hits,
                q.misses,
                pp(&a),
                f.p99,
                ratio(a.p99, f.p99),
                summarize(&d.pool_hits(k)).p99,
                q.fewest_ready(),
                q.raised_target,
                if q.kept_up() { "yes" } else { "NO" },
                pp(&summarize(&q.del)),
            ));
        }
    }

    fn density_targets(&mut self, d: &Density) {
        let Some(base) = d.points.iter().position(|p| p.n == 10) else {
            return;
        };
        let own_p99 = |k: usize| summarize(&d.split(k, "ADD").2).p99;
        let b = own_p99(base);
        for (k, p) in d.points.iter().enumerate() {
            if p.n < 2_500 {
                continue;
            }
            let x = own_p99(k);
            self.target(
                format!("dipam's own ADD p99 at N={} / N=10", p.n),
                format!("{:.2}x ({x:.2} vs {b:.2} ms)", x / b),
                "<= 1.5x",
                x <= 1.5 * b,
            );
            let h = summarize(&d.status_handler.get(k).cloned().unwrap_or_default()).p99;
            let e = summarize(&p.status_exec).p99;
            self.target(
                format!("STATUS p99 at N={} (dipamd's handler; exec {e:.2} ms)", p.n),
                format!("{h:.3} ms"),
                "<= 1 ms",
                h <= 1.0,
            );
            let start = p.start_ms.max(p.crash_start_ms);
            self.target(
                format!("start to serving at N={} (clean, after SIGKILL)", p.n),
                format!("{:.0} / {:.0} ms", p.start_ms, p.crash_start_ms),
                "<= 1 s",
                start <= 1000.0,
            );
            self.target(
                format!("dipamd RSS at N={} (high-water mark)", p.n),
                format!("{:.1} MiB ({:.1} now)", mib(p.hwm_kib), mib(p.rss_kib)),
                "<= 64 MiB",
                p.hwm_kib <= 64 * 1024,
            );
            for (phase, kib) in [
                ("dipamctl status and attachments", p.peak_ctl_kib),
                ("the runtime-aware GC", p.gc.peak_runtime_kib),
                ("the CNI GC", p.peak_gc_kib),
                ("the pooled run", p.peak_pool_kib),
            ] {
                self.target(
                    format!("dipamd's peak RSS at N={} during {phase}", p.n),
                    format!("{:.1} MiB", mib(kib)),
                    "<= 64 MiB",
                    kib <= 64 * 1024,
                );
            }
            let q = &p.pool;
            let (a, f) = (summarize(&q.add).p99, summarize(&p.floor_add).p99);
            self.target(
                format!("pooled ADD p99 at N={} / host-local ADD p99", p.n),
                format!(
                    "{:.2}x ({a:.2} vs {f:.2} ms; {} hits, {} misses)",
                    ratio(a, f),
                    q.hits,
                    q.misses
                ),
                "<= 0.20x",
                !q.add.is_empty() && a <= 0.2 * f,
            );
            self.target(
                format!("refills keep up at N={} (ADDs that missed the pool)", p.n),
                format!(
                    "{} of {} (fewest ready before a burst: {})",
                    q.misses,
                    q.add.len(),
                    q.fewest_ready()
                ),
                "0",
                q.kept_up(),
            );
            let g = &p.gc;
            self.target(
                format!("CNI GC of {} stale at N={} / the floor", g.stale, p.n),
                format!(
                    "{:.2}x ({:.0} vs {:.0} ms; floor before {:.0}, after {:.0})",
                    ratio(g.cni_gc_ms, g.floor_ms),
                    g.cni_gc_ms,
                    g.floor_ms,
                    g.floor_before_ms,
                    g.floor_after_ms
                ),
                "<= 1.1x",
                g.cni_gc_ms <= 1.1 * g.floor_ms,
            );
        }
    }
}

fn point_json(d: &Density, k: usize, p: &Point) -> Value {
    let verb = |v: &str| {
        let (t, dl, own) = d.split(k, v);
        json!({"total": summarize(&t).json(), "delegate_in_dipamd": summarize(&dl).json(),
               "dipam_own": summarize(&own).json()})
    };
    json!({
        "n": p.n, "live": p.live, "stale": p.stale, "load_1m": p.load,
        "fill_ms": r3(p.fill_ms),
        "add": verb("ADD"), "check": verb("CHECK"), "del": verb("DEL"),
        "host_local": {"add": summarize(&p.floor_add).json(),
                       "check": summarize(&p.floor_check).json(),
                       "del": summarize(&p.floor_del).json()},
        "status_exec": summarize(&p.status_exec).json(),
        "status_handler": summarize(&d.status_handler.get(k).cloned().unwrap_or_default()).json(),
        // In the order served: the first is the first STATUS after the start, which shows
        // whether a p99 is one slow call (the start's) or a tail.
        "status_handler_samples_ms": d.status_handler.get(k).cloned().unwrap_or_default(),
        "first_add_after_start_ms": r3(p.first_add_ms),
        "stop_ms": r3(p.stop_ms), "start_ms": r3(p.start_ms),
        "start_after_sigkill_ms": r3(p.crash_start_ms),
        "rss_kib": p.rss_kib, "hwm_kib": p.hwm_kib,
        "peak_kib": {"ctl": p.peak_ctl_kib, "runtime_gc": p.gc.peak_runtime_kib,
                     "gc": p.peak_gc_kib, "pooled": p.peak_pool_kib},
        "ledger_bytes": p.ledger.0, "ledger_allocated_bytes": p.ledger.1,
        "journal_bytes": p.journal.0, "journal_allocated_bytes": p.journal.1,
        "dipamctl_status_ms": summarize(&p.ctl_status).json(),
        "dipamctl_attachments_ms": summarize(&p.ctl_attachments).json(),
        "gc": {"stale": p.gc.stale, "floor_ms": r3(p.gc.floor_ms),
               "floor_before_ms": r3(p.gc.floor_before_ms),
               "floor_after_ms": r3(p.gc.floor_after_ms),
               "cni_gc_ms": r3(p.gc.cni_gc_ms),
               "runtime_floor_ms": r3(p.gc.runtime_floor_ms),
               "runtime_first_pass_ms": r3(p.gc.runtime_first_ms),
               "runtime_second_pass_ms": r3(p.gc.runtime_second_ms),
               "runtime_passes_beside_cni_gc": p.gc.runtime_passes_beside},
        "gc_split": d.gc_split.get(k).map(|s| json!({
            "handler_ms": r3(s.handler_ms), "before_first_del_ms": r3(s.before_ms),
            "dels_ms": r3(s.dels_ms), "after_last_del_ms": r3(s.after_ms),
            "dels": s.dels, "del_sum_ms": r3(s.del_sum_ms)})),
        "pool": pool_json(p, &d.pool_hits(k)),
    })
}

/// The pooled step (pooled.rs) of one point.
fn pool_json(p: &Point, hits: &[f64]) -> Value {
    let q = &p.pool;
    let (a, f) = (summarize(&q.add), summarize(&p.floor_add));
    json!({
        "target": q.target, "max_above": q.max_above, "burst": q.burst,
        "period_ms": q.period_ms, "start_ms": r3(q.start_ms),
        "add": a.json(), "del": summarize(&q.del).json(),
        // The ADDs dipamd served from the pool (no delegate exec in its log).
        "add_from_pool": summarize(hits).json(),
        "add_samples_ms": q.add.iter().map(|x| r3(*x)).collect::<Vec<_>>(),
        "hits": q.hits, "misses": q.misses, "kept_up": q.kept_up(),
        "ready_before_each_burst": q.ready_before, "raised_target": q.raised_target,
        "late_ms": r3(q.late_ms), "run_ms": r3(q.run_ms),
        // Against host-local's ADD exec'd directly at the same N (ptp + host-local costs at
        // least that: this ratio is the conservative one).
        "p99_vs_host_local_p99": r3(ratio(a.p99, f.p99)),
        "p50_vs_host_local_p50": r3(ratio(a.p50, f.p50)),
    })
}
