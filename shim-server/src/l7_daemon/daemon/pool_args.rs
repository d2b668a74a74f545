//! The warm pool's flags: its watermarks (docs/cfp.md §7.7, "Sizing"), and `--warm-pool N`,
//! the fixed size of earlier releases, mapped onto them.

use std::time::Duration;

use clap::Args;

use super::DaemonError;
use crate::l3_clients::pool::{MAX_SIZE, sizing::Watermarks};

/// The pool's watermarks, the same for every network; each network is sized by its own pods,
/// demand and range. Off (the default) while the target and the minimum are both 0.
///
/// dipamd takes pooled addresses from the delegate under its own keys (container ID
/// dipam-pool-<node>-<n>), and a pod's ADD gets one with a single ledger commit and no
/// delegate exec. The trade-off: the delegate sees the pool's keys, not the pods' IDs
/// (host-local's files name dipam-pool-..., CNI_ARGS such as K8S_POD_NAME are the pool's, a
/// DEL sent to the delegate directly with a pod's ID finds nothing), and pooled addresses stay
/// held while idle. Use it only with delegates whose addresses are local, such as host-local;
/// not with cloud IPAMs. Pods that ask for particular addresses (runtimeConfig.ips,
/// args.cni.ips, CNI_ARGS IP=) bypass the pool.
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// Free pooled addresses to keep ready per network (Cilium's pre-allocate, AWS's
    /// WARM_IP_TARGET). 0: none, unless --pool-minimum asks. Refills stop while the network's
    /// range has fewer free addresses than this.
    #[arg(long, env = "DIPAM_POOL_TARGET", value_name = "N")]
    pub pool_target: Option<usize>,
    /// Addresses each network holds in all, pods and agent plus pool (Cilium's min-allocate,
    /// AWS's MINIMUM_IP_TARGET): the pool grows to make up the difference.
    #[arg(
        long,
        env = "DIPAM_POOL_MINIMUM",
        default_value_t = 0,
        value_name = "N"
    )]
    pub pool_minimum: usize,
    /// How far above the target recent demand may raise it (Cilium's max-above-watermark):
    /// the ADDs of the last 10 s are added to the target, up to this many, so that a burst is
    /// met by one cycle of refills.
    #[arg(long, env = "DIPAM_POOL_MAX_ABOVE", value_name = "N")]
    pub pool_max_above: Option<usize>,
    /// Seconds pooled addresses above the target stay before they are released (Cilium's
    /// excess-ip-release-delay). Default 60.
    #[arg(long, env = "DIPAM_POOL_RELEASE_AFTER", value_name = "SECONDS")]
    pub pool_release_after: Option<f64>,
    /// The fixed pool of earlier releases: the same as --pool-target N --pool-max-above 0
    /// --pool-release-after 0 (N kept per network, not raised by demand, surplus released at
    /// once). Lowering N (or 0) releases the surplus.
    #[arg(long, env = "DIPAM_WARM_POOL", value_name = "N")]
    pub warm_pool: Option<usize>,
}

/// The default cool-down (Cilium's excess-ip-release-delay is 180 s): a minute keeps a
/// churning node's pool through its bursts and gives the addresses back soon after.
pub const DEFAULT_RELEASE_AFTER: Duration = Duration::from_secs(60);

impl PoolArgs {
    /// The watermarks, checked.
    pub fn marks(&self) -> Result<Watermarks, DaemonError> {
        if let (Some(w), Some(t)) = (self.warm_pool, self.pool_target)
            && t != 0
            && t != w
        {
            return Err(DaemonError::Usage(format!(
                "--warm-pool {w} and --pool-target {t}: --warm-pool N is --pool-target N with \
                 --pool-max-above 0 and --pool-release-after 0; give one of them"
            )));
        }
        let marks = match self.warm_pool {
            Some(n) => Watermarks {
                minimum: self.pool_minimum,
                max_above: self.pool_max_above.unwrap_or(0),
                release_after: self.release_after(Duration::ZERO)?,
                ..Watermarks::fixed(n)
            },
            None => Watermarks {
                target: self.pool_target.unwrap_or(0),
                minimum: self.pool_minimum,
                max_above: self.pool_max_above.unwrap_or(0),
                release_after: self.release_after(DEFAULT_RELEASE_AFTER)?,
            },
        };
        for (flag, n) in [
            (
                if self.warm_pool.is_some() {
                    "--warm-pool"
                } else {
                    "--pool-target"
                },
                marks.target,
            ),
            ("--pool-minimum", marks.minimum),
            ("--pool-max-above", marks.max_above),
        ] {
            if n > MAX_SIZE {
                return Err(DaemonError::Usage(format!(
                    "{flag} {n} is more than {MAX_SIZE} addresses per network"
                )));
            }
        }
        Ok(marks)
    }

    fn release_after(&self, default: Duration) -> Result<Duration, DaemonError> {
        match self.pool_release_after {
            None => Ok(default),
            Some(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => {
                Ok(Duration::from_secs_f64(s))
            }
            Some(s) => Err(DaemonError::Usage(format!(
                "--pool-release-after {s}: give seconds from 0 to 86400"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        pool: PoolArgs,
    }

    fn marks(argv: &[&str]) -> Result<Watermarks, DaemonError> {
        let mut all = vec!["dipamd"];
        all.extend_from_slice(argv);
        Cli::try_parse_from(all).unwrap().pool.marks()
    }

    #[test]
    fn off_by_default() {
        assert!(!marks(&[]).unwrap().on());
    }

    #[test]
    fn warm_pool_is_a_fixed_target() {
        let m = marks(&["--warm-pool", "4"]).unwrap();
        assert_eq!(m, Watermarks::fixed(4));
        assert_eq!((m.max_above, m.release_after), (0, Duration::ZERO));
        // The same value, or 0 (a DaemonSet's default variable), beside it is accepted.
        assert_eq!(
            marks(&["--warm-pool", "4", "--pool-target", "4"]).unwrap(),
            m
        );
        assert_eq!(
            marks(&["--warm-pool", "4", "--pool-target", "0"]).unwrap(),
            m
        );
        let e = marks(&["--warm-pool", "4", "--pool-target", "8"]).unwrap_err();
        assert!(e.to_string().contains("give one of them"), "{e}");
    }

    #[test]
    fn watermarks_and_their_bounds() {
        let m = marks(&[
            "--pool-target",
            "8",
            "--pool-minimum",
            "20",
            "--pool-max-above",
            "32",
        ])
        .unwrap();
        assert_eq!(
            m,
            Watermarks {
                target: 8,
                minimum: 20,
                max_above: 32,
                release_after: DEFAULT_RELEASE_AFTER,
            }
        );
        assert!(marks(&["--pool-minimum", "3"]).unwrap().on());
        for bad in [
            &["--pool-target", "5000"][..],
            &["--pool-max-above", "5000"],
            &["--pool-release-after=-1"],
            &["--pool-release-after", "NaN"],
        ] {
            assert!(marks(bad).is_err(), "{bad:?}");
        }
    }
}
