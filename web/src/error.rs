//! API errors: a status and a JSON body `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use nightshift_engine::engine::EngineError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        let (status, code) = match &e {
            EngineError::UnknownRunbook { .. } | EngineError::UnknownNode(_) | EngineError::NoSuchRun(_) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            EngineError::BadTarget(_)
            | EngineError::BadParams(_)
            | EngineError::NotReadOnly { .. }
            | EngineError::MissingReason
            | EngineError::BadModeChange(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            EngineError::AgentUnreachable { .. } => (StatusCode::BAD_GATEWAY, "agent_unreachable"),
            EngineError::NotAwaitingApproval { .. } | EngineError::AlreadyFinished { .. } => {
                (StatusCode::CONFLICT, "conflict")
            }
            EngineError::SelfApproval { .. } => (StatusCode::FORBIDDEN, "self_approval"),
            EngineError::Guarded { code, .. } => (StatusCode::CONFLICT, *code),
            EngineError::AdminOnly(_) => (StatusCode::FORBIDDEN, "forbidden"),
            EngineError::IdempotencyConflict { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_conflict"),
            EngineError::Audit(nightshift_engine::audit::AuditError::NotLeader(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "not_leader")
            }
            EngineError::Audit(nightshift_engine::audit::AuditError::Deposed(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "deposed")
            }
            // The store stopped at a durability failure: nothing more is
            // accepted until it is fixed (retry elsewhere or later).
            EngineError::Audit(
                nightshift_engine::audit::AuditError::Write(_) | nightshift_engine::audit::AuditError::Closed,
            ) => (StatusCode::SERVICE_UNAVAILABLE, "audit_stopped"),
            EngineError::Audit(nightshift_engine::audit::AuditError::BadCursor(_)) => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            EngineError::Audit(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(nightshift_engine::api::ApiErrorBody::new(self.code, self.message))).into_response()
    }
}
