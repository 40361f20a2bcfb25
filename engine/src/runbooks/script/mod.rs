//! The Rhai host: one hardened engine, scripts compiled once, each run on a
//! blocking thread with a wall-clock (engine-clock) deadline and a cancel
//! flag the script cannot catch.
//!
//! Sealed: no files, network, processes, `eval`, `import` or printing; every
//! Rhai limit is set; unknown variable names are compile errors. The only
//! way out is the host API below, reached through the [`ScriptHost`] of the
//! current run (a thread-local set for the duration of the run).
//!
//! Host API (documented for runbook authors in `runbooks/README.md`):
//! readings `metric(name)`, `metric(name, window_secs)`, `metric_max`,
//! `metric_min`, `metric_slope`, `gpu_metric(gpu, name)`,
//! `node_metric(node, name)`, `gpu()`, `node()`, `group_nodes()`, `group_metric(name)`,
//! `event_resolved()`, `now()`, `elapsed()`; actions `set_power_limit`,
//! `set_fan_curve`, `reset_fan`, `set_clocks`, `reset_clocks`, `clear_ecc`,
//! `set_gpu_drain`, `drain`, `resume`, `drain_node`, `resume_node`,
//! `flush_caches`, `config_apply`, `config_rollback`, `config_mark`,
//! `config_list`, `annotate`, `clear_annotation`, `scale_out`, `scale_in`,
//! `drain_sticky`; holds `holds`, `release_holds`, `keep_holds`; control
//! `sleep`, `wait_until`, `note`, `notify`, `escalate`, `fail`.

mod api;
pub mod workload;

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rhai::{AST, Dynamic, Engine, EvalAltResult, Map, Position, Scope};
use serde::{Deserialize, Serialize};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::*;

use crate::base::metrics::MetricId;
use crate::runbooks::manifest::LoadError;
use crate::runs::Target;

/// Limits for every script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptLimits {
    #[serde(default = "d_ops")]
    pub max_operations: u64,
    #[serde(default = "d_calls")]
    pub max_call_levels: usize,
    #[serde(default = "d_expr")]
    pub max_expr_depth: usize,
    #[serde(default = "d_string")]
    pub max_string_size: usize,
    #[serde(default = "d_array")]
    pub max_array_size: usize,
    #[serde(default = "d_map")]
    pub max_map_size: usize,
    #[serde(default = "d_vars")]
    pub max_variables: usize,
    /// Notes (and notifications) a run may write; more are dropped.
    #[serde(default = "d_notes")]
    pub max_notes: u32,
}

fn d_ops() -> u64 {
    1_000_000
}
fn d_calls() -> usize {
    24
}
fn d_expr() -> usize {
    48
}
fn d_string() -> usize {
    16 * 1024
}
fn d_array() -> usize {
    4096
}
fn d_map() -> usize {
    512
}
fn d_vars() -> usize {
    256
}
fn d_notes() -> u32 {
    100
}

impl Default for ScriptLimits {
    fn default() -> Self {
        ScriptLimits {
            max_operations: d_ops(),
            max_call_levels: d_calls(),
            max_expr_depth: d_expr(),
            max_string_size: d_string(),
            max_array_size: d_array(),
            max_map_size: d_map(),
            max_variables: d_vars(),
            max_notes: d_notes(),
        }
    }
}

/// How a reading is summarised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Agg {
    Latest,
    Avg,
    Max,
    Min,
    SlopePerMin,
}

/// A reading asked for by a script.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub node: String,
    pub gpu: Option<u32>,
    pub metric: MetricId,
    pub window_ms: i64,
    pub agg: Agg,
}

/// Kinds of text a script writes to the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    Note,
    Notify,
    Escalate,
}

/// The most actions [`ScriptHost::act_many`] has in flight at once.
pub const MAX_PARALLEL_ACTIONS: usize = 32;

/// What the engine offers a running script. Every method is called from the
/// run's blocking thread (`act_many`'s actions from threads it starts).
pub trait ScriptHost: Send + Sync {
    fn reading(&self, ctx: &RunCtx, q: &Reading) -> Option<f64>;
    fn gpu_info(&self, ctx: &RunCtx, node: &str, gpu: u32) -> Map;
    fn node_info(&self, ctx: &RunCtx, node: &str) -> Map;
    fn group_nodes(&self, ctx: &RunCtx) -> Vec<String>;
    /// Average of a metric's latest values over the group's undrained nodes.
    fn group_avg(&self, ctx: &RunCtx, metric: MetricId) -> Option<f64>;
    /// Send an action to a node's agent (audited intent → result).
    fn act(&self, ctx: &RunCtx, node: &str, op: Op) -> Map;
    /// [`ScriptHost::act`] for many nodes at once, at most
    /// [`MAX_PARALLEL_ACTIONS`] in flight; results in the order given.
    /// Each action is checked, audited and sent exactly as `act` does it —
    /// only the waiting overlaps (the intents share fdatasyncs).
    fn act_many(&self, ctx: &RunCtx, actions: Vec<(String, Op)>) -> Vec<Map> {
        let mut out: Vec<Option<Map>> = vec![None; actions.len()];
        for (chunk, slots) in actions.chunks(MAX_PARALLEL_ACTIONS).zip(out.chunks_mut(MAX_PARALLEL_ACTIONS)) {
            std::thread::scope(|scope| {
                for ((node, op), slot) in chunk.iter().zip(slots.iter_mut()) {
                    scope.spawn(move || *slot = Some(self.act(ctx, node, op.clone())));
                }
            });
        }
        out.into_iter().map(Option::unwrap_or_default).collect()
    }
    /// One managed config by name (its entry), or all of them (an array).
    fn config_list(&self, ctx: &RunCtx, node: &str, name: Option<&str>) -> Dynamic;
    fn annotate(&self, ctx: &RunCtx, node: &str, key: &str, text: Option<&str>);
    fn scale(&self, ctx: &RunCtx, out: bool, count: i64) -> Map;
    /// Ask the autoscaler webhook for nodes (`out`) or to take back ones
    /// nightshift asked for (`in`).
    fn autoscale(&self, ctx: &RunCtx, out: bool, count: i64, why: &str) -> Map;
    /// Note, notify or escalate `text`; `size` (larger is worse) lets a
    /// notification already told be said again once it has grown.
    fn text(&self, ctx: &RunCtx, kind: TextKind, text: &str, size: Option<f64>);
    fn event_resolved(&self, ctx: &RunCtx) -> bool;
    /// Runs of this runbook on this target that started in the last
    /// `window_ms` (at most 24 h), this one included; a run that decided
    /// there was nothing to do does not count. Rebuilt after a restart.
    fn runs_within(&self, ctx: &RunCtx, window_ms: i64) -> i64;
    /// The condition this runbook told about the target is gone: its
    /// findings there are over (the next one is told), said on the run.
    fn finding_cleared(&self, ctx: &RunCtx, why: &str);
    /// Release this run's holds (on `node`, or everywhere it holds).
    fn release_holds(&self, ctx: &RunCtx, node: Option<&str>) -> Map;
    /// Keep this run's holds past its end, with a new lease.
    fn keep_holds(&self, ctx: &RunCtx, lease_secs: u64) -> Map;
    /// The holds in effect on a node.
    fn holds(&self, ctx: &RunCtx, node: &str) -> rhai::Array;
    /// The run's target GPU in the health model: its state, fault, what
    /// the XID table says, its repeats (an empty map when never faulty).
    fn fault(&self, _ctx: &RunCtx) -> Map {
        Map::new()
    }
    /// Move the target GPU on in its repair lifecycle (`quarantined`,
    /// `awaiting_repair`, `rma`); `text` says why, or what a person should
    /// do.
    fn health_to(&self, _ctx: &RunCtx, _to: &str, _text: &str) -> Map {
        Map::new()
    }
    /// Record a fault the engine has not seen in telemetry (an alert's):
    /// `kind` as in a `fault` trigger.
    fn declare_fault(&self, _ctx: &RunCtx, _kind: &str, _xid: Option<u32>, _detail: &str) -> Map {
        Map::new()
    }
    /// The agent's health check of a node (read-only).
    fn health_check(&self, _ctx: &RunCtx, _node: &str) -> Map {
        Map::new()
    }
    /// What the XID policy in force says about a code: `#{code, mnemonic,
    /// meaning, action}` (empty: a code it does not know).
    fn xid_info(&self, _ctx: &RunCtx, _code: u32) -> Map {
        Map::new()
    }
    /// The XIDs repeating on the run's GPU past the policy's repeat rule,
    /// the most frequent first: `[#{code, events, more_than, window_secs,
    /// mnemonic, meaning, action}]`.
    fn xid_repeats(&self, _ctx: &RunCtx) -> rhai::Array {
        Vec::new()
    }
    /// The work waiting in the scheduler for the run's group.
    fn pool_pending(&self, _ctx: &RunCtx) -> Map {
        Map::new()
    }
    /// Why the run is one node of a shared cause (its breaker tripped),
    /// now — a run can be marked after it started; `None` when it is not.
    fn shared_cause(&self, _ctx: &RunCtx) -> Option<String> {
        None
    }
    /// Mark a node that did not boot after a power-up (scale-out skips it).
    fn boot_failed(&self, _ctx: &RunCtx, _node: &str, _why: &str) {}
    /// RMA evidence of the run's GPU (or node), its hash on the chain.
    fn collect_evidence(&self, _ctx: &RunCtx, _why: &str) -> Map {
        Map::new()
    }
    /// Average of a metric's latest values over the given nodes.
    fn nodes_avg(&self, _ctx: &RunCtx, _nodes: &[String], _metric: MetricId) -> Option<f64> {
        None
    }
    /// Over the last `window_ms` of a GPU: temperature fitted as
    /// `a + b·power + c·time` (least squares), so what the load explains
    /// (`b`, °C per kW) is told apart from what it does not (`c`, °C per
    /// minute at constant load: a cooling fault). An empty map without
    /// enough points.
    /// How much of the last `window_ms` this engine has not observed of
    /// `node` (0: all of it; a new engine has observed nothing).
    fn unobserved_ms(&self, _ctx: &RunCtx, _node: &str, _window_ms: i64) -> i64 {
        0
    }
    fn thermal_fit(&self, _ctx: &RunCtx, _node: &str, _gpu: u32, _window_ms: i64) -> Map {
        Map::new()
    }
    /// A metric between `from_ms` and `to_ms` (engine clock) on the run's
    /// target: count, min, max, avg (the worst GPU for a node target).
    fn stats_between(
        &self,
        _ctx: &RunCtx,
        _node: &str,
        _gpu: Option<u32>,
        _metric: MetricId,
        _from_ms: i64,
        _to_ms: i64,
    ) -> Map {
        Map::new()
    }
}

/// Why a script was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Deadline,
    Cancelled,
    Failed,
    Skipped,
}

/// What a run is, for its context.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub run_id: String,
    pub runbook: String,
    pub target: Target,
    pub dry_run: bool,
    pub timeout_secs: u64,
    pub max_notes: u32,
    /// How many times an engine restart resumed the run (0: never).
    pub resumed: u32,
}

/// Everything a host function knows about the run it serves.
pub struct RunCtx {
    pub run_id: String,
    pub runbook: String,
    pub target: Target,
    pub dry_run: bool,
    pub clock: SharedClock,
    pub started_ms: i64,
    pub deadline_ms: i64,
    pub cancel: Arc<AtomicBool>,
    pub host: Arc<dyn ScriptHost>,
    pub max_notes: u32,
    /// How many times an engine restart resumed the run: a resumed run
    /// judges a window only once this engine has observed all of it.
    pub resumed: u32,
    pub notes: AtomicU32,
    pub failure: Mutex<Option<String>>,
    stop: Mutex<Option<StopReason>>,
}

impl RunCtx {
    pub fn new(info: RunInfo, clock: SharedClock, host: Arc<dyn ScriptHost>) -> RunCtx {
        let started_ms = clock.now_ms();
        RunCtx {
            run_id: info.run_id,
            runbook: info.runbook,
            target: info.target,
            dry_run: info.dry_run,
            deadline_ms: started_ms.saturating_add((info.timeout_secs.min(i64::MAX as u64 / 1000) as i64) * 1000),
            clock,
            started_ms,
            cancel: Arc::new(AtomicBool::new(false)),
            host,
            max_notes: info.max_notes,
            resumed: info.resumed,
            notes: AtomicU32::new(0),
            failure: Mutex::new(None),
            stop: Mutex::new(None),
        }
    }

    /// End the run as skipped (its condition cleared): the script stops at
    /// its next host call or operation check.
    pub fn skip(&self, why: &str) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
        self.set_stop(StopReason::Skipped);
    }

    /// Whether the run must stop now, and why.
    pub fn check_stop(&self) -> Option<StopReason> {
        if let Some(r) = *self.stop.lock().unwrap_or_else(|e| e.into_inner()) {
            return Some(r);
        }
        let reason = if self.cancel.load(Ordering::Relaxed) {
            Some(StopReason::Cancelled)
        } else if self.clock.now_ms() >= self.deadline_ms {
            Some(StopReason::Deadline)
        } else {
            None
        };
        if reason.is_some() {
            *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = reason;
        }
        reason
    }

    fn set_stop(&self, r: StopReason) {
        *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    }

    fn node(&self) -> Result<String, Box<EvalAltResult>> {
        self.target
            .node
            .clone()
            .ok_or_else(|| rt("this runbook targets a group: name the node (e.g. drain_node(node, why))"))
    }

    fn gpu(&self) -> Result<u32, Box<EvalAltResult>> {
        self.target.gpu.ok_or_else(|| rt("this run targets a whole node: name the GPU (e.g. set_power_limit(0, 450))"))
    }

    /// Sleep on the engine clock, stopping at the deadline or on cancel.
    /// In a resumed run, wait until this engine has observed the whole
    /// window a reading of `node` covers (bounded by the run's deadline):
    /// a conclusion from a window a new engine has not seen — "the trend
    /// has turned", "nothing to do" — could release a mitigation still
    /// needed (invariant 18). Fresh runs never wait.
    pub fn observe_window(&self, node: &str, window_ms: i64) -> Result<(), Box<EvalAltResult>> {
        if self.resumed == 0 || window_ms <= 0 {
            return Ok(());
        }
        let wait = self.host.unobserved_ms(self, node, window_ms);
        if wait > 0 { self.sleep_ms(wait) } else { Ok(()) }
    }

    pub fn sleep_ms(&self, ms: i64) -> Result<(), Box<EvalAltResult>> {
        let now = self.clock.now_ms();
        let until = now.saturating_add(ms.max(0)).min(self.deadline_ms);
        if until > now {
            self.clock.sleep_until_blocking(until, &self.cancel);
        }
        match self.check_stop() {
            Some(r) => Err(terminated(r)),
            None => Ok(()),
        }
    }
}

thread_local! {
    pub(crate) static CURRENT: RefCell<Option<Arc<RunCtx>>> = const { RefCell::new(None) };
}

fn rt(msg: impl Into<String>) -> Box<EvalAltResult> {
    EvalAltResult::ErrorRuntime(Dynamic::from(msg.into()), Position::NONE).into()
}

pub(crate) fn terminated(r: StopReason) -> Box<EvalAltResult> {
    let token = match r {
        StopReason::Deadline => "deadline",
        StopReason::Cancelled => "cancelled",
        StopReason::Failed => "failed",
        StopReason::Skipped => "skipped",
    };
    EvalAltResult::ErrorTerminated(Dynamic::from(token), Position::NONE).into()
}

/// Build the one hardened engine, with the host API registered.
pub fn build_engine(limits: &ScriptLimits) -> Engine {
    let mut e = Engine::new();
    e.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    e.on_print(|_| {});
    e.on_debug(|_, _, _| {});
    for sym in ["eval", "print", "debug", "import", "export"] {
        e.disable_symbol(sym);
    }
    e.set_strict_variables(true);
    e.set_max_operations(limits.max_operations);
    e.set_max_call_levels(limits.max_call_levels);
    e.set_max_expr_depths(limits.max_expr_depth, limits.max_expr_depth / 2);
    e.set_max_string_size(limits.max_string_size);
    e.set_max_array_size(limits.max_array_size);
    e.set_max_map_size(limits.max_map_size);
    e.set_max_variables(limits.max_variables);
    e.set_max_functions(64);
    e.set_max_modules(0);
    e.on_progress(|ops| {
        if ops % 512 != 0 {
            return None;
        }
        CURRENT.with(|c| c.borrow().as_ref().and_then(|ctx| ctx.check_stop())).map(|r| match r {
            StopReason::Deadline => Dynamic::from("deadline"),
            StopReason::Cancelled => Dynamic::from("cancelled"),
            StopReason::Failed => Dynamic::from("failed"),
            StopReason::Skipped => Dynamic::from("skipped"),
        })
    });
    api::register(&mut e);
    workload::register(&mut e);
    e
}

/// Compile a script with `event`, `params` and `target` in scope; errors
/// carry the file, line and column.
pub fn compile(engine: &Engine, source: &str, path: &Path) -> Result<AST, LoadError> {
    let mut scope = Scope::new();
    scope.push("event", Map::new());
    scope.push("params", Map::new());
    scope.push("target", Map::new());
    let mut ast = engine.compile_with_scope(&scope, source).map_err(|e| {
        let pos = e.position();
        LoadError {
            file: path.into(),
            line: pos.line().unwrap_or(1),
            column: pos.position().unwrap_or(1),
            message: format!("script does not compile: {}", e.err_type()),
        }
    })?;
    ast.set_source(path.display().to_string());
    Ok(ast)
}

/// How a script run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptOutcome {
    Succeeded,
    /// `fail()`, a runtime error, or a limit; the message has file:line.
    Failed(String),
    TimedOut(String),
    Cancelled,
    /// Its condition cleared before its first change: nothing was done.
    Skipped(String),
}

fn innermost(err: &EvalAltResult) -> (&EvalAltResult, Position) {
    let mut e = err;
    let mut pos = err.position();
    while let EvalAltResult::ErrorInFunctionCall(_, _, inner, p) = e {
        if !p.is_none() {
            pos = *p;
        }
        e = inner;
        if !e.position().is_none() {
            pos = e.position();
        }
    }
    (e, pos)
}

/// Run a compiled script for `ctx` on this (blocking) thread.
pub fn execute(
    engine: &Engine,
    ast: &AST,
    ctx: Arc<RunCtx>,
    event: Dynamic,
    params: Dynamic,
    target: Dynamic,
) -> ScriptOutcome {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CURRENT.with(|c| *c.borrow_mut() = None);
        }
    }
    CURRENT.with(|c| *c.borrow_mut() = Some(ctx.clone()));
    let _reset = Reset;
    let mut scope = Scope::new();
    scope.push("event", event);
    scope.push("params", params);
    scope.push("target", target);
    let result = engine.run_ast_with_scope(&mut scope, ast);
    let file = ast.source().unwrap_or("script").to_string();
    let at = |pos: Position| match (pos.line(), pos.position()) {
        (Some(l), Some(c)) => format!("{file}:{l}:{c}"),
        (Some(l), None) => format!("{file}:{l}"),
        _ => file.clone(),
    };
    match result {
        Ok(()) => ScriptOutcome::Succeeded,
        Err(err) => {
            let (inner, pos) = innermost(&err);
            match inner {
                EvalAltResult::ErrorTerminated(token, _) => {
                    match token.clone().into_string().unwrap_or_default().as_str() {
                        "deadline" => ScriptOutcome::TimedOut(format!(
                            "{}: stopped at its deadline ({} s)",
                            at(pos),
                            (ctx.deadline_ms - ctx.started_ms) / 1000
                        )),
                        "cancelled" => ScriptOutcome::Cancelled,
                        "skipped" => ScriptOutcome::Skipped(
                            ctx.failure.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default(),
                        ),
                        _ => {
                            let why = ctx.failure.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
                            ScriptOutcome::Failed(format!("{}: fail(\"{why}\")", at(pos)))
                        }
                    }
                }
                EvalAltResult::ErrorTooManyOperations(_) => ScriptOutcome::Failed(format!(
                    "{}: stopped by the operation limit ({} operations): runaway loop?",
                    at(pos),
                    engine.max_operations()
                )),
                EvalAltResult::ErrorStackOverflow(_) => {
                    ScriptOutcome::Failed(format!("{}: stopped by the call depth limit: runaway recursion?", at(pos)))
                }
                EvalAltResult::ErrorDataTooLarge(what, _) => {
                    ScriptOutcome::Failed(format!("{}: stopped by a size limit: {what}", at(pos)))
                }
                other => ScriptOutcome::Failed(format!(
                    "{}: {}",
                    at(pos),
                    other.to_string().split(" (line").next().unwrap_or("")
                )),
            }
        }
    }
}
