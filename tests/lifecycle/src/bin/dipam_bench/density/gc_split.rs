//! Where a CNI GC's time goes (issue 39 §1: "GC of all stale ≤ 1.1x the delegate's floor"),
//! from dipamd's log at debug level: its handler's time (the call's `ok` line), and within it
//! the delegate's DELs (`delegate exec finished` lines of the GC's span, each with its
//! wall-clock end and duration). What is not a DEL is dipamd's own: before the first DEL
//! (reading the delegate's store and the ledger, the plan, the first chunk's mark), between
//! them (the marks and forgets run beside the DELs), and after the last (the last forget).
//! Outside the handler: the plugin's exec, its reading of the ~2 MB valid lists at 10,000,
//! and the transport.

use serde_json::Value;

/// One CNI GC, split.
#[derive(Default, Clone)]
pub struct GcSplit {
    /// dipamd's handler, first to last, ms.
    pub handler_ms: f64,
    /// From the handler's start to the first DEL's start: the read and the plan.
    pub before_ms: f64,
    /// From the first DEL's start to the last DEL's end.
    pub dels_ms: f64,
    /// From the last DEL's end to the handler's end.
    pub after_ms: f64,
    pub dels: usize,
    /// The DELs' own times, summed (at `--gc-parallel` 2, about twice `dels_ms` when both
    /// slots are always busy).
    pub del_sum_ms: f64,
}

/// (end in ns since the epoch, duration in ms) of a log line with `elapsed_ms`.
fn timed(v: &Value) -> Option<(f64, f64)> {
    let end = v["timestamp"]
        .as_str()
        .and_then(super::super::parse_rfc3339)? as f64
        / 1e6;
    Some((end, v["fields"]["elapsed_ms"].as_f64()?))
}

/// One point's CNI GC from its log lines (those of the GC's span).
pub fn split(lines: &[Value]) -> GcSplit {
    let mut s = GcSplit::default();
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut handler = None;
    for v in lines {
        let f = &v["fields"];
        match f["message"].as_str() {
            Some("delegate exec finished") if f["command"] == "DEL" => {
                if let Some((end, took)) = timed(v) {
                    first = first.min(end - took);
                    last = last.max(end);
                    s.dels += 1;
                    s.del_sum_ms += took;
                }
            }
            Some("ok") => handler = timed(v),
            _ => {}
        }
    }
    if let Some((end, took)) = handler {
        s.handler_ms = took;
        if s.dels > 0 {
            s.before_ms = first - (end - took);
            s.dels_ms = last - first;
            s.after_ms = end - last;
        }
    }
    s
}
