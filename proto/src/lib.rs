//! The dipam.v1 wire contract, generated from `dipam/v1/dipam.proto`, and the few constants
//! the plugin and dipamd must agree on outside the messages: the CNI facts (`cni`: versions,
//! name rules, error codes) and the DEL spool's contract (`spool`). Nothing else lives here.

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

    /// The encoded `FileDescriptorSet` of dipam.v1 (proto/build.rs), for server reflection.
    #[cfg(feature = "server")]
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("dipam_v1_descriptor");
}

/// Connects to dipamd's unix socket. Shared by the plugin and dipamctl so that both dial the
/// daemon the same way.
pub async fn connect(
    socket: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = socket.to_owned();
    // The URI is required by the API but never used: the connector dials the unix socket.
    tonic::transport::Endpoint::from_static("http://dipamd.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}
