//! The metrics listeners, bound in the background: dipamd serves pods whether or not it can
//! bind them (metrics_listen.rs says why). A failed bind is logged (throttled), shown by
//! `dipamctl doctor` and the `dipam_metrics_listener_up` gauge, and tried again every
//! [`RETRY`](crate::l4_observers::metrics_listen::RETRY) until it succeeds.

use std::{fmt::Display, future::Future, net::SocketAddr, path::PathBuf, sync::Arc};

use tracing::{info, warn};

use crate::{
    l1_leaves::listen::Gate, l1_leaves::listen::Throttle, l4_observers::metrics::Metrics,
    l4_observers::metrics_listen::RETRY, l5_node::node::Node, l6_transport::server,
};

/// Tries `bind` until it succeeds, noting each outcome for doctor and the gauge.
async fn bound<L, B, F, E>(
    node: &Node,
    metrics: &Metrics,
    kind: &'static str,
    address: &str,
    bind: B,
) -> L
where
    B: Fn() -> F,
    F: Future<Output = Result<L, E>>,
    E: Display,
{
    let throttle = Throttle::default();
    let mut failed = false;
    loop {
        match bind().await {
            Ok(l) => {
                node.metrics_listeners.note(kind, address, Ok(()));
                metrics.listener_up(kind, true);
                if failed {
                    info!(listener = kind, address, "metrics listener bound at last");
                }
                return l;
            }
            Err(e) => {
                failed = true;
                node.metrics_listeners.note(kind, address, Err(&e));
                metrics.listener_up(kind, false);
                if let Some(n) = throttle.due() {
                    warn!(
                        listener = kind,
                        address,
                        error = %e,
                        suppressed = n,
                        retry_s = RETRY.as_secs(),
                        "metrics listener not bound (something else holds the address?); \
                         dipamd serves pods regardless and retries the bind"
                    );
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Starts the TCP metrics listener's task: bind (retried), then serve.
pub fn spawn_tcp(node: &Arc<Node>, metrics: &Arc<Metrics>, addr: SocketAddr, gate: Gate) {
    let (node, metrics) = (Arc::clone(node), Arc::clone(metrics));
    tokio::spawn(async move {
        let address = addr.to_string();
        let l = bound(&node, &metrics, "tcp", &address, || {
            tokio::net::TcpListener::bind(addr)
        })
        .await;
        crate::l4_observers::metrics::serve_tcp(metrics, l, gate).await;
    });
}

/// Starts the unix-socket metrics listener's task: bind (retried), then serve.
pub fn spawn_unix(node: &Arc<Node>, metrics: &Arc<Metrics>, path: PathBuf, gate: Gate) {
    let (node, metrics) = (Arc::clone(node), Arc::clone(metrics));
    tokio::spawn(async move {
        let address = path.display().to_string();
        let l = bound(&node, &metrics, "unix", &address, || {
            server::bind(&path, None)
        })
        .await;
        crate::l4_observers::metrics::serve_unix(metrics, l, gate).await;
    });
}
