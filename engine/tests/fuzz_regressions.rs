//! Inputs the fuzzers (`fuzz/`) once crashed on, kept as regression tests:
//! each file under `fixtures/fuzz-regressions/<target>/` goes through the
//! same checks as its fuzz target, on stable Rust, in every test run.

use std::path::Path;

use nightshift_agent::proto::{Reply, Request};
use nightshift_engine::alerts::{WebhookPayload, parse_rfc3339_ms};
use nightshift_engine::manifest::Manifest;
use nightshift_engine::scenario::Scenario;
use nightshift_engine::triggers::Compiled;

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz-regressions").join(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn alertmanager_regressions() {
    let all = inputs("alertmanager");
    assert!(!all.is_empty());
    for (name, data) in all {
        if let Ok(p) = WebhookPayload::parse(&data) {
            for a in &p.alerts {
                let _ = (a.name(), a.host(), a.gpu(), a.starts_at_ms(), a.key());
            }
        }
        let _ = parse_rfc3339_ms(&String::from_utf8_lossy(&data));
        eprintln!("ok: {name}");
    }
    // The input that crashed: an offset with a multi-byte character.
    assert_eq!(parse_rfc3339_ms("2026-11-30T03:00:00+0\u{3fe}00"), None);
    assert_eq!(parse_rfc3339_ms("2026-11-30T03:00:00+01:00"), parse_rfc3339_ms("2026-11-30T02:00:00Z"));
}

#[test]
fn manifest_regressions() {
    for (_, data) in inputs("manifest") {
        let Ok(text) = std::str::from_utf8(&data) else { continue };
        if let Ok(m) = Manifest::parse(text, Path::new("fuzz.yaml")) {
            let _ = Compiled::from_manifest(&m);
        }
    }
}

#[test]
fn scenario_regressions() {
    for (_, data) in inputs("scenario") {
        let Ok(text) = std::str::from_utf8(&data) else { continue };
        let _ = Scenario::parse(text, Path::new("fuzz.yaml"));
    }
}

#[test]
fn agent_request_regressions() {
    for (_, data) in inputs("agent_request") {
        match Request::parse(&data) {
            Ok(req) => assert_eq!(Request::parse(req.to_json().as_bytes()).unwrap().digest(), req.digest()),
            Err(e) => assert!(
                Reply::parse(Reply::err(Request::salvage_id(&data), e.code(), e.to_string()).to_json().as_bytes())
                    .is_ok()
            ),
        }
    }
}
