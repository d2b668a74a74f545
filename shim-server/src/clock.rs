//! The wall clock, for the times records and history carry (seconds and milliseconds since the
//! Unix epoch). Never used to order events: the wall clock steps (order.rs uses the boot clock).

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// A duration in milliseconds for log lines, rounded to 0.1 ms: `2.4`, never the float noise
/// of `2.3923740000000002` that `as_secs_f64() * 1e3` prints. A number, not a string, so that
/// `--log-format json` keeps it numeric (dipam-bench reads it).
pub fn log_ms(d: std::time::Duration) -> f64 {
    // n / 10.0 is the double nearest to the decimal n/10, which prints as exactly that.
    (d.as_secs_f64() * 1e4).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::log_ms;
    use std::time::Duration;

    #[test]
    fn log_ms_are_rounded_to_a_tenth_and_print_clean() {
        assert_eq!(log_ms(Duration::from_nanos(2_392_374)).to_string(), "2.4");
        assert_eq!(log_ms(Duration::from_nanos(2_350_001)).to_string(), "2.4");
        assert_eq!(log_ms(Duration::from_nanos(7_388_396)).to_string(), "7.4");
        assert_eq!(log_ms(Duration::ZERO).to_string(), "0");
        assert_eq!(log_ms(Duration::from_secs(3)).to_string(), "3000");
        for n in 0..100_000u64 {
            let s = log_ms(Duration::from_micros(n * 37)).to_string();
            assert!(s.len() <= 8, "{n}: {s}");
        }
    }
}
