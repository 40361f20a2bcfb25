//! Salvage: a fresh store from every record of a damaged one that still
//! checks out, so an operator can start the engine again.
//!
//! Records come from the record log and, where sled still opens, from sled
//! too; each one's own hash must match its content. They are copied
//! verbatim (same sequence numbers and hashes) and a `salvaged` record is
//! appended, chained to the last of them, naming what was lost and the
//! damaged store's head (`pre_salvage_head`); `verify` accepts exactly the
//! breaks a `salvaged` record names *before itself* — never its own, never
//! a later one — and reports each. Run summaries are
//! copied where they match the chain (`summary_sha256`) and rebuilt from
//! the run's records where they do not.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nightshift_proto::clock::SharedClock;

use crate::index::{created_key, index_key};
use crate::log::{LOG_FILE, LogLine, read_lines};
use crate::runs::{RunOutcome, RunState, RunSummary, Target};
use crate::{AuditError, AuditRecord, AuditStore, NewRecord, RecordKind};

/// What a salvage did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SalvageReport {
    /// Records copied.
    pub recovered: u64,
    /// Ranges of sequence numbers that could not be recovered.
    pub lost: Vec<(u64, u64)>,
    /// Log lines that were unreadable or failed their hash (line, why).
    pub damaged_lines: Vec<(usize, String)>,
    pub summaries_copied: u64,
    pub summaries_rebuilt: u64,
    /// Why the old sled store could not be read, if it could not.
    pub sled_error: Option<String>,
    /// The `salvaged` record in the new store.
    pub salvage_seq: u64,
}

/// Copy what can be trusted from the store in `from` into a new store in
/// `to` (which must not hold a store yet).
pub fn salvage(from: &Path, to: &Path, clock: SharedClock) -> Result<SalvageReport, AuditError> {
    if to.join("audit.sled").exists() || to.join(LOG_FILE).exists() {
        return Err(AuditError::Open {
            path: to.to_path_buf(),
            message: "already holds an audit store: salvage into an empty folder".into(),
        });
    }
    if crate::index::held_by_engine(from) {
        return Err(AuditError::Locked {
            path: from.to_path_buf(),
            message: "held by a running engine: stop it before salvaging its store".into(),
        });
    }
    let mut good: BTreeMap<u64, AuditRecord> = BTreeMap::new();
    let mut damaged_lines = Vec::new();
    // Summaries the log carries (each after the record that changed it).
    let mut log_summaries: Vec<(RunSummary, Vec<u8>)> = Vec::new();
    let log = from.join(LOG_FILE);
    if log.exists() {
        for l in read_lines(&log)? {
            match l {
                LogLine::Good(r) => {
                    good.insert(r.seq, r);
                }
                LogLine::Bad { line, problem } => damaged_lines.push((line, problem)),
                LogLine::Summary { bytes } => {
                    if let Ok(s) = serde_json::from_slice::<RunSummary>(&bytes) {
                        log_summaries.push((s, bytes));
                    }
                }
            }
        }
    }
    // sled, where it still opens and answers: records the log lacks, and
    // summaries.
    let old = read_old_sled(from);
    for (seq, r) in old.records {
        if r.compute_hash() == r.hash {
            good.entry(seq).or_insert(r);
        }
    }
    // Newest last: the log's, then sled's; the one the chain vouches for wins.
    let mut old_summaries = log_summaries;
    old_summaries.extend(old.summaries);
    let sled_error = old.error;
    // What is missing between the first and the last record found.
    let mut lost = Vec::new();
    let mut excused = Vec::new();
    let mut next = 1u64;
    for &seq in good.keys() {
        if seq > next {
            lost.push((next, seq - 1));
            excused.push(seq);
        }
        next = seq + 1;
    }
    // A record whose predecessor is gone or was replaced cannot link to it.
    let mut prev: Option<&AuditRecord> = None;
    for r in good.values() {
        if let Some(p) = prev
            && p.seq + 1 == r.seq
            && r.prev_hash != p.hash
        {
            excused.push(r.seq);
        }
        prev = Some(r);
    }
    excused.sort_unstable();
    excused.dedup();
    let records: Vec<AuditRecord> = good.into_values().collect();
    // Summaries: the stored one where the chain vouches for it.
    let mut by_run: BTreeMap<String, Vec<&AuditRecord>> = BTreeMap::new();
    for r in &records {
        if let Some(run) = &r.run {
            by_run.entry(run.clone()).or_default().push(r);
        }
    }
    let mut summaries = Vec::new();
    let (mut copied, mut rebuilt) = (0, 0);
    for (run, recs) in &by_run {
        let vouched = recs.iter().rev().find_map(|r| r.data["summary_sha256"].as_str());
        let stored = vouched
            .and_then(|sha| old_summaries.iter().find(|(s, bytes)| &s.id == run && crate::sha256_hex(bytes) == sha));
        match stored {
            Some((s, _)) => {
                summaries.push(s.clone());
                copied += 1;
            }
            _ => {
                if let Some(s) = rebuild_summary(run, recs) {
                    summaries.push(s);
                    rebuilt += 1;
                }
            }
        }
    }
    let head = records.last().map(|r| json!({"seq": r.seq, "hash": r.hash})).unwrap_or(Value::Null);
    let store = create_from(to, &records, &summaries, clock)?;
    let recovered = records.len() as u64;
    let data = json!({
        "from": from.display().to_string(),
        "pre_salvage_head": head,
        "recovered": recovered,
        "lost": lost.iter().map(|(a, b)| json!([a, b])).collect::<Vec<Value>>(),
        "excused": excused,
        "damaged_log_lines": damaged_lines.iter().map(|(l, p)| json!({"line": l, "problem": p})).collect::<Vec<Value>>(),
        "sled_error": sled_error,
        "summaries_copied": copied,
        "summaries_rebuilt": rebuilt,
    });
    let rec = store.append_blocking(NewRecord::new(RecordKind::Salvaged, "nightshift:salvage", data), None)?;
    store.flush()?;
    Ok(SalvageReport {
        recovered,
        lost,
        damaged_lines,
        summaries_copied: copied,
        summaries_rebuilt: rebuilt,
        sled_error,
        salvage_seq: rec.seq,
    })
}

/// A run's summary from its records alone (when the stored one is lost or
/// does not match the chain): what ran, on what, by whom, how it ended.
pub fn rebuild_summary(run: &str, recs: &[&AuditRecord]) -> Option<RunSummary> {
    let queued = recs.iter().find(|r| r.kind == RecordKind::RunQueued)?;
    let finished = recs.iter().rev().find(|r| r.kind == RecordKind::RunFinished);
    let started = recs.iter().find(|r| r.kind == RecordKind::RunStarted);
    let outcome = finished
        .and_then(|f| serde_json::from_value::<RunOutcome>(f.data["outcome"].clone()).ok())
        .unwrap_or(RunOutcome::Interrupted);
    let target: Target = serde_json::from_value(queued.data["target"].clone()).unwrap_or(Target {
        node: queued.node.clone(),
        gpu: queued.gpu,
        group: None,
    });
    let detail = queued.data["detail"].as_str().unwrap_or("").to_string();
    let ending = format!("{} (summary rebuilt from the audit records after a salvage)", outcome.as_str());
    Some(RunSummary {
        id: run.to_string(),
        shadow: queued.data["shadow"] == true,
        runbook: queued.runbook.clone().unwrap_or_default(),
        runbook_digest: None,
        handbook: None,
        target,
        trigger: queued.data["trigger"].as_str().unwrap_or("").to_string(),
        event: queued.data["event"].clone(),
        params: Default::default(),
        dry_run: queued.data["dry_run"] == true,
        requested_by: queued.actor.clone(),
        state: RunState::Finished,
        outcome: Some(outcome),
        why: format!("{detail} — {ending}"),
        detail,
        ending: Some(ending),
        waiting_for: None,
        holds_kept: Vec::new(),
        holds_left: Vec::new(),
        created_ms: queued.ts_ms,
        event_ts_ms: queued.ts_ms,
        started_ms: started.map(|r| r.ts_ms),
        finished_ms: Some(finished.map_or(queued.ts_ms, |r| r.ts_ms)),
        actions: recs.iter().filter(|r| r.kind == RecordKind::ActionResult).count() as u32,
        did: Vec::new(),
        approvals: Vec::new(),
        error: finished.and_then(|f| f.data["error"].as_str().map(str::to_string)),
        nodes: Vec::new(),
    })
}

/// What could be read from a damaged store's sled.
#[derive(Default)]
struct OldSled {
    records: Vec<(u64, AuditRecord)>,
    summaries: Vec<(RunSummary, Vec<u8>)>,
    error: Option<String>,
}

/// Read a damaged store's sled on a thread of its own, keeping what it
/// yields until it fails or stops answering (sled spins on a damaged page;
/// the thread is left to the process's end).
fn read_old_sled(from: &Path) -> OldSled {
    // Read from a copy: sled writes on every open, and salvage writes
    // nothing into the store it reads.
    let copy = match crate::index::SledCopy::of(from) {
        Ok(Some(copy)) => copy,
        Ok(None) => {
            let path = from.join("audit.sled");
            return OldSled { error: Some(format!("no sled store at {}", path.display())), ..OldSled::default() };
        }
        Err(why) => return OldSled { error: Some(why), ..OldSled::default() },
    };
    let path = copy.path.clone();
    let got: Arc<Mutex<OldSled>> = Arc::default();
    let progress = Arc::new(AtomicU64::new(0));
    let (g, p) = (got.clone(), progress.clone());
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let spawned = std::thread::Builder::new().name("salvage-read".into()).spawn(move || {
        let fail = |g: &Mutex<OldSled>, e: String| g.lock().unwrap_or_else(|x| x.into_inner()).error = Some(e);
        match sled::Config::new().path(&path).open() {
            Err(e) => fail(&g, e.to_string()),
            Ok(db) => {
                let trees = db.open_tree("records").and_then(|r| Ok((r, db.open_tree("runs")?)));
                match trees {
                    Err(e) => fail(&g, e.to_string()),
                    Ok((records, runs)) => {
                        for item in records.iter() {
                            let Ok((k, v)) = item else {
                                fail(&g, "a record page cannot be read".into());
                                break;
                            };
                            let seq = u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8]));
                            if let Ok(r) = serde_json::from_slice::<AuditRecord>(&v) {
                                g.lock().unwrap_or_else(|x| x.into_inner()).records.push((seq, r));
                            }
                            p.fetch_add(1, Ordering::SeqCst);
                        }
                        for (_, v) in runs.iter().map_while(|i| i.ok()) {
                            if let Ok(s) = serde_json::from_slice::<RunSummary>(&v) {
                                g.lock().unwrap_or_else(|x| x.into_inner()).summaries.push((s, v.to_vec()));
                            }
                            p.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }
        }
        d.store(true, Ordering::SeqCst);
    });
    if let Err(e) = spawned {
        return OldSled { error: Some(e.to_string()), ..OldSled::default() };
    }
    let mut seen = (0u64, Instant::now());
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let now = progress.load(Ordering::SeqCst);
        if now != seen.0 {
            seen = (now, Instant::now());
        } else if seen.1.elapsed() >= crate::verify::STALL {
            let mut g = got.lock().unwrap_or_else(|x| x.into_inner());
            let last = g.records.last().map(|(s, _)| *s).unwrap_or(0);
            g.error = Some(format!("sled stopped answering after record {last} (damaged data)"));
            return std::mem::take(&mut *g);
        }
    }
    std::mem::take(&mut *got.lock().unwrap_or_else(|x| x.into_inner()))
}

/// A new store in `dir` holding `records` verbatim (sequence numbers and
/// hashes kept) and `summaries`, then opened as usual (its record log
/// catches up with sled on that open).
fn create_from(
    dir: &Path,
    records: &[AuditRecord],
    summaries: &[RunSummary],
    clock: SharedClock,
) -> Result<AuditStore, AuditError> {
    std::fs::create_dir_all(dir).map_err(|e| AuditError::Open { path: dir.into(), message: e.to_string() })?;
    {
        let store = AuditStore::open(dir, clock.clone())?;
        if store.head_seq() != 0 {
            return Err(AuditError::Open {
                path: dir.into(),
                message: "already holds records: salvage into an empty folder".into(),
            });
        }
        let t = &store.trees;
        let w = |e: sled::Error| AuditError::Write(e.to_string());
        for r in records {
            let bytes = serde_json::to_vec(r).map_err(|e| AuditError::Write(e.to_string()))?;
            // sled's copy, as a store from before records.idx holds it: the
            // open below writes the record log from it and builds the index.
            t.sled_records.insert(r.seq.to_be_bytes(), bytes).map_err(w)?;
            if let Some(run) = &r.run {
                t.by_run.insert(index_key(run, r.seq), &[]).map_err(w)?;
            }
            if let Some(node) = &r.node {
                t.by_node.insert(index_key(node, r.seq), &[]).map_err(w)?;
            }
            if r.kind.indexed_by_kind() {
                t.by_kind.insert(index_key(r.kind.as_str(), r.seq), &[]).map_err(w)?;
            }
        }
        for s in summaries {
            let bytes = serde_json::to_vec(s).map_err(|e| AuditError::Write(e.to_string()))?;
            t.runs.insert(s.id.as_bytes(), bytes).map_err(w)?;
            t.runs_by_created.insert(created_key(s.created_ms, &s.id), &[]).map_err(w)?;
        }
        store.flush()?;
    }
    AuditStore::open(dir, clock)
}
