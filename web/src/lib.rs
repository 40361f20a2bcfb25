//! nightshift-web: the audit trail a reviewer reads the morning after, the
//! JSON API the CLI uses, the live tail (SSE), the Alertmanager webhook and
//! `/metrics` — one axum router, built by [`router`], which tests call
//! directly.
#![forbid(unsafe_code)]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod auth;
pub mod browse;
pub mod chart;
pub mod error;
pub mod extract;
pub mod forward;
pub mod html;
pub mod maintenance;
pub mod nodes;
pub mod openapi;
pub mod pages;
pub mod prom;
pub mod sessions;
pub mod sso;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use nightshift_engine::engine::Engine;

use crate::auth::Auth;
use crate::error::ApiError;
use crate::extract::Viewer;

/// Largest request body accepted, except the webhook's.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest Alertmanager payload accepted.
pub const MAX_WEBHOOK_BYTES: usize = 1024 * 1024;

/// What every handler sees.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    /// The token table built from the engine's tokens of that generation;
    /// rebuilt when a reload changed them.
    auth: Arc<std::sync::Mutex<(u64, Arc<Auth>)>>,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// HA: the secret the shard's engines share and the peers a standby
    /// may forward to (`audit.postgres.peer_token_file`, `peers`).
    pub peers: Arc<Peers>,
    /// Each webhook poster's allowance (`limits.webhook_alerts_per_sec`).
    pub posters: Arc<std::sync::Mutex<PosterBuckets>>,
    /// The UI's sign-in sessions, kept in `<data_dir>/sessions.json`.
    pub sessions: Arc<sessions::Sessions>,
}

/// Poster name → (alerts it may still send at once, when that was counted).
pub type PosterBuckets = std::collections::HashMap<String, (f64, std::time::Instant)>;

/// Take `alerts` from `poster`'s allowance (a token bucket: `rate` a
/// second, at most `burst` saved). `Err(secs)`: not now, ask again in
/// `secs`. A call larger than the burst needs a full bucket, not more.
pub fn take_allowance(
    buckets: &mut PosterBuckets,
    poster: &str,
    alerts: usize,
    rate: f64,
    burst: u64,
    now: std::time::Instant,
) -> Result<(), u64> {
    if rate.is_nan() || rate <= 0.0 || alerts == 0 {
        return Ok(());
    }
    let burst = burst.max(1) as f64;
    // A poster name is a configured token's name: the map stays small.
    let (left, at) = buckets.entry(poster.to_string()).or_insert((burst, now));
    *left = (*left + now.saturating_duration_since(*at).as_secs_f64() * rate).min(burst);
    *at = now;
    let need = (alerts as f64).min(burst);
    if *left >= need {
        *left -= need;
        Ok(())
    } else {
        Err((((need - *left) / rate).ceil() as u64).max(1))
    }
}

/// Where a standby may forward, and the secret it forwards with.
#[derive(Debug, Default)]
pub struct Peers {
    pub secret: Option<String>,
    pub urls: Vec<String>,
}

impl Peers {
    fn of(engine: &Engine) -> Peers {
        let Some(pg) = &engine.config().audit.postgres else { return Peers::default() };
        let secret = pg.peer_token().unwrap_or_else(|e| {
            tracing::error!(error = %e, "no engine secret: this engine neither forwards nor takes forwarded requests");
            None
        });
        Peers { secret, urls: pg.peers.iter().map(|u| u.trim_end_matches('/').to_string()).collect() }
    }
}

impl AppState {
    pub fn new(engine: Engine) -> AppState {
        let (generation, cfg) = engine.auth();
        let peers = Arc::new(Peers::of(&engine));
        let sessions = sessions::Sessions::shared(engine.config().data_dir.join("sessions.json"));
        AppState {
            auth: Arc::new(std::sync::Mutex::new((
                generation,
                Arc::new(Auth::new(&cfg).with_peer_secret(peers.secret.as_deref()).with_sessions(sessions.clone())),
            ))),
            shutdown: engine.shutdown_signal(),
            peers,
            posters: Default::default(),
            sessions,
            engine,
        }
    }

    /// The tokens in force now.
    pub fn auth(&self) -> Arc<Auth> {
        let mut cached = self.auth.lock().unwrap_or_else(|e| e.into_inner());
        let (generation, cfg) = self.engine.auth();
        if cached.0 != generation {
            *cached = (
                generation,
                Arc::new(
                    Auth::new(&cfg).with_peer_secret(self.peers.secret.as_deref()).with_sessions(self.sessions.clone()),
                ),
            );
        }
        cached.1.clone()
    }
}

async fn metrics(State(s): State<AppState>, _: Viewer) -> Result<Response, ApiError> {
    let text = prom::render(&s.engine)
        .map_err(|e| ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "metrics", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// The whole web app for `engine`.
pub fn router(engine: Engine) -> Router {
    let state = AppState::new(engine);
    let webhook = Router::new()
        .route("/api/v1/alerts/alertmanager", post(api::alertmanager))
        .layer(DefaultBodyLimit::max(MAX_WEBHOOK_BYTES));
    Router::new()
        // Pages.
        .route("/", get(pages::timeline))
        .route("/runs/{id}", get(pages::run_page))
        .route("/nodes", get(nodes::nodes_page))
        .route("/fleet", get(nodes::fleet_page))
        .route("/nodes/{name}", get(pages::node_page))
        .route("/runbooks", get(pages::runbooks_page))
        .route("/runbooks/{name}", get(pages::runbook_page))
        .route("/runbooks/{name}/shadow", get(pages::shadow_page))
        .route("/approvals", get(pages::approvals_page))
        .route("/audit", get(browse::page))
        .route("/audit/records/{seq}", get(browse::record_page))
        .route("/login", get(pages::login_page).post(pages::login))
        .route("/logout", post(pages::logout))
        .route("/ui/runs/{id}/approve", post(pages::ui_approve))
        .route("/ui/runs/{id}/reject", post(pages::ui_reject))
        .route("/ui/nodes/{name}/hands-off", post(pages::ui_hands_off))
        .route("/ui/nodes/{name}/holds/release", post(pages::ui_release))
        .route("/ui/nodes/{name}/resume", post(pages::ui_resume))
        .route("/ui/runs/{id}/cancel", post(pages::ui_cancel))
        .route("/static/{name}", get(pages::asset))
        // API.
        .route("/api/v1/runs", get(api::list_runs).post(api::start_run))
        .route("/api/v1/runs/plan", post(api::plan_run))
        .route("/api/v1/runs/{id}", get(api::get_run))
        .route("/api/v1/runs/{id}/approve", post(api::approve))
        .route("/api/v1/runs/{id}/reject", post(api::reject))
        .route("/api/v1/runs/{id}/cancel", post(api::cancel))
        .route("/api/v1/approvals", get(api::approvals))
        .route("/api/v1/nodes", get(api::nodes))
        .route("/api/v1/nodes/{name}", get(api::node))
        .route("/api/v1/nodes/{name}/hands-off", post(api::hands_off))
        .route("/api/v1/nodes/{name}/health", get(api::node_health))
        .route("/api/v1/nodes/{name}/evidence/{bundle}/{file}", get(api::evidence_file))
        .route("/api/v1/nodes/{name}/repaired", post(api::node_repaired))
        .route("/api/v1/nodes/{name}/holds/release", post(api::release_holds))
        .route("/api/v1/nodes/{name}/resume", post(api::resume_node))
        .route("/api/v1/nodes/{name}/drain", post(api::drain_node))
        .route("/api/v1/agents/{name}/health-check", post(api::agent_health_check))
        .route("/api/v1/agents/{name}/ping", get(api::agent_ping))
        .route("/api/v1/agents/{name}/inventory", get(api::agent_inventory))
        .route("/api/v1/agents/{name}/sim-fault", post(api::agent_sim_fault))
        .route("/api/v1/agents/{name}/holds", get(api::agent_holds))
        .route("/api/v1/runbooks", get(api::runbooks))
        .route("/api/v1/runbooks/reload", post(api::reload))
        .route("/api/v1/reload", post(api::reload))
        .route("/api/v1/runbooks/{name}", get(api::runbook))
        .route("/api/v1/runbooks/{name}/mode", post(api::runbook_mode))
        .route("/api/v1/fleet/mode", get(api::fleet_mode).post(api::set_fleet_mode))
        .route("/api/v1/maintenance", get(maintenance::list).post(maintenance::set))
        .route("/api/v1/maintenance/{id}/end", post(maintenance::end))
        .route("/api/v1/runbooks/{name}/shadow", get(api::shadow_report))
        .route("/api/v1/audit/records", get(api::records))
        .route("/api/v1/audit/search", get(browse::api_search))
        .route("/api/v1/audit/records/{seq}", get(browse::api_record))
        .route("/api/v1/audit/verify", get(api::verify))
        .route("/api/v1/audit/head", get(api::head))
        .route("/api/v1/audit/export", get(api::export))
        .route("/api/v1/events/stream", get(api::stream))
        .route("/api/v1/openapi.json", get(api::openapi))
        .route("/api/v1/ha", get(api::ha))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .merge(webhook)
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::forward_writes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), sso::proxy_gate))
        .layer(axum::middleware::from_fn(no_framing))
        .with_state(state)
}

/// The content security policy of every answer: the pages load only this
/// site's own stylesheet and script (no inline script or style, nothing
/// from elsewhere), post forms only here, and may not be framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// No page may be framed by another site (a click in a cross-site frame
/// approved a run): `X-Frame-Options: DENY` and the full [`CSP`] on every
/// answer, and no MIME sniffing.
async fn no_framing(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static(CSP));
    }
    resp
}

/// Serve the router on `listener` until `shutdown` resolves; open SSE
/// streams end when the engine shuts down.
pub async fn serve(
    engine: Engine,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Whatever address the config or a command-line override chose: an
    // anonymous role is only ever served on loopback.
    let addr = listener.local_addr()?;
    if engine.config().auth.allow_anonymous.is_some() && !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "auth.allow_anonymous is only served on a loopback address, found {addr}: remove it or listen on 127.0.0.1"
            ),
        ));
    }
    // The peer's address: `auth.proxy` believes its headers only from the
    // proxy's addresses (`sso.rs`).
    axum::serve(listener, router(engine).into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Answer on `listener` while the engine starts (opening its audit store —
/// PostgreSQL may not answer yet — and recovering), until `done`:
/// `/healthz` and `/readyz` say 503 `{"ok": false, "ready": false,
/// "starting": why}`, every other path 503 with code `starting`. So a
/// service manager and a load balancer see a live process that is not
/// ready, rather than a port that takes connections and never answers.
pub async fn serve_starting(
    listener: tokio::net::TcpListener,
    why: String,
    done: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let health = {
        let why = why.clone();
        move || async move {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(nightshift_engine::api::Readyz {
                    ok: false,
                    ready: false,
                    role: None,
                    audit_stopped: None,
                    starting: Some(why),
                }),
            )
                .into_response()
        }
    };
    let other = move || async move {
        let body = nightshift_engine::api::ApiErrorBody::new(
            "starting",
            format!("the engine is starting: {why}; retry in a few seconds"),
        );
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    };
    let app = axum::Router::new().route("/healthz", get(health.clone())).route("/readyz", get(health)).fallback(other);
    axum::serve(listener, app).with_graceful_shutdown(done).await
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Issue 46 point 11: one poster's allowance is its own, refills at
    /// its rate, and says when to come back.
    #[test]
    fn a_posters_allowance_refills_at_its_rate_and_is_its_own() {
        let mut b = PosterBuckets::new();
        let t0 = Instant::now();
        assert_eq!(take_allowance(&mut b, "am", 100, 10.0, 100, t0), Ok(()));
        assert_eq!(take_allowance(&mut b, "am", 1, 10.0, 100, t0), Err(1));
        assert_eq!(take_allowance(&mut b, "other", 100, 10.0, 100, t0), Ok(()), "another poster's own");
        assert_eq!(take_allowance(&mut b, "am", 50, 10.0, 100, t0 + Duration::from_secs(2)), Err(3));
        assert_eq!(take_allowance(&mut b, "am", 50, 10.0, 100, t0 + Duration::from_secs(5)), Ok(()));
        // Larger than the burst: a full bucket lets it through.
        assert_eq!(take_allowance(&mut b, "big", 5_000, 10.0, 100, t0), Ok(()));
        assert_eq!(take_allowance(&mut b, "off", 1_000_000, 0.0, 1, t0), Ok(()), "0: no limit");
    }
}
