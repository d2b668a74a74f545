//! The parts dipamd answers (status, doctor, attachments, the agent's list, explain), each as
//! `dipamctl … --json` prints it, and the offline doctor when it does not answer.

use std::{io::Write, path::Path};

use serde_json::{Value, json};

use super::{
    EXPLAINED,
    part::{Bundle, PartError, blocking},
};
use crate::{node_paths::NodePaths, offline};

/// Runs `dipamctl --socket S --json <argv>` in-process and returns what it printed. A command
/// that printed something and then failed (doctor with a failing check) still gives its
/// output; the failure is noted after it.
async fn dipamctl(socket: &Path, argv: &[&str]) -> Result<Vec<u8>, PartError> {
    let mut full: Vec<String> = vec!["dipamctl".into(), "--socket".into()];
    full.push(socket.display().to_string());
    full.push("--json".into());
    full.extend(argv.iter().map(|s| (*s).to_owned()));
    let args = crate::parse(env!("CARGO_PKG_VERSION"), &full)?;
    let mut buf = Vec::new();
    // Boxed: `run` dispatches here, and an async call cycle needs one indirection.
    let result = Box::pin(crate::run(args, &mut buf)).await;
    match result {
        Ok(()) => Ok(buf),
        Err(e) if !buf.is_empty() => {
            let _ = writeln!(buf, "// dipamctl: {e}");
            Ok(buf)
        }
        Err(e) => Err(PartError::Command(Box::new(e))),
    }
}

/// What dipamd answers: its status, doctor, attachments and the agent's list. `down`: why
/// dipamd is not asked (each part fails with it).
pub(super) async fn daemon_parts(b: &mut Bundle, socket: &Path, down: Option<&str>) {
    for (part, argv) in [
        ("status", &["status"][..]),
        ("doctor", &["doctor"][..]),
        ("attachments", &["attachments"][..]),
        ("agent list", &["agent", "list"][..]),
    ] {
        let file = format!("{}.json", argv.join("-"));
        match down {
            Some(why) => {
                let why = PartError::DipamdDown(why.to_owned());
                b.part(part, &file, async { Err(why) }).await
            }
            None => b.part(part, &file, dipamctl(socket, argv)).await,
        }
    }
}

/// With dipamd not answering: the offline doctor's report (offline.rs), from the node's
/// files at `paths`.
pub(super) async fn offline_part(
    b: &mut Bundle,
    socket: &Path,
    paths: NodePaths,
    down: Option<String>,
) {
    let Some(reason) = down else {
        return;
    };
    let s = socket.to_owned();
    b.part("offline doctor", "offline-doctor.json", async {
        blocking(move || {
            let report = offline::inspect(reason, paths, &s, &std::env::temp_dir());
            Ok(serde_json::to_vec_pretty(&report.to_json())?)
        })
        .await
    })
    .await;
}

/// `explain` of the most recent containers and of the ones asked for (`extra`). Failed, not
/// an empty `{}`, when dipamd is `down`, when there is nothing to explain, and when every
/// explain failed.
pub(super) async fn explain_part(
    b: &mut Bundle,
    socket: &Path,
    extra: &[String],
    down: Option<&str>,
) {
    if let Some(why) = down {
        let why = PartError::DipamdDown(why.to_owned());
        return b.part("explain", "explain.json", async { Err(why) }).await;
    }
    let mut ids = b
        .files
        .iter()
        .find(|(n, _)| n == "attachments.json")
        .map(|(_, a)| recent_containers(a))
        .unwrap_or_default();
    ids.extend(extra.iter().cloned());
    ids.dedup();
    b.part("explain", "explain.json", async {
        if ids.is_empty() {
            return Err(PartError::NothingToExplain);
        }
        let mut all = serde_json::Map::new();
        let mut last_error = None;
        for id in &ids {
            let one = dipamctl(socket, &["explain", id]).await;
            let v = match one {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
                Err(e) => {
                    let v = json!({"error": e.to_string()});
                    last_error = Some(e);
                    v
                }
            };
            all.insert(id.clone(), v);
        }
        if let Some(e) = last_error.filter(|_| all.values().all(|v| v.get("error").is_some())) {
            return Err(PartError::EveryExplainFailed(Box::new(e)));
        }
        Ok(serde_json::to_vec_pretty(&Value::Object(all))?)
    })
    .await;
}

/// The ledger's containers, most recently updated first, without repeats.
fn recent_containers(attachments: &[u8]) -> Vec<String> {
    let mut v: Vec<Value> = serde_json::from_slice::<Value>(attachments)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    v.sort_by_key(|a| std::cmp::Reverse(a["updatedAtMs"].as_u64().unwrap_or_default()));
    let mut ids: Vec<String> = Vec::new();
    for a in v {
        if let Some(id) = a["containerID"].as_str()
            && !ids.iter().any(|x| x == id)
        {
            ids.push(id.to_owned());
        }
    }
    ids.truncate(EXPLAINED);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explained_containers_are_the_most_recent_without_repeats() {
        let mut v: Vec<Value> = (0..60)
            .map(|i| json!({"containerID": format!("c{i}"), "updatedAtMs": i}))
            .collect();
        v.push(json!({"containerID": "c59", "updatedAtMs": 1}));
        let ids = recent_containers(&serde_json::to_vec(&v).unwrap());
        assert_eq!(ids.len(), EXPLAINED);
        assert_eq!(ids[0], "c59");
        assert_eq!(ids.iter().filter(|i| *i == "c59").count(), 1);
        assert!(recent_containers(b"not json").is_empty());
    }
}
