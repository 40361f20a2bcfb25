//! One `fdatasync` per change (issue 26): a mutating request that changes
//! something costs the agent exactly one sync of its state log — the line
//! with the request's `pending` mark and its holds, before the device
//! changes; the reply's line rides on the next one. A refusal, a dry run
//! and a repeat cost none. Counted by the state log itself
//! (`Agent::state_syncs`) and checked against the lines it holds.

use std::sync::Arc;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::journal::JournalLine;
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_agent::statelog::StateLog;
use nightshift_proto::clock::{SharedClock, VirtualClock};

#[tokio::test]
async fn each_change_costs_one_fdatasync_and_nothing_else_costs_any() {
    let dir = tempfile::tempdir().unwrap();
    let clock = VirtualClock::new(1_000_000);
    let sim: Arc<dyn Backend> =
        Arc::new(SimBackend::new(SimConfig { profile: "h100-sxm".into(), gpus: 2, ..SimConfig::default() }).unwrap());
    let shared: SharedClock = Arc::new(clock.clone());
    let agent = Agent::new(AgentOptions::new("n1", dir.path().join("state")), sim, shared).unwrap();
    // (request, whether it should succeed, fdatasyncs it may cost)
    let table: &[(&str, bool, u64)] = &[
        (
            r#"{"v":1,"id":"c1","op":"set_power_limit","args":{"gpu":0,"watts":600},"owner":"r1","revert_after_secs":60}"#,
            true,
            1,
        ),
        (
            r#"{"v":1,"id":"c1","op":"set_power_limit","args":{"gpu":0,"watts":600},"owner":"r1","revert_after_secs":60}"#,
            true,
            0,
        ),
        (
            r#"{"v":1,"id":"c2","op":"set_power_limit","args":{"gpu":0,"watts":550},"owner":"r2","revert_after_secs":60}"#,
            true,
            1,
        ),
        (
            r#"{"v":1,"id":"c3","op":"set_power_limit","args":{"gpu":1,"watts":550},"owner":"r2","dry_run":true}"#,
            true,
            0,
        ),
        (r#"{"v":1,"id":"c4","op":"set_power_limit","args":{"gpu":1,"watts":5},"owner":"r2"}"#, false, 0),
        (
            r#"{"v":1,"id":"c5","op":"set_clocks","args":{"gpu":1,"min_mhz":800,"max_mhz":1500},"owner":"r2","revert_after_secs":60}"#,
            true,
            1,
        ),
        (
            r#"{"v":1,"id":"c6","op":"set_gpu_drain","args":{"gpu":1,"drained":true},"owner":"r2","revert_after_secs":60}"#,
            true,
            1,
        ),
        (r#"{"v":1,"id":"c7","op":"clear_ecc","args":{"gpu":0},"owner":"r2"}"#, true, 1),
        (r#"{"v":1,"id":"c8","op":"drain","args":{"reason":"test"},"owner":"r3","revert_after_secs":60}"#, true, 1),
        (r#"{"v":1,"id":"c9","op":"renew","args":{"owner":"r2","lease_secs":120}}"#, true, 1),
        (r#"{"v":1,"id":"c10","op":"release","args":{"owner":"r2"}}"#, true, 1),
        (r#"{"v":1,"id":"c11","op":"release","args":{"owner":"r1"}}"#, true, 1),
        (r#"{"v":1,"id":"c12","op":"release","args":{"hold":"no-such-hold"}}"#, false, 0),
        (r#"{"v":1,"id":"c13","op":"holds","args":{}}"#, true, 0),
    ];
    for (raw, ok, syncs) in table {
        let before = agent.state_syncs();
        let r = agent.handle_bytes(raw.as_bytes()).await;
        assert_eq!(r.ok, *ok, "{raw}: {r:?}");
        assert_eq!(agent.state_syncs() - before, *syncs, "{raw}: fdatasyncs; {r:?}");
    }
    // Every change was durable before it was made: each applied request
    // has its `pending` line, each answered one its `done` line.
    let lines = StateLog::journal_lines(&dir.path().join("state")).unwrap();
    let pending = lines.iter().filter(|l| matches!(l, JournalLine::Pending { .. })).count();
    assert_eq!(pending, table.iter().filter(|(_, ok, s)| *ok && *s == 1).count(), "{lines:?}");
    let done = lines.iter().filter(|l| matches!(l, JournalLine::Done { .. })).count();
    assert_eq!(done, table.iter().filter(|(r, _, _)| !r.contains("\"holds\"")).count() - 1, "{lines:?}");
    StateLog::verify(&dir.path().join("state")).unwrap();
}
