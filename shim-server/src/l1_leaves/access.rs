//! Who may talk to dipamd, and how much. The socket is root-only (0600) by default, or 0660
//! for one group (--socket-group); on top of the file mode, every request's peer credentials
//! (SO_PEERCRED, taken by the kernel at connect) must be root or an allowed uid: a DEL from
//! any local process would otherwise free a pod's address (aws-vpc-cni#3739, F20).
//!
//! An allowed uid is not root (docs/cfp.md, "Threat model"): dipamd runs as root and execs
//! delegates, so a non-root caller's requests are confined. Its `CNI_PATH` is ignored for the
//! exec (only dipamd's own `--cni-path` directories are searched), only the delegate types in
//! `--non-root-delegate` run for it, it may CHECK and DEL only the attachments it created
//! (the ledger records the creator's uid), it lists only those, and it may not send GC. The
//! Admin and Agent services answer root and `--admin-uid` only.
//!
//! Load: at most --max-concurrent operations run at once, of which some are held for DEL (a
//! burst of ADDs cannot starve cleanup); at most --max-queue ADDs wait, and, in a queue of
//! their own, at most --max-queue DELs (with CHECK and GC), each at most a few seconds. Beyond
//! that dipamd answers RESOURCE_EXHAUSTED at once (the plugin's code 11, "try again later")
//! instead of queueing forever; memory stays bounded under any burst. The reserve covers the
//! queue too: with ADDs hanging on a slow delegate and their queue full, every DEL was once
//! refused at once with 11, because both shared one queue; now ADDs can never fill the
//! releases' queue.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Status, transport::server::UdsConnectInfo};

use crate::l1_leaves::error::ShimError;

/// The largest request dipamd decodes: a CNI GC's config of up to 16 MiB (its valid list
/// names every attachment of the node, about 100 bytes each: containerd's list for 5,300
/// pods passed the 1 MiB every other config is held to) plus the CNI_* values within their
/// limits (validate.rs). Bounds what one request can make dipamd hold; a larger one is
/// refused by tonic before any handler runs, and that refusal leaves dipamd as
/// RESOURCE_EXHAUSTED (server/mod.rs). Only root may GC: a non-root caller's requests are held
/// to [`NON_ROOT_REQUEST_BYTES`] before they are read (server/bodies.rs).
pub const MAX_REQUEST_BYTES: usize = 17 << 20;

/// The largest request of a non-root caller: a 1 MiB config and its CNI_* values.
pub const NON_ROOT_REQUEST_BYTES: usize = 2 << 20;

/// Who sent a request, from the kernel's peer credentials (never from the request itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    /// Root, or a uid given with --admin-uid: may use the Admin and Agent services.
    pub admin: bool,
}

impl Caller {
    /// dipamd's own operations (start-up replay, spool, agent, warm pool) and root peers.
    pub const ROOT: Caller = Caller {
        uid: 0,
        admin: true,
    };
    /// A request whose peer is not known: treated as the least trusted caller there is.
    pub const UNKNOWN: Caller = Caller {
        uid: u32::MAX,
        admin: false,
    };

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The caller the peer check attached to `req` (UNKNOWN when none did: fail closed).
    pub fn of<T>(req: &Request<T>) -> Caller {
        req.extensions()
            .get::<Caller>()
            .copied()
            .unwrap_or(Caller::UNKNOWN)
    }

    /// The creator uid to record: none for root, so that records written before the field
    /// existed (all by root) and root's records read the same.
    pub fn recorded_uid(&self) -> Option<u32> {
        (!self.is_root()).then_some(self.uid)
    }

    /// Whether this caller may act on a record created by `creator` (None: root).
    pub fn owns(&self, creator: Option<u32>) -> bool {
        self.is_root() || creator == Some(self.uid)
    }

    /// Refuses this caller's ADD of `key` under a container ID that another caller's
    /// attachment uses, in any network (`census`: the ledger's census, which indexes records
    /// by container ID). Delegates release by container ID (host-local frees every
    /// reservation of that ID and ifname in its directory, azure-vnet-ipam keys by the ID
    /// alone), and the caller chooses the delegate's config: its own attachment under a root
    /// pod's ID, DELed with a config pointing at that pod's store, would free the pod's
    /// address. Container IDs are not secret (`ps` shows them), so this is checked, not
    /// assumed.
    pub fn refuse_foreign_container_id(
        &self,
        container_id: &str,
        key: &dipam_state::AttachmentKey,
        census: &dipam_state::CensusCounts,
    ) -> Result<(), ShimError> {
        let mut others = census.using_container_id(container_id);
        match others.find(|(_, creator)| !self.owns(*creator)) {
            None => Ok(()),
            Some((other, _)) => {
                tracing::warn!(uid = self.uid, %key, %other, "refused: container ID in use by another caller");
                Err(ShimError::Forbidden {
                    msg: format!(
                        "uid {} may not ADD under container ID {}: another caller's attachment \
                         uses it",
                        self.uid,
                        crate::l1_leaves::validate::shown(container_id)
                    ),
                    details: "a non-root caller's container IDs must not be another caller's; \
                              nothing was allocated"
                        .into(),
                })
            }
        }
    }

    /// Refuses the Admin and Agent services to callers that are neither root nor
    /// --admin-uid: they expose and change every attachment and the agent's addresses.
    pub fn require_admin(&self, what: &str) -> Result<(), Status> {
        if self.admin {
            return Ok(());
        }
        tracing::warn!(
            uid = self.uid,
            what,
            "request refused: not root and not in --admin-uid"
        );
        Err(Status::permission_denied(format!(
            "uid {} may not use {what} (root only, or dipamd --admin-uid)",
            self.uid
        )))
    }
}

/// The pid of the process that opened the connection (SO_PEERCRED): the plugin, for a CNI
/// request. GC reads when it was started (core/births.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerPid(pub u32);

impl PeerPid {
    pub fn of<T>(req: &Request<T>) -> Option<u32> {
        req.extensions().get::<PeerPid>().map(|p| p.0)
    }
}

/// Peer credential check, as a tonic interceptor. It attaches the [`Caller`] to the request.
#[derive(Debug, Clone, Default)]
pub struct PeerCheck {
    /// uids allowed besides root.
    pub allow_uids: Vec<u32>,
    /// uids allowed the Admin and Agent services besides root (and the socket as well).
    pub admin_uids: Vec<u32>,
}

impl crate::l1_leaves::listen::Admit for PeerCheck {
    fn allows(&self, uid: u32) -> bool {
        uid == 0 || self.allow_uids.contains(&uid) || self.admin_uids.contains(&uid)
    }
}

impl PeerCheck {
    pub fn check(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let cred = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred);
        match cred {
            Some(c)
                if c.uid() == 0
                    || self.allow_uids.contains(&c.uid())
                    || self.admin_uids.contains(&c.uid()) =>
            {
                let uid = c.uid();
                req.extensions_mut().insert(Caller {
                    uid,
                    admin: uid == 0 || self.admin_uids.contains(&uid),
                });
                if let Some(pid) = c.pid().and_then(|p| u32::try_from(p).ok()) {
                    req.extensions_mut().insert(PeerPid(pid));
                }
                Ok(req)
            }
            other => {
                let who = other.map_or_else(
                    || "unknown peer".to_owned(),
                    |c| format!("uid {} gid {} pid {:?}", c.uid(), c.gid(), c.pid()),
                );
                tracing::warn!(peer = %who, "request refused: not root and not in --allow-uid");
                Err(Status::permission_denied(format!(
                    "{who} may not use dipamd (root only, or --allow-uid / --admin-uid)"
                )))
            }
        }
    }
}

/// What an operation needs from the admission control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Takes addresses: may wait behind releases.
    Add = 0,
    /// Releases, checks and everything else: never starved by ADDs, in the slots or in the
    /// queue.
    Other = 1,
}

/// Bounded concurrency with a reserve for releases.
#[derive(Debug)]
pub struct Admission {
    total: std::sync::Arc<Semaphore>,
    adds: std::sync::Arc<Semaphore>,
    /// Requests waiting for a slot, by class (`Class as usize`): each class has its own
    /// queue of `max_queue`.
    waiting: [AtomicUsize; 2],
    max_queue: usize,
    max_wait: Duration,
    /// What one non-root uid may take (quota.rs).
    pub quotas: crate::l1_leaves::quota::Quotas,
}

/// Held for the duration of one operation.
pub struct Admitted {
    _total: OwnedSemaphorePermit,
    _add: Option<OwnedSemaphorePermit>,
    // Dropped last: the uid's slot and in-flight count outlive the global slot.
    _uid: Option<(
        crate::l1_leaves::quota::InFlight,
        crate::l1_leaves::quota::UidSlot,
    )>,
}

impl Admission {
    /// `max` concurrent operations, a quarter of them (at least one) reserved for non-ADDs.
    pub fn new(max: usize, max_queue: usize, max_wait: Duration) -> Self {
        Self::with_quotas(
            max,
            max_queue,
            max_wait,
            crate::l1_leaves::quota::Limits::default(),
        )
    }

    /// [`Admission::new`] with the per-uid quotas of non-root callers.
    pub fn with_quotas(
        max: usize,
        max_queue: usize,
        max_wait: Duration,
        limits: crate::l1_leaves::quota::Limits,
    ) -> Self {
        let max = max.max(2);
        let reserve = (max / 4).max(1);
        Self {
            total: std::sync::Arc::new(Semaphore::new(max)),
            adds: std::sync::Arc::new(Semaphore::new(max - reserve)),
            waiting: [AtomicUsize::new(0), AtomicUsize::new(0)],
            max_queue,
            max_wait,
            quotas: crate::l1_leaves::quota::Quotas::new(limits, max - reserve),
        }
    }

    /// Admits one operation of `caller`. A non-root caller first passes its own quotas (its
    /// operations in flight, then one of its slots; quota.rs), and takes an ADD slot whatever
    /// its verb: the slots reserved for releases are root's, so a non-root caller's stuck
    /// DELs can never hold up root's.
    pub async fn admit_for(&self, class: Class, caller: Caller) -> Result<Admitted, ShimError> {
        if caller.is_root() {
            return self.admit(class).await;
        }
        let in_flight = self.quotas.enter(caller.uid)?;
        let slot = self.quotas.slot(caller.uid, self.max_wait).await?;
        let mut admitted = self.admit(Class::Add).await?;
        admitted._uid = Some((in_flight, slot));
        Ok(admitted)
    }

    pub async fn admit(&self, class: Class) -> Result<Admitted, ShimError> {
        let busy = |why: &str| ShimError::Busy(why.to_owned());
        let waiting = &self.waiting[class as usize];
        if waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy(match class {
                Class::Add => "the ADD queue is full",
                Class::Other => "the DEL/CHECK/GC queue is full",
            }));
        }
        let acquired = tokio::time::timeout(self.max_wait, async {
            let add = match class {
                Class::Add => Some(self.adds.clone().acquire_owned().await),
                Class::Other => None,
            };
            let total = self.total.clone().acquire_owned().await;
            (add, total)
        })
        .await;
        waiting.fetch_sub(1, Ordering::SeqCst);
        match acquired {
            Ok((add, Ok(total))) => Ok(Admitted {
                _total: total,
                _add: add.and_then(Result::ok),
                _uid: None,
            }),
            Ok(_) => Err(busy("shutting down")),
            Err(_) => Err(busy("no slot within the queueing limit")),
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(16, 256, Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dels_get_through_while_adds_are_saturated_and_overload_is_prompt() {
        let a = Admission::new(4, 3, Duration::from_millis(200));
        // 3 ADD slots (one of 4 reserved).
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(a.admit(Class::Add).await.unwrap());
        }
        // A 4th ADD waits, then gives up promptly.
        let started = std::time::Instant::now();
        assert!(matches!(a.admit(Class::Add).await, Err(ShimError::Busy(_))));
        assert!(started.elapsed() < Duration::from_secs(2));
        // A DEL still runs.
        let del = tokio::time::timeout(Duration::from_millis(100), a.admit(Class::Other)).await;
        assert!(matches!(del, Ok(Ok(_))));
    }

    /// ADDs waiting behind slow ones fill their own queue, never the releases': every DEL
    /// still queues and runs.
    #[tokio::test]
    async fn a_full_add_queue_does_not_refuse_dels() {
        let a = std::sync::Arc::new(Admission::new(4, 2, Duration::from_secs(30)));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(a.admit(Class::Add).await.unwrap());
        }
        let queued: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.admit(Class::Add).await.map(|_| ()) })
            })
            .collect();
        while a.waiting[Class::Add as usize].load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert!(matches!(a.admit(Class::Add).await, Err(ShimError::Busy(_))));
        // The reserved slot and the releases' own queue: two DELs wait while one runs.
        let dels: Vec<_> = (0..3)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move {
                    let slot = a.admit(Class::Other).await;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    slot.map(|_| ())
                })
            })
            .collect();
        for d in dels {
            assert!(d.await.unwrap().is_ok());
        }
        for q in queued {
            q.abort();
        }
    }

    /// A non-root caller holds at most its slots, never the reserve for releases, and its
    /// operations beyond --non-root-max-in-flight are refused at once: root keeps its room.
    #[tokio::test]
    async fn a_non_root_caller_never_takes_roots_room() {
        let limits = crate::l1_leaves::quota::Limits {
            slots: 2,
            in_flight: 3,
            ..crate::l1_leaves::quota::Limits::default()
        };
        let a = std::sync::Arc::new(Admission::with_quotas(
            8,
            16,
            Duration::from_secs(1),
            limits,
        ));
        let nobody = Caller {
            uid: 65534,
            admin: false,
        };
        let _d = a.admit_for(Class::Other, nobody).await.unwrap();
        let _e = a.admit_for(Class::Add, nobody).await.unwrap();
        // A third waits for one of its slots; a fourth meanwhile is over its in-flight.
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.admit_for(Class::Add, nobody).await.map(|_| ()) }
        });
        while a.quotas.enter(nobody.uid).is_ok() {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            a.admit_for(Class::Add, nobody).await,
            Err(ShimError::Forbidden { .. })
        ));
        assert!(matches!(waiting.await.unwrap(), Err(ShimError::Busy(_))));
        // Root: the 4 ADD slots nobody left, and the 2 held for releases.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(a.admit_for(Class::Add, Caller::ROOT).await.unwrap());
        }
        for _ in 0..2 {
            held.push(a.admit_for(Class::Other, Caller::ROOT).await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        let a = std::sync::Arc::new(Admission::new(2, 2, Duration::from_secs(30)));
        let _x = a.admit(Class::Other).await.unwrap();
        let _y = a.admit(Class::Other).await.unwrap();
        let w1 = tokio::spawn({
            let a = a.clone();
            async move { a.admit(Class::Other).await.map(|_| ()) }
        });
        let w2 = tokio::spawn({
            let a = a.clone();
            async move { a.admit(Class::Other).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        assert!(matches!(
            a.admit(Class::Other).await,
            Err(ShimError::Busy(_))
        ));
        assert!(started.elapsed() < Duration::from_millis(50));
        w1.abort();
        w2.abort();
    }
}
