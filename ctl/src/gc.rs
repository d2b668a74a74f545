//! `dipamctl gc`: garbage-collects one network through dipamd. The valid list is read and
//! checked here first, entry by entry; dipamd checks it again and decides what is freed.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use dipam_proto::v1::{GcAttachment, GcItem, GcReply, GcRequest, Mode, admin_client::AdminClient};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{
    error::CtlError,
    output::{self, GcRow, Progress, table},
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The network's conflist (default: dipamd's --conflist).
    #[arg(long)]
    conflist: Option<PathBuf>,
    /// JSON file with the valid attachments, as a runtime sends them:
    /// [{"containerID":"...","ifname":"eth0"}, ...]. Each entry must have exactly these
    /// two keys (case-sensitive); any other entry refuses the whole GC.
    #[arg(long, conflicts_with = "use_ledger")]
    valid: Option<PathBuf>,
    /// Treat everything in the ledger as valid: frees only reservations the delegate holds
    /// that dipamd never recorded.
    #[arg(long)]
    use_ledger: bool,
    /// Show what would be freed and what is kept, and why; free nothing.
    #[arg(long)]
    dry_run: bool,
    /// Run even if it would free more than dipamd's --gc-max-free-share of the network's
    /// pods (e.g. the only pod of a network). Check the list with --dry-run first.
    #[arg(long)]
    force: bool,
    /// The runtime-aware GC (dipamd --cri-endpoint) instead of one network: with --dry-run,
    /// what its next pass would free and keep, and why; without, one pass now. A pass frees
    /// only what the pass before it missed too, so a first run may free nothing.
    #[arg(long, conflicts_with_all = ["conflist", "valid", "use_ledger"])]
    from_runtime: bool,
    /// With --from-runtime: also list up to N of the attachments the pass keeps, with their
    /// pod and reasons (N defaults to 100; dipamd lists at most 1000), those kept for a
    /// reason other than "listed" first, then "and M more". Without it only how many are
    /// kept, by reason, is shown.
    #[arg(
        long,
        value_name = "N",
        requires = "from_runtime",
        num_args = 0..=1,
        default_missing_value = "100"
    )]
    kept: Option<u32>,
}

/// `progress`: show a spinner on stderr while dipamd works (`output::progress_wanted`).
pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    progress: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    if args.from_runtime {
        let ask = super::runtime_gc::Ask {
            dry_run: args.dry_run,
            force: args.force,
            kept: args.kept.unwrap_or(0),
        };
        return super::runtime_gc::run(channel, ask, json, progress, out).await;
    }
    let (config, mode) = match &args.conflist {
        Some(path) => network_config(path)?,
        None => (Vec::new(), Mode::Unspecified),
    };
    let valid = match &args.valid {
        Some(path) => valid_list(path)?,
        None => Vec::new(),
    };
    let dry_run = args.dry_run;
    // dipamd frees item by item (a delegate exec each) and answers once at the end: on a
    // large network that takes a while, with nothing to show until then but that it runs.
    let spinner = Progress::spinner(
        progress,
        &format!(
            "gc {}: {} in dipamd",
            args.conflist
                .as_deref()
                .map_or("(dipamd's network)".into(), |p| p.display().to_string()),
            if dry_run { "planning" } else { "collecting" }
        ),
    );
    let reply = AdminClient::new(channel)
        .gc(GcRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            config,
            mode: mode as i32,
            valid,
            use_ledger: args.use_ledger,
            dry_run,
            force: args.force,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    drop(spinner);
    print(&reply, dry_run, json, out)?;
    if !reply.refused.is_empty() {
        return Err(CtlError::Failed(format!(
            "GC of {} refused: {}",
            reply.network, reply.refused
        )));
    }
    Ok(())
}

/// The conflist as dipamd's GC request carries it, and the mode it asks for.
pub(super) fn network_config(path: &Path) -> Result<(Vec<u8>, Mode), CtlError> {
    let text =
        std::fs::read(path).map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
    let base = dipam_shim::l3_clients::agent::conflist::parse(path, &text, None)
        .map_err(|m| CtlError::Input(m.to_string()))?;
    let bytes = serde_json::to_vec(&base.request).map_err(|e| CtlError::Input(e.to_string()))?;
    Ok((bytes, base.mode))
}

fn valid_list(path: &Path) -> Result<Vec<GcAttachment>, CtlError> {
    let text =
        std::fs::read(path).map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
    let v: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| CtlError::Input(format!("{}: {e}", path.display())))?;
    // Checked here, entry by entry, so that the operator sees which entry
    // is wrong before anything reaches dipamd (which checks again).
    let source = path.display().to_string();
    Ok(dipam_shim::l3_clients::gc::parse_list(&v, &source)
        .map_err(|e| CtlError::Input(format!("{}; {}", e.msg, e.details)))?
        .into_iter()
        .map(|(container_id, ifname)| GcAttachment {
            container_id,
            ifname,
        })
        .collect())
}

fn print(reply: &GcReply, dry_run: bool, json: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let fields = |i: &GcItem| {
        let mut v = GcRow::from(i).json();
        v.insert("kind".into(), json!(i.kind));
        Value::Object(v)
    };
    if json {
        let v = json!({
            "network": reply.network,
            "dryRun": dry_run,
            "refused": reply.refused,
            "items": reply.items.iter().map(fields).collect::<Vec<_>>(),
            "kept": reply.kept.iter().map(fields).collect::<Vec<_>>(),
        });
        output::json(out, &v)?;
    } else if reply.refused.is_empty() {
        // A dry run lists what stays too, so that an operator can see why a pod is not
        // freed (or that one the runtime still runs is missing from the list).
        let shown = if dry_run {
            reply.items.iter().chain(reply.kept.iter()).collect()
        } else {
            reply.items.iter().collect::<Vec<_>>()
        };
        let rows: Vec<[String; 6]> = shown
            .iter()
            .map(|i| {
                let [container, ifname, ips, outcome, reason] = GcRow::from(*i).cells();
                [i.kind.clone(), container, ifname, ips, outcome, reason]
            })
            .collect();
        table(
            out,
            ["KIND", "CONTAINER", "IFNAME", "IPS", "OUTCOME", "REASON"],
            &rows,
        )?;
        writeln!(
            out,
            "{} {}, {} kept in network {}",
            reply.items.len(),
            if dry_run {
                "would be freed"
            } else {
                "collected"
            },
            reply.kept.len(),
            reply.network
        )?;
    }
    Ok(())
}
