//! The density curve as an SVG (`--density-svg FILE`; docs/performance.md shows one): ADD's
//! latency against N on log-log axes, dipam's own cost beside the delegate's.

use std::fmt::Write;

use super::super::summarize;
use super::Density;

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;

/// One line of the plot: its label, colour, dash pattern and (N, ms) points.
struct Series {
    label: &'static str,
    colour: &'static str,
    dash: &'static str,
    points: Vec<(f64, f64)>,
}

fn series(d: &Density) -> Vec<Series> {
    let mut out = Vec::new();
    let mut push = |label, colour, dash, f: &dyn Fn(usize) -> f64| {
        let points = (0..d.points.len())
            .map(|k| (d.points[k].n as f64, f(k)))
            .filter(|(_, y)| y.is_finite() && *y > 0.0)
            .collect();
        out.push(Series {
            label,
            colour,
            dash,
            points,
        });
    };
    push("host-local ADD, direct (p50)", "#7f7f7f", "", &|k| {
        summarize(&d.points[k].floor_add).p50
    });
    push("dipam ADD, spawn to reap (p50)", "#1f77b4", "", &|k| {
        summarize(&d.split(k, "ADD").0).p50
    });
    push("dipam's own ADD cost (p50)", "#2ca02c", "", &|k| {
        summarize(&d.split(k, "ADD").2).p50
    });
    push("dipam's own ADD cost (p99)", "#2ca02c", "6,4", &|k| {
        summarize(&d.split(k, "ADD").2).p99
    });
    push("pooled ADD, watermarks (p50)", "#d62728", "", &|k| {
        summarize(&d.points[k].pool.add).p50
    });
    push("pooled ADD, watermarks (p99)", "#d62728", "6,4", &|k| {
        summarize(&d.points[k].pool.add).p99
    });
    push("host-local ADD, direct (p99)", "#7f7f7f", "6,4", &|k| {
        summarize(&d.points[k].floor_add).p99
    });
    push("dipamd STATUS handler (p99)", "#9467bd", "2,3", &|k| {
        summarize(&d.status_handler.get(k).cloned().unwrap_or_default()).p99
    });
    out
}

/// The SVG text.
pub fn svg(d: &Density) -> String {
    let all = series(d);
    let xs: Vec<f64> = d.points.iter().map(|p| p.n as f64).collect();
    let ys: Vec<f64> = all
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let (x0, x1) = (
        xs.iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
            .log10()
            .floor(),
        xs.iter()
            .copied()
            .fold(1.0, f64::max)
            .log10()
            .ceil()
            .max(1.0),
    );
    let (y0, y1) = (
        ys.iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .max(0.01)
            .log10()
            .floor(),
        ys.iter().copied().fold(0.1, f64::max).log10().ceil(),
    );
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (x.log10() - x0) / (x1 - x0).max(1e-9) * pw;
    let py = |y: f64| TOP + ph - (y.log10() - y0) / (y1 - y0).max(1e-9) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="14">ADD latency against attachments on the node (log-log)</text>"#
    );
    for e in (x0 as i32)..=(x1 as i32) {
        let x = px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            10u64.pow(e as u32)
        );
    }
    for e in (y0 as i32)..=(y1 as i32) {
        let y = py(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            10f64.powi(e)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">attachments in the ledger (N)</text>"#,
        LEFT + pw / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">ms</text>"#,
        TOP + ph / 2.0
    );
    for (i, ser) in all.iter().enumerate() {
        let pts: Vec<String> = ser
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}" points="{}"/>"#,
            ser.colour,
            ser.dash,
            pts.join(" ")
        );
        for (x, y) in &ser.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                px(*x),
                py(*y),
                ser.colour
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = W - RIGHT + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 22.0,
            ser.colour,
            ser.dash,
            lx + 28.0,
            ly + 4.0,
            ser.label
        );
    }
    s.push_str("</svg>\n");
    s
}
