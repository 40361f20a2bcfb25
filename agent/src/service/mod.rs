//! The agent's request handling, independent of transport: the SSH server
//! and in-process callers (the simulated fleet) both come through [`Agent`].
//!
//! Every setting the agent changes is a *hold* (see [`crate::holds`]). A
//! mutating request goes: idempotency (journal) → hands-off marker → what
//! the op means ([`ops`]) → lease bounds → envelope → the effective value
//! before and after → rate limit (only when the device value changes) → dry
//! run → journal `pending` and the hold, one line of the state log, synced
//! → device written ([`settings`]) → the reply and the value now applied,
//! one line (written, synced with the next) → reply. One `fdatasync` per
//! change (see [`crate::statelog`]).
//!
//! On its own clock ([`Agent::tick`]) the agent releases holds whose lease
//! ran out (never while the hands-off marker exists), finishes a change an
//! agent crash interrupted, and drives the fan curves it holds.

mod ops;
mod settings;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::*;

use crate::backend::{Backend, BackendError, Support};
use crate::envelope::Policy;
use crate::holds::{HoldStore, same_value};
use crate::journal::{Journal, JournalLine};
use crate::statelog::StateLog;

/// How far back telemetry reports ended holds (the engine audits each once).
pub const ENDED_REPORTED_MS: i64 = 10 * 60 * 1000;
use crate::node::NodeError;
use crate::node::caches::FlushConfig;
use crate::node::configs::{ConfigStore, ManagedConfig};
use crate::node::scheduler::{DrainState, Scheduler, SchedulerConfig};
use crate::procs::ProcError;
use ops::{Intent, OneShot, Placement};

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
    /// Where jobs write their readings (see `node::jobfile`).
    pub job_metrics_dir: Option<PathBuf>,
    /// Job files older than this are ignored.
    pub job_metrics_max_age_secs: u64,
    /// The state dir was used before (what says so: its host key): its
    /// state log must be there, unless `new_state`.
    pub used_before: Option<String>,
    /// Start with no holds even where `used_before` (`--new-state`).
    pub new_state: bool,
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
            job_metrics_dir: None,
            job_metrics_max_age_secs: 120,
            used_before: None,
            new_state: false,
        }
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

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The setting a hold op is about (for the shape of its before/after).
fn setting_of(op: &Op) -> Setting {
    match op {
        Op::SetPowerLimit(a) => Setting::PowerLimit { gpu: a.gpu },
        Op::SetFanCurve(a) => Setting::FanCurve { gpu: a.gpu },
        Op::ResetFan(a) => Setting::FanCurve { gpu: a.gpu },
        Op::SetClocks(a) => Setting::Clocks { gpu: a.gpu },
        Op::ResetClocks(a) => Setting::Clocks { gpu: a.gpu },
        Op::SetGpuDrain(a) => Setting::GpuDrain { gpu: a.gpu },
        Op::ConfigApply(a) => Setting::Config { name: a.name.clone() },
        Op::ConfigRollback(a) => Setting::Config { name: a.name.clone() },
        _ => Setting::NodeDrain {},
    }
}

/// The owner a request acts for: its `owner`, else `manual`.
fn owner_of(req: &Request) -> String {
    req.owner.clone().unwrap_or_else(|| "manual".into())
}

/// Whether an owner is a person (may release sticky holds).
fn is_person(owner: &str) -> bool {
    owner.starts_with("person:")
}

/// The agent.
pub struct Agent {
    opts: AgentOptions,
    backend: Arc<dyn Backend>,
    clock: SharedClock,
    scheduler: Scheduler,
    configs: ConfigStore,
    journal: Mutex<Journal>,
    store: Mutex<HoldStore>,
    /// Where both (and the leader term) are made durable. Locked before
    /// either of them.
    log: Mutex<StateLog>,
    drain_cache: Mutex<Option<(DrainState, i64)>>,
    /// When managed config files were last checked for hand edits.
    config_scan_ms: Mutex<i64>,
    /// One mutation at a time (requests, expiries, reconciliation).
    mutate: tokio::sync::Mutex<()>,
    /// Host CPU from /proc.
    host: crate::node::host::HostStats,
    /// The highest engine leader term seen (kept in the state log).
    leader_term: Mutex<u64>,
    /// The last health check, and each GPU's double-bit ECC count then.
    last_health: Mutex<Option<(HealthCheck, Vec<u64>)>>,
    /// The state log's last write failed: what failed (cleared by the next
    /// write that succeeds). Telemetry and `/metrics` report it.
    degraded: Mutex<Option<String>>,
    /// Stopped ([`Agent::close`]): refuses requests, its loops do nothing,
    /// and another agent may have its state dir.
    closed: std::sync::atomic::AtomicBool,
    /// When held settings were last read back from the device (`None`:
    /// not since the start).
    readback_ms: Mutex<Option<i64>>,
}

/// How often held GPU settings are read back from the device.
pub const READBACK_MS: i64 = 60_000;

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("node", &self.opts.node).field("backend", &self.backend.name()).finish()
    }
}

/// An agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot create the state dir {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    State(#[from] crate::statelog::StateError),
    #[error("{0}")]
    Config(String),
}

impl Agent {
    /// Build an agent. Replays the state log in the state dir, so request
    /// ids, holds, baselines, leases, rate-limit windows and the leader term
    /// survive restarts.
    pub fn new(opts: AgentOptions, backend: Arc<dyn Backend>, clock: SharedClock) -> Result<Agent, AgentError> {
        std::fs::create_dir_all(&opts.state_dir)
            .map_err(|source| AgentError::StateDir { path: opts.state_dir.clone(), source })?;
        opts.flush.signal().map_err(AgentError::Config)?;
        for (name, m) in &opts.configs {
            m.check().map_err(|e| AgentError::Config(format!("configs.{name}: {e}")))?;
        }
        let (log, state) = StateLog::open_checked(&opts.state_dir, opts.used_before.as_deref(), opts.new_state)?;
        let scheduler = Scheduler::new(opts.scheduler.clone(), &opts.node, opts.state_dir.join("node-drain.json"));
        let configs = ConfigStore::new(opts.state_dir.join("configs"), opts.configs.clone());
        Ok(Agent {
            opts,
            backend,
            clock,
            scheduler,
            configs,
            journal: Mutex::new(state.journal),
            store: Mutex::new(state.holds),
            log: Mutex::new(log),
            drain_cache: Mutex::new(None),
            config_scan_ms: Mutex::new(i64::MIN),
            mutate: tokio::sync::Mutex::new(()),
            host: crate::node::host::HostStats::default(),
            // The highest leader term seen survives restarts: a deposed
            // engine stays refused.
            leader_term: Mutex::new(state.term),
            last_health: Mutex::new(None),
            degraded: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
            readback_ms: Mutex::new(None),
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

    /// Where the state log lives.
    pub fn state_log_path(&self) -> PathBuf {
        self.opts.state_dir.join(crate::statelog::LOG_FILE)
    }

    /// Every journal line in the state log, oldest first (for tests and
    /// people).
    pub fn journal_lines(&self) -> Vec<JournalLine> {
        let _log = self.state_log();
        StateLog::journal_lines(&self.opts.state_dir).unwrap_or_default()
    }

    /// `fdatasync` calls on the state log since the agent started.
    pub fn state_syncs(&self) -> u64 {
        self.state_log().syncs()
    }

    /// Stop this agent for good within a process that goes on (a restart
    /// in tests or the simulator; a real agent stops by exiting): it
    /// refuses every request from now on, its loops do nothing, and its
    /// state dir's lock is let go so that the agent replacing it can start.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.state_log().unlock();
    }

    fn state_log(&self) -> std::sync::MutexGuard<'_, StateLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HoldStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn jr(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every held setting, with its baseline and holds.
    /// The holds that ended lately, oldest first (what telemetry reports).
    pub fn ended_holds(&self) -> Vec<EndedHold> {
        self.holds().ended_since(i64::MIN, usize::MAX)
    }

    pub fn held(&self) -> Vec<SettingView> {
        self.holds().held().iter().map(|h| h.view()).collect()
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
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Reply::err(&id, ErrorCode::Internal, "this agent has stopped: ask the one that replaced it");
        }
        // A new leader announces its term with one read, of the holds,
        // before it acts (`Core::announce_term`, and on every new
        // connection and before its first change to a node): from then on
        // the term before is refused here, reached by the new leader or
        // not. Only that announce records a term: changes, dry runs and
        // other reads — inventory, telemetry, what a monitoring tool with
        // the engine's key sends — never move it. (A read from a stale term
        // is still answered: reads change nothing.)
        if req.term.is_some()
            && !req.op.is_mutating()
            && let Err((ErrorCode::Internal, m)) = self.check_term(req.term, matches!(req.op, Op::Holds(_)))
        {
            tracing::error!(node = %self.opts.node, error = %m, "cannot record a leader's term");
        }
        let result = match &req.op {
            Op::Inventory(_) => Ok(to_value(&self.inventory())),
            Op::Telemetry(_) => self.telemetry().await.map(|t| to_value(&t)),
            Op::Subscribe(_) => Err((
                ErrorCode::BadRequest,
                "subscribe is a stream: send it as its own exec and read JSON lines".into(),
            )),
            Op::ActionStatus(a) => Ok(self.action_status(&a.request_id)),
            Op::ConfigList(a) => self.config_list(a.name.as_deref()),
            Op::Holds(_) => Ok(to_value(&self.held())),
            Op::HealthCheck(a) => self.health_check(a.gpu).await.map(|h| to_value(&h)),
            Op::CollectEvidence(a) => self.collect_evidence(a).await.map(|c| to_value(&c)),
            Op::ReadEvidence(a) => {
                let p = &self.opts.policy.evidence;
                let root = p.dir.clone().unwrap_or_else(|| self.opts.state_dir.join("evidence"));
                crate::evidence::read(&root, a).map(|c| to_value(&c)).map_err(|e| match e {
                    crate::evidence::ReadError::BadName(m) => (ErrorCode::BadRequest, m),
                    crate::evidence::ReadError::NotFound(m) => (ErrorCode::NotFound, m),
                })
            }
            Op::SchedulerPending(a) => self.pending(a.partition.as_deref()).await.map(|p| to_value(&p)),
            _ => return self.mutate(req).await,
        };
        match result {
            Ok(v) => Reply::ok(id, v),
            Err((code, msg)) => Reply::err(id, code, msg),
        }
    }

    /// The work waiting in the scheduler's queue: the real scheduler's
    /// (Slurm), else the simulator's, else unknown.
    pub async fn pending(&self, partition: Option<&str>) -> Result<nightshift_proto::PendingWork, Refusal> {
        let read = self.scheduler.pending(partition).await.map_err(node_refusal)?;
        let (jobs, gpus, scheduler) = match read {
            Some((j, g)) => (Some(j), Some(g), self.scheduler.kind().to_string()),
            None => match self.backend.pending_jobs() {
                Some(j) => (Some(j), None, format!("{} backend's", self.backend.name())),
                None => (None, None, self.scheduler.kind().to_string()),
            },
        };
        Ok(nightshift_proto::PendingWork { scheduler, partition: partition.map(str::to_string), jobs, gpus })
    }

    /// Gather the vendor's RMA evidence and the last health check into a
    /// hashed bundle on the node ([`crate::evidence`]). Refused for a GPU
    /// the node does not have; a missing or failing tool is recorded in the
    /// bundle, not a refusal.
    pub async fn collect_evidence(
        &self,
        a: &nightshift_proto::CollectEvidenceArgs,
    ) -> Result<nightshift_proto::EvidenceCollected, Refusal> {
        let gpus = self.backend.gpus();
        if let Some(g) = a.gpu
            && !gpus.iter().any(|x| x.index == g)
        {
            return Err((ErrorCode::BadRequest, format!("gpu {g}: expected one of the node's {} GPUs", gpus.len())));
        }
        let p = &self.opts.policy.evidence;
        let root = p.dir.clone().unwrap_or_else(|| self.opts.state_dir.join("evidence"));
        let last_health = self.last_health.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(h, _)| to_value(h));
        let req = crate::evidence::Request {
            node: &self.opts.node,
            gpu: a.gpu,
            reason: &a.reason,
            vendor: gpus.first().map_or(nightshift_proto::Vendor::Nvidia, |g| g.vendor),
            now_ms: self.clock.now_ms(),
            last_health,
        };
        let got = crate::evidence::collect(p, &root, req).await.map_err(|e| (ErrorCode::BackendError, e))?;
        tracing::info!(node = %self.opts.node, bundle = %got.bundle.id, sha256 = %got.sha256, files = got.bundle.files.len(), why = %a.reason, "collected RMA evidence");
        Ok(got)
    }

    /// The node's inventory.
    /// The jobs' own series for the exporter, labelled with this node's
    /// name by the agent (see `node::jobfile::exported_series`); empty
    /// without a `job_metrics_dir`.
    pub fn job_series(&self) -> String {
        let Some(dir) = &self.opts.job_metrics_dir else { return String::new() };
        crate::node::jobfile::exported_series(
            dir,
            std::time::Duration::from_secs(self.opts.job_metrics_max_age_secs),
            std::time::SystemTime::now(),
            &self.opts.node,
        )
    }

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
            driver_version: self.backend.driver_version(),
            chassis_fan_control: self.opts.policy.bmc.is_some() || self.backend.chassis_fans_full().is_some(),
        }
    }

    /// Is the node fit to take work? Every GPU (or `only`): visible to the
    /// backend, no row-remap failure or pending remap, no double-bit ECC
    /// error since its last reset nor a rise since the last check, its PCIe
    /// link at full width and generation, no fatal XID since its last reset;
    /// NVLink links up; `dcgmi diag -r 1` where DCGM is installed. What the
    /// backend cannot read is left out of `checked`, not counted as passed.
    pub async fn health_check(&self, only: Option<u32>) -> Result<HealthCheck, Refusal> {
        if let Some(g) = only {
            self.backend.gpu(g).map_err(backend_refusal)?;
        }
        let (gpus, node) = self.backend.sample().map_err(backend_refusal)?;
        let now = self.clock.now_ms();
        let prev_dbe: Vec<u64> = self
            .last_health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|x| x.1.clone())
            .unwrap_or_default();
        let mut out = HealthCheck { ok: true, at_ms: now, gpus: Vec::new(), node_failures: Vec::new(), dcgm: None };
        for g in gpus.iter().filter(|g| only.is_none_or(|o| o == g.index)) {
            let mut c = GpuCheck { index: g.index, ok: true, failures: Vec::new(), checked: vec!["visible".into()] };
            if g.lost {
                c.failures.push(format!(
                    "not visible to the backend ({})",
                    g.lost_detail.as_deref().unwrap_or("it does not answer")
                ));
            } else {
                if let (Some(fail), Some(pending)) = (g.row_remap_failure, g.row_remap_pending) {
                    c.checked.push("row_remap".into());
                    if fail {
                        c.failures.push("a row remap failed (no spare row left): the GPU needs an RMA".into());
                    } else if pending {
                        c.failures.push("a row remap is pending: reset the GPU to activate it".into());
                    }
                }
                c.checked.push("ecc".into());
                if g.ecc_dbe_total > 0 {
                    c.failures.push(format!("{} double-bit ECC error(s) since its last reset", g.ecc_dbe_total));
                }
                if let Some(before) = prev_dbe.get(g.index as usize)
                    && g.ecc_dbe_total > *before
                {
                    c.failures.push(format!(
                        "double-bit ECC errors rose from {before} to {} since the last check",
                        g.ecc_dbe_total
                    ));
                }
                if let Some(l) = self.backend.pcie_link(g.index) {
                    c.checked.push("pcie_link".into());
                    if l.width < l.max_width || l.generation < l.max_generation {
                        c.failures.push(format!(
                            "PCIe link at x{} gen {} (expected x{} gen {})",
                            l.width, l.generation, l.max_width, l.max_generation
                        ));
                    }
                }
            }
            if self.backend.sim().is_some() || self.backend.name() == "nvml" {
                c.checked.push("recent_xid".into());
                if let Some(x) = self.backend.fatal_xid_since_reset(g.index) {
                    c.failures.push(format!("fatal XID {x} since its last reset"));
                }
            }
            c.ok = c.failures.is_empty();
            out.ok &= c.ok;
            out.gpus.push(c);
        }
        if let (Some(up), Some(total)) = (node.nvlink_links_up, node.nvlink_links_total)
            && up < total
        {
            out.node_failures.push(format!("{} of {total} NVLink links down", total - up));
        }
        if let Some(dcgmi) = self.dcgmi() {
            let argv = vec![dcgmi.display().to_string(), "diag".into(), "-r".into(), "1".into(), "-j".into()];
            let t = std::time::Duration::from_secs(self.opts.policy.health.dcgm_timeout_secs);
            match crate::procs::run(&argv, t).await {
                Ok(o) => match crate::node::dcgm::parse_diag(&o.stdout) {
                    Ok(v) => {
                        if !v.passed {
                            out.node_failures.extend(v.failures.iter().map(|f| format!("dcgmi diag: {f}")));
                        }
                        out.dcgm = Some(if v.passed { "pass".into() } else { "fail".into() });
                    }
                    Err(e) => out.node_failures.push(format!("dcgmi diag: {e}")),
                },
                Err(e) => out.node_failures.push(format!("dcgmi diag -r 1 failed: {e}")),
            }
        }
        out.ok &= out.node_failures.is_empty();
        let dbe: Vec<u64> = gpus.iter().map(|g| g.ecc_dbe_total).collect();
        *self.last_health.lock().unwrap_or_else(|e| e.into_inner()) = Some((out.clone(), dbe));
        tracing::info!(node = %self.opts.node, ok = out.ok, failures = ?out.failures(), "health check");
        Ok(out)
    }

    /// DCGM's CLI, when configured or installed.
    fn dcgmi(&self) -> Option<PathBuf> {
        if self.backend.sim().is_some() {
            return None;
        }
        match &self.opts.policy.health.dcgmi_path {
            Some(p) => Some(p.clone()),
            None => Some(PathBuf::from("/usr/bin/dcgmi")).filter(|p| p.exists()),
        }
    }

    /// A health check that passed at or after `since_ms` and is no older
    /// than the policy's `health.max_age_secs`.
    fn passed_since(&self, since_ms: i64) -> bool {
        let now = self.clock.now_ms();
        let max = self.opts.policy.health.max_age_secs as i64 * 1000;
        self.last_health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|(h, _)| h.ok && h.at_ms >= since_ms && now - h.at_ms <= max)
    }

    /// Before nightshift puts the node back into service: a passing health
    /// check no older than the policy allows (one is run now if needed).
    async fn require_healthy(&self, what: &str) -> Result<(), Refusal> {
        if self.passed_since(i64::MIN) {
            return Ok(());
        }
        let h = self.health_check(None).await?;
        if h.ok {
            return Ok(());
        }
        Err((
            ErrorCode::Unhealthy,
            format!("{} failed its health check, so {what} is refused: {}", self.opts.node, h.failures().join("; ")),
        ))
    }

    async fn drain_state(&self, fresh: bool) -> Result<DrainState, NodeError> {
        let now = self.clock.now_ms();
        let cached = self.drain_cache.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !fresh
            && self.scheduler.kind() != "none"
            && let Some((s, at)) = cached
            && now - at < 15_000
        {
            return Ok(s);
        }
        let s = self.scheduler.state().await?;
        *self.drain_cache.lock().unwrap_or_else(|e| e.into_inner()) = Some((s.clone(), now));
        Ok(s)
    }

    /// One telemetry sample of the node.
    pub async fn telemetry(&self) -> Result<Telemetry, Refusal> {
        let (mut gpus, mut node) = self.backend.sample().map_err(backend_refusal)?;
        if self.backend.sim().is_some() || self.backend.name() == "nvml" {
            for g in gpus.iter_mut() {
                g.reset_required = Some(self.backend.fatal_xid_since_reset(g.index).is_some());
            }
        }
        // Host CPU from /proc where the backend has none (real GPUs).
        if node.cpu_util_pct.is_none() {
            node.cpu_util_pct = self.host.cpu_util_pct();
        }
        // What the jobs on this node say about themselves.
        if let Some(dir) = &self.opts.job_metrics_dir {
            let r = crate::node::jobfile::read_dir(
                dir,
                std::time::Duration::from_secs(self.opts.job_metrics_max_age_secs),
                std::time::SystemTime::now(),
            );
            for (file, line, why) in &r.rejected {
                tracing::debug!(node = %self.opts.node, file = %file.display(), line, why = %why, "job textfile line ignored");
            }
            r.apply(&mut gpus, &mut node);
        }
        match self.drain_state(false).await {
            Ok(d) => {
                node.drained = d.drained;
                node.drain_reason = d.reason;
                let held = self.holds().all_holds();
                for (kind, on) in [(MarkKind::NoPack, d.no_pack), (MarkKind::Quarantine, d.quarantine)] {
                    if on {
                        let ours = held.iter().find(|h| h.setting == Setting::Mark { mark: kind });
                        node.marks.push(NodeMark {
                            mark: kind,
                            ours: ours.is_some(),
                            reason: ours.map(|h| h.reason.clone()),
                        });
                    }
                }
            }
            Err(e) => tracing::warn!(node = %self.opts.node, error = %e, "cannot read drain state"),
        }
        node.hands_off = self.opts.policy.hands_off();
        node.state_degraded = self.state_degraded();
        {
            let store = self.holds();
            node.holds = store.all_holds();
            node.ended_holds = store.ended_since(self.clock.now_ms() - ENDED_REPORTED_MS, 32);
            let since = self.clock.now_ms() - ENDED_REPORTED_MS;
            let owners = |h: &crate::holds::Held| h.holds.iter().map(|x| x.owner.clone()).collect::<Vec<_>>();
            for h in store.held().iter().filter(|h| !h.holds.is_empty()) {
                if let Some(r) = h.reapplied.as_ref().filter(|r| r.at_ms >= since) {
                    node.reapplied.push(nightshift_proto::ReappliedSetting {
                        setting: h.setting.clone(),
                        reapplied: r.clone(),
                        owners: owners(h),
                    });
                }
                if let Some(why) = &h.drifted {
                    node.drifted.push(nightshift_proto::DriftedSetting {
                        setting: h.setting.clone(),
                        why: why.clone(),
                        owners: owners(h),
                    });
                }
            }
        }
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
        Ok(to_value(&out))
    }

    /// Simulated hardware only; journaled like a change.
    async fn sim_fault(&self, fault: &SimFault) -> Result<Value, Refusal> {
        let sim = self.backend.sim().ok_or_else(|| {
            (ErrorCode::BadRequest, format!("sim_fault needs the sim backend: this agent runs {}", self.backend.name()))
        })?;
        if let SimFault::PersonDrain { reason } = fault {
            self.scheduler.person_drain(reason).map_err(node_refusal)?;
            *self.drain_cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(json!({"injected": "person_drain"}));
        }
        if let SimFault::PersonResume {} = fault {
            self.scheduler.person_resume().map_err(node_refusal)?;
            *self.drain_cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(json!({"injected": "person_resume"}));
        }
        sim.inject(fault).map_err(backend_refusal)?;
        Ok(json!({"injected": to_value(fault)}))
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
        // A change is fenced by the term it carries but records none: only
        // the announce path moves the term (a change with a higher one is
        // made, and the leader's announce precedes it).
        let reply = match self.check_term(req.term, false).and_then(|()| check_deadline(req.not_after_ms, now)) {
            Err((code, msg)) => Reply::err(&req.id, code, msg),
            Ok(()) => match self.decide_and_apply(&req, &digest).await {
                Ok(v) => Reply::ok(&req.id, v),
                Err((code, msg)) => Reply::err(&req.id, code, msg),
            },
        };
        // Written before the reply leaves, synced with the next change
        // (see `statelog`): the change itself was durable before it was made.
        if let Err(e) = self.commit(Some(crate::journal::done(&req.id, &digest, op, now, &reply)), false) {
            tracing::error!(request = %req.id, error = %e, "cannot journal the reply");
        }
        tracing::info!(
            node = %self.opts.node, request = %req.id, op, owner = req.owner.as_deref().unwrap_or("manual"),
            dry_run = req.dry_run, ok = reply.ok, code = reply.code().map(|c| c.as_str()).unwrap_or(""),
            "handled mutating request"
        );
        reply
    }

    /// A request from a lower leader term than one already seen comes from
    /// a deposed engine: refused. A higher one is remembered (durably)
    /// before anything it asks is done.
    fn check_term(&self, term: Option<u64>, record: bool) -> Result<(), Refusal> {
        let Some(t) = term else { return Ok(()) };
        let mut seen = self.leader_term.lock().unwrap_or_else(|e| e.into_inner());
        if t < *seen {
            return Err((
                ErrorCode::StaleLeader,
                format!("leader term {t} is stale: this agent has seen term {}; a newer engine leads", *seen),
            ));
        }
        // Terms grow by one per takeover: a jump far past the highest seen
        // is no leader's (one such request would lock every real leader
        // out for good). Refused, nothing recorded.
        let limit = if *seen == 0 { MAX_FIRST_TERM } else { seen.saturating_add(MAX_TERM_STEP) };
        if t > limit {
            return Err((
                ErrorCode::BadRequest,
                format!(
                    "leader term {t} is too far above the highest this agent has seen ({}): expected at most {limit} \
                     (terms grow by one per takeover); refused, and the term is not recorded",
                    *seen
                ),
            ));
        }
        if t > *seen && record {
            // The term alone: a change being made meanwhile is recorded by
            // its own line.
            let entry = crate::statelog::Entry { term: Some(t), ..Default::default() };
            let written = self.state_log().append(&entry, true);
            self.note_durability(&written);
            written.map_err(|e| (ErrorCode::Internal, format!("cannot record leader term {t}: {e}")))?;
            *seen = t;
        }
        Ok(())
    }

    /// Write what changed in the holds, with `journal`, as one line of the
    /// state log (`sync`: durably, one `fdatasync`); compact the log when
    /// it has grown. Called without the holds or journal locked.
    fn commit(&self, journal: Option<JournalLine>, sync: bool) -> std::io::Result<()> {
        let mut log = self.state_log();
        let written = log.commit(&mut self.holds(), journal.clone(), None, sync);
        // Only a durable write says the log works again (a short unsynced
        // line may still fit the last page of a full disk).
        if sync || written.is_err() {
            self.note_durability(&written);
        }
        written?;
        let mut jr = self.jr();
        if let Some(l) = journal {
            jr.apply(l);
        }
        if log.wants_compaction() {
            jr.trim();
            // The log keeps the highest term it holds itself: no other lock
            // is taken under its own (a term being recorded waits for it).
            if let Err(e) = log.compact(&self.holds(), &jr, 0) {
                tracing::error!(node = %self.opts.node, error = %e, "cannot compact the state log; it keeps growing");
            }
        }
        Ok(())
    }

    /// Remember whether the state log's last write worked (what telemetry
    /// reports as `state_degraded`).
    fn note_durability(&self, r: &std::io::Result<()>) {
        let mut d = self.degraded.lock().unwrap_or_else(|e| e.into_inner());
        match r {
            Ok(()) if d.is_some() => {
                tracing::info!(node = %self.opts.node, "the state log takes writes again");
                *d = None;
            }
            Ok(()) => {}
            Err(e) => {
                if d.is_none() {
                    tracing::error!(node = %self.opts.node, error = %e, path = %self.state_log_path().display(),
                        "cannot write the state log: every change is refused until it can");
                }
                *d = Some(format!("cannot write {}: {e}", self.state_log_path().display()));
            }
        }
    }

    /// What the last failed write of the state log said, while it lasts.
    pub fn state_degraded(&self) -> Option<String> {
        self.degraded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Durably mark `req` as being applied, with the holds it changed in
    /// memory, before the device changes.
    fn begin(&self, req: &Request, digest: &str) -> Result<(), Refusal> {
        let line = crate::journal::pending(&req.id, digest, req.op.name(), self.clock.now_ms());
        self.commit(Some(line), true)
            .map_err(|e| (ErrorCode::Internal, format!("cannot record the request and its holds durably: {e}")))
    }

    fn save(&self) -> Result<(), Refusal> {
        self.commit(None, true).map_err(|e| (ErrorCode::Internal, format!("cannot record the holds durably: {e}")))
    }

    fn hands_off_refusal(&self) -> Refusal {
        (
            ErrorCode::HandsOff,
            format!(
                "node {} is hands-off: the maintenance marker {} exists, so every change is refused; a person removes it when the work is done",
                self.opts.node,
                self.opts.policy.hands_off_marker_path.display()
            ),
        )
    }

    async fn decide_and_apply(&self, req: &Request, digest: &str) -> Result<Value, Refusal> {
        if let Op::SimFault(f) = &req.op {
            // Not a change nightshift makes: the world it simulates. Still
            // journaled, so an id is applied once.
            if req.dry_run {
                return Err((ErrorCode::BadRequest, "sim_fault has no dry run".into()));
            }
            self.begin(req, digest)?;
            return self.sim_fault(f).await;
        }
        if self.opts.policy.hands_off() {
            return Err(self.hands_off_refusal());
        }
        let owner = owner_of(req);
        match &req.op {
            Op::Release(a) => return self.release_op(req, digest, a, &owner).await.map(|r| to_value(&r)),
            Op::Renew(a) => return self.renew_op(req, digest, a, &owner),
            // Nothing broken goes back into service: nightshift resumes a
            // node only with a passing health check (a person decides for
            // themselves).
            Op::Resume(_) if !is_person(&owner) && !req.dry_run => {
                self.require_healthy("putting it back into service").await?;
            }
            _ => {}
        }
        let result = match self.intent(&req.op, &owner).await? {
            Intent::Place(p) => self.place(req, digest, p, &owner).await?,
            Intent::Release(ids) => {
                // A lease is for what a request places; a release places
                // nothing, so a lease sent with it (`resume` may do either)
                // is moot.
                let before = self.effective_of_ids(&ids);
                let rel = self.release_ids(req, digest, &ids, &owner).await?;
                let after = rel.settings.first().map(|s| s.now.device_view(&s.setting)).unwrap_or(Value::Null);
                ActionResult {
                    outcome: if req.dry_run { Outcome::DryRun } else { Outcome::Applied },
                    before,
                    after,
                    detail: rel.settings.first().map(|s| s.detail.clone()),
                    lease: None,
                    hold: None,
                    released: Some(rel),
                }
            }
            Intent::Unchanged(now, why) => ActionResult {
                outcome: Outcome::Unchanged,
                before: now.device_view(&setting_of(&req.op)),
                after: now.device_view(&setting_of(&req.op)),
                detail: Some(why),
                lease: None,
                hold: None,
                released: None,
            },
            Intent::NotApplicable(why) => ActionResult {
                outcome: Outcome::NotApplicable,
                before: Value::Null,
                after: Value::Null,
                detail: Some(why),
                lease: None,
                hold: None,
                released: None,
            },
            Intent::OneShot(o) => self.one_shot(req, digest, o).await?,
        };
        Ok(to_value(&result))
    }

    fn effective_of_ids(&self, ids: &[String]) -> Value {
        let store = self.holds();
        store
            .held()
            .iter()
            .find(|h| h.holds.iter().any(|x| ids.contains(&x.id)))
            .map(|h| h.effective().device_view(&h.setting))
            .unwrap_or(Value::Null)
    }

    /// The lease of a new hold: the request's, else the policy default,
    /// within the policy bounds; `None` for a sticky hold.
    fn lease_for(&self, req: &Request, p: &Placement, now: i64) -> Result<Option<i64>, Refusal> {
        if p.sticky {
            if !matches!(p.setting, Setting::NodeDrain {} | Setting::GpuDrain { .. }) {
                return Err((ErrorCode::BadRequest, "only a node or GPU drain may be sticky".into()));
            }
            if req.revert_after_secs.is_some() {
                return Err((
                    ErrorCode::BadRequest,
                    "a sticky drain has no lease: drop revert_after_secs or sticky".into(),
                ));
            }
            return Ok(None);
        }
        let secs = req.revert_after_secs.unwrap_or(self.opts.policy.default_lease_secs);
        self.opts.policy.check_lease(secs).map_err(|m| (ErrorCode::OutOfEnvelope, m))?;
        Ok(Some(now.saturating_add((secs as i64).saturating_mul(1000))))
    }

    /// Place (or replace) `owner`'s hold on a setting and apply the new
    /// effective value when it differs.
    async fn place(&self, req: &Request, digest: &str, p: Placement, owner: &str) -> Result<ActionResult, Refusal> {
        let now = self.clock.now_ms();
        let expires = self.lease_for(req, &p, now)?;
        let mut existing = self.holds().get(&p.setting).cloned();
        // A person changed the setting since the agent applied it: the holds
        // in effect end (the person took the setting over), and the device's
        // value is the baseline for this new hold.
        if let Some(h) = &existing
            && h.drifted.is_none()
            && let Some(dev) = self.read_setting(&p.setting).await?
            && !h.is_own(&dev)
        {
            if !req.dry_run {
                let ids: Vec<String> = h.holds.iter().map(|x| x.id.clone()).collect();
                let mut store = self.holds();
                for gone in store.remove(|x| ids.contains(&x.id)) {
                    store.note_ended(EndedHold {
                        hold: gone,
                        ended_at_ms: now,
                        how: HoldEnd::TakenOver,
                        by: String::new(),
                        outcome: RestoreOutcome::Drifted,
                        now: dev.clone(),
                    });
                }
                store.forget(&p.setting);
                tracing::warn!(
                    node = %self.opts.node, setting = %p.setting, found = %dev, applied = %h.applied,
                    dropped = ?ids, "a person changed a held setting: its holds end, the new value is the baseline"
                );
            }
            existing = None;
        }
        let baseline = match &existing {
            Some(h) => h.baseline.clone(),
            None => self.baseline_of(&p.setting).await?,
        };
        if matches!(p.value, HoldValue::NodeDrain { drained: false, .. }) {
            self.check_in_service(&baseline)?;
        }
        let hold = HoldInfo {
            id: existing
                .as_ref()
                .and_then(|h| h.holds.iter().find(|x| x.owner == owner).map(|x| x.id.clone()))
                .unwrap_or_else(|| req.id.clone()),
            owner: owner.to_string(),
            setting: p.setting.clone(),
            value: p.value.clone(),
            reason: p.reason.clone(),
            placed_at_ms: now,
            expires_at_ms: expires,
            kept: false,
            repair: p.repair,
        };
        let (before, drifted) = match &existing {
            Some(h) => (h.applied.clone(), h.drifted.clone()),
            None => (baseline.clone(), None),
        };
        let mut holds: Vec<HoldInfo> = existing.as_ref().map(|h| h.holds.clone()).unwrap_or_default();
        holds.retain(|x| x.owner != owner);
        holds.push(hold.clone());
        let after = crate::holds::effective(&baseline, &holds);
        let changes = drifted.is_none() && (!same_value(&before, &after) || p.content.is_some());
        let gpu = p.setting.gpu();
        if changes {
            let limit = self.opts.policy.rate_limits.get(&p.kind);
            self.holds().rate_check(p.kind, gpu, limit, now).map_err(|m| (ErrorCode::RateLimited, m))?;
        }
        let lease = expires.map(|t| LeaseInfo { revert_at_ms: t });
        if req.dry_run {
            return Ok(ActionResult {
                outcome: Outcome::DryRun,
                before: before.device_view(&p.setting),
                after: after.device_view(&p.setting),
                detail: Some(if changes {
                    "dry run: every check passed; nothing was changed".into()
                } else {
                    "dry run: every check passed; the hold would not change the device".into()
                }),
                lease,
                hold: Some(hold),
                released: None,
            });
        }
        // The request, the hold, the value about to be written and the rate
        // window are durable before the device changes, in one line: a crash after
        // the write finds the device at `writing` (the agent's own, adopted
        // by `reconcile`), a crash before it is finished by `reconcile`.
        // A save that fails (a full disk) leaves nothing behind, in memory
        // or on the device.
        let before_save = self.holds().snapshot();
        {
            let mut store = self.holds();
            store.place(hold.clone(), baseline);
            if changes {
                if let Some(h) = store.get_mut(&p.setting) {
                    h.writing = Some(after.clone());
                }
                // Counted when tried (a failed write counts too): never
                // under the limit after a crash.
                store.rate_record(p.kind, gpu, now);
            }
        }
        if let Err(e) = self.begin(req, digest) {
            self.holds().restore(before_save);
            return Err(e);
        }
        if changes {
            match self.write_setting(&p.setting, &after, p.content.as_ref()).await {
                Ok(_) => {
                    // Recorded with the reply (not synced on its own): until
                    // it is durable, `writing` says the device's value is
                    // the agent's.
                    let mut store = self.holds();
                    if let Some(h) = store.get_mut(&p.setting) {
                        h.applied = after.clone();
                        h.writing = None;
                    }
                }
                Err(e) => {
                    // The device refused: take the hold back out.
                    let mut store = self.holds();
                    store.remove(|x| x.id == hold.id && x.setting == hold.setting);
                    if let Some(old) = existing.as_ref().and_then(|h| h.holds.iter().find(|x| x.owner == owner)) {
                        store.place(old.clone(), existing.as_ref().map(|h| h.baseline.clone()).unwrap_or(after));
                    }
                    store.forget(&p.setting);
                    if let Some(h) = store.get_mut(&p.setting) {
                        h.writing = None;
                    }
                    drop(store);
                    self.save()?;
                    return Err(e);
                }
            }
        }
        Ok(ActionResult {
            outcome: if changes { Outcome::Applied } else { Outcome::Held },
            before: before.device_view(&p.setting),
            after: if changes { after.device_view(&p.setting) } else { before.device_view(&p.setting) },
            detail: match (&drifted, changes) {
                (Some(d), _) => Some(format!("{}: a person changed it ({d}); the agent leaves it alone", p.setting)),
                (None, false) => {
                    Some(format!("held; {} already decides the device's value", self.deciding(&p.setting)))
                }
                _ => None,
            },
            lease,
            hold: Some(hold),
            released: None,
        })
    }

    /// Which hold decides a setting's value, in words.
    fn deciding(&self, s: &Setting) -> String {
        let store = self.holds();
        let Some(h) = store.get(s) else { return "the baseline".into() };
        let eff = h.effective();
        h.holds
            .iter()
            .find(|x| same_value(&x.value, &eff))
            .map(|x| format!("{}'s hold ({})", x.owner, x.value))
            .unwrap_or_else(|| format!("the baseline ({})", h.baseline))
    }

    /// `release`: by hold id, or the owner's holds.
    async fn release_op(
        &self,
        req: &Request,
        digest: &str,
        a: &ReleaseArgs,
        owner: &str,
    ) -> Result<ReleaseResult, Refusal> {
        let ids: Vec<String> = {
            let store = self.holds();
            let all = store.all_holds();
            match (&a.hold, &a.owner) {
                (Some(id), None) => {
                    let h = all.iter().find(|h| &h.id == id).ok_or_else(|| {
                        (ErrorCode::NotFound, format!("no hold {id} on {}: see the `holds` op", self.opts.node))
                    })?;
                    vec![h.id.clone()]
                }
                (None, Some(o)) => all
                    .iter()
                    .filter(|h| &h.owner == o && (a.include_kept || !h.kept) && !h.sticky())
                    .map(|h| h.id.clone())
                    .collect(),
                _ => {
                    return Err((ErrorCode::BadRequest, "release: expected exactly one of `hold` or `owner`".into()));
                }
            }
        };
        self.release_ids(req, digest, &ids, owner).await
    }

    /// Release the holds `ids` for `releaser` and settle each setting.
    async fn release_ids(
        &self,
        req: &Request,
        digest: &str,
        ids: &[String],
        releaser: &str,
    ) -> Result<ReleaseResult, Refusal> {
        let chosen: Vec<HoldInfo> = self.holds().all_holds().into_iter().filter(|h| ids.contains(&h.id)).collect();
        for h in &chosen {
            if is_person(&h.owner) && !is_person(releaser) && h.owner != releaser {
                return Err((
                    ErrorCode::NotOwner,
                    format!("hold {} belongs to {}: only a person releases a person's hold", h.id, h.owner),
                ));
            }
            if h.sticky() && !is_person(releaser) {
                // A repair drain ends on evidence: its owner may release it
                // once the agent's own health check passed after it was
                // placed. An RMA drain is a person's call alone.
                let repaired = h.repair
                    && h.owner == releaser
                    && (self.passed_since(h.placed_at_ms) || {
                        let check = self.health_check(None).await?;
                        if !check.ok {
                            return Err((
                                ErrorCode::Unhealthy,
                                format!(
                                    "repair drain {} stays: {} failed its health check: {}",
                                    h.id,
                                    self.opts.node,
                                    check.failures().join("; ")
                                ),
                            ));
                        }
                        true
                    });
                if !repaired {
                    return Err((
                        ErrorCode::NotOwner,
                        format!(
                            "hold {} ({}) is sticky: only a person releases it{}",
                            h.id,
                            h.value,
                            if h.repair { " (or its owner, after a passing health check)" } else { "" }
                        ),
                    ));
                }
            }
        }
        if req.dry_run {
            // What the release would leave: the remaining holds' value, or
            // the baseline.
            let store = self.holds();
            let mut settings: Vec<SettingRelease> = Vec::new();
            for h in &chosen {
                if settings.iter().any(|s| s.setting == h.setting) {
                    continue;
                }
                let Some(held) = store.get(&h.setting) else { continue };
                let rest: Vec<HoldInfo> = held.holds.iter().filter(|x| !ids.contains(&x.id)).cloned().collect();
                let now = crate::holds::effective(&held.baseline, &rest);
                settings.push(SettingRelease {
                    setting: h.setting.clone(),
                    outcome: if rest.is_empty() { RestoreOutcome::Restored } else { RestoreOutcome::StillHeld },
                    detail: format!("dry run: would leave {} at {now}; nothing was released", h.setting),
                    now,
                });
            }
            return Ok(ReleaseResult { released: chosen.iter().map(|h| h.id.clone()).collect(), settings });
        }
        let ids: Vec<String> = chosen.iter().map(|h| h.id.clone()).collect();
        self.release_now(&ids, HoldEnd::Released, releaser, Some((req, digest))).await
    }

    /// Remove the holds and settle their settings; `begin`: the request
    /// asking for it, marked in the same line as the removal. Each end is
    /// remembered for telemetry.
    async fn release_now(
        &self,
        ids: &[String],
        how: HoldEnd,
        by: &str,
        begin: Option<(&Request, &str)>,
    ) -> Result<ReleaseResult, Refusal> {
        let before_save = self.holds().snapshot();
        let gone = self.holds().remove(|h| ids.contains(&h.id));
        let mut settings: Vec<Setting> = gone.iter().map(|h| h.setting.clone()).collect();
        settings.sort();
        settings.dedup();
        // Not durably released (a full disk): the holds stay, in memory
        // too, and the device as it is; a lease expiry is tried again on
        // the next tick, a release request answers the error.
        let recorded = match begin {
            Some((req, digest)) => self.begin(req, digest),
            None => self.save(),
        };
        if let Err(e) = recorded {
            self.holds().restore(before_save);
            return Err(e);
        }
        let mut out = ReleaseResult { released: gone.iter().map(|h| h.id.clone()).collect(), settings: Vec::new() };
        for s in settings {
            out.settings.push(self.settle(&s).await);
        }
        let now = self.clock.now_ms();
        {
            let mut store = self.holds();
            for h in gone {
                let Some(line) = out.settings.iter().find(|l| l.setting == h.setting) else { continue };
                let (outcome, value) = (line.outcome, line.now.clone());
                store.note_ended(EndedHold { hold: h, ended_at_ms: now, how, by: by.to_string(), outcome, now: value });
            }
        }
        // What the device has now: written, synced with the next change. A
        // stop before that finds the setting released and not restored,
        // which `reconcile` finishes.
        if let Err(e) = self.commit(None, false) {
            tracing::error!(node = %self.opts.node, error = %e, "cannot record a restore; it is recorded with the next change");
        }
        Ok(out)
    }

    /// After holds on `s` went away: apply what the remaining holds ask
    /// for, or restore the baseline when none is left — never over a
    /// person's change.
    async fn settle(&self, s: &Setting) -> SettingRelease {
        let Some(h) = self.holds().get(s).cloned() else {
            return SettingRelease {
                setting: s.clone(),
                outcome: RestoreOutcome::Restored,
                now: HoldValue::NodeDrain { drained: false, reason: None },
                detail: format!("{s} was not held"),
            };
        };
        let last = h.holds.is_empty();
        let target = if last { h.baseline.clone() } else { h.effective() };
        let line =
            |outcome, now: HoldValue, detail: String| SettingRelease { setting: s.clone(), outcome, now, detail };
        let forget = |agent: &Agent| {
            if last {
                agent.holds().forget(s);
            }
        };
        if let Some(d) = &h.drifted {
            forget(self);
            let outcome = if last { RestoreOutcome::Drifted } else { RestoreOutcome::StillHeld };
            return line(outcome, h.applied.clone(), format!("{s}: a person changed it ({d}); left as it is"));
        }
        // Has a person changed it since the agent applied it?
        // The agent's own value (applied, or written just before a crash),
        // or already the value it is about to put back, is no person's.
        match self.read_setting(s).await {
            Ok(Some(dev)) if same_value(&dev, &target) && !h.is_own(&dev) => {
                if let Some(x) = self.holds().get_mut(s) {
                    x.applied = dev;
                    x.writing = None;
                }
            }
            Ok(Some(dev)) if !h.is_own(&dev) => {
                let why = format!("the agent applied {}, the device now has {dev}", h.applied);
                if last {
                    forget(self);
                } else if let Some(x) = self.holds().get_mut(s) {
                    x.drifted = Some(why.clone());
                }
                tracing::warn!(node = %self.opts.node, setting = %s, detail = %why, "setting drifted: left alone");
                return line(RestoreOutcome::Drifted, dev, format!("{s}: a person changed it ({why}); left as it is"));
            }
            Err((_, m)) => {
                return line(RestoreOutcome::Failed, h.applied.clone(), format!("{s}: cannot read it back: {m}"));
            }
            _ => {}
        }
        if last && let Err(why) = self.baseline_allowed(s, &target) {
            forget(self);
            tracing::error!(node = %self.opts.node, setting = %s, detail = %why, "refused to put back a recorded baseline");
            return line(
                RestoreOutcome::Failed,
                h.applied.clone(),
                format!("{s}: the recorded baseline is refused ({why}); left at {}: set it by hand", h.applied),
            );
        }
        if last
            && let (Setting::Config { name }, HoldValue::Config { version }) = (s, &h.baseline)
            && self.config_version_bad(name, *version)
        {
            forget(self);
            return line(
                RestoreOutcome::KeptBadBaseline,
                h.applied.clone(),
                format!("`{name}` version {} is marked bad: {} stays", version.unwrap_or(0), h.applied),
            );
        }
        if same_value(&target, &h.applied) {
            forget(self);
            let (o, d) = if last {
                (RestoreOutcome::Restored, format!("{s} back to its baseline ({target})"))
            } else {
                (RestoreOutcome::StillHeld, format!("{s} stays at {target} for the remaining holds"))
            };
            return line(o, target, d);
        }
        match self.write_setting(s, &target, None).await {
            Ok(_) => {
                if let Some(x) = self.holds().get_mut(s) {
                    x.applied = target.clone();
                }
                forget(self);
                let (o, d) = if last {
                    (RestoreOutcome::Restored, format!("{s} back to its baseline ({target})"))
                } else {
                    (RestoreOutcome::StillHeld, format!("{s} now {target} for the remaining holds"))
                };
                line(o, target, d)
            }
            Err((_, m)) => {
                forget(self);
                tracing::error!(node = %self.opts.node, setting = %s, error = %m, "cannot restore a setting");
                line(RestoreOutcome::Failed, h.applied.clone(), format!("{s}: putting {target} back failed: {m}"))
            }
        }
    }

    /// `renew`: a new lease for a hold or an owner's holds.
    fn renew_op(&self, req: &Request, digest: &str, a: &RenewArgs, owner: &str) -> Result<Value, Refusal> {
        self.opts.policy.check_lease(a.lease_secs).map_err(|m| (ErrorCode::OutOfEnvelope, m))?;
        let now = self.clock.now_ms();
        let until = now.saturating_add((a.lease_secs as i64).saturating_mul(1000));
        let target_owner = a.owner.clone().unwrap_or_else(|| owner.to_string());
        let matches = |h: &HoldInfo| match &a.hold {
            Some(id) => &h.id == id,
            None => h.owner == target_owner,
        };
        let found: Vec<HoldInfo> = self.holds().all_holds().into_iter().filter(|h| matches(h) && !h.sticky()).collect();
        if found.is_empty() {
            return Err((
                ErrorCode::NotFound,
                match &a.hold {
                    Some(id) => format!("no hold {id} with a lease on {}", self.opts.node),
                    None => format!("{target_owner} holds nothing with a lease on {}", self.opts.node),
                },
            ));
        }
        if !req.dry_run {
            let before_save = self.holds().snapshot();
            let mut store = self.holds();
            let ids: Vec<String> = found.iter().map(|h| h.id.clone()).collect();
            let gone = store.remove(|h| ids.contains(&h.id));
            for mut h in gone {
                h.expires_at_ms = Some(until);
                h.kept |= a.keep;
                let baseline = store.get(&h.setting).map(|x| x.baseline.clone()).unwrap_or(h.value.clone());
                store.place(h, baseline);
            }
            drop(store);
            if let Err(e) = self.begin(req, digest) {
                self.holds().restore(before_save);
                return Err(e);
            }
        }
        Ok(json!({"renewed": found.iter().map(|h| &h.id).collect::<Vec<_>>(), "expires_at_ms": until, "kept": a.keep}))
    }

    /// A one-shot change: clear ECC counters, flush caches, mark a config.
    async fn one_shot(&self, req: &Request, digest: &str, o: OneShot) -> Result<ActionResult, Refusal> {
        if req.revert_after_secs.is_some() {
            return Err((
                ErrorCode::BadRequest,
                format!("{} cannot be reverted: drop revert_after_secs", req.op.name()),
            ));
        }
        let now = self.clock.now_ms();
        let (kind, gpu, before, would) = match &o {
            OneShot::ClearEcc { gpu } => {
                let g = self.gpu_sample(*gpu)?;
                (
                    ActionKind::Ecc,
                    Some(*gpu),
                    json!({"ecc_sbe_total": g.ecc_sbe_total, "ecc_dbe_total": g.ecc_dbe_total}),
                    json!({"ecc_sbe_total": 0, "ecc_dbe_total": 0}),
                )
            }
            OneShot::Flush(a) => {
                let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
                let frag: Vec<Option<f64>> = gpus.iter().map(|g| g.mem_fragmentation_pct).collect();
                (
                    ActionKind::FlushCaches,
                    None,
                    json!({"mem_fragmentation_pct": frag}),
                    json!({"drop_page_cache": a.drop_page_cache, "signal_processes": a.signal_processes}),
                )
            }
            OneShot::Power(a) => (
                ActionKind::Power,
                None,
                json!({"node": a.node, "powered": !a.up}),
                json!({"node": a.node, "powered": a.up}),
            ),
            OneShot::Requeue(a) => {
                // Only off a node nightshift drained: on a node still taking
                // work the jobs would come straight back; a person's drain
                // is theirs to manage.
                let d = self.drain_state(true).await.map_err(node_refusal)?;
                if !d.drained {
                    return Err((
                        ErrorCode::BadRequest,
                        format!(
                            "requeue moves the jobs off a drained node; {} is not drained: drain it first",
                            self.opts.node
                        ),
                    ));
                }
                // A person's drain: their jobs are theirs to move — unless
                // this agent itself sees the named GPU broken (off the bus,
                // a fatal XID since its reset, double-bit errors, a failed
                // remap): a job there cannot run, whoever drained the node.
                let broken = match a.gpu {
                    Some(g) if !nightshift_proto::owner::owned_by_nightshift(d.reason.as_deref()) => {
                        let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
                        gpus.iter().find(|x| x.index == g).and_then(hardware_fault)
                    }
                    _ => None,
                };
                if !nightshift_proto::owner::owned_by_nightshift(d.reason.as_deref()) && broken.is_none() {
                    return Err((
                        ErrorCode::NotOwner,
                        format!(
                            "{} was drained by someone else (reason: {:?}): their jobs are theirs to move{}",
                            self.opts.node,
                            d.reason.as_deref().unwrap_or(""),
                            a.gpu.map_or(String::new(), |g| format!(" (GPU {g} shows no hardware fault here)"))
                        ),
                    ));
                }
                (
                    ActionKind::NodeDrain,
                    None,
                    json!({"drained": true, "reason": d.reason}),
                    match &broken {
                        Some(why) => json!({"requeue": true, "why": a.reason, "gpu_fault": why}),
                        None => json!({"requeue": true, "why": a.reason}),
                    },
                )
            }
            OneShot::ConfigMark(a) => {
                let h = self.configs.history(&a.name, now).map_err(node_refusal)?;
                let cur = h.versions.iter().find(|v| v.version == a.version).and_then(|v| v.good);
                if cur == Some(a.good) {
                    let v = json!({"name": a.name, "version": a.version, "good": cur});
                    return Ok(ActionResult {
                        outcome: Outcome::Unchanged,
                        before: v.clone(),
                        after: v,
                        detail: Some(format!(
                            "version {} is already marked {}",
                            a.version,
                            if a.good { "good" } else { "bad" }
                        )),
                        lease: None,
                        hold: None,
                        released: None,
                    });
                }
                (
                    ActionKind::Config,
                    None,
                    json!({"name": a.name, "version": a.version, "good": cur}),
                    json!({"name": a.name, "version": a.version, "good": a.good}),
                )
            }
        };
        let limit = self.opts.policy.rate_limits.get(&kind);
        self.holds().rate_check(kind, gpu, limit, now).map_err(|m| (ErrorCode::RateLimited, m))?;
        if req.dry_run {
            return Ok(ActionResult {
                outcome: Outcome::DryRun,
                before,
                after: would,
                detail: Some("dry run: every check passed; nothing was changed".into()),
                lease: None,
                hold: None,
                released: None,
            });
        }
        // Counted when tried (as a hold's change is), in the line that
        // marks the request: never under the limit after a crash.
        let before_save = self.holds().snapshot();
        self.holds().rate_record(kind, gpu, now);
        if let Err(e) = self.begin(req, digest) {
            self.holds().restore(before_save);
            return Err(e);
        }
        let after = match &o {
            OneShot::ClearEcc { gpu } => {
                self.support(self.backend.clear_ecc(*gpu).map_err(backend_refusal)?)?;
                let g = self.gpu_sample(*gpu)?;
                json!({"ecc_sbe_total": g.ecc_sbe_total, "ecc_dbe_total": g.ecc_dbe_total})
            }
            OneShot::Flush(a) => {
                // The page cache only when asked: it is not GPU memory.
                let mut report = self.opts.flush.flush(a.drop_page_cache, false).await.map_err(node_refusal)?;
                let simulated = if a.signal_processes { self.backend.flush_gpu_processes() } else { None };
                if a.signal_processes && simulated.is_none() {
                    let r = self.opts.flush.flush(false, true).await.map_err(node_refusal)?;
                    report.signalled_pids = r.signalled_pids;
                    report.stale_registrations_removed = r.stale_registrations_removed;
                    report.skipped = r.skipped;
                }
                let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
                let frag: Vec<Option<f64>> = gpus.iter().map(|g| g.mem_fragmentation_pct).collect();
                let mut after = json!({
                    "page_cache_dropped": report.page_cache_dropped,
                    "signalled_pids": report.signalled_pids,
                    "stale_registrations_removed": report.stale_registrations_removed,
                    "skipped": report.skipped,
                    "mem_fragmentation_pct": frag,
                });
                if let Some(o) = &simulated {
                    after["registered_gpus"] = json!(o.registered);
                    after["answered_gpus"] = json!(o.answered);
                    if !o.registered.is_empty() && o.answered.is_empty() {
                        return Err((
                            ErrorCode::ProcessFailed,
                            format!(
                                "{} GPU process(es) registered for the flush signal and none answered: nothing was released",
                                o.registered.len()
                            ),
                        ));
                    }
                }
                after
            }
            OneShot::Power(a) => {
                let done = self.scheduler.power(&a.node, a.up).await.map_err(node_refusal)?;
                if !done {
                    match self.backend.power_node(&a.node, a.up) {
                        Some(Ok(())) => {}
                        Some(Err(m)) => return Err((ErrorCode::BackendError, m)),
                        None => {
                            return Err((
                                ErrorCode::BackendError,
                                format!("the {} scheduler has no power saving", self.scheduler.kind()),
                            ));
                        }
                    }
                }
                tracing::info!(node = %self.opts.node, target = %a.node, up = a.up, "asked the scheduler to power a node");
                json!({"node": a.node, "powered": a.up, "scheduler": self.scheduler.kind()})
            }
            OneShot::Requeue(a) => {
                let fault = match a.gpu {
                    Some(g) => self
                        .backend
                        .sample()
                        .ok()
                        .and_then(|(gpus, _)| gpus.iter().find(|x| x.index == g).and_then(hardware_fault)),
                    None => None,
                };
                let moved = self.scheduler.requeue().await.map_err(node_refusal)?;
                self.backend.on_jobs_requeued();
                tracing::info!(node = %self.opts.node, jobs = ?moved, why = %a.reason, gpu_fault = ?fault, "requeued the node's jobs");
                match fault {
                    Some(f) => json!({"requeued": moved, "scheduler": self.scheduler.kind(), "gpu_fault": f}),
                    None => json!({"requeued": moved, "scheduler": self.scheduler.kind()}),
                }
            }
            OneShot::ConfigMark(a) => {
                let h = self.configs.mark(&a.name, a.version, a.good, now).map_err(node_refusal)?;
                let mut after = json!({"name": a.name, "version": a.version, "good": a.good, "last_good": h.last_good});
                if !a.good {
                    let ended = self.end_holds_on_bad_version(&a.name, a.version, req).await;
                    if !ended.is_empty() {
                        after["holds_ended"] = json!(ended);
                    }
                }
                after
            }
        };
        Ok(ActionResult {
            outcome: Outcome::Applied,
            before,
            after,
            detail: None,
            lease: None,
            hold: None,
            released: None,
        })
    }

    /// A config version marked bad can no longer be in effect: the holds
    /// asking for it end (`superseded`) and the setting settles on what
    /// the remaining holds ask for, or its baseline.
    async fn end_holds_on_bad_version(&self, name: &str, version: u32, req: &Request) -> Vec<String> {
        let setting = Setting::Config { name: name.to_string() };
        let gone = self.holds().remove(|h| {
            h.setting == setting && matches!(h.value, HoldValue::Config { version: Some(v) } if v == version)
        });
        if gone.is_empty() {
            return Vec::new();
        }
        let line = self.settle(&setting).await;
        let now = self.clock.now_ms();
        let by = req.owner.clone().unwrap_or_else(|| "manual".into());
        let mut store = self.holds();
        let ids = gone.iter().map(|h| h.id.clone()).collect();
        for h in gone {
            tracing::info!(node = %self.opts.node, hold = %h.id, owner = %h.owner, config = name, version, "hold on a version marked bad ends");
            store.note_ended(EndedHold {
                hold: h,
                ended_at_ms: now,
                how: HoldEnd::Superseded,
                by: by.clone(),
                outcome: line.outcome,
                now: line.now.clone(),
            });
        }
        ids
    }

    fn support(&self, s: Support<()>) -> Result<(), Refusal> {
        match s {
            Support::Done(()) => Ok(()),
            Support::NotSupported(why) => Err((ErrorCode::BackendError, why)),
        }
    }

    fn gpu_sample(&self, gpu: u32) -> Result<GpuTelemetry, Refusal> {
        self.backend.gpu(gpu).map_err(backend_refusal)?;
        let (gpus, _) = self.backend.sample().map_err(backend_refusal)?;
        gpus.into_iter()
            .find(|g| g.index == gpu)
            .ok_or_else(|| (ErrorCode::BackendError, format!("GPU {gpu} missing from the sample")))
    }

    fn run_fan_curve(&self, gpu: u32, points: &[FanPoint]) -> Result<(), Refusal> {
        let temp = self.gpu_sample(gpu)?.temperature_c;
        let speed = fan_curve_speed(points, temp).max(self.opts.policy.fan.min_pct);
        self.support(self.backend.set_fan_speed(gpu, speed).map_err(backend_refusal)?)
    }

    /// Active holds: (hold id, lease end). Sticky holds have none.
    pub fn leases(&self) -> Vec<(String, Option<i64>)> {
        self.holds().all_holds().into_iter().map(|h| (h.id, h.expires_at_ms)).collect()
    }

    /// Periodic work, on the agent's own clock: release holds whose lease
    /// ran out, finish a change a crash interrupted, drive held fan curves.
    /// None of it happens while the hands-off marker exists. Call it a few
    /// times a second (the runtime does); scenario tests call it each
    /// virtual tick.
    pub async fn tick(&self) {
        if self.opts.policy.hands_off() || self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let now = self.clock.now_ms();
        let _guard = self.mutate.lock().await;
        // A log that failed a write is tried again (an empty line, synced),
        // so the agent says it works again once space is back even when no
        // change comes.
        if self.state_degraded().is_some() {
            let written = self.state_log().append(&crate::statelog::Entry::default(), true);
            self.note_durability(&written);
        }
        // First make the record agree with the device (a write cut off by a
        // stop is adopted), so an expiry never reads the agent's own write
        // as a person's.
        self.reconcile().await;
        self.readback(now).await;
        let mut expired = self.holds().expired(now);
        if !expired.is_empty() {
            expired = self.keep_unhealthy_drains(expired, now).await;
        }
        if !expired.is_empty() {
            match self.release_now(&expired, HoldEnd::Expired, "", None).await {
                Ok(r) => {
                    for id in &r.released {
                        let detail = r.settings.iter().map(|s| s.detail.clone()).collect::<Vec<_>>().join("; ");
                        let ok = r.settings.iter().all(|s| s.outcome != RestoreOutcome::Failed);
                        tracing::info!(node = %self.opts.node, hold = %id, ok, detail = %detail, "hold lease ran out");
                        let line = JournalLine::Reverted { id: id.clone(), at_ms: now, ok, detail };
                        if let Err(e) = self.commit(Some(line), false) {
                            tracing::error!(error = %e, "cannot journal a lease expiry");
                        }
                    }
                }
                Err((_, m)) => tracing::error!(node = %self.opts.node, error = %m, "cannot release expired holds"),
            }
        }
        self.scan_configs(now);
        let curves: Vec<(u32, Vec<FanPoint>)> = self
            .holds()
            .held()
            .iter()
            .filter(|h| h.drifted.is_none())
            .filter_map(|h| match (&h.setting, &h.applied) {
                (Setting::FanCurve { gpu }, HoldValue::FanCurve { points: Some(p) }) => Some((*gpu, p.clone())),
                _ => None,
            })
            .collect();
        for (gpu, curve) in curves {
            if let Err((_, m)) = self.run_fan_curve(gpu, &curve) {
                tracing::warn!(node = %self.opts.node, gpu, error = %m, "fan curve step failed");
            }
        }
    }

    /// Of the expired holds, those whose end would put an unhealthy node
    /// back into service are extended instead (nothing broken returns to
    /// service on a timer); the rest are returned to be released.
    async fn keep_unhealthy_drains(&self, expired: Vec<String>, now: i64) -> Vec<String> {
        let (drains, remaining_drain): (Vec<String>, bool) = {
            let store = self.holds();
            let all = store.all_holds();
            let drains: Vec<String> = all
                .iter()
                .filter(|h| expired.contains(&h.id) && matches!(h.value, HoldValue::NodeDrain { drained: true, .. }))
                .map(|h| h.id.clone())
                .collect();
            let remaining = all
                .iter()
                .any(|h| !expired.contains(&h.id) && matches!(h.value, HoldValue::NodeDrain { drained: true, .. }));
            let base_drained = store
                .get(&Setting::NodeDrain {})
                .is_some_and(|h| matches!(h.baseline, HoldValue::NodeDrain { drained: true, .. }));
            (drains, remaining || base_drained)
        };
        if drains.is_empty() || remaining_drain {
            return expired;
        }
        let check = match self.health_check(None).await {
            Ok(c) => c,
            Err((_, m)) => {
                tracing::error!(node = %self.opts.node, error = %m, "cannot check health before a drain's lease ends: keeping it");
                HealthCheck { ok: false, at_ms: now, gpus: vec![], node_failures: vec![m], dcgm: None }
            }
        };
        if check.ok {
            return expired;
        }
        let until = now + self.opts.policy.health.unhealthy_extend_secs as i64 * 1000;
        {
            let mut store = self.holds();
            for mut h in store.remove(|h| drains.contains(&h.id)) {
                h.expires_at_ms = Some(until);
                let baseline = store.get(&h.setting).map(|x| x.baseline.clone()).unwrap_or(h.value.clone());
                store.place(h, baseline);
            }
        }
        if let Err((_, m)) = self.save() {
            tracing::error!(node = %self.opts.node, error = %m, "cannot record the extended drain");
        }
        tracing::warn!(
            node = %self.opts.node, holds = ?drains, failures = ?check.failures(),
            "a drain's lease ran out on a node that fails its health check: the drain stays"
        );
        expired.into_iter().filter(|id| !drains.contains(id)).collect()
    }

    /// Record hand edits of managed config files as versions (at most once
    /// a second), so `config_list` shows a change a person made outside
    /// nightshift, with when it was seen.
    fn scan_configs(&self, now: i64) {
        {
            let mut last = self.config_scan_ms.lock().unwrap_or_else(|e| e.into_inner());
            if now.saturating_sub(*last) < 1_000 {
                return;
            }
            *last = now;
        }
        for name in self.configs.names() {
            let Ok(before) = self.configs.history(&name, now) else { continue };
            match self.configs.adopt_disk(&name, now) {
                Ok(h) if h.current != before.current => {
                    if let Ok(text) = self.configs.content(&name, h.current.unwrap_or(0)) {
                        self.backend.on_config_applied(&name, &text);
                    }
                    tracing::info!(node = %self.opts.node, config = %name, version = ?h.current, "a managed config changed outside nightshift: recorded");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node = %self.opts.node, config = %name, error = %e, "cannot check a managed config")
                }
            }
        }
    }

    /// Read the held GPU settings back from the device: at the first tick
    /// after a start, then every [`READBACK_MS`]. A power limit or GPU
    /// drain found at its baseline while held — a GPU reset, a reboot, a
    /// driver reload put the device's default back, often while the agent
    /// was down — is applied again (inside the envelope) and noted as
    /// `reapplied` with the reading; one that cannot be, or that holds a
    /// value that is neither the agent's nor the default (a person's), is
    /// marked drifted. Never shown as held while not in force. Node-level
    /// settings (a drain, marks, configs, chassis fans) back at their
    /// baseline are a person's or the scheduler's doing, found at release
    /// as before: they are not put back behind anyone's back.
    async fn readback(&self, now: i64) {
        {
            let mut last = self.readback_ms.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now - t < READBACK_MS) {
                return;
            }
            *last = Some(now);
        }
        let due: Vec<crate::holds::Held> = self
            .holds()
            .held()
            .iter()
            .filter(|h| {
                !h.holds.is_empty()
                    && h.drifted.is_none()
                    && h.writing.is_none()
                    && matches!(h.setting, Setting::PowerLimit { .. } | Setting::GpuDrain { .. })
            })
            .cloned()
            .collect();
        for h in due {
            let s = &h.setting;
            let Ok(Some(dev)) = self.read_setting(s).await else { continue };
            if h.is_own(&dev) {
                continue;
            }
            let v = h.effective();
            let drift = if same_value(&dev, &h.baseline) {
                match self.held_value_allowed(s, &v) {
                    Err(why) => Some(format!(
                        "found at its default {dev} (a reset or reboot?); {v} is outside the envelope now: {why}"
                    )),
                    Ok(()) => match self.write_setting(s, &v, None).await {
                        Ok(_) => {
                            if let Some(x) = self.holds().get_mut(s) {
                                x.applied = v.clone();
                                x.reapplied = Some(nightshift_proto::Reapplied {
                                    at_ms: now,
                                    found: dev.clone(),
                                    applied: v.clone(),
                                });
                            }
                            tracing::warn!(node = %self.opts.node, setting = %s, found = %dev, applied = %v,
                                "a held setting was back at its default (a GPU reset, a reboot): applied again");
                            None
                        }
                        Err((_, m)) => Some(format!(
                            "found at its default {dev} (a reset or reboot?); applying {v} again failed: {m}"
                        )),
                    },
                }
            } else {
                Some(format!("the agent applied {}, the device now has {dev}", h.applied))
            };
            if let Some(why) = drift {
                tracing::warn!(node = %self.opts.node, setting = %s, detail = %why, "held setting not in force: drifted");
                if let Some(x) = self.holds().get_mut(s) {
                    x.drifted = Some(why);
                }
            }
            if let Err((_, m)) = self.save() {
                tracing::error!(node = %self.opts.node, error = %m, "cannot record the holds");
            }
        }
    }

    /// Apply the effective value of any setting whose last change was cut
    /// short (the hold was recorded, the device not yet written).
    async fn reconcile(&self) {
        // A release cut off between recording it and restoring the device
        // leaves a setting with no holds: put it back now.
        let orphans: Vec<Setting> = self
            .holds()
            .held()
            .iter()
            .filter(|h| h.holds.is_empty() && h.writing.is_none())
            .map(|h| h.setting.clone())
            .collect();
        for s in orphans {
            let line = self.settle(&s).await;
            tracing::info!(node = %self.opts.node, setting = %s, outcome = ?line.outcome, detail = %line.detail,
                "finished a release cut off by a stop");
            if let Err((_, m)) = self.save() {
                tracing::error!(node = %self.opts.node, error = %m, "cannot record the holds");
            }
        }
        let pending: Vec<(Setting, HoldValue, crate::holds::Held)> = self
            .holds()
            .held()
            .iter()
            .filter(|h| {
                h.drifted.is_none()
                    && (h.writing.is_some() || (!h.holds.is_empty() && !same_value(&h.applied, &h.effective())))
            })
            .map(|h| (h.setting.clone(), h.effective(), h.clone()))
            .collect();
        for (s, v, h) in pending {
            // A write the agent made just before it stopped: the device has
            // the agent's own value; adopt it, never call it drift.
            if let Some(w) = &h.writing
                && let Ok(Some(dev)) = self.read_setting(&s).await
                && same_value(&dev, w)
            {
                if let Some(x) = self.holds().get_mut(&s) {
                    x.applied = w.clone();
                    x.writing = None;
                }
                tracing::info!(node = %self.opts.node, setting = %s, value = %w, "adopted a write cut off by a stop");
                if let Err((_, m)) = self.save() {
                    tracing::error!(node = %self.opts.node, error = %m, "cannot record the holds");
                }
                if same_value(w, &v) || h.holds.is_empty() {
                    continue;
                }
            }
            if let Some(x) = self.holds().get_mut(&s) {
                x.writing = None;
            }
            if h.holds.is_empty() || same_value(&h.applied, &v) {
                continue;
            }
            match self.write_setting(&s, &v, None).await {
                Ok(_) => {
                    if let Some(h) = self.holds().get_mut(&s) {
                        h.applied = v.clone();
                    }
                    tracing::info!(node = %self.opts.node, setting = %s, value = %v, "finished an interrupted change");
                }
                Err((_, m)) => {
                    tracing::error!(node = %self.opts.node, setting = %s, error = %m, "cannot apply a held value")
                }
            }
            if let Err((_, m)) = self.save() {
                tracing::error!(node = %self.opts.node, error = %m, "cannot record the holds");
            }
        }
    }
}

/// A mutating request handled after its leader's lease deadline comes from
/// a leader that may no longer lead (frozen, then resumed after a
/// takeover): refused, nothing applied.
fn check_deadline(not_after_ms: Option<i64>, now_ms: i64) -> Result<(), Refusal> {
    match not_after_ms {
        Some(d) if now_ms > d => Err((
            ErrorCode::StaleLeader,
            format!(
                "the request arrived {} ms after its leader's lease deadline ({d} ms since the epoch; this agent's \
                 clock says {now_ms}): the sender may no longer lead, so nothing was done",
                now_ms - d
            ),
        )),
        _ => Ok(()),
    }
}

/// How far above the highest term seen a request's term may be (terms grow
/// by one per takeover; a thousand takeovers unseen by one agent is already
/// far past any real fleet).
const MAX_TERM_STEP: u64 = 1_000;

/// The highest term a first request may carry (an agent that has seen none).
const MAX_FIRST_TERM: u64 = 1 << 32;

/// What this agent sees wrong with a GPU's hardware, if anything: it does
/// not answer, a fatal XID since its last reset, double-bit ECC errors, a
/// failed row remap.
fn hardware_fault(g: &GpuTelemetry) -> Option<String> {
    if g.lost {
        Some(format!("GPU {} does not answer", g.index))
    } else if g.reset_required == Some(true) {
        Some(format!("GPU {} had a fatal XID ({}) since its last reset", g.index, g.xid_last.unwrap_or(0)))
    } else if g.ecc_dbe_total > 0 {
        Some(format!("GPU {} has {} double-bit ECC error(s)", g.index, g.ecc_dbe_total))
    } else if g.row_remap_failure == Some(true) {
        Some(format!("GPU {} failed a row remap", g.index))
    } else {
        None
    }
}
