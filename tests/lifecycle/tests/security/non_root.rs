//! Non-root callers (docs/cfp.md, "Threat model"), run as a real uid (nobody, 65534, through
//! setpriv) against a real dipamd started as docs/troubleshooting.md suggests for rootless
//! podman: `--socket-group nogroup --allow-uid 65534`. Such a caller never has its own
//! binary run as root, never touches or sees another caller's attachment, and does not get
//! the Admin and Agent services unless `--admin-uid` names it. Also: the state directory is
//! private, and oversized values are refused without being echoed.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
};

use dipam_lifecycle::{
    Lab, Runtime, bins,
    nobody::{self, NOBODY},
    require_root,
};
use serde_json::{Value, json};

const ALLOW: [&str; 4] = ["--socket-group", NOBODY, "--allow-uid", NOBODY];

/// A lab whose dipamd admits nobody; its directory is opened so nobody reaches the socket
/// (the socket's own mode and group, and the peer check, are what is tested).
fn lab(extra: &[&str]) -> Lab {
    let flags: Vec<&str> = ALLOW.iter().chain(extra).copied().collect();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &flags);
    std::fs::set_permissions(
        lab.dipamd.dir.path(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    lab
}

/// Restarts the lab's dipamd under the capability bounding set and no-new-privs of the
/// shipped systemd unit (`setpriv`), the shape a node runs it in (privileges.rs runs every
/// verb so; here the non-root rules and the state directory's modes are checked under it).
fn under_shipped_unit(lab: &mut Lab) {
    let unit =
        std::fs::read_to_string(bins::workspace().join("deploy/systemd/dipamd.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("CapabilityBoundingSet="))
        .flat_map(|v| v.split_whitespace())
        .map(|c| format!("+{}", c.to_ascii_lowercase().trim_start_matches("cap_")))
        .collect();
    assert!(!caps.is_empty(), "the unit bounds dipamd's capabilities");
    let mut argv = vec![
        "setpriv".to_owned(),
        "--bounding-set".to_owned(),
        format!("-all,{}", caps.join(",")),
    ];
    if unit.lines().any(|l| l.trim() == "NoNewPrivileges=yes") {
        argv.push("--no-new-privs".into());
    }
    lab.dipamd.kill9();
    lab.dipamd.run_under(&argv);
    lab.dipamd.start_again();
    let pid = lab.dipamd.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        bnd & (1 << 21),
        0,
        "dipamd still has CAP_SYS_ADMIN: {bnd:x}"
    );
}

/// The dipam plugin invoked as the IPAM plugin (as ptp would) by nobody, for `cid`.
fn nobody_ipam(command: &str, cid: &str, conf: &Value, cni_path: &str) -> Value {
    let dipam = bins::bin("dipam").display().to_string();
    let out = nobody::run(
        &[&dipam],
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/nobodys"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", ""),
            ("CNI_PATH", cni_path),
        ],
        &conf.to_string(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.trim().is_empty() {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return Value::Null;
    }
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v.get("code").is_some(), !out.status.success(), "{v}");
    v
}

fn ctl_as_nobody(lab: &Lab, args: &[&str]) -> std::process::Output {
    let ctl = bins::bin("dipamctl").display().to_string();
    let sock = lab.dipamd.socket().display().to_string();
    let mut cmd = vec![ctl.as_str(), "--socket", sock.as_str()];
    cmd.extend_from_slice(args);
    nobody::run(&cmd, &[], "")
}

/// A directory nobody owns with its own `host-local` (and `evil-ipam`): each records the
/// euid it ran as in `ran`, and answers with an address outside every test subnet.
fn attackers_dir() -> tempfile::TempDir {
    let dir = dipam_lifecycle::temp_dir("nobodys-");
    let ran = dir.path().join("ran");
    let script = format!(
        "#!/bin/sh\necho \"euid=$(id -u) $CNI_COMMAND\" >> {}\n\
         echo '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"10.99.99.99/24\"}}]}}'\n",
        ran.display()
    );
    for name in ["host-local", "evil-ipam"] {
        let p = dir.path().join(name);
        std::fs::write(&p, &script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    }
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn ran(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ran")).unwrap_or_default()
}

/// The acceptance test of the exec rule, with dipamd under the shipped unit's capabilities: a
/// non-root caller whose CNI_PATH names its own
/// directory first, holding its own `host-local`, gets its address from dipamd's host-local
/// (recorded under its uid), and its binary never runs, as root or at all. A delegate type
/// outside --non-root-delegate is refused with 155, even one only its directory holds.
#[test]
fn a_non_root_callers_own_host_local_never_runs_as_root() {
    require_root!();
    let mut lab = lab(&[]);
    under_shipped_unit(&mut lab);
    let evil = attackers_dir();
    let cni_path = format!("{}:{}", evil.path().display(), bins::cni_path());
    let conf = Runtime::plugin_config(lab.list(), 0, None);

    let cid = dipam_lifecycle::unique("nobody-pod");
    let result = nobody_ipam("ADD", &cid, &conf, &cni_path);
    assert!(result.get("code").is_none(), "{result}");
    let ip = result["ips"][0]["address"].as_str().unwrap().to_owned();
    assert!(
        lab.subnet.contains(&ip),
        "{ip} is not from dipamd's host-local"
    );
    assert_eq!(ran(evil.path()), "", "the caller's host-local ran");
    let store = lab.delegate_store();
    assert_eq!(store.len(), 1, "{store:?}");
    assert_eq!(store[0].0, cid);
    lab.assert_agree();
    let rec = lab
        .dipamd
        .ledger()
        .into_iter()
        .find(|a| a["containerID"] == cid.as_str())
        .unwrap();
    assert_eq!(rec["creatorUid"], 65534, "{rec}");

    for kind in ["evil-ipam", "bridge"] {
        let mut bad = conf.clone();
        bad["ipam"]["delegate"]["type"] = json!(kind);
        let e = nobody_ipam("ADD", "nobody-other", &bad, &cni_path);
        assert_eq!(e["code"], 155, "{kind}: {e}");
        assert!(e["msg"].as_str().unwrap().contains(kind), "{e}");
        assert!(
            e["details"]
                .as_str()
                .unwrap()
                .contains("--non-root-delegate"),
            "{e}"
        );
    }
    assert_eq!(ran(evil.path()), "");

    // Its own attachment it may release; the caller's binary still never runs.
    let prev = Runtime::plugin_config(lab.list(), 0, Some(&result));
    assert_eq!(nobody_ipam("DEL", &cid, &prev, &cni_path), Value::Null);
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
    assert_eq!(ran(evil.path()), "");
    assert!(
        lab.dipamd.log().contains("not dipamd's"),
        "the refusal is logged"
    );
}

/// Another pod's attachment is out of a non-root caller's reach: its DEL and CHECK are
/// refused (155) while the pod keeps its address, an ADD under the pod's container ID is
/// refused, a GC is refused, and its listing shows only what it added.
#[test]
fn a_non_root_caller_cannot_release_or_see_roots_pods() {
    require_root!();
    let lab = lab(&[]);
    let (_ns, pod) = lab.pod();
    let root_result = lab.rt.add(lab.list(), &pod).unwrap();
    let held = lab.delegate_store();
    assert_eq!(held.len(), 1);

    let cni_path = bins::cni_path();
    let prev = Runtime::plugin_config(lab.list(), 0, Some(&root_result));
    for verb in ["DEL", "CHECK"] {
        let e = nobody_ipam(verb, &pod.container_id, &prev, &cni_path);
        assert_eq!(e["code"], 155, "{verb}: {e}");
        assert!(e["msg"].as_str().unwrap().contains("another caller"), "{e}");
    }
    // Under the pod's container ID in another network: refused, nothing allocated.
    let mut other = Runtime::plugin_config(lab.list(), 0, None);
    other["name"] = json!(format!("{}-x", lab.network()));
    let e = nobody_ipam("ADD", &pod.container_id, &other, &cni_path);
    assert_eq!(e["code"], 155, "{e}");
    // GC would free every caller's attachments.
    let mut gc = Runtime::plugin_config(lab.list(), 0, None);
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([]);
    let dipam = bins::bin("dipam").display().to_string();
    let out = nobody::run(
        &[&dipam],
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", cni_path.as_str())],
        &gc.to_string(),
    );
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["code"], 155, "{e}");

    // The pod still holds its address, in the ledger and in host-local's store, and works.
    assert_eq!(lab.delegate_store(), held);
    lab.assert_agree();
    lab.rt.check(lab.list(), &pod).unwrap();

    // nobody's own attachment, and the listing: its own only; root sees both.
    let mine = nobody_ipam(
        "ADD",
        "nobody-1",
        &Runtime::plugin_config(lab.list(), 0, None),
        &cni_path,
    );
    assert!(mine.get("code").is_none(), "{mine}");
    let out = ctl_as_nobody(&lab, &["attachments", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["containerID"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["nobody-1".to_owned()], "{listed:#}");
    assert_eq!(lab.dipamd.ledger().len(), 2);

    lab.rt.del(lab.list(), &pod).unwrap();
    let left: Vec<_> = lab.delegate_store().into_iter().map(|(c, _)| c).collect();
    assert_eq!(left, vec!["nobody-1".to_owned()]);
    lab.assert_agree();
}

/// Admin and Agent: refused to an --allow-uid caller (PERMISSION_DENIED, which dipamctl
/// reports), served once --admin-uid names it; an admin sees every attachment, listed a
/// page at a time.
#[test]
fn admin_and_agent_services_need_admin_uid() {
    require_root!();
    let mut lab = lab(&[]);
    let (_ns, pod) = lab.pod();
    lab.rt.add(lab.list(), &pod).unwrap();
    for args in [
        &["status"][..],
        &["agent", "list"],
        &["doctor"],
        &["explain", "x"],
    ] {
        let out = ctl_as_nobody(&lab, args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--admin-uid"), "{args:?}: {err}");
    }
    assert!(lab.dipamd.log().contains("not in --admin-uid"));

    let flags: Vec<&str> = ALLOW
        .iter()
        .copied()
        .chain(["--admin-uid", NOBODY])
        .collect();
    lab.dipamd.set_flags(&flags);
    lab.dipamd.restart();
    for args in [&["status"][..], &["agent", "list"], &["doctor"]] {
        let out = ctl_as_nobody(&lab, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = ctl_as_nobody(&lab, &["attachments", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");

    // Five pods listed two a page (dipamd answers one page a request): every one exactly
    // once, the JSON and the table as one listing in one request.
    let more: Vec<_> = (0..4).map(|_| lab.pod()).collect();
    for (_, att) in &more {
        lab.rt.add(lab.list(), att).unwrap();
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let out = ctl_as_nobody(&lab, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["containerID"].as_str().unwrap().to_owned())
            .collect();
        ids
    };
    let whole = ids(&["attachments", "--json"]);
    assert_eq!(whole.len(), 5, "{whole:?}");
    let mut distinct = whole.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct, whole,
        "one listing is in key order, each attachment once"
    );
    assert_eq!(ids(&["attachments", "--json", "--page-size", "2"]), whole);
    assert_eq!(
        ids(&[
            "attachments",
            "--json",
            "--page-size",
            "1",
            "--owner",
            "pod",
            "--network",
            &lab.network()
        ]),
        whole
    );
    let table = ctl_as_nobody(&lab, &["attachments", "--page-size", "2"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("5 attachment(s)"), "{text}");
    // The table shortens a hex container ID to its first 16 digits (output.rs).
    let shown = |id: &String| {
        let hex = id.len() > 16 && id.chars().all(|c| c.is_ascii_hexdigit());
        if hex { id[..16].to_owned() } else { id.clone() }
    };
    assert!(whole.iter().all(|id| text.contains(&shown(id))), "{text}");
    let refused = ctl_as_nobody(&lab, &["attachments", "--page-size", "0"]);
    assert!(!refused.status.success(), "a page size of 0 is refused");

    for (_, att) in &more {
        lab.rt.del(lab.list(), att).unwrap();
    }
    lab.rt.del(lab.list(), &pod).unwrap();
    lab.assert_agree();
}

/// Every directory dipamd makes in a fresh state directory is 0700 and every file 0600 or
/// narrower (the ledger, the journal, the witness, the exec slots...). A state directory
/// opened to 0755 is flagged by doctor, and narrowed again at the next start.
#[test]
fn the_state_directory_is_private_and_doctor_flags_a_chmod() {
    require_root!();
    let mut lab = lab(&[]);
    // Narrowing its own files needs no CAP_FOWNER: the unit's set is enough.
    under_shipped_unit(&mut lab);
    let (_ns, pod) = lab.pod();
    lab.rt.add(lab.list(), &pod).unwrap();
    let state = lab.dipamd.state_dir();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&state), 0o700);
    let mut seen = 0;
    let mut todo = vec![state.clone()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                assert_eq!(mode(&p), 0o700, "{}", p.display());
                todo.push(p);
            } else if m.is_file() {
                assert_eq!(mode(&p) & 0o077, 0, "{} is {:o}", p.display(), mode(&p));
                seen += 1;
            }
        }
    }
    assert!(seen >= 3, "the ledger's files were all checked ({seen})");

    let private = |lab: &Lab| -> Value {
        let out = lab.dipamd.ctl(&["doctor", "--json"]);
        let checks: Value = serde_json::from_slice(&out.stdout).unwrap();
        checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "state directory is private")
            .cloned()
            .unwrap_or_else(|| panic!("{checks:#}"))
    };
    assert_eq!(private(&lab)["ok"], true);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = private(&lab);
    assert_eq!(c["ok"], false, "{c}");
    assert!(c["detail"].as_str().unwrap().contains("mode 755"), "{c}");
    assert!(!c["fix"].as_str().unwrap().is_empty());
    // Root-owned files a user could read are what is at stake: nobody reads none of them.
    let out = nobody::run(&["ls", &state.display().to_string()], &[], "");
    assert!(
        out.status.success(),
        "0755 lets nobody list it: the case doctor flags"
    );

    lab.dipamd.restart();
    assert_eq!(mode(&state), 0o700);
    assert_eq!(private(&lab)["ok"], true);
    assert_eq!(std::fs::metadata(&state).unwrap().uid(), 0);
    lab.rt.del(lab.list(), &pod).unwrap();
}

/// A 1 MiB value comes back as RESOURCE_EXHAUSTED (or a CNI error on the Cni service),
/// with a short message that never echoes it; bad operator input is INVALID_ARGUMENT; a
/// request beyond the decode limit is RESOURCE_EXHAUSTED too.
#[test]
fn oversized_fields_are_refused_without_echo() {
    use dipam_proto::v1::{
        AgentRoleRequest, CniRequest, ExplainRequest, Mode, admin_client::AdminClient,
        agent_client::AgentClient, cni_client::CniClient, cni_reply::Outcome,
    };
    require_root!();
    let lab = lab(&[]);
    let socket = lab.dipamd.socket();
    let conf = Runtime::plugin_config(lab.list(), 0, None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let huge = "r".repeat(1 << 20);
    rt.block_on(async {
        let channel = dipam_proto::connect(&socket).await.unwrap();
        let mut agent = AgentClient::new(channel.clone());
        let mut admin = AdminClient::new(channel.clone());
        let mut cni = CniClient::new(channel);
        let role = |role: &str| AgentRoleRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            role: role.to_owned(),
        };
        let e = agent.allocate(role(&huge)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{:?}", e.code());
        assert!(e.message().len() < 300, "{} bytes", e.message().len());
        let e = agent.allocate(role(&"x".repeat(200))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{:?}", e.code());
        assert!(e.message().len() < 300, "{}", e.message());
        // Beyond the whole-request limit: refused before decoding, same code.
        let e = agent.allocate(role(&huge.repeat(3))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().len() < 300);

        let e = admin
            .explain(ExplainRequest {
                protocol_version: dipam_proto::PROTOCOL_VERSION,
                container_id: huge.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{:?}", e.code());
        assert!(e.message().len() < 300);

        for (cid, ifname, netns) in [
            (huge.as_str(), "eth0", "/x"),
            ("c1", huge.as_str(), "/x"),
            ("c1", "eth0", huge.as_str()),
        ] {
            let reply = cni
                .add(CniRequest {
                    protocol_version: dipam_proto::PROTOCOL_VERSION,
                    request_id: "huge".into(),
                    command: "ADD".into(),
                    container_id: cid.into(),
                    netns: netns.into(),
                    ifname: ifname.into(),
                    cni_path: bins::cni_path(),
                    stdin: serde_json::to_vec(&conf).unwrap(),
                    mode: Mode::Ipam as i32,
                    ..CniRequest::default()
                })
                .await
                .unwrap()
                .into_inner();
            let Some(Outcome::Error(e)) = reply.outcome else {
                panic!("{:?}", reply.outcome)
            };
            assert_eq!(e.code, 4, "{}", e.msg);
            assert!(e.msg.len() + e.details.len() < 400, "{}", e.msg);
        }
    });
    assert!(lab.dipamd.ledger().is_empty());
    assert!(lab.delegate_store().is_empty());
    // Nor did any of it reach the log whole (a request's values key its log span).
    let log = std::fs::metadata(lab.dipamd.log_path()).unwrap().len();
    assert!(log < 256 << 10, "dipamd's log grew to {log} bytes");
}
