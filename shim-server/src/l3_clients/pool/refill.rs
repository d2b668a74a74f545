//! The refiller: the pool's background task, which keeps each network's entries at the size
//! the watermarks give (sizing.rs) through the core's ADD flow, in concurrent batches, and
//! releases what is surplus (after the cool-down) or stale, or what the agent needs.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use dipam_proto::v1::CniRequest;
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Holder, Owner};
use rscni_types::version::SpecVersion;
use tracing::{info, warn};

use super::{census, sizing, *};
use crate::{
    l1_leaves::clock::now_ms,
    l1_leaves::error::ShimError,
    l2_core::core::attach::Early,
    l2_core::core::{Core, Prepared},
    l2_core::delegate::{config::DelegateConf, store},
};

/// What the refiller works with: the core, the pool, the agent's conflist (a network's first
/// template) and the networks whose ADDs are refused (divergence.rs).
#[derive(Clone)]
pub struct Refiller {
    pub core: Arc<Core>,
    pub pool: Arc<Pool>,
    pub agent: Arc<crate::l3_clients::agent::Agent>,
    pub misconfigured: Arc<crate::l3_clients::divergence::Misconfigured>,
}

/// At start, after the replay: index the ledger's committed pool entries, load the templates,
/// and doom what must go (every entry when the pool is off; entries the replay could not
/// release). The refiller ([`run`]) does the rest.
pub async fn init(r: &Refiller) -> Result<(), ShimError> {
    let on = r.pool.on();
    let node_name = r
        .pool
        .config
        .get()
        .map(|c| c.node.clone())
        .unwrap_or_default();
    // From the census: every container ID a record uses (key's or delegate's) for the next
    // entry's number, and the pool's records, without reading every record (census.rs).
    let node = node_name.clone();
    let (max_id, records) = r
        .core
        .ledger(move |l| {
            let max_id = l.census(|c| {
                c.container_ids()
                    .filter_map(|id| entry_number(id, &node))
                    .map(|n| n + 1)
                    .max()
                    .unwrap_or(0)
            })?;
            Ok((max_id, l.select(|e| e.holder == Holder::Pool)?))
        })
        .await?;
    let settings = r.core.ledger(|l| l.settings(TEMPLATE_SETTING)).await?;
    let mut entries: Vec<AttachmentRecord> = Vec::new();
    let mut doomed = Vec::new();
    for r in records {
        if r.state == AttachmentState::Committed && on {
            entries.push(r);
        } else {
            doomed.push(r.key);
        }
    }
    entries.sort_by_key(|r| {
        (
            r.created_at,
            entry_number(&r.key.container_id, &node_name).unwrap_or(u64::MAX),
        )
    });
    let mut templates = HashMap::new();
    let mut persisted = HashMap::new();
    for (name, text) in &settings {
        let network = name.trim_start_matches(TEMPLATE_SETTING).to_owned();
        match serde_json::from_str::<Template>(text) {
            Ok(t) if on => {
                persisted.insert(network.clone(), t.digest.clone());
                templates.insert(network, t);
            }
            Ok(_) => {
                // Off: forget the templates too, so a later run starts from what it sees.
                let name = name.clone();
                r.core.ledger(move |l| l.set_setting(&name, None)).await?;
            }
            Err(e) => {
                warn!(setting = %name, error = %e, "warm pool: ignoring an unreadable template")
            }
        }
    }
    let ready_count = entries.len();
    let mut st = r.pool.lock();
    for r in entries {
        st.ready
            .entry((r.key.network.clone(), r.config_digest.clone()))
            .or_default()
            .push_back(r);
    }
    st.templates = templates;
    st.persisted = persisted;
    if !doomed.is_empty() {
        info!(
            entries = doomed.len(),
            "warm pool: releasing entries left by an earlier run{}",
            if on { "" } else { " (the pool is off)" }
        );
    }
    st.doomed = doomed;
    drop(st);
    r.pool.next_id.store(max_id, Ordering::Relaxed);
    if on {
        let m = r.pool.marks();
        info!(
            target = m.target,
            minimum = m.minimum,
            max_above = m.max_above,
            release_after_ms = m.release_after.as_millis() as u64,
            ready = ready_count,
            "warm pool on"
        );
    }
    report_levels(&r.core, &r.pool);
    Ok(())
}

/// The refiller: keeps every network's pool at its size and releases what must go. One task
/// for all networks; woken by takes and new templates, and by its own retry timers.
pub async fn run(r: Refiller) {
    loop {
        let wait = step(&r).await;
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = r.pool.wake.notified() => {}
        }
    }
}

/// One round; returns how long to sleep unless woken.
pub(super) async fn step(r: &Refiller) -> Duration {
    let mut wait = Duration::from_secs(3600);
    seed_from_conflist(r, &mut wait);
    if let Err(e) = persist_templates(r).await {
        warn!(error = %e, "warm pool: cannot record the templates; retrying");
        wait = wait.min(BACKOFF_MAX);
    }
    let plans = plan(r, &mut wait).await;
    yield_to_agent(r, &plans);
    release_surplus(r, &plans, &mut wait).await;
    fill(r, &plans, &mut wait).await;
    report_levels(&r.core, &r.pool);
    wait
}

/// This round's plan per network with a current template.
type Plans = HashMap<String, (Template, sizing::Plan, census::Count)>;

/// Counts every network with a template and plans its pool (sizing.rs), recording what it
/// counted for `dipamctl status` and the metrics.
async fn plan(r: &Refiller, wait: &mut Duration) -> Plans {
    let marks = r.pool.marks();
    let mut plans = Plans::new();
    if !marks.on() {
        return plans;
    }
    let templates: Vec<(String, Template)> = r
        .pool
        .lock()
        .templates
        .iter()
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    for (network, t) in templates {
        let count = match census::count(&r.core, &network, &t).await {
            Ok(c) => c,
            Err(e) => {
                warn!(network = %network, error = %e, "warm pool: cannot count the network; retrying");
                *wait = (*wait).min(BACKOFF_MAX);
                continue;
            }
        };
        let mut st = r.pool.lock();
        let ready = st
            .ready
            .get(&(network.clone(), t.digest.clone()))
            .map_or(0, VecDeque::len);
        let sz = st.sizing.entry(network.clone()).or_default();
        let recent = sz.demand.recent(Instant::now());
        let p = sizing::plan(
            &marks,
            &sizing::Level {
                ready,
                filling: sz.filling,
                in_use: count.in_use,
                recent,
                range_free: count.range_free,
            },
        );
        sz.want = p.want;
        sz.in_use = count.in_use;
        sz.range_free = count.range_free;
        sz.range_short = p.range_short;
        // Demand decays, pods leave the range, the minimum follows the pods: look again.
        if recent > 0 {
            *wait = (*wait).min(sizing::DEMAND_WINDOW);
        }
        if p.range_short || marks.minimum > 0 {
            *wait = (*wait).min(RECOUNT);
        }
        plans.insert(network, (t, p, count));
    }
    plans
}

/// Agent addresses and claims come before the pool: while one waits on a network, that
/// network's pool takes nothing more (fill), and when the range has no free address left, or
/// the claim asks for an IP an entry holds, one entry per round is released for it.
fn yield_to_agent(r: &Refiller, plans: &Plans) {
    let waiting = census::agent_waiting(&r.agent);
    if waiting.is_empty() {
        return;
    }
    let mut st = r.pool.lock();
    let mut released = false;
    for w in &waiting {
        let exhausted = plans
            .get(&w.network)
            .is_some_and(|(_, _, c)| c.range_free == Some(0));
        let holds = |e: &AttachmentRecord| {
            w.requested.is_some_and(|ip| {
                e.result.as_ref().is_some_and(|v| {
                    crate::l2_core::delegate::config::result_addrs(v).contains(&ip)
                })
            })
        };
        let victim = st
            .ready
            .iter_mut()
            .filter(|((n, _), _)| *n == w.network)
            .find_map(|(_, q)| match q.iter().position(holds) {
                Some(i) => q.remove(i),
                None if exhausted => q.pop_back(),
                None => None,
            });
        if let Some(e) = victim {
            info!(entry = %e.key, network = %w.network, "warm pool: giving an entry back for an agent address");
            st.doomed.push(e.key);
            released = true;
        }
    }
    drop(st);
    if released {
        r.agent.wake.notify_one();
    }
}

/// Reports every pool's level (the metrics' gauges), whole: on every change the pool makes
/// (a take, a refill, a round of releases) and at start.
pub(super) fn report_levels(core: &Core, pool: &Pool) {
    if !core.events.listened() {
        return;
    }
    let pools = pool.status();
    let rows: Vec<crate::l1_leaves::events::PoolLevel<'_>> = pools
        .iter()
        .map(|p| {
            (
                p.network.as_str(),
                p.config_digest.as_str(),
                u64::from(p.ready),
                u64::from(p.target),
                p.in_use,
            )
        })
        .collect();
    core.events
        .emit(crate::l1_leaves::events::Event::PoolLevels(&rows));
}

/// The agent's conflist seeds a network's template until a pod brings one.
fn seed_from_conflist(r: &Refiller, wait: &mut Duration) {
    if !r.pool.on() {
        return;
    }
    let Some(cfg) = &r.agent.config else {
        return;
    };
    {
        // Once the conflist's network has a template, there is nothing to read.
        let st = r.pool.lock();
        if st
            .conflist_network
            .as_ref()
            .is_some_and(|n| st.templates.contains_key(n))
        {
            return;
        }
    }
    let Ok(base) = cfg.source.load() else {
        *wait = (*wait).min(SEED_POLL);
        return;
    };
    {
        let mut st = r.pool.lock();
        st.conflist_network = Some(base.network.clone());
        if st.templates.contains_key(&base.network) {
            return;
        }
    }
    let Ok(stdin) = serde_json::to_vec(&base.request) else {
        return;
    };
    let Ok(dc) = DelegateConf::from_request(&stdin, base.mode) else {
        return;
    };
    let digest = pool_digest(&dc);
    info!(network = %dc.network, digest, "warm pool: filling from the agent's conflist until a pod brings its config");
    r.pool.lock().templates.insert(
        dc.network.clone(),
        Template {
            digest,
            kind: dc.kind.clone(),
            version: dc.version.to_string(),
            conf: strip(&dc.conf),
            cni_path: String::new(),
            mode: base.mode as i32,
            source: "conflist".into(),
        },
    );
}

/// Writes templates that changed to the ledger's settings, so a restart refills at once.
async fn persist_templates(r: &Refiller) -> Result<(), ShimError> {
    let todo: Vec<(String, Template)> = {
        let st = r.pool.lock();
        st.templates
            .iter()
            .filter(|(n, t)| st.persisted.get(*n) != Some(&t.digest))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect()
    };
    for (network, t) in todo {
        let name = format!("{TEMPLATE_SETTING}{network}");
        let text = serde_json::to_string(&t).map_err(|e| ShimError::Internal(e.to_string()))?;
        r.core
            .ledger(move |l| l.set_setting(&name, Some(&text)))
            .await?;
        r.pool.lock().persisted.insert(network, t.digest);
    }
    Ok(())
}

/// Releases doomed entries, entries of a config no longer current, and entries above the
/// network's size once they have been surplus for the cool-down (`--pool-release-after`).
async fn release_surplus(r: &Refiller, plans: &Plans, wait: &mut Duration) {
    let cool = r.pool.marks().release_after;
    let todo: Vec<AttachmentKey> = {
        let mut st = r.pool.lock();
        if st.release_retry_at.is_some_and(|t| t > Instant::now()) {
            if let Some(t) = st.release_retry_at {
                *wait = (*wait).min(t.saturating_duration_since(Instant::now()));
            }
            return;
        }
        let mut todo = std::mem::take(&mut st.doomed);
        let now = Instant::now();
        let State {
            ready,
            templates,
            sizing,
            ..
        } = &mut *st;
        for ((network, digest), q) in ready.iter_mut() {
            let current = templates.get(network).is_some_and(|t| t.digest == *digest);
            let keep = match plans.get(network) {
                Some((_, p, _)) if current => p.want,
                // A current pool the round could not count keeps what it has.
                None if current => q.len(),
                _ => 0,
            };
            if current {
                let sz = sizing.entry(network.clone()).or_default();
                if q.len() <= keep {
                    sz.above_since = None;
                    continue;
                }
                let since = *sz.above_since.get_or_insert(now);
                let due = since + cool;
                if due > now {
                    *wait = (*wait).min(due - now);
                    continue;
                }
                sz.above_since = None;
            }
            while q.len() > keep {
                if let Some(e) = q.pop_back() {
                    todo.push(e.key);
                }
            }
        }
        ready.retain(|_, q| !q.is_empty());
        todo
    };
    let mut failed = Vec::new();
    for key in todo {
        match release_entry(r, &key).await {
            Ok(true) => {
                info!(entry = %key, "warm pool: entry released");
                r.pool
                    .lock()
                    .sizing
                    .entry(key.network.clone())
                    .or_default()
                    .releases += 1;
                r.core
                    .events
                    .emit(crate::l1_leaves::events::Event::PoolReleased);
            }
            Ok(false) => {}
            Err(e) => {
                warn!(entry = %key, error = %e, "warm pool: cannot release an entry; will retry");
                failed.push(key);
            }
        }
    }
    if !failed.is_empty() {
        let mut st = r.pool.lock();
        st.doomed.extend(failed);
        st.release_retry_at = Some(Instant::now() + RELEASE_RETRY);
        *wait = (*wait).min(RELEASE_RETRY);
    }
}

/// Releases one pool entry and forgets it, as any recorded attachment: marked `deleting`
/// (durable), the delegate's DEL with the recorded config, then dropped.
/// Whether it released one.
async fn release_entry(r: &Refiller, key: &AttachmentKey) -> Result<bool, ShimError> {
    let _guard = r.core.locks.lock(key).await;
    let Some(rec) = r.core.lookup(key)? else {
        return Ok(false);
    };
    if rec.owner != Owner::Pool {
        // Taken meanwhile (it is a pod's now, under its own key): nothing of the pool's.
        return Ok(false);
    }
    // Marked `deleting` durably before the delegate's DEL (as Core::release would), with a
    // crash point between: a crash at any step of a release is finished by the next start.
    let mut marked = rec;
    marked.state = AttachmentState::Deleting;
    marked.updated_at = crate::l1_leaves::clock::now();
    let put = marked.clone();
    r.core.ledger(move |l| l.put(&put)).await?;
    crate::l1_leaves::fault::hit("pool-release-after-mark");
    r.core.release(&marked).await?;
    crate::l1_leaves::fault::hit("pool-after-release");
    Ok(true)
}

/// Makes the entries this round's plans ask for: up to a batch per network at once, every
/// network's batch concurrently, while pod ADDs take from the pool; a network whose fill fails
/// backs off. A network where an agent address waits takes nothing (it comes first).
async fn fill(r: &Refiller, plans: &Plans, wait: &mut Duration) {
    let waiting: Vec<String> = census::agent_waiting(&r.agent)
        .into_iter()
        .map(|w| w.network)
        .collect();
    let most = r.pool.config.get().map_or(1, |c| c.batch.max(1));
    let mut batch = tokio::task::JoinSet::new();
    {
        let mut st = r.pool.lock();
        let now = Instant::now();
        for (network, (t, p, _)) in plans {
            if p.refill == 0 || waiting.contains(network) {
                continue;
            }
            if let Some(at) = st.fill.get(network).and_then(|f| f.retry_at)
                && at > now
            {
                *wait = (*wait).min(at - now);
                continue;
            }
            let n = p.refill.min(most);
            st.sizing.entry(network.clone()).or_default().filling += n;
            for _ in 0..n {
                let (r, network, t) = (r.clone(), network.clone(), t.clone());
                batch.spawn(async move {
                    skip_unrecorded_ids(&r, &network, &t).await;
                    let outcome = fill_one(&r, &network, &t).await;
                    (network, t, outcome)
                });
            }
        }
    }
    let mut made = false;
    while let Some(done) = batch.join_next().await {
        let Ok((network, t, outcome)) = done else {
            // A fill task panicked: its count is lost with it, so recount from scratch.
            warn!("warm pool: a refill task failed");
            for sz in r.pool.lock().sizing.values_mut() {
                sz.filling = 0;
            }
            continue;
        };
        made |= outcome.is_ok();
        filled(r, &network, &t, outcome, wait);
        r.pool.filled.notify_waiters();
        report_levels(&r.core, &r.pool);
    }
    // More may be due (a plan larger than a batch, demand meanwhile): plan again at once.
    if made {
        *wait = Duration::ZERO;
    }
}

/// One fill ended: its entry joins the ready ones, or the network backs off.
fn filled(
    r: &Refiller,
    network: &str,
    t: &Template,
    outcome: Result<AttachmentRecord, ShimError>,
    wait: &mut Duration,
) {
    let mut st = r.pool.lock();
    let sz = st.sizing.entry(network.to_owned()).or_default();
    sz.filling = sz.filling.saturating_sub(1);
    if outcome.is_ok() {
        sz.refills += 1;
    }
    let f = st.fill.entry(network.to_owned()).or_default();
    match outcome {
        Ok(entry) => {
            if f.failures > 0 {
                info!(network = %network, "warm pool: refill works again");
            }
            *f = Fill::default();
            r.core
                .events
                .emit(crate::l1_leaves::events::Event::PoolRefilled);
            // The template may have changed while the entry was being made: it then sits
            // under its own digest and is released as surplus.
            st.ready
                .entry((network.to_owned(), t.digest.clone()))
                .or_default()
                .push_back(entry);
        }
        Err(e) => {
            f.failures += 1;
            f.last_error = match e.code_and_details() {
                (_, d) if d.is_empty() => e.to_string(),
                (_, d) => format!("{e}: {d}"),
            };
            let backoff = BACKOFF_MIN
                .saturating_mul(1 << f.failures.min(8))
                .min(BACKOFF_MAX);
            f.retry_at = Some(Instant::now() + backoff);
            *wait = (*wait).min(backoff);
            r.pool.refill_failures.fetch_add(1, Ordering::Relaxed);
            r.core
                .events
                .emit(crate::l1_leaves::events::Event::PoolRefillFailed);
            warn!(network = %network, failures = f.failures, retry_in_ms = backoff.as_millis() as u64, error = %f.last_error, "warm pool: refill failed");
        }
    }
}

/// Before a network's first fill: entry numbers its delegate's store holds under pool IDs the
/// ledger does not know (a ledger rebuilt by `dipamctl recover` leaves those reserved) are
/// skipped, so a new entry does not collide with one (host-local refuses a duplicate ID).
async fn skip_unrecorded_ids(r: &Refiller, network: &str, t: &Template) {
    // The first fill of a network scans; the others of its batch wait for it.
    let _scan = r.pool.scan.lock().await;
    if !r.pool.lock().scanned.insert(network.to_owned()) {
        return;
    }
    let Some(node_name) = r.pool.config.get().map(|c| c.node.as_str()) else {
        return;
    };
    let Some(dir) = store::readable_dir(&t.kind, &t.conf, network) else {
        return;
    };
    if let Ok(held) = store::read(dir).await
        && let Some(n) = held
            .iter()
            .filter_map(|r| entry_number(&r.container_id, node_name))
            .max()
    {
        r.pool.next_id.fetch_max(n + 1, Ordering::Relaxed);
    }
}

/// Allocates one entry for `network` with template `t`, through the normal ADD path; returns
/// its committed record.
async fn fill_one(
    r: &Refiller,
    network: &str,
    t: &Template,
) -> Result<AttachmentRecord, ShimError> {
    let cfg = r
        .pool
        .config
        .get()
        .ok_or_else(|| ShimError::Internal("warm pool not configured".into()))?;
    if let Some(why) = r.misconfigured.of(network, None) {
        return Err(ShimError::Misconfigured {
            network: network.to_owned(),
            why,
        });
    }
    let n = r.pool.next_id.fetch_add(1, Ordering::Relaxed);
    let id = crate::l1_leaves::keys::pool_id(&cfg.node, n);
    crate::l1_leaves::validate::container_id(&id)?;
    let version: SpecVersion = t
        .version
        .parse()
        .map_err(|_| ShimError::Internal(format!("template version {:?}", t.version)))?;
    let req = CniRequest {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        request_id: format!("pool-{n:x}-{:x}", now_ms()),
        command: "ADD".into(),
        container_id: id.clone(),
        // Never created: a path no delegate can mistake for its own netns (as the agent's).
        netns: format!("/run/dipam/pool-netns/{id}"),
        ifname: IFNAME.into(),
        cni_args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={id}",
            cfg.namespace
        ),
        cni_path: t.cni_path.clone(),
        stdin: serde_json::to_vec(&t.conf).map_err(|e| ShimError::Internal(e.to_string()))?,
        mode: t.mode,
        issued_at_ms: now_ms(),
        issued_at: crate::l1_leaves::order::now().map(|b| dipam_proto::v1::BootStamp {
            boot_id: b.boot_id,
            ns: b.ns,
        }),
        ..CniRequest::default()
    };
    let p = Prepared {
        issued: crate::l1_leaves::order::from_wire(req.issued_at.as_ref()),
        caller: crate::l1_leaves::access::Caller::ROOT,
        key: AttachmentKey::new(network, &id, IFNAME),
        dc: DelegateConf {
            kind: t.kind.clone(),
            network: network.to_owned(),
            version,
            conf: t.conf.clone(),
        },
        req,
    };
    let _guard = r.core.locks.lock(&p.key).await;
    crate::l2_core::core::attach::attach(&r.core, &p, Owner::Pool, &mut Early::default()).await?;
    // The committed record, as the take will find it in the ledger.
    r.core
        .lookup(&p.key)?
        .filter(|r| r.owner == Owner::Pool && r.state == AttachmentState::Committed)
        .ok_or_else(|| ShimError::Internal(format!("pool entry {} vanished after its ADD", p.key)))
}
