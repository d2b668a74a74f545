//! Finds module cycles inside a Rust crate, from its source alone.
//!
//! A crate's module tree is read the way rustc reads it: from `src/lib.rs` (or `src/main.rs`)
//! through every `mod NAME;` and `mod NAME { .. }`. Each file's paths into the crate
//! (`crate::a::b`, `super::c`, `self::d`, use trees with braces) are its references. Code under
//! `#[cfg(test)]` is left out: tests may use any layer (a fixture builds the whole daemon).
//!
//! The graph is levelled. A reference from module `a::x::..` to module `a::y::..` is an edge
//! `x -> y` among the children of `a`: at the crate root these are the top-level modules (the
//! folders and the files beside lib.rs), inside `a/` they are `a`'s files and subfolders. A
//! reference between a module and its own ancestor (a child file using an item of its
//! `mod.rs`, or `mod.rs` re-exporting a child's item) is no edge: a module's own file is shared
//! by its children. A cycle is a strongly connected set of two or more siblings.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// One module path from the crate root: `["pool", "take"]`.
pub type ModPath = Vec<String>;

/// Where a reference was seen, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// A crate's modules and the references of each file.
#[derive(Debug, Default)]
pub struct Crate {
    /// Every module, file or inline, with the file module it lives in.
    pub modules: BTreeMap<ModPath, ModPath>,
    /// The references found: (the file's module, the path it names as absolute segments, where).
    pub refs: Vec<(ModPath, ModPath, Site)>,
}

/// The edges among the children of one module (`level`): `from -> to -> first site`.
pub type Edges = BTreeMap<String, BTreeMap<String, Site>>;

/// A cycle: its level and the siblings in it, with the edges among them.
#[derive(Debug)]
pub struct Cycle {
    pub level: ModPath,
    pub members: Vec<String>,
    pub edges: Vec<(String, String, Site)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Path, // `::`
    Punct(char),
}

/// Splits Rust source into identifiers, string literals, `::` and single punctuation, each
/// with its line; comments (doc comments too: intra-doc links are not dependencies), char
/// literals, lifetimes and numbers are dropped.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |s: &[char]| s.iter().filter(|&&ch| ch == '\n').count();
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let (start, mut depth) = (i, 0usize);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&c[start..i.min(c.len())]);
        } else if ch == '"' || (matches!(ch, 'r' | 'b') && raw_or_byte_string(&c, i)) {
            let start = i;
            let (body, end) = string_literal(&c, i);
            out.push((Tok::Str(body), line));
            line += count_lines(&c[start..end]);
            i = end;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // r#ident: the raw prefix is not part of the name.
            if word == "r" && c.get(i) == Some(&'#') {
                i += 1;
                continue;
            }
            out.push((Tok::Ident(word), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                // `0..n`: a range, not a fraction.
                if c[i] == '.' && c.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// `r"..."`, `r#"..."#`, `b"..."`, `br#"..."#` start at `i`.
fn raw_or_byte_string(c: &[char], i: usize) -> bool {
    // Only where an identifier would start: `for"` is not a literal.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if c[j] == 'b' {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        while c.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && c.get(j) == Some(&'"')
}

/// The body of the string literal starting at `i` and the index after it.
fn string_literal(c: &[char], mut i: usize) -> (String, usize) {
    let mut raw = false;
    if c[i] == 'b' {
        i += 1;
    }
    if c[i] == 'r' {
        raw = true;
        i += 1;
    }
    let mut hashes = 0;
    while c[i] == '#' {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    let start = i;
    while i < c.len() {
        if !raw && c[i] == '\\' {
            i += 2;
            continue;
        }
        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
            let body = c[start..i].iter().collect();
            return (body, i + 1 + hashes);
        }
        i += 1;
    }
    (c[start..].iter().collect(), c.len())
}

/// Reads the crate whose `src/` is at `src`: its module tree and every reference.
pub fn read_crate(src: &Path) -> Result<Crate, String> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{}: neither lib.rs nor main.rs", src.display()))?;
    let mut krate = Crate::default();
    let mut todo = vec![(root, Vec::<String>::new(), true)];
    while let Some((file, module, owns_dir)) = todo.pop() {
        let text = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let dir = if owns_dir {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        krate.modules.insert(module.clone(), module.clone());
        scan(&text, &file, &dir, &module, &mut krate, &mut todo)?;
    }
    Ok(krate)
}

type Todo = Vec<(PathBuf, ModPath, bool)>;

/// Walks one file's tokens: module declarations (queued in `todo`, or inline scopes),
/// `#[cfg(test)]` items (skipped) and paths into the crate (recorded).
fn scan(
    text: &str,
    file: &Path,
    dir: &Path,
    module: &ModPath,
    krate: &mut Crate,
    todo: &mut Todo,
) -> Result<(), String> {
    let toks = lex(text);
    // Inline modules open in this file: (their path, the brace depth that closes them).
    let mut scopes: Vec<(ModPath, usize)> = vec![(module.clone(), 0)];
    let mut depth = 0usize;
    let mut path_attr: Option<String> = None;
    let mut i = 0;
    while i < toks.len() {
        let here = scopes.last().map(|s| s.0.clone()).unwrap_or_default();
        match &toks[i].0 {
            Tok::Punct('#') => {
                let (attr, end) = attribute(&toks, i);
                i = end;
                if attr.first().map(String::as_str) == Some("cfg")
                    && attr[1..] == ["(", "test", ")"]
                {
                    i = skip_item(&toks, i);
                } else if attr.first().map(String::as_str) == Some("path") {
                    path_attr = attr.get(2).cloned();
                }
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if scopes.len() > 1 && scopes.last().is_some_and(|s| s.1 == depth) {
                    scopes.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some((Tok::Ident(name), _)) = toks.get(i + 1) {
                    let mut child = here.clone();
                    child.push(name.clone());
                    match toks.get(i + 2).map(|t| &t.0) {
                        Some(Tok::Punct(';')) => {
                            // Inline scopes nest their files in subfolders (rustc's rule).
                            let mut base = dir.to_path_buf();
                            for seg in &here[module.len()..] {
                                base.push(seg);
                            }
                            let (path, owns) = match path_attr.take() {
                                Some(p) => (file.parent().unwrap_or(dir).join(p), false),
                                None => {
                                    let flat = base.join(format!("{name}.rs"));
                                    if flat.is_file() {
                                        (flat, false)
                                    } else {
                                        (base.join(name).join("mod.rs"), true)
                                    }
                                }
                            };
                            if !path.is_file() {
                                return Err(format!(
                                    "{}: mod {name}: no file {}",
                                    file.display(),
                                    path.display()
                                ));
                            }
                            todo.push((path, child, owns));
                            i += 3;
                            continue;
                        }
                        Some(Tok::Punct('{')) => {
                            krate.modules.insert(child.clone(), module.clone());
                            depth += 1;
                            scopes.push((child, depth - 1));
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            Tok::Ident(w)
                if (w == "crate" || w == "super" || w == "self")
                    && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path)
                    && !matches!(i.checked_sub(1).map(|p| &toks[p].0), Some(Tok::Path)) =>
            {
                let line = toks[i].1;
                let mut base = if w == "crate" {
                    Vec::new()
                } else {
                    here.clone()
                };
                let mut j = i;
                if w == "self" || w == "crate" {
                    j += 2;
                } else {
                    while matches!(&toks.get(j).map(|t| &t.0), Some(Tok::Ident(s)) if s == "super")
                        && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path)
                    {
                        base.pop();
                        j += 2;
                    }
                }
                let mut paths = Vec::new();
                let end = use_tree(&toks, j, base, &mut paths);
                for p in paths {
                    let shown = format!("crate::{}", p.join("::"));
                    krate.refs.push((
                        module.clone(),
                        p,
                        Site {
                            file: file.to_path_buf(),
                            line,
                            path: shown,
                        },
                    ));
                }
                i = end.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The tokens of the attribute starting at `i` (`#[..]` or `#![..]`), as words, and the
/// index after it.
fn attribute(toks: &[(Tok, usize)], mut i: usize) -> (Vec<String>, usize) {
    i += 1;
    if toks.get(i).map(|t| &t.0) == Some(&Tok::Punct('!')) {
        i += 1;
    }
    if toks.get(i).map(|t| &t.0) != Some(&Tok::Punct('[')) {
        return (Vec::new(), i);
    }
    let (mut words, mut depth) = (Vec::new(), 0usize);
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('[') => {
                depth += 1;
                if depth == 1 {
                    i += 1;
                    continue;
                }
            }
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return (words, i + 1);
                }
            }
            _ => {}
        }
        words.push(match &toks[i].0 {
            Tok::Ident(s) | Tok::Str(s) => s.clone(),
            Tok::Path => "::".to_owned(),
            Tok::Punct(c) => c.to_string(),
        });
        i += 1;
    }
    (words, i)
}

/// The index after the item starting at `i`: its `;` or `,` (a field), or the brace that
/// closes its body.
fn skip_item(toks: &[(Tok, usize)], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';' | ',') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => {
                let mut braces = 0;
                while i < toks.len() {
                    match &toks[i].0 {
                        Tok::Punct('{') => braces += 1,
                        Tok::Punct('}') => {
                            braces -= 1;
                            if braces == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads a path or use tree at `i` below `base` (`a::b`, `a::{b, c::d}`, `a::*`), pushing
/// every path it names; returns the index after it.
fn use_tree(toks: &[(Tok, usize)], mut i: usize, base: ModPath, out: &mut Vec<ModPath>) -> usize {
    let mut path = base;
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(s)) if s == "self" => {
                i += 1;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.0) {
                        None => return i,
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let before = i;
                            i = use_tree(toks, i, path.clone(), out);
                            // `as name`: skip the rename.
                            if matches!(toks.get(i).map(|t| &t.0), Some(Tok::Ident(s)) if s == "as")
                            {
                                i += 2;
                            }
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                out.push(path);
                return i + 1;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
        if toks.get(i).map(|t| &t.0) == Some(&Tok::Path) {
            i += 1;
        } else {
            out.push(path);
            return i;
        }
    }
}

impl Crate {
    /// The file module a path lands in: its longest prefix that is a module, mapped to the
    /// file that module lives in.
    fn target(&self, path: &[String]) -> ModPath {
        (0..=path.len())
            .rev()
            .find_map(|n| self.modules.get(&path[..n]).cloned())
            .unwrap_or_default()
    }

    /// The edges of every level: `level -> from -> to -> first site`.
    pub fn levels(&self) -> BTreeMap<ModPath, Edges> {
        let mut levels: BTreeMap<ModPath, Edges> = BTreeMap::new();
        for (from, path, site) in &self.refs {
            let to = self.target(path);
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // An ancestor, a descendant or the module itself: no edge between siblings.
            if common == from.len() || common == to.len() {
                continue;
            }
            levels
                .entry(from[..common].to_vec())
                .or_default()
                .entry(from[common].clone())
                .or_default()
                .entry(to[common].clone())
                .or_insert_with(|| site.clone());
        }
        levels
    }

    /// Every cycle, level by level.
    pub fn cycles(&self) -> Vec<Cycle> {
        let mut found = Vec::new();
        for (level, edges) in self.levels() {
            for scc in strongly_connected(&edges) {
                if scc.len() < 2 {
                    continue;
                }
                let members: BTreeSet<&String> = scc.iter().collect();
                let mut inner = Vec::new();
                for (a, tos) in &edges {
                    for (b, site) in tos {
                        if members.contains(a) && members.contains(b) {
                            inner.push((a.clone(), b.clone(), site.clone()));
                        }
                    }
                }
                found.push(Cycle {
                    level: level.clone(),
                    members: scc,
                    edges: inner,
                });
            }
        }
        found
    }
}

/// Tarjan's strongly connected components, each sorted, in a stable order.
fn strongly_connected(edges: &Edges) -> Vec<Vec<String>> {
    let mut nodes: BTreeSet<&String> = edges.keys().collect();
    nodes.extend(edges.values().flat_map(|m| m.keys()));
    let nodes: Vec<&String> = nodes.into_iter().collect();
    let index_of: BTreeMap<&String, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            edges
                .get(*n)
                .map(|m| m.keys().map(|k| index_of[k]).collect())
                .unwrap_or_default()
        })
        .collect();
    struct State {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(v: usize, succ: &[Vec<usize>], s: &mut State) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &succ[v] {
            match s.index[w] {
                None => {
                    visit(w, succ, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let n = nodes.len();
    let mut s = State {
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(v, &succ, &mut s);
        }
    }
    let mut out: Vec<Vec<String>> = s
        .out
        .into_iter()
        .map(|scc| {
            let mut names: Vec<String> = scc.into_iter().map(|i| nodes[i].clone()).collect();
            names.sort();
            names
        })
        .collect();
    out.sort();
    out
}

/// `crate` or `crate::a::b`, for the report.
pub fn level_name(level: &[String]) -> String {
    std::iter::once("crate")
        .chain(level.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> (tempfile_free::Dir, Crate) {
        let dir = tempfile_free::Dir::new();
        for (name, text) in files {
            let p = dir.0.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        let k = read_crate(&dir.0).unwrap();
        (dir, k)
    }

    /// A scratch directory removed on drop (std only: the tool has no dependencies).
    mod tempfile_free {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "dipam-layers-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn names(cycles: &[Cycle]) -> Vec<(String, Vec<String>)> {
        cycles
            .iter()
            .map(|c| (level_name(&c.level), c.members.clone()))
            .collect()
    }

    #[test]
    fn folder_cycle_through_a_use_tree() {
        let (_d, k) = crate_of(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            ("a/mod.rs", "pub mod x;\n"),
            ("a/x.rs", "use crate::{b::{self, Thing}, c};\n"),
            (
                "b.rs",
                "// crate::a::x in a comment is no edge\nfn f() { crate::a::x::g(); }\n",
            ),
            ("c.rs", "/// [crate::a]\npub fn h() {}\n"),
        ]);
        assert_eq!(
            names(&k.cycles()),
            vec![("crate".to_owned(), vec!["a".to_owned(), "b".to_owned()])]
        );
        let c = &k.cycles()[0];
        assert!(
            c.edges
                .iter()
                .any(|(f, t, s)| f == "b" && t == "a" && s.line == 2)
        );
    }

    #[test]
    fn file_cycle_through_super_and_parent_edges_ignored() {
        let (_d, k) = crate_of(&[
            ("lib.rs", "mod m;\n"),
            ("m/mod.rs", "mod p;\nmod q;\npub use p::P;\npub struct M;\n"),
            ("m/p.rs", "use super::{M, q::Q};\npub struct P;\n"),
            ("m/q.rs", "pub struct Q(super::p::P, super::M);\n"),
        ]);
        assert_eq!(
            names(&k.cycles()),
            vec![("crate::m".to_owned(), vec!["p".to_owned(), "q".to_owned()])]
        );
    }

    #[test]
    fn test_code_strings_and_inline_modules() {
        let (_d, k) = crate_of(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            (
                "a.rs",
                "#[cfg(test)]\nmod tests { use crate::b; }\n#[cfg(test)]\nuse crate::b::X;\n\
                 const S: &str = \"crate::b\";\nconst R: &str = r#\"crate::b\"#;\n\
                 fn l<'a>(x: &'a str) -> char { 'b' }\n\
                 mod inner { use super::super::b::Y; }\n",
            ),
            ("b.rs", "use crate::a;\n"),
        ]);
        // a/inner's super::super is the crate root: crate::b, an edge a -> b.
        let levels = k.levels();
        assert!(levels[&Vec::<String>::new()]["a"].contains_key("b"));
        assert_eq!(levels[&Vec::<String>::new()]["a"]["b"].line, 8);
        assert_eq!(k.cycles().len(), 1);
    }

    #[test]
    fn no_cycle_in_a_layered_crate() {
        let (_d, k) = crate_of(&[
            (
                "lib.rs",
                "pub mod low;\npub mod high;\n#[cfg(test)]\nmod testing;\n",
            ),
            ("low.rs", "pub fn f() {}\n"),
            ("high.rs", "pub fn g() { crate::low::f() }\n"),
        ]);
        assert!(k.cycles().is_empty());
        assert!(k.levels()[&Vec::<String>::new()]["high"].contains_key("low"));
    }
}
