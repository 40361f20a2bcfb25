//! The record log: every audit record as one line of JSON in
//! `records.jsonl`, and after a record that changes a run's summary, a
//! `{"summary_of": SEQ, "summary": "…"}` line with the summary's exact bytes.
//! It is the durability point: the writer appends a group of lines and
//! fdatasyncs once, then indexes them in sled (flushed in the background),
//! then acknowledges. sled is fast to query but opaque when damaged (a
//! flipped byte can stop it from opening at all); the log is plain text, so
//! `verify` can name the first damaged record by line and `salvage` can
//! rebuild a store from every record that still checks out.
//!
//! The file grows in zero-filled chunks ([`RecordLog::grow`]) so that an
//! fdatasync after an append writes the new bytes, not the file's size and
//! block map as well (about 1.7× more appends per second on ext4). A log
//! closed cleanly is cut back to its last line; after a crash its tail is
//! NUL bytes, which readers skip.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{AuditError, AuditRecord, GENESIS, VerifyReport};

/// The log's file name inside the data dir.
pub const LOG_FILE: &str = "records.jsonl";

/// The smallest zero-filled chunk the file grows by.
const MIN_CHUNK_BYTES: u64 = 1 << 20;
/// The largest.
const MAX_CHUNK_BYTES: u64 = 64 << 20;

/// Tests only: logs whose next append fails once (as a full or failing
/// disk would make it).
#[cfg(test)]
pub(super) static FAIL_NEXT_APPEND: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A line carrying the exact bytes of the run summary the record before it
/// changed (the record's `summary_sha256` vouches for them).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryLine {
    pub summary_of: u64,
    pub summary: String,
}

/// A record the log holds and sled does not (a crash after the log's
/// fdatasync and before sled's background flush): replayed into sled.
pub struct Replay {
    pub record: AuditRecord,
    /// Where its line starts in the log.
    pub offset: u64,
    pub bytes: Vec<u8>,
    pub summary: Option<Vec<u8>>,
}

/// The open log.
pub struct RecordLog {
    file: File,
    path: PathBuf,
    /// Bytes of lines written (the logical end).
    len: u64,
    /// Bytes in the file (lines plus zero-filled room).
    allocated: u64,
}

/// Open `path` to read and write, creating it when missing, never
/// truncating it (the record log, and records.idx beside it).
pub(super) fn open_rw(path: &Path) -> Result<File, AuditError> {
    OpenOptions::new().create(true).read(true).write(true).truncate(false).open(path).map_err(|e| io(path, e))
}

/// A file's I/O error, named with its path (records.idx's too).
pub(super) fn io(path: &Path, e: std::io::Error) -> AuditError {
    AuditError::Write(format!("{}: {e}", path.display()))
}

/// What a line says its position in the chain is.
fn line_seq(line: &[u8]) -> Option<u64> {
    if let Ok(r) = serde_json::from_slice::<AuditRecord>(line) {
        return Some(r.seq);
    }
    serde_json::from_slice::<SummaryLine>(line).ok().map(|s| s.summary_of)
}

/// The bytes of one record's line (and its summary's) as the writer
/// appends them.
pub fn encode_lines(buf: &mut Vec<u8>, record_bytes: &[u8], seq: u64, summary: Option<&[u8]>) {
    buf.extend_from_slice(record_bytes);
    buf.push(b'\n');
    if let Some(bytes) = summary {
        let line = SummaryLine { summary_of: seq, summary: String::from_utf8_lossy(bytes).into_owned() };
        // Serializing two plain fields cannot fail.
        if serde_json::to_writer(&mut *buf, &line).is_ok() {
            buf.push(b'\n');
        }
    }
}

/// Whether the bytes after the last line that continues the chain are a
/// torn write — the only damage an open may cut. A write cut short by a
/// crash leaves a last line without its newline; a power loss during a
/// group's write leaves pages that were never written, which read as NUL
/// bytes (the file's room is zero-filled in advance). So every line of a
/// torn tail lacks its newline (the last) or holds a NUL byte; a whole
/// line without one — an edit, an inserted or moved line, a broken record
/// with records after it — is evidence, never cut.
pub(super) fn is_torn_tail(rest: &[u8]) -> bool {
    let mut lines = rest.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        if line.is_empty() || line.contains(&0) || last {
            continue;
        }
        return false;
    }
    true
}

/// Newlines in `file` before byte `at` (so the line at `at` is that + 1).
fn count_lines_before(file: &File, at: u64) -> std::io::Result<u64> {
    let mut chunk = vec![0u8; 1 << 20];
    let (mut pos, mut n) = (0u64, 0u64);
    while pos < at {
        let step = ((at - pos) as usize).min(chunk.len());
        file.read_exact_at(&mut chunk[..step], pos)?;
        n += chunk[..step].iter().filter(|b| **b == b'\n').count() as u64;
        pos += step as u64;
    }
    Ok(n)
}

impl RecordLog {
    /// Open (or create) the log in `dir` and make it agree with the store,
    /// whose newest record is `head` with hash `head_hash`. Lines past it
    /// that continue the chain are returned to be replayed into the store.
    /// What follows them may be cut only when it is a torn write (see
    /// [`is_torn_tail`]); anything else — an edit, a broken line with whole
    /// records after it — is refused with nothing changed, naming the line
    /// and `nightshift audit salvage`. Records the log lacks (a store older
    /// than the log) are copied from `missing`.
    pub fn open(
        dir: &Path,
        head: u64,
        head_hash: &str,
        missing: impl FnOnce(u64) -> Result<Vec<AuditRecord>, AuditError>,
    ) -> Result<(RecordLog, Vec<Replay>), AuditError> {
        Self::open_with(dir, head, head_hash, missing)
    }

    /// Open the log to rebuild an index from nothing: every record is
    /// replayed from the first; the same rule for what may be cut.
    pub fn open_for_rebuild(dir: &Path) -> Result<(RecordLog, Vec<Replay>), AuditError> {
        Self::open_with(dir, 0, GENESIS, |_| Ok(Vec::new()))
    }

    fn open_with(
        dir: &Path,
        head: u64,
        head_hash: &str,
        missing: impl FnOnce(u64) -> Result<Vec<AuditRecord>, AuditError>,
    ) -> Result<(RecordLog, Vec<Replay>), AuditError> {
        let path = dir.join(LOG_FILE);
        let mut file = open_rw(&path)?;
        let allocated = file.metadata().map_err(|e| io(&path, e))?.len();
        let mut log = RecordLog {
            file: file.try_clone().map_err(|e| io(&path, e))?,
            path: path.clone(),
            len: allocated,
            allocated,
        };
        // Everything is read and judged before anything is changed: a
        // refused open leaves the file byte for byte as it was.
        let (end, torn_from) = log.logical_end(&mut file)?;
        let whole_lines = torn_from.unwrap_or(end);
        log.len = whole_lines;
        let (last_seq, end_of_head) = log.find_tail(&mut file, head)?;
        if last_seq < head {
            // Unreadable lines after the last readable one stay: they are
            // evidence `verify` names; the store's copies follow them (after
            // a torn last line is cut, so that they do not glue onto it).
            log.len = end;
            if let Some(torn) = torn_from {
                log.truncate(torn)?;
            }
            let recs = missing(last_seq)?;
            tracing::info!(log = %path.display(), records = recs.len(), "record log behind the store: copying records into it");
            log.append(&recs)?;
            return Ok((log, Vec::new()));
        }
        let (good, cut_at) =
            if last_seq > head { log.read_ahead(end_of_head, head, head_hash)? } else { (Vec::new(), end_of_head) };
        if cut_at < end {
            let mut rest = vec![0u8; (end - cut_at) as usize];
            log.file.read_exact_at(&mut rest, cut_at).map_err(|e| io(&path, e))?;
            let after = good.last().map_or(head, |r| r.record.seq);
            if !is_torn_tail(&rest) {
                return Err(log.refusal(cut_at, after, &rest));
            }
            tracing::warn!(
                log = %path.display(), at_byte = cut_at, bytes = rest.len(), after_record = after,
                "record log ends in a torn write (a write cut short, never acknowledged): cutting it"
            );
            log.truncate(cut_at)?;
        } else {
            log.len = end;
        }
        if !good.is_empty() {
            tracing::info!(log = %path.display(), records = good.len(), "record log ahead of the store: replaying its records into it");
        }
        Ok((log, good))
    }

    /// Why an open is refused: the first line past record `after` that
    /// does not continue the chain, by line number and byte, and what it is.
    fn refusal(&self, at: u64, after: u64, rest: &[u8]) -> AuditError {
        let line_no = count_lines_before(&self.file, at).map_or_else(|_| "?".to_string(), |n| (n + 1).to_string());
        let first = rest.split(|b| *b == b'\n').find(|l| !l.is_empty() && !l.iter().all(|b| *b == 0)).unwrap_or(rest);
        let what = match serde_json::from_slice::<AuditRecord>(first) {
            Ok(r) if r.compute_hash() != r.hash => {
                format!("record {} was altered: its hash does not match its content", r.seq)
            }
            Ok(r) if r.seq != after + 1 => format!("record {} where record {} belongs", r.seq, after + 1),
            Ok(r) => format!("record {} does not link to record {after}", r.seq),
            Err(e) => format!("not a readable record ({e})"),
        };
        AuditError::Open {
            path: self.path.clone(),
            message: format!(
                "expected the lines after record {after} to continue the chain (or to be one torn last write), found \
                 line {line_no} (byte {at}): {what}, with whole lines after it; nothing was changed: run `nightshift \
                 audit verify` to see the damage and `nightshift audit salvage --to NEW_DIR` to build a store beside \
                 this one from every record that checks out"
            ),
        }
    }

    /// The end of the written bytes (trailing NUL room skipped), and where
    /// the last line starts when it lacks its newline (a torn write).
    fn logical_end(&self, file: &mut File) -> Result<(u64, Option<u64>), AuditError> {
        let mut pos = self.allocated;
        // Skip the zero-filled room.
        let mut last: Option<(u64, u8)> = None;
        let mut chunk = vec![0u8; 64 * 1024];
        while pos > 0 && last.is_none() {
            let step = pos.min(chunk.len() as u64);
            pos -= step;
            let c = &mut chunk[..step as usize];
            file.read_exact_at(c, pos).map_err(|e| io(&self.path, e))?;
            if let Some(i) = c.iter().rposition(|b| *b != 0) {
                last = Some((pos + i as u64, c[i]));
            }
        }
        let Some((at, byte)) = last else { return Ok((0, None)) };
        if byte == b'\n' {
            return Ok((at + 1, None));
        }
        // Torn: find the newline before it.
        let mut pos = at + 1;
        while pos > 0 {
            let step = pos.min(chunk.len() as u64);
            pos -= step;
            let c = &mut chunk[..step as usize];
            file.read_exact_at(c, pos).map_err(|e| io(&self.path, e))?;
            if let Some(i) = c.iter().rposition(|b| *b == b'\n') {
                return Ok((at + 1, Some(pos + i as u64 + 1)));
            }
        }
        Ok((at + 1, Some(0)))
    }

    /// The seq of the last readable line, and the byte offset just after
    /// the newest line whose seq is at most `head` (0 if none is). Reads
    /// backwards in chunks, so opening costs the tail, not the file.
    fn find_tail(&self, file: &mut File, head: u64) -> Result<(u64, u64), AuditError> {
        let mut pos = self.len; // `buf` holds the bytes [pos, pos + buf.len())
        let mut buf: Vec<u8> = Vec::new();
        let mut last_seq = None;
        loop {
            let content_end = if buf.last() == Some(&b'\n') { buf.len() - 1 } else { buf.len() };
            let start = match buf[..content_end].iter().rposition(|b| *b == b'\n') {
                Some(nl) => Some(nl + 1),
                None if pos == 0 => Some(0),
                None => None,
            };
            let Some(start) = start else {
                let step = pos.min(64 * 1024);
                pos -= step;
                let mut chunk = vec![0u8; step as usize];
                file.seek(SeekFrom::Start(pos)).map_err(|e| io(&self.path, e))?;
                file.read_exact(&mut chunk).map_err(|e| io(&self.path, e))?;
                chunk.extend_from_slice(&buf);
                buf = chunk;
                continue;
            };
            // An unreadable line is skipped here (and judged by the caller).
            if let Some(seq) = line_seq(&buf[start..content_end]) {
                last_seq.get_or_insert(seq);
                if seq <= head {
                    return Ok((last_seq.unwrap_or(seq), pos + buf.len() as u64));
                }
            }
            if start == 0 && pos == 0 {
                return Ok((last_seq.unwrap_or(0), 0));
            }
            buf.truncate(start);
        }
    }

    /// The lines from byte `from` to the end that continue the chain after
    /// record `head` (hash `head_hash`), and where the first that does not
    /// starts.
    fn read_ahead(&self, from: u64, head: u64, head_hash: &str) -> Result<(Vec<Replay>, u64), AuditError> {
        let mut bytes = vec![0u8; (self.len - from) as usize];
        self.file.read_exact_at(&mut bytes, from).map_err(|e| io(&self.path, e))?;
        let (mut expected, mut prev) = (head + 1, head_hash.to_string());
        let mut out: Vec<Replay> = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let Some(nl) = bytes[at..].iter().position(|b| *b == b'\n') else { break };
            let line = &bytes[at..at + nl];
            if line.is_empty() || line.iter().all(|b| *b == 0) {
                at += nl + 1;
                continue;
            }
            match serde_json::from_slice::<AuditRecord>(line) {
                Ok(r) if r.seq == expected && r.prev_hash == prev && r.compute_hash() == r.hash => {
                    expected += 1;
                    prev = r.hash.clone();
                    out.push(Replay { record: r, offset: from + at as u64, bytes: line.to_vec(), summary: None });
                }
                Ok(_) => break,
                Err(_) => match serde_json::from_slice::<SummaryLine>(line) {
                    Ok(s) if Some(s.summary_of) == out.last().map(|r| r.record.seq) => {
                        if let Some(last) = out.last_mut() {
                            last.summary = Some(s.summary.into_bytes());
                        }
                    }
                    _ => break,
                },
            }
            at += nl + 1;
        }
        Ok((out, from + at as u64))
    }

    fn truncate(&mut self, len: u64) -> Result<(), AuditError> {
        self.file.set_len(len).map_err(|e| io(&self.path, e))?;
        self.file.sync_data().map_err(|e| io(&self.path, e))?;
        self.len = len;
        self.allocated = len;
        Ok(())
    }

    /// Make room for `more` bytes past the logical end: zero-filled, so the
    /// blocks exist and later fdatasyncs carry data only.
    fn grow(&mut self, more: u64) -> Result<(), AuditError> {
        let need = self.len + more;
        if need <= self.allocated {
            return Ok(());
        }
        let chunk = (self.allocated / 4).clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES).max(more);
        let target = self.allocated + chunk;
        let zeros = vec![0u8; MIN_CHUNK_BYTES as usize];
        let mut at = self.allocated;
        while at < target {
            let n = (target - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at).map_err(|e| io(&self.path, e))?;
            at += n as u64;
        }
        self.allocated = target;
        Ok(())
    }

    /// Bytes of lines written: where the next append starts.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Append lines (whole ones, each ending in a newline) and make them
    /// durable with one fdatasync.
    pub fn append_bytes(&mut self, buf: &[u8]) -> Result<(), AuditError> {
        if buf.is_empty() {
            return Ok(());
        }
        #[cfg(test)]
        {
            let mut fail = FAIL_NEXT_APPEND.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = fail.iter().position(|p| p == &self.path) {
                fail.remove(i);
                return Err(io(&self.path, std::io::Error::other("injected write failure")));
            }
        }
        self.grow(buf.len() as u64)?;
        let written = self.file.write_all_at(buf, self.len).and_then(|_| self.file.sync_data());
        if let Err(e) = written {
            // Leave no half batch behind.
            let _ = self.file.write_all_at(&vec![0u8; buf.len()], self.len);
            return Err(io(&self.path, e));
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Append records (without summaries) and make them durable.
    pub fn append(&mut self, recs: &[AuditRecord]) -> Result<(), AuditError> {
        let mut buf = Vec::with_capacity(recs.len() * 512);
        for r in recs {
            let bytes = serde_json::to_vec(r).map_err(|e| AuditError::Write(e.to_string()))?;
            encode_lines(&mut buf, &bytes, r.seq, None);
        }
        self.append_bytes(&buf)
    }

    /// A clean close: give back the zero-filled room.
    pub fn close(&mut self) -> Result<(), AuditError> {
        if self.allocated > self.len {
            self.truncate(self.len)?;
        }
        Ok(())
    }
}

/// One line of a log read for `verify` or `salvage`.
#[derive(Debug)]
pub enum LogLine {
    /// Parses, and its hash matches its content.
    Good(AuditRecord),
    /// Line number (1-based) and why it is not a good record.
    Bad { line: usize, problem: String },
    /// The exact bytes of a run summary (the record before it changed it).
    Summary { bytes: Vec<u8> },
}

/// A line of the log and where it is: its number (1-based) and the byte
/// it starts at.
#[derive(Debug)]
pub struct Located {
    pub line: usize,
    pub offset: u64,
    pub what: LogLine,
}

/// Read every line of the log at `path`, checking each record's own hash.
/// The file is only ever opened to read.
pub fn read_lines(path: &Path) -> Result<Vec<LogLine>, AuditError> {
    Ok(read_located(path)?.into_iter().map(|l| l.what).collect())
}

/// [`read_lines`], with each line's number and offset.
pub fn read_located(path: &Path) -> Result<Vec<Located>, AuditError> {
    let f = File::open(path).map_err(|e| AuditError::Read(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    let mut offset = 0u64;
    for (i, line) in BufReader::new(f).split(b'\n').enumerate() {
        let line = line.map_err(|e| AuditError::Read(format!("{}: {e}", path.display())))?;
        let at = offset;
        offset += line.len() as u64 + 1;
        if line.is_empty() || line.iter().all(|b| *b == 0) {
            continue;
        }
        let what = if let Ok(s) = serde_json::from_slice::<SummaryLine>(&line) {
            LogLine::Summary { bytes: s.summary.into_bytes() }
        } else {
            match serde_json::from_slice::<AuditRecord>(&line) {
                Ok(r) if r.compute_hash() == r.hash => LogLine::Good(r),
                Ok(r) => LogLine::Bad {
                    line: i + 1,
                    problem: format!("record {} was altered: its hash does not match its content", r.seq),
                },
                Err(e) => LogLine::Bad { line: i + 1, problem: format!("not a readable record ({e})") },
            }
        };
        out.push(Located { line: i + 1, offset: at, what });
    }
    Ok(out)
}

/// Walk the log's chain: each record's hash, its link to the one before,
/// the sequence without gaps — except where a `salvaged` record documents
/// what an earlier salvage lost — no version 1 record after a version 2
/// one, and each run summary line against the digest its record carries.
/// A break is named by the log's path, line and byte, and the record.
/// Opens the file only to read.
pub fn verify_log(path: &Path) -> Result<VerifyReport, AuditError> {
    Ok(verify_log_at(path, None)?.0)
}

/// [`verify_log`], and the hash the log holds for record `want` (an
/// anchored head), found in the same one pass.
pub(super) fn verify_log_at(path: &Path, want: Option<u64>) -> Result<(VerifyReport, Option<String>), AuditError> {
    let lines = read_located(path)?;
    let found = want.and_then(|seq| {
        lines.iter().find_map(|l| match &l.what {
            LogLine::Good(r) if r.seq == seq => Some(r.hash.clone()),
            _ => None,
        })
    });
    let excuses = super::chain::excuses(lines.iter().filter_map(|l| match &l.what {
        LogLine::Good(r) => Some(r),
        LogLine::Bad { .. } | LogLine::Summary { .. } => None,
    }));
    let excused: std::collections::HashMap<u64, u64> = excuses.into_iter().collect();
    let mut walk = super::chain::Walk::new(&excused);
    let mut records = 0u64;
    // The digest the last record vouches its summary line with.
    let mut vouched: Option<(u64, Option<String>)> = None;
    for l in &lines {
        let at = format!("{}:{} (byte {})", path.display(), l.line, l.offset);
        match &l.what {
            LogLine::Summary { bytes } => {
                let Some((seq, digest)) = vouched.take() else {
                    return Ok((
                        walk.broken(
                            records,
                            walk.expected(),
                            format!("{at}: a run summary line with no record before it"),
                        ),
                        found,
                    ));
                };
                if let Some(d) = digest
                    && super::sha256_hex(bytes) != d
                {
                    return Ok((
                        walk.broken(records,
                            seq,
                            format!(
                                "{at}: the run summary after record {seq} was changed: it does not match the record's summary_sha256"
                            ),
                        ),
                        found,
                    ));
                }
            }
            LogLine::Bad { problem, .. } => {
                records += 1;
                return Ok((walk.broken(records, walk.expected(), format!("{at}: {problem}")), found));
            }
            LogLine::Good(r) => {
                records += 1;
                if let Err(b) = walk.check(r) {
                    return Ok((walk.broken(records, b.seq(), format!("{at}: {b}")), found));
                }
                vouched = Some((r.seq, r.data["summary_sha256"].as_str().map(str::to_string)));
            }
        }
    }
    Ok((walk.whole(records), found))
}
