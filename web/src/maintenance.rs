//! Maintenance windows over HTTP: `GET /api/v1/maintenance` (viewer),
//! `POST /api/v1/maintenance` (admin: matchers, nodes, an end time, a
//! reason) and `POST /api/v1/maintenance/{id}/end` (admin, with a reason).
//! The engine's `maintenance.rs` checks and records them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_engine::api::{EngineApi, NewWindow, Reason};

use crate::AppState;
use crate::api::ApiJson;
use crate::error::ApiError;
use crate::extract::{Admin, Viewer};

/// Windows in force or to come, each with the nodes it covers now.
pub async fn list(State(s): State<AppState>, Viewer(id): Viewer) -> Result<Response, ApiError> {
    Ok(Json(crate::api::session(&s, &id).windows().await?).into_response())
}

/// Set a window (admin): recorded under who set it before it is in force.
pub async fn set(
    State(s): State<AppState>,
    Admin(id): Admin,
    ApiJson(body): ApiJson<NewWindow>,
) -> Result<Response, ApiError> {
    Ok((StatusCode::CREATED, Json(crate::api::session(&s, &id).set_window(body).await?)).into_response())
}

/// End a window before its time (admin), saying why.
pub async fn end(
    State(s): State<AppState>,
    Admin(id): Admin,
    Path(window): Path<String>,
    ApiJson(body): ApiJson<Reason>,
) -> Result<Response, ApiError> {
    Ok(Json(crate::api::session(&s, &id).end_window(&window, body).await?).into_response())
}
