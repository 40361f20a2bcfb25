//! Every store format written so far still opens and verifies: fixture
//! stores committed as they were written (only their record log: the sled
//! index is rebuilt from it on open, as after a lost index).
//!
//! `fixtures/store-2026-12/`: the first 50 records of a `nightshift demo`
//! run (chain version 2, run summaries as `summary_of` lines), written
//! before the typed record payloads of issue 28.

use std::path::Path;
use std::sync::Arc;

use nightshift_audit::{AuditStore, RecordKind, verify_log};

fn fixture(name: &str) -> tempfile::TempDir {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&from).unwrap().flatten() {
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

#[test]
fn the_december_2026_store_opens_and_verifies() {
    let dir = fixture("store-2026-12");
    let log = verify_log(&dir.path().join("records.jsonl")).unwrap();
    assert!(log.ok && log.verified_up_to == 50, "{log:?}");
    let store = AuditStore::open(dir.path(), Arc::new(nightshift_proto::clock::SystemClock)).unwrap();
    let v = store.verify().unwrap();
    assert!(v.ok, "{v:?}");
    assert_eq!((v.verified_up_to, v.records), (50, 50));
    // Its records read back as typed as they were written, runs included.
    let recs = store.tail(0, usize::MAX).unwrap();
    assert_eq!(recs.len(), 50);
    assert_eq!(recs[0].kind, RecordKind::EngineStarted);
    let run = recs.iter().find_map(|r| r.run.clone()).expect("a run");
    assert!(store.run(&run).unwrap().is_some(), "{run}'s summary is indexed again");
    // And it takes new records after them.
    let r = store
        .append_blocking(
            nightshift_audit::NewRecord::new(RecordKind::Note, "engine", serde_json::json!({"text": "after"})),
            None,
        )
        .unwrap();
    assert_eq!(r.seq, 51);
    assert_eq!(r.prev_hash, recs[49].hash);
    assert!(store.verify().unwrap().ok);
}

/// The typed payloads recovery reads (`nightshift_audit::data`) read every
/// such record of the store written before them — with the fields recovery
/// uses there — so a restart on an old store rebuilds what it did.
#[test]
fn records_written_before_the_typed_payloads_read_as_them() {
    use nightshift_audit::data;
    let dir = fixture("store-2026-12");
    let store = AuditStore::open(dir.path(), Arc::new(nightshift_proto::clock::SystemClock)).unwrap();
    let recs = store.tail(0, usize::MAX).unwrap();
    let mut read = std::collections::BTreeMap::<&str, usize>::new();
    for r in &recs {
        let ok = match r.kind {
            RecordKind::RunQueued => r.payload::<data::RunQueued>().map(|p| p.target.is_some()),
            RecordKind::RunStarted => r.payload::<data::RunStarted>().map(|_| true),
            RecordKind::RunFinished => r.payload::<data::RunFinished>().map(|p| p.target.is_some()),
            RecordKind::TriggerSuppressed => r.payload::<data::TriggerSuppressed>().map(|p| p.target.is_some()),
            RecordKind::HoldEnded => {
                r.payload::<data::HoldEnded>().map(|p| !p.hold_id.is_empty() && p.ended_at_ms.is_some())
            }
            RecordKind::ActionResult => {
                r.payload::<data::ActionRef>().map(|p| !p.op.is_empty() && !p.action_id.is_empty())
            }
            RecordKind::ActionIntent => {
                r.payload::<data::ActionIntent>().map(|p| !p.op.is_empty() && !p.action_id.is_empty())
            }
            _ => continue,
        };
        assert_eq!(ok, Ok(true), "record {} ({:?}): {}", r.seq, r.kind, r.data);
        *read.entry(r.kind.as_str()).or_default() += 1;
    }
    for kind in [
        "run_queued",
        "run_started",
        "run_finished",
        "trigger_suppressed",
        "hold_ended",
        "action_intent",
        "action_result",
    ] {
        assert!(read.contains_key(kind), "the fixture has {kind} records: {read:?}");
    }
}
