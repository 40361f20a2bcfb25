//! A real Alertmanager (Debian `prometheus-alertmanager`) routes an alert —
//! posted to its API again and again, and re-notified on a short repeat
//! interval — to nightshift's webhook with a bearer token; the runbook runs
//! once. The receiver config is `examples/alertmanager.yml` with the URL,
//! token and timings filled in for loopback.

use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::runs::RunOutcome;
use nightshift_tests::external::{
    Daemon, alertmanager_at, free_port, require, shipped_alertmanager_target, start_prometheus,
};
use nightshift_tests::{TestAgent, engine_setup, eventually};
use nightshift_web::auth::hash_token;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_delivers_and_the_runbook_runs_once() {
    let _serial = nightshift_tests::serial::module(module_path!());
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
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
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
    let (daemon, am_url) = start_alertmanager(&am, dir.path(), &config).await;

    // The same alert, posted five times (as Prometheus re-sends it).
    let starts = nightshift_engine::embed::format_rfc3339_ms(
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
    let (received, duplicates) = (c.alerts_received, c.alerts_duplicate);
    assert!(received >= 2 && duplicates >= 1, "repeats arrived: received {received}, duplicates {duplicates}");
    let runs = engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "one run despite {received} deliveries: {runs:?}");
    web.abort();
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}

/// Out of the box a person is paged through the site's own Alertmanager:
/// the shipped `examples/engine.yaml` notification target (format
/// `alertmanager`) posts a runbook's escalation to a real Alertmanager's v2
/// API, and the shipped `examples/alertmanager.yml` routes it to the
/// on-call receiver at once, with the run's and the node's links — and
/// never back to nightshift's own webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_pages_a_person_through_the_real_alertmanager_with_the_runs_link() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pager_url, paged) = nightshift_tests::external::receiver(0).await;
    let (chat_url, chatted) = nightshift_tests::external::receiver(0).await;
    let token = "alertmanager-test-token-0123456789";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/alertmanager.yml")).unwrap();
    let config = example
        .replace("http://nightshift.example:8080", &format!("http://{web_addr}"))
        .replace("REPLACE_WITH_THE_WEBHOOK_TOKEN", token)
        .replace("http://pager.example/alert", &pager_url)
        .replace("http://chat.example/alert", &chat_url);
    assert!(config.contains(&pager_url) && config.contains(&chat_url), "the example changed:\n{config}");
    let (daemon, am_url) = start_alertmanager(&am, dir.path(), &config).await;

    // The shipped notification target, pointed at this Alertmanager.
    let target = shipped_alertmanager_target(&am_url);
    let agent = TestAgent::start(dir.path(), "am2", SimConfig { gpus: 2, ..SimConfig::default() }, "").await;
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "still-hot",
            "trigger: {type: manual}\nscope: gpu\n",
            "let r = set_power_limit(500);\nescalate(`GPU ${target.gpu} still at 91 C under a 500 W cap`);\n",
        )],
        &format!(
            "auth:\n  webhook_token_sha256: {}\nnotifications:\n  ui_url: http://ui.example:8080/\n  webhooks:\n{target}\n",
            hash_token(token)
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));

    let submitted = engine
        .submit(nightshift_tests::manual_run("still-hot", nightshift_engine::runs::Target::gpu("am2", 1)))
        .await
        .unwrap();
    let run = match submitted {
        nightshift_engine::engine::Submitted::Queued { run } => run.id,
        other => panic!("{other:?}"),
    };
    let page = eventually(60, || {
        paged.lock().unwrap().iter().find(|b| b["alerts"][0]["labels"]["alertname"] == "NightshiftEscalation").cloned()
    })
    .await
    .unwrap_or_else(|| panic!("no page; alertmanager log:\n{}", daemon.log_text()));
    assert_eq!(page["receiver"], "on-call", "{page}");
    let a = &page["alerts"][0];
    assert_eq!(a["status"], "firing", "{page}");
    assert_eq!(
        (a["labels"]["Hostname"].as_str(), a["labels"]["gpu"].as_str(), a["labels"]["run"].as_str()),
        (Some("am2"), Some("1"), Some(run.as_str())),
        "{page}"
    );
    assert_eq!(a["labels"]["severity"], "page");
    let run_url = format!("http://ui.example:8080/runs/{run}");
    assert_eq!(a["annotations"]["run_url"], run_url.as_str(), "{page}");
    assert_eq!(a["annotations"]["node_url"], "http://ui.example:8080/nodes/am2", "{page}");
    assert_eq!(a["generatorURL"], run_url.as_str(), "{page}");
    assert!(a["annotations"]["summary"].as_str().unwrap().contains("still at 91 C"), "{page}");
    // Delivered, and audited as such on the run.
    let delivered = eventually(20, || {
        engine
            .run_records(&run)
            .unwrap()
            .into_iter()
            .find(|r| r.kind == nightshift_engine::audit::RecordKind::NotificationDelivery && r.data["ok"] == true)
    })
    .await;
    assert!(delivered.is_some_and(|r| r.data["target"] == "alertmanager"));
    // nightshift's own page never comes back to it as an alert to act on,
    // and the chat got no copy of the page.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(engine.counters().alerts_received, 0, "an escalation reached nightshift's webhook");
    assert!(
        !chatted.lock().unwrap().iter().any(|b| b["alerts"][0]["labels"]["alertname"] == "NightshiftEscalation"),
        "the page went to chat too"
    );
    web.abort();
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}

/// A real Alertmanager with `config` on a free loopback port, ready; and its
/// URL.
async fn start_alertmanager(am: &std::path::Path, dir: &std::path::Path, config: &str) -> (Daemon, String) {
    std::fs::write(dir.join("alertmanager.yml"), config).unwrap();
    let port = free_port();
    let daemon = alertmanager_at(am, dir, port, "alertmanager.log").await;
    (daemon, format!("http://127.0.0.1:{port}"))
}

/// Copy `from` into `to` (files and one level of folders).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// The whole paging path with the shipped files: a real Prometheus scrapes
/// the agent's dcgm-compatible exporter and evaluates
/// `examples/prometheus-rules.yml`; a real Alertmanager routes with
/// `examples/alertmanager.yml` to the webhook; the engine runs the shipped
/// alert variants (`runbooks/alerts/`). A double-bit ECC error and an XID 79
/// start exactly the matching runbooks on the right GPUs — the DBE's own
/// XID 48 pages nobody twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rules_and_routes_start_the_matching_runbooks() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agent = TestAgent::start(
        d,
        "pa1",
        SimConfig { gpus: 2, ..SimConfig::default() },
        "exporter_listen_addr: 127.0.0.1:0\n",
    )
    .await;
    let exporter = agent.started.as_ref().unwrap().exporter_addr.expect("exporter listening");
    // The shipped runbooks, loaded from their alerts/ folder.
    copy_tree(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks"), &d.join("handbook"));
    let token = "alertmanager-e2e-token-9876543210";
    let mut cfg = engine_setup(
        d,
        &[&agent],
        &[],
        &format!("auth:\n  webhook_tokens: [{{name: am, sha256: {}}}]\n", hash_token(token)),
    );
    cfg.runbook_dir = d.join("handbook/alerts");
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(engine.runbook_set().errors.is_empty(), "{:?}", engine.runbook_set().errors);
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = listener.local_addr().unwrap();
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));

    // Alertmanager: the shipped route, short timings.
    let example = |name: &str| {
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name))
            .unwrap()
    };
    let am_config = example("alertmanager.yml")
        .replace("http://nightshift.example:8080", &format!("http://{web_addr}"))
        .replace("REPLACE_WITH_THE_WEBHOOK_TOKEN", token)
        .replace("group_wait: 30s", "group_wait: 1s")
        .replace("group_interval: 5m", "group_interval: 1s");
    std::fs::write(d.join("alertmanager.yml"), am_config).unwrap();
    let am_port = free_port();
    let am_daemon = alertmanager_at(&am, d, am_port, "alertmanager.log").await;

    // Prometheus: the shipped config and rules; targets and intervals
    // shortened.
    use serde_yaml::Value;
    let mut p: Value = serde_yaml::from_str(&example("prometheus.yml")).unwrap();
    p["global"]["scrape_interval"] = "1s".into();
    p["global"]["evaluation_interval"] = "1s".into();
    p["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] =
        Value::Sequence(vec![format!("127.0.0.1:{am_port}").into()]);
    let jobs = p["scrape_configs"].as_sequence_mut().unwrap();
    jobs.retain(|j| j["job_name"] == "dcgm");
    jobs[0]["static_configs"][0]["targets"] = Value::Sequence(vec![exporter.to_string().into()]);
    std::fs::write(d.join("prometheus.yml"), serde_yaml::to_string(&p).unwrap()).unwrap();
    // The rules as shipped: the two that fire here have no `for:`.
    std::fs::write(d.join("prometheus-rules.yml"), example("prometheus-rules.yml")).unwrap();
    let (prom, prom_url) =
        start_prometheus(&prometheus, &d.join("prometheus.yml"), &d.join("tsdb"), &[], &d.join("prometheus.log")).await;
    // Prometheus has scraped the GPUs before the faults.
    let q = format!("{prom_url}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP");
    let scraped = async {
        for _ in 0..300 {
            if let Ok(r) = reqwest::get(&q).await
                && let Ok(v) = r.json::<serde_json::Value>().await
                && v["data"]["result"].as_array().is_some_and(|a| a.len() == 2)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert!(scraped.await, "Prometheus never scraped the exporter:\n{}", prom.log_text());

    let c = nightshift_proto::ssh::client::AgentConnection::connect(&agent.client_config()).await.unwrap();
    use nightshift_proto::{Op, Request, SimFault};
    for (id, f) in [("dbe", SimFault::EccDbe { gpu: 0, count: 1 }), ("xid", SimFault::Xid { gpu: 1, code: 79 })] {
        let r = c.call(&Request::new(id, Op::SimFault(f))).await.unwrap();
        assert!(r.ok, "{r:?}");
    }
    let runs = eventually(60, || {
        let runs = engine.runs(&Default::default()).unwrap().runs;
        (runs.len() >= 2).then_some(runs)
    })
    .await;
    if runs.is_none() {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
        let get = |u: String| {
            let http = http.clone();
            async move {
                match http.get(u).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                }
            }
        };
        panic!(
            "the alerts did not start two runs: {:?}\nincrease: {}\nprometheus alerts: {}\nalertmanager alerts: {}\nexporter: {}\nrecords: {:?}\nalertmanager log:\n{}",
            engine.runs(&Default::default()).unwrap().runs,
            get(format!("{prom_url}/api/v1/query?query=DCGM_FI_DEV_ECC_DBE_VOL_TOTAL%5B1m%5D")).await,
            get(format!("{prom_url}/api/v1/alerts")).await,
            get(format!("http://127.0.0.1:{am_port}/api/v2/alerts")).await,
            get(format!("http://{exporter}/metrics")).await,
            engine.audit().tail(0, 50).unwrap().iter().map(|r| (r.kind, r.data.to_string())).collect::<Vec<_>>(),
            am_daemon.log_text()
        )
    }
    // Let any duplicate page arrive before counting.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let runs = engine.runs(&Default::default()).unwrap().runs;
    let mut got: Vec<(String, Option<u32>, String)> =
        runs.iter().map(|r| (r.runbook.clone(), r.target.gpu, r.requested_by.clone())).collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("ecc-dbe-drain-alert".to_string(), Some(0), "alertmanager:am".to_string()),
            ("xid-fatal-drain-alert".to_string(), Some(1), "alertmanager:am".to_string()),
        ],
        "{runs:#?}"
    );
    c.close().await;
    web.abort();
    engine.shutdown().await;
    drop(prom);
    drop(am_daemon);
}
