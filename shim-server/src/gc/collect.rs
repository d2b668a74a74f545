//! A GC run: plan what to keep and why, refuse what an interlock forbids, and release the
//! rest through the delegate.
//!
//! Locking (docs/cfp.md §7.4): GC holds no network-wide lock while it releases. It takes the
//! key lock of each attachment it frees, and only if no operation holds it; everything else
//! on the network (a pod's ADD, DEL, CHECK) goes on meanwhile. One GC per network runs at a
//! time, and the delegate's own GC (one exec) runs with the network held exclusively.
//!
//! Speed (docs/performance.md, run 13): the delegate's DELs run [`GcPolicy::parallel`] at a
//! time, the `deleting` marks are written a chunk at a time ([`CHUNK`] records, one disk write
//! each, always before that chunk's DELs start), and the records freed are forgotten in group
//! commits while the next DELs run. A crash at any instant leaves each record either
//! committed (untouched), or marked `deleting` (its DEL may or may not have run: the next
//! start runs it again, which the delegate answers with success when it holds nothing), or
//! gone (its DEL returned success first).

use std::{
    collections::{HashSet, VecDeque},
    future::Future,
    pin::Pin,
    time::SystemTime,
};

use dipam_proto::v1::GcItem;
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Durability, Owner};
use futures_util::{StreamExt, stream::FuturesUnordered};
use rscni_types::version::SpecVersion;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::*;
use crate::{
    addrs::Releasing,
    clock::now,
    core::births::{Born, GcStart},
    delegate::{
        Invocation,
        config::{DelegateConf, result_ips},
        store,
    },
    error::ShimError,
    keylock::KeyGuard,
    liveness::Verdict,
};

/// Stale records marked `deleting` per ledger commit. Bounds what a crash leaves for the next
/// start to release again (at most about a chunk and a half plus the DELs running), while
/// making the marks' disk writes a small share of a GC's time (one per 32 DELs).
pub const CHUNK: usize = 32;

/// How a GC run is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Only plan: say what would be freed and kept, and change nothing.
    pub dry_run: bool,
    /// Override the share interlock (`dipamctl gc --force`); nothing else does.
    pub force: bool,
    /// Who asked: the `by` of the history entry of each attachment it frees.
    pub by: crate::events::FreedBy,
}

/// Plans and (unless `run.dry_run`) runs GC of the network of `dc`. `began` is when the GC
/// began (its valid list was made before it): nothing an ADD finished since is freed
/// (core/births.rs).
///
/// The steps, in order: read what the delegate and the ledger hold (`read`), plan what to
/// keep and what is stale (`plan`), refuse what the share interlock forbids (`interlock`),
/// tell the orphans apart (`plan_orphans`), and release the rest (`release`).
pub async fn collect(
    c: &Collector,
    dc: &DelegateConf,
    cni_path: &str,
    valid: Valid,
    began: GcStart,
    run: Run,
) -> Result<Plan, ShimError> {
    // One GC of a network at a time; ADD, DEL and CHECK are not held up (keylock.rs).
    let _collection = c.core.locks.collection(&dc.network).await;
    let Read {
        seen,
        reservations,
        resolved,
    } = read(c, dc, cni_path).await?;
    let mut planned = plan(c, &seen, &valid, began);
    interlock(c, &dc.network, &seen.records, &planned.stale, run.force)?;
    let (probe, send) = resolved?;
    let orphans = plan_orphans(c, dc, &seen, reservations, &mut planned).await;
    if run.dry_run {
        return Ok(Plan {
            items: planned.items,
            kept: planned.kept,
        });
    }
    let delegate = Delegate {
        dc,
        cni_path,
        probe: &probe,
        send,
        by: run.by,
    };
    release(c, &delegate, &seen, planned, orphans, began).await
}

/// What a GC reads before it plans, in this order: the delegate (resolved), its store, then
/// the ledger and the keys with an operation in flight.
struct Read {
    seen: Seen,
    /// The delegate's store, where dipamd reads it (host-local's directory).
    reservations: Option<Vec<store::Reservation>>,
    resolved: Result<(crate::delegate::Probe, Option<SpecVersion>), ShimError>,
}

/// The network as the plan sees it.
struct Seen {
    /// The delegate has its own GC (CNI 1.1): no store to read, its GC runs instead.
    native_gc: bool,
    dir: Option<std::path::PathBuf>,
    records: Vec<AttachmentRecord>,
    busy: HashSet<AttachmentKey>,
}

/// Reads the delegate's store BEFORE the ledger. Every reservation is made after its
/// attachment's intent is durable (core/attach.rs), so a reservation read here belongs to a
/// record the list below contains (kept while in flight), and one made after this read is
/// not looked at: an ADD running beside this GC is never taken for an orphan.
async fn read(c: &Collector, dc: &DelegateConf, cni_path: &str) -> Result<Read, ShimError> {
    let network = dc.network.clone();
    let resolved = c.core.resolve(dc, cni_path).await;
    let native_gc = resolved
        .as_ref()
        .is_ok_and(|(probe, _)| probe.supported.contains(&SpecVersion::new(1, 1, 0)));
    let dir = if native_gc {
        None
    } else {
        store::readable_dir(&dc.kind, &dc.conf, &network)
    };
    let reservations = match &dir {
        // A file read per address: off the async workers that serve the pods' ADDs.
        Some(d) => {
            let d = d.clone();
            Some(
                store::read(d.clone())
                    .await
                    .map_err(|e| ShimError::Internal(format!("reading {}: {e}", d.display())))?,
            )
        }
        None => None,
    };
    // Test builds: hold the GC here, after it began and before it reads the ledger, for an
    // ADD to finish in between (the window in which one was freed, chaos.rs).
    crate::fault::pause("gc-before-read").await;
    let net = network.clone();
    let records: Vec<AttachmentRecord> = c.core.ledger(move |l| l.list(Some(&net))).await?;
    // Keys with an operation in flight (held or awaited): kept, like `adding`/`deleting`.
    let busy: HashSet<AttachmentKey> = c
        .core
        .locks
        .in_flight()
        .into_iter()
        .filter(|k| k.network == network)
        .collect();
    Ok(Read {
        seen: Seen {
            native_gc,
            dir,
            records,
            busy,
        },
        reservations,
        resolved,
    })
}

/// The plan over the ledger: what is kept and why, and what is stale.
struct Planned<'a> {
    /// The valid set: the runtime's list, or every record (`--use-ledger`).
    listed: HashSet<(String, String)>,
    /// What the delegate is told to keep, and its store compared with: the valid set, every
    /// kept record, and the delegate's key of each (a pod served from the warm pool).
    delegate_keep: HashSet<(String, String)>,
    stale: Vec<&'a AttachmentRecord>,
    /// One per stale record, in `stale`'s order, then one per orphan.
    items: Vec<GcItem>,
    kept: Vec<GcItem>,
}

/// The delegate's key of a record: what its store holds the reservation under.
fn delegate_pair(r: &AttachmentRecord) -> (String, String) {
    let (c, i) = r.delegate_ids();
    (c.to_owned(), i.to_owned())
}

/// Every reason a record is kept, as (code, text) for `dipamctl gc --dry-run`; none: stale.
fn reasons(
    c: &Collector,
    r: &AttachmentRecord,
    listed: &HashSet<(String, String)>,
    valid: &Valid,
    busy: &HashSet<AttachmentKey>,
    began: GcStart,
    t: u64,
) -> Vec<(&'static str, String)> {
    let grace = c.gc.policy.grace.as_secs();
    let mut why: Vec<(&str, String)> = Vec::new();
    if listed.contains(&(r.key.container_id.clone(), r.key.ifname.clone())) {
        why.push((
            "valid-list",
            match valid {
                Valid::List(_) => "in the valid list".into(),
                Valid::Ledger => "in the ledger (--use-ledger)".into(),
            },
        ));
    }
    match &r.owner {
        Owner::Agent { role } => why.push(("agent", format!("the agent's {role} address"))),
        Owner::Pool => why.push(("pool", "a warm-pool entry".into())),
        Owner::Pod => {}
    }
    if r.state != AttachmentState::Committed {
        why.push(interrupted(r));
    } else if busy.contains(&r.key) {
        why.push((
            "in-flight",
            "an operation on it is in flight (its key is locked)".into(),
        ));
    }
    if let Some(text) = born_after(c, &r.key, began) {
        why.push((BORN_AFTER_GC, text.into()));
    }
    let old = t.saturating_sub(r.created_at);
    if old < grace {
        why.push((
            "grace",
            format!(
                "added {} ago, inside the grace period (--gc-grace {grace}s)",
                age(old)
            ),
        ));
    }
    why
}

/// Sorts the ledger's records of the network into kept (with every reason) and stale.
fn plan<'a>(c: &Collector, seen: &'a Seen, valid: &Valid, began: GcStart) -> Planned<'a> {
    let records = &seen.records;
    let t = now();
    let listed: HashSet<(String, String)> = match valid {
        Valid::List(l) => l.iter().cloned().collect(),
        Valid::Ledger => records
            .iter()
            .map(|r| (r.key.container_id.clone(), r.key.ifname.clone()))
            .collect(),
    };
    let mut keep: HashSet<(String, String)> = HashSet::new();
    let mut kept_items = Vec::new();
    let mut stale: Vec<&AttachmentRecord> = Vec::new();
    for r in records {
        let why = reasons(c, r, &listed, valid, &seen.busy, began, t);
        if why.is_empty() {
            stale.push(r);
            continue;
        }
        keep.insert((r.key.container_id.clone(), r.key.ifname.clone()));
        kept_items.push(kept(
            "ledger",
            &r.key.container_id,
            &r.key.ifname,
            r.result.as_ref().map(result_ips).unwrap_or_default(),
            why,
        ));
    }
    keep.extend(listed.iter().cloned());
    let delegate_keep: HashSet<(String, String)> = keep
        .iter()
        .cloned()
        .chain(
            records
                .iter()
                .filter(|r| keep.contains(&(r.key.container_id.clone(), r.key.ifname.clone())))
                .map(delegate_pair),
        )
        .collect();
    let items = stale.iter().map(|r| stale_item(r, t)).collect();
    Planned {
        listed,
        delegate_keep,
        stale,
        items,
        kept: kept_items,
    }
}

/// The plan's line for a stale record.
fn stale_item(r: &AttachmentRecord, t: u64) -> GcItem {
    item(
        "ledger",
        &r.key.container_id,
        &r.key.ifname,
        r.result.as_ref().map(result_ips).unwrap_or_default(),
        format!(
            "not in the valid list; added {} ago{}",
            age(t.saturating_sub(r.created_at)),
            r.delegate_key
                .as_ref()
                .map(|d| format!(
                    "; {} holds it as {}/{}",
                    r.delegate_type, d.container_id, d.ifname
                ))
                .unwrap_or_default()
        ),
    )
}

/// The share interlock (calico#5044: a bad list once freed every healthy pod). It holds at
/// every size: freeing the only pod of a network, or both of two, is exactly what a
/// truncated list does, so it takes an operator's --force (or --gc-max-free-share 1).
fn interlock(
    c: &Collector,
    network: &str,
    records: &[AttachmentRecord],
    stale: &[&AttachmentRecord],
    force: bool,
) -> Result<(), ShimError> {
    let pods = records
        .iter()
        .filter(|r| r.owner == Owner::Pod && r.state == AttachmentState::Committed)
        .count();
    if !force && !stale.is_empty() && stale.len() as f64 > c.gc.policy.max_free_share * pods as f64
    {
        c.gc.stats
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.core.events.emit(crate::events::Event::GcRefused);
        return Err(ShimError::GcRefused {
            network: network.to_owned(),
            reason: format!(
                "it would free {} of the network's {pods} pod attachments, more than the \
                 allowed share {:.0}% (dipamd --gc-max-free-share; `dipamctl gc --force \
                 --dry-run` shows what it would free, and without --dry-run frees it)",
                stale.len(),
                c.gc.policy.max_free_share * 100.0
            ),
        });
    }
    Ok(())
}

/// Orphans: reservations in the delegate's own store, unknown to the ledger and to the valid
/// set. Kept when listed, young, or not shown unused; the rest are planned for release
/// (their items appended after the stale records') and returned.
async fn plan_orphans(
    c: &Collector,
    dc: &DelegateConf,
    seen: &Seen,
    reservations: Option<Vec<store::Reservation>>,
    planned: &mut Planned<'_>,
) -> Vec<store::Reservation> {
    let (Some(dir), Some(reservations)) = (&seen.dir, reservations) else {
        return Vec::new();
    };
    let grace = c.gc.policy.grace.as_secs();
    let delegate_keep = &planned.delegate_keep;
    let known: HashSet<(String, String)> = seen.records.iter().map(delegate_pair).collect();
    let known_ids: HashSet<&str> = known.iter().map(|(c, _)| c.as_str()).collect();
    let keep_ids: HashSet<&str> = delegate_keep.iter().map(|(c, _)| c.as_str()).collect();
    let mut candidates = Vec::new();
    for r in reservations {
        let pair = (r.container_id.clone(), r.ifname.clone());
        // Legacy id-only files (empty ifname) match by container ID.
        let (recorded, listed) = if r.ifname.is_empty() {
            (
                known_ids.contains(r.container_id.as_str()),
                keep_ids.contains(r.container_id.as_str()),
            )
        } else {
            (known.contains(&pair), delegate_keep.contains(&pair))
        };
        if recorded {
            // The ledger's record stands for it (kept or collected above).
            continue;
        }
        let age = r
            .modified
            .and_then(|m| SystemTime::now().duration_since(m).ok());
        let young = age.is_some_and(|d| d < c.gc.policy.grace);
        if listed || young {
            let mut why = Vec::new();
            if listed {
                why.push((
                    "valid-list",
                    format!(
                        "held by {} and in the valid list, unknown to dipamd",
                        dc.kind
                    ),
                ));
            }
            if young {
                why.push((
                    "grace",
                    format!(
                        "reserved {} ago, inside the grace period (--gc-grace {grace}s)",
                        self::age(age.map_or(0, |d| d.as_secs()))
                    ),
                ));
            }
            planned.kept.push(kept(
                "orphan",
                &r.container_id,
                &r.ifname,
                vec![r.ip.to_string()],
                why,
            ));
            continue;
        }
        candidates.push(r);
    }
    // An unrecorded reservation is freed only when nothing on the node uses its address
    // (liveness.rs): a running pod dipamd never saw (a node adopted with pods running)
    // lost its address to the next pod when this freed it.
    let scan = match candidates.is_empty() {
        true => crate::liveness::Scan::default(),
        false => c.gc.scan().await,
    };
    let mut orphans = Vec::new();
    for r in candidates {
        let kept_why = match scan.verdict(r.ip, &r.container_id) {
            Verdict::Dead => None,
            Verdict::Alive(why) => Some(("alive", format!("{why}: adopt it, never free it"))),
            Verdict::Unknown(why) => Some(("unverified", format!("not shown unused: {why}"))),
        };
        if let Some(why) = kept_why {
            planned.kept.push(kept(
                "orphan",
                &r.container_id,
                &r.ifname,
                vec![r.ip.to_string()],
                vec![why],
            ));
            continue;
        }
        planned.items.push(item(
            "orphan",
            &r.container_id,
            &r.ifname,
            vec![r.ip.to_string()],
            format!(
                "held by {} in {} but unknown to dipamd and not in the valid list; nothing \
                 on the node uses it",
                dc.kind,
                dir.display()
            ),
        ));
        orphans.push(r);
    }
    orphans
}

/// The network's delegate, resolved once for every exec of the release.
struct Delegate<'a> {
    dc: &'a DelegateConf,
    cni_path: &'a str,
    probe: &'a crate::delegate::Probe,
    send: Option<SpecVersion>,
    /// Who asked for the GC (the history's `by` of what it frees).
    by: crate::events::FreedBy,
}

/// Runs the plan: the stale records' DELs, the delegate's own GC where it has one, the
/// orphans' DELs; then what an operation took up after the plan is kept after all, and said
/// so.
async fn release(
    c: &Collector,
    d: &Delegate<'_>,
    seen: &Seen,
    planned: Planned<'_>,
    orphans: Vec<store::Reservation>,
    began: GcStart,
) -> Result<Plan, ShimError> {
    let Planned {
        listed,
        stale,
        mut items,
        mut kept,
        ..
    } = planned;
    let parallel = c.gc.policy.parallel.max(1);
    let n = stale.len();
    let chosen: Vec<AttachmentRecord> = stale.iter().map(|r| (*r).clone()).collect();
    let mut busy_now = release_stale(c, d, chosen, began, parallel, &mut items[..n]).await;
    if seen.native_gc {
        native_gc(c, d, &listed, &stale, &busy_now).await?;
    }
    let outcomes = release_orphans(c, d, &orphans, parallel).await;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Released::Freed => finish(c, d, &mut items[n + i], Ok(())),
            Released::Failed(e) => finish(c, d, &mut items[n + i], Err(e)),
            Released::Busy(code, why) => busy_now.push((n + i, code, why)),
        }
    }
    // What an operation took up after the plan is kept after all, and said so.
    busy_now.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (i, code, why) in busy_now {
        let it = items.remove(i);
        kept.push(GcItem {
            outcome: "kept".into(),
            keep: vec![code.into()],
            reason: why.into(),
            ..it
        });
    }
    Ok(Plan { items, kept })
}

/// The delegate's own GC. It frees everything its list does not name, so the list must name
/// every attachment that exists when it runs: the network is held exclusively for this one
/// exec (in-flight operations finish first, new ones wait), and the ledger is read again
/// under it. Kept: the valid list and every record but those this GC chose to free (an ADD
/// that started since the plan is in the ledger, as its intent).
async fn native_gc(
    c: &Collector,
    d: &Delegate<'_>,
    listed: &HashSet<(String, String)>,
    stale: &[&AttachmentRecord],
    busy_now: &[(usize, &'static str, &'static str)],
) -> Result<(), ShimError> {
    let network = d.dc.network.clone();
    let _exclusive = c.core.locks.exclusive(&network).await;
    let net = network.clone();
    let now_records: Vec<AttachmentRecord> = c.core.ledger(move |l| l.list(Some(&net))).await?;
    let chosen: HashSet<&AttachmentKey> = stale
        .iter()
        .enumerate()
        .filter(|(i, _)| !busy_now.iter().any(|(b, _, _)| b == i))
        .map(|(_, r)| &r.key)
        .collect();
    let delegate_keep: HashSet<(String, String)> = listed
        .iter()
        .cloned()
        .chain(
            now_records
                .iter()
                .filter(|r| !chosen.contains(&r.key))
                .flat_map(|r| {
                    [
                        (r.key.container_id.clone(), r.key.ifname.clone()),
                        delegate_pair(r),
                    ]
                }),
        )
        .collect();
    let mut conf = d.dc.conf.clone();
    let list: Vec<Value> = delegate_keep
        .iter()
        .map(|(c, i)| json!({"containerID": c, "ifname": i}))
        .collect();
    conf["cni.dev/valid-attachments"] = Value::Array(list.clone());
    conf["cni.dev/attachments"] = Value::Array(list);
    let inv = Invocation {
        command: "GC".into(),
        path: c.core.exec.delegate_cni_path(d.cni_path),
        stdin: serde_json::to_vec(&conf).map_err(|e| ShimError::Internal(e.to_string()))?,
        ..Invocation::default()
    };
    c.core.exec.call(&d.dc.kind, d.probe, &inv).await?;
    info!(network = %network, delegate = %d.dc.kind, kept = delegate_keep.len(), "delegate GC run with the augmented valid list");
    Ok(())
}

/// The orphans' DELs, `parallel` at a time (fewer while a pod's operation is in flight), with
/// the network's config stripped of any valid list; one outcome per orphan, in order.
async fn release_orphans(
    c: &Collector,
    d: &Delegate<'_>,
    orphans: &[store::Reservation],
    parallel: usize,
) -> Vec<Released> {
    let network = &d.dc.network;
    let mut conf = d.dc.conf.clone();
    if let Some(o) = conf.as_object_mut() {
        o.remove("cni.dev/valid-attachments");
        o.remove("cni.dev/attachments");
    }
    let stripped = DelegateConf {
        conf,
        ..d.dc.clone()
    };
    match stripped.bytes_for(d.send) {
        _ if orphans.is_empty() => Vec::new(),
        Ok(stdin) => {
            let mut outcomes: Vec<Option<Released>> = orphans.iter().map(|_| None).collect();
            let mut next = orphans.iter().enumerate();
            let mut running = FuturesUnordered::new();
            loop {
                while running.len() < limit(c, network, parallel)
                    && let Some((i, r)) = next.next()
                {
                    let (probe, kind, stdin) = (d.probe, &d.dc.kind, &stdin);
                    running.push(async move {
                        let outcome =
                            release_orphan(c, network, r, probe, d.cni_path, kind, stdin).await;
                        (i, outcome)
                    });
                }
                match running.next().await {
                    Some((i, outcome)) => outcomes[i] = Some(outcome),
                    None => break,
                }
            }
            outcomes
                .into_iter()
                .map(|o| o.unwrap_or(Released::Busy(IN_FLIGHT, "not reached")))
                .collect()
        }
        Err(e) => {
            let e = e.to_string();
            orphans
                .iter()
                .map(|_| Released::Failed(ShimError::Internal(e.clone())))
                .collect()
        }
    }
}

/// How many delegate DELs may run now: `parallel`, or one while an operation (a pod's ADD,
/// say) is in flight on the network. host-local serialises every ADD and DEL of a network on
/// one directory lock and walks the whole directory under it, so an ADD queues behind every
/// DEL in flight and shares the CPUs with them; with one DEL left it waits for at most that
/// one (docs/performance.md, run 13). The GC goes on at full speed once the ADD is done,
/// checked each time a DEL ends.
fn limit(c: &Collector, network: &str, parallel: usize) -> usize {
    if c.core.locks.operations(network) > 0 {
        1
    } else {
        parallel
    }
}

/// What became of one attachment GC chose to free.
enum Released {
    /// Released through the delegate, and its record (if any) forgotten.
    Freed,
    Failed(ShimError),
    /// An operation took it up after the plan (its key locked, its record changed, an ADD
    /// finished on it after the GC began): kept, with the reason's code and text.
    Busy(&'static str, &'static str),
}

/// The `keep` code of an attachment an operation holds or held.
const IN_FLIGHT: &str = "in-flight";
/// The `keep` code of an attachment whose ADD finished after the GC began (core/births.rs).
pub const BORN_AFTER_GC: &str = "born-after-gc";

/// Why `key` is kept for having been born after the GC began, if it was (or may have been).
fn born_after(c: &Collector, key: &AttachmentKey, began: GcStart) -> Option<&'static str> {
    match c.core.births.born(key, began) {
        Born::Before => None,
        Born::After => Some(
            "its ADD finished after this GC began: the valid list, made before, cannot name it",
        ),
        Born::Unknown => Some(
            "dipamd cannot tell whether its ADD finished before this GC began (the GC began \
             before dipamd started, or longer ago than dipamd remembers ADDs); the next GC \
             decides",
        ),
    }
}

/// A stale record, marked `deleting`, its key locked and its addresses marked as being
/// released, waiting for or running its delegate DEL.
struct Job<'a> {
    idx: usize,
    rec: AttachmentRecord,
    _guard: KeyGuard<'a>,
    _releasing: Releasing<'a>,
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// A chunk being marked: its jobs, and the records skipped (busy, changed) with why.
type Marking<'a> = Boxed<'a, (Vec<Job<'a>>, Vec<(usize, Released)>)>;
/// A group commit forgetting released records: their jobs, and the commit's outcome.
type Forgetting<'a> = Boxed<'a, (Vec<Job<'a>>, Result<(), ShimError>)>;

/// Releases the `planned` stale records, `parallel` delegate DELs at a time, and finishes
/// each one's item (`items[i]` is `planned[i]`'s) the moment its outcome is certain: "GC
/// freed" is logged once the record is gone, before an ADD waiting for its address goes on.
/// Returns the items an operation took up after the plan (kept), with the reason. See the
/// module's documentation for the order of the writes.
async fn release_stale(
    c: &Collector,
    d: &Delegate<'_>,
    planned: Vec<AttachmentRecord>,
    began: GcStart,
    parallel: usize,
    items: &mut [GcItem],
) -> Vec<(usize, &'static str, &'static str)> {
    let network = planned
        .first()
        .map(|r| r.key.network.clone())
        .unwrap_or_default();
    let network = network.as_str();
    let mut busy = Vec::new();
    let mut settle = |i: usize, outcome: Released| match outcome {
        Released::Freed => finish(c, d, &mut items[i], Ok(())),
        Released::Failed(e) => finish(c, d, &mut items[i], Err(e)),
        Released::Busy(code, why) => busy.push((i, code, why)),
    };
    let mut chunks = planned
        .into_iter()
        .enumerate()
        .collect::<Vec<_>>()
        .chunks(CHUNK)
        .map(<[_]>::to_vec)
        .collect::<VecDeque<_>>();
    let mut ready: VecDeque<Job<'_>> = VecDeque::new();
    let mut marking: Option<Marking<'_>> = None;
    let mut running = FuturesUnordered::new();
    let mut freed: Vec<Job<'_>> = Vec::new();
    let mut forgetting: Option<Forgetting<'_>> = None;
    loop {
        // The next chunk is marked while the DELs of this one run, so a slot never waits for
        // a mark's disk write.
        if marking.is_none()
            && ready.len() <= CHUNK / 2
            && let Some(chunk) = chunks.pop_front()
        {
            marking = Some(Box::pin(mark(c, chunk, began)));
        }
        while running.len() < limit(c, network, parallel)
            && let Some(job) = ready.pop_front()
        {
            running.push(async move {
                // Main mode: the pod's veth and host route go with its address.
                c.retire_datapath(&job.rec).await;
                let outcome = c.core.release_recorded(&job.rec).await;
                (job, outcome)
            });
        }
        // Group commit: whatever was freed while the last commit ran is forgotten in one.
        // Into the kernel while more releases follow, onto the disk with the last one
        // (docs/cfp.md §7.5, "commits stop at the kernel"): a forget a power cut takes back
        // leaves its record `deleting`, which is on the disk, and the next start releases it
        // again (the delegate answers success for what it no longer holds) and forgets it.
        // A forget per DEL or two, each with an fdatasync, was hundreds of device flushes per
        // GC of 1,000, beside the intent commits of the pods' ADDs on the same journal.
        if forgetting.is_none() && !freed.is_empty() {
            let jobs = std::mem::take(&mut freed);
            let last =
                running.is_empty() && ready.is_empty() && chunks.is_empty() && marking.is_none();
            let durability = if last {
                Durability::SurvivesPowerCut
            } else {
                Durability::SurvivesProcessCrash
            };
            forgetting = Some(Box::pin(async move {
                crate::fault::hit("gc-before-forget");
                let recs: Vec<AttachmentRecord> = jobs.iter().map(|j| j.rec.clone()).collect();
                let outcome = c.core.forget_all(&recs, durability).await;
                (jobs, outcome)
            }));
        }
        if marking.is_none() && running.is_empty() && forgetting.is_none() {
            break;
        }
        tokio::select! {
            Some((job, outcome)) = running.next(), if !running.is_empty() => match outcome {
                Ok(()) => freed.push(job),
                // The record stays `deleting`: the delegate may still hold the address, and
                // the next start (or the key's next operation) releases it again.
                Err(e) => settle(job.idx, Released::Failed(e)),
            },
            (jobs, skipped) = async { marking.as_mut().expect("guarded").await }, if marking.is_some() => {
                marking = None;
                ready.extend(jobs);
                for (i, r) in skipped {
                    settle(i, r);
                }
            },
            (jobs, outcome) = async { forgetting.as_mut().expect("guarded").await }, if forgetting.is_some() => {
                forgetting = None;
                for job in jobs {
                    settle(job.idx, match &outcome {
                        Ok(()) => Released::Freed,
                        // Released, but still recorded (`deleting`): the next start forgets it.
                        Err(e) => Released::Failed(ShimError::Internal(format!(
                            "released, but its record could not be dropped: {e}"
                        ))),
                    });
                    // The key lock and the address marks go only now: until the record is
                    // gone, an operation on the key or an ADD handed the address waits.
                    drop(job);
                }
            },
        }
    }
    busy
}

/// Takes the key locks of a chunk of stale records (skipping any key an operation holds, any
/// record that changed since the plan, and any an ADD finished on after the GC `began`),
/// marks them `deleting` in one durable commit, and marks their addresses as being released.
async fn mark<'a>(
    c: &'a Collector,
    chunk: Vec<(usize, AttachmentRecord)>,
    began: GcStart,
) -> (Vec<Job<'a>>, Vec<(usize, Released)>) {
    let mut locked = Vec::new();
    let mut skipped = Vec::new();
    for (idx, planned) in chunk {
        let Some(guard) = c.core.locks.try_lock(&planned.key) else {
            skipped.push((
                idx,
                Released::Busy(
                    IN_FLIGHT,
                    "an operation on it started after the plan (its key is locked)",
                ),
            ));
            continue;
        };
        // Under the key's lock: an ADD still running holds it (above), and one that is done
        // stamped its key before letting go (rpc/add.rs), so none can slip between this check
        // and the release.
        if let Some(why) = born_after(c, &planned.key, began) {
            skipped.push((idx, Released::Busy(BORN_AFTER_GC, why)));
            continue;
        }
        match c.core.lookup(&planned.key) {
            Ok(Some(current)) if current == planned => locked.push((idx, planned, guard)),
            Ok(_) => skipped.push((
                idx,
                Released::Busy(
                    IN_FLIGHT,
                    "its record changed after the plan (an operation ran on it)",
                ),
            )),
            Err(e) => skipped.push((idx, Released::Failed(e))),
        }
    }
    let t = now();
    let marked: Vec<AttachmentRecord> = locked
        .iter()
        .map(|(_, r, _)| AttachmentRecord {
            state: AttachmentState::Deleting,
            updated_at: t,
            ..r.clone()
        })
        .collect();
    if !marked.is_empty() {
        let commit = marked.clone();
        // On the disk before any of these DELs starts: the write-ahead mark of every release.
        if let Err(e) = c
            .core
            .ledger(move |l| l.put_all(&commit, Durability::SurvivesPowerCut))
            .await
        {
            let e = e.to_string();
            for (idx, _, _) in locked {
                skipped.push((
                    idx,
                    Released::Failed(ShimError::Internal(format!(
                        "could not mark it deleting: {e}"
                    ))),
                ));
            }
            return (Vec::new(), skipped);
        }
        crate::fault::hit("gc-after-mark");
    }
    let jobs = locked
        .into_iter()
        .zip(marked)
        .map(|((idx, _, guard), rec)| Job {
            idx,
            _releasing: c.core.addrs.releasing(&rec),
            rec,
            _guard: guard,
        })
        .collect();
    (jobs, skipped)
}

/// Releases a reservation the delegate holds behind dipamd's back, under its own key's lock
/// (busy: kept) and only if the ledger still does not know that key.
async fn release_orphan(
    c: &Collector,
    network: &str,
    r: &store::Reservation,
    probe: &crate::delegate::Probe,
    cni_path: &str,
    kind: &str,
    stdin: &[u8],
) -> Released {
    // host-local releases `<id>\r\n<ifname>`, and falls back to legacy id-only files when
    // nothing matches: any valid ifname reaches those.
    let ifname = if r.ifname.is_empty() {
        "eth0".to_owned()
    } else {
        r.ifname.clone()
    };
    let key = AttachmentKey::new(network, &r.container_id, &ifname);
    let Some(_guard) = c.core.locks.try_lock(&key) else {
        return Released::Busy(IN_FLIGHT, "an operation on its key started after the plan");
    };
    match c.core.lookup(&key) {
        Ok(None) => {}
        Ok(Some(_)) => {
            return Released::Busy(IN_FLIGHT, "recorded by an ADD that started after the plan");
        }
        Err(e) => return Released::Failed(e),
    }
    let _releasing = c.core.addrs.releasing_ips(&key, vec![r.ip]);
    let inv = Invocation {
        command: "DEL".into(),
        container_id: r.container_id.clone(),
        ifname,
        path: c.core.exec.delegate_cni_path(cni_path),
        stdin: stdin.to_vec(),
        ..Invocation::default()
    };
    match c.core.exec.call(kind, probe, &inv).await {
        Ok(_) => Released::Freed,
        Err(e) => Released::Failed(e),
    }
}

/// One item's outcome: counted, logged, and (freed) recorded in its container's history
/// with who asked for the GC.
fn finish(c: &Collector, d: &Delegate<'_>, it: &mut GcItem, outcome: Result<(), ShimError>) {
    match outcome {
        Ok(()) => {
            it.outcome = "freed".into();
            c.gc.stats
                .freed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            c.core.events.emit(crate::events::Event::GcFreed(1));
            info!(kind = %it.kind, container_id = %it.container_id, ifname = %it.ifname, ips = ?it.ips, reason = %it.reason, by = %d.by, "GC freed");
            let reason = format!("{} ({})", gc_reason(d.by), it.reason);
            c.core.events.freed(
                d.by,
                &crate::events::Freeing {
                    network: &d.dc.network,
                    container_id: &it.container_id,
                    ifname: &it.ifname,
                    ips: it.ips.clone(),
                    reason: &reason,
                    request_id: "",
                    // What GC frees from the delegate's store is no caller's record.
                    uid: None,
                },
            );
        }
        Err(e) => {
            it.outcome = "failed".into();
            it.error = e.to_string();
            warn!(kind = %it.kind, container_id = %it.container_id, error = %e, "GC could not free; carrying on");
        }
    }
}

/// What a GC asked for by `by` is, for the history entry of what it frees.
fn gc_reason(by: crate::events::FreedBy) -> &'static str {
    use crate::events::FreedBy as B;
    match by {
        B::CniGc => "a CNI GC from the runtime: not in its valid list",
        B::RuntimeGc => {
            "the runtime-aware GC: made through CRI, and the runtime listed no sandbox for it \
             in two passes"
        }
        B::Operator => "`dipamctl gc`",
        B::Reconcile => "the reconcile (--reconcile-free): a reservation no record knows",
        _ => "a GC",
    }
}

#[cfg(test)]
mod tests {
    use dipam_state::{AttachmentKey, MemStore};

    use super::*;
    use crate::testing::{node_with, record as rec, request, script, scripted_node};

    /// A run by an operator: `dry_run` and `force` as `dipamctl gc` gives them.
    fn run(dry_run: bool, force: bool) -> Run {
        Run {
            dry_run,
            force,
            by: crate::events::FreedBy::Operator,
        }
    }

    async fn bench(
        records: Vec<AttachmentRecord>,
    ) -> (
        tempfile::TempDir,
        std::sync::Arc<crate::node::Node>,
        DelegateConf,
    ) {
        let (dir, node) = node_with(&script(""), records).await;
        let dc = node
            .prepare(
                request("", "1.1.0", json!({})),
                false,
                crate::access::Caller::ROOT,
            )
            .unwrap()
            .dc;
        (dir, node, dc)
    }

    fn list(ids: &[&str]) -> Valid {
        Valid::List(
            ids.iter()
                .map(|c| ((*c).to_owned(), "eth0".to_owned()))
                .collect(),
        )
    }

    #[tokio::test]
    async fn a_plan_says_why_it_keeps_each_attachment() {
        let old = now() - 1000; // older than the default grace (60 s)
        let (_d, node, dc) = bench(vec![
            rec("listed", Owner::Pod, AttachmentState::Committed, old),
            rec("stale", Owner::Pod, AttachmentState::Committed, old),
            rec("young", Owner::Pod, AttachmentState::Committed, now()),
            rec("busy", Owner::Pod, AttachmentState::Adding, old),
            rec(
                "dipam-router-ipv4-n1",
                Owner::Agent {
                    role: "router".into(),
                },
                AttachmentState::Committed,
                old,
            ),
            rec(
                "dipam-pool-n1-0",
                Owner::Pool,
                AttachmentState::Committed,
                old,
            ),
        ])
        .await;
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["listed"]),
            node.core.births.gc_began(None, None),
            run(true, false),
        )
        .await
        .unwrap();
        let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
        assert_eq!(freed, vec!["stale"]);
        assert_eq!(plan.items[0].outcome, "planned");
        let mut kept: Vec<_> = plan
            .kept
            .iter()
            .map(|i| {
                assert_eq!(i.outcome, "kept");
                assert!(!i.reason.is_empty());
                (i.container_id.as_str(), i.keep.join(","))
            })
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            vec![
                ("busy", "in-flight".to_owned()),
                ("dipam-pool-n1-0", "pool".to_owned()),
                ("dipam-router-ipv4-n1", "agent".to_owned()),
                ("listed", "valid-list".to_owned()),
                ("young", "grace".to_owned()),
            ]
        );
        assert!(
            node.core
                .lookup(&AttachmentKey::new("net", "stale", "eth0"))
                .unwrap()
                .is_some(),
            "a dry run freed"
        );
    }

    /// The rule of core/births.rs against the wall clock stepping either way between an ADD
    /// and a GC. Ages come from the wall clock (`created_at`), so a step forward makes a pod
    /// ADDed a moment ago look an hour old (outside any grace period), and a step back makes
    /// one look as if it were ADDed in the future. Neither decides: a pod whose ADD finished
    /// after the GC began is kept, and one that finished before is freed, whatever the
    /// grace, through the plan and through the check under the key's lock.
    #[tokio::test]
    async fn an_add_finished_after_the_gc_began_is_kept_whatever_the_wall_clock_says() {
        let stepped_forward = now() - 3600;
        let stepped_back = now() + 3600;
        let (_d, node, dc) = bench(vec![
            rec(
                "keep",
                Owner::Pod,
                AttachmentState::Committed,
                stepped_forward,
            ),
            rec(
                "before",
                Owner::Pod,
                AttachmentState::Committed,
                stepped_forward,
            ),
            rec(
                "before-back",
                Owner::Pod,
                AttachmentState::Committed,
                stepped_back,
            ),
            rec(
                "fwd",
                Owner::Pod,
                AttachmentState::Committed,
                stepped_forward,
            ),
            rec("back", Owner::Pod, AttachmentState::Committed, stepped_back),
        ])
        .await;
        for c in ["keep", "before", "before-back"] {
            node.core
                .births
                .stamp(&AttachmentKey::new("net", c, "eth0"));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        let began = node.core.births.gc_began(None, None);
        for c in ["fwd", "back"] {
            node.core
                .births
                .stamp(&AttachmentKey::new("net", c, "eth0"));
        }
        // The default grace (60 s). Stepped forward, a pod born after the GC began would have
        // been freed as an hour old; stepped back, everything looks young (kept by grace,
        // as before).
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["keep"]),
            began,
            run(true, true),
        )
        .await
        .unwrap();
        let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
        assert_eq!(freed, vec!["before"], "{:?}", plan.kept);
        let codes = |c: &str| {
            let k = plan.kept.iter().find(|k| k.container_id == c).unwrap();
            k.keep.join(",")
        };
        assert_eq!(codes("fwd"), BORN_AFTER_GC);
        assert_eq!(codes("back"), format!("{BORN_AFTER_GC},grace"));
        assert_eq!(codes("before-back"), "grace");
        let fwd = plan.kept.iter().find(|k| k.container_id == "fwd").unwrap();
        assert!(fwd.reason.contains("after this GC began"), "{}", fwd.reason);
        // The check under the key's lock, for an ADD that finishes between the plan and the
        // mark: planned stale, then stamped, then kept.
        let planned = node
            .core
            .lookup(&AttachmentKey::new("net", "before", "eth0"))
            .unwrap()
            .unwrap();
        node.core.births.stamp(&planned.key);
        let c = node.collector();
        let (jobs, skipped) = mark(&c, vec![(0, planned.clone())], began).await;
        assert!(jobs.is_empty());
        assert!(
            matches!(skipped.as_slice(), [(0, Released::Busy(BORN_AFTER_GC, _))]),
            "marked an attachment born after the GC"
        );
        assert_eq!(
            node.core.lookup(&planned.key).unwrap().unwrap().state,
            AttachmentState::Committed
        );
        // The real GC frees nothing: "before" was ADDed again after it began (above), and
        // the rest are born after it or young.
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["keep"]),
            began,
            run(false, true),
        )
        .await
        .unwrap();
        let freed: Vec<_> = plan
            .items
            .iter()
            .filter(|i| i.outcome == "freed")
            .map(|i| i.container_id.as_str())
            .collect();
        assert!(freed.is_empty(), "{freed:?}");
        for c in ["keep", "before", "before-back", "fwd", "back"] {
            assert!(
                node.core
                    .lookup(&AttachmentKey::new("net", c, "eth0"))
                    .unwrap()
                    .is_some(),
                "{c} was freed"
            );
        }
    }

    #[tokio::test]
    async fn freeing_all_of_a_small_network_takes_force() {
        let old = now() - 1000;
        // One pod, not in the list: 1 of 1.
        let (_d, node, dc) = bench(vec![rec(
            "only",
            Owner::Pod,
            AttachmentState::Committed,
            old,
        )])
        .await;
        let e = collect(
            &node.collector(),
            &dc,
            "",
            list(&["other"]),
            node.core.births.gc_began(None, None),
            run(false, false),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
        assert!(
            node.core
                .lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_some()
        );
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["other"]),
            node.core.births.gc_began(None, None),
            run(false, true),
        )
        .await
        .unwrap();
        assert_eq!(plan.items[0].outcome, "freed", "{:?}", plan.items);
        assert!(
            node.core
                .lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_none()
        );

        // Two pods: both is refused, one of two is not.
        let (_d, node, dc) = bench(vec![
            rec("a", Owner::Pod, AttachmentState::Committed, old),
            rec("b", Owner::Pod, AttachmentState::Committed, old),
        ])
        .await;
        assert!(
            collect(
                &node.collector(),
                &dc,
                "",
                list(&["other"]),
                node.core.births.gc_began(None, None),
                run(false, false)
            )
            .await
            .is_err()
        );
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["a"]),
            node.core.births.gc_began(None, None),
            run(false, false),
        )
        .await
        .unwrap();
        assert_eq!(plan.items.len(), 1);
        assert_eq!(plan.items[0].container_id, "b");
        assert_eq!(plan.items[0].outcome, "freed");
    }

    /// A delegate whose DEL takes a while and logs how many DELs were running at once.
    const SLOW_DEL: &str = r#"#!/bin/sh
d=$(dirname "$0")
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
DEL)
  touch "$d/running.$CNI_CONTAINERID"
  ls "$d" | grep -c '^running\.' >> "$d/concurrency"
  sleep 0.05
  rm -f "$d/running.$CNI_CONTAINERID"
  echo "DEL $CNI_CONTAINERID" >> "$d/calls"
  ;;
esac
"#;

    fn rec_ip(cid: &str, ip: &str, created_at: u64) -> AttachmentRecord {
        AttachmentRecord {
            result: Some(json!({"cniVersion":"1.0.0","ips":[{"address": format!("{ip}/24")}]})),
            ..rec(cid, Owner::Pod, AttachmentState::Committed, created_at)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stale_records_are_released_in_parallel_bounded_and_forgotten() {
        let old = now() - 1000;
        let (dir, node) = scripted_node(SLOW_DEL, std::sync::Arc::new(MemStore::new()));
        let stale = CHUNK * 2 + 5; // more than one chunk of marks
        for i in 0..=stale {
            let r = rec_ip(
                &format!("c{i:03}"),
                &format!("10.9.{}.{}", i / 200, 1 + i % 200),
                old,
            );
            node.core.ledger(move |l| l.put(&r)).await.unwrap();
        }
        let dc = node
            .prepare(
                request("", "1.1.0", json!({})),
                false,
                crate::access::Caller::ROOT,
            )
            .unwrap()
            .dc;
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["c000"]),
            node.core.births.gc_began(None, None),
            run(false, true),
        )
        .await
        .unwrap();
        assert_eq!(plan.items.len(), stale);
        assert!(
            plan.items.iter().all(|i| i.outcome == "freed"),
            "{:?}",
            plan.items
        );
        let left = node.core.ledger(|l| l.list(None)).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].key.container_id, "c000");
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        assert_eq!(
            calls.lines().count(),
            stale,
            "each stale record DELed once: {calls}"
        );
        let most = std::fs::read_to_string(dir.path().join("concurrency"))
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().parse::<usize>().ok())
            .max()
            .unwrap();
        let parallel = node.gc.policy.parallel;
        assert!(
            most <= parallel,
            "{most} DELs at once, more than {parallel}"
        );
        assert!(most >= 2, "the DELs never overlapped");
        // Nothing is left marked as being released.
        assert!(
            !node
                .core
                .addrs
                .is_releasing("net", &"10.9.0.5".parse().unwrap())
        );
        assert!(node.core.locks.in_flight().is_empty());
    }

    #[tokio::test]
    async fn a_stale_record_whose_key_an_operation_holds_is_kept() {
        let old = now() - 1000;
        let (_d, node, dc) = bench(vec![
            rec("keep", Owner::Pod, AttachmentState::Committed, old),
            rec("a", Owner::Pod, AttachmentState::Committed, old),
            rec("b", Owner::Pod, AttachmentState::Committed, old),
        ])
        .await;
        let busy = AttachmentKey::new("net", "a", "eth0");
        let held = node.core.locks.lock(&busy).await;
        // Planned while held: kept, and said why.
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["keep"]),
            node.core.births.gc_began(None, None),
            run(true, true),
        )
        .await
        .unwrap();
        assert_eq!(plan.items.len(), 1, "{:?}", plan.items);
        assert!(
            plan.kept
                .iter()
                .any(|k| k.container_id == "a" && k.keep == vec!["in-flight".to_owned()])
        );
        let plan = collect(
            &node.collector(),
            &dc,
            "",
            list(&["keep"]),
            node.core.births.gc_began(None, None),
            run(false, true),
        )
        .await
        .unwrap();
        assert_eq!(plan.items.len(), 1);
        assert_eq!(plan.items[0].container_id, "b");
        assert_eq!(plan.items[0].outcome, "freed");
        assert!(
            node.core.lookup(&busy).unwrap().is_some(),
            "freed under a held key"
        );
        drop(held);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_add_on_the_network_does_not_wait_for_the_gc() {
        let old = now() - 1000;
        let (_dir, node) = scripted_node(SLOW_DEL, std::sync::Arc::new(MemStore::new()));
        for i in 0..40 {
            let r = rec_ip(&format!("s{i:02}"), &format!("10.9.0.{}", 10 + i), old);
            node.core.ledger(move |l| l.put(&r)).await.unwrap();
        }
        let dc = node
            .prepare(
                request("", "1.1.0", json!({})),
                false,
                crate::access::Caller::ROOT,
            )
            .unwrap()
            .dc;
        let gc = {
            let (node, dc) = (node.clone(), dc.clone());
            tokio::spawn(async move {
                collect(
                    &node.collector(),
                    &dc,
                    "",
                    list(&["s00"]),
                    node.core.births.gc_began(None, None),
                    run(false, true),
                )
                .await
            })
        };
        // Once the GC is releasing, another key of the network locks at once: GC holds
        // the keys it frees, not the network.
        while node.core.locks.in_flight().is_empty() {
            tokio::task::yield_now().await;
        }
        let other = AttachmentKey::new("net", "a-new-pod", "eth0");
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            node.core.locks.lock(&other),
        )
        .await;
        assert!(got.is_ok(), "an ADD's key lock waited for the GC");
        assert!(!gc.is_finished(), "the GC was over before the check");
        drop(got);
        let plan = gc.await.unwrap().unwrap();
        assert!(plan.items.iter().all(|i| i.outcome == "freed"));
    }
}
