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
            // last_reserved_ip.*) is bookkeeping.
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

/// (container ID, IP) pairs in the host-local-format store under `data_dir`
/// for `network`, sorted: what every bench compares with the ledger (the real
/// azure-vnet-ipam's store is read by [`crate::azure::AzureNode::held`]).
pub fn store_pairs(data_dir: &Path, network: &str) -> Vec<(String, String)> {
    let mut v: Vec<_> = reservations(data_dir, network)
        .into_iter()
        .map(|(id, _, ip)| (id, ip))
        .collect();
    v.sort();
    v
}
