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
