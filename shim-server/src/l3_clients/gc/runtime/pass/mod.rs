//! One pass of the runtime-aware GC: list the runtime's sandboxes, decide what is kept and
//! why, refuse what cannot be trusted, and free the rest through the GC's entry point
//! ([`crate::l3_clients::gc::collect::collect`]), network by network, exactly as a CNI GC would.

use std::{
    collections::{BTreeMap, HashSet},
    time::Duration,
};

use dipam_proto::v1::RuntimeGcItem;
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
use tracing::{debug, info, warn};

use crate::l3_clients::gc::Collector;

use super::{ListError, Refusal, RuntimeGc};
use crate::{
    l1_leaves::clock::now,
    l1_leaves::error::ShimError,
    l1_leaves::events::{Event, FreedBy},
    l2_core::core::births::GcStart,
    l2_core::delegate::{
        config::{DelegateConf, result_ips},
        store,
    },
    l3_clients::gc::{
        Valid,
        collect::{Mode, Request, collect},
    },
};

/// What a pass did, or (dry run) would do.
#[derive(Debug, Default)]
pub struct Report {
    pub endpoint: String,
    /// Set when the pass frees nothing because the runtime's answer is not trusted.
    pub refused: Option<Refusal>,
    /// Sandboxes the runtime listed.
    pub sandboxes: usize,
    /// Freed, failed, or (dry run) planned.
    pub items: Vec<RuntimeGcItem>,
    /// Kept, each with every reason: at most the caller's limit of them, those kept for a
    /// reason other than "listed" first.
    pub kept: Vec<RuntimeGcItem>,
    /// How many are kept, listed in `kept` or not.
    pub kept_total: u64,
    /// How many are kept for each reason (one kept for several counts under each).
    pub kept_by_reason: BTreeMap<&'static str, u64>,
}

/// The most kept attachments a report lists, whatever the caller asks: each is a few hundred
/// bytes of the reply (pod, owner, addresses, reasons), and at 10,000 attachments the whole
/// list took dipamd's RSS from 57 to 72 MiB (docs/performance.md, run 39).
pub const KEPT_LIMIT: usize = 1_000;

/// Whether the runtime-aware GC may ever free `r`: a pod's attachment made through CRI.
fn made_through_cri(r: &AttachmentRecord) -> bool {
    r.owner == Owner::Pod && r.cri_pod.is_some()
}

/// What one pass decides, before anything is freed: built one record at a time from one
/// streamed read of the ledger ([`read`]), holding only the records it frees. It once held
/// every record (`list(None)`) and a kept line for each, every 10 s: at 10,000 attachments
/// those passes, not the requests, set dipamd's high-water mark (docs/performance.md, run 32).
#[derive(Debug, Default)]
struct Plan {
    /// Missed by this pass and the one before: to free.
    free: Vec<AttachmentRecord>,
    /// Kept for a reason other than "listed", each with every reason, then those the
    /// runtime lists and nothing else keeps: each at most `Against::list_kept` long (only
    /// `dipamctl gc --from-runtime --kept` lists them; every pass counts them).
    kept: Vec<RuntimeGcItem>,
    kept_listed: Vec<RuntimeGcItem>,
    kept_total: u64,
    kept_by_reason: BTreeMap<&'static str, u64>,
    /// Every eligible attachment this pass missed (what the next pass compares with).
    missed: HashSet<AttachmentKey>,
    /// Attachments made through CRI, unlisted, kept only by --gc-grace (or also by it).
    kept_grace: u64,
    /// Missed for the first time.
    pending: u64,
    /// Attachments made through CRI, and of those the committed ones (the share
    /// interlock's base).
    cri: usize,
    cri_committed: usize,
}

/// What a pass compares the ledger with: the runtime's list, the pass before's misses and
/// the clock.
struct Against {
    listed: HashSet<String>,
    missed_before: HashSet<AttachmentKey>,
    grace: u64,
    t: u64,
    /// How many kept attachments the report lists (0: none, the counts only).
    list_kept: usize,
}

impl Plan {
    /// The valid set and the two-pass rule, applied to one record of the ledger.
    fn judge(&mut self, r: AttachmentRecord, a: &Against) {
        if made_through_cri(&r) {
            self.cri += 1;
            if r.state == AttachmentState::Committed {
                self.cri_committed += 1;
            }
        }
        let (grace, t) = (a.grace, a.t);
        let mut why: Vec<(&'static str, String)> = Vec::new();
        let is_listed = a.listed.contains(&r.key.container_id);
        if is_listed {
            why.push(("listed", "the runtime lists its pod sandbox".into()));
        }
        match &r.owner {
            Owner::Agent { role } => why.push(("agent", format!("the agent's {role} address"))),
            Owner::Pool => why.push(("pool", "a warm-pool entry".into())),
            Owner::Pod if r.cri_pod.is_none() => why.push((
                "not-cri",
                "not made through CRI (its ADD's CNI_ARGS did not name a pod as a CRI runtime \
                 does): the runtime-aware GC never frees it"
                    .into(),
            )),
            Owner::Pod => {}
        }
        if r.state != AttachmentState::Committed {
            why.push(crate::l3_clients::gc::interrupted(&r));
        }
        let age = t.saturating_sub(r.created_at);
        if age < grace {
            why.push((
                "grace",
                format!("added {age}s ago, inside the grace period (--gc-grace {grace}s)"),
            ));
            if made_through_cri(&r) && !is_listed {
                self.kept_grace += 1;
            }
        }
        if !why.is_empty() {
            return self.keep(&r, &why, a);
        }
        self.missed.insert(r.key.clone());
        if a.missed_before.contains(&r.key) {
            self.free.push(r);
        } else {
            self.pending += 1;
            let why = [(
                "first-miss",
                "the runtime lists no sandbox with this ID; the next pass frees it if it does \
                 not list it either"
                    .into(),
            )];
            self.keep(&r, &why, a);
        }
    }

    fn keep(&mut self, r: &AttachmentRecord, why: &[(&'static str, String)], a: &Against) {
        self.kept_total += 1;
        for (code, _) in why {
            *self.kept_by_reason.entry(code).or_default() += 1;
        }
        // What an operator looks for is mostly why one is not freed yet: those the runtime
        // does not list (or that something else keeps) go before the thousands it lists.
        let to = if why.iter().all(|(code, _)| *code == "listed") {
            &mut self.kept_listed
        } else {
            &mut self.kept
        };
        if to.len() < a.list_kept {
            to.push(kept_item(r, why));
        }
    }

    /// The kept lines the report carries: at most `limit`, the unlisted ones first.
    fn kept_lines(&mut self, limit: usize) -> Vec<RuntimeGcItem> {
        let mut out = std::mem::take(&mut self.kept);
        out.append(&mut self.kept_listed);
        out.truncate(limit);
        out
    }
}

/// One streamed read of the ledger (`Ledger::for_each`: a page of the store and one decoded
/// record at a time), planned as it goes.
fn read(l: &dipam_state::Ledger, a: &Against) -> Result<Plan, dipam_state::StoreError> {
    let mut p = Plan::default();
    l.for_each(None, |r, _| {
        p.judge(r, a);
        Ok(())
    })?;
    Ok(p)
}

fn item(r: &AttachmentRecord, outcome: &str, keep: Vec<String>, reason: String) -> RuntimeGcItem {
    let pod = r.cri_pod.as_ref();
    RuntimeGcItem {
        network: r.key.network.clone(),
        container_id: r.key.container_id.clone(),
        ifname: r.key.ifname.clone(),
        ips: r.result.as_ref().map(result_ips).unwrap_or_default(),
        owner: r.owner.label(),
        pod_namespace: pod.map(|p| p.namespace.clone()).unwrap_or_default(),
        pod_name: pod.map(|p| p.name.clone()).unwrap_or_default(),
        pod_uid: pod.map(|p| p.uid.clone()).unwrap_or_default(),
        outcome: outcome.into(),
        keep,
        reason,
        error: String::new(),
    }
}

fn kept_item(r: &AttachmentRecord, why: &[(&'static str, String)]) -> RuntimeGcItem {
    item(
        r,
        "kept",
        why.iter().map(|(c, _)| (*c).to_owned()).collect(),
        why.iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// Runs one pass (or, with `dry_run`, says what the next pass would do, changing nothing).
/// `force` lets this one pass free more than --gc-max-free-share of the node's CRI
/// attachments; nothing overrides the two-pass rule or a refusal of the runtime's answer.
/// The report counts what is kept by reason, and lists up to `kept` of them (at most
/// [`KEPT_LIMIT`]) with their reasons (`dipamctl gc --from-runtime --kept N`).
pub async fn pass(
    c: &Collector,
    rt: &RuntimeGc,
    dry_run: bool,
    force: bool,
    kept: usize,
) -> Result<Report, ShimError> {
    pass_with(c, rt, dry_run, force, kept.min(KEPT_LIMIT)).await
}

/// [`pass`]; `list_kept`: how many kept attachments the report lists (the timer's passes
/// none: at 10,000 attachments the list was a line per record every 10 s).
async fn pass_with(
    c: &Collector,
    rt: &RuntimeGc,
    dry_run: bool,
    force: bool,
    list_kept: usize,
) -> Result<Report, ShimError> {
    let _one = rt.running.lock().await;
    let endpoint = rt.client.endpoint().to_owned();
    // The runtime first, then the ledger: an attachment added in between is missed for the
    // first time at most (the two-pass rule), and the GC that frees never takes one whose
    // ADD finished after this instant, when the list was asked for (core/births.rs).
    let began = c.core.births.gc_began(None, None);
    let listing = rt.client.list().await;
    let mut report = Report {
        endpoint: endpoint.clone(),
        ..Report::default()
    };
    let listed: HashSet<String> = match listing {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            let code = match e {
                ListError::Unreachable { .. } => "unreachable",
                ListError::Answered { .. } => "error",
            };
            report.refused = Some(Refusal {
                code,
                detail: format!("{e}; nothing is freed until it answers"),
            });
            return Ok(refused(c, rt, dry_run, report, true));
        }
    };
    report.sandboxes = listed.len();
    let against = Against {
        listed,
        missed_before: rt
            .state
            .lock()
            .map(|s| s.missed.clone())
            .unwrap_or_default(),
        grace: c.gc.policy.grace.as_secs(),
        t: now(),
        list_kept,
    };
    let t = against.t;
    let (mut p, against) = c
        .core
        .ledger(move |l| read(l, &against).map(|p| (p, against)))
        .await?;
    if against.listed.is_empty() && p.cri > 0 {
        report.refused = Some(Refusal {
            code: "empty",
            detail: format!(
                "the runtime at {endpoint} lists no pod sandbox while the ledger holds {} \
                 attachment(s) made through CRI: a runtime still restoring its state, or \
                 --cri-endpoint is not the runtime that made them; nothing is freed",
                p.cri
            ),
        });
        return Ok(refused(c, rt, dry_run, report, true));
    }
    drop(against);
    report.kept = p.kept_lines(list_kept);
    report.kept_total = p.kept_total;
    report.kept_by_reason = std::mem::take(&mut p.kept_by_reason);
    report.items = p.free.iter().map(|r| planned_item(r, t)).collect();
    if let Some(refusal) = interlock(c, p.cri_committed, p.free.len(), force) {
        report.refused = Some(refusal);
        // The chain is kept: the list did not fail, it is only too short to trust alone.
        if !dry_run && let Ok(mut s) = rt.state.lock() {
            s.missed = p.missed.clone();
            s.sandboxes = report.sandboxes as u64;
            s.pending = p.pending;
            s.kept_grace = p.kept_grace;
        }
        return Ok(refused(c, rt, dry_run, report, false));
    }
    if dry_run {
        return Ok(report);
    }
    let freed = free(c, &p.free, began, &mut report).await;
    let sandboxes = report.sandboxes;
    remember(c, rt, &report, p, sandboxes, t, freed);
    Ok(report)
}

/// The plan's line for an attachment to free.
fn planned_item(r: &AttachmentRecord, t: u64) -> RuntimeGcItem {
    item(
        r,
        "planned",
        Vec::new(),
        format!(
            "made through CRI{}, and the runtime listed no sandbox {} in this pass or the one \
             before; added {}s ago",
            r.cri_pod
                .as_ref()
                .map(|p| format!(" for pod {}/{} (uid {})", p.namespace, p.name, p.uid))
                .unwrap_or_default(),
            r.key.container_id,
            t.saturating_sub(r.created_at)
        ),
    )
}

/// The share interlock, node-wide: after a conflist change every attachment of the old
/// network is stale, so a per-network share would never let its last one go; a truncated
/// list (calico#5044) still shows as a large share of the node's CRI attachments.
fn interlock(c: &Collector, committed: usize, free: usize, force: bool) -> Option<Refusal> {
    let share = c.gc.policy.max_free_share;
    (!force && free > 0 && free as f64 > share * committed as f64).then(|| Refusal {
        code: "share",
        detail: format!(
            "it would free {free} of the node's {committed} attachment(s) made through CRI, \
             more than the allowed share {:.0}% (dipamd --gc-max-free-share); `dipamctl gc \
             --from-runtime --dry-run` lists them, and `dipamctl gc --from-runtime --force` \
             frees them",
            share * 100.0
        ),
    })
}

/// A pass that ran: its chain and counts kept for the next, the return to trust logged,
/// the event emitted, and what it freed logged.
fn remember(
    c: &Collector,
    rt: &RuntimeGc,
    report: &Report,
    p: Plan,
    sandboxes: usize,
    t: u64,
    freed: u64,
) {
    let endpoint = &report.endpoint;
    let trusted_again = if let Ok(mut s) = rt.state.lock() {
        s.missed = p.missed;
        s.passes += 1;
        s.freed += freed;
        s.sandboxes = sandboxes as u64;
        s.pending = p.pending;
        s.kept_grace = p.kept_grace;
        s.last_pass_at = t;
        s.refusing.take()
    } else {
        None
    };
    if let Some(was) = trusted_again {
        info!(endpoint = %endpoint, was = was.code, sandboxes, "runtime-aware GC: the runtime's list is trusted again");
    }
    c.core.events.emit(Event::RuntimeGcPass {
        freed,
        kept_grace: p.kept_grace,
        refusing: None,
    });
    if !report.items.is_empty() {
        let failed = report
            .items
            .iter()
            .filter(|i| i.outcome == "failed")
            .count();
        info!(endpoint = %endpoint, freed, failed, "runtime-aware GC: attachments whose sandbox the runtime no longer lists, freed");
    } else {
        debug!(endpoint = %endpoint, sandboxes, pending = p.pending, "runtime-aware GC pass: nothing to free");
    }
}

/// A refused pass: counted, remembered (and logged when the refusal changes), the two-pass
/// chain broken when `breaks_chain`; a dry run only reports it.
fn refused(
    c: &Collector,
    rt: &RuntimeGc,
    dry_run: bool,
    report: Report,
    breaks_chain: bool,
) -> Report {
    let Some(r) = report.refused.clone() else {
        return report;
    };
    if dry_run {
        return report;
    }
    let changed = if let Ok(mut s) = rt.state.lock() {
        s.passes += 1;
        s.refusals += 1;
        s.last_pass_at = now();
        if breaks_chain {
            s.missed.clear();
            s.pending = 0;
            s.sandboxes = report.sandboxes as u64;
        }
        let changed = s.refusing.as_ref().map(|x| x.code) != Some(r.code);
        s.refusing = Some(r.clone());
        changed
    } else {
        true
    };
    // Once per change, not every pass: a runtime down for a day is one line, not thousands.
    if changed {
        warn!(endpoint = %report.endpoint, reason = r.code, "runtime-aware GC refused: {}", r.detail);
    }
    c.core.events.emit(Event::RuntimeGcPass {
        freed: 0,
        kept_grace: rt.state.lock().map(|s| s.kept_grace).unwrap_or_default(),
        refusing: Some(r.code),
    });
    report
}

/// Frees `stale` scope by scope (gc::scopes: network, creator, delegate store) through the
/// GC's entry point, the rest of each network's attachments given as valid; fills in each
/// item's outcome. Returns how many were freed. Each scope is collected with its own config:
/// a non-root caller's record under root's network name is released from its own store, and
/// root's store is never read, GC'd or searched for orphans with its config (docs/cfp.md
/// §8.3).
async fn free(
    c: &Collector,
    stale: &[AttachmentRecord],
    began: GcStart,
    report: &mut Report,
) -> u64 {
    if stale.is_empty() {
        return 0;
    }
    let scopes = match crate::l3_clients::gc::scopes(&c.core, &c.agent).await {
        Ok(s) => s,
        Err(e) => {
            fail(report, None, &e.to_string());
            return 0;
        }
    };
    let mut by_scope: BTreeMap<usize, Vec<&AttachmentRecord>> = BTreeMap::new();
    for r in stale {
        match crate::l3_clients::gc::scope_of(&scopes, r) {
            Some(i) => by_scope.entry(i).or_default().push(r),
            None => fail(report, Some(&[r]), "no config recorded for its scope"),
        }
    }
    for (i, gone) in by_scope {
        free_scope(c, &scopes[i].0, &gone, began, report).await;
    }
    report.items.iter().filter(|i| i.outcome == "freed").count() as u64
}

/// Frees `gone` (one scope's stale records) with the scope's config `dc`.
async fn free_scope(
    c: &Collector,
    dc: &DelegateConf,
    gone: &[&AttachmentRecord],
    began: GcStart,
    report: &mut Report,
) {
    let network = dc.network.as_str();
    let valid = match scope_valid(c, dc, gone).await {
        Ok(v) => v,
        Err(e) => return fail(report, Some(gone), &e.to_string()),
    };
    let is_gone = |container_id: &str, ifname: &str| {
        gone.iter()
            .any(|r| r.key.container_id == container_id && r.key.ifname == ifname)
    };
    // `force`: the node-wide share interlock above stands for the per-network one, which
    // would keep the last attachment of a network the runtime no longer uses forever.
    // Whoever runs the pass (its timer, or `dipamctl gc --from-runtime`), its rule frees:
    // the history says so.
    let gc = Request {
        dc,
        cni_path: "",
        valid: Valid::List(valid),
        began,
        mode: Mode::FreeForced,
        by: FreedBy::RuntimeGc,
        list_kept: false,
    };
    let plan = match collect(c, gc).await {
        Ok(plan) => plan,
        Err(e) => return fail(report, Some(gone), &e.to_string()),
    };
    for it in report
        .items
        .iter_mut()
        .filter(|i| i.network == network && is_gone(&i.container_id, &i.ifname))
    {
        let done = plan.items.iter().find(|g| {
            g.kind == "ledger" && g.container_id == it.container_id && g.ifname == it.ifname
        });
        match done {
            Some(g) => {
                it.outcome = g.outcome.clone();
                it.error = g.error.clone();
            }
            None => {
                // The GC kept it after all (it changed since the list was read).
                let why = plan
                    .kept
                    .iter()
                    .find(|g| g.container_id == it.container_id && g.ifname == it.ifname)
                    .map(|g| g.reason.clone())
                    .unwrap_or_else(|| "gone from the ledger meanwhile".into());
                it.outcome = "kept".into();
                it.reason = format!("kept by the GC: {why}");
            }
        }
    }
    for other in plan
        .items
        .iter()
        .filter(|g| !(g.kind == "ledger" && is_gone(&g.container_id, &g.ifname)))
    {
        warn!(network, kind = %other.kind, container_id = %other.container_id, outcome = %other.outcome, "runtime-aware GC: the network's GC also collected this");
    }
}

/// The delegate's store a scope's valid list needs could not be read, or the ledger.
#[derive(Debug, thiserror::Error)]
enum UnreadValid {
    #[error("reading {}: {source}", dir.display())]
    Store {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Ledger(#[from] ShimError),
}

/// The valid list a scope's GC gets: every record of its network but `gone`, and the
/// reservations its store holds that dipamd never recorded (the reconcile's business,
/// --reconcile-free, not the runtime's: valid here, so the GC keeps them). The network's
/// records are read now, after the plan, one at a time, keeping their names: a record added
/// since the plan is valid too.
async fn scope_valid(
    c: &Collector,
    dc: &DelegateConf,
    gone: &[&AttachmentRecord],
) -> Result<Vec<(String, String)>, UnreadValid> {
    let gone_keys: HashSet<AttachmentKey> = gone.iter().map(|r| r.key.clone()).collect();
    let net = dc.network.clone();
    // Each record's key names and the names its delegate holds it under.
    let (mut valid, known) = c
        .core
        .ledger(move |l| {
            let (mut valid, mut known) = (Vec::new(), Vec::new());
            l.for_each(Some(&net), |r, _| {
                let (cid, ifname) = r.delegate_ids();
                known.push((cid.to_owned(), ifname.to_owned()));
                if !gone_keys.contains(&r.key) {
                    valid.push((r.key.container_id, r.key.ifname));
                }
                Ok(())
            })?;
            Ok((valid, known))
        })
        .await?;
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &dc.network) else {
        return Ok(valid);
    };
    let known_ids: HashSet<&str> = known.iter().map(|(c, _)| c.as_str()).collect();
    let known: HashSet<(&str, &str)> = known
        .iter()
        .map(|(c, i)| (c.as_str(), i.as_str()))
        .collect();
    let held = store::read(dir.clone())
        .await
        .map_err(|source| UnreadValid::Store { dir, source })?;
    valid.extend(
        held.into_iter()
            .filter(|h| {
                if h.ifname.is_empty() {
                    !known_ids.contains(h.container_id.as_str())
                } else {
                    !known.contains(&(h.container_id.as_str(), h.ifname.as_str()))
                }
            })
            .map(|h| (h.container_id, h.ifname)),
    );
    Ok(valid)
}

/// Marks `gone`'s items (None: every item) failed with `error`.
fn fail(report: &mut Report, gone: Option<&[&AttachmentRecord]>, error: &str) {
    let hit = |it: &RuntimeGcItem| {
        gone.is_none_or(|g| {
            g.iter().any(|r| {
                r.key.network == it.network
                    && r.key.container_id == it.container_id
                    && r.key.ifname == it.ifname
            })
        })
    };
    for it in report.items.iter_mut().filter(|i| hit(i)) {
        it.outcome = "failed".into();
        it.error = error.to_owned();
    }
    let network = gone
        .and_then(|g| g.first())
        .map_or("*", |r| r.key.network.as_str());
    warn!(
        network,
        error, "runtime-aware GC could not free; the next pass tries again"
    );
}

/// The loop: a pass at once (so that status shows the runtime's state from the start), then
/// one every `every`, each after the GCs freeing at its tick have finished (at most
/// 120 s later). Off when dipamd runs without --cri-endpoint.
pub async fn run(c: Collector, every: Duration) {
    let Some(rt) = c.gc.runtime.get() else {
        return;
    };
    loop {
        settle(&c.gc.running, SETTLE_POLL, SETTLE_MOST).await;
        if let Err(e) = pass_with(&c, rt, false, false, 0).await {
            warn!(error = %e, "runtime-aware GC pass failed");
        }
        tokio::time::sleep(every).await;
    }
}

/// How often a timer's pass looks whether the GCs under way have finished.
const SETTLE_POLL: Duration = Duration::from_millis(200);
/// The longest a timer's pass waits for them: GCs that follow one another without end
/// (a runtime retrying a GC, an operator's loop) must not stop the runtime-aware GC.
const SETTLE_MOST: Duration = Duration::from_secs(120);

/// Waits until no GC is freeing (every [`crate::l3_clients::gc::Gc::running`] slot free),
/// looking every `poll`, for at most `most`; returns how long it waited.
///
/// Why: a pass reads the whole ledger and holds the runtime's sandbox list while it plans,
/// and so does a GC (its plan, the delegate's store, the valid list). At 10,000 attachments
/// a CNI GC takes ~18 s, and two of the timer's passes began beside one (docs/performance.md,
/// run 44): both held their reads at once. A pass that waits frees the same attachments a
/// few seconds later (the two-pass rule counts passes, not ticks).
/// Polling, not a wait on the semaphore: the semaphore is fair, so a waiter for every slot
/// would hold up each new GC, of any network, behind the longest one under way.
async fn settle(running: &tokio::sync::Semaphore, poll: Duration, most: Duration) -> Duration {
    let idle = || running.available_permits() >= crate::l3_clients::gc::RUNNING;
    if idle() {
        return Duration::ZERO;
    }
    let began = tokio::time::Instant::now();
    while !idle() {
        let waited = began.elapsed();
        if waited >= most {
            debug!(
                waited_ms = waited.as_millis() as u64,
                "runtime-aware GC pass: GCs still freeing; the pass runs beside them"
            );
            return waited;
        }
        tokio::time::sleep(poll).await;
    }
    let waited = began.elapsed();
    debug!(
        waited_ms = waited.as_millis() as u64,
        "runtime-aware GC pass waited for the GCs under way"
    );
    waited
}

#[cfg(test)]
mod tests;
