//! A fault's lifecycle survives the engine: restarted, or restored from a
//! backup taken in the middle of it, the engine resumes each lifecycle where
//! it was (faulted, awaiting repair, verifying) — from the audit chain, not
//! from memory — and it still ends only on a passing health check.

use std::path::Path;
use std::sync::Arc;

use nightshift_engine::health::HealthState;
use nightshift_engine::runbook::load_dir;
use nightshift_engine::script::{ScriptLimits, build_engine};
use nightshift_proto::{NoArgs, Op, Request, SimFault, Telemetry};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};

const NODE: &str = "g1";
const GPU: u32 = 5;

async fn fleet(dir: &Path, rb: &Path) -> SimFleet {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for f in ["ecc-dbe-drain.yaml", "ecc-dbe-drain.rhai"] {
        std::fs::copy(repo.join(f), rb.join(f)).unwrap();
    }
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb, &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let nodes = (1..=2)
        .map(|i| SimNodeSpec {
            labels: [("nvlink_domain".to_string(), format!("d{i}"))].into(),
            ..SimNodeSpec::new(&format!("g{i}"), "b200", 8)
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
