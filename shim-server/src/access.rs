//! Who may talk to dipamd, and how much. The socket is root-only (0600) by default, or 0660
//! for one group (--socket-group); on top of the file mode, every request's peer credentials
//! (SO_PEERCRED, taken by the kernel at connect) must be root or an allowed uid: a DEL from
//! any local process would otherwise free a pod's address (aws-vpc-cni#3739, F20).
//!
//! Load: at most --max-concurrent operations run at once, of which some are held for DEL (a
//! burst of ADDs cannot starve cleanup); at most --max-queue wait, each at most a few seconds.
//! Beyond that dipamd answers RESOURCE_EXHAUSTED at once (the plugin's code 11, "try again
//! later") instead of queueing forever; memory stays bounded under any burst.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Status, transport::server::UdsConnectInfo};

use crate::error::ShimError;

/// The largest request dipamd decodes. A network config is a few KiB; this bounds what one
/// request can make dipamd hold.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Peer credential check, as a tonic interceptor.
#[derive(Debug, Clone, Default)]
pub struct PeerCheck {
    /// uids allowed besides root.
    pub allow_uids: Vec<u32>,
}

impl PeerCheck {
    pub fn check(&self, req: Request<()>) -> Result<Request<()>, Status> {
        let cred = req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred);
        match cred {
            Some(c) if c.uid() == 0 || self.allow_uids.contains(&c.uid()) => Ok(req),
            other => {
                let who = other.map_or_else(
                    || "unknown peer".to_owned(),
                    |c| format!("uid {} gid {} pid {:?}", c.uid(), c.gid(), c.pid()),
                );
                tracing::warn!(peer = %who, "request refused: not root and not in --allow-uid");
                Err(Status::permission_denied(format!(
                    "{who} may not use dipamd (root only, or --allow-uid)"
                )))
            }
        }
    }
}

/// What an operation needs from the admission control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Takes addresses: may wait behind releases.
    Add,
    /// Releases, checks and everything else: never starved by ADDs.
    Other,
}

/// Bounded concurrency with a reserve for releases.
#[derive(Debug)]
pub struct Admission {
    total: std::sync::Arc<Semaphore>,
    adds: std::sync::Arc<Semaphore>,
    waiting: AtomicUsize,
    max_queue: usize,
    max_wait: Duration,
}

/// Held for the duration of one operation.
pub struct Admitted {
    _total: OwnedSemaphorePermit,
    _add: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// `max` concurrent operations, a quarter of them (at least one) reserved for non-ADDs.
    pub fn new(max: usize, max_queue: usize, max_wait: Duration) -> Self {
        let max = max.max(2);
        let reserve = (max / 4).max(1);
        Self {
            total: std::sync::Arc::new(Semaphore::new(max)),
            adds: std::sync::Arc::new(Semaphore::new(max - reserve)),
            waiting: AtomicUsize::new(0),
            max_queue,
            max_wait,
        }
    }

    pub async fn admit(&self, class: Class) -> Result<Admitted, ShimError> {
        let busy = |why: &str| ShimError::Busy(why.to_owned());
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy("the request queue is full"));
        }
        let acquired = tokio::time::timeout(self.max_wait, async {
            let add = match class {
                Class::Add => Some(self.adds.clone().acquire_owned().await),
                Class::Other => None,
            };
            let total = self.total.clone().acquire_owned().await;
            (add, total)
        })
        .await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match acquired {
            Ok((add, Ok(total))) => Ok(Admitted {
                _total: total,
                _add: add.and_then(Result::ok),
            }),
            Ok(_) => Err(busy("shutting down")),
            Err(_) => Err(busy("no slot within the queueing limit")),
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(16, 256, Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dels_get_through_while_adds_are_saturated_and_overload_is_prompt() {
        let a = Admission::new(4, 3, Duration::from_millis(200));
        // 3 ADD slots (one of 4 reserved).
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(a.admit(Class::Add).await.unwrap());
        }
        // A 4th ADD waits, then gives up promptly.
        let started = std::time::Instant::now();
        assert!(matches!(a.admit(Class::Add).await, Err(ShimError::Busy(_))));
        assert!(started.elapsed() < Duration::from_secs(2));
        // A DEL still runs.
        let del = tokio::time::timeout(Duration::from_millis(100), a.admit(Class::Other)).await;
        assert!(matches!(del, Ok(Ok(_))));
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_at_once() {
        let a = std::sync::Arc::new(Admission::new(2, 2, Duration::from_secs(30)));
        let _x = a.admit(Class::Other).await.unwrap();
        let _y = a.admit(Class::Other).await.unwrap();
        let w1 = tokio::spawn({
            let a = a.clone();
            async move { a.admit(Class::Other).await.map(|_| ()) }
        });
        let w2 = tokio::spawn({
            let a = a.clone();
            async move { a.admit(Class::Other).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        assert!(matches!(
            a.admit(Class::Other).await,
            Err(ShimError::Busy(_))
        ));
        assert!(started.elapsed() < Duration::from_millis(50));
        w1.abort();
        w2.abort();
    }
}
