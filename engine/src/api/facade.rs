//! The front door's operations (issue 44): [`EngineApi`], one method per
//! thing a person or a page does, answered in the plain types of
//! `requests` and `replies`. [`Session`] is the engine's own answer, as one
//! person: the web crate serves it over HTTP, the CLI's embedded mode calls
//! it in its own process, and the CLI's server mode answers the same trait
//! over HTTP — so each operation has one implementation, here. A refusal is
//! a [`Refused`]: the HTTP status it is served with, a code and a message.

use futures::future::BoxFuture;

use super::replies::{
    AgentHolds, AgentPing, AuditHead, Cancelled, FleetModeView, HaReply, HealthCheckReply, RunDetail, RunbookBrief,
    RunbookDetail, RunbookList, RunbookModeReply, ShadowReport, Verifying, Windows,
};
use super::requests::{Cancel, Repaired, SetFleetMode, SetRunbookMode, StartRun};
use crate::audit::{AuditError, RunFilter};
use crate::engine::{Engine, EngineError, RunRequest};
use crate::repair::NodeHealth;
use crate::run::executor::Plan;

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
    /// A run and its audit records.
    fn run<'a>(&'a self, id: &'a str) -> Reply<'a, RunDetail>;
    /// What a run of `body` would be, changing nothing.
    fn plan(&self, body: StartRun) -> Reply<'_, Plan>;
    /// Cancel a queued, pending or running run.
    fn cancel<'a>(&'a self, run: &'a str, body: Cancel) -> Reply<'a, Cancelled>;
    /// Every GPU's health, fault, instruction and lifecycle.
    fn node_health<'a>(&'a self, node: &'a str) -> Reply<'a, NodeHealth>;
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
    /// This engine's place in its shard.
    fn ha(&self) -> Reply<'_, HaReply>;
}

/// The engine answering as one person: `actor` is who the audit records
/// (`user:alice`: a web token's name, the CLI's `$USER`).
#[derive(Clone)]
pub struct Session {
    engine: Engine,
    actor: String,
}

impl Session {
    pub fn new(engine: Engine, actor: impl Into<String>) -> Session {
        Session { engine, actor: actor.into() }
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

    fn node_health<'a>(&'a self, node: &'a str) -> Reply<'a, NodeHealth> {
        Box::pin(async move {
            // An engine that has not read the node's inventory yet knows
            // none of its GPUs: read it first.
            self.engine.ensure_inventory(node).await;
            self.engine.node_health(node).ok_or_else(|| Refused::no_node(node))
        })
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

    fn ha(&self) -> Reply<'_, HaReply> {
        Box::pin(async move { Ok(HaReply::of(&self.engine).await) })
    }
}
