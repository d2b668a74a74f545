use dipam_state::*;
use std::path::Path;
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let store = SledStore::open(Path::new(&dir)).unwrap();
    let mut i = 0u64;
    loop {
        let mut b = Batch::new();
        b.put(Tree::History, format!("k{i:08}"), vec![b'x'; 4000]);
        match store.commit(b) { Ok(()) => {}, Err(e) => { eprintln!("commit {i} failed: {e}"); break; } }
        i += 1;
        if i > 200_000 { break; }
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    for _ in 0..3 {
        let mut b = Batch::new();
        b.put(Tree::History, "after", "x");
        eprintln!("commit after: {:?}", store.commit(b).err().map(|e| e.to_string()));
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    eprintln!("get: {:?}", store.get(Tree::History, b"k00000001").map(|v| v.map(|v| v.len())));
    eprintln!("scan_keys: {:?}", store.scan_keys(Tree::Attachments, b"").map(|v| v.len()));
    eprintln!("len...");
    eprintln!("len: {:?}", store.len(Tree::History));
}
