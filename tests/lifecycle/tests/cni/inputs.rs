//! Hostile and malformed input: every case gets a CNI error JSON on stdout with the expected
//! code, a non-zero exit, never a panic, and nothing allocated.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Fixture, Lab, Runtime, bins, require_root};
use serde_json::{Value, json};

const OK_CONF: &str = r#"{"cniVersion":"1.0.0","name":"inputs","type":"ptp","ipam":{"type":"dipam","socketPath":"/nonexistent/dipam.sock","delegate":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/24"}]]}}}"#;

struct Case {
    name: &'static str,
    env: Vec<(&'static str, &'static str)>,
    stdin: String,
    code: u64,
}

fn case(name: &'static str, env: &[(&'static str, &'static str)], stdin: &str, code: u64) -> Case {
    Case {
        name,
        env: env.to_vec(),
        stdin: stdin.to_owned(),
        code,
    }
}

/// No root needed: these never reach dipamd or a netns.
#[test]
fn malformed_env_and_stdin_table() {
    let rt = Runtime::new(format!("{}:/usr/lib/cni", bins::dir().display()));
    let base = Attachment::new("c1", "/var/run/netns/none");
    let add = [("CNI_COMMAND", "ADD")];
    let huge = format!(
        r#"{{"cniVersion":"1.0.0","name":"n","type":"ptp","pad":"{}","ipam":{{"type":"dipam","delegate":{{}}}}}}"#,
        "x".repeat(1 << 20)
    );
    let cases = vec![
        case("unknown command", &[("CNI_COMMAND", "FROB")], OK_CONF, 4),
        case("lowercase command", &[("CNI_COMMAND", "add")], OK_CONF, 4),
        case(
            "missing container id",
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "")],
            OK_CONF,
            4,
        ),
        case(
            "missing netns on ADD",
            &[("CNI_COMMAND", "ADD"), ("CNI_NETNS", "")],
            OK_CONF,
            4,
        ),
        case(
            "missing ifname on DEL",
            &[("CNI_COMMAND", "DEL"), ("CNI_IFNAME", "")],
            OK_CONF,
            4,
        ),
        case(
            "container id with slash",
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "../../etc")],
            OK_CONF,
            4,
        ),
        case(
            "container id leading dot",
            &[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", ".hidden")],
            OK_CONF,
            4,
        ),
        case(
            "ifname too long",
            &[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0123456789012")],
            OK_CONF,
            4,
        ),
        case(
            "ifname with colon",
            &[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0:1")],
            OK_CONF,
            4,
        ),
        case(
            "ifname dotdot",
            &[("CNI_COMMAND", "DEL"), ("CNI_IFNAME", "..")],
            OK_CONF,
            4,
        ),
        case("empty stdin", &add, "", 6),
        case("not json", &add, "{{{", 6),
        case("json array", &add, "[1,2,3]", 6),
        case("json string", &add, "\"x\"", 6),
        case("binary garbage", &add, "\u{0}\u{1}\u{2}\u{ff}", 6),
        case(
            "name has slash",
            &add,
            &OK_CONF.replace("\"inputs\"", "\"a/b\""),
            7,
        ),
        case(
            "name missing",
            &add,
            &OK_CONF.replace("\"name\":\"inputs\",", ""),
            7,
        ),
        case("version 0.2.0", &add, &OK_CONF.replace("1.0.0", "0.2.0"), 1),
        case("version 2.0.0", &add, &OK_CONF.replace("1.0.0", "2.0.0"), 1),
        case("version garbage", &add, &OK_CONF.replace("1.0.0", "one"), 6),
        case(
            "CHECK at 0.3.1",
            &[("CNI_COMMAND", "CHECK")],
            &OK_CONF.replace("1.0.0", "0.3.1"),
            1,
        ),
        case("GC at 1.0.0", &[("CNI_COMMAND", "GC")], OK_CONF, 1),
        case("STATUS at 1.0.0", &[("CNI_COMMAND", "STATUS")], OK_CONF, 1),
        case(
            "no delegate",
            &add,
            &OK_CONF.replace(
                r#","delegate":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/24"}]]}"#,
                "",
            ),
            7,
        ),
        case(
            "delegate without type",
            &add,
            &OK_CONF.replace(r#""type":"host-local","#, ""),
            7,
        ),
        case(
            "socketPath not a string",
            &add,
            &OK_CONF.replace(r#""/nonexistent/dipam.sock""#, "[]"),
            7,
        ),
        case(
            "timeout negative",
            &add,
            &OK_CONF.replace(r#""socketPath""#, r#""timeoutSeconds":-1,"socketPath""#),
            7,
        ),
        case(
            "prevResult wrong shape",
            &add,
            &OK_CONF.replace(r#""ipam""#, r#""prevResult":{"ips":"nope"},"ipam""#),
            6,
        ),
        case("huge config, daemon down", &add, &huge, 7),
        case(
            "daemon down",
            &add,
            &OK_CONF.replace(r#""socketPath""#, r#""timeoutSeconds":1,"socketPath""#),
            11,
        ),
    ];
    let mut failures = Vec::new();
    for c in &cases {
        let out = rt.exec_env("dipam", "ADD", &base, c.stdin.as_bytes(), &c.env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let ok = !out.status.success()
            && v["code"] == c.code
            && v["msg"].as_str().is_some_and(|m| !m.is_empty())
            && !stderr.contains("panicked");
        if !ok {
            failures.push(format!(
                "{}: exit {:?}, stdout {}, stderr {}",
                c.name,
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                stderr
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Errors echo the config's cniVersion; VERSION works with no daemon and any stdin.
#[test]
fn error_and_version_shapes() {
    let rt = Runtime::new(format!("{}:/usr/lib/cni", bins::dir().display()));
    let att = Attachment::new("c1", "/var/run/netns/none");
    let conf = OK_CONF.replace("1.0.0", "0.4.0");
    let out = rt.exec("dipam", "ADD", &att, conf.as_bytes());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(out.status.code(), Some(1));

    for stdin in ["", r#"{"cniVersion":"0.4.0"}"#, "garbage"] {
        let out = rt.exec("dipam", "VERSION", &att, stdin.as_bytes());
        assert!(out.status.success(), "VERSION with {stdin:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
    }
}

/// The deliberately bad conflists under conflist/bad, through ptp + dipam with a live dipamd:
/// each refused with its code, and host-local holds nothing afterwards.
#[test]
fn bad_conflists_are_refused() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let expected = [
        ("missing-delegate.conflist", 7),
        ("delegate-without-type.conflist", 7),
        ("unsupported-version.conflist", 1),
        ("invalid-network-name.conflist", 7),
        ("delegate-not-installed.conflist", 152),
        ("socket-path-not-a-string.conflist", 7),
    ];
    for (file, code) in expected {
        let mut fx = Fixture::load(&format!("bad/{file}"));
        if !file.starts_with("socket-path") {
            fx = fx.with_socket(&lab.dipamd.socket());
        }
        let (_ns, att) = lab.pod();
        // Straight to dipam (ptp 1.1.1 itself rejects some of these first, e.g. 0.2.0 layouts).
        let e = lab.rt.ipam(&fx.list, 0, "ADD", &att, None).unwrap_err();
        assert_eq!(e.code, code, "{file}: {e}");
        assert!(!e.msg.is_empty(), "{file}");
    }
    assert!(lab.dipamd.ledger().is_empty());
}
