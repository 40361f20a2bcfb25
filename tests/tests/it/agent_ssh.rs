//! The agent over real SSH on loopback: every op in dry-run and for real,
//! key and host-key checks, bad requests, concurrency, streams, restarts,
//! leases, ownership — and plain OpenSSH as a client.

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_proto::ssh::client::{AgentConnection, ClientError};
use nightshift_proto::*;
use nightshift_tests::TestAgent;
use serde_json::json;

fn sim(profile: &str) -> SimConfig {
    SimConfig { profile: profile.into(), gpus: 2, seed: 11, ..SimConfig::default() }
}

fn req(id: &str, op: Op) -> Request {
    Request::new(id, op)
}

fn dry(id: &str, op: Op) -> Request {
    let mut r = Request::new(id, op);
    r.dry_run = true;
    r
}

async fn telemetry(c: &AgentConnection) -> Telemetry {
    let r = c.call(&req(&format!("t-{}", rand_id()), Op::Telemetry(NoArgs {}))).await.unwrap();
    serde_json::from_value(r.result.unwrap()).unwrap()
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn action(r: &Reply) -> ActionResult {
    assert!(r.ok, "expected ok, got {r:?}");
    r.action().expect("an action result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_in_dry_run_and_for_real() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("n1")).unwrap();
    std::fs::write(dir.path().join("n1/nccl.env"), "NCCL_DEBUG=WARN\n").unwrap();
    let agent = TestAgent::start(dir.path(), "n1", sim("rtx6000-ada"), "").await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();

    // Reading ops.
    let inv: Inventory =
        serde_json::from_value(c.call(&req("inv", Op::Inventory(NoArgs {}))).await.unwrap().result.unwrap()).unwrap();
    assert_eq!((inv.node.as_str(), inv.backend.as_str(), inv.gpus.len()), ("n1", "sim", 2));
    assert_eq!(inv.configs, vec!["nccl-env".to_string()]);
    let t0 = telemetry(&c).await;
    assert_eq!(t0.gpus.len(), 2);

    let curve = vec![FanPoint { temp_c: 40.0, speed_pct: 40.0 }, FanPoint { temp_c: 70.0, speed_pct: 90.0 }];
    let ops: Vec<Op> = vec![
        Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 250.0 }),
        Op::SetFanCurve(SetFanCurveArgs { gpu: 0, points: curve.clone() }),
        Op::ResetFan(GpuArgs { gpu: 0 }),
        Op::SetClocks(SetClocksArgs { gpu: 1, min_mhz: 900, max_mhz: 1500 }),
        Op::ResetClocks(GpuArgs { gpu: 1 }),
        Op::ClearEcc(GpuArgs { gpu: 1 }),
        Op::SetGpuDrain(SetGpuDrainArgs { gpu: 1, drained: true, sticky: false, repair: false }),
        Op::Drain(DrainArgs { reason: "test drain".into(), run: Some("run-1".into()), sticky: false, repair: false }),
        Op::Resume(ResumeArgs { run: Some("run-1".into()) }),
        // The page cache only when asked (the default leaves it alone).
        Op::FlushCaches(FlushCachesArgs { drop_page_cache: true, signal_processes: true }),
        Op::ConfigApply(ConfigApplyArgs {
            name: "nccl-env".into(),
            content: "NCCL_DEBUG=INFO\n".into(),
            note: None,
            restart_consumer: true,
        }),
        Op::ConfigRollback(ConfigRollbackArgs { name: "nccl-env".into(), to_version: None, restart_consumer: true }),
        Op::ConfigMark(ConfigMarkArgs { name: "nccl-env".into(), version: 2, good: false }),
    ];
    // Preconditions so each op has something to do.
    c.call(&req("pre-ecc", Op::SimFault(SimFault::EccDbe { gpu: 1, count: 1 }))).await.unwrap();
    for (i, op) in ops.iter().enumerate() {
        let name = op.name();
        // Dry run: passes checks, changes nothing.
        let before = telemetry(&c).await;
        let r = c.call(&dry(&format!("dry-{i}"), op.clone())).await.unwrap();
        let a = action(&r);
        assert!(matches!(a.outcome, Outcome::DryRun | Outcome::Unchanged), "{name} dry run gave {:?}", a.outcome);
        let after = telemetry(&c).await;
        assert_eq!(before.gpus[0].power_limit_watts, after.gpus[0].power_limit_watts, "{name} dry run changed power");
        assert_eq!(before.node_metrics.drained, after.node_metrics.drained, "{name} dry run changed drain");

        // Back into service only once healthy: GPU 1 took a DBE (cleared
        // counters do not make it healthy), so the resume is refused until a
        // person resets the GPU.
        if matches!(op, Op::Resume(_)) {
            let r = c.call(&req("resume-unhealthy", op.clone())).await.unwrap();
            let e = r.error.clone().expect("refused while a GPU is unhealthy");
            assert_eq!(e.code, nightshift_proto::ErrorCode::Unhealthy, "{r:?}");
            assert!(e.message.contains("GPU 1") && e.message.contains("health check"), "{}", e.message);
            assert!(telemetry(&c).await.node_metrics.drained, "the refused resume left the drain in place");
            c.call(&req("reset-gpu1", Op::SimFault(SimFault::GpuReset { gpu: 1 }))).await.unwrap();
        }
        // For real.
        let r = c.call(&req(&format!("real-{i}"), op.clone())).await.unwrap();
        let a = action(&r);
        assert_eq!(a.outcome, Outcome::Applied, "{name}: {r:?}");
        let t = telemetry(&c).await;
        match op {
            Op::SetPowerLimit(_) => assert_eq!(t.gpus[0].power_limit_watts, 250.0),
            Op::SetClocks(_) => assert_eq!(a.after, json!({"clocks_locked_mhz": [900, 1500]})),
            Op::ClearEcc(_) => assert_eq!(t.gpus[1].ecc_dbe_total, 0),
            Op::SetGpuDrain(_) => assert!(t.gpus[1].gpu_drained),
            Op::Drain(_) => {
                assert!(t.node_metrics.drained);
                assert_eq!(t.node_metrics.drain_reason.as_deref(), Some("nightshift: run-1 test drain"));
            }
            Op::Resume(_) => assert!(!t.node_metrics.drained),
            Op::FlushCaches(_) => {
                assert_eq!(a.after["page_cache_dropped"], json!(true));
                assert_eq!(std::fs::read_to_string(dir.path().join("n1/drop_caches")).unwrap(), "1\n");
            }
            Op::ConfigApply(_) => {
                assert_eq!(std::fs::read_to_string(dir.path().join("n1/nccl.env")).unwrap(), "NCCL_DEBUG=INFO\n")
            }
            Op::ConfigRollback(_) => {
                assert_eq!(std::fs::read_to_string(dir.path().join("n1/nccl.env")).unwrap(), "NCCL_DEBUG=WARN\n")
            }
            _ => {}
        }
        assert_ne!(a.before, serde_json::Value::Null, "{name} has a before state");
    }
    // The agent runs the curve: the fan climbs toward the curve's speed for
    // the current temperature (the firmware curve ran it slower).
    let fan_before = telemetry(&c).await.gpus[0].fan_pct.unwrap();
    let r =
        c.call(&req("curve-again", Op::SetFanCurve(SetFanCurveArgs { gpu: 0, points: curve.clone() }))).await.unwrap();
    assert_eq!(action(&r).outcome, Outcome::Applied);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let t = telemetry(&c).await;
    let target = fan_curve_speed(&curve, t.gpus[0].temperature_c);
    let fan_after = t.gpus[0].fan_pct.unwrap();
    assert!(target > fan_before + 5.0, "the test curve asks for more airflow ({target} vs {fan_before})");
    assert!(
        fan_after > fan_before + 2.0 && fan_after <= target,
        "fan {fan_before} → {fan_after}, curve wants {target}"
    );
    let list = c.call(&req("cl", Op::ConfigList(ConfigListArgs { name: None }))).await.unwrap();
    assert_eq!(list.result.unwrap()[0]["versions"][1]["good"], json!(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanless_boards_answer_not_applicable() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "sxm", sim("h100-sxm"), "").await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let curve = vec![FanPoint { temp_c: 40.0, speed_pct: 40.0 }, FanPoint { temp_c: 70.0, speed_pct: 90.0 }];
    let r = c.call(&req("f", Op::SetFanCurve(SetFanCurveArgs { gpu: 0, points: curve }))).await.unwrap();
    let a = action(&r);
    assert_eq!(a.outcome, Outcome::NotApplicable);
    assert!(a.detail.unwrap().contains("has no controllable fan"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_both_ways() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "k1", sim("b200"), "").await;

    // An engine key the agent does not know.
    let mut cfg = agent.client_config();
    let other = nightshift_proto::ssh::keys::generate("stranger").unwrap();
    cfg.key = std::sync::Arc::new(other);
    let err = AgentConnection::connect(&cfg).await.err().unwrap();
    assert!(matches!(err, ClientError::AuthRejected { .. }), "{err}");
    assert!(err.to_string().contains("add the engine's public key"));

    // A client pinning the wrong host key refuses to talk.
    let mut cfg = agent.client_config();
    cfg.host_key_fingerprint = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into();
    let err = AgentConnection::connect(&cfg).await.err().unwrap();
    match &err {
        ClientError::HostKeyMismatch { found, .. } => assert_eq!(found, &agent.fingerprint()),
        other => panic!("expected a host key mismatch, got {other}"),
    }
}

/// The engine key rotated without restarting the agent (issue 30): the
/// new key added beside the old one is accepted at once; the old one,
/// removed, is refused; a half-written file keeps the keys before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_key_rotates_without_restarting_the_agent() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "k2", sim("b200"), "").await;
    let path = agent.cfg.authorized_keys_path.clone();
    let old_line = std::fs::read_to_string(&path).unwrap();
    let new_key = nightshift_proto::ssh::keys::generate("engine-2027").unwrap();
    let new_line = format!("{}\n", new_key.public_key().to_openssh().unwrap());
    let with = |key: &nightshift_proto::ssh::keys::PrivateKey| {
        let mut cfg = agent.client_config();
        cfg.key = std::sync::Arc::new(key.clone());
        cfg
    };
    let old_cfg = agent.client_config();
    let new_cfg = with(&new_key);
    assert!(AgentConnection::connect(&new_cfg).await.is_err(), "not yet authorized");
    // Both keys: both accepted, no restart.
    std::fs::write(&path, format!("{old_line}{new_line}")).unwrap();
    AgentConnection::connect(&new_cfg).await.expect("the new key, at once");
    AgentConnection::connect(&old_cfg).await.expect("the old key, still");
    // A half-written file: the keys before it stay.
    std::fs::write(&path, "ssh-ed25519 AAAA-cut-short").unwrap();
    AgentConnection::connect(&new_cfg).await.expect("the keys before a broken file stay");
    // The old key removed: refused.
    std::fs::write(&path, &new_line).unwrap();
    let err = AgentConnection::connect(&old_cfg).await.err().expect("the old key is refused");
    assert!(matches!(err, ClientError::AuthRejected { .. }), "{err}");
    AgentConnection::connect(&new_cfg).await.expect("the new key goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_error_replies_and_the_agent_keeps_serving() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "b1", sim("h100-sxm"), "").await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let big = format!(
        r#"{{"v":1,"id":"big","op":"config_apply","args":{{"name":"nccl-env","content":"{}"}}}}"#,
        "x".repeat(40_000)
    );
    let cases: Vec<(Vec<u8>, ErrorCode, &str)> = vec![
        (b"{not json".to_vec(), ErrorCode::BadRequest, "request is not valid JSON"),
        (br#"{"v":1,"id":"u1","op":"format_disk"}"#.to_vec(), ErrorCode::UnknownOp, "unknown op `format_disk`"),
        (
            br#"{"v":1,"id":"u2","op":"set_power_limit","args":{"gpu":0}}"#.to_vec(),
            ErrorCode::BadRequest,
            "missing field `watts`",
        ),
        (br#"{"v":9,"id":"u3","op":"inventory"}"#.to_vec(), ErrorCode::UnsupportedVersion, "expected 1, found 9"),
        (big.into_bytes(), ErrorCode::TooLarge, "bytes: expected at most 32768"),
        (vec![0xff, 0xfe, 0x00], ErrorCode::BadRequest, "request is not valid JSON"),
    ];
    for (bytes, code, needle) in cases {
        let (out, status) = c.exec_raw(&bytes).await.unwrap();
        let reply = Reply::parse(&out).unwrap();
        assert!(!reply.ok);
        assert_eq!(reply.code(), Some(code), "{reply:?}");
        assert!(reply.error.as_ref().unwrap().message.contains(needle), "{reply:?} lacks {needle}");
        assert_eq!(status, Some(1));
    }
    // Still serving on the same connection.
    let r = c.call(&req("after", Op::Inventory(NoArgs {}))).await.unwrap();
    assert!(r.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_channels_at_once_and_a_telemetry_stream() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "c1", sim("mi300x"), "telemetry_interval_ms: 50\n").await;
    let c = std::sync::Arc::new(AgentConnection::connect(&agent.client_config()).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move { c.call(&req(&format!("p{i}"), Op::Telemetry(NoArgs {}))).await }));
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap().ok);
    }
    let mut rx = c.subscribe("sub-1", None).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let t = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
        seen.push(t.ts_ms);
    }
    assert!(seen.windows(2).all(|w| w[1] >= w[0]));
    drop(rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envelope_holds_over_ssh() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\npower:\n  floor_watts: 350\nfan:\n  min_pct: 30\nrate_limits:\n  power_limit: {{max_changes: 2, window_secs: 600}}\nhands_off_marker_path: {}\n",
            dir.path().join("HANDS_OFF").display()
        ),
    )
    .unwrap();
    let agent =
        TestAgent::start(dir.path(), "e1", sim("h100-sxm"), &format!("policy_path: {}\n", policy.display())).await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();

    let r = c.call(&req("low", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 90.0 }))).await.unwrap();
    assert_eq!(r.code(), Some(ErrorCode::OutOfEnvelope));
    assert_eq!(r.error.unwrap().message, "power limit 90 W is below the floor 350 W for GPU 0 (NVIDIA H100 80GB HBM3)");
    let r = c.call(&req("high", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 900.0 }))).await.unwrap();
    assert_eq!(
        r.error.unwrap().message,
        "power limit 900 W is above the ceiling 700 W for GPU 0 (NVIDIA H100 80GB HBM3)"
    );

    // Rate limit: two changes pass, the third is refused.
    for (i, w) in [500.0, 450.0].iter().enumerate() {
        let r =
            c.call(&req(&format!("rl{i}"), Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: *w }))).await.unwrap();
        assert!(r.ok, "{r:?}");
    }
    let r = c.call(&req("rl2", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 400.0 }))).await.unwrap();
    assert_eq!(r.code(), Some(ErrorCode::RateLimited), "{r:?}");
    assert!(r.error.unwrap().message.contains("(limit 2)"));

    // Hands-off blocks every mutating op, dry runs included.
    std::fs::write(dir.path().join("HANDS_OFF"), "dave: replacing fans\n").unwrap();
    let mutating = [
        Op::SetPowerLimit(SetPowerLimitArgs { gpu: 1, watts: 400.0 }),
        Op::ResetFan(GpuArgs { gpu: 0 }),
        Op::SetClocks(SetClocksArgs { gpu: 0, min_mhz: 500, max_mhz: 1000 }),
        Op::ClearEcc(GpuArgs { gpu: 0 }),
        Op::SetGpuDrain(SetGpuDrainArgs { gpu: 0, drained: true, sticky: false, repair: false }),
        Op::Drain(DrainArgs { reason: "x".into(), run: None, sticky: false, repair: false }),
        Op::Resume(ResumeArgs::default()),
        Op::FlushCaches(FlushCachesArgs::default()),
        Op::ConfigApply(ConfigApplyArgs {
            name: "nccl-env".into(),
            content: "A=1\n".into(),
            note: None,
            restart_consumer: true,
        }),
    ];
    for (i, op) in mutating.iter().enumerate() {
        for dry_run in [false, true] {
            let mut r = req(&format!("ho{i}{dry_run}"), op.clone());
            r.dry_run = dry_run;
            let reply = c.call(&r).await.unwrap();
            assert_eq!(reply.code(), Some(ErrorCode::HandsOff), "{} {reply:?}", op.name());
        }
    }
    let t = telemetry(&c).await;
    assert!(t.node_metrics.hands_off);
    assert!(!t.node_metrics.drained);
    // Reading still works.
    assert!(c.call(&req("inv", Op::Inventory(NoArgs {}))).await.unwrap().ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_id_is_never_reapplied_even_after_restart() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let mut agent = TestAgent::start(dir.path(), "i1", sim("h100-sxm"), "").await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let first = c.call(&req("once", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 500.0 }))).await.unwrap();
    assert_eq!(action(&first).outcome, Outcome::Applied);
    // Someone else changes the limit; replaying the id must not put 500 back.
    c.call(&req("other", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 600.0 }))).await.unwrap();
    let again = c.call(&req("once", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 500.0 }))).await.unwrap();
    assert_eq!(again, first, "the recorded reply comes back");
    assert_eq!(telemetry(&c).await.gpus[0].power_limit_watts, 600.0, "and nothing was re-applied");
    // The same id for a different request is a conflict.
    let r = c.call(&req("once", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 450.0 }))).await.unwrap();
    assert_eq!(r.code(), Some(ErrorCode::Conflict));

    agent.restart().await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let after = c.call(&req("once", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 500.0 }))).await.unwrap();
    assert_eq!(after, first, "the journal survived the restart");
    // The (simulated) hardware kept its 600 W across the agent restart, as
    // a real GPU does: the replay did not put 500 W back.
    assert_eq!(telemetry(&c).await.gpus[0].power_limit_watts, 600.0);
    let status = c.call(&req("st", Op::ActionStatus(ActionStatusArgs { request_id: "once".into() }))).await.unwrap();
    assert_eq!(status.result.unwrap()["state"], json!("done"));
    let lines = agent.started.as_ref().unwrap().agent.journal_lines();
    let applied = lines
        .iter()
        .filter(|l| matches!(l, nightshift_agent::journal::JournalLine::Pending { id, .. } if id == "once"))
        .count();
    assert_eq!(applied, 1, "applied exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_reverts_on_time_with_the_engine_gone() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "l1", sim("h100-sxm"), "").await;
    {
        let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
        let mut r = req("lease", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 400.0 }));
        r.revert_after_secs = Some(1);
        let a = action(&c.call(&r).await.unwrap());
        assert!(a.lease.is_some());
        assert_eq!(telemetry(&c).await.gpus[0].power_limit_watts, 400.0);
        c.close().await;
    }
    // The engine is gone; the agent's own clock reverts the change.
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    assert_eq!(telemetry(&c).await.gpus[0].power_limit_watts, 700.0);
    let st = c.call(&req("s", Op::ActionStatus(ActionStatusArgs { request_id: "lease".into() }))).await.unwrap();
    assert_eq!(st.result.unwrap()["reverted"]["ok"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drained_by_a_person_is_never_resumed() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "p1", sim("h100-sxm"), "").await;
    let c = AgentConnection::connect(&agent.client_config()).await.unwrap();
    c.call(&req("pd", Op::SimFault(SimFault::PersonDrain { reason: "dave: reseating GPU 3".into() }))).await.unwrap();
    // nightshift's drain leaves the person's reason alone.
    let r = c
        .call(&req(
            "d",
            Op::Drain(DrainArgs { reason: "hot".into(), run: Some("r9".into()), sticky: false, repair: false }),
        ))
        .await
        .unwrap();
    let a = action(&r);
    assert_eq!(a.outcome, Outcome::Held, "the hold is recorded; the device is left as the person set it");
    assert!(a.detail.unwrap().contains("the baseline (node drained (dave: reseating GPU 3))"));
    // Resuming undoes nightshift's drain hold — the person's drain stays.
    let mut rq = req("res-own", Op::Resume(ResumeArgs::default()));
    rq.owner = Some("r10".into());
    let r = c.call(&rq).await.unwrap();
    assert_eq!(action(&r).released.unwrap().released, vec!["d".to_string()]);
    let t = telemetry(&c).await;
    assert!(t.node_metrics.drained);
    assert_eq!(t.node_metrics.drain_reason.as_deref(), Some("dave: reseating GPU 3"));
    assert!(t.node_metrics.holds.is_empty());
    // With no drain of nightshift's left, nothing puts the node in service
    // over a person's drain.
    for dry_run in [true, false] {
        let mut rq = req(&format!("res-{dry_run}"), Op::Resume(ResumeArgs::default()));
        rq.dry_run = dry_run;
        rq.owner = Some("r10".into());
        let r = c.call(&rq).await.unwrap();
        assert_eq!(r.code(), Some(ErrorCode::NotOwner), "{r:?}");
        assert!(r.error.unwrap().message.contains("dave: reseating GPU 3"));
    }
}

/// This process's soft limit on open files (`/proc/self/limits`).
fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("Max open files")).and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(1024)
}

/// `ssh` with the engine's key against `agent`, extra arguments first.
async fn openssh(dir: &std::path::Path, agent: &TestAgent, args: &[&str]) -> (std::process::Output, Duration) {
    let port = agent.addr().rsplit(':').next().unwrap().to_string();
    let started = std::time::Instant::now();
    let mut c = tokio::process::Command::new("ssh");
    c.arg("-i").arg(dir.join("engine_key")).args([
        "-p",
        &port,
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
    ]);
    c.args(args).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), c.output())
        .await
        .expect("ssh returned within 20 s")
        .expect("the `ssh` client (openssh-client) is installed");
    (out, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shells_terminals_and_sftp_are_refused_at_once() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "o2", sim("h100-sxm"), "").await;
    for (what, args) in [
        ("a login shell", vec!["nightshift@127.0.0.1"]),
        ("ssh -tt", vec!["-tt", "nightshift@127.0.0.1"]),
        ("sftp", vec!["-s", "nightshift@127.0.0.1", "sftp"]),
    ] {
        let (out, took) = openssh(dir.path(), &agent, &args).await;
        assert!(!out.status.success(), "{what}: {out:?}");
        assert!(took < Duration::from_secs(1) + Duration::from_millis(500), "{what} took {took:?}");
        eprintln!("{what}: {took:?} {}", String::from_utf8_lossy(&out.stderr));
    }
    // The agent still answers.
    let (out, _) =
        openssh(dir.path(), &agent, &["nightshift@127.0.0.1", r#"{"v":1,"id":"after","op":"inventory","args":{}}"#])
            .await;
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_capped_and_the_engine_still_gets_in() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let extra = "ssh: {preauth_timeout_secs: 2, max_unauthenticated: 64, max_unauthenticated_per_source: 64}\n";
    let agent = TestAgent::start(dir.path(), "f1", sim("h100-sxm"), extra).await;
    let engine = AgentConnection::connect(&agent.client_config()).await.unwrap();
    // A flood of idle TCP connections that never speak SSH: 10,000, or as
    // many as this process may open.
    let flood = 10_000.min(open_files_limit().saturating_sub(500));
    eprintln!("opening {flood} idle connections");
    let mut idle = Vec::new();
    for _ in 0..flood {
        match tokio::net::TcpStream::connect(agent.addr()).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect: {e}"),
        }
    }
    // The already connected engine is served meanwhile.
    let r = engine.call(&req("during", Op::Inventory(NoArgs {}))).await.unwrap();
    assert!(r.ok, "{r:?}");
    // Past the pre-auth timeout every idle connection has been closed by
    // the agent (a read sees EOF or a reset): none is held open.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut closed = 0;
    for mut s in idle {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed += 1;
                    break;
                }
                Ok(Ok(_)) => continue, // the server's version line
                Err(_) => break,       // still open
            }
        }
    }
    assert_eq!(closed, flood, "idle connections still open after the pre-auth timeout");
    // A new engine connection gets in.
    let fresh = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let r = fresh.call(&req("after", Op::Inventory(NoArgs {}))).await.unwrap();
    assert!(r.ok, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_openssh_is_a_client() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "o1", sim("h100-sxm"), "").await;
    let port = agent.addr().rsplit(':').next().unwrap().to_string();
    let key = dir.path().join("engine_key");
    let out = tokio::process::Command::new("ssh")
        .args(["-i"])
        .arg(&key)
        .args([
            "-p",
            &port,
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "nightshift@127.0.0.1",
            r#"{"v":1,"id":"from-openssh","op":"set_power_limit","args":{"gpu":0,"watts":450},"dry_run":true}"#,
        ])
        .output()
        .await
        .expect("the `ssh` client (openssh-client) is installed");
    assert!(out.status.success(), "ssh failed: {}", String::from_utf8_lossy(&out.stderr));
    let reply = Reply::parse(&out.stdout).unwrap();
    assert_eq!(reply.id, "from-openssh");
    let a = reply.action().unwrap();
    assert_eq!(a.outcome, Outcome::DryRun);
    assert_eq!(a.after, json!({"power_limit_watts": 450.0}));
}

/// Issue 46 point 8: `fleet import` with two hosts at one address wrote
/// both, with one host key; a release on one then changed the other,
/// audited under the wrong name. Refused now, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_import_refuses_two_hosts_at_one_address() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let port = nightshift_tests::external::free_port();
    let a = TestAgent::start_at(
        dir.path(),
        "gpu01",
        SimConfig { gpus: 1, ..SimConfig::default() },
        "",
        &format!("127.0.0.1:{port}"),
    )
    .await;
    let ini = dir.path().join("hosts.ini");
    std::fs::write(&ini, "[gpu]\ngpu01 ansible_host=127.0.0.1\ngpu02 ansible_host=127.0.0.1\n").unwrap();
    let fleet = dir.path().join("fleet.yaml");
    let out = std::process::Command::new(nightshift_tests::external::workspace_bin_dir().join("nightshift"))
        .args(["fleet", "import", "--yes", "--timeout-secs", "3", "--port", &port.to_string(), "--inventory"])
        .arg(&ini)
        .arg("--out")
        .arg(&fleet)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("found `gpu02` at 127.0.0.1:{port}, the address of `gpu01`"))
            && text.contains("nothing written"),
        "{text}"
    );
    assert!(!fleet.exists());
    drop(a);
}
