//! The order of a key's operations: which of two requests was issued first.
//!
//! A DEL issued before the ADD that made the current attachment (reordered, or replayed late
//! from the spool) must not release it; an ADD issued before a DEL dipamd already ran must not
//! bring the attachment back (F4). Requests are ordered by when their plugin started, on
//! CLOCK_BOOTTIME with the kernel's boot id ([`BootStamp`]), never by the wall clock: after
//! the wall clock was stepped back an hour, a DEL stamped by it looked older than its own ADD,
//! was dropped as stale, and the address stayed held.
//!
//! When two stamps cannot be ordered (one is missing: an older plugin, or a record written
//! before stamps existed; or both come from boots other than the current one) the answer is
//! "unknown", and the callers then act as if there were no conflict of order: the DEL runs,
//! the ADD runs. A DEL is never dropped on a guess.

use std::sync::OnceLock;

use dipam_state::BootStamp;

/// Where the kernel publishes the id of the current boot.
pub const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

static BOOT_ID: OnceLock<Option<String>> = OnceLock::new();

/// The id of the boot dipamd runs in.
pub fn current_boot_id() -> Option<&'static str> {
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string(BOOT_ID_FILE)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// dipamd's own "now" on the ordering clock: for a DEL that carried no stamp.
pub fn now() -> Option<BootStamp> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let ns = u64::try_from(t.tv_sec())
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(t.tv_nsec()).ok()?)?;
    Some(BootStamp {
        boot_id: current_boot_id()?.to_owned(),
        ns,
    })
}

/// `stamp`, or dipamd's now if `stamp` is of this boot and later than now. A request cannot
/// have been issued after it arrived: a later stamp is forged (any caller writes its own
/// request) or comes from a boot clock that runs ahead (a time namespace's offset), and
/// would outrank every other request of its key for as long as it is ahead: a DEL's
/// tombstone would refuse the ADDs of that key, an ADD's record would make every DEL of it
/// look stale. A stamp of another boot is left alone: it is older than any of this boot.
pub fn clamp(stamp: BootStamp) -> BootStamp {
    clamp_to(stamp, now())
}

/// [`clamp`], with "now" given.
fn clamp_to(stamp: BootStamp, now: Option<BootStamp>) -> BootStamp {
    match now {
        Some(now) if now.boot_id == stamp.boot_id && stamp.ns > now.ns => now,
        _ => stamp,
    }
}

/// A request's stamp as the wire carries it; an empty boot id is no stamp.
pub fn from_wire(w: Option<&dipam_proto::v1::BootStamp>) -> Option<BootStamp> {
    w.filter(|w| !w.boot_id.is_empty()).map(|w| BootStamp {
        boot_id: w.boot_id.clone(),
        ns: w.ns,
    })
}

/// Whether `a` was issued before `b`; `None` when that cannot be known.
pub fn before(a: Option<&BootStamp>, b: Option<&BootStamp>) -> Option<bool> {
    before_in(a?, b?, current_boot_id())
}

/// [`before`], with the current boot given: a stamp of another boot than the current one is
/// older than any stamp of the current boot (boots follow each other); two stamps of other
/// boots cannot be ordered.
pub fn before_in(a: &BootStamp, b: &BootStamp, current: Option<&str>) -> Option<bool> {
    if a.boot_id == b.boot_id {
        return Some(a.ns < b.ns);
    }
    let current = current?;
    match (a.boot_id == current, b.boot_id == current) {
        (false, true) => Some(true),
        (true, false) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(boot: &str, ns: u64) -> BootStamp {
        BootStamp {
            boot_id: boot.into(),
            ns,
        }
    }

    #[test]
    fn one_boot_orders_by_the_clock_that_does_not_step() {
        assert_eq!(before_in(&at("b", 1), &at("b", 2), Some("b")), Some(true));
        assert_eq!(before_in(&at("b", 2), &at("b", 1), Some("b")), Some(false));
        assert_eq!(before_in(&at("b", 2), &at("b", 1), None), Some(false));
    }

    #[test]
    fn an_earlier_boot_is_older_and_two_earlier_ones_are_unknown() {
        // A DEL spooled before a reboot, against an ADD of this boot: older, whatever the
        // counters say.
        assert_eq!(
            before_in(&at("old", 9_999), &at("now", 1), Some("now")),
            Some(true)
        );
        assert_eq!(
            before_in(&at("now", 1), &at("old", 9_999), Some("now")),
            Some(false)
        );
        assert_eq!(before_in(&at("x", 1), &at("y", 2), Some("now")), None);
        assert_eq!(before_in(&at("x", 1), &at("y", 2), None), None);
    }

    #[test]
    fn a_stamp_from_the_future_is_now_and_others_are_kept() {
        let now = Some(at("b", 1_000));
        assert_eq!(clamp_to(at("b", 9_999_999), now.clone()).ns, 1_000);
        assert_eq!(clamp_to(at("b", 999), now.clone()).ns, 999);
        // Another boot's stamp is older than this boot's anyway.
        assert_eq!(clamp_to(at("x", 9_999_999), now).ns, 9_999_999);
        assert_eq!(clamp_to(at("b", 5), None).ns, 5);
        // The real clock: a stamp a day ahead comes back no later than a fresh now.
        let real = super::now().unwrap();
        let ahead = BootStamp {
            ns: real.ns + 86_400_000_000_000,
            ..real.clone()
        };
        let clamped = clamp(ahead);
        assert!(clamped.ns >= real.ns && clamped.ns < real.ns + 60_000_000_000);
    }

    #[test]
    fn a_missing_stamp_is_unordered() {
        assert_eq!(before(None, Some(&at("b", 1))), None);
        assert_eq!(before(Some(&at("b", 1)), None), None);
    }
}
