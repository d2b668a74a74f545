//! The tonic services: each RPC opens a tracing span with the plugin's request id, runs its
//! module, and passes the outcome through the one error boundary (`ShimError::into_reply`).

use std::{future::Future, sync::Arc, time::Instant};

use dipam_proto::v1::{
    AdoptReply, AdoptRequest, AgentListReply, AgentListRequest, AgentRoleRequest, ClaimReply,
    ClaimRequest, CniReply, CniRequest, DoctorReply, DoctorRequest, ExplainReply, ExplainRequest,
    GcReply, GcRequest, ListAttachmentsReply, ListAttachmentsRequest, RuntimeGcReply,
    RuntimeGcRequest, StatusReply, StatusRequest, UnclaimRequest, admin_server::Admin,
    agent_server::Agent, cni_reply::Outcome, cni_server::Cni,
};
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    l1_leaves::access::{Caller, Class},
    l1_leaves::error::ShimError,
    l5_node::node::Node,
    l5_node::rpc,
};

pub struct Service(pub Arc<Node>);

/// The target of the one line each CNI call logs (how it ended): what operators grep for
/// and filter on (docs/troubleshooting.md shows it), kept as it was when this module sat at
/// the crate's root, wherever its file moves.
const CALL_LOG: &str = "dipam_shim::service";

impl Clone for Service {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// What one CNI call is about: for its log span and its history event.
struct Call {
    command: &'static str,
    request_id: String,
    container_id: String,
    ifname: String,
    network: String,
    /// `namespace/name` of the Kubernetes pod a CRI runtime named in CNI_ARGS, or `-`.
    pod: String,
}

impl Call {
    /// The values as sent, cut to their limits: they go into every log line of the call and
    /// key its history before the request is validated, and a 1 MiB container ID must not
    /// become a 1 MiB history key (the request itself is refused, validate.rs).
    fn of(command: &'static str, req: &CniRequest) -> Self {
        use crate::l1_leaves::validate::{clip, limits};
        Self {
            command,
            request_id: clip(&req.request_id, limits::REQUEST_ID),
            container_id: clip(&req.container_id, limits::CONTAINER_ID),
            ifname: clip(&req.ifname, limits::NAME),
            network: serde_json::from_slice::<serde_json::Value>(&req.stdin)
                .ok()
                .and_then(|v| v.get("name")?.as_str().map(|n| clip(n, limits::NETWORK)))
                .unwrap_or_default(),
            // Validated there (Kubernetes names, bounded): safe on a log line.
            pod: match crate::l1_leaves::cri_args::cri_pod(&req.container_id, &req.cni_args) {
                Ok(Some(p)) => format!("{}/{}", p.namespace, p.name),
                _ => "-".to_owned(),
            },
        }
    }

    /// The span every log line of one CNI call carries, keyed by the plugin's request id.
    fn span(&self) -> tracing::Span {
        info_span!(
            "cni",
            request_id = %self.request_id,
            command = self.command,
            container_id = %self.container_id,
            ifname = %self.ifname,
        )
    }
}

/// What an RPC module hands back to [`answer`]: the plugin's stdout, and for a DEL the
/// addresses it released (its stdout is empty), for the request's log line.
struct Done {
    stdout: Vec<u8>,
    released: Vec<String>,
}

impl From<Vec<u8>> for Done {
    fn from(stdout: Vec<u8>) -> Self {
        Self {
            stdout,
            released: Vec::new(),
        }
    }
}

impl From<rpc::del::Released> for Done {
    fn from(r: rpc::del::Released) -> Self {
        Self {
            stdout: Vec::new(),
            released: r.ips,
        }
    }
}

/// The container ID as log lines show it: the first 12 characters, as `crictl`, `docker ps`
/// and `podman ps` do (the full ID is on the call's span and in `dipamctl explain`).
fn short_id(id: &str) -> &str {
    id.char_indices().nth(12).map_or(id, |(i, _)| &id[..i])
}

/// Runs one CNI call: admission (`class`; STATUS takes none: it must stay cheap and answer
/// even when dipamd is saturated), the RPC module, then logs, metrics, history and the one
/// error boundary. The RPC gets its caller as an argument: what it may do is decided where
/// the request is prepared (`Node::prepare`).
///
/// Every call gets exactly one line saying how it ended: network, container (short ID), the
/// IPs it concerned (on DEL too), outcome and duration. ADD, DEL and CHECK at info; STATUS and
/// GC at debug when they succeed (kubelet-driven runtimes send STATUS every few seconds, and
/// what a GC frees is logged line by line where it is freed); every failure at warn.
async fn answer<F, T>(
    node: &Node,
    call: Call,
    caller: Caller,
    class: Option<Class>,
    f: F,
) -> Result<Response<CniReply>, Status>
where
    F: Future<Output = Result<T, ShimError>>,
    T: Into<Done>,
{
    let span = call.span();
    async move {
        // Counted until this call's end, answered or dropped (dipam_requests_in_flight).
        let _in_flight = node.core.events.in_flight(call.command);
        let started = Instant::now();
        let outcome = match class {
            // The slot is held until the operation is done.
            Some(c) => match node.admission.admit_for(c, caller).await {
                Ok(_slot) => f.await.map(Into::into),
                Err(e) => Err(e),
            },
            None => f.await.map(Into::into),
        };
        let took = started.elapsed();
        let ms = crate::l1_leaves::clock::log_ms(took);
        crate::l1_leaves::trim::touch();
        let mut event = serde_json::json!({
            "kind": "request", "op": call.command, "requestId": call.request_id,
            "network": call.network, "ifname": call.ifname, "durationMs": ms,
        });
        // Whose the container's history is (history.rs bounds each caller's share).
        if let Some(uid) = caller.recorded_uid() {
            event["uid"] = uid.into();
        }
        let container = short_id(&call.container_id);
        let network = call.network.as_str();
        let reply = match outcome {
            Ok(Done { stdout, released }) => {
                let result: serde_json::Value = if stdout.is_empty() {
                    serde_json::Value::Null
                } else {
                    serde_json::from_slice(&stdout).unwrap_or_default()
                };
                let ips = if released.is_empty() {
                    crate::l2_core::delegate::config::result_ips(&result)
                } else {
                    released
                };
                let ips = if ips.is_empty() {
                    "-".to_owned()
                } else {
                    ips.join(",")
                };
                if matches!(call.command, "STATUS" | "GC") {
                    debug!(target: CALL_LOG, network = %network, container = %container, elapsed_ms = ms, "ok");
                } else {
                    info!(target: CALL_LOG, network = %network, pod = %call.pod, container = %container, ips = %ips, elapsed_ms = ms, "ok");
                }
                event["outcome"] = "ok".into();
                if !result.is_null() {
                    event["result"] = result;
                }
                Ok(CniReply {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    outcome: Some(Outcome::Result(stdout)),
                    retired_link_taken: false,
                    replayed: None,
                    pending_commit: false,
                })
            }
            Err(e) => failed(node, &call, ms, e, &mut event),
        };
        let code = match &reply {
            Ok(CniReply {
                outcome: Some(Outcome::Error(err)),
                ..
            }) => err.code.to_string(),
            Ok(_) => "0".to_owned(),
            Err(status) => format!("grpc:{:?}", status.code()),
        };
        node.core.events.emit(crate::l1_leaves::events::Event::Request {
            op: call.command,
            code: &code,
            took,
            container_id: &call.container_id,
            record: &event,
        });
        reply.map(Response::new)
    }
    .instrument(span)
    .await
}

/// A failed call: its one warn line, its history entry's outcome, and its reply (a CNI error,
/// or a gRPC status when dipamd refuses the call itself).
fn failed(
    node: &Node,
    call: &Call,
    ms: f64,
    e: ShimError,
    event: &mut serde_json::Value,
) -> Result<CniReply, Status> {
    let network = call.network.as_str();
    let container = short_id(&call.container_id);
    node.denials.note_error(call.command, &e);
    let reply = e.into_reply();
    match &reply {
        Ok(CniReply {
            outcome: Some(Outcome::Error(err)),
            ..
        }) => {
            warn!(target: CALL_LOG, network = %network, pod = %call.pod, container = %container, elapsed_ms = ms, code = err.code, msg = %err.msg, details = %err.details, "failed");
            event["outcome"] = "error".into();
            event["code"] = err.code.into();
            event["msg"] = err.msg.clone().into();
            event["details"] = err.details.clone().into();
        }
        Err(status) => {
            warn!(target: CALL_LOG, network = %network, pod = %call.pod, container = %container, elapsed_ms = ms, status = ?status.code(), msg = status.message(), "refused");
            event["outcome"] = "refused".into();
            event["msg"] = status.message().into();
        }
        _ => {}
    }
    reply
}

/// One ADD, answered as `Add` answers it (with `replayed` set on success); `early` is the
/// AddEarly stream's sender, if it is one.
async fn add(
    node: &Node,
    caller: Caller,
    req: CniRequest,
    mut early: crate::l2_core::core::attach::Early,
) -> Result<CniReply, Status> {
    let call = Call::of("ADD", &req);
    let mut replayed = false;
    let run = async {
        let added = rpc::add::run(node, caller, req, &mut early).await?;
        replayed = added.replayed;
        Ok(added.result)
    };
    let mut reply = answer(node, call, caller, Some(Class::Add), run)
        .await?
        .into_inner();
    if matches!(reply.outcome, Some(Outcome::Result(_))) {
        reply.replayed = Some(replayed);
    }
    Ok(reply)
}

type ReplyStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<CniReply, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Cni for Service {
    /// The ADD runs in a task of its own, to its end, whether or not the plugin stays for the
    /// answer: dropped with this handler (the plugin killed by its runtime's timeout, or with
    /// its caller), it would abandon its delegate mid-ADD and let go of the key's lock while
    /// the delegate still works. A plugin that left has the ADD rolled back (rpc/add/mod.rs).
    /// Bounded: each task holds an admission slot until it ends (access.rs).
    async fn add(&self, r: Request<CniRequest>) -> Result<Response<CniReply>, Status> {
        let caller = Caller::of(&r);
        let req = r.into_inner();
        let node = Arc::clone(&self.0);
        // Lives as long as this handler: the ADD sees the plugin leave by its end.
        let waiting = Arc::new(());
        let early = crate::l2_core::core::attach::Early::default().watched(&waiting);
        let task = tokio::spawn(async move { add(&node, caller, req, early).await });
        let reply = task
            .await
            .map_err(|e| Status::internal(format!("ADD task: {e}")))?;
        drop(waiting);
        reply.map(Response::new)
    }

    type AddEarlyStream = ReplyStream;

    /// The ADD runs in a task of its own: it goes on to its commit (or its rollback) even if
    /// the plugin disconnects mid-stream. If it left before a result was offered, the ADD is
    /// rolled back as a unary one is; after, the plugin may have wired the pod with it, and
    /// the runtime's DEL after the failed ADD releases it.
    async fn add_early(
        &self,
        r: Request<CniRequest>,
    ) -> Result<Response<Self::AddEarlyStream>, Status> {
        let caller = Caller::of(&r);
        let req = r.into_inner();
        let node = Arc::clone(&self.0);
        let (tx, out) = tokio::sync::mpsc::channel(2);
        // Lives as long as the reply stream: the ADD sees the plugin leave by its end.
        let waiting = Arc::new(());
        let (early_tx, early_rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        let early = crate::l2_core::core::attach::Early::to(early_tx).watched(&waiting);
        tokio::spawn(async move {
            // Sends the early result, if the ADD offers one; done when it does, or when the
            // ADD ends without (its sender dropped with the ADD).
            let forward = async {
                if let Ok(result) = early_rx.await {
                    let early = CniReply {
                        protocol_version: dipam_proto::PROTOCOL_VERSION,
                        outcome: Some(Outcome::Result(result)),
                        retired_link_taken: false,
                        replayed: Some(false),
                        pending_commit: true,
                    };
                    let _ = tx.send(Ok(early)).await;
                }
            };
            let handler = add(&node, caller, req, early);
            let (last, ()) = tokio::join!(handler, forward);
            let _ = tx.send(last).await;
        });
        let replies = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(out),
            move |reply| {
                let _alive = Arc::clone(&waiting);
                reply
            },
        );
        Ok(Response::new(Box::pin(replies)))
    }
    async fn del(&self, r: Request<CniRequest>) -> Result<Response<CniReply>, Status> {
        let caller = Caller::of(&r);
        let req = r.into_inner();
        let call = Call::of("DEL", &req);
        let retired = req.retired_link.clone();
        let mut reply = answer(
            &self.0,
            call,
            caller,
            Some(Class::Other),
            rpc::del::run(&self.0, caller, req),
        )
        .await?;
        // The address is released: the retired veth can go whenever the worker gets to it.
        if let (Some(link), Some(td), Some(Outcome::Result(_))) = (
            retired.as_ref(),
            self.0.teardown.get(),
            reply.get_ref().outcome.as_ref(),
        ) {
            reply.get_mut().retired_link_taken = td.take(link);
        }
        Ok(reply)
    }
    async fn check(&self, r: Request<CniRequest>) -> Result<Response<CniReply>, Status> {
        let caller = Caller::of(&r);
        let req = r.into_inner();
        let call = Call::of("CHECK", &req);
        answer(
            &self.0,
            call,
            caller,
            Some(Class::Other),
            rpc::check::run(&self.0, caller, req),
        )
        .await
    }
    async fn gc(&self, r: Request<CniRequest>) -> Result<Response<CniReply>, Status> {
        let caller = Caller::of(&r);
        let peer = crate::l1_leaves::access::PeerPid::of(&r);
        let req = r.into_inner();
        let call = Call::of("GC", &req);
        answer(
            &self.0,
            call,
            caller,
            Some(Class::Other),
            rpc::gc::run(&self.0, caller, peer, req),
        )
        .await
    }
    async fn status(&self, r: Request<CniRequest>) -> Result<Response<CniReply>, Status> {
        let caller = Caller::of(&r);
        let req = r.into_inner();
        // A non-root caller's STATUS is admitted like its other verbs (its quotas, an ADD
        // slot): 1,024 unadmitted streams once ran 827 delegate execs at once. Root's is not:
        // the runtime polls it, and it must answer even when every slot is busy.
        let class = (!caller.is_root()).then_some(Class::Other);
        answer(
            &self.0,
            Call::of("STATUS", &req),
            caller,
            class,
            rpc::status::run(&self.0, caller, req),
        )
        .await
    }
}

/// Who may make an Admin or Agent call: root only (what the refusal names), or any caller
/// (the RPC itself narrows what a non-root caller sees).
enum Access {
    Admin(&'static str),
    Any,
}

/// A request of the Admin and Agent services: each carries the client's protocol version.
trait Versioned {
    fn protocol_version(&self) -> u32;
}

macro_rules! versioned {
    ($($t:ty),*) => {$(
        impl Versioned for $t {
            fn protocol_version(&self) -> u32 {
                self.protocol_version
            }
        }
    )*};
}
versioned!(
    StatusRequest,
    ExplainRequest,
    DoctorRequest,
    GcRequest,
    RuntimeGcRequest,
    ListAttachmentsRequest,
    AgentListRequest,
    AgentRoleRequest,
    ClaimRequest,
    UnclaimRequest
);

/// The sequence of every Admin and Agent call: the caller's access, then the protocol rule,
/// then the RPC module with the caller and the request, and its error through the one
/// boundary (`ShimError::into_status`).
async fn guarded<R, T, F, Fut>(r: Request<R>, access: Access, run: F) -> Result<Response<T>, Status>
where
    R: Versioned,
    F: FnOnce(Caller, R) -> Fut,
    Fut: Future<Output = Result<T, ShimError>>,
{
    let caller = Caller::of(&r);
    if let Access::Admin(what) = access {
        caller.require_admin(what)?;
    }
    protocol(r.get_ref().protocol_version())?;
    run(caller, r.into_inner())
        .await
        .map(Response::new)
        .map_err(ShimError::into_status)
}

#[tonic::async_trait]
impl Admin for Service {
    async fn get_status(&self, r: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        guarded(r, Access::Admin("dipamd's status"), |_, req| {
            rpc::admin::status::run(&self.0, req.stores)
        })
        .await
    }
    async fn explain(&self, r: Request<ExplainRequest>) -> Result<Response<ExplainReply>, Status> {
        guarded(r, Access::Admin("explain"), |_, req| {
            rpc::admin::explain::run(&self.0, req)
        })
        .await
    }

    async fn doctor(&self, r: Request<DoctorRequest>) -> Result<Response<DoctorReply>, Status> {
        guarded(r, Access::Admin("doctor"), |_, req| {
            rpc::admin::doctor::run(&self.0, req.skip_stores)
        })
        .await
    }

    async fn gc(&self, r: Request<GcRequest>) -> Result<Response<GcReply>, Status> {
        guarded(r, Access::Admin("the operator's GC"), |_, req| {
            let span = info_span!("admin", command = "gc");
            rpc::admin::gc::run(&self.0, req).instrument(span)
        })
        .await
    }

    async fn runtime_gc(
        &self,
        r: Request<RuntimeGcRequest>,
    ) -> Result<Response<RuntimeGcReply>, Status> {
        guarded(r, Access::Admin("the runtime-aware GC"), |_, req| {
            let span = info_span!("admin", command = "gc --from-runtime");
            rpc::admin::runtime_gc::run(&self.0, req).instrument(span)
        })
        .await
    }

    async fn adopt(&self, r: Request<AdoptRequest>) -> Result<Response<AdoptReply>, Status> {
        Caller::of(&r).require_admin("adoption")?;
        protocol(r.get_ref().protocol_version)?;
        let span = info_span!("admin", command = "adopt");
        rpc::admin::adopt::run(&self.0, r.into_inner())
            .instrument(span)
            .await
            .map(Response::new)
            .map_err(ShimError::into_status)
    }

    async fn list_attachments(
        &self,
        r: Request<ListAttachmentsRequest>,
    ) -> Result<Response<ListAttachmentsReply>, Status> {
        // Not admin-only: a non-root caller sees the attachments it created, and only those.
        guarded(r, Access::Any, |caller, req| {
            rpc::admin::attachments::run(&self.0, caller, req)
        })
        .await
    }
}

/// Every Agent call is root's.
const AGENT: Access = Access::Admin("the Agent service");

#[tonic::async_trait]
impl Agent for Service {
    type WatchStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<AgentListReply, Status>> + Send + 'static>,
    >;

    async fn list(&self, r: Request<AgentListRequest>) -> Result<Response<AgentListReply>, Status> {
        guarded(r, AGENT, |_, _| rpc::agent::list::run(&self.0)).await
    }

    async fn watch(
        &self,
        r: Request<AgentListRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        guarded(r, AGENT, |_, _| async {
            Ok(Box::pin(rpc::agent::watch::run(self.0.clone())) as Self::WatchStream)
        })
        .await
    }

    async fn allocate(
        &self,
        r: Request<AgentRoleRequest>,
    ) -> Result<Response<AgentListReply>, Status> {
        guarded(r, AGENT, |_, req| async move {
            let role = agent_role(req.role)?;
            let span = info_span!("agent", command = "allocate", role = %role);
            rpc::agent::set_role::run(self.0.clone(), role, true)
                .instrument(span)
                .await
        })
        .await
    }

    async fn release(
        &self,
        r: Request<AgentRoleRequest>,
    ) -> Result<Response<AgentListReply>, Status> {
        guarded(r, AGENT, |_, req| async move {
            let role = agent_role(req.role)?;
            let span = info_span!("agent", command = "release", role = %role);
            rpc::agent::set_role::run(self.0.clone(), role, false)
                .instrument(span)
                .await
        })
        .await
    }

    async fn claim(&self, r: Request<ClaimRequest>) -> Result<Response<ClaimReply>, Status> {
        guarded(r, AGENT, |_, req| {
            // Bounded before it names the span: the name is checked in full by the claim module.
            let span = info_span!("agent", command = "claim", claim = %crate::l1_leaves::validate::clip(&req.name, 63));
            rpc::agent::claim::claim(self.0.clone(), req).instrument(span)
        })
        .await
    }

    async fn unclaim(&self, r: Request<UnclaimRequest>) -> Result<Response<ClaimReply>, Status> {
        guarded(r, AGENT, |_, req| {
            let span = info_span!("agent", command = "unclaim", claim = %crate::l1_leaves::validate::clip(&req.name, 63));
            rpc::agent::claim::unclaim(self.0.clone(), req).instrument(span)
        })
        .await
    }
}

/// The protocol rule of every service (docs/cfp.md §5.2): a client older than
/// MIN_PROTOCOL_VERSION, or one that leaves the field unset (0), is refused with
/// FAILED_PRECONDITION; newer clients are served. The Cni service applies it where the
/// request is prepared (core/), with the same error.
fn protocol(version: u32) -> Result<(), Status> {
    if version < dipam_proto::MIN_PROTOCOL_VERSION {
        return Err(ShimError::ProtocolTooOld {
            client: version,
            min: dipam_proto::MIN_PROTOCOL_VERSION,
        }
        .into_status());
    }
    Ok(())
}

/// A role from the Agent service, bounded before it reaches a log span or an error message.
fn agent_role(role: String) -> Result<String, ShimError> {
    crate::l1_leaves::validate::bounded(
        "the role",
        role.as_bytes(),
        crate::l1_leaves::validate::limits::NAME,
        7,
    )?;
    Ok(role)
}
