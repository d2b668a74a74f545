//! CNI STATUS: forwarded to dipamd, which asks the delegate (spec 1.1 §STATUS: a plugin that
//! depends on a delegated IPAM MUST pass STATUS on). The datapath needs nothing to be ready.

use crate::{cmd::Ctx, error::PluginError};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    ctx.forward()
}
