//! dipamctl: the operator's view of dipamd. Every command prints a table for people or, with
//! --json, one JSON document for scripts.
//!
//! One file per command, each with its own flags (`Args`) and its `run`; this module only
//! parses the command line and dispatches. What they share: `client` (reaching dipamd),
//! `error` (`CtlError`, which every command returns) and `output` (the one boundary that
//! prints an error and picks the exit status, tables, JSON).

use std::{
    ffi::OsString,
    io::{IsTerminal, Write},
    path::PathBuf,
};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod adopt;
pub mod agent;
pub mod atomic;
pub mod attachments;
pub mod client;
pub mod compat;
// Which runtimes read a CNI conf dir (compat.rs judges the conflist by them).
pub mod completions;
pub mod conf_readers;
pub mod doctor;
pub mod error;
pub mod explain;
pub mod gc;
pub mod install;
pub mod kube;
pub mod launch_args;
pub mod man;
// dipamd's paths for the tools that run while it is down (doctor, support-bundle, recover).
pub mod node_paths;
pub mod offline;
pub mod output;
pub mod ranges;
pub mod recover;
pub mod runtime_gc;
pub mod status;
pub mod support_bundle;
#[cfg(test)]
mod text_busy;
pub mod wrap;

pub use error::CtlError;

/// dipamctl: inspect the dipam shim daemon (dipamd).
#[derive(Debug, Parser)]
#[command(name = "dipamctl", version, after_help = AFTER_HELP)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// Where the flags went that every command used to accept, and what the exit status means.
const AFTER_HELP: &str = "\
The commands that reach dipamd take --socket PATH (env DIPAM_SOCKET, default \
/run/dipam/dipam.sock); those that print a result take --json. Both follow the command's \
name (`dipamctl status --json`); see `dipamctl COMMAND --help`.

Exit status: 0 done; 1 failed (dipamd unreachable or refusing, a check failed, a GC \
refused); 2 usage error (the command line is wrong).";

/// The flag of the commands that reach dipamd (or, for `install --wrap`, write where it
/// listens). Global within its command, so that `agent --socket S list` works as
/// `agent list --socket S` does.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// dipamd's unix socket.
    #[arg(long, global = true, env = "DIPAM_SOCKET", default_value = wrap::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// The flag of the commands that print a result: a table for people, JSON for scripts.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Format {
    /// Print JSON instead of a table; a failure is then one JSON document on stderr.
    #[arg(long, global = true)]
    pub json: bool,
}

/// A command that reaches dipamd: its own flags, then --socket and --json.
#[derive(Debug, clap::Args)]
pub struct WithSocket<A: clap::Args> {
    #[command(flatten)]
    pub args: A,
    #[command(flatten)]
    pub conn: Connection,
    #[command(flatten)]
    pub format: Format,
}

/// A command that needs no dipamd but prints a result: its own flags, then --json.
#[derive(Debug, clap::Args)]
pub struct WithJson<A: clap::Args> {
    #[command(flatten)]
    pub args: A,
    #[command(flatten)]
    pub format: Format,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Is dipamd ready? Versions, uptime, state directory, attachment count, delegates seen.
    Status(WithSocket<status::Args>),
    /// Every attachment in the ledger: network, container, interface, owner, state, addresses.
    Attachments(WithSocket<attachments::Args>),
    /// Every check of dipamd's configuration and state, with what to fix; exits non-zero when
    /// one fails. When dipamd does not answer (or with --offline), an OFFLINE report from the
    /// node's files instead: the ledger (read from a copy, never opened in place), the DEL
    /// spool and its files, the conflists, the delegates and their stores; it lists what it
    /// could not check. dipamd's paths, each printed with where it was learned, come from, in
    /// order: dipamctl's own flag; the record dipamd leaves at start (beside --socket, or in
    /// --state-dir); without one, the running dipamd's command line (/proc; in the
    /// DaemonSet, the container's command and env); else the installed systemd unit
    /// dipamd.service with its drop-ins; the spool pointer beside the socket; the default,
    /// with a warning. A record, process or unit another user could have planted is refused.
    Doctor(WithSocket<doctor::Args>),
    /// A container's attachments and the full history of what dipamd did for it: every
    /// request with its outcome, every delegate exec with argv, environment, exit status,
    /// stderr excerpt and duration, and who freed its addresses (a DEL, a CNI GC, the
    /// runtime-aware GC, an operator, a reboot, ...). By IP: also each earlier holder of the
    /// address, and who freed it.
    Explain(WithSocket<explain::Args>),
    /// Offline: rebuild the ledger from host-local's own store, with dipamd stopped. A corrupt
    /// ledger is moved aside (never deleted); a healthy one is only added to, with --force.
    /// The paths not given are learned as doctor learns them: the record dipamd leaves beside
    /// its socket, else the running dipamd's command line, else the systemd unit's, else the
    /// defaults (refused: a rebuild in the wrong place).
    Recover(WithSocket<recover::Args>),
    /// The agent's own addresses (router, health, ingress).
    Agent(agent::Args),
    /// Record in dipamd's ledger the running pods that got their addresses before dipam was
    /// put in front of the IPAM (`install --wrap`), so that nothing frees them. Only pods
    /// shown alive (a network namespace holds the address, a host route leads to it, or the
    /// runtime lists the sandbox) are recorded; nothing is freed. Try --dry-run first.
    Adopt(WithSocket<adopt::Args>),
    /// Garbage-collect one network: free what is neither valid nor protected. Agent-owned,
    /// in-flight and young attachments are always kept. Try --dry-run first.
    Gc(WithSocket<gc::Args>),
    /// Put the dipam plugin into the CNI bin directory and, with --conflist, a network config
    /// into the CNI config directory, each atomically (temporary file, fsync, rename), plugin
    /// first. A conflist that dipam would refuse is refused here. Needs no dipamd.
    ///
    /// `--wrap FILE` adopts the node's own conflist instead: only the plugin that carries the
    /// IPAM is rewritten so that its IPAM runs through dipamd; `--unwrap FILE` undoes it.
    /// --socket is written into a wrapped conflist when it is not the default.
    // Boxed: its flags make it much larger than the other commands.
    Install(Box<WithSocket<install::Args>>),
    /// Write one tar.gz with what a bug report needs: status, doctor, attachments, agent
    /// list, explain history, the metrics scrape, the log's last lines, dipamd's flags and
    /// versions, the conflists and the delegate's store (file names only). Safe on a broken
    /// node: each part has a time limit, and a part that fails is noted in MANIFEST.json.
    SupportBundle(WithSocket<support_bundle::Args>),
    /// Print dipamctl's completion script for a shell, e.g.
    /// `dipamctl completions bash > /etc/bash_completion.d/dipamctl`.
    Completions(completions::Args),
    /// Print a man page (dipamctl's, a command's, dipamd's or dipam's), or write them all
    /// into a directory with --out-dir. `install` puts them where man finds them.
    Man(WithJson<man::Args>),
}

impl Args {
    /// Whether the command prints JSON: its failure is then printed as JSON too.
    pub fn json(&self) -> bool {
        match &self.command {
            Command::Status(w) => w.format.json,
            Command::Attachments(w) => w.format.json,
            Command::Doctor(w) => w.format.json,
            Command::Explain(w) => w.format.json,
            Command::Recover(w) => w.format.json,
            Command::Agent(a) => a.format.json,
            Command::Gc(w) => w.format.json,
            Command::Adopt(w) => w.format.json,
            Command::Install(w) => w.format.json,
            Command::SupportBundle(w) => w.format.json,
            Command::Completions(_) => false,
            Command::Man(w) => w.format.json,
        }
    }
}

/// Parses dipamctl's command line (`argv[0]` first) with `version` as its `--version`.
///
/// `--socket` and `--json` belong to the commands that use them (`dipamctl status --json`),
/// but scripts written when they were global put them first (`dipamctl --socket S --json
/// status`): given before the command name, they are moved just after it, where clap takes
/// them as that command's own flags, and refuses them, as a usage error, for a command that
/// has no use for them (`dipamctl --socket S completions bash`).
pub fn parse<I, T>(version: &'static str, argv: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv = hoist(argv.into_iter().map(Into::into).collect());
    let matches = Args::command()
        .version(version)
        .try_get_matches_from(argv)?;
    Args::from_arg_matches(&matches)
}

/// `--socket PATH`, `--socket=PATH` and `--json` that come before the command name, moved
/// after it; before `--help` or `--version`, which ignore them, dropped (`dipamctl --json
/// --help` helped when they were global). Anything else (no command name after them,
/// another flag among them) is left for clap to judge.
fn hoist(argv: Vec<OsString>) -> Vec<OsString> {
    let mut moved = Vec::new();
    let mut i = 1;
    while let Some(a) = argv.get(i) {
        match a.to_str() {
            Some("--json") => {
                moved.push(a.clone());
                i += 1;
            }
            Some("--socket") if i + 1 < argv.len() => {
                moved.extend_from_slice(&argv[i..i + 2]);
                i += 2;
            }
            Some(s) if s.starts_with("--socket=") => {
                moved.push(a.clone());
                i += 1;
            }
            _ => break,
        }
    }
    let is_command = |a: &OsString| !a.to_string_lossy().starts_with('-');
    match argv.get(i) {
        Some(command) if !moved.is_empty() && is_command(command) => {
            let mut out = vec![argv[0].clone(), command.clone()];
            out.extend(moved);
            out.extend_from_slice(&argv[i + 1..]);
            out
        }
        Some(flag)
            if !moved.is_empty()
                && ["-h", "--help", "-V", "--version"].contains(&&*flag.to_string_lossy()) =>
        {
            let mut out = vec![argv[0].clone()];
            out.extend_from_slice(&argv[i..]);
            out
        }
        _ => argv,
    }
}

/// True when the command line asks for JSON (`--json` before any `--`): a usage error is
/// then printed as JSON too, although the command line could not be parsed.
pub fn json_requested(argv: &[OsString]) -> bool {
    argv.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json")
}

pub async fn run(args: Args, out: &mut dyn Write) -> Result<(), CtlError> {
    let progress = output::progress_wanted(args.json(), std::io::stderr().is_terminal(), |k| {
        std::env::var_os(k)
    });
    match args.command {
        // Local commands: install runs in an init container before any dipamd exists, and
        // recover while dipamd is stopped.
        Command::Install(w) => {
            let WithSocket { args, conn, format } = *w;
            // What from_args refuses is the command line itself (a flag that needs another,
            // no API server to ask): a usage error.
            let opts = install::Options::from_args(args, &conn.socket, |k| std::env::var(k).ok())?;
            install::run(&opts, format.json, out)?;
            // The node's own conflist is live now: its running pods' reservations are
            // recorded (or the exact step printed), so that nothing ever frees them.
            if let Some((install::Direction::Wrap, file)) = &opts.adopt
                && opts.output == install::Output::InPlace
            {
                adopt::after_wrap(&conn.socket, file, format.json, out).await?;
            }
            Ok(())
        }
        Command::Completions(a) => completions::run(a, Args::command(), out),
        Command::Man(w) => man::run(w.args, w.format.json, out),
        Command::Recover(w) => {
            recover::run(w.args, &w.conn.socket, w.format.json, progress, out).await
        }
        // The rest ask dipamd, connecting before anything else (a gc's files are read after).
        Command::Status(w) => {
            let channel = client::connect(&w.conn.socket).await?;
            status::run(w.args, channel, w.format.json, out).await
        }
        Command::Attachments(w) => {
            let channel = client::connect(&w.conn.socket).await?;
            attachments::run(w.args, channel, w.format.json, out).await
        }
        // Offline when dipamd does not answer: a broken node is when doctor is needed.
        Command::Doctor(w) => doctor::run(w.args, &w.conn.socket, w.format.json, out).await,
        Command::Explain(w) => {
            let channel = client::connect(&w.conn.socket).await?;
            explain::run(w.args, channel, w.format.json, out).await
        }
        Command::Gc(w) => {
            let channel = client::connect(&w.conn.socket).await?;
            gc::run(w.args, channel, w.format.json, progress, out).await
        }
        Command::Adopt(w) => {
            let channel = client::connect(&w.conn.socket).await?;
            adopt::run(w.args, channel, w.format.json, out).await
        }
        // Each part connects (or fails) on its own: the bundle is for a node where dipamd
        // may be down.
        Command::SupportBundle(w) => {
            support_bundle::run(w.args, &w.conn.socket, w.format.json, out).await
        }
        Command::Agent(a) => {
            let channel = client::connect(&a.conn.socket).await?;
            agent::run(a, channel, out).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use completions::Shell;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Args::command().debug_assert();
    }

    fn parsed(argv: &[&str]) -> Result<Args, clap::Error> {
        let mut full = vec!["dipamctl"];
        full.extend_from_slice(argv);
        parse("0", full)
    }

    /// The socket and JSON flag a parsed command line ended up with.
    fn flags(argv: &[&str]) -> (Option<PathBuf>, bool) {
        let args = parsed(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let json = args.json();
        let socket = match args.command {
            Command::Status(w) => Some(w.conn.socket),
            Command::Install(w) => Some(w.conn.socket),
            Command::Agent(a) => Some(a.conn.socket),
            Command::Recover(w) => Some(w.conn.socket),
            Command::Completions(_) => None,
            other => panic!("{other:?}"),
        };
        (socket, json)
    }

    #[test]
    fn socket_and_json_follow_the_command_and_may_still_precede_it() {
        let s = |p: &str| Some(PathBuf::from(p));
        assert_eq!(flags(&["status"]), (s(wrap::DEFAULT_SOCKET), false));
        assert_eq!(
            flags(&["status", "--json", "--socket", "/a"]),
            (s("/a"), true)
        );
        // The form scripts used when both flags were global.
        assert_eq!(
            flags(&["--socket", "/a", "--json", "status"]),
            (s("/a"), true)
        );
        assert_eq!(
            flags(&["--socket=/a", "status", "--ready"]),
            (s("/a"), false)
        );
        assert_eq!(
            flags(&["--json", "agent", "list"]),
            (s(wrap::DEFAULT_SOCKET), true)
        );
        assert_eq!(
            flags(&["agent", "--socket", "/a", "list"]),
            (s("/a"), false)
        );
        assert!(flags(&["agent", "watch", "--json"]).1);
        // install writes --socket into a wrapped conflist; recover reads the record of
        // dipamd's paths beside it.
        assert_eq!(flags(&["--socket", "/a", "install"]).0, s("/a"));
        assert_eq!(
            flags(&["install", "--wrap", "f", "--socket", "/a"]).0,
            s("/a")
        );
        assert_eq!(
            flags(&["--json", "--socket", "/a", "recover", "--conflist", "c"]),
            (s("/a"), true)
        );
    }

    #[test]
    fn a_flag_the_command_does_not_use_is_a_usage_error() {
        use clap::error::ErrorKind;
        for argv in [
            &["completions", "bash", "--json"][..],
            &["--json", "completions", "bash"],
            &["--socket", "/a", "completions", "bash"],
            &["completions", "--socket=/a", "bash"],
            &["status", "--jsno"],
            &["--json"],
            &["nonsense"],
        ] {
            let e = parsed(argv).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{argv:?}: {e}");
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand
                ),
                "{argv:?}: {:?}",
                e.kind()
            );
        }
        // --help and --version are not errors.
        assert_eq!(parsed(&["--help"]).unwrap_err().exit_code(), 0);
        assert_eq!(parsed(&["status", "--help"]).unwrap_err().exit_code(), 0);
    }

    #[test]
    fn hoisting_moves_only_the_leading_socket_and_json() {
        let h = |argv: &[&str]| {
            hoist(argv.iter().map(OsString::from).collect())
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            h(&["d", "--json", "--socket", "/s", "agent", "list"]),
            ["d", "agent", "--json", "--socket", "/s", "list"]
        );
        assert_eq!(
            h(&["d", "--json", "--socket=/s", "--help"]),
            ["d", "--help"]
        );
        assert_eq!(h(&["d", "--json", "-V"]), ["d", "-V"]);
        // Nothing to move, or no command after them: unchanged, for clap to judge.
        for argv in [
            &["d", "status", "--json"][..],
            &["d", "--json"],
            &["d", "--socket"],
            &["d", "--json", "--frob"],
            &["d", "-V", "--json", "status"],
        ] {
            assert_eq!(h(argv), argv, "{argv:?}");
        }
    }

    #[test]
    fn json_is_requested_by_the_flag_anywhere_before_a_double_dash() {
        let j =
            |argv: &[&str]| json_requested(&argv.iter().map(OsString::from).collect::<Vec<_>>());
        assert!(j(&["d", "status", "--frob", "--json"]));
        assert!(j(&["d", "--json", "bogus"]));
        assert!(!j(&["d", "status"]));
        assert!(!j(&["d", "explain", "--", "--json"]));
        assert!(!j(&["--json"]), "argv[0] is the program");
    }

    #[test]
    fn every_shell_gets_a_script_naming_the_commands_and_flags() {
        for shell in [
            Shell::Bash,
            Shell::Zsh,
            Shell::Fish,
            Shell::Elvish,
            Shell::PowerShell,
        ] {
            let mut out = Vec::new();
            completions::write(shell, Args::command(), &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            // Flags without dashes: fish spells them `-l socket`.
            for word in [completions::BIN, "attachments", "doctor", "socket", "json"] {
                assert!(text.contains(word), "{shell}: no {word:?} in\n{text}");
            }
        }
    }
}
