//! The periodic reconcile between the ledger and the delegate's own store. containerd does not
//! call CNI GC yet, so without this nothing would notice a reservation leaked outside dipamd,
//! or a delegate store that was wiped or is not the one the runtime sees (F7, F22).
//!
//! It reports, and frees nothing unless dipamd runs with --reconcile-free (then it collects
//! the orphans, in ledger-as-valid mode, exactly as `dipamctl gc --use-ledger` would).

use std::{collections::HashSet, sync::Arc, sync::atomic::Ordering, time::Duration};

use std::net::IpAddr;

use dipam_state::{AttachmentRecord, AttachmentState};
use tracing::{info, warn};

use crate::{
    l1_leaves::error::ShimError,
    l1_leaves::events::RangeCount,
    l2_core::core::Core,
    l2_core::delegate::{
        config::{DelegateConf, result_addrs},
        ranges::{self, Family},
        store,
    },
    l3_clients::gc::{self, Valid},
    l3_clients::liveness::{Scan, Verdict},
};

mod seen;
use seen::Seen;

#[cfg(test)]
use crate::l2_core::delegate::import;

/// One network's divergence.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Divergence {
    /// Committed records whose address the delegate's store does not hold.
    pub missing: Vec<String>,
    /// Reservations the ledger does not know, and nothing on the node uses (freeable), after
    /// [`classify`]; before it, empty.
    pub orphans: Vec<String>,
    /// Reservations the ledger does not know, but a running pod uses (adoptable: a reconcile
    /// or `dipamctl adopt` records them), each with its evidence (liveness.rs).
    pub alive: Vec<String>,
    /// Reservations the ledger does not know, no evidence names, but the look was partial:
    /// kept, never freed.
    pub unverified: Vec<String>,
    /// Every reservation the ledger does not know (outside the grace period), as read; blank
    /// ones (store::Contents::blank) with an empty container ID.
    pub unrecorded: Vec<store::Reservation>,
    /// The blank reservations among the orphans, after [`classify`]: `--reconcile-free`
    /// removes them (no DEL can).
    pub blank_orphans: Vec<store::Reservation>,
    /// Adopted records whose every address the store no longer holds: their pod was deleted
    /// by a runtime that used the config cached at its ADD (from before the node was
    /// adopted: podman does), so the DEL went straight to the delegate. [`round`] forgets
    /// those whose pod is gone.
    pub gone_adopted: Vec<AttachmentRecord>,
    /// Set when dipamd must not serve pod ADDs on this network: what is wrong and which
    /// mount to fix.
    pub misconfigured: Option<String>,
}

/// tmpfs's statfs magic.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether `path` (or its nearest existing ancestor) is on tmpfs.
pub fn on_tmpfs(path: &std::path::Path) -> bool {
    let mut p = Some(path);
    while let Some(cur) = p {
        if cur.exists() {
            return nix::sys::statfs::statfs(cur)
                .map(|s| s.filesystem_type().0 == TMPFS_MAGIC)
                .unwrap_or(false);
        }
        p = cur.parent();
    }
    false
}

/// What the reconcile with the delegate's store reaches: the core, the agent's (its
/// conflist's network), the GC (it frees orphans with `--reconcile-free`, and keeps the
/// counters) and the networks it refuses.
#[derive(Clone)]
pub struct Watch {
    pub core: Arc<crate::l2_core::core::Core>,
    pub agent: Arc<crate::l3_clients::agent::Agent>,
    pub gc: Arc<gc::Gc>,
    pub misconfigured: Arc<Misconfigured>,
    pub teardown: Arc<std::sync::OnceLock<crate::l3_clients::teardown::Teardown>>,
}

impl Watch {
    fn collector(&self) -> gc::Collector {
        gc::Collector {
            core: Arc::clone(&self.core),
            gc: Arc::clone(&self.gc),
            agent: Arc::clone(&self.agent),
            teardown: Arc::clone(&self.teardown),
        }
    }
}

/// Networks whose delegate store dipamd must not trust, with the reason: pod ADDs there are
/// refused (rpc/add/mod.rs), and the warm pool does not fill them. Written by [`round`].
#[derive(Debug, Default)]
pub struct Misconfigured(
    std::sync::Mutex<std::collections::HashMap<(String, Option<u32>), String>>,
);

impl Misconfigured {
    /// Why pod ADDs of `creator` (None: root) on `network` are refused, if they are: each
    /// creator's records decide for that creator alone.
    pub fn of(&self, network: &str, creator: Option<u32>) -> Option<String> {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(&(network.to_owned(), creator)).cloned())
    }

    /// The networks refused now, replacing the last round's.
    pub fn set(&self, refused: std::collections::HashMap<(String, Option<u32>), String>) {
        if let Ok(mut m) = self.0.lock() {
            *m = refused;
        }
    }
}

/// Compares one scope's records (gc::scopes: those `creator`, None for root, added on the
/// network of `dc` in its store) with the delegate's store (host-local only: the one whose
/// store dipamd can read), and tells its unrecorded reservations apart by a look at the node.
pub async fn check(
    w: &Watch,
    dc: &DelegateConf,
    creator: Option<u32>,
) -> Result<Option<Divergence>, ShimError> {
    let Some(mut d) = look(w, dc, creator).await?.0 else {
        return Ok(None);
    };
    if !d.unrecorded.is_empty() {
        classify(&mut d, &w.gc.scan().await);
    }
    Ok(Some(d))
}

/// Sorts `d.unrecorded` into alive (adoptable), orphans (dead: freeable) and unverified.
pub fn classify(d: &mut Divergence, scan: &Scan) {
    d.orphans.clear();
    d.alive.clear();
    d.unverified.clear();
    d.blank_orphans.clear();
    for r in &d.unrecorded {
        let blank = r.container_id.is_empty();
        let what = if blank {
            format!(
                "{} (a blank reservation: its file names no owner, so no DEL releases it)",
                r.ip
            )
        } else {
            format!("{} ({} {})", r.ip, r.container_id, r.ifname)
        };
        match scan.verdict(r.ip, &r.container_id) {
            Verdict::Alive(why) => d.alive.push(format!("{what}: {why}")),
            Verdict::Dead => {
                d.orphans.push(what);
                if blank {
                    d.blank_orphans.push(r.clone());
                }
            }
            Verdict::Unknown(why) => d.unverified.push(format!("{what}: {why}")),
        }
    }
}

/// One look at a network's scope (gc::scopes): the records `creator` (None: root) added in
/// the store of `dc`; its divergence (where the delegate's store can be read) and its range
/// per family, from the same reading of the ledger and the store. Every record of the network
/// counts as known, so one caller's reservations are never another's orphans. The ledger is
/// read before the store, as before: an ADD committed in between is in both, and a
/// reservation made after the read is young (the grace period) for `unrecorded`.
pub async fn look(
    w: &Watch,
    dc: &DelegateConf,
    creator: Option<u32>,
) -> Result<(Option<Divergence>, Vec<RangeCount>), ShimError> {
    let net = dc.network.clone();
    let dir = store::readable_dir(&dc.kind, &dc.conf, &dc.network);
    let of_store = dir.clone();
    // One streamed pass: the compact view of each record, never the records (seen.rs).
    let all: Vec<Seen> = w
        .core
        .ledger(move |l| seen::read(l, &net, of_store.as_deref()))
        .await?;
    let Some(dir) = dir else {
        let mine: Vec<&Seen> = all.iter().filter(|r| r.creator == creator).collect();
        return Ok((None, census(dc, &mine, None)));
    };
    let same_store: Vec<&Seen> = all.iter().filter(|r| r.same_store).collect();
    let records: Vec<&Seen> = same_store
        .iter()
        .copied()
        .filter(|r| r.creator == creator)
        .collect();
    let store::Contents { mut held, blank } = store::read_contents(dir.clone())
        .await
        .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
    // A blank file at an address a record holds is that record's (reported missing below);
    // any other is an orphan once older than store::BLANK_MIN_AGE.
    let recorded_ips: HashSet<IpAddr> = all.iter().flat_map(|r| r.ips.iter().copied()).collect();
    held.extend(blank.into_iter().filter(|r| !recorded_ips.contains(&r.ip)));
    drop(recorded_ips);
    let held_pairs: HashSet<(&str, IpAddr)> = held
        .iter()
        .map(|r| (r.container_id.as_str(), r.ip))
        .collect();
    let mut d = Divergence::default();
    let mut gone_adopted = Vec::new();
    for r in records
        .iter()
        .filter(|r| r.state == AttachmentState::Committed)
    {
        let mut all_gone = !r.ips.is_empty();
        for ip in &r.ips {
            if !held_pairs.contains(&(r.delegate_ids().0, *ip)) {
                d.missing.push(format!("{ip} ({})", r.key));
            } else {
                all_gone = false;
            }
        }
        if all_gone && r.adopted {
            gone_adopted.push((*r).clone());
        }
    }
    d.misconfigured = misconfigured(w, dc, &dir, &records, &held_pairs);
    d.unrecorded = unrecorded(w, &all, &held);
    let ranges = census(dc, &same_store, Some(&held));
    drop(held_pairs);
    d.gone_adopted = adopted_records(w, gone_adopted).await?;
    Ok((Some(d), ranges))
}

/// The whole records of the adopted attachments whose every address the store lacks (read
/// one by one: there are few), those still as they were seen: [`forget_gone_adopted`]
/// forgets a record only if it is still the one judged.
async fn adopted_records(w: &Watch, gone: Vec<Seen>) -> Result<Vec<AttachmentRecord>, ShimError> {
    if gone.is_empty() {
        return Ok(Vec::new());
    }
    w.core
        .ledger(move |l| {
            let mut out = Vec::new();
            for s in gone {
                if let Some(rec) = l.get(&s.key)?
                    && Seen::of(&rec, s.same_store) == s
                {
                    out.push(rec);
                }
            }
            Ok(out)
        })
        .await
}

/// Why pod ADDs on the network must stop, if they must: the delegate's store holds none of the
/// pod addresses the ledger records, or it is on tmpfs while the ledger persists.
fn misconfigured(
    w: &Watch,
    dc: &DelegateConf,
    dir: &std::path::Path,
    records: &[&Seen],
    held_pairs: &HashSet<(&str, IpAddr)>,
) -> Option<String> {
    // The CFP's worst case (F22, F7): dipamd's view of the delegate's state directory is not
    // the runtime's, or it does not survive a reboot. Every pod address the ledger records is
    // gone from it, or it is on tmpfs while the ledger is not: serving ADD would hand out
    // addresses running pods hold.
    // Adopted records are left out: they were read from this very directory, and one whose
    // pod a runtime deleted around dipamd is missing for that reason alone.
    let pod_ips = records.iter().filter(|r| r.counted_pod()).count();
    let pod_missing = records
        .iter()
        .filter(|r| r.counted_pod())
        .filter(|r| {
            r.ips
                .iter()
                .any(|ip| !held_pairs.contains(&(r.delegate_ids().0, *ip)))
        })
        .count();
    if pod_ips > 0 && pod_missing == pod_ips {
        Some(format!(
            "{} holds none of the {pod_ips} pod address(es) the ledger records for network {}: \
             dipamd does not see the runtime's delegate state directory, or it was not \
             persistent. Mount the host's directory into dipamd at the same path (host-local: \
             hostPath /var/lib/cni/networks), or set ipam dataDir to a persistent directory \
             both see; `dipamctl doctor` shows every check",
            dir.display(),
            dc.network
        ))
    } else if on_tmpfs(dir) && !on_tmpfs(&w.core.identity.state_dir) {
        Some(format!(
            "{} is on tmpfs while dipamd's ledger ({}) persists: after a reboot the ledger \
             would list addresses host-local forgot, and they would be handed out twice. \
             Put host-local's dataDir on persistent storage",
            dir.display(),
            w.core.identity.state_dir.display()
        ))
    } else {
        None
    }
}

/// The reservations of the delegate's store that no record of the network (`all`) accounts
/// for, past the grace period.
fn unrecorded(w: &Watch, all: &[Seen], held: &[store::Reservation]) -> Vec<store::Reservation> {
    let known = store::Known::of_ids(all.iter().map(Seen::delegate_ids));
    let mut out = Vec::new();
    for r in held {
        let blank = r.container_id.is_empty();
        // A blank reservation (host-local killed between creating the file and writing its
        // owner) names no container: no record accounts for it.
        let ours = !blank && known.accounts_for(r);
        // A reservation younger than the grace period may be an ADD's that is still being
        // recorded: neither adopted nor called an orphan yet. A blank one may be a file
        // host-local is writing: never younger than store::BLANK_MIN_AGE either.
        let grace = match blank {
            true => w.gc.policy.grace.max(store::BLANK_MIN_AGE),
            false => w.gc.policy.grace,
        };
        let age = r
            .modified
            .and_then(|m| std::time::SystemTime::now().duration_since(m).ok());
        // A blank one of unknown age (its mtime ahead of the clock) is kept as young.
        let young = match blank {
            true => age.is_none_or(|age| age < grace),
            false => age.is_some_and(|age| age < grace),
        };
        if !ours && !young {
            out.push(r.clone());
        }
    }
    out
}

/// Who holds what in one network's ranges, per family (docs/cfp.md §7.4, "The range view"). With the delegate's
/// store (`held`), each reservation is counted once: for the owner of the ledger record that
/// accounts for it (matched as the orphan check above matches), or as an orphan; free is the
/// size less every reservation inside the ranges. Without it (a delegate whose store dipamd
/// cannot read), the ledger's recorded addresses are all there is: no size, orphans or free.
pub fn census(
    dc: &DelegateConf,
    records: &[&Seen],
    held: Option<&[store::Reservation]>,
) -> Vec<RangeCount> {
    use std::collections::{BTreeMap, HashMap};

    let (held_by, ranges) = holders(dc, records, held);
    let mut families: Vec<Family> = held_by.iter().map(|(ip, _)| Family::of(*ip)).collect();
    if let Some(Ok(r)) = &ranges {
        families.extend(r.families());
    }
    let mut rows: BTreeMap<Family, RangeCount> = BTreeMap::new();
    for f in families {
        rows.entry(f).or_insert_with(|| {
            let mut row = RangeCount {
                network: dc.network.clone(),
                family: f.as_str(),
                orphans: held.map(|_| 0),
                ..RangeCount::default()
            };
            match &ranges {
                Some(Ok(r)) => {
                    row.size = Some(u64::try_from(r.size(f)).unwrap_or(u64::MAX));
                    row.ranges = r.describe(f);
                }
                Some(Err(why)) => row.unknown = why.to_string(),
                None => {
                    row.unknown = format!(
                        "{} keeps its ranges and reservations to itself: dipamd counts only \
                         the addresses its ledger records",
                        dc.kind
                    );
                }
            }
            row
        });
    }
    let mut inside: HashMap<Family, u64> = HashMap::new();
    for (ip, h) in held_by {
        let f = Family::of(ip);
        let Some(row) = rows.get_mut(&f) else {
            continue;
        };
        match h {
            Holder::Pod => row.pods += 1,
            Holder::Agent => row.agent += 1,
            Holder::Pool => row.pool += 1,
            Holder::Orphan => *row.orphans.get_or_insert(0) += 1,
        }
        if let Some(Ok(r)) = &ranges
            && r.hands_out(ip)
        {
            *inside.entry(f).or_default() += 1;
        }
    }
    for (f, row) in &mut rows {
        if let (Some(size), Some(_)) = (row.size, held) {
            row.free = Some(size.saturating_sub(inside.get(f).copied().unwrap_or(0)));
        }
    }
    rows.into_values().collect()
}

/// The network's ranges as the delegate's config gives them, or why they cannot be read;
/// `None` where the delegate keeps them to itself.
type RangesRead = Option<Result<ranges::Ranges, ranges::RangesError>>;

/// Who holds a reservation, for [`census`].
#[derive(Clone, Copy)]
enum Holder {
    Pod,
    Agent,
    Pool,
    Orphan,
}

/// Each address held with its holder: the delegate's reservations matched to the records (as
/// the orphan check matches them) with the network's ranges, or without the store
/// (`held` None) the ledger's recorded addresses alone.
fn holders(
    dc: &DelegateConf,
    records: &[&Seen],
    held: Option<&[store::Reservation]>,
) -> (Vec<(IpAddr, Holder)>, RangesRead) {
    use std::collections::HashMap;

    let holder = |h: seen::Holder| match h {
        seen::Holder::Pod => Holder::Pod,
        seen::Holder::Agent => Holder::Agent,
        seen::Holder::Pool => Holder::Pool,
    };
    let mut held_by: Vec<(IpAddr, Holder)> = Vec::new();
    let ranges = match held {
        Some(held) => {
            let by_pair: HashMap<(&str, &str), Holder> = records
                .iter()
                .map(|r| (r.delegate_ids(), holder(r.holder)))
                .collect();
            let by_id: HashMap<&str, Holder> = records
                .iter()
                .map(|r| (r.delegate_ids().0, holder(r.holder)))
                .collect();
            for r in held {
                let h = if r.ifname.is_empty() {
                    by_id.get(r.container_id.as_str())
                } else {
                    by_pair.get(&(r.container_id.as_str(), r.ifname.as_str()))
                };
                held_by.push((r.ip, h.copied().unwrap_or(Holder::Orphan)));
            }
            Some(ranges::host_local(&dc.conf["ipam"]))
        }
        None => {
            for r in records {
                for ip in &r.ips {
                    held_by.push((*ip, holder(r.holder)));
                }
            }
            None
        }
    };
    (held_by, ranges)
}

/// Every known network's range per family, looked at now; observers get them too, so a scrape
/// after `dipamctl status` shows what it showed.
pub async fn ranges(w: &Watch) -> Result<Vec<RangeCount>, ShimError> {
    let mut out = Vec::new();
    // The node's ranges are root's: a non-root caller's config under the same network name
    // once showed as root's range.
    for (dc, _) in gc::scopes(&w.core, &w.agent)
        .await?
        .into_iter()
        .filter(|(_, c)| c.is_none())
    {
        out.extend(look(w, &dc, None).await?.1);
    }
    w.core
        .events
        .emit(crate::l1_leaves::events::Event::Ranges(&out));
    Ok(out)
}

/// One reconcile round over every known network; updates the status counters. Reservations
/// a running pod uses that the ledger lacks are adopted (recorded); the dead ones are freed
/// only with `free` (--reconcile-free), and the GC checks each again before it frees it.
pub async fn round(w: &Watch, free: bool) -> Result<(), ShimError> {
    let (mut missing, mut orphans, mut alive) = (0u64, 0u64, 0u64);
    let mut refused = std::collections::HashMap::new();
    let mut counts = Vec::new();
    let mut looked: Option<Scan> = None;
    for (dc, creator) in gc::scopes(&w.core, &w.agent).await? {
        let (d, ranges) = look(w, &dc, creator).await?;
        if creator.is_none() {
            counts.extend(ranges);
        }
        let Some(mut d) = d else {
            continue;
        };
        if let Some(uid) = creator {
            // A non-root caller's records decide for that caller alone: never the node's
            // readiness (STATUS 51, health) nor root's ADDs (159). What its store holds
            // unrecorded is root's scope's business (adopted or freed as root's), not its.
            if let Some(why) = &d.misconfigured {
                tracing::error!(network = %dc.network, uid, "{why}; this uid's pod ADDs on this network are refused until it is fixed");
                refused.insert((dc.network.clone(), creator), why.clone());
            }
            if !d.missing.is_empty() {
                warn!(network = %dc.network, uid, missing = ?d.missing, "the delegate's store lacks addresses a non-root caller's attachments record");
            }
            continue;
        }
        if !d.unrecorded.is_empty() || !d.gone_adopted.is_empty() {
            if looked.is_none() {
                looked = Some(w.gc.scan().await);
            }
            let now = looked.as_ref().expect("set above");
            forget_gone_adopted(&w.core, &mut d, now).await;
            classify(&mut d, now);
            if !d.alive.is_empty() {
                adopt_alive(w, &dc, &mut d, now).await;
            }
            if !d.unverified.is_empty() {
                warn!(network = %dc.network, unverified = ?d.unverified, "the delegate's store holds reservations dipamd never recorded and cannot tell in use or not; they are kept");
            }
        }
        if let Some(why) = &d.misconfigured {
            tracing::error!(network = %dc.network, "{why}; pod ADDs on this network are refused until it is fixed");
            refused.insert((dc.network.clone(), creator), why.clone());
        }
        if !d.missing.is_empty() {
            warn!(network = %dc.network, missing = ?d.missing, "the delegate's store lacks addresses the ledger records: it was wiped, or dipamd and the runtime do not see the same state directory; these addresses may be handed out twice");
        }
        if !d.orphans.is_empty() {
            warn!(network = %dc.network, orphans = ?d.orphans, "the delegate's store holds reservations dipamd never recorded, and nothing on the node uses them");
            if free {
                let gc = gc::collect::Request {
                    dc: &dc,
                    cni_path: "",
                    valid: Valid::Ledger,
                    began: w.core.births.gc_began(None, None),
                    mode: gc::collect::Mode::Free,
                    by: crate::l1_leaves::events::FreedBy::Reconcile,
                    list_kept: false,
                };
                let plan = gc::collect::collect(&w.collector(), gc).await?;
                let freed = plan.items.iter().filter(|i| i.outcome == "freed").count();
                let blank = free_blanks(&dc, std::mem::take(&mut d.blank_orphans)).await;
                info!(network = %dc.network, freed, blank, "reconcile freed orphaned reservations");
            }
        }
        missing += d.missing.len() as u64;
        orphans += d.orphans.len() as u64;
        alive += (d.alive.len() + d.unverified.len()) as u64;
    }
    w.misconfigured.set(refused);
    w.gc.stats.missing.store(missing, Ordering::Relaxed);
    w.gc.stats.orphans.store(orphans, Ordering::Relaxed);
    w.gc.stats.unrecorded_alive.store(alive, Ordering::Relaxed);
    w.core
        .events
        .emit(crate::l1_leaves::events::Event::Divergence {
            missing,
            orphans,
            alive,
        });
    w.core
        .events
        .emit(crate::l1_leaves::events::Event::Ranges(&counts));
    Ok(())
}

/// Adopts the reservations of running pods the ledger lacks (`d.alive`); what could not be
/// adopted stays in `d.alive`, with the reason.
async fn adopt_alive(w: &Watch, dc: &DelegateConf, d: &mut Divergence, now: &Scan) {
    match crate::l3_clients::adopt::adopt(&w.core, &w.gc.policy, dc, now, false).await {
        Ok(r) => {
            info!(network = %dc.network, adopted = r.adopted.len(), "reconcile adopted reservations of running pods that the ledger lacked");
            for s in &r.skipped {
                warn!(network = %dc.network, ips = ?s.ips, container_id = %s.container_id, reason = %s.reason, "a running pod's reservation could not be adopted");
            }
            d.alive = r
                .skipped
                .iter()
                .map(|s| {
                    format!(
                        "{} ({} {}): {}",
                        s.ips.join(","),
                        s.container_id,
                        s.ifname,
                        s.reason
                    )
                })
                .collect();
        }
        Err(e) => {
            warn!(network = %dc.network, error = %e, "adopting running pods' reservations failed")
        }
    }
}

/// Removes the blank orphans of the network of `dc` (store::free_blank: under host-local's
/// lock, each checked again there); how many went. No DEL can free them: host-local releases
/// by the owner the file lacks.
async fn free_blanks(dc: &DelegateConf, blank: Vec<store::Reservation>) -> usize {
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &dc.network) else {
        return 0;
    };
    if blank.is_empty() {
        return 0;
    }
    let network = dc.network.clone();
    let task = tokio::task::spawn_blocking(move || {
        let mut freed = 0;
        for r in &blank {
            match store::free_blank(&dir, r, store::BLANK_MIN_AGE) {
                Ok(true) => {
                    info!(network = %network, ip = %r.ip, dir = %dir.display(), "freed a blank reservation (its file named no owner: a delegate killed between creating and writing it)");
                    freed += 1;
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(network = %network, ip = %r.ip, error = %e, "could not free a blank reservation")
                }
            }
        }
        freed
    });
    match tokio::time::timeout(store::READ_TIMEOUT, task).await {
        Ok(Ok(freed)) => freed,
        _ => 0,
    }
}

/// Forgets the adopted records whose addresses the delegate no longer holds and nothing on
/// the node uses: their pod's DEL went straight to the delegate (a runtime tearing down with
/// the config cached at its ADD, from before the node was adopted), so the release already
/// happened. Left in the ledger they were reported missing, and, had every pod record been
/// one, would have stopped pod ADDs as a misconfigured store. One a running pod still uses
/// (its store entry wiped) stays, reported missing.
async fn forget_gone_adopted(core: &Core, d: &mut Divergence, scan: &Scan) {
    for rec in std::mem::take(&mut d.gone_adopted) {
        let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
        let dead = ips
            .iter()
            .all(|ip| scan.verdict(*ip, &rec.key.container_id) == Verdict::Dead);
        if !dead {
            continue;
        }
        let Some(_guard) = core.locks.try_lock(&rec.key) else {
            continue;
        };
        if !matches!(core.lookup(&rec.key), Ok(Some(now)) if now == rec) {
            continue;
        }
        match core.forget(&rec).await {
            Ok(()) => {
                info!(key = %rec.key, ips = ?ips, "forgot an adopted attachment whose pod was deleted around dipamd (its delegate already released it)");
                let tail = format!("({})", rec.key);
                d.missing.retain(|m| !m.ends_with(&tail));
            }
            Err(e) => {
                warn!(key = %rec.key, error = %e, "could not forget an adopted attachment the delegate released")
            }
        }
    }
}

/// The loop; `every` zero disables it.
pub async fn run(w: Watch, every: Duration, free: bool) {
    if every.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = round(&w, free).await {
            warn!(error = %e, "ledger/store reconcile failed");
        }
    }
}

#[cfg(test)]
mod dense_tests;

#[cfg(test)]
mod tests {
    use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
    use serde_json::json;

    use rscni_types::version::SpecVersion;

    use super::*;

    fn rec(cid: &str, owner: Owner, ips: &[&str]) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey::new("net", cid, "eth0"),
            owner,
            state: AttachmentState::Committed,
            delegate_type: "host-local".into(),
            delegate_version: "1.0.0".into(),
            delegate_config: String::new(),
            netns: String::new(),
            cni_args: String::new(),
            cni_path: String::new(),
            result: Some(json!({"cniVersion": "1.0.0",
                "ips": ips.iter().map(|a| json!({"address": a})).collect::<Vec<_>>()})),
            config_digest: String::new(),
            request_id: "t".into(),
            created_at: 1,
            updated_at: 1,
            issued_ms: 0,
            issued_at: None,
            delegate_key: None,
            creator_uid: None,
            cri_pod: None,
        }
    }

    /// The records as the reconcile compares them (seen.rs), for [`census`].
    fn seen(records: &[AttachmentRecord]) -> Vec<Seen> {
        records.iter().map(|r| Seen::of(r, true)).collect()
    }

    fn held(ip: &str, cid: &str, ifname: &str) -> store::Reservation {
        store::Reservation {
            ip: ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
            container_id: cid.into(),
            ifname: ifname.into(),
            modified: None,
        }
    }

    fn dc(kind: &str, ipam: serde_json::Value) -> DelegateConf {
        DelegateConf {
            kind: kind.into(),
            network: "net".into(),
            version: SpecVersion::CURRENT,
            conf: json!({"ipam": ipam}),
        }
    }

    /// Dual-stack host-local: each reservation counted once per family, for its record's
    /// owner (a legacy id-only file by its ID), else as an orphan; free counts only what lies
    /// inside the ranges.
    #[test]
    fn counts_each_reservation_once_by_owner_and_family() {
        let conf = dc(
            "host-local",
            json!({"type": "host-local", "ranges": [
                [{"subnet": "10.1.0.0/29"}], [{"subnet": "fd00::/125"}]]}),
        );
        let records = vec![
            rec("pod-a", Owner::Pod, &["10.1.0.2/29", "fd00::2/125"]),
            rec(
                "router",
                Owner::Agent {
                    role: "router".into(),
                },
                &["10.1.0.3/29"],
            ),
            rec("dipam-pool-n-0", Owner::Pool, &["10.1.0.4/29"]),
        ];
        let store = vec![
            held("10.1.0.2", "pod-a", "eth0"),
            held("fd00::2", "pod-a", "eth0"),
            held("10.1.0.3", "router", ""),
            held("10.1.0.4", "dipam-pool-n-0", "eth0"),
            held("10.1.0.5", "stranger", "eth0"),
            // Another ifname of a known container is not ours.
            held("fd00::3", "pod-a", "eth1"),
            // Outside the ranges (a config that shrank): counted, but not against free.
            held("10.1.0.7", "stranger2", "eth0"),
        ];
        let got = census(
            &conf,
            &seen(&records).iter().collect::<Vec<_>>(),
            Some(&store),
        );
        let v4 = RangeCount {
            network: "net".into(),
            family: "ipv4",
            size: Some(5),
            pods: 1,
            agent: 1,
            pool: 1,
            orphans: Some(2),
            free: Some(1),
            ranges: vec!["10.1.0.2-10.1.0.6".into()],
            unknown: String::new(),
        };
        let v6 = RangeCount {
            family: "ipv6",
            size: Some(6),
            agent: 0,
            pool: 0,
            orphans: Some(1),
            free: Some(4),
            ranges: vec!["fd00::2-fd00::7".into()],
            ..v4.clone()
        };
        assert_eq!(got, vec![v4, v6]);
    }

    /// A delegate dipamd cannot read: the ledger's addresses, and no size, orphans or free.
    /// A host-local config host-local would refuse: the store's counts, and no size.
    #[test]
    fn unknown_sizes_are_unknown_not_zero() {
        let records = vec![rec("pod-a", Owner::Pod, &["10.2.0.9/24"])];
        let got = census(
            &dc("azure-vnet-ipam", json!({})),
            &seen(&records).iter().collect::<Vec<_>>(),
            None,
        );
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].size, got[0].pods, got[0].orphans, got[0].free),
            (None, 1, None, None)
        );
        assert!(got[0].unknown.contains("azure-vnet-ipam"), "{got:?}");

        let bad = dc(
            "host-local",
            json!({"ranges": [[{"subnet": "10.2.0.5/24"}]]}),
        );
        let got = census(
            &bad,
            &seen(&records).iter().collect::<Vec<_>>(),
            Some(&[held("10.2.0.9", "pod-a", "eth0")]),
        );
        assert_eq!(
            (got[0].size, got[0].pods, got[0].orphans, got[0].free),
            (None, 1, Some(0), None)
        );
        assert!(got[0].unknown.contains("host bits"), "{got:?}");
    }
}
