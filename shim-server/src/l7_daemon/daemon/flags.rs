//! Phase 1 of dipamd's start: the flags checked together, before anything but the state
//! directory is touched, and what they decide.

use super::*;

/// What the flags decide before anything is touched on disk.
pub(super) struct Flags {
    /// The delegate search path (--cni-path).
    pub(super) dirs: Vec<PathBuf>,
    /// The runtime-aware GC's CRI client (--cri-endpoint).
    pub(super) runtime: Option<crate::l3_clients::gc::runtime::cri::CriClient>,
    pub(super) agent: Option<AgentConfig>,
    /// The warm pool's watermarks.
    pub(super) pool: crate::l3_clients::pool::sizing::Watermarks,
    /// The warm pool entries' node name; empty when the pool is off.
    pub(super) pool_node: String,
}

/// Phase 1: every flag checked (a usage error before any side effect but the state
/// directory's creation), in the order the errors are reported.
pub(super) fn check_flags(args: &Args) -> Result<Flags, DaemonError> {
    #[cfg(feature = "fault-injection")]
    if let Some(point) = &args.crash_at {
        crate::l1_leaves::fault::arm(point).map_err(|e| DaemonError::Usage(e.to_string()))?;
    }
    #[cfg(feature = "fault-injection")]
    if let Some(spec) = &args.pause_at {
        crate::l1_leaves::fault::arm_pause(spec).map_err(|e| DaemonError::Usage(e.to_string()))?;
    }
    if !(args.delegate_timeout > 0.0 && args.delegate_timeout <= 3600.0) {
        return Err(DaemonError::Usage(
            "--delegate-timeout must be between 0 and 3600 seconds".into(),
        ));
    }
    if !(args.dead_after >= 0.0 && args.dead_after <= 86400.0) {
        return Err(DaemonError::Usage(
            "--dead-after must be between 0 and 86400 seconds".into(),
        ));
    }
    if !(args.shutdown_timeout >= 0.0 && args.shutdown_timeout <= 3600.0) {
        return Err(DaemonError::Usage(
            "--shutdown-timeout must be between 0 and 3600 seconds".into(),
        ));
    }
    let dirs: Vec<PathBuf> = args
        .cni_path
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    crate::l1_leaves::perms::private_state_dir(&args.state_dir, spool_dir_of(args).as_path())
        .map_err(|e| {
            DaemonError::Usage(format!(
                "cannot create --state-dir {}: {e}",
                args.state_dir.display()
            ))
        })?;
    // No TCP listener beyond this node unless explicitly asked for.
    if let Some(addr) = args.metrics_address
        && !addr.ip().is_loopback()
        && !args.metrics_allow_remote
    {
        return Err(DaemonError::Usage(format!(
            "--metrics-address {addr} is not loopback; pass --metrics-allow-remote to expose \
             metrics beyond this node"
        )));
    }
    // Empty turns it off: the unit sets DIPAM_CRI_ENDPOINT, and `DIPAM_CRI_ENDPOINT=` in
    // /etc/default/dipamd is how a node without containerd's CRI says so.
    let runtime = match args
        .cri_endpoint
        .as_deref()
        .filter(|e| !e.trim().is_empty())
    {
        None => None,
        Some(_) if args.runtime_gc_interval.is_nan() || args.runtime_gc_interval <= 0.0 => {
            return Err(DaemonError::Usage(
                "--cri-endpoint needs --runtime-gc-interval above 0: the runtime-aware GC runs \
                 a pass every interval"
                    .into(),
            ));
        }
        Some(e) => Some(
            crate::l3_clients::gc::runtime::cri::CriClient::new(e)
                .map_err(|e| DaemonError::Usage(e.to_string()))?,
        ),
    };
    let agent = agent_config(args)?;
    let pool = args.pool.marks()?;
    // Only a pool that fills needs a node name (its entries' IDs carry it).
    let pool_node = if pool.on() {
        node_name(args)?
    } else {
        String::new()
    };
    Ok(Flags {
        dirs,
        runtime,
        agent,
        pool,
        pool_node,
    })
}
