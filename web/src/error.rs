//! API errors: a status and a JSON body `{"error": {"code", "message"}}`.
//! What the engine refuses arrives as the front door's `Refused` (its
//! status chosen there, once, for every way in); the web layer's own
//! refusals (a body that does not parse, a missing token) are made here.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_engine::api::Refused;
use nightshift_engine::engine::EngineError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError { status, code: code.to_string(), message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> ApiError {
        let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError { status, code: r.code, message: r.message }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        Refused::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(nightshift_engine::api::ApiErrorBody::new(&self.code, self.message))).into_response()
    }
}
