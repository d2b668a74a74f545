//! One attachment's record and its key, as the ledger stores them: the types that both the
//! ledger (ledger.rs) and the counts kept beside it (census.rs) speak of, below both so that
//! neither needs the other's module to name a record.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{StoreError, Tree};

/// Separator between key fields. Container ids and ifnames cannot contain it (CNI forbids it
/// and so does the kernel), and [`AttachmentKey::encode`] refuses it anywhere.
const SEP: u8 = 0;

/// The identity of one attachment: (network name, container id, ifname).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    /// The CNI network name (`name` in the conflist).
    pub network: String,
    /// `CNI_CONTAINERID`, or an agent-chosen id for agent-owned attachments.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl AttachmentKey {
    /// Builds a key from its three parts.
    pub fn new(
        network: impl Into<String>,
        container_id: impl Into<String>,
        ifname: impl Into<String>,
    ) -> Self {
        Self {
            network: network.into(),
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// The store key: `network \0 container_id \0 ifname`. Sorting by it groups a network's
    /// attachments together, which [`Ledger::list`](crate::Ledger::list) relies on.
    ///
    /// Fails with [`StoreError::InvalidKey`] if any part contains NUL, since the key would
    /// then be ambiguous.
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        for (field, value) in [
            ("network", &self.network),
            ("container_id", &self.container_id),
            ("ifname", &self.ifname),
        ] {
            if value.as_bytes().contains(&SEP) {
                return Err(StoreError::InvalidKey(format!(
                    "{field} {:?} contains a NUL byte",
                    value
                )));
            }
        }
        let mut out = Vec::with_capacity(
            self.network.len() + self.container_id.len() + self.ifname.len() + 2,
        );
        out.extend_from_slice(self.network.as_bytes());
        out.push(SEP);
        out.extend_from_slice(self.container_id.as_bytes());
        out.push(SEP);
        out.extend_from_slice(self.ifname.as_bytes());
        Ok(out)
    }

    /// Parses a key written by [`AttachmentKey::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        let fail = |detail: &str| StoreError::Decode {
            tree: Tree::Attachments.name(),
            key: bytes.escape_ascii().to_string(),
            detail: detail.to_string(),
        };
        let parts: Vec<&[u8]> = bytes.split(|b| *b == SEP).collect();
        let [network, container_id, ifname] = parts.as_slice() else {
            return Err(fail("expected three NUL-separated fields"));
        };
        let text = |b: &[u8]| {
            std::str::from_utf8(b)
                .map(str::to_string)
                .map_err(|_| fail("field is not UTF-8"))
        };
        Ok(Self {
            network: text(network)?,
            container_id: text(container_id)?,
            ifname: text(ifname)?,
        })
    }

    /// The prefix shared by every key of `network`, for [`Store::scan_prefix`](crate::Store::scan_prefix). The trailing
    /// separator keeps network "a" from matching network "ab".
    pub(crate) fn network_prefix(network: &str) -> Result<Vec<u8>, StoreError> {
        if network.as_bytes().contains(&SEP) {
            return Err(StoreError::InvalidKey(format!(
                "network {network:?} contains a NUL byte"
            )));
        }
        let mut out = network.as_bytes().to_vec();
        out.push(SEP);
        Ok(out)
    }
}

impl fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Who asked for an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// A pod, through the CNI plugin; the runtime's GC may release it.
    Pod,
    /// The node agent itself (router, health, ingress addresses); never released by GC.
    Agent {
        /// What the agent uses it for, e.g. "router".
        role: String,
    },
    /// dipamd's warm pool: an address allocated ahead of time under dipamd's own key, waiting
    /// to be handed to a pod's ADD; never released by GC.
    Pool,
}

impl Owner {
    /// A short label for logs and metrics: `pod` or `agent:<role>`.
    pub fn label(&self) -> String {
        match self {
            Owner::Pod => "pod".to_string(),
            Owner::Agent { role } => format!("agent:{role}"),
            Owner::Pool => "pool".to_string(),
        }
    }
}

/// Where an attachment is in its life. A record is written *before* the delegate is called,
/// so a crash mid-call leaves an `Adding`/`Deleting` record to reconcile rather than a leak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentState {
    /// The delegate's ADD is in flight (or was, when dipamd died).
    Adding,
    /// The delegate's ADD succeeded and the result was returned.
    Committed,
    /// The delegate's DEL is in flight (or was, when dipamd died).
    Deleting,
}

impl AttachmentState {
    /// The serialized name: `adding`, `committed` or `deleting`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttachmentState::Adding => "adding",
            AttachmentState::Committed => "committed",
            AttachmentState::Deleting => "deleting",
        }
    }
}

/// The identity under which the delegate holds an attachment, when it is not the record's
/// own key: a pod that got its address from the warm pool is known to the delegate by the
/// pool entry's container ID and ifname (and was allocated with the pool's CNI_NETNS and
/// CNI_ARGS). Every delegate call for the record (DEL, CHECK, GC's valid set, replay) uses
/// it. The network is always the record's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegateKey {
    /// `CNI_CONTAINERID` the delegate saw at ADD.
    pub container_id: String,
    /// `CNI_IFNAME` the delegate saw at ADD.
    pub ifname: String,
    /// `CNI_NETNS` the delegate saw at ADD.
    #[serde(default)]
    pub netns: String,
    /// `CNI_ARGS` the delegate saw at ADD.
    #[serde(default)]
    pub cni_args: String,
}

/// The Kubernetes pod an attachment was made for, as a CRI runtime (containerd's CRI plugin,
/// CRI-O) names it in CNI_ARGS: present only when the ADD came through CRI. The runtime-aware
/// GC (dipamd --cri-endpoint) may free only such attachments; one made any other way (`ctr run
/// --cni`, podman, a direct plugin call) is never its to free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriPod {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`.
    pub uid: String,
}

/// When a request was issued, on a clock that never steps: CLOCK_BOOTTIME (which counts
/// suspend and is never set) within one boot, named by the kernel's boot id
/// (/proc/sys/kernel/random/boot_id). Two stamps of one boot order exactly; stamps of two
/// boots order only by knowing which boot is the current one. The wall clock cannot order
/// requests: after it was stepped back an hour, a DEL looked older than its own ADD.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootStamp {
    /// The boot id of the kernel that ran the request's plugin.
    pub boot_id: String,
    /// CLOCK_BOOTTIME, in nanoseconds, when the plugin started.
    pub ns: u64,
}

/// Everything needed to answer CHECK, to replay DEL to the delegate exactly as ADD was sent,
/// and to reconcile after a crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    /// The attachment's identity.
    pub key: AttachmentKey,
    /// Pod or agent.
    pub owner: Owner,
    /// Lifecycle state.
    pub state: AttachmentState,
    /// The delegate plugin's `type` (e.g. `host-local`).
    pub delegate_type: String,
    /// The cniVersion the delegate was called with.
    pub delegate_version: String,
    /// The exact JSON config sent to the delegate on ADD (replayed on DEL).
    pub delegate_config: String,
    /// `CNI_NETNS` at ADD time.
    pub netns: String,
    /// `CNI_ARGS` at ADD time.
    pub cni_args: String,
    /// `CNI_PATH` at ADD time.
    pub cni_path: String,
    /// The delegate's result, normalized; `None` until ADD succeeds.
    pub result: Option<serde_json::Value>,
    /// Digest of the network config, to notice a changed conflist.
    pub config_digest: String,
    /// The request that last wrote this record, for log correlation.
    pub request_id: String,
    /// Unix seconds when the record was first written.
    pub created_at: u64,
    /// Unix seconds of the last write.
    pub updated_at: u64,
    /// When the plugin that sent the ADD started (Unix ms; 0 when unknown): a DEL issued
    /// before it is stale and must not release this attachment. Absent in records written
    /// before the field existed, which then default to 0 (no ordering check).
    #[serde(default)]
    pub issued_ms: u64,
    /// When the plugin that sent the ADD started, on a clock that does not step: what orders
    /// a key's operations (`issued_ms` is kept for display). Absent in records written before
    /// the field existed and for ADDs from plugins that do not send it; not written when
    /// absent, so such records keep their exact bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<BootStamp>,
    /// Set when the delegate knows this attachment under another key (a pod served from the
    /// warm pool). Absent in every other record, and in records written before the field
    /// existed; not written when absent, so such records keep their exact bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate_key: Option<DelegateKey>,
    /// The uid of a non-root caller that created this attachment (SO_PEERCRED); such a caller
    /// may CHECK, DEL and list only its own. Absent for root and dipamd's own records, and in
    /// records written before the field existed (all root's); not written when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator_uid: Option<u32>,
    /// Set when the ADD came through a CRI runtime, with the pod it named. Absent for every
    /// other ADD (and the agent's and the pool's records), and in records written before the
    /// field existed, which the runtime-aware GC therefore never frees; not written when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri_pod: Option<CriPod>,
}

impl AttachmentRecord {
    /// The (container ID, ifname) the delegate holds this attachment under.
    pub fn delegate_ids(&self) -> (&str, &str) {
        match &self.delegate_key {
            Some(d) => (&d.container_id, &d.ifname),
            None => (&self.key.container_id, &self.key.ifname),
        }
    }

    /// The CNI_NETNS and CNI_ARGS the delegate saw at ADD.
    pub fn delegate_env(&self) -> (&str, &str) {
        match &self.delegate_key {
            Some(d) => (&d.netns, &d.cni_args),
            None => (&self.netns, &self.cni_args),
        }
    }
}
