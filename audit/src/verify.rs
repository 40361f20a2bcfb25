//! `verify`: walk the chain, the run summaries and the record log, and name
//! the first record that cannot be read or does not check out.
//!
//! sled does not fail on a damaged page: it retries forever, spinning a
//! core. So the walk runs on its own thread and reports its progress; when
//! it stops moving for [`STALL`], the record after the last one read is
//! named as unreadable and the walk is abandoned (its thread spins on until
//! the process ends — the CLI exits right after; the server runs one verify
//! at a time).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::index::{RecordTable, SledCopy, Trees, checkpoint, open_trees};
use super::{AuditError, AuditRecord, RecordKind, VerifyReport, sha256_hex};

/// How long a walk may go without reading a record before the store counts
/// as stuck on damaged data.
pub const STALL: Duration = Duration::from_secs(5);

/// One verify at a time per process: a walk stuck on damaged data keeps its
/// thread, and a second one would only add another.
static STUCK: AtomicBool = AtomicBool::new(false);

pub(super) fn verify(trees: Trees, log: Option<PathBuf>) -> Result<VerifyReport, AuditError> {
    if STUCK.load(Ordering::SeqCst) {
        return Ok(VerifyReport {
            ok: false,
            verified_up_to: 0,
            records: 0,
            first_bad_seq: None,
            problem: Some(
                "an earlier verify is stuck on damaged data in the store: stop the engine, then run `nightshift audit verify` and `nightshift audit salvage`"
                    .into(),
            ),
            excused: Vec::new(),
            notes: Vec::new(),
        });
    }
    // The record log first (a file store's only copy of each record): its
    // walk names a damaged line by number. Then the walk through the index
    // (records.idx, or sled's copy): each record found where the index
    // says, the chain again, the run summaries.
    if let Some(log) = log.filter(|p| p.exists()) {
        let l = super::log::verify_log(&log)?;
        if !l.ok {
            return Ok(VerifyReport { problem: l.problem.map(|p| format!("record log: {p}")), ..l });
        }
    }
    let progress = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let p = progress.clone();
    std::thread::Builder::new()
        .name("audit-verify".into())
        .spawn(move || {
            let _ = tx.send(walk(&trees, &p));
        })
        .map_err(|e| AuditError::Read(e.to_string()))?;
    let mut seen = (progress.load(Ordering::SeqCst), Instant::now());
    let report = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => break r,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(AuditError::Read("the verify walk stopped without a report".into()));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let now = progress.load(Ordering::SeqCst);
                if now != seen.0 {
                    seen = (now, Instant::now());
                } else if seen.1.elapsed() >= STALL {
                    STUCK.store(true, Ordering::SeqCst);
                    let seq = now + 1;
                    tracing::error!(
                        record = seq,
                        "the audit store stopped answering while reading a record: damaged data?"
                    );
                    break VerifyReport {
                        ok: false,
                        verified_up_to: now,
                        records: now,
                        first_bad_seq: Some(seq),
                        problem: Some(format!(
                            "record {seq} (or the sled page holding it) cannot be read: the store stopped answering for {} s while reading it (damaged data); `nightshift audit salvage --to NEW_DIR` rebuilds a store from the record log",
                            STALL.as_secs()
                        )),
                        excused: Vec::new(),
                        notes: Vec::new(),
                    };
                }
            }
        }
    };
    Ok(report)
}

/// Verify the file store in `dir` without opening anything in it for
/// writing — what `nightshift audit verify` runs on a stopped engine's
/// data dir. The record log (the only copy of each record) is walked
/// first; then a copy of sled, taken to a temporary folder, is walked with
/// every record read through `records.idx` (opened to read, up to the
/// checkpoint) and the run summaries checked against their digests.
/// `anchor`: a head published earlier (`audit head`), which the chain must
/// still hold. Refused ([`AuditError::Locked`]) while an engine holds the
/// store: ask it instead.
pub fn verify_dir(dir: &Path, anchor: Option<(u64, &str)>) -> Result<VerifyReport, AuditError> {
    if super::index::held_by_engine(dir) {
        return Err(AuditError::Locked { path: dir.to_path_buf(), message: "held by a running engine".into() });
    }
    let log = dir.join(super::LOG_FILE);
    if !log.is_file() {
        return Err(AuditError::Open {
            path: dir.to_path_buf(),
            message: format!("expected a record log at {}, found none: is data_dir right?", log.display()),
        });
    }
    let (mut report, anchored) = super::log::verify_log_at(&log, anchor.map(|(seq, _)| seq))?;
    if !report.ok {
        report.problem = report.problem.map(|p| format!("record log: {p}"));
        return Ok(report);
    }
    if let Some((seq, hash)) = anchor
        && let Some(problem) = anchor_check(report.verified_up_to, seq, hash, anchored.as_deref())
    {
        return Ok(VerifyReport { ok: false, first_bad_seq: Some(seq), problem: Some(problem), ..report });
    }
    let copy = match SledCopy::of(dir) {
        Ok(Some(copy)) => copy,
        Ok(None) => {
            report
                .notes
                .push("no sled index (audit.sled) beside the log: the engine builds one at its next start".into());
            return Ok(report);
        }
        Err(why) => return Err(AuditError::Read(why)),
    };
    let mut trees = match open_trees(&copy.root) {
        Ok((trees, _)) => trees,
        Err(e) => {
            report.notes.push(format!(
                "the sled index (audit.sled) does not open ({e}); it is derived from the record log, which verifies: \
                 the engine sets it aside and rebuilds it at its next start; run summaries were not checked"
            ));
            return Ok(report);
        }
    };
    if trees.sled_records.is_empty() {
        if !dir.join(super::positions::IDX_FILE).is_file() {
            report.notes.push("no records.idx beside the log: the engine builds it at its next start".into());
            return Ok(report);
        }
        let upto = checkpoint(&trees)?;
        let positions = super::positions::Positions::open_read_only(dir, upto)?;
        trees.records = RecordTable::Log(Arc::new(positions));
    }
    let indexed = verify(trees, None)?;
    if !indexed.ok {
        return Ok(indexed);
    }
    Ok(report)
}

/// A head published earlier (record `seq` with `hash`) against a chain
/// that verifies up to `verified_up_to` and holds `found` as that record's
/// hash: `None` when the chain still holds it, else what is wrong.
pub fn anchor_check(verified_up_to: u64, seq: u64, hash: &str, found: Option<&str>) -> Option<String> {
    if seq > verified_up_to {
        return Some(format!(
            "expected the chain to reach the anchored head, record {seq}, found it ends at record {verified_up_to}: \
             records were cut off"
        ));
    }
    match found {
        Some(h) if h.eq_ignore_ascii_case(hash) => None,
        Some(h) => Some(format!(
            "expected record {seq} to have the anchored hash {hash}, found {h}: the history up to it was rewritten"
        )),
        None => Some(format!("expected record {seq} (the anchored head) in the chain, found none")),
    }
}

/// `SEQ:HASH` (as `nightshift audit verify --head` takes it) as its parts.
pub fn parse_anchor(s: &str) -> Result<(u64, String), String> {
    let (seq, hash) = s.split_once(':').ok_or_else(|| format!("expected SEQ:HASH, found {s:?}"))?;
    let seq: u64 =
        seq.trim().parse().map_err(|_| format!("expected SEQ:HASH with SEQ a record number, found {seq:?}"))?;
    let hash = hash.trim();
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("expected SEQ:HASH with HASH 64 hex digits (SHA-256), found {hash:?}"));
    }
    if seq == 0 {
        return Err("expected SEQ:HASH with SEQ at least 1, found 0".into());
    }
    Ok((seq, hash.to_ascii_lowercase()))
}

/// The whole walk: chain (with a salvage's documented breaks), summaries.
fn walk(trees: &Trees, progress: &AtomicU64) -> VerifyReport {
    let mut report = chain(trees, &HashMap::new(), progress);
    if !report.ok {
        // Was the break documented by a salvage? Only then look.
        let excused = excused_breaks(trees);
        if !excused.is_empty() {
            progress.store(0, Ordering::SeqCst);
            report = chain(trees, &excused, progress);
        }
    }
    if !report.ok {
        return report;
    }
    match summaries(trees) {
        Some(problem) => VerifyReport { ok: false, first_bad_seq: None, problem: Some(problem), ..report },
        None => report,
    }
}

fn chain(trees: &Trees, excused: &HashMap<u64, u64>, progress: &AtomicU64) -> VerifyReport {
    let mut walk = super::chain::Walk::new(excused);
    let mut records = 0u64;
    for item in trees.records.all() {
        let (k, v) = match item {
            Ok(kv) => kv,
            Err(e) => {
                let expected = walk.expected();
                return walk.broken(
                    records,
                    expected,
                    format!("record {expected} (or the page holding it) cannot be read: {e}"),
                );
            }
        };
        let key_seq = k;
        records += 1;
        let r: AuditRecord = match serde_json::from_slice(&v) {
            Ok(r) => r,
            Err(e) => return walk.broken(records, key_seq, format!("record {key_seq} is not a valid record: {e}")),
        };
        if r.seq != key_seq {
            return walk.broken(records, key_seq, format!("record stored at {key_seq} says it is {}", r.seq));
        }
        if let Err(b) = walk.check(&r) {
            return walk.broken(records, b.seq(), b.to_string());
        }
        progress.store(key_seq, Ordering::SeqCst);
    }
    walk.whole(records)
}

/// The breaks `salvaged` records document (each before its salvage
/// record), with the salvage record that documents it.
fn excused_breaks(trees: &Trees) -> HashMap<u64, u64> {
    let recs: Vec<AuditRecord> = trees
        .records
        .all()
        .filter_map(|i| i.ok())
        .filter_map(|(_, v)| serde_json::from_slice::<AuditRecord>(&v).ok())
        .filter(|r| r.kind == RecordKind::Salvaged)
        .collect();
    super::chain::excuses(recs.iter()).into_iter().collect()
}

/// Each stored run summary must be the one the chain's newest record for
/// that run vouches for (`summary_sha256`), so the timeline cannot disagree
/// with the chain. Summaries older than that field pass.
fn summaries(trees: &Trees) -> Option<String> {
    for item in trees.runs.iter() {
        let Ok((id, bytes)) = item else {
            return Some("a run summary cannot be read".into());
        };
        let id = String::from_utf8_lossy(&id).into_owned();
        let mut prefix = id.as_bytes().to_vec();
        prefix.push(0);
        let vouched = trees.by_run.scan_prefix(&prefix).rev().filter_map(|i| i.ok()).find_map(|(k, _)| {
            let seq = u64::from_be_bytes(k[k.len().saturating_sub(8)..].try_into().ok()?);
            let v = trees.records.get(seq).ok()??;
            let r: AuditRecord = serde_json::from_slice(&v).ok()?;
            r.data["summary_sha256"].as_str().map(str::to_string)
        });
        if let Some(sha) = vouched
            && sha256_hex(&bytes) != sha
        {
            return Some(format!(
                "run {id}: its summary (the timeline's entry) was changed outside the chain; `nightshift audit salvage` rebuilds it from the records"
            ));
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use nightshift_proto::clock::{SharedClock, VirtualClock};
    use serde_json::json;

    use super::super::{AuditStore, LOG_FILE, NewRecord, RecordKind};
    use crate::runs::{RunSummary, Target};

    fn clock() -> SharedClock {
        Arc::new(VirtualClock::new(1_000))
    }

    /// A run's summary after its `run_queued` (node target `n1`), with
    /// `why` (also used by `store.rs`'s tests).
    pub(crate) fn summary(id: &str, why: &str) -> RunSummary {
        let mut s = crate::rebuild_summary(
            id,
            &[&crate::AuditRecord {
                seq: 1,
                ts_ms: 1,
                kind: RecordKind::RunQueued,
                run: Some(id.into()),
                node: Some("n1".into()),
                gpu: None,
                runbook: Some("rb".into()),
                actor: "user:a".into(),
                data: json!({"target": Target::node("n1")}),
                prev_hash: String::new(),
                hash: String::new(),
                v: None,
            }],
        )
        .unwrap();
        s.why = why.into();
        s
    }

    /// Issue 27 item 3 found a consistent rewrite of sled alone passing
    /// `verify` while sled and records.jsonl disagreed about who approved a
    /// run. A file store now keeps one copy of each record — the log's line,
    /// found through records.idx — so there is no second copy to disagree:
    /// sled holds none, and a consistent rewrite of the only copy is what
    /// the outside anchor (the published head) exists for.
    #[tokio::test]
    async fn a_file_store_keeps_one_copy_and_a_rewrite_moves_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        s.append(NewRecord::new(RecordKind::RunQueued, "user:alice", json!({})).run("r1"), None).await.unwrap();
        s.append(NewRecord::new(RecordKind::Approved, "user:bob", json!({})).run("r1"), None).await.unwrap();
        for i in 0..5 {
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run("r1"), None).await.unwrap();
        }
        assert!(s.verify().unwrap().ok);
        assert!(s.trees.sled_records.is_empty(), "sled holds no copy of the records");
        let head = s.head_seq();
        let published = s.get(head).unwrap().unwrap().hash;
        // The log rewritten from record 2 on, every hash recomputed.
        let mut prev = s.get(1).unwrap().unwrap().hash;
        for seq in 2..=head {
            let mut r = s.get(seq).unwrap().unwrap();
            if seq == 2 {
                r.actor = "user:mallory".into();
            }
            r.prev_hash = prev.clone();
            r.hash = r.compute_hash();
            prev = r.hash.clone();
            let bytes = serde_json::to_vec(&r).unwrap();
            s.tamper_for_tests(seq, |b| *b = bytes).unwrap();
        }
        assert_eq!(s.get(2).unwrap().unwrap().actor, "user:mallory", "the rewrite is what a read sees");
        assert!(s.verify().unwrap().ok, "one consistent chain verifies on its own");
        assert_ne!(s.get(head).unwrap().unwrap().hash, published, "the head an outside anchor holds shows it");
    }

    /// Regression (issue 27 item 2: a record replaced by a self-hashed
    /// `salvaged` record whose `excused` list named its own sequence and
    /// the next one passed `verify`, in both copies, with the head
    /// unchanged): a salvage excuses only breaks before itself.
    #[tokio::test]
    async fn a_salvaged_record_in_the_middle_cannot_excuse_itself() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        for i in 0..8 {
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run("r1"), None).await.unwrap();
        }
        assert!(s.verify().unwrap().ok);
        let head = (s.head_seq(), s.get(s.head_seq()).unwrap().unwrap().hash);
        // Record 4 becomes a salvage "excusing" itself and record 5.
        let mut forged = s.get(4).unwrap().unwrap();
        forged.kind = RecordKind::Salvaged;
        forged.actor = "nightshift:salvage".into();
        forged.data = json!({"recovered": 3, "lost": [], "excused": [4, 5]});
        forged.hash = forged.compute_hash();
        let line = serde_json::to_string(&forged).unwrap();
        // The record log's line: a file store's only copy.
        s.tamper_for_tests(4, |b| *b = line.clone().into_bytes()).unwrap();
        let log = dir.path().join(LOG_FILE);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.lines().any(|l| l == line), "the log line was replaced");
        assert_eq!((s.head_seq(), s.get(s.head_seq()).unwrap().unwrap().hash), head, "the head does not show it");
        let v = s.verify().unwrap();
        assert!(!v.ok, "{v:?}");
        assert_eq!(v.first_bad_seq, Some(5), "{v:?}");
        assert!(v.problem.as_deref().unwrap_or("").contains("record 5 does not link to record 4"), "{v:?}");
        let l = crate::verify_log(&log).unwrap();
        assert_eq!((l.ok, l.first_bad_seq), (false, Some(5)), "the record log's own walk names it too: {l:?}");
    }

    #[tokio::test]
    async fn a_summary_changed_outside_the_chain_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        let rec = || NewRecord::new(RecordKind::RunQueued, "user:a", json!({})).run("r1");
        s.append(rec(), Some(summary("r1", "first"))).await.unwrap();
        s.append(rec(), Some(summary("r1", "failed: the cap was refused"))).await.unwrap();
        assert!(s.verify().unwrap().ok);
        // Someone rewrites the timeline's entry to look better.
        let forged = serde_json::to_vec(&summary("r1", "succeeded")).unwrap();
        s.trees.runs.insert("r1".as_bytes(), forged).unwrap();
        let v = s.verify().unwrap();
        assert!(!v.ok);
        assert!(
            v.problem.unwrap().starts_with("run r1: its summary (the timeline's entry) was changed outside the chain")
        );
    }

    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &to.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    /// The log is the durability point: records (and the summaries they
    /// change) that sled had not flushed when the process died come back
    /// from the log on open.
    #[tokio::test]
    async fn records_sled_lost_are_replayed_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let rec = |i: i32| NewRecord::new(RecordKind::RunQueued, "user:a", json!({"i": i})).run("r1").node(Some("n1"));
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..10 {
                s.append(rec(i), Some(summary("r1", &format!("step {i}")))).await.unwrap();
            }
        }
        let old_sled = tempfile::tempdir().unwrap();
        copy_dir(&dir.path().join("audit.sled"), old_sled.path());
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 10..15 {
                s.append(rec(i), Some(summary("r1", &format!("step {i}")))).await.unwrap();
            }
        }
        // sled as it was before the last five records: as if they were
        // never flushed.
        std::fs::remove_dir_all(dir.path().join("audit.sled")).unwrap();
        copy_dir(old_sled.path(), &dir.path().join("audit.sled"));
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 15);
        assert_eq!(s.run("r1").unwrap().unwrap().why, "step 14", "the summary came back with its record");
        assert_eq!(s.run_records("r1").unwrap().len(), 15);
        assert_eq!(s.node_records("n1", 1).unwrap()[0].seq, 15);
        let v = s.verify().unwrap();
        assert_eq!((v.ok, v.verified_up_to), (true, 15), "{v:?}");
        let r = s.append(rec(15), None).await.unwrap();
        assert_eq!(r.seq, 16);
    }

    /// A last log line damaged beyond reading but whole (its newline is
    /// there: not a torn write) is the only copy of its record, and
    /// evidence: the open refuses with nothing changed, `verify` names it,
    /// and salvage builds a store from the rest, saying what was lost.
    #[tokio::test]
    async fn a_damaged_last_log_line_is_kept_and_named() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..5 {
                s.append(NewRecord::new(RecordKind::Note, "e", json!({"i": i})), None).await.unwrap();
            }
        }
        let log = dir.path().join(LOG_FILE);
        let text = std::fs::read_to_string(&log).unwrap();
        let damaged = text.replace("{\"seq\":5,", "{\"sXq\":5,");
        std::fs::write(&log, &damaged).unwrap();
        let e = AuditStore::open(dir.path(), clock()).unwrap_err().to_string();
        assert!(e.contains("found line 5 (byte ") && e.contains("nightshift audit salvage"), "{e}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), damaged, "nothing was cut");
        let v = super::verify_dir(dir.path(), None).unwrap();
        assert!(!v.ok);
        assert!(v.problem.as_deref().unwrap_or("").contains("records.jsonl:5 (byte "), "{v:?}");
        assert!(v.problem.as_deref().unwrap_or("").contains("not a readable record"), "{v:?}");
        let to = tempfile::tempdir().unwrap();
        let (from, new) = (dir.path().to_path_buf(), to.path().join("new"));
        let r = tokio::task::spawn_blocking(move || crate::salvage(&from, &new, clock())).await.unwrap().unwrap();
        assert_eq!((r.recovered, r.damaged_lines.len(), r.damaged_lines[0].0), (4, 1, 5), "{r:?}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), damaged, "salvage writes beside the store");
        let s = AuditStore::open(&to.path().join("new"), clock()).unwrap();
        assert!(s.verify().unwrap().ok);
    }

    #[tokio::test]
    async fn the_record_log_follows_the_store_across_crashes() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..10 {
                s.append(NewRecord::new(RecordKind::Note, "e", json!({"i": i})), None).await.unwrap();
            }
        }
        let log = dir.path().join(LOG_FILE);
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().count(), 10, "closed cleanly: no zero-filled room left");
        // Whole lines past the store that do not continue the chain (here:
        // edited copies whose hashes do not match) are evidence: refused,
        // nothing cut. A torn last write alone is cut.
        let last = text.lines().last().unwrap().to_string();
        let mut ahead = text.clone();
        for seq in [11, 12] {
            ahead.push_str(&last.replace("\"seq\":10,", &format!("\"seq\":{seq},")));
            ahead.push('\n');
        }
        ahead.push_str("{\"seq\":13,\"ts_ms\":");
        std::fs::write(&log, &ahead).unwrap();
        let e = AuditStore::open(dir.path(), clock()).unwrap_err().to_string();
        assert!(e.contains("found line 11 (byte ") && e.contains("record 11 was altered"), "{e}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), ahead, "nothing was cut");
        std::fs::write(&log, text.clone() + "{\"seq\":11,\"ts_ms\":").unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            assert_eq!(std::fs::read_to_string(&log).unwrap(), text, "cut back to what the store holds");
            let r = s.append(NewRecord::new(RecordKind::Note, "e", json!({})), None).await.unwrap();
            assert_eq!(r.seq, 11);
            assert!(s.verify().unwrap().ok);
        }
        // A lost log file: the log is the only copy of the records, so the
        // open refuses, saying what is missing, rather than start empty.
        let saved = std::fs::read(&log).unwrap();
        std::fs::remove_file(&log).unwrap();
        let e = AuditStore::open(dir.path(), clock()).unwrap_err().to_string();
        assert!(
            e.contains("expected the record log to hold every record up to 11") && e.contains("records.idx"),
            "{e}"
        );
        std::fs::write(&log, saved).unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 11);
        assert!(s.verify().unwrap().ok);
    }
}
