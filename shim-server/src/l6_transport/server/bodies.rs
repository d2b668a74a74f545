//! What a non-root uid's requests may make dipamd buffer (docs/cfp.md, "Threat model"). tonic
//! reads a request's whole body, up to [`MAX_REQUEST_BYTES`](crate::l1_leaves::access::MAX_REQUEST_BYTES),
//! before any handler (and so before the uid's in-flight quota, quota.rs) sees it: an allowed
//! uid that opened 64 streams on each of 8 connections and sent ~1.9 MiB on each held 995 MiB
//! of dipamd's memory, and its connection cap allowed about 3.9 GiB. This layer runs before
//! the body is read: a non-root uid has at most twice `--non-root-max-in-flight` requests open
//! at once, over all its connections (those over the quota itself still reach their handler,
//! which refuses them naming the flag); the next is answered RESOURCE_EXHAUSTED at once and
//! its body is never read (h2 then resets the stream and drops what it buffered). Root is not
//! counted: root's pods never wait on a non-root caller. A non-root request's body is read up
//! to [`NON_ROOT_REQUEST_BYTES`](crate::l1_leaves::access::NON_ROOT_REQUEST_BYTES), not up to the root
//! GC's larger limit.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
};

use tonic::{Status, transport::server::UdsConnectInfo};

/// Requests open per non-root uid.
#[derive(Debug, Default)]
struct Open {
    max: usize,
    held: Mutex<HashMap<u32, usize>>,
}

impl Open {
    fn try_take(self: &Arc<Self>, uid: u32) -> Option<Held> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(uid).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Held {
            open: Arc::clone(self),
            uid,
        })
    }
}

/// One open request's place, given back when its response is ready.
struct Held {
    open: Arc<Open>,
    uid: u32,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.open.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

/// Caps the requests each non-root uid has open at `max`.
#[derive(Debug, Clone)]
pub struct BodiesLayer {
    open: Arc<Open>,
}

impl BodiesLayer {
    pub fn new(max: usize) -> Self {
        Self {
            open: Arc::new(Open {
                max: max.max(1),
                held: Mutex::default(),
            }),
        }
    }
}

impl<S> tower::Layer<S> for BodiesLayer {
    type Service = Bodies<S>;

    fn layer(&self, inner: S) -> Bodies<S> {
        Bodies {
            inner,
            open: Arc::clone(&self.open),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Bodies<S> {
    inner: S,
    open: Arc<Open>,
}

/// The message of the RESOURCE_EXHAUSTED a request over the cap gets.
pub const OVER: &str = "this uid has twice --non-root-max-in-flight requests open at dipamd \
     already; its request was not read. Retry once one of them is answered";

type Request = tonic::codegen::http::Request<tonic::body::Body>;

impl<S, B> tower::Service<Request> for Bodies<S>
where
    S: tower::Service<Request, Response = tonic::codegen::http::Response<B>>,
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

    fn call(&mut self, req: Request) -> Self::Future {
        let uid = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map_or(u32::MAX, |c| c.uid());
        let (held, req) = if uid == 0 {
            (None, req)
        } else {
            match self.open.try_take(uid) {
                // Read up to a non-root request's size: dipamd decodes up to a root GC's
                // (access.rs), which no other caller may make it hold.
                Some(h) => (
                    Some(h),
                    req.map(|b| {
                        tonic::body::Body::new(http_body_util::Limited::new(
                            b,
                            crate::l1_leaves::access::NON_ROOT_REQUEST_BYTES,
                        ))
                    }),
                ),
                None => {
                    drop(req);
                    return Box::pin(async { Ok(Status::resource_exhausted(OVER).into_http()) });
                }
            }
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let r = call.await;
            drop(held);
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_holds_at_most_its_places_and_gets_them_back() {
        let open = Arc::new(Open {
            max: 2,
            held: Mutex::default(),
        });
        let a = open.try_take(1000).unwrap();
        let _b = open.try_take(1000).unwrap();
        assert!(open.try_take(1000).is_none());
        assert!(open.try_take(1001).is_some(), "another uid has its own");
        drop(a);
        assert!(open.try_take(1000).is_some());
    }
}
