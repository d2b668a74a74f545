//! CNI DEL.
//!
//! - IPAM mode: forwarded to dipamd, which runs the delegate and keeps the ledger.
//! - Main mode: the IPAM allocation is released first, then the veth is removed (ptp's order:
//!   the address is the scarce resource, reference/cni-spec.md §6). The veth is removed even
//!   when the release failed, so that a retried DEL has only the release left to do; the
//!   release's error is what the runtime sees. A missing netns, an empty CNI_NETNS and a
//!   missing link are success, and DEL can repeat (spec §DEL).

use crate::{cmd::Ctx, conf::Mode, datapath, error::PluginError};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    if ctx.conf.mode == Mode::Ipam {
        return ctx.forward();
    }
    let released = ctx.forward();
    let removed = datapath::del(
        ctx.attachment(),
        &ctx.args.netns,
        ctx.conf.prev_result.as_ref(),
    );
    match (released, removed) {
        (Ok(_), Ok(())) => Ok(Vec::new()),
        (Err(e), Ok(())) => Err(e),
        (Ok(_), Err(e)) => Err(e),
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
