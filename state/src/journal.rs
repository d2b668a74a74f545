//! The commit journal: every commit of a [`crate::SledStore`] as one append to a small file,
//! replayed into sled when the store opens.
//!
//! Why: a sled 0.34 `flush()` seals its I/O buffer, wakes every thread of sled's I/O pool in
//! a chain (`notify_all`) and waits for the device to take the write (`sync_file_range`),
//! before the commit's own fdatasync. On the 2-CPU benchmark machine that was 0.2-0.4 ms of
//! CPU and waiting on every commit of a pod's ADD, landing beside the delegate's start and
//! the plugin's last netlink step (docs/performance.md, "Next levers" of the fifth round).
//! With the journal a commit is the sled transaction (in memory) plus one `pwrite` here:
//! that is all a process kill needs (the page cache survives it), and a commit that must
//! survive a power cut adds one fdatasync of this file. sled's own background flush writes
//! its log off the critical path, and a checkpoint ([`crate::SledStore`]) makes sled durable
//! and empties the journal once it has grown past a bound, and when the store closes.
//!
//! The file is preallocated with zeros, so that appending is overwriting within the file's
//! size: an fdatasync then writes the record's pages and flushes the device, with no
//! file-system metadata commit.
//!
//! # Format
//!
//! A sequence of records from offset 0, each
//!
//! ```text
//! magic u32 | payload length u32 | crc32 u32 (of seq and payload) | seq u64 | payload
//! payload = ops; op = kind u8 (0 put, 1 delete) | tree u8 | key length u32 | key
//!                     [| value length u32 | value]   (put only)
//! ```
//!
//! little-endian. `seq` is the store's commit number; records follow each other with
//! consecutive numbers. Reading stops at the first record that is incomplete, fails its
//! checksum or does not continue the numbering: a torn append (the process was killed inside
//! `pwrite`, or a power cut kept part of an unsynced tail), the zeros of the preallocation,
//! or leftovers of an earlier generation. Everything before that point is whole.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::store::Op;
use crate::{Batch, Tree};

/// The journal's file name in the state directory. Part of the on-disk format.
pub(crate) const JOURNAL_FILE: &str = "dipam-journal";

/// Marks the start of a record ("DPJ1"), so that zeros and stray bytes never parse as one.
const MAGIC: u32 = u32::from_le_bytes(*b"DPJ1");

/// magic, length, crc, seq.
const HEADER: usize = 4 + 4 + 4 + 8;

/// How far the journal may grow before the store checkpoints (makes sled durable and empties
/// the journal). A pod's ADD writes two records of ~1 KiB (its intent and its result), so
/// this is a checkpoint every several hundred pods, each one sled flush and two fdatasyncs:
/// cheap at that rate, and a bound on what an open has to replay.
pub(crate) const CHECKPOINT_BYTES: u64 = 2 * 1024 * 1024;

/// The size the file is preallocated to: the checkpoint bound plus room for the record that
/// crosses it. A record past the end still works; its fdatasync just also commits the size.
const PREALLOCATED: u64 = CHECKPOINT_BYTES + 256 * 1024;

/// Refuses to read a record claiming more than this (a damaged length field), instead of
/// trusting it.
const MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// One commit read back from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub seq: u64,
    pub batch: Batch,
}

/// The open journal. Appends are serialised by the caller (the store's commit lock), which is
/// also what keeps the records in commit order.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    /// Where the next record goes: the end of the records written since the last reset.
    end: u64,
    /// Bytes that may hold records of this or an earlier generation: what a reset zeroes.
    dirty: u64,
    /// Tests: the next append fails as a full disk would, after writing half its record.
    #[cfg(test)]
    pub fail_next_append: bool,
}

impl Journal {
    /// Opens (creating and preallocating if needed) the journal in `dir` and reads back its
    /// records. The caller replays what sled does not hold yet and then calls [`Journal::reset`]:
    /// until then appends would go after the records read.
    pub fn open(dir: &Path) -> io::Result<(Self, Vec<Entry>)> {
        let path = dir.join(JOURNAL_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let bytes = std::fs::read(&path)?;
        let (entries, end) = parse(&bytes);
        // A reset must zero every byte that could still look like a record: leftovers of an
        // earlier generation behind the records read, or a torn append.
        let dirty = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        let mut journal = Self {
            path,
            file,
            end: end as u64,
            dirty: dirty.max(end) as u64,
            #[cfg(test)]
            fail_next_append: false,
        };
        if bytes.len() < PREALLOCATED as usize {
            journal.preallocate(bytes.len() as u64)?;
        }
        Ok((journal, entries))
    }

    /// Writes zeros from `from` to the preallocated size and makes them durable, with the
    /// file's new size (once per state directory, normally).
    fn preallocate(&mut self, from: u64) -> io::Result<()> {
        let zeros = vec![0u8; (PREALLOCATED - from) as usize];
        self.file.write_all_at(&zeros, from)?;
        self.file.sync_all()?;
        // A new file's directory entry must be durable before a commit relies on the file.
        File::open(self.path.parent().unwrap_or(Path::new(".")))?.sync_all()
    }

    /// A second handle on the file, to fdatasync it without holding the commit lock.
    pub fn sync_handle(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Bytes of records since the last reset.
    pub fn len(&self) -> u64 {
        self.end
    }

    /// True when the file may hold records: a [`Journal::reset`] has something to do.
    pub fn is_dirty(&self) -> bool {
        self.dirty > 0
    }

    /// Appends commit `seq`. In the page cache when it returns: it survives the process being
    /// killed; [`File::sync_data`] on [`Journal::sync_handle`] makes it survive a power cut.
    ///
    /// After an error part of the record may be in the file, and a record behind it would
    /// never be read back: the caller stops using this journal (the store falls back to
    /// sled's own flush until it is reopened).
    pub fn append(&mut self, seq: u64, batch: &Batch) -> io::Result<()> {
        let record = encode(seq, batch);
        let at = self.end;
        self.end += record.len() as u64;
        self.dirty = self.dirty.max(self.end);
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_append) {
            self.file.write_all_at(&record[..record.len() / 2], at)?;
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        self.file.write_all_at(&record, at)
    }

    /// Forgets every record: zeroes what records were written and makes that durable, then
    /// appends start again at offset 0. Only once sled holds every journaled commit durably
    /// (a checkpoint): from then on the journal has nothing sled lacks.
    ///
    /// Zeroing, not just rewinding, so that an open never finds old records to replay onto a
    /// sled log that lost data of its own: a damaged store is refused (the witness), not
    /// patched up from a journal of another time.
    pub fn reset(&mut self) -> io::Result<()> {
        if self.dirty > 0 {
            let zeros = vec![0u8; self.dirty as usize];
            self.file.write_all_at(&zeros, 0)?;
            self.file.sync_data()?;
        }
        self.end = 0;
        self.dirty = 0;
        Ok(())
    }
}

/// The records in the journal of `dir`, without opening it for writing (tests look at what
/// a killed process left).
#[cfg(test)]
pub(crate) fn read(dir: &Path) -> Vec<Entry> {
    std::fs::read(dir.join(JOURNAL_FILE)).map_or_else(|_| Vec::new(), |b| parse(&b).0)
}

/// The bytes of one record.
fn encode(seq: u64, batch: &Batch) -> Vec<u8> {
    let mut payload = Vec::new();
    for op in batch.ops() {
        match op {
            Op::Put { tree, key, value } => {
                payload.push(0);
                payload.push(tree.index() as u8);
                put_bytes(&mut payload, key);
                put_bytes(&mut payload, value);
            }
            Op::Delete { tree, key } => {
                payload.push(1);
                payload.push(tree.index() as u8);
                put_bytes(&mut payload, key);
            }
        }
    }
    let mut record = Vec::with_capacity(HEADER + payload.len());
    record.extend_from_slice(&MAGIC.to_le_bytes());
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&checksum(seq, &payload).to_le_bytes());
    record.extend_from_slice(&seq.to_le_bytes());
    record.extend_from_slice(&payload);
    record
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The whole records at the start of `bytes`, numbered consecutively, and where they end.
fn parse(bytes: &[u8]) -> (Vec<Entry>, usize) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut at = 0;
    while let Some((entry, len)) = parse_one(&bytes[at..]) {
        if entries.last().is_some_and(|prev| entry.seq != prev.seq + 1) {
            break;
        }
        entries.push(entry);
        at += len;
    }
    (entries, at)
}

/// One record at the start of `bytes`, and its length.
fn parse_one(bytes: &[u8]) -> Option<(Entry, usize)> {
    let mut r = Reader(bytes);
    if r.u32()? != MAGIC {
        return None;
    }
    let len = r.u32()? as usize;
    let crc = r.u32()?;
    let seq = r.u64()?;
    if len > MAX_PAYLOAD {
        return None;
    }
    let payload = r.take(len)?;
    if checksum(seq, payload) != crc {
        return None;
    }
    Some((
        Entry {
            seq,
            batch: decode(payload)?,
        },
        HEADER + len,
    ))
}

fn decode(payload: &[u8]) -> Option<Batch> {
    let mut r = Reader(payload);
    let mut batch = Batch::new();
    while !r.0.is_empty() {
        let kind = r.u8()?;
        let tree = Tree::from_index(r.u8()?)?;
        let key = r.bytes()?;
        match kind {
            0 => {
                let value = r.bytes()?;
                batch.put(tree, key, value);
            }
            1 => {
                batch.delete(tree, key);
            }
            _ => return None,
        }
    }
    Some(batch)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        self.take(n).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(i: u8) -> Batch {
        let mut b = Batch::new();
        b.put(Tree::Attachments, vec![b'k', i], vec![i; 3 + i as usize])
            .delete(Tree::History, vec![b'h', i])
            .put(Tree::Meta, b"m".to_vec(), Vec::new());
        b
    }

    fn records(range: std::ops::Range<u64>) -> Vec<u8> {
        range.flat_map(|s| encode(s, &batch(s as u8))).collect()
    }

    fn seqs(bytes: &[u8]) -> Vec<u64> {
        parse(bytes).0.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn records_round_trip() {
        let bytes = records(5..9);
        let (entries, end) = parse(&bytes);
        assert_eq!(end, bytes.len());
        assert_eq!(entries.len(), 4);
        for e in entries {
            assert_eq!(e.batch, batch(e.seq as u8));
        }
    }

    #[test]
    fn reading_stops_at_a_torn_record() {
        let whole = records(1..4);
        let third = encode(3, &batch(3)).len();
        // Every cut inside the last record: the first two stay, the third is never half-read.
        for cut in whole.len() - third..whole.len() {
            assert_eq!(seqs(&whole[..cut]), [1, 2], "cut at {cut}");
        }
    }

    #[test]
    fn reading_stops_at_damage_and_at_zeros() {
        let mut bytes = records(1..5);
        let second = encode(1, &batch(1)).len();
        bytes[second + HEADER + 2] ^= 0x40; // a payload byte of record 2
        assert_eq!(seqs(&bytes), [1]);

        let mut bytes = records(1..3);
        bytes.extend_from_slice(&[0; 4096]);
        let (entries, end) = parse(&bytes);
        assert_eq!(entries.len(), 2);
        assert_eq!(end, bytes.len() - 4096);
        assert!(parse(&[0; 64]).0.is_empty());
    }

    #[test]
    fn reading_stops_where_the_numbering_breaks() {
        // Leftovers of an earlier generation behind the newest records: never read as newer.
        let mut bytes = records(10..12);
        bytes.extend(records(3..6));
        assert_eq!(seqs(&bytes), [10, 11]);
        // A gap.
        let mut bytes = records(1..3);
        bytes.extend(records(4..5));
        assert_eq!(seqs(&bytes), [1, 2]);
    }

    #[test]
    fn a_damaged_length_is_not_trusted() {
        let mut bytes = records(1..2);
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(seqs(&bytes).is_empty());
    }

    #[test]
    fn appends_read_back_and_reset_forgets_them() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, entries) = Journal::open(dir.path()).unwrap();
        assert!(entries.is_empty());
        assert_eq!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE))
                .unwrap()
                .len(),
            PREALLOCATED,
            "preallocated"
        );
        for s in 1..=3 {
            j.append(s, &batch(s as u8)).unwrap();
        }
        let (mut j, entries) = Journal::open(dir.path()).unwrap();
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(entries[2].batch, batch(3));
        j.reset().unwrap();
        j.append(4, &batch(4)).unwrap();
        // After a reset only the new generation is there, from offset 0.
        let (_, entries) = Journal::open(dir.path()).unwrap();
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
        assert_eq!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE))
                .unwrap()
                .len(),
            PREALLOCATED
        );
    }
}
