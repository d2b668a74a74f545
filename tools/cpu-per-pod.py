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
import json, os, subprocess, sys, tempfile, time

PODS, BIN = int(sys.argv[1]), sys.argv[2]
HZ = os.sysconf("SC_CLK_TCK")
W = tempfile.mkdtemp(prefix="cpu-per-pod-")


def host_local(name, subnet):
    return {"type": "host-local", "dataDir": f"{W}/hl-{name}", "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}]}


def conf(name, ipam):
    path = f"{W}/{name}.json"
    with open(path, "w") as f:
        json.dump({"cniVersion": "1.0.0", "name": name, "type": "ptp", "ipMasq": False,
                   "mtu": 1500, "ipam": ipam}, f)
    return path


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


def cni(cmd, cid, confp, cni_path):
    env = dict(os.environ, CNI_COMMAND=cmd, CNI_CONTAINERID=cid, CNI_NETNS=f"/var/run/netns/{cid}",
               CNI_IFNAME="eth0", CNI_PATH=cni_path)
    with open(confp) as stdin:
        p = subprocess.run(["/usr/lib/cni/ptp"], stdin=stdin, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=env)
    if p.returncode:
        sys.exit(f"{cmd} {cid} failed: {p.stderr[:300]!r}")


def main():
    bindir = f"{W}/bin"
    os.makedirs(bindir)
    for name, src in [("dipam", f"{BIN}/dipam"), ("host-local", "/usr/lib/cni/host-local"),
                      ("ptp", "/usr/lib/cni/ptp")]:
        os.symlink(src, f"{bindir}/{name}")
    sock = f"{W}/dipamd.sock"
    log = open(f"{W}/dipamd.log", "w")
    daemon = subprocess.Popen([f"{BIN}/dipamd", "--socket", sock, "--state-dir", f"{W}/state",
                               "--cni-path", bindir, "--node-name", "cpu-per-pod"],
                              stdout=log, stderr=log)
    cfgs = {
        "ptp + host-local": (conf("cpuref", host_local("cpuref", "10.248.0.0/20")), "/usr/lib/cni", None),
        "ptp + dipam": (conf("cpuipam", {"type": "dipam", "socketPath": sock,
                                         "delegate": host_local("cpuipam", "10.249.0.0/20")}),
                        bindir, daemon.pid),
    }
    try:
        while not os.path.exists(sock):
            time.sleep(0.05)
        # Per configuration: the runtime's execs (ptp and what it reaped), dipamd itself, the
        # delegates dipamd reaped; and the pods.
        spent = {k: [0.0, 0.0, 0.0, 0] for k in cfgs}
        for turn in range(3):
            order = list(cfgs)[turn % 2:] + list(cfgs)[:turn % 2]
            for name in order:
                confp, cni_path, pid = cfgs[name]
                ids = [f"cpp{turn}x{name[-5:].strip().replace(' ', '')}{i}" for i in range(PODS)]
                for cid in ids:
                    subprocess.run(["ip", "netns", "add", cid], check=True)
                before = (children_cpu(), *dipamd_cpu(pid))
                # ip netns add is timed outside: only the CNI calls are between the reads.
                for cid in ids:
                    cni("ADD", cid, confp, cni_path)
                    cni("DEL", cid, confp, cni_path)
                after = (children_cpu(), *dipamd_cpu(pid))
                for cid in ids:
                    subprocess.run(["ip", "netns", "delete", cid], check=True)
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
