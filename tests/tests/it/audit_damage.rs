//! A damaged audit store, as an attacker or a failing disk leaves it: one
//! flipped byte in the index (`records.idx`), in sled's files, or inside a
//! record in the record log (a file store's only copy of each record).
//! `nightshift audit verify` names the record (it does not hang on sled's
//! damaged page, nor print an offset that names nothing), and `nightshift
//! audit salvage --to DIR` builds a store that verifies, holding every
//! record the log still holds, on which the engine starts.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nightshift_engine::audit::AuditStore;
use nightshift_proto::clock::SystemClock;
use nightshift_tests::external::workspace_bin_dir;

fn nightshift(dir: &Path, config: &str, args: &[&str]) -> Output {
    let out = Command::new(workspace_bin_dir().join("nightshift"))
        .current_dir(dir)
        .args(["--config", config])
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    eprintln!(
        "nightshift {args:?} → {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `scripts/verify-chain.py ARGS` over `text` on stdin: (exit 0, stdout).
fn verify_chain_py(python: &Path, text: &str, args: &[&str]) -> (bool, String) {
    use std::io::Write;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/verify-chain.py");
    let mut child =
        Command::new(python).arg(&script).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A store with a few thousand records: the audit writer, stopped.
fn store_with_records(d: &Path) -> u64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_audit-writer"))
        .arg(d.join("data"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _ = child.kill();
    let _ = child.wait();
    let store = AuditStore::open(&d.join("data"), Arc::new(SystemClock)).unwrap();
    let head = store.head_seq();
    assert!(head > 100, "the writer wrote {head} records");
    assert!(store.verify().unwrap().ok);
    head
}

fn config(d: &Path, name: &str, data: &str) -> String {
    std::fs::create_dir_all(d.join("rb")).unwrap();
    std::fs::write(d.join("fleet.yaml"), "version: 1\nnodes: []\n").unwrap();
    std::fs::write(
        d.join(name),
        format!("version: 1\ndata_dir: {data}\nrunbook_dir: rb\ninventory_path: fleet.yaml\nengine_key_path: key\n"),
    )
    .unwrap();
    name.to_string()
}

/// Flip one bit of the byte after each occurrence of `needle` in `file`
/// (sled is log-structured: a record's page may be in the file more than
/// once, and only the newest copy is read); returns how many were flipped.
fn flip(file: &Path, needle: &[u8]) -> usize {
    let mut b = std::fs::read(file).unwrap();
    let at: Vec<usize> =
        b.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i + needle.len()).collect();
    assert!(!at.is_empty(), "the needle is in the file");
    for i in &at {
        b[*i] ^= 0x01;
    }
    std::fs::write(file, b).unwrap();
    at.len()
}

#[test]
fn a_flipped_byte_in_the_index_is_named_and_salvage_recovers_every_record() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    // One byte of the entry of a record far from the ends.
    let target = head / 16;
    let idx = d.join("data/records.idx");
    let mut b = std::fs::read(&idx).unwrap();
    b[((target - 1) * 16 + 2) as usize] ^= 0x01;
    std::fs::write(&idx, b).unwrap();
    let o = nightshift(d, &cfg, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("broken: the chain breaks at record {target}")), "{text}");
    assert!(text.contains("records.idx is damaged (checksum mismatch)"), "{text}");

    let o = nightshift(d, &cfg, &["audit", "salvage", "--to", "salvaged"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("salvaged {head} record(s)")), "the record log kept every record: {text}");
    let cfg2 = config(d, "engine2.yaml", "salvaged");
    let o = nightshift(d, &cfg2, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("chain verified up to record {}", head + 1)));
    // The engine starts on it (and reads its timeline).
    let o = nightshift(d, &cfg2, &["audit", "list", "--json"]);
    assert_eq!(o.status.code(), Some(0));
}

/// sled now holds only what is derived (the indexes by run, node and kind,
/// run summaries, the checkpoint): damage there is rebuilt from the log.
#[test]
fn a_flipped_byte_in_sled_loses_no_record() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    // Inside the by-run index's keys in the sled log file.
    flip(&d.join("data/audit.sled/db"), b"r3-");
    let o = nightshift(d, &cfg, &["audit", "salvage", "--to", "salvaged"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("salvaged {head} record(s)")), "the record log kept every record: {text}");
    let o = nightshift(d, &config(d, "engine2.yaml", "salvaged"), &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("chain verified up to record {}", head + 1)));
}

#[test]
fn a_flipped_byte_in_the_record_log_is_named_by_line_and_salvage_reports_the_record_lost() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    let log = d.join("data/records.jsonl");
    // Every writer's record with this `i`: one line each.
    let flipped = flip(&log, format!("\"i\":{},", head / 32).as_bytes()) as u64;
    let o = nightshift(d, &cfg, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("record log:") && text.contains("records.jsonl:"), "{text}");
    let o = nightshift(d, &cfg, &["audit", "salvage", "--to", "salvaged"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    // The log is the only copy: the damaged line's record is lost, and said.
    assert!(text.contains(&format!("salvaged {} record(s)", head - flipped)), "{text}");
    assert!(text.contains("lost records") && text.contains("damaged record log line"), "{text}");
    let o = nightshift(d, &config(d, "engine2.yaml", "salvaged"), &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn an_altered_record_is_reported_lost_and_the_rest_verifies() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    // Alter one record's line (an attacker editing the file, in place).
    let target = head / 2;
    {
        let store = AuditStore::open(&d.join("data"), Arc::new(SystemClock)).unwrap();
        store
            .tamper_for_tests(target, |b| {
                let s = String::from_utf8_lossy(b).replace("test:audit-writer", "test:audit-wrotex");
                *b = s.into_bytes();
            })
            .unwrap();
    }
    let o = nightshift(d, &cfg, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("record {target} was altered")));
    let o = nightshift(d, &cfg, &["audit", "salvage", "--to", "salvaged"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("salvaged {} record(s)", head - 1)), "{text}");
    assert!(text.contains(&format!("lost records {target}–{target}")), "{text}");
    // The new store verifies: the gap is the one its `salvaged` record
    // names (before it), and verify reports it.
    let o = nightshift(d, &config(d, "engine2.yaml", "salvaged"), &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!(
            "excused: the chain breaks before record {}: excused by the `salvaged` record {}",
            target + 1,
            head + 1
        )),
        "{text}"
    );
    // The salvage record carries the damaged store's head.
    let store = AuditStore::open(&d.join("salvaged"), Arc::new(SystemClock)).unwrap();
    let rec = store.get(head + 1).unwrap().unwrap();
    assert_eq!(rec.kind, nightshift_engine::audit::RecordKind::Salvaged);
    assert_eq!(rec.data["pre_salvage_head"]["seq"], serde_json::json!(head), "{}", rec.data);
}

/// Issue 46 point 1, from outside, as the attack round did it: one
/// record's line edited so that its length changes (an actor 4 bytes
/// shorter), records.idx left alone. `audit verify` names the line, byte
/// and record and exits 1; `serve` refuses to start, naming salvage; and
/// after both the record log is byte for byte what it was (it used to be
/// cut at the edit: 14,060 records deleted, "ok" printed).
#[test]
fn an_edited_log_stays_whole_after_verify_and_a_refused_serve() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    let log = d.join("data/records.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let target = head / 2;
    let (line_no, _) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with(&format!("{{\"seq\":{target},")))
        .expect("the target's line");
    let edited: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i == line_no { l.replace("test:audit-writer", "test:audit-wr") } else { l.to_string() } + "\n")
        .collect();
    assert_eq!(edited.len() + 4, text.len());
    std::fs::write(&log, &edited).unwrap();

    let o = nightshift(d, &cfg, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("broken: the chain breaks at record {target}")), "{out}");
    assert!(out.contains(&format!("records.jsonl:{} (byte ", line_no + 1)), "{out}");
    assert!(out.contains(&format!("record {target} was altered")) && out.contains("nothing was changed"), "{out}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), edited, "verify changed the log");

    assert_eq!(nightshift(d, &cfg, &["keygen", "--out", "key"]).status.code(), Some(0));
    let o = nightshift(d, &cfg, &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nothing was changed") && err.contains("nightshift audit salvage --to NEW_DIR"), "{err}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), edited, "a refused serve changed the log");

    // Salvage builds a store beside it, and still touches nothing here.
    let o = nightshift(d, &cfg, &["audit", "salvage", "--to", "salvaged"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("salvaged {} record(s)", head - 1)));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), edited, "salvage changed the log");
    let o = nightshift(d, &config(d, "engine2.yaml", "salvaged"), &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
}

/// `audit verify --head SEQ:HASH` checks a head kept elsewhere: the same
/// store passes; a store rewritten whole (every hash recomputed, so the
/// chain itself verifies) fails at the anchor.
#[test]
fn verify_checks_a_head_kept_elsewhere() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let head = store_with_records(d);
    let cfg = config(d, "engine.yaml", "data");
    let o = nightshift(d, &cfg, &["audit", "head", "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(h["seq"], serde_json::json!(head));
    let anchor = format!("{}:{}", head, h["hash"].as_str().unwrap());
    let o = nightshift(d, &cfg, &["audit", "verify", "--head", &anchor]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("the chain still holds the anchored head"));
    // The whole history rewritten by someone who recomputes every hash.
    let log = d.join("data/records.jsonl");
    let mut prev = nightshift_engine::audit::GENESIS.to_string();
    let mut out = String::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let Ok(mut r) = serde_json::from_str::<nightshift_engine::audit::AuditRecord>(line) else { continue };
        r.actor = "test:someone-else".into();
        r.prev_hash = prev;
        r.hash = r.compute_hash();
        prev = r.hash.clone();
        out.push_str(&serde_json::to_string(&r).unwrap());
        out.push('\n');
    }
    let rewritten = d.join("rewritten");
    std::fs::create_dir_all(&rewritten).unwrap();
    std::fs::write(rewritten.join("records.jsonl"), &out).unwrap();
    let cfg2 = config(d, "engine2.yaml", "rewritten");
    let o = nightshift(d, &cfg2, &["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0), "the rewritten chain verifies on its own");
    let o = nightshift(d, &cfg2, &["audit", "verify", "--head", &anchor]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("expected record {head} to have the anchored hash")), "{text}");
    let o = nightshift(d, &cfg, &["audit", "verify", "--head", "12:nothex"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--head: expected SEQ:HASH with HASH 64 hex digits"));
}

/// The chain can be checked without nightshift: `scripts/verify-chain.py`
/// (Python's standard library, an RFC 8785 canonical form of its own)
/// recomputes every hash of a real store's export — power limits as floats
/// (700.0), notes with "°C" and "→" — and names a record changed afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_tool_recomputes_every_hash() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(python) = nightshift_tests::external::require("python3", "python3") else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = nightshift_tests::TestAgent::start(
        dir.path(),
        "x1",
        nightshift_agent::backend::sim::SimConfig { gpus: 1, ..Default::default() },
        "",
    )
    .await;
    let cfg = nightshift_tests::engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "cap",
            "trigger: {type: manual}\nscope: gpu\n",
            "note(\"GPU at 91.5 °C → capping\");\nlet r = set_power_limit(612.5);\nset_power_limit(700.0);\n",
        )],
        "",
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(nightshift_tests::eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let s = engine
        .submit(nightshift_tests::manual_run("cap", nightshift_engine::runs::Target::gpu("x1", 0)))
        .await
        .unwrap();
    let id = s.run().unwrap().id.clone();
    nightshift_tests::eventually(20, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    let records = engine.audit().tail(0, usize::MAX).unwrap();
    assert!(records.iter().all(|r| r.v == Some(2)));
    assert!(records.iter().any(|r| serde_json::to_string(&r.data).unwrap().contains("700.0")), "a float that is whole");
    let export: String = records.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
    let check = |text: &str| verify_chain_py(&python, text, &[]);
    let (ok, text) = check(&export);
    assert!(ok, "{text}");
    assert!(text.starts_with(&format!("ok: {} records (0 version 1", records.len())), "{text}");
    // A note changed after the fact.
    let victim = records.iter().find(|r| r.data["text"].as_str().is_some_and(|t| t.contains("°C"))).unwrap().seq;
    let forged = export.replace("91.5 °C", "71.5 °C");
    let (ok, text) = check(&forged);
    assert!(!ok && text.starts_with(&format!("record {victim} ")), "{text}");
    // Regression (issue 27 item 4): the same edit with the record's `"v":2`
    // removed (version 1 records are only linked) passed; a version 1
    // record after a version 2 one is a downgrade, refused.
    let downgraded: String = forged
        .lines()
        .map(|l| if l.contains("71.5 °C") { l.replace(",\"v\":2", "") } else { l.to_string() } + "\n")
        .collect();
    assert_ne!(downgraded, forged, "the record carried its version");
    let (ok, text) = check(&downgraded);
    assert!(!ok && text.contains("expected hash version 2 after record 1, found version 1"), "{text}");
    // Issue 46 point 2: "v" stripped from *every* record, so none is after
    // a version 2 one, and the note rewritten, hashes and links kept:
    // version 1 records are rehashed now, by both verifiers.
    let all_v1: String = forged.lines().map(|l| l.replace(",\"v\":2", "") + "\n").collect();
    assert!(!all_v1.contains("\"v\":"));
    let (ok, text) = check(&all_v1);
    assert!(!ok && text.starts_with("record 1 (line 1): expected hash "), "{text}");
    let file = dir.path().join("all-v1.jsonl");
    std::fs::write(&file, &all_v1).unwrap();
    let v = nightshift_engine::audit::verify_log(&file).unwrap();
    assert!(!v.ok && v.problem.as_deref().unwrap_or("").contains("record 1 was altered"), "{v:?}");
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}

/// Version 1 records (serde_json's bytes of the fields in a fixed order)
/// are rehashed by `scripts/verify-chain.py` exactly as nightshift hashes
/// them: floats in serde_json's shortest form at every exponent, strings
/// with escapes and non-ASCII text, nested maps with their keys sorted,
/// the extremes of the integers. A chain of them verifies; one edit fails.
#[test]
fn the_outside_tool_rehashes_version_1_records() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::audit::{AuditRecord, GENESIS, RecordKind};
    let Some(python) = nightshift_tests::external::require("python3", "python3") else { return };
    let payloads = [
        serde_json::json!({"watts": 700.0, "f": [0.1, 1e16, 1e15, 1.5e-7, 0.0001, 1e-5, 123456789.125, -2.5, 1.23e22, 12345678901234567.0]}),
        serde_json::json!({"tiny": 5e-324, "huge": 1.7976931348623157e308, "neg0": -0.0, "z": 0.0}),
        serde_json::json!({"text": "GPU at 91.5 °C → capping", "esc": "a\"b\\c\nd\te\u{1}f\u{7f}g\u{8}\u{c}\r"}),
        serde_json::json!({"zeta": {"b": 1, "a": [true, false, null]}, "alpha": u64::MAX, "mid": i64::MIN}),
        serde_json::json!({"emoji": "🔥", "empty": {}, "list": []}),
    ];
    let mut prev = GENESIS.to_string();
    let mut export = String::new();
    for (i, data) in payloads.iter().enumerate() {
        let mut r = AuditRecord {
            seq: i as u64 + 1,
            ts_ms: 1_700_000_000_000 + i as i64,
            kind: RecordKind::Note,
            run: (i % 2 == 0).then(|| format!("r{i}")),
            node: Some("gpu-a1".into()),
            gpu: (i == 1).then_some(3),
            runbook: None,
            actor: "engine".into(),
            data: data.clone(),
            prev_hash: prev.clone(),
            hash: String::new(),
            v: None,
        };
        r.hash = r.compute_hash();
        prev = r.hash.clone();
        export.push_str(&serde_json::to_string(&r).unwrap());
        export.push('\n');
    }
    let check = |text: &str, args: &[&str]| verify_chain_py(&python, text, args);
    let (ok, text) = check(&export, &[]);
    assert!(ok, "{text}");
    assert_eq!(text.trim(), format!("ok: {} records ({} version 1)", payloads.len(), payloads.len()));
    let (ok, text) = check(&export.replace("91.5 °C", "71.5 °C"), &[]);
    assert!(!ok && text.starts_with("record 3 (line 3): expected hash "), "{text}");
    // The anchored head, and a wrong one.
    let (ok, text) = check(&export, &["--head", &format!("5:{prev}")]);
    assert!(ok, "{text}");
    let (ok, text) = check(&export, &["--head", &format!("4:{prev}")]);
    assert!(!ok && text.contains("expected the anchored hash"), "{text}");
}

/// Issue 42 point 9: moving a GPU to RMA collects the vendor's evidence on
/// the node — here a fake `nvidia-bug-report.sh` that writes 200 KB and
/// then hangs — within the agent's limits (the file cut at `max_bytes`,
/// the tool killed at `timeout_secs`), and puts the bundle's hash on the
/// chain; the bundle is copied off the node through the engine (the
/// agent's `read_evidence`, nothing outside the bundle's listed files) and
/// its web route, `nightshift audit verify --evidence DIR` checks the copy
/// against the chain, and a changed file fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rma_leaves_an_evidence_bundle_the_chain_vouches_for() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use std::os::unix::fs::PermissionsExt;

    use nightshift_engine::audit::RecordKind;
    use nightshift_engine::embed::HealthState;
    use nightshift_proto::{Op, Request, SimFault};
    use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec};

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tool = d.join("nvidia-bug-report.sh");
    std::fs::write(&tool, "#!/bin/sh\nhead -c 200000 /dev/urandom > \"$2.gz\"\necho collecting\nsleep 30\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rb = d.join("rb");
    std::fs::create_dir_all(&rb).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for ext in ["yaml", "rhai"] {
        std::fs::copy(repo.join(format!("ecc-dbe-drain.{ext}")), rb.join(format!("ecc-dbe-drain.{ext}"))).unwrap();
    }
    let script = Arc::new(nightshift_engine::embed::build_engine(&Default::default()));
    let set = nightshift_engine::embed::load_dir(&rb, &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let mut opts = SimFleetOptions::new(vec![SimNodeSpec::new("n1", "h100-sxm", 8)], set, script);
    // The web route below, on loopback without a token.
    opts.auth.allow_anonymous = Some(nightshift_engine::config::Role::Operator);
    let mut policy = nightshift_sim::scenario::sim_policy();
    policy.evidence.nvidia_bug_report_path = tool.clone();
    policy.evidence.timeout_secs = 2;
    policy.evidence.max_bytes = 65_536;
    opts.policy = Some(policy);
    let f = SimFleet::start(opts, &d.join("sim")).await.unwrap();
    f.run_for(10).await.unwrap();
    let r = f.agent("n1").handle(Request::new("rma-1", Op::SimFault(SimFault::RowRemapFailure { gpu: 5 }))).await;
    assert!(r.ok, "{r:?}");
    for _ in 0..120 {
        if f.engine.health_model().state("n1", 5) == HealthState::Rma {
            break;
        }
        f.step().await.unwrap();
    }
    assert_eq!(f.engine.health_model().state("n1", 5), HealthState::Rma);
    let recs = f.engine.audit().tail(0, usize::MAX).unwrap();
    let ev = recs.iter().find(|r| r.kind == RecordKind::EvidenceCollected).expect("an evidence_collected record");
    assert_eq!((ev.node.as_deref(), ev.gpu), (Some("n1"), Some(5)));
    let files = ev.data["files"].as_array().unwrap();
    let file = |name: &str| files.iter().find(|f| f["name"] == name).unwrap_or_else(|| panic!("{name}: {files:?}"));
    assert_eq!(file("nvidia-bug-report.log.gz")["bytes"], 65_536, "cut at max_bytes");
    assert!(file("nvidia-bug-report.log.gz")["error"].as_str().unwrap().contains("size limit of 65536 bytes"));
    assert!(
        file("nvidia-bug-report.out")["error"].as_str().unwrap().contains("did not finish within 2 s and was killed")
    );
    // No health check ran on the node yet: the tool's two files only.
    let names: Vec<&str> = files.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(names, ["nvidia-bug-report.log.gz", "nvidia-bug-report.out"], "{files:?}");
    // The RMA text names the bundle.
    let told = recs.iter().any(|r| {
        r.kind == RecordKind::Notification
            && r.data["text"].as_str().is_some_and(|t| t.contains(ev.data["bundle"].as_str().unwrap()))
    });
    assert!(told, "the RMA notice names the bundle");

    // A copy of the bundle off the node, piece by piece through the engine
    // and the agent (the manifest and the files it lists, nothing else).
    let id = ev.data["bundle"].as_str().unwrap().to_string();
    let copy = d.join("bundle-copy");
    std::fs::create_dir_all(&copy).unwrap();
    let mut listed = vec!["manifest.json".to_string()];
    listed.extend(names.iter().map(|n| n.to_string()));
    for name in &listed {
        let mut data = Vec::new();
        loop {
            let c = f.engine.read_evidence("n1", &id, name, data.len() as u64).await.unwrap();
            data.extend(hex::decode(&c.data_hex).unwrap());
            if c.eof {
                break;
            }
        }
        std::fs::write(copy.join(name), &data).unwrap();
    }
    use nightshift_engine::api::EvidenceReadError;
    for (bundle, file) in [(id.as_str(), "../../engine.yaml"), ("..", "manifest.json")] {
        let e = f.engine.read_evidence("n1", bundle, file, 0).await.unwrap_err();
        assert!(matches!(e, EvidenceReadError::BadName(_)), "{bundle}/{file}: {e:?}");
    }
    let e = f.engine.read_evidence("n1", &id, "last-health-check.json", 0).await.unwrap_err();
    assert!(
        matches!(&e, EvidenceReadError::NotFound(m) if m.contains("expected one of manifest.json, nvidia-bug-report.log.gz")),
        "{e:?}"
    );
    // The chain as it is now, for the CLI's checks below.
    f.snapshot_engine(&d.join("chain")).unwrap();
    // The node page's download, over HTTP: the same bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let web = tokio::spawn(nightshift_web::serve(f.engine.clone(), listener, std::future::pending()));
    let url = |file: &str| format!("http://{addr}/api/v1/nodes/n1/evidence/{id}/{file}");
    let got = reqwest::get(url("nvidia-bug-report.log.gz")).await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), std::fs::read(copy.join("nvidia-bug-report.log.gz")).unwrap());
    assert_eq!(reqwest::get(url("nope.txt")).await.unwrap().status(), 404);
    // The node page lists the bundle with a link to each of its files.
    let page = reqwest::get(format!("http://{addr}/nodes/n1")).await.unwrap().text().await.unwrap();
    assert!(page.contains("RMA evidence"), "{page}");
    for name in &listed {
        assert!(page.contains(&format!("href=\"/api/v1/nodes/n1/evidence/{id}/{name}\"")), "{name}: {page}");
    }
    // And the CLI's copy through that engine: the newest bundle into
    // DIR/ID, checked against the record.
    let server = format!("http://{addr}");
    let dd = d.to_path_buf();
    let o = tokio::task::spawn_blocking(move || {
        Command::new(workspace_bin_dir().join("nightshift"))
            .current_dir(&dd)
            .args(["--server", &server, "agents", "evidence", "n1", "--fetch", "fetched"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains(&format!("ok: bundle {id} copied to fetched/{id}: it matches the sha256 record {}", ev.seq)),
        "{text}"
    );
    for name in &listed {
        assert_eq!(
            std::fs::read(d.join("fetched").join(&id).join(name)).unwrap(),
            std::fs::read(copy.join(name)).unwrap()
        );
    }
    web.abort();
    drop(f);
    let cfg = config(d, "engine.yaml", "chain");
    let o = nightshift(d, &cfg, &["audit", "verify", "--evidence", "bundle-copy"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("matches the sha256 record {} holds", ev.seq)), "{text}");
    let o = nightshift(d, &cfg, &["agents", "evidence", "n1"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains(ev.data["bundle"].as_str().unwrap()) && text.contains("did not finish within 2 s"), "{text}");
    std::fs::write(copy.join("nvidia-bug-report.out"), "edited\n").unwrap();
    let o = nightshift(d, &cfg, &["audit", "verify", "--evidence", "bundle-copy"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("broken: evidence:") && text.contains("nvidia-bug-report.out: expected"), "{text}");
}
