//! CNI ADD.
//!
//! - IPAM mode: forwarded to dipamd, which runs the delegate and keeps the ledger.
//! - Main mode: IPAM through dipamd first (the same forward; dipamd hands the whole config to
//!   the delegate named by `ipam.type`, spec §4), then the pod's veth, addresses and routes
//!   (crate::datapath). If anything fails after the IPAM answered, the allocation is released
//!   again through dipamd before the error is returned (spec §4: the main plugin SHOULD run
//!   the delegate's DEL; ptp's deferred `ipam.ExecDel`), and the datapath has already removed
//!   what it made: a failed ADD leaves nothing behind.

use rscni_types::types::{CNIResult, Cmd};

use crate::{
    cmd::Ctx,
    conf::Mode,
    datapath::{self, AddError, netns::Netns, plan::Plan, result},
    error::PluginError,
};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    match ctx.conf.mode {
        Mode::Ipam => ctx.forward(),
        Mode::Main => main_mode(ctx),
    }
}

fn main_mode(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    let att = ctx.attachment();
    // Before the IPAM call: a sandbox that cannot be used, or an interface name already taken
    // (a repeated ADD), must not cost an address, nor roll back the one in use (add_during
    // checks the name before it lets the IPAM call start).
    let netns = Netns::open(&ctx.args.netns)?;
    // The IPAM call and the veth's creation run side by side (datapath::add_during).
    let ipam = || {
        let raw = ctx.forward()?;
        // From here on an address is allocated: a failure must release it.
        let ipam = serde_json::from_slice::<CNIResult>(&raw).map_err(|e| {
            PluginError::IpamResult(format!("dipamd's IPAM result does not parse: {e}"))
        });
        let planned = ipam.and_then(|ipam| Plan::new(&ipam).map(|plan| (ipam, plan)));
        planned.map_err(|e| rollback(ctx, e))
    };
    let (ipam, created) = match datapath::add_during(att, &netns, ctx.conf.mtu, ipam) {
        Ok(v) => v,
        // Nothing allocated, or already released by the closure.
        Err(AddError::BeforeIpam(e) | AddError::Ipam(e)) => return Err(e),
        Err(AddError::AfterIpam(e)) => return Err(rollback(ctx, e)),
    };
    let out = result::assemble(
        ctx.conf.prev_result.as_ref(),
        &ipam,
        &created,
        netns.path(),
        ctx.conf.dns.as_ref(),
        ctx.conf.version,
    );
    result::render(ctx.conf.version, out).map_err(|e| {
        // Practically unreachable (serializing plain data), but a result never printed is an
        // ADD that failed: undo it all.
        let _ = datapath::del(att, netns.path(), None);
        rollback(ctx, e)
    })
}

/// Releases the IPAM allocation of a failed ADD through dipamd (a DEL with the same config
/// and environment), and says in the error whether that worked. When it did not (dipamd gone
/// meanwhile), dipamd's record of the attachment stays, and the runtime's DEL (it sends one
/// after a failed ADD: reference/cni-spec.md §5) or dipamd's recovery releases it.
fn rollback(ctx: &Ctx<'_>, error: PluginError) -> PluginError {
    let note = match ctx.forward_as(Cmd::Del) {
        Ok(_) => {
            "rolled back: the pod's veth was removed and the IPAM allocation released".to_owned()
        }
        Err(e) => {
            let e = e.to_cni(false);
            format!(
                "the pod's veth was removed, but releasing the IPAM allocation failed \
                 (code {}: {}; {}); the runtime's DEL will release it",
                e.code, e.msg, e.details
            )
        }
    };
    PluginError::RolledBack {
        error: Box::new(error),
        note,
    }
}
