//! dipamd's errors and the one boundary where they become a CNI error (in-band, for the plugin
//! to print) or a gRPC status (transport-level conditions the plugin maps back by code).

use std::{path::PathBuf, time::Duration};

use dipam_proto::v1::{CniError, CniReply, cni_reply::Outcome};
use dipam_state::StoreError;

/// The CNI codes, dipam's own among them: one table for dipamd and the plugin
/// (dipam_proto::cni::codes), described for operators in docs/cfp.md §9.
pub use dipam_proto::cni::codes;

/// How much of a delegate's stderr or stdout an error quotes.
const EXCERPT: usize = 600;

/// The last `EXCERPT` bytes of `bytes` as text: the end of a Go plugin's stderr is where the
/// reason usually is.
pub fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= EXCERPT {
        return text.to_owned();
    }
    let mut start = text.len() - EXCERPT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &text[start..])
}

/// How much of a delegate's own error `msg` or `details` dipamd keeps. host-local quotes an
/// invalid config value whole in its message: a 0.9 MB value echoed through the reply, the
/// log and two history events per failed ADD once took the commit journal to 46 MiB against
/// its 4 MiB cap and filled a state disk (docs/cfp.md, "Threat model"). A reason is a line or
/// two; a value quoted past this is no help to a reader.
pub const DELEGATE_TEXT: usize = 1024;

/// A delegate's text clipped to [`DELEGATE_TEXT`] bytes at a character boundary, saying how
/// long it was.
pub fn clip_delegate_text(text: String) -> String {
    if text.len() <= DELEGATE_TEXT {
        return text;
    }
    let mut end = DELEGATE_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... ({} bytes; clipped by dipamd)",
        &text[..end],
        text.len()
    )
}

/// A delegate's own CNI error, with what dipamd saw of the exec.
#[derive(Debug)]
pub struct DelegateFailure {
    pub kind: String,
    pub command: String,
    pub code: u32,
    pub msg: String,
    pub details: String,
    pub exit: String,
    pub stderr: String,
}

/// What a refused protocol version says. 0 is proto3's default: the field was never set,
/// which is most often a new client generated from dipam.proto that forgot it, not an old
/// plugin (every dipam plugin ever released sets it).
fn protocol_too_old(client: u32, min: u32) -> String {
    if client == 0 {
        format!(
            "the request sets no protocol_version (0): a client built from dipam.proto must \
             send dipam_proto's PROTOCOL_VERSION (this dipamd serves v{min} and newer)"
        )
    } else {
        format!("plugin protocol v{client} is older than the oldest this dipamd serves (v{min})")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The plugin speaks a protocol older than this daemon still serves, or (0) set none.
    #[error("{}", protocol_too_old(*client, *min))]
    ProtocolTooOld { client: u32, min: u32 },
    /// A CNI_* value that the plugin should have rejected (defence in depth: these become
    /// ledger keys and delegate arguments).
    #[error("{0}")]
    BadEnv(String),
    #[error("{0}")]
    Decode(String),
    #[error("{msg}")]
    Config { msg: String, details: String },
    #[error("{0}")]
    Version(String),
    #[error("delegate IPAM plugin {kind:?} not found")]
    DelegateNotFound {
        kind: String,
        searched: Vec<PathBuf>,
    },
    #[error("delegate IPAM plugin {kind} could not be started")]
    DelegateSpawn {
        kind: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("delegate IPAM plugin {kind} did not answer {command} within {}s", timeout.as_secs_f64())]
    DelegateTimeout {
        kind: String,
        command: String,
        timeout: Duration,
        stderr: String,
    },
    #[error("delegate IPAM plugin {kind} failed {command} without a usable CNI error")]
    DelegateBadOutput {
        kind: String,
        command: String,
        exit: String,
        stdout: String,
        stderr: String,
    },
    /// The delegate answered with a well-formed CNI error: its code and message go to the
    /// runtime unchanged, with dipamd's context added to the details.
    #[error("{}", .0.msg)]
    Delegate(Box<DelegateFailure>),
    #[error("ledger: {0}")]
    Store(#[from] StoreError),
    #[error("{key} is already attached with a different configuration")]
    ExistsWithOtherConfig { key: String },
    /// The delegate handed out an address that the ledger says belongs to someone else.
    #[error("address {ip} for {key} is already held by {holder}")]
    Conflict {
        ip: String,
        key: String,
        holder: String,
    },
    /// An ADD issued before an already-processed DEL of the same attachment.
    #[error("ADD for {key} was issued before its DEL, which is already done")]
    StaleAdd { key: String },
    #[error("no attachment recorded for {key}")]
    NoRecord { key: String },
    #[error("prevResult does not match the addresses recorded for {key}")]
    PrevResultMismatch {
        key: String,
        recorded: Vec<String>,
        prev: Vec<String>,
    },
    /// A GC interlock refused the whole collection; nothing was freed.
    #[error("GC of network {network} refused")]
    GcRefused { network: String, reason: String },
    /// GC ran, but some attachments could not be freed (it carried on past them).
    #[error("GC of network {network} could not free {} attachment(s)", failed.len())]
    GcIncomplete {
        network: String,
        freed: usize,
        failed: Vec<String>,
    },
    /// STATUS: dipamd can serve, but existing pods may have limited connectivity.
    #[error("existing pods may have limited connectivity")]
    LimitedConnectivity { reasons: Vec<String> },
    /// STATUS: dipamd cannot serve ADD right now.
    #[error("dipamd is not ready")]
    NotReady { missing: Vec<String> },
    #[error("internal error: {0}")]
    Internal(String),
    /// The delegate's state directory cannot be trusted; pod ADDs are refused.
    #[error(
        "dipamd refuses ADD on network {network}: the delegate's state directory is misconfigured"
    )]
    Misconfigured { network: String, why: String },
    /// Saturated: answered at once rather than queued forever.
    #[error("dipamd is busy: {0}")]
    Busy(String),
    /// An ADD's plugin left before its answer (rpc/add/mod.rs); the reply reaches only the log
    /// and the history.
    #[error("the plugin left before the ADD of {key} was answered")]
    RequesterLeft { key: String, released: bool },
    /// A runtime's ADD, CHECK or DEL of one of dipamd's own keys (keys/).
    #[error("container ID {container_id} is reserved for {family}; a runtime may not {command} it")]
    Reserved {
        command: String,
        container_id: String,
        family: crate::l1_leaves::keys::Internal,
    },
    /// A GC's list of valid attachments that is not exactly what the spec defines; nothing
    /// was freed (gc/).
    #[error("{}", .0.msg)]
    GcInput(InputError),
    /// The caller may not do this (a non-root caller outside what it is allowed).
    #[error("{msg}")]
    Forbidden { msg: String, details: String },
    /// An operator or agent request names something that does not exist (an unknown role).
    #[error("{msg}")]
    Invalid { msg: String, details: String },
    /// Too many of something: labels in one claim, claims on the node (agent/claims.rs).
    #[error("{count} {what} are more than the {limit} dipamd accepts")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// A Claim of a name that is held with another family or requested IP: the name is the
    /// claim's identity, so the caller must Unclaim it first (or choose another name).
    #[error("{msg}")]
    ClaimExists { msg: String, details: String },
    /// A request value beyond its limit (validate.rs); never echoed back.
    #[error("{what} is {len} bytes, more than the {limit} dipamd accepts")]
    TooLarge {
        what: &'static str,
        len: usize,
        limit: usize,
        /// The CNI code: 4 for a CNI_* variable, 7 for the network config.
        code: u32,
    },
}

/// A GC list (gc/) that is not exactly what the spec defines. The whole GC is refused: an entry
/// dipamd cannot read might be a pod that is still running, and guessing it stale would free
/// that pod's address.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct InputError {
    /// Names the entry: where it is (key or file, index) and what it holds (bounded).
    pub msg: String,
    /// What is wrong with it and what the entry must look like.
    pub details: String,
}

impl From<crate::l1_leaves::keys::Reserved> for ShimError {
    fn from(r: crate::l1_leaves::keys::Reserved) -> Self {
        Self::Reserved {
            command: r.command,
            container_id: r.container_id,
            family: r.family,
        }
    }
}

impl ShimError {
    pub(crate) fn code_and_details(&self) -> (u32, String) {
        match self {
            Self::ProtocolTooOld { .. } | Self::Internal(_) => (codes::INTERNAL, String::new()),
            Self::Busy(_) => (codes::TRY_AGAIN_LATER, "retry shortly".into()),
            Self::RequesterLeft { released, .. } => (
                codes::TRY_AGAIN_LATER,
                if *released {
                    "it was killed or its runtime's timeout passed; the ADD ran to its end and                      what it allocated was released"
                } else {
                    "it was killed or its runtime's timeout passed; what the ADD allocated is                      still recorded, for the runtime's DEL, GC or the next start to release"
                }
                .into(),
            ),
            Self::Forbidden { details, .. } => (codes::PERMISSION_DENIED, details.clone()),
            Self::TooLarge { code, .. } => (
                *code,
                "the value was not used and nothing was allocated; check what the runtime \
                 sends"
                    .into(),
            ),
            Self::Misconfigured { why, .. } => (codes::MISCONFIGURED, why.clone()),
            Self::BadEnv(_) => (codes::INVALID_ENV, String::new()),
            Self::Reserved { .. } => (
                codes::INVALID_ENV,
                format!(
                    "container IDs starting with \"{}\" name the addresses dipamd holds for \
                     itself (the agent's, the warm pool's); no runtime makes such IDs, and \
                     dipamd refuses ADD, CHECK and DEL of them so that no pod can take or \
                     release those addresses. Nothing was allocated or released",
                    crate::l1_leaves::keys::PREFIX
                ),
            ),
            Self::GcInput(e) => (codes::INVALID_CONFIG, e.details.clone()),
            Self::TooMany { .. } => (
                codes::INVALID_CONFIG,
                "nothing was recorded or allocated".into(),
            ),
            Self::ClaimExists { details, .. } => (codes::INVALID_CONFIG, details.clone()),
            Self::Decode(d) => (codes::DECODE_FAILURE, d.clone()),
            Self::Config { details, .. } | Self::Invalid { details, .. } => {
                (codes::INVALID_CONFIG, details.clone())
            }
            Self::Version(d) => (codes::INCOMPATIBLE_VERSION, d.clone()),
            Self::DelegateNotFound { .. }
            | Self::DelegateSpawn { .. }
            | Self::DelegateTimeout { .. }
            | Self::DelegateBadOutput { .. }
            | Self::Delegate(_) => self.delegate_code_and_details(),
            Self::Store(e) => (
                codes::INTERNAL,
                format!("{e}; nothing was allocated by this request"),
            ),
            Self::ExistsWithOtherConfig { .. }
            | Self::Conflict { .. }
            | Self::StaleAdd { .. }
            | Self::NoRecord { .. }
            | Self::PrevResultMismatch { .. } => self.attachment_code_and_details(),
            Self::NotReady { missing } => (codes::NOT_AVAILABLE, missing.join("; ")),
            Self::LimitedConnectivity { reasons } => {
                (codes::LIMITED_CONNECTIVITY, reasons.join("; "))
            }
            Self::GcRefused { reason, .. } => (
                codes::GC_REFUSED,
                format!(
                    "{reason}; nothing was freed. Check the runtime's list of attachments, or \
                     run `dipamctl gc --dry-run` to see what would go"
                ),
            ),
            Self::GcIncomplete { freed, failed, .. } => (
                codes::GC_INCOMPLETE,
                format!("freed {freed}; failed: {}", failed.join("; ")),
            ),
        }
    }

    /// The code and details of an attachment the request does not match: added with another
    /// config, an address someone else holds, an ADD the runtime deleted, no record, a
    /// prevResult that is not the recorded result.
    fn attachment_code_and_details(&self) -> (u32, String) {
        match self {
            Self::ExistsWithOtherConfig { .. } => (
                codes::EXISTS_WITH_OTHER_CONFIG,
                "the runtime must DEL an attachment before adding it again with a changed \
                     network config"
                    .into(),
            ),
            Self::Conflict { holder, .. } => (
                codes::AGENT_CONFLICT,
                format!(
                    "the delegate IPAM handed out an address that dipamd records for {holder}; \
                         the allocation was rolled back. Another IPAM may manage the same range, or \
                         the delegate's state directory was wiped or is not the one dipamd sees \
                         (check that /var/lib/cni is shared and persistent)"
                ),
            ),
            Self::StaleAdd { .. } => (
                // Spec code 3: the container is gone, the runtime need not clean up.
                codes::UNKNOWN_CONTAINER,
                "the runtime deleted this attachment after this ADD was issued; nothing was \
                     allocated"
                    .into(),
            ),
            Self::NoRecord { .. } => (
                codes::NO_RECORD,
                "dipamd has no ADD on record for this container and interface; it was never \
                     added through dipam, or it was deleted"
                    .into(),
            ),
            Self::PrevResultMismatch { recorded, prev, .. } => (
                codes::PREV_RESULT_MISMATCH,
                format!(
                    "recorded [{}], prevResult has [{}]",
                    recorded.join(", "),
                    prev.join(", ")
                ),
            ),
            _ => (codes::INTERNAL, String::new()),
        }
    }

    /// The code and details of a delegate's failure: not found, not started, killed, an
    /// answer that is no CNI result, or its own CNI error passed on with its code.
    fn delegate_code_and_details(&self) -> (u32, String) {
        match self {
            Self::DelegateNotFound { searched, .. } => (
                codes::DELEGATE_NOT_FOUND,
                format!(
                    "searched {}; install the plugin there (Debian: apt-get install \
                     containernetworking-plugins) or add its directory to dipamd --cni-path",
                    searched
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Self::DelegateSpawn { path, source, .. } => (
                codes::DELEGATE_NOT_FOUND,
                format!("exec {}: {source}", path.display()),
            ),
            Self::DelegateTimeout { stderr, .. } => (
                codes::DELEGATE_TIMEOUT,
                format!(
                    "dipamd killed it (raise dipamd --delegate-timeout if the delegate is \
                     legitimately slow); stderr: {}",
                    or_none(stderr)
                ),
            ),
            Self::DelegateBadOutput {
                exit,
                stdout,
                stderr,
                ..
            } => (
                codes::DELEGATE_BAD_OUTPUT,
                format!(
                    "{exit}; stdout: {}; stderr: {}",
                    or_none(stdout),
                    or_none(stderr)
                ),
            ),
            Self::Delegate(f) => {
                let DelegateFailure {
                    kind,
                    code,
                    details,
                    exit,
                    stderr,
                    ..
                } = f.as_ref();
                let mut d = details.clone();
                if !d.is_empty() {
                    d.push_str("; ");
                }
                d.push_str(&format!("delegate {kind} {exit}"));
                if !stderr.is_empty() {
                    d.push_str(&format!("; stderr: {stderr}"));
                }
                (*code, d)
            }
            // Not a delegate's failure: code_and_details answers those.
            other => (codes::INTERNAL, other.to_string()),
        }
    }

    /// The boundary: every error a CNI RPC can produce leaves dipamd through here.
    pub fn into_reply(self) -> Result<CniReply, tonic::Status> {
        match self {
            Self::ProtocolTooOld { .. } => {
                return Err(tonic::Status::failed_precondition(self.to_string()));
            }
            // The plugin maps RESOURCE_EXHAUSTED to 11, "try again later".
            Self::Busy(_) => return Err(tonic::Status::resource_exhausted(self.to_string())),
            _ => {}
        }
        let (code, details) = self.code_and_details();
        Ok(CniReply {
            retired_link_taken: false,
            pending_commit: false,
            replayed: None,
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            outcome: Some(Outcome::Error(CniError {
                code,
                msg: self.to_string(),
                details,
            })),
        })
    }
}

impl ShimError {
    /// The same boundary for the operator API, which has no CNI reply to carry an error in.
    pub fn into_status(self) -> tonic::Status {
        match self {
            Self::ProtocolTooOld { .. } => tonic::Status::failed_precondition(self.to_string()),
            Self::Busy(_) | Self::TooLarge { .. } | Self::TooMany { .. } => {
                tonic::Status::resource_exhausted(self.to_string())
            }
            Self::ClaimExists { msg, details } => {
                tonic::Status::already_exists(format!("{msg}: {details}"))
            }
            Self::Store(_) | Self::Internal(_) => tonic::Status::internal(self.to_string()),
            Self::GcInput(e) => {
                tonic::Status::invalid_argument(format!("{}: {}", e.msg, e.details))
            }
            Self::Forbidden { msg, details } => {
                tonic::Status::permission_denied(format!("{msg}: {details}"))
            }
            // Bad input to the operator API: the caller must change the request.
            Self::BadEnv(_) | Self::Decode(_) | Self::Invalid { .. } | Self::Version(_) => {
                let (_, details) = self.code_and_details();
                if details.is_empty() {
                    tonic::Status::invalid_argument(self.to_string())
                } else {
                    tonic::Status::invalid_argument(format!("{self}: {details}"))
                }
            }
            other => {
                let (_, details) = other.code_and_details();
                tonic::Status::failed_precondition(format!("{other}: {details}"))
            }
        }
    }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "(empty)" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: ShimError) -> CniError {
        match e.into_reply().unwrap().outcome {
            Some(Outcome::Error(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn delegate_errors_keep_code_and_msg_and_name_the_delegate() {
        let e = err(ShimError::Delegate(Box::new(DelegateFailure {
            kind: "host-local".into(),
            command: "ADD".into(),
            code: 999,
            msg: "no IP addresses available in range set".into(),
            details: String::new(),
            exit: "exited with status 1".into(),
            stderr: "boom".into(),
        })));
        assert_eq!(e.code, 999);
        assert_eq!(e.msg, "no IP addresses available in range set");
        assert!(e.details.contains("host-local"), "{}", e.details);
        assert!(e.details.contains("boom"), "{}", e.details);
    }

    #[test]
    fn old_protocol_is_a_grpc_status() {
        let s = ShimError::ProtocolTooOld { client: 0, min: 1 }
            .into_reply()
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::FailedPrecondition);
        assert!(
            s.message()
                .starts_with("the request sets no protocol_version (0)"),
            "{}",
            s.message()
        );
        let older = ShimError::ProtocolTooOld { client: 1, min: 2 }.to_string();
        assert_eq!(
            older,
            "plugin protocol v1 is older than the oldest this dipamd serves (v2)"
        );
    }

    #[test]
    fn a_delegates_long_text_is_clipped_saying_so() {
        assert_eq!(clip_delegate_text("short".into()), "short");
        let long = format!("invalid value {}", "é".repeat(500_000));
        let c = clip_delegate_text(long.clone());
        assert!(c.len() < DELEGATE_TEXT + 64, "{}", c.len());
        assert!(c.starts_with("invalid value "));
        assert!(c.ends_with(&format!("({} bytes; clipped by dipamd)", long.len())));
    }

    #[test]
    fn excerpt_keeps_the_tail_on_a_char_boundary() {
        let long = format!("{}é{}", "a".repeat(1000), "reason at the end");
        let e = excerpt(long.as_bytes());
        assert!(e.ends_with("reason at the end"));
        assert!(e.len() <= EXCERPT + 3);
    }
}
