#!/usr/bin/env python3
"""An interleaved A/B of two dipam builds on the warm pool, 8 ADDs at a time (root).

    ipam-burst-ab.py N ROUNDS OLD_DIR NEW_DIR

Each directory holds a build's dipam and dipamd. Per round, in a rotating order, a burst of N
pods is added 8 at a time (then deleted) on each of: ptp + host-local (the reference,
Debian's /usr/lib/cni), ptp + dipam and dipam main mode on OLD's dipamd, and the same two on
NEW's dipamd. Each dipamd runs `--warm-pool N` (a pool as large as the burst), and every burst
waits for its pool to be full. Rotating the order within one run spreads a shared machine's
load over both builds alike (docs/performance.md, run 27). Prints every configuration's ADD
p50/p90/p99 (spawn to reap) and its p50 against the reference.
"""
import glob, os, statistics, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cni_calls import DEBIAN_CNI, cni, host_local, netns, plugin_dir, ptp_conf, start_dipamd, write_conf

N, ROUNDS, OLD, NEW = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
AT_ONCE = 8
W = tempfile.mkdtemp(prefix="ipam-burst-ab-")
PTP = f"{DEBIAN_CNI}/ptp"


def configurations():
    """(tag, config path, CNI_PATH, network name, the runtime's exec) per configuration, and
    the dipamds started for them."""
    cfgs = [("ref", ptp_conf(W, "abref", host_local(W, "abref", "10.240.0.0/20")), DEBIAN_CNI,
             "abref", PTP)]
    daemons = {}
    for i, (tag, build) in enumerate([("old", OLD), ("new", NEW)]):
        bindir = plugin_dir(f"{W}/bin-{tag}", build)
        daemons[tag], sock = start_dipamd(build, f"{W}/d-{tag}", bindir, "ab" + tag,
                                          ["--log-level", "debug", "--log-format", "json",
                                           "--dead-after", "0", "--warm-pool", str(N)])
        name = "ab" + tag
        ipam = {"type": "dipam", "socketPath": sock,
                "delegate": host_local(W, name, f"10.24{1 + i}.0.0/20")}
        cfgs.append((tag, ptp_conf(W, name, ipam), bindir, name, PTP))
        main = "abm" + tag
        conf = {"cniVersion": "1.0.0", "name": main, "type": "dipam", "socketPath": sock,
                "mtu": 1500, "ipam": host_local(W, main, f"10.24{3 + i}.0.0/20")}
        cfgs.append(("main-" + tag, write_conf(W, main, conf), bindir, main, f"{bindir}/dipam"))
    return cfgs, daemons


def pool_ready(tag, name, n):
    """Whether host-local's store holds `n` addresses for the network (its pool, full)."""
    if tag == "ref":
        return True
    return len(glob.glob(f"{W}/hl-{name}/{name}/1*")) >= n


def burst(r, cfg, loads):
    """One burst of N pods on `cfg`, AT_ONCE at a time, then their DELs; the ADDs' ms."""
    tag, confp, cni_path, name, exe = cfg
    started = time.time()
    while not pool_ready(tag, name, N) and time.time() - started < 120:
        time.sleep(0.5)
    ids = [f"ab{tag}{r}x{k}" for k in range(N)]
    for i in ids:
        netns("add", i)
    loads.append(open("/proc/loadavg").read().split()[0])
    with ThreadPoolExecutor(AT_ONCE) as ex:
        lat = list(ex.map(lambda i: cni(exe, "ADD", i, confp, cni_path), ids))
    with ThreadPoolExecutor(AT_ONCE) as ex:
        list(ex.map(lambda i: cni(exe, "DEL", i, confp, cni_path), ids))
    for i in ids:
        netns("delete", i)
    lat = [x for x in lat if x is not None]
    print(f"round {r} {tag}: p50 {statistics.median(lat):.1f} ms load {loads[-1]}", flush=True)
    return lat


def main():
    cfgs, daemons = configurations()
    try:
        # One untimed pod per network: a fresh dipamd's pool fills for the config it has seen.
        for tag, confp, cni_path, name, exe in cfgs:
            netns("add", "abw" + tag)
            cni(exe, "ADD", "abw" + tag, confp, cni_path)
            cni(exe, "DEL", "abw" + tag, confp, cni_path)
            netns("delete", "abw" + tag)
        res, loads = {c[0]: [] for c in cfgs}, []
        for r in range(ROUNDS):
            for cfg in cfgs[r % len(cfgs):] + cfgs[:r % len(cfgs)]:
                res[cfg[0]] += burst(r, cfg, loads)
        ref = statistics.median(res["ref"])
        print("ADD latency ms, spawn to reap, every ADD of every round")
        for k, v in res.items():
            v.sort()
            print(f"{k:4s} n {len(v):4d} p50 {statistics.median(v):7.1f} p90 {v[int(.9 * len(v))]:7.1f} "
                  f"p99 {v[int(.99 * len(v))]:7.1f}  p50/ref {statistics.median(v) / ref:.2f}")
        print("loads at burst starts", " ".join(loads))
    finally:
        for pr in daemons.values():
            pr.terminate()
            pr.wait()


main()
