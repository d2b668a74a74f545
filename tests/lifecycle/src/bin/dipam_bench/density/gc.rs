//! Step 5 of each point: GC of every stale attachment, by the runtime-aware GC and by a CNI
//! GC through the plugin, each against its floor (`host-local`'s DEL of the same reservations
//! exec'd directly, `--gc-parallel` at a time, on a copy of the directory).

use std::time::Instant;

use dipam_lifecycle::{Attachment, Runtime};
use serde_json::{Value, json};
use tempfile::TempDir;

use super::super::{DIPAMD_GC_PARALLEL, Opts, Res, fan_out, ms};
use super::{
    GC_TIMEOUT_S, Kind, Node, PLUGIN_DEFAULT_TIMEOUT_S, count_reservations, dipamctl, gc_split,
    time_output,
};

#[derive(Default)]
pub struct GcPoint {
    pub stale: usize,
    /// The CNI GC's floor: the mean of the floor just before it and just after it.
    pub floor_ms: f64,
    pub floor_before_ms: f64,
    pub floor_after_ms: f64,
    pub cni_gc_ms: f64,
    pub runtime_first_ms: f64,
    pub runtime_second_ms: f64,
    pub runtime_floor_ms: f64,
    /// dipamd's own runtime-aware passes that began during the CNI GC.
    pub runtime_passes_beside: u64,
    /// dipamd's RSS peak from the GC phase's start to the runtime-aware passes' end (KiB);
    /// the phase's peak from then on is the CNI GC's (its stale pods added again, its
    /// floors, the GC).
    pub peak_runtime_kib: u64,
}

/// A copy of host-local's directory, for a floor to run on.
fn floor_copy(node: &Node) -> Res<TempDir> {
    let copy = super::super::data_dir("density-floor")?;
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(node.dir())
        .arg(copy.path().join(node.network()))
        .status()
        .map_err(|e| format!("cp: {e}"))?;
    if !st.success() {
        return Err(format!("cp -a {} failed", node.dir().display()));
    }
    Ok(copy)
}

/// host-local's DEL of `stale`, exec'd directly on a copy of its directory, `parallel` at a
/// time: what any GC of them pays at this N.
fn gc_floor(rt: &Runtime, node: &Node, stale: &[Attachment], parallel: usize) -> Res<f64> {
    floor_on(rt, node, &floor_copy(node)?, stale, parallel)
}

/// [`gc_floor`] on a copy made earlier.
fn floor_on(
    rt: &Runtime,
    node: &Node,
    copy: &TempDir,
    stale: &[Attachment],
    parallel: usize,
) -> Res<f64> {
    let conf = node.delegate_conf(Some(copy.path()));
    let (wall, _) = fan_out(stale, parallel, |a| {
        let out = rt.exec("host-local", "DEL", a, &conf);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "host-local DEL: {}",
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    })?;
    let left = count_reservations(&copy.path().join(node.network()));
    if left != node.live.len() {
        return Err(format!(
            "the floor's DELs left {left} reservations, expected {}",
            node.live.len()
        ));
    }
    Ok(wall)
}

/// The runtime-aware GC's two passes, then (after the stale ones are added again) a CNI GC,
/// each with its floor.
pub fn gc(rt: &Runtime, node: &mut Node, n: usize, opts: &Opts) -> Res<GcPoint> {
    let parallel = opts.gc_parallel.unwrap_or(DIPAMD_GC_PARALLEL);
    let mut g = GcPoint {
        stale: node.stale.len(),
        ..GcPoint::default()
    };
    // The live pods themselves, not only as many: a live pod freed and a stale one kept
    // would leave the counts right.
    let expect_live = |node: &Node, what: &str| {
        let held = node.reservations();
        let pairs = node.d.ledger_pairs(&node.network());
        let recorded: std::collections::HashSet<&str> =
            pairs.iter().map(|(id, _)| id.as_str()).collect();
        let lost = node
            .live
            .iter()
            .filter(|a| !recorded.contains(a.container_id.as_str()))
            .count();
        if held != node.live.len() || pairs.len() != node.live.len() || lost > 0 {
            return Err(format!(
                "N={n}: after the {what}, host-local holds {held} and the ledger {} ({lost} \
                 live pods missing); expected the {} live",
                pairs.len(),
                node.live.len()
            ));
        }
        Ok(())
    };
    // The runtime-aware GC: the runtime loses the stale pods (the stand-in lists them no
    // more) just after one of dipamd's own passes, then the first timed pass marks what the
    // runtime does not list and the second frees it (gc/runtime/mod.rs, "Two passes").
    g.runtime_floor_ms = gc_floor(rt, node, &node.stale, parallel)?;
    node.after_a_background_pass()?;
    node.unlisted(&node.stale);
    let mut freed = 0;
    for took in [&mut g.runtime_first_ms, &mut g.runtime_second_ms] {
        let (ms, out) = time_output(&mut dipamctl(
            &node.d.socket(),
            &["gc", "--from-runtime", "--json"],
        ))?;
        *took = ms;
        let v: Value = serde_json::from_slice(&out).map_err(|e| format!("gc --json: {e}"))?;
        freed += v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["outcome"] == "freed")
            .count();
    }
    if freed != g.stale {
        return Err(format!(
            "N={n}: the two timed runtime-aware passes freed {freed} of {} stale; a pass of \
             dipamd's own freed the rest, and the times would not be the GC's",
            g.stale
        ));
    }
    expect_live(node, "runtime-aware GC")?;
    // Each GC's transient apart (performance.md run 41): the phase's VmHWM is reset here.
    g.peak_runtime_kib = super::super::rss_kib(node.d.pid()).1;
    super::super::reset_peak(node.d.pid());

    // The stale ones again, then a CNI GC naming every live pod (libcni 1.2.3 and later send
    // the list under both keys).
    let again: Vec<Attachment> = (0..g.stale)
        .map(|i| node.att(Kind::Stale, n + 1, i))
        .collect();
    // The fill lists them, and they stay listed through the CNI GC: only the CNI GC's valid
    // list, which names the live ones alone, frees them, never a runtime-aware pass.
    node.fill(rt, &again)?;
    node.stale = again;
    // The floor on both sides of the GC, each on its own copy made before it: on a shared
    // machine the same DELs a minute apart differed by 16% at 10,000 (run 34), so one floor
    // measured before the GC compares the GC with the machine's drift as much as with the
    // delegate.
    let after = floor_copy(node)?;
    g.floor_before_ms = gc_floor(rt, node, &node.stale, parallel)?;
    let mut l = node.list().clone();
    l["cniVersion"] = json!("1.1.0");
    let valid: Vec<Value> = node
        .live
        .iter()
        .map(|a| json!({"containerID": a.container_id, "ifname": a.ifname}))
        .collect();
    l["plugins"][0]["cni.dev/valid-attachments"] = Value::Array(valid.clone());
    l["plugins"][0]["cni.dev/attachments"] = Value::Array(valid);
    // The GC's own bound (module doc, "GC's deadline"): at 10,000 on a loaded machine the
    // delegate's floor alone passed the plugin's default 55 s.
    l["plugins"][0]["ipam"]["timeoutSeconds"] = json!(GC_TIMEOUT_S);
    dipam_lifecycle::runtime::settle_before_gc();
    let lists = node.cri.lists();
    let t = Instant::now();
    rt.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
        .map_err(|e| format!("N={n}: CNI GC: {e}"))?;
    g.cni_gc_ms = ms(t.elapsed());
    // dipamd's own runtime-aware passes (every 10 s, each reading every record) that ran
    // beside the CNI GC: CPU it shared with them.
    g.runtime_passes_beside = node.cri.lists() - lists;
    g.floor_after_ms = floor_on(rt, node, &after, &node.stale, parallel)?;
    g.floor_ms = (g.floor_before_ms + g.floor_after_ms) / 2.0;
    if g.cni_gc_ms > PLUGIN_DEFAULT_TIMEOUT_S as f64 * 1e3 {
        super::super::progress!(
            "density N={n}: the CNI GC took {:.1} s, past the plugin's default timeoutSeconds \
             ({PLUGIN_DEFAULT_TIMEOUT_S} s); its floor took {:.1} s",
            g.cni_gc_ms / 1e3,
            g.floor_ms / 1e3
        );
    }
    expect_live(node, "CNI GC")?;
    node.unlisted(&node.stale);
    node.stale.clear();
    say_gc(node, n, &g);
    Ok(g)
}

/// The GC's figures, said as soon as they are known as well as in the report: a later point
/// may not end (run 29's 10,000 did not).
fn say_gc(node: &Node, n: usize, g: &GcPoint) {
    let log = node.d.log();
    let start = log.rfind("===== dipamd start").unwrap_or(0);
    let lines: Vec<Value> = log[start..]
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["span"]["command"] == "GC")
        .collect();
    let s = gc_split::split(&lines);
    super::super::progress!(
        "density N={n}: GC of {} stale: CNI GC {:.0} ms (dipamd's handler {:.0}: {:.0} before \
         the first DEL, DELs {:.0} (their sum {:.0}), {:.0} after; {} runtime-aware passes \
         beside), runtime-aware {:.0} + {:.0} ms; floor {:.0} (before {:.0}, after {:.0}) / \
         {:.0} ms",
        g.stale,
        g.cni_gc_ms,
        s.handler_ms,
        s.before_ms,
        s.dels_ms,
        s.del_sum_ms,
        s.after_ms,
        g.runtime_passes_beside,
        g.runtime_first_ms,
        g.runtime_second_ms,
        g.floor_ms,
        g.floor_before_ms,
        g.floor_after_ms,
        g.runtime_floor_ms
    );
}
