//! Phase 8 of dipamd's start: the sockets it serves (daemon/mod.rs).

use std::path::PathBuf;

use tracing::info;

use super::{Args, DaemonError, shutdown_signal};
use crate::l6_transport::server;

/// Phase 8: the socket (bound here, or passed by systemd), whether to unlink it at exit, and
/// the shutdown signal.
pub(super) async fn listen(
    args: &Args,
) -> Result<Sockets<impl std::future::Future<Output = ()> + use<>>, DaemonError> {
    let group = match &args.socket_group {
        None => None,
        Some(g) => Some(server::resolve_group(g).map_err(|e| DaemonError::Usage(e.to_string()))?),
    };
    let getenv = |k: &str| std::env::var(k).ok();
    let activated = crate::l6_transport::activation::listener(&getenv)
        .map_err(|e| DaemonError::Usage(e.to_string()))?;
    let unlink = activated.is_none();
    // Listened for from before the bind: a SIGTERM that arrives once clients can connect (a
    // unit stopped right after it started; a node shutting down) must stop dipamd gracefully,
    // not kill it with the default action between the bind and the server's first poll of
    // its shutdown future. Before this point the default action is right: nothing is served
    // yet, and what the start-up was doing is replayed by the next start.
    let stop = shutdown_signal();
    // With a users socket, the group connects there and root's socket stays root's alone:
    // a listen backlog is per socket, and a group member's connects once filled the one root's
    // pods shared with it (server/mod.rs).
    let (root_group, users) = match &args.users_socket {
        Some(path) => {
            let l = server::bind(path, group).await?;
            (None, Some((l, path.clone())))
        }
        None => {
            if group.is_some() {
                tracing::warn!(
                    "--socket-group without --users-socket: non-root callers share the \
                     socket's listen backlog with root's pods, and a group member can fill it; \
                     give them --users-socket"
                );
            }
            (group, None)
        }
    };
    let listener = match activated {
        Some(l) => {
            info!("using the socket systemd passed (socket activation)");
            l
        }
        None => server::bind(&args.socket, root_group).await?,
    };
    Ok(Sockets {
        root: listener,
        unlink,
        users,
        stop,
    })
}

/// The sockets dipamd serves: root's (--socket), whether to unlink it at exit (not systemd's),
/// the non-root callers' (--users-socket), and the shutdown signal.
pub(super) struct Sockets<F> {
    pub(super) root: tokio::net::UnixListener,
    pub(super) unlink: bool,
    pub(super) users: Option<(tokio::net::UnixListener, PathBuf)>,
    pub(super) stop: F,
}
