"""What the measuring tools in tools/ share: the network configurations they write, the
plugin directory they build for dipamd, and a CNI call made the way a runtime makes it (one
exec, the config on stdin, the CNI_* variables set). Imported by cpu-per-pod.py and
ipam-burst-ab.py, which run as root from any directory."""
import json, os, subprocess, time

DEBIAN_CNI = "/usr/lib/cni"


def host_local(work, name, subnet):
    """host-local over `subnet`, its store in `work`, a network of its own."""
    return {"type": "host-local", "dataDir": f"{work}/hl-{name}", "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}]}


def write_conf(work, name, conf):
    """Writes a network configuration; returns its path (the runtime's stdin)."""
    path = f"{work}/{name}.json"
    with open(path, "w") as f:
        json.dump(conf, f)
    return path


def ptp_conf(work, name, ipam):
    """ptp with `ipam`: the reference, or IPAM mode when `ipam` is dipam."""
    return write_conf(work, name, {"cniVersion": "1.0.0", "name": name, "type": "ptp",
                                   "ipMasq": False, "mtu": 1500, "ipam": ipam})


def plugin_dir(path, build):
    """CNI_PATH for a build: its dipam plugin beside Debian's host-local and ptp."""
    os.makedirs(path, exist_ok=True)
    for name, src in [("dipam", f"{build}/dipam"), ("host-local", f"{DEBIAN_CNI}/host-local"),
                      ("ptp", f"{DEBIAN_CNI}/ptp")]:
        if os.path.lexists(f"{path}/{name}"):
            os.remove(f"{path}/{name}")
        os.symlink(src, f"{path}/{name}")
    return path


def start_dipamd(build, work, cni_path, node, extra=()):
    """A dipamd of `build` with its state and socket in `work`; returns (process, socket),
    once it serves."""
    os.makedirs(work, exist_ok=True)
    sock = f"{work}/dipamd.sock"
    log = open(f"{work}/dipamd.log", "w")
    proc = subprocess.Popen([f"{build}/dipamd", "--socket", sock, "--state-dir", f"{work}/state",
                             "--cni-path", cni_path, "--node-name", node, *extra],
                            stdout=log, stderr=log)
    deadline = time.time() + 30
    while not os.path.exists(sock):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"dipamd of {build} did not serve; see {work}/dipamd.log")
        time.sleep(0.05)
    return proc, sock


def cni(exe, cmd, cid, confp, cni_path, netns=None):
    """One CNI call, as a runtime makes it; returns its ms, spawn to reap, or None (and says
    why) when it failed."""
    env = dict(os.environ, CNI_COMMAND=cmd, CNI_CONTAINERID=cid,
               CNI_NETNS=f"/var/run/netns/{netns or cid}", CNI_IFNAME="eth0", CNI_PATH=cni_path)
    with open(confp) as stdin:
        t = time.perf_counter()
        p = subprocess.run([exe], stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env)
        took = (time.perf_counter() - t) * 1000
    if p.returncode:
        print(f"FAIL {cmd} {cid}: {p.stderr[:300]!r}", flush=True)
        return None
    return took


def netns(cmd, name):
    subprocess.run(["ip", "netns", cmd, name], check=True)
