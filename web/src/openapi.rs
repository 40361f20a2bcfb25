//! The API's OpenAPI 3 document, generated (issue 44): each operation from
//! the table below — what it does, who may, its answers and errors — and
//! every body and parameter from the type the handler takes or answers,
//! by its JSON Schema (schemars). `openapi.json` beside this file is the
//! document as checked in and served; `web/tests/it/openapi.rs` fails when
//! it drifts from the types (and says how to write it again).

use std::collections::BTreeMap;

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde_json::{Map, Value};

use nightshift_engine::api::{
    AgentHolds, AgentPing, AuditHead, Cancel, Cancelled, ControlReply, FleetModeView, HaReply, HandsOff, HandsOffReply,
    HealthCheckReply, Healthz, NewWindow, NodeDetail, NodeHealth, NodeView, Plan, Readyz, Reason, RecordView,
    ReleaseHolds, ReloadReply, Repaired, RunDetail, RunSummary, RunbookDetail, RunbookList, RunbookModeReply,
    SetFleetMode, SetRunbookMode, ShadowReport, SimFaultReply, StartRun, Verifying, WebhookPayload, WindowReply,
    Windows,
};
use nightshift_engine::audit::{AuditRecord, RecordPage, RunPage, VerifyReport};
use nightshift_engine::engine::{Ingested, Submitted};
use nightshift_proto::{Inventory, SimFault};

use crate::api::{ReloadQuery, ShadowQuery, StreamQuery, VerifyQuery};
use crate::browse::SearchParams;
use nightshift_engine::api::RunsQuery;

/// How a type's schema is made (a `$ref` into `components.schemas` for a
/// named type).
type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// A query struct, inline (its fields become the parameters).
fn query<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.root_schema_for::<T>()
}

const GET: &str = "get";
const POST: &str = "post";

/// One operation: method, path, summary; its query (a struct's fields),
/// header, body and answers.
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    query: Option<SchemaFn>,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<(SchemaFn, bool)>,
    answers: Vec<(u16, Answer, &'static str)>,
    public: bool,
}

/// What an answer carries.
enum Answer {
    Json(SchemaFn),
    /// Another media type (a stream, a file, text).
    As(&'static str),
    /// An error: `{"error": {"code", "message"}}`.
    Error,
}

impl Op {
    fn new(method: &'static str, path: &'static str, summary: &'static str) -> Op {
        Op { method, path, summary, query: None, headers: Vec::new(), body: None, answers: Vec::new(), public: false }
    }
    fn query(mut self, q: SchemaFn) -> Op {
        self.query = Some(q);
        self
    }
    fn header(mut self, name: &'static str, description: &'static str) -> Op {
        self.headers.push((name, description));
        self
    }
    fn body(mut self, b: SchemaFn) -> Op {
        self.body = Some((b, true));
        self
    }
    fn optional_body(mut self, b: SchemaFn) -> Op {
        self.body = Some((b, false));
        self
    }
    fn ok(mut self, status: u16, s: SchemaFn, description: &'static str) -> Op {
        self.answers.push((status, Answer::Json(s), description));
        self
    }
    fn ok_as(mut self, status: u16, media: &'static str, description: &'static str) -> Op {
        self.answers.push((status, Answer::As(media), description));
        self
    }
    fn error(mut self, status: u16, description: &'static str) -> Op {
        self.answers.push((status, Answer::Error, description));
        self
    }
    /// Served without a token.
    fn public(mut self) -> Op {
        self.public = true;
        self
    }
}

/// Every operation the router serves under `/api/v1`, `/metrics`,
/// `/healthz` and `/readyz`.
fn operations() -> Vec<Op> {
    vec![
        Op::new(POST, "/api/v1/nodes/{name}/holds/release", "A person releases holds on the node as themselves (`person:<name>`), audited: a run's, a kept one, a sticky drain, another person's. The scope is named: `all: true`, or a gpu, owner, hold or kind. A drain nightshift keeps on a GPU the health model holds broken goes only by the repair lifecycle (`nodes repaired`) or an admin's `force`; an admin's hands-off refuses an operator's release (operator)")
            .body(schema::<ReleaseHolds>)
            .ok(200, schema::<ControlReply>, "`{node, actions: [{hold, owner, setting, ok, outcome, after, reason, by}]}`")
            .error(400, "no scope, no such hold, an unknown kind, or no reason")
            .error(403, "`force` by someone who is not an admin")
            .error(404, "no such node")
            .error(409, "a guard refused and nothing was sent (`hands_off`: an admin's hands-off; `repair_pending`: a repair drain of a broken GPU: mark it repaired), or the agent refused one: the body has every action and `error`")
            .error(502, "the agent did not answer"),
        Op::new(POST, "/api/v1/nodes/{name}/resume", "A person puts the node back into service as themselves: every drain on it ends, a sticky repair or RMA drain too (operator)")
            .body(schema::<Reason>)
            .ok(200, schema::<ControlReply>, "`{node, actions: [{op: resume, ok, outcome, after, warning?}]}` (warning: GPUs not healthy in the repair lifecycle)")
            .error(400, "no reason")
            .error(404, "no such node")
            .error(409, "the agent refused (hands-off)"),
        Op::new(POST, "/api/v1/nodes/{name}/drain", "A person drains the node as themselves: no new work is placed there, running jobs finish; the scheduler's reason is `drained by <you>: <reason>`; nightshift never ends it and its blast radius does not count it; a person's resume ends it (operator)")
            .body(schema::<Reason>)
            .ok(200, schema::<ControlReply>, "`{node, actions: [{op: drain, ok, outcome, after}]}`")
            .error(400, "no reason")
            .error(404, "no such node")
            .error(409, "the agent refused (hands-off)"),
        Op::new(POST, "/api/v1/runs/plan", "What POST /api/v1/runs with this body would decide — target nodes, nodes changed, whether it waits for approval and why — changing nothing (viewer)")
            .body(schema::<StartRun>)
            .ok(200, schema::<Plan>, "`{runbook, digest, target, nodes, nodes_changed, needs_approval, approval_reason, dry_run, params, hands_off}`")
            .error(400, "a target or parameter that does not fit the runbook")
            .error(404, "no such runbook or node"),
        Op::new(GET, "/api/v1/agents/{name}/holds", "What is held on the node: each setting's baseline, what is in effect, and every hold behind it (viewer)")
            .ok(200, schema::<AgentHolds>, "`{node, settings: [{setting, baseline, effective, drifted, holds}]}`")
            .error(404, "no such node")
            .error(502, "the agent did not answer"),
        Op::new(POST, "/api/v1/runbooks/{name}/mode", "Promote (act) or demote (shadow) a runbook, saying why; audited before it takes effect (admin)")
            .body(schema::<SetRunbookMode>)
            .ok(200, schema::<RunbookModeReply>, "`{runbook, mode}`")
            .error(400, "no reason, or already in that mode")
            .error(404, "no such runbook"),
        Op::new(GET, "/api/v1/fleet/mode", "The whole fleet's mode (act, shadow, paused), who set it and why (viewer)")
            .ok(200, schema::<FleetModeView>, "`{mode, set_by, reason}`"),
        Op::new(POST, "/api/v1/fleet/mode", "Put the whole fleet in act, shadow (every automatic run a dry run) or paused (no automatic run starts) mode, saying why; audited before it takes effect (admin)")
            .body(schema::<SetFleetMode>)
            .ok(200, schema::<FleetModeView>, "`{mode, set_by, reason, ended, in_flight}`: ended, the shadow runs going to act ended (their alerts offered again); in_flight, the runs still going (`id runbook target state`)")
            .error(400, "no reason, or already in that mode"),
        Op::new(GET, "/api/v1/maintenance", "Maintenance windows in force or to come, each with the nodes it covers now, soonest end first (viewer)")
            .ok(200, schema::<Windows>, "`{windows: [{id, by, reason, matchers, nodes, starts_ms, ends_ms, covers}]}`"),
        Op::new(POST, "/api/v1/maintenance", "Set a maintenance window (admin): the nodes it matches — every label in `matchers` and, when given, one of `nodes` — are hands-off from `starts_at` (default now) until `ends_at`, or `for_secs` after the start (30 days at most); audited before it is in force; it ends by itself, audited")
            .body(schema::<NewWindow>)
            .ok(201, schema::<WindowReply>, "`{window}`")
            .error(400, "no matcher or node, an unknown node, no end, an end past or over 30 days after the start, no reason"),
        Op::new(POST, "/api/v1/maintenance/{id}/end", "End a maintenance window before its time, saying why (admin)")
            .body(schema::<Reason>)
            .ok(200, schema::<WindowReply>, "`{window, ended: true}`")
            .error(400, "no such window"),
        Op::new(GET, "/api/v1/runbooks/{name}/shadow", "A shadow runbook's would-be actions over a window (`since_ms`): what it would have done and what the agent answered (viewer)")
            .query(query::<ShadowQuery>)
            .ok(200, schema::<ShadowReport>, "the shadow report")
            .error(404, "no such runbook"),
        Op::new(GET, "/api/v1/openapi.json", "This document")
            .ok_as(200, "application/json", "OpenAPI 3"),
        Op::new(GET, "/api/v1/runs", "Runs, newest first (viewer)")
            .query(query::<RunsQuery>)
            .ok(200, schema::<RunPage>, "`{runs: [RunSummary], next_cursor}`")
            .error(400, "a filter that does not parse (label: expected key=value), saying what was expected"),
        Op::new(POST, "/api/v1/runs", "Start a runbook (operator)")
            .header(
                "Idempotency-Key",
                "1–255 visible ASCII characters: a retry with the same key by the same person within 24 h answers the run the first try started, and starts nothing",
            )
            .body(schema::<StartRun>)
            .ok(202, schema::<Submitted>, "`{status: queued|pending_approval|refused|suppressed|dropped, run?}`; with an Idempotency-Key used before by the same person: the run it started")
            .error(422, "the Idempotency-Key was used before for a different request: the message names its run"),
        Op::new(GET, "/api/v1/runs/{id}", "A run and its audit records (viewer)")
            .ok(200, schema::<RunDetail>, "`{run: RunSummary, records: [AuditRecord]}`"),
        Op::new(POST, "/api/v1/runs/{id}/approve", "Approve a pending run; not by its requester (operator)")
            .ok(200, schema::<RunSummary>, "RunSummary")
            .error(409, "not pending, or self-approval"),
        Op::new(POST, "/api/v1/runs/{id}/reject", "Reject a pending run (operator)")
            .body(schema::<Reason>)
            .ok(200, schema::<RunSummary>, "RunSummary"),
        Op::new(POST, "/api/v1/runs/{id}/cancel", "Cancel a queued, pending or running run (operator): the audit records the caller as who cancelled it, with the reason")
            .optional_body(schema::<Cancel>)
            .ok(200, schema::<Cancelled>, "`{cancelled}`"),
        Op::new(GET, "/api/v1/approvals", "Runs waiting for approval (viewer)")
            .ok(200, schema::<Vec<RunSummary>>, "[RunSummary]"),
        Op::new(GET, "/api/v1/nodes", "The nodes by name: state, labels, latest readings; filtered and paged when asked (viewer)")
            .query(query::<nightshift_engine::api::NodesQuery>)
            .ok(200, schema::<Vec<NodeView>>, "[NodeView]; with more after this page, the next page's cursor in the Next-Cursor header")
            .error(400, "a filter that cannot be read (say which, expected and found)"),
        Op::new(GET, "/api/v1/nodes/{name}", "One node and its recent runs (viewer)")
            .ok(200, schema::<NodeDetail>, "`{node, recent_runs}`"),
        Op::new(POST, "/api/v1/nodes/{name}/hands-off", "Set or clear the engine's hands-off marker (admin): audited, kept across restarts, ending by itself after for_secs when given")
            .body(schema::<HandsOff>)
            .ok(200, schema::<HandsOffReply>, "`{node, hands_off, until_ms}`")
            .error(400, "for_secs out of range"),
        Op::new(GET, "/api/v1/nodes/{name}/evidence/{bundle}/{file}", "One file of an RMA evidence bundle, copied off the node (operator); check the copy with nightshift audit verify --evidence")
            .ok_as(200, "application/octet-stream", "the file's bytes")
            .error(400, "not a plain bundle or file name")
            .error(404, "no such node, bundle or file")
            .error(502, "the node's agent did not answer"),
        Op::new(GET, "/api/v1/nodes/{name}/health", "Every GPU's health state, fault, what a person should do, and its lifecycle's timestamps (viewer)")
            .ok(200, schema::<NodeHealth>, "`{node, state, gpus}`")
            .error(404, "no such node"),
        Op::new(POST, "/api/v1/nodes/{name}/repaired", "A person says the node (or one GPU) was repaired: its GPUs go to verifying and the agent's health check decides (operator)")
            .body(schema::<Repaired>)
            .ok(200, schema::<Verifying>, "`{node, verifying}`")
            .error(404, "no such node")
            .error(409, "nothing on the node awaits repair"),
        Op::new(POST, "/api/v1/agents/{name}/health-check", "Run the agent's read-only health check now (operator)")
            .ok(200, schema::<HealthCheckReply>, "`{node, check}`: ok, each GPU's failures, dcgmi diag where installed")
            .error(502, "the agent did not answer"),
        Op::new(GET, "/api/v1/agents/{name}/ping", "Round trip to the node's agent (viewer)")
            .ok(200, schema::<AgentPing>, "`{ok, round_trip_ms}`"),
        Op::new(POST, "/api/v1/agents/{name}/sim-fault", "Tell a sim agent's simulated hardware a fault — a lab's way to try the stack (admin); audited as a note under who injected it; an agent on real hardware refuses")
            .body(schema::<SimFault>)
            .ok(200, schema::<SimFaultReply>, "`{node, injected}`")
            .error(400, "an unknown fault, or the agent's refusal (not the sim backend)")
            .error(404, "no such node"),
        Op::new(GET, "/api/v1/agents/{name}/inventory", "The agent's inventory (viewer)")
            .ok(200, schema::<Inventory>, "Inventory"),
        Op::new(GET, "/api/v1/runbooks", "Loaded runbooks and load errors (viewer)")
            .ok(200, schema::<RunbookList>, "`{runbooks, errors}`"),
        Op::new(GET, "/api/v1/runbooks/{name}", "A runbook: manifest, script, recent runs (viewer)")
            .ok(200, schema::<RunbookDetail>, "`{runbook, recent_runs}`"),
        Op::new(POST, "/api/v1/reload", "Read fleet.yaml, the tokens, the runbooks and the XID policy overrides again, as SIGHUP does; audited as config_reloaded (admin)")
            .query(query::<ReloadQuery>)
            .ok(200, schema::<ReloadReply>, "`{nodes: {added, changed, removed}, tokens_added, tokens_changed, tokens_removed, webhook_tokens_changed, runbooks_changed, runbooks, runbook_errors, restart_needed, fault_policy?}` (fault_policy: what changed in the XID policy, one line per code)")
            .error(422, "a file is broken (file:line:column), the runbook folder is missing, or a runbook fails to load (each named); nothing changed"),
        Op::new(POST, "/api/v1/runbooks/reload", "The same as /api/v1/reload (kept for older callers; `loaded` and `errors` are the runbook count and errors) (admin)")
            .query(query::<ReloadQuery>)
            .ok(200, schema::<ReloadReply>, "the reload report with `{loaded, errors}`"),
        Op::new(GET, "/api/v1/audit/records", "Audit records after a sequence number (viewer)")
            .query(query::<nightshift_engine::api::RecordsQuery>)
            .ok(200, schema::<Vec<AuditRecord>>, "[AuditRecord]"),
        Op::new(GET, "/api/v1/audit/search", "Audit records matching filters, newest first, a page at a time (viewer)")
            .query(query::<SearchParams>)
            .ok(200, schema::<RecordPage>, "`{records: [AuditRecord], next_before_seq, scanned}`")
            .error(400, "a filter that does not parse, saying what was expected"),
        Op::new(GET, "/api/v1/audit/records/{seq}", "One audit record, whether its prev_hash equals the hash of the record before it, and its neighbours (viewer)")
            .ok(200, schema::<RecordView>, "`{record, prev_seq, next_seq, links_to_prev}`")
            .error(404, "no such record"),
        Op::new(GET, "/api/v1/audit/verify", "Walk the hash chain (viewer); with shards=all (PostgreSQL), every shard's chain in the database")
            .query(query::<VerifyQuery>)
            .ok(200, schema::<VerifyReport>, "`{ok, verified_up_to, records, first_bad_seq, problem}`, or with shards=all `{SHARD: {ok, …}, …}`")
            .error(400, "shards=all on the sled backend, or another value"),
        Op::new(GET, "/api/v1/audit/head", "The newest record's sequence number and hash, to keep outside the store (viewer)")
            .ok(200, schema::<AuditHead>, "`{seq, hash, ts_ms, ts}`"),
        Op::new(GET, "/api/v1/audit/export", "Every record as JSON lines (viewer)")
            .ok_as(200, "application/x-ndjson", "application/x-ndjson"),
        Op::new(GET, "/api/v1/events/stream", "Live tail (SSE): one event per audit record, id = sequence; resumes after Last-Event-ID (viewer)")
            .query(query::<StreamQuery>)
            .ok_as(200, "text/event-stream", "text/event-stream"),
        Op::new(POST, "/api/v1/alerts/alertmanager", "Alertmanager webhook, payload version 4; idempotent per fingerprint + startsAt; 1 MiB limit (webhook token or operator)")
            .body(schema::<WebhookPayload>)
            .ok(200, schema::<Ingested>, "`{accepted, duplicates, shed}`")
            .error(413, "too large")
            .error(503, "`{accepted, duplicates, shed}` with shed > 0: the alert backlog (limits.alert_backlog) is full; the shed alerts are audited and not remembered, so Alertmanager's retry delivers them; Retry-After: 5. Or `{error: {code: rate_limited}}`: this poster sent more than limits.webhook_alerts_per_sec (and its burst); nothing of the call was accepted; Retry-After: seconds until it fits"),
        Op::new(GET, "/api/v1/ha", "Leadership (PostgreSQL backend): this engine's role (leader, taking_over, standby, deposed), term, the leader it knows, and every shard of the database with its leader, term and chain head (viewer). On a standby, every request but GET is forwarded to the leader")
            .ok(200, schema::<HaReply>, "`{backend, shard, holder, role, term, leader, lease_age_ms, deposed, takeover_ms, shards}`")
            .error(503, "on a write: no leader is ready yet (an election or a takeover is under way); Retry-After: 2"),
        Op::new(GET, "/metrics", "Prometheus exposition format (viewer)")
            .ok_as(200, "text/plain; version=0.0.4", "text/plain; version=0.0.4"),
        Op::new(GET, "/healthz", "Liveness (no token)")
            .public()
            .ok(200, schema::<Healthz>, "`{ok}`")
            .error(503, "`{ok: false, audit_stopped}`: the audit store stopped at a durability failure (a full disk); it says what to do (the engine exits 74 after `audit.exit_after_stop_secs`). `{ok: false, ready: false, starting}` while the engine starts (opening its store: PostgreSQL may be down)"),
        Op::new(GET, "/readyz", "Readiness (no token)")
            .public()
            .ok(200, schema::<Readyz>, "`{ok, ready, role}`")
            .error(503, "`{ready: false, starting | audit_stopped}`: starting, or the store stopped"),
    ]
}

const DESCRIPTION: &str = "The JSON API behind the nightshift web UI and the `nightshift --server` CLI. Authenticate with `Authorization: Bearer <token>`; roles: viewer (read), operator (also run, approve, reject, cancel), admin (also hands-off and runbook reload). Errors are `{\"error\": {\"code\", \"message\"}}` with 400 (bad input, the message names the field), 401, 403, 404, 409, 413. Generated from the types the server answers with (`web/src/openapi.rs`).";

#[derive(Serialize)]
struct Document {
    openapi: &'static str,
    info: Info,
    components: Components,
    security: Vec<BTreeMap<&'static str, Vec<String>>>,
    paths: BTreeMap<&'static str, BTreeMap<&'static str, Operation>>,
}

#[derive(Serialize)]
struct Info {
    title: &'static str,
    version: &'static str,
    description: &'static str,
}

#[derive(Serialize)]
struct Components {
    #[serde(rename = "securitySchemes")]
    security_schemes: BTreeMap<&'static str, SecurityScheme>,
    schemas: Map<String, Value>,
}

#[derive(Serialize)]
struct SecurityScheme {
    #[serde(rename = "type")]
    kind: &'static str,
    scheme: &'static str,
}

#[derive(Serialize)]
struct Operation {
    summary: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    parameters: Vec<Parameter>,
    #[serde(rename = "requestBody", skip_serializing_if = "Option::is_none")]
    request_body: Option<Body>,
    responses: BTreeMap<String, Response>,
    #[serde(skip_serializing_if = "Option::is_none")]
    security: Option<Vec<BTreeMap<&'static str, Vec<String>>>>,
}

#[derive(Serialize)]
struct Parameter {
    name: String,
    #[serde(rename = "in")]
    location: &'static str,
    required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    schema: Value,
}

#[derive(Serialize)]
struct Body {
    required: bool,
    content: BTreeMap<&'static str, Media>,
}

#[derive(Serialize)]
struct Media {
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<Schema>,
}

#[derive(Serialize)]
struct Response {
    description: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    content: BTreeMap<&'static str, Media>,
}

/// A query struct's fields as query parameters (its doc comments their
/// descriptions).
fn query_parameters(q: SchemaFn) -> Vec<Parameter> {
    let mut g = SchemaGenerator::new(SchemaSettings::openapi3().with(|s| s.inline_subschemas = true));
    let root = q(&mut g);
    let required: Vec<&str> =
        root.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let mut out = Vec::new();
    for (name, prop) in root.get("properties").and_then(Value::as_object).into_iter().flatten() {
        let mut schema = prop.clone();
        let description =
            schema.as_object_mut().and_then(|o| o.remove("description")).and_then(|d| d.as_str().map(str::to_string));
        if let Some(o) = schema.as_object_mut() {
            // A query string has no null: an absent parameter is the none.
            o.remove("nullable");
            o.remove("default");
        }
        out.push(Parameter {
            name: name.clone(),
            location: "query",
            required: required.contains(&name.as_str()),
            description,
            schema,
        });
    }
    out
}

/// `{name}`s of a path, as path parameters (a record's `seq` a number).
fn path_parameters(path: &str) -> Vec<Parameter> {
    path.split('/')
        .filter_map(|p| p.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
        .map(|name| {
            let kind = if name == "seq" { "integer" } else { "string" };
            let mut schema = Map::new();
            schema.insert("type".into(), Value::from(kind));
            Parameter {
                name: name.to_string(),
                location: "path",
                required: true,
                description: None,
                schema: Value::Object(schema),
            }
        })
        .collect()
}

/// The document, as served at `/api/v1/openapi.json` and checked in.
pub fn document() -> Value {
    let mut g = SchemaGenerator::new(SchemaSettings::openapi3());
    let error = g.subschema_for::<nightshift_engine::api::ApiErrorBody>();
    let mut paths: BTreeMap<&'static str, BTreeMap<&'static str, Operation>> = BTreeMap::new();
    for op in operations() {
        let mut parameters = path_parameters(op.path);
        if let Some(q) = op.query {
            parameters.extend(query_parameters(q));
        }
        for (name, description) in &op.headers {
            let mut schema = Map::new();
            schema.insert("type".into(), Value::from("string"));
            parameters.push(Parameter {
                name: name.to_string(),
                location: "header",
                required: false,
                description: Some(description.to_string()),
                schema: Value::Object(schema),
            });
        }
        let request_body = op.body.map(|(b, required)| Body {
            required,
            content: BTreeMap::from([("application/json", Media { schema: Some(b(&mut g)) })]),
        });
        let responses = op
            .answers
            .iter()
            .map(|(status, answer, description)| {
                let content = match answer {
                    Answer::Json(s) => BTreeMap::from([("application/json", Media { schema: Some(s(&mut g)) })]),
                    Answer::As(media) => BTreeMap::from([(*media, Media { schema: None })]),
                    Answer::Error => BTreeMap::from([("application/json", Media { schema: Some(error.clone()) })]),
                };
                (status.to_string(), Response { description, content })
            })
            .collect();
        let operation =
            Operation { summary: op.summary, parameters, request_body, responses, security: op.public.then(Vec::new) };
        paths.entry(op.path).or_default().insert(op.method, operation);
    }
    let doc = Document {
        openapi: "3.0.3",
        info: Info { title: "nightshift API", version: "1", description: DESCRIPTION },
        components: Components {
            security_schemes: BTreeMap::from([("bearer", SecurityScheme { kind: "http", scheme: "bearer" })]),
            schemas: g.take_definitions(true),
        },
        security: vec![BTreeMap::from([("bearer", Vec::new())])],
        paths,
    };
    let mut v = serde_json::to_value(doc).unwrap_or_default();
    one_schema_items(&mut v);
    v
}

/// OpenAPI 3.0 wants one schema under `items`: a tuple (`(u32, u32)`,
/// whose JSON Schema lists one per place) becomes the one they share, or
/// any of them.
fn one_schema_items(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(places)) = m.get_mut("items") {
                let mut distinct: Vec<Value> = Vec::new();
                for p in places.drain(..) {
                    if !distinct.contains(&p) {
                        distinct.push(p);
                    }
                }
                let one = if distinct.len() == 1 {
                    distinct.remove(0)
                } else {
                    let mut any = Map::new();
                    any.insert("anyOf".into(), Value::Array(distinct));
                    Value::Object(any)
                };
                m.insert("items".into(), one);
            }
            m.values_mut().for_each(one_schema_items);
        }
        Value::Array(a) => a.iter_mut().for_each(one_schema_items),
        _ => {}
    }
}

/// The document as the checked-in file has it: pretty, one trailing newline.
pub fn document_text() -> String {
    let mut s = serde_json::to_string_pretty(&document()).unwrap_or_default();
    s.push('\n');
    s
}
