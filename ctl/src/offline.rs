//! The offline view of a node whose dipamd does not answer: what `dipamctl doctor` and
//! `support-bundle` can still tell from the node's files. It is what a broken node presents:
//! dipamd crash-looping on its ledger, stopped, or never started.
//!
//! Read-only throughout: the ledger is read from a copy (`dipam_state::read_copy`), never
//! opened in place, since an open takes the lock a starting dipamd needs and writes the
//! store; the spool is listed, never drained; nothing is created beside dipamd's files.
//!
//! What only the running dipamd knows is listed as not checked ([`NOT_CHECKED`]), so that an
//! offline report that passes is never read as a healthy node.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use dipam_state::{AttachmentRecord, Owner};
use serde_json::{Value, json};

use super::node_paths::{self, NodePaths};
use dipam_shim::{
    l2_core::delegate::{
        config::{DelegateConf, result_ips},
        store,
    },
    l3_clients::agent::conflist,
    l3_clients::divergence::on_tmpfs,
};

/// The paths dipamd would use, for the commands that read them with dipamd down. Each not
/// given is learned from the record dipamd leaves at start (node_paths.rs), else defaulted.
// No group of its own: it is flattened into commands whose own Args group has the same name.
#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub struct Args {
    /// Do not ask dipamd: read the node's files (the ledger, from a read-only copy; the
    /// spool; the conflists; the delegate stores). Also used, without this flag, when
    /// dipamd does not answer on its socket.
    #[arg(long)]
    pub offline: bool,
    /// dipamd's --state-dir, read when offline. Default: what the record dipamd leaves at
    /// start says (SOCKET.paths beside the socket, else /var/lib/dipam/dipamd.paths); without
    /// one, the running dipamd's command line, else the systemd unit dipamd.service's; else
    /// /var/lib/dipam.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// dipamd's --spool-dir, read when offline. Default: the record's, else the one the
    /// running dipamd's or the unit's arguments name, else the spool the pointer beside the
    /// socket names, else the folder spool in the state directory.
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Where the delegate plugins are installed (dipamd's --cni-path), checked when offline.
    /// Default: the record's, else the running dipamd's or the unit's, else
    /// /opt/cni/bin:/usr/lib/cni.
    #[arg(long, value_name = "DIRS")]
    pub cni_path: Option<String>,
    #[command(flatten)]
    pub launch: super::launch_args::Flags,
}

impl Args {
    /// What was given, for node_paths::learn; `conf_dir`: the command's own --conf-dir.
    pub fn given(&self, conf_dir: Option<PathBuf>) -> node_paths::Given {
        node_paths::Given {
            state_dir: self.state_dir.clone(),
            spool_dir: self.spool_dir.clone(),
            cni_path: self.cni_path.clone(),
            conf_dir,
            conflist: None,
            sources: self.launch.sources(),
        }
    }
}

/// What an offline report cannot tell: each needs the running dipamd.
pub const NOT_CHECKED: &[&str] = &[
    "whether each delegate answers VERSION (dipamd runs it; offline only its file is checked)",
    "whether reservations unknown to the ledger are in use (orphans cannot be told from running pods)",
    "the agent's addresses",
    "the runtime-aware GC",
    "veth teardown and privileges since start",
    "whether the ledger takes commits (only a copy of it is read)",
    "the socket's mode (dipamd makes the socket at start)",
];

/// One offline check: the same record dipamd's doctor answers with, printed the same way.
pub type Check = dipam_proto::v1::DoctorCheck;

fn check(name: impl Into<String>, ok: bool, detail: impl Into<String>, fix: &str) -> Check {
    Check::new(name, ok, detail, fix)
}

/// The offline report: why it is offline, where it looked, the checks, and what was read.
#[derive(Debug)]
pub struct Report {
    pub reason: String,
    /// dipamd's paths, each with where it was learned.
    pub paths: NodePaths,
    pub checks: Vec<Check>,
    /// The ledger's records, or why they could not be read.
    pub ledger: Result<Vec<AttachmentRecord>, ReadError>,
    pub spool_dir: PathBuf,
    /// Every entry of the spool (and of its quarantine), or why it could not be listed.
    pub spool: Result<Vec<Value>, ReadError>,
}

/// Why a file the offline doctor (or the support bundle) reads could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "no ledger in {} (no sled log \"db\"): a wrong --state-dir, or a dipamd that never \
         started there",
        .0.display()
    )]
    NoLedger(PathBuf),
    #[error(transparent)]
    Ledger(#[from] dipam_state::StoreError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ReadError {
    pub(super) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// Reads the node's files as dipamd at `socket` with `paths` would use them. `reason`: why
/// dipamd is not asked; `scratch`: where the ledger's copy is made (and removed).
pub fn inspect(reason: String, paths: NodePaths, socket: &Path, scratch: &Path) -> Report {
    let mut checks = vec![check(
        "dipamd answers",
        false,
        reason.clone(),
        "start dipamd (`systemctl start dipamd`, or its pod); if it does not stay up, its log \
         says why (`journalctl -u dipamd`)",
    )];
    let state_dir = &paths.state_dir.value;
    if let Some(pid) = ledger_holder(state_dir) {
        checks.push(check(
            "no process holds the ledger unanswered",
            false,
            format!(
                "process {pid} holds the ledger's lock in {} but does not answer on {}",
                state_dir.display(),
                socket.display()
            ),
            "a dipamd that is starting holds it a moment before it serves; one that stays so \
             is stuck or listens on another --socket (`cat /proc/PID/cmdline`)",
        ));
    }
    state_checks(&paths, &mut checks);
    let ledger = if state_dir.join("db").is_file() {
        dipam_state::read_copy(state_dir, scratch).map_err(ReadError::from)
    } else {
        Err(ReadError::NoLedger(state_dir.clone()))
    };
    checks.push(ledger_check(state_dir, &ledger));
    let spool_dir = paths.spool_dir.value.clone();
    spool_checks(&spool_dir, socket, &mut checks);
    let spool = list_spool(&spool_dir);
    for dc in conflist_checks(&paths.conf_dir.value, &mut checks) {
        delegate_checks(
            &dc,
            &paths.cni_path.value,
            ledger.as_deref().ok(),
            &mut checks,
        );
    }
    Report {
        reason,
        paths,
        checks,
        ledger,
        spool_dir,
        spool,
    }
}

/// The pid holding the `flock` sled takes on `<state-dir>/db`, from /proc/locks: seen
/// without taking it, so a starting dipamd is never made to wait.
pub(super) fn ledger_holder(state_dir: &Path) -> Option<u32> {
    let m = std::fs::metadata(state_dir.join("db")).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let ino = m.ino().to_string();
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        let at = f.iter().position(|x| *x == "FLOCK")?;
        let pid = f.get(at + 3)?;
        let dev_ino = f.get(at + 4)?;
        (dev_ino.rsplit(':').next() == Some(ino.as_str())).then(|| pid.parse().ok())?
    })
}

/// The state directory: there, persistent, private.
fn state_checks(paths: &NodePaths, checks: &mut Vec<Check>) {
    let dir = &paths.state_dir.value;
    if !dir.is_dir() {
        checks.push(check(
            "state directory exists",
            false,
            format!(
                "{}: not a directory (the path {})",
                dir.display(),
                paths.state_dir.source
            ),
            "give dipamctl --state-dir DIR as dipamd's unit or DaemonSet sets its --state-dir \
             (dipamd leaves a record of its paths at start: a dipamd that never started with \
             this dipamctl's version left none)",
        ));
        return;
    }
    let tmpfs = on_tmpfs(dir);
    checks.push(check(
        "ledger is persistent",
        !tmpfs,
        format!(
            "{} is {}",
            dir.display(),
            if tmpfs { "on tmpfs" } else { "not on tmpfs" }
        ),
        "run dipamd with --state-dir on persistent storage (hostPath /var/lib/dipam)",
    ));
    checks.push(dipam_shim::l1_leaves::perms::private_check(
        dir,
        &paths.spool_dir.value,
    ));
}

fn ledger_check(dir: &Path, ledger: &Result<Vec<AttachmentRecord>, ReadError>) -> Check {
    match ledger {
        Ok(recs) => {
            let count = |f: fn(&Owner) -> bool| recs.iter().filter(|r| f(&r.owner)).count();
            check(
                "ledger is readable",
                true,
                format!(
                    "{}: {} attachment(s) ({} pod, {} agent, {} pool), read from a copy",
                    dir.display(),
                    recs.len(),
                    count(|o| matches!(o, Owner::Pod)),
                    count(|o| matches!(o, Owner::Agent { .. })),
                    count(|o| matches!(o, Owner::Pool)),
                ),
                "",
            )
        }
        Err(e) => check(
            "ledger is readable",
            false,
            e.to_string(),
            "if dipamd refuses this ledger at start too, `dipamctl recover --state-dir DIR \
             --conflist FILE` rebuilds it from the delegate's store (it moves the old one \
             aside and keeps the DEL spool)",
        ),
    }
}

/// The spool: published, meeting the rule, private, and how many DELs wait in it.
fn spool_checks(dir: &Path, socket: &Path, checks: &mut Vec<Check>) {
    let published = dipam_proto::spool::read_pointer(socket);
    let names_ours = published
        .as_ref()
        .is_ok_and(|p| std::fs::metadata(dir).is_ok_and(|m| m.dev() == p.dev && m.ino() == p.ino));
    checks.push(check(
        "DEL spool published",
        names_ours,
        match &published {
            Ok(p) => format!(
                "the pointer beside {} names {}",
                socket.display(),
                p.dir.display()
            ),
            Err(e) => e.to_string(),
        },
        "while dipamd is down the plugin spools a DEL only where this pointer names; without \
         it a DEL fails with code 11 and the runtime retries it. Start dipamd: it publishes it",
    ));
    if !dir.is_dir() {
        checks.push(check(
            "DEL spool exists",
            false,
            format!("{}: not a directory", dir.display()),
            "give dipamctl --spool-dir (or --state-dir) as dipamd has it; dipamd creates its \
             spool at start",
        ));
        return;
    }
    let untrusted = dipam_proto::spool::open_dir(dir).err();
    checks.push(check(
        "DEL spool meets the spool rule",
        untrusted.is_none(),
        match &untrusted {
            None => format!("{}: root's, not writable by others", dir.display()),
            Some(e) => e.to_string(),
        },
        "chown root:root the directory and chmod 0700 it (no symbolic links on the way)",
    ));
    let mode = std::fs::metadata(dir).map_or(0, |m| m.permissions().mode() & 0o777);
    checks.push(check(
        "DEL spool is private",
        mode & 0o077 == 0,
        format!("{} mode {mode:04o}", dir.display()),
        "chmod 0700 the spool: only root needs it",
    ));
    let waiting = dipam_shim::l3_clients::spool::pending(dir).len();
    checks.push(check(
        "DEL spool drained",
        waiting == 0,
        format!("{waiting} spooled DEL(s) in {}", dir.display()),
        "they are DELs the plugin took while dipamd was down: dipamd replays them when it \
         starts; their addresses stay held until then",
    ));
}

/// Every entry of the spool and its quarantine: name, kind, size, owner, mode. Names only;
/// a spooled DEL's contents (a pod's config) stay in the file.
fn list_spool(dir: &Path) -> Result<Vec<Value>, ReadError> {
    let mut out = Vec::new();
    for (sub, path) in [
        ("", dir.to_owned()),
        (
            dipam_proto::spool::QUARANTINE,
            dir.join(dipam_proto::spool::QUARANTINE),
        ),
    ] {
        let entries = match std::fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if !sub.is_empty() && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ReadError::io(&path)(e)),
        };
        let mut here: Vec<Value> = entries
            .flatten()
            .filter_map(|e| {
                let m = e.path().symlink_metadata().ok()?;
                let name = e.file_name().to_string_lossy().into_owned();
                let kind = if m.is_symlink() {
                    "link"
                } else if m.is_dir() {
                    "dir"
                } else {
                    "file"
                };
                Some(json!({
                    "name": if sub.is_empty() { name } else { format!("{sub}/{name}") },
                    "kind": kind, "size": m.len(), "uid": m.uid(),
                    "mode": format!("{:04o}", m.permissions().mode() & 0o7777),
                }))
            })
            .collect();
        here.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        out.extend(here);
    }
    Ok(out)
}

/// Each file of the CNI configuration directory a runtime would read: it parses, and where it
/// uses dipam, dipam would take it. Returns the delegates of the dipam networks found.
fn conflist_checks(conf_dir: &Path, checks: &mut Vec<Check>) -> Vec<DelegateConf> {
    let files = match conflists(conf_dir) {
        Ok(f) => f,
        Err(e) => {
            checks.push(check(
                "CNI configuration directory",
                false,
                e.to_string(),
                "give --conf-dir as the runtime has it (containerd: conf_dir; CRI-O: \
                 network_dir; podman: cni_config_dir)",
            ));
            return Vec::new();
        }
    };
    let mut found = Vec::new();
    for (name, bytes) in files {
        let path = conf_dir.join(&name);
        let parsed = conflist::parse(&path, &bytes, None);
        let outcome = match parsed {
            Err(conflist::Missing::Invalid(m)) if m.ends_with(conflist::NO_DIPAM) => {
                serde_json::from_slice::<Value>(&bytes)
                    .map(|_| "valid JSON; no plugin uses dipam".to_owned())
                    .map_err(|e| e.to_string())
            }
            Err(m) => Err(m.to_string()),
            Ok(base) => serde_json::to_vec(&base.request)
                .map_err(|e| e.to_string())
                .and_then(|req| {
                    DelegateConf::from_request(&req, base.mode).map_err(|e| e.to_string())
                })
                .map(|dc| {
                    let d = format!("network {}: delegate {}", dc.network, dc.kind);
                    found.push(dc);
                    d
                }),
        };
        checks.push(match outcome {
            Ok(d) => check(format!("conflist {name}"), true, d, ""),
            Err(e) => check(
                format!("conflist {name}"),
                false,
                e,
                "a runtime fails or skips this file: fix it (`dipamctl install --conflist FILE \
                 --dry-run` says what dipam refuses), or move it out of the directory",
            ),
        });
    }
    found
}

/// One dipam network: its delegate is installed, and its store holds what the ledger records.
fn delegate_checks(
    dc: &DelegateConf,
    cni_path: &str,
    ledger: Option<&[AttachmentRecord]>,
    checks: &mut Vec<Check>,
) {
    let net = &dc.network;
    let bin = cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(&dc.kind))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        });
    checks.push(check(
        format!("network {net}: delegate {} installed", dc.kind),
        bin.is_some(),
        match &bin {
            Some(p) => format!("{} is an executable file", p.display()),
            None => format!("no executable {} in {cni_path}", dc.kind),
        },
        "install the delegate plugin, or give dipamctl --cni-path as dipamd's --cni-path",
    ));
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, net) else {
        return;
    };
    let held = match store::reservations(&dir) {
        Ok(r) => r,
        Err(e) => {
            checks.push(check(
                format!("network {net}: delegate store"),
                false,
                format!("{}: {e}", dir.display()),
                "dipamd must read the delegate's store at the path the conflist names",
            ));
            return;
        }
    };
    let Some(recs) = ledger else {
        checks.push(check(
            format!("network {net}: delegate store"),
            true,
            format!(
                "{}: {} reservation(s); not compared (the ledger is unreadable)",
                dir.display(),
                held.len()
            ),
            "",
        ));
        return;
    };
    let held_ips: Vec<String> = held.iter().map(|r| r.ip.to_string()).collect();
    let recorded: Vec<String> = recs
        .iter()
        .filter(|r| &r.key.network == net)
        .flat_map(|r| r.result.as_ref().map(result_ips).unwrap_or_default())
        .map(|cidr| cidr.split('/').next().unwrap_or_default().to_owned())
        .collect();
    let missing: Vec<&String> = recorded
        .iter()
        .filter(|ip| !held_ips.contains(ip))
        .collect();
    let unrecorded = held_ips.iter().filter(|ip| !recorded.contains(ip)).count();
    checks.push(check(
        format!("network {net}: delegate store agrees with the ledger"),
        missing.is_empty(),
        format!(
            "{}: {} reservation(s), {} recorded address(es) missing{}; {unrecorded} \
             reservation(s) not in the ledger (whether a pod uses them is not checked offline)",
            dir.display(),
            held.len(),
            missing.len(),
            if missing.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    missing
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ),
        "dipamd and the runtime must see the same persistent directory: mount the host's \
         /var/lib/cni/networks into dipamd at the same path",
    ));
}

/// One record as the offline report lists it.
fn record_json(r: &AttachmentRecord) -> Value {
    json!({
        "network": r.key.network, "containerID": r.key.container_id, "ifname": r.key.ifname,
        "owner": r.owner.label(), "state": r.state.as_str(), "delegate": r.delegate_type,
        "ips": r.result.as_ref().map(result_ips).unwrap_or_default(),
        "netns": r.netns, "updatedAt": r.updated_at,
    })
}

impl Report {
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.ok).count()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "offline": true,
            "reason": self.reason,
            "paths": self.paths.to_json(),
            "checks": super::output::checks_json(&self.checks),
            "notChecked": NOT_CHECKED,
            "ledger": match &self.ledger {
                Ok(recs) => json!({"attachments": recs.iter().map(record_json).collect::<Vec<_>>()}),
                Err(e) => json!({"error": e.to_string()}),
            },
            "spool": match &self.spool {
                Ok(files) => json!({"dir": self.spool_dir, "files": files}),
                Err(e) => json!({"dir": self.spool_dir, "error": e.to_string()}),
            },
        })
    }

    /// The report for people: the banner, the checks, the ledger, the spool, and what was not
    /// checked.
    pub fn print(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        writeln!(
            out,
            "OFFLINE: dipamd did not answer ({}); read from the node's files instead",
            self.reason
        )?;
        self.paths.print(out)?;
        super::output::checks(out, &self.checks)?;
        if let Ok(recs) = &self.ledger {
            writeln!(out, "ledger ({} attachment(s)):", recs.len())?;
            for r in recs {
                let ips = r.result.as_ref().map(result_ips).unwrap_or_default();
                writeln!(
                    out,
                    "  {} {} {} {} {} {}",
                    r.key.network,
                    r.key.container_id,
                    r.key.ifname,
                    r.owner.label(),
                    r.state.as_str(),
                    if ips.is_empty() {
                        "-".to_owned()
                    } else {
                        ips.join(",")
                    }
                )?;
            }
        }
        match &self.spool {
            Ok(files) => {
                writeln!(
                    out,
                    "spool {} ({} entr{}):",
                    self.spool_dir.display(),
                    files.len(),
                    if files.len() == 1 { "y" } else { "ies" }
                )?;
                for f in files {
                    writeln!(
                        out,
                        "  {} {} {} bytes uid {} mode {}",
                        f["name"].as_str().unwrap_or_default(),
                        f["kind"].as_str().unwrap_or_default(),
                        f["size"],
                        f["uid"],
                        f["mode"].as_str().unwrap_or_default()
                    )?;
                }
            }
            Err(e) => writeln!(out, "spool {}: {e}", self.spool_dir.display())?,
        }
        writeln!(out, "not checked offline (they need the running dipamd):")?;
        for n in NOT_CHECKED {
            writeln!(out, "  - {n}")?;
        }
        writeln!(
            out,
            "{} check(s), {} failed (OFFLINE)",
            self.checks.len(),
            self.failed()
        )
    }
}

/// The conflists of a CNI config directory (the files a runtime would consider), whole.
pub(super) fn conflists(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, ReadError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(ReadError::io(dir))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let wanted = [".conf", ".conflist", ".json"]
            .iter()
            .any(|x| name.ends_with(x));
        if wanted && e.path().is_file() {
            let bytes = std::fs::read(e.path()).map_err(ReadError::io(&name))?;
            out.push((name, bytes));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_conflist_fails_and_a_plain_one_passes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("10-broken.conflist"), b"{not json").unwrap();
        std::fs::write(
            dir.path().join("20-plain.conflist"),
            br#"{"cniVersion":"1.0.0","name":"p","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("30-dipam.conflist"),
            br#"{"cniVersion":"1.0.0","name":"d","plugins":[{"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local","ranges":[[{"subnet":"10.9.0.0/24"}]]}}}]}"#,
        )
        .unwrap();
        let mut checks = Vec::new();
        let found = conflist_checks(dir.path(), &mut checks);
        assert_eq!(found.len(), 1, "{checks:?}");
        assert_eq!(found[0].network, "d");
        let by = |n: &str| checks.iter().find(|c| c.name.contains(n)).unwrap();
        assert!(!by("10-broken").ok);
        assert!(by("10-broken").detail.contains("not JSON"), "{checks:?}");
        assert!(by("20-plain").ok);
        assert!(by("30-dipam").ok);
    }
}
