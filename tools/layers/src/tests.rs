//! The checker's own tests: each seeds a crate and reads it back.

use std::fs;

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

fn upward(k: &Crate) -> Vec<String> {
    k.upward()
        .iter()
        .map(|u| format!("{} -> {} line {}", u.from.0, u.to.0, u.site.line))
        .collect()
}

const LAYERED: &str = "// Layer leaves: facts.\npub mod low;\n\n// Layer core: a life.\npub mod mid;\n\n\
                       // Layer clients: on the core.\npub mod high;\n";

#[test]
fn an_edge_up_the_layers_fails_without_a_cycle() {
    let (_d, k) = crate_of(&[
        ("lib.rs", LAYERED),
        ("low.rs", "pub fn f() { crate::high::g() }\n"),
        ("mid.rs", "use crate::low::f;\n"),
        ("high.rs", "pub fn g() {}\n"),
    ]);
    assert!(k.cycles().is_empty());
    assert_eq!(upward(&k), vec!["low -> high line 1"]);
    let u = &k.upward()[0];
    assert_eq!((u.from.1.as_str(), u.to.1.as_str()), ("leaves", "clients"));
}

#[test]
fn edges_down_and_within_a_layer_pass() {
    let (_d, k) = crate_of(&[
        (
            "lib.rs",
            "// Layer leaves: facts.\npub mod a;\n// More facts, still leaves.\npub mod b;\n\
             // Layer top: the rest.\npub mod c;\n#[cfg(test)]\nmod testing;\n",
        ),
        ("a.rs", "use crate::b::X;\n"),
        ("b.rs", "pub struct X;\n"),
        ("c.rs", "use crate::{a, b};\n"),
    ]);
    assert!(upward(&k).is_empty());
    assert!(k.cycles().is_empty());
    assert_eq!(k.layers[&Vec::<String>::new()]["b"].1, "leaves");
}

#[test]
fn a_module_outside_every_declared_layer_is_refused() {
    let dir = tempfile_free::Dir::new();
    fs::write(
        dir.0.join("lib.rs"),
        "pub mod a;\n// Layer x: y.\npub mod b;\n",
    )
    .unwrap();
    fs::write(dir.0.join("a.rs"), "").unwrap();
    fs::write(dir.0.join("b.rs"), "").unwrap();
    let e = read_crate(&dir.0).unwrap_err();
    assert!(
        matches!(&e, ReadError::OutsideLayers { name, .. } if name == "a"),
        "{e}"
    );
}

#[test]
fn a_cycle_through_a_root_re_export() {
    // store -> error through `crate::StoreError`, error -> store directly: the re-export at
    // the root is followed to the module that defines the item.
    let (_d, k) = crate_of(&[
        (
            "lib.rs",
            "mod error;\nmod store;\npub use error::StoreError;\npub use store::{Batch as B};\n",
        ),
        ("error.rs", "pub struct StoreError(crate::B);\n"),
        ("store.rs", "use crate::StoreError;\npub struct Batch;\n"),
    ]);
    assert_eq!(
        names(&k.cycles()),
        vec![(
            "crate".to_owned(),
            vec!["error".to_owned(), "store".to_owned()]
        )]
    );
}

#[test]
fn a_cycle_through_a_re_export_of_a_folder() {
    let (_d, k) = crate_of(&[
        ("lib.rs", "mod m;\n"),
        (
            "m/mod.rs",
            "mod p;\nmod q;\nuse p::P;\npub(crate) use self::q::Q;\n",
        ),
        ("m/p.rs", "pub struct P(super::Q);\n"),
        ("m/q.rs", "pub struct Q(Box<super::P>);\n"),
    ]);
    assert_eq!(
        names(&k.cycles()),
        vec![("crate::m".to_owned(), vec!["p".to_owned(), "q".to_owned()])]
    );
}

#[test]
fn a_cycle_through_an_attribute() {
    let (_d, k) = crate_of(&[
        ("lib.rs", "mod error;\nmod space;\nmod codec;\n"),
        (
            "error.rs",
            "#[derive(thiserror::Error)]\npub enum E {\n    #[error(\"{}\", crate::space::human(*n))]\n    \
             NoSpace { n: u64 },\n}\n",
        ),
        (
            "space.rs",
            "pub fn human(n: u64) -> Result<(), crate::error::E> { Ok(()) }\n",
        ),
        (
            "codec.rs",
            "#[derive(Serialize)]\npub struct R {\n    #[serde(with = \"crate::space\")]\n    n: u64,\n}\n",
        ),
    ]);
    assert_eq!(
        names(&k.cycles()),
        vec![(
            "crate".to_owned(),
            vec!["error".to_owned(), "space".to_owned()]
        )]
    );
    let levels = k.levels();
    let root = &levels[&Vec::<String>::new()];
    assert_eq!(root["error"]["space"].line, 3);
    // A path in an attribute's string is an edge too.
    assert_eq!(root["codec"]["space"].line, 3);
}

/// shim-server's shape: each layer a folder, declared in lib.rs under its `// Layer` line, and
/// paths that name the folder (`crate::l2_clients::gc`). An edge up between two folders fails,
/// and a cycle among the files of one folder is found at that folder's level.
#[test]
fn layer_folders() {
    let lib = "// Layer leaves: facts.\npub mod l1_leaves;\n\n\
               // Layer clients: on the leaves.\npub mod l2_clients;\n";
    let (_d, k) = crate_of(&[
        ("lib.rs", lib),
        ("l1_leaves/mod.rs", "pub mod clock;\npub mod keys;\n"),
        (
            "l1_leaves/clock.rs",
            "pub fn now() { crate::l2_clients::gc::run() }\n",
        ),
        ("l1_leaves/keys.rs", "pub fn k() {}\n"),
        ("l2_clients/mod.rs", "pub mod gc;\npub mod pool;\n"),
        ("l2_clients/gc.rs", "pub fn run() { super::pool::take() }\n"),
        (
            "l2_clients/pool.rs",
            "use crate::l2_clients::gc;\npub fn take() {}\n",
        ),
    ]);
    assert_eq!(upward(&k), vec!["l1_leaves -> l2_clients line 1"]);
    let u = &k.upward()[0];
    assert_eq!((u.from.1.as_str(), u.to.1.as_str()), ("leaves", "clients"));
    assert_eq!(
        names(&k.cycles()),
        vec![(
            "crate::l2_clients".to_owned(),
            vec!["gc".to_owned(), "pool".to_owned()]
        )]
    );
}
