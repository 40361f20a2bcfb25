//! The tamper-evident audit log, in sled, behind one small interface.
//!
//! Every record has a gap-free sequence number and carries the SHA-256 of the
//! record before it (over canonical JSON), so editing, removing or
//! reordering any record breaks the chain at that point and [`AuditStore::verify`]
//! names it. Appends go through a writer thread that groups concurrent
//! appends into one write and one fdatasync of the record log
//! (`records.jsonl`, the durability point), and an index thread that then
//! puts them in sled (by seq, by run, by node, run summaries) and
//! acknowledges them: a record is durable before its `append` returns, and
//! readable from sled too. sled flushes in the background; what it loses in
//! a crash is replayed from the log when the store opens.

mod log;
mod salvage;
mod store;
mod verify;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::runs::{RunOutcome, RunState, RunSummary};

pub use log::{LOG_FILE, verify_log};
pub use salvage::{SalvageReport, rebuild_summary, salvage};
pub use store::AuditStore;

/// SHA-256 of `bytes`, hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
        }
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
}

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
}

impl AuditRecord {
    /// SHA-256 over the canonical JSON of everything but `hash`.
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
        };
        let bytes = serde_json::to_vec(&h).unwrap_or_default();
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
    #[error("the audit writer has stopped")]
    Closed,
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub ok: bool,
    /// Records checked and found good, 1..=verified_up_to.
    pub verified_up_to: u64,
    pub records: u64,
    #[serde(default)]
    pub first_bad_seq: Option<u64>,
    #[serde(default)]
    pub problem: Option<String>,
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
}

/// A page of runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    /// Pass back as `cursor` for the next (older) page.
    pub next_cursor: Option<String>,
}
