//! systemd socket activation (sd_listen_fds): with `dipamd.socket`, systemd owns the socket
//! and hands it to dipamd as fd 3. Plugins that connect while dipamd is still opening its
//! ledger and replaying wait in the socket's backlog instead of failing: the replay-before-
//! serving order is kept, because dipamd accepts only once it is ready. A socket-activated
//! dipamd never unlinks the socket (systemd's, and deleting it would break every later start,
//! as netavark's dhcp proxy learned).

use std::os::{fd::FromRawFd, unix::net::UnixListener as StdListener};

/// The first fd systemd passes (SD_LISTEN_FDS_START).
const FIRST_FD: i32 = 3;

/// Why the socket systemd passed cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error("systemd passed {0} sockets; dipamd.socket must declare exactly one ListenStream")]
    TooMany(u32),
    #[error("activated socket: {0}")]
    Socket(#[source] std::io::Error),
}

/// The activated listener, when systemd passed one to this process. `getenv` is the process
/// environment (injected: tests pass their own).
pub fn listener(
    getenv: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<tokio::net::UnixListener>, ActivationError> {
    let pid_ok = getenv("LISTEN_PID")
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let fds = getenv("LISTEN_FDS")
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    if !pid_ok || fds == 0 {
        return Ok(None);
    }
    if fds > 1 {
        return Err(ActivationError::TooMany(fds));
    }
    // SAFETY: systemd guarantees fd 3 is an open listening socket owned by this process when
    // LISTEN_PID is our pid and LISTEN_FDS >= 1; nothing else in dipamd uses fd 3.
    let std = unsafe { StdListener::from_raw_fd(FIRST_FD) };
    std.set_nonblocking(true).map_err(ActivationError::Socket)?;
    tokio::net::UnixListener::from_std(std)
        .map(Some)
        .map_err(ActivationError::Socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_activated_without_our_pid() {
        let env = |k: &str| match k {
            "LISTEN_PID" => Some("1".to_owned()),
            "LISTEN_FDS" => Some("1".to_owned()),
            _ => None,
        };
        assert!(listener(&env).unwrap().is_none());
        assert!(listener(&|_| None).unwrap().is_none());
    }
}
