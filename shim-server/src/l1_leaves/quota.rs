//! Per-caller quotas: how much of dipamd one non-root uid (--allow-uid, --admin-uid) may
//! take, so that root's pods always have room (docs/cfp.md §8.3, "an allowed uid's
//! quotas"). Root is never limited here; dipamd's global bounds (access.rs) apply to all.
//!
//! - **In flight**: operations a uid has running or waiting at once (--non-root-max-in-flight).
//!   30 ADDs stuck on a held host-local lock once took every admission slot, and a root ADD
//!   got code 11 after 10 s.
//! - **Slots**: operations a uid runs at once (--non-root-max-slots), and all non-root uids
//!   together at most half of the ADD slots. A non-root operation never uses the slots kept
//!   for root's releases.
//! - **Records and bytes**: the ledger records a uid's attachments may hold
//!   (--non-root-max-records) and their size (--non-root-max-bytes), counted from the ledger's
//!   census (so the counts survive a restart, and no ADD reads every record) plus the ADDs
//!   still in flight. 186 ADDs with
//!   0.95 MB configs once grew the state directory to 953 MiB, and the commit journal's cap
//!   then refused commits for everyone: 10 of 57 root ADDs failed with 150.
//!
//! A refusal is code 155 with the uid, the count and the flag to raise; nothing was changed.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use dipam_state::{AttachmentKey, CensusCounts};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::l1_leaves::error::ShimError;

/// The per-uid limits (dipamd's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Ledger records one uid's attachments may hold.
    pub records: usize,
    /// Bytes those records may take (as encoded, plus the ADDs in flight).
    pub bytes: u64,
    /// Operations running or waiting at once.
    pub in_flight: usize,
    /// Operations running at once.
    pub slots: usize,
}

impl Default for Limits {
    /// Room for a rootless runtime's containers (a record is about 1-2 KiB), and far below
    /// the commit journal's 4 MiB cap: one caller's records can never make the ledger refuse
    /// commits for everyone.
    fn default() -> Self {
        Self {
            records: 256,
            bytes: 1 << 20,
            in_flight: 16,
            slots: 4,
        }
    }
}

/// One uid's live counts.
#[derive(Debug)]
struct Uid {
    in_flight: AtomicUsize,
    slots: Arc<Semaphore>,
    adds: Mutex<Adds>,
}

/// The uid's ADDs past the quota check that have not ended yet, each with the bytes it was
/// counted for.
#[derive(Debug, Default)]
struct Adds {
    pending: HashMap<AttachmentKey, u64>,
}

/// The quotas of every non-root uid. The map only ever holds allowed uids (the peer check
/// refuses every other), so it stays as small as --allow-uid.
#[derive(Debug)]
pub struct Quotas {
    limits: Limits,
    /// All non-root operations together.
    shared: Arc<Semaphore>,
    uids: Mutex<HashMap<u32, Arc<Uid>>>,
}

/// Held while an operation of a non-root uid is in flight.
pub struct InFlight(Arc<Uid>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held while an operation of a non-root uid runs.
pub struct UidSlot {
    _uid: OwnedSemaphorePermit,
    _shared: OwnedSemaphorePermit,
}

/// Held by a non-root ADD past the record and byte quotas until it ends.
pub struct Reservation {
    uid: Arc<Uid>,
    key: AttachmentKey,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut adds = self.uid.adds.lock().unwrap_or_else(|e| e.into_inner());
        adds.pending.remove(&self.key);
    }
}

fn refusal(uid: u32, what: String, flag: &str, limit: String) -> ShimError {
    tracing::warn!(uid, %what, flag, "refused: over a per-caller quota");
    ShimError::Forbidden {
        msg: format!("uid {uid} is over its quota: {what}, more than {flag} ({limit}) allows"),
        details: format!(
            "a non-root caller's share of dipamd is bounded so that root's pods always have \
             room (docs/cfp.md §8.3); DEL attachments of uid {uid} that are no longer used, \
             or raise dipamd {flag}; nothing was changed"
        ),
    }
}

impl Quotas {
    /// `add_slots`: the ADD slots of the admission control, of which all non-root
    /// operations together may hold at most half.
    pub fn new(limits: Limits, add_slots: usize) -> Self {
        Self {
            limits,
            shared: Arc::new(Semaphore::new((add_slots / 2).max(1))),
            uids: Mutex::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn uid(&self, uid: u32) -> Arc<Uid> {
        let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(uids.entry(uid).or_insert_with(|| {
            Arc::new(Uid {
                in_flight: AtomicUsize::new(0),
                slots: Arc::new(Semaphore::new(self.limits.slots.max(1))),
                adds: Mutex::default(),
            })
        }))
    }

    /// Counts one more operation of `uid` in flight, or refuses it at once.
    pub fn enter(&self, uid: u32) -> Result<InFlight, ShimError> {
        let u = self.uid(uid);
        let now = u.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let held = InFlight(u);
        if now > self.limits.in_flight {
            return Err(refusal(
                uid,
                format!("{now} operations in flight"),
                "--non-root-max-in-flight",
                self.limits.in_flight.to_string(),
            ));
        }
        Ok(held)
    }

    /// One of `uid`'s slots and one of the non-root share, waiting at most `wait` (then
    /// "try again later", as for any caller when dipamd is saturated).
    pub async fn slot(&self, uid: u32, wait: Duration) -> Result<UidSlot, ShimError> {
        let u = self.uid(uid);
        let got = tokio::time::timeout(wait, async {
            let own = Arc::clone(&u.slots).acquire_owned().await;
            let shared = Arc::clone(&self.shared).acquire_owned().await;
            (own, shared)
        })
        .await;
        match got {
            Ok((Ok(own), Ok(shared))) => Ok(UidSlot {
                _uid: own,
                _shared: shared,
            }),
            Ok(_) => Err(ShimError::Busy("shutting down".into())),
            Err(_) => Err(ShimError::Busy(format!(
                "uid {uid} has no free slot within the queueing limit (--non-root-max-slots)"
            ))),
        }
    }

    /// About what the record of an ADD of `req` will hold, for [`Self::reserve`]: the config
    /// and the CNI values it keeps.
    pub fn record_estimate(req: &dipam_proto::v1::CniRequest) -> u64 {
        (req.stdin.len()
            + req.netns.len()
            + req.cni_args.len()
            + req.cni_path.len()
            + req.container_id.len()
            + req.ifname.len()
            + 1024) as u64
    }

    /// Checks an ADD of `key` by `uid`, estimated at `estimate` bytes, against the record
    /// and byte quotas, counting the uid's records from the ledger's census (kept with every
    /// commit, rebuilt from the ledger at start: the counts survive restarts and crashes,
    /// and no ADD reads every record) and the uid's ADDs in flight; reserves its share
    /// until the returned guard drops. `census` is the census's view, held for the call: a
    /// record commits (and enters the census) before its ADD's reservation drops, so each
    /// ADD of the uid is counted once, by its record or by its estimate.
    pub fn reserve(
        &self,
        uid: u32,
        key: &AttachmentKey,
        estimate: u64,
        census: &CensusCounts,
    ) -> Result<Reservation, ShimError> {
        let u = self.uid(uid);
        let mut adds = u.adds.lock().unwrap_or_else(|e| e.into_inner());
        // An ADD in flight is counted by its estimate, not by its intent already in the
        // ledger; a repeat ADD of a key the uid holds replaces that key's record.
        let (mut records, mut bytes) = census.of_uid(uid);
        let this = (!adds.pending.contains_key(key)).then_some(key);
        for k in adds.pending.keys().chain(this) {
            if let Some(e) = census.entry(k).filter(|e| e.creator_uid == Some(uid)) {
                records = records.saturating_sub(1);
                bytes = bytes.saturating_sub(e.bytes);
            }
        }
        records += adds.pending.len() + 1;
        bytes += adds.pending.values().sum::<u64>() + estimate;
        let refused = if records > self.limits.records {
            Some(refusal(
                uid,
                format!("{records} attachments"),
                "--non-root-max-records",
                self.limits.records.to_string(),
            ))
        } else if bytes > self.limits.bytes {
            Some(refusal(
                uid,
                format!("{bytes} bytes of ledger records"),
                "--non-root-max-bytes",
                format!("{} bytes", self.limits.bytes),
            ))
        } else {
            None
        };
        if let Some(e) = refused {
            return Err(e);
        }
        adds.pending.insert(key.clone(), estimate);
        drop(adds);
        Ok(Reservation {
            uid: u,
            key: key.clone(),
        })
    }
}

impl Default for Quotas {
    fn default() -> Self {
        Self::new(Limits::default(), 12)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cid: &str) -> AttachmentKey {
        AttachmentKey {
            network: "n".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn in_flight_is_bounded_per_uid_and_released_on_drop() {
        let q = Quotas::new(
            Limits {
                in_flight: 2,
                ..Limits::default()
            },
            12,
        );
        let a = q.enter(7).unwrap();
        let _b = q.enter(7).unwrap();
        let e = q.enter(7).err().expect("a third is refused");
        assert!(e.to_string().contains("--non-root-max-in-flight"), "{e}");
        // Another uid has its own count.
        let _c = q.enter(8).unwrap();
        drop(a);
        assert!(q.enter(7).is_ok());
    }

    /// Quotas of two records per uid, beside an empty ledger.
    fn two_records() -> (Quotas, dipam_state::Ledger) {
        let q = Quotas::new(
            Limits {
                records: 2,
                ..Limits::default()
            },
            12,
        );
        (q, census(&[]))
    }

    fn census(ledger: &[dipam_state::AttachmentRecord]) -> dipam_state::Ledger {
        let l = dipam_state::Ledger::shared(dipam_state::MemStore::new());
        for r in ledger {
            l.put(r).unwrap();
        }
        l
    }

    fn reserve(
        q: &Quotas,
        l: &dipam_state::Ledger,
        uid: u32,
        cid: &str,
        estimate: u64,
    ) -> Result<Reservation, ShimError> {
        l.census(|c| q.reserve(uid, &key(cid), estimate, c))
            .unwrap()
    }

    #[test]
    fn pending_adds_count_until_they_end() {
        let (q, l) = two_records();
        let r1 = reserve(&q, &l, 7, "a", 100).ok().unwrap();
        let _r2 = reserve(&q, &l, 7, "b", 100).ok().unwrap();
        assert!(reserve(&q, &l, 7, "c", 100).is_err());
        // Root and other uids are not counted against uid 7.
        assert!(reserve(&q, &l, 8, "c", 100).is_ok());
        drop(r1);
        assert!(reserve(&q, &l, 7, "c", 100).is_ok());
    }

    /// An ADD that ended left its record: it counts once, by the record, whether its
    /// reservation is still held or not; a repeat ADD of a key replaces its record.
    #[test]
    fn an_add_counts_once_by_its_record_or_its_estimate() {
        use dipam_state::{AttachmentState, Owner};
        let (q, l) = two_records();
        let held = reserve(&q, &l, 7, "a", 100).ok().unwrap();
        let mut a = crate::testing::record("a", Owner::Pod, AttachmentState::Committed, 1);
        a.key = key("a");
        a.creator_uid = Some(7);
        l.put(&a).unwrap();
        let b = reserve(&q, &l, 7, "b", 100).ok().unwrap();
        drop(held);
        assert!(reserve(&q, &l, 7, "c", 100).is_err(), "a and b hold both");
        // Its repeat ADD is not a third.
        drop(b);
        assert!(reserve(&q, &l, 7, "a", 100).is_ok());
    }

    /// The ledger's records of the uid count by their encoded size (never less than the
    /// config they hold), other uids' and root's not at all.
    #[test]
    fn the_ledgers_records_count_by_their_size() {
        use dipam_state::{AttachmentState, Owner};
        let mut big = crate::testing::record("big", Owner::Pod, AttachmentState::Committed, 1);
        big.delegate_config = "x".repeat(600_000);
        big.creator_uid = Some(7);
        let mut other = big.clone();
        other.key.container_id = "other".into();
        other.creator_uid = Some(8);
        let mut roots = big.clone();
        roots.key.container_id = "root".into();
        roots.creator_uid = None;
        let q = Quotas::new(
            Limits {
                bytes: 1 << 20,
                ..Limits::default()
            },
            12,
        );
        let l = census(&[big, other, roots]);
        // 600 kB held: a 300 kB ADD fits, a 500 kB one does not; uid 8 has room for 400 kB.
        assert!(reserve(&q, &l, 7, "a", 300_000).is_ok());
        assert!(reserve(&q, &l, 7, "b", 500_000).is_err());
        assert!(reserve(&q, &l, 8, "c", 400_000).is_ok());
    }

    #[test]
    fn bytes_are_bounded() {
        let q = Quotas::new(
            Limits {
                bytes: 1000,
                ..Limits::default()
            },
            12,
        );
        let l = census(&[]);
        match reserve(&q, &l, 7, "a", 1001) {
            Err(e) => assert!(e.to_string().contains("--non-root-max-bytes"), "{e}"),
            _ => panic!("not refused"),
        }
    }
}
