//! Runs: what a runbook execution is called, aims at, and ended as.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use nightshift_proto::params::ParamValue;

/// What a run acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Target {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// `(label, value)` for group runs, e.g. `("pool", "a")`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<(String, String)>,
}

impl Target {
    pub fn node(node: &str) -> Target {
        Target { node: Some(node.into()), gpu: None, group: None }
    }
    pub fn gpu(node: &str, gpu: u32) -> Target {
        Target { node: Some(node.into()), gpu: Some(gpu), group: None }
    }
    pub fn group(label: &str, value: &str) -> Target {
        Target { node: None, gpu: None, group: Some((label.into(), value.into())) }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.node, self.gpu, &self.group) {
            (Some(n), Some(g), _) => write!(f, "{n}/gpu{g}"),
            (Some(n), None, _) => write!(f, "{n}"),
            (None, _, Some((k, v))) => write!(f, "{k}={v}"),
            _ => write!(f, "fleet"),
        }
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Queued,
    PendingApproval,
    Running,
    Finished,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::PendingApproval => "pending_approval",
            RunState::Running => "running",
            RunState::Finished => "finished",
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// It did its work: nothing is left for a person.
    Succeeded,
    /// It did its part and a person must finish: it paged one, or left a
    /// node drained until a person ends it (a repair, an RMA, a cooling
    /// fault that stayed hot). The ending says what for.
    NeedsPerson,
    Failed,
    /// Not started or stopped by a rule: approval rejected, blast radius,
    /// hands-off, attempt budget, breaker.
    Refused,
    TimedOut,
    Cancelled,
    /// The engine stopped while it was in flight.
    Interrupted,
    /// Not acted on: the event was too old by the time the run could start,
    /// or its condition had cleared.
    Skipped,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::NeedsPerson => "needs_person",
            RunOutcome::Failed => "failed",
            RunOutcome::Refused => "refused",
            RunOutcome::TimedOut => "timed_out",
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Interrupted => "interrupted",
            RunOutcome::Skipped => "skipped",
        }
    }

    /// Every outcome, in the order lists and filters show them.
    pub const ALL: [RunOutcome; 8] = [
        RunOutcome::Succeeded,
        RunOutcome::NeedsPerson,
        RunOutcome::Failed,
        RunOutcome::Refused,
        RunOutcome::TimedOut,
        RunOutcome::Cancelled,
        RunOutcome::Interrupted,
        RunOutcome::Skipped,
    ];

    pub fn parse(s: &str) -> Option<RunOutcome> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// The outcome in words, as a person reads it (`needs a person`).
    pub fn words(self) -> &'static str {
        match self {
            RunOutcome::NeedsPerson => "needs a person",
            RunOutcome::TimedOut => "timed out",
            o => o.as_str(),
        }
    }

    /// The run did its work (all of it, or its part before a person's):
    /// it ends the pages other runs opened about its target.
    pub fn did_its_work(self) -> bool {
        matches!(self, RunOutcome::Succeeded | RunOutcome::NeedsPerson)
    }
}

/// A decision on a run that waited for approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub by: String,
    pub approved: bool,
    pub at_ms: i64,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The current summary of a run (an index over the audit log, kept beside
/// it and updated in the same write as the record that changed it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunSummary {
    pub id: String,
    /// A shadow run: its runbook was in shadow mode, so every action went
    /// as a dry run and nothing was notified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    pub runbook: String,
    /// The runbook's digest when the run was admitted (manifest and
    /// script): it starts only if the loaded runbook still has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook_digest: Option<String>,
    #[serde(default)]
    pub handbook: Option<String>,
    pub target: Target,
    /// `threshold`, `alert`, `manual`, …
    pub trigger: String,
    /// The event that started it.
    pub event: Value,
    pub params: BTreeMap<String, ParamValue>,
    pub dry_run: bool,
    /// `engine` or `user:<name>`.
    pub requested_by: String,
    pub state: RunState,
    #[serde(default)]
    pub outcome: Option<RunOutcome>,
    /// Why the run exists, in one line (set once, never rewritten).
    #[serde(default)]
    pub detail: String,
    /// How it ended, in one line.
    #[serde(default)]
    pub ending: Option<String>,
    /// `detail — ending`, for lists.
    pub why: String,
    /// What a queued run is waiting for, while it waits.
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// Holds the run left in effect on purpose (kept past its end), as
    /// `node: setting value until time`.
    #[serde(default)]
    pub holds_kept: Vec<String>,
    /// Holds still in effect at its end that it did not mean to keep (the
    /// release failed or the agent was unreachable).
    #[serde(default)]
    pub holds_left: Vec<String>,
    pub created_ms: i64,
    /// When the event that started it happened.
    #[serde(default)]
    pub event_ts_ms: i64,
    #[serde(default)]
    pub started_ms: Option<i64>,
    #[serde(default)]
    pub finished_ms: Option<i64>,
    pub actions: u32,
    /// What the run's applied actions did, in words, in order, each once
    /// (`capped`, `drained for repair`, `GPU to RMA`, `rolled back` …): the timeline's
    /// "did" column. Empty: it changed nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub did: Vec<String>,
    #[serde(default)]
    pub approvals: Vec<ApprovalDecision>,
    /// Failure text, with the script's file and line when it came from there.
    #[serde(default)]
    pub error: Option<String>,
    /// Nodes the run acted on.
    #[serde(default)]
    pub nodes: Vec<String>,
}
