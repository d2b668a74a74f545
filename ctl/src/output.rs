//! What every dipamctl command shares in how it answers: its error (the type is `error.rs`;
//! one line on stderr, prefixed `dipamctl:`; with `--json`, one JSON document on stderr
//! instead), its exit status, its tables for people and its `--json` documents for scripts, the rows of a GC's
//! report, and the progress a long operation shows on a terminal.

use std::{ffi::OsString, io::Write, process::ExitCode, time::Duration};

use dipam_proto::v1::{DoctorCheck, GcItem, RuntimeGcItem};
use serde_json::{Map, Value, json};

use super::error::error_json;
pub use super::error::{CtlError, EXIT_FAILURE, EXIT_USAGE};

/// The process's answer: status 0, or the error on stderr and status 1 (2 for a usage
/// error). With `json`, the error is one JSON document on one line of stderr (`to_json`):
/// stdout carries only what the command answers, so a script reading it (`| jq`) never takes
/// an error for data, and a command that answered and then failed (a doctor check, a refused
/// GC) still leaves exactly one document there.
///
/// Output cut off because its reader went away (`dipamctl attachments --json | head -1`)
/// ends quietly with status 0, as a Unix filter does: the reader has what it wanted, and
/// "Broken pipe" on stderr would only be noise.
pub fn exit(result: Result<(), CtlError>, json: bool) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CtlError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, json, &mut std::io::stderr().lock());
            ExitCode::from(e.exit_status())
        }
    }
}

/// Writes `e` as `exit` does, to `err`.
pub fn report(e: &CtlError, json: bool, err: &mut dyn Write) {
    // Nothing is left to tell a failure to if stderr itself fails.
    let _ = if json {
        json_line(err, &e.to_json())
    } else {
        writeln!(err, "dipamctl: {e}")
    };
}

/// The answer to a command line clap could not parse (or `--help`/`--version`, which clap
/// reports the same way): help and version on stdout with status 0, as clap prints them; a
/// usage error with status 2, as clap's text on stderr, or with `json` as one JSON document
/// there (`code` "usage", `details.usage` the command's usage line).
pub fn usage(e: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if shown || !json {
        // As e.exit() does, without exiting here: a failed print has no one to tell.
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE));
    }
    json_line(&mut std::io::stderr().lock(), &usage_json(&e)).ok();
    ExitCode::from(EXIT_USAGE)
}

/// clap's usage error as dipamctl's JSON error: its first paragraph (without "error: ", its
/// lines joined: "the following required arguments were not provided: <CONTAINER_ID>") as
/// the message, its `Usage:` line and kind as details.
pub fn usage_json(e: &clap::Error) -> Value {
    let text = e.render().to_string();
    let message = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error: ")
        .to_owned();
    let usage = text
        .lines()
        .find_map(|l| l.strip_prefix("Usage: "))
        .unwrap_or_default();
    error_json(
        "usage",
        &message,
        json!({"kind": format!("{:?}", e.kind()), "usage": usage}),
    )
}

/// A note on stderr that is not the failure (a watch reconnecting, a ledger moved aside, an
/// install's warning): `dipamctl: <note>`, or with `json` `{"warning": {"message": ...}}` on
/// one line, so that under --json every line dipamctl writes to stderr is JSON.
pub fn warn(json: bool, note: &str) {
    let err = &mut std::io::stderr().lock();
    let _ = if json {
        json_line(err, &json!({"warning": {"message": note}}))
    } else {
        writeln!(err, "dipamctl: {note}")
    };
}

/// One JSON document, indented: what a command prints with `--json`. Written with one call:
/// stdout is line-buffered, and the indented form written piece by piece made one write(2)
/// per line, ~35 a record: `dipamctl attachments --json` took 857 ms at 10,000 attachments
/// (docs/performance.md, run 29).
pub fn json(out: &mut dyn Write, v: &serde_json::Value) -> std::io::Result<()> {
    out.write_all(format!("{v:#}\n").as_bytes())
}

/// One JSON document on one line: a stream's messages (`agent watch --json`), one per line.
pub fn json_line(out: &mut dyn Write, v: &serde_json::Value) -> std::io::Result<()> {
    writeln!(out, "{v}")
}

/// Container IDs are 64 hex characters from containerd; 16 identify one on a node. Other IDs
/// (dipam's agent slots, podman names) are shown whole.
pub fn short(id: &str) -> String {
    if id.len() > 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
        format!("{}…", &id[..16])
    } else {
        id.to_owned()
    }
}

/// A table for people: a header line and one line per row, each column as wide as its widest
/// cell, two spaces apart, no trailing blanks.
pub fn table<const N: usize>(
    out: &mut dyn Write,
    head: [&str; N],
    rows: &[[String; N]],
) -> std::io::Result<()> {
    let mut width = head.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    // One write for the whole table, as for `json` (stdout is line-buffered).
    let mut text = line(head.to_vec());
    text.push('\n');
    for r in rows {
        text.push_str(&line(r.iter().map(String::as_str).collect()));
        text.push('\n');
    }
    out.write_all(text.as_bytes())
}

/// One item a GC freed (or would free) or kept, as `gc` and `gc --from-runtime` show it.
pub struct GcRow<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub ips: &'a [String],
    pub outcome: &'a str,
    pub error: &'a str,
    pub reason: &'a str,
    pub keep: &'a [String],
}

impl<'a> From<&'a GcItem> for GcRow<'a> {
    fn from(i: &'a GcItem) -> Self {
        Self {
            container_id: &i.container_id,
            ifname: &i.ifname,
            ips: &i.ips,
            outcome: &i.outcome,
            error: &i.error,
            reason: &i.reason,
            keep: &i.keep,
        }
    }
}

impl<'a> From<&'a RuntimeGcItem> for GcRow<'a> {
    fn from(i: &'a RuntimeGcItem) -> Self {
        Self {
            container_id: &i.container_id,
            ifname: &i.ifname,
            ips: &i.ips,
            outcome: &i.outcome,
            error: &i.error,
            reason: &i.reason,
            keep: &i.keep,
        }
    }
}

impl GcRow<'_> {
    /// The JSON fields every GC item has; the caller adds its own (`kind`, or `network`,
    /// `owner` and `pod`).
    pub fn json(&self) -> Map<String, Value> {
        let v = json!({
            "containerID": self.container_id, "ifname": self.ifname, "ips": self.ips,
            "reason": self.reason, "outcome": self.outcome, "error": self.error,
            "keep": self.keep,
        });
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// The table cells every GC item has: container (shortened), interface, addresses, the
    /// outcome with its error, and the reason.
    pub fn cells(&self) -> [String; 5] {
        [
            short(self.container_id),
            self.ifname.to_owned(),
            self.ips.join(","),
            if self.error.is_empty() {
                self.outcome.to_owned()
            } else {
                format!("{}: {}", self.outcome, self.error)
            },
            self.reason.to_owned(),
        ]
    }
}

/// Whether a long operation shows its progress: only for a person watching a terminal, so
/// never under --json, when stderr (where it is drawn) is not a terminal, or on a terminal
/// that cannot erase a line (TERM=dumb, e.g. Emacs' shell). `env` is the process
/// environment. The progress uses no colour, so NO_COLOR holds without a check.
pub fn progress_wanted(
    json: bool,
    stderr_is_terminal: bool,
    env: impl Fn(&str) -> Option<OsString>,
) -> bool {
    !json && stderr_is_terminal && env("TERM").is_none_or(|t| t != "dumb")
}

/// A long operation's progress on stderr: a counter (`recover`) or a spinner with the time
/// spent (`gc`, whose work is done in dipamd). Drawn at most 10 times a second, and erased
/// when it ends (dropped, on success or failure alike), so what the command prints after it
/// stands alone. Hidden when `progress_wanted` said no.
pub struct Progress(Option<indicatif::ProgressBar>);

/// How often a spinner redraws while it waits for dipamd (and the draw throttle).
const TICK: Duration = Duration::from_millis(100);

impl Progress {
    /// A counter: "{what} N/LEN".
    pub fn counter(shown: bool, what: &str, len: u64) -> Self {
        Self::new(shown, || {
            let bar = indicatif::ProgressBar::with_draw_target(Some(len), target());
            bar.set_style(
                indicatif::ProgressStyle::with_template("{msg} {pos}/{len} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(what.to_owned());
            bar
        })
    }

    /// A spinner with `what` and the time spent, redrawn while the caller waits.
    pub fn spinner(shown: bool, what: &str) -> Self {
        Self::new(shown, || {
            let bar = indicatif::ProgressBar::with_draw_target(None, target());
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.set_message(what.to_owned());
            bar.enable_steady_tick(TICK);
            bar
        })
    }

    fn new(shown: bool, make: impl FnOnce() -> indicatif::ProgressBar) -> Self {
        Self(shown.then(|| {
            let bar = make();
            // Drawn at once: even an operation that ends within one tick was shown, and
            // erased.
            bar.tick();
            bar
        }))
    }

    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(n);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

fn target() -> indicatif::ProgressDrawTarget {
    // 10 draws a second at most: enough to see it move, no flood over a slow link.
    indicatif::ProgressDrawTarget::stderr_with_hz(10)
}

/// Doctor's checks for people, one a line, a failed one's fix under it: the same whether
/// dipamd answered or the node's files were read offline.
pub fn checks(out: &mut dyn Write, checks: &[DoctorCheck]) -> std::io::Result<()> {
    for c in checks {
        let verdict = if c.ok { "ok  " } else { "FAIL" };
        writeln!(out, "{verdict} {}: {}", c.name, c.detail)?;
        if !c.ok && !c.fix.is_empty() {
            writeln!(out, "       fix: {}", c.fix)?;
        }
    }
    Ok(())
}

/// Doctor's checks for scripts: `[{name, ok, detail, fix}]`.
pub fn checks_json(checks: &[DoctorCheck]) -> Value {
    checks
        .iter()
        .map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail, "fix": c.fix}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(e: &CtlError, json: bool) -> String {
        let mut err = Vec::new();
        report(e, json, &mut err);
        String::from_utf8(err).unwrap()
    }

    #[test]
    fn an_error_is_a_line_or_one_json_document_with_its_code() {
        let unreachable = CtlError::Unreachable {
            socket: "/run/x.sock".into(),
            reason: "No such file or directory".into(),
            denied: false,
        };
        assert_eq!(
            reported(&unreachable, false),
            format!("dipamctl: {unreachable}\n")
        );
        let text = reported(&unreachable, true);
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "unreachable");
        assert_eq!(v["error"]["message"], unreachable.to_string());
        assert_eq!(v["error"]["details"]["socket"], "/run/x.sock");
        assert_eq!(unreachable.exit_status(), 1);

        let rpc = CtlError::Rpc(tonic::Status::failed_precondition("not ready"));
        let v: Value = serde_json::from_str(&reported(&rpc, true)).unwrap();
        assert_eq!(v["error"]["code"], "rpc");
        assert_eq!(v["error"]["message"], "dipamd: not ready");
        assert_eq!(v["error"]["details"]["grpcCode"], "FAILED_PRECONDITION");

        let usage = CtlError::Usage("--ranges-from-node needs --conflist".into());
        assert_eq!(usage.exit_status(), 2);
        let v: Value = serde_json::from_str(&reported(&usage, true)).unwrap();
        assert_eq!(v["error"]["code"], "usage");
        for (e, code) in [
            (CtlError::Failed("x".into()), "failed"),
            (CtlError::Input("x".into()), "input"),
        ] {
            assert_eq!(e.exit_status(), 1);
            let v: Value = serde_json::from_str(&reported(&e, true)).unwrap();
            assert_eq!(
                v["error"],
                json!({"code": code, "message": "x", "details": {}})
            );
        }
    }

    #[test]
    fn a_clap_usage_error_keeps_its_message_and_usage_line() {
        let cmd = clap::Command::new("dipamctl")
            .subcommand(clap::Command::new("status").arg(clap::Arg::new("ready").long("ready")));
        let e = cmd
            .try_get_matches_from(["dipamctl", "status", "--frob"])
            .unwrap_err();
        let v = usage_json(&e);
        assert_eq!(v["error"]["code"], "usage");
        assert_eq!(v["error"]["message"], "unexpected argument '--frob' found");
        assert_eq!(v["error"]["details"]["kind"], "UnknownArgument");
        assert_eq!(v["error"]["details"]["usage"], "dipamctl status [OPTIONS]");

        // A message on several lines is joined into one.
        let cmd = clap::Command::new("dipamctl")
            .subcommand(clap::Command::new("explain").arg(clap::Arg::new("id").required(true)));
        let e = cmd
            .try_get_matches_from(["dipamctl", "explain"])
            .unwrap_err();
        assert_eq!(
            usage_json(&e)["error"]["message"],
            "the following required arguments were not provided: <id>"
        );
    }

    #[test]
    fn progress_only_for_a_person_at_a_capable_terminal() {
        let term = |t: Option<&'static str>| move |k: &str| (k == "TERM").then_some(t?.into());
        assert!(progress_wanted(false, true, term(Some("xterm-256color"))));
        assert!(progress_wanted(false, true, term(None)));
        assert!(!progress_wanted(true, true, term(Some("xterm"))), "--json");
        assert!(
            !progress_wanted(false, false, term(Some("xterm"))),
            "a pipe"
        );
        assert!(!progress_wanted(false, true, term(Some("dumb"))));
        // Hidden, a progress is a no-op.
        let p = Progress::counter(false, "x", 3);
        p.inc(3);
        assert!(p.0.is_none());
    }

    #[test]
    fn a_gc_row_shows_the_error_with_the_outcome() {
        let item = GcItem {
            kind: "pod".into(),
            container_id: "0123456789abcdef0123456789abcdef".into(),
            ifname: "eth0".into(),
            ips: vec!["10.1.0.5/24".into(), "fd00::5/64".into()],
            outcome: "failed".into(),
            error: "host-local: exit 1".into(),
            reason: "not in the valid list".into(),
            ..Default::default()
        };
        let row = GcRow::from(&item);
        assert_eq!(
            row.cells(),
            [
                "0123456789abcdef…",
                "eth0",
                "10.1.0.5/24,fd00::5/64",
                "failed: host-local: exit 1",
                "not in the valid list",
            ]
        );
        let v = row.json();
        assert_eq!(v["containerID"], item.container_id.as_str());
        assert_eq!(v["error"], "host-local: exit 1");
    }
}
