//! The one group-commit loop. Callers' appends are taken a group at a
//! time — as many as wait, up to [`MAX_GROUP`] — chained and written by a
//! [`GroupLog`], made durable, and handed to the index thread, which puts
//! them in sled and answers the callers while the next group is made
//! durable. Both backends run this loop; they differ in what makes a group
//! durable — one fenced PostgreSQL statement (`pgwriter.rs`), or one
//! `fdatasync` of `records.jsonl` ([`FileLog`]) — and in what an idle
//! writer does (a PostgreSQL standby follows the database).
//!
//! The file log's fdatasync runs on a thread of its own, the syncer
//! ([`sync_groups`]): while it syncs one group, the writer chains and
//! writes the appends that come meanwhile, and the syncer's next
//! fdatasync takes all of them at once. The disk is then never idle while
//! a group is being chained (with 64 writers, about a sixth of each cycle
//! before: docs/BENCHMARKS.md, scenario 5). A small group written while the
//! syncer has nothing is synced by the writer itself ([`Direct`]), so a
//! few writers pay no hand-off between threads. Either way nothing is
//! answered before its fdatasync returned, and groups reach the index in
//! log order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use nightshift_proto::clock::SharedClock;

use super::AuditError;
use super::index::{
    INDEX_POLL_MICROS, INDEX_POLL_UNDER, Msg, NoMsg, Stopped, WriteReq, Written, answer, chain, recv_polling,
    recv_soon_within, stop, stopped_with,
};
use super::log::{LogSyncer, RecordLog};
use super::positions::Position;

/// The most requests one group takes.
pub(super) const MAX_GROUP: usize = 4096;

/// What makes a group durable: the log the loop writes.
pub(super) trait GroupLog {
    /// What [`GroupLog::commit`] hands on: a durable group (for the index),
    /// or one written and not yet durable (for the file log's syncer).
    type Group;
    /// Chain `batch` after the log's head and write it. The group for the
    /// next stage, or `None` when the log refused it (its callers have
    /// their error then).
    fn commit(&mut self, batch: Vec<WriteReq>) -> Option<Self::Group>;
    /// This engine took the lease at `term`: catch up, and write from the
    /// head on. Answers the head's sequence number.
    fn lead(&mut self, term: u64) -> Result<u64, AuditError>;
    /// How long the loop waits for an append before [`GroupLog::idle`]
    /// (`None`: it sleeps until one comes).
    fn idle_every(&self) -> Option<Duration> {
        None
    }
    /// Work while no append comes.
    fn idle(&mut self) {}
    /// Whether a group waits for the appends it expects (see [`run`]). The
    /// file log's writer does not: its syncer gathers what it syncs.
    fn may_gather(&self) -> bool {
        true
    }
}

/// How long a group waits for the appends it expects (see [`run`]).
const GATHER: Duration = Duration::from_micros(60);

/// A group waits only when it expects at most this many appends: more
/// writers than that fill the next group while this one syncs, and the
/// wait would cost the CPU they need (docs/BENCHMARKS.md, scenario 5).
const GATHER_UP_TO: usize = 16;

/// The loop: until every sender is gone (the store closed) or the index
/// thread stopped.
///
/// A group takes what waits, and then — for at most [`GATHER`] — the
/// appends it expects: as many as the group before it had, or as many as
/// are not yet answered (`pending`), whichever is more, when that is at
/// most [`GATHER_UP_TO`]. Without that wait, a few writers who each await
/// their append split into two groups that take turns (one syncs while the
/// other's callers are being answered), each sync carrying about half of
/// them; with it, they come back in time to share one. One writer expects
/// one append and never waits.
pub(super) fn run<G>(
    log: &mut dyn GroupLog<Group = G>,
    rx: &std_mpsc::Receiver<Msg>,
    to_index: &std_mpsc::SyncSender<G>,
    pending: &AtomicU64,
) {
    let mut last_group = 0usize;
    loop {
        let first = match recv_soon_within(rx, log.idle_every()) {
            Err(NoMsg::Closed) => return,
            Err(NoMsg::Idle) => {
                log.idle();
                continue;
            }
            Ok(Msg::Lead { term, ack }) => {
                let _ = ack.send(log.lead(term));
                continue;
            }
            Ok(Msg::Write(w)) => w,
        };
        let waiting = pending.load(Ordering::SeqCst) as usize;
        let mut batch = Vec::with_capacity(waiting.max(last_group).clamp(1, MAX_GROUP));
        batch.push(first);
        let mut lead = None;
        let mut expect = last_group.max(waiting);
        if expect > GATHER_UP_TO || !log.may_gather() {
            expect = 0;
        }
        let until = Instant::now() + GATHER;
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(Msg::Write(r)) => batch.push(r),
                // Appends sent before it are written first.
                Ok(m @ Msg::Lead { .. }) => {
                    lead = Some(m);
                    break;
                }
                Err(std_mpsc::TryRecvError::Empty) if batch.len() < expect && Instant::now() < until => {
                    std::thread::yield_now()
                }
                Err(_) => break,
            }
        }
        last_group = batch.len();
        if let Some(w) = log.commit(batch)
            && to_index.send(w).is_err()
        {
            return;
        }
        if let Some(Msg::Lead { term, ack }) = lead {
            let _ = ack.send(log.lead(term));
        }
    }
}

/// The first stage: chains a group of requests into records and makes
/// them durable in the record log (one fdatasync), then hands them on.
pub(super) struct FileLog {
    pub(super) seq: u64,
    pub(super) hash: String,
    pub(super) clock: SharedClock,
    pub(super) log: RecordLog,
    /// The first failed log write: every later append fails with it, so a
    /// record appended in order is never missing behind a later one.
    pub(super) failed: Option<AuditError>,
    pub(super) pending: Arc<AtomicU64>,
    pub(super) stopped: Stopped,
    /// Set by [`FileLog::run_thread`]: what the writer needs to sync a small
    /// group itself.
    pub(super) direct: Option<Direct>,
}

/// A small group (at most [`GATHER_UP_TO`] records) written while the
/// syncer has nothing is synced by the writer itself and handed straight to
/// the index: a few writers then cost no hand-off between threads (which
/// the syncer would add to each of their cycles), and no later group is
/// being chained meanwhile that the hand-off would let overlap the sync.
pub(super) struct Direct {
    syncer: LogSyncer,
    to_index: std_mpsc::SyncSender<Written>,
    /// Groups handed to the syncer and not yet handed on by it.
    busy: Arc<AtomicU64>,
}

/// A group in the record log's file and not yet durable: on its way to
/// the syncer.
pub(super) struct Unsynced {
    group: Written,
    /// Where its lines are in the log.
    at: u64,
    len: usize,
}

impl GroupLog for FileLog {
    type Group = Unsynced;

    /// Chain, encode and write one group for the syncer to make durable;
    /// `None` when the log refused it (its callers have their error then),
    /// or synced it itself (see [`Direct`]).
    fn commit(&mut self, batch: Vec<WriteReq>) -> Option<Unsynced> {
        if self.failed.is_none() {
            self.failed = stopped_with(&self.stopped);
        }
        if let Some(e) = &self.failed {
            for req in batch {
                answer(&self.pending, req.ack, Err(e.clone()));
            }
            return None;
        }
        let c = chain(self.seq, &self.hash, self.clock.now_ms(), batch);
        let (seq, prev) = c.records.last().map_or((self.seq, self.hash.clone()), |r| (r.seq, r.hash.clone()));
        let base = self.log.len();
        let positions =
            c.ranges.iter().map(|r| Position { offset: base + r.start as u64, len: r.len() as u32 }).collect();
        match self.log.write_bytes(&c.lines) {
            Ok(at) => {
                self.seq = seq;
                self.hash = prev;
                let len = c.lines.len();
                let group = Written { chain: c, positions };
                let Some(d) = &self.direct else {
                    return Some(Unsynced { group, at, len });
                };
                #[cfg(test)]
                let hand_on = self.log.always_hand_on();
                #[cfg(not(test))]
                let hand_on = false;
                if hand_on || group.chain.acks.len() > GATHER_UP_TO || d.busy.load(Ordering::SeqCst) > 0 {
                    d.busy.fetch_add(1, Ordering::SeqCst);
                    return Some(Unsynced { group, at, len });
                }
                // The syncer records a failed sync before it counts its groups
                // out: a group written behind one it lost is refused here, and
                // not synced again (a retried fdatasync can report success for
                // pages it lost).
                let synced = match stopped_with(&self.stopped) {
                    Some(e) => Err(e),
                    None => d.syncer.sync().map_err(|e| log_failed(&e)),
                };
                match synced {
                    // The index thread outlives this one.
                    Ok(()) => drop(d.to_index.send(group)),
                    Err(e) => {
                        d.syncer.zero(at, len);
                        for ack in group.chain.acks {
                            answer(&self.pending, ack, Err(e.clone()));
                        }
                        stop(&self.stopped, &e);
                        self.failed = Some(e);
                    }
                }
                None
            }
            Err(e) => {
                let e = log_failed(&e);
                for ack in c.acks {
                    answer(&self.pending, ack, Err(e.clone()));
                }
                stop(&self.stopped, &e);
                self.failed = Some(e);
                None
            }
        }
    }

    fn lead(&mut self, _term: u64) -> Result<u64, AuditError> {
        Err(AuditError::Write(
            "leadership needs the PostgreSQL backend (audit.postgres in engine.yaml): a file log has one writer, this engine"
                .into(),
        ))
    }
}

/// The store's words for a failed write or fdatasync of the record log.
fn log_failed(e: &AuditError) -> AuditError {
    tracing::error!(error = %e, "audit write failed: no more appends are accepted until a restart");
    AuditError::Write(format!(
        "the record log could not be written ({e}); the audit store accepts nothing more and the engine has stopped \
         acting: free space on the engine's data disk (or fix it) and restart the engine"
    ))
}

/// The syncer: makes the groups the writer wrote durable — every group
/// that waits, in one fdatasync — and hands them to the index thread in
/// order. The writer chains and writes the next groups meanwhile, so the
/// disk is not idle while a group is chained. After a failed fdatasync,
/// that group and every later one are zeroed in the file and refused, and
/// the store stops (the writer refuses what comes next): no record is
/// acknowledged behind one that was lost.
fn sync_groups(
    syncer: &LogSyncer,
    rx: &std_mpsc::Receiver<Unsynced>,
    to_index: &std_mpsc::SyncSender<Written>,
    pending: &AtomicU64,
    busy: &AtomicU64,
    stopped: &Stopped,
) {
    let mut failed: Option<AuditError> = None;
    let mut groups: Vec<Unsynced> = Vec::new();
    let mut last_sync = 0usize;
    // After a small sync it polls as the index thread does: the next group
    // comes soon, and waking this thread from sleep would cost a few
    // writers a good part of their cycle.
    while let Ok(first) = recv_polling(rx, if last_sync < INDEX_POLL_UNDER { INDEX_POLL_MICROS } else { 0 }, None) {
        // As [`run`] gathers a group: what waits, then for at most
        // [`GATHER`] the records it expects when they are few.
        let mut records = first.group.chain.acks.len();
        groups.push(first);
        let mut expect = last_sync.max(pending.load(Ordering::SeqCst) as usize);
        if expect > GATHER_UP_TO {
            expect = 0;
        }
        let until = Instant::now() + GATHER;
        loop {
            match rx.try_recv() {
                Ok(g) => {
                    records += g.group.chain.acks.len();
                    groups.push(g);
                }
                Err(std_mpsc::TryRecvError::Empty) if records < expect && Instant::now() < until => {
                    std::thread::yield_now()
                }
                Err(_) => break,
            }
        }
        last_sync = records;
        if failed.is_none()
            && let Err(e) = syncer.sync()
        {
            let e = log_failed(&e);
            stop(stopped, &e);
            failed = Some(e);
        }
        let n = groups.len() as u64;
        if let Some(e) = &failed {
            for g in groups.drain(..) {
                syncer.zero(g.at, g.len);
                for ack in g.group.chain.acks {
                    answer(pending, ack, Err(e.clone()));
                }
            }
        } else {
            // One batch for the index: what one fdatasync made durable.
            let mut all = groups.drain(..).map(|g| g.group);
            if let Some(mut one) = all.next() {
                for g in all {
                    one.extend(g);
                }
                if to_index.send(one).is_err() {
                    return;
                }
            }
        }
        // Only now may the writer sync a group itself: it comes after these.
        busy.fetch_sub(n, Ordering::SeqCst);
    }
}

impl FileLog {
    /// The file backend's writer thread: this loop, the syncer and the
    /// index thread beside it, and the log's zero-filled room given back at
    /// the end.
    pub(super) fn run_thread(mut self, rx: std_mpsc::Receiver<Msg>, indexer: super::index::Indexer) {
        // Small queues: the log may run a few groups ahead of sled, no more.
        let (tx, written) = std_mpsc::sync_channel::<Written>(2);
        // The writer hands on every group it writes while one syncs.
        let (to_sync, unsynced) = std_mpsc::sync_channel::<Unsynced>(MAX_GROUP);
        let (syncer, own) = match (self.log.syncer(), self.log.syncer()) {
            (Ok(s), Ok(own)) => (s, own),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "audit store: cannot open its record log for its syncer");
                return;
            }
        };
        let busy = Arc::new(AtomicU64::new(0));
        self.direct = Some(Direct { syncer: own, to_index: tx.clone(), busy: busy.clone() });
        let index = std::thread::Builder::new().name("audit-index".into()).spawn(move || indexer.run(written));
        let index = match index {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "audit store: cannot start its index thread");
                return;
            }
        };
        let (pending, stopped) = (self.pending.clone(), self.stopped.clone());
        let sync = std::thread::Builder::new()
            .name("audit-sync".into())
            .spawn(move || sync_groups(&syncer, &unsynced, &tx, &pending, &busy, &stopped));
        let sync = match sync {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "audit store: cannot start its syncer thread");
                return;
            }
        };
        let pending = self.pending.clone();
        run(&mut self, &rx, &to_sync, &pending);
        drop(to_sync);
        self.direct = None;
        let _ = sync.join();
        let _ = index.join();
        if let Err(e) = self.log.close() {
            tracing::warn!(error = %e, "record log: cannot give back its zero-filled room");
        }
    }
}
