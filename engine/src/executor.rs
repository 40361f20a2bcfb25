//! The executor: run requests through admission (`admission.rs`) into the
//! run table, the queue, a start that re-checks the event, the script on a
//! blocking thread (`script.rs`, `host.rs`), and a finish that releases the
//! run's holds on every node it touched.
//!
//! Run classes (manifest `class`, `priority`, `exclusive`):
//! - `observe` runs take no lock and may change nothing;
//! - `act` runs overlap freely — their holds combine on the agent — except
//!   `exclusive` ones, which hold the node against other exclusive runs;
//! - a `critical` run is queued ahead of lower ones, is never shed, is not
//!   held back by `max_concurrent_runs`, and preempts (cancels, audited) a
//!   lower exclusive run holding its node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use crate::admission::{Ask, Decision, admit, approval_reason, nodes_changed};
use crate::audit::{NewRecord, RecordKind};
use crate::core::Core;
use crate::engine::{Engine, EngineError, RunRequest, Submitted};
use crate::manifest::{Priority, RunClass, Scope, Trigger};
use crate::runbook::Runbook;
use crate::runs::{ApprovalDecision, RunOutcome, RunState, RunSummary, Target};
use crate::runtable::{BreakerFire, FireRef, RunEntry, RunTable};
use crate::script::{self, RunCtx, ScriptOutcome};

/// Lease a run's holds get: its timeout and two minutes, so an engine that
/// dies leaves nothing held for long. At most a day.
pub fn hold_lease_secs(timeout_secs: u64) -> u64 {
    timeout_secs.saturating_add(120).min(86_400)
}

impl Engine {
    /// Ask for a run (manual runs from the CLI and web come here too).
    pub async fn submit(&self, req: RunRequest) -> Result<Submitted, EngineError> {
        self.submit_inner(req, None).await
    }

    pub(crate) async fn drop_event(&self, reason: &str, node: Option<&str>) -> Result<(), EngineError> {
        self.core.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        self.core
            .audit
            .append(NewRecord::new(RecordKind::EventDropped, "engine", json!({"reason": reason})).node(node), None)
            .await?;
        Ok(())
    }

    /// Check a request's target and params against the runbook and the
    /// inventory.
    fn check_request(&self, rb: &Runbook, req: &RunRequest) -> Result<usize, EngineError> {
        let m = &rb.manifest;
        match (m.scope, &req.target.node, req.target.gpu, &req.target.group) {
            (Scope::Gpu, Some(_), Some(_), None)
            | (Scope::Node, Some(_), None, None)
            | (Scope::Group, None, None, Some(_)) => {}
            (scope, ..) => {
                return Err(EngineError::BadTarget(format!(
                    "runbook {} acts on a {}: expected {}, found target {}",
                    m.name,
                    format!("{scope:?}").to_lowercase(),
                    match scope {
                        Scope::Gpu => "--node N --gpu G",
                        Scope::Node => "--node N",
                        Scope::Group => "--group label=value",
                    },
                    req.target
                )));
            }
        }
        let nodes = self.core.target_nodes(&req.target);
        if nodes.is_empty() {
            return Err(match &req.target.node {
                Some(n) => EngineError::UnknownNode(n.clone()),
                None => EngineError::BadTarget(format!("no node in the inventory has label {}", req.target)),
            });
        }
        if let (Some(g), Some(n)) = (req.target.gpu, nodes.first()) {
            let count = n.state().gpu_count();
            if count > 0 && g as usize >= count {
                return Err(EngineError::BadTarget(format!(
                    "node {} has GPUs 0..{}, found --gpu {g}",
                    n.spec.name,
                    count - 1
                )));
            }
        }
        Ok(nodes.len())
    }

    pub(crate) async fn submit_inner(&self, req: RunRequest, fire: Option<FireRef>) -> Result<Submitted, EngineError> {
        let set = self.runbook_set();
        let Some((rb_idx, rb)) = set.get(&req.runbook) else {
            return Err(EngineError::UnknownRunbook { name: req.runbook.clone(), known: set.names().join(", ") });
        };
        let m = &rb.manifest;
        let target_nodes = self.check_request(rb, &req)?;
        let params = m.resolve_params(&req.params).map_err(EngineError::BadParams)?;
        let now = self.core.now();
        let manual = req.trigger == "manual";
        let hands_off =
            self.core.target_nodes(&req.target).iter().find(|n| n.state().hands_off()).map(|n| n.spec.name.clone());
        let key = (req.runbook.clone(), req.target.clone());
        // Decide and take the decision's effect on the table under one lock,
        // so two requests for one target cannot both be admitted.
        let (decision, summary) = {
            let mut t = self.core.table();
            let ask = Ask {
                manifest: m,
                target: &req.target,
                manual,
                event_ts_ms: req.event_ts_ms,
                dry_run: req.dry_run,
                hands_off: hands_off.as_deref(),
                target_nodes,
            };
            let d = admit(&t, &ask, now, &self.core.config.limits);
            let summary = match &d {
                Decision::Suppress { first: true, .. } => {
                    t.suppression_noted.insert(key.clone());
                    None
                }
                Decision::Refuse { .. } => {
                    let s = new_summary(self.core.ids.run(), rb, &req, params.clone(), now);
                    t.last_finished.insert(key.clone(), now);
                    Some(s)
                }
                Decision::Admit { approval, hold_ms } => {
                    let mut s = new_summary(self.core.ids.run(), rb, &req, params.clone(), now);
                    if approval.is_some() {
                        s.state = RunState::PendingApproval;
                    }
                    t.active_by_key.insert(key.clone(), s.id.clone());
                    t.attempts.entry(key.clone()).or_default().push_back(now);
                    t.suppression_noted.remove(&key);
                    if m.breaker.is_some()
                        && let Some(node) = req.target.node.clone()
                    {
                        t.breakers.entry(m.name.clone()).or_default().fires.push_back(BreakerFire {
                            ts_ms: now,
                            node,
                            gpu: req.target.gpu,
                        });
                    }
                    t.runs.insert(
                        s.id.clone(),
                        RunEntry {
                            summary: s.clone(),
                            runbook_idx: rb_idx,
                            class: m.class,
                            priority: m.priority,
                            exclusive: m.exclusive,
                            not_before_ms: now.saturating_add(*hold_ms),
                            approval_deadline_ms: now
                                .saturating_add((m.approval.expire_secs as i64).saturating_mul(1000)),
                            cancel: Arc::new(AtomicBool::new(false)),
                            announced: false,
                            fire,
                            next_action: 0,
                            event_ts_ms: req.event_ts_ms,
                            acted: false,
                            held_on: Vec::new(),
                            keeps_on: Vec::new(),
                            preempted_by: None,
                        },
                    );
                    if approval.is_none() {
                        t.enqueue(s.id.clone(), m.priority);
                    }
                    Some(s)
                }
                _ => None,
            };
            (d, summary)
        };
        let queued_data = |s: &RunSummary| {
            json!({"trigger": req.trigger, "detail": req.detail, "event": req.event, "dry_run": req.dry_run,
                "target": s.target, "priority": m.priority.as_str(), "class": m.class})
        };
        match decision {
            Decision::Drop { reason } => {
                self.drop_event(&reason, req.target.node.as_deref()).await?;
                Ok(Submitted::Dropped { reason })
            }
            Decision::Shed { reason } => {
                self.core.counters.events_shed.fetch_add(1, Ordering::Relaxed);
                self.drop_event(&reason, req.target.node.as_deref()).await?;
                Ok(Submitted::Dropped { reason })
            }
            Decision::Suppress { reason, existing, first } => {
                self.core.counters.runs_suppressed.fetch_add(1, Ordering::Relaxed);
                if first {
                    let mut rec = NewRecord::new(
                        RecordKind::TriggerSuppressed,
                        &req.requested_by,
                        json!({"reason": reason, "detail": req.detail, "trigger": req.trigger, "target": req.target}),
                    )
                    .node(req.target.node.as_deref())
                    .gpu(req.target.gpu)
                    .runbook(&req.runbook);
                    if let Some(e) = &existing {
                        rec = rec.run(e);
                    }
                    self.core.audit.append(rec, None).await?;
                }
                Ok(Submitted::Suppressed { reason, existing_run: existing })
            }
            Decision::Refuse { reason } => {
                let mut s = summary.unwrap_or_else(|| new_summary(self.core.ids.run(), rb, &req, params, now));
                self.core.record_run(RecordKind::RunQueued, &s, queued_data(&s)).await?;
                end_summary(&mut s, RunOutcome::Refused, Some(reason.clone()), now);
                self.core
                    .record_run(
                        RecordKind::RunFinished,
                        &s,
                        json!({"outcome": "refused", "reason": reason, "target": s.target}),
                    )
                    .await?;
                self.count_outcome(RunOutcome::Refused);
                self.text_record(&s, RecordKind::Escalation, &format!("{}: {reason}", s.runbook)).await;
                Ok(Submitted::Refused { run: s })
            }
            Decision::Admit { approval, .. } => {
                let s = summary.ok_or_else(|| EngineError::NoSuchRun("admitted run".into()))?;
                self.core.record_run(RecordKind::RunQueued, &s, queued_data(&s)).await?;
                if let Some(why) = &approval {
                    self.core
                        .record_run(
                            RecordKind::ApprovalRequested,
                            &s,
                            json!({"reason": why, "expires_in_secs": m.approval.expire_secs,
                                "nodes_changed": nodes_changed(m, target_nodes)}),
                        )
                        .await?;
                    self.text_record(
                        &s,
                        RecordKind::Notification,
                        &format!("run {} ({}) on {} needs approval: {why}", s.id, s.runbook, s.target),
                    )
                    .await;
                }
                if let Some(r) = self.core.table().runs.get_mut(&s.id) {
                    r.announced = true;
                }
                self.pump().await;
                Ok(if approval.is_some() {
                    Submitted::PendingApproval { run: s }
                } else {
                    Submitted::Queued { run: s }
                })
            }
        }
    }

    /// A notification or escalation record about run `s`, delivered.
    pub(crate) async fn text_record(&self, s: &RunSummary, kind: RecordKind, text: &str) {
        let severity = if kind == RecordKind::Escalation { "escalation" } else { "info" };
        let rec = NewRecord::new(kind, "engine", self.core.notification_data(kind, text, severity, s.dry_run))
            .run(&s.id)
            .node(s.target.node.as_deref())
            .runbook(&s.runbook);
        tracing::warn!(run = %s.id, runbook = %s.runbook, kind = kind.as_str(), text, "notification");
        match self.core.audit.append(rec, None).await {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(error = %e, "cannot audit a notification"),
        }
    }

    pub(crate) fn count_outcome(&self, o: RunOutcome) {
        *crate::core::lock(&self.core.counters.runs_by_outcome).entry(o.as_str()).or_default() += 1;
    }

    // ---------------------------------------------------------------- approvals

    /// Approve a run waiting for approval. Nobody approves a run they asked
    /// for or whose event they posted.
    pub async fn approve(&self, run: &str, by: &str) -> Result<RunSummary, EngineError> {
        self.decide(run, by, true, None).await
    }

    /// Reject a run waiting for approval, saying why.
    pub async fn reject(&self, run: &str, by: &str, reason: &str) -> Result<RunSummary, EngineError> {
        if reason.trim().is_empty() {
            return Err(EngineError::MissingReason);
        }
        self.decide(run, by, false, Some(reason.to_string())).await
    }

    async fn decide(
        &self,
        run: &str,
        by: &str,
        approved: bool,
        reason: Option<String>,
    ) -> Result<RunSummary, EngineError> {
        let now = self.core.now();
        let summary = {
            let mut t = self.core.table();
            let RunTable { runs, queue: _, .. } = &mut *t;
            let entry = runs.get_mut(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            if entry.summary.state != RunState::PendingApproval {
                return Err(EngineError::NotAwaitingApproval {
                    run: run.to_string(),
                    state: entry.summary.state.as_str().to_string(),
                });
            }
            let posted_by = entry.summary.event.get("posted_by").and_then(Value::as_str);
            if approved && (entry.summary.requested_by == by || posted_by == Some(by)) {
                return Err(EngineError::SelfApproval { run: run.to_string(), by: by.to_string() });
            }
            entry.summary.approvals.push(ApprovalDecision {
                by: by.into(),
                approved,
                at_ms: now,
                reason: reason.clone(),
            });
            if approved {
                entry.summary.state = RunState::Queued;
            }
            let (s, prio) = (entry.summary.clone(), entry.priority);
            if approved {
                t.enqueue(s.id.clone(), prio);
            }
            s
        };
        if approved {
            self.core.record_run(RecordKind::Approved, &summary, json!({"by": by})).await?;
            self.pump().await;
            Ok(summary)
        } else {
            let why = format!("rejected by {by}: {}", reason.clone().unwrap_or_default());
            self.core.record_run(RecordKind::Rejected, &summary, json!({"by": by, "reason": reason})).await?;
            self.finish(run, RunOutcome::Cancelled, Some(why), None).await
        }
    }

    /// Cancel a queued, pending or running run.
    pub async fn cancel(&self, run: &str, by: &str) -> Result<(), EngineError> {
        let running = {
            let t = self.core.table();
            let e = t.runs.get(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            e.cancel.store(true, Ordering::SeqCst);
            e.summary.state == RunState::Running
        };
        if !running {
            self.finish(run, RunOutcome::Cancelled, Some(format!("cancelled by {by} before it started")), None).await?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- the queue

    /// Whether a queued run may start now, or what it waits for.
    fn blocker(&self, t: &RunTable, r: &RunEntry) -> Option<String> {
        let set = self.runbook_set();
        let rb = set.runbooks.get(r.runbook_idx)?;
        let limit = self.core.config.limits.max_concurrent_runs;
        if r.priority != Priority::Critical && t.running >= limit {
            return Some(format!("the engine runs {limit} runs at once (limits.max_concurrent_runs)"));
        }
        let mine = t.running_per_runbook.get(&r.summary.runbook).copied().unwrap_or(0);
        if mine >= rb.manifest.max_concurrent as usize {
            return Some(format!("{} runs of {} already (max_concurrent)", mine, r.summary.runbook));
        }
        if r.summary.dry_run || !r.exclusive {
            return None;
        }
        let node = r.summary.target.node.as_ref()?;
        match t.node_locks.get(node) {
            Some(holder) if holder != &r.summary.id => Some(format!("run {holder}, exclusive on {node}")),
            _ => None,
        }
    }

    /// Start every run that may start now.
    pub async fn pump(&self) {
        loop {
            let now = self.core.now();
            let set = self.runbook_set();
            let mut tripped: Vec<(String, String, i64)> = Vec::new();
            let mut preempt: Vec<(String, String)> = Vec::new();
            let to_start = {
                let mut t = self.core.table();
                for rb in &set.runbooks {
                    let Some(b) = &rb.manifest.breaker else { continue };
                    let name = &rb.manifest.name;
                    let window_ms = (b.window_secs as i64).saturating_mul(1000);
                    let Some(br) = t.breakers.get_mut(name) else { continue };
                    let distinct = br.distinct(now, window_ms, b.count);
                    if distinct as u32 > b.max_targets && br.tripped_until <= now {
                        br.tripped_until = now.saturating_add(window_ms);
                        let what = match b.count {
                            crate::manifest::BreakerCount::Nodes => "nodes",
                            crate::manifest::BreakerCount::Gpus => "GPUs",
                        };
                        tripped.push((
                            name.clone(),
                            format!(
                                "breaker tripped: {distinct} {what} fired within {} s (max_targets {}): a fleet-wide event, not {distinct} broken {what}",
                                b.window_secs, b.max_targets
                            ),
                            br.tripped_until,
                        ));
                    }
                }
                let mut pick = None;
                let mut waits: Vec<(String, String)> = Vec::new();
                for (i, id) in t.queue.iter().enumerate() {
                    let Some(r) = t.runs.get(id) else { continue };
                    if !r.announced {
                        continue;
                    }
                    if r.not_before_ms > now {
                        waits.push((id.clone(), "the breaker's hold (a storm is seen whole)".into()));
                        continue;
                    }
                    if tripped.iter().any(|(n, ..)| n == &r.summary.runbook) {
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
                                && let Some(holder) = t.node_locks.get(node)
                                && t.runs.get(holder).is_some_and(|h| h.priority < Priority::Critical)
                            {
                                preempt.push((holder.clone(), r.summary.id.clone()));
                            }
                            waits.push((id.clone(), why));
                        }
                    }
                }
                for (id, why) in waits {
                    if let Some(r) = t.runs.get_mut(&id) {
                        r.summary.waiting_for = Some(why);
                    }
                }
                pick.and_then(|i| {
                    let id = t.queue.remove(i);
                    let r = t.runs.get_mut(&id)?;
                    r.summary.state = RunState::Running;
                    r.summary.started_ms = Some(now);
                    let waited = r.summary.waiting_for.take();
                    let summary = r.summary.clone();
                    let (idx, cancel, exclusive, event_ts) =
                        (r.runbook_idx, r.cancel.clone(), r.exclusive, r.event_ts_ms);
                    t.running += 1;
                    *t.running_per_runbook.entry(summary.runbook.clone()).or_default() += 1;
                    if exclusive
                        && !summary.dry_run
                        && let Some(n) = &summary.target.node
                    {
                        t.node_locks.insert(n.clone(), summary.id.clone());
                    }
                    Some((summary, idx, cancel, waited, event_ts))
                })
            };
            for (name, reason, until) in tripped {
                self.trip_breaker(&name, &reason, until).await;
            }
            for (holder, by) in preempt {
                self.preempt(&holder, &by).await;
            }
            let Some((summary, idx, cancel, waited, event_ts)) = to_start else { break };
            // Re-check before acting: the event may have aged, or its
            // condition cleared, while the run waited.
            if let Some(why) = self.stale_at_start(&summary, idx, event_ts) {
                if let Err(e) = self.finish(&summary.id, RunOutcome::Skipped, Some(why), None).await {
                    tracing::error!(run = %summary.id, error = %e, "cannot record a skipped run");
                }
                continue;
            }
            let waited_ms = summary.started_ms.unwrap_or(now).saturating_sub(summary.created_ms);
            if let Err(e) = self
                .core
                .record_run(
                    RecordKind::RunStarted,
                    &summary,
                    json!({"params": summary.params, "waited_ms": waited_ms, "waited_for": waited}),
                )
                .await
            {
                tracing::error!(run = %summary.id, error = %e, "cannot audit run start");
            }
            self.spawn_run(summary, idx, cancel);
        }
    }

    /// Why a run about to start must not act, if it must not.
    fn stale_at_start(&self, s: &RunSummary, idx: usize, event_ts: i64) -> Option<String> {
        if s.trigger == "manual" {
            return None;
        }
        let set = self.runbook_set();
        let m = &set.runbooks.get(idx)?.manifest;
        let age_ms = self.core.now().saturating_sub(event_ts);
        if age_ms > (m.max_event_age_secs as i64).saturating_mul(1000) {
            return Some(format!(
                "the event was {} s old when the run could start (max_event_age_secs {}): not acted on",
                age_ms / 1000,
                m.max_event_age_secs
            ));
        }
        match self.core.condition_holds(idx, s) {
            Some((false, why)) => Some(format!("the condition cleared before the run could start: {why}")),
            _ => None,
        }
    }

    async fn preempt(&self, holder: &str, by: &str) {
        let cancel = {
            let mut t = self.core.table();
            let Some(h) = t.runs.get_mut(holder) else { return };
            if h.preempted_by.is_some() {
                return;
            }
            h.preempted_by = Some(by.to_string());
            h.cancel.clone()
        };
        cancel.store(true, Ordering::SeqCst);
        self.core.counters.runs_preempted.fetch_add(1, Ordering::Relaxed);
        let rec = NewRecord::new(
            RecordKind::Note,
            "engine",
            json!({"text": format!("preempted: critical run {by} needs this node; this run is cancelled")}),
        )
        .run(holder);
        if let Err(e) = self.core.audit.append(rec, None).await {
            tracing::error!(error = %e, "cannot audit a preemption");
        }
        tracing::warn!(run = holder, by, "run preempted by a critical run");
    }

    async fn trip_breaker(&self, runbook: &str, reason: &str, until: i64) {
        if let Err(e) = self
            .core
            .audit
            .append(
                NewRecord::new(
                    RecordKind::BreakerTripped,
                    "engine",
                    json!({"reason": reason, "tripped_until_ms": until}),
                )
                .runbook(runbook),
                None,
            )
            .await
        {
            tracing::error!(error = %e, "cannot audit a breaker trip");
        }
        let held: Vec<String> = {
            let t = self.core.table();
            t.queue.iter().filter(|id| t.runs.get(*id).is_some_and(|r| r.summary.runbook == runbook)).cloned().collect()
        };
        for id in &held {
            if let Err(e) = self.finish(id, RunOutcome::Refused, Some(reason.to_string()), None).await {
                tracing::error!(run = %id, error = %e, "cannot refuse a held run");
            }
        }
        let rec = NewRecord::new(
            RecordKind::Escalation,
            "engine",
            self.core.notification_data(
                RecordKind::Escalation,
                &format!("{runbook}: {reason}; {} held runs refused", held.len()),
                "escalation",
                false,
            ),
        )
        .runbook(runbook);
        tracing::warn!(runbook, reason, "breaker tripped");
        match self.core.audit.append(rec, None).await {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(error = %e, "cannot audit an escalation"),
        }
    }

    fn spawn_run(&self, summary: RunSummary, idx: usize, cancel: Arc<AtomicBool>) {
        let engine = self.clone();
        let set = self.runbook_set();
        let Some(rb) = set.runbooks.get(idx).cloned() else { return };
        self.core.handle.spawn(async move {
            let host = Arc::new(crate::host::Host::new(engine.core.clone(), &summary.id, idx));
            let mut ctx = RunCtx::new(
                crate::script::RunInfo {
                    run_id: summary.id.clone(),
                    runbook: summary.runbook.clone(),
                    target: summary.target.clone(),
                    dry_run: summary.dry_run,
                    timeout_secs: rb.manifest.timeout_secs,
                    max_notes: engine.core.config.script.max_notes,
                },
                engine.core.clock.clone(),
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
            }))
            .unwrap_or_default();
            let script = engine.core.script.clone();
            let ast = rb.ast.clone();
            let outcome =
                tokio::task::spawn_blocking(move || script::execute(&script, &ast, ctx, event, params, target))
                    .await
                    .unwrap_or_else(|e| ScriptOutcome::Failed(format!("the run's thread panicked: {e}")));
            let preempted = engine.core.table().runs.get(&summary.id).and_then(|r| r.preempted_by.clone());
            let (o, err) = match outcome {
                ScriptOutcome::Succeeded => (RunOutcome::Succeeded, None),
                ScriptOutcome::Failed(m) => (RunOutcome::Failed, Some(m)),
                ScriptOutcome::TimedOut(m) => (RunOutcome::TimedOut, Some(m)),
                ScriptOutcome::Skipped(m) => (RunOutcome::Skipped, Some(m)),
                ScriptOutcome::Cancelled => (
                    RunOutcome::Cancelled,
                    Some(match preempted {
                        Some(by) => format!("preempted by critical run {by}"),
                        None => "cancelled while running".to_string(),
                    }),
                ),
            };
            if let Err(e) = engine.finish(&summary.id, o, err, None).await {
                tracing::error!(run = %summary.id, error = %e, "cannot record the end of a run");
            }
        });
    }

    /// End a run: release its holds, record the outcome, free its slot.
    pub(crate) async fn finish(
        &self,
        run: &str,
        outcome: RunOutcome,
        error: Option<String>,
        note: Option<&str>,
    ) -> Result<RunSummary, EngineError> {
        let (mut summary, held_on, keeps_on, was_running, fire) = {
            let t = self.core.table();
            let e = t.runs.get(run).ok_or_else(|| EngineError::NoSuchRun(run.into()))?;
            (
                e.summary.clone(),
                e.held_on.clone(),
                e.keeps_on.clone(),
                e.summary.state == RunState::Running,
                e.fire.clone(),
            )
        };
        // The run's holds go when it ends (those it kept stay, leased).
        let mut released = Vec::new();
        let mut left = Vec::new();
        for node in &held_on {
            match self.core.release_run_holds(&summary, node).await {
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
                Err(e) => left.push(format!("{node}: holds not released ({e}); their lease ends them")),
            }
        }
        let kept: Vec<String> = {
            let holds = self.core.holds_by_node();
            keeps_on
                .iter()
                .flat_map(|n| {
                    holds.get(n).into_iter().flatten().filter(|h| h.owner == run).map(move |h| {
                        format!(
                            "{n}: {} until {}",
                            h.value,
                            h.expires_at_ms
                                .map_or("a person releases it".into(), |t| crate::alerts::format_rfc3339_ms(t))
                        )
                    })
                })
                .collect()
        };
        summary.holds_kept = kept.clone();
        summary.holds_left = left.clone();
        let now = self.core.now();
        end_summary(&mut summary, outcome, error.clone(), now);
        if !held_on.is_empty() && outcome == RunOutcome::Succeeded {
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
        self.core
            .record_run(
                RecordKind::RunFinished,
                &summary,
                json!({"outcome": outcome.as_str(), "error": error, "note": note, "actions": summary.actions,
                    "target": summary.target, "holds_released": released, "holds_kept": kept, "holds_left": left}),
            )
            .await?;
        {
            let mut t = self.core.table();
            t.runs.remove(run);
            t.queue.retain(|id| id != run);
            let key = RunTable::key(&summary);
            if t.active_by_key.get(&key).is_some_and(|id| id == run) {
                t.active_by_key.remove(&key);
            }
            t.last_finished.insert(key, now);
            if was_running {
                t.running = t.running.saturating_sub(1);
                if let Some(c) = t.running_per_runbook.get_mut(&summary.runbook) {
                    *c = c.saturating_sub(1);
                }
            }
            t.node_locks.retain(|_, holder| holder != run);
        }
        if let Some(f) = fire {
            let mut b = self.core.brain();
            let crate::core::Brain { store, triggers, .. } = &mut *b;
            triggers.rearm(store, f.trigger, f.node, f.group.as_deref());
        }
        self.count_outcome(outcome);
        tracing::info!(run, runbook = %summary.runbook, target = %summary.target, outcome = outcome.as_str(), "run finished");
        // A slot is free: start what waits. (Boxed: pump → finish → pump.)
        let engine = self.clone();
        Box::pin(async move { engine.pump().await }).await;
        Ok(summary)
    }

    // ---------------------------------------------------------------- tick

    /// Periodic work: expire approvals, fire schedules and fleet triggers,
    /// mark silent nodes disconnected, start queued runs.
    pub async fn tick(&self) {
        let now = self.core.now();
        let expired: Vec<String> = self
            .core
            .table()
            .runs
            .values()
            .filter(|r| r.summary.state == RunState::PendingApproval && r.approval_deadline_ms <= now)
            .map(|r| r.summary.id.clone())
            .collect();
        for id in expired {
            if let Err(e) = self
                .finish(&id, RunOutcome::Cancelled, Some("approval expired: nobody approved it in time".into()), None)
                .await
            {
                tracing::error!(run = %id, error = %e, "cannot expire an approval");
            }
        }
        let stale_ms = (self.core.config.telemetry.stale_after_secs as i64).saturating_mul(1000);
        for n in &self.core.fleet.nodes {
            let mut st = n.state();
            if st.connected && now.saturating_sub(st.last_seen_ms) > stale_ms {
                st.connected = false;
            }
        }
        self.fleet_triggers(now).await;
        self.schedules(now).await;
        self.pump().await;
    }

    async fn schedules(&self, now: i64) {
        let set = self.runbook_set();
        for rb in &set.runbooks {
            let Trigger::Schedule { every_secs } = rb.manifest.trigger else { continue };
            let every_ms = (every_secs as i64).saturating_mul(1000);
            let due = {
                let mut t = self.core.table();
                let next = t.schedule_next.entry(rb.manifest.name.clone()).or_insert(now.saturating_add(every_ms));
                if *next <= now {
                    *next = now.saturating_add(every_ms);
                    true
                } else {
                    false
                }
            };
            if !due {
                continue;
            }
            for n in self.core.fleet.nodes.clone() {
                if !self.selector_matches(rb, &n) || !n.state().connected {
                    continue;
                }
                let req = RunRequest {
                    runbook: rb.manifest.name.clone(),
                    target: Target::node(&n.spec.name),
                    trigger: "schedule".into(),
                    detail: format!("scheduled every {every_secs} s"),
                    event: json!({"kind": "schedule", "every_secs": every_secs}),
                    event_ts_ms: now,
                    params: BTreeMap::new(),
                    dry_run: false,
                    requested_by: "engine".into(),
                };
                if let Err(e) = self.submit_inner(req, None).await {
                    tracing::error!(runbook = %rb.manifest.name, error = %e, "cannot submit a scheduled run");
                }
            }
        }
    }

    /// Whether a run on `target` of `runbook` would wait for approval.
    pub fn needs_approval(&self, runbook: &str, target: &Target) -> Result<bool, EngineError> {
        let set = self.runbook_set();
        let (_, rb) = set
            .get(runbook)
            .ok_or_else(|| EngineError::UnknownRunbook { name: runbook.into(), known: set.names().join(", ") })?;
        let n = self.core.target_nodes(target).len();
        Ok(approval_reason(&rb.manifest, nodes_changed(&rb.manifest, n)).is_some())
    }

    /// Runs executing right now.
    pub fn running(&self) -> usize {
        self.core.table().running
    }

    /// Runs that are executing and not asleep on the clock, plus runs ready
    /// to start: zero means the engine is idle until time moves.
    pub fn busy(&self) -> usize {
        let now = self.core.now();
        let t = self.core.table();
        let startable = t
            .queue
            .iter()
            .filter(|id| {
                t.runs.get(*id).is_some_and(|r| r.announced && r.not_before_ms <= now && self.blocker(&t, r).is_none())
            })
            .count();
        let running = t.running;
        drop(t);
        running.saturating_sub(self.core.clock.idle_sleepers())
            + startable
            + self.core.inflight_events.load(Ordering::SeqCst) as usize
    }

    /// Active runs as `id runbook target state`, for diagnostics.
    pub fn active_runs(&self) -> Vec<String> {
        let t = self.core.table();
        let mut v: Vec<String> = t
            .runs
            .values()
            .map(|r| format!("{} {} {} {:?}", r.summary.id, r.summary.runbook, r.summary.target, r.summary.state))
            .collect();
        v.sort();
        v
    }

    /// Runs waiting to start (queued or pending approval).
    pub fn queue_depth(&self) -> usize {
        self.core
            .table()
            .runs
            .values()
            .filter(|r| matches!(r.summary.state, RunState::Queued | RunState::PendingApproval))
            .count()
    }

    /// The class a run's runbook declared.
    pub fn run_class(&self, run: &str) -> Option<RunClass> {
        self.core.table().runs.get(run).map(|r| r.class)
    }
}

/// A fresh summary for a request.
pub(crate) fn new_summary(
    id: String,
    rb: &Runbook,
    req: &RunRequest,
    params: BTreeMap<String, crate::manifest::ParamValue>,
    now: i64,
) -> RunSummary {
    RunSummary {
        id,
        runbook: rb.manifest.name.clone(),
        handbook: rb.manifest.handbook.clone(),
        target: req.target.clone(),
        trigger: req.trigger.clone(),
        event: req.event.clone(),
        params,
        dry_run: req.dry_run,
        requested_by: req.requested_by.clone(),
        state: RunState::Queued,
        outcome: None,
        detail: req.detail.clone(),
        ending: None,
        why: req.detail.clone(),
        waiting_for: None,
        holds_kept: Vec::new(),
        holds_left: Vec::new(),
        created_ms: now,
        event_ts_ms: req.event_ts_ms,
        started_ms: None,
        finished_ms: None,
        actions: 0,
        approvals: Vec::new(),
        error: None,
        nodes: Vec::new(),
    }
}

/// Mark a summary finished with `outcome`.
pub(crate) fn end_summary(s: &mut RunSummary, outcome: RunOutcome, error: Option<String>, now: i64) {
    s.state = RunState::Finished;
    s.outcome = Some(outcome);
    s.finished_ms = Some(now);
    s.waiting_for = None;
    s.ending = Some(match (&error, outcome) {
        (_, RunOutcome::Succeeded) => format!("succeeded after {} action(s)", s.actions),
        (Some(e), o) => format!("{}: {e}", o.as_str()),
        (None, o) => o.as_str().to_string(),
    });
    s.error = error;
    s.why = format!("{} — {}", s.detail, s.ending.clone().unwrap_or_default());
}
