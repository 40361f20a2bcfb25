//! The layer under the store's façade: a writer thread that groups
//! concurrent appends into one record-log write and one fdatasync (the
//! durability point), and an index thread that then answers their callers
//! and puts them in sled (sled flushes in the background; what it loses in
//! a crash is replayed from the log on open; a read waits for the index to
//! reach what was answered, [`Progress`]); the sled trees and their
//! keys; the PostgreSQL settings the writer threads share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use tokio::sync::{broadcast, oneshot};

use super::encode::Prepared;
use super::log::{RecordLog, Replay};
use super::positions::{Position, Positions};
use super::*;

pub(super) struct WriteReq {
    /// The record as its caller prepared it (`encode.rs`).
    pub(super) prep: Prepared,
    pub(super) ack: Ack,
}

/// Where a caller hears that its record is durable (or why not).
pub(super) type Ack = oneshot::Sender<Result<AuditRecord, AuditError>>;

/// What the writer thread is asked to do. Not boxed: that would cost an
/// allocation on every append, for a message (`Lead`) sent once a term.
#[allow(clippy::large_enum_variant)]
pub(super) enum Msg {
    Write(WriteReq),
    /// PostgreSQL backend: catch up with the database and write from its
    /// head on at `term` (this engine just took the lease). Answers the
    /// head's sequence number.
    Lead {
        term: u64,
        ack: oneshot::Sender<Result<u64, AuditError>>,
    },
}

/// Where records are found by sequence number.
#[derive(Clone)]
pub(super) enum RecordTable {
    /// The record bytes in sled: the PostgreSQL backend's local copy (it
    /// has no record log to point into), and a file store from before
    /// `records.idx` until its first open builds one.
    Sled(sled::Tree),
    /// The file backend: each record's position in the record log
    /// (`positions.rs`) — one copy of each record, the log's.
    Log(Arc<Positions>),
}

/// Records with their stored bytes, as [`RecordTable::entries`] walks them.
pub(super) type Entries<'a> = Box<dyn Iterator<Item = Result<(u64, Vec<u8>), AuditError>> + 'a>;

fn read_err(e: sled::Error) -> AuditError {
    AuditError::Read(e.to_string())
}

fn key_seq(k: &[u8]) -> u64 {
    u64::from_be_bytes(k.try_into().unwrap_or([0; 8]))
}

impl RecordTable {
    /// The stored bytes of record `seq`.
    pub(super) fn get(&self, seq: u64) -> Result<Option<Vec<u8>>, AuditError> {
        match self {
            RecordTable::Sled(t) => Ok(t.get(seq.to_be_bytes()).map_err(read_err)?.map(|v| v.to_vec())),
            RecordTable::Log(p) => p.get(seq),
        }
    }

    /// The seqs stored in `from..=to`, oldest first (newest first with `rev`).
    pub(super) fn seqs(&self, from: u64, to: u64, rev: bool) -> Box<dyn Iterator<Item = Result<u64, AuditError>> + '_> {
        match self {
            RecordTable::Sled(t) => {
                if from > to {
                    return Box::new(std::iter::empty());
                }
                let r = t.range(from.to_be_bytes()..=to.to_be_bytes());
                let f =
                    |i: Result<(sled::IVec, sled::IVec), sled::Error>| i.map(|(k, _)| key_seq(&k)).map_err(read_err);
                if rev { Box::new(r.rev().map(f)) } else { Box::new(r.map(f)) }
            }
            RecordTable::Log(p) => Box::new(p.seqs(from, to, rev)),
        }
    }

    /// The records stored in `from..=to` with their bytes, in seq order
    /// (newest first with `rev`).
    pub(super) fn entries(&self, from: u64, to: u64, rev: bool) -> Entries<'_> {
        match self {
            RecordTable::Sled(t) => {
                if from > to {
                    return Box::new(std::iter::empty());
                }
                let r = t.range(from.to_be_bytes()..=to.to_be_bytes());
                let f = |i: Result<(sled::IVec, sled::IVec), sled::Error>| {
                    i.map(|(k, v)| (key_seq(&k), v.to_vec())).map_err(read_err)
                };
                if rev { Box::new(r.rev().map(f)) } else { Box::new(r.map(f)) }
            }
            RecordTable::Log(p) => Box::new(p.seqs(from, to, rev).map(move |s| {
                let seq = s?;
                let bytes = p.get(seq)?.ok_or_else(|| AuditError::Read(format!("record {seq}: its entry went")))?;
                Ok((seq, bytes))
            })),
        }
    }

    /// Every record, oldest first.
    pub(super) fn all(&self) -> Entries<'_> {
        self.entries(1, u64::MAX, false)
    }

    /// The newest record and its bytes.
    pub(super) fn last(&self) -> Result<Option<(u64, Vec<u8>)>, AuditError> {
        self.entries(1, u64::MAX, true).next().transpose()
    }
}

#[derive(Clone)]
pub(super) struct Trees {
    pub(super) db: sled::Db,
    pub(super) records: RecordTable,
    /// sled's `records` tree: the record bytes where [`RecordTable::Sled`]
    /// is the table (and, in a store from before `records.idx`, what its
    /// first open builds the index from).
    pub(super) sled_records: sled::Tree,
    /// `checkpoint`: the seq up to which `records.idx` is synced and the
    /// other trees are filled (an open replays the log from there).
    pub(super) meta: sled::Tree,
    pub(super) by_run: sled::Tree,
    pub(super) by_node: sled::Tree,
    pub(super) runs: sled::Tree,
    pub(super) runs_by_created: sled::Tree,
    /// `kind \0 seq` for the kinds [`RecordKind::indexed_by_kind`] names.
    pub(super) by_kind: sled::Tree,
}

/// How often sled flushes in the background. Not what makes a record
/// durable (the record log is); it bounds what an open replays after a
/// crash to about this much of the log.
pub(super) const SLED_FLUSH_MS: u64 = 1000;

/// The PostgreSQL backend's settings.
#[derive(Clone)]
pub struct PgOptions {
    /// Never logged.
    pub url: String,
    /// PEM CA certificates for `sslmode=require` (else the web roots).
    pub ca_file: Option<PathBuf>,
    pub shard: String,
    /// The lease every append is fenced by.
    pub leadership: Arc<crate::ha::Leadership>,
    /// How often a standby reads new records from the database.
    pub follow_every: std::time::Duration,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions").field("shard", &self.shard).field("ca_file", &self.ca_file).finish()
    }
}

/// Answers one append and counts it off.
pub(super) fn answer(pending: &std::sync::atomic::AtomicU64, ack: Ack, r: Result<AuditRecord, AuditError>) {
    // Counted out before the answer goes: whoever the answer wakes sees the
    // count without it (the record is already durable or refused).
    pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    let _ = ack.send(r);
}

/// One record as sled indexes it.
pub(super) struct Indexed<'a> {
    seq: u64,
    /// Its line in the record log (the file backend).
    position: Option<Position>,
    kind: RecordKind,
    run: Option<&'a str>,
    node: Option<&'a str>,
    bytes: &'a [u8],
    /// The run's id, creation time and the summary's bytes.
    summary: Option<(&'a str, i64, &'a [u8])>,
}

/// Index records in sled: plain inserts in order (a record's index
/// entries and summary before the record itself), not flushed — the record
/// log is what makes them durable. Not a sled batch or transaction: each of
/// those seals and writes sled's IO buffer with a synchronous writeback,
/// which doubled the time of the log's own fdatasync. A crash leaves sled
/// a prefix of these inserts (sled recovers its log up to the first
/// incomplete entry), so the records tree's head says where replaying the
/// log must start, and replaying the entries after it is idempotent.
pub(super) fn index(t: &Trees, items: &[Indexed<'_>]) -> Result<(), AuditError> {
    let w = |e: sled::Error| AuditError::Write(e.to_string());
    let mut positions: Vec<Position> = Vec::new();
    let mut first = 0u64;
    for i in items {
        if let Some(run) = i.run {
            t.by_run.insert(index_key(run, i.seq), &[]).map_err(w)?;
        }
        if let Some(node) = i.node {
            t.by_node.insert(index_key(node, i.seq), &[]).map_err(w)?;
        }
        if i.kind.indexed_by_kind() {
            t.by_kind.insert(index_key(i.kind.as_str(), i.seq), &[]).map_err(w)?;
        }
        if let Some((id, created_ms, bytes)) = i.summary {
            t.runs.insert(id.as_bytes(), bytes).map_err(w)?;
            t.runs_by_created.insert(created_key(created_ms, id), &[]).map_err(w)?;
        }
        match (&t.records, i.position) {
            (RecordTable::Sled(records), _) => {
                records.insert(i.seq.to_be_bytes(), i.bytes).map_err(w)?;
            }
            (RecordTable::Log(p), Some(pos)) => {
                if !positions.is_empty() && first + positions.len() as u64 != i.seq {
                    p.put(first, &positions)?;
                    positions.clear();
                }
                if positions.is_empty() {
                    first = i.seq;
                }
                positions.push(pos);
            }
            (RecordTable::Log(_), None) => {
                return Err(AuditError::Write(format!("record {}: no position in the record log to index", i.seq)));
            }
        }
    }
    if let RecordTable::Log(p) = &t.records {
        p.put(first, &positions)?;
    }
    Ok(())
}

/// The seq up to which the last checkpoint says everything is indexed.
pub(super) fn checkpoint(t: &Trees) -> Result<u64, AuditError> {
    Ok(t.meta.get(b"checkpoint").map_err(read_err)?.map_or(0, |v| key_seq(&v)))
}

/// Where an open of a file store starts replaying the log: the
/// checkpoint's record and hash (the genesis when there is none, or when
/// its record cannot be read — then the whole log is replayed).
pub(super) fn checkpoint_head(t: &Trees, p: &Positions) -> Result<(u64, String), AuditError> {
    let c = checkpoint(t)?.min(p.count());
    if c == 0 {
        return Ok((0, GENESIS.to_string()));
    }
    if !p.log_holds(c)? {
        return Err(AuditError::Open {
            path: p.log_path().to_path_buf(),
            message: format!(
                "expected the record log to hold every record up to {c} (records.idx vouches for them), found it \
                 shorter: it was cut, replaced or edited outside nightshift; nothing was changed: run `nightshift \
                 audit verify` to see the damage, put the original back (a backup), or run `nightshift audit salvage \
                 --to NEW_DIR` to build a store beside this one from every record that checks out"
            ),
        });
    }
    // The newest record at or below the checkpoint that reads: a line
    // damaged since stays in the log as evidence `verify` names.
    for k in (1..=c).rev() {
        let read = p.get(k).ok().flatten().and_then(|b| serde_json::from_slice::<AuditRecord>(&b).ok());
        match read {
            Some(r) if r.seq == k => {
                if k < c {
                    tracing::error!(
                        checkpoint = c,
                        readable = k,
                        "audit store: records past {k} cannot be read from the record log (damaged lines): the chain goes on from {k}; `nightshift audit verify` names them"
                    );
                }
                return Ok((k, r.hash));
            }
            _ => continue,
        }
    }
    Ok((0, GENESIS.to_string()))
}

/// A store from before `records.idx`: build it from the whole record log
/// (which has just been made to agree with sled's copy, `head` its last
/// record), checkpoint it, and only then empty sled's copy — a crash before
/// that leaves the store as it was, and the next open builds it again.
pub(super) fn build_positions(t: &Trees, p: &Positions, head: u64) -> Result<(), AuditError> {
    let w = |e: sled::Error| AuditError::Write(e.to_string());
    let last = p.rebuild()?;
    p.cut_after(head)?;
    p.sync()?;
    t.meta.insert(b"checkpoint", &head.to_be_bytes()).map_err(w)?;
    t.db.flush().map_err(w)?;
    t.sled_records.clear().map_err(w)?;
    t.db.flush().map_err(w)?;
    tracing::info!(
        records = head,
        log_last = last,
        "audit store: built records.idx from the record log; sled keeps no second copy of the records now"
    );
    Ok(())
}

/// Sync `records.idx` and record that everything up to `seq` is indexed.
pub(super) fn write_checkpoint(t: &Trees, seq: u64) -> Result<(), AuditError> {
    if let RecordTable::Log(p) = &t.records {
        p.sync()?;
    }
    t.meta.insert(b"checkpoint", &seq.to_be_bytes()).map_err(|e| AuditError::Write(e.to_string()))?;
    Ok(())
}

/// Put records the log holds and sled lost back into sled, and flush.
pub(super) fn replay(t: &Trees, replay: &[Replay]) -> Result<(), AuditError> {
    let summaries: Vec<Option<RunSummary>> =
        replay.iter().map(|r| r.summary.as_ref().and_then(|b| serde_json::from_slice(b).ok())).collect();
    let items: Vec<Indexed<'_>> = replay
        .iter()
        .zip(&summaries)
        .map(|(r, s)| Indexed {
            seq: r.record.seq,
            position: Some(Position { offset: r.offset, len: r.bytes.len() as u32 }),
            kind: r.record.kind,
            run: r.record.run.as_deref(),
            node: r.record.node.as_deref(),
            bytes: &r.bytes,
            summary: s.as_ref().zip(r.summary.as_deref()).map(|(s, b)| (s.id.as_str(), s.created_ms, b)),
        })
        .collect();
    index(t, &items)?;
    if let Some(last) = replay.last() {
        if let RecordTable::Log(p) = &t.records {
            p.cut_after(last.record.seq)?;
        }
        write_checkpoint(t, last.record.seq)?;
    }
    t.db.flush().map(|_| ()).map_err(|e| AuditError::Write(e.to_string()))
}

pub(super) fn index_key(prefix: &str, seq: u64) -> Vec<u8> {
    let mut k = prefix.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn created_key(created_ms: i64, id: &str) -> Vec<u8> {
    let mut k = (created_ms.max(0) as u64).to_be_bytes().to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

/// Open sled's trees in `dir` (retrying briefly while a store closed a
/// moment ago in this process lets go of its lock).
pub(super) fn open_trees(dir: &Path) -> Result<(Trees, PathBuf), AuditError> {
    let path = dir.join("audit.sled");
    let mut attempt = 0;
    let db = loop {
        match sled::Config::new().path(&path).mode(sled::Mode::LowSpace).flush_every_ms(Some(SLED_FLUSH_MS)).open() {
            Ok(db) => break db,
            Err(e) => {
                let message = e.to_string();
                let locked = message.contains("could not acquire lock");
                if locked && attempt < 40 {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
                return Err(if locked {
                    AuditError::Locked { path: path.clone(), message }
                } else {
                    AuditError::Open { path: path.clone(), message }
                });
            }
        }
    };
    let open =
        |name: &str| db.open_tree(name).map_err(|e| AuditError::Open { path: path.clone(), message: e.to_string() });
    let sled_records = open("records")?;
    let trees = Trees {
        records: RecordTable::Sled(sled_records.clone()),
        sled_records,
        meta: open("meta")?,
        by_run: open("by_run")?,
        by_node: open("by_node")?,
        runs: open("runs")?,
        runs_by_created: open("runs_by_created")?,
        by_kind: open("by_kind")?,
        db: db.clone(),
    };
    build_kind_index(&trees).map_err(|e| AuditError::Open { path: path.clone(), message: e.to_string() })?;
    Ok((trees, path))
}

/// sled's copy is only an index of the record log (the durability point),
/// and sled can be left unreadable by a crash mid-write: set it aside as
/// `audit.sled.damaged` (replacing an older one) and build a new index from
/// every record of the log. Refused, with sled put back, when there is no
/// log or a line of it does not continue the chain — then the log is the
/// only copy and `nightshift audit salvage` is the way out.
pub(super) fn rebuild_index(
    dir: &Path,
    sled_path: &Path,
    damage: &str,
) -> Result<(Trees, (RecordLog, Vec<Replay>)), AuditError> {
    let log_path = dir.join(super::LOG_FILE);
    let refuse = |why: String| AuditError::Open {
        path: sled_path.to_path_buf(),
        message: format!(
            "{damage}; the index cannot be rebuilt from the record log: {why}; \
             run `nightshift audit salvage --to NEW_DIR` (its engine.yaml's data_dir is {})",
            dir.display()
        ),
    };
    if !log_path.is_file() {
        return Err(refuse(format!("expected {}, found no such file", log_path.display())));
    }
    let aside = set_aside(dir, sled_path).map_err(refuse)?;
    let put_back = |why: String| {
        let _ = std::fs::remove_dir_all(sled_path);
        let _ = std::fs::rename(&aside, sled_path);
        refuse(why)
    };
    let (trees, _) = open_trees(dir).map_err(|e| put_back(e.to_string()))?;
    match RecordLog::open_for_rebuild(dir) {
        Ok(log) => {
            tracing::error!(
                index = %sled_path.display(), damaged_copy = %aside.display(), damage, records = log.1.len(),
                "audit index unreadable (a crash mid-write): rebuilding it from the record log"
            );
            Ok((trees, log))
        }
        Err(e) => {
            drop(trees);
            Err(put_back(e.to_string()))
        }
    }
}

/// Move an unreadable sled out of the way, to `audit.sled.damaged`
/// (replacing an older one: the index is derived, the copy is for a
/// post-mortem).
pub(super) fn set_aside(dir: &Path, sled_path: &Path) -> Result<PathBuf, String> {
    let aside = dir.join("audit.sled.damaged");
    if aside.exists() {
        std::fs::remove_dir_all(&aside).map_err(|e| format!("removing {}: {e}", aside.display()))?;
    }
    std::fs::rename(sled_path, &aside).map_err(|e| format!("moving the damaged index aside: {e}"))?;
    Ok(aside)
}

/// A copy of a store's sled index in a fresh temporary folder, removed
/// when dropped: `verify` and `salvage` open sled (which writes on every
/// open) on the copy, so that neither writes a byte into the store they
/// read. sled is derived and small beside the record log (its trees index
/// records; they do not hold them).
pub(super) struct SledCopy {
    /// The temporary folder: open it as a store's dir (`open_trees`).
    pub(super) root: PathBuf,
    /// `root/audit.sled`.
    pub(super) path: PathBuf,
}

impl SledCopy {
    /// Copy `dir/audit.sled`; `Ok(None)` when the store has none.
    pub(super) fn of(dir: &Path) -> Result<Option<SledCopy>, String> {
        let from = dir.join("audit.sled");
        if !from.is_dir() {
            return Ok(None);
        }
        let root = std::env::temp_dir().join(format!(
            "nightshift-audit-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let copy = SledCopy { path: root.join("audit.sled"), root };
        copy_dir(&from, &copy.path).map_err(|e| {
            format!(
                "expected to copy {} into {} (to read it without writing to the store), found: {e}; \
                 set TMPDIR to a folder with room",
                from.display(),
                copy.root.display()
            )
        })?;
        Ok(Some(copy))
    }
}

/// How long a held lock is asked again before the store counts as held: a
/// store closed a moment ago lets go of sled's lock only when sled's own
/// background writes have finished (its threads keep the file open a
/// little after the close returns); a running engine holds it for good.
const HELD_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a running engine holds the store in `dir` (sled's lock on
/// `audit.sled/db`), asked without opening anything for writing.
pub(super) fn held_by_engine(dir: &Path) -> bool {
    let Ok(f) = std::fs::File::open(dir.join("audit.sled").join("db")) else { return false };
    let until = std::time::Instant::now() + HELD_FOR;
    loop {
        match f.try_lock_shared() {
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(std::fs::TryLockError::WouldBlock) => return true,
            _ => return false,
        }
    }
}

impl Drop for SledCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// A store from before the kind index (or before a kind joined it): build
/// it once from the records (the index is derived; the marker says which
/// kinds it covers for every record — 2: runbook modes joined).
pub(super) fn build_kind_index(trees: &Trees) -> Result<(), sled::Error> {
    const BUILT: &[u8] = b"\xffbuilt-2";
    if trees.by_kind.get(BUILT)?.is_some() {
        return Ok(());
    }
    let mut n = 0usize;
    for item in trees.sled_records.iter() {
        let (_, v) = item?;
        let Ok(r) = serde_json::from_slice::<AuditRecord>(&v) else { continue };
        if r.kind.indexed_by_kind() {
            trees.by_kind.insert(index_key(r.kind.as_str(), r.seq), &[])?;
            n += 1;
        }
    }
    trees.by_kind.insert(BUILT, &[])?;
    if n > 0 {
        tracing::info!(records = n, "audit store: built the index by kind");
    }
    Ok(())
}

/// The newest record sled holds: `(seq, hash)`, or the genesis.
pub(super) fn local_head(trees: &Trees, path: &Path) -> Result<(u64, String), AuditError> {
    Ok(match trees.records.last()? {
        Some((_, v)) => {
            let r: AuditRecord = serde_json::from_slice(&v).map_err(|e| AuditError::Open {
                path: path.to_path_buf(),
                message: format!("last record unreadable: {e}"),
            })?;
            (r.seq, r.hash)
        }
        None => (0, GENESIS.to_string()),
    })
}

/// The next message: for a moment (what one caller takes to come back with
/// its next record) by polling, then by sleeping. Waking a sleeping thread
/// costs tens of µs on a VM, which is the whole gap between one writer and
/// the disk's fdatasync rate; the poll costs nothing when the store is idle.
///
/// The writer's receive: it polls for [`POLL_MICROS`], then sleeps at most
/// `wait` (`None`: until a message comes).
pub(super) fn recv_soon_within<T>(rx: &std_mpsc::Receiver<T>, wait: Option<std::time::Duration>) -> Result<T, NoMsg> {
    recv_polling(rx, POLL_MICROS, wait)
}

/// Why [`recv_soon_within`] got no message.
pub(super) enum NoMsg {
    /// `wait` passed.
    Idle,
    /// Every sender is gone.
    Closed,
}

/// The next message, polling `poll_micros` first, then sleeping at most
/// `wait` (`None`: until a message comes).
pub(super) fn recv_polling<T>(
    rx: &std_mpsc::Receiver<T>,
    poll_micros: u64,
    wait: Option<std::time::Duration>,
) -> Result<T, NoMsg> {
    let until = std::time::Instant::now() + std::time::Duration::from_micros(poll_micros);
    loop {
        match rx.try_recv() {
            Ok(m) => return Ok(m),
            Err(std_mpsc::TryRecvError::Disconnected) => return Err(NoMsg::Closed),
            Err(std_mpsc::TryRecvError::Empty) if std::time::Instant::now() < until => std::thread::yield_now(),
            Err(std_mpsc::TryRecvError::Empty) => {
                return match wait {
                    None => rx.recv().map_err(|_| NoMsg::Closed),
                    Some(wait) => rx.recv_timeout(wait).map_err(|e| match e {
                        std_mpsc::RecvTimeoutError::Timeout => NoMsg::Idle,
                        std_mpsc::RecvTimeoutError::Disconnected => NoMsg::Closed,
                    }),
                };
            }
        }
    }
}

/// How long [`recv_soon`] polls before it sleeps.
pub(super) const POLL_MICROS: u64 = 100;

/// How long the index thread polls before it sleeps.
pub(super) const INDEX_POLL_MICROS: u64 = 400;

/// The index thread polls only after a group smaller than this: after a
/// larger one the next group is large too, and the thread's yields would
/// take the CPU its writers need (a plain sleep was faster at 64 writers).
pub(super) const INDEX_POLL_UNDER: usize = 16;

/// How far the index thread has got, shared with the store's readers.
///
/// A group's callers are answered as soon as the group is durable, before
/// it is indexed — so that an append's caller does not wait for sled, and
/// the next group's callers come back sooner (docs/BENCHMARKS.md, issue 45).
/// Every read of the store first waits for the index to reach the newest
/// record answered when the read began ([`Progress::caught_up`]): a caller
/// that reads after its answer finds its record, as before.
#[derive(Default)]
pub(super) struct Progress {
    /// The newest record whose caller may have been answered.
    pub(super) answered: std::sync::atomic::AtomicU64,
    /// The newest record indexed (findable by every read).
    pub(super) indexed: std::sync::atomic::AtomicU64,
    /// Bumped before the answer of every group holding a record of a kind
    /// indexed by kind ([`RecordKind::indexed_by_kind`]).
    pub(super) kind_changes: std::sync::atomic::AtomicU64,
    /// Readers waiting in [`Progress::caught_up`].
    waiters: std::sync::atomic::AtomicUsize,
    lock: std::sync::Mutex<()>,
    moved: std::sync::Condvar,
}

/// The longest a read waits for the index before it reads what is there.
const CATCH_UP_AT_MOST: std::time::Duration = std::time::Duration::from_secs(5);

impl Progress {
    pub(super) fn starting_at(seq: u64) -> Progress {
        let p = Progress::default();
        p.answered.store(seq, std::sync::atomic::Ordering::SeqCst);
        p.indexed.store(seq, std::sync::atomic::Ordering::SeqCst);
        p
    }

    /// Wait until every record answered so far is indexed. Nothing to wait
    /// for in a store whose appends are all indexed (two loads); at most
    /// [`CATCH_UP_AT_MOST`] when the index thread is stuck (then the read
    /// sees what sled has, as a read did before answers came first).
    pub(super) fn caught_up(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let want = self.answered.load(SeqCst);
        if self.indexed.load(SeqCst) >= want {
            return;
        }
        let until = std::time::Instant::now() + CATCH_UP_AT_MOST;
        self.waiters.fetch_add(1, SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.indexed.load(SeqCst) < want {
            let now = std::time::Instant::now();
            if now >= until {
                tracing::warn!(
                    want,
                    indexed = self.indexed.load(SeqCst),
                    "audit read: the index did not catch up in 5 s"
                );
                break;
            }
            g = self.moved.wait_timeout(g, until - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        drop(g);
        self.waiters.fetch_sub(1, SeqCst);
    }

    /// The index reached `seq`: wake the readers waiting for it.
    fn reached(&self, seq: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.indexed.store(seq, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            // Taken so that a reader between its check and its wait cannot
            // miss the wake.
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.moved.notify_all();
        }
    }
}

/// A group in the record log, on its way to sled and to its callers.
pub(super) struct Written {
    /// The records with their lines, summaries and callers (none for
    /// records read from the database).
    pub(super) chain: Chain,
    /// Each record's line in the record log (the file backend; empty for
    /// records from the database).
    pub(super) positions: Vec<Position>,
}

/// The second stage: indexes a durable group in sled, then acknowledges
/// it — while the first stage already syncs the next group. Once sled
/// fails, it acknowledges nothing more (the log holds those records; an
/// open replays them).
pub(super) struct Indexer {
    pub(super) trees: Trees,
    pub(super) live: broadcast::Sender<Arc<AuditRecord>>,
    pub(super) progress: Arc<Progress>,
    pub(super) failed: Option<AuditError>,
    pub(super) pending: Arc<std::sync::atomic::AtomicU64>,
    /// Set at the first failure to write or index: the writers refuse every
    /// later append *before* it reaches the log, and the engine reads it to
    /// stop acting and answer 503 (`AuditStore::stopped`).
    pub(super) stopped: Stopped,
    /// When `records.idx` was last synced and the checkpoint written.
    pub(super) checkpointed: std::time::Instant,
}

/// How often the index thread syncs `records.idx` and writes the
/// checkpoint: what an open replays from the log after a crash is about
/// this much (plus sled's own flush interval).
pub(super) const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The store's first durability failure, shared by its threads.
pub(super) type Stopped = Arc<std::sync::Mutex<Option<AuditError>>>;

/// Record the first failure (later ones keep the first's words).
pub(super) fn stop(stopped: &Stopped, e: &AuditError) {
    let mut g = stopped.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(e.clone());
    }
}

/// The first failure, if the store has stopped.
pub(super) fn stopped_with(stopped: &Stopped) -> Option<AuditError> {
    stopped.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A group chained after record `seq` (hash `hash`) at time `now`, its
/// lines in one buffer: what [`chain`] gives the log to write.
pub(super) struct Chain {
    pub(super) records: Vec<AuditRecord>,
    /// The group's lines, as the record log holds them.
    pub(super) lines: Vec<u8>,
    /// Where each record's line is in `lines`.
    pub(super) ranges: Vec<std::ops::Range<usize>>,
    /// The exact bytes of the summaries they vouch for.
    pub(super) summaries: Vec<Option<Vec<u8>>>,
    /// Each summary's run id and creation time.
    pub(super) meta: Vec<Option<(String, i64)>>,
    /// The callers to answer, in order.
    pub(super) acks: Vec<Ack>,
}

/// Chain a group of requests after record `seq` (hash `hash`) at time
/// `now`. The callers prepared their records' bytes (`encode.rs`): this
/// streams each hash and copies each line together.
pub(super) fn chain(seq: u64, hash: &str, now: i64, batch: Vec<WriteReq>) -> Chain {
    let n = batch.len();
    let mut c = Chain {
        records: Vec::with_capacity(n),
        lines: Vec::with_capacity(n * 400),
        ranges: Vec::with_capacity(n),
        summaries: Vec::with_capacity(n),
        meta: Vec::with_capacity(n),
        acks: Vec::with_capacity(n),
    };
    let mut seq = seq;
    for req in batch {
        seq += 1;
        let prev = c.records.last().map_or(hash, |r: &AuditRecord| r.hash.as_str());
        let chained = req.prep.chain(seq, now, prev, &mut c.lines);
        c.records.push(chained.record);
        c.ranges.push(chained.line);
        c.summaries.push(chained.summary);
        c.meta.push(chained.meta);
        c.acks.push(req.ack);
    }
    c
}

/// The index thread's state and the handles the store keeps to it: the
/// live tail, how far it got, the appends not yet answered.
pub(super) type IndexerParts =
    (Indexer, broadcast::Sender<Arc<AuditRecord>>, Arc<Progress>, Arc<std::sync::atomic::AtomicU64>, Stopped);

impl Indexer {
    pub(super) fn new(trees: &Trees, head_seq: u64) -> IndexerParts {
        let (live, _) = broadcast::channel(4096);
        let progress = Arc::new(Progress::starting_at(head_seq));
        let pending = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stopped: Stopped = Arc::default();
        let indexer = Indexer {
            trees: trees.clone(),
            live: live.clone(),
            progress: progress.clone(),
            failed: None,
            pending: pending.clone(),
            stopped: stopped.clone(),
            checkpointed: std::time::Instant::now(),
        };
        (indexer, live, progress, pending, stopped)
    }

    pub(super) fn run(mut self, rx: std_mpsc::Receiver<Written>) {
        // The index thread polls for about one fdatasync (the next group
        // comes no sooner than the writer's next sync): awake when it comes,
        // so a caller's answer does not wait for this thread to be woken.
        let mut last = 1usize;
        while let Ok(w) = recv_polling(&rx, if last < INDEX_POLL_UNDER { INDEX_POLL_MICROS } else { 0 }, None) {
            last = w.chain.records.len();
            self.index(w);
        }
        if self.failed.is_none() && matches!(self.trees.records, RecordTable::Log(_)) {
            let head = self.progress.indexed.load(std::sync::atomic::Ordering::SeqCst);
            if let Err(e) = write_checkpoint(&self.trees, head) {
                tracing::warn!(error = %e, "audit store: checkpoint at close failed (an open replays the record log)");
            }
        }
        if let Err(e) = self.trees.db.flush() {
            tracing::warn!(error = %e, "audit store: flush at close failed (the record log has every record)");
        }
    }

    /// Answer a durable group's callers, then index it, then hand it to
    /// the live tail. The answers go first: the group is durable in the
    /// record log already (an open replays what sled lacks), and every read
    /// waits for the index to reach what was answered ([`Progress`]).
    pub(super) fn index(&mut self, mut w: Written) {
        use std::sync::atomic::Ordering::SeqCst;
        let last = w.chain.records.last().map(|r| r.seq);
        if let Some(last) = last {
            // Answered first, then the kind counter: a reader that sees the
            // counter move also sees these records as answered, so its read
            // waits for them to be indexed (it would otherwise keep what
            // the index held before them under the new count).
            self.progress.answered.fetch_max(last, SeqCst);
            if w.chain.records.iter().any(|r| r.kind.indexed_by_kind()) {
                self.progress.kind_changes.fetch_add(1, SeqCst);
            }
        }
        // What indexing and the live tail need, kept before the records go
        // to their callers (the live tail's copies only while someone
        // listens).
        let keys: Vec<(u64, RecordKind, Option<String>, Option<String>)> =
            w.chain.records.iter().map(|r| (r.seq, r.kind, r.run.clone(), r.node.clone())).collect();
        let live: Vec<Arc<AuditRecord>> = if self.live.receiver_count() > 0 {
            w.chain.records.iter().map(|r| Arc::new(r.clone())).collect()
        } else {
            Vec::new()
        };
        let records = std::mem::take(&mut w.chain.records);
        for (ack, r) in std::mem::take(&mut w.chain.acks).into_iter().zip(records) {
            answer(&self.pending, ack, Ok(r));
        }
        if self.failed.is_none() {
            let c = &w.chain;
            let items: Vec<Indexed<'_>> = keys
                .iter()
                .zip(&c.meta)
                .zip(&c.summaries)
                .zip(&c.ranges)
                .enumerate()
                .map(|(i, ((((seq, kind, run, node), meta), summary), range))| Indexed {
                    seq: *seq,
                    position: w.positions.get(i).copied(),
                    kind: *kind,
                    run: run.as_deref(),
                    node: node.as_deref(),
                    bytes: &c.lines[range.clone()],
                    summary: meta
                        .as_ref()
                        .zip(summary.as_deref())
                        .map(|((id, created), sb)| (id.as_str(), *created, sb)),
                })
                .collect();
            if let Err(e) = index(&self.trees, &items) {
                // The group is in the record log (the durability point), so
                // it is answered as written: what was acknowledged runs, and
                // what the log lacks was refused. Nothing more is accepted.
                let e = AuditError::Write(format!(
                    "the audit index (records.idx or sled) failed ({e}); the audit store accepts nothing more and the engine has \
                     stopped acting: free space on the engine's data disk and restart the engine (the record log \
                     holds every acknowledged record and replays them)"
                ));
                tracing::error!(error = %e, "audit index failed: this store accepts nothing more");
                stop(&self.stopped, &e);
                self.failed = Some(e);
            } else if matches!(self.trees.records, RecordTable::Log(_))
                && self.checkpointed.elapsed() >= CHECKPOINT_EVERY
                && let Some(last) = last
            {
                // Not fatal: the log holds every record; a later open replays
                // more of it.
                if let Err(e) = write_checkpoint(&self.trees, last) {
                    tracing::warn!(error = %e, "audit store: checkpoint failed (an open replays more of the record log)");
                }
                self.checkpointed = std::time::Instant::now();
            }
        }
        if let Some(last) = last {
            self.progress.reached(last);
        }
        for r in live {
            let _ = self.live.send(r);
        }
    }
}
