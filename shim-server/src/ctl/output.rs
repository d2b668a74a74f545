//! What every dipamctl command shares in how it answers: its error (one line on stderr,
//! prefixed `dipamctl:`, exit status 1), its tables for people and its `--json` documents for
//! scripts.

use std::{io::Write, path::PathBuf, process::ExitCode};

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot reach dipamd at {}: {reason} (is dipamd running? is --socket right?)", socket.display())]
    Unreachable { socket: PathBuf, reason: String },
    #[error("dipamd: {}", .0.message())]
    Rpc(tonic::Status),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// The process's answer: status 0, or the error on stderr and status 1 (clap itself exits 2
/// for a command line it cannot parse). Output cut off because its reader went away
/// (`dipamctl attachments --json | head -1`) ends quietly with status 0, as a Unix filter
/// does: the reader has what it wanted, and "Broken pipe" on stderr would only be noise.
pub fn exit(result: Result<(), CtlError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CtlError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dipamctl: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One JSON document, indented: what a command prints with `--json`.
pub fn json(out: &mut dyn Write, v: &serde_json::Value) -> std::io::Result<()> {
    writeln!(out, "{v:#}")
}

/// One JSON document on one line: a stream's messages (`agent watch --json`), one per line.
pub fn json_line(out: &mut dyn Write, v: &serde_json::Value) -> std::io::Result<()> {
    writeln!(out, "{v}")
}

/// Container IDs are 64 hex characters from containerd; 16 identify one on a node. Other IDs
/// (dipam's agent slots, podman names) are shown whole.
pub fn short(id: &str) -> String {
    if id.len() > 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        format!("{}…", &id[..16])
    } else {
        id.to_owned()
    }
}

/// A table for people: a header line and one line per row, each column as wide as its widest
/// cell, two spaces apart, no trailing blanks.
pub fn table<const N: usize>(
    out: &mut dyn Write,
    head: [&str; N],
    rows: &[[String; N]],
) -> std::io::Result<()> {
    let mut width = head.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    writeln!(out, "{}", line(head.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}
