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

pub mod take;

pub mod refill;

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

use crate::{core::Prepared, delegate::config::DelegateConf};

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, atomic::Ordering};

    use dipam_proto::v1::CniRequest;
    use dipam_state::{AttachmentState, Owner};

    use super::refill::{init, step};
    use crate::{access::Caller, node::Node, rpc::tests::add_as};
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
        shim: Arc<Node>,
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
        let shim = Node::new(
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
