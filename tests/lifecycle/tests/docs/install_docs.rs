//! The install commands in README.md and deploy/README.md work as written on a fresh machine.
//!
//! Every shell block marked `<!-- install-test: ... -->` in those two files is extracted and
//! run, unchanged, by `bash -euo pipefail` in a private mount namespace whose system
//! directories are those of a fresh Debian 12: an empty `/opt` (no `/opt/cni/bin`), an empty
//! `/usr/local/bin` and `/usr/local/share/man`, and a copy of this machine's `/etc` without
//! `/etc/cni`, each a temp directory bind-mounted over the real one, so the test sees exactly
//! what the commands wrote and the machine's own directories are never touched. The working directory is a
//! stand-in checkout: the repository's conflist/ and deploy/ files, and the binaries where
//! `cargo build --release` would put them. `cargo` and `rustup` are stand-ins that record
//! their arguments (the build itself is not what is tested, and a release build would cost
//! CI minutes); `rustc` is the real one.
//!
//! Then every file must be in place with its mode: the plugin 0755 in /opt/cni/bin, dipamd
//! and dipamctl 0755 in /usr/local/bin, the conflist and unit 0644, /etc/default/dipamd,
//! and the man pages 0644 in /usr/local/share/man (dipamctl's and one per command, dipamd's,
//! dipam's), each of which `man -l` (man-db, tests/deps.sh) renders naming every command and
//! flag the binary's `--help` lists, and for dipam every config key.
//! The old README line (`install -m 0755 ... /opt/cni/bin/dipam`) fails on the same root, so
//! the root is as fresh as claimed.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use dipam_lifecycle::{bins, mode, require_root};
use tempfile::TempDir;

const MARK: &str = "<!-- install-test:";
const MUSL: &str = "x86_64-unknown-linux-musl";

/// The shell blocks of `doc` marked for this test, each with its marker line.
fn blocks(doc: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(bins::workspace().join(doc)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with(MARK) {
            continue;
        }
        assert_eq!(
            lines.get(i + 1).copied(),
            Some("```sh"),
            "{doc}:{}: a marker must sit right above a ```sh block",
            i + 1
        );
        let body: Vec<&str> = lines[i + 2..]
            .iter()
            .take_while(|l| **l != "```")
            .copied()
            .collect();
        out.push((l.to_string(), body.join("\n") + "\n"));
    }
    out
}

fn host_triple() -> String {
    let out = Command::new("rustc").arg("-vV").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .unwrap()
}

fn which(tool: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{tool} not in PATH"))
}

/// A fresh machine's system directories (under `root`), a stand-in checkout, and the build
/// tools' stand-ins.
struct Fresh {
    dir: TempDir,
}

impl Fresh {
    fn new() -> Self {
        let dir = dipam_lifecycle::temp_dir("fresh-root-");
        let f = Self { dir };
        // Debian 12 ships an empty /opt and /usr/local/bin, and no /etc/cni.
        std::fs::create_dir_all(f.root("opt")).unwrap();
        std::fs::create_dir_all(f.root("usr/local/bin")).unwrap();
        std::fs::create_dir_all(f.root("usr/local/share/man")).unwrap();
        let st = Command::new("cp")
            .arg("-a")
            .arg("/etc")
            .arg(f.root("etc"))
            .status()
            .unwrap();
        assert!(st.success());
        let _ = std::fs::remove_dir_all(f.root("etc/cni"));

        // The checkout: what the blocks read, and the binaries where cargo puts them.
        let co = f.checkout();
        for sub in ["conflist", "deploy"] {
            let st = Command::new("cp")
                .arg("-a")
                .arg(bins::workspace().join(sub))
                .arg(&co)
                .status()
                .unwrap();
            assert!(st.success());
        }
        let release = co.join("target").join(host_triple()).join("release");
        let musl = co.join("target").join(MUSL).join("release");
        bins::copy_stripped(&release);
        std::fs::create_dir_all(&musl).unwrap();
        std::fs::copy(release.join("dipam"), musl.join("dipam")).unwrap();

        // cargo and rustup record their arguments; rustc is the real one (also when it
        // lives under /usr/local/bin, which the namespace hides).
        let stubs = f.stubs();
        std::fs::create_dir_all(&stubs).unwrap();
        for tool in ["cargo", "rustup"] {
            let p = stubs.join(tool);
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\necho \"{tool} $*\" >> {}\n",
                    f.dir.path().join("calls").display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::os::unix::fs::symlink(which("rustc"), stubs.join("rustc")).unwrap();
        f
    }

    fn root(&self, sub: &str) -> PathBuf {
        self.dir.path().join("root").join(sub)
    }

    fn checkout(&self) -> PathBuf {
        let p = self.dir.path().join("checkout");
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn stubs(&self) -> PathBuf {
        self.dir.path().join("stubs")
    }

    /// A binary as the build left it in the checkout.
    fn built(&self, name: &str) -> PathBuf {
        self.checkout()
            .join("target")
            .join(host_triple())
            .join("release")
            .join(name)
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls")).unwrap_or_default()
    }

    /// Runs `script` with bash on the fresh root, in the checkout.
    fn run(&self, script: &str) -> Output {
        let file = self.dir.path().join("block.sh");
        std::fs::write(&file, script).unwrap();
        let setup = format!(
            "set -e\n\
             mount --bind {opt} /opt\n\
             mount --bind {ulb} /usr/local/bin\n\
             mount --bind {man} /usr/local/share/man\n\
             mount --bind {etc} /etc\n\
             cd {co}\n\
             export PATH={stubs}:$PATH\n\
             exec bash -euo pipefail {file}\n",
            opt = self.root("opt").display(),
            ulb = self.root("usr/local/bin").display(),
            man = self.root("usr/local/share/man").display(),
            etc = self.root("etc").display(),
            co = self.checkout().display(),
            stubs = self.stubs().display(),
            file = file.display(),
        );
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash", "-c"])
            .arg(setup)
            .output()
            .unwrap()
    }

    #[track_caller]
    fn ok(&self, what: &str, script: &str) {
        let what = format!("{what} on a fresh root:\n{script}\n");
        dipam_lifecycle::cmd::ok_named(&what, &self.run(script));
    }
}

#[track_caller]
fn assert_file(path: &Path, want_mode: u32, same_as: Option<&Path>) {
    assert_eq!(mode(path), want_mode, "{}", path.display());
    if let Some(src) = same_as {
        assert!(
            std::fs::read(path).unwrap() == std::fs::read(src).unwrap(),
            "{} is not {}",
            path.display(),
            src.display()
        );
    }
}

/// `bin ARGS --help`.
fn help(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} --help: {out:?}",
        bin.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The commands a clap `--help` lists (but `help`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a clap `--help` lists as options.
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ',', '=', '['])
                .find(|w| w.starts_with("--") && w.len() > 2)
                .map(str::to_owned)
        })
        .collect()
}

/// A man page as `man -l` renders it for a reader, without hyphenation or line breaks
/// inside a flag.
fn man(page: &Path) -> String {
    let out = Command::new("man")
        .args(["--nh", "--nj", "-l"])
        .arg(page)
        .env("MANWIDTH", "1000")
        .env("MANPAGER", "cat")
        .output()
        .expect("man (tests/deps.sh installs man-db)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "man -l {}: {out:?}",
        page.display()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every man page `dipamctl install` wrote under `dir` (a man directory) is there, 0644, and
/// names what the binaries' `--help` names: dipamctl's every command (each with its own page
/// naming its flags, nested commands too), dipamd's every flag, dipam's every config key.
fn assert_man_pages(dir: &Path, bins: impl Fn(&str) -> PathBuf) {
    let ctl = bins("dipamctl");
    let mut want = vec![(vec![], PathBuf::from("man1/dipamctl.1"))];
    let mut at = 0;
    while at < want.len() {
        let path: Vec<String> = want[at].0.clone();
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let h = help(&ctl, &args);
        let page = man(&dir.join(&want[at].1));
        for c in commands(&h) {
            let name = format!("dipamctl-{}", [args.clone(), vec![&c]].concat().join("-"));
            assert!(
                page.contains(&format!("{name}(1)")),
                "{}: no {name}",
                want[at].1.display()
            );
            let mut sub = path.clone();
            sub.push(c);
            want.push((sub, PathBuf::from(format!("man1/{name}.1"))));
        }
        for f in flags(&h) {
            assert!(
                page.contains(&f),
                "{}: no {f}\n{page}",
                want[at].1.display()
            );
        }
        assert_file(&dir.join(&want[at].1), 0o644, None);
        at += 1;
    }
    assert!(want.len() > 10, "{want:?}");

    let dipamd = man(&dir.join("man8/dipamd.8"));
    for f in flags(&help(&bins("dipamd"), &[])) {
        assert!(dipamd.contains(&f), "dipamd(8): no {f}");
    }
    let dipam = man(&dir.join("man1/dipam.1"));
    let plugin_help = help(&bins("dipam"), &[]);
    let keys: Vec<&str> = plugin_help
        .lines()
        .skip_while(|l| !l.starts_with("Config keys"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(keys.contains(&"spoolDir"), "{plugin_help}");
    for k in keys {
        assert!(dipam.contains(k), "dipam(1): no {k}\n{dipam}");
    }
    // Nothing but these pages: a man directory holds what install put there.
    let written: usize = ["man1", "man8"]
        .iter()
        .map(|s| std::fs::read_dir(dir.join(s)).unwrap().count())
        .sum();
    assert_eq!(written, want.len() + 2);
}

#[test]
fn readme_install_and_adopt_work_as_written_on_a_fresh_root() {
    require_root!();
    let b = blocks("README.md");
    assert_eq!(b.len(), 2, "README.md's marked blocks: install, adopt");
    let fresh = Fresh::new();

    // The root is fresh: the old README's plugin line fails on it.
    let old = fresh.run("install -m 0755 /bin/true /opt/cni/bin/dipam\n");
    assert!(!old.status.success(), "{old:?}");

    fresh.ok(&b[0].0, &b[0].1);
    assert_file(
        &fresh.root("opt/cni/bin/dipam"),
        0o755,
        Some(&fresh.built("dipam")),
    );
    for name in ["dipam", "dipamd", "dipamctl"] {
        assert_file(
            &fresh.root("usr/local/bin").join(name),
            0o755,
            Some(&fresh.built(name)),
        );
    }
    // `dipamctl install` from /usr/local/bin put the man pages where man looks for it.
    assert_man_pages(&fresh.root("usr/local/share/man"), |b| fresh.built(b));
    let calls = fresh.calls();
    assert!(calls.contains("cargo build --release\n"), "{calls}");
    assert!(
        calls.contains(&format!(
            "cargo build --release -p dipam-plugin --target {MUSL}"
        )),
        "{calls}"
    );

    // Adopting the node's own conflist, with the dipamctl the first block installed.
    let netd = fresh.root("etc/cni/net.d");
    std::fs::create_dir_all(&netd).unwrap();
    let own = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kubenet",
        "plugins": [{
            "type": "ptp",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]]}
        }]
    });
    let own_text = serde_json::to_string_pretty(&own).unwrap();
    std::fs::write(netd.join("10-ptp.conflist"), &own_text).unwrap();
    fresh.ok(&b[1].0, &b[1].1);
    let wrapped: serde_json::Value =
        serde_json::from_slice(&std::fs::read(netd.join("10-ptp.conflist")).unwrap()).unwrap();
    assert_eq!(wrapped["plugins"][0]["ipam"]["type"], "dipam", "{wrapped}");
    assert_eq!(
        wrapped["plugins"][0]["ipam"]["delegate"],
        own["plugins"][0]["ipam"]
    );
    assert_eq!(
        std::fs::read_to_string(netd.join("10-ptp.conflist.pre-wrap")).unwrap(),
        own_text
    );
}

#[test]
fn deploy_systemd_install_works_as_written_on_a_fresh_root() {
    require_root!();
    let b = blocks("deploy/README.md");
    assert_eq!(b.len(), 1, "deploy/README.md's marked blocks: systemd");
    let fresh = Fresh::new();
    fresh.ok(&b[0].0, &b[0].1);

    for name in ["dipamd", "dipamctl"] {
        assert_file(
            &fresh.root("usr/local/bin").join(name),
            0o755,
            Some(&fresh.built(name)),
        );
    }
    assert_file(
        &fresh.root("opt/cni/bin/dipam"),
        0o755,
        Some(&fresh.built("dipam")),
    );
    assert_file(
        &fresh.root("etc/cni/net.d/10-dipam.conflist"),
        0o644,
        Some(&bins::workspace().join("conflist/dipam-host-local.conflist")),
    );
    assert_file(
        &fresh.root("etc/systemd/system/dipamd.service"),
        0o644,
        Some(&bins::workspace().join("deploy/systemd/dipamd.service")),
    );
    // The unit reads its flags from /etc/default/dipamd: every one of them is dipamd's.
    let opts = std::fs::read_to_string(fresh.root("etc/default/dipamd")).unwrap();
    let unit =
        std::fs::read_to_string(bins::workspace().join("deploy/systemd/dipamd.service")).unwrap();
    assert!(
        unit.contains("EnvironmentFile=-/etc/default/dipamd"),
        "{unit}"
    );
    let help = Command::new(fresh.built("dipamd"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let value = opts
        .trim()
        .strip_prefix("DIPAMD_OPTS=\"")
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{opts:?}"));
    for flag in value.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "dipamd has no {flag}");
    }
}
