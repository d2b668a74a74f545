#!/usr/bin/env python3
"""The density curve of one or more dipam-bench runs as an SVG (docs/density.svg).

    dipam-bench --sections density --json run.json ...
    python3 tests/lifecycle/scripts/density_svg.py docs/density.svg run.json [label=other.json ...]

Reads the `density` section of each JSON file and draws, against N on log-log axes, the ADD
latency p99 (and p50, thinner) of:
  - host-local exec'd directly on the same directory (the delegate's floor),
  - dipam's ADD, spawn to reap of the plugin,
  - dipam's own cost (the plugin's ADD less the delegate's exec inside dipamd),
  - an ADD with the warm pool at a dense node's watermarks, pods arriving in paced bursts
    that never wait for the pool (misses included: what the pods paid).
Several files are drawn side by side, one dash pattern each (e.g. two runs, or a run with a
larger --density-pool). Python's standard library only.
"""

import json
import math
import sys

W, H = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 250, 34, 52

SERIES = [
    # (label, colour, path in a point)
    ("host-local ADD, direct", "#7f7f7f", ("host_local", "add")),
    ("dipam ADD, spawn to reap", "#1f77b4", ("add", "total")),
    ("dipam's own ADD cost", "#2ca02c", ("add", "dipam_own")),
    ("pooled ADD (watermarks, paced)", "#d62728", ("pool", "add")),
]
DASHES = ["", "7,4", "2,3", "10,3,2,3"]


def find_points(v):
    """The density section's points, wherever the section sits in the file."""
    if isinstance(v, dict):
        pts = v.get("points")
        if isinstance(pts, list) and pts and isinstance(pts[0], dict) and "n" in pts[0] and "add" in pts[0]:
            return pts
        for x in v.values():
            found = find_points(x)
            if found:
                return found
    if isinstance(v, list):
        for x in v:
            found = find_points(x)
            if found:
                return found
    return None


def value(point, path, quantile):
    v = point
    for key in path:
        v = v.get(key, {}) if isinstance(v, dict) else {}
    ms = v.get(quantile) if isinstance(v, dict) else None
    return ms if isinstance(ms, (int, float)) and ms > 0 else None


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    out, runs = argv[1], []
    for arg in argv[2:]:
        label, _, path = arg.rpartition("=")
        with open(path) as f:
            points = find_points(json.load(f))
        if not points:
            sys.stderr.write(f"{path}: no density section (run dipam-bench --sections density --json FILE)\n")
            return 1
        runs.append((label or path, sorted(points, key=lambda p: p["n"])))
    lines = []  # (label, colour, dash, width, [(n, ms)])
    for r, (run_label, points) in enumerate(runs):
        dash = DASHES[r % len(DASHES)]
        for label, colour, path in SERIES:
            for q, width in (("p99_ms", 2.2), ("p50_ms", 1.0)):
                pts = [(p["n"], value(p, path, q)) for p in points]
                pts = [(n, y) for n, y in pts if y]
                if pts:
                    name = f"{label} ({q[:3]})" + (f", {run_label}" if len(runs) > 1 else "")
                    lines.append((name, colour, dash, width, pts))
    ns = [n for *_, pts in lines for n, _ in pts]
    ys = [y for *_, pts in lines for _, y in pts]
    if not ns:
        sys.stderr.write("no points to draw\n")
        return 1
    x0, x1 = math.floor(math.log10(min(ns))), math.ceil(math.log10(max(ns)))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(n):
        return LEFT + (math.log10(n) - x0) / (x1 - x0) * pw

    def py(ms):
        return TOP + ph - (math.log10(ms) - y0) / (y1 - y0) * ph

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="18" font-size="13">ADD latency against the attachments on the node (ms, log-log; thick p99, thin p50)</text>']
    for e in range(x0, x1 + 1):
        x = px(10 ** e)
        svg.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#ddd"/>')
        svg.append(f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle">{10 ** e:,}</text>')
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        svg.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** e:g}</text>')
    svg.append(f'<text x="{LEFT + pw / 2}" y="{H - 12}" text-anchor="middle">N (attachments in the ledger)</text>')
    for i, (name, colour, dash, width, pts) in enumerate(lines):
        d = " ".join(f"{px(n):.1f},{py(y):.1f}" for n, y in pts)
        svg.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}"/>')
        for n, y in pts:
            svg.append(f'<circle cx="{px(n):.1f}" cy="{py(y):.1f}" r="{width + 0.8:.1f}" fill="{colour}"/>')
        ly = TOP + 10 + i * 15
        svg.append(f'<line x1="{W - RIGHT + 10}" y1="{ly}" x2="{W - RIGHT + 34}" y2="{ly}" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}"/>')
        svg.append(f'<text x="{W - RIGHT + 38}" y="{ly + 4}" font-size="10">{name}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
