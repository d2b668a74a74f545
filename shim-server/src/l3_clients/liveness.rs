//! Whether an address the delegate holds, and the ledger does not record, is still in use on
//! this node. Such a reservation is either a running pod's that dipamd never saw (a node
//! adopted with pods already running: their ADDs went straight to host-local), which must be
//! adopted and never freed, or one whose pod is gone without a DEL, which only leaks. Freeing
//! the first kind handed a running pod's address to the next pod: the host's route moved to
//! the new veth and two network namespaces answered for one address (docs/cfp.md §7.4,
//! "Unrecorded reservations").
//!
//! The evidence, each enough to call a reservation alive:
//! - **a network namespace holds the address**: every process's netns, read through
//!   `/proc/<pid>/net/fib_trie` (IPv4 local addresses) and `/proc/<pid>/net/if_inet6` (IPv6),
//!   which need no privilege and never enter a namespace (dipamd's shipped unit has neither
//!   CAP_SYS_ADMIN nor setns). Each netns is read once when its inode can be told;
//! - **a host route to exactly the address (/32, /128) through a link that is up**: ptp and
//!   dipam's main mode route each pod's address to its veth, and a veth exists only while
//!   its peer's netns does;
//! - **the runtime lists the container ID as a pod sandbox** (`--cri-endpoint`).
//!
//! A reservation none of them finds is dead only when the look was complete: dipamd in its
//! own PID namespace (a container without hostPID) sees none of the node's pods through
//! /proc, so without the runtime's list it cannot prove anything dead, and keeps it.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv6Addr},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::{
    link::{LinkAttribute, LinkFlags},
    route::{RouteAddress, RouteAttribute},
};

use crate::l3_clients::sandboxes::Sandboxes;

/// How long one look may take before it counts as incomplete (a /proc that hangs, a netlink
/// dump that does not end).
const SCAN_TIMEOUT: Duration = Duration::from_secs(20);

/// What one look at the node found.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    /// Address -> the network namespace that holds it, described for operators.
    local: HashMap<IpAddr, String>,
    /// Address -> the link a host route to exactly it goes through.
    routes: HashMap<IpAddr, String>,
    /// The runtime's sandbox IDs, when dipamd has the runtime's list (`--cri-endpoint`).
    sandboxes: Option<HashSet<String>>,
    /// Why an address no evidence names is not proven dead.
    partial: Vec<String>,
    /// dipamd saw /proc from its own PID namespace: none of the node's processes (kept when
    /// the runtime's list stands in for them: the evidence pass then judges only what the
    /// runtime made).
    own_pid_namespace: bool,
}

/// What the evidence says about one reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// In use: the evidence, for operators.
    Alive(String),
    /// Nothing on the node uses it, and the look was complete.
    Dead,
    /// Nothing found, but the look was partial (why): never freed.
    Unknown(String),
}

impl Scan {
    /// Whether the look had the runtime's list of sandboxes.
    pub fn has_sandboxes(&self) -> bool {
        self.sandboxes.is_some()
    }

    /// Why this look cannot prove a recorded pod dead, if it cannot: it was partial (dipamd
    /// in its own PID namespace without the runtime's list, a scan or a list that failed), or
    /// the runtime listed no sandbox at all while `cri_records` attachments made through CRI
    /// are recorded (a runtime still restoring its state, a wrong socket).
    pub fn incomplete_for_records(&self, cri_records: usize) -> Option<String> {
        if !self.partial.is_empty() {
            return Some(self.partial.join("; "));
        }
        match &self.sandboxes {
            Some(s) if s.is_empty() && cri_records > 0 => Some(format!(
                "the runtime lists no pod sandbox while {cri_records} attachment(s) made \
                 through CRI are recorded"
            )),
            _ => None,
        }
    }

    /// Whether the runtime's list is all this look has of the node's pods (dipamd in its own
    /// PID namespace sees none of their processes): it then speaks only for the attachments
    /// made through CRI, as the runtime-aware GC's does.
    pub fn runtime_only(&self) -> bool {
        self.own_pid_namespace && self.sandboxes.is_some()
    }

    /// The verdict on `ip`, reserved under `container_id`.
    pub fn verdict(&self, ip: IpAddr, container_id: &str) -> Verdict {
        if let Some(w) = self.local.get(&ip) {
            return Verdict::Alive(format!("{ip} is configured in {w}"));
        }
        if let Some(w) = self.routes.get(&ip) {
            return Verdict::Alive(format!("the host routes {ip} to {w}, which is up"));
        }
        if let Some(s) = &self.sandboxes
            && s.contains(container_id)
        {
            return Verdict::Alive(format!("the runtime lists pod sandbox {container_id}"));
        }
        if self.partial.is_empty() {
            Verdict::Dead
        } else {
            Verdict::Unknown(self.partial.join("; "))
        }
    }
}

/// Looks at the node now: its network namespaces and host routes (on a blocking thread) and,
/// with `runtime`, the runtime's sandboxes.
pub async fn scan(runtime: Option<&dyn Sandboxes>) -> Scan {
    let looked = tokio::time::timeout(
        SCAN_TIMEOUT,
        tokio::task::spawn_blocking(|| {
            let (local, pid_view) = processes(Path::new("/proc"));
            (local, routes(), pid_view)
        }),
    )
    .await;
    let mut scan = Scan::default();
    match looked {
        Ok(Ok((local, routes, pid_view))) => {
            scan.local = local;
            match routes {
                Ok(r) => scan.routes = r,
                Err(e) => scan
                    .partial
                    .push(format!("the host's routes could not be read: {e}")),
            }
            if let Some(why) = pid_view {
                scan.own_pid_namespace = true;
                scan.partial.push(why);
            }
        }
        Ok(Err(e)) => scan.partial.push(format!("the look failed: {e}")),
        Err(_) => scan.partial.push(format!(
            "the look at the node's network namespaces took longer than {}s",
            SCAN_TIMEOUT.as_secs()
        )),
    }
    if let Some(rt) = runtime {
        match rt.list().await {
            Ok(ids) => {
                // The runtime's list is the truth for its pods (the runtime-aware GC trusts it
                // the same way): a partial view of /proc no longer hides one of them.
                scan.partial.retain(|p| !p.starts_with(OWN_PID_NAMESPACE));
                scan.sandboxes = Some(ids.into_iter().collect());
            }
            Err(e) => scan
                .partial
                .push(format!("the runtime's sandbox list could not be had: {e}")),
        }
    }
    scan
}

const OWN_PID_NAMESPACE: &str = "dipamd runs in its own PID namespace";

/// Every address configured in any process's network namespace, and why that view is
/// partial, if it is.
fn processes(proc_root: &Path) -> (HashMap<IpAddr, String>, Option<String>) {
    let mut local = HashMap::new();
    let partial = std::fs::read_to_string(proc_root.join("self/status"))
        .ok()
        .filter(|s| nested_pid_namespace(s))
        .map(|_| {
            format!(
                "{OWN_PID_NAMESPACE} and sees none of the node's pods through /proc: give it \
                 the host's (hostPID: true), or the runtime's list (--cri-endpoint)"
            )
        });
    let own = std::fs::metadata(proc_root.join("self/ns/net"))
        .map(|m| m.ino())
        .ok();
    let mut seen: HashSet<u64> = own.into_iter().collect();
    let mut seen_text: HashSet<u64> = HashSet::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return (local, partial);
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let base: PathBuf = entry.path();
        // The netns's inode needs ptrace access (a dipamd without CAP_SYS_PTRACE has none to
        // root's containers): then every process is read, and identical tables parsed once.
        match std::fs::metadata(base.join("ns/net")) {
            Ok(m) if !seen.insert(m.ino()) => continue,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => {}
        }
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        let who = format!("the network namespace of process {pid} ({})", comm.trim());
        let v4 = std::fs::read_to_string(base.join("net/fib_trie")).unwrap_or_default();
        let v6 = std::fs::read_to_string(base.join("net/if_inet6")).unwrap_or_default();
        if !seen_text.insert(digest(&v4, &v6)) {
            continue;
        }
        for ip in fib_trie_locals(&v4).into_iter().chain(if_inet6(&v6)) {
            local.entry(ip).or_insert_with(|| who.clone());
        }
    }
    (local, partial)
}

fn digest(a: &str, b: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    a.hash(&mut h);
    b.hash(&mut h);
    h.finish()
}

/// Whether /proc/self/status says this process lives in a PID namespace below the one it
/// was seen from (`NSpid:` lists one PID per level).
fn nested_pid_namespace(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .is_some_and(|pids| pids.split_whitespace().count() > 1)
}

/// The IPv4 addresses a netns has configured: in `fib_trie`, each `|-- <address>` leaf
/// followed by a `/32 host LOCAL` entry.
fn fib_trie_locals(text: &str) -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    let mut leaf: Option<IpAddr> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(a) = t.strip_prefix("|-- ") {
            leaf = a.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL")
            && let Some(ip) = leaf
            && !ip.is_loopback()
        {
            out.insert(ip);
        }
    }
    out
}

/// The IPv6 addresses of `if_inet6`: 32 hex digits, then index, prefix, scope, flags, name.
fn if_inet6(text: &str) -> HashSet<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let hex = l.split_whitespace().next()?;
            let v = u128::from_str_radix(hex, 16)
                .ok()
                .filter(|_| hex.len() == 32)?;
            let ip = Ipv6Addr::from(v);
            (!ip.is_loopback()).then_some(IpAddr::V6(ip))
        })
        .collect()
}

/// Why the host's routes could not be read (the scan goes on without them, and says so).
#[derive(Debug, thiserror::Error)]
enum RoutesError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Netlink(#[from] rtnetlink::Error),
}

/// Host routes to exactly one address (/32, /128) in the main table through a link that is
/// up: address -> the link's name.
fn routes() -> Result<HashMap<IpAddr, String>, RoutesError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async {
        let (conn, h, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        let mut up: HashMap<u32, String> = HashMap::new();
        let mut links = h.link().get().execute();
        while let Some(l) = links.try_next().await? {
            if !l.header.flags.contains(LinkFlags::Up) {
                continue;
            }
            let name = l
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            up.insert(l.header.index, name);
        }
        let mut out = HashMap::new();
        for query in [
            rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut stream = h.route().get(query).execute();
            while let Some(msg) = stream.try_next().await? {
                let host = match msg.header.address_family {
                    rtnetlink::packet_route::AddressFamily::Inet => 32,
                    _ => 128,
                };
                if msg.header.destination_prefix_length != host {
                    continue;
                }
                let mut dst = None;
                let mut oif = None;
                let mut table = u32::from(msg.header.table);
                for a in &msg.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(v4)) => {
                            dst = Some(IpAddr::V4(*v4));
                        }
                        RouteAttribute::Destination(RouteAddress::Inet6(v6)) => {
                            dst = Some(IpAddr::V6(*v6));
                        }
                        RouteAttribute::Oif(i) => oif = Some(*i),
                        RouteAttribute::Table(t) => table = *t,
                        _ => {}
                    }
                }
                // RT_TABLE_MAIN: the table ptp and dipam route pods in.
                if table != 254 {
                    continue;
                }
                if let (Some(dst), Some(name)) = (dst, oif.and_then(|i| up.get(&i))) {
                    out.entry(dst).or_insert_with(|| name.clone());
                }
            }
        }
        Ok(out)
    })
}

/// A scan built from given parts, for unit tests elsewhere in the crate.
#[cfg(test)]
pub fn fixed(local: &[(&str, &str)], partial: &[&str]) -> Scan {
    Scan {
        local: local
            .iter()
            .filter_map(|(ip, w)| Some((ip.parse().ok()?, (*w).to_owned())))
            .collect(),
        partial: partial.iter().map(|p| (*p).to_owned()).collect(),
        ..Scan::default()
    }
}

/// A scan with host routes and, if given, the runtime's list, for unit tests elsewhere.
#[cfg(test)]
pub fn fixed_with(
    local: &[(&str, &str)],
    routes: &[(&str, &str)],
    sandboxes: Option<&[&str]>,
    partial: &[&str],
) -> Scan {
    Scan {
        routes: routes
            .iter()
            .filter_map(|(ip, w)| Some((ip.parse().ok()?, (*w).to_owned())))
            .collect(),
        sandboxes: sandboxes.map(|s| s.iter().map(|x| (*x).to_owned()).collect()),
        ..fixed(local, partial)
    }
}

/// `scan`, as dipamd in its own PID namespace would have made it (for unit tests elsewhere).
#[cfg(test)]
pub fn seen_from_own_pid_namespace(scan: Scan) -> Scan {
    Scan {
        own_pid_namespace: true,
        ..scan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fib_trie_yields_only_host_local_addresses() {
        let text = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
            +-- 127.0.0.0/8 2 0 2\n           |-- 127.0.0.1\n              /32 host LOCAL\n\
            |-- 10.160.3.0\n              /24 link UNICAST\n\
            |-- 10.160.3.2\n              /32 host LOCAL\n\
            |-- 10.160.3.255\n           /32 link BROADCAST\n";
        let got = fib_trie_locals(text);
        assert_eq!(
            got,
            HashSet::from(["10.160.3.2".parse::<IpAddr>().unwrap()])
        );
    }

    #[test]
    fn if_inet6_yields_addresses_but_loopback() {
        let text = "00000000000000000000000000000001 01 80 10 80       lo\n\
            fd000000000000000000000000000002 04 40 00 82     eth0\n\
            bogus\n";
        assert_eq!(
            if_inet6(text),
            HashSet::from(["fd00::2".parse::<IpAddr>().unwrap()])
        );
    }

    #[test]
    fn nested_pid_namespaces_are_told() {
        assert!(!nested_pid_namespace("Name:\tdipamd\nNSpid:\t4242\n"));
        assert!(nested_pid_namespace("NSpid:\t4242\t1\n"));
    }

    #[test]
    fn verdicts_need_evidence_or_a_complete_look() {
        let s = fixed(
            &[("10.0.0.2", "the network namespace of process 9 (sleep)")],
            &[],
        );
        assert!(matches!(
            s.verdict("10.0.0.2".parse().unwrap(), "c"),
            Verdict::Alive(w) if w.contains("process 9")
        ));
        assert_eq!(s.verdict("10.0.0.3".parse().unwrap(), "c"), Verdict::Dead);
        let partial = fixed(&[], &["own PID namespace"]);
        assert!(matches!(
            partial.verdict("10.0.0.3".parse().unwrap(), "c"),
            Verdict::Unknown(_)
        ));
        let mut listed = fixed(&[], &[]);
        listed.sandboxes = Some(HashSet::from(["sb1".to_owned()]));
        assert!(matches!(
            listed.verdict("10.0.0.3".parse().unwrap(), "sb1"),
            Verdict::Alive(_)
        ));
    }

    /// This test process's own netns is skipped; the look itself completes on a real /proc.
    #[test]
    fn a_real_proc_is_read() {
        let (_, partial) = processes(Path::new("/proc"));
        assert!(partial.is_none(), "{partial:?}");
    }
}
