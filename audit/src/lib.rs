//! nightshift's tamper-evident audit log: what the engine saw, decided and
//! did, as a hash chain that is durable before anything acts on it.
//!
//! # Records and the chain
//!
//! A record ([`AuditRecord`]) has a gap-free sequence number `seq` from 1,
//! a time, a kind, the run/node/GPU/runbook it is about, an actor, a JSON
//! payload, `prev_hash` (the previous record's `hash`; [`GENESIS`] for the
//! first) and its own `hash`: SHA-256, hex, over RFC 8785 canonical JSON of
//! every field but `hash` (chain version 2, `"v": 2`), or over serde_json's
//! bytes of the fields in a fixed order (version 1, records written before
//! version 2; both verify, and the chain runs across the change). Editing,
//! removing or reordering any record breaks the chain there, and
//! [`AuditStore::verify`] names the record. A `salvaged` record may excuse
//! breaks *before itself* only (`chain.rs`). A record that changes a run's
//! summary carries `summary_sha256`, the digest of the summary's exact
//! bytes, so the run read-model is vouched for by the chain too.
//!
//! # On disk (the sled backend)
//!
//! `data_dir/records.jsonl` — the **durability point**. One line per record
//! (its JSON), and after a record that changed a run summary a line
//! `{"summary_of": SEQ, "summary": "…"}` with that summary's exact bytes.
//! The writer thread appends a group of lines and fdatasyncs once; the file
//! grows in zero-filled chunks so that fdatasync writes the data only, and a
//! crash leaves NUL bytes at the tail, which readers skip. Then the index
//! thread indexes the group and answers the callers: `append` returns only
//! after the fdatasync (and `append_ordered`'s record is durable before any
//! later append returns). The log holds the **only copy** of each record.
//!
//! The writer thread does as little as it can, since the chain makes its
//! work serial: each caller's task prepares its record's canonical bytes
//! and line but for `seq`, `ts_ms` and `prev_hash` (`encode.rs`), and the
//! writer streams SHA-256 over them with those spliced in. A group of a few
//! writers waits up to 60 µs for the appends it expects (`pipeline.rs`), so
//! they share one fdatasync rather than taking turns.
//!
//! `data_dir/records.idx` — where each record's line is: 16 bytes a record
//! at `(seq - 1) × 16` (offset, length, CRC-32; `positions.rs` has the
//! format). Written with each group, never synced on the append path.
//!
//! `data_dir/audit.sled` — what else is derived from the log: `run \0 seq`,
//! `node \0 seq`, `kind \0 seq` for the kinds whose state outlives a replay
//! window, run summaries by id and by creation time, and the **checkpoint**
//! (`meta`): the seq up to which records.idx is synced and these trees are
//! filled, written about once a second (after an fdatasync of records.idx)
//! and at a clean close. sled flushes in the background (about every
//! second). On open, a torn last log line is cut, and every log line past
//! the checkpoint is indexed again (records.idx and sled; lines that do not
//! continue the chain are cut, never indexed), and entries past the log's
//! last record are cut. An index sled cannot open is set aside and rebuilt
//! from the log; records.idx moved aside is rebuilt from the whole log. A
//! store from before records.idx (its records in sled as well) gets the
//! file built from its log at its first open, and sled's copy emptied after
//! the checkpoint is durable. The bench for why: one sled insert of each
//! record was half the CPU of an append (docs/BENCHMARKS.md, scenario 5).
//!
//! # In PostgreSQL (the HA backend)
//!
//! Tables (versioned migrations in `pg.rs`, one engine migrating at a
//! time under an advisory lock): `nightshift_audit (shard, seq, ts_ms,
//! kind, run, node, gpu, runbook, actor, prev_hash, hash, record, summary,
//! PRIMARY KEY (shard, seq))`, `nightshift_run_summary (shard, run, summary,
//! created_ms, runbook, state, outcome, node, gpu, nodes)`,
//! `nightshift_lease (shard, holder, term, expires_at, url)` and
//! `nightshift_engines (shard, holder, url, role, term, seen_at)`
//! (`ha.rs`), `nightshift_schema (version)`. The durability point is the
//! commit of one statement per group, chained after the stored head and
//! **fenced**: it reads the lease row `FOR SHARE` and writes only while this
//! engine's holder and term hold an unexpired lease, so a deposed leader's
//! late group is refused by the database itself. The local sled copy (the
//! records themselves in sled: there is no local log to point into) is then
//! the engine's index for queries; a standby follows the table into its own
//! copy.
//!
//! # Recovery
//!
//! After a crash nothing acknowledged is lost: it was in the log (or
//! committed) before its caller heard back. The engine rebuilds its state
//! (runs, cooldowns, holds, modes, faults) from the chain; recovery's own
//! records say what it concluded.
//!
//! # What `verify` proves, and what it cannot
//!
//! `verify` walks the whole chain — every `prev_hash` link, every `hash`
//! recomputed, summaries against their digests; the record log line by line,
//! then every record again through records.idx — and
//! names the first record that does not check out. It proves the store is
//! one unbroken chain from [`GENESIS`]. It cannot prove the chain is the
//! one that was written: someone able to rewrite the whole store can
//! rewrite every hash too, or cut the newest records off. Only an **outside
//! anchor** proves that: the head (`seq`, `hash`) published elsewhere
//! (`nightshift audit head`, `/api/v1/audit/head`), against
//! which a later head must extend. `scripts/verify-chain.py` recomputes the
//! hashes of an export without nightshift.
//!
//! # Layout
//!
//! The modules form a DAG, lowest first (`tests/tests/it/architecture.rs`
//! checks it, `super::` paths included):
//!
//! ```text
//! runs, ha, chain          no other module
//! data                     runs         (typed payloads: what recovery reads back)
//! encode                   runs         (a record's hash input and log line, prepared by its caller)
//! log                      chain        (the record log: records.jsonl)
//! index                    encode, log, positions, ha   (the index thread, sled trees and keys, chaining a group)
//! pipeline                 index, log   (the one group-commit loop; the file log's writer)
//! pg                       ha, runs     (the chain in PostgreSQL)
//! pgwriter                 index, pg, pipeline   (the PostgreSQL log's writer)
//! positions                log          (records.idx: where each record's line is)
//! verify                   index, log, chain
//! store                    encode, index, log, pipeline, pgwriter, verify   (AuditStore, the façade)
//! tools/salvage            index, log, verify, store      (a new store from what checks out)
//! tools/migrate            pg, store, log                 (a record log into PostgreSQL)
//! tools/load               store                          (scenario 5's appends, for the bench and examples/appends.rs)
//! ```
#![forbid(unsafe_code)]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod chain;
#[cfg(test)]
mod damage_tests;
pub mod data;
mod db;
mod encode;
pub mod ha;
mod index;
mod log;
pub mod pg;
mod pgwriter;
mod pipeline;
mod positions;
pub mod runs;
mod store;
pub mod tools;
mod verify;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::runs::{RunOutcome, RunState, RunSummary};

pub use db::{LeaseDb, PgReads};
pub use index::PgOptions;
pub use log::{LOG_FILE, verify_log};
pub use store::{AuditStore, RecordPage, RecordQuery, SEARCH_SCAN};
pub use tools::salvage::{SalvageReport, rebuild_summary, salvage};
pub use verify::{anchor_check, parse_anchor, verify_dir};

/// SHA-256 of `bytes`, hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    EngineStarted,
    EventReceived,
    EventDropped,
    TriggerFired,
    TriggerSuppressed,
    BreakerTripped,
    RunQueued,
    ApprovalRequested,
    Approved,
    Rejected,
    RunStarted,
    ActionIntent,
    ActionResult,
    Note,
    Notification,
    Escalation,
    Refusal,
    NodeAnnotated,
    HandsOff,
    RunFinished,
    /// How a notification's delivery to one webhook went.
    NotificationDelivery,
    /// A hold ended on an agent (released, lease ran out, or a person took
    /// the setting over), as the agent reported it.
    HoldEnded,
    /// The store was rebuilt from a damaged one: what was recovered and
    /// which breaks in the chain that explains.
    Salvaged,
    /// fleet.yaml, tokens and runbooks read again (SIGHUP or the admin
    /// API): who asked and what changed, or why nothing did.
    ConfigReloaded,
    /// An admin promoted a runbook to `act` or demoted it to `shadow`.
    RunbookMode,
    /// A GPU's health moved in its repair lifecycle (`health.rs`).
    HealthChanged,
    /// Everything an accepted event leads to (runs queued, suppressions,
    /// drops) is on the chain: recovery need not handle it again.
    EventHandled,
    /// A held setting was found at its default on the device (a GPU reset,
    /// a reboot) and the agent applied the held value again.
    HoldReapplied,
    /// A held setting is not in force on the device (a person's value, or
    /// a re-apply the envelope refused): the agent leaves it alone.
    HoldDrifted,
    /// An admin put the whole fleet in `act`, `shadow` or `paused` mode.
    FleetMode,
    /// A maintenance window was set or ended: nodes matched by labels or
    /// names are hands-off from its start to its end.
    Maintenance,
    /// RMA evidence was gathered on a node: the bundle, its files and the
    /// SHA-256 of its manifest (`nightshift audit verify --evidence DIR`
    /// checks a copy against it).
    EvidenceCollected,
}

impl RecordKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::EngineStarted => "engine_started",
            RecordKind::EventReceived => "event_received",
            RecordKind::EventDropped => "event_dropped",
            RecordKind::TriggerFired => "trigger_fired",
            RecordKind::TriggerSuppressed => "trigger_suppressed",
            RecordKind::BreakerTripped => "breaker_tripped",
            RecordKind::RunQueued => "run_queued",
            RecordKind::ApprovalRequested => "approval_requested",
            RecordKind::Approved => "approved",
            RecordKind::Rejected => "rejected",
            RecordKind::RunStarted => "run_started",
            RecordKind::ActionIntent => "action_intent",
            RecordKind::ActionResult => "action_result",
            RecordKind::Note => "note",
            RecordKind::Notification => "notification",
            RecordKind::Escalation => "escalation",
            RecordKind::Refusal => "refusal",
            RecordKind::NodeAnnotated => "node_annotated",
            RecordKind::HandsOff => "hands_off",
            RecordKind::RunFinished => "run_finished",
            RecordKind::NotificationDelivery => "notification_delivery",
            RecordKind::HoldEnded => "hold_ended",
            RecordKind::Salvaged => "salvaged",
            RecordKind::ConfigReloaded => "config_reloaded",
            RecordKind::RunbookMode => "runbook_mode",
            RecordKind::HealthChanged => "health_changed",
            RecordKind::EventHandled => "event_handled",
            RecordKind::HoldReapplied => "hold_reapplied",
            RecordKind::HoldDrifted => "hold_drifted",
            RecordKind::FleetMode => "fleet_mode",
            RecordKind::Maintenance => "maintenance",
            RecordKind::EvidenceCollected => "evidence_collected",
        }
    }

    /// Kinds whose every record is indexed by kind (`records_of_kind`):
    /// the state they carry outlives any replay window (a GPU awaiting an
    /// RMA for weeks, a node's marks, a runbook promoted months ago).
    pub fn indexed_by_kind(self) -> bool {
        matches!(
            self,
            RecordKind::HealthChanged
                | RecordKind::NodeAnnotated
                | RecordKind::RunbookMode
                | RecordKind::FleetMode
                | RecordKind::HandsOff
                | RecordKind::Maintenance
        )
    }
}

/// A record to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRecord {
    pub kind: RecordKind,
    pub run: Option<String>,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub runbook: Option<String>,
    /// Who: `engine`, `user:<name>`, `alertmanager`, `agent:<node>`.
    pub actor: String,
    pub data: Value,
}

impl NewRecord {
    pub fn new(kind: RecordKind, actor: &str, data: Value) -> NewRecord {
        NewRecord { kind, run: None, node: None, gpu: None, runbook: None, actor: actor.into(), data }
    }

    /// The record before the writer chains it: `seq`, `ts_ms`, `prev_hash`
    /// and `hash` not yet set, the current chain version.
    pub(crate) fn unchained(self) -> AuditRecord {
        AuditRecord {
            seq: 0,
            ts_ms: 0,
            kind: self.kind,
            run: self.run,
            node: self.node,
            gpu: self.gpu,
            runbook: self.runbook,
            actor: self.actor,
            data: self.data,
            prev_hash: String::new(),
            hash: String::new(),
            v: Some(CHAIN_VERSION),
        }
    }

    /// A record with a typed payload (`data.rs`): what recovery reads back
    /// is written only this way.
    pub fn typed<P: data::Payload>(kind: RecordKind, actor: &str, payload: &P) -> NewRecord {
        debug_assert!(P::KINDS.contains(&kind), "a {kind:?} record with a payload for {:?}", P::KINDS);
        // A payload is plain data (string keys only): it always serializes.
        let data = serde_json::to_value(payload).unwrap_or(Value::Null);
        NewRecord::new(kind, actor, data)
    }
    pub fn run(mut self, run: &str) -> Self {
        self.run = Some(run.into());
        self
    }
    pub fn node(mut self, node: Option<&str>) -> Self {
        self.node = node.map(str::to_string);
        self
    }
    pub fn gpu(mut self, gpu: Option<u32>) -> Self {
        self.gpu = gpu;
        self
    }
    pub fn runbook(mut self, runbook: &str) -> Self {
        self.runbook = Some(runbook.into());
        self
    }
}

/// A stored record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    pub seq: u64,
    pub ts_ms: i64,
    pub kind: RecordKind,
    pub run: Option<String>,
    pub node: Option<String>,
    pub gpu: Option<u32>,
    pub runbook: Option<String>,
    pub actor: String,
    pub data: Value,
    pub prev_hash: String,
    pub hash: String,
    /// How `hash` is computed: absent for version 1 (serde_json's bytes of
    /// the fields in a fixed order), `2` for RFC 8785 canonical JSON of every
    /// field but `hash` — which any JCS library recomputes (docs/OPERATIONS.md
    /// shows one in Python). New records are version 2; `verify` checks
    /// both, and the chain runs across the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v: Option<u8>,
}

/// A record and the exact bytes of the run summary it changed, if any.
pub type LoggedRecord = (AuditRecord, Option<Vec<u8>>);

/// Every record of a store's record log (`data_dir/records.jsonl`) with the
/// exact bytes of the run summary it changed, oldest first — what
/// `nightshift audit migrate` copies. A damaged line stops it, naming the
/// line: verify and salvage first.
pub fn log_records(data_dir: &std::path::Path) -> Result<Vec<LoggedRecord>, AuditError> {
    let mut out: Vec<LoggedRecord> = Vec::new();
    for line in log::read_lines(&data_dir.join(log::LOG_FILE))? {
        match line {
            log::LogLine::Good(r) => out.push((r, None)),
            log::LogLine::Summary { bytes } => {
                if let Some(last) = out.last_mut() {
                    last.1 = Some(bytes);
                }
            }
            log::LogLine::Bad { line, problem } => {
                return Err(AuditError::Read(format!(
                    "{}:{line}: {problem}: run `nightshift audit verify`, and `audit salvage` if it is damaged, before migrating",
                    data_dir.join(log::LOG_FILE).display()
                )));
            }
        }
    }
    Ok(out)
}

/// The hash format new records get.
pub const CHAIN_VERSION: u8 = 2;

/// The fields covered by a record's hash, in a fixed order.
#[derive(Serialize)]
struct Hashed<'a> {
    seq: u64,
    ts_ms: i64,
    kind: RecordKind,
    run: &'a Option<String>,
    node: &'a Option<String>,
    gpu: Option<u32>,
    runbook: &'a Option<String>,
    actor: &'a str,
    data: &'a Value,
    prev_hash: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<u8>,
}

impl AuditRecord {
    /// The payload as its type (`data.rs`); an error names the record and
    /// what did not read.
    pub fn payload<P: data::Payload>(&self) -> Result<P, data::PayloadError> {
        if !P::KINDS.contains(&self.kind) {
            return Err(data::PayloadError::Kind {
                seq: self.seq,
                expected: P::KINDS.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(" or "),
                found: self.kind.as_str().into(),
            });
        }
        P::deserialize(&self.data).map_err(|e| data::PayloadError::Shape {
            seq: self.seq,
            kind: self.kind.as_str().into(),
            message: e.to_string(),
        })
    }

    /// SHA-256 over the record without `hash`, as its version says: RFC
    /// 8785 canonical JSON (version 2), or serde_json's bytes (version 1,
    /// records written before; unknown versions never verify).
    pub fn compute_hash(&self) -> String {
        let h = Hashed {
            seq: self.seq,
            ts_ms: self.ts_ms,
            kind: self.kind,
            run: &self.run,
            node: &self.node,
            gpu: self.gpu,
            runbook: &self.runbook,
            actor: &self.actor,
            data: &self.data,
            prev_hash: &self.prev_hash,
            v: self.v,
        };
        let bytes = match self.v {
            None => serde_json::to_vec(&h).unwrap_or_default(),
            Some(2) => serde_json_canonicalizer::to_vec(&h).unwrap_or_default(),
            Some(_) => return String::new(),
        };
        hex::encode(Sha256::digest(&bytes))
    }
}

/// The hash before the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An audit store failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("audit store at {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("audit store is locked by another process (is `nightshift serve` running on {path}?): {message}")]
    Locked { path: PathBuf, message: String },
    #[error("audit write failed: {0}")]
    Write(String),
    #[error("audit read failed: {0}")]
    Read(String),
    /// A page cursor this server did not give out (the caller's mistake).
    #[error("{0}")]
    BadCursor(String),
    #[error("the audit writer has stopped")]
    Closed,
    /// PostgreSQL backend: this engine is a standby; only the leader writes.
    #[error(
        "this engine is a standby ({0}): only the leader writes; send writes to the leader (any replica's API forwards them)"
    )]
    NotLeader(String),
    /// PostgreSQL backend: the lease moved on, or the chain did; this
    /// engine writes nothing more.
    #[error("this engine was deposed and writes nothing more: {0}")]
    Deposed(String),
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VerifyReport {
    pub ok: bool,
    /// Records checked and found good, 1..=verified_up_to.
    pub verified_up_to: u64,
    pub records: u64,
    #[serde(default)]
    pub first_bad_seq: Option<u64>,
    #[serde(default)]
    pub problem: Option<String>,
    /// Breaks in the chain a salvage documented: (the record after the
    /// break, the `salvaged` record that excuses it). Each is reported,
    /// never silently passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excused: Vec<(u64, u64)>,
    /// What was not checked, and why (e.g. an index that would not open
    /// beside a chain that verifies); never a break.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Filter for listing runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunFilter {
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub runbook: Option<String>,
    #[serde(default)]
    pub outcome: Option<RunOutcome>,
    #[serde(default)]
    pub state: Option<RunState>,
    #[serde(default)]
    pub since_ms: Option<i64>,
    #[serde(default)]
    pub until_ms: Option<i64>,
    /// Opaque cursor from a previous page: runs older than it.
    #[serde(default)]
    pub cursor: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only runs on any of these nodes (a label filter, resolved by the
    /// engine from the fleet: the store does not know labels). Empty: none.
    #[serde(default)]
    pub nodes_any: Option<Vec<String>>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    /// Pass back as `cursor` for the next (older) page.
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod chain_version_tests {
    use super::*;

    fn rec(seq: u64, prev: &str, v: Option<u8>) -> AuditRecord {
        let mut r = AuditRecord {
            seq,
            ts_ms: 1_790_000_000_000 + seq as i64,
            kind: RecordKind::Note,
            run: Some("r1".into()),
            node: None,
            gpu: Some(2),
            runbook: None,
            actor: "engine".into(),
            data: serde_json::json!({"text": "91.5 °C → capped", "b": [1, 2.5, true, null], "a": {"z": 1, "y": "\u{1f}"}}),
            prev_hash: prev.into(),
            hash: String::new(),
            v,
        };
        r.hash = r.compute_hash();
        r
    }

    /// A store written before version 2 goes on with version 2 records:
    /// the log verifies across the change, and a change to either kind of
    /// record is caught.
    #[test]
    fn a_chain_verifies_across_the_version_change() {
        let r1 = rec(1, GENESIS, None);
        let r2 = rec(2, &r1.hash, Some(CHAIN_VERSION));
        assert_ne!(r1.hash, rec(1, GENESIS, Some(2)).hash, "the two formats hash differently");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("records.jsonl");
        let write = |rs: &[&AuditRecord]| {
            let text: String = rs.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
            std::fs::write(&log, text).unwrap();
        };
        write(&[&r1, &r2]);
        let v = verify_log(&log).unwrap();
        assert!(v.ok && v.verified_up_to == 2, "{v:?}");
        for tamper in [1, 2] {
            let (mut a, mut b) = (r1.clone(), r2.clone());
            let t = if tamper == 1 { &mut a } else { &mut b };
            t.data["text"] = "91.5 °C → left alone".into();
            write(&[&a, &b]);
            let v = verify_log(&log).unwrap();
            assert_eq!(v.first_bad_seq, Some(tamper), "{v:?}");
        }
        // An unknown version never verifies.
        let mut r3 = rec(3, &r2.hash, Some(9));
        r3.hash = "0".repeat(64);
        assert_eq!(r3.compute_hash(), "");
    }

    /// Version 2 is RFC 8785: keys sorted, no spaces, ECMAScript numbers.
    #[test]
    fn version_2_hashes_the_canonical_json() {
        let r = rec(7, GENESIS, Some(2));
        let mut v = serde_json::to_value(&r).unwrap();
        v.as_object_mut().unwrap().remove("hash");
        let canon = serde_json_canonicalizer::to_string(&v).unwrap();
        assert!(
            canon.starts_with(r#"{"actor":"engine","data":{"a":{"y":"\u001f","z":1},"b":[1,2.5,true,null]"#),
            "{canon}"
        );
        assert_eq!(r.hash, hex::encode(Sha256::digest(canon.as_bytes())));
    }
}
