//! The host's reads and evidence: its own run's entry (the only one it
//! reaches), statistics of a series over a window, the scheduler's queue
//! for a pool, RMA evidence of the run's target, the XIDs repeating on the
//! run's GPU.

use super::*;

impl Host {
    /// `f` of this run's entry (`None` once it left the table): a host
    /// reaches its own run only, never the run table.
    pub(super) fn own<T>(&self, f: impl FnOnce(&crate::runstate::runtable::RunEntry) -> T) -> Option<T> {
        self.core.runs().read_run(&self.run, f)
    }

    /// `f` on this run's entry (`None` once it left the table).
    pub(super) fn own_mut<T>(&self, f: impl FnOnce(&mut crate::runstate::runtable::RunEntry) -> T) -> Option<T> {
        self.core.runs().update_run(&self.run, f)
    }

    /// [`ScriptHost::xid_repeats`].
    pub(super) fn repeats_of_target(&self, ctx: &RunCtx) -> rhai::Array {
        let (Some(node), Some(gpu)) = (ctx.target.node.as_deref(), ctx.target.gpu) else { return Vec::new() };
        let Some(n) = self.core.fleet().get(node) else { return Vec::new() };
        let policy = self.core.health().model().policy();
        let repeats = self.core.health().xid_history().repeats(n.idx, gpu, self.core.now(), &policy);
        let rule = &policy.repeats;
        repeats
            .into_iter()
            .map(|r| {
                let info = policy.info(r.code);
                Dynamic::from_map(to_map(json!({
                    "code": r.code,
                    "events": r.events,
                    "more_than": rule.more_than,
                    "window_secs": rule.window_secs,
                    "mnemonic": info.map(|i| i.mnemonic.clone()),
                    "meaning": info.map(|i| i.meaning.clone()),
                    "action": info.map(|i| i.action.as_str()),
                })))
            })
            .collect()
    }

    /// [`ScriptHost::collect_evidence`].
    pub(super) fn evidence_of_target(&self, ctx: &RunCtx, why: &str) -> Map {
        let Some(node) = ctx.target.node.clone() else { return refused("not_node", "evidence is of a node or GPU") };
        if ctx.dry_run {
            return to_map(json!({"ok": true, "dry_run": true}));
        }
        let engine = crate::engine::Engine::from_core(self.core.clone());
        match self.block_on(engine.collect_evidence(&node, ctx.target.gpu, why, Some(&self.run), "engine")) {
            Ok(c) => to_map(json!({"ok": true, "bundle": c.bundle.id, "sha256": c.sha256, "dir": c.dir})),
            Err(e) => to_map(json!({"ok": false, "error": e})),
        }
    }

    /// [`ScriptHost::stats_between`].
    pub(super) fn stats_of(
        &self,
        _ctx: &RunCtx,
        node: &str,
        gpu: Option<u32>,
        metric: MetricId,
        from_ms: i64,
        to_ms: i64,
    ) -> Map {
        let Some(n) = self.core.fleet().get(node) else { return Map::new() };
        let gpus: Vec<Option<u16>> = match (metrics::metric(metric).gpu_scoped, gpu) {
            (true, Some(g)) => vec![u16::try_from(g).ok()],
            (true, None) => (0..n.state().gpu_count()).map(|g| u16::try_from(g).ok()).collect(),
            (false, _) => vec![None],
        };
        let b = self.core.signals().brain();
        let mut pts: Vec<f64> = Vec::new();
        for g in gpus {
            let key = crate::signals::telemetry::SeriesKey { node: n.idx, gpu: g, metric };
            pts.extend(b.store().window(key, from_ms).into_iter().filter(|(t, _)| *t <= to_ms).map(|(_, v)| v));
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

    /// [`ScriptHost::pool_pending`]: the work waiting in the scheduler for
    /// the run's group, as a connected serving node's agent reads it (the
    /// partition its `partition` label names, else every partition):
    /// `#{known, jobs, gpus, from}`; `known: false` where no scheduler can
    /// say.
    pub(super) fn pending_of_group(&self, ctx: &RunCtx) -> Map {
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "pool_pending needs a group target (scope: group)");
        };
        let group = self.core.fleet().group(&label, &value);
        let Some(n) = group.iter().filter(|n| n.state().connected).min_by_key(|n| n.spec.standby) else {
            return to_map(json!({"known": false, "why": format!("no node of {label}={value} is connected")}));
        };
        let partition = n.label("partition").map(str::to_string);
        let op = Op::SchedulerPending(nightshift_proto::SchedulerPendingArgs { partition });
        let req = Request::new(self.core.ids().request("pending"), op);
        match self.block_on(n.transport.call(req)) {
            Ok(r) if r.ok => {
                let p: nightshift_proto::PendingWork =
                    serde_json::from_value(r.result.unwrap_or_default()).unwrap_or_default();
                to_map(json!({
                    "known": p.jobs.is_some(),
                    "jobs": p.jobs,
                    "gpus": p.gpus,
                    "scheduler": p.scheduler,
                    "from": n.spec.name,
                }))
            }
            Ok(r) => to_map(json!({"known": false, "why": r.error.map(|e| e.message).unwrap_or_default()})),
            Err(e) => to_map(json!({"known": false, "why": e.to_string()})),
        }
    }
}
