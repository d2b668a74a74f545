//! CNI GC: forwarded to dipamd, which runs the delegate and keeps the ledger.
//!
//! In main mode too: a pod's veth dies with its netns, and libcni DELs every cached
//! attachment outside the valid list before it sends GC (docs/sources.md §2.7), so
//! what is left to collect is the IPAM's, which dipamd handles.

use crate::{cmd::Ctx, error::PluginError};

pub fn run(ctx: &Ctx<'_>) -> Result<Vec<u8>, PluginError> {
    ctx.forward()
}
