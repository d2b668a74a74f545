//! CNI CHECK.
//!
//! - IPAM mode: forwarded to dipamd, which compares prevResult with its ledger and runs the
//!   delegate's CHECK.
//! - Main mode: the same forward first (the IPAM side, spec §CHECK: "SHOULD call CHECK on
//!   delegated IPAM and pass errors up"), then the pod's interface against prevResult
//!   (crate::datapath::check): present in the sandbox, a veth, same MAC, every address and
//!   route, tolerating what later plugins added.

use crate::{
    cmd::Ctx,
    conf::Mode,
    datapath::{
        self,
        check::{Expected, compare},
        netns::Netns,
    },
    error::PluginError,
};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    if ctx.conf.mode == Mode::Ipam {
        return ctx.forward();
    }
    let prev = ctx
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| PluginError::Config {
            msg: "required prevResult missing".into(),
            details: "CHECK compares the pod's interface with the runtime's cached ADD result, \
                      which the runtime sends as prevResult (spec §CHECK)"
                .into(),
        })?;
    ctx.forward()?;
    let expected = Expected::from_prev(prev, &ctx.args.ifname, &ctx.args.netns)?;
    let netns = Netns::open(&ctx.args.netns)?;
    let observed = datapath::observe(ctx.attachment(), &netns, &expected)?;
    let problems = compare(&expected, &observed);
    if problems.is_empty() {
        Ok(Vec::new())
    } else {
        Err(PluginError::CheckFailed(problems))
    }
}
