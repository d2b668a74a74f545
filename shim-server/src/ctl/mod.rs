//! dipamctl: the operator's view of dipamd. Every command prints a table for people or, with
//! --json, one JSON document for scripts.
//!
//! One file per command, each with its own flags (`Args`) and its `run`; this module only
//! parses the command line and dispatches. What they share: `client` (reaching dipamd) and
//! `output` (errors, tables, JSON).

use std::{io::Write, path::PathBuf};

use clap::{CommandFactory, Parser, Subcommand};

pub mod agent;
pub mod attachments;
pub mod client;
pub mod completions;
pub mod doctor;
pub mod explain;
pub mod gc;
pub mod install;
pub mod kube;
pub mod output;
pub mod ranges;
pub mod recover;
pub mod runtime_gc;
pub mod status;
pub mod support_bundle;
pub mod wrap;

pub use output::CtlError;

/// dipamctl: inspect the dipam shim daemon (dipamd).
#[derive(Debug, Parser)]
#[command(name = "dipamctl", version, about, long_about)]
pub struct Args {
    /// dipamd's unix socket.
    #[arg(
        long,
        global = true,
        env = "DIPAM_SOCKET",
        default_value = "/run/dipam/dipam.sock"
    )]
    pub socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Is dipamd ready? Versions, uptime, state directory, attachment count, delegates seen.
    Status(status::Args),
    /// Every attachment in the ledger: network, container, interface, owner, state, addresses.
    Attachments(attachments::Args),
    /// Every check of dipamd's configuration and state, with what to fix; exits non-zero when
    /// one fails.
    Doctor(doctor::Args),
    /// A container's attachments and the full history of what dipamd did for it: every
    /// request with its outcome, every delegate exec with argv, environment, exit status,
    /// stderr excerpt and duration.
    Explain(explain::Args),
    /// Offline: rebuild the ledger from host-local's own store, with dipamd stopped. A corrupt
    /// ledger is moved aside (never deleted); a healthy one is only added to, with --force.
    Recover(recover::Args),
    /// The agent's own addresses (router, health, ingress).
    #[command(subcommand)]
    Agent(agent::Command),
    /// Garbage-collect one network: free what is neither valid nor protected. Agent-owned,
    /// in-flight and young attachments are always kept. Try --dry-run first.
    Gc(gc::Args),
    /// Put the dipam plugin into the CNI bin directory and, with --conflist, a network config
    /// into the CNI config directory, each atomically (temporary file, fsync, rename), plugin
    /// first. A conflist that dipam would refuse is refused here. Needs no dipamd.
    ///
    /// `--wrap FILE` adopts the node's own conflist instead: only the plugin that carries the
    /// IPAM is rewritten so that its IPAM runs through dipamd; `--unwrap FILE` undoes it.
    // Boxed: its flags make it much larger than the other commands.
    Install(Box<install::Args>),
    /// Write one tar.gz with what a bug report needs: status, doctor, attachments, agent
    /// list, explain history, the metrics scrape, the log's last lines, dipamd's flags and
    /// versions, the conflists and the delegate's store (file names only). Safe on a broken
    /// node: each part has a time limit, and a part that fails is noted in MANIFEST.json.
    SupportBundle(support_bundle::Args),
    /// Print dipamctl's completion script for a shell, e.g.
    /// `dipamctl completions bash > /etc/bash_completion.d/dipamctl`.
    Completions(completions::Args),
}

pub async fn run(args: Args, out: &mut dyn Write) -> Result<(), CtlError> {
    let json = args.json;
    let socket = &args.socket;
    match args.command {
        // Local commands: install runs in an init container before any dipamd exists, and
        // recover while dipamd is stopped.
        Command::Install(a) => install::Options::from_args(*a, socket, |k| std::env::var(k).ok())
            .and_then(|opts| install::run(&opts, json, out))
            .map_err(CtlError::Failed),
        Command::Completions(a) => completions::run(a, Args::command(), out),
        Command::Recover(a) => recover::run(a, json, out).await,
        // The rest ask dipamd, connecting before anything else (a gc's files are read after).
        Command::Status(a) => status::run(a, client::connect(socket).await?, json, out).await,
        Command::Attachments(a) => {
            attachments::run(a, client::connect(socket).await?, json, out).await
        }
        Command::Doctor(a) => doctor::run(a, client::connect(socket).await?, json, out).await,
        Command::Explain(a) => explain::run(a, client::connect(socket).await?, json, out).await,
        Command::Gc(a) => gc::run(a, client::connect(socket).await?, json, out).await,
        // Each part connects (or fails) on its own: the bundle is for a node where dipamd
        // may be down.
        Command::SupportBundle(a) => support_bundle::run(a, socket, json, out).await,
        Command::Agent(a) => agent::run(a, socket, client::connect(socket).await?, json, out).await,
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
