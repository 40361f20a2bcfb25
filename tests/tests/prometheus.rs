//! The stack GPU teams run: a real Prometheus (Debian `prometheus`) scrapes
//! a sim agent's dcgm-exporter-compatible `/metrics`; the engine takes its
//! telemetry from Prometheus only (`stream_from_agents: false`) and a
//! threshold runbook fires on an injected fault and acts over SSH. The
//! Prometheus config, alert rules and Grafana dashboard are the ones in
//! `examples/`: the rules evaluate and every dashboard query returns data.
//! And `promtool check metrics` accepts the agent's and the engine's
//! `/metrics`.

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::runs::RunOutcome;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::*;
use nightshift_tests::external::{Daemon, free_port, require, wait_http_ok};
use nightshift_tests::{TestAgent, engine_setup, eventually};

fn example(name: &str) -> String {
    let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `examples/prometheus.yml` with only the targets, the token file and the
/// intervals changed.
fn example_prometheus_config(dir: &std::path::Path, exporter: &str, engine: &str) -> String {
    use serde_yaml::Value;
    let mut v: Value = serde_yaml::from_str(&example("prometheus.yml")).unwrap();
    v["global"]["scrape_interval"] = "1s".into();
    v["global"]["evaluation_interval"] = "1s".into();
    // Nothing listens there; Prometheus only logs that it cannot send.
    v["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] =
        Value::Sequence(vec![format!("127.0.0.1:{}", free_port()).into()]);
    let jobs = v["scrape_configs"].as_sequence_mut().unwrap();
    let mut seen = Vec::new();
    for job in jobs.iter_mut() {
        let name = job["job_name"].as_str().unwrap().to_string();
        let target = match name.as_str() {
            "dcgm" => exporter,
            "nightshift" => {
                job["authorization"]["credentials_file"] = dir.join("nightshift.token").display().to_string().into();
                engine
            }
            other => panic!("examples/prometheus.yml has a job this test does not know: {other}"),
        };
        job["static_configs"][0]["targets"] = Value::Sequence(vec![target.into()]);
        seen.push(name);
    }
    assert_eq!(seen, ["dcgm", "nightshift"]);
    serde_yaml::to_string(&v).unwrap()
}

/// Run every `expr` of `examples/grafana/nightshift-dashboard.json` until
/// each returns at least one series.
async fn dashboard_queries_return_data(prom_url: &str, prom: &Daemon) {
    let dashboard: serde_json::Value = serde_json::from_str(&example("grafana/nightshift-dashboard.json")).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let http = reqwest::Client::new();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut empty = Vec::new();
        for e in &exprs {
            let r: serde_json::Value = http
                .get(format!("{prom_url}/api/v1/query"))
                .query(&[("query", e.as_str())])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(r["status"], "success", "the dashboard query {e} is not valid PromQL: {r}");
            if r["data"]["result"].as_array().is_none_or(|a| a.is_empty()) {
                empty.push(e.clone());
            }
        }
        if empty.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "dashboard queries with no data after 60 s: {empty:?}\nprometheus log:\n{}",
            prom.log_text()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_seen_through_prometheus_fires_a_runbook() {
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { profile: "rtx6000-ada".into(), gpus: 2, seed: 9, ..SimConfig::default() };
    let agent =
        TestAgent::start(dir.path(), "p1", sim, "sim_time_scale: 30\nexporter_listen_addr: 127.0.0.1:0\n").await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.expect("exporter listening");

    // The engine and its web server first: Prometheus scrapes its /metrics
    // with a viewer token, as examples/prometheus.yml says.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let token = "prometheus-scrape-token-4f1c";
    std::fs::write(dir.path().join("nightshift.token"), token).unwrap();

    let port = free_port();
    let config = example_prometheus_config(dir.path(), &exporter.to_string(), &web_addr.to_string());
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    std::fs::write(dir.path().join("prometheus-rules.yml"), example("prometheus-rules.yml")).unwrap();
    if let Some(promtool) = require("promtool", "prometheus") {
        let out = std::process::Command::new(promtool)
            .args(["check", "config"])
            .arg(dir.path().join("prometheus.yml"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check config: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
            "note(`hot: ${metric(\"gpu.temperature_c\")} C`);\nlet r = set_power_limit(150);\nif !r.ok { fail(r.error); }\nkeep_holds(600);\n",
        )],
        &format!(
            "telemetry: {{stream_from_agents: false}}\nsources:\n  prometheus: {{url: '{prom_url}', interval_secs: 1, timeout_secs: 2}}\n\
             auth: {{tokens: [{{name: prometheus, role: viewer, sha256: {}}}]}}\n",
            nightshift_web::auth::hash_token(token)
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));
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
    assert!(
        t.node_metrics.holds.iter().any(|h| h.owner == run.id && h.kept),
        "the run kept its cap: {:?}",
        t.node_metrics.holds
    );
    c.close().await;

    // Every query on the example Grafana dashboard runs on this Prometheus
    // and returns data: the dashboard and the engine's metric names agree.
    dashboard_queries_return_data(&prom_url, &prom).await;
    // The example alert rules load and evaluate.
    let rules: serde_json::Value =
        reqwest::get(format!("{prom_url}/api/v1/rules")).await.unwrap().json().await.unwrap();
    let healthy = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter(|r| r["health"] == "ok")
        .count();
    assert_eq!(healthy, 16, "all 16 example rules evaluate: {rules}");

    web.abort();
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
