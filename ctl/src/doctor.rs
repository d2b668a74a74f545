//! `dipamctl doctor`: every check of dipamd's configuration and state, with what to fix;
//! exits non-zero when one fails. With dipamd down (or `--offline`), the checks that the
//! node's files allow instead (offline.rs), under a banner that says so.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use dipam_proto::v1::{DoctorRequest, admin_client::AdminClient};
use tonic::transport::Channel;

use super::{client, error::CtlError, node_paths, offline, output};

/// dipamd runs every check; the flags are for the offline view, when it cannot.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub offline: offline::Args,
    /// The CNI configuration directory whose conflists are checked when offline. Default:
    /// dipamd's --conf-dir, or the directory of its --conflist, as the record it leaves at
    /// start says; else /etc/cni/net.d.
    #[arg(long, value_name = "DIR")]
    pub conf_dir: Option<PathBuf>,
}

/// Asks dipamd at `socket`; when it does not answer (or with `--offline`), reads the node's
/// files instead. The offline report fails (exit 1) like a failing check: dipamd is down.
pub async fn run(
    args: Args,
    socket: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let reason = if args.offline.offline {
        "--offline given".to_owned()
    } else {
        match client::connect(socket).await {
            Ok(channel) => return online(channel, json, out).await,
            // Denied: the socket is there and dipamd most likely runs; the fix is access, and
            // this user could not read its files either.
            Err(e @ CtlError::Unreachable { denied: false, .. }) => e.to_string(),
            Err(e) => return Err(e),
        }
    };
    let scratch = std::env::temp_dir();
    let given = args.offline.given(args.conf_dir.clone());
    let s = socket.to_owned();
    let report = tokio::task::spawn_blocking(move || {
        let paths = node_paths::learn(&s, &given);
        offline::inspect(reason, paths, &s, &scratch)
    })
    .await
    .map_err(|e| CtlError::Failed(e.to_string()))?;
    if json {
        output::json(out, &report.to_json())?;
    } else {
        report.print(out)?;
    }
    Err(CtlError::Failed(format!(
        "offline: dipamd does not answer; {} check(s) failed",
        report.failed()
    )))
}

/// The checks of the running dipamd.
async fn online(channel: Channel, json: bool, out: &mut dyn Write) -> Result<(), CtlError> {
    let reply = AdminClient::new(channel)
        .doctor(DoctorRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            skip_stores: false,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    let failed = reply.checks.iter().filter(|c| !c.ok).count();
    if json {
        output::json(out, &output::checks_json(&reply.checks))?;
    } else {
        output::checks(out, &reply.checks)?;
        writeln!(out, "{} check(s), {failed} failed", reply.checks.len())?;
    }
    if failed > 0 {
        return Err(CtlError::Failed(format!("{failed} doctor check(s) failed")));
    }
    Ok(())
}
