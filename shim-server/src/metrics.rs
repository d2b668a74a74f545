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

use std::{
    collections::BTreeSet,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::Histogram,
    },
    registry::Registry,
};
use tracing::{info, warn};

use crate::events::{Event, Observer};
use crate::metrics_listen::Unrequested;

/// Latency buckets, in seconds: a delegate exec is milliseconds, a slow one seconds.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a scrape answers with: OpenMetrics text 1.0.0, what prometheus-client encodes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

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
    requests: Family<L2, Counter>,
    request_duration: Family<L1, Histogram, Buckets>,
    in_flight: Family<L1, Gauge>,
    exec_duration: Family<L2, Histogram, Buckets>,
    ledger_duration: Histogram,
    stale_dels: Counter,
    crossed_dels: Counter,
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

/// The warm pool: pod ADDs that met it, its level and target, its failed refills.
struct PoolSeries {
    requests: Family<L1, Counter>,
    ready: Family<L2, Gauge>,
    target: Family<L2, Gauge>,
    in_use: Family<L2, Gauge>,
    refills: Counter,
    releases: Counter,
    refill_failures: Counter,
}

impl PoolSeries {
    fn register(r: &mut Registry) -> Self {
        let series = Self::families(r);
        // Every outcome from the start, at 0: `increase(...{outcome="miss"}[15m])` (the
        // DipamWarmPoolMissing alert) then sees the first miss as an increase, and a scrape
        // names the series whether or not the pool is on.
        for outcome in ["hit", "miss", "bypass"] {
            let _ = series.requests.get_or_create(&l1("outcome", outcome));
        }
        series
    }

    fn families(r: &mut Registry) -> Self {
        Self {
            requests: reg(
                r,
                "dipam_pool_requests_total",
                "Pod ADDs that met the warm pool, by outcome (hit: a take, miss: found it empty, \
                 bypass).",
                Family::default(),
            ),
            ready: reg(
                r,
                "dipam_pool_ready",
                "Warm-pool entries ready to hand out, by network and config digest.",
                Family::default(),
            ),
            target: reg(
                r,
                "dipam_pool_target",
                "Warm-pool entries the refiller keeps now: the target raised by recent demand, \
                 or what the minimum asks (0: surplus being released).",
                Family::default(),
            ),
            in_use: reg(
                r,
                "dipam_pool_in_use",
                "The network's attachments that are not the warm pool's (pods, agent), as its \
                 refiller last counted them.",
                Family::default(),
            ),
            refills: reg(
                r,
                "dipam_pool_refills_total",
                "Warm-pool entries made.",
                Counter::default(),
            ),
            releases: reg(
                r,
                "dipam_pool_releases_total",
                "Warm-pool entries released (surplus after the cool-down, stale, given back).",
                Counter::default(),
            ),
            refill_failures: reg(
                r,
                "dipam_pool_refill_failures_total",
                "Warm-pool refills that failed (retried with backoff).",
                Counter::default(),
            ),
        }
    }
}

/// GC of the network (CNI GC and `dipamctl gc`).
struct GcSeries {
    freed: Counter,
    refused: Counter,
}

impl GcSeries {
    fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::GcFreed(n) => {
                self.freed.inc_by(n);
            }
            Event::GcRefused => {
                self.refused.inc();
            }
            _ => {}
        }
    }

    fn register(r: &mut Registry) -> Self {
        Self {
            freed: reg(
                r,
                "dipam_gc_freed_total",
                "Attachments freed by GC.",
                Counter::default(),
            ),
            refused: reg(
                r,
                "dipam_gc_refused_total",
                "GC runs refused by an interlock.",
                Counter::default(),
            ),
        }
    }
}

/// Retired pod veths (main mode).
struct TeardownSeries {
    deleted: Counter,
    failures: Counter,
}

impl TeardownSeries {
    fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::TeardownDeleted(n) => {
                self.deleted.inc_by(n);
            }
            Event::TeardownFailed => {
                self.failures.inc();
            }
            _ => {}
        }
    }

    fn register(r: &mut Registry) -> Self {
        Self {
            deleted: reg(
                r,
                "dipam_teardown_deleted_total",
                "Retired pod veths (main mode) dipamd deleted.",
                Counter::default(),
            ),
            failures: reg(
                r,
                "dipam_teardown_failures_total",
                "Retired pod veths dipamd failed to delete (and link listings that failed).",
                Counter::default(),
            ),
        }
    }
}

/// The DEL spool.
struct SpoolSeries {
    depth: Gauge,
    quarantined: Counter,
    untrusted: Gauge,
    mismatched: Gauge,
}

impl SpoolSeries {
    /// A spool event: its depth, a quarantined file, its trust, its mismatched files.
    fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::SpoolDepth(n) => {
                self.depth.set(gauge_value(n));
            }
            Event::SpoolQuarantined => {
                self.quarantined.inc();
            }
            Event::SpoolUntrusted(u) => {
                self.untrusted.set(i64::from(u));
            }
            Event::SpoolMismatched(n) => {
                self.mismatched.set(gauge_value(n));
            }
            _ => {}
        }
    }

    fn register(r: &mut Registry) -> Self {
        Self {
            depth: reg(
                r,
                "dipam_spool_depth",
                "Spooled DELs waiting to be replayed.",
                Gauge::default(),
            ),
            quarantined: reg(
                r,
                "dipam_spool_quarantined_total",
                "Spooled DELs moved to failed/ (unusable, or failing the spool rule) since start.",
                Counter::default(),
            ),
            untrusted: reg(
                r,
                "dipam_spool_untrusted",
                "1 when the spool directory fails the spool rule and nothing in it is replayed.",
                Gauge::default(),
            ),
            mismatched: reg(
                r,
                "dipam_spool_mismatched_networks",
                "Networks whose config names a spoolDir other than dipamd's spool.",
                Gauge::default(),
            ),
        }
    }
}

/// The delegate's store against the ledger, at the last reconcile.
struct DivergenceSeries {
    missing: Gauge,
    orphans: Gauge,
    unrecorded_alive: Gauge,
}

impl DivergenceSeries {
    fn set(&self, missing: u64, orphans: u64, alive: u64) {
        self.missing.set(gauge_value(missing));
        self.orphans.set(gauge_value(orphans));
        self.unrecorded_alive.set(gauge_value(alive));
    }

    fn register(r: &mut Registry) -> Self {
        Self {
            missing: reg(
                r,
                "dipam_divergence_missing",
                "Recorded addresses missing from the delegate's store at the last reconcile.",
                Gauge::default(),
            ),
            orphans: reg(
                r,
                "dipam_divergence_orphans",
                "Reservations the ledger does not know and nothing on the node uses (no \
             network namespace holds the address, no host route leads to it, the runtime \
             lists no such sandbox), at the last reconcile: freeable.",
                Gauge::default(),
            ),
            unrecorded_alive: reg(
                r,
                "dipam_divergence_unrecorded_alive",
                "Reservations the ledger does not know that a running pod uses, or that dipamd \
             cannot tell unused, left after the last reconcile adopted what it could: \
             kept, never freed.",
                Gauge::default(),
            ),
        }
    }
}

/// The runtime-aware GC (dipamd --cri-endpoint).
struct RuntimeGcSeries {
    passes: Counter,
    freed: Counter,
    kept_grace: Gauge,
    refusals: Family<L1, Counter>,
    refusing: Gauge,
}

impl RuntimeGcSeries {
    fn register(r: &mut Registry) -> Self {
        Self {
            passes: reg(
                r,
                "dipam_runtime_gc_passes_total",
                "Passes of the runtime-aware GC (dipamd --cri-endpoint), refused ones included",
                Counter::default(),
            ),
            freed: reg(
                r,
                "dipam_runtime_gc_freed_total",
                "Attachments the runtime-aware GC freed: made through CRI, their sandbox missed \
             by two consecutive passes",
                Counter::default(),
            ),
            kept_grace: reg(
                r,
                "dipam_runtime_gc_kept_grace",
                "Attachments made through CRI whose sandbox the runtime did not list, kept at \
             the last pass as younger than --gc-grace",
                Gauge::default(),
            ),
            refusals: {
                let family: Family<L1, Counter> = reg(
                    r,
                    "dipam_runtime_gc_refusals_total",
                    "Runtime-aware GC passes that freed nothing because the runtime's answer \
                 was not trusted, by reason (unreachable, error, empty, share)",
                    Family::default(),
                );
                // Every reason from the start, so that a rate over it needs no first refusal.
                for reason in crate::gc::runtime::REFUSALS {
                    family.get_or_create(&l1("reason", reason)).inc_by(0);
                }
                family
            },
            refusing: reg(
                r,
                "dipam_runtime_gc_refusing",
                "1 while the last runtime-aware GC pass refused (see \
             dipam_runtime_gc_refusals_total for why), 0 otherwise",
                Gauge::default(),
            ),
        }
    }
}

/// The delegate's ranges.
struct RangeSeries {
    size: Family<L2, Count>,
    addresses: Family<L3, Count>,
}

impl RangeSeries {
    fn register(r: &mut Registry) -> Self {
        Self {
            size: reg(
                r,
                "dipam_range_size",
                "Addresses the delegate hands out, by network and family (host-local: its \
             ranges less the gateway); absent where the delegate's ranges are not known",
                Family::default(),
            ),
            addresses: reg(
                r,
                "dipam_range_addresses",
                "Addresses of the delegate's ranges by network, family and state: pod, agent, \
             pool (held for them in the delegate's store, as the ledger accounts for \
             them), orphan (held, and accounted for by no ledger record) and free; orphan \
             and free are absent where the delegate's store is not readable",
                Family::default(),
            ),
        }
    }
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
            requests: reg(
                &mut r,
                "dipam_requests_total",
                "CNI requests answered, by verb and outcome (0, a CNI error code, or grpc:CODE).",
                Family::default(),
            ),
            request_duration: reg(
                &mut r,
                "dipam_request_duration_seconds",
                "Time to answer a CNI request, by verb.",
                Family::new_with_constructor(Buckets),
            ),
            in_flight: reg(
                &mut r,
                "dipam_requests_in_flight",
                "CNI requests being served now, by verb (an ADD whose plugin left counts until its rollback is done).",
                Family::default(),
            ),
            exec_duration: reg(
                &mut r,
                "dipam_delegate_exec_duration_seconds",
                "Time of one delegate exec, by delegate type and CNI command.",
                Family::new_with_constructor(Buckets),
            ),
            ledger_duration: reg(
                &mut r,
                "dipam_ledger_op_duration_seconds",
                "Time of one ledger operation (commits include their sync).",
                Histogram::new(BUCKETS),
            ),
            stale_dels: reg(
                &mut r,
                "dipam_stale_dels_total",
                "DELs older than the last ADD of their attachment, ignored.",
                Counter::default(),
            ),
            crossed_dels: reg(
                &mut r,
                "dipam_crossed_dels_total",
                "DELs of a container held on another network only (a conflist swapped under \
                 running pods).",
                Counter::default(),
            ),
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
    fn ranges(&self, counts: &[crate::events::RangeCount]) {
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
            Event::Request { op, code, took, .. } => {
                self.requests
                    .get_or_create(&l2("op", op, "code", code))
                    .inc();
                self.request_duration
                    .get_or_create(&l1("op", op))
                    .observe(took.as_secs_f64());
            }
            Event::InFlight { op, delta } => {
                self.in_flight.get_or_create(&l1("op", op)).inc_by(delta);
            }
            Event::Exec {
                delegate,
                command,
                took,
                ..
            } => self
                .exec_duration
                .get_or_create(&l2("delegate", delegate, "command", command))
                .observe(took.as_secs_f64()),
            Event::LedgerOp { took } => self.ledger_duration.observe(took.as_secs_f64()),
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
            Event::StaleDel => {
                self.stale_dels.inc();
            }
            Event::CrossedDel => {
                self.crossed_dels.inc();
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
    fn pool_levels(&self, levels: &[crate::events::PoolLevel<'_>]) {
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

/// One scrape: the exposition for GET (and HEAD), any path, since it is all there is.
fn answer(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut res = if req.method() == Method::GET || req.method() == Method::HEAD {
        let body = if req.method() == Method::GET {
            metrics.render()
        } else {
            String::new()
        };
        let mut res = Response::new(Full::new(Bytes::from(body)));
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(CONTENT_TYPE),
        );
        res
    } else {
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        res
    };
    // One request per connection: a client reading to EOF (curl, a plain socket) gets it.
    res.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    res
}

/// Serves one connection: one request, then the connection is closed. `requested` is called
/// once its request head has arrived.
async fn connection<IO>(metrics: Arc<Metrics>, io: IO, requested: impl Fn() + Send + Sync + 'static)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        requested();
        let res = answer(&metrics, &req);
        async move { Ok::<_, Infallible>(res) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "metrics connection ended with an error");
    }
}

/// The longest one metrics connection lives, whatever the peer does: a scrape is one
/// request and one response of a few kilobytes; a reader that never drains the response
/// would otherwise hold its place in the listener's cap forever.
const CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves one connection within [`CONNECTION_LIFETIME`], and closes it early if, before its
/// request head has arrived, a newer connection needs its place (`room`).
async fn bounded<IO>(metrics: Arc<Metrics>, io: IO, room: Arc<Unrequested>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (id, evicted) = room.enter();
    let requested = {
        let room = Arc::clone(&room);
        move || room.leave(id)
    };
    let served = tokio::time::timeout(CONNECTION_LIFETIME, connection(metrics, io, requested));
    tokio::select! {
        outcome = served => if outcome.is_err() {
            tracing::debug!("metrics connection closed: it outlived its time");
        },
        // A sender dropped (the head arrived) disables this branch; only an eviction ends here.
        Ok(()) = evicted => {
            tracing::debug!("metrics connection closed before its request: a newer one needed its place");
        }
    }
    room.leave(id);
}

/// Serves metrics on a TCP address until the process ends, through `gate` (listen.rs: a cap
/// on connections, the shared descriptor budget, back-off on accept errors). At the cap, the
/// oldest connection that has not sent its request makes room for the new one
/// ([`Unrequested`]): when new ones waited instead, anyone holding idle connections to the
/// port kept every scrape waiting behind them (0 of 3 scrapes answered).
pub async fn serve_tcp(
    metrics: Arc<Metrics>,
    listener: tokio::net::TcpListener,
    gate: crate::listen::Gate,
) {
    // Displayed, not debugged: an operator reads `address=127.0.0.1:9090`, never `Some(..)`.
    match listener.local_addr() {
        Ok(a) => info!(address = %a, "metrics on TCP"),
        Err(e) => info!(error = %e, "metrics on TCP (its address is unknown)"),
    }
    let room = Arc::new(Unrequested::default());
    loop {
        let stream = gate
            .accept_tcp_making_room(&listener, || room.evict_oldest())
            .await;
        tokio::spawn(bounded(Arc::clone(&metrics), stream, Arc::clone(&room)));
    }
}

/// Serves metrics on a unix socket until the process ends, through `gate`.
pub async fn serve_unix(
    metrics: Arc<Metrics>,
    listener: tokio::net::UnixListener,
    gate: crate::listen::Gate,
) {
    let room = Arc::new(Unrequested::default());
    loop {
        let stream = gate.accept_unix(&listener).await;
        tokio::spawn(bounded(Arc::clone(&metrics), stream, Arc::clone(&room)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series name in the exposition (samples, with their suffixes stripped back to the
    /// family the HELP and TYPE lines name).
    fn families(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let name = l.split(['{', ' ']).next().unwrap_or_default();
                ["_bucket", "_count", "_sum", "_total"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name)
                    .to_owned()
            })
            .collect()
    }

    /// A call counts while its handle lives, and no longer once dropped: a DEL whose plugin
    /// left drops its future, and an ADD's rollback ends with its task.
    #[test]
    fn a_call_is_in_flight_until_its_handle_is_dropped() {
        let m = Arc::new(Metrics::new());
        let events =
            crate::events::Events::new(vec![Arc::clone(&m) as Arc<dyn crate::events::Observer>]);
        let line = |m: &Metrics, op: &str| {
            m.render().lines().find_map(|l| {
                l.strip_prefix(&format!("dipam_requests_in_flight{{op=\"{op}\"}} "))
                    .map(str::to_owned)
            })
        };
        let add = events.in_flight("ADD");
        let del = events.in_flight("DEL");
        let second = events.in_flight("ADD");
        assert_eq!(line(&m, "ADD").as_deref(), Some("2"));
        drop(add);
        drop(del);
        assert_eq!(line(&m, "ADD").as_deref(), Some("1"));
        assert_eq!(line(&m, "DEL").as_deref(), Some("0"));
        drop(second);
        assert_eq!(line(&m, "ADD").as_deref(), Some("0"));
    }

    #[test]
    fn events_render_with_help_and_type_on_every_series() {
        let m = Metrics::new();
        let record = serde_json::Value::Null;
        for code in ["0", "0", "152"] {
            m.observe(&Event::Request {
                op: "ADD",
                code,
                took: Duration::from_millis(3),
                container_id: "c",
                record: &record,
            });
        }
        m.observe(&Event::InFlight {
            op: "ADD",
            delta: 1,
        });
        m.observe(&Event::Exec {
            delegate: "host-local",
            command: "ADD",
            took: Duration::from_micros(1500),
            container_id: "c",
            record: &record,
        });
        m.observe(&Event::LedgerOp {
            took: Duration::from_micros(400),
        });
        m.observe(&Event::Attachments {
            network: "n\"1",
            owner: "pod",
            count: 3,
        });
        m.observe(&Event::AttachmentDelta {
            network: "n\"1",
            owner: "pod",
            delta: -1,
        });
        m.observe(&Event::AgentAddresses(&[("held", 2), ("lost", 1)]));
        m.observe(&Event::AgentAddresses(&[("held", 3)]));
        m.observe(&Event::PoolLevels(&[
            ("n", "d1", 4, 8, 3),
            ("n", "d0", 1, 0, 0),
        ]));
        m.observe(&Event::PoolLevels(&[("n", "d1", 5, 8, 3)]));
        m.observe(&Event::PoolRefilled);
        m.observe(&Event::PoolRequest { outcome: "hit" });
        // A family renders only once it has a series: the metrics listener's, bound.
        m.listener_up("tcp", true);
        m.observe(&Event::GcFreed(2));
        m.observe(&Event::SpoolDepth(7));
        m.observe(&Event::LedgerWritable(true));
        m.observe(&Event::Divergence {
            missing: 1,
            orphans: 0,
            alive: 0,
        });
        let hl = crate::events::RangeCount {
            network: "net1".into(),
            family: "ipv4",
            size: Some(253),
            pods: 3,
            agent: 1,
            pool: 0,
            orphans: Some(1),
            free: Some(248),
            ..Default::default()
        };
        let v6 = crate::events::RangeCount {
            family: "ipv6",
            size: Some(u64::MAX),
            free: Some(u64::MAX - 1),
            ..hl.clone()
        };
        let opaque = crate::events::RangeCount {
            network: "az".into(),
            family: "ipv4",
            pods: 2,
            unknown: "azure-vnet-ipam keeps its ranges to itself".into(),
            ..Default::default()
        };
        m.observe(&Event::Ranges(&[hl.clone(), v6, opaque.clone()]));
        // Whole: the IPv6 row is gone, and so are its series.
        m.observe(&Event::Ranges(&[hl, opaque]));
        m.observe(&Event::RuntimeGcPass {
            freed: 0,
            kept_grace: 0,
            refusing: Some("unreachable"),
        });
        m.observe(&Event::RuntimeGcPass {
            freed: 2,
            kept_grace: 1,
            refusing: None,
        });
        let out = m.render();
        for want in [
            "dipam_requests_total{op=\"ADD\",code=\"0\"} 2",
            "dipam_requests_total{op=\"ADD\",code=\"152\"} 1",
            "dipam_request_duration_seconds_bucket{le=\"0.0025\",op=\"ADD\"} 0",
            "dipam_request_duration_seconds_bucket{le=\"0.005\",op=\"ADD\"} 3",
            "dipam_request_duration_seconds_count{op=\"ADD\"} 3",
            "dipam_requests_in_flight{op=\"ADD\"} 1",
            "dipam_delegate_exec_duration_seconds_count{delegate=\"host-local\",command=\"ADD\"} 1",
            "dipam_ledger_op_duration_seconds_bucket{le=\"0.001\"} 1",
            "dipam_ledger_op_duration_seconds_count 1",
            "dipam_attachments{owner=\"pod\",network=\"n\\\"1\"} 2",
            "dipam_agent_addresses{state=\"held\"} 3",
            "dipam_pool_ready{network=\"n\",digest=\"d1\"} 5",
            "dipam_pool_target{network=\"n\",digest=\"d1\"} 8",
            "dipam_pool_in_use{network=\"n\",digest=\"d1\"} 3",
            "dipam_pool_refills_total 1",
            "dipam_pool_requests_total{outcome=\"hit\"} 1",
            "\ndipam_gc_freed_total 2\n",
            "\ndipam_gc_refused_total 0\n",
            "\ndipam_stale_dels_total 0\n",
            "\ndipam_crossed_dels_total 0\n",
            "\ndipam_spool_depth 7\n",
            "\ndipam_ledger_writable 1\n",
            "\ndipam_divergence_missing 1\n",
            "\ndipam_history_events_dropped_total 0\n",
            "\ndipam_runtime_gc_passes_total 2\n",
            "\ndipam_runtime_gc_freed_total 2\n",
            "\ndipam_runtime_gc_kept_grace 1\n",
            "\ndipam_runtime_gc_refusing 0\n",
            "dipam_runtime_gc_refusals_total{reason=\"unreachable\"} 1",
            "dipam_runtime_gc_refusals_total{reason=\"empty\"} 0",
            "dipam_range_size{network=\"net1\",family=\"ipv4\"} 253.0",
            "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"pod\"} 3.0",
            "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"agent\"} 1.0",
            "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"orphan\"} 1.0",
            "dipam_range_addresses{network=\"net1\",family=\"ipv4\",state=\"free\"} 248.0",
            "dipam_range_addresses{network=\"az\",family=\"ipv4\",state=\"pod\"} 2.0",
            "# TYPE dipam_requests counter",
            "# TYPE dipam_attachments gauge",
            "# TYPE dipam_request_duration_seconds histogram",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        // Whole updates drop what is gone.
        assert!(!out.contains("state=\"lost\""), "{out}");
        assert!(!out.contains("digest=\"d0\""), "{out}");
        assert!(!out.contains("family=\"ipv6\""), "{out}");
        // What is not known has no series: no size, orphans or free for an opaque delegate.
        assert!(!out.contains("dipam_range_size{network=\"az\""), "{out}");
        for state in ["orphan", "free"] {
            assert!(
                !out.contains(&format!("network=\"az\",family=\"ipv4\",state=\"{state}\"")),
                "{out}"
            );
        }
        assert!(out.ends_with("# EOF\n"), "{out}");
        // Every series has its HELP and TYPE.
        let names = families(&out);
        assert_eq!(names.len(), 41, "{names:?}");
        for name in &names {
            assert!(
                out.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
            assert!(
                out.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
        }
        for help in out.lines().filter(|l| l.starts_with("# HELP ")) {
            assert!(help.ends_with('.') && !help.ends_with(".."), "{help:?}");
        }
        // docs/metrics.md lists every series (with its labels and meaning), and nothing else.
        let doc = include_str!("../../docs/metrics.md");
        let documented: BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `dipam_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| {
                let n = format!("dipam_{n}");
                n.strip_suffix("_total").map(str::to_owned).unwrap_or(n)
            })
            .collect();
        assert_eq!(documented, names, "docs/metrics.md's table vs the registry");
    }
}
