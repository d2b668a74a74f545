//! `dipam-bench`: dipam against the reference chain it replaces, in one run on one machine.
//!
//! What it measures (issue 7; the numbers and their reading are in docs/performance.md):
//!
//! - **Latency**: ADD, CHECK and DEL (p50/p90/p99) of one pod in a fresh network namespace,
//!   driven through the harness's runtime emulation (libcni semantics, [`Runtime`]) for
//!   (a) Debian's `ptp` + `host-local`, (b) dipam as the main plugin + `host-local`, and
//!   (c) `ptp` + dipam in IPAM mode + `host-local`, and (d) dipam as the main plugin with its
//!   own dipamd running a warm pool (`--warm-pool N`), on (b)'s conflist, and (e) (c)'s
//!   conflist (IPAM mode) on another dipamd with the same pool. The five alternate
//!   round-robin per pod, in a rotating order, so that whatever the machine does meanwhile
//!   (other builds, the kernel tearing down the previous namespace) hits all alike. After each
//!   of (d)'s and (e)'s ADDs, and after their pods, the bench waits (untimed) until the refiller has
//!   brought the pool back to N, so no timed ADD finds it empty and no refill runs into
//!   another configuration's timing; the hits and misses are reported. Sequential pods/s is
//!   `pods / Σ(ADD + DEL)`.
//! - **Throughput at N-way concurrency** (default 8): per round and configuration, `N`
//!   threads take pods from a shared queue, first all ADDs, then all DELs; pods/s is
//!   `pods / (ADD wall time + DEL wall time)`. Rounds rotate the configurations too. (d)'s
//!   and (e)'s pools hold at least a round's pods, are full when their round starts, and
//!   refill (untimed) before the next configuration runs; a refiller does run during its own
//!   configuration's ADDs and DELs.
//! - **Cold start**: `/bin/true`, dipam VERSION (answered by the plugin alone), `host-local`
//!   ADD/DEL called directly (the delegate's floor), and dipam ADD/DEL in IPAM mode called
//!   directly (the way ptp calls it) with dipamd warm; medians of many round-robin iterations,
//!   all spawned through the same [`Runtime::exec`] path. `--alt-plugin FILE` adds a second
//!   dipam binary to the same rotation, to compare two builds (say, a build-profile change)
//!   under the same machine noise.
//! - **Another build of dipamd** (`--alt-dipamd FILE`, or `--alt-bin-dir DIR` for DIR's
//!   `dipam` and `dipamd`; dipamctl stays the current one): (b), (c), (d) and
//!   (e) run a second time as (b'), (c'), (d') and (e'), on that dipamd (three instances, as
//!   for (b) and (c), (d), and (e)) and with the alternative plugin when one is given, in the same rotation as
//!   the others in the latency and throughput sections. The report adds the ratios
//!   alternative / current per configuration (p50 ADD, CHECK, DEL, pods/s; 8-way pods/s and
//!   ADD/s), so that a restructure is measured against the build before it under the same
//!   machine noise.
//! - **Breakdown** of every dipam request the runtime timed (the direct calls above, and the
//!   dipam exec of every sequential pod of (b) and (c)), split at four clocks both sides see:
//!   the runtime's spawn; the plugin's request id, which embeds the wall clock right after
//!   the plugin parsed its input (`<pid:08x><ns mod 2^32:08x>`, `request_id` in
//!   plugin/src/lib.rs); the start and end of dipamd's handler (timestamp and `elapsed_ms` of
//!   its `ok` log line, JSON format); and the runtime's reap. dipamd's `delegate exec
//!   finished` lines (debug level, which the harness runs it at) split the handler into the
//!   delegate exec and the rest: ledger commits and bookkeeping. In main mode the parts around
//!   the handler also hold the datapath (interface check before, veth and routes after).
//! - **Scale**: dipamd's RSS (VmRSS from /proc) fresh and with 1,000 attachments, and the
//!   time of one CNI GC that frees 1,000 stale attachments (a second dipamd with
//!   `--gc-grace 0 --gc-max-free-share 1`; the valid list names one attachment).
//!   `--scale-rounds N` repeats that round on the same dipamd, for its RSS under churn.
//! - **GC at node scale** (issue 19): per round, (1) the exec floor: host-local's DEL exec'd
//!   directly for 1,000 of 1,001 reservations in one directory (what dipamd's GC of them must
//!   at least pay), serially and `--gc-parallel` at a time; (2) one CNI GC that frees 1,000
//!   stale attachments on a dipamd (`--gc-grace 0 --gc-max-free-share 1`), alone; (3) the
//!   same GC while a pod's IPAM-mode ADD arrives every `--gc-add-interval` ms, each ADD timed
//!   from spawn to reap, beside the same ADDs timed with no GC running. It reports the GC's
//!   time and its ratio to the floors, and how much longer an ADD took during the GC
//!   (p50/p99/max, minus the no-GC p50): what an ADD waited for the GC. Medians over
//!   `--gc-rounds`.
//!
//! - **Warm pool bursts** (section `pool-bursts`, issue 40): bursts of 30, 110 and 250 pods
//!   against the watermark pool, in IPAM and main mode (dipam_bench/pool_bursts.rs).
//!
//! - **Today's plugins beside Debian's**: (a) and (c) run a second time as (a+) and (c+)
//!   with the reference plugins of the pinned current release (ptp and host-local v1.10,
//!   built by tests/deps.sh into `$DIPAM_TEST_CACHE/peers`, tests/peers/pins), in the same
//!   rotation as the others, so one run measures both plugin generations.
//!
//! Binaries: by default a release build (`cargo build --release --bins -p dipam-plugin -p
//! dipam-shim -p dipam-ctl -p dipam-lifecycle`), from where cargo put them; `--bin-dir DIR` uses prebuilt
//! ones.
//! Everything it creates (namespaces, veths through them, dipamd processes, temp dirs, subnet
//! claims) is owned by the harness's guards and goes away on return, on error, on panic, and
//! on SIGINT/SIGTERM (a flag the loops check, so the guards still run). Progress goes to
//! stderr, the report to stdout, and `--json FILE` writes every number.
//!
//! It needs root (network namespaces), Debian's containernetworking-plugins and the peers
//! tests/deps.sh builds. It is not
//! part of the test suite: run it by hand, e.g. `cargo run --release -p dipam-lifecycle
//! --bin dipam-bench -- --json bench.json`, or `--quick` for a smoke run.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use dipam_lifecycle::{
    Attachment, Dipamd, Fixture, NetNs, Runtime, Subnet, bins, hostlocal, is_root, peers, unique,
};
use serde_json::{Value, json};
use tempfile::TempDir;

type Res<T> = Result<T, String>;

/// Bench subnets come from 10.74.x.0/24: no example conflist and no test uses that prefix,
/// and `Subnet::claim` keeps concurrent runs apart.
const PREFIX: &str = "10.74";

/// Every configuration speaks 1.0.0: Debian's ptp stops there, and host-local then gets the
/// same version from dipamd as from ptp (no conversion on either path).
const CNI_VERSION: &str = "1.0.0";

// ---------------------------------------------------------------------------------------
// Options

#[derive(Debug, Clone)]
struct Opts {
    bin_dir: Option<PathBuf>,
    alt_plugin: Option<PathBuf>,
    alt_dipamd: Option<PathBuf>,
    pods: usize,
    concurrency: usize,
    concurrent_pods: usize,
    rounds: usize,
    cold_iters: usize,
    attachments: usize,
    scale_rounds: usize,
    warmup: usize,
    json: Option<PathBuf>,
    quick: bool,
    sections: Vec<String>,
    gc_rounds: usize,
    /// `--gc-parallel` for the floor; passed to dipamd only when given (an older dipamd has
    /// no such flag).
    gc_parallel: Option<usize>,
    gc_add_interval_ms: u64,
    /// The density section (density.rs): the largest N of its curve.
    density_max_n: usize,
    /// Timed samples of each kind per N.
    density_samples: usize,
    /// The most stale attachments at one N (a tenth of N, at most this).
    density_stale: usize,
    /// The curve's pooled run (density/pooled.rs): `--pool-target`, `--pool-max-above`, and
    /// the pace (bursts of this many pods, one burst per period).
    density_pool: usize,
    density_pool_max_above: usize,
    density_pool_burst: usize,
    density_pool_period_ms: u64,
    density_pool_pods: usize,
    density_svg: Option<PathBuf>,
    /// Where to keep dipamd's log of the density section (its start phases, every STATUS).
    density_log: Option<PathBuf>,
    /// The churn section: ADD/DEL cycles, and the live attachments they run beside.
    churn_cycles: usize,
    churn_live: usize,
    /// Cycles a second the churn is held to (0: as fast as the node goes). dipamd's memory
    /// of recent ADDs and DELs follows the rate (docs/performance.md run 42), so a run whose
    /// rate wanders reads the wander, not growth with the cycles.
    churn_rate: usize,
}

const SECTIONS: [&str; 8] = [
    "latency",
    "concurrency",
    "cold",
    "scale",
    "gc",
    "density",
    "churn",
    "pool-bursts",
];

/// The sections a run without `--sections` runs: density and churn take a run of their own
/// (tens of minutes at full size).
const DEFAULT_SECTIONS: [&str; 6] = [
    "latency",
    "concurrency",
    "cold",
    "scale",
    "gc",
    "pool-bursts",
];

/// The flags of a dipamd whose GCs free every stale attachment at once: JSON logs (for the
/// breakdown), no grace period, no share limit.
const COLLECTING: [&str; 6] = [
    "--log-format",
    "json",
    "--gc-grace",
    "0",
    "--gc-max-free-share",
    "1",
];

/// dipamd's `--gc-parallel` default (shim-server gc::DEFAULT_PARALLEL), the floor's
/// parallelism when `--gc-parallel` is not given.
const DIPAMD_GC_PARALLEL: usize = 2;

const USAGE: &str = "\
dipam-bench: dipam against ptp + host-local, in one run (needs root).

Options:
  --bin-dir DIR          use prebuilt dipam, dipamd, dipamctl from DIR (default: cargo build
                         --release, and the binaries it built)
  --alt-plugin FILE      also time this dipam binary in the cold-start section, interleaved
                         with the one under test (to compare two builds in one run)
  --alt-dipamd FILE      also run (b), (c), (d) and (e) on this dipamd (with --alt-plugin's
                         plugin when given) in the latency and throughput sections,
                         interleaved with the build under test, and report the ratios
  --alt-bin-dir DIR      --alt-plugin DIR/dipam and --alt-dipamd DIR/dipamd (explicit
                         --alt-plugin / --alt-dipamd win)
  --pods N               sequential pods per configuration (default 200)
  --concurrency N        threads for the throughput phase (default 8)
  --concurrent-pods N    pods per configuration in the throughput phase (default: --pods)
  --rounds N             throughput rounds, configurations rotated (default 4)
  --cold-iters N         iterations of the cold-start section (default 500)
  --attachments N        stale attachments for the RSS and GC section (default 1000)
  --scale-rounds N       repeat that section's ADD-all-then-GC round N times on one dipamd,
                         to see its RSS under churn (default 1)
  --gc-rounds N          rounds of the GC section (floor, GC alone, GC with ADDs; default 3)
  --gc-parallel N        the floor's parallel DELs, and dipamd's --gc-parallel (default:
                         dipamd's own default, 2; the flag is then not passed)
  --gc-add-interval MS   pause between the ADDs that arrive during a GC (default 20)
  --density-max-n N      the density curve's largest N, of 10,100,1000,2500,10000
                         (default 10000)
  --density-samples N    timed samples of each kind per N (default 40)
  --density-stale N      stale attachments per N: a tenth of N, at most this (default 250)
  --density-pool N       --pool-target of the curve's pooled run (default 16, the
                         250-pod row of docs/configuration.md)
  --density-pool-max-above N
                         its --pool-max-above (default 64, the same row)
  --density-pool-burst N its pods arrive in bursts of N (default 10), one ADD after
                         another, never waiting for the pool
  --density-pool-period-ms MS
                         a burst every MS, start to start (default 1000)
  --density-pool-pods N  pods of the pooled run (default 40)
  --density-svg FILE     write the density curve as an SVG
  --density-log FILE     keep the density section's dipamd log (JSON lines, debug level)
  --churn-cycles N       ADD/DEL cycles of the churn section (default 10000)
  --churn-live N         live attachments beside the churn (default 2500)
  --churn-rate N         hold the churn to N cycles a second, so that its memory is read
                         at one rate (default 0: as fast as the node goes)
  --sections LIST        comma-separated subset of latency,concurrency,cold,scale,gc,
                         pool-bursts,density,churn (default: all but density and churn)
  --json FILE            write every number as JSON
  --quick                small numbers, for a smoke run
  -h, --help             this text";

fn parse_args(args: &[String]) -> Res<Opts> {
    let mut o = Opts {
        bin_dir: None,
        alt_plugin: None,
        alt_dipamd: None,
        pods: 200,
        concurrency: 8,
        concurrent_pods: 0,
        rounds: 4,
        cold_iters: 500,
        attachments: 1000,
        scale_rounds: 1,
        warmup: 3,
        json: None,
        quick: false,
        sections: DEFAULT_SECTIONS.iter().map(|s| (*s).to_owned()).collect(),
        gc_rounds: 3,
        gc_parallel: None,
        gc_add_interval_ms: 20,
        density_max_n: 10_000,
        density_samples: 40,
        density_stale: 250,
        density_pool: 16,
        density_pool_max_above: 64,
        density_pool_burst: 10,
        density_pool_period_ms: 1000,
        density_pool_pods: 40,
        density_svg: None,
        density_log: None,
        churn_cycles: 10_000,
        churn_live: 2_500,
        churn_rate: 0,
    };
    // Explicit numbers win over --quick, whatever the order.
    let mut explicit: Vec<&str> = Vec::new();
    let mut alt_bin_dir: Option<PathBuf> = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        let number = |name: &str, v: String| {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name}: {v:?} is not a positive number"))
        };
        match a.as_str() {
            "-h" | "--help" => return Err(USAGE.to_owned()),
            "--bin-dir" => o.bin_dir = Some(PathBuf::from(value(a)?)),
            "--alt-plugin" => o.alt_plugin = Some(PathBuf::from(value(a)?)),
            "--alt-dipamd" => o.alt_dipamd = Some(PathBuf::from(value(a)?)),
            "--alt-bin-dir" => alt_bin_dir = Some(PathBuf::from(value(a)?)),
            "--json" => o.json = Some(PathBuf::from(value(a)?)),
            "--quick" => o.quick = true,
            "--pods" => {
                o.pods = number(a, value(a)?)?;
                explicit.push("pods");
            }
            "--concurrency" => o.concurrency = number(a, value(a)?)?,
            "--concurrent-pods" => {
                o.concurrent_pods = number(a, value(a)?)?;
                explicit.push("concurrent-pods");
            }
            "--rounds" => {
                o.rounds = number(a, value(a)?)?;
                explicit.push("rounds");
            }
            "--cold-iters" => {
                o.cold_iters = number(a, value(a)?)?;
                explicit.push("cold-iters");
            }
            "--scale-rounds" => o.scale_rounds = number(a, value(a)?)?,
            "--gc-rounds" => {
                o.gc_rounds = number(a, value(a)?)?;
                explicit.push("gc-rounds");
            }
            "--gc-parallel" => o.gc_parallel = Some(number(a, value(a)?)?),
            "--gc-add-interval" => o.gc_add_interval_ms = number(a, value(a)?)? as u64,
            "--density-max-n" => o.density_max_n = number(a, value(a)?)?,
            "--density-samples" => {
                o.density_samples = number(a, value(a)?)?;
                explicit.push("density-samples");
            }
            "--density-stale" => o.density_stale = number(a, value(a)?)?,
            "--density-pool" => o.density_pool = number(a, value(a)?)?,
            "--density-pool-max-above" => o.density_pool_max_above = number(a, value(a)?)?,
            "--density-pool-burst" => o.density_pool_burst = number(a, value(a)?)?,
            "--density-pool-pods" => o.density_pool_pods = number(a, value(a)?)?,
            "--density-pool-period-ms" => {
                o.density_pool_period_ms = number(a, value(a)?)? as u64;
            }
            "--density-svg" => o.density_svg = Some(PathBuf::from(value(a)?)),
            "--density-log" => o.density_log = Some(PathBuf::from(value(a)?)),
            "--churn-cycles" => {
                o.churn_cycles = number(a, value(a)?)?;
                explicit.push("churn-cycles");
            }
            "--churn-live" => {
                o.churn_live = number(a, value(a)?)?;
                explicit.push("churn-live");
            }
            "--churn-rate" => o.churn_rate = number(a, value(a)?)?,
            "--attachments" => {
                o.attachments = number(a, value(a)?)?;
                explicit.push("attachments");
            }
            "--sections" => {
                let v = value(a)?;
                let list: Vec<String> = v.split(',').map(|s| s.trim().to_owned()).collect();
                if let Some(bad) = list.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    return Err(format!(
                        "--sections: unknown section {bad:?} (sections: {})",
                        SECTIONS.join(",")
                    ));
                }
                o.sections = list;
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
        }
    }
    if o.quick {
        let set = |name: &str, field: &mut usize, n: usize| {
            if !explicit.contains(&name) {
                *field = n;
            }
        };
        set("pods", &mut o.pods, 10);
        set("concurrent-pods", &mut o.concurrent_pods, 16);
        set("rounds", &mut o.rounds, 2);
        set("cold-iters", &mut o.cold_iters, 20);
        set("attachments", &mut o.attachments, 50);
        set("gc-rounds", &mut o.gc_rounds, 1);
        set("density-samples", &mut o.density_samples, 10);
        set("churn-cycles", &mut o.churn_cycles, 200);
        set("churn-live", &mut o.churn_live, 100);
        o.warmup = 1;
    }
    if let Some(dir) = alt_bin_dir {
        o.alt_plugin.get_or_insert_with(|| dir.join("dipam"));
        o.alt_dipamd.get_or_insert_with(|| dir.join("dipamd"));
    }
    if o.concurrent_pods == 0 {
        o.concurrent_pods = o.pods;
    }
    o.rounds = o.rounds.min(o.concurrent_pods);
    Ok(o)
}

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.sections.iter().any(|s| s == section)
    }
}

// ---------------------------------------------------------------------------------------
// Interruption: SIGINT/SIGTERM only set a flag; the loops check it and return an error, so
// that every guard (netns, dipamd, temp dirs, subnet claims) runs as on any other error.

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
        // stores to an atomic, which is async-signal-safe, and lives for the whole process.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn check_stop() -> Res<()> {
    if STOP.load(Ordering::SeqCst) {
        Err("interrupted; cleaning up".into())
    } else {
        Ok(())
    }
}

macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("[dipam-bench] {}", format!($($arg)*)) };
}
use progress;

#[path = "dipam_bench/density.rs"]
mod density;

// ---------------------------------------------------------------------------------------
// Statistics

#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    min: f64,
    max: f64,
}

/// Nearest-rank percentiles of `samples` (milliseconds).
fn summarize(samples: &[f64]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = |p: f64| s[((p / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Summary {
        n: s.len(),
        p50: rank(50.0),
        p90: rank(90.0),
        p99: rank(99.0),
        mean: s.iter().sum::<f64>() / s.len() as f64,
        min: s[0],
        max: s[s.len() - 1],
    }
}

fn median(samples: &[f64]) -> f64 {
    summarize(samples).p50
}

impl Summary {
    fn json(&self) -> Value {
        json!({"n": self.n, "p50_ms": r3(self.p50), "p90_ms": r3(self.p90), "p99_ms": r3(self.p99),
               "mean_ms": r3(self.mean), "min_ms": r3(self.min), "max_ms": r3(self.max)})
    }
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn epoch_ns(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { f64::NAN }
}

// ---------------------------------------------------------------------------------------
// The configurations

/// One network under test, with its own subnet and host-local data directory.
struct Net {
    key: &'static str,
    label: &'static str,
    list: Value,
    /// Container IDs start with this, so dipamd's log lines can be told apart per network.
    prefix: &'static str,
    data: TempDir,
    _subnets: Vec<Subnet>,
    /// (d) only: its dipamd's socket and pool size, to wait for the refiller.
    pool: Option<(PathBuf, u64)>,
    /// (b'), (c'), (d') with `--alt-plugin`: the runtime that finds the alternative plugin.
    rt: Option<Arc<Runtime>>,
    /// (b'), (c'), (d'): the index of the configuration this one repeats on the alternative
    /// build.
    alt_of: Option<usize>,
}

impl Net {
    /// The runtime that runs this configuration's plugin: `default`, or the alternative's.
    fn runtime<'a>(&'a self, default: &'a Runtime) -> &'a Runtime {
        self.rt.as_deref().unwrap_or(default)
    }

    fn network(&self) -> String {
        self.list["name"].as_str().unwrap_or_default().to_owned()
    }

    fn attachment(&self, netns: &str) -> Attachment {
        Attachment::new(&unique(self.prefix), netns)
    }

    /// The concurrent phase's pods get their own prefix, so that the server-side stats of
    /// the sequential run (read from dipamd's log by prefix) stay unloaded.
    fn concurrent_attachment(&self, netns: &str) -> Attachment {
        Attachment::new(&unique(&format!("c{}", self.prefix)), netns)
    }
}

fn data_dir(key: &str) -> Res<TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("dipam-bench-{key}-"))
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))
}

/// `conflist/<file>` adjusted like the harness's `Lab` does, on subnets of its own.
fn dipam_net(
    file: &str,
    socket: &Path,
    key: &'static str,
    label: &'static str,
    prefix: &'static str,
    subnets: usize,
) -> Res<Net> {
    let claimed: Vec<Subnet> = (0..subnets).map(|_| Subnet::claim(PREFIX)).collect();
    let data = data_dir(key)?;
    let ranges: Vec<Value> = claimed.iter().map(|s| json!({"subnet": s.cidr})).collect();
    let fx = Fixture::load(file)
        .with_name(&unique(&format!("bench-{key}")))
        .with_socket(socket)
        .with_delegate_state(data.path())
        .with_ranges(json!([ranges]))
        .with_version(CNI_VERSION);
    Ok(Net {
        key,
        label,
        list: fx.list,
        prefix,
        data,
        _subnets: claimed,
        pool: None,
        rt: None,
        alt_of: None,
    })
}

/// (d)'s warm pool as dipamd reports it (`dipamctl status --json`, `warmPool`).
fn pool_status(socket: &Path) -> Res<Value> {
    let out = std::process::Command::new(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(socket)
        .args(["status", "--json"])
        .output()
        .map_err(|e| format!("dipamctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dipamctl status: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(v["warmPool"].clone())
}

/// Waits (untimed) until the pool of `net` is back to its size, when `net` has one.
fn refilled(net: &Net) -> Res<()> {
    let Some((socket, size)) = &net.pool else {
        return Ok(());
    };
    let network = net.network();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        check_stop()?;
        let s = pool_status(socket)?;
        let ready = s["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["network"] == network.as_str() && p["target"] == *size)
            .find_map(|p| p["ready"].as_u64());
        if ready.is_some_and(|r| r >= *size) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{}: the warm pool did not refill: {s}", net.label));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// (d)'s pool counters (hits, misses) now.
fn pool_counts(net: &Net) -> Res<(u64, u64)> {
    let Some((socket, _)) = &net.pool else {
        return Ok((0, 0));
    };
    let s = pool_status(socket)?;
    Ok((
        s["hits"].as_u64().unwrap_or_default(),
        s["misses"].as_u64().unwrap_or_default(),
    ))
}

/// The reference chain: the IPAM-mode example with dipam taken out, so ptp's settings and
/// host-local's config are exactly those of (c).
fn reference_net(key: &'static str, label: &'static str, prefix: &'static str) -> Res<Net> {
    // No dipamd behind this one: its socketPath goes away with dipam's keys below.
    let mut net = dipam_net(
        "ptp-dipam-host-local.conflist",
        Path::new("/nonexistent"),
        key,
        label,
        prefix,
        1,
    )?;
    let ipam = &mut net.list["plugins"][0]["ipam"];
    let delegate = ipam["delegate"].take();
    if delegate["type"] != "host-local" {
        return Err(format!(
            "unexpected delegate in the IPAM-mode example: {delegate}"
        ));
    }
    *ipam = delegate;
    Ok(net)
}

// ---------------------------------------------------------------------------------------
// Binaries

fn prepare_bins(opts: &Opts) -> Res<PathBuf> {
    let dir = match &opts.bin_dir {
        Some(d) => d.clone(),
        None => {
            progress!(
                "building release binaries (cargo build --release --bins -p dipam-plugin -p dipam-shim -p dipam-ctl -p dipam-lifecycle)"
            );
            bins::build(true, &[])?
        }
    };
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("--bin-dir {}: {e}", dir.display()))?;
    for b in ["dipam", "dipamd", "dipamctl"] {
        if !dir.join(b).is_file() {
            return Err(format!("{} is missing", dir.join(b).display()));
        }
    }
    if !bins::set_dir(dir.clone()) {
        return Err("the harness's binary directory was already chosen".into());
    }
    Ok(dir)
}

fn preflight() -> Res<()> {
    if !is_root() {
        return Err("dipam-bench needs root (network namespaces, veths)".into());
    }
    for p in ["ptp", "host-local"] {
        let path = Path::new(bins::REFERENCE_PLUGINS).join(p);
        if !path.is_file() {
            return Err(format!(
                "{} is missing: apt-get install containernetworking-plugins",
                path.display()
            ));
        }
    }
    Ok(())
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or_default()
}

/// VmRSS and VmHWM of `pid`, in KiB.
fn rss_kib(pid: Option<u32>) -> (u64, u64) {
    let Some(pid) = pid else { return (0, 0) };
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_default()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets `pid`'s VmHWM to its RSS now (`/proc/<pid>/clear_refs` "5", Linux 4.0 and later),
/// so that the next VmHWM read is the peak of what ran since: one phase's own peak, not the
/// start's or an earlier phase's. At 10,000 attachments a GC's or a listing's peak, not the
/// RSS between them, is what the node has to hold room for.
fn reset_peak(pid: Option<u32>) {
    if let Some(pid) = pid {
        // Best effort: where the kernel refuses, the next read is the peak since the start,
        // which overstates a phase's peak and never hides one.
        let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// ---------------------------------------------------------------------------------------
// dipamd's log

/// What dipamd logged about one (container ID, verb).
#[derive(Debug, Default, Clone)]
struct ServerSide {
    /// The handler's own time (`elapsed_ms` of the "ok" line).
    server_ms: Option<f64>,
    /// When the "ok" line was written (ns since the epoch).
    done_ns: Option<i128>,
    request_id: String,
    /// Every delegate exec of the request (`delegate exec finished`, debug level).
    delegate_ms: f64,
    delegate_execs: u32,
}

fn parse_log(text: &str) -> HashMap<(String, String), ServerSide> {
    let mut out: HashMap<(String, String), ServerSide> = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let span = &v["span"];
        let (Some(cid), Some(verb)) = (span["container_id"].as_str(), span["command"].as_str())
        else {
            continue;
        };
        let fields = &v["fields"];
        let entry = out.entry((cid.to_owned(), verb.to_owned())).or_default();
        match fields["message"].as_str() {
            Some("ok") => {
                entry.server_ms = fields["elapsed_ms"].as_f64();
                entry.done_ns = v["timestamp"].as_str().and_then(parse_rfc3339);
                entry.request_id = span["request_id"].as_str().unwrap_or_default().to_owned();
            }
            Some("delegate exec finished") => {
                entry.delegate_ms += fields["elapsed_ms"].as_f64().unwrap_or_default();
                entry.delegate_execs += 1;
            }
            _ => {}
        }
    }
    out
}

/// `2026-11-22T08:52:02.596330Z` (tracing-subscriber's UTC timestamps) to ns since the epoch.
fn parse_rfc3339(s: &str) -> Option<i128> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let frac_ns: i64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(secs as i128 * 1_000_000_000 + frac_ns as i128)
}

/// When the plugin made its request id: the id is `<pid:08x><ns since the epoch mod 2^32:08x>`
/// (plugin/src/lib.rs), taken right after the environment and config were parsed. Resolved
/// against the exec's start; `None` if it does not fall inside the exec (a changed format).
fn request_id_time(id: &str, started_ns: i128, ended_ns: i128) -> Option<i128> {
    let low = i128::from(u32::from_str_radix(id.get(8..16)?, 16).ok()?);
    let wrap = 1i128 << 32;
    let mut t = (started_ns & !(wrap - 1)) | low;
    if t < started_ns {
        t += wrap;
    }
    (t <= ended_ns).then_some(t)
}

// ---------------------------------------------------------------------------------------
// Sections

#[derive(Default)]
struct Latency {
    add: Vec<f64>,
    check: Vec<f64>,
    del: Vec<f64>,
    /// (d): timed ADDs served from the warm pool, and those that found it empty.
    pool_hits: u64,
    pool_misses: u64,
}

/// The wall clock of every timed exec, by (container ID, verb): lined up with dipamd's log
/// for the breakdown.
type Spans = HashMap<(String, String), Span>;

/// One pod through ADD, CHECK and DEL in a fresh namespace; times in ms.
fn pod_cycle(rt: &Runtime, net: &Net, warmup: bool, spans: &mut Spans) -> Res<(f64, f64, f64)> {
    let rt = net.runtime(rt);
    let ns = NetNs::new();
    // Warm-up pods carry their own prefix, so that they stay out of the server-side stats
    // (the first dipam request also probes host-local's VERSION).
    let att = if warmup {
        Attachment::new(&unique("warmup"), &ns.path())
    } else {
        net.attachment(&ns.path())
    };
    let mut step = |verb: &str, f: &dyn Fn() -> Result<(), dipam_lifecycle::CniError>| {
        let (r, took, span) = timed(f);
        r.map_err(|e| format!("{} {verb}: {e}", net.label))?;
        spans.insert((att.container_id.clone(), verb.to_owned()), span);
        Ok::<f64, String>(took)
    };
    let add = step("ADD", &|| rt.add(&net.list, &att).map(|_| ()))?;
    // (d): the refill after the take stays out of CHECK's and DEL's time.
    refilled(net)?;
    let check = step("CHECK", &|| rt.check(&net.list, &att))?;
    let del = step("DEL", &|| rt.del(&net.list, &att))?;
    drop(ns);
    refilled(net)?;
    Ok((add, check, del))
}

/// The order of the configurations in iteration `i`: rotated, so no configuration always
/// runs right after the same one (e.g. after a namespace teardown of a particular kind).
fn order(n: usize, i: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + i) % n)
}

fn latency(rt: &Runtime, nets: &[Net], opts: &Opts, spans: &mut Spans) -> Res<Vec<Latency>> {
    progress!("latency: {} warm-up pod(s) per configuration", opts.warmup);
    let mut ignored = Spans::new();
    for i in 0..opts.warmup {
        for k in order(nets.len(), i) {
            check_stop()?;
            pod_cycle(rt, &nets[k], true, &mut ignored)?;
        }
    }
    let mut out: Vec<Latency> = nets.iter().map(|_| Latency::default()).collect();
    let before: Vec<(u64, u64)> = nets.iter().map(pool_counts).collect::<Res<_>>()?;
    let started = Instant::now();
    for i in 0..opts.pods {
        for k in order(nets.len(), i) {
            check_stop()?;
            let (a, c, d) = pod_cycle(rt, &nets[k], false, spans)?;
            out[k].add.push(a);
            out[k].check.push(c);
            out[k].del.push(d);
        }
        if (i + 1) % 25 == 0 || i + 1 == opts.pods {
            progress!(
                "latency: {}/{} pods per configuration ({:.0} s)",
                i + 1,
                opts.pods,
                started.elapsed().as_secs_f64()
            );
        }
    }
    for ((l, net), (h0, m0)) in out.iter_mut().zip(nets).zip(before) {
        let (h, m) = pool_counts(net)?;
        (l.pool_hits, l.pool_misses) = (h - h0, m - m0);
    }
    Ok(out)
}

#[derive(Default)]
struct Throughput {
    pods: usize,
    add_wall: f64,
    del_wall: f64,
    add: Vec<f64>,
    del: Vec<f64>,
    /// (d): ADDs served from the warm pool, and those that found it empty.
    pool_hits: u64,
    pool_misses: u64,
}

impl Throughput {
    fn pods_per_s(&self) -> f64 {
        ratio(self.pods as f64 * 1e3, self.add_wall + self.del_wall)
    }
}

/// Runs `op` on every attachment with `threads` workers; returns the wall time and each
/// call's latency (ms).
fn fan_out<F>(atts: &[Attachment], threads: usize, op: F) -> Res<(f64, Vec<f64>)>
where
    F: Fn(&Attachment) -> Result<(), String> + Sync,
{
    let next = AtomicUsize::new(0);
    let times = Mutex::new(Vec::with_capacity(atts.len()));
    let errors = Mutex::new(Vec::new());
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    if STOP.load(Ordering::SeqCst) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(att) = atts.get(i) else { return };
                    let t = Instant::now();
                    let r = op(att);
                    let took = ms(t.elapsed());
                    match r {
                        Ok(()) => {
                            if let Ok(mut v) = times.lock() {
                                v.push(took);
                            }
                        }
                        Err(e) => {
                            if let Ok(mut v) = errors.lock() {
                                v.push(e);
                            }
                            // One failure ends the phase: the guards clean up.
                            STOP.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            });
        }
    });
    let wall = ms(t.elapsed());
    let errors = errors.into_inner().unwrap_or_default();
    if let Some(e) = errors.first() {
        return Err(format!("{e} ({} failure(s) in this phase)", errors.len()));
    }
    check_stop()?;
    Ok((wall, times.into_inner().unwrap_or_default()))
}

fn concurrency(rt: &Runtime, nets: &[Net], opts: &Opts) -> Res<Vec<Throughput>> {
    let mut out: Vec<Throughput> = nets.iter().map(|_| Throughput::default()).collect();
    let per_round = opts.concurrent_pods.div_ceil(opts.rounds);
    for round in 0..opts.rounds {
        for k in order(nets.len(), round) {
            check_stop()?;
            let net = &nets[k];
            let rt = net.runtime(rt);
            // (d) starts its round with a full pool.
            refilled(net)?;
            let (h0, m0) = pool_counts(net)?;
            let namespaces: Vec<NetNs> = (0..per_round).map(|_| NetNs::new()).collect();
            let atts: Vec<Attachment> = namespaces
                .iter()
                .map(|ns| net.concurrent_attachment(&ns.path()))
                .collect();
            let (add_wall, add) = fan_out(&atts, opts.concurrency, |a| {
                rt.add(&net.list, a)
                    .map(|_| ())
                    .map_err(|e| format!("{} ADD: {e}", net.label))
            })?;
            let (del_wall, del) = fan_out(&atts, opts.concurrency, |a| {
                rt.del(&net.list, a)
                    .map_err(|e| format!("{} DEL: {e}", net.label))
            })?;
            let (h, m) = pool_counts(net)?;
            let t = &mut out[k];
            t.pool_hits += h - h0;
            t.pool_misses += m - m0;
            t.pods += atts.len();
            t.add_wall += add_wall;
            t.del_wall += del_wall;
            t.add.extend(add);
            t.del.extend(del);
            drop(namespaces);
            // (d)'s refill stays out of the next configuration's round.
            refilled(net)?;
            progress!(
                "concurrency: round {}/{} {}: {} pods, ADD {:.0} ms, DEL {:.0} ms wall",
                round + 1,
                opts.rounds,
                net.key,
                atts.len(),
                add_wall,
                del_wall
            );
            // Let the kernel finish tearing the namespaces down before the next timed phase.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    Ok(out)
}

/// One exec's wall clock, for the breakdown.
#[derive(Debug, Clone, Copy)]
struct Span {
    start_ns: i128,
    end_ns: i128,
}

/// The cold-start samples (ms). `dipam` holds one entry per plugin binary: the one under
/// test, and `--alt-plugin` when given, so that two builds are compared in the same run.
#[derive(Default)]
struct Cold {
    true_ms: Vec<f64>,
    hl_add: Vec<f64>,
    hl_del: Vec<f64>,
    dipam: Vec<PluginCold>,
}

#[derive(Default)]
struct PluginCold {
    label: String,
    version: Vec<f64>,
    add: Vec<f64>,
    del: Vec<f64>,
}

/// Times one call and records its wall clock.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, Span) {
    let start = SystemTime::now();
    let t = Instant::now();
    let out = f();
    let took = ms(t.elapsed());
    let end = SystemTime::now();
    (
        out,
        took,
        Span {
            start_ns: epoch_ns(start),
            end_ns: epoch_ns(end),
        },
    )
}

/// A runtime that finds `plugin` as `dipam` first in CNI_PATH (through a symlink in a temp
/// dir), for `--alt-plugin`.
fn alt_runtime(plugin: &Path) -> Res<(Runtime, TempDir)> {
    let dir = data_dir("alt-plugin")?;
    let plugin = plugin
        .canonicalize()
        .map_err(|e| format!("--alt-plugin {}: {e}", plugin.display()))?;
    std::os::unix::fs::symlink(&plugin, dir.path().join("dipam"))
        .map_err(|e| format!("symlink to {}: {e}", plugin.display()))?;
    let rt = Runtime::new(format!("{}:{}", dir.path().display(), bins::cni_path()));
    Ok((rt, dir))
}

fn cold(rt: &Runtime, hl: &Net, ipam: &Net, opts: &Opts, spans: &mut Spans) -> Res<Cold> {
    let sys = Runtime::new("/bin:/usr/bin".into());
    let alt = opts.alt_plugin.as_deref().map(alt_runtime).transpose()?;
    // The plugins under test: (label, runtime that finds it, container ID prefix).
    let mut plugins = vec![("dipam".to_owned(), rt, "colddipam")];
    if let Some((alt_rt, _)) = &alt {
        plugins.push(("alt".to_owned(), alt_rt, "coldalt"));
    }
    let mut c = Cold {
        dipam: plugins
            .iter()
            .map(|(label, _, _)| PluginCold {
                label: label.clone(),
                ..PluginCold::default()
            })
            .collect(),
        ..Cold::default()
    };
    let dummy_ns = "/var/run/netns/dipam-bench-none";
    let version_conf = format!(r#"{{"cniVersion":"{CNI_VERSION}"}}"#);
    let none = Attachment::new("", "");
    let ok = |e: dipam_lifecycle::runtime::Exec, what: &str| {
        if e.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what}: {} {}",
                String::from_utf8_lossy(&e.stdout),
                String::from_utf8_lossy(&e.stderr)
            ))
        }
    };
    // Warm-up (page cache, dipamd's VERSION probe of host-local), not counted.
    let total = opts.cold_iters + opts.warmup.max(3);
    let kinds = 2 + 2 * plugins.len();
    let started = Instant::now();
    for i in 0..total {
        check_stop()?;
        let counted = i >= total - opts.cold_iters;
        // Rotated like the other sections, over every kind of exec.
        for k in order(kinds, i) {
            match k {
                0 => {
                    let (e, t, _) = timed(|| sys.exec("true", "VERSION", &none, b""));
                    ok(e, "/bin/true")?;
                    if counted {
                        c.true_ms.push(t);
                    }
                }
                1 => {
                    let att = hl.attachment(dummy_ns);
                    let (r, add, _) = timed(|| rt.ipam(&hl.list, 0, "ADD", &att, None));
                    let result = r.map_err(|e| format!("host-local ADD: {e}"))?;
                    let (r, del, _) = timed(|| rt.ipam(&hl.list, 0, "DEL", &att, Some(&result)));
                    r.map_err(|e| format!("host-local DEL: {e}"))?;
                    if counted {
                        c.hl_add.push(add);
                        c.hl_del.push(del);
                    }
                }
                k if k % 2 == 0 => {
                    let (label, prt, _) = &plugins[k / 2 - 1];
                    let (e, t, _) =
                        timed(|| prt.exec("dipam", "VERSION", &none, version_conf.as_bytes()));
                    ok(e, &format!("{label} VERSION"))?;
                    if counted {
                        c.dipam[k / 2 - 1].version.push(t);
                    }
                }
                k => {
                    let (label, prt, prefix) = &plugins[k / 2 - 1];
                    let att = Attachment::new(&unique(prefix), dummy_ns);
                    let (r, add, s_add) = timed(|| prt.ipam(&ipam.list, 0, "ADD", &att, None));
                    let result = r.map_err(|e| format!("{label} ADD: {e}"))?;
                    let (r, del, s_del) =
                        timed(|| prt.ipam(&ipam.list, 0, "DEL", &att, Some(&result)));
                    r.map_err(|e| format!("{label} DEL: {e}"))?;
                    if counted {
                        let p = &mut c.dipam[k / 2 - 1];
                        p.add.push(add);
                        p.del.push(del);
                        spans.insert((att.container_id.clone(), "ADD".into()), s_add);
                        spans.insert((att.container_id.clone(), "DEL".into()), s_del);
                    }
                }
            }
        }
        if (i + 1) % 100 == 0 || i + 1 == total {
            progress!(
                "cold start: {}/{} iterations ({:.0} s)",
                i + 1,
                total,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(c)
}

/// One dipam request split at the points both sides can see: the runtime's spawn and reap,
/// the plugin's request id, and the start and end of dipamd's handler (ms each).
#[derive(Default)]
struct Parts {
    /// spawn -> request id: exec, start-up, config parsing (for (c) also ptp's start and its
    /// exec of dipam).
    startup: Vec<f64>,
    /// request id -> handler start: pre-RPC work (main mode: open the netns, check the
    /// interface is free), tokio runtime, connect, HTTP/2, request.
    to_server: Vec<f64>,
    delegate: Vec<f64>,
    /// The handler minus the delegate exec: ledger commits, locks, parsing, rendering.
    ledger: Vec<f64>,
    /// handler end -> reaped: reply, post-RPC work (main mode: the datapath; (c): ptp's
    /// datapath), exit.
    back: Vec<f64>,
    total: Vec<f64>,
    execs: Vec<f64>,
}

/// The split of every timed request whose container ID starts with `prefix-`.
fn breakdown(
    spans: &Spans,
    log: &HashMap<(String, String), ServerSide>,
    prefix: &str,
    verb: &str,
) -> Parts {
    let mut p = Parts::default();
    let prefix = format!("{prefix}-");
    for ((cid, v), span) in spans {
        if v != verb || !cid.starts_with(&prefix) {
            continue;
        }
        let Some(s) = log.get(&(cid.clone(), v.clone())) else {
            continue;
        };
        let (Some(server), Some(done)) = (s.server_ms, s.done_ns) else {
            continue;
        };
        let Some(rid) = request_id_time(&s.request_id, span.start_ns, span.end_ns) else {
            continue;
        };
        let server_start = done - (server * 1e6) as i128;
        let to_ms = |ns: i128| ns as f64 / 1e6;
        p.startup.push(to_ms(rid - span.start_ns));
        p.to_server.push(to_ms(server_start - rid));
        p.delegate.push(s.delegate_ms);
        p.ledger.push(server - s.delegate_ms);
        p.back.push(to_ms(span.end_ns - done));
        p.total.push(to_ms(span.end_ns - span.start_ns));
        p.execs.push(f64::from(s.delegate_execs));
    }
    p
}

/// Server-side medians of the chain runs, per configuration prefix and verb.
fn server_stats(log: &HashMap<(String, String), ServerSide>, prefix: &str, verb: &str) -> Value {
    let mine: Vec<&ServerSide> = log
        .iter()
        .filter(|((cid, v), _)| v == verb && cid.starts_with(&format!("{prefix}-")))
        .map(|(_, s)| s)
        .collect();
    let server: Vec<f64> = mine.iter().filter_map(|s| s.server_ms).collect();
    let delegate: Vec<f64> = mine.iter().map(|s| s.delegate_ms).collect();
    let rest: Vec<f64> = mine
        .iter()
        .filter_map(|s| Some(s.server_ms? - s.delegate_ms))
        .collect();
    let execs: Vec<f64> = mine.iter().map(|s| f64::from(s.delegate_execs)).collect();
    json!({
        "requests": mine.len(),
        "server_ms": summarize(&server).json(),
        "delegate_exec_ms": summarize(&delegate).json(),
        "ledger_and_bookkeeping_ms": summarize(&rest).json(),
        "delegate_execs_per_request_mean": r3(summarize(&execs).mean),
    })
}

struct Scale {
    attachments: usize,
    idle_kib: u64,
    rounds: Vec<ScaleRound>,
    hwm_kib: u64,
    /// After the last round and IDLE_WAIT without requests.
    settled_kib: u64,
}

/// How long the bench leaves dipamd idle before it reads an "idle" RSS: dipamd returns freed
/// heap to the system after 10 s without requests (shim-server trim.rs).
const IDLE_WAIT: Duration = Duration::from_secs(12);

/// One round: `attachments + 1` ADDs, then a GC that frees all but one, then its DEL.
struct ScaleRound {
    loaded_kib: u64,
    after_gc_kib: u64,
    create_wall_ms: f64,
    gc_ms: f64,
    freed_logged: usize,
    left_in_ledger: usize,
    left_in_store: usize,
}

/// dipamd's RSS fresh, with `attachments + 1` attachments, and after one CNI GC that frees
/// all but one; `--scale-rounds` repeats the round on the same dipamd, to show how its RSS
/// evolves under churn.
fn scale(rt: &Runtime, opts: &Opts) -> Res<Scale> {
    let d = Dipamd::start_with(&COLLECTING);
    // IPAM-mode calls need no namespace: ptp is not involved, and dipamd only records the
    // path. host-local keeps 253 addresses per /24, so enough /24s go into one range set.
    let n = opts.attachments + 1;
    let subnets = n.div_ceil(250) + 1;
    let net = dipam_net(
        "ptp-dipam-host-local.conflist",
        &d.socket(),
        "s",
        "scale",
        "scale",
        subnets,
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let (idle_kib, _) = rss_kib(d.pid());
    progress!("scale: dipamd idle RSS {:.1} MiB", mib(idle_kib));
    let mut rounds = Vec::new();
    for round in 1..=opts.scale_rounds {
        check_stop()?;
        let atts: Vec<Attachment> = (0..n)
            .map(|_| net.attachment("/var/run/netns/dipam-bench-none"))
            .collect();
        let (create_wall_ms, _) = fan_out(&atts, opts.concurrency, |a| {
            rt.ipam(&net.list, 0, "ADD", a, None)
                .map(|_| ())
                .map_err(|e| format!("scale ADD: {e}"))
        })?;
        std::thread::sleep(Duration::from_secs(1));
        let (loaded_kib, _) = rss_kib(d.pid());

        let keep = &atts[0];
        let mut l = net.list.clone();
        l["cniVersion"] = json!("1.1.0");
        let valid = json!([{"containerID": keep.container_id, "ifname": keep.ifname}]);
        l["plugins"][0]["cni.dev/valid-attachments"] = valid.clone();
        l["plugins"][0]["cni.dev/attachments"] = valid;
        let t = Instant::now();
        rt.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
            .map_err(|e| format!("GC: {e}"))?;
        let gc_ms = ms(t.elapsed());
        let (after_gc_kib, _) = rss_kib(d.pid());
        let left_in_ledger = d.ledger_ips(&net.network()).len();
        let left_in_store = hostlocal::reservations(net.data.path(), &net.network()).len();
        let freed_logged = d
            .log()
            .lines()
            .filter(|l| l.contains("\"GC freed\""))
            .count()
            - rounds
                .iter()
                .map(|r: &ScaleRound| r.freed_logged)
                .sum::<usize>();
        progress!(
            "scale: round {round}/{}: {n} attachments in {:.1} s (RSS {:.1} MiB), GC {:.1} s \
             (RSS {:.1} MiB); {left_in_ledger} left in the ledger, {left_in_store} in host-local",
            opts.scale_rounds,
            create_wall_ms / 1e3,
            mib(loaded_kib),
            gc_ms / 1e3,
            mib(after_gc_kib),
        );
        if left_in_ledger != 1 || left_in_store != 1 {
            return Err(format!(
                "GC left {left_in_ledger} in the ledger and {left_in_store} in host-local, \
                 expected 1 each"
            ));
        }
        rt.ipam(&net.list, 0, "DEL", keep, None)
            .map_err(|e| format!("scale DEL: {e}"))?;
        rounds.push(ScaleRound {
            loaded_kib,
            after_gc_kib,
            create_wall_ms,
            gc_ms,
            freed_logged,
            left_in_ledger,
            left_in_store,
        });
    }
    let (_, hwm_kib) = rss_kib(d.pid());
    // Idle means idle: dipamd hands freed heap back after IDLE_WAIT without requests.
    std::thread::sleep(IDLE_WAIT);
    let (settled_kib, _) = rss_kib(d.pid());
    progress!(
        "scale: dipamd RSS {:.1} MiB after {} s idle",
        mib(settled_kib),
        IDLE_WAIT.as_secs()
    );
    Ok(Scale {
        attachments: n - 1,
        idle_kib,
        rounds,
        hwm_kib,
        settled_kib,
    })
}

// ---------------------------------------------------------------------------------------
// GC at node scale (issue 19): the exec floor, the GC alone, the GC with ADDs arriving.

/// One round of the GC section.
struct GcRound {
    /// The 1-minute load average when the round started.
    load: f64,
    /// host-local's DEL of `stale` reservations of `stale + 1`, exec'd directly, one by one.
    floor_serial_ms: f64,
    /// The same, `parallel` at a time.
    floor_parallel_ms: f64,
    /// The CPU time (user + system) of those DELs, serially and `parallel` at a time: what
    /// the floor costs whatever the wall clock does, and, divided by the CPUs, the least wall
    /// time any way of running them could take on this machine at this load.
    floor_serial_cpu_s: f64,
    floor_parallel_cpu_s: f64,
    /// One CNI GC freeing `stale` attachments, nothing else running.
    gc_ms: f64,
    /// Its CPU time: dipamd's own, its delegates' (reaped by dipamd), the plugin's.
    gc_cpu: GcCpu,
    /// The same while ADDs arrive.
    gc_with_adds_ms: f64,
    /// ADDs (spawn to reap) with no GC running, on the same network holding `stale + 1`.
    adds_alone: Vec<f64>,
    /// ADDs that started while the GC ran.
    adds_during: Vec<f64>,
}

/// CPU seconds spent on one GC, by whom.
#[derive(Clone, Copy, Default)]
struct GcCpu {
    dipamd_s: f64,
    delegates_s: f64,
    plugin_s: f64,
}

/// `/proc/PID/stat`'s user + system time of the process and of its reaped children, in
/// seconds. The kernel reports them in USER_HZ ticks, 100 per second on Linux/x86 (an ABI
/// constant, unlike the kernel's HZ): 10 ms resolution, fine for totals of seconds.
fn proc_cpu_s(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest: Vec<f64> = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // Fields 14-17 (utime, stime, cutime, cstime); `rest` starts at field 3.
    let field = |n: usize| rest.get(n - 3).copied().unwrap_or(0.0) / 100.0;
    (field(14) + field(15), field(16) + field(17))
}

/// CPU seconds of the children this process has reaped so far (the execs it timed).
fn children_cpu_s() -> f64 {
    proc_cpu_s("self").1
}

struct GcBench {
    stale: usize,
    parallel: usize,
    add_interval_ms: u64,
    rounds: Vec<GcRound>,
}

/// Runs `op` on `atts`, `threads` at a time, and returns the wall time (ms).
fn wall_of<F>(atts: &[Attachment], threads: usize, op: F) -> Res<f64>
where
    F: Fn(&Attachment) -> Result<(), String> + Sync,
{
    fan_out(atts, threads, op).map(|(wall, _)| wall)
}

/// The exec floor: host-local's DEL, exec'd directly the way dipamd execs it (the delegate
/// config on stdin), for all but the first of `atts` after all were reserved; serially, then
/// `parallel` at a time. host-local walks its whole directory (reading every reservation)
/// under its directory lock on every DEL, so the floor depends on how many reservations the
/// directory holds: the same `stale + 1` as the GC's.
fn gc_floor(rt: &Runtime, net: &Net, atts: &[Attachment], parallel: usize) -> Res<[(f64, f64); 2]> {
    let dir = data_dir("gc-floor")?;
    let mut conf = Runtime::plugin_config(&net.list, 0, None);
    conf["ipam"] = conf["ipam"]["delegate"].clone();
    conf["ipam"]["dataDir"] = json!(dir.path());
    let bytes = serde_json::to_vec(&conf).map_err(|e| e.to_string())?;
    let run = |cmd: &str, a: &Attachment| {
        let out = rt.exec("host-local", cmd, a, &bytes);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "host-local {cmd} {}: {}",
                a.container_id,
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    };
    let network = net.network();
    let mut walls = Vec::new();
    for threads in [1, parallel] {
        check_stop()?;
        wall_of(atts, 8, |a| run("ADD", a))?;
        let cpu = children_cpu_s();
        let wall = wall_of(&atts[1..], threads, |a| run("DEL", a))?;
        let cpu = children_cpu_s() - cpu;
        let left = hostlocal::reservations(dir.path(), &network).len();
        if left != 1 {
            return Err(format!(
                "the floor's DELs left {left} reservations, expected 1"
            ));
        }
        run("DEL", &atts[0])?;
        walls.push((wall, cpu));
    }
    Ok([walls[0], walls[1]])
}

/// ADDs of the pods `pods` on `net`, one every `interval` after the previous one ended, until
/// `until` says stop (checked before each ADD) or `pods` run out: each one's latency (ms) and
/// attachment.
fn probe_adds(
    rt: &Runtime,
    net: &Net,
    interval: Duration,
    pods: &[Attachment],
    until: Option<&AtomicBool>,
) -> Res<(Vec<f64>, Vec<Attachment>)> {
    let mut times = Vec::new();
    let mut atts = Vec::new();
    for a in pods {
        check_stop()?;
        if until.is_some_and(|u| u.load(Ordering::SeqCst)) {
            break;
        }
        let t = Instant::now();
        rt.ipam(&net.list, 0, "ADD", a, None)
            .map_err(|e| format!("ADD during the GC section: {e}"))?;
        times.push(ms(t.elapsed()));
        atts.push(a.clone());
        std::thread::sleep(interval);
    }
    Ok((times, atts))
}

/// Pods the GC section's runtime creates while it collects: the runtime knows them, so they
/// are in its valid list from the start (a pod whose ADD ended before the GC read the ledger
/// would otherwise be stale, with `--gc-grace 0`).
fn probe_pods(n: usize) -> Vec<Attachment> {
    (0..n)
        .map(|_| Attachment::new(&unique("gcprobe"), "/var/run/netns/dipam-bench-none"))
        .collect()
}

fn gc_section(rt: &Runtime, opts: &Opts) -> Res<GcBench> {
    let parallel = opts.gc_parallel.unwrap_or(DIPAMD_GC_PARALLEL);
    let parallel_arg = parallel.to_string();
    let mut flags = COLLECTING.to_vec();
    if opts.gc_parallel.is_some() {
        flags.extend(["--gc-parallel", &parallel_arg]);
    }
    let d = Dipamd::start_with(&flags);
    let stale = opts.attachments;
    let n = stale + 1;
    // Probe ADDs take addresses too.
    let subnets = (n + 400).div_ceil(250) + 1;
    let net = dipam_net(
        "ptp-dipam-host-local.conflist",
        &d.socket(),
        "g",
        "gc",
        "gc",
        subnets,
    )?;
    let interval = Duration::from_millis(opts.gc_add_interval_ms);
    let mut gc_list = net.list.clone();
    gc_list["cniVersion"] = json!("1.1.0");
    let gc = |valid: &[Attachment]| {
        let mut l = gc_list.clone();
        let valid: Vec<Value> = valid
            .iter()
            .map(|a| json!({"containerID": a.container_id, "ifname": a.ifname}))
            .collect();
        let valid = Value::Array(valid);
        l["plugins"][0]["cni.dev/valid-attachments"] = valid.clone();
        l["plugins"][0]["cni.dev/attachments"] = valid;
        let t = Instant::now();
        rt.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
            .map_err(|e| format!("GC: {e}"))?;
        Ok::<f64, String>(ms(t.elapsed()))
    };
    let fill = |atts: &[Attachment]| {
        wall_of(atts, opts.concurrency, |a| {
            rt.ipam(&net.list, 0, "ADD", a, None)
                .map(|_| ())
                .map_err(|e| format!("GC section ADD: {e}"))
        })
    };
    let left = |extra: usize| {
        let in_ledger = d.ledger_ips(&net.network()).len();
        let in_store = hostlocal::reservations(net.data.path(), &net.network()).len();
        if in_ledger != 1 + extra || in_store != 1 + extra {
            return Err(format!(
                "GC left {in_ledger} in the ledger and {in_store} in host-local, expected {} \
                 each",
                1 + extra
            ));
        }
        Ok(())
    };
    let mut rounds = Vec::new();
    for round in 1..=opts.gc_rounds {
        check_stop()?;
        let atts: Vec<Attachment> = (0..n)
            .map(|_| net.attachment("/var/run/netns/dipam-bench-none"))
            .collect();
        let load = loadavg().first().copied().unwrap_or(0.0);
        let [
            (floor_serial_ms, floor_serial_cpu_s),
            (floor_parallel_ms, floor_parallel_cpu_s),
        ] = gc_floor(rt, &net, &atts, parallel)?;

        // The GC alone.
        fill(&atts)?;
        std::thread::sleep(Duration::from_secs(1));
        let (adds_alone, probes) = probe_adds(rt, &net, interval, &probe_pods(30), None)?;
        for a in &probes {
            rt.ipam(&net.list, 0, "DEL", a, None)
                .map_err(|e| format!("DEL: {e}"))?;
        }
        let pid = d.pid().map(|p| p.to_string()).unwrap_or_default();
        let (own, reaped, plugin) = (proc_cpu_s(&pid).0, proc_cpu_s(&pid).1, children_cpu_s());
        let gc_ms = gc(&atts[..1])?;
        let gc_cpu = GcCpu {
            dipamd_s: proc_cpu_s(&pid).0 - own,
            delegates_s: proc_cpu_s(&pid).1 - reaped,
            plugin_s: children_cpu_s() - plugin,
        };
        left(0)?;

        // The GC with ADDs arriving.
        fill(&atts[1..])?;
        std::thread::sleep(Duration::from_secs(1));
        let done = AtomicBool::new(false);
        // More than can be added during the GC; the valid list names them all, and the keep.
        let pods = probe_pods(400);
        let valid: Vec<Attachment> = std::iter::once(atts[0].clone())
            .chain(pods.iter().cloned())
            .collect();
        let (gc_with_adds_ms, probed) = std::thread::scope(|s| {
            let adds = s.spawn(|| probe_adds(rt, &net, interval, &pods, Some(&done)));
            let gc_ms = gc(&valid);
            done.store(true, Ordering::SeqCst);
            let probed = adds
                .join()
                .map_err(|_| "the ADD thread panicked".to_owned());
            (gc_ms, probed)
        });
        let gc_with_adds_ms = gc_with_adds_ms?;
        let (adds_during, probes) = probed??;
        // The ADDs beside the GC kept their addresses: the keep plus every probe is left.
        left(probes.len())?;
        for a in probes.iter().chain(std::iter::once(&atts[0])) {
            rt.ipam(&net.list, 0, "DEL", a, None)
                .map_err(|e| format!("DEL: {e}"))?;
        }
        progress!(
            "gc: round {round}/{} (load {load:.1}): floor {:.2} s serial, {:.2} s at {parallel} \
             (CPU {floor_serial_cpu_s:.2} / {floor_parallel_cpu_s:.2} s); GC {:.2} s alone (CPU: \
             dipamd {:.2}, delegates {:.2} s), {:.2} s with {} ADDs (p50 {:.1} ms, max {:.1} ms; \
             {:.1} ms with no GC)",
            opts.gc_rounds,
            floor_serial_ms / 1e3,
            floor_parallel_ms / 1e3,
            gc_ms / 1e3,
            gc_cpu.dipamd_s,
            gc_cpu.delegates_s,
            gc_with_adds_ms / 1e3,
            adds_during.len(),
            median(&adds_during),
            summarize(&adds_during).max,
            median(&adds_alone),
        );
        rounds.push(GcRound {
            load,
            floor_serial_ms,
            floor_parallel_ms,
            floor_serial_cpu_s,
            floor_parallel_cpu_s,
            gc_ms,
            gc_cpu,
            gc_with_adds_ms,
            adds_alone,
            adds_during,
        });
    }
    Ok(GcBench {
        stale,
        parallel,
        add_interval_ms: opts.gc_add_interval_ms,
        rounds,
    })
}

// ---------------------------------------------------------------------------------------
// Report: a text table on stdout, everything in JSON, and the issue's targets.

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    json!({"cpu": cpu, "cpus": cpus, "kernel": kernel})
}

/// The 1, 5 and 15 minute load averages: worth knowing when reading the numbers of a
/// machine that other work shares.
fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn parts_json(p: &Parts) -> Value {
    json!({
        "requests": p.total.len(),
        "spawn_to_request_id": summarize(&p.startup).json(),
        "request_id_to_handler": summarize(&p.to_server).json(),
        "delegate_exec": summarize(&p.delegate).json(),
        "ledger_and_bookkeeping": summarize(&p.ledger).json(),
        "handler_done_to_reaped": summarize(&p.back).json(),
        "total": summarize(&p.total).json(),
        "delegate_execs_per_request_mean": r3(summarize(&p.execs).mean),
    })
}

fn cell(s: &Summary) -> String {
    format!("{:6.2} {:6.2} {:6.2}", s.p50, s.p90, s.p99)
}

struct Target {
    name: String,
    value: String,
    goal: String,
    pass: bool,
}

/// A part of a [`Parts`], for the breakdown's rows.
type PartOf = fn(&Parts) -> &Vec<f64>;

#[derive(Default)]
struct Report {
    text: String,
    json: serde_json::Map<String, Value>,
    targets: Vec<Target>,
}

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        self.text.push_str(s.as_ref());
        self.text.push('\n');
    }

    fn target(&mut self, name: impl Into<String>, value: String, goal: &str, pass: bool) {
        self.targets.push(Target {
            name: name.into(),
            value,
            goal: goal.into(),
            pass,
        });
    }

    fn latency(&mut self, nets: &[Net], lat: &[Latency], pods: usize) {
        self.line(format!(
            "\nLatency, {pods} sequential pods per configuration, one fresh netns each, \
             cniVersion {CNI_VERSION} (ms)"
        ));
        self.line(format!(
            "{:<31} {:^20}   {:^20}   {:^20}   {:>8}",
            "", "ADD p50/p90/p99", "CHECK p50/p90/p99", "DEL p50/p90/p99", "pods/s"
        ));
        let mut out = serde_json::Map::new();
        let pods_per_s = |l: &Latency| {
            let total: f64 = l.add.iter().sum::<f64>() + l.del.iter().sum::<f64>();
            ratio(l.add.len() as f64 * 1e3, total)
        };
        for (net, l) in nets.iter().zip(lat) {
            let (a, c, d) = (summarize(&l.add), summarize(&l.check), summarize(&l.del));
            let pps = pods_per_s(l);
            self.line(format!(
                "{:<31} {}   {}   {}   {:>8.1}",
                net.label,
                cell(&a),
                cell(&c),
                cell(&d),
                pps
            ));
            out.insert(
                net.key.into(),
                json!({"label": net.label, "add": a.json(), "check": c.json(), "del": d.json(),
                       "sequential_pods_per_s": r3(pps)}),
            );
        }
        let r = |x: &[f64], y: &[f64]| ratio(median(x), median(y));
        for (k, name) in [(1, "b/a"), (2, "c/a"), (3, "d/a"), (4, "e/a")] {
            if k >= lat.len() {
                continue;
            }
            let (l, a) = (&lat[k], &lat[0]);
            let (add, check, del) = (r(&l.add, &a.add), r(&l.check, &a.check), r(&l.del, &a.del));
            let pps = ratio(pods_per_s(l), pods_per_s(a));
            self.line(format!(
                "{:<31} {add:>6.2} {:>13}   {check:>6.2} {:>13}   {del:>6.2} {:>13}   {pps:>8.2}",
                format!("ratio {name} (p50; pods/s)"),
                "",
                "",
                ""
            ));
            out.insert(
                format!("ratio_{}", name.replace('/', "_")),
                json!({"add_p50": r3(add), "check_p50": r3(check), "del_p50": r3(del),
                       "sequential_pods_per_s": r3(pps)}),
            );
        }
        // --alt-dipamd: each alternative configuration against its current twin.
        for (net, l) in nets.iter().zip(lat) {
            let Some(of) = net.alt_of else { continue };
            let cur = &lat[of];
            let (add, check, del) = (
                r(&l.add, &cur.add),
                r(&l.check, &cur.check),
                r(&l.del, &cur.del),
            );
            let pps = ratio(pods_per_s(l), pods_per_s(cur));
            let name = format!("{}/{}", net.key.replace("_alt", "'"), nets[of].key);
            self.line(format!(
                "{:<31} {add:>6.2} {:>13}   {check:>6.2} {:>13}   {del:>6.2} {:>13}   {pps:>8.2}",
                format!("ratio alt {name} (p50; pods/s)"),
                "",
                "",
                ""
            ));
            out.insert(
                format!("ratio_alt_{}", nets[of].key),
                json!({"add_p50": r3(add), "check_p50": r3(check), "del_p50": r3(del),
                       "sequential_pods_per_s": r3(pps)}),
            );
            if net.pool.is_some() {
                out.insert(
                    if of == 3 {
                        "warm_pool_alt".to_owned()
                    } else {
                        format!("warm_pool_alt_{}", nets[of].key)
                    },
                    json!({"hits": l.pool_hits, "misses": l.pool_misses}),
                );
            }
        }
        for (k, key) in [(3, "warm_pool"), (4, "warm_pool_e")] {
            let (Some(net), Some(d)) = (nets.get(k), lat.get(k)) else {
                continue;
            };
            self.line(format!(
                "{}: {} of {} timed ADDs served from the warm pool, {} found it empty",
                net.label,
                d.pool_hits,
                d.add.len(),
                d.pool_misses
            ));
            out.insert(
                key.into(),
                json!({"hits": d.pool_hits, "misses": d.pool_misses}),
            );
        }
        // Issue 40 §5's pooled ADD targets: main mode, and IPAM mode.
        for (k, name, goal) in [
            (3, "dipam main + warm pool (d)", 0.4),
            (4, "ptp + dipam + warm pool (e)", 0.8),
        ] {
            let Some(l) = lat.get(k) else { continue };
            let (x, y) = (median(&l.add), median(&lat[0].add));
            self.target(
                format!("ADD p50, {name} / (a)"),
                format!("{:.2}x ({x:.2} vs {y:.2} ms)", x / y),
                &format!("<= {goal:.2}x"),
                x <= goal * y,
            );
        }
        self.json.insert("latency".into(), Value::Object(out));
        let (b, a) = (&lat[1], &lat[0]);
        for (verb, bv, av, goal) in [("ADD", &b.add, &a.add, 0.7), ("DEL", &b.del, &a.del, 0.8)] {
            let (x, y) = (median(bv), median(av));
            self.target(
                format!("{verb} p50, dipam main (b) / ptp + host-local (a)"),
                format!("{:.2}x ({x:.2} vs {y:.2} ms)", x / y),
                &format!("<= {goal:.2}x"),
                x <= goal * y,
            );
        }
    }

    fn throughput(&mut self, nets: &[Net], thr: &[Throughput], opts: &Opts) {
        self.line(format!(
            "\nThroughput, {} pods per configuration, {} threads, ADD all then DEL all, {} rounds",
            opts.concurrent_pods, opts.concurrency, opts.rounds
        ));
        self.line(format!(
            "{:<31} {:>8} {:>10} {:>10}   {:^20}   {:^20}",
            "", "pods/s", "ADD/s", "DEL/s", "ADD p50/p90/p99", "DEL p50/p90/p99"
        ));
        let mut out = serde_json::Map::new();
        for (net, t) in nets.iter().zip(thr) {
            let add_s = ratio(t.pods as f64 * 1e3, t.add_wall);
            let del_s = ratio(t.pods as f64 * 1e3, t.del_wall);
            let (a, d) = (summarize(&t.add), summarize(&t.del));
            self.line(format!(
                "{:<31} {:>8.1} {add_s:>10.1} {del_s:>10.1}   {}   {}",
                net.label,
                t.pods_per_s(),
                cell(&a),
                cell(&d)
            ));
            out.insert(
                net.key.into(),
                json!({"label": net.label, "pods": t.pods, "pods_per_s": r3(t.pods_per_s()),
                       "add_per_s": r3(add_s), "del_per_s": r3(del_s),
                       "add_wall_ms": r3(t.add_wall), "del_wall_ms": r3(t.del_wall),
                       "add": a.json(), "del": d.json()}),
            );
        }
        for (k, name, label) in [(1, "b/a", "dipam main (b)"), (2, "c/a", "ptp + dipam (c)")] {
            let (x, y) = (thr[k].pods_per_s(), thr[0].pods_per_s());
            self.line(format!("{:<31} {:>8.2}", format!("ratio {name}"), x / y));
            out.insert(
                format!("ratio_{}", name.replace('/', "_")),
                json!(r3(x / y)),
            );
            self.target(
                format!("{}-way pods/s, {label} / (a)", opts.concurrency),
                format!("{:.2}x ({x:.1} vs {y:.1})", x / y),
                ">= 1.00x",
                x >= y,
            );
        }
        for (k, name, pool) in [(3, "d/a", "warm_pool"), (4, "e/a", "warm_pool_e")] {
            let (Some(net), Some(d)) = (nets.get(k), thr.get(k)) else {
                continue;
            };
            let (x, y) = (d.pods_per_s(), thr[0].pods_per_s());
            let add_ratio = ratio(thr[0].add_wall, d.add_wall);
            self.line(format!(
                "{:<31} {:>8.2}   (ADD/s {add_ratio:.2}x)",
                format!("ratio {name}"),
                x / y
            ));
            self.line(format!(
                "{}: {} of {} ADDs served from the warm pool, {} found it empty",
                net.label, d.pool_hits, d.pods, d.pool_misses
            ));
            let name = name.replace('/', "_");
            out.insert(format!("ratio_{name}"), json!(r3(x / y)));
            out.insert(format!("ratio_{name}_add_per_s"), json!(r3(add_ratio)));
            out.insert(
                pool.into(),
                json!({"hits": d.pool_hits, "misses": d.pool_misses}),
            );
            if k == 4 {
                self.target(
                    format!(
                        "{}-way pods/s, ptp + dipam + pool (e) / (a)",
                        opts.concurrency
                    ),
                    format!("{:.2}x ({x:.1} vs {y:.1})", x / y),
                    ">= 1.00x",
                    x >= y,
                );
            }
        }
        // --alt-dipamd: each alternative configuration against its current twin.
        for (net, t) in nets.iter().zip(thr) {
            let Some(of) = net.alt_of else { continue };
            let cur = &thr[of];
            let pps = ratio(t.pods_per_s(), cur.pods_per_s());
            let add_s = ratio(cur.add_wall, t.add_wall);
            let del_s = ratio(cur.del_wall, t.del_wall);
            let name = format!("{}/{}", net.key.replace("_alt", "'"), nets[of].key);
            self.line(format!(
                "{:<31} {pps:>8.2} {add_s:>10.2} {del_s:>10.2}",
                format!("ratio alt {name}")
            ));
            out.insert(
                format!("ratio_alt_{}", nets[of].key),
                json!({"pods_per_s": r3(pps), "add_per_s": r3(add_s), "del_per_s": r3(del_s)}),
            );
        }
        self.json.insert("concurrency".into(), Value::Object(out));
    }

    /// dipamd's handler per request, from its log, for the sequential and concurrent pods.
    fn server_side(&mut self, log: &HashMap<(String, String), ServerSide>) {
        let mut out = serde_json::Map::new();
        let mut rows = Vec::new();
        for (prefix, key, name) in [
            ("main", "b", "(b) main, sequential"),
            ("ipam", "c", "(c) IPAM, sequential"),
            ("cmain", "b_concurrent", "(b) main, concurrent"),
            ("cipam", "c_concurrent", "(c) IPAM, concurrent"),
            ("pool", "d", "(d) pool, sequential"),
            ("cpool", "d_concurrent", "(d) pool, concurrent"),
            ("altmain", "b_alt", "(b') alt main, sequential"),
            ("altipam", "c_alt", "(c') alt IPAM, sequential"),
            ("altpool", "d_alt", "(d') alt pool, sequential"),
            ("caltmain", "b_alt_concurrent", "(b') alt main, concurrent"),
            ("caltipam", "c_alt_concurrent", "(c') alt IPAM, concurrent"),
            ("caltpool", "d_alt_concurrent", "(d') alt pool, concurrent"),
            ("ipool", "e", "(e) IPAM pool, sequential"),
            ("cipool", "e_concurrent", "(e) IPAM pool, concurrent"),
            ("altipool", "e_alt", "(e') alt IPAM pool, sequential"),
            (
                "caltipool",
                "e_alt_concurrent",
                "(e') alt IPAM pool, concurrent",
            ),
        ] {
            let mut per = serde_json::Map::new();
            for verb in ["ADD", "CHECK", "DEL"] {
                let s = server_stats(log, prefix, verb);
                if s["requests"].as_u64().unwrap_or_default() > 0 {
                    rows.push((format!("{name} {verb}"), s.clone()));
                }
                per.insert(verb.into(), s);
            }
            out.insert(key.into(), Value::Object(per));
        }
        self.json
            .insert("dipamd_server_side".into(), Value::Object(out));
        if rows.is_empty() {
            return;
        }
        self.line(
            "\ndipamd's handler per request (p50 ms, from its log; execs: mean delegate execs)",
        );
        self.line(format!(
            "{:<36} {:>8} {:>10} {:>10} {:>7}",
            "", "handler", "delegate", "the rest", "execs"
        ));
        let p50 = |v: &Value, k: &str| v[k]["p50_ms"].as_f64().unwrap_or(f64::NAN);
        for (name, s) in rows {
            self.line(format!(
                "{name:<36} {:>8.2} {:>10.2} {:>10.2} {:>7.2}",
                p50(&s, "server_ms"),
                p50(&s, "delegate_exec_ms"),
                p50(&s, "ledger_and_bookkeeping_ms"),
                s["delegate_execs_per_request_mean"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            ));
        }
    }

    fn cold(&mut self, c: &Cold, iters: usize, alt: Option<&Path>) {
        let t = summarize(&c.true_ms);
        let (ha, hd) = (summarize(&c.hl_add), summarize(&c.hl_del));
        self.line(format!(
            "\nCold start, {iters} round-robin iterations, one spawn path for all (ms)"
        ));
        self.line(format!("{:<44} {:^20}   {:>7}", "", "p50/p90/p99", "-true"));
        let mut rows = vec![
            ("/bin/true".to_owned(), t),
            ("host-local ADD (the delegate's floor)".to_owned(), ha),
            ("host-local DEL".to_owned(), hd),
        ];
        let mut plugins = Vec::new();
        for p in &c.dipam {
            let (v, a, d) = (summarize(&p.version), summarize(&p.add), summarize(&p.del));
            rows.push((format!("{} VERSION", p.label), v));
            rows.push((format!("{} ADD, IPAM mode, dipamd warm", p.label), a));
            rows.push((format!("{} DEL, IPAM mode, dipamd warm", p.label), d));
            plugins.push(json!({
                "label": p.label, "version": v.json(), "add": a.json(), "del": d.json(),
                "overhead_add_p50_ms": r3(a.p50 - ha.p50), "overhead_del_p50_ms": r3(d.p50 - hd.p50),
            }));
        }
        for (name, s) in &rows {
            self.line(format!("{name:<44} {}   {:>7.2}", cell(s), s.p50 - t.p50));
        }
        if let Some(alt) = alt {
            self.line(format!("alt = {}", alt.display()));
        }
        for p in &c.dipam {
            let (oa, od) = (median(&p.add) - ha.p50, median(&p.del) - hd.p50);
            self.line(format!(
                "{:<44} {oa:>6.2} ADD, {od:>6.2} DEL (p50 differences)",
                format!("{}'s overhead over host-local", p.label)
            ));
        }
        self.json.insert(
            "cold_start".into(),
            json!({"true": t.json(), "host_local_add": ha.json(), "host_local_del": hd.json(),
                   "plugins": plugins}),
        );
        if let Some(p) = c.dipam.first() {
            let (oa, od) = (median(&p.add) - ha.p50, median(&p.del) - hd.p50);
            self.target(
                "dipam's overhead over the delegate, ADD p50",
                format!("{oa:.2} ms"),
                "<= 3 ms",
                oa <= 3.0,
            );
            self.target(
                "dipam's overhead over the delegate, DEL p50",
                format!("{od:.2} ms"),
                "<= 3 ms",
                od <= 3.0,
            );
        }
    }

    /// Where the time of every dipam request the runtime timed went.
    fn breakdown(&mut self, spans: &Spans, log: &HashMap<(String, String), ServerSide>) {
        let columns: Vec<(&str, Parts)> = [
            ("direct ADD", "colddipam", "ADD"),
            ("direct DEL", "colddipam", "DEL"),
            ("alt ADD", "coldalt", "ADD"),
            ("alt DEL", "coldalt", "DEL"),
            ("(b) ADD", "main", "ADD"),
            ("(b) CHECK", "main", "CHECK"),
            ("(b) DEL", "main", "DEL"),
            ("(c) ADD", "ipam", "ADD"),
            ("(c) DEL", "ipam", "DEL"),
            ("(d) ADD", "pool", "ADD"),
            ("(d) DEL", "pool", "DEL"),
        ]
        .into_iter()
        .map(|(name, prefix, verb)| (name, breakdown(spans, log, prefix, verb)))
        .filter(|(_, p)| !p.total.is_empty())
        .collect();
        if columns.is_empty() {
            return;
        }
        let out = columns
            .iter()
            .map(|(name, p)| ((*name).to_owned(), parts_json(p)))
            .collect();
        self.json.insert("breakdown".into(), Value::Object(out));
        self.line(
            "\nWhere a dipam request's time goes (p50 of each part, ms; the parts' p50s need not \
             add up to the total's)\ndirect: dipam exec'd as IPAM, dipamd warm (cold-start \
             section); (b), (c): the sequential pods",
        );
        let mut header = format!("{:<38}", "");
        for (name, _) in &columns {
            header.push_str(&format!(" {name:>10}"));
        }
        self.line(header);
        let rows: [(&str, PartOf); 6] = [
            ("spawn -> plugin's request id", |p| &p.startup),
            ("request id -> dipamd handler", |p| &p.to_server),
            ("dipamd: delegate exec", |p| &p.delegate),
            ("dipamd: ledger commits + bookkeeping", |p| &p.ledger),
            ("dipamd handler done -> reaped", |p| &p.back),
            ("total (spawn -> reaped)", |p| &p.total),
        ];
        for (name, get) in rows {
            let mut row = format!("{name:<38}");
            for (_, p) in &columns {
                row.push_str(&format!(" {:>10.2}", median(get(p))));
            }
            self.line(row);
        }
    }

    fn rss(&mut self, fresh_kib: u64, after_kib: u64, hwm_kib: u64) {
        self.line(format!(
            "\ndipamd RSS: {:.1} MiB fresh, {:.1} MiB idle after the runs above (peak {:.1} MiB)",
            mib(fresh_kib),
            mib(after_kib),
            mib(hwm_kib)
        ));
        self.json.insert(
            "rss".into(),
            json!({"fresh_kib": fresh_kib, "idle_after_runs_kib": after_kib, "peak_kib": hwm_kib}),
        );
        let idle = mib(fresh_kib.max(after_kib));
        self.target(
            "dipamd idle RSS (the larger of fresh, after the runs)",
            format!("{idle:.1} MiB"),
            "<= 20 MiB",
            idle <= 20.0,
        );
    }

    fn scale(&mut self, s: &Scale, threads: usize) {
        let n = s.attachments + 1;
        let Some(first) = s.rounds.first() else {
            return;
        };
        self.line(format!(
            "dipamd RSS with {n} attachments: {:.1} MiB (fresh {:.1}, after GC {:.1}); created \
             at {:.0}/s ({threads} threads, IPAM mode, no netns)",
            mib(first.loaded_kib),
            mib(s.idle_kib),
            mib(first.after_gc_kib),
            ratio(n as f64 * 1e3, first.create_wall_ms),
        ));
        self.line(format!(
            "GC freeing {} stale attachments: {:.2} s ({:.2} ms each); {} logged freed, \
             {} left in the ledger, {} in host-local",
            s.attachments,
            first.gc_ms / 1e3,
            first.gc_ms / s.attachments as f64,
            first.freed_logged,
            first.left_in_ledger,
            first.left_in_store
        ));
        if s.rounds.len() > 1 {
            let after: Vec<String> = s
                .rounds
                .iter()
                .map(|r| format!("{:.1}", mib(r.after_gc_kib)))
                .collect();
            self.line(format!(
                "dipamd RSS after each of {} rounds (MiB): {}; peak {:.1} MiB",
                s.rounds.len(),
                after.join(", "),
                mib(s.hwm_kib)
            ));
        }
        self.line(format!(
            "dipamd RSS idle ({} s after the last GC): {:.1} MiB",
            IDLE_WAIT.as_secs(),
            mib(s.settled_kib)
        ));
        if !s.rounds.is_empty() {
            // The GC is over and nothing else runs: what a daemon with that much history
            // costs.
            let idle = mib(s.settled_kib);
            self.target(
                format!(
                    "dipamd idle RSS after {} x {n} attachments came and went",
                    s.rounds.len()
                ),
                format!("{idle:.1} MiB"),
                "<= 20 MiB",
                idle <= 20.0,
            );
        }
        let rounds: Vec<Value> = s
            .rounds
            .iter()
            .map(|r| {
                json!({
                    "loaded_kib": r.loaded_kib, "after_gc_kib": r.after_gc_kib,
                    "create_wall_ms": r3(r.create_wall_ms),
                    "gc": {"stale": s.attachments, "ms": r3(r.gc_ms),
                           "ms_per_attachment": r3(r.gc_ms / s.attachments as f64),
                           "freed_logged": r.freed_logged, "left_in_ledger": r.left_in_ledger,
                           "left_in_host_local": r.left_in_store},
                })
            })
            .collect();
        self.json.insert(
            "scale".into(),
            json!({"attachments": n, "fresh_kib": s.idle_kib, "peak_kib": s.hwm_kib,
                   "idle_after_rounds_kib": s.settled_kib, "rounds": rounds}),
        );
    }

    fn gc(&mut self, g: &GcBench) {
        if g.rounds.is_empty() {
            return;
        }
        let med = |f: fn(&GcRound) -> f64| median(&g.rounds.iter().map(f).collect::<Vec<_>>());
        let floor_serial = med(|r| r.floor_serial_ms);
        let floor_parallel = med(|r| r.floor_parallel_ms);
        let gc = med(|r| r.gc_ms);
        let gc_adds = med(|r| r.gc_with_adds_ms);
        let alone: Vec<f64> = g.rounds.iter().flat_map(|r| r.adds_alone.clone()).collect();
        let during: Vec<f64> = g
            .rounds
            .iter()
            .flat_map(|r| r.adds_during.clone())
            .collect();
        let (alone_s, during_s) = (summarize(&alone), summarize(&during));
        let waited = |x: f64| (x - alone_s.p50).max(0.0);
        self.line(format!(
            "\nGC of {} stale attachments of {} in one network (host-local, IPAM mode), {} \
             rounds (medians; s)",
            g.stale,
            g.stale + 1,
            g.rounds.len()
        ));
        self.line(format!(
            "exec floor: host-local DEL x {} exec'd directly   {:.2} serial   {:.2} at {} at a time",
            g.stale,
            floor_serial / 1e3,
            floor_parallel / 1e3,
            g.parallel
        ));
        self.line(format!(
            "dipamd GC (--gc-parallel {})                     {:.2}   ratio to the floor: {:.2} \
             (parallel), {:.2} (serial)",
            g.parallel,
            gc / 1e3,
            ratio(gc, floor_parallel),
            ratio(gc, floor_serial)
        ));
        let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let floor_cpu = med(|r| r.floor_serial_cpu_s);
        let floor_cpu_par = med(|r| r.floor_parallel_cpu_s);
        let gc_dipamd = med(|r| r.gc_cpu.dipamd_s);
        let gc_delegates = med(|r| r.gc_cpu.delegates_s);
        let gc_plugin = med(|r| r.gc_cpu.plugin_s);
        self.line(format!(
            "CPU time (s): the floor's DELs {floor_cpu:.2} serial, {floor_cpu_par:.2} at {}; \
             the GC's: dipamd {gc_dipamd:.2}, its delegates {gc_delegates:.2}, the plugin \
             {gc_plugin:.2}\n  => no way of running these DELs takes less than {:.2} s on \
             {cpus} CPUs at this load (their CPU time / CPUs)",
            g.parallel,
            floor_cpu.min(floor_cpu_par) / cpus,
        ));
        self.line(format!(
            "dipamd GC with a pod ADD every {} ms           {:.2}",
            g.add_interval_ms,
            gc_adds / 1e3
        ));
        self.line(format!(
            "pod ADD (ms)          p50/p99/max           n\n  no GC running        {:>6.1} {:>6.1} {:>6.1}  {:>5}\n  during the GC        {:>6.1} {:>6.1} {:>6.1}  {:>5}\n  waited for the GC    {:>6.1} {:>6.1} {:>6.1}        (during minus the no-GC p50)",
            alone_s.p50, alone_s.p99, alone_s.max, alone_s.n,
            during_s.p50, during_s.p99, during_s.max, during_s.n,
            waited(during_s.p50), waited(during_s.p99), waited(during_s.max),
        ));
        self.target(
            format!("GC of {} stale attachments (issue 19)", g.stale),
            format!(
                "{:.2} s ({:.2}x the floor)",
                gc / 1e3,
                ratio(gc, floor_parallel)
            ),
            "<= 2.5 s",
            gc <= 2500.0,
        );
        self.target(
            "pod ADD's wait for a GC, max (issue 19)",
            format!(
                "{:.1} ms (p99 {:.1})",
                waited(during_s.max),
                waited(during_s.p99)
            ),
            "<= 100 ms",
            waited(during_s.max) <= 100.0,
        );
        let rounds: Vec<Value> = g
            .rounds
            .iter()
            .map(|r| {
                json!({
                    "load_1m": r.load,
                    "floor_serial_ms": r3(r.floor_serial_ms),
                    "floor_parallel_ms": r3(r.floor_parallel_ms),
                    "floor_serial_cpu_s": r3(r.floor_serial_cpu_s),
                    "floor_parallel_cpu_s": r3(r.floor_parallel_cpu_s),
                    "gc_ms": r3(r.gc_ms),
                    "gc_cpu_s": {"dipamd": r3(r.gc_cpu.dipamd_s),
                                 "delegates": r3(r.gc_cpu.delegates_s),
                                 "plugin": r3(r.gc_cpu.plugin_s)},
                    "gc_with_adds_ms": r3(r.gc_with_adds_ms),
                    "adds_alone": summarize(&r.adds_alone).json(),
                    "adds_during": summarize(&r.adds_during).json(),
                })
            })
            .collect();
        self.json.insert(
            "gc".into(),
            json!({
                "stale": g.stale, "parallel": g.parallel, "add_interval_ms": g.add_interval_ms,
                "floor_serial_ms": r3(floor_serial), "floor_parallel_ms": r3(floor_parallel),
                "gc_ms": r3(gc), "gc_with_adds_ms": r3(gc_adds),
                "ratio_to_floor_parallel": r3(ratio(gc, floor_parallel)),
                "ratio_to_floor_serial": r3(ratio(gc, floor_serial)),
                "floor_cpu_s": {"serial": r3(floor_cpu), "parallel": r3(floor_cpu_par)},
                "gc_cpu_s": {"dipamd": r3(gc_dipamd), "delegates": r3(gc_delegates),
                             "plugin": r3(gc_plugin)},
                "cpus": cpus,
                "floor_cpu_bound_ms": r3(floor_cpu.min(floor_cpu_par) / cpus * 1e3),
                "adds_alone": alone_s.json(), "adds_during": during_s.json(),
                "add_wait_ms": {"p50": r3(waited(during_s.p50)), "p99": r3(waited(during_s.p99)),
                                "max": r3(waited(during_s.max))},
                "rounds": rounds,
            }),
        );
    }

    fn finish(&mut self) {
        self.line("\nTargets (issues 7 and 19; medians of this run)");
        let lines: Vec<String> = self
            .targets
            .iter()
            .map(|t| {
                format!(
                    "  [{}] {:<54} {:<28} target {}",
                    if t.pass { "PASS" } else { "MISS" },
                    t.name,
                    t.value,
                    t.goal
                )
            })
            .collect();
        for l in lines {
            self.line(l);
        }
        let targets = self
            .targets
            .iter()
            .map(|t| json!({"name": t.name, "value": t.value, "target": t.goal, "pass": t.pass}))
            .collect();
        self.json.insert("targets".into(), Value::Array(targets));
    }
}

// After `progress!`, which it uses.
#[path = "dipam_bench/pool_bursts.rs"]
mod pool_bursts;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let opts = match parse_args(&args) {
        Ok(o) => o,
        // Asked-for help goes to stdout; a usage error to stderr.
        Err(e) if args.iter().any(|a| a == "-h" || a == "--help") => {
            println!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    install_signal_handlers();
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dipam-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Opts) -> Res<()> {
    preflight()?;
    let dir = prepare_bins(opts)?;
    progress!("binaries from {}", dir.display());
    let rt = Runtime::new(bins::cni_path());
    let reference = Path::new(bins::REFERENCE_PLUGINS);
    let mut rep = Report::default();
    rep.json.insert(
        "run".into(),
        json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "machine": machine(),
            "loadavg_start": loadavg(),
            "bin_dir": dir,
            "binary_bytes": {
                "dipam": file_size(&dir.join("dipam")),
                "dipamd": file_size(&dir.join("dipamd")),
                "ptp": file_size(&reference.join("ptp")),
                "host-local": file_size(&reference.join("host-local")),
            },
            "cni_version": CNI_VERSION,
            "options": {
                "pods": opts.pods, "concurrency": opts.concurrency,
                "concurrent_pods": opts.concurrent_pods, "rounds": opts.rounds,
                "cold_iters": opts.cold_iters, "attachments": opts.attachments,
                "scale_rounds": opts.scale_rounds, "gc_rounds": opts.gc_rounds,
                "gc_parallel": opts.gc_parallel, "gc_add_interval_ms": opts.gc_add_interval_ms,
                "warmup": opts.warmup, "quick": opts.quick, "sections": opts.sections,
            },
        }),
    );
    // Density and churn run first, on dipamds of their own: the other sections' dipamds and
    // networks are not even started when only these were asked for.
    if opts.runs("density") {
        let d = density::run(&rt, opts)?;
        if let Some(path) = &opts.density_log {
            std::fs::write(path, &d.log_text)
                .map_err(|e| format!("--density-log {}: {e}", path.display()))?;
        }
        rep.density(&d, opts.density_svg.as_deref())?;
    }
    if opts.runs("churn") {
        let c = density::churn(&rt, opts)?;
        rep.churn(&c);
    }
    if !opts
        .sections
        .iter()
        .any(|s| DEFAULT_SECTIONS.contains(&s.as_str()))
    {
        return publish(rep, opts);
    }
    let mut spans = Spans::new();

    // The dipamd that (b) and (c) share, as the harness starts it (debug level, which logs
    // every delegate exec's time), with JSON logs for the breakdown.
    let dipamd = Dipamd::start_with(&["--log-format", "json"]);
    std::thread::sleep(Duration::from_millis(500));
    let (fresh_kib, _) = rss_kib(dipamd.pid());
    let socket = dipamd.socket();
    let mut nets = vec![
        reference_net("a", "(a) ptp + host-local", "ref")?,
        dipam_net(
            "dipam-host-local-1.1.0.conflist",
            &socket,
            "b",
            "(b) dipam main + host-local",
            "main",
            1,
        )?,
        dipam_net(
            "ptp-dipam-host-local.conflist",
            &socket,
            "c",
            "(c) ptp + dipam + host-local",
            "ipam",
            1,
        )?,
    ];
    // (d): (b)'s conflist on a dipamd of its own with a warm pool that holds at least the
    // pods of one throughput round (all in flight at once), so that no ADD finds it empty.
    let pool_size = opts
        .concurrent_pods
        .div_ceil(opts.rounds)
        .max(opts.concurrency);
    let pool_arg = pool_size.to_string();
    let pool_args = [
        "--log-format",
        "json",
        "--warm-pool",
        &pool_arg,
        "--node-name",
        "bench",
    ];
    let pool_dipamd = Dipamd::start_with(&pool_args);
    // The pool's entries and a round's pods hold addresses at the same time.
    let pool_subnets = (2 * pool_size + 16).div_ceil(250);
    let mut pooled = dipam_net(
        "dipam-host-local-1.1.0.conflist",
        &pool_dipamd.socket(),
        "d",
        "(d) dipam main + warm pool",
        "pool",
        pool_subnets,
    )?;
    pooled.pool = Some((pool_dipamd.socket(), pool_size as u64));
    // One untimed pod shows dipamd the network (the pool fills for the config it brings).
    pod_cycle(&rt, &pooled, true, &mut Spans::new())?;
    nets.push(pooled);
    // (e): (c)'s conflist (ptp + dipam in IPAM mode) on a dipamd of its own with the same
    // pool: IPAM mode served from the pool (issue 39 §3). Its own dipamd, because the pool's
    // hits and misses are counted per dipamd.
    let ipool_dipamd = Dipamd::start_with(&pool_args);
    let mut ipool = dipam_net(
        "ptp-dipam-host-local.conflist",
        &ipool_dipamd.socket(),
        "e",
        "(e) ptp + dipam + warm pool",
        "ipool",
        pool_subnets,
    )?;
    ipool.pool = Some((ipool_dipamd.socket(), pool_size as u64));
    pod_cycle(&rt, &ipool, true, &mut Spans::new())?;
    nets.push(ipool);
    rep.json.insert(
        "warm_pool".into(),
        json!({"size": pool_size, "dipamd": "its own, with --warm-pool, one for (d), one for (e)",
               "subnets": pool_subnets}),
    );

    // --alt-dipamd: (b), (c) and (d) again as (b'), (c'), (d') on the other build's dipamd
    // (two of them, as above) and, with --alt-plugin, its plugin; they join the rotation.
    let mut alt_dipamds: Vec<Dipamd> = Vec::new();
    let mut _alt_plugin_dir: Option<TempDir> = None;
    if let Some(bin) = &opts.alt_dipamd {
        let bin = bin
            .canonicalize()
            .map_err(|e| format!("--alt-dipamd {}: {e}", bin.display()))?;
        let alt_rt = match opts.alt_plugin.as_deref() {
            Some(p) => {
                let (rt, dir) = alt_runtime(p)?;
                _alt_plugin_dir = Some(dir);
                Some(Arc::new(rt))
            }
            None => None,
        };
        let start = |extra: &[&str]| {
            let mut d = Dipamd::unstarted(extra);
            d.use_binary(&bin);
            d.start_again();
            d
        };
        let shared = start(&["--log-format", "json"]);
        let pool = start(&pool_args);
        let ipool = start(&pool_args);
        for (file, socket, key, label, prefix, subnets, of) in [
            (
                "dipam-host-local-1.1.0.conflist",
                shared.socket(),
                "b_alt",
                "(b') alt: dipam main + hl",
                "altmain",
                1,
                1,
            ),
            (
                "ptp-dipam-host-local.conflist",
                shared.socket(),
                "c_alt",
                "(c') alt: ptp + dipam + hl",
                "altipam",
                1,
                2,
            ),
            (
                "dipam-host-local-1.1.0.conflist",
                pool.socket(),
                "d_alt",
                "(d') alt: dipam main + pool",
                "altpool",
                pool_subnets,
                3,
            ),
            (
                "ptp-dipam-host-local.conflist",
                ipool.socket(),
                "e_alt",
                "(e') alt: ptp + dipam + pool",
                "altipool",
                pool_subnets,
                4,
            ),
        ] {
            let mut net = dipam_net(file, &socket, key, label, prefix, subnets)?;
            net.rt.clone_from(&alt_rt);
            net.alt_of = Some(of);
            if of >= 3 {
                net.pool = Some((socket.clone(), pool_size as u64));
                pod_cycle(&rt, &net, true, &mut Spans::new())?;
            }
            nets.push(net);
        }
        rep.json.insert(
            "alt".into(),
            json!({"dipamd": bin, "plugin": opts.alt_plugin,
                   "binary_bytes": {"dipamd": file_size(&bin),
                                    "dipam": opts.alt_plugin.as_deref().map(file_size)}}),
        );
        alt_dipamds.push(shared);
        alt_dipamds.push(pool);
        alt_dipamds.push(ipool);
    }

    // (a) and (c) again with today's reference plugins (ptp and host-local of the pinned
    // release tests/deps.sh builds, tests/peers/pins), in the same rotation: Debian 12's
    // 1.1.1 and the current release measured in one run, under the same machine noise.
    let current = peers::require("host-local");
    let current_rt = Arc::new(Runtime::new(format!(
        "{}:{}",
        dir.display(),
        current.dir().display()
    )));
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    // Prefixes that no other configuration's starts with: dipamd's log is split by prefix.
    for (file, key, label, prefix) in [
        (
            None,
            "a_cur",
            leak(format!("(a+) ptp + host-local {}", current.version)),
            "curref",
        ),
        (
            Some("ptp-dipam-host-local.conflist"),
            "c_cur",
            leak(format!("(c+) ptp + dipam + hl {}", current.version)),
            "curipam",
        ),
    ] {
        let mut net = match file {
            None => reference_net(key, label, prefix)?,
            Some(f) => dipam_net(f, &socket, key, label, prefix, 1)?,
        };
        net.rt = Some(current_rt.clone());
        nets.push(net);
    }
    rep.json.insert(
        "current_plugins".into(),
        json!({"module": current.module, "version": current.version, "dir": current.dir(),
               "binary_bytes": {"ptp": file_size(&current.dir().join("ptp")),
                                "host-local": file_size(&current.path)}}),
    );

    let lat = if opts.runs("latency") {
        Some(latency(&rt, &nets, opts, &mut spans)?)
    } else {
        None
    };
    let thr = if opts.runs("concurrency") {
        progress!(
            "concurrency: {} pods per configuration, {} threads, {} rounds",
            opts.concurrent_pods,
            opts.concurrency,
            opts.rounds
        );
        Some(concurrency(&rt, &nets, opts)?)
    } else {
        None
    };
    let cold_res = if opts.runs("cold") {
        let hl = reference_net("d", "host-local direct", "coldhl")?;
        let ipam = dipam_net(
            "ptp-dipam-host-local.conflist",
            &socket,
            "e",
            "dipam direct",
            "colddipam",
            1,
        )?;
        progress!("cold start: {} iterations", opts.cold_iters);
        Some(cold(&rt, &hl, &ipam, opts, &mut spans)?)
    } else {
        None
    };
    if opts.runs("pool-bursts") {
        pool_bursts::run(&rt, &socket, opts, &mut rep)?;
    }
    std::thread::sleep(IDLE_WAIT);
    let (after_kib, hwm_kib) = rss_kib(dipamd.pid());
    let mut log = parse_log(&dipamd.log());
    drop(dipamd);
    // (d)'s dipamd logs its own pods (prefixes pool-, cpool-): one map for the breakdown.
    log.extend(parse_log(&pool_dipamd.log()));
    drop(pool_dipamd);
    log.extend(parse_log(&ipool_dipamd.log()));
    drop(ipool_dipamd);
    for d in alt_dipamds {
        log.extend(parse_log(&d.log()));
    }

    if let Some(lat) = &lat {
        rep.latency(&nets, lat, opts.pods);
    }
    if let Some(thr) = &thr {
        rep.throughput(&nets, thr, opts);
    }
    rep.server_side(&log);
    if let Some(c) = &cold_res {
        rep.cold(c, opts.cold_iters, opts.alt_plugin.as_deref());
    }
    rep.breakdown(&spans, &log);
    rep.rss(fresh_kib, after_kib, hwm_kib);
    if opts.runs("scale") {
        let s = scale(&rt, opts)?;
        rep.scale(&s, opts.concurrency);
    }
    if opts.runs("gc") {
        progress!(
            "gc: {} rounds of {} stale attachments",
            opts.gc_rounds,
            opts.attachments
        );
        let g = gc_section(&rt, opts)?;
        rep.gc(&g);
    }
    publish(rep, opts)
}

/// The report's last lines, the report on stdout and the JSON file.
fn publish(mut rep: Report, opts: &Opts) -> Res<()> {
    let end = loadavg();
    rep.line(format!(
        "load average (1, 5, 15 min) at the end: {end:?} on {} CPUs",
        std::thread::available_parallelism().map_or(0, usize::from)
    ));
    rep.json.insert("loadavg_end".into(), json!(end));
    rep.finish();
    println!("{}", rep.text);
    if let Some(path) = &opts.json {
        let body =
            serde_json::to_vec_pretty(&Value::Object(rep.json)).map_err(|e| e.to_string())?;
        std::fs::write(path, body).map_err(|e| format!("write {}: {e}", path.display()))?;
        progress!("wrote {}", path.display());
    }
    Ok(())
}
