//! Agent-owned addresses: the router, health and ingress IPs a network agent needs for itself,
//! allocated through the same delegated IPAM as the pods, so that no pod can ever get one
//! (cilium#46799: two IPAMs sharing one range handed the agent's IP to a pod).
//!
//! Each address has a stable identity (a "slot"): container ID `dipam-<role>-<family>-<node>`,
//! ifname `<role>`, a CNI_NETNS path that never exists (skel >= 1.2 fails with code 8 after
//! reserving when CNI_NETNS is the caller's own netns, docs/sources.md §2.4), and
//! K8S_POD_NAME/K8S_POD_NAMESPACE args so that cluster IPAMs can attribute the address.
//! Records live in the same ledger as pods (owner `agent:<role>`), with the same
//! intent-before-exec discipline, so a crash at any point cannot leak one.

pub mod claims;
pub mod conflist;
pub mod reconcile;

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use dipam_proto::v1::{AgentAddress, AgentListReply};
use dipam_state::{AttachmentRecord, Owner};
use tokio::sync::{Notify, watch};

use crate::l2_core::delegate::config::result_addrs;

pub use crate::l1_leaves::keys::ROLES;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ipv4" | "v4" | "4" => Some(Self::V4),
            "ipv6" | "v6" | "6" => Some(Self::V6),
            _ => None,
        }
    }

    /// The proto enum's value.
    pub fn proto(self) -> dipam_proto::v1::AddressFamily {
        match self {
            Self::V4 => dipam_proto::v1::AddressFamily::Ipv4,
            Self::V6 => dipam_proto::v1::AddressFamily::Ipv6,
        }
    }

    pub fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Self::V4, IpAddr::V4(_)) | (Self::V6, IpAddr::V6(_))
        )
    }
}

/// dipamd's agent settings (flags).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node: String,
    /// Roles enabled by configuration. The agent can add or remove roles at runtime.
    pub roles: BTreeSet<String>,
    pub families: Vec<Family>,
    pub source: conflist::Source,
    /// K8S_POD_NAMESPACE for the agent's addresses.
    pub namespace: String,
}

/// The owner role of claim `name`'s record: `claim:<name>` (owner label
/// `agent:claim:<name>`), never a role's.
pub fn claim_role(name: &str) -> String {
    format!("claim:{name}")
}

/// The stable CNI identity of one agent address: a claim, predefined (a role's) or the
/// agent's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The record's owner role: the role (`router`), or `claim:<name>`.
    pub role: String,
    /// The claim's name: `<role>-<family>` for a role's.
    pub name: String,
    pub family: Family,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub args: String,
    /// The IP the claim asked for; `None`: any (a role's, or a claim without one).
    pub requested: Option<IpAddr>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// A role's address, configured by dipamd's flags.
    pub predefined: bool,
}

impl Slot {
    /// A role's address: its key is the one dipamd has always used
    /// (`dipam-<role>-<family>-<node>`, ifname `<role>`), so a node upgraded from before
    /// claims keeps its addresses.
    pub fn new(cfg: &AgentConfig, role: &str, family: Family) -> Self {
        let container_id = crate::l1_leaves::keys::agent_id(role, family.as_str(), &cfg.node);
        Self::with_key(
            cfg,
            role.to_owned(),
            format!("{role}-{}", family.as_str()),
            family,
            container_id,
            role.to_owned(),
            true,
        )
    }

    /// An agent claim's address: `dipam-claim-<name>-<node>`, ifname `claim`.
    pub fn claim(cfg: &AgentConfig, name: &str, spec: &claims::ClaimSpec) -> Self {
        let mut s = Self::with_key(
            cfg,
            claim_role(name),
            name.to_owned(),
            spec.family(),
            crate::l1_leaves::keys::claim_id(name, &cfg.node),
            "claim".to_owned(),
            false,
        );
        s.requested = spec.ip;
        s.labels = spec.labels.clone();
        s
    }

    fn with_key(
        cfg: &AgentConfig,
        role: String,
        name: String,
        family: Family,
        container_id: String,
        ifname: String,
        predefined: bool,
    ) -> Self {
        Self {
            role,
            name,
            family,
            ifname,
            // Never created: a path the delegate cannot mistake for its own netns, and
            // that host-local and azure-vnet-ipam accept (they never enter it).
            netns: format!("/run/dipam/agent-netns/{container_id}"),
            args: format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={container_id}",
                cfg.namespace
            ),
            container_id,
            requested: None,
            labels: std::collections::BTreeMap::new(),
            predefined,
        }
    }
}

/// The proto enum of a state string.
pub fn claim_state(state: &str) -> dipam_proto::v1::ClaimState {
    use dipam_proto::v1::ClaimState as S;
    match state {
        "pending" => S::Pending,
        "ready" => S::Ready,
        "releasing" => S::Releasing,
        "failed" => S::Failed,
        "kept" => S::Kept,
        "released" => S::Released,
        _ => S::Unspecified,
    }
}

/// A random id for this dipamd's life (the kernel's UUID generator): a watcher that sees it
/// change knows dipamd restarted and the message is a full snapshot.
fn instance_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| {
            format!(
                "{:x}-{:x}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default()
            )
        })
}

/// Validates `--node-name`: it becomes part of container IDs (`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`).
pub fn valid_node_name(node: &str) -> bool {
    dipam_proto::cni::names::is_valid_name(node)
}

/// Live agent state shared by the RPCs, the reconcile loop and the pod ADD path.
#[derive(Debug)]
pub struct Agent {
    pub config: Option<AgentConfig>,
    /// Agent-owned address -> owner label, for the pod ADD conflict check (cheap: no ledger
    /// scan on the hot path).
    index: Mutex<HashMap<IpAddr, String>>,
    pub conflicts: AtomicU64,
    pub reestablished: AtomicU64,
    snapshot: watch::Sender<AgentListReply>,
    /// Wakes the reconcile loop (a role allocated or released, a conflict found).
    pub wake: Notify,
    /// One reconcile pass at a time.
    pub pass: tokio::sync::Mutex<()>,
    /// Set once dipamd stops: every `Agent.Watch` stream ends with UNAVAILABLE, so that the
    /// server can drain (an open watch would otherwise hold the shutdown forever) and the
    /// agent knows to reconnect.
    closing: watch::Sender<bool>,
    /// Random per start; in every List, Watch and Claim reply.
    pub instance_id: String,
    /// Container ID -> the address it had before it changed, until a client reads the claim
    /// again (List, Claim); kept in the ledger's settings, so it survives restarts.
    pub changed: Mutex<HashMap<String, String>>,
    /// One publish at a time: each persists its generation before it is sent.
    pub publishing: tokio::sync::Mutex<()>,
}

impl Agent {
    pub fn new(config: Option<AgentConfig>) -> Self {
        let id = instance_id();
        let (snapshot, _) = watch::channel(AgentListReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            instance_id: id.clone(),
            ..AgentListReply::default()
        });
        Self {
            config,
            index: Mutex::new(HashMap::new()),
            conflicts: AtomicU64::new(0),
            reestablished: AtomicU64::new(0),
            snapshot,
            wake: Notify::new(),
            pass: tokio::sync::Mutex::new(()),
            closing: watch::channel(false).0,
            instance_id: id,
            changed: Mutex::new(HashMap::new()),
            publishing: tokio::sync::Mutex::new(()),
        }
    }

    /// The delegate config the agent's conflist names now (None: no conflist, or one that
    /// cannot be read yet): the scope the node-level checks and status count the agent's
    /// addresses under.
    pub fn delegate_conf(&self) -> Option<crate::l2_core::delegate::config::DelegateConf> {
        let base = self.config.as_ref()?.source.load().ok()?;
        let bytes = serde_json::to_vec(&base.request).ok()?;
        crate::l2_core::delegate::config::DelegateConf::from_request(&bytes, base.mode).ok()
    }

    /// Ends every watch, now and for any that starts later (dipamd is stopping).
    pub fn close_watches(&self) {
        self.closing.send_replace(true);
    }

    /// Resolves once [`Agent::close_watches`] was called (at once if it already was).
    pub async fn watches_closed(&self) {
        let mut rx = self.closing.subscribe();
        // The sender lives as long as `self`, so this only ends when closing is set.
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// The agent role owning `ip`, if any.
    pub fn owner_of(&self, ip: &IpAddr) -> Option<String> {
        self.index.lock().ok()?.get(ip).cloned()
    }

    /// Rebuilds the index from the ledger's agent records.
    pub fn reindex(&self, records: &[AttachmentRecord]) {
        let mut map = HashMap::new();
        for rec in records {
            if let Owner::Agent { .. } = rec.owner {
                for ip in rec.result.as_ref().map(result_addrs).unwrap_or_default() {
                    map.insert(ip, rec.owner.label());
                }
            }
        }
        if let Ok(mut index) = self.index.lock() {
            *index = map;
        }
    }

    /// Called after any attachment commits: agent addresses join the index at once.
    pub fn note_committed(&self, rec: &AttachmentRecord) {
        if let Owner::Agent { .. } = rec.owner
            && let Ok(mut index) = self.index.lock()
        {
            for ip in rec.result.as_ref().map(result_addrs).unwrap_or_default() {
                index.insert(ip, rec.owner.label());
            }
        }
    }

    pub fn note_conflict(&self) {
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> AgentListReply {
        self.snapshot.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<AgentListReply> {
        self.snapshot.subscribe()
    }

    /// Starts the generation where the last dipamd left it (the ledger's), without a
    /// message: the first change of this life is `generation + 1`.
    pub fn resume(&self, generation: u64, changed: HashMap<String, String>) {
        self.snapshot.send_modify(|cur| cur.generation = generation);
        if let Ok(mut c) = self.changed.lock() {
            *c = changed;
        }
    }

    /// `addresses` with the changed marks applied, and the generation they would be
    /// published under: `None` when they equal the current list (nothing to publish).
    pub fn next(
        &self,
        mut addresses: Vec<AgentAddress>,
        waiting: &str,
    ) -> Option<(Vec<AgentAddress>, u64)> {
        if let Ok(changed) = self.changed.lock() {
            for a in &mut addresses {
                match changed.get(&a.container_id) {
                    Some(prev) => {
                        a.changed = true;
                        a.previous_ip = prev.clone();
                    }
                    None => {
                        a.changed = false;
                        a.previous_ip.clear();
                    }
                }
            }
        }
        let cur = self.snapshot.borrow();
        if cur.addresses == addresses && cur.waiting == waiting {
            return None;
        }
        Some((addresses, cur.generation + 1))
    }

    /// Publishes a new list under `generation` (from [`Agent::next`], already persisted).
    pub fn publish(&self, addresses: Vec<AgentAddress>, waiting: String, generation: u64) {
        self.snapshot.send_modify(|cur| {
            cur.addresses = addresses;
            cur.waiting = waiting;
            cur.generation = generation;
        });
    }

    /// What stops dipamd from being ready on the agent's side: waiting for the conflist, or
    /// an address that could not be established.
    pub fn not_ready(&self) -> Vec<String> {
        let snap = self.snapshot.borrow();
        let mut out = Vec::new();
        if !snap.waiting.is_empty() {
            out.push(snap.waiting.clone());
        }
        for a in &snap.addresses {
            // A claim's failure is its own (its reply and list say why); a role's address is
            // what the node's agent needs to run.
            if a.state == "failed" && a.predefined {
                out.push(format!(
                    "agent {} {} address: {}",
                    a.role, a.family, a.message
                ));
            }
        }
        out
    }
}

/// The agent is the core's owner of addresses outside any pod.
impl crate::l2_core::core::AddressOwners for Agent {
    fn owner_of(&self, ip: &std::net::IpAddr) -> Option<String> {
        Agent::owner_of(self, ip)
    }

    fn committed(&self, rec: &AttachmentRecord) {
        self.note_committed(rec);
    }

    fn conflict(&self) {
        self.note_conflict();
    }

    fn recheck(&self) {
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AgentConfig {
        AgentConfig {
            node: "node-1.example".into(),
            roles: BTreeSet::new(),
            families: vec![Family::V4],
            source: conflist::Source::File("/x".into()),
            namespace: "kube-system".into(),
        }
    }

    #[test]
    fn slot_identity_is_valid_and_distinct_per_role_and_family() {
        let c = cfg();
        let a = Slot::new(&c, "router", Family::V4);
        let b = Slot::new(&c, "router", Family::V6);
        let h = Slot::new(&c, "health", Family::V4);
        assert_eq!(a.container_id, "dipam-router-ipv4-node-1.example");
        assert_ne!(a.container_id, b.container_id);
        assert_ne!(a.container_id, h.container_id);
        for s in [&a, &b, &h] {
            assert!(crate::l1_leaves::validate::container_id(&s.container_id).is_ok());
            assert!(crate::l1_leaves::validate::ifname(&s.ifname).is_ok());
            assert!(!std::path::Path::new(&s.netns).exists());
            assert!(
                s.args.contains("K8S_POD_NAME=")
                    && s.args.contains("K8S_POD_NAMESPACE=kube-system")
            );
        }
    }

    #[test]
    fn node_names() {
        assert!(valid_node_name("ip-10-0-0-1.ec2.internal"));
        assert!(!valid_node_name("-bad"));
        assert!(!valid_node_name("a/b"));
        assert!(!valid_node_name(""));
    }

    #[test]
    fn publish_bumps_the_generation_only_on_change() {
        let a = Agent::new(None);
        a.resume(41, HashMap::new());
        let mut rx = a.subscribe();
        let (addrs, g) = a.next(vec![], "waiting for conflist /x").unwrap();
        assert_eq!(g, 42, "resumes after the last life's generation");
        a.publish(addrs, "waiting for conflist /x".into(), g);
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().generation, 42);
        assert!(a.next(vec![], "waiting for conflist /x").is_none());
        assert_eq!(a.not_ready(), vec!["waiting for conflist /x".to_string()]);
        assert!(!a.snapshot().instance_id.is_empty());
        assert_ne!(Agent::new(None).instance_id, a.instance_id);
    }

    #[test]
    fn a_changed_address_stays_marked_until_cleared() {
        let a = Agent::new(None);
        let addr = AgentAddress {
            container_id: "dipam-claim-e-n".into(),
            ip: "10.0.0.9/24".into(),
            ..AgentAddress::default()
        };
        a.resume(
            0,
            HashMap::from([("dipam-claim-e-n".into(), "10.0.0.5/24".into())]),
        );
        let (out, g) = a.next(vec![addr.clone()], "").unwrap();
        assert!(out[0].changed && out[0].previous_ip == "10.0.0.5/24");
        a.publish(out, String::new(), g);
        // Republished unchanged: still marked, no new generation.
        assert!(a.next(vec![addr.clone()], "").is_none());
        a.changed.lock().unwrap().clear();
        let (out, _) = a.next(vec![addr], "").unwrap();
        assert!(!out[0].changed && out[0].previous_ip.is_empty());
    }
}
