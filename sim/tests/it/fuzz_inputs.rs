//! The fuzzers' hand-named seeds (`fuzz/seeds/<target>/`) and every input a
//! fuzzer once crashed on (`fuzz/regressions/<target>/`) go through the same
//! checks as their fuzz target, on stable Rust, in every test run. Each
//! target must have inputs: an empty folder would make its test pass on
//! nothing.

use std::path::Path;

use nightshift_engine::embed::Compiled;
use nightshift_engine::embed::Manifest;
use nightshift_engine::embed::{WebhookPayload, parse_rfc3339_ms};
use nightshift_proto::{Reply, Request};
use nightshift_sim::scenario::Scenario;

/// (file name, bytes) of every seed and regression of `target`.
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut v = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else { continue };
        for e in dir.flatten() {
            v.push((format!("{kind}/{target}/{}", e.file_name().to_string_lossy()), std::fs::read(e.path()).unwrap()));
        }
    }
    v.sort();
    assert!(v.len() >= 3, "fuzz target {target} has {} seed/regression inputs: expected at least 3", v.len());
    v
}

#[test]
fn alertmanager_inputs() {
    let mut parsed = 0;
    for (_, data) in inputs("alertmanager") {
        if let Ok(p) = WebhookPayload::parse(&data) {
            parsed += 1;
            for a in &p.alerts {
                let _ = (a.name(), a.host(), a.gpu(), a.starts_at_ms(), a.key());
            }
        }
        let _ = parse_rfc3339_ms(&String::from_utf8_lossy(&data));
    }
    assert!(parsed >= 2, "the firing and resolved seeds parse");
    // The input that crashed: an offset with a multi-byte character.
    assert_eq!(parse_rfc3339_ms("2026-11-30T03:00:00+0\u{3fe}00"), None);
    assert_eq!(parse_rfc3339_ms("2026-11-30T03:00:00+01:00"), parse_rfc3339_ms("2026-11-30T02:00:00Z"));
}

#[test]
fn manifest_inputs() {
    for (name, data) in inputs("manifest") {
        let text = std::str::from_utf8(&data).unwrap_or_default();
        match Manifest::parse(text, Path::new("fuzz.yaml")) {
            Ok(m) => {
                let _ = Compiled::from_manifest(&m);
            }
            Err(e) => {
                assert!(name.starts_with("regressions/"), "seed {name} is a shipped manifest and must load: {e}");
                assert!(e.to_string().contains("fuzz.yaml"), "{e}");
            }
        }
    }
}

#[test]
fn scenario_inputs() {
    for (name, data) in inputs("scenario") {
        let text = std::str::from_utf8(&data).unwrap_or_default();
        if let Err(e) = Scenario::parse(text, Path::new("fuzz.yaml")) {
            assert!(name.starts_with("regressions/"), "seed {name} is a shipped scenario and must load: {e}");
            assert!(e.to_string().contains("fuzz.yaml"), "{e}");
        }
    }
}

#[test]
fn agent_request_inputs() {
    let mut ok = 0;
    for (_, data) in inputs("agent_request") {
        match Request::parse(&data) {
            Ok(req) => {
                ok += 1;
                assert_eq!(Request::parse(req.to_json().as_bytes()).unwrap().digest(), req.digest())
            }
            Err(e) => assert!(
                Reply::parse(Reply::err(Request::salvage_id(&data), e.code(), e.to_string()).to_json().as_bytes())
                    .is_ok()
            ),
        }
    }
    assert!(ok >= 4, "the well-formed seeds parse");
}
