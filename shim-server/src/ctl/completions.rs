//! `dipamctl completions <shell>`: the shell's completion script for dipamctl, generated from
//! the same clap definition that parses the command line, so it can never fall behind a new
//! subcommand or flag.

use std::io::Write;

use clap::CommandFactory;
pub use clap_complete::Shell;

/// The name the script completes: the installed binary's.
const BIN: &str = "dipamctl";

/// Writes the completion script for `shell`, e.g. for
/// `dipamctl completions bash > /etc/bash_completion.d/dipamctl`.
pub fn write(shell: Shell, out: &mut dyn Write) -> std::io::Result<()> {
    let mut cmd = crate::ctl::Args::command();
    // Generated into memory first: clap_complete panics on a failed write (`| head`), and a
    // write error is the caller's to report.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN, &mut script);
    out.write_all(&script)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            write(shell, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            // Flags without dashes: fish spells them `-l socket`.
            for word in [BIN, "attachments", "doctor", "socket", "json"] {
                assert!(text.contains(word), "{shell}: no {word:?} in\n{text}");
            }
        }
    }
}
