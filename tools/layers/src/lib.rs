//! Checks a Rust crate's layers from its source alone: no module cycle, and no edge up the
//! declared order.
//!
//! A crate's module tree is read the way rustc reads it: from `src/lib.rs` (or `src/main.rs`)
//! through every `mod NAME;` and `mod NAME { .. }`. Each file's paths into the crate
//! (`crate::a::b`, `super::c`, `self::d`, use trees with braces, a `use` of a child module's
//! path without a prefix) are its references, and so are the paths inside attributes
//! (`#[error("{}", crate::a::f(x))]`, `#[serde(with = "crate::a")]`). A path through a name
//! that a `use` brought into a module (`crate::StoreError` after `pub use error::StoreError`)
//! is followed to the module it names. Code under `#[cfg(test)]` is left out: tests may use
//! any layer (a fixture builds the whole daemon).
//!
//! The graph is levelled. A reference from module `a::x::..` to module `a::y::..` is an edge
//! `x -> y` among the children of `a`: at the crate root these are the top-level modules (the
//! folders and the files beside lib.rs), inside `a/` they are `a`'s files and subfolders. A
//! reference between a module and its own ancestor (a child file using an item of its
//! `mod.rs`, or `mod.rs` re-exporting a child's item) is no edge: a module's own file is shared
//! by its children. A cycle is a strongly connected set of two or more siblings.
//!
//! A module file may declare its children in layers, from the ground up: a line
//! `// Layer NAME: what it holds` starts the layer NAME, and every `mod` after it, up to the
//! next such line, is in it. An edge from a child to a child of a later layer points up the
//! layers, and fails even where it closes no cycle.

mod graph;
mod lex;
mod scan;

use std::{collections::BTreeMap, path::PathBuf};

pub use graph::{Cycle, Upward, level_name};
pub use scan::{ReadError, read_crate};

/// One module path from the crate root: `["pool", "take"]`.
pub type ModPath = Vec<String>;

/// Where a reference was seen, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// A layer: its place in the declared order (0 is the ground) and its name.
pub type Layer = (usize, String);

/// A crate's modules and the references of each file.
#[derive(Debug, Default)]
pub struct Crate {
    /// Every module, file or inline, with the file module it lives in.
    pub modules: BTreeMap<ModPath, ModPath>,
    /// The references found: (the file's module, the path it names as absolute segments, where).
    pub refs: Vec<(ModPath, ModPath, Site)>,
    /// The names a `use` brought into a module: (module, name) -> the path it stands for.
    pub imports: BTreeMap<(ModPath, String), ModPath>,
    /// The layers a module file declares: module -> child -> its layer.
    pub layers: BTreeMap<ModPath, BTreeMap<String, Layer>>,
}

/// The edges among the children of one module (`level`): `from -> to -> first site`.
pub type Edges = BTreeMap<String, BTreeMap<String, Site>>;

impl Crate {
    /// Records that the file of module `from` names `path`.
    fn reference(&mut self, from: &ModPath, path: ModPath, mut site: Site) {
        site.path = format!("crate::{}", path.join("::"));
        self.refs.push((from.clone(), path, site));
    }

    /// Records a `use` in module `scope` (written in the file of module `from`): a
    /// reference, and the name it brings in.
    fn import(
        &mut self,
        scope: &ModPath,
        from: &ModPath,
        path: ModPath,
        name: Option<String>,
        site: &Site,
    ) {
        if let Some(name) = name {
            self.imports.insert((scope.clone(), name), path.clone());
        }
        self.reference(from, path, site.clone());
    }
}

#[cfg(test)]
mod tests;
