//! The graph of each level, its cycles and its edges up the declared layers.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Crate, Edges, ModPath, Site};

/// A cycle: its level and the siblings in it, with the edges among them.
#[derive(Debug)]
pub struct Cycle {
    pub level: ModPath,
    pub members: Vec<String>,
    pub edges: Vec<(String, String, Site)>,
}

impl Crate {
    /// `path` with every name a `use` brought into a module replaced by what it stands for,
    /// so that `crate::StoreError` after `pub use error::StoreError` is
    /// `crate::error::StoreError`. Bounded: a chain of re-exports is short.
    fn resolve(&self, path: &[String]) -> ModPath {
        let mut path = path.to_vec();
        for _ in 0..32 {
            let n = self.module_prefix(&path);
            let Some(name) = path.get(n) else { break };
            let Some(to) = self.imports.get(&(path[..n].to_vec(), name.clone())) else {
                break;
            };
            let mut next = to.clone();
            next.extend_from_slice(&path[n + 1..]);
            if next == path {
                break;
            }
            path = next;
        }
        path
    }

    /// The length of `path`'s longest prefix that is a module.
    fn module_prefix(&self, path: &[String]) -> usize {
        (0..=path.len())
            .rev()
            .find(|&n| self.modules.contains_key(&path[..n]))
            .unwrap_or(0)
    }

    /// The file module a path lands in, through re-exports: its longest prefix that is a
    /// module, mapped to the file that module lives in.
    fn target(&self, path: &[String]) -> ModPath {
        let path = self.resolve(path);
        self.modules[&path[..self.module_prefix(&path)]].clone()
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

    /// Every edge that points up the layers its level declares: from a child of one layer
    /// to a child of a later one.
    pub fn upward(&self) -> Vec<Upward> {
        let mut found = Vec::new();
        for (level, edges) in self.levels() {
            let Some(layers) = self.layers.get(&level) else {
                continue;
            };
            for (from, tos) in &edges {
                for (to, site) in tos {
                    if let (Some(a), Some(b)) = (layers.get(from), layers.get(to))
                        && b.0 > a.0
                    {
                        found.push(Upward {
                            level: level.clone(),
                            from: (from.clone(), a.1.clone()),
                            to: (to.clone(), b.1.clone()),
                            site: site.clone(),
                        });
                    }
                }
            }
        }
        found
    }
}

/// An edge up the layers: the level, each end with its layer's name, and where it is made.
#[derive(Debug)]
pub struct Upward {
    pub level: ModPath,
    pub from: (String, String),
    pub to: (String, String),
    pub site: Site,
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
