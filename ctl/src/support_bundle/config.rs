//! The CNI configuration directory's conflists, whole, and the delegate's store by name.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::part::{Bundle, blocking};
use crate::{node_paths::NodePaths, offline};

/// host-local's store directories named by the conflists: every object with
/// `"type": "host-local"` (a plain IPAM, dipam's `delegate`, or main mode's `ipam`) keeps its
/// reservations in `<dataDir or /var/lib/cni/networks>/<network name>`.
fn host_local_dirs(lists: &[(String, Vec<u8>)]) -> Vec<PathBuf> {
    fn walk(v: &Value, network: &str, out: &mut Vec<PathBuf>) {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some("host-local") {
                    // Read as host-local reads it (delegate/keys.rs).
                    let base = dipam_shim::l2_core::delegate::keys::get(v, "dataDir")
                        .and_then(Value::as_str)
                        .unwrap_or("/var/lib/cni/networks");
                    out.push(Path::new(base).join(network));
                }
                m.values().for_each(|x| walk(x, network, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, network, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (_, bytes) in lists {
        if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
            let network = v["name"].as_str().unwrap_or_default().to_owned();
            walk(&v, &network, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The names (and sizes) of the files in each store directory: never their contents.
fn store_listing(dirs: &[PathBuf]) -> Value {
    let listed: Vec<Value> = dirs
        .iter()
        .map(|d| match std::fs::read_dir(d) {
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                json!({"dir": d, "files": names})
            }
            Err(e) => json!({"dir": d, "error": e.to_string()}),
        })
        .collect();
    Value::Array(listed)
}

/// The CNI config directory's conflists (and dipamd's own conflist, wherever it is) and the
/// names in the delegate's store.
pub(super) async fn config_parts(b: &mut Bundle, paths: &NodePaths) {
    let dir = paths.conf_dir.value.clone();
    let own = paths.conflist.as_ref().map(|c| c.value.clone());
    let lists = blocking(move || {
        let mut lists = offline::conflists(&dir)?;
        // dipamd's --conflist outside the directory is the one that mattered (issue 43: the
        // bundle held /etc/cni/net.d, not dipamd's /etc/node-a/net.d/10-dipam.conflist).
        if let Some(own) = own.filter(|o| o.parent() != Some(dir.as_path())) {
            let bytes = std::fs::read(&own).map_err(offline::ReadError::io(&own))?;
            lists.push((own.display().to_string(), bytes));
        }
        Ok(lists)
    })
    .await;
    let dirs = host_local_dirs(lists.as_deref().unwrap_or_default());
    let (conf_dir, source) = (&paths.conf_dir.value, &paths.conf_dir.source);
    b.part("conflists", "conflists.json", async {
        let lists = lists?;
        let v: serde_json::Map<String, Value> = lists
            .iter()
            .map(|(n, bytes)| {
                let parsed = serde_json::from_slice(bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into()));
                (n.clone(), parsed)
            })
            .collect();
        Ok(serde_json::to_vec_pretty(
            &json!({"dir": conf_dir, "dirSource": source, "files": v}),
        )?)
    })
    .await;
    b.part(
        "delegate store (names only)",
        "delegate-store.json",
        async { blocking(move || Ok(serde_json::to_vec_pretty(&store_listing(&dirs))?)).await },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_local_stores_are_found_wherever_the_conflist_puts_host_local() {
        let lists = vec![
            (
                "10-wrapped.conflist".to_owned(),
                br#"{"name":"podnet","plugins":[{"type":"ptp","ipam":{"type":"dipam",
                    "delegate":{"type":"host-local","dataDir":"/data"}}}]}"#
                    .to_vec(),
            ),
            (
                "20-main.conflist".to_owned(),
                br#"{"name":"main","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#
                    .to_vec(),
            ),
            ("30-broken.conf".to_owned(), b"{not json".to_vec()),
        ];
        assert_eq!(
            host_local_dirs(&lists),
            vec![
                PathBuf::from("/data/podnet"),
                PathBuf::from("/var/lib/cni/networks/main")
            ]
        );
    }
}
