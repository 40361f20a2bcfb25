//! What a restart rebuilds and reconciles, so that stopping the engine —
//! a crash, an upgrade, a failover — forgets nothing and undoes nothing:
//!
//! 1. the executor's memory (alert dedup, cooldowns, attempt budgets,
//!    breaker windows) is replayed from the last day of the audit log;
//! 2. runs waiting for approval wait again; queued runs queue again (their
//!    event is re-checked when they start);
//! 3. runs that were running are resumed: each action intent without a
//!    result is reconciled with its agent by request id (never re-sent), the
//!    run's holds stay where they are (leased), and the run queues again to
//!    run its script from the top under fresh action ids — a restart keeps
//!    a mitigation in force, and only the run's own end (or a person)
//!    releases it. A run resumed [`MAX_RESUMES`] times already, or whose
//!    runbook is gone, is interrupted instead: its holds are released.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use nightshift_proto::{ActionStatusArgs, Op, Request};

use super::executor::end_summary;
use crate::audit::{AuditRecord, NewRecord, RecordKind, data};
use crate::core::Core;
use crate::engine::{Engine, EngineError};
use crate::runs::{RunOutcome, RunState, RunSummary};
use crate::runstate::runtable::{RunEntry, RunTable};

impl Engine {
    /// Rebuild and reconcile after a restart. Returns the ids of the runs
    /// found running, now interrupted.
    pub(crate) async fn recover(&self) -> Result<Vec<String>, EngineError> {
        let set = self.runbook_set();
        let longest_cooldown_ms =
            set.runbooks.iter().map(|r| (r.manifest.cooldown_secs as i64).saturating_mul(1000)).max().unwrap_or(0);
        // Back far enough for the cooldowns, a day of budgets, and the
        // findings and pages still remembered (`remind_after_secs`,
        // `repage_after_secs`: up to 30 days).
        let n = &self.core.config().notifications;
        let remembered_ms = (n.remind_after_secs.max(n.repage_after_secs) as i64).saturating_mul(1000);
        let since = self.core.now().saturating_sub(longest_cooldown_ms.max(86_400_000).max(remembered_ms));
        let records = self.core.audit().records_since(since)?;
        {
            let mut t = self.core.runs().table();
            let breaker_of = |name: &str| set.get(name).is_some_and(|(_, r)| r.manifest.breaker.is_some());
            for r in &records {
                t.replay(r, &breaker_of);
            }
        }
        tracing::info!(records = records.len(), "executor memory rebuilt from the audit log");
        // Alerts acknowledged (their `event_received` durable) whose handling
        // a crash cut off: handled now, in order — a 200 is a promise.
        let unhandled: Vec<(crate::signals::alerts::Alert, String)> = {
            let t = self.core.runs().table();
            records
                .iter()
                .filter(|r| r.payload::<data::AlertReceived>().is_ok_and(|p| p.acked))
                .filter_map(Engine::alert_of_record)
                .filter(|(a, _)| !t.alert_handled(&crate::runstate::runtable::alert_key(&a.status, &a.key())))
                .collect()
        };
        // Pages the last engine had not delivered: sent again (invariant 19).
        let pages = self.rebuild_outbox(&records);
        if pages > 0 {
            tracing::warn!(pages, "pages not yet delivered before the restart: retried now");
        }
        // Faults and marks outlive any replay window: their own index.
        let n = self.rebuild_health()?;
        tracing::info!(records = n, "health model and node marks rebuilt from the audit log");
        // Maintenance windows too: a node under one stays hands-off.
        let windows = self.rebuild_windows()?;
        if windows > 0 {
            self.apply_windows().await;
            tracing::info!(windows, "maintenance windows rebuilt from the audit log");
        }
        let mut interrupted = Vec::new();
        let mut resumed = Vec::new();
        for s in self.core.audit().unfinished_runs()? {
            let records = self.core.audit().run_records(&s.id)?;
            let before = resumes(&records);
            match (s.state, set.get(&s.runbook)) {
                (RunState::Running, Some((_, rb))) if before < MAX_RESUMES => {
                    self.resume(s.clone(), rb, &records, before + 1).await?;
                    resumed.push(s.id);
                }
                (RunState::PendingApproval | RunState::Queued, Some((_, rb))) => {
                    let m = &rb.manifest;
                    let mut t = self.core.runs().table();
                    let pending = s.state == RunState::PendingApproval;
                    let shared_cause = super::breaker::after_restart(&t, m, &s, &records, self.core.now());
                    t.activate(
                        RunTable::key(&s),
                        RunEntry {
                            announced: true,
                            // Holds of an earlier life (resumed, stopped
                            // again before it started) go at its end; its
                            // next ids must still be its own.
                            held_on: if before > 0 { changed_nodes(&records) } else { Vec::new() },
                            acted: before > 0 && !changed_nodes(&records).is_empty(),
                            resumed: before,
                            resume_wait_until_ms: (before > 0).then(|| self.resume_deadline()),
                            shared_cause,
                            ..RunEntry::new(s.clone(), m)
                        },
                    );
                    if !pending {
                        t.enqueue(s.id.clone(), m.priority);
                    }
                    tracing::info!(run = %s.id, state = s.state.as_str(), "run restored after a restart");
                }
                _ => {
                    self.interrupt(s.clone(), &records).await?;
                    interrupted.push(s.id);
                }
            }
        }
        // An alert an interrupted run held back (the note of a life before)
        // is offered again, as a run's end in its own life offers it: the
        // run did not do its work.
        // And one a run's end owed (the last life died before its offer).
        let held_back: Vec<(crate::runstate::runtable::WaitingAlert, String, RunOutcome)> = {
            let mut t = self.core.runs().table();
            let mut v: Vec<_> = interrupted
                .iter()
                .filter_map(|id| Some((t.take_waiting_alert(id)?, id.clone(), RunOutcome::Interrupted)))
                .collect();
            v.extend(t.take_owed_offers());
            v
        };
        if !resumed.is_empty() {
            tracing::warn!(runs = ?resumed, "runs in flight at the last stop resume; their holds stayed in place");
        }
        if !unhandled.is_empty() || !held_back.is_empty() {
            tracing::info!(
                alerts = unhandled.len(),
                held_back = held_back.len(),
                "handling alerts accepted before the restart"
            );
            let engine = self.clone();
            self.core.signals().backlog().alerts_in(unhandled.len() as u64);
            self.core.signals().backlog().batch_started();
            self.core.handle().spawn(async move {
                for (w, run, outcome) in held_back {
                    engine.reconsider(w, &run, outcome).await;
                }
                for (a, poster) in unhandled {
                    engine.handle_alert(a, &poster).await;
                    engine.core.signals().backlog().alert_out();
                }
                engine.core.signals().backlog().batch_done();
            });
        }
        Ok(interrupted)
    }

    /// Resume run `s`, found running after a restart, for the `k`-th time:
    /// reconcile its open intents, leave its holds in place, record why,
    /// and queue it again (its script starts from the top; its end releases
    /// the holds of every life it had, as any run's end does).
    async fn resume(
        &self,
        mut s: RunSummary,
        rb: &crate::runbooks::runbook::Runbook,
        records: &[AuditRecord],
        k: u32,
    ) -> Result<(), EngineError> {
        let touched = self.reconcile_open(&s, records).await?;
        let m = &rb.manifest;
        s.state = RunState::Queued;
        s.started_ms = None;
        let holds = if touched.is_empty() {
            "it had changed nothing yet".to_string()
        } else {
            format!("its holds on {} stay in place until it ends", touched.join(", "))
        };
        self.core
            .record_run(
                RecordKind::Note,
                &s,
                &data::Note {
                    text: format!(
                        "resumed after an engine restart ({k} of at most {MAX_RESUMES}): the script starts again from the top once this engine has the node's inventory and readings of its own (at most {} s); {holds}",
                        self.core.config().limits.resume_wait_secs
                    ),
                    resumed: Some(k),
                    ..Default::default()
                },
            )
            .await?;
        let mut t = self.core.runs().table();
        let shared_cause = super::breaker::after_restart(&t, m, &s, records, self.core.now());
        t.activate(
            RunTable::key(&s),
            RunEntry {
                announced: true,
                // It acted in an earlier life: no "condition cleared before
                // the first change" skip — its own holds may be what keeps
                // the condition down, and a skip would release them.
                acted: !touched.is_empty(),
                held_on: touched,
                resumed: k,
                resume_wait_until_ms: Some(self.resume_deadline()),
                // One node of a shared cause stays one after a restart: its
                // drains stay refused, its pages notes.
                shared_cause,
                ..RunEntry::new(s.clone(), m)
            },
        );
        t.enqueue(s.id.clone(), m.priority);
        tracing::info!(run = %s.id, resumed = k, "run resumed after a restart");
        Ok(())
    }

    /// Until when a run resumed now may wait for its nodes' inventory and
    /// first readings (`limits.resume_wait_secs`).
    fn resume_deadline(&self) -> i64 {
        self.core.now().saturating_add((self.core.config().limits.resume_wait_secs as i64).saturating_mul(1000))
    }

    /// What a resumed run still waits for before it may start, if anything:
    /// the inventory and a first reading, from this engine, of the node it
    /// targets and of every node it holds on. A new engine knows nothing;
    /// a script that judged from nothing would conclude "nothing to do" and
    /// release a mitigation still needed (invariant 18).
    pub(crate) fn resume_unready(&self, target: Option<&str>, held_on: &[String]) -> Option<String> {
        let mut missing = Vec::new();
        for name in target.into_iter().chain(held_on.iter().map(String::as_str)) {
            if missing.iter().any(|(n, _): &(String, &str)| n == name) {
                continue;
            }
            let Some(node) = self.core.fleet().get(name) else { continue };
            let st = node.state();
            if st.inventory.is_none() {
                missing.push((name.to_string(), "inventory"));
            } else if st.first_reading_ms.is_none() {
                missing.push((name.to_string(), "first reading"));
            }
        }
        if missing.is_empty() {
            return None;
        }
        Some(format!(
            "resumed after a restart: waits for this engine's {}",
            missing.iter().map(|(n, what)| format!("{what} of {n}")).collect::<Vec<_>>().join(", ")
        ))
    }

    /// Resumed runs that may not start yet, and why: each waits for this
    /// engine's inventory and first reading of its nodes. One whose wait
    /// ran out ends failed here — its holds kept, a person paged.
    pub(crate) async fn resume_gate(&self, now: i64) -> BTreeMap<String, String> {
        let waiting: Vec<(String, Option<String>, Vec<String>, i64)> = {
            let t = self.core.runs().table();
            t.queue()
                .iter()
                .filter_map(|id| {
                    let r = t.run(id)?;
                    Some((id.clone(), r.summary.target.node.clone(), r.held_on.clone(), r.resume_wait_until_ms?))
                })
                .collect()
        };
        let mut gate = BTreeMap::new();
        let mut expired = Vec::new();
        for (id, node, held_on, until) in waiting {
            match self.resume_unready(node.as_deref(), &held_on) {
                None => {
                    if let Some(r) = self.core.runs().table().run_mut(&id) {
                        r.resume_wait_until_ms = None;
                    }
                }
                Some(why) if now < until => {
                    gate.insert(id, why);
                }
                Some(why) => expired.push((id, why)),
            }
        }
        for (id, why) in expired {
            let wait = self.core.config().limits.resume_wait_secs;
            let why = format!("{why}, and none came within {wait} s (limits.resume_wait_secs): it could not decide");
            // Boxed: pump → finish → pump.
            let engine = self.clone();
            if let Err(e) = Box::pin(async move { engine.finish(&id, RunOutcome::Failed, Some(why), None).await }).await
            {
                tracing::error!(error = %e, "cannot record a resumed run that could not decide");
            }
        }
        gate
    }

    /// Page a person, once, for a resumed run that ended without deciding:
    /// what it holds stays, and they decide what happens to it.
    pub(crate) async fn page_undecided_after_resume(&self, s: &RunSummary, why: &str, kept: &[String]) {
        let holds = if kept.is_empty() {
            "its holds could not be renewed: their earlier lease still ends them".to_string()
        } else {
            format!(
                "its holds stay in force ({}); release them with `nightshift holds release` once safe",
                kept.join("; ")
            )
        };
        let text = format!(
            "run {} ({}, {}) failed after an engine restart resumed it: {why}; {holds}",
            s.id, s.runbook, s.target
        );
        let rec = self
            .core
            .notice_record(RecordKind::Escalation, &text, "escalation", s.dry_run, s.shadow)
            .run(&s.id)
            .node(s.target.node.as_deref())
            .gpu(s.target.gpu)
            .runbook(&s.runbook);
        tracing::warn!(run = %s.id, runbook = %s.runbook, reason = why, "a resumed run could not decide: its holds stay, a person is paged");
        match self.core.audit().append(rec, Some(s.clone())).await {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(run = %s.id, error = %e, "cannot audit an escalation"),
        }
    }

    /// A resumed run that could not decide (its script failed or ran out
    /// of time, or this engine never saw its node) keeps the holds of its
    /// earlier lives on `held_on`, renewed for its lease: a restart never
    /// weakens a mitigation; a person decides. Returns the nodes kept.
    pub(crate) async fn keep_undecided(&self, s: &RunSummary, held_on: Vec<String>) -> Vec<String> {
        let timeout = self.runbook_set().get(&s.runbook).map_or(3600, |(_, rb)| rb.manifest.timeout_secs);
        let lease = crate::core::hold_lease_secs(timeout);
        let mut kept = Vec::new();
        for node in held_on {
            match self.core.keep_run_holds(s, &node, lease).await {
                Ok(()) => kept.push(node),
                // Not kept: its earlier lease still ends it; released it is not.
                Err(e) => tracing::error!(run = %s.id, node = %node, error = %e, "cannot keep a resumed run's holds"),
            }
        }
        kept
    }

    /// Reconcile an unfinished run's open intents, release its holds, and
    /// mark it interrupted.
    async fn interrupt(&self, mut s: RunSummary, records: &[AuditRecord]) -> Result<(), EngineError> {
        let touched = self.reconcile_open(&s, records).await?;
        let mut left = Vec::new();
        for node in &touched {
            if let Err(e) = self.core.release_run_holds(&s, node).await {
                left.push(format!("{node}: holds not released ({e}); their lease ends them"));
            }
        }
        s.holds_left = left;
        let why = match resumes(records) {
            0 => "the engine stopped while this run was in flight".to_string(),
            n => format!(
                "the engine stopped while this run was in flight, and it was resumed {n} times already (at most {MAX_RESUMES}): its holds are released"
            ),
        };
        end_summary(&mut s, RunOutcome::Interrupted, Some(why), self.core.now());
        self.core
            .record_run(
                RecordKind::RunFinished,
                &s,
                &crate::audit::data::RunFinished {
                    outcome: "interrupted".into(),
                    recovered: Some(true),
                    target: Some(s.target.clone()),
                    holds_left: Some(s.holds_left.clone()),
                    starts_cooldown: Some(false),
                    ..Default::default()
                },
            )
            .await?;
        self.count_outcome(RunOutcome::Interrupted);
        Ok(())
    }

    /// Reconcile each of a run's action intents that has no result with its
    /// agent, by request id (`action_status`, never re-sent), recording what
    /// the agent says. Returns the nodes the run changed (where it may hold).
    async fn reconcile_open(&self, s: &RunSummary, records: &[AuditRecord]) -> Result<Vec<String>, EngineError> {
        let mut open: BTreeMap<String, (AuditRecord, String)> = BTreeMap::new();
        for (r, a) in action_refs(records) {
            if r.kind == RecordKind::ActionIntent {
                open.insert(a.action_id, (r.clone(), a.op));
            } else {
                open.remove(&a.action_id);
            }
        }
        for (action_id, (intent, op)) in open {
            let node = intent.node.clone().unwrap_or_default();
            let status = match self.core.fleet().get(&node) {
                Some(n) => {
                    let req = Request::new(
                        format!("{action_id}-status"),
                        Op::ActionStatus(ActionStatusArgs { request_id: action_id.clone() }),
                    );
                    match n.transport.call(req).await {
                        Ok(r) => r.result.unwrap_or(Value::Null),
                        Err(e) => json!({"state": "unreachable", "error": e.to_string()}),
                    }
                }
                None => json!({"state": "unknown node"}),
            };
            let rec = NewRecord::typed(
                RecordKind::ActionResult,
                "engine",
                &data::ActionReconciled { action_id, op, reconciled: true, agent_status: status },
            )
            .run(&s.id)
            .node(Some(&node))
            .gpu(intent.gpu)
            .runbook(&s.runbook);
            self.core.audit().append(rec, None).await?;
        }
        Ok(changed_nodes(records))
    }
}

/// A run's action intents and results, with their action ids.
fn action_refs(records: &[AuditRecord]) -> impl Iterator<Item = (&AuditRecord, data::ActionRef)> {
    records.iter().filter(|r| matches!(r.kind, RecordKind::ActionIntent | RecordKind::ActionResult)).filter_map(|r| {
        match r.payload::<data::ActionRef>() {
            Ok(a) if !a.action_id.is_empty() => Some((r, a)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "recovery passes over an action record it cannot read");
                None
            }
        }
    })
}

/// The nodes a run sent a real (not dry) action to: where it may hold.
fn changed_nodes(records: &[AuditRecord]) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for (r, a) in action_refs(records) {
        if r.kind == RecordKind::ActionIntent
            && !a.dry_run
            && let Some(n) = &r.node
            && !nodes.contains(n)
        {
            nodes.push(n.clone());
        }
    }
    nodes
}

/// How many times a restart resumes one run before the next restart
/// interrupts it instead: a run whose own work brings the engine down must
/// not bring it down forever.
pub const MAX_RESUMES: u32 = 3;

/// How many times a run was resumed, by its records.
fn resumes(records: &[AuditRecord]) -> u32 {
    records
        .iter()
        .filter(|r| r.kind == RecordKind::Note)
        .filter_map(|r| r.payload::<data::Note>().ok()?.resumed)
        .max()
        .unwrap_or(0)
}
