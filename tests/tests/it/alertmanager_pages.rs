//! Invariant 19 against the real Alertmanager (Debian
//! `prometheus-alertmanager`) with the shipped `examples/alertmanager.yml`
//! (routes and inhibition; only the receivers' URLs and the waits are
//! changed for loopback) and the shipped notification target of
//! `examples/engine.yaml`:
//!
//! - a page's life: escalate, handle (the handling run's follow-up reaches
//!   the paged person at once, not muted by the open page), resolve (the
//!   page's own alert ends when the run that handled it ends);
//! - a page is never lost: Alertmanager stopped for 5 minutes during a
//!   double-bit ECC error — the repair notice reaches the person once it
//!   is back — then 20 Alertmanager restarts while escalations are sent: 0
//!   of them lost; `/metrics` shows nothing pending and nothing given up.

use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::{Op, Request, SimFault};
use nightshift_tests::external::{alertmanager_at, free_port, receiver, require, shipped_alertmanager_target};
use nightshift_tests::{TestAgent, engine_setup, eventually};
use serde_json::Value;

type Got = std::sync::Arc<std::sync::Mutex<Vec<Value>>>;

/// The shipped Alertmanager config pointed at `pager_url` and `chat_url`,
/// its waits shortened for a test (1 s instead of 30 s and 5 min).
fn alertmanager_config(pager_url: &str, chat_url: &str) -> String {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/alertmanager.yml")).unwrap();
    let config = example
        .replace("http://pager.example/alert", pager_url)
        .replace("http://chat.example/alert", chat_url)
        .replace("group_wait: 30s", "group_wait: 1s")
        .replace("group_interval: 5m", "group_interval: 1s");
    assert!(config.contains(pager_url) && config.contains("group_interval: 1s"), "the example changed:\n{config}");
    config
}

/// Every alert a receiver got, with the notification's status.
fn alerts(got: &Got) -> Vec<Value> {
    got.lock().unwrap().iter().flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default()).collect()
}

const STUCK: &str = "escalate(`GPU ${target.gpu} on ${target.node} could not be drained: drain it by hand`);\n";
const HANDLE: &str = "set_power_limit(500);\nnotify(`GPU ${target.gpu} on ${target.node} capped at 500 W: reset it when its job ends`);\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_followed_up_to_its_person_and_ends_when_its_fault_is_handled() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pager_url, paged) = receiver(0).await;
    let (chat_url, chatted) = receiver(0).await;
    std::fs::write(dir.path().join("alertmanager.yml"), alertmanager_config(&pager_url, &chat_url)).unwrap();
    let port = free_port();
    let daemon = alertmanager_at(&am, dir.path(), port, "alertmanager-0.log").await;
    let agent = TestAgent::start(dir.path(), "am3", SimConfig { gpus: 2, ..SimConfig::default() }, "").await;
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[
            ("stuck", "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n", STUCK),
            ("handle", "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n", HANDLE),
        ],
        &format!(
            "notifications:\n  ui_url: http://ui.example:8080/\n  webhooks:\n{}\n",
            shipped_alertmanager_target(&format!("http://127.0.0.1:{port}"))
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let submit = |runbook: &'static str| {
        let engine = engine.clone();
        async move {
            match engine
                .submit(nightshift_tests::manual_run(runbook, nightshift_engine::runs::Target::gpu("am3", 1)))
                .await
                .unwrap()
            {
                nightshift_engine::engine::Submitted::Queued { run } => run.id,
                other => panic!("{other:?}"),
            }
        }
    };
    // 1. The page.
    let stuck = submit("stuck").await;
    let page = eventually(60, || {
        alerts(&paged)
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "NightshiftEscalation" && a["status"] == "firing")
    })
    .await
    .unwrap_or_else(|| panic!("no page; alertmanager log:\n{}", daemon.log_text()));
    assert_eq!(page["labels"]["run"], stuck.as_str());
    // 2. A run handles it; its notice is the page's follow-up: it reaches
    // the paged person at once, with its own run's link, though the page
    // still fires (the shipped inhibition leaves follow-ups alone).
    let handle = submit("handle").await;
    let follow =
        eventually(60, || alerts(&paged).into_iter().find(|a| a["labels"]["alertname"] == "NightshiftNotification"))
            .await
            .unwrap_or_else(|| panic!("the follow-up never reached the person: {:?}", alerts(&paged)));
    assert_eq!(follow["labels"]["followup"], "true", "{follow}");
    assert_eq!(follow["labels"]["run"], handle.as_str());
    assert_eq!(follow["annotations"]["run_url"], format!("http://ui.example:8080/runs/{handle}").as_str());
    assert!(follow["annotations"]["summary"].as_str().unwrap().contains("reset it when its job ends"), "{follow}");
    // 3. The handling run ended: the page resolves.
    let resolved = eventually(60, || {
        alerts(&paged).into_iter().find(|a| {
            a["labels"]["alertname"] == "NightshiftEscalation"
                && a["labels"]["run"] == stuck.as_str()
                && a["status"] == "resolved"
        })
    })
    .await
    .unwrap_or_else(|| panic!("the page never resolved: {:?}\n{}", alerts(&paged), daemon.log_text()));
    assert!(
        resolved["annotations"]["resolution"].as_str().unwrap().contains(&format!("handled by run {handle}")),
        "{resolved}"
    );
    // The follow-up went to the person, not to the chat.
    assert!(!alerts(&chatted).iter().any(|a| a["labels"]["run"] == handle.as_str()), "{:?}", alerts(&chatted));
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}

/// Issue 42 point 7, pages per node: two GPUs of one node escalate (a
/// chassis fan failure heats all of them): the on-call person gets one page
/// — one Alertmanager group, the pager's one incident — that names both,
/// not a page per GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpus_of_one_node_page_once() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pager_url, paged) = receiver(0).await;
    let (chat_url, _chatted) = receiver(0).await;
    std::fs::write(dir.path().join("alertmanager.yml"), alertmanager_config(&pager_url, &chat_url)).unwrap();
    let port = free_port();
    let daemon = alertmanager_at(&am, dir.path(), port, "alertmanager-0.log").await;
    let agent = TestAgent::start(dir.path(), "am4", SimConfig { gpus: 2, ..SimConfig::default() }, "").await;
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("stuck", "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n", STUCK)],
        &format!(
            "notifications:\n  ui_url: http://ui.example:8080/\n  webhooks:\n{}\n",
            shipped_alertmanager_target(&format!("http://127.0.0.1:{port}"))
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let mut runs = Vec::new();
    for gpu in [0, 1] {
        match engine
            .submit(nightshift_tests::manual_run("stuck", nightshift_engine::runs::Target::gpu("am4", gpu)))
            .await
            .unwrap()
        {
            nightshift_engine::engine::Submitted::Queued { run } => runs.push(run.id),
            other => panic!("{other:?}"),
        }
    }
    // Both escalations reach the person, in one group.
    let both = eventually(60, || {
        let notices = paged.lock().unwrap().clone();
        notices
            .iter()
            .find(|n| {
                let firing: Vec<&Value> = n["alerts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|a| a["labels"]["alertname"] == "NightshiftEscalation" && a["status"] == "firing")
                    .collect();
                runs.iter().all(|r| firing.iter().any(|a| a["labels"]["run"] == r.as_str()))
            })
            .cloned()
    })
    .await
    .unwrap_or_else(|| panic!("no page names both GPUs: {:?}\n{}", paged.lock().unwrap(), daemon.log_text()));
    let gpus: Vec<String> = both["alerts"].as_array().unwrap().iter().map(|a| a["labels"]["gpu"].to_string()).collect();
    assert!(gpus.contains(&"\"0\"".to_string()) && gpus.contains(&"\"1\"".to_string()), "{both}");
    let keys: std::collections::BTreeSet<String> = paged
        .lock()
        .unwrap()
        .iter()
        .filter(|n| {
            n["alerts"].as_array().into_iter().flatten().any(|a| a["labels"]["alertname"] == "NightshiftEscalation")
        })
        .map(|n| n["groupKey"].to_string())
        .collect();
    assert_eq!(keys.len(), 1, "one page (one group) for the node, found {keys:?}");
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_is_lost_to_a_five_minute_outage_or_twenty_alertmanager_restarts() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(am) = require("prometheus-alertmanager", "prometheus-alertmanager") else { return };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (pager_url, paged) = receiver(0).await;
    let (chat_url, chatted) = receiver(0).await;
    std::fs::write(dir.path().join("alertmanager.yml"), alertmanager_config(&pager_url, &chat_url)).unwrap();
    let port = free_port();
    let mut daemon = Some(alertmanager_at(&am, dir.path(), port, "alertmanager-0.log").await);
    let agent = TestAgent::start(dir.path(), "am4", SimConfig { gpus: 2, seed: 4, ..SimConfig::default() }, "").await;
    let web_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web_addr = web_listener.local_addr().unwrap();
    // Every one of the 20 runs escalates the same about the same GPU:
    // `repage_after_secs: 0` makes each a page of its own to count (by
    // default the same finding pages once a day).
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("stuck", "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\nmax_concurrent: 64\n", STUCK)],
        &format!(
            "auth: {{allow_anonymous: viewer}}\nnotifications:\n  ui_url: http://ui.example:8080/\n  retry_max_secs: 20\n  repage_after_secs: 0\n  webhooks:\n{}\n",
            shipped_alertmanager_target(&format!("http://127.0.0.1:{port}"))
        ),
    );
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for f in ["ecc-dbe-drain.yaml", "ecc-dbe-drain.rhai"] {
        std::fs::copy(repo.join(f), dir.path().join("runbooks").join(f)).unwrap();
    }
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), web_listener, std::future::pending()));

    // 1. Alertmanager goes down; a GPU has a double-bit ECC error.
    drop(daemon.take());
    let down_at = Instant::now();
    let conn = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let r = conn.call(&Request::new("dbe", Op::SimFault(SimFault::EccDbe { gpu: 1, count: 1 }))).await.unwrap();
    assert!(r.ok, "{r:?}");
    assert!(
        eventually(120, || (engine.gauges().pages_pending > 0).then_some(())).await.is_some(),
        "the DBE's notice never waited for the pager"
    );
    let waiting = engine.gauges().pages();
    // Down for five minutes.
    tokio::time::sleep(Duration::from_secs(300).saturating_sub(down_at.elapsed())).await;
    assert!(engine.gauges().pages_pending >= waiting.0, "a page left the outbox while the pager was down");
    daemon = Some(alertmanager_at(&am, dir.path(), port, "alertmanager-1.log").await);
    // Back: the notice of the DBE's repair drain reaches the person.
    let notice = eventually(90, || {
        alerts(&chatted)
            .into_iter()
            .chain(alerts(&paged))
            .find(|a| a["labels"]["Hostname"] == "am4" && a["labels"]["runbook"] == "ecc-dbe-drain")
    })
    .await
    .unwrap_or_else(|| panic!("the DBE's notice was lost: pending {:?}", engine.gauges().pages()));
    assert!(notice["annotations"]["summary"].as_str().unwrap().contains("drained for"), "{notice}");

    // 2. Twenty restarts, each while pages are being sent.
    let mut runs = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..20u32 {
        let req = nightshift_tests::manual_run("stuck", nightshift_engine::runs::Target::gpu("am4", i % 2));
        match engine.submit(req).await.unwrap() {
            nightshift_engine::engine::Submitted::Queued { run } => runs.push(run.id),
            other => panic!("{other:?}"),
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(rng % 400)).await;
        drop(daemon.take());
        tokio::time::sleep(Duration::from_millis(300)).await;
        daemon = Some(alertmanager_at(&am, dir.path(), port, &format!("alertmanager-{}.log", 2 + i)).await);
    }
    let all_paged = eventually(180, || {
        let got: std::collections::BTreeSet<String> = alerts(&paged)
            .iter()
            .filter(|a| a["labels"]["alertname"] == "NightshiftEscalation")
            .filter_map(|a| a["labels"]["run"].as_str().map(str::to_string))
            .collect();
        runs.iter().all(|r| got.contains(r)).then_some(got)
    })
    .await;
    let got: Vec<String> =
        alerts(&paged).iter().filter_map(|a| a["labels"]["run"].as_str().map(str::to_string)).collect();
    let lost: Vec<&String> = runs.iter().filter(|r| !got.contains(r)).collect();
    assert!(all_paged.is_some(), "{} of 20 pages lost: {lost:?}; pending {:?}", lost.len(), engine.gauges().pages());
    assert!(eventually(120, || (engine.gauges().pages_pending == 0).then_some(())).await.is_some());
    // 3. /metrics says so.
    let metrics = reqwest::get(format!("http://{web_addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("\nnightshift_pages_pending 0\n"), "{metrics}");
    assert!(metrics.contains("\nnightshift_pages_undeliverable_total 0\n"), "{metrics}");
    eprintln!(
        "pages: the DBE's notice delivered after a 5-minute outage; 20 of 20 escalations across 20 Alertmanager restarts; {:.0} s",
        started.elapsed().as_secs_f64()
    );
    web.abort();
    engine.shutdown().await;
    drop(daemon);
    let mut agent = agent;
    agent.stop().await;
}
