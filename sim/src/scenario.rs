//! Scenario tests as data: a fleet, a timeline of faults and load, and what
//! must (and must never) happen — run on a [`SimFleet`] in virtual time.
//!
//! ```yaml
//! version: 1
//! name: h1-clogged-heatsink
//! handbook: H1
//! description: A clogged heatsink on an RTX 6000 is fixed by a steeper fan curve.
//! runbooks: [gpu-overheat]
//! fleet:
//!   - {name: n1, profile: rtx6000-ada, gpus: 2}
//! duration_secs: 1800
//! timeline:
//!   - {at_secs: 60, node: n1, fault: {kind: heatsink_degradation, gpu: 0, factor: 1.5}}
//! expect:
//!   actions:                      # in this order (other actions may come between)
//!     - {op: set_fan_curve, node: n1, gpu: 0}
//!   never:
//!     - {op: drain}
//!   runs:
//!     - {runbook: gpu-overheat, outcome: succeeded}
//!   checks:
//!     - {at_secs: 900, node: n1, gpu: 0, metric: gpu.temperature_c, below: 85}
//!   final:
//!     - {node: n1, drained: false}
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nightshift_proto::clock::Clock;
use nightshift_proto::owner::owned_by_nightshift;
use nightshift_proto::{ConfigApplyArgs, NoArgs, Op, Request, SimFault, Telemetry};

use crate::fleet::{Consumer, SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use crate::workload::Workload;
use nightshift_engine::audit::{AuditRecord, RecordKind, RunFilter};
use nightshift_engine::embed::LoadError;
use nightshift_engine::embed::{RunbookSet, load_dir};
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_engine::embed::{metric_id, metric_names};
use nightshift_engine::runs::RunOutcome;

/// A scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub version: u32,
    pub name: String,
    #[serde(default)]
    pub handbook: Option<String>,
    pub description: String,
    /// Runbooks to load (by name); all in the folder when absent.
    #[serde(default)]
    pub runbooks: Option<Vec<String>>,
    /// Runbooks (of those loaded) run in shadow mode here: every action a
    /// dry run, what they would do recorded and said.
    #[serde(default)]
    pub shadow: Vec<String>,
    pub fleet: Vec<SimNodeSpec>,
    #[serde(default = "d_tick")]
    pub tick_secs: u64,
    pub duration_secs: u64,
    #[serde(default)]
    pub timeline: Vec<Event>,
    /// Parameter overrides per runbook (`{gpu-overheat: {hold_secs: 60}}`):
    /// the runbook runs with these as its defaults.
    #[serde(default)]
    pub params: std::collections::BTreeMap<String, std::collections::BTreeMap<String, serde_yaml::Value>>,
    #[serde(default)]
    pub expect: Expect,
    /// Why this scenario still passes when its runbooks' scripts do nothing
    /// (a trigger test, or a negative one: "nothing happens" is the point).
    /// The no-op check (`sim/tests/it/handbook.rs`) runs every scenario with
    /// empty scripts: one that passes so must say why here, or it proves
    /// nothing about its runbook.
    #[serde(default)]
    pub passes_with_a_no_op: Option<String>,
}

fn d_tick() -> u64 {
    1
}

/// Something that happens at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub at_secs: u64,
    #[serde(default)]
    pub node: Option<String>,
    /// A fault or workload change on `node`.
    #[serde(default)]
    pub fault: Option<SimFault>,
    /// A person (not nightshift) edits a managed config file on `node` by
    /// hand.
    #[serde(default)]
    pub config_apply: Option<ConfigApplyArgs>,
    /// The pool's total work, in GPU-percent, spread over its undrained nodes.
    #[serde(default)]
    pub pool_load: Option<PoolLoad>,
    /// Apply to every node whose label matches (e.g. a fleet-wide XID flood).
    #[serde(default)]
    pub all_nodes: bool,
    /// An Alertmanager alert about `node`, delivered to the webhook intake
    /// (as Alertmanager would, with a stable fingerprint).
    #[serde(default)]
    pub alert: Option<AlertEvent>,
    /// A process restarts: `engine` (it dies and starts again on what its
    /// data folder held) or `agent` (on `node`, or every node with
    /// `all_nodes`; the hardware keeps what was applied).
    #[serde(default)]
    pub restart: Option<Restart>,
    /// The node's maintenance marker appears (`true`) or goes (`false`).
    #[serde(default)]
    pub hands_off: Option<bool>,
    /// A person does something on `node`, outside nightshift.
    #[serde(default)]
    pub person: Option<PersonAction>,
    /// A person writes the site's XID policy overrides (this text: the
    /// file engine.yaml's `fault_policy_path` names, docs/XID.md) and runs
    /// `nightshift reload`.
    #[serde(default)]
    pub xid_overrides: Option<String>,
}

/// What a person does in a scenario: `person: {action: drain, reason: …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum PersonAction {
    /// Drains the node in the scheduler with their own reason.
    Drain { reason: String },
    /// Resumes the node in the scheduler by hand.
    Resume {},
    /// Sets a GPU's power limit by hand (`nvidia-smi -pl`).
    PowerLimit { gpu: u32, watts: f64 },
    /// Tells nightshift the node (or one GPU) was repaired
    /// (`nightshift nodes repaired`).
    Repaired {
        #[serde(default)]
        gpu: Option<u32>,
    },
    /// Releases nightshift's holds on the node as a person (`nightshift
    /// holds release`), sticky ones included.
    Release {},
}

/// Which process a timeline event restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    Engine,
    Agent,
}

/// An alert in a scenario's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertEvent {
    pub alertname: String,
    /// `firing` (default) or `resolved`.
    #[serde(default = "d_firing")]
    pub status: String,
    /// More labels (`gpu`, `severity`, …); `instance` is the node.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The alert started this long before it is delivered (a replayed or
    /// stale alert has a large one).
    #[serde(default)]
    pub started_secs_ago: u64,
    /// Default: derived from the alertname and node, so a repeat is the
    /// same alert.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

fn d_firing() -> String {
    "firing".into()
}

pub use crate::workload::PoolLoad;

/// What must be true.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Actions that must happen, in this order.
    #[serde(default)]
    pub actions: Vec<ActionMatch>,
    /// Actions that must never happen.
    #[serde(default)]
    pub never: Vec<ActionMatch>,
    #[serde(default)]
    pub runs: Vec<RunMatch>,
    #[serde(default)]
    pub checks: Vec<Check>,
    #[serde(default, rename = "final")]
    pub final_state: Vec<Check>,
    /// Escalations: at least / at most.
    #[serde(default)]
    pub escalations: Option<Range>,
    #[serde(default)]
    pub notifications: Option<Range>,
    /// Record kinds that must appear (e.g. `breaker_tripped`).
    #[serde(default)]
    pub records: Vec<RecordKind>,
    /// Text each of which some notification or escalation must contain.
    #[serde(default)]
    pub texts: Vec<String>,
    /// Text no notification or escalation may contain (`nvidia-smi` on an
    /// AMD fleet).
    #[serde(default)]
    pub never_texts: Vec<String>,
    /// Text each of which some note of a run must contain: what a runbook
    /// decided when it decided to do nothing (a scenario that asserts only
    /// silence passes with a no-op script too).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Record kinds that must not appear (e.g. `approval_requested`).
    #[serde(default)]
    pub never_records: Vec<RecordKind>,
    /// Repair lifecycles that must have happened, each phase within its
    /// bound (seconds from the fault): `{node, gpu, kind, within_secs:
    /// {quarantined: 60, requeued: 120, verified: 900}}`.
    #[serde(default)]
    pub lifecycles: Vec<LifecycleMatch>,
}

/// A repair lifecycle a scenario expects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleMatch {
    pub node: String,
    pub gpu: u32,
    /// `dbe`, `xid`, `gpu_lost`, …
    #[serde(default)]
    pub kind: Option<String>,
    /// Phase (`quarantined`, `requeued`, `repaired`, `verified`) → the most
    /// seconds after the fault it may come.
    #[serde(default)]
    pub within_secs: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    #[serde(default)]
    pub min: Option<usize>,
    #[serde(default)]
    pub max: Option<usize>,
}

/// Matches an applied (not dry-run, not refused) action.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionMatch {
    pub op: String,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub runbook: Option<String>,
    /// Also count attempts the agent or engine refused.
    #[serde(default)]
    pub attempted: bool,
    /// (`actions`) It must have happened by this time.
    #[serde(default)]
    pub by_secs: Option<u64>,
    /// (`actions`) Exactly this many matching actions, not just one.
    #[serde(default)]
    pub count: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunMatch {
    pub runbook: String,
    #[serde(default)]
    pub outcome: Option<RunOutcome>,
    /// How many runs of it (default: at least one).
    #[serde(default)]
    pub count: Option<usize>,
}

/// A condition on the fleet at a time (`checks`) or at the end (`final`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    #[serde(default)]
    pub at_secs: Option<u64>,
    pub node: String,
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub metric: Option<String>,
    #[serde(default)]
    pub below: Option<f64>,
    #[serde(default)]
    pub above: Option<f64>,
    #[serde(default)]
    pub drained: Option<bool>,
    /// The GPU's own drain state (NVML's; `gpu` required): the scheduler
    /// places nothing on it, whatever the node's drain.
    #[serde(default)]
    pub gpu_drained: Option<bool>,
    /// `nightshift` or `person`.
    #[serde(default)]
    pub drained_by: Option<String>,
    #[serde(default)]
    pub power_limit_watts: Option<f64>,
    /// An engine annotation present (true) or absent (false).
    #[serde(default)]
    pub annotation: Option<(String, bool)>,
    /// The managed config's current version.
    #[serde(default)]
    pub config_version: Option<(String, u32)>,
    /// How many holds are in effect on the node (on `gpu` when given):
    /// `holds: 0` says everything went back to its baseline.
    #[serde(default)]
    pub holds: Option<usize>,
    /// The GPU's health state (`healthy`, `faulted`, `quarantined`,
    /// `awaiting_repair`, `verifying`, `rma`); needs `gpu`.
    #[serde(default)]
    pub health: Option<String>,
    /// A scheduler mark (`no_pack`, `quarantine`) present or absent.
    #[serde(default)]
    pub marked: Option<(String, bool)>,
    /// The node powered on (`true`) or off (Slurm power saving).
    #[serde(default)]
    pub powered: Option<bool>,
}

/// One action line of a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionLine {
    pub t_secs: f64,
    pub runbook: String,
    pub op: String,
    pub node: String,
    pub gpu: Option<u32>,
    pub outcome: String,
}

/// What a scenario run found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub name: String,
    pub handbook: Option<String>,
    pub file: PathBuf,
    pub passed: bool,
    pub failures: Vec<String>,
    pub virtual_secs: u64,
    pub wall_ms: u128,
    pub actions: Vec<ActionLine>,
    pub runs: Vec<(String, String, String)>,
    /// For each runbook the scenario names: how often its trigger looked and
    /// fired — a negative scenario shows "evaluated, did not fire".
    pub evaluations: Vec<RunbookEvaluation>,
    /// Every notification and escalation, in order: `(t_secs, kind, text)`.
    #[serde(default)]
    pub said: Vec<(f64, String, String)>,
    /// With a trace interval: the fleet's state every so often (drains,
    /// holds, each GPU's temperature, power and limit), for debugging a
    /// scenario.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<String>,
}

/// How often a runbook's trigger was evaluated and fired in a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunbookEvaluation {
    pub runbook: String,
    pub evaluations: u64,
    pub fires: u64,
}

/// An Alertmanager v4 payload for a timeline alert about `node`.
fn alert_payload(a: &AlertEvent, node: &str, now_ms: i64) -> Value {
    let mut labels = a.labels.clone();
    labels.insert("alertname".into(), a.alertname.clone());
    labels.entry("instance".into()).or_insert_with(|| format!("{node}:9400"));
    let fingerprint = a.fingerprint.clone().unwrap_or_else(|| format!("{}-{node}", a.alertname));
    let starts = nightshift_engine::embed::format_rfc3339_ms(now_ms - (a.started_secs_ago as i64) * 1000);
    serde_json::json!({
        "version": "4", "status": a.status, "receiver": "nightshift", "groupKey": format!("{{}}:{{alertname=\"{}\"}}", a.alertname),
        "truncatedAlerts": 0, "groupLabels": {"alertname": a.alertname}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": a.status, "labels": labels, "annotations": {"summary": format!("{} on {node}", a.alertname)},
            "startsAt": starts,
            "endsAt": if a.status == "resolved" { nightshift_engine::embed::format_rfc3339_ms(now_ms) } else { "0001-01-01T00:00:00Z".to_string() },
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint,
        }],
    })
}

/// A scenario that could not even start.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("{0}")]
    Setup(String),
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.into(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Scenario, LoadError> {
        let s: Scenario = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            LoadError { file: path.into(), line, column, message }
        })?;
        let err = |needle: &str, message: String| {
            let (line, column) = nightshift_engine::embed::locate(text, needle);
            LoadError { file: path.into(), line, column, message }
        };
        if s.version != 1 {
            return Err(err("version", format!("unsupported scenario version: expected 1, found {}", s.version)));
        }
        if s.fleet.is_empty() {
            return Err(err("fleet", "fleet: expected at least one node".into()));
        }
        if s.tick_secs == 0 || s.duration_secs == 0 || s.duration_secs > 7 * 86_400 {
            return Err(err("duration_secs", "expected tick_secs ≥ 1 and duration_secs 1 to 604800".into()));
        }
        let names: Vec<&str> = s.fleet.iter().map(|n| n.name.as_str()).collect();
        for (i, e) in s.timeline.iter().enumerate() {
            // The event's own `at_secs` key, by the parser.
            let here = format!("timeline.{i}.at_secs");
            let what = [
                e.fault.is_some(),
                e.config_apply.is_some(),
                e.pool_load.is_some(),
                e.alert.is_some(),
                e.restart.is_some(),
                e.hands_off.is_some(),
                e.person.is_some(),
                e.xid_overrides.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if what != 1 {
                return Err(err(
                    &here,
                    format!(
                        "timeline at {} s: expected exactly one of fault, config_apply, pool_load, alert, restart, hands_off, person, xid_overrides",
                        e.at_secs
                    ),
                ));
            }
            if (e.hands_off.is_some() || e.person.is_some()) && e.node.is_none() && !e.all_nodes {
                return Err(err(
                    &here,
                    format!("timeline at {} s: hands_off and person name a node (or all_nodes: true)", e.at_secs),
                ));
            }
            if let Some(PersonAction::PowerLimit { watts, .. }) = &e.person
                && !(watts.is_finite() && *watts > 0.0 && *watts <= 100_000.0)
            {
                return Err(err(
                    "power_limit",
                    format!(
                        "timeline at {} s: person power_limit: expected watts from 1 to 100000, found {watts}",
                        e.at_secs
                    ),
                ));
            }
            if e.at_secs >= s.duration_secs {
                return Err(err(
                    &here,
                    format!(
                        "timeline at {} s: the scenario ends at duration_secs {}, so this never happens",
                        e.at_secs, s.duration_secs
                    ),
                ));
            }
            if let Some(a) = &e.alert {
                if e.node.is_none() {
                    return Err(err(&a.alertname, format!("timeline at {} s: an alert names its node", e.at_secs)));
                }
                if a.status != "firing" && a.status != "resolved" {
                    return Err(err(
                        &a.status,
                        format!("alert status: expected firing or resolved, found {:?}", a.status),
                    ));
                }
            }
            if let Some(n) = &e.node
                && !names.contains(&n.as_str())
            {
                return Err(err(
                    n,
                    format!("timeline at {} s: node `{n}` is not in the fleet: expected one of {names:?}", e.at_secs),
                ));
            }
            if let Some(f) = &e.fault {
                let gpus: Vec<u32> = s
                    .fleet
                    .iter()
                    .filter(|n| e.all_nodes || e.node.as_deref() == Some(n.name.as_str()))
                    .map(|n| n.gpus)
                    .collect();
                if let Some(g) = gpus.iter().min()
                    && let Err(m) = f.validate(*g)
                {
                    return Err(err(&here, format!("timeline at {} s: fault: {m}", e.at_secs)));
                }
            }
            if e.restart == Some(Restart::Engine) && (e.node.is_some() || e.all_nodes) {
                return Err(err(
                    &here,
                    format!("timeline at {} s: `restart: engine` takes no node (there is one engine)", e.at_secs),
                ));
            }
            if (e.fault.is_some() || e.config_apply.is_some() || e.restart == Some(Restart::Agent))
                && e.node.is_none()
                && !e.all_nodes
            {
                return Err(err(&here, format!("timeline at {} s: name a node (or all_nodes: true)", e.at_secs)));
            }
        }
        for c in s.expect.checks.iter().chain(&s.expect.final_state) {
            if let Some(m) = &c.metric
                && metric_id(m).is_none()
            {
                return Err(err(m, format!("unknown metric `{m}`: expected one of {}", metric_names())));
            }
            if !names.contains(&c.node.as_str()) {
                return Err(err(
                    &c.node,
                    format!("check: node `{}` is not in the fleet: expected one of {names:?}", c.node),
                ));
            }
            let conditions = [
                c.metric.is_some(),
                c.drained.is_some(),
                c.gpu_drained.is_some(),
                c.drained_by.is_some(),
                c.power_limit_watts.is_some(),
                c.annotation.is_some(),
                c.config_version.is_some(),
                c.holds.is_some(),
                c.health.is_some(),
                c.marked.is_some(),
                c.powered.is_some(),
            ];
            if c.gpu_drained.is_some() && c.gpu.is_none() {
                return Err(err(&c.node, format!("check on {}: gpu_drained needs gpu: N, found none", c.node)));
            }
            if !conditions.iter().any(|b| *b) {
                return Err(err(&c.node, format!("check on {}: expected a condition to check, found none", c.node)));
            }
            if c.metric.is_some() && c.below.is_none() && c.above.is_none() {
                return Err(err(&c.node, format!("check on {}: a metric needs `below` or `above`", c.node)));
            }
            if let Some(h) = &c.health {
                if nightshift_engine::embed::HealthState::ALL.iter().all(|x| x.as_str() != h) {
                    return Err(err(
                        h,
                        format!(
                            "check on {}: unknown health state `{h}`: expected one of {}",
                            c.node,
                            nightshift_engine::embed::HealthState::ALL.map(|x| x.as_str()).join(", ")
                        ),
                    ));
                }
                if c.gpu.is_none() {
                    return Err(err(h, format!("check on {}: a health check names its gpu", c.node)));
                }
            }
            if let Some((m, _)) = &c.marked
                && m != "no_pack"
                && m != "quarantine"
            {
                return Err(err(m, format!("check on {}: unknown mark `{m}`: expected no_pack or quarantine", c.node)));
            }
        }
        for (i, c) in s.expect.checks.iter().enumerate() {
            match c.at_secs {
                None => {
                    return Err(err(&c.node, "checks: expected at_secs (use `final` for the end state)".into()));
                }
                Some(t) if t > s.duration_secs => {
                    return Err(err(
                        &format!("expect.checks.{i}.at_secs"),
                        format!("checks: at_secs {t} is after duration_secs {}: it would never run", s.duration_secs),
                    ));
                }
                _ => {}
            }
        }
        let actions = s.expect.actions.iter().enumerate().map(|(i, m)| ("actions", i, m));
        let never = s.expect.never.iter().enumerate().map(|(i, m)| ("never", i, m));
        for (list, i, m) in actions.chain(never) {
            if !nightshift_proto::OP_NAMES.contains(&m.op.as_str()) || !nightshift_proto::Op::is_mutating_name(&m.op) {
                return Err(err(
                    &m.op,
                    format!(
                        "unknown action `{}`: expected one of the mutating ops {}",
                        m.op,
                        nightshift_proto::OP_NAMES
                            .iter()
                            .filter(|o| nightshift_proto::Op::is_mutating_name(o))
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            if let Some(n) = &m.node
                && !names.contains(&n.as_str())
            {
                return Err(err(
                    n,
                    format!("action {}: node `{n}` is not in the fleet: expected one of {names:?}", m.op),
                ));
            }
            if let Some(t) = m.by_secs
                && t > s.duration_secs
            {
                return Err(err(
                    &format!("expect.{list}.{i}.by_secs"),
                    format!("action {}: by_secs {t} is after duration_secs {}", m.op, s.duration_secs),
                ));
            }
        }
        for l in &s.expect.lifecycles {
            if !names.contains(&l.node.as_str()) {
                return Err(err(
                    &l.node,
                    format!("lifecycle: node `{}` is not in the fleet: expected one of {names:?}", l.node),
                ));
            }
            if let Some(k) = &l.kind
                && nightshift_engine::embed::FaultKind::parse(k).is_none()
            {
                return Err(err(
                    k,
                    format!(
                        "lifecycle: unknown fault kind `{k}`: expected one of {}",
                        nightshift_engine::embed::FaultKind::ALL.map(|k| k.as_str()).join(", ")
                    ),
                ));
            }
            for phase in l.within_secs.keys() {
                if !["quarantined", "requeued", "repaired", "verified"].contains(&phase.as_str()) {
                    return Err(err(
                        phase,
                        format!(
                            "lifecycle: unknown phase `{phase}`: expected quarantined, requeued, repaired or verified"
                        ),
                    ));
                }
            }
        }
        if let Some(list) = &s.runbooks {
            let named = s
                .expect
                .runs
                .iter()
                .map(|r| &r.runbook)
                .chain(s.expect.actions.iter().chain(&s.expect.never).filter_map(|a| a.runbook.as_ref()));
            for rb in named {
                if !list.contains(rb) {
                    return Err(err(
                        rb,
                        format!(
                            "expectation names runbook `{rb}`, which the scenario does not load: expected one of {list:?}"
                        ),
                    ));
                }
            }
        }
        Ok(s)
    }
}

fn op_matches(m: &ActionMatch, r: &AuditRecord) -> bool {
    r.data["op"].as_str() == Some(m.op.as_str())
        && m.node.as_ref().is_none_or(|n| r.node.as_deref() == Some(n))
        && m.gpu.is_none_or(|g| r.gpu == Some(g))
        && m.runbook.as_ref().is_none_or(|b| r.runbook.as_deref() == Some(b))
        && (m.attempted || r.data["applied"] == true)
}

async fn telemetry(sim: &SimFleet, node: &str) -> Option<Telemetry> {
    let r = sim.agents.get(node)?.handle(Request::new("scenario-probe", Op::Telemetry(NoArgs {}))).await;
    serde_json::from_value(r.result?).ok()
}

async fn check(sim: &SimFleet, c: &Check) -> Vec<String> {
    let mut out = Vec::new();
    let when = c.at_secs.map_or("at the end".to_string(), |t| format!("at {t} s"));
    if let Some(want) = c.powered {
        let got = sim.powered(&c.node);
        if got != want {
            out.push(format!("{when}: {} powered {}, expected {}", c.node, on_off(got), on_off(want)));
        }
        // A powered-down node has no agent to ask the rest.
        if !got {
            return out;
        }
    }
    let Some(t) = telemetry(sim, &c.node).await else {
        return vec![format!("{when}: node {} is not in the fleet", c.node)];
    };
    if let Some(m) = &c.metric {
        let id = metric_id(m).unwrap_or(0);
        let v = sim.engine.latest(&c.node, c.gpu, id);
        match v {
            None => out.push(format!("{when}: no reading of {m} on {}", c.node)),
            Some(v) => {
                if c.below.is_some_and(|b| v >= b) {
                    out.push(format!(
                        "{when}: {m} on {}{} is {v:.1}, expected below {}",
                        c.node,
                        c.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default(),
                        c.below.unwrap_or(0.0)
                    ));
                }
                if c.above.is_some_and(|a| v <= a) {
                    out.push(format!("{when}: {m} on {} is {v:.1}, expected above {}", c.node, c.above.unwrap_or(0.0)));
                }
            }
        }
    }
    if let Some(d) = c.drained
        && t.node_metrics.drained != d
    {
        out.push(format!(
            "{when}: {} drained is {}, expected {d} (reason {:?})",
            c.node, t.node_metrics.drained, t.node_metrics.drain_reason
        ));
    }
    if let Some(d) = c.gpu_drained {
        let g = c.gpu.unwrap_or(0) as usize;
        let got = t.gpus.get(g).map(|x| x.gpu_drained);
        if got != Some(d) {
            out.push(format!("{when}: {}/gpu{g} GPU drain is {got:?}, expected {d}", c.node));
        }
    }
    if let Some(by) = &c.drained_by {
        let ours = owned_by_nightshift(t.node_metrics.drain_reason.as_deref());
        let ok = t.node_metrics.drained && ((by == "nightshift") == ours);
        if !ok {
            out.push(format!(
                "{when}: {} expected drained by {by}, found drained={} reason {:?}",
                c.node, t.node_metrics.drained, t.node_metrics.drain_reason
            ));
        }
    }
    if let Some(w) = c.power_limit_watts {
        let g = c.gpu.unwrap_or(0) as usize;
        let got = t.gpus.get(g).map(|x| x.power_limit_watts);
        if got != Some(w) {
            out.push(format!("{when}: {}/gpu{g} power limit is {got:?} W, expected {w} W", c.node));
        }
    }
    if let Some(n) = c.holds {
        let held: Vec<String> = t
            .node_metrics
            .holds
            .iter()
            .filter(|h| c.gpu.is_none_or(|g| h.setting.gpu() == Some(g)))
            .map(|h| format!("{} {} by {}", h.setting, h.value, h.owner))
            .collect();
        if held.len() != n {
            out.push(format!(
                "{when}: {}{} has {} hold(s) in effect, expected {n}: {held:?}",
                c.node,
                c.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default(),
                held.len()
            ));
        }
    }
    if let (Some(want), Some(g)) = (&c.health, c.gpu) {
        let got = sim.engine.health_model().state(&c.node, g);
        if got.as_str() != want {
            let why = sim.engine.health_model().get(&c.node, g).map(|h| h.why.clone()).unwrap_or_default();
            out.push(format!("{when}: {}/gpu{g} health is {}, expected {want} ({why})", c.node, got.as_str()));
        }
    }
    if let Some((mark, present)) = &c.marked {
        let has = t.node_metrics.marks.iter().any(|m| m.mark.as_str() == mark);
        if has != *present {
            out.push(format!("{when}: {} mark `{mark}` present is {has}, expected {present}", c.node));
        }
    }
    if let Some((key, present)) = &c.annotation {
        let has = sim.engine.node(&c.node).is_some_and(|n| n.state.annotations.contains_key(key));
        if has != *present {
            out.push(format!("{when}: {} annotation `{key}` present is {has}, expected {present}", c.node));
        }
    }
    if let Some((name, version)) = &c.config_version {
        let r = sim.agents[&c.node]
            .handle(Request::new(
                "scenario-cl",
                Op::ConfigList(nightshift_proto::ConfigListArgs { name: Some(name.clone()) }),
            ))
            .await;
        let cur = r.result.as_ref().and_then(|v| v[0]["current"].as_u64());
        if cur != Some(*version as u64) {
            out.push(format!("{when}: {} config `{name}` is at version {cur:?}, expected {version}", c.node));
        }
    }
    out
}

/// A person edits a managed config file by hand (not through nightshift):
/// the file changes on disk and the simulated hardware sees it.
fn person_edits_config(sim: &SimFleet, node: &str, c: &ConfigApplyArgs) -> Result<(), String> {
    let agent = &sim.agents[node];
    let managed = agent
        .options()
        .configs
        .get(&c.name)
        .ok_or_else(|| format!("node {node} manages no config named `{}`", c.name))?;
    std::fs::write(&managed.path, &c.content).map_err(|e| format!("cannot write {}: {e}", managed.path.display()))?;
    let hw = sim.sim(node);
    nightshift_agent::backend::Backend::on_config_applied(hw, &c.name, &c.content);
    // A person who edits the file and restarts what reads it (the default;
    // `restart_consumer: false` leaves the running work on the old file).
    if c.restart_consumer {
        match managed.consumer {
            Consumer::Jobs => nightshift_agent::backend::Backend::on_jobs_restarted(hw),
            _ => nightshift_agent::backend::Backend::on_consumer_restarted(hw, &c.name),
        }
    }
    Ok(())
}

/// A person acts on `node` outside nightshift.
async fn person_acts(sim: &SimFleet, node: &str, p: &PersonAction, n: usize) -> Result<(), String> {
    let agent = &sim.agents[node];
    let fault = |f: SimFault| Request::new(format!("scenario-person-{n}-{node}"), Op::SimFault(f));
    let r = match p {
        PersonAction::Drain { reason } => agent.handle(fault(SimFault::PersonDrain { reason: reason.clone() })).await,
        PersonAction::Resume {} => agent.handle(fault(SimFault::PersonResume {})).await,
        PersonAction::PowerLimit { gpu, watts } => {
            agent.handle(fault(SimFault::PersonPowerLimit { gpu: *gpu, watts: *watts })).await
        }
        PersonAction::Repaired { gpu } => {
            return sim.engine.mark_repaired(node, *gpu, "person:oncall", "").await.map(|_| ());
        }
        PersonAction::Release {} => {
            for (i, h) in agent.held().iter().flat_map(|v| v.holds.clone()).enumerate() {
                let mut req = Request::new(
                    format!("scenario-person-{n}-{node}-{i}"),
                    Op::Release(nightshift_proto::ReleaseArgs {
                        hold: Some(h.id.clone()),
                        owner: None,
                        include_kept: true,
                    }),
                );
                req.owner = Some("person:oncall".into());
                let r = agent.handle(req).await;
                if !r.ok {
                    return Err(format!("release of {}: {:?}", h.id, r.error));
                }
            }
            return Ok(());
        }
    };
    if r.ok { Ok(()) } else { Err(format!("{:?}", r.error)) }
}

/// The agents' envelope in scenarios and fleet-month runs: the shipped
/// policy's per-model power floors (H100 350 W, MI300X 400 W).
pub fn sim_policy() -> nightshift_agent::envelope::Policy {
    nightshift_agent::envelope::Policy {
        power: nightshift_agent::envelope::PowerPolicy {
            floor_watts: None,
            ceiling_watts: None,
            models: vec![
                nightshift_agent::envelope::ModelPowerPolicy {
                    name_contains: "H100".into(),
                    floor_watts: Some(350.0),
                    ceiling_watts: None,
                },
                nightshift_agent::envelope::ModelPowerPolicy {
                    name_contains: "MI300X".into(),
                    floor_watts: Some(400.0),
                    ceiling_watts: None,
                },
            ],
        },
        ..nightshift_agent::envelope::Policy::default()
    }
}

/// Load a runbook folder with the default limits.
pub fn load_runbooks(dir: &Path) -> (RunbookSet, Arc<rhai::Engine>) {
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    (load_dir(dir, &script), script)
}

/// Run one scenario against the runbooks in `runbook_dir`.
pub async fn run(path: &Path, runbook_dir: &Path) -> Result<ScenarioReport, ScenarioError> {
    run_traced(path, runbook_dir, None).await
}

/// Run one scenario with every runbook's script replaced by one that does
/// nothing (the triggers, manifests and admission as they are): a scenario
/// that still passes tests its trigger, or that nothing happens — not what
/// its runbook does.
pub async fn run_no_op(path: &Path, runbook_dir: &Path) -> Result<ScenarioReport, ScenarioError> {
    run_with(path, runbook_dir, None, true).await
}

/// One line of the fleet's state at `t` seconds.
async fn trace_line(sim: &SimFleet, t: u64) -> String {
    let mut parts = vec![format!("{t:>6}s")];
    for (name, agent) in &sim.agents {
        let Ok(tel) = agent.telemetry().await else { continue };
        let nm = &tel.node_metrics;
        let gpus: Vec<String> = tel
            .gpus
            .iter()
            .map(|g| {
                format!(
                    "g{} {:.1}°C {:.0}/{:.0}W u{:.0}%{}",
                    g.index,
                    g.temperature_c,
                    g.power_watts,
                    g.power_limit_watts,
                    g.util_pct,
                    g.fan_pct.map(|f| format!(" fan{f:.0}%")).unwrap_or_default()
                )
            })
            .collect();
        parts.push(format!(
            "{name}[{}{} {}]",
            if nm.drained { "drained " } else { "" },
            if nm.holds.is_empty() { String::new() } else { format!("{} holds", nm.holds.len()) },
            gpus.join(", ")
        ));
    }
    parts.join(" ")
}

/// [`run`], with the fleet's state recorded every `trace_every_secs`.
pub async fn run_traced(
    path: &Path,
    runbook_dir: &Path,
    trace_every_secs: Option<u64>,
) -> Result<ScenarioReport, ScenarioError> {
    run_with(path, runbook_dir, trace_every_secs, false).await
}

async fn run_with(
    path: &Path,
    runbook_dir: &Path,
    trace_every_secs: Option<u64>,
    no_op: bool,
) -> Result<ScenarioReport, ScenarioError> {
    let scenario = Scenario::load(path)?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (mut set, script) = load_runbooks(runbook_dir);
    if let Some(e) = set.errors.first() {
        return Err(ScenarioError::Setup(format!("runbooks do not load: {e}")));
    }
    if no_op {
        let empty = script.compile("").map_err(|e| ScenarioError::Setup(e.to_string()))?;
        for r in &mut set.runbooks {
            r.ast = Arc::new(empty.clone());
            r.script_source = String::new();
        }
    }
    // Every runbook the scenario names must exist: a misspelt one would
    // make its expectations pass on nothing.
    let named: Vec<&String> = scenario
        .runbooks
        .iter()
        .flatten()
        .chain(scenario.expect.runs.iter().map(|r| &r.runbook))
        .chain(scenario.expect.actions.iter().chain(&scenario.expect.never).filter_map(|a| a.runbook.as_ref()))
        .collect();
    for n in named {
        if set.get(n).is_none() {
            let (line, column) = nightshift_engine::embed::locate(&text, n);
            return Err(ScenarioError::Load(LoadError {
                file: path.into(),
                line,
                column,
                message: format!(
                    "runbook `{n}` is not in {}: expected one of {:?}",
                    runbook_dir.display(),
                    set.names()
                ),
            }));
        }
    }
    if let Some(names) = &scenario.runbooks {
        set.runbooks.retain(|r| names.contains(&r.manifest.name));
    }
    for name in &scenario.shadow {
        let Some(r) = set.runbooks.iter_mut().find(|r| &r.manifest.name == name) else {
            let (line, column) = nightshift_engine::embed::locate(&text, "shadow");
            return Err(ScenarioError::Load(LoadError {
                file: path.into(),
                line,
                column,
                message: format!("shadow: runbook `{name}` is not loaded by this scenario"),
            }));
        };
        r.manifest.mode = nightshift_engine::embed::Mode::Shadow;
    }
    for (rb, overrides) in &scenario.params {
        let at = |needle: &str| nightshift_engine::embed::locate(&text, needle);
        let Some(r) = set.runbooks.iter_mut().find(|r| &r.manifest.name == rb) else {
            let (line, column) = at(rb);
            return Err(ScenarioError::Load(LoadError {
                file: path.into(),
                line,
                column,
                message: format!("params: runbook `{rb}` is not loaded by this scenario"),
            }));
        };
        let as_text: std::collections::BTreeMap<String, String> = overrides
            .iter()
            .map(|(k, v)| {
                (k.clone(), serde_yaml::to_string(v).unwrap_or_default().trim().trim_matches('"').to_string())
            })
            .collect();
        if let Err(m) = r.manifest.resolve_params(&as_text) {
            let key = overrides.keys().find(|k| m.contains(k.as_str())).cloned().unwrap_or_else(|| rb.clone());
            let (line, column) = at(&key);
            return Err(ScenarioError::Load(LoadError {
                file: path.into(),
                line,
                column,
                message: format!("params.{rb}: {m}"),
            }));
        }
        for (k, v) in overrides {
            if let Some(spec) = r.manifest.params.get_mut(k) {
                spec.default = v.clone();
            }
        }
    }
    let dir = scratch_dir().map_err(|e| ScenarioError::Setup(e.to_string()))?;
    let mut opts = SimFleetOptions::new(scenario.fleet.clone(), set, script);
    opts.tick_ms = scenario.tick_secs as i64 * 1000;
    opts.policy = Some(sim_policy());
    let overrides = dir.path().join("xid-overrides.yaml");
    if scenario.timeline.iter().any(|e| e.xid_overrides.is_some()) {
        std::fs::write(&overrides, "version: 1\n").map_err(|e| ScenarioError::Setup(e.to_string()))?;
        opts.fault_policy_path = Some(overrides.clone());
    }
    let started = Instant::now();
    let mut sim = SimFleet::start(opts, dir.path()).await.map_err(|e| ScenarioError::Setup(e.to_string()))?;
    let t0 = sim.clock.now_ms();
    let mut failures = Vec::new();
    let mut timeline = scenario.timeline.clone();
    timeline.sort_by_key(|e| e.at_secs);
    let mut checks: Vec<&Check> = scenario.expect.checks.iter().collect();
    checks.sort_by_key(|c| c.at_secs.unwrap_or(0));
    let mut workload =
        Workload::new(scenario.fleet.iter().map(|n| (n.name.clone(), n.util_pct.unwrap_or(85.0))).collect());
    for n in &scenario.fleet {
        if let Some(secs) = n.jobs_end_after_drain_secs {
            workload.set_jobs_end_after_drain(&n.name, secs);
        }
    }
    let mut next = 0usize;
    let mut next_check = 0usize;
    let steps = scenario.duration_secs / scenario.tick_secs;
    let mut trace = Vec::new();
    for _ in 0..steps {
        if let Some(every) = trace_every_secs.filter(|e| *e > 0) {
            let t = ((sim.clock.now_ms() - t0) / 1000) as u64;
            if t.is_multiple_of(every) {
                trace.push(trace_line(&sim, t).await);
            }
        }
        let elapsed = ((sim.clock.now_ms() - t0) / 1000) as u64;
        while next < timeline.len() && timeline[next].at_secs <= elapsed {
            let e = &timeline[next];
            next += 1;
            let targets: Vec<String> =
                if e.all_nodes { sim.agents.keys().cloned().collect() } else { e.node.clone().into_iter().collect() };
            for node in targets {
                if let Some(f) = &e.fault {
                    let r = sim.agents[&node]
                        .handle(Request::new(format!("scenario-{next}-{node}"), Op::SimFault(f.clone())))
                        .await;
                    if !r.ok {
                        failures.push(format!("timeline at {} s: fault on {node} refused: {:?}", e.at_secs, r.error));
                    }
                    if let SimFault::Load { gpu: None, util_pct } = f {
                        workload.set_node(&node, *util_pct);
                    }
                }
                if let Some(c) = &e.config_apply
                    && let Err(why) = person_edits_config(&sim, &node, c)
                {
                    failures.push(format!("timeline at {} s: config_apply on {node}: {why}", e.at_secs));
                }
            }
            if let Some(p) = &e.pool_load {
                workload.set_pool(p.clone());
            }
            let people: Vec<String> =
                if e.all_nodes { sim.agents.keys().cloned().collect() } else { e.node.clone().into_iter().collect() };
            for node in &people {
                if let Some(on) = e.hands_off {
                    let marker = sim.agents[node].options().policy.hands_off_marker_path.clone();
                    let r = if on { std::fs::write(&marker, b"maintenance\n") } else { std::fs::remove_file(&marker) };
                    if let Err(err) = r {
                        failures.push(format!("timeline at {} s: hands_off on {node}: {err}", e.at_secs));
                    }
                }
                if let Some(p) = &e.person
                    && let Err(why) = person_acts(&sim, node, p, next).await
                {
                    failures.push(format!("timeline at {} s: person on {node}: {why}", e.at_secs));
                }
            }
            match e.restart {
                Some(Restart::Engine) => {
                    if let Err(err) = sim.restart_engine().await {
                        failures.push(format!("timeline at {} s: {err}", e.at_secs));
                    }
                }
                Some(Restart::Agent) => {
                    let nodes: Vec<String> = if e.all_nodes {
                        sim.agents.keys().cloned().collect()
                    } else {
                        e.node.clone().into_iter().collect()
                    };
                    for n in nodes {
                        if let Err(err) = sim.restart_agent(&n) {
                            failures.push(format!("timeline at {} s: {err}", e.at_secs));
                        }
                    }
                }
                None => {}
            }
            if let Some(text) = &e.xid_overrides {
                let r = std::fs::write(&overrides, text).map_err(|e| e.to_string());
                let r = match r {
                    Ok(()) => {
                        nightshift_engine::embed::reload(&sim.engine, "user:scenario").await.map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e),
                };
                if let Err(err) = r {
                    failures.push(format!("timeline at {} s: xid_overrides: the reload was refused: {err}", e.at_secs));
                }
            }
            if let (Some(a), Some(node)) = (&e.alert, &e.node) {
                let payload = alert_payload(a, node, sim.clock.now_ms());
                match nightshift_engine::embed::WebhookPayload::parse(payload.to_string().as_bytes()) {
                    Ok(p) => {
                        sim.engine.ingest_alertmanager(p, "scenario");
                    }
                    Err(err) => failures.push(format!("timeline at {} s: alert does not parse: {err}", e.at_secs)),
                }
            }
        }
        workload.apply(&sim.engine, &sim.agents).await;
        if let Err(e) = sim.step().await {
            failures.push(e.to_string());
            break;
        }
        let elapsed = ((sim.clock.now_ms() - t0) / 1000) as u64;
        while next_check < checks.len() && checks[next_check].at_secs.unwrap_or(0) <= elapsed {
            failures.extend(check(&sim, checks[next_check]).await);
            next_check += 1;
        }
    }
    // Let what is still running finish its current step.
    let _ = sim.settle().await;
    for c in &scenario.expect.final_state {
        failures.extend(check(&sim, c).await);
    }
    let records = sim.engine.audit().tail(0, usize::MAX).map_err(|e| ScenarioError::Setup(e.to_string()))?;
    let results: Vec<&AuditRecord> = records.iter().filter(|r| r.kind == RecordKind::ActionResult).collect();
    // Ordered actions.
    let mut pos = 0usize;
    let what = |m: &ActionMatch| {
        format!(
            "{}{}{}",
            m.op,
            m.node.as_ref().map(|n| format!(" on {n}")).unwrap_or_default(),
            m.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default()
        )
    };
    for m in &scenario.expect.actions {
        match results[pos..].iter().position(|r| op_matches(m, r)) {
            Some(i) => {
                let at = (results[pos + i].ts_ms - t0) / 1000;
                if let Some(by) = m.by_secs
                    && at > by as i64
                {
                    failures.push(format!("expected action {} by {by} s, it happened at {at} s", what(m)));
                }
                pos += i + 1;
            }
            None => failures.push(format!(
                "expected action {} did not happen{}",
                what(m),
                if pos > 0 { " after the previous expected one" } else { "" }
            )),
        }
        if let Some(n) = m.count {
            let found = results.iter().filter(|r| op_matches(m, r)).count();
            if found != n {
                failures.push(format!("expected {n} action(s) {}, found {found}", what(m)));
            }
        }
    }
    for m in &scenario.expect.never {
        let hits: Vec<&&AuditRecord> = results.iter().filter(|r| op_matches(m, r)).collect();
        if !hits.is_empty() {
            failures.push(format!(
                "action {} must never happen, but happened {} time(s), first on {} by {}",
                m.op,
                hits.len(),
                hits[0].node.as_deref().unwrap_or("?"),
                hits[0].runbook.as_deref().unwrap_or("?")
            ));
        }
    }
    let runs = sim
        .engine
        .runs(&RunFilter { limit: Some(1000), ..Default::default() })
        .map_err(|e| ScenarioError::Setup(e.to_string()))?
        .runs;
    for m in &scenario.expect.runs {
        let hits: Vec<_> =
            runs.iter().filter(|r| r.runbook == m.runbook && m.outcome.is_none_or(|o| r.outcome == Some(o))).collect();
        let ok = match m.count {
            Some(c) => hits.len() == c,
            None => !hits.is_empty(),
        };
        if !ok {
            let all: Vec<String> = runs
                .iter()
                .filter(|r| r.runbook == m.runbook)
                .map(|r| format!("{} {}", r.id, r.outcome.map_or("unfinished", |o| o.as_str())))
                .collect();
            // The newest ten say enough.
            let more = all.len().saturating_sub(10);
            let seen = format!(
                "{:?}{}",
                &all[..all.len().min(10)],
                if more > 0 { format!(" and {more} more") } else { String::new() }
            );
            failures.push(format!(
                "expected {} run(s) of {}{}, found {} ({seen})",
                m.count.map_or("at least 1".to_string(), |c| c.to_string()),
                m.runbook,
                m.outcome.map(|o| format!(" that {}", o.as_str())).unwrap_or_default(),
                hits.len()
            ));
        }
    }
    let count_kind = |k: RecordKind| records.iter().filter(|r| r.kind == k).count();
    for (range, kind, name) in [
        (&scenario.expect.escalations, RecordKind::Escalation, "escalations"),
        (&scenario.expect.notifications, RecordKind::Notification, "notifications"),
    ] {
        if let Some(r) = range {
            let n = count_kind(kind);
            if r.min.is_some_and(|m| n < m) || r.max.is_some_and(|m| n > m) {
                failures.push(format!("expected {name} in {:?}..={:?}, found {n}", r.min, r.max));
            }
        }
    }
    for t in &scenario.expect.texts {
        let said = records.iter().any(|r| {
            matches!(r.kind, RecordKind::Notification | RecordKind::Escalation)
                && r.data["text"].as_str().is_some_and(|x| x.contains(t.as_str()))
        });
        if !said {
            failures.push(format!("expected a notification or escalation saying {t:?}, found none"));
        }
    }
    for t in &scenario.expect.never_texts {
        let said = records.iter().find(|r| {
            matches!(r.kind, RecordKind::Notification | RecordKind::Escalation)
                && r.data["text"].as_str().is_some_and(|x| x.contains(t.as_str()))
        });
        if let Some(r) = said {
            failures.push(format!("expected no notification or escalation saying {t:?}, found: {}", r.data["text"]));
        }
    }
    for t in &scenario.expect.notes {
        let noted = records
            .iter()
            .any(|r| r.kind == RecordKind::Note && r.data["text"].as_str().is_some_and(|x| x.contains(t.as_str())));
        if !noted {
            failures.push(format!("expected a note saying {t:?}, found none"));
        }
    }
    // A scenario proves nothing about a runbook that never looked: each
    // runbook it names (manual ones aside) must have been evaluated.
    let stats = sim.engine.trigger_stats();
    let named: std::collections::BTreeSet<&String> =
        scenario.runbooks.iter().flatten().chain(scenario.expect.runs.iter().map(|r| &r.runbook)).collect();
    let set = sim.engine.runbook_set();
    for (name, evaluations, _) in &stats {
        let manual = set.get(name).is_some_and(|(_, r)| r.manifest.trigger.kind() == "manual");
        if named.contains(name) && *evaluations == 0 && !manual {
            failures.push(format!(
                "runbook {name} was never evaluated: the scenario shows nothing about it (its trigger saw no sample or alert)"
            ));
        }
    }
    for k in &scenario.expect.never_records {
        let n = count_kind(*k);
        if n > 0 {
            failures.push(format!("expected no {} record, found {n}", k.as_str()));
        }
    }
    for k in &scenario.expect.records {
        if count_kind(*k) == 0 {
            failures.push(format!("expected a {} record, found none", k.as_str()));
        }
    }
    let model = sim.engine.health_model();
    for l in &scenario.expect.lifecycles {
        let Some(h) = model.get(&l.node, l.gpu) else {
            failures.push(format!("expected a repair lifecycle on {}/gpu{}, found no health record", l.node, l.gpu));
            continue;
        };
        let mut cycles: Vec<(nightshift_engine::embed::FaultKind, nightshift_engine::embed::Lifecycle)> =
            h.history.iter().cloned().collect();
        if let (Some(f), Some(c)) = (&h.fault, h.lifecycle) {
            cycles.push((f.kind, c));
        }
        let found = cycles.iter().find(|(k, _)| l.kind.as_ref().is_none_or(|want| k.as_str() == want));
        let Some((kind, c)) = found else {
            failures.push(format!(
                "expected a {} lifecycle on {}/gpu{}, found {:?}",
                l.kind.as_deref().unwrap_or("repair"),
                l.node,
                l.gpu,
                cycles.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
            ));
            continue;
        };
        let phases: std::collections::BTreeMap<&str, f64> = c.phases().reached().collect();
        for (phase, max) in &l.within_secs {
            match phases.get(phase.as_str()) {
                None => failures.push(format!(
                    "{}/gpu{} {} lifecycle never reached `{phase}` (reached {:?})",
                    l.node,
                    l.gpu,
                    kind.as_str(),
                    phases
                )),
                Some(secs) if *secs > *max as f64 => failures.push(format!(
                    "{}/gpu{} {} lifecycle reached `{phase}` {secs:.0} s after the fault, expected within {max} s",
                    l.node,
                    l.gpu,
                    kind.as_str()
                )),
                _ => {}
            }
        }
    }
    match sim.engine.verify() {
        Ok(v) if v.ok => {}
        Ok(v) => {
            let detail = v
                .first_bad_seq
                .and_then(|seq| sim.engine.audit().get(seq).ok().flatten())
                .map(|r| {
                    format!(
                        " record: {} recomputed {}",
                        serde_json::to_string(&r).unwrap_or_default(),
                        r.compute_hash()
                    )
                })
                .unwrap_or_default();
            failures.push(format!("audit chain broken: {:?}{detail}", v.problem))
        }
        Err(e) => failures.push(e.to_string()),
    }
    let actions = results
        .iter()
        .map(|r| ActionLine {
            t_secs: (r.ts_ms - t0) as f64 / 1000.0,
            runbook: r.runbook.clone().unwrap_or_default(),
            op: r.data["op"].as_str().unwrap_or("").into(),
            node: r.node.clone().unwrap_or_default(),
            gpu: r.gpu,
            outcome: r.data["outcome"].as_str().map(str::to_string).unwrap_or_else(|| r.data["outcome"].to_string()),
        })
        .collect();
    let run_lines = runs
        .iter()
        .rev()
        .map(|r| {
            (r.id.clone(), r.runbook.clone(), r.outcome.map_or("unfinished".to_string(), |o| o.as_str().to_string()))
        })
        .collect();
    let said = records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Notification | RecordKind::Escalation))
        .map(|r| {
            (
                (r.ts_ms - t0) as f64 / 1000.0,
                r.kind.as_str().to_string(),
                r.data["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let virtual_secs = ((sim.clock.now_ms() - t0) / 1000) as u64;
    drop(sim);
    Ok(ScenarioReport {
        name: scenario.name,
        handbook: scenario.handbook,
        file: path.into(),
        passed: failures.is_empty(),
        failures,
        virtual_secs,
        wall_ms: started.elapsed().as_millis(),
        actions,
        runs: run_lines,
        evaluations: stats
            .into_iter()
            .filter(|(n, ..)| named.contains(n))
            .map(|(runbook, evaluations, fires)| RunbookEvaluation { runbook, evaluations, fires })
            .collect(),
        said,
        trace,
    })
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// Scenario files in a folder, sorted.
pub fn scenario_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "yaml")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A JSON value for reports.
pub fn report_json(r: &ScenarioReport) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}
