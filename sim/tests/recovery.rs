//! Crash recovery: a run cut off mid-action is `interrupted` after restart,
//! its open intent is reconciled with the agent by request id, the action
//! is never applied twice, and the run's hold is released (the GPU goes back
//! to its baseline).

mod common;

use std::sync::Arc;

use common::*;
use futures::future::BoxFuture;
use nightshift_agent::LocalAgent;
use nightshift_engine::audit::{AuditStore, RecordKind};
use nightshift_engine::engine::{Engine, EngineParts};
use nightshift_engine::inventory::NodeSpec;
use nightshift_engine::runs::{RunOutcome, Target};
use nightshift_engine::script::{ScriptLimits, build_engine};
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
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_is_marked_and_its_action_not_reapplied() {
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
    copy_dir(&f.dir.join("engine"), crash.path());
    let clock: nightshift_proto::clock::SharedClock = Arc::new(f.clock.clone());
    let audit = AuditStore::open(crash.path(), clock.clone()).unwrap();
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = nightshift_engine::runbook::load_dir(rb.path(), &script);
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
            },
            "sim".into(),
            Arc::new(LocalAgent(agent.clone())) as Arc<dyn AgentTransport>,
        )],
        script,
        runbooks: set,
    });
    let recovered = engine2.recover().await.unwrap();
    assert_eq!(recovered, vec![id.clone()]);
    let run = engine2.run(&id).unwrap().unwrap();
    assert_eq!(run.outcome, Some(RunOutcome::Interrupted));
    let recs = engine2.run_records(&id).unwrap();
    let reconciled = recs.iter().find(|r| r.kind == RecordKind::ActionResult).unwrap();
    assert_eq!(reconciled.data["reconciled"], true);
    assert_eq!(reconciled.data["agent_status"]["state"], "done", "{reconciled:?}");
    assert_eq!(recs.last().unwrap().kind, RecordKind::RunFinished);
    assert!(engine2.verify().unwrap().ok);
    // The agent applied it exactly once; the restart re-sent nothing.
    let lines = nightshift_agent::journal::Journal::read_lines(&agent.journal_path()).unwrap();
    let pending = lines
        .iter()
        .filter(|l| matches!(l, nightshift_agent::journal::JournalLine::Pending { id, .. } if *id == action_id))
        .count();
    assert_eq!(pending, 1);
    // The interrupted run's hold was released: the baseline is back.
    let r = agent.handle(Request::new("probe", Op::Telemetry(NoArgs {}))).await;
    let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
    assert_eq!(t.gpus[0].power_limit_watts, 700.0);
    assert!(t.node_metrics.holds.is_empty(), "{:?}", t.node_metrics.holds);
    let release = recs.iter().find(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "release").unwrap();
    assert_eq!(release.data["after"]["settings"][0]["outcome"], "restored", "{release:?}");
    // A second recovery finds nothing left to do.
    assert!(engine2.recover().await.unwrap().is_empty());
    gate.notify_waiters();
    gate.notify_one();
}
