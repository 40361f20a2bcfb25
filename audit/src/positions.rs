//! `records.idx`: where each record's line starts in `records.jsonl` — the
//! file backend's index by sequence number, instead of a second copy of
//! every record in sled.
//!
//! # Format
//!
//! Fixed-width entries, entry `seq - 1` at byte `(seq - 1) × 16`:
//! `offset: u64 LE` (the line's first byte in the log), `len: u32 LE` (the
//! line without its newline), `crc: u32 LE` (CRC-32 of `seq ‖ offset ‖ len`,
//! little-endian). All zeros: no record at that seq (a gap `verify` names).
//! A CRC that does not match is damage, reported by the read that meets it.
//!
//! # Durability and recovery
//!
//! The log is the durability point; this file is derived from it and never
//! synced on the append path. The index thread writes a group's entries
//! (one `pwrite`) before it answers the group's callers, and about once a
//! second (and at a clean close) fdatasyncs the file and records the
//! checkpoint — the seq up to which entries are synced and sled's other
//! trees are filled — in sled (`index.rs`). An open rewrites every entry
//! past the checkpoint from the log's lines (idempotent) and cuts entries
//! past the log's last record, so a crash, a power loss that left unsynced
//! pages stale, or a log cut at a torn line leaves no entry that points at
//! the wrong bytes. A store without the file (written before it existed)
//! gets one built from its whole log at its first open.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::AuditError;
use super::log::{io, open_rw};

/// The file's name inside the data dir.
pub const IDX_FILE: &str = "records.idx";

const ENTRY: u64 = 16;

/// Entries read at a time by a walk over the whole file.
const CHUNK_ENTRIES: u64 = 4096;

/// A record's line: where it starts in the log and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub offset: u64,
    pub len: u32,
}

fn crc(seq: u64, p: Position) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&p.offset.to_le_bytes());
    h.update(&p.len.to_le_bytes());
    h.finalize()
}

fn encode(seq: u64, p: Position, out: &mut Vec<u8>) {
    out.extend_from_slice(&p.offset.to_le_bytes());
    out.extend_from_slice(&p.len.to_le_bytes());
    out.extend_from_slice(&crc(seq, p).to_le_bytes());
}

/// What one entry says.
enum Entry {
    Empty,
    At(Position),
    Damaged,
}

fn decode(seq: u64, b: &[u8]) -> Entry {
    if b.iter().all(|x| *x == 0) {
        return Entry::Empty;
    }
    let offset = u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    let len = u32::from_le_bytes(b[8..12].try_into().unwrap_or([0; 4]));
    let stored = u32::from_le_bytes(b[12..16].try_into().unwrap_or([0; 4]));
    let p = Position { offset, len };
    if crc(seq, p) == stored { Entry::At(p) } else { Entry::Damaged }
}

/// The open index and a read handle on the log it points into.
pub struct Positions {
    idx: File,
    log: File,
    path: PathBuf,
    log_path: PathBuf,
    /// Entries in the file: the highest seq it has a slot for.
    count: AtomicU64,
}

impl Positions {
    /// Open (or create) the index in `dir`, on the log there.
    pub fn open(dir: &Path) -> Result<Positions, AuditError> {
        let path = dir.join(IDX_FILE);
        let log_path = dir.join(super::LOG_FILE);
        let idx = open_rw(&path)?;
        let log =
            OpenOptions::new().create(true).read(true).append(true).open(&log_path).map_err(|e| io(&log_path, e))?;
        let len = idx.metadata().map_err(|e| io(&path, e))?.len();
        Ok(Positions { idx, log, path, log_path, count: AtomicU64::new(len / ENTRY) })
    }

    /// Open the index in `dir` only to read (`verify` on a stopped store),
    /// seeing no entry past `max_seq` (entries past the checkpoint may be
    /// stale after a power loss, until an open rewrites them).
    pub fn open_read_only(dir: &Path, max_seq: u64) -> Result<Positions, AuditError> {
        let path = dir.join(IDX_FILE);
        let log_path = dir.join(super::LOG_FILE);
        let idx = File::open(&path).map_err(|e| io(&path, e))?;
        let log = File::open(&log_path).map_err(|e| io(&log_path, e))?;
        let len = idx.metadata().map_err(|e| io(&path, e))?.len();
        Ok(Positions { idx, log, path, log_path, count: AtomicU64::new((len / ENTRY).min(max_seq)) })
    }

    /// The log this index points into.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The highest seq with a slot (its entry may be empty).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Write the entries of consecutive records from `first_seq` on.
    pub fn put(&self, first_seq: u64, positions: &[Position]) -> Result<(), AuditError> {
        if positions.is_empty() || first_seq == 0 {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(positions.len() * ENTRY as usize);
        for (i, p) in positions.iter().enumerate() {
            encode(first_seq + i as u64, *p, &mut buf);
        }
        self.idx.write_all_at(&buf, (first_seq - 1) * ENTRY).map_err(|e| io(&self.path, e))?;
        self.count.fetch_max(first_seq - 1 + positions.len() as u64, Ordering::SeqCst);
        Ok(())
    }

    /// Entries past `seq` go (the log was cut there, or holds no more).
    pub fn cut_after(&self, seq: u64) -> Result<(), AuditError> {
        if self.count() > seq {
            self.idx.set_len(seq * ENTRY).map_err(|e| io(&self.path, e))?;
            self.count.store(seq, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Make every entry written so far durable.
    pub fn sync(&self) -> Result<(), AuditError> {
        self.idx.sync_data().map_err(|e| io(&self.path, e))
    }

    fn line(&self, seq: u64, p: Position) -> Result<Vec<u8>, AuditError> {
        let mut b = vec![0u8; p.len as usize];
        self.log.read_exact_at(&mut b, p.offset).map_err(|e| {
            AuditError::Read(format!(
                "record {seq}: {} says it is at byte {} of {} ({} bytes), which cannot be read: {e}; \
                 remove {} and open the store again to rebuild it from the log",
                IDX_FILE,
                p.offset,
                self.log_path.display(),
                p.len,
                self.path.display()
            ))
        })?;
        Ok(b)
    }

    fn damaged(&self, seq: u64) -> AuditError {
        AuditError::Read(format!(
            "record {seq}: its entry in {} is damaged (checksum mismatch); remove the file and open the store again \
             to rebuild it from {}",
            self.path.display(),
            self.log_path.display()
        ))
    }

    /// Where record `seq`'s line is, or `None` when it has no entry.
    pub fn position(&self, seq: u64) -> Result<Option<Position>, AuditError> {
        if seq == 0 || seq > self.count() {
            return Ok(None);
        }
        let mut b = [0u8; ENTRY as usize];
        self.idx
            .read_exact_at(&mut b, (seq - 1) * ENTRY)
            .map_err(|e| AuditError::Read(format!("{}: {e}", self.path.display())))?;
        match decode(seq, &b) {
            Entry::Empty => Ok(None),
            Entry::At(p) => Ok(Some(p)),
            Entry::Damaged => Err(self.damaged(seq)),
        }
    }

    /// The stored bytes of record `seq` (its line), or `None` when it has
    /// no entry.
    pub fn get(&self, seq: u64) -> Result<Option<Vec<u8>>, AuditError> {
        match self.position(seq)? {
            Some(p) => self.line(seq, p).map(Some),
            None => Ok(None),
        }
    }

    /// Whether the log is long enough to hold record `seq`'s line (false:
    /// the log was cut or replaced outside nightshift).
    pub fn log_holds(&self, seq: u64) -> Result<bool, AuditError> {
        let len = self.log.metadata().map_err(|e| io(&self.log_path, e))?.len();
        Ok(self.position(seq)?.is_none_or(|p| p.offset + p.len as u64 <= len))
    }

    /// Tests only: no entry for `seq`.
    pub(crate) fn clear_for_tests(&self, seq: u64) -> Result<(), AuditError> {
        self.idx.write_all_at(&[0u8; ENTRY as usize], (seq - 1) * ENTRY).map_err(|e| io(&self.path, e))
    }

    /// The seqs that have an entry, in `from..=to`, in order (newest first
    /// with `rev`), read a chunk of entries at a time.
    pub fn seqs(&self, from: u64, to: u64, rev: bool) -> SeqIter<'_> {
        let to = to.min(self.count());
        let from = from.max(1);
        SeqIter { p: self, lo: from, hi: to, rev, buf: Vec::new(), buf_first: 0 }
    }

    /// Build every entry again from the log's lines (a record's line
    /// starts with `{"seq":`; summary lines and NUL room are skipped).
    /// Returns the log's last seq.
    pub fn rebuild(&self) -> Result<u64, AuditError> {
        self.cut_after(0)?;
        let len = self.log.metadata().map_err(|e| io(&self.log_path, e))?.len();
        let mut at = 0;
        let mut chunk = vec![0u8; 1 << 20];
        let mut carry: Vec<u8> = Vec::new();
        let mut line_start = at;
        let mut last = 0;
        let mut batch: Vec<Position> = Vec::new();
        let mut batch_first = 0u64;
        while at < len {
            let n = ((len - at) as usize).min(chunk.len());
            self.log.read_exact_at(&mut chunk[..n], at).map_err(|e| io(&self.log_path, e))?;
            let mut start = 0usize;
            for (i, b) in chunk[..n].iter().enumerate() {
                if *b != b'\n' {
                    continue;
                }
                carry.extend_from_slice(&chunk[start..i]);
                // A later line for the same seq (one written after a damaged
                // one) takes its slot.
                if let Some(seq) = record_line_seq(&carry)
                    && seq > 0
                {
                    let p = Position { offset: line_start, len: carry.len() as u32 };
                    if batch.is_empty() || batch_first + batch.len() as u64 != seq {
                        self.put(batch_first, &batch)?;
                        batch.clear();
                        batch_first = seq;
                    }
                    batch.push(p);
                    last = last.max(seq);
                }
                carry.clear();
                start = i + 1;
                line_start = at + start as u64;
            }
            carry.extend_from_slice(&chunk[start..n]);
            at += n as u64;
        }
        self.put(batch_first, &batch)?;
        self.cut_after(last)?;
        Ok(last)
    }
}

/// The seq a record line says it has (`{"seq":N,` — how every record is
/// serialized), or `None` for a summary line, NUL room or anything else.
fn record_line_seq(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(b"{\"seq\":")?;
    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// [`Positions::seqs`].
pub struct SeqIter<'a> {
    p: &'a Positions,
    lo: u64,
    hi: u64,
    rev: bool,
    /// Entries `buf_first ..` as read.
    buf: Vec<u8>,
    buf_first: u64,
}

impl Iterator for SeqIter<'_> {
    type Item = Result<u64, AuditError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.lo <= self.hi {
            let seq = if self.rev { self.hi } else { self.lo };
            if self.rev {
                self.hi -= 1;
            } else {
                self.lo += 1;
            }
            let have = seq >= self.buf_first && seq < self.buf_first + self.buf.len() as u64 / ENTRY;
            if !have {
                let first = if self.rev { seq.saturating_sub(CHUNK_ENTRIES - 1).max(1) } else { seq };
                let last = if self.rev { seq } else { (seq + CHUNK_ENTRIES - 1).min(self.p.count()) };
                let mut b = vec![0u8; ((last - first + 1) * ENTRY) as usize];
                if let Err(e) = self.p.idx.read_exact_at(&mut b, (first - 1) * ENTRY) {
                    self.lo = self.hi + 1;
                    return Some(Err(AuditError::Read(format!("{}: {e}", self.p.path.display()))));
                }
                self.buf = b;
                self.buf_first = first;
            }
            let i = ((seq - self.buf_first) * ENTRY) as usize;
            match decode(seq, &self.buf[i..i + ENTRY as usize]) {
                Entry::Empty => continue,
                Entry::At(_) => return Some(Ok(seq)),
                Entry::Damaged => return Some(Err(self.p.damaged(seq))),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with(dir: &Path, lines: &[&str]) {
        let mut s = String::new();
        for l in lines {
            s.push_str(l);
            s.push('\n');
        }
        std::fs::write(dir.join(super::super::LOG_FILE), s).unwrap();
    }

    #[test]
    fn rebuilt_entries_point_at_each_record_line() {
        let dir = tempfile::tempdir().unwrap();
        log_with(
            dir.path(),
            &[
                r#"{"seq":1,"a":1}"#,
                r#"{"summary_of":1,"summary":"{}"}"#,
                r#"{"seq":2,"a":22}"#,
                r#"{"seq":3,"a":333}"#,
            ],
        );
        let p = Positions::open(dir.path()).unwrap();
        assert_eq!(p.rebuild().unwrap(), 3);
        assert_eq!(p.get(2).unwrap().unwrap(), br#"{"seq":2,"a":22}"#);
        assert_eq!(p.get(3).unwrap().unwrap(), br#"{"seq":3,"a":333}"#);
        assert_eq!(p.get(4).unwrap(), None);
        assert_eq!(p.seqs(1, 10, true).collect::<Result<Vec<_>, _>>().unwrap(), vec![3, 2, 1]);
    }

    #[test]
    fn a_gap_is_no_entry_and_a_stale_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        log_with(dir.path(), &[r#"{"seq":1}"#, r#"{"seq":2}"#, r#"{"seq":3}"#]);
        let p = Positions::open(dir.path()).unwrap();
        p.rebuild().unwrap();
        // An entry for 5, past the log; then the log loses record 2.
        p.put(5, &[Position { offset: 0, len: 9 }]).unwrap();
        assert_eq!(p.count(), 5);
        log_with(dir.path(), &[r#"{"seq":1}"#, r#"{"seq":3}"#]);
        assert_eq!(p.rebuild().unwrap(), 3);
        assert_eq!(p.get(2).unwrap(), None);
        assert_eq!(p.count(), 3, "the entry for 5, past the log, is cut");
        assert_eq!(p.seqs(1, 3, false).collect::<Result<Vec<_>, _>>().unwrap(), vec![1, 3]);
    }

    #[test]
    fn a_damaged_entry_is_named_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        log_with(dir.path(), &[r#"{"seq":1}"#, r#"{"seq":2}"#]);
        let p = Positions::open(dir.path()).unwrap();
        p.rebuild().unwrap();
        p.idx.write_all_at(&[0xff], ENTRY + 3).unwrap();
        let e = p.get(2).unwrap_err().to_string();
        assert!(e.contains("record 2: its entry in") && e.contains("checksum mismatch"), "{e}");
        assert!(p.seqs(1, 2, false).any(|r| r.is_err()));
    }
}
