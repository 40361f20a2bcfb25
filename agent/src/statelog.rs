//! The agent's state log: one append-only file, `state.log`, holding
//! everything the agent must not forget — applied request ids and their
//! replies (the journal), holds, baselines, leases, rate windows, the ends
//! of holds, the highest leader term seen.
//!
//! Each line is one change: `CRC32 JSON\n`, the checksum (8 hex digits) of
//! the JSON that follows. A line carries what the change needs together (a
//! request's `pending` mark and the hold it places, in one line), so a
//! mutating request costs one `fdatasync`: the line written before the
//! device changes. The line after the change (the reply, the value now on
//! the device) is written before the reply leaves but not synced on its
//! own: a crash of the agent (kill -9) keeps it (it is in the page cache),
//! the next synced line makes it durable, and a power loss before that
//! loses only the reply — the id then answers `indeterminate` and the hold
//! records the value being written, which `reconcile` adopts as the
//! agent's own.
//!
//! The first line is a snapshot (the whole state); the log is compacted —
//! rewritten as one snapshot, atomically — when it grows past
//! [`COMPACT_MIN_BYTES`] and four times its last snapshot (at start, or
//! after a change).
//!
//! On open, the lines are replayed. A line that fails its checksum or does
//! not parse is a torn tail when nothing valid follows it (a stop in the
//! middle of a write): it is cut off. Followed by a valid line it is
//! damage, and the agent refuses to start (starting without the holds
//! would forget baselines and leases). A write that fails (a full disk) is
//! cut back off the file before the failure is reported, and until it is
//! nothing more is appended, so no half line ever sits between two whole
//! ones.
//!
//! A state dir from before the log (`holds.json`, `journal.jsonl`,
//! `leader-term`) is read once into the first snapshot; the old files are
//! renamed `*.migrated`.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::holds::{HoldStore, HoldsDelta, Record};
use crate::journal::{Journal, JournalLine};

/// The log's file name in the state dir.
pub const LOG_FILE: &str = "state.log";

/// The lock file in the state dir: held (`flock`, exclusive) by the one
/// agent using the dir for its whole life, with that agent's pid in it.
pub const LOCK_FILE: &str = "agent.lock";

/// How long a start waits for the lock before it says who holds it (an
/// agent stopping in the same process lets go a moment later).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Take the state dir's lock, or say which process holds it.
fn lock_dir(dir: &Path) -> Result<File, String> {
    let path = dir.join(LOCK_FILE);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open its lock file {}: {e}", path.display()))?;
    let started = std::time::Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                return Err(format!(
                    "expected the state dir to be free, found it held by another nightshift-agent ({}): two agents \
                     on one state dir would both apply the same requests; stop that one, or give this one its own \
                     state_dir",
                    if holder.is_empty() { "pid unknown".to_string() } else { format!("pid {holder}") }
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", path.display()));
            }
        }
    }
    f.set_len(0)
        .and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .map_err(|e| format!("cannot write its pid into {}: {e}", path.display()))?;
    Ok(f)
}

/// The log is compacted when it is larger than this and four times its
/// last snapshot.
pub const COMPACT_MIN_BYTES: u64 = 16 << 20;

/// The whole state, the log's first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub version: u32,
    pub holds: Record,
    /// The journal, as the lines that rebuild it.
    pub journal: Vec<JournalLine>,
    pub term: u64,
}

/// One line of the log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Box<Snapshot>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<JournalLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<HoldsDelta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
}

/// What the log held when it was opened.
#[derive(Debug)]
pub struct Loaded {
    pub holds: HoldStore,
    pub journal: Journal,
    pub term: u64,
}

/// The log could not be read or set up.
#[derive(Debug, thiserror::Error)]
#[error("state log {path}: {message}")]
pub struct StateError {
    pub path: PathBuf,
    pub message: String,
}

/// The open log.
#[derive(Debug)]
pub struct StateLog {
    path: PathBuf,
    file: File,
    len: u64,
    snapshot_len: u64,
    /// A failed append left bytes past here that are not cut off yet:
    /// nothing is appended until they are.
    cut_pending: Option<u64>,
    /// Lines written and not yet synced.
    unsynced: bool,
    /// `fdatasync` calls made (what the benchmark reports per request).
    syncs: u64,
    /// The highest leader term the log holds (a compaction keeps it, so
    /// the caller need not be asked for it under the log's lock).
    term: u64,
    /// The state dir's lock, held while the log is open.
    lock: File,
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The longest line after the first: one change (a request is at most
/// 64 KiB; its reply and hold records are a few more). A longer one is
/// never written, and read as damage without being parsed.
pub const MAX_CHANGE_LINE_BYTES: usize = 1 << 20;

/// The longest first line (the snapshot: the journal's last 100,000 replies
/// and every hold) and the largest log an open reads.
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// One encoded line.
fn encode(e: &Entry) -> std::io::Result<Vec<u8>> {
    let json = serde_json::to_vec(e)?;
    if e.snapshot.is_none() && json.len() + 10 > MAX_CHANGE_LINE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a state change of {} bytes, expected at most {MAX_CHANGE_LINE_BYTES} (a line the next start could not read is never written)",
                json.len()
            ),
        ));
    }
    let mut line = format!("{:08x} ", crc(&json)).into_bytes();
    line.extend_from_slice(&json);
    line.push(b'\n');
    Ok(line)
}

/// A line's entry, or why it is not one.
fn decode(line: &[u8]) -> Result<Entry, String> {
    let (sum, json) = match line.iter().position(|b| *b == b' ') {
        Some(8) => (&line[..8], &line[9..]),
        _ => return Err("expected `CRC32 JSON` (8 hex digits, a space, then JSON)".into()),
    };
    let sum = std::str::from_utf8(sum)
        .ok()
        .and_then(|s| u32::from_str_radix(s, 16).ok())
        .ok_or_else(|| "expected 8 hex digits of checksum".to_string())?;
    let found = crc(json);
    if sum != found {
        return Err(format!("checksum mismatch: the line says {sum:08x}, its content sums to {found:08x}"));
    }
    serde_json::from_slice(json).map_err(|e| format!("not a state log entry: {e}"))
}

/// The lines of a log file: each entry with its line number and byte
/// offset; the offset and reason of the first bad line, if any; and
/// whether a valid line follows that bad one.
type Scan = (Vec<(usize, u64, Entry)>, Option<(usize, u64, String)>, bool);

fn scan(bytes: &[u8]) -> Scan {
    let mut entries = Vec::new();
    let mut bad: Option<(usize, u64, String)> = None;
    let mut valid_after = false;
    let mut off = 0u64;
    for (i, raw) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        let whole = raw.last() == Some(&b'\n');
        let line = raw.strip_suffix(b"\n").unwrap_or(raw);
        let parsed = if i > 0 && line.len() > MAX_CHANGE_LINE_BYTES {
            Err(format!("a line of {} bytes, expected at most {MAX_CHANGE_LINE_BYTES} after the first", line.len()))
        } else if whole {
            decode(line)
        } else {
            Err("a line cut short (no newline)".into())
        };
        match (parsed, &bad) {
            (Ok(e), None) => entries.push((i + 1, off, e)),
            (Ok(_), Some(_)) => valid_after = true,
            (Err(why), None) => bad = Some((i + 1, off, why)),
            (Err(_), Some(_)) => {}
        }
        off += raw.len() as u64;
    }
    (entries, bad, valid_after)
}

impl StateLog {
    /// Open the log in `dir` (created empty when there is none; migrated
    /// from the older files when they are there), replay it, and compact
    /// it. A dir used before (`used_before` says by what: the host key
    /// there) must have its log: without one the holds, baselines and
    /// leases it kept are gone while GPUs may still be capped by them, so
    /// the open refuses — unless `new_state` (`--new-state`) says to start
    /// with none. The dir's lock ([`LOCK_FILE`]) is held while the log is
    /// open: a second agent on the dir is refused with the holder's pid.
    pub fn open_checked(
        dir: &Path,
        used_before: Option<&str>,
        new_state: bool,
    ) -> Result<(StateLog, Loaded), StateError> {
        let path = dir.join(LOG_FILE);
        let err = |message: String| StateError { path: path.clone(), message };
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create its folder: {e}")))?;
        let lock = lock_dir(dir).map_err(&err)?;
        let empty = std::fs::metadata(&path).map_or(true, |m| m.len() == 0);
        let old_files = ["holds.json", "journal.jsonl", "leader-term"].iter().any(|f| dir.join(f).exists());
        if empty
            && !old_files
            && !new_state
            && let Some(evidence) = used_before
        {
            return Err(err(format!(
                "expected the state log of a state dir used before ({evidence}), found {}: the holds, baselines \
                 and leases it kept are gone, and GPUs may still be capped or drained by them. Check the node's \
                 settings by hand (`nvidia-smi -q`, the scheduler's drain) and put state.log back from a backup, \
                 or start with --new-state to begin with no holds",
                if path.exists() { "it empty" } else { "none" }
            )));
        }
        // (state, files migrated, bytes of whole lines, first line's length)
        if let Ok(m) = std::fs::metadata(&path)
            && m.len() > MAX_LOG_BYTES
        {
            return Err(err(format!(
                "expected at most {MAX_LOG_BYTES} bytes (a compacted log is one snapshot and the changes since), \
                 found {}: this is not a state log the agent wrote. Check the node's settings by hand, then move it aside",
                m.len()
            )));
        }
        let (mut loaded, migrated, whole, first) = match std::fs::read(&path) {
            Ok(bytes) => {
                let (entries, bad, valid_after) = scan(&bytes);
                if let Some((line, _, why)) = &bad
                    && valid_after
                {
                    return Err(err(format!(
                        "line {line} is damaged ({why}) and valid lines follow it: this is not a stop in the middle \
                         of a write. Check the node's settings by hand (`nvidia-smi -q`, the scheduler's drain), then \
                         move {} aside and start the agent again",
                        path.display()
                    )));
                }
                let whole = match &bad {
                    Some((line, off, why)) => {
                        tracing::warn!(path = %path.display(), line, reason = %why, "cutting a torn last line off the state log");
                        *off
                    }
                    None => bytes.len() as u64,
                };
                let first = match entries.first() {
                    Some((_, _, e)) if e.snapshot.is_some() => entries.get(1).map_or(whole, |(_, off, _)| *off),
                    _ => 0,
                };
                let loaded = replay(entries.into_iter().map(|(l, _, e)| (l, e))).map_err(&err)?;
                (loaded, None, whole, first)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (loaded, found) = migrate(dir).map_err(&err)?;
                (loaded, Some(found), 0, 0)
            }
            Err(e) => return Err(err(format!("cannot read it: {e}"))),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| err(format!("cannot open it for appending: {e}")))?;
        if file.metadata().map(|m| m.len()).unwrap_or(0) > whole {
            file.set_len(whole)
                .and_then(|()| file.sync_data())
                .map_err(|e| err(format!("cannot cut its torn last line: {e}")))?;
        }
        let mut log = StateLog {
            path: path.clone(),
            file,
            len: whole,
            snapshot_len: first,
            cut_pending: None,
            unsynced: false,
            syncs: 0,
            term: loaded.term,
            lock,
        };
        // A new (or empty) log starts with a snapshot; an old one is
        // compacted only when it has grown (its lines are the history tests and people
        // read).
        if migrated.is_some() || whole == 0 || log.wants_compaction() {
            loaded.journal.trim();
            log.compact(&loaded.holds, &loaded.journal, loaded.term)
                .map_err(|e| err(format!("cannot write its snapshot: {e}")))?;
        }
        for old in migrated.unwrap_or_default() {
            let mut to = old.clone().into_os_string();
            to.push(".migrated");
            if let Err(e) = std::fs::rename(&old, &to) {
                tracing::warn!(path = %old.display(), error = %e, "cannot rename a migrated state file");
            }
        }
        Ok((log, loaded))
    }

    /// Let go of the state dir's lock (an agent stopped in a process that
    /// goes on: a restart in tests or the simulator). Nothing may be
    /// written through this log afterwards.
    pub fn unlock(&self) {
        let _ = self.lock.unlock();
    }

    /// [`StateLog::open_checked`] for a dir with no sign of earlier use.
    pub fn open(dir: &Path) -> Result<(StateLog, Loaded), StateError> {
        Self::open_checked(dir, None, false)
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `fdatasync` calls made since the log was opened (the snapshot's
    /// included).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Append one line; with `sync`, durably (one `fdatasync`, which also
    /// makes every unsynced line before it durable). On failure nothing of
    /// the line stays in the file.
    pub fn append(&mut self, e: &Entry, sync: bool) -> std::io::Result<()> {
        if let Some(at) = self.cut_pending {
            self.file.set_len(at)?;
            self.len = at;
            self.cut_pending = None;
        }
        let line = encode(e)?;
        let written = self.file.write_all(&line).and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if let Err(err) = written {
            // Cut what was written back off; if even that fails, nothing
            // more is appended until it succeeds.
            if self.file.set_len(self.len).is_err() {
                self.cut_pending = Some(self.len);
            }
            return Err(err);
        }
        self.len += line.len() as u64;
        if let Some(t) = e.term {
            self.term = self.term.max(t);
        }
        if sync {
            self.syncs += 1;
            self.unsynced = false;
        } else {
            self.unsynced = true;
        }
        Ok(())
    }

    /// Make every line written so far durable (a no-op when all are).
    pub fn sync(&mut self) -> std::io::Result<()> {
        if self.unsynced {
            self.file.sync_data()?;
            self.syncs += 1;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Append the holds' changes (and `journal`, `term`) as one line; the
    /// store counts them durable once it is written.
    pub fn commit(
        &mut self,
        holds: &mut HoldStore,
        journal: Option<JournalLine>,
        term: Option<u64>,
        sync: bool,
    ) -> std::io::Result<()> {
        let delta = holds.delta();
        if delta.is_none() && journal.is_none() && term.is_none() {
            return if sync { self.sync() } else { Ok(()) };
        }
        self.append(&Entry { snapshot: None, journal, holds: delta, term }, sync)?;
        holds.mark_durable();
        Ok(())
    }

    /// Whether the log has grown enough to be compacted.
    pub fn wants_compaction(&self) -> bool {
        self.len > COMPACT_MIN_BYTES && self.len > self.snapshot_len.saturating_mul(4)
    }

    /// Rewrite the log as one snapshot of the state, atomically (a new
    /// file synced, renamed over the log, the folder synced). The holds
    /// must be durable (as they are right after a commit).
    pub fn compact(&mut self, holds: &HoldStore, journal: &Journal, term: u64) -> std::io::Result<()> {
        let term = term.max(self.term);
        let snap = Entry {
            snapshot: Some(Box::new(Snapshot {
                version: 1,
                holds: holds.record().clone(),
                journal: journal.lines(),
                term,
            })),
            ..Entry::default()
        };
        let line = encode(&snap)?;
        nightshift_proto::fsutil::write_atomic(&self.path, &line)?;
        self.syncs += 2;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.len = line.len() as u64;
        self.snapshot_len = self.len;
        self.cut_pending = None;
        self.unsynced = false;
        Ok(())
    }

    /// Every entry of the log in `dir` (for tests and people).
    pub fn read(dir: &Path) -> std::io::Result<Vec<Entry>> {
        let bytes = std::fs::read(dir.join(LOG_FILE))?;
        Ok(scan(&bytes).0.into_iter().map(|(_, _, e)| e).collect())
    }

    /// Check that every line of the log in `dir` is whole and sums right:
    /// the number of lines, or the first bad one (tests use it: no torn
    /// line is ever left between whole ones, or at the end after a failed
    /// write).
    pub fn verify(dir: &Path) -> Result<usize, String> {
        let bytes = std::fs::read(dir.join(LOG_FILE)).map_err(|e| e.to_string())?;
        match scan(&bytes) {
            (entries, None, _) => Ok(entries.len()),
            (_, Some((line, _, why)), _) => Err(format!("line {line}: {why}")),
        }
    }

    /// Every journal line of the log in `dir`, the snapshot's first.
    pub fn journal_lines(dir: &Path) -> std::io::Result<Vec<JournalLine>> {
        let mut out = Vec::new();
        for e in StateLog::read(dir)? {
            if let Some(s) = e.snapshot {
                out.extend(s.journal);
            }
            out.extend(e.journal);
        }
        Ok(out)
    }
}

/// Rebuild the state from the log's entries.
fn replay(entries: impl Iterator<Item = (usize, Entry)>) -> Result<Loaded, String> {
    let mut rec = Record::empty();
    let mut journal = Journal::default();
    let mut term = 0u64;
    for (line, e) in entries {
        if let Some(s) = e.snapshot {
            if s.version != 1 {
                return Err(format!("line {line}: unsupported snapshot version: expected 1, found {}", s.version));
            }
            rec = s.holds.check().map_err(|m| format!("line {line}: {m}"))?;
            journal = Journal::default();
            for l in s.journal {
                journal.apply(l);
            }
            term = s.term;
        }
        if let Some(d) = &e.holds {
            rec.apply(d);
        }
        if let Some(l) = e.journal {
            journal.apply(l);
        }
        if let Some(t) = e.term {
            term = term.max(t);
        }
    }
    Ok(Loaded { holds: HoldStore::from_record(rec), journal, term })
}

/// The state from the files before the log, and those files.
fn migrate(dir: &Path) -> Result<(Loaded, Vec<PathBuf>), String> {
    let mut found = Vec::new();
    let holds_path = dir.join("holds.json");
    let rec = match std::fs::read(&holds_path) {
        Ok(bytes) => {
            found.push(holds_path.clone());
            serde_json::from_slice::<Record>(&bytes)
                .map_err(|e| {
                    format!(
                        "{} is not a hold record ({e}); move it aside only after checking the node's settings by hand",
                        holds_path.display()
                    )
                })?
                .check()
                .map_err(|m| format!("{}: {m}", holds_path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Record::empty(),
        Err(e) => return Err(format!("cannot read {}: {e}", holds_path.display())),
    };
    let mut journal = Journal::default();
    let journal_path = dir.join("journal.jsonl");
    if let Ok(f) = File::open(&journal_path) {
        found.push(journal_path);
        for line in BufReader::new(f).lines() {
            let Ok(line) = line else { break };
            // A torn last line (a stop mid write) names an id that stays
            // unknown or pending, as it did before.
            let Ok(l) = serde_json::from_str::<JournalLine>(&line) else { continue };
            journal.apply(l);
        }
    }
    let term_path = dir.join("leader-term");
    let term = match std::fs::read_to_string(&term_path) {
        Ok(t) => {
            found.push(term_path);
            t.trim().parse().unwrap_or(0)
        }
        Err(_) => 0,
    };
    if !found.is_empty() {
        tracing::info!(dir = %dir.display(), files = ?found, "moving the agent's state into the state log");
    }
    Ok((Loaded { holds: HoldStore::from_record(rec), journal, term }, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::{ErrorCode, HoldInfo, HoldValue, Reply, Setting};

    fn hold(id: &str, watts: f64) -> HoldInfo {
        HoldInfo {
            id: id.into(),
            owner: id.into(),
            setting: Setting::PowerLimit { gpu: 0 },
            value: HoldValue::PowerLimit { watts },
            reason: "test".into(),
            placed_at_ms: 1,
            expires_at_ms: Some(60_000),
            kept: false,
            repair: false,
        }
    }

    fn pending(id: &str) -> JournalLine {
        JournalLine::Pending { id: id.into(), digest: "d".into(), op: "set_power_limit".into(), at_ms: 1 }
    }

    #[test]
    fn a_change_is_one_line_and_replays_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
        let before = log.syncs();
        st.holds.place(hold("a", 600.0), HoldValue::PowerLimit { watts: 700.0 });
        st.holds.rate_record(nightshift_proto::ActionKind::PowerLimit, Some(0), 5);
        log.commit(&mut st.holds, Some(pending("a")), None, true).unwrap();
        assert_eq!(log.syncs() - before, 1, "one fdatasync for the pending mark and the hold together");
        st.holds.get_mut(&Setting::PowerLimit { gpu: 0 }).unwrap().applied = HoldValue::PowerLimit { watts: 600.0 };
        let reply = Reply::ok("a", serde_json::json!({"x": 1}));
        log.commit(
            &mut st.holds,
            Some(JournalLine::Done {
                id: "a".into(),
                digest: "d".into(),
                op: "set_power_limit".into(),
                at_ms: 2,
                reply: reply.clone(),
            }),
            Some(7),
            false,
        )
        .unwrap();
        assert_eq!(log.syncs() - before, 1, "the reply line is not synced on its own");
        let want = st.holds.record().clone();
        drop(log);
        let (_, again) = StateLog::open(dir.path()).unwrap();
        assert_eq!(again.holds.record(), &want);
        assert_eq!(again.term, 7);
        assert_eq!(again.journal.lookup("a").unwrap().reply.as_ref(), Some(&reply));
    }

    #[test]
    fn a_torn_tail_is_cut_and_damage_in_the_middle_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
            log.commit(&mut st.holds, Some(pending("a")), None, true).unwrap();
        }
        let path = dir.path().join(LOG_FILE);
        // A stop mid write: half a line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"0badc0de {\"journal\":{\"state\":\"pen").unwrap();
        drop(f);
        {
            let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
            assert!(st.journal.lookup("a").is_some());
            log.commit(&mut st.holds, Some(pending("b")), None, true).unwrap();
        }
        let (_, st) = StateLog::open(dir.path()).unwrap();
        assert!(st.journal.lookup("b").is_some(), "the line after a cut tail is whole");
        // A changed byte in a line with valid lines after it.
        {
            let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
            log.commit(&mut st.holds, Some(pending("c")), None, true).unwrap();
            log.commit(&mut st.holds, Some(pending("d")), None, true).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        assert_eq!(lines.len(), 5, "a snapshot, a, b, c, d: {text}");
        lines[3] = lines[3].replace("\"c\"", "\"x\"");
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let err = StateLog::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 4 is damaged (checksum mismatch"), "{err}");
        assert!(err.contains("move") && err.contains("aside"), "{err}");
    }

    /// Issue 46 point 11: no bound on a line — a change of any size was
    /// written, and a crafted line of any size (its checksum right) was
    /// parsed at start. A change past the bound is refused with nothing
    /// written; such a line in the file is damage, named with its length.
    #[test]
    fn a_line_past_the_bound_is_never_written_and_refused_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        let huge = "x".repeat(MAX_CHANGE_LINE_BYTES);
        {
            let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
            log.commit(&mut st.holds, Some(pending("a")), None, true).unwrap();
            let before = std::fs::read(&path).unwrap();
            let e = log.commit(&mut st.holds, Some(pending(&huge)), None, true).unwrap_err().to_string();
            assert!(e.contains(&format!("expected at most {MAX_CHANGE_LINE_BYTES}")), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), before, "nothing was written");
            log.commit(&mut st.holds, Some(pending("b")), None, true).unwrap();
        }
        let (_, st) = StateLog::open(dir.path()).unwrap();
        assert!(st.journal.lookup("a").is_some() && st.journal.lookup("b").is_some());
        // The same line made by hand, its checksum right, before a valid one.
        let json = serde_json::to_vec(&Entry { journal: Some(pending(&huge)), ..Entry::default() }).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes[bytes[..bytes.len() - 1].iter().rposition(|b| *b == b'\n').unwrap() + 1..].to_vec();
        bytes.extend_from_slice(format!("{:08x} ", crc(&json)).as_bytes());
        bytes.extend_from_slice(&json);
        bytes.push(b'\n');
        bytes.extend_from_slice(&last);
        std::fs::write(&path, &bytes).unwrap();
        let e = StateLog::open(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("line 4 is damaged (a line of ") && e.contains("expected at most 1048576 after the first"),
            "{e}"
        );
    }

    /// Compaction (at start past the threshold, or after a change) keeps
    /// everything: one snapshot line, the same holds, journal and term,
    /// and appends go on after it.
    #[test]
    fn a_compacted_log_is_one_snapshot_with_everything_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut st) = StateLog::open(dir.path()).unwrap();
        for i in 0..50 {
            st.holds.place(hold(&format!("h{i}"), 600.0 - i as f64), HoldValue::PowerLimit { watts: 700.0 });
            log.commit(&mut st.holds, Some(pending(&format!("r{i}"))), Some(i), i % 10 == 0).unwrap();
            st.journal.apply(pending(&format!("r{i}")));
        }
        // The log's own highest term survives the compaction even when the
        // caller passes none.
        let before = std::fs::read_to_string(dir.path().join(LOG_FILE)).unwrap().lines().count();
        assert!(before > 50, "{before}");
        log.compact(&st.holds, &st.journal, 0).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(LOG_FILE)).unwrap().lines().count(), 1);
        log.commit(&mut st.holds, Some(pending("after")), None, true).unwrap();
        drop(log);
        let (_, again) = StateLog::open(dir.path()).unwrap();
        assert_eq!(again.holds.record(), st.holds.record());
        assert_eq!(again.term, 49);
        for i in 0..50 {
            assert!(again.journal.lookup(&format!("r{i}")).is_some(), "r{i}");
        }
        assert!(again.journal.lookup("after").is_some());
        StateLog::verify(dir.path()).unwrap();
    }

    #[test]
    fn an_old_state_dir_is_moved_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = HoldStore::from_record(Record::empty());
        rec.place(hold("a", 600.0), HoldValue::PowerLimit { watts: 700.0 });
        std::fs::write(dir.path().join("holds.json"), serde_json::to_vec(rec.record()).unwrap()).unwrap();
        let lines = [
            serde_json::to_string(&pending("a")).unwrap(),
            serde_json::to_string(&JournalLine::Done {
                id: "a".into(),
                digest: "d".into(),
                op: "set_power_limit".into(),
                at_ms: 2,
                reply: Reply::err("a", ErrorCode::HandsOff, "no"),
            })
            .unwrap(),
        ];
        std::fs::write(dir.path().join("journal.jsonl"), lines.join("\n") + "\n{\"state\":\"pe").unwrap();
        std::fs::write(dir.path().join("leader-term"), "4").unwrap();
        let (_, st) = StateLog::open(dir.path()).unwrap();
        assert_eq!(st.holds.record(), rec.record());
        assert_eq!(st.journal.lookup("a").unwrap().reply.as_ref().unwrap().code(), Some(ErrorCode::HandsOff));
        assert_eq!(st.term, 4);
        assert!(dir.path().join("holds.json.migrated").exists() && !dir.path().join("holds.json").exists());
        // And from the log from then on.
        let (_, st) = StateLog::open(dir.path()).unwrap();
        assert_eq!(st.holds.record(), rec.record());
        assert_eq!(st.term, 4);
    }

    #[test]
    fn a_second_open_of_a_state_dir_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = StateLog::open(dir.path()).unwrap();
        let e = StateLog::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("held by another nightshift-agent (pid {})", std::process::id())), "{e}");
        first.unlock();
        let (_again, _) = StateLog::open(dir.path()).unwrap();
    }

    /// A state dir used before (its host key there) without its log, or
    /// with an empty one, is refused unless `new_state`; a new dir, or one
    /// with its log, opens.
    #[test]
    fn a_used_state_dir_without_its_log_is_refused_unless_told() {
        let used = Some("its host key /x/host_key exists");
        let dir = tempfile::tempdir().unwrap();
        let e = StateLog::open_checked(dir.path(), used, false).unwrap_err().to_string();
        assert!(e.contains("found none") && e.contains("--new-state") && e.contains("its host key /x/host_key"), "{e}");
        assert!(!dir.path().join(LOG_FILE).exists(), "nothing written");
        std::fs::write(dir.path().join(LOG_FILE), "").unwrap();
        let e = StateLog::open_checked(dir.path(), used, false).unwrap_err().to_string();
        assert!(e.contains("found it empty"), "{e}");
        let (log, _) = StateLog::open_checked(dir.path(), used, true).unwrap();
        drop(log);
        // Now it has its log (a snapshot): opens without being told.
        let (_log, _) = StateLog::open_checked(dir.path(), used, false).unwrap();
        // A fresh dir never refuses.
        let fresh = tempfile::tempdir().unwrap();
        StateLog::open_checked(fresh.path(), None, false).unwrap();
    }

    #[test]
    fn an_unreadable_old_record_is_an_error_not_a_blank_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("holds.json"), b"{\"version\":1,\"held\":[").unwrap();
        let err = StateLog::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a hold record"), "{err}");
        assert!(!dir.path().join(LOG_FILE).exists(), "nothing written over it");
    }
}
