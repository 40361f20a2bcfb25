//! Maintenance windows over HTTP: `GET /api/v1/maintenance` (viewer),
//! `POST /api/v1/maintenance` (admin: matchers, nodes, an end time, a
//! reason) and `POST /api/v1/maintenance/{id}/end` (admin, with a reason).
//! The engine's `maintenance.rs` checks and records them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_engine::api::parse_rfc3339_ms;
use nightshift_engine::api::{EngineApi, NewWindow, Reason, WindowReply, WindowSpec};

use crate::AppState;
use crate::api::ApiJson;
use crate::error::ApiError;
use crate::extract::{Admin, Viewer};

fn time(field: &str, s: &str) -> Result<i64, ApiError> {
    parse_rfc3339_ms(s).ok_or_else(|| {
        ApiError::bad_request(format!("{field}: expected an RFC 3339 time (2026-12-06T14:00:00Z), found {s:?}"))
    })
}

/// Windows in force or to come, each with the nodes it covers now.
pub async fn list(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(nightshift_engine::api::Session::new(s.engine.clone(), id.actor()).windows().await?).into_response())
}

/// Set a window (admin): recorded under who set it before it is in force.
pub async fn set(
    State(s): State<AppState>,
    Admin(id): Admin,
    ApiJson(body): ApiJson<NewWindow>,
) -> Result<Response, ApiError> {
    let starts_ms = body.starts_at.as_deref().map(|t| time("starts_at", t)).transpose()?;
    let start = starts_ms.unwrap_or_else(|| s.engine.clock().now_ms());
    let ends_ms = match (body.ends_at.as_deref(), body.for_secs) {
        (Some(t), None) => time("ends_at", t)?,
        (None, Some(secs)) if secs <= i64::MAX as u64 / 1000 => start.saturating_add(secs as i64 * 1000),
        (None, Some(secs)) => {
            return Err(ApiError::bad_request(format!("for_secs: expected at most 2592000 (30 days), found {secs}")));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("expected one of ends_at or for_secs, found both"));
        }
        (None, None) => {
            return Err(ApiError::bad_request(
                "expected an end (ends_at or for_secs), found none: a maintenance window always ends",
            ));
        }
    };
    let spec = WindowSpec { matchers: body.matchers, nodes: body.nodes, starts_ms, ends_ms, reason: body.reason };
    let w = s.engine.set_window(&id.actor(), spec).await?;
    Ok((StatusCode::CREATED, Json(WindowReply { window: w, ended: false })).into_response())
}

/// End a window before its time (admin), saying why.
pub async fn end(
    State(s): State<AppState>,
    Admin(id): Admin,
    Path(window): Path<String>,
    ApiJson(body): ApiJson<Reason>,
) -> Result<Response, ApiError> {
    let w = s.engine.end_window(&window, &id.actor(), &body.reason).await?;
    Ok(Json(WindowReply { window: w, ended: true }).into_response())
}
