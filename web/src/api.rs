//! The JSON API (`/api/v1/…`), mirroring the pages; the CLI's `--server`
//! mode uses it. Documented in `openapi.json` (served at
//! `/api/v1/openapi.json`).

use std::convert::Infallible;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use nightshift_engine::api::{
    Cancel, EngineApi, HandsOff, Healthz, NodesQuery, Readyz, Reason, RecordsQuery, ReleaseHolds, Repaired, RunsQuery,
    Session, SetFleetMode, SetRunbookMode, StartRun, WebhookPayload,
};

use crate::AppState;
use crate::error::ApiError;
use crate::extract::{Admin, Operator, Viewer};

/// `Json<T>` whose rejections are our JSON errors, naming the field.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .is_some_and(|m| m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected `Content-Type: application/json`",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "request body too large")
            } else {
                ApiError::bad_request(r.body_text())
            }
        })?;
        // A key given twice is refused: the last would win while a reader
        // of the body sees the first.
        nightshift_proto::json::check_no_duplicate_keys(&bytes).map_err(ApiError::bad_request)?;
        match Json::<T>::from_bytes(&bytes) {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(json_rejection(r)),
        }
    }
}

/// [`ApiJson`], or `T::default()` for a request with no body and no
/// `Content-Type` at all (a bare `POST`).
pub struct ApiJsonOrEmpty<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for ApiJsonOrEmpty<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if req.headers().contains_key(axum::http::header::CONTENT_TYPE) {
            return ApiJson::<T>::from_request(req, state).await.map(|ApiJson(v)| ApiJsonOrEmpty(v));
        }
        let bytes =
            axum::body::Bytes::from_request(req, state).await.map_err(|r| ApiError::bad_request(r.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            Ok(ApiJsonOrEmpty(T::default()))
        } else {
            Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected `Content-Type: application/json` (or no body at all)",
            ))
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    let status = r.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(status, "too_large", "request body too large");
    }
    let text = r.body_text();
    let text =
        text.strip_prefix("Failed to deserialize the JSON body into the target type: ").unwrap_or(&text).to_string();
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return ApiError::new(status, "unsupported_media_type", "expected `Content-Type: application/json`");
    }
    ApiError::bad_request(text)
}

/// `Query<T>` whose rejections are our JSON errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(q) => Ok(ApiQuery(q.0)),
            Err(r) => Err(query_rejection(r)),
        }
    }
}

fn query_rejection(r: QueryRejection) -> ApiError {
    let text = r.body_text();
    ApiError::bad_request(text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text).to_string())
}

pub async fn list_runs(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    ApiQuery(q): ApiQuery<RunsQuery>,
) -> Result<Response, ApiError> {
    match q.shards.as_deref().filter(|x| !x.is_empty()) {
        None => Ok(Json(session(&s, &id).runs(q).await?).into_response()),
        Some("all") => Ok(Json(session(&s, &id).runs_all_shards(q).await?).into_response()),
        Some(other) => Err(ApiError::bad_request(format!("shards: expected all, found {other:?}"))),
    }
}

/// The engine's front door as the person behind the request.
pub(crate) fn session(s: &AppState, id: &crate::auth::Identity) -> Session {
    Session::new(s.engine.clone(), &id.name, id.role == nightshift_engine::config::Role::Admin)
}

pub async fn get_run(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(run): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).run(&run).await?).into_response())
}

/// An `Idempotency-Key` header: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let k = v.to_str().ok().filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()));
    match k {
        Some(k) => Ok(Some(k.to_string())),
        None => Err(ApiError::bad_request(format!(
            "Idempotency-Key: expected 1 to 255 visible ASCII characters, found {} bytes{}",
            v.len(),
            if v.to_str().is_err() { " that are not ASCII" } else { "" }
        ))),
    }
}

/// `POST /api/v1/runs`: a manual run. With an `Idempotency-Key` header, a
/// retry (after a lost answer) with the same key from the same person
/// within 24 h answers the run the first one started, and starts nothing.
pub async fn start_run(
    State(s): State<AppState>,
    Operator(id): Operator,
    headers: axum::http::HeaderMap,
    ApiJson(body): ApiJson<StartRun>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    Ok((StatusCode::ACCEPTED, Json(session(&s, &id).submit(body, key).await?)).into_response())
}

pub async fn approve(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(run): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).approve(&run).await?).into_response())
}

pub async fn reject(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(run): Path<String>,
    ApiJson(body): ApiJson<Reason>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).reject(&run, body).await?).into_response())
}

pub async fn cancel(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(run): Path<String>,
    ApiJsonOrEmpty(body): ApiJsonOrEmpty<Cancel>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).cancel(&run, body).await?).into_response())
}

/// `POST /api/v1/runs/plan`: what `POST /api/v1/runs` with this body would
/// decide — target nodes, nodes changed, approval — changing nothing.
pub async fn plan_run(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    ApiJson(body): ApiJson<StartRun>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).plan(body).await?).into_response())
}

pub async fn approvals(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).approvals().await?).into_response())
}

/// The nodes, by name (filtered when asked); with `limit`, a page of them
/// and, when there are more, the next page's cursor in `Next-Cursor`.
pub async fn nodes(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    ApiQuery(q): ApiQuery<NodesQuery>,
) -> Result<Response, ApiError> {
    let page = session(&s, &id).nodes(q).await?;
    let (page, next) = (page.nodes, page.next_cursor);
    let mut resp = Json(page).into_response();
    if let Some(next) = next
        && let Ok(v) = axum::http::HeaderValue::from_str(&next)
    {
        resp.headers_mut().insert("next-cursor", v);
    }
    Ok(resp)
}

pub async fn node(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).node(&name).await?).into_response())
}

/// `GET /api/v1/nodes/{name}/health`: every GPU's health state, fault,
/// instruction and lifecycle.
pub async fn node_health(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).node_health(&name).await?).into_response())
}

/// `GET /api/v1/nodes/{name}/evidence/{bundle}/{file}`: one file of an RMA
/// evidence bundle, copied off the node piece by piece (operator: a bug
/// report holds the host's details). Compare the copy with the chain:
/// `nightshift audit verify --evidence DIR`.
pub async fn evidence_file(
    State(s): State<AppState>,
    _: Operator,
    Path((name, bundle, file)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    use nightshift_engine::api::EvidenceReadError as E;
    let failed = |e: E| match e {
        E::NotFound(m) => ApiError::not_found(m),
        E::BadName(m) => ApiError::bad_request(m),
        E::Unreachable(m) => ApiError::new(StatusCode::BAD_GATEWAY, "agent_unreachable", m),
    };
    let first = s.engine.read_evidence(&name, &bundle, &file, 0).await.map_err(failed)?;
    let size = first.size;
    let engine = s.engine.clone();
    // Each piece as it comes; a piece that fails ends the body short of
    // its length (the client sees a broken copy, never a silent one).
    let stream = futures::stream::unfold(Some(first), move |next| {
        let (engine, name, bundle, file) = (engine.clone(), name.clone(), bundle.clone(), file.clone());
        async move {
            let c = next?;
            let data = hex::decode(&c.data_hex).unwrap_or_default();
            let after = if c.eof || data.is_empty() {
                None
            } else {
                match engine.read_evidence(&name, &bundle, &file, c.offset + data.len() as u64).await {
                    Ok(n) => Some(n),
                    Err(e) => {
                        tracing::warn!(node = %name, bundle = %bundle, file = %file, error = %e, "evidence copy broken off");
                        return Some((Err(std::io::Error::other(e.to_string())), None));
                    }
                }
            };
            Some((Ok::<_, std::io::Error>(data), after))
        }
    });
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (axum::http::header::CONTENT_LENGTH, size.to_string()),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

/// A person says the node (or a GPU) was repaired: its GPUs go to
/// verifying, and the health check decides whether they return.
pub async fn node_repaired(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Repaired>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).repaired(&name, body).await?).into_response())
}

/// `POST /api/v1/agents/{name}/health-check`: the agent's read-only health
/// check, now.
pub async fn agent_health_check(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).health_check(&name).await?).into_response())
}

/// A person releases holds on a node (operator): sent to the agent as
/// `person:<name>`, audited. 200 with each release's outcome; 400 without
/// a scope; 409 when a guard refuses (`hands_off`: an admin's hands-off;
/// `repair_pending`: a repair drain of a broken GPU — mark it repaired, or
/// an admin forces) or the agent refused one; 403 for a non-admin's force.
pub async fn release_holds(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ReleaseHolds>,
) -> Result<Response, ApiError> {
    Ok(control_answer(session(&s, &id).release(&name, body).await?))
}

/// A person puts a node back into service (operator): every drain on it
/// ends, a sticky repair or RMA drain too.
pub async fn resume_node(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Reason>,
) -> Result<Response, ApiError> {
    Ok(control_answer(session(&s, &id).resume(&name, body).await?))
}

/// A person drains a node (operator): their drain, never undone by
/// nightshift, ended by a person's resume.
pub async fn drain_node(
    State(s): State<AppState>,
    Operator(id): Operator,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Reason>,
) -> Result<Response, ApiError> {
    Ok(control_answer(session(&s, &id).drain(&name, body).await?))
}

fn control_answer(reply: nightshift_engine::api::ControlReply) -> Response {
    let status = if reply.error.is_some() { StatusCode::CONFLICT } else { StatusCode::OK };
    (status, Json(reply)).into_response()
}

pub async fn hands_off(
    State(s): State<AppState>,
    Admin(id): Admin,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<HandsOff>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).hands_off(&name, body).await?).into_response())
}

/// The whole fleet's mode, who set it and why (viewer).
pub async fn fleet_mode(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).fleet_mode().await?).into_response())
}

/// Put the whole fleet in act, shadow or paused mode (admin), audited with
/// who and why before it takes effect.
pub async fn set_fleet_mode(
    State(s): State<AppState>,
    Admin(id): Admin,
    ApiJson(body): ApiJson<SetFleetMode>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).set_fleet_mode(body).await?).into_response())
}

/// Promote or demote a runbook (admin), audited with who and why.
pub async fn runbook_mode(
    State(s): State<AppState>,
    Admin(id): Admin,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<SetRunbookMode>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).set_runbook_mode(&name, body).await?).into_response())
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShadowQuery {
    #[serde(default)]
    pub since_ms: Option<i64>,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// What a shadow runbook would have done (viewer).
pub async fn shadow_report(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<ShadowQuery>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).shadow_report(&name, q.since_ms, q.limit).await?).into_response())
}

pub async fn agent_ping(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).ping(&name).await?).into_response())
}

pub async fn agent_inventory(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).inventory(&name).await?).into_response())
}

/// Tell a `sim` agent's simulated hardware a fault (admin; a lab's way to
/// try the stack: `{"kind": "ecc_dbe", "gpu": 3, "count": 1}`); audited as
/// a note under who injected it; an agent on real hardware refuses.
pub async fn agent_sim_fault(
    State(s): State<AppState>,
    Admin(id): Admin,
    Path(name): Path<String>,
    ApiJson(fault): ApiJson<nightshift_proto::SimFault>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).sim_fault(&name, fault).await?).into_response())
}

/// What is held on a node: each setting's baseline, what is in effect and
/// the holds behind it (owner, value, lease), straight from its agent.
pub async fn agent_holds(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).holds(&name).await?).into_response())
}

pub async fn runbooks(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).runbooks().await?).into_response())
}

pub async fn runbook(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).runbook(&name).await?).into_response())
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReloadQuery {
    /// Put the runbooks that load in force even if others fail.
    #[serde(default)]
    allow_partial: bool,
}

/// Read fleet.yaml, the tokens and the runbooks again (what SIGHUP does):
/// the report of what changed, or 422 saying which file is broken (nothing
/// changed then).
pub async fn reload(
    State(s): State<AppState>,
    Admin(id): Admin,
    ApiQuery(q): ApiQuery<ReloadQuery>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).reload(q.allow_partial).await?).into_response())
}

pub async fn records(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    ApiQuery(q): ApiQuery<RecordsQuery>,
) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).records(q).await?).into_response())
}

/// `GET /api/v1/audit/verify[?shards=all]`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyQuery {
    #[serde(default)]
    pub shards: Option<String>,
}

pub async fn verify(
    State(s): State<AppState>,
    Viewer(id): Viewer,
    ApiQuery(q): ApiQuery<VerifyQuery>,
) -> Result<Response, ApiError> {
    let api = session(&s, &id);
    match q.shards.as_deref() {
        None => Ok(Json(api.verify().await?).into_response()),
        Some("all") => Ok(Json(api.verify_shards().await?).into_response()),
        Some(other) => {
            Err(ApiError::new(StatusCode::BAD_REQUEST, "bad_query", format!("shards: expected all, found {other:?}")))
        }
    }
}

/// The newest record's sequence number and hash: what to keep outside the
/// store to anchor the chain.
pub async fn head(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(session(&s, &id).audit_head().await?).into_response())
}

pub async fn export(State(s): State<AppState>, _: Viewer) -> Result<Response, ApiError> {
    let audit = s.engine.audit().clone();
    let stream = futures::stream::unfold(0u64, move |after| {
        let audit = audit.clone();
        async move {
            let batch = tokio::task::spawn_blocking(move || audit.tail(after, 1000)).await.ok()?.ok()?;
            let last = batch.last()?.seq;
            let mut out = String::new();
            for r in &batch {
                out.push_str(&serde_json::to_string(r).unwrap_or_default());
                out.push('\n');
            }
            Some((Ok::<_, Infallible>(out), last))
        }
    });
    Ok(([(axum::http::header::CONTENT_TYPE, "application/x-ndjson")], axum::body::Body::from_stream(stream))
        .into_response())
}

/// `GET /api/v1/events/stream`: the live tail. Resumes after `Last-Event-ID`
/// (or `?after_seq=`) with no gap and no duplicate; ends on shutdown.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    pub after_seq: Option<u64>,
    pub run: Option<String>,
}

pub async fn stream(
    State(s): State<AppState>,
    _: Viewer,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or(q.after_seq);
    // The broadcast only wakes the stream; records always come from the
    // store, in sequence order, after the last one sent: no gap even if the
    // broadcast lags, no duplicate.
    struct Tail {
        audit: nightshift_engine::audit::AuditStore,
        rx: tokio::sync::broadcast::Receiver<std::sync::Arc<nightshift_engine::audit::AuditRecord>>,
        last: u64,
        pending: std::collections::VecDeque<nightshift_engine::audit::AuditRecord>,
        run: Option<String>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    }
    let audit = s.engine.audit().clone();
    let rx = audit.subscribe();
    let last = last_id.unwrap_or_else(|| audit.head_seq());
    let tail = Tail { audit, rx, last, pending: Default::default(), run: q.run.clone(), shutdown: s.shutdown.clone() };
    let events = futures::stream::unfold(tail, |mut t| async move {
        loop {
            if *t.shutdown.borrow() {
                return None;
            }
            if let Some(r) = t.pending.pop_front() {
                if t.run.as_ref().is_some_and(|id| r.run.as_ref() != Some(id)) {
                    continue;
                }
                let ev = Event::default()
                    .id(r.seq.to_string())
                    .event(r.kind.as_str())
                    .data(serde_json::to_string(&r).unwrap_or_default());
                return Some((Ok::<Event, Infallible>(ev), t));
            }
            let audit = t.audit.clone();
            let after = t.last;
            let batch = tokio::task::spawn_blocking(move || audit.tail(after, 500))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            if let Some(r) = batch.last() {
                t.last = r.seq;
                t.pending.extend(batch);
                continue;
            }
            tokio::select! {
                m = t.rx.recv() => {
                    if let Err(tokio::sync::broadcast::error::RecvError::Closed) = m {
                        return None;
                    }
                }
                _ = t.shutdown.changed() => return None,
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

pub async fn alertmanager(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let poster = s.auth().require_webhook(&headers)?;
    let payload = WebhookPayload::parse(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limits = &s.engine.config().limits;
    let (rate, burst) = (limits.webhook_alerts_per_sec, limits.webhook_alert_burst);
    let allowed = {
        let mut b = s.posters.lock().unwrap_or_else(|e| e.into_inner());
        crate::take_allowance(&mut b, &poster, payload.alerts.len(), rate, burst, std::time::Instant::now())
    };
    if let Err(secs) = allowed {
        // 503, not 429: Alertmanager sends again only after a 5xx.
        tracing::debug!(poster = %poster, alerts = payload.alerts.len(), retry_secs = secs, "webhook poster over its rate");
        let e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "rate_limited",
            format!(
                "poster `{poster}` sent more than {rate} alerts/s (limits.webhook_alerts_per_sec, burst {burst}): \
                 nothing of this call was accepted; send it again in {secs} s"
            ),
        );
        let mut resp = e.into_response();
        if let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
        }
        return Ok(resp);
    }
    // Answered once every accepted alert is durable: a 200 is a promise.
    let r = s.engine.accept_alertmanager(payload, &poster).await?;
    if r.shed > 0 {
        // Alertmanager retries on 5xx: the shed alerts come back later.
        let mut resp = (StatusCode::SERVICE_UNAVAILABLE, Json(r)).into_response();
        resp.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
        return Ok(resp);
    }
    Ok(Json(r).into_response())
}

pub async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], include_str!("openapi.json")).into_response()
}

pub async fn healthz(State(s): State<AppState>) -> Response {
    let (seq, agents, role) =
        (s.engine.audit().head_seq(), s.engine.gauges().agents_connected, s.engine.ha_status().role);
    // A store that stopped at a durability failure accepts nothing: the
    // engine is not healthy, whatever else works.
    let stopped = s.engine.audit().stopped().map(|e| e.to_string());
    let status = if stopped.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body =
        Healthz { ok: stopped.is_none(), audit_seq: seq, agents_connected: agents, role, audit_stopped: stopped };
    (status, Json(body)).into_response()
}

/// `GET /readyz`: ready to take work — the store writes (a standby is
/// ready to serve reads and forward writes). 503 with why when not.
pub async fn readyz(State(s): State<AppState>) -> Response {
    let role = s.engine.ha_status().role;
    let stopped = s.engine.audit().stopped().map(|e| e.to_string());
    let status = if stopped.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let ok = stopped.is_none();
    (status, Json(Readyz { ok, ready: ok, role: Some(role), audit_stopped: stopped, starting: None })).into_response()
}

/// `GET /api/v1/ha`: this engine's place in its shard — leader, standby
/// or deposed, the term, and who leads.
pub async fn ha(State(s): State<AppState>, Viewer(id): Viewer) -> Response {
    match session(&s, &id).ha().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}
