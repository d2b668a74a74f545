//! A container runtime's pod sandboxes, as the runtime-aware GC (gc/runtime/) and the
//! liveness scan (liveness.rs) both ask for them: the CRI client, or an in-memory twin in
//! tests.

use std::{future::Future, pin::Pin};

/// Why the runtime's list could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    /// No connection, or no answer in time.
    #[error("cannot reach the runtime at {endpoint}: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// The runtime answered ListPodSandbox with an error.
    #[error("the runtime at {endpoint} answered ListPodSandbox with {code}: {message}")]
    Answered {
        endpoint: String,
        code: String,
        message: String,
    },
}

/// The sandbox IDs a runtime lists: a boxed future, so the trait stays object-safe.
pub type Listing<'a> = Pin<Box<dyn Future<Output = Result<Vec<String>, ListError>> + Send + 'a>>;

/// A container runtime that lists its pod sandboxes: the CRI client ([`crate::l3_clients::gc::runtime::cri::CriClient`]), or
/// an in-memory twin in tests.
pub trait Sandboxes: Send + Sync {
    /// What dipamctl and the logs call it (the CRI endpoint).
    fn endpoint(&self) -> &str;
    /// The ID of every pod sandbox the runtime knows, in every state.
    fn list(&self) -> Listing<'_>;
}
