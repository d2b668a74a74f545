//! `dipamctl completions <shell>`: the shell's completion script for dipamctl, generated from
//! the same clap definition that parses the command line, so it can never fall behind a new
//! subcommand or flag.

use std::io::Write;

pub use clap_complete::Shell;

use super::error::CtlError;

/// The name the script completes: the installed binary's.
pub(super) const BIN: &str = "dipamctl";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    shell: Shell,
}

/// Prints the script for the command line `cli` defines (the caller's `Args::command()`).
pub fn run(args: Args, cli: clap::Command, out: &mut dyn Write) -> Result<(), CtlError> {
    write(args.shell, cli, out)?;
    Ok(())
}

/// Writes the completion script for `shell`, e.g. for
/// `dipamctl completions bash > /etc/bash_completion.d/dipamctl`.
pub fn write(shell: Shell, mut cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    // Generated into memory first: clap_complete panics on a failed write (`| head`), and a
    // write error is the caller's to report.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN, &mut script);
    out.write_all(&script)
}
