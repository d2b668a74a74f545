//! Reads a crate's module tree and the paths each file names into it.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{
    Crate, ModPath, Site,
    lex::{Tok, lex},
};

/// Why a crate's module tree could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: neither lib.rs nor main.rs", .0.display())]
    NoRoot(PathBuf),
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: mod {name}: no file {}", file.display(), path.display())]
    NoModFile {
        file: PathBuf,
        name: String,
        path: PathBuf,
    },
    #[error("{}: mod {name} is declared before the first `// Layer NAME:` line", file.display())]
    OutsideLayers { file: PathBuf, name: String },
}

/// The files still to read: (file, its module, whether it owns its directory like `mod.rs`).
type Todo = Vec<(PathBuf, ModPath, bool)>;

/// A path a `use` names, and the name it brings into scope (none for a glob or `as _`).
type Import = (ModPath, Option<String>);

/// A `use` of a bare path (`use error::StoreError;`): a child module's item, or an extern
/// crate's, known only once every module is read. (scope, file module, its paths, where).
type Bare = (ModPath, ModPath, Vec<Import>, Site);

/// Reads the crate whose `src/` is at `src`: its module tree, every reference, every name a
/// `use` brings into a module, and the layers each module file declares.
pub fn read_crate(src: &Path) -> Result<Crate, ReadError> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.is_file())
        .ok_or_else(|| ReadError::NoRoot(src.to_owned()))?;
    let mut krate = Crate::default();
    let mut bare = Vec::new();
    let mut todo = vec![(root, Vec::<String>::new(), true)];
    while let Some((file, module, owns_dir)) = todo.pop() {
        let text = fs::read_to_string(&file).map_err(|source| ReadError::Io {
            file: file.clone(),
            source,
        })?;
        let dir = if owns_dir {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        krate.modules.insert(module.clone(), module.clone());
        let mut s = Scanner {
            toks: lex(&text),
            file: &file,
            dir: &dir,
            module: &module,
            scopes: vec![(module.clone(), 0)],
            depth: 0,
            path_attr: None,
            layer: None,
            declares_layers: false,
            krate: &mut krate,
            todo: &mut todo,
            bare: &mut bare,
        };
        s.scan()?;
    }
    // A bare `use` names a module of this crate only when its first segment is a child of
    // the scope it is written in (Rust 2018 paths); else it names an extern crate.
    for (scope, from, imports, site) in bare {
        for (path, name) in imports {
            if path.len() > scope.len() && krate.modules.contains_key(&path[..=scope.len()]) {
                krate.import(&scope, &from, path, name, &site);
            }
        }
    }
    Ok(krate)
}

struct Scanner<'a> {
    toks: Vec<(Tok, usize)>,
    file: &'a Path,
    dir: &'a Path,
    /// The file's module.
    module: &'a ModPath,
    /// Inline modules open in this file: (their path, the brace depth that closes them).
    scopes: Vec<(ModPath, usize)>,
    depth: usize,
    /// A `#[path = ".."]` waiting for its `mod`.
    path_attr: Option<String>,
    /// The layer the next module declarations are in (the last `// Layer` line).
    layer: Option<(usize, String)>,
    /// Whether the file has a `// Layer` line at all.
    declares_layers: bool,
    krate: &'a mut Crate,
    todo: &'a mut Todo,
    bare: &'a mut Vec<Bare>,
}

impl Scanner<'_> {
    fn tok(&self, i: usize) -> Option<&Tok> {
        self.toks.get(i).map(|t| &t.0)
    }

    /// The module the token being read is in (the file's, or an inline one inside it).
    fn here(&self) -> ModPath {
        self.scopes.last().map(|s| s.0.clone()).unwrap_or_default()
    }

    /// Walks the file's tokens: module declarations (queued, or inline scopes), attributes,
    /// `use` declarations and paths into the crate.
    fn scan(&mut self) -> Result<(), ReadError> {
        self.declares_layers = self.toks.iter().any(|t| matches!(t.0, Tok::Layer(_)));
        let mut i = 0;
        while i < self.toks.len() {
            i = match self.toks[i].0.clone() {
                Tok::Punct('#') => self.attribute(i),
                Tok::Punct('{') => {
                    self.depth += 1;
                    i + 1
                }
                Tok::Punct('}') => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.scopes.len() > 1
                        && self.scopes.last().is_some_and(|s| s.1 == self.depth)
                    {
                        self.scopes.pop();
                    }
                    i + 1
                }
                Tok::Layer(name) => {
                    let next = self.layer.as_ref().map_or(0, |l| l.0 + 1);
                    self.layer = Some((next, name));
                    i + 1
                }
                Tok::Ident(w) if w == "mod" => self.module_decl(i)?,
                Tok::Ident(w) if w == "use" => self.use_decl(i + 1),
                Tok::Ident(w)
                    if matches!(w.as_str(), "crate" | "super" | "self")
                        && self.tok(i + 1) == Some(&Tok::Path)
                        && !matches!(
                            i.checked_sub(1).map(|p| &self.toks[p].0),
                            Some(Tok::Path)
                        ) =>
                {
                    let line = self.toks[i].1;
                    let (paths, end) = self.path_at(&self.toks, i, self.here());
                    for (p, _) in paths {
                        self.krate.reference(self.module, p, self.site(line));
                    }
                    end.max(i + 1)
                }
                _ => i + 1,
            };
        }
        Ok(())
    }

    fn site(&self, line: usize) -> Site {
        Site {
            file: self.file.to_path_buf(),
            line,
            path: String::new(),
        }
    }

    /// An attribute at `i`: `#[cfg(test)]` skips its item (tests may use any layer),
    /// `#[path = ".."]` is kept for the next `mod`; any other is read on as code, so that
    /// `#[error("{}", crate::a::f(x))]` is an edge, and a string in it that is a path
    /// (`#[serde(with = "crate::a")]`) is one too. Returns where to read on.
    fn attribute(&mut self, i: usize) -> usize {
        let (words, end) = attribute(&self.toks, i);
        match words.first().map(String::as_str) {
            Some("cfg") if words[1..] == ["(", "test", ")"] => return skip_item(&self.toks, end),
            Some("path") => {
                self.path_attr = words.get(2).cloned();
                return end;
            }
            _ => {}
        }
        let line = self.toks[i].1;
        for w in &words {
            let toks = lex(w);
            let is_path = matches!(toks.first(), Some((Tok::Ident(s), _)) if matches!(s.as_str(), "crate" | "super" | "self"))
                && toks.get(1).map(|t| &t.0) == Some(&Tok::Path)
                && toks
                    .iter()
                    .all(|t| matches!(t.0, Tok::Ident(_) | Tok::Path));
            if is_path && w.contains("::") {
                let (paths, _) = self.path_at(&toks, 0, self.here());
                for (p, _) in paths {
                    self.krate.reference(self.module, p, self.site(line));
                }
            }
        }
        i + 1
    }

    /// `mod NAME;` (a file, queued) or `mod NAME { .. }` (an inline scope) at `i`.
    fn module_decl(&mut self, i: usize) -> Result<usize, ReadError> {
        let Some(Tok::Ident(name)) = self.tok(i + 1).cloned() else {
            return Ok(i + 1);
        };
        let here = self.here();
        let mut child = here.clone();
        child.push(name.clone());
        let inline = match self.tok(i + 2) {
            Some(Tok::Punct(';')) => false,
            Some(Tok::Punct('{')) => true,
            _ => return Ok(i + 1),
        };
        if here == *self.module {
            self.declare_layer(&name)?;
        }
        if inline {
            self.krate
                .modules
                .insert(child.clone(), self.module.clone());
            self.depth += 1;
            self.scopes.push((child, self.depth - 1));
            return Ok(i + 3);
        }
        // Inline scopes nest their files in subfolders (rustc's rule).
        let mut base = self.dir.to_path_buf();
        base.extend(&here[self.module.len()..]);
        let (path, owns) = match self.path_attr.take() {
            Some(p) => (self.file.parent().unwrap_or(self.dir).join(p), false),
            None => {
                let flat = base.join(format!("{name}.rs"));
                if flat.is_file() {
                    (flat, false)
                } else {
                    (base.join(&name).join("mod.rs"), true)
                }
            }
        };
        if !path.is_file() {
            return Err(ReadError::NoModFile {
                file: self.file.to_owned(),
                name,
                path,
            });
        }
        self.todo.push((path, child, owns));
        Ok(i + 3)
    }

    /// Puts the child `name` in the layer of the last `// Layer` line; once a file declares
    /// layers, every module it declares is in one.
    fn declare_layer(&mut self, name: &str) -> Result<(), ReadError> {
        match &self.layer {
            Some(layer) => {
                self.krate
                    .layers
                    .entry(self.module.clone())
                    .or_default()
                    .insert(name.to_owned(), layer.clone());
                Ok(())
            }
            None if !self.declares_layers => Ok(()),
            None => Err(ReadError::OutsideLayers {
                file: self.file.to_owned(),
                name: name.to_owned(),
            }),
        }
    }

    /// A `use` declaration whose tree starts at `i`: its paths are references, and the names
    /// it brings in are recorded, so that a path through a re-export reaches the module that
    /// defines the item.
    fn use_decl(&mut self, mut i: usize) -> usize {
        let line = self.toks.get(i).map_or(0, |t| t.1);
        if self.tok(i) == Some(&Tok::Path) {
            i += 1; // `use ::name`: an extern crate.
        }
        let here = self.here();
        let (imports, end) = match self.tok(i) {
            Some(Tok::Ident(w)) if matches!(w.as_str(), "crate" | "super" | "self") => {
                self.path_at(&self.toks, i, here.clone())
            }
            _ => {
                let mut out = Vec::new();
                let end = use_tree(&self.toks, i, here.clone(), &mut out);
                let site = self.site(line);
                self.bare.push((here, self.module.clone(), out, site));
                return end.max(i + 1);
            }
        };
        for (path, name) in imports {
            let site = self.site(line);
            self.krate.import(&here, self.module, path, name, &site);
        }
        end.max(i + 1)
    }

    /// The paths of the `crate::`, `super::` or `self::` path (or use tree) at `i` in `toks`,
    /// written in module `here`, as absolute segments; and the index after it.
    fn path_at(&self, toks: &[(Tok, usize)], i: usize, here: ModPath) -> (Vec<Import>, usize) {
        let mut j = i;
        let mut base = here;
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Ident(w)) if w == "crate" => {
                base.clear();
                j += 2;
            }
            Some(Tok::Ident(w)) if w == "self" => j += 2,
            _ => {
                while matches!(toks.get(j).map(|t| &t.0), Some(Tok::Ident(s)) if s == "super")
                    && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path)
                {
                    base.pop();
                    j += 2;
                }
            }
        }
        let mut out = Vec::new();
        let end = use_tree(toks, j, base, &mut out);
        (out, end)
    }
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
            Tok::Ident(s) | Tok::Str(s) | Tok::Layer(s) => s.clone(),
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

/// Reads a path or use tree at `i` below `base` (`a::b`, `a::{self, b as c, d::*}`), pushing
/// every path it names with the name it brings into scope; returns the index after it.
fn use_tree(toks: &[(Tok, usize)], mut i: usize, base: ModPath, out: &mut Vec<Import>) -> usize {
    let tok = |i: usize| toks.get(i).map(|t| &t.0);
    let mut path = base;
    let mut name = None;
    loop {
        match tok(i) {
            Some(Tok::Ident(s)) if s == "self" => {
                name = path.last().cloned();
                i += 1;
            }
            Some(Tok::Ident(s)) => {
                name = Some(s.clone());
                path.push(s.clone());
                i += 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match tok(i) {
                        None => return i,
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let before = i;
                            i = use_tree(toks, i, path.clone(), out);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                out.push((path, None));
                return i + 1;
            }
            _ => {
                out.push((path, name));
                return i;
            }
        }
        if tok(i) == Some(&Tok::Path) {
            i += 1;
            continue;
        }
        // `as name`: the import's name is the alias (`as _` brings in none).
        if matches!(tok(i), Some(Tok::Ident(s)) if s == "as") {
            name = match tok(i + 1) {
                Some(Tok::Ident(a)) if a != "_" => Some(a.clone()),
                _ => None,
            };
            i += 2;
        }
        out.push((path, name));
        return i;
    }
}
