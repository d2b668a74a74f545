//! dipamd's paths where it left no record of them (a dipamd older than this dipamctl, or a
//! record refused): read from how the node starts it, parsed by dipamd's own flag
//! definitions (`daemon::Args`), so a flag dipamd takes is read here exactly as dipamd reads
//! it, its `DIPAM_*` variable included. node_paths.rs asks here after the record and before
//! the spool pointer and the defaults:
//!
//! 1. **a running dipamd**: `/proc/PID/cmdline` and `/proc/PID/environ` of a process whose
//!    binary (or, unreadable, whose name) is `dipamd`. In the DaemonSet's shape dipamctl runs
//!    in the dipamd container (`kubectl exec`), so this is the DaemonSet's `command` and
//!    `env`; on a systemd node, the unit's `ExecStart` after systemd expanded it.
//! 2. **the installed systemd unit**, dipamd stopped: `dipamd.service` from the first unit
//!    directory that has it (systemd's order: /etc, /run, /usr/local/lib, /usr/lib, /lib),
//!    then every `dipamd.service.d/*.conf` drop-in (a name in an earlier directory hides the
//!    same name in a later one), read as systemd reads them: `Environment=`,
//!    `EnvironmentFile=` (its variables after every `Environment=`) and the last
//!    `ExecStart=` (an empty one resets it), `$VAR` split at white space, `${VAR}` one word
//!    (systemd.exec(5) "Environment", systemd.service(5) "Command lines").
//!
//! Only the dipamd serving the socket dipamctl was given (or, with `--state-dir`, keeping that
//! state directory) is used: another dipamd's arguments are passed over, saying so.
//!
//! **Trust.** dipamctl runs as root and acts on what it learns (`recover` moves a state
//! directory aside), so only what another user cannot have planted is believed: a process
//! running as root, and a unit file, drop-in or environment file that is owned by root,
//! writable by no one else, in directories only root may write (the record's rule,
//! paths_record.rs). Anything else is refused with a warning naming why.

use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
};

use clap::{CommandFactory, FromArgMatches};
use dipam_proto::spool::{self, Untrusted};

use dipam_shim::{l1_leaves::paths_record::Record, l7_daemon::daemon};

/// systemd's unit directories, highest priority first (systemd.unit(5), "System Unit Search
/// Path"; /lib on a system whose /usr is not merged).
pub const UNIT_DIRS: &[&str] = &[
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];

/// The unit's name (deploy/systemd/dipamd.service).
pub const UNIT: &str = "dipamd.service";

/// The largest unit, drop-in or environment file read.
const MAX_FILE: u64 = 256 << 10;

/// The flag that points dipamctl at other unit directories (a test's own; hidden).
#[derive(Debug, Clone, Default, clap::Args)]
#[group(skip)]
pub struct Flags {
    /// Look for dipamd.service and its drop-ins in DIR instead of systemd's unit directories
    /// (repeatable, highest priority first).
    #[arg(long = "unit-dir", value_name = "DIR", hide = true)]
    pub unit_dirs: Vec<PathBuf>,
}

impl Flags {
    pub fn sources(&self) -> Sources {
        Sources::node(&self.unit_dirs)
    }
}

/// Where the node's start-up is read: `/proc` and systemd's unit directories on a node.
#[derive(Debug, Clone)]
pub struct Sources {
    pub proc: PathBuf,
    pub unit_dirs: Vec<PathBuf>,
}

impl Sources {
    /// The node's, with `unit_dirs` (when not empty) instead of systemd's.
    pub fn node(unit_dirs: &[PathBuf]) -> Self {
        Self {
            proc: PathBuf::from("/proc"),
            unit_dirs: if unit_dirs.is_empty() {
                UNIT_DIRS.iter().map(PathBuf::from).collect()
            } else {
                unit_dirs.to_vec()
            },
        }
    }
}

impl Default for Sources {
    fn default() -> Self {
        Self::node(&[])
    }
}

/// Why a source of dipamd's arguments was not believed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}")]
    Untrusted(#[from] Untrusted),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is {size} bytes, more than a unit file can be", path.display())]
    Size { path: PathBuf, size: u64 },
    #[error("{}: {why}", path.display())]
    Syntax { path: PathBuf, why: String },
    #[error("dipamd pid {pid} runs as uid {uid}, not root: another user may name a process dipamd")]
    NotRoot { pid: u32, uid: u32 },
    #[error("the arguments {from} gives dipamd do not parse: {source}")]
    Args {
        from: String,
        source: Box<clap::Error>,
    },
}

/// dipamd's paths as its start-up says, and where that was read.
#[derive(Debug, Clone)]
pub struct Launch {
    /// "from the command line of the running dipamd pid N" / "from the systemd unit F".
    pub source: String,
    /// The file read (`/proc/N/cmdline`, or the unit file).
    pub path: PathBuf,
    /// The paths, as a record dipamd would have written.
    pub record: Record,
    /// The arguments named the spool (`--spool-dir`, `DIPAM_SPOOL_DIR`): otherwise the spool
    /// pointer beside the socket says better than the default `<state-dir>/spool`.
    pub spool_named: bool,
}

/// What [`find`] found, refused and passed over.
#[derive(Debug, Default)]
pub struct Found {
    pub launch: Option<Launch>,
    pub refused: Vec<String>,
    pub passed_over: Vec<String>,
}

/// Which dipamd is meant: the one serving `socket`, or keeping `state_dir` when given.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    pub socket: &'a Path,
    pub state_dir: Option<&'a Path>,
}

impl Wanted<'_> {
    fn matches(&self, r: &Record) -> bool {
        match self.state_dir {
            Some(d) => same_path(d, &r.state_dir),
            None => same_path(self.socket, &r.socket),
        }
    }

    fn describe(&self) -> String {
        match self.state_dir {
            Some(d) => format!("--state-dir {}", d.display()),
            None => format!("the socket {}", self.socket.display()),
        }
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.components().collect());
    canon(a) == canon(b)
}

/// The running dipamd's arguments, else the installed unit's. Reads files: call off the
/// async workers.
pub fn find(sources: &Sources, wanted: Wanted<'_>) -> Found {
    let mut found = Found::default();
    let mut others = Vec::new();
    for pid in running(&sources.proc) {
        match from_process(&sources.proc, pid) {
            Ok(l) if wanted.matches(&l.record) => {
                found.launch = Some(l);
                return found;
            }
            Ok(l) => others.push(format!("pid {} ({})", pid, l.record.socket.display())),
            // It ended between the listing and the reading: not a running dipamd, and
            // nothing to warn of (a warning here broke a quiet `recover` while another
            // dipamd on the node was stopping).
            Err(e) if vanished(&e) || only_prints(&e) => {}
            Err(e) => found
                .refused
                .push(format!("refused the arguments of a running dipamd: {e}")),
        }
    }
    if !others.is_empty() {
        found.passed_over.push(format!(
            "the running dipamd(s) {} serve another socket than {}: their arguments not used",
            others.join(", "),
            wanted.describe()
        ));
    }
    match from_unit(&sources.unit_dirs) {
        Ok(Some(l)) if wanted.matches(&l.record) => found.launch = Some(l),
        Ok(Some(l)) => found.passed_over.push(format!(
            "{} describes the dipamd of {} and state directory {}, not {}: not used",
            l.path.display(),
            l.record.socket.display(),
            l.record.state_dir.display(),
            wanted.describe()
        )),
        Ok(None) => {}
        Err(e) => found.refused.push(format!(
            "refused the systemd unit of dipamd: {e}. Only files owned by root and writable by \
             no one else, in directories only root may write, are believed (another user could \
             have planted them)"
        )),
    }
    found
}

/// Whether `e` says the process was gone by the time its files were read: /proc answers
/// ENOENT, or ESRCH for a process that is exiting.
fn vanished(e: &LaunchError) -> bool {
    matches!(e, LaunchError::Read { source, .. }
        if source.kind() == std::io::ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ESRCH))
}

/// Whether `e` says the process is `dipamd --version` or `--help`: it prints and exits, and
/// serves no socket. A warning here broke a quiet `recover` while an operator (or a script)
/// asked dipamd its version.
fn only_prints(e: &LaunchError) -> bool {
    use clap::error::ErrorKind;
    matches!(e, LaunchError::Args { source, .. }
        if matches!(source.kind(),
            ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelp
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand))
}

/// The pids whose binary (or, unreadable, whose name) is dipamd.
fn running(proc: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let named = match std::fs::read_link(e.path().join("exe")) {
                // An upgraded binary runs on as "PATH (deleted)".
                Ok(exe) => exe
                    .to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n == "dipamd"),
                Err(_) => std::fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.trim_end() == "dipamd"),
            };
            named.then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// A running dipamd's arguments and environment, if it runs as root.
fn from_process(proc: &Path, pid: u32) -> Result<Launch, LaunchError> {
    let dir = proc.join(pid.to_string());
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| LaunchError::Read { path, source })
    };
    let status = String::from_utf8_lossy(&read("status")?).into_owned();
    let uids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|u| {
            u.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    match uids.get(..2) {
        Some(&[0, 0]) => {}
        Some(&[real, effective]) => {
            let uid = if real != 0 { real } else { effective };
            return Err(LaunchError::NotRoot { pid, uid });
        }
        _ => {
            return Err(LaunchError::Syntax {
                path: dir.join("status"),
                why: "no Uid line".into(),
            });
        }
    }
    let split = |b: Vec<u8>| -> Vec<OsString> {
        use std::os::unix::ffi::OsStrExt;
        b.split(|c| *c == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsStr::from_bytes(a).to_owned())
            .collect()
    };
    let argv = split(read("cmdline")?);
    let env: Vec<(String, String)> = split(read("environ")?)
        .iter()
        .filter_map(|kv| {
            let (k, v) = kv.to_str()?.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect();
    let cwd = std::fs::read_link(dir.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    let source = format!("from the command line of the running dipamd pid {pid}");
    let (record, spool_named) = parse(&argv, &env, &cwd, &source)?;
    Ok(Launch {
        record: Record { pid, ..record },
        path: dir.join("cmdline"),
        source,
        spool_named,
    })
}

/// Parses dipamd's arguments as dipamd does, with `env` as its environment (never
/// dipamctl's own) and relative paths against `cwd`: the paths it would record.
fn parse(
    argv: &[OsString],
    env: &[(String, String)],
    cwd: &Path,
    from: &str,
) -> Result<(Record, bool), LaunchError> {
    let cmd = daemon::Args::command();
    // Each variable dipamd reads, as the flag it stands for, before the command line (a
    // flag beats its variable: dipamd takes a repeated flag's last value).
    let mut words: Vec<OsString> = vec!["dipamd".into()];
    for a in cmd.get_arguments() {
        let (Some(name), Some(long)) = (a.get_env(), a.get_long()) else {
            continue;
        };
        if !a.get_action().takes_values() {
            continue;
        }
        if let Some((_, v)) = env.iter().rev().find(|(k, _)| OsStr::new(k) == name) {
            words.push(format!("--{long}={v}").into());
        }
    }
    words.extend(argv.iter().skip(1).cloned());
    let err = |e: clap::Error| LaunchError::Args {
        from: from.to_owned(),
        source: Box::new(e),
    };
    // dipamctl's own environment must not stand in for dipamd's; a flag this dipamctl does
    // not know (a newer dipamd's) is skipped, not fatal.
    let matches = cmd
        .mut_args(|a| a.env(None::<&str>))
        .ignore_errors(true)
        .try_get_matches_from(words)
        .map_err(err)?;
    let mut args = daemon::Args::from_arg_matches(&matches).map_err(err)?;
    let spool_named = args.spool_dir.is_some();
    let abs = |p: &mut PathBuf| *p = cwd.join(&*p);
    abs(&mut args.socket);
    abs(&mut args.state_dir);
    for p in [
        &mut args.spool_dir,
        &mut args.conflist,
        &mut args.conf_dir,
        &mut args.metrics_socket,
        &mut args.users_socket,
    ]
    .into_iter()
    .flatten()
    {
        abs(p);
    }
    let spool_dir = args
        .spool_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("spool"));
    Ok((
        daemon::paths::describe(&args, &spool_dir, 0, 0),
        spool_named,
    ))
}

/// The installed unit's arguments, `None` when no unit is installed.
fn from_unit(dirs: &[PathBuf]) -> Result<Option<Launch>, LaunchError> {
    let Some(unit) = dirs.iter().map(|d| d.join(UNIT)).find(|p| p.exists()) else {
        return Ok(None);
    };
    let mut dropins: Vec<(OsString, PathBuf)> = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d.join(format!("{UNIT}.d"))) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            let conf = Path::new(&name).extension().is_some_and(|x| x == "conf");
            if conf && !dropins.iter().any(|(n, _)| *n == name) {
                dropins.push((name, e.path()));
            }
        }
    }
    dropins.sort();
    let mut service = Service::default();
    let mut files = vec![unit.clone()];
    files.extend(dropins.into_iter().map(|(_, p)| p));
    for f in &files {
        service.apply(&read_trusted(f)?, f)?;
    }
    let env = service.environment()?;
    let argv = service.exec_start(&env, &unit)?;
    let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let source = format!(
        "from the systemd unit {} (dipamd not running)",
        shown.join(" + ")
    );
    let (record, spool_named) = parse(&argv, &env, Path::new("/"), &source)?;
    Ok(Some(Launch {
        source,
        path: unit,
        record,
        spool_named,
    }))
}

/// A file read only if it meets the trust rule: links resolved first (a unit linked into
/// /etc/systemd/system by `systemctl link`), then the file and every directory above it
/// checked.
fn read_trusted(path: &Path) -> Result<String, LaunchError> {
    let real = std::fs::canonicalize(path).map_err(|source| LaunchError::Read {
        path: path.to_owned(),
        source,
    })?;
    let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(LaunchError::Syntax {
            path: real,
            why: "not a file in a directory".into(),
        });
    };
    let dir = spool::open_dir(parent)?;
    let f = spool::open_file(&dir, parent, name)?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    if size > MAX_FILE {
        return Err(LaunchError::Size { path: real, size });
    }
    std::io::read_to_string(f).map_err(|source| LaunchError::Read { path: real, source })
}

/// The `[Service]` settings that start dipamd, after the unit and its drop-ins.
#[derive(Debug, Default)]
struct Service {
    environment: Vec<(String, String)>,
    /// (path, optional: a leading "-").
    environment_files: Vec<(PathBuf, bool)>,
    exec_start: Option<String>,
}

impl Service {
    /// Applies one file's `[Service]` section (continuation lines joined, comments skipped).
    fn apply(&mut self, text: &str, path: &Path) -> Result<(), LaunchError> {
        let syntax = |why: String| LaunchError::Syntax {
            path: path.to_owned(),
            why,
        };
        let mut in_service = false;
        for line in text.replace("\\\n", " ").lines().map(str::trim) {
            if line.is_empty() || line.starts_with(['#', ';']) {
                continue;
            }
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if !in_service {
                continue;
            }
            let value = value.trim();
            match key.trim() {
                "Environment" if value.is_empty() => self.environment.clear(),
                "Environment" => {
                    for a in words(value).map_err(|e| syntax(e.to_string()))? {
                        if let Some((k, v)) = a.text.split_once('=') {
                            self.environment.push((k.to_owned(), v.to_owned()));
                        }
                    }
                }
                "EnvironmentFile" if value.is_empty() => self.environment_files.clear(),
                "EnvironmentFile" => {
                    let optional = value.starts_with('-');
                    let p = PathBuf::from(value.trim_start_matches('-'));
                    self.environment_files.push((p, optional));
                }
                "ExecStart" => {
                    self.exec_start = (!value.is_empty()).then(|| value.to_owned());
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `Environment=`, then each `EnvironmentFile=` over it (systemd.exec(5)).
    fn environment(&self) -> Result<Vec<(String, String)>, LaunchError> {
        let mut env = self.environment.clone();
        for (path, optional) in &self.environment_files {
            if *optional && !path.exists() {
                continue;
            }
            env.extend(environment_file(&read_trusted(path)?));
        }
        Ok(env)
    }

    /// `ExecStart=` as the words systemd passes, its prefixes dropped and variables expanded.
    fn exec_start(
        &self,
        env: &[(String, String)],
        unit: &Path,
    ) -> Result<Vec<OsString>, LaunchError> {
        let syntax = |why: String| LaunchError::Syntax {
            path: unit.to_owned(),
            why,
        };
        let line = self
            .exec_start
            .as_deref()
            .ok_or_else(|| syntax("no ExecStart= after its drop-ins".into()))?;
        let line = line.trim_start_matches(['@', '-', ':', '+', '!']);
        let lookup = |k: &str| {
            env.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map_or("", |(_, v)| v.as_str())
        };
        let mut argv = Vec::new();
        for w in words(line).map_err(|e| syntax(e.to_string()))? {
            match w.bare_var() {
                // `$VAR` alone: split at white space, an empty one adds no word.
                Some(name) => argv.extend(lookup(name).split_whitespace().map(OsString::from)),
                None => argv.push(expand_braced(&w.text, lookup).into()),
            }
        }
        Ok(argv)
    }
}

/// One word of a unit's line, and whether it was quoted.
#[derive(Debug)]
struct Word {
    text: String,
    quoted: bool,
}

impl Word {
    /// The variable's name when the word is exactly `$NAME`, unquoted.
    fn bare_var(&self) -> Option<&str> {
        let name = self.text.strip_prefix('$').filter(|_| !self.quoted)?;
        (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then_some(name)
    }
}

/// A unit line whose quote never closes.
#[derive(Debug, thiserror::Error)]
#[error("unterminated quote in {0:?}")]
struct UnterminatedQuote(String);

/// A unit line's words: split at white space, "double" and 'single' quotes kept together,
/// a backslash escaping the next character (systemd.syntax(7), "Quoting").
fn words(line: &str) -> Result<Vec<Word>, UnterminatedQuote> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut w = Word {
            text: String::new(),
            quoted: false,
        };
        let mut quote = None;
        while let Some(c) = chars.next() {
            match (c, quote) {
                ('\\', _) => w.text.extend(chars.next()),
                ('"' | '\'', None) => (quote, w.quoted) = (Some(c), true),
                (c, Some(q)) if c == q => quote = None,
                (c, None) if c.is_whitespace() => break,
                (c, _) => w.text.push(c),
            }
        }
        if quote.is_some() {
            return Err(UnterminatedQuote(line.to_owned()));
        }
        out.push(w);
    }
}

/// `${NAME}` replaced by its value (one word, white space kept).
fn expand_braced<'a>(text: &str, lookup: impl Fn(&str) -> &'a str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let Some(end) = rest[at..].find('}') else {
            break;
        };
        out.push_str(&rest[..at]);
        out.push_str(lookup(&rest[at + 2..at + end]));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// An environment file's assignments: `KEY=VALUE` lines, `#`/`;` comments, a value's
/// surrounding quotes removed.
fn environment_file(text: &str) -> Vec<(String, String)> {
    text.replace("\\\n", "")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = [('"', '"'), ('\'', '\'')]
                .iter()
                .find_map(|(a, b)| v.strip_prefix(*a)?.strip_suffix(*b))
                .unwrap_or(v);
            Some((k.trim().to_owned(), v.to_owned()))
        })
        .collect()
}

#[cfg(test)]
#[path = "launch_args_tests.rs"]
mod tests;
