//! Executor rules in virtual time: dedup and cooldown, exclusive runs,
//! attempt budgets, blast radius under racing runs, approvals, dry runs,
//! stale events.

use std::collections::BTreeSet;

use crate::common::*;
use nightshift_engine::api::{Cancel, EngineApi, HandsOff, NewWindow, Reason, SetFleetMode};
use nightshift_engine::audit::RecordKind;
use nightshift_engine::engine::Submitted;
use nightshift_engine::runs::{RunOutcome, RunState, Target};
use nightshift_proto::{NoArgs, Op, Request, Telemetry};
use nightshift_sim::fleet::SimNodeSpec;

const HOT_ALERT: &str = "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 300\n";
/// `GpuHot` on a node, no cooldown: every new alert may start a run.
const HOT_ANY_TIME: &str = "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 0\n";

async fn power_limit(sim: &nightshift_sim::fleet::SimFleet, node: &str, gpu: usize) -> f64 {
    let r = sim.agent(node).handle(Request::new("probe", Op::Telemetry(NoArgs {}))).await;
    let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
    t.gpus[gpu].power_limit_watts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_alert_a_hundred_times_starts_one_run() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ALERT, "sleep(30);\nset_power_limit(0, 500);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    // 100 deliveries of one alert (HA pair, retries): 99 are duplicates.
    let t = now(f);
    let mut dups = 0;
    for _ in 0..100 {
        let d =
            f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "firing"), "alertmanager").duplicates;
        dups += d;
    }
    assert_eq!(dups, 99);
    // 100 distinct alerts for the same node while the run is active or
    // cooling down: suppressed.
    for i in 0..100 {
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", &format!("fp-x{i}"), t, "firing"), "alertmanager");
        if i % 10 == 0 {
            f.step().await.unwrap();
        }
    }
    f.run_for(120).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].outcome, Some(RunOutcome::Succeeded));
    let recs = records(f);
    let received = recs.iter().filter(|r| r.kind == RecordKind::EventReceived).count();
    assert_eq!(received, 101, "each distinct alert is recorded once");
    // Each distinct alert the active run held back says so, once (not
    // once per delivery), naming the run: 100 acknowledged alerts, 100
    // answers on the chain to "what did it lead to".
    let held: BTreeSet<String> = recs
        .iter()
        .filter(|r| r.kind == RecordKind::TriggerSuppressed)
        .inspect(|r| assert_eq!(r.run.as_deref(), Some(runs[0].id.as_str()), "{r:?}"))
        .map(|r| r.data["event"]["fingerprint"].as_str().unwrap_or_default().to_string())
        .collect();
    let suppressed = recs.iter().filter(|r| r.kind == RecordKind::TriggerSuppressed).count();
    assert_eq!((suppressed, held.len()), (100, 100), "one note per distinct alert held back: {held:?}");
    // After the cooldown a new alert runs again.
    f.run_for(300).await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-late", now(f), "firing"), "alertmanager");
    f.run_for(60).await.unwrap();
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 2);
}

/// One runbook, both kinds of start (`alert_triggers:` beside a telemetry
/// trigger): the alert starts it; the telemetry trigger that fires a minute
/// later finds the cooldown running and is suppressed, and so is the alert
/// on a node whose telemetry started it first. A row never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_trigger_and_a_telemetry_trigger_share_one_run() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "both",
        "trigger:\n  type: threshold\n  metric: node.drained\n  below: 1\n  for_secs: 60\n\
         alert_triggers: [{alertname: NodeHot}]\nscope: node\ncooldown_secs: 600\n",
        "note(\"started\");\n",
    );
    let sim = start(vec![node("n1", "h100-sxm"), node("n2", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    f.engine.ingest_alertmanager(alert_payload("NodeHot", "n1", "fp-n1", now(f), "firing"), "alertmanager");
    f.run_for(5).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!((runs[0].trigger.as_str(), runs[0].target.node.as_deref()), ("alert", Some("n1")));
    // A minute on, the telemetry trigger fires on both nodes: n2 runs, n1 is cooling down.
    f.run_for(120).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let mut got: Vec<(String, String)> =
        runs.iter().map(|r| (r.target.node.clone().unwrap_or_default(), r.trigger.clone())).collect();
    got.sort();
    assert_eq!(got, [("n1".to_string(), "alert".to_string()), ("n2".to_string(), "threshold".to_string())]);
    // The alert for n2 now: suppressed, not a second run.
    f.engine.ingest_alertmanager(alert_payload("NodeHot", "n2", "fp-n2", now(f), "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 2);
    let suppressed: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::TriggerSuppressed).collect();
    assert!(suppressed.iter().any(|r| r.node.as_deref() == Some("n1")), "{suppressed:#?}");
    assert!(suppressed.iter().any(|r| r.node.as_deref() == Some("n2")), "{suppressed:#?}");
}

/// An alert's "resolved" lands on the run its episode started: a note on
/// the run (audited as Alertmanager), whatever the run's outcome; another
/// episode's resolution does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolved_alert_is_noted_on_its_run() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ALERT, "note(\"looked\");\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let t = now(f);
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let run = f.engine.runs(&Default::default()).unwrap().runs.remove(0);
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded));
    // Another episode of the same alert (an older startsAt) resolves: not this run's.
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t - 600_000, "resolved"), "alertmanager");
    f.run_for(2).await.unwrap();
    let resolved = |f: &nightshift_sim::fleet::SimFleet| {
        f.engine
            .run_records(&run.id)
            .unwrap()
            .into_iter()
            .filter(|r| r.data.get("alert_resolved").is_some())
            .collect::<Vec<_>>()
    };
    assert!(resolved(f).is_empty());
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "resolved"), "alertmanager");
    f.run_for(2).await.unwrap();
    let notes = resolved(f);
    assert_eq!(notes.len(), 1, "{notes:#?}");
    assert_eq!(notes[0].kind, RecordKind::Note);
    assert_eq!(notes[0].actor, "alertmanager:alertmanager");
    assert!(notes[0].data["text"].as_str().unwrap().starts_with("alert GpuHot resolved"), "{:?}", notes[0].data);
    assert!(f.engine.verify().unwrap().ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_events_are_dropped_and_audited() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", &format!("{HOT_ALERT}max_event_age_secs: 120\n"), "set_power_limit(0, 500);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "old", now(f) - 3_600_000, "firing"), "alertmanager");
    f.run_for(5).await.unwrap();
    assert!(f.engine.runs(&Default::default()).unwrap().runs.is_empty());
    let dropped: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::EventDropped).collect();
    assert_eq!(dropped.len(), 1);
    assert!(dropped[0].data["reason"].as_str().unwrap().contains("is 3600 s old (max_event_age_secs 120)"));
    assert_eq!(power_limit(f, "n1", 0).await, 700.0);
    // Unknown hosts are dropped too.
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "nobody", "x", now(f), "firing"), "alertmanager");
    f.run_for(2).await.unwrap();
    let dropped: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::EventDropped).collect();
    assert!(dropped[1].data["reason"].as_str().unwrap().contains("not in the inventory"));
    // A host label that is no node name (a path, markup) is refused as such.
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "../../etc", "y", now(f), "firing"), "alertmanager");
    f.run_for(2).await.unwrap();
    let dropped: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::EventDropped).collect();
    let reason = dropped[2].data["reason"].as_str().unwrap();
    assert!(
        reason.contains("its host label is no node name: node name \"../../etc\": expected only letters, digits, '.', '-' or '_', found '/'"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_runs_wait_for_each_other_and_the_rest_overlap() {
    let rb = tempfile::tempdir().unwrap();
    let manual = "trigger:\n  type: manual\nscope: node\n";
    let exclusive = format!("{manual}exclusive: true\n");
    write_runbook(rb.path(), "first", &exclusive, "set_power_limit(0, 600);\nsleep(120);\n");
    write_runbook(rb.path(), "second", &exclusive, "set_power_limit(0, 500);\nsleep(10);\n");
    write_runbook(rb.path(), "third", manual, "set_power_limit(0, 550);\nsleep(30);\n");
    let sim = start(vec![node("n1", "h100-sxm"), node("n2", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let a = run_id(&f.engine.submit(manual_req("first", "n1")).await.unwrap());
    f.step().await.unwrap();
    let b = run_id(&f.engine.submit(manual_req("second", "n1")).await.unwrap());
    let c = run_id(&f.engine.submit(manual_req("second", "n2")).await.unwrap());
    let d = run_id(&f.engine.submit(manual_req("third", "n1")).await.unwrap());
    f.run_for(5).await.unwrap();
    assert_eq!(f.engine.run(&b).unwrap().unwrap().state, RunState::Queued, "n1 is held by the first exclusive run");
    assert_eq!(f.engine.run(&d).unwrap().unwrap().state, RunState::Running, "a non-exclusive run overlaps");
    assert_eq!(power_limit(f, "n1", 0).await, 550.0, "the lowest hold wins");
    let rc = until_finished(f, &c, 60).await;
    assert_eq!(rc.outcome, Some(RunOutcome::Succeeded), "n2 is free");
    let ra = until_finished(f, &a, 300).await;
    let rb_ = until_finished(f, &b, 300).await;
    assert!(rb_.started_ms.unwrap() >= ra.finished_ms.unwrap());
    let started = f.engine.run_records(&b).unwrap().into_iter().find(|r| r.kind == RecordKind::RunStarted).unwrap();
    assert!(
        started.data["waited_for"].as_str().unwrap_or("").contains(&format!("run {a}, exclusive on n1")),
        "a queued run says what it waited for: {}",
        started.data
    );
    assert_eq!(power_limit(f, "n1", 0).await, 700.0, "every hold released: the baseline is back");
    assert!(rb_.why.contains("every hold released, baselines restored"), "{}", rb_.why);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_past_its_event_age_is_skipped_not_acted() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "long",
        "trigger:\n  type: manual\nscope: node\nexclusive: true\n",
        "set_power_limit(0, 600);\nsleep(300);\n",
    );
    write_runbook(
        rb.path(),
        "hot",
        &format!("{HOT_ALERT}exclusive: true\nmax_event_age_secs: 60\n"),
        "set_power_limit(0, 450);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let long = run_id(&f.engine.submit(manual_req("long", "n1")).await.unwrap());
    f.step().await.unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.run_for(5).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let hot = runs.iter().find(|r| r.runbook == "hot").expect("the alert queued a run");
    assert_eq!(hot.state, RunState::Queued, "behind the exclusive run");
    let hot_id = hot.id.clone();
    until_finished(f, &long, 400).await;
    let r = until_finished(f, &hot_id, 30).await;
    assert_eq!(r.outcome, Some(RunOutcome::Skipped), "{r:?}");
    assert!(r.why.contains("max_event_age_secs 60"), "the reason says why: {}", r.why);
    let recs = f.engine.run_records(&hot_id).unwrap();
    assert!(!recs.iter().any(|r| r.kind == RecordKind::ActionIntent), "a stale run sends nothing: {recs:#?}");
    assert_eq!(power_limit(f, "n1", 0).await, 700.0);
}

fn manual_req(runbook: &str, node: &str) -> nightshift_engine::engine::RunRequest {
    manual(runbook, Target::node(node), "user:alice")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_budget_refuses_and_escalates() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", &format!("{HOT_ANY_TIME}max_attempts_per_day: 2\n"), "set_power_limit(0, 600);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    for i in 0..4 {
        f.engine
            .ingest_alertmanager(alert_payload("GpuHot", "n1", &format!("fp{i}"), now(f), "firing"), "alertmanager");
        f.run_for(5).await.unwrap();
    }
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let outcomes: Vec<_> = runs.iter().rev().map(|r| r.outcome).collect();
    use RunOutcome::{Refused, Succeeded};
    assert_eq!(outcomes, vec![Some(Succeeded), Some(Succeeded), Some(Refused), Some(Refused)]);
    assert!(runs[1].error.as_ref().unwrap().contains("attempt budget spent: 2 runs of hot on n1 in the last 24 h"));
    let kinds = |run: &str, kind| f.engine.run_records(run).unwrap().into_iter().filter(|r| r.kind == kind).count();
    assert_eq!(kinds(&runs[1].id, RecordKind::Escalation), 1, "the first refusal pages");
    // The same refusal again (issue 42 point 7: a page needs a reason, one
    // per node and finding): a note on the run, not a second page.
    assert_eq!(kinds(&runs[0].id, RecordKind::Escalation), 0, "the second refusal pages no one");
    let notes: Vec<String> = f
        .engine
        .run_records(&runs[0].id)
        .unwrap()
        .into_iter()
        .filter_map(|r| r.payload::<nightshift_engine::audit::data::Note>().ok())
        .map(|n| n.text)
        .collect();
    assert!(notes.iter().any(|t| t.starts_with("already paged (audit #")), "{notes:?}");
}

/// Issue 42 point 7: a run that decided there was nothing to do (it
/// succeeded, changed nothing, told nobody) spends no attempt budget — six
/// no-op runs under a budget of two are never refused and page no one,
/// before and after a restart (the refund is on the chain). One that tells a
/// person still spends it, and its refusals page once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_decides_there_is_nothing_to_do_spends_no_budget() {
    for (script, refused) in [("note(\"within threshold: nothing to do\");\n", 0), ("notify(\"look at it\");\n", 4)] {
        let rb = tempfile::tempdir().unwrap();
        write_runbook(rb.path(), "hot", &format!("{HOT_ANY_TIME}max_attempts_per_day: 2\n"), script);
        // Every notice is said (a finding said again is otherwise a note,
        // and a run that only repeats itself did nothing either).
        let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |o| o.notifications.remind_after_secs = 0).await;
        for i in 0..6 {
            if i == 3 {
                sim.fleet.restart_engine().await.unwrap();
            }
            let f = &sim.fleet;
            f.engine.ingest_alertmanager(
                alert_payload("GpuHot", "n1", &format!("fp{i}"), now(f), "firing"),
                "alertmanager",
            );
            f.run_for(5).await.unwrap();
        }
        let f = &sim.fleet;
        let runs = f.engine.runs(&Default::default()).unwrap().runs;
        let n = runs.iter().filter(|r| r.outcome == Some(RunOutcome::Refused)).count();
        assert_eq!((runs.len(), n), (6, refused), "{script}: {runs:#?}");
        let escalations = records(f).iter().filter(|r| r.kind == RecordKind::Escalation).count();
        // The four refusals are one finding on one node: one page, before
        // and after the restart (the outbox is rebuilt from the chain).
        assert_eq!(escalations, refused.min(1), "{script}: one page for the refusals, none for a no-op");
    }
}

/// A run skipped before it changed anything — its alert resolved while the
/// breaker held it — spends no attempt budget either: six such runs under a
/// budget of two are never refused and page no one, and a seventh whose
/// alert keeps firing still acts. (Before, the third fire was refused and
/// paged "attempt budget spent" for runs that had done nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_skipped_before_it_acts_spends_no_budget() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        &format!(
            "{HOT_ANY_TIME}max_attempts_per_day: 2\nbreaker: {{max_targets: 99, window_secs: 60, hold_secs: 10}}\n"
        ),
        "set_power_limit(0, 600);\nkeep_holds(600);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    for i in 0..6 {
        let at = now(f);
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", &format!("fp{i}"), at, "firing"), "alertmanager");
        f.run_for(2).await.unwrap();
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", &format!("fp{i}"), at, "resolved"), "alertmanager");
        f.run_for(15).await.unwrap();
    }
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp6", now(f), "firing"), "alertmanager");
    f.run_for(20).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let outcomes: Vec<_> = runs.iter().rev().map(|r| r.outcome).collect();
    let mut want = vec![Some(RunOutcome::Skipped); 6];
    want.push(Some(RunOutcome::Succeeded));
    assert_eq!(outcomes, want, "{runs:#?}");
    assert_eq!(power_limit(f, "n1", 0).await, 600.0, "the seventh run acted");
    let escalations = records(f).iter().filter(|r| r.kind == RecordKind::Escalation).count();
    assert_eq!(escalations, 0, "no page for runs that did nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blast_radius_holds_with_fifty_runs_racing() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "drain-it",
        "trigger:\n  type: alert\n  alertname: XidStorm\nscope: node\nmax_concurrent: 64\nblast_radius: {max_drained_pct: 10, max_per_group: 2, group_by: rack}\n",
        "let r = drain(\"test storm\");\nif !r.ok { escalate(r.error); } else { keep_holds(3600); }\n",
    );
    let nodes: Vec<_> = (0..50)
        .map(|i| {
            let mut n = node(&format!("n{i:02}"), "h100-sxm");
            n.gpus = 1;
            n.labels.insert("rack".into(), format!("r{}", i % 3));
            n
        })
        .collect();
    let sim = start(nodes, rb.path(), |o| o.limits.max_concurrent_runs = 64).await;
    let f = &sim.fleet;
    for i in 0..50 {
        f.engine.ingest_alertmanager(
            alert_payload("XidStorm", &format!("n{i:02}"), &format!("fp{i}"), now(f), "firing"),
            "alertmanager",
        );
    }
    f.run_for(30).await.unwrap();
    let runs =
        f.engine.runs(&nightshift_engine::audit::RunFilter { limit: Some(100), ..Default::default() }).unwrap().runs;
    assert_eq!(runs.len(), 50);
    let drained: Vec<_> = f.engine.nodes().into_iter().filter(|n| n.state.drained).collect();
    assert_eq!(drained.len(), 5, "10% of 50: {:?}", drained.iter().map(|n| &n.name).collect::<Vec<_>>());
    for rack in ["r0", "r1", "r2"] {
        let in_rack = drained.iter().filter(|n| n.labels["rack"] == rack).count();
        assert!(in_rack <= 2, "rack {rack}: {in_rack} drained");
    }
    let refusals =
        records(f).into_iter().filter(|r| r.kind == RecordKind::Refusal && r.data["code"] == "blast_radius").count();
    assert_eq!(refusals, 45);
    // Ground truth on the agents.
    let mut agent_drained = 0;
    for i in 0..50 {
        let r = f.agent(&format!("n{i:02}")).handle(Request::new("p", Op::Telemetry(NoArgs {}))).await;
        let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
        agent_drained += t.node_metrics.drained as usize;
    }
    assert_eq!(agent_drained, 5);
}

/// `drain_nodes` sends its drains 32 at a time: the blast radius must hold
/// as exactly as when one run drains one node after another, each refused
/// node says why, and a large group's answer fits the script's size limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_run_draining_six_hundred_nodes_at_once_keeps_the_blast_radius() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "drain-pool",
        "trigger:\n  type: manual\nscope: group\nblast_radius: {max_drained_pct: 10, max_per_group: 2, group_by: rack}\n",
        "let rs = drain_nodes(group_nodes(), \"pool storm\");\nfor c in rs.codes { if c != \"blast_radius\" { fail(rs.errors[c]); } }\nnote(`drained ${rs.ok.len()} of ${rs.ok.len() + rs.refused.len()}`);\nkeep_holds(3600);\n",
    );
    let nodes: Vec<_> = (0..600)
        .map(|i| {
            let mut n = node(&format!("n{i:03}"), "h100-sxm");
            n.gpus = 1;
            n.labels.insert("rack".into(), format!("r{}", i % 20));
            n.labels.insert("pool".into(), "a".into());
            n
        })
        .collect();
    let sim = start(nodes, rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("drain-pool", Target::group("pool", "a"), "user:alice")).await.unwrap());
    let r = until_finished(f, &id, 120).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{r:?}");
    let notes: Vec<String> = f
        .engine
        .run_records(&id)
        .unwrap()
        .into_iter()
        .filter(|x| x.kind == RecordKind::Note)
        .filter_map(|x| x.data["text"].as_str().map(str::to_string))
        .collect();
    assert!(notes.iter().any(|n| n == "drained 40 of 600"), "{notes:?}");
    let drained: Vec<_> = f.engine.nodes().into_iter().filter(|n| n.state.drained).collect();
    assert_eq!(
        drained.len(),
        40,
        "2 in each of 20 racks (10% would be 60): {:?}",
        drained.iter().map(|n| &n.name).collect::<Vec<_>>()
    );
    for rack in 0..20 {
        let rack = format!("r{rack}");
        assert_eq!(drained.iter().filter(|n| n.labels["rack"] == rack).count(), 2, "rack {rack}");
    }
    let run_records = f.engine.run_records(&id).unwrap();
    let refusals = run_records.iter().filter(|x| x.kind == RecordKind::Refusal && x.data["code"] == "blast_radius");
    assert_eq!(refusals.count(), 560);
    // Every drain sent was audited as an intent first.
    let intents = run_records.iter().filter(|x| x.kind == RecordKind::ActionIntent && x.data["op"] == "drain").count();
    assert_eq!(intents, 40);
    let mut agent_drained = 0;
    for i in 0..600 {
        let r = f.agent(&format!("n{i:03}")).handle(Request::new("p", Op::Telemetry(NoArgs {}))).await;
        let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
        agent_drained += t.node_metrics.drained as usize;
    }
    assert_eq!(agent_drained, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_flow() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "careful",
        "trigger:\n  type: manual\nscope: node\napproval: {always: true, expire_secs: 600}\n",
        "set_power_limit(0, 450);\nsleep(60);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let e = &f.engine;
    // Approved by someone else: runs.
    let s = e.submit(manual_req("careful", "n1")).await.unwrap();
    assert!(matches!(s, Submitted::PendingApproval { .. }), "{s:?}");
    let id = run_id(&s);
    f.run_for(30).await.unwrap();
    assert_eq!(power_limit(f, "n1", 0).await, 700.0, "nothing happens while pending");
    assert_eq!(person(e).approvals().await.unwrap().len(), 1);
    let err = as_user(e, "alice").approve(&id).await.unwrap_err();
    assert!(err.to_string().contains("someone else must approve it"), "{err}");
    as_user(e, "bob").approve(&id).await.unwrap();
    f.run_for(5).await.unwrap();
    assert_eq!(power_limit(f, "n1", 0).await, 450.0);
    let r = until_finished(f, &id, 120).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded));
    assert_eq!(r.approvals[0].by, "user:bob");
    // Rejected: cancelled with the reason.
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    as_user(e, "bob").reject(&id, Reason { reason: "not during the training run".into() }).await.unwrap();
    let r = e.run(&id).unwrap().unwrap();
    assert_eq!(r.outcome, Some(RunOutcome::Cancelled));
    assert!(r.why.contains("rejected by user:bob: not during the training run"), "{}", r.why);
    // Nobody answers: it expires.
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    f.run_for(601).await.unwrap();
    let r = e.run(&id).unwrap().unwrap();
    assert_eq!(r.outcome, Some(RunOutcome::Cancelled));
    assert!(r.why.contains("approval expired"), "{}", r.why);
    let kinds: Vec<_> = e.run_records(&id).unwrap().iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        vec![RecordKind::RunQueued, RecordKind::ApprovalRequested, RecordKind::Notification, RecordKind::RunFinished]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_send_only_dry_run_actions() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "everything",
        "trigger:\n  type: manual\nscope: gpu\n",
        "let a = set_power_limit(450);\nlet b = drain(\"dry\");\nlet c = flush_caches();\nif a.outcome != \"dry_run\" { fail(`got ${a.outcome}`); }\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let mut req = manual("everything", Target::gpu("n1", 1), "user:alice");
    req.dry_run = true;
    let id = run_id(&f.engine.submit(req).await.unwrap());
    let r = until_finished(f, &id, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{r:?}");
    assert!(r.dry_run);
    let recs = f.engine.run_records(&id).unwrap();
    let intents: Vec<_> = recs.iter().filter(|r| r.kind == RecordKind::ActionIntent).collect();
    assert_eq!(intents.len(), 3);
    assert!(intents.iter().all(|r| r.data["dry_run"] == true));
    assert!(recs.iter().filter(|r| r.kind == RecordKind::ActionResult).all(|r| r.data["outcome"] == "dry_run"));
    assert_eq!(power_limit(f, "n1", 1).await, 700.0);
    assert!(!f.engine.node("n1").unwrap().state.drained);
}

/// Regression (issue 27 item 1, reproduced before the fix: the node was
/// drained by `a-drain`'s script, recorded under `needs-approval`): a run is
/// bound to its runbook's name and digest at admission. A reload that
/// reorders the set changes nothing — the approved run runs the script it
/// was approved as; one that changes the runbook, or removes it, refuses
/// the run with a record saying why instead of running something else or
/// stranding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_runs_the_runbook_it_approved_or_is_refused() {
    let rb = tempfile::tempdir().unwrap();
    let careful = "trigger:\n  type: manual\nscope: node\napproval: {always: true, expire_secs: 600}\n";
    write_runbook(rb.path(), "needs-approval", careful, "set_power_limit(0, 450);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let e = &f.engine;
    let reload = |e: &nightshift_engine::engine::Engine| {
        let script = std::sync::Arc::new(nightshift_engine::embed::build_engine(&Default::default()));
        let set = nightshift_engine::embed::load_dir(rb.path(), &script);
        assert!(set.errors.is_empty(), "{:?}", set.errors);
        e.replace_runbooks(set);
    };

    // 1. A reload adds a runbook that sorts first: the approval still runs
    //    `needs-approval`'s script.
    let id = run_id(&e.submit(manual_req("needs-approval", "n1")).await.unwrap());
    let digest = e.run(&id).unwrap().unwrap().runbook_digest.expect("the digest is recorded at admission");
    write_runbook(rb.path(), "a-drain", "trigger:\n  type: manual\nscope: node\n", "drain(\"reordered\");\n");
    reload(e);
    as_user(e, "bob").approve(&id).await.unwrap();
    let r = until_finished(f, &id, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{r:?}");
    assert_eq!(power_limit(f, "n1", 0).await, 700.0, "capped then released at the end");
    let ops: Vec<String> = e
        .run_records(&id)
        .unwrap()
        .iter()
        .filter(|x| x.kind == RecordKind::ActionIntent)
        .map(|x| x.data["op"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(ops.first().map(String::as_str), Some("set_power_limit"), "{ops:?}");
    assert!(!ops.iter().any(|o| o == "drain"), "another runbook's script ran: {ops:?}");

    // 2. The runbook changes while the run waits: refused, with why.
    let id = run_id(&e.submit(manual_req("needs-approval", "n1")).await.unwrap());
    assert_eq!(e.run(&id).unwrap().unwrap().runbook_digest.as_deref(), Some(digest.as_str()));
    write_runbook(rb.path(), "needs-approval", careful, "set_power_limit(0, 300);\n");
    reload(e);
    as_user(e, "bob").approve(&id).await.unwrap();
    let r = until_finished(f, &id, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Refused), "{r:?}");
    assert!(r.why.contains("changed since this run was admitted"), "{}", r.why);
    let fin = e.run_records(&id).unwrap().into_iter().find(|x| x.kind == RecordKind::RunFinished).unwrap();
    assert!(fin.data.to_string().contains("changed since this run was admitted"), "{fin:?}");
    assert_eq!(e.run_records(&id).unwrap().iter().filter(|x| x.kind == RecordKind::ActionIntent).count(), 0);

    // 3. The runbook is removed while the run waits: refused, not stranded.
    let id = run_id(&e.submit(manual_req("needs-approval", "n1")).await.unwrap());
    std::fs::remove_file(rb.path().join("needs-approval.yaml")).unwrap();
    reload(e);
    let _ = as_user(e, "bob").approve(&id).await;
    let r = until_finished(f, &id, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Refused), "{r:?}");
    assert!(r.why.contains("no longer loaded"), "{}", r.why);
    assert!(person(e).approvals().await.unwrap().is_empty());
    assert!(f.engine.verify().unwrap().ok);
}

/// Regression (issue 27 item 11: an alert dated year 9000 was never stale):
/// an alert that starts more than an hour ahead of the engine's clock is
/// dropped, audited with why, and starts no run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_from_the_future_is_refused() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ALERT, "set_power_limit(0, 500);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let year_9000 = nightshift_engine::embed::parse_rfc3339_ms("9000-01-01T00:00:00Z").unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-future", year_9000, "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    let recs = records(f);
    assert!(!recs.iter().any(|r| r.kind == RecordKind::RunQueued), "a run started for an alert from the future");
    let dropped = recs.iter().find(|r| r.kind == RecordKind::EventDropped).expect("the drop is audited");
    assert!(dropped.data.to_string().contains("ahead of this engine's clock"), "{dropped:?}");
    // An alert a few minutes ahead (clock skew) is acted on.
    let soon = now(f) + 120_000;
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-skew", soon, "firing"), "alertmanager");
    f.run_for(30).await.unwrap();
    assert!(records(f).iter().any(|r| r.kind == RecordKind::RunQueued), "a skewed but plausible alert runs");
}

/// Issue 46 point 8: GPU labels `+1` and `007` started real runs on GPUs 1
/// and 7, and `4294967295` was acknowledged with only a log line. A label
/// that is not a plain decimal index, or a GPU past the node's, is an
/// audited refusal now, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_label_written_any_other_way_is_refused_on_the_chain() {
    let rb = tempfile::tempdir().unwrap();
    let gpu_alert = "trigger:\n  type: alert\n  alertname: GpuHot\nscope: gpu\ncooldown_secs: 0\n";
    write_runbook(rb.path(), "hot", gpu_alert, "set_power_limit(500);\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    for (i, (label, why)) in
        [("+1", "found \"+1\""), ("007", "found \"007\""), ("4294967295", "has GPUs 0..1, found --gpu 4294967295")]
            .into_iter()
            .enumerate()
    {
        let mut p = alert_payload("GpuHot", "n1", &format!("f{i}"), now(f), "firing");
        p.alerts[0].labels.insert("gpu".into(), label.into());
        f.engine.ingest_alertmanager(p, "alertmanager");
        f.run_for(3).await.unwrap();
        assert!(f.engine.runs(&Default::default()).unwrap().runs.is_empty(), "{label}: nothing runs");
        let dropped: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::EventDropped).collect();
        assert_eq!(dropped.len(), i + 1, "{label}");
        let reason = dropped[i].data["reason"].as_str().unwrap();
        assert!(reason.contains(why), "{label}: {reason}");
    }
    // The plain index runs.
    let mut p = alert_payload("GpuHot", "n1", "ok", now(f), "firing");
    p.alerts[0].labels.insert("gpu".into(), "1".into());
    f.engine.ingest_alertmanager(p, "alertmanager");
    f.run_for(3).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].target.gpu, Some(1));
}

/// Issue 46 point 5: an Alertmanager HA pair sends each alert twice; the
/// duplicate was acknowledged at once, before the original's record was
/// durable — under a power loss 5 acknowledged alerts vanished. The
/// duplicate's answer now waits for the original's `event_received`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_alert_is_acknowledged_only_once_the_original_is_durable() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ALERT, "note(\"hot\");\n");
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    for i in 0..20 {
        let p = alert_payload("GpuHot", "n1", &format!("pair-{i}"), now(f), "firing");
        // The first sender's intake (its own answer not awaited), then the
        // second sender's identical alert, answered.
        f.engine.ingest_alertmanager(p.clone(), "am-1");
        let r = f.engine.accept_alertmanager(p, "am-2").await.unwrap();
        assert_eq!((r.accepted, r.duplicates), (0, 1));
        let durable = f
            .engine
            .audit()
            .records_since(0)
            .unwrap()
            .iter()
            .any(|r| r.kind == RecordKind::EventReceived && r.data["fingerprint"] == format!("pair-{i}"));
        assert!(durable, "round {i}: the duplicate was acknowledged before the original was durable");
    }
}

/// A run that held back a second alert (`fp-2`) while it waited for
/// approval, then ended skipped (its own alert, `fp-1`, resolved): the sim,
/// its runbooks, that run and when the alerts started.
async fn held_back_then_skipped() -> (Sim, tempfile::TempDir, String, i64) {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 300\napproval: {always: true, expire_secs: 3600}\n",
        "set_power_limit(0, 500);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let e = &f.engine;
    let t = now(f);
    e.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "firing"), "alertmanager");
    f.run_for(2).await.unwrap();
    let first = person(e).approvals().await.unwrap().remove(0).id;
    // Another alert for the node while the first run waits: held back.
    e.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-2", t + 1_000, "firing"), "alertmanager");
    f.run_for(2).await.unwrap();
    assert_eq!(e.runs(&Default::default()).unwrap().runs.len(), 1);
    assert_eq!(records(f).iter().filter(|r| r.kind == RecordKind::TriggerSuppressed).count(), 1);
    // The first alert resolves; approved, its run finds that and is skipped.
    e.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "resolved"), "alertmanager");
    f.run_for(2).await.unwrap();
    as_user(e, "bob").approve(&first).await.unwrap();
    let r = until_finished(f, &first, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Skipped), "{r:?}");
    f.run_for(2).await.unwrap();
    (sim, rb, first, t)
}

/// Issue 46 point 5: a firing alert suppressed because a run for the same
/// runbook and target was active was lost when that run was then skipped
/// (its own alert resolved while it waited): nothing offered the other one
/// again (1 of 64 targets in the storm). Now the run's end offers it again;
/// a run that did its work does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_held_back_by_a_run_that_was_skipped_is_offered_again() {
    let (sim, _rb, first, t) = held_back_then_skipped().await;
    let f = &sim.fleet;
    let e = &f.engine;
    // fp-2 still fires: its run is there, saying why it came now.
    let runs = e.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let again = runs.iter().find(|x| x.id != first).unwrap();
    assert_eq!(again.state, RunState::PendingApproval);
    assert!(
        again.detail.contains(&format!("offered again: run {first}, which held it back, ended skipped")),
        "{}",
        again.detail
    );
    let queued = e.run_records(&again.id).unwrap().into_iter().find(|x| x.kind == RecordKind::RunQueued).unwrap();
    assert_eq!(queued.data["event"]["fingerprint"], "fp-2", "{:?}", queued.data);
    // Approved, it does its work; a third alert it holds back is not offered again.
    e.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-3", t + 2_000, "firing"), "alertmanager");
    f.run_for(2).await.unwrap();
    as_user(e, "bob").approve(&again.id).await.unwrap();
    let r = until_finished(f, &again.id, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{r:?}");
    f.run_for(10).await.unwrap();
    assert_eq!(e.runs(&Default::default()).unwrap().runs.len(), 2, "the work was done: the cooldown holds the third");
    assert!(e.verify().unwrap().ok);
}

/// The engine dies in the moment between a run's end and the offer of the
/// alert it held back: the run's `run_finished` is durable, the new run's
/// `run_queued` is not. Replayed, that end must not count as the offer
/// made: the alert that still fires is offered again by the next life.
/// Before, the replay of `run_finished` forgot the held-back alert, which
/// was then lost until Alertmanager repeated it (`repeat_interval`, hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_held_back_survives_a_kill_between_the_runs_end_and_its_offer() {
    let (mut sim, _rb, first, _) = held_back_then_skipped().await;
    let f = &sim.fleet;
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 2, "in this life the alert was offered again");
    // The disk as it was when the process died: the log ends at the run's end.
    let died = tempfile::tempdir().unwrap();
    f.snapshot_engine(died.path()).unwrap();
    let log = died.path().join("records.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut kept = String::new();
    let mut cut = false;
    for line in text.lines() {
        kept.push_str(line);
        kept.push('\n');
        if line.contains("run_finished") && line.contains(&first) {
            cut = true;
            break;
        }
    }
    assert!(cut, "no run_finished of {first} in the log");
    std::fs::write(&log, kept).unwrap();
    // A restart on the whole log: the offer is on record — not made twice.
    sim.fleet.restart_engine().await.unwrap();
    sim.fleet.run_for(5).await.unwrap();
    let runs = sim.fleet.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 2, "an offer on record is not made again: {runs:#?}");
    sim.fleet.restart_engine_from(died.path()).await.unwrap();
    sim.fleet.run_for(5).await.unwrap();
    let f = &sim.fleet;
    let e = &f.engine;
    let runs = e.runs(&Default::default()).unwrap().runs;
    let again = runs.iter().find(|x| x.id != first);
    let again = again.unwrap_or_else(|| panic!("the held-back alert was lost with the process: {runs:#?}"));
    assert!(again.detail.contains(&format!("run {first}, which held it back, ended skipped")), "{}", again.detail);
    let queued = e.run_records(&again.id).unwrap().into_iter().find(|x| x.kind == RecordKind::RunQueued).unwrap();
    assert_eq!(queued.data["event"]["fingerprint"], "fp-2", "{:?}", queued.data);
    assert!(e.verify().unwrap().ok);
}

/// An alert held back by an active run outlives a restart: the restarted
/// engine knew nothing of it (its memory of held-back alerts was the old
/// process's), so when that run was then interrupted — resumed as often as
/// a restart may resume one — the alert that still fired was lost, its
/// `event_handled` the last word. Now every held-back alert is noted with
/// its event (also the second and later ones for the same run: each
/// acknowledged alert says what it led to), a restart reads the note, and
/// the interruption offers the alert again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_held_back_by_a_run_a_restart_interrupts_is_offered_again() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ANY_TIME, "set_power_limit(0, 500);\nsleep(3600);\n");
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let t = now(f);
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", t, "firing"), "alertmanager");
    f.run_for(5).await.unwrap();
    let first = f.engine.runs(&Default::default()).unwrap().runs.remove(0).id;
    // Two more alerts while it runs: both held back, both said so.
    for (i, fp) in ["fp-2", "fp-3"].iter().enumerate() {
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", fp, t + 1_000 * (i as i64 + 1), "firing"), "am");
        f.run_for(2).await.unwrap();
    }
    let held: Vec<_> = records(f).into_iter().filter(|r| r.kind == RecordKind::TriggerSuppressed).collect();
    assert_eq!(held.len(), 2, "{held:#?}");
    for (r, fp) in held.iter().zip(["fp-2", "fp-3"]) {
        assert_eq!(r.run.as_deref(), Some(first.as_str()));
        assert_eq!(r.data["event"]["fingerprint"], fp, "{:?}", r.data);
    }
    // Restarts while it runs: resumed, resumed, resumed, then interrupted.
    for _ in 0..=3 {
        sim.fleet.restart_engine().await.unwrap();
        sim.fleet.run_for(5).await.unwrap();
    }
    let f = &sim.fleet;
    let e = &f.engine;
    let r = until_finished(f, &first, 60).await;
    assert_eq!(r.outcome, Some(RunOutcome::Interrupted), "{r:?}");
    // The latest alert it held back is offered again, saying why it came now.
    let runs = e.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let again = runs.iter().find(|x| x.id != first).unwrap();
    assert!(
        again.detail.contains(&format!("offered again: run {first}, which held it back, ended interrupted")),
        "{}",
        again.detail
    );
    let queued = e.run_records(&again.id).unwrap().into_iter().find(|x| x.kind == RecordKind::RunQueued).unwrap();
    assert_eq!(queued.data["event"]["fingerprint"], "fp-3", "{:?}", queued.data);
    assert!(e.verify().unwrap().ok);
}

/// Every act says who (issue 46, people's acts; issue 43, point 1): an
/// approval and a rejection are recorded under the person who decided, a
/// cancel under the person who cancelled — with their reason — not the
/// run's requester, and a run the stopping engine cancels under `engine`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_rejections_and_cancels_are_recorded_under_who_did_them() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "careful",
        "trigger:\n  type: manual\nscope: node\napproval: {always: true, expire_secs: 600}\n",
        "set_power_limit(0, 450);\nsleep(60);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let e = &f.engine;
    let finished = |id: &str| {
        e.run_records(id).unwrap().into_iter().find(|r| r.kind == RecordKind::RunFinished).expect("run_finished")
    };
    // Approved by bob, cancelled while running by dave, who says why.
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    as_user(e, "bob").approve(&id).await.unwrap();
    f.run_for(5).await.unwrap();
    assert_eq!(power_limit(f, "n1", 0).await, 450.0, "running, capped");
    as_user(e, "dave").cancel(&id, Cancel { reason: Some("  wrong node  ".into()) }).await.unwrap();
    let r = until_finished(f, &id, 120).await;
    assert_eq!(r.outcome, Some(RunOutcome::Cancelled));
    assert!(r.why.contains("cancelled by user:dave: wrong node while running"), "{}", r.why);
    assert_eq!(power_limit(f, "n1", 0).await, 700.0, "its hold given back");
    let recs = e.run_records(&id).unwrap();
    let approved = recs.iter().find(|r| r.kind == RecordKind::Approved).unwrap();
    assert_eq!(approved.actor, "user:bob", "the approver acted, not the requester");
    let end = finished(&id);
    assert_eq!(
        (end.actor.as_str(), end.data["by"].as_str(), end.data["reason"].as_str()),
        ("user:dave", Some("user:dave"), Some("wrong node")),
        "{end:?}"
    );
    // Rejected by carol: both the rejection and the end are hers.
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    as_user(e, "carol").reject(&id, Reason { reason: "not during the training run".into() }).await.unwrap();
    let recs = e.run_records(&id).unwrap();
    let rejected = recs.iter().find(|r| r.kind == RecordKind::Rejected).unwrap();
    assert_eq!(rejected.actor, "user:carol");
    let end = finished(&id);
    assert_eq!((end.actor.as_str(), end.data["reason"].as_str()), ("user:carol", Some("not during the training run")));
    // Cancelled while waiting for approval, with no reason: still hers.
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    as_user(e, "erin").cancel(&id, Cancel { reason: None }).await.unwrap();
    let end = finished(&id);
    assert_eq!((end.actor.as_str(), end.data.get("reason")), ("user:erin", None), "{end:?}");
    assert_eq!(end.data["error"], "cancelled by user:erin before it started");
    // A run left running at shutdown is nobody's cancel — never "alice
    // cancelled it", nor the engine's: it is left unfinished, its cap on,
    // for the next engine to resume (sim/tests/it/recovery.rs).
    let id = run_id(&e.submit(manual_req("careful", "n1")).await.unwrap());
    as_user(e, "bob").approve(&id).await.unwrap();
    f.run_for(5).await.unwrap();
    e.shutdown().await;
    // (Virtual time: the script sees the stop at its next step.)
    f.run_for(120).await.unwrap();
    let recs = e.run_records(&id).unwrap();
    assert!(!recs.iter().any(|r| r.kind == RecordKind::RunFinished), "{recs:#?}");
    assert_eq!(power_limit(f, "n1", 0).await, 450.0, "a stop releases nothing");
}

/// Whether each `set_power_limit` of run `id` was applied on the device.
fn applied(f: &nightshift_sim::fleet::SimFleet, id: &str) -> Vec<bool> {
    f.engine
        .run_records(id)
        .unwrap()
        .iter()
        .filter(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "set_power_limit")
        .map(|r| r.data["applied"] == true)
        .collect()
}

/// Issue 43 point 3: one switch for the whole fleet. In `shadow` every
/// automatic run is a shadow run whatever its runbook's mode (admitted,
/// every action a dry run, the GPU untouched); in `paused` no automatic run
/// starts (suppressed, audited with who paused it and why) while a
/// person's manual run still does; back in `act` an alert acts. Each change
/// is audited as the admin's before it takes effect, survives a restart,
/// and a change without a reason or to the same mode is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_mode_shadows_pauses_and_acts_for_every_runbook() {
    use nightshift_engine::embed::FleetMode;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ANY_TIME, "set_power_limit(0, 500);\n");
    write_runbook(rb.path(), "cap", "trigger:\n  type: manual\nscope: node\n", "set_power_limit(1, 450);\n");
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let e = &sim.fleet.engine;
    let v = person(e).fleet_mode().await.unwrap();
    assert_eq!((v.mode, v.set_by), (FleetMode::Act, None), "act when nobody set one");
    assert!(
        as_user(e, "admin")
            .set_fleet_mode(SetFleetMode { mode: FleetMode::Shadow, reason: "  ".into() })
            .await
            .is_err(),
        "a reason is needed"
    );
    assert!(
        as_user(e, "admin")
            .set_fleet_mode(SetFleetMode { mode: FleetMode::Act, reason: "why not".into() })
            .await
            .is_err(),
        "already act"
    );
    as_user(e, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Shadow, reason: "first week on this fleet".into() })
        .await
        .unwrap();
    let f = &sim.fleet;
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert!(runs[0].shadow && runs[0].dry_run, "a shadow run: {:?}", runs[0]);
    assert_eq!(applied(f, &runs[0].id), vec![false], "its action a dry run: nothing changed");
    // Paused, and kept across a restart.
    as_user(&f.engine, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Paused, reason: "driver upgrade tonight".into() })
        .await
        .unwrap();
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    let v = person(&f.engine).fleet_mode().await.unwrap();
    assert_eq!(
        (v.mode, v.set_by, v.reason.as_str()),
        (FleetMode::Paused, Some("user:admin".to_string()), "driver upgrade tonight")
    );
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-2", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    assert_eq!(f.engine.runs(&Default::default()).unwrap().runs.len(), 1, "no automatic run while paused");
    let recs = records(f);
    let held = recs.iter().find(|r| r.kind == RecordKind::TriggerSuppressed).expect("the suppression is audited");
    assert!(
        held.data["reason"].as_str().unwrap().contains("the fleet is paused (by user:admin: driver upgrade tonight)"),
        "{held:?}"
    );
    let changes: Vec<_> = recs.iter().filter(|r| r.kind == RecordKind::FleetMode).collect();
    assert_eq!(changes.len(), 2);
    assert_eq!(
        (changes[1].actor.as_str(), changes[1].data["from"].as_str(), changes[1].data["to"].as_str()),
        ("user:admin", Some("shadow"), Some("paused"))
    );
    // A person's manual run is not held back.
    let id = run_id(&f.engine.submit(manual("cap", Target::node("n1"), "user:alice")).await.unwrap());
    assert_eq!(until_finished(f, &id, 60).await.outcome, Some(RunOutcome::Succeeded));
    // Act: the next alert acts.
    as_user(&f.engine, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Act, reason: "shadow report reviewed".into() })
        .await
        .unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-3", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let last = runs.iter().find(|r| r.runbook == "hot" && !r.shadow).expect("an acting run");
    assert_eq!(applied(f, &last.id), vec![true], "acted: {runs:#?}");
}

/// Issue 56 point 4: a mode switch takes effect at once. A shadow run in
/// flight (it holds its target for its whole timeout) ends when the fleet
/// goes to act — recorded under the admin who switched, with why, earning
/// no cooldown — and the alert it held back runs for real at once; a pause
/// says what is still in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn going_to_act_ends_the_shadow_runs_in_flight_and_a_pause_says_what_goes_on() {
    use nightshift_engine::embed::FleetMode;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\nscope: node\ncooldown_secs: 900\ntimeout_secs: 3600\n",
        "set_power_limit(0, 500);\nsleep(3000);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    as_user(&f.engine, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Shadow, reason: "first week".into() })
        .await
        .unwrap();
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let shadow = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(shadow.len(), 1, "{shadow:#?}");
    assert!(shadow[0].shadow && shadow[0].outcome.is_none(), "a shadow run in flight: {:?}", shadow[0]);
    let shadow = shadow[0].id.clone();
    let change = as_user(&f.engine, "ana")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Act, reason: "shadow report reviewed".into() })
        .await
        .unwrap();
    assert_eq!(change.ended, Some(vec![shadow.clone()]), "{change:?}");
    let end = until_finished(f, &shadow, 30).await;
    assert_eq!(end.outcome, Some(RunOutcome::Cancelled), "{end:?}");
    assert!(end.why.contains("the fleet went to act (shadow report reviewed)"), "{}", end.why);
    let finished =
        f.engine.run_records(&shadow).unwrap().into_iter().find(|r| r.kind == RecordKind::RunFinished).unwrap();
    assert_eq!(finished.actor, "user:ana", "under who switched");
    assert_eq!(finished.data["starts_cooldown"], false, "{finished:?}");
    // The real run: it acts now, not after the shadow run's hour or a cooldown.
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let real = runs.iter().find(|r| r.runbook == "hot" && !r.shadow).unwrap_or_else(|| panic!("{runs:#?}"));
    assert_eq!(applied(f, &real.id), vec![true]);
    assert_eq!(power_limit(f, "n1", 0).await, 500.0);
    // Paused: what goes on is said.
    let change = as_user(&f.engine, "ana")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Paused, reason: "driver upgrade".into() })
        .await
        .unwrap();
    assert_eq!(change.ended, Some(vec![]));
    let in_flight = change.in_flight.clone().unwrap_or_default();
    assert_eq!(in_flight.len(), 1, "{change:?}");
    assert!(in_flight[0].starts_with(&format!("{} hot n1 running", real.id)), "{change:?}");
}

/// Issue 56 point 7: an alert nightshift does not take is audited as
/// dropped, saying why — no runbook takes its name, or none with its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_no_runbook_takes_is_audited_as_dropped_with_why() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        "trigger:\n  type: alert\n  alertname: GpuHot\n  matchers: {severity: page}\nscope: node\ncooldown_secs: 0\n",
        "note(\"hot\");\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    f.engine.ingest_alertmanager(alert_payload("DiskFull", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-2", now(f), "firing"), "alertmanager");
    f.run_for(5).await.unwrap();
    let dropped: Vec<String> = records(f)
        .into_iter()
        .filter(|r| r.kind == RecordKind::EventDropped)
        .filter_map(|r| r.data["reason"].as_str().map(str::to_string))
        .collect();
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    // The two alerts are handled concurrently: their drops reach the chain
    // in either order (CI saw GpuHot's first).
    let said = |words: &str| dropped.iter().filter(|d| d.contains(words)).count();
    assert_eq!(said("alert DiskFull on n1: no loaded runbook takes it (the runbooks take GpuHot)"), 1, "{dropped:?}");
    assert_eq!(said("alert GpuHot on n1: hot take(s) GpuHot but not with its labels"), 1, "{dropped:?}");
    assert!(f.engine.runs(&Default::default()).unwrap().runs.is_empty());
}

/// Issue 43 point 3: an admin's hands-off holds across a restart (it was
/// memory only: a restart forgot it and nightshift acted on a node under
/// maintenance), and one set for a while ends by itself, audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hands_off_outlives_a_restart_and_ends_when_its_time_is_up() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ANY_TIME, "set_power_limit(0, 500);\n");
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let until = now(&sim.fleet) + 600_000;
    let hands_off = HandsOff { hands_off: true, reason: Some("firmware update".into()), for_secs: Some(600) };
    as_user(&sim.fleet.engine, "admin").hands_off("n1", hands_off).await.unwrap();
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    let st = f.engine.node("n1").unwrap().state;
    assert_eq!(
        (st.engine_hands_off.clone(), st.engine_hands_off_until_ms),
        (Some(("user:admin".to_string(), "firmware update".to_string())), Some(until)),
        "rebuilt from the chain"
    );
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-1", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs[0].outcome, Some(RunOutcome::Refused), "{runs:#?}");
    assert!(runs[0].error.as_deref().unwrap_or_default().contains("hands-off"), "{:?}", runs[0]);
    // Its time runs out: ended by the engine, saying whose it was.
    f.run_for(600).await.unwrap();
    assert!(!f.engine.node("n1").unwrap().state.hands_off());
    let ended = records(f).into_iter().rev().find(|r| r.kind == RecordKind::HandsOff).unwrap();
    assert_eq!((ended.actor.as_str(), ended.data["hands_off"].as_bool()), ("engine", Some(false)));
    assert!(ended.data["reason"].as_str().unwrap().contains("the hands-off user:admin set ended"), "{ended:?}");
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp-2", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs[0].outcome, Some(RunOutcome::Succeeded), "acts again: {:?}", runs[0]);
}

/// A storm queues hundreds of runs behind `max_concurrent: 1`; by the time
/// a slot frees, every one is past its event age. The queue skips them in
/// one loop: before, each skipped run pumped the queue again from inside
/// its own `finish`, and 256 of them overflowed a worker's stack (found by
/// `nightshift simulate` on 256 nodes whose headroom runs all queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_queued_runs_gone_stale_are_skipped_in_a_loop_not_a_stack_overflow() {
    const N: usize = 400;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "hot",
        &format!("{HOT_ANY_TIME}max_concurrent: 1\nmax_event_age_secs: 60\n"),
        "sleep(90);\n",
    );
    let nodes = (0..N).map(|i| SimNodeSpec::new(&format!("n{i:03}"), "h100-sxm", 1)).collect();
    let sim = start(nodes, rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let t = now(f);
    for i in 0..N {
        let name = format!("n{i:03}");
        f.engine.ingest_alertmanager(alert_payload("GpuHot", &name, &format!("fp-{i}"), t, "firing"), "alertmanager");
    }
    f.run_for(150).await.unwrap();
    let recs = records(f);
    let finished =
        |o: &str| recs.iter().filter(|r| r.kind == RecordKind::RunFinished && r.data["outcome"] == o).count();
    assert_eq!(recs.iter().filter(|r| r.kind == RecordKind::RunQueued).count(), N, "one run per node");
    assert_eq!(finished("succeeded"), 1, "one slot, one run acted");
    assert_eq!(finished("skipped"), N - 1, "the rest went stale in the queue");
}

/// A finding's life (issue 57): told once; a later run of the same runbook
/// that finds nothing to do ends it (a note on that run); the next time it
/// is told again — also across a restart, rebuilt from the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_is_told_once_ends_when_a_run_finds_nothing_and_is_told_again() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "look",
        "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\nparams:\n  say: {type: bool, default: true}\n",
        "if params.say { notify(`GPU ${target.gpu} on ${target.node} needs a look`); } else { note(\"fine\"); }\n",
    );
    let mut sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
    let notified = |f: &nightshift_sim::fleet::SimFleet| {
        records(f).iter().filter(|r| r.kind == RecordKind::Notification && r.runbook.as_deref() == Some("look")).count()
    };
    // (say, restart before it, notifications after it)
    for (i, (say, restart, want)) in
        [(true, false, 1), (true, false, 1), (false, false, 1), (true, true, 2), (true, true, 2)]
            .into_iter()
            .enumerate()
    {
        if restart {
            sim.fleet.restart_engine().await.unwrap();
        }
        let f = &sim.fleet;
        let mut req = manual("look", Target::gpu("n1", 0), "user:alice");
        req.params.insert("say".into(), say.to_string());
        let id = run_id(&f.engine.submit(req).await.unwrap());
        until_finished(f, &id, 30).await;
        assert_eq!(notified(f), want, "after run {i} (say {say}, restart {restart})");
    }
    let cleared =
        records(&sim.fleet).iter().filter(|r| r.kind == RecordKind::Note && r.data["findings_cleared"] == true).count();
    assert_eq!(cleared, 1, "the run that found nothing says the finding is over, once");
}

/// Issue 43 point 9: a run's outcome says what it achieved, not that its
/// script reached the last line. Every change refused is `refused`; a page,
/// or a drain only a person ends, is `needs_person` saying what for; a
/// change that went through beside a refused one is still `succeeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_by_what_it_achieved_not_by_its_last_line() {
    let rb = tempfile::tempdir().unwrap();
    let manual = "trigger:\n  type: manual\nscope: node\ncooldown_secs: 0\n";
    // 10 W: far below any envelope's floor.
    write_runbook(rb.path(), "too-low", manual, "let r = set_power_limit(0, 10);\nnote(`refused: ${r.error}`);\n");
    write_runbook(rb.path(), "fan-or-cap", manual, "set_power_limit(0, 10);\nset_power_limit(0, 600);\n");
    write_runbook(
        rb.path(),
        "rma",
        &format!("{manual}sticky_drain: true\n"),
        "drain_sticky(\"GPU 0 replaced next week\");\n",
    );
    write_runbook(rb.path(), "page", manual, "escalate(\"the chassis fans need a look\");\n");
    write_runbook(rb.path(), "cap", manual, "set_power_limit(0, 500);\n");
    let sim = start(vec![node("n1", "h100-sxm"), node("n2", "h100-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    let ended = |runbook: &'static str, node: &'static str| async move {
        let id = run_id(&f.engine.submit(manual_req(runbook, node)).await.unwrap());
        until_finished(f, &id, 60).await
    };
    let r = ended("too-low", "n1").await;
    assert_eq!(r.outcome, Some(RunOutcome::Refused), "{r:?}");
    assert!(r.why.contains("every change it tried was refused: set_power_limit on n1: "), "{}", r.why);
    let r = ended("fan-or-cap", "n1").await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "the second change went through: {r:?}");
    let r = ended("page", "n1").await;
    assert_eq!(r.outcome, Some(RunOutcome::NeedsPerson), "{r:?}");
    assert!(
        r.why.contains("needs a person after 0 action(s): paged a person: the chassis fans need a look"),
        "{}",
        r.why
    );
    let r = ended("cap", "n1").await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{r:?}");
    let r = ended("rma", "n2").await;
    assert_eq!(r.outcome, Some(RunOutcome::NeedsPerson), "{r:?}");
    assert!(
        r.why
            .contains("needs a person after 1 action(s): n2 drained until a person ends it (GPU 0 replaced next week)"),
        "{}",
        r.why
    );
    let finished =
        f.engine.run_records(&r.id).unwrap().into_iter().find(|x| x.kind == RecordKind::RunFinished).unwrap();
    assert_eq!(finished.data["outcome"], "needs_person", "{finished:?}");
    // Filtered as such: the morning's list of what waits for a person.
    let filter = nightshift_engine::audit::RunFilter { outcome: Some(RunOutcome::NeedsPerson), ..Default::default() };
    let waiting = f.engine.runs(&filter).unwrap().runs;
    assert_eq!(waiting.iter().map(|r| r.runbook.as_str()).collect::<Vec<_>>(), vec!["rma", "page"], "{waiting:#?}");
}

/// Issue 43 point 3: a maintenance window, like a silence — matched by
/// labels (every matcher) and names, with an end that always comes. The
/// nodes it covers are hands-off; nodes it does not cover are not; it
/// outlives a restart; it ends by itself at its time, audited as the
/// engine's, and a person can end one early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maintenance_window_covers_what_it_matches_until_it_ends() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ANY_TIME, "set_power_limit(0, 500);\n");
    let labelled = |name: &str, pool: &str, rack: &str| SimNodeSpec {
        labels: [("pool".to_string(), pool.to_string()), ("rack".to_string(), rack.to_string())].into(),
        ..node(name, "h100-sxm")
    };
    let mut sim =
        start(vec![labelled("a1", "a", "r1"), labelled("a2", "a", "r2"), labelled("b1", "b", "r1")], rb.path(), |_| {})
            .await;
    let e = sim.fleet.engine.clone();
    let ends = now(&sim.fleet) + 3_600_000;
    let spec = |matchers: &[(&str, &str)], nodes: &[&str], ends_ms: i64| NewWindow {
        matchers: matchers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        starts_at: None,
        ends_at: Some(nightshift_engine::api::format_rfc3339_ms(ends_ms)),
        for_secs: None,
        reason: "PDU firmware".into(),
    };
    // Refused, saying what was expected, and nothing recorded.
    let before = records(&sim.fleet).len();
    let err = as_user(&e, "admin").set_window(spec(&[], &[], ends)).await.unwrap_err().to_string();
    assert!(err.contains("needs at least one node or label matcher"), "{err}");
    let err = as_user(&e, "admin").set_window(spec(&[], &["nope"], ends)).await.unwrap_err().to_string();
    assert!(err.contains("node \"nope\" is not in the inventory"), "{err}");
    assert_eq!(records(&sim.fleet).len(), before, "a refused window records nothing");
    // pool=a and rack=r1: a1 only (a2 is in another rack, b1 in another pool).
    let w = as_user(&e, "admin").set_window(spec(&[("pool", "a"), ("rack", "r1")], &[], ends)).await.unwrap().window;
    assert_eq!(w.covers, vec!["a1".to_string()], "{w:?}");
    sim.fleet.restart_engine().await.unwrap();
    let f = &sim.fleet;
    let st = f.engine.node("a1").unwrap().state;
    assert_eq!(st.maintenance.as_ref().map(|c| c.id.clone()), Some(w.id.clone()), "rebuilt from the chain: {st:?}");
    assert!(!f.engine.node("a2").unwrap().state.hands_off() && !f.engine.node("b1").unwrap().state.hands_off());
    for (node, fp) in [("a1", "fp-1"), ("b1", "fp-2")] {
        f.engine.ingest_alertmanager(alert_payload("GpuHot", node, fp, now(f), "firing"), "alertmanager");
    }
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    let on = |n: &str| runs.iter().find(|r| r.target.node.as_deref() == Some(n)).cloned().unwrap();
    assert_eq!(on("a1").outcome, Some(RunOutcome::Refused), "{runs:#?}");
    assert!(
        on("a1")
            .error
            .unwrap_or_default()
            .contains(&format!("is in maintenance window {} (user:admin: PDU firmware)", w.id)),
        "{:?}",
        on("a1")
    );
    assert_eq!(on("b1").outcome, Some(RunOutcome::Succeeded), "outside the window: {:?}", on("b1"));
    // Its time comes: ended by the engine, saying whose it was.
    f.run_for(3_600).await.unwrap();
    assert!(!f.engine.node("a1").unwrap().state.hands_off());
    assert!(person(&f.engine).windows().await.unwrap().windows.is_empty());
    let ended = records(f).into_iter().rev().find(|r| r.kind == RecordKind::Maintenance).unwrap();
    assert_eq!((ended.actor.as_str(), ended.data["set"].as_bool()), ("engine", Some(false)));
    assert!(ended.data["reason"].as_str().unwrap().contains("the window user:admin set ended at"), "{ended:?}");
    f.engine.ingest_alertmanager(alert_payload("GpuHot", "a1", "fp-3", now(f), "firing"), "alertmanager");
    f.run_for(10).await.unwrap();
    let runs = f.engine.runs(&Default::default()).unwrap().runs;
    assert_eq!(runs[0].outcome, Some(RunOutcome::Succeeded), "acts again: {:?}", runs[0]);
    // By name, ended early by a person, under their name and reason.
    let w = as_user(&f.engine, "admin").set_window(spec(&[], &["a2", "b1"], now(f) + 600_000)).await.unwrap().window;
    assert_eq!(w.covers, vec!["a2".to_string(), "b1".to_string()]);
    as_user(&f.engine, "ana").end_window(&w.id, Reason { reason: "done early".into() }).await.unwrap();
    assert!(!f.engine.node("a2").unwrap().state.hands_off());
    let ended = records(f).into_iter().rev().find(|r| r.kind == RecordKind::Maintenance).unwrap();
    assert_eq!((ended.actor.as_str(), ended.data["reason"].as_str()), ("user:ana", Some("done early")));
    let err =
        as_user(&f.engine, "ana").end_window(&w.id, Reason { reason: "again".into() }).await.unwrap_err().to_string();
    assert!(err.contains(&format!("no maintenance window \"{}\"", w.id)), "{err}");
    assert!(f.engine.verify().unwrap().ok);
}

/// Issue 42 point 6: an alert is someone else's reading (a rule with one
/// threshold for every vendor). An alert runbook with `confirm:` changes
/// nothing where the agent's own reading does not agree — the run is
/// skipped with why — and acts where it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_run_acts_only_where_the_agents_reading_confirms_it() {
    for (confirm, acts) in [("above: 85", false), ("above: 10", true)] {
        let rb = tempfile::tempdir().unwrap();
        let manifest = format!(
            "trigger:\n  type: alert\n  alertname: GpuHot\n  confirm: {{metric: gpu.temperature_c, {confirm}}}\nscope: node\ncooldown_secs: 0\n"
        );
        write_runbook(rb.path(), "hot", &manifest, "set_power_limit(0, 600);\n");
        let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |_| {}).await;
        let f = &sim.fleet;
        f.run_for(10).await.unwrap();
        f.engine.ingest_alertmanager(alert_payload("GpuHot", "n1", "fp1", now(f), "firing"), "alertmanager");
        f.run_for(10).await.unwrap();
        let runs = f.engine.runs(&Default::default()).unwrap().runs;
        assert_eq!(runs.len(), 1, "{confirm}");
        let r = &runs[0];
        let intents =
            f.engine.run_records(&r.id).unwrap().iter().filter(|x| x.kind == RecordKind::ActionIntent).count();
        if acts {
            assert_eq!(r.outcome, Some(RunOutcome::Succeeded), "{confirm}: {r:?}");
            assert!(intents >= 1, "the cap was sent");
        } else {
            assert_eq!(r.outcome, Some(RunOutcome::Skipped), "{confirm}: {r:?}");
            let why = r.error.clone().unwrap_or_default();
            assert!(
                why.contains("the alert is firing, but the agent's reading does not show it: gpu.temperature_c is")
                    && why.contains("(confirm: above 85)"),
                "{why}"
            );
            assert_eq!(intents, 0, "nothing was sent");
            assert_eq!(power_limit(f, "n1", 0).await, 700.0);
        }
    }
}

/// Issue 42 point 10, the pull path (Prometheus, dcgm-exporter): a GPU's
/// HBM temperature and its sensor's, in one batch, give its headroom below
/// the nearer limit — the HBM's own maximum from its inventory — as the
/// agent path does; a batch with only the sensor gives the sensor's; and
/// fragmentation is judged against the model's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulled_readings_derive_the_headroom_below_the_nearer_thermal_limit() {
    use nightshift_engine::embed::ids;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "hot", HOT_ALERT, "note(\"x\");\n");
    let sim = start(vec![node("n1", "h200-sxm")], rb.path(), |_| {}).await;
    let f = &sim.fleet;
    f.run_for(5).await.unwrap();
    let t = now(f) + 1_000;
    let e = &f.engine;
    e.ingest_samples(&[
        ("n1", Some(0), ids::TEMPERATURE, t, 70.0),
        ("n1", Some(0), ids::MEM_TEMP, t, 93.0),
        ("n1", Some(1), ids::TEMPERATURE, t, 80.0),
        ("n1", Some(1), ids::MEM_FRAG, t, 40.0),
    ])
    .await;
    // GPU 0: sensor 20 °C under its 90 °C slowdown, HBM 2 °C under its 95.
    assert_eq!(e.latest("n1", Some(0), ids::MEM_HEADROOM), Some(2.0));
    assert_eq!(e.latest("n1", Some(0), ids::THERMAL_HEADROOM), Some(2.0));
    // GPU 1: no HBM reading in the batch: the sensor's headroom alone.
    assert_eq!(e.latest("n1", Some(1), ids::THERMAL_HEADROOM), Some(10.0));
    // H200 is not one of the models with their own limit: 25 %.
    assert_eq!(e.latest("n1", Some(1), ids::MEM_FRAG_OVER), Some(15.0));
}
