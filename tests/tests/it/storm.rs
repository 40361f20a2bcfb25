//! An alert storm: 100,000 Alertmanager alerts in 10 s over real HTTP —
//! repeats, re-fires, resolved alerts, hosts not in the inventory — at an
//! engine with 20 sim agents over SSH. Afterwards, checked over the audit
//! log: at most one run per (runbook, target) per cooldown; the blast-radius
//! limit held on drains; shed work left audit records; the chain verifies.
//! Along the way: the alert backlog and the run queue never exceed their
//! caps and memory stays bounded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::{RecordKind, RunFilter};
use nightshift_engine::embed::format_rfc3339_ms;
use nightshift_tests::{TestAgent, engine_setup, eventually};
use serde_json::{Value, json};

const NODES: usize = 20;
const GPUS: u32 = 4;
const ALERTS: usize = 100_000;
const PER_POST: usize = 500;
const SECS: f64 = 10.0;
const BACKLOG: usize = 300;
const QUEUE: usize = 16;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Alert `i` of the storm (deterministic).
fn alert(i: usize, t0_ms: i64) -> Value {
    let k = (i * 7919) % 100;
    let node = format!("n{:02}", i % NODES);
    let gpu = (i / NODES) % GPUS as usize;
    let (name, host, fp, starts, status) = match k {
        // Repeats of the same GpuHot alerts (same fingerprint and startsAt),
        // and re-fires of them (a new startsAt).
        0..=59 => ("GpuHot", node.clone(), format!("hot-{node}-{gpu}"), t0_ms + (i % 5) as i64 * 1000, "firing"),
        60..=74 => ("NodeBad", node.clone(), format!("bad-{node}"), t0_ms + (i % 3) as i64 * 1000, "firing"),
        75..=89 => ("GpuHot", node.clone(), format!("hot-{node}-{gpu}"), t0_ms, "resolved"),
        // Hosts nobody knows, each alert new.
        _ => ("GpuHot", format!("ghost-{i}"), format!("ghost-{i}"), t0_ms, "firing"),
    };
    json!({
        "status": status,
        "labels": {"alertname": name, "Hostname": host, "gpu": gpu.to_string()},
        "annotations": {"summary": "storm"},
        "startsAt": format_rfc3339_ms(starts),
        "endsAt": if status == "resolved" { format_rfc3339_ms(t0_ms + 60_000) } else { "0001-01-01T00:00:00Z".into() },
        "generatorURL": "",
        "fingerprint": fp,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_storm_is_absorbed_within_every_limit() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: GPUS, ..SimConfig::default() };
    let mut agents = Vec::new();
    for i in 0..NODES {
        agents.push(
            TestAgent::start(dir.path(), &format!("n{i:02}"), sim.clone(), "telemetry_interval_ms: 1000\n").await,
        );
    }
    let cfg = engine_setup(
        dir.path(),
        &agents.iter().collect::<Vec<_>>(),
        &[
            (
                "gpu-hot",
                "trigger: {type: alert, alertname: GpuHot}\nscope: gpu\ncooldown_secs: 600\n",
                "let r = set_power_limit(600);\nif !r.ok { fail(r.error); }\nsleep(0.3);\n",
            ),
            (
                "node-bad",
                "trigger: {type: alert, alertname: NodeBad}\nscope: node\ncooldown_secs: 600\n",
                "let r = drain(\"storm: node bad\");\nif !r.ok { fail(r.error); }\nkeep_holds(600);\n",
            ),
        ],
        &format!(
            "auth: {{allow_anonymous: admin}}\nlimits: {{queue_capacity: {QUEUE}, max_concurrent_runs: 8, max_drained_pct: 10, alert_backlog: {BACKLOG}}}\n"
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(30, || (engine.gauges().agents_connected == NODES).then_some(())).await.is_some());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/v1/alerts/alertmanager", listener.local_addr().unwrap());
    let web = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));

    // Watch the caps and memory while it happens.
    let rss_before = rss_kib();
    let (peak_rss, peak_backlog, peak_queue) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
    let watcher = {
        let (e, r, b, q) = (engine.clone(), peak_rss.clone(), peak_backlog.clone(), peak_queue.clone());
        tokio::spawn(async move {
            loop {
                r.fetch_max(rss_kib(), Ordering::Relaxed);
                b.fetch_max(e.gauges().alert_backlog, Ordering::Relaxed);
                q.fetch_max(e.gauges().queue_depth, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let t0_ms = nightshift_proto::clock::Clock::now_ms(&nightshift_proto::clock::SystemClock);
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut posts = Vec::new();
    for p in 0..ALERTS / PER_POST {
        let due = started + Duration::from_secs_f64(p as f64 * SECS / (ALERTS / PER_POST) as f64);
        tokio::time::sleep_until(due.into()).await;
        let body = json!({
            "version": "4", "status": "firing", "receiver": "nightshift", "groupKey": format!("g{p}"),
            "truncatedAlerts": 0, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": (p * PER_POST..(p + 1) * PER_POST).map(|i| alert(i, t0_ms)).collect::<Vec<_>>(),
        });
        let (h, u) = (http.clone(), url.clone());
        // Like Alertmanager: a 5xx is retried (here every 300 ms).
        posts.push(tokio::spawn(async move {
            let mut attempts = Vec::new();
            loop {
                let r = h.post(&u).json(&body).send().await.unwrap();
                let status = r.status().as_u16();
                attempts.push((status, r.json::<Value>().await.unwrap()));
                if status != 503 || attempts.len() >= 100 {
                    return attempts;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for p in posts {
        let attempts = p.await.unwrap();
        assert_eq!(attempts.last().unwrap().0, 200, "a payload was still refused after {} tries", attempts.len());
        for (i, (status, v)) in attempts.iter().enumerate() {
            *statuses.entry(*status).or_default() += 1;
            // The poster past its own rate (limits.webhook_alerts_per_sec):
            // refused whole before anything is looked at, sent again.
            if *status == 503 && v["error"]["code"] == "rate_limited" {
                *totals.entry("rate_limited").or_default() += 1;
                continue;
            }
            assert_eq!(*status == 503, v["shed"].as_u64().unwrap() > 0, "503 exactly when something was shed: {v}");
            *totals.entry("accepted").or_default() += v["accepted"].as_u64().unwrap();
            *totals.entry("shed").or_default() += v["shed"].as_u64().unwrap();
            if i + 1 == attempts.len() {
                // The last answer covers the whole payload.
                assert_eq!(v["accepted"].as_u64().unwrap() + v["duplicates"].as_u64().unwrap(), PER_POST as u64, "{v}");
                *totals.entry("duplicates").or_default() += v["duplicates"].as_u64().unwrap();
            }
        }
    }
    let send_secs = started.elapsed().as_secs_f64();
    // Nothing lost, nothing handled twice: every distinct alert (status,
    // fingerprint, startsAt) was accepted exactly once, retries included.
    let distinct: std::collections::BTreeSet<String> = (0..ALERTS)
        .map(|i| {
            let a = alert(i, t0_ms);
            format!("{}|{}|{}", a["status"], a["fingerprint"], a["startsAt"])
        })
        .collect();
    assert_eq!(totals["accepted"], distinct.len() as u64, "{totals:?}");
    assert!(statuses.keys().all(|s| *s == 200 || *s == 503), "{statuses:?}");

    // Let it drain.
    let settled = eventually(180, || {
        (engine.gauges().alert_backlog == 0 && engine.running() == 0 && engine.gauges().queue_depth == 0).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "settled: backlog {}, running {}, queued {}",
        engine.gauges().alert_backlog,
        engine.running(),
        engine.gauges().queue_depth
    );
    let settle_secs = started.elapsed().as_secs_f64();
    watcher.abort();

    // The caps held.
    assert!(
        peak_backlog.load(Ordering::Relaxed) <= BACKLOG as u64,
        "backlog peaked at {}",
        peak_backlog.load(Ordering::Relaxed)
    );
    assert!(peak_queue.load(Ordering::Relaxed) <= QUEUE, "queue peaked at {}", peak_queue.load(Ordering::Relaxed));
    let growth_mib = peak_rss.load(Ordering::Relaxed).saturating_sub(rss_before) / 1024;
    assert!(growth_mib < 512, "memory grew by {growth_mib} MiB");

    // Invariants over the audit log.
    let runs = engine.runs(&RunFilter { limit: Some(100_000), ..Default::default() }).unwrap().runs;
    let mut per_target: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &runs {
        *per_target.entry((r.runbook.clone(), r.target.to_string())).or_default() += 1;
    }
    for (k, n) in &per_target {
        assert_eq!(*n, 1, "{k:?} ran {n} times within one cooldown");
    }
    // "Resolved" is about an episode: only runs of the resolved episode
    // (startsAt = t0) may be skipped for it; a firing episode never is.
    let resolved_start = nightshift_engine::embed::format_rfc3339_ms(t0_ms);
    for r in runs
        .iter()
        .filter(|r| r.why.contains("resolved") || r.ending.as_deref().is_some_and(|e| e.contains("resolved")))
    {
        assert_eq!(
            r.event["starts_at"].as_str(),
            Some(resolved_start.as_str()),
            "a firing episode skipped as resolved: {r:?}"
        );
    }
    let records = engine.audit().tail(0, usize::MAX).unwrap();
    let applied_drains = records
        .iter()
        .filter(|r| r.kind == RecordKind::ActionResult && r.data["applied"] == true && r.data["op"] == "drain")
        .filter(|r| {
            records.iter().any(|i| {
                i.kind == RecordKind::ActionIntent && i.run == r.run && i.data["op"] == "drain" && i.node == r.node
            })
        })
        .count();
    let allowed = ((NODES as f64) * 0.10).floor().max(1.0) as usize;
    let drained_now = engine.nodes().iter().filter(|n| n.state.drained).count();
    assert!(drained_now <= allowed, "{drained_now} nodes drained, limit {allowed}");
    assert!(applied_drains <= allowed, "{applied_drains} drains applied, limit {allowed}");
    let refusals = records.iter().filter(|r| r.kind == RecordKind::Refusal).count();
    let dropped: Vec<&str> = records
        .iter()
        .filter(|r| r.kind == RecordKind::EventDropped)
        .filter_map(|r| r.data["reason"].as_str())
        .collect();
    let ghost_drops = dropped.iter().filter(|d| d.contains("not in the inventory")).count();
    let intake_sheds = dropped.iter().filter(|d| d.contains("alert intake full")).count();
    let queue_sheds = dropped.iter().filter(|d| d.contains("run queue is full")).count();
    if totals["shed"] > 0 {
        assert!(intake_sheds > 0, "shed alerts are audited");
    }
    // 100 targets at once, 8 runs at a time, room for 16 more: the rest shed.
    assert!(queue_sheds > 0, "the run queue shed (and said so)");
    assert!(ghost_drops > 0, "alerts for unknown hosts are audited as dropped");
    let received = records.iter().filter(|r| r.kind == RecordKind::EventReceived).count() as u64;
    assert_eq!(received, totals["accepted"], "every accepted alert has an event_received record");
    assert!(engine.verify().unwrap().ok);

    eprintln!(
        "alert storm: {ALERTS} alerts in {send_secs:.1} s ({:.0}/s): {totals:?}, responses {statuses:?}; settled in {settle_secs:.1} s; \
         {} runs over {} targets (max 1 each); drains applied {applied_drains} (limit {allowed}); refusals {refusals}; \
         dropped: {ghost_drops} unknown host, {intake_sheds} intake sheds, {queue_sheds} queue sheds; \
         peaks: backlog {} / {BACKLOG}, queue {} / {QUEUE}, RSS +{growth_mib} MiB; {} audit records",
        ALERTS as f64 / send_secs,
        runs.len(),
        per_target.len(),
        peak_backlog.load(Ordering::Relaxed),
        peak_queue.load(Ordering::Relaxed),
        records.len()
    );
    web.abort();
    engine.shutdown().await;
    for mut a in agents {
        a.stop().await;
    }
}
