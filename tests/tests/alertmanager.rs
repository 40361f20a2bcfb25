//! A real Alertmanager (Debian `prometheus-alertmanager`) routes an alert —
//! posted to its API again and again, and re-notified on a short repeat
//! interval — to nightshift's webhook with a bearer token; the runbook runs
//! once. The receiver config is `examples/alertmanager.yml` with the URL,
//! token and timings filled in for loopback.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::runs::RunOutcome;
use nightshift_tests::external::{Daemon, free_port, require, wait_http_ok};
use nightshift_tests::{TestAgent, engine_setup, eventually};
use nightshift_web::auth::hash_token;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_delivers_and_the_runbook_runs_once() {
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "am1", SimConfig { gpus: 2, ..SimConfig::default() }, "").await;
    let token = "alertmanager-test-token-0123456789";
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "gpu-hot",
            "trigger: {type: alert, alertname: GpuHot}\nscope: gpu\ncooldown_secs: 0\n",
            "let r = set_power_limit(500);\nif !r.ok { fail(r.error); }\n",
        )],
        &format!("auth:\n  webhook_token_sha256: {}\n", hash_token(token)),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.connected_agents() == 1).then_some(())).await.is_some());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));

    // The example receiver config, pointed at this engine.
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/alertmanager.yml")).unwrap();
    let config = example
        .replace("http://nightshift.example:8080", &format!("http://{web_addr}"))
        .replace("REPLACE_WITH_THE_WEBHOOK_TOKEN", token)
        .replace("group_wait: 30s", "group_wait: 1s")
        .replace("group_interval: 5m", "group_interval: 1s")
        .replace("repeat_interval: 4h", "repeat_interval: 2s");
    assert!(config.contains(&web_addr.to_string()) && config.contains(token), "the example changed:\n{config}");
    std::fs::write(dir.path().join("alertmanager.yml"), &config).unwrap();
    let port = free_port();
    let daemon = Daemon::start(
        &[
            am.display().to_string(),
            format!("--config.file={}", dir.path().join("alertmanager.yml").display()),
            format!("--storage.path={}", dir.path().join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--cluster.listen-address=".into(),
        ],
        &dir.path().join("alertmanager.log"),
    );
    let am_url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{am_url}/-/ready"), 60, &daemon).await;

    // The same alert, posted five times (as Prometheus re-sends it).
    let starts = nightshift_engine::alerts::format_rfc3339_ms(
        nightshift_proto::clock::Clock::now_ms(&nightshift_proto::clock::SystemClock) - 1000,
    );
    let alert = serde_json::json!([{
        "labels": {"alertname": "GpuHot", "Hostname": "am1", "gpu": "1", "severity": "page"},
        "annotations": {"summary": "GPU 1 above 85 C"},
        "startsAt": starts,
    }]);
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let r = http.post(format!("{am_url}/api/v2/alerts")).json(&alert).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let run =
        eventually(60, || engine.runs(&Default::default()).unwrap().runs.into_iter().find(|r| r.outcome.is_some()))
            .await
            .unwrap_or_else(|| panic!("no run; alertmanager log:\n{}", daemon.log_text()));
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    assert_eq!((run.target.node.as_deref(), run.target.gpu), (Some("am1"), Some(1)));
    assert_eq!(run.requested_by, "alertmanager:alertmanager", "the poster is named by its webhook token");
    // Keep the alert firing through several repeat intervals: Alertmanager
    // notifies again; each is a duplicate, and nothing runs again.
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        let _ = http.post(format!("{am_url}/api/v2/alerts")).json(&alert).send().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let c = engine.counters();
    let (received, duplicates) =
        (c.alerts_received.load(Ordering::Relaxed), c.alerts_duplicate.load(Ordering::Relaxed));
    assert!(received >= 2 && duplicates >= 1, "repeats arrived: received {received}, duplicates {duplicates}");
    let runs = engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "one run despite {received} deliveries: {runs:?}");
    web.abort();
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}
