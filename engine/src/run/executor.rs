//! The executor: run requests through admission (`admission.rs`) into the
//! run table, the queue, a start that re-checks the event, the script on a
//! blocking thread (`runbooks/script/`, `host/`), and a finish that releases the
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
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::audit::{NewRecord, RecordKind};
use crate::core::Core;
use crate::engine::{Engine, EngineError, RunRequest, Submitted};
use crate::runbooks::manifest::Scope;
use crate::runbooks::runbook::Runbook;
use crate::runs::{ApprovalDecision, RunOutcome, RunState, RunSummary};
use crate::runstate::admission::{Ask, Decision, admit, approval_reason, nodes_changed};
use crate::runstate::runtable::{BreakerFire, CancelledBy, FireRef, RunEntry};

impl Engine {
    /// [`Engine::submit`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn submit_request(&self, req: RunRequest) -> Result<Submitted, EngineError> {
        // A leader still catching up and recovering takes no runs yet: its
        // recovery would meet them as another leader's leftovers.
        if let Some(l) = self.core.leadership()
            && !l.is_ready()
        {
            return Err(EngineError::Audit(crate::audit::AuditError::NotLeader(
                "not ready: taking over or standing by; retry in a few seconds".into(),
            )));
        }
        // A store stopped at a durability failure takes nothing new.
        if let Some(e) = self.core.audit().stopped() {
            return Err(EngineError::Audit(e));
        }
        self.submit_inner(req, None).await
    }

    /// What a submission that repeats an earlier one's `Idempotency-Key`
    /// answers: the run that one started, as it is now — once its
    /// `run_queued` is durable (the first submission may still be writing
    /// it: an answer is a promise).
    async fn submitted_again(&self, id: &str) -> Result<Submitted, EngineError> {
        let mut waited = 0;
        let run = loop {
            if let Some(run) = self.core.audit().run(id)? {
                break run;
            }
            if waited >= 5_000 {
                return Err(EngineError::Audit(crate::audit::AuditError::NotLeader(format!(
                    "the first submission with this Idempotency-Key (run {id}) is not recorded yet; retry in a few seconds"
                ))));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            waited += 10;
        };
        tracing::info!(run = %run.id, "a run submitted again with the same Idempotency-Key: answered with the run it started");
        Ok(match (run.state, run.outcome) {
            (RunState::PendingApproval, _) => Submitted::PendingApproval { run },
            (_, Some(RunOutcome::Refused)) => Submitted::Refused { run },
            _ => Submitted::Queued { run },
        })
    }

    pub(crate) async fn drop_event(&self, reason: &str, node: Option<&str>) -> Result<(), EngineError> {
        self.core.counters().add(crate::base::counters::Count::EventsDropped, 1);
        self.core
            .audit()
            .append(
                NewRecord::typed(
                    RecordKind::EventDropped,
                    "engine",
                    &crate::audit::data::EventDropped { reason: reason.into() },
                )
                .node(node),
                None,
            )
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
        let Some((_, rb)) = set.get(&req.runbook) else {
            return Err(EngineError::UnknownRunbook { name: req.runbook.clone(), known: set.names().join(", ") });
        };
        let m = &rb.manifest;
        let target_nodes = self.check_request(rb, &req)?;
        let params = m.resolve_params(&req.params).map_err(EngineError::BadParams)?;
        let now = self.core.now();
        let manual = req.trigger == "manual";
        // A runbook (or the whole fleet) in shadow mode: its automatic runs
        // go through admission as if real but send every action as a dry
        // run. A paused fleet starts none (admission suppresses them).
        let (fleet, set_by) = self.fleet_mode();
        let paused = (fleet == crate::runbooks::modes::FleetMode::Paused).then(|| match &set_by {
            Some((by, why)) => format!("by {by}: {why}"),
            None => "initial_fleet_mode: paused".to_string(),
        });
        let shadow = !manual
            && (fleet == crate::runbooks::modes::FleetMode::Shadow
                || self.runbook_mode(&m.name) == crate::runbooks::manifest::Mode::Shadow);
        let mut req = req;
        if shadow {
            req.dry_run = true;
        }
        let would_need_approval = shadow.then(|| approval_reason(m, nodes_changed(m, target_nodes, &params))).flatten();
        let hands_off =
            self.core.target_nodes(&req.target).iter().find_map(|n| n.state().hands_off_words(&n.spec.name));
        let key = (req.runbook.clone(), req.target.clone());
        // A manual run submitted again with the same `Idempotency-Key` (a
        // retry after a lost answer) is the run it started.
        let idem = req.event["idempotency_key"]
            .as_str()
            .filter(|_| manual)
            .map(|k| crate::runstate::runtable::idempotency_key(&req.requested_by, k));
        // Decide and take the decision's effect on the table under one lock,
        // so two requests for one target cannot both be admitted.
        let (decision, summary, again) = {
            let mut t = self.core.runs().table();
            let again = idem.as_deref().and_then(|k| t.idempotent_run(k, now));
            let ask = Ask {
                manifest: m,
                target: &req.target,
                manual,
                event_ts_ms: req.event_ts_ms,
                dry_run: req.dry_run,
                hands_off: hands_off.as_deref(),
                target_nodes,
                params: &params,
                paused: paused.as_deref(),
            };
            let d = if again.is_some() {
                Decision::Drop { reason: String::new() }
            } else {
                admit(&t, &ask, now, &self.core.config().limits)
            };
            if let Decision::Suppress { existing: Some(run), .. } = &d
                && req.trigger == "alert"
            {
                // Under the table's lock: the run cannot end in between.
                t.hold_alert(
                    run.clone(),
                    crate::runstate::runtable::WaitingAlert {
                        runbook: req.runbook.clone(),
                        target: req.target.clone(),
                        detail: req.detail.clone(),
                        event: req.event.clone(),
                        event_ts_ms: req.event_ts_ms,
                        requested_by: req.requested_by.clone(),
                    },
                );
            }
            // A telemetry fire the open breaker holds back is part of the
            // storm: it keeps the breaker open while the storm lasts (the
            // shared cause is still there), so the nodes are not handled
            // one by one the moment the window ends. (A pending fault is
            // offered again every tick and must get its turn once the
            // breaker closes: hardware evidence, per GPU.)
            if let (Decision::Suppress { existing: None, .. }, Some(b), Some(node)) =
                (&d, m.breaker.as_ref(), req.target.node.clone())
                && req.trigger != "fault"
                && let Some(br) = t.breaker_mut(&m.name)
                && br.tripped_until > now
            {
                br.fires.push_back(BreakerFire { ts_ms: now, node, gpu: req.target.gpu });
                br.tripped_until =
                    br.tripped_until.max(now.saturating_add((b.window_secs as i64).saturating_mul(1000)));
            }
            let summary = match &d {
                Decision::Suppress { first: true, .. } => {
                    t.note_suppression(key.clone());
                    None
                }
                Decision::Refuse { .. } => {
                    let s = new_summary(self.core.ids().run(), rb, &req, params.clone(), now, shadow);
                    t.finished(key.clone(), now);
                    Some(s)
                }
                Decision::Admit { approval, hold_ms } => {
                    let mut s = new_summary(self.core.ids().run(), rb, &req, params.clone(), now, shadow);
                    if approval.is_some() {
                        s.state = RunState::PendingApproval;
                    }
                    t.admitted(&key, now);
                    let mut shared_cause = None;
                    if let Some(b) = &m.breaker
                        && let Some(node) = req.target.node.clone()
                    {
                        let br = t.breaker_or_new(&m.name);
                        br.fires.push_back(BreakerFire { ts_ms: now, node, gpu: req.target.gpu });
                        // Admitted into an open reversible-only breaker: one
                        // more node of the shared cause, which keeps it open.
                        if b.on_trip == crate::runbooks::manifest::OnTrip::ReversibleOnly
                            && br.tripped_until > now
                            && super::breaker::joins(&s)
                        {
                            br.tripped_until =
                                br.tripped_until.max(now.saturating_add((b.window_secs as i64).saturating_mul(1000)));
                            shared_cause = Some(br.reason.clone());
                        }
                    }
                    t.activate(
                        key.clone(),
                        RunEntry {
                            not_before_ms: now.saturating_add(*hold_ms),
                            approval_deadline_ms: now
                                .saturating_add((m.approval.expire_secs as i64).saturating_mul(1000)),
                            fire,
                            event_ts_ms: req.event_ts_ms,
                            shared_cause,
                            ..RunEntry::new(s.clone(), m)
                        },
                    );
                    if approval.is_none() {
                        t.enqueue(s.id.clone(), m.priority);
                    }
                    Some(s)
                }
                _ => None,
            };
            if let (Some(k), Some(s)) = (idem, &summary) {
                t.remember_idempotent(k, s.id.clone(), now);
            }
            (d, summary, again)
        };
        if let Some(id) = again {
            let found = self.submitted_again(&id).await?;
            // The same key for a different request is a mistake, not a retry.
            if let Some(first) = found.run()
                && (first.runbook != req.runbook
                    || first.target != req.target
                    || first.dry_run != req.dry_run
                    || first.params != params)
            {
                return Err(EngineError::IdempotencyConflict {
                    key: req.event["idempotency_key"].as_str().unwrap_or_default().to_string(),
                    run: first.id.clone(),
                    what: format!("{} on {}", first.runbook, first.target),
                });
            }
            return Ok(found);
        }
        let queued_data = |s: &RunSummary| crate::audit::data::RunQueued {
            trigger: req.trigger.clone(),
            detail: req.detail.clone(),
            event: req.event.clone(),
            dry_run: req.dry_run,
            target: Some(s.target.clone()),
            priority: m.priority.as_str().into(),
            class: json!(m.class),
            shadow: s.shadow.then_some(true),
            would_need_approval: if s.shadow { would_need_approval.clone() } else { None },
        };
        match decision {
            Decision::Drop { reason } => {
                self.drop_event(&reason, req.target.node.as_deref()).await?;
                Ok(Submitted::Dropped { reason })
            }
            Decision::Shed { reason } => {
                self.core.counters().add(crate::base::counters::Count::EventsShed, 1);
                self.drop_event(&reason, req.target.node.as_deref()).await?;
                Ok(Submitted::Dropped { reason })
            }
            Decision::Suppress { reason, existing, first } => {
                self.core.counters().add(crate::base::counters::Count::RunsSuppressed, 1);
                // An alert held back by an active run is noted every time,
                // not only an episode's first: each acknowledged alert says
                // on the chain what it led to (invariant 12), and a restart
                // reads from the note what to offer again should that run
                // end without doing its work (`RunTable::replay`).
                let held = existing.is_some() && req.trigger == "alert";
                if first || held {
                    let mut rec = NewRecord::typed(
                        RecordKind::TriggerSuppressed,
                        &req.requested_by,
                        &crate::audit::data::TriggerSuppressed {
                            reason: reason.clone(),
                            detail: req.detail.clone(),
                            trigger: req.trigger.clone(),
                            target: Some(req.target.clone()),
                            event: held.then(|| req.event.clone()),
                            event_ts_ms: held.then_some(req.event_ts_ms),
                        },
                    )
                    .node(req.target.node.as_deref())
                    .gpu(req.target.gpu)
                    .runbook(&req.runbook);
                    if let Some(e) = &existing {
                        rec = rec.run(e);
                    }
                    self.core.audit().append(rec, None).await?;
                }
                Ok(Submitted::Suppressed { reason, existing_run: existing })
            }
            Decision::Refuse { reason } => {
                let mut s =
                    summary.unwrap_or_else(|| new_summary(self.core.ids().run(), rb, &req, params, now, shadow));
                self.core.record_run(RecordKind::RunQueued, &s, &queued_data(&s)).await?;
                end_summary(&mut s, RunOutcome::Refused, Some(reason.clone()), now);
                self.core
                    .record_run(
                        RecordKind::RunFinished,
                        &s,
                        &crate::audit::data::RunFinished {
                            outcome: "refused".into(),
                            reason: Some(reason.clone()),
                            target: Some(s.target.clone()),
                            ..Default::default()
                        },
                    )
                    .await?;
                self.count_outcome(RunOutcome::Refused);
                // One page per node and finding: the budget spent on a
                // second GPU, or the same refusal a cooldown later, is the
                // open page's (a note on the run), until the repage time.
                let text = format!("{}: {reason}", s.runbook);
                let said =
                    s.target.node.as_deref().map(|n| self.core.already_said(true, &s.runbook, n, None, &text, None));
                if let Some(crate::base::outbox::Said::Again { seq }) = said {
                    let note = crate::audit::data::Note {
                        text: format!("already paged (audit #{seq}), not paged again: {text}"),
                        ..Default::default()
                    };
                    self.core.record_run(RecordKind::Note, &s, &note).await?;
                } else {
                    self.text_record(&s, RecordKind::Escalation, &text).await;
                }
                Ok(Submitted::Refused { run: s })
            }
            Decision::Admit { approval, .. } => {
                let s = summary.ok_or_else(|| EngineError::NoSuchRun("admitted run".into()))?;
                if manual || approval.is_some() {
                    // Reported to a person (the run id, the approval asked
                    // for): durable first.
                    self.core.record_run(RecordKind::RunQueued, &s, &queued_data(&s)).await?;
                } else {
                    // An automatic run: in order, not awaited — its start,
                    // first action or end waits for a later record.
                    self.core.record_run_ordered(RecordKind::RunQueued, &s, &queued_data(&s))?;
                }
                let shared = self.core.runs().table().run(&s.id).and_then(|r| r.shared_cause.clone());
                if let Some(why) = shared {
                    self.core.record_run(RecordKind::Note, &s, &super::breaker::note(why)).await?;
                }
                if let Some(why) = &approval {
                    self.core
                        .record_run(
                            RecordKind::ApprovalRequested,
                            &s,
                            &crate::audit::data::ApprovalRequested {
                                reason: why.clone(),
                                expires_in_secs: m.approval.expire_secs,
                                nodes_changed: nodes_changed(m, target_nodes, &s.params),
                            },
                        )
                        .await?;
                    self.text_record(
                        &s,
                        RecordKind::Notification,
                        &format!("run {} ({}) on {} needs approval: {why}", s.id, s.runbook, s.target),
                    )
                    .await;
                }
                if let Some(r) = self.core.runs().table().run_mut(&s.id) {
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
        let rec = self
            .core
            .notice_record(kind, text, severity, s.dry_run, s.shadow)
            .run(&s.id)
            .node(s.target.node.as_deref())
            .runbook(&s.runbook);
        tracing::warn!(run = %s.id, runbook = %s.runbook, kind = kind.as_str(), text, "notification");
        match self.core.audit().append(rec, None).await {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(error = %e, "cannot audit a notification"),
        }
    }

    pub(crate) fn count_outcome(&self, o: RunOutcome) {
        self.core.counters().ended(o.as_str());
    }

    // ---------------------------------------------------------------- approvals

    /// Approve a run waiting for approval. Nobody approves a run they asked
    /// for or whose event they posted.
    pub(crate) async fn approve(&self, run: &str, by: &str) -> Result<RunSummary, EngineError> {
        self.decide(run, by, true, None).await
    }

    /// Reject a run waiting for approval, saying why.
    pub(crate) async fn reject(&self, run: &str, by: &str, reason: &str) -> Result<RunSummary, EngineError> {
        if !nightshift_proto::names::has_visible_text(reason) {
            return Err(EngineError::MissingReason);
        }
        if let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason) {
            return Err(EngineError::BadParams(problem));
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
            let mut t = self.core.runs().table();
            let Some(entry) = t.run_mut(run) else {
                // Not in flight: finished (say how), or never existed.
                return Err(match self.core.audit().run(run).ok().flatten() {
                    Some(s) => EngineError::NotAwaitingApproval {
                        run: run.to_string(),
                        state: match s.outcome {
                            Some(o) => format!("finished ({})", o.as_str()),
                            None => s.state.as_str().to_string(),
                        },
                    },
                    None => EngineError::NoSuchRun(run.into()),
                });
            };
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
            } else {
                entry.cancelled_by = Some(CancelledBy { by: by.into(), reason: reason.clone(), mode_switch: false });
            }
            let (s, prio) = (entry.summary.clone(), entry.priority);
            if approved {
                t.enqueue(s.id.clone(), prio);
            }
            s
        };
        if approved {
            self.core
                .record_run_as(
                    RecordKind::Approved,
                    &summary,
                    by,
                    &crate::audit::data::Approval { by: by.into(), reason: reason.clone() },
                )
                .await?;
            self.pump().await;
            Ok(summary)
        } else {
            let why = format!("rejected by {by}: {}", reason.clone().unwrap_or_default());
            self.core
                .record_run_as(
                    RecordKind::Rejected,
                    &summary,
                    by,
                    &crate::audit::data::Approval { by: by.into(), reason: reason.clone() },
                )
                .await?;
            self.finish(run, RunOutcome::Cancelled, Some(why), None).await
        }
    }

    /// Cancel a queued, pending or running run as `by` (the actor of its
    /// end in the audit), saying why when they did. A second cancel of a
    /// running run changes nothing: the first one's words stand.
    pub(crate) async fn cancel(&self, run: &str, by: &str, reason: Option<&str>) -> Result<(), EngineError> {
        self.cancel_as(run, by, reason, false).await
    }

    /// [`Engine::cancel`]; `mode_switch`: the fleet's mode changed under
    /// the run (no cooldown, what it held back offered again).
    pub(crate) async fn cancel_as(
        &self,
        run: &str,
        by: &str,
        reason: Option<&str>,
        mode_switch: bool,
    ) -> Result<(), EngineError> {
        if let Some(problem) = reason.and_then(|r| nightshift_proto::names::free_text_problem("reason", r)) {
            return Err(EngineError::BadParams(problem));
        }
        let reason = reason.map(str::trim).filter(|r| !r.is_empty()).map(str::to_string);
        let (running, words) = {
            let mut t = self.core.runs().table();
            match t.run_mut(run) {
                Some(e) if e.summary.state == RunState::Finished => {
                    return Err(EngineError::AlreadyFinished {
                        run: run.into(),
                        outcome: e.summary.outcome.map(|o| o.as_str().to_string()).unwrap_or_else(|| "ended".into()),
                    });
                }
                Some(e) => {
                    let c = e.cancelled_by.get_or_insert_with(|| CancelledBy { by: by.into(), reason, mode_switch });
                    let words = c.words();
                    e.cancel.store(true, Ordering::SeqCst);
                    (e.summary.state == RunState::Running, words)
                }
                None => {
                    drop(t);
                    // Finished (it left the table) or never was.
                    return Err(match self.core.audit().run(run)? {
                        Some(s) => EngineError::AlreadyFinished {
                            run: run.into(),
                            outcome: s.outcome.map(|o| o.as_str().to_string()).unwrap_or_else(|| "ended".into()),
                        },
                        None => EngineError::NoSuchRun(run.into()),
                    });
                }
            }
        };
        if !running {
            self.finish(run, RunOutcome::Cancelled, Some(format!("cancelled {words} before it started")), None).await?;
        }
        Ok(())
    }

    /// What a run of `req` would be, decided as `submit` decides it and
    /// changing nothing: the nodes it targets, how many it may change,
    /// whether it waits for approval and why (the CLI shows this, never a
    /// count of its own).
    pub(crate) fn plan(&self, req: &RunRequest) -> Result<Plan, EngineError> {
        let set = self.runbook_set();
        let Some((_, rb)) = set.get(&req.runbook) else {
            return Err(EngineError::UnknownRunbook { name: req.runbook.clone(), known: set.names().join(", ") });
        };
        let m = &rb.manifest;
        let target_nodes = self.check_request(rb, req)?;
        let params = m.resolve_params(&req.params).map_err(EngineError::BadParams)?;
        let changed = nodes_changed(m, target_nodes, &params);
        let approval = if req.dry_run { None } else { approval_reason(m, changed) };
        let nodes: Vec<String> = self.core.target_nodes(&req.target).iter().map(|n| n.spec.name.clone()).collect();
        let hands_off: Vec<String> =
            nodes.iter().filter(|n| self.core.fleet().get(n).is_some_and(|x| x.state().hands_off())).cloned().collect();
        Ok(Plan {
            runbook: m.name.clone(),
            digest: rb.digest.clone(),
            target: req.target.clone(),
            nodes,
            nodes_changed: changed,
            needs_approval: approval.is_some(),
            approval_reason: approval,
            dry_run: req.dry_run,
            params,
            hands_off,
        })
    }
}

/// What a run would be (`POST /api/v1/runs/plan`), decided as a submit
/// decides it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Plan {
    pub runbook: String,
    /// The runbook's digest in force.
    pub digest: String,
    pub target: crate::runs::Target,
    /// The nodes it targets, by name.
    pub nodes: Vec<String>,
    /// How many it may change.
    pub nodes_changed: u32,
    pub needs_approval: bool,
    pub approval_reason: Option<String>,
    pub dry_run: bool,
    /// The parameters, defaults filled in.
    pub params: BTreeMap<String, crate::runbooks::manifest::ParamValue>,
    /// The targeted nodes under hands-off (an automatic run would be
    /// refused there; a person's runs too).
    pub hands_off: Vec<String>,
}

/// A fresh summary for a request.
pub(crate) fn new_summary(
    id: String,
    rb: &Runbook,
    req: &RunRequest,
    params: BTreeMap<String, crate::runbooks::manifest::ParamValue>,
    now: i64,
    shadow: bool,
) -> RunSummary {
    RunSummary {
        id,
        shadow,
        runbook: rb.manifest.name.clone(),
        runbook_digest: Some(rb.digest.clone()),
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
        did: Vec::new(),
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
