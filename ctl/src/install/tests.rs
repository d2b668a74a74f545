//! `dipamctl install` on a node in a temporary directory: the plugin is a shell script that
//! answers `--version` as dipam does (the real plugin is run by the lifecycle tests).

use std::{
    fs::{self, File, OpenOptions},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use super::*;
use crate::{
    error::InstallError,
    kube::{self, ApiConfig, Backoff, KubeError},
    man, wrap,
};

/// A stand-in for the plugin: answers `--version` as dipam does.
fn fake_plugin(dir: &Path, version: &str) -> PathBuf {
    let p = dir.join(format!("dipam-{version}"));
    fs::write(&p, format!("#!/bin/sh\necho \"dipam {version}\"\n")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

const MAIN: &str = r#"{"cniVersion":"1.0.0","name":"podnet","plugins":[
    {"type":"dipam","socketPath":"/run/dipam/dipam.sock","ipam":{"type":"host-local","ranges":[[{"subnet":"10.4.0.0/24"}]]}},
    {"type":"portmap","capabilities":{"portMappings":true}}]}"#;

struct Node {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    opts: Options,
}

fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let opts = Options {
        cni_bin_dir: tmp.path().join("opt/cni/bin"),
        conf_dir: tmp.path().join("etc/cni/net.d"),
        plugin: Some(fake_plugin(&src, "1.0.0")),
        ..Options::default()
    };
    Node {
        _tmp: tmp,
        src,
        opts,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn installs_plugin_and_conflist_with_their_modes_and_nothing_else() {
    let mut n = node();
    let list = n.src.join("in.conflist");
    fs::write(&list, MAIN).unwrap();
    n.opts.conflist = Some(list);
    let r = install(&n.opts).unwrap();

    let plugin = n.opts.cni_bin_dir.join("dipam");
    assert_eq!(
        r.plugin,
        Placed {
            path: plugin.clone(),
            changed: true
        }
    );
    assert_eq!(r.plugin_version, "dipam 1.0.0");
    assert_eq!(
        fs::read(&plugin).unwrap(),
        fs::read(n.opts.plugin.as_ref().unwrap()).unwrap()
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&plugin), 0o755);
    let conf = n.opts.conf_dir.join(DEFAULT_NAME);
    assert_eq!(fs::read_to_string(&conf).unwrap(), MAIN);
    assert_eq!(mode(&conf), 0o644);
    assert_eq!(
        r.conflist,
        Some((
            Placed {
                path: conf,
                changed: true
            },
            "podnet".into()
        ))
    );
    // No temporary file is left behind.
    assert_eq!(names(&n.opts.cni_bin_dir), ["dipam"]);
    assert_eq!(names(&n.opts.conf_dir), [DEFAULT_NAME]);
}

#[test]
fn a_second_install_changes_nothing_and_a_new_plugin_replaces_the_old() {
    let mut n = node();
    assert!(install(&n.opts).unwrap().plugin.changed);
    assert!(!install(&n.opts).unwrap().plugin.changed);

    // A process still running the old binary keeps it: the new one is a new inode.
    use std::os::unix::fs::MetadataExt;
    let target = n.opts.cni_bin_dir.join("dipam");
    let running = File::open(&target).unwrap();
    let old_inode = running.metadata().unwrap().ino();
    n.opts.plugin = Some(fake_plugin(&n.src, "2.0.0"));
    let r = install(&n.opts).unwrap();
    assert!(r.plugin.changed);
    assert_eq!(r.plugin_version, "dipam 2.0.0");
    assert_ne!(fs::metadata(&target).unwrap().ino(), old_inode);
    assert!(
        String::from_utf8(fs::read(&target).unwrap())
            .unwrap()
            .contains("2.0.0")
    );
    let out = spawn(
        Command::new(&target)
            .arg("--version")
            .stdout(std::process::Stdio::piped()),
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "dipam 2.0.0");
}

/// Spawns `cmd`, retrying ETXTBSY (`text_busy`).
fn spawn(cmd: &mut Command) -> std::process::Child {
    crate::text_busy::retry(&format!("{cmd:?}"), || cmd.spawn())
}

#[test]
fn replaces_a_binary_that_is_running() {
    // Writing into a running executable fails with ETXTBSY; a rename does not. A real
    // ELF binary: a script's text is not what the kernel keeps busy.
    let n = node();
    fs::create_dir_all(&n.opts.cni_bin_dir).unwrap();
    let target = n.opts.cni_bin_dir.join("dipam");
    fs::copy("/bin/sleep", &target).unwrap();
    let mut child = spawn(Command::new(&target).arg("30"));
    let busy = OpenOptions::new().write(true).open(&target).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::ETXTBSY));
    let r = install(&n.opts);
    let _ = child.kill();
    let _ = child.wait();
    assert!(r.unwrap().plugin.changed);
    assert!(String::from_utf8_lossy(&fs::read(&target).unwrap()).contains("dipam 1.0.0"));
}

#[test]
fn a_bad_conflist_leaves_the_node_untouched() {
    let mut n = node();
    let list = n.src.join("bad.conflist");
    fs::write(
        &list,
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"}]}"#,
    )
    .unwrap();
    n.opts.conflist = Some(list);
    let e = install(&n.opts).unwrap_err();
    assert!(e.to_string().contains("no plugin uses dipam"), "{e}");
    assert!(!n.opts.cni_bin_dir.exists());
    assert!(!n.opts.conf_dir.exists());
}

#[test]
fn refuses_what_is_not_the_dipam_plugin() {
    let mut n = node();
    let other = n.src.join("dipamd");
    fs::write(&other, "#!/bin/sh\necho \"dipamd 1.0.0\"\n").unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
    n.opts.plugin = Some(other);
    let e = install(&n.opts).unwrap_err();
    assert!(e.to_string().contains("is not the dipam plugin"), "{e}");
    n.opts.plugin = Some(n.src.join("missing"));
    let e = install(&n.opts).unwrap_err();
    assert!(e.to_string().contains("cannot run the plugin"), "{e}");
    assert!(!n.opts.cni_bin_dir.exists());
}

#[test]
fn file_names_libcni_would_misread_are_refused() {
    for bad in [
        "",
        "a/b.conflist",
        ".hidden.conflist",
        "10-dipam.conf",
        "x.json",
    ] {
        assert!(validate_file_name(bad).is_err(), "{bad:?}");
    }
    assert!(validate_file_name("99-x.conflist").is_ok());
}

#[test]
fn conflist_validation_follows_the_plugin() {
    let ok = |s: &str| validate_conflist(s.as_bytes());
    assert_eq!(ok(MAIN).unwrap(), "podnet");
    // IPAM mode, and the repository's own examples.
    assert_eq!(
        ok(r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}]}"#)
            .unwrap(),
        "n"
    );
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conflist");
    for e in fs::read_dir(&examples).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "conflist") {
            validate_conflist(&fs::read(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
    // The deliberately broken examples: all refused, except the one whose only fault is
    // a delegate missing on the node, which install cannot know.
    for e in fs::read_dir(examples.join("bad")).unwrap() {
        let p = e.unwrap().path();
        let r = validate_conflist(&fs::read(&p).unwrap());
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            r.is_ok(),
            name == "delegate-not-installed.conflist",
            "{name}: {r:?}"
        );
    }
    for (bad, why) in [
        ("not json", "not valid JSON"),
        ("[]", "JSON object"),
        (
            r#"{"name":"n","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
            "cniVersion",
        ),
        (
            r#"{"cniVersion":"2.0.0","name":"n","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
            "cniVersion \"2.0.0\"",
        ),
        (
            r#"{"cniVersion":"1.0.0","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
            "name is missing",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"a/b","plugins":[{"type":"dipam","ipam":{"type":"host-local"}}]}"#,
            "network name",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"host-local"}}"#,
            "plugins is missing",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"ipam":{"type":"dipam"}}]}"#,
            "plugins[0].type",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam"}]}"#,
            "ipam.type",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","ipam":{"type":"dipam"}}]}"#,
            "ipam.type",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam"}}]}"#,
            "ipam.delegate.type",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","socketPath":5,"ipam":{"type":"host-local"}}]}"#,
            "socketPath",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"dipam","spoolDir":"spool","ipam":{"type":"host-local"}}]}"#,
            "spoolDir",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","timeoutSeconds":0,"delegate":{"type":"host-local"}}}]}"#,
            "timeoutSeconds",
        ),
    ] {
        let e = ok(bad).unwrap_err();
        assert!(e.to_string().contains(why), "{bad}: {e}");
    }
}

#[test]
fn wrap_in_place_keeps_a_backup_and_the_mode_and_unwrap_restores_the_bytes() {
    let mut n = node();
    fs::create_dir_all(&n.opts.conf_dir).unwrap();
    let file = n.opts.conf_dir.join("10-ptp.conflist");
    let own = r#"{"cniVersion":"1.0.0","name":"kubenet","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.4.0.0/24"}}]}"#;
    fs::write(&file, own).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    n.opts.adopt = Some((Direction::Wrap, file.clone()));
    n.opts.output = Output::InPlace;
    n.opts.socket = Some("/run/node/dipam.sock".into());
    let mut out = Vec::new();
    run(&n.opts, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("plugins[0] (ptp): host-local now runs through dipam"),
        "{text}"
    );
    assert!(
        n.opts.cni_bin_dir.join("dipam").is_file(),
        "the plugin comes first"
    );
    let backup = n.opts.conf_dir.join("10-ptp.conflist.pre-wrap");
    assert_eq!(fs::read_to_string(&backup).unwrap(), own);
    let wrapped: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        wrapped["plugins"][0]["ipam"]["socketPath"],
        "/run/node/dipam.sock"
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode(&file), mode(&backup)), (0o600, 0o600));

    // --output FILE itself is refused: --in-place is the way, with its backup.
    n.opts.adopt = Some((Direction::Unwrap, file.clone()));
    n.opts.output = Output::Path(file.clone());
    let e = run(&n.opts, false, &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("use --in-place"), "{e}");
    // Beside: FILE.unwrapped, FILE untouched.
    n.opts.output = Output::Beside;
    let mut out = Vec::new();
    run(&n.opts, true, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["unwrapped"]["network"], "kubenet");
    let beside = n.opts.conf_dir.join("10-ptp.conflist.unwrapped");
    assert_eq!(fs::read_to_string(&beside).unwrap(), own);
    assert_eq!(v["unwrapped"]["path"], json!(beside));

    // A refused wrap installs nothing.
    let m = node();
    let mut opts = m.opts.clone();
    let e = {
        fs::write(&file, own.replace("1.0.0", "9.9.9")).unwrap();
        opts.adopt = Some((Direction::Wrap, file.clone()));
        install(&opts).unwrap_err()
    };
    assert!(e.to_string().contains("cniVersion \"9.9.9\""), "{e}");
    assert!(!opts.cni_bin_dir.exists());
}

fn from_node() -> RangesFrom {
    RangesFrom {
        node: "node-a".into(),
        api: ApiConfig {
            url: "https://127.0.0.1:1".into(),
            token_file: "/nonexistent/token".into(),
            ca_file: "/nonexistent/ca.crt".into(),
        },
        wait: None,
    }
}

fn answer(cidrs: &[&str]) -> PodCidrs {
    PodCidrs {
        node: "node-a".into(),
        cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        field: "spec.podCIDRs",
    }
}

/// The shipped DaemonSet's template: host-local without ranges.
const TEMPLATE: &str = r#"{"cniVersion":"1.0.0","name":"dipam","plugins":[
    {"type":"dipam","socketPath":"/run/dipam/dipam.sock","ipam":{"type":"host-local","routes":[{"dst":"0.0.0.0/0"}]}}]}"#;

#[test]
fn ranges_from_the_node_go_into_the_installed_conflist_and_only_after_local_checks() {
    let mut n = node();
    let list = n.src.join("template.conflist");
    fs::write(&list, TEMPLATE).unwrap();
    n.opts.conflist = Some(list.clone());

    // Without the node's ranges the template is refused: it would fail every ADD.
    let e = install(&n.opts).unwrap_err();
    assert!(e.to_string().contains("host-local has no ranges"), "{e}");
    assert!(!n.opts.cni_bin_dir.exists());

    // The API's answer is what gets written, one range set per family.
    n.opts.ranges = Some(from_node());
    let r = install_with(&n.opts, |from| {
        assert_eq!(from.node, "node-a");
        Ok(answer(&["10.244.5.0/24", "fd00:5::/64"]))
    })
    .unwrap();
    let written: Value =
        serde_json::from_slice(&fs::read(n.opts.conf_dir.join(DEFAULT_NAME)).unwrap()).unwrap();
    assert_eq!(
        written["plugins"][0]["ipam"]["ranges"],
        json!([[{"subnet": "10.244.5.0/24"}], [{"subnet": "fd00:5::/64"}]])
    );
    assert_eq!(
        written["plugins"][0]["ipam"]["routes"],
        json!([{"dst": "0.0.0.0/0"}])
    );
    let nr = r.ranges.unwrap();
    assert_eq!((nr.plugin, nr.replaced.as_str()), (0, ""));
    assert!(
        nr.line()
            .contains("node node-a spec.podCIDRs: 10.244.5.0/24, fd00:5::/64")
    );

    // No range yet (or any failure to read it): nothing at all is installed.
    let mut m = node();
    m.opts.conflist = Some(list);
    m.opts.ranges = Some(from_node());
    let e = install_with(&m.opts, |r| {
        Err(InstallError::Kube {
            node: r.node.clone(),
            source: KubeError::NoPodCidr {
                node: r.node.clone(),
            },
        })
    })
    .unwrap_err();
    assert!(e.to_string().contains("no podCIDR yet"), "{e}");
    assert!(!m.opts.cni_bin_dir.exists() && !m.opts.conf_dir.exists());

    // A bad conflist is refused before the API server is asked.
    let bad = m.src.join("bad.conflist");
    fs::write(
        &bad,
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"}]}"#,
    )
    .unwrap();
    m.opts.conflist = Some(bad);
    let e = install_with(&m.opts, |_| panic!("asked the API server")).unwrap_err();
    assert!(e.to_string().contains("no plugin uses dipam"), "{e}");
}

#[test]
fn ranges_from_the_node_compose_with_wrap() {
    let mut n = node();
    fs::create_dir_all(&n.opts.conf_dir).unwrap();
    let file = n.opts.conf_dir.join("10-ptp.conflist");
    let own = r#"{"cniVersion":"1.0.0","name":"kubenet","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.4.0.0/16"}}]}"#;
    fs::write(&file, own).unwrap();
    n.opts.adopt = Some((Direction::Wrap, file.clone()));
    n.opts.ranges = Some(from_node());
    let r = install_with(&n.opts, |_| Ok(answer(&["10.244.8.0/24"]))).unwrap();
    let wrapped: Value =
        serde_json::from_slice(&fs::read(n.opts.conf_dir.join("10-ptp.conflist.dipam")).unwrap())
            .unwrap();
    let d = &wrapped["plugins"][0]["ipam"];
    assert_eq!(d["type"], "dipam");
    assert_eq!(
        d["delegate"],
        json!({"type": "host-local", "ranges": [[{"subnet": "10.244.8.0/24"}]]})
    );
    assert_eq!(r.ranges.unwrap().replaced, r#"{"subnet":"10.4.0.0/16"}"#);
    // The original is untouched.
    assert_eq!(fs::read_to_string(&file).unwrap(), own);
}

#[test]
fn ranges_from_node_needs_a_conflist_and_reads_the_in_cluster_environment() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let parse = |argv: &[&str]| {
        let mut full = vec!["install"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).map(|c| c.args)
    };
    let env = |k: &str| match k {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
        "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
        _ => None,
    };
    let sock = Path::new(wrap::DEFAULT_SOCKET);
    let a = parse(&["--ranges-from-node", "n1"]).unwrap();
    let e = Options::from_args(a, sock, env).unwrap_err();
    assert!(
        e.to_string().contains("pass the conflist with --conflist"),
        "{e}"
    );
    let a = parse(&["--conflist", "x", "--ranges-from-node", "n1", "--wait"]).unwrap();
    let o = Options::from_args(a, sock, env).unwrap();
    let r = o.ranges.unwrap();
    assert_eq!(r.api.url, "https://10.96.0.1:443");
    assert_eq!(r.api.token_file, Path::new(kube::TOKEN_FILE));
    assert_eq!(r.api.ca_file, Path::new(kube::CA_FILE));
    assert_eq!(r.wait, Some(Backoff::default()));
    let a = parse(&["--conflist", "x", "--ranges-from-node", "n1"]).unwrap();
    let e = Options::from_args(a, sock, |_| None).unwrap_err();
    assert!(e.to_string().contains("--kube-api"), "{e}");
    assert!(parse(&["--conflist", "x", "--wait"]).is_err());
    assert!(parse(&["--unwrap", "x", "--ranges-from-node", "n"]).is_err());
}

#[test]
fn a_1_1_0_conflist_gets_a_warning_and_older_ones_none() {
    let at = |v: &str| format!(r#"{{"cniVersion":"{v}","name":"n","plugins":[]}}"#);
    let w = version_warning(at("1.1.0").as_bytes()).expect("1.1.0 warns");
    assert!(w.contains("containerd 1.6"), "{w}");
    assert!(w.contains("unsupported CNI result version"), "{w}");
    for v in ["0.3.1", "0.4.0", "1.0.0"] {
        assert_eq!(version_warning(at(v).as_bytes()), None, "{v}");
    }
    assert_eq!(version_warning(b"not json"), None);
}

/// By default the pages go to the share/man beside dipamctl's bin directory (where man
/// looks for a command in PATH); --man-dir moves them, --no-man-pages drops them.
#[test]
fn the_man_dir_is_beside_dipamctl_unless_told() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }
    let opts = |argv: &[&str]| {
        let mut full = vec!["install"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full)
            .map(|c| Options::from_args(c.args, Path::new(wrap::DEFAULT_SOCKET), |_| None))
    };
    let exe = std::env::current_exe().unwrap();
    let prefix = exe.parent().unwrap().parent().unwrap();
    let man_dir = |argv: &[&str]| opts(argv).unwrap().unwrap().man_dir;
    assert_eq!(man_dir(&[]), Some(prefix.join("share/man")));
    assert_eq!(man_dir(&["--man-dir", "/m"]), Some(PathBuf::from("/m")));
    assert_eq!(man_dir(&["--no-man-pages"]), None);
    assert!(opts(&["--man-dir", "/m", "--no-man-pages"]).is_err());
}

/// The man pages go under --man-dir, in man1/ and man8/, atomically and with 0644; an
/// identical page is left alone; --json names each; an unwritable man directory fails
/// the install before the plugin is touched.
#[test]
fn man_pages_go_under_the_man_dir_before_the_plugin() {
    let mut n = node();
    let man_dir = n.src.join("share/man");
    n.opts.man_dir = Some(man_dir.clone());
    let mut out = Vec::new();
    run(&n.opts, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let count = man::pages().len();
    assert!(
        text.contains(&format!(
            "man:       {count} pages in {} installed",
            man_dir.display()
        )),
        "{text}"
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for page in [
        "man1/dipamctl.1",
        "man1/dipamctl-install.1",
        "man8/dipamd.8",
        "man1/dipam.1",
    ] {
        assert_eq!(mode(&man_dir.join(page)), 0o644, "{page}");
    }
    assert_eq!(names(&man_dir.join("man8")), ["dipamd.8"]);
    assert_eq!(names(&man_dir.join("man1")).len(), count - 1);

    let mut out = Vec::new();
    run(&n.opts, true, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    let pages = v["manPages"]["pages"].as_array().unwrap();
    assert_eq!(pages.len(), count);
    assert!(pages.iter().all(|p| p["changed"] == false), "{v}");
    assert!(
        pages
            .iter()
            .any(|p| p["path"] == man_dir.join("man1/dipam.1").to_str().unwrap()),
        "{v}"
    );

    // A man directory that cannot be made: nothing is installed.
    let blocked = n.src.join("a-file");
    fs::write(&blocked, "").unwrap();
    fs::remove_file(n.opts.cni_bin_dir.join("dipam")).unwrap();
    n.opts.man_dir = Some(blocked.join("man"));
    let e = install(&n.opts).unwrap_err();
    assert!(e.to_string().contains("writing the man page"), "{e}");
    assert!(!n.opts.cni_bin_dir.join("dipam").exists());

    // Without a man directory (--no-man-pages), none: the JSON says null.
    n.opts.man_dir = None;
    let mut out = Vec::new();
    run(&n.opts, true, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert!(v["manPages"].is_null(), "{v}");
}

#[test]
fn run_prints_a_line_per_file_or_json() {
    let mut n = node();
    let list = n.src.join("in.conflist");
    fs::write(&list, MAIN).unwrap();
    n.opts.conflist = Some(list);
    let mut out = Vec::new();
    run(&n.opts, false, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("(dipam 1.0.0) installed"), "{text}");
    assert!(text.contains("(network podnet) installed"), "{text}");
    let mut out = Vec::new();
    run(&n.opts, true, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["plugin"]["changed"], false);
    assert_eq!(v["conflist"]["network"], "podnet");
}

#[test]
fn a_bad_file_name_is_refused_with_the_default_as_example() {
    let e = validate_file_name("a/b").unwrap_err().to_string();
    assert!(e.ends_with(&format!("e.g. {DEFAULT_NAME}")), "{e}");
}
