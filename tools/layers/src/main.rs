//! `dipam-layers CRATE_DIR...`: exits 1 when a crate has a module cycle, at folder level (its
//! top-level modules) or at file level (the files of one folder), or an edge up the layers a
//! module file declares, naming each such edge with the line that makes it. `--edges` prints
//! every level's layers and edges as well, the picture docs/architecture.md draws. See the
//! crate's doc for what counts as an edge.

use std::{path::Path, process::ExitCode};

use dipam_layers::{level_name, read_crate};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let edges = args.iter().any(|a| a == "--edges");
    let dirs: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if dirs.is_empty() {
        eprintln!("usage: dipam-layers [--edges] CRATE_DIR...");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for dir in dirs {
        let krate = match read_crate(&Path::new(dir).join("src")) {
            Ok(k) => k,
            Err(e) => {
                eprintln!("dipam-layers: {e}");
                return ExitCode::from(2);
            }
        };
        if edges {
            for (level, from) in krate.levels() {
                println!("{dir}: {}", level_name(&level));
                for (child, (_, layer)) in krate.layers.get(&level).into_iter().flatten() {
                    println!("  {child} in layer {layer}");
                }
                for (a, tos) in from {
                    let tos: Vec<&str> = tos.keys().map(String::as_str).collect();
                    println!("  {a} -> {}", tos.join(", "));
                }
            }
        }
        let cycles = krate.cycles();
        for c in &cycles {
            failed = true;
            println!(
                "{dir}: a module cycle in {}: {}",
                level_name(&c.level),
                c.members.join(", ")
            );
            for (a, b, site) in &c.edges {
                println!(
                    "  {a} -> {b}: {}:{} {}",
                    site.file.display(),
                    site.line,
                    site.path
                );
            }
        }
        let upward = krate.upward();
        for u in &upward {
            failed = true;
            println!(
                "{dir}: an edge up the layers in {}: {} (layer {}) -> {} (layer {}): {}:{} {}",
                level_name(&u.level),
                u.from.0,
                u.from.1,
                u.to.0,
                u.to.1,
                u.site.file.display(),
                u.site.line,
                u.site.path
            );
        }
        if cycles.is_empty() && upward.is_empty() {
            println!("{dir}: no module cycle, no edge up the layers");
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
