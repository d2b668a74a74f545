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
use tracing::{Instrument, info, warn};

use super::*;
use crate::{
    l1_leaves::clock::now,
    l1_leaves::error::ShimError,
    l1_leaves::keylock::KeyGuard,
    l2_core::addrs::Releasing,
    l2_core::core::births::{Born, GcStart},
    l2_core::delegate::{
        Invocation,
        config::{DelegateConf, result_ips},
        store,
    },
    l3_clients::liveness::Verdict,
};
use orphans::{Reserved, plan_orphans, release_orphans};
use plan::{Names, Pair, Planned, plan};

/// Stale records marked `deleting` per ledger commit. Bounds what a crash leaves for the next
/// start to release again (at most about a chunk and a half plus the DELs running), while
/// making the marks' disk writes a small share of a GC's time (one per 32 DELs).
pub const CHUNK: usize = 32;

/// What a GC does with what it finds stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Free it, unless the share interlock refuses the whole GC.
    Free,
    /// Free it past the share interlock (`dipamctl gc --force`, the runtime-aware GC).
    FreeForced,
    /// Only plan: say what `Free` would free and keep, and change nothing (`--dry-run`).
    Plan,
    /// Only plan what `FreeForced` would free (`--dry-run --force`).
    PlanForced,
}

impl Mode {
    /// The mode `dipamctl gc`'s --dry-run and --force ask for.
    pub fn of(dry_run: bool, force: bool) -> Self {
        match (dry_run, force) {
            (false, false) => Self::Free,
            (false, true) => Self::FreeForced,
            (true, false) => Self::Plan,
            (true, true) => Self::PlanForced,
        }
    }

    fn plans_only(self) -> bool {
        matches!(self, Self::Plan | Self::PlanForced)
    }

    /// Past the share interlock; nothing but an operator's --force and the runtime-aware GC is.
    fn forced(self) -> bool {
        matches!(self, Self::FreeForced | Self::PlanForced)
    }
}

/// One GC, as every caller asks for it: the network (its delegate config, and the CNI_PATH
/// its delegate is found in), the valid set, when the GC began (its valid list was made
/// before it: nothing an ADD finished since is freed, core/births.rs), what to do, and who
/// asked (the `by` of the history entry of each attachment it frees).
pub struct Request<'a> {
    pub dc: &'a DelegateConf,
    pub cni_path: &'a str,
    pub valid: Valid,
    pub began: GcStart,
    pub mode: Mode,
    pub by: crate::l1_leaves::events::FreedBy,
    /// Whether the plan lists every record it keeps, with its reasons (`Plan::kept`): only
    /// the operator's `dipamctl gc` prints them; at 10,000 attachments the lines were
    /// megabytes that every other caller dropped (docs/performance.md, run 39).
    pub list_kept: bool,
}

/// Plans and (unless the mode only plans) runs the GC `req` asks for.
///
/// The steps, in order: read what the delegate and the ledger hold (`read`), plan what to
/// keep and what is stale (`plan`), refuse what the share interlock forbids (`interlock`),
/// tell the orphans apart (`plan_orphans`), and release the rest (`release`).
///
/// A GC that frees runs in a task of its own once it holds the network's GC lock, and the
/// caller only awaits it: the plugin gives up after its `timeoutSeconds` (55 s; a GC of
/// thousands of stale attachments on a loaded node took longer, docs/performance.md run 29),
/// tonic then drops this future, and a GC dropped mid-release left the records it had marked
/// `deleting` waiting for dipamd's next start, and the runtime's next GC redoing the plan from
/// the start. The waits before it (the lock, a [`Gc::running`] slot) are the caller's own:
/// one that hangs up while another GC of the network runs leaves nothing behind, so calling
/// and hanging up again and again holds at most one GC per network and [`RUNNING`] in all
/// (docs/cfp.md §7.4). The same shape as an ADD's (l6_transport/service.rs): the work in a
/// task, the caller's presence an `Arc` the task can see go.
pub async fn collect(c: &Collector, req: Request<'_>) -> Result<Plan, ShimError> {
    // One GC of a network at a time; ADD, DEL and CHECK are not held up (keylock.rs).
    let collection = c.core.locks.collection(&req.dc.network).await;
    if req.mode.plans_only() {
        // Changes nothing: nothing to finish if its caller leaves.
        return collect_locked(c, req).await;
    }
    let slot = std::sync::Arc::clone(&c.gc.running)
        .acquire_owned()
        .await
        .map_err(|e| ShimError::Internal(format!("GC slots: {e}")))?;
    let owned = Owned {
        dc: req.dc.clone(),
        cni_path: req.cni_path.to_owned(),
        valid: req.valid,
        began: req.began,
        mode: req.mode,
        by: req.by,
        list_kept: req.list_kept,
    };
    let c = c.clone();
    // Lives as long as the caller's wait: the task tells by it whether anyone heard its end.
    let waiting = std::sync::Arc::new(());
    let heard = std::sync::Arc::downgrade(&waiting);
    let task = tokio::spawn(async move {
        // Both held to the GC's end, whether or not its caller is still there.
        let _held = (collection, slot);
        let req = Request {
            dc: &owned.dc,
            cni_path: &owned.cni_path,
            valid: owned.valid,
            began: owned.began,
            mode: owned.mode,
            by: owned.by,
            list_kept: owned.list_kept,
        };
        let out = collect_locked(&c, req).await;
        if heard.strong_count() == 0 {
            // Nobody reads the reply: this line is what tells the operator the GC finished.
            match &out {
                Ok(plan) => info!(
                    network = %owned.dc.network,
                    freed = plan.items.iter().filter(|i| i.outcome == "freed").count(),
                    failed = plan.items.iter().filter(|i| i.outcome == "failed").count(),
                    "GC finished after its caller left"
                ),
                Err(e) => {
                    warn!(network = %owned.dc.network, error = %e, "GC failed after its caller left")
                }
            }
        }
        out
    }
    // In the request's span: every line the GC logs ("GC freed", the DELs) still names the
    // command or RPC that asked for it, as it did before the GC ran in a task of its own.
    .in_current_span());
    let out = task.await;
    drop(waiting);
    out.map_err(|e| ShimError::Internal(format!("GC task: {e}")))?
}

/// A freeing GC's request, owned by its task (see [`collect`]).
struct Owned {
    dc: DelegateConf,
    cni_path: String,
    valid: Valid,
    began: GcStart,
    mode: Mode,
    by: crate::l1_leaves::events::FreedBy,
    list_kept: bool,
}

/// [`collect`]'s work, with the network's GC lock held.
async fn collect_locked(c: &Collector, req: Request<'_>) -> Result<Plan, ShimError> {
    let Request {
        dc,
        cni_path,
        valid,
        began,
        mode,
        by,
        list_kept,
    } = req;
    let Read {
        seen,
        reservations,
        names,
        resolved,
    } = read(c, dc, cni_path).await?;
    let known = seen.dir.is_some();
    let mut planned = plan(c, &dc.network, names, valid, began, known, list_kept).await?;
    interlock(c, &dc.network, &planned, mode.forced())?;
    let (probe, send) = resolved?;
    let orphans = plan_orphans(c, dc, &seen, reservations, &mut planned).await;
    if mode.plans_only() {
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
        by,
    };
    release(c, &delegate, &seen, planned, orphans, began).await
}

/// What a GC reads before it plans, in this order: the delegate (resolved), its store, then
/// the ledger and the keys with an operation in flight.
struct Read {
    seen: Seen,
    /// The delegate's store, where dipamd reads it (host-local's directory).
    reservations: Option<Vec<Reserved>>,
    /// The reservations' names, which the plan's share.
    names: Names,
    resolved: Result<(crate::l2_core::delegate::Probe, Option<SpecVersion>), ShimError>,
}

/// The network's delegate as the plan sees it.
struct Seen {
    /// The delegate has its own GC (CNI 1.1): no store to read, its GC runs instead.
    native_gc: bool,
    dir: Option<std::path::PathBuf>,
}

/// Reads the delegate's store BEFORE the ledger (plan.rs reads it next). Every reservation
/// is made after its attachment's intent is durable (core/attach.rs), so a reservation read
/// here belongs to a record the plan's read finds (kept while in flight), and one made after
/// this read is not looked at: an ADD running beside this GC is never taken for an orphan.
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
    let (names, reservations) = match &dir {
        // A file read per address: off the async workers that serve the pods' ADDs.
        Some(d) => {
            let (names, read) = Reserved::read(d.clone())
                .await
                .map_err(|e| ShimError::Internal(format!("reading {}: {e}", d.display())))?;
            (names, Some(read))
        }
        None => (Names::default(), None),
    };
    // Test builds: hold the GC here, after it began and before it reads the ledger, for an
    // ADD to finish in between (the window in which one was freed, chaos.rs).
    crate::l1_leaves::fault::pause("gc-before-read").await;
    Ok(Read {
        seen: Seen { native_gc, dir },
        reservations,
        names,
        resolved,
    })
}

/// The share interlock (calico#5044: a bad list once freed every healthy pod). It holds at
/// every size: freeing the only pod of a network, or both of two, is exactly what a
/// truncated list does, so it takes an operator's --force (or --gc-max-free-share 1).
fn interlock(
    c: &Collector,
    network: &str,
    planned: &Planned,
    force: bool,
) -> Result<(), ShimError> {
    let (pods, stale) = (planned.pods, &planned.stale);
    if !force && !stale.is_empty() && stale.len() as f64 > c.gc.policy.max_free_share * pods as f64
    {
        let admission = super::admit::Admission::new(&c.gc, &c.core.events, network);
        return Err(admission.refuse(ShimError::GcRefused {
            network: network.to_owned(),
            reason: format!(
                "it would free {} of the network's {pods} pod attachments, more than the \
                 allowed share {:.0}% (dipamd --gc-max-free-share; `dipamctl gc --force \
                 --dry-run` shows what it would free, and without --dry-run frees it)",
                stale.len(),
                c.gc.policy.max_free_share * 100.0
            ),
        }));
    }
    Ok(())
}

/// The network's delegate, resolved once for every exec of the release.
struct Delegate<'a> {
    dc: &'a DelegateConf,
    cni_path: &'a str,
    probe: &'a crate::l2_core::delegate::Probe,
    send: Option<SpecVersion>,
    /// Who asked for the GC (the history's `by` of what it frees).
    by: crate::l1_leaves::events::FreedBy,
}

/// Runs the plan: the stale records' DELs, the delegate's own GC where it has one, the
/// orphans' DELs; then what an operation took up after the plan is kept after all, and said
/// so.
async fn release(
    c: &Collector,
    d: &Delegate<'_>,
    seen: &Seen,
    planned: Planned,
    orphans: Vec<Reserved>,
    began: GcStart,
) -> Result<Plan, ShimError> {
    let Planned {
        listed,
        stale,
        mut items,
        mut kept,
        also_kept,
        known,
        ..
    } = planned;
    // The store comparison is done: its name sets go before the DELs start, and the valid
    // set with them unless the delegate's own GC is told it.
    drop((also_kept, known));
    let listed = seen.native_gc.then_some(listed);
    let parallel = c.gc.policy.parallel.max(1);
    let n = stale.len();
    // The keys the delegate's own GC is told are gone; the records themselves go to the
    // release, which frees each once its DEL is done.
    let stale_keys: Vec<AttachmentKey> = match seen.native_gc {
        true => stale.iter().map(|r| r.key.clone()).collect(),
        false => Vec::new(),
    };
    let mut busy_now = release_stale(c, d, stale, began, parallel, &mut items[..n]).await;
    if let Some(listed) = listed {
        native_gc(c, d, listed, stale_keys, &busy_now).await?;
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
    listed: HashSet<Pair>,
    stale: Vec<AttachmentKey>,
    busy_now: &[(usize, &'static str, &'static str)],
) -> Result<(), ShimError> {
    let network = d.dc.network.clone();
    let _exclusive = c.core.locks.exclusive(&network).await;
    let chosen: HashSet<AttachmentKey> = stale
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !busy_now.iter().any(|(b, _, _)| b == i))
        .map(|(_, k)| k)
        .collect();
    // Read one record at a time, keeping only the names of those not chosen (run 32's
    // streaming, docs/cfp.md §7.4): the network is held exclusively meanwhile.
    // The valid set's names are the set's own; a record's pair already in it is not held twice.
    let net = network.clone();
    let delegate_keep: HashSet<Pair> = c
        .core
        .ledger(move |l| {
            let mut keep = listed;
            let pair = |(c, i): (String, String)| -> Pair { (c.into(), i.into()) };
            l.for_each(Some(&net), |r, _| {
                if !chosen.contains(&r.key) {
                    keep.extend(store::HeldAs::of(&r).into_differs().map(pair));
                    keep.insert(pair((r.key.container_id, r.key.ifname)));
                }
                Ok(())
            })?;
            Ok(keep)
        })
        .await?;
    let mut conf = d.dc.conf.clone();
    let list: Vec<Value> = delegate_keep
        .iter()
        .map(|(c, i)| json!({"containerID": &**c, "ifname": &**i}))
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
            forgetting = Some(forget(c, jobs, last));
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

/// One group commit forgetting the records of `jobs` (released): into the kernel, or onto the
/// disk when it is the `last` of the GC.
fn forget<'a>(c: &'a Collector, jobs: Vec<Job<'a>>, last: bool) -> Forgetting<'a> {
    let durability = if last {
        Durability::SurvivesPowerCut
    } else {
        Durability::SurvivesProcessCrash
    };
    Box::pin(async move {
        crate::l1_leaves::fault::hit("gc-before-forget");
        let recs: Vec<AttachmentRecord> = jobs.iter().map(|j| j.rec.clone()).collect();
        let outcome = c.core.forget_all(&recs, durability).await;
        (jobs, outcome)
    })
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
        // stamped its key before letting go (rpc/add/mod.rs), so none can slip between this check
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
        crate::l1_leaves::fault::hit("gc-after-mark");
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

/// One item's outcome: counted, logged, and (freed) recorded in its container's history
/// with who asked for the GC.
fn finish(c: &Collector, d: &Delegate<'_>, it: &mut GcItem, outcome: Result<(), ShimError>) {
    match outcome {
        Ok(()) => {
            it.outcome = "freed".into();
            c.gc.stats
                .freed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            c.core
                .events
                .emit(crate::l1_leaves::events::Event::GcFreed(1));
            info!(kind = %it.kind, container_id = %it.container_id, ifname = %it.ifname, ips = ?it.ips, reason = %it.reason, by = %d.by, "GC freed");
            let reason = format!("{} ({})", gc_reason(d.by), it.reason);
            c.core.events.freed(
                d.by,
                &crate::l1_leaves::events::Freeing {
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
fn gc_reason(by: crate::l1_leaves::events::FreedBy) -> &'static str {
    use crate::l1_leaves::events::FreedBy as B;
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

mod orphans;
mod plan;
#[cfg(test)]
mod tests;
