//! CNI GC: the runtime's valid list, made safe (agent-owned, in-flight and young attachments
//! added; an empty, null or absent list refused unless --gc-allow-empty; a list that would free
//! too much refused), then collected (gc.rs): through the delegate's own GC where it has one,
//! emulated where it has none.

use dipam_proto::v1::CniRequest;
use dipam_state::Store;

use crate::{
    error::ShimError,
    gc::{self, Valid},
    shim::Shim,
};

pub async fn run<S: Store>(shim: &Shim<S>, req: CniRequest) -> Result<Vec<u8>, ShimError> {
    let p = shim.prepare(req, false)?;
    let list = gc::valid_list(&p.dc.conf);
    // cnitool sends no list meaning "everything is stale"; libcni sends null for an empty
    // one. Either would free every pod on the network: refuse unless the operator said so.
    let list = match list {
        Some(l) if !l.is_empty() || shim.gc.allow_empty => l,
        Some(_) | None if shim.gc.allow_empty => Vec::new(),
        other => {
            shim.gc_stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ShimError::GcRefused {
                network: p.dc.network.clone(),
                reason: format!(
                    "the valid-attachments list is {} (start dipamd with --gc-allow-empty to \
                     accept that)",
                    if other.is_some() {
                        "empty"
                    } else {
                        "absent or null"
                    }
                ),
            });
        }
    };
    let items = gc::collect(shim, &p.dc, &p.req.cni_path, Valid::List(list), false).await?;
    let failed: Vec<String> = items
        .iter()
        .filter(|i| i.outcome == "failed")
        .map(|i| format!("{}/{}: {}", i.container_id, i.ifname, i.error))
        .collect();
    if failed.is_empty() {
        Ok(Vec::new())
    } else {
        Err(ShimError::GcIncomplete {
            network: p.dc.network.clone(),
            freed: items.iter().filter(|i| i.outcome == "freed").count(),
            failed,
        })
    }
}
