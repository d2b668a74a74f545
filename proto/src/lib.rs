//! The dipam.v1 wire contract, generated from `dipam/v1/dipam.proto` and `dipam/v1/agent.proto`
//! (one proto package), and the few constants the plugin and dipamd must agree on outside the
//! messages: the CNI facts (`cni`: versions, name rules, error codes) and the DEL spool's
//! contract (`spool`), and how the clients dial dipamd and read its refusal at accept
//! (`connect` and its `coalesce`d writes, `refused_at_accept`). Nothing else lives here.

/// The protocol version this build speaks. Bump it when a request or reply gains meaning
/// that an older peer must know about; never remove support for an older version silently.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest client protocol a daemon built from this crate still serves.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// How a pod's host veth is marked once its DEL has begun ("retired"): down, with this alias
/// prefix, until dipamd deletes it (see `RetiredLink` in the proto). The alias tells dipamd's
/// sweep which links are dipam's to delete, also after a crash.
pub mod retired {
    /// Prefix of a retired link's alias: `dipam-gone <network> <container id> <ifname>`.
    pub const ALIAS_PREFIX: &str = "dipam-gone ";
}

pub mod cni;
pub mod coalesce;
pub mod spool;

// The generated code's doc comments are the .proto's comments, plain text: `<role>` there
// is a placeholder, not HTML.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    missing_docs,
    rustdoc::invalid_html_tags
)]
pub mod v1 {
    tonic::include_proto!("dipam.v1");

    impl DoctorCheck {
        /// A check as doctor reports it: the fix is shown only for a failed check.
        pub fn new(
            name: impl Into<String>,
            ok: bool,
            detail: impl Into<String>,
            fix: &str,
        ) -> Self {
            Self {
                name: name.into(),
                ok,
                detail: detail.into(),
                fix: if ok { String::new() } else { fix.to_owned() },
            }
        }
    }

    /// The encoded `FileDescriptorSet` of dipam.v1 (proto/build.rs), for server reflection.
    #[cfg(feature = "server")]
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("dipam_v1_descriptor");
}

/// Connects to dipamd's unix socket. Shared by the plugin and dipamctl so that both dial the
/// daemon the same way.
///
/// The channel dials once. tonic's channel otherwise dials again whenever it finds its
/// connection closed before a call is sent, and a connection dipamd turned away at accept
/// (its GOAWAY read before the call went out) is found closed that way every time: the call
/// then waited, dialling and being turned away over and over, for as long as the GOAWAY kept
/// winning that race (seen for 20 s on a loaded node), never learning why. A call on a
/// connection that ended fails instead, and the caller decides: the plugin retries within its
/// budget or asks dipamd whether it refuses it (`probe_refusal`), dipamctl says so.
pub async fn connect(
    socket: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    let dialled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The URI is required by the API but never used: the connector dials the unix socket.
    tonic::transport::Endpoint::from_static("http://dipamd.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            let again = dialled.swap(true, std::sync::atomic::Ordering::SeqCst);
            async move {
                if again {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        NOT_DIALLED_AGAIN,
                    ));
                }
                let stream = tokio::net::UnixStream::connect(path).await?;
                // A call's frames in one write, not five wake-ups of dipamd (coalesce.rs).
                let stream = coalesce::Coalesce::new(stream);
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// The error of a call made after its channel's connection ended (see [`connect`]).
pub const NOT_DIALLED_AGAIN: &str =
    "the connection to dipamd ended before the call was sent (a channel dials once)";

/// Why dipamd dropped this client's connection at accept, read from its answer (the GOAWAY
/// of `listen::Refusal::frames` in dipamd, docs/cfp.md §8.3) by its HTTP/2 error code, never
/// by text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// This uid is neither root nor in `--allow-uid` / `--admin-uid` (INADEQUATE_SECURITY).
    NotAllowed,
    /// This uid holds `--max-connections-per-uid` connections already (ENHANCE_YOUR_CALM).
    TooManyConnections,
}

/// The kind of the OS error under a connect's error (ENOENT, ECONNREFUSED, EACCES, EAGAIN...):
/// what says whether dipamd may serve later, or the caller lacks access to its socket.
pub fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    std::iter::successors(Some(err), |e| e.source())
        .find_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
}

/// The innermost error text ("No such file or directory (os error 2)"): what an operator can
/// act on, without tonic's "transport error" wrapping.
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .last()
        .map_or_else(String::new, ToString::to_string)
}

/// Whether `err` (a connect error or a call's `tonic::Status`, whose source chain holds the
/// transport's error) is dipamd's refusal at accept: a GOAWAY sent by dipamd with one of the
/// codes of [`Refused`]. A connection that merely broke (dipamd killed) is not.
pub fn refused_at_accept(err: &(dyn std::error::Error + 'static)) -> Option<Refused> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(h2) = e.downcast_ref::<h2::Error>()
            && h2.is_go_away()
            && h2.is_remote()
        {
            return match h2.reason() {
                Some(h2::Reason::INADEQUATE_SECURITY) => Some(Refused::NotAllowed),
                Some(h2::Reason::ENHANCE_YOUR_CALM) => Some(Refused::TooManyConnections),
                _ => None,
            };
        }
        cur = e.source();
    }
    None
}

/// How long [`probe_refusal`] waits for dipamd's first frames.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks dipamd at `socket`, over a connection of its own, whether it refuses this process at
/// accept. A client's own call cannot always tell: when the GOAWAY arrives before hyper has
/// handed the request to h2, hyper reports only "connection closed" (tonic `Cancelled`), as
/// it would for a dipamd killed mid-request. The probe sends the HTTP/2 client preface and an
/// empty SETTINGS frame (RFC 9113 §3.4) and reads dipamd's first two frames: a refusal is
/// SETTINGS then a GOAWAY whose code [`Refused`] names; a dipamd that serves this caller sends
/// something else second (its SETTINGS ACK). Only the two frame headers and the GOAWAY's
/// code are read. None when dipamd cannot be reached or says nothing within `timeout`.
pub fn probe_refusal(socket: &std::path::Path, timeout: std::time::Duration) -> Option<Refused> {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + timeout;
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    // A failed write is no verdict: dipamd may have answered and closed already.
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0");
    let mut got = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        match goaway_code(&got) {
            Ok(code) => return code.and_then(refusal_of),
            Err(NeedMore) if got.len() >= 4096 => return None,
            Err(NeedMore) => {}
        }
        let left = deadline.checked_duration_since(std::time::Instant::now())?;
        s.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))
            .ok()?;
        match s.read(&mut chunk) {
            Ok(n @ 1..) => got.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// [`Refused`] for a GOAWAY's error code.
fn refusal_of(code: u32) -> Option<Refused> {
    match h2::Reason::from(code) {
        h2::Reason::INADEQUATE_SECURITY => Some(Refused::NotAllowed),
        h2::Reason::ENHANCE_YOUR_CALM => Some(Refused::TooManyConnections),
        _ => None,
    }
}

/// More bytes are needed to decide.
struct NeedMore;

/// From a server's first bytes: Some(code) when they are SETTINGS then GOAWAY, None when they
/// are anything else.
fn goaway_code(b: &[u8]) -> Result<Option<u32>, NeedMore> {
    let head = |at: usize| -> Result<(usize, u8), NeedMore> {
        let h = b.get(at..at + 9).ok_or(NeedMore)?;
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        Ok((len, h[3]))
    };
    let (len, kind) = head(0)?;
    if kind != 4 {
        return Ok(None);
    }
    let (glen, gkind) = head(9 + len)?;
    if gkind != 7 || glen < 8 {
        return Ok(None);
    }
    let at = 9 + len + 9 + 4;
    let code = b.get(at..at + 4).ok_or(NeedMore)?;
    Ok(Some(u32::from_be_bytes([
        code[0], code[1], code[2], code[3],
    ])))
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn goaway_code_reads_settings_then_goaway_only() {
        let settings = [0u8, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let mut refusal = settings.to_vec();
        refusal.extend_from_slice(&[
            0, 0, 10, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc, b'h', b'i',
        ]);
        // SETTINGS (15 bytes), the GOAWAY's header (9), its last stream (4), its code (4).
        for cut in 0..32 {
            assert!(goaway_code(&refusal[..cut]).is_err(), "decided at {cut}");
        }
        assert_eq!(goaway_code(&refusal).ok(), Some(Some(0xc)));
        assert_eq!(refusal_of(0xc), Some(Refused::NotAllowed));
        assert_eq!(refusal_of(0xb), Some(Refused::TooManyConnections));
        assert_eq!(refusal_of(0), None);
        // A serving dipamd: SETTINGS, then its SETTINGS ACK.
        let mut serving = settings.to_vec();
        serving.extend_from_slice(&[0, 0, 0, 4, 1, 0, 0, 0, 0]);
        assert_eq!(goaway_code(&serving).ok(), Some(None));
        assert_eq!(
            goaway_code(b"HTTP/1.1 400 Bad Request\r\n").ok(),
            Some(None)
        );
    }
}
