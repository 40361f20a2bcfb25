//! Helpers for the engine's tests: write runbooks into a folder, start a
//! simulated fleet in virtual time.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use nightshift_engine::audit::{AuditRecord, RecordKind};
use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec};

/// Write `name.yaml` and `name.rhai` into `dir`.
pub fn write_runbook(dir: &Path, name: &str, manifest_body: &str, script: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let manifest =
        format!("version: 1\nname: {name}\ndescription: test runbook {name}\nscript: {name}.rhai\n{manifest_body}");
    std::fs::write(dir.join(format!("{name}.yaml")), manifest).unwrap();
    std::fs::write(dir.join(format!("{name}.rhai")), script).unwrap();
}

pub fn node(name: &str, profile: &str) -> SimNodeSpec {
    SimNodeSpec::new(name, profile, 2)
}

pub struct Sim {
    pub fleet: SimFleet,
    pub _dir: tempfile::TempDir,
}

/// Start a fleet with the runbooks in `runbook_dir`.
pub async fn start(nodes: Vec<SimNodeSpec>, runbook_dir: &Path, tweak: impl FnOnce(&mut SimFleetOptions)) -> Sim {
    let dir = nightshift_sim::fleet::scratch_dir().unwrap();
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(runbook_dir, &script);
    assert!(set.errors.is_empty(), "runbooks failed to load: {:?}", set.errors);
    let mut opts = SimFleetOptions::new(nodes, set, script);
    tweak(&mut opts);
    let fleet = SimFleet::start(opts, dir.path()).await.unwrap();
    Sim { fleet, _dir: dir }
}

/// All records of all runs of `runbook`, oldest first.
pub fn records(sim: &SimFleet) -> Vec<AuditRecord> {
    sim.engine.audit().tail(0, usize::MAX).unwrap()
}

pub fn kinds(recs: &[AuditRecord], run: &str) -> Vec<RecordKind> {
    recs.iter().filter(|r| r.run.as_deref() == Some(run)).map(|r| r.kind).collect()
}

use nightshift_engine::engine::{RunRequest, Submitted};
use nightshift_engine::runs::{RunSummary, Target};

/// A manual run request.
pub fn manual(runbook: &str, target: Target, by: &str) -> RunRequest {
    RunRequest {
        runbook: runbook.into(),
        target,
        trigger: "manual".into(),
        detail: format!("manual run by {by}"),
        event: serde_json::json!({"kind": "manual"}),
        event_ts_ms: 0,
        params: Default::default(),
        dry_run: false,
        requested_by: by.into(),
    }
}

/// Step the fleet until run `id` finishes (at most `max_secs` virtual).
pub async fn until_finished(sim: &SimFleet, id: &str, max_secs: u64) -> RunSummary {
    for _ in 0..max_secs {
        if let Some(r) = sim.engine.run(id).unwrap()
            && r.outcome.is_some()
        {
            return r;
        }
        sim.step().await.unwrap();
    }
    panic!("run {id} did not finish within {max_secs} s: {:?}", sim.engine.run(id).unwrap());
}

pub fn run_id(s: &Submitted) -> String {
    s.run().unwrap_or_else(|| panic!("no run: {s:?}")).id.clone()
}

use nightshift_engine::embed::{WebhookPayload, format_rfc3339_ms};

/// An Alertmanager v4 payload with one alert.
pub fn alert_payload(
    alertname: &str,
    host: &str,
    fingerprint: &str,
    starts_at_ms: i64,
    status: &str,
) -> WebhookPayload {
    let text = serde_json::json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"x\"}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "nightshift",
        "groupLabels": {"alertname": alertname},
        "commonLabels": {"alertname": alertname},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": status,
            "labels": {"alertname": alertname, "instance": format!("{host}:9400"), "severity": "critical"},
            "annotations": {"summary": "test"},
            "startsAt": format_rfc3339_ms(starts_at_ms),
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": fingerprint
        }]
    });
    WebhookPayload::parse(text.to_string().as_bytes()).unwrap()
}

pub fn now(sim: &SimFleet) -> i64 {
    nightshift_proto::clock::Clock::now_ms(&sim.clock)
}

/// The engine as a person sees it (an admin): what the web and the CLI
/// read goes through the same door (`nightshift_engine::api::EngineApi`).
pub fn person(e: &nightshift_engine::engine::Engine) -> nightshift_engine::api::Session {
    nightshift_engine::api::Session::new(e.clone(), "test", true)
}

/// The engine answering as the person `name` (an admin; recorded as
/// `user:<name>`): approvals, rejections, cancels and mode changes go
/// through the door the web and the CLI use.
pub fn as_user(e: &nightshift_engine::engine::Engine, name: &str) -> nightshift_engine::api::Session {
    nightshift_engine::api::Session::new(e.clone(), name, true)
}
