//! Standbys forward writes. With the PostgreSQL backend only the shard's
//! leader writes; a standby serves every read from its copy of the chain
//! and passes any other request — runs, approvals, the Alertmanager
//! webhook, promotions, reloads — to the leader's advertised URL, and
//! returns the leader's answer. So the CLI, the UI and Alertmanager may
//! point at any replica. A request is forwarded once at most (a standby
//! that receives a forwarded request answers 503: the engines disagree on
//! who leads, which a retry settles).
//!
//! The lease row that names the leader's URL is data: a standby forwards
//! only to a URL listed in `audit.postgres.peers`, and never a caller's
//! credential. It checks the caller itself (token, session, webhook
//! token), drops `Authorization` and `Cookie`, and sends the engines'
//! shared secret with the name it checked (`auth::PEER_SECRET`,
//! `auth::PEER_AS`); the leader gives that name its own role.

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{AppState, MAX_WEBHOOK_BYTES};

/// Marks a forwarded request (its value: the standby's holder name).
pub const FORWARDED_BY: &str = "x-nightshift-forwarded-by";

/// How long the leader may take to answer a forwarded request.
const FORWARD_TIMEOUT_SECS: u64 = 30;

/// One client for every forwarded request (its connections to the leader
/// are reused).
fn client() -> Option<&'static reqwest::Client> {
    static CLIENT: std::sync::OnceLock<Option<reqwest::Client>> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(FORWARD_TIMEOUT_SECS))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .ok()
        })
        .as_ref()
}

fn unavailable(msg: String) -> Response {
    let body = nightshift_engine::api::ApiErrorBody::new("leader_unavailable", msg);
    let mut r = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    r.headers_mut().insert("retry-after", HeaderValue::from_static("2"));
    r
}

/// Reads of what only the leader knows — the agents it is connected to:
/// drains, hands-off, holds, readings, maintenance windows. A standby
/// reads no agent, so on a standby these are the leader's answer, and its
/// own (which says it is a standby) only when the leader cannot give one.
pub fn live_read(path: &str) -> bool {
    matches!(path, "/nodes" | "/fleet" | "/api/v1/nodes" | "/api/v1/holds" | "/api/v1/maintenance")
        || ["/nodes/", "/api/v1/nodes/", "/api/v1/agents/"].iter().any(|p| path.starts_with(p))
}

/// The middleware: reads and the leader's own requests pass through; on a
/// standby, live reads go to the leader when it answers.
pub async fn forward_writes(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let reading = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if reading && req.method() == Method::GET && live_read(req.uri().path()) {
        let (path, headers) =
            (req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string(), req.headers().clone());
        return match leader_read(&s, &path, &headers).await {
            Some(answer) => answer,
            None => next.run(req).await,
        };
    }
    // Signing in and out touch no shared state.
    let local = matches!(req.uri().path(), "/login" | "/logout");
    let Some(l) = s.engine.ha_status().holder.filter(|_| !reading && !local) else { return next.run(req).await };
    let status = s.engine.ha_status();
    if status.role == "leader" {
        return next.run(req).await;
    }
    if req.headers().contains_key(FORWARDED_BY) {
        return unavailable(format!(
            "this engine ({l}) is not the leader either: the engines are changing leaders, retry in a few seconds"
        ));
    }
    let Some(leader) = status.leader.filter(|r| r.expires_in_ms > 0 && !r.url.is_empty() && r.holder != l) else {
        return unavailable(format!(
            "no leader holds shard {} now (this engine, {l}, is {}): one is elected within the lease TTL, retry in a few seconds",
            status.shard.unwrap_or_default(),
            status.role
        ));
    };
    // Only to a configured peer, with the engines' secret.
    let Some(secret) = s.peers.secret.clone() else {
        return unavailable(format!(
            "this engine ({l}) is a standby and cannot forward to the leader: set audit.postgres.peer_token_file (and peers) on every engine of the shard, or send writes to the leader at {}",
            leader.url
        ));
    };
    if !s.peers.urls.iter().any(|u| u == leader.url.trim_end_matches('/')) {
        tracing::error!(leader = %leader.holder, url = %leader.url, peers = ?s.peers.urls,
            "the lease row names a leader URL that is not one of audit.postgres.peers: not forwarding");
        return unavailable(format!(
            "the lease row says the leader {} is at {}, which is not one of audit.postgres.peers ({}): nothing is forwarded there — add it if it is one of this shard's engines",
            leader.holder,
            leader.url,
            s.peers.urls.join(", ")
        ));
    }
    // Who asks, checked here; the leader gives the name its own role.
    let webhook = req.uri().path() == "/api/v1/alerts/alertmanager";
    let who = if webhook {
        s.auth().require_webhook(req.headers()).map(|name| format!("webhook {name}"))
    } else {
        s.auth().require(req.headers(), req.method(), nightshift_engine::config::Role::Viewer).map(|id| id.peer_as())
    };
    let who = match who {
        Ok(w) => w,
        Err(e) => return e.into_response(),
    };
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, MAX_WEBHOOK_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let body = nightshift_engine::api::ApiErrorBody::new("too_large", e.to_string());
            return (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response();
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{path}", leader.url.trim_end_matches('/'));
    let Some(client) = client() else { return unavailable("cannot build the forwarding client".into()) };
    let mut out = client.request(parts.method.clone(), &url).body(body);
    // The proxy's sign-in headers stay here: the leader would take them
    // from this engine's address (and the name travels in PEER_AS).
    let proxy_headers: Vec<String> = s
        .auth()
        .proxy()
        .map(|p| vec![p.user_header.to_ascii_lowercase(), p.groups_header.to_ascii_lowercase()])
        .unwrap_or_default();
    for (name, value) in &parts.headers {
        if proxy_headers.iter().any(|h| h == name.as_str()) {
            continue;
        }
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding" | "authorization" | "cookie"
        ) && name.as_str() != crate::auth::PEER_SECRET
            && name.as_str() != crate::auth::PEER_AS
        {
            out = out.header(name, value);
        }
    }
    out =
        out.header(FORWARDED_BY, l.as_str()).header(crate::auth::PEER_SECRET, secret).header(crate::auth::PEER_AS, who);
    tracing::info!(method = %parts.method, path = %parts.uri.path(), leader = %leader.holder, "standby: forwarding a write to the leader");
    let answer = match out.send().await {
        Ok(a) => a,
        Err(e) => {
            return unavailable(format!("the leader {} at {} did not answer: {e}", leader.holder, leader.url));
        }
    };
    let mut resp = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !matches!(name.as_str(), "content-length" | "connection" | "transfer-encoding")
            && let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_ref()), HeaderValue::from_bytes(value.as_bytes()))
        {
            resp = resp.header(n, v);
        }
    }
    resp = resp.header("x-nightshift-leader", leader.holder.as_str());
    match answer.bytes().await {
        Ok(b) => resp.body(Body::from(b)).unwrap_or_else(|_| unavailable("the leader's answer was malformed".into())),
        Err(e) => unavailable(format!("the leader's answer broke off: {e}")),
    }
}

/// A live read on a standby, answered by the leader: none where this
/// engine leads (or runs alone), the read was forwarded already, no leader
/// or no peer secret is known, the caller is not signed in (the local page
/// sends them to sign in), or the leader does not answer with a success —
/// then the standby answers itself, saying it is one.
async fn leader_read(s: &AppState, path: &str, headers: &axum::http::HeaderMap) -> Option<Response> {
    let status = s.engine.ha_status();
    let l = status.holder.clone()?;
    if status.role == "leader" || headers.contains_key(FORWARDED_BY) {
        return None;
    }
    let leader = status.leader.filter(|r| r.expires_in_ms > 0 && !r.url.is_empty() && r.holder != l)?;
    let secret = s.peers.secret.clone()?;
    if !s.peers.urls.iter().any(|u| u == leader.url.trim_end_matches('/')) {
        return None;
    }
    let id = s.auth().require(headers, &Method::GET, nightshift_engine::config::Role::Viewer).ok()?;
    let who = id.peer_as();
    let url = format!("{}{path}", leader.url.trim_end_matches('/'));
    let mut out = client()?.get(&url);
    if let Some(accept) = headers.get("accept") {
        out = out.header("accept", accept);
    }
    out = out
        .header(FORWARDED_BY, l.as_str())
        .header(crate::auth::PEER_SECRET, secret)
        .header(crate::auth::PEER_AS, who)
        .timeout(std::time::Duration::from_secs(5));
    let answer = match out.send().await {
        Ok(a) if a.status().is_success() => a,
        Ok(a) => {
            tracing::warn!(path, leader = %leader.holder, status = %a.status(), "standby: the leader did not answer a live read: answering from this engine");
            return None;
        }
        Err(e) => {
            tracing::warn!(path, leader = %leader.holder, error = %e, "standby: the leader did not answer a live read: answering from this engine");
            return None;
        }
    };
    let mut resp = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if matches!(name.as_str(), "content-type" | "next-cursor" | "cache-control")
            && let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_ref()), HeaderValue::from_bytes(value.as_bytes()))
        {
            resp = resp.header(n, v);
        }
    }
    resp = resp.header("x-nightshift-leader", leader.holder.as_str());
    let body = answer.bytes().await.ok()?;
    resp.body(Body::from(body)).ok()
}

#[cfg(test)]
mod tests {
    use super::live_read;

    #[test]
    fn live_reads_are_what_only_the_leader_knows() {
        for p in [
            "/nodes",
            "/nodes/gpu-a1",
            "/fleet",
            "/api/v1/nodes",
            "/api/v1/nodes/gpu-a1/health",
            "/api/v1/holds",
            "/api/v1/maintenance",
            "/api/v1/agents/gpu-a1/holds",
        ] {
            assert!(live_read(p), "{p}");
        }
        for p in ["/", "/runs/r1", "/audit", "/api/v1/runs", "/api/v1/audit/verify", "/api/v1/ha", "/login", "/nodesx"]
        {
            assert!(!live_read(p), "{p}");
        }
    }
}
