//! The warm pool (`dipamd --warm-pool N`, off by default): addresses allocated from the
//! delegate ahead of time under dipamd's own keys, so that a pod's ADD is answered with one
//! ledger commit and no delegate exec.
//!
//! - **Entries** are ledger records with owner `pool`, container ID `dipam-pool-<node>-<n>`,
//!   ifname `eth0`, a CNI_NETNS that never exists and CNI_ARGS naming the entry. They are
//!   allocated through the same intent-before-exec ADD path as any attachment
//!   ([`crate::rpc::add::attach`]), so a crash while filling leaves an `adding` record that the
//!   start-up replay releases.
//! - **Per network and config**: each network has one template, the delegate config of the
//!   last pod ADD it saw (or of the agent's `--conflist`, until a pod brings one), without the
//!   parts that are per pod (`runtimeConfig`, `args`, `prevResult`). Its digest is the
//!   pool's: an entry serves a pod whose config has the same digest once stripped alike. The
//!   template is kept in the ledger's settings, so a restarted dipamd refills at once.
//! - **The take** ([`take`]), under the pod's key lock: an entry of the request's network and
//!   digest is claimed in memory and, in the same blocking-pool step as the commit, checked
//!   against the ledger (the pod's key has no record; the entry is there as the pool holds
//!   it); then ONE commit writes the pod's record (committed, the
//!   entry's result, `delegate_key` = the entry's key, netns and args) and deletes the entry.
//!   Before that commit the address is the pool's, after it the pod's. A failed commit puts
//!   the entry back. Requests that ask for particular addresses (`runtimeConfig.ips`,
//!   `args.cni.ips`, CNI_ARGS `IP=`) bypass the pool, as do stale and repeated ADDs (the
//!   normal path answers those).
//! - **Afterwards** the pod's record names the delegate's key: DEL, CHECK, GC, replay and the
//!   reconcile call the delegate with it (`AttachmentRecord::delegate_ids`). Addresses are not
//!   recycled into the pool: a pod's DEL releases them through the delegate.
//! - **The refiller** ([`run`]) keeps N committed entries per network for the current
//!   template, retries failures with backoff (reported in `dipamctl status`), and releases
//!   surplus entries: those of an old config, beyond a lowered N, or all of them when the pool
//!   is off (N = 0) and a previous run left some.
//! - **Reserved IDs**: container IDs starting with `dipam-pool-` belong to the pool. A
//!   runtime's ADD or CHECK for one is refused and its DEL does nothing, so no runtime call can
//!   release or reuse what the pool (or a pod served from it) holds.
//!
//! The trade-off (docs/performance.md): the delegate sees the pool's keys, not the pods' IDs.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use dipam_proto::v1::{CniRequest, PoolStatus};
use dipam_state::{
    AttachmentKey, AttachmentRecord, AttachmentState, DelegateKey, Durability, Owner,
};
use rscni_types::version::SpecVersion;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::{
    clock::{now, now_ms},
    delegate::{
        config::{DelegateConf, result_ips},
        store, version,
    },
    error::ShimError,
    rpc::add::Early,
    shim::{Prepared, Shim},
};

/// Every pool entry's container ID starts with this; the runtime may not use such IDs
/// (keys.rs reserves them, with every other key dipamd makes for itself).
pub const ID_PREFIX: &str = crate::keys::POOL_PREFIX;
/// The ifname of every pool entry.
pub const IFNAME: &str = "eth0";
/// The most entries per network `--warm-pool` accepts.
pub const MAX_SIZE: usize = 4096;
/// Where each network's template is kept in the ledger's settings.
const TEMPLATE_SETTING: &str = "pool/template/";
/// Refill retries back off from this ...
const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// ... to this.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A failed release of a surplus entry is retried after this long.
const RELEASE_RETRY: Duration = Duration::from_secs(5);
/// How often the refiller looks for the agent's conflist while it has no template for it.
const SEED_POLL: Duration = Duration::from_secs(2);

/// The pool's settings (dipamd flags).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Entries kept per network; 0 is off.
    pub size: usize,
    /// `--node-name`: part of each entry's container ID.
    pub node: String,
    /// K8S_POD_NAMESPACE in the entries' CNI_ARGS (`--agent-namespace`).
    pub namespace: String,
}

/// What a network's pool is filled with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Template {
    /// The pool digest: [`pool_digest`] of the config.
    digest: String,
    /// The delegate's type.
    kind: String,
    /// The cniVersion of the request it came from.
    version: String,
    /// The delegate config, without the per-pod parts.
    conf: Value,
    /// CNI_PATH of the request it came from (where the delegate was found).
    cni_path: String,
    /// The request's mode (dipam_proto::v1::Mode).
    mode: i32,
    /// "pod" or "conflist": a pod's config wins over the agent's conflist.
    source: String,
}

/// One network's refill state.
#[derive(Debug, Default)]
struct Fill {
    failures: u32,
    last_error: String,
    retry_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    templates: HashMap<String, Template>,
    /// The template digest last written to the settings, per network.
    persisted: HashMap<String, String>,
    /// Committed entries ready to hand out, per (network, digest), oldest first, as the
    /// ledger holds them (the take checks that it still does).
    ready: HashMap<(String, String), VecDeque<AttachmentRecord>>,
    /// Entries to release (surplus, stale config, pool off, a release that failed).
    doomed: Vec<AttachmentKey>,
    release_retry_at: Option<Instant>,
    fill: HashMap<String, Fill>,
    /// The network of the agent's conflist, once read.
    conflist_network: Option<String>,
    /// Networks whose delegate store was searched for pool IDs the ledger does not know.
    scanned: std::collections::HashSet<String>,
    /// (hits, misses) per (network, digest).
    counts: HashMap<(String, String), (u64, u64)>,
}

/// The pool's live state, shared by the ADD path and the refiller.
#[derive(Debug, Default)]
pub struct Pool {
    config: OnceLock<PoolConfig>,
    state: Mutex<State>,
    /// Wakes the refiller: an entry was taken, a new template arrived.
    pub wake: Notify,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// ADDs that asked for particular addresses and so bypassed the pool.
    pub bypassed: AtomicU64,
    pub refill_failures: AtomicU64,
    next_id: AtomicU64,
}

/// A config without what differs between pods of one network: the runtime's per-pod values
/// (`runtimeConfig`, `args`) and `prevResult`.
fn strip(conf: &Value) -> Value {
    let mut c = conf.clone();
    if let Some(o) = c.as_object_mut() {
        o.remove("runtimeConfig");
        o.remove("args");
        o.remove("prevResult");
    }
    c
}

/// The digest a request's pool has: its delegate config's digest once stripped of the per-pod
/// parts. A pool entry records exactly this as its `config_digest`.
pub fn pool_digest(dc: &DelegateConf) -> String {
    DelegateConf {
        conf: strip(&dc.conf),
        ..dc.clone()
    }
    .digest()
}

/// Whether the request asks the delegate for particular addresses: host-local's
/// `runtimeConfig.ips`, `args.cni.ips` and CNI_ARGS `IP=`. A pool entry cannot honour that.
pub fn wants_own_ips(p: &Prepared) -> bool {
    let set = |v: &Value| match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    set(&p.dc.conf["runtimeConfig"]["ips"])
        || set(&p.dc.conf["args"]["cni"]["ips"])
        || p.req.cni_args.split(';').any(|kv| {
            kv.split_once('=')
                .is_some_and(|(k, v)| k.trim() == "IP" && !v.trim().is_empty())
        })
}

/// The entry number of a pool container ID of `node`, if it is one.
fn entry_number(container_id: &str, node: &str) -> Option<u64> {
    container_id
        .strip_prefix(ID_PREFIX)?
        .strip_prefix(node)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

impl Pool {
    /// Sets the pool's configuration (once, at start).
    pub fn configure(&self, config: PoolConfig) {
        let _ = self.config.set(config);
    }

    /// The configured size; 0 (off) when unconfigured.
    pub fn size(&self) -> usize {
        self.config.get().map_or(0, |c| c.size)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the config of a pod's ADD as its network's template (a pod's config replaces
    /// an older one, or the conflist's); wakes the refiller when it changed.
    fn observe(&self, p: &Prepared, digest: &str) {
        let changed = {
            let mut st = self.lock();
            match st.templates.get(&p.key.network) {
                Some(t) if t.digest == digest => false,
                _ => {
                    st.templates.insert(
                        p.key.network.clone(),
                        Template {
                            digest: digest.to_owned(),
                            kind: p.dc.kind.clone(),
                            version: p.dc.version.to_string(),
                            conf: strip(&p.dc.conf),
                            cni_path: p.req.cni_path.clone(),
                            mode: p.req.mode,
                            source: "pod".into(),
                        },
                    );
                    true
                }
            }
        };
        if changed {
            info!(network = %p.key.network, digest, "warm pool: new config for this network");
            self.wake.notify_one();
        }
    }

    /// Claims the oldest ready entry of (network, digest); nobody else can take or release it
    /// until it is handed back with [`Pool::unclaim`] or gone.
    fn claim(&self, network: &str, digest: &str) -> Option<AttachmentRecord> {
        self.lock()
            .ready
            .get_mut(&(network.to_owned(), digest.to_owned()))?
            .pop_front()
    }

    fn unclaim(&self, digest: &str, entry: AttachmentRecord) {
        self.lock()
            .ready
            .entry((entry.key.network.clone(), digest.to_owned()))
            .or_default()
            .push_front(entry);
    }

    fn count(&self, network: &str, digest: &str, hit: bool) {
        let mut st = self.lock();
        let c = st
            .counts
            .entry((network.to_owned(), digest.to_owned()))
            .or_default();
        if hit {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
    }

    /// The pools for `dipamctl status` and the metrics.
    pub fn status(&self) -> Vec<PoolStatus> {
        let size = self.size();
        let st = self.lock();
        let mut keys: Vec<(String, String)> = st.ready.keys().cloned().collect();
        for (net, t) in &st.templates {
            keys.push((net.clone(), t.digest.clone()));
        }
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter_map(|(network, digest)| {
                let current = st
                    .templates
                    .get(&network)
                    .is_some_and(|t| t.digest == digest);
                let ready = st
                    .ready
                    .get(&(network.clone(), digest.clone()))
                    .map_or(0, VecDeque::len);
                if !current && ready == 0 {
                    return None;
                }
                let (hits, misses) = st
                    .counts
                    .get(&(network.clone(), digest.clone()))
                    .copied()
                    .unwrap_or_default();
                let fill = st.fill.get(&network).filter(|_| current);
                Some(PoolStatus {
                    ready: ready as u32,
                    target: if current { size as u32 } else { 0 },
                    hits,
                    misses,
                    refill_failures: fill.map_or(0, |f| u64::from(f.failures)),
                    last_error: fill.map(|f| f.last_error.clone()).unwrap_or_default(),
                    source: st
                        .templates
                        .get(&network)
                        .filter(|_| current)
                        .map(|t| t.source.clone())
                        .unwrap_or_default(),
                    network,
                    config_digest: digest,
                })
            })
            .collect()
    }
}

/// At start, after the replay: index the ledger's committed pool entries, load the templates,
/// and doom what must go (every entry when the pool is off; entries the replay could not
/// release). The refiller ([`run`]) does the rest.
pub async fn init(shim: &Shim) -> Result<(), ShimError> {
    let size = shim.pool.size();
    let node = shim
        .pool
        .config
        .get()
        .map(|c| c.node.clone())
        .unwrap_or_default();
    let records = shim.ledger(|l| l.list(None)).await?;
    let settings = shim.ledger(|l| l.settings(TEMPLATE_SETTING)).await?;
    let mut max_id = 0;
    let mut entries: Vec<AttachmentRecord> = Vec::new();
    let mut doomed = Vec::new();
    for r in &records {
        for id in [r.key.container_id.as_str(), r.delegate_ids().0] {
            if let Some(n) = entry_number(id, &node) {
                max_id = max_id.max(n + 1);
            }
        }
        if r.owner == Owner::Pool {
            if r.state == AttachmentState::Committed && size > 0 {
                entries.push(r.clone());
            } else {
                doomed.push(r.key.clone());
            }
        }
    }
    entries.sort_by_key(|r| {
        (
            r.created_at,
            entry_number(&r.key.container_id, &node).unwrap_or(u64::MAX),
        )
    });
    let mut templates = HashMap::new();
    let mut persisted = HashMap::new();
    for (name, text) in &settings {
        let network = name.trim_start_matches(TEMPLATE_SETTING).to_owned();
        match serde_json::from_str::<Template>(text) {
            Ok(t) if size > 0 => {
                persisted.insert(network.clone(), t.digest.clone());
                templates.insert(network, t);
            }
            Ok(_) => {
                // Off: forget the templates too, so a later run starts from what it sees.
                let name = name.clone();
                shim.ledger(move |l| l.set_setting(&name, None)).await?;
            }
            Err(e) => {
                warn!(setting = %name, error = %e, "warm pool: ignoring an unreadable template")
            }
        }
    }
    let ready_count = entries.len();
    let mut st = shim.pool.lock();
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
            if size == 0 { " (the pool is off)" } else { "" }
        );
    }
    st.doomed = doomed;
    drop(st);
    shim.pool.next_id.store(max_id, Ordering::Relaxed);
    if size > 0 {
        info!(size, ready = ready_count, "warm pool on");
    }
    report_levels(shim);
    Ok(())
}

/// A pod's ADD from the pool, if it can be served from it; `None` sends the request down the
/// normal path. The caller holds the pod key's lock.
pub async fn take(
    shim: &Shim,
    p: &Prepared,
    early: &mut Early,
) -> Result<Option<Vec<u8>>, ShimError> {
    // Root's pods only: a non-root caller's config must not become the template dipamd
    // fills the network's pool with, as root, in the background (docs/cfp.md, "Threat
    // model"); its ADDs take the normal path, recorded under its uid.
    if shim.pool.size() == 0 || !p.caller.is_root() {
        return Ok(None);
    }
    let digest = pool_digest(&p.dc);
    shim.pool.observe(p, &digest);
    if wants_own_ips(p) {
        shim.pool.bypassed.fetch_add(1, Ordering::Relaxed);
        shim.events
            .emit(crate::events::Event::PoolRequest { outcome: "bypass" });
        return Ok(None);
    }
    // A stale ADD is refused, a repeated one answered from the ledger and an interrupted one
    // finished: all by the normal path.
    if shim.tombstone(&p.key).is_some_and(|del| {
        crate::order::before(
            crate::order::from_wire(p.req.issued_at.as_ref()).as_ref(),
            Some(&del),
        ) == Some(true)
    }) {
        return Ok(None);
    }
    loop {
        let Some(entry) = shim.pool.claim(&p.key.network, &digest) else {
            // The normal path also handles a key that has a record (repeated, interrupted).
            shim.pool.misses.fetch_add(1, Ordering::Relaxed);
            shim.pool.count(&p.key.network, &digest, false);
            shim.events
                .emit(crate::events::Event::PoolRequest { outcome: "miss" });
            shim.pool.wake.notify_one();
            return Ok(None);
        };
        let Some(result) = entry.result.clone() else {
            warn!(entry = %entry.key, "warm pool: an entry without a result; releasing it");
            shim.pool.lock().doomed.push(entry.key);
            continue;
        };
        let t = now();
        let rec = AttachmentRecord {
            key: p.key.clone(),
            owner: Owner::Pod,
            state: AttachmentState::Committed,
            delegate_type: entry.delegate_type.clone(),
            delegate_version: entry.delegate_version.clone(),
            delegate_config: entry.delegate_config.clone(),
            netns: p.req.netns.clone(),
            cni_args: p.req.cni_args.clone(),
            cni_path: entry.cni_path.clone(),
            result: Some(result.clone()),
            // The pod's own digest: its repeated ADD is answered from the ledger, and a
            // changed config refused, exactly as for any pod.
            config_digest: p.dc.digest(),
            request_id: p.req.request_id.clone(),
            created_at: t,
            updated_at: t,
            issued_ms: p.req.issued_at_ms,
            issued_at: crate::order::from_wire(p.req.issued_at.as_ref()),
            delegate_key: Some(DelegateKey {
                container_id: entry.key.container_id.clone(),
                ifname: entry.key.ifname.clone(),
                netns: entry.netns.clone(),
                cni_args: entry.cni_args.clone(),
            }),
            creator_uid: p.caller.recorded_uid(),
        };
        // An entry whose address the agent holds must never reach a pod: release it instead.
        if shim.check_conflict(&rec).await.is_err() {
            shim.pool.lock().doomed.push(entry.key);
            shim.pool.wake.notify_one();
            continue;
        }
        let parsed = serde_json::from_value(result.clone())
            .map_err(|e| ShimError::Internal(format!("recorded result of {}: {e}", entry.key)))?;
        let rendered = version::render(p.dc.version, parsed)?;
        // One trip to the blocking pool: the pod's key must have no record (else the normal
        // path answers), the entry must still be in the ledger exactly as the pool knows it,
        // and then the one commit. A main-mode plugin (AddEarly) gets the result between the
        // checks and the commit, to wire the pod while it runs (rpc/add.rs, `Early`).
        let (commit, expected) = (rec.clone(), entry.clone());
        let (mut tx, answer) = (early.take(), rendered.clone());
        let outcome = shim
            .ledger(move |l| {
                if l.get(&commit.key)?.is_some() {
                    return Ok((Take::KeyTaken, tx));
                }
                if l.get(&expected.key)?.as_ref() != Some(&expected) {
                    return Ok((Take::EntryChanged, tx));
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(answer);
                }
                // In the kernel is enough (Durability::SurvivesProcessCrash): a power cut that loses the take
                // gives the entry back to the pool, and the pod died with the node.
                l.put_removing(&commit, &expected.key, Durability::SurvivesProcessCrash)?;
                Ok((Take::Done, None))
            })
            .await;
        match outcome {
            Ok((Take::Done, _)) => {}
            Ok((Take::KeyTaken, unused)) => {
                early.restore(unused);
                shim.pool.unclaim(&digest, entry);
                return Ok(None);
            }
            Ok((Take::EntryChanged, unused)) => {
                early.restore(unused);
                warn!(entry = %entry.key, "warm pool: the ledger no longer holds this entry as the pool knew it; skipping it");
                continue;
            }
            Err(e) => {
                // Nothing was written: the entry is still the pool's.
                shim.pool.unclaim(&digest, entry);
                return Err(e);
            }
        }
        crate::fault::hit("pool-after-take");
        shim.pool.hits.fetch_add(1, Ordering::Relaxed);
        shim.pool.count(&p.key.network, &digest, true);
        shim.events
            .emit(crate::events::Event::PoolRequest { outcome: "hit" });
        // The pod's record replaced the entry's: one pool attachment fewer, one pod's more.
        shim.attachment_delta(&entry, -1);
        shim.attachment_delta(&rec, 1);
        report_levels(shim);
        shim.pool.wake.notify_one();
        info!(
            key = %p.key,
            pool_key = %entry.key,
            ips = ?result_ips(&result),
            "attachment added from the warm pool"
        );
        return Ok(Some(rendered));
    }
}

/// How the take's ledger step went.
enum Take {
    Done,
    /// The pod's key has a record: the normal path answers.
    KeyTaken,
    /// The entry is gone or differs from what the pool holds in memory.
    EntryChanged,
}

/// Points a request for a pod served from the pool at the delegate's key, before DEL or CHECK
/// runs the delegate: the pool entry's container ID, ifname, netns and args, and the config
/// the delegate got at ADD (the request's cniVersion and prevResult kept). `p.key` stays the
/// pod's: the ledger and the locks are about the pod.
pub fn redirect(p: &mut Prepared, rec: &AttachmentRecord) -> Result<(), ShimError> {
    let Some(d) = &rec.delegate_key else {
        return Ok(());
    };
    let mut conf: Value = serde_json::from_str(&rec.delegate_config)
        .map_err(|e| ShimError::Internal(format!("recorded config of {}: {e}", rec.key)))?;
    if let Some(o) = conf.as_object_mut() {
        o.insert("cniVersion".into(), Value::String(p.dc.version.to_string()));
        match p.dc.conf.get("prevResult") {
            Some(prev) => o.insert("prevResult".into(), prev.clone()),
            None => o.remove("prevResult"),
        };
    }
    p.dc.conf = conf;
    p.dc.kind = rec.delegate_type.clone();
    p.req.container_id = d.container_id.clone();
    p.req.ifname = d.ifname.clone();
    p.req.netns = d.netns.clone();
    p.req.cni_args = d.cni_args.clone();
    Ok(())
}

/// The refiller: keeps every network's pool at its size and releases what must go. One task
/// for all networks; woken by takes and new templates, and by its own retry timers.
pub async fn run(shim: Arc<Shim>) {
    loop {
        let wait = step(&shim).await;
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shim.pool.wake.notified() => {}
        }
    }
}

/// One round; returns how long to sleep unless woken.
async fn step(shim: &Shim) -> Duration {
    let mut wait = Duration::from_secs(3600);
    seed_from_conflist(shim, &mut wait);
    if let Err(e) = persist_templates(shim).await {
        warn!(error = %e, "warm pool: cannot record the templates; retrying");
        wait = wait.min(BACKOFF_MAX);
    }
    release_surplus(shim, &mut wait).await;
    fill(shim, &mut wait).await;
    report_levels(shim);
    wait
}

/// Reports every pool's level (the metrics' gauges), whole: on every change the pool makes
/// (a take, a refill, a round of releases) and at start.
fn report_levels(shim: &Shim) {
    if !shim.events.listened() {
        return;
    }
    let pools = shim.pool.status();
    let rows: Vec<(&str, &str, u64, u64)> = pools
        .iter()
        .map(|p| {
            (
                p.network.as_str(),
                p.config_digest.as_str(),
                u64::from(p.ready),
                u64::from(p.target),
            )
        })
        .collect();
    shim.events.emit(crate::events::Event::PoolLevels(&rows));
}

/// The agent's conflist seeds a network's template until a pod brings one.
fn seed_from_conflist(shim: &Shim, wait: &mut Duration) {
    if shim.pool.size() == 0 {
        return;
    }
    let Some(cfg) = &shim.agent.config else {
        return;
    };
    {
        // Once the conflist's network has a template, there is nothing to read.
        let st = shim.pool.lock();
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
        let mut st = shim.pool.lock();
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
    shim.pool.lock().templates.insert(
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
async fn persist_templates(shim: &Shim) -> Result<(), ShimError> {
    let todo: Vec<(String, Template)> = {
        let st = shim.pool.lock();
        st.templates
            .iter()
            .filter(|(n, t)| st.persisted.get(*n) != Some(&t.digest))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect()
    };
    for (network, t) in todo {
        let name = format!("{TEMPLATE_SETTING}{network}");
        let text = serde_json::to_string(&t).map_err(|e| ShimError::Internal(e.to_string()))?;
        shim.ledger(move |l| l.set_setting(&name, Some(&text)))
            .await?;
        shim.pool.lock().persisted.insert(network, t.digest);
    }
    Ok(())
}

/// Releases doomed entries, entries of a config no longer current, and entries beyond the size.
async fn release_surplus(shim: &Shim, wait: &mut Duration) {
    let size = shim.pool.size();
    let todo: Vec<AttachmentKey> = {
        let mut st = shim.pool.lock();
        if st.release_retry_at.is_some_and(|t| t > Instant::now()) {
            if let Some(t) = st.release_retry_at {
                *wait = (*wait).min(t.saturating_duration_since(Instant::now()));
            }
            return;
        }
        let current: HashMap<String, String> = st
            .templates
            .iter()
            .map(|(n, t)| (n.clone(), t.digest.clone()))
            .collect();
        let mut todo = std::mem::take(&mut st.doomed);
        for ((network, digest), q) in &mut st.ready {
            let keep = match current.get(network) {
                Some(d) if d != digest => 0,
                _ => size,
            };
            while q.len() > keep {
                if let Some(e) = q.pop_back() {
                    todo.push(e.key);
                }
            }
        }
        st.ready.retain(|_, q| !q.is_empty());
        todo
    };
    let mut failed = Vec::new();
    for key in todo {
        match release_entry(shim, &key).await {
            Ok(()) => info!(entry = %key, "warm pool: surplus entry released"),
            Err(e) => {
                warn!(entry = %key, error = %e, "warm pool: cannot release a surplus entry; will retry");
                failed.push(key);
            }
        }
    }
    if !failed.is_empty() {
        let mut st = shim.pool.lock();
        st.doomed.extend(failed);
        st.release_retry_at = Some(Instant::now() + RELEASE_RETRY);
        *wait = (*wait).min(RELEASE_RETRY);
    }
}

/// Releases one pool entry and forgets it, as any recorded attachment: marked `deleting`
/// (durable), the delegate's DEL with the recorded config, then dropped.
async fn release_entry(shim: &Shim, key: &AttachmentKey) -> Result<(), ShimError> {
    let _guard = shim.locks.lock(key).await;
    let Some(rec) = shim.lookup(key)? else {
        return Ok(());
    };
    if rec.owner != Owner::Pool {
        // Taken meanwhile (it is a pod's now, under its own key): nothing of the pool's.
        return Ok(());
    }
    if rec.state != AttachmentState::Deleting {
        let mut marked = rec.clone();
        marked.state = AttachmentState::Deleting;
        marked.updated_at = now();
        shim.ledger(move |l| l.put(&marked)).await?;
    }
    shim.release_recorded(&rec).await?;
    let k = key.clone();
    shim.ledger(move |l| l.remove(&k)).await?;
    shim.attachment_delta(&rec, -1);
    Ok(())
}

/// Fills every network's current pool up to the size, one entry at a time, round-robin over
/// the networks; a network whose fill fails backs off.
async fn fill(shim: &Shim, wait: &mut Duration) {
    let size = shim.pool.size();
    if size == 0 {
        return;
    }
    loop {
        let due: Vec<(String, Template)> = {
            let st = shim.pool.lock();
            let now = Instant::now();
            st.templates
                .iter()
                .filter(|(n, t)| {
                    st.ready
                        .get(&((*n).clone(), t.digest.clone()))
                        .map_or(0, VecDeque::len)
                        < size
                })
                .filter(|(n, _)| match st.fill.get(*n).and_then(|f| f.retry_at) {
                    Some(at) if at > now => {
                        *wait = (*wait).min(at - now);
                        false
                    }
                    _ => true,
                })
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect()
        };
        if due.is_empty() {
            return;
        }
        for (network, t) in due {
            skip_unrecorded_ids(shim, &network, &t);
            let outcome = fill_one(shim, &network, &t).await;
            let mut st = shim.pool.lock();
            let f = st.fill.entry(network.clone()).or_default();
            match outcome {
                Ok(entry) => {
                    if f.failures > 0 {
                        info!(network = %network, "warm pool: refill works again");
                    }
                    *f = Fill::default();
                    // The template may have changed while the entry was being made: it then
                    // sits under its own digest and is released as surplus.
                    st.ready
                        .entry((network.clone(), t.digest.clone()))
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
                    shim.pool.refill_failures.fetch_add(1, Ordering::Relaxed);
                    shim.events.emit(crate::events::Event::PoolRefillFailed);
                    warn!(network = %network, failures = f.failures, retry_in_ms = backoff.as_millis() as u64, error = %f.last_error, "warm pool: refill failed");
                }
            }
            drop(st);
            report_levels(shim);
        }
    }
}

/// Before a network's first fill: entry numbers its delegate's store holds under pool IDs the
/// ledger does not know (a ledger rebuilt by `dipamctl recover` leaves those reserved) are
/// skipped, so a new entry does not collide with one (host-local refuses a duplicate ID).
fn skip_unrecorded_ids(shim: &Shim, network: &str, t: &Template) {
    if !shim.pool.lock().scanned.insert(network.to_owned()) {
        return;
    }
    let Some(node) = shim.pool.config.get().map(|c| c.node.as_str()) else {
        return;
    };
    if let Some(dir) = store::readable_dir(&t.kind, &t.conf, network)
        && let Ok(held) = store::reservations(&dir)
        && let Some(n) = held
            .iter()
            .filter_map(|r| entry_number(&r.container_id, node))
            .max()
    {
        shim.pool.next_id.fetch_max(n + 1, Ordering::Relaxed);
    }
}

/// Allocates one entry for `network` with template `t`, through the normal ADD path; returns
/// its committed record.
async fn fill_one(shim: &Shim, network: &str, t: &Template) -> Result<AttachmentRecord, ShimError> {
    let cfg = shim
        .pool
        .config
        .get()
        .ok_or_else(|| ShimError::Internal("warm pool not configured".into()))?;
    if let Some(why) = shim
        .misconfigured
        .lock()
        .ok()
        .and_then(|m| m.get(network).cloned())
    {
        return Err(ShimError::Misconfigured {
            network: network.to_owned(),
            why,
        });
    }
    let n = shim.pool.next_id.fetch_add(1, Ordering::Relaxed);
    let id = crate::keys::pool_id(&cfg.node, n);
    crate::validate::container_id(&id)?;
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
        issued_at: crate::order::now().map(|b| dipam_proto::v1::BootStamp {
            boot_id: b.boot_id,
            ns: b.ns,
        }),
        ..CniRequest::default()
    };
    let p = Prepared {
        caller: crate::access::Caller::ROOT,
        key: AttachmentKey::new(network, &id, IFNAME),
        dc: DelegateConf {
            kind: t.kind.clone(),
            network: network.to_owned(),
            version,
            conf: t.conf.clone(),
        },
        req,
    };
    let _guard = shim.locks.lock(&p.key).await;
    crate::rpc::add::attach(shim, &p, Owner::Pool, &mut Early::default()).await?;
    // The committed record, as the take will find it in the ledger.
    shim.lookup(&p.key)?
        .filter(|r| r.owner == Owner::Pool && r.state == AttachmentState::Committed)
        .ok_or_else(|| ShimError::Internal(format!("pool entry {} vanished after its ADD", p.key)))
}

#[cfg(test)]
mod tests {
    use crate::{access::Caller, rpc::tests::add_as};
    use std::time::Duration;

    use dipam_proto::v1::Mode;
    use dipam_state::MemStore;
    use serde_json::json;
    use tempfile::TempDir;

    use super::*;
    use crate::{
        delegate::Executor,
        rpc::{check, del},
    };

    /// A delegate that records each call and hands out 10.9.0.2, .3, ... in turn.
    const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $CNI_ARGS" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}' ;;
ADD)
  if [ -f "$d/fail-add" ]; then echo '{"code":999,"msg":"no addresses"}'; exit 1; fi
  n=$(cat "$d/n" 2>/dev/null || echo 1); n=$((n+1)); echo $n > "$d/n"
  echo "{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.9.0.$n/24\",\"gateway\":\"10.9.0.1\"}]}" ;;
esac
"#;

    struct Bench {
        dir: TempDir,
        shim: Arc<Shim>,
        store: Arc<MemStore>,
    }

    impl Bench {
        fn new(size: usize) -> Self {
            let store = Arc::new(MemStore::new());
            let (dir, shim) = crate::rpc::tests::scripted_shim(SCRIPT, store.clone());
            shim.pool.configure(PoolConfig {
                size,
                node: "n1".into(),
                namespace: "kube-system".into(),
            });
            Self { dir, shim, store }
        }

        /// Delegate calls other than VERSION, as "COMMAND CONTAINERID IFNAME ARGS".
        fn calls(&self) -> Vec<String> {
            std::fs::read_to_string(self.dir.path().join("calls"))
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.starts_with("VERSION"))
                .map(str::to_owned)
                .collect()
        }

        fn record(&self, cid: &str) -> Option<AttachmentRecord> {
            self.shim
                .ledger
                .get(&AttachmentKey::new("net", cid, "eth0"))
                .unwrap()
        }

        fn entries(&self) -> Vec<AttachmentRecord> {
            self.shim
                .ledger
                .list(None)
                .unwrap()
                .into_iter()
                .filter(|r| r.owner == Owner::Pool)
                .collect()
        }

        fn ready(&self) -> u32 {
            self.shim.pool.status().iter().map(|p| p.ready).sum()
        }

        /// One refiller round, as the background task runs it.
        async fn refill(&self) {
            step(&self.shim).await;
        }
    }

    /// The RPC tests' request, with a netns and request id of the pod's own.
    fn request(cid: &str, version: &str, extra: Value) -> CniRequest {
        CniRequest {
            request_id: format!("req-{cid}"),
            netns: format!("/var/run/netns/{cid}"),
            ..crate::rpc::tests::request(cid, version, extra)
        }
    }

    /// A pool of two: the first pod fills it (its own ADD goes to the delegate); the next
    /// pod is answered from it with no delegate exec for the pod, in the request's version.
    async fn filled(size: usize) -> Bench {
        let b = Bench::new(size);
        add_as(&b.shim, Caller::ROOT, request("first", "1.0.0", json!({})))
            .await
            .unwrap();
        b.refill().await;
        assert_eq!(b.ready(), size as u32);
        b
    }

    #[tokio::test]
    async fn a_pod_takes_an_entry_in_one_commit_without_a_delegate_exec() {
        let b = filled(2).await;
        let before = b.calls();
        assert_eq!(before.len(), 3, "{before:?}");
        assert!(before[1].starts_with("ADD dipam-pool-n1-0 eth0 IgnoreUnknown=1;"));
        assert!(before[1].contains("K8S_POD_NAME=dipam-pool-n1-0"));

        // Only the first pod's result skipped the disk; the pool's own entries are on it.
        assert_eq!(b.store.process_commits(), 1);
        let out = add_as(&b.shim, Caller::ROOT, request("pod", "1.1.0", json!({})))
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cniVersion"], "1.1.0");
        assert_eq!(v["ips"][0]["address"], "10.9.0.3/24");
        assert_eq!(b.calls(), before, "the pod's ADD ran the delegate");
        // The take, only into the kernel (Durability).
        assert_eq!(b.store.process_commits(), 2);

        let rec = b.record("pod").unwrap();
        assert_eq!(rec.owner, Owner::Pod);
        assert_eq!(rec.state, AttachmentState::Committed);
        assert_eq!(rec.netns, "/var/run/netns/pod");
        assert_eq!(rec.request_id, "req-pod");
        let d = rec.delegate_key.clone().unwrap();
        assert_eq!(
            (d.container_id.as_str(), d.ifname.as_str()),
            ("dipam-pool-n1-0", "eth0")
        );
        assert_eq!(d.netns, "/run/dipam/pool-netns/dipam-pool-n1-0");
        assert!(b.record("dipam-pool-n1-0").is_none(), "the entry stays");
        assert_eq!(b.entries().len(), 1);
        assert_eq!(b.shim.pool.hits.load(Ordering::Relaxed), 1);

        // A repeated ADD is answered from the ledger, not from the pool again.
        let again = add_as(&b.shim, Caller::ROOT, request("pod", "1.1.0", json!({})))
            .await
            .unwrap();
        assert_eq!(again, out);
        assert_eq!(b.entries().len(), 1);

        // The refiller brings it back to two.
        b.refill().await;
        assert_eq!(b.entries().len(), 2);
        assert!(
            b.calls()
                .last()
                .unwrap()
                .starts_with("ADD dipam-pool-n1-2 eth0")
        );
    }

    #[tokio::test]
    async fn a_failed_take_commit_leaves_the_entry_in_the_pool() {
        let b = filled(2).await;
        let entries = b.entries();
        b.store.fail_next_commits(1);
        let e = add_as(&b.shim, Caller::ROOT, request("pod", "1.0.0", json!({})))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        assert!(b.record("pod").is_none());
        assert_eq!(b.entries(), entries, "the pool lost or changed an entry");
        assert_eq!(b.ready(), 2);
        // The retry takes the same, oldest entry.
        add_as(&b.shim, Caller::ROOT, request("pod", "1.0.0", json!({})))
            .await
            .unwrap();
        let d = b.record("pod").unwrap().delegate_key.unwrap();
        assert_eq!(d.container_id, entries[0].key.container_id);
    }

    /// A main-mode plugin (AddEarly) gets a pooled result before the take's commit, then the
    /// outcome; when that commit fails, the outcome is the error and the entry stays.
    #[tokio::test]
    async fn an_early_take_answers_before_its_commit() {
        use dipam_proto::v1::cni_reply::Outcome;

        let b = filled(2).await;
        let replies = |cid: &'static str| {
            crate::rpc::tests::add_early_replies(&b.shim, request(cid, "1.0.0", json!({})))
        };
        let entries = b.entries();
        b.store.fail_next_commits(1);
        let failed = replies("pod").await;
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(failed[0].pending_commit);
        assert!(
            matches!(failed[1].outcome, Some(Outcome::Error(_))),
            "{failed:?}"
        );
        assert!(b.record("pod").is_none());
        assert_eq!(b.entries(), entries, "the pool lost or changed an entry");

        let before = b.calls();
        let taken = replies("pod").await;
        assert_eq!(taken.len(), 2, "{taken:?}");
        assert!(taken[0].pending_commit && !taken[1].pending_commit);
        assert_eq!(taken[0].outcome, taken[1].outcome);
        assert_eq!(b.calls(), before, "the pod's ADD ran the delegate");
        assert!(b.record("pod").unwrap().delegate_key.is_some());
    }

    #[tokio::test]
    async fn del_and_check_of_a_pooled_pod_use_the_pool_key() {
        let b = filled(1).await;
        let out = add_as(&b.shim, Caller::ROOT, request("pod", "1.0.0", json!({})))
            .await
            .unwrap();
        let prev: Value = serde_json::from_slice(&out).unwrap();
        check::run(
            &b.shim,
            Caller::ROOT,
            request("pod", "1.0.0", json!({ "prevResult": prev.clone() })),
        )
        .await
        .unwrap();
        assert!(
            b.calls()
                .last()
                .unwrap()
                .starts_with("CHECK dipam-pool-n1-0 eth0 IgnoreUnknown=1;"),
            "{:?}",
            b.calls()
        );
        del::run(
            &b.shim,
            Caller::ROOT,
            request("pod", "1.0.0", json!({ "prevResult": prev })),
        )
        .await
        .unwrap();
        assert!(
            b.calls()
                .last()
                .unwrap()
                .starts_with("DEL dipam-pool-n1-0 eth0 IgnoreUnknown=1;"),
            "{:?}",
            b.calls()
        );
        assert!(b.record("pod").is_none());
    }

    #[tokio::test]
    async fn own_addresses_bypass_the_pool_and_pool_ids_are_reserved() {
        let b = filled(1).await;
        let mut req = request("ip-pod", "1.0.0", json!({}));
        req.cni_args = "IgnoreUnknown=1;IP=10.9.0.50".into();
        add_as(&b.shim, Caller::ROOT, req).await.unwrap();
        assert!(b.calls().last().unwrap().starts_with("ADD ip-pod eth0"));
        add_as(
            &b.shim,
            Caller::ROOT,
            request(
                "rc-pod",
                "1.0.0",
                json!({"runtimeConfig": {"ips": ["10.9.0.51/24"]}}),
            ),
        )
        .await
        .unwrap();
        assert!(b.calls().last().unwrap().starts_with("ADD rc-pod eth0"));
        assert_eq!(b.shim.pool.bypassed.load(Ordering::Relaxed), 2);
        assert_eq!(b.entries().len(), 1, "a bypass took an entry");

        let calls = b.calls().len();
        let e = add_as(
            &b.shim,
            Caller::ROOT,
            request("dipam-pool-n1-0", "1.0.0", json!({})),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code_and_details().0, 4, "{e}");
        let e = del::run(
            &b.shim,
            Caller::ROOT,
            request("dipam-pool-n1-0", "1.0.0", json!({})),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code_and_details().0, 4, "{e}");
        assert_eq!(b.calls().len(), calls, "a runtime reached the pool's key");
        assert_eq!(b.entries().len(), 1);
    }

    #[tokio::test]
    async fn per_pod_runtime_config_still_matches_and_a_new_config_replaces_the_pool() {
        let b = filled(1).await;
        add_as(&b.shim, Caller::ROOT, request(
                "pm-pod",
                "1.0.0",
                json!({"runtimeConfig": {"portMappings": [{"hostPort": 8080}]}, "args": {"cni": {"labels": []}}}),
            ),
        )
        .await
        .unwrap();
        assert!(b.record("pm-pod").unwrap().delegate_key.is_some());
        b.refill().await;
        let old = b.entries();
        assert_eq!(old.len(), 1);

        // The network's config changes: the next pod misses, and the old entry goes.
        let mut changed = request("new-pod", "1.0.0", json!({}));
        let mut conf: Value = serde_json::from_slice(&changed.stdin).unwrap();
        conf["ipam"]["delegate"]["subnet"] = json!("10.9.1.0/24");
        changed.stdin = serde_json::to_vec(&conf).unwrap();
        add_as(&b.shim, Caller::ROOT, changed).await.unwrap();
        assert!(b.record("new-pod").unwrap().delegate_key.is_none());
        b.refill().await;
        let now = b.entries();
        assert_eq!(now.len(), 1);
        assert_ne!(now[0].config_digest, old[0].config_digest);
        assert!(
            b.calls()
                .iter()
                .any(|c| c.starts_with(&format!("DEL {} eth0", old[0].key.container_id)))
        );
    }

    #[tokio::test]
    async fn off_at_start_releases_every_entry_and_takes_none() {
        let b = filled(2).await;
        // The same ledger under a dipamd started with --warm-pool 0.
        let shim = Shim::new(
            Arc::new(MemStore::new()),
            Executor::new(vec![b.dir.path().to_owned()], Duration::from_secs(10)),
            b.shim.identity.clone(),
            None,
            crate::gc::GcPolicy::default(),
            crate::access::Admission::default(),
        );
        shim.pool.configure(PoolConfig {
            size: 0,
            node: String::new(),
            namespace: "kube-system".into(),
        });
        for r in b.shim.ledger.list(None).unwrap() {
            shim.ledger.put(&r).unwrap();
        }
        for (name, value) in b.shim.ledger.settings("").unwrap() {
            shim.ledger.set_setting(&name, Some(&value)).unwrap();
        }
        assert_eq!(shim.ledger.settings(TEMPLATE_SETTING).unwrap().len(), 1);
        init(&shim).await.unwrap();
        add_as(&shim, Caller::ROOT, request("pod", "1.0.0", json!({})))
            .await
            .unwrap();
        assert!(
            shim.ledger
                .get(&AttachmentKey::new("net", "pod", "eth0"))
                .unwrap()
                .unwrap()
                .delegate_key
                .is_none()
        );
        step(&shim).await;
        let left: Vec<_> = shim
            .ledger
            .list(None)
            .unwrap()
            .into_iter()
            .filter(|r| r.owner == Owner::Pool)
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(shim.ledger.settings(TEMPLATE_SETTING).unwrap(), vec![]);
    }

    #[test]
    fn digests_ignore_per_pod_parts_and_own_ips_are_seen() {
        let dc = |extra: Value| {
            let req = request("x", "1.0.0", extra);
            DelegateConf::from_request(&req.stdin, Mode::Ipam).unwrap()
        };
        let plain = pool_digest(&dc(json!({})));
        assert_eq!(
            plain,
            pool_digest(&dc(
                json!({"runtimeConfig": {"portMappings": []}, "args": {"x": 1}})
            ))
        );
        assert_eq!(plain, pool_digest(&dc(json!({"cniVersion": "0.4.0"}))));
        assert_ne!(plain, pool_digest(&dc(json!({"mtu": 1400}))));
        let p = |extra: Value, args: &str| {
            let mut req = request("x", "1.0.0", extra);
            req.cni_args = args.into();
            let dc = DelegateConf::from_request(&req.stdin, Mode::Ipam).unwrap();
            let key = AttachmentKey::new("net", "x", "eth0");
            wants_own_ips(&Prepared {
                req,
                caller: crate::access::Caller::ROOT,
                dc,
                key,
            })
        };
        assert!(!p(json!({}), "IgnoreUnknown=1;K8S_POD_NAME=a"));
        assert!(p(json!({}), "IgnoreUnknown=1;IP=10.0.0.5"));
        assert!(!p(json!({}), "IP="));
        assert!(p(json!({"runtimeConfig": {"ips": ["10.0.0.5/24"]}}), ""));
        assert!(!p(json!({"runtimeConfig": {"ips": []}}), ""));
        assert!(p(json!({"args": {"cni": {"ips": ["10.0.0.5"]}}}), ""));
        assert_eq!(entry_number("dipam-pool-n1-17", "n1"), Some(17));
        assert_eq!(entry_number("dipam-pool-n1-x", "n1"), None);
        assert_eq!(entry_number("dipam-pool-n2-1", "n1"), None);
        assert_eq!(
            crate::keys::internal("dipam-pool-anything"),
            Some(crate::keys::Internal::Pool)
        );
    }
}
