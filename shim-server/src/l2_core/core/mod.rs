//! The core: an attachment's life, from a validated request to a committed record and back
//! to a release. It owns the small state every attachment needs (the ledger, the delegate
//! executor, the per-key locks, the tombstones of recent DELs, the per-network address
//! index) and nothing optional: the warm pool, the agent, GC, the spool and the metrics are
//! its clients (node.rs holds them), and reach it through these functions. It knows the
//! agent's addresses only through [`AddressOwners`].
//!
//! - [`Core::prepare`]: a request, validated, for the caller passed in.
//! - [`attach::attach`]: the ADD flow, intent to commit, with its rollback.
//! - [`Core::release_recorded`]: a recorded attachment released through its delegate.
//! - [`Core::release`]: a committed attachment dipamd frees itself (GC, the pool, the agent):
//!   marked, released, forgotten.
//! - [`Core::forget`]: the one way an attachment leaves the ledger, the address index and the
//!   attachments gauge together.

pub mod attach;
pub mod births;
#[cfg(test)]
mod census_tests;
pub mod tombstones;

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, sync::Arc, time::Instant};

use dipam_proto::v1::{CniRequest, Mode};
use dipam_state::{AttachmentKey, AttachmentRecord, Ledger, Owner, StoreError};
use rscni_types::version::SpecVersion;

use crate::{
    l1_leaves::access::Caller,
    l1_leaves::error::ShimError,
    l1_leaves::keylock::KeyLocks,
    l1_leaves::validate,
    l2_core::delegate::{
        Executor, Gated, Invocation, Output, Probe,
        config::{DelegateConf, result_addrs},
        version,
    },
};

/// Static facts about this daemon, for status output.
#[derive(Debug, Clone)]
pub struct Identity {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub spool_dir: PathBuf,
}

/// Addresses held outside any pod (the agent's, agent/): a pod's or a warm-pool entry's
/// result must never take one. The agent implements it; the core asks through it, so that
/// it needs nothing else of the agent.
pub trait AddressOwners: Send + Sync {
    /// Who holds `ip`, if an owner of this kind does (its label).
    fn owner_of(&self, ip: &IpAddr) -> Option<String>;
    /// `rec` was committed: its addresses are indexed if they are this owner's.
    fn committed(&self, rec: &AttachmentRecord);
    /// A delegate result was refused for an address conflict (counted).
    fn conflict(&self);
    /// The owner's own addresses should be checked again now: a refused result showed the
    /// delegate may have lost one. Called once the refused allocation is rolled back, so
    /// that the address is free again for its owner to take back.
    fn recheck(&self);
}

pub struct Core {
    pub ledger: Ledger,
    pub exec: Executor,
    pub locks: KeyLocks,
    /// When each key's last runtime ADD finished, on the boot clock (births.rs): a GC never
    /// frees an attachment born after it began.
    pub births: births::Births,
    /// Which attachment holds each address of a network (addrs.rs): a delegate's duplicate
    /// is refused.
    pub addrs: crate::l2_core::addrs::AddrIndex,
    /// Where the core and its clients report what they do (events.rs): the executor's.
    pub events: crate::l1_leaves::events::Events,
    /// Protocol versions seen from plugins since start (bit n = version n, up to 63).
    pub plugin_protocols: std::sync::atomic::AtomicU64,
    /// Recent DELs by key (tombstones.rs): bounded in time and size; see `bury`. Root's
    /// DELs bind every caller's ADDs of the key.
    tombstones: std::sync::Mutex<tombstones::Tombstones<AttachmentKey>>,
    /// A non-root caller's recent DELs, by its uid and the key: they bind only that caller's
    /// ADDs, and kept apart, their churn never pushes root's tombstones out.
    their_tombstones: std::sync::Mutex<tombstones::Tombstones<(u32, AttachmentKey)>>,
    pub identity: Identity,
    /// The agent's addresses (agent/), which no pod may take.
    owners: Arc<dyn AddressOwners>,
}

/// A CNI request, validated and turned into what the delegate needs.
pub struct Prepared {
    /// Its `cni_path` is what the caller may use (`Executor::confine_cni_path`).
    pub req: CniRequest,
    /// Who sent it (root for dipamd's own requests).
    pub caller: Caller,
    pub dc: DelegateConf,
    pub key: AttachmentKey,
    /// When the plugin issued the request, on the boot clock (order.rs), read once from
    /// `req.issued_at`: the stale-ADD and stale-DEL checks and the record all use it.
    pub issued: Option<dipam_state::BootStamp>,
}

impl Prepared {
    /// Refuses `op` on `rec` unless this request's caller created it (root may act on
    /// every record): a non-root caller must not release, check or replay another pod's
    /// attachment (docs/cfp.md, "Threat model").
    pub fn authorize(&self, rec: &AttachmentRecord, op: &str) -> Result<(), ShimError> {
        if self.caller.owns(rec.creator_uid) {
            return Ok(());
        }
        tracing::warn!(uid = self.caller.uid, key = %rec.key, op, "refused: the attachment belongs to another caller");
        Err(ShimError::Forbidden {
            msg: format!(
                "uid {} may not {op} {}: another caller created it",
                self.caller.uid, rec.key
            ),
            details: "a non-root caller may CHECK and DEL only the attachments it added; \
                      nothing was changed"
                .into(),
        })
    }
}

pub use tombstones::{TOMBSTONE_MAX, TOMBSTONE_TTL};

impl Core {
    pub fn new(
        ledger: Ledger,
        exec: Executor,
        identity: Identity,
        owners: Arc<dyn AddressOwners>,
    ) -> Self {
        Self {
            events: exec.events.clone(),
            ledger,
            exec,
            locks: KeyLocks::default(),
            births: births::Births::default(),
            addrs: crate::l2_core::addrs::AddrIndex::default(),
            plugin_protocols: std::sync::atomic::AtomicU64::new(0),
            tombstones: std::sync::Mutex::default(),
            their_tombstones: std::sync::Mutex::default(),
            identity,
            owners,
        }
    }

    /// Runs a ledger operation on the blocking pool: commits wait for fdatasync, which must not
    /// stall a tokio worker that other requests share.
    pub async fn ledger<T, F>(&self, f: F) -> Result<T, ShimError>
    where
        T: Send + 'static,
        F: FnOnce(&Ledger) -> Result<T, StoreError> + Send + 'static,
    {
        let ledger = self.ledger.clone();
        let started = Instant::now();
        let out = tokio::task::spawn_blocking(move || f(&ledger))
            .await
            .map_err(|e| ShimError::Internal(format!("ledger task: {e}")))?
            .map_err(ShimError::from);
        self.observe_ledger(started);
        if out.is_err() {
            self.report_writable();
        }
        out
    }

    /// Ledger time (commits wait for fdatasync) is one of the parts of a request's latency
    /// that the logs alone cannot separate from lock waits and delegate execs.
    fn observe_ledger(&self, started: Instant) {
        self.events.emit(crate::l1_leaves::events::Event::LedgerOp {
            took: started.elapsed(),
        });
    }

    /// Reports one attachment of `rec`'s network and owner recorded (`1`) or forgotten (`-1`),
    /// for the attachments gauge.
    pub fn attachment_delta(&self, rec: &AttachmentRecord, delta: i64) {
        if !self.events.listened() {
            return;
        }
        self.events
            .emit(crate::l1_leaves::events::Event::AttachmentDelta {
                network: &rec.key.network,
                owner: &crate::l1_leaves::metric_labels::owner(&rec.owner),
                delta,
            });
    }

    /// Reports whether the ledger takes commits (the store's fault, a full disk).
    pub fn report_writable(&self) {
        if !self.events.listened() {
            return;
        }
        self.events
            .emit(crate::l1_leaves::events::Event::LedgerWritable(
                self.ledger.store().fault().is_none(),
            ));
    }

    /// `rec` was committed: its owner's index learns it (the agent's addresses).
    pub fn committed(&self, rec: &AttachmentRecord) {
        self.owners.committed(rec);
    }

    /// The record of `key`, read on the calling task. A point read is served from the store's
    /// cache and never waits for a disk sync, so it does not take [`Self::ledger`]'s trip to
    /// the blocking pool: on the ADD path that trip was two thread wake-ups before the
    /// delegate could start, and the woken worker could land on the CPU where the plugin was
    /// creating the pod's veth (0.1-0.5 ms, docs/performance.md run 8).
    pub fn lookup(&self, key: &AttachmentKey) -> Result<Option<AttachmentRecord>, ShimError> {
        let started = Instant::now();
        let out = self.ledger.get(key).map_err(ShimError::from);
        self.observe_ledger(started);
        out
    }

    /// Validates a request (defence in depth: these values become keys and exec arguments)
    /// and derives the delegate config. `attachment` verbs need the container ID and ifname.
    /// `caller` sent it (the service's peer check); dipamd's own requests (replays, refills,
    /// the agent's addresses) are [`Caller::ROOT`]'s. What it may do is decided here.
    pub fn prepare(
        &self,
        req: CniRequest,
        attachment: bool,
        caller: Caller,
    ) -> Result<Prepared, ShimError> {
        if req.protocol_version < 64 {
            self.plugin_protocols.fetch_or(
                1 << req.protocol_version,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        if req.protocol_version < dipam_proto::MIN_PROTOCOL_VERSION {
            return Err(ShimError::ProtocolTooOld {
                client: req.protocol_version,
                min: dipam_proto::MIN_PROTOCOL_VERSION,
            });
        }
        validate::request_sizes(&req)?;
        if attachment {
            validate::container_id(&req.container_id)?;
            validate::ifname(&req.ifname)?;
        }
        let mode = Mode::try_from(req.mode).unwrap_or(Mode::Unspecified);
        let mode = if mode == Mode::Unspecified {
            Mode::Ipam
        } else {
            mode
        };
        crate::l2_core::delegate::config::refuse_mixed_shape(&req.stdin, mode, &req.command)?;
        let dc = DelegateConf::from_request(&req.stdin, mode)?;
        self.exec.allow_kind(&dc.kind, caller)?;
        crate::l2_core::delegate::keys::refuse_ambiguous(&dc.conf, caller)?;
        self.exec.allow_store(&dc.conf, caller)?;
        let mut req = req;
        req.cni_path = self.exec.confine_cni_path(&req.cni_path, caller);
        let key = AttachmentKey::new(&dc.network, &req.container_id, &req.ifname);
        // Never later than now: a stamp from the future (a forged one, or a plugin whose boot
        // clock runs ahead in a time namespace) would make this request outrank every other
        // of its key for as long as it is ahead (order::clamp).
        let issued = crate::l1_leaves::order::from_wire(req.issued_at.as_ref())
            .map(crate::l1_leaves::order::clamp);
        Ok(Prepared {
            req,
            caller,
            dc,
            key,
            issued,
        })
    }

    /// Finds and probes the delegate, and picks the version to send it.
    pub async fn resolve(
        &self,
        dc: &DelegateConf,
        cni_path: &str,
    ) -> Result<(Probe, Option<SpecVersion>), ShimError> {
        let probe = self.exec.probe(&dc.kind, cni_path).await?;
        let send = version::choose(dc.version, &probe.supported);
        Ok((probe, send))
    }

    /// The version a delegate is effectively spoken to in.
    pub fn effective(dc: &DelegateConf, send: Option<SpecVersion>) -> SpecVersion {
        send.unwrap_or(dc.version)
    }

    /// Whether the delegate supports `floor` (e.g. CHECK needs 0.4.0). Unknown versions count
    /// as the config's own.
    pub fn delegate_allows(probe: &Probe, effective: SpecVersion, floor: SpecVersion) -> bool {
        if probe.supported.is_empty() {
            effective >= floor
        } else {
            probe.supported.iter().any(|v| *v >= floor)
        }
    }

    /// Runs `command` on the delegate for the attachment in `p`, with `stdin` as config.
    pub async fn run_delegate(
        &self,
        p: &Prepared,
        probe: &Probe,
        command: &str,
        stdin: Vec<u8>,
    ) -> Result<Output, ShimError> {
        self.run_delegate_gated(p, probe, command, stdin, std::future::ready(Ok(())), None)
            .await
            .into_result()
    }

    /// [`Self::run_delegate`] with the ledger write `gate` made durable while the delegate
    /// starts (delegate::exec::run_gated). [`Gated::GateFailed`]: the delegate did nothing.
    pub async fn run_delegate_gated(
        &self,
        p: &Prepared,
        probe: &Probe,
        command: &str,
        stdin: Vec<u8>,
        gate: impl std::future::Future<Output = Result<(), ShimError>>,
        peek: Option<crate::l2_core::delegate::exec::Peek>,
    ) -> Gated {
        let inv = Invocation {
            command: command.into(),
            container_id: p.req.container_id.clone(),
            netns: p.req.netns.clone(),
            ifname: p.req.ifname.clone(),
            args: p.req.cni_args.clone(),
            path: self.exec.delegate_cni_path(&p.req.cni_path),
            stdin,
            request_id: p.req.request_id.clone(),
            network: p.key.network.clone(),
            uid: p.caller.recorded_uid(),
            background: is_pool(&p.key),
        };
        self.exec
            .call_gated(&p.dc.kind, probe, &inv, gate, peek)
            .await
    }

    /// Remembers that `key` was deleted by `caller`'s DEL issued at `issued` (on the boot
    /// clock, never later than now: order::clamp; `None`: now), so that an older ADD arriving
    /// later cannot resurrect it. Tombstones live `TOMBSTONE_TTL` and at most `TOMBSTONE_MAX`
    /// are kept of each kind (the oldest go first): a plugin older than that has long been
    /// killed by its runtime's timeout.
    ///
    /// A non-root caller's DEL binds only that caller's ADDs. It can release only what that
    /// caller added (Prepared::authorize), and a DEL of a key it holds nothing under is a
    /// success that does nothing (CNI spec: DEL of what is not there succeeds): it speaks for
    /// no one else's attachment. When it bound every caller, an allowed uid's DEL of a key
    /// root was about to ADD, stamped an hour ahead, made root's ADD of that key fail with 3
    /// for the tombstone's ten minutes.
    pub fn bury(
        &self,
        key: &AttachmentKey,
        issued: Option<dipam_state::BootStamp>,
        caller: Caller,
    ) {
        let Some(issued) = issued.or_else(crate::l1_leaves::order::now) else {
            return;
        };
        if caller.is_root() {
            if let Ok(mut t) = self.tombstones.lock() {
                t.bury(key, issued, Instant::now());
            }
        } else if let Ok(mut t) = self.their_tombstones.lock() {
            t.bury(&(caller.uid, key.clone()), issued, Instant::now());
        }
    }

    /// The issue time of root's last DEL of `key`, if still remembered.
    pub fn tombstone(&self, key: &AttachmentKey) -> Option<dipam_state::BootStamp> {
        let t = self.tombstones.lock().ok()?;
        t.get(key, Instant::now())
    }

    /// The issue time of the last DEL of `key` that binds `caller`'s ADDs: root's, or the
    /// caller's own, whichever is later.
    fn tombstone_for(&self, key: &AttachmentKey, caller: Caller) -> Option<dipam_state::BootStamp> {
        let roots = self.tombstone(key);
        if caller.is_root() {
            return roots;
        }
        let own = self
            .their_tombstones
            .lock()
            .ok()?
            .get(&(caller.uid, key.clone()), Instant::now());
        match (roots, own) {
            (Some(r), Some(o)) => Some(
                if crate::l1_leaves::order::before(Some(&r), Some(&o)) == Some(true) {
                    o
                } else {
                    r
                },
            ),
            (r, o) => r.or(o),
        }
    }

    /// The stale-ADD rule (F4): an ADD issued before a DEL of the same attachment that dipamd
    /// already processed (a slow or retried plugin) must not bring the attachment back.
    /// Ordered on the boot clock (order.rs): the wall clock steps. [`attach::attach`] refuses
    /// such an ADD; the warm pool leaves it to that refusal.
    pub fn refuse_stale(&self, p: &Prepared) -> Result<(), ShimError> {
        if let Some(del_issued) = self.tombstone_for(&p.key, p.caller)
            && crate::l1_leaves::order::before(p.issued.as_ref(), Some(&del_issued)) == Some(true)
        {
            return Err(ShimError::StaleAdd {
                key: p.key.to_string(),
            });
        }
        Ok(())
    }

    /// Refuses a result whose addresses belong to someone else in the ledger. A pod's (or a
    /// warm-pool entry's) result is checked against the agent's addresses (an in-memory index:
    /// no ledger scan on the pod path); an agent's result against every other record.
    pub async fn check_conflict(&self, rec: &AttachmentRecord) -> Result<(), ShimError> {
        let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
        let holder = match &rec.owner {
            Owner::Pod | Owner::Pool => ips
                .iter()
                .find_map(|ip| self.owners.owner_of(ip).map(|h| (*ip, h))),
            Owner::Agent { .. } => {
                let key = rec.key.clone();
                let mine = ips.clone();
                // Streamed, keeping only the records that share an address: this read held
                // every record of the ledger (docs/performance.md, run 32).
                let others = self
                    .ledger(move |l| {
                        l.list_where(None, |o| {
                            o.key != key
                                && o.result.as_ref().is_some_and(|r| {
                                    result_addrs(r).iter().any(|ip| mine.contains(ip))
                                })
                        })
                    })
                    .await?;
                others.into_iter().find_map(|o| {
                    let theirs = o.result.as_ref().map(result_addrs).unwrap_or_default();
                    ips.iter()
                        .find(|ip| theirs.contains(ip))
                        .map(|ip| (*ip, format!("{} ({})", o.owner.label(), o.key)))
                })
            }
        };
        match holder {
            None => Ok(()),
            Some((ip, holder)) => {
                // The agent's own address may be what the delegate lost: the caller has the
                // owners re-check it (`recheck_owners`) once it has rolled this result back.
                // Woken here, before the rollback, the agent asked for its address while the
                // refused pod still held it and took another (seen in CI).
                self.owners.conflict();
                self.events.emit(crate::l1_leaves::events::Event::Conflict);
                tracing::error!(%ip, key = %rec.key, %holder, "address conflict: refusing the delegate's result");
                Err(ShimError::Conflict {
                    ip: ip.to_string(),
                    key: rec.key.to_string(),
                    holder,
                })
            }
        }
    }

    /// Has the address owners (the agent) check their own addresses again: after a result
    /// refused for a conflict is rolled back, or a pooled entry holding one is set aside.
    pub fn recheck_owners(&self) {
        self.owners.recheck();
    }

    /// Reads the whole ledger once, at start before serving, so that no request has to: the
    /// ledger's census (record counts, per-uid quotas, container IDs) and the address index
    /// are built from it, and both follow every change from here on. One pass that decodes
    /// one record at a time: the start once read the ledger twice and held every record
    /// decoded (1.4 s and 176 MiB at 10,000 attachments, docs/performance.md, run 29).
    /// Returns the attachments per (owner's metric label, network), for the metrics' gauge.
    pub async fn index_ledger(&self) -> Result<BTreeMap<(String, String), u64>, ShimError> {
        let (loaded, by) = self
            .ledger(|l| {
                let mut loaded = crate::l2_core::addrs::Loaded::default();
                let mut by: BTreeMap<(String, String), u64> = BTreeMap::new();
                l.index(|rec| {
                    loaded.add(rec);
                    let owner = crate::l1_leaves::metric_labels::owner(&rec.owner);
                    *by.entry((owner, rec.key.network.clone())).or_default() += 1;
                })?;
                Ok((loaded, by))
            })
            .await?;
        self.addrs.install(loaded);
        Ok(by)
    }

    /// Claims the addresses of `rec`'s result in the network's address index, or refuses
    /// them (156) when another attachment of the network holds one (addrs.rs says why).
    pub async fn claim_addresses(&self, rec: &AttachmentRecord) -> Result<(), ShimError> {
        let held = self
            .addrs
            .claim(&self.ledger, rec, |network| {
                self.ledger(move |l| l.list(Some(&network)))
            })
            .await?;
        let crate::l2_core::addrs::Claimed::Held(ip, holder) = held else {
            return Ok(());
        };
        self.owners.conflict();
        self.events.emit(crate::l1_leaves::events::Event::Conflict);
        let holder = format!("{} ({})", holder.owner.label(), holder.key);
        tracing::error!(%ip, key = %rec.key, %holder, "address conflict: the delegate handed out an address another attachment holds; refusing its result");
        Err(ShimError::Conflict {
            ip: ip.to_string(),
            key: rec.key.to_string(),
            holder,
        })
    }

    /// Records an attachment the delegate already holds but dipamd never saw (adoption of a
    /// running pod's reservation): its addresses are claimed in the address index, then it is
    /// committed. Returns the attachment that already holds one of its addresses instead,
    /// recording nothing. The caller holds the key's lock and saw no record under it.
    pub async fn import(&self, rec: &AttachmentRecord) -> Result<Option<String>, ShimError> {
        let held = self
            .addrs
            .claim(&self.ledger, rec, |network| {
                self.ledger(move |l| l.list(Some(&network)))
            })
            .await?;
        if let crate::l2_core::addrs::Claimed::Held(ip, holder) = held {
            return Ok(Some(format!(
                "{ip} is recorded for {} ({})",
                holder.owner.label(),
                holder.key
            )));
        }
        let put = rec.clone();
        if let Err(e) = self.ledger(move |l| l.put(&put)).await {
            self.addrs.forget(&rec.key, rec.result.as_ref());
            return Err(e);
        }
        self.attachment_delta(rec, 1);
        self.committed(rec);
        Ok(None)
    }

    /// Releases a committed attachment that dipamd itself decided to free (GC, the warm
    /// pool's surplus, an agent address no longer wanted) and forgets it. The record is
    /// marked `deleting` durably first, so that a crash while the delegate releases is
    /// finished by the next start (replay/interrupted.rs); if the delegate's DEL fails, the record
    /// stays, marked, for the next attempt. The caller holds the key's lock.
    pub async fn release(&self, rec: &AttachmentRecord) -> Result<(), ShimError> {
        if rec.state != dipam_state::AttachmentState::Deleting {
            let mut marked = rec.clone();
            marked.state = dipam_state::AttachmentState::Deleting;
            marked.updated_at = crate::l1_leaves::clock::now();
            self.ledger(move |l| l.put(&marked)).await?;
        }
        // Until the record is forgotten, an ADD handed one of its addresses waits (addrs.rs).
        let _releasing = self.addrs.releasing(rec);
        self.release_recorded(rec).await?;
        self.forget(rec).await
    }

    /// Forgets an attachment whose delegate holds nothing any more: its record leaves the
    /// ledger, its addresses leave the address index, and the attachments gauge moves. Every
    /// path that ends an attachment (DEL, rollback, replay, GC, the pool, the agent) ends
    /// here, so none can forget one part and keep another.
    pub async fn forget(&self, rec: &AttachmentRecord) -> Result<(), ShimError> {
        let key = rec.key.clone();
        self.ledger(move |l| l.remove(&key)).await?;
        self.attachment_delta(rec, -1);
        self.addrs.forget(&rec.key, rec.result.as_ref());
        Ok(())
    }

    /// [`Self::forget`] for many attachments, with one ledger commit as durable as
    /// `durability` says: GC forgets what its parallel releases freed in batches.
    pub async fn forget_all(
        &self,
        recs: &[AttachmentRecord],
        durability: dipam_state::Durability,
    ) -> Result<(), ShimError> {
        if recs.is_empty() {
            return Ok(());
        }
        let keys: Vec<AttachmentKey> = recs.iter().map(|r| r.key.clone()).collect();
        self.ledger(move |l| l.remove_all(&keys, durability))
            .await?;
        for rec in recs {
            self.attachment_delta(rec, -1);
            self.addrs.forget(&rec.key, rec.result.as_ref());
        }
        Ok(())
    }

    /// Releases a recorded attachment with the config and environment recorded at ADD:
    /// rollback, crash recovery, and cleanup of interrupted operations all go through here.
    /// The delegate is called under the key it knows the attachment by (a pod served from the
    /// warm pool: the pool entry's container ID, ifname, netns and args).
    pub async fn release_recorded(&self, rec: &AttachmentRecord) -> Result<(), ShimError> {
        let probe = self.exec.probe(&rec.delegate_type, &rec.cni_path).await?;
        let mut conf: serde_json::Value = serde_json::from_str(&rec.delegate_config)
            .map_err(|e| ShimError::Internal(format!("recorded config of {}: {e}", rec.key)))?;
        let mut dc = DelegateConf {
            kind: rec.delegate_type.clone(),
            network: rec.key.network.clone(),
            version: rec.delegate_version.parse().unwrap_or(SpecVersion::CURRENT),
            conf: conf.take(),
        };
        let complete = dc.inject_for_del(rec.result.as_ref());
        let (container_id, ifname) = rec.delegate_ids();
        let (netns, args) = rec.delegate_env();
        let inv = Invocation {
            command: "DEL".into(),
            container_id: container_id.to_owned(),
            netns: netns.to_owned(),
            ifname: ifname.to_owned(),
            args: args.to_owned(),
            path: self.exec.delegate_cni_path(&rec.cni_path),
            stdin: dc.bytes_for(None)?,
            request_id: rec.request_id.clone(),
            network: rec.key.network.clone(),
            uid: rec.creator_uid,
            // A pool entry's release; a pod served from the pool is released at its own
            // (the pod's) priority: its key is the pod's.
            background: is_pool(&rec.key),
        };
        match self.exec.call(&rec.delegate_type, &probe, &inv).await {
            Ok(_) => Ok(()),
            // An interrupted ADD that never produced a result, for a delegate that cannot
            // release without one (azure-vnet-ipam needs the pool): retrying can never
            // succeed, and keeping the record would fail this key's DEL forever. Say so and
            // let it go; the delegate's own reconcile owns what it may hold.
            Err(e) if !complete => {
                tracing::warn!(key = %rec.key, delegate = %rec.delegate_type, error = %e, "cannot release an interrupted ADD without its result; dropping the record");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether `key` is a warm-pool entry's: its delegate execs run in the background
/// (delegate::exec::BACKGROUND_NICE).
fn is_pool(key: &AttachmentKey) -> bool {
    crate::l1_leaves::keys::internal(&key.container_id)
        == Some(crate::l1_leaves::keys::Internal::Pool)
}
