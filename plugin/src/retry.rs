//! Waiting for dipamd to serve again, within the call's deadline.
//!
//! dipamd is not always there for the few hundred milliseconds of a restart: a `systemctl
//! restart` or a DaemonSet rolling update installs the new binary, sends SIGTERM (dipamd
//! unlinks its socket, drains what it has in flight and exits), and starts the new dipamd,
//! which opens its ledger and replays before it binds the socket again. A connect in that
//! window finds no socket (ENOENT) or a stale one (ECONNREFUSED); a connect while dipamd is
//! busy, or while an unprivileged member of `--socket-group` floods it with connects, finds
//! the listen backlog full (EAGAIN: a non-blocking unix connect does not wait). Answering
//! those with code 11 at once failed calls that would have been served a moment later (a
//! loop of ADD+DEL across five restarts lost 8 of 3,312 calls; docs/cfp.md §8.4). So a call
//! dipamd did not serve is tried again, with a growing pause, until the call's deadline
//! (the config's `timeoutSeconds`).
//!
//! Trying again is safe for every verb, even when a call was cut off after dipamd had
//! started on it: a repeated ADD of a recorded attachment is answered from the ledger, DEL
//! and GC are idempotent (spec §DEL, §GC), CHECK and STATUS change nothing. What is never
//! tried again is an answer: a CNI error, a gRPC status dipamd sent, a refusal at accept,
//! a socket this caller may not open (EACCES).

use std::{
    future::Future,
    time::{Duration, Instant},
};

use crate::error::PluginError;

/// The first pause between tries: a restart usually serves again within a few hundred
/// milliseconds, and a full backlog drains within a few.
pub const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause: a plugin waiting for a dipamd that takes seconds to start connects
/// about twice a second, which costs dipamd nothing.
pub const MAX_PAUSE: Duration = Duration::from_millis(500);

/// A call's time: when it must be over, and until when a call dipamd did not serve is tried
/// again (never later than the deadline).
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub deadline: Instant,
    pub retry_until: Instant,
    /// A STATUS's gap ([`Budget::retrying_for`]): while a dipamd is seen starting or
    /// draining, the wait goes on, up to the deadline, until this long after it was last seen.
    pub gap: Option<Duration>,
}

impl Budget {
    /// `timeout` from now, tried again until then.
    pub fn new(timeout: Duration) -> Self {
        let deadline = Instant::now() + timeout;
        Self {
            deadline,
            retry_until: deadline,
            gap: None,
        }
    }

    /// The same deadline, tried only once (a DEL that the spool can take instead).
    pub fn once(self) -> Self {
        Self {
            retry_until: Instant::now(),
            ..self
        }
    }

    /// The same deadline, tried again for `gap` from now, and for as long as a dipamd is
    /// starting or draining (until `gap` after it was last seen so): a STATUS, which a runtime
    /// asks on every status poll and must not block on a dipamd that stays down, nor fail
    /// while one comes up, however long a loaded node makes its start.
    pub fn retrying_for(self, gap: Duration) -> Self {
        Self {
            retry_until: self.deadline.min(Instant::now() + gap),
            gap: Some(gap),
            ..self
        }
    }

    /// What is left of the deadline.
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// Runs `attempt` until it succeeds, fails in a way trying again cannot change, or
/// `budget` allows no further try. `judge` sees each failure first (the non-root caller's
/// refusal at accept is found there) and says what it is. `starting` says whether a dipamd
/// is starting or draining now; it is asked only of a budget with a gap, when the gap runs
/// out. The error returned is the last try's, saying how long dipamd was waited for.
pub async fn until_served<T, F, Fut>(
    budget: Budget,
    mut attempt: F,
    judge: impl Fn(PluginError) -> PluginError,
    starting: impl Fn() -> bool,
) -> Result<T, PluginError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, PluginError>>,
{
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    let mut retry_until = budget.retry_until;
    loop {
        let e = match attempt(budget.left()).await {
            Ok(v) => return Ok(v),
            Err(e) => judge(e),
        };
        if let Some(gap) = budget.gap
            && e.dipamd_may_serve_again()
            && Instant::now() + pause >= retry_until
            && starting()
        {
            // Seen starting: the gap counts again from the next try.
            retry_until = budget.deadline.min(Instant::now() + pause + gap);
        }
        if !e.dipamd_may_serve_again() || Instant::now() + pause >= retry_until {
            // A failure at the first try waited for nothing: said as it is.
            let waited = started.elapsed();
            return Err(if waited >= FIRST_PAUSE {
                e.waited(waited)
            } else {
                e
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, path::PathBuf};

    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn gone(kind: std::io::ErrorKind) -> PluginError {
        PluginError::Unreachable {
            socket: PathBuf::from("/run/dipam/dipam.sock"),
            reason: "No such file or directory (os error 2)".into(),
            kind: Some(kind),
            waited: None,
        }
    }

    #[test]
    fn a_missing_refused_or_full_socket_is_tried_again_until_it_serves() {
        for kind in [
            std::io::ErrorKind::NotFound,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::WouldBlock,
        ] {
            let tries = Cell::new(0);
            let got = rt().block_on(until_served(
                Budget::new(Duration::from_secs(5)),
                |_| {
                    tries.set(tries.get() + 1);
                    let n = tries.get();
                    async move { if n < 4 { Err(gone(kind)) } else { Ok(n) } }
                },
                |e| e,
                || false,
            ));
            assert_eq!(got.unwrap(), 4, "{kind:?}");
        }
    }

    #[test]
    fn an_answer_or_a_forbidden_socket_is_never_tried_again() {
        let forbidden = gone(std::io::ErrorKind::PermissionDenied);
        let answered = PluginError::Cni {
            code: 7,
            msg: "bad".into(),
            details: String::new(),
        };
        let sent = PluginError::Rpc {
            socket: PathBuf::from("/s"),
            status: tonic::Status::resource_exhausted("quota"),
        };
        for e in [forbidden, answered, sent] {
            let tries = Cell::new(0);
            let want = e.to_cni(false).code;
            let once = std::sync::Mutex::new(Some(e));
            let got = rt().block_on(until_served(
                Budget::new(Duration::from_secs(5)),
                |_| {
                    tries.set(tries.get() + 1);
                    let e = once.lock().unwrap().take().unwrap();
                    async move { Err::<(), _>(e) }
                },
                |e| e,
                || false,
            ));
            assert_eq!(got.unwrap_err().to_cni(false).code, want);
            assert_eq!(tries.get(), 1);
        }
    }

    #[test]
    fn the_wait_ends_at_the_deadline_with_the_last_reason_and_how_long() {
        let started = Instant::now();
        let e = rt()
            .block_on(until_served(
                Budget::new(Duration::from_millis(400)),
                |_| async { Err::<(), _>(gone(std::io::ErrorKind::NotFound)) },
                |e| e,
                || false,
            ))
            .unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_millis(900), "{took:?}");
        assert!(took >= Duration::from_millis(150), "{took:?}");
        let cni = e.to_cni(false);
        assert_eq!(cni.code, 11);
        assert!(cni.details.contains("No such file or directory"), "{cni:?}");
        assert!(cni.details.contains("waited"), "{cni:?}");
        // Tried once only: no wait at all.
        let e = rt()
            .block_on(until_served(
                Budget::new(Duration::from_secs(5)).once(),
                |_| async { Err::<(), _>(gone(std::io::ErrorKind::NotFound)) },
                |e| e,
                || false,
            ))
            .unwrap_err();
        assert!(!e.to_cni(false).details.contains("waited"), "{e:?}");
    }

    #[test]
    fn a_status_waits_past_its_gap_only_while_a_dipamd_is_starting() {
        // dipamd starts for 600 ms (longer than the 200 ms gap), then serves.
        let started = Instant::now();
        let up = Duration::from_millis(600);
        let got = rt().block_on(until_served(
            Budget::new(Duration::from_secs(5)).retrying_for(Duration::from_millis(200)),
            |_| async move {
                if started.elapsed() < up {
                    Err(gone(std::io::ErrorKind::NotFound))
                } else {
                    Ok(())
                }
            },
            |e| e,
            || started.elapsed() < up,
        ));
        assert!(got.is_ok(), "{got:?}");
        // No dipamd starting: "not ready" once the gap is over, long before the deadline.
        let started = Instant::now();
        let got = rt().block_on(until_served(
            Budget::new(Duration::from_secs(5)).retrying_for(Duration::from_millis(200)),
            |_| async { Err::<(), _>(gone(std::io::ErrorKind::NotFound)) },
            |e| e,
            || false,
        ));
        assert_eq!(got.unwrap_err().to_cni(false).code, 11);
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "{:?}",
            started.elapsed()
        );
        // One that stays starting is waited for until the deadline, and no longer.
        let started = Instant::now();
        let got = rt().block_on(until_served(
            Budget::new(Duration::from_millis(900)).retrying_for(Duration::from_millis(200)),
            |_| async { Err::<(), _>(gone(std::io::ErrorKind::ConnectionRefused)) },
            |e| e,
            || true,
        ));
        assert_eq!(got.unwrap_err().to_cni(false).code, 11);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(500), "{took:?}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
    }
}
