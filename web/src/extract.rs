//! Who may call a handler, as extractors: a handler that takes
//! [`Viewer`], [`Operator`] or [`Admin`] runs only for a caller holding at
//! least that role (and, for state-changing requests sent with the UI
//! cookie, only from this site). The check lives here once instead of as a
//! prologue in every handler.
//!
//! A refusal is JSON under `/api/` and `/metrics`, and a page (or a redirect
//! to `/login`) everywhere else.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use nightshift_engine::config::Role;

use crate::AppState;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::html::PageError;

/// Why an extractor refused: rendered as JSON or as a page by path.
pub struct AuthRejection {
    err: ApiError,
    page: bool,
}

impl IntoResponse for AuthRejection {
    fn into_response(self) -> Response {
        if self.page { PageError::from(self.err).into_response() } else { self.err.into_response() }
    }
}

fn is_page(path: &str) -> bool {
    !(path.starts_with("/api/") || path == "/metrics")
}

fn caller(parts: &Parts, s: &AppState, role: Role) -> Result<Identity, AuthRejection> {
    s.auth()
        .require(&parts.headers, &parts.method, role)
        .map_err(|err| AuthRejection { err, page: is_page(parts.uri.path()) })
}

macro_rules! role_extractor {
    ($(#[$doc:meta])* $name:ident, $role:expr) => {
        $(#[$doc])*
        pub struct $name(pub Identity);

        impl FromRequestParts<AppState> for $name {
            type Rejection = AuthRejection;
            async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, Self::Rejection> {
                caller(parts, s, $role).map($name)
            }
        }
    };
}

role_extractor!(
    /// Anyone with a token (or the anonymous role, on loopback demos).
    Viewer,
    Role::Viewer
);
role_extractor!(
    /// May start, approve, reject and cancel runs.
    Operator,
    Role::Operator
);
role_extractor!(
    /// May set hands-off and reload runbooks.
    Admin,
    Role::Admin
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_answer_json_and_the_rest_pages() {
        for (path, page) in [
            ("/api/v1/runs", false),
            ("/metrics", false),
            ("/", true),
            ("/runs/r1", true),
            ("/ui/runs/r1/approve", true),
        ] {
            assert_eq!(is_page(path), page, "{path}");
        }
    }
}
