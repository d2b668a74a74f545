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
        self.line(format!(
            "{:>6} {:>6} {:>9} {:>9} {:>6} {:>11} {:>11} {:>6}   {:^15} {:>9}",
            "N",
            "stale",
            "floor",
            "CNI GC",
            "ratio",
            "runtime 1st",
            "runtime 2nd",
            "ratio",
            "pooled ADD",
            "hits/miss"
        ));
        for p in &d.points {
            let g = &p.gc;
            self.line(format!(
                "{:>6} {:>6} {:>9.0} {:>9.0} {:>6.2} {:>11.0} {:>11.0} {:>6.2}   {} {:>4}/{:<4}",
                p.n,
                g.stale,
                g.floor_ms,
                g.cni_gc_ms,
                ratio(g.cni_gc_ms, g.floor_ms),
                g.runtime_first_ms,
                g.runtime_second_ms,
                ratio(g.runtime_first_ms + g.runtime_second_ms, g.runtime_floor_ms),
                pp(&summarize(&p.pool.add)),
                p.pool.hits,
                p.pool.misses
            ));
        }
        for (k, p) in d.points.iter().enumerate() {
            json_points.push(point_json(d, k, p));
        }
        self.density_targets(d);
        self.json.insert(
            "density".into(),
            json!({"range": RANGE, "points": json_points}),
        );
        if let Some(path) = svg {
            std::fs::write(path, plot::svg(d)).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
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
            let g = &p.gc;
            self.target(
                format!("CNI GC of {} stale at N={} / the floor", g.stale, p.n),
                format!(
                    "{:.2}x ({:.0} vs {:.0} ms)",
                    ratio(g.cni_gc_ms, g.floor_ms),
                    g.cni_gc_ms,
                    g.floor_ms
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
        "ledger_bytes": p.ledger.0, "ledger_allocated_bytes": p.ledger.1,
        "journal_bytes": p.journal.0, "journal_allocated_bytes": p.journal.1,
        "dipamctl_status_ms": summarize(&p.ctl_status).json(),
        "dipamctl_attachments_ms": summarize(&p.ctl_attachments).json(),
        "gc": {"stale": p.gc.stale, "floor_ms": r3(p.gc.floor_ms),
               "cni_gc_ms": r3(p.gc.cni_gc_ms),
               "runtime_floor_ms": r3(p.gc.runtime_floor_ms),
               "runtime_first_pass_ms": r3(p.gc.runtime_first_ms),
               "runtime_second_pass_ms": r3(p.gc.runtime_second_ms)},
        "pool": {"size": p.pool.size, "start_ms": r3(p.pool.start_ms),
                 "add": summarize(&p.pool.add).json(), "del": summarize(&p.pool.del).json(),
                 "hits": p.pool.hits, "misses": p.pool.misses},
    })
}
