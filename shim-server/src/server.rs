//! The unix-socket gRPC server: socket hygiene, serving, graceful shutdown.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use dipam_proto::v1::{
    admin_server::AdminServer, agent_server::AgentServer, cni_server::CniServer,
};
use dipam_state::Store;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::info;

use crate::{service::Service, shim::Shim};

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
pub async fn bind(path: &Path) -> Result<UnixListener, ServeError> {
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err(path))?;
    Ok(listener)
}

/// Serves until `shutdown` resolves, then unlinks the socket.
pub async fn serve<S: Store, F>(
    shim: Arc<Shim<S>>,
    listener: UnixListener,
    path: &Path,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: std::future::Future<Output = ()> + Send,
{
    let svc = Service(shim);
    let result = tonic::transport::Server::builder()
        .add_service(CniServer::new(svc.clone()))
        .add_service(AdminServer::new(svc.clone()))
        .add_service(AgentServer::new(svc))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    let _ = std::fs::remove_file(path);
    info!(socket = %path.display(), "socket removed; dipamd stopped");
    result.map_err(ServeError::from)
}
