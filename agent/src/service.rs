//! The agent's request handling, independent of transport: the SSH server
//! and in-process callers (scenario tests) both come through [`Agent`].
//!
//! Order of checks for a mutating request: idempotency (journal) → hands-off
//! marker → lease bounds → envelope (bounds) → "does not apply" / "already
//! so" → rate limit → dry run → journal `pending` → apply → journal `done`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::backend::{Backend, BackendError, Support};
use crate::envelope::{Policy, RateLimiter, fmt_num};
use crate::journal::Journal;
use crate::node::NodeError;
use crate::node::caches::FlushConfig;
use crate::node::configs::{ConfigStore, ManagedConfig};
use crate::node::scheduler::{DrainState, Scheduler, SchedulerConfig};
use crate::procs::ProcError;
use nightshift_proto::clock::SharedClock;
use nightshift_proto::owner::{OWNER_PREFIX, owned_by_nightshift};
use nightshift_proto::*;

/// Everything an [`Agent`] needs besides its backend and clock.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub node: String,
    pub state_dir: PathBuf,
    pub policy: Policy,
    pub scheduler: SchedulerConfig,
    pub flush: FlushConfig,
    pub configs: BTreeMap<String, ManagedConfig>,
    pub telemetry_interval_ms: u64,
    pub max_request_bytes: usize,
}

impl AgentOptions {
    /// Options for a node named `node` keeping state in `state_dir`, with the
    /// default policy (its hands-off marker inside `state_dir`).
    pub fn new(node: &str, state_dir: PathBuf) -> AgentOptions {
        let policy = Policy { hands_off_marker_path: state_dir.join("hands-off"), ..Policy::default() };
        AgentOptions {
            node: node.into(),
            flush: FlushConfig {
                drop_caches_path: state_dir.join("drop_caches"),
                registry_dir: state_dir.join("flush.d"),
                ..FlushConfig::default()
            },
            state_dir,
            policy,
            scheduler: SchedulerConfig::None,
            configs: BTreeMap::new(),
            telemetry_interval_ms: 1000,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// What a lease puts back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Revert {
    PowerLimit { gpu: u32, watts: f64 },
    FanCurve { gpu: u32, curve: Option<Vec<FanPoint>> },
    Clocks { gpu: u32, locked: Option<(u32, u32)> },
    GpuDrain { gpu: u32, drained: bool },
    NodeResume { reason: String },
    Config { name: String, version: u32 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Lease {
    request_id: String,
    due_ms: i64,
    revert: Revert,
}

#[derive(Debug, Default)]
struct MutState {
    fan_curves: HashMap<u32, Vec<FanPoint>>,
    clocks: HashMap<u32, (u32, u32)>,
    rate: RateLimiter,
    leases: Vec<Lease>,
    drain_cache: Option<(DrainState, i64)>,
}

/// What a mutating request would do.
struct Plan {
    gpu: Option<u32>,
    before: Value,
    after: Value,
    /// The change is not possible on this device (normal answer).
    not_applicable: Option<String>,
    /// Nothing to change.
    unchanged: Option<String>,
    revert: Option<Revert>,
}

impl Plan {
    fn new(gpu: Option<u32>, before: Value, after: Value) -> Plan {
        Plan { gpu, before, after, not_applicable: None, unchanged: None, revert: None }
    }
}

type Refusal = (ErrorCode, String);

fn backend_refusal(e: BackendError) -> Refusal {
    match e {
        BackendError::NoSuchGpu { .. } => (ErrorCode::NotFound, e.to_string()),
        other => (ErrorCode::BackendError, other.to_string()),
    }
}

fn node_refusal(e: NodeError) -> Refusal {
    match e {
        NodeError::Process(ProcError::Timeout { .. }) => (ErrorCode::Timeout, e.to_string()),
        NodeError::Process(_) | NodeError::Unexpected(_) => (ErrorCode::ProcessFailed, e.to_string()),
        NodeError::NotFound(_) => (ErrorCode::NotFound, e.to_string()),
        NodeError::Io(_) => (ErrorCode::Internal, e.to_string()),
    }
}

/// The agent.
pub struct Agent {
    opts: AgentOptions,
    backend: Arc<dyn Backend>,
    clock: SharedClock,
    scheduler: Scheduler,
    configs: ConfigStore,
    journal: Mutex<Journal>,
    state: Mutex<MutState>,
    mutate: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("node", &self.opts.node).field("backend", &self.backend.name()).finish()
    }
}

/// An agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot open the request journal {path}: {source}")]
    Journal { path: PathBuf, source: std::io::Error },
    #[error("cannot create the state dir {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Config(String),
}

impl Agent {
    /// Build an agent. Reads the journal and any pending leases from the
    /// state dir, so ids and leases survive restarts.
    pub fn new(opts: AgentOptions, backend: Arc<dyn Backend>, clock: SharedClock) -> Result<Agent, AgentError> {
        std::fs::create_dir_all(&opts.state_dir)
            .map_err(|source| AgentError::StateDir { path: opts.state_dir.clone(), source })?;
        opts.flush.signal().map_err(AgentError::Config)?;
        let journal_path = opts.state_dir.join("journal.jsonl");
        let journal =
            Journal::open(&journal_path).map_err(|source| AgentError::Journal { path: journal_path, source })?;
        let scheduler = Scheduler::new(opts.scheduler.clone(), &opts.node, opts.state_dir.join("node-drain.json"));
        let configs = ConfigStore::new(opts.state_dir.join("configs"), opts.configs.clone());
        let leases: Vec<Lease> = std::fs::read(opts.state_dir.join("leases.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let state = MutState { leases, ..MutState::default() };
        Ok(Agent {
            opts,
            backend,
            clock,
            scheduler,
            configs,
            journal: Mutex::new(journal),
            state: Mutex::new(state),
            mutate: tokio::sync::Mutex::new(()),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.opts.node
    }

    /// The hardware backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The options it was built with.
    pub fn options(&self) -> &AgentOptions {
        &self.opts
    }

    /// The clock it reads.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Where the applied-request journal lives.
    pub fn journal_path(&self) -> PathBuf {
        self.opts.state_dir.join("journal.jsonl")
    }

    fn st(&self) -> std::sync::MutexGuard<'_, MutState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn jr(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Handle one raw request (the bytes of an SSH exec command).
    pub async fn handle_bytes(&self, raw: &[u8]) -> Reply {
        if raw.len() > self.opts.max_request_bytes {
            return Reply::err(
                "",
                ErrorCode::TooLarge,
                format!("request is {} bytes: expected at most {}", raw.len(), self.opts.max_request_bytes),
            );
        }
        match Request::parse(raw) {
            Ok(req) => self.handle(req).await,
            Err(e) => Reply::err(Request::salvage_id(raw), e.code(), e.to_string()),
        }
    }

    /// Handle one parsed request.
    pub async fn handle(&self, req: Request) -> Reply {
        let id = req.id.clone();
        let result = match &req.op {
            Op::Inventory(_) => {
                serde_json::to_value(self.inventory()).map_err(|e| (ErrorCode::Internal, e.to_string()))
            }
            Op::Telemetry(_) => match self.telemetry().await {
                Ok(t) => serde_json::to_value(t).map_err(|e| (ErrorCode::Internal, e.to_string())),
                Err(r) => Err(r),
            },
            Op::Subscribe(_) => Err((
                ErrorCode::BadRequest,
                "subscribe is a stream: send it as its own exec and read JSON lines".into(),
            )),
            Op::ActionStatus(a) => Ok(self.action_status(&a.request_id)),
            Op::ConfigList(a) => self.config_list(a.name.as_deref()),
            Op::SimFault(f) => self.sim_fault(f).await,
            _ => return self.mutate(req).await,
        };
        match result {
            Ok(v) => Reply::ok(id, v),
            Err((code, msg)) => Reply::err(id, code, msg),
        }
    }

    /// The node's inventory.
    pub fn inventory(&self) -> Inventory {
        Inventory {
            node: self.opts.node.clone(),
            backend: self.backend.name().into(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            scheduler: self.scheduler.kind().into(),
            gpus: self
                .backend
                .gpus()
                .iter()
                .map(|g| {
                    let (lo, hi) = self.opts.policy.power_bounds(g);
                    GpuInfo {
                        envelope_power_min_watts: Some(lo),
                        envelope_power_max_watts: Some(hi),
                        envelope_fan_min_pct: g.fan_control.then_some(self.opts.policy.fan.min_pct),
                        ..g.clone()
                    }
                })
                .collect(),
            configs: self.configs.names(),
        }
    }

    async fn drain_state(&self, fresh: bool) -> Result<DrainState, NodeError> {
        let now = self.clock.now_ms();
        if !fresh
            && self.scheduler.kind() != "none"
            && let Some((s, at)) = self.st().drain_cache.clone()
            && now - at < 15_000
        {
            return Ok(s);
        }
        let s = self.scheduler.state().await?;
        self.st().drain_cache = Some((s.clone(), now));
        Ok(s)
    }

    /// One telemetry sample of the node.
    pub async fn telemetry(&self) -> Result<Telemetry, Refusal> {
        let (gpus, mut node) = self.backend.sample().map_err(backend_refusal)?;
        match self.drain_state(false).await {
            Ok(d) => {
                node.drained = d.drained;
                node.drain_reason = d.reason;
            }
            Err(e) => tracing::warn!(node = %self.opts.node, error = %e, "cannot read drain state"),
        }
        node.hands_off = self.opts.policy.hands_off();
        Ok(Telemetry { node: self.opts.node.clone(), ts_ms: self.clock.now_ms(), gpus, node_metrics: node })
    }

    fn action_status(&self, request_id: &str) -> Value {
        let j = self.jr();
        match j.lookup(request_id) {
            None => json!({"request_id": request_id, "state": "unknown"}),
            Some(e) => {
                let reverted = e.reverted.as_ref().map(|(at, ok, d)| json!({"at_ms": at, "ok": ok, "detail": d}));
                match &e.reply {
                    Some(r) => {
                        json!({"request_id": request_id, "state": "done", "op": e.op, "reply": r, "reverted": reverted})
                    }
                    None => json!({"request_id": request_id, "state": "indeterminate", "op": e.op}),
                }
            }
        }
    }

    fn config_list(&self, name: Option<&str>) -> Result<Value, Refusal> {
        let now = self.clock.now_ms();
        let names = match name {
            Some(n) => vec![n.to_string()],
            None => self.configs.names(),
        };
        let mut out = Vec::new();
        for n in names {
            out.push(self.configs.history(&n, now).map_err(node_refusal)?);
        }
        serde_json::to_value(out).map_err(|e| (ErrorCode::Internal, e.to_string()))
    }

    async fn sim_fault(&self, fault: &SimFault) -> Result<Value, Refusal> {
        if let SimFault::PersonDrain { reason } = fault {
            self.scheduler.person_drain(reason).map_err(node_refusal)?;
            self.st().drain_cache = None;
            return Ok(json!({"injected": "person_drain"}));
        }
        let sim = self.backend.sim().ok_or_else(|| {
            (ErrorCode::BadRequest, format!("sim_fault needs the sim backend: this agent runs {}", self.backend.name()))
        })?;
        sim.inject(fault).map_err(backend_refusal)?;
        Ok(json!({"injected": serde_json::to_value(fault).unwrap_or(Value::Null)}))
    }

    async fn mutate(&self, req: Request) -> Reply {
        let _guard = self.mutate.lock().await;
        let digest = req.digest();
        let op = req.op.name();
        if let Some(e) = self.jr().lookup(&req.id) {
            if e.digest != digest {
                return Reply::err(
                    &req.id,
                    ErrorCode::Conflict,
                    format!("request id {} was already used for a different request ({}); use a new id", req.id, e.op),
                );
            }
            return match &e.reply {
                Some(r) => r.clone(),
                None => Reply::err(
                    &req.id,
                    ErrorCode::Indeterminate,
                    format!(
                        "the agent stopped while applying request {}; it will not apply it again: read the node's state and retry with a new id",
                        req.id
                    ),
                ),
            };
        }
        let now = self.clock.now_ms();
        let reply = match self.decide_and_apply(&req, &digest).await {
            Ok(r) => Reply::ok(&req.id, serde_json::to_value(r).unwrap_or(Value::Null)),
            Err((code, msg)) => Reply::err(&req.id, code, msg),
        };
        if let Err(e) = self.jr().finish(&req.id, &digest, op, now, &reply) {
            tracing::error!(request = %req.id, error = %e, "cannot journal the reply");
        }
        tracing::info!(
            node = %self.opts.node, request = %req.id, op, dry_run = req.dry_run,
            ok = reply.ok, code = reply.code().map(|c| c.as_str()).unwrap_or(""),
            "handled mutating request"
        );
        reply
    }

    async fn decide_and_apply(&self, req: &Request, digest: &str) -> Result<ActionResult, Refusal> {
        if self.opts.policy.hands_off() {
            return Err((
                ErrorCode::HandsOff,
                format!(
                    "node {} is hands-off: the maintenance marker {} exists, so every change is refused; a person removes it when the work is done",
                    self.opts.node,
                    self.opts.policy.hands_off_marker_path.display()
                ),
            ));
        }
        if let Some(secs) = req.revert_after_secs {
            self.opts.policy.check_lease(secs).map_err(|m| (ErrorCode::OutOfEnvelope, m))?;
        }
        let plan = self.plan(&req.op).await?;
        if let Some(why) = plan.not_applicable {
            return Ok(ActionResult {
                outcome: Outcome::NotApplicable,
                before: plan.before,
                after: plan.after,
                detail: Some(why),
                lease: None,
            });
        }
        if let Some(why) = plan.unchanged {
            return Ok(ActionResult {
                outcome: Outcome::Unchanged,
                before: plan.before.clone(),
                after: plan.before,
                detail: Some(why),
                lease: None,
            });
        }
        if req.revert_after_secs.is_some() && plan.revert.is_none() {
            return Err((
                ErrorCode::BadRequest,
                format!("{} cannot be reverted: drop revert_after_secs", req.op.name()),
            ));
        }
        let kind = req.op.kind().unwrap_or(ActionKind::Config);
        let now = self.clock.now_ms();
        self.st().rate.check(&self.opts.policy, kind, plan.gpu, now).map_err(|m| (ErrorCode::RateLimited, m))?;
        if req.dry_run {
            return Ok(ActionResult {
                outcome: Outcome::DryRun,
                before: plan.before,
                after: plan.after,
                detail: Some("dry run: every check passed; nothing was changed".into()),
                lease: None,
            });
        }
        self.jr()
            .begin(&req.id, digest, req.op.name(), now)
            .map_err(|e| (ErrorCode::Internal, format!("cannot journal the request before applying it: {e}")))?;
        let after = self.apply(&req.op).await?;
        self.st().rate.record(kind, plan.gpu, now);
        let lease = match (req.revert_after_secs, plan.revert) {
            (Some(secs), Some(revert)) => {
                let due_ms = now + secs as i64 * 1000;
                self.add_lease(Lease { request_id: req.id.clone(), due_ms, revert });
                Some(LeaseInfo { revert_at_ms: due_ms })
            }
            _ => None,
        };
        Ok(ActionResult { outcome: Outcome::Applied, before: plan.before, after, detail: None, lease })
    }

    fn gpu_sample(&self, gpu: u32) -> Result<GpuTelemetry, Refusal> {
        self.backend.gpu(gpu).map_err(backend_refusal)?;
        let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
        gpus.into_iter()
            .find(|g| g.index == gpu)
            .ok_or_else(|| (ErrorCode::BackendError, format!("GPU {gpu} missing from the sample")))
    }

    async fn plan(&self, op: &Op) -> Result<Plan, Refusal> {
        let policy = &self.opts.policy;
        let env = |m: String| (ErrorCode::OutOfEnvelope, m);
        match op {
            Op::SetPowerLimit(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                policy.check_power(&info, a.watts).map_err(env)?;
                let cur = self.gpu_sample(a.gpu)?.power_limit_watts;
                let mut p =
                    Plan::new(Some(a.gpu), json!({"power_limit_watts": cur}), json!({"power_limit_watts": a.watts}));
                if (cur - a.watts).abs() < 0.5 {
                    p.unchanged = Some(format!("power limit already {} W", fmt_num(cur)));
                }
                p.revert = Some(Revert::PowerLimit { gpu: a.gpu, watts: cur });
                Ok(p)
            }
            Op::SetFanCurve(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                let cur = self.st().fan_curves.get(&a.gpu).cloned();
                let mut p = Plan::new(Some(a.gpu), json!({"fan_curve": cur}), json!({"fan_curve": a.points}));
                if !info.fan_control {
                    p.not_applicable =
                        Some(format!("GPU {} ({}) has no controllable fan: fan curves do not apply", a.gpu, info.name));
                    return Ok(p);
                }
                policy.check_fan_curve(&info, &a.points).map_err(env)?;
                if cur.as_ref() == Some(&a.points) {
                    p.unchanged = Some("this fan curve is already active".into());
                }
                p.revert = Some(Revert::FanCurve { gpu: a.gpu, curve: cur });
                Ok(p)
            }
            Op::ResetFan(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                let cur = self.st().fan_curves.get(&a.gpu).cloned();
                let mut p = Plan::new(Some(a.gpu), json!({"fan_curve": cur}), json!({"fan_curve": null}));
                if !info.fan_control {
                    p.not_applicable = Some(format!("GPU {} ({}) has no controllable fan", a.gpu, info.name));
                } else if cur.is_none() {
                    p.unchanged = Some("the fan is already under firmware control".into());
                }
                p.revert = Some(Revert::FanCurve { gpu: a.gpu, curve: cur });
                Ok(p)
            }
            Op::SetClocks(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                policy.check_clocks(&info, a.min_mhz, a.max_mhz).map_err(env)?;
                let cur = self.st().clocks.get(&a.gpu).copied();
                let mut p = Plan::new(
                    Some(a.gpu),
                    json!({"clocks_locked_mhz": cur}),
                    json!({"clocks_locked_mhz": [a.min_mhz, a.max_mhz]}),
                );
                if cur == Some((a.min_mhz, a.max_mhz)) {
                    p.unchanged = Some("clocks already locked to this range".into());
                }
                p.revert = Some(Revert::Clocks { gpu: a.gpu, locked: cur });
                Ok(p)
            }
            Op::ResetClocks(a) => {
                self.backend.gpu(a.gpu).map_err(backend_refusal)?;
                let cur = self.st().clocks.get(&a.gpu).copied();
                let mut p =
                    Plan::new(Some(a.gpu), json!({"clocks_locked_mhz": cur}), json!({"clocks_locked_mhz": null}));
                if cur.is_none() {
                    p.unchanged = Some("clocks are not locked".into());
                }
                p.revert = Some(Revert::Clocks { gpu: a.gpu, locked: cur });
                Ok(p)
            }
            Op::ClearEcc(a) => {
                let g = self.gpu_sample(a.gpu)?;
                Ok(Plan::new(
                    Some(a.gpu),
                    json!({"ecc_sbe_total": g.ecc_sbe_total, "ecc_dbe_total": g.ecc_dbe_total}),
                    json!({"ecc_sbe_total": 0, "ecc_dbe_total": 0}),
                ))
            }
            Op::SetGpuDrain(a) => {
                let g = self.gpu_sample(a.gpu)?;
                let mut p =
                    Plan::new(Some(a.gpu), json!({"gpu_drained": g.gpu_drained}), json!({"gpu_drained": a.drained}));
                if g.gpu_drained == a.drained {
                    p.unchanged = Some(format!("GPU {} drain state already {}", a.gpu, a.drained));
                }
                p.revert = Some(Revert::GpuDrain { gpu: a.gpu, drained: g.gpu_drained });
                Ok(p)
            }
            Op::Drain(a) => {
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                let reason = self.drain_reason(a);
                let mut p = Plan::new(
                    None,
                    json!({"drained": st.drained, "reason": st.reason}),
                    json!({"drained": true, "reason": reason}),
                );
                if st.drained {
                    p.unchanged = Some(if owned_by_nightshift(st.reason.as_deref()) {
                        "already drained by nightshift".to_string()
                    } else {
                        format!(
                            "already drained by someone else (reason: {:?}); left as it is",
                            st.reason.as_deref().unwrap_or("")
                        )
                    });
                }
                p.revert = Some(Revert::NodeResume { reason });
                Ok(p)
            }
            Op::Resume(_) => {
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                let mut p = Plan::new(
                    None,
                    json!({"drained": st.drained, "reason": st.reason}),
                    json!({"drained": false, "reason": null}),
                );
                if !st.drained {
                    p.unchanged = Some("node is not drained".into());
                } else if !owned_by_nightshift(st.reason.as_deref()) {
                    return Err((
                        ErrorCode::NotOwner,
                        format!(
                            "node {} was drained by someone else (reason: {:?}); nightshift only resumes nodes it drained",
                            self.opts.node,
                            st.reason.as_deref().unwrap_or("")
                        ),
                    ));
                }
                Ok(p)
            }
            Op::FlushCaches(a) => {
                let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
                let frag: Vec<Option<f64>> = gpus.iter().map(|g| g.mem_fragmentation_pct).collect();
                Ok(Plan::new(
                    None,
                    json!({"mem_fragmentation_pct": frag}),
                    json!({"drop_page_cache": a.drop_page_cache, "signal_processes": a.signal_processes}),
                ))
            }
            Op::ConfigApply(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                let mut p = Plan::new(
                    None,
                    json!({"name": a.name, "current_version": h.current}),
                    json!({"name": a.name, "current_version": h.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1}),
                );
                if self.configs.is_current(&h, &a.content) {
                    p.unchanged = Some(format!("`{}` already has this content", a.name));
                }
                p.revert = h.current.map(|v| Revert::Config { name: a.name.clone(), version: v });
                Ok(p)
            }
            Op::ConfigRollback(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                let target = self.configs.rollback_target(&h, a.to_version).map_err(node_refusal)?;
                let mut p = Plan::new(
                    None,
                    json!({"name": a.name, "current_version": h.current}),
                    json!({"name": a.name, "current_version": target}),
                );
                if h.current == Some(target) {
                    p.unchanged = Some(format!("`{}` is already at version {target}", a.name));
                }
                p.revert = h.current.map(|v| Revert::Config { name: a.name.clone(), version: v });
                Ok(p)
            }
            Op::ConfigMark(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                self.configs.rollback_target(&h, Some(a.version)).map_err(node_refusal)?;
                let cur = h.versions.iter().find(|v| v.version == a.version).and_then(|v| v.good);
                let mut p = Plan::new(
                    None,
                    json!({"name": a.name, "version": a.version, "good": cur}),
                    json!({"name": a.name, "version": a.version, "good": a.good}),
                );
                if cur == Some(a.good) {
                    p.unchanged = Some(format!(
                        "version {} is already marked {}",
                        a.version,
                        if a.good { "good" } else { "bad" }
                    ));
                }
                Ok(p)
            }
            other => Err((ErrorCode::Internal, format!("{} is not a mutating op", other.name()))),
        }
    }

    fn drain_reason(&self, a: &DrainArgs) -> String {
        let clean = |s: &str| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
        let mut r =
            format!("{OWNER_PREFIX} {} {}", clean(a.run.as_deref().unwrap_or("manual")), clean(a.reason.trim()));
        r.truncate(r.char_indices().nth(200).map_or(r.len(), |(i, _)| i));
        r
    }

    fn support(&self, s: Support<()>) -> Result<(), Refusal> {
        match s {
            Support::Done(()) => Ok(()),
            Support::NotSupported(why) => Err((ErrorCode::BackendError, why)),
        }
    }

    async fn apply(&self, op: &Op) -> Result<Value, Refusal> {
        let now = self.clock.now_ms();
        match op {
            Op::SetPowerLimit(a) => {
                self.support(self.backend.set_power_limit(a.gpu, a.watts).map_err(backend_refusal)?)?;
                Ok(json!({"power_limit_watts": self.gpu_sample(a.gpu)?.power_limit_watts}))
            }
            Op::SetFanCurve(a) => {
                self.st().fan_curves.insert(a.gpu, a.points.clone());
                self.run_fan_curve(a.gpu, &a.points)?;
                Ok(json!({"fan_curve": a.points}))
            }
            Op::ResetFan(a) => {
                self.support(self.backend.reset_fan(a.gpu).map_err(backend_refusal)?)?;
                self.st().fan_curves.remove(&a.gpu);
                Ok(json!({"fan_curve": null}))
            }
            Op::SetClocks(a) => {
                self.support(self.backend.set_clocks(a.gpu, a.min_mhz, a.max_mhz).map_err(backend_refusal)?)?;
                self.st().clocks.insert(a.gpu, (a.min_mhz, a.max_mhz));
                Ok(json!({"clocks_locked_mhz": [a.min_mhz, a.max_mhz]}))
            }
            Op::ResetClocks(a) => {
                self.support(self.backend.reset_clocks(a.gpu).map_err(backend_refusal)?)?;
                self.st().clocks.remove(&a.gpu);
                Ok(json!({"clocks_locked_mhz": null}))
            }
            Op::ClearEcc(a) => {
                self.support(self.backend.clear_ecc(a.gpu).map_err(backend_refusal)?)?;
                let g = self.gpu_sample(a.gpu)?;
                Ok(json!({"ecc_sbe_total": g.ecc_sbe_total, "ecc_dbe_total": g.ecc_dbe_total}))
            }
            Op::SetGpuDrain(a) => {
                self.support(self.backend.set_gpu_drain(a.gpu, a.drained).map_err(backend_refusal)?)?;
                Ok(json!({"gpu_drained": self.gpu_sample(a.gpu)?.gpu_drained}))
            }
            Op::Drain(a) => {
                let reason = self.drain_reason(a);
                self.scheduler.drain(&reason).await.map_err(node_refusal)?;
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                Ok(json!({"drained": st.drained, "reason": st.reason}))
            }
            Op::Resume(_) => {
                self.scheduler.resume().await.map_err(node_refusal)?;
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                Ok(json!({"drained": st.drained, "reason": st.reason}))
            }
            Op::FlushCaches(a) => {
                let report =
                    self.opts.flush.flush(a.drop_page_cache, a.signal_processes).await.map_err(node_refusal)?;
                self.backend.on_caches_flushed();
                let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
                let frag: Vec<Option<f64>> = gpus.iter().map(|g| g.mem_fragmentation_pct).collect();
                Ok(json!({
                    "page_cache_dropped": report.page_cache_dropped,
                    "signalled_pids": report.signalled_pids,
                    "stale_registrations_removed": report.stale_registrations_removed,
                    "mem_fragmentation_pct": frag,
                }))
            }
            Op::ConfigApply(a) => {
                let h = self.configs.apply(&a.name, &a.content, a.note.clone(), now).map_err(node_refusal)?;
                self.backend.on_config_applied(&a.name, &a.content);
                Ok(json!({"name": a.name, "current_version": h.current}))
            }
            Op::ConfigRollback(a) => {
                let h0 = self.configs.history(&a.name, now).map_err(node_refusal)?;
                let target = self.configs.rollback_target(&h0, a.to_version).map_err(node_refusal)?;
                let (h, content) = self.configs.rollback(&a.name, target, now).map_err(node_refusal)?;
                self.backend.on_config_applied(&a.name, &content);
                Ok(json!({"name": a.name, "current_version": h.current}))
            }
            Op::ConfigMark(a) => {
                let h = self.configs.mark(&a.name, a.version, a.good, now).map_err(node_refusal)?;
                Ok(json!({"name": a.name, "version": a.version, "good": a.good, "last_good": h.last_good}))
            }
            other => Err((ErrorCode::Internal, format!("{} is not a mutating op", other.name()))),
        }
    }

    fn run_fan_curve(&self, gpu: u32, points: &[FanPoint]) -> Result<(), Refusal> {
        let temp = self.gpu_sample(gpu)?.temperature_c;
        let speed = fan_curve_speed(points, temp).max(self.opts.policy.fan.min_pct);
        self.support(self.backend.set_fan_speed(gpu, speed).map_err(backend_refusal)?)
    }

    fn add_lease(&self, lease: Lease) {
        let mut st = self.st();
        st.leases.push(lease);
        self.save_leases(&st.leases);
    }

    fn save_leases(&self, leases: &[Lease]) {
        let bytes = serde_json::to_vec_pretty(leases).unwrap_or_default();
        if let Err(e) = nightshift_proto::fsutil::write_atomic(&self.opts.state_dir.join("leases.json"), &bytes) {
            tracing::error!(error = %e, "cannot persist leases");
        }
    }

    /// Pending leases: (request id, due time).
    pub fn leases(&self) -> Vec<(String, i64)> {
        self.st().leases.iter().map(|l| (l.request_id.clone(), l.due_ms)).collect()
    }

    /// Periodic work: carry out due leases and drive fan curves. Call it a
    /// few times a second (the server does); scenario tests call it each
    /// virtual tick.
    pub async fn tick(&self) {
        let now = self.clock.now_ms();
        let due: Vec<Lease> = {
            let mut st = self.st();
            if !st.leases.iter().any(|l| l.due_ms <= now) {
                Vec::new()
            } else {
                let (due, keep): (Vec<Lease>, Vec<Lease>) = st.leases.drain(..).partition(|l| l.due_ms <= now);
                st.leases = keep;
                self.save_leases(&st.leases);
                due
            }
        };
        for lease in due {
            let _guard = self.mutate.lock().await;
            let result = self.revert(&lease.revert).await;
            let (ok, detail) = match &result {
                Ok(d) => (true, d.clone()),
                Err((_, m)) => (false, m.clone()),
            };
            tracing::info!(node = %self.opts.node, request = %lease.request_id, ok, detail = %detail, "lease reverted");
            if let Err(e) = self.jr().reverted(&lease.request_id, now, ok, &detail) {
                tracing::error!(error = %e, "cannot journal a lease revert");
            }
        }
        let curves: Vec<(u32, Vec<FanPoint>)> = self.st().fan_curves.iter().map(|(g, c)| (*g, c.clone())).collect();
        for (gpu, curve) in curves {
            if let Err((_, m)) = self.run_fan_curve(gpu, &curve) {
                tracing::warn!(node = %self.opts.node, gpu, error = %m, "fan curve step failed");
            }
        }
    }

    async fn revert(&self, r: &Revert) -> Result<String, Refusal> {
        let now = self.clock.now_ms();
        match r {
            Revert::PowerLimit { gpu, watts } => {
                self.support(self.backend.set_power_limit(*gpu, *watts).map_err(backend_refusal)?)?;
                Ok(format!("GPU {gpu} power limit back to {} W", fmt_num(*watts)))
            }
            Revert::FanCurve { gpu, curve } => {
                match curve {
                    Some(c) => {
                        self.st().fan_curves.insert(*gpu, c.clone());
                        self.run_fan_curve(*gpu, c)?;
                    }
                    None => {
                        self.support(self.backend.reset_fan(*gpu).map_err(backend_refusal)?)?;
                        self.st().fan_curves.remove(gpu);
                    }
                }
                Ok(format!("GPU {gpu} fan curve restored"))
            }
            Revert::Clocks { gpu, locked } => {
                match locked {
                    Some((lo, hi)) => {
                        self.support(self.backend.set_clocks(*gpu, *lo, *hi).map_err(backend_refusal)?)?;
                        self.st().clocks.insert(*gpu, (*lo, *hi));
                    }
                    None => {
                        self.support(self.backend.reset_clocks(*gpu).map_err(backend_refusal)?)?;
                        self.st().clocks.remove(gpu);
                    }
                }
                Ok(format!("GPU {gpu} clocks restored"))
            }
            Revert::GpuDrain { gpu, drained } => {
                self.support(self.backend.set_gpu_drain(*gpu, *drained).map_err(backend_refusal)?)?;
                Ok(format!("GPU {gpu} drain state back to {drained}"))
            }
            Revert::NodeResume { reason } => {
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                if st.drained && st.reason.as_deref() == Some(reason.as_str()) {
                    self.scheduler.resume().await.map_err(node_refusal)?;
                    self.drain_state(true).await.map_err(node_refusal)?;
                    Ok("node resumed".into())
                } else {
                    Ok("node drain no longer ours; left as it is".into())
                }
            }
            Revert::Config { name, version } => {
                let (_, content) = self.configs.rollback(name, *version, now).map_err(node_refusal)?;
                self.backend.on_config_applied(name, &content);
                Ok(format!("`{name}` back to version {version}"))
            }
        }
    }
}
