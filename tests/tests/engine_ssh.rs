//! End to end over real SSH on loopback: a temperature fault injected into a
//! sim agent fires a runbook; its actions land on that agent and appear in
//! the audit log in order, intent before result.

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::runs::RunOutcome;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::*;
use nightshift_tests::{TestAgent, engine_setup, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temperature_fault_is_remediated_over_ssh() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { profile: "rtx6000-ada".into(), gpus: 2, seed: 3, ..SimConfig::default() };
    let fast = "sim_time_scale: 30\n";
    let g1 = TestAgent::start(dir.path(), "g1", sim.clone(), fast).await;
    let g2 = TestAgent::start(dir.path(), "g2", sim, fast).await;
    let cfg = engine_setup(
        dir.path(),
        &[&g1, &g2],
        &[(
            "cool-down",
            "trigger: {type: threshold, metric: gpu.temperature_c, above: 85, for_secs: 10, clear_below: 80}\nscope: gpu\ntimeout_secs: 1800\n",
            "note(`cooling ${target.node}/${target.gpu}`);\nlet r = set_power_limit(150);\nif !r.ok { fail(r.error); }\nif !wait_until(|| metric(\"gpu.temperature_c\") < 80, 900) { escalate(\"still hot\"); }\n",
        )],
        "time_scale: 30\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let connected = eventually(20, || engine.nodes().iter().all(|n| n.state.connected).then_some(())).await;
    assert!(
        connected.is_some(),
        "agents connected: {:?}",
        engine.nodes().iter().map(|n| (&n.name, &n.state.last_error)).collect::<Vec<_>>()
    );

    // The fault: a clogged heatsink on g1's GPU 0.
    let c1 = AgentConnection::connect(&g1.client_config()).await.unwrap();
    let r = c1
        .call(&Request::new("fault", Op::SimFault(SimFault::HeatsinkDegradation { gpu: 0, factor: 1.8 })))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");

    let run =
        eventually(60, || engine.runs(&Default::default()).unwrap().runs.into_iter().find(|r| r.outcome.is_some()))
            .await
            .expect("a run finished");
    assert_eq!(run.runbook, "cool-down");
    assert_eq!((run.target.node.as_deref(), run.target.gpu), (Some("g1"), Some(0)));
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");

    // The cap was a hold of the run: released when it ended, so g1 is back
    // at its baseline, and nothing else was touched.
    let t: Telemetry =
        serde_json::from_value(c1.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 300.0);
    assert_eq!(t.gpus[1].power_limit_watts, 300.0);
    assert!(t.node_metrics.holds.is_empty(), "{:?}", t.node_metrics.holds);
    let c2 = AgentConnection::connect(&g2.client_config()).await.unwrap();
    let t2: Telemetry =
        serde_json::from_value(c2.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    assert!(t2.gpus.iter().all(|g| g.power_limit_watts == 300.0));

    // In order in the audit log.
    // (The agent's own account of the hold's end, `hold_ended`, arrives
    // with its next telemetry; it is checked below.)
    let kinds: Vec<RecordKind> =
        engine.run_records(&run.id).unwrap().iter().map(|r| r.kind).filter(|k| *k != RecordKind::HoldEnded).collect();
    assert_eq!(
        kinds,
        vec![
            RecordKind::RunQueued,
            RecordKind::RunStarted,
            RecordKind::Note,
            RecordKind::ActionIntent,
            RecordKind::ActionResult,
            RecordKind::ActionIntent,
            RecordKind::ActionResult,
            RecordKind::RunFinished
        ]
    );
    let recs = engine.run_records(&run.id).unwrap();
    let intent = &recs[3];
    let result = &recs[4];
    assert_eq!(intent.data["action_id"], result.data["action_id"]);
    assert_eq!(result.data["before"]["power_limit_watts"], 300.0);
    assert_eq!(result.data["after"]["power_limit_watts"], 150.0);
    assert!(intent.seq < result.seq);
    assert_eq!(recs[5].data["op"], "release");
    assert_eq!(recs[6].data["after"]["settings"][0]["outcome"], "restored", "{:?}", recs[6]);
    assert!(run.why.contains("every hold released, baselines restored"), "{}", run.why);
    // The agent journaled the same request id.
    let journal =
        nightshift_agent::journal::Journal::read_lines(&g1.started.as_ref().unwrap().agent.journal_path()).unwrap();
    let action_id = intent.data["action_id"].as_str().unwrap();
    assert!(
        journal.iter().any(|l| matches!(l, nightshift_agent::journal::JournalLine::Done { id, .. } if id == action_id))
    );
    // The agent's account of the hold's end reaches the run's page over SSH.
    let ended =
        eventually(20, || engine.run_records(&run.id).unwrap().into_iter().find(|r| r.kind == RecordKind::HoldEnded))
            .await
            .expect("the agent reports the hold's end in its telemetry");
    assert_eq!(ended.data["how"], "released", "{ended:?}");
    assert_eq!(ended.data["outcome"], "restored", "{ended:?}");
    assert_eq!(ended.actor, "agent:g1");
    assert!(engine.verify().unwrap().ok);
    engine.shutdown().await;
}
