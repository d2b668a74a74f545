//! Prometheus metrics on a loopback TCP port or a unix socket, off by default
//! (`--metrics-address`, `--metrics-socket`).
//!
//! The registry and its encoding are prometheus-client's (the Prometheus project's Rust
//! client): every series carries `# HELP` and `# TYPE`, and the exposition is the OpenMetrics
//! text format, which Prometheus negotiates and parses (docs/metrics.md). The registry is an
//! [`Observer`]: dipamd's parts emit [`Event`]s as they work, counters, gauges and histograms
//! follow them, and a scrape only encodes the registry. It never reads the ledger, the agent,
//! the pool or the spool: a scrape costs the same on a node with ten thousand attachments as
//! on an empty one, and cannot wait behind a commit. How fresh each gauge is: docs/metrics.md.
//!
//! Served with hyper (already in dipamd through tonic): one GET per connection, then the
//! connection is closed, as Prometheus scrapes and as a plain `GET` read to EOF expects.

use std::{collections::BTreeSet, sync::Mutex};

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::Histogram,
    },
    registry::Registry,
};
use tracing::warn;

use crate::l1_leaves::events::{Event, Observer};

mod series;
mod serve;
#[cfg(test)]
mod tests;

use series::{
    DivergenceSeries, GcSeries, PoolSeries, RangeSeries, RequestSeries, RuntimeGcSeries,
    SpoolSeries, TeardownSeries,
};
pub use serve::{serve_tcp, serve_unix};

/// Latency buckets, in seconds: a delegate exec is milliseconds, a slow one seconds.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a scrape answers with: OpenMetrics text 1.0.0, what prometheus-client encodes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Label sets, in the order the series have always had them.
type L1 = [(&'static str, String); 1];
type L2 = [(&'static str, String); 2];
type L3 = [(&'static str, String); 3];
/// A gauge that holds an address count exactly up to 2^53 (an IPv6 range's size is past i64).
type Count = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone)]
struct Buckets;

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(BUCKETS)
    }
}

/// dipamd's metrics: a registry fed by events.
pub struct Metrics {
    registry: Registry,
    request: RequestSeries,
    pool: PoolSeries,
    attachments: Family<L2, Gauge>,
    agent_addresses: Family<L1, Gauge>,
    gc: GcSeries,
    conflicts: Counter,
    agent_reestablished: Counter,
    intents_replayed: Counter,
    teardown: TeardownSeries,
    privilege_failures: Counter,
    spool: SpoolSeries,
    ledger_writable: Gauge,
    listener_up: Family<L1, Gauge>,
    divergence: DivergenceSeries,
    history_dropped: Counter,
    runtime_gc: RuntimeGcSeries,
    range: RangeSeries,
    /// Range series last published: a network, family or state no longer present loses its
    /// series.
    range_series: Mutex<BTreeSet<(String, String, &'static str)>>,
    /// Agent states last published: a state no longer present loses its series.
    agent_states: Mutex<BTreeSet<String>>,
    /// Warm pools last published: a pool no longer present loses its series.
    pools: Mutex<BTreeSet<(String, String)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// Registers `metric` under `name`. prometheus-client appends `_total` to a counter's name in
/// the exposition, so counters are registered without it: the series keep their names. It
/// also ends every help text with a period of its own, so one the text has is dropped (a
/// `# HELP` line ending in ".." in Prometheus and Grafana otherwise).
fn reg<M>(r: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    let name = name.strip_suffix("_total").unwrap_or(name);
    let help = help.strip_suffix('.').unwrap_or(help);
    r.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::default();
        Self {
            request: RequestSeries::register(&mut r),
            attachments: reg(
                &mut r,
                "dipam_attachments",
                "Attachments in the ledger, by owner and network.",
                Family::default(),
            ),
            agent_addresses: reg(
                &mut r,
                "dipam_agent_addresses",
                "Agent-owned addresses by state.",
                Family::default(),
            ),
            pool: PoolSeries::register(&mut r),
            gc: GcSeries::register(&mut r),
            conflicts: reg(
                &mut r,
                "dipam_conflicts_total",
                "Results refused because they held an address the ledger gives someone else.",
                Counter::default(),
            ),
            agent_reestablished: reg(
                &mut r,
                "dipam_agent_reestablished_total",
                "Agent addresses the delegate had lost, taken again.",
                Counter::default(),
            ),
            intents_replayed: reg(
                &mut r,
                "dipam_intents_replayed_total",
                "Interrupted operations released at start.",
                Counter::default(),
            ),
            teardown: TeardownSeries::register(&mut r),
            privilege_failures: reg(
                &mut r,
                "dipam_privilege_failures_total",
                "Operations that failed for lack of a privilege (EPERM, EACCES).",
                Counter::default(),
            ),
            spool: SpoolSeries::register(&mut r),
            ledger_writable: reg(
                &mut r,
                "dipam_ledger_writable",
                "1 while the ledger takes commits; 0 while they fail (a full disk under \
                 --state-dir: every ADD and DEL fails until it is 1 again).",
                Gauge::default(),
            ),
            listener_up: reg(
                &mut r,
                "dipam_metrics_listener_up",
                "1 while the metrics listener (tcp: --metrics-address, unix: --metrics-socket) \
                 is bound; 0 while dipamd retries its bind (something else holds the address).",
                Family::default(),
            ),
            divergence: DivergenceSeries::register(&mut r),
            history_dropped: reg(
                &mut r,
                "dipam_history_events_dropped_total",
                "History events dropped because the writer fell behind.",
                Counter::default(),
            ),
            runtime_gc: RuntimeGcSeries::register(&mut r),
            range: RangeSeries::register(&mut r),
            registry: r,
            range_series: Mutex::default(),
            agent_states: Mutex::default(),
            pools: Mutex::default(),
        }
    }

    /// Whether the metrics listener `kind` (tcp, unix) is bound.
    pub fn listener_up(&self, kind: &'static str, up: bool) {
        self.listener_up
            .get_or_create(&[("listener", kind.to_owned())])
            .set(i64::from(up));
    }

    /// The exposition: every registered series, then `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

fn l1(k: &'static str, v: &str) -> L1 {
    [(k, v.to_owned())]
}

fn l2(k1: &'static str, v1: &str, k2: &'static str, v2: &str) -> L2 {
    [(k1, v1.to_owned()), (k2, v2.to_owned())]
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Sets `family` to exactly `rows`: series not among them since the last call are removed.
fn set_whole<K: Ord + Clone>(
    family: &[&Family<L2, Gauge>],
    seen: &Mutex<BTreeSet<K>>,
    rows: impl Iterator<Item = (K, L2, Vec<i64>)>,
    labels_of: impl Fn(&K) -> L2,
) {
    let mut now = BTreeSet::new();
    for (k, labels, values) in rows {
        for (f, v) in family.iter().zip(values) {
            f.get_or_create(&labels).set(v);
        }
        now.insert(k);
    }
    if let Ok(mut seen) = seen.lock() {
        for gone in seen.difference(&now) {
            for f in family {
                f.remove(&labels_of(gone));
            }
        }
        *seen = now;
    }
}

/// What the range series hold: `size` under state "size" (dipam_range_size), the others
/// under their state (dipam_range_addresses).
const SIZE: &str = "size";

impl Metrics {
    /// Sets the range series to exactly `counts`: a series not among them is removed.
    fn ranges(&self, counts: &[crate::l1_leaves::events::RangeCount]) {
        let mut now = BTreeSet::new();
        for c in counts {
            let rows = [
                (SIZE, c.size),
                ("pod", Some(c.pods)),
                ("agent", Some(c.agent)),
                ("pool", Some(c.pool)),
                ("orphan", c.orphans),
                ("free", c.free),
            ];
            for (state, n) in rows {
                let Some(n) = n else { continue };
                // Exact up to 2^53; past that a float, as Prometheus stores every sample.
                #[allow(clippy::cast_precision_loss)]
                let v = n as f64;
                if state == SIZE {
                    self.range
                        .size
                        .get_or_create(&l2("network", &c.network, "family", c.family))
                        .set(v);
                } else {
                    self.range
                        .addresses
                        .get_or_create(&l3(&c.network, c.family, state))
                        .set(v);
                }
                now.insert((c.network.clone(), c.family.to_owned(), state));
            }
        }
        if let Ok(mut seen) = self.range_series.lock() {
            for (network, family, state) in seen.difference(&now) {
                if *state == SIZE {
                    self.range
                        .size
                        .remove(&l2("network", network, "family", family));
                } else {
                    self.range.addresses.remove(&l3(network, family, state));
                }
            }
            *seen = now;
        }
    }
}

fn l3(network: &str, family: &str, state: &str) -> L3 {
    [
        ("network", network.to_owned()),
        ("family", family.to_owned()),
        ("state", state.to_owned()),
    ]
}

impl Observer for Metrics {
    fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::Request { .. }
            | Event::InFlight { .. }
            | Event::Exec { .. }
            | Event::LedgerOp { .. }
            | Event::StaleDel
            | Event::CrossedDel => self.request.observe(event),
            Event::LedgerWritable(w) => {
                self.ledger_writable.set(i64::from(w));
            }
            Event::Attachments {
                network,
                owner,
                count,
            } => {
                self.attachments
                    .get_or_create(&l2("owner", owner, "network", network))
                    .set(gauge_value(count));
            }
            Event::AttachmentDelta {
                network,
                owner,
                delta,
            } => {
                self.attachments
                    .get_or_create(&l2("owner", owner, "network", network))
                    .inc_by(delta);
            }
            Event::IntentReplayed => {
                self.intents_replayed.inc();
            }
            Event::GcFreed(_) | Event::GcRefused => self.gc.observe(event),
            Event::Freed { by, .. } => {
                if by.counted_at_freed() {
                    self.gc.freed.inc();
                }
            }
            Event::Conflict => {
                self.conflicts.inc();
            }
            Event::AgentReestablished => {
                self.agent_reestablished.inc();
            }
            Event::AgentAddresses(states) => self.agent_addresses(states),
            Event::PoolRequest { outcome } => {
                self.pool
                    .requests
                    .get_or_create(&l1("outcome", outcome))
                    .inc();
            }
            Event::PoolRefillFailed => {
                self.pool.refill_failures.inc();
            }
            Event::PoolRefilled => {
                self.pool.refills.inc();
            }
            Event::PoolReleased => {
                self.pool.releases.inc();
            }
            Event::PoolLevel {
                network,
                digest,
                ready,
                target,
            } => self.pool_level(network, digest, ready, target),
            Event::PoolLevels(levels) => self.pool_levels(levels),
            Event::TeardownDeleted(_) | Event::TeardownFailed => self.teardown.observe(event),
            Event::PrivilegeDenied => {
                self.privilege_failures.inc();
            }
            Event::SpoolDepth(_)
            | Event::SpoolQuarantined
            | Event::SpoolUntrusted(_)
            | Event::SpoolMismatched(_) => self.spool.observe(event),
            Event::Divergence {
                missing,
                orphans,
                alive,
            } => self.divergence.set(missing, orphans, alive),
            Event::Ranges(counts) => self.ranges(counts),
            Event::HistoryDropped => {
                self.history_dropped.inc();
            }
            Event::RuntimeGcPass {
                freed,
                kept_grace,
                refusing,
            } => self.runtime_gc_pass(freed, kept_grace, refusing),
        }
    }
}

impl Metrics {
    /// The agent's addresses by state; a state no longer present loses its series.
    fn agent_addresses(&self, states: &[(&str, u64)]) {
        let mut now = BTreeSet::new();
        for (state, n) in states {
            self.agent_addresses
                .get_or_create(&l1("state", state))
                .set(gauge_value(*n));
            now.insert((*state).to_owned());
        }
        if let Ok(mut seen) = self.agent_states.lock() {
            for gone in seen.difference(&now) {
                self.agent_addresses.remove(&l1("state", gone));
            }
            *seen = now;
        }
    }

    /// One warm pool's level.
    fn pool_level(&self, network: &str, digest: &str, ready: u64, target: u64) {
        let l = l2("network", network, "digest", digest);
        self.pool.ready.get_or_create(&l).set(gauge_value(ready));
        self.pool.target.get_or_create(&l).set(gauge_value(target));
        if let Ok(mut seen) = self.pools.lock() {
            seen.insert((network.to_owned(), digest.to_owned()));
        }
    }

    /// Every warm pool's level; a pool no longer present loses its series.
    fn pool_levels(&self, levels: &[crate::l1_leaves::events::PoolLevel<'_>]) {
        set_whole(
            &[&self.pool.ready, &self.pool.target, &self.pool.in_use],
            &self.pools,
            levels
                .iter()
                .map(|(network, digest, ready, target, in_use)| {
                    (
                        ((*network).to_owned(), (*digest).to_owned()),
                        l2("network", network, "digest", digest),
                        vec![
                            gauge_value(*ready),
                            gauge_value(*target),
                            gauge_value(*in_use),
                        ],
                    )
                }),
            |(network, digest)| l2("network", network, "digest", digest),
        )
    }

    /// One pass of the runtime-aware GC, refused or not.
    fn runtime_gc_pass(&self, freed: u64, kept_grace: u64, refusing: Option<&str>) {
        self.runtime_gc.passes.inc();
        self.runtime_gc.freed.inc_by(freed);
        self.runtime_gc.kept_grace.set(gauge_value(kept_grace));
        if let Some(reason) = refusing {
            self.runtime_gc
                .refusals
                .get_or_create(&l1("reason", reason))
                .inc();
        }
        self.runtime_gc.refusing.set(i64::from(refusing.is_some()));
    }
}
