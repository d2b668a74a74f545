//! The deadline layer server/mod.rs installs in front of every service: one status code,
//! DEADLINE_EXCEEDED, for a call whose `grpc-timeout` expires.

use std::future::Future;

use tonic::Status;

/// The message of the DEADLINE_EXCEEDED a call gets when its deadline expires.
pub const DEADLINE: &str = "the caller's deadline expired before dipamd answered; work dipamd \
     accepted (a claim, an unclaim, a role's allocation or release) still runs to its end: read \
     the outcome with List, Watch or the same call again";

/// Answers every call whose `grpc-timeout` expires with DEADLINE_EXCEEDED. tonic's own timer
/// answers CANCELLED ("Timeout expired"), while a client that enforces its deadline itself
/// (grpcio, Go) reports DEADLINE_EXCEEDED: the same expiry reached callers as either code,
/// depending on which timer fired first. This layer's timer starts before tonic's (tonic
/// calls the service it wraps, then arms its own, with the same duration) and is polled
/// first, so it always answers first: one code for one condition.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
}

impl<S, Req, B> tower::Service<tonic::codegen::http::Request<Req>> for Deadline<S>
where
    S: tower::Service<
            tonic::codegen::http::Request<Req>,
            Response = tonic::codegen::http::Response<B>,
        >,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = tonic::codegen::http::Response<B>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<Req>) -> Self::Future {
        // Armed here, before the inner call: never later than tonic's timer.
        let expiry = grpc_timeout(req.headers()).map(tokio::time::sleep);
        let call = self.inner.call(req);
        Box::pin(async move {
            let Some(expiry) = expiry else {
                return call.await;
            };
            tokio::select! {
                biased;
                r = call => r,
                () = expiry => Ok(Status::deadline_exceeded(DEADLINE).into_http()),
            }
        })
    }
}

/// The `grpc-timeout` header (gRPC over HTTP/2: up to 8 digits and a unit H, M, S, m, u, n).
fn grpc_timeout(headers: &tonic::codegen::http::HeaderMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        let h = |v: &str| {
            let mut m = tonic::codegen::http::HeaderMap::new();
            m.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&m)
        };
        assert_eq!(h("5m"), Some(std::time::Duration::from_millis(5)));
        assert_eq!(h("2S"), Some(std::time::Duration::from_secs(2)));
        assert_eq!(h("1H"), Some(std::time::Duration::from_secs(3600)));
        assert_eq!(h("100u"), Some(std::time::Duration::from_micros(100)));
        assert_eq!(h("x"), None);
        assert_eq!(h("123456789S"), None);
        assert_eq!(h("5q"), None);
    }
}
