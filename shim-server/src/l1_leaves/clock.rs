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

/// A point in time in dipamctl's JSON (docs/configuration.md, "Times in JSON"): the pair
/// (`<name>`, `<name>Ms`), RFC 3339 UTC for people and Unix milliseconds for scripts, as
/// `explain` gives `at` and `atMs`. Unset (0) is `null` in both, never 1970.
pub fn json_time(ms: u64) -> (serde_json::Value, serde_json::Value) {
    if ms == 0 {
        return (serde_json::Value::Null, serde_json::Value::Null);
    }
    (rfc3339_ms(ms).into(), ms.into())
}

/// Milliseconds from a reply that carries them, else from its seconds field (an older dipamd
/// sent only seconds).
pub fn ms_or_secs(ms: u64, secs: u64) -> u64 {
    if ms > 0 {
        ms
    } else {
        secs.saturating_mul(1000)
    }
}

/// Unix milliseconds as an RFC 3339 UTC time with milliseconds, `2026-11-24T07:15:00.123Z`:
/// what people read in dipamctl's output (a raw epoch number is not a time anyone can read).
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let (h, m, s) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    // The civil date from days since 1970-01-01 (H. Hinnant, "chrono-Compatible Low-Level
    // Date Algorithms", days_from_civil's inverse).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{:03}Z",
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::{json_time, log_ms, ms_or_secs, rfc3339_ms};

    #[test]
    fn json_times_pair_rfc3339_with_unix_ms_and_unset_is_null() {
        use serde_json::{Value, json};
        assert_eq!(json_time(0), (Value::Null, Value::Null));
        assert_eq!(
            json_time(951_782_400_123),
            (json!("2000-02-29T00:00:00.123Z"), json!(951_782_400_123u64))
        );
        assert_eq!(ms_or_secs(0, 7), 7000);
        assert_eq!(ms_or_secs(7001, 7), 7001);
    }

    #[test]
    fn rfc3339_is_utc_civil_time_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century leap year), and the end of 1999.
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(946_684_799_999), "1999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(1_795_504_500_007), "2026-11-24T07:15:00.007Z");
    }
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
