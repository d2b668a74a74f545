//! Where the tools that run with dipamd down (`doctor`, `support-bundle`, `recover`) look:
//! dipamd's own paths, learned from the record it leaves on the node at every start
//! (paths_record.rs), each saying where it was learned. A flag given on dipamctl's command
//! line wins; then the record; then, where there is none (a dipamd older than this dipamctl,
//! or a record refused), the running dipamd's command line, else the installed systemd
//! unit's (launch_args.rs); the spool also from the pointer beside the socket; the defaults
//! only when nothing else is known, with a warning. A record, process or unit that fails the
//! trust rule is refused with a warning naming why: dipamctl runs as root and would act on
//! it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::launch_args::{self, Sources, Wanted};
use dipam_shim::l1_leaves::paths_record::{self, Record, RecordError};

/// dipamd's default --state-dir, --cni-path, and the runtimes' usual CNI config directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/dipam";
pub const DEFAULT_CNI_PATH: &str = "/opt/cni/bin:/usr/lib/cni";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";

/// A value and where it was learned, as the report prints it ("from /run/dipam/dipam.sock.paths
/// written by dipamd pid 812 at ...").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned<T> {
    pub value: T,
    pub source: String,
}

impl<T> Learned<T> {
    fn new(value: T, source: impl Into<String>) -> Self {
        Self {
            value,
            source: source.into(),
        }
    }
}

/// What dipamctl was given on its command line (each `None` when not).
#[derive(Debug, Clone, Default)]
pub struct Given {
    pub state_dir: Option<PathBuf>,
    pub spool_dir: Option<PathBuf>,
    pub cni_path: Option<String>,
    pub conf_dir: Option<PathBuf>,
    pub conflist: Option<PathBuf>,
    /// Where dipamd's start-up is read when it left no record (`/proc`, systemd's unit
    /// directories; a test's own).
    pub sources: Sources,
}

/// The record believed (or, without one, dipamd's arguments), and where it was read.
#[derive(Debug, Clone)]
pub struct Found {
    pub path: PathBuf,
    pub record: Record,
    /// "from PATH written by dipamd pid N at T", "from the command line of the running
    /// dipamd pid N", "from the systemd unit F (dipamd not running)".
    pub source: String,
    /// It names the spool: a record always does; arguments only with --spool-dir.
    pub spool_named: bool,
}

impl Found {
    fn record(path: PathBuf, record: Record) -> Self {
        let source = format!(
            "from {} written by dipamd pid {} at {}",
            path.display(),
            record.pid,
            dipam_shim::l1_leaves::clock::rfc3339_ms(record.started_at_ms)
        );
        Self {
            path,
            record,
            source,
            spool_named: true,
        }
    }
}

/// dipamd's paths as the offline tools use them.
#[derive(Debug, Clone)]
pub struct NodePaths {
    pub record: Option<Found>,
    /// Records refused: they fail the trust rule.
    pub refused: Vec<String>,
    /// Records passed over: another dipamd's (not the --state-dir given).
    pub passed_over: Vec<String>,
    /// Why the defaults are assumed where no flag says otherwise: no record was believed.
    pub no_record: Option<String>,
    pub state_dir: Learned<PathBuf>,
    pub spool_dir: Learned<PathBuf>,
    pub cni_path: Learned<String>,
    /// The CNI configuration directory whose conflists are checked and collected.
    pub conf_dir: Learned<PathBuf>,
    /// dipamd's --conflist (or the file of --network in --conf-dir), when it has one.
    pub conflist: Option<Learned<PathBuf>>,
    /// Where dipamd serves metrics: `http://ADDR/metrics` or `unix:PATH`.
    pub metrics: Option<Learned<String>>,
}

/// What [`find`] found, refused and passed over.
struct Search {
    found: Option<Found>,
    refused: Vec<String>,
    passed_over: Vec<String>,
    no_record: Option<String>,
}

/// Reads the first record that is there and believed, of: the state directory's when
/// `--state-dir` was given, the one beside `socket`, the default state directory's. One whose
/// state directory is not the `--state-dir` given describes another dipamd and is passed
/// over.
fn find(socket: &Path, given: &Given) -> Search {
    let mut candidates = Vec::new();
    if let Some(d) = &given.state_dir {
        candidates.push(paths_record::in_state_dir(d));
    }
    candidates.push(paths_record::beside_socket(socket));
    if given.state_dir.is_none() {
        candidates.push(paths_record::in_state_dir(Path::new(DEFAULT_STATE_DIR)));
    }
    let mut search = Search {
        found: None,
        refused: Vec::new(),
        passed_over: Vec::new(),
        no_record: None,
    };
    for path in &candidates {
        match paths_record::read(path) {
            Ok(record) => {
                if let Some(d) = &given.state_dir
                    && !same_dir(d, &record.state_dir)
                {
                    search.passed_over.push(format!(
                        "{} describes the dipamd of state directory {}, not --state-dir {}: \
                         not used",
                        path.display(),
                        record.state_dir.display(),
                        d.display()
                    ));
                    continue;
                }
                search.found = Some(Found::record(path.clone(), record));
                return search;
            }
            Err(e) if e.not_found() => {}
            Err(e) => search.refused.push(refused(&e)),
        }
    }
    let launched = launch_args::find(
        &given.sources,
        Wanted {
            socket,
            state_dir: given.state_dir.as_deref(),
        },
    );
    search.refused.extend(launched.refused);
    search.passed_over.extend(launched.passed_over);
    if let Some(l) = launched.launch {
        search.found = Some(Found {
            path: l.path,
            record: l.record,
            source: l.source,
            spool_named: l.spool_named,
        });
        return search;
    }
    let shown: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    search.no_record = Some(format!(
        "no record of dipamd's paths believed (looked for {}), no running dipamd serving it \
         and no systemd unit {} of it: where no flag says otherwise, the defaults are \
         assumed, and they may not be this node's (give dipamctl's own --state-dir, \
         --spool-dir, --cni-path, --conf-dir as dipamd has them)",
        shown.join(", "),
        launch_args::UNIT
    ));
    search
}

/// The warning for a record that is there but not believed.
fn refused(e: &RecordError) -> String {
    format!(
        "refused a record of dipamd's paths: {e}. Only a file owned by root and writable by no \
         one else, in directories only root may write, is believed (another user could have \
         planted it); dipamd rewrites it at its next start"
    )
}

fn same_dir(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    canon(a) == canon(b)
}

/// Every path the offline tools use, each with where it was learned. Reads files: call off
/// the async workers.
pub fn learn(socket: &Path, given: &Given) -> NodePaths {
    let Search {
        found: record,
        refused,
        passed_over,
        no_record,
    } = find(socket, given);
    let from = record.as_ref().map(|f| f.source.as_str());
    let rec = record.as_ref().map(|f| &f.record);
    let spool_rec = record
        .as_ref()
        .filter(|f| f.spool_named)
        .map(|f| &f.record.spool_dir);
    let pick = |flag: &Option<PathBuf>, name: &str, recorded: Option<&PathBuf>| {
        flag.clone()
            .map(|v| Learned::new(v, format!("given ({name})")))
            .or_else(|| Some(Learned::new(recorded?.clone(), from?)))
    };
    let state_dir = pick(&given.state_dir, "--state-dir", rec.map(|r| &r.state_dir))
        .unwrap_or_else(|| Learned::new(PathBuf::from(DEFAULT_STATE_DIR), "default"));
    let spool_dir = pick(&given.spool_dir, "--spool-dir", spool_rec)
        .or_else(|| {
            dipam_proto::spool::read_pointer(socket).ok().map(|p| {
                Learned::new(
                    p.dir,
                    format!(
                        "from the spool pointer {}",
                        dipam_proto::spool::pointer_path(socket).display()
                    ),
                )
            })
        })
        .unwrap_or_else(|| match from {
            Some(from) if state_dir.source.as_str() == from => Learned::new(
                state_dir.value.join("spool"),
                format!("<state-dir>/spool, {from}"),
            ),
            _ => Learned::new(state_dir.value.join("spool"), "default (<state-dir>/spool)"),
        });
    let cni_path = given
        .cni_path
        .clone()
        .map(|v| Learned::new(v, "given (--cni-path)"))
        .or_else(|| Some(Learned::new(rec?.cni_path.clone(), from?)))
        .unwrap_or_else(|| Learned::new(DEFAULT_CNI_PATH.to_owned(), "default"));
    let conflist = pick(
        &given.conflist,
        "--conflist",
        rec.and_then(conflist_of).as_ref(),
    );
    let conf_dir = conf_dir(given, rec, from, conflist.as_ref());
    let metrics = rec.and_then(|r| {
        let target = r
            .metrics_socket
            .as_ref()
            .map(|p| format!("unix:{}", p.display()))
            .or_else(|| {
                r.metrics_address
                    .as_ref()
                    .map(|a| format!("http://{a}/metrics"))
            })?;
        Some(Learned::new(target, from?))
    });
    NodePaths {
        record,
        refused,
        passed_over,
        no_record,
        state_dir,
        spool_dir,
        cni_path,
        conf_dir,
        conflist,
        metrics,
    }
}

/// dipamd's conflist: its --conflist, or the file of --network in its --conf-dir (found as
/// dipamd finds it).
fn conflist_of(r: &Record) -> Option<PathBuf> {
    if let Some(p) = &r.conflist {
        return Some(p.clone());
    }
    let (dir, network) = (r.conf_dir.as_ref()?, r.network.as_deref()?);
    // libcni's order: lexical by file name, the first of the network's name.
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "conf" || x == "conflist" || x == "json")
        })
        .collect();
    files.sort();
    files.into_iter().find(|p| {
        std::fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["name"].as_str() == Some(network))
    })
}

/// The CNI configuration directory: --conf-dir given to dipamctl, else dipamd's --conf-dir,
/// else the directory of dipamd's --conflist, else the default.
fn conf_dir(
    given: &Given,
    rec: Option<&Record>,
    from: Option<&str>,
    conflist: Option<&Learned<PathBuf>>,
) -> Learned<PathBuf> {
    if let Some(d) = &given.conf_dir {
        return Learned::new(d.clone(), "given (--conf-dir)");
    }
    if let (Some(d), Some(from)) = (rec.and_then(|r| r.conf_dir.as_ref()), from) {
        return Learned::new(d.clone(), format!("dipamd's --conf-dir, {from}"));
    }
    if let Some(dir) = conflist.and_then(|c| c.value.parent().map(|d| (d, &c.source))) {
        return Learned::new(
            dir.0.to_owned(),
            format!("the directory of dipamd's --conflist, {}", dir.1),
        );
    }
    Learned::new(PathBuf::from(DEFAULT_CONF_DIR), "default")
}

impl NodePaths {
    /// Every warning: the records refused and passed over, then why the defaults are assumed.
    pub fn warnings(&self) -> Vec<String> {
        self.refused
            .iter()
            .chain(&self.passed_over)
            .chain(self.no_record.as_ref())
            .cloned()
            .collect()
    }

    /// What the reports print: each path and where it was learned.
    pub fn rows(&self) -> Vec<(&'static str, String, &str)> {
        let mut rows = vec![
            (
                "state directory",
                self.state_dir.value.display().to_string(),
                self.state_dir.source.as_str(),
            ),
            (
                "DEL spool",
                self.spool_dir.value.display().to_string(),
                self.spool_dir.source.as_str(),
            ),
            (
                "delegate search path",
                self.cni_path.value.clone(),
                self.cni_path.source.as_str(),
            ),
            (
                "CNI config directory",
                self.conf_dir.value.display().to_string(),
                self.conf_dir.source.as_str(),
            ),
        ];
        if let Some(c) = &self.conflist {
            rows.push((
                "dipamd's conflist",
                c.value.display().to_string(),
                c.source.as_str(),
            ));
        }
        if let Some(m) = &self.metrics {
            rows.push(("metrics", m.value.clone(), m.source.as_str()));
        }
        rows
    }

    pub fn to_json(&self) -> Value {
        let one = |v: String, s: &str| json!({"path": v, "source": s});
        json!({
            "record": self.record.as_ref().map(|f| json!({"path": f.path, "source": f.source, "contents": f.record})),
            "warnings": self.warnings(),
            "stateDir": one(self.state_dir.value.display().to_string(), &self.state_dir.source),
            "spoolDir": one(self.spool_dir.value.display().to_string(), &self.spool_dir.source),
            "cniPath": one(self.cni_path.value.clone(), &self.cni_path.source),
            "confDir": one(self.conf_dir.value.display().to_string(), &self.conf_dir.source),
            "conflist": self.conflist.as_ref().map(|c| one(c.value.display().to_string(), &c.source)),
            "metrics": self.metrics.as_ref().map(|m| one(m.value.clone(), &m.source)),
        })
    }

    /// The report's section: the paths and where each was learned, then the warnings.
    pub fn print(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        writeln!(out, "dipamd's paths:")?;
        for (name, value, source) in self.rows() {
            writeln!(out, "  {name}: {value} ({source})")?;
        }
        for w in self.warnings() {
            writeln!(out, "WARNING: {w}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_then_the_record_then_the_defaults_and_each_says_so() {
        let t = tempfile::tempdir().unwrap();
        let socket = t.path().join("none/dipam.sock");
        let given = Given {
            state_dir: None,
            cni_path: Some("/x/bin".into()),
            ..Given::default()
        };
        // No record anywhere under a temp socket (the default state directory's may exist on
        // a node running dipamd, so only the socket's candidate is asserted).
        let p = learn(&socket, &given);
        assert_eq!(p.cni_path.value, "/x/bin");
        assert_eq!(p.cni_path.source, "given (--cni-path)");
        if p.record.is_none() {
            assert_eq!(p.state_dir.value, PathBuf::from(DEFAULT_STATE_DIR));
            assert_eq!(p.state_dir.source, "default");
            let why = p.no_record.as_deref().unwrap_or_default();
            assert!(why.contains("no record of dipamd's paths"), "{why}");
            assert!(why.contains(&socket.display().to_string()), "{why}");
        }
        // A missing record is no refusal.
        assert!(
            p.refused
                .iter()
                .all(|w| !w.contains(&socket.display().to_string())),
            "{:?}",
            p.refused
        );
    }

    #[test]
    fn the_conf_dir_follows_dipamds_conflist() {
        let rec = Record {
            format: paths_record::FORMAT,
            version: "0".into(),
            pid: 7,
            started_at_ms: 0,
            socket: "/run/n/d.sock".into(),
            users_socket: None,
            state_dir: "/srv/s".into(),
            spool_dir: "/srv/s/spool".into(),
            exec_dir: "/srv/s/exec".into(),
            cni_path: "/srv/bin".into(),
            conflist: Some("/etc/node-a/net.d/10-dipam.conflist".into()),
            conf_dir: None,
            network: None,
            metrics_address: None,
            metrics_socket: None,
            cri_endpoint: None,
        };
        let c = Learned::new(conflist_of(&rec).unwrap(), "from R");
        let d = conf_dir(&Given::default(), Some(&rec), Some("from R"), Some(&c));
        assert_eq!(d.value, PathBuf::from("/etc/node-a/net.d"));
        assert_eq!(d.source, "the directory of dipamd's --conflist, from R");
        let given = Given {
            conf_dir: Some("/mine".into()),
            ..Given::default()
        };
        assert_eq!(
            conf_dir(&given, Some(&rec), Some("from R"), Some(&c)).source,
            "given (--conf-dir)"
        );
    }
}
