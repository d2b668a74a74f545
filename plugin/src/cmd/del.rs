//! CNI DEL.
//!
//! - IPAM mode: forwarded to dipamd, which runs the delegate and keeps the ledger.
//! - Main mode: the host veth is retired first (set down, which removes its routes at once,
//!   and marked), then the IPAM allocation is released (ptp's order: the address is the
//!   scarce resource, docs/sources.md §6), handing the veth's deletion to dipamd along
//!   with the release. Deleting a veth waits ~25 ms for the kernel's RCU teardown; dipamd
//!   does it off the runtime's critical path and in batches (shim-server teardown.rs). When
//!   dipamd does not take it (spooled DEL, dipamd in another netns, an older dipamd), the
//!   plugin deletes it itself before answering. The veth goes even when the release failed,
//!   so that a retried DEL has only the release left to do; the release's error is what the
//!   runtime sees. A missing netns, an empty CNI_NETNS and a missing link are success, and DEL
//!   can repeat (spec §DEL).

use dipam_proto::v1::RetiredLink;
use rscni_types::types::Cmd;

use crate::{cmd::Ctx, conf::Mode, datapath, error::PluginError};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    if ctx.conf.mode == Mode::Ipam {
        return ctx.forward();
    }
    let att = ctx.attachment();
    // Not while an ADD of the same attachment is under way (crate::lock); removed with the
    // attachment. A lock that cannot be taken at all (an unusable /run) must not make the
    // release fail forever: no ADD can run then either (it needs the lock), so the DEL goes on.
    let lock = match crate::lock::acquire(
        std::path::Path::new(crate::lock::DIR),
        &att.host_ifname(),
        ctx.conf.timeout,
    ) {
        Ok(lock) => Some(lock),
        Err(e @ PluginError::Busy(_)) => return Err(e),
        Err(e) => {
            eprintln!("dipam: {e}; deleting without the attachment lock");
            None
        }
    };
    // A failure to retire (netlink refused) is not fatal: the old order, release then delete,
    // still works.
    let retired = datapath::retire(att).unwrap_or_else(|e| {
        eprintln!("dipam: could not retire the host veth ({e}); deleting it after the release");
        None
    });
    let handoff = retired.as_ref().map(|r| RetiredLink {
        ifindex: r.index,
        name: r.name.clone(),
        netns_inode: datapath::own_netns_inode(),
    });
    let (released, taken) = match ctx.forward_with(Cmd::Del, handoff) {
        Ok(answer) => (Ok(()), answer.retired_link_taken),
        Err(e) => (Err(e), false),
    };
    let removed = match &retired {
        Some(_) if taken => Ok(()),
        Some(r) => datapath::delete_retired(r),
        None => datapath::del(att, &ctx.args.netns, ctx.conf.prev_result.as_ref()),
    };
    match (released, removed) {
        (Ok(()), Ok(())) => {
            if let Some(lock) = lock {
                lock.remove();
            }
            Ok(Vec::new())
        }
        (Err(e), Ok(())) => Err(e),
        (Ok(()), Err(e)) => Err(e),
        (Err(release), Err(remove)) => {
            let remove = remove.to_cni(false);
            Err(PluginError::RolledBack {
                error: Box::new(release),
                note: format!(
                    "removing the veth failed too ({}: {})",
                    remove.msg, remove.details
                ),
            })
        }
    }
}
