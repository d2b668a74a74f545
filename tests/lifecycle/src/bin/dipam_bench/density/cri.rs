//! A CRI stand-in that answers `RuntimeService/ListPodSandbox` with the density section's live
//! pods, for dipamd's runtime-aware GC (the only CRI call it makes, shim-server
//! gc/runtime/cri.rs). A stand-in because no runtime on this machine can hold 10,000 pod
//! sandboxes; the real containerd and CRI-O drive the same GC in tests/runtime_gc.rs and
//! tests/crio.rs. Every other method answers UNIMPLEMENTED, as a runtime that lacks it would.

use std::{
    collections::HashSet,
    convert::Infallible,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use k8s_cri::v1::{ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxState};
use tempfile::TempDir;
use tonic::codegen::{BoxFuture, Context, Poll, Service, http};

use super::super::Res;

/// The sandbox IDs the stand-in lists, and how many lists it has answered (each pass of
/// dipamd's runtime-aware GC asks once).
#[derive(Default)]
struct Sandboxes {
    ids: HashSet<String>,
    lists: u64,
}

type Listed = Arc<Mutex<Sandboxes>>;

#[derive(Clone)]
struct RuntimeService(Listed);

impl tonic::server::NamedService for RuntimeService {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

struct List(Listed);

impl tonic::server::UnaryService<ListPodSandboxRequest> for List {
    type Response = ListPodSandboxResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, tonic::Status>;

    fn call(&mut self, _: tonic::Request<ListPodSandboxRequest>) -> Self::Future {
        let ids: Vec<String> = self
            .0
            .lock()
            .map(|mut v| {
                v.lists += 1;
                v.ids.iter().cloned().collect()
            })
            .unwrap_or_default();
        Box::pin(async move {
            let items = ids
                .into_iter()
                .map(|id| PodSandbox {
                    id,
                    state: PodSandboxState::SandboxReady as i32,
                    ..PodSandbox::default()
                })
                .collect();
            Ok(tonic::Response::new(ListPodSandboxResponse { items }))
        })
    }
}

impl Service<http::Request<tonic::body::Body>> for RuntimeService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let listed = Arc::clone(&self.0);
        if req.uri().path() != "/runtime.v1.RuntimeService/ListPodSandbox" {
            let path = req.uri().path().to_owned();
            return Box::pin(async move {
                Ok(
                    tonic::Status::unimplemented(format!("{path}: not in the stand-in"))
                        .into_http(),
                )
            });
        }
        Box::pin(async move {
            // A node's list of 10,000 sandboxes is larger than tonic's 4 MiB default: lifted,
            // as real runtimes do (containerd's limit is 16 MiB).
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .max_encoding_message_size(64 << 20);
            Ok(grpc.unary(List(listed), req).await)
        })
    }
}

/// The stand-in, serving on a unix socket in a temp dir from a thread of its own until
/// dropped.
pub struct StandIn {
    dir: TempDir,
    listed: Listed,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    pub fn start() -> Res<Self> {
        let dir = super::super::data_dir("density-cri")?;
        let socket = dir.path().join("cri.sock");
        let listed: Listed = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let listener = {
            let _g = rt.enter();
            tokio::net::UnixListener::bind(&socket)
                .map_err(|e| format!("{}: {e}", socket.display()))?
        };
        let svc = RuntimeService(Arc::clone(&listed));
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Ok(Self {
            dir,
            listed,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("cri.sock")
    }

    /// Lists these sandboxes from now on, beside those already listed (a runtime lists a
    /// sandbox once its network is set up).
    pub fn add<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut v) = self.listed.lock() {
            v.ids.extend(ids.into_iter().map(str::to_owned));
        }
    }

    /// Lists these sandboxes no more (the runtime lost them, or removed them).
    pub fn forget<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut v) = self.listed.lock() {
            for id in ids {
                v.ids.remove(id);
            }
        }
    }

    /// How many lists the stand-in has answered so far.
    pub fn lists(&self) -> u64 {
        self.listed.lock().map(|v| v.lists).unwrap_or_default()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
