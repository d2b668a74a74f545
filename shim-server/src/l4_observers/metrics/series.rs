//! The series of dipamd's metrics, one group per part of dipamd that feeds them: each group
//! registers its families and, where its events are its own, follows them.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{BUCKETS, Buckets, Count, L1, L2, L3, gauge_value, l1, l2, reg};
use crate::l1_leaves::events::Event;

/// The CNI requests dipamd answers, the delegate execs and ledger operations behind them.
pub(super) struct RequestSeries {
    pub(super) requests: Family<L2, Counter>,
    pub(super) duration: Family<L1, Histogram, Buckets>,
    pub(super) in_flight: Family<L1, Gauge>,
    pub(super) exec_duration: Family<L2, Histogram, Buckets>,
    pub(super) ledger_duration: Histogram,
    pub(super) stale_dels: Counter,
    pub(super) crossed_dels: Counter,
}

impl RequestSeries {
    pub(super) fn observe(&self, event: &Event<'_>) {
        match *event {
            Event::Request { op, code, took, .. } => {
                self.requests
                    .get_or_create(&l2("op", op, "code", code))
                    .inc();
                self.duration
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
            Event::StaleDel => {
                self.stale_dels.inc();
            }
            Event::CrossedDel => {
                self.crossed_dels.inc();
            }
            _ => {}
        }
    }

    pub(super) fn register(r: &mut Registry) -> Self {
        Self {
            requests: reg(
                r,
                "dipam_requests_total",
                "CNI requests answered, by verb and outcome (0, a CNI error code, or grpc:CODE).",
                Family::default(),
            ),
            duration: reg(
                r,
                "dipam_request_duration_seconds",
                "Time to answer a CNI request, by verb.",
                Family::new_with_constructor(Buckets),
            ),
            in_flight: reg(
                r,
                "dipam_requests_in_flight",
                "CNI requests being served now, by verb (an ADD whose plugin left counts until its rollback is done).",
                Family::default(),
            ),
            exec_duration: reg(
                r,
                "dipam_delegate_exec_duration_seconds",
                "Time of one delegate exec, by delegate type and CNI command.",
                Family::new_with_constructor(Buckets),
            ),
            ledger_duration: reg(
                r,
                "dipam_ledger_op_duration_seconds",
                "Time of one ledger operation (commits include their sync).",
                Histogram::new(BUCKETS),
            ),
            stale_dels: reg(
                r,
                "dipam_stale_dels_total",
                "DELs older than the last ADD of their attachment, ignored.",
                Counter::default(),
            ),
            crossed_dels: reg(
                r,
                "dipam_crossed_dels_total",
                "DELs of a container held on another network only (a conflist swapped under \
                 running pods).",
                Counter::default(),
            ),
        }
    }
}

/// The warm pool: pod ADDs that met it, its level and target, its failed refills.
pub(super) struct PoolSeries {
    pub(super) requests: Family<L1, Counter>,
    pub(super) ready: Family<L2, Gauge>,
    pub(super) target: Family<L2, Gauge>,
    pub(super) in_use: Family<L2, Gauge>,
    pub(super) refills: Counter,
    pub(super) releases: Counter,
    pub(super) refill_failures: Counter,
}

impl PoolSeries {
    pub(super) fn register(r: &mut Registry) -> Self {
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
pub(super) struct GcSeries {
    pub(super) freed: Counter,
    pub(super) refused: Counter,
}

impl GcSeries {
    pub(super) fn observe(&self, event: &Event<'_>) {
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

    pub(super) fn register(r: &mut Registry) -> Self {
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
pub(super) struct TeardownSeries {
    pub(super) deleted: Counter,
    pub(super) failures: Counter,
}

impl TeardownSeries {
    pub(super) fn observe(&self, event: &Event<'_>) {
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

    pub(super) fn register(r: &mut Registry) -> Self {
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
pub(super) struct SpoolSeries {
    pub(super) depth: Gauge,
    pub(super) quarantined: Counter,
    pub(super) untrusted: Gauge,
    pub(super) mismatched: Gauge,
}

impl SpoolSeries {
    /// A spool event: its depth, a quarantined file, its trust, its mismatched files.
    pub(super) fn observe(&self, event: &Event<'_>) {
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

    pub(super) fn register(r: &mut Registry) -> Self {
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
pub(super) struct DivergenceSeries {
    pub(super) missing: Gauge,
    pub(super) orphans: Gauge,
    pub(super) unrecorded_alive: Gauge,
}

impl DivergenceSeries {
    pub(super) fn set(&self, missing: u64, orphans: u64, alive: u64) {
        self.missing.set(gauge_value(missing));
        self.orphans.set(gauge_value(orphans));
        self.unrecorded_alive.set(gauge_value(alive));
    }

    pub(super) fn register(r: &mut Registry) -> Self {
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
pub(super) struct RuntimeGcSeries {
    pub(super) passes: Counter,
    pub(super) freed: Counter,
    pub(super) kept_grace: Gauge,
    pub(super) refusals: Family<L1, Counter>,
    pub(super) refusing: Gauge,
}

impl RuntimeGcSeries {
    pub(super) fn register(r: &mut Registry) -> Self {
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
                for reason in crate::l3_clients::gc::runtime::REFUSALS {
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
pub(super) struct RangeSeries {
    pub(super) size: Family<L2, Count>,
    pub(super) addresses: Family<L3, Count>,
}

impl RangeSeries {
    pub(super) fn register(r: &mut Registry) -> Self {
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
