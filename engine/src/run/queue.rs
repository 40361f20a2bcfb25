//! The queue: which waiting run starts next (priority first, then age;
//! critical runs past `max_concurrent_runs`; exclusive runs one per node,
//! a critical one preempting a lower holder), the breakers that trip on a
//! storm, the re-check of an event before its run may act, the run on its
//! blocking thread, and the finish that releases its holds. Also the
//! periodic tick: approval expiry, stale nodes, fleet triggers, schedules.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

use super::executor::end_summary;
use crate::audit::{NewRecord, RecordKind};
use crate::engine::{Engine, EngineError};
use crate::runbooks::manifest::Priority;
use crate::runbooks::script::{self, RunCtx, ScriptOutcome};
use crate::runs::{RunOutcome, RunState, RunSummary};
use crate::runstate::runtable::{RunEntry, RunTable};

tokio::task_local! {
    /// Set on a task while it runs the pump loop.
    static IN_PUMP: ();
}

impl Engine {
    // ---------------------------------------------------------------- the queue

    /// Whether a queued run may start now, or what it waits for.
    pub(crate) fn blocker(&self, t: &RunTable, r: &RunEntry) -> Option<String> {
        let set = self.runbook_set();
        // By name: a runbook gone or changed is refused when it would start.
        let (_, rb) = set.get(&r.summary.runbook)?;
        let limit = self.core.config().limits.max_concurrent_runs;
        if r.priority != Priority::Critical && t.running() >= limit {
            return Some(format!("the engine runs {limit} runs at once (limits.max_concurrent_runs)"));
        }
        let mine = t.running_of(&r.summary.runbook);
        if mine >= rb.manifest.max_concurrent as usize {
            return Some(format!("{} runs of {} already (max_concurrent)", mine, r.summary.runbook));
        }
        if r.summary.dry_run || !r.exclusive {
            return None;
        }
        let node = r.summary.target.node.as_ref()?;
        match t.node_lock(node) {
            Some(holder) if holder != &r.summary.id => Some(format!("run {holder}, exclusive on {node}")),
            _ => None,
        }
    }

    /// [`Engine::pump`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) fn pump_queue(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if IN_PUMP.try_with(|_| ()).is_ok() {
                return;
            }
            IN_PUMP.scope((), self.pump_inner()).await
        })
    }

    async fn pump_inner(&self) {
        loop {
            let now = self.core.now();
            let set = self.runbook_set();
            let gate = Box::pin(self.resume_gate(now)).await;
            let mut preempt: Vec<(String, String)> = Vec::new();
            let (tripped, to_start) = {
                let mut t = self.core.runs().table();
                let tripped = self.judge_breakers(&mut t, &set, now);
                let mut pick = None;
                let mut waits: Vec<(String, String)> = Vec::new();
                for (i, id) in t.queue().iter().enumerate() {
                    let Some(r) = t.run(id) else { continue };
                    if !r.announced {
                        continue;
                    }
                    if let Some(why) = gate.get(id) {
                        waits.push((id.clone(), why.clone()));
                        continue;
                    }
                    if r.not_before_ms > now {
                        waits.push((id.clone(), "the breaker's hold (a storm is seen whole)".into()));
                        continue;
                    }
                    // A refusing breaker that tripped now refuses this run
                    // below; a reversible-only one's runs may start.
                    if tripped.iter().any(|trip| trip.refuses(&r.summary.runbook)) {
                        continue;
                    }
                    match self.blocker(&t, r) {
                        None => {
                            pick = Some(i);
                            break;
                        }
                        Some(why) => {
                            // A critical run preempts a lower exclusive run
                            // holding its node.
                            if r.priority == Priority::Critical
                                && let Some(node) = &r.summary.target.node
                                && let Some(holder) = t.node_lock(node)
                                && t.run(holder).is_some_and(|h| h.priority < Priority::Critical)
                            {
                                preempt.push((holder.clone(), r.summary.id.clone()));
                            }
                            waits.push((id.clone(), why));
                        }
                    }
                }
                for (id, why) in waits {
                    if let Some(r) = t.run_mut(&id) {
                        r.summary.waiting_for = Some(why);
                    }
                }
                let to_start = pick.and_then(|i| {
                    let id = t.dequeue_at(i);
                    let r = t.run_mut(&id)?;
                    r.summary.state = RunState::Running;
                    r.summary.started_ms = Some(now);
                    let waited = r.summary.waiting_for.take();
                    let summary = r.summary.clone();
                    let (cancel, exclusive, event_ts) = (r.cancel.clone(), r.exclusive, r.event_ts_ms);
                    t.start_running(&summary.runbook);
                    if exclusive
                        && !summary.dry_run
                        && let Some(n) = &summary.target.node
                    {
                        t.lock_node(n, &summary.id);
                    }
                    Some((summary, cancel, waited, event_ts))
                });
                (tripped, to_start)
            };
            for trip in tripped {
                self.trip_breaker(trip).await;
            }
            for (holder, by) in preempt {
                self.preempt(&holder, &by).await;
            }
            let Some((summary, cancel, waited, event_ts)) = to_start else { break };
            // The runbook it was admitted (and approved) as, by name and
            // digest: a reload that reordered the set changes nothing; one
            // that changed or removed this runbook refuses the run, saying so.
            let rb = match bound_runbook(&set, &summary) {
                Ok(rb) => rb.clone(),
                Err(why) => {
                    if let Err(e) = self.finish(&summary.id, RunOutcome::Refused, Some(why), None).await {
                        tracing::error!(run = %summary.id, error = %e, "cannot record a refused run");
                    }
                    continue;
                }
            };
            // Re-check before acting: the event may have aged, or its
            // condition cleared, while the run waited.
            if let Some(why) = self.stale_at_start(&summary, &rb.manifest, event_ts) {
                if let Err(e) = self.finish(&summary.id, RunOutcome::Skipped, Some(why), None).await {
                    tracing::error!(run = %summary.id, error = %e, "cannot record a skipped run");
                }
                continue;
            }
            let waited_ms = summary.started_ms.unwrap_or(now).saturating_sub(summary.created_ms);
            let started =
                crate::audit::data::RunStarted { params: json!(summary.params), waited_ms, waited_for: json!(waited) };
            // The run's own task records its start (before it can act), so
            // starting the next run does not wait for this one's fsync.
            self.spawn_run(summary, rb, cancel, started);
        }
    }

    /// Why a run about to start must not act, if it must not.
    fn stale_at_start(&self, s: &RunSummary, m: &crate::runbooks::manifest::Manifest, event_ts: i64) -> Option<String> {
        if s.trigger == "manual" {
            return None;
        }
        let age_ms = self.core.now().saturating_sub(event_ts);
        // A resumed run was fresh when it first started, and its condition
        // may be gone only because its own holds are in force (a cap keeps
        // the GPU under the threshold): its script decides, from readings
        // this engine made (invariant 18).
        if self.core.runs().table().run(&s.id).is_some_and(|r| r.resumed > 0) {
            return None;
        }
        if age_ms > (m.max_event_age_secs as i64).saturating_mul(1000) {
            return Some(format!(
                "the event was {} s old when the run could start (max_event_age_secs {}): not acted on",
                age_ms / 1000,
                m.max_event_age_secs
            ));
        }
        match self.core.condition_holds(m, s) {
            Some((false, why)) => Some(format!("the condition cleared before the run could start: {why}")),
            _ => None,
        }
    }

    async fn preempt(&self, holder: &str, by: &str) {
        let cancel = {
            let mut t = self.core.runs().table();
            let Some(h) = t.run_mut(holder) else { return };
            if h.preempted_by.is_some() {
                return;
            }
            h.preempted_by = Some(by.to_string());
            h.cancel.clone()
        };
        cancel.store(true, Ordering::SeqCst);
        self.core.counters().add(crate::base::counters::Count::RunsPreempted, 1);
        let rec = NewRecord::typed(
            RecordKind::Note,
            "engine",
            &crate::audit::data::Note {
                text: format!("preempted: critical run {by} needs this node; this run is cancelled"),
                ..Default::default()
            },
        )
        .run(holder);
        if let Err(e) = self.core.audit().append(rec, None).await {
            tracing::error!(error = %e, "cannot audit a preemption");
        }
        tracing::warn!(run = holder, by, "run preempted by a critical run");
    }

    fn spawn_run(
        &self,
        summary: RunSummary,
        rb: crate::runbooks::runbook::Runbook,
        cancel: Arc<AtomicBool>,
        started: crate::audit::data::RunStarted,
    ) {
        let engine = self.clone();
        // A deterministic simulation runs its runs one at a time, in run
        // order between their sleeps: the place is taken now, in the order
        // the queue started them.
        let turn = run_number(&summary.id);
        self.core.clock().turn_reserve(turn);
        self.core.handle().spawn(async move {
            // In order, not awaited: the run's first action or its end waits
            // for a later record, and so for this one.
            if let Err(e) = engine.core.record_run_ordered(RecordKind::RunStarted, &summary, &started) {
                tracing::error!(run = %summary.id, error = %e, "cannot audit run start");
            }
            let host = Arc::new(crate::host::Host::new(engine.core.clone(), &summary.id, rb.manifest.clone()));
            let resumed = engine.core.runs().table().run(&summary.id).map_or(0, |r| r.resumed);
            let mut ctx = RunCtx::new(
                crate::runbooks::script::RunInfo {
                    run_id: summary.id.clone(),
                    runbook: summary.runbook.clone(),
                    target: summary.target.clone(),
                    dry_run: summary.dry_run,
                    timeout_secs: rb.manifest.timeout_secs,
                    max_notes: engine.core.config().script.max_notes,
                    resumed,
                },
                engine.core.clock().clone(),
                host,
            );
            ctx.cancel = cancel;
            let ctx = Arc::new(ctx);
            let event = rhai::serde::to_dynamic(&summary.event).unwrap_or_default();
            let params = rhai::serde::to_dynamic(&summary.params).unwrap_or_default();
            let target = rhai::serde::to_dynamic(json!({
                "node": summary.target.node,
                "gpu": summary.target.gpu,
                "group_label": summary.target.group.as_ref().map(|g| g.0.clone()),
                "group_value": summary.target.group.as_ref().map(|g| g.1.clone()),
                "dry_run": summary.dry_run,
                "run": summary.id,
                // An engine restart resumed it this many times: the script
                // starts from the top with its earlier holds in force.
                "resumed": resumed,
            }))
            .unwrap_or_default();
            let script = engine.core.runbooks().script().clone();
            let ast = rb.ast.clone();
            let clock = engine.core.clock().clone();
            let handle = engine.core.handle().clone();
            let e2 = engine.clone();
            let id = summary.id.clone();
            // The script and the run's end, on one thread, within its turn.
            let done = tokio::task::spawn_blocking(move || {
                clock.turn_enter(turn);
                let outcome = script::execute(&script, &ast, ctx, event, params, target);
                handle.block_on(e2.end_run(&id, outcome));
                clock.turn_leave(turn);
            })
            .await;
            if let Err(e) = done {
                engine.core.clock().turn_leave(turn);
                if let Err(e) = engine
                    .finish(&summary.id, RunOutcome::Failed, Some(format!("the run's thread panicked: {e}")), None)
                    .await
                {
                    tracing::error!(run = %summary.id, error = %e, "cannot record the end of a run");
                }
            }
        });
    }

    /// Record how a run's script ended.
    async fn end_run(&self, id: &str, outcome: ScriptOutcome) {
        let engine = self;
        let summary_id = id.to_string();
        {
            let (preempted, cancelled_by) = match engine.core.runs().table().run(&summary_id) {
                Some(r) => (r.preempted_by.clone(), r.cancelled_by.clone()),
                None => (None, None),
            };
            let stopping = engine.core.lifecycle().stopping();
            if stopping && preempted.is_none() && cancelled_by.is_none() && matches!(outcome, ScriptOutcome::Cancelled)
            {
                engine.leave_for_next_engine(&summary_id);
                return;
            }
            // A script that ended normally ended as its changes and pages
            // came to: all refused is not success, a page or a drain left
            // for a person is not done (issue 43 point 9).
            let achieved = engine.core.runs().table().run(&summary_id).map(|r| r.achieved.clone()).unwrap_or_default();
            let (o, err) = match outcome {
                ScriptOutcome::Succeeded => match achieved.outcome() {
                    (RunOutcome::NeedsPerson, why) => {
                        if let Err(e) = engine.finish(&summary_id, RunOutcome::NeedsPerson, None, why.as_deref()).await
                        {
                            tracing::error!(run = %summary_id, error = %e, "cannot record the end of a run");
                        }
                        return;
                    }
                    ended => ended,
                },
                ScriptOutcome::Failed(m) => (RunOutcome::Failed, Some(m)),
                ScriptOutcome::TimedOut(m) => (RunOutcome::TimedOut, Some(m)),
                ScriptOutcome::Skipped(m) => (RunOutcome::Skipped, Some(m)),
                ScriptOutcome::Cancelled => (
                    RunOutcome::Cancelled,
                    Some(match (preempted, cancelled_by) {
                        (Some(by), _) => format!("preempted by critical run {by}"),
                        (None, Some(c)) => format!("cancelled {} while running", c.words()),
                        (None, None) => "cancelled while running".to_string(),
                    }),
                ),
            };
            if let Err(e) = engine.finish(&summary_id, o, err, None).await {
                tracing::error!(run = %summary_id, error = %e, "cannot record the end of a run");
            }
        }
    }

    /// The engine stops under a running run: leave it as it is — unfinished
    /// in the audit log, its holds in place on the agents (leased) — for
    /// the next engine's recovery to resume. Only its slot here is freed;
    /// nothing is released, recorded as ended, or counted as a cooldown.
    fn leave_for_next_engine(&self, run: &str) {
        let mut t = self.core.runs().table();
        let Some(e) = t.forget_run(run) else { return };
        if e.summary.state == RunState::Running {
            t.stop_running(&e.summary.runbook);
        }
        t.unlock_nodes_of(run);
        tracing::warn!(run, runbook = %e.summary.runbook, holds_on = ?e.held_on, "the engine stops under this run: left unfinished, its holds in place, for the next engine to resume");
    }

    /// End a run: release its holds, record the outcome, free its slot.
    /// Boxed: it is awaited from many places (the queue, the tick, a run's
    /// own thread), some of them inside each other, and its state is large
    /// — inline, every caller's frame would carry it (a stack overflow in
    /// a debug build's replay).
    pub(crate) fn finish<'a>(
        &'a self,
        run: &'a str,
        outcome: RunOutcome,
        error: Option<String>,
        note: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<RunSummary, EngineError>> {
        Box::pin(self.finish_inner(run, outcome, error, note))
    }

    async fn finish_inner(
        &self,
        run: &str,
        outcome: RunOutcome,
        error: Option<String>,
        note: Option<&str>,
    ) -> Result<RunSummary, EngineError> {
        let (mut summary, mut held_on, mut keeps_on, was_running, fire, cancelled_by, preempted, resumed) = {
            let t = self.core.runs().table();
            let e = t.run(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            (
                e.summary.clone(),
                e.held_on.clone(),
                e.keeps_on.clone(),
                e.summary.state == RunState::Running,
                e.fire.clone(),
                e.cancelled_by.clone(),
                e.preempted_by.is_some(),
                e.resumed,
            )
        };
        // A resumed run that could not decide keeps its holds (invariant 18).
        let undecided_after_resume =
            resumed > 0 && matches!(outcome, RunOutcome::Failed | RunOutcome::TimedOut) && !held_on.is_empty();
        if undecided_after_resume {
            // Boxed, as every await here that is not on every run's path:
            // `finish` runs on a run's thread, whose stack is not large.
            for node in Box::pin(self.keep_undecided(&summary, std::mem::take(&mut held_on))).await {
                if !keeps_on.contains(&node) {
                    keeps_on.push(node);
                }
            }
        }
        let error = match error {
            Some(e) if undecided_after_resume => Some(format!("failed after resume: {e}")),
            e => e,
        };
        // The run's holds go when it ends (those it kept stay, leased).
        let mut released = Vec::new();
        let mut left = Vec::new();
        // Node by node in order, up to 32 at once (a group run may hold
        // hundreds of nodes).
        let results: Vec<(String, Result<serde_json::Value, String>)> = {
            use futures::StreamExt;
            let shared = Arc::new(summary.clone());
            futures::stream::iter(held_on.clone())
                .map(|node| {
                    let (core, s) = (self.core.clone(), shared.clone());
                    async move {
                        let r = core.release_run_holds(&s, &node).await;
                        (node, r)
                    }
                })
                .buffered(crate::runbooks::script::MAX_PARALLEL_ACTIONS)
                .collect()
                .await
        };
        for (node_name, result) in results {
            let node = node_name.as_str();
            match result {
                Ok(v) => {
                    if let Ok(r) = serde_json::from_value::<nightshift_proto::ReleaseResult>(v) {
                        for s in r.settings {
                            if s.outcome == nightshift_proto::RestoreOutcome::Drifted
                                || s.outcome == nightshift_proto::RestoreOutcome::Failed
                            {
                                left.push(format!("{node}: {}", s.detail));
                            }
                            released.push(
                                json!({"node": node, "setting": s.setting, "outcome": s.outcome, "detail": s.detail}),
                            );
                        }
                    }
                }
                Err(e) => {
                    // Tried again on every tick until the agent takes it (a
                    // hands-off node, an unreachable agent): the lease is the
                    // last resort, not the plan.
                    left.push(format!("{node}: holds not released yet ({e}); retried until they are"));
                    self.core.runs().table().release_later(summary.clone(), node.to_string());
                }
            }
        }
        let mut kept: Vec<String> = Vec::new();
        for n in &keeps_on {
            for h in self.core.current_holds(n).await.into_iter().filter(|h| h.owner == run) {
                kept.push(format!(
                    "{n}: {} until {}",
                    h.value,
                    h.expires_at_ms.map_or("a person releases it".into(), crate::signals::alerts::format_rfc3339_ms)
                ));
            }
        }
        summary.holds_kept = kept.clone();
        summary.holds_left = left.clone();
        let now = self.core.now();
        end_summary(&mut summary, outcome, error.clone(), now);
        if let (RunOutcome::NeedsPerson, Some(why)) = (outcome, note) {
            summary.ending = Some(format!("needs a person after {} action(s): {why}", summary.actions));
            summary.why = format!("{} — {}", summary.detail, summary.ending.clone().unwrap_or_default());
        }
        if !held_on.is_empty() && outcome.did_its_work() {
            let tail = if !left.is_empty() {
                format!("; {} hold(s) not restored: {}", left.len(), left.join("; "))
            } else if !kept.is_empty() {
                format!("; keeps {} hold(s): {}", kept.len(), kept.join("; "))
            } else {
                "; every hold released, baselines restored".to_string()
            };
            summary.ending = summary.ending.map(|e| e + tail.as_str());
            summary.why = format!("{} — {}", summary.detail, summary.ending.clone().unwrap_or_default());
        }
        // A run that never finished its work — skipped, interrupted by a
        // crash, or cancelled because the engine is stopping — earns no
        // cooldown: if its condition is still there after a restart, the
        // runbook must start over at once.
        let shutting_down = self.core.lifecycle().stopping();
        let mode_switch = outcome == RunOutcome::Cancelled && cancelled_by.as_ref().is_some_and(|c| c.mode_switch);
        let unfinished = match outcome {
            RunOutcome::Skipped | RunOutcome::Interrupted => true,
            RunOutcome::Cancelled => shutting_down || mode_switch,
            _ => false,
        };
        // A fault is a state: the health model, not a cooldown, keeps a
        // fault run from repeating (a run that quarantined it moved it on;
        // one that could not is offered again after a pause).
        let starts_cooldown = !unfinished && !undecided_after_resume && summary.trigger != "fault";
        // A run that decided there was nothing to do spends no budget.
        let (told, repeated) = self.core.runs().table().run(run).map_or((false, false), |e| (e.told, e.repeated));
        let changed_nothing = summary.actions == 0 && summary.did.is_empty() && !told;
        let no_op = outcome == RunOutcome::Succeeded && changed_nothing;
        // Nor does one skipped before it changed anything (its condition
        // cleared while a breaker held it, its event aged in the queue): a
        // budget bounds what runs do, and a refusal for a budget spent by
        // runs that did nothing would page without a reason.
        let free = no_op || (outcome == RunOutcome::Skipped && changed_nothing);
        // Who ended it: the person who cancelled or rejected it, the engine
        // when it stopped or preempted it, else whoever asked for the run.
        let cancelled = outcome == RunOutcome::Cancelled;
        let person = cancelled_by.filter(|_| cancelled);
        let actor = match &person {
            Some(c) => c.by.clone(),
            None if cancelled && (shutting_down || preempted) => "engine".to_string(),
            None => summary.requested_by.clone(),
        };
        // It looked and found nothing to do (not a repeat of a finding):
        // what this runbook told about the target is over — recorded before
        // the run is finished, so whoever sees it finished (a restart right
        // after, a test) sees the finding over too.
        if no_op && !repeated && !summary.dry_run {
            self.clear_findings(&summary).await;
        }
        self.core
            .record_run_as(
                RecordKind::RunFinished,
                &summary,
                &actor,
                &crate::audit::data::RunFinished {
                    outcome: outcome.as_str().into(),
                    error: error.clone(),
                    note: note.map(str::to_string),
                    actions: Some(summary.actions),
                    target: Some(summary.target.clone()),
                    holds_released: Some(released),
                    holds_kept: Some(kept),
                    holds_left: Some(left),
                    starts_cooldown: Some(starts_cooldown),
                    budget_refunded_ms: free.then_some(summary.created_ms),
                    by: person.as_ref().map(|c| c.by.clone()),
                    reason: person.and_then(|c| c.reason),
                    ..Default::default()
                },
            )
            .await?;
        if undecided_after_resume {
            Box::pin(self.page_undecided_after_resume(
                &summary,
                error.as_deref().unwrap_or("no reason given"),
                &summary.holds_kept,
            ))
            .await;
        }
        // A run that did its work ends the pages other runs opened about
        // its target: the fault is handled (invariant 19).
        if outcome.did_its_work()
            && summary.actions > 0
            && !summary.dry_run
            && let Some(node) = summary.target.node.clone()
        {
            let why = format!("handled by run {run} ({})", summary.runbook);
            Box::pin(self.resolve_pages(&node, summary.target.gpu, &why, Some(run))).await;
        }
        let waiting = {
            let mut t = self.core.runs().table();
            t.forget_run(run);
            let key = RunTable::key(&summary);
            if free {
                t.refund_attempt(&key, summary.created_ms);
            }
            if starts_cooldown {
                t.finished(key, now);
            }
            if was_running {
                t.stop_running(&summary.runbook);
            }
            t.unlock_nodes_of(run);
            // An alert suppressed by this run is offered again when the run
            // did not do its work (and earned no cooldown).
            let held_back = t.take_waiting_alert(run).filter(|_| unfinished);
            // A shadow run ended by the fleet going to act: its own alert
            // is offered again, to run for real now.
            held_back.or_else(|| {
                (mode_switch && summary.trigger == "alert").then(|| crate::runstate::runtable::WaitingAlert {
                    runbook: summary.runbook.clone(),
                    target: summary.target.clone(),
                    detail: summary.detail.clone(),
                    event: summary.event.clone(),
                    event_ts_ms: summary.event_ts_ms,
                    requested_by: summary.requested_by.clone(),
                })
            })
        };
        if let Some(w) = waiting {
            self.reconsider(w, run, outcome).await;
        }
        if let Some(f) = fire {
            self.core.signals().brain().rearm(f.trigger, f.node, f.group.as_deref());
        }
        self.count_outcome(outcome);
        tracing::info!(run, runbook = %summary.runbook, target = %summary.target, outcome = outcome.as_str(), "run finished");
        // A slot is free: start what waits. (Boxed: pump → finish → pump.)
        let engine = self.clone();
        Box::pin(async move { engine.pump().await }).await;
        Ok(summary)
    }

    /// Offer again a firing alert that run `run` held back (it was active
    /// for the same runbook and target), now that `run` ended `outcome`
    /// without doing its work: it goes through admission like any alert,
    /// and its run says why it came now. Not while the engine stops.
    pub(crate) async fn reconsider(&self, w: crate::runstate::runtable::WaitingAlert, run: &str, outcome: RunOutcome) {
        if self.core.lifecycle().stopping() {
            return;
        }
        let req = crate::engine::RunRequest {
            runbook: w.runbook,
            target: w.target,
            trigger: "alert".into(),
            detail: format!(
                "{} (offered again: run {run}, which held it back, ended {} without doing its work)",
                w.detail,
                outcome.as_str()
            ),
            event: w.event,
            event_ts_ms: w.event_ts_ms,
            params: std::collections::BTreeMap::new(),
            dry_run: false,
            requested_by: w.requested_by,
        };
        tracing::info!(run, runbook = %req.runbook, target = %req.target, "a held-back alert is offered again");
        // Boxed: finish → submit → pump → finish.
        let engine = self.clone();
        if let Err(e) = Box::pin(async move { engine.submit_inner(req, None).await }).await {
            tracing::error!(error = %e, run, "cannot offer a held-back alert again");
        }
    }
}

/// The number of a run id (`r000042-k7qxm2` → 42): its place in the turn
/// order of a deterministic simulation.
fn run_number(id: &str) -> u64 {
    id.trim_start_matches('r').split('-').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
}

/// The runbook a run was admitted as: the one of that name in `set`, if its
/// digest is still the one the run recorded (runs from before digests were
/// recorded take the runbook by name). Otherwise why the run must not start.
pub(crate) fn bound_runbook<'a>(
    set: &'a crate::runbooks::runbook::RunbookSet,
    s: &RunSummary,
) -> Result<&'a crate::runbooks::runbook::Runbook, String> {
    let short = |d: &str| d.chars().take(12).collect::<String>();
    match (set.get(&s.runbook), &s.runbook_digest) {
        (None, _) => Err(format!(
            "runbook {} is no longer loaded (a reload removed it or it failed to load): not run; submit it again \
             once the runbook is back",
            s.runbook
        )),
        (Some((_, rb)), Some(d)) if &rb.digest != d => Err(format!(
            "runbook {} changed since this run was admitted (admitted as {}, loaded now {}): not run — the \
             approval was for the runbook as it was; submit it again to run the new version",
            s.runbook,
            short(d),
            short(&rb.digest)
        )),
        (Some((_, rb)), _) => Ok(rb),
    }
}
