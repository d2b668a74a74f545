#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{PermissionsExt, symlink};

use super::*;

/// The shipped unit, as installed.
const SHIPPED_UNIT: &str = include_str!("../../deploy/systemd/dipamd.service");
/// The shipped DaemonSet.
const MANIFEST: &str = include_str!("../../deploy/kubernetes/dipam.yaml");

fn os(words: &[&str]) -> Vec<OsString> {
    words.iter().map(OsString::from).collect()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_shipped_unit_reads_as_systemd_starts_it() {
    let mut s = Service::default();
    s.apply(SHIPPED_UNIT, Path::new("dipamd.service")).unwrap();
    // /etc/default/dipamd on top, as the unit's comment suggests.
    let mut e = s.environment.clone();
    e.extend(environment_file(
        "# moved\nDIPAM_STATE_DIR=/srv/dipam\nDIPAMD_OPTS=\"--conflist /etc/node-a/net.d/10-dipam.conflist --spool-dir=/srv/spool\"\n",
    ));
    let argv = s.exec_start(&e, Path::new("u")).unwrap();
    assert_eq!(
        argv,
        os(&[
            "/usr/local/bin/dipamd",
            "--conflist",
            "/etc/node-a/net.d/10-dipam.conflist",
            "--spool-dir=/srv/spool",
        ])
    );
    let (r, spool_named) = parse(&argv, &e, Path::new("/"), "the unit").unwrap();
    assert_eq!(r.socket, PathBuf::from("/run/dipam/dipam.sock"));
    assert_eq!(r.state_dir, PathBuf::from("/srv/dipam"));
    assert_eq!(r.spool_dir, PathBuf::from("/srv/spool"));
    assert!(spool_named);
    assert_eq!(r.cni_path, "/opt/cni/bin:/usr/lib/cni");
    assert_eq!(
        r.conflist,
        Some(PathBuf::from("/etc/node-a/net.d/10-dipam.conflist"))
    );
    assert_eq!(
        r.cri_endpoint.as_deref(),
        Some("unix:///run/containerd/containerd.sock")
    );
    // Without /etc/default/dipamd: the unit's defaults, the spool not named.
    let argv = s.exec_start(&s.environment, Path::new("u")).unwrap();
    assert_eq!(argv, os(&["/usr/local/bin/dipamd"]));
    let (r, spool_named) = parse(&argv, &s.environment, Path::new("/"), "u").unwrap();
    assert_eq!(r.state_dir, PathBuf::from("/var/lib/dipam"));
    assert!(!spool_named);
}

/// The DaemonSet's dipamd `command`, as the manifest writes it (a list of strings, comments
/// between them).
fn daemonset_command() -> Vec<String> {
    let at = MANIFEST.find("        - name: dipamd\n").unwrap();
    let rest = &MANIFEST[at..];
    let from = rest.find("command:\n").unwrap() + "command:\n".len();
    rest[from..]
        .lines()
        .map(str::trim)
        .take_while(|l| l.starts_with('-') || l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("- "))
        .map(|w| w.trim_matches('"').to_owned())
        .collect()
}

#[test]
fn the_daemonsets_command_reads_as_dipamd_reads_it() {
    let mut argv = daemonset_command();
    assert_eq!(argv[0], "dipamd");
    // What the kubelet expands.
    for a in &mut argv {
        *a = a.replace("$(NODE_NAME)", "node-a");
    }
    let argv: Vec<OsString> = argv.into_iter().map(OsString::from).collect();
    let e = env(&[("DIPAM_POOL_TARGET", "0"), ("NODE_NAME", "node-a")]);
    let (r, spool_named) = parse(&argv, &e, Path::new("/"), "the DaemonSet").unwrap();
    assert_eq!(r.state_dir, PathBuf::from("/var/lib/dipam"));
    assert_eq!(r.spool_dir, PathBuf::from("/var/lib/dipam/spool"));
    assert!(spool_named);
    assert_eq!(r.socket, PathBuf::from("/run/dipam/dipam.sock"));
    assert_eq!(r.cni_path, "/opt/cni/bin");
    assert_eq!(
        r.conflist,
        Some(PathBuf::from("/etc/cni/net.d/10-dipam.conflist"))
    );
    assert_eq!(r.metrics_address.as_deref(), Some("127.0.0.1:9475"));
}

#[test]
fn a_flag_beats_its_variable_and_dipamctls_own_environment_is_not_read() {
    // The test process's environment may hold DIPAM_SOCKET (a lifecycle run): never read.
    let e = env(&[
        ("DIPAM_STATE_DIR", "/from-env"),
        ("DIPAM_CNI_PATH", "/e/bin"),
    ]);
    let argv = os(&["dipamd", "--state-dir", "rel/state", "--future-flag", "x"]);
    let (r, _) = parse(&argv, &e, Path::new("/work"), "t").unwrap();
    assert_eq!(r.state_dir, PathBuf::from("/work/rel/state"));
    assert_eq!(r.cni_path, "/e/bin");
    // An absolute default stays as it is.
    assert_eq!(r.socket, PathBuf::from("/run/dipam/dipam.sock"));
}

#[test]
fn drop_ins_reset_and_override_exec_start_and_the_environment() {
    let mut s = Service::default();
    s.apply(SHIPPED_UNIT, Path::new("u")).unwrap();
    s.apply(
        "[Service]\nExecStart=\nExecStart=-/opt/dipam/dipamd --socket \"/run/node a/d.sock\" \\\n  ${EXTRA} $DIPAMD_OPTS\nEnvironment=\"EXTRA=--cni-path /x/bin\" DIPAMD_OPTS=\n",
        Path::new("d"),
    )
    .unwrap();
    let argv = s.exec_start(&s.environment, Path::new("u")).unwrap();
    assert_eq!(
        argv,
        os(&[
            "/opt/dipam/dipamd",
            "--socket",
            "/run/node a/d.sock",
            "--cni-path /x/bin",
        ])
    );
    // A section other than [Service] is not read; a quote left open is an error.
    let mut t = Service::default();
    t.apply("[Unit]\nExecStart=/nope\n", Path::new("u"))
        .unwrap();
    assert!(t.exec_start(&[], Path::new("u")).is_err());
    assert!(words("a \"b").is_err());
}

/// A fake /proc with one process.
fn process(proc: &Path, pid: u32, uid: u32, exe: &Path, argv: &[&str], environ: &[&str]) {
    let d = proc.join(pid.to_string());
    std::fs::create_dir_all(&d).unwrap();
    symlink(exe, d.join("exe")).unwrap();
    symlink("/", d.join("cwd")).unwrap();
    std::fs::write(d.join("cmdline"), argv.join("\0") + "\0").unwrap();
    std::fs::write(d.join("environ"), environ.join("\0") + "\0").unwrap();
    std::fs::write(
        d.join("status"),
        format!("Name:\tdipamd\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
    )
    .unwrap();
}

/// A node under `root`: its /proc and unit directories (both empty) and a dipamd binary.
fn fake_node(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let exe = root.join("bin/dipamd");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::write(&exe, "").unwrap();
    (root.join("proc"), root.join("units"), exe)
}

#[test]
fn the_running_dipamd_of_the_socket_is_read_and_a_non_roots_refused() {
    let t = tempfile::tempdir().unwrap();
    let (proc, units, exe) = fake_node(t.path());
    process(
        &proc,
        10,
        0,
        &exe,
        &["dipamd", "--socket", "/run/b.sock"],
        &[],
    );
    process(
        &proc,
        20,
        0,
        &exe,
        &["dipamd", "--socket", "/run/a.sock"],
        &["DIPAM_STATE_DIR=/srv/a"],
    );
    process(
        &proc,
        30,
        1000,
        &exe,
        &["dipamd", "--socket", "/run/a.sock"],
        &[],
    );
    let sources = sources(proc, units);
    let f = find(&sources, for_socket("/run/a.sock"));
    let l = f.launch.unwrap();
    assert_eq!(l.record.state_dir, PathBuf::from("/srv/a"));
    assert_eq!(l.record.pid, 20);
    assert_eq!(
        l.source,
        "from the command line of the running dipamd pid 20"
    );
    assert!(!l.spool_named);
    // pid 10 comes first, serving another socket; pid 30 is not reached.
    assert_eq!(f.passed_over, Vec::<String>::new());
    let f = find(&sources, for_socket("/run/c.sock"));
    assert!(f.launch.is_none());
    assert!(
        f.refused[0].contains("pid 30 runs as uid 1000"),
        "{:?}",
        f.refused
    );
    assert!(
        f.passed_over[0].contains("pid 10 (/run/b.sock), pid 20 (/run/a.sock)"),
        "{:?}",
        f.passed_over
    );
}

/// The fake node's sources: its /proc and unit directory.
fn sources(proc: PathBuf, units: PathBuf) -> Sources {
    Sources {
        proc,
        unit_dirs: vec![units],
    }
}

/// The dipamd serving `socket`.
fn for_socket(socket: &str) -> Wanted<'_> {
    Wanted {
        socket: Path::new(socket),
        state_dir: None,
    }
}

/// `find` for /run/a.sock on the fake node finds no dipamd, and says nothing of it.
fn finds_nothing_in_silence(proc: PathBuf, units: PathBuf) {
    let f = find(&sources(proc, units), for_socket("/run/a.sock"));
    assert!(f.launch.is_none());
    assert_eq!(f.refused, Vec::<String>::new());
    assert_eq!(f.passed_over, Vec::<String>::new());
}

/// A dipamd that ends while it is read (its /proc files gone, as when another dipamd on the
/// node is stopping) is no running dipamd and no warning: a quiet `recover` stayed quiet.
#[test]
fn a_dipamd_that_ends_while_it_is_read_is_passed_over_in_silence() {
    let t = tempfile::tempdir().unwrap();
    let (proc, units, exe) = fake_node(t.path());
    process(
        &proc,
        40,
        0,
        &exe,
        &["dipamd", "--socket", "/run/a.sock"],
        &[],
    );
    std::fs::remove_file(proc.join("40/environ")).unwrap();
    finds_nothing_in_silence(proc, units);
}

/// `dipamd --version` and `dipamd --help` print and exit: no running dipamd, and no
/// warning. A `recover` printed "refused the arguments of a running dipamd" while another
/// process on the node asked dipamd its version.
#[test]
fn a_dipamd_asked_its_version_or_help_is_passed_over_in_silence() {
    let t = tempfile::tempdir().unwrap();
    let (proc, units, exe) = fake_node(t.path());
    process(&proc, 50, 0, &exe, &["dipamd", "--version"], &[]);
    process(&proc, 51, 0, &exe, &["dipamd", "-h"], &[]);
    process(&proc, 52, 0, &exe, &["dipamd", "--help"], &[]);
    finds_nothing_in_silence(proc, units);
}

#[test]
fn an_installed_unit_is_read_when_trusted_and_refused_when_loose() {
    if !nix::unistd::geteuid().is_root() {
        // The trust rule believes only root's files: a non-root run cannot make one.
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (etc, lib) = (t.path().join("etc"), t.path().join("lib"));
    for d in [etc.join("dipamd.service.d"), lib.join("dipamd.service.d")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(lib.join(UNIT), SHIPPED_UNIT).unwrap();
    let env_file = t.path().join("default-dipamd");
    std::fs::write(&env_file, "DIPAMD_OPTS=--state-dir /srv/n\n").unwrap();
    // The same name in /etc hides /lib's.
    std::fs::write(
        lib.join("dipamd.service.d/10-env.conf"),
        "[Service]\nEnvironmentFile=/nonexistent\n",
    )
    .unwrap();
    std::fs::write(
        etc.join("dipamd.service.d/10-env.conf"),
        format!("[Service]\nEnvironmentFile=-{}\n", env_file.display()),
    )
    .unwrap();
    let sources = Sources {
        proc: t.path().join("no-proc"),
        unit_dirs: vec![etc.clone(), lib.clone()],
    };
    let wanted = Wanted {
        socket: Path::new("/run/dipam/dipam.sock"),
        state_dir: None,
    };
    let l = find(&sources, wanted).launch.unwrap();
    assert_eq!(l.record.state_dir, PathBuf::from("/srv/n"));
    assert!(
        l.source.starts_with(&format!(
            "from the systemd unit {} + {}",
            lib.join(UNIT).display(),
            etc.join("dipamd.service.d/10-env.conf").display()
        )),
        "{}",
        l.source
    );
    // Another dipamd's state directory: passed over.
    let other = Wanted {
        socket: Path::new("/run/dipam/dipam.sock"),
        state_dir: Some(Path::new("/srv/other")),
    };
    let f = find(&sources, other);
    assert!(
        f.launch.is_none() && f.passed_over[0].contains("/srv/n"),
        "{f:?}"
    );
    // A group-writable environment file, then drop-in: refused, saying why.
    for loose in [env_file.clone(), etc.join("dipamd.service.d/10-env.conf")] {
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o664)).unwrap();
        let f = find(&sources, wanted);
        assert!(f.launch.is_none(), "{f:?}");
        let why = f.refused.join(" ");
        assert!(
            why.contains("refused the systemd unit") && why.contains("writable by group or others"),
            "{why}"
        );
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // Owned by another user.
    std::os::unix::fs::chown(lib.join(UNIT), Some(65534), None).unwrap();
    let why = find(&sources, wanted).refused.join(" ");
    assert!(why.contains("not by root"), "{why}");
}
