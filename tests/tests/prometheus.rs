//! The stack GPU teams run: a real Prometheus (Debian `prometheus`) scrapes
//! a sim agent's dcgm-exporter-compatible `/metrics`; the engine takes its
//! telemetry from Prometheus only (`stream_from_agents: false`) and a
//! threshold runbook fires on an injected fault and acts over SSH. And
//! `promtool check metrics` accepts the agent's and the engine's `/metrics`.

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::proto::*;
use nightshift_agent::ssh::client::AgentConnection;
use nightshift_engine::runs::RunOutcome;
use nightshift_tests::external::{Daemon, free_port, require, wait_http_ok};
use nightshift_tests::{TestAgent, engine_setup, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_seen_through_prometheus_fires_a_runbook() {
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { profile: "rtx6000-ada".into(), gpus: 2, seed: 9, ..SimConfig::default() };
    let agent =
        TestAgent::start(dir.path(), "p1", sim, "sim_time_scale: 30\nexporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.expect("exporter listening");

    let port = free_port();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['{exporter}']\n"
        ),
    )
    .unwrap();
    let prom = Daemon::start(
        &[
            prometheus.display().to_string(),
            format!("--config.file={}", dir.path().join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
        &dir.path().join("prometheus.log"),
    );
    let prom_url = format!("http://127.0.0.1:{port}");
    wait_http_ok(&format!("{prom_url}/-/ready"), 60, &prom).await;

    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "cool-down",
            "trigger: {type: threshold, metric: gpu.temperature_c, above: 85, for_secs: 2, clear_below: 80}\nscope: gpu\n",
            "note(`hot: ${metric(\"gpu.temperature_c\")} C`);\nlet r = set_power_limit(150);\nif !r.ok { fail(r.error); }\n",
        )],
        &format!(
            "telemetry: {{stream_from_agents: false}}\nsources:\n  prometheus: {{url: '{prom_url}', interval_secs: 1, timeout_secs: 2}}\n"
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    // Samples arrive through Prometheus (the agent stream is off).
    let flowing = eventually(60, || {
        (engine.counters().source_samples.load(std::sync::atomic::Ordering::Relaxed) > 0
            && engine.latest("p1", Some(0), nightshift_engine::metrics::ids::TEMPERATURE).is_some())
        .then_some(())
    })
    .await;
    assert!(flowing.is_some(), "no samples from Prometheus; its log:\n{}", prom.log_text());

    // The fault: a clogged heatsink on GPU 0.
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let r = c
        .call(&Request::new("fault", Op::SimFault(SimFault::HeatsinkDegradation { gpu: 0, factor: 2.0 })))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    let run =
        eventually(120, || engine.runs(&Default::default()).unwrap().runs.into_iter().find(|r| r.outcome.is_some()))
            .await
            .unwrap_or_else(|| panic!("no run finished; prometheus log:\n{}", prom.log_text()));
    assert_eq!(run.runbook, "cool-down");
    assert_eq!((run.target.node.as_deref(), run.target.gpu), (Some("p1"), Some(0)));
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    let t: Telemetry =
        serde_json::from_value(c.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 150.0);
    c.close().await;
    engine.shutdown().await;
    drop(prom);
    let mut agent = agent;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_agent_and_engine_metrics() {
    let Some(promtool) = require("promtool", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    let agent = TestAgent::start(dir.path(), "m1", sim, "exporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.unwrap();
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("noop", "trigger: {type: manual}\nscope: node\n", "note(\"x\");\n")],
        "auth: {allow_anonymous: viewer}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.connected_agents() == 1).then_some(())).await.is_some());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let http = reqwest::Client::new();
    for (what, url) in
        [("agent exporter", format!("http://{exporter}/metrics")), ("engine", format!("http://{web_addr}/metrics"))]
    {
        let text = http.get(&url).send().await.unwrap().text().await.unwrap();
        assert!(text.contains("# TYPE"), "{what}: {text}");
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics rejects the {what}'s /metrics:\n{}{}\n--- the text:\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    web.abort();
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}
