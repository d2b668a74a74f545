//! Every example network config the project shows its users, read from where they read it:
//! the ```json fenced blocks of README.md and docs/*.md that are conflists (they have
//! `plugins`), and every file of conflist/ (not conflist/bad/). Nothing is copied into the
//! tests, so an example edited in the docs is the example tested.

use std::path::Path;

use serde_json::Value;

use crate::bins;

/// One example: where it is shown, and the conflist as shown.
#[derive(Debug, Clone)]
pub struct Example {
    /// e.g. `README.md, json block 1 (line 90)` or `conflist/dipam-portmap.conflist`.
    pub source: String,
    pub list: Value,
}

impl Example {
    pub fn version(&self) -> &str {
        self.list["cniVersion"].as_str().unwrap_or_default()
    }

    /// The IPAM dipam delegates to (host-local, azure-vnet-ipam, ...).
    pub fn delegate(&self) -> String {
        crate::Fixture {
            list: self.list.clone(),
        }
        .delegate()
    }

    /// The types of the plugins in the chain, in order.
    pub fn plugin_types(&self) -> Vec<String> {
        self.list["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["type"].as_str().map(str::to_owned))
            .collect()
    }
}

/// The ```json blocks of `markdown`, each with the line its fence opens on (1-based).
pub fn json_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```json") => open = Some((i + 1, String::new())),
            Some(_) if fence.starts_with("```") => blocks.extend(open.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The files `*.ext` in `dir`, by name: a stable order, so a failure names the same example
/// on every run.
fn sorted_files(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// Every example, in a stable order: README.md, docs/*.md (by name), conflist/*.conflist.
/// Panics on a json block that mentions `"plugins"` and does not parse: it is an example a
/// user would copy.
pub fn all() -> Vec<Example> {
    let root = bins::workspace();
    let mut docs = vec![root.join("README.md")];
    docs.extend(sorted_files(&root.join("docs"), "md"));
    let mut out = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("read doc");
        let name = rel(&root, doc);
        for (n, (line, block)) in json_blocks(&text).into_iter().enumerate() {
            if !block.contains("\"plugins\"") {
                continue;
            }
            let list: Value = serde_json::from_str(&block)
                .unwrap_or_else(|e| panic!("{name} json block at line {line}: {e}"));
            out.push(Example {
                source: format!("{name}, json block {} (line {line})", n + 1),
                list,
            });
        }
    }
    for f in sorted_files(&root.join("conflist"), "conflist") {
        let text = std::fs::read_to_string(&f).expect("read conflist");
        out.push(Example {
            source: rel(&root, &f),
            list: serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
        });
    }
    out
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_blocks_are_found_with_their_lines_and_others_are_not() {
        let md = "a\n```json\n{\"x\": 1}\n```\n```sh\nls\n```\n  ```json\n[]\n  ```\n";
        assert_eq!(
            json_blocks(md),
            vec![(2, "{\"x\": 1}\n".into()), (8, "[]\n".into())]
        );
    }
}
