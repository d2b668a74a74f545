//! What `dipamctl install` prints when it is done: a line per file for people, or one JSON
//! document for scripts.

use std::io::{self, Write};

use serde_json::json;

use super::{Report, node_ranges::NodeRanges, wrap_files::Adopted};
use crate::atomic::Placed;

/// Prints what `r` says was done.
pub(super) fn print(r: &Report, json: bool, out: &mut dyn Write) -> io::Result<()> {
    let state = |p: &Placed| if p.changed { "installed" } else { "unchanged" };
    if json {
        let v = json!({
            "plugin": {
                "path": r.plugin.path,
                "version": r.plugin_version,
                "changed": r.plugin.changed,
            },
            "conflist": r.conflist.as_ref().map(|(p, network)| json!({
                "path": p.path, "network": network, "changed": p.changed,
            })),
            "wrapped": r.adopted.as_ref().map(Adopted::json),
            "ranges": r.ranges.as_ref().map(NodeRanges::json),
            "readers": r.readers.iter().map(|x| json!({
                "runtime": x.name, "version": x.version, "path": x.path,
                "maxCniVersion": x.max, "reads": x.reads,
            })).collect::<Vec<_>>(),
            "manPages": r.man_pages.as_ref().map(|(dir, pages)| json!({
                "dir": dir,
                "pages": pages.iter().map(|p| json!({"path": p.path, "changed": p.changed})).collect::<Vec<_>>(),
            })),
        });
        writeln!(out, "{v:#}")
    } else {
        writeln!(
            out,
            "plugin:    {} ({}) {}",
            r.plugin.path.display(),
            r.plugin_version,
            state(&r.plugin)
        )
        .and_then(|()| match &r.ranges {
            Some(n) => writeln!(out, "{}", n.line()),
            None => Ok(()),
        })
        .and_then(|()| match &r.conflist {
            Some((p, network)) => writeln!(
                out,
                "conflist:  {} (network {network}) {}",
                p.path.display(),
                state(p)
            ),
            None => Ok(()),
        })
        .and_then(|()| {
            r.readers.iter().try_for_each(|x| {
                let max = x
                    .max
                    .map_or("every cniVersion".into(), |m| format!("up to {m}"));
                writeln!(
                    out,
                    "judged:    by {} {}, which reads it ({}; takes {max})",
                    x.name, x.version, x.reads
                )
            })
        })
        .and_then(|()| match &r.adopted {
            Some(a) => a.print(out),
            None => Ok(()),
        })
        .and_then(|()| match &r.man_pages {
            Some((dir, pages)) => writeln!(
                out,
                "man:       {} pages in {} {}",
                pages.len(),
                dir.display(),
                if pages.iter().any(|p| p.changed) {
                    "installed"
                } else {
                    "unchanged"
                }
            ),
            None => Ok(()),
        })
    }
}
