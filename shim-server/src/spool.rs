//! Draining the DEL spool that the plugin writes when dipamd cannot be reached
//! (plugin/src/spool.rs). At start the spool is drained before anything is served; while
//! running, every few seconds (a plugin may have hit a restart window).
//!
//! A drained DEL carries the time its plugin started, so del::run ignores it if the key has
//! since been added again: a late replay never releases a newer attachment. A file that can
//! never succeed (not a DEL, not parseable, a config dipamd rejects) is moved to `failed/`
//! and logged, so it neither blocks the spool nor disappears silently.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use dipam_proto::v1::CniRequest;
use dipam_state::Store;
use serde::Deserialize;
use tracing::{info, warn};

use crate::{error::ShimError, rpc, shim::Shim};

/// The plugin's spool file (format 1).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spooled {
    format: u32,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    issued_at_ms: u64,
    command: String,
    container_id: String,
    #[serde(default)]
    netns: String,
    ifname: String,
    #[serde(default)]
    cni_args: String,
    #[serde(default)]
    cni_path: String,
    #[serde(default)]
    mode: i32,
    stdin: String,
}

/// What a drain did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    pub released: usize,
    pub kept: usize,
    pub failed: usize,
}

/// Spool files waiting, oldest first.
pub fn pending(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    files
}

fn remove_durably(dir: &Path, file: &Path) {
    if std::fs::remove_file(file).is_ok()
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
}

fn quarantine(dir: &Path, file: &Path, why: &str) {
    let failed = dir.join("failed");
    let _ = std::fs::create_dir_all(&failed);
    if let Some(name) = file.file_name() {
        let _ = std::fs::rename(file, failed.join(name));
    }
    warn!(file = %file.display(), why, "spooled DEL can never succeed; moved to failed/");
}

/// Replays every spooled DEL in `dir`.
pub async fn drain<S: Store>(shim: &Shim<S>, dir: &Path) -> Drained {
    let mut out = Drained::default();
    for file in pending(dir) {
        let parsed = std::fs::read(&file)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Spooled>(&b).map_err(|e| e.to_string()));
        let s = match parsed {
            Ok(s) if s.format == 1 && s.command == "DEL" => s,
            Ok(s) => {
                quarantine(
                    dir,
                    &file,
                    &format!("format {} command {:?}", s.format, s.command),
                );
                out.failed += 1;
                continue;
            }
            Err(e) => {
                quarantine(dir, &file, &e);
                out.failed += 1;
                continue;
            }
        };
        let req = CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: s.request_id,
            command: s.command,
            container_id: s.container_id,
            netns: s.netns,
            ifname: s.ifname,
            cni_args: s.cni_args,
            cni_path: s.cni_path,
            stdin: s.stdin.into_bytes(),
            mode: s.mode,
            issued_at_ms: s.issued_at_ms,
            retired_link: None,
        };
        let what = format!("{}/{}", req.container_id, req.ifname);
        // Every ADD through dipamd is recorded before its delegate runs, and start-up replay
        // has already released interrupted ones: a spooled DEL for a key the ledger does not
        // hold has nothing dipamd allocated to release. Skipping the delegate exec keeps the
        // drain (which runs before serving) fast even after a runtime retried ADDs in a tight
        // loop while dipamd was down.
        if let Ok(p) = shim.prepare(req.clone(), true)
            && let Ok(None) = shim.lookup(&p.key)
        {
            remove_durably(dir, &file);
            tracing::debug!(attachment = %what, "spooled DEL for an attachment dipamd does not hold");
            out.released += 1;
            continue;
        }
        match rpc::del::run(shim, req).await {
            Ok(_) => {
                remove_durably(dir, &file);
                info!(attachment = %what, file = %file.display(), "spooled DEL replayed");
                out.released += 1;
            }
            Err(
                e @ (ShimError::Decode(_)
                | ShimError::Config { .. }
                | ShimError::BadEnv(_)
                | ShimError::Reserved { .. }
                | ShimError::Version(_)),
            ) => {
                quarantine(dir, &file, &e.to_string());
                out.failed += 1;
            }
            Err(e) => {
                warn!(attachment = %what, error = %e, "spooled DEL failed; kept for the next drain");
                out.kept += 1;
            }
        }
    }
    out
}

/// Drains every `every` until the process ends.
pub async fn run<S: Store>(
    shim: std::sync::Arc<Shim<S>>,
    dir: PathBuf,
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if !pending(&dir).is_empty() {
            drain(&shim, &dir).await;
        }
    }
}
