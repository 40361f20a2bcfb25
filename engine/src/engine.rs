//! The engine: one [`Engine`] ties the fleet, telemetry, triggers, runbooks,
//! the executor and the audit log together. The web server and the CLI call
//! it; scenario tests drive it in virtual time.
//!
//! Executor rules, in the order they apply to a run request:
//! unknown runbook or target → error; event older than `max_event_age_secs`
//! → dropped (audited); a run for the same (runbook, target) queued or
//! running → suppressed; within `cooldown_secs` of the last one →
//! suppressed; `max_attempts_per_day` spent → refused and escalated;
//! node hands-off → refused; queue full → shed (audited); approval needed →
//! `pending_approval`; otherwise queued. A queued run starts when its
//! breaker hold has passed, the breaker is not tripped, the runbook and
//! engine concurrency limits allow, and (for node and GPU runs) no other
//! mutating run holds the node.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::{ActionStatusArgs, NoArgs, Op, Request, Telemetry};

use crate::alerts::{Alert, SeenSet, WebhookPayload};
use crate::audit::{AuditError, AuditRecord, AuditStore, NewRecord, RecordKind, RunFilter, RunPage, VerifyReport};
use crate::config::EngineConfig;
use crate::fleet::{Fleet, Node, NodeState};
use crate::manifest::{Scope, Trigger};
use crate::metrics::{self, MetricId, ids};
use crate::runbook::{Runbook, RunbookSet};
use crate::runs::{ApprovalDecision, RunOutcome, RunState, RunSummary, Target};
use crate::script::{self, RunCtx, ScriptOutcome};
use crate::telemetry::{SeriesKey, TelemetryStore, samples_from};
use crate::triggers::{Fire, TriggerSet};

/// An engine failure a caller can act on.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("unknown runbook `{name}`: expected one of [{known}]")]
    UnknownRunbook { name: String, known: String },
    #[error("unknown node `{0}`: it is not in the inventory")]
    UnknownNode(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("no run `{0}`")]
    NoSuchRun(String),
    #[error("{0}")]
    Conflict(String),
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
    /// `engine` or `user:<name>`.
    pub requested_by: String,
}

/// What became of an Alertmanager payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingested {
    /// New alerts, to be handled.
    pub accepted: usize,
    /// Repeats of a (fingerprint, startsAt) already seen.
    pub duplicates: usize,
    /// Over the backlog cap: not handled, not remembered.
    pub shed: usize,
}

/// What became of a run request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub samples_ingested: AtomicU64,
    pub alerts_received: AtomicU64,
    pub alerts_duplicate: AtomicU64,
    pub alerts_unknown_node: AtomicU64,
    pub events_dropped: AtomicU64,
    pub events_shed: AtomicU64,
    /// Samples taken from Prometheus / exporters and mapped to the fleet.
    pub source_samples: AtomicU64,
    /// Pulled samples ignored: other series, unknown hosts or GPUs, NaN.
    pub source_ignored: AtomicU64,
    /// Pulls that failed (unreachable, bad response).
    pub source_errors: AtomicU64,
    pub triggers_fired: AtomicU64,
    pub runs_suppressed: AtomicU64,
    pub runs_by_outcome: Mutex<HashMap<&'static str, u64>>,
    pub action_latency: Mutex<Histogram>,
}

/// A latency histogram (seconds), Prometheus-style cumulative buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        let bounds = vec![0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        Histogram { counts: vec![0; bounds.len()], bounds, sum: 0.0, count: 0 }
    }
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if secs <= *b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }
}

/// A snapshot of one node for the API and UI.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub standby: bool,
    pub state: NodeState,
    pub drained_by_person: bool,
    /// Latest readings: per GPU, metric name → value.
    pub gpus: Vec<BTreeMap<String, f64>>,
    pub node_metrics: BTreeMap<String, f64>,
    /// Runs holding the node right now.
    pub locked_by: Option<String>,
}

/// A runbook for the API and UI.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunbookView {
    pub name: String,
    pub description: String,
    pub handbook: Option<String>,
    pub trigger: String,
    pub scope: String,
    pub manifest_path: String,
    pub manifest: Value,
    pub script_path: String,
    pub script: String,
}

struct RunEntry {
    summary: RunSummary,
    runbook_idx: usize,
    /// Not started before this (breaker hold).
    not_before_ms: i64,
    /// Pending approval expires at this time.
    approval_deadline_ms: i64,
    cancel: Arc<AtomicBool>,
    /// The queued record is durable; the run may start.
    announced: bool,
    /// Trigger series to re-arm when the run ends: (trigger idx, node idx, group value).
    fire: Option<(usize, Option<u32>, Option<String>)>,
    next_action: u32,
}

type Key = (String, Target);

#[derive(Default)]
struct Breaker {
    fires: VecDeque<(i64, Target)>,
    tripped_until: i64,
}

#[derive(Default)]
struct Exec {
    runs: HashMap<String, RunEntry>,
    queue: VecDeque<String>,
    active_by_key: HashMap<Key, String>,
    last_finished: HashMap<Key, i64>,
    suppression_noted: HashSet<Key>,
    attempts: HashMap<Key, VecDeque<i64>>,
    node_locks: HashMap<String, String>,
    running_per_runbook: HashMap<String, usize>,
    running: usize,
    drains_in_flight: HashSet<String>,
    breakers: HashMap<String, Breaker>,
    schedule_next: HashMap<String, i64>,
}

struct Brain {
    store: TelemetryStore,
    triggers: TriggerSet,
    fires: Vec<Fire>,
}

pub(crate) struct Core {
    pub(crate) config: EngineConfig,
    pub(crate) clock: SharedClock,
    pub(crate) audit: AuditStore,
    pub(crate) fleet: Fleet,
    script: Arc<rhai::Engine>,
    runbooks: RwLock<Arc<RunbookSet>>,
    brain: Mutex<Brain>,
    exec: Mutex<Exec>,
    handle: tokio::runtime::Handle,
    alerts_seen: Mutex<SeenSet>,
    resolved: Mutex<SeenSet>,
    run_seq: AtomicU64,
    /// Event batches handed to background tasks and not yet processed.
    inflight_events: AtomicU64,
    /// Alerts accepted by a webhook call and not yet handled.
    alert_backlog: AtomicU64,
    notifier: crate::notify::Notifier,
    pub(crate) counters: Counters,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) core: Arc<Core>,
}

/// Everything needed to build an engine.
pub struct EngineParts {
    pub config: EngineConfig,
    pub clock: SharedClock,
    pub audit: AuditStore,
    /// `(spec, address, transport)` for every node.
    pub nodes: Vec<(crate::inventory::NodeSpec, String, Arc<dyn nightshift_proto::ssh::client::AgentTransport>)>,
    pub script: Arc<rhai::Engine>,
    pub runbooks: RunbookSet,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_of(s: &RunSummary) -> Key {
    (s.runbook.clone(), s.target.clone())
}

/// Metric names that appear as string literals in a script: those get the
/// script window of history.
fn metrics_named_in(source: &str) -> Vec<MetricId> {
    metrics::METRICS
        .iter()
        .enumerate()
        .filter(|(_, m)| source.contains(&format!("\"{}\"", m.name)))
        .map(|(i, _)| i as MetricId)
        .collect()
}

fn build_brain(set: &RunbookSet, script_window_ms: i64) -> Brain {
    let triggers = TriggerSet::new(set.runbooks.iter().map(|r| &r.manifest));
    let mut retention = triggers.retention_ms();
    for rb in &set.runbooks {
        for m in metrics_named_in(&rb.script_source) {
            retention[m as usize] = retention[m as usize].max(script_window_ms);
        }
    }
    Brain { store: TelemetryStore::new(retention), triggers, fires: Vec::new() }
}

impl Engine {
    /// Build an engine from its parts. Starts no background work: call
    /// [`Engine::tick`] periodically (the server does) or drive it yourself
    /// (scenario tests).
    pub fn new(parts: EngineParts) -> Engine {
        let brain = build_brain(&parts.runbooks, parts.config.telemetry.script_window_secs as i64 * 1000);
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let dedup = parts.config.limits.alert_dedup_entries;
        let core = Core {
            clock: parts.clock,
            audit: parts.audit,
            fleet: Fleet::new(parts.nodes),
            script: parts.script,
            runbooks: RwLock::new(Arc::new(parts.runbooks)),
            brain: Mutex::new(brain),
            exec: Mutex::new(Exec::default()),
            handle: tokio::runtime::Handle::current(),
            alerts_seen: Mutex::new(SeenSet::new(dedup)),
            resolved: Mutex::new(SeenSet::new(dedup)),
            run_seq: AtomicU64::new(0),
            inflight_events: AtomicU64::new(0),
            alert_backlog: AtomicU64::new(0),
            notifier: crate::notify::Notifier::new(&parts.config.notifications),
            counters: Counters::default(),
            shutdown,
            tasks: Mutex::new(Vec::new()),
            config: parts.config,
        };
        let engine = Engine { core: Arc::new(core) };
        let head = engine.core.audit.head_seq();
        engine.core.run_seq.store(head, Ordering::SeqCst);
        engine
    }

    pub fn config(&self) -> &EngineConfig {
        &self.core.config
    }

    pub fn clock(&self) -> &SharedClock {
        &self.core.clock
    }

    pub fn audit(&self) -> &AuditStore {
        &self.core.audit
    }

    pub fn counters(&self) -> &Counters {
        &self.core.counters
    }

    /// The loaded runbooks.
    pub fn runbook_set(&self) -> Arc<RunbookSet> {
        self.core.runbooks.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs that are executing and not asleep on the clock, plus runs ready
    /// to start: zero means the engine is idle until time moves.
    pub fn busy(&self) -> usize {
        let now = self.core.clock.now_ms();
        let ex = lock(&self.core.exec);
        let running = ex.running;
        let startable = ex
            .queue
            .iter()
            .filter(|id| {
                ex.runs.get(*id).is_some_and(|r| r.announced && r.not_before_ms <= now && self.could_start(&ex, r))
            })
            .count();
        drop(ex);
        running.saturating_sub(self.core.clock.idle_sleepers())
            + startable
            + self.core.inflight_events.load(Ordering::SeqCst) as usize
    }

    /// Active runs as `id runbook target state`, for diagnostics.
    pub fn active_runs(&self) -> Vec<String> {
        let ex = lock(&self.core.exec);
        let mut v: Vec<String> = ex
            .runs
            .values()
            .map(|r| format!("{} {} {} {:?}", r.summary.id, r.summary.runbook, r.summary.target, r.summary.state))
            .collect();
        v.sort();
        v
    }

    /// Runs waiting to start (queued or pending approval).
    pub fn queue_depth(&self) -> usize {
        let ex = lock(&self.core.exec);
        ex.runs.values().filter(|r| matches!(r.summary.state, RunState::Queued | RunState::PendingApproval)).count()
    }

    /// Agents with a live connection (or recent telemetry).
    pub fn connected_agents(&self) -> usize {
        self.core.fleet.nodes.iter().filter(|n| n.state().connected).count()
    }

    /// Send a reading request straight to a node's agent (ping, inventory).
    pub async fn agent_call(&self, node: &str, op: Op) -> Result<nightshift_proto::Reply, EngineError> {
        if op.is_mutating() {
            return Err(EngineError::BadRequest(format!("{} changes the node: run a runbook instead", op.name())));
        }
        let n = self.core.fleet.get(node).cloned().ok_or_else(|| EngineError::UnknownNode(node.into()))?;
        let req = Request::new(format!("cli-{}-{}", op.name(), self.core.clock.now_ms()), op);
        n.transport.call(req).await.map_err(|e| EngineError::BadRequest(e.to_string()))
    }

    /// Runs executing right now.
    pub fn running(&self) -> usize {
        lock(&self.core.exec).running
    }

    /// The fleet's node names.
    pub fn node_names(&self) -> Vec<String> {
        self.core.fleet.nodes.iter().map(|n| n.spec.name.clone()).collect()
    }

    /// Record that the engine started (and what it loaded).
    pub async fn announce_start(&self) -> Result<(), EngineError> {
        let set = self.runbook_set();
        self.core
            .audit
            .append(
                NewRecord::new(
                    RecordKind::EngineStarted,
                    "engine",
                    json!({
                        "version": env!("CARGO_PKG_VERSION"),
                        "runbooks": set.names(),
                        "runbook_errors": set.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                        "nodes": self.core.fleet.len(),
                    }),
                ),
                None,
            )
            .await?;
        Ok(())
    }

    // ---------------------------------------------------------------- telemetry

    /// Feed one agent telemetry message: update node state, push samples,
    /// evaluate triggers, submit what fired.
    pub async fn ingest_telemetry(&self, t: &Telemetry) {
        let Some(node) = self.core.fleet.get(&t.node).cloned() else {
            tracing::warn!(node = %t.node, "telemetry from a node not in the inventory");
            return;
        };
        {
            let mut st = node.state();
            st.connected = true;
            st.last_seen_ms = t.ts_ms.max(st.last_seen_ms);
            st.drained = t.node_metrics.drained;
            st.drain_reason = t.node_metrics.drain_reason.clone();
            st.agent_hands_off = t.node_metrics.hands_off;
        }
        let fires = {
            let mut b = lock(&self.core.brain);
            let Brain { store, triggers, fires } = &mut *b;
            for (gpu, metric, v) in samples_from(t) {
                let key = SeriesKey { node: node.idx, gpu, metric };
                if let Some(r) = store.push(key, t.ts_ms, v)
                    && triggers.watches(metric)
                {
                    triggers.on_sample(store, r, t.ts_ms, v, fires);
                }
            }
            // Derived: the utilisation swing over the last minute.
            let swing = t
                .gpus
                .iter()
                .filter_map(|g| {
                    store.stats(
                        SeriesKey { node: node.idx, gpu: Some(g.index as u16), metric: ids::UTIL },
                        t.ts_ms - 60_000,
                    )
                })
                .filter(|s| s.count >= 10)
                .map(|s| s.max - s.min)
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
            if let Some(sw) = swing {
                let key = SeriesKey { node: node.idx, gpu: None, metric: ids::UTIL_SWING };
                if let Some(r) = store.push(key, t.ts_ms, sw)
                    && triggers.watches(ids::UTIL_SWING)
                {
                    triggers.on_sample(store, r, t.ts_ms, sw, fires);
                }
            }
            std::mem::take(fires)
        };
        self.core.counters.samples_ingested.fetch_add(t.gpus.len() as u64 * 12 + 8, Ordering::Relaxed);
        self.handle_fires(fires).await;
    }

    /// Feed samples from an external source (Prometheus, DCGM exporter).
    pub async fn ingest_samples(&self, samples: &[(String, Option<u16>, MetricId, i64, f64)]) {
        let fires = {
            let mut b = lock(&self.core.brain);
            let Brain { store, triggers, fires } = &mut *b;
            for (node, gpu, metric, ts, v) in samples {
                let Some(n) = self.core.fleet.get(node) else { continue };
                let key = SeriesKey { node: n.idx, gpu: *gpu, metric: *metric };
                if let Some(r) = store.push(key, *ts, *v)
                    && triggers.watches(*metric)
                {
                    triggers.on_sample(store, r, *ts, *v, fires);
                }
                let mut st = n.state();
                st.last_seen_ms = st.last_seen_ms.max(*ts);
            }
            std::mem::take(fires)
        };
        self.core.counters.samples_ingested.fetch_add(samples.len() as u64, Ordering::Relaxed);
        self.handle_fires(fires).await;
    }

    /// Latest value of a series.
    pub fn latest(&self, node: &str, gpu: Option<u32>, metric: MetricId) -> Option<f64> {
        let n = self.core.fleet.get(node)?;
        let b = lock(&self.core.brain);
        b.store.latest(SeriesKey { node: n.idx, gpu: gpu.map(|g| g as u16), metric }).map(|(_, v)| v)
    }

    /// Telemetry store size: (series, points).
    pub fn telemetry_size(&self) -> (usize, usize) {
        let b = lock(&self.core.brain);
        (b.store.series_count(), b.store.points())
    }

    async fn handle_fires(&self, fires: Vec<Fire>) {
        if fires.is_empty() {
            return;
        }
        let set = self.runbook_set();
        for fire in fires {
            self.core.counters.triggers_fired.fetch_add(1, Ordering::Relaxed);
            let Some(rb) = set.runbooks.get(fire.trigger) else { continue };
            let Some(req) = self.fire_request(rb, &fire) else { continue };
            let rearm = (fire.trigger, fire.node, fire.group.as_ref().map(|g| g.1.clone()));
            match self.submit_inner(req, Some(rearm.clone())).await {
                Ok(Submitted::Suppressed { .. }) => {
                    // Still true after the cooldown? Then fire again.
                    let mut b = lock(&self.core.brain);
                    let Brain { store, triggers, .. } = &mut *b;
                    triggers.rearm(store, rearm.0, rearm.1, rearm.2.as_deref());
                }
                Ok(_) => {}
                Err(e) => tracing::error!(runbook = %rb.manifest.name, error = %e, "cannot submit a fired trigger"),
            }
        }
    }

    fn selector_matches(&self, rb: &Runbook, node: &Node) -> bool {
        let sel = &rb.manifest.selector;
        if !sel.labels.iter().all(|(k, v)| node.label(k) == Some(v.as_str())) {
            return false;
        }
        match &sel.vendor {
            None => true,
            Some(v) => node.state().vendor().is_some_and(|x| {
                let x = serde_json::to_value(x).ok().and_then(|x| x.as_str().map(str::to_string)).unwrap_or_default();
                &x == v
            }),
        }
    }

    fn fire_request(&self, rb: &Runbook, fire: &Fire) -> Option<RunRequest> {
        let m = &rb.manifest;
        let node = fire.node.and_then(|i| self.core.fleet.by_idx(i)).cloned();
        if let Some(n) = &node
            && !self.selector_matches(rb, n)
        {
            return None;
        }
        let target = match (m.scope, &node, &fire.group) {
            (Scope::Gpu, Some(n), _) => Target::gpu(&n.spec.name, fire.gpu? as u32),
            (Scope::Node, Some(n), _) => Target::node(&n.spec.name),
            (Scope::Group, _, Some((k, v))) => Target::group(k, v),
            _ => return None,
        };
        Some(RunRequest {
            runbook: m.name.clone(),
            target: target.clone(),
            trigger: m.trigger.kind().into(),
            detail: fire.detail.clone(),
            event: json!({
                "kind": "telemetry",
                "trigger": m.trigger.kind(),
                "metric": m.trigger.metric(),
                "value": fire.value,
                "detail": fire.detail,
                "node": target.node,
                "gpu": target.gpu,
                "group": fire.group.as_ref().map(|g| format!("{}={}", g.0, g.1)),
                "ts_ms": fire.ts_ms,
            }),
            event_ts_ms: fire.ts_ms,
            params: BTreeMap::new(),
            dry_run: false,
            requested_by: "engine".into(),
        })
    }

    // ---------------------------------------------------------------- alerts

    /// Accept an Alertmanager payload: dedup each alert by fingerprint +
    /// startsAt and hand new ones to a background task. Returns at once.
    /// Past `limits.alert_backlog` alerts waiting, new ones are shed — not
    /// remembered as seen, so Alertmanager's retry brings them back — and
    /// one audit record says how many.
    pub fn ingest_alertmanager(&self, payload: WebhookPayload) -> Ingested {
        let cap = self.core.config.limits.alert_backlog as u64;
        let mut fresh = Vec::new();
        let (mut duplicates, mut shed) = (0, 0);
        {
            let mut seen = lock(&self.core.alerts_seen);
            let backlog = self.core.alert_backlog.load(Ordering::SeqCst);
            for a in payload.alerts {
                let key = format!("{}|{}", a.status, a.key());
                if seen.contains(&key) {
                    duplicates += 1;
                } else if backlog + fresh.len() as u64 >= cap {
                    shed += 1;
                } else {
                    seen.insert(key);
                    fresh.push(a);
                }
            }
            self.core.alert_backlog.fetch_add(fresh.len() as u64, Ordering::SeqCst);
        }
        let c = &self.core.counters;
        c.alerts_received.fetch_add((fresh.len() + duplicates + shed) as u64, Ordering::Relaxed);
        c.alerts_duplicate.fetch_add(duplicates as u64, Ordering::Relaxed);
        let accepted = fresh.len();
        if accepted > 0 || shed > 0 {
            let engine = self.clone();
            self.core.inflight_events.fetch_add(1, Ordering::SeqCst);
            self.core.handle.spawn(async move {
                if shed > 0 {
                    engine.core.counters.events_shed.fetch_add(shed as u64, Ordering::Relaxed);
                    let _ = engine
                        .drop_event(
                            &format!(
                                "alert intake full ({cap} waiting, limits.alert_backlog): {shed} alerts shed, answered 503 so Alertmanager sends them again"
                            ),
                            None,
                        )
                        .await;
                }
                for a in fresh {
                    engine.handle_alert(a).await;
                    engine.core.alert_backlog.fetch_sub(1, Ordering::SeqCst);
                }
                engine.core.inflight_events.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Ingested { accepted, duplicates, shed }
    }

    /// Alerts accepted and not yet handled.
    pub fn alert_backlog(&self) -> u64 {
        self.core.alert_backlog.load(Ordering::SeqCst)
    }

    async fn handle_alert(&self, a: Alert) {
        let host = a.host();
        let node = host.as_deref().and_then(|h| self.core.fleet.get(h)).cloned();
        let rec = NewRecord::new(
            RecordKind::EventReceived,
            "alertmanager",
            json!({
                "source": "alertmanager",
                "alertname": a.name(),
                "status": a.status,
                "fingerprint": a.fingerprint,
                "starts_at": a.starts_at,
                "labels": a.labels,
                "annotations": a.annotations,
            }),
        )
        .node(node.as_ref().map(|n| n.spec.name.as_str()))
        .gpu(a.gpu());
        if let Err(e) = self.core.audit.append(rec, None).await {
            tracing::error!(error = %e, "cannot audit an alert");
            return;
        }
        if a.status == "resolved" {
            lock(&self.core.resolved).insert(a.fingerprint.clone());
            return;
        }
        let Some(node) = node else {
            self.core.counters.alerts_unknown_node.fetch_add(1, Ordering::Relaxed);
            let _ = self
                .drop_event(
                    &format!(
                        "alert {} names host {:?}, which is not in the inventory",
                        a.name(),
                        host.unwrap_or_default()
                    ),
                    None,
                )
                .await;
            return;
        };
        let set = self.runbook_set();
        for rb in &set.runbooks {
            let Trigger::Alert { alertname, matchers } = &rb.manifest.trigger else { continue };
            if alertname != a.name() || !matchers.iter().all(|(k, v)| a.labels.get(k) == Some(v)) {
                continue;
            }
            if !self.selector_matches(rb, &node) {
                continue;
            }
            let target = match (rb.manifest.scope, a.gpu()) {
                (Scope::Gpu, Some(g)) => Target::gpu(&node.spec.name, g),
                (Scope::Gpu, None) => {
                    let _ = self
                        .drop_event(
                            &format!(
                                "alert {} has no gpu label but runbook {} acts on a GPU",
                                a.name(),
                                rb.manifest.name
                            ),
                            Some(&node.spec.name),
                        )
                        .await;
                    continue;
                }
                _ => Target::node(&node.spec.name),
            };
            let req = RunRequest {
                runbook: rb.manifest.name.clone(),
                target,
                trigger: "alert".into(),
                detail: format!(
                    "alert {} on {}{}",
                    a.name(),
                    node.spec.name,
                    a.annotations.get("summary").map(|s| format!(": {s}")).unwrap_or_default()
                ),
                event: json!({
                    "kind": "alert",
                    "alertname": a.name(),
                    "fingerprint": a.fingerprint,
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "starts_at": a.starts_at,
                }),
                event_ts_ms: a.starts_at_ms(),
                params: BTreeMap::new(),
                dry_run: false,
                requested_by: "alertmanager".into(),
            };
            if let Err(e) = self.submit_inner(req, None).await {
                tracing::error!(error = %e, "cannot submit an alert run");
            }
        }
    }

    async fn drop_event(&self, reason: &str, node: Option<&str>) -> Result<(), EngineError> {
        self.core.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        self.core
            .audit
            .append(NewRecord::new(RecordKind::EventDropped, "engine", json!({"reason": reason})).node(node), None)
            .await?;
        Ok(())
    }

    // ---------------------------------------------------------------- submit

    /// Ask for a run (manual runs from the CLI and web come here too).
    pub async fn submit(&self, req: RunRequest) -> Result<Submitted, EngineError> {
        self.submit_inner(req, None).await
    }

    fn new_run_id(&self) -> String {
        let n = self.core.run_seq.fetch_add(1, Ordering::SeqCst) + 1;
        format!("r{n:06}")
    }

    fn target_nodes(&self, target: &Target) -> Vec<Arc<Node>> {
        match (&target.node, &target.group) {
            (Some(n), _) => self.core.fleet.get(n).cloned().into_iter().collect(),
            (None, Some((k, v))) => self.core.fleet.group(k, v),
            _ => Vec::new(),
        }
    }

    async fn submit_inner(
        &self,
        req: RunRequest,
        fire: Option<(usize, Option<u32>, Option<String>)>,
    ) -> Result<Submitted, EngineError> {
        let set = self.runbook_set();
        let Some((rb_idx, rb)) = set.get(&req.runbook) else {
            return Err(EngineError::UnknownRunbook { name: req.runbook.clone(), known: set.names().join(", ") });
        };
        let m = &rb.manifest;
        // Target must fit the runbook's scope and the inventory.
        match (m.scope, &req.target.node, req.target.gpu, &req.target.group) {
            (Scope::Gpu, Some(_), Some(_), None)
            | (Scope::Node, Some(_), None, None)
            | (Scope::Group, None, None, Some(_)) => {}
            (scope, ..) => {
                return Err(EngineError::BadRequest(format!(
                    "runbook {} acts on a {}: expected {}, found target {}",
                    m.name,
                    format!("{scope:?}").to_lowercase(),
                    match scope {
                        Scope::Gpu => "--node N --gpu G",
                        Scope::Node => "--node N",
                        Scope::Group => "--group label=value",
                    },
                    req.target
                )));
            }
        }
        let nodes = self.target_nodes(&req.target);
        if nodes.is_empty() {
            return Err(match &req.target.node {
                Some(n) => EngineError::UnknownNode(n.clone()),
                None => EngineError::BadRequest(format!("no node in the inventory has label {}", req.target)),
            });
        }
        if let (Some(g), Some(n)) = (req.target.gpu, nodes.first()) {
            let count = n.state().gpu_count();
            if count > 0 && g as usize >= count {
                return Err(EngineError::BadRequest(format!(
                    "node {} has GPUs 0..{}, found --gpu {g}",
                    n.spec.name,
                    count - 1
                )));
            }
        }
        let params = m.resolve_params(&req.params).map_err(EngineError::BadRequest)?;
        let now = self.core.clock.now_ms();
        let manual = req.trigger == "manual";

        // Stale events never act.
        if !manual && now - req.event_ts_ms > m.max_event_age_secs as i64 * 1000 {
            let reason = format!(
                "{} event for {} is {} s old (max_event_age_secs {}): not acted on",
                req.trigger,
                req.target,
                (now - req.event_ts_ms) / 1000,
                m.max_event_age_secs
            );
            self.drop_event(&reason, req.target.node.as_deref()).await?;
            return Ok(Submitted::Dropped { reason });
        }

        let key: Key = (req.runbook.clone(), req.target.clone());
        enum Decision {
            Suppress(String, Option<String>, bool),
            Refuse(String),
            Shed(String),
            Create { approval: bool, hold_ms: i64 },
        }
        let run_id = self.new_run_id();
        let decision = {
            let mut ex = lock(&self.core.exec);
            if let Some(existing) = ex.active_by_key.get(&key).cloned() {
                let first = ex.suppression_noted.insert(key.clone());
                Decision::Suppress(
                    format!("run {existing} for {} is already active", req.target),
                    Some(existing),
                    first,
                )
            } else if let Some(t) =
                ex.last_finished.get(&key).copied().filter(|t| !manual && now - t < m.cooldown_secs as i64 * 1000)
            {
                let first = ex.suppression_noted.insert(key.clone());
                Decision::Suppress(
                    format!(
                        "{} cooling down for {} more s after its last run",
                        req.target,
                        (t + m.cooldown_secs as i64 * 1000 - now) / 1000
                    ),
                    None,
                    first,
                )
            } else if ex.breakers.get(&req.runbook).is_some_and(|b| b.tripped_until > now) {
                let first = ex.suppression_noted.insert(key.clone());
                Decision::Suppress(format!("breaker for {} is tripped", req.runbook), None, first)
            } else {
                let attempts = ex.attempts.entry(key.clone()).or_default();
                while attempts.front().is_some_and(|t| *t < now - 86_400_000) {
                    attempts.pop_front();
                }
                let attempts_len = attempts.len();
                let spent = attempts_len as u32 >= m.max_attempts_per_day;
                let hands_off = nodes.iter().find(|n| n.state().hands_off()).map(|n| n.spec.name.clone());
                let queued = ex.queue.len();
                if spent && !manual {
                    Decision::Refuse(format!(
                        "attempt budget spent: {} runs of {} on {} in the last 24 h (max_attempts_per_day {})",
                        attempts_len, req.runbook, req.target, m.max_attempts_per_day
                    ))
                } else if let Some(n) = hands_off {
                    Decision::Refuse(format!("node {n} is hands-off (maintenance): nightshift does not act on it"))
                } else if queued >= self.core.config.limits.queue_capacity {
                    Decision::Shed(format!(
                        "run queue is full ({} waiting, queue_capacity {}): {} for {} shed",
                        queued, self.core.config.limits.queue_capacity, req.runbook, req.target
                    ))
                } else {
                    let approval = m.approval.always || m.approval.above_nodes.is_some_and(|a| nodes.len() as u32 > a);
                    let mut hold_ms = 0;
                    if let Some(b) = &m.breaker {
                        let br = ex.breakers.entry(req.runbook.clone()).or_default();
                        br.fires.push_back((now, req.target.clone()));
                        hold_ms = b.hold_secs as i64 * 1000;
                    }
                    ex.suppression_noted.remove(&key);
                    Decision::Create { approval: approval && !req.dry_run, hold_ms }
                }
            }
        };

        match decision {
            Decision::Suppress(reason, existing, first) => {
                self.core.counters.runs_suppressed.fetch_add(1, Ordering::Relaxed);
                if first {
                    let mut rec = NewRecord::new(
                        RecordKind::TriggerSuppressed,
                        &req.requested_by,
                        json!({"reason": reason, "detail": req.detail, "trigger": req.trigger}),
                    )
                    .node(req.target.node.as_deref())
                    .gpu(req.target.gpu)
                    .runbook(&req.runbook);
                    if let Some(e) = &existing {
                        rec = rec.run(e);
                    }
                    self.core.audit.append(rec, None).await?;
                }
                Ok(Submitted::Suppressed { reason, existing_run: existing })
            }
            Decision::Shed(reason) => {
                self.core.counters.events_shed.fetch_add(1, Ordering::Relaxed);
                self.drop_event(&reason, req.target.node.as_deref()).await?;
                Ok(Submitted::Dropped { reason })
            }
            Decision::Refuse(reason) => {
                let mut summary = self.new_summary(&run_id, rb, &req, params, now);
                summary.state = RunState::Finished;
                summary.outcome = Some(RunOutcome::Refused);
                summary.finished_ms = Some(now);
                summary.why = format!("{} — refused: {reason}", req.detail);
                summary.error = Some(reason.clone());
                {
                    let mut ex = lock(&self.core.exec);
                    ex.last_finished.insert(key, now);
                }
                self.record_run(
                    RecordKind::RunQueued,
                    &summary,
                    json!({"trigger": req.trigger, "detail": req.detail, "event": req.event}),
                )
                .await?;
                self.record_run(RecordKind::RunFinished, &summary, json!({"outcome": "refused", "reason": reason}))
                    .await?;
                self.count_outcome(RunOutcome::Refused);
                self.text_record(&summary, RecordKind::Escalation, &format!("{}: {reason}", summary.runbook)).await;
                Ok(Submitted::Refused { run: summary })
            }
            Decision::Create { approval, hold_ms } => {
                let mut summary = self.new_summary(&run_id, rb, &req, params, now);
                if approval {
                    summary.state = RunState::PendingApproval;
                }
                {
                    let mut ex = lock(&self.core.exec);
                    ex.active_by_key.insert(key.clone(), run_id.clone());
                    ex.attempts.entry(key).or_default().push_back(now);
                    ex.runs.insert(
                        run_id.clone(),
                        RunEntry {
                            summary: summary.clone(),
                            runbook_idx: rb_idx,
                            not_before_ms: now + hold_ms,
                            approval_deadline_ms: now + m.approval.expire_secs as i64 * 1000,
                            cancel: Arc::new(AtomicBool::new(false)),
                            announced: false,
                            fire,
                            next_action: 0,
                        },
                    );
                    if !approval {
                        ex.queue.push_back(run_id.clone());
                    }
                }
                self.record_run(
                    RecordKind::RunQueued,
                    &summary,
                    json!({"trigger": req.trigger, "detail": req.detail, "event": req.event, "dry_run": req.dry_run}),
                )
                .await?;
                if approval {
                    self.record_run(
                        RecordKind::ApprovalRequested,
                        &summary,
                        json!({"reason": if m.approval.always { "runbook always needs approval".to_string() } else { format!("touches {} nodes (approval above {})", nodes.len(), m.approval.above_nodes.unwrap_or(0)) }, "expires_in_secs": m.approval.expire_secs}),
                    )
                    .await?;
                    self.text_record(
                        &summary,
                        RecordKind::Notification,
                        &format!("run {run_id} ({}) on {} needs approval", summary.runbook, summary.target),
                    )
                    .await;
                }
                {
                    let mut ex = lock(&self.core.exec);
                    if let Some(r) = ex.runs.get_mut(&run_id) {
                        r.announced = true;
                    }
                }
                self.pump().await;
                Ok(if approval {
                    Submitted::PendingApproval { run: summary }
                } else {
                    Submitted::Queued { run: summary }
                })
            }
        }
    }

    fn new_summary(
        &self,
        id: &str,
        rb: &Runbook,
        req: &RunRequest,
        params: BTreeMap<String, crate::manifest::ParamValue>,
        now: i64,
    ) -> RunSummary {
        RunSummary {
            id: id.into(),
            runbook: rb.manifest.name.clone(),
            handbook: rb.manifest.handbook.clone(),
            target: req.target.clone(),
            trigger: req.trigger.clone(),
            event: req.event.clone(),
            params,
            dry_run: req.dry_run,
            requested_by: req.requested_by.clone(),
            state: RunState::Queued,
            outcome: None,
            why: req.detail.clone(),
            created_ms: now,
            started_ms: None,
            finished_ms: None,
            actions: 0,
            approvals: Vec::new(),
            error: None,
            nodes: Vec::new(),
        }
    }

    async fn record_run(&self, kind: RecordKind, s: &RunSummary, data: Value) -> Result<AuditRecord, AuditError> {
        let rec = NewRecord::new(kind, &s.requested_by, data)
            .run(&s.id)
            .node(s.target.node.as_deref())
            .gpu(s.target.gpu)
            .runbook(&s.runbook);
        self.core.audit.append(rec, Some(s.clone())).await
    }

    async fn text_record(&self, s: &RunSummary, kind: RecordKind, text: &str) {
        let severity = match kind {
            RecordKind::Escalation => "escalation",
            _ => "info",
        };
        let rec = NewRecord::new(kind, "engine", self.notification_data(kind, text, severity))
            .run(&s.id)
            .node(s.target.node.as_deref())
            .runbook(&s.runbook);
        tracing::warn!(run = %s.id, runbook = %s.runbook, kind = kind.as_str(), text, "notification");
        match self.core.audit.append(rec, None).await {
            Ok(r) => self.deliver(&r),
            Err(e) => tracing::error!(error = %e, "cannot audit a notification"),
        }
    }

    /// The data of a notification or escalation record: the text, and where
    /// it goes (the log at once; webhooks, each confirmed by its own
    /// `notification_delivery` record).
    pub(crate) fn notification_data(&self, kind: RecordKind, text: &str, severity: &str) -> Value {
        let webhooks: Vec<String> = self.core.notifier.targets_for(kind).into_iter().map(|t| t.name).collect();
        json!({"text": text, "severity": severity, "delivered_to": ["log"], "webhooks": webhooks})
    }

    /// Send a durable notification record to the webhooks (in the
    /// background) and audit each delivery.
    pub(crate) fn deliver(&self, rec: &AuditRecord) {
        for target in self.core.notifier.targets_for(rec.kind) {
            let engine = self.clone();
            let body = crate::notify::body(target.format, rec);
            let (seq, run, runbook, node) = (rec.seq, rec.run.clone(), rec.runbook.clone(), rec.node.clone());
            self.core.handle.spawn(async move {
                let d = engine.core.notifier.deliver(&target, &body).await;
                if !d.ok {
                    tracing::warn!(target = %target.name, attempts = d.attempts, detail = %d.detail, "notification not delivered");
                }
                let mut r = NewRecord::new(
                    RecordKind::NotificationDelivery,
                    "engine",
                    json!({"target": target.name, "format": target.format, "for_seq": seq, "ok": d.ok, "attempts": d.attempts, "detail": d.detail}),
                )
                .node(node.as_deref());
                if let Some(run) = &run {
                    r = r.run(run);
                }
                if let Some(rb) = &runbook {
                    r = r.runbook(rb);
                }
                if let Err(e) = engine.core.audit.append(r, None).await {
                    tracing::error!(error = %e, "cannot audit a notification delivery");
                }
            });
        }
    }

    fn count_outcome(&self, o: RunOutcome) {
        *lock(&self.core.counters.runs_by_outcome).entry(o.as_str()).or_default() += 1;
    }

    // ---------------------------------------------------------------- approvals

    /// Approve a run waiting for approval.
    pub async fn approve(&self, run: &str, by: &str) -> Result<RunSummary, EngineError> {
        self.decide(run, by, true, None).await
    }

    /// Reject a run waiting for approval.
    pub async fn reject(&self, run: &str, by: &str, reason: &str) -> Result<RunSummary, EngineError> {
        self.decide(run, by, false, Some(reason.to_string())).await
    }

    async fn decide(
        &self,
        run: &str,
        by: &str,
        approved: bool,
        reason: Option<String>,
    ) -> Result<RunSummary, EngineError> {
        let now = self.core.clock.now_ms();
        let summary = {
            let mut ex = lock(&self.core.exec);
            let entry = ex.runs.get_mut(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            if entry.summary.state != RunState::PendingApproval {
                return Err(EngineError::Conflict(format!(
                    "run {run} is {}, not waiting for approval",
                    serde_json::to_value(entry.summary.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                )));
            }
            if approved && entry.summary.requested_by == by {
                return Err(EngineError::Conflict(format!(
                    "run {run} was requested by {by}: someone else must approve it"
                )));
            }
            entry.summary.approvals.push(ApprovalDecision {
                by: by.into(),
                approved,
                at_ms: now,
                reason: reason.clone(),
            });
            if approved {
                entry.summary.state = RunState::Queued;
                let id = entry.summary.id.clone();
                let s = entry.summary.clone();
                ex.queue.push_back(id);
                s
            } else {
                entry.summary.clone()
            }
        };
        if approved {
            self.record_run(RecordKind::Approved, &summary, json!({"by": by})).await?;
            self.pump().await;
            Ok(summary)
        } else {
            let why = format!("rejected by {by}: {}", reason.clone().unwrap_or_default());
            self.record_run(RecordKind::Rejected, &summary, json!({"by": by, "reason": reason})).await?;
            Ok(self.finish(run, RunOutcome::Cancelled, Some(why), None).await?)
        }
    }

    /// Cancel a queued, pending or running run.
    pub async fn cancel(&self, run: &str, by: &str) -> Result<(), EngineError> {
        let running = {
            let ex = lock(&self.core.exec);
            let e = ex.runs.get(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            e.cancel.store(true, Ordering::SeqCst);
            e.summary.state == RunState::Running
        };
        if !running {
            self.finish(run, RunOutcome::Cancelled, Some(format!("cancelled by {by} before it started")), None).await?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- executor

    fn could_start(&self, ex: &Exec, r: &RunEntry) -> bool {
        let set = self.runbook_set();
        let Some(rb) = set.runbooks.get(r.runbook_idx) else { return false };
        if ex.running >= self.core.config.limits.max_concurrent_runs {
            return false;
        }
        if ex.running_per_runbook.get(&r.summary.runbook).copied().unwrap_or(0) >= rb.manifest.max_concurrent as usize {
            return false;
        }
        if r.summary.dry_run {
            return true;
        }
        match &r.summary.target.node {
            Some(n) => ex.node_locks.get(n).is_none_or(|holder| holder == &r.summary.id),
            None => true,
        }
    }

    /// Start every run that may start now.
    pub async fn pump(&self) {
        loop {
            let now = self.core.clock.now_ms();
            let set = self.runbook_set();
            // Breakers first: a storm cancels what it held.
            let mut tripped: Vec<(String, String)> = Vec::new();
            let to_start = {
                let mut ex = lock(&self.core.exec);
                for rb in &set.runbooks {
                    let Some(b) = &rb.manifest.breaker else { continue };
                    let name = &rb.manifest.name;
                    let Some(br) = ex.breakers.get_mut(name) else { continue };
                    while br.fires.front().is_some_and(|(t, _)| *t < now - b.window_secs as i64 * 1000) {
                        br.fires.pop_front();
                    }
                    let distinct: HashSet<&Target> = br.fires.iter().map(|(_, t)| t).collect();
                    if distinct.len() as u32 > b.max_targets && br.tripped_until <= now {
                        br.tripped_until = now + b.window_secs as i64 * 1000;
                        tripped.push((
                            name.clone(),
                            format!(
                                "breaker tripped: {} targets fired within {} s (max_targets {}): a fleet-wide event, not {} broken nodes",
                                distinct.len(),
                                b.window_secs,
                                b.max_targets,
                                distinct.len()
                            ),
                        ));
                    }
                }
                let mut pick = None;
                for (i, id) in ex.queue.iter().enumerate() {
                    let Some(r) = ex.runs.get(id) else { continue };
                    if !r.announced || r.not_before_ms > now {
                        continue;
                    }
                    if tripped.iter().any(|(n, _)| n == &r.summary.runbook) {
                        continue;
                    }
                    if self.could_start(&ex, r) {
                        pick = Some(i);
                        break;
                    }
                }
                pick.and_then(|i| ex.queue.remove(i)).map(|id| {
                    let r = ex.runs.get_mut(&id).expect("queued run exists");
                    r.summary.state = RunState::Running;
                    r.summary.started_ms = Some(now);
                    let summary = r.summary.clone();
                    let idx = r.runbook_idx;
                    let cancel = r.cancel.clone();
                    ex.running += 1;
                    *ex.running_per_runbook.entry(summary.runbook.clone()).or_default() += 1;
                    if !summary.dry_run
                        && let Some(n) = &summary.target.node
                    {
                        ex.node_locks.insert(n.clone(), summary.id.clone());
                    }
                    (summary, idx, cancel)
                })
            };
            for (name, reason) in tripped {
                self.trip_breaker(&name, &reason).await;
            }
            let Some((summary, idx, cancel)) = to_start else { break };
            if let Err(e) = self.record_run(RecordKind::RunStarted, &summary, json!({"params": summary.params})).await {
                tracing::error!(run = %summary.id, error = %e, "cannot audit run start");
            }
            self.spawn_run(summary, idx, cancel);
        }
    }

    async fn trip_breaker(&self, runbook: &str, reason: &str) {
        let _ = self
            .core
            .audit
            .append(
                NewRecord::new(RecordKind::BreakerTripped, "engine", json!({"reason": reason})).runbook(runbook),
                None,
            )
            .await;
        let held: Vec<String> = {
            let ex = lock(&self.core.exec);
            ex.queue
                .iter()
                .filter(|id| ex.runs.get(*id).is_some_and(|r| r.summary.runbook == runbook))
                .cloned()
                .collect()
        };
        for id in &held {
            let _ = self.finish(id, RunOutcome::Refused, Some(reason.to_string()), None).await;
        }
        let rec = NewRecord::new(
            RecordKind::Escalation,
            "engine",
            self.notification_data(
                RecordKind::Escalation,
                &format!("{runbook}: {reason}; {} held runs refused", held.len()),
                "escalation",
            ),
        )
        .runbook(runbook);
        tracing::warn!(runbook, reason, "breaker tripped");
        if let Ok(r) = self.core.audit.append(rec, None).await {
            self.deliver(&r);
        }
    }

    fn spawn_run(&self, summary: RunSummary, idx: usize, cancel: Arc<AtomicBool>) {
        let engine = self.clone();
        let set = self.runbook_set();
        let Some(rb) = set.runbooks.get(idx).cloned() else { return };
        self.core.handle.spawn(async move {
            let host = Arc::new(crate::host::Host { engine: engine.clone(), run: summary.id.clone() });
            let mut ctx = RunCtx::new(
                &summary.id,
                &summary.runbook,
                summary.target.clone(),
                summary.dry_run,
                engine.core.clock.clone(),
                rb.manifest.timeout_secs,
                host,
                engine.core.config.script.max_notes,
            );
            ctx.cancel = cancel;
            let ctx = Arc::new(ctx);
            let event = rhai::serde::to_dynamic(&summary.event).unwrap_or_default();
            let params = rhai::serde::to_dynamic(&summary.params).unwrap_or_default();
            let target = rhai::serde::to_dynamic(json!({
                "node": summary.target.node,
                "gpu": summary.target.gpu,
                "group_label": summary.target.group.as_ref().map(|g| g.0.clone()),
                "group_value": summary.target.group.as_ref().map(|g| g.1.clone()),
                "dry_run": summary.dry_run,
                "run": summary.id,
            }))
            .unwrap_or_default();
            let script = engine.core.script.clone();
            let ast = rb.ast.clone();
            let outcome =
                tokio::task::spawn_blocking(move || script::execute(&script, &ast, ctx, event, params, target))
                    .await
                    .unwrap_or_else(|e| ScriptOutcome::Failed(format!("the run's thread panicked: {e}")));
            let (o, err) = match outcome {
                ScriptOutcome::Succeeded => (RunOutcome::Succeeded, None),
                ScriptOutcome::Failed(m) => (RunOutcome::Failed, Some(m)),
                ScriptOutcome::TimedOut(m) => (RunOutcome::TimedOut, Some(m)),
                ScriptOutcome::Cancelled => (RunOutcome::Cancelled, Some("cancelled while running".to_string())),
            };
            if let Err(e) = engine.finish(&summary.id, o, err, None).await {
                tracing::error!(run = %summary.id, error = %e, "cannot record the end of a run");
            }
        });
    }

    /// End a run: record the outcome, release its node and slot.
    async fn finish(
        &self,
        run: &str,
        outcome: RunOutcome,
        error: Option<String>,
        note: Option<&str>,
    ) -> Result<RunSummary, EngineError> {
        let now = self.core.clock.now_ms();
        let (summary, was_running, fire) = {
            let mut ex = lock(&self.core.exec);
            let entry = ex.runs.get_mut(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            let was_running = entry.summary.state == RunState::Running;
            entry.summary.state = RunState::Finished;
            entry.summary.outcome = Some(outcome);
            entry.summary.finished_ms = Some(now);
            entry.summary.error = error.clone();
            let base = entry.summary.why.split(" — ").next().unwrap_or("").to_string();
            entry.summary.why = match (&error, outcome) {
                (_, RunOutcome::Succeeded) => format!("{base} — succeeded after {} action(s)", entry.summary.actions),
                (Some(e), o) => format!("{base} — {}: {e}", o.as_str()),
                (None, o) => format!("{base} — {}", o.as_str()),
            };
            (entry.summary.clone(), was_running, entry.fire.clone())
        };
        self.record_run(
            RecordKind::RunFinished,
            &summary,
            json!({"outcome": outcome.as_str(), "error": error, "note": note, "actions": summary.actions}),
        )
        .await?;
        {
            let mut ex = lock(&self.core.exec);
            ex.runs.remove(run);
            ex.queue.retain(|id| id != run);
            let key = key_of(&summary);
            if ex.active_by_key.get(&key).is_some_and(|id| id == run) {
                ex.active_by_key.remove(&key);
            }
            ex.last_finished.insert(key, now);
            if was_running {
                ex.running = ex.running.saturating_sub(1);
                if let Some(c) = ex.running_per_runbook.get_mut(&summary.runbook) {
                    *c = c.saturating_sub(1);
                }
            }
            ex.node_locks.retain(|_, holder| holder != run);
        }
        if let Some((t, node, group)) = fire {
            let mut b = lock(&self.core.brain);
            let Brain { store, triggers, .. } = &mut *b;
            triggers.rearm(store, t, node, group.as_deref());
        }
        self.count_outcome(outcome);
        tracing::info!(run, runbook = %summary.runbook, target = %summary.target, outcome = outcome.as_str(), "run finished");
        // A slot is free: start what waits. (Boxed: pump → finish → pump.)
        let engine = self.clone();
        Box::pin(async move { engine.pump().await }).await;
        Ok(summary)
    }

    // ---------------------------------------------------------------- tick

    /// Periodic work: expire approvals, fire schedules and fleet triggers,
    /// mark silent nodes disconnected, start queued runs.
    pub async fn tick(&self) {
        let now = self.core.clock.now_ms();
        let expired: Vec<String> = {
            let ex = lock(&self.core.exec);
            ex.runs
                .values()
                .filter(|r| r.summary.state == RunState::PendingApproval && r.approval_deadline_ms <= now)
                .map(|r| r.summary.id.clone())
                .collect()
        };
        for id in expired {
            let _ = self
                .finish(&id, RunOutcome::Cancelled, Some("approval expired: nobody approved it in time".into()), None)
                .await;
        }
        let stale_ms = self.core.config.telemetry.stale_after_secs as i64 * 1000;
        for n in &self.core.fleet.nodes {
            let mut st = n.state();
            if st.connected && now - st.last_seen_ms > stale_ms {
                st.connected = false;
            }
        }
        // Fleet triggers.
        let fires = {
            let mut b = lock(&self.core.brain);
            let Brain { store, triggers, fires } = &mut *b;
            let fleet = &self.core.fleet;
            let groups = |label: &str, metric: MetricId| -> Vec<(String, Vec<SeriesKey>)> {
                fleet
                    .groups(label)
                    .into_iter()
                    .map(|(v, nodes)| {
                        let keys = nodes
                            .iter()
                            .filter(|n| {
                                let st = n.state();
                                st.connected && !st.drained
                            })
                            .flat_map(|n| {
                                let count = n.state().gpu_count().max(1);
                                let gpu_scoped = metrics::metric(metric).gpu_scoped;
                                (0..if gpu_scoped { count } else { 1 }).map(move |g| SeriesKey {
                                    node: n.idx,
                                    gpu: gpu_scoped.then_some(g as u16),
                                    metric,
                                })
                            })
                            .collect();
                        (v, keys)
                    })
                    .collect()
            };
            triggers.on_tick(store, now, &groups, fires);
            std::mem::take(fires)
        };
        self.handle_fires(fires).await;
        // Schedules.
        let set = self.runbook_set();
        for rb in &set.runbooks {
            let Trigger::Schedule { every_secs } = rb.manifest.trigger else { continue };
            let due = {
                let mut ex = lock(&self.core.exec);
                let next = ex.schedule_next.entry(rb.manifest.name.clone()).or_insert(now + every_secs as i64 * 1000);
                if *next <= now {
                    *next = now + every_secs as i64 * 1000;
                    true
                } else {
                    false
                }
            };
            if !due {
                continue;
            }
            for n in self.core.fleet.nodes.clone() {
                if !self.selector_matches(rb, &n) || !n.state().connected {
                    continue;
                }
                let req = RunRequest {
                    runbook: rb.manifest.name.clone(),
                    target: Target::node(&n.spec.name),
                    trigger: "schedule".into(),
                    detail: format!("scheduled every {every_secs} s"),
                    event: json!({"kind": "schedule", "every_secs": every_secs}),
                    event_ts_ms: now,
                    params: BTreeMap::new(),
                    dry_run: false,
                    requested_by: "engine".into(),
                };
                let _ = self.submit_inner(req, None).await;
            }
        }
        self.pump().await;
    }

    // ---------------------------------------------------------------- recovery

    /// After a restart: every run left unfinished becomes `interrupted`; an
    /// action intent without a result is reconciled with its agent by
    /// request id (never re-sent).
    pub async fn recover(&self) -> Result<Vec<String>, EngineError> {
        let unfinished = self.core.audit.unfinished_runs()?;
        let mut ids = Vec::new();
        for mut s in unfinished {
            let records = self.core.audit.run_records(&s.id)?;
            let mut open: BTreeMap<String, AuditRecord> = BTreeMap::new();
            for r in &records {
                let Some(id) = r.data.get("action_id").and_then(Value::as_str) else { continue };
                match r.kind {
                    RecordKind::ActionIntent => {
                        open.insert(id.to_string(), r.clone());
                    }
                    RecordKind::ActionResult => {
                        open.remove(id);
                    }
                    _ => {}
                }
            }
            for (action_id, intent) in open {
                let node = intent.node.clone().unwrap_or_default();
                let status = match self.core.fleet.get(&node) {
                    Some(n) => {
                        let req = Request::new(
                            format!("{action_id}-status"),
                            Op::ActionStatus(ActionStatusArgs { request_id: action_id.clone() }),
                        );
                        match n.transport.call(req).await {
                            Ok(r) => r.result.unwrap_or(Value::Null),
                            Err(e) => json!({"state": "unreachable", "error": e.to_string()}),
                        }
                    }
                    None => json!({"state": "unknown node"}),
                };
                let rec = NewRecord::new(
                    RecordKind::ActionResult,
                    "engine",
                    json!({"action_id": action_id, "reconciled": true, "agent_status": status, "op": intent.data.get("op")}),
                )
                .run(&s.id)
                .node(Some(&node))
                .gpu(intent.gpu)
                .runbook(&s.runbook);
                self.core.audit.append(rec, None).await?;
            }
            let now = self.core.clock.now_ms();
            s.state = RunState::Finished;
            s.outcome = Some(RunOutcome::Interrupted);
            s.finished_ms = Some(now);
            s.error = Some("the engine stopped while this run was in flight".into());
            s.why = format!(
                "{} — interrupted: the engine stopped while it was in flight",
                s.why.split(" — ").next().unwrap_or("")
            );
            self.record_run(RecordKind::RunFinished, &s, json!({"outcome": "interrupted", "recovered": true})).await?;
            self.count_outcome(RunOutcome::Interrupted);
            ids.push(s.id);
        }
        Ok(ids)
    }

    // ---------------------------------------------------------------- reading

    pub fn runs(&self, f: &RunFilter) -> Result<RunPage, EngineError> {
        Ok(self.core.audit.runs(f)?)
    }

    pub fn run(&self, id: &str) -> Result<Option<RunSummary>, EngineError> {
        Ok(self.core.audit.run(id)?)
    }

    pub fn run_records(&self, id: &str) -> Result<Vec<AuditRecord>, EngineError> {
        Ok(self.core.audit.run_records(id)?)
    }

    pub fn verify(&self) -> Result<VerifyReport, EngineError> {
        Ok(self.core.audit.verify()?)
    }

    /// Runs waiting for approval.
    pub fn pending_approvals(&self) -> Vec<RunSummary> {
        let ex = lock(&self.core.exec);
        let mut v: Vec<RunSummary> = ex
            .runs
            .values()
            .filter(|r| r.summary.state == RunState::PendingApproval)
            .map(|r| r.summary.clone())
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// A node's view.
    pub fn node(&self, name: &str) -> Option<NodeView> {
        let n = self.core.fleet.get(name)?;
        let state = n.state().clone();
        let b = lock(&self.core.brain);
        let gpus = (0..state.gpu_count().max(if state.inventory.is_none() { 0 } else { 1 }))
            .map(|g| {
                metrics::METRICS
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.gpu_scoped)
                    .filter_map(|(i, m)| {
                        b.store
                            .latest(SeriesKey { node: n.idx, gpu: Some(g as u16), metric: i as MetricId })
                            .map(|(_, v)| (m.name.to_string(), v))
                    })
                    .collect()
            })
            .collect();
        let node_metrics = metrics::METRICS
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.gpu_scoped)
            .filter_map(|(i, m)| {
                b.store
                    .latest(SeriesKey { node: n.idx, gpu: None, metric: i as MetricId })
                    .map(|(_, v)| (m.name.to_string(), v))
            })
            .collect();
        drop(b);
        let locked_by = lock(&self.core.exec).node_locks.get(name).cloned();
        Some(NodeView {
            name: n.spec.name.clone(),
            address: n.addr.clone(),
            labels: n.spec.labels.clone(),
            standby: n.spec.standby,
            drained_by_person: state.drained_by_person(),
            state,
            gpus,
            node_metrics,
            locked_by,
        })
    }

    /// Every node's view.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.node_names().iter().filter_map(|n| self.node(n)).collect()
    }

    /// Every runbook's view.
    pub fn runbooks(&self) -> Vec<RunbookView> {
        self.runbook_set()
            .runbooks
            .iter()
            .map(|r| RunbookView {
                name: r.manifest.name.clone(),
                description: r.manifest.description.clone(),
                handbook: r.manifest.handbook.clone(),
                trigger: r.manifest.trigger.kind().into(),
                scope: format!("{:?}", r.manifest.scope).to_lowercase(),
                manifest_path: r.manifest_path.display().to_string(),
                manifest: serde_json::to_value(&r.manifest).unwrap_or(Value::Null),
                script_path: r.script_path.display().to_string(),
                script: r.script_source.clone(),
            })
            .collect()
    }

    /// Whether a run on `target` of `runbook` would wait for approval.
    pub fn needs_approval(&self, runbook: &str, target: &Target) -> Result<bool, EngineError> {
        let set = self.runbook_set();
        let (_, rb) = set
            .get(runbook)
            .ok_or_else(|| EngineError::UnknownRunbook { name: runbook.into(), known: set.names().join(", ") })?;
        let n = self.target_nodes(target).len() as u32;
        Ok(rb.manifest.approval.always || rb.manifest.approval.above_nodes.is_some_and(|a| n > a))
    }

    /// Set or clear the engine-side hands-off marker of a node (admin).
    pub async fn set_hands_off(&self, node: &str, by: &str, why: Option<&str>) -> Result<(), EngineError> {
        let n = self.core.fleet.get(node).ok_or_else(|| EngineError::UnknownNode(node.into()))?;
        n.state().engine_hands_off = why.map(|w| (by.to_string(), w.to_string()));
        self.core
            .audit
            .append(
                NewRecord::new(RecordKind::HandsOff, by, json!({"hands_off": why.is_some(), "reason": why}))
                    .node(Some(node)),
                None,
            )
            .await?;
        Ok(())
    }

    /// Reload runbooks from the folder (admin). Trigger states start over.
    pub async fn reload_runbooks(&self, by: &str) -> Result<(usize, Vec<String>), EngineError> {
        let set = crate::runbook::load_dir(&self.core.config.runbook_dir, &self.core.script);
        let errors: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
        let n = set.runbooks.len();
        let brain = build_brain(&set, self.core.config.telemetry.script_window_secs as i64 * 1000);
        *lock(&self.core.brain) = brain;
        *self.core.runbooks.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
        self.core
            .audit
            .append(
                NewRecord::new(RecordKind::EngineStarted, by, json!({"reload": true, "runbooks": n, "errors": errors})),
                None,
            )
            .await?;
        Ok((n, errors))
    }

    /// Fetch every agent's inventory once (node state, GPU counts, vendor).
    pub async fn refresh_inventories(&self) {
        for n in self.core.fleet.nodes.clone() {
            let req =
                Request::new(format!("inv-{}-{}", n.spec.name, self.core.clock.now_ms()), Op::Inventory(NoArgs {}));
            match n.transport.call(req).await {
                Ok(r) if r.ok => {
                    let inv = r.result.and_then(|v| serde_json::from_value(v).ok());
                    let mut st = n.state();
                    st.inventory = inv;
                    st.last_error = None;
                }
                Ok(r) => n.state().last_error = r.error.map(|e| e.message),
                Err(e) => n.state().last_error = Some(e.to_string()),
            }
        }
    }

    /// Record a node's inventory (from its agent).
    pub fn set_node_inventory(&self, node: &str, inv: Option<nightshift_proto::Inventory>, error: Option<String>) {
        if let Some(n) = self.core.fleet.get(node) {
            let mut st = n.state();
            if inv.is_some() {
                st.inventory = inv;
            }
            st.last_error = error;
        }
    }

    /// Mark a node unreachable, with why.
    /// A node's agent answered (used when telemetry does not come from the
    /// agent's stream).
    pub fn mark_alive(&self, node: &str) {
        if let Some(n) = self.core.fleet.get(node) {
            let now = self.core.clock.now_ms();
            let mut st = n.state();
            st.connected = true;
            st.last_seen_ms = st.last_seen_ms.max(now);
            st.last_error = None;
        }
    }

    /// The index of a node's GPU with this UUID (from its inventory).
    pub fn gpu_by_uuid(&self, node: &str, uuid: &str) -> Option<u16> {
        let n = self.core.fleet.get(node)?;
        let st = n.state();
        st.inventory.as_ref()?.gpus.iter().find(|g| g.uuid.as_deref() == Some(uuid)).map(|g| g.index as u16)
    }

    /// Whether `node` is in the inventory.
    pub fn has_node(&self, node: &str) -> bool {
        self.core.fleet.get(node).is_some()
    }

    /// Feed pulled Prometheus/exporter samples: map, count, ingest.
    pub async fn ingest_pulled(&self, samples: &[crate::sources::PromSample]) -> crate::sources::MapStats {
        let now = self.core.clock.now_ms();
        let (mapped, st) =
            crate::sources::map_samples(samples, now, &|h| self.has_node(h), &|n, u| self.gpu_by_uuid(n, u));
        let c = &self.core.counters;
        c.source_samples.fetch_add(st.mapped as u64, Ordering::Relaxed);
        c.source_ignored
            .fetch_add((st.other_series + st.unknown_host + st.unknown_gpu + st.bad_value) as u64, Ordering::Relaxed);
        self.ingest_samples(&mapped).await;
        st
    }

    /// A pull from a source failed.
    pub fn count_source_error(&self) {
        self.core.counters.source_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_node_disconnected(&self, node: &str, error: &str) {
        if let Some(n) = self.core.fleet.get(node) {
            let mut st = n.state();
            if st.connected || st.last_error.as_deref() != Some(error) {
                tracing::warn!(node, error, "agent unreachable");
            }
            st.connected = false;
            st.last_error = Some(error.to_string());
        }
    }

    // ---------------------------------------------------------------- internals for the host

    pub(crate) fn fleet(&self) -> &Fleet {
        &self.core.fleet
    }

    pub(crate) fn run_summary(&self, run: &str) -> Option<RunSummary> {
        lock(&self.core.exec).runs.get(run).map(|r| r.summary.clone())
    }

    pub(crate) fn next_action_id(&self, run: &str) -> String {
        let mut ex = lock(&self.core.exec);
        let n = ex.runs.get_mut(run).map(|r| {
            r.next_action += 1;
            r.next_action
        });
        format!("{run}-a{}", n.unwrap_or(0))
    }

    /// Update a run's summary (actions count, nodes touched) and return it.
    pub(crate) fn update_summary(&self, run: &str, f: impl FnOnce(&mut RunSummary)) -> Option<RunSummary> {
        let mut ex = lock(&self.core.exec);
        let e = ex.runs.get_mut(run)?;
        f(&mut e.summary);
        Some(e.summary.clone())
    }

    /// Reserve a drain under the blast radius, or say why not.
    ///
    /// The limits count the serving fleet: standby nodes (spare capacity) are
    /// neither counted nor limited. At least one serving node may always be
    /// drained, however small the fleet.
    pub(crate) fn reserve_drain(&self, run: &str, node: &str, rb: &crate::manifest::BlastRadius) -> Result<(), String> {
        let mut ex = lock(&self.core.exec);
        let fleet = &self.core.fleet;
        let Some(target) = fleet.get(node) else { return Ok(()) };
        if target.spec.standby || target.state().drained {
            return Ok(());
        }
        let serving: Vec<&Arc<Node>> = fleet.nodes.iter().filter(|n| !n.spec.standby).collect();
        let total = serving.len().max(1);
        let mut drained: HashSet<String> =
            serving.iter().filter(|n| n.state().drained).map(|n| n.spec.name.clone()).collect();
        drained.extend(ex.drains_in_flight.iter().cloned());
        let after = drained.len() + 1;
        let cap_pct = rb.max_drained_pct.min(self.core.config.limits.max_drained_pct);
        let allowed = ((total as f64 * cap_pct / 100.0).floor() as usize).max(1);
        if after > allowed {
            return Err(format!(
                "blast radius: draining {node} would take {after} of {total} serving nodes out; max_drained_pct {cap_pct}% allows {allowed} (run {run})"
            ));
        }
        if let (Some(limit), Some(label)) = (rb.max_per_group, &rb.group_by) {
            let value = target.label(label).map(str::to_string);
            if let Some(v) = value {
                let in_group =
                    drained.iter().filter(|d| fleet.get(d).and_then(|n| n.label(label)) == Some(v.as_str())).count();
                if in_group as u32 >= limit {
                    return Err(format!(
                        "blast radius: {in_group} node(s) with {label}={v} already drained (max_per_group {limit}); not draining {node} (run {run})"
                    ));
                }
            }
        }
        ex.drains_in_flight.insert(node.to_string());
        Ok(())
    }

    pub(crate) fn release_drain(&self, node: &str) {
        lock(&self.core.exec).drains_in_flight.remove(node);
    }

    /// Take a node for a group run's action, or say who holds it.
    pub(crate) fn lock_node(&self, run: &str, node: &str) -> Result<(), String> {
        let mut ex = lock(&self.core.exec);
        match ex.node_locks.get(node) {
            Some(holder) if holder != run => Err(format!("node {node} is busy with run {holder}")),
            _ => {
                ex.node_locks.insert(node.to_string(), run.to_string());
                Ok(())
            }
        }
    }

    pub(crate) fn reading(&self, q: &script::Reading) -> Option<f64> {
        let n = self.core.fleet.get(&q.node)?;
        let b = lock(&self.core.brain);
        let now = self.core.clock.now_ms();
        let gpus: Vec<Option<u16>> = match (metrics::metric(q.metric).gpu_scoped, q.gpu) {
            (true, Some(g)) => vec![Some(g as u16)],
            (true, None) => (0..n.state().gpu_count()).map(|g| Some(g as u16)).collect(),
            (false, _) => vec![None],
        };
        let vals: Vec<f64> = gpus
            .into_iter()
            .filter_map(|g| {
                let key = SeriesKey { node: n.idx, gpu: g, metric: q.metric };
                match q.agg {
                    script::Agg::Latest => b.store.latest(key).map(|(_, v)| v),
                    agg => b.store.stats(key, now - q.window_ms.max(1)).map(|s| match agg {
                        script::Agg::Avg => s.avg,
                        script::Agg::Max => s.max,
                        script::Agg::Min => s.min,
                        _ => s.slope_per_sec * 60.0,
                    }),
                }
            })
            .collect();
        // Across several GPUs, the worst one speaks for the node. Readings
        // are kept as f32: give scripts two decimals, not float noise.
        vals.into_iter()
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
            .map(|v| (v * 100.0).round() / 100.0)
    }

    pub(crate) fn alert_resolved(&self, fingerprint: &str) -> bool {
        lock(&self.core.resolved).contains(fingerprint)
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.core.handle
    }

    /// Register a background task to stop on shutdown.
    pub fn add_task(&self, t: tokio::task::JoinHandle<()>) {
        lock(&self.core.tasks).push(t);
    }

    /// A receiver that flips to true on shutdown.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.core.shutdown.subscribe()
    }

    /// Set the cancel flag of every active run (no waiting; for drops).
    pub fn cancel_all(&self) {
        let ex = lock(&self.core.exec);
        for r in ex.runs.values() {
            r.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Stop background work; cancel running runs (they finish as cancelled).
    pub async fn shutdown(&self) {
        let _ = self.core.shutdown.send(true);
        for t in lock(&self.core.tasks).drain(..) {
            t.abort();
        }
        let ids: Vec<String> = {
            let ex = lock(&self.core.exec);
            for r in ex.runs.values() {
                r.cancel.store(true, Ordering::SeqCst);
            }
            ex.runs.keys().cloned().collect()
        };
        // Give running scripts a moment to notice the cancel.
        for _ in 0..50 {
            if self.running() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let _ = ids;
        let _ = self.core.audit.flush();
    }
}
