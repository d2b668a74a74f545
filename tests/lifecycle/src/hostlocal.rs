//! Reading the delegates' own stores, to compare them with dipamd's ledger.
//!
//! host-local keeps one file per reserved IP in `<dataDir>/<network>/`, named by the IP and
//! holding `<containerID>\r\n<ifname>` (legacy files hold only the ID); `lock` and
//! `last_reserved_ip.*` are bookkeeping (docs/sources.md §7.2).

use std::path::Path;

/// (container ID, ifname, IP) for every reservation in host-local's network directory,
/// sorted.
pub fn reservations(data_dir: &Path, network: &str) -> Vec<(String, String, String)> {
    let dir = data_dir.join(network);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // Reservations are named by their address; everything else (lock,
            // last_reserved_ip.*, a stand-in's gc.log) is bookkeeping.
            if name.parse::<std::net::IpAddr>().is_err() {
                return None;
            }
            let content = std::fs::read_to_string(e.path()).ok()?;
            let mut parts = content.split("\r\n");
            let id = parts.next().unwrap_or_default().trim().to_owned();
            let ifname = parts.next().unwrap_or_default().trim().to_owned();
            Some((id, ifname, name))
        })
        .collect();
    out.sort();
    out
}

/// The azure stand-in's allocations: (container ID, IP), sorted.
pub fn azure_allocations(state_file: &Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(state_file) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut out: Vec<_> = v["allocations"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, ip)| (k.clone(), ip.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// (container ID, IP) pairs in the store of `delegate` whose state lives under `data_dir`
/// (host-local's and gc-ipam's per-network directory, or the azure stand-in's state file),
/// sorted: what every bench compares with the ledger.
pub fn store_pairs(delegate: &str, data_dir: &Path, network: &str) -> Vec<(String, String)> {
    let mut v: Vec<_> = if delegate == "azure-vnet-ipam" {
        azure_allocations(&data_dir.join("azure-vnet-ipam.json"))
    } else {
        reservations(data_dir, network)
            .into_iter()
            .map(|(id, _, ip)| (id, ip))
            .collect()
    };
    v.sort();
    v
}
