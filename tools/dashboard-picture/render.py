#!/usr/bin/env python3
"""Renders docs/dashboard.png: the panels of deploy/grafana/dipam.json, drawn from real data.

This is not a Grafana screenshot (Grafana is not packaged in Debian). It runs the real parts
and draws what the dashboard's panels would show:

1. dipamd (from target/, built as README "Install" says or by the test suite) with the
   agent's router and health addresses, host-local as the delegate, and metrics on a
   loopback port, as the DaemonSet runs it;
2. Debian's Prometheus server (the `prometheus` package's binary, extracted with apt-get
   download + dpkg-deb, never installed), scraping dipamd every second;
3. a workload through the dipam plugin (IPAM mode): pods added and deleted at a varying pace,
   a refused CNI GC, a reservation made behind dipamd's back (an orphan), and dipamd killed
   and restarted while DELs are spooled;
4. every panel's own PromQL (from the dashboard JSON, `$job`/`$instance`/`$__rate_interval`
   substituted) evaluated by that Prometheus over the run (query_range), and plotted with
   matplotlib at the panels' grid positions.

Run as root from the repository root, in a venv with matplotlib:

    python3 -m venv /tmp/dash && /tmp/dash/bin/pip install matplotlib
    /tmp/dash/bin/python tools/dashboard-picture/render.py [--minutes 4] [--out docs/dashboard.png]
"""

import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(REPO, "deploy/grafana/dipam.json")
REFERENCE = "/usr/lib/cni"
RATE = "20s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binaries():
    for d in glob.glob(os.path.join(REPO, "target/*/release")) + glob.glob(
        os.path.join(REPO, "target/*/debug")
    ) + [os.path.join(REPO, "target/lifecycle/debug")]:
        if all(os.path.isfile(os.path.join(d, b)) for b in ("dipam", "dipamd", "dipamctl")):
            return d
    sys.exit("no dipam binaries under target/: cargo build first")


def prometheus_binary(work):
    deb_dir = os.path.join(work, "deb")
    os.makedirs(deb_dir)
    subprocess.run(
        ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", "prometheus"],
        cwd=deb_dir,
        check=True,
    )
    deb = glob.glob(os.path.join(deb_dir, "prometheus_*.deb"))[0]
    tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", work, "./usr/bin/prometheus"], stdin=tar.stdout, check=True)
    tar.wait()
    return os.path.join(work, "usr/bin/prometheus")


class Node:
    """dipamd on a temp state dir, socket and host-local store; the plugin in IPAM mode."""

    def __init__(self, work, bins, metrics):
        self.work, self.bins, self.metrics = work, bins, metrics
        self.state = os.path.join(work, "state")
        self.sock = os.path.join(work, "dipam.sock")
        self.store = os.path.join(work, "cni-store")
        self.conflist = {
            "cniVersion": "1.1.0",
            "name": "podnet",
            "plugins": [
                {
                    "type": "ptp",
                    "ipam": {
                        "type": "dipam",
                        "socketPath": self.sock,
                        "delegate": {
                            "type": "host-local",
                            "ranges": [[{"subnet": "10.99.0.0/24"}]],
                            "dataDir": self.store,
                        },
                    },
                }
            ],
        }
        self.conf_path = os.path.join(work, "10-podnet.conflist")
        with open(self.conf_path, "w") as f:
            json.dump(self.conflist, f)
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [
                os.path.join(self.bins, "dipamd"),
                "--socket", self.sock,
                "--state-dir", self.state,
                "--cni-path", f"{self.bins}:{REFERENCE}",
                "--conflist", self.conf_path,
                "--node-name", "node-1",
                "--agent-roles", "router,health",
                "--metrics-address", self.metrics,
                "--reconcile-interval", "5",
                "--gc-grace", "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.work, "dipamd.log"), "a"),
        )
        for _ in range(100):
            if os.path.exists(self.sock):
                return
            time.sleep(0.1)
        sys.exit("dipamd did not start: see " + os.path.join(self.work, "dipamd.log"))

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()

    def cni(self, command, container, ipam=None, extra=None):
        """Runs the IPAM plugin as ptp would: the plugin's config on stdin, its `ipam` type."""
        conf = dict(self.conflist["plugins"][0])
        conf.update({"cniVersion": self.conflist["cniVersion"], "name": self.conflist["name"]})
        if ipam is not None:
            conf["ipam"] = ipam
        conf.update(extra or {})
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": "/var/run/netns/none",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": f"{self.bins}:{REFERENCE}",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }
        kind = conf["ipam"]["type"]
        plugin = os.path.join(self.bins if kind == "dipam" else REFERENCE, kind)
        return subprocess.run(plugin, input=json.dumps(conf).encode(), env=env, capture_output=True)


def workload(node, minutes):
    """Pods come and go at a pace that changes; then the incidents."""
    pods, n = [], 0
    end = time.time() + minutes * 60
    phase_len = minutes * 60 / 6
    start = time.time()
    incidents = set()
    while time.time() < end:
        t = time.time() - start
        phase = int(t / phase_len)
        target = [6, 14, 22, 12, 18, 9][min(phase, 5)]
        if len(pods) < target or (pods and random.random() < 0.35):
            n += 1
            cid = f"pod-{n:04d}"
            if node.cni("ADD", cid).returncode == 0:
                pods.append(cid)
        if len(pods) > target or random.random() < 0.25:
            if pods:
                node.cni("DEL", pods.pop(random.randrange(len(pods))))
        if phase >= 2 and "gc" not in incidents:
            incidents.add("gc")
            r = node.cni("GC", "", extra={"cni.dev/valid-attachments": []})
            print("GC with an empty valid list:", r.stdout.decode().strip())
        if phase >= 3 and "orphan" not in incidents:
            incidents.add("orphan")
            r = node.cni("ADD", "reserved-behind-dipams-back",
                         ipam=node.conflist["plugins"][0]["ipam"]["delegate"],
                         extra={"cniVersion": "1.0.0"})  # Debian's host-local stops at 1.0.0
            print("host-local ADD behind dipamd's back:", r.returncode, r.stdout.decode().strip()[:200])
        if phase >= 4 and "crash" not in incidents:
            incidents.add("crash")
            node.kill()
            for _ in range(4):
                if pods:
                    r = node.cni("DEL", pods.pop())  # spooled: dipamd is down
                    print("DEL while dipamd is down:", r.returncode, r.stdout.decode().strip()[:200])
            time.sleep(12)
            node.start()
        time.sleep(random.uniform(0.15, 0.6))


def query_range(prom, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"http://{prom}/api/v1/query_range?{q}") as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, metric):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt) or str(metric)


def render(dash, data, out, start, end, note=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.patches
    import matplotlib.ticker
    import matplotlib.pyplot as plt
    from datetime import datetime

    bg, panel_bg, fg, grid = "#111217", "#181b1f", "#ccccdc", "#2c3235"
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    unit_h = 0.42
    fig = plt.figure(figsize=(16, rows * unit_h), facecolor=bg)
    fig.text(0.01, 1 - 0.25 / (rows * unit_h), f"{dash['title']}  ·  node-1  ·  "
             "a rendering of deploy/grafana/dipam.json's panels from a real dipamd run (not a Grafana screenshot)",
             color=fg, fontsize=11, va="top")
    if note:
        fig.text(0.99, 1 - 0.25 / (rows * unit_h), note, color="#8e8e8e", fontsize=8, va="top", ha="right")
    top_margin = 0.6 / (rows * unit_h)

    def rect(gp, pad=0.004):
        x = gp["x"] / 24
        w = gp["w"] / 24
        y = 1 - top_margin - (gp["y"] + gp["h"]) / rows * (1 - top_margin)
        h = gp["h"] / rows * (1 - top_margin)
        return [x + pad, y + pad * 2, w - 2 * pad, h - 4 * pad]

    palette = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]
    for p in dash["panels"]:
        gp = p["gridPos"]
        if p["type"] == "row":
            r = rect(gp, pad=0.0)
            fig.text(r[0] + 0.004, r[1] + r[3] / 2, p["title"], color=fg, fontsize=11, weight="bold", va="center")
            continue
        # The panel (background and title), then the plot inside it, leaving room for the
        # title above and the tick labels left and below, as Grafana does.
        px, py, pw, ph = rect(gp)
        fig.patches.append(matplotlib.patches.Rectangle(
            (px, py), pw, ph, transform=fig.transFigure, facecolor=panel_bg, edgecolor=grid,
            linewidth=0.6, zorder=-1))
        inch_x, inch_y = 1 / fig.get_figwidth(), 1 / fig.get_figheight()
        fig.text(px + 0.08 * inch_x, py + ph - 0.08 * inch_y, p["title"], color=fg, fontsize=9,
                 va="top", ha="left")
        if p["type"] == "stat":
            ax = fig.add_axes([px + 0.08 * inch_x, py + 0.08 * inch_y,
                               pw - 0.16 * inch_x, ph - 0.4 * inch_y])
        else:
            ax = fig.add_axes([px + 0.55 * inch_x, py + 0.3 * inch_y,
                               pw - 0.65 * inch_x, ph - 0.62 * inch_y])
        ax.set_zorder(1)
        ax.set_facecolor(panel_bg)
        for sp in ax.spines.values():
            sp.set_visible(False)
        series = data[p["id"]]
        if p["type"] == "stat":
            ax.set_xticks([])
            ax.set_yticks([])
            value = None
            for _, values in series:
                if values:
                    value = values[-1][1]
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            color = steps[0]["color"]
            for st in steps:
                if st["value"] is not None and value is not None and value >= st["value"]:
                    color = st["color"]
            text = "–" if value is None else f"{value:g}"
            for m in p["fieldConfig"]["defaults"].get("mappings", []):
                if value is not None and f"{value:g}" in m["options"]:
                    text = m["options"][f"{value:g}"]["text"]
            cmap = {"green": "#37872d", "red": "#c4162a", "orange": "#fa6400"}
            ax.set_facecolor(cmap.get(color, color))
            ax.text(0.5, 0.45, text, color="white", fontsize=22, ha="center", va="center", transform=ax.transAxes)
            continue
        unit = p["fieldConfig"]["defaults"].get("unit", "short")
        scale, suffix = (1000.0, " ms") if unit == "s" else (1.0, "")
        stacked = p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
        base = None
        for i, (label, values) in enumerate(series):
            if not values:
                continue
            xs = [datetime.fromtimestamp(t) for t, _ in values]
            ys = [v * scale for _, v in values]
            c = palette[i % len(palette)]
            if stacked:
                import numpy as np

                ys = np.array(ys)
                lo = base if base is not None and len(base) == len(ys) else np.zeros(len(ys))
                ax.fill_between(xs, lo, lo + ys, color=c, alpha=0.35, linewidth=0)
                ax.plot(xs, lo + ys, color=c, linewidth=1, label=label)
                base = lo + ys
            else:
                ax.plot(xs, ys, color=c, linewidth=1.1, label=label)
                ax.fill_between(xs, ys, color=c, alpha=0.08, linewidth=0)
        ax.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(end))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M" if end - start > 900 else "%H:%M:%S"))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(6))
        ax.tick_params(colors=fg, labelsize=7)
        ax.grid(color=grid, linewidth=0.5)
        if suffix:
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}{suffix}"))
        elif unit == "reqps":
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}/s"))
        if any(v for _, v in series):
            leg = ax.legend(loc="upper left", fontsize=6.5, ncol=3, frameon=False, labelcolor=fg)
            leg.set_zorder(5)
    fig.savefig(out, dpi=80, facecolor=bg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=4)
    ap.add_argument("--out", default=os.path.join(REPO, "docs/dashboard.png"))
    ap.add_argument("--save-data", help="also write the queried series to this JSON file")
    ap.add_argument("--from-data", help="only redraw, from a file --save-data wrote")
    args = ap.parse_args()
    with open(DASHBOARD) as f:
        dash = json.load(f)
    if args.from_data:
        with open(args.from_data) as f:
            saved = json.load(f)
        data = {int(k): v for k, v in saved["data"].items()}
        render(dash, data, args.out, saved["start"], saved["end"], saved.get("note", ""))
        print("wrote", args.out)
        return
    if os.geteuid() != 0:
        sys.exit("run as root (dipamd runs host-local on its store)")
    random.seed(21)
    bins = binaries()
    work = tempfile.mkdtemp(prefix="dipam-dashboard-")
    prom_proc = node = None
    try:
        prom_bin = prometheus_binary(work)
        metrics = f"127.0.0.1:{free_port()}"
        node = Node(work, bins, metrics)
        node.start()
        prom = f"127.0.0.1:{free_port()}"
        cfg = os.path.join(work, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"scrape_configs:\n  - job_name: dipam\n    static_configs:\n      - targets: ['{metrics}']\n"
            )
        prom_proc = subprocess.Popen(
            [prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address={prom}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"),
        )
        time.sleep(3)
        note = ("" if "/release" in bins else
                "debug build on a busy VM: latencies are not representative (docs/performance.md)")
        start = time.time()
        workload(node, args.minutes)
        time.sleep(5)
        end = time.time()

        data = {}
        for p in dash["panels"]:
            if p["type"] == "row":
                continue
            series = []
            for t in p["targets"]:
                expr = (t["expr"].replace("$job", "dipam").replace("$instance", ".*")
                        .replace("$__rate_interval", RATE))
                for r in query_range(prom, expr, start, end, 2):
                    series.append((legend(t.get("legendFormat", ""), r["metric"]),
                                   [(float(ts), float(v)) for ts, v in r["values"] if v != "NaN"]))
            data[p["id"]] = series
        if args.save_data:
            with open(args.save_data, "w") as f:
                json.dump({"start": start, "end": end, "data": data, "note": note}, f)
        render(dash, data, args.out, start, end, note)
        print("wrote", args.out)
    finally:
        if prom_proc:
            prom_proc.terminate()
            prom_proc.wait()
        if node:
            node.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
