//! How many entries a network's pool should hold: watermarks, the way the ENI IPAMs size
//! their pools (docs/cfp.md §7.7, "Sizing"), not a constant.
//!
//! - `target` (Cilium's `pre-allocate`, AWS's `WARM_IP_TARGET`): free pooled addresses kept
//!   ready;
//! - `minimum` (Cilium's `min-allocate`, AWS's `MINIMUM_IP_TARGET`): addresses the network
//!   holds in all, pods plus pool;
//! - `max_above` (Cilium's `max-above-watermark`): how far above the target demand may raise
//!   it: the ADDs of the last [`DEMAND_WINDOW`] are added to the target up to this much, so a
//!   burst is met by one cycle of refills;
//! - `release_after` (Cilium's `excess-ip-release-delay`; AWS ipamd also frees warm addresses
//!   above its targets): entries above the target are released once they have been surplus
//!   this long.
//!
//! Cilium's deficit is `preallocate − (available − used)`; here `available − used` is the
//! pool's own entries (ready and being made), so the deficit is `target − pooled`, raised to
//! `minimum − (in use + pooled)` when that is larger.
//!
//! The range guard: refills stop while the delegate's range has fewer free addresses than the
//! target, so a pool never takes the last addresses pods (or the agent) still need from the
//! delegate; and an ADD the delegate refuses takes a pooled entry (rpc/add/mod.rs).

use std::{collections::VecDeque, time::Duration, time::Instant};

/// How long an ADD counts as recent demand.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);

/// The pool's watermarks, the same for every network; each network is sized by its own
/// demand, pods and range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Watermarks {
    /// Free entries to keep ready (0 with `minimum` 0: the pool is off).
    pub target: usize,
    /// Addresses the network holds in all: pods and agent, plus the pool.
    pub minimum: usize,
    /// How far recent demand may raise the target.
    pub max_above: usize,
    /// How long entries above the target stay before they are released.
    pub release_after: Duration,
}

impl Watermarks {
    /// `--warm-pool N`: N entries kept, not raised by demand, surplus released at once.
    pub fn fixed(n: usize) -> Self {
        Self {
            target: n,
            ..Self::default()
        }
    }

    pub fn on(&self) -> bool {
        self.target > 0 || self.minimum > 0
    }
}

/// What a network's pool looks like when a refill round plans.
#[derive(Debug, Clone, Copy, Default)]
pub struct Level {
    /// Committed entries ready to hand out.
    pub ready: usize,
    /// Entries being made.
    pub filling: usize,
    /// The network's other attachments (pods, agent).
    pub in_use: usize,
    /// ADDs in the last [`DEMAND_WINDOW`].
    pub recent: usize,
    /// Free addresses in the delegate's range, when dipamd can count them.
    pub range_free: Option<usize>,
}

/// A round's decision for one network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The pool's size now: the target raised by demand, or what the minimum asks.
    pub want: usize,
    /// Entries to make this round.
    pub refill: usize,
    /// Ready entries above `want` (released once surplus for the cool-down).
    pub surplus: usize,
    /// Whether the range guard held refills back.
    pub range_short: bool,
}

/// The sizing rule.
pub fn plan(m: &Watermarks, l: &Level) -> Plan {
    let raised = m.target + m.max_above.min(l.recent);
    let want = raised.max(m.minimum.saturating_sub(l.in_use));
    let pooled = l.ready + l.filling;
    let deficit = want.saturating_sub(pooled);
    // One more entry only while the range has at least the target free before it, so pods
    // racing the refill still find addresses in the delegate (and any ADD the delegate
    // refuses takes an entry). Ranges dipamd cannot count are not guarded.
    let allowed = match l.range_free {
        Some(free) => (free + 1).saturating_sub(m.target.max(1)),
        None => usize::MAX,
    };
    Plan {
        want,
        refill: deficit.min(allowed),
        surplus: l.ready.saturating_sub(want),
        range_short: deficit > allowed,
    }
}

/// Recent ADDs of one network, for the demand.
#[derive(Debug, Default)]
pub struct Demand(VecDeque<Instant>);

impl Demand {
    pub fn note(&mut self, at: Instant) {
        self.0.push_back(at);
        // Bounded: demand above this is capped by max_above anyway.
        if self.0.len() > super::MAX_SIZE {
            self.0.pop_front();
        }
    }

    pub fn recent(&mut self, now: Instant) -> usize {
        while self
            .0
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > DEMAND_WINDOW)
        {
            self.0.pop_front();
        }
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(target: usize, minimum: usize, max_above: usize) -> Watermarks {
        Watermarks {
            target,
            minimum,
            max_above,
            release_after: Duration::ZERO,
        }
    }

    #[test]
    fn the_deficit_is_the_target_less_what_the_pool_holds() {
        let p = plan(
            &m(4, 0, 0),
            &Level {
                ready: 1,
                filling: 1,
                ..Level::default()
            },
        );
        assert_eq!((p.want, p.refill, p.surplus), (4, 2, 0));
    }

    #[test]
    fn demand_raises_the_target_within_max_above() {
        let l = Level {
            recent: 30,
            ..Level::default()
        };
        assert_eq!(plan(&m(4, 0, 8), &l).want, 12);
        assert_eq!(plan(&m(4, 0, 64), &l).want, 34);
        assert_eq!(plan(&m(4, 0, 0), &l).want, 4);
    }

    #[test]
    fn the_minimum_counts_pods_and_pool() {
        let l = Level {
            in_use: 3,
            ..Level::default()
        };
        let p = plan(&m(2, 10, 0), &l);
        assert_eq!((p.want, p.refill), (7, 7));
        let l = Level {
            in_use: 20,
            ready: 5,
            ..Level::default()
        };
        let p = plan(&m(2, 10, 0), &l);
        assert_eq!((p.want, p.surplus), (2, 3));
    }

    #[test]
    fn refills_stop_while_the_range_has_fewer_free_than_the_target() {
        let short = Level {
            range_free: Some(3),
            ..Level::default()
        };
        let p = plan(&m(4, 0, 0), &short);
        assert_eq!((p.refill, p.range_short), (0, true));
        // 6 free, target 4: 3 more entries leave 3 free, the 4th would leave 2.
        let some = Level {
            range_free: Some(6),
            ..Level::default()
        };
        assert_eq!(plan(&m(4, 0, 0), &some).refill, 3);
        let plenty = Level {
            range_free: Some(100),
            ..Level::default()
        };
        let p = plan(&m(4, 0, 0), &plenty);
        assert_eq!((p.refill, p.range_short), (4, false));
    }

    #[test]
    fn demand_forgets_old_adds() {
        let mut d = Demand::default();
        let t0 = Instant::now();
        d.note(t0);
        d.note(t0 + Duration::from_secs(5));
        assert_eq!(d.recent(t0 + Duration::from_secs(6)), 2);
        assert_eq!(d.recent(t0 + Duration::from_secs(12)), 1);
        assert_eq!(d.recent(t0 + Duration::from_secs(30)), 0);
    }
}
