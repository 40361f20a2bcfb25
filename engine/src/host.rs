//! What a running script reaches: [`Host`] implements the script host API
//! for one run over the engine's [`Core`] — readings from the telemetry
//! store, and changes sent to agents as holds owned by the run, each with
//! its intent audited (durably) before it leaves and its result after.
//!
//! A change is refused, audited, when it aims outside the run's target, at
//! a hands-off node, past the blast radius or `max_nodes_changed`, from an
//! `observe` runbook, or as a sticky drain the manifest did not declare.
//! Before a run's first change its trigger's condition is checked again:
//! cleared, the run ends `skipped`. In a dry run, notifications and
//! annotations are audited as what would have happened, and nothing else.

use std::sync::Arc;

use rhai::{Dynamic, Map};
use serde_json::{Value, json};

use nightshift_proto::owner::owned_by_nightshift;
use nightshift_proto::{ConfigListArgs, HoldValue, NoArgs, Op, Outcome, ReleaseArgs, RenewArgs, Request};

use crate::audit::{NewRecord, RecordKind};
use crate::core::{Core, hold_lease_secs};
use crate::health::{HealthState, Transition};
use crate::manifest::{Manifest, RunClass, Scope};
use crate::metrics::{self, METRICS, MetricId};
use crate::runs::RunSummary;
use crate::script::{Agg, Reading, RunCtx, ScriptHost, TextKind};

/// The host for one run.
pub struct Host {
    core: Arc<Core>,
    run: String,
    /// The runbook as the run started with it (a reload mid-run changes
    /// nothing for this run).
    manifest: Manifest,
}

fn to_map(v: Value) -> Map {
    rhai::serde::to_dynamic(v).ok().and_then(|d| d.try_cast::<Map>()).unwrap_or_default()
}

fn refused(code: &str, message: &str) -> Map {
    to_map(json!({"ok": false, "outcome": "refused", "code": code, "error": message, "applied": false}))
}

/// Whether a mutating op places a hold (and so gets the run's lease).
fn places_hold(op: &Op) -> bool {
    matches!(
        op,
        Op::SetPowerLimit(_)
            | Op::SetFanCurve(_)
            | Op::SetClocks(_)
            | Op::SetGpuDrain(_)
            | Op::Resume(_)
            | Op::ConfigApply(_)
            | Op::ConfigRollback(_)
    ) || matches!(op, Op::Drain(a) if !a.sticky)
}

fn gpu_of(op: &Op) -> Option<u32> {
    match op {
        Op::SetPowerLimit(a) => Some(a.gpu),
        Op::SetFanCurve(a) => Some(a.gpu),
        Op::ResetFan(a) | Op::ResetClocks(a) | Op::ClearEcc(a) => Some(a.gpu),
        Op::SetClocks(a) => Some(a.gpu),
        Op::SetGpuDrain(a) => Some(a.gpu),
        _ => None,
    }
}

impl Host {
    pub fn new(core: Arc<Core>, run: &str, manifest: Manifest) -> Host {
        Host { core, run: run.to_string(), manifest }
    }

    fn summary(&self) -> Option<RunSummary> {
        self.core.table().runs.get(&self.run).map(|r| r.summary.clone())
    }

    fn manifest(&self) -> Option<Manifest> {
        Some(self.manifest.clone())
    }

    fn record(&self, ctx: &RunCtx, kind: RecordKind, node: Option<&str>, gpu: Option<u32>, data: Value) {
        let rec = NewRecord::new(kind, "engine", data).run(&self.run).node(node).gpu(gpu).runbook(&ctx.runbook);
        if let Err(e) = self.core.audit.append_blocking(rec, self.summary()) {
            tracing::error!(run = %self.run, error = %e, "cannot audit from a script");
        }
    }

    /// Nodes this run may act on.
    fn in_target(&self, ctx: &RunCtx, node: &str) -> bool {
        match (&ctx.target.node, &ctx.target.group) {
            (Some(n), _) => n == node,
            (None, Some((k, v))) => self.core.fleet.get(node).is_some_and(|n| n.label(k) == Some(v.as_str())),
            _ => false,
        }
    }

    fn refuse(&self, ctx: &RunCtx, node: &str, op: &Op, code: &str, message: String) -> Map {
        self.record(
            ctx,
            RecordKind::Refusal,
            Some(node),
            gpu_of(op),
            json!({"op": op.name(), "code": code, "reason": message}),
        );
        refused(code, &message)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.core.handle.block_on(f)
    }

    /// Checks that come before any change; `Err` is the refusal (or a skip).
    fn admit_change(&self, ctx: &RunCtx, node: &str, op: &Op, m: &Manifest) -> Result<(), Map> {
        if !self.in_target(ctx, node) {
            return Err(self.refuse(
                ctx,
                node,
                op,
                "outside_target",
                format!("run {} targets {}; refusing to act on {node} outside it", self.run, ctx.target),
            ));
        }
        let Some(n) = self.core.fleet.get(node) else {
            return Err(self.refuse(ctx, node, op, "unknown_node", format!("{node} is not in the inventory")));
        };
        if m.class == RunClass::Observe {
            return Err(self.refuse(
                ctx,
                node,
                op,
                "observe_only",
                format!("runbook {} is `class: observe`: it reads, notes and notifies, and changes nothing", m.name),
            ));
        }
        if n.state().hands_off() {
            // A person is working on the node: nothing acts until the marker
            // goes; then the ladder goes on from where the node is. (The
            // run's deadline still ends it.)
            self.record(
                ctx,
                RecordKind::Note,
                Some(node),
                gpu_of(op),
                json!({"text": format!("{node} is hands-off (maintenance): {} waits until the marker goes", op.name())}),
            );
            while n.state().hands_off() {
                if ctx.sleep_ms(HANDS_OFF_POLL_MS).is_err() {
                    return Err(self.refuse(
                        ctx,
                        node,
                        op,
                        "hands_off",
                        format!("node {node} stayed hands-off (maintenance) until the run ended"),
                    ));
                }
            }
            // The person is done: go on only if the fault is still there;
            // else the run ends and its holds go.
            if let Some(s) = self.summary()
                && s.trigger != "manual"
                && let Some((false, why)) = self.core.condition_holds(&self.manifest, &s)
            {
                let why = format!("the condition cleared while {node} was hands-off: {why}");
                self.record(ctx, RecordKind::Note, Some(node), gpu_of(op), json!({"text": why}));
                ctx.skip(&why);
                return Err(refused("skipped", &why));
            }
        }
        if let Op::Drain(a) = op
            && a.sticky
            && !m.sticky_drain
        {
            return Err(self.refuse(
                ctx,
                node,
                op,
                "not_declared",
                format!(
                    "runbook {} may not place a sticky drain: declare `sticky_drain: true` in its manifest",
                    m.name
                ),
            ));
        }
        if ctx.dry_run {
            return Ok(());
        }
        let (acted, nodes, params) = match self.core.table().runs.get(&self.run) {
            Some(r) => (r.acted, r.summary.nodes.clone(), r.summary.params.clone()),
            None => (true, Vec::new(), Default::default()),
        };
        // The run's own cap: `max_nodes_changed`, or under it the value of
        // its `nodes_changed_param` (what its approval counted).
        if m.scope == Scope::Group
            && let Some(cap) = m.max_nodes_changed.map(|_| crate::admission::nodes_changed(m, usize::MAX, &params))
            && !nodes.iter().any(|x| x == node)
            && nodes.len() as u32 >= cap
        {
            return Err(self.refuse(
                ctx,
                node,
                op,
                "max_nodes_changed",
                format!(
                    "run {} already changed {} node(s) (max_nodes_changed {cap}); not {node}",
                    self.run,
                    nodes.len()
                ),
            ));
        }
        if m.exclusive && ctx.target.node.is_none() {
            let mut t = self.core.table();
            match t.node_locks.get(node) {
                Some(holder) if holder != &self.run => {
                    let why = format!("node {node} is busy with exclusive run {holder}");
                    drop(t);
                    return Err(self.refuse(ctx, node, op, "node_busy", why));
                }
                _ => {
                    t.node_locks.insert(node.to_string(), self.run.clone());
                }
            }
        }
        if !acted {
            // Re-check before the first change: the condition may have
            // cleared while the run waited or watched.
            if let Some(s) = self.summary()
                && s.trigger != "manual"
                && let Some((false, why)) = self.core.condition_holds(&self.manifest, &s)
            {
                let why = format!("the condition cleared before the first change: {why}");
                self.record(ctx, RecordKind::Note, Some(node), gpu_of(op), json!({"text": why}));
                ctx.skip(&why);
                return Err(refused("skipped", &why));
            }
            if let Some(r) = self.core.table().runs.get_mut(&self.run) {
                r.acted = true;
            }
        }
        Ok(())
    }
}

/// How often a run waiting on a hands-off node looks again.
const HANDS_OFF_POLL_MS: i64 = 10_000;

/// The annotation that says nightshift powered a node up (scale-in powers
/// down only those).
const POWER_MARK: &str = "power";

impl Host {
    /// Power `node` up or down through a connected peer of its group (the
    /// scheduler's power saving), audited like any action; the node's
    /// `power` annotation says nightshift did it.
    fn power(&self, ctx: &RunCtx, label: &str, value: &str, node: &str, up: bool) -> Result<(), String> {
        let peers = self.core.fleet.group(label, value);
        let Some(peer) = peers
            .iter()
            .filter(|p| p.spec.name != node || !up)
            .find(|p| p.state().connected && !p.state().hands_off())
            .map(|p| p.spec.name.clone())
        else {
            return Err(format!("no connected node of {label}={value} can reach the scheduler to power {node}"));
        };
        let r = self.act(ctx, &peer, Op::PowerNode(nightshift_proto::PowerNodeArgs { node: node.to_string(), up }));
        let ok = r.get("ok").and_then(|d| d.as_bool().ok()) == Some(true);
        if !ok {
            return Err(r.get("error").map(|e| e.to_string()).unwrap_or_else(|| "refused".into()));
        }
        let text = format!("powered {} by run {}", if up { "up" } else { "down" }, self.run);
        self.annotate(ctx, node, POWER_MARK, if up { Some(&text) } else { None });
        Ok(())
    }

    /// Note a lifecycle phase (jobs requeued) on every GPU of `node` this
    /// run is handling a fault for.
    fn lifecycle_phase(&self, ctx: &RunCtx, node: &str, phase: &str) {
        if ctx.dry_run {
            return;
        }
        let gpus: Vec<(u32, HealthState)> = self
            .core
            .health()
            .node_gpus(node)
            .filter(|(_, h)| h.run.as_deref() == Some(self.run.as_str()) && h.lifecycle.is_some())
            .map(|(g, h)| (g, h.state))
            .collect();
        for (gpu, state) in gpus {
            let t = Transition {
                node: node.to_string(),
                gpu,
                from: state,
                to: state,
                by: self.run.clone(),
                why: format!("{phase} by run {}", self.run),
                run: Some(self.run.clone()),
                phase: Some(phase.to_string()),
                ..Transition::default()
            };
            self.record_transition(ctx, &t);
        }
    }

    fn record_transition(&self, ctx: &RunCtx, t: &Transition) {
        let rec = t.record("engine").runbook(&ctx.runbook);
        match self.core.audit.append_blocking(rec, self.summary()) {
            Ok(r) => self.core.health().replay(&r),
            Err(e) => tracing::error!(run = %self.run, error = %e, "cannot audit a health change"),
        }
    }

    fn target_gpu(&self, ctx: &RunCtx) -> Option<(String, u32)> {
        Some((ctx.target.node.clone()?, ctx.target.gpu?))
    }
}

impl ScriptHost for Host {
    fn fault(&self, ctx: &RunCtx) -> Map {
        let Some((node, gpu)) = self.target_gpu(ctx) else { return Map::new() };
        let now = self.core.now();
        let model = self.core.health();
        let Some(h) = model.get(&node, gpu) else { return Map::new() };
        let repairs = model.repairs_in_window(&node, gpu, now);
        let repeat = model.repeat_offender(&node, gpu, now);
        let f = h.fault.clone();
        let xid = f.as_ref().and_then(|f| f.xid);
        let info = xid.and_then(crate::health::xid_info);
        to_map(json!({
            "state": h.state.as_str(),
            "kind": f.as_ref().map(|f| f.kind.as_str()),
            "xid": xid,
            "detail": f.as_ref().map(|f| f.detail.clone()),
            "meaning": info.map(|i| i.meaning),
            "action": info.map(|i| i.action.as_str()),
            "evidence": f.as_ref().map(|f| f.evidence),
            "remap_pending": f.as_ref().is_some_and(|f| f.evidence.remap_pending),
            "remap_failure": f.as_ref().is_some_and(|f| f.evidence.remap_failure),
            "dbe_total": f.as_ref().map(|f| f.evidence.dbe_total),
            "repairs_in_window": repairs,
            "repeat_offender": repeat,
            "run": h.run,
        }))
    }

    fn health_to(&self, ctx: &RunCtx, to: &str, text: &str) -> Map {
        let Some((node, gpu)) = self.target_gpu(ctx) else {
            return refused("not_gpu", "the repair lifecycle is about a GPU: the run's target has none");
        };
        let to = match to {
            "quarantined" => HealthState::Quarantined,
            "awaiting_repair" => HealthState::AwaitingRepair,
            "rma" => HealthState::Rma,
            other => return refused("bad_state", &format!("unknown health state `{other}`")),
        };
        let from = self.core.health().state(&node, gpu);
        let allowed = match to {
            HealthState::Quarantined => matches!(from, HealthState::Faulted),
            HealthState::AwaitingRepair => matches!(from, HealthState::Quarantined | HealthState::Faulted),
            HealthState::Rma => from != HealthState::Rma,
            _ => false,
        };
        if !allowed {
            return to_map(json!({"ok": false, "from": from.as_str(), "to": to.as_str(),
                "error": format!("{node} GPU {gpu} is {}: it does not move to {}", from.as_str(), to.as_str())}));
        }
        if ctx.dry_run {
            self.record(ctx, RecordKind::Note, Some(&node), Some(gpu),
                json!({"text": format!("dry run: would move {node} GPU {gpu} from {} to {} ({text})", from.as_str(), to.as_str())}));
            return to_map(json!({"ok": true, "dry_run": true, "from": from.as_str(), "to": to.as_str()}));
        }
        let t = Transition {
            node: node.clone(),
            gpu,
            from,
            to,
            by: self.run.clone(),
            why: text.chars().take(1000).collect(),
            instruction: (to != HealthState::Quarantined).then(|| text.chars().take(1000).collect()),
            run: Some(self.run.clone()),
            ..Transition::default()
        };
        self.record_transition(ctx, &t);
        to_map(json!({"ok": true, "from": from.as_str(), "to": to.as_str()}))
    }

    fn declare_fault(&self, ctx: &RunCtx, kind: &str, xid: Option<u32>, detail: &str) -> Map {
        let Some((node, gpu)) = self.target_gpu(ctx) else {
            return refused("not_gpu", "a fault is about a GPU: the run's target has none");
        };
        let Some(kind) = crate::health::FaultKind::parse(kind) else {
            return refused("bad_kind", &format!("unknown fault kind `{kind}`"));
        };
        let from = self.core.health().state(&node, gpu);
        if !matches!(from, HealthState::Healthy | HealthState::Verifying) || ctx.dry_run {
            return self.fault(ctx);
        }
        let now = self.core.now();
        let t = Transition {
            node: node.clone(),
            gpu,
            from,
            to: HealthState::Faulted,
            fault: Some(crate::health::Fault {
                kind,
                xid,
                detail: detail.chars().take(500).collect(),
                evidence: Default::default(),
                seen_ms: now,
            }),
            by: self.run.clone(),
            why: format!("{}: {detail}", kind.as_str()),
            run: Some(self.run.clone()),
            ..Transition::default()
        };
        self.record_transition(ctx, &t);
        self.fault(ctx)
    }

    fn health_check(&self, _ctx: &RunCtx, node: &str) -> Map {
        let Some(n) = self.core.fleet.get(node) else { return refused("unknown_node", node) };
        let engine = crate::engine::Engine::from_core(self.core.clone());
        match self.block_on(engine.health_check_call(&n)) {
            Ok(c) => to_map(json!({"ok": c.ok, "failures": c.failures(), "check": c})),
            Err(e) => to_map(json!({"ok": false, "failures": [e.clone()], "error": e})),
        }
    }

    fn stats_between(
        &self,
        _ctx: &RunCtx,
        node: &str,
        gpu: Option<u32>,
        metric: MetricId,
        from_ms: i64,
        to_ms: i64,
    ) -> Map {
        let Some(n) = self.core.fleet.get(node) else { return Map::new() };
        let gpus: Vec<Option<u16>> = match (metrics::metric(metric).gpu_scoped, gpu) {
            (true, Some(g)) => vec![u16::try_from(g).ok()],
            (true, None) => (0..n.state().gpu_count()).map(|g| u16::try_from(g).ok()).collect(),
            (false, _) => vec![None],
        };
        let b = self.core.brain();
        let mut pts: Vec<f64> = Vec::new();
        for g in gpus {
            let key = crate::telemetry::SeriesKey { node: n.idx, gpu: g, metric };
            pts.extend(b.store.window(key, from_ms).into_iter().filter(|(t, _)| *t <= to_ms).map(|(_, v)| v));
        }
        if pts.is_empty() {
            return to_map(json!({"count": 0}));
        }
        let min = pts.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = pts.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let avg = pts.iter().sum::<f64>() / pts.len() as f64;
        let r2 = |v: f64| (v * 100.0).round() / 100.0;
        to_map(json!({"count": pts.len(), "min": r2(min), "max": r2(max), "avg": r2(avg)}))
    }

    fn thermal_fit(&self, _ctx: &RunCtx, node: &str, gpu: u32, window_ms: i64) -> Map {
        let Some(n) = self.core.fleet.get(node) else { return Map::new() };
        let Ok(g) = u16::try_from(gpu) else { return Map::new() };
        let now = self.core.now();
        let mut since = now.saturating_sub(window_ms);
        // Judge the cooling only since its airflow last changed abruptly
        // (chassis fans set or released, a GPU fan command): the
        // temperatures before were made by other cooling, and the step
        // would read as a drift. Five minutes for the heatsink to settle.
        let airflow_step = {
            let b = self.core.brain();
            let gpu_fan = b
                .store
                .window(crate::telemetry::SeriesKey { node: n.idx, gpu: Some(g), metric: metrics::ids::FAN }, since);
            let chassis = b.store.window(
                crate::telemetry::SeriesKey { node: n.idx, gpu: None, metric: metrics::ids::CHASSIS_FAN },
                since,
            );
            [crate::thermal::last_airflow_step(&gpu_fan, 5.0), crate::thermal::last_airflow_step(&chassis, 5.0)]
                .into_iter()
                .flatten()
                .max()
        };
        if let Some(step) = airflow_step {
            since = since.max(step + 300_000);
            if now - since < window_ms / 2 {
                return to_map(json!({
                    "per_min": (),
                    "airflow_changed_secs_ago": (now - step) / 1000,
                }));
            }
        }
        let (temps, power) = {
            let b = self.core.brain();
            let key = |metric| crate::telemetry::SeriesKey { node: n.idx, gpu: Some(g), metric };
            (b.store.window(key(metrics::ids::TEMPERATURE), since), b.store.window(key(metrics::ids::POWER), since))
        };
        match crate::thermal::fit(&temps, &power) {
            Some(f) => to_map(json!({
                "window_secs": (now - since) / 1000,
                "per_min": (f.per_min * 1000.0).round() / 1000.0,
                "per_kw": (f.per_kw * 10.0).round() / 10.0,
                "samples": f.samples,
                "power_range_watts": f.power_range_watts.round(),
                "lag_secs": f.tau_secs,
            })),
            None => Map::new(),
        }
    }

    fn nodes_avg(&self, _ctx: &RunCtx, nodes: &[String], metric: MetricId) -> Option<f64> {
        let mut vals = Vec::new();
        for name in nodes {
            let Some(n) = self.core.fleet.get(name) else { continue };
            let gpus = n.state().gpu_count();
            let list: Vec<Option<u32>> =
                if metrics::metric(metric).gpu_scoped { (0..gpus as u32).map(Some).collect() } else { vec![None] };
            for g in list {
                let q = Reading { node: name.clone(), gpu: g, metric, window_ms: 0, agg: Agg::Latest };
                if let Some(x) = self.core.reading(&q) {
                    vals.push(x);
                }
            }
        }
        if vals.is_empty() { None } else { Some(vals.iter().sum::<f64>() / vals.len() as f64) }
    }

    fn reading(&self, _ctx: &RunCtx, q: &Reading) -> Option<f64> {
        self.core.reading(q)
    }

    fn gpu_info(&self, _ctx: &RunCtx, node: &str, gpu: u32) -> Map {
        let mut out = serde_json::Map::new();
        if let Some(n) = self.core.fleet.get(node) {
            if let Some(info) =
                n.state().inventory.as_ref().and_then(|i| i.gpus.iter().find(|g| g.index == gpu).cloned())
                && let Ok(Value::Object(m)) = serde_json::to_value(info)
            {
                out.extend(m);
            }
            for (i, m) in METRICS.iter().enumerate() {
                if !m.gpu_scoped {
                    continue;
                }
                let q = Reading {
                    node: node.into(),
                    gpu: Some(gpu),
                    metric: i as MetricId,
                    window_ms: 0,
                    agg: Agg::Latest,
                };
                if let Some(v) = self.core.reading(&q) {
                    out.insert(m.name.trim_start_matches("gpu.").to_string(), json!(v));
                }
            }
            // The baseline power limit when the GPU's limit is held (what it
            // goes back to), else the current one.
            let baseline = n.state().holds.iter().find_map(|h| match (&h.setting, &h.value) {
                (nightshift_proto::Setting::PowerLimit { gpu: g }, HoldValue::PowerLimit { .. }) if *g == gpu => {
                    Some(())
                }
                _ => None,
            });
            out.insert("power_limit_held".into(), json!(baseline.is_some()));
        }
        to_map(Value::Object(out))
    }

    fn node_info(&self, _ctx: &RunCtx, node: &str) -> Map {
        let Some(n) = self.core.fleet.get(node) else { return Map::new() };
        let st = n.state().clone();
        let mut v = json!({
            "name": n.spec.name,
            "labels": n.spec.labels,
            "standby": n.spec.standby,
            "connected": st.connected,
            "drained": st.drained,
            "drain_reason": st.drain_reason,
            "drained_by_nightshift": st.drained && owned_by_nightshift(st.drain_reason.as_deref()),
            "hands_off": st.hands_off(),
            "gpus": st.gpu_count(),
            "vendor": st.vendor(),
            "annotations": st.annotations,
            "holds": st.holds.len(),
        });
        for (i, m) in METRICS.iter().enumerate() {
            if m.gpu_scoped {
                continue;
            }
            let q = Reading { node: node.into(), gpu: None, metric: i as MetricId, window_ms: 0, agg: Agg::Latest };
            let key = m.name.split('.').nth(1).unwrap_or(m.name);
            if let Some(x) = self.core.reading(&q)
                && v.get(key).is_none()
            {
                v[key] = json!(x);
            }
        }
        to_map(v)
    }

    fn group_nodes(&self, ctx: &RunCtx) -> Vec<String> {
        match &ctx.target.group {
            Some((k, v)) => self.core.fleet.group(k, v).iter().map(|n| n.spec.name.clone()).collect(),
            None => ctx.target.node.clone().into_iter().collect(),
        }
    }

    fn group_avg(&self, ctx: &RunCtx, metric: MetricId) -> Option<f64> {
        let (k, v) = ctx.target.group.clone()?;
        let mut vals = Vec::new();
        for n in self.core.fleet.group(&k, &v) {
            let (drained, gpus) = {
                let st = n.state();
                (st.drained, st.gpu_count())
            };
            if drained {
                continue;
            }
            let gpu_list: Vec<Option<u32>> =
                if metrics::metric(metric).gpu_scoped { (0..gpus as u32).map(Some).collect() } else { vec![None] };
            for g in gpu_list {
                let q = Reading { node: n.spec.name.clone(), gpu: g, metric, window_ms: 0, agg: Agg::Latest };
                if let Some(x) = self.core.reading(&q) {
                    vals.push(x);
                }
            }
        }
        if vals.is_empty() { None } else { Some(vals.iter().sum::<f64>() / vals.len() as f64) }
    }

    fn act(&self, ctx: &RunCtx, node: &str, mut op: Op) -> Map {
        let Some(m) = self.manifest() else { return refused("internal", "the runbook was unloaded") };
        if let Err(refusal) = self.admit_change(ctx, node, &op, &m) {
            return refusal;
        }
        let Some(n) = self.core.fleet.get(node) else { return refused("unknown_node", node) };
        let mut reserved = false;
        if let Op::Drain(a) = &mut op {
            a.run = Some(self.run.clone());
            if !ctx.dry_run {
                match self.core.reserve_drain(&self.run, node, &m.blast_radius) {
                    Ok(r) => reserved = r,
                    Err(why) => return self.refuse(ctx, node, &op, "blast_radius", why),
                }
            } else if self.summary().is_some_and(|s| s.shadow) {
                // A shadow run meets the blast radius as a real one would,
                // and takes nothing from it.
                if let Err(why) = self.core.check_drain(&self.run, node, &m.blast_radius) {
                    return self.refuse(ctx, node, &op, "blast_radius", why);
                }
            }
        }
        let gpu = gpu_of(&op);
        let action_id = self.core.next_action_id(&self.run);
        let mut req = Request::new(&action_id, op.clone());
        req.dry_run = ctx.dry_run;
        if places_hold(&op) {
            req.revert_after_secs = Some(hold_lease_secs(m.timeout_secs));
        }
        let t0 = ctx.clock.now_ms();
        let Some(summary) = self.summary() else { return refused("internal", "the run ended") };
        let mut sent = self.block_on(self.core.send_audited(&summary, node, gpu, req));
        // A change whose reply was lost may have been applied: ask the
        // agent's journal, and take the reply it sent if it has one. (One
        // that never left — not the leader, the intent not durable — asks
        // nothing.)
        let mut lost: Option<Value> = None;
        let changes = !ctx.dry_run && (places_hold(&op) || matches!(op, Op::Drain(_)));
        if changes
            && let Err(e) = &sent
            && e.left
        {
            let e = e.clone();
            sent = match self.block_on(self.core.lost_reply(node, &action_id)) {
                Ok(reply) => {
                    lost = Some(json!({"state": "done", "error": e}));
                    Ok((reply, 0.0))
                }
                Err(status) => {
                    lost = Some(status);
                    Err(e)
                }
            };
        }
        let duration_ms = ctx.clock.now_ms() - t0;
        let mut result = match &sent {
            Ok((r, secs)) if matches!(op, Op::Release(_)) => {
                self.core.counters.action_latency.lock().unwrap_or_else(|e| e.into_inner()).observe(*secs);
                let mut v = json!({"ok": r.ok, "outcome": if r.ok { "released" } else { "refused" },
                    "applied": r.ok && !ctx.dry_run, "held": false, "after": r.result});
                if let Some(e) = &r.error {
                    v["code"] = json!(e.code.as_str());
                    v["error"] = json!(e.message);
                }
                v
            }
            Ok((r, secs)) => {
                self.core.counters.action_latency.lock().unwrap_or_else(|e| e.into_inner()).observe(*secs);
                let action = r.action();
                let mut v = json!({
                    "ok": r.ok,
                    "outcome": action.as_ref().map(|a| serde_json::to_value(a.outcome).unwrap_or(Value::Null)).unwrap_or(json!(if r.ok { "ok" } else { "refused" })),
                    "applied": action.as_ref().is_some_and(|a| a.outcome == Outcome::Applied),
                    "held": action.as_ref().is_some_and(|a| a.hold.is_some() && a.outcome != Outcome::DryRun),
                    "before": action.as_ref().map(|a| a.before.clone()).unwrap_or(Value::Null),
                    "after": action.as_ref().map(|a| a.after.clone()).unwrap_or_else(|| r.result.clone().unwrap_or(Value::Null)),
                    "detail": action.as_ref().and_then(|a| a.detail.clone()),
                    "hold": action.as_ref().and_then(|a| a.hold.as_ref().map(|h| h.id.clone())),
                    "released": action.as_ref().and_then(|a| a.released.clone()),
                });
                if let Some(e) = &r.error {
                    v["code"] = json!(e.code.as_str());
                    v["error"] = json!(e.message);
                }
                v
            }
            Err(e) => json!({"ok": false, "outcome": "error", "applied": false, "code": "transport", "error": e}),
        };
        if let Some(status) = &lost {
            result["reply_lost"] = json!(true);
            result["agent_status"] = status.clone();
        }
        // Keep the engine's view of drains in step with what happened.
        if result["applied"] == json!(true) {
            match &op {
                Op::Drain(_) => {
                    let mut st = n.state();
                    st.drained = true;
                    st.drain_reason = result["after"]["reason"].as_str().map(str::to_string);
                }
                Op::Resume(_) => {
                    let mut st = n.state();
                    st.drained = false;
                    st.drain_reason = None;
                }
                _ => {}
            }
        }
        if reserved {
            self.core.release_drain(node);
        }
        if let Op::Requeue(_) = &op
            && result["applied"] == json!(true)
        {
            self.lifecycle_phase(ctx, node, "requeued");
        }
        let node_s = node.to_string();
        // A change with no reply at all (lost, and the agent unreachable)
        // may hold: the run's end releases by owner there too, and retries
        // until the agent takes it.
        let holds_here = result["held"] == json!(true)
            || (!ctx.dry_run && matches!(op, Op::Drain(_)) && result["ok"] == true)
            || (changes && sent.as_ref().is_err_and(|e| e.left));
        let effect = (result["applied"] == json!(true) && !ctx.dry_run).then(|| effect_of(&op)).flatten();
        if let Some(r) = self.core.table().runs.get_mut(&self.run) {
            r.summary.actions += 1;
            if let Some(e) = effect
                && !r.summary.did.iter().any(|d| d == e)
            {
                r.summary.did.push(e.to_string());
            }
            if !r.summary.nodes.contains(&node_s) && !ctx.dry_run {
                r.summary.nodes.push(node_s.clone());
            }
            if holds_here && !r.held_on.contains(&node_s) {
                r.held_on.push(node_s.clone());
            }
        }
        let mut data = result.clone();
        data["action_id"] = json!(action_id);
        data["op"] = json!(op.name());
        data["duration_ms"] = json!(duration_ms);
        data["dry_run"] = json!(ctx.dry_run);
        if self.summary().is_some_and(|s| s.shadow) {
            // What a shadow run is for: would it have acted, by the agent.
            data["shadow"] = json!(true);
            data["would_act"] = json!(result["ok"] == true);
        }
        self.record(ctx, RecordKind::ActionResult, Some(node), gpu, data);
        to_map(result)
    }

    fn release_holds(&self, ctx: &RunCtx, node: Option<&str>) -> Map {
        if ctx.dry_run {
            return to_map(json!({"ok": true, "dry_run": true, "released": []}));
        }
        let nodes: Vec<String> = match node {
            Some(n) => vec![n.to_string()],
            None => self.core.table().runs.get(&self.run).map(|r| r.held_on.clone()).unwrap_or_default(),
        };
        let Some(summary) = self.summary() else { return refused("internal", "the run ended") };
        let mut out = Vec::new();
        let mut ok = true;
        for n in &nodes {
            match self.block_on(self.core.release_run_holds(&summary, n)) {
                Ok(v) => out.push(json!({"node": n, "result": v})),
                Err(e) => {
                    ok = false;
                    out.push(json!({"node": n, "error": e}));
                }
            }
        }
        if let Some(r) = self.core.table().runs.get_mut(&self.run) {
            r.held_on.retain(|x| !nodes.contains(x));
            r.keeps_on.retain(|x| !nodes.contains(x));
        }
        to_map(json!({"ok": ok, "released": out}))
    }

    fn keep_holds(&self, ctx: &RunCtx, lease_secs: u64) -> Map {
        let nodes: Vec<String> = self.core.table().runs.get(&self.run).map(|r| r.held_on.clone()).unwrap_or_default();
        let Some(summary) = self.summary() else { return refused("internal", "the run ended") };
        let mut kept = Vec::new();
        for n in &nodes {
            let req = {
                let mut r = Request::new(
                    self.core.next_action_id(&self.run),
                    Op::Renew(RenewArgs { hold: None, owner: Some(self.run.clone()), lease_secs, keep: true }),
                );
                r.dry_run = ctx.dry_run;
                r
            };
            let action_id = req.id.clone();
            let sent = self.block_on(self.core.send_audited(&summary, n, None, req));
            let ok = matches!(&sent, Ok((r, _)) if r.ok);
            let data = match &sent {
                Ok((r, _)) => {
                    json!({"action_id": action_id, "op": "renew", "ok": r.ok, "outcome": if r.ok { "kept" } else { "refused" },
                    "applied": false, "after": r.result, "error": r.error.as_ref().map(|e| e.message.clone()), "dry_run": ctx.dry_run})
                }
                Err(e) => {
                    json!({"action_id": action_id, "op": "renew", "ok": false, "outcome": "error", "applied": false,
                    "code": "transport", "error": e, "dry_run": ctx.dry_run})
                }
            };
            self.record(ctx, RecordKind::ActionResult, Some(n), None, data);
            if ok {
                kept.push(n.clone());
            }
        }
        if !ctx.dry_run
            && let Some(r) = self.core.table().runs.get_mut(&self.run)
        {
            for n in &kept {
                if !r.keeps_on.contains(n) {
                    r.keeps_on.push(n.clone());
                }
            }
        }
        to_map(json!({"ok": kept.len() == nodes.len(), "nodes": kept, "lease_secs": lease_secs}))
    }

    fn holds(&self, _ctx: &RunCtx, node: &str) -> rhai::Array {
        let Some(n) = self.core.fleet.get(node) else { return rhai::Array::new() };
        let req = Request::new(self.core.ids.request(&format!("{}-holds", self.run)), Op::Holds(NoArgs {}));
        let views: Vec<nightshift_proto::SettingView> = match self.block_on(n.transport.call(req)) {
            Ok(r) if r.ok => r.result.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default(),
            _ => Vec::new(),
        };
        views
            .into_iter()
            .flat_map(|v| {
                let (baseline, effective) = (v.baseline.to_string(), v.effective.to_string());
                v.holds.into_iter().map(move |h| {
                    Dynamic::from(to_map(json!({
                        "id": h.id, "owner": h.owner, "setting": h.setting.kind(), "gpu": h.setting.gpu(),
                        "value": h.value.to_string(), "reason": h.reason, "expires_at_ms": h.expires_at_ms,
                        "sticky": h.sticky(), "kept": h.kept, "baseline": baseline, "effective": effective,
                    })))
                })
            })
            .collect()
    }

    fn config_list(&self, _ctx: &RunCtx, node: &str, name: Option<&str>) -> Dynamic {
        let Some(n) = self.core.fleet.get(node) else { return Dynamic::UNIT };
        let req = Request::new(
            self.core.ids.request(&format!("{}-config-list", self.run)),
            Op::ConfigList(ConfigListArgs { name: name.map(str::to_string) }),
        );
        match self.block_on(n.transport.call(req)) {
            // One config by name: the entry; all of them: the array.
            Ok(r) if r.ok => r
                .result
                .and_then(|v| if name.is_some() { v.get(0).cloned() } else { Some(v) })
                .and_then(|v| rhai::serde::to_dynamic(v).ok())
                .unwrap_or(Dynamic::UNIT),
            _ => Dynamic::UNIT,
        }
    }

    fn annotate(&self, ctx: &RunCtx, node: &str, key: &str, text: Option<&str>) {
        if !self.in_target(ctx, node) {
            return;
        }
        if !ctx.dry_run
            && let Some(n) = self.core.fleet.get(node)
        {
            let mut st = n.state();
            match text {
                Some(t) => st.annotations.insert(key.into(), t.into()),
                None => st.annotations.remove(key),
            };
        }
        let mut data = json!({"key": key, "value": text});
        if ctx.dry_run {
            data["dry_run"] = json!(true);
            data["note"] = json!("dry run: would have set this annotation");
        }
        self.record(ctx, RecordKind::NodeAnnotated, Some(node), None, data);
    }

    fn scale(&self, ctx: &RunCtx, out: bool, count: i64) -> Map {
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "scale_out/scale_in need a group target (scope: group)");
        };
        let mut changed = Vec::new();
        let mut skipped = Vec::new();
        // The nodes serving before this call: a scale-out is judged on them
        // (an idle node it just resumed would dilute the pool's average).
        let before: Vec<String> = self
            .core
            .fleet
            .group(&label, &value)
            .iter()
            .filter(|n| {
                let st = n.state();
                st.connected && !st.drained
            })
            .map(|n| n.spec.name.clone())
            .collect();
        for n in self.core.fleet.group(&label, &value) {
            if changed.len() as i64 >= count {
                break;
            }
            if !n.spec.standby {
                continue;
            }
            let (drained, reason, holds, connected, powered_by_us) = {
                let st = n.state();
                (
                    st.drained,
                    st.drain_reason.clone(),
                    st.holds.clone(),
                    st.connected,
                    st.annotations.get(POWER_MARK).is_some_and(|v| v.starts_with("powered up by")),
                )
            };
            let name = n.spec.name.clone();
            // Power saving: a node the scheduler keeps powered down comes up
            // through a peer of its group (its own agent is off), and goes
            // down again only if nightshift powered it up.
            if n.spec.power_saving && out && !connected {
                match self.power(ctx, &label, &value, &name, true) {
                    Ok(()) => changed.push(name),
                    Err(why) => skipped.push(json!({"node": name, "why": why})),
                }
                continue;
            }
            if n.spec.power_saving && !out && connected && powered_by_us {
                // Back to its standby drain first (running jobs finish
                // elsewhere), then off.
                if let Some(h) = holds.iter().find(|h| {
                    matches!(h.value, HoldValue::NodeDrain { drained: false, .. }) && !h.owner.starts_with("person:")
                }) {
                    let r = self.act(
                        ctx,
                        &name,
                        Op::Release(ReleaseArgs { hold: Some(h.id.clone()), owner: None, include_kept: false }),
                    );
                    if r.get("ok").and_then(|d| d.as_bool().ok()) != Some(true) {
                        skipped.push(
                            json!({"node": name, "why": r.get("error").map(|e| e.to_string()).unwrap_or_default()}),
                        );
                        continue;
                    }
                }
                match self.power(ctx, &label, &value, &name, false) {
                    Ok(()) => changed.push(name),
                    Err(why) => skipped.push(json!({"node": name, "why": why})),
                }
                continue;
            }
            if out {
                if !drained {
                    continue;
                }
                if !owned_by_nightshift(reason.as_deref()) {
                    skipped.push(json!({"node": name, "why": format!("drained by someone else ({})", reason.unwrap_or_default())}));
                    continue;
                }
                // Never a node held drained for RMA, repair or a fault.
                if let Some(h) = holds.iter().find(|h| matches!(h.value, HoldValue::NodeDrain { drained: true, .. })) {
                    skipped.push(json!({"node": name, "why": format!("held drained by {} ({})", h.owner, h.reason)}));
                    continue;
                }
                // Nor one whose GPUs are not healthy (a lost GPU, a pending
                // repair) — whatever its drain says.
                let unhealthy: Vec<String> = self
                    .core
                    .health()
                    .node_gpus(&name)
                    .filter(|(_, h)| h.state != HealthState::Healthy)
                    .map(|(g, h)| format!("GPU {g} {}", h.state.as_str()))
                    .collect();
                if !unhealthy.is_empty() {
                    skipped.push(json!({"node": name, "why": format!("not healthy: {}", unhealthy.join(", "))}));
                    continue;
                }
                let r = self.act(ctx, &name, Op::Resume(nightshift_proto::ResumeArgs { run: Some(self.run.clone()) }));
                if r.get("applied").and_then(|d| d.as_bool().ok()) == Some(true) || ctx.dry_run {
                    changed.push(name);
                } else {
                    skipped
                        .push(json!({"node": name, "why": r.get("error").map(|e| e.to_string()).unwrap_or_default()}));
                }
            } else {
                // Scale in: release the in-service holds earlier runs kept on
                // standby nodes; each node goes back to its standby drain.
                let Some(h) = holds.iter().find(|h| {
                    matches!(h.value, HoldValue::NodeDrain { drained: false, .. }) && !h.owner.starts_with("person:")
                }) else {
                    continue;
                };
                let r = self.act(
                    ctx,
                    &name,
                    Op::Release(ReleaseArgs { hold: Some(h.id.clone()), owner: None, include_kept: false }),
                );
                if r.get("ok").and_then(|d| d.as_bool().ok()) == Some(true) {
                    changed.push(name);
                } else {
                    skipped
                        .push(json!({"node": name, "why": r.get("error").map(|e| e.to_string()).unwrap_or_default()}));
                }
            }
        }
        let booting: Vec<&String> =
            changed.iter().filter(|c| self.core.fleet.get(c).is_some_and(|n| !n.state().connected)).collect();
        to_map(json!({"ok": true, "nodes": changed, "count": changed.len(), "skipped": skipped, "before": before,
            "booting": booting}))
    }

    /// Ask the autoscaler for `count` more nodes for the run's pool
    /// (`out`), or to take back `count` it added at nightshift's request
    /// (`in`): bounded by the runbook's `max_nodes_changed`, the
    /// autoscaler's per-pool budget, and for `in` by what nightshift asked
    /// for; the request is audited (durably) before it is sent.
    fn autoscale(&self, ctx: &RunCtx, out: bool, count: i64, why: &str) -> Map {
        let Some(cfg) = self.core.config.autoscaler.clone() else {
            return refused("no_autoscaler", "no autoscaler is configured (`autoscaler:` in engine.yaml)");
        };
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "autoscale_out/autoscale_in need a group target (scope: group)");
        };
        let Some(m) = self.manifest() else { return refused("internal", "the runbook was unloaded") };
        let pool = format!("{label}={value}");
        let params = self.core.table().runs.get(&self.run).map(|r| r.summary.params.clone()).unwrap_or_default();
        let max_step =
            m.max_nodes_changed.map_or(i64::MAX, |_| crate::admission::nodes_changed(&m, usize::MAX, &params) as i64);
        if count < 1 || count > max_step {
            return refused(
                "out_of_bounds",
                &format!("autoscale: expected 1 to {max_step} nodes (the runbook's max_nodes_changed), found {count}"),
            );
        }
        let asked = self.core.table().autoscaled.get(&pool).copied().unwrap_or(0);
        if out && asked + count > cfg.max_nodes_per_pool as i64 {
            return refused(
                "budget",
                &format!(
                    "autoscale: {pool} already has {asked} node(s) nightshift asked for; {count} more would pass autoscaler.max_nodes_per_pool {}",
                    cfg.max_nodes_per_pool
                ),
            );
        }
        if !out && count > asked {
            return refused(
                "not_ours",
                &format!(
                    "autoscale: nightshift asked for {asked} node(s) in {pool}; it gives back only those, not {count}"
                ),
            );
        }
        if !self.core.acting() {
            return refused("not_leader", "this engine is not the leader: it sends nothing");
        }
        if let Some(e) = self.core.audit.stopped() {
            return refused("audit_stopped", &format!("not sent: {e}"));
        }
        let direction = if out { "out" } else { "in" };
        let action_id = self.core.next_action_id(&self.run);
        let body = json!({"version": 1, "pool": {"label": label, "value": value}, "direction": direction,
            "count": count, "run": self.run, "reason": why, "request_id": action_id});
        self.record(
            ctx,
            RecordKind::ActionIntent,
            None,
            None,
            json!({"action_id": action_id, "op": "autoscale", "args": body, "dry_run": ctx.dry_run, "url": cfg.url}),
        );
        let mut result = json!({"action_id": action_id, "op": "autoscale", "pool": pool, "direction": direction,
            "count": count, "dry_run": ctx.dry_run});
        if ctx.dry_run {
            result["ok"] = json!(true);
            result["applied"] = json!(false);
            result["outcome"] = json!("dry_run");
        } else {
            let token = cfg.token_file.as_ref().map(|p| std::fs::read_to_string(p).map(|t| t.trim().to_string()));
            let sent = match token {
                Some(Err(e)) => Err(format!("cannot read autoscaler.token_file: {e}")),
                t => {
                    let url = cfg.url.clone();
                    let timeout = std::time::Duration::from_secs(cfg.timeout_secs);
                    self.block_on(async move {
                        let mut rb = reqwest::Client::new().post(&url).timeout(timeout).json(&body);
                        if let Some(Ok(t)) = t {
                            rb = rb.bearer_auth(t);
                        }
                        match rb.send().await {
                            Ok(r) => {
                                let status = r.status();
                                let text = r.text().await.unwrap_or_default();
                                let text: String = text.chars().take(500).collect();
                                if status.is_success() {
                                    Ok((status.as_u16(), text))
                                } else {
                                    Err(format!("the autoscaler answered {status}: {text}"))
                                }
                            }
                            Err(e) => Err(format!("the autoscaler at {url} did not answer: {e}")),
                        }
                    })
                }
            };
            match sent {
                Ok((status, text)) => {
                    result["ok"] = json!(true);
                    result["applied"] = json!(true);
                    result["outcome"] = json!("applied");
                    result["status"] = json!(status);
                    result["answer"] = json!(text);
                    let mut t = self.core.table();
                    let e = t.autoscaled.entry(pool.clone()).or_default();
                    *e = (*e + if out { count } else { -count }).max(0);
                }
                Err(e) => {
                    result["ok"] = json!(false);
                    result["applied"] = json!(false);
                    result["outcome"] = json!("error");
                    result["error"] = json!(e);
                }
            }
        }
        self.record(ctx, RecordKind::ActionResult, None, None, result.clone());
        result["requested_in_pool"] = json!(self.core.table().autoscaled.get(&pool).copied().unwrap_or(0));
        to_map(result)
    }

    fn text(&self, ctx: &RunCtx, kind: TextKind, text: &str) {
        let (rk, severity) = match kind {
            TextKind::Note => (RecordKind::Note, "info"),
            TextKind::Notify => (RecordKind::Notification, "warning"),
            TextKind::Escalate => (RecordKind::Escalation, "escalation"),
        };
        let text: String = text.chars().take(2000).collect();
        if kind == TextKind::Note {
            self.record(ctx, rk, ctx.target.node.as_deref(), ctx.target.gpu, json!({"text": text}));
            return;
        }
        if !ctx.dry_run {
            tracing::warn!(run = %self.run, runbook = %ctx.runbook, severity, text = %text, "notification");
        }
        let shadow = self.summary().is_some_and(|s| s.shadow);
        let data = self.core.notification_data(rk, &text, severity, ctx.dry_run, shadow);
        let rec = NewRecord::new(rk, "engine", data)
            .run(&self.run)
            .node(ctx.target.node.as_deref())
            .gpu(ctx.target.gpu)
            .runbook(&ctx.runbook);
        match self.core.audit.append_blocking(rec, self.summary()) {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(run = %self.run, error = %e, "cannot audit from a script"),
        }
    }

    fn event_resolved(&self, _ctx: &RunCtx) -> bool {
        let Some(s) = self.summary() else { return false };
        self.core.table().episode_resolved(&s.event)
    }
}

/// Metric names for a doc table (used by the CLI and README).
pub fn metric_names() -> Vec<&'static str> {
    metrics::METRICS.iter().map(|m| m.name).collect()
}

/// What an applied action did, in the words the timeline shows.
pub fn effect_of(op: &Op) -> Option<&'static str> {
    Some(match op {
        Op::SetPowerLimit(_) => "capped",
        Op::SetFanCurve(_) | Op::ResetFan(_) => "fans",
        Op::SetClocks(_) | Op::ResetClocks(_) => "clocks",
        Op::SetGpuDrain(a) if a.drained => "GPU drained",
        Op::SetGpuDrain(_) => "GPU back",
        Op::Drain(a) if a.sticky && a.repair => "drained for repair",
        Op::Drain(a) if a.sticky => "drained for RMA",
        Op::Drain(_) => "drained",
        Op::Resume(_) => "resumed",
        Op::Requeue(_) => "jobs requeued",
        Op::FlushCaches(_) => "caches flushed",
        Op::ClearEcc(_) => "ECC cleared",
        Op::ConfigRollback(_) => "rolled back",
        Op::ConfigApply(_) => "config changed",
        Op::ConfigMark(_) => "config marked",
        Op::PowerNode(_) => "powered",
        Op::Mark(_) => "marked",
        Op::Release(_) => "released",
        _ => return None,
    })
}
