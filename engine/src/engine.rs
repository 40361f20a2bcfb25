//! [`Engine`]: the handle the web server, the CLI and the simulated fleet
//! hold. It is a cheap clone of an `Arc<Core>` (see `core.rs`). Its `pub`
//! methods — the façade other crates call — are here and in `views.rs`
//! (the reads), nothing else; the work they forward to, and every
//! `pub(crate)` method, live beside what they do:
//!
//! - `ingest.rs` — telemetry, pulled samples and Alertmanager alerts in,
//!   trigger fires out;
//! - `run/executor.rs`, `run/queue.rs` — submit (admission), the queue, starting, finishing,
//!   approvals, the periodic tick;
//! - `run/recovery.rs` — what a restart rebuilds and reconciles;
//! - `views.rs` — what the API, UI and CLI read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nightshift_proto::clock::SharedClock;
use nightshift_proto::{EvidenceChunk, Telemetry};

use crate::audit::{AuditError, AuditStore, NewRecord, RecordKind};
use crate::base::metrics::MetricId;
use crate::config::EngineConfig;
use crate::core::Core;
use crate::health::xid_policy::XidPolicy;
use crate::runbooks::runbook::RunbookSet;
use crate::runs::RunState;
use crate::runs::{RunSummary, Target};
use crate::signals::alerts::WebhookPayload;
use crate::signals::telemetry::SeriesKey;

/// An engine failure a caller can act on. The web crate chooses the HTTP
/// status for each.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("unknown runbook `{name}`: expected one of [{known}]")]
    UnknownRunbook { name: String, known: String },
    #[error("unknown node `{0}`: it is not in the inventory")]
    UnknownNode(String),
    /// The target does not fit the runbook's scope or the inventory.
    #[error("{0}")]
    BadTarget(String),
    /// A parameter override is unknown, mistyped or out of range.
    #[error("{0}")]
    BadParams(String),
    #[error("no run `{0}`")]
    NoSuchRun(String),
    /// Cancel of a run that already ended.
    #[error("run {run} already finished ({outcome}): there is nothing to cancel")]
    AlreadyFinished { run: String, outcome: String },
    /// Only reading ops may be sent to an agent outside a runbook.
    #[error("{op} changes the node: run a runbook instead")]
    NotReadOnly { op: String },
    #[error("agent on {node} did not answer: {message}")]
    AgentUnreachable { node: String, message: String },
    #[error("run {run} is {state}, not waiting for approval")]
    NotAwaitingApproval { run: String, state: String },
    /// A rejection must say why.
    #[error("reason: expected why the run is rejected, found no visible character")]
    MissingReason,
    /// Promotion and demotion say why and change something.
    #[error("{0}")]
    BadModeChange(String),
    /// A person may not approve a run they asked for, triggered or posted.
    #[error("run {run} was requested by {by}: someone else must approve it")]
    SelfApproval { run: String, by: String },
    /// A person's control refused as things stand (an admin's hands-off,
    /// a repair not done), nothing sent: the message says what would let it.
    #[error("{message}")]
    Guarded { code: &'static str, message: String },
    /// Only an admin may do this (a forced release).
    #[error("{0}")]
    AdminOnly(String),
    /// An `Idempotency-Key` used again for a different request.
    #[error(
        "Idempotency-Key {key:?} was used for run {run} ({what}): a different request with the same key is refused; use a new key"
    )]
    IdempotencyConflict { key: String, run: String, what: String },
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// A request to run a runbook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    pub runbook: String,
    pub target: Target,
    /// `threshold`, `alert`, `manual`, … (the trigger type).
    pub trigger: String,
    /// Why, in one line.
    pub detail: String,
    pub event: Value,
    pub event_ts_ms: i64,
    /// `name=value` overrides of the runbook's params.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub dry_run: bool,
    /// `engine`, `alertmanager:<token>` or `user:<name>`.
    pub requested_by: String,
}

/// What became of an Alertmanager payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Ingested {
    /// New alerts, to be handled.
    pub accepted: usize,
    /// Repeats of a (fingerprint, startsAt) already seen.
    pub duplicates: usize,
    /// Over the backlog cap: not handled, not remembered.
    pub shed: usize,
}

/// What became of a run request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Submitted {
    Queued {
        run: RunSummary,
    },
    PendingApproval {
        run: RunSummary,
    },
    /// A run was created and refused at once (budget, hands-off).
    Refused {
        run: RunSummary,
    },
    /// Not run: another run for the same target is active, or cooling down.
    Suppressed {
        reason: String,
        existing_run: Option<String>,
    },
    /// Not run: stale event or queue full.
    Dropped {
        reason: String,
    },
}

impl Submitted {
    pub fn run(&self) -> Option<&RunSummary> {
        match self {
            Submitted::Queued { run } | Submitted::PendingApproval { run } | Submitted::Refused { run } => Some(run),
            _ => None,
        }
    }
}

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) core: Arc<Core>,
}

/// Everything needed to build an engine (defined beside `Core::build`,
/// which takes it whole).
pub use crate::core::EngineParts;

impl Engine {
    /// Build an engine from its parts. Starts no background work: call
    /// [`Engine::begin`] once, then [`Engine::tick`] periodically (the
    /// server does both), or drive it yourself (scenario tests).
    pub fn new(parts: EngineParts) -> Engine {
        let core = Core::build(parts);
        Engine { core: Arc::new(core) }
    }

    /// The engine a part of it (a run's host) belongs to.
    pub(crate) fn from_core(core: Arc<Core>) -> Engine {
        Engine { core }
    }

    pub fn config(&self) -> &EngineConfig {
        self.core.config()
    }

    pub fn clock(&self) -> &SharedClock {
        self.core.clock()
    }

    pub fn audit(&self) -> &AuditStore {
        self.core.audit()
    }

    /// The tokens in force and their generation (it grows at each reload
    /// that changed them).
    pub fn auth(&self) -> (u64, Arc<crate::config::AuthConfig>) {
        self.core.tokens().get()
    }

    /// Every counter now, as plain data (what `/metrics` renders).
    pub fn counters(&self) -> crate::base::counters::CounterSnapshot {
        self.core.counters().snapshot()
    }

    /// The loaded runbooks.
    pub fn runbook_set(&self) -> Arc<RunbookSet> {
        self.core.runbook_set()
    }

    /// Record that the engine started (and what it loaded).
    pub(crate) async fn announce_start(&self) -> Result<(), EngineError> {
        let set = self.runbook_set();
        self.core
            .audit()
            .append(
                NewRecord::typed(
                    RecordKind::EngineStarted,
                    "engine",
                    &crate::audit::data::EngineStarted {
                        version: env!("CARGO_PKG_VERSION").into(),
                        id_epoch: self.core.ids().epoch().to_string(),
                        runbooks: set.names(),
                        runbook_errors: set.errors.iter().map(|e| e.to_string()).collect(),
                        nodes: self.core.fleet().len(),
                    },
                ),
                None,
            )
            .await?;
        Ok(())
    }

    /// Register a background task to stop on shutdown.
    pub(crate) fn add_task(&self, t: tokio::task::JoinHandle<()>) {
        self.core.lifecycle().add(t);
    }

    /// A receiver that flips to true on shutdown.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.core.lifecycle().signal()
    }

    /// Set the cancel flag of every active run (no waiting; for drops).
    pub fn cancel_all(&self) {
        for r in self.core.runs().table().entries() {
            r.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Stop background work; cancel running runs (they finish as cancelled).
    pub async fn shutdown(&self) {
        self.core.lifecycle().stop();
        self.cancel_all();
        // Give running scripts a moment to notice the cancel.
        for _ in 0..50 {
            if self.running() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if let Err(e) = self.core.audit().flush() {
            tracing::error!(error = %e, "cannot flush the audit store at shutdown");
        }
    }
}

/// Why a piece of evidence could not be read: the node, bundle or file is
/// not there, or the name is not one (`Refused`), or the agent did not
/// answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvidenceReadError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadName(String),
    #[error("{0}")]
    Unreachable(String),
}

/// The rest of the façade (`views.rs` has what people and pages read):
/// what the server, the simulated fleet and the bench drive — start,
/// readings and alerts in, the tick and the queue, runs — and the reads
/// they poll. Other crates call the engine here or in `views.rs`, nowhere
/// else (the architecture test counts the methods and the files); each
/// method's work lives with its subsystem.
impl Engine {
    /// Begin acting, as every start and takeover does: record the start,
    /// tell every agent this leader's term (HA), then recover what the last
    /// engine left. Returns the ids of the runs recovery interrupted. The
    /// simulator's restart calls the same (never kinder than a real one).
    pub async fn begin(&self) -> Result<Vec<String>, EngineError> {
        self.announce_start().await?;
        // Before the first action (recovery's releases are actions): every
        // agent that answers learns this term and refuses the one before.
        let told = self.core.announce_term().await;
        if self.core.leadership().is_some() {
            tracing::info!(agents = told, of = self.core.fleet().nodes().len(), "announced this leader's term");
        }
        self.recover().await
    }

    /// Runs executing right now.
    pub fn running(&self) -> usize {
        self.core.runs().table().running()
    }

    /// Runs that are executing and not asleep on the clock, plus runs ready
    /// to start: zero means the engine is idle until time moves.
    pub fn busy(&self) -> usize {
        let now = self.core.now();
        let t = self.core.runs().table();
        let startable = t
            .queued_entries()
            .filter(|r| {
                // A resumed run waiting for its nodes' first readings waits
                // for time to move, as a sleeping one does.
                r.announced
                    && r.not_before_ms <= now
                    && r.resume_wait_until_ms.is_none_or(|u| u <= now)
                    && self.blocker(&t, r).is_none()
            })
            .count();
        let running = t.running();
        drop(t);
        running.saturating_sub(self.core.clock().idle_sleepers())
            + startable
            + self.core.signals().backlog().batches() as usize
            + self.core.audit().pending() as usize
    }

    /// Active runs as `id runbook target state (what it waits for)`, for
    /// diagnostics.
    pub fn active_runs(&self) -> Vec<String> {
        let t = self.core.runs().table();
        let mut v: Vec<String> = t
            .entries()
            .map(|r| {
                let waits = r.summary.waiting_for.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
                format!("{} {} {} {:?}{waits}", r.summary.id, r.summary.runbook, r.summary.target, r.summary.state)
            })
            .collect();
        v.sort();
        v
    }

    /// Runs waiting to start (queued or pending approval).
    pub fn queue_depth(&self) -> usize {
        self.core
            .runs()
            .table()
            .entries()
            .filter(|r| matches!(r.summary.state, RunState::Queued | RunState::PendingApproval))
            .count()
    }

    /// Latest value of a series.
    pub fn latest(&self, node: &str, gpu: Option<u32>, metric: MetricId) -> Option<f64> {
        let n = self.core.fleet().get(node)?;
        let gpu = gpu.map(u16::try_from).transpose().ok()?;
        self.core.signals().brain().store().latest(SeriesKey { node: n.idx, gpu, metric }).map(|(_, v)| v)
    }

    /// Accept an Alertmanager payload posted by `poster` (the webhook
    /// token's name): dedup each alert by status, fingerprint and startsAt
    /// and hand new ones to a background task. Returns at once. Past
    /// `limits.alert_backlog` alerts waiting, new ones are shed — not
    /// remembered as seen, so Alertmanager's retry brings them back — and one
    /// audit record says how many.
    pub fn ingest_alertmanager(&self, payload: WebhookPayload, poster: &str) -> Ingested {
        self.intake_alertmanager(payload, poster).0
    }

    /// Read the site's XID policy overrides engine.yaml names (at start:
    /// a broken file stops the start with file:line:column) and put them in
    /// force; returns what changed from the policy in force.
    pub fn load_fault_policy(&self) -> Result<Vec<String>, crate::runbooks::manifest::LoadError> {
        let policy = XidPolicy::load(self.config().fault_policy_path.as_deref())?;
        Ok(self.put_fault_policy(policy))
    }

    /// The XID policy in force.
    pub fn fault_policy(&self) -> Arc<XidPolicy> {
        self.core.health().model().policy()
    }

    /// The health model as people read it: this engine's own (leading), or
    /// rebuilt from its copy of the chain (a standby follows it).
    pub fn health_model(&self) -> crate::health::HealthModel {
        if self.core.acting() {
            return self.core.health().model().clone();
        }
        let mut m = crate::health::HealthModel::new(
            self.core.config().limits.max_repairs_in_window,
            (self.core.config().limits.repair_window_secs as i64).saturating_mul(1000),
        );
        if let Ok(records) = self.core.audit().records_of_kind(RecordKind::HealthChanged) {
            for r in &records {
                m.replay(r);
            }
        }
        m
    }

    /// Periodic work: expire approvals, fire schedules and fleet triggers,
    /// mark silent nodes disconnected, start queued runs. Boxed (a large
    /// state, awaited inside a replay's step).
    pub fn tick(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.tick_inner())
    }

    /// Start every run that may start now. Boxed, as `finish` is.
    ///
    /// A run the loop ends itself (refused, skipped as stale, held by a
    /// tripped breaker) pumps again from inside `finish`; on the loop's own
    /// task that pump returns at once — the loop goes on to the next run —
    /// so a queue of a thousand runs that all went stale is a loop, not a
    /// thousand nested calls (it overflowed the stack: 256 nodes whose
    /// headroom runs waited behind `max_concurrent`).
    pub fn pump(&self) -> futures::future::BoxFuture<'_, ()> {
        self.pump_queue()
    }

    /// Ask for a run (manual runs from the CLI and web come here too).
    pub async fn submit(&self, req: RunRequest) -> Result<Submitted, EngineError> {
        self.submit_request(req).await
    }

    /// A piece of one file of an evidence bundle on `node` (from `offset`;
    /// at most [`nightshift_proto::EVIDENCE_CHUNK_BYTES`]): what copies a
    /// bundle off the node for the vendor. Read-only, not audited (the
    /// chain holds the bundle's hash: `nightshift audit verify --evidence`
    /// checks the copy).
    pub async fn read_evidence(
        &self,
        node: &str,
        bundle: &str,
        file: &str,
        offset: u64,
    ) -> Result<EvidenceChunk, EvidenceReadError> {
        self.evidence_chunk(node, bundle, file, offset).await
    }

    /// Feed one agent telemetry message: update node state, push samples,
    /// evaluate triggers, submit what fired.
    pub async fn ingest_telemetry(&self, t: &Telemetry) {
        self.take_telemetry(t).await
    }

    /// Feed samples from an external source (Prometheus, DCGM exporter):
    /// `(node, gpu, metric, ts_ms, value)`.
    /// The node names may be any string type (`Arc<str>` from a backtest's
    /// series table: no allocation per sample).
    pub async fn ingest_samples<N>(&self, samples: &[(N, Option<u32>, MetricId, i64, f64)])
    where
        N: AsRef<str> + Clone + Send + Sync,
    {
        self.take_samples(samples).await
    }

    /// The webhook's intake: [`Engine::ingest_alertmanager`], answered only
    /// once every accepted alert's `event_received` is durable — a 200 is a
    /// promise (recovery handles whatever a crash cut off after it).
    pub async fn accept_alertmanager(&self, payload: WebhookPayload, poster: &str) -> Result<Ingested, EngineError> {
        self.accept_alerts(payload, poster).await
    }

    /// A person says a node (or one GPU) was repaired: its GPUs awaiting
    /// repair move to verifying (the health check still decides).
    pub async fn mark_repaired(&self, node: &str, gpu: Option<u32>, who: &str, note: &str) -> Result<Vec<u32>, String> {
        self.record_repaired(node, gpu, who, note).await
    }
}
