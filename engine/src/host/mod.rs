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
use crate::base::metrics::{self, METRICS, MetricId};
use crate::core::{Core, hold_lease_secs};
use crate::health::{HealthState, Transition};
use crate::runbooks::manifest::{Manifest, RunClass, Scope};
use crate::runbooks::script::{Agg, Reading, RunCtx, ScriptHost, TextKind};
use crate::runs::RunSummary;

mod act;
mod reads;
mod scale;
mod tell;

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
            | Op::Resume(_)
            | Op::ConfigApply(_)
            | Op::ConfigRollback(_)
    ) || matches!(op, Op::Drain(a) if !a.sticky)
        || matches!(op, Op::SetGpuDrain(a) if !a.sticky)
}

/// Whether an op takes capacity away (what a run of a shared cause may not
/// do): a node or GPU drain, a requeue, a power-off.
pub(crate) fn takes_capacity(op: &Op) -> bool {
    match op {
        Op::Drain(_) | Op::Requeue(_) => true,
        Op::SetGpuDrain(a) => a.drained,
        Op::PowerNode(a) => !a.up,
        _ => false,
    }
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
        self.own(|r| r.summary.clone())
    }

    fn manifest(&self) -> Option<Manifest> {
        Some(self.manifest.clone())
    }

    /// A record of this run, with a typed payload.
    fn record_typed<P: crate::audit::data::Payload>(
        &self,
        ctx: &RunCtx,
        kind: RecordKind,
        node: Option<&str>,
        gpu: Option<u32>,
        payload: &P,
    ) {
        self.append(ctx, NewRecord::typed(kind, "engine", payload).node(node).gpu(gpu));
    }

    /// A note in the run's timeline.
    fn note(&self, ctx: &RunCtx, node: Option<&str>, gpu: Option<u32>, text: String) {
        self.record_typed(ctx, RecordKind::Note, node, gpu, &crate::audit::data::Note { text, ..Default::default() });
    }

    fn append(&self, ctx: &RunCtx, rec: NewRecord) {
        let rec = rec.run(&self.run).runbook(&ctx.runbook);
        if let Err(e) = self.core.audit().append_blocking(rec, self.summary()) {
            tracing::error!(run = %self.run, error = %e, "cannot audit from a script");
        }
    }

    /// Nodes this run may act on.
    fn in_target(&self, ctx: &RunCtx, node: &str) -> bool {
        match (&ctx.target.node, &ctx.target.group) {
            (Some(n), _) => n == node,
            (None, Some((k, v))) => self.core.fleet().get(node).is_some_and(|n| n.label(k) == Some(v.as_str())),
            _ => false,
        }
    }

    fn refuse(&self, ctx: &RunCtx, node: &str, op: &Op, code: &str, message: String) -> Map {
        let data = crate::audit::data::Refusal { op: op.name().into(), code: code.into(), reason: message.clone() };
        self.record_typed(ctx, RecordKind::Refusal, Some(node), gpu_of(op), &data);
        if !ctx.dry_run {
            self.own_mut(|r| r.achieved.refused.push(format!("{} on {node}: {message}", op.name())));
        }
        refused(code, &message)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.core.handle().block_on(f)
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
        let peers = self.core.fleet().group(label, value);
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
            .model()
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
        // A GPU sent for replacement is what the run did, in its words.
        if t.to == HealthState::Rma && !ctx.dry_run {
            self.own_mut(|r| {
                if !r.summary.did.iter().any(|d| d == "GPU to RMA") {
                    r.summary.did.push("GPU to RMA".into());
                }
            });
        }
        let rec = t.record("engine").runbook(&ctx.runbook);
        match self.core.audit().append_blocking(rec, self.summary()) {
            Ok(r) => self.core.health().replay([&r]),
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
        let model = self.core.health().model();
        let Some(h) = model.get(&node, gpu) else { return Map::new() };
        let repairs = model.repairs_in_window(&node, gpu, now);
        let repeat = model.repeat_offender(&node, gpu, now);
        let f = h.fault.clone();
        let xid = f.as_ref().and_then(|f| f.xid);
        let policy = model.policy();
        let info = xid.and_then(|x| policy.info(x));
        to_map(json!({
            "state": h.state.as_str(),
            "kind": f.as_ref().map(|f| f.kind.as_str()),
            "xid": xid,
            "detail": f.as_ref().map(|f| f.detail.clone()),
            "meaning": info.map(|i| i.meaning.as_str()),
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
        let from = self.core.health().model().state(&node, gpu);
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
            self.note(
                ctx,
                Some(&node),
                Some(gpu),
                format!("dry run: would move {node} GPU {gpu} from {} to {} ({text})", from.as_str(), to.as_str()),
            );
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
        // A GPU left waiting on a person's hands: the run needs one, for
        // this (more precise than the drain that keeps the node out).
        let waits = match to {
            HealthState::AwaitingRepair => Some("awaits a repair"),
            HealthState::Rma => Some("goes to RMA"),
            _ => None,
        };
        if let Some(waits) = waits {
            self.own_mut(|r| r.achieved.left_for_person = Some(format!("{node} GPU {gpu} {waits}: {}", t.why)));
        }
        to_map(json!({"ok": true, "from": from.as_str(), "to": to.as_str()}))
    }

    fn declare_fault(&self, ctx: &RunCtx, kind: &str, xid: Option<u32>, detail: &str) -> Map {
        let Some((node, gpu)) = self.target_gpu(ctx) else {
            return refused("not_gpu", "a fault is about a GPU: the run's target has none");
        };
        let Some(kind) = crate::health::FaultKind::parse(kind) else {
            return refused("bad_kind", &format!("unknown fault kind `{kind}`"));
        };
        let from = self.core.health().model().state(&node, gpu);
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
        let Some(n) = self.core.fleet().get(node) else { return refused("unknown_node", node) };
        let engine = crate::engine::Engine::from_core(self.core.clone());
        match self.block_on(engine.health_check_call(&n)) {
            Ok(c) => to_map(json!({"ok": c.ok, "failures": c.failures(), "check": c})),
            Err(e) => to_map(json!({"ok": false, "failures": [e.clone()], "error": e})),
        }
    }

    fn collect_evidence(&self, ctx: &RunCtx, why: &str) -> Map {
        self.evidence_of_target(ctx, why)
    }

    fn pool_pending(&self, ctx: &RunCtx) -> Map {
        self.pending_of_group(ctx)
    }

    fn shared_cause(&self, _ctx: &RunCtx) -> Option<String> {
        self.own(|r| r.shared_cause.clone()).flatten()
    }

    fn xid_repeats(&self, ctx: &RunCtx) -> rhai::Array {
        self.repeats_of_target(ctx)
    }

    fn xid_info(&self, _ctx: &RunCtx, code: u32) -> Map {
        let policy = self.core.health().model().policy();
        policy.info(code).map(|i| to_map(json!(i))).unwrap_or_default()
    }

    fn stats_between(
        &self,
        ctx: &RunCtx,
        node: &str,
        gpu: Option<u32>,
        metric: MetricId,
        from_ms: i64,
        to_ms: i64,
    ) -> Map {
        self.stats_of(ctx, node, gpu, metric, from_ms, to_ms)
    }

    fn thermal_fit(&self, _ctx: &RunCtx, node: &str, gpu: u32, window_ms: i64) -> Map {
        let Some(n) = self.core.fleet().get(node) else { return Map::new() };
        let Ok(g) = u16::try_from(gpu) else { return Map::new() };
        let now = self.core.now();
        let mut since = now.saturating_sub(window_ms);
        // Judge the cooling only since its airflow last changed abruptly
        // (chassis fans set or released, a GPU fan command): the
        // temperatures before were made by other cooling, and the step
        // would read as a drift. Five minutes for the heatsink to settle.
        let airflow_step = {
            let b = self.core.signals().brain();
            let gpu_fan = b.store().window(
                crate::signals::telemetry::SeriesKey { node: n.idx, gpu: Some(g), metric: metrics::ids::FAN },
                since,
            );
            let chassis = b.store().window(
                crate::signals::telemetry::SeriesKey { node: n.idx, gpu: None, metric: metrics::ids::CHASSIS_FAN },
                since,
            );
            [
                crate::signals::thermal::last_airflow_step(&gpu_fan, 5.0),
                crate::signals::thermal::last_airflow_step(&chassis, 5.0),
            ]
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
            let b = self.core.signals().brain();
            let key = |metric| crate::signals::telemetry::SeriesKey { node: n.idx, gpu: Some(g), metric };
            (b.store().window(key(metrics::ids::TEMPERATURE), since), b.store().window(key(metrics::ids::POWER), since))
        };
        match crate::signals::thermal::fit(&temps, &power) {
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
            let Some(n) = self.core.fleet().get(name) else { continue };
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

    fn unobserved_ms(&self, _ctx: &RunCtx, node: &str, window_ms: i64) -> i64 {
        let Some(n) = self.core.fleet().get(node) else { return 0 };
        let first = n.state().first_reading_ms;
        match first {
            // From its first reading on, this engine has seen the node.
            Some(first) => window_ms.saturating_sub(self.core.now().saturating_sub(first)).max(0),
            None => window_ms,
        }
    }

    fn gpu_info(&self, _ctx: &RunCtx, node: &str, gpu: u32) -> Map {
        let mut out = serde_json::Map::new();
        if let Some(n) = self.core.fleet().get(node) {
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
        let Some(n) = self.core.fleet().get(node) else { return Map::new() };
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
            "pool_standbys_serving": self.standbys_serving(&n),
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
            Some((k, v)) => self.core.fleet().group(k, v).iter().map(|n| n.spec.name.clone()).collect(),
            None => ctx.target.node.clone().into_iter().collect(),
        }
    }

    fn group_avg(&self, ctx: &RunCtx, metric: MetricId) -> Option<f64> {
        let (k, v) = ctx.target.group.clone()?;
        let mut vals = Vec::new();
        for n in self.core.fleet().group(&k, &v) {
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

    fn act(&self, ctx: &RunCtx, node: &str, op: Op) -> Map {
        self.act_on(ctx, node, op)
    }

    fn release_holds(&self, ctx: &RunCtx, node: Option<&str>) -> Map {
        if ctx.dry_run {
            return to_map(json!({"ok": true, "dry_run": true, "released": []}));
        }
        let nodes: Vec<String> = match node {
            Some(n) => vec![n.to_string()],
            None => self.own(|r| r.held_on.clone()).unwrap_or_default(),
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
        self.own_mut(|r| {
            r.held_on.retain(|x| !nodes.contains(x));
            r.keeps_on.retain(|x| !nodes.contains(x));
        });
        to_map(json!({"ok": ok, "released": out}))
    }

    fn keep_holds(&self, ctx: &RunCtx, lease_secs: u64) -> Map {
        let nodes: Vec<String> = self.own(|r| r.held_on.clone()).unwrap_or_default();
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
            let data = crate::core::action_result(&action_id, "renew", ctx.dry_run, &sent, ("kept", false));
            self.record_typed(ctx, RecordKind::ActionResult, Some(n), None, &data);
            if ok {
                kept.push(n.clone());
            }
        }
        if !ctx.dry_run {
            self.own_mut(|r| {
                for n in &kept {
                    if !r.keeps_on.contains(n) {
                        r.keeps_on.push(n.clone());
                    }
                }
            });
        }
        to_map(json!({"ok": kept.len() == nodes.len(), "nodes": kept, "lease_secs": lease_secs}))
    }

    fn holds(&self, _ctx: &RunCtx, node: &str) -> rhai::Array {
        let Some(n) = self.core.fleet().get(node) else { return rhai::Array::new() };
        let req = Request::new(self.core.ids().request(&format!("{}-holds", self.run)), Op::Holds(NoArgs {}));
        let views: Vec<nightshift_proto::SettingView> = match self.block_on(n.transport.call(req)) {
            Ok(r) if r.ok => r.result.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default(),
            _ => Vec::new(),
        };
        views
            .into_iter()
            .flat_map(|v| {
                let (baseline, effective) = (v.baseline.to_string(), v.effective.to_string());
                let baseline_watts = watts_of(&v.baseline);
                v.holds.into_iter().map(move |h| {
                    Dynamic::from(to_map(json!({
                        "id": h.id, "owner": h.owner, "setting": h.setting.kind(), "gpu": h.setting.gpu(),
                        "value": h.value.to_string(), "reason": h.reason, "expires_at_ms": h.expires_at_ms,
                        "watts": watts_of(&h.value), "baseline_watts": baseline_watts,
                        "sticky": h.sticky(), "kept": h.kept, "baseline": baseline, "effective": effective,
                    })))
                })
            })
            .collect()
    }

    fn config_list(&self, _ctx: &RunCtx, node: &str, name: Option<&str>) -> Dynamic {
        let Some(n) = self.core.fleet().get(node) else { return Dynamic::UNIT };
        let req = Request::new(
            self.core.ids().request(&format!("{}-config-list", self.run)),
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
            && let Some(n) = self.core.fleet().get(node)
        {
            let mut st = n.state();
            match text {
                Some(t) => st.annotations.insert(key.into(), t.into()),
                None => st.annotations.remove(key),
            };
        }
        let data = crate::audit::data::NodeAnnotated {
            key: key.into(),
            value: text.map(str::to_string),
            dry_run: ctx.dry_run.then_some(true),
            note: ctx.dry_run.then(|| "dry run: would have set this annotation".to_string()),
        };
        self.append(ctx, NewRecord::typed(RecordKind::NodeAnnotated, "engine", &data).node(Some(node)));
    }

    fn scale(&self, ctx: &RunCtx, out: bool, count: i64) -> Map {
        self.scale_group(ctx, out, count)
    }

    fn boot_failed(&self, ctx: &RunCtx, node: &str, why: &str) {
        self.mark_boot_failed(ctx, node, why)
    }

    /// Ask the autoscaler for `count` more nodes for the run's pool
    /// (`out`), or to take back `count` it added at nightshift's request
    /// (`in`): bounded by the runbook's `max_nodes_changed`, the
    /// autoscaler's per-pool budget, and for `in` by what nightshift asked
    /// for; the request is audited (durably) before it is sent.
    fn autoscale(&self, ctx: &RunCtx, out: bool, count: i64, why: &str) -> Map {
        self.autoscale_pool(ctx, out, count, why)
    }

    fn text(&self, ctx: &RunCtx, kind: TextKind, text: &str, size: Option<f64>) {
        self.tell(ctx, kind, text, size)
    }

    fn event_resolved(&self, _ctx: &RunCtx) -> bool {
        let Some(s) = self.summary() else { return false };
        self.core.runs().episode_resolved(&s.event)
    }

    fn runs_within(&self, _ctx: &RunCtx, window_ms: i64) -> i64 {
        self.runs_of_key_within(window_ms)
    }

    fn finding_cleared(&self, ctx: &RunCtx, why: &str) {
        self.clear_run_findings(ctx, why)
    }
}

/// A power limit's watts, for scripts (none for other settings).
fn watts_of(v: &HoldValue) -> Option<f64> {
    match v {
        HoldValue::PowerLimit { watts } => Some(*watts),
        _ => None,
    }
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
        // Sticky: a person ends it (an RMA, or a cooling repair); an RMA
        // says so itself ("GPU to RMA", from the health change).
        Op::Drain(a) if a.sticky => "drained until a person ends it",
        Op::Drain(_) => "drained",
        Op::Resume(_) => "resumed",
        Op::Requeue(_) => "jobs requeued",
        Op::FlushCaches(_) => "caches flushed",
        Op::ClearEcc(_) => "ECC cleared",
        Op::ConfigRollback(_) => "rolled back",
        Op::ConfigApply(_) => "config changed",
        Op::ConfigMark(_) => "config marked",
        Op::PowerNode(_) => "powered",
        Op::Mark(a) if a.set => "marked",
        Op::Mark(_) => "unmarked",
        Op::SetChassisFans(_) => "chassis fans",
        Op::Release(_) => "released",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::effect_of;
    use nightshift_proto::{DrainArgs, MarkArgs, MarkKind, Op, SetChassisFansArgs};

    /// What the timeline's "Did" column says for each change: a chassis-fan
    /// change is not "nothing", a sticky drain is not called an RMA (a
    /// cooling repair is sticky too; an RMA says "GPU to RMA" itself).
    #[test]
    fn every_change_has_its_own_words() {
        let drain = |sticky, repair| Op::Drain(DrainArgs { reason: "x".into(), run: None, sticky, repair });
        let mark = |set| Op::Mark(MarkArgs { mark: MarkKind::NoPack, set, reason: None });
        let cases = [
            (drain(false, false), Some("drained")),
            (drain(true, true), Some("drained for repair")),
            (drain(true, false), Some("drained until a person ends it")),
            (Op::SetChassisFans(SetChassisFansArgs { full: true }), Some("chassis fans")),
            (mark(true), Some("marked")),
            (mark(false), Some("unmarked")),
        ];
        for (op, want) in cases {
            assert_eq!(effect_of(&op), want, "{op:?}");
        }
    }
}
