//! The applied-request journal: what makes request ids idempotent, across
//! agent restarts.
//!
//! Every mutating request is journaled: a `pending` line (fsynced) before the
//! change is made, a `done` line with the reply after. A repeated id returns
//! the recorded reply. An id left `pending` by a crash is *indeterminate*:
//! the agent will never apply it again, and says so. Lease reverts are
//! journaled too. The file is JSON lines, one record each, readable by tests
//! and by people (`jq`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use nightshift_proto::Reply;

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalLine {
    Pending { id: String, digest: String, op: String, at_ms: i64 },
    Done { id: String, digest: String, op: String, at_ms: i64, reply: Reply },
    Reverted { id: String, at_ms: i64, ok: bool, detail: String },
}

/// What the journal knows about an id.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub digest: String,
    pub op: String,
    /// `None` while (or if, after a crash) the change is in flight.
    pub reply: Option<Reply>,
    pub reverted: Option<(i64, bool, String)>,
}

/// The journal, in memory and on disk.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    entries: HashMap<String, Entry>,
    order: Vec<String>,
}

/// Most ids kept; older ones are dropped when the file is compacted at start.
const KEEP: usize = 100_000;

impl Journal {
    /// Open (or create) the journal at `path`. A torn last line (crash mid
    /// write) is ignored; the id it named stays unknown or pending.
    pub fn open(path: &Path) -> std::io::Result<Journal> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut entries: HashMap<String, Entry> = HashMap::new();
        let mut order = Vec::new();
        if let Ok(f) = File::open(path) {
            for line in BufReader::new(f).lines() {
                let Ok(line) = line else { break };
                let Ok(rec) = serde_json::from_str::<JournalLine>(&line) else { continue };
                apply_line(&mut entries, &mut order, rec);
            }
        }
        let needs_compaction = order.len() > KEEP;
        if needs_compaction {
            let drop = order.len() - KEEP / 2;
            for id in order.drain(..drop) {
                entries.remove(&id);
            }
            let mut buf = Vec::new();
            for id in &order {
                for line in lines_for(id, &entries[id]) {
                    serde_json::to_writer(&mut buf, &line)?;
                    buf.push(b'\n');
                }
            }
            nightshift_proto::fsutil::write_atomic(path, &buf)?;
        }
        let mut file = OpenOptions::new().create(true).append(true).open(path)?;
        // Terminate a torn last line so the next record starts cleanly.
        if let Ok(bytes) = std::fs::read(path)
            && bytes.last().is_some_and(|b| *b != b'\n')
        {
            file.write_all(b"\n")?;
            file.sync_data()?;
        }
        Ok(Journal { path: path.to_path_buf(), file, entries, order })
    }

    /// Where the journal lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is known about `id`.
    pub fn lookup(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    fn append(&mut self, line: JournalLine) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(&line)?;
        bytes.push(b'\n');
        let len = self.file.metadata()?.len();
        let written = self.file.write_all(&bytes).and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // A line cut short (a full disk) must not swallow the next one:
            // cut it off, or at least end it, before saying it failed.
            if self.file.set_len(len).is_err() {
                let _ = self.file.write_all(b"\n");
            }
            return Err(e);
        }
        apply_line(&mut self.entries, &mut self.order, line);
        Ok(())
    }

    /// Durably note that `id` is about to be applied.
    pub fn begin(&mut self, id: &str, digest: &str, op: &str, at_ms: i64) -> std::io::Result<()> {
        self.append(JournalLine::Pending { id: id.into(), digest: digest.into(), op: op.into(), at_ms })
    }

    /// Record the reply for `id`.
    pub fn finish(&mut self, id: &str, digest: &str, op: &str, at_ms: i64, reply: &Reply) -> std::io::Result<()> {
        self.append(JournalLine::Done {
            id: id.into(),
            digest: digest.into(),
            op: op.into(),
            at_ms,
            reply: reply.clone(),
        })
    }

    /// Record that the lease of `id` was carried out.
    pub fn reverted(&mut self, id: &str, at_ms: i64, ok: bool, detail: &str) -> std::io::Result<()> {
        self.append(JournalLine::Reverted { id: id.into(), at_ms, ok, detail: detail.into() })
    }

    /// Read a journal file's lines (for tests and audits).
    pub fn read_lines(path: &Path) -> std::io::Result<Vec<JournalLine>> {
        let f = File::open(path)?;
        Ok(BufReader::new(f).lines().map_while(Result::ok).filter_map(|l| serde_json::from_str(&l).ok()).collect())
    }
}

fn apply_line(entries: &mut HashMap<String, Entry>, order: &mut Vec<String>, line: JournalLine) {
    match line {
        JournalLine::Pending { id, digest, op, .. } => {
            if !entries.contains_key(&id) {
                order.push(id.clone());
            }
            entries.insert(id, Entry { digest, op, reply: None, reverted: None });
        }
        JournalLine::Done { id, digest, op, reply, .. } => {
            if !entries.contains_key(&id) {
                order.push(id.clone());
            }
            let e = entries.entry(id).or_insert(Entry {
                digest: digest.clone(),
                op: op.clone(),
                reply: None,
                reverted: None,
            });
            e.reply = Some(reply);
        }
        JournalLine::Reverted { id, at_ms, ok, detail } => {
            if let Some(e) = entries.get_mut(&id) {
                e.reverted = Some((at_ms, ok, detail));
            }
        }
    }
}

fn lines_for(id: &str, e: &Entry) -> Vec<JournalLine> {
    let mut v = vec![JournalLine::Pending { id: id.into(), digest: e.digest.clone(), op: e.op.clone(), at_ms: 0 }];
    if let Some(r) = &e.reply {
        v.push(JournalLine::Done {
            id: id.into(),
            digest: e.digest.clone(),
            op: e.op.clone(),
            at_ms: 0,
            reply: r.clone(),
        });
    }
    if let Some((at, ok, d)) = &e.reverted {
        v.push(JournalLine::Reverted { id: id.into(), at_ms: *at, ok: *ok, detail: d.clone() });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::ErrorCode;

    #[test]
    fn survives_reopen_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        {
            let mut j = Journal::open(&path).unwrap();
            j.begin("a", "d1", "set_power_limit", 1).unwrap();
            j.finish("a", "d1", "set_power_limit", 2, &Reply::ok("a", serde_json::json!({"x":1}))).unwrap();
            j.begin("b", "d2", "drain", 3).unwrap();
        }
        // A crash mid-write leaves half a line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"state":"done","id":"b","dig"#).unwrap();
        drop(f);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.lookup("a").unwrap().reply.as_ref().unwrap().result, Some(serde_json::json!({"x":1})));
        assert_eq!(j.lookup("b").unwrap().reply, None, "b stays pending: indeterminate");
        assert!(j.lookup("c").is_none());
        drop(j);
        let mut j = Journal::open(&path).unwrap();
        j.finish("c", "d3", "drain", 4, &Reply::err("c", ErrorCode::HandsOff, "no")).unwrap();
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.lookup("c").unwrap().reply.as_ref().unwrap().code(), Some(ErrorCode::HandsOff));
    }
}
