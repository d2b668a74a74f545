//! Reading a delegate's own store, for GC emulation and the ledger/store reconcile. Read only:
//! dipamd never edits a delegate's files; it frees a reservation by running the delegate's DEL.
//!
//! host-local keeps one file per reserved IP in `<dataDir or /var/lib/cni/networks>/<network>/`,
//! named by the IP and holding `<containerID>\r\n<ifname>`; legacy files hold only the ID;
//! `lock` and `last_reserved_ip.<n>` are bookkeeping (docs/sources.md §7.2).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde_json::Value;

/// One reservation in a delegate's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub ip: IpAddr,
    pub container_id: String,
    /// Empty for host-local's legacy id-only files.
    pub ifname: String,
    pub modified: Option<SystemTime>,
}

/// host-local's directory for `network` under the delegate config `conf` (the config sent to
/// the delegate: `ipam` is host-local's own object).
pub fn host_local_dir(conf: &Value, network: &str) -> PathBuf {
    let base = conf["ipam"]["dataDir"]
        .as_str()
        .filter(|d| !d.is_empty())
        .unwrap_or("/var/lib/cni/networks");
    Path::new(base).join(network)
}

/// The store dipamd can read for this delegate, if it knows the delegate's format.
pub fn readable_dir(kind: &str, conf: &Value, network: &str) -> Option<PathBuf> {
    (kind == "host-local").then(|| host_local_dir(conf, network))
}

/// Every reservation in a host-local network directory. A missing directory is an empty
/// store (host-local creates it on first ADD).
pub fn reservations(dir: &Path) -> std::io::Result<Vec<Reservation>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Bookkeeping files, and anything not named by an address (host-local writes
        // IPv6 names with ':' on Linux).
        let Ok(ip) = name.parse::<IpAddr>() else {
            continue;
        };
        let Ok(content) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut parts = content.split("\r\n");
        let container_id = parts.next().unwrap_or_default().trim().to_owned();
        let ifname = parts.next().unwrap_or_default().trim().to_owned();
        if container_id.is_empty() {
            continue;
        }
        out.push(Reservation {
            ip,
            container_id,
            ifname,
            modified: entry.metadata().and_then(|m| m.modified()).ok(),
        });
    }
    out.sort_by_key(|r| r.ip);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_host_local_files_and_skips_bookkeeping() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("10.0.0.2"), "abc\r\neth0").unwrap();
        std::fs::write(d.path().join("10.0.0.3"), "legacy-id").unwrap();
        std::fs::write(d.path().join("fd00::2"), "v6\r\neth1").unwrap();
        std::fs::write(d.path().join("lock"), "").unwrap();
        std::fs::write(d.path().join("last_reserved_ip.0"), "10.0.0.3").unwrap();
        let r = reservations(d.path()).unwrap();
        let view: Vec<_> = r
            .iter()
            .map(|r| (r.ip.to_string(), r.container_id.as_str(), r.ifname.as_str()))
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.2".into(), "abc", "eth0"),
                ("10.0.0.3".into(), "legacy-id", ""),
                ("fd00::2".into(), "v6", "eth1")
            ]
        );
        assert!(reservations(&d.path().join("missing")).unwrap().is_empty());
    }

    #[test]
    fn data_dir_default_and_override() {
        assert_eq!(
            host_local_dir(&json!({"ipam":{"type":"host-local"}}), "n"),
            PathBuf::from("/var/lib/cni/networks/n")
        );
        assert_eq!(
            host_local_dir(&json!({"ipam":{"dataDir":"/x"}}), "n"),
            PathBuf::from("/x/n")
        );
        assert!(readable_dir("azure-vnet-ipam", &json!({}), "n").is_none());
    }
}
