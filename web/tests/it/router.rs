//! The router, called directly (`oneshot`, no socket): every endpoint's
//! happy path, 401 without a token, 403 for the wrong role, bad input → 400
//! naming the field, oversized → 413; the Alertmanager webhook; the SSE
//! live tail; `/metrics` against the exposition format.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::config::{AuthConfig, Role, TokenSpec};
use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use nightshift_web::auth::hash_token;
use serde_json::{Value, json};
use tower::ServiceExt;

const VIEWER: &str = "viewer-token-1";
const OPERATOR: &str = "operator-token-2";
const ADMIN: &str = "admin-token-3";
const WEBHOOK: &str = "webhook-token-4";

struct Fixture {
    sim: SimFleet,
    _dir: tempfile::TempDir,
    _rb: tempfile::TempDir,
}

fn write(dir: &std::path::Path, name: &str, manifest: &str, script: &str) {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        format!("version: 1\nname: {name}\ndescription: {name} for tests\nscript: {name}.rhai\n{manifest}"),
    )
    .unwrap();
    std::fs::write(dir.join(format!("{name}.rhai")), script).unwrap();
}

async fn fixture() -> Fixture {
    fixture_with(|_| {}).await
}

/// The fixture, its options changed by `edit` before the fleet starts.
async fn fixture_with(edit: impl FnOnce(&mut SimFleetOptions)) -> Fixture {
    let rb = tempfile::tempdir().unwrap();
    write(
        rb.path(),
        "cap",
        "trigger: {type: manual}\nscope: gpu\nparams:\n  watts: {type: float, default: 500}\n",
        "set_power_limit(params.watts);\nnote(\"capped\");\n",
    );
    write(rb.path(), "keep", "trigger: {type: manual}\nscope: gpu\n", "set_power_limit(480);\nkeep_holds(600);\n");
    write(
        rb.path(),
        "rma",
        "trigger: {type: manual}\nscope: node\nsticky_drain: true\n",
        "let r = drain_sticky(\"GPU 1 to be replaced\");\nif !r.ok { fail(r.error); }\n",
    );
    write(rb.path(), "careful", "trigger: {type: manual}\nscope: node\napproval: {always: true}\n", "note(\"ok\");\n");
    write(rb.path(), "hot", "trigger: {type: alert, alertname: GpuTempHigh}\nscope: gpu\n", "set_power_limit(450);\n");
    write(
        rb.path(),
        "tell",
        "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n",
        "notify(`GPU ${target.gpu} on ${target.node} reads ${elapsed()} s: look at it`);\n",
    );
    write(
        rb.path(),
        "fault",
        "trigger: {type: manual}\nscope: gpu\n",
        "declare_fault(\"dbe\", 48, \"double-bit ECC errors (test)\");\nlet r = rma(\"replace it (test)\");\nif !r.ok { fail(`${r}`); }\n",
    );
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb.path(), &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let nodes = ["gpu-a1", "gpu-a2"]
        .iter()
        .map(|n| SimNodeSpec {
            labels: [("pool".to_string(), "a".to_string())].into(),
            ..SimNodeSpec::new(n, "h100-sxm", 4)
        })
        .collect();
    let mut opts = SimFleetOptions::new(nodes, set, script);
    opts.auth = AuthConfig {
        tokens: vec![
            TokenSpec { name: "vera".into(), role: Role::Viewer, sha256: hash_token(VIEWER) },
            TokenSpec { name: "otto".into(), role: Role::Operator, sha256: hash_token(OPERATOR) },
            TokenSpec { name: "ada".into(), role: Role::Admin, sha256: hash_token(ADMIN) },
        ],
        webhook_token_sha256: Some(hash_token(WEBHOOK)),
        webhook_tokens: Vec::new(),
        allow_anonymous: None,
        secure_cookies: false,
        proxy: None,
    };
    opts.grafana = Some(nightshift_engine::config::GrafanaConfig {
        url: "https://grafana.example/".into(),
        dashboard_uid: "nightshift-engine".into(),
    });
    edit(&mut opts);
    let dir = scratch_dir().unwrap();
    let sim = SimFleet::start(opts, dir.path()).await.unwrap();
    Fixture { sim, _dir: dir, _rb: rb }
}

async fn call(f: &Fixture, method: &str, uri: &str, token: Option<&str>, body: Option<Value>) -> (StatusCode, Value) {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = match body {
        Some(v) => b.header(header::CONTENT_TYPE, "application/json").body(Body::from(v.to_string())).unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v)
}

/// Log in on /login with `token`: the session cookie to send (never the
/// token itself).
async fn session(f: &Fixture, token: &str) -> String {
    let req = Request::builder()
        .method("POST")
        .uri("/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={token}")))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let cookie = resp.headers()[header::SET_COOKIE].to_str().unwrap().to_string();
    assert!(!cookie.contains(token), "the cookie holds a session id, not the token: {cookie}");
    cookie.split(';').next().unwrap().to_string()
}

async fn settle(f: &Fixture) {
    for _ in 0..5 {
        f.sim.step().await.unwrap();
    }
}

/// (method, path, role needed, body)
fn endpoints(run: &str) -> Vec<(&'static str, String, Role, Option<Value>)> {
    vec![
        ("GET", "/api/v1/runs".into(), Role::Viewer, None),
        ("GET", format!("/api/v1/runs/{run}"), Role::Viewer, None),
        ("GET", "/api/v1/approvals".into(), Role::Viewer, None),
        ("GET", "/api/v1/nodes".into(), Role::Viewer, None),
        ("GET", "/api/v1/nodes/gpu-a1".into(), Role::Viewer, None),
        ("GET", "/api/v1/agents/gpu-a1/ping".into(), Role::Viewer, None),
        ("GET", "/api/v1/agents/gpu-a1/inventory".into(), Role::Viewer, None),
        ("GET", "/api/v1/agents/gpu-a1/holds".into(), Role::Viewer, None),
        ("GET", "/api/v1/nodes/gpu-a1/health".into(), Role::Viewer, None),
        ("POST", "/api/v1/agents/gpu-a1/health-check".into(), Role::Operator, None),
        ("GET", "/api/v1/runbooks".into(), Role::Viewer, None),
        ("GET", "/api/v1/runbooks/cap".into(), Role::Viewer, None),
        ("GET", "/api/v1/audit/records?after_seq=0&limit=5".into(), Role::Viewer, None),
        ("GET", "/api/v1/audit/verify".into(), Role::Viewer, None),
        ("GET", "/api/v1/audit/export".into(), Role::Viewer, None),
        ("GET", "/metrics".into(), Role::Viewer, None),
        ("GET", "/".into(), Role::Viewer, None),
        ("GET", format!("/runs/{run}"), Role::Viewer, None),
        ("GET", "/nodes".into(), Role::Viewer, None),
        ("GET", "/nodes/gpu-a1".into(), Role::Viewer, None),
        ("GET", "/runbooks".into(), Role::Viewer, None),
        ("GET", "/runbooks/cap".into(), Role::Viewer, None),
        ("GET", "/approvals".into(), Role::Viewer, None),
        ("GET", "/fleet".into(), Role::Viewer, None),
        ("GET", "/nodes?group=pool&sort=health".into(), Role::Viewer, None),
        ("GET", "/audit".into(), Role::Viewer, None),
        ("GET", "/audit?kind=run_finished&since=1h".into(), Role::Viewer, None),
        ("GET", "/audit/records/1".into(), Role::Viewer, None),
        ("GET", "/api/v1/audit/search?kind=action_result&limit=5".into(), Role::Viewer, None),
        ("GET", "/api/v1/audit/records/1".into(), Role::Viewer, None),
        (
            "POST",
            "/api/v1/runs".into(),
            Role::Operator,
            Some(json!({"runbook": "cap", "node": "gpu-a2", "gpu": 1, "dry_run": true})),
        ),
        ("POST", "/api/v1/nodes/gpu-a2/hands-off".into(), Role::Admin, Some(json!({"hands_off": false}))),
        // A person's drain of gpu-a2, then their resume ends it.
        ("POST", "/api/v1/nodes/gpu-a2/drain".into(), Role::Operator, Some(json!({"reason": "matrix"}))),
        ("POST", "/api/v1/nodes/gpu-a2/resume".into(), Role::Operator, Some(json!({"reason": "matrix"}))),
        ("POST", "/api/v1/runbooks/reload".into(), Role::Admin, None),
        ("POST", "/api/v1/reload".into(), Role::Admin, None),
        ("GET", "/api/v1/audit/head".into(), Role::Viewer, None),
        ("GET", "/api/v1/fleet/mode".into(), Role::Viewer, None),
        ("GET", "/api/v1/maintenance".into(), Role::Viewer, None),
        // A window that matches no node (the matrix's other rows act on them).
        (
            "POST",
            "/api/v1/maintenance".into(),
            Role::Admin,
            Some(json!({"matchers": {"pool": "nowhere"}, "for_secs": 600, "reason": "matrix"})),
        ),
        // Last: the fleet in shadow from here on.
        ("POST", "/api/v1/fleet/mode".into(), Role::Admin, Some(json!({"mode": "shadow", "reason": "matrix"}))),
    ]
}

fn token_for(role: Role) -> &'static str {
    match role {
        Role::Viewer => VIEWER,
        Role::Operator => OPERATOR,
        Role::Admin => ADMIN,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_by_endpoint_matrix() {
    let f = fixture().await;
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0})))
            .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    settle(&f).await;
    for (method, path, need, body) in endpoints(&run) {
        // No token: 401 (pages redirect to the login page).
        let (s, _) = call(&f, method, &path, None, body.clone()).await;
        let page = !path.starts_with("/api") && path != "/metrics";
        if page {
            assert_eq!(s, StatusCode::SEE_OTHER, "{method} {path} without a token");
        } else {
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path} without a token");
        }
        // A wrong token: 401.
        let (s, _) = call(&f, method, &path, Some("nope"), body.clone()).await;
        assert!(
            s == StatusCode::UNAUTHORIZED || (page && s == StatusCode::SEE_OTHER),
            "{method} {path} with a bad token: {s}"
        );
        for role in [Role::Viewer, Role::Operator, Role::Admin] {
            let (s, v) = call(&f, method, &path, Some(token_for(role)), body.clone()).await;
            if role >= need {
                assert!(s.is_success(), "{method} {path} as {role:?}: {s} {v}");
            } else {
                assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path} as {role:?}: {v}");
                assert_eq!(v["error"]["code"], "forbidden");
            }
        }
    }
    // The fleet's mode changed once, by the admin, with the reason.
    let (s, v) = call(&f, "GET", "/api/v1/fleet/mode", Some(VIEWER), None).await;
    assert_eq!((s, v["mode"].as_str(), v["reason"].as_str()), (StatusCode::OK, Some("shadow"), Some("matrix")), "{v}");
    let (s, v) =
        call(&f, "POST", "/api/v1/fleet/mode", Some(ADMIN), Some(json!({"mode": "shadow", "reason": "again"}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "already in shadow: {v}");
    let (s, v) = call(&f, "POST", "/api/v1/fleet/mode", Some(ADMIN), Some(json!({"mode": "off", "reason": "x"}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("act"), "says what it expected: {v}");
    // The nodes page says so, and counts drains by who set them.
    let (s, page) = call(&f, "GET", "/nodes", Some(VIEWER), None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains("fleet shadow") && page.contains(": matrix"), "{page}");
    assert!(page.contains("drained by people (not counted)"), "{page}");
    // No secret in the audit log.
    let all = f.sim.engine.audit().tail(0, usize::MAX).unwrap();
    let modes: Vec<_> = all.iter().filter(|r| r.kind == nightshift_engine::audit::RecordKind::FleetMode).collect();
    assert_eq!(modes.len(), 1);
    assert!(modes[0].actor.starts_with("user:") && modes[0].actor != "user:anonymous", "{:?}", modes[0]);
    let text = serde_json::to_string(&all).unwrap();
    for t in [VIEWER, OPERATOR, ADMIN, WEBHOOK] {
        assert!(!text.contains(t), "a token leaked into the audit log");
    }
    // Unauthenticated liveness.
    let (s, v) = call(&f, "GET", "/healthz", None, None).await;
    assert_eq!((s, v["ok"].clone()), (StatusCode::OK, json!(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_naming_the_field_and_big_bodies_a_413() {
    let mut f = fixture().await;
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("POST", "/api/v1/runs", json!({"runbok": "cap", "node": "gpu-a1"}), "unknown field `runbok`"),
        ("POST", "/api/v1/runs", json!({"node": "gpu-a1"}), "missing field `runbook`"),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": "zero"}),
            "gpu: invalid type: string \"zero\"",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 1, "params": {"watts": "lots"}}),
            "parameter `watts`: expected a finite float, found \"lots\"",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 1, "dry_run": true, "params": {"watts": "NaN"}}),
            "parameter `watts`: expected a finite float, found \"NaN\"",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 1, "params": {"watts": "-inf"}}),
            "parameter `watts`: expected a finite float, found \"-inf\"",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 1, "params": {"watts": "1e999"}}),
            "parameter `watts`: expected a finite float, found \"1e999\"",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 1, "params": {"wats": "5"}}),
            "has no parameter `wats`",
        ),
        ("POST", "/api/v1/runs", json!({"runbook": "cap", "group": "pool"}), "group: expected label=value"),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1"}),
            "acts on a gpu: expected --node N --gpu G",
        ),
        (
            "POST",
            "/api/v1/runs",
            json!({"runbook": "cap", "node": "gpu-a1", "gpu": 9}),
            "node gpu-a1 has GPUs 0..3, found --gpu 9",
        ),
        (
            "POST",
            "/api/v1/runs/r999999/reject",
            json!({"reason": ""}),
            "reason: expected why the run is rejected, found no visible character",
        ),
        // Regression (issue 27 item 11): NUL and zero-width characters
        // counted as a reason.
        (
            "POST",
            "/api/v1/runs/r999999/reject",
            json!({"reason": "\u{0}\u{200B}\u{FEFF}"}),
            "reason: expected why the run is rejected, found no visible character",
        ),
        ("POST", "/api/v1/nodes/gpu-a1/hands-off", json!({"hands_of": true}), "unknown field `hands_of`"),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"matchers": {"pool": "a"}, "reason": "fw"}),
            "expected an end (ends_at or for_secs), found none: a maintenance window always ends",
        ),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"matcher": {"pool": "a"}, "for_secs": 60, "reason": "fw"}),
            "unknown field `matcher`",
        ),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"for_secs": 60, "reason": "fw"}),
            "needs at least one node or label matcher",
        ),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"nodes": ["gpu-a1"], "ends_at": "tomorrow", "reason": "fw"}),
            "ends_at: expected an RFC 3339 time (2026-12-06T14:00:00Z), found \"tomorrow\"",
        ),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"nodes": ["gpu-a1"], "for_secs": 3_600_000, "reason": "fw"}),
            "end: expected at most 30 days after the start, found 41 days",
        ),
        (
            "POST",
            "/api/v1/maintenance",
            json!({"nodes": ["gpu-a1"], "for_secs": 60, "reason": " "}),
            "reason: expected why",
        ),
        ("POST", "/api/v1/maintenance/mw-nope/end", json!({"reason": "x"}), "no maintenance window \"mw-nope\""),
    ];
    // Regression (issue 27 item 11): a cursor this server did not give out
    // answered 500.
    for cursor in ["zz", "00", "not-hex-at-all"] {
        let (s, v) = call(&f, "GET", &format!("/api/v1/runs?cursor={cursor}"), Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "cursor {cursor}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("expected the next_cursor of an earlier page"), "{v}");
    }
    for (method, path, body, needle) in cases {
        let token = if path.contains("hands-off") || path.contains("maintenance") { ADMIN } else { OPERATOR };
        let (s, v) = call(&f, method, path, Some(token), Some(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(needle), "{path} {body}: {msg:?} lacks {needle:?}");
    }
    // Nothing of the refused requests was stored: the engine restarts
    // cleanly and its timeline reads back.
    f.sim.restart_engine().await.unwrap();
    let (s, v) = call(&f, "GET", "/api/v1/runs", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Sequence numbers at the edge of u64 are a plain empty page.
    let (s, v) =
        call(&f, "GET", "/api/v1/audit/records?after_seq=18446744073709551615&limit=5", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call(&f, "GET", "/api/v1/runs?limit=many", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"]["message"].as_str().unwrap().contains("limit: invalid digit"), "{v}");
    let (s, v) = call(&f, "GET", "/api/v1/runs?outcome=great", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"]["message"].as_str().unwrap().starts_with("outcome: expected succeeded"), "{v}");
    let (s, _) = call(&f, "GET", "/api/v1/runs/r999999", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "nope", "node": "gpu-a1"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Malformed JSON.
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/runs")
        .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{\"runbook\": "))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Oversized bodies.
    for (path, size, token) in
        [("/api/v1/runs", 70 * 1024, OPERATOR), ("/api/v1/alerts/alertmanager", 1100 * 1024, WEBHOOK)]
    {
        let big = format!("{{\"runbook\": \"{}\"}}", "x".repeat(size));
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(big))
            .unwrap();
        let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_cancel_and_cross_site_posts() {
    let f = fixture().await;
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "careful", "node": "gpu-a1"}))).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(v["status"], "pending_approval");
    let id = v["run"]["id"].as_str().unwrap().to_string();
    let (_, list) = call(&f, "GET", "/api/v1/approvals", Some(VIEWER), None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    // The approvals page shows the plan, who asked, why and when it expires
    // (times as <time> elements the page turns into the reader's zone).
    let (s, page) = call(&f, "GET", "/approvals", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK);
    let page = page.as_str().unwrap();
    for want in [
        "careful for tests",
        "user:otto",
        "Expires",
        "then it is cancelled",
        "<time datetime=\"20",
        "live: its actions change the nodes",
    ] {
        assert!(page.contains(want), "the approvals page lacks {want:?}:\n{page}");
    }
    // The run page links to Grafana with the node and time range filled in.
    let (_, run_page) = call(&f, "GET", &format!("/runs/{id}"), Some(VIEWER), None).await;
    let run_page = run_page.as_str().unwrap();
    assert!(
        run_page.contains("href=\"https://grafana.example/d/nightshift-engine/?from=")
            && run_page.contains("&amp;var-Hostname=gpu-a1"),
        "{run_page}"
    );
    let (_, node_page) = call(&f, "GET", "/nodes/gpu-a1", Some(VIEWER), None).await;
    assert!(node_page.as_str().unwrap().contains("from=now-6h&amp;to=now&amp;var-Hostname=gpu-a1"));
    // The requester may not approve their own run.
    let (s, v) = call(&f, "POST", &format!("/api/v1/runs/{id}/approve"), Some(OPERATOR), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "self_approval");
    // A viewer may not.
    let (s, _) = call(&f, "POST", &format!("/api/v1/runs/{id}/approve"), Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The admin may.
    let (s, v) = call(&f, "POST", &format!("/api/v1/runs/{id}/approve"), Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    settle(&f).await;
    let (_, v) = call(&f, "GET", &format!("/api/v1/runs/{id}"), Some(VIEWER), None).await;
    assert_eq!(v["run"]["outcome"], "succeeded");
    // Rejection and cancel.
    let (_, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "careful", "node": "gpu-a2"}))).await;
    let id2 = v["run"]["id"].as_str().unwrap().to_string();
    let (s, v) =
        call(&f, "POST", &format!("/api/v1/runs/{id2}/reject"), Some(ADMIN), Some(json!({"reason": "not now"}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "cancelled");
    // A state-changing request carried by the UI cookie from another site.
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/runs")
        .header(header::COOKIE, session(&f, OPERATOR).await)
        .header("sec-fetch-site", "cross-site")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0}).to_string()))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // The same from our own pages is fine.
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/runs")
        .header(header::COOKIE, session(&f, OPERATOR).await)
        .header("sec-fetch-site", "same-origin")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0, "dry_run": true}).to_string()))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    // The UI's reject form refuses an empty reason, as the API does (one
    // rule, in the engine).
    let (_, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "careful", "node": "gpu-a2"}))).await;
    let id3 = v["run"]["id"].as_str().unwrap().to_string();
    let req = Request::builder()
        .method("POST")
        .uri(format!("/ui/runs/{id3}/reject"))
        .header(header::COOKIE, session(&f, ADMIN).await)
        .header("sec-fetch-site", "same-origin")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from("reason=+++"))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("expected why the run is rejected"), "{body:?}");
    let (_, v) = call(&f, "GET", &format!("/api/v1/runs/{id3}"), Some(VIEWER), None).await;
    assert_eq!(v["run"]["state"], "pending_approval", "an empty rejection changes nothing");
    // Cancelled by someone other than who asked, with a reason: the audit
    // names who cancelled (the actor filter finds it), and why.
    let (s, v) = call(
        &f,
        "POST",
        &format!("/api/v1/runs/{id3}/cancel"),
        Some(ADMIN),
        Some(json!({"reason": "duplicate of another request"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let end = f.sim.engine.run_records(&id3).unwrap().into_iter().find(|r| r.kind == RecordKind::RunFinished).unwrap();
    assert_eq!(
        (end.actor.as_str(), end.data["reason"].as_str()),
        ("user:ada", Some("duplicate of another request")),
        "{end:?}"
    );
    let rejected =
        f.sim.engine.run_records(&id2).unwrap().into_iter().find(|r| r.kind == RecordKind::Rejected).unwrap();
    assert_eq!(rejected.actor, "user:ada", "the rejection is the admin's, not the requester's");
    let (s, v) = call(&f, "POST", &format!("/api/v1/runs/{id3}/cancel"), Some(ADMIN), Some(json!({"why": "x"}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "an unknown field is refused: {v}");
    // GET-only routes refuse POST and vice versa.
    let (s, _) = call(&f, "POST", "/api/v1/audit/verify", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = call(&f, "GET", &format!("/api/v1/runs/{id}/approve"), Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
}

/// An Alertmanager v4 payload as Alertmanager sends it.
fn payload(status: &str, starts_at: &str) -> String {
    json!({
        "receiver": "nightshift",
        "status": status,
        "alerts": [{
            "status": status,
            "labels": {"alertname": "GpuTempHigh", "Hostname": "gpu-a1", "gpu": "2", "instance": "gpu-a1:9400", "job": "dcgm", "severity": "critical"},
            "annotations": {"summary": "GPU 2 on gpu-a1 at 91 C"},
            "startsAt": starts_at,
            "endsAt": if status == "resolved" { "2026-11-30T03:10:00Z" } else { "0001-01-01T00:00:00Z" },
            "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP",
            "fingerprint": "5e2c9a1f0b7d3e44"
        }],
        "groupLabels": {"alertname": "GpuTempHigh"},
        "commonLabels": {"alertname": "GpuTempHigh", "severity": "critical"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": "{}:{alertname=\"GpuTempHigh\"}",
        "truncatedAlerts": 0,
        "notification_reason": "new"
    })
    .to_string()
}

async fn post_raw(f: &Fixture, path: &str, token: Option<&str>, body: String) -> StatusCode {
    let mut b = Request::builder().method("POST").uri(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    nightshift_web::router(f.sim.engine.clone()).oneshot(b.body(Body::from(body)).unwrap()).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_starts_one_run_for_ten_deliveries() {
    let f = fixture().await;
    let starts = nightshift_engine::embed::format_rfc3339_ms(nightshift_proto::clock::Clock::now_ms(&f.sim.clock));
    let started = std::time::Instant::now();
    for _ in 0..10 {
        assert_eq!(
            post_raw(&f, "/api/v1/alerts/alertmanager", Some(WEBHOOK), payload("firing", &starts)).await,
            StatusCode::OK
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "the webhook answers without waiting for runs");
    settle(&f).await;
    let (_, v) = call(&f, "GET", "/api/v1/runs", Some(VIEWER), None).await;
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{v}");
    assert_eq!(runs[0]["runbook"], "hot");
    assert_eq!(runs[0]["target"], json!({"node": "gpu-a1", "gpu": 2}));
    // Resolved is recorded too.
    assert_eq!(
        post_raw(&f, "/api/v1/alerts/alertmanager", Some(WEBHOOK), payload("resolved", &starts)).await,
        StatusCode::OK
    );
    settle(&f).await;
    let recs = f.sim.engine.audit().tail(0, usize::MAX).unwrap();
    let received: Vec<_> =
        recs.iter().filter(|r| r.kind == nightshift_engine::audit::RecordKind::EventReceived).collect();
    assert_eq!(received.len(), 2);
    assert_eq!(received[1].data["status"], "resolved");
    // Access and bad payloads.
    assert_eq!(
        post_raw(&f, "/api/v1/alerts/alertmanager", None, payload("firing", &starts)).await,
        StatusCode::UNAUTHORIZED
    );
    // A person's token cannot post alerts, whatever its role: nobody can
    // start a run through the webhook and then approve it themselves.
    for person in [VIEWER, OPERATOR, ADMIN] {
        assert_eq!(
            post_raw(&f, "/api/v1/alerts/alertmanager", Some(person), payload("firing", &starts)).await,
            StatusCode::FORBIDDEN
        );
    }
    // Only JSON, as Alertmanager sends: a cross-site `text/plain` post is
    // refused before the token is looked at.
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/alerts/alertmanager")
        .header(header::AUTHORIZATION, format!("Bearer {WEBHOOK}"))
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(payload("firing", &starts)))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // The audit names which webhook token posted each alert.
    assert_eq!(received[0].actor, "alertmanager:alertmanager", "{:?}", received[0]);
    assert_eq!(received[0].data["posted_by"], "alertmanager", "the token's name: {:?}", received[0]);
    assert_eq!(
        post_raw(&f, "/api/v1/alerts/alertmanager", Some(WEBHOOK), "{\"version\":\"3\"}".into()).await,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_exposition_format() {
    let f = fixture().await;
    call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0}))).await;
    settle(&f).await;
    // One finding told twice: said once, then kept as a note (counted).
    for _ in 0..2 {
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "tell", "node": "gpu-a1", "gpu": 1})))
            .await;
        settle(&f).await;
    }
    let (s, v) = call(&f, "GET", "/metrics", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().unwrap();
    let families = nightshift_web_test_exposition::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for want in [
        "nightshift_samples_ingested_total",
        "nightshift_triggers_fired_total",
        "nightshift_runs_total",
        "nightshift_action_duration_seconds",
        "nightshift_queue_depth",
        "nightshift_agents_connected",
        "nightshift_audit_sequence",
    ] {
        assert!(families.contains_key(want), "missing {want}");
    }
    assert!(text.contains("nightshift_runs_total{outcome=\"succeeded\"} 3"), "{text}");
    assert!(text.contains("nightshift_action_duration_seconds_count 1"), "{text}");
    assert!(text.contains("nightshift_told_total{runbook=\"tell\",kind=\"notification\"} 1"), "{text}");
    assert!(text.contains("nightshift_told_total{runbook=\"tell\",kind=\"repeat_noted\"} 1"), "{text}");
    assert!(text.contains("nightshift_agents_connected 2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_in_effect_show_in_the_api_the_node_page_and_metrics() {
    let f = fixture().await;
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "keep", "node": "gpu-a1", "gpu": 2})))
            .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let run = v["run"]["id"].as_str().or(v["id"].as_str()).unwrap().to_string();
    settle(&f).await;
    // The agent's account: baseline, what is in effect, who holds it.
    let (s, v) = call(&f, "GET", "/api/v1/agents/gpu-a1/holds", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let settings = v["settings"].as_array().unwrap();
    assert_eq!(settings.len(), 1, "{v}");
    assert_eq!(settings[0]["baseline"]["watts"], 700.0, "{v}");
    assert_eq!(settings[0]["effective"]["watts"], 480.0, "{v}");
    assert_eq!(settings[0]["holds"][0]["owner"], run.as_str(), "{v}");
    assert_eq!(settings[0]["holds"][0]["kept"], true, "{v}");
    // The node page shows it, linked to its run; the run page says it was kept.
    let (_, page) = call(&f, "GET", "/nodes/gpu-a1", Some(VIEWER), None).await;
    let page = page.as_str().unwrap();
    assert!(page.contains(&format!("href=\"/runs/{run}\"")), "{page}");
    assert!(page.contains("480 W"), "{page}");
    let (_, page) = call(&f, "GET", &format!("/runs/{run}"), Some(VIEWER), None).await;
    let page = page.as_str().unwrap();
    assert!(page.contains("kept on purpose"), "{page}");
    // The run's picture: temperature and power limit with its steps marked.
    assert!(page.contains("gpu-a1 GPU 2: temperature and power limit"), "{page}");
    assert!(page.matches("<polyline").count() >= 2, "two lines: {page}");
    assert!(page.contains(">set_power_limit<"), "the step is marked: {page}");
    assert!(page.contains("1 hold(s) placed"), "{page}");
    // Metrics count holds by kind.
    let (_, m) = call(&f, "GET", "/metrics", Some(VIEWER), None).await;
    let m = m.as_str().unwrap();
    assert!(m.contains("nightshift_holds{kind=\"power_limit\",sticky=\"false\"} 1"), "{m}");
    assert!(m.contains("nightshift_holds{kind=\"node_drain\",sticky=\"false\"} 0"), "{m}");
}

/// A strict reader of the Prometheus text format (0.0.4).
mod nightshift_web_test_exposition {
    use std::collections::HashMap;

    fn valid_name(s: &str) -> bool {
        let mut c = s.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    }

    fn value(s: &str) -> bool {
        matches!(s, "+Inf" | "-Inf" | "NaN") || s.parse::<f64>().is_ok()
    }

    /// Families by name → type. Errors name the line.
    pub fn parse(text: &str) -> Result<HashMap<String, String>, String> {
        let mut types: HashMap<String, String> = HashMap::new();
        let mut seen_samples: HashMap<String, bool> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut parts = rest.splitn(3, ' ');
                let kind = parts.next().unwrap_or("");
                let name = parts.next().ok_or(format!("line {n}: comment without a metric name"))?;
                if !valid_name(name) {
                    return Err(format!("line {n}: bad metric name {name:?}"));
                }
                match kind {
                    "HELP" => {}
                    "TYPE" => {
                        let t = parts.next().ok_or(format!("line {n}: TYPE without a type"))?;
                        if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&t) {
                            return Err(format!("line {n}: unknown type {t}"));
                        }
                        if types.insert(name.to_string(), t.to_string()).is_some() {
                            return Err(format!("line {n}: second TYPE for {name}"));
                        }
                        if seen_samples.contains_key(name) {
                            return Err(format!("line {n}: TYPE for {name} after its samples"));
                        }
                    }
                    _ => return Err(format!("line {n}: unknown comment kind {kind}")),
                }
                continue;
            }
            let (name_labels, val) = line.rsplit_once(' ').ok_or(format!("line {n}: sample without a value"))?;
            if !value(val) {
                return Err(format!("line {n}: bad value {val:?}"));
            }
            let name = match name_labels.find('{') {
                Some(b) => {
                    let labels = name_labels[b + 1..].strip_suffix('}').ok_or(format!("line {n}: unclosed labels"))?;
                    for pair in labels.split(',').filter(|p| !p.is_empty()) {
                        let (k, v) = pair.split_once('=').ok_or(format!("line {n}: bad label {pair:?}"))?;
                        if !valid_name(k) || k.contains(':') {
                            return Err(format!("line {n}: bad label name {k:?}"));
                        }
                        if !(v.len() >= 2 && v.starts_with('"') && v.ends_with('"')) {
                            return Err(format!("line {n}: label value not quoted: {v}"));
                        }
                    }
                    &name_labels[..b]
                }
                None => name_labels,
            };
            if !valid_name(name) {
                return Err(format!("line {n}: bad metric name {name:?}"));
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
                .unwrap_or(name);
            if !types.contains_key(family) {
                return Err(format!("line {n}: sample {name} has no TYPE"));
            }
            seen_samples.insert(family.to_string(), true);
        }
        Ok(types)
    }
}

/// One double-bit error, end to end, as an operator reads it the morning
/// after: the node's health in the API and on its page, the lifecycle's
/// phases in `/metrics`, and a person's `repaired` answered by the health
/// check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dbe_lifecycle_is_in_the_api_the_node_page_and_metrics() {
    use nightshift_proto::{Op, Request, SimFault};
    let rb = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for f in ["ecc-dbe-drain.yaml", "ecc-dbe-drain.rhai"] {
        std::fs::copy(repo.join(f), rb.path().join(f)).unwrap();
    }
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb.path(), &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let nodes = (1..=2)
        .map(|i| SimNodeSpec {
            labels: [("nvlink_domain".to_string(), format!("d{i}"))].into(),
            ..SimNodeSpec::new(&format!("g{i}"), "b200", 8)
        })
        .collect();
    let mut opts = SimFleetOptions::new(nodes, set, script);
    opts.auth = AuthConfig {
        tokens: vec![
            TokenSpec { name: "vera".into(), role: Role::Viewer, sha256: hash_token(VIEWER) },
            TokenSpec { name: "otto".into(), role: Role::Operator, sha256: hash_token(OPERATOR) },
        ],
        webhook_token_sha256: None,
        webhook_tokens: Vec::new(),
        allow_anonymous: None,
        secure_cookies: false,
        proxy: None,
    };
    let dir = scratch_dir().unwrap();
    let sim = SimFleet::start(opts, dir.path()).await.unwrap();
    let f = Fixture { sim, _dir: dir, _rb: rb };
    let fault = |x: SimFault| Request::new(format!("web-test-{x:?}"), Op::SimFault(x));

    f.sim.run_for(60).await.unwrap();
    let r = f.sim.agents["g1"].handle(fault(SimFault::EccDbe { gpu: 5, count: 1 })).await;
    assert!(r.ok, "{r:?}");
    f.sim.run_for(300).await.unwrap();
    let (s, h) = call(&f, "GET", "/api/v1/nodes/g1/health", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK, "{h}");
    let g5 = &h["gpus"][5];
    assert_eq!(g5["state"], "awaiting_repair", "{h}");
    assert_eq!(g5["fault"]["kind"], "dbe", "{h}");
    assert!(g5["instruction"].as_str().is_some_and(|i| i.contains("nvidia-smi -r -i 5")), "{h}");
    assert_eq!(h["gpus"][4]["state"], "healthy");
    let q = g5["lifecycle"]["phases"]["quarantined"].as_f64().unwrap();
    assert!(q <= 60.0, "quarantined {q} s after the fault");
    let page = call(&f, "GET", "/nodes/g1", Some(VIEWER), None).await.1;
    let page = page.as_str().unwrap().to_string();
    assert!(page.contains("id=\"health\"") && page.contains("awaiting_repair"), "{page}");
    // The fault chart: GPU 5's counter steps, marked with its lifecycle; the
    // GPUs whose counters never moved get none.
    let at = page.find("GPU 5: fault counters").unwrap_or_else(|| panic!("no fault chart: {page}"));
    let fault_chart = &page[at..];
    let fault_chart = &fault_chart[..fault_chart.find("</figure>").unwrap_or_else(|| panic!("{fault_chart}"))];
    assert!(fault_chart.contains("<polyline") && fault_chart.contains("double-bit ECC"), "{fault_chart}");
    assert!(fault_chart.contains("seen, quarantined"), "the lifecycle's moments are marked: {fault_chart}");
    assert!(!page.contains("GPU 4: fault counters"), "{page}");
    // The run's page charts its fault too.
    let runs = call(&f, "GET", "/api/v1/runs?node=g1", Some(VIEWER), None).await.1;
    let id = runs["runs"][0]["id"].as_str().unwrap().to_string();
    let run_page = call(&f, "GET", &format!("/runs/{id}"), Some(VIEWER), None).await.1;
    assert!(run_page.as_str().unwrap().contains("g1 GPU 5: fault counters (the dbe fault)"), "{run_page}");
    // Saying it was repaired without resetting it: the health check sends it
    // back, and says why.
    let (s, v) = call(&f, "POST", "/api/v1/nodes/g1/repaired", Some(VIEWER), Some(json!({"gpu": 5}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a viewer cannot: {v}");
    let (s, v) =
        call(&f, "POST", "/api/v1/nodes/g1/repaired", Some(OPERATOR), Some(json!({"gpu": 5, "note": "reseated"})))
            .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["verifying"], json!([5]));
    f.sim.run_for(120).await.unwrap();
    let h = call(&f, "GET", "/api/v1/nodes/g1/health", Some(VIEWER), None).await.1;
    assert_eq!(h["gpus"][5]["state"], "awaiting_repair", "{h}");
    assert!(h["gpus"][5]["check_failures"].as_array().is_some_and(|f| !f.is_empty()), "{h}");
    let (s, v) = call(&f, "POST", "/api/v1/agents/g1/health-check", Some(OPERATOR), None).await;
    assert_eq!((s, &v["check"]["ok"]), (StatusCode::OK, &json!(false)), "{v}");
    // The reset: verified, back in service.
    let r = f.sim.agents["g1"].handle(fault(SimFault::GpuReset { gpu: 5 })).await;
    assert!(r.ok, "{r:?}");
    f.sim.run_for(180).await.unwrap();
    let h = call(&f, "GET", "/api/v1/nodes/g1/health", Some(VIEWER), None).await.1;
    assert_eq!(h["gpus"][5]["state"], "healthy", "{h}");
    let past = &h["gpus"][5]["history"][0]["phases"];
    for phase in ["quarantined", "requeued", "repaired", "verified"] {
        assert!(past[phase].is_number(), "{phase} missing: {h}");
    }
    // Repaired at the reset (about 420 s after the fault), not at the
    // person's word that the health check refuted (about 300 s).
    let repaired = past["repaired"].as_f64().unwrap();
    assert!((400.0..=450.0).contains(&repaired), "repaired {repaired} s after the fault: {h}");
    let text = call(&f, "GET", "/metrics", Some(VIEWER), None).await.1.as_str().unwrap().to_string();
    nightshift_web_test_exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for phase in ["quarantined", "requeued", "repaired", "verified"] {
        let line = format!("nightshift_repair_seconds_count{{kind=\"dbe\",phase=\"{phase}\"}} 1");
        assert!(text.contains(&line), "no {line}\n{text}");
    }
    assert!(
        text.contains("nightshift_repair_seconds_bucket{kind=\"dbe\",phase=\"quarantined\",le=\"60\"} 1"),
        "{text}"
    );
    assert!(text.contains("nightshift_gpu_health{state=\"healthy\"} 16"), "{text}");
    assert!(text.contains("nightshift_gpu_health{state=\"awaiting_repair\"} 0"), "{text}");
}

/// Regression (issue 27 item 11: a click in a cross-site frame approved a
/// run): every answer — pages, API, errors — forbids framing and sniffing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_may_be_framed() {
    let f = fixture().await;
    for (uri, token) in
        [("/", Some(VIEWER)), ("/approvals", Some(VIEWER)), ("/api/v1/runs", Some(VIEWER)), ("/nope", None)]
    {
        let mut b = Request::builder().uri(uri);
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(b.body(Body::empty()).unwrap()).await.unwrap();
        let h = resp.headers();
        assert_eq!(h.get(header::X_FRAME_OPTIONS).map(|v| v.to_str().unwrap()), Some("DENY"), "{uri}");
        assert_eq!(h.get(header::X_CONTENT_TYPE_OPTIONS).map(|v| v.to_str().unwrap()), Some("nosniff"), "{uri}");
        assert!(
            h.get(header::CONTENT_SECURITY_POLICY)
                .is_some_and(|v| v.to_str().unwrap().contains("frame-ancestors 'none'")),
            "{uri}: {h:?}"
        );
        // Issue 46 point 11: the whole policy, not only framing.
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        for part in
            ["default-src 'none'", "script-src 'self'", "style-src 'self'", "form-action 'self'", "base-uri 'none'"]
        {
            assert!(csp.contains(part), "{uri}: {part} in {csp}");
        }
    }
}

/// Regression (issue 27 item 10: any viewer could start unlimited
/// full-chain verifies — 40 page loads cost 37 s of CPU): one walk at a
/// time, and its report served again while the head has not moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_are_one_at_a_time_and_served_again_while_the_head_stays() {
    let f = fixture().await;
    let walks = || f.sim.engine.counters().verify_walks;
    let before = walks();
    let calls = (0..40).map(|_| call(&f, "GET", "/api/v1/audit/verify", Some(VIEWER), None));
    for (s, v) in futures::future::join_all(calls).await {
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["ok"], true, "{v}");
    }
    assert_eq!(walks() - before, 1, "40 requests, one walk");
    // A new record moves the head: the next request walks again.
    let (s, v) = call(
        &f,
        "POST",
        "/api/v1/runs",
        Some(OPERATOR),
        Some(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0, "dry_run": true})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (_, v) = call(&f, "GET", "/api/v1/audit/verify", Some(VIEWER), None).await;
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(walks() - before, 2);
}

/// Regression (issue 27 item 10: duplicate keys in a body were accepted,
/// the last one winning): refused with the key and where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_a_key_twice_is_refused() {
    let f = fixture().await;
    let body = r#"{"runbook": "cap", "node": "gpu-a1", "gpu": 0, "dry_run": true, "dry_run": false}"#;
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/runs")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {OPERATOR}"))
        .body(Body::from(body))
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("duplicate key \"dry_run\": expected each key once in an object at line 1 column"), "{v}");
    assert_eq!(
        post_raw(&f, "/api/v1/runs", Some(OPERATOR), body.replace(", \"dry_run\": false", "")).await,
        StatusCode::ACCEPTED
    );
}

/// A person's controls (issue 30): release a kept hold and put a node
/// under a sticky RMA drain back into service, as themselves — viewers
/// refused, a reason required, the change on the agent and in the audit,
/// under the person's name; the node page offers both, and a finished run
/// cannot be cancelled (409, not 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_releases_a_hold_and_resumes_a_node_as_themselves() {
    let f = fixture().await;
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "keep", "node": "gpu-a1", "gpu": 2})))
            .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let run = v["run"]["id"].as_str().unwrap().to_string();
    settle(&f).await;
    let holds = |f: &Fixture| {
        let f = f.sim.engine.clone();
        async move {
            let r = nightshift_web::router(f)
                .oneshot(
                    Request::builder()
                        .uri("/api/v1/agents/gpu-a1/holds")
                        .header(header::AUTHORIZATION, format!("Bearer {VIEWER}"))
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let v: Value = serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
            v["settings"].as_array().cloned().unwrap_or_default()
        }
    };
    assert_eq!(holds(&f).await.len(), 1, "the kept hold");
    // The node page offers the release to an operator, not to a viewer.
    let (_, page) = call(&f, "GET", "/nodes/gpu-a1", Some(OPERATOR), None).await;
    assert!(page.as_str().unwrap().contains("/ui/nodes/gpu-a1/holds/release"), "{page}");
    let (_, page) = call(&f, "GET", "/nodes/gpu-a1", Some(VIEWER), None).await;
    assert!(!page.as_str().unwrap().contains("/holds/release"));

    let release = json!({"gpu": 2, "reason": "the cap is no longer needed"});
    let path = "/api/v1/nodes/gpu-a1/holds/release";
    let (s, v) = call(&f, "POST", path, Some(VIEWER), Some(release.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    // The API keeps the CLI's guards: a release names its scope, and only
    // an admin forces.
    let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(json!({"reason": "tidy up"}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("expected the release's scope"), "{v}");
    let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(json!({"all": true, "force": true, "reason": "x"}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(holds(&f).await.len(), 1, "nothing released by a refused call");
    // Free text is bounded and has no control characters (an escape
    // sequence would rewrite the screen of whoever reads the audit).
    for (reason, says) in [
        ("\u{1b}[2Jgone".to_string(), "expected no control character but a newline, found U+001B at character 1"),
        ("x".repeat(60_000), "expected at most 1000 characters, found 60000"),
    ] {
        let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(json!({"gpu": 2, "reason": reason}))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{v}");
    }
    let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(json!({"gpu": 2, "reason": " "}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("reason: expected why"), "{v}");
    let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(release.clone())).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["actions"][0]["ok"], true, "{v}");
    assert_eq!(v["actions"][0]["owner"], run.as_str(), "{v}");
    assert!(holds(&f).await.is_empty(), "released on the agent");
    let (s, v) = call(&f, "POST", path, Some(OPERATOR), Some(release)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "nothing left: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("gpu-a1 has no hold on GPU 2"), "{v}");
    // In the audit, as the person, with why.
    let recs = f.sim.engine.audit().tail(0, usize::MAX).unwrap();
    let intent = recs
        .iter()
        .rev()
        .find(|r| r.kind == RecordKind::ActionIntent && r.data["op"] == "release" && r.run.is_none())
        .expect("the release's intent");
    assert_eq!((intent.actor.as_str(), intent.data["owner"].as_str()), ("user:otto", Some("person:otto")));
    // The intent says why before anything leaves, not only the result.
    assert_eq!(intent.data["reason"], json!("the cap is no longer needed"), "{intent:?}");
    let result = recs
        .iter()
        .rev()
        .find(|r| r.kind == RecordKind::ActionResult && r.data["action_id"] == intent.data["action_id"])
        .unwrap();
    assert_eq!(
        (result.data["ok"].clone(), result.data["reason"].clone()),
        (json!(true), json!("the cap is no longer needed"))
    );

    // A sticky RMA drain: only a person ends it.
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "rma", "node": "gpu-a1"}))).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let rma = v["run"]["id"].as_str().unwrap().to_string();
    settle(&f).await;
    assert!(f.sim.engine.node("gpu-a1").unwrap().state.drained, "drained for RMA");
    let (_, page) = call(&f, "GET", "/nodes/gpu-a1", Some(OPERATOR), None).await;
    assert!(page.as_str().unwrap().contains("/ui/nodes/gpu-a1/resume"), "{page}");
    let (s, _) = call(&f, "POST", "/api/v1/nodes/gpu-a1/resume", Some(VIEWER), Some(json!({"reason": "x"}))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, v) = call(
        &f,
        "POST",
        "/api/v1/nodes/gpu-a1/resume",
        Some(OPERATOR),
        Some(json!({"reason": "GPU 1 replaced and tested"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    settle(&f).await;
    assert!(!f.sim.engine.node("gpu-a1").unwrap().state.drained, "back in service: {v}");
    // The morning after: the timeline says what each run did, each in its
    // own colour.
    let (_, page) = call(&f, "GET", "/", Some(VIEWER), None).await;
    let page = page.as_str().unwrap();
    assert!(page.contains(r#"<span class="did drain">drained until a person ends it</span>"#), "{page}");
    assert!(page.contains(r#"<span class="did cap">capped</span>"#), "{page}");
    // ... and what people did beside the runs: otto's resume and release.
    let people = page.split("What people did").nth(1).expect("the people's box").split("</details>").next().unwrap();
    assert!(people.contains("<td>otto</td><td>resume applied — "), "{people}");
    assert!(people.contains("<td>otto</td><td>release applied — "), "{people}");
    assert!(!people.contains("{&quot;"), "no raw JSON: {people}");
    assert!(!people.contains("<td>engine</td>"), "only people: {people}");
    // The actor filter's `people`: every signed-in person, no one else.
    let (_, v) = call(&f, "GET", "/api/v1/audit/search?actor=people&limit=1000", Some(VIEWER), None).await;
    let actors: std::collections::BTreeSet<&str> =
        v["records"].as_array().unwrap().iter().map(|r| r["actor"].as_str().unwrap()).collect();
    assert!(actors.contains("user:otto") && actors.iter().all(|a| a.starts_with("user:")), "{actors:?}");
    let (_, v) = call(&f, "GET", &format!("/api/v1/runs/{rma}"), Some(VIEWER), None).await;
    assert_eq!(v["run"]["did"], json!(["drained until a person ends it"]), "{v}");
    let recs = f.sim.engine.audit().tail(0, usize::MAX).unwrap();
    assert!(
        recs.iter().any(|r| r.kind == RecordKind::ActionIntent && r.data["op"] == "resume" && r.actor == "user:otto")
    );
    // A finished run cannot be cancelled: a conflict, saying so.
    let (s, v) = call(&f, "POST", &format!("/api/v1/runs/{rma}/cancel"), Some(OPERATOR), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("already finished"), "{v}");
    let (s, _) = call(&f, "POST", "/api/v1/runs/r999999-nope/cancel", Some(OPERATOR), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The record browser finds records by kind, node, run, actor and time,
/// newest first, a page at a time, and shows one record with its link to
/// the one before checked; a filter that does not parse says what it
/// expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_browser_filters_pages_and_links_records() {
    let f = fixture().await;
    let mut ids = Vec::new();
    for (node, gpu) in [("gpu-a1", 0), ("gpu-a2", 1), ("gpu-a1", 2)] {
        let (st, v) =
            call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "cap", "node": node, "gpu": gpu})))
                .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{v}");
        ids.push(v["run"]["id"].as_str().unwrap().to_string());
        settle(&f).await;
    }
    let search = |q: String| {
        let f = &f;
        async move {
            let (st, v) = call(f, "GET", &format!("/api/v1/audit/search?{q}"), Some(VIEWER), None).await;
            assert_eq!(st, StatusCode::OK, "{q}: {v}");
            v
        }
    };
    // By kind and node: the two runs' cap and release results on gpu-a1, newest first.
    let v = search("kind=action_result&node=gpu-a1".into()).await;
    let recs = v["records"].as_array().unwrap();
    assert_eq!(recs.len(), 4, "{v}");
    assert!(recs.iter().all(|r| r["kind"] == "action_result" && r["node"] == "gpu-a1"));
    assert!(recs[0]["seq"].as_u64() > recs[1]["seq"].as_u64(), "newest first");
    assert_eq!(recs[0]["run"], ids[2].as_str());
    // By run: that run's records only.
    let v = search(format!("run={}", ids[1])).await;
    assert!(
        v["records"].as_array().unwrap().iter().all(|r| r["run"] == ids[1].as_str())
            && v["records"].as_array().unwrap().len() >= 3
    );
    // By actor, a bare name meaning user:<name>.
    let v = search("actor=otto&kind=run_queued".into()).await;
    assert_eq!(v["records"].as_array().unwrap().len(), 3, "{v}");
    // Paging: one at a time, continuing where the last stopped.
    let first = search("kind=run_finished&limit=1".into()).await;
    let before = first["next_before_seq"].as_u64().unwrap();
    let second = search(format!("kind=run_finished&limit=1&before_seq={before}")).await;
    assert!(second["records"][0]["seq"].as_u64().unwrap() < first["records"][0]["seq"].as_u64().unwrap());
    // Time: nothing until an hour ago.
    let v = search("until=1h".into()).await;
    assert!(v["records"].as_array().unwrap().is_empty(), "{v}");
    // Refusals that say what was expected.
    for (q, want) in [
        ("kind=bogus", "kind: expected one of engine_started"),
        (
            "since=yesterday",
            "since: expected an RFC 3339 time (2026-12-01T03:00:00Z) or an age (90s, 15m, 6h, 7d), found \"yesterday\"",
        ),
        ("limit=5000", "limit: expected a whole number up to 1000, found \"5000\""),
        ("colour=red", "unknown field `colour`"),
    ] {
        let (st, v) = call(&f, "GET", &format!("/api/v1/audit/search?{q}"), Some(VIEWER), None).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{q}: {v}");
        let msg = v["error"]["message"].as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        assert!(msg.contains(want), "{q}: expected {want:?} in {v}");
    }
    // One record: its neighbours and the link to the one before, checked.
    let seq = recs[0]["seq"].as_u64().unwrap();
    let (st, v) = call(&f, "GET", &format!("/api/v1/audit/records/{seq}"), Some(VIEWER), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!((v["prev_seq"].as_u64(), v["links_to_prev"].as_bool()), (Some(seq - 1), Some(true)), "{v}");
    let (st, _) = call(&f, "GET", "/api/v1/audit/records/999999", Some(VIEWER), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // The pages.
    let (st, page) = call(&f, "GET", "/audit?kind=action_result&node=gpu-a1", Some(VIEWER), None).await;
    assert_eq!(st, StatusCode::OK);
    let page = page.as_str().unwrap().to_string();
    assert!(
        page.contains("id=\"audit-records\"") && page.contains(&format!("href=\"/audit/records/{seq}\"")),
        "{page}"
    );
    assert!(
        page.contains("cap applied") || page.contains("set_power_limit applied"),
        "a record reads in words: {page}"
    );
    // A tampered record's page says the chain breaks after it.
    f.sim
        .engine
        .audit()
        .tamper_for_tests(seq - 1, |b| {
            let s = String::from_utf8(b.clone()).unwrap().replacen("\"hash\":\"", "\"hash\":\"00", 1);
            *b = s.into_bytes();
        })
        .unwrap();
    let (_, page) = call(&f, "GET", &format!("/audit/records/{seq}"), Some(VIEWER), None).await;
    assert!(page.as_str().unwrap().contains("the chain breaks here"), "{page}");
}

/// Issue 46 point 7: a retry of `POST /api/v1/runs` after a lost 202 could
/// start a second run. With an `Idempotency-Key` the retry answers the run
/// the first try started — also after an engine restart (the key is on the
/// run's `run_queued` record) — and starts nothing; another person's
/// identical key is theirs; a malformed key is a 400 naming the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_run_submission_with_its_idempotency_key_starts_one_run() {
    let mut f = fixture().await;
    async fn post(f: &Fixture, token: &str, key: &str, gpu: u32) -> (StatusCode, Value) {
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/runs")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key)
            .body(Body::from(json!({"runbook": "cap", "node": "gpu-a1", "gpu": gpu}).to_string()))
            .unwrap();
        let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
    let queued = |f: &Fixture| {
        f.sim
            .engine
            .audit()
            .tail(0, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|r| r.kind == RecordKind::RunQueued)
            .count()
    };
    let (s, first) = post(&f, OPERATOR, "try-7f3a", 0).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{first}");
    let id = first["run"]["id"].as_str().unwrap().to_string();
    settle(&f).await;
    let (s, again) = post(&f, OPERATOR, "try-7f3a", 0).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["run"]["id"], json!(id), "the same run, not a second");
    assert_eq!(queued(&f), 1);
    // The same key from someone else is theirs (another GPU: no cooldown).
    let (s, other) = post(&f, ADMIN, "try-7f3a", 1).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{other}");
    assert_ne!(other["run"]["id"], json!(id));
    assert_eq!(queued(&f), 2);
    // Across an engine restart.
    f.sim.restart_engine().await.unwrap();
    let (s, after) = post(&f, OPERATOR, "try-7f3a", 0).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{after}");
    assert_eq!(after["run"]["id"], json!(id));
    assert_eq!(queued(&f), 2, "nothing new queued after the restart");
    // The same key for a different request is a mistake, not a retry: 422
    // naming the run the key started, and nothing queued.
    let (s, clash) = post(&f, OPERATOR, "try-7f3a", 1).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{clash}");
    let says = clash["error"]["message"].as_str().unwrap();
    assert!(says.contains(&format!("was used for run {id} (cap on gpu-a1/gpu0)")), "{clash}");
    assert_eq!(clash["error"]["code"], "idempotency_conflict");
    assert_eq!(queued(&f), 2);
    let (s, bad) = post(&f, OPERATOR, "two words", 0).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(bad.to_string().contains("Idempotency-Key: expected 1 to 255 visible ASCII characters"), "{bad}");
}

/// Issue 46 point 11: a logout that also carried an `Authorization`
/// header left the server's session valid. It ends the cookie's session
/// whatever else the request carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_ends_the_session_whatever_else_the_request_carries() {
    let f = fixture().await;
    let cookie = session(&f, OPERATOR).await;
    let get_runs = |cookie: String| {
        let req = Request::builder().uri("/api/v1/runs").header(header::COOKIE, cookie).body(Body::empty()).unwrap();
        nightshift_web::router(f.sim.engine.clone()).oneshot(req)
    };
    assert_eq!(get_runs(cookie.clone()).await.unwrap().status(), StatusCode::OK, "the session works");
    let req = Request::builder()
        .method("POST")
        .uri("/logout")
        .header(header::COOKIE, cookie.clone())
        .header(header::AUTHORIZATION, format!("Bearer {VIEWER}"))
        .header("sec-fetch-site", "same-origin")
        .body(Body::empty())
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(get_runs(cookie).await.unwrap().status(), StatusCode::UNAUTHORIZED, "the session is over");
}

/// Issue 46 point 11: a login form posted by another site's page is
/// refused (login CSRF); one token holds at most 16 sessions (the oldest
/// ends); the cookie is `Secure` where `auth.secure_cookies` says the UI
/// is reached over HTTPS, and only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_come_from_this_site_sessions_are_capped_and_cookies_secure_when_told() {
    let f = fixture().await;
    let login = |extra: Option<(&'static str, &'static str)>| {
        let mut b = Request::builder()
            .method("POST")
            .uri("/login")
            .header(header::HOST, "engine.example:8080")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some((k, v)) = extra {
            b = b.header(k, v);
        }
        nightshift_web::router(f.sim.engine.clone()).oneshot(b.body(Body::from(format!("token={VIEWER}"))).unwrap())
    };
    for header in [("origin", "https://evil.example"), ("sec-fetch-site", "cross-site")] {
        let resp = login(Some(header)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{header:?}");
        assert!(resp.headers().get(header::SET_COOKIE).is_none(), "{header:?}: no session");
    }
    for header in [Some(("origin", "http://engine.example:8080")), Some(("sec-fetch-site", "same-origin")), None] {
        assert_eq!(login(header).await.unwrap().status(), StatusCode::SEE_OTHER, "{header:?}");
    }

    let first = session(&f, VIEWER).await;
    let works = |cookie: String| {
        let req = Request::builder().uri("/api/v1/runs").header(header::COOKIE, cookie).body(Body::empty()).unwrap();
        nightshift_web::router(f.sim.engine.clone()).oneshot(req)
    };
    assert_eq!(works(first.clone()).await.unwrap().status(), StatusCode::OK);
    let mut last = String::new();
    for _ in 0..nightshift_web::auth::SESSIONS_PER_TOKEN {
        last = session(&f, VIEWER).await;
    }
    assert_eq!(works(first).await.unwrap().status(), StatusCode::UNAUTHORIZED, "the oldest session ended");
    assert_eq!(works(last).await.unwrap().status(), StatusCode::OK, "the newest works");
    let other = session(&f, OPERATOR).await;
    assert_eq!(works(other).await.unwrap().status(), StatusCode::OK, "another token's sessions are its own");

    let set_cookie = |f: &Fixture| {
        let req = Request::builder()
            .method("POST")
            .uri("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={VIEWER}")))
            .unwrap();
        let r = nightshift_web::router(f.sim.engine.clone()).oneshot(req);
        async move { r.await.unwrap().headers()[header::SET_COOKIE].to_str().unwrap().to_string() }
    };
    assert!(!set_cookie(&f).await.contains("Secure"), "plain HTTP: not Secure");
    let tls = fixture_with(|o| o.auth.secure_cookies = true).await;
    let c = set_cookie(&tls).await;
    assert!(c.contains("; Secure") && c.contains("HttpOnly") && c.contains("SameSite=Strict"), "{c}");
}

/// Issue 46 point 11: one webhook poster cannot take the engine's whole
/// intake. Past its allowance its calls are 503 with `Retry-After` (what
/// makes Alertmanager send again) and nothing of them is accepted; another
/// poster's allowance is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_poster_past_its_rate_is_told_to_come_back_and_others_are_not() {
    const SECOND: &str = "a-second-webhook-token-for-the-rate-test";
    let f = fixture_with(|o| {
        o.limits.webhook_alerts_per_sec = 0.01;
        o.limits.webhook_alert_burst = 3;
        o.auth
            .webhook_tokens
            .push(nightshift_engine::config::WebhookToken { name: "second".into(), sha256: hash_token(SECOND) });
    })
    .await;
    let app = nightshift_web::router(f.sim.engine.clone());
    let starts = nightshift_engine::embed::format_rfc3339_ms(nightshift_proto::clock::Clock::now_ms(&f.sim.clock));
    let post = |token: &'static str| {
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/alerts/alertmanager")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(payload("firing", &starts)))
            .unwrap();
        app.clone().oneshot(req)
    };
    let received = || {
        f.sim.engine.audit().tail(0, usize::MAX).unwrap().iter().filter(|r| r.kind == RecordKind::EventReceived).count()
    };
    for _ in 0..3 {
        assert_eq!(post(WEBHOOK).await.unwrap().status(), StatusCode::OK);
    }
    let before = received();
    let resp = post(WEBHOOK).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = resp.headers()[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1, "{retry}");
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("limits.webhook_alerts_per_sec"), "{body}");
    assert_eq!(received(), before, "nothing of the refused call was accepted");
    assert_eq!(post(SECOND).await.unwrap().status(), StatusCode::OK, "another poster's allowance is its own");
}

/// Issue 46 point 10: a job on gpu-a1 that writes `Hostname="gpu-a2"` into
/// its metrics steered the alert (and its runbook) onto gpu-a2. The alert's
/// `instance` (the scrape target, set by Prometheus) names gpu-a1: labels
/// that disagree are not acted on, and the drop is audited naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_label_a_job_forged_does_not_choose_the_node() {
    let f = fixture().await;
    let starts = nightshift_engine::embed::format_rfc3339_ms(nightshift_proto::clock::Clock::now_ms(&f.sim.clock));
    let forged = payload("firing", &starts).replace("\"Hostname\":\"gpu-a1\"", "\"Hostname\":\"gpu-a2\"");
    assert!(forged.contains("gpu-a2") && forged.contains("\"instance\":\"gpu-a1:9400\""), "{forged}");
    assert_eq!(post_raw(&f, "/api/v1/alerts/alertmanager", Some(WEBHOOK), forged).await, StatusCode::OK);
    settle(&f).await;
    let (_, v) = call(&f, "GET", "/api/v1/runs", Some(VIEWER), None).await;
    assert_eq!(v["runs"].as_array().unwrap().len(), 0, "no run on either node: {v}");
    let recs = f.sim.engine.audit().tail(0, usize::MAX).unwrap();
    let dropped: Vec<_> = recs.iter().filter(|r| r.kind == RecordKind::EventDropped).collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    let reason = dropped[0].data["reason"].as_str().unwrap();
    assert!(reason.contains("names host \"gpu-a2\" but was scraped from gpu-a1"), "{reason}");
    // The same alert with labels that agree runs as before.
    let honest = payload("firing", &starts).replace("5e2c9a1f0b7d3e44", "5e2c9a1f0b7d3e45");
    assert_eq!(post_raw(&f, "/api/v1/alerts/alertmanager", Some(WEBHOOK), honest).await, StatusCode::OK);
    settle(&f).await;
    let (_, v) = call(&f, "GET", "/api/v1/runs", Some(VIEWER), None).await;
    assert_eq!(v["runs"][0]["target"], json!({"node": "gpu-a1", "gpu": 2}), "{v}");
}

/// Issue 56 point 7: `/api/v1/nodes` filters (node, label, state) and pages
/// (`limit`, `Next-Cursor`), and refuses a filter it cannot read, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_api_filters_and_pages() {
    let f = fixture().await;
    let names = |v: &Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap().to_string()).collect()
    };
    let (s, v) = call(&f, "GET", "/api/v1/nodes", Some(VIEWER), None).await;
    assert_eq!((s, names(&v)), (StatusCode::OK, vec!["gpu-a1".to_string(), "gpu-a2".to_string()]));
    let (_, v) = call(&f, "GET", "/api/v1/nodes?node=gpu-a2", Some(VIEWER), None).await;
    assert_eq!(names(&v), vec!["gpu-a2"]);
    let (_, v) = call(&f, "GET", "/api/v1/nodes?label=pool%3Da", Some(VIEWER), None).await;
    assert_eq!(names(&v).len(), 2);
    let (_, v) = call(&f, "GET", "/api/v1/nodes?label=pool%3Db", Some(VIEWER), None).await;
    assert!(names(&v).is_empty());
    let hands_off = nightshift_engine::api::HandsOff { hands_off: true, reason: Some("reseat".into()), for_secs: None };
    nightshift_engine::api::EngineApi::hands_off(
        &nightshift_engine::api::Session::new(f.sim.engine.clone(), "ana", true),
        "gpu-a2",
        hands_off,
    )
    .await
    .unwrap();
    let (_, v) = call(&f, "GET", "/api/v1/nodes?state=hands_off", Some(VIEWER), None).await;
    assert_eq!(names(&v), vec!["gpu-a2"]);
    let (_, v) = call(&f, "GET", "/api/v1/nodes?state=in_service", Some(VIEWER), None).await;
    assert_eq!(names(&v), vec!["gpu-a1"]);
    // Pages: one node each, the next page's cursor in the header.
    let req = Request::builder()
        .uri("/api/v1/nodes?limit=1")
        .header(header::AUTHORIZATION, format!("Bearer {VIEWER}"))
        .body(Body::empty())
        .unwrap();
    let resp = nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.headers().get("next-cursor").and_then(|h| h.to_str().ok()), Some("gpu-a1"));
    let (_, v) = call(&f, "GET", "/api/v1/nodes?limit=1&cursor=gpu-a1", Some(VIEWER), None).await;
    assert_eq!(names(&v), vec!["gpu-a2"]);
    // The nodes page filters the same way (the counts stay the fleet's).
    let (s, page) = call(&f, "GET", "/nodes?state=hands_off", Some(VIEWER), None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains(r#"href="/nodes/gpu-a2""#) && !page.contains(r#"href="/nodes/gpu-a1""#), "{page}");
    assert!(page.contains("1 of 2 nodes"), "{page}");
    let (s, _) = call(&f, "GET", "/nodes?state=broken", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    for (q, says) in [
        (
            "state=broken",
            "state: expected one of in_service, drained, hands_off, faulted, disconnected, found \"broken\"",
        ),
        ("label=pool", "label: expected key=value"),
        ("limit=0", "limit: expected 1 to 10000, found 0"),
        ("colour=red", "colour"),
    ] {
        let (s, v) = call(&f, "GET", &format!("/api/v1/nodes?{q}"), Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
        assert!(v["error"]["message"].as_str().unwrap_or_default().contains(says), "{q}: {v}");
    }
}

/// Issue 56 point 7: `runs list --label` — `/api/v1/runs?label=key=value`
/// lists the runs on the nodes that carry the label now (the store knows no
/// labels: the engine resolves it), and refuses a label it cannot read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_api_filters_by_label() {
    let f = fixture().await;
    let (s, v) =
        call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0})))
            .await;
    assert!(s.is_success(), "{s}: {v}");
    settle(&f).await;
    let count = |v: &Value| v["runs"].as_array().map_or(0, Vec::len);
    let (s, v) = call(&f, "GET", "/api/v1/runs?label=pool%3Da", Some(VIEWER), None).await;
    assert_eq!((s, count(&v)), (StatusCode::OK, 1), "{v}");
    assert_eq!(v["runs"][0]["target"]["node"], "gpu-a1", "{v}");
    let (_, v) = call(&f, "GET", "/api/v1/runs?label=pool%3Db", Some(VIEWER), None).await;
    assert_eq!(count(&v), 0, "no node carries pool=b: {v}");
    let (_, v) = call(&f, "GET", "/api/v1/runs?label=pool%3Da&node=gpu-a2", Some(VIEWER), None).await;
    assert_eq!(count(&v), 0, "both filters hold: {v}");
    let (s, v) = call(&f, "GET", "/api/v1/runs?label=pool", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("label: expected key=value"), "{v}");
    // The runs timeline filters the same way.
    let (s, page) = call(&f, "GET", "/?label=pool%3Db", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.as_str().unwrap_or_default().contains("No runs match."), "no run listed for pool=b");
    let (_, page) = call(&f, "GET", "/?label=pool%3Da", Some(VIEWER), None).await;
    assert!(!page.as_str().unwrap_or_default().contains("No runs match."), "the run on gpu-a1 is listed");
}

/// Issue 43 point 5: the nodes page at fleet scale. 1,000 nodes × 8 GPUs in
/// four pools: the page is one table under 1 MB, grouped by pool with each
/// group's count, sorted worst health first (the two faulted nodes lead
/// their pools), a bad sort refused saying what it takes; `/fleet` counts
/// nodes and GPUs by health, GPU model and pool. (How long Chromium takes
/// to draw it: `tests/tests/it/browser.rs`, printed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_nodes_on_one_page_grouped_sorted_and_counted() {
    let pools = ["train", "infer", "eval", "dev"];
    let f = fixture_with(|o| {
        o.nodes = (0..1000)
            .map(|i| SimNodeSpec {
                labels: [
                    ("pool".to_string(), pools[i % 4].to_string()),
                    ("rack".to_string(), format!("r{:02}", i / 40)),
                ]
                .into(),
                ..SimNodeSpec::new(&format!("n{i:04}"), "h100-sxm", 8)
            })
            .collect();
    })
    .await;
    settle(&f).await;
    for (node, gpu) in [("n0517", 3), ("n0042", 0)] {
        let body = json!({"runbook": "fault", "node": node, "gpu": gpu});
        let (s, v) = call(&f, "POST", "/api/v1/runs", Some(OPERATOR), Some(body)).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    }
    for _ in 0..40 {
        settle(&f).await;
        let (_, v) = call(&f, "GET", "/api/v1/runs?runbook=fault", Some(VIEWER), None).await;
        if v["runs"].as_array().unwrap().iter().filter(|r| r["outcome"] == "needs_person").count() == 2 {
            break;
        }
    }
    let (_, v) = call(&f, "GET", "/api/v1/runs?runbook=fault", Some(VIEWER), None).await;
    // An RMA waits for a person's hands: not "succeeded" (issue 43 point 9).
    assert!(v["runs"].as_array().unwrap().iter().all(|r| r["outcome"] == "needs_person"), "{v}");
    // What each did, in words: the health change is the act here.
    assert!(v["runs"].as_array().unwrap().iter().all(|r| r["did"] == json!(["GPU to RMA"])), "{v}");
    let (s, page) = call(&f, "GET", "/nodes?group=pool&sort=health", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK);
    let page = page.as_str().unwrap().to_string();
    eprintln!("/nodes at 1,000 nodes: {} bytes", page.len());
    assert!(page.len() < 1 << 20, "expected the page under 1 MiB, found {} bytes", page.len());
    assert_eq!(page.matches("href=\"/nodes/n").count(), 1000, "every node once");
    for p in pools {
        assert!(page.contains(&format!("<strong>pool={p}</strong> · 250 node(s)")), "the {p} group's header");
    }
    // Worst first within each group: n0517 (pool infer) and n0042 (eval)
    // lead their groups.
    for (pool, node) in [("infer", "n0517"), ("eval", "n0042")] {
        let group = page.split(&format!("<strong>pool={pool}</strong>")).nth(1).unwrap();
        let first = group.split("href=\"/nodes/").nth(1).unwrap();
        assert!(first.starts_with(node), "{node} first in pool {pool}: {}", &first[..40]);
        assert!(group.split("</tr>").next().unwrap().contains("1 not healthy"), "{pool}'s header counts it");
    }
    let (s, v) = call(&f, "GET", "/nodes?sort=hottest", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v.as_str().unwrap().contains("sort: expected one of name, health, temp, drain, found &quot;hottest&quot;"),
        "{v}"
    );
    let (s, fleet) = call(&f, "GET", "/fleet", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK);
    let fleet = fleet.as_str().unwrap();
    assert!(fleet.contains("1000 nodes, 8000 GPUs"), "{}", &fleet[..fleet.len().min(2000)]);
    // 998 healthy nodes, 2 with a GPU to replace; 7,998 healthy GPUs.
    let row = |state: &str| {
        let r = fleet.split(&format!(">{state}</span>")).nth(1).unwrap().split("</tr>").next().unwrap().to_string();
        r.split("<td class=\"num\">").skip(1).map(|c| c.split('<').next().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(row("healthy"), ["998", "7998"]);
    assert_eq!(row("rma"), ["2", "2"], "the two GPUs sent for replacement");
    assert!(
        fleet.contains("href=\"/nodes?group=pool&amp;sort=health&amp;label=pool%3Dtrain\""),
        "pools link to their nodes"
    );
}

/// Issue 43 point 3: a maintenance window over HTTP — set by an admin on a
/// label, listed with the nodes it covers, shown on each covered node's
/// page and in the audit browser in words, ended early with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_window_is_set_shown_and_ended_over_http() {
    let f = fixture().await;
    let body = json!({"matchers": {"pool": "a"}, "nodes": ["gpu-a1"], "for_secs": 7200, "reason": "PDU firmware"});
    let (s, v) = call(&f, "POST", "/api/v1/maintenance", Some(OPERATOR), Some(body.clone())).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "an admin's: {v}");
    let (s, v) = call(&f, "POST", "/api/v1/maintenance", Some(ADMIN), Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["window"]["id"].as_str().unwrap().to_string();
    assert_eq!(v["window"]["covers"], json!(["gpu-a1"]), "pool=a and the name gpu-a1: {v}");
    let (_, v) = call(&f, "GET", "/api/v1/maintenance", Some(VIEWER), None).await;
    assert_eq!(v["windows"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["windows"][0]["by"], "user:ada", "under the admin token's name: {v}");
    let (_, page) = call(&f, "GET", "/nodes/gpu-a1", Some(VIEWER), None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert!(page.contains(&format!("maintenance window {id}")) && page.contains("PDU firmware"), "{page}");
    let (_, page) = call(&f, "GET", "/nodes/gpu-a2", Some(VIEWER), None).await;
    assert!(!page.as_str().unwrap_or_default().contains("maintenance window"), "gpu-a2 is not covered");
    let (_, v) = call(&f, "GET", "/api/v1/nodes/gpu-a1", Some(VIEWER), None).await;
    assert_eq!(v["node"]["state"]["maintenance"]["id"], id.as_str(), "{v}");
    let (_, page) = call(&f, "GET", "/fleet", Some(VIEWER), None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert!(
        page.contains(&format!("<code>{id}</code>")) && page.contains("PDU firmware"),
        "the fleet page lists it: {page}"
    );
    let (s, v) =
        call(&f, "POST", &format!("/api/v1/maintenance/{id}/end"), Some(ADMIN), Some(json!({"reason": "done early"})))
            .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&f, "GET", "/api/v1/maintenance", Some(VIEWER), None).await;
    assert_eq!(v["windows"], json!([]), "{v}");
    let (_, v) = call(&f, "GET", "/api/v1/nodes/gpu-a1", Some(VIEWER), None).await;
    assert!(v["node"]["state"]["maintenance"].is_null(), "{v}");
    // The audit browser says it in words.
    let (_, page) = call(&f, "GET", "/audit?kind=maintenance", Some(VIEWER), None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert!(page.contains(&format!("maintenance window {id} set on pool=a gpu-a1 until")), "{page}");
    assert!(page.contains(&format!("maintenance window {id} ended: done early")), "{page}");
}

/// Issue 43 point 11: single sign-on through an authenticating proxy, as
/// Grafana's auth proxy. The proxy's header names the person; their groups
/// give the role (the highest; `default_role` for none of them); the
/// header is believed only from the proxy's addresses; a bearer token
/// beside it wins; a cross-site POST with it is refused as a cookie's is;
/// the acts are recorded under the person's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_the_proxy_signed_in_gets_the_role_of_their_groups() {
    let f = fixture_with(|o| {
        o.auth.proxy = Some(nightshift_engine::config::ProxyAuth {
            user_header: "X-Forwarded-User".into(),
            groups_header: "X-Forwarded-Groups".into(),
            from: vec!["10.0.0.5/32".into(), "fd00::/64".into()],
            roles: [("gpu-sre".to_string(), Role::Admin), ("gpu-oncall".to_string(), Role::Operator)].into(),
            default_role: Some(Role::Viewer),
        })
    })
    .await;
    struct Ask<'a> {
        from: Option<&'a str>,
        user: &'a str,
        groups: &'a str,
        method: &'a str,
        uri: &'a str,
        body: Option<Value>,
        extra: Option<(&'a str, &'a str)>,
    }
    let ask = |a: Ask<'_>| {
        let mut b = Request::builder().method(a.method).uri(a.uri);
        if !a.user.is_empty() {
            b = b.header("X-Forwarded-User", a.user);
        }
        if !a.groups.is_empty() {
            b = b.header("X-Forwarded-Groups", a.groups);
        }
        if let Some((k, v)) = a.extra {
            b = b.header(k, v);
        }
        let mut req = match a.body {
            Some(v) => b.header(header::CONTENT_TYPE, "application/json").body(Body::from(v.to_string())).unwrap(),
            None => b.body(Body::empty()).unwrap(),
        };
        if let Some(addr) = a.from {
            let addr: std::net::SocketAddr = addr.parse().unwrap();
            req.extensions_mut().insert(axum::extract::ConnectInfo(addr));
        }
        let r = nightshift_web::router(f.sim.engine.clone()).oneshot(req);
        async move {
            let resp = r.await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let v = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            (status, v)
        }
    };
    let run = json!({"runbook": "cap", "node": "gpu-a2", "gpu": 1, "dry_run": true});
    let base = |user, groups, method, uri, body| Ask {
        from: Some("10.0.0.5:41000"),
        user,
        groups,
        method,
        uri,
        body,
        // What a browser sends on our own page (the proxy passes it on).
        extra: Some(("sec-fetch-site", "same-origin")),
    };
    // On call: an operator; the run is theirs.
    let (s, v) = ask(base("grace", "staff, gpu-oncall", "POST", "/api/v1/runs", Some(run.clone()))).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["run"]["requested_by"], "user:grace", "{v}");
    // In no listed group: the default role (viewer) — reads, no runs.
    let (s, _) = ask(base("hal", "staff", "GET", "/api/v1/runs", None)).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = ask(base("hal", "staff", "POST", "/api/v1/runs", Some(run.clone()))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap_or("").contains("this needs the operator role; hal has viewer"),
        "{v}"
    );
    // An SRE: an admin; the fleet's mode change is recorded under them.
    let body = json!({"mode": "shadow", "reason": "sso test"});
    let (s, v) = ask(base("ines", "gpu-oncall,gpu-sre", "POST", "/api/v1/fleet/mode", Some(body))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rec =
        f.sim.engine.audit().tail(0, usize::MAX).unwrap().into_iter().rev().find(|r| r.kind == RecordKind::FleetMode);
    assert_eq!(rec.map(|r| r.actor), Some("user:ines".to_string()));
    // The header from anywhere but the proxy: refused, saying so.
    for from in [Some("10.0.0.6:41000"), Some("[fd01::1]:41000"), None] {
        let (s, v) = ask(Ask { from, ..base("ines", "gpu-sre", "GET", "/api/v1/runs", None) }).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{from:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap_or("").contains("which is not in auth.proxy.from"), "{v}");
    }
    let (s, _) =
        ask(Ask { from: Some("[fd00::7]:41000"), ..base("ines", "gpu-sre", "GET", "/api/v1/runs", None) }).await;
    assert_eq!(s, StatusCode::OK, "an IPv6 proxy address inside fd00::/64");
    // A token beside the header: the token's holder (a script through the proxy).
    let (s, v) = ask(Ask {
        extra: Some(("authorization", "Bearer operator-token-2")),
        ..base(
            "ines",
            "gpu-sre",
            "POST",
            "/api/v1/runs",
            Some(json!({"runbook": "cap", "node": "gpu-a1", "gpu": 0, "dry_run": true})),
        )
    })
    .await;
    assert_eq!((s, v["run"]["requested_by"].as_str()), (StatusCode::ACCEPTED, Some("user:otto")), "{v}");
    // The proxy adds the header to whatever the browser sends: a POST
    // another site's page made is refused, as a cookie's is.
    let (s, v) = ask(Ask {
        extra: Some(("sec-fetch-site", "cross-site")),
        ..base("grace", "gpu-oncall", "POST", "/api/v1/runs", Some(run))
    })
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    // A name that is not one: refused.
    let (s, _) = ask(base("two words", "gpu-sre", "GET", "/api/v1/runs", None)).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // The pages say who is signed in.
    let (s, page) = ask(base("grace", "gpu-oncall", "GET", "/", None)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.as_str().unwrap_or("").contains("grace"), "{page}");
}

/// Issue 43 point 11: a session opened on /login outlives an engine
/// restart (kept in the data dir, by its digest only); logging out ends it
/// for good, restart or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_outlives_an_engine_restart_and_a_logout_too() {
    let mut f = fixture().await;
    let cookie = session(&f, VIEWER).await;
    let works = |f: &Fixture, cookie: String| {
        let req = Request::builder().uri("/api/v1/runs").header(header::COOKIE, cookie).body(Body::empty()).unwrap();
        let r = nightshift_web::router(f.sim.engine.clone()).oneshot(req);
        async move { r.await.unwrap().status() }
    };
    assert_eq!(works(&f, cookie.clone()).await, StatusCode::OK);
    f.sim.restart_engine().await.unwrap();
    assert_eq!(works(&f, cookie.clone()).await, StatusCode::OK, "still signed in after the restart");
    let sessions = std::fs::read_to_string(f.sim.engine.config().data_dir.join("sessions.json")).unwrap();
    let id = cookie.split('=').nth(1).unwrap().split(';').next().unwrap();
    assert!(!sessions.contains(id), "the file holds no session id: {sessions}");
    let req = Request::builder()
        .method("POST")
        .uri("/logout")
        .header(header::COOKIE, cookie.clone())
        .body(Body::empty())
        .unwrap();
    nightshift_web::router(f.sim.engine.clone()).oneshot(req).await.unwrap();
    f.sim.restart_engine().await.unwrap();
    assert_eq!(works(&f, cookie).await, StatusCode::UNAUTHORIZED, "logged out, restart or not");
}
