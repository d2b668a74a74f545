//! The shipped systemd unit (deploy/systemd/dipamd.service) read the way systemd reads it:
//! its `Environment=` defaults, an `EnvironmentFile=` on top, and `ExecStart=` expanded with
//! the result (systemd.exec(5), "Environment variables in spawned processes";
//! systemd.service(5), "Command lines").
//!
//! Tests do not start the unit through systemd (PID 1 of a test machine or container need
//! not be systemd, and the unit's paths are the host's): they start dipamd with exactly the
//! argv and environment this emulation computes. It covers only the
//! syntax the unit uses and fails loudly on anything else (quotes, `${VAR}`, prefixes), so
//! the unit cannot drift into syntax the emulation would read differently from systemd.

use std::{collections::BTreeMap, path::PathBuf};

use crate::bins;

/// The PATH systemd gives every service before the unit's own settings
/// (docs/sources.md §15: the system manager's list, plus the :/sbin:/bin an unmerged-/usr build appends).
pub const SYSTEMD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Unit {
    /// `Environment=` assignments, in order.
    pub environment: Vec<(String, String)>,
    /// `EnvironmentFile=` paths (a leading "-": optional).
    pub environment_files: Vec<String>,
    /// `ExecStart=`, continuation lines joined, split into words ($VAR not yet expanded).
    pub exec_start: Vec<String>,
}

pub fn path() -> PathBuf {
    bins::workspace().join("deploy/systemd/dipamd.service")
}

/// The shipped unit.
pub fn shipped() -> Unit {
    let path = path();
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse(&text)
}

pub fn parse(text: &str) -> Unit {
    let joined = text.replace("\\\n", " ");
    let mut unit = Unit {
        environment: Vec::new(),
        environment_files: Vec::new(),
        exec_start: Vec::new(),
    };
    for line in joined.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Environment=") {
            assert!(
                !v.contains(['"', '\'', '%']),
                "Environment={v}: unquoted only"
            );
            for a in v.split_whitespace() {
                let (k, v) = a
                    .split_once('=')
                    .unwrap_or_else(|| panic!("Environment={a}"));
                unit.environment.push((k.to_owned(), v.to_owned()));
            }
        } else if let Some(v) = line.strip_prefix("EnvironmentFile=") {
            unit.environment_files.push(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("ExecStart=") {
            assert!(unit.exec_start.is_empty(), "one ExecStart= (Type=simple)");
            assert!(
                v.starts_with('/') && !v.contains(['"', '\'', '%', '{', ';']),
                "ExecStart={v}: an absolute path and plain words only"
            );
            unit.exec_start = v.split_whitespace().map(str::to_owned).collect();
        }
    }
    assert!(!unit.exec_start.is_empty(), "the unit has an ExecStart=");
    unit
}

/// An environment file's assignments as systemd reads them: `KEY=VALUE` lines, `#` and `;`
/// comments, and a value in double quotes taken without them.
pub fn parse_environment_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=VALUE: {l}"));
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            assert!(!v.contains(['"', '\\', '$']), "{l}: a plain value only");
            (k.trim().to_owned(), v.to_owned())
        })
        .collect()
}

impl Unit {
    /// The environment dipamd gets with `file` (the operator's /etc/default/dipamd) in place
    /// of the unit's EnvironmentFile=: systemd's PATH, then Environment=, then the file's
    /// assignments, which win whatever the order of the lines (systemd.exec(5)).
    pub fn environment_with(&self, file: Option<&str>) -> BTreeMap<String, String> {
        assert_eq!(
            self.environment_files,
            ["-/etc/default/dipamd"],
            "the unit reads one optional environment file"
        );
        let mut env = BTreeMap::from([("PATH".to_owned(), SYSTEMD_PATH.to_owned())]);
        env.extend(self.environment.iter().cloned());
        if let Some(f) = file {
            env.extend(parse_environment_file(f));
        }
        env
    }

    /// ExecStart= expanded with `env` as systemd does: a word that is exactly `$VAR` becomes
    /// the variable's value split at white space (no words when unset or empty).
    pub fn argv(&self, env: &BTreeMap<String, String>) -> Vec<String> {
        let mut out = Vec::new();
        for w in &self.exec_start {
            match w.strip_prefix('$') {
                Some(var) => out.extend(
                    env.get(var)
                        .into_iter()
                        .flat_map(|v| v.split_whitespace())
                        .map(str::to_owned),
                ),
                None => {
                    assert!(!w.contains('$'), "{w}: only whole-word $VAR is emulated");
                    out.push(w.clone());
                }
            }
        }
        out
    }

    /// The unit's own value of a dipamd setting: the last `flag` on ExecStart (before any
    /// operator's options), else its `var` from Environment=.
    pub fn setting(&self, flag: &str, var: &str) -> Option<String> {
        let argv = self.argv(&BTreeMap::new());
        let mut from_flag = None;
        for (i, a) in argv.iter().enumerate() {
            if a == flag {
                from_flag = argv.get(i + 1).cloned();
            } else if let Some(v) = a.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
                from_flag = Some(v.to_owned());
            }
        }
        from_flag.or_else(|| {
            self.environment
                .iter()
                .rev()
                .find(|(k, _)| k == var)
                .map(|(_, v)| v.clone())
        })
    }
}
