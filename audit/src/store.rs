//! [`AuditStore`], the façade the engine uses: open (sled or PostgreSQL),
//! append, query, search, verify. The threads and the sled index it runs
//! on are in `index.rs` (a layer below: it names no façade item).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use tokio::sync::{broadcast, oneshot};

use nightshift_proto::clock::SharedClock;

use super::encode::Prepared;
use super::index::*;
use super::log::RecordLog;
use super::pipeline::FileLog;
use super::positions::Positions;
use super::*;

/// The store.
#[derive(Clone)]
pub struct AuditStore {
    pub(super) trees: Trees,
    path: PathBuf,
    writer: Arc<WriterHandle>,
    live: broadcast::Sender<Arc<AuditRecord>>,
    /// How far the index got: every read waits for it to reach what was
    /// answered (`index.rs`, [`Progress`]).
    progress: Arc<Progress>,
    /// PostgreSQL backend: where the chain lives (sled is then this
    /// engine's copy of it, for queries).
    pg: Option<Arc<PgOptions>>,
    /// PostgreSQL backend: the API's shared connection for reads.
    reads: Option<Arc<crate::PgReads>>,
    stopped: Stopped,
}

/// The way to the writer thread. When the last clone of the store goes,
/// the writer finishes what it was given, closes the log (giving back its
/// zero-filled room) and flushes sled before the drop returns.
struct WriterHandle {
    tx: Option<std_mpsc::Sender<Msg>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Appends sent and not yet answered (acknowledged or failed).
    pending: Arc<std::sync::atomic::AtomicU64>,
}

impl WriterHandle {
    fn send(&self, req: WriteReq) -> Result<(), AuditError> {
        let tx = self.tx.as_ref().ok_or(AuditError::Closed)?;
        self.pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let sent = tx.send(Msg::Write(req)).map_err(|_| AuditError::Closed);
        if sent.is_err() {
            self.pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        sent
    }
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for AuditStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditStore").field("path", &self.path).finish()
    }
}

/// The most records one search page reads (a filter that matches little
/// pages through the log instead of reading all of it at once).
pub const SEARCH_SCAN: u64 = 50_000;

/// Whether a record's `actor` is the one asked for: the same, `user:<a>`
/// for a bare name, or any person (`user:…`) for `people`.
pub fn actor_matches(actor: &str, asked: &str) -> bool {
    actor == asked || actor.strip_prefix("user:") == Some(asked) || (asked == "people" && actor.starts_with("user:"))
}

/// What the record browser asks for.
#[derive(Debug, Clone, Default)]
pub struct RecordQuery {
    pub kind: Option<RecordKind>,
    pub node: Option<String>,
    pub run: Option<String>,
    /// `user:alice`, `engine`, `person:bob` — or a bare name for
    /// `user:<name>`, or `people` for anyone signed in (every `user:`).
    pub actor: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Only records older than this seq (the previous page's `next_before_seq`).
    pub before_seq: Option<u64>,
    pub limit: usize,
}

/// A page of the record browser, newest first.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RecordPage {
    pub records: Vec<AuditRecord>,
    /// Pass as `before_seq` for the next (older) page; `None`: no more.
    pub next_before_seq: Option<u64>,
    /// Records read for this page.
    pub scanned: u64,
}

fn index_seq(r: Result<(sled::IVec, sled::IVec), sled::Error>) -> Result<u64, AuditError> {
    let (k, _) = r.map_err(|e| AuditError::Read(e.to_string()))?;
    Ok(u64::from_be_bytes(k[k.len().saturating_sub(8)..].try_into().unwrap_or([0; 8])))
}

impl AuditStore {
    /// Open (or create) the store in `dir`. Fails clearly when another
    /// process holds it.
    pub fn open(dir: &Path, clock: SharedClock) -> Result<AuditStore, AuditError> {
        let positions = || Positions::open(dir).map(Arc::new);
        // A store from before records.idx keeps its records in sled (the
        // first open builds the index, then empties that copy).
        let mut legacy = false;
        let (mut trees, path, (mut seq, mut hash), (log, ahead)) = match open_trees(dir) {
            Ok((trees, path)) if !trees.sled_records.is_empty() => {
                legacy = true;
                let (seq, hash) = local_head(&trees, &path)?;
                let log = RecordLog::open(dir, seq, &hash, |after| {
                    trees
                        .sled_records
                        .range((after + 1).to_be_bytes()..)
                        .map(|item| {
                            let (_, v) = item.map_err(|e| AuditError::Read(e.to_string()))?;
                            serde_json::from_slice(&v).map_err(|e| AuditError::Read(e.to_string()))
                        })
                        .collect()
                })?;
                (trees, path, (seq, hash), log)
            }
            Ok((mut trees, path)) => {
                let p = positions()?;
                trees.records = RecordTable::Log(p.clone());
                let (from, hash) = checkpoint_head(&trees, &p)?;
                let log = if from == 0 {
                    // Nothing vouched for yet: every line must continue the
                    // chain from the start (only a torn last write is cut;
                    // any other line that does not is refused).
                    RecordLog::open_for_rebuild(dir)?
                } else {
                    RecordLog::open(dir, from, &hash, |last| {
                        Err(AuditError::Open {
                            path: dir.join(LOG_FILE),
                            message: format!(
                                "expected the record log to hold every record up to {from} (its index says so), found its \
                                 last record is {last}: the log was cut outside nightshift; run `nightshift audit salvage \
                                 --to NEW_DIR` (its engine.yaml's data_dir is {})",
                                dir.display()
                            ),
                        })
                    })?
                };
                (trees, path, (from, hash), log)
            }
            Err(AuditError::Open { path, message }) => {
                let (mut trees, log) = rebuild_index(dir, &path, &message)?;
                let p = positions()?;
                p.cut_after(0)?;
                trees.records = RecordTable::Log(p);
                (trees, path, (0, GENESIS.to_string()), log)
            }
            Err(e) => return Err(e),
        };
        if let Some(last) = ahead.last() {
            replay(&trees, &ahead)?;
            (seq, hash) = (last.record.seq, last.record.hash.clone());
        }
        if legacy {
            let p = positions()?;
            build_positions(&trees, &p, seq)?;
            trees.records = RecordTable::Log(p);
        } else if let RecordTable::Log(p) = &trees.records {
            // Entries past the log's last record (a torn line cut) go.
            p.cut_after(seq)?;
        }
        let (tx, rx) = std_mpsc::channel::<Msg>();
        let (indexer, live, progress, pending, stopped) = Indexer::new(&trees, seq);
        let writer =
            FileLog { seq, hash, clock, log, failed: None, pending: pending.clone(), stopped: stopped.clone() };
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run_thread(rx, indexer))
            .map_err(|e| AuditError::Open { path: path.clone(), message: e.to_string() })?;
        let writer = Arc::new(WriterHandle { tx: Some(tx), thread: Some(thread), pending });
        Ok(AuditStore { trees, path, writer, live, progress, pg: None, reads: None, stopped })
    }

    /// Open the PostgreSQL backend: the chain lives in the database (shard
    /// `pg.shard`), and sled in `dir` is this engine's copy of it for
    /// queries — caught up now, then kept up by following the database
    /// while standing by, and by this engine's own appends while it leads.
    /// A copy that disagrees with the database (another database, a
    /// restored backup) is dropped and read again. Appends are refused
    /// until [`AuditStore::lead`].
    pub fn open_postgres(dir: &Path, clock: SharedClock, pg: PgOptions) -> Result<AuditStore, AuditError> {
        let (trees, path) = match open_trees(dir) {
            // The copy is read again from the database.
            Err(AuditError::Open { path, message }) => {
                let aside = set_aside(dir, &path).map_err(|why| AuditError::Open {
                    path: path.clone(),
                    message: format!("{message}; and it cannot be set aside to be read again: {why}"),
                })?;
                tracing::error!(
                    index = %path.display(), damaged_copy = %aside.display(), damage = %message,
                    "local audit copy unreadable (a crash mid-write): reading it again from the database"
                );
                open_trees(dir)?
            }
            r => r?,
        };
        let (indexer, live, progress, pending, stopped) = Indexer::new(&trees, 0);
        let (tx, rx) = std_mpsc::channel::<Msg>();
        let (opened_tx, opened) = std_mpsc::channel();
        let pg = Arc::new(pg);
        let (p2, t2, path2, pending2) = (pg.clone(), trees.clone(), path.clone(), pending.clone());
        let thread = std::thread::Builder::new()
            .name("audit-pg-writer".into())
            .spawn(move || super::pgwriter::run(p2, t2, path2, clock, pending2, rx, indexer, opened_tx))
            .map_err(|e| AuditError::Open { path: path.clone(), message: e.to_string() })?;
        let writer = Arc::new(WriterHandle { tx: Some(tx), thread: Some(thread), pending });
        match opened.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(AuditError::Open { path, message: "the audit writer stopped while opening".into() }),
        }
        let reads = Some(Arc::new(crate::PgReads::new(&pg)));
        Ok(AuditStore { trees, path, writer, live, progress, pg: Some(pg), reads, stopped })
    }

    /// PostgreSQL backend: this engine took the lease at `term`. Catch up
    /// with every record the database holds (the last leader's included),
    /// then append from its head on, fenced by `term`. Returns the head.
    pub async fn lead(&self, term: u64) -> Result<u64, AuditError> {
        let tx = self.writer.tx.as_ref().ok_or(AuditError::Closed)?;
        let (ack, rx) = oneshot::channel();
        tx.send(Msg::Lead { term, ack }).map_err(|_| AuditError::Closed)?;
        rx.await.map_err(|_| AuditError::Closed)?
    }

    /// The PostgreSQL backend's settings, when it is the backend.
    pub fn postgres(&self) -> Option<&PgOptions> {
        self.pg.as_deref()
    }

    /// PostgreSQL backend: a connection of its own for one loop of the
    /// shard's lease (campaign, renewals, announcements), not connected yet.
    pub fn lease_db(&self) -> Option<crate::LeaseDb> {
        self.pg.as_deref().map(crate::LeaseDb::new)
    }

    /// PostgreSQL backend: the API's shared connection for reads across
    /// shards (runs, verification, leaders, engines).
    pub fn pg_reads(&self) -> Option<&crate::PgReads> {
        self.reads.as_deref()
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append a record (and optionally the run summary it changes) durably.
    pub async fn append(&self, rec: NewRecord, summary: Option<RunSummary>) -> Result<AuditRecord, AuditError> {
        let (ack, rx) = oneshot::channel();
        self.writer.send(WriteReq { prep: Prepared::new(rec, summary.as_ref()), ack })?;
        rx.await.map_err(|_| AuditError::Closed)?
    }

    /// Append without waiting for durability: the record is queued behind
    /// every earlier append and ahead of every later one, and the writer
    /// stops for good at its first failed log write — so it is durable
    /// before any later `append` returns. For records nothing is acted on
    /// or reported from until a later, awaited record (the hot path of an
    /// automatic run: event, queued, started — then the awaited intent).
    pub fn append_ordered(&self, rec: NewRecord, summary: Option<RunSummary>) -> Result<(), AuditError> {
        let (ack, _) = oneshot::channel();
        self.writer.send(WriteReq { prep: Prepared::new(rec, summary.as_ref()), ack })
    }

    /// `append_ordered`, with a way to learn when the record (and so every
    /// record appended before it) is durable: await the returned future.
    pub fn append_ordered_ack(
        &self,
        rec: NewRecord,
        summary: Option<RunSummary>,
    ) -> Result<impl std::future::Future<Output = Result<AuditRecord, AuditError>> + Send + 'static, AuditError> {
        let (ack, rx) = oneshot::channel();
        self.writer.send(WriteReq { prep: Prepared::new(rec, summary.as_ref()), ack })?;
        Ok(async move { rx.await.map_err(|_| AuditError::Closed)? })
    }

    /// `append` for blocking threads (runbook scripts).
    pub fn append_blocking(&self, rec: NewRecord, summary: Option<RunSummary>) -> Result<AuditRecord, AuditError> {
        let (ack, rx) = oneshot::channel();
        self.writer.send(WriteReq { prep: Prepared::new(rec, summary.as_ref()), ack })?;
        rx.blocking_recv().map_err(|_| AuditError::Closed)?
    }

    /// Appends not yet answered (the simulator waits for none before it
    /// moves time on).
    pub fn pending(&self) -> u64 {
        self.writer.pending.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Why the store accepts nothing more (its first failure to write or
    /// index), or `None` while it works. The engine stops acting and
    /// answers 503 while this is set.
    pub fn stopped(&self) -> Option<AuditError> {
        stopped_with(&self.stopped)
    }

    /// The sequence number of the newest record answered (durable; a read
    /// from now on finds it).
    pub fn head_seq(&self) -> u64 {
        self.progress.answered.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Changes whenever a record of a kind indexed by kind
    /// ([`RecordKind::indexed_by_kind`]: health, marks, modes, hands-off,
    /// maintenance) has been answered: what [`AuditStore::records_of_kind`]
    /// or [`AuditStore::newest_of_kind`] read while it was `v` still holds
    /// while it is `v` — read it before the records, and keep it with what
    /// they said (the engine's fleet mode is read so on every run).
    pub fn kind_changes(&self) -> u64 {
        self.progress.kind_changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The trees, once the index has every record answered so far.
    fn read(&self) -> &Trees {
        self.progress.caught_up();
        &self.trees
    }

    /// Subscribe to records as they become durable.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<AuditRecord>> {
        self.live.subscribe()
    }

    /// One record.
    pub fn get(&self, seq: u64) -> Result<Option<AuditRecord>, AuditError> {
        match self.read().records.get(seq)? {
            Some(v) => serde_json::from_slice(&v).map(Some).map_err(|e| AuditError::Read(format!("record {seq}: {e}"))),
            None => Ok(None),
        }
    }

    /// Records after `after_seq`, oldest first, at most `limit`.
    pub fn tail(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditRecord>, AuditError> {
        let Some(first) = after_seq.checked_add(1) else { return Ok(Vec::new()) };
        self.read()
            .records
            .entries(first, u64::MAX, false)
            .take(limit)
            .map(|r| {
                let (_, v) = r?;
                serde_json::from_slice(&v).map_err(|e| AuditError::Read(e.to_string()))
            })
            .collect()
    }

    fn by_index(
        &self,
        tree: &sled::Tree,
        prefix: &str,
        limit: usize,
        newest_first: bool,
    ) -> Result<Vec<AuditRecord>, AuditError> {
        let mut p = prefix.as_bytes().to_vec();
        p.push(0);
        let iter = tree.scan_prefix(&p);
        let keys: Vec<sled::IVec> = if newest_first {
            iter.rev().take(limit).filter_map(|r| r.ok().map(|(k, _)| k)).collect()
        } else {
            iter.take(limit).filter_map(|r| r.ok().map(|(k, _)| k)).collect()
        };
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let seq = u64::from_be_bytes(k[k.len() - 8..].try_into().unwrap_or([0; 8]));
            if let Some(r) = self.get(seq)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Every record of a run, oldest first.
    pub fn run_records(&self, run: &str) -> Result<Vec<AuditRecord>, AuditError> {
        self.by_index(&self.read().by_run, run, usize::MAX, false)
    }

    /// Every record of a kind [`RecordKind::indexed_by_kind`] names, oldest
    /// first (the health model and node marks are rebuilt from these).
    pub fn records_of_kind(&self, kind: RecordKind) -> Result<Vec<AuditRecord>, AuditError> {
        self.by_index(&self.read().by_kind, kind.as_str(), usize::MAX, false)
    }

    /// The newest record of a kind indexed by kind ([`RecordKind::indexed_by_kind`]).
    pub fn newest_of_kind(&self, kind: RecordKind) -> Result<Option<AuditRecord>, AuditError> {
        Ok(self.by_index(&self.read().by_kind, kind.as_str(), 1, true)?.pop())
    }

    /// The newest records about a node, newest first.
    pub fn node_records(&self, node: &str, limit: usize) -> Result<Vec<AuditRecord>, AuditError> {
        self.by_index(&self.read().by_node, node, limit, true)
    }

    /// Records matching `q`, newest first, for the record browser: through
    /// the run or node index when one is named, else a backward scan of at
    /// most [`SEARCH_SCAN`] records per page. `next_before_seq` continues
    /// the search where this page stopped (`None`: nothing older).
    pub fn search(&self, q: &RecordQuery) -> Result<RecordPage, AuditError> {
        let limit = q.limit.clamp(1, 1000);
        let before = q.before_seq.unwrap_or(u64::MAX);
        let keep = |r: &AuditRecord| {
            q.kind.is_none_or(|k| r.kind == k)
                && q.node.as_deref().is_none_or(|n| r.node.as_deref() == Some(n))
                && q.run.as_deref().is_none_or(|n| r.run.as_deref() == Some(n))
                && q.actor.as_deref().is_none_or(|a| actor_matches(&r.actor, a))
                && q.since_ms.is_none_or(|t| r.ts_ms >= t)
                && q.until_ms.is_none_or(|t| r.ts_ms <= t)
        };
        let mut page = RecordPage::default();
        // The seqs to look at, newest first.
        let seqs: Box<dyn Iterator<Item = Result<u64, AuditError>>> = match (&q.run, &q.node) {
            (Some(run), _) => {
                let mut p = run.as_bytes().to_vec();
                p.push(0);
                Box::new(self.read().by_run.scan_prefix(&p).rev().map(index_seq))
            }
            (None, Some(node)) => {
                let mut p = node.as_bytes().to_vec();
                p.push(0);
                Box::new(self.read().by_node.scan_prefix(&p).rev().map(index_seq))
            }
            (None, None) => Box::new(self.read().records.seqs(1, before.saturating_sub(1), true)),
        };
        for seq in seqs {
            let seq = seq?;
            if seq >= before {
                continue;
            }
            if page.scanned >= SEARCH_SCAN {
                page.next_before_seq = Some(seq + 1);
                break;
            }
            page.scanned += 1;
            let Some(r) = self.get(seq)? else { continue };
            if keep(&r) {
                page.records.push(r);
                if page.records.len() >= limit {
                    page.next_before_seq = Some(seq);
                    break;
                }
            }
        }
        Ok(page)
    }

    /// A run's summary.
    pub fn run(&self, id: &str) -> Result<Option<RunSummary>, AuditError> {
        match self.read().runs.get(id.as_bytes()).map_err(|e| AuditError::Read(e.to_string()))? {
            Some(v) => serde_json::from_slice(&v).map(Some).map_err(|e| AuditError::Read(e.to_string())),
            None => Ok(None),
        }
    }

    /// Runs, newest first, filtered, with a cursor for the next page.
    pub fn runs(&self, f: &RunFilter) -> Result<RunPage, AuditError> {
        let limit = f.limit.unwrap_or(50).clamp(1, 1000);
        let upper: Vec<u8> = match &f.cursor {
            Some(c) => match hex::decode(c) {
                Ok(b) if b.len() > 8 => b,
                _ => {
                    return Err(AuditError::BadCursor(format!(
                        "cursor {:?}: expected the next_cursor of an earlier page, as this server gave it out",
                        c.chars().take(80).collect::<String>()
                    )));
                }
            },
            None => vec![0xff; 9],
        };
        let mut runs = Vec::new();
        let mut next_cursor = None;
        for item in self.read().runs_by_created.range(..upper).rev() {
            let (k, _) = item.map_err(|e| AuditError::Read(e.to_string()))?;
            let created = u64::from_be_bytes(k[..8].try_into().unwrap_or([0; 8])) as i64;
            if f.since_ms.is_some_and(|s| created < s) {
                break;
            }
            if f.until_ms.is_some_and(|u| created > u) {
                continue;
            }
            let id = String::from_utf8_lossy(&k[8..]).into_owned();
            // One unreadable summary must not hide the rest of the timeline.
            let run = match self.run(&id) {
                Ok(Some(run)) => run,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(run = %id, error = %e, "a run summary cannot be read; left out of the listing");
                    continue;
                }
            };
            let keep = f.node.as_ref().is_none_or(|n| run.target.node.as_ref() == Some(n) || run.nodes.contains(n))
                && f.gpu.is_none_or(|g| run.target.gpu == Some(g))
                && f.runbook.as_ref().is_none_or(|r| &run.runbook == r)
                && f.outcome.is_none_or(|o| run.outcome == Some(o))
                && f.state.is_none_or(|s| run.state == s)
                && f.nodes_any.as_ref().is_none_or(|any| {
                    run.target.node.as_ref().is_some_and(|n| any.contains(n))
                        || run.nodes.iter().any(|n| any.contains(n))
                });
            if !keep {
                continue;
            }
            if runs.len() == limit {
                next_cursor = Some(hex::encode(created_key(
                    runs.last().map_or(0, |r: &RunSummary| r.created_ms),
                    &runs.last().map_or(String::new(), |r: &RunSummary| r.id.clone()),
                )));
                break;
            }
            runs.push(run);
        }
        Ok(RunPage { runs, next_cursor })
    }

    /// How many runs the store holds.
    pub fn run_count(&self) -> Result<u64, AuditError> {
        Ok(self.read().runs.len() as u64)
    }

    /// Records written at or after `since_ms`, oldest first (for rebuilding
    /// the executor's memory). Reads backwards from the newest record and
    /// stops at the first older one: time in the log never goes back by
    /// more than a clock step, which this allows a minute of.
    pub fn records_since(&self, since_ms: i64) -> Result<Vec<AuditRecord>, AuditError> {
        let mut out = Vec::new();
        for item in self.read().records.entries(1, u64::MAX, true) {
            let (_, v) = item?;
            let r: AuditRecord = serde_json::from_slice(&v).map_err(|e| AuditError::Read(e.to_string()))?;
            if r.ts_ms < since_ms.saturating_sub(60_000) {
                break;
            }
            if r.ts_ms >= since_ms {
                out.push(r);
            }
        }
        out.reverse();
        Ok(out)
    }

    /// Runs not finished (for recovery after a crash).
    pub fn unfinished_runs(&self) -> Result<Vec<RunSummary>, AuditError> {
        let mut out = Vec::new();
        for item in self.read().runs.iter() {
            let (k, v) = item.map_err(|e| AuditError::Read(e.to_string()))?;
            // A summary that cannot be read is reported, not fatal: recovery
            // must still start the engine (its records are in the chain).
            let r: RunSummary = match serde_json::from_slice(&v) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(run = %String::from_utf8_lossy(&k), error = %e, "a run summary cannot be read; recovery skips it");
                    continue;
                }
            };
            if r.state != RunState::Finished {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Walk the whole chain: sequence gap-free from 1, each hash correct,
    /// each link to the previous record intact (except the breaks a
    /// `salvaged` record documents); then each run summary against the
    /// chain, and the record log against itself. The report names the
    /// first record that cannot be read or does not check out — also when
    /// sled stops answering on a damaged page (it spins rather than fail).
    pub fn verify(&self) -> Result<VerifyReport, AuditError> {
        if let Some(pg) = &self.pg {
            return super::pgwriter::verify(pg);
        }
        let log = self.path.parent().map(|d| d.join(super::log::LOG_FILE));
        super::verify::verify(self.read().clone(), log)
    }

    /// Make everything written so far durable.
    pub fn flush(&self) -> Result<(), AuditError> {
        if let RecordTable::Log(p) = &self.read().records {
            p.sync()?;
        }
        self.read().db.flush().map(|_| ()).map_err(|e| AuditError::Write(e.to_string()))
    }

    /// Tests only: overwrite the stored bytes of record `seq` with `f(bytes)`,
    /// as an attacker with disk access would: in sled's copy (PostgreSQL's
    /// local copy), or in the record log's line (a file store's only copy;
    /// the entries of `records.idx` after it move with it).
    #[doc(hidden)]
    pub fn tamper_for_tests(&self, seq: u64, f: impl FnOnce(&mut Vec<u8>)) -> Result<(), AuditError> {
        match &self.read().records {
            RecordTable::Sled(t) => {
                let key = seq.to_be_bytes();
                let mut bytes =
                    t.get(key).map_err(|e| AuditError::Read(e.to_string()))?.map(|v| v.to_vec()).unwrap_or_default();
                f(&mut bytes);
                t.insert(key, bytes).map_err(|e| AuditError::Write(e.to_string()))?;
            }
            RecordTable::Log(p) => self.rewrite_log_for_tests(p, seq, |line| {
                if let Some(l) = line {
                    f(l);
                }
            })?,
        }
        self.flush()
    }

    /// Tests only: delete record `seq`.
    #[doc(hidden)]
    pub fn delete_for_tests(&self, seq: u64) -> Result<(), AuditError> {
        match &self.read().records {
            RecordTable::Sled(t) => {
                t.remove(seq.to_be_bytes()).map_err(|e| AuditError::Write(e.to_string()))?;
            }
            RecordTable::Log(p) => self.rewrite_log_for_tests(p, seq, |line| *line = None)?,
        }
        self.flush()
    }

    /// Rewrite record `seq`'s line of the record log (`None`: remove it and
    /// its summary line), and move the entries of `records.idx` after it by
    /// the bytes it gained or lost (as an attacker who knows the format
    /// would). The writer's own end of the log is not moved: append nothing
    /// after a rewrite that changes a line's length.
    fn rewrite_log_for_tests(
        &self,
        p: &Positions,
        seq: u64,
        f: impl FnOnce(&mut Option<&mut Vec<u8>>),
    ) -> Result<(), AuditError> {
        use super::positions::Position;
        let log = p.log_path().to_path_buf();
        let Some(at) = p.position(seq)? else { return Ok(()) };
        let mut text = std::fs::read(&log).map_err(|e| AuditError::Read(e.to_string()))?;
        let (start, end) = (at.offset as usize, at.offset as usize + at.len as usize);
        let mut line = text[start..end].to_vec();
        let mut slot = Some(&mut line);
        f(&mut slot);
        let removed = slot.is_none();
        let (cut_end, replacement) = if removed {
            let mut e = end + 1;
            if text[e..].starts_with(format!("{{\"summary_of\":{seq},").as_bytes())
                && let Some(nl) = text[e..].iter().position(|b| *b == b'\n')
            {
                e += nl + 1;
            }
            (e, Vec::new())
        } else {
            (end, line)
        };
        let delta = replacement.len() as i64 - (cut_end - start) as i64;
        let new_len = replacement.len() as u32;
        text.splice(start..cut_end, replacement);
        std::fs::write(&log, &text).map_err(|e| AuditError::Write(e.to_string()))?;
        for s in 1..=p.count() {
            let Some(q) = p.position(s)? else { continue };
            if s == seq {
                if removed {
                    p.clear_for_tests(s)?;
                } else {
                    p.put(s, &[Position { offset: q.offset, len: new_len }])?;
                }
            } else if q.offset > at.offset {
                p.put(s, &[Position { offset: (q.offset as i64 + delta) as u64, len: q.len }])?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::clock::VirtualClock;
    use serde_json::json;

    fn clock() -> SharedClock {
        Arc::new(VirtualClock::new(1_000))
    }

    #[test]
    fn the_actor_filter_answers_for_a_name_a_whole_actor_and_people() {
        // (record's actor, asked for, matches)
        let cases = [
            ("user:alice", "alice", true),
            ("user:alice", "user:alice", true),
            ("user:alice", "people", true),
            ("user:alice", "bob", false),
            ("engine", "people", false),
            ("engine", "engine", true),
            ("agent:n1", "people", false),
            ("alertmanager", "alice", false),
            ("user:people", "people", true),
        ];
        for (actor, asked, want) in cases {
            assert_eq!(actor_matches(actor, asked), want, "{actor} asked as {asked}");
        }
    }

    /// A caller that reads right after its append returned sees its
    /// record, by seq, by run and in its run's summary: a group is answered
    /// before it is indexed, and every read waits for the index to reach
    /// what was answered ([`Progress::caught_up`]; without that wait this
    /// fails). Many writers, so groups are large and their indexing long.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_after_an_answer_sees_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        let mut tasks = Vec::new();
        for w in 0..32 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40 {
                    let run = format!("r{w}-{i}");
                    let rec = NewRecord::new(RecordKind::RunQueued, "engine", serde_json::json!({"i": i})).run(&run);
                    let mut sum = crate::verify::tests::summary(&run, "");
                    sum.detail = format!("w{w} i{i}");
                    let r = s.append(rec, Some(sum)).await.unwrap();
                    assert!(s.get(r.seq).unwrap().is_some(), "record {} not readable after its answer", r.seq);
                    let of_run = s.run_records(&run).unwrap();
                    assert_eq!(of_run.iter().map(|x| x.seq).collect::<Vec<_>>(), [r.seq], "run {run}'s records");
                    let summary = s.run(&run).unwrap().map(|x| x.detail);
                    assert_eq!(summary.as_deref(), Some(format!("w{w} i{i}").as_str()), "run {run}'s summary");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(s.head_seq(), 32 * 40);
        assert_eq!(s.tail(0, usize::MAX).unwrap().len(), 32 * 40);
    }

    /// `kind_changes` has moved by the time an append of a kind indexed by
    /// kind is answered — so a value kept beside it (the engine's fleet
    /// mode) is read again — and stays put for other kinds.
    #[tokio::test]
    async fn kind_changes_moves_before_the_answer_of_a_kind_indexed_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        let v0 = s.kind_changes();
        s.append(NewRecord::new(RecordKind::RunQueued, "engine", serde_json::json!({})).run("r1"), None).await.unwrap();
        s.append_ordered(NewRecord::new(RecordKind::EventReceived, "engine", serde_json::json!({})), None).unwrap();
        s.append(NewRecord::new(RecordKind::Note, "engine", serde_json::json!({})), None).await.unwrap();
        assert_eq!(s.kind_changes(), v0, "no record of a kind indexed by kind");
        let mode = NewRecord::new(RecordKind::FleetMode, "user:alice", serde_json::json!({"to": "paused"}));
        let r = s.append(mode, None).await.unwrap();
        let v1 = s.kind_changes();
        assert_ne!(v1, v0, "a fleet_mode record answered");
        assert_eq!(s.newest_of_kind(RecordKind::FleetMode).unwrap().map(|x| x.seq), Some(r.seq));
        s.append(NewRecord::new(RecordKind::Note, "engine", serde_json::json!({})), None).await.unwrap();
        assert_eq!(s.kind_changes(), v1);
    }

    #[tokio::test]
    async fn chain_verifies_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..20 {
                let r = s
                    .append(
                        NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run("r1").node(Some("n1")),
                        None,
                    )
                    .await
                    .unwrap();
                assert_eq!(r.seq, i + 1);
            }
            assert!(s.verify().unwrap().ok);
        }
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 20);
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({})), None).await.unwrap();
        assert_eq!(r.seq, 21);
        let v = s.verify().unwrap();
        assert_eq!((v.ok, v.verified_up_to, v.records), (true, 21, 21));
        assert_eq!(s.run_records("r1").unwrap().len(), 20);
        assert_eq!(s.node_records("n1", 5).unwrap()[0].seq, 20, "newest first");
    }

    /// Regression (CI, kill -9 loop iteration 90: "Read corrupted data at
    /// file offset None"): sled left unreadable by a crash is only an index;
    /// it is set aside and rebuilt from the record log, with every record,
    /// its run and node views and summaries back.
    #[tokio::test]
    async fn an_unreadable_index_is_rebuilt_from_the_record_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..30 {
                s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run("r1").node(Some("n1")), None)
                    .await
                    .unwrap();
            }
        }
        let conf = dir.path().join("audit.sled").join("conf");
        std::fs::write(&conf, b"not a sled config at all \xff\xfe").unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 30);
        let v = s.verify().unwrap();
        assert_eq!((v.ok, v.verified_up_to), (true, 30), "{v:?}");
        assert_eq!(s.run_records("r1").unwrap().len(), 30);
        assert_eq!(s.node_records("n1", 5).unwrap()[0].seq, 30);
        assert!(dir.path().join("audit.sled.damaged").join("conf").exists(), "the damaged index is kept aside");
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({})), None).await.unwrap();
        assert_eq!(r.seq, 31);
    }

    /// With no index to compare against, a log line that breaks the chain
    /// is refused (never cut), sled is put back as it was, and the message
    /// says what to run.
    #[tokio::test]
    async fn an_unreadable_index_over_a_damaged_log_is_refused_and_nothing_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..10 {
                s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})), None).await.unwrap();
            }
        }
        let log = dir.path().join(LOG_FILE);
        let text = std::fs::read_to_string(&log).unwrap();
        let edited = text.replacen("\"i\":3", "\"i\":33", 1);
        assert_ne!(text, edited);
        std::fs::write(&log, &edited).unwrap();
        let conf = dir.path().join("audit.sled").join("conf");
        std::fs::write(&conf, b"not a sled config at all \xff\xfe").unwrap();
        let e = AuditStore::open(dir.path(), clock()).unwrap_err().to_string();
        assert!(e.contains("cannot be rebuilt from the record log") && e.contains("nightshift audit salvage"), "{e}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), edited, "the log is left whole");
        assert_eq!(std::fs::read(&conf).unwrap(), b"not a sled config at all \xff\xfe", "sled is put back as it was");
    }

    /// Regression (kill -9 during the log write): a torn last line is cut
    /// on open, so the next record does not glue itself onto it.
    #[tokio::test]
    async fn a_torn_last_log_line_is_cut_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..5 {
                s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})), None).await.unwrap();
            }
        }
        let log = dir.path().join(super::super::log::LOG_FILE);
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut f, br#"{"seq":6,"ts_ms":1000,"kind":"note","run":null,"node":null,"gpu":nu"#)
            .unwrap();
        drop(f);
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 5);
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": 5})), None).await.unwrap();
        assert_eq!(r.seq, 6);
        let v = s.verify().unwrap();
        assert_eq!((v.ok, v.verified_up_to), (true, 6), "{v:?}");
        drop(s);
        assert!(std::fs::read(&log).unwrap().ends_with(b"\n"), "closed cleanly, the log ends in its last line");
    }

    /// One failed log write stops the writer for good: a record appended
    /// in order and lost to the failure can never be missing behind a later
    /// record that was acknowledged.
    #[tokio::test]
    async fn after_a_failed_log_write_nothing_more_is_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": 1})), None).await.unwrap();
            super::super::log::FAIL_NEXT_APPEND.lock().unwrap().push(dir.path().join(super::super::log::LOG_FILE));
            // The ordered record meets the (one) failure...
            s.append_ordered(NewRecord::new(RecordKind::Note, "engine", json!({"i": 2})), None).unwrap();
            while s.pending() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            // ...and the awaited one after it, in a group of its own, is
            // refused, though the disk would take it now.
            let e = s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": 3})), None).await.unwrap_err();
            assert!(e.to_string().contains("accepts nothing more"), "{e}");
            assert_eq!(s.head_seq(), 1);
            assert_eq!(s.pending(), 0, "every append answered");
        }
        // A restart starts clean, with the chain intact.
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 1);
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": 4})), None).await.unwrap();
        assert_eq!(r.seq, 2);
        assert!(s.verify().unwrap().ok);
    }

    #[tokio::test]
    async fn flipping_any_byte_of_any_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        for i in 0..6 {
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"text": format!("note {i}")})), None)
                .await
                .unwrap();
        }
        for seq in 1..=6u64 {
            let original = s.get(seq).unwrap().unwrap();
            let bytes = serde_json::to_vec(&original).unwrap();
            // Flip bytes at several positions of this record.
            for pos in [0, bytes.len() / 3, bytes.len() / 2, bytes.len() - 2] {
                s.tamper_for_tests(seq, |b| b[pos] ^= 0x01).unwrap();
                let v = s.verify().unwrap();
                assert!(!v.ok, "seq {seq} pos {pos} not detected");
                assert_eq!(v.first_bad_seq, Some(seq), "seq {seq} pos {pos}: {v:?}");
                s.tamper_for_tests(seq, |b| *b = bytes.clone()).unwrap();
                assert!(s.verify().unwrap().ok);
            }
        }
        s.delete_for_tests(3).unwrap();
        let v = s.verify().unwrap();
        assert_eq!(v.first_bad_seq, Some(3));
        assert!(v.problem.unwrap().contains("record 3 is missing (the next record is 4)"));
    }

    /// Regression: without exact float parsing, a stored record read back
    /// could differ in the last bit and fail verification.
    #[tokio::test]
    async fn floats_survive_the_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        for v in [97.76550102233888, 0.1 + 0.2, 1e-300, 123456.789012345, -0.0, f64::MAX, 2.0f32 as f64 / 3.0] {
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"v": v})), None).await.unwrap();
        }
        let v = s.verify().unwrap();
        assert!(v.ok, "{v:?}");
    }

    /// A crash leaves records.idx unsynced past the last checkpoint (stale
    /// or zeroed pages) and perhaps entries past the log: the open rewrites
    /// every entry after the checkpoint from the log and cuts the rest.
    #[tokio::test]
    async fn the_index_past_its_checkpoint_is_rebuilt_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..20 {
                let rec = NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run(&format!("r{}", i % 3));
                s.append(rec, None).await.unwrap();
            }
        }
        {
            let (t, _) = open_trees(dir.path()).unwrap();
            assert_eq!(checkpoint(&t).unwrap(), 20, "a clean close checkpoints everything");
            t.meta.insert(b"checkpoint", &5u64.to_be_bytes()).unwrap();
            t.db.flush().unwrap();
        }
        let idx = dir.path().join(super::super::positions::IDX_FILE);
        let mut bytes = std::fs::read(&idx).unwrap();
        assert_eq!(bytes.len(), 20 * 16);
        for b in &mut bytes[6 * 16..12 * 16] {
            *b = 0;
        }
        for b in &mut bytes[12 * 16..14 * 16] {
            *b ^= 0x5a;
        }
        let first: [u8; 16] = bytes[..16].try_into().unwrap();
        bytes.extend_from_slice(&first);
        std::fs::write(&idx, &bytes).unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!(s.head_seq(), 20);
        for seq in 1..=20 {
            assert_eq!(s.get(seq).unwrap().unwrap().seq, seq);
        }
        assert_eq!(std::fs::metadata(&idx).unwrap().len(), 20 * 16, "the entry past the log is cut");
        assert_eq!(s.run_records("r1").unwrap().len(), 7);
        assert!(s.verify().unwrap().ok);
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({})), None).await.unwrap();
        assert_eq!(r.seq, 21);
    }

    /// A store from before records.idx held every record twice, in the log
    /// and in sled: its first open builds the index from the log and
    /// empties sled's copy; the chain and every query read as before.
    #[tokio::test]
    async fn a_store_with_records_in_sled_gets_its_index_built_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = Vec::new();
        {
            let s = AuditStore::open(dir.path(), clock()).unwrap();
            for i in 0..12 {
                let rec = NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).run("r1");
                lines.push(s.append(rec, None).await.unwrap());
            }
        }
        {
            // As the old format left it: records in sled, no index file, no
            // checkpoint.
            let (t, _) = open_trees(dir.path()).unwrap();
            for r in &lines {
                t.sled_records.insert(r.seq.to_be_bytes(), serde_json::to_vec(r).unwrap()).unwrap();
            }
            t.meta.clear().unwrap();
            t.db.flush().unwrap();
        }
        std::fs::remove_file(dir.path().join(super::super::positions::IDX_FILE)).unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert!(s.trees.sled_records.is_empty(), "sled's copy is emptied");
        assert!(matches!(s.trees.records, RecordTable::Log(_)));
        assert_eq!(checkpoint(&s.trees).unwrap(), 12);
        assert_eq!(s.head_seq(), 12);
        assert_eq!(s.run_records("r1").unwrap(), lines);
        assert!(s.verify().unwrap().ok);
        let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({})), None).await.unwrap();
        assert_eq!(r.seq, 13);
        drop(s);
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        assert_eq!((s.head_seq(), s.get(13).unwrap().unwrap().hash), (13, r.hash));
    }

    #[tokio::test]
    async fn concurrent_appends_are_gap_free() {
        let dir = tempfile::tempdir().unwrap();
        let s = AuditStore::open(dir.path(), clock()).unwrap();
        let mut tasks = Vec::new();
        for w in 0..16 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..25 {
                    s.append(NewRecord::new(RecordKind::Note, "engine", json!({"w": w, "i": i})), None).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let v = s.verify().unwrap();
        assert_eq!((v.ok, v.records), (true, 400));
    }
}
