//! Runbook manifests: the YAML half of a runbook (the Rhai script is the
//! other). Parsed strictly (`deny_unknown_fields`, `version: 1`) and then
//! validated; every error carries file:line:column and says what was
//! expected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::base::metrics::{self, MetricId};

mod validate;

/// A manifest as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub name: String,
    pub description: String,
    /// Handbook row, e.g. `H1` (informative).
    #[serde(default)]
    pub handbook: Option<String>,
    pub trigger: Trigger,
    /// Prometheus alerts that start this runbook too (beside `trigger`):
    /// one folder serves a site whose paging is in Prometheus and the
    /// engine's own triggers (pool scaling, trends) alike. Whichever comes
    /// first runs; the other finds the run active or the cooldown running
    /// and is recorded as suppressed, so a row never runs twice.
    #[serde(default)]
    pub alert_triggers: Vec<AlertTrigger>,
    pub scope: Scope,
    /// Which nodes the runbook applies to.
    #[serde(default)]
    pub selector: Selector,
    #[serde(default)]
    pub params: BTreeMap<String, ParamSpec>,
    #[serde(default = "default_cooldown")]
    pub cooldown_secs: u64,
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
    #[serde(default)]
    pub blast_radius: BlastRadius,
    #[serde(default)]
    pub approval: Approval,
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    #[serde(default = "default_attempts")]
    pub max_attempts_per_day: u32,
    /// History the script needs of the metrics it names (`metric_stats`
    /// over the last hour, say), beyond `telemetry.script_window_secs`.
    #[serde(default)]
    pub history_secs: Option<u64>,
    #[serde(default = "default_event_age")]
    pub max_event_age_secs: u64,
    /// Storm protection: too many targets firing at once trips the breaker.
    #[serde(default)]
    pub breaker: Option<Breaker>,
    /// `act` (holds and node actions) or `observe` (readings, notes,
    /// notifications, watches: takes no lock, may not change anything).
    #[serde(default)]
    pub class: RunClass,
    /// `critical` runs never wait behind lower ones.
    #[serde(default)]
    pub priority: Priority,
    /// Acting runs of exclusive runbooks do not overlap on one node (for
    /// changes that reason about history, such as config rollbacks). Other
    /// acting runs overlap freely: their holds combine on the agent.
    #[serde(default)]
    pub exclusive: bool,
    /// Group runs: the most nodes one run changes (approval counts this).
    #[serde(default)]
    pub max_nodes_changed: Option<u32>,
    /// Group runs: the int parameter that says how many nodes a run
    /// changes (`nodes_per_step`), at most `max_nodes_changed`. Approval
    /// counts the run's value, and the engine holds the run to it.
    #[serde(default)]
    pub nodes_changed_param: Option<String>,
    /// The runbook may place a sticky node drain (RMA, repair) that only a
    /// person releases.
    #[serde(default)]
    pub sticky_drain: bool,
    /// `act` (its automatic runs change things) or `shadow` (they run on
    /// live telemetry with every action sent as a dry run: no hold, no
    /// change, no notification; each records what it would have done and
    /// the agent's answer). An admin promotes or demotes a runbook at run
    /// time (`nightshift runbooks promote|demote`); manual runs are always
    /// what the person asked for.
    #[serde(default)]
    pub mode: Mode,
    /// The readings the runbook decides on, and what it reads where they
    /// are absent (an MI300X without a counter, a job that exports
    /// nothing): stated, checked against the metric table, and — for the
    /// shipped workload rows — against what the script reads.
    #[serde(default)]
    pub signals: Option<Signals>,
    /// The Rhai script, relative to the manifest.
    pub script: String,
}

/// A runbook's signals: `uses` (decided on), `fallback` (read where one of
/// them is absent), `when_absent` (what it does then, in words).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signals {
    pub uses: Vec<String>,
    #[serde(default)]
    pub fallback: Vec<String>,
    #[serde(default)]
    pub when_absent: Option<String>,
}

/// Whether a runbook's automatic runs act or only say what they would do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Act,
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Act => "act",
            Mode::Shadow => "shadow",
        }
    }
}

/// What a run may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunClass {
    /// Holds and node actions.
    #[default]
    Act,
    /// Readings, notes, notifications and watches only.
    Observe,
}

/// How urgent a runbook is. Ordered: `Low < Normal < Critical`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    /// Overheat, ECC, XID: safety.
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::Critical => "critical",
        }
    }
}

fn default_cooldown() -> u64 {
    600
}
fn default_max_concurrent() -> u32 {
    4
}
fn default_timeout() -> u64 {
    900
}
fn default_attempts() -> u32 {
    6
}
fn default_event_age() -> u64 {
    300
}

/// What a run acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Gpu,
    Node,
    Group,
}

/// Node filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// `nvidia` or `amd`, from the agent's inventory.
    #[serde(default)]
    pub vendor: Option<String>,
    /// Inventory labels that must match.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Comparison of a value against a level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    Avg,
    Max,
    Min,
    Sum,
    Count,
}

/// Trigger types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Trigger {
    /// Value above (or below) a level for `for_secs`; re-arms only after it
    /// passes the clear level (hysteresis).
    Threshold {
        metric: String,
        #[serde(default)]
        above: Option<f64>,
        #[serde(default)]
        below: Option<f64>,
        #[serde(default)]
        for_secs: u64,
        #[serde(default)]
        clear_below: Option<f64>,
        #[serde(default)]
        clear_above: Option<f64>,
        /// Compare the average over `for_secs` instead of every sample:
        /// whole-degree readings with a degree of jitter around the level
        /// would otherwise break a `for_secs` run on every dip.
        #[serde(default)]
        average: bool,
    },
    /// Least-squares rise (or fall) per minute over a window.
    Rate {
        metric: String,
        #[serde(default)]
        per_min_above: Option<f64>,
        #[serde(default)]
        per_min_below: Option<f64>,
        window_secs: u64,
        #[serde(default = "default_min_samples")]
        min_samples: usize,
    },
    /// A least-squares slope over a window says the value will cross a level
    /// within the horizon (and has not yet). `linear` extrapolates the
    /// slope; `first_order` treats the value as a first-order system
    /// settling toward T∞ = T + τ·dT/dt (how a GPU heats toward its steady
    /// state under a load), so a rise that will settle below the level does
    /// not fire.
    Predict {
        metric: String,
        crosses: f64,
        horizon_secs: u64,
        window_secs: u64,
        #[serde(default = "default_min_samples")]
        min_samples: usize,
        #[serde(default)]
        model: PredictModel,
    },
    /// An aggregate over a label group (e.g. pool average power share).
    Fleet {
        metric: String,
        agg: Aggregate,
        group_by: String,
        #[serde(default)]
        above: Option<f64>,
        #[serde(default)]
        below: Option<f64>,
        /// For `count`: count series whose value is above this.
        #[serde(default)]
        where_above: Option<f64>,
        #[serde(default)]
        for_secs: u64,
        #[serde(default)]
        clear_below: Option<f64>,
        #[serde(default)]
        clear_above: Option<f64>,
    },
    /// The value changes: to one of `to_any_of`, or (counters) increases.
    /// For sticky gauges such as the XID reading: each new value is one edge.
    Change {
        metric: String,
        #[serde(default)]
        to_any_of: Vec<f64>,
        #[serde(default)]
        increase: bool,
    },
    /// A GPU fault in the health model (`health/mod.rs`): a state, evaluated
    /// on every reading and on the first reading after a start, pending
    /// while a breaker, cooldown or full queue holds it. `kinds`: `dbe`,
    /// `xid`, `gpu_lost`, `row_remap_failure`, `row_remap_pending`.
    Fault { kinds: Vec<String> },
    /// An Alertmanager alert.
    Alert {
        alertname: String,
        #[serde(default)]
        matchers: BTreeMap<String, String>,
        /// The agents' reading that must agree before the run changes
        /// anything (an alert is someone else's reading, perhaps one
        /// threshold for every vendor): `{metric, below | above}` on the
        /// alert's node or GPU, checked as the run starts and before its
        /// first change. Absent: the alert alone decides.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confirm: Option<Confirm>,
    },
    /// Every N seconds, for every target in scope.
    Schedule { every_secs: u64 },
    /// Only from the CLI or web.
    Manual {},
}

/// An alert trigger's confirmation on the agents' own reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confirm {
    pub metric: String,
    #[serde(default)]
    pub below: Option<f64>,
    #[serde(default)]
    pub above: Option<f64>,
}

impl Confirm {
    /// Whether `v` confirms the alert.
    pub fn holds(&self, v: f64) -> bool {
        self.below.is_some_and(|b| v < b) || self.above.is_some_and(|a| v > a)
    }
}

/// An Alertmanager alert that starts a runbook (`alert_triggers:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertTrigger {
    pub alertname: String,
    /// Labels the alert must carry, exactly.
    #[serde(default)]
    pub matchers: BTreeMap<String, String>,
}

impl Manifest {
    /// Where this runbook's starts come from on a real fleet (one line):
    /// its trigger's input, and the alerts of `alert_triggers`.
    pub fn input_source(&self) -> String {
        let mut s = self.trigger.input_source();
        for a in &self.alert_triggers {
            s.push_str(&format!("; or Alertmanager alert {}", a.alertname));
        }
        s
    }

    /// Every alert that starts this runbook: its `trigger` when that is an
    /// alert, then `alert_triggers`.
    pub fn alerts(&self) -> impl Iterator<Item = (&str, &BTreeMap<String, String>)> {
        let own = match &self.trigger {
            Trigger::Alert { alertname, matchers, .. } => Some((alertname.as_str(), matchers)),
            _ => None,
        };
        own.into_iter().chain(self.alert_triggers.iter().map(|a| (a.alertname.as_str(), &a.matchers)))
    }
}

fn default_min_samples() -> usize {
    5
}

/// How `predict` extrapolates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PredictModel {
    #[default]
    Linear,
    /// `time_constant_secs`: the thermal time constant C/G (about 60–120 s
    /// for a GPU and its heatsink).
    FirstOrder { time_constant_secs: u64 },
}

impl Trigger {
    /// The trigger type's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Trigger::Threshold { .. } => "threshold",
            Trigger::Rate { .. } => "rate",
            Trigger::Predict { .. } => "predict",
            Trigger::Fleet { .. } => "fleet",
            Trigger::Change { .. } => "change",
            Trigger::Fault { .. } => "fault",
            Trigger::Alert { .. } => "alert",
            Trigger::Schedule { .. } => "schedule",
            Trigger::Manual {} => "manual",
        }
    }

    /// The metric a telemetry trigger watches.
    pub fn metric(&self) -> Option<&str> {
        match self {
            Trigger::Threshold { metric, .. }
            | Trigger::Rate { metric, .. }
            | Trigger::Predict { metric, .. }
            | Trigger::Fleet { metric, .. }
            | Trigger::Change { metric, .. } => Some(metric),
            _ => None,
        }
    }

    /// How much history the trigger needs, in ms.
    pub fn window_ms(&self) -> i64 {
        let secs = match self {
            Trigger::Threshold { for_secs, .. } | Trigger::Fleet { for_secs, .. } => *for_secs,
            Trigger::Rate { window_secs, .. } | Trigger::Predict { window_secs, .. } => *window_secs,
            _ => 0,
        };
        i64::try_from(secs).unwrap_or(i64::MAX).saturating_mul(1000)
    }

    /// Where this trigger's input comes from on a real fleet (one line).
    pub fn input_source(&self) -> String {
        match self {
            Trigger::Alert { alertname, .. } => format!("Alertmanager alert {alertname}"),
            Trigger::Schedule { every_secs } => format!("every {every_secs} s"),
            Trigger::Manual {} => "a person (nightshift run, the web UI)".into(),
            other => match other.metric().and_then(metrics::metric_id) {
                Some(id) => {
                    let m = metrics::metric(id);
                    format!("{}: {}", m.name, m.from)
                }
                None => other.metric().unwrap_or("?").to_string(),
            },
        }
    }

    /// Every level the trigger compares with, by field name (each must be
    /// finite).
    fn levels(&self) -> Vec<(&'static str, f64)> {
        let mut v = Vec::new();
        let mut push = |name: &'static str, x: &Option<f64>| {
            if let Some(x) = x {
                v.push((name, *x));
            }
        };
        match self {
            Trigger::Threshold { above, below, clear_below, clear_above, .. } => {
                push("above", above);
                push("below", below);
                push("clear_below", clear_below);
                push("clear_above", clear_above);
            }
            Trigger::Fleet { above, below, clear_below, clear_above, where_above, .. } => {
                push("above", above);
                push("below", below);
                push("clear_below", clear_below);
                push("clear_above", clear_above);
                push("where_above", where_above);
            }
            Trigger::Rate { per_min_above, per_min_below, .. } => {
                push("per_min_above", per_min_above);
                push("per_min_below", per_min_below);
            }
            Trigger::Predict { crosses, .. } => push("crosses", &Some(*crosses)),
            Trigger::Change { to_any_of, .. } => {
                for x in to_any_of {
                    push("to_any_of", &Some(*x));
                }
            }
            _ => {}
        }
        v
    }

    /// Every duration and count the trigger sizes windows or waits with:
    /// (field, value, most allowed).
    fn spans(&self) -> Vec<(&'static str, u64, u64)> {
        const DAY: u64 = 86_400;
        match self {
            Trigger::Threshold { for_secs, .. } | Trigger::Fleet { for_secs, .. } => vec![("for_secs", *for_secs, DAY)],
            Trigger::Rate { window_secs, min_samples, .. } => {
                vec![("window_secs", *window_secs, DAY), ("min_samples", *min_samples as u64, 100_000)]
            }
            Trigger::Predict { window_secs, horizon_secs, min_samples, model, .. } => {
                let mut v = vec![
                    ("window_secs", *window_secs, DAY),
                    ("horizon_secs", *horizon_secs, DAY),
                    ("min_samples", *min_samples as u64, 100_000),
                ];
                if let PredictModel::FirstOrder { time_constant_secs } = model {
                    v.push(("time_constant_secs", *time_constant_secs, DAY));
                }
                v
            }
            Trigger::Schedule { every_secs } => vec![("every_secs", *every_secs, 30 * DAY)],
            _ => Vec::new(),
        }
    }
}

/// A typed parameter with a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    #[serde(rename = "type")]
    pub ty: ParamType,
    pub default: serde_yaml::Value,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    Float,
    Int,
    Bool,
    String,
}

/// A typed parameter value (in `nightshift-proto`: the audit log's run
/// summaries record it too).
pub use nightshift_proto::params::ParamValue;

impl ParamType {
    pub fn name(self) -> &'static str {
        match self {
            ParamType::Float => "float",
            ParamType::Int => "int",
            ParamType::Bool => "bool",
            ParamType::String => "string",
        }
    }

    /// Convert a YAML value to this type, or say what was found.
    pub fn read_yaml(self, v: &serde_yaml::Value) -> Result<ParamValue, String> {
        use serde_yaml::Value as Y;
        match (self, v) {
            (ParamType::Float, Y::Number(n)) => match n.as_f64() {
                Some(f) if f.is_finite() => Ok(ParamValue::Float(f)),
                _ => Err(format!("expected a finite float, found {n}")),
            },
            (ParamType::Int, Y::Number(n)) if n.is_i64() => Ok(ParamValue::Int(n.as_i64().unwrap_or(0))),
            (ParamType::Bool, Y::Bool(b)) => Ok(ParamValue::Bool(*b)),
            (ParamType::String, Y::String(s)) => Ok(ParamValue::String(s.clone())),
            (_, other) => Err(format!(
                "expected a {}, found {}",
                self.name(),
                serde_yaml::to_string(other).unwrap_or_default().trim()
            )),
        }
    }

    /// Parse a command-line `k=v` value.
    pub fn parse(self, s: &str) -> Result<ParamValue, String> {
        match self {
            ParamType::Float => match s.trim().parse::<f64>() {
                Ok(f) if f.is_finite() => Ok(ParamValue::Float(f)),
                _ => Err(format!("expected a finite float, found {s:?}")),
            },
            ParamType::Int => s.parse().map(ParamValue::Int).map_err(|_| format!("expected an int, found {s:?}")),
            ParamType::Bool => {
                s.parse().map(ParamValue::Bool).map_err(|_| format!("expected true or false, found {s:?}"))
            }
            ParamType::String => Ok(ParamValue::String(s.to_string())),
        }
    }
}

/// Limits on how much of the fleet a runbook may take out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlastRadius {
    /// Most of the fleet drained at once (any reason), in percent.
    #[serde(default = "default_drained_pct")]
    pub max_drained_pct: f64,
    /// Most drained nodes per `group_by` label value.
    #[serde(default)]
    pub max_per_group: Option<u32>,
    #[serde(default)]
    pub group_by: Option<String>,
}

fn default_drained_pct() -> f64 {
    10.0
}

impl Default for BlastRadius {
    fn default() -> Self {
        BlastRadius { max_drained_pct: default_drained_pct(), max_per_group: None, group_by: None }
    }
}

/// When a person must approve a run before it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    #[serde(default)]
    pub always: bool,
    /// Runs that would touch more nodes than this wait for approval.
    #[serde(default)]
    pub above_nodes: Option<u32>,
    /// A pending approval expires (run cancelled) after this long.
    #[serde(default = "default_expire")]
    pub expire_secs: u64,
}

fn default_expire() -> u64 {
    3600
}

impl Default for Approval {
    fn default() -> Self {
        Approval { always: false, above_nodes: None, expire_secs: default_expire() }
    }
}

/// Storm protection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    /// More distinct targets firing than this within the window trips it.
    pub max_targets: u32,
    pub window_secs: u64,
    /// How long a fire waits before it may start, so a storm is seen whole.
    #[serde(default)]
    pub hold_secs: u64,
    /// What `max_targets` counts: distinct `nodes` (default) or `gpus`.
    #[serde(default)]
    pub count: BreakerCount,
    /// What a trip does to the storm's runs: refuse them (default), or let
    /// them go on with reversible steps only.
    #[serde(default)]
    pub on_trip: OnTrip,
}

/// What a tripped breaker does to the runs of the storm. Either way one page
/// names the nodes and the labels they share.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTrip {
    /// Every run of the storm is refused before its script starts (a stall
    /// or XID storm: a drain or requeue per node would only move the
    /// shared cause around).
    #[default]
    Refuse,
    /// The runs go on, but with reversible steps only: no drain, no
    /// requeue, no power-off, and no page of their own (the breaker's page
    /// covers them). For rows whose own steps protect the hardware
    /// whatever the cause — a rack's cooling failing, where every GPU still
    /// needs its power cap.
    ReversibleOnly,
}

/// What a breaker counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerCount {
    /// Four XIDs on one node are one node.
    #[default]
    Nodes,
    Gpus,
}

/// One problem in a manifest or script.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct LoadError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

pub use nightshift_proto::yaml::locate;

impl Manifest {
    /// Parse and validate a manifest's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, LoadError> {
        let m: Manifest = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (mut line, mut column, message) = nightshift_proto::yaml::error_parts(&e);
            // Inside the trigger (a tagged enum) serde_yaml loses the
            // place: an unknown key is found by the parser instead.
            if (line, column) == (1, 1)
                && let Some(key) = message.strip_prefix("unknown field `").and_then(|m| m.split('`').next())
                && let Some((l, c)) = nightshift_proto::yaml::locate_key(text, key)
            {
                (line, column) = (l, c);
            }
            LoadError { file: path.into(), line, column, message }
        })?;
        m.validate(text, path)?;
        Ok(m)
    }

    /// The handbook rows the runbook covers (`H1/H2` is two).
    pub fn rows(&self) -> Vec<&str> {
        self.handbook
            .as_deref()
            .map(|h| h.split(['/', ',', ' ']).filter(|r| !r.is_empty()).collect())
            .unwrap_or_default()
    }

    /// The metric id of a telemetry trigger.
    pub fn metric_id(&self) -> Option<MetricId> {
        self.trigger.metric().and_then(metrics::metric_id)
    }

    /// Default params, typed.
    pub fn default_params(&self) -> BTreeMap<String, ParamValue> {
        self.params.iter().filter_map(|(k, p)| p.ty.read_yaml(&p.default).ok().map(|v| (k.clone(), v))).collect()
    }

    /// Defaults overridden by `overrides` (`name=value` strings), or the
    /// error naming the bad one.
    pub fn resolve_params(&self, overrides: &BTreeMap<String, String>) -> Result<BTreeMap<String, ParamValue>, String> {
        let mut out = self.default_params();
        for (k, v) in overrides {
            let spec = self.params.get(k).ok_or_else(|| {
                format!(
                    "runbook {} has no parameter `{k}`: expected one of [{}]",
                    self.name,
                    self.params.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
            out.insert(k.clone(), spec.ty.parse(v).map_err(|m| format!("parameter `{k}`: {m}"))?);
        }
        Ok(out)
    }
}
