//! The host API a runbook script calls: readings, actions (sent as holds
//! through the run's [`ScriptHost`]), holds, control. Numbers from scripts
//! are checked here — finite, in range, never truncated — before anything
//! reaches an agent.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rhai::{Dynamic, Engine, EvalAltResult, FnPtr, Map, NativeCallContext};

use nightshift_proto::*;

use super::{Agg, CURRENT, Reading, RunCtx, StopReason, TextKind, rt, terminated};
use crate::base::metrics::{self, MetricId};

pub(super) fn ctx() -> Result<Arc<RunCtx>, Box<EvalAltResult>> {
    CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| rt("host function called outside a run"))
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

fn mark_kind(name: &str) -> Result<MarkKind, Box<EvalAltResult>> {
    match name {
        "no_pack" | "no-pack" => Ok(MarkKind::NoPack),
        "quarantine" => Ok(MarkKind::Quarantine),
        other => Err(rt(format!("mark: unknown mark `{other}`: expected no_pack or quarantine"))),
    }
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
    c.observe_window(&q.node, q.window_ms)?;
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

/// Many actions at once (group runs). The answer is flat — arrays of
/// strings, not a map per node — so a large group stays inside the script's
/// size limits (which count every string it holds): `#{ok: [nodes done],
/// refused: [nodes not done], codes: [why, one per refused node],
/// errors: #{code: the first message with that code}}`.
fn act_many(actions: Vec<(String, Op)>) -> Result<Map, Box<EvalAltResult>> {
    let c = ctx()?;
    if let Some(r) = c.check_stop() {
        return Err(terminated(r));
    }
    let nodes: Vec<String> = actions.iter().map(|(n, _)| n.clone()).collect();
    let results = c.host.act_many(&c, actions);
    if let Some(r) = c.check_stop() {
        return Err(terminated(r));
    }
    let (mut ok, mut refused, mut codes, mut errors) = (Vec::new(), Vec::new(), Vec::new(), Map::new());
    for (node, r) in nodes.into_iter().zip(results) {
        let field = |k: &str| r.get(k).map(|v| v.to_string()).unwrap_or_default();
        if r.get("ok").and_then(|v| v.as_bool().ok()) == Some(true) {
            ok.push(Dynamic::from(node));
        } else {
            let code = field("code");
            errors.entry(code.as_str().into()).or_insert_with(|| Dynamic::from(format!("{node}: {}", field("error"))));
            codes.push(Dynamic::from(code));
            refused.push(Dynamic::from(node));
        }
    }
    let mut m = Map::new();
    m.insert("ok".into(), Dynamic::from_array(ok));
    m.insert("refused".into(), Dynamic::from_array(refused));
    m.insert("codes".into(), Dynamic::from_array(codes));
    m.insert("errors".into(), Dynamic::from_map(errors));
    Ok(m)
}

fn text(kind: TextKind, s: &str) -> Result<(), Box<EvalAltResult>> {
    sized_text(kind, s, None)
}

fn sized_text(kind: TextKind, s: &str, size: Option<f64>) -> Result<(), Box<EvalAltResult>> {
    let c = ctx()?;
    let n = c.notes.fetch_add(1, Ordering::SeqCst);
    if n < c.max_notes {
        c.host.text(&c, kind, s, size);
    } else if n == c.max_notes {
        c.host.text(&c, TextKind::Note, &format!("note limit of {} reached: further notes dropped", c.max_notes), None);
    }
    Ok(())
}

/// `notify(text, size)`: the finding's size (larger is worse), a finite
/// number — `()` (a signal that is absent) tells it without one.
fn notify_sized(s: &str, size: &Dynamic) -> Result<(), Box<EvalAltResult>> {
    if size.is_unit() {
        return sized_text(TextKind::Notify, s, None);
    }
    sized_text(TextKind::Notify, s, Some(num(size, "notify's size")?))
}

/// Register every host function on `e`.
pub(super) fn register(e: &mut Engine) {
    // Readings.
    e.register_fn("metric", |name: &str| reading(name, None, None, 0.0, Agg::Latest));
    e.register_fn("metric", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Avg));
    e.register_fn("metric_max", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Max));
    e.register_fn("metric_min", |name: &str, w: Dynamic| reading(name, None, None, num(&w, "window_secs")?, Agg::Min));
    // A metric between two moments: `metric_stats(name, from_secs_ago,
    // to_secs_ago)` → #{count, min, max, avg} (the window the manifest's
    // `history_secs` keeps).
    e.register_fn("metric_stats", |name: &str, from: Dynamic, to: Dynamic| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let m = metric_of(name)?;
        let from_ago = secs_ms(num(&from, "from_secs_ago")?, "from_secs_ago")?;
        let to_ago = secs_ms(num(&to, "to_secs_ago")?, "to_secs_ago")?;
        let gpu = if metrics::metric(m).gpu_scoped { c.target.gpu } else { None };
        let node = c.node()?;
        c.observe_window(&node, from_ago.max(to_ago))?;
        let now = c.clock.now_ms();
        let (from_ms, to_ms) = (now.saturating_sub(from_ago), now.saturating_sub(to_ago));
        Ok(c.host.stats_between(&c, &node, gpu, m, from_ms.min(to_ms), to_ms.max(from_ms)))
    });
    // Temperature against load over a window: #{per_min, per_kw, samples,
    // power_range_watts} — the drift the load does not explain.
    e.register_fn("thermal_fit", |w: Dynamic| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let window = secs_ms(num(&w, "window_secs")?, "window_secs")?;
        let node = c.node()?;
        c.observe_window(&node, window)?;
        Ok(c.host.thermal_fit(&c, &node, c.gpu()?, window))
    });
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
        act(None, Op::SetGpuDrain(SetGpuDrainArgs { gpu: ctx()?.gpu()?, drained, sticky: false, repair: false }))
    });
    // The target GPU out for a fault, with no lease: its repair (a passing
    // health check, the repair lifecycle) or a person ends it — never a
    // timer, never a person's resume of the node alone.
    e.register_fn("drain_gpu_repair", || {
        act(None, Op::SetGpuDrain(SetGpuDrainArgs { gpu: ctx()?.gpu()?, drained: true, sticky: true, repair: true }))
    });
    // The same for an RMA: only a person ends it.
    e.register_fn("drain_gpu_sticky", || {
        act(None, Op::SetGpuDrain(SetGpuDrainArgs { gpu: ctx()?.gpu()?, drained: true, sticky: true, repair: false }))
    });

    // Node actions.
    let drain_args = |why: &str, run: &str, sticky: bool, repair: bool| DrainArgs {
        reason: why.into(),
        run: Some(run.to_string()),
        sticky,
        repair,
    };
    e.register_fn("drain", move |why: &str| {
        let c = ctx()?;
        act(None, Op::Drain(drain_args(why, &c.run_id, false, false)))
    });
    // An RMA drain: only a person releases it.
    e.register_fn("drain_sticky", move |why: &str| {
        let c = ctx()?;
        act(None, Op::Drain(drain_args(why, &c.run_id, true, false)))
    });
    // A repair drain: no lease; a passing health check (or a person) ends it.
    e.register_fn("drain_repair", move |why: &str| {
        let c = ctx()?;
        act(None, Op::Drain(drain_args(why, &c.run_id, true, true)))
    });
    e.register_fn("drain_node", move |node: &str, why: &str| {
        let c = ctx()?;
        act(Some(node.into()), Op::Drain(drain_args(why, &c.run_id, false, false)))
    });
    e.register_fn("drain_nodes", move |nodes: rhai::Array, why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let mut actions = Vec::with_capacity(nodes.len());
        for n in nodes {
            let node =
                n.into_string().map_err(|t| format!("drain_nodes: expected an array of node names, found {t}"))?;
            actions.push((node, Op::Drain(drain_args(why, &c.run_id, false, false))));
        }
        act_many(actions)
    });
    e.register_fn("resume_nodes", |nodes: rhai::Array| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        let mut actions = Vec::with_capacity(nodes.len());
        for n in nodes {
            let node =
                n.into_string().map_err(|t| format!("resume_nodes: expected an array of node names, found {t}"))?;
            actions.push((node, Op::Resume(ResumeArgs { run: Some(c.run_id.clone()) })));
        }
        act_many(actions)
    });
    e.register_fn("resume", || act(None, Op::Resume(ResumeArgs { run: Some(ctx()?.run_id.clone()) })));
    e.register_fn("resume_node", |node: &str| {
        act(Some(node.into()), Op::Resume(ResumeArgs { run: Some(ctx()?.run_id.clone()) }))
    });
    // Signals the GPU processes that registered; the page cache only when
    // asked (`flush_caches(#{drop_page_cache: true})`).
    e.register_fn("flush_caches", || act(None, Op::FlushCaches(FlushCachesArgs::default())));
    e.register_fn("flush_caches", |opts: Map| {
        let flag = |k: &str, d: bool| -> Result<bool, Box<EvalAltResult>> {
            match opts.get(k) {
                None => Ok(d),
                Some(v) => v.as_bool().map_err(|t| rt(format!("flush_caches: {k}: expected true or false, found {t}"))),
            }
        };
        for k in opts.keys() {
            if !matches!(k.as_str(), "drop_page_cache" | "signal_processes") {
                return Err(rt(format!(
                    "flush_caches: unknown option `{k}`: expected drop_page_cache or signal_processes"
                )));
            }
        }
        act(
            None,
            Op::FlushCaches(FlushCachesArgs {
                drop_page_cache: flag("drop_page_cache", false)?,
                signal_processes: flag("signal_processes", true)?,
            }),
        )
    });
    // Chassis fans through the BMC (boards without GPU fans).
    e.register_fn("set_chassis_fans", |full: bool| act(None, Op::SetChassisFans(SetChassisFansArgs { full })));
    // Scheduler marks: `no_pack` (place no more work), `quarantine`.
    e.register_fn("mark", |name: &str, why: &str| {
        act(None, Op::Mark(MarkArgs { mark: mark_kind(name)?, set: true, reason: Some(why.into()) }))
    });
    e.register_fn("unmark", |name: &str| {
        act(None, Op::Mark(MarkArgs { mark: mark_kind(name)?, set: false, reason: None }))
    });
    // A drain stops new work; this moves the running jobs elsewhere.
    // The run's GPU goes with it: on a node a person drained, the agent
    // moves the jobs only off a GPU it sees broken.
    e.register_fn("requeue", |why: &str| {
        let gpu = ctx()?.target.gpu;
        act(None, Op::Requeue(RequeueArgs { reason: why.into(), gpu }))
    });
    e.register_fn("config_apply", |name: &str, content: &str| {
        act(
            None,
            Op::ConfigApply(ConfigApplyArgs {
                name: name.into(),
                content: content.into(),
                note: None,
                restart_consumer: true,
            }),
        )
    });
    e.register_fn("config_rollback", |name: &str| {
        act(
            None,
            Op::ConfigRollback(ConfigRollbackArgs { name: name.into(), to_version: None, restart_consumer: true }),
        )
    });
    e.register_fn("config_rollback", |name: &str, version: i64| {
        act(
            None,
            Op::ConfigRollback(ConfigRollbackArgs {
                name: name.into(),
                to_version: Some(u32_arg(version, "version")?),
                restart_consumer: true,
            }),
        )
    });
    e.register_fn("config_mark", |name: &str, version: i64, good: bool| {
        act(None, Op::ConfigMark(ConfigMarkArgs { name: name.into(), version: u32_arg(version, "version")?, good }))
    });
    e.register_fn("config_list", |name: &str| -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.config_list(&c, &c.node()?, Some(name)))
    });
    // Every managed config of the node (NCCL environment, fabric manager…).
    e.register_fn("configs", || -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.config_list(&c, &c.node()?, None))
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
    // The repair lifecycle of the run's GPU.
    e.register_fn("fault", || -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        let m = c.host.fault(&c);
        Ok(if m.is_empty() { Dynamic::UNIT } else { Dynamic::from_map(m) })
    });
    e.register_fn("declare_fault", |kind: &str, detail: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.declare_fault(&c, kind, None, detail))
    });
    e.register_fn("declare_fault", |kind: &str, xid: i64, detail: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.declare_fault(&c, kind, Some(u32_arg(xid, "xid")?), detail))
    });
    e.register_fn("quarantine", |why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.health_to(&c, "quarantined", why))
    });
    e.register_fn("await_repair", |what: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.health_to(&c, "awaiting_repair", what))
    });
    e.register_fn("rma", |why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.health_to(&c, "rma", why))
    });
    e.register_fn("health_check", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.health_check(&c, &c.node()?))
    });
    e.register_fn("health_check", |node: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.health_check(&c, node))
    });
    // RMA evidence of the run's GPU (or node): `#{ok, bundle, sha256, dir}`
    // or `#{ok: false, error}`; audited either way.
    e.register_fn("collect_evidence", |why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.collect_evidence(&c, why))
    });
    // The average of a metric over the nodes named (a pool judged on the
    // nodes that served before a scale-out, not diluted by idle new ones).
    e.register_fn("nodes_metric", |nodes: rhai::Array, name: &str| -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        let m = metric_of(name)?;
        let nodes: Vec<String> = nodes.into_iter().filter_map(|n| n.into_string().ok()).collect();
        Ok(c.host.nodes_avg(&c, &nodes, m).map(Dynamic::from_float).unwrap_or(Dynamic::UNIT))
    });
    e.register_fn("scale_out", |n: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.scale(&c, true, n))
    });
    // The XID policy in force (shipped table and site overrides) on a code.
    e.register_fn("xid_info", |code: i64| -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        let m = u32::try_from(code).map(|x| c.host.xid_info(&c, x)).unwrap_or_default();
        Ok(if m.is_empty() { Dynamic::UNIT } else { Dynamic::from_map(m) })
    });
    // The XIDs repeating on the run's GPU past the XID policy's rule.
    e.register_fn("xid_repeats", || -> Result<rhai::Array, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.xid_repeats(&c))
    });
    // The scheduler's queue for the run's group: `#{known, jobs, gpus, from}`.
    e.register_fn("pool_pending", || -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.pool_pending(&c))
    });
    // Why this run is one node of a shared cause (its runbook's breaker
    // tripped: a rack's cooling, a push), now; `()` when it is not. A run
    // can be marked after it started: ask before a step that tests the
    // hardware (releasing a cap to see whether the GPU still needs it).
    e.register_fn("shared_cause", || -> Result<Dynamic, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.shared_cause(&c).map(Dynamic::from).unwrap_or(Dynamic::UNIT))
    });
    // A node powered up that did not boot: scale-out skips it until it
    // reports (a person looks at it).
    e.register_fn("boot_failed", |node: &str, why: &str| -> Result<(), Box<EvalAltResult>> {
        let c = ctx()?;
        c.host.boot_failed(&c, node, why);
        Ok(())
    });
    e.register_fn("scale_in", |n: i64| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.scale(&c, false, n))
    });
    // The autoscaler webhook (H4 beyond known standby nodes).
    e.register_fn("autoscale_out", |n: i64, why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.autoscale(&c, true, n, why))
    });
    e.register_fn("autoscale_in", |n: i64, why: &str| -> Result<Map, Box<EvalAltResult>> {
        let c = ctx()?;
        Ok(c.host.autoscale(&c, false, n, why))
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
    e.register_fn("notify", |s: &str, size: Dynamic| notify_sized(s, &size));
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
