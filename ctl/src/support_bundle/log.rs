//! dipamd's log: `--log-file`, else the file its stderr goes to, else its unit's journal.

use std::path::PathBuf;

use super::part::{PartError, blocking};
use crate::offline::ReadError;

/// The last `n` lines of a file, read on its own thread.
async fn tail_file(path: PathBuf, n: usize) -> Result<Vec<u8>, PartError> {
    blocking(move || {
        let text = std::fs::read(&path).map_err(ReadError::io(&path))?;
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        Ok(lines[from..].join("\n").into_bytes())
    })
    .await
}

/// The last `n` lines of a unit's journal.
async fn journal(unit: &str, n: usize) -> Result<Vec<u8>, PartError> {
    let out = tokio::process::Command::new("journalctl")
        .args(["--no-pager", "-o", "short-iso-precise", "-u", unit, "-n"])
        .arg(n.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(PartError::NoJournalctl)?;
    if !out.status.success() {
        return Err(PartError::Journalctl {
            unit: unit.to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out.stdout)
}

/// dipamd's log, wherever it goes: `file` (--log-file); else the file dipamd's stderr is
/// redirected to (a unit's `StandardError=file:`, a shell's `2>>`), found through its
/// `/proc/PID/fd/2`; else the unit's journal. Returns the lines and which source they came
/// from; a journal without entries for the unit is a failure that says where else to look.
pub(super) async fn log(
    file: Option<PathBuf>,
    pid: Option<i32>,
    unit: String,
    n: usize,
) -> Result<(Vec<u8>, Option<String>), PartError> {
    if let Some(f) = file {
        let source = format!("--log-file {}", f.display());
        return Ok((tail_file(f, n).await?, Some(source)));
    }
    if let Some(pid) = pid {
        let fd = PathBuf::from(format!("/proc/{pid}/fd/2"));
        // A regular file only: a pipe or a socket (the journal's stream, a terminal) cannot be
        // read back, and reading a FIFO would take what dipamd's reader should get.
        if std::fs::metadata(&fd).is_ok_and(|m| m.is_file()) {
            let target = std::fs::read_link(&fd).unwrap_or_else(|_| fd.clone());
            let source = format!("dipamd's stderr (pid {pid}): {}", target.display());
            return Ok((tail_file(fd, n).await?, Some(source)));
        }
    }
    let lines = journal(&unit, n).await?;
    let text = String::from_utf8_lossy(&lines);
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.starts_with("-- "))
    {
        return Err(PartError::EmptyJournal {
            unit,
            dipamd_found: pid.is_some(),
        });
    }
    Ok((lines, Some(format!("journal of unit {unit}"))))
}
