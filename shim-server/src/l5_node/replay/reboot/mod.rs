//! A reboot, recognised at start, and what died in it freed before the socket serves.
//!
//! A network namespace never survives a reboot, so neither does any pod the ledger recorded
//! before one. The kernel's boot id (/proc/sys/kernel/random/boot_id) names the boot; the
//! ledger keeps the id of the boot its dipamd last started in (the meta tree's setting
//! [`BOOT_SETTING`]). When they differ, every pod attachment in the ledger was recorded in an
//! earlier boot, and is released before any pod is served:
//! - through its delegate, where the delegate's store survived (host-local's directory on
//!   disk): the reservation is freed there too;
//! - by forgetting it, where the delegate cannot release it and its state went with the
//!   reboot (azure-vnet-ipam's state file on /run, a tmpfs): the delegate will hand its
//!   addresses out again, and a record kept for them would refuse every new pod given one
//!   (156, "already held by pod").
//!
//! The agent's addresses and claims and the warm pool's entries are dipamd's own, not a
//! pod's: they are not touched here, and the agent's reconcile takes them again with the same
//! addresses (agent/reconcile/mod.rs). Each freed pod's history says who freed it and why
//! (`dipamctl explain`, "freed ... by reboot").
//!
//! The new boot id is written only once every pod of the earlier boot has been dealt with: a
//! crash in the middle is finished by the next start. A ledger that names no boot (a new one,
//! or one written before the id was kept) proves nothing: the id is recorded, and the
//! evidence pass (gc/evidence/mod.rs) judges its pods by what the node shows.

use std::path::Path;

use dipam_state::AttachmentRecord;
use tracing::{info, warn};

use crate::{
    l1_leaves::error::ShimError,
    l3_clients::gc::evidence::{Outcome, release_dead},
    l5_node::node::Node,
};

/// The ledger setting that names the boot the ledger's dipamd last started in.
pub const BOOT_SETTING: &str = "boot_id";

/// What the start did about a reboot.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rebooted {
    /// The boot the ledger last saw, when it differs from this one.
    pub previous: Option<String>,
    /// Released through the delegate.
    pub released: usize,
    /// Forgotten: the delegate's state went with the reboot.
    pub forgotten: usize,
    /// Kept: the delegate's store still holds them and could not release them now.
    pub kept: usize,
}

/// The boot id at `source` (the kernel's, or what `dipamd --boot-id-file` names), trimmed;
/// `None` when it cannot be read.
pub fn boot_id(source: &Path) -> Option<String> {
    std::fs::read_to_string(source)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.len() <= 128)
}

/// Releases every pod attachment of an earlier boot, then records `current` as the ledger's
/// boot. Without a `current` id nothing can be told, and nothing is done.
pub async fn release_earlier_boot(
    node: &Node,
    current: Option<&str>,
) -> Result<Rebooted, ShimError> {
    let Some(current) = current.map(str::to_owned) else {
        warn!(
            "the kernel's boot id cannot be read: a reboot cannot be recognised at start; dead \
             pods are found by evidence instead"
        );
        return Ok(Rebooted::default());
    };
    let previous = node.core.ledger(|l| l.setting(BOOT_SETTING)).await?;
    let mut done = Rebooted::default();
    match previous {
        Some(p) if p == current => return Ok(done),
        None => {}
        Some(p) => {
            done = release_all(node, &p, &current).await?;
            done.previous = Some(p);
        }
    }
    let id = current.clone();
    node.core
        .ledger(move |l| l.set_setting(BOOT_SETTING, Some(&id)))
        .await?;
    Ok(done)
}

/// Every pod record (root's and non-root callers', any state) released as dead.
async fn release_all(node: &Node, previous: &str, current: &str) -> Result<Rebooted, ShimError> {
    let pods: Vec<AttachmentRecord> = node
        .core
        .ledger(|l| l.select(|e| e.holder == dipam_state::Holder::Pod))
        .await?;
    let mut done = Rebooted::default();
    if pods.is_empty() {
        info!(
            previous,
            current, "a reboot: no pod attachment of the earlier boot is left"
        );
        return Ok(done);
    }
    let why = format!(
        "recorded in boot {previous}; dipamd started in boot {current}, and a pod's network \
         namespace never survives a reboot"
    );
    let c = node.collector();
    for rec in &pods {
        let _guard = node.core.locks.lock(&rec.key).await;
        let Some(rec) = node.core.lookup(&rec.key)? else {
            continue;
        };
        match release_dead(&c, &rec, crate::l1_leaves::events::FreedBy::Reboot, &why).await? {
            Outcome::Released => done.released += 1,
            Outcome::Forgotten(_) => done.forgotten += 1,
            Outcome::Kept(_) => done.kept += 1,
        }
        crate::l1_leaves::fault::hit("reboot-after-release");
    }
    info!(
        previous,
        current,
        released = done.released,
        forgotten = done.forgotten,
        kept = done.kept,
        "a reboot: the pod attachments of the earlier boot are freed before any pod is served"
    );
    Ok(done)
}

#[cfg(test)]
mod tests;
