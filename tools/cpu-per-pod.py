#!/usr/bin/env python3
"""CPU time per pod of ptp + host-local against ptp + dipam (IPAM mode), as root.

    cpu-per-pod.py PODS BIN_DIR

BIN_DIR holds a build's dipam (the plugin) and dipamd. For each configuration in turn (three
turns, the order rotating), PODS pods are added and deleted one at a time, each in a fresh
netns, the way a runtime calls ptp; the CPU time (user + system) of everything the calls ran
is summed:
- the reference: ptp and the host-local it execs (this process's reaped children);
- IPAM mode: ptp and the dipam plugin it execs (reaped children), plus dipamd's own CPU and
  the host-local execs dipamd reaped (/proc/<dipamd>/stat: utime, stime, cutime, cstime).

Why: on a node whose CPUs are saturated (8 ADDs at a time on 2 CPUs), pods per second is
bounded by CPU per pod, so CPU(reference) / CPU(IPAM mode) is the most IPAM mode's 8-way
throughput can reach against the reference, whatever its latency (docs/performance.md,
issue 39 §3). Prints CPU ms per pod (ADD + DEL) per configuration and that bound.
"""
import os, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cni_calls import DEBIAN_CNI, cni, host_local, netns, plugin_dir, ptp_conf, start_dipamd

PODS, BIN = int(sys.argv[1]), sys.argv[2]
HZ = os.sysconf("SC_CLK_TCK")
W = tempfile.mkdtemp(prefix="cpu-per-pod-")


def dipamd_cpu(pid):
    """dipamd's own CPU and its reaped children's (the delegate execs), in seconds."""
    if pid is None:
        return (0.0, 0.0)
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    # After the name: state is field 3; utime, stime, cutime, cstime are fields 14-17.
    own, reaped = fields[11:13], fields[13:15]
    return (sum(int(x) for x in own) / HZ, sum(int(x) for x in reaped) / HZ)


def children_cpu():
    t = os.times()
    return t.children_user + t.children_system


def call(cmd, cid, confp, cni_path):
    """One CNI call through ptp, as a runtime makes it; a failure ends the run."""
    if cni(f"{DEBIAN_CNI}/ptp", cmd, cid, confp, cni_path) is None:
        sys.exit(f"{cmd} {cid} failed")


def main():
    bindir = plugin_dir(f"{W}/bin", BIN)
    daemon, sock = start_dipamd(BIN, f"{W}/d", bindir, "cpu-per-pod")
    cfgs = {
        "ptp + host-local": (ptp_conf(W, "cpuref", host_local(W, "cpuref", "10.248.0.0/20")),
                             DEBIAN_CNI, None),
        "ptp + dipam": (ptp_conf(W, "cpuipam", {"type": "dipam", "socketPath": sock,
                                                "delegate": host_local(W, "cpuipam", "10.249.0.0/20")}),
                        bindir, daemon.pid),
    }
    try:
        # Per configuration: the runtime's execs (ptp and what it reaped), dipamd itself, the
        # delegates dipamd reaped; and the pods.
        spent = {k: [0.0, 0.0, 0.0, 0] for k in cfgs}
        for turn in range(3):
            order = list(cfgs)[turn % 2:] + list(cfgs)[:turn % 2]
            for name in order:
                confp, cni_path, pid = cfgs[name]
                ids = [f"cpp{turn}x{name[-5:].strip().replace(' ', '')}{i}" for i in range(PODS)]
                for cid in ids:
                    netns("add", cid)
                before = (children_cpu(), *dipamd_cpu(pid))
                # ip netns add is timed outside: only the CNI calls are between the reads.
                for cid in ids:
                    call("ADD", cid, confp, cni_path)
                    call("DEL", cid, confp, cni_path)
                after = (children_cpu(), *dipamd_cpu(pid))
                for cid in ids:
                    netns("delete", cid)
                for i in range(3):
                    spent[name][i] += after[i] - before[i]
                spent[name][3] += len(ids)
                print(f"turn {turn} {name}: {1000 * (sum(after) - sum(before)) / len(ids):.2f} ms CPU "
                      f"a pod, load {open('/proc/loadavg').read().split()[0]}", flush=True)
        per = {}
        print("CPU ms per pod (ADD + DEL)        total  runtime's execs  dipamd  dipamd's delegates")
        for k, (execs, own, reaped, n) in spent.items():
            per[k] = 1000 * (execs + own + reaped) / n
            print(f"{k:30s} {per[k]:8.2f} {1000 * execs / n:16.2f} {1000 * own / n:7.2f} "
                  f"{1000 * reaped / n:19.2f}")
        bound = per["ptp + host-local"] / per["ptp + dipam"]
        print(f"CPU-bound 8-way pods/s, ptp + dipam / ptp + host-local, at most {bound:.2f}x")
    finally:
        daemon.terminate()
        daemon.wait()


main()
