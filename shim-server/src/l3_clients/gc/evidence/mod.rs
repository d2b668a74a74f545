//! Dead pod attachments found by evidence, not only by a runtime's list (docs/cfp.md §7.4,
//! "Dead attachments").
//!
//! containerd never sends a CNI GC, the runtime-aware GC is off without `--cri-endpoint`, and a
//! pod can die without a DEL (a crashed runtime, a lost DEL, a delegate whose state was wiped):
//! its record then holds its address in the ledger, and once the delegate hands that address
//! out again every new pod given it is refused (156). The evidence that a pod is alive is the
//! one liveness.rs gathers for unrecorded reservations, applied to the ledger's own records:
//! a network namespace holds one of its addresses, the host routes one of them through a link
//! that is up, the runtime lists its sandbox, or (here) the network namespace its ADD named is
//! still mounted. A record none of these finds, on two complete looks at least
//! `--dead-after` seconds apart (on the boot clock), is dead and freed.
//!
//! What is never freed here, whatever the look says (the GC's rules, gc/mod.rs): the agent's
//! addresses and claims, warm-pool entries, a record with an operation in flight or
//! interrupted, one younger than `--gc-grace` (by the wall clock or, since dipamd started, by
//! the boot clock: a stepped clock lets nothing through), and one whose ADD finished after the
//! pass began. A partial look (dipamd in its own PID namespace without the runtime's list, a
//! scan that failed) proves nothing dead and breaks every chain of looks.
//!
//! A dead record is released through its delegate. Where that fails, the delegate's store
//! decides: a store dipamd reads (host-local's directory) that still holds the reservation
//! keeps the record (the address cannot be handed out meanwhile); otherwise the record is
//! forgotten, since a delegate that cannot release it no longer holds it for anyone, and a
//! record kept for it would refuse every pod the delegate gives its address (156).

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, atomic::AtomicU64},
    time::Duration,
};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
use tracing::{info, warn};

use crate::{
    l1_leaves::error::ShimError,
    l1_leaves::events::FreedBy,
    l2_core::core::births::{Born, GcStart, boot_ns},
    l2_core::delegate::{
        config::{result_addrs, result_ips},
        store,
    },
    l3_clients::gc::Collector,
    l3_clients::liveness::{Scan, Verdict},
};

/// `--dead-after`'s default: two looks this far apart must both find a pod dead. Looks run
/// every half of it, so a pod gone is freed within about 1.5 times it.
pub const DEFAULT_DEAD_AFTER: u64 = 30;

/// The evidence pass's memory between looks.
#[derive(Debug, Default)]
pub struct Evidence {
    /// Each record the looks found dead: when (boot clock, ns) the first of them looked.
    first_dead: Mutex<HashMap<AttachmentKey, u64>>,
    /// Freed since start, for status and tests.
    pub freed: AtomicU64,
}

/// What became of one dead record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The delegate released it; the record is gone.
    Released,
    /// The delegate could not release it and does not hold it (or cannot be asked): the
    /// record is gone (why).
    Forgotten(String),
    /// Kept: the delegate's store still holds it, or an operation took it up (why).
    Kept(String),
}

/// The verdict on a pod record: each of its addresses judged by `scan`, and the network
/// namespace its ADD named.
pub fn verdict(scan: &Scan, rec: &AttachmentRecord) -> Verdict {
    let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
    if ips.is_empty() {
        return Verdict::Unknown("no address is recorded for it".into());
    }
    if let Some(w) = netns_mounted(&rec.netns) {
        return Verdict::Alive(w);
    }
    let mut unknown = None;
    for ip in ips {
        match scan.verdict(ip, &rec.key.container_id) {
            Verdict::Alive(w) => return Verdict::Alive(w),
            Verdict::Unknown(w) => unknown = Some(w),
            Verdict::Dead => {}
        }
    }
    unknown.map_or(Verdict::Dead, Verdict::Unknown)
}

/// Whether the network namespace a pod's ADD named is still a mounted namespace (seen
/// directly, or through PID 1's root when dipamd shares the host's PID namespace but not its
/// mounts): a pod whose processes dipamd cannot see, or a sandbox with no process left in it,
/// still has its namespace pinned while the runtime keeps the pod.
fn netns_mounted(path: &str) -> Option<String> {
    if path.is_empty() || !path.starts_with('/') {
        return None;
    }
    let candidates = [
        std::path::PathBuf::from(path),
        std::path::Path::new("/proc/1/root").join(path.trim_start_matches('/')),
    ];
    candidates.iter().find_map(|p| {
        let fs = nix::sys::statfs::statfs(p).ok()?;
        // NSFS_MAGIC: a namespace file, bind-mounted or /proc/<pid>/ns/net.
        (fs.filesystem_type().0 as i64 == 0x6e73_6673)
            .then(|| format!("its network namespace {path} still exists"))
    })
}

/// Why a record is never freed on evidence now, if it is not: the GC's rules.
pub fn rule_keeps(
    c: &Collector,
    rec: &AttachmentRecord,
    busy: &HashSet<AttachmentKey>,
    t: u64,
    boot: Option<u64>,
) -> Option<(&'static str, String)> {
    match &rec.owner {
        Owner::Agent { role } => return Some(("agent", format!("the agent's {role} address"))),
        Owner::Pool => return Some(("pool", "a warm-pool entry".into())),
        Owner::Pod => {}
    }
    if rec.state != AttachmentState::Committed {
        return Some(crate::l3_clients::gc::interrupted(rec));
    }
    if busy.contains(&rec.key) {
        return Some(("in-flight", "an operation on it is in flight".into()));
    }
    let grace = c.gc.policy.grace;
    let age = t.saturating_sub(rec.created_at);
    if age < grace.as_secs() {
        return Some((
            "grace",
            format!("added {age}s ago, inside the grace period (--gc-grace)"),
        ));
    }
    // The wall clock may have been stepped forward: an ADD this dipamd finished within the
    // grace period on the boot clock is young whatever created_at says.
    let since = boot.map(|b| b.saturating_sub(grace.as_nanos() as u64));
    if since.is_none_or(|s| c.core.births.born(&rec.key, GcStart(s)) == Born::After) {
        return Some((
            "grace",
            "its ADD finished inside the grace period (--gc-grace), on the boot clock".into(),
        ));
    }
    None
}

/// One streamed read of the ledger (a page and one decoded record at a time): how many
/// records were made through CRI, and the few this look may free (a committed pod's, not
/// busy, that the look finds dead; [`plan`] applies every rule to them). The pass once held
/// every record, every minute (docs/performance.md, run 32). The look is judged on a
/// blocking thread: [`verdict`] asks the kernel about each pod's namespace (`statfs`).
async fn candidates(
    c: &Collector,
    scan: &Scan,
    busy: HashSet<AttachmentKey>,
) -> Result<(usize, Vec<AttachmentRecord>, HashSet<AttachmentKey>), ShimError> {
    let scan = scan.clone();
    c.core
        .ledger(move |l| {
            let runtime_only = scan.runtime_only();
            let (mut cri, mut out) = (0, Vec::new());
            l.for_each(None, |r, _| {
                cri += usize::from(r.cri_pod.is_some());
                let may = r.owner == Owner::Pod
                    && r.state == AttachmentState::Committed
                    && !busy.contains(&r.key)
                    && (!runtime_only || r.cri_pod.is_some());
                if may && verdict(&scan, &r) == Verdict::Dead {
                    out.push(r);
                }
                Ok(())
            })?;
            Ok((cri, out, busy))
        })
        .await
}

/// Sorts `records` (the candidates, [`candidates`]) by this look: the dead whose first dead
/// look is at least `apart` old, to free; every other record leaves the chain. `cri`: how
/// many records of the whole ledger were made through CRI. Returns the records to free.
fn plan<'a>(
    c: &Collector,
    ev: &Evidence,
    cri: usize,
    records: &'a [AttachmentRecord],
    scan: &Scan,
    busy: &HashSet<AttachmentKey>,
    apart: Duration,
) -> Vec<&'a AttachmentRecord> {
    let t = crate::l1_leaves::clock::now();
    let Some(boot) = boot_ns() else {
        return Vec::new();
    };
    let mut first = ev.first_dead.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = scan.incomplete_for_records(cri) {
        // Nothing is proven dead, and every chain of looks starts again.
        if !first.is_empty() {
            info!("evidence pass: the look proves nothing dead: {why}");
        }
        first.clear();
        return Vec::new();
    }
    let mut chain: HashMap<AttachmentKey, u64> = HashMap::new();
    let mut free = Vec::new();
    let runtime_only = scan.runtime_only();
    for r in records {
        if rule_keeps(c, r, busy, t, Some(boot)).is_some() {
            continue;
        }
        // The runtime's list alone never speaks for what the runtime did not make.
        if runtime_only && r.cri_pod.is_none() {
            continue;
        }
        if verdict(scan, r) != Verdict::Dead {
            continue;
        }
        let since = first.get(&r.key).copied();
        chain.insert(r.key.clone(), since.unwrap_or(boot));
        // Two looks at least: the first one only starts the chain.
        if since.is_some_and(|s| boot.saturating_sub(s) >= apart.as_nanos() as u64) {
            free.push(r);
        }
    }
    *first = chain;
    // On the runtime's list alone, a list cut short (calico#5044) must not free the node's
    // pods: the runtime-aware GC's share interlock holds here too.
    let share = c.gc.policy.max_free_share;
    if runtime_only && !free.is_empty() && free.len() as f64 > share * cri as f64 {
        warn!(
            free = free.len(),
            cri,
            "evidence pass: on the runtime's list alone this would free more than \
             --gc-max-free-share of the attachments made through CRI; nothing is freed \
             (`dipamctl gc --from-runtime --force` frees them)"
        );
        return Vec::new();
    }
    free
}

/// One look, and the records it and an earlier look at least `apart` before found dead,
/// freed. Returns how many were freed.
pub async fn pass(c: &Collector, apart: Duration) -> Result<u64, ShimError> {
    // From the census, not a read of every record: a node without pods has nothing to judge.
    let pods = c
        .core
        .ledger(|l| l.census(|n| n.any(|e| e.holder == dipam_state::Holder::Pod)))
        .await?;
    if !pods {
        return Ok(0);
    }
    // Before the look: a record whose ADD finishes after it is never freed (births.rs).
    let began = c.core.births.gc_began(None, None);
    let scan = c.gc.scan().await;
    judge(c, &scan, began, apart).await
}

/// Frees what `scan` (a look made after `began`) and the looks before it prove dead.
pub async fn judge(
    c: &Collector,
    scan: &Scan,
    began: GcStart,
    apart: Duration,
) -> Result<u64, ShimError> {
    // The ledger again, after the look: a record added meanwhile is judged by the next one.
    let busy: HashSet<AttachmentKey> = c.core.locks.in_flight().into_iter().collect();
    let (cri, records, busy) = candidates(c, scan, busy).await?;
    let ev = &c.gc.evidence;
    let dead: Vec<AttachmentRecord> = plan(c, ev, cri, &records, scan, &busy, apart)
        .into_iter()
        .cloned()
        .collect();
    let mut freed = 0;
    for r in &dead {
        let why = format!(
            "no network namespace holds {}, the host routes none of them, {}, and its network \
             namespace {} is gone: so on two looks at least {}s apart",
            ips_text(r),
            if scan.has_sandboxes() {
                "the runtime lists no such sandbox"
            } else {
                "dipamd has no runtime list (--cri-endpoint)"
            },
            if r.netns.is_empty() {
                "(none named)"
            } else {
                &r.netns
            },
            apart.as_secs()
        );
        match free_locked(c, r, began, FreedBy::Evidence, &why).await {
            Ok(Outcome::Released | Outcome::Forgotten(_)) => freed += 1,
            Ok(Outcome::Kept(_)) => {}
            Err(e) => {
                warn!(key = %r.key, error = %e, "could not free a dead attachment; the next look tries again")
            }
        }
    }
    if freed > 0 {
        ev.freed
            .fetch_add(freed, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(freed)
}

/// Frees the dead `rec` under its key's lock (busy: kept), if it is still the record the look
/// judged and no ADD of its key finished since `began`.
async fn free_locked(
    c: &Collector,
    rec: &AttachmentRecord,
    began: GcStart,
    by: FreedBy,
    why: &str,
) -> Result<Outcome, ShimError> {
    let Some(_guard) = c.core.locks.try_lock(&rec.key) else {
        return Ok(Outcome::Kept("an operation on it is in flight".into()));
    };
    match c.core.lookup(&rec.key)? {
        Some(now) if now == *rec => {}
        _ => return Ok(Outcome::Kept("it changed since the look".into())),
    }
    if c.core.births.born(&rec.key, began) != Born::Before {
        return Ok(Outcome::Kept(
            "an ADD of its key finished since the look".into(),
        ));
    }
    release_dead(c, rec, by, why).await
}

/// Releases a pod's record proven dead (the caller holds its key's lock): through its
/// delegate, or, where that fails and the delegate's store does not hold it, by forgetting
/// it. Says who freed it and why in the pod's history.
pub async fn release_dead(
    c: &Collector,
    rec: &AttachmentRecord,
    by: FreedBy,
    why: &str,
) -> Result<Outcome, ShimError> {
    c.retire_datapath(rec).await;
    let outcome = match c.core.release(rec).await {
        Ok(()) => Outcome::Released,
        Err(e) => match still_held(rec).await {
            Some(true) => {
                warn!(key = %rec.key, error = %e, "the delegate could not release a dead pod's address and still holds it; kept until a release succeeds");
                return Ok(Outcome::Kept(format!(
                    "the delegate could not release it ({e}) and still holds it"
                )));
            }
            held => {
                let marked = c.core.lookup(&rec.key)?.unwrap_or_else(|| rec.clone());
                c.core.forget(&marked).await?;
                Outcome::Forgotten(format!(
                    "the delegate could not release it ({e}){}",
                    if held == Some(false) {
                        " and its store no longer holds it"
                    } else {
                        ", and its store is not one dipamd reads: it went with the pod"
                    }
                ))
            }
        },
    };
    let how = match &outcome {
        Outcome::Released => "released through the delegate".to_owned(),
        Outcome::Forgotten(w) => format!("forgotten: {w}"),
        Outcome::Kept(_) => String::new(),
    };
    info!(key = %rec.key, ips = %ips_text(rec), by = %by, "dead pod's attachment freed ({how}): {why}");
    record_freed(c, rec, by, &format!("{why}; {how}"));
    Ok(outcome)
}

/// Whether the delegate's store still holds `rec`'s reservation: `None` where dipamd does not
/// read the store (azure-vnet-ipam's) or could not read it now.
async fn still_held(rec: &AttachmentRecord) -> Option<bool> {
    let dir = crate::l3_clients::gc::record_store(rec)?;
    let held = store::read(dir).await.ok()?;
    let (cid, ifname) = rec.delegate_ids();
    Some(
        held.iter()
            .any(|h| h.container_id == cid && (h.ifname.is_empty() || h.ifname == ifname)),
    )
}

/// The pod's history entry: who freed its attachment and why (`dipamctl explain`).
pub fn record_freed(c: &Collector, rec: &AttachmentRecord, by: FreedBy, reason: &str) {
    c.core
        .events
        .freed(by, &crate::l1_leaves::events::Freeing::of(rec, reason));
}

fn ips_text(rec: &AttachmentRecord) -> String {
    rec.result
        .as_ref()
        .map(result_ips)
        .unwrap_or_default()
        .join(", ")
}

/// At a conflict (156): the pod record of `network` that holds `ip`, freed if a look now
/// proves it dead and no GC rule keeps it. The delegate has just handed `ip` out again, so it
/// no longer holds it for that record: the record is forgotten, never released through the
/// delegate (a release by address would free what the delegate may already have given to
/// another pod). Returns whether it was freed, so the ADD may be served once more.
pub async fn free_dead_holder(
    c: &Collector,
    network: &str,
    ip: &str,
    asking: &AttachmentKey,
) -> Result<bool, ShimError> {
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return Ok(false);
    };
    let net = network.to_owned();
    let records = c.core.ledger(move |l| l.list(Some(&net))).await?;
    let Some(holder) = records.into_iter().find(|r| {
        r.key != *asking
            && r.result
                .as_ref()
                .is_some_and(|res| result_addrs(res).contains(&ip))
    }) else {
        return Ok(false);
    };
    let busy: HashSet<AttachmentKey> = c.core.locks.in_flight().into_iter().collect();
    if let Some((code, why)) =
        rule_keeps(c, &holder, &busy, crate::l1_leaves::clock::now(), boot_ns())
    {
        info!(key = %holder.key, %ip, code, "the conflict's holder is kept: {why}");
        return Ok(false);
    }
    let began = c.core.births.gc_began(None, None);
    let scan = c.gc.scan().await;
    let cri = usize::from(holder.cri_pod.is_some());
    let why = scan.incomplete_for_records(cri).or_else(|| {
        (scan.runtime_only() && holder.cri_pod.is_none()).then(|| {
            "dipamd sees none of the node's processes, and the runtime's list does not speak \
             for an attachment made outside CRI"
                .to_owned()
        })
    });
    if let Some(why) = why {
        info!(key = %holder.key, %ip, "the conflict's holder is not proven dead: {why}");
        return Ok(false);
    }
    match verdict(&scan, &holder) {
        Verdict::Dead => {}
        Verdict::Alive(w) | Verdict::Unknown(w) => {
            info!(key = %holder.key, %ip, "the conflict's holder is not proven dead: {w}");
            return Ok(false);
        }
    }
    let Some(_guard) = c.core.locks.try_lock(&holder.key) else {
        return Ok(false);
    };
    match c.core.lookup(&holder.key)? {
        Some(now) if now == holder => {}
        _ => return Ok(false),
    }
    if c.core.births.born(&holder.key, began) != Born::Before {
        return Ok(false);
    }
    c.retire_datapath(&holder).await;
    c.core.forget(&holder).await?;
    let why = format!(
        "the delegate handed {ip} to {asking}, and nothing on the node uses it: no network \
         namespace holds it, no host route leads to it, no sandbox of the runtime lists it, and \
         its network namespace is gone"
    );
    warn!(key = %holder.key, %ip, "dead pod's attachment forgotten at a conflict: {why}");
    record_freed(c, &holder, FreedBy::Conflict, &format!("{why}; forgotten"));
    c.gc.evidence
        .freed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(true)
}

/// The loop: a look every half of `apart`. Off when `apart` is zero.
pub async fn run(c: Collector, apart: Duration) {
    if apart.is_zero() {
        return;
    }
    let every = (apart / 2).max(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = pass(&c, apart).await {
            warn!(error = %e, "evidence pass failed");
        }
    }
}

#[cfg(test)]
mod tests;
