//! Single sign-on through an authenticating proxy (`auth.proxy`): the
//! proxy (oauth2-proxy, Pomerium, nginx or Apache in front of the site's
//! identity provider) signs people in and names them — and their groups —
//! in headers. Those headers are only believed on connections from the
//! proxy's own addresses (`auth.proxy.from`): this gate refuses, before
//! anything else sees the request, any that carries one from elsewhere (a
//! browser or script talking to the engine directly could otherwise say it
//! is anyone). `auth.rs` then maps the groups to a role.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use nightshift_engine::config::{in_cidr, parse_cidr};

use crate::AppState;
use crate::error::ApiError;

/// The middleware: with `auth.proxy`, a request carrying its user or
/// groups header from an address outside `auth.proxy.from` is refused
/// (403, naming the address); one without a known peer address (an
/// in-process call) counts as outside.
pub async fn proxy_gate(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let auth = s.auth();
    let Some(p) = auth.proxy() else { return next.run(req).await };
    let carries =
        req.headers().contains_key(p.user_header.as_str()) || req.headers().contains_key(p.groups_header.as_str());
    if !carries {
        return next.run(req).await;
    }
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let trusted =
        peer.is_some_and(|ip| p.from.iter().filter_map(|f| parse_cidr(f)).any(|(net, bits)| in_cidr(ip, net, bits)));
    if trusted {
        return next.run(req).await;
    }
    tracing::warn!(peer = ?peer, header = %p.user_header, "a sign-in header from an address that is not the proxy's: refused");
    ApiError::new(
        StatusCode::FORBIDDEN,
        "untrusted_proxy_header",
        format!(
            "{} or {} sent from {}, which is not in auth.proxy.from ({}): sign in through the proxy",
            p.user_header,
            p.groups_header,
            peer.map_or("an unknown address".to_string(), |ip| ip.to_string()),
            p.from.join(", ")
        ),
    )
    .into_response()
}
