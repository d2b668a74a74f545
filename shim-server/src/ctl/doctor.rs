//! `dipamctl doctor`: every check of dipamd's configuration and state, with what to fix;
//! exits non-zero when one fails.

use std::io::Write;

use dipam_proto::v1::{DoctorRequest, admin_client::AdminClient};
use serde_json::json;
use tonic::transport::Channel;

use super::{CtlError, output};

/// No flags: dipamd runs every check.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(
    _args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let reply = AdminClient::new(channel)
        .doctor(DoctorRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    let failed = reply.checks.iter().filter(|c| !c.ok).count();
    if json {
        let v: Vec<_> = reply
            .checks
            .iter()
            .map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix}))
            .collect();
        output::json(out, &serde_json::Value::Array(v))?;
    } else {
        for c in &reply.checks {
            writeln!(
                out,
                "{} {}: {}",
                if c.ok { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            )?;
            if !c.ok && !c.fix.is_empty() {
                writeln!(out, "       fix: {}", c.fix)?;
            }
        }
        writeln!(out, "{} check(s), {failed} failed", reply.checks.len())?;
    }
    if failed > 0 {
        return Err(CtlError::Failed(format!("{failed} doctor check(s) failed")));
    }
    Ok(())
}
