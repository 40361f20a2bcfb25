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

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rhai::{AST, Dynamic, Engine, EvalAltResult, FnPtr, Map, NativeCallContext, Position, Scope};
use serde::{Deserialize, Serialize};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::*;

use crate::manifest::LoadError;
use crate::metrics::{self, MetricId};
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

/// What the engine offers a running script. Every method is called from the
/// run's blocking thread.
pub trait ScriptHost: Send + Sync {
    fn reading(&self, ctx: &RunCtx, q: &Reading) -> Option<f64>;
    fn gpu_info(&self, ctx: &RunCtx, node: &str, gpu: u32) -> Map;
    fn node_info(&self, ctx: &RunCtx, node: &str) -> Map;
    fn group_nodes(&self, ctx: &RunCtx) -> Vec<String>;
    /// Average of a metric's latest values over the group's undrained nodes.
    fn group_avg(&self, ctx: &RunCtx, metric: MetricId) -> Option<f64>;
    /// Send an action to a node's agent (audited intent → result).
    fn act(&self, ctx: &RunCtx, node: &str, op: Op) -> Map;
    fn config_list(&self, ctx: &RunCtx, node: &str, name: &str) -> Dynamic;
    fn annotate(&self, ctx: &RunCtx, node: &str, key: &str, text: Option<&str>);
    fn scale(&self, ctx: &RunCtx, out: bool, count: i64) -> Map;
    fn text(&self, ctx: &RunCtx, kind: TextKind, text: &str);
    fn event_resolved(&self, ctx: &RunCtx) -> bool;
    /// Release this run's holds (on `node`, or everywhere it holds).
    fn release_holds(&self, ctx: &RunCtx, node: Option<&str>) -> Map;
    /// Keep this run's holds past its end, with a new lease.
    fn keep_holds(&self, ctx: &RunCtx, lease_secs: u64) -> Map;
    /// The holds in effect on a node.
    fn holds(&self, ctx: &RunCtx, node: &str) -> rhai::Array;
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
    static CURRENT: RefCell<Option<Arc<RunCtx>>> = const { RefCell::new(None) };
}

fn ctx() -> Result<Arc<RunCtx>, Box<EvalAltResult>> {
    CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| rt("host function called outside a run"))
}

fn rt(msg: impl Into<String>) -> Box<EvalAltResult> {
    EvalAltResult::ErrorRuntime(Dynamic::from(msg.into()), Position::NONE).into()
}

fn terminated(r: StopReason) -> Box<EvalAltResult> {
    let token = match r {
        StopReason::Deadline => "deadline",
        StopReason::Cancelled => "cancelled",
        StopReason::Failed => "failed",
        StopReason::Skipped => "skipped",
    };
    EvalAltResult::ErrorTerminated(Dynamic::from(token), Position::NONE).into()
}

fn num(d: &Dynamic, what: &str) -> Result<f64, Box<EvalAltResult>> {
    let v = if let Ok(f) = d.as_float() {
        f
    } else if let Ok(i) = d.as_int() {
        i as f64
    } else {
        return Err(rt(format!("{what}: expected a number, found {}", d.type_name())));
    };
    if !v.is_finite() {
        return Err(rt(format!("{what}: expected a finite number, found {v}")));
    }
    Ok(v)
}

/// A GPU index from a script: 0 to 4294967295, never truncated.
fn gpu_arg(g: i64) -> Result<u32, Box<EvalAltResult>> {
    u32::try_from(g).map_err(|_| rt(format!("gpu: expected an index from 0 to {}, found {g}", u32::MAX)))
}

/// A whole number for the agent (MHz, versions): 0 to 4294967295.
fn u32_arg(v: i64, what: &str) -> Result<u32, Box<EvalAltResult>> {
    u32::try_from(v).map_err(|_| rt(format!("{what}: expected 0 to {}, found {v}", u32::MAX)))
}

/// Seconds from a script as milliseconds: finite, not negative, saturating.
fn secs_ms(v: f64, what: &str) -> Result<i64, Box<EvalAltResult>> {
    if !v.is_finite() || v < 0.0 {
        return Err(rt(format!("{what}: expected a finite number of seconds ≥ 0, found {v}")));
    }
    Ok((v * 1000.0).min(i64::MAX as f64) as i64)
}

fn metric_of(name: &str) -> Result<MetricId, Box<EvalAltResult>> {
    metrics::metric_id(name)
        .ok_or_else(|| rt(format!("unknown metric `{name}`: expected one of {}", metrics::metric_names())))
}

fn reading(
    name: &str,
    gpu: Option<u32>,
    node: Option<String>,
    window_secs: f64,
    agg: Agg,
) -> Result<Dynamic, Box<EvalAltResult>> {
    let c = ctx()?;
    let metric = metric_of(name)?;
    let node = match node {
        Some(n) => n,
        None => c.node()?,
    };
    let gpu = if metrics::metric(metric).gpu_scoped { gpu.or(c.target.gpu) } else { None };
    let q = Reading { node, gpu, metric, window_ms: secs_ms(window_secs, "window_secs")?, agg };
    Ok(match c.host.reading(&c, &q) {
        Some(v) => Dynamic::from_float(v),
        None => Dynamic::UNIT,
    })
}

fn fan_points(points: &rhai::Array) -> Result<Vec<FanPoint>, Box<EvalAltResult>> {
    points
        .iter()
        .map(|p| {
            if let Some(arr) = p.read_lock::<rhai::Array>()
                && arr.len() == 2
            {
                return Ok(FanPoint {
                    temp_c: num(&arr[0], "fan point temperature")?,
                    speed_pct: num(&arr[1], "fan point speed")?,
                });
            }
            if let Some(m) = p.read_lock::<Map>() {
                let t = m.get("temp_c").ok_or_else(|| rt("fan point: expected temp_c"))?;
                let s = m.get("speed_pct").ok_or_else(|| rt("fan point: expected speed_pct"))?;
                return Ok(FanPoint { temp_c: num(t, "temp_c")?, speed_pct: num(s, "speed_pct")? });
            }
            Err(rt("fan curve: expected [[temp_c, speed_pct], ...]"))
        })
        .collect()
}

fn act(node: Option<String>, op: Op) -> Result<Map, Box<EvalAltResult>> {
    let c = ctx()?;
    let node = match node {
        Some(n) => n,
        None => c.node()?,
    };
    if let Some(r) = c.check_stop() {
        return Err(terminated(r));
    }
    let result = c.host.act(&c, &node, op);
    // A skip (the condition cleared) ends the run here.
    if let Some(r) = c.check_stop() {
        return Err(terminated(r));
    }
    Ok(result)
}

fn text(kind: TextKind, s: &str) -> Result<(), Box<EvalAltResult>> {
    let c = ctx()?;
    let n = c.notes.fetch_add(1, Ordering::SeqCst);
    if n < c.max_notes {
        c.host.text(&c, kind, s);
    } else if n == c.max_notes {
        c.host.text(&c, TextKind::Note, &format!("note limit of {} reached: further notes dropped", c.max_notes));
    }
    Ok(())
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
    register_api(&mut e);
    e
}

fn register_api(e: &mut Engine) {
    // Readings.
    e.register_fn("metric", |name: &str| reading(name, None, None, 0.0, Agg::Latest));
    e.register_fn("metric", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Avg));
    e.register_fn("metric_max", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Max));
    e.register_fn("metric_min", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Min));
    e.register_fn("metric_slope", |name: &str, w: Dynamic| {
        reading(name, None, None, num(&w, "window_secs")?, Agg::SlopePerMin)
    });
    e.register_fn("gpu_metric", |gpu: i64, name: &str| reading(name, Some(gpu_arg(gpu)?), None, 0.0, Agg::Latest));
    e.register_fn("node_metric", |node: &str, name: &str| {
        reading(name, None, Some(node.to_string()), 0.0, Agg::Latest)
    });
    e.register_fn("gpu", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.gpu_info(&c, &c.node()?, c.gpu()?))
    });
    e.register_fn("gpu", |gpu: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.gpu_info(&c, &c.node()?, gpu_arg(gpu)?))
    });
    e.register_fn("node", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.node_info(&c, &c.node()?))
    });
    e.register_fn("node", |node: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.node_info(&c, node))
    });
    e.register_fn("group_nodes", || -> Result<rhai::Array, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.group_nodes(&c).into_iter().map(Dynamic::from).collect())
    });
    e.register_fn("group_metric", |name: &str| -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        let m = metric_of(name)?;
        Ok(c.host.group_avg(&c, m).map(Dynamic::from_float).unwrap_or(Dynamic::UNIT))
    });
    e.register_fn("event_resolved", || -> Result<bool, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.event_resolved(&c))
    });
    e.register_fn("now", || -> Result<f64, Box<EvalAltResult>> { Ok(ctx()?.clock.now_ms() as f64 / 1000.0) });
    e.register_fn("elapsed", || -> Result<f64, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok((c.clock.now_ms() - c.started_ms) as f64 / 1000.0)
    });

    // GPU actions.
    e.register_fn("set_power_limit", |w: Dynamic| {
        let gpu = ctx()?.gpu()?;
        act(None, Op::SetPowerLimit(SetPowerLimitArgs { gpu, watts: num(&w, "watts")? }))
    });
    e.register_fn("set_power_limit", |gpu: i64, w: Dynamic| {
        act(None, Op::SetPowerLimit(SetPowerLimitArgs { gpu: gpu_arg(gpu)?, watts: num(&w, "watts")? }))
    });
    e.register_fn("set_fan_curve", |points: rhai::Array| {
        let gpu = ctx()?.gpu()?;
        act(None, Op::SetFanCurve(SetFanCurveArgs { gpu, points: fan_points(&points)? }))
    });
    e.register_fn("set_fan_curve", |gpu: i64, points: rhai::Array| {
        act(None, Op::SetFanCurve(SetFanCurveArgs { gpu: gpu_arg(gpu)?, points: fan_points(&points)? }))
    });
    e.register_fn("reset_fan", || act(None, Op::ResetFan(GpuArgs { gpu: ctx()?.gpu()? })));
    e.register_fn("reset_fan", |gpu: i64| act(None, Op::ResetFan(GpuArgs { gpu: gpu_arg(gpu)? })));
    e.register_fn("set_clocks", |lo: i64, hi: i64| {
        let gpu = ctx()?.gpu()?;
        act(
            None,
            Op::SetClocks(SetClocksArgs { gpu, min_mhz: u32_arg(lo, "min_mhz")?, max_mhz: u32_arg(hi, "max_mhz")? }),
        )
    });
    e.register_fn("reset_clocks", || act(None, Op::ResetClocks(GpuArgs { gpu: ctx()?.gpu()? })));
    e.register_fn("clear_ecc", || act(None, Op::ClearEcc(GpuArgs { gpu: ctx()?.gpu()? })));
    e.register_fn("set_gpu_drain", |drained: bool| {
        act(None, Op::SetGpuDrain(SetGpuDrainArgs { gpu: ctx()?.gpu()?, drained }))
    });

    // Node actions.
    e.register_fn("drain", |why: &str| {
        let c = ctx()?;
        act(None, Op::Drain(DrainArgs { reason: why.into(), run: Some(c.run_id.clone()), sticky: false }))
    });
    e.register_fn("drain_sticky", |why: &str| {
        let c = ctx()?;
        act(None, Op::Drain(DrainArgs { reason: why.into(), run: Some(c.run_id.clone()), sticky: true }))
    });
    e.register_fn("drain_node", |node: &str, why: &str| {
        let c = ctx()?;
        act(Some(node.into()), Op::Drain(DrainArgs { reason: why.into(), run: Some(c.run_id.clone()), sticky: false }))
    });
    e.register_fn("resume", || act(None, Op::Resume(ResumeArgs { run: Some(ctx()?.run_id.clone()) })));
    e.register_fn("resume_node", |node: &str| {
        act(Some(node.into()), Op::Resume(ResumeArgs { run: Some(ctx()?.run_id.clone()) }))
    });
    e.register_fn("flush_caches", || act(None, Op::FlushCaches(FlushCachesArgs::default())));
    e.register_fn("config_apply", |name: &str, content: &str| {
        act(None, Op::ConfigApply(ConfigApplyArgs { name: name.into(), content: content.into(), note: None }))
    });
    e.register_fn("config_rollback", |name: &str| {
        act(None, Op::ConfigRollback(ConfigRollbackArgs { name: name.into(), to_version: None }))
    });
    e.register_fn("config_rollback", |name: &str, version: i64| {
        act(
            None,
            Op::ConfigRollback(ConfigRollbackArgs {
                name: name.into(),
                to_version: Some(u32_arg(version, "version")?),
            }),
        )
    });
    e.register_fn("config_mark", |name: &str, version: i64, good: bool| {
        act(None, Op::ConfigMark(ConfigMarkArgs { name: name.into(), version: u32_arg(version, "version")?, good }))
    });
    e.register_fn("config_list", |name: &str| -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.config_list(&c, &c.node()?, name))
    });
    e.register_fn("annotate", |key: &str, value: &str| -> Result<(), Box<EvalAltResult>> {
        let c = ctx()?;
        c.host.annotate(&c, &c.node()?, key, Some(value));
        Ok(())
    });
    e.register_fn("clear_annotation", |key: &str| -> Result<(), Box<EvalAltResult>> {
        let c = ctx()?;
        c.host.annotate(&c, &c.node()?, key, None);
        Ok(())
    });
    e.register_fn("scale_out", |n: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.scale(&c, true, n))
    });
    e.register_fn("scale_in", |n: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.scale(&c, false, n))
    });
    // Holds.
    e.register_fn("release_holds", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        if let Some(r) = c.check_stop() {
            return Err(terminated(r));
        }
        Ok(c.host.release_holds(&c, None))
    });
    e.register_fn("release_holds", |node: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        if let Some(r) = c.check_stop() {
            return Err(terminated(r));
        }
        Ok(c.host.release_holds(&c, Some(node)))
    });
    e.register_fn("keep_holds", |secs: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let secs = u64::try_from(secs)
            .ok()
            .filter(|s| (1..=86_400).contains(s))
            .ok_or_else(|| rt(format!("keep_holds: expected a lease of 1 to 86400 seconds, found {secs}")))?;
        Ok(c.host.keep_holds(&c, secs))
    });
    e.register_fn("holds", || -> Result<rhai::Array, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.holds(&c, &c.node()?))
    });
    e.register_fn("holds", |node: &str| -> Result<rhai::Array, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.holds(&c, node))
    });

    // Control.
    // Typed, so they replace Rhai's built-in `sleep`, which would block the
    // thread on the wall clock.
    e.register_fn("sleep", |secs: i64| -> Result<(), Box<EvalAltResult>> {
        ctx()?.sleep_ms(secs.saturating_mul(1000))
    });
    e.register_fn("sleep", |secs: f64| -> Result<(), Box<EvalAltResult>> { ctx()?.sleep_ms(secs_ms(secs, "sleep")?) });
    e.register_fn("wait_until", |nc: NativeCallContext<'_>, f: FnPtr, timeout: Dynamic| {
        wait_until(&nc, &f, &timeout, 5.0)
    });
    e.register_fn("wait_until", |nc: NativeCallContext<'_>, f: FnPtr, timeout: Dynamic, poll: Dynamic| {
        let poll = num(&poll, "poll_secs")?;
        wait_until(&nc, &f, &timeout, poll)
    });
    e.register_fn("note", |s: &str| text(TextKind::Note, s));
    e.register_fn("notify", |s: &str| text(TextKind::Notify, s));
    e.register_fn("escalate", |s: &str| text(TextKind::Escalate, s));
    e.register_fn("fail", |s: &str| -> Result<(), Box<EvalAltResult>> {
        let c = ctx()?;
        *c.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.to_string());
        c.set_stop(StopReason::Failed);
        Err(terminated(StopReason::Failed))
    });
}

fn wait_until(
    nc: &NativeCallContext<'_>,
    f: &FnPtr,
    timeout: &Dynamic,
    poll_secs: f64,
) -> Result<bool, Box<EvalAltResult>> {
    let c = ctx()?;
    let timeout_ms = secs_ms(num(timeout, "timeout_secs")?, "timeout_secs")?;
    let poll_ms = secs_ms(poll_secs.max(0.1), "poll_secs")?;
    let end = c.clock.now_ms().saturating_add(timeout_ms);
    loop {
        let ok: bool = f.call_within_context(nc, ())?;
        if ok {
            return Ok(true);
        }
        let now = c.clock.now_ms();
        if now >= end {
            return Ok(false);
        }
        c.sleep_ms(poll_ms.min(end - now))?;
    }
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
