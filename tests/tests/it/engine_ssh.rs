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
    let _serial = nightshift_tests::serial::module(module_path!());
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
    let journal = g1.started.as_ref().unwrap().agent.journal_lines();
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

/// fleet.yaml and the tokens read again while the engine runs (what SIGHUP
/// and `nightshift reload` do): a node added is connected, a node whose host
/// key changed is reconnected (and refused, the key being wrong), a node
/// removed is let go; a broken fleet.yaml changes nothing; settings that
/// need a restart are named; every reload is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_changes_and_removes_nodes_and_refuses_a_broken_file() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::embed::reload;
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 1, ..SimConfig::default() };
    let a1 = TestAgent::start(dir.path(), "r1", sim.clone(), "").await;
    let a2 = TestAgent::start(dir.path(), "r2", sim, "").await;
    let cfg = engine_setup(
        dir.path(),
        &[&a1],
        &[("noop", "trigger: {type: manual}\nscope: node\n", "note(\"x\");\n")],
        "auth: {tokens: [{name: alice, role: admin, sha256: 0000000000000000000000000000000000000000000000000000000000000000}]}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let fleet = |nodes: &[(&TestAgent, &str)]| {
        let mut text = String::from("version: 1\nnodes:\n");
        for (a, key) in nodes {
            text.push_str(&format!(
                "  - name: {}\n    address: {}\n    host_key: {key}\n    labels: {{pool: a}}\n",
                a.cfg.node,
                a.addr()
            ));
        }
        std::fs::write(dir.path().join("fleet.yaml"), text).unwrap();
    };

    // A node added.
    fleet(&[(&a1, &a1.fingerprint()), (&a2, &a2.fingerprint())]);
    let r = reload(&engine, "user:test").await.unwrap();
    assert_eq!(
        (r.nodes.added.as_slice(), r.nodes.changed.len(), r.nodes.removed.len()),
        (&["r2".to_string()][..], 0, 0)
    );
    assert!(!r.runbooks_changed && r.restart_needed.is_empty() && r.tokens_added.is_empty(), "{r:?}");
    assert!(
        eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.is_some(),
        "r2 never connected"
    );

    // A broken fleet.yaml: refused with where, nothing changed.
    std::fs::write(dir.path().join("fleet.yaml"), "version: 1\nnodes:\n  - name: r3\n").unwrap();
    let err = reload(&engine, "user:test").await.unwrap_err().to_string();
    assert!(err.contains("fleet.yaml:3:") && err.contains("address"), "{err}");
    assert_eq!(engine.node_names(), ["r1", "r2"]);

    // r1's host key is now wrong (a reinstalled node not yet re-pinned), r2
    // removed; a token added; a setting that needs a restart.
    fleet(&[(&a1, "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")]);
    let yaml = std::fs::read_to_string(dir.path().join("engine.yaml")).unwrap();
    let yaml = yaml.replace(
        "tokens: [",
        "tokens: [{name: bob, role: viewer, sha256: 1111111111111111111111111111111111111111111111111111111111111111}, ",
    ) + "limits: {queue_capacity: 7}\n";
    std::fs::write(dir.path().join("engine.yaml"), yaml).unwrap();
    let generation = engine.auth().0;
    let r = reload(&engine, "signal:SIGHUP").await.unwrap();
    assert_eq!(r.nodes.changed, ["r1"]);
    assert_eq!(r.nodes.removed, ["r2"]);
    assert_eq!(r.tokens_added, ["bob"]);
    assert_eq!(r.restart_needed, ["limits"]);
    assert!(engine.auth().0 > generation);
    assert!(engine.auth().1.tokens.iter().any(|t| t.name == "bob"));
    assert_eq!(engine.node_names(), ["r1"]);
    let refused = eventually(30, || {
        let n = engine.node("r1")?;
        (!n.state.connected && n.state.last_error.as_deref().is_some_and(|e| e.contains("host key"))).then_some(())
    })
    .await;
    assert!(refused.is_some(), "r1 with a wrong pinned key stays connected: {:?}", engine.node("r1").map(|n| n.state));

    // Each reload is in the audit, with who asked and what happened.
    let reloads: Vec<_> = engine
        .audit()
        .records_since(0)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::ConfigReloaded)
        .map(|r| (r.actor.clone(), r.data["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        reloads,
        [("user:test".to_string(), true), ("user:test".to_string(), false), ("signal:SIGHUP".to_string(), true)]
    );
    engine.shutdown().await;
    let (mut a1, mut a2) = (a1, a2);
    a1.stop().await;
    a2.stop().await;
}

/// Regression (issue 27 item 10: a reload with the runbook folder missing
/// answered 200 with `runbooks: 0`, and one broken manifest silently
/// removed that runbook): a reload refuses, changing nothing, when the
/// folder cannot be read or any runbook fails to load — the error names
/// each failure with file:line:column; `--allow-partial` (the API's
/// `allow_partial=true`) puts the others in force and lists the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_a_missing_runbook_folder_and_a_broken_runbook() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::embed::{reload, reload_with};
    let dir = tempfile::tempdir().unwrap();
    nightshift_tests::engine_key(dir.path());
    let cfg = engine_setup(
        dir.path(),
        &[],
        &[
            ("alpha", "trigger: {type: manual}\nscope: node\n", "note(\"a\");\n"),
            ("beta", "trigger: {type: manual}\nscope: node\n", "note(\"b\");\n"),
        ],
        "auth: {allow_anonymous: admin}\n",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let names = |e: &nightshift_engine::engine::Engine| e.runbook_set().names();
    assert_eq!(names(&engine), ["alpha", "beta"]);
    let rb = dir.path().join("runbooks");

    // One broken manifest: refused, both stay.
    std::fs::write(rb.join("beta.yaml"), "version: 1\nname: beta\ndescription: b\nscript: beta.rhai\nscope: nowhere\n")
        .unwrap();
    let err = reload(&engine, "user:test").await.unwrap_err().to_string();
    assert!(err.contains("1 runbook file(s) failed to load") && err.contains("beta.yaml:"), "{err}");
    assert!(err.contains("--allow-partial"), "{err}");
    assert_eq!(names(&engine), ["alpha", "beta"], "nothing changed");
    // Asked for: the others are in force, the failure listed.
    let r = reload_with(&engine, "user:test", true).await.unwrap();
    assert_eq!(names(&engine), ["alpha"]);
    assert!(r.runbook_errors.iter().any(|e| e.contains("beta.yaml:")), "{:?}", r.runbook_errors);

    // The folder gone: refused even with allow_partial, nothing changed.
    std::fs::rename(&rb, dir.path().join("runbooks.moved")).unwrap();
    for partial in [false, true] {
        let err = reload_with(&engine, "user:test", partial).await.unwrap_err().to_string();
        assert!(err.contains("expected a folder of runbooks at") && err.contains("nothing was reloaded"), "{err}");
        assert_eq!(names(&engine), ["alpha"]);
    }
    let refused = engine
        .audit()
        .records_since(0)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::ConfigReloaded && r.data["ok"] == false)
        .count();
    assert_eq!(refused, 3, "each refusal is audited");
    engine.shutdown().await;
}
