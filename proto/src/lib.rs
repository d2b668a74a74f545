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
