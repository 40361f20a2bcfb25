//! The agent's state dir on a full tmpfs (issue 26 item 4): a request it
//! cannot record is refused and changes nothing, on the device or in
//! memory; a lease expiry it cannot record keeps the hold and the device
//! as they are and is tried again every tick; no journal line is cut so
//! that it swallows the next; once space is back everything converges to
//! the holds in force, across a restart too.
//!
//! Needs to mount a tmpfs (root); elsewhere it says so and checks nothing.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_agent::statelog::StateLog;
use nightshift_proto::clock::{SharedClock, VirtualClock};
use nightshift_proto::*;

struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn agent(dir: &Path, sim: &Arc<SimBackend>, clock: &VirtualClock) -> Agent {
    let backend: Arc<dyn Backend> = sim.clone();
    let shared: SharedClock = Arc::new(clock.clone());
    Agent::new(AgentOptions::new("n1", dir.join("state")), backend, shared).unwrap()
}

fn cap(id: &str, owner: &str, watts: f64) -> Request {
    let mut r = Request::new(id, Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts }));
    r.owner = Some(owner.into());
    r.revert_after_secs = Some(60);
    r
}

fn power(sim: &SimBackend) -> f64 {
    sim.sample().unwrap().0[0].power_limit_watts
}

#[tokio::test]
async fn a_full_state_disk_refuses_cleanly_keeps_holds_and_converges_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&state)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("agent full_disk: cannot mount a tmpfs here (needs root): nothing checked");
        return;
    }
    let _mount = Mount(state.clone());
    let clock = VirtualClock::new(1_000_000);
    let hw = Arc::new(
        SimBackend::new(SimConfig { profile: "h100-sxm".into(), gpus: 1, ..SimConfig::default() })
            .unwrap()
            .persist_to(dir.path().join("sim-hardware.json")),
    );
    let a = agent(dir.path(), &hw, &clock);
    let first = a.handle(cap("r1-a1", "r1", 600.0)).await;
    assert!(first.ok, "{first:?}");
    assert_eq!(power(&hw), 600.0);

    // Fill the disk, to the last byte.
    let mut filler = std::fs::File::create(state.join("filler")).unwrap();
    let mut chunk = 16 * 1024;
    while chunk > 0 {
        while filler.write_all(&vec![0x5au8; chunk]).and_then(|_| filler.sync_data()).is_ok() {}
        chunk /= 2;
    }
    drop(filler);

    // A change is refused once its line cannot be recorded (the last page
    // of the state log may still take a few lines: those are durable, and
    // applied). The refused one changes nothing.
    let mut accepted = vec![600.0];
    let refused = loop {
        let watts = 590.0 - 10.0 * accepted.len() as f64;
        assert!(watts > 200.0, "the full disk never refused a change: {accepted:?}");
        let id = format!("r{}-a1", accepted.len() + 1);
        let r = a.handle(cap(&id, &format!("r{}", accepted.len() + 1), watts)).await;
        if !r.ok {
            break r;
        }
        accepted.push(watts);
    };
    assert!(
        refused.error.as_ref().is_some_and(|e| e.message.contains("cannot record the request and its holds durably")),
        "{refused:?}"
    );
    let lowest = accepted.iter().cloned().fold(f64::INFINITY, f64::min);
    assert_eq!(power(&hw), lowest, "the device is untouched by the refused change");
    assert_eq!(
        a.held()[0].holds.len(),
        accepted.len(),
        "nothing of the refused request stays in memory: {:?}",
        a.held()
    );
    StateLog::verify(&state).expect("no state log line is cut by the full disk");
    // Telemetry (what the engine sees) and /metrics say so.
    let t = a.telemetry().await.unwrap();
    let why = t.node_metrics.state_degraded.clone().expect("the agent reports itself degraded");
    assert!(why.contains("state.log") && why.contains("No space left on device"), "{why}");

    // The lease runs out on the full disk: the hold and the device stay,
    // and every tick tries again.
    clock.advance(120_000);
    a.tick().await;
    a.tick().await;
    assert_eq!(
        a.held().first().map(|h| h.holds.len()),
        Some(accepted.len()),
        "the holds are kept until their end is recorded"
    );
    assert_eq!(power(&hw), lowest, "nothing restored that the record does not say");

    // Space comes back: the expiry goes through, the device is restored.
    std::fs::remove_file(state.join("filler")).unwrap();
    a.tick().await;
    assert_eq!(a.telemetry().await.unwrap().node_metrics.state_degraded, None, "no longer degraded");
    assert!(a.held().is_empty(), "{:?}", a.held());
    assert_eq!(power(&hw), 700.0);
    drop(a);

    // Restarted: the journal is whole — the first id answers as recorded
    // and is not applied again; the refused one never applies.
    let lines = StateLog::journal_lines(&state).unwrap();
    assert!(lines.len() >= 2, "{lines:?}");
    StateLog::verify(&state).expect("no state log line is cut");
    let a = agent(dir.path(), &hw, &clock);
    let again = a.handle(cap("r1-a1", "r1", 600.0)).await;
    assert_eq!(again, first, "a replay answers as recorded");
    assert_eq!(power(&hw), 700.0, "and applies nothing again");
    assert!(a.held().is_empty());
}
