//! `dipamctl support-bundle`: one tar.gz holding what a bug report about dipam needs, made so
//! that it can be run on a broken node: every part has a time limit, a part that fails is
//! noted in the bundle's `MANIFEST.json` (with the reason) and the others are still taken.
//!
//! The parts:
//! - dipamd's own view: `status`, `doctor`, `attachments` and `agent list`, each exactly as
//!   `dipamctl … --json` prints it (the commands run in-process), and `explain` for the
//!   ledger's containers (the most recently updated 50) plus any `--explain ID`;
//! - the metrics scrape (`--metrics-url`, or dipamd's own `--metrics-address`);
//! - the last `--log-lines` lines of dipamd's log, wherever it goes: `--log-file`, else the
//!   file dipamd's stderr is redirected to (`/proc/PID/fd/2`), else the journal of
//!   `--journal-unit`; the manifest says which (`source`), and a journal without entries is
//!   a failed part, never an empty log;
//! - with dipamd not answering (or `--offline`), the offline doctor (offline.rs): the ledger
//!   read from a copy, the DEL spool's files, the conflists and the delegates;
//! - dipamd's command line (its flags), found from the socket's peer (SO_PEERCRED), the
//!   versions of dipamctl and dipamd, the kernel and the OS;
//! - the conflists in `--conf-dir`, whole;
//! - the delegate's store, as file names only: host-local names each reservation by its
//!   address and keeps the container ID inside, which the ledger already shows.
//!
//! A part that failed or came out empty is marked failed with the reason, never ok: with
//! dipamd down, its own view, `explain` and the metrics are failed parts, and the offline
//! doctor is what the bundle holds instead.
//!
//! Nothing is redacted: every part is what an operator of the node can already read, and what
//! a maintainer needs to follow a pod's story. The bundle is written 0600, since it holds
//! container IDs and pod names.

mod archive;
mod config;
mod daemon;
mod host;
mod log;
mod part;

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};

use super::{client, error::CtlError, node_paths, offline, output};
use part::{Bundle, Entry};

// The doc comments below are clap's help text (plain text, shown by --help and the man
// pages): `<name>` there is a placeholder, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to write the bundle. Default: dipam-support-<host>-<UTC time>.tar.gz in the
    /// current directory.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// dipamd's log file, whose last lines go in the bundle. Default: the file dipamd's stderr
    /// goes to, if it is one, else the journal of --journal-unit.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The systemd unit whose journal is read when no --log-file is given.
    #[arg(long, value_name = "UNIT", default_value = "dipamd")]
    pub journal_unit: String,
    /// How many of the log's last lines to take.
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub log_lines: usize,
    /// The CNI configuration directory whose conflists go in the bundle. Default: dipamd's
    /// --conf-dir, or the directory of its --conflist, as the record it leaves at start says;
    /// else /etc/cni/net.d. dipamd's own conflist goes in too, wherever it is.
    #[arg(long, value_name = "DIR")]
    pub conf_dir: Option<PathBuf>,
    /// Where to scrape dipamd's metrics: http://HOST:PORT/metrics or unix:PATH. Default: the
    /// --metrics-socket or --metrics-address on dipamd's command line, if it has one (else
    /// in the record of its paths).
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Also explain this container ID (repeatable). The ledger's containers are explained
    /// anyway, the 50 most recently updated.
    #[arg(long = "explain", value_name = "ID")]
    pub explain: Vec<String>,
    /// The time limit of each part, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub part_timeout: u64,
    #[command(flatten)]
    pub offline: offline::Args,
}

/// How many of the ledger's containers get an `explain`.
const EXPLAINED: usize = 50;

pub async fn run(
    args: Args,
    socket: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let made_ms = dipam_shim::l1_leaves::clock::now_ms();
    let (stamp, _) = archive::utc_at(made_ms);
    let root = format!("dipam-support-{}-{stamp}", archive::hostname());
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{root}.tar.gz")));
    let mut b = Bundle {
        files: Vec::new(),
        entries: Vec::new(),
        limit: Duration::from_secs(args.part_timeout.max(1)),
        progress: !json && std::io::stderr().is_terminal(),
        total: 13,
    };
    // Where dipamd keeps everything, learned once for every part (node_paths.rs).
    let (s, given) = (socket.to_owned(), args.offline.given(args.conf_dir.clone()));
    let paths = part::blocking(move || Ok(node_paths::learn(&s, &given)))
        .await
        .map_err(|e| CtlError::Failed(e.to_string()))?;

    // Asked once up front: with dipamd down, its own view is replaced by the offline one.
    let down = if args.offline.offline {
        Some("--offline given".to_owned())
    } else {
        client::connect(socket).await.err().map(|e| e.to_string())
    };
    daemon::daemon_parts(&mut b, socket, down.as_deref()).await;
    daemon::explain_part(&mut b, socket, &args.explain, down.as_deref()).await;
    paths_part(&mut b, &paths).await;
    host::host_parts(&mut b, socket, &args, &paths).await;
    config::config_parts(&mut b, &paths).await;
    daemon::offline_part(&mut b, socket, paths, down).await;
    let manifest = write(&mut b, made_ms, &path, &root)?;
    report(out, json, manifest, &b.entries, &path)
}

/// Where the bundle looked: dipamd's paths, where each was learned, the record it read and
/// the warnings (records refused, defaults assumed).
async fn paths_part(b: &mut Bundle, paths: &node_paths::NodePaths) {
    let v = paths.to_json();
    b.part("dipamd's paths", "dipamd-paths.json", async {
        Ok(serde_json::to_vec_pretty(&v)?)
    })
    .await;
}

/// The archive: every part and the manifest. Returns the manifest.
fn write(b: &mut Bundle, made_ms: u64, path: &Path, root: &str) -> Result<Value, CtlError> {
    let manifest = b.manifest(made_ms);
    let mut files = std::mem::take(&mut b.files);
    files.push((
        "MANIFEST.json".into(),
        serde_json::to_vec_pretty(&manifest).unwrap_or_default(),
    ));
    archive::write_archive(path, &files, root)?;
    Ok(manifest)
}

/// What the bundle holds, part by part, and where it is.
fn report(
    out: &mut dyn Write,
    json: bool,
    manifest: Value,
    entries: &[Entry],
    path: &Path,
) -> Result<(), CtlError> {
    let failed = entries.iter().filter(|e| e.error.is_some()).count();
    if json {
        let mut v = manifest;
        v["bundle"] = json!(path);
        output::json(out, &v)?;
    } else {
        let rows: Vec<[String; 3]> = entries
            .iter()
            .map(|e| {
                [
                    e.part.clone(),
                    if e.error.is_none() {
                        "ok".into()
                    } else {
                        "FAILED".into()
                    },
                    e.error
                        .clone()
                        .unwrap_or_else(|| e.file.clone().unwrap_or_default()),
                ]
            })
            .collect();
        output::table(out, ["PART", "OUTCOME", "FILE OR REASON"], &rows)?;
        writeln!(
            out,
            "wrote {} ({} part(s), {failed} failed: noted in MANIFEST.json)",
            path.display(),
            entries.len()
        )?;
    }
    Ok(())
}
