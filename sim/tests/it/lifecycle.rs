//! A fault's lifecycle survives the engine: restarted, or restored from a
//! backup taken in the middle of it, the engine resumes each lifecycle where
//! it was (faulted, awaiting repair, verifying) — from the audit chain, not
//! from memory — and it still ends only on a passing health check.

use std::path::Path;
use std::sync::Arc;

use nightshift_engine::api::{EngineApi, HandsOff, ReleaseHolds, SetFleetMode};

use crate::common::as_user;

use nightshift_engine::embed::HealthState;
use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_proto::{NoArgs, Op, Request, SimFault, Telemetry};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use serde_json::json;

const NODE: &str = "g1";
const GPU: u32 = 5;

async fn fleet(dir: &Path, rb: &Path) -> SimFleet {
    fleet_of(dir, rb, &["ecc-dbe-drain"], "b200", 8).await
}

async fn fleet_of(dir: &Path, rb: &Path, runbooks: &[&str], profile: &str, gpus: u32) -> SimFleet {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for name in runbooks {
        for ext in ["yaml", "rhai"] {
            std::fs::copy(repo.join(format!("{name}.{ext}")), rb.join(format!("{name}.{ext}"))).unwrap();
        }
    }
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb, &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let nodes = (1..=2)
        .map(|i| SimNodeSpec {
            labels: [("nvlink_domain".to_string(), format!("d{i}"))].into(),
            ..SimNodeSpec::new(&format!("g{i}"), profile, gpus)
        })
        .collect();
    SimFleet::start(SimFleetOptions::new(nodes, set, script), dir).await.unwrap()
}

async fn inject(f: &SimFleet, n: &mut u32, fault: SimFault) {
    *n += 1;
    let r = f.agent(NODE).handle(Request::new(format!("lifecycle-{n}"), Op::SimFault(fault))).await;
    assert!(r.ok, "{r:?}");
}

fn state(f: &SimFleet) -> HealthState {
    f.engine.health_model().state(NODE, GPU)
}

async fn drained(f: &SimFleet) -> bool {
    let r = f.agent(NODE).handle(Request::new("lifecycle-probe", Op::Telemetry(NoArgs {}))).await;
    serde_json::from_value::<Telemetry>(r.result.unwrap()).unwrap().node_metrics.drained
}

/// Step until the GPU is in `want` (at most `secs`).
async fn until(f: &SimFleet, want: HealthState, secs: u32) -> bool {
    for _ in 0..secs {
        if state(f) == want {
            return true;
        }
        f.step().await.unwrap();
    }
    state(f) == want
}

#[derive(Debug, Clone, Copy)]
enum Cut {
    Restart,
    Restore,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_phase_survives_a_restart_and_a_restore() {
    for phase in [HealthState::Faulted, HealthState::AwaitingRepair, HealthState::Verifying] {
        for cut in [Cut::Restart, Cut::Restore] {
            let dir = scratch_dir().unwrap();
            let rb = tempfile::tempdir().unwrap();
            let mut f = fleet(dir.path(), rb.path()).await;
            let mut n = 0;
            let marker = f.agent(NODE).options().policy.hands_off_marker_path.clone();
            f.run_for(30).await.unwrap();
            if phase == HealthState::Faulted {
                // The maintenance marker holds every action: the fault stays
                // faulted, pending.
                std::fs::write(&marker, b"maintenance\n").unwrap();
            }
            inject(&f, &mut n, SimFault::EccDbe { gpu: GPU, count: 1 }).await;
            match phase {
                HealthState::Faulted => assert!(until(&f, HealthState::Faulted, 60).await),
                HealthState::AwaitingRepair => assert!(until(&f, HealthState::AwaitingRepair, 120).await),
                _ => {
                    assert!(until(&f, HealthState::AwaitingRepair, 120).await);
                    // A person says "repaired" and the health check is due
                    // in the next seconds: cut in between.
                    f.engine.mark_repaired(NODE, Some(GPU), "user:test", "reseated").await.unwrap();
                }
            }
            assert_eq!(state(&f), phase, "{phase:?} {cut:?}: not reached");
            let before = f.engine.health_model().get(NODE, GPU).cloned().unwrap();
            let backup = tempfile::tempdir().unwrap();
            if matches!(cut, Cut::Restore) {
                f.snapshot_engine(backup.path()).unwrap();
                // Life goes on after the backup; then the engine is lost
                // and comes back from the backup.
                f.run_for(5).await.unwrap();
                f.restart_engine_from(backup.path()).await.unwrap();
            } else {
                f.restart_engine().await.unwrap();
            }
            let after = f.engine.health_model().get(NODE, GPU).cloned();
            let after = after.unwrap_or_else(|| panic!("{phase:?} {cut:?}: the GPU's health was forgotten"));
            // Verifying may have been decided in the 5 s after a backup; the
            // restored engine picks it up again from what the backup held.
            assert_eq!(after.state, before.state, "{phase:?} {cut:?}");
            assert_eq!(after.fault, before.fault, "{phase:?} {cut:?}");
            assert_eq!(after.lifecycle.map(|l| l.seen_ms), before.lifecycle.map(|l| l.seen_ms), "{phase:?} {cut:?}");
            assert!(drained(&f).await || phase == HealthState::Faulted, "{phase:?} {cut:?}: the node went back early");

            // And it goes on where it was: nothing returns without a reset
            // and a passing check…
            if phase == HealthState::Faulted {
                std::fs::remove_file(&marker).unwrap();
                let ok = until(&f, HealthState::AwaitingRepair, 900).await;
                if !ok {
                    let recs = f.engine.audit().tail(0, usize::MAX).unwrap();
                    for r in recs.iter().filter(|r| !matches!(r.kind, nightshift_engine::audit::RecordKind::HoldEnded))
                    {
                        eprintln!(
                            "{} {:?} {:?} {}",
                            r.ts_ms,
                            r.kind,
                            r.run,
                            r.data.to_string().chars().take(300).collect::<String>()
                        );
                    }
                }
                assert!(ok, "{phase:?} {cut:?}: the ladder did not resume");
            }
            f.run_for(120).await.unwrap();
            assert_ne!(state(&f), HealthState::Healthy, "{phase:?} {cut:?}: healthy without a reset");
            assert!(drained(&f).await, "{phase:?} {cut:?}: back in service without a reset");
            // …and with them, it does.
            inject(&f, &mut n, SimFault::GpuReset { gpu: GPU }).await;
            assert!(
                until(&f, HealthState::Healthy, 300).await,
                "{phase:?} {cut:?}: {:?}",
                f.engine.health_model().get(NODE, GPU)
            );
            f.run_for(30).await.unwrap();
            assert!(!drained(&f).await, "{phase:?} {cut:?}: still drained after a verified repair");
            assert!(f.engine.verify().unwrap().ok);
        }
    }
}

/// A small deterministic generator (xorshift64*), so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Property: whatever happens — faults of every kind, engine and agent
/// restarts, a person's repairs (some true, some not), a person's own drain,
/// maintenance markers, repairs that never come — nightshift never ends with
/// a GPU it knows is broken on a node in service, nor with a node it
/// quarantined back to health but still drained, nor with a drain of its own
/// on a node whose page gives no reason. Each seed is a different story;
/// the final act resets every GPU and removes every marker, then gives the
/// ladder time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_restarts_and_people_never_leave_a_broken_gpu_in_service() {
    use nightshift_engine::audit::RecordKind;
    let nodes = ["g1", "g2"];
    for seed in 1..=8u64 {
        let dir = scratch_dir().unwrap();
        let rb = tempfile::tempdir().unwrap();
        let mut f = fleet_of(dir.path(), rb.path(), &["ecc-dbe-drain", "xid-fatal-drain"], "h100-sxm", 4).await;
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut story = Vec::new();
        let mut n = 0u32;
        let mut person_drained = std::collections::BTreeSet::new();
        f.run_for(30).await.unwrap();
        for _ in 0..14 {
            let node = nodes[rng.below(2) as usize];
            let gpu = rng.below(4) as u32;
            let fault = match rng.below(11) {
                0 => Some(SimFault::EccDbe { gpu, count: 1 + rng.below(2) }),
                1 => Some(SimFault::GpuLost { gpu }),
                2 => Some(SimFault::Xid { gpu, code: [79, 74, 94, 95, 119, 13][rng.below(6) as usize] }),
                3 => Some(SimFault::RowRemapFailure { gpu }),
                4 | 5 => Some(SimFault::GpuReset { gpu }),
                6 => {
                    f.restart_engine().await.unwrap();
                    story.push("engine restart".to_string());
                    None
                }
                7 => {
                    f.restart_agent(node).unwrap();
                    story.push(format!("agent restart on {node}"));
                    None
                }
                8 => {
                    let r = f.engine.mark_repaired(node, None, "user:p", "said so").await;
                    story.push(format!(
                        "person says {node} repaired ({})",
                        if r.is_ok() { "taken" } else { "nothing awaits" }
                    ));
                    None
                }
                9 => {
                    let marker = f.agent(node).options().policy.hands_off_marker_path.clone();
                    let on = !marker.exists();
                    if on {
                        std::fs::write(&marker, b"maintenance\n").unwrap();
                    } else {
                        std::fs::remove_file(&marker).unwrap();
                    }
                    story.push(format!("hands-off {} on {node}", if on { "set" } else { "cleared" }));
                    None
                }
                _ => {
                    if person_drained.insert(node) {
                        Some(SimFault::PersonDrain { reason: "dave: reseating a riser".into() })
                    } else {
                        None
                    }
                }
            };
            if let Some(fault) = fault {
                story.push(format!("{node}: {fault:?}"));
                n += 1;
                let _ = f.agent(node).handle(Request::new(format!("prop-{seed}-{n}"), Op::SimFault(fault))).await;
            }
            f.run_for(30 + rng.below(600)).await.unwrap();
        }
        // The last act: markers go, every GPU is reset, time passes.
        for node in nodes {
            let marker = f.agent(node).options().policy.hands_off_marker_path.clone();
            let _ = std::fs::remove_file(&marker);
            for gpu in 0..4 {
                n += 1;
                let _ = f
                    .agent(node)
                    .handle(Request::new(format!("prop-{seed}-{n}"), Op::SimFault(SimFault::GpuReset { gpu })))
                    .await;
            }
        }
        story.push("every marker cleared, every GPU reset".into());
        f.run_for(1200).await.unwrap();

        let model = f.engine.health_model();
        let records = f.engine.audit().tail(0, usize::MAX).unwrap();
        for node in nodes {
            let r = f.agent(node).handle(Request::new("prop-probe", Op::Telemetry(NoArgs {}))).await;
            let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
            let reason = t.node_metrics.drain_reason.clone().unwrap_or_default();
            let ours = t.node_metrics.drained && reason.starts_with("nightshift:");
            let broken: Vec<(u32, HealthState)> =
                (0..4).map(|g| (g, model.state(node, g))).filter(|(_, s)| *s != HealthState::Healthy).collect();
            let trail: Vec<String> = records
                .iter()
                .filter(|r| r.node.as_deref() == Some(node) && !matches!(r.kind, RecordKind::HoldEnded))
                .map(|r| {
                    format!(
                        "{} {:?} {:?} {}",
                        r.ts_ms % 100_000_000,
                        r.kind,
                        r.run,
                        r.data.to_string().chars().take(220).collect::<String>()
                    )
                })
                .collect();
            let ctx = || {
                format!(
                    "seed {seed}, {node}: broken {broken:?}, drained {} ({reason:?})\n  {}\n trail:\n  {}",
                    t.node_metrics.drained,
                    story.join("\n  "),
                    trail.join("\n  ")
                )
            };
            // A GPU nightshift knows is broken is never on a node in service
            // — unless the blast radius forbade the drain, and then the GPU
            // itself is out and a person was told the node's name.
            let refused = records.iter().any(|r| {
                r.kind == RecordKind::Escalation
                    && r.node.as_deref() == Some(node)
                    && r.data["text"].as_str().is_some_and(|x| x.contains("the drain was refused"))
            });
            let gpus_out = broken.iter().all(|(g, _)| t.gpus[*g as usize].gpu_drained || t.gpus[*g as usize].lost);
            assert!(
                broken.is_empty() || t.node_metrics.drained || (refused && gpus_out),
                "a broken GPU in service: {}",
                ctx()
            );
            // Everything healthy: nightshift's own drain is gone (a
            // person's stays: never undone).
            if broken.is_empty() {
                assert!(!ours, "healthy but still quarantined by nightshift: {}", ctx());
            }
            if person_drained.contains(node) {
                assert!(
                    t.node_metrics.drained && !reason.starts_with("nightshift:") || ours,
                    "a person's drain was undone: {}",
                    ctx()
                );
            }
            // A drain of nightshift's names its reason on the node's page:
            // a fault in the model, and the run that placed it.
            if ours {
                assert!(!broken.is_empty(), "{}", ctx());
                let h = crate::common::person(&f.engine).node_health(node).await.unwrap();
                assert!(h.gpus.iter().any(|g| !g.why.is_empty()), "no reason on the page: {}", ctx());
            }
        }
        // A repair the check refutes is told once per change, not on every
        // reading (the GPU is re-checked every ten minutes).
        let mut told: std::collections::BTreeMap<(Option<String>, Option<u32>), usize> = Default::default();
        for r in records.iter().filter(|r| {
            r.kind == RecordKind::Notification
                && r.data["text"].as_str().is_some_and(|x| x.contains("failed its health check after the repair"))
        }) {
            *told.entry((r.node.clone(), r.gpu)).or_default() += 1;
        }
        assert!(
            told.values().all(|n| *n <= 4),
            "seed {seed}: a refuted repair told again and again: {told:?}\n  {}",
            story.join("\n  ")
        );
        assert!(f.engine.verify().unwrap().ok, "seed {seed}");
        assert!(records.iter().any(|r| r.kind == RecordKind::HealthChanged), "seed {seed}: no fault at all");
        eprintln!("seed {seed}: ok ({} events)", story.len());
    }
}

/// The API's guards (issue 56, point 5), in the engine so every way in has
/// them: a release names its scope; a drain nightshift keeps on a GPU the
/// health model holds broken goes by the repair lifecycle or an admin's
/// force, never a plain release; an admin's hands-off refuses an
/// operator's release. Nothing is sent when a guard refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_drain_of_a_broken_gpu_is_not_undone_by_a_plain_release() {
    let dir = scratch_dir().unwrap();
    let rb = tempfile::tempdir().unwrap();
    let f = fleet(dir.path(), rb.path()).await;
    let mut n = 0;
    inject(&f, &mut n, SimFault::EccDbe { gpu: GPU, count: 3 }).await;
    assert!(until(&f, HealthState::AwaitingRepair, 300).await, "{:?}", state(&f));
    assert!(drained(&f).await);
    let operator = nightshift_engine::api::Session::new(f.engine.clone(), "otto", false);
    let admin = nightshift_engine::api::Session::new(f.engine.clone(), "ana", true);
    let release = |what: ReleaseHolds, reason: &str| ReleaseHolds { reason: reason.into(), ..what };
    let all = ReleaseHolds { all: true, ..Default::default() };
    let sent_before = f.engine.audit().tail(0, usize::MAX).unwrap().len();

    // No scope: refused, saying what is expected.
    let e = operator.release(NODE, release(ReleaseHolds::default(), "tidy up")).await.unwrap_err();
    assert!(e.status == 400 && e.message.contains("expected the release's scope"), "{e:?}");
    let e = operator
        .release(NODE, release(ReleaseHolds { kind: Some("fans".into()), ..Default::default() }, "x"))
        .await
        .unwrap_err();
    assert!(e.message.contains("kind: expected one of power_limit"), "{e:?}");
    // Every hold, by an operator: the repair drain of a GPU awaiting repair stays.
    let e = operator.release(NODE, release(all.clone(), "tidy up")).await.unwrap_err();
    assert_eq!((e.status, e.code.as_str()), (409, "repair_pending"), "{e:?}");
    assert!(e.message.contains(&format!("GPU {GPU} awaiting_repair")), "{e:?}");
    assert!(e.message.contains(&format!("nightshift nodes repaired {NODE}")), "{e:?}");
    // So does a narrower one that names the drain.
    let drains = ReleaseHolds { kind: Some("node_drain".into()), ..Default::default() };
    let e = operator.release(NODE, release(drains.clone(), "tidy up")).await.unwrap_err();
    assert_eq!(e.code, "repair_pending", "{e:?}");
    // Force is an admin's.
    let forced = ReleaseHolds { force: true, ..all.clone() };
    let e = operator.release(NODE, release(forced.clone(), "x")).await.unwrap_err();
    assert_eq!((e.status, e.code.as_str()), (403, "forbidden"), "{e:?}");
    // An admin's hands-off: an operator releases nothing, however narrow.
    let hands_off = |on: bool, why: &str| HandsOff { hands_off: on, reason: Some(why.into()), for_secs: None };
    admin.hands_off(NODE, hands_off(true, "NVSwitch tray reseat")).await.unwrap();
    let e = operator.release(NODE, release(drains.clone(), "tidy up")).await.unwrap_err();
    assert!(e.code == "hands_off" && e.message.contains("user:ana"), "{e:?}");
    // Nothing was sent by any of those: no intent, no result.
    let recs = f.engine.audit().tail(0, usize::MAX).unwrap();
    assert!(
        !recs[sent_before..].iter().any(|r| r.data["op"] == "release"),
        "a refused release sent something: {:?}",
        &recs[sent_before..]
    );
    admin.hands_off(NODE, hands_off(false, "reseat done")).await.unwrap();
    let cleared = f
        .engine
        .audit()
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .rev()
        .find(|r| r.kind == nightshift_engine::audit::RecordKind::HandsOff);
    let cleared = cleared.expect("the clearing is audited");
    assert_eq!(
        (cleared.data["hands_off"].clone(), cleared.data["reason"].clone()),
        (json!(false), json!("reseat done"))
    );
    assert!(drained(&f).await, "still drained after every refusal");
    // An admin's explicit force, with a reason, releases it.
    let out = admin.release(NODE, release(forced, "GPU swapped by the vendor on site")).await.unwrap();
    assert!(out.error.is_none() && out.outcome.actions.iter().all(|a| a.result.ok), "{:?}", out.outcome.actions);
    f.step().await.unwrap();
    assert!(!drained(&f).await);
}

/// Issue 43 (a first deployment walked end to end): with the whole fleet
/// in shadow, a DBE gets one shadow run — not one every retry pause, which
/// would report one fault as many — and nothing is drained; the moment an
/// admin puts the fleet in act, the still-pending fault is offered again at
/// the next reading (not after the quarter-hour a real run's retry waits)
/// and drained for repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_seen_in_shadow_is_acted_on_once_the_fleet_goes_to_act() {
    use nightshift_engine::embed::FleetMode;
    let dir = scratch_dir().unwrap();
    let rb = tempfile::tempdir().unwrap();
    let f = fleet(dir.path(), rb.path()).await;
    let mut n = 0;
    as_user(&f.engine, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Shadow, reason: "first week".into() })
        .await
        .unwrap();
    f.run_for(30).await.unwrap();
    inject(&f, &mut n, SimFault::EccDbe { gpu: GPU, count: 1 }).await;
    f.run_for(3_600).await.unwrap();
    let runs = |f: &SimFleet| f.engine.runs(&Default::default()).unwrap().runs;
    let shadow: Vec<_> = runs(&f).into_iter().filter(|r| r.runbook == "ecc-dbe-drain").collect();
    assert_eq!(shadow.len(), 1, "one shadow run for one fault in an hour: {shadow:#?}");
    assert!(shadow[0].shadow);
    assert_eq!(state(&f), HealthState::Faulted, "a shadow run changes nothing");
    assert!(!drained(&f).await);
    as_user(&f.engine, "admin")
        .set_fleet_mode(SetFleetMode { mode: FleetMode::Act, reason: "shadow report reviewed".into() })
        .await
        .unwrap();
    let mut secs = 0;
    while state(&f) != HealthState::AwaitingRepair && secs < 60 {
        f.step().await.unwrap();
        secs += 1;
    }
    assert_eq!(state(&f), HealthState::AwaitingRepair, "acted on within a minute of the switch");
    assert!(drained(&f).await);
    let real: Vec<_> = runs(&f).into_iter().filter(|r| r.runbook == "ecc-dbe-drain" && !r.shadow).collect();
    assert_eq!(real.len(), 1, "{real:#?}");
}

/// One H100 node under `xid-fatal-drain` alone, its engine reading the
/// site's XID overrides from a file that holds `overrides` (rewrite it and
/// reload); the folders live as long as the fleet.
struct XidFleet {
    f: SimFleet,
    overrides: std::path::PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

async fn xid_fleet(overrides: &str) -> XidFleet {
    let dir = scratch_dir().unwrap();
    let rb = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for ext in ["yaml", "rhai"] {
        std::fs::copy(repo.join(format!("xid-fatal-drain.{ext}")), rb.path().join(format!("xid-fatal-drain.{ext}")))
            .unwrap();
    }
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb.path(), &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let path = dir.path().join("xid-overrides.yaml");
    std::fs::write(&path, overrides).unwrap();
    let mut opts = SimFleetOptions::new(vec![SimNodeSpec::new(NODE, "h100-sxm", 8)], set, script);
    opts.fault_policy_path = Some(path.clone());
    let f = SimFleet::start(opts, dir.path()).await.unwrap();
    XidFleet { f, overrides: path, _dirs: (dir, rb) }
}

/// Issue 42 point 8: the XID policy is data. A site's overrides file is
/// picked up by a reload (audited row by row) and changes what nightshift
/// does; a broken one is refused with file:line:column, audited, and the
/// policy in force stays; a restarted engine reads the overrides on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_xid_override_is_reloaded_audited_and_a_bad_one_changes_nothing() {
    use nightshift_engine::audit::RecordKind;
    use nightshift_engine::embed::XidAction;
    let XidFleet { mut f, overrides, _dirs } = xid_fleet("version: 1\n").await;
    assert_eq!(f.engine.fault_policy().info(109).unwrap().action, XidAction::ResetGpu, "the shipped row");
    let reloads = |f: &SimFleet| -> Vec<serde_json::Value> {
        f.engine
            .audit()
            .tail(0, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|r| r.kind == RecordKind::ConfigReloaded)
            .map(|r| r.data)
            .collect()
    };

    // 1. The site marks 109 benign: in force at the reload, audited.
    std::fs::write(
        &overrides,
        "version: 1\nxids:\n  - { code: 109, action: ignore, reason: benign on driver 550 here }\n",
    )
    .unwrap();
    let report = nightshift_engine::embed::reload(&f.engine, "user:ops").await.unwrap();
    assert_eq!(report.fault_policy, vec!["XID 109: reset_gpu → ignore (benign on driver 550 here)"]);
    let audited = reloads(&f);
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0]["ok"], true);
    assert_eq!(audited[0]["fault_policy"][0], "XID 109: reset_gpu → ignore (benign on driver 550 here)");

    // 2. A broken file: refused where it breaks, audited, nothing changed.
    std::fs::write(&overrides, "version: 1\nxids:\n  - { code: 109, action: reset_gpu, reason: back }\n  - { code: 74, action: harmless, reason: typo }\n").unwrap();
    let e = nightshift_engine::embed::reload(&f.engine, "user:ops").await.expect_err("a broken overrides file");
    let at = format!("{}:4:", overrides.display());
    assert!(e.to_string().starts_with(&at) && e.to_string().contains("harmless"), "{e}");
    let audited = reloads(&f);
    assert_eq!(audited.len(), 2);
    assert_eq!(audited[1]["ok"], false);
    assert!(audited[1]["error"].as_str().unwrap().starts_with(&at), "{}", audited[1]);
    assert_eq!(f.engine.fault_policy().info(109).unwrap().action, XidAction::Ignore, "the policy in force stays");

    // 3. XID 109 now changes nothing; XID 74 still drains (control).
    let mut n = 0;
    f.run_for(20).await.unwrap();
    inject(&f, &mut n, SimFault::Xid { gpu: GPU, code: 109 }).await;
    f.run_for(120).await.unwrap();
    assert!(!drained(&f).await, "a benign XID drained the node");
    assert_eq!(state(&f), HealthState::Healthy);
    inject(&f, &mut n, SimFault::Xid { gpu: 2, code: 74 }).await;
    for _ in 0..120 {
        if drained(&f).await {
            break;
        }
        f.step().await.unwrap();
    }
    assert!(drained(&f).await, "XID 74 is still a fault");

    // 4. A restarted engine reads the overrides on disk (fixed again).
    std::fs::write(
        &overrides,
        "version: 1\nxids:\n  - { code: 109, action: ignore, reason: benign on driver 550 here }\n",
    )
    .unwrap();
    f.restart_engine().await.unwrap();
    assert_eq!(f.engine.fault_policy().info(109).unwrap().action, XidAction::Ignore);
    assert_eq!(f.engine.fault_policy().info(109).unwrap().site_reason.as_deref(), Some("benign on driver 550 here"));
}

/// A pulled batch (Prometheus, a backtest step) without fault evidence
/// skips judging a node judged quiet before (the health-evaluation count
/// stands) — but not once the XID policy
/// changed: a held XID the site made a fault is judged again at the next
/// reading, as before the skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_reading_judges_held_evidence_again_under_a_new_policy() {
    use nightshift_engine::embed::ids;
    let XidFleet { f, overrides, _dirs } =
        xid_fleet("version: 1\nxids:\n  - { code: 109, action: ignore, reason: benign here }\n").await;
    f.run_for(5).await.unwrap();
    // No step of the fleet from here: only pulled batches reach the engine
    // (the agents' own telemetry judges every node it comes from).
    let e = &f.engine;
    let t = nightshift_proto::clock::Clock::now_ms(&f.clock) + 1_000;
    e.ingest_samples(&[(NODE, Some(GPU), ids::XID, t, 109.0), (NODE, Some(GPU), ids::XID_EVENTS, t, 1.0)]).await;
    assert_eq!(state(&f), HealthState::Healthy, "109 is benign here");
    let judged = e.counters().health_evaluations;
    assert!(judged > 0, "the XID reading was judged");
    e.ingest_samples(&[(NODE, Some(GPU), ids::TEMPERATURE, t + 1_000, 60.0)]).await;
    assert_eq!(state(&f), HealthState::Healthy);
    assert_eq!(e.counters().health_evaluations, judged, "a quiet node's temperature reading is not judged again");
    // The site takes its override back: 109 is the shipped fault again.
    std::fs::write(&overrides, "version: 1\n").unwrap();
    nightshift_engine::embed::reload(&f.engine, "user:ops").await.unwrap();
    e.ingest_samples(&[(NODE, Some(GPU), ids::TEMPERATURE, t + 2_000, 60.0)]).await;
    // A fault, recorded (the agent's own counters then read as a reset:
    // verifying — what matters here is that it was judged).
    assert_ne!(state(&f), HealthState::Healthy, "the held XID 109 judged under the policy now in force");
    assert!(e.counters().health_evaluations > judged);
}

/// A node judged before its GPUs were known — a restarted engine's first
/// pulled batch, before the agent's inventory: nothing to judge, so
/// nothing found — is judged again once they are: a fatal XID held from
/// that batch is a fault at the next temperature-only reading (it is
/// skipped, and the GPU left in service, when the GPU count is not part of
/// what a quiet judgement is remembered with).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_reading_judges_held_evidence_again_once_the_gpus_are_known() {
    use nightshift_engine::embed::ids;
    let XidFleet { mut f, _dirs, .. } = xid_fleet("version: 1\n").await;
    f.run_for(5).await.unwrap();
    f.restart_engine().await.unwrap();
    let e = &f.engine;
    let gpus = |f: &SimFleet| f.engine.node(NODE).map(|n| n.gpus.len());
    assert_eq!(gpus(&f), Some(0), "a restarted engine knows no GPU before the agent's inventory");
    let t = nightshift_proto::clock::Clock::now_ms(&f.clock) + 1_000;
    e.ingest_samples(&[(NODE, Some(GPU), ids::XID, t, 79.0), (NODE, Some(GPU), ids::XID_EVENTS, t, 1.0)]).await;
    assert_eq!(state(&f), HealthState::Healthy, "no GPU known: nothing judged yet");
    e.refresh_inventories().await;
    assert_eq!(gpus(&f), Some(8));
    e.ingest_samples(&[(NODE, Some(GPU), ids::TEMPERATURE, t + 1_000, 60.0)]).await;
    assert_ne!(state(&f), HealthState::Healthy, "the held XID 79 judged once the GPUs are known");
}
