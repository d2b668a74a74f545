//! What dipamd's parts report as they work, for whoever listens: the metrics registry and the
//! explain history are observers, and nothing that emits an event knows of them.
//!
//! The core (ledger, executor, key locks) and its clients (warm pool, agent addresses, GC,
//! spool, teardown) hold an [`Events`] handle and call [`Events::emit`]. Observers turn the
//! events into counters, gauges and history entries; a scrape or an `explain` then reads
//! those, never the ledger or another part's state.

use std::{sync::Arc, time::Duration};

use serde_json::Value;

/// One warm pool's level: (network, config digest, ready, target, in use).
pub type PoolLevel<'a> = (&'a str, &'a str, u64, u64, u64);

/// One thing that happened. Borrowed: emitting costs no allocation for an observer that
/// ignores the event.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A CNI call answered (service.rs): its verb, its outcome (`0`, a CNI code, or
    /// `grpc:CODE`), how long it took, and the history entry that describes it.
    Request {
        op: &'static str,
        code: &'a str,
        took: Duration,
        container_id: &'a str,
        record: &'a Value,
    },
    /// A CNI call began (`+1`) or ended, answered or abandoned (`-1`): service.rs. What a
    /// killed plugin's ADD still does (its delegate, its rollback) counts until it is done.
    InFlight { op: &'static str, delta: i64 },
    /// A delegate exec finished (delegate/), with its history entry.
    Exec {
        delegate: &'a str,
        command: &'a str,
        took: Duration,
        container_id: &'a str,
        record: &'a Value,
    },
    /// A ledger operation finished (commits include their fsync).
    LedgerOp { took: Duration },
    /// Whether the ledger takes commits (a full disk makes them fail until space returns).
    LedgerWritable(bool),
    /// The attachments of one network and owner now number `count` (set at start, after a
    /// replay or reconcile).
    Attachments {
        network: &'a str,
        owner: &'a str,
        count: u64,
    },
    /// One attachment of `network` and `owner` was recorded (`+1`) or forgotten (`-1`).
    AttachmentDelta {
        network: &'a str,
        owner: &'a str,
        delta: i64,
    },
    /// A DEL older than the last ADD of its key, ignored (F4).
    StaleDel,
    /// A DEL of a container dipamd holds on another network only (crossed.rs).
    CrossedDel,
    /// An operation interrupted by a crash, released at start.
    IntentReplayed,
    /// GC freed attachments.
    GcFreed(u64),
    /// A GC run refused by an interlock.
    GcRefused,
    /// A delegate result refused because another attachment holds one of its addresses.
    Conflict,
    /// An agent address the delegate had lost, taken again.
    AgentReestablished,
    /// Agent addresses by state, whole (every state the agent knows, with its count).
    AgentAddresses(&'a [(&'a str, u64)]),
    /// A pod ADD met the warm pool: `hit`, `miss` or `bypass`.
    PoolRequest { outcome: &'static str },
    /// A warm-pool refill failed (retried with backoff).
    PoolRefillFailed,
    /// A warm-pool entry was made.
    PoolRefilled,
    /// A warm-pool entry was released.
    PoolReleased,
    /// The warm pool of one network and config digest: ready entries and the refill target.
    PoolLevel {
        network: &'a str,
        digest: &'a str,
        ready: u64,
        target: u64,
    },
    /// Every warm pool, whole. A pool absent from the list has gone (its entries released,
    /// its template replaced).
    PoolLevels(&'a [PoolLevel<'a>]),
    /// Retired pod veths deleted by dipamd.
    TeardownDeleted(u64),
    /// A retired veth (or a link listing) dipamd failed to delete.
    TeardownFailed,
    /// An operation failed for lack of a privilege (EPERM, EACCES).
    PrivilegeDenied,
    /// Spooled DELs waiting to be replayed.
    SpoolDepth(u64),
    /// A spooled DEL moved to failed/.
    SpoolQuarantined,
    /// Whether the spool directory fails the spool rule (nothing in it is replayed).
    SpoolUntrusted(bool),
    /// Networks whose config names a spoolDir other than dipamd's spool.
    SpoolMismatched(u64),
    /// The last reconcile's findings: recorded addresses missing from the delegate's store,
    /// reservations the ledger does not know that nothing uses (orphans), and those a running
    /// pod uses or that could not be told unused (alive: adopted or kept, never freed).
    Divergence {
        missing: u64,
        orphans: u64,
        alive: u64,
    },
    /// Every network's range, whole, per family, as the last look at the ledger and the
    /// delegate's store found it (divergence/: each reconcile, and each `dipamctl status`).
    /// A network or family absent from the list has gone.
    Ranges(&'a [RangeCount]),
    /// A history event dropped because its writer fell behind.
    HistoryDropped,
    /// A pass of the runtime-aware GC (gc/runtime/): what it freed, how many attachments the
    /// runtime no longer lists it kept as younger than --gc-grace, and, when it refused to
    /// free anything, why (`unreachable`, `error`, `empty`, `share`).
    RuntimeGcPass {
        freed: u64,
        kept_grace: u64,
        refusing: Option<&'a str>,
    },
    /// dipamd freed a pod's attachment, with the history entry that says who freed it and
    /// why: `dipamctl explain` shows it beside the pod's own requests (history.rs).
    Freed {
        by: FreedBy,
        container_id: &'a str,
        record: &'a Value,
    },
}

/// A CNI call in flight ([`Events::in_flight`]); its drop ends it.
pub struct InFlight {
    events: Events,
    op: &'static str,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.events.emit(Event::InFlight {
            op: self.op,
            delta: -1,
        });
    }
}

/// Who freed an attachment: the `by` of its history entry. Every way an address leaves a pod
/// has one, so that `dipamctl explain <ip>` can say of each earlier holder what ended its
/// holding, instead of leaving the operator to guess from the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreedBy {
    /// The runtime's DEL: live, spooled while dipamd was down and replayed, or interrupted
    /// by a crash and finished at the next start.
    Del,
    /// A CNI GC the runtime sent (rpc/gc.rs).
    CniGc,
    /// The runtime-aware GC (--cri-endpoint): the runtime listed no sandbox for it in two
    /// passes (gc/runtime/).
    RuntimeGc,
    /// An operator: `dipamctl gc` (by a list, `--use-ledger`, or `--from-runtime`).
    Operator,
    /// The reconcile (--reconcile-free): a reservation no record knows and nothing uses.
    Reconcile,
    /// The reboot rule at start: recorded in an earlier boot (replay/reboot/mod.rs).
    Reboot,
    /// Two looks at the node found the pod dead (gc/evidence/mod.rs).
    Evidence,
    /// The delegate handed its address to another pod and a look proved it dead
    /// (gc/evidence/mod.rs).
    Conflict,
}

impl FreedBy {
    /// The name the history and `explain` show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Del => "del",
            Self::CniGc => "cni-gc",
            Self::RuntimeGc => "runtime-gc",
            Self::Operator => "operator",
            Self::Reconcile => "reconcile",
            Self::Reboot => "reboot",
            Self::Evidence => "evidence",
            Self::Conflict => "conflict",
        }
    }

    /// Whether `dipam_gc_freed_total` counts it at its [`Event::Freed`]: the dead pods'
    /// frees. A GC's are counted as it frees them ([`Event::GcFreed`]), and a DEL is no GC.
    pub fn counted_at_freed(self) -> bool {
        matches!(self, Self::Reboot | Self::Evidence | Self::Conflict)
    }
}

/// An attachment leaving a container, as its history entry says it: which one, and why.
#[derive(Debug, Clone)]
pub struct Freeing<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// Its addresses, as CIDRs (`explain <ip>` matches its earlier holders by them).
    pub ips: Vec<String>,
    pub reason: &'a str,
    /// The request that recorded it (or, for a DEL, the DEL's own).
    pub request_id: &'a str,
    /// The non-root uid that made it, if one did: the history bounds each uid's share
    /// (history.rs), and a freeing counts toward its maker's.
    pub uid: Option<u32>,
}

impl<'a> Freeing<'a> {
    /// `rec` freed for `reason`.
    pub fn of(rec: &'a dipam_state::AttachmentRecord, reason: &'a str) -> Self {
        Self {
            network: &rec.key.network,
            container_id: &rec.key.container_id,
            ifname: &rec.key.ifname,
            // The CNI result's addresses, as result_ips reads them (delegate/config.rs, a
            // layer this one may not use).
            ips: rec
                .result
                .as_ref()
                .and_then(|r| r.get("ips"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|ip| ip.get("address")?.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            reason,
            request_id: &rec.request_id,
            uid: rec.creator_uid,
        }
    }
}

impl std::fmt::Display for FreedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One network's addresses of one family: how many the delegate hands out, and who holds
/// them. What is not known is `None`, never a guess: a delegate whose ranges or store dipamd
/// cannot read (azure-vnet-ipam) has no size, no orphans and no free count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeCount {
    pub network: String,
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// The addresses the delegate hands out in this family (host-local: its ranges less the
    /// gateway, delegate/ranges.rs), at most u64::MAX.
    pub size: Option<u64>,
    /// Addresses held for pods, for the agent, and by the warm pool: reservations in the
    /// delegate's store that a ledger record accounts for (or, where the store cannot be
    /// read, the addresses the ledger records).
    pub pods: u64,
    pub agent: u64,
    pub pool: u64,
    /// Reservations in the delegate's store that no ledger record accounts for.
    pub orphans: Option<u64>,
    /// `size` less every reservation inside the ranges.
    pub free: Option<u64>,
    /// The ranges, as people write them (`10.1.0.2-10.1.0.254`).
    pub ranges: Vec<String>,
    /// Why `size` is unknown, when it is.
    pub unknown: String,
}

impl RangeCount {
    /// Addresses held in the delegate's store: pods, agent, pool and orphans.
    pub fn allocated(&self) -> u64 {
        self.pods + self.agent + self.pool + self.orphans.unwrap_or(0)
    }
}

/// Something that listens to [`Event`]s. Called on the emitter's task: it must not block.
pub trait Observer: Send + Sync {
    fn observe(&self, event: &Event<'_>);

    /// Whether this observer reads the events that cost work to build (censuses, levels,
    /// per-attachment deltas); one that only records requests and execs (the history) says
    /// no, so that they stay unbuilt when it is the only one.
    fn wants_reports(&self) -> bool {
        true
    }
}

/// Where a part sends its events: every observer, in order. Cheap to clone; the default has
/// no observer (unit tests, `dipamctl recover`).
#[derive(Clone, Default)]
pub struct Events {
    observers: Arc<[Arc<dyn Observer>]>,
    /// Whether any observer [`Observer::wants_reports`].
    reports: bool,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Events({} observer(s))", self.observers.len())
    }
}

impl Events {
    pub fn new(observers: Vec<Arc<dyn Observer>>) -> Self {
        Self {
            reports: observers.iter().any(|o| o.wants_reports()),
            observers: observers.into(),
        }
    }

    /// Whether anyone listens: an event that costs work to build (a census, a pool's levels)
    /// is skipped when nobody would read it.
    pub fn listened(&self) -> bool {
        self.reports
    }

    pub fn emit(&self, event: Event<'_>) {
        for o in self.observers.iter() {
            o.observe(&event);
        }
    }

    /// Counts a CNI call of `op` in flight until the handle is dropped: when the call ends,
    /// answered or abandoned (a future dropped with its plugin's connection still ends it).
    pub fn in_flight(&self, op: &'static str) -> InFlight {
        self.emit(Event::InFlight { op, delta: 1 });
        InFlight {
            events: self.clone(),
            op,
        }
    }

    /// Who freed an attachment and why, for its container's history (`kind: freed`):
    /// `explain` shows it among the requests, and `explain <ip>` says of each earlier holder
    /// of the address what ended its holding.
    pub fn freed(&self, by: FreedBy, f: &Freeing<'_>) {
        let mut body = serde_json::json!({
            "kind": "freed",
            "by": by.as_str(),
            "network": f.network,
            "ifname": f.ifname,
            "ips": f.ips,
            "reason": f.reason,
            "requestId": f.request_id,
        });
        if let Some(uid) = f.uid {
            body["uid"] = uid.into();
        }
        self.emit(Event::Freed {
            by,
            container_id: f.container_id,
            record: &body,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl Observer for Seen {
        fn observe(&self, event: &Event<'_>) {
            if let Ok(mut s) = self.0.lock() {
                s.push(format!("{event:?}"));
            }
        }
    }

    #[test]
    fn every_observer_sees_every_event_in_order() {
        let (a, b) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
        let events = Events::new(vec![a.clone(), b.clone()]);
        events.emit(Event::StaleDel);
        events.emit(Event::GcFreed(3));
        for seen in [a, b] {
            let got = seen.0.lock().map(|s| s.clone()).unwrap_or_default();
            assert_eq!(got, vec!["StaleDel".to_owned(), "GcFreed(3)".to_owned()]);
        }
        // No observer: emitting is a no-op, not an error.
        Events::default().emit(Event::Conflict);
    }
}
