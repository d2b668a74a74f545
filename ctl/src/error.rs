//! dipamctl's errors: one enum, `CtlError`, that every command returns, and the typed
//! errors of the commands that work locally (`install`, `man`, `recover`, `support-bundle`'s archive) that converge into it. The
//! one boundary that prints them and picks the exit status is `output::exit`; `code`,
//! `exit_status` and `to_json` say how. gRPC failures are told apart by their status code,
//! never by their message. The words are those the docs and the tests quote.
//!
//! A leaf of `ctl/`: it names the typed errors of the leaves it builds on (`kube.rs`,
//! `wrap.rs`, `compat.rs`), and every command depends on it, never the reverse.

use std::{io, path::PathBuf, process::ExitStatus};

use serde_json::{Value, json};

use super::{compat::Refusal, kube::KubeError, wrap::WrapError};

// The cniVersions the plugin accepts (dipam_proto::cni), named in a refusal.
use dipam_proto::cni::SUPPORTED_VERSIONS;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A command line that parses but asks for something impossible (a flag that needs
    /// another): exit status 2, as clap's own usage errors.
    #[error("{0}")]
    Usage(String),
    #[error("cannot reach dipamd at {}: {reason} ({})", socket.display(), unreachable_hint(*.denied))]
    Unreachable {
        socket: PathBuf,
        reason: String,
        /// The socket exists and this user may not use it: dipamd may well be running.
        denied: bool,
    },
    #[error("dipamd: {}", .0.message())]
    Rpc(tonic::Status),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
    /// `install`'s command line asks for something impossible: a usage error.
    #[error(transparent)]
    InstallArgs(#[from] ArgsError),
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error(transparent)]
    ManPage(#[from] PageError),
    #[error(transparent)]
    Recover(#[from] RecoverError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
}

/// Exit status 1: the command ran and failed (dipamd unreachable or refusing, a check failed,
/// a GC refused, a local command failed).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status 2: the command line is wrong (clap's usage errors, and `CtlError::Usage`).
pub const EXIT_USAGE: u8 = 2;

impl CtlError {
    /// The `code` of the error's JSON document: what kind of failure, for a script to branch
    /// on without reading the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Usage(_) => "usage",
            Self::Unreachable { .. } => "unreachable",
            Self::Rpc(_) => "rpc",
            Self::Input(_) => "input",
            Self::Failed(_)
            | Self::Install(_)
            | Self::ManPage(_)
            | Self::Recover(_)
            | Self::Archive(_) => "failed",
            Self::Output(_) => "output",
            Self::InstallArgs(_) => "usage",
        }
    }

    pub fn exit_status(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::InstallArgs(_) => EXIT_USAGE,
            _ => EXIT_FAILURE,
        }
    }

    /// `{"error": {"code", "message", "details"}}`: `message` is the line dipamctl prints
    /// without --json; `details` holds what a script may need beyond it (the socket and the
    /// cause for `unreachable`, the gRPC status code's name for `rpc`).
    pub fn to_json(&self) -> Value {
        let details = match self {
            Self::Unreachable { socket, reason, .. } => {
                json!({"socket": socket.display().to_string(), "reason": reason})
            }
            Self::Rpc(status) => json!({"grpcCode": grpc_code_name(status.code())}),
            _ => json!({}),
        };
        error_json(self.code(), &self.to_string(), details)
    }
}

pub(super) fn error_json(code: &str, message: &str, details: Value) -> Value {
    json!({"error": {"code": code, "message": message, "details": details}})
}

/// The canonical name of a gRPC status code (grpc/doc/statuscodes.md), as grpcurl and
/// every gRPC library print it.
fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// What to check when dipamd cannot be reached. EACCES means the socket is there (dipamd
/// most likely runs) and this user may not connect: asking whether dipamd runs would send
/// the operator the wrong way.
pub fn unreachable_hint(denied: bool) -> &'static str {
    if denied {
        "dipamd's socket allows only root unless dipamd runs with --socket-group GROUP (this user in GROUP) or --allow-uid UID: run as root, or ask for one of them"
    } else {
        "is dipamd running? is --socket right?"
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    FileName(ConflistError),
    #[error("cannot find the running executable to locate dipam: {0}")]
    NoExecutable(io::Error),
    #[error(
        "cannot run the plugin {}: {source} (pass the dipam binary built for this machine \
         with --plugin)",
        path.display()
    )]
    PluginRun { path: PathBuf, source: io::Error },
    #[error(
        "{} is not the dipam plugin: `--version` printed {line:?} ({status})",
        path.display()
    )]
    NotThePlugin {
        path: PathBuf,
        line: String,
        status: ExitStatus,
    },
    #[error("reading the plugin {}: {source}", path.display())]
    ReadPlugin { path: PathBuf, source: io::Error },
    #[error("reading {}: {source}", path.display())]
    ReadConflist { path: PathBuf, source: io::Error },
    /// A conflist dipam would refuse; `path` is the file given (--conflist, --wrap).
    #[error("{}: {source}", path.display())]
    Conflist {
        path: PathBuf,
        source: ConflistError,
    },
    /// This node's plugins or runtimes would fail the conflist (`compat.rs`).
    #[error("{}: {source}", path.display())]
    NodeCheck { path: PathBuf, source: Refusal },
    #[error("--unwrap installs nothing: run it through `run`")]
    UnwrapInstalls,
    #[error("{}: {source}", path.display())]
    Adopt { path: PathBuf, source: AdoptError },
    #[error("--output {} is FILE itself: use --in-place, which keeps a backup", .0.display())]
    OutputIsSource(PathBuf),
    #[error("{} is not a file name", .0.display())]
    NotAFileName(PathBuf),
    #[error("writing {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("--ranges-from-node {node}: {source}")]
    Kube { node: String, source: KubeError },
    #[error("not UTF-8: {0}")]
    NotUtf8(std::string::FromUtf8Error),
    #[error("--ranges-from-node needs --conflist or --wrap")]
    RangesWithoutConflist,
    #[error(transparent)]
    ManPage(#[from] PageError),
    #[error("installing the plugin into {}: {source}", dir.display())]
    PlacePlugin { dir: PathBuf, source: io::Error },
    #[error("installing {name} into {}: {source}", dir.display())]
    PlaceConflist {
        name: String,
        dir: PathBuf,
        source: io::Error,
    },
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

/// What is wrong with the conflist given to --wrap, --unwrap or --ranges-from-node.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error(transparent)]
    Io(io::Error),
    #[error("not valid JSON: {0}")]
    NotUtf8(std::str::Utf8Error),
    #[error(transparent)]
    Rewrite(#[from] WrapError),
    #[error("dipam would refuse the wrapped conflist: {0}")]
    WrappedRefused(ConflistError),
    #[error("dipam would refuse the conflist with the node's ranges: {0}")]
    RangesRefused(ConflistError),
}

/// Why `dipamctl install`'s command line asks for something impossible: a usage error.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "--ranges-from-node writes host-local's ranges into a conflist: pass the conflist \
         with --conflist (or the node's own with --wrap)"
    )]
    RangesWithoutConflist,
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("--socket {} is not UTF-8", .0.display())]
    Socket(PathBuf),
}

/// Why a conflist (or its file name) is refused: each says what dipam or a runtime would do
/// with it, and what to write instead.
#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    // The example is install::DEFAULT_NAME (a test holds them equal).
    #[error("--name {0:?} must be a plain file name, e.g. 10-dipam.conflist")]
    FileName(String),
    #[error(
        "--name {0:?} must end in .conflist: runtimes read other extensions as a single \
         plugin's config"
    )]
    Extension(String),
    #[error("not valid JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("a conflist must be a JSON object")]
    NotObject,
    #[error("cniVersion is missing")]
    NoVersion,
    #[error(
        "cniVersion {0:?} is not one dipam accepts ({supported})",
        supported = SUPPORTED_VERSIONS.join(", ")
    )]
    Version(String),
    #[error("name is missing")]
    NoName,
    #[error(
        "network name {0:?} is invalid (letters, digits, '_', '.', '-', starting with a \
         letter or digit)"
    )]
    Name(String),
    #[error("plugins is missing or empty (is this a single plugin's .conf?)")]
    NoPlugins,
    #[error("plugins[{0}].type is missing")]
    NoType(usize),
    #[error(
        "plugins[{0}]: dipam as the main plugin needs ipam.type: the real IPAM (host-local, \
         azure-vnet-ipam, ...)"
    )]
    MainWithoutIpam(usize),
    #[error(
        "plugins[{i}]: dipam as the IPAM of {kind} needs ipam.delegate.type: the real IPAM \
         (host-local, azure-vnet-ipam, ...)"
    )]
    NoDelegate { i: usize, kind: String },
    #[error("plugins[{i}]: socketPath must be a non-empty string, got {got}")]
    SocketPath { i: usize, got: Value },
    #[error("plugins[{i}]: spoolDir must be an absolute path, got {got}")]
    SpoolDir { i: usize, got: Value },
    #[error(
        "plugins[{i}]: timeoutSeconds must be a number of seconds between 0 and 3600, got {got}"
    )]
    Timeout { i: usize, got: Value },
    #[error(
        "no plugin uses dipam: set \"type\": \"dipam\" (dipam as the main plugin) or \"ipam\": \
         {{\"type\": \"dipam\", \"delegate\": {{...}}}} (the IPAM of another plugin)"
    )]
    NoDipam,
    #[error(
        "plugins[{0}]: host-local has no ranges (nor subnet): give it this node's own with \
         --ranges-from-node NODE, or write its ranges into the conflist"
    )]
    NoRanges(usize),
}

/// A man page that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the man page {}: {source}", path.display())]
pub struct PageError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Why `dipamctl recover` rebuilt nothing (or stopped part way: what it recorded stays).
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(transparent)]
    Store(#[from] dipam_state::StoreError),
    #[error(
        "the ledger in {} opens and holds {n} attachment(s); pass --force to add what the \
         delegate holds that it lacks",
        state_dir.display()
    )]
    NotEmpty { state_dir: PathBuf, n: usize },
    #[error("dipamd is running on {}; stop it first", .0.display())]
    Running(PathBuf),
    #[error(
        "no conflist to recover from: give --conflist FILE, the network's conflist (the record \
         of dipamd's paths names none: dipamd runs without --conflist and --conf-dir)"
    )]
    NoConflist,
    #[error("moving {} aside: {source}", state_dir.display())]
    MoveAside {
        state_dir: PathBuf,
        source: io::Error,
    },
    #[error(transparent)]
    CreateDir(io::Error),
    #[error(
        "moving the DEL spool {} back into {}: {source}",
        spool.display(),
        state_dir.display()
    )]
    SpoolBack {
        spool: PathBuf,
        state_dir: PathBuf,
        source: io::Error,
    },
    /// The conflist, or the delegate's store directory.
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Conflist(dipam_shim::l3_clients::agent::conflist::Missing),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Delegate(#[from] dipam_shim::l1_leaves::error::ShimError),
    #[error("dipamd cannot read {0}'s store; only host-local's can be recovered from")]
    Unreadable(String),
    #[error(transparent)]
    Utf8(#[from] std::string::FromUtf8Error),
}

/// Why `dipamctl support-bundle` wrote no archive (a part that fails is only noted in it).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The temporary file, or the archive renamed into place.
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: io::Error },
    #[error("adding {name}: {source}")]
    Add { name: String, source: io::Error },
    #[error(transparent)]
    Finish(io::Error),
}
