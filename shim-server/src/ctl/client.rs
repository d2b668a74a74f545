//! Reaching dipamd: one connection over its unix socket, and the hint an operator needs when
//! it is not there.

use std::path::Path;

use tonic::transport::Channel;

use super::error::CtlError;

/// Connects to dipamd at `socket`; the error names the socket and the innermost cause (e.g.
/// "No such file or directory"), then asks whether dipamd runs and --socket is right.
pub async fn connect(socket: &Path) -> Result<Channel, CtlError> {
    dipam_proto::connect(socket)
        .await
        .map_err(|e| CtlError::Unreachable {
            socket: socket.to_owned(),
            reason: root_cause(&e),
            denied: io_kind(&e) == Some(std::io::ErrorKind::PermissionDenied),
        })
}

/// The kind of the first `io::Error` in `e`'s chain, if any.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
