//! The agent API's scenario table, tests/lifecycle/agent-scenarios.json, run by every client
//! dipam ships an agent for (the Go module's, examples/go-agent, and the Python one,
//! tests/lifecycle/python/agent_client.py) against an [`AgentLab`]'s dipamd, started with the
//! roles router and health.
//!
//! The protocol between the test and a client: the client prints `DIPAM-KILL` and waits for
//! a line on stdin when it wants dipamd SIGKILLed under its watch; [`drive`] kills dipamd,
//! starts it again (the same way) and answers `restarted`. The client's findings come as
//! `DIPAM-SUMMARY {json}` lines, merged into one object, which [`assert_summary`] checks the
//! same way for every client.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::Command,
};

use serde_json::Value;

use crate::{AgentLab, bins};

/// One client's run: the names and addresses the table's placeholders stand for, and a
/// directory every uid can read holding the table (a non-root client may not read the
/// checkout, under /root on a CI machine).
pub struct Scenario {
    pub claim: String,
    pub claim_ip: String,
    pub other_ip: String,
    /// The Go example's own egress claim.
    pub example_ip: String,
    pub dir: tempfile::TempDir,
}

impl Scenario {
    /// Addresses inside the lab's /24 that neither role holds (host-local hands out the
    /// lowest free addresses first).
    pub fn new(lab: &AgentLab, claim: &str) -> Self {
        let base = lab.subnet.cidr.trim_end_matches(".0/24").to_owned();
        let dir = crate::temp_dir("dipam-scenario-");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("open the scenario's directory");
        std::fs::copy(
            bins::workspace().join("tests/lifecycle/agent-scenarios.json"),
            dir.path().join("agent-scenarios.json"),
        )
        .expect("copy the scenario table");
        Self {
            claim: claim.to_owned(),
            claim_ip: format!("{base}.200"),
            other_ip: format!("{base}.201"),
            example_ip: format!("{base}.202"),
            dir,
        }
    }

    pub fn table(&self) -> PathBuf {
        self.dir.path().join("agent-scenarios.json")
    }
}

/// Runs `cmd`, a client of the protocol above, to its end, SIGKILLing and restarting
/// `lab`'s dipamd whenever it asks; returns its summaries merged. Panics with the client's
/// output and dipamd's log when the client fails.
pub fn drive(lab: &mut AgentLab, mut cmd: Command, who: &str) -> Value {
    let mut child = crate::cmd::spawn_piped(&mut cmd);
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stderr = child.stderr.take().expect("piped stderr");
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut out = Vec::new();
    let mut summary = serde_json::Map::new();
    for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
        let line = line.expect("read the client's stdout");
        if line == "DIPAM-KILL" {
            lab.dipamd.restart();
            writeln!(stdin, "restarted").expect("tell the client dipamd restarted");
        } else if let Some(json) = line.strip_prefix("DIPAM-SUMMARY ") {
            let v: Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("{who}'s summary: {e}: {json}"));
            summary.extend(v.as_object().expect("a summary is an object").clone());
        }
        out.push(line);
    }
    let status = child.wait().expect("wait for the client");
    let errors = errors.join().unwrap_or_default();
    assert!(
        status.success(),
        "{who} failed ({status}):\n{}\n{errors}\n{}",
        out.join("\n"),
        lab.dipamd.log()
    );
    Value::Object(summary)
}

/// What every client's run of the table must have seen, checked against dipamctl and the
/// delegate's store.
pub fn assert_summary(lab: &AgentLab, summary: &Value, sc: &Scenario) {
    let s = &summary["scenarios"];
    let table: Value = serde_json::from_str(
        &std::fs::read_to_string(sc.table()).expect("read the scenario table"),
    )
    .expect("the scenario table is JSON");
    let steps: Vec<&str> = table["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|st| st["step"].as_str().expect("a step's name"))
        .collect();
    assert_eq!(
        s["steps"].as_array().map(|a| a.len()),
        Some(steps.len()),
        "every step ran: {summary}"
    );
    let rows = |v: &Value| -> Vec<(String, String, String, String)> {
        let mut r: Vec<_> = v
            .as_array()
            .unwrap_or_else(|| panic!("rows: {summary}"))
            .iter()
            .map(|a| {
                let f = |i: usize| a[i].as_str().unwrap_or_default().to_owned();
                (f(0), f(1), f(2), f(3))
            })
            .collect();
        r.sort();
        r
    };
    // What the client listed at first is what dipamctl lists now: the two roles.
    assert_eq!(rows(&s["list"]), lab.addresses(), "{summary}");
    assert_eq!(s["health"], "SERVING", "{summary}");
    let with_role = rows(&s["with_role"]);
    assert_eq!(
        with_role.iter().filter(|a| a.0 == "ingress").count(),
        1,
        "{summary}"
    );
    // The claim held the address it asked for, across the SIGKILL too.
    let claimed = s["claimed"].as_str().unwrap_or_default();
    assert_eq!(
        claimed.split('/').next(),
        Some(sc.claim_ip.as_str()),
        "{summary}"
    );
    let listed = s["claim_listed"].as_array().expect("claim_listed");
    assert!(
        listed
            .iter()
            .any(|a| a[0] == sc.claim.as_str() && a[1] == claimed && a[2] == "ready"),
        "{summary}"
    );
    let restart = &s["restart"];
    assert_eq!(restart["before"], restart["after"], "{summary}");
    assert_eq!(
        restart["before"].as_array().map(|a| a.len()),
        Some(3),
        "router, health and the claim were followed across the SIGKILL: {summary}"
    );
    // Refused requests answer the documented codes (docs/agent-api.md, Errors).
    for st in table["steps"].as_array().expect("steps") {
        if let Some(code) = st.get("code") {
            assert_eq!(
                &s["codes"][st["step"].as_str().unwrap_or_default()],
                code,
                "{summary}"
            );
        }
    }
    // Released and unclaimed again: the ledger and the delegate's store hold the two roles
    // only, and nothing holds the claimed IPs.
    assert_eq!(lab.addresses().len(), 2, "{:?}", lab.addresses());
    assert_eq!(lab.delegate_store().len(), 2);
    lab.assert_agree();
    let store = lab.delegate_store();
    for ip in [&sc.claim_ip, &sc.example_ip] {
        assert!(store.iter().all(|(_, held)| held != ip), "{store:?}");
    }
}
