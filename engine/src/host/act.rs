//! A script's change to one node: the checks before it (target, hands-off,
//! the blast radius, `max_nodes_changed`, the run's class, a sticky drain
//! the manifest did not declare, the trigger's condition before the first
//! change), its intent audited, the agent's answer audited after.

use super::*;

impl Host {
    /// See [`ScriptHost::finding_cleared`]: forgotten, and a note (rebuilt
    /// from it after a restart).
    pub(super) fn clear_run_findings(&self, ctx: &RunCtx, why: &str) {
        let Some(node) = ctx.target.node.as_deref() else { return };
        if ctx.dry_run || !self.core.forget_said(&ctx.runbook, node, ctx.target.gpu) {
            return;
        }
        let text: String = format!("finding cleared: {why}").chars().take(2000).collect();
        self.append(ctx, Core::findings_cleared_note(&ctx.runbook, node, ctx.target.gpu, text));
    }

    /// See [`ScriptHost::runs_within`].
    pub(super) fn runs_of_key_within(&self, window_ms: i64) -> i64 {
        let Some(s) = self.summary() else { return 0 };
        let key = crate::runstate::runtable::RunTable::key(&s);
        let since = self.core.now().saturating_sub(window_ms);
        self.core.runs().attempts_since(&key, since) as i64
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
        let Some(n) = self.core.fleet().get(node) else {
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
            self.note(
                ctx,
                Some(node),
                gpu_of(op),
                format!("{node} is hands-off (maintenance): {} waits until the marker goes", op.name()),
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
            // else the run ends and its holds go (not a resumed run that
            // acted in an earlier life: its holds may be what keeps it down).
            let resumed_holding = self.own(|r| r.resumed > 0 && r.acted).unwrap_or(false);
            if let Some(s) = self.summary()
                && !resumed_holding
                && s.trigger != "manual"
                && let Some((false, why)) = self.core.condition_holds(&self.manifest, &s)
            {
                let why = format!("the condition cleared while {node} was hands-off: {why}");
                self.note(ctx, Some(node), gpu_of(op), why.to_string());
                ctx.skip(&why);
                return Err(refused("skipped", &why));
            }
        }
        let sticky = matches!(op, Op::Drain(a) if a.sticky) || matches!(op, Op::SetGpuDrain(a) if a.sticky);
        if sticky && !m.sticky_drain {
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
        let (acted, nodes, params) = self
            .own(|r| (r.acted, r.summary.nodes.clone(), r.summary.params.clone()))
            .unwrap_or((true, Vec::new(), Default::default()));
        // The run's own cap: `max_nodes_changed`, or under it the value of
        // its `nodes_changed_param` (what its approval counted).
        if m.scope == Scope::Group
            && let Some(cap) =
                m.max_nodes_changed.map(|_| crate::runstate::admission::nodes_changed(m, usize::MAX, &params))
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
        if m.exclusive
            && ctx.target.node.is_none()
            && let Err(holder) = self.core.runs().lock_node_for(node, &self.run)
        {
            let why = format!("node {node} is busy with exclusive run {holder}");
            return Err(self.refuse(ctx, node, op, "node_busy", why));
        }
        if !acted {
            // Re-check before the first change: the condition may have
            // cleared while the run waited or watched.
            if let Some(s) = self.summary()
                && s.trigger != "manual"
                && let Some((false, why)) = self.core.condition_holds(&self.manifest, &s)
            {
                let why = format!("the condition cleared before the first change: {why}");
                self.note(ctx, Some(node), gpu_of(op), why.to_string());
                ctx.skip(&why);
                return Err(refused("skipped", &why));
            }
            self.own_mut(|r| r.acted = true);
        }
        Ok(())
    }

    /// [`ScriptHost::act`]: one change to `node`, checked and audited.
    pub(super) fn act_on(&self, ctx: &RunCtx, node: &str, mut op: Op) -> Map {
        let Some(m) = self.manifest() else { return refused("internal", "the runbook was unloaded") };
        if let Err(refusal) = self.admit_change(ctx, node, &op, &m) {
            return refusal;
        }
        let Some(n) = self.core.fleet().get(node) else { return refused("unknown_node", node) };
        // One node of a shared cause takes no capacity away: the cause is
        // not on this node (invariant 21).
        let shared_cause = self.own(|r| r.shared_cause.clone()).flatten();
        if takes_capacity(&op)
            && let Some(cause) = shared_cause
        {
            let why = format!("this run is one node of a shared cause, paged once for all of them: {cause}");
            return self.refuse(ctx, node, &op, "shared_cause", why);
        }
        let mut reserved = false;
        if let Op::Drain(a) = &mut op {
            a.run = Some(self.run.clone());
            // A fault run whose GPU the health model holds faulted: hardware
            // evidence, a quarantine the blast radius never refuses.
            let confirmed = self
                .summary()
                .is_some_and(|s| s.trigger == "fault" && matches!(self.core.condition_holds(&m, &s), Some((true, _))));
            if !ctx.dry_run {
                match self.core.reserve_drain(&self.run, node, &m.blast_radius, confirmed) {
                    Ok(r) => reserved = r,
                    Err(why) => return self.refuse(ctx, node, &op, "blast_radius", why),
                }
            } else if self.summary().is_some_and(|s| s.shadow) {
                // A shadow run meets the blast radius as a real one would,
                // and takes nothing from it.
                if let Err(why) = self.core.check_drain(&self.run, node, &m.blast_radius, confirmed) {
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
                self.core.counters().action_took(*secs);
                let mut v = json!({"ok": r.ok, "outcome": if r.ok { "released" } else { "refused" },
                    "applied": r.ok && !ctx.dry_run, "held": false, "after": r.result});
                if let Some(e) = &r.error {
                    v["code"] = json!(e.code.as_str());
                    v["error"] = json!(e.message);
                }
                v
            }
            Ok((r, secs)) => {
                self.core.counters().action_took(*secs);
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
        self.own_mut(|r| {
            if !ctx.dry_run {
                // What it came to, for the run's outcome: went through
                // (applied, or already so), refused, or lost on the way.
                let a = &mut r.achieved;
                let why =
                    || format!("{} on {node}: {}", op.name(), result["error"].as_str().unwrap_or("no reason given"));
                match (result["ok"] == true, result["outcome"].as_str()) {
                    (true, _) => a.applied += 1,
                    (false, Some("refused")) => a.refused.push(why()),
                    (false, _) => a.failed.push(why()),
                }
                if let Op::Drain(d) = &op
                    && d.sticky
                    && result["applied"] == true
                    && a.left_for_person.is_none()
                {
                    a.left_for_person = Some(format!("{node} drained until a person ends it ({})", d.reason));
                }
            }
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
        });
        // The answer as built above: every field a string, bool or JSON
        // value where the type has it (an answer that does not read keeps
        // its fields, untyped, in `more`).
        let mut data: crate::audit::data::ActionResult =
            serde_json::from_value(result.clone()).unwrap_or_else(|_| crate::audit::data::ActionResult {
                more: result.as_object().cloned().unwrap_or_default(),
                ..Default::default()
            });
        data.action_id = action_id.clone();
        data.op = op.name().into();
        data.duration_ms = Some(duration_ms);
        data.dry_run = ctx.dry_run;
        if self.summary().is_some_and(|s| s.shadow) {
            // What a shadow run is for: would it have acted, by the agent.
            data.shadow = Some(true);
            data.would_act = Some(result["ok"] == true);
        }
        self.record_typed(ctx, RecordKind::ActionResult, Some(node), gpu, &data);
        to_map(result)
    }
}
