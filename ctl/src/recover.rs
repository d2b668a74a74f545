//! `dipamctl recover`: rebuilds the ledger from the delegate's own store, offline, when the
//! ledger is lost or refused as corrupt. host-local's directory says which (container ID,
//! ifname) holds which address; the network's conflist says how the delegate is configured.
//! A corrupt ledger is moved aside (never deleted), its DEL spool kept in place for the next
//! dipamd to replay; a healthy one is only added to, and only with --force.
//!
//! Reservations under the warm pool's IDs are not recovered: the lost ledger was the only
//! record of whether each was still the pool's or had been handed to a pod (which the
//! delegate never learns). Recording one as the pool's could hand a running pod's address
//! to a second pod, and recording it as a pod's would let GC free it; so it stays reserved
//! in the delegate, unrecorded, and the report says how to free it.

use std::{
    collections::BTreeMap,
    io::Write,
    net::IpAddr,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::Duration,
};

use dipam_state::{AttachmentKey, Ledger, Owner, Store, StoreError};
use serde_json::json;

use super::{
    error::{CtlError, RecoverError},
    node_paths,
    output::{self, Progress},
};
use dipam_shim::{
    l1_leaves::clock::now,
    l2_core::delegate::{Executor, config::DelegateConf, import, store, version},
    l3_clients::agent::conflist,
};

/// Each path not given is learned from the record dipamd leaves at start (beside --socket,
/// or in --state-dir), else defaulted; the output says where each came from.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// dipamd's --state-dir. Default: what the record of dipamd's paths says (beside
    /// --socket), else /var/lib/dipam.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The network's conflist (says how host-local is configured, and where its store is).
    /// Default: dipamd's --conflist (or its --network in its --conf-dir), as its record says.
    #[arg(long, value_name = "FILE")]
    conflist: Option<PathBuf>,
    /// Where to find the delegate plugin (colon-separated). Default: dipamd's --cni-path as
    /// its record says, else /opt/cni/bin:/usr/lib/cni.
    #[arg(long, value_name = "DIRS")]
    cni_path: Option<String>,
    /// Add to a ledger that opens fine.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    launch: super::launch_args::Flags,
}

/// `dipamctl recover`: rebuilds, then says what it did (moved aside, spool kept, how many
/// recovered, what was skipped and why). `socket`: where dipamd serves, whose record beside
/// it says where its state is. `progress`: count the reservations on stderr as they are
/// recorded (`output::progress_wanted`).
pub async fn run(
    args: Args,
    socket: &Path,
    json: bool,
    progress: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let given = node_paths::Given {
        state_dir: args.state_dir.clone(),
        cni_path: args.cni_path.clone(),
        conflist: args.conflist.clone(),
        sources: args.launch.sources(),
        ..node_paths::Given::default()
    };
    let s = socket.to_owned();
    let paths = tokio::task::spawn_blocking(move || node_paths::learn(&s, &given))
        .await
        .map_err(|e| CtlError::Failed(e.to_string()))?;
    // Before anything is moved: a record refused (planted?) always, and a state directory
    // taken for want of any record, which would be rebuilt in the wrong place.
    for w in &paths.refused {
        output::warn(json, w);
    }
    if paths.record.is_none()
        && args.state_dir.is_none()
        && let Some(w) = &paths.no_record
    {
        output::warn(json, w);
    }
    let conflist = paths.conflist.clone().ok_or(RecoverError::NoConflist)?;
    let dirs = paths
        .cni_path
        .value
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    let state_dir = &paths.state_dir.value;
    let r = rebuild(state_dir, &conflist.value, dirs, args.force, json, progress).await?;
    if json {
        let v = json!({
            "paths": paths.to_json(),
            "movedAside": r.moved_aside.as_ref().map(|p| p.display().to_string()),
            "spoolKept": r.spool_kept,
            "pods": r.pods, "agent": r.agent, "skipped": r.skipped,
        });
        output::json(out, &v)?;
    } else {
        // What it was not told, and where it learned it.
        for (name, value, source) in paths.rows() {
            let used = !matches!(name, "DEL spool" | "CNI config directory" | "metrics");
            if used && !source.starts_with("given") {
                writeln!(out, "{name}: {value} ({source})")?;
            }
        }
        if let Some(p) = &r.moved_aside {
            writeln!(out, "old ledger moved to {}", p.display())?;
        }
        if r.spool_kept {
            writeln!(
                out,
                "DEL spool kept in {}: dipamd replays it at its next start",
                state_dir.join("spool").display()
            )?;
        }
        writeln!(
            out,
            "recovered {} pod and {} agent attachment(s)",
            r.pods, r.agent
        )?;
        for s in &r.skipped {
            writeln!(out, "skipped: {s}")?;
        }
    }
    Ok(())
}

/// What recovery did.
#[derive(Debug, Default)]
pub struct Report {
    pub moved_aside: Option<PathBuf>,
    /// The DEL spool inside the state directory was kept in place (not moved aside).
    pub spool_kept: bool,
    pub pods: usize,
    pub agent: usize,
    pub skipped: Vec<String>,
}

/// The ledger to rebuild into: an empty one (or, with `force`, any that opens); one that
/// does not open is moved aside (its DEL spool kept in place) and a new one made.
fn open_ledger<'a>(
    state_dir: &'a Path,
    force: bool,
    json: bool,
    report: &mut Report,
) -> Result<impl Store + use<'a>, RecoverError> {
    match dipam_state::open(state_dir) {
        Ok(s) => {
            let n = s.len(dipam_state::Tree::Attachments)?;
            if n > 0 && !force {
                return Err(RecoverError::NotEmpty {
                    state_dir: state_dir.to_owned(),
                    n,
                });
            }
            Ok(s)
        }
        Err(StoreError::Locked { .. }) => Err(RecoverError::Running(state_dir.to_owned())),
        // A full file system is no damage: moving the ledger aside would forget it for
        // nothing (and the rebuilt one would not fit either).
        Err(e @ StoreError::NoSpace { .. }) => Err(e.into()),
        Err(e) => {
            let aside = PathBuf::from(format!("{}.corrupt-{}", state_dir.display(), now()));
            std::fs::rename(state_dir, &aside).map_err(|source| RecoverError::MoveAside {
                state_dir: state_dir.to_owned(),
                source,
            })?;
            output::warn(
                json,
                &format!("{e}; moved the old ledger to {}", aside.display()),
            );
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(state_dir)
                .map_err(RecoverError::CreateDir)?;
            // The DEL spool (default <state-dir>/spool) stays where dipamd publishes it: moved
            // aside with the ledger, the DELs in it would never be replayed. A rename keeps
            // the directory's identity, which the pointer beside the socket names, so plugins
            // keep spooling into it while dipamd is stopped.
            let old_spool = aside.join("spool");
            if old_spool.is_dir() {
                std::fs::rename(&old_spool, state_dir.join("spool")).map_err(|source| {
                    RecoverError::SpoolBack {
                        spool: old_spool.clone(),
                        state_dir: state_dir.to_owned(),
                        source,
                    }
                })?;
                report.spool_kept = true;
            }
            report.moved_aside = Some(aside);
            Ok(dipam_state::open(state_dir)?)
        }
    }
}

/// Rebuilds (or, with `force`, adds to) the ledger in `state_dir` from the delegate's store
/// as `conflist_path` configures it, the delegate found in `cni_dirs`. `json`: notes on
/// stderr are JSON; `progress`: a counter of the reservations recorded, on stderr.
pub async fn rebuild(
    state_dir: &Path,
    conflist_path: &Path,
    cni_dirs: Vec<PathBuf>,
    force: bool,
    json: bool,
    progress: bool,
) -> Result<Report, RecoverError> {
    let mut report = Report::default();
    let store = open_ledger(state_dir, force, json, &mut report)?;
    let text = std::fs::read(conflist_path).map_err(|source| RecoverError::Read {
        path: conflist_path.to_owned(),
        source,
    })?;
    let base = conflist::parse(conflist_path, &text, None).map_err(RecoverError::Conflist)?;
    let request = serde_json::to_vec(&base.request)?;
    let dc = DelegateConf::from_request(&request, base.mode)?;
    let dir = store::readable_dir(&dc.kind, &dc.conf, &dc.network)
        .ok_or_else(|| RecoverError::Unreadable(dc.kind.clone()))?;
    let exec = Executor::new(cni_dirs, Duration::from_secs(10));
    let probe = exec.probe(&dc.kind, "").await?;
    let send = version::choose(dc.version, &probe.supported);
    let delegate_config = String::from_utf8(dc.bytes_for(send)?)?;
    let delegate_version = send.unwrap_or(dc.version).to_string();
    let delegate = import::Delegate {
        dc: &dc,
        config: delegate_config,
        version: delegate_version,
    };

    let mut groups: BTreeMap<(String, String), Vec<IpAddr>> = BTreeMap::new();
    let reservations = store::reservations(&dir).map_err(|source| RecoverError::Read {
        path: dir.clone(),
        source,
    })?;
    for r in reservations {
        if r.ifname.is_empty() {
            report.skipped.push(format!(
                "{} ({}): a legacy id-only file names no interface",
                r.ip, r.container_id
            ));
            continue;
        }
        groups
            .entry((r.container_id, r.ifname))
            .or_default()
            .push(r.ip);
    }
    record_all(Ledger::new(store), &delegate, groups, progress, &mut report)?;
    Ok(report)
}

/// Records every group (one container ID and interface) the ledger lacks, counting them on
/// stderr when `progress`.
fn record_all<S: Store + ?Sized>(
    ledger: Ledger<S>,
    delegate: &import::Delegate<'_>,
    groups: BTreeMap<(String, String), Vec<IpAddr>>,
    progress: bool,
    report: &mut Report,
) -> Result<(), RecoverError> {
    let dc = delegate.dc;
    let t = now();
    // Each record is a durable ledger write: thousands of them take long enough to wonder
    // whether anything is happening.
    let counter = Progress::counter(
        progress,
        &format!("recover {}: reservations", dc.network),
        groups.values().map(|ips| ips.len() as u64).sum(),
    );
    for ((cid, ifname), ips) in groups {
        counter.inc(ips.len() as u64);
        if dipam_shim::l1_leaves::keys::internal(&cid)
            == Some(dipam_shim::l1_leaves::keys::Internal::Pool)
        {
            for ip in &ips {
                report.skipped.push(format!(
                    "{ip} ({cid}): a warm-pool entry, possibly handed to a running pod; it stays \
                     reserved in {}. Once no pod uses it, free it with `dipamctl gc --use-ledger`",
                    dc.kind
                ));
            }
            continue;
        }
        let key = AttachmentKey::new(&dc.network, &cid, &ifname);
        if ledger.get(&key)?.is_some() {
            continue;
        }
        let (rec, outside) = import::record(delegate, &cid, &ifname, &ips, "dipamctl-recover", t);
        for ip in outside {
            report
                .skipped
                .push(format!("{ip} ({cid}): outside every configured range"));
        }
        let Some(rec) = rec else {
            continue;
        };
        match rec.owner {
            Owner::Agent { .. } => report.agent += 1,
            _ => report.pods += 1,
        }
        ledger.put(&rec)?;
    }
    Ok(())
}
