//! The engine on a full disk: its data dir on a small tmpfs that is then
//! filled. The store stops at its first failure to write or index; from
//! then on every new run is refused with 503 (not 500), `/healthz` is not
//! ok and says why, and after its exit, space freed and a restart, the
//! runs in the audit log are exactly the runs that were answered 202 —
//! nothing that was refused executes later. A store that stays stopped
//! makes `serve` exit 74 after `audit.exit_after_stop_secs`, so the service
//! manager restarts it.
//!
//! Needs to mount a tmpfs (root); elsewhere it says so and checks nothing.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{AuditStore, RecordKind};
use nightshift_proto::clock::SystemClock;
use nightshift_tests::external::free_port;
use nightshift_tests::{TestAgent, engine_setup};

struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn spawn_engine(dir: &std::path::Path, port: u16) -> Child {
    nightshift_tests::spawn_serve(env!("CARGO_BIN_EXE_nightshift"), dir, port)
}

async fn wait_ready(http: &reqwest::Client, base: &str) {
    nightshift_tests::wait_healthy(http, base).await
}

fn alert(i: usize) -> serde_json::Value {
    serde_json::json!({
        "version": "4", "status": "firing", "receiver": "nightshift", "groupKey": "{}:{alertname=\"Other\"}",
        "truncatedAlerts": 0, "groupLabels": {"alertname": "Other"}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "Other", "Hostname": "n0", "gpu": "0", "padding": "x".repeat(400)},
            "annotations": {"summary": "an alert no runbook answers"},
            "startsAt": "2026-12-01T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": format!("full-{i}"),
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_engine_and_nothing_refused_runs_later() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("engine-data");
    std::fs::create_dir_all(&data).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&data)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("engine_full_disk: cannot mount a tmpfs here (needs root): nothing checked");
        return;
    }
    let _mount = Mount(data.clone());
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    std::fs::write(
        dir.path().join("policy.yaml"),
        "version: 1\nrate_limits:\n  power_limit: {max_changes: 100000, window_secs: 60}\n",
    )
    .unwrap();
    let agent = TestAgent::start(dir.path(), "n0", sim, "policy_path: policy.yaml\n").await;
    let manifest = "scope: gpu\ncooldown_secs: 0\nmax_concurrent: 64\nmax_attempts_per_day: 1000000\n";
    engine_setup(
        dir.path(),
        &[&agent],
        &[("work", &format!("trigger: {{type: manual}}\n{manifest}"), "set_power_limit(650);\n")],
        "auth: {allow_anonymous: admin}\naudit: {exit_after_stop_secs: 5}\n",
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut engine = spawn_engine(dir.path(), port);
    wait_ready(&http, &base).await;

    // Fill the disk.
    let mut filler = std::fs::File::create(data.join("filler")).unwrap();
    let chunk = vec![0xa5u8; 256 * 1024];
    while filler.write_all(&chunk).and_then(|_| filler.sync_data()).is_ok() {}
    drop(filler);

    // Ask for runs until the store has clearly stopped.
    let (mut acked, mut statuses) = (BTreeSet::new(), std::collections::BTreeMap::<u16, usize>::new());
    let mut refused_in_a_row = 0;
    let mut alerts = BTreeSet::new();
    for i in 0..3_000 {
        // An alert (each its own event record), then a run.
        let a = http
            .post(format!("{base}/api/v1/alerts/alertmanager"))
            .header("content-type", "application/json")
            .body(alert(i).to_string())
            .send()
            .await
            .unwrap();
        match a.status().as_u16() {
            200 => {
                alerts.insert(format!("full-{i}"));
            }
            503 => {}
            s => panic!("an alert answered {s}: expected 200, or 503 once the store stopped"),
        }
        let r = http
            .post(format!("{base}/api/v1/runs"))
            .json(&serde_json::json!({"runbook": "work", "node": "n0", "gpu": i % 2}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        *statuses.entry(status).or_default() += 1;
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        if status == 202 {
            // A run, or none when one for the same GPU is still active.
            if let Some(id) = v["run"]["id"].as_str() {
                acked.insert(id.to_string());
            }
            refused_in_a_row = 0;
        } else {
            assert_eq!(status, 503, "a store that cannot write refuses with 503: {v}");
            assert_eq!(v["error"]["code"], "audit_stopped", "{v}");
            refused_in_a_row += 1;
            if refused_in_a_row == 50 {
                break;
            }
        }
    }
    if refused_in_a_row != 50 {
        let _ =
            Command::new("sh").arg("-c").arg(format!("df -h {0}; ls -la {0} {0}/audit.sled", data.display())).status();
        let h: serde_json::Value = http.get(format!("{base}/healthz")).send().await.unwrap().json().await.unwrap();
        eprintln!("healthz {h}");
    }
    assert_eq!(refused_in_a_row, 50, "the full disk never stopped the store: {statuses:?}");
    let h = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(h.status().as_u16(), 503, "healthz is not ok while the store refuses");
    let hv: serde_json::Value = h.json().await.unwrap();
    assert_eq!(hv["ok"], false, "{hv}");
    assert!(hv["audit_stopped"].as_str().is_some_and(|m| m.contains("free space")), "it says what to do: {hv}");

    // Issue 46 point 6: it answered 503 forever and never exited, so
    // systemd never restarted it. After `audit.exit_after_stop_secs` (5 s
    // here) it exits 74 by itself.
    let mut exited = None;
    for _ in 0..300 {
        if let Some(s) = engine.try_wait().unwrap() {
            exited = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exited = exited.unwrap_or_else(|| {
        let _ = engine.kill();
        panic!("the engine did not exit within 30 s of its store stopping")
    });
    assert_eq!(exited.code(), Some(74), "{exited:?}");
    // Free the space, start again: recovery replays what was acknowledged.
    std::fs::remove_file(data.join("filler")).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut engine = spawn_engine(dir.path(), port);
    wait_ready(&http, &base).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    engine.kill().unwrap();
    engine.wait().unwrap();

    let store = AuditStore::open(&data, Arc::new(SystemClock)).unwrap();
    let report = store.verify().unwrap();
    assert!(report.ok, "{report:?}");
    let in_log: BTreeSet<String> = store
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::RunQueued)
        .filter_map(|r| r.run)
        .collect();
    let events: BTreeSet<String> = store
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::EventReceived)
        .filter_map(|r| r.data["fingerprint"].as_str().map(str::to_string))
        .collect();
    let refused_events: Vec<_> = events.difference(&alerts).collect();
    assert!(
        refused_events.is_empty(),
        "alerts that were refused are in the log: {} (first: {:?})",
        refused_events.len(),
        &refused_events[..refused_events.len().min(5)]
    );
    let lost_events: Vec<_> = alerts.difference(&events).collect();
    assert!(
        lost_events.is_empty(),
        "accepted alerts are gone: {} (first: {:?})",
        lost_events.len(),
        &lost_events[..lost_events.len().min(5)]
    );
    let refused_but_present: Vec<_> = in_log.difference(&acked).collect();
    assert!(
        refused_but_present.is_empty(),
        "runs that were refused are in the log: {} (first: {:?})",
        refused_but_present.len(),
        &refused_but_present[..refused_but_present.len().min(5)]
    );
    let acked_but_gone: Vec<_> = acked.difference(&in_log).collect();
    assert!(
        acked_but_gone.is_empty(),
        "acknowledged runs are gone: {} (first: {:?})",
        acked_but_gone.len(),
        &acked_but_gone[..acked_but_gone.len().min(5)]
    );
    eprintln!(
        "engine on a full disk: run answers {statuses:?}; {} acknowledged runs and {} accepted alerts, all present, \
         none other",
        acked.len(),
        alerts.len()
    );
    drop(store);
    let mut agent = agent;
    agent.stop().await;
}
