//! The PostgreSQL backend's writer thread. While this engine stands by it
//! follows the database: every `follow_every` it reads the records after
//! its copy's head and hands them to the index thread (sled, the live
//! tail). Once the lease loop took the lease ([`Msg::Lead`]) it catches up
//! one last time and from then on chains appends after the database's
//! head, each group one transaction fenced by the lease term (an insert
//! lands only while this engine still holds the lease at that term, and
//! only if it continues the stored chain): committed before the callers
//! hear back.
//!
//! While the database cannot be reached a group is retried, and its
//! callers wait — the engine stops acting, since nothing is sent before
//! its intent is durable — until it lands or the lease is lost (the lease
//! loop deposes this engine; every waiting and later append is then
//! refused). A group whose commit answer was lost with the connection is
//! recognised by the database's head on the retry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use nightshift_proto::clock::SharedClock;
use tokio_postgres::Client;

use super::index::{Ack, Indexer, Msg, PgOptions, Trees, WriteReq, Written, answer, chain, local_head};
use super::pg::{self, PgAuditError};
use super::{AuditError, GENESIS, VerifyReport};

/// How long opening waits for an unreachable database.
const OPEN_WAIT: Duration = Duration::from_secs(60);

/// Records read from the database per query while following.
const FOLLOW_PAGE: i64 = 2000;

struct PgWriter {
    pg: Arc<PgOptions>,
    rt: tokio::runtime::Runtime,
    db: Option<Client>,
    /// The append statement, prepared on `db`.
    appender: pg::Appender,
    /// The head of this engine's copy (and, while leading, of the chain).
    seq: u64,
    hash: String,
    clock: SharedClock,
    /// The term appends are fenced by, once [`Msg::Lead`] caught up.
    leading: Option<u64>,
    failed: Option<AuditError>,
    pending: Arc<AtomicU64>,
    /// The index's first failure: nothing more is written.
    stopped: super::index::Stopped,
    to_index: std_mpsc::SyncSender<Written>,
    /// Following the database fails now (said once).
    follow_failing: bool,
}

fn db_err(e: impl std::fmt::Display) -> AuditError {
    AuditError::Write(format!("postgres: {e}"))
}

/// Whether a failed statement is worth retrying on a new connection: the
/// connection broke, or the server is shutting down or starting.
fn transient(e: &PgAuditError) -> bool {
    match e {
        PgAuditError::Db(e) => match e.code() {
            None => true,
            Some(c) => {
                let c = c.code();
                c.starts_with("08") || c.starts_with("57P") || c.starts_with("53")
            }
        },
        _ => false,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    pg: Arc<PgOptions>,
    trees: Trees,
    path: PathBuf,
    clock: SharedClock,
    pending: Arc<AtomicU64>,
    rx: std_mpsc::Receiver<Msg>,
    indexer: Indexer,
    opened: std_mpsc::Sender<Result<(), AuditError>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = opened.send(Err(AuditError::Open { path, message: e.to_string() }));
            return;
        }
    };
    let (to_index, written) = std_mpsc::sync_channel::<Written>(1);
    let stopped = indexer.stopped.clone();
    let second = match std::thread::Builder::new().name("audit-index".into()).spawn(move || indexer.run(written)) {
        Ok(t) => t,
        Err(e) => {
            let _ = opened.send(Err(AuditError::Open { path, message: e.to_string() }));
            return;
        }
    };
    let mut w = PgWriter {
        pg,
        rt,
        db: None,
        appender: pg::Appender::default(),
        seq: 0,
        hash: GENESIS.into(),
        clock,
        leading: None,
        failed: None,
        pending,
        stopped,
        to_index,
        follow_failing: false,
    };
    match w.open(&trees, &path) {
        Ok(()) => {
            let _ = opened.send(Ok(()));
        }
        Err(e) => {
            let _ = opened.send(Err(e));
            drop(w);
            let _ = second.join();
            return;
        }
    }
    let to_index = w.to_index.clone();
    let pending = w.pending.clone();
    super::pipeline::run(&mut w, &rx, &to_index, &pending);
    drop(to_index);
    drop(w);
    let _ = second.join();
}

impl PgWriter {
    fn connect(&mut self) -> Result<&mut Client, AuditError> {
        if self.db.as_ref().is_none_or(|c| c.is_closed()) {
            self.db = None;
            let (url, ca) = (self.pg.url.clone(), self.pg.ca_file.clone());
            let c = self
                .rt
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(5), pg::connect(&url, ca.as_deref())).await
                })
                .map_err(|_| AuditError::Write("postgres: no connection within 5 s".into()))?
                .map_err(db_err)?;
            self.db = Some(c);
            self.appender = pg::Appender::default();
        }
        self.db.as_mut().ok_or(AuditError::Closed)
    }

    /// Connect, bring the schema up to date, and make this engine's copy
    /// agree with the database.
    fn open(&mut self, trees: &Trees, path: &Path) -> Result<(), AuditError> {
        let open_err = |e: String| AuditError::Open { path: path.to_path_buf(), message: e };
        // A database that is restarting is waited for (a minute), not
        // reported as a broken store.
        let until = std::time::Instant::now() + OPEN_WAIT;
        let mut warned = false;
        while let Err(e) = self.connect() {
            if std::time::Instant::now() >= until {
                return Err(open_err(format!("{e} (waited {} s)", OPEN_WAIT.as_secs())));
            }
            if !warned {
                tracing::warn!(error = %e, "cannot reach postgres yet: waiting for it");
                warned = true;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let shard = self.pg.shard.clone();
        let (rt, db) = (&self.rt, self.db.as_mut().ok_or(AuditError::Closed)?);
        rt.block_on(pg::migrate_schema(db)).map_err(|e| open_err(e.to_string()))?;
        let (seq, hash) = local_head(trees, path)?;
        let same = seq == 0
            || rt.block_on(pg::hash_at(db, &shard, seq)).map_err(|e| open_err(e.to_string()))?.as_deref()
                == Some(hash.as_str());
        if same {
            (self.seq, self.hash) = (seq, hash);
        } else {
            tracing::warn!(
                local_head = seq,
                shard = %shard,
                "this engine's copy of the audit chain disagrees with the database's: dropping it and reading the database's again"
            );
            for t in [
                &trees.sled_records,
                &trees.by_run,
                &trees.by_node,
                &trees.by_kind,
                &trees.runs,
                &trees.runs_by_created,
            ] {
                t.clear().map_err(|e| open_err(e.to_string()))?;
            }
        }
        self.follow()
    }

    /// Read every record after this copy's head and hand it to the index
    /// thread.
    fn follow(&mut self) -> Result<(), AuditError> {
        let shard = self.pg.shard.clone();
        loop {
            let after = self.seq;
            self.connect()?;
            let (rt, db) = (&self.rt, self.db.as_ref().ok_or(AuditError::Closed)?);
            let page = match rt.block_on(pg::records_after(db, &shard, after, FOLLOW_PAGE)) {
                Ok(p) => p,
                Err(e) => {
                    if transient(&e) {
                        self.db = None;
                    }
                    return Err(db_err(e));
                }
            };
            if page.is_empty() {
                return Ok(());
            }
            let n = page.len() as i64;
            let mut c = super::index::Chain {
                records: vec![],
                lines: vec![],
                ranges: vec![],
                summaries: vec![],
                meta: vec![],
                acks: vec![],
            };
            for (r, summary) in page {
                if r.seq != self.seq + 1 || r.prev_hash != self.hash {
                    return Err(AuditError::Read(format!(
                        "the database's record {} does not continue this engine's copy at record {}: restart the engine to read the chain again",
                        r.seq, self.seq
                    )));
                }
                let meta = summary
                    .as_ref()
                    .and_then(|b| serde_json::from_slice::<crate::runs::RunSummary>(b).ok())
                    .map(|s| (s.id, s.created_ms));
                (self.seq, self.hash) = (r.seq, r.hash.clone());
                let start = c.lines.len();
                let _ = serde_json::to_writer(&mut c.lines, &r);
                c.ranges.push(start..c.lines.len());
                c.records.push(r);
                c.summaries.push(summary);
                c.meta.push(meta);
            }
            if self.to_index.send(Written { chain: c, positions: vec![] }).is_err() {
                return Err(AuditError::Closed);
            }
            if n < FOLLOW_PAGE {
                return Ok(());
            }
        }
    }

    /// The lease was taken at `term`: catch up, then write from the head.
    fn take_lead(&mut self, term: u64) -> Result<u64, AuditError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.follow()?;
        self.leading = Some(term);
        tracing::info!(term, head = self.seq, shard = %self.pg.shard, "leading: audit appends continue the chain from here");
        Ok(self.seq)
    }

    fn refuse(&self, acks: impl IntoIterator<Item = Ack>, e: AuditError) -> Option<Written> {
        for ack in acks {
            answer(&self.pending, ack, Err(e.clone()));
        }
        None
    }

    /// One group, one fenced statement: committed before its callers hear
    /// back (through the index thread).
    fn commit_group(&mut self, batch: Vec<WriteReq>) -> Option<Written> {
        if self.failed.is_none()
            && let Some(e) = super::index::stopped_with(&self.stopped)
        {
            self.failed = Some(e);
        }
        if let Some(e) = &self.failed {
            return self.refuse(batch.into_iter().map(|r| r.ack), e.clone());
        }
        let held = self.pg.leadership.term();
        let term = match (self.leading, held) {
            (Some(t), Some(h)) if t == h => t,
            (Some(_), _) => {
                let e = AuditError::Deposed("the lease moved on".into());
                self.failed = Some(e.clone());
                return self.refuse(batch.into_iter().map(|r| r.ack), e);
            }
            (None, _) => {
                let leader = self.pg.leadership.leader().map_or("no leader is known yet".to_string(), |l| {
                    format!("the leader is {} at term {}", l.holder, l.term)
                });
                return self.refuse(batch.into_iter().map(|r| r.ack), AuditError::NotLeader(leader));
            }
        };
        let c = chain(self.seq, &self.hash, self.clock.now_ms(), batch);
        let logged: Vec<super::LoggedRecord> = c.records.iter().cloned().zip(c.summaries.iter().cloned()).collect();
        let last = c.records.last().map(|r| (r.seq, r.hash.clone()))?;
        let shard = self.pg.shard.clone();
        let lease = self.pg.leadership.cfg.clone();
        let mut attempt = 0u32;
        loop {
            if self.pg.leadership.term() != Some(term) {
                let e = AuditError::Deposed("the lease was lost while the database could not be reached".into());
                self.failed = Some(e.clone());
                return self.refuse(c.acks, e);
            }
            let result = match self.connect().map(|_| ()) {
                Err(e) => Err((true, e)),
                Ok(()) => {
                    let Some(db) = self.db.as_ref() else { continue };
                    let r = self.rt.block_on(pg::append_with(
                        &mut self.appender,
                        db,
                        &shard,
                        &logged,
                        Some((&lease, term)),
                    ));
                    match r {
                        Ok(()) => Ok(()),
                        Err(PgAuditError::NotAppended { seq, why }) => {
                            // A retry of a group that did commit (its answer
                            // was lost with the connection) finds it there.
                            let db = self.db.as_ref().ok_or(AuditError::Closed);
                            let there =
                                db.ok().and_then(|db| self.rt.block_on(pg::hash_at(db, &shard, last.0)).ok().flatten());
                            if attempt > 0 && there.as_deref() == Some(last.1.as_str()) {
                                Ok(())
                            } else {
                                Err((false, AuditError::Deposed(format!("record {seq} was refused: {why}"))))
                            }
                        }
                        Err(e) if transient(&e) => Err((true, db_err(e))),
                        Err(e) => Err((false, db_err(e))),
                    }
                }
            };
            match result {
                Ok(()) => break,
                Err((true, e)) => {
                    if attempt == 0 {
                        tracing::error!(error = %e, "postgres unreachable: acting waits until the audit append lands or the lease is lost");
                    }
                    self.db = None;
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(100 * u64::from(attempt.min(5))));
                }
                Err((false, e)) => {
                    tracing::error!(error = %e, term, "audit append refused by the database: this engine stops writing");
                    // A leader that cannot write cannot act: it steps down
                    // (and exits), so a standby or its own restart takes over.
                    self.pg.leadership.depose(e.to_string());
                    self.failed = Some(e.clone());
                    return self.refuse(c.acks, e);
                }
            }
        }
        (self.seq, self.hash) = last;
        Some(Written { chain: c, positions: Vec::new() })
    }
}

impl super::pipeline::GroupLog for PgWriter {
    fn commit(&mut self, batch: Vec<WriteReq>) -> Option<Written> {
        self.commit_group(batch)
    }

    fn lead(&mut self, term: u64) -> Result<u64, AuditError> {
        self.take_lead(term)
    }

    fn idle_every(&self) -> Option<Duration> {
        Some(self.pg.follow_every)
    }

    /// A standby follows the database. Said once when following stops
    /// working, once when it works again (not every `follow_ms`).
    fn idle(&mut self) {
        if self.leading.is_some() || self.failed.is_some() {
            return;
        }
        match self.follow() {
            Err(e) if !self.follow_failing => {
                tracing::warn!(error = %e, "standby: cannot read new audit records from postgres (retrying)");
                self.follow_failing = true;
            }
            Err(_) => {}
            Ok(()) if self.follow_failing => {
                tracing::info!(head = self.seq, "standby: following postgres again");
                self.follow_failing = false;
            }
            Ok(()) => {}
        }
    }
}

/// `verify` on the database's chain, on a connection of its own.
pub(super) fn verify(pg: &PgOptions) -> Result<VerifyReport, AuditError> {
    let (url, ca, shard) = (pg.url.clone(), pg.ca_file.clone(), pg.shard.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(db_err)?;
        rt.block_on(async {
            let db = pg::connect(&url, ca.as_deref()).await.map_err(|e| AuditError::Read(e.to_string()))?;
            pg::verify(&db, &shard).await.map_err(|e| AuditError::Read(e.to_string()))
        })
    })
    .join()
    .map_err(|_| AuditError::Read("the verify thread failed".into()))?
}
