//! Entering a network namespace safely: on a dedicated thread that never goes back to a pool.
//!
//! `setns(CLONE_NEWNET)` moves only the calling thread, and a netlink socket belongs to the
//! netns it was created in (docs/sources.md §13), whichever thread uses it: a socket such a
//! thread opens in a pod's netns ([`PodSocket`]) serves the main thread too ([`run_here`]).
//! So every netns operation runs on a fresh `std::thread` that: opens netlink in the host
//! netns (still the thread's own), enters the target netns, opens a second netlink socket
//! there, builds its own current-thread tokio runtime for rtnetlink, does the work, and exits. Because the thread ends, nothing needs to
//! be restored, and no other code (the gRPC client's runtime, a tokio worker, a
//! `spawn_blocking` pool thread) ever runs in a pod's netns. The same pattern as the Go
//! plugins' `ns.Do` (containernetworking/plugins pkg/ns/README.md), without its
//! LockOSThread subtleties.

use std::{fs::File, future::Future, os::unix::fs::MetadataExt, path::Path};

use nix::{
    sched::{CloneFlags, setns},
    sys::statfs::{NSFS_MAGIC, fstatfs},
};
use rtnetlink::Handle;

use crate::error::PluginError;

/// An open CNI_NETNS: holding the file keeps the namespace alive while dipam works in it.
#[derive(Debug)]
pub struct Netns {
    path: String,
    file: File,
}

fn netns_error(path: &str, reason: impl Into<String>) -> PluginError {
    PluginError::Netns {
        netns: path.to_owned(),
        reason: reason.into(),
    }
}

impl Netns {
    /// Opens CNI_NETNS and makes sure it is a network namespace other than the plugin's own
    /// (code 161 otherwise). Done before the IPAM call, so that a bad path costs no address.
    pub fn open(path: &str) -> Result<Self, PluginError> {
        let file = File::open(path).map_err(|e| {
            netns_error(
                path,
                format!(
                    "open CNI_NETNS: {e}; the sandbox is gone or the runtime passed a wrong path"
                ),
            )
        })?;
        let fs = fstatfs(&file).map_err(|e| netns_error(path, format!("statfs: {e}")))?;
        if fs.filesystem_type() != NSFS_MAGIC {
            return Err(netns_error(
                path,
                "CNI_NETNS is not a namespace file (expected a bind mount like \
                 /var/run/netns/<name> or /proc/<pid>/ns/net)",
            ));
        }
        // skel >= 1.2 refuses CNI_NETNS == the plugin's own netns (code 8, after the fact):
        // the veth's container end would land on the host. Refuse before doing anything.
        let own = std::fs::metadata("/proc/self/ns/net");
        let target = file.metadata();
        if let (Ok(own), Ok(target)) = (own, target)
            && own.dev() == target.dev()
            && own.ino() == target.ino()
        {
            return Err(netns_error(
                path,
                "CNI_NETNS is the plugin's own (the host's) network namespace",
            ));
        }
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    /// For DEL: the namespace if it still exists; `None` when CNI_NETNS is empty or gone, which
    /// DEL treats as "nothing left in there" (spec §DEL).
    pub fn open_if_present(path: &str) -> Option<Self> {
        if path.is_empty() || !Path::new(path).exists() {
            return None;
        }
        Self::open(path).ok()
    }

    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Netlink handles of one datapath thread.
pub struct Handles {
    /// A socket in the host netns.
    pub host: Handle,
    /// A socket in the target netns, when one was given.
    pub container: Option<Handle>,
    /// The host netns, for moving a veth end there (`IFLA_NET_NS_FD`).
    pub host_ns: File,
}

impl Handles {
    pub fn container(&self) -> Result<&Handle, PluginError> {
        self.container
            .as_ref()
            .ok_or_else(|| PluginError::Datapath {
                step: "netlink in the container".into(),
                reason: "no container netns was entered (a bug in dipam)".into(),
            })
    }
}

fn socket_error(where_: &str, e: std::io::Error) -> PluginError {
    PluginError::Datapath {
        step: format!("opening a netlink socket in the {where_} netns"),
        reason: e.to_string(),
    }
}

/// Runs `work` on a dedicated thread (module docs) with netlink handles for the host and,
/// when given, for `target`. Blocks until the thread has finished and exited.
pub fn run<T, F, Fut>(target: Option<&Netns>, work: F) -> Result<T, PluginError>
where
    T: Send,
    F: FnOnce(Handles) -> Fut + Send,
    Fut: Future<Output = Result<T, PluginError>>,
{
    std::thread::scope(|scope| join(spawn(scope, target, work)?))
}

/// [`run`] without the wait: starts `work` on its netns thread inside `scope`, so that the
/// caller can do something else meanwhile (ADD's IPAM call), then [`join`]s it.
pub fn spawn<'scope, 'env, T, F, Fut>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    target: Option<&'env Netns>,
    work: F,
) -> Result<std::thread::ScopedJoinHandle<'scope, Result<T, PluginError>>, PluginError>
where
    T: Send + 'scope,
    F: FnOnce(Handles) -> Fut + Send + 'scope,
    Fut: Future<Output = Result<T, PluginError>>,
{
    std::thread::Builder::new()
        .name("dipam-netns".into())
        .spawn_scoped(scope, move || in_thread(target, work))
        .map_err(|e| PluginError::Datapath {
            step: "starting the netns thread".into(),
            reason: e.to_string(),
        })
}

/// Waits for a thread [`spawn`] started and returns what its work returned.
pub fn join<T>(
    thread: std::thread::ScopedJoinHandle<'_, Result<T, PluginError>>,
) -> Result<T, PluginError> {
    thread.join().unwrap_or_else(|_| {
        Err(PluginError::Datapath {
            step: "the netns thread".into(),
            reason: "panicked (a bug in dipam; its message is on stderr)".into(),
        })
    })
}

fn in_thread<T, F, Fut>(target: Option<&Netns>, work: F) -> Result<T, PluginError>
where
    F: FnOnce(Handles) -> Fut,
    Fut: Future<Output = Result<T, PluginError>>,
{
    // This thread was just spawned by one that never left the host netns.
    with_handles(
        || match target {
            None => Ok(None),
            Some(ns) => {
                setns(&ns.file, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| netns_error(&ns.path, format!("setns: {e}")))?;
                // From here on this thread is in the pod's netns, until it exits.
                rtnetlink::new_connection()
                    .map(|(conn, handle, _)| Some((conn, handle)))
                    .map_err(|e| socket_error("container", e))
            }
        },
        work,
    )
}

/// A netlink socket opened inside a pod's netns, for use from a thread that stays in the host
/// netns: a socket keeps the netns it was created in, whoever uses it (docs/sources.md §13).
pub struct PodSocket(rtnetlink::sys::Socket);

impl PodSocket {
    /// Opens one in the calling thread's netns: call it on a netns thread, inside the pod's.
    pub fn open() -> Result<Self, PluginError> {
        rtnetlink::sys::Socket::new(rtnetlink::sys::protocols::NETLINK_ROUTE)
            .map(Self)
            .map_err(|e| socket_error("container", e))
    }
}

/// Runs `work` on the calling thread, with netlink handles for the host and, through `pod`,
/// for a pod's netns, which no thread enters. The calling thread must be in the host netns
/// (the plugin's main thread never leaves it).
///
/// Why: ADD's last step (addresses and routes, once dipamd answered) ran on the netns thread
/// that had created the veth, so the answer went from the thread that received it to that
/// one and the outcome back: two thread wake-ups, each ~0.1-0.25 ms on a 2-vCPU VM
/// (docs/performance.md run 8). The thread that receives the answer now does it.
pub fn run_here<T, F, Fut>(pod: PodSocket, work: F) -> Result<T, PluginError>
where
    F: FnOnce(Handles) -> Fut,
    Fut: Future<Output = Result<T, PluginError>>,
{
    with_handles(
        move || {
            use std::os::fd::{FromRawFd, IntoRawFd};
            pod.0
                .set_non_blocking(true)
                .map_err(|e| socket_error("container", e))?;
            let fd = pod.0.into_raw_fd();
            // from_raw_fd unwraps its registration with the runtime's reactor (netlink-sys
            // 0.9): a refusal (ENOMEM) is an error of this ADD, not a panic of the plugin.
            let socket = std::panic::catch_unwind(|| {
                // SAFETY: the descriptor is the socket's own, released by into_raw_fd, so it
                // is owned exactly once; the reactor is the one with_handles has entered.
                unsafe { rtnetlink::sys::TokioSocket::from_raw_fd(fd) }
            })
            .map_err(|_| {
                socket_error(
                    "container",
                    std::io::Error::other("registering it with the netlink runtime failed"),
                )
            })?;
            let (conn, handle, _) = rtnetlink::from_socket(socket);
            Ok(Some((conn, handle)))
        },
        work,
    )
}

type Conn = rtnetlink::proto::Connection<
    rtnetlink::packet_route::RouteNetlinkMessage,
    rtnetlink::sys::TokioSocket,
>;

/// Builds a current-thread runtime on the calling thread (in the host netns), opens the host
/// socket, lets `container` open the pod's (which may move the thread into the pod's netns),
/// and runs `work` with both.
fn with_handles<T, C, F, Fut>(container: C, work: F) -> Result<T, PluginError>
where
    C: FnOnce() -> Result<Option<(Conn, Handle)>, PluginError>,
    F: FnOnce(Handles) -> Fut,
    Fut: Future<Output = Result<T, PluginError>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| PluginError::Datapath {
            step: "starting the netlink runtime".into(),
            reason: e.to_string(),
        })?;
    let (host_conn, host, host_ns, container) = {
        // Sockets register with this runtime's reactor, so they are made inside it.
        let _entered = rt.enter();
        let host_ns =
            File::open("/proc/thread-self/ns/net").map_err(|e| PluginError::Datapath {
                step: "opening the host netns".into(),
                reason: e.to_string(),
            })?;
        let (host_conn, host, _) =
            rtnetlink::new_connection().map_err(|e| socket_error("host", e))?;
        (host_conn, host, host_ns, container()?)
    };
    rt.block_on(async move {
        tokio::spawn(host_conn);
        let container = container.map(|(conn, handle)| {
            tokio::spawn(conn);
            handle
        });
        work(Handles {
            host,
            container,
            host_ns,
        })
        .await
    })
}
