//! Group scaling: `scale_out`/`scale_in` drain and resume the group's
//! nodes (and power them through a peer), `autoscale` asks the cluster's
//! autoscaler for nodes when no standby is left.

use super::*;
use crate::audit::data::AutoscaleResult;

/// The annotation that says a node nightshift powered up did not boot.
const BOOT_MARK: &str = "boot";

impl Host {
    /// [`ScriptHost::boot_failed`]: mark `node` as one that did not boot
    /// after a power-up, so scale-out skips it until it reports.
    pub(super) fn mark_boot_failed(&self, ctx: &RunCtx, node: &str, why: &str) {
        let text = format!("failed to boot after run {}'s power-up: {why}", self.run);
        self.annotate(ctx, node, BOOT_MARK, Some(&text));
    }

    /// Standby nodes of `n`'s pool (its `pool` label) serving now: the
    /// pool is scaled out by that many (H12 names an expansion that raised
    /// the communication share).
    pub(super) fn standbys_serving(&self, n: &crate::fleet::Node) -> usize {
        let Some(pool) = n.label("pool") else { return 0 };
        self.core
            .fleet()
            .group("pool", pool)
            .iter()
            .filter(|m| {
                m.spec.standby && {
                    let st = m.state();
                    st.connected && !st.drained
                }
            })
            .count()
    }

    /// [`ScriptHost::scale`].
    pub(super) fn scale_group(&self, ctx: &RunCtx, out: bool, count: i64) -> Map {
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "scale_out/scale_in need a group target (scope: group)");
        };
        let mut changed = Vec::new();
        let mut skipped = Vec::new();
        // The nodes serving before this call: a scale-out is judged on them
        // (an idle node it just resumed would dilute the pool's average).
        let before: Vec<String> = self
            .core
            .fleet()
            .group(&label, &value)
            .iter()
            .filter(|n| {
                let st = n.state();
                st.connected && !st.drained
            })
            .map(|n| n.spec.name.clone())
            .collect();
        // Warm standbys first (up, drained, seconds from serving), then the
        // ones the scheduler keeps powered down (minutes to boot); file
        // order otherwise.
        let mut group = self.core.fleet().group(&label, &value);
        if out {
            group.sort_by_key(|n| n.spec.power_saving && !n.state().connected);
        }
        for n in group {
            if changed.len() as i64 >= count {
                break;
            }
            if !n.spec.standby {
                continue;
            }
            // A node that failed to boot after nightshift powered it up is
            // not powered up again (every cooldown) until it reports: a
            // person looks at it. Once it is up the mark goes.
            let boot_failed = n.state().annotations.get(BOOT_MARK).cloned();
            if let Some(mark) = boot_failed {
                if n.state().connected {
                    self.annotate(ctx, &n.spec.name, BOOT_MARK, None);
                } else if out {
                    skipped.push(json!({"node": n.spec.name, "why": mark}));
                    continue;
                }
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
                    .model()
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
            changed.iter().filter(|c| self.core.fleet().get(c).is_some_and(|n| !n.state().connected)).collect();
        to_map(json!({"ok": true, "nodes": changed, "count": changed.len(), "skipped": skipped, "before": before,
            "booting": booting}))
    }

    /// Ask the autoscaler for `count` more nodes for the run's pool
    /// (`out`), or to take back `count` it added at nightshift's request
    /// (`in`): bounded by the runbook's `max_nodes_changed`, the
    /// autoscaler's per-pool budget, and for `in` by what nightshift asked
    /// for; the request is audited (durably) before it is sent.
    pub(super) fn autoscale_pool(&self, ctx: &RunCtx, out: bool, count: i64, why: &str) -> Map {
        let Some(cfg) = self.core.config().autoscaler.clone() else {
            return refused("no_autoscaler", "no autoscaler is configured (`autoscaler:` in engine.yaml)");
        };
        let Some((label, value)) = ctx.target.group.clone() else {
            return refused("not_group", "autoscale_out/autoscale_in need a group target (scope: group)");
        };
        let Some(m) = self.manifest() else { return refused("internal", "the runbook was unloaded") };
        let pool = format!("{label}={value}");
        let params = self.own(|r| r.summary.params.clone()).unwrap_or_default();
        let max_step = m
            .max_nodes_changed
            .map_or(i64::MAX, |_| crate::runstate::admission::nodes_changed(&m, usize::MAX, &params) as i64);
        if count < 1 || count > max_step {
            return refused(
                "out_of_bounds",
                &format!("autoscale: expected 1 to {max_step} nodes (the runbook's max_nodes_changed), found {count}"),
            );
        }
        let asked = self.core.runs().autoscaled(&pool);
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
        if let Some(e) = self.core.audit().stopped() {
            return refused("audit_stopped", &format!("not sent: {e}"));
        }
        let direction = if out { "out" } else { "in" };
        let action_id = self.core.next_action_id(&self.run);
        let body = json!({"version": 1, "pool": {"label": label, "value": value}, "direction": direction,
            "count": count, "run": self.run, "reason": why, "request_id": action_id});
        let intent = crate::audit::data::ActionIntent {
            action_id: action_id.clone(),
            op: AutoscaleResult::OP.into(),
            args: body.clone(),
            dry_run: ctx.dry_run,
            url: Some(cfg.url.clone()),
            ..Default::default()
        };
        self.record_typed(ctx, RecordKind::ActionIntent, None, None, &intent);
        let mut result = AutoscaleResult {
            action_id: action_id.clone(),
            op: AutoscaleResult::OP.into(),
            pool: pool.clone(),
            direction: direction.into(),
            count,
            dry_run: ctx.dry_run,
            ..Default::default()
        };
        if ctx.dry_run {
            result.ok = true;
            result.outcome = "dry_run".into();
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
                    result.ok = true;
                    result.applied = true;
                    result.outcome = "applied".into();
                    result.status = Some(status);
                    result.answer = Some(text);
                    self.core.runs().autoscale_applied(&pool, if out { count } else { -count });
                }
                Err(e) => {
                    result.outcome = "error".into();
                    result.error = Some(e);
                }
            }
        }
        self.record_typed(ctx, RecordKind::ActionResult, None, None, &result);
        let mut result = json!(result);
        result["requested_in_pool"] = json!(self.core.runs().autoscaled(&pool));
        to_map(result)
    }
}
