//! What a person's tools get back: the bodies of the HTTP API's answers,
//! one type each. The web crate serializes them, the CLI reads them —
//! from the server or from the engine embedded in its own process, built
//! by the same functions here — so both modes show the same fields with
//! the same rounding, and neither builds or reads a reply by string key.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::AuditRecord;
use crate::engine::Engine;
use crate::fleet::windows::Window;
use crate::repair::NodeHealth;
use crate::runbooks::manifest::Mode;
use crate::runbooks::modes::FleetMode;
use crate::shadow::ShadowFire;
use crate::views::{HaStatus, NodeView, RunbookView};
use nightshift_audit::ha::{EngineRow, ShardRow};
use nightshift_audit::runs::RunSummary;
use nightshift_proto::{ErrorBody, HealthCheck, SettingView};

/// Any refusal: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ApiErrorBody {
    pub error: ApiErrorDetail,
}

/// What was refused and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ApiErrorDetail {
    pub code: String,
    pub message: String,
}

impl ApiErrorBody {
    pub fn new(code: &str, message: impl Into<String>) -> ApiErrorBody {
        ApiErrorBody { error: ApiErrorDetail { code: code.to_string(), message: message.into() } }
    }
}

/// `GET /api/v1/nodes`: a page of nodes by name. Served as the array of
/// nodes, the next page's cursor in the `Next-Cursor` header.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodePage {
    pub nodes: Vec<NodeView>,
    /// Pass back as `cursor` for the next page; none after the last.
    pub next_cursor: Option<String>,
}

/// `GET /api/v1/runs/{id}`: a run and its records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunDetail {
    pub run: RunSummary,
    pub records: Vec<AuditRecord>,
}

/// `POST /api/v1/runs/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Cancelled {
    pub cancelled: String,
}

/// `GET /api/v1/nodes/{name}`: the node, its health, its newest runs.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeDetail {
    pub node: NodeView,
    pub health: Option<NodeHealth>,
    pub recent_runs: Vec<RunSummary>,
}

/// `POST /api/v1/nodes/{name}/repaired`: the GPUs now verifying.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Verifying {
    pub node: String,
    pub verifying: Vec<u32>,
}

/// `POST /api/v1/agents/{name}/health-check`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HealthCheckReply {
    pub node: String,
    pub check: HealthCheck,
}

/// `POST /api/v1/nodes/{name}/hands-off`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HandsOffReply {
    pub node: String,
    pub hands_off: bool,
    pub until_ms: Option<i64>,
}

/// `GET /api/v1/fleet/mode` (and `POST`, with what the change did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FleetModeView {
    pub mode: FleetMode,
    /// Who set it (none: the config's initial mode).
    pub set_by: Option<String>,
    pub reason: String,
    /// After a change to act: the shadow runs it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Vec<String>>,
    /// After a change: the runs still going (`id runbook target state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<Vec<String>>,
}

impl FleetModeView {
    /// The fleet's mode now.
    pub fn of(e: &Engine) -> FleetModeView {
        let (mode, set) = e.fleet_mode();
        let (set_by, reason) = match set {
            Some((by, reason)) => (Some(by), reason),
            None => (None, "initial_fleet_mode in engine.yaml".to_string()),
        };
        FleetModeView { mode, set_by, reason, ended: None, in_flight: None }
    }
}

/// `POST /api/v1/runbooks/{name}/mode`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunbookModeReply {
    pub runbook: String,
    pub mode: Mode,
}

/// `GET /api/v1/runbooks/{name}/shadow`: what a shadow runbook would have
/// done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShadowReport {
    pub runbook: String,
    pub mode: Mode,
    pub since_ms: i64,
    pub fires: Vec<ShadowFire>,
}

impl ShadowReport {
    /// `runbook`'s shadow fires since `since_ms` (at most `limit`).
    pub fn of(
        e: &Engine,
        runbook: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<ShadowReport, crate::engine::EngineError> {
        let fires = e.shadow_report(runbook, since_ms, limit)?;
        Ok(ShadowReport { runbook: runbook.to_string(), mode: e.runbook_mode(runbook), since_ms, fires })
    }
}

/// `GET /api/v1/agents/{name}/ping`: one round trip to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentPing {
    pub node: String,
    pub ok: bool,
    /// Milliseconds, to two decimals.
    pub round_trip_ms: f64,
    pub error: Option<ErrorBody>,
}

impl AgentPing {
    /// The agent's answer to a ping (a telemetry read) that took `took`.
    pub fn of(node: &str, reply: nightshift_proto::Reply, took: std::time::Duration) -> AgentPing {
        let ms = took.as_secs_f64() * 1000.0;
        AgentPing {
            node: node.to_string(),
            ok: reply.ok,
            round_trip_ms: (ms * 100.0).round() / 100.0,
            error: reply.error,
        }
    }
}

/// `POST /api/v1/agents/{name}/sim-fault`: what the simulated hardware took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SimFaultReply {
    pub node: String,
    pub injected: Value,
}

/// `GET /api/v1/agents/{name}/holds`: each setting's baseline, what is in
/// effect and the holds behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentHolds {
    pub node: String,
    pub settings: Vec<SettingView>,
}

/// One runbook in `GET /api/v1/runbooks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunbookBrief {
    pub name: String,
    pub description: String,
    pub handbook: Option<String>,
    pub trigger: String,
    pub scope: String,
    /// Where the trigger's input comes from on a real fleet.
    pub input: String,
    /// `act` or `shadow`, as in force now.
    #[serde(default)]
    pub mode: String,
}

impl From<&RunbookView> for RunbookBrief {
    fn from(r: &RunbookView) -> RunbookBrief {
        RunbookBrief {
            name: r.name.clone(),
            description: r.description.clone(),
            handbook: r.handbook.clone(),
            trigger: r.trigger.clone(),
            scope: r.scope.clone(),
            input: r.input.clone(),
            mode: r.mode.clone(),
        }
    }
}

/// `GET /api/v1/runbooks`: the runbooks in force, and the files that did
/// not load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunbookList {
    pub runbooks: Vec<RunbookBrief>,
    pub errors: Vec<String>,
}

/// `GET /api/v1/runbooks/{name}`: the runbook and its newest runs.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunbookDetail {
    pub runbook: RunbookView,
    pub recent_runs: Vec<RunSummary>,
}

/// `GET /api/v1/audit/head`: what to keep outside the store to anchor the
/// chain (all empty before the first record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditHead {
    pub seq: u64,
    pub hash: Option<String>,
    pub ts_ms: Option<i64>,
    /// `ts_ms` in RFC 3339.
    pub ts: Option<String>,
}

impl AuditHead {
    pub fn of(head: Option<&AuditRecord>) -> AuditHead {
        match head {
            Some(r) => AuditHead {
                seq: r.seq,
                hash: Some(r.hash.clone()),
                ts_ms: Some(r.ts_ms),
                ts: Some(crate::signals::alerts::format_rfc3339_ms(r.ts_ms)),
            },
            None => AuditHead { seq: 0, hash: None, ts_ms: None, ts: None },
        }
    }
}

/// `GET /api/v1/audit/records/{seq}`: one record and its neighbours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RecordView {
    pub record: AuditRecord,
    pub prev_seq: Option<u64>,
    pub next_seq: Option<u64>,
    /// Whether its `prev_hash` is the record before's hash.
    pub links_to_prev: Option<bool>,
}

/// `GET /healthz`: alive, and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Healthz {
    pub ok: bool,
    pub audit_seq: u64,
    pub agents_connected: usize,
    pub role: String,
    /// Why the store accepts nothing (then `ok` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_stopped: Option<String>,
}

/// `GET /readyz`: ready to take work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Readyz {
    pub ok: bool,
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_stopped: Option<String>,
    /// Still starting: what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting: Option<String>,
}

/// `GET /api/v1/maintenance`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Windows {
    pub windows: Vec<Window>,
}

/// `POST /api/v1/maintenance` (and `…/{id}/end`, with `ended`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WindowReply {
    pub window: Window,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
}

/// `GET /api/v1/ha`: this engine's place in its shard, and (PostgreSQL)
/// every shard's leader and every engine seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HaReply {
    #[serde(flatten)]
    pub status: HaStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardRow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines: Option<Vec<EngineRow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engines_error: Option<String>,
}

impl HaReply {
    pub async fn of(e: &Engine) -> HaReply {
        let (shards, shards_error) = match e.ha_shards().await {
            Ok(s) => (Some(s), None),
            Err(err) => (None, Some(err)),
        };
        let (engines, engines_error) = match e.ha_engines().await {
            Ok(s) => (Some(s), None),
            Err(err) => (None, Some(err)),
        };
        HaReply { status: e.ha_status(), shards, shards_error, engines, engines_error }
    }
}

/// `POST /api/v1/reload`: what changed; `loaded` and `errors` as
/// `runbooks reload` answered before (kept for its callers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReloadReply {
    #[serde(flatten)]
    pub report: crate::server::reload::ReloadReport,
    pub loaded: usize,
    pub errors: Vec<String>,
}

impl From<crate::server::reload::ReloadReport> for ReloadReply {
    fn from(report: crate::server::reload::ReloadReport) -> ReloadReply {
        ReloadReply { loaded: report.runbooks, errors: report.runbook_errors.clone(), report }
    }
}

/// A person's control (`…/holds/release`, `…/resume`, `…/drain`): what was
/// done, and on a 409 the first refusal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ControlReply {
    #[serde(flatten)]
    pub outcome: crate::control::ControlOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiErrorDetail>,
}

/// The event of a person's manual run: who, and the retry key it came
/// with (a retry with the same key answers the first run).
pub fn manual_event(by: &str, idempotency_key: Option<&str>) -> Value {
    let mut event = serde_json::json!({"kind": "manual", "by": by});
    if let Some(k) = idempotency_key {
        event["idempotency_key"] = Value::String(k.to_string());
    }
    event
}
