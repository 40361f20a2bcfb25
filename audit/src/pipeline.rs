//! The one group-commit loop. Callers' appends are taken a group at a
//! time — as many as wait, up to [`MAX_GROUP`] — made durable in one step
//! by a [`GroupLog`], and handed to the index thread, which puts them in
//! sled and answers the callers while the next group is made durable.
//! Both backends run this loop; they differ only in what makes a group
//! durable — one `fdatasync` of `records.jsonl` ([`FileLog`]), one fenced
//! PostgreSQL statement (`pgwriter.rs`) — and in what an idle writer does
//! (a PostgreSQL standby follows the database).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use nightshift_proto::clock::SharedClock;

use super::AuditError;
use super::index::{Msg, NoMsg, Stopped, WriteReq, Written, answer, chain, recv_soon_within, stop, stopped_with};
use super::log::RecordLog;
use super::positions::Position;

/// The most requests one group takes.
pub(super) const MAX_GROUP: usize = 4096;

/// What makes a group durable: the log the loop writes.
pub(super) trait GroupLog {
    /// Chain `batch` after the log's head and make it durable. The group
    /// for the index, or `None` when the log refused it (its callers have
    /// their error then).
    fn commit(&mut self, batch: Vec<WriteReq>) -> Option<Written>;
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
}

/// How long a group waits for the appends it expects (see [`run`]).
const GATHER: Duration = Duration::from_micros(60);

/// A group waits only when it expects at most this many appends: more
/// writers than that fill the next group while this one syncs, and the
/// wait would cost the CPU they need (docs/BENCHMARKS.md, scenario 5).
const GATHER_UP_TO: usize = 16;

/// The appends of `batch` whose callers wait for their answer: only they
/// come back with a next append when answered. An `append_ordered` caller
/// dropped its receiver at once (a run's `run_queued` and `run_started`,
/// sent ahead of its awaited intent), so a group of three records with one
/// awaiting caller makes the next group expect one, not three — it would
/// otherwise wait the whole [`GATHER`] for appends nobody is making (a
/// per-phase timer at 100 alerts/s: 70 and 74 µs between the result's and
/// the intent's arrival and their write, the 60 µs wait nearly all of it).
fn awaited(batch: &[WriteReq]) -> usize {
    batch.iter().filter(|w| !w.ack.is_closed()).count()
}

/// The loop: until every sender is gone (the store closed) or the index
/// thread stopped.
///
/// A group takes what waits, and then — for at most [`GATHER`] — the
/// appends it expects: as many as the group before it had callers waiting
/// for their answer ([`awaited`]), or as many as are not yet answered
/// (`pending`), whichever is more, when that is at
/// most [`GATHER_UP_TO`]. Without that wait, a few writers who each await
/// their append split into two groups that take turns (one syncs while the
/// other's callers are being answered), each sync carrying about half of
/// them; with it, they come back in time to share one. One writer expects
/// one append and never waits.
pub(super) fn run(
    log: &mut dyn GroupLog,
    rx: &std_mpsc::Receiver<Msg>,
    to_index: &std_mpsc::SyncSender<Written>,
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
        if expect > GATHER_UP_TO {
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
        last_group = awaited(&batch);
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
}

impl GroupLog for FileLog {
    /// Chain, encode and sync one group; `None` when the log refused it
    /// (its callers have their error then).
    fn commit(&mut self, batch: Vec<WriteReq>) -> Option<Written> {
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
        match self.log.append_bytes(&c.lines) {
            Ok(()) => {
                self.seq = seq;
                self.hash = prev;
                Some(Written { chain: c, positions })
            }
            Err(e) => {
                tracing::error!(error = %e, "audit write failed: no more appends are accepted until a restart");
                let e = AuditError::Write(format!(
                    "the record log could not be written ({e}); the audit store accepts nothing more and the engine has stopped \
                     acting: free space on the engine's data disk (or fix it) and restart the engine"
                ));
                // Stopped before anyone hears of it: a caller that gets this
                // error and then asks `AuditStore::stopped` sees it too.
                stop(&self.stopped, &e);
                for ack in c.acks {
                    answer(&self.pending, ack, Err(e.clone()));
                }
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

impl FileLog {
    /// The file backend's writer thread: this loop, the index thread
    /// beside it, and the log's zero-filled room given back at the end.
    pub(super) fn run_thread(mut self, rx: std_mpsc::Receiver<Msg>, indexer: super::index::Indexer) {
        // A small queue: the log may run one group ahead of sled, no more.
        let (tx, written) = std_mpsc::sync_channel::<Written>(1);
        let second = std::thread::Builder::new().name("audit-index".into()).spawn(move || indexer.run(written));
        let second = match second {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "audit store: cannot start its index thread");
                return;
            }
        };
        let pending = self.pending.clone();
        run(&mut self, &rx, &tx, &pending);
        drop(tx);
        let _ = second.join();
        if let Err(e) = self.log.close() {
            tracing::warn!(error = %e, "record log: cannot give back its zero-filled room");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::Prepared;
    use crate::{NewRecord, RecordKind};

    /// A group expects back only the callers that wait for their answer:
    /// an `append_ordered` caller dropped its receiver, so it never comes
    /// back with a next append to wait for.
    #[test]
    fn a_group_expects_back_only_the_callers_that_await_their_answer() {
        let req = || {
            let (ack, rx) = tokio::sync::oneshot::channel();
            let prep = Prepared::new(NewRecord::new(RecordKind::Note, "engine", serde_json::json!({})), None);
            (WriteReq { prep, ack }, rx)
        };
        // (receivers kept, receivers dropped) → expected back
        for (kept, dropped, want) in [(0, 0, 0), (1, 0, 1), (0, 3, 0), (1, 2, 1), (4, 0, 4), (3, 5, 3)] {
            let mut batch = Vec::new();
            let mut alive = Vec::new();
            for _ in 0..kept {
                let (w, rx) = req();
                batch.push(w);
                alive.push(rx);
            }
            for _ in 0..dropped {
                batch.push(req().0);
            }
            assert_eq!(awaited(&batch), want, "{kept} awaited, {dropped} not");
            drop(alive);
            assert_eq!(awaited(&batch), 0, "every caller gone");
        }
    }
}
