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

use crate::delegate::config::result_addrs;

pub use crate::keys::ROLES;

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

/// The stable CNI identity of one agent address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub role: String,
    pub family: Family,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub args: String,
}

impl Slot {
    pub fn new(cfg: &AgentConfig, role: &str, family: Family) -> Self {
        let container_id = crate::keys::agent_id(role, family.as_str(), &cfg.node);
        Self {
            role: role.to_owned(),
            family,
            ifname: role.to_owned(),
            // Never created: a path the delegate cannot mistake for its own netns, and
            // that host-local and azure-vnet-ipam accept (they never enter it).
            netns: format!("/run/dipam/agent-netns/{container_id}"),
            args: format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={container_id}",
                cfg.namespace
            ),
            container_id,
        }
    }
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
}

impl Agent {
    pub fn new(config: Option<AgentConfig>) -> Self {
        let (snapshot, _) = watch::channel(AgentListReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
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
        }
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

    /// Publishes a new list; watchers see it only if it differs from the last one.
    pub fn publish(&self, addresses: Vec<AgentAddress>, waiting: String) {
        self.snapshot.send_if_modified(|cur| {
            if cur.addresses == addresses && cur.waiting == waiting {
                return false;
            }
            cur.addresses = addresses;
            cur.waiting = waiting;
            cur.generation += 1;
            true
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
            if a.state == "failed" {
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
impl crate::core::AddressOwners for Agent {
    fn owner_of(&self, ip: &std::net::IpAddr) -> Option<String> {
        Agent::owner_of(self, ip)
    }

    fn committed(&self, rec: &AttachmentRecord) {
        self.note_committed(rec);
    }

    fn conflict(&self, recheck: bool) {
        self.note_conflict();
        if recheck {
            self.wake.notify_one();
        }
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
            assert!(crate::validate::container_id(&s.container_id).is_ok());
            assert!(crate::validate::ifname(&s.ifname).is_ok());
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
        let mut rx = a.subscribe();
        a.publish(vec![], "waiting for conflist /x".into());
        assert!(rx.has_changed().unwrap());
        let g = rx.borrow_and_update().generation;
        a.publish(vec![], "waiting for conflist /x".into());
        assert!(!rx.has_changed().unwrap());
        assert_eq!(a.snapshot().generation, g);
        assert_eq!(a.not_ready(), vec!["waiting for conflist /x".to_string()]);
    }
}
