//! A CRI client over a runtime's unix socket, as kubelet drives a runtime: the part
//! [`crate::Containerd`] and [`crate::crio::Crio`] share. Every call runs on this guard's
//! runtime (callable from several threads at once), bounded by [`CALL_TIMEOUT`].

use std::{path::PathBuf, time::Duration};

use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandbox, PodSandboxConfig, PodSandboxMetadata,
    PodSandboxStatusRequest, PodSandboxStatusResponse, RemovePodSandboxRequest,
    RunPodSandboxRequest, StatusRequest, StatusResponse, StopPodSandboxRequest,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::{
    Status,
    transport::{Channel, Endpoint},
};

/// How long one CRI call may take (a RunPodSandbox waits on the CNI ADD and its retries).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Cri {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    /// The runtime's name, for messages.
    who: &'static str,
}

impl Cri {
    /// A client of the CRI socket `socket` (connected lazily: the runtime may not serve yet).
    pub fn unix(socket: PathBuf, who: &'static str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        // The URI is a placeholder: the connector dials the unix socket.
        let endpoint = Endpoint::from_static("http://[::1]:1");
        let channel = rt.block_on(async {
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                }
            }))
        });
        Self { rt, channel, who }
    }

    /// Runs a future on this guard's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The connection, for other CRI services (images).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A RuntimeService client (cheap: it shares the connection).
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    /// Runs `f` with a fresh client, bounded by [`CALL_TIMEOUT`].
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let client = self.runtime();
        let who = self.who;
        self.block_on(async move {
            match tokio::time::timeout(CALL_TIMEOUT, f(client)).await {
                Ok(r) => r.map(tonic::Response::into_inner),
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "no answer from {who} within {CALL_TIMEOUT:?}"
                ))),
            }
        })
    }

    /// CRI Status.
    pub fn status(&self) -> Result<StatusResponse, Status> {
        self.call(|mut c| async move { c.status(StatusRequest { verbose: false }).await })
    }

    /// Whether CRI's Status reports NetworkReady, and its reason and message when not.
    pub fn network_ready(&self) -> Result<(bool, String), Status> {
        let cond = self
            .status()?
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.r#type == "NetworkReady")
            .cloned()
            .unwrap_or_default();
        Ok((cond.status, format!("{}: {}", cond.reason, cond.message)))
    }

    /// RunPodSandbox with `config`: the CNI ADD happens inside it. Returns the sandbox ID.
    pub fn run_pod_sandbox(&self, config: PodSandboxConfig) -> Result<String, Status> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        self.call(|mut c| async move { c.run_pod_sandbox(req).await })
            .map(|r| r.pod_sandbox_id)
    }

    /// StopPodSandbox: the runtime sends a DEL with the netns and prevResult.
    pub fn stop_pod(&self, id: &str) -> Result<(), Status> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(|mut c| async move { c.stop_pod_sandbox(req).await })
            .map(drop)
    }

    /// RemovePodSandbox (containerd sends a second DEL, without netns or prevResult).
    pub fn remove_pod(&self, id: &str) -> Result<(), Status> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call(|mut c| async move { c.remove_pod_sandbox(req).await })
            .map(drop)
    }

    /// ListPodSandbox, every state.
    pub fn list_pods(&self) -> Result<Vec<PodSandbox>, Status> {
        self.call(|mut c| async move {
            c.list_pod_sandbox(ListPodSandboxRequest { filter: None })
                .await
        })
        .map(|r| r.items)
    }

    /// PodSandboxStatus (`verbose`: the runtime's own view in `info`).
    pub fn pod_status(&self, id: &str, verbose: bool) -> Result<PodSandboxStatusResponse, Status> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        };
        self.call(|mut c| async move { c.pod_sandbox_status(req).await })
    }

    /// The pod's IPv4 address as CRI reports it.
    pub fn pod_ip(&self, id: &str) -> Option<String> {
        let s = self.pod_status(id, false).ok()?;
        let ip = s.status?.network?.ip;
        (!ip.is_empty()).then_some(ip)
    }
}

/// A pod config named `name` in namespace `default`, with a unique UID, logging under
/// `log_dir`.
pub fn pod_config(name: &str, log_dir: &std::path::Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: crate::unique("uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.chars().take(63).collect(),
        log_directory: log_dir.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// The sandbox calls a runtime's guard (containerd's, CRI-O's) passes to its `cri` client
/// unchanged, as inherent methods: one definition for both runtimes. The runtime sends its
/// CNI DEL inside StopPodSandbox (with the netns and prevResult) and again inside
/// RemovePodSandbox (without them).
macro_rules! sandbox_calls {
    () => {
        /// StopPodSandbox: the runtime sends a DEL with the netns and prevResult.
        pub fn stop_pod(&self, id: &str) -> Result<(), tonic::Status> {
            self.cri.stop_pod(id)
        }

        /// RemovePodSandbox: the runtime sends a second DEL, without netns or prevResult.
        pub fn remove_pod(&self, id: &str) -> Result<(), tonic::Status> {
            self.cri.remove_pod(id)
        }

        /// ListPodSandbox, every state.
        pub fn list_pods(&self) -> Result<Vec<k8s_cri::v1::PodSandbox>, tonic::Status> {
            self.cri.list_pods()
        }

        /// The pod's IPv4 address as CRI reports it.
        pub fn pod_ip(&self, id: &str) -> Option<String> {
            self.cri.pod_ip(id)
        }
    };
}
pub(crate) use sandbox_calls;
