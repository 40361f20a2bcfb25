//! Holds on a real agent (sim backend, virtual clock, state in a temp dir):
//! overlapping holds end at the baseline, everything survives an agent
//! restart, leases act on the agent's own clock but never during hands-off,
//! a person's change is never overwritten, sticky drains wait for a person,
//! `sim_fault` is sim-only and journaled.

use std::path::Path;
use std::sync::Arc;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::envelope::RateLimit;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::node::configs::ManagedConfig;
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_proto::clock::{Clock, SharedClock, VirtualClock};
use nightshift_proto::*;

struct Node {
    dir: tempfile::TempDir,
    clock: VirtualClock,
    profile: &'static str,
    sim: Arc<SimBackend>,
    agent: Agent,
    next: u32,
}

fn options(dir: &Path) -> AgentOptions {
    let mut o = AgentOptions::new("n1", dir.join("state"));
    o.configs.insert("nccl-env".into(), ManagedConfig::file(dir.join("nccl.env")));
    o.policy.rate_limits.insert(ActionKind::PowerLimit, RateLimit { max_changes: 6, window_secs: 600 });
    o
}

fn open(dir: &Path, profile: &str, clock: &VirtualClock) -> (Arc<SimBackend>, Agent) {
    let sim = Arc::new(
        SimBackend::new(SimConfig { profile: profile.into(), gpus: 2, ..SimConfig::default() })
            .unwrap()
            .persist_to(dir.join("sim-hardware.json")),
    );
    let backend: Arc<dyn Backend> = sim.clone();
    let shared: SharedClock = Arc::new(clock.clone());
    let agent = Agent::new(options(dir), backend, shared).unwrap();
    (sim, agent)
}

impl Node {
    fn new(profile: &'static str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nccl.env"), "NCCL_DEBUG=WARN\n").unwrap();
        let clock = VirtualClock::new(1_000_000);
        let (sim, agent) = open(dir.path(), profile, &clock);
        Node { dir, clock, profile, sim, agent, next: 0 }
    }

    /// Stop the agent and start a new one on the same state dir (the
    /// hardware keeps its settings, as real GPUs do).
    fn restart(&mut self) {
        self.agent.close();
        let (sim, agent) = open(self.dir.path(), self.profile, &self.clock);
        self.sim = sim;
        self.agent = agent;
    }

    async fn call(&mut self, owner: &str, op: Op, lease: Option<u64>) -> Reply {
        self.next += 1;
        let mut req = Request::new(format!("{owner}-a{}", self.next), op);
        req.owner = Some(owner.into());
        req.revert_after_secs = lease;
        self.agent.handle(req).await
    }

    async fn ok(&mut self, owner: &str, op: Op, lease: Option<u64>) -> Value {
        let name = op.name();
        let r = self.call(owner, op, lease).await;
        assert!(r.ok, "{owner} {name}: {:?}", r.error);
        r.result.unwrap()
    }

    fn power(&self, gpu: u32) -> f64 {
        self.sim.sample().unwrap().0[gpu as usize].power_limit_watts
    }

    async fn advance(&self, secs: i64) {
        self.clock.advance(secs * 1000);
        self.agent.tick().await;
    }

    fn held(&self) -> Vec<SettingView> {
        self.agent.held()
    }
}

type Value = serde_json::Value;

fn cap(gpu: u32, watts: f64) -> Op {
    Op::SetPowerLimit(SetPowerLimitArgs { gpu, watts })
}

fn release_owner(owner: &str) -> Op {
    Op::Release(ReleaseArgs { owner: Some(owner.into()), ..Default::default() })
}

#[tokio::test]
async fn two_runs_capping_one_gpu_end_at_the_baseline_across_restarts() {
    for restart in [false, true] {
        let mut n = Node::new("h100-sxm");
        assert_eq!(n.power(0), 700.0);
        n.ok("r1", cap(0, 500.0), Some(600)).await;
        assert_eq!(n.power(0), 500.0);
        // A second run caps lower, later: the lowest wins.
        n.advance(30).await;
        let v = n.ok("r2", cap(0, 450.0), Some(600)).await;
        assert_eq!(v["outcome"], "applied");
        assert_eq!(n.power(0), 450.0);
        // A third caps higher: held, nothing on the device changes.
        let v = n.ok("r3", cap(0, 650.0), Some(600)).await;
        assert_eq!(v["outcome"], "held", "{v}");
        assert_eq!(n.power(0), 450.0);
        if restart {
            n.restart();
            assert_eq!(n.held()[0].holds.len(), 3, "holds survive the restart");
        }
        // The lowest goes: the next lowest takes over, not the baseline.
        let r: ReleaseResult = serde_json::from_value(n.ok("r2", release_owner("r2"), None).await).unwrap();
        assert_eq!(r.settings[0].outcome, RestoreOutcome::StillHeld);
        assert_eq!(n.power(0), 500.0);
        n.ok("r1", release_owner("r1"), None).await;
        assert_eq!(n.power(0), 650.0);
        let r: ReleaseResult = serde_json::from_value(n.ok("r3", release_owner("r3"), None).await).unwrap();
        assert_eq!(r.settings[0].outcome, RestoreOutcome::Restored, "{r:?}");
        assert_eq!(n.power(0), 700.0, "the baseline read before the first hold, not a capped reading");
        assert!(n.held().is_empty());
    }
}

#[tokio::test]
async fn fan_clock_and_power_holds_survive_a_restart_and_expire_on_time() {
    let mut n = Node::new("rtx6000-ada");
    let curve = vec![FanPoint { temp_c: 40.0, speed_pct: 60.0 }, FanPoint { temp_c: 70.0, speed_pct: 100.0 }];
    n.ok("r1", Op::SetFanCurve(SetFanCurveArgs { gpu: 0, points: curve.clone() }), Some(300)).await;
    n.ok("r1", Op::SetClocks(SetClocksArgs { gpu: 0, min_mhz: 300, max_mhz: 1500 }), Some(400)).await;
    n.ok("r1", cap(0, 250.0), Some(500)).await;
    n.restart();
    let held = n.held();
    let kinds: Vec<&str> = held.iter().map(|h| h.setting.kind()).collect();
    assert_eq!(kinds, vec!["fan_curve", "clocks", "power_limit"], "all three reported after the restart");
    // The restarted agent keeps driving the fan curve.
    n.advance(1).await;
    n.sim.step(20.0);
    let fan = n.sim.sample().unwrap().0[0].fan_pct.unwrap();
    assert!(fan >= 60.0, "fan driven by the held curve after the restart: {fan}");
    assert_eq!(n.power(0), 250.0);
    // Each lease ends on the agent's clock.
    n.advance(300).await;
    let kinds: Vec<String> = n.held().iter().map(|h| h.setting.kind().to_string()).collect();
    assert_eq!(kinds, vec!["clocks", "power_limit"], "the fan hold expired at 300 s");
    n.advance(100).await;
    assert_eq!(n.held().len(), 1, "the clock hold expired at 400 s");
    assert_eq!(n.power(0), 250.0);
    n.advance(100).await;
    assert!(n.held().is_empty());
    assert_eq!(n.power(0), 300.0, "power back to its baseline at 500 s");
    // Each expiry is in the journal, against the request that placed it.
    let lines = n.agent.journal_lines();
    let reverted = lines.iter().filter(|l| matches!(l, JournalLine::Reverted { ok: true, .. })).count();
    assert_eq!(reverted, 3, "{lines:?}");
}

#[tokio::test]
async fn reset_style_releases_and_rate_limits_work_after_a_restart() {
    let mut n = Node::new("rtx6000-ada");
    let curve = vec![FanPoint { temp_c: 40.0, speed_pct: 50.0 }, FanPoint { temp_c: 80.0, speed_pct: 100.0 }];
    n.ok("r1", Op::SetFanCurve(SetFanCurveArgs { gpu: 1, points: curve }), Some(3600)).await;
    n.ok("r1", Op::SetClocks(SetClocksArgs { gpu: 1, min_mhz: 300, max_mhz: 1200 }), Some(3600)).await;
    for w in [290.0, 280.0, 270.0, 260.0, 250.0, 240.0] {
        n.ok("r2", cap(1, w), Some(3600)).await;
    }
    n.restart();
    let v = n.ok("r1", Op::ResetFan(GpuArgs { gpu: 1 }), None).await;
    assert_eq!(v["outcome"], "applied", "{v}");
    assert_eq!(v["released"]["settings"][0]["outcome"], "restored");
    let v = n.ok("r1", Op::ResetClocks(GpuArgs { gpu: 1 }), None).await;
    assert_eq!(v["released"]["settings"][0]["outcome"], "restored", "{v}");
    let v = n.ok("r1", Op::ResetClocks(GpuArgs { gpu: 1 }), None).await;
    assert_eq!(v["outcome"], "unchanged", "nothing left to release: {v}");
    // The rate window (6 power changes per 600 s) survived the restart.
    let r = n.call("r2", cap(1, 230.0), Some(3600)).await;
    assert_eq!(r.code(), Some(ErrorCode::RateLimited), "{r:?}");
    n.advance(601).await;
    n.ok("r2", cap(1, 230.0), Some(3600)).await;
}

#[tokio::test]
async fn hands_off_freezes_leases_and_a_persons_change_is_left_alone() {
    let mut n = Node::new("h100-sxm");
    n.ok("r1", cap(0, 450.0), Some(60)).await;
    n.ok(
        "r1",
        Op::ConfigApply(ConfigApplyArgs {
            name: "nccl-env".into(),
            content: "NCCL_P2P_LEVEL=NVL\n".into(),
            note: None,
            restart_consumer: true,
        }),
        Some(60),
    )
    .await;
    let marker = n.agent.options().policy.hands_off_marker_path.clone();
    std::fs::write(&marker, "dave is on it\n").unwrap();
    n.advance(120).await;
    assert_eq!(n.power(0), 450.0, "no lease acts while the marker exists");
    assert_eq!(n.held().len(), 2);
    // Meanwhile a person sets the limit and fixes the config by hand.
    n.sim.set_power_limit(0, 600.0).unwrap();
    std::fs::write(n.dir.path().join("nccl.env"), "NCCL_DEBUG=INFO\n").unwrap();
    // Changes are refused during hands-off, releases too.
    let r = n.call("r1", release_owner("r1"), None).await;
    assert_eq!(r.code(), Some(ErrorCode::HandsOff));
    std::fs::remove_file(&marker).unwrap();
    n.advance(1).await;
    assert!(n.held().is_empty(), "the leases act once the marker is gone");
    assert_eq!(n.power(0), 600.0, "the person's limit stays");
    assert_eq!(std::fs::read_to_string(n.dir.path().join("nccl.env")).unwrap(), "NCCL_DEBUG=INFO\n");
    let lines = n.agent.journal_lines();
    let drifted: Vec<&String> = lines
        .iter()
        .filter_map(|l| match l {
            JournalLine::Reverted { detail, .. } => Some(detail),
            _ => None,
        })
        .collect();
    assert_eq!(drifted.len(), 2, "{lines:?}");
    assert!(drifted.iter().all(|d| d.contains("a person changed it")), "{drifted:?}");
}

#[tokio::test]
async fn sticky_drains_wait_for_a_person_and_persons_drains_are_never_undone() {
    let mut n = Node::new("h100-sxm");
    let drain = |sticky| Op::Drain(DrainArgs { reason: "DBE on GPU 1: RMA".into(), run: None, sticky, repair: false });
    let v = n.ok("r1", drain(true), None).await;
    assert!(v["hold"]["expires_at_ms"].is_null(), "sticky: no lease: {v}");
    let r = n.call("r1", drain(true), Some(60)).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "a sticky drain with a lease is refused");
    n.advance(100_000).await;
    assert!(n.agent.telemetry().await.unwrap().node_metrics.drained);
    // The run's own release leaves it; a run cannot release it by id either.
    let r: ReleaseResult = serde_json::from_value(n.ok("r1", release_owner("r1"), None).await).unwrap();
    assert!(r.released.is_empty());
    let id = n.held()[0].holds[0].id.clone();
    let r = n.call("r9", Op::Release(ReleaseArgs { hold: Some(id.clone()), ..Default::default() }), None).await;
    assert_eq!(r.code(), Some(ErrorCode::NotOwner), "{r:?}");
    // A scale-out's in-service hold does not undo it.
    let v = n.ok("r5", Op::Resume(ResumeArgs { run: None }), Some(600)).await;
    assert_eq!(v["outcome"], "held", "{v}");
    assert!(n.agent.telemetry().await.unwrap().node_metrics.drained);
    n.ok("r5", release_owner("r5"), None).await;
    // A person releases it.
    n.ok("person:dave", Op::Release(ReleaseArgs { hold: Some(id), ..Default::default() }), None).await;
    let t = n.agent.telemetry().await.unwrap();
    assert!(!t.node_metrics.drained, "{:?}", t.node_metrics.drain_reason);

    // A person's drain: nightshift's drain hold leaves its reason alone, and
    // nothing of nightshift resumes it.
    n.ok("sim", Op::SimFault(SimFault::PersonDrain { reason: "fan swap by dave".into() }), None).await;
    let v = n.ok("r2", drain(false), Some(600)).await;
    assert_eq!(v["outcome"], "held", "{v}");
    // A resume releases nightshift's drain hold and leaves the person's.
    let v = n.ok("r3", Op::Resume(ResumeArgs { run: None }), Some(600)).await;
    assert_eq!(v["released"]["settings"][0]["outcome"], "restored", "{v}");
    let r = n.call("r3", Op::Resume(ResumeArgs { run: None }), Some(600)).await;
    assert_eq!(r.code(), Some(ErrorCode::NotOwner), "{r:?}");
    let t = n.agent.telemetry().await.unwrap();
    assert_eq!(t.node_metrics.drain_reason.as_deref(), Some("fan swap by dave"));
}

/// Issue 42 point 5: a GPU out for a fault has no lease — it does not come
/// back a day later, nor with a person's resume of the node, nor with its
/// run's end; a person (or its owner after a passing health check, for a
/// repair) ends it; it survives an agent restart.
#[tokio::test]
async fn a_gpu_out_for_a_fault_stays_out_until_a_person_or_its_repair_ends_it() {
    let mut n = Node::new("h100-sxm");
    let gpu_drain = |sticky, repair, drained| Op::SetGpuDrain(SetGpuDrainArgs { gpu: 1, drained, sticky, repair });
    let r = n.call("r1", gpu_drain(true, false, true), Some(60)).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "a sticky GPU drain with a lease is refused: {r:?}");
    let r = n.call("r1", gpu_drain(true, true, false), None).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "a sticky undrain means nothing: {r:?}");
    let v = n.ok("r1", gpu_drain(true, false, true), None).await;
    assert!(v["hold"]["expires_at_ms"].is_null(), "sticky: no lease: {v}");
    let gpu_out = |t: &Telemetry| t.gpus[1].gpu_drained;
    // Two days, a restart, the run's own release, a person's resume of the
    // node: still out.
    n.advance(2 * 86_400).await;
    n.restart();
    assert!(gpu_out(&n.agent.telemetry().await.unwrap()), "out after two days and a restart");
    let r: ReleaseResult = serde_json::from_value(n.ok("r1", release_owner("r1"), None).await).unwrap();
    assert!(r.released.is_empty(), "{r:?}");
    n.ok("sim", Op::SimFault(SimFault::PersonDrain { reason: "dave".into() }), None).await;
    n.ok("sim", Op::SimFault(SimFault::PersonResume {}), None).await;
    assert!(gpu_out(&n.agent.telemetry().await.unwrap()), "a person's resume of the node leaves the GPU out");
    let id = n.held().iter().find(|h| h.setting == Setting::GpuDrain { gpu: 1 }).unwrap().holds[0].id.clone();
    let r = n.call("r1", Op::Release(ReleaseArgs { hold: Some(id.clone()), ..Default::default() }), None).await;
    assert_eq!(r.code(), Some(ErrorCode::NotOwner), "an RMA's GPU drain is a person's to end: {r:?}");
    n.ok("person:dave", Op::Release(ReleaseArgs { hold: Some(id), ..Default::default() }), None).await;
    assert!(!gpu_out(&n.agent.telemetry().await.unwrap()));
}

#[tokio::test]
async fn a_config_baseline_marked_bad_is_never_restored() {
    let mut n = Node::new("h100-sxm");
    let file = n.dir.path().join("nccl.env");
    let rollback =
        Op::ConfigRollback(ConfigRollbackArgs { name: "nccl-env".into(), to_version: None, restart_consumer: true });
    // A run applies a config and releases it: the first version comes back.
    let apply = ConfigApplyArgs {
        name: "nccl-env".into(),
        content: "NCCL_P2P_LEVEL=NVL\n".into(),
        note: None,
        restart_consumer: true,
    };
    n.ok("r0", Op::ConfigApply(apply), Some(600)).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_P2P_LEVEL=NVL\n");
    let r: ReleaseResult = serde_json::from_value(n.ok("r0", release_owner("r0"), None).await).unwrap();
    assert_eq!(r.settings[0].outcome, RestoreOutcome::Restored, "{r:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_DEBUG=WARN\n");
    // A person edits the file by hand and breaks P2P; a run rolls back to
    // the last good version and marks the hand edit bad.
    std::fs::write(&file, "NCCL_P2P_DISABLE=1\n").unwrap();
    let v = n.ok("r1", rollback.clone(), Some(600)).await;
    assert_eq!(v["outcome"], "applied", "{v}");
    let bad = v["before"]["current_version"].as_u64().expect("the hand edit was recorded as a version") as u32;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_DEBUG=WARN\n");
    n.ok("r1", Op::ConfigMark(ConfigMarkArgs { name: "nccl-env".into(), version: bad, good: false }), None).await;
    let r: ReleaseResult = serde_json::from_value(n.ok("r1", release_owner("r1"), None).await).unwrap();
    assert_eq!(r.settings[0].outcome, RestoreOutcome::KeptBadBaseline, "{r:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_DEBUG=WARN\n", "the bad edit is not put back");
    // Unmarked, the same hand edit would be the baseline and come back.
    std::fs::write(&file, "NCCL_SOCKET_IFNAME=eth1\n").unwrap();
    n.ok("r2", rollback, Some(600)).await;
    n.ok("r2", release_owner("r2"), None).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_SOCKET_IFNAME=eth1\n");
}

#[tokio::test]
async fn a_held_config_version_marked_bad_ends_its_hold_and_is_never_put_back() {
    let mut n = Node::new("h100-sxm");
    let file = n.dir.path().join("nccl.env");
    // A person applies a config through the agent (a hold with a lease).
    let bad = ConfigApplyArgs {
        name: "nccl-env".into(),
        content: "NCCL_P2P_DISABLE=1\n".into(),
        note: None,
        restart_consumer: true,
    };
    let v = n.ok("person:carol", Op::ConfigApply(bad), Some(3600)).await;
    let bad_version = v["after"]["current_version"].as_u64().unwrap() as u32;
    // A run rolls back and marks the version bad, then ends.
    let rollback =
        Op::ConfigRollback(ConfigRollbackArgs { name: "nccl-env".into(), to_version: None, restart_consumer: true });
    n.ok("r1", rollback, Some(600)).await;
    let mark = n
        .ok("r1", Op::ConfigMark(ConfigMarkArgs { name: "nccl-env".into(), version: bad_version, good: false }), None)
        .await;
    assert_eq!(mark["after"]["holds_ended"].as_array().map(|a| a.len()), Some(1), "{mark}");
    n.ok("r1", release_owner("r1"), None).await;
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "NCCL_DEBUG=WARN\n", "the bad version is not put back");
    assert!(n.held().is_empty(), "{:?}", n.held());
    // Telemetry tells the engine how each hold ended.
    let t = n.agent.telemetry().await.unwrap();
    let ends: Vec<(String, HoldEnd)> =
        t.node_metrics.ended_holds.iter().map(|e| (e.hold.owner.clone(), e.how)).collect();
    assert_eq!(ends, vec![("person:carol".into(), HoldEnd::Superseded), ("r1".into(), HoldEnd::Released)]);
    // ... and remembers them across a restart, for ten minutes.
    n.restart();
    assert_eq!(n.agent.telemetry().await.unwrap().node_metrics.ended_holds.len(), 2);
    n.advance(601).await;
    assert!(n.agent.telemetry().await.unwrap().node_metrics.ended_holds.is_empty());
}

#[tokio::test]
async fn requeue_moves_jobs_only_off_a_node_nightshift_drained_or_off_a_broken_gpu() {
    let mut n = Node::new("h100-sxm");
    let requeue = || Op::Requeue(RequeueArgs { reason: "hung job".into(), gpu: None });
    // Not drained: the jobs would come straight back.
    let r = n.call("r1", requeue(), None).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "{r:?}");
    assert!(r.error.unwrap().message.contains("drain it first"));
    // Drained by nightshift: the jobs are moved; the hardware sees them go.
    n.ok(
        "r1",
        Op::Drain(DrainArgs { reason: "stalled".into(), run: Some("r1".into()), sticky: false, repair: false }),
        Some(600),
    )
    .await;
    let v = n.ok("r1", requeue(), None).await;
    assert_eq!(v["outcome"], "applied", "{v}");
    assert!(n.sim.jobs_requeued());
    // A person's drain: their jobs are theirs to move.
    let mut m = Node::new("h100-sxm");
    m.ok("sim", Op::SimFault(SimFault::PersonDrain { reason: "fan swap by dave".into() }), None).await;
    let r = m.call("r2", requeue(), None).await;
    assert_eq!(r.code(), Some(ErrorCode::NotOwner), "{r:?}");
    assert!(!m.sim.jobs_requeued());
    // ... also for a run about a GPU this agent sees healthy ...
    let about = |gpu| Op::Requeue(RequeueArgs { reason: "fault".into(), gpu: Some(gpu) });
    let r = m.call("r3", about(1), None).await;
    assert_eq!(r.code(), Some(ErrorCode::NotOwner), "{r:?}");
    assert!(r.error.unwrap().message.contains("GPU 1 shows no hardware fault here"));
    assert!(!m.sim.jobs_requeued());
    // ... but a job on a GPU that fell off the bus cannot run, whoever
    // drained the node: it is moved, and the reply says why.
    m.ok("sim2", Op::SimFault(SimFault::GpuLost { gpu: 1 }), None).await;
    let v = m.ok("r4", about(1), None).await;
    assert_eq!(v["outcome"], "applied", "{v}");
    assert_eq!(v["after"]["gpu_fault"], "GPU 1 does not answer", "{v}");
    assert!(m.sim.jobs_requeued());
}

/// A GPU-less stand-in for real hardware: `sim_fault` must be refused.
struct NotSim(Vec<GpuInfo>);

impl Backend for NotSim {
    fn name(&self) -> &'static str {
        "nvml"
    }
    fn gpus(&self) -> &[GpuInfo] {
        &self.0
    }
    fn sample(&self) -> Result<(Vec<GpuTelemetry>, NodeTelemetry), nightshift_agent::backend::BackendError> {
        Ok((Vec::new(), NodeTelemetry::default()))
    }
    fn set_power_limit(
        &self,
        _: u32,
        _: f64,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!("nothing may be set")
    }
    fn set_fan_speed(
        &self,
        _: u32,
        _: f64,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
    fn reset_fan(
        &self,
        _: u32,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
    fn set_clocks(
        &self,
        _: u32,
        _: u32,
        _: u32,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
    fn reset_clocks(
        &self,
        _: u32,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
    fn clear_ecc(
        &self,
        _: u32,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
    fn set_gpu_drain(
        &self,
        _: u32,
        _: bool,
    ) -> Result<nightshift_agent::backend::Support<()>, nightshift_agent::backend::BackendError> {
        unreachable!()
    }
}

#[tokio::test]
async fn sim_fault_exists_only_on_the_sim_backend_and_is_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(VirtualClock::new(0));
    let agent =
        Agent::new(AgentOptions::new("real", dir.path().join("state")), Arc::new(NotSim(Vec::new())), clock).unwrap();
    let mut req = Request::new("f1", Op::SimFault(SimFault::PersonDrain { reason: "nightshift: forged".into() }));
    req.owner = Some("r1".into());
    let r = agent.handle(req).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest));
    assert!(r.error.unwrap().message.contains("sim_fault needs the sim backend: this agent runs nvml"));
    assert!(!agent.telemetry().await.unwrap().node_metrics.drained, "no drain was forged");

    // On the sim: a repeated id is answered from the journal, not re-applied.
    let mut n = Node::new("h100-sxm");
    let f = Op::SimFault(SimFault::Load { gpu: Some(0), util_pct: 10.0 });
    let mut req = Request::new("fault-1", f.clone());
    req.owner = Some("scenario".into());
    assert!(n.agent.handle(req.clone()).await.ok);
    n.ok("sim", Op::SimFault(SimFault::Clear {}), None).await;
    let again = n.agent.handle(req).await;
    assert!(again.ok);
    n.sim.step(60.0);
    let util = n.sim.sample().unwrap().0[0].util_pct;
    assert!(util > 50.0, "the repeat did not set the load again: {util}%");
    let lines = n.agent.journal_lines();
    assert!(lines.iter().any(|l| matches!(l, JournalLine::Done { id, .. } if id == "fault-1")));
    assert_eq!(n.clock.now_ms(), 1_000_000);
}

/// Issue 46 point 3: the GPU is reset (or the node rebooted, the driver
/// reloaded) while the agent is down, so its power limit is back at the
/// default while the agent still holds a cap. Before, the agent went on
/// reporting 450 W held while the GPU ran at 700 W, and the next change
/// ended the hold as a person's. Now the first tick after the start reads
/// every held GPU setting back: one at its default is applied again and
/// says so; one a person set to something else is drifted, left alone.
#[tokio::test]
async fn a_cap_lost_to_a_reset_while_the_agent_was_down_is_applied_again() {
    let mut n = Node::new("h100-sxm");
    n.ok("r1", cap(0, 450.0), Some(3600)).await;
    n.ok("r1", cap(1, 500.0), Some(3600)).await;
    assert_eq!((n.power(0), n.power(1)), (450.0, 500.0));
    n.agent.close();
    n.sim.inject(&SimFault::GpuReset { gpu: 0 }).unwrap();
    assert_eq!(n.power(0), 700.0, "the reset put the default back");
    n.restart();
    n.advance(1).await;
    assert_eq!(n.power(0), 450.0, "applied again after the start");
    let v = n.held().into_iter().find(|h| h.setting == Setting::PowerLimit { gpu: 0 }).unwrap();
    let r = v.reapplied.clone().expect("reported as re-applied");
    assert_eq!((r.found, r.applied), (HoldValue::PowerLimit { watts: 700.0 }, HoldValue::PowerLimit { watts: 450.0 }));
    assert!(v.drifted.is_none());
    // Reset again while the agent runs: found at the next read-back.
    n.sim.inject(&SimFault::GpuReset { gpu: 1 }).unwrap();
    n.advance(30).await;
    assert_eq!(n.power(1), 700.0, "read back once a minute, not every tick");
    n.advance(31).await;
    assert_eq!(n.power(1), 500.0);
    // A person's own value is theirs: marked drifted, never overwritten.
    n.sim.set_power_limit(0, 600.0).unwrap();
    n.advance(61).await;
    assert_eq!(n.power(0), 600.0);
    let v = n.held().into_iter().find(|h| h.setting == Setting::PowerLimit { gpu: 0 }).unwrap();
    assert!(v.drifted.as_deref().is_some_and(|d| d.contains("the device now has")), "{v:?}");
    let r: ReleaseResult = serde_json::from_value(n.ok("r1", release_owner("r1"), None).await).unwrap();
    let gpu0 = r.settings.iter().find(|s| s.setting == Setting::PowerLimit { gpu: 0 }).unwrap();
    assert_eq!(gpu0.outcome, RestoreOutcome::Drifted);
    assert_eq!((n.power(0), n.power(1)), (600.0, 700.0), "the person's value stays; GPU 1 back to its baseline");
}

/// A baseline in the state log that no device would have had (crafted,
/// with a valid checksum) is refused at release, never written.
#[tokio::test]
async fn a_crafted_baseline_in_the_state_log_is_not_put_back() {
    let mut n = Node::new("h100-sxm");
    n.ok("r1", cap(0, 450.0), Some(3600)).await;
    n.agent.close();
    {
        let state = n.dir.path().join("state");
        let (mut log, mut loaded) = nightshift_agent::statelog::StateLog::open(&state).unwrap();
        loaded.holds.get_mut(&Setting::PowerLimit { gpu: 0 }).unwrap().baseline =
            HoldValue::PowerLimit { watts: 5000.0 };
        log.compact(&loaded.holds, &loaded.journal, loaded.term).unwrap();
    }
    n.restart();
    let r: ReleaseResult = serde_json::from_value(n.ok("r1", release_owner("r1"), None).await).unwrap();
    assert_eq!(r.settings[0].outcome, RestoreOutcome::Failed, "{r:?}");
    assert!(r.settings[0].detail.contains("the recorded baseline is refused"), "{r:?}");
    assert_eq!(n.power(0), 450.0, "left at the held value");
}
