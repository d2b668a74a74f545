//! The unix-socket gRPC server: socket hygiene, serving, graceful shutdown.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use dipam_proto::v1::{
    admin_server::AdminServer, agent_server::AgentServer, cni_server::CniServer,
};
use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::{
    l1_leaves::access::{MAX_REQUEST_BYTES, PeerCheck},
    l1_leaves::listen::{Gate, KEEPALIVE},
    l5_node::node::Node,
    l6_transport::service::Service,
};
use tonic::service::interceptor::InterceptedService;

mod bodies;
mod deadline;
pub use bodies::{Bodies, BodiesLayer};
pub use deadline::{DEADLINE, Deadline, DeadlineLayer};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{path}: another process is serving this socket; stop it or choose another --socket")]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket; refusing to remove it")]
    NotASocket { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC server reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Binds `path`: creates its directory, removes a stale socket (one nobody answers on), and
/// restricts it to root (mode 0600). Called after the store is open, so a second dipamd on
/// the same state directory has already been refused.
pub async fn bind(path: &Path, group: Option<u32>) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(ServeError::InUse {
                    path: path.to_owned(),
                });
            }
            info!(socket = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(io_err(path))?;
        }
        Ok(_) => {
            return Err(ServeError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err(path))?;
    let mode = match group {
        Some(gid) => {
            std::os::unix::fs::chown(path, Some(0), Some(gid)).map_err(io_err(path))?;
            0o660
        }
        None => 0o600,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    Ok(listener)
}

/// Why a --socket-group names no group.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("--socket-group: no group named {0:?}")]
    Unknown(String),
    #[error("--socket-group {0:?}: {1}")]
    Lookup(String, #[source] nix::errno::Errno),
}

/// A group name or numeric gid.
pub fn resolve_group(g: &str) -> Result<u32, GroupError> {
    if let Ok(gid) = g.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(GroupError::Unknown(g.to_owned())),
        Err(e) => Err(GroupError::Lookup(g.to_owned(), e)),
    }
}

/// How long dipamd lets the requests in flight finish after SIGTERM before it exits anyway
/// (`--shutdown-timeout`). Short on purpose: while dipamd drains, its socket accepts nothing,
/// so every pod ADD on the node waits (and DELs are spooled) until the next dipamd serves.
/// Cutting a request short is safe: each one is recorded as an intent before its delegate
/// runs, and the next start completes or releases it exactly as after a crash, waiting first
/// for a delegate still running (delegate/survivors.rs). systemd's `TimeoutStopSec` and the
/// DaemonSet's `terminationGracePeriodSeconds` must exceed it (deploy/README.md), or the
/// drain ends in SIGKILL.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);

/// tonic refuses a request above the decode limit with OUT_OF_RANGE, before any handler
/// runs; gRPC's own servers say RESOURCE_EXHAUSTED for that, and so does dipamd for every
/// other oversized value (validate.rs). dipamd's handlers never answer OUT_OF_RANGE, so the
/// code alone identifies tonic's refusal. Its message names only the sizes.
fn oversize_is_resource_exhausted<B>(
    mut res: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    use tonic::codegen::http::HeaderValue;
    let out_of_range = HeaderValue::from(tonic::Code::OutOfRange as i32);
    if res.headers().get("grpc-status") == Some(&out_of_range) {
        res.headers_mut().insert(
            "grpc-status",
            HeaderValue::from(tonic::Code::ResourceExhausted as i32),
        );
    }
    res
}

/// What one connection may make dipamd buffer before a request is accepted (docs/cfp.md,
/// "Threat model"): 300 connections each sending a 256 KiB HEADERS block that never ended
/// once grew RSS from 9 to 252 MB. gRPC's own headers are a few hundred bytes; a request's
/// body (up to [`MAX_REQUEST_BYTES`]) flows through the windows as the handler reads it.
pub const MAX_HEADER_LIST: u32 = 16 << 10;
/// HTTP/2's smallest allowed maximum frame (RFC 9113 §6.5.2).
pub const MAX_FRAME: u32 = 16 << 10;
/// Bytes a client may send on one stream before dipamd reads them.
pub const STREAM_WINDOW: u32 = 256 << 10;
/// Bytes a client may send on one connection, all streams together, before dipamd reads them.
pub const CONNECTION_WINDOW: u32 = 1 << 20;
/// Streams one connection may have open at once (the plugin uses one; an agent a few).
pub const MAX_STREAMS: u32 = 64;

/// One socket dipamd serves: root's (--socket) or the non-root callers' (--users-socket).
pub struct Listener {
    listener: UnixListener,
    gate: Gate,
    path: PathBuf,
    /// Whether dipamd removes the path at shutdown (not systemd's activated socket).
    unlink: bool,
}

impl Listener {
    pub fn new(listener: UnixListener, gate: Gate, path: PathBuf, unlink: bool) -> Self {
        Self {
            listener,
            gate,
            path,
            unlink,
        }
    }
}

type Incoming =
    crate::l1_leaves::authority::Fixed<crate::l1_leaves::listen::Guarded<tokio::net::UnixStream>>;

/// One socket's incoming connections: each admitted by its gate (peer credentials and caps
/// checked at accept, docs/cfp.md "Threat model"), then C-core clients' `:authority` fixed
/// (authority.rs).
fn incoming(
    listener: UnixListener,
    gate: Gate,
) -> std::pin::Pin<Box<dyn tokio_stream::Stream<Item = io::Result<Incoming>> + Send>> {
    let gate = Arc::new(gate);
    Box::pin(futures_util::stream::unfold(
        (listener, gate),
        |(listener, gate)| async move {
            let conn = gate.accept_unix(&listener).await;
            Some((
                Ok(crate::l1_leaves::authority::Fixed::new(conn.http2())),
                (listener, gate),
            ))
        },
    ))
}

/// Server reflection (grpc.reflection.v1 and the v1alpha that older grpcurl releases ask
/// for): it describes dipam.v1 and grpc.health.v1, from the descriptors proto/build.rs
/// compiled with the code.
#[allow(clippy::type_complexity)]
fn reflection() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    ServeError,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(dipam_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// What the server awaits before its graceful shutdown: the signal. It also tells every
/// watch to end (a stream that never ends would hold the graceful shutdown forever), and
/// starts the drain's clock (`draining`).
async fn stop_signal<F>(
    shutdown: F,
    early: Vec<PathBuf>,
    drain: Duration,
    stopping: Arc<Node>,
    draining_health: Arc<crate::l6_transport::health::Monitor>,
    draining: tokio::sync::oneshot::Sender<()>,
) where
    F: std::future::Future<Output = ()> + Send,
{
    shutdown.await;
    // A plugin that connects now would wait in the listen backlog until dipamd exits;
    // without the path it fails at once and spools its DEL (or answers 11 to an ADD).
    // systemd's activated socket stays: systemd owns it, and queues for the next dipamd.
    for path in early {
        let _ = std::fs::remove_file(path);
    }
    info!(
        drain_seconds = drain.as_secs_f64(),
        "no longer accepting; agent watches end, requests in flight may finish"
    );
    stopping.agent.close_watches();
    draining_health.drain();
    let _ = draining.send(());
}

/// The sockets dipamd made, removed once it stopped (systemd's activated socket stays).
fn remove_sockets(users_path: Option<PathBuf>, unlink: bool, path: &std::path::Path) {
    if let Some(users) = users_path {
        let _ = std::fs::remove_file(users);
    }
    if unlink {
        let _ = std::fs::remove_file(path);
        info!(socket = %path.display(), "socket removed; dipamd stopped");
    } else {
        info!(socket = %path.display(), "dipamd stopped; the socket stays with systemd");
    }
}

/// The server's end, or the drain's: requests still in flight `drain` after the signal
/// (`draining`) are left to the next start, as after a crash.
async fn within_drain<S>(
    server: S,
    draining: tokio::sync::oneshot::Receiver<()>,
    drain: Duration,
) -> Result<(), tonic::transport::Error>
where
    S: std::future::Future<Output = Result<(), tonic::transport::Error>>,
{
    tokio::pin!(server);
    let deadline = async {
        if draining.await.is_err() {
            // The server ended before any signal: nothing to bound.
            return std::future::pending().await;
        }
        tokio::time::sleep(drain).await;
    };
    let result = tokio::select! {
        r = &mut server => r,
        () = deadline => {
            warn!(
                drain_seconds = drain.as_secs_f64(),
                "requests still in flight after the shutdown drain; exiting anyway (the next \
                 start completes or releases them, as after a crash)"
            );
            Ok(())
        }
    };
    result
}

/// Serves until `shutdown` resolves, then stops accepting, ends every agent watch with
/// UNAVAILABLE, lets the requests in flight finish for at most `drain`, and unlinks the
/// sockets dipamd made. Root's socket and the users' socket each have their own listen
/// backlog: a flood of one never fills the other's.
#[allow(clippy::too_many_arguments)]
pub async fn serve<F>(
    node: Arc<Node>,
    root: Listener,
    users: Option<Listener>,
    peers: PeerCheck,
    drain: Duration,
    non_root_open: usize,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: std::future::Future<Output = ()> + Send,
{
    let path = root.path.clone();
    let unlink = root.unlink;
    let users_path = users.as_ref().map(|u| u.path.clone());
    let mut conns = incoming(root.listener, root.gate);
    if let Some(u) = users {
        conns = Box::pin(futures_util::stream::select(
            conns,
            incoming(u.listener, u.gate),
        ));
    }
    let svc = Service(node.clone());
    let check = move |req| peers.check(req);
    let health = crate::l6_transport::health::Monitor::new(node.clone());
    tokio::spawn(health.clone().run(crate::l6_transport::health::RECHECK));
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let (draining_tx, draining) = tokio::sync::oneshot::channel::<()>();
    let early: Vec<PathBuf> = unlink
        .then(|| path.clone())
        .into_iter()
        .chain(users_path.clone())
        .collect();
    let signal = stop_signal(
        shutdown,
        early,
        drain,
        node.clone(),
        health.clone(),
        draining_tx,
    );
    let server = tonic::transport::Server::builder()
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .max_frame_size(MAX_FRAME)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        // A dead or silent peer is found and its connection closed (listen.rs's IDLE is
        // the bound on a peer that answers nothing at all).
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .layer(tower::util::MapResponseLayer::new(
            oversize_is_resource_exhausted,
        ))
        // One code for an expired deadline (service.rs).
        .layer(deadline::DeadlineLayer)
        // Before tonic reads a body: what a non-root uid may make dipamd buffer.
        .layer(bodies::BodiesLayer::new(non_root_open))
        .add_service(InterceptedService::new(
            CniServer::new(svc.clone()).max_decoding_message_size(MAX_REQUEST_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            AdminServer::new(svc.clone()).max_decoding_message_size(MAX_REQUEST_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            AgentServer::new(svc).max_decoding_message_size(MAX_REQUEST_BYTES),
            check.clone(),
        ))
        // The standard services answer the same callers as dipam.v1: the socket's
        // permissions and the peer check are the one trust boundary.
        .add_service(InterceptedService::new(
            tonic_health::pb::health_server::HealthServer::new(health.service())
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            reflection_v1.max_decoding_message_size(MAX_REQUEST_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            reflection_v1alpha.max_decoding_message_size(MAX_REQUEST_BYTES),
            check,
        ))
        .serve_with_incoming_shutdown(conns, signal);
    let result = within_drain(server, draining, drain).await;
    remove_sockets(users_path, unlink, &path);
    result.map_err(ServeError::from)
}
