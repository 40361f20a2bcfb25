//! Crash recovery and restarts: a run cut off mid-action is resumed after
//! the restart, its open intent reconciled with the agent by request id,
//! the action never applied twice, and the run's hold left in place until
//! the resumed run ends; a stop (SIGTERM) leaves a capped run's cap on for
//! the next engine; a run resumed three times is interrupted at the fourth
//! restart and its holds released;
//! a still-firing alert does not re-run after each restart; two runs'
//! holds on one GPU end at the baseline across engine and agent restarts;
//! a restored backup never gets an old reply replayed as "applied".

use std::sync::Arc;

use crate::common::*;
use futures::future::BoxFuture;
use nightshift_agent::LocalAgent;
use nightshift_engine::audit::{AuditStore, RecordKind};
use nightshift_engine::embed::NodeSpec;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_engine::engine::{Engine, EngineParts};
use nightshift_engine::runs::{RunOutcome, RunState, Target};
use nightshift_proto::ssh::client::{AgentTransport, ClientError};
use nightshift_proto::{NoArgs, Op, Reply, Request, Telemetry};

/// Forwards to the agent, and for `set_power_limit` holds the reply back
/// until released: the engine is "mid-action".
struct Gated {
    inner: Arc<dyn AgentTransport>,
    gate: Arc<tokio::sync::Notify>,
    reached: Arc<tokio::sync::Notify>,
}

impl AgentTransport for Gated {
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>> {
        Box::pin(async move {
            let hold = matches!(req.op, Op::SetPowerLimit(_));
            let r = self.inner.call(req).await;
            if hold {
                self.reached.notify_one();
                self.gate.notified().await;
            }
            r
        })
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    nightshift_sim::fleet::copy_dir(from, to).unwrap();
}

async fn telemetry(f: &nightshift_sim::fleet::SimFleet, node: &str) -> Telemetry {
    let r = f.agent(node).handle(Request::new("probe", Op::Telemetry(NoArgs {}))).await;
    serde_json::from_value(r.result.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_off_mid_action_is_resumed_with_its_hold_in_place_and_its_action_not_reapplied() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cap",
        "trigger:\n  type: manual\nscope: node\n",
        "set_power_limit(0, 420);\nnote(\"done\");\n",
    );
    let gate = Arc::new(tokio::sync::Notify::new());
    let reached = Arc::new(tokio::sync::Notify::new());
    let (g2, r2) = (gate.clone(), reached.clone());
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), move |o| {
        o.wrap_transport = Some(Box::new(move |_, inner| {
            Arc::new(Gated { inner, gate: g2.clone(), reached: r2.clone() }) as Arc<dyn AgentTransport>
        }))
    })
    .await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("cap", Target::node("n1"), "user:alice")).await.unwrap());
    // The agent applied the action; the engine has the intent, no result.
    reached.notified().await;
    let recs = f.engine.run_records(&id).unwrap();
    assert_eq!(recs.last().unwrap().kind, RecordKind::ActionIntent);
    let action_id = recs.last().unwrap().data["action_id"].as_str().unwrap().to_string();

    // Crash: the disk as it is now, opened by a new engine.
    let crash = tempfile::tempdir().unwrap();
    copy_dir(&f.engine_dir(), crash.path());
    let clock: nightshift_proto::clock::SharedClock = Arc::new(f.clock.clone());
    let audit = AuditStore::open(crash.path(), clock.clone()).unwrap();
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = nightshift_engine::embed::load_dir(rb.path(), &script);
    let agent = f.agent("n1").clone();
    let engine2 = Engine::new(EngineParts {
        config: f.engine.config().clone(),
        clock,
        audit,
        nodes: vec![(
            NodeSpec {
                name: "n1".into(),
                address: "sim".into(),
                host_key: "SHA256:sim".into(),
                labels: Default::default(),
                standby: false,
                power_saving: false,
            },
            "sim".into(),
            Arc::new(LocalAgent(agent.clone())) as Arc<dyn AgentTransport>,
        )],
        script,
        runbooks: set,
    });
    let interrupted = engine2.begin().await.unwrap();
    assert!(interrupted.is_empty(), "resumed, not interrupted: {interrupted:?}");
    let run = engine2.run(&id).unwrap().unwrap();
    assert_eq!((run.state, run.outcome), (RunState::Queued, None), "queued again: {run:?}");
    let recs = engine2.run_records(&id).unwrap();
    let reconciled = recs.iter().find(|r| r.kind == RecordKind::ActionResult).unwrap();
    assert_eq!(reconciled.data["reconciled"], true);
    assert_eq!(reconciled.data["agent_status"]["state"], "done", "{reconciled:?}");
    let note = recs.last().unwrap();
    assert_eq!((note.kind, note.data["resumed"].as_u64()), (RecordKind::Note, Some(1)), "{note:?}");
    assert!(note.data["text"].as_str().unwrap().contains("its holds on n1 stay in place"), "{note:?}");
    assert!(engine2.verify().unwrap().ok);
    // The agent applied it exactly once; the restart re-sent nothing.
    let lines = agent.journal_lines();
    let pending = lines
        .iter()
        .filter(|l| matches!(l, nightshift_agent::journal::JournalLine::Pending { id, .. } if *id == action_id))
        .count();
    assert_eq!(pending, 1);
    // The mitigation is still on: nothing was released at the restart.
    let r = agent.handle(Request::new("probe", Op::Telemetry(NoArgs {}))).await;
    let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 420.0);
    assert_eq!(t.node_metrics.holds.len(), 1, "{:?}", t.node_metrics.holds);
    assert_eq!(t.node_metrics.holds[0].owner, id);
    assert!(!recs.iter().any(|r| r.data["op"] == "release"), "no release at the restart");
    gate.notify_waiters();
    gate.notify_one();
}

/// The cap a run placed, and whether anything of the run's was released
/// (an agent's `hold_ended`, a `release` action).
async fn cap_and_releases(f: &nightshift_sim::fleet::SimFleet, run: &str) -> (f64, usize) {
    let released = f
        .engine
        .run_records(run)
        .unwrap()
        .iter()
        .filter(|r| r.kind == RecordKind::HoldEnded || r.data["op"] == "release")
        .count();
    (telemetry(f, "n1").await.gpus[0].power_limit_watts, released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_capped_run_keeps_the_cap_and_the_next_engine_resumes_the_run() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool",
        "trigger:\n  type: manual\nscope: gpu\ncooldown_secs: 900\n",
        "set_power_limit(450);\nsleep(120);\nnote(\"cooled\");\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("cool", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    f.run_for(10).await.unwrap();
    assert_eq!(cap_and_releases(f, &id).await, (450.0, 0), "capped, running");
    // SIGTERM: the engine stops. The run is left as it is — unfinished in
    // the log, its cap on the GPU — not cancelled, not released.
    f.engine.shutdown().await;
    f.run_for(5).await.unwrap();
    assert_eq!(cap_and_releases(f, &id).await, (450.0, 0), "a stop releases nothing");
    assert!(!kinds(&records(f), &id).contains(&RecordKind::RunFinished), "left unfinished");
    // The next engine resumes it: the cap was never off.
    let interrupted = sim.fleet.restart_engine().await.unwrap();
    assert!(interrupted.is_empty(), "{interrupted:?}");
    let f = &sim.fleet;
    f.run_for(5).await.unwrap();
    assert_eq!(cap_and_releases(f, &id).await, (450.0, 0), "the cap held across the restart");
    let run = f.engine.run(&id).unwrap().unwrap();
    assert_eq!(run.state, RunState::Running, "{run:?}");
    let recs = f.engine.run_records(&id).unwrap();
    assert!(recs.iter().any(|r| r.data["resumed"] == 1), "the resume is on the run's page");
    // Its own end releases the cap and earns its cooldown (it did its work).
    let end = until_finished(f, &id, 300).await;
    assert_eq!(end.outcome, Some(RunOutcome::Succeeded), "{end:?}");
    f.run_for(5).await.unwrap();
    let (cap, released) = cap_and_releases(f, &id).await;
    assert_eq!(cap, 700.0, "back at the baseline after the run's own end");
    assert!(released > 0);
    let recs = f.engine.run_records(&id).unwrap();
    let finished = recs.iter().find(|r| r.kind == RecordKind::RunFinished).unwrap();
    assert_eq!(finished.data["starts_cooldown"], true, "{finished:?}");
    // One intent per action id, across both engines.
    let mut ids: Vec<&str> = recs
        .iter()
        .filter(|r| r.kind == RecordKind::ActionIntent)
        .filter_map(|r| r.data["action_id"].as_str())
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "an action id intended twice: {ids:?}");
    assert!(f.engine.verify().unwrap().ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_three_times_is_interrupted_at_the_fourth_restart_and_its_cap_released() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool",
        "trigger:\n  type: manual\nscope: gpu\ntimeout_secs: 3600\n",
        "set_power_limit(450);\nsleep(1800);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let id = run_id(&sim.fleet.engine.submit(manual("cool", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    sim.fleet.run_for(10).await.unwrap();
    for restart in 1..=3 {
        let interrupted = sim.fleet.restart_engine().await.unwrap();
        assert!(interrupted.is_empty(), "restart {restart}: {interrupted:?}");
        sim.fleet.run_for(10).await.unwrap();
        assert_eq!(cap_and_releases(&sim.fleet, &id).await, (450.0, 0), "restart {restart}");
        let run = sim.fleet.engine.run(&id).unwrap().unwrap();
        assert_eq!(run.state, RunState::Running, "restart {restart}: {run:?}");
    }
    let interrupted = sim.fleet.restart_engine().await.unwrap();
    assert_eq!(interrupted, vec![id.clone()]);
    let f = &sim.fleet;
    f.run_for(5).await.unwrap();
    let run = f.engine.run(&id).unwrap().unwrap();
    assert_eq!(run.outcome, Some(RunOutcome::Interrupted), "{run:?}");
    assert!(run.why.contains("resumed 3 times already"), "{}", run.why);
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 700.0, "released at last");
    assert!(f.engine.verify().unwrap().ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_across_three_engine_restarts_runs_once_per_cooldown() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 600\n",
        "set_power_limit(0, 500);\nsleep(10);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let started_at = now(&sim.fleet);
    let first = alert_payload("GpuHot", "n1", "fp-1", started_at, "firing");
    let f = &sim.fleet;
    f.engine.ingest_alertmanager(first.clone(), "alertmanager");
    f.run_for(30).await.unwrap();
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 1);
    for restart in 1..=3 {
        let interrupted = sim.fleet.restart_engine().await.unwrap();
        assert!(interrupted.is_empty(), "restart {restart}: {interrupted:?}");
        let f = &sim.fleet;
        // Alertmanager re-sends what it could not deliver while the engine
        // was down: the same alert (a duplicate) and, after a flap, the same
        // alert with a new start (a new episode inside the cooldown).
        let again = f.engine.ingest_alertmanager(first.clone(), "alertmanager");
        assert_eq!(again.duplicates, 1, "restart {restart}: the dedup set survived");
        let t = now(f);
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "firing"), "alertmanager");
        f.run_for(30).await.unwrap();
        let runs = f.engine.runs(&Default::default()).unwrap().runs;
        assert_eq!(runs.len(), 1, "restart {restart}: {runs:#?}");
    }
    let f = &sim.fleet;
    let recs = records(f);
    assert_eq!(recs.iter().filter(|r| r.kind == RecordKind::EngineStarted).count(), 3);
    let suppressed: Vec<_> = recs.iter().filter(|r| r.kind == RecordKind::TriggerSuppressed).collect();
    assert_eq!(suppressed.len(), 1, "suppressed once per episode, audited: {suppressed:#?}");
    assert!(suppressed[0].data["reason"].as_str().unwrap().contains("cooldown"), "{:?}", suppressed[0]);
    // After the cooldown the alert (firing again) runs again: one run per
    // cooldown, not one per restart.
    f.run_for(600).await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(runs.iter().all(|r| r.outcome == Some(RunOutcome::Succeeded)), "{runs:#?}");
    assert!(f.engine.verify().unwrap().ok);
}

/// "Resolved" is about one episode of an alert (its fingerprint and
/// startsAt), not the alert for ever: tomorrow's overheat on the same GPU
/// has the same fingerprint and a new startsAt, and runs — across a restart
/// too. (The resolved set used to be keyed by fingerprint alone: every later
/// firing was skipped as "the alert resolved".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_resolve_fire_again_runs_twice_across_a_restart() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 600\n",
        "set_power_limit(0, 500);\nsleep(10);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let first_start = now(f);
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-9", first_start, "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-9", first_start, "resolved"), "alertmanager");
    f.run_for(30).await.unwrap();
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    // The cooldown passes; the same GPU overheats again: a new episode.
    f.run_for(700).await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-9", now(f), "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    assert!(
        runs.iter().all(|r| r.outcome == Some(RunOutcome::Succeeded) && r.actions > 0),
        "the second episode ran, not skipped as resolved: {runs:#?}"
    );
    // The first episode's resolve still stops a late run of that episode.
    f.run_for(700).await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-9", first_start, "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let late: Vec<_> = runs.iter().filter(|r| r.actions > 0).collect();
    assert_eq!(late.len(), 2, "a replayed firing of the resolved episode does not act again: {runs:#?}");
    assert!(f.engine.verify().unwrap().ok);
}

/// An alert the webhook acknowledged (its `event_received` durable) whose
/// handling a crash cut off before any run was queued: the restarted engine
/// finishes it — the run is queued, then `event_handled` — and handles it
/// only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_alert_cut_off_by_a_crash_is_handled_after_the_restart() {
    use nightshift_engine::audit::NewRecord;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\nscope: gpu\ncooldown_secs: 600\n",
        "set_power_limit(500);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    // What the webhook leaves on the chain before it answers, and nothing
    // after it: the engine died there.
    let starts = nightshift_engine::embed::format_rfc3339_ms(now(f));
    let rec = NewRecord::new(
        RecordKind::EventReceived,
        "alertmanager:am",
        serde_json::json!({"source": "alertmanager", "acked": true, "posted_by": "am", "alertname": "GpuHot",
            "status": "firing", "fingerprint": "fp-cut", "starts_at": starts, "ends_at": "0001-01-01T00:00:00Z",
            "labels": {"alertname": "GpuHot", "Hostname": "n1", "gpu": "0"}, "annotations": {}}),
    )
    .node(Some("n1"))
    .gpu(Some(0));
    f.engine.audit().append(rec, None).await.unwrap();
    assert!(f.engine.runs(&Default::default()).unwrap().runs.is_empty());
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    f.run_for(30).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].event["fingerprint"], "fp-cut");
    assert_eq!(runs[0].outcome, Some(RunOutcome::Succeeded), "{runs:#?}");
    let handled = records(f).iter().filter(|r| r.kind == RecordKind::EventHandled).count();
    assert_eq!(handled, 1);
    // Handled: another restart does not handle it again.
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    f.run_for(700).await.unwrap();
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 1);
    assert!(f.engine.verify().unwrap().ok);
}

#[derive(Debug, Clone, Copy)]
enum Between {
    Nothing,
    EngineRestart,
    AgentRestart,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_capping_one_gpu_end_at_the_baseline_across_restarts() {
    for between in [Between::Nothing, Between::EngineRestart, Between::AgentRestart] {
        let rb = tempfile::tempdir().unwrap();
        // `trend` caps early and keeps its hold for two minutes after its
        // run; `overheat` caps harder while it watches, then ends.
        write_runbook(
            rb.path(),
            "trend",
            "trigger:\n  type: manual\nscope: gpu\n",
            "set_power_limit(500);\nkeep_holds(120);\n",
        );
        write_runbook(
            rb.path(),
            "overheat",
            "trigger:\n  type: manual\nscope: gpu\n",
            "set_power_limit(450);\nsleep(60);\n",
        );
        let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
        let f = &sim.fleet;
        let trend = run_id(&f.engine.submit(manual("trend", Target::gpu("n1", 0), "user:alice")).await.unwrap());
        until_finished(f, &trend, 10).await;
        f.run_for(10).await.unwrap();
        assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 500.0, "{between:?}");
        let overheat = run_id(&f.engine.submit(manual("overheat", Target::gpu("n1", 0), "user:alice")).await.unwrap());
        f.run_for(10).await.unwrap();
        let t = telemetry(f, "n1").await;
        assert_eq!(t.gpus[0].power_limit_watts, 450.0, "{between:?}: the most restrictive hold wins");
        assert_eq!(t.node_metrics.holds.len(), 2, "{between:?}");
        match between {
            Between::Nothing => {}
            Between::EngineRestart => {
                // The overheat run resumes (its 450 W hold stays on).
                let interrupted = sim.fleet.restart_engine().await.unwrap();
                assert!(interrupted.is_empty(), "{between:?}: {interrupted:?}");
                assert_eq!(telemetry(&sim.fleet, "n1").await.gpus[0].power_limit_watts, 450.0, "{between:?}");
            }
            Between::AgentRestart => {
                sim.fleet.restart_agent("n1").unwrap();
                assert_eq!(telemetry(&sim.fleet, "n1").await.node_metrics.holds.len(), 2, "holds survive");
            }
        }
        let f = &sim.fleet;
        f.run_for(70).await.unwrap();
        // The overheat run is over; the trend run's kept hold is in effect.
        let t = telemetry(f, "n1").await;
        assert_eq!(t.gpus[0].power_limit_watts, 500.0, "{between:?}: {:?}", t.node_metrics.holds);
        f.run_for(120).await.unwrap();
        let t = telemetry(f, "n1").await;
        assert_eq!(t.gpus[0].power_limit_watts, 700.0, "{between:?}: back at the baseline");
        assert!(t.node_metrics.holds.is_empty(), "{between:?}: {:?}", t.node_metrics.holds);
        // The audit shows both holds ending, each on its run's page.
        let ended: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::HoldEnded).collect();
        assert_eq!(ended.len(), 2, "{between:?}: {ended:#?}");
        let of = |run: &str| ended.iter().find(|r| r.run.as_deref() == Some(run)).unwrap_or_else(|| panic!("{run}"));
        assert_eq!(of(&overheat).data["how"], "released", "{between:?}");
        assert_eq!(of(&overheat).data["outcome"], "still_held", "{between:?}");
        assert_eq!(of(&trend).data["how"], "expired", "{between:?}");
        assert_eq!(of(&trend).data["outcome"], "restored", "{between:?}");
        assert_eq!(of(&trend).data["value"], "500 W", "{between:?}");
        assert!(f.engine.verify().unwrap().ok);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_never_gets_an_old_reply_replayed_as_applied() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "cap", "trigger:\n  type: manual\nscope: gpu\n", "set_power_limit(420);\nsleep(30);\n");
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    // The operator's nightly backup, taken before the first run.
    let backup = tempfile::tempdir().unwrap();
    sim.fleet.snapshot_engine(backup.path()).unwrap();
    let f = &sim.fleet;
    let first = run_id(&f.engine.submit(manual("cap", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    assert_eq!(until_finished(f, &first, 60).await.outcome, Some(RunOutcome::Succeeded));
    let first_action =
        f.engine.run_records(&first).unwrap().into_iter().find(|r| r.kind == RecordKind::ActionResult).unwrap();
    // The disk is lost; the backup is restored and the engine started on it.
    sim.fleet.restart_engine_from(backup.path()).await.unwrap();
    let f = &sim.fleet;
    assert!(f.engine.run(&first).unwrap().is_none(), "the backup predates the first run");
    let second = run_id(&f.engine.submit(manual("cap", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    assert_ne!(second, first, "run ids are unique across a backup restore");
    f.run_for(5).await.unwrap();
    // The GPU really is capped: the agent applied the new request.
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 420.0);
    let action =
        f.engine.run_records(&second).unwrap().into_iter().find(|r| r.kind == RecordKind::ActionResult).unwrap();
    assert_ne!(action.data["action_id"], first_action.data["action_id"]);
    assert_eq!(action.data["applied"], true, "{action:?}");
    assert_eq!(action.data["before"]["power_limit_watts"], 700.0, "{action:?}");
    let id = action.data["action_id"].as_str().unwrap().to_string();
    let lines = f.agent("n1").journal_lines();
    let pending = lines
        .iter()
        .filter(|l| matches!(l, nightshift_agent::journal::JournalLine::Pending { id: x, .. } if *x == id))
        .count();
    assert_eq!(pending, 1, "the agent executed the new request rather than replaying a reply");
    let done = until_finished(f, &second, 60).await;
    assert_eq!(done.outcome, Some(RunOutcome::Succeeded));
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 700.0);
}

/// Forwards everything; the reply to `set_power_limit` is lost on the way
/// back (the agent applied it and answered; the engine sees a broken
/// connection). With `unreachable`, the agent cannot be asked either.
struct LoseReply {
    inner: Arc<dyn AgentTransport>,
    unreachable_after: Arc<std::sync::atomic::AtomicBool>,
}

impl AgentTransport for LoseReply {
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>> {
        Box::pin(async move {
            let lose = matches!(req.op, Op::SetPowerLimit(_));
            let status = matches!(req.op, Op::ActionStatus(_));
            if status && self.unreachable_after.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ClientError::Connect { addr: "n1".into(), message: "unreachable".into() });
            }
            let r = self.inner.call(req).await;
            if lose {
                return Err(ClientError::Channel {
                    addr: "n1".into(),
                    message: "connection reset before the reply".into(),
                });
            }
            r
        })
    }
}

/// Regression (issue 26 item 6): the agent applied a cap and its reply was
/// lost; the run "succeeded" with no holds left and the cap stayed until its
/// lease. Now the engine asks the agent's journal for the reply it sent, and
/// the run's end releases by owner wherever a change may hold — so the GPU
/// is back at its baseline when the run ends, with the agent asked or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_asked_for_and_the_runs_hold_ends_with_the_run() {
    for asked in [true, false] {
        let rb = tempfile::tempdir().unwrap();
        write_runbook(
            rb.path(),
            "cap",
            "trigger:\n  type: manual\nscope: gpu\n",
            "set_power_limit(420);\nsleep(30);\n",
        );
        let unreachable = Arc::new(std::sync::atomic::AtomicBool::new(!asked));
        let u2 = unreachable.clone();
        let sim = start(vec![node("n1", "h100-sxm")], rb.path(), move |o| {
            o.wrap_transport = Some(Box::new(move |_, inner| {
                Arc::new(LoseReply { inner, unreachable_after: u2.clone() }) as Arc<dyn AgentTransport>
            }))
        })
        .await;
        let f = &sim.fleet;
        let id = run_id(&f.engine.submit(manual("cap", Target::gpu("n1", 0), "user:alice")).await.unwrap());
        f.run_for(5).await.unwrap();
        assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 420.0, "asked {asked}: the agent applied it");
        let done = until_finished(f, &id, 120).await;
        let recs = f.engine.run_records(&id).unwrap();
        let result = recs
            .iter()
            .find(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "set_power_limit")
            .unwrap_or_else(|| panic!("asked {asked}: no result: {recs:#?}"));
        assert_eq!(result.data["reply_lost"], true, "{result:?}");
        if asked {
            assert_eq!(result.data["agent_status"]["state"], "done", "{result:?}");
            assert_eq!(result.data["applied"], true, "the agent's own reply is taken: {result:?}");
            assert_eq!(done.outcome, Some(RunOutcome::Succeeded), "{done:?}");
        } else {
            assert_eq!(result.data["agent_status"]["state"], "unreachable", "{result:?}");
        }
        let t = telemetry(f, "n1").await;
        assert!(
            t.node_metrics.holds.is_empty(),
            "asked {asked}: the run's hold ended with it: {:?}",
            t.node_metrics.holds
        );
        assert_eq!(t.gpus[0].power_limit_watts, 700.0, "asked {asked}: back at the baseline: {done:?}");
        assert!(f.engine.verify().unwrap().ok);
    }
}

/// Issue 46 point 3, through the engine: a run's cap is lost to a GPU
/// reset (the device back at its default). The agent applies it again at
/// its next read-back, and the engine audits that once, on the run, with
/// the reading — across an engine restart too. A person's own value on a
/// held setting is audited once as `hold_drifted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_lost_to_a_gpu_reset_is_applied_again_and_audited_on_its_run() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "trend",
        "trigger:\n  type: manual\nscope: gpu\n",
        "set_power_limit(500);\nkeep_holds(3600);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("trend", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    until_finished(f, &id, 10).await;
    f.run_for(5).await.unwrap();
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 500.0);
    f.sim("n1").inject(&nightshift_proto::SimFault::GpuReset { gpu: 0 }).unwrap();
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 700.0);
    f.run_for(65).await.unwrap();
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 500.0, "applied again");
    let reapplied = |f: &nightshift_sim::fleet::SimFleet| {
        records(f).into_iter().filter(|r| r.kind == RecordKind::HoldReapplied).collect::<Vec<_>>()
    };
    let r = reapplied(f);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].run.as_deref(), Some(id.as_str()), "on the run that placed the hold");
    assert_eq!((r[0].data["found"].as_str(), r[0].data["applied"].as_str()), (Some("700 W"), Some("500 W")));
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    f.run_for(30).await.unwrap();
    assert_eq!(reapplied(f).len(), 1, "audited once, across the restart");
    // A person sets their own value: not in force, audited once.
    nightshift_agent::backend::Backend::set_power_limit(f.sim("n1"), 0, 600.0).unwrap();
    f.run_for(130).await.unwrap();
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 600.0, "a person's value is left alone");
    let drifted: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::HoldDrifted).collect();
    assert_eq!(drifted.len(), 1, "{drifted:#?}");
    assert!(drifted[0].data["why"].as_str().unwrap().contains("the device now has 600 W"), "{:?}", drifted[0].data);
    assert!(f.engine.verify().unwrap().ok);
}

/// Invariant 18, the gate: a new engine knows nothing of its nodes; a run it
/// resumes waits for the node's inventory and a reading of its own before
/// its script starts, and a window it reads (here 300 s) only once this
/// engine has observed all of it — the cap stays in force meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_waits_for_readings_of_its_own_and_judges_only_windows_it_observed() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool",
        "trigger:\n  type: manual\nscope: gpu\ntimeout_secs: 3600\n",
        "let g = gpu();\nif g.name == () { throw \"judged a GPU it has no inventory of\"; }\n\
         set_power_limit(450);\nsleep(60);\n\
         let t = metric_max(\"gpu.temperature_c\", 300);\nif t == () { throw \"no readings\"; }\nnote(`judged over 300 s: ${t}`);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let id = run_id(&sim.fleet.engine.submit(manual("cool", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    sim.fleet.run_for(10).await.unwrap();
    assert_eq!(cap_and_releases(&sim.fleet, &id).await, (450.0, 0));
    let interrupted = sim.fleet.restart_engine().await.unwrap();
    assert!(interrupted.is_empty(), "{interrupted:?}");
    let restarted_ms = nightshift_proto::clock::Clock::now_ms(&sim.fleet.clock);
    let f = &sim.fleet;
    // Nothing from the node yet: queued, saying what it waits for.
    let run = f.engine.run(&id).unwrap().unwrap();
    assert_eq!(run.state, RunState::Queued, "{run:?}");
    let waits = f.engine.active_runs().join("; ");
    assert!(waits.contains("resumed after a restart: waits for this engine's inventory of n1"), "{waits}");
    f.run_for(200).await.unwrap();
    assert_eq!(cap_and_releases(f, &id).await, (450.0, 0), "the cap stays while the window fills");
    let end = until_finished(f, &id, 600).await;
    assert_eq!(end.outcome, Some(RunOutcome::Succeeded), "{end:?}");
    let judged = f
        .engine
        .run_records(&id)
        .unwrap()
        .into_iter()
        .find(|r| r.kind == RecordKind::Note && r.data["text"].as_str().is_some_and(|t| t.starts_with("judged")))
        .expect("the resumed run judged its window");
    assert!(
        judged.ts_ms - restarted_ms >= 300_000,
        "judged {} s after the restart, before this engine had observed 300 s",
        (judged.ts_ms - restarted_ms) / 1000
    );
    assert!(f.engine.verify().unwrap().ok);
}

/// Invariant 18, the end: a resumed script that fails keeps its holds (it
/// could not decide; a person does), is recorded as failed after resume,
/// pages once, and starts no cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_that_fails_keeps_its_holds_and_pages_once() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool",
        "trigger:\n  type: manual\nscope: gpu\ntimeout_secs: 3600\n",
        "if target.resumed > 0 { throw \"cannot tell after a restart\"; }\nset_power_limit(450);\nsleep(1800);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let id = run_id(&sim.fleet.engine.submit(manual("cool", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    sim.fleet.run_for(10).await.unwrap();
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    let end = until_finished(f, &id, 120).await;
    assert_eq!(end.outcome, Some(RunOutcome::Failed), "{end:?}");
    assert!(end.why.contains("failed after resume") && end.why.contains("cannot tell"), "{}", end.why);
    f.run_for(600).await.unwrap();
    assert_eq!(cap_and_releases(f, &id).await, (450.0, 0), "the cap outlives the failed resume");
    let recs = f.engine.run_records(&id).unwrap();
    let pages = recs.iter().filter(|r| r.kind == RecordKind::Escalation).count();
    assert_eq!(pages, 1, "one page: {:?}", kinds(&recs, &id));
    let finished = recs.iter().find(|r| r.kind == RecordKind::RunFinished).unwrap();
    assert_eq!(finished.data["starts_cooldown"], false, "{finished:?}");
    assert!(finished.data["holds_kept"].as_array().is_some_and(|k| !k.is_empty()), "{finished:?}");
    assert!(f.engine.verify().unwrap().ok);
}

/// A node that never reports to the new engine: the resumed run waits
/// `limits.resume_wait_secs`, then ends failed — its holds not released —
/// and a person is paged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_whose_node_never_reports_ends_failed_without_releasing() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool",
        "trigger:\n  type: manual\nscope: gpu\ntimeout_secs: 3600\n",
        "set_power_limit(450);\nsleep(1800);\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |o| o.limits.resume_wait_secs = 120).await;
    let id = run_id(&sim.fleet.engine.submit(manual("cool", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    sim.fleet.run_for(10).await.unwrap();
    // The node's network goes as the engine restarts.
    sim.fleet.power.lock().unwrap().get_mut("n1").unwrap().0 = nightshift_sim::fleet::Power::Off;
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    let end = until_finished(f, &id, 300).await;
    assert_eq!(end.outcome, Some(RunOutcome::Failed), "{end:?}");
    assert!(end.why.contains("limits.resume_wait_secs"), "{}", end.why);
    let recs = f.engine.run_records(&id).unwrap();
    assert_eq!(recs.iter().filter(|r| r.kind == RecordKind::Escalation).count(), 1);
    assert!(!recs.iter().any(|r| r.data["op"] == "release"), "nothing released");
    // Back on the network: the cap is still there.
    f.power.lock().unwrap().get_mut("n1").unwrap().0 = nightshift_sim::fleet::Power::On;
    assert_eq!(telemetry(f, "n1").await.gpus[0].power_limit_watts, 450.0);
}
