//! Shadow mode end to end: the real engine, sim agents over SSH, a
//! notification webhook. A clogged heatsink that would make an `act`
//! runbook cap the GPU, drain the node and page someone leaves every
//! setting as it was: no change journaled by any agent, no hold, nothing
//! delivered — and the shadow report lists what it would have done with
//! the agents' answers. Promotion is refused to non-admins and audited.

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::statelog::StateLog;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::runs::RunOutcome;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::*;
use nightshift_tests::external::receiver;
use nightshift_tests::{TestAgent, engine_setup, eventually};

const ADMIN: &str = "ns_shadow_admin";
const OPERATOR: &str = "ns_shadow_operator";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_runbook_changes_nothing_and_reports_what_it_would_have_done() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, seed: 3, ..SimConfig::default() };
    let s1 = TestAgent::start(dir.path(), "s1", sim.clone(), "sim_time_scale: 30\n").await;
    let s2 = TestAgent::start(dir.path(), "s2", sim, "sim_time_scale: 30\n").await;
    let (hook, delivered) = receiver(0).await;
    let cfg = engine_setup(
        dir.path(),
        &[&s1, &s2],
        &[(
            "hot-cap",
            "mode: shadow\ntrigger: {type: threshold, metric: gpu.temperature_c, above: 84, for_secs: 2, clear_below: 78}\nscope: gpu\n\
             blast_radius: {max_drained_pct: 50}\n",
            "notify(\"GPU too hot: capping and draining\");\n\
             let r = set_power_limit(300);\nif !r.ok { fail(r.error); }\n\
             let d = drain(\"too hot\");\nif !d.ok { fail(d.error); }\n\
             escalate(\"drained for the heat\");\n",
        )],
        &format!(
            "notifications:\n  webhooks:\n    - {{name: ops, url: '{hook}', dry_runs: true}}\n\
             auth:\n  tokens:\n    - {{name: ada, role: admin, sha256: {}}}\n    - {{name: otto, role: operator, sha256: {}}}\n",
            nightshift_web::auth::hash_token(ADMIN),
            nightshift_web::auth::hash_token(OPERATOR)
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 2).then_some(())).await.is_some());
    assert_eq!(mode_of(&engine, "hot-cap").await, "shadow");

    // The fault.
    let c = AgentConnection::connect(&s1.client_config()).await.unwrap();
    let r = c
        .call(&Request::new("fault", Op::SimFault(SimFault::HeatsinkDegradation { gpu: 0, factor: 3.0 })))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    let run = eventually(120, || {
        engine
            .runs(&Default::default())
            .unwrap()
            .runs
            .into_iter()
            .find(|r| r.runbook == "hot-cap" && r.outcome.is_some())
    })
    .await
    .expect("a shadow run finished");
    assert!(run.shadow && run.dry_run, "{run:?}");
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    assert_eq!((run.target.node.as_deref(), run.target.gpu), (Some("s1"), Some(0)));

    // Nothing changed: the power limit is the default, the node serves, no
    // hold anywhere, and no agent journaled a change.
    let t: Telemetry =
        serde_json::from_value(c.call(&Request::new("t", Op::Telemetry(NoArgs {}))).await.unwrap().result.unwrap())
            .unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 700.0);
    assert!(!t.node_metrics.drained && t.node_metrics.holds.is_empty(), "{:?}", t.node_metrics);
    let mut journaled = 0;
    for a in [&s1, &s2] {
        for line in StateLog::journal_lines(&a.cfg.state_dir).unwrap_or_default() {
            // Only dry runs: answered without a pending (in-flight change)
            // line, and answered as a dry run.
            match &line {
                JournalLine::Done { id, reply, .. } if id.contains(&run.id) => {
                    let outcome = reply.result.as_ref().map(|r| r["outcome"].clone());
                    assert_eq!(outcome, Some(serde_json::json!("dry_run")), "{}: {line:?}", a.cfg.node);
                    journaled += 1;
                }
                JournalLine::Pending { id, .. } | JournalLine::Reverted { id, .. } => {
                    assert!(!id.contains(&run.id), "{}: {line:?}", a.cfg.node);
                }
                JournalLine::Done { .. } => {}
            }
        }
    }
    assert_eq!(journaled, 2, "both would-be actions reached an agent");
    // The records: every action a dry run the agent answered, marked
    // shadow; the notifications recorded and sent to no one, even to a
    // target that takes dry runs.
    let records = engine.run_records(&run.id).unwrap();
    let results: Vec<_> = records.iter().filter(|r| r.kind == RecordKind::ActionResult).collect();
    assert_eq!(results.len(), 2, "{records:#?}");
    for r in &results {
        assert_eq!(
            (r.data["dry_run"].clone(), r.data["shadow"].clone(), r.data["would_act"].clone()),
            (true.into(), true.into(), true.into()),
            "{r:?}"
        );
        assert_eq!(r.data["outcome"], "dry_run", "{r:?}");
    }
    let told: Vec<_> =
        records.iter().filter(|r| matches!(r.kind, RecordKind::Notification | RecordKind::Escalation)).collect();
    assert_eq!(told.len(), 2);
    for r in &told {
        assert_eq!(
            (r.data["shadow"].clone(), r.data["webhooks"].clone()),
            (true.into(), serde_json::json!([])),
            "{r:?}"
        );
        assert_eq!(r.data["would_notify"], serde_json::json!(["ops"]));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(delivered.lock().unwrap().is_empty(), "delivered: {:?}", delivered.lock().unwrap());

    // The report, through the API as an operator would read it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let web = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(nightshift_web::serve(engine.clone(), listener, std::future::pending()));
    let http = reqwest::Client::new();
    let report: serde_json::Value = http
        .get(format!("{web}/api/v1/runbooks/hot-cap/shadow"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fire = report["fires"].as_array().unwrap().iter().find(|f| f["run"] == run.id.as_str()).expect("the fire");
    assert_eq!(fire["target"], "s1/gpu0");
    let ops: Vec<&str> = fire["would_act"].as_array().unwrap().iter().map(|w| w["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["set_power_limit", "drain"], "{fire}");
    for w in fire["would_act"].as_array().unwrap() {
        assert_eq!((w["agent_ok"].clone(), w["answer"].clone()), (true.into(), "dry run".into()), "{w}");
    }
    assert_eq!(fire["would_act"][0]["args"]["watts"], 300.0);
    let page = http.get(format!("{web}/runbooks/hot-cap/shadow")).bearer_auth(OPERATOR).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains(&run.id) && page.contains("set_power_limit"), "{page}");

    // Promotion: an operator is refused; an admin's is audited with why.
    let promote = |token: &'static str, reason: &'static str| {
        http.post(format!("{web}/api/v1/runbooks/hot-cap/mode"))
            .bearer_auth(token)
            .json(&serde_json::json!({"mode": "act", "reason": reason}))
            .send()
    };
    assert_eq!(promote(OPERATOR, "looks fine").await.unwrap().status(), 403);
    assert_eq!(mode_of(&engine, "hot-cap").await, "shadow");
    assert_eq!(promote(ADMIN, "").await.unwrap().status(), 400, "a promotion says why");
    let r = promote(ADMIN, "one right fire in shadow").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(mode_of(&engine, "hot-cap").await, "act");
    let modes: Vec<_> = engine
        .audit()
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::RunbookMode)
        .map(|r| (r.actor, r.runbook, r.data["from"].clone(), r.data["to"].clone(), r.data["reason"].clone()))
        .collect();
    assert_eq!(
        modes,
        [(
            "user:ada".to_string(),
            Some("hot-cap".to_string()),
            "shadow".into(),
            "act".into(),
            "one right fire in shadow".into()
        )]
    );
    // Kept across a restart of the engine.
    assert_eq!(
        nightshift_engine::embed::load_modes(engine.audit(), &engine.config().data_dir)
            .get("hot-cap")
            .map(|m| m.as_str()),
        Some("act")
    );

    server.abort();
    c.close().await;
    engine.shutdown().await;
    let (mut s1, mut s2) = (s1, s2);
    s1.stop().await;
    s2.stop().await;
}

/// A runbook's mode as a person reads it (`GET /api/v1/runbooks/{name}`).
async fn mode_of(engine: &nightshift_engine::engine::Engine, runbook: &str) -> String {
    use nightshift_engine::api::EngineApi;
    let api = nightshift_engine::api::Session::new(engine.clone(), "test", true);
    api.runbook(runbook).await.unwrap().runbook.mode
}
