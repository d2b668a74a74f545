//! The runtime's pod sandboxes through the CRI API (runtime.v1 RuntimeService.ListPodSandbox),
//! the API kubelet uses, on the runtime's unix socket: containerd's
//! (unix:///run/containerd/containerd.sock) or CRI-O's (unix:///var/run/crio/crio.sock).
//!
//! A connection per pass: a pass runs every `--runtime-gc-interval`, and a runtime that was
//! restarted in between is simply reached again. Every step is bounded in time, so a runtime
//! that hangs is a refusal ("unreachable"), never a pass that never ends.

use std::{path::PathBuf, time::Duration};

use super::{ListError, Listing, Sandboxes};

/// The generated CRI client and messages (build.rs, from cri/api.proto).
#[allow(clippy::all, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

use v1::{ListPodSandboxRequest, runtime_service_client::RuntimeServiceClient};

/// How long connecting may take.
const CONNECT: Duration = Duration::from_secs(5);
/// How long the runtime may take to list its sandboxes.
const ANSWER: Duration = Duration::from_secs(10);
/// Largest answer read: ~500 bytes per sandbox with its labels and annotations, so room for
/// tens of thousands, far more than a node runs.
const MAX_ANSWER: usize = 64 << 20;

/// A CRI runtime on a unix socket.
/// Why a --cri-endpoint is refused (the endpoint shown as the operator wrote it, bounded).
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "--cri-endpoint {0}: expected unix:///path/to/the/runtime.sock (e.g. \
         unix:///run/containerd/containerd.sock)"
    )]
    NotUnix(String),
    #[error("--cri-endpoint {0}: the socket path must be absolute (unix:///run/...)")]
    NotAbsolute(String),
}

#[derive(Debug, Clone)]
pub struct CriClient {
    endpoint: String,
    path: PathBuf,
}

impl CriClient {
    /// The runtime at `endpoint`, `unix://` and an absolute path, as kubelet's
    /// `--container-runtime-endpoint` names it. Anything else is refused with why.
    pub fn new(endpoint: &str) -> Result<Self, EndpointError> {
        let shown = || crate::l1_leaves::validate::shown(endpoint);
        let path = endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| EndpointError::NotUnix(shown()))?;
        if !path.starts_with('/') || path.len() > crate::l1_leaves::validate::limits::NETNS {
            return Err(EndpointError::NotAbsolute(shown()));
        }
        Ok(Self {
            endpoint: endpoint.to_owned(),
            path: PathBuf::from(path),
        })
    }

    async fn sandboxes(&self) -> Result<Vec<String>, ListError> {
        let unreachable = |reason: String| ListError::Unreachable {
            endpoint: self.endpoint.clone(),
            reason,
        };
        let path = self.path.clone();
        // The URI is required by the API but never used: the connector dials the socket.
        let target = tonic::transport::Endpoint::from_static("http://cri.invalid")
            .connect_timeout(CONNECT)
            .timeout(ANSWER);
        let channel =
            target.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }));
        let channel = tokio::time::timeout(CONNECT, channel)
            .await
            .map_err(|_| unreachable(format!("no connection within {}s", CONNECT.as_secs())))?
            .map_err(|e| unreachable(root_cause(&e)))?;
        let mut client = RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_ANSWER);
        let answer = tokio::time::timeout(
            ANSWER,
            client.list_pod_sandbox(ListPodSandboxRequest { filter: None }),
        )
        .await
        .map_err(|_| unreachable(format!("no answer within {}s", ANSWER.as_secs())))?;
        match answer {
            Ok(r) => Ok(r.into_inner().items.into_iter().map(|s| s.id).collect()),
            // The connection failed or broke (a status made here, from the transport's error,
            // carries it as its source; one the runtime sent never does): the runtime is not
            // there, or not a gRPC server.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) || (s.code() == tonic::Code::Unknown
                    && std::error::Error::source(&s).is_some()) =>
            {
                Err(unreachable(format!(
                    "{:?}: {}",
                    s.code(),
                    std::error::Error::source(&s)
                        .map(root_cause)
                        .unwrap_or_else(|| crate::l1_leaves::validate::clip(s.message(), 200))
                )))
            }
            Err(s) => Err(ListError::Answered {
                endpoint: self.endpoint.clone(),
                code: format!("{:?}", s.code()),
                message: if s.code() == tonic::Code::Unimplemented {
                    "it does not serve the CRI v1 API (runtime.v1.RuntimeService): containerd \
                     1.6 and later and CRI-O 1.20 and later do"
                        .into()
                } else {
                    crate::l1_leaves::validate::clip(s.message(), 200)
                },
            }),
        }
    }
}

impl Sandboxes for CriClient {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn list(&self) -> Listing<'_> {
        Box::pin(self.sandboxes())
    }
}

/// The innermost cause ("No such file or directory", "Connection refused"): what an operator
/// can act on.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    crate::l1_leaves::validate::clip(&dipam_proto::root_cause(e), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_unix_endpoint_with_an_absolute_path_is_accepted() {
        let c = CriClient::new("unix:///run/containerd/containerd.sock").unwrap();
        assert_eq!(c.endpoint(), "unix:///run/containerd/containerd.sock");
        assert_eq!(c.path, PathBuf::from("/run/containerd/containerd.sock"));
        for bad in [
            "/run/containerd/containerd.sock",
            "unix://run/containerd.sock",
            "tcp://127.0.0.1:1234",
            "",
        ] {
            let e = CriClient::new(bad).unwrap_err();
            assert!(e.to_string().starts_with("--cri-endpoint"), "{bad}: {e}");
        }
    }

    /// A pod sandbox as a runtime sends it (cri-api's fields 1-6).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Sent {
        #[prost(string, tag = "1")]
        id: String,
        #[prost(message, optional, tag = "2")]
        metadata: Option<Meta>,
        #[prost(int32, tag = "3")]
        state: i32,
        #[prost(int64, tag = "4")]
        created_at: i64,
        #[prost(map = "string, string", tag = "5")]
        labels: std::collections::HashMap<String, String>,
        #[prost(map = "string, string", tag = "6")]
        annotations: std::collections::HashMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Meta {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(string, tag = "2")]
        uid: String,
        #[prost(string, tag = "3")]
        namespace: String,
        #[prost(uint32, tag = "4")]
        attempt: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct SentList {
        #[prost(message, repeated, tag = "1")]
        items: Vec<Sent>,
    }

    /// What dipamd decoded of each sandbox before run 41: fields 1-4.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Before {
        #[prost(string, tag = "1")]
        id: String,
        #[prost(message, optional, tag = "2")]
        metadata: Option<Meta>,
        #[prost(int32, tag = "3")]
        state: i32,
        #[prost(int64, tag = "4")]
        created_at: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct BeforeList {
        #[prost(message, repeated, tag = "1")]
        items: Vec<Before>,
    }

    /// A runtime's reply for 10,000 sandboxes, with kubelet's labels and annotations: dipamd
    /// decodes their ids only, and holds a fraction of what decoding each sandbox's
    /// metadata held (what a pass keeps is the set of ids either way).
    #[test]
    fn a_reply_of_10000_sandboxes_decodes_into_their_ids_only() {
        use std::collections::HashSet;

        use prost::Message;

        use crate::testing::held;
        const N: usize = 10_000;
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let kv = |pairs: &[(&str, String)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect()
        };
        let sent = SentList {
            items: (0..N)
                .map(|i| {
                    let (name, uid) = (
                        format!("pod-{i}"),
                        format!("{i:08x}-1111-2222-3333-444455556666"),
                    );
                    Sent {
                        id: format!("{i:064x}"),
                        metadata: Some(Meta {
                            name: name.clone(),
                            uid: uid.clone(),
                            namespace: "default".into(),
                            attempt: 0,
                        }),
                        state: 0,
                        created_at: 1_700_000_000_000_000_000,
                        labels: kv(&[
                            ("io.kubernetes.pod.name", name),
                            ("io.kubernetes.pod.namespace", "default".into()),
                            ("io.kubernetes.pod.uid", uid),
                            ("app", "density".into()),
                        ]),
                        annotations: kv(&[
                            ("kubernetes.io/config.seen", "2026-11-29T18:00:00Z".into()),
                            ("kubernetes.io/config.source", "api".into()),
                        ]),
                    }
                })
                .collect(),
        }
        .encode_to_vec();
        let ids = |items: Vec<String>| items.into_iter().collect::<HashSet<String>>();
        let (before, before_peak) = held::measure(&rt, async {
            let r = BeforeList::decode(sent.as_slice()).unwrap();
            ids(r.items.into_iter().map(|s| s.id).collect())
        });
        let (now, now_peak) = held::measure(&rt, async {
            let r = v1::ListPodSandboxResponse::decode(sent.as_slice()).unwrap();
            ids(r.items.into_iter().map(|s| s.id).collect())
        });
        assert_eq!(before, now);
        assert_eq!(now.len(), N);
        eprintln!(
            "ListPodSandbox of {N} ({} B on the wire): decoded with the metadata (before) \
             {before_peak} B at the peak, the ids only {now_peak} B",
            sent.len()
        );
        assert!(now_peak < before_peak, "{now_peak} B vs {before_peak} B");
    }

    #[tokio::test]
    async fn a_missing_socket_and_a_socket_that_is_not_cri_are_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.sock");
        let c = CriClient::new(&format!("unix://{}", missing.display())).unwrap();
        match c.list().await {
            Err(ListError::Unreachable { reason, .. }) => {
                assert!(reason.contains("No such file"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // Something listens, and hangs up at once: no CRI answer.
        let path = dir.path().join("mute.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
        let c = CriClient::new(&format!("unix://{}", path.display())).unwrap();
        assert!(
            matches!(c.list().await, Err(ListError::Unreachable { .. })),
            "a socket that hangs up is not a runtime's answer: {:?}",
            c.list().await
        );
    }
}
