//! A part of the bundle: taken under its time limit, kept or noted as failed with the reason.

use std::{
    path::PathBuf,
    process::ExitStatus,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{error::CtlError, offline::ReadError};

/// Why a part of the bundle was not taken: its MANIFEST.json entry's `error`.
#[derive(Debug, thiserror::Error)]
pub(super) enum PartError {
    #[error("timed out after {0} s")]
    TimedOut(u64),
    #[error("the worker thread panicked")]
    WorkerPanicked,
    /// dipamd is not asked: `--offline` was given, or it did not answer (the reason).
    #[error("{0}")]
    DipamdDown(String),
    #[error(transparent)]
    Usage(#[from] clap::Error),
    #[error(transparent)]
    Command(Box<CtlError>),
    #[error("nothing to explain: no attachment in the ledger and no --explain ID")]
    NothingToExplain,
    #[error("every explain failed; the last: {0}")]
    EveryExplainFailed(Box<PartError>),
    #[error(
        "connect to {}: {source}; and no process holds the ledger in {}",
        socket.display(),
        state_dir.display()
    )]
    NoDipamd {
        socket: PathBuf,
        state_dir: PathBuf,
        source: std::io::Error,
    },
    #[error("SO_PEERCRED on {}: {source}", socket.display())]
    PeerCred { socket: PathBuf, source: nix::Error },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{target}: only http:// and unix: metrics targets are supported")]
    MetricsTarget { target: String },
    #[error("{to}: {source}")]
    Exchange { to: String, source: std::io::Error },
    #[error("{0}: no HTTP header in the answer")]
    NoHttpHeader(String),
    #[error("{target}: {status}")]
    HttpStatus { target: String, status: String },
    #[error(
        "dipamd's command line, which says where it serves metrics, is unknown ({0}); give \
         --metrics-url"
    )]
    NoCommandLine(String),
    #[error(
        "dipamd has neither --metrics-socket nor --metrics-address, and no --metrics-url was given"
    )]
    NoMetricsFlag,
    #[error("journalctl: {0} (give --log-file instead)")]
    NoJournalctl(std::io::Error),
    #[error("journalctl -u {unit}: {status} {stderr}")]
    Journalctl {
        unit: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error(
        "the journal has no entries for unit {unit}{}: dipamd logs elsewhere; give --log-file \
         (or --journal-unit)",
        if *dipamd_found {
            ", and dipamd's stderr is not a file"
        } else {
            ", and no running dipamd was found to read its stderr"
        }
    )]
    EmptyJournal { unit: String, dipamd_found: bool },
    #[error("cannot write the part as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// One part's outcome, as MANIFEST.json lists it.
pub(super) struct Entry {
    pub(super) part: String,
    pub(super) file: Option<String>,
    pub(super) error: Option<String>,
    /// Where the part came from, when it has more than one possible source (the log).
    source: Option<String>,
    took: Duration,
}

/// The bundle being made: its files in memory until the end (each is bounded: log lines,
/// explained containers), the manifest, and the progress display.
pub(super) struct Bundle {
    pub(super) files: Vec<(String, Vec<u8>)>,
    pub(super) entries: Vec<Entry>,
    pub(super) limit: Duration,
    pub(super) progress: bool,
    pub(super) total: usize,
}

impl Bundle {
    /// Runs one part under the time limit and keeps what it made, or why it made nothing.
    pub(super) async fn part<F>(&mut self, part: &str, file: &str, work: F)
    where
        F: std::future::Future<Output = Result<Vec<u8>, PartError>>,
    {
        self.part_from(part, file, async { work.await.map(|b| (b, None)) })
            .await;
    }

    /// [`Self::part`] for a part that also says which source it was taken from.
    pub(super) async fn part_from<F>(&mut self, part: &str, file: &str, work: F)
    where
        F: std::future::Future<Output = Result<(Vec<u8>, Option<String>), PartError>>,
    {
        let n = self.entries.len() + 1;
        if self.progress {
            eprint!("[{n}/{}] {part} … ", self.total);
        }
        let started = Instant::now();
        let outcome = match tokio::time::timeout(self.limit, work).await {
            Ok(r) => r,
            Err(_) => Err(PartError::TimedOut(self.limit.as_secs())),
        };
        let took = started.elapsed();
        if self.progress {
            match &outcome {
                Ok(_) => eprintln!("ok ({} ms)", took.as_millis()),
                Err(e) => eprintln!("FAILED: {e}"),
            }
        }
        let (file, error, source) = match outcome {
            Ok((bytes, source)) => {
                self.files.push((file.to_owned(), bytes));
                (Some(file.to_owned()), None, source)
            }
            Err(e) => (None, Some(e.to_string()), None),
        };
        self.entries.push(Entry {
            part: part.to_owned(),
            file,
            error,
            source,
            took,
        });
    }

    /// The manifest; `made_ms`: when the bundle was begun, Unix ms.
    pub(super) fn manifest(&self, made_ms: u64) -> Value {
        let (made, made_ms) = dipam_shim::l1_leaves::clock::json_time(made_ms);
        json!({
            "madeAt": made,
            "madeAtMs": made_ms,
            "dipamctlVersion": env!("CARGO_PKG_VERSION"),
            "parts": self.entries.iter().map(|e| json!({
                "part": e.part,
                "file": e.file,
                "ok": e.error.is_none(),
                "error": e.error,
                "source": e.source,
                "durationMs": e.took.as_millis() as u64,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Blocking work on a thread of its own, waited for under the part's limit. A detached
/// thread, not `spawn_blocking`: a read stuck on a FIFO or a hung filesystem must not keep
/// dipamctl from exiting once the bundle is written.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PartError> + Send + 'static,
) -> Result<T, PartError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.await.map_err(|_| PartError::WorkerPanicked)?
}
