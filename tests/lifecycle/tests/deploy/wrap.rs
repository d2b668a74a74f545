//! `dipamctl install --wrap` / `--unwrap` as a node runs them: the node's own conflist (each
//! example in conflist/ with dipam taken out by `--unwrap`, and the conflist podman 4.3 writes,
//! tests/lifecycle/fixtures/) is adopted in place with one command, then a pod goes through
//! the wrapped chain (Debian's plugins, a real dipamd, the plugin binary as installed by that
//! command) and gets an address from the range the original host-local config names. Unwrap
//! gives the original back, and what cannot be adopted safely is refused with exit 1 and the
//! reason, leaving every file as it was.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use dipam_lifecycle::{
    Attachment, Dipamd, Fixture, NetNs, Runtime, Subnet,
    azure::{self, AzureNode},
    bins,
    cmd::ok,
    daemon, require_root,
    runtime::result_ips,
    unique,
};
use serde_json::{Value, json};
use tempfile::TempDir;

const PODMAN: &str = "podman-4.3.1-bridge.conflist";

/// `dipamctl --socket S install ARGS`.
fn ctl(socket: &Path, args: &[&str]) -> Output {
    daemon::ctl_at(socket, &[&["install"][..], args].concat())
}

#[track_caller]
fn refused(out: &Output, why: &str) {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("dipamctl: ") && stderr.contains(why),
        "expected {why:?} in {stderr}"
    );
}

fn parse(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// A bridge the bridge plugin leaves behind after DEL, removed on drop.
struct Bridge(Option<String>);

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            let _ = Command::new("ip").args(["link", "del", b]).output();
        }
    }
}

/// A node: its CNI config and bin directories, a dipamd, the delegate's store.
struct Node {
    dir: TempDir,
    dipamd: Dipamd,
    rt: Runtime,
}

impl Node {
    fn new() -> Self {
        Self::serving(None)
    }

    /// A node whose dipamd runs `azure`'s real azure-vnet-ipam, when given.
    fn serving(azure: Option<&AzureNode>) -> Self {
        let dir = dipam_lifecycle::temp_dir("wrap-");
        fs::create_dir_all(dir.path().join("net.d")).unwrap();
        fs::create_dir_all(dir.path().join("store")).unwrap();
        let bin = dir.path().join("bin");
        let mut dipamd = Dipamd::unstarted(&[]);
        let mut cni_path = bins::cni_path();
        if let Some(node) = azure {
            node.serve(&mut dipamd);
            cni_path = node.cni_path();
        }
        dipamd.start_again();
        // The plugin the runtime execs is the copy `install --wrap` put into the bin dir.
        let rt = Runtime::new(format!("{}:{cni_path}", bin.display()));
        Self { dir, dipamd, rt }
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.dir.path().join("net.d").join(name)
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// `install --wrap FILE --in-place`, as the README tells a node to run it.
    fn wrap_in_place(&self, file: &Path, extra: &[&str]) -> String {
        let bin = self.dir.path().join("bin");
        let args = [&["--in-place"][..], extra].concat();
        ok(&daemon::install_wrap(
            &self.dipamd.socket(),
            file,
            &bin,
            &args,
        ))
    }

    /// A pod through `list`: ADD, CHECK, DEL; returns the address it got.
    fn pod(&self, list: &Value, subnet: &Subnet) -> String {
        let network = list["name"].as_str().unwrap();
        let ns = NetNs::new();
        let att = Attachment::new(&unique("pod"), &ns.path());
        let result = self
            .rt
            .add(list, &att)
            .unwrap_or_else(|e| panic!("ADD through the wrapped chain: {e}\n{list:#}"));
        let ips = result_ips(&result);
        assert_eq!(ips.len(), 1, "{result}");
        assert!(subnet.contains(&ips[0]), "{ips:?} not in {}", subnet.cidr);
        // dipamd recorded it: the address went through dipam, not around it.
        assert_eq!(
            self.dipamd.ledger_pairs(network),
            vec![(att.container_id.clone(), ips[0].clone())]
        );
        let shown = ns.exec(&["ip", "-o", "addr", "show", "eth0"]);
        assert!(
            String::from_utf8_lossy(&shown.stdout).contains(&format!("{}/", ips[0])),
            "{}",
            String::from_utf8_lossy(&shown.stdout)
        );
        if list["cniVersion"] != "0.3.1" {
            self.rt
                .check(list, &att)
                .unwrap_or_else(|e| panic!("CHECK: {e}"));
        }
        self.rt
            .del(list, &att)
            .unwrap_or_else(|e| panic!("DEL: {e}"));
        assert!(self.dipamd.ledger_pairs(network).is_empty());
        ips[0].clone()
    }
}

/// Each example of conflist/: `--unwrap` gives the node's own conflist (the example without
/// dipam), `--wrap --in-place` adopts it again, a pod gets an address from the example's range
/// through it, and the adopted file is the example (with this node's socket); unwrapping it
/// gives the node's conflist back byte for byte.
#[test]
fn every_example_unwraps_wraps_and_runs_a_pod() {
    require_root!();
    let mut examples: Vec<String> = fs::read_dir(bins::workspace().join("conflist"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".conflist"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 6, "{examples:?}");
    for example in examples {
        let raw = Fixture::load(&example);
        let is_azure = raw.delegate() == "azure-vnet-ipam";
        let subnet = Subnet::claim(if is_azure { azure::PREFIX } else { "10.77" });
        // The azure examples run the real plugin (its file-backed pool on this subnet).
        let azure = is_azure.then(|| AzureNode::for_subnet(&subnet, 20));
        let node = Node::serving(azure.as_ref());
        let mut fx = raw
            .unique_name()
            .with_delegate_state(&node.store())
            .with_subnet(&subnet.cidr);
        if let Some(a) = &azure {
            fx = fx.with_delegate_conf(&a.delegate());
        }
        let mut bridge = Bridge(None);
        for p in fx.list["plugins"].as_array_mut().unwrap() {
            if p["type"] == "bridge" {
                let name = format!("dpw{}", subnet.index);
                p["bridge"] = json!(name);
                bridge.0 = Some(name);
            }
        }
        let main = if fx.is_main_mode() {
            vec!["--main-mode"]
        } else {
            vec![]
        };
        let file = node.conf("10-node.conflist");
        fs::write(&file, serde_json::to_vec_pretty(&fx.list).unwrap()).unwrap();

        // The node's own conflist: dipam taken out.
        let mut args = vec!["--unwrap", file.to_str().unwrap(), "--in-place"];
        args.extend(&main);
        let printed = ok(&ctl(&node.dipamd.socket(), &args));
        assert!(printed.contains("unwrapped:"), "{example}: {printed}");
        let own = fs::read(&file).unwrap();
        assert!(
            !String::from_utf8_lossy(&own).contains("\"dipam\""),
            "{example}: {}",
            String::from_utf8_lossy(&own)
        );

        // Adopted with one command.
        let printed = node.wrap_in_place(&file, &main);
        assert!(printed.contains("wrapped:"), "{example}: {printed}");
        assert_eq!(
            fs::read(file.with_extension("conflist.pre-wrap")).unwrap(),
            own,
            "{example}: the backup is the node's conflist"
        );
        let wrapped = parse(&file);
        let expected = fx.clone().with_socket(&node.dipamd.socket()).list;
        assert_eq!(wrapped, expected, "{example}");

        node.pod(&wrapped, &subnet);

        // unwrap(wrap(x)) == x, to the byte.
        let back = node.conf("back.conflist");
        let mut args = vec![
            "--unwrap",
            file.to_str().unwrap(),
            "--output",
            back.to_str().unwrap(),
        ];
        args.extend(&main);
        ok(&ctl(&node.dipamd.socket(), &args));
        assert_eq!(fs::read(&back).unwrap(), own, "{example}");
    }
}

/// The conflist podman 4.3 writes for a bridge network (bridge + host-local, portmap,
/// firewall, tuning): adopted in place, the pod gets an address from podman's own range
/// (the range, bridge and network name changed only so that tests can run side by side), and
/// unwrapping restores podman's file byte for byte.
#[test]
fn a_podman_network_is_adopted_in_place() {
    require_root!();
    let node = Node::new();
    let subnet = Subnet::claim("10.77");
    let original = fs::read_to_string(
        bins::workspace()
            .join("tests/lifecycle/fixtures")
            .join(PODMAN),
    )
    .unwrap();
    let network = unique("podnet");
    let bridge = Bridge(Some(format!("dpw{}", subnet.index)));
    // Text edits, so that the rest stays as podman wrote it.
    let own = original
        .replace("10.89.7.0/24", &subnet.cidr)
        .replace("10.89.7.1", &subnet.gateway())
        .replace("cni-podman1", bridge.0.as_deref().unwrap())
        .replace("\"podnet\"", &format!("{network:?}"))
        .replace(
            "\"type\": \"host-local\",",
            &format!(
                "\"type\": \"host-local\",\n            \"dataDir\": {:?},",
                node.store()
            ),
        );
    let file = node.conf("87-podman-bridge.conflist");
    fs::write(&file, &own).unwrap();

    let printed = node.wrap_in_place(&file, &[]);
    assert!(
        printed.contains("plugins[0] (bridge): host-local now runs through dipam (IPAM mode)"),
        "{printed}"
    );
    let wrapped = parse(&file);
    let mut expected: Value = serde_json::from_str(&own).unwrap();
    let ipam = expected["plugins"][0]["ipam"].take();
    expected["plugins"][0]["ipam"] = json!({
        "type": "dipam",
        "socketPath": node.dipamd.socket(),
        "delegate": ipam,
    });
    assert_eq!(wrapped, expected);

    let ip = node.pod(&wrapped, &subnet);
    assert_ne!(
        ip,
        subnet.gateway(),
        "host-local keeps the gateway for the bridge"
    );

    let printed = ok(&ctl(
        &node.dipamd.socket(),
        &["--unwrap", file.to_str().unwrap(), "--in-place", "--json"],
    ));
    let report: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(report["unwrapped"]["delegate"], "host-local");
    assert_eq!(report["unwrapped"]["network"], network.as_str());
    assert_eq!(fs::read_to_string(&file).unwrap(), own);
}

/// The untouched podman file: wrapped beside itself (FILE.dipam, which no runtime loads) with
/// only the ipam value changed, and unwrapped to its exact bytes.
#[test]
fn podman_bytes_survive_a_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("podnet.conflist");
    let original = fs::read(
        bins::workspace()
            .join("tests/lifecycle/fixtures")
            .join(PODMAN),
    )
    .unwrap();
    fs::write(&file, &original).unwrap();
    let plugin_dir = dir.path().join("bin");
    let default_socket = Path::new("/run/dipam/dipam.sock");
    ok(&daemon::install_wrap(
        default_socket,
        &file,
        &plugin_dir,
        &[],
    ));
    assert_eq!(
        fs::read(&file).unwrap(),
        original,
        "FILE itself is untouched"
    );
    let wrapped = dir.path().join("podnet.conflist.dipam");
    let v = parse(&wrapped);
    // The default socket is not written.
    assert_eq!(
        v["plugins"][0]["ipam"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["delegate", "type"]
    );
    ok(&ctl(
        Path::new("/run/dipam/dipam.sock"),
        &["--unwrap", wrapped.to_str().unwrap()],
    ));
    assert_eq!(
        fs::read(dir.path().join("podnet.conflist.dipam.unwrapped")).unwrap(),
        original
    );
}

/// What cannot be adopted safely is refused: exit 1, the reason on stderr, no file written,
/// nothing installed.
#[test]
fn refusals_exit_1_with_the_reason_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sock = Path::new("/run/dipam/dipam.sock");
    let bin = dir.path().join("bin");
    let wrap = |name: &str, text: &str, extra: &[&str]| {
        let file = dir.path().join(name);
        fs::write(&file, text).unwrap();
        let args = [&["--in-place"][..], extra].concat();
        let out = daemon::install_wrap(sock, &file, &bin, &args);
        assert_eq!(fs::read_to_string(&file).unwrap(), text, "{name} changed");
        out
    };
    let ptp = |version: &str| {
        format!(
            r#"{{"cniVersion":"{version}","name":"n","plugins":[{{"type":"ptp","ipam":{{"type":"host-local"}}}}]}}"#
        )
    };
    refused(
        &wrap(
            "a.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"},{"type":"portmap"}]}"#,
            &[],
        ),
        "no plugin carries an IPAM",
    );
    refused(
        &wrap("b.conflist", &ptp("2.0.0"), &[]),
        "cniVersion \"2.0.0\" is not one dipam can carry",
    );
    refused(
        &wrap("c.conflist", "{\"cniVersion\": ", &[]),
        "not valid JSON",
    );
    refused(
        &wrap(
            "d.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"macvlan","ipam":{"type":"dhcp"}}]}"#,
            &[],
        ),
        "choose one with --plugin-index N",
    );
    refused(
        &wrap(
            "e.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"host-local","ipam":{"type":"host-local"}}]}"#,
            &[],
        ),
        "pass --main-mode",
    );
    // A conflist dipam itself would refuse once wrapped (the plugin's own checks).
    refused(
        &wrap(
            "f.conflist",
            r#"{"cniVersion":"1.0.0","name":"bad/name","plugins":[{"type":"ptp","ipam":{"type":"host-local"}}]}"#,
            &[],
        ),
        "dipam would refuse the wrapped conflist: network name",
    );
    // conflist/bad/: each already uses dipam, or names a version dipam cannot carry.
    for e in fs::read_dir(bins::workspace().join("conflist/bad")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let why = if name == "unsupported-version.conflist" {
            "cniVersion \"0.2.0\""
        } else {
            "plugins[0] already uses dipam"
        };
        refused(&wrap(&name, &fs::read_to_string(&p).unwrap(), &[]), why);
    }
    // Nothing was installed, no output or backup was written.
    assert!(!bin.exists());
    let left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".conflist"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Unwrap: not dipam, or no IPAM to restore; and main mode needs consent.
    let unwrap = |name: &str, text: &str, extra: &[&str]| {
        let file = dir.path().join(name);
        fs::write(&file, text).unwrap();
        let mut args = vec!["--unwrap", file.to_str().unwrap(), "--in-place"];
        args.extend(extra);
        let out = ctl(sock, &args);
        assert_eq!(fs::read_to_string(&file).unwrap(), text, "{name} changed");
        out
    };
    refused(
        &unwrap("u1.conflist", &ptp("1.0.0"), &[]),
        "no plugin uses dipam",
    );
    refused(
        &unwrap(
            "u2.conflist",
            &fs::read_to_string(bins::workspace().join("conflist/bad/missing-delegate.conflist"))
                .unwrap(),
            &[],
        ),
        "no delegate object",
    );
    refused(
        &unwrap(
            "u3.conflist",
            &fs::read_to_string(bins::workspace().join("conflist/dipam-host-local-1.1.0.conflist"))
                .unwrap(),
            &[],
        ),
        "pass --main-mode",
    );
    // Flags that only make sense with --wrap/--unwrap: clap's usage error, exit 2.
    let out = ctl(sock, &["--in-place"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
