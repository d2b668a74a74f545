//! The runtime-aware GC (`dipamd --cri-endpoint`): the container runtime's own list of pod
//! sandboxes is the truth, and what lost its DEL is collected, safely.
//!
//! containerd never sends a CNI GC (containerd/containerd#12130 is open; go-cni#131), and
//! CRI-O sends one only when it starts. An attachment whose DEL went elsewhere (a conflist
//! changed under a running pod, so the runtime's DEL went to the new network) or never came
//! stays held forever. So every `--runtime-gc-interval` dipamd lists the runtime's pod sandboxes
//! through the CRI API (ListPodSandbox with no filter: every state, ready or not) and collects
//! what the list no longer names, through the same path as a CNI GC ([`super::collect`]).
//!
//! Safety rules (docs/cfp.md §7.4):
//! - **Only attachments made through CRI** (`cri_pod` in the ledger, see cri_args.rs) are
//!   eligible: one made by `ctr run --cni`, podman or a direct plugin call is not the
//!   runtime's to list, and is never freed here.
//! - **The valid set** is every sandbox ID the runtime lists, plus the agent's attachments,
//!   the warm pool's, those in flight or interrupted, and those younger than `--gc-grace`.
//! - **Two passes**: an attachment is freed only when two consecutive passes both miss it. A
//!   refused pass breaks the chain: after it, two more are needed.
//! - **Refusals**: an unreachable endpoint, an error answer, or an empty list while the ledger
//!   holds CRI attachments (a runtime restarting, a wrong socket) free nothing. So does a pass
//!   that would free more than `--gc-max-free-share` of the node's CRI attachments (an
//!   operator's `dipamctl gc --from-runtime --force` overrides that one, once). Each refusal is
//!   logged once per change, and shown by `dipamctl status` and `doctor`.
//!
//! This file is the handle the node holds (its state and the runtime client); the pass, which
//! takes the node, is in [`pass`]; the CRI client in [`cri`].

pub mod cri;
pub mod pass;

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use dipam_proto::v1::RuntimeGcStatus;
use dipam_state::AttachmentKey;

pub use crate::l3_clients::sandboxes::{ListError, Listing, Sandboxes};

/// Why a pass freed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `unreachable`, `error`, `empty` or `share` (the metrics' `reason` label).
    pub code: &'static str,
    pub detail: String,
}

/// Every refusal code, for the metrics (each series exists from the start).
pub const REFUSALS: [&str; 4] = ["unreachable", "error", "empty", "share"];

/// What the passes remember between them, and report.
#[derive(Debug, Default)]
pub struct State {
    /// The eligible attachments the last pass missed: freed by this pass if it misses them
    /// too. Emptied by a refused pass.
    pub missed: HashSet<AttachmentKey>,
    /// Set while the last pass refused; logged only when it changes.
    pub refusing: Option<Refusal>,
    pub passes: u64,
    pub freed: u64,
    pub refusals: u64,
    pub sandboxes: u64,
    pub pending: u64,
    pub kept_grace: u64,
    pub last_pass_at: u64,
}

/// The runtime-aware GC's handle: the runtime client and the passes' state.
pub struct RuntimeGc {
    pub client: Arc<dyn Sandboxes>,
    pub state: Mutex<State>,
    /// One pass at a time: the timer's, and an operator's `dipamctl gc --from-runtime`.
    pub running: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RuntimeGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RuntimeGc({})", self.client.endpoint())
    }
}

impl RuntimeGc {
    pub fn new(client: Arc<dyn Sandboxes>) -> Self {
        Self {
            client,
            state: Mutex::new(State::default()),
            running: tokio::sync::Mutex::new(()),
        }
    }

    /// For `dipamctl status`.
    pub fn status(&self) -> RuntimeGcStatus {
        let endpoint = self.client.endpoint().to_owned();
        let Ok(s) = self.state.lock() else {
            return RuntimeGcStatus {
                endpoint,
                ..RuntimeGcStatus::default()
            };
        };
        RuntimeGcStatus {
            endpoint,
            passes: s.passes,
            freed: s.freed,
            refusing: s
                .refusing
                .as_ref()
                .map(|r| r.code.to_owned())
                .unwrap_or_default(),
            refusing_detail: s
                .refusing
                .as_ref()
                .map(|r| r.detail.clone())
                .unwrap_or_default(),
            refusals: s.refusals,
            sandboxes: s.sandboxes,
            pending: s.pending,
            kept_grace: s.kept_grace,
            last_pass_at: s.last_pass_at,
            last_pass_at_ms: s.last_pass_at.saturating_mul(1000),
        }
    }
}
