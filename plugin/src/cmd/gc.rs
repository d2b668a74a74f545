//! CNI GC: forwarded to dipamd, which runs the delegate and keeps the ledger.

use crate::{cmd::Ctx, error::PluginError};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    ctx.require_ipam_mode()?;
    ctx.forward()
}
