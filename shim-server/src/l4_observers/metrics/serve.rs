//! Serving the exposition: one GET per connection over hyper, on TCP or a unix socket,
//! each connection bounded in time and in number.

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::info;

use super::{CONTENT_TYPE, Metrics};
use crate::l4_observers::metrics_listen::Unrequested;

/// How long a connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// One scrape: the exposition for GET (and HEAD), any path, since it is all there is.
fn answer(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut res = if req.method() == Method::GET || req.method() == Method::HEAD {
        let body = if req.method() == Method::GET {
            metrics.render()
        } else {
            String::new()
        };
        let mut res = Response::new(Full::new(Bytes::from(body)));
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(CONTENT_TYPE),
        );
        res
    } else {
        let mut res = Response::new(Full::new(Bytes::new()));
        *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        res
    };
    // One request per connection: a client reading to EOF (curl, a plain socket) gets it.
    res.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    res
}

/// Serves one connection: one request, then the connection is closed. `requested` is called
/// once its request head has arrived.
async fn connection<IO>(metrics: Arc<Metrics>, io: IO, requested: impl Fn() + Send + Sync + 'static)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        requested();
        let res = answer(&metrics, &req);
        async move { Ok::<_, Infallible>(res) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "metrics connection ended with an error");
    }
}

/// The longest one metrics connection lives, whatever the peer does: a scrape is one
/// request and one response of a few kilobytes; a reader that never drains the response
/// would otherwise hold its place in the listener's cap forever.
const CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves one connection within [`CONNECTION_LIFETIME`], and closes it early if, before its
/// request head has arrived, a newer connection needs its place (`room`).
async fn bounded<IO>(metrics: Arc<Metrics>, io: IO, room: Arc<Unrequested>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (id, evicted) = room.enter();
    let requested = {
        let room = Arc::clone(&room);
        move || room.leave(id)
    };
    let served = tokio::time::timeout(CONNECTION_LIFETIME, connection(metrics, io, requested));
    tokio::select! {
        outcome = served => if outcome.is_err() {
            tracing::debug!("metrics connection closed: it outlived its time");
        },
        // A sender dropped (the head arrived) disables this branch; only an eviction ends here.
        Ok(()) = evicted => {
            tracing::debug!("metrics connection closed before its request: a newer one needed its place");
        }
    }
    room.leave(id);
}

/// Serves metrics on a TCP address until the process ends, through `gate` (listen.rs: a cap
/// on connections, the shared descriptor budget, back-off on accept errors). At the cap, the
/// oldest connection that has not sent its request makes room for the new one
/// ([`Unrequested`]): when new ones waited instead, anyone holding idle connections to the
/// port kept every scrape waiting behind them (0 of 3 scrapes answered).
pub async fn serve_tcp(
    metrics: Arc<Metrics>,
    listener: tokio::net::TcpListener,
    gate: crate::l1_leaves::listen::Gate,
) {
    // Displayed, not debugged: an operator reads `address=127.0.0.1:9090`, never `Some(..)`.
    match listener.local_addr() {
        Ok(a) => info!(address = %a, "metrics on TCP"),
        Err(e) => info!(error = %e, "metrics on TCP (its address is unknown)"),
    }
    let room = Arc::new(Unrequested::default());
    loop {
        let stream = gate
            .accept_tcp_making_room(&listener, || room.evict_oldest())
            .await;
        tokio::spawn(bounded(Arc::clone(&metrics), stream, Arc::clone(&room)));
    }
}

/// Serves metrics on a unix socket until the process ends, through `gate`.
pub async fn serve_unix(
    metrics: Arc<Metrics>,
    listener: tokio::net::UnixListener,
    gate: crate::l1_leaves::listen::Gate,
) {
    let room = Arc::new(Unrequested::default());
    loop {
        let stream = gate.accept_unix(&listener).await;
        tokio::spawn(bounded(Arc::clone(&metrics), stream, Arc::clone(&room)));
    }
}
