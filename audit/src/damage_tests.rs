//! Damage in the middle of the record log, as an editor or an attacker
//! leaves it (issue 46, point 1): `verify_dir` opens nothing for writing
//! and names the line; an open cuts only a torn last write and refuses
//! anything else with nothing changed. Table-driven: one row per kind of
//! edit, before the checkpoint (the engine stopped cleanly) and past it
//! (the engine crashed within a second of the edited record).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use nightshift_proto::clock::{SharedClock, VirtualClock};
use serde_json::json;

use super::{AuditStore, LOG_FILE, NewRecord, RecordKind, verify_dir};

fn clock() -> SharedClock {
    Arc::new(VirtualClock::new(1_000))
}

const RECORDS: u64 = 40;

/// A cleanly closed store of 40 notes (line N is record N), its
/// checkpoint moved back to `checkpoint` as a crash would leave it.
async fn store(dir: &Path, checkpoint: u64) {
    {
        let s = AuditStore::open(dir, clock()).unwrap();
        for i in 0..RECORDS {
            s.append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})).node(Some("n1")), None).await.unwrap();
        }
    }
    if checkpoint < RECORDS {
        let db = sled::open(dir.join("audit.sled")).unwrap();
        db.open_tree("meta").unwrap().insert(b"checkpoint", &checkpoint.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
}

/// Every file under `dir` and its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            } else {
                let name = e.path().strip_prefix(root).unwrap().display().to_string();
                out.insert(name, std::fs::read(e.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

type Edit = fn(&mut Vec<String>, usize);

/// (name, the edit of line `k` (0-based), what verify names at line k + 1
/// (or k + 2: the line after), whether an open with the checkpoint past the
/// edit still opens — with the log unchanged; the damage stays for verify:
/// only edits that leave the checkpoint's record where records.idx says.
const EDITS: &[(&str, Edit, &str, bool)] = &[
    ("shorter", |l, k| l[k] = l[k].replace("\"actor\":\"engine\"", "\"actor\":\"eng\""), "was altered", false),
    ("longer", |l, k| l[k] = l[k].replace("\"actor\":\"engine\"", "\"actor\":\"engine-2\""), "was altered", false),
    ("same length", |l, k| l[k] = l[k].replace("\"actor\":\"engine\"", "\"actor\":\"enginX\""), "was altered", true),
    ("json break", |l, k| l[k] = l[k].replacen('{', "x", 1), "not a readable record", true),
    // An older record's copy: the open finds where the chain goes on.
    ("inserted line", |l, k| l.insert(k + 1, l[4].clone()), "is missing", true),
    ("deleted line", |l, k| _ = l.remove(k), "is missing", false),
    ("swapped lines", |l, k| l.swap(k, k + 1), "is missing", true),
];

#[tokio::test]
async fn a_middle_edit_is_named_by_verify_and_refused_by_open_with_nothing_changed() {
    for past_checkpoint in [false, true] {
        for (name, edit, named, opens) in EDITS {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path();
            // Record 20 (line 20); past the checkpoint: the store crashed
            // with its checkpoint at record 15.
            store(d, if past_checkpoint { 15 } else { RECORDS }).await;
            let log = d.join(LOG_FILE);
            let text = std::fs::read_to_string(&log).unwrap();
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            assert_eq!(lines.len() as u64, RECORDS);
            edit(&mut lines, 19);
            std::fs::write(&log, lines.join("\n") + "\n").unwrap();
            let before = snapshot(d);

            let v = verify_dir(d, None).unwrap();
            let case = format!("{name}, past the checkpoint: {past_checkpoint}");
            assert!(!v.ok, "{case}: {v:?}");
            let problem = v.problem.clone().unwrap_or_default();
            let line = if *name == "inserted line" { 21 } else { 20 };
            assert!(
                problem.contains(&format!("records.jsonl:{line} (byte ")) && problem.contains(named),
                "{case}: {problem}"
            );
            assert_eq!(snapshot(d), before, "{case}: verify changed nothing");

            match AuditStore::open(d, clock()) {
                Ok(s) => {
                    assert!(*opens && !past_checkpoint, "{case}: the store opened over the damage");
                    drop(s);
                    assert_eq!(std::fs::read(&log).unwrap(), before[LOG_FILE], "{case}: the log is unchanged");
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(!*opens || past_checkpoint, "{case}: refused: {e}");
                    assert!(
                        e.contains("nothing was changed") && e.contains("nightshift audit salvage --to NEW_DIR"),
                        "{case}: {e}"
                    );
                    // sled, the derived index, writes on every open of its
                    // own; the log and records.idx are left as they were.
                    let after = snapshot(d);
                    for f in [LOG_FILE, "records.idx"] {
                        assert_eq!(after[f], before[f], "{case}: a refused open changed {f}");
                    }
                }
            }
        }
    }
}

/// The refusal names the line and byte where the chain stops.
#[tokio::test]
async fn the_refusal_names_the_line_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    store(d, RECORDS).await;
    let log = d.join(LOG_FILE);
    let text = std::fs::read_to_string(&log).unwrap();
    let offset: usize = text.lines().take(9).map(|l| l.len() + 1).sum();
    std::fs::write(&log, text.replacen("\"i\":9}", "\"i\":99}", 1)).unwrap();
    let e = AuditStore::open(d, clock()).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "found line 10 (byte {offset}): record 10 was altered: its hash does not match its content"
        )),
        "{e}"
    );
}

/// What a crash or a power loss leaves at the end is still cut: a last
/// line without its newline, and lines holding NUL bytes (pages of the
/// last group never written) — but a whole line after them is evidence.
#[tokio::test]
async fn a_torn_tail_is_cut_and_a_whole_line_after_it_is_not() {
    let torn: &[(&str, &[u8], bool)] = &[
        ("no newline", b"{\"seq\":41,\"ts_ms\":1000,\"kind\":\"no", true),
        ("a page of NULs, then the rest of a line", b"\0\0\0\0\0\0rest of a line\"}\n{\"seq\":4", true),
        ("NULs then a whole line", b"\0\0\0\0ab\"}\n{\"seq\":42,\"whole\":true}\n", false),
    ];
    for (name, tail, cut) in torn {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        store(d, RECORDS).await;
        let log = d.join(LOG_FILE);
        let good = std::fs::read(&log).unwrap();
        let mut damaged = good.clone();
        damaged.extend_from_slice(tail);
        std::fs::write(&log, &damaged).unwrap();
        match AuditStore::open(d, clock()) {
            Ok(s) => {
                assert!(cut, "{name}: opened");
                assert_eq!(s.head_seq(), RECORDS);
                let r = s.append(NewRecord::new(RecordKind::Note, "engine", json!({})), None).await.unwrap();
                assert_eq!(r.seq, RECORDS + 1);
                assert!(s.verify().unwrap().ok, "{name}");
                drop(s);
                assert!(std::fs::read(&log).unwrap().starts_with(&good), "{name}");
            }
            Err(e) => {
                assert!(!cut, "{name}: refused: {e}");
                assert_eq!(std::fs::read(&log).unwrap(), damaged, "{name}: nothing was cut");
            }
        }
    }
}

/// verify on a store that is fine says so, changes nothing, and checks an
/// anchored head; an engine holding the store is asked instead.
#[tokio::test]
async fn verify_dir_reads_only_and_checks_an_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    store(d, RECORDS).await;
    let before = snapshot(d);
    let v = verify_dir(d, None).unwrap();
    assert_eq!((v.ok, v.verified_up_to, v.notes.len()), (true, RECORDS, 0), "{v:?}");
    assert_eq!(snapshot(d), before);
    let hash_of = |seq: u64| {
        let line =
            std::fs::read_to_string(d.join(LOG_FILE)).unwrap().lines().nth(seq as usize - 1).unwrap().to_string();
        serde_json::from_str::<super::AuditRecord>(&line).unwrap().hash
    };
    assert!(verify_dir(d, Some((12, &hash_of(12)))).unwrap().ok);
    let wrong = verify_dir(d, Some((12, &hash_of(13)))).unwrap();
    assert!(!wrong.ok && wrong.problem.unwrap().contains("expected record 12 to have the anchored hash"));
    let cut = verify_dir(d, Some((RECORDS + 5, &hash_of(1)))).unwrap();
    assert!(!cut.ok && cut.problem.unwrap().contains("records were cut off"));
    assert_eq!(snapshot(d), before);

    let s = AuditStore::open(d, clock()).unwrap();
    assert!(matches!(verify_dir(d, None), Err(super::AuditError::Locked { .. })));
    drop(s);
}

/// A run summary line changed outside the chain is named by the log walk.
#[tokio::test]
async fn verify_dir_checks_summary_lines_against_their_digest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    {
        let s = AuditStore::open(d, clock()).unwrap();
        let summary = crate::tools::salvage::rebuild_summary(
            "r1",
            &[&super::AuditRecord {
                seq: 1,
                ts_ms: 1,
                kind: RecordKind::RunQueued,
                run: Some("r1".into()),
                node: Some("n1".into()),
                gpu: None,
                runbook: Some("rb".into()),
                actor: "user:a".into(),
                data: json!({"target": crate::runs::Target::node("n1")}),
                prev_hash: String::new(),
                hash: String::new(),
                v: None,
            }],
        )
        .unwrap();
        s.append(NewRecord::new(RecordKind::RunQueued, "user:a", json!({})).run("r1"), Some(summary)).await.unwrap();
    }
    assert!(verify_dir(d, None).unwrap().ok);
    let log = d.join(LOG_FILE);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("summary_of"));
    std::fs::write(&log, text.replacen("n1", "n2", 2)).unwrap();
    let v = verify_dir(d, None).unwrap();
    assert!(!v.ok && v.problem.clone().unwrap().contains("the run summary after record 1 was changed"), "{v:?}");
}
