//! A delegate's store as untrusted input (issue 28 §4, docs/cfp.md "Threat model"). dipamd
//! runs as root, reads host-local's store and runs host-local as root in it. An allowed uid
//! (nobody, 65534, a real process through setpriv, `--allow-uid`) may not have the store kept
//! in a directory it can write, and entries that are not small regular files (a FIFO, a link
//! to a device of endless zeros, a huge file) never stop dipamd from serving: not while it
//! runs, and not at its next start. dipamd runs under the shipped unit's capability set, and
//! started like the DaemonSet (deployment.rs).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::PermissionsExt,
    time::{Duration, Instant},
};

use dipam_lifecycle::{Lab, Runtime, deployment::Deployment, nobody, require_root};
use serde_json::json;

/// A lab whose dipamd admits nobody, restarted as `d` starts it.
fn lab(d: Deployment) -> Lab {
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &nobody::ALLOWED);
    d.start(&mut lab, None, &[]);
    lab
}

/// nobody points host-local's dataDir at a directory it owns, with `lock` and
/// `last_reserved_ip.0` linked to a root-only file and to a path of its choosing (host-local,
/// as root, once overwrote the one and created the other), and then at dipamd's own state
/// directory. Both are refused with 155, naming the fix; nothing is written; root's pods are
/// served and the ledger and host-local agree.
#[test]
fn a_non_root_caller_cannot_choose_where_root_writes_the_store() {
    cannot_choose_the_store(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn a_non_root_caller_cannot_choose_where_root_writes_the_store_daemonset() {
    cannot_choose_the_store(Deployment::DaemonSet);
}

/// A directory nobody owns, holding `<network>/lock` linked to a root-only file and
/// `<network>/last_reserved_ip.0` linked to a path nobody chose: what host-local, as root,
/// would overwrite and create if it kept its store there.
struct Planted {
    mine: tempfile::TempDir,
    _victim: tempfile::TempDir,
    secret: std::path::PathBuf,
    chosen: std::path::PathBuf,
}

impl Planted {
    fn new(net: &str) -> Self {
        let mine = dipam_lifecycle::temp_dir("nobodys-store-");
        let victim = dipam_lifecycle::temp_dir("root-only-");
        let secret = victim.path().join("secret");
        std::fs::write(&secret, "root's\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let chosen = victim.path().join("created-by-root");
        let planted = mine.path().join(net);
        std::fs::create_dir(&planted).unwrap();
        std::os::unix::fs::symlink(&secret, planted.join("lock")).unwrap();
        std::os::unix::fs::symlink(&chosen, planted.join("last_reserved_ip.0")).unwrap();
        for p in [mine.path(), &planted] {
            std::os::unix::fs::lchown(p, Some(65534), Some(65534)).unwrap();
        }
        Self {
            mine,
            _victim: victim,
            secret,
            chosen,
        }
    }

    /// Root's file is as it was and nothing was created where nobody pointed.
    fn assert_untouched(&self, lab: &Lab) {
        assert_eq!(std::fs::read_to_string(&self.secret).unwrap(), "root's\n");
        assert!(
            !self.chosen.exists(),
            "host-local created {}",
            self.chosen.display()
        );
        assert!(
            !lab.dipamd.state_dir().join(lab.network()).exists(),
            "host-local wrote into dipamd's state directory"
        );
    }
}

/// Root's pods are served, nobody's own pod in the store dipamd allows still works, and the
/// ledger and host-local agree throughout.
fn assert_served(lab: &Lab) {
    lab.assert_serves(5);
    let conf = Runtime::plugin_config(lab.list(), 0, None);
    let cid = dipam_lifecycle::unique("nobody-ok");
    let answer = nobody::ipam("ADD", &cid, &conf);
    assert!(answer.get("code").is_none(), "{answer}");
    lab.assert_agree();
    assert!(nobody::ipam("DEL", &cid, &conf).get("code").is_none());
    lab.assert_agree();
}

fn cannot_choose_the_store(d: Deployment) {
    require_root!();
    let lab = lab(d);
    let planted = Planted::new(&lab.network());
    for dir in [planted.mine.path(), lab.dipamd.state_dir().as_path()] {
        let mut conf = Runtime::plugin_config(lab.list(), 0, None);
        conf["ipam"]["delegate"]["dataDir"] = json!(dir);
        let cid = dipam_lifecycle::unique("nobody-store");
        let answer = nobody::ipam("ADD", &cid, &conf);
        assert_eq!(answer["code"], 155, "{}: {answer}", dir.display());
        let details = answer["details"].as_str().unwrap_or_default();
        assert!(
            details.contains("--non-root-data-dir") && details.contains("ipam.dataDir"),
            "{answer}"
        );
    }
    planted.assert_untouched(&lab);
    assert_served(&lab);
}

/// nobody spells host-local's `dataDir` another way (`DataDir`, `datadir`, `DATADIR`, alone or
/// after an allowed `dataDir`), or names the network or `ipam` in another case at the top:
/// host-local's Go decoder matches keys case-insensitively and keeps the last, so each once
/// put the store where nobody chose while dipamd checked the allowed one. Each is refused
/// with 7 naming the spelling, before host-local runs; nothing is written through nobody's
/// links, and root's pods are served.
#[test]
fn a_non_root_caller_cannot_respell_the_store_key() {
    cannot_respell_the_store_key(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn a_non_root_caller_cannot_respell_the_store_key_daemonset() {
    cannot_respell_the_store_key(Deployment::DaemonSet);
}

/// A respelling nobody tries: the key it uses, and how it puts it into a config (given the
/// directory nobody owns).
type Respell = (&'static str, fn(&mut serde_json::Value, &serde_json::Value));

fn cannot_respell_the_store_key(d: Deployment) {
    require_root!();
    let lab = lab(d);
    let planted = Planted::new(&lab.network());
    let mine = json!(planted.mine.path());
    let respelled: [Respell; 6] = [
        ("DataDir", |c, mine| {
            c["ipam"]["delegate"]["DataDir"] = mine.clone()
        }),
        ("datadir", |c, mine| {
            c["ipam"]["delegate"]["datadir"] = mine.clone()
        }),
        ("DATADIR", |c, mine| {
            c["ipam"]["delegate"]["DATADIR"] = mine.clone()
        }),
        ("datadir", |c, mine| {
            c["ipam"]["delegate"]["dataDir"] = json!("/var/lib/cni/networks");
            c["ipam"]["delegate"]["datadir"] = mine.clone();
        }),
        ("IPAM", |c, mine| {
            c["IPAM"] = json!({"type": "host-local", "dataDir": mine});
        }),
        ("Name", |c, _| c["Name"] = json!("other-net")),
    ];
    for (key, respell) in respelled {
        let mut conf = Runtime::plugin_config(lab.list(), 0, None);
        respell(&mut conf, &mine);
        let cid = dipam_lifecycle::unique("nobody-respelled");
        let answer = nobody::ipam("ADD", &cid, &conf);
        assert_eq!(answer["code"], 7, "{key}: {answer}");
        let said = format!("{}{}", answer["msg"], answer["details"]);
        assert!(said.contains(key), "{key}: {answer}");
        // Nothing was allocated: a DEL has nothing to release, and succeeds.
        let del = nobody::ipam("DEL", &cid, &Runtime::plugin_config(lab.list(), 0, None));
        assert!(del.get("code").is_none(), "{key}: {del}");
    }
    planted.assert_untouched(&lab);
    assert!(
        std::fs::read_dir(planted.mine.path().join(lab.network()))
            .unwrap()
            .count()
            == 2,
        "host-local reserved an address in nobody's directory"
    );
    assert_served(&lab);
}

/// Issue 38 §3 (low). A `--non-root-data-dir` in a directory open to everyone (sticky, as
/// /tmp is) is removed while dipamd runs (a tmp cleaner, an operator). It was checked only at
/// start, so nobody could make it again, with its own links in it, and have host-local write
/// through them as root. Now it is judged at each use: missing, root makes it again before
/// nobody's ADD runs (served, and the directory is root's); made first by nobody, with links
/// to a root-only file and to a path of its choosing, nobody's ADD is refused with 155 naming
/// the owner, and nothing is written through the links. Root's pods are served throughout.
#[test]
fn a_removed_non_root_data_dir_is_made_again_by_root_never_by_the_caller() {
    removed_store(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn a_removed_non_root_data_dir_is_made_again_by_root_never_by_the_caller_daemonset() {
    removed_store(Deployment::DaemonSet);
}

/// nobody runs `cmd` and it succeeds.
fn as_nobody(cmd: &[&str]) {
    let out = nobody::run(cmd, &[], "");
    assert!(out.status.success(), "nobody's {cmd:?}: {out:?}");
}

fn removed_store(d: Deployment) {
    use std::os::unix::fs::MetadataExt;
    require_root!();
    let open = dipam_lifecycle::temp_dir("open-to-all-");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let store = open.path().join("nobodys-store");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = store.display().to_string();
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &nobody::allowed_and(&["--non-root-data-dir", &dir]),
    );
    d.start(&mut lab, None, &[open.path()]);
    let net = lab.network();
    let mut conf = Runtime::plugin_config(lab.list(), 0, None);
    conf["ipam"]["delegate"]["dataDir"] = json!(dir);
    let subnet = format!("10.248.{}.0/24", std::process::id() % 250);
    conf["ipam"]["delegate"]["ranges"] = json!([[{ "subnet": subnet }]]);
    let served = |when: &str| {
        let cid = dipam_lifecycle::unique("nobody-store");
        let answer = nobody::ipam("ADD", &cid, &conf);
        assert!(answer.get("code").is_none(), "{when}: {answer}");
        let del = nobody::ipam("DEL", &cid, &conf);
        assert!(del.get("code").is_none(), "{when}: {del}");
    };
    served("while the directory is as the operator made it");

    std::fs::remove_dir_all(&store).unwrap();
    served("after the directory was removed");
    let remade = std::fs::symlink_metadata(&store).unwrap();
    assert!(
        remade.is_dir() && remade.uid() == 0 && remade.mode() & 0o022 == 0,
        "made again, and root's alone: {remade:?}"
    );

    std::fs::remove_dir_all(&store).unwrap();
    let victim = tempfile::tempdir().unwrap();
    let secret = victim.path().join("secret");
    std::fs::write(&secret, "root's\n").unwrap();
    let chosen = victim.path().join("created-by-root");
    let theirs = store.join(&net);
    as_nobody(&["mkdir", &dir]);
    as_nobody(&["mkdir", theirs.to_str().unwrap()]);
    as_nobody(&[
        "ln",
        "-s",
        secret.to_str().unwrap(),
        theirs.join("lock").to_str().unwrap(),
    ]);
    as_nobody(&[
        "ln",
        "-s",
        chosen.to_str().unwrap(),
        theirs.join("last_reserved_ip.0").to_str().unwrap(),
    ]);
    let cid = dipam_lifecycle::unique("nobody-planted");
    let answer = nobody::ipam("ADD", &cid, &conf);
    assert_eq!(answer["code"], 155, "{answer}");
    assert!(
        answer["msg"].as_str().unwrap_or_default().contains("65534"),
        "{answer}"
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's\n");
    assert!(!chosen.exists(), "host-local created {}", chosen.display());
    assert_eq!(std::fs::symlink_metadata(&store).unwrap().uid(), 65534);
    lab.assert_serves(5);
    lab.assert_agree();
}

/// Entries planted in a network's store (a FIFO, a link to /dev/zero, a 1 MiB file, each
/// named by an address), as whoever could write there would: dipamd restarted on that store
/// binds its socket, `dipamctl status` answers at once, the entries are skipped with a
/// warning, and RSS stays small. host-local itself reads every entry of its store on ADD (and
/// would hang on the FIFO), which is why no non-root caller may choose where the store lives
/// (the test above); once the entries are gone, root's pods are served and nothing was lost.
#[test]
fn planted_store_entries_never_stop_dipamd() {
    planted_entries(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn planted_store_entries_never_stop_dipamd_daemonset() {
    planted_entries(Deployment::DaemonSet);
}

fn planted_entries(d: Deployment) {
    require_root!();
    let mut lab = lab(d);
    let (_ns, pod) = lab.pod();
    lab.rt.add(lab.list(), &pod).unwrap();
    let store = lab.data.path().join(lab.network());
    let third = lab.subnet.cidr.split('.').nth(2).unwrap().to_owned();
    let prefix = lab
        .subnet
        .cidr
        .split('.')
        .take(2)
        .collect::<Vec<_>>()
        .join(".");
    let name = |last: u8| store.join(format!("{prefix}.{third}.{last}"));
    assert!(
        std::process::Command::new("mkfifo")
            .arg(name(250))
            .status()
            .unwrap()
            .success()
    );
    std::os::unix::fs::symlink("/dev/zero", name(251)).unwrap();
    std::fs::write(name(252), vec![b'x'; 1 << 20]).unwrap();

    lab.dipamd.kill9();
    let started = Instant::now();
    lab.dipamd.start_again();
    let bound = started.elapsed();
    let mut took = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let status = lab.dipamd.ctl(&["status"]);
        took.push(t.elapsed());
        assert!(status.status.success(), "{status:?}");
    }
    let pid = lab.dipamd.pid().unwrap();
    let rss = dipam_lifecycle::flood::rss_kib(pid);
    eprintln!(
        "planted store ({}): bound after {bound:?}, status in {took:?}, RSS {rss} KiB",
        d.name()
    );
    assert!(bound < Duration::from_secs(30), "{bound:?}");
    assert!(took.iter().all(|t| *t < Duration::from_secs(5)), "{took:?}");
    assert!(rss < 256 * 1024, "RSS {rss} KiB");
    let log = lab.dipamd.log();
    assert!(
        log.contains("skipped a delegate store entry"),
        "no skip warning:\n{log}"
    );
    for last in [250, 251, 252] {
        std::fs::remove_file(name(last)).unwrap();
    }
    lab.assert_serves(5);
    lab.rt.del(lab.list(), &pod).unwrap();
    lab.assert_agree();
}
