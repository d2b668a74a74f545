//! Step 6 of each point: the warm pool as docs/configuration.md sizes it for a dense node,
//! with pods arriving at a stated pace that does not wait for the pool (issue 40 §5: "a
//! pooled ADD p99 ≤ 0.2x of ptp + host-local at 2,500 live attachments, with the refills
//! keeping up").
//!
//! - **The pool**: dipamd restarted with `--pool-target` (`--density-pool`, default 16) and
//!   `--pool-max-above` (`--density-pool-max-above`, default 64): the table's row for a
//!   node of 250 pods, the densest it has. The cool-down is dipamd's default (60 s) and the
//!   demand of the last 10 s raises the target, as on a node. The pool is at rest (its
//!   target ready) before the first pod, as on a node that has run a while.
//! - **The pace**: bursts of `--density-pool-burst` pods (default 10) at a fixed period
//!   (`--density-pool-period-ms`, default 1000 ms, start to start), the ADDs of a burst one
//!   after another as soon as the previous returns, never waiting for the pool: the next
//!   burst starts on time whatever the pool holds (late only if the previous burst
//!   overran the period). That is 10 pods a second, several times what the kubelet reached
//!   on this 2-CPU machine with 250 pods created at once (run 23: create-to-Ready p50
//!   ~118 s), so refills that keep up here keep up on such a node; and a burst of 10 ADDs in
//!   tens of milliseconds is faster than any refill (one `host-local` exec each), so the
//!   pool, not the refiller, must absorb each burst and the refiller must make it good
//!   within the period. One ADD at a time, like the reference it is compared with (host-local
//!   exec'd directly, one at a time, step 2): the ADDs contend with the refills, not with
//!   each other.
//! - **Reported**: ADDs served from the pool and misses (dipamd's counters), the pooled ADD
//!   p50/p99 over every ADD of the run (a miss costs what it costs: it is what the pod
//!   paid), its p99 against the p99 of `host-local`'s ADD exec'd directly at the same N, the
//!   entries ready just before each burst (the fewest: the margin the refills kept), the
//!   target demand raised it to, and the DEL of each pod afterwards.
//!
//! The reference is `host-local` alone because this section runs without network
//! namespaces, so `ptp` cannot run: ptp + host-local costs at least host-local's exec, so the
//! ratio against host-local alone is the conservative one.

use std::time::{Duration, Instant};

use dipam_lifecycle::Runtime;
use serde_json::Value;

use super::super::{Opts, Res, check_stop, ms, summarize};
use super::{Kind, Node};

/// What the pooled step measured at one N.
#[derive(Default)]
pub struct PoolPoint {
    pub target: usize,
    pub max_above: usize,
    pub burst: usize,
    pub period_ms: u64,
    /// Start to serving of the dipamd with the pool (its entries are filled after).
    pub start_ms: f64,
    /// Every ADD of the paced run, in order, spawn to reap, and its container ID.
    pub add: Vec<f64>,
    pub add_cids: Vec<String>,
    pub del: Vec<f64>,
    pub hits: u64,
    pub misses: u64,
    /// Entries ready just before each burst.
    pub ready_before: Vec<u64>,
    /// The highest target seen (demand raises it, `--pool-max-above` caps the raise).
    pub raised_target: u64,
    /// How late the latest burst started against its schedule, ms.
    pub late_ms: f64,
    /// The paced run's wall-clock, first ADD to last reply, ms.
    pub run_ms: f64,
    /// The pooled dipamd's VmHWM after the run and its DELs: its start, the refills and the
    /// paced pods.
    pub peak_kib: u64,
}

impl PoolPoint {
    /// Whether the refills kept up: no ADD of the run found the pool empty.
    pub fn kept_up(&self) -> bool {
        self.misses == 0 && !self.add.is_empty()
    }

    pub fn fewest_ready(&self) -> u64 {
        self.ready_before.iter().copied().min().unwrap_or_default()
    }
}

/// The network's pool as `dipamctl status --json` shows it: (ready, target now), and the
/// node's (hits, misses).
fn pool_now(node: &Node) -> Res<((u64, u64), (u64, u64))> {
    let v = super::super::pool_status(&node.d.socket())?;
    let network = node.network();
    let mine = |f: &str| -> u64 {
        v["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["network"] == network.as_str())
            .filter_map(|p| p[f].as_u64())
            .sum()
    };
    let count = |f: &str| v[f].as_u64().unwrap_or_default();
    Ok((
        (mine("ready"), mine("target")),
        (count("hits"), count("misses")),
    ))
}

/// Waits until the pool holds `at_least` ready entries.
fn wait_ready(node: &Node, at_least: u64) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        check_stop()?;
        if pool_now(node)?.0.0 >= at_least {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the warm pool did not reach {at_least} ready entries within 300 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// dipamd restarted with the watermarks, the paced ADDs, their DELs; then restarted without
/// the pool again (which releases its entries).
pub fn pooled(rt: &Runtime, node: &mut Node, n: usize, opts: &Opts) -> Res<PoolPoint> {
    let mut pp = PoolPoint {
        target: opts.density_pool,
        max_above: opts.density_pool_max_above,
        burst: opts.density_pool_burst.max(1),
        period_ms: opts.density_pool_period_ms,
        ..PoolPoint::default()
    };
    let (t, m) = (pp.target.to_string(), pp.max_above.to_string());
    (_, pp.start_ms) = node.restart(rt, false, &["--pool-target", &t, "--pool-max-above", &m])?;
    // A pod shows dipamd the network's config (kept in the ledger's settings afterwards).
    let first = node.att(Kind::Pooled, n, usize::MAX >> 1);
    let r = rt
        .ipam(node.list(), 0, "ADD", &first, None)
        .map_err(|e| format!("pool ADD: {e}"))?;
    rt.ipam(node.list(), 0, "DEL", &first, Some(&r))
        .map_err(|e| format!("pool DEL: {e}"))?;
    // At rest: the target ready, as on a node that has run a while.
    wait_ready(node, pp.target as u64)?;
    let (_, (h0, m0)) = pool_now(node)?;
    let added = paced(rt, node, n, opts, &mut pp)?;
    let ((_, target), (h, m)) = pool_now(node)?;
    pp.raised_target = pp.raised_target.max(target);
    (pp.hits, pp.misses) = (h - h0, m - m0);
    for (a, r) in &added {
        check_stop()?;
        let t = Instant::now();
        rt.ipam(node.list(), 0, "DEL", a, Some(r))
            .map_err(|e| format!("pooled DEL: {e}"))?;
        pp.del.push(ms(t.elapsed()));
    }
    let atts: Vec<_> = added.into_iter().map(|(a, _)| a).collect();
    node.unlisted(&atts);
    pp.peak_kib = super::super::rss_kib(node.d.pid()).1;
    // Without the pool again: its entries are released after that start, in the background.
    node.restart(rt, false, &[])?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while node.reservations() != node.live.len() {
        check_stop()?;
        if Instant::now() > deadline {
            return Err(format!(
                "N={n}: the warm pool's entries were not released within 300 s of a start \
                 without it ({} reservations, {} live)",
                node.reservations(),
                node.live.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    super::super::progress!(
        "density N={n}: pooled ADD p50 {:.2} p99 {:.2} ms ({} hits, {} misses; fewest ready \
         before a burst {}, target raised to {})",
        summarize(&pp.add).p50,
        summarize(&pp.add).p99,
        pp.hits,
        pp.misses,
        pp.fewest_ready(),
        pp.raised_target
    );
    Ok(pp)
}

/// The paced run: `--density-pool-pods` ADDs in bursts, each burst on its schedule whatever the
/// pool holds. Returns the pods added, with their results (for their DELs).
fn paced(
    rt: &Runtime,
    node: &Node,
    n: usize,
    opts: &Opts,
    pp: &mut PoolPoint,
) -> Res<Vec<(dipam_lifecycle::Attachment, Value)>> {
    let period = Duration::from_millis(pp.period_ms);
    let mut added = Vec::with_capacity(opts.density_pool_pods);
    let t0 = Instant::now();
    for (b, chunk) in (0..opts.density_pool_pods)
        .collect::<Vec<_>>()
        .chunks(pp.burst)
        .enumerate()
    {
        check_stop()?;
        let due = t0 + period * b as u32;
        match due.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None => pp.late_ms = pp.late_ms.max(ms(due.elapsed())),
        }
        // What the burst meets: read before its first ADD (a dipamctl exec, in the gap).
        let ((ready, target), _) = pool_now(node)?;
        pp.ready_before.push(ready);
        pp.raised_target = pp.raised_target.max(target);
        for &i in chunk {
            let a = node.att(Kind::Pooled, n, i);
            let t = Instant::now();
            let r = rt
                .ipam(node.list(), 0, "ADD", &a, None)
                .map_err(|e| format!("pooled ADD: {e}"))?;
            pp.add.push(ms(t.elapsed()));
            pp.add_cids.push(a.container_id.clone());
            // Alive for dipamd's runtime-aware passes until its DEL.
            node.listed(std::slice::from_ref(&a));
            added.push((a, r));
        }
    }
    pp.run_ms = ms(t0.elapsed());
    Ok(added)
}
