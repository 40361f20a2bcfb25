//! The front door's operations (issue 44): [`EngineApi`], one method per
//! thing a person or a page does, answered in the plain types of
//! `requests` and `replies`. [`Session`] is the engine's own answer, as one
//! person: the web crate serves it over HTTP, the CLI's embedded mode calls
//! it in its own process, and the CLI's server mode answers the same trait
//! over HTTP — so each operation has one implementation, here. A refusal is
//! a [`Refused`]: the HTTP status it is served with, a code and a message.

use futures::future::BoxFuture;

use super::replies::{
    AgentHolds, AgentPing, ApiErrorDetail, AuditHead, Cancelled, ControlReply, FleetModeView, HaReply, HandsOffReply,
    HealthCheckReply, NodeDetail, NodePage, ReloadReply, RunDetail, RunbookBrief, RunbookDetail, RunbookList,
    RunbookModeReply, ShadowReport, SimFaultReply, Verifying, WindowReply, Windows,
};
use super::requests::{
    Cancel, HandsOff, NewWindow, NodesQuery, Reason, RecordsQuery, ReleaseHolds, Repaired, RunsQuery, SetFleetMode,
    SetRunbookMode, StartRun,
};
use std::collections::BTreeMap;

use crate::audit::pg::ShardRunPage;
use crate::audit::{AuditError, AuditRecord, RunFilter, RunPage, VerifyReport};
use crate::control::{ControlOutcome, Person, ReleaseWhat};
use crate::engine::Submitted;
use crate::engine::{Engine, EngineError, RunRequest};
use crate::fleet::windows::WindowSpec;
use crate::repair::NodeHealth;
use crate::run::executor::Plan;
use nightshift_audit::runs::RunSummary;

/// An operation's answer, later.
pub type Reply<'a, T> = BoxFuture<'a, Result<T, Refused>>;

/// Why an operation was not done: the HTTP status it is served with (0:
/// the engine was not reached), a code a program can match and a message
/// for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl Refused {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Refused {
        Refused { status, code: code.to_string(), message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Refused {
        Refused::new(400, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Refused {
        Refused::new(404, "not_found", message)
    }

    fn no_node(node: &str) -> Refused {
        Refused::not_found(format!("no node {node:?} in the inventory"))
    }
}

impl From<EngineError> for Refused {
    fn from(e: EngineError) -> Refused {
        let (status, code) = match &e {
            EngineError::UnknownRunbook { .. } | EngineError::UnknownNode(_) | EngineError::NoSuchRun(_) => {
                (404, "not_found")
            }
            EngineError::BadTarget(_)
            | EngineError::BadParams(_)
            | EngineError::NotReadOnly { .. }
            | EngineError::MissingReason
            | EngineError::BadModeChange(_) => (400, "bad_request"),
            EngineError::AgentUnreachable { .. } => (502, "agent_unreachable"),
            EngineError::NotAwaitingApproval { .. } | EngineError::AlreadyFinished { .. } => (409, "conflict"),
            EngineError::SelfApproval { .. } => (403, "self_approval"),
            EngineError::Guarded { code, .. } => (409, *code),
            EngineError::AdminOnly(_) => (403, "forbidden"),
            EngineError::IdempotencyConflict { .. } => (422, "idempotency_conflict"),
            EngineError::Audit(AuditError::NotLeader(_)) => (503, "not_leader"),
            EngineError::Audit(AuditError::Deposed(_)) => (503, "deposed"),
            // The store stopped at a durability failure: nothing more is
            // accepted until it is fixed (retry elsewhere or later).
            EngineError::Audit(AuditError::Write(_) | AuditError::Closed) => (503, "audit_stopped"),
            EngineError::Audit(AuditError::BadCursor(_)) => (400, "bad_request"),
            EngineError::Audit(_) => (500, "internal"),
        };
        Refused::new(status, code, e.to_string())
    }
}

impl From<AuditError> for Refused {
    fn from(e: AuditError) -> Refused {
        EngineError::from(e).into()
    }
}

/// What a person or a page asks of the engine. Every method answers in a
/// plain type of this module's `replies`; the caller is the person the
/// implementation was made for (a [`Session`], or the token a client
/// sends).
pub trait EngineApi: Send + Sync {
    /// Runs, newest first, filtered and paged (this engine's shard; a
    /// query with `shards` set is refused here — the web layer answers it).
    fn runs(&self, query: RunsQuery) -> Reply<'_, RunPage>;
    /// A run and its audit records.
    fn run<'a>(&'a self, id: &'a str) -> Reply<'a, RunDetail>;
    /// What a run of `body` would be, changing nothing.
    fn plan(&self, body: StartRun) -> Reply<'_, Plan>;
    /// Cancel a queued, pending or running run.
    fn cancel<'a>(&'a self, run: &'a str, body: Cancel) -> Reply<'a, Cancelled>;
    /// Every GPU's health, fault, instruction and lifecycle.
    fn node_health<'a>(&'a self, node: &'a str) -> Reply<'a, NodeHealth>;
    /// The runs of every shard of the engine's database (`shards=all`),
    /// each with its shard (PostgreSQL backend).
    fn runs_all_shards(&self, query: RunsQuery) -> Reply<'_, ShardRunPage>;
    /// `GET /api/v1/nodes`: the nodes a query selects, a page at a time.
    fn nodes(&self, query: NodesQuery) -> Reply<'_, NodePage>;
    /// One node: its state, its GPUs' health, its last 20 runs.
    fn node<'a>(&'a self, name: &'a str) -> Reply<'a, NodeDetail>;
    /// Runs waiting for approval.
    fn approvals(&self) -> Reply<'_, Vec<RunSummary>>;
    /// The agent's read-only health check, now.
    fn health_check<'a>(&'a self, node: &'a str) -> Reply<'a, HealthCheckReply>;
    /// A person says the node (or one GPU) was repaired.
    fn repaired<'a>(&'a self, node: &'a str, body: Repaired) -> Reply<'a, Verifying>;
    /// One round trip to the node's agent.
    fn ping<'a>(&'a self, node: &'a str) -> Reply<'a, AgentPing>;
    /// What the node's agent holds, setting by setting.
    fn holds<'a>(&'a self, node: &'a str) -> Reply<'a, AgentHolds>;
    /// The whole fleet's mode.
    fn fleet_mode(&self) -> Reply<'_, FleetModeView>;
    /// Set the whole fleet's mode, saying why (admin).
    fn set_fleet_mode(&self, body: SetFleetMode) -> Reply<'_, FleetModeView>;
    /// Maintenance windows in force or to come.
    fn windows(&self) -> Reply<'_, Windows>;
    /// The runbooks in force and the files that did not load.
    fn runbooks(&self) -> Reply<'_, RunbookList>;
    /// One runbook and its newest runs.
    fn runbook<'a>(&'a self, name: &'a str) -> Reply<'a, RunbookDetail>;
    /// Promote or demote a runbook, saying why (admin).
    fn set_runbook_mode<'a>(&'a self, name: &'a str, body: SetRunbookMode) -> Reply<'a, RunbookModeReply>;
    /// What a shadow runbook would have done since `since_ms` (default: a
    /// week), at most `limit` fires (default 200, at most 1,000).
    fn shadow_report<'a>(
        &'a self,
        name: &'a str,
        since_ms: Option<i64>,
        limit: Option<usize>,
    ) -> Reply<'a, ShadowReport>;
    /// The newest record's sequence number and hash.
    fn audit_head(&self) -> Reply<'_, AuditHead>;
    /// Records after a sequence number, oldest first.
    fn records(&self, query: RecordsQuery) -> Reply<'_, Vec<AuditRecord>>;
    /// This engine's chain walked (cached while the head stays).
    fn verify(&self) -> Reply<'_, VerifyReport>;
    /// Every shard's chain in the engine's database walked, by shard
    /// (PostgreSQL backend).
    fn verify_shards(&self) -> Reply<'_, BTreeMap<String, VerifyReport>>;
    /// This engine's place in its shard.
    fn ha(&self) -> Reply<'_, HaReply>;
    /// Start a runbook; with an idempotency key used before by the same
    /// person within 24 h, the run the first try started.
    fn submit(&self, body: StartRun, idempotency_key: Option<String>) -> Reply<'_, Submitted>;
    /// Approve a run waiting for it (not by its requester).
    fn approve<'a>(&'a self, run: &'a str) -> Reply<'a, RunSummary>;
    /// Reject a run waiting for approval, saying why.
    fn reject<'a>(&'a self, run: &'a str, body: Reason) -> Reply<'a, RunSummary>;
    /// Release holds on a node as this person. A refusal by the agent is
    /// an answer (`error` set, served as 409), not a `Refused`.
    fn release<'a>(&'a self, node: &'a str, body: ReleaseHolds) -> Reply<'a, ControlReply>;
    /// Put a node back into service as this person.
    fn resume<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply>;
    /// Drain a node as this person (nightshift never ends it).
    fn drain<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply>;
    /// Set or clear the engine's hands-off on a node (admin).
    fn hands_off<'a>(&'a self, node: &'a str, body: HandsOff) -> Reply<'a, HandsOffReply>;
    /// Tell a `sim` agent's simulated hardware a fault (admin).
    fn sim_fault<'a>(&'a self, node: &'a str, fault: nightshift_proto::SimFault) -> Reply<'a, SimFaultReply>;
    /// Set a maintenance window (admin).
    fn set_window(&self, body: NewWindow) -> Reply<'_, WindowReply>;
    /// End a maintenance window before its time (admin).
    fn end_window<'a>(&'a self, id: &'a str, body: Reason) -> Reply<'a, WindowReply>;
    /// The node's inventory, as its agent reads it.
    fn inventory<'a>(&'a self, node: &'a str) -> Reply<'a, nightshift_proto::Inventory>;
    /// Read fleet.yaml, the tokens, the runbooks and the XID policy again
    /// (admin); with `allow_partial`, the runbooks that load go in force
    /// even if others fail. A broken file is a 422 and changes nothing.
    fn reload(&self, allow_partial: bool) -> Reply<'_, ReloadReply>;
}

/// A control's outcome as the API answers it: what was done, and the
/// agent's first refusal.
pub fn control_reply(outcome: ControlOutcome) -> ControlReply {
    let error = outcome.refused().map(|r| ApiErrorDetail {
        code: r.result.code.clone().unwrap_or_else(|| "refused".into()),
        message: r.result.error.clone().unwrap_or_else(|| "the agent refused".into()),
    });
    ControlReply { outcome, error }
}

/// `starts_at` / `ends_at` of a window: RFC 3339.
fn window_time(field: &str, s: &str) -> Result<i64, Refused> {
    crate::signals::alerts::parse_rfc3339_ms(s).ok_or_else(|| {
        Refused::bad_request(format!("{field}: expected an RFC 3339 time (2026-12-06T14:00:00Z), found {s:?}"))
    })
}

/// The engine answering as one person: `name` (a web token's, the CLI's
/// `$USER`), recorded as `user:<name>`, and whether they are an admin
/// (the roles themselves are the web layer's: a `Session` is made for a
/// request it let through).
#[derive(Clone)]
pub struct Session {
    engine: Engine,
    name: String,
    actor: String,
    admin: bool,
}

impl Session {
    pub fn new(engine: Engine, name: &str, admin: bool) -> Session {
        Session { engine, name: name.to_string(), actor: format!("user:{name}"), admin }
    }

    fn known(&self, node: &str) -> Result<(), Refused> {
        if self.engine.has_node(node) { Ok(()) } else { Err(Refused::no_node(node)) }
    }

    /// A manual run's request for `body`, as this person.
    fn request(&self, body: StartRun, detail: String) -> Result<RunRequest, Refused> {
        Ok(RunRequest {
            target: body.target().map_err(Refused::bad_request)?,
            runbook: body.runbook,
            trigger: "manual".into(),
            detail,
            event: super::replies::manual_event(&self.actor, None),
            event_ts_ms: self.engine.clock().now_ms(),
            params: body.params,
            dry_run: body.dry_run,
            requested_by: self.actor.clone(),
        })
    }
}

impl EngineApi for Session {
    fn runs(&self, query: RunsQuery) -> Reply<'_, RunPage> {
        Box::pin(async move {
            if query.shards.as_deref().is_some_and(|s| !s.is_empty()) {
                return Err(Refused::bad_request("shards: every shard's runs are the server's to list (shards=all)"));
            }
            let filter = query.filter(&self.engine)?;
            Ok(self.engine.runs_page(&filter).await?)
        })
    }

    fn run<'a>(&'a self, id: &'a str) -> Reply<'a, RunDetail> {
        Box::pin(async move {
            let run = self.engine.run(id)?.ok_or_else(|| Refused::not_found(format!("no run {id:?}")))?;
            Ok(RunDetail { run, records: self.engine.run_records(id)? })
        })
    }

    fn plan(&self, body: StartRun) -> Reply<'_, Plan> {
        Box::pin(async move {
            let req = self.request(body, format!("plan for {}", self.actor))?;
            Ok(self.engine.plan(&req)?)
        })
    }

    fn cancel<'a>(&'a self, run: &'a str, body: Cancel) -> Reply<'a, Cancelled> {
        Box::pin(async move {
            self.engine.cancel(run, &self.actor, body.reason.as_deref()).await?;
            Ok(Cancelled { cancelled: run.to_string() })
        })
    }

    fn runs_all_shards(&self, query: RunsQuery) -> Reply<'_, ShardRunPage> {
        Box::pin(async move {
            let filter = query.filter(&self.engine)?;
            self.engine.runs_all_shards(&filter).await.map_err(|e| Refused::new(400, "no_shards", e))
        })
    }

    fn nodes(&self, query: NodesQuery) -> Reply<'_, NodePage> {
        Box::pin(async move {
            let (nodes, next_cursor) = self.engine.nodes_filtered(&query.filter()?);
            Ok(NodePage { nodes, next_cursor })
        })
    }

    fn node<'a>(&'a self, name: &'a str) -> Reply<'a, NodeDetail> {
        Box::pin(async move {
            let node = self.engine.node(name).ok_or_else(|| Refused::no_node(name))?;
            let recent =
                self.engine.runs(&RunFilter { node: Some(name.to_string()), limit: Some(20), ..Default::default() })?;
            Ok(NodeDetail { node, health: self.engine.node_health(name), recent_runs: recent.runs })
        })
    }

    fn approvals(&self) -> Reply<'_, Vec<RunSummary>> {
        Box::pin(async move { Ok(self.engine.pending_approvals()) })
    }

    fn node_health<'a>(&'a self, node: &'a str) -> Reply<'a, NodeHealth> {
        // The health model as it is: no agent call on the way (a page load
        // for a node whose agent is down must not wait on it).
        Box::pin(async move { self.engine.node_health(node).ok_or_else(|| Refused::no_node(node)) })
    }

    fn health_check<'a>(&'a self, node: &'a str) -> Reply<'a, HealthCheckReply> {
        Box::pin(async move {
            self.known(node)?;
            let check = self
                .engine
                .health_check_node(node)
                .await
                .map_err(|e| Refused::new(502, "agent_error", format!("{node}: {e}")))?;
            Ok(HealthCheckReply { node: node.to_string(), check })
        })
    }

    fn repaired<'a>(&'a self, node: &'a str, body: Repaired) -> Reply<'a, Verifying> {
        Box::pin(async move {
            self.known(node)?;
            let verifying = self
                .engine
                .mark_repaired(node, body.gpu, &self.actor, &body.note)
                .await
                .map_err(|e| Refused::new(409, "nothing_to_repair", e))?;
            Ok(Verifying { node: node.to_string(), verifying })
        })
    }

    fn ping<'a>(&'a self, node: &'a str) -> Reply<'a, AgentPing> {
        Box::pin(async move {
            // A round trip shown to a person, deciding nothing: the
            // monotonic clock, not the engine's (sub-millisecond).
            let started = std::time::Instant::now();
            let reply =
                self.engine.agent_call(node, nightshift_proto::Op::Telemetry(nightshift_proto::NoArgs {})).await?;
            Ok(AgentPing::of(node, reply, started.elapsed()))
        })
    }

    fn holds<'a>(&'a self, node: &'a str) -> Reply<'a, AgentHolds> {
        Box::pin(async move {
            let reply = self.engine.agent_call(node, nightshift_proto::Op::Holds(nightshift_proto::NoArgs {})).await?;
            let agent_error = |m: String| Refused::new(502, "agent_error", format!("{node}: {m}"));
            let result = match reply.result {
                Some(v) if reply.ok => v,
                _ => return Err(agent_error(format!("{:?}", reply.error))),
            };
            let settings =
                serde_json::from_value(result).map_err(|e| agent_error(format!("the agent's holds: {e}")))?;
            Ok(AgentHolds { node: node.to_string(), settings })
        })
    }

    fn fleet_mode(&self) -> Reply<'_, FleetModeView> {
        Box::pin(async move { Ok(FleetModeView::of(&self.engine)) })
    }

    fn set_fleet_mode(&self, body: SetFleetMode) -> Reply<'_, FleetModeView> {
        Box::pin(async move {
            let change = self.engine.set_fleet_mode(body.mode, &self.actor, &body.reason).await?;
            Ok(FleetModeView {
                ended: Some(change.ended),
                in_flight: Some(change.in_flight),
                ..FleetModeView::of(&self.engine)
            })
        })
    }

    fn windows(&self) -> Reply<'_, Windows> {
        Box::pin(async move { Ok(Windows { windows: self.engine.windows() }) })
    }

    fn runbooks(&self) -> Reply<'_, RunbookList> {
        Box::pin(async move {
            let errors = self.engine.runbook_set().errors.iter().map(|e| e.to_string()).collect();
            let runbooks = self.engine.runbooks().iter().map(RunbookBrief::from).collect();
            Ok(RunbookList { runbooks, errors })
        })
    }

    fn runbook<'a>(&'a self, name: &'a str) -> Reply<'a, RunbookDetail> {
        Box::pin(async move {
            let runbook = self
                .engine
                .runbooks()
                .into_iter()
                .find(|r| r.name == name)
                .ok_or_else(|| Refused::not_found(format!("no runbook {name:?}")))?;
            let recent = self.engine.runs(&RunFilter {
                runbook: Some(name.to_string()),
                limit: Some(20),
                ..Default::default()
            })?;
            Ok(RunbookDetail { runbook, recent_runs: recent.runs })
        })
    }

    fn set_runbook_mode<'a>(&'a self, name: &'a str, body: SetRunbookMode) -> Reply<'a, RunbookModeReply> {
        Box::pin(async move {
            let mode = self.engine.set_runbook_mode(name, body.mode, &self.actor, &body.reason).await?;
            Ok(RunbookModeReply { runbook: name.to_string(), mode })
        })
    }

    fn shadow_report<'a>(
        &'a self,
        name: &'a str,
        since_ms: Option<i64>,
        limit: Option<usize>,
    ) -> Reply<'a, ShadowReport> {
        Box::pin(async move {
            let since = since_ms.unwrap_or_else(|| self.engine.clock().now_ms() - 7 * 86_400_000);
            Ok(ShadowReport::of(&self.engine, name, since, limit.unwrap_or(200).min(1000))?)
        })
    }

    fn audit_head(&self) -> Reply<'_, AuditHead> {
        Box::pin(async move { Ok(AuditHead::of(self.engine.audit_head()?.as_ref())) })
    }

    fn records(&self, query: RecordsQuery) -> Reply<'_, Vec<AuditRecord>> {
        Box::pin(async move {
            let limit = query.limit.unwrap_or(500).min(RecordsQuery::MAX);
            Ok(self.engine.audit().tail(query.after_seq, limit)?)
        })
    }

    fn verify(&self) -> Reply<'_, VerifyReport> {
        Box::pin(async move { Ok(self.engine.verify_in_background().await?) })
    }

    fn verify_shards(&self) -> Reply<'_, BTreeMap<String, VerifyReport>> {
        Box::pin(async move { self.engine.verify_shards().await.map_err(|e| Refused::new(400, "no_shards", e)) })
    }

    fn ha(&self) -> Reply<'_, HaReply> {
        Box::pin(async move { Ok(HaReply::of(&self.engine).await) })
    }

    fn submit(&self, body: StartRun, idempotency_key: Option<String>) -> Reply<'_, Submitted> {
        Box::pin(async move {
            let mut req = self.request(body, format!("manual run by {}", self.actor))?;
            req.event = super::replies::manual_event(&self.actor, idempotency_key.as_deref());
            Ok(self.engine.submit(req).await?)
        })
    }

    fn approve<'a>(&'a self, run: &'a str) -> Reply<'a, RunSummary> {
        Box::pin(async move { Ok(self.engine.approve(run, &self.actor).await?) })
    }

    fn reject<'a>(&'a self, run: &'a str, body: Reason) -> Reply<'a, RunSummary> {
        Box::pin(async move { Ok(self.engine.reject(run, &self.actor, &body.reason).await?) })
    }

    fn release<'a>(&'a self, node: &'a str, body: ReleaseHolds) -> Reply<'a, ControlReply> {
        Box::pin(async move {
            let what = ReleaseWhat {
                gpu: body.gpu,
                owner: body.owner,
                hold: body.hold,
                kind: body.kind,
                all: body.all,
                force: body.force,
            };
            let who = Person { name: &self.name, admin: self.admin };
            Ok(control_reply(self.engine.person_release(node, &what, who, &body.reason).await?))
        })
    }

    fn resume<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply> {
        Box::pin(async move { Ok(control_reply(self.engine.person_resume(node, &self.name, &body.reason).await?)) })
    }

    fn drain<'a>(&'a self, node: &'a str, body: Reason) -> Reply<'a, ControlReply> {
        Box::pin(async move { Ok(control_reply(self.engine.person_drain(node, &self.name, &body.reason).await?)) })
    }

    fn hands_off<'a>(&'a self, node: &'a str, body: HandsOff) -> Reply<'a, HandsOffReply> {
        Box::pin(async move {
            let until_ms = match body.for_secs {
                Some(secs @ 1..=2_592_000) => {
                    Some(self.engine.clock().now_ms().saturating_add((secs as i64).saturating_mul(1000)))
                }
                Some(other) => {
                    return Err(Refused::bad_request(format!(
                        "for_secs: expected 1 to 2592000 (30 days), found {other}"
                    )));
                }
                None => None,
            };
            self.engine.set_hands_off(node, &self.actor, body.hands_off, body.reason.as_deref(), until_ms).await?;
            Ok(HandsOffReply { node: node.to_string(), hands_off: body.hands_off, until_ms })
        })
    }

    fn sim_fault<'a>(&'a self, node: &'a str, fault: nightshift_proto::SimFault) -> Reply<'a, SimFaultReply> {
        Box::pin(async move {
            let injected = self.engine.simulate_fault(node, &self.actor, fault).await?;
            Ok(SimFaultReply { node: node.to_string(), injected })
        })
    }

    fn set_window(&self, body: NewWindow) -> Reply<'_, WindowReply> {
        Box::pin(async move {
            let starts_ms = body.starts_at.as_deref().map(|t| window_time("starts_at", t)).transpose()?;
            let start = starts_ms.unwrap_or_else(|| self.engine.clock().now_ms());
            let ends_ms = match (body.ends_at.as_deref(), body.for_secs) {
                (Some(t), None) => window_time("ends_at", t)?,
                (None, Some(secs)) if secs <= i64::MAX as u64 / 1000 => start.saturating_add(secs as i64 * 1000),
                (None, Some(secs)) => {
                    return Err(Refused::bad_request(format!(
                        "for_secs: expected at most 2592000 (30 days), found {secs}"
                    )));
                }
                (Some(_), Some(_)) => {
                    return Err(Refused::bad_request("expected one of ends_at or for_secs, found both"));
                }
                (None, None) => {
                    return Err(Refused::bad_request(
                        "expected an end (ends_at or for_secs), found none: a maintenance window always ends",
                    ));
                }
            };
            let spec =
                WindowSpec { matchers: body.matchers, nodes: body.nodes, starts_ms, ends_ms, reason: body.reason };
            let window = self.engine.set_window(&self.actor, spec).await?;
            Ok(WindowReply { window, ended: false })
        })
    }

    fn end_window<'a>(&'a self, id: &'a str, body: Reason) -> Reply<'a, WindowReply> {
        Box::pin(async move {
            let window = self.engine.end_window(id, &self.actor, &body.reason).await?;
            Ok(WindowReply { window, ended: true })
        })
    }

    fn inventory<'a>(&'a self, node: &'a str) -> Reply<'a, nightshift_proto::Inventory> {
        Box::pin(async move {
            let reply =
                self.engine.agent_call(node, nightshift_proto::Op::Inventory(nightshift_proto::NoArgs {})).await?;
            let agent_error = |m: String| Refused::new(502, "agent_error", format!("{node}: {m}"));
            match reply.result {
                Some(v) if reply.ok => {
                    serde_json::from_value(v).map_err(|e| agent_error(format!("the agent's inventory: {e}")))
                }
                _ => Err(agent_error(format!("{:?}", reply.error))),
            }
        })
    }

    fn reload(&self, allow_partial: bool) -> Reply<'_, ReloadReply> {
        Box::pin(async move {
            match crate::server::reload::reload_with(&self.engine, &self.actor, allow_partial).await {
                Ok(r) => Ok(ReloadReply::from(r)),
                Err(crate::server::reload::ReloadError::Audit(e)) => Err(e.into()),
                Err(e) => Err(Refused::new(422, "reload_refused", e.to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table: what the engine refuses → the status and code every way in
    /// (web, both CLI modes) answers it with.
    #[test]
    fn each_refusal_has_one_status() {
        let s = String::new;
        let cases: Vec<(EngineError, u16, &str)> = vec![
            (EngineError::UnknownRunbook { name: s(), known: s() }, 404, "not_found"),
            (EngineError::UnknownNode(s()), 404, "not_found"),
            (EngineError::NoSuchRun(s()), 404, "not_found"),
            (EngineError::BadTarget(s()), 400, "bad_request"),
            (EngineError::BadParams(s()), 400, "bad_request"),
            (EngineError::MissingReason, 400, "bad_request"),
            (EngineError::AgentUnreachable { node: s(), message: s() }, 502, "agent_unreachable"),
            (EngineError::AlreadyFinished { run: s(), outcome: s() }, 409, "conflict"),
            (EngineError::SelfApproval { run: s(), by: s() }, 403, "self_approval"),
            (EngineError::Guarded { code: "repair_pending", message: s() }, 409, "repair_pending"),
            (EngineError::AdminOnly(s()), 403, "forbidden"),
            (EngineError::IdempotencyConflict { key: s(), run: s(), what: s() }, 422, "idempotency_conflict"),
            (EngineError::Audit(AuditError::Closed), 503, "audit_stopped"),
            (EngineError::Audit(AuditError::BadCursor(s())), 400, "bad_request"),
        ];
        for (e, status, code) in cases {
            let what = e.to_string();
            let r = Refused::from(e);
            assert_eq!((r.status, r.code.as_str()), (status, code), "{what}");
            assert_eq!(r.message, what, "the message is the engine's own");
        }
    }

    /// A manual run's body names one kind of target; a bad one is a 400
    /// before the engine is asked.
    #[test]
    fn a_bad_target_is_refused_as_bad_input() {
        let body = StartRun { runbook: "r".into(), group: Some("no-equals".into()), ..StartRun::default() };
        let e = body.target().map_err(Refused::bad_request).unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (400, "bad_request"));
        assert!(e.message.contains("expected label=value"), "{e}");
    }
}
