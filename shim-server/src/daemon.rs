//! dipamd: flags, start-up order, signals.
//!
//! Start-up order matters for crash safety: open the store (which also refuses a second dipamd
//! on the same state directory), replay interrupted operations, and only then bind the socket
//! and serve.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use dipam_state::SledStore;
use tracing::{error, info};

use crate::{
    delegate::Executor,
    logging::{self, LogFormat},
    recovery, server,
    shim::{Identity, Shim},
};

/// dipamd: the dipam shim daemon.
///
/// Serves "CNI over gRPC" to the dipam plugin on a unix socket, runs the delegated IPAM plugin
/// (host-local, azure-vnet-ipam, ...) exactly as a container runtime would, and records every
/// attachment in a ledger (sled, under --state-dir) before answering.
#[derive(Debug, Parser)]
#[command(name = "dipamd", version, about, long_about)]
pub struct Args {
    /// Unix socket to serve on (created mode 0600, root only).
    #[arg(long, env = "DIPAM_SOCKET", default_value = "/run/dipam/dipam.sock")]
    pub socket: PathBuf,
    /// Where the ledger lives. It must persist across reboots (not tmpfs).
    #[arg(long, env = "DIPAM_STATE_DIR", default_value = "/var/lib/dipam")]
    pub state_dir: PathBuf,
    /// Directories searched for delegate plugins after the request's CNI_PATH (colon-separated).
    #[arg(
        long,
        env = "DIPAM_CNI_PATH",
        default_value = "/opt/cni/bin:/usr/lib/cni"
    )]
    pub cni_path: String,
    /// Kill a delegate exec that has not finished after this many seconds. One ADD may need
    /// four execs (VERSION probe, cleanup of an interrupted operation, ADD, rollback DEL); the
    /// default keeps even that within the plugin's 55 s wait.
    #[arg(long, env = "DIPAM_DELEGATE_TIMEOUT", default_value_t = 10.0)]
    pub delegate_timeout: f64,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, tracing syntax (e.g. "info", "debug", "dipam_shim=debug").
    #[arg(long, env = "DIPAM_LOG", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Store(#[from] dipam_state::StoreError),
    #[error("{0}")]
    Serve(#[from] server::ServeError),
    #[error("{0}")]
    Usage(String),
    #[error("start-up replay failed: {0}")]
    Replay(#[from] crate::error::ShimError),
}

pub async fn run(args: Args) -> Result<(), DaemonError> {
    logging::init(args.log_format, &args.log_level);
    if !(args.delegate_timeout > 0.0 && args.delegate_timeout <= 3600.0) {
        return Err(DaemonError::Usage(
            "--delegate-timeout must be between 0 and 3600 seconds".into(),
        ));
    }
    let dirs: Vec<PathBuf> = args
        .cni_path
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    std::fs::create_dir_all(&args.state_dir).map_err(|e| {
        DaemonError::Usage(format!(
            "cannot create --state-dir {}: {e}",
            args.state_dir.display()
        ))
    })?;
    let store = SledStore::open(&args.state_dir)?;
    let shim = Shim::new(
        store,
        Executor::new(dirs, Duration::from_secs_f64(args.delegate_timeout)),
        Identity {
            socket: args.socket.clone(),
            state_dir: args.state_dir.clone(),
        },
    );
    let replay = recovery::replay(&shim).await?;
    let attachments = shim.ledger(|l| l.count()).await?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        state_dir = %args.state_dir.display(),
        attachments,
        replayed = replay.released,
        replay_failed = replay.failed,
        "ledger open"
    );
    let listener = server::bind(&args.socket).await?;
    info!(socket = %args.socket.display(), cni_path = %args.cni_path, "serving");
    server::serve(shim, listener, &args.socket, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop dipamd with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
}
