//! `dipamctl adopt`: records in dipamd's ledger the reservations the network's IPAM holds for
//! pods that were running before dipam was put in front of it, so that nothing ever frees
//! them; and the same step run by `dipamctl install --wrap --in-place` right after the
//! rewrite. dipamd decides, on evidence that each pod is alive (docs/cfp.md §7.4,
//! "Unrecorded reservations"); this command frees nothing.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use dipam_proto::v1::{AdoptReply, AdoptRequest, GcItem, Mode, admin_client::AdminClient};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{
    client,
    error::CtlError,
    output::{self, GcRow, table},
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The network's conflist (default: dipamd's --conflist).
    #[arg(long)]
    conflist: Option<PathBuf>,
    /// List what would be adopted, and what is dead or cannot be told; record nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let reply = ask(channel, args.conflist.as_deref(), args.dry_run).await?;
    print(&reply, args.dry_run, json, out)
}

async fn ask(
    channel: Channel,
    conflist: Option<&Path>,
    dry_run: bool,
) -> Result<AdoptReply, CtlError> {
    let (config, mode) = match conflist {
        Some(path) => super::gc::network_config(path)?,
        None => (Vec::new(), Mode::Unspecified),
    };
    Ok(AdminClient::new(channel)
        .adopt(AdoptRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            config,
            mode: mode as i32,
            dry_run,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner())
}

/// After `install --wrap --in-place` rewrote `conflist`: its pods already running hold
/// reservations dipamd never saw. With dipamd up they are adopted now; with dipamd down the
/// exact step is printed (dipamd adopts at start the networks it knows, and `dipamctl adopt`
/// does it for any). A dipamd that answers but fails is a failure: the node is wrapped, and
/// its running pods are not recorded.
pub async fn after_wrap(
    socket: &Path,
    conflist: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let step = format!(
        "`dipamctl adopt --conflist {}{}`",
        conflist.display(),
        if socket == Path::new(super::wrap::DEFAULT_SOCKET) {
            String::new()
        } else {
            format!(" --socket {}", socket.display())
        }
    );
    let channel = match client::connect(socket).await {
        Ok(c) => c,
        Err(e) => {
            output::warn(
                json,
                &format!(
                    "{e}. The pods already running on this network are not recorded yet: once \
                     dipamd runs, {step} records them (dipamd also does at start when its \
                     --conflist is this file, and at every reconcile). Until then nothing \
                     frees an address a running pod uses"
                ),
            );
            return Ok(());
        }
    };
    let reply = ask(channel, Some(conflist), false).await.map_err(|e| {
        CtlError::Failed(format!(
            "the conflist is wrapped, but recording the pods already running failed: {e}. \
             Run {step} (dipamctl doctor shows what is unrecorded)"
        ))
    })?;
    let summary = summary(&reply, false);
    if json {
        output::warn(true, &summary);
    } else {
        writeln!(out, "adopted:   {summary}")?;
    }
    Ok(())
}

fn summary(r: &AdoptReply, dry_run: bool) -> String {
    let mut s = format!(
        "{} running attachment(s) of network {} {}",
        r.adopted.len(),
        r.network,
        if dry_run {
            "would be recorded"
        } else {
            "recorded in dipamd's ledger"
        }
    );
    if !r.skipped.is_empty() {
        s.push_str(&format!(
            "; {} in use but not recordable (kept, never freed)",
            r.skipped.len()
        ));
    }
    if !r.unverified.is_empty() {
        s.push_str(&format!("; {} not shown unused (kept)", r.unverified.len()));
    }
    if !r.dead.is_empty() {
        s.push_str(&format!(
            "; {} unused by any pod (`dipamctl gc --use-ledger` frees them)",
            r.dead.len()
        ));
    }
    s
}

fn item_json(i: &GcItem) -> Value {
    json!({
        "containerID": i.container_id, "ifname": i.ifname, "ips": i.ips,
        "outcome": i.outcome, "reason": i.reason,
    })
}

fn print(r: &AdoptReply, dry_run: bool, json: bool, out: &mut dyn Write) -> Result<(), CtlError> {
    if json {
        let list = |items: &[GcItem]| items.iter().map(item_json).collect::<Vec<_>>();
        output::json(
            out,
            &json!({
                "network": r.network,
                "dryRun": dry_run,
                "adopted": list(&r.adopted),
                "dead": list(&r.dead),
                "unverified": list(&r.unverified),
                "skipped": list(&r.skipped),
            }),
        )?;
        return Ok(());
    }
    let rows: Vec<[String; 5]> = r
        .adopted
        .iter()
        .chain(&r.skipped)
        .chain(&r.unverified)
        .chain(&r.dead)
        .map(|i| {
            let row = GcRow::from(i);
            [
                row.outcome.to_owned(),
                row.container_id.to_owned(),
                row.ifname.to_owned(),
                row.ips.join(","),
                row.reason.to_owned(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        table(
            out,
            ["OUTCOME", "CONTAINER", "IFNAME", "IPS", "REASON"],
            &rows,
        )?;
    }
    writeln!(out, "{}", summary(r, dry_run))?;
    Ok(())
}
