//! Reaching dipamd: one connection over its unix socket, and the hint an operator needs when
//! it is not there.

use std::path::Path;

use tonic::transport::Channel;

use super::error::CtlError;

/// Connects to dipamd at `socket`; the error names the socket and the innermost cause (e.g.
/// "No such file or directory"), then asks whether dipamd runs and --socket is right.
///
/// A non-root user first asks whether dipamd refuses it at accept (docs/cfp.md §8.3): its
/// calls would otherwise fail as a bare "transport error" (the GOAWAY dipamd answers with can
/// reach the client before its request does, and hyper then reports only that the connection
/// closed). Root is never refused at accept.
pub async fn connect(socket: &Path) -> Result<Channel, CtlError> {
    let uid = nix::unistd::getuid();
    if !uid.is_root() {
        let path = socket.to_owned();
        let probe = tokio::task::spawn_blocking(move || {
            dipam_proto::probe_refusal(&path, dipam_proto::PROBE_TIMEOUT)
        });
        if let Ok(Some(why)) = probe.await {
            return Err(CtlError::Unreachable {
                socket: socket.to_owned(),
                reason: refused_reason(uid.as_raw(), why),
                denied: true,
            });
        }
    }
    dipam_proto::connect(socket)
        .await
        .map_err(|e| CtlError::Unreachable {
            socket: socket.to_owned(),
            reason: dipam_proto::root_cause(&e),
            denied: dipam_proto::io_kind(&e) == Some(std::io::ErrorKind::PermissionDenied),
        })
}

/// What dipamd's refusal at accept means for this user.
fn refused_reason(uid: u32, why: dipam_proto::Refused) -> String {
    match why {
        dipam_proto::Refused::NotAllowed => format!(
            "dipamd closed the connection at accept: uid {uid} is neither root nor in its \
             --allow-uid or --admin-uid"
        ),
        dipam_proto::Refused::TooManyConnections => format!(
            "dipamd closed the connection at accept: uid {uid} holds its \
             --max-connections-per-uid connections already"
        ),
    }
}
