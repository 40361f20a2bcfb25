//! The record log: every audit record as one line of JSON in
//! `records.jsonl`, appended and fsynced by the writer before the sled
//! transaction that indexes it. sled is fast to query but opaque when
//! damaged (a flipped byte can stop it from opening at all); the log is
//! plain text, so `verify` can name the first damaged record by line and
//! `salvage` can rebuild a store from every record that still checks out.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{AuditError, AuditRecord, GENESIS, VerifyReport};

/// The log's file name inside the data dir.
pub const LOG_FILE: &str = "records.jsonl";

/// The open log, positioned at its end.
pub struct RecordLog {
    file: File,
    path: PathBuf,
    len: u64,
}

fn io(path: &Path, e: std::io::Error) -> AuditError {
    AuditError::Write(format!("{}: {e}", path.display()))
}

impl RecordLog {
    /// Open (or create) the log in `dir` and make it agree with the store,
    /// whose newest record is `head`: lines past it were never acknowledged
    /// (a crash between the log and sled) and are cut; records the log lacks
    /// (a store older than the log) are copied from `missing`.
    pub fn open(
        dir: &Path,
        head: u64,
        missing: impl FnOnce(u64) -> Result<Vec<AuditRecord>, AuditError>,
    ) -> Result<RecordLog, AuditError> {
        let path = dir.join(LOG_FILE);
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(|e| io(&path, e))?;
        let len = file.metadata().map_err(|e| io(&path, e))?.len();
        let mut log = RecordLog { file: file.try_clone().map_err(|e| io(&path, e))?, path: path.clone(), len };
        // Walk back from the end to the line holding `head` (or the start).
        let (mut last_seq, end_of_head) = log.find_tail(&mut file, head)?;
        // Every append ends with a newline, so a last line without one is a
        // write the kill cut short: never acknowledged, and left in place it
        // would glue itself to the next record.
        let torn = log.ends_torn(&mut file)?;
        if last_seq > head || torn {
            tracing::warn!(log = %path.display(), from = last_seq, to = head, torn, "record log ahead of the store: cutting unacknowledged lines");
            log.truncate(end_of_head)?;
            last_seq = log.find_tail(&mut file, head)?.0;
        }
        if last_seq < head {
            let recs = missing(last_seq)?;
            tracing::info!(log = %path.display(), records = recs.len(), "record log behind the store: copying records into it");
            log.append(&recs)?;
        }
        Ok(log)
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
            // A torn or unreadable line is skipped (and cut if past `head`).
            if let Ok(r) = serde_json::from_slice::<AuditRecord>(&buf[start..content_end]) {
                last_seq.get_or_insert(r.seq);
                if r.seq <= head {
                    return Ok((last_seq.unwrap_or(r.seq), pos + buf.len() as u64));
                }
            }
            if start == 0 && pos == 0 {
                return Ok((last_seq.unwrap_or(0), 0));
            }
            buf.truncate(start);
        }
    }

    /// Whether the file's last byte is not a newline (a torn last write).
    fn ends_torn(&self, file: &mut File) -> Result<bool, AuditError> {
        if self.len == 0 {
            return Ok(false);
        }
        let mut last = [0u8; 1];
        file.seek(SeekFrom::Start(self.len - 1)).map_err(|e| io(&self.path, e))?;
        file.read_exact(&mut last).map_err(|e| io(&self.path, e))?;
        Ok(last[0] != b'\n')
    }

    fn truncate(&mut self, len: u64) -> Result<(), AuditError> {
        self.file.set_len(len).map_err(|e| io(&self.path, e))?;
        self.file.sync_data().map_err(|e| io(&self.path, e))?;
        self.len = len;
        Ok(())
    }

    /// Append records and make them durable.
    pub fn append(&mut self, recs: &[AuditRecord]) -> Result<(), AuditError> {
        if recs.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(recs.len() * 512);
        for r in recs {
            serde_json::to_writer(&mut buf, r).map_err(|e| AuditError::Write(e.to_string()))?;
            buf.push(b'\n');
        }
        let before = self.len;
        let written = self.file.write_all(&buf).and_then(|_| self.file.sync_data());
        if let Err(e) = written {
            // Leave no half batch behind.
            let _ = self.file.set_len(before);
            return Err(io(&self.path, e));
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Cut the log back to `len` bytes (a batch whose sled transaction failed).
    pub fn unappend_to(&mut self, len: u64) -> Result<(), AuditError> {
        self.truncate(len)
    }

    /// The current length in bytes (to roll back to).
    pub fn bytes(&self) -> u64 {
        self.len
    }
}

/// One line of a log read for `verify` or `salvage`.
#[derive(Debug)]
pub enum LogLine {
    /// Parses, and its hash matches its content.
    Good(AuditRecord),
    /// Line number (1-based) and why it is not a good record.
    Bad { line: usize, problem: String },
}

/// Read every line of the log at `path`, checking each record's own hash.
pub fn read_lines(path: &Path) -> Result<Vec<LogLine>, AuditError> {
    let f = File::open(path).map_err(|e| AuditError::Read(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).split(b'\n').enumerate() {
        let line = line.map_err(|e| AuditError::Read(format!("{}: {e}", path.display())))?;
        if line.is_empty() {
            continue;
        }
        out.push(match serde_json::from_slice::<AuditRecord>(&line) {
            Ok(r) if r.compute_hash() == r.hash => LogLine::Good(r),
            Ok(r) => LogLine::Bad {
                line: i + 1,
                problem: format!("record {} was altered: its hash does not match its content", r.seq),
            },
            Err(e) => LogLine::Bad { line: i + 1, problem: format!("not a readable record ({e})") },
        });
    }
    Ok(out)
}

/// Walk the log's chain: each record's hash, its link to the one before,
/// and the sequence without gaps — except where a `salvaged` record
/// documents what an earlier salvage lost.
pub fn verify_log(path: &Path) -> Result<VerifyReport, AuditError> {
    let lines = read_lines(path)?;
    let excused = super::salvage::excused_breaks(lines.iter().filter_map(|l| match l {
        LogLine::Good(r) => Some(r),
        LogLine::Bad { .. } => None,
    }));
    let mut prev = GENESIS.to_string();
    let mut expected = 1u64;
    let mut records = 0u64;
    for l in &lines {
        records += 1;
        let bad = |first_bad_seq: u64, problem: String| VerifyReport {
            ok: false,
            verified_up_to: expected - 1,
            records,
            first_bad_seq: Some(first_bad_seq),
            problem: Some(problem),
        };
        match l {
            LogLine::Bad { line, problem } => {
                return Ok(bad(expected, format!("{}:{line}: {problem}", path.display())));
            }
            LogLine::Good(r) => {
                let excuse = excused.contains(&r.seq);
                if r.seq != expected && !excuse {
                    return Ok(bad(expected, format!("record {expected} is missing (found {} next)", r.seq)));
                }
                if r.prev_hash != prev && !excuse {
                    return Ok(bad(r.seq, format!("record {} does not link to the record before it", r.seq)));
                }
                prev = r.hash.clone();
                expected = r.seq + 1;
            }
        }
    }
    Ok(VerifyReport { ok: true, verified_up_to: expected - 1, records, first_bad_seq: None, problem: None })
}
