//! An acknowledgement is a promise: `nightshift serve` is killed with
//! SIGKILL 0–5 ms after it answers a webhook (200, accepted) or a run
//! request (202), again and again. After every restart, each accepted alert
//! has its `event_received` and the run it leads to (or the still-active
//! run for the same GPU that held it back), and each acknowledged run
//! exists — the answer was sent only once its record was durable, and
//! recovery finishes the handling a kill cut off.
//!
//! `NIGHTSHIFT_WEBHOOK_KILLS` sets the number of kills (default 50: 25
//! webhooks, 25 runs).

use std::collections::BTreeSet;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{AuditStore, RecordKind};
use nightshift_proto::clock::SystemClock;
use nightshift_tests::{TestAgent, engine_setup};

fn spawn_engine(dir: &std::path::Path, port: u16) -> Child {
    nightshift_tests::spawn_serve(env!("CARGO_BIN_EXE_nightshift"), dir, port)
}

async fn wait_ready(http: &reqwest::Client, base: &str) {
    nightshift_tests::wait_healthy(http, base).await
}

fn alert(i: usize, node: &str) -> serde_json::Value {
    serde_json::json!({
        "version": "4", "status": "firing", "receiver": "nightshift", "groupKey": "{}:{alertname=\"GpuHot\"}",
        "truncatedAlerts": 0, "groupLabels": {"alertname": "GpuHot"}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "GpuHot", "Hostname": node, "gpu": ((i / 2) % 8).to_string()},
            "annotations": {"summary": "hot"},
            "startsAt": nightshift_engine::embed::format_rfc3339_ms(
                nightshift_proto::clock::Clock::now_ms(&SystemClock)),
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": format!("kill-{i}"),
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_alert_and_run_survives_a_kill_right_after_the_answer() {
    let kills: usize = std::env::var("NIGHTSHIFT_WEBHOOK_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    // Eight GPUs: each alert is for the GPU after the last one's, so the
    // run an alert of eight alerts earlier started has usually ended. Not
    // always: a run a kill cut off while running is resumed, and a resumed
    // run waits for its node's readings of the new life — lives here last
    // milliseconds, so it may stay active for many of them and hold every
    // later alert for its GPU back (dedup, by design). Each such alert says
    // so on the chain, every time (it once did only the first time).
    let sim = SimConfig { gpus: 8, ..SimConfig::default() };
    std::fs::write(
        dir.path().join("policy.yaml"),
        "version: 1\nrate_limits:\n  power_limit: {max_changes: 100000, window_secs: 60}\n",
    )
    .unwrap();
    let mut agents = Vec::new();
    for i in 0..2 {
        agents.push(TestAgent::start(dir.path(), &format!("n{i}"), sim.clone(), "policy_path: policy.yaml\n").await);
    }
    let manifest = "scope: gpu\ncooldown_secs: 0\nmax_concurrent: 16\nmax_attempts_per_day: 100000\n";
    engine_setup(
        dir.path(),
        &agents.iter().collect::<Vec<_>>(),
        &[
            ("hot", &format!("trigger: {{type: alert, alertname: GpuHot}}\n{manifest}"), "set_power_limit(600);\n"),
            ("work", &format!("trigger: {{type: manual}}\n{manifest}"), "set_power_limit(650);\n"),
        ],
        "auth: {allow_anonymous: admin}\n",
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let (mut alerts, mut runs): (BTreeSet<String>, BTreeSet<String>) = Default::default();
    let mut seed = 0x5eed_u64;
    let started = Instant::now();
    for it in 0..=kills {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let base = format!("http://127.0.0.1:{port}");
        let mut child = spawn_engine(dir.path(), port);
        wait_ready(&http, &base).await;
        if it == kills {
            // The last life: let it finish what the kills left, then check.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        let node = format!("n{}", it % 2);
        let accepted = if it % 2 == 0 {
            let r = http
                .post(format!("{base}/api/v1/alerts/alertmanager"))
                .header("content-type", "application/json")
                .body(alert(it, &node).to_string())
                .send()
                .await
                .unwrap();
            let ok = r.status() == 200;
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if ok && v["accepted"] == 1 {
                alerts.insert(format!("kill-{it}"));
            }
            ok
        } else {
            let r = http
                .post(format!("{base}/api/v1/runs"))
                .json(&serde_json::json!({"runbook": "work", "node": node, "gpu": 1}))
                .send()
                .await
                .unwrap();
            let ok = r.status() == 202;
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if let Some(id) = v["run"]["id"].as_str() {
                runs.insert(id.to_string());
            }
            ok
        };
        assert!(accepted, "iteration {it}: not accepted");
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        tokio::time::sleep(Duration::from_micros((seed >> 33) % 5_000)).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    let store = AuditStore::open(&dir.path().join("engine-data"), Arc::new(SystemClock)).unwrap();
    assert!(store.verify().unwrap().ok);
    let records = store.tail(0, usize::MAX).unwrap();
    for fp in &alerts {
        assert!(
            records.iter().any(|r| r.kind == RecordKind::EventReceived && r.data["fingerprint"] == fp.as_str()),
            "accepted alert {fp} has no event_received"
        );
        // Handled: a run queued for it — or, where a run for the same
        // runbook and GPU is still active (resumed by a restart and not yet
        // started again: lives here last milliseconds), held back by that
        // run, which does the same work (dedup, by design). Either way its
        // handling is on the chain (`event_handled`).
        let received = records
            .iter()
            .find(|r| r.kind == RecordKind::EventReceived && r.data["fingerprint"] == fp.as_str())
            .map(|r| r.seq)
            .unwrap();
        let handled = records
            .iter()
            .find(|r| {
                r.kind == RecordKind::EventHandled
                    && r.data["key"].as_str().is_some_and(|k| k.contains(&format!("|{fp}@")))
            })
            .map(|r| r.seq);
        let queued =
            records.iter().any(|r| r.kind == RecordKind::RunQueued && r.data["event"]["fingerprint"] == fp.as_str());
        let held_back = handled.is_some_and(|h| {
            records.iter().any(|r| {
                r.kind == RecordKind::TriggerSuppressed
                    && (received..h).contains(&r.seq)
                    && r.data["reason"].as_str().is_some_and(|w| w.ends_with("is already active"))
            })
        });
        if !(queued || held_back) {
            // What the chain says around it, for whoever reads the failure.
            for r in records.iter().filter(|r| r.seq + 20 >= received && r.seq <= received + 20) {
                eprintln!(
                    "{} {:?} run={:?} node={:?} gpu={:?} by {}: {}",
                    r.seq, r.kind, r.run, r.node, r.gpu, r.actor, r.data
                );
            }
        }
        assert!(queued || held_back, "accepted alert {fp} led to no run, and no active run held it back");
        assert!(handled.is_some() || queued, "accepted alert {fp}: its handling is not on the chain");
    }
    for id in &runs {
        assert!(store.run(id).unwrap().is_some(), "acknowledged run {id} is gone");
    }
    eprintln!(
        "{kills} kills 0–5 ms after the answer: {} alerts and {} runs acknowledged, all present, in {:.1} s",
        alerts.len(),
        runs.len(),
        started.elapsed().as_secs_f64()
    );
    for mut a in agents {
        a.stop().await;
    }
}
