//! The audit record browser: `/audit` (the chain's verdict, then records
//! filtered by kind, node, run, actor and time, newest first, a page at a
//! time) and `/audit/records/{seq}` (one record: every field, its hash, the
//! link to the record before it checked, its neighbours). The same searches
//! as JSON: `GET /api/v1/audit/search`, `GET /api/v1/audit/records/{seq}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;

use nightshift_engine::api::{EngineApi, format_rfc3339_ms, parse_rfc3339_ms};
use nightshift_engine::audit::{AuditRecord, RecordKind, RecordPage, RecordQuery};

use crate::AppState;
use crate::api::ApiQuery;
use crate::error::ApiError;
use crate::extract::Viewer;
use crate::html::{PageError, layout};

/// The browser's filters, as a query string (empty values are no filter).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    pub kind: Option<String>,
    pub node: Option<String>,
    pub run: Option<String>,
    pub actor: Option<String>,
    /// RFC 3339, or an age: `90s`, `15m`, `6h`, `7d`.
    pub since: Option<String>,
    pub until: Option<String>,
    pub before_seq: Option<String>,
    pub limit: Option<String>,
}

fn some(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

/// A time: RFC 3339, or an age before `now_ms`.
pub fn parse_time(field: &str, s: &str, now_ms: i64) -> Result<i64, ApiError> {
    if let Some(ms) = parse_rfc3339_ms(s) {
        return Ok(ms);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let mult = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => 0,
    };
    match num.parse::<i64>() {
        Ok(n) if mult > 0 && n <= 3650 * 86_400 => Ok(now_ms - n * mult),
        _ => Err(ApiError::bad_request(format!(
            "{field}: expected an RFC 3339 time (2026-12-01T03:00:00Z) or an age (90s, 15m, 6h, 7d), found {s:?}"
        ))),
    }
}

fn kinds() -> Vec<&'static str> {
    ALL_KINDS.iter().map(|k| k.as_str()).collect()
}

const ALL_KINDS: &[RecordKind] = &[
    RecordKind::EngineStarted,
    RecordKind::EventReceived,
    RecordKind::EventDropped,
    RecordKind::EventHandled,
    RecordKind::TriggerFired,
    RecordKind::TriggerSuppressed,
    RecordKind::BreakerTripped,
    RecordKind::RunQueued,
    RecordKind::ApprovalRequested,
    RecordKind::Approved,
    RecordKind::Rejected,
    RecordKind::RunStarted,
    RecordKind::ActionIntent,
    RecordKind::ActionResult,
    RecordKind::Note,
    RecordKind::Notification,
    RecordKind::NotificationDelivery,
    RecordKind::Escalation,
    RecordKind::Refusal,
    RecordKind::NodeAnnotated,
    RecordKind::HandsOff,
    RecordKind::HoldEnded,
    RecordKind::HoldReapplied,
    RecordKind::HoldDrifted,
    RecordKind::HealthChanged,
    RecordKind::RunFinished,
    RecordKind::Salvaged,
    RecordKind::ConfigReloaded,
    RecordKind::RunbookMode,
    RecordKind::FleetMode,
    RecordKind::Maintenance,
    RecordKind::EvidenceCollected,
];

/// The store's query for these filters.
pub fn query(p: &SearchParams, now_ms: i64) -> Result<RecordQuery, ApiError> {
    let kind = match some(&p.kind) {
        None => None,
        Some(k) => Some(*ALL_KINDS.iter().find(|x| x.as_str() == k).ok_or_else(|| {
            ApiError::bad_request(format!("kind: expected one of {}, found {k:?}", kinds().join(", ")))
        })?),
    };
    let num = |field: &str, v: &Option<String>, most: u64| -> Result<Option<u64>, ApiError> {
        match some(v) {
            None => Ok(None),
            Some(s) => match s.parse::<u64>() {
                Ok(n) if n <= most => Ok(Some(n)),
                _ => Err(ApiError::bad_request(format!("{field}: expected a whole number up to {most}, found {s:?}"))),
            },
        }
    };
    let time = |field: &str, v: &Option<String>| some(v).map(|s| parse_time(field, &s, now_ms)).transpose();
    Ok(RecordQuery {
        kind,
        node: some(&p.node),
        run: some(&p.run),
        actor: some(&p.actor),
        since_ms: time("since", &p.since)?,
        until_ms: time("until", &p.until)?,
        before_seq: num("before_seq", &p.before_seq, u64::MAX)?,
        limit: num("limit", &p.limit, 1000)?.unwrap_or(100) as usize,
    })
}

pub(crate) async fn search(s: &AppState, q: RecordQuery) -> Result<RecordPage, ApiError> {
    let audit = s.engine.audit().clone();
    tokio::task::spawn_blocking(move || audit.search(&q))
        .await
        .map_err(|e| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("the search stopped: {e}"))
        })?
        .map_err(|e| nightshift_engine::engine::EngineError::from(e).into())
}

/// `GET /api/v1/audit/search`.
pub async fn api_search(
    State(s): State<AppState>,
    _: Viewer,
    ApiQuery(p): ApiQuery<SearchParams>,
) -> Result<Response, ApiError> {
    let q = query(&p, s.engine.clock().now_ms())?;
    Ok(Json(search(&s, q).await?).into_response())
}

/// One record with its neighbours and whether it links to the one before.
fn record_view(s: &AppState, seq: u64) -> Result<(AuditRecord, Option<AuditRecord>, bool), ApiError> {
    let audit = s.engine.audit();
    let err = |e| ApiError::from(nightshift_engine::engine::EngineError::from(e));
    let r = audit.get(seq).map_err(err)?.ok_or_else(|| ApiError::not_found(format!("no audit record {seq}")))?;
    let prev = if seq > 1 { audit.get(seq - 1).map_err(err)? } else { None };
    let next = audit.get(seq + 1).map_err(err)?.is_some();
    Ok((r, prev, next))
}

/// `GET /api/v1/audit/records/{seq}`.
pub async fn api_record(State(s): State<AppState>, _: Viewer, Path(seq): Path<String>) -> Result<Response, ApiError> {
    let seq = parse_seq(&seq)?;
    let (r, prev, next) = record_view(&s, seq)?;
    let links = prev.as_ref().map(|p| p.hash == r.prev_hash);
    Ok(Json(nightshift_engine::api::RecordView {
        prev_seq: prev.as_ref().map(|p| p.seq),
        next_seq: next.then_some(seq + 1),
        links_to_prev: links,
        record: r,
    })
    .into_response())
}

fn parse_seq(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::bad_request(format!("seq: expected a record number from 1, found {s:?}")))
}

/// A record's scalar fields as `key: value` pairs (digests left out): what
/// a record with no sentence of its own says, without raw JSON.
fn words(d: &Value) -> String {
    let Some(m) = d.as_object() else { return d.to_string() };
    let pairs: Vec<String> = m
        .iter()
        .filter(|(k, _)| !k.ends_with("sha256") && !k.ends_with("hash"))
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some(format!("{k}: {s}")),
            Value::Number(n) => Some(format!("{k}: {n}")),
            Value::Bool(b) => Some(format!("{k}: {b}")),
            _ => None,
        })
        .collect();
    if pairs.is_empty() { format!("{} field(s): see the record", m.len()) } else { pairs.join(", ") }
}

/// What a record says, in a few words.
pub fn summary(r: &AuditRecord) -> String {
    let d = &r.data;
    let st = |k: &str| d.get(k).and_then(Value::as_str).map(str::to_string);
    let text = match r.kind {
        RecordKind::ActionIntent => format!("will send {}", st("op").unwrap_or_default()),
        RecordKind::ActionResult => {
            let op = st("op").unwrap_or_default();
            match (d.get("ok").and_then(Value::as_bool), d.get("applied").and_then(Value::as_bool)) {
                (Some(false), _) => format!("{op} refused: {}", st("error").unwrap_or_default()),
                (_, Some(false)) => format!("{op} answered, nothing changed"),
                _ => format!("{op} applied"),
            }
        }
        RecordKind::RunFinished => {
            format!(
                "{}{}",
                st("outcome").unwrap_or_default(),
                st("error").map(|e| format!(": {e}")).unwrap_or_default()
            )
        }
        RecordKind::Note | RecordKind::Escalation | RecordKind::Notification => {
            st("message").or_else(|| st("text")).unwrap_or_else(|| d.to_string())
        }
        RecordKind::TriggerSuppressed | RecordKind::EventDropped | RecordKind::Refusal => {
            st("reason").unwrap_or_else(|| d.to_string())
        }
        RecordKind::HealthChanged => {
            format!("GPU {} → {}", r.gpu.map(|g| g.to_string()).unwrap_or_default(), st("to").unwrap_or_default())
        }
        RecordKind::HandsOff => {
            let why = st("reason").unwrap_or_default();
            if d.get("hands_off") == Some(&Value::Bool(true)) {
                format!("hands-off set: {why}")
            } else {
                format!("hands-off ended: {why}")
            }
        }
        RecordKind::EvidenceCollected => match st("error") {
            Some(e) => format!("RMA evidence not collected: {e}"),
            None => format!(
                "RMA evidence bundle {} ({} files, sha256 {}) at {}",
                st("bundle").unwrap_or_default(),
                d.get("files").and_then(Value::as_array).map_or(0, Vec::len),
                st("sha256").unwrap_or_default().chars().take(16).collect::<String>(),
                st("dir").unwrap_or_default()
            ),
        },
        RecordKind::Maintenance => {
            let id = st("id").unwrap_or_default();
            let why = st("reason").unwrap_or_default();
            if d.get("set") == Some(&Value::Bool(true)) {
                let mut what: Vec<String> = d
                    .get("matchers")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect())
                    .unwrap_or_default();
                if let Some(nodes) = d.get("nodes").and_then(Value::as_array) {
                    what.extend(nodes.iter().filter_map(Value::as_str).map(str::to_string));
                }
                let until = d.get("ends_ms").and_then(Value::as_i64).map(nightshift_engine::api::format_rfc3339_ms);
                format!("maintenance window {id} set on {} until {}: {why}", what.join(" "), until.unwrap_or_default())
            } else {
                format!("maintenance window {id} ended: {why}")
            }
        }
        RecordKind::FleetMode | RecordKind::RunbookMode => format!(
            "{} {} → {}: {}",
            if r.kind == RecordKind::FleetMode { "fleet" } else { r.runbook.as_deref().unwrap_or("runbook") },
            st("from").unwrap_or_default(),
            st("to").unwrap_or_default(),
            st("reason").unwrap_or_default()
        ),
        RecordKind::RunStarted => match d.get("waited_ms").and_then(Value::as_i64).filter(|ms| *ms > 0) {
            Some(ms) => format!("started after waiting {} s", ms / 1000),
            None => "started".to_string(),
        },
        _ => st("detail").or_else(|| st("reason")).or_else(|| st("why")).unwrap_or_else(|| words(d)),
    };
    // A person's act says why.
    let text = match (r.kind, st("reason"), r.actor.starts_with("user:")) {
        (RecordKind::ActionIntent | RecordKind::ActionResult, Some(why), true) => format!("{text} — {why}"),
        _ => text,
    };
    let mut t: String = text.chars().take(140).collect();
    if t.len() < text.len() {
        t.push('…');
    }
    t
}

pub(crate) fn time(ms: i64) -> Markup {
    let s = format_rfc3339_ms(ms);
    html! { time datetime=(s) { (&s[..10]) " " (&s[11..19]) "Z" } }
}

fn link(p: &SearchParams, before: u64) -> String {
    let mut parts = Vec::new();
    for (k, v) in [
        ("kind", &p.kind),
        ("node", &p.node),
        ("run", &p.run),
        ("actor", &p.actor),
        ("since", &p.since),
        ("until", &p.until),
    ] {
        if let Some(v) = some(v) {
            parts.push(format!("{k}={}", percent(&v)));
        }
    }
    parts.push(format!("before_seq={before}"));
    format!("/audit?{}", parts.join("&"))
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `/audit`: the verdict, the filters, the records.
pub async fn page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    axum::extract::Query(p): axum::extract::Query<SearchParams>,
) -> Result<Response, PageError> {
    let v = crate::api::session(&s, &who).verify().await?;
    let q = query(&p, s.engine.clock().now_ms())?;
    let results = search(&s, q).await?;
    let val = |o: &Option<String>| some(o).unwrap_or_default();
    let kind = val(&p.kind);
    let body = html! {
        h1 { "Audit" }
        @if v.ok {
            p.verdict.ok { "✓ Chain verified up to record " (v.verified_up_to) " (" (v.records) " records): every record links to the one before and matches its hash." }
        } @else {
            p.verdict.bad { "✗ The chain breaks at record " (v.first_bad_seq.unwrap_or(0)) ". Records 1–" (v.verified_up_to) " verify." }
            p.error { (v.problem.clone().unwrap_or_default()) }
        }
        p { "Export the log: " a href="/api/v1/audit/export" { "JSONL" } " · " a href="/api/v1/audit/verify" { "verification as JSON" } }
        h2 { "Records" }
        form.filters #audit-filters method="get" action="/audit" {
            label { "kind "
                select name="kind" {
                    option value="" selected[kind.is_empty()] { "any" }
                    @for k in kinds() { option value=(k) selected[kind == k] { (k) } }
                }
            }
            label { "node " input type="text" name="node" value=(val(&p.node)) size="12"; }
            label { "run " input type="text" name="run" value=(val(&p.run)) size="16"; }
            label { "actor " input type="text" name="actor" value=(val(&p.actor)) size="12" placeholder="engine, alice, people"; }
            label { "since " input type="text" name="since" value=(val(&p.since)) size="12" placeholder="6h or RFC 3339"; }
            label { "until " input type="text" name="until" value=(val(&p.until)) size="12"; }
            button type="submit" { "Filter" }
            " " a href="/audit" { "clear" }
        }
        @if results.records.is_empty() {
            p.muted #audit-empty { "No record matches" @if results.next_before_seq.is_some() { " in the " (results.scanned) " records read" } "." }
        } @else {
            table #audit-records {
                thead { tr { th { "#" } th { "time" } th { "kind" } th { "node" } th { "run" } th { "actor" } th { "what" } } }
                tbody {
                    @for r in &results.records {
                        tr {
                            td { a href={"/audit/records/" (r.seq)} { (r.seq) } }
                            td { (time(r.ts_ms)) }
                            td { span.tag { (r.kind.as_str()) } }
                            td { @if let Some(n) = &r.node { a href={"/nodes/" (n)} { (n) } @if let Some(g) = r.gpu { " GPU " (g) } } }
                            td { @if let Some(id) = &r.run { a href={"/runs/" (id)} { (id) } } }
                            td { (r.actor) }
                            td { (summary(r)) }
                        }
                    }
                }
            }
        }
        @if let Some(before) = results.next_before_seq {
            p { a #audit-older href=(link(&p, before)) { "older records →" } }
        }
    };
    Ok(layout("Audit", "Audit", Some(&who), body).into_response())
}

/// `/audit/records/{seq}`.
pub async fn record_page(
    State(s): State<AppState>,
    Viewer(who): Viewer,
    Path(seq): Path<String>,
) -> Result<Response, PageError> {
    let seq = parse_seq(&seq)?;
    let (r, prev, next) = record_view(&s, seq)?;
    let links = prev.as_ref().map(|p| p.hash == r.prev_hash);
    let data = serde_json::to_string_pretty(&r.data).unwrap_or_default();
    let body = html! {
        h1 { "Audit record " (r.seq) }
        p {
            @if let Some(p) = &prev { a #record-prev href={"/audit/records/" (p.seq)} { "← record " (p.seq) } " · " }
            a href={"/audit?before_seq=" (seq + 1)} { "in the list" }
            @if next { " · " a #record-next href={"/audit/records/" (seq + 1)} { "record " (seq + 1) " →" } }
        }
        table.kv #record-fields {
            tr { th { "kind" } td { (r.kind.as_str()) } }
            tr { th { "time" } td { (time(r.ts_ms)) " (" (r.ts_ms) " ms)" } }
            tr { th { "actor" } td { (r.actor) } }
            @if let Some(n) = &r.node { tr { th { "node" } td { a href={"/nodes/" (n)} { (n) } @if let Some(g) = r.gpu { " GPU " (g) } } } }
            @if let Some(id) = &r.run { tr { th { "run" } td { a href={"/runs/" (id)} { (id) } } } }
            @if let Some(rb) = &r.runbook { tr { th { "runbook" } td { a href={"/runbooks/" (rb)} { (rb) } } } }
            tr { th { "what" } td { (summary(&r)) } }
            tr { th { "hash" } td { code #record-hash { (r.hash) } " (chain version " (r.v.unwrap_or(1)) ")" } }
            tr { th { "prev_hash" } td {
                code { (r.prev_hash) }
                @match links {
                    Some(true) => { " " span.ok #record-link { "✓ equals record " (seq - 1) "'s hash" } }
                    Some(false) => { " " span.bad #record-link { "✗ record " (seq - 1) "'s hash differs: the chain breaks here" } }
                    None => { " " span.muted { "(the first record)" } }
                }
            } }
        }
        h2 { "data" }
        pre.json { (data) }
        p.muted { "Recompute the hash yourself: scripts/verify-chain.py over the JSONL export." }
    };
    Ok(layout(&format!("Audit record {seq}"), "Audit", Some(&who), body).into_response())
}
