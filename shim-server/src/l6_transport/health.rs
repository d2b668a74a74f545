//! `grpc.health.v1.Health` (the standard gRPC health checking protocol,
//! grpc/grpc doc/health-checking.md), so that grpc_health_probe, grpcurl and agents' own gRPC
//! libraries can ask dipamd whether it can serve, without knowing dipam.v1.
//!
//! What each service name answers:
//! - `""` (the server), `dipam.v1.Cni` and `dipam.v1.Agent`: SERVING exactly when dipamd
//!   would answer a CNI STATUS with success (rpc/status.rs: the ledger takes commits, the
//!   delegate's store holds what the ledger records, the agent's addresses are established,
//!   the delegate answers VERSION and its own STATUS). For the network config, the agent's
//!   conflist when dipamd has one; otherwise the delegates' STATUS answers of the last few
//!   seconds (a runtime asks on every kubelet status poll).
//! - `dipam.v1.Admin`: SERVING whenever dipamd serves, ready or not: `dipamctl status` and
//!   `doctor` are how an operator learns why dipamd is not ready.
//! - NOT_SERVING for every name once dipamd stops (SIGTERM): watches then end with UNAVAILABLE,
//!   as `Agent.Watch` does, so that the graceful drain is not held by an open stream.
//!
//! Readiness is evaluated on every Check, at once when an agent address changes state, and
//! every [`RECHECK`] otherwise (a full disk, a delegate's STATUS turning bad); a Watch sends a
//! message only when its service's status changes.

use std::{pin::Pin, sync::Arc, time::Duration};

use dipam_proto::v1::{CniRequest, admin_server, agent_server, cni_server};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse, health_check_response::ServingStatus,
    health_server::Health,
};
use tracing::{info, warn};

use crate::{l1_leaves::access::Caller, l1_leaves::error::ShimError, l5_node::node::Node};

/// How often readiness is re-evaluated when nothing wakes the monitor. A delegate's own
/// STATUS is remembered for 5 s (rpc/status.rs), so this costs at most one delegate exec per
/// period.
pub const RECHECK: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    ready: bool,
    draining: bool,
}

/// The health state shared by the service, the monitor and the shutdown.
pub struct Monitor {
    node: Arc<Node>,
    state: watch::Sender<State>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("state", &*self.state.borrow())
            .finish()
    }
}

/// Whether dipamd would answer CNI STATUS with success now, and why not.
pub async fn readiness(node: &Node) -> Result<(), ShimError> {
    if let Some(base) = node
        .agent
        .config
        .as_ref()
        .and_then(|cfg| cfg.source.load().ok())
    {
        // The request a runtime would send for the agent's network: the same STATUS, run by
        // the same code, so the two answers cannot disagree.
        let req = CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: "health".into(),
            command: "STATUS".into(),
            stdin: serde_json::to_vec(&base.request)
                .map_err(|e| ShimError::Internal(e.to_string()))?,
            mode: base.mode as i32,
            ..CniRequest::default()
        };
        return crate::l5_node::rpc::status::run(node, Caller::ROOT, req)
            .await
            .map(drop);
    }
    crate::l5_node::rpc::status::node_checks(node)?;
    let failed = crate::l5_node::rpc::status::recent_delegate_failures(node);
    if !failed.is_empty() {
        return Err(ShimError::NotReady { missing: failed });
    }
    Ok(())
}

impl Monitor {
    /// Starts NOT_SERVING until the first evaluation: a probe that asks before it must not
    /// be told SERVING.
    pub fn new(node: Arc<Node>) -> Arc<Self> {
        Arc::new(Self {
            node,
            state: watch::channel(State {
                ready: false,
                draining: false,
            })
            .0,
        })
    }

    /// Evaluates readiness, publishes it (watchers hear of a change), and returns the state.
    pub async fn refresh(&self) -> bool {
        let outcome = readiness(&self.node).await;
        let ready = outcome.is_ok();
        let mut changed = false;
        self.state.send_if_modified(|s| {
            if s.draining || s.ready == ready {
                return false;
            }
            s.ready = ready;
            changed = true;
            true
        });
        if changed {
            match &outcome {
                Ok(()) => info!("health: SERVING"),
                Err(e) => warn!(reason = %e, "health: NOT_SERVING"),
            }
        }
        self.state.borrow().ready && !self.state.borrow().draining
    }

    /// dipamd is stopping: every name answers NOT_SERVING from now on, and watches end.
    pub fn drain(&self) {
        self.state.send_if_modified(|s| {
            if s.draining {
                return false;
            }
            s.draining = true;
            true
        });
    }

    /// Re-evaluates readiness whenever the agent's addresses change and every `every`, until
    /// dipamd stops.
    pub async fn run(self: Arc<Self>, every: Duration) {
        let mut agent = self.node.agent.subscribe();
        let mut state = self.state.subscribe();
        loop {
            let draining = state.borrow_and_update().draining;
            if draining {
                return;
            }
            self.refresh().await;
            tokio::select! {
                changed = agent.changed() => {
                    if changed.is_err() {
                        // The agent is gone with the node: only the period is left.
                        tokio::time::sleep(every).await;
                    }
                }
                () = tokio::time::sleep(every) => {}
                () = async {
                    let _ = state.wait_for(|s| s.draining).await.map(|_| ());
                } => return,
            }
        }
    }

    /// The tonic service over this monitor.
    pub fn service(self: &Arc<Self>) -> HealthService {
        HealthService(Arc::clone(self))
    }
}

/// The status of `service` in `state`, or `None` for a name dipamd does not serve.
fn status_of(service: &str, state: State) -> Option<ServingStatus> {
    let serving = |up: bool| {
        if up && !state.draining {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    };
    match service {
        "" | cni_server::SERVICE_NAME | agent_server::SERVICE_NAME => Some(serving(state.ready)),
        admin_server::SERVICE_NAME => Some(serving(true)),
        _ => None,
    }
}

fn reply(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

/// `grpc.health.v1.Health` over a [`Monitor`].
#[derive(Clone)]
pub struct HealthService(Arc<Monitor>);

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        // The protocol's answer for a name the server does not know; the name is not echoed
        // (it is the caller's, of any length).
        let Some(_) = status_of(&service, *self.0.state.borrow()) else {
            return Err(Status::not_found(
                "unknown service; dipamd serves \"\", dipam.v1.Cni, dipam.v1.Agent and \
                 dipam.v1.Admin",
            ));
        };
        if !self.0.state.borrow().draining {
            self.0.refresh().await;
        }
        let state = *self.0.state.borrow();
        let status = status_of(&service, state).unwrap_or(ServingStatus::ServiceUnknown);
        Ok(Response::new(reply(status)))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let service = request.into_inner().service;
        let rx = self.0.state.subscribe();
        // The protocol: the current status at once, then one message per change; an unknown
        // name gets SERVICE_UNKNOWN and the call stays open. When dipamd stops, NOT_SERVING,
        // then UNAVAILABLE (reconnect to the next dipamd).
        let stream = futures_util::stream::unfold(
            (rx, None::<ServingStatus>, false),
            move |(mut rx, last, ended)| {
                let service = service.clone();
                async move {
                    if ended {
                        return None;
                    }
                    loop {
                        let state = *rx.borrow_and_update();
                        let status =
                            status_of(&service, state).unwrap_or(ServingStatus::ServiceUnknown);
                        if last != Some(status) {
                            return Some((Ok(reply(status)), (rx, Some(status), false)));
                        }
                        if state.draining {
                            return Some((
                                Err(Status::unavailable(
                                    "dipamd is stopping; watch again once it serves",
                                )),
                                (rx, last, true),
                            ));
                        }
                        if rx.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dipam_state::MemStore;
    use futures_util::StreamExt;

    use super::*;

    fn node() -> (Arc<MemStore>, Arc<Node>) {
        let store = Arc::new(MemStore::new());
        let exec = crate::l2_core::delegate::Executor::new(Vec::new(), Duration::from_secs(1));
        (store.clone(), crate::testing::node_on(store, exec))
    }

    async fn check(svc: &HealthService, name: &str) -> Result<i32, tonic::Code> {
        svc.check(Request::new(HealthCheckRequest {
            service: name.into(),
        }))
        .await
        .map(|r| r.into_inner().status)
        .map_err(|s| s.code())
    }

    async fn next(s: &mut WatchStream) -> Option<Result<i32, tonic::Code>> {
        s.next()
            .await
            .map(|r| r.map(|m| m.status).map_err(|e| e.code()))
    }

    const SERVING: i32 = ServingStatus::Serving as i32;
    const NOT_SERVING: i32 = ServingStatus::NotServing as i32;

    #[tokio::test]
    async fn check_follows_status_for_every_name_and_admin_stays_up() {
        let (store, node) = node();
        let monitor = Monitor::new(node);
        let svc = monitor.service();
        for name in ["", "dipam.v1.Cni", "dipam.v1.Agent", "dipam.v1.Admin"] {
            assert_eq!(check(&svc, name).await, Ok(SERVING), "{name:?}");
        }
        assert_eq!(
            check(&svc, "grpc.health.v1.Health").await,
            Err(tonic::Code::NotFound)
        );

        // A full disk: STATUS fails with 50, so must the health of the server, Cni and Agent;
        // Admin keeps answering (it is how the operator learns why).
        store.set_fault(Some("no space left on device"));
        for name in ["", "dipam.v1.Cni", "dipam.v1.Agent"] {
            assert_eq!(check(&svc, name).await, Ok(NOT_SERVING), "{name:?}");
        }
        assert_eq!(check(&svc, "dipam.v1.Admin").await, Ok(SERVING));

        store.set_fault(None);
        assert_eq!(check(&svc, "").await, Ok(SERVING));
    }

    #[tokio::test]
    async fn a_failed_delegate_status_seen_by_the_runtime_makes_it_not_serving() {
        let (_store, node) = node();
        let monitor = Monitor::new(node.clone());
        let svc = monitor.service();
        node.status_cache.lock().unwrap().insert(
            "host-local".into(),
            (std::time::Instant::now(), Some("no addresses left".into())),
        );
        assert_eq!(check(&svc, "").await, Ok(NOT_SERVING));
        let why = format!("{:?}", readiness(&node).await.unwrap_err());
        assert!(
            why.contains("host-local") && why.contains("no addresses left"),
            "{why}"
        );
        node.status_cache.lock().unwrap().clear();
        assert_eq!(check(&svc, "").await, Ok(SERVING));
    }

    #[tokio::test]
    async fn watch_sends_changes_only_and_ends_unavailable_on_drain() {
        let (store, node) = node();
        let monitor = Monitor::new(node);
        let svc = monitor.service();
        monitor.refresh().await;
        let mut server = svc
            .watch(Request::new(HealthCheckRequest {
                service: String::new(),
            }))
            .await
            .unwrap()
            .into_inner();
        let mut admin = svc
            .watch(Request::new(HealthCheckRequest {
                service: "dipam.v1.Admin".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        let mut unknown = svc
            .watch(Request::new(HealthCheckRequest {
                service: "no.such.Service".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(next(&mut server).await, Some(Ok(SERVING)));
        assert_eq!(next(&mut admin).await, Some(Ok(SERVING)));
        assert_eq!(
            next(&mut unknown).await,
            Some(Ok(ServingStatus::ServiceUnknown as i32))
        );

        store.set_fault(Some("no space left on device"));
        // Two evaluations, one change: one message.
        monitor.refresh().await;
        monitor.refresh().await;
        assert_eq!(next(&mut server).await, Some(Ok(NOT_SERVING)));
        store.set_fault(None);
        monitor.refresh().await;
        assert_eq!(next(&mut server).await, Some(Ok(SERVING)));

        monitor.drain();
        // Draining: NOT_SERVING for every name, even a ready one, then UNAVAILABLE, then the
        // end; a Check says NOT_SERVING without re-evaluating.
        assert_eq!(next(&mut server).await, Some(Ok(NOT_SERVING)));
        assert_eq!(next(&mut server).await, Some(Err(tonic::Code::Unavailable)));
        assert_eq!(next(&mut server).await, None);
        assert_eq!(next(&mut admin).await, Some(Ok(NOT_SERVING)));
        assert_eq!(next(&mut admin).await, Some(Err(tonic::Code::Unavailable)));
        assert_eq!(
            next(&mut unknown).await,
            Some(Err(tonic::Code::Unavailable))
        );
        assert_eq!(check(&svc, "").await, Ok(NOT_SERVING));
        assert_eq!(check(&svc, "dipam.v1.Admin").await, Ok(NOT_SERVING));
    }

    #[tokio::test]
    async fn the_monitor_stops_when_dipamd_drains() {
        let (_store, node) = node();
        let monitor = Monitor::new(node);
        let run = tokio::spawn(monitor.clone().run(Duration::from_secs(3600)));
        // The first evaluation happens at once, not after the period.
        let mut rx = monitor.state.subscribe();
        rx.wait_for(|s| s.ready).await.unwrap();
        monitor.drain();
        run.await.unwrap();
    }
}
