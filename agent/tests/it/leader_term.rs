//! Fencing at the agent (HA, issue 17): a request carrying a leader term
//! below the highest the agent has seen comes from a deposed engine and is
//! refused `stale_leader`, across agent restarts; requests without a term
//! (one engine, no HA) are unaffected; the term is not part of a request's
//! meaning, so a replay of a recorded id still answers as recorded.

use std::sync::Arc;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_proto::clock::{SharedClock, VirtualClock};
use nightshift_proto::*;

fn agent(dir: &std::path::Path, sim: &Arc<SimBackend>) -> Agent {
    let backend: Arc<dyn Backend> = sim.clone();
    let clock: SharedClock = Arc::new(VirtualClock::new(1_000_000));
    Agent::new(AgentOptions::new("n1", dir.join("state")), backend, clock).unwrap()
}

fn cap(id: &str, watts: f64, term: Option<u64>) -> Request {
    let mut r = Request::new(id, Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts }));
    r.term = term;
    r.owner = Some("r1".into());
    r
}

/// A leader's announce: a read of the holds with its term.
fn announce(id: &str, term: u64) -> Request {
    let mut r = Request::new(id, Op::Holds(NoArgs {}));
    r.term = Some(term);
    r
}

fn limit(sim: &SimBackend) -> f64 {
    sim.sample().unwrap().0[0].power_limit_watts
}

#[tokio::test]
async fn a_deposed_leaders_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::new(SimConfig { gpus: 1, ..SimConfig::default() }).unwrap());
    let a = agent(dir.path(), &sim);
    assert!(a.handle(announce("term-5", 5)).await.ok);
    let r = a.handle(cap("t5", 600.0, Some(5))).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(limit(&sim), 600.0);
    // The old leader (term 4), its request already in flight.
    let r = a.handle(cap("t4", 500.0, Some(4))).await;
    assert_eq!(r.code(), Some(ErrorCode::StaleLeader), "{r:?}");
    assert_eq!(r.error.unwrap().message, "leader term 4 is stale: this agent has seen term 5; a newer engine leads");
    assert_eq!(limit(&sim), 600.0, "nothing changed");
    // Dry runs too: a deposed engine gets no answers to act on.
    let mut dry = cap("t4-dry", 500.0, Some(4));
    dry.dry_run = true;
    assert_eq!(a.handle(dry).await.code(), Some(ErrorCode::StaleLeader));
    // Reading is not fenced.
    assert!(a.handle(Request::new("inv", Op::Inventory(NoArgs {}))).await.ok);
    // No term: one engine, no HA.
    assert!(a.handle(cap("plain", 550.0, None)).await.ok);
    // A replay of a recorded id answers as recorded, whatever term it
    // carries now.
    let again = a.handle(cap("t5", 600.0, Some(9))).await;
    assert!(again.ok, "{again:?}");
    drop(a);

    // Restarted, the agent still knows term 5.
    let a = agent(dir.path(), &sim);
    assert_eq!(a.handle(cap("t4-late", 450.0, Some(4))).await.code(), Some(ErrorCode::StaleLeader));
    assert!(a.handle(announce("term-6", 6)).await.ok);
    assert!(a.handle(cap("t6", 480.0, Some(6))).await.ok);
    assert_eq!(a.handle(cap("t5-late", 470.0, Some(5))).await.code(), Some(ErrorCode::StaleLeader));
    assert_eq!(limit(&sim), 480.0);
}

/// Issue 46 point 9, strictly: only the announce path records a term. A
/// change carrying a higher term is made (fenced by its term, not past
/// the bound) but moves nothing — the leader at the announced term still
/// acts, across a restart — and only a later announce fences it out.
#[tokio::test]
async fn a_change_with_a_higher_term_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::new(SimConfig { gpus: 1, ..SimConfig::default() }).unwrap());
    let a = agent(dir.path(), &sim);
    assert!(a.handle(announce("term-2", 2)).await.ok);
    let r = a.handle(cap("t9", 600.0, Some(9))).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(limit(&sim), 600.0);
    assert!(a.handle(cap("t2", 550.0, Some(2))).await.ok, "term 9 was not recorded");
    drop(a);
    let a = agent(dir.path(), &sim);
    assert!(a.handle(cap("t2-after", 540.0, Some(2))).await.ok, "nor across a restart");
    assert!(a.handle(announce("term-3", 3)).await.ok);
    assert_eq!(a.handle(cap("t2-late", 530.0, Some(2))).await.code(), Some(ErrorCode::StaleLeader));
    assert_eq!(limit(&sim), 540.0);
}

/// Fence at the send (issue 26 item 7): a new leader's read with its term is
/// an announcement — the old leader's request that arrives after it is
/// refused although the new leader never changed anything here — and a
/// request handled after its leader's lease deadline is refused whatever
/// its term, nothing applied.
#[tokio::test]
async fn an_announced_term_and_a_passed_deadline_fence_the_old_leader() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::new(SimConfig { gpus: 1, ..SimConfig::default() }).unwrap());
    let a = agent(dir.path(), &sim);
    let before = limit(&sim);
    // The new leader (term 2) announces itself with a read.
    assert!(a.handle(announce("term-2", 2)).await.ok);
    // The frozen term-1 leader resumes and sends.
    let r = a.handle(cap("old", 500.0, Some(1))).await;
    assert_eq!(r.code(), Some(ErrorCode::StaleLeader), "{r:?}");
    assert_eq!(limit(&sim), before, "nothing changed");

    // A request at the current term whose deadline has passed (the agent's
    // clock reads 1,000,000 ms): refused, nothing applied.
    let mut late = cap("late", 500.0, Some(2));
    late.not_after_ms = Some(999_000);
    let r = a.handle(late).await;
    assert_eq!(r.code(), Some(ErrorCode::StaleLeader), "{r:?}");
    assert!(r.error.unwrap().message.contains("1000 ms after its leader's lease deadline"));
    assert_eq!(limit(&sim), before, "nothing changed");
    // In time: applied.
    let mut on_time = cap("on-time", 500.0, Some(2));
    on_time.not_after_ms = Some(1_000_500);
    assert!(a.handle(on_time).await.ok);
    assert_eq!(limit(&sim), 500.0);
    // The deadline is not part of the request's meaning: a replay with a
    // new one answers as recorded.
    let mut replay = cap("on-time", 500.0, Some(2));
    replay.not_after_ms = Some(2_000_000);
    assert!(a.handle(replay).await.ok);
}

/// Regression (issue 27 item 8: one dry run with `term: u64::MAX` locked
/// every HA leader out of the agent for good): a dry run records no term,
/// and a term far above the highest seen is refused and not recorded.
#[tokio::test]
async fn a_dry_run_or_an_impossible_term_cannot_lock_leaders_out() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::new(SimConfig { gpus: 1, ..SimConfig::default() }).unwrap());
    let a = agent(dir.path(), &sim);
    let mut dry = cap("dry-max", 500.0, Some(u64::MAX));
    dry.dry_run = true;
    let r = a.handle(dry).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "{r:?}");
    let mut dry = cap("dry-9", 500.0, Some(9));
    dry.dry_run = true;
    assert!(a.handle(dry).await.ok);
    // Neither was recorded: the real leader at term 3 announces and acts.
    assert!(a.handle(announce("term-3", 3)).await.ok);
    assert!(a.handle(cap("t3", 600.0, Some(3))).await.ok);
    // A jump past the bound is refused and not recorded.
    let r = a.handle(cap("t-huge", 500.0, Some(3 + 1_001))).await;
    assert_eq!(r.code(), Some(ErrorCode::BadRequest), "{r:?}");
    assert!(r.error.unwrap().message.contains("too far above"));
    assert!(a.handle(announce("term-4", 4)).await.ok, "the next real term still announces");
    assert!(a.handle(cap("t4", 580.0, Some(4))).await.ok, "and acts");
    assert_eq!(limit(&sim), 580.0);
    drop(a);
    let a = agent(dir.path(), &sim);
    assert!(a.handle(cap("t4-again", 570.0, Some(4))).await.ok, "across a restart too");
}

/// Issue 46 point 9: 20 inventory reads with the engine's key and a term
/// 1,000 above the last each raised the agent's term to 20,002, and the
/// real leader was then refused as stale — across restarts. Only the
/// announce (a read of the holds) records a term now.
#[tokio::test]
async fn reads_other_than_the_announce_never_raise_the_term() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::new(SimConfig { gpus: 1, ..SimConfig::default() }).unwrap());
    let a = agent(dir.path(), &sim);
    assert!(a.handle(announce("term-2", 2)).await.ok);
    assert!(a.handle(cap("lead", 600.0, Some(2))).await.ok);
    for i in 0..20u64 {
        for op in [Op::Inventory(NoArgs {}), Op::Telemetry(NoArgs {})] {
            let mut r = Request::new(format!("inflate-{i}-{}", op.name()), op);
            r.term = Some(2 + 1000 * (i + 1));
            assert!(a.handle(r).await.ok);
        }
    }
    // The real leader (term 2) still acts.
    let r = a.handle(cap("still", 550.0, Some(2))).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(limit(&sim), 550.0);
    // The announce of a takeover does record its term.
    assert!(a.handle(announce("announce-3", 3)).await.ok);
    assert_eq!(a.handle(cap("old", 500.0, Some(2))).await.code(), Some(ErrorCode::StaleLeader));
}
