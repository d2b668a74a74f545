//! Where the agent's delegate config comes from: the network's conflist, which another
//! DaemonSet may install after dipamd has started (so "not there yet" is a state, not an
//! error).

use std::path::{Path, PathBuf};

use dipam_proto::v1::Mode;
use serde_json::Value;

/// `--conflist PATH`, or `--conf-dir DIR` with `--network NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    Dir { dir: PathBuf, network: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Dir { dir, network } => {
                write!(f, "network {network:?} in {}", dir.display())
            }
        }
    }
}

/// The request config a runtime would send the dipam plugin for this network (libcni: the
/// plugin object plus the list's name and cniVersion), and how dipam sits in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Base {
    pub request: Value,
    pub mode: Mode,
    pub network: String,
    /// The file it came from, and its modification time, to notice a changed conflist.
    pub path: PathBuf,
    pub mtime: Option<std::time::SystemTime>,
}

/// Why the base config is not available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Not there yet: wait and watch.
    Absent(String),
    /// There, but unusable: say what is wrong, keep watching for a fix.
    Invalid(String),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Absent(s) | Self::Invalid(s) => f.write_str(s),
        }
    }
}

impl Source {
    /// Loads the base config now.
    pub fn load(&self) -> Result<Base, Missing> {
        match self {
            Self::File(path) => {
                let text = std::fs::read(path).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Missing::Absent(format!("waiting for conflist {}", path.display()))
                    } else {
                        Missing::Invalid(format!("conflist {}: {e}", path.display()))
                    }
                })?;
                parse(path, &text, None)
            }
            Self::Dir { dir, network } => {
                let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                    .map_err(|_| {
                        Missing::Absent(format!(
                            "waiting for conflist of network {network:?} in {}",
                            dir.display()
                        ))
                    })?
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        matches!(
                            p.extension().and_then(|e| e.to_str()),
                            Some("conflist" | "conf" | "json")
                        )
                    })
                    .collect();
                // libcni's order: lexical by file name.
                files.sort();
                for path in files {
                    let Ok(text) = std::fs::read(&path) else {
                        continue;
                    };
                    if let Ok(base) = parse(&path, &text, Some(network)) {
                        return Ok(base);
                    }
                }
                Err(Missing::Absent(format!(
                    "waiting for conflist of network {network:?} in {}",
                    dir.display()
                )))
            }
        }
    }
}

/// Why a conflist is not usable when dipam is in none of its plugins; doctor recognises it to
/// say how to adopt the file (`install --wrap`) rather than to install one.
pub const NO_DIPAM: &str = "no plugin uses dipam (as \"type\" or \"ipam.type\")";

/// Finds the plugin that uses dipam in a conflist (or a single-plugin .conf) and builds the
/// request config for it. `want` filters by network name.
pub fn parse(path: &Path, text: &[u8], want: Option<&str>) -> Result<Base, Missing> {
    let invalid = |why: String| Missing::Invalid(format!("conflist {}: {why}", path.display()));
    let list: Value =
        serde_json::from_slice(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let name = list["name"].as_str().unwrap_or_default().to_owned();
    if let Some(w) = want
        && w != name
    {
        return Err(invalid(format!("network is {name:?}, not {w:?}")));
    }
    let plugins: Vec<Value> = match list.get("plugins").and_then(Value::as_array) {
        Some(p) => p.clone(),
        // A .conf file is one plugin object.
        None => vec![list.clone()],
    };
    let (plugin, mode) = plugins
        .iter()
        .find_map(|p| {
            if p["ipam"]["type"] == "dipam" {
                Some((p.clone(), Mode::Ipam))
            } else if p["type"] == "dipam" {
                Some((p.clone(), Mode::Main))
            } else {
                None
            }
        })
        .ok_or_else(|| invalid(NO_DIPAM.into()))?;
    let mut request = plugin;
    request["name"] = Value::String(name.clone());
    request["cniVersion"] = list["cniVersion"].clone();
    Ok(Base {
        request,
        mode,
        network: name,
        path: path.to_owned(),
        mtime: std::fs::metadata(path).and_then(|m| m.modified()).ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_dipam_in_either_mode() {
        let ipam = br#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}},{"type":"portmap"}]}"#;
        let b = parse(Path::new("/x"), ipam, None).unwrap();
        assert_eq!(b.mode, Mode::Ipam);
        assert_eq!(b.request["name"], "net");
        assert_eq!(b.request["cniVersion"], "1.0.0");
        assert_eq!(b.request["ipam"]["delegate"]["type"], "host-local");
        let main = br#"{"cniVersion":"0.4.0","name":"m","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#;
        assert_eq!(parse(Path::new("/x"), main, None).unwrap().mode, Mode::Main);
        let conf =
            br#"{"cniVersion":"0.4.0","name":"c","type":"dipam","ipam":{"type":"host-local"}}"#;
        assert_eq!(
            parse(Path::new("/x"), conf, Some("c")).unwrap().network,
            "c"
        );
    }

    #[test]
    fn absent_and_invalid_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let f = Source::File(dir.path().join("10-net.conflist"));
        assert!(
            matches!(f.load(), Err(Missing::Absent(m)) if m.starts_with("waiting for conflist"))
        );
        std::fs::write(dir.path().join("10-net.conflist"), b"{half a file").unwrap();
        assert!(matches!(f.load(), Err(Missing::Invalid(_))));
        let d = Source::Dir {
            dir: dir.path().to_owned(),
            network: "net".into(),
        };
        assert!(matches!(d.load(), Err(Missing::Absent(_))));
        std::fs::write(
            dir.path().join("20-net.conflist"),
            br#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
        )
        .unwrap();
        assert_eq!(d.load().unwrap().network, "net");
    }
}
