//! Large values kept out of sled's blob files: a value over [`INLINE_MAX`] is written as
//! [`CHUNK`]-byte pieces in a tree of their own, and its key holds a small stub naming them.
//!
//! Why: sled 0.34 writes a page larger than a quarter of its 512 KiB segment as a separate
//! blob file, and a blob write that fails (a full disk) returns from inside a log
//! reservation it never releases. That log buffer is then never written, so every later
//! flush, and the drop of the database, waits for it forever: dipamd wedged for good after a
//! full disk with 400 kB network configs in its records (docs/cfp.md §7.5). A page is one
//! tree node, and a leaf node splits past 16 entries, so no page can reach the blob
//! threshold (~128 KiB) when no value is larger than [`INLINE_MAX`]: 17 entries of 4 KiB and
//! their keys stay under half of it. What is stored in sled is therefore never a blob, and a
//! full disk fails its writes the ordinary way, which the store recovers from.
//!
//! The stub names the commit that wrote the value and the value's place in that commit, so
//! that the pieces of two versions of a key never share a name: a reader that meets a stub
//! whose pieces were replaced meanwhile finds them missing and reads again ([`Torn`]).

use crate::store::Op;

/// The largest value stored inline; larger ones are cut in pieces.
pub const INLINE_MAX: usize = 4096;
/// The size of a piece.
pub const CHUNK: usize = 4096;
/// The name of sled's tree of pieces.
pub const TREE: &str = "dipam_chunks";

/// How a stub starts. No JSON document, decimal string or big-endian counter starts with a
/// NUL, and a value that does anyway is stored in pieces too, so a stub is never ambiguous.
const MAGIC: &[u8] = b"\0dipam-chunked\0";
const STUB_LEN: usize = MAGIC.len() + 8 + 4 + 4 + 8;

/// Where a value's pieces are: the commit (`seq`) and the op within it that wrote it, how
/// many pieces, and the value's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stub {
    seq: u64,
    op: u32,
    pieces: u32,
    len: u64,
}

/// A stub whose pieces are not all there (replaced while being read): read again.
#[derive(Debug)]
pub struct Torn;

impl Stub {
    /// The stub `value` is, if it is one.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let rest = value.strip_prefix(MAGIC)?;
        if rest.len() != STUB_LEN - MAGIC.len() {
            return None;
        }
        let (seq, rest) = rest.split_at(8);
        let (op, rest) = rest.split_at(4);
        let (pieces, len) = rest.split_at(4);
        Some(Self {
            seq: u64::from_be_bytes(seq.try_into().ok()?),
            op: u32::from_be_bytes(op.try_into().ok()?),
            pieces: u32::from_be_bytes(pieces.try_into().ok()?),
            len: u64::from_be_bytes(len.try_into().ok()?),
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(STUB_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.op.to_be_bytes());
        out.extend_from_slice(&self.pieces.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
        out
    }

    /// The key of piece `i` in [`TREE`].
    fn piece_key(&self, i: u32) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&self.seq.to_be_bytes());
        k[8..12].copy_from_slice(&self.op.to_be_bytes());
        k[12..].copy_from_slice(&i.to_be_bytes());
        k
    }

    /// The keys of every piece.
    pub fn piece_keys(&self) -> impl Iterator<Item = [u8; 16]> + '_ {
        (0..self.pieces).map(|i| self.piece_key(i))
    }

    /// The value, from its pieces as `get` finds them.
    pub fn assemble<E>(
        &self,
        mut get: impl FnMut(&[u8]) -> Result<Option<sled::IVec>, E>,
    ) -> Result<Result<Vec<u8>, Torn>, E> {
        let mut out = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
        for key in self.piece_keys() {
            match get(&key)? {
                Some(piece) => out.extend_from_slice(&piece),
                None => return Ok(Err(Torn)),
            }
        }
        Ok(if out.len() as u64 == self.len {
            Ok(out)
        } else {
            Err(Torn)
        })
    }
}

/// Whether `value` is stored in pieces.
fn cut(value: &[u8]) -> bool {
    value.len() > INLINE_MAX || value.starts_with(MAGIC)
}

/// Writes the ops of commit `seq` into the transactional views `txs` (indexed by
/// `Tree::index`) and `pieces` (the [`TREE`] view): large values in pieces, and the pieces of
/// every value they replace or delete removed.
pub fn write(
    txs: &[sled::transaction::TransactionalTree],
    pieces: &sled::transaction::TransactionalTree,
    ops: &[Op],
    seq: u64,
) -> Result<(), sled::transaction::UnabortableTransactionError> {
    for (i, op) in ops.iter().enumerate() {
        let (tree, key) = match op {
            Op::Put { tree, key, .. } | Op::Delete { tree, key } => (tree, key),
        };
        let tx = &txs[tree.index()];
        if let Some(old) = tx.get(key.as_slice())?.as_deref().and_then(Stub::parse) {
            for k in old.piece_keys() {
                pieces.remove(&k[..])?;
            }
        }
        match op {
            Op::Put { value, .. } if cut(value) => {
                let stub = Stub {
                    seq,
                    op: u32::try_from(i).unwrap_or(u32::MAX),
                    pieces: u32::try_from(value.len().div_ceil(CHUNK)).unwrap_or(u32::MAX),
                    len: value.len() as u64,
                };
                for (k, piece) in stub.piece_keys().zip(value.chunks(CHUNK)) {
                    pieces.insert(&k[..], piece)?;
                }
                tx.insert(key.as_slice(), stub.encode())?;
            }
            Op::Put { value, .. } => {
                tx.insert(key.as_slice(), value.as_slice())?;
            }
            Op::Delete { .. } => {
                tx.remove(key.as_slice())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Batch, Store, StoreError, Tree, sled_store::SledStore, suite::sled_only::SmallFs};

    /// A network config of the size that wedged dipamd (400 kB), distinct per `i`.
    fn large(i: usize) -> String {
        format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(400_000))
    }

    fn put(store: &SledStore, tree: Tree, key: &str, value: &str) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        batch.put(tree, key, value);
        store.commit(batch)
    }

    /// The files sled wrote out of line: none, ever.
    fn blobs(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("blobs")).map_or(0, |d| d.count())
    }

    #[test]
    fn a_stub_round_trips_and_nothing_else_parses_as_one() {
        let stub = Stub {
            seq: 7,
            op: 2,
            pieces: 100,
            len: 400_000,
        };
        assert_eq!(Stub::parse(&stub.encode()), Some(stub));
        assert_eq!(Stub::parse(b"{\"a\":1}"), None);
        assert_eq!(Stub::parse(MAGIC), None);
        assert!(
            cut(MAGIC),
            "a value that looks like a stub must be stored in pieces"
        );
        assert!(!cut(&[b'x'; INLINE_MAX]));
        assert!(cut(&[b'x'; INLINE_MAX + 1]));
        let keys: Vec<_> = stub.piece_keys().collect();
        assert_eq!(keys.len(), 100);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }

    /// Large values read back whole, before and after sled has them and across a reopen;
    /// sled never writes a blob for them; overwriting or deleting one leaves no piece behind.
    #[test]
    fn large_values_round_trip_in_pieces_and_never_as_blobs() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            for i in 0..20 {
                put(&store, Tree::History, &format!("h{i:02}"), &large(i)).unwrap();
            }
            put(&store, Tree::Attachments, "a", &large(99)).unwrap();
            put(&store, Tree::Attachments, "tiny", "{}").unwrap();
            assert_eq!(
                store.get(Tree::History, b"h07").unwrap(),
                Some(large(7).into_bytes())
            );
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(
                store.get(Tree::History, b"h07").unwrap(),
                Some(large(7).into_bytes()),
                "read back wrong once the applier wrote it into sled"
            );
            let all = store.scan_prefix(Tree::History, b"h").unwrap();
            assert_eq!(all.len(), 20);
            assert!(
                all.iter()
                    .enumerate()
                    .all(|(i, (_, v))| *v == large(i).into_bytes())
            );
            put(&store, Tree::Attachments, "a", "small now").unwrap();
            let mut batch = Batch::new();
            for i in 0..20 {
                batch.delete(Tree::History, format!("h{i:02}"));
            }
            store.commit(batch).unwrap();
        }
        assert_eq!(blobs(dir.path()), 0, "sled wrote a blob");
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(
            store.get(Tree::Attachments, b"a").unwrap(),
            Some(b"small now".to_vec())
        );
        assert_eq!(store.len(Tree::History).unwrap(), 0);
        put(&store, Tree::Attachments, "b", &large(5)).unwrap();
        drop(store);
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(
            store.get(Tree::Attachments, b"b").unwrap(),
            Some(large(5).into_bytes())
        );
        drop(store);
        // sled's I/O pool may hold the file's lock a moment after the store closed (the
        // store's own open retries for the same reason).
        let until = Instant::now() + Duration::from_secs(5);
        let db = loop {
            match sled::open(dir.path()) {
                Ok(db) => break db,
                Err(e) if Instant::now() < until => {
                    eprintln!("sled still locked: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let pieces = db.open_tree(TREE).unwrap().len();
        assert_eq!(pieces, large(5).len().div_ceil(CHUNK), "pieces left behind");
    }

    /// A full disk while 400 kB values are committed, three times over: the store faults,
    /// reads and commits answer (an error, never a hang), and within 5 s of space returning
    /// it takes commits again by itself, having lost nothing it acknowledged. Before values
    /// were cut in pieces, sled's failed blob write made its flush and its close wait
    /// forever, and the reopen held every lock while it waited.
    #[test]
    fn a_full_disk_with_large_values_recovers_within_seconds() {
        let Some(fs) = SmallFs::mount(48 * 1024 * 1024) else {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        };
        let dir = fs.path().join("state");
        let store = SledStore::open(&dir).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut acked = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..3 {
                    let filler = fs.fill();
                    let mut i = 0;
                    loop {
                        let key = format!("r{round}-{i:04}");
                        match put(&store, Tree::History, &key, &large(i)) {
                            Ok(()) => acked.push((key, i)),
                            Err(e) => {
                                assert!(e.is_disk_full() || store.fault().is_some(), "{e}");
                                break;
                            }
                        }
                        i += 1;
                    }
                    // Reads answer while the disk is full.
                    for _ in 0..20 {
                        let _ = store.get(Tree::History, b"r0-0000");
                        let _ = store.scan_keys(Tree::History, b"");
                    }
                    std::fs::remove_file(&filler).unwrap();
                    let freed = Instant::now();
                    while store.fault().is_some() || put(&store, Tree::Meta, "probe", "1").is_err()
                    {
                        assert!(
                            freed.elapsed() < Duration::from_secs(5),
                            "round {round}: still failing 5 s after space returned: {:?}",
                            store.fault()
                        );
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    eprintln!(
                        "round {round}: serving again {:?} after space returned",
                        freed.elapsed()
                    );
                    for (key, i) in &acked {
                        let got = store.get(Tree::History, key.as_bytes()).unwrap();
                        assert!(
                            got == Some(large(*i).into_bytes()),
                            "acknowledged {key} lost"
                        );
                    }
                    // Room for the next round's values to fail again.
                    let mut batch = Batch::new();
                    for (key, _) in acked.drain(..) {
                        batch.delete(Tree::History, key);
                    }
                    store.commit(batch).unwrap();
                }
                tx.send(()).unwrap();
            });
            // A guard against a hang, not a timing.
            rx.recv_timeout(Duration::from_secs(300))
                .expect("the store hung after a full disk with large values");
        });
        assert_eq!(blobs(&dir), 0, "sled wrote a blob");
    }
}
