//! Prometheus metrics, in the text exposition format, on a loopback TCP port or a unix socket,
//! off by default (`--metrics-address`, `--metrics-socket`).
//!
//! Hand-rolled rather than the `metrics` crates: a few counters and histograms, rendered on
//! scrape, need no recorder, registry or HTTP stack of their own (and no extra build time on a
//! 2-core node); the listener answers one GET per connection, as Prometheus scrapes.
//! Counters and histograms are updated on the request path (`dipam_pool_requests_total` by
//! outcome: hit, miss, bypass); gauges (attachments, agent addresses, warm pool, spool depth,
//! divergence, whether the ledger takes commits) are computed from dipamd's state at scrape time.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use dipam_state::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use crate::shim::Shim;

/// Latency buckets, in seconds: a delegate exec is milliseconds, a slow one seconds.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Default, Clone)]
struct Hist {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

/// The request-path metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), u64>>,
    hists: Mutex<BTreeMap<(&'static str, String), Hist>>,
    /// Interrupted operations released by the start-up replay.
    pub intents_replayed: AtomicU64,
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(s, "{k}=\"{v}\"");
    }
    s
}

impl Metrics {
    pub fn inc(&self, name: &'static str, pairs: &[(&str, &str)]) {
        if let Ok(mut c) = self.counters.lock() {
            *c.entry((name, labels(pairs))).or_default() += 1;
        }
    }

    pub fn observe(&self, name: &'static str, pairs: &[(&str, &str)], seconds: f64) {
        if let Ok(mut h) = self.hists.lock() {
            let e = h.entry((name, labels(pairs))).or_default();
            for (i, b) in BUCKETS.iter().enumerate() {
                if seconds <= *b {
                    e.counts[i] += 1;
                }
            }
            e.sum += seconds;
            e.count += 1;
        }
    }

    pub(crate) fn render_into(&self, out: &mut String) {
        let counters = self.counters.lock().map(|c| c.clone()).unwrap_or_default();
        let mut last = "";
        for ((name, l), v) in &counters {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} counter");
                last = name;
            }
            let _ = writeln!(out, "{name}{} {v}", braces(l));
        }
        let hists = self.hists.lock().map(|h| h.clone()).unwrap_or_default();
        let mut last = "";
        for ((name, l), h) in &hists {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} histogram");
                last = name;
            }
            let sep = if l.is_empty() { "" } else { "," };
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(out, "{name}_bucket{{{l}{sep}le=\"{b}\"}} {}", h.counts[i]);
            }
            let _ = writeln!(out, "{name}_bucket{{{l}{sep}le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "{name}_sum{} {}", braces(l), h.sum);
            let _ = writeln!(out, "{name}_count{} {}", braces(l), h.count);
        }
    }
}

/// `{labels}`, or nothing for a series without labels.
fn braces(l: &str) -> String {
    if l.is_empty() {
        String::new()
    } else {
        format!("{{{l}}}")
    }
}

fn gauge(out: &mut String, name: &str, help: &str, rows: &[(String, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (l, v) in rows {
        if l.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
    }
}

/// The whole exposition: request-path metrics plus gauges from dipamd's state.
pub async fn render<S: Store>(shim: &Shim<S>) -> String {
    let mut out = String::new();
    shim.metrics.render_into(&mut out);
    shim.exec.metrics.render_into(&mut out);
    let records = shim.ledger(|l| l.list(None)).await.unwrap_or_default();
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for r in &records {
        let owner = r.owner.label();
        *by.entry(labels(&[
            ("owner", owner.as_str()),
            ("network", r.key.network.as_str()),
        ]))
        .or_default() += 1;
    }
    gauge(
        &mut out,
        "dipam_attachments",
        "Attachments in the ledger, by owner and network.",
        &by.into_iter().collect::<Vec<_>>(),
    );
    let mut agent: BTreeMap<String, u64> = BTreeMap::new();
    for a in shim.agent.snapshot().addresses {
        *agent
            .entry(labels(&[("state", a.state.as_str())]))
            .or_default() += 1;
    }
    gauge(
        &mut out,
        "dipam_agent_addresses",
        "Agent-owned addresses by state.",
        &agent.into_iter().collect::<Vec<_>>(),
    );
    let (mut ready, mut target) = (Vec::new(), Vec::new());
    for p in shim.pool.status() {
        let l = labels(&[
            ("network", p.network.as_str()),
            ("digest", p.config_digest.as_str()),
        ]);
        ready.push((l.clone(), u64::from(p.ready)));
        target.push((l, u64::from(p.target)));
    }
    gauge(
        &mut out,
        "dipam_pool_ready",
        "Warm-pool entries ready to hand out, by network and config digest.",
        &ready,
    );
    gauge(
        &mut out,
        "dipam_pool_target",
        "Warm-pool entries the refiller keeps (0: surplus being released).",
        &target,
    );
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let single = |out: &mut String, name: &str, kind: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    single(
        &mut out,
        "dipam_gc_freed_total",
        "counter",
        "Attachments freed by GC.",
        load(&shim.gc_stats.freed),
    );
    single(
        &mut out,
        "dipam_gc_refused_total",
        "counter",
        "GC runs refused by an interlock.",
        load(&shim.gc_stats.refused),
    );
    single(
        &mut out,
        "dipam_conflicts_total",
        "counter",
        "Results refused because they held an address the ledger gives someone else.",
        load(&shim.agent.conflicts),
    );
    single(
        &mut out,
        "dipam_agent_reestablished_total",
        "counter",
        "Agent addresses the delegate had lost, taken again.",
        load(&shim.agent.reestablished),
    );
    single(
        &mut out,
        "dipam_intents_replayed_total",
        "counter",
        "Interrupted operations released at start.",
        load(&shim.metrics.intents_replayed),
    );
    single(
        &mut out,
        "dipam_pool_refill_failures_total",
        "counter",
        "Warm-pool refills that failed (retried with backoff).",
        load(&shim.pool.refill_failures),
    );
    let teardown = shim.teardown.get();
    single(
        &mut out,
        "dipam_teardown_deleted_total",
        "counter",
        "Retired pod veths (main mode) dipamd deleted.",
        teardown.map_or(0, |t| load(&t.stats.deleted)),
    );
    single(
        &mut out,
        "dipam_teardown_failures_total",
        "counter",
        "Retired pod veths dipamd failed to delete (and link listings that failed).",
        teardown.map_or(0, |t| load(&t.stats.failures)),
    );
    single(
        &mut out,
        "dipam_privilege_failures_total",
        "counter",
        "Operations that failed for lack of a privilege (EPERM, EACCES).",
        shim.denials.count(),
    );
    single(
        &mut out,
        "dipam_spool_depth",
        "gauge",
        "Spooled DELs waiting to be replayed.",
        crate::spool::depth(&shim.identity.spool_dir) as u64,
    );
    single(
        &mut out,
        "dipam_spool_quarantined_total",
        "counter",
        "Spooled DELs moved to failed/ (unusable, or failing the spool rule) since start.",
        load(&shim.spool.quarantined),
    );
    single(
        &mut out,
        "dipam_spool_untrusted",
        "gauge",
        "1 when the spool directory fails the spool rule and nothing in it is replayed.",
        u64::from(shim.spool.untrusted().is_some()),
    );
    single(
        &mut out,
        "dipam_spool_mismatched_networks",
        "gauge",
        "Networks whose config names a spoolDir other than dipamd's spool.",
        shim.spool.mismatched().len() as u64,
    );
    single(
        &mut out,
        "dipam_ledger_writable",
        "gauge",
        "1 while the ledger takes commits; 0 while they fail (a full disk under --state-dir: \
         every ADD and DEL fails until it is 1 again).",
        u64::from(shim.ledger.store().fault().is_none()),
    );
    single(
        &mut out,
        "dipam_divergence_missing",
        "gauge",
        "Recorded addresses missing from the delegate's store at the last reconcile.",
        load(&shim.gc_stats.missing),
    );
    single(
        &mut out,
        "dipam_divergence_orphans",
        "gauge",
        "Reservations the ledger does not know, at the last reconcile.",
        load(&shim.gc_stats.orphans),
    );
    single(
        &mut out,
        "dipam_history_events_dropped_total",
        "counter",
        "History events dropped because the writer fell behind.",
        shim.exec
            .history
            .get()
            .map_or(0, crate::history::Sink::dropped),
    );
    out
}

/// Answers one HTTP request on `stream` with the exposition (any path: it is all there is).
async fn answer<S: Store, IO>(shim: &Shim<S>, mut stream: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 4096];
    let mut seen = 0;
    // Read the request head (bounded), then answer and close.
    while seen < buf.len() {
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            stream.read(&mut buf[seen..]),
        )
        .await
        {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                seen += n;
                if buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let body = render(shim).await;
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Serves metrics on a TCP address until the process ends.
pub async fn serve_tcp<S: Store>(shim: Arc<Shim<S>>, listener: tokio::net::TcpListener) {
    info!(address = ?listener.local_addr().ok(), "metrics on TCP");
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shim = Arc::clone(&shim);
                tokio::spawn(async move { answer(&shim, stream).await });
            }
            Err(e) => warn!(error = %e, "metrics accept failed"),
        }
    }
}

/// Serves metrics on a unix socket until the process ends.
pub async fn serve_unix<S: Store>(shim: Arc<Shim<S>>, listener: tokio::net::UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shim = Arc::clone(&shim);
                tokio::spawn(async move { answer(&shim, stream).await });
            }
            Err(e) => warn!(error = %e, "metrics accept failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_the_text_format() {
        let m = Metrics::default();
        m.inc("dipam_requests_total", &[("op", "ADD"), ("code", "0")]);
        m.inc("dipam_requests_total", &[("op", "ADD"), ("code", "0")]);
        m.observe("dipam_request_duration_seconds", &[("op", "ADD")], 0.003);
        let mut out = String::new();
        m.render_into(&mut out);
        assert!(out.contains("# TYPE dipam_requests_total counter"));
        assert!(out.contains("dipam_requests_total{op=\"ADD\",code=\"0\"} 2"));
        assert!(out.contains("dipam_request_duration_seconds_bucket{op=\"ADD\",le=\"0.0025\"} 0"));
        assert!(out.contains("dipam_request_duration_seconds_bucket{op=\"ADD\",le=\"0.005\"} 1"));
        assert!(out.contains("dipam_request_duration_seconds_count{op=\"ADD\"} 1"));
        assert_eq!(labels(&[("a", "q\"x")]), "a=\"q\\\"x\"");
        m.observe("dipam_ledger_op_duration_seconds", &[], 0.0004);
        let mut out = String::new();
        m.render_into(&mut out);
        assert!(out.contains("dipam_ledger_op_duration_seconds_bucket{le=\"0.001\"} 1"));
        assert!(
            out.contains("dipam_ledger_op_duration_seconds_count 1"),
            "{out}"
        );
    }
}
