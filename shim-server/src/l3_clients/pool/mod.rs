//! The warm pool (`dipamd --pool-target N` and its other watermarks, or `--warm-pool N`; off
//! by default): addresses allocated from the delegate ahead of time under dipamd's own keys,
//! so that a pod's ADD is answered with one ledger commit and no delegate exec. How many each
//! network keeps is [`sizing`]'s rule.
//!
//! - **Entries** are ledger records with owner `pool`, container ID `dipam-pool-<node>-<n>`,
//!   ifname `eth0`, a CNI_NETNS that never exists and CNI_ARGS naming the entry. They are
//!   allocated through the same intent-before-exec ADD path as any attachment
//!   ([`crate::l2_core::core::attach::attach`]), so a crash while filling leaves an `adding` record that the
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
//! - **The refiller** ([`refill::run`]) keeps each network's committed entries for the current
//!   template at the size [`sizing::plan`] says, in batches made concurrently, retries failures
//!   with backoff (reported in `dipamctl status`), and releases surplus entries: those of an
//!   old config, those above the size once surplus for the cool-down, or all of them when the
//!   pool is off and a previous run left some.
//! - **Never starving a pod**: refills stop while the range has fewer free addresses than the
//!   target, an ADD the delegate refuses takes an entry ([`take::rescue`]), and while an agent
//!   address or claim waits, the pool gives entries back ([`refill`]).
//! - **Reserved IDs**: container IDs starting with `dipam-pool-` belong to the pool. A
//!   runtime's ADD or CHECK for one is refused and its DEL does nothing, so no runtime call can
//!   release or reuse what the pool (or a pod served from it) holds.
//!
//! The trade-off (docs/performance.md): the delegate sees the pool's keys, not the pods' IDs.

pub mod take;

pub mod refill;

pub mod sizing;

mod census;

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, OnceLock, atomic::AtomicU64},
    time::{Duration, Instant},
};

use dipam_proto::v1::PoolStatus;
use dipam_state::{AttachmentKey, AttachmentRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;
use tracing::info;

use crate::{l2_core::core::Prepared, l2_core::delegate::config::DelegateConf};

/// Every pool entry's container ID starts with this; the runtime may not use such IDs
/// (keys/ reserves them, with every other key dipamd makes for itself).
pub const ID_PREFIX: &str = crate::l1_leaves::keys::POOL_PREFIX;
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
/// How often the refiller counts again while the range holds refills back or a minimum is set
/// (pods leaving free addresses do not wake it).
const RECOUNT: Duration = Duration::from_secs(1);
/// The most entries made at once for one network: host-local serializes its ADDs on a file
/// lock, so more would only queue there, while 8 execs overlap their start-up.
pub const BATCH: usize = 8;
/// How often the refiller looks for the agent's conflist while it has no template for it.
const SEED_POLL: Duration = Duration::from_secs(2);

/// The pool's settings (dipamd flags).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// How many entries each network keeps (target 0 and minimum 0: off).
    pub marks: sizing::Watermarks,
    /// The most entries made at once for one network ([`BATCH`] in dipamd).
    pub batch: usize,
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

/// One network's sizing state, as the last refill round counted it.
#[derive(Debug, Default)]
struct Sizing {
    /// The pool's size now ([`sizing::Plan::want`]).
    want: usize,
    /// Pods and agent attachments of the network.
    in_use: usize,
    range_free: Option<usize>,
    range_short: bool,
    /// Entries being made.
    filling: usize,
    /// Since when ready entries have been above `want`.
    above_since: Option<Instant>,
    refills: u64,
    releases: u64,
    rescues: u64,
    demand: sizing::Demand,
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
    /// Per network.
    sizing: HashMap<String, Sizing>,
}

/// The pool's live state, shared by the ADD path and the refiller.
#[derive(Debug, Default)]
pub struct Pool {
    config: OnceLock<PoolConfig>,
    state: Mutex<State>,
    /// Wakes the refiller: an entry was taken, a new template arrived.
    pub wake: Notify,
    /// Wakes ADDs waiting for an entry being made ([`take::rescue`]): a fill ended.
    pub filled: Notify,
    /// One scan of a delegate's store for unrecorded pool IDs at a time (refill.rs).
    scan: tokio::sync::Mutex<()>,
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

    /// The watermarks; all 0 (off) when unconfigured.
    pub fn marks(&self) -> sizing::Watermarks {
        self.config.get().map(|c| c.marks).unwrap_or_default()
    }

    /// Whether the pool is on.
    pub fn on(&self) -> bool {
        self.marks().on()
    }

    /// An ADD met the pool (hit or miss): recent demand.
    fn note_demand(&self, network: &str) {
        self.lock()
            .sizing
            .entry(network.to_owned())
            .or_default()
            .demand
            .note(Instant::now());
    }

    /// Whether an entry is being made for `network`.
    fn filling(&self, network: &str) -> bool {
        self.lock()
            .sizing
            .get(network)
            .is_some_and(|s| s.filling > 0)
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
                let sz = st.sizing.get(&network).filter(|_| current);
                Some(PoolStatus {
                    ready: ready as u32,
                    target: sz.map_or(0, |s| s.want as u32),
                    in_use: sz.map_or(0, |s| s.in_use as u64),
                    refills: sz.map_or(0, |s| s.refills),
                    releases: sz.map_or(0, |s| s.releases),
                    rescues: sz.map_or(0, |s| s.rescues),
                    range_free: sz.and_then(|s| s.range_free).map_or(-1, |f| f as i64),
                    range_short: sz.is_some_and(|s| s.range_short),
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

#[cfg(test)]
mod tests;
