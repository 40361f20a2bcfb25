//! Agent faults: an agent is stopped in the middle of a run and of its
//! telemetry stream, then started again on the same state dir and port. The
//! run ends with an honest outcome (failed, saying the agent is
//! unreachable — not hung, not succeeded); the engine reconnects with
//! backoff and telemetry flows again; a lease taken before the crash is
//! carried out by the restarted agent when due, and journaled.

use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::statelog::StateLog;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::runs::{RunOutcome, Target};
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::*;
use nightshift_tests::{TestAgent, engine_setup, eventually, manual_run};

async fn power_limit(c: &AgentConnection, gpu: usize) -> f64 {
    let t: Telemetry =
        serde_json::from_value(c.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    t.gpus[gpu].power_limit_watts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_crash_mid_run_and_mid_stream_and_come_back() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    let extra = "telemetry_interval_ms: 100\n";
    let mut a = TestAgent::start(dir.path(), "a", sim.clone(), extra).await;
    let b = TestAgent::start(dir.path(), "b", sim, extra).await;
    let cfg = engine_setup(
        dir.path(),
        &[&a, &b],
        &[(
            "two-steps",
            "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n",
            "let r = set_power_limit(550);\nif !r.ok { fail(r.error); }\nsleep(2);\nlet r = set_power_limit(600);\nif !r.ok { fail(r.error); }\n",
        )],
        "telemetry: {interval_ms: 100}\nlimits: {action_timeout_secs: 3}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.is_some());
    let original = {
        let c = AgentConnection::connect(&a.client_config()).await.unwrap();
        let w = power_limit(&c, 1).await;
        // A lease taken before the crash: 450 W on GPU 1 for 3 s.
        let mut req = Request::new("lease-1", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 1, watts: 450.0 }));
        req.revert_after_secs = Some(3);
        let r = c.call(&req).await.unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(power_limit(&c, 1).await, 450.0);
        c.close().await;
        w
    };

    // A run whose first step lands, then the agent dies before the second.
    let mut rx = engine.audit().subscribe();
    let s = engine.submit(manual_run("two-steps", Target::gpu("a", 0))).await.unwrap();
    let run = s.run().unwrap().id.clone();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = tokio::time::timeout(end.saturating_duration_since(Instant::now()), rx.recv()).await.unwrap().unwrap();
        if r.kind == RecordKind::ActionResult && r.run.as_deref() == Some(&run) {
            assert_eq!(r.data["applied"], true, "{r:?}");
            break;
        }
    }
    let seen_before = engine.node("a").unwrap().state.last_seen_ms;
    a.stop().await;
    let stopped_at = Instant::now();

    // The run ends, failed, within the action timeout plus the script's
    // sleep — not hung, not succeeded.
    let summary =
        eventually(30, || engine.run(&run).unwrap().filter(|r| r.outcome.is_some())).await.expect("the run ended");
    assert_eq!(summary.outcome, Some(RunOutcome::Failed), "{summary:?}");
    assert!(stopped_at.elapsed() < Duration::from_secs(15), "took {:?}", stopped_at.elapsed());
    let records = engine.run_records(&run).unwrap();
    let last_result = records.iter().rev().find(|r| r.kind == RecordKind::ActionResult).unwrap();
    assert_eq!(last_result.data["ok"], false, "{last_result:?}");
    let err = summary.error.clone().unwrap_or_default();
    assert!(err.contains("a") && !err.is_empty(), "the failure says why: {err:?}");
    // The engine noticed the stream ended.
    assert!(eventually(10, || (!engine.node("a").unwrap().state.connected).then_some(())).await.is_some());
    // b was never affected.
    assert!(engine.node("b").unwrap().state.connected);

    // Back on the same port and state dir: the engine reconnects and
    // telemetry flows again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.restart().await;
    let back = eventually(30, || {
        let n = engine.node("a").unwrap();
        (n.state.connected && n.state.last_seen_ms > seen_before).then_some(())
    })
    .await;
    assert!(back.is_some(), "the engine reconnected: {:?}", engine.node("a").unwrap().state);

    // The lease, taken before the crash, is carried out by the new process.
    let c = AgentConnection::connect(&a.client_config()).await.unwrap();
    let mut reverted = false;
    for _ in 0..100 {
        if power_limit(&c, 1).await == original {
            reverted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reverted, "GPU 1 is back at {original} W");
    let journal = StateLog::journal_lines(&a.cfg.state_dir).unwrap();
    assert!(
        journal.iter().any(|l| matches!(l, JournalLine::Reverted { id, ok: true, .. } if id == "lease-1")),
        "{journal:?}"
    );
    // The run's first step reached the agent and the second never did; the
    // run ended while the agent was down, so the release of its hold failed
    // then — and the engine retries it once the agent is back: GPU 0 returns
    // to its limit from before the run, not left at 550 W for good.
    let mut released = false;
    for _ in 0..100 {
        if power_limit(&c, 0).await == original {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(released, "GPU 0 is back at {original} W, found {} W", power_limit(&c, 0).await);
    // The agent applies the release before the engine has its answer (and
    // audits it): wait for the record rather than read once (a loaded full
    // run read the run's records between the two).
    let retried = |records: &[nightshift_engine::audit::AuditRecord]| {
        records
            .iter()
            .any(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "release" && r.data["applied"] == true)
    };
    let mut records = engine.run_records(&run).unwrap();
    for _ in 0..100 {
        if retried(&records) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        records = engine.run_records(&run).unwrap();
    }
    assert!(retried(&records), "the retried release is on the run's record: {records:?}");
    let applied: Vec<_> = journal
        .iter()
        .filter_map(|l| match l {
            // The script's steps (`<run>-a<n>`), not the retried release.
            JournalLine::Pending { id, .. } if id.starts_with(&format!("{run}-a")) => Some(id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(applied.len(), 1, "{applied:?}");

    // And a new run on the restarted agent works.
    let s = engine.submit(manual_run("two-steps", Target::gpu("a", 0))).await.unwrap();
    let id = s.run().unwrap().id.clone();
    let done = eventually(30, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    assert_eq!(done.outcome, Some(RunOutcome::Succeeded), "{done:?}");
    assert!(engine.verify().unwrap().ok);
    c.close().await;
    engine.shutdown().await;
    a.stop().await;
}
