//! The warm pool's delegate execs yield to the pods' on the same network.
//!
//! Why: the pool's execs (a refill's ADD, an entry's release) run niced
//! ([`super::exec::BACKGROUND_NICE`]) so that a burst of pods served from the pool is not
//! slowed by the refills behind it. But `host-local` holds its store's lock (one per network:
//! `<dataDir>/<network>/lock`) for the whole of an exec, so a pod's DEL (or an ADD the pool
//! could not serve) that arrives while a refill holds that lock waits for it, and longer when
//! the refill is niced on a busy node. It cost the pool's 8-way throughput 18-22 %; un-nicing
//! the refills alone made it worse, this rule won it back (docs/performance.md, runs 28, 33).
//!
//! The rule: a pool exec does not start while a pod's ADD, CHECK or DEL exec is in flight on
//! its network; it waits until there is none, at most [`BACKGROUND_YIELD`], and one that has
//! waited that long runs at dipamd's own priority instead of niced (a stream of pod execs
//! must neither starve the pool nor meet a niced lock holder). Raising a niced exec's
//! priority once a pod's exec arrives would close the last window (a pod's exec arriving
//! while a refill already runs), but raising a nice value needs `CAP_SYS_NICE`
//! (setpriority(2)), which the shipped unit and DaemonSet do not grant.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// How long a pool exec waits for its network's pod execs to end before it runs anyway, at
/// dipamd's priority. Bounded, so that a network whose pods keep its delegate busy still gets
/// its pool refilled (and its surplus released); a refill is not on any pod's path, so a
/// second's delay costs no pod anything.
pub const BACKGROUND_YIELD: Duration = Duration::from_secs(1);

/// The pods' delegate execs in flight, per network, which the pool's execs wait for.
#[derive(Debug, Default)]
pub struct Yielding {
    /// Networks with at least one pod exec in flight, and how many. An entry lives only while
    /// its execs do, so the map is bounded by the requests dipamd holds at once.
    busy: Mutex<HashMap<String, usize>>,
    /// Woken whenever a network's last pod exec ends.
    quiet: Notify,
}

/// A pod's exec in flight on `network`; dropping it ends it.
#[derive(Debug)]
pub struct Foreground<'a> {
    yielding: &'a Yielding,
    network: String,
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .yielding
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = match busy.get_mut(&self.network) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => true,
            None => false,
        };
        if last {
            busy.remove(&self.network);
            drop(busy);
            self.yielding.quiet.notify_waiters();
        }
    }
}

impl Yielding {
    /// Notes a pod's exec on `network` until the guard is dropped.
    pub fn foreground(&self, network: &str) -> Foreground<'_> {
        *self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(network.to_owned())
            .or_default() += 1;
        Foreground {
            yielding: self,
            network: network.to_owned(),
        }
    }

    /// Whether a pod's exec is in flight on `network`.
    pub fn busy(&self, network: &str) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains_key(network)
    }

    /// Waits until no pod exec is in flight on `network`, at most `most`. Whether it became
    /// quiet (false: it waited `most` and a pod's exec still runs).
    pub async fn wait_quiet(&self, network: &str, most: Duration) -> bool {
        let deadline = Instant::now() + most;
        loop {
            // Registered before the check, so an end between the check and the wait is seen.
            let ended = self.quiet.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.busy(network) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, ended).await.is_err() {
                return !self.busy(network);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_its_networks_pod_execs_only_and_only_so_long() {
        let y = Yielding::default();
        let pod = y.foreground("a");
        let second = y.foreground("a");
        // Another network's pod execs do not hold it.
        assert!(y.wait_quiet("b", Duration::from_secs(5)).await);
        // Bounded: a pod exec that outlasts the bound lets it go, saying so.
        let t = Instant::now();
        assert!(!y.wait_quiet("a", Duration::from_millis(100)).await);
        assert!(t.elapsed() >= Duration::from_millis(100));
        // Quiet once the last of them ends, not the first.
        let waiter = async { y.wait_quiet("a", Duration::from_secs(5)).await };
        let ender = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(pod);
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert!(y.busy("a"), "one pod exec still runs");
            drop(second);
            Instant::now()
        };
        let t = Instant::now();
        let (quiet, last_ended) = tokio::join!(waiter, ender);
        assert!(quiet);
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert!(last_ended.elapsed() < Duration::from_secs(1));
        assert!(
            y.busy.lock().unwrap().is_empty(),
            "no entry outlives its execs"
        );
    }

    fn script(dir: &std::path::Path, name: &str, body: &str) -> super::super::Probe {
        super::super::Probe {
            path: super::super::exec::tests::script(dir, name, body),
            supported: Vec::new(),
        }
    }

    /// With real execs through the executor: a pool exec on a network where a pod's DEL is in
    /// flight starts only once that DEL has ended, and runs niced; one on another network
    /// does not wait; one that waited past the bound runs at dipamd's priority. Each script
    /// appends to one log as it starts and ends, and the pool's prints its nice value (field
    /// 19 of /proc/self/stat, read after its config, when it is set). Run at a nice value of
    /// 9 or more, niced and unniced are both 19 and only the order is checked.
    #[tokio::test]
    async fn a_pool_exec_waits_for_a_pods_exec_on_its_network_and_runs_unniced_past_the_bound() {
        use super::super::{Executor, Invocation, exec::BACKGROUND_NICE, exec::own_nice};
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("log");
        let pod = script(
            d.path(),
            "pod",
            &format!(
                "cat >/dev/null; echo \"$CNI_CONTAINERID start\" >>{0}; sleep \"$CNI_ARGS\"; \
                 echo \"$CNI_CONTAINERID end\" >>{0}",
                log.display()
            ),
        );
        let pool = script(
            d.path(),
            "pool",
            &format!(
                "cat >/dev/null; echo \"$CNI_CONTAINERID start\" >>{0}; cut -d' ' -f19 /proc/$$/stat",
                log.display()
            ),
        );
        let mut ex = Executor::new(Vec::new(), Duration::from_secs(10));
        ex.background_yield = Duration::from_secs(10);
        let inv = |command: &str, id: &str, network: &str, sleep: &str, background| Invocation {
            command: command.into(),
            container_id: id.into(),
            network: network.into(),
            args: sleep.into(),
            background,
            ..Invocation::default()
        };
        let nice_of = |out: super::super::Output| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<i32>()
                .unwrap()
        };
        let niced = (own_nice() + BACKGROUND_NICE).min(19);
        // A pod's DEL of 2 s on n1 (long, so that a loaded machine still starts the pool's
        // execs within it); the pool's ADDs on n1 and n2 start 0.1 s into it.
        let (del, in_n1, in_n2) = (
            inv("DEL", "pod-del", "n1", "2", false),
            inv("ADD", "pool-n1", "n1", "", true),
            inv("ADD", "pool-n2", "n2", "", true),
        );
        let del = ex.call("pod", &pod, &del);
        let pools = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tokio::join!(
                ex.call("pool", &pool, &in_n1),
                ex.call("pool", &pool, &in_n2),
            )
        };
        let (del, (n1, n2)) = tokio::join!(del, pools);
        del.unwrap();
        assert_eq!(nice_of(n1.unwrap()), niced, "after the pod's exec, niced");
        assert_eq!(nice_of(n2.unwrap()), niced);
        let order = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = order.lines().collect();
        let at = |l: &str| lines.iter().position(|x| *x == l).unwrap();
        assert!(
            at("pool-n1 start") > at("pod-del end"),
            "the pool's exec on n1 started while the pod's DEL ran: {order:?}"
        );
        assert!(
            at("pool-n2 start") < at("pod-del end"),
            "another network's pool exec waited: {order:?}"
        );
        // A pod's exec that outlasts the bound (3 s against 0.3): the pool's runs anyway, at
        // dipamd's own priority, before the pod's ends.
        std::fs::remove_file(&log).unwrap();
        ex.background_yield = Duration::from_millis(300);
        let (check, release) = (
            inv("CHECK", "pod-check", "n1", "3", false),
            inv("DEL", "pool-late", "n1", "", true),
        );
        let long = ex.call("pod", &pod, &check);
        let late = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ex.call("pool", &pool, &release).await
        };
        let (long, late) = tokio::join!(long, late);
        long.unwrap();
        assert_eq!(
            nice_of(late.unwrap()),
            own_nice(),
            "past the bound, unniced"
        );
        let order = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = order.lines().collect();
        let at = |l: &str| lines.iter().position(|x| *x == l).unwrap();
        assert!(at("pool-late start") < at("pod-check end"), "{order:?}");
    }
}
