//! Deleting retired pod veths off the runtime's critical path.
//!
//! Deleting a veth costs ~25 ms of wall time, nearly all of it the kernel waiting for RCU
//! (`RTM_DELLINK` returns only after `netdev_run_todo`'s `rcu_barrier`), and the reference
//! `ptp` makes every pod DEL wait for it. In main mode the plugin instead *retires* the host
//! end before releasing the address: it sets it down, which removes its routes at once, and
//! marks it with [`dipam_proto::retired`]'s alias and group. It then hands the deletion to
//! dipamd along with the DEL (`CniRequest.retired_link`), and the runtime gets its answer as
//! soon as the address is released. This worker deletes the retired links:
//!
//! - on a dedicated thread, because the `RTM_DELLINK` syscall itself blocks for the RCU wait
//!   and must not stall a tokio worker;
//! - by *sweeping*: each pass lists the links and deletes every retired one, so a link whose
//!   hand-off was lost (a plugin killed after retiring it, a dipamd killed before deleting it)
//!   goes with the next pass: at start, after every DEL that hands one over, and every
//!   [`SWEEP_EVERY`];
//! - in batches: when several are waiting, dipamd moves them into a link group no link uses at
//!   that moment (chosen per pass) and deletes the group with one `RTM_DELLINK`, so they share
//!   a single RCU wait. The group is dipamd's own choice and set by dipamd on links it has just
//!   seen retired, so an administrator's links are never in it.
//!
//! A retired link carries no address of the pod's anymore as far as the host is concerned:
//! it is down (no routes), and the pod's IP is released only after it was retired, so a new
//! pod that gets the IP installs its routes on its own veth without conflict.

use std::{
    os::unix::fs::MetadataExt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use dipam_proto::{retired, v1::RetiredLink};
use futures_util::TryStreamExt;
use rtnetlink::{
    Handle,
    packet_route::link::{LinkAttribute, LinkMessage},
};
use tracing::{debug, info, warn};

use crate::l1_leaves::privilege::Denials;

/// How often the worker sweeps without being asked: the bound on how long a retired link
/// whose hand-off was lost can linger.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How long the start waits for the worker's first answer (netlink open, privilege probe).
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// Counters for status and metrics.
#[derive(Debug, Default)]
pub struct TeardownStats {
    pub deleted: AtomicU64,
    pub batches: AtomicU64,
    /// Links that could not be deleted (and link listings that failed), since start.
    pub failures: AtomicU64,
    /// Whether the last pass left a retired link it could not delete.
    pub failing: AtomicBool,
    /// The last failure's message; empty while there was none.
    pub last_error: Mutex<String>,
    /// Set when a delete was refused for lack of a privilege: from then on the plugins
    /// delete their own veths, as they do when dipamd cannot take them at all.
    pub refused: AtomicBool,
    /// Where deletions and failures are reported (the metrics).
    pub events: crate::l1_leaves::events::Events,
}

impl TeardownStats {
    fn failed(&self, message: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.events
            .emit(crate::l1_leaves::events::Event::TeardownFailed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = message;
        }
    }

    pub fn last_error(&self) -> String {
        self.last_error
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }
}

/// Why the worker did not start: the plugins then delete their veths themselves.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The kernel refused a link change (the probe): dipamd lacks CAP_NET_ADMIN in the
    /// network namespace the pods' host ends live in.
    #[error(
        "deleting retired pod veths needs CAP_NET_ADMIN in dipamd's network namespace, and \
         the kernel refused it ({0}); the plugin deletes each pod's veth itself (a slower DEL). \
         Give dipamd CAP_NET_ADMIN (deploy/README.md)"
    )]
    Denied(String),
    #[error("teardown worker: {0}")]
    Worker(String),
}

/// What the worker is woken for.
#[derive(Debug)]
enum Wake {
    /// A link was handed over: sweep.
    Sweep,
    /// Retire the host veths of these attachments (network, container ID, ifname), if
    /// dipam's main mode made them, then answer how many there were and sweep.
    Retire(
        Vec<(String, String, String)>,
        tokio::sync::oneshot::Sender<usize>,
    ),
}

/// The handle the DEL path uses to hand a retired link over.
#[derive(Debug)]
pub struct Teardown {
    wake: mpsc::Sender<Wake>,
    /// The inode of dipamd's own network namespace: a link is taken only from a plugin in it.
    netns_inode: u64,
    pub stats: Arc<TeardownStats>,
}

impl Teardown {
    /// Starts the worker thread once it has proven it may change links; it then sweeps once
    /// right away (leftovers of a previous run). A denied probe is recorded in `denials`.
    pub fn start(
        denials: Arc<Denials>,
        events: crate::l1_leaves::events::Events,
    ) -> Result<Self, StartError> {
        let netns_inode = own_netns_inode()?;
        let (wake, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let stats = Arc::new(TeardownStats {
            events,
            ..TeardownStats::default()
        });
        let worker_stats = stats.clone();
        std::thread::Builder::new()
            .name("dipam-teardown".into())
            .spawn(move || worker(&rx, &worker_stats, &denials, &ready_tx))?;
        match ready.recv_timeout(PROBE_WAIT) {
            Ok(Ok(())) => Ok(Self {
                wake,
                netns_inode,
                stats,
            }),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(StartError::Worker(format!(
                "no answer from the worker: {e}"
            ))),
        }
    }

    /// Takes over deleting `link` if it lives in dipamd's netns. Returns whether it did; if
    /// not, the plugin deletes it itself.
    pub fn take(&self, link: &RetiredLink) -> bool {
        if link.netns_inode != self.netns_inode
            || link.ifindex == 0
            || self.stats.refused.load(Ordering::Relaxed)
        {
            return false;
        }
        self.wake.send(Wake::Sweep).is_ok()
    }

    /// Retires the host veths of attachments GC is about to release, before their delegate
    /// DEL: a main-mode pod's veth and its /32 route stayed behind when only the address was
    /// freed, so the host kept routing the address to a veth the next pod could not take
    /// over (or, before ADD refused that, silently took over from a pod still running).
    /// Set down, its routes go at once; the sweep deletes it. An attachment made in IPAM
    /// mode (its main plugin made the interface) has no such veth: nothing is done. Returns
    /// how many were retired; 0 also when the worker is gone.
    pub async fn retire(&self, keys: Vec<(String, String, String)>) -> usize {
        if keys.is_empty() || self.stats.refused.load(Ordering::Relaxed) {
            return 0;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.wake.send(Wake::Retire(keys, tx)).is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }
}

/// Retires the host veth of each attachment in `keys` that has one (kernel::retire_host_veth:
/// down, and the retired alias the sweep looks for).
async fn retire(h: &Handle, keys: &[(String, String, String)], stats: &TeardownStats) -> usize {
    use dipam_plugin::datapath::{kernel, naming};
    let mut n = 0;
    for (network, container_id, ifname) in keys {
        let name = naming::host_ifname(network, container_id, ifname);
        let alias = naming::retired_alias(network, container_id, ifname);
        match kernel::retire_host_veth(h, &name, &alias).await {
            Ok(Some(_)) => n += 1,
            Ok(None) => {}
            Err(e) => {
                stats.failed(format!("retiring {name} after GC: {e}"));
                warn!(veth = %name, error = %e, "teardown: could not retire the veth of an attachment GC freed");
            }
        }
    }
    n
}

/// Whether this process may change links, asked of the kernel itself: a capability in the
/// bounding set is not enough (a user namespace that does not own the network namespace, an
/// LSM). An `RTM_DELLINK` that names no link: the kernel checks CAP_NET_ADMIN on every
/// request that changes something before it looks at the request (EPERM), and otherwise
/// answers EINVAL (no link given). Nothing is ever deleted.
async fn probe(h: &Handle) -> Result<(), StartError> {
    match h.link().del(0).execute().await {
        Err(e) if errno(&e).is_some_and(crate::l1_leaves::privilege::is_denial) => {
            Err(StartError::Denied(e.to_string()))
        }
        _ => Ok(()),
    }
}

/// Who deletes retired veths, for status: "dipamd", or `off: <why>` when the plugins do.
pub fn who(t: Option<&Teardown>) -> String {
    match t {
        None => "off: the teardown worker did not start (see dipamd's log); the plugins delete \
                 their own veths"
            .into(),
        Some(t) if t.stats.refused.load(Ordering::Relaxed) => {
            "off: a delete was not permitted; the plugins delete their own veths".into()
        }
        Some(_) => "dipamd".into(),
    }
}

fn own_netns_inode() -> std::io::Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

fn worker(
    rx: &mpsc::Receiver<Wake>,
    stats: &TeardownStats,
    denials: &Denials,
    ready: &mpsc::Sender<Result<(), StartError>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(StartError::Worker(format!(
                "cannot start its runtime: {e}"
            ))));
            return;
        }
    };
    let handle = {
        let _entered = rt.enter();
        match rtnetlink::new_connection() {
            Ok((conn, handle, _)) => {
                rt.spawn(conn);
                handle
            }
            Err(e) => {
                if e.raw_os_error()
                    .is_some_and(crate::l1_leaves::privilege::is_denial)
                {
                    denials.note("opening netlink for the veth teardown", &e);
                }
                let _ = ready.send(Err(StartError::Worker(format!("cannot open netlink: {e}"))));
                return;
            }
        }
    };
    if let Err(e) = rt.block_on(probe(&handle)) {
        if matches!(e, StartError::Denied(_)) {
            denials.note("deleting retired pod veths", &e);
        }
        let _ = ready.send(Err(e));
        return;
    }
    let _ = ready.send(Ok(()));
    let answer = |wake: Wake| {
        if let Wake::Retire(keys, done) = wake {
            let _ = done.send(rt.block_on(retire(&handle, &keys, stats)));
        }
    };
    loop {
        rt.block_on(sweep(&handle, stats, denials));
        match rx.recv_timeout(SWEEP_EVERY) {
            // Everything handed over meanwhile is in the next pass.
            Ok(wake) => {
                answer(wake);
                while let Ok(wake) = rx.try_recv() {
                    answer(wake);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

fn alias_of(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfAlias(s) => Some(s.as_str()),
        _ => None,
    })
}

fn group_of(link: &LinkMessage) -> u32 {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Group(g) => Some(*g),
            _ => None,
        })
        .unwrap_or_default()
}

fn is_retired(link: &LinkMessage) -> bool {
    alias_of(link).is_some_and(|a| a.starts_with(retired::ALIAS_PREFIX))
}

/// One pass: delete every retired link in this netns.
async fn sweep(h: &Handle, stats: &TeardownStats, denials: &Denials) {
    let started = Instant::now();
    let links: Vec<LinkMessage> = match h.link().get().execute().try_collect().await {
        Ok(l) => l,
        Err(e) => {
            stats.failed(format!("listing links: {e}"));
            stats.failing.store(true, Ordering::Relaxed);
            warn!(error = %e, "teardown: listing links failed; retrying at the next pass");
            return;
        }
    };
    let retired_links: Vec<&LinkMessage> = links.iter().filter(|l| is_retired(l)).collect();
    stats.failing.store(false, Ordering::Relaxed);
    if retired_links.is_empty() {
        return;
    }
    let mut left: Vec<&LinkMessage> = retired_links.clone();
    let mut deleted = 0u64;
    if retired_links.len() > 1 {
        // One RTM_DELLINK for a whole group shares one RCU wait among all of them. The group
        // is one no link uses right now, chosen per pass and set by dipamd itself on links it
        // has just seen retired, so the delete can take nothing else.
        let used: std::collections::HashSet<u32> = links.iter().map(group_of).collect();
        let batch = batch_group(&used);
        let mut grouped = Vec::new();
        for link in &retired_links {
            let msg = rtnetlink::LinkUnspec::new_with_index(link.header.index)
                .link_group(batch)
                .build();
            match h.link().set(msg).execute().await {
                Ok(()) => grouped.push(link.header.index),
                Err(e) if gone(&e) => left.retain(|l| l.header.index != link.header.index),
                Err(e) => {
                    debug!(ifindex = link.header.index, error = %e, "teardown: could not group a retired veth")
                }
            }
        }
        if grouped.len() > 1 {
            match delete_group(h, batch).await {
                Ok(()) => {
                    deleted += grouped.len() as u64;
                    left.retain(|l| !grouped.contains(&l.header.index));
                }
                Err(e) => debug!(error = %e, "teardown: group delete failed; deleting one by one"),
            }
        }
    }
    for link in left {
        match h.link().del(link.header.index).execute().await {
            Ok(()) => deleted += 1,
            Err(e) if gone(&e) => {}
            Err(e) => {
                let alias = alias_of(link).unwrap_or_default();
                stats.failed(format!(
                    "deleting retired veth {alias:?} (ifindex {}): {e}",
                    link.header.index
                ));
                stats.failing.store(true, Ordering::Relaxed);
                if errno(&e).is_some_and(crate::l1_leaves::privilege::is_denial) {
                    // Not a passing fault: every later delete would fail the same way. The
                    // plugins take their veths back; this one goes with its pod's netns.
                    stats.refused.store(true, Ordering::Relaxed);
                    denials.note(&format!("deleting retired veth {alias:?}"), &e);
                }
                warn!(ifindex = link.header.index, alias, error = %e, "teardown: deleting a retired veth failed; retrying at the next pass");
            }
        }
    }
    stats.deleted.fetch_add(deleted, Ordering::Relaxed);
    if deleted > 0 {
        stats
            .events
            .emit(crate::l1_leaves::events::Event::TeardownDeleted(deleted));
    }
    stats.batches.fetch_add(1, Ordering::Relaxed);
    let took = started.elapsed();
    let ms = crate::l1_leaves::clock::log_ms(took);
    if took.as_millis() > 1000 {
        info!(deleted, elapsed_ms = ms, "teardown: deleted retired veths");
    } else {
        debug!(deleted, elapsed_ms = ms, "teardown: deleted retired veths");
    }
}

/// A link group number no link in `used` has (nor the default group 0), varied per pass.
fn batch_group(used: &std::collections::HashSet<u32>) -> u32 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(1)
        ^ std::process::id().rotate_left(16);
    let mut g = seed | 0x8000_0000;
    while used.contains(&g) {
        g = g.wrapping_add(1) | 0x8000_0000;
    }
    g
}

/// `ip link delete group <group>`.
async fn delete_group(h: &Handle, group: u32) -> Result<(), rtnetlink::Error> {
    let mut msg = LinkMessage::default();
    msg.attributes.push(LinkAttribute::Group(group));
    match rtnetlink::LinkDelRequest::new_with_message(h.clone(), msg)
        .execute()
        .await
    {
        Err(e) if gone(&e) => Ok(()),
        other => other,
    }
}

/// ENODEV: already gone (the pod's netns was destroyed, taking the pair with it).
fn gone(e: &rtnetlink::Error) -> bool {
    errno(e) == Some(libc::ENODEV)
}

/// The errno the kernel answered with, if the error is the kernel's.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(-m.raw_code()),
        _ => None,
    }
}
