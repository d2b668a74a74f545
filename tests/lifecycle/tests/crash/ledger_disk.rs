//! The ledger's disk, in the shapes nodes meet (docs/cfp.md §7.5, failures F15 and F26):
//!
//! - the file system holding `--state-dir` fills up while pods are added: dipamd keeps its
//!   memory bounded, says why it cannot serve (CNI STATUS 50, status, doctor), and serves
//!   again once space returns, without a restart; nothing acknowledged is lost;
//! - a start on a file system without the room an open needs is refused, saying so;
//! - a damaged store (garbled last journal record, lost witness with garbled sled, lost
//!   journal) is refused at start with a message pointing at `dipamctl recover`, and no pod's
//!   address is released meanwhile.
//!
//! The state directory is a real ext4 file system (a loop-mounted image), since fdatasync
//! and block allocation are what a full disk is about.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Attachment, Dipamd, Fixture, Lab, NetNs, Runtime, Subnet, bins, cmd::run, flood::rss_kib,
    hostlocal, named, require_root, unique,
};
use serde_json::{Value, json};

/// An ext4 file system of a few MiB, loop-mounted on a directory; unmounted on drop.
struct SmallExt4 {
    _image: tempfile::TempDir,
    mnt: PathBuf,
}

impl SmallExt4 {
    /// Makes a `mib` MiB ext4 image (no blocks reserved for root, so that free space is
    /// what `df` shows) and mounts it on `mnt`, creating it.
    fn mount(mnt: &Path, mib: u64) -> Self {
        let image = dipam_lifecycle::temp_dir("dipam-ext4-");
        let img = image.path().join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(mib * 1024 * 1024)
            .unwrap();
        // Often outside a non-login shell's PATH.
        let mkfs = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("mkfs.ext4");
        run(Command::new(mkfs).args(["-q", "-F", "-m", "0"]).arg(&img));
        std::fs::create_dir_all(mnt).unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(mnt));
        Self {
            _image: image,
            mnt: mnt.to_path_buf(),
        }
    }

    /// Writes a filler file until the file system is full, and returns its path.
    fn fill(&self, name: &str) -> PathBuf {
        let path = self.mnt.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        for chunk in [1 << 20, 64 << 10, 4 << 10, 1 << 10] {
            let bytes = vec![0xA5u8; chunk];
            while f.write_all(&bytes).is_ok() && f.sync_data().is_ok() {}
        }
        path
    }

    fn available(&self) -> u64 {
        let c = std::ffi::CString::new(self.mnt.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain C struct of integers, for which all-zero bytes are a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: statvfs(3) with a valid NUL-terminated path and a valid out-parameter.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

impl Drop for SmallExt4 {
    fn drop(&mut self) {
        // Lazy: a dipamd still holding files (the test failed) must not keep the mount.
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// `dipamctl <args>`, guarded against a hang (the failure this file's first test is about:
/// one `dipamctl status` made dipamd spin): a guard, not a timing.
fn ctl(dipamd: &Dipamd, args: &[&str]) -> Output {
    let child = Command::new(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(dipamd.socket())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the dipamctl we spawned.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("dipamctl {args:?} hung for 60 s:\n{}", dipamd.log());
        }
    }
}

fn status(dipamd: &Dipamd) -> Value {
    let out = ctl(dipamd, &["status", "--json"]);
    assert!(
        out.status.success(),
        "dipamctl status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn says_disk_full(text: &str) -> bool {
    text.contains("No space left on device") && text.contains("full")
}

/// A dipamd whose state directory is a `mib` MiB ext4 file system of its own, with a
/// conflist for it on a subnet and host-local store of its own.
struct OnSmallDisk {
    dipamd: Dipamd,
    fs: SmallExt4,
    _subnet: Subnet,
    data: tempfile::TempDir,
    fx: Fixture,
}

impl OnSmallDisk {
    fn start(mib: u64) -> Self {
        let mut dipamd = Dipamd::unstarted(&[]);
        let fs = SmallExt4::mount(&dipamd.state_dir(), mib);
        dipamd.start_again();
        let subnet = Subnet::claim("10.77");
        let data = dipam_lifecycle::temp_dir("delegate-store-");
        let fx = Fixture::load("ptp-dipam-host-local.conflist")
            .unique_name()
            .with_socket(&dipamd.socket())
            .with_delegate_state(data.path())
            .with_subnet(&subnet.cidr);
        Self {
            dipamd,
            fs,
            _subnet: subnet,
            data,
            fx,
        }
    }
}

/// Pods are added while the state directory's file system fills up.
#[test]
fn a_full_state_disk_is_reported_and_served_again_once_space_returns() {
    require_root!();
    let OnSmallDisk {
        mut dipamd,
        fs,
        _subnet,
        data,
        fx,
    } = OnSmallDisk::start(32);
    let rt = Runtime::new(bins::cni_path());
    let ns = NetNs::new();
    let pod = || Attachment::new(&unique("full"), &ns.path());
    let network = fx.name();
    let agree = |dipamd: &Dipamd| {
        assert_eq!(
            dipamd.ledger_pairs(&network),
            hostlocal::store_pairs(data.path(), &network),
            "ledger (left) and host-local (right) disagree"
        );
    };

    let mut acked = Vec::new();
    for _ in 0..5 {
        let p = pod();
        rt.ipam(&fx.list, 0, "ADD", &p, None).unwrap();
        acked.push(p);
    }
    let filler = fs.fill("filler");
    assert!(fs.available() < 64 * 1024, "{} bytes left", fs.available());

    // ADDs until one fails: the journal's preallocated space lets a few through, then
    // sled's next log write finds no room.
    let mut failed = None;
    for _ in 0..240 {
        let p = pod();
        match rt.ipam(&fx.list, 0, "ADD", &p, None) {
            Ok(_) => acked.push(p),
            Err(e) => {
                failed = Some((p, e));
                break;
            }
        }
    }
    let (failed_pod, e) = failed.expect("every ADD succeeded on a full disk");
    assert_eq!(e.code, 150, "{e}");
    assert!(says_disk_full(&format!("{} {}", e.msg, e.details)), "{e}");

    // Memory stays bounded across status calls (one used to spin at 100% CPU, growing until
    // the OOM killer ended it), and status says why dipamd is not ready.
    let pid = dipamd.pid().unwrap();
    let rss = rss_kib(pid);
    for _ in 0..5 {
        let s = status(&dipamd);
        assert_eq!(s["ready"], false, "{s}");
        let why = s["notReady"][0].as_str().unwrap_or_default();
        assert!(says_disk_full(why), "{s}");
    }
    let rss_after = rss_kib(pid);
    assert!(
        rss_after < rss + 64 * 1024,
        "dipamd's RSS grew from {rss} to {rss_after} KiB across 5 status calls"
    );
    let out = ctl(&dipamd, &["doctor", "--json"]);
    let checks: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ledger = named(&checks, "ledger takes commits");
    assert_eq!(ledger["ok"], false, "{ledger}");
    assert!(
        says_disk_full(ledger["detail"].as_str().unwrap()),
        "{ledger}"
    );
    let mut list = fx.list.clone();
    list["cniVersion"] = json!("1.1.0");
    let e = rt
        .ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
        .unwrap_err();
    assert_eq!(e.code, 50, "{e}");
    assert!(says_disk_full(&e.details), "{e}");
    // A DEL fails too (its release would not be recorded), and says why.
    let e = rt.ipam(&fx.list, 0, "DEL", &acked[0], None).unwrap_err();
    assert!(says_disk_full(&format!("{} {}", e.msg, e.details)), "{e}");

    // Space returns: dipamd serves again by itself.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&dipamd)["ready"] != true {
        assert!(
            Instant::now() < deadline,
            "not ready 60 s after space returned: {}\n{}",
            status(&dipamd),
            dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The same process: it was never restarted.
    assert_eq!(pid, dipamd.pid().unwrap());
    assert!(rss_kib(pid) > 0, "dipamd (pid {pid}) is gone");
    let ledger = dipamd.ledger_pairs(&network);
    for p in &acked {
        assert!(
            ledger.iter().any(|(id, _)| *id == p.container_id),
            "{} was acknowledged but is not in the ledger",
            p.container_id
        );
    }
    rt.ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
        .unwrap_or_else(|e| panic!("STATUS after recovery: {e}"));
    // The runtime DELs the pod whose ADD failed, and goes on.
    rt.ipam(&fx.list, 0, "DEL", &failed_pod, None).unwrap();
    for p in acked.drain(..3) {
        rt.ipam(&fx.list, 0, "DEL", &p, None).unwrap();
    }
    let p = pod();
    rt.ipam(&fx.list, 0, "ADD", &p, None).unwrap();
    acked.push(p);
    agree(&dipamd);
    let checks: Value =
        serde_json::from_slice(&ctl(&dipamd, &["doctor", "--json"]).stdout).unwrap();
    assert!(
        checks
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "ledger takes commits" && c["ok"] == true),
        "{checks}"
    );

    // And everything is on the disk: a restart finds the same.
    assert!(dipamd.terminate().success());
    dipamd.start_again();
    agree(&dipamd);
    assert_eq!(dipamd.ledger_pairs(&network).len(), acked.len());
    for p in &acked {
        rt.ipam(&fx.list, 0, "DEL", p, None).unwrap();
    }
    agree(&dipamd);
    assert!(dipamd.ledger_pairs(&network).is_empty());
}

/// How many full-disk rounds [`a_full_state_disk_during_roots_traffic_recovers_within_5s`]
/// makes per config size (`DIPAM_DISK_ROUNDS`, default 3).
fn disk_rounds() -> usize {
    dipam_lifecycle::env_or("DIPAM_DISK_ROUNDS", 3)
}

/// Root's own traffic (4 runtimes adding and deleting pods at once) while the state disk is
/// full for 4 s, then freed, round after round, with small and with 400 kB network configs
/// (docs/cfp.md §8.1, F39). Each time dipamd serves an ADD again by itself within 5 s of space
/// returning, and at the end the ledger and host-local agree on exactly the pods the runtimes
/// hold. With 400 kB configs, sled wrote its pages as blob files, and a blob write that failed
/// on the full disk made its close wait forever while the reopen held every lock: dipamd
/// deadlocked in the first round (ADD 11, `status` hung).
#[test]
fn a_full_state_disk_during_roots_traffic_recovers_within_5s() {
    full_disk_during_traffic(&[0]);
}

/// The same with 400 kB configs: values cut in pieces (no sled blob files), and the
/// journal's cap is backpressure. With them dipamd still answered 150 60 s after space
/// returned, until half-written sled snapshots were removed before a reopen (docs/cfp.md F39).
#[test]
fn a_full_state_disk_with_400_kb_configs_recovers_within_5s() {
    full_disk_during_traffic(&[400_000]);
}

fn full_disk_during_traffic(pads: &[usize]) {
    require_root!();
    // Built first: the guard below is for dipamd, not for cargo.
    bins::dir();
    for &pad in pads {
        let (tx, rx) = std::sync::mpsc::channel();
        let (log_tx, log_rx) = std::sync::mpsc::channel();
        let runner = std::thread::spawn(move || {
            full_disk_rounds(pad, disk_rounds(), &log_tx);
            let _ = tx.send(());
        });
        // A guard against the deadlock, not a timing: a round takes about 10 s.
        match rx.recv_timeout(Duration::from_secs(120 + 60 * disk_rounds() as u64)) {
            Ok(()) => runner.join().unwrap(),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                std::panic::resume_unwind(runner.join().unwrap_err())
            }
            Err(_) => {
                let log = log_rx
                    .try_recv()
                    .ok()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(80).collect();
                panic!(
                    "configs of {pad} bytes: dipamd hung after a full disk; its log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            }
        }
    }
}

/// [`a_full_state_disk_during_roots_traffic_recovers_within_5s`] with `pad` bytes of padding in
/// the delegate's config (host-local ignores the key), `rounds` times.
fn full_disk_rounds(pad: usize, rounds: usize, log: &std::sync::mpsc::Sender<PathBuf>) {
    let OnSmallDisk {
        dipamd,
        fs,
        _subnet,
        data,
        mut fx,
    } = OnSmallDisk::start(128);
    let _ = log.send(dipamd.log_path());
    eprintln!("configs of {pad} bytes: dipamd started on a 128 MiB ext4");
    if pad > 0 {
        fx.list["plugins"][0]["ipam"]["delegate"]["pad"] = json!("x".repeat(pad));
    }
    let list = &fx.list;
    let network = fx.name();
    let rt = Runtime::new(bins::cni_path());
    let ns = NetNs::new();
    let netns = ns.path();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let del_until_ok = |p: &Attachment| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = rt.ipam(list, 0, "DEL", p, None) {
            assert!(Instant::now() < deadline, "DEL {}: {e}", p.container_id);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let live: Vec<Attachment> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (rt, stop, netns, del_until_ok) = (&rt, &stop, &netns, &del_until_ok);
                s.spawn(move || {
                    let mut mine: Vec<Attachment> = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        if mine.len() >= 3 {
                            del_until_ok(&mine.remove(0));
                            continue;
                        }
                        let p = Attachment::new(&unique("traffic"), netns);
                        match rt.ipam(list, 0, "ADD", &p, None) {
                            Ok(_) => mine.push(p),
                            // As a runtime does after a failed ADD.
                            Err(_) => {
                                del_until_ok(&p);
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        for round in 0..rounds {
            std::thread::sleep(Duration::from_secs(1));
            let filler = fs.fill("filler");
            eprintln!(
                "configs of {pad} bytes, round {round}: disk full ({} bytes left)",
                fs.available()
            );
            std::thread::sleep(Duration::from_secs(4));
            std::fs::remove_file(&filler).unwrap();
            let freed = Instant::now();
            let probe = Attachment::new(&unique("probe"), &netns);
            loop {
                match rt.ipam(list, 0, "ADD", &probe, None) {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(
                            freed.elapsed() < Duration::from_secs(5),
                            "configs of {pad} bytes, round {round}: ADD still fails 5 s after \
                             space returned: {e}\n{}",
                            dipamd.log()
                        );
                        rt.ipam(list, 0, "DEL", &probe, None).ok();
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            eprintln!(
                "configs of {pad} bytes, round {round}: served again {:?} after space returned",
                freed.elapsed()
            );
            del_until_ok(&probe);
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let mut want: Vec<String> = live.iter().map(|p| p.container_id.clone()).collect();
    want.sort();
    let ledger = dipamd.ledger_pairs(&network);
    assert_eq!(
        ledger,
        hostlocal::store_pairs(data.path(), &network),
        "configs of {pad} bytes: ledger (left) and host-local (right) disagree"
    );
    let ids: Vec<String> = ledger.into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        ids, want,
        "configs of {pad} bytes: ledger (left) vs live pods (right)"
    );
    for p in &live {
        del_until_ok(p);
    }
    assert!(dipamd.ledger_pairs(&network).is_empty());
    assert!(hostlocal::store_pairs(data.path(), &network).is_empty());
}

/// A start on a file system with less free space than an open needs is refused before
/// anything is written, with a message that says how much is needed; with room, it starts.
#[test]
fn a_start_without_room_is_refused_saying_so() {
    require_root!();
    let mut dipamd = Dipamd::unstarted(&[]);
    let fs = SmallExt4::mount(&dipamd.state_dir(), 16);
    dipamd.start_again();
    assert!(dipamd.terminate().success());
    let filler = fs.fill("filler");
    // Leave 1 MiB: less than the 2 MiB margin an open needs.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - (1 << 20)).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let db = dipamd.state_dir().join("db");
    let db_before = std::fs::read(&db).unwrap();

    let out = dipamd.command().stdout(Stdio::null()).output().unwrap();
    assert!(!out.status.success(), "dipamd started without room");
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("free") && why.contains("needs at least") && why.contains("MiB"),
        "{why}"
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        db_before,
        "the refused open wrote"
    );

    std::fs::remove_file(&filler).unwrap();
    dipamd.start_again();
    assert_eq!(status(&dipamd)["ready"], true);
}

/// The last journal record a killed dipamd left holds an acknowledged commit; garbled, the
/// store cannot prove what it holds. Likewise a store whose witness is gone while sled's
/// log is garbled, and one whose journal is gone. Each is refused at start, pointing at
/// `dipamctl recover`, and no pod's address is released (host-local keeps every
/// reservation). The undamaged store then starts and holds every pod.
#[test]
fn a_damaged_store_is_refused_and_releases_nothing() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let ns = NetNs::new();
    let pods: Vec<Attachment> = (0..4)
        .map(|_| Attachment::new(&unique("damage"), &ns.path()))
        .collect();
    for p in &pods {
        lab.rt.ipam(&lab.fx.list, 0, "ADD", p, None).unwrap();
    }
    let held = lab.delegate_store();
    assert_eq!(held.len(), 4);
    assert_eq!(lab.ledger(), held);
    lab.dipamd.kill9();

    let state = lab.dipamd.state_dir();
    let journal = state.join("dipam-journal");
    let witness = state.join("dipam-commit-seq");
    let db = state.join("db");
    let saved: Vec<(PathBuf, Vec<u8>)> = [&journal, &witness, &db]
        .iter()
        .map(|p| ((*p).clone(), std::fs::read(p).unwrap()))
        .collect();
    let restore = || {
        for (p, bytes) in &saved {
            std::fs::write(p, bytes).unwrap();
        }
    };
    let refused = |lab: &Lab, saying: &[&str]| {
        let out = lab.dipamd.command().stdout(Stdio::null()).output().unwrap();
        assert!(!out.status.success(), "dipamd served a damaged store");
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("dipamctl recover"), "{why}");
        assert!(saying.iter().any(|s| why.contains(s)), "{why}");
        assert_eq!(
            lab.delegate_store(),
            held,
            "a refused start released addresses"
        );
    };

    // The last whole record ends with the end marker "DPJe": garble a payload byte of it.
    let bytes = std::fs::read(&journal).unwrap();
    let end = bytes
        .windows(4)
        .rposition(|w| w == b"DPJe")
        .expect("the killed dipamd left journal records");
    let mut garbled = bytes.clone();
    garbled[end - 6] ^= 0x20;
    std::fs::write(&journal, &garbled).unwrap();
    refused(&lab, &["journal"]);

    restore();
    std::fs::remove_file(&witness).unwrap();
    lab.dipamd.garble_ledger();
    // sled's own checksums may notice first; the witness catches what they do not.
    refused(&lab, &["witness", "corrupted"]);

    restore();
    std::fs::remove_file(&journal).unwrap();
    refused(&lab, &["journal"]);

    restore();
    lab.dipamd.start_again();
    assert_eq!(lab.ledger(), held);
    lab.assert_agree();
    for p in &pods {
        lab.rt.ipam(&lab.fx.list, 0, "DEL", p, None).unwrap();
    }
    lab.assert_agree();
    assert!(lab.ledger().is_empty());
}
