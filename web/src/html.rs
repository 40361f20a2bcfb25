//! The pages' chrome: the layout every page shares, and errors shown as a
//! page (a 401 becomes a redirect to `/login`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};

use crate::auth::Identity;
use crate::error::ApiError;

/// An error shown as a page.
pub struct PageError(pub ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<nightshift_engine::api::Refused> for PageError {
    fn from(e: nightshift_engine::api::Refused) -> Self {
        PageError(e.into())
    }
}

impl From<nightshift_engine::engine::EngineError> for PageError {
    fn from(e: nightshift_engine::engine::EngineError) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let e = self.0;
        if e.status == StatusCode::UNAUTHORIZED {
            return Redirect::to("/login").into_response();
        }
        let body = layout(
            "Error",
            "",
            None,
            html! {
                h1 { "Error " (e.status.as_u16()) }
                p.error { (e.message) }
                p { a href="/" { "Back to the timeline" } }
            },
        );
        (e.status, body).into_response()
    }
}

/// The page around `body`: title, navigation, who is logged in.
pub fn layout(title: &str, active: &str, who: Option<&Identity>, body: Markup) -> Markup {
    let nav = [
        ("/", "Timeline"),
        ("/approvals", "Approvals"),
        ("/fleet", "Fleet"),
        ("/nodes", "Nodes"),
        ("/runbooks", "Runbooks"),
        ("/audit", "Audit"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · nightshift" }
                link rel="stylesheet" href="/static/app.css";
                script src="/static/app.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { span.moon { "☾" } " nightshift" }
                    nav {
                        @for (href, label) in nav {
                            a href=(href) class=@if active == label { "active" } { (label) }
                        }
                    }
                    div.who {
                        @match who {
                            Some(id) => {
                                span { (id.name) " · " (format!("{:?}", id.role).to_lowercase()) }
                                @if id.has_session() {
                                    form method="post" action="/logout" { button.link type="submit" { "log out" } }
                                }
                            }
                            None => { a href="/login" { "log in" } }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// Percent-encode a query value or path segment (RFC 3986 unreserved kept).
pub(crate) fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, URL_ENCODE).to_string()
}

/// Everything but RFC 3986's unreserved characters.
const URL_ENCODE: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
