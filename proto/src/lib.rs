//! The dipam.v1 wire contract, generated from `dipam/v1/dipam.proto`. Nothing else lives here.

/// The protocol version this build speaks. Bump it when a request or reply gains meaning
/// that an older peer must know about; never remove support for an older version silently.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest client protocol a daemon built from this crate still serves.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

#[allow(clippy::all, clippy::pedantic, clippy::unwrap_used, missing_docs)]
pub mod v1 {
    tonic::include_proto!("dipam.v1");
}
