//! Density (issue 39): what one node's ledger costs as it grows. One dipamd, one network of
//! `host-local` over a /18, filled to N = 10, 100, 1,000, 2,500 and 10,000 attachments
//! (`--density-max-n` stops earlier), live pods and stale ones mixed; at every N:
//!
//! - ADD, CHECK and DEL through the plugin in IPAM mode (as `ptp` calls it, no namespace),
//!   each split into dipamd's delegate exec (its `delegate exec finished` log lines) and
//!   dipam's own cost (the rest of spawn to reap), beside `host-local` exec'd directly on the
//!   same directory (the floor: what any runtime pays for this delegate at this N);
//! - CNI STATUS through the plugin, spawn to reap, and dipamd's handler time (its log);
//! - dipamd's start to serving (a STATUS through the plugin answered) after a clean stop and
//!   after a SIGKILL, with N records; its RSS; the ledger's and the journal's bytes on disk;
//! - `dipamctl status` and `dipamctl attachments` (spawn to reap);
//! - GC of every stale attachment: a runtime-aware pass pair (`dipamctl gc --from-runtime`,
//!   against a CRI stand-in that lists every pod from its ADD on, and stops listing the
//!   stale ones just before the pair) and a CNI GC (cniVersion 1.1.0, the
//!   live pods in `cni.dev/valid-attachments`), each against the floor: `host-local`'s DEL of
//!   the same reservations exec'd directly, `--gc-parallel` at a time, on a copy of the
//!   directory;
//! - then the same dipamd restarted with the warm pool at a dense node's watermarks, pods
//!   ADDed in bursts at a fixed pace that never waits for the pool (pooled.rs): ADDs served
//!   from the pool and misses, pooled ADD p50/p99 against `host-local`'s, whether the
//!   refills kept up.
//!
//! **Filling.** The attachments are real: each is a plugin ADD through dipamd and
//! `host-local`, with CNI_ARGS shaped as a CRI runtime sends them (so the runtime-aware GC
//! may free the stale ones). `host-local` reads every reservation of its directory on every
//! ADD (docs/performance.md), so filling 10,000 one after another would take the run's
//! whole budget in the delegate alone. The fill therefore moves the reservations already
//! made out of `host-local`'s directory while a chunk is added (into a sibling directory,
//! with `host-local`'s round-robin cursor left in place, so no address is handed out twice;
//! dipamd's address index would refuse one anyway) and puts them all back before anything is
//! measured. dipamd runs with `--reconcile-interval` long enough that no reconcile looks at
//! the directory meanwhile.
//!
//! **GC's deadline.** The CNI GC is the plugin's, under its `timeoutSeconds` (docs/cfp.md
//! §5.4, default 55 s), and it pays `host-local`'s DEL of every stale attachment, each of
//! which walks the whole directory: at 10,000 on a loaded 2-CPU machine that floor alone
//! passed 55 s (docs/performance.md, run 34). The bench gives the GC its own bound
//! ([`GC_TIMEOUT_S`]) so that the curve measures it whole, and says when it took longer than
//! the default; the split of its time (dipamd's handler, its delegate execs, the rest) comes
//! from dipamd's log ([`gc_split`]).
//!
//! **Churn** (`--sections churn`): `--churn-cycles` ADD/DEL cycles on a ledger of
//! `--churn-live` live attachments (`--churn-rate` a second, if given), with dipamd's RSS and
//! the ledger's and the journal's bytes sampled every tenth of the run, and each interval's
//! medians of a reading every 5 s.

#[path = "density/churn.rs"]
mod churn;
#[path = "density/cri.rs"]
mod cri;
#[path = "density/gc.rs"]
mod gc;
#[path = "density/gc_split.rs"]
mod gc_split;
#[path = "density/plot.rs"]
mod plot;
#[path = "density/pooled.rs"]
mod pooled;
#[path = "density/report.rs"]
mod report;

pub use churn::churn;

use std::{
    net::Ipv4Addr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use dipam_lifecycle::{Attachment, Dipamd, Fixture, Runtime, bins, unique};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::{Opts, Res, check_stop, fan_out, loadavg, ms, reset_peak, rss_kib};

/// The density network's one range. IPAM-mode calls install nothing in any namespace, so the
/// addresses live only in `host-local`'s files and the ledger: no other run can collide.
const RANGE: &str = "10.92.0.0/18";
const RANGE_FIRST: u32 = u32::from_be_bytes([10, 92, 0, 0]);
const RANGE_SIZE: u32 = 1 << 14;
/// The plugin's `timeoutSeconds` for the CNI GC (module doc, "GC's deadline"), and the
/// plugin's default, which a GC past it would have met (docs/cfp.md §5.4).
const GC_TIMEOUT_S: u64 = 1800;
const PLUGIN_DEFAULT_TIMEOUT_S: u64 = 55;
/// The attachment counts of the curve.
pub const CURVE: [usize; 5] = [10, 100, 1_000, 2_500, 10_000];
/// Attachments added per chunk of the fill (the directory holds only these meanwhile).
const CHUNK: usize = 400;
/// Threads of the fill (host-local serialises on its directory lock anyway).
const FILL_THREADS: usize = 4;

/// What kind of attachment a container ID is, encoded into it (64 hex digits, as a CRI
/// runtime's sandbox IDs).
#[derive(Clone, Copy)]
enum Kind {
    Live = 1,
    Stale = 2,
    Sample = 3,
    Floor = 4,
    Pooled = 5,
    Churn = 6,
}

/// A CRI-shaped attachment: a 64-hex container ID and the CNI_ARGS containerd sends.
fn attachment(run: u64, kind: Kind, n: usize, i: usize) -> Attachment {
    let cid = format!("{run:016x}{:016x}{n:016x}{i:016x}", kind as u64);
    let mut a = Attachment::new(&cid, "/var/run/netns/dipam-bench-density");
    a.args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=density;K8S_POD_NAME=p-{:x}-{n}-{i};\
         K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={:08x}-0000-4000-8000-{:012x}",
        kind as u64, n as u64, i as u64
    );
    a
}

/// The density node: one dipamd, its network, and what the runtime knows.
pub struct Node {
    pub d: Dipamd,
    list: Value,
    data: TempDir,
    run: u64,
    pub live: Vec<Attachment>,
    pub stale: Vec<Attachment>,
    cri: cri::StandIn,
    flags: Vec<String>,
}

impl Node {
    /// dipamd with the flags every start of the section uses, plus `extra`.
    pub fn start(opts: &Opts, extra: &[&str]) -> Res<Self> {
        let cri = cri::StandIn::start()?;
        let own = [
            "--reconcile-interval",
            "86400",
            "--node-name",
            "density",
            "--cri-endpoint",
        ];
        let mut flags: Vec<String> = super::COLLECTING
            .iter()
            .chain(&own)
            .map(|s| (*s).to_owned())
            .collect();
        flags.push(format!("unix://{}", cri.socket().display()));
        if let Some(p) = opts.gc_parallel {
            flags.extend(["--gc-parallel".to_owned(), p.to_string()]);
        }
        let all: Vec<&str> = flags
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        let d = Dipamd::start_with(&all);
        let data = super::data_dir("density")?;
        let list = Fixture::load("ptp-dipam-host-local.conflist")
            .with_name(&unique("density"))
            .with_socket(&d.socket())
            .with_delegate_state(data.path())
            .with_ranges(json!([[{ "subnet": RANGE }]]))
            .with_version(super::CNI_VERSION)
            .list;
        let run = u64::from(std::process::id()) << 16
            ^ (super::epoch_ns(std::time::SystemTime::now()) as u64 & 0xffff);
        Ok(Self {
            d,
            list,
            data,
            run,
            live: Vec::new(),
            stale: Vec::new(),
            cri,
            flags,
        })
    }

    pub fn list(&self) -> &Value {
        &self.list
    }

    fn network(&self) -> String {
        self.list["name"].as_str().unwrap_or_default().to_owned()
    }

    /// host-local's directory for the network.
    fn dir(&self) -> PathBuf {
        self.data.path().join(self.network())
    }

    fn att(&self, kind: Kind, n: usize, i: usize) -> Attachment {
        attachment(self.run, kind, n, i)
    }

    /// The config host-local gets from dipamd (the delegate object, with the network's name
    /// and version), optionally with another `dataDir`.
    fn delegate_conf(&self, data_dir: Option<&Path>) -> Vec<u8> {
        let mut conf = Runtime::plugin_config(&self.list, 0, None);
        conf["ipam"] = conf["ipam"]["delegate"].clone();
        if let Some(d) = data_dir {
            conf["ipam"]["dataDir"] = json!(d);
        }
        serde_json::to_vec(&conf).unwrap_or_default()
    }

    /// Restarts dipamd with the section's flags plus `extra`; returns (stop ms, start to
    /// serving ms). `crash`: SIGKILL instead of SIGTERM.
    pub fn restart(&mut self, rt: &Runtime, crash: bool, extra: &[&str]) -> Res<(f64, f64)> {
        let t = Instant::now();
        if crash {
            self.d.kill9();
        } else {
            self.d.terminate();
        }
        let stop = ms(t.elapsed());
        let all: Vec<&str> = self
            .flags
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        self.d.set_flags(&all);
        let t = Instant::now();
        self.d.start_again();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.status_exec(rt).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "dipamd did not serve STATUS within 60 s of its start:\n{}",
                    tail(&self.d.log())
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok((stop, ms(t.elapsed())))
    }

    /// One CNI STATUS through the plugin (cniVersion 1.1.0, as libcni sends it).
    fn status_exec(&self, rt: &Runtime) -> Res<()> {
        let mut conf = Runtime::plugin_config(&self.list, 0, None);
        conf["cniVersion"] = json!("1.1.0");
        let none = Attachment {
            args: String::new(),
            ..Attachment::new("", "").with_ifname("")
        };
        let bytes = serde_json::to_vec(&conf).map_err(|e| e.to_string())?;
        let out = rt.exec("dipam", "STATUS", &none, &bytes);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    }

    /// Adds `atts` through dipamd, with the reservations already made moved out of
    /// host-local's directory meanwhile (module doc, "Filling"); all put back at the end.
    pub fn fill(&self, rt: &Runtime, atts: &[Attachment]) -> Res<f64> {
        let dir = self.dir();
        let stash = self.data.path().join("stash");
        std::fs::create_dir_all(&stash).map_err(|e| format!("{}: {e}", stash.display()))?;
        let list = &self.list;
        let t = Instant::now();
        let result = (|| {
            for chunk in atts.chunks(CHUNK) {
                check_stop()?;
                move_reservations(&dir, &stash)?;
                self.guard_wrap(chunk.len())?;
                fan_out(chunk, FILL_THREADS, |a| {
                    rt.ipam(list, 0, "ADD", a, None)
                        .map_err(|e| format!("density fill ADD: {e}"))?;
                    // As a runtime lists a sandbox once its network is set up (containerd
                    // within a second of the ADD): dipamd runs with `--gc-grace 0`, so a
                    // pod the stand-in left out until the fill ended was freed, alive, by
                    // two runtime-aware passes during a fill longer than their interval.
                    self.cri.add([a.container_id.as_str()]);
                    Ok(())
                })?;
            }
            Ok::<(), String>(())
        })();
        // Put back whatever happened: the directory must be whole before anything else.
        let back = move_reservations(&stash, &dir);
        result?;
        back?;
        Ok(ms(t.elapsed()))
    }

    /// Refuses a stash fill that would make host-local's round-robin wrap: it would then
    /// hand out addresses whose files are stashed.
    fn guard_wrap(&self, more: usize) -> Res<()> {
        let cursor = std::fs::read_to_string(self.dir().join("last_reserved_ip.0"))
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map_or(RANGE_FIRST, u32::from);
        let left = (RANGE_FIRST + RANGE_SIZE - 2).saturating_sub(cursor);
        if (left as usize) < more + 16 {
            return Err(format!(
                "{RANGE}: host-local's cursor is at {} and {more} more addresses would wrap \
                 around; lower --density-max-n",
                Ipv4Addr::from(cursor)
            ));
        }
        Ok(())
    }

    /// The reservations in host-local's directory.
    pub fn reservations(&self) -> usize {
        count_reservations(&self.dir())
    }

    /// The runtime lists these pods from now on (the fill lists its own as it adds them).
    fn listed(&self, atts: &[Attachment]) {
        self.cri.add(atts.iter().map(|a| a.container_id.as_str()));
    }

    /// The runtime lists these pods no more: lost without a DEL (the stale ones), or deleted.
    fn unlisted(&self, atts: &[Attachment]) {
        self.cri
            .forget(atts.iter().map(|a| a.container_id.as_str()));
    }

    /// Waits until one of dipamd's own runtime-aware passes has asked for the runtime's list
    /// (it runs one at its start, then one every `--runtime-gc-interval`, 10 s): the next one
    /// is then an interval away, and two passes timed by the bench run unmixed with it.
    fn after_a_background_pass(&self) -> Res<()> {
        let seen = self.cri.lists();
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.cri.lists() == seen {
            check_stop()?;
            if Instant::now() > deadline {
                return Err("dipamd's runtime-aware GC asked for no list within 120 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn is_reservation(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok())
}

fn count_reservations(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| is_reservation(&e.file_name()))
                .count()
        })
        .unwrap_or_default()
}

/// Moves every reservation file (named by its address) from `from` to `to`.
fn move_reservations(from: &Path, to: &Path) -> Res<()> {
    let Ok(rd) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for e in rd.filter_map(Result::ok) {
        if is_reservation(&e.file_name()) {
            std::fs::rename(e.path(), to.join(e.file_name()))
                .map_err(|err| format!("move {}: {err}", e.path().display()))?;
        }
    }
    Ok(())
}

/// Bytes on disk under dipamd's state directory: (ledger: everything but the journal and the
/// spool, as (apparent, allocated) bytes; the journal, as (bytes it holds, allocated)).
pub fn disk_bytes(state: &Path) -> ((u64, u64), (u64, u64)) {
    fn walk(p: &Path, ledger: &mut (u64, u64), journal: &mut (u64, u64)) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.filter_map(Result::ok) {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                if e.file_name() != "spool" {
                    walk(&e.path(), ledger, journal);
                }
                continue;
            }
            if e.file_name() == "dipam-journal" {
                // Preallocated (state journal.rs): what it holds ends at its last non-zero
                // byte.
                let used = std::fs::read(e.path())
                    .ok()
                    .and_then(|b| b.iter().rposition(|x| *x != 0))
                    .map_or(0, |i| i as u64 + 1);
                journal.0 += used;
                journal.1 += m.blocks() * 512;
            } else {
                ledger.0 += m.len();
                ledger.1 += m.blocks() * 512;
            }
        }
    }
    let (mut l, mut j) = ((0, 0), (0, 0));
    walk(state, &mut l, &mut j);
    (l, j)
}

/// Spawn-to-reap of a command, in ms; fails on a non-zero exit.
fn time_cmd(cmd: &mut std::process::Command) -> Res<f64> {
    time_output(cmd).map(|(took, _)| took)
}

/// Spawn-to-reap of a command, in ms, and its stdout; fails on a non-zero exit.
fn time_output(cmd: &mut std::process::Command) -> Res<(f64, Vec<u8>)> {
    let t = Instant::now();
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let took = ms(t.elapsed());
    if !out.status.success() {
        return Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok((took, out.stdout))
}

fn dipamctl(socket: &Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(bins::bin("dipamctl"));
    c.arg("--socket").arg(socket).args(args);
    c
}

// ---------------------------------------------------------------------------------------
// One point of the curve

/// Spans (container ID, verb) -> spawn-to-reap ms, for the split with dipamd's log.
type Timed = Vec<(String, &'static str, f64)>;

#[derive(Default)]
pub struct Point {
    pub n: usize,
    pub live: usize,
    pub stale: usize,
    pub load: f64,
    pub fill_ms: f64,
    /// dipam through the plugin: (container ID, verb, ms).
    pub dipam: Timed,
    /// host-local exec'd directly, by verb.
    pub floor_add: Vec<f64>,
    pub floor_check: Vec<f64>,
    pub floor_del: Vec<f64>,
    pub status_exec: Vec<f64>,
    /// The first ADD after the start (not among the samples): it loads the network's part
    /// of dipamd's address index from the ledger.
    pub first_add_ms: f64,
    pub stop_ms: f64,
    pub start_ms: f64,
    pub crash_start_ms: f64,
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// dipamd's peak RSS during each later phase, from its own reset of VmHWM: the
    /// `dipamctl status` and `attachments` calls, the GCs (the runtime-aware passes' in
    /// `gc.peak_runtime_kib`, then the CNI GC's with the stale pods added again before it,
    /// here), and the pooled run (its dipamd's, from that start).
    pub peak_ctl_kib: u64,
    pub peak_gc_kib: u64,
    pub peak_pool_kib: u64,
    pub ledger: (u64, u64),
    pub journal: (u64, u64),
    pub ctl_status: Vec<f64>,
    pub ctl_attachments: Vec<f64>,
    pub gc: gc::GcPoint,
    pub pool: pooled::PoolPoint,
}

/// The stale attachments at `n`: a tenth, at most `--density-stale`, at least one.
fn stale_at(n: usize, max: usize) -> usize {
    (n / 10).clamp(1, max.max(1))
}

/// Fills the node to `n` (live and stale), and measures everything at that size.
pub fn point(rt: &Runtime, node: &mut Node, n: usize, opts: &Opts) -> Res<Point> {
    let stale = stale_at(n, opts.density_stale);
    let live = n - stale;
    let mut p = Point {
        n,
        live,
        stale,
        ..Point::default()
    };
    let mut add = Vec::new();
    for i in node.live.len()..live {
        add.push(node.att(Kind::Live, 0, i));
    }
    let stale_atts: Vec<Attachment> = (0..stale).map(|i| node.att(Kind::Stale, n, i)).collect();
    add.extend(stale_atts.iter().cloned());
    super::progress!("density N={n}: filling {} attachments", add.len());
    p.fill_ms = node.fill(rt, &add)?;
    node.live.extend(add[..add.len() - stale].iter().cloned());
    // Listed by the runtime like the live ones until the GC is measured, which drops them
    // from the list first (`gc`): no pass of dipamd's own frees them before that.
    node.stale = stale_atts;
    let held = node.reservations();
    if held != n {
        return Err(format!(
            "N={n}: host-local holds {held} reservations after the fill"
        ));
    }
    p.load = loadavg().first().copied().unwrap_or_default();

    // Starts with N records: after a clean stop, and after a SIGKILL (the journal replayed).
    (p.stop_ms, p.start_ms) = node.restart(rt, false, &[])?;
    (_, p.crash_start_ms) = node.restart(rt, true, &[])?;
    super::progress!(
        "density N={n}: filled in {:.1} s; start to serving {:.0} ms (clean), {:.0} ms (after SIGKILL)",
        p.fill_ms / 1e3,
        p.start_ms,
        p.crash_start_ms
    );
    samples(rt, node, &mut p, opts)?;
    (p.rss_kib, p.hwm_kib) = rss_kib(node.d.pid());
    (p.ledger, p.journal) = disk_bytes(&node.d.state_dir());
    reset_peak(node.d.pid());
    for _ in 0..3 {
        p.ctl_status.push(time_cmd(&mut dipamctl(
            &node.d.socket(),
            &["status", "--json"],
        ))?);
        p.ctl_attachments.push(time_cmd(&mut dipamctl(
            &node.d.socket(),
            &["attachments", "--json"],
        ))?);
    }
    p.peak_ctl_kib = rss_kib(node.d.pid()).1;
    reset_peak(node.d.pid());
    p.gc = gc::gc(rt, node, n, opts)?;
    p.peak_gc_kib = rss_kib(node.d.pid()).1;
    p.pool = pooled::pooled(rt, node, n, opts)?;
    p.peak_pool_kib = p.pool.peak_kib;
    Ok(p)
}

/// ADD, CHECK, DEL through dipam and host-local directly, and STATUS, rotated.
fn samples(rt: &Runtime, node: &Node, p: &mut Point, opts: &Opts) -> Res<()> {
    let floor_conf = node.delegate_conf(None);
    let hl = |cmd: &str, a: &Attachment, prev: Option<&Value>| {
        let mut conf: Value = serde_json::from_slice(&floor_conf).unwrap_or_default();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        let bytes = serde_json::to_vec(&conf).unwrap_or_default();
        let t = Instant::now();
        let out = rt.exec("host-local", cmd, a, &bytes);
        let took = ms(t.elapsed());
        if !out.status.success() {
            return Err(format!(
                "host-local {cmd}: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        Ok((took, v))
    };
    for i in 0..opts.density_samples + 1 {
        check_stop()?;
        let counted = i > 0;
        for k in super::order(3, i) {
            match k {
                0 => {
                    let a = node.att(Kind::Sample, p.n, i);
                    let list = node.list();
                    let t = Instant::now();
                    let r = rt
                        .ipam(list, 0, "ADD", &a, None)
                        .map_err(|e| format!("ADD: {e}"))?;
                    let add = ms(t.elapsed());
                    let t = Instant::now();
                    rt.ipam(list, 0, "CHECK", &a, Some(&r))
                        .map_err(|e| format!("CHECK: {e}"))?;
                    let check = ms(t.elapsed());
                    let t = Instant::now();
                    rt.ipam(list, 0, "DEL", &a, Some(&r))
                        .map_err(|e| format!("DEL: {e}"))?;
                    let del = ms(t.elapsed());
                    if !counted {
                        p.first_add_ms = add;
                    }
                    if counted {
                        let cid = a.container_id;
                        p.dipam.push((cid.clone(), "ADD", add));
                        p.dipam.push((cid.clone(), "CHECK", check));
                        p.dipam.push((cid, "DEL", del));
                    }
                }
                1 => {
                    let a = node.att(Kind::Floor, p.n, i);
                    let (add, r) = hl("ADD", &a, None)?;
                    let (check, _) = hl("CHECK", &a, Some(&r))?;
                    let (del, _) = hl("DEL", &a, Some(&r))?;
                    if counted {
                        p.floor_add.push(add);
                        p.floor_check.push(check);
                        p.floor_del.push(del);
                    }
                }
                _ => {
                    let t = Instant::now();
                    node.status_exec(rt).map_err(|e| format!("STATUS: {e}"))?;
                    if counted {
                        p.status_exec.push(ms(t.elapsed()));
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The section

pub struct Density {
    pub points: Vec<Point>,
    /// dipamd's log, for the split of each request.
    pub log: std::collections::HashMap<(String, String), super::ServerSide>,
    pub status_handler: Vec<Vec<f64>>,
    /// Each point's CNI GC, split by dipamd's log.
    pub gc_split: Vec<gc_split::GcSplit>,
    /// Why the curve stopped before `--density-max-n`, if it did.
    pub failed: Option<String>,
    /// dipamd's whole log (`--density-log`).
    pub log_text: String,
}

pub fn run(rt: &Runtime, opts: &Opts) -> Res<Density> {
    let mut node = Node::start(opts, &[])?;
    let mut points = Vec::new();
    let mut failed = None;
    for n in CURVE.iter().copied().filter(|n| *n <= opts.density_max_n) {
        check_stop()?;
        // A point that fails (run 29 lost the whole curve to its last point) ends the curve;
        // the points before it are reported, with why the curve stopped.
        match point(rt, &mut node, n, opts) {
            Ok(p) => points.push(p),
            Err(e) => {
                check_stop()?;
                super::progress!("density N={n}: failed, the curve stops here: {e}");
                failed = Some(format!("N={n}: {e}"));
                break;
            }
        }
    }
    let text = node.d.log();
    let log = super::parse_log(&text);
    let status_handler = status_handler_times(&text, points.len());
    let gc_split = at_samples_start(&text, points.len(), |v| v["span"]["command"] == "GC")
        .iter()
        .map(|lines| gc_split::split(lines))
        .collect();
    Ok(Density {
        points,
        log,
        status_handler,
        gc_split,
        failed,
        log_text: text,
    })
}

/// The log lines `keep` picks, of the start of each point on which its samples and GCs run:
/// starts are #1 the first, then per point: clean, SIGKILL (the samples, the GCs), the pool,
/// without the pool.
fn at_samples_start(log: &str, points: usize, keep: impl Fn(&Value) -> bool) -> Vec<Vec<Value>> {
    let mut by_start: Vec<Vec<Value>> = Vec::new();
    for line in log.lines() {
        if line.starts_with("===== dipamd start") {
            by_start.push(Vec::new());
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if keep(&v)
            && let Some(cur) = by_start.last_mut()
        {
            cur.push(v);
        }
    }
    (0..points)
        .map(|k| by_start.get(1 + 4 * k + 1).cloned().unwrap_or_default())
        .collect()
}

/// dipamd's handler time of every STATUS of each point's samples, in the order served.
fn status_handler_times(log: &str, points: usize) -> Vec<Vec<f64>> {
    at_samples_start(log, points, |v| {
        v["span"]["command"] == "STATUS" && v["fields"]["message"] == "ok"
    })
    .into_iter()
    .map(|lines| {
        lines
            .iter()
            .filter_map(|v| v["fields"]["elapsed_ms"].as_f64())
            .collect()
    })
    .collect()
}

impl Density {
    /// The pooled ADDs of point `k` that dipamd served from the pool: no delegate exec in
    /// their span (dipamd's log). A miss execs the delegate.
    pub fn pool_hits(&self, k: usize) -> Vec<f64> {
        let q = &self.points[k].pool;
        q.add
            .iter()
            .zip(&q.add_cids)
            .filter(|(_, cid)| {
                self.log
                    .get(&((*cid).clone(), "ADD".to_owned()))
                    .is_some_and(|s| s.delegate_execs == 0 && s.server_ms.is_some())
            })
            .map(|(ms, _)| *ms)
            .collect()
    }

    /// dipam's samples at point `k` for `verb`: (total, delegate in dipamd, dipam's own).
    pub fn split(&self, k: usize, verb: &str) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (mut total, mut delegate, mut own) = (Vec::new(), Vec::new(), Vec::new());
        for (cid, v, took) in &self.points[k].dipam {
            if *v != verb {
                continue;
            }
            total.push(*took);
            if let Some(s) = self.log.get(&(cid.clone(), verb.to_owned())) {
                delegate.push(s.delegate_ms);
                own.push(took - s.delegate_ms);
            }
        }
        (total, delegate, own)
    }
}
