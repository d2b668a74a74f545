//! The plugin's errors and the one place where they become CNI error codes
//! (docs/sources.md §3.2). Nothing else in the plugin picks a code.

use std::path::{Path, PathBuf};

use tonic::Code;

/// The CNI codes, dipam's own among them, with what each means: one table for the plugin and
/// dipamd (dipam_proto::cni::codes), described for operators in docs/cfp.md §9.
pub use dipam_proto::cni::codes;

/// Everything that can go wrong in the plugin before or while talking to dipamd.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Required CNI_* variables are absent or empty (spec: empty == absent).
    #[error("required env variables [{}] missing", .0.join(","))]
    MissingEnv(Vec<&'static str>),
    /// A CNI_* variable is present but invalid (bad command, container ID, ifname).
    #[error("{0}")]
    InvalidEnv(String),
    /// stdin could not be read.
    #[error("reading the network config from stdin: {0}")]
    Stdin(#[source] std::io::Error),
    /// stdin is not a JSON object of the expected shape.
    #[error("{0}")]
    Decode(String),
    /// The network config is JSON but not valid for dipam.
    #[error("{msg}")]
    Config { msg: String, details: String },
    /// The config's cniVersion is not supported, or too old for the command.
    #[error("{0}")]
    Version(String),
    /// dipamd could not be reached at all.
    #[error("dipamd is not reachable at {}", socket.display())]
    Unreachable {
        socket: PathBuf,
        reason: String,
        /// The connect's own error, when it was one: whether a dipamd may serve later.
        kind: Option<std::io::ErrorKind>,
        /// How long the plugin waited for dipamd to serve again (crate::retry).
        waited: Option<std::time::Duration>,
    },
    /// dipamd answered with a gRPC status instead of a CNI reply.
    #[error("dipamd refused the request: {}", status.message())]
    Rpc {
        socket: PathBuf,
        status: tonic::Status,
    },
    /// dipamd closed this non-root caller's connection at accept (docs/cfp.md §8.3), as its
    /// answer (dipam_proto::Refused) says.
    #[error("{}", refused_msg(*uid, *why))]
    Refused {
        socket: PathBuf,
        uid: u32,
        why: dipam_proto::Refused,
    },
    /// dipamd was unreachable for a DEL, and no spool that dipamd reads could be written.
    #[error("dipamd is unreachable and the DEL could not be spooled")]
    Spool {
        socket: PathBuf,
        reason: crate::spool::SpoolError,
        unreachable: String,
    },
    /// dipamd answered with a CNI error (its own, or the delegate's): passed on unchanged.
    #[error("{msg}")]
    Cni {
        code: u32,
        msg: String,
        details: String,
    },
    /// Main mode ADD: CNI_IFNAME is already taken inside the container.
    #[error("interface {ifname} already exists in {netns}")]
    InterfaceExists { ifname: String, netns: String },
    /// Main mode: CNI_NETNS cannot be used.
    #[error("cannot use network namespace {netns:?}")]
    Netns { netns: String, reason: String },
    /// Main mode: another plugin process holds this attachment's lock (lock.rs) for too
    /// long; the runtime retries (11).
    #[error("another operation on this attachment is in progress")]
    Busy(String),
    /// Main mode: a kernel operation of the datapath failed.
    #[error("{step} failed")]
    Datapath { step: String, reason: String },
    /// Main mode CHECK: what the kernel has differs from prevResult.
    #[error("the pod's interface does not match prevResult")]
    CheckFailed(Vec<String>),
    /// Main mode ADD: the IPAM result cannot be applied.
    #[error("the IPAM result cannot be applied")]
    IpamResult(String),
    /// Main mode ADD: the host routes the pod's address to another live veth.
    #[error("{ip} is still in use on this host: it is routed to {holder}")]
    AddressInUse {
        ip: String,
        holder: String,
        details: String,
    },
    /// An ADD failed after IPAM answered, and what it had done was undone (or not: `note`
    /// says which). The code is the original error's.
    #[error("{error}")]
    RolledBack {
        error: Box<PluginError>,
        note: String,
    },
}

fn refused_msg(uid: u32, why: dipam_proto::Refused) -> String {
    match why {
        dipam_proto::Refused::NotAllowed => {
            format!("dipamd does not serve uid {uid}: it closed the connection at accept")
        }
        dipam_proto::Refused::TooManyConnections => {
            format!("dipamd refused a connection of uid {uid}: it holds too many already")
        }
    }
}

/// A CNI error as printed on stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl PluginError {
    /// dipamd could not be reached, or the call was cut off without an answer: the request
    /// may or may not have been carried out (a DEL is then spooled; DEL is idempotent).
    pub fn daemon_unreachable(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Rpc { status, .. } => matches!(
                status.code(),
                Code::Unknown
                    | Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::Cancelled
            ),
            _ => false,
        }
    }

    /// dipamd did not serve this call, and a dipamd may serve the same call a moment later:
    /// the socket is missing or stale (a restart), its backlog is full (EAGAIN), or the
    /// connection broke without an answer (crate::retry). Never an answer dipamd sent, a
    /// refusal at accept, nor a socket this caller may not open.
    pub fn dipamd_may_serve_again(&self) -> bool {
        use std::io::ErrorKind as K;
        match self {
            Self::Unreachable { kind, .. } => matches!(
                kind,
                Some(
                    K::NotFound
                        | K::ConnectionRefused
                        | K::WouldBlock
                        | K::ConnectionReset
                        | K::ConnectionAborted
                        | K::BrokenPipe
                        | K::UnexpectedEof
                        | K::Interrupted
                )
            ),
            // Lost on the way (tonic's Unknown and Unavailable: reset, GOAWAY, refused
            // stream); dipamd's CNI service answers neither itself.
            Self::Rpc { status, .. } => {
                matches!(
                    status.code(),
                    Code::Unknown | Code::Unavailable | Code::Cancelled | Code::Aborted
                ) && dipam_proto::refused_at_accept(status).is_none()
            }
            _ => false,
        }
    }

    /// This error, saying that dipamd was waited for `waited` first (retry.rs calls it only
    /// after a wait).
    pub fn waited(self, waited: std::time::Duration) -> Self {
        match self {
            Self::Unreachable {
                socket,
                reason,
                kind,
                waited: None,
            } => Self::Unreachable {
                socket,
                reason,
                kind,
                waited: Some(waited),
            },
            other => other,
        }
    }

    /// The single mapping from plugin errors to CNI error codes. `status` is true for the
    /// STATUS verb, whose "cannot serve" code is 50, not 11 (spec 1.1 §STATUS).
    pub fn to_cni(&self, status: bool) -> CniError {
        let unavailable = if status {
            codes::NOT_AVAILABLE
        } else {
            codes::TRY_AGAIN_LATER
        };
        let (code, details) = match self {
            Self::MissingEnv(_) | Self::InvalidEnv(_) => (codes::INVALID_ENV, String::new()),
            Self::Stdin(e) => (codes::IO_FAILURE, e.to_string()),
            Self::Decode(d) => (codes::DECODE_FAILURE, d.clone()),
            Self::Config { details, .. } => (codes::INVALID_CONFIG, details.clone()),
            Self::Version(d) => (codes::INCOMPATIBLE_VERSION, d.clone()),
            Self::Busy(d) => (codes::TRY_AGAIN_LATER, d.clone()),
            Self::Unreachable {
                socket,
                reason,
                waited,
                ..
            } => (
                unavailable,
                format!(
                    "connect to {}: {reason}{}. Start dipamd (e.g. `systemctl start dipamd`) or \
                     point socketPath in the network config at the socket dipamd listens on",
                    socket.display(),
                    waited.map_or(String::new(), |w| format!(
                        " (waited {:.1} s for dipamd to serve again; timeoutSeconds bounds the wait)",
                        w.as_secs_f64()
                    )),
                ),
            ),
            Self::Rpc { socket, status } => rpc(socket, status, unavailable),
            Self::Refused { socket, uid, why } => refused(socket, *uid, *why, unavailable),
            Self::Spool {
                socket,
                reason,
                unreachable,
            } => (
                // The release is neither done nor queued: the runtime must retry, and the
                // DEL succeeds once dipamd serves the socket again.
                unavailable,
                format!(
                    "{unreachable}; {reason}. The runtime retries the DEL; it succeeds once \
                     dipamd serves {} again (`dipamctl doctor` checks the spool)",
                    socket.display()
                ),
            ),
            Self::Cni { code, msg, details } => {
                return CniError {
                    code: *code,
                    msg: msg.clone(),
                    details: details.clone(),
                };
            }
            Self::InterfaceExists { ifname, .. } => (
                codes::INTERFACE_EXISTS,
                format!(
                    "CNI_IFNAME={ifname} is already in use inside the container, and the spec \
                     requires ADD to fail rather than reuse it. Was the attachment added twice \
                     without a DEL? dipam left the existing interface untouched"
                ),
            ),
            Self::Netns { reason, .. } => (codes::NETNS, reason.clone()),
            Self::Datapath { reason, .. } => (codes::DATAPATH, reason.clone()),
            Self::CheckFailed(problems) => (codes::CHECK_FAILED, problems.join("; ")),
            Self::IpamResult(d) => (codes::IPAM_RESULT, d.clone()),
            Self::AddressInUse { details, .. } => (codes::ADDRESS_IN_USE, details.clone()),
            Self::RolledBack { error, note } => {
                let mut inner = error.to_cni(status);
                inner.details = if inner.details.is_empty() {
                    note.clone()
                } else {
                    format!("{}; {note}", inner.details)
                };
                return inner;
            }
        };
        CniError {
            code,
            msg: self.to_string(),
            details,
        }
    }
}

/// A gRPC failure's CNI code and details: transient codes are `unavailable` (the runtime
/// retries), the rest by what they mean for the caller, with a hint of what to do.
fn rpc(socket: &Path, status: &tonic::Status, unavailable: u32) -> (u32, String) {
    let code = match status.code() {
        // Transient by nature: the runtime should retry. tonic reports a
        // connection lost mid-call (dipamd killed or restarted) as Unknown; dipamd
        // itself never answers Unknown.
        Code::Unknown
        | Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Cancelled => unavailable,
        // dipamd no longer serves this plugin's protocol: the binary in the CNI
        // bin dir is older than the daemon supports.
        Code::FailedPrecondition => codes::INCOMPATIBLE_VERSION,
        Code::PermissionDenied | Code::Unauthenticated => codes::PERMISSION_DENIED,
        _ => codes::INTERNAL,
    };
    let hint = match status.code() {
        Code::DeadlineExceeded => {
            " (dipamd did not answer in time; see its logs for the request id)"
        }
        Code::FailedPrecondition => " (install the dipam plugin that matches dipamd)",
        Code::Unknown => " (the connection to dipamd was lost mid-request)",
        Code::PermissionDenied => " (the socket only accepts root or the configured allowlist)",
        _ => "",
    };
    (
        code,
        format!(
            "{}: {:?}: {}{hint}",
            socket.display(),
            status.code(),
            status.message()
        ),
    )
}

/// A connection dipamd closed at accept: a uid it does not serve, or one over its budget.
fn refused(socket: &Path, uid: u32, why: dipam_proto::Refused, unavailable: u32) -> (u32, String) {
    match why {
        dipam_proto::Refused::NotAllowed => (
            codes::PERMISSION_DENIED,
            format!(
                "{} serves root and the uids in dipamd's --allow-uid (or --admin-uid) only; \
                 a member of its --socket-group may connect, nothing more. Is uid {uid} in \
                 --allow-uid? Add it there, or run the runtime as root",
                socket.display()
            ),
        ),
        dipam_proto::Refused::TooManyConnections => (
            unavailable,
            format!(
                "uid {uid} holds dipamd's --max-connections-per-uid connections to {} \
                 already; the runtime retries once some close (raise \
                 --max-connections-per-uid if this uid needs more at once)",
                socket.display()
            ),
        ),
    }
}

impl From<rscni_types::error::Error> for PluginError {
    fn from(e: rscni_types::error::Error) -> Self {
        use rscni_types::error::Error as E;
        match e {
            E::IncompatibleVersion(d) => Self::Version(d),
            E::FailedToDecode(d) => Self::Decode(d),
            E::InvalidNetworkConfig(d) => Self::Config {
                msg: d,
                details: String::new(),
            },
            E::InvalidEnvValue(d) => Self::InvalidEnv(d),
            other => Self::Cni {
                code: u32::from(&other),
                msg: other.msg().to_string(),
                details: other.details().to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_at_accept_is_155_or_11_and_never_spooled() {
        let refused = |why| PluginError::Refused {
            socket: "/run/dipam/dipam.sock".into(),
            uid: 1000,
            why,
        };
        let e = refused(dipam_proto::Refused::NotAllowed);
        let cni = e.to_cni(false);
        assert_eq!(cni.code, codes::PERMISSION_DENIED);
        assert!(cni.msg.contains("uid 1000"), "{cni:?}");
        assert!(
            cni.details.contains("Is uid 1000 in --allow-uid?"),
            "{cni:?}"
        );
        assert!(!e.daemon_unreachable(), "a refused DEL is not spooled");
        let e = refused(dipam_proto::Refused::TooManyConnections);
        assert_eq!(e.to_cni(false).code, codes::TRY_AGAIN_LATER);
        assert!(!e.daemon_unreachable());
    }

    #[test]
    fn status_unreachable_is_50_and_others_are_11() {
        let e = PluginError::Unreachable {
            socket: "/run/dipam/dipam.sock".into(),
            reason: "No such file or directory".into(),
            kind: Some(std::io::ErrorKind::NotFound),
            waited: None,
        };
        assert_eq!(e.to_cni(true).code, 50);
        let add = e.to_cni(false);
        assert_eq!(add.code, 11);
        assert!(add.details.contains("/run/dipam/dipam.sock"), "{add:?}");
        assert!(add.details.contains("socketPath"), "{add:?}");
    }

    #[test]
    fn grpc_codes_map_by_code_not_text() {
        let socket = PathBuf::from("/s");
        let m = |code| {
            PluginError::Rpc {
                socket: socket.clone(),
                status: tonic::Status::new(code, "anything at all"),
            }
            .to_cni(false)
            .code
        };
        assert_eq!(m(Code::Unavailable), 11);
        assert_eq!(m(Code::Unknown), 11);
        assert_eq!(m(Code::ResourceExhausted), 11);
        assert_eq!(m(Code::DeadlineExceeded), 11);
        assert_eq!(m(Code::FailedPrecondition), 1);
        assert_eq!(m(Code::PermissionDenied), codes::PERMISSION_DENIED);
        assert_eq!(m(Code::Internal), codes::INTERNAL);
    }

    #[test]
    fn missing_env_names_every_variable() {
        let e = PluginError::MissingEnv(vec!["CNI_NETNS", "CNI_IFNAME"]).to_cni(false);
        assert_eq!(e.code, 4);
        assert_eq!(
            e.msg,
            "required env variables [CNI_NETNS,CNI_IFNAME] missing"
        );
    }

    #[test]
    fn datapath_errors_have_their_own_codes_and_rollback_keeps_the_code() {
        let exists = PluginError::InterfaceExists {
            ifname: "eth0".into(),
            netns: "/var/run/netns/x".into(),
        };
        let e = exists.to_cni(false);
        assert_eq!(e.code, codes::INTERFACE_EXISTS);
        assert_eq!(e.msg, "interface eth0 already exists in /var/run/netns/x");
        assert!(e.details.contains("CNI_IFNAME=eth0"), "{e:?}");
        let rolled = PluginError::RolledBack {
            error: Box::new(PluginError::Datapath {
                step: "adding route 0.0.0.0/0 via 10.0.0.1".into(),
                reason: "Network is unreachable (os error 101)".into(),
            }),
            note: "rolled back: the IPAM allocation was released".into(),
        }
        .to_cni(false);
        assert_eq!(rolled.code, codes::DATAPATH);
        assert_eq!(rolled.msg, "adding route 0.0.0.0/0 via 10.0.0.1 failed");
        assert_eq!(
            rolled.details,
            "Network is unreachable (os error 101); rolled back: the IPAM allocation was released"
        );
        assert_eq!(
            PluginError::CheckFailed(vec!["a".into(), "b".into()])
                .to_cni(false)
                .details,
            "a; b"
        );
    }

    #[test]
    fn cni_errors_from_dipamd_pass_through_unchanged() {
        let e = PluginError::Cni {
            code: 999,
            msg: "no IP addresses available".into(),
            details: "range 10.0.0.0/30".into(),
        }
        .to_cni(false);
        assert_eq!(
            e,
            CniError {
                code: 999,
                msg: "no IP addresses available".into(),
                details: "range 10.0.0.0/30".into()
            }
        );
    }
}
