//! What a running script reaches: [`Host`] implements the script host API
//! for one run — readings from the telemetry store, and actions sent to
//! agents with their intent audited (durably) before they go out and their
//! result after.
//!
//! Actions are refused, audited, when they aim outside the run's target,
//! at a hands-off node, at a node another run holds, or past the blast
//! radius.

use std::sync::Arc;

use rhai::{Dynamic, Map};
use serde_json::{Value, json};

use nightshift_proto::owner::owned_by_nightshift;
use nightshift_proto::{ConfigListArgs, Op, Request};

use crate::audit::{NewRecord, RecordKind};
use crate::engine::Engine;
use crate::metrics::{self, METRICS, MetricId};
use crate::script::{Agg, Reading, RunCtx, ScriptHost, TextKind};

/// The host for one run.
pub struct Host {
    pub engine: Engine,
    pub run: String,
}

fn to_map(v: Value) -> Map {
    rhai::serde::to_dynamic(v).ok().and_then(|d| d.try_cast::<Map>()).unwrap_or_default()
}

fn refused(code: &str, message: &str) -> Map {
    to_map(json!({"ok": false, "outcome": "refused", "code": code, "error": message, "applied": false}))
}

impl Host {
    fn record(&self, ctx: &RunCtx, kind: RecordKind, node: Option<&str>, gpu: Option<u32>, data: Value) {
        let summary = self.engine.run_summary(&self.run);
        let rec = NewRecord::new(kind, "engine", data).run(&self.run).node(node).gpu(gpu).runbook(&ctx.runbook);
        if let Err(e) = self.engine.audit().append_blocking(rec, summary) {
            tracing::error!(run = %self.run, error = %e, "cannot audit from a script");
        }
    }

    /// Nodes this run may act on.
    fn in_target(&self, ctx: &RunCtx, node: &str) -> bool {
        match (&ctx.target.node, &ctx.target.group) {
            (Some(n), _) => n == node,
            (None, Some((k, v))) => self.engine.fleet().get(node).is_some_and(|n| n.label(k) == Some(v.as_str())),
            _ => false,
        }
    }

    fn refuse(&self, ctx: &RunCtx, node: &str, op: &Op, code: &str, message: String) -> Map {
        self.record(
            ctx,
            RecordKind::Refusal,
            Some(node),
            None,
            json!({"op": op.name(), "code": code, "reason": message}),
        );
        refused(code, &message)
    }
}

impl ScriptHost for Host {
    fn reading(&self, _ctx: &RunCtx, q: &Reading) -> Option<f64> {
        self.engine.reading(q)
    }

    fn gpu_info(&self, _ctx: &RunCtx, node: &str, gpu: u32) -> Map {
        let mut out = serde_json::Map::new();
        if let Some(n) = self.engine.fleet().get(node) {
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
                if let Some(v) = self.engine.reading(&q) {
                    out.insert(m.name.trim_start_matches("gpu.").to_string(), json!(v));
                }
            }
        }
        to_map(Value::Object(out))
    }

    fn node_info(&self, _ctx: &RunCtx, node: &str) -> Map {
        let Some(n) = self.engine.fleet().get(node) else { return Map::new() };
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
        });
        for (i, m) in METRICS.iter().enumerate() {
            if m.gpu_scoped {
                continue;
            }
            let q = Reading { node: node.into(), gpu: None, metric: i as MetricId, window_ms: 0, agg: Agg::Latest };
            let key = m.name.split('.').nth(1).unwrap_or(m.name);
            if let Some(x) = self.engine.reading(&q)
                && v.get(key).is_none()
            {
                v[key] = json!(x);
            }
        }
        to_map(v)
    }

    fn group_nodes(&self, ctx: &RunCtx) -> Vec<String> {
        match &ctx.target.group {
            Some((k, v)) => self.engine.fleet().group(k, v).iter().map(|n| n.spec.name.clone()).collect(),
            None => ctx.target.node.clone().into_iter().collect(),
        }
    }

    fn group_avg(&self, ctx: &RunCtx, metric: MetricId) -> Option<f64> {
        let (k, v) = ctx.target.group.clone()?;
        let nodes = self.engine.fleet().group(&k, &v);
        let mut vals = Vec::new();
        for n in nodes {
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
                if let Some(x) = self.engine.reading(&q) {
                    vals.push(x);
                }
            }
        }
        if vals.is_empty() { None } else { Some(vals.iter().sum::<f64>() / vals.len() as f64) }
    }

    fn act(&self, ctx: &RunCtx, node: &str, mut op: Op) -> Map {
        let engine = &self.engine;
        if !self.in_target(ctx, node) {
            return self.refuse(
                ctx,
                node,
                &op,
                "outside_target",
                format!("run {} targets {}; refusing to act on {node} outside it", self.run, ctx.target),
            );
        }
        let Some(n) = engine.fleet().get(node).cloned() else {
            return self.refuse(ctx, node, &op, "unknown_node", format!("{node} is not in the inventory"));
        };
        if n.state().hands_off() {
            return self.refuse(ctx, node, &op, "hands_off", format!("node {node} is hands-off (maintenance)"));
        }
        if !ctx.dry_run
            && ctx.target.node.is_none()
            && let Err(m) = engine.lock_node(&self.run, node)
        {
            return self.refuse(ctx, node, &op, "node_busy", m);
        }
        let mut reserved = false;
        if let Op::Drain(a) = &mut op {
            a.run = Some(self.run.clone());
            if !ctx.dry_run {
                let set = engine.runbook_set();
                let br = set.get(&ctx.runbook).map(|(_, r)| r.manifest.blast_radius.clone()).unwrap_or_default();
                match engine.reserve_drain(&self.run, node, &br) {
                    Ok(()) => reserved = true,
                    Err(m) => return self.refuse(ctx, node, &op, "blast_radius", m),
                }
            }
        }
        let gpu = match &op {
            Op::SetPowerLimit(a) => Some(a.gpu),
            Op::SetFanCurve(a) => Some(a.gpu),
            Op::ResetFan(a) | Op::ResetClocks(a) | Op::ClearEcc(a) => Some(a.gpu),
            Op::SetClocks(a) => Some(a.gpu),
            Op::SetGpuDrain(a) => Some(a.gpu),
            _ => None,
        };
        let action_id = engine.next_action_id(&self.run);
        let mut req = Request::new(&action_id, op.clone());
        req.dry_run = ctx.dry_run;
        let args = serde_json::from_str::<Value>(&req.to_json())
            .ok()
            .and_then(|v| v.get("args").cloned())
            .unwrap_or(Value::Null);
        // Write ahead: the intent is durable before the request leaves.
        self.record(
            ctx,
            RecordKind::ActionIntent,
            Some(node),
            gpu,
            json!({"action_id": action_id, "op": op.name(), "args": args, "dry_run": ctx.dry_run}),
        );
        let started = std::time::Instant::now();
        let t0 = ctx.clock.now_ms();
        let timeout = std::time::Duration::from_secs(engine.config().limits.action_timeout_secs);
        let transport = n.transport.clone();
        let reply = engine.handle().block_on(async move { tokio::time::timeout(timeout, transport.call(req)).await });
        let real_secs = started.elapsed().as_secs_f64();
        if let Ok(mut h) = engine.counters().action_latency.lock() {
            h.observe(real_secs);
        }
        let duration_ms = ctx.clock.now_ms() - t0;
        let result = match reply {
            Ok(Ok(r)) => {
                let action = r.action();
                let mut v = json!({
                    "ok": r.ok,
                    "outcome": action.as_ref().map(|a| serde_json::to_value(a.outcome).unwrap_or(Value::Null)).unwrap_or(json!(if r.ok { "ok" } else { "refused" })),
                    "applied": action.as_ref().is_some_and(|a| a.outcome == nightshift_proto::Outcome::Applied),
                    "before": action.as_ref().map(|a| a.before.clone()).unwrap_or(Value::Null),
                    "after": action.as_ref().map(|a| a.after.clone()).unwrap_or_else(|| r.result.clone().unwrap_or(Value::Null)),
                    "detail": action.as_ref().and_then(|a| a.detail.clone()),
                });
                if let Some(e) = &r.error {
                    v["code"] = json!(e.code.as_str());
                    v["error"] = json!(e.message);
                }
                v
            }
            Ok(Err(e)) => {
                json!({"ok": false, "outcome": "error", "applied": false, "code": "transport", "error": e.to_string()})
            }
            Err(_) => {
                json!({"ok": false, "outcome": "error", "applied": false, "code": "timeout", "error": format!("no reply from {node} within {} s", timeout.as_secs())})
            }
        };
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
            engine.release_drain(node);
        }
        let node_s = node.to_string();
        engine.update_summary(&self.run, |s| {
            s.actions += 1;
            if !s.nodes.contains(&node_s) {
                s.nodes.push(node_s.clone());
            }
        });
        let mut data = result.clone();
        data["action_id"] = json!(action_id);
        data["op"] = json!(op.name());
        data["duration_ms"] = json!(duration_ms);
        data["dry_run"] = json!(ctx.dry_run);
        self.record(ctx, RecordKind::ActionResult, Some(node), gpu, data);
        to_map(result)
    }

    fn config_list(&self, _ctx: &RunCtx, node: &str, name: &str) -> Dynamic {
        let Some(n) = self.engine.fleet().get(node).cloned() else { return Dynamic::UNIT };
        let req = Request::new(
            format!("{}-cl-{}", self.run, self.engine.clock().now_ms()),
            Op::ConfigList(ConfigListArgs { name: Some(name.into()) }),
        );
        let reply = self.engine.handle().block_on(async move { n.transport.call(req).await });
        match reply {
            Ok(r) if r.ok => r
                .result
                .and_then(|v| v.get(0).cloned())
                .and_then(|v| rhai::serde::to_dynamic(v).ok())
                .unwrap_or(Dynamic::UNIT),
            _ => Dynamic::UNIT,
        }
    }

    fn annotate(&self, ctx: &RunCtx, node: &str, key: &str, text: Option<&str>) {
        if !self.in_target(ctx, node) {
            return;
        }
        if let Some(n) = self.engine.fleet().get(node) {
            let mut st = n.state();
            match text {
                Some(t) => st.annotations.insert(key.into(), t.into()),
                None => st.annotations.remove(key),
            };
        }
        self.record(ctx, RecordKind::NodeAnnotated, Some(node), None, json!({"key": key, "value": text}));
    }

    fn scale(&self, ctx: &RunCtx, out: bool, count: i64) -> Map {
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "scale_out/scale_in need a group target (scope: group)");
        };
        let nodes = self.engine.fleet().group(&label, &value);
        let mut changed = Vec::new();
        let mut skipped = Vec::new();
        for n in nodes {
            if changed.len() as i64 >= count {
                break;
            }
            if !n.spec.standby {
                continue;
            }
            let (drained, reason) = {
                let st = n.state();
                (st.drained, st.drain_reason.clone())
            };
            let name = n.spec.name.clone();
            if out {
                if !drained {
                    continue;
                }
                if !owned_by_nightshift(reason.as_deref()) {
                    skipped.push(json!({"node": name, "why": format!("drained by someone else ({})", reason.unwrap_or_default())}));
                    continue;
                }
                let r = self.act(ctx, &name, Op::Resume(nightshift_proto::ResumeArgs { run: Some(self.run.clone()) }));
                if r.get("applied").and_then(|d| d.as_bool().ok()) == Some(true) || ctx.dry_run {
                    changed.push(name);
                }
            } else {
                if drained {
                    continue;
                }
                let r = self.act(
                    ctx,
                    &name,
                    Op::Drain(nightshift_proto::DrainArgs {
                        reason: format!("scale-in: {label}={value} has spare capacity"),
                        run: Some(self.run.clone()),
                    }),
                );
                if r.get("applied").and_then(|d| d.as_bool().ok()) == Some(true) || ctx.dry_run {
                    changed.push(name);
                }
            }
        }
        to_map(json!({"ok": true, "nodes": changed, "count": changed.len(), "skipped": skipped}))
    }

    fn text(&self, ctx: &RunCtx, kind: TextKind, text: &str) {
        let (rk, severity) = match kind {
            TextKind::Note => (RecordKind::Note, "info"),
            TextKind::Notify => (RecordKind::Notification, "warning"),
            TextKind::Escalate => (RecordKind::Escalation, "escalation"),
        };
        let text: String = text.chars().take(2000).collect();
        if kind != TextKind::Note {
            tracing::warn!(run = %self.run, runbook = %ctx.runbook, severity, text = %text, "notification");
        }
        if kind == TextKind::Note {
            self.record(ctx, rk, ctx.target.node.as_deref(), ctx.target.gpu, json!({"text": text}));
            return;
        }
        let data = self.engine.notification_data(rk, &text, severity);
        let summary = self.engine.run_summary(&self.run);
        let rec = NewRecord::new(rk, "engine", data)
            .run(&self.run)
            .node(ctx.target.node.as_deref())
            .gpu(ctx.target.gpu)
            .runbook(&ctx.runbook);
        match self.engine.audit().append_blocking(rec, summary) {
            Ok(r) => self.engine.deliver(&r),
            Err(e) => tracing::error!(run = %self.run, error = %e, "cannot audit from a script"),
        }
    }

    fn event_resolved(&self, ctx: &RunCtx) -> bool {
        let Some(s) = self.engine.run_summary(&self.run) else { return false };
        let _ = ctx;
        s.event.get("fingerprint").and_then(Value::as_str).is_some_and(|f| self.engine.alert_resolved(f))
    }
}

/// Metric names for a doc table (used by the CLI and README).
pub fn metric_names() -> Vec<&'static str> {
    metrics::METRICS.iter().map(|m| m.name).collect()
}

/// Keep `Arc` in the public API stable.
pub type SharedHost = Arc<Host>;
