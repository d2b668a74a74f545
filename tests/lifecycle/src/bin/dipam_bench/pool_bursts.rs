//! Section `pool-bursts`: the watermark warm pool (docs/cfp.md §7.7) under bursts of 30, 110
//! and 250 pods, the sizes of docs/configuration.md's table. Per burst size and round, in a
//! rotating order: (a) ptp + host-local, (b) dipam main, (c) ptp + dipam, and dipam main and
//! ptp + dipam each on a dipamd with the pool at the table's watermarks ("watermarks") and
//! at a target as large as the burst ("burst-sized"). A burst is every pod's ADD, 8 (or
//! `--concurrency`) at a time, each in a fresh netns, timed from spawn to reap; then their
//! DELs (untimed). Before each burst the pool is at rest: its surplus released (cool-down 2 s
//! here) and its target ready. Reported per configuration: the share of ADDs served from the
//! pool, ADD p50/p99 and p50 against (a), and the addresses the pool held idle at rest.

use super::*;

/// The burst sizes, and docs/configuration.md's watermarks for a node of that many pods.
const BURSTS: [(usize, usize, usize); 3] = [(30, 4, 8), (110, 8, 32), (250, 16, 64)];
/// The pool's cool-down here: short, so that each burst starts from rest.
const RELEASE_AFTER: &str = "2";

/// One configuration's results for one burst size.
#[derive(Default)]
struct Cell {
    add: Vec<f64>,
    hits: u64,
    pods: usize,
    idle: Vec<u64>,
}

/// A dipamd with a pool, and its two networks (main mode, IPAM mode).
struct Pooled {
    dipamd: Dipamd,
    nets: [Net; 2],
    target: usize,
}

fn pooled(burst: usize, target: usize, max_above: usize, key: &'static str) -> Res<Pooled> {
    let (t, m) = (target.to_string(), max_above.to_string());
    let dipamd = Dipamd::start_with(&[
        "--log-format",
        "json",
        "--pool-target",
        &t,
        "--pool-max-above",
        &m,
        "--pool-release-after",
        RELEASE_AFTER,
        "--node-name",
        "benchburst",
    ]);
    let subnets = (burst + target + max_above + 16).div_ceil(250);
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let main = dipam_net(
        "dipam-host-local-1.1.0.conflist",
        &dipamd.socket(),
        leak(format!("pm{key}")),
        leak(format!("dipam main + pool ({key})")),
        leak(format!("bpm{key}")),
        subnets,
    )?;
    let ipam = dipam_net(
        "ptp-dipam-host-local.conflist",
        &dipamd.socket(),
        leak(format!("pc{key}")),
        leak(format!("ptp + dipam + pool ({key})")),
        leak(format!("bpc{key}")),
        subnets,
    )?;
    Ok(Pooled {
        dipamd,
        nets: [main, ipam],
        target,
    })
}

/// The pool of `net` on `socket` as `dipamctl status` shows it.
fn pool_of(socket: &Path, net: &Net) -> Res<Value> {
    let s = pool_status(socket)?;
    let network = net.network();
    Ok(s["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            p["network"] == network.as_str() && !p["source"].as_str().unwrap_or("").is_empty()
        })
        .cloned()
        .unwrap_or(Value::Null))
}

/// Waits until the pool of `net` is at rest: demand gone, surplus released, target ready.
/// Returns the entries it holds then.
fn at_rest(socket: &Path, net: &Net, target: usize) -> Res<u64> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        check_stop()?;
        let p = pool_of(socket, net)?;
        let (ready, want) = (p["ready"].as_u64(), p["target"].as_u64());
        if want == Some(target as u64) && ready == want {
            return Ok(target as u64);
        }
        if Instant::now() > deadline {
            return Err(format!("{}: the pool did not come to rest: {p}", net.label));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One burst of `n` pods on `net`: their ADDs timed, then their DELs.
fn burst(rt: &Runtime, net: &Net, n: usize, threads: usize) -> Res<Vec<f64>> {
    let namespaces: Vec<NetNs> = (0..n).map(|_| NetNs::new()).collect();
    let atts: Vec<Attachment> = namespaces
        .iter()
        .map(|ns| net.concurrent_attachment(&ns.path()))
        .collect();
    let (_, add) = fan_out(&atts, threads, |a| {
        rt.add(&net.list, a)
            .map(|_| ())
            .map_err(|e| format!("{} ADD: {e}", net.label))
    })?;
    fan_out(&atts, threads, |a| {
        rt.del(&net.list, a)
            .map_err(|e| format!("{} DEL: {e}", net.label))
    })?;
    drop(namespaces);
    Ok(add)
}

/// The section: every burst size, `rounds` rounds each; its report and JSON.
pub(super) fn run(rt: &Runtime, socket: &Path, opts: &Opts, rep: &mut Report) -> Res<()> {
    let rounds = opts.rounds.min(3);
    let mut json_out = Vec::new();
    rep.line(format!(
        "\nWarm pool bursts: each burst's pods ADDed {} at a time, fresh netns each, {rounds} \
         round(s) per size; pool cool-down {RELEASE_AFTER} s",
        opts.concurrency
    ));
    for (size, target, max_above) in BURSTS {
        check_stop()?;
        let refs = [
            reference_net("ba", "(a) ptp + host-local", "bref")?,
            dipam_net(
                "dipam-host-local-1.1.0.conflist",
                socket,
                "bb",
                "(b) dipam main",
                "bmain",
                1,
            )?,
            dipam_net(
                "ptp-dipam-host-local.conflist",
                socket,
                "bc",
                "(c) ptp + dipam",
                "bipam",
                1,
            )?,
        ];
        let pools = [
            pooled(size, target, max_above, "watermarks")?,
            pooled(size, size, 0, "burst-sized")?,
        ];
        // (net, its pool's socket and target when it has one)
        let mut all: Vec<(&Net, Option<(PathBuf, usize)>)> =
            refs.iter().map(|n| (n, None)).collect();
        for p in &pools {
            for n in &p.nets {
                all.push((n, Some((p.dipamd.socket(), p.target))));
            }
        }
        // A pool fills only for a network dipamd has seen (a pod's ADD or --conflist): one
        // untimed pod teaches each pooled network its template before the first burst.
        for p in &pools {
            for n in &p.nets {
                burst(rt, n, 1, 1)?;
            }
        }
        let mut cells: Vec<Cell> = all.iter().map(|_| Cell::default()).collect();
        for round in 0..rounds {
            for k in order(all.len(), round) {
                let (net, pool) = &all[k];
                let cell = &mut cells[k];
                let before = match pool {
                    Some((s, t)) => {
                        cell.idle.push(at_rest(s, net, *t)?);
                        pool_of(s, net)?["hits"].as_u64().unwrap_or_default()
                    }
                    None => 0,
                };
                cell.add.extend(burst(rt, net, size, opts.concurrency)?);
                cell.pods += size;
                if let Some((s, _)) = pool {
                    cell.hits += pool_of(s, net)?["hits"].as_u64().unwrap_or_default() - before;
                }
                progress!(
                    "pool bursts: {size} pods, round {}/{rounds}, {}",
                    round + 1,
                    net.label
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        json_out.push(report_size(rep, size, (target, max_above), &all, &cells));
    }
    rep.json
        .insert("pool_bursts".into(), Value::Array(json_out));
    Ok(())
}

/// One burst size's lines and targets.
fn report_size(
    rep: &mut Report,
    size: usize,
    (target, max_above): (usize, usize),
    all: &[(&Net, Option<(PathBuf, usize)>)],
    cells: &[Cell],
) -> Value {
    rep.line(format!(
        "\nBurst of {size} pods; watermarks: --pool-target {target} --pool-max-above \
         {max_above}; burst-sized: --pool-target {size}"
    ));
    rep.line(format!(
        "{:<36} {:>10} {:>9} {:>9} {:>10} {:>10}",
        "", "from pool", "ADD p50", "ADD p99", "p50 / (a)", "idle/rest"
    ));
    let base = summarize(&cells[0].add).p50;
    let mut rows = Vec::new();
    for ((net, pool), c) in all.iter().zip(cells) {
        let s = summarize(&c.add);
        let share = ratio(c.hits as f64, c.pods as f64);
        let idle = c.idle.iter().copied().max().unwrap_or(0);
        rep.line(format!(
            "{:<36} {:>10} {:>9.2} {:>9.2} {:>9.2}x {:>10}",
            net.label,
            if pool.is_some() {
                format!("{:.0}%", share * 100.0)
            } else {
                "-".into()
            },
            s.p50,
            s.p99,
            ratio(s.p50, base),
            idle
        ));
        rows.push(json!({"config": net.label, "add": s.json(), "pods": c.pods,
                         "from_pool": pool.as_ref().map(|_| c.hits), "share": pool.as_ref().map(|_| r3(share)),
                         "idle_at_rest": pool.as_ref().map(|_| idle),
                         "p50_vs_a": r3(ratio(s.p50, base))}));
        if pool.is_some() {
            let main = net.key.starts_with("pm");
            let (goal, limit) = if main {
                ("<= 0.40x", 0.40)
            } else {
                ("<= 0.80x", 0.80)
            };
            let r = ratio(s.p50, base);
            rep.target(
                format!("burst {size}: ADD p50, {} / (a)", net.label),
                format!("{r:.2}x ({:.2} vs {base:.2} ms)", s.p50),
                goal,
                r <= limit,
            );
        }
    }
    json!({"pods": size, "watermarks": {"target": target, "max_above": max_above,
           "release_after_s": RELEASE_AFTER}, "rows": rows})
}
