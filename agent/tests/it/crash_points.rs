//! The agent stopped at each step of a change, with the hold's lease
//! running out while it was down (issue 26 item 3): on restart the record
//! is made to agree with the device *before* any expiry, so a value the
//! agent wrote is never read as a person's change (no false drift), the
//! GPU goes back to its factory baseline, and the next hold's baseline is
//! that factory value — never one nightshift applied.
//!
//! Each crash point is the exact state on disk and on the device a stop at
//! that step leaves (the hold record, the value being written, the device).

use std::path::Path;
use std::sync::Arc;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_agent::statelog::StateLog;
use nightshift_proto::clock::{SharedClock, VirtualClock};
use nightshift_proto::*;

const FACTORY: f64 = 700.0;
const CAP: f64 = 600.0;

fn sim(dir: &Path) -> Arc<SimBackend> {
    Arc::new(
        SimBackend::new(SimConfig { profile: "h100-sxm".into(), gpus: 1, ..SimConfig::default() })
            .unwrap()
            .persist_to(dir.join("sim-hardware.json")),
    )
}

fn agent(dir: &Path, sim: &Arc<SimBackend>, clock: &VirtualClock) -> Agent {
    let backend: Arc<dyn Backend> = sim.clone();
    let shared: SharedClock = Arc::new(clock.clone());
    Agent::new(AgentOptions::new("n1", dir.join("state")), backend, shared).unwrap()
}

fn power(sim: &SimBackend) -> f64 {
    sim.sample().unwrap().0[0].power_limit_watts
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The hold and the value to write are recorded; the device not yet.
    SavedNotWritten,
    /// The device has the new value; nothing after that was recorded.
    WrittenNotRecorded,
    /// A record from before `writing` existed: the old crash point (the
    /// device written, `applied` not yet saved).
    OldRecordWritten,
    /// A release recorded (the hold gone), the device not yet restored.
    ReleasedNotRestored,
}

#[tokio::test]
async fn a_stop_at_any_step_of_a_change_never_reads_the_agents_own_write_as_drift() {
    for step in [Step::SavedNotWritten, Step::WrittenNotRecorded, Step::OldRecordWritten, Step::ReleasedNotRestored] {
        let dir = tempfile::tempdir().unwrap();
        let clock = VirtualClock::new(1_000_000);
        let hw = sim(dir.path());
        assert_eq!(power(&hw), FACTORY);
        // The state a stop at `step` leaves.
        {
            let a = agent(dir.path(), &hw, &clock);
            drop(a);
            let (mut log, mut st) = StateLog::open(&dir.path().join("state")).unwrap();
            let store = &mut st.holds;
            let setting = Setting::PowerLimit { gpu: 0 };
            let hold = HoldInfo {
                id: "r1-a1".into(),
                owner: "r1".into(),
                setting: setting.clone(),
                value: HoldValue::PowerLimit { watts: CAP },
                reason: "cap".into(),
                placed_at_ms: 1_000_000,
                expires_at_ms: Some(1_060_000),
                kept: false,
                repair: false,
            };
            store.place(hold, HoldValue::PowerLimit { watts: FACTORY });
            let h = store.get_mut(&setting).unwrap();
            match step {
                Step::SavedNotWritten | Step::WrittenNotRecorded => {
                    h.writing = Some(HoldValue::PowerLimit { watts: CAP });
                }
                Step::OldRecordWritten => {}
                Step::ReleasedNotRestored => {
                    h.applied = HoldValue::PowerLimit { watts: CAP };
                    store.remove(|x| x.id == "r1-a1");
                }
            }
            log.commit(store, None, None, true).unwrap();
            if !matches!(step, Step::SavedNotWritten) {
                hw.set_power_limit(0, CAP).unwrap();
            }
        }
        // Down past the lease, then started again.
        clock.advance(120_000);
        let hw = sim(dir.path());
        let a = agent(dir.path(), &hw, &clock);
        a.tick().await;
        assert_eq!(power(&hw), FACTORY, "{step:?}: back at the factory baseline");
        assert!(a.held().is_empty(), "{step:?}: {:?}", a.held());
        let ended = a.ended_holds();
        assert!(
            ended.iter().all(|e| e.outcome != RestoreOutcome::Drifted),
            "{step:?}: the agent's own write read as a person's: {ended:?}"
        );
        // The next hold's baseline is the factory value.
        let mut req = Request::new("r2-a1", Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 650.0 }));
        req.owner = Some("r2".into());
        req.revert_after_secs = Some(60);
        let r = a.handle(req).await;
        assert!(r.ok, "{step:?}: {r:?}");
        assert_eq!(a.held()[0].baseline, HoldValue::PowerLimit { watts: FACTORY }, "{step:?}");
        assert_eq!(power(&hw), 650.0, "{step:?}");
    }
}
