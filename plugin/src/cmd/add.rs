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
    client::{Early, Pending},
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
    // Held to the end, rollback included: an identical ADD running at the same time must
    // never undo this one's work, nor this one its (crate::lock).
    let _lock = crate::lock::acquire(
        std::path::Path::new(crate::lock::DIR),
        &att.host_ifname(),
        ctx.conf.timeout,
    )?;
    // Before the IPAM call: a sandbox that cannot be used must not cost an address.
    let netns = Netns::open(&ctx.args.netns)?;
    // The IPAM call and the interface check, veth creation and bring-up run side by side
    // (datapath::add_during).
    // dipamd sends a fresh result before its commit is durable (AddEarly): the addresses and
    // routes go in while it commits, and the ADD succeeds only once it says the commit did.
    let ipam = || {
        let (answer, mut pending) = match ctx.forward_add_early()? {
            Early::Done(answer) => (answer, None),
            Early::Pending(answer, pending) => (answer, Some(*pending)),
        };
        let replayed = answer.replayed;
        // From here on an address is allocated: a failure must release it, unless it is the
        // live attachment's.
        let ipam = serde_json::from_slice::<CNIResult>(&answer.result).map_err(|e| {
            PluginError::IpamResult(format!("dipamd's IPAM result does not parse: {e}"))
        });
        match ipam.and_then(|ipam| Plan::new(&ipam).map(|plan| (ipam, plan))) {
            Ok((ipam, plan)) => Ok(((ipam, replayed, pending), plan)),
            Err(e) => {
                // Let the ADD finish first, so that the rollback's DEL finds its record.
                if let Some(p) = pending.take() {
                    let _ = p.finish();
                }
                Err(undo(ctx, replayed, e))
            }
        }
    };
    let confirm = |answer: &mut (CNIResult, Option<bool>, Option<Pending>)| match answer.2.take() {
        Some(pending) => pending.finish().map(drop),
        None => Ok(()),
    };
    let ((ipam, replayed, _), created) =
        match datapath::add_during(att, &netns, ctx.conf.mtu, ipam, confirm) {
            Ok(v) => v,
            // Nothing allocated, or already undone by the closure.
            Err(AddError::BeforeIpam(e)) => return Err(e),
            Err(AddError::AfterIpam {
                error,
                answer: (_, replayed, _),
            }) => return Err(undo(ctx, replayed, error)),
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
        undo(ctx, replayed, e)
    })
}

/// A failed main-mode ADD after dipamd answered: release the allocation (rollback) if it was
/// made for this ADD. If dipamd answered from its ledger (a repeated ADD of a committed
/// attachment), the address is the live attachment's, typically the one whose interface made
/// this ADD fail with 160: it stays, and so it does when an older dipamd does not say
/// (`replayed` absent); the runtime's DEL after the failed ADD decides (spec §ADD).
fn undo(ctx: &Ctx<'_>, replayed: Option<bool>, error: PluginError) -> PluginError {
    if replayed == Some(false) {
        return rollback(ctx, error);
    }
    PluginError::RolledBack {
        error: Box::new(error),
        note: "the address dipamd gave belongs to the attachment's earlier ADD and was kept"
            .to_owned(),
    }
}

/// Releases the IPAM allocation of a failed ADD through dipamd (a DEL with the same config
/// and environment), and says in the error whether that worked. When it did not (dipamd gone
/// meanwhile), dipamd's record of the attachment stays, and the runtime's DEL (it sends one
/// after a failed ADD: docs/sources.md §5) or dipamd's recovery releases it.
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
