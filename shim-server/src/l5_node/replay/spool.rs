//! Draining the spool: every spooled DEL, checked by the spool rule, replayed through the
//! DEL RPC (rpc/del.rs) as dipamd's own request.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsStr,
    io::Read,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::atomic::Ordering,
};

use dipam_proto::{
    spool::{self, QUARANTINE},
    v1::CniRequest,
};
use nix::{fcntl::renameat, unistd::fsync};
use serde::Deserialize;
use tracing::{error, info, warn};

use crate::{
    l1_leaves::error::ShimError,
    l2_core::delegate::store,
    l3_clients::spool::{Drained, depth, open_quarantine, set},
    l5_node::node::Node,
    l5_node::rpc,
};

/// The plugin's spool file (format 1).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spooled {
    format: u32,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    issued_at_ms: u64,
    /// On the boot clock (order.rs); absent from plugins before it.
    #[serde(default)]
    issued_at: Option<SpooledStamp>,
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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpooledStamp {
    boot_id: String,
    ns: u64,
}

/// Opens `dir` by the rule, recording the outcome for status/doctor/metrics.
fn open_checked(node: &Node, dir: &Path) -> Option<OwnedFd> {
    match spool::open_dir(dir) {
        Ok(fd) => {
            set(&node.spool.untrusted, None);
            Some(fd)
        }
        Err(e) if e.not_found() => None,
        Err(e) => {
            if node.spool.untrusted().is_none() {
                error!(spool = %dir.display(), error = %e, "the DEL spool fails the spool rule (root-owned, not writable by group or others, no links); nothing in it is replayed until it is fixed");
            }
            set(&node.spool.untrusted, Some(e.to_string()));
            None
        }
    }
}

fn quarantine(node: &Node, fd: &OwnedFd, dir: &Path, name: &OsStr, why: &str) {
    let file = dir.join(name);
    let moved = open_quarantine(fd, dir).and_then(|q| {
        renameat(fd, name, &q, name).map_err(crate::l3_clients::spool::QuarantineError::Move)?;
        let _ = fsync(&q);
        let _ = fsync(fd);
        Ok(())
    });
    match moved {
        Ok(()) => {
            node.spool.quarantined.fetch_add(1, Ordering::Relaxed);
            node.core
                .events
                .emit(crate::l1_leaves::events::Event::SpoolQuarantined);
            warn!(file = %file.display(), why, "spooled DEL not replayed; moved to {QUARANTINE}/");
        }
        Err(e) => {
            error!(file = %file.display(), why, error = %e, "spooled DEL not replayed, and it could not be quarantined; left in place");
        }
    }
}

/// Reads one spool file by the rule; quarantines it when it fails.
fn read_file(node: &Node, fd: &OwnedFd, dir: &Path, name: &OsStr) -> Option<Spooled> {
    let bytes = spool::open_file(fd, dir, name)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            let mut b = Vec::new();
            f.take(spool::MAX_FILE_BYTES as u64)
                .read_to_end(&mut b)
                .map(|_| b)
                .map_err(|e| e.to_string())
        });
    let parsed = bytes
        .and_then(|b| serde_json::from_slice::<Spooled>(&b).map_err(|e| e.to_string()))
        .and_then(|s| {
            if s.format == spool::FORMAT && s.command == "DEL" {
                Ok(s)
            } else {
                Err(format!("format {} command {:?}", s.format, s.command))
            }
        });
    match parsed {
        Ok(s) => Some(s),
        Err(why) => {
            quarantine(node, fd, dir, name, &why);
            None
        }
    }
}

/// Whether the delegate's own store proves it holds nothing for this request's key, so its
/// DEL has nothing to release. Only a store dipamd can read (host-local's) proves it; the
/// answer for each store directory is read once per drain.
async fn provably_nothing_held(
    p: &crate::l2_core::core::Prepared,
    cache: &mut HashMap<PathBuf, Option<HashSet<(String, String)>>>,
) -> bool {
    let Some(dir) = store::readable_dir(&p.dc.kind, &p.dc.conf, &p.dc.network) else {
        return false;
    };
    if !cache.contains_key(&dir) {
        let held = store::read(dir.clone())
            .await
            .ok()
            .map(|rs| rs.into_iter().map(|r| (r.container_id, r.ifname)).collect());
        cache.insert(dir.clone(), held);
    }
    let Some(Some(held)) = cache.get(&dir) else {
        return false;
    };
    let (cid, ifname) = (&p.req.container_id, &p.req.ifname);
    // A legacy id-only reservation names no interface: it may be this one's.
    !held.contains(&(cid.clone(), ifname.clone())) && !held.contains(&(cid.clone(), String::new()))
}

/// Replays every spooled DEL in `dir`.
pub async fn drain(node: &Node, dir: &Path) -> Drained {
    let mut out = Drained::default();
    let Some(fd) = open_checked(node, dir) else {
        return out;
    };
    let names = match spool::pending(&fd) {
        Ok(n) => n,
        Err(e) => {
            warn!(spool = %dir.display(), error = %e, "cannot list the DEL spool");
            return out;
        }
    };
    let mut stores = HashMap::new();
    for name in names {
        let Some(s) = read_file(node, &fd, dir, &name) else {
            out.failed += 1;
            continue;
        };
        // The file passed the rule, so a root process wrote it: the plugin, run by the
        // runtime as root. Its CNI_PATH is that caller's, as on a live DEL.
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
            issued_at: s.issued_at.map(|b| dipam_proto::v1::BootStamp {
                boot_id: b.boot_id,
                ns: b.ns,
            }),
            retired_link: None,
        };
        let what = format!("{}/{}", req.container_id, req.ifname);
        // A key the ledger does not hold still gets the delegate's DEL, as a live DEL does:
        // the ledger may be younger than the attachment (moved aside and started afresh,
        // restored from a backup). Only when the delegate's own store proves it holds
        // nothing for the key is the exec skipped, which keeps the drain (run before
        // serving) fast after a runtime retried ADDs in a tight loop while dipamd was down.
        if let Ok(p) = node.prepare(req.clone(), true, crate::l1_leaves::access::Caller::ROOT)
            && let Ok(None) = node.core.lookup(&p.key)
            && provably_nothing_held(&p, &mut stores).await
        {
            let _ = spool::remove(&fd, &name);
            tracing::debug!(attachment = %what, "spooled DEL for an attachment neither dipamd nor the delegate holds");
            out.released += 1;
            continue;
        }
        match rpc::del::run(node, crate::l1_leaves::access::Caller::ROOT, req).await {
            Ok(released) => {
                let _ = spool::remove(&fd, &name);
                info!(attachment = %what, ips = %released.ips.join(","), file = %dir.join(&name).display(), "spooled DEL replayed");
                out.released += 1;
            }
            Err(
                e @ (ShimError::Decode(_)
                | ShimError::Config { .. }
                | ShimError::BadEnv(_)
                | ShimError::Reserved { .. }
                | ShimError::Version(_)),
            ) => {
                quarantine(node, &fd, dir, &name, &e.to_string());
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

/// Moves the files waiting in a spool a previous dipamd of this socket published into ours
/// (`to`): a DEL spooled there, even in the moment before this dipamd's pointer replaced the
/// old one, is replayed here. Files failing the rule stay there, quarantined.
pub fn adopt(node: &Node, from: &Path, to: &Path) -> usize {
    let (Some(src), Ok(dst)) = (
        spool::open_dir(from).ok(),
        spool::open_dir(to).map_err(|e| e.to_string()),
    ) else {
        return 0;
    };
    let mut moved = 0;
    for name in spool::pending(&src).unwrap_or_default() {
        let Ok(mut f) = spool::open_file(&src, from, &name) else {
            quarantine(node, &src, from, &name, "fails the spool rule");
            continue;
        };
        let done = match renameat(&src, name.as_os_str(), &dst, name.as_os_str()) {
            Ok(()) => fsync(&dst)
                .and_then(|()| fsync(&src))
                .map_err(std::io::Error::from),
            // Another file system: copy durably, then remove the original.
            Err(nix::errno::Errno::EXDEV) => {
                let mut body = Vec::new();
                f.read_to_end(&mut body)
                    .and_then(|_| spool::write_file(&dst, &name.to_string_lossy(), &body, 0o600))
                    .and_then(|()| spool::remove(&src, &name))
            }
            Err(e) => Err(e.into()),
        };
        match done {
            Ok(()) => moved += 1,
            Err(e) => {
                warn!(from = %from.join(&name).display(), error = %e, "cannot move a spooled DEL from the previous spool; retried later");
            }
        }
    }
    if moved > 0 {
        info!(from = %from.display(), to = %to.display(), moved, "spooled DELs taken over from the spool a previous dipamd of this socket published");
    }
    moved
}

/// Drains `dir` (after taking over inherited spools) until a pass finds nothing new: DELs
/// spooled while the drain runs are released too. Bounded, so a plugin spooling in a loop
/// cannot hold dipamd's start forever; the periodic drain takes the rest.
pub async fn drain_all(node: &Node, dir: &Path) -> Drained {
    let mut total = Drained::default();
    for _ in 0..8 {
        for from in node.spool.inherited() {
            adopt(node, &from, dir);
        }
        let d = drain(node, dir).await;
        total.released += d.released;
        total.failed += d.failed;
        total.kept = d.kept;
        if d.released + d.failed == 0 {
            break;
        }
    }
    report(node, dir);
    total
}

/// Reports the spool's gauges, and whether the ledger takes commits: plugins write spool
/// files while dipamd runs and the store recovers from a full disk in the background, so
/// both are sampled here, at start and on every tick of [`run`] (docs/metrics.md).
pub fn report(node: &Node, dir: &Path) {
    use crate::l1_leaves::events::Event;
    node.core.events.emit(Event::SpoolDepth(depth(dir) as u64));
    node.core
        .events
        .emit(Event::SpoolUntrusted(node.spool.untrusted().is_some()));
    node.core
        .events
        .emit(Event::SpoolMismatched(node.spool.mismatched().len() as u64));
    node.core.report_writable();
}

/// Drains every `every` until the process ends.
pub async fn run(node: std::sync::Arc<Node>, dir: PathBuf, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        for from in node.spool.inherited() {
            adopt(&node, &from, &dir);
        }
        if depth(&dir) > 0 || node.spool.untrusted().is_some() {
            drain(&node, &dir).await;
        }
        report(&node, &dir);
    }
}
