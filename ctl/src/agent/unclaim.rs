//! `dipamctl agent unclaim NAME`

use std::io::Write;

use dipam_proto::v1::{UnclaimRequest, agent_client::AgentClient};
use tonic::transport::Channel;

use super::claim::print_outcome;
use crate::CtlError;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The claim's name.
    name: String,
}

/// Exits non-zero while the address is still being released (dipamd keeps trying).
pub async fn run(
    args: Args,
    mut client: AgentClient<Channel>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let reply = client
        .unclaim(UnclaimRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            name: args.name,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    print_outcome(&reply, json, out)
}
