//! The commit journal: every commit of a [`crate::sled_store::SledStore`] as one append to a small file,
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
//! its log off the critical path, and a checkpoint ([`crate::sled_store::SledStore`]) makes sled durable
//! and empties the journal once it has grown past a bound, and when the store closes.
//!
//! Kept because it is measured: docs/performance.md, "What was done, and what each change
//! measured", row "A commit is one append to dipam's own journal" (ADD (b) 5.41 -> 5.18 ms,
//! 150 pods each). Remove it only with a run of dipam-bench that shows the gain gone.
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
//! magic u32 "DPJ2" | payload length u32 | seq u64 | head crc32 u32 (of length and seq)
//!   | body crc32 u32 (of seq and payload) | payload | end u32 "DPJe"
//! payload = ops; op = kind u8 (0 put, 1 delete) | tree u8 | key length u32 | key
//!                     [| value length u32 | value]   (put only)
//! ```
//!
//! little-endian. `seq` is the store's commit number; records follow each other with
//! consecutive numbers. Reading stops at the first record that is incomplete, fails a
//! checksum or does not continue the numbering. Everything before that point is whole.
//!
//! # What follows the last whole record
//!
//! After the last whole record the file must hold zeros (the preallocation, and what a
//! checkpoint zeroed), or one **torn append**: the prefix of a record whose header is whole
//! (its own checksum passes) and whose end marker never reached the file, followed by zeros
//! (or only a prefix of a header). That is what a write cut short leaves: the process killed
//! inside `pwrite` (Linux copies a write page by page and stops at a fatal signal), a full
//! disk past the preallocated size, or a power cut that kept part of a tail never
//! fdatasynced. None of these was acknowledged as on the disk, and a kernel-only commit cut
//! by a power cut is one the [`crate::Durability::SurvivesProcessCrash`] contract may lose.
//!
//! Anything else there (a whole-length record that fails its checksum, a header that fails
//! its own, a record that breaks the numbering, stray bytes) is **damage**: it may be a
//! commit that was acknowledged and has since been garbled, so the store cannot prove what it
//! holds, and refuses to open ([`Tail::Damaged`]). Why the end marker and the header
//! checksum: without them a record whose last payload bytes are zeros, or whose length field
//! was garbled, would look torn, and a garbled acknowledged commit would be dropped as if it
//! had never been made.
//!
//! Records written by earlier builds ("DPJ1": no head checksum, no end marker) are still
//! read; a damaged tail of them is damage.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::store::Op;
use crate::{Batch, Tree};

/// The journal's file name in the state directory. Part of the on-disk format.
pub(crate) const JOURNAL_FILE: &str = "dipam-journal";

/// Marks the start of a record ("DPJ2"), so that zeros and stray bytes never parse as one.
const MAGIC: u32 = u32::from_le_bytes(*b"DPJ2");
/// The start of a record written by builds before the end marker ("DPJ1"); read, never
/// written.
const MAGIC_V1: u32 = u32::from_le_bytes(*b"DPJ1");
/// Ends every record: a whole record's last bytes are never zeros, so a record whose end
/// reads as zeros was cut short (see the module doc).
const END: u32 = u32::from_le_bytes(*b"DPJe");

/// magic, length, seq, head crc, body crc.
const HEADER: usize = 4 + 4 + 8 + 4 + 4;
/// magic, length, crc, seq (the "DPJ1" layout).
const HEADER_V1: usize = 4 + 4 + 4 + 8;
/// The end marker.
const TRAILER: usize = 4;
/// Chunk in which a reset zeroes the file, from its end backwards (see [`Journal::reset`]).
const ZERO_CHUNK: usize = 64 * 1024;

/// How far the journal may grow before the store checkpoints (makes sled durable and empties
/// the journal). A pod's ADD writes two records of ~1 KiB (its intent and its result), so
/// this is a checkpoint every several hundred pods, each one sled flush and two fdatasyncs:
/// cheap at that rate, and a bound on what an open has to replay.
pub(crate) const CHECKPOINT_BYTES: u64 = 2 * 1024 * 1024;

/// The size the file is preallocated to: the checkpoint bound plus room for the record that
/// crosses it. A record past the end still works; its fdatasync just also commits the size.
pub(crate) const PREALLOCATED: u64 = CHECKPOINT_BYTES + 256 * 1024;

/// Refuses to read a record claiming more than this (a damaged length field), instead of
/// trusting it.
const MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// One commit read back from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub seq: u64,
    pub batch: Batch,
}

/// What the file holds after its last whole record (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Zeros only.
    Clean,
    /// One append cut short, then zeros: never acknowledged as on the disk.
    Torn {
        /// Where it starts.
        at: u64,
    },
    /// Bytes that are neither: an acknowledged commit may have been garbled.
    Damaged {
        /// Where the first bad byte is.
        at: u64,
        /// What is wrong there.
        detail: String,
    },
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
    pub fn open(dir: &Path) -> io::Result<(Self, Vec<Entry>, Tail)> {
        let path = dir.join(JOURNAL_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let bytes = std::fs::read(&path)?;
        let (entries, end) = parse(&bytes);
        let tail = tail(&bytes, end, entries.last().map(|e| e.seq));
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
        Ok((journal, entries, tail))
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
            // From the end backwards, a chunk per write: a process killed in between leaves
            // whole records, then at most one whose end is zeroed, then zeros, which reads
            // as a journal with a torn last append (records sled already holds), never as
            // damage. Zeroing from the front would leave later records behind a hole.
            let zeros = vec![0u8; ZERO_CHUNK];
            let mut to = self.dirty as usize;
            while to > 0 {
                let from = to.saturating_sub(ZERO_CHUNK);
                self.file.write_all_at(&zeros[..to - from], from as u64)?;
                to = from;
            }
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
    let len = (payload.len() as u32).to_le_bytes();
    let mut record = Vec::with_capacity(HEADER + payload.len() + TRAILER);
    record.extend_from_slice(&MAGIC.to_le_bytes());
    record.extend_from_slice(&len);
    record.extend_from_slice(&seq.to_le_bytes());
    record.extend_from_slice(&head_checksum(&len, seq).to_le_bytes());
    record.extend_from_slice(&checksum(seq, &payload).to_le_bytes());
    record.extend_from_slice(&payload);
    record.extend_from_slice(&END.to_le_bytes());
    record
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn head_checksum(len: &[u8; 4], seq: u64) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(&seq.to_le_bytes());
    h.finalize()
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The whole records at the start of `bytes`, numbered consecutively, and where they end.
pub(crate) fn parse(bytes: &[u8]) -> (Vec<Entry>, usize) {
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
    let magic = Reader(bytes).u32()?;
    if magic == MAGIC_V1 {
        return parse_v1(bytes);
    }
    let head = header(bytes)?;
    let mut r = Reader(&bytes[HEADER..]);
    let payload = r.take(head.len)?;
    let end = r.u32()?;
    if end != END || checksum(head.seq, payload) != head.body_crc {
        return None;
    }
    Some((
        Entry {
            seq: head.seq,
            batch: decode(payload)?,
        },
        HEADER + head.len + TRAILER,
    ))
}

/// A "DPJ2" header whose own checksum passes: its length and number can be trusted.
struct Header {
    len: usize,
    seq: u64,
    body_crc: u32,
}

fn header(bytes: &[u8]) -> Option<Header> {
    let mut r = Reader(bytes);
    if r.u32()? != MAGIC {
        return None;
    }
    let len: [u8; 4] = r.take(4)?.try_into().ok()?;
    let seq = r.u64()?;
    let head_crc = r.u32()?;
    let body_crc = r.u32()?;
    if head_checksum(&len, seq) != head_crc {
        return None;
    }
    let len = u32::from_le_bytes(len) as usize;
    (len <= MAX_PAYLOAD).then_some(Header { len, seq, body_crc })
}

/// A record in the "DPJ1" layout of earlier builds.
fn parse_v1(bytes: &[u8]) -> Option<(Entry, usize)> {
    let mut r = Reader(bytes);
    if r.u32()? != MAGIC_V1 {
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
        HEADER_V1 + len,
    ))
}

/// Classifies what follows the whole records, which end at `end` (the module doc says why
/// each shape is what it is). `last` is the number of the last whole record.
pub(crate) fn tail(bytes: &[u8], end: usize, last: Option<u64>) -> Tail {
    let rest = &bytes[end.min(bytes.len())..];
    let Some(z) = rest.iter().rposition(|b| *b != 0).map(|i| i + 1) else {
        return Tail::Clean;
    };
    let at = end as u64;
    let damaged = |detail: String| Tail::Damaged { at, detail };
    let magic = MAGIC.to_le_bytes();
    if z < HEADER {
        // Only part of a header was written: it must be the start of one.
        let seen = &rest[..z.min(4)];
        return if seen == &magic[..seen.len()] {
            Tail::Torn { at }
        } else {
            damaged(format!(
                "{z} byte(s) that do not start a record, after the last whole one"
            ))
        };
    }
    let Some(head) = header(rest) else {
        return damaged(format!(
            "{z} byte(s) after the last whole record, starting with no valid record header"
        ));
    };
    if last.is_some_and(|l| head.seq != l + 1) {
        return damaged(format!(
            "a record numbered #{} where #{} was due",
            head.seq,
            last.map_or(0, |l| l + 1)
        ));
    }
    let whole = HEADER + head.len + TRAILER;
    if z < whole {
        // Its end marker, at least, was never written: cut short.
        Tail::Torn { at }
    } else {
        damaged(format!(
            "record #{} is whole-length but fails its checksum or end marker{}",
            head.seq,
            if z > whole {
                ", and more bytes follow it"
            } else {
                ""
            }
        ))
    }
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
        // Every cut inside the last record, followed by the zeros of the preallocation: the
        // first two stay, the third is never half-read, and the cut reads as torn.
        for cut in whole.len() - third + 1..whole.len() {
            let mut bytes = whole[..cut].to_vec();
            bytes.extend_from_slice(&[0; 512]);
            assert_eq!(seqs(&bytes), [1, 2], "cut at {cut}");
            let (entries, end) = parse(&bytes);
            assert_eq!(
                tail(&bytes, end, entries.last().map(|e| e.seq)),
                Tail::Torn {
                    at: (whole.len() - third) as u64
                },
                "cut at {cut}"
            );
        }
        let mut bytes = whole.clone();
        bytes.extend_from_slice(&[0; 512]);
        assert_eq!(tail(&bytes, whole.len(), Some(3)), Tail::Clean);
    }

    /// A garbled byte anywhere in the last record (header, payload, end marker) is damage,
    /// never a torn append: the record may have been acknowledged.
    #[test]
    fn a_garbled_last_record_is_damage_not_a_tear() {
        let mut empty_value = Batch::new();
        // Ends in zeros before the end marker (an empty value's length): the marker, not
        // the last payload byte, is what tells whole from cut short.
        empty_value.put(Tree::Meta, b"m".to_vec(), Vec::new());
        for last in [encode(3, &batch(3)), encode(3, &empty_value)] {
            let mut whole = records(1..3);
            let start = whole.len();
            whole.extend_from_slice(&last);
            whole.extend_from_slice(&[0; 512]);
            for i in 0..last.len() {
                for flip in [0x01u8, 0x80] {
                    let mut bytes = whole.clone();
                    bytes[start + i] ^= flip;
                    let (entries, end) = parse(&bytes);
                    assert_eq!(entries.len(), 2, "byte {i} flipped");
                    match tail(&bytes, end, entries.last().map(|e| e.seq)) {
                        Tail::Damaged { at, .. } => assert_eq!(at, start as u64),
                        other => panic!("byte {i} ^ {flip:#x}: {other:?}"),
                    }
                }
            }
        }
        // A stray byte in the zeros after the last record, and a record out of sequence.
        let mut bytes = records(1..3);
        let end = bytes.len();
        bytes.extend_from_slice(&[0; 100]);
        bytes[end + 50] = 7;
        assert!(matches!(tail(&bytes, end, Some(2)), Tail::Damaged { .. }));
        let mut bytes = records(1..3);
        bytes.extend(records(5..6));
        let (entries, end) = parse(&bytes);
        assert!(matches!(
            tail(&bytes, end, entries.last().map(|e| e.seq)),
            Tail::Damaged { .. }
        ));
    }

    /// A reset interrupted at any chunk leaves whole records, at most one cut short, and
    /// zeros: never damage.
    #[test]
    fn an_interrupted_reset_reads_as_torn_never_damaged() {
        let value = vec![b'v'; 40 * 1024];
        let mut bytes = Vec::new();
        for s in 1..10u64 {
            let mut b = Batch::new();
            b.put(Tree::History, s.to_le_bytes().to_vec(), value.clone());
            bytes.extend(encode(s, &b));
        }
        let dirty = bytes.len();
        bytes.extend_from_slice(&[0; 4096]);
        // Zero from the end backwards, as reset does, stopping after each chunk.
        let mut to = dirty;
        while to > 0 {
            let from = to.saturating_sub(ZERO_CHUNK);
            bytes[from..to].fill(0);
            to = from;
            let (entries, end) = parse(&bytes);
            let t = tail(&bytes, end, entries.last().map(|e| e.seq));
            assert!(
                matches!(t, Tail::Clean | Tail::Torn { .. }),
                "zeroed down to {to}: {t:?}"
            );
        }
    }

    #[test]
    fn records_of_earlier_builds_are_read() {
        let mut b = batch(1);
        b.put(Tree::History, b"h".to_vec(), b"x".to_vec());
        let mut payload = encode(7, &b);
        // Rebuild it in the DPJ1 layout: magic | len | crc | seq | payload.
        let len = payload.len() - HEADER - TRAILER;
        let body = payload[HEADER..HEADER + len].to_vec();
        payload.clear();
        payload.extend_from_slice(&MAGIC_V1.to_le_bytes());
        payload.extend_from_slice(&(len as u32).to_le_bytes());
        payload.extend_from_slice(&checksum(7, &body).to_le_bytes());
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(&body);
        payload.extend(encode(8, &batch(8)));
        let (entries, _) = parse(&payload);
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 8]);
        assert_eq!(entries[0].batch, b);
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
        let (mut j, entries, tail) = Journal::open(dir.path()).unwrap();
        assert!(entries.is_empty());
        assert_eq!(tail, Tail::Clean);
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
        let (mut j, entries, _) = Journal::open(dir.path()).unwrap();
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(entries[2].batch, batch(3));
        j.reset().unwrap();
        j.append(4, &batch(4)).unwrap();
        // After a reset only the new generation is there, from offset 0.
        let (_, entries, tail) = Journal::open(dir.path()).unwrap();
        assert_eq!(tail, Tail::Clean);
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
        assert_eq!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE))
                .unwrap()
                .len(),
            PREALLOCATED
        );
    }
}
