//! What a person's tools send: the bodies of the HTTP API's `POST`s, one
//! type each, read by the web crate (unknown fields refused) and built by
//! the CLI — never a JSON literal on either side.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::runbooks::manifest::Mode;
use crate::runbooks::modes::FleetMode;
use nightshift_audit::RunFilter;
use nightshift_audit::runs::{RunOutcome, RunState, Target};

/// `POST /api/v1/runs` and `POST /api/v1/runs/plan`: a manual run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    pub runbook: String,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub gpu: Option<u32>,
    /// `label=value`.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    #[serde(default)]
    pub dry_run: bool,
}

impl StartRun {
    /// The body for a run of `runbook` on `target`.
    pub fn new(runbook: &str, target: &Target, params: BTreeMap<String, String>, dry_run: bool) -> StartRun {
        StartRun {
            runbook: runbook.to_string(),
            node: target.node.clone(),
            gpu: target.gpu,
            group: target.group.as_ref().map(|(k, v)| format!("{k}={v}")),
            params,
            dry_run,
        }
    }

    /// The target it names: a node (and optionally a GPU), or a group.
    pub fn target(&self) -> Result<Target, String> {
        match (&self.node, self.gpu, &self.group) {
            (Some(n), g, None) => Ok(Target { node: Some(n.clone()), gpu: g, group: None }),
            (None, None, Some(g)) => {
                let (k, v) = g.split_once('=').ok_or_else(|| format!("group: expected label=value, found {g:?}"))?;
                Ok(Target::group(k, v))
            }
            _ => Err("expected `node` (and optionally `gpu`) or `group`, not both".into()),
        }
    }
}

/// The body of a control that needs only a reason (`POST
/// /api/v1/runs/{id}/reject`, a node's resume and drain, the end of a
/// maintenance window): kept in the audit record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    pub reason: String,
}

/// `POST /api/v1/runs/{id}/cancel` (and approve): an optional reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cancel {
    /// Why: kept in the audit record beside who cancelled.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /api/v1/nodes/{name}/repaired`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repaired {
    /// One GPU; every GPU awaiting repair when absent.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// What was done (kept in the audit record).
    #[serde(default)]
    pub note: String,
}

/// `POST /api/v1/nodes/{name}/hands-off`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HandsOff {
    pub hands_off: bool,
    #[serde(default)]
    pub reason: Option<String>,
    /// It ends by itself after this many seconds (1 to 30 days).
    #[serde(default)]
    pub for_secs: Option<u64>,
}

/// `POST /api/v1/nodes/{name}/holds/release`: which holds, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseHolds {
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub hold: Option<String>,
    /// Only holds of this kind (`power_limit`, `fan_curve`, `node_drain`, …).
    #[serde(default)]
    pub kind: Option<String>,
    /// Every hold on the node: said on purpose (without it, a release names
    /// a gpu, owner, hold or kind).
    #[serde(default)]
    pub all: bool,
    /// Admin only: release a repair drain of a GPU the health model holds
    /// broken anyway.
    #[serde(default)]
    pub force: bool,
    /// Why: kept in the audit record.
    pub reason: String,
}

/// `POST /api/v1/runbooks/{name}/mode`: promote or demote a runbook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRunbookMode {
    /// `act` (promote) or `shadow` (demote).
    pub mode: Mode,
    /// Why: kept in the audit record.
    pub reason: String,
}

/// `POST /api/v1/fleet/mode`: a change of the whole fleet's mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetFleetMode {
    /// `act`, `shadow` or `paused`.
    pub mode: FleetMode,
    /// Why: kept in the audit record.
    pub reason: String,
}

/// `POST /api/v1/maintenance`: which nodes (every matcher must hold), from
/// when (default now) until when (`ends_at`, or `for_secs` from the start),
/// and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWindow {
    #[serde(default)]
    pub matchers: BTreeMap<String, String>,
    #[serde(default)]
    pub nodes: Vec<String>,
    /// RFC 3339; none: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<String>,
    /// Seconds after the start (instead of `ends_at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_secs: Option<u64>,
    pub reason: String,
}

/// `GET /api/v1/audit/records`: the records after `after_seq`, oldest
/// first, `limit` of them (default 500, at most 5,000).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordsQuery {
    #[serde(default)]
    pub after_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl RecordsQuery {
    /// The most records one answer holds.
    pub const MAX: usize = 5000;
}

/// Filters and paging of `GET /api/v1/nodes` (each empty value is none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodesQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `key=value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// in_service, drained, hands_off, faulted or disconnected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The `Next-Cursor` of the page before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl NodesQuery {
    /// The query for a node filter (its label as `key=value`, its state by
    /// name).
    pub fn of(f: &crate::node_filter::NodeFilter) -> NodesQuery {
        use crate::node_filter::NodeStateFilter;
        NodesQuery {
            node: f.node.clone(),
            label: f.label.as_ref().map(|(k, v)| format!("{k}={v}")),
            state: f
                .state
                .and_then(|st| NodeStateFilter::ALL.iter().find(|(_, x)| *x == st))
                .map(|(name, _)| name.to_string()),
            cursor: f.after.clone(),
            limit: f.limit,
        }
    }

    /// The filter it asks for, or what is wrong with it.
    pub fn filter(&self) -> Result<crate::node_filter::NodeFilter, super::Refused> {
        use super::Refused;
        use crate::node_filter::{NodeFilter, NodeStateFilter, parse_label};
        let nonempty = |o: &Option<String>| o.clone().filter(|v| !v.is_empty());
        Ok(NodeFilter {
            node: nonempty(&self.node),
            label: nonempty(&self.label).as_deref().map(parse_label).transpose().map_err(Refused::bad_request)?,
            state: nonempty(&self.state)
                .as_deref()
                .map(NodeStateFilter::parse)
                .transpose()
                .map_err(Refused::bad_request)?,
            after: nonempty(&self.cursor),
            limit: match self.limit {
                Some(l @ (0 | 10_001..)) => {
                    return Err(Refused::bad_request(format!("limit: expected 1 to 10000, found {l}")));
                }
                l => l,
            },
        })
    }
}

/// Filters of `GET /api/v1/runs` (each empty value is none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `all`: every shard of a PostgreSQL database, each run with its shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<String>,
    /// `key=value`: runs on the nodes that carry this label now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl RunsQuery {
    /// The query for a store filter (its outcome and state by name), and
    /// the label it was narrowed by.
    pub fn of(f: &RunFilter, label: Option<&(String, String)>) -> RunsQuery {
        RunsQuery {
            node: f.node.clone(),
            gpu: f.gpu,
            runbook: f.runbook.clone(),
            outcome: f.outcome.map(|o| o.as_str().to_string()),
            state: f.state.map(|s| s.as_str().to_string()),
            since_ms: f.since_ms,
            until_ms: f.until_ms,
            cursor: f.cursor.clone(),
            limit: f.limit,
            shards: None,
            label: label.map(|(k, v)| format!("{k}={v}")),
        }
    }

    /// The store's filter; a `label` becomes the nodes that carry it now
    /// (the store knows no labels).
    pub fn filter(&self, engine: &crate::engine::Engine) -> Result<RunFilter, super::Refused> {
        use super::Refused;
        let nodes_any = match self.label.as_deref().filter(|l| !l.is_empty()) {
            Some(label) => {
                let (k, v) = crate::node_filter::parse_label(label).map_err(Refused::bad_request)?;
                Some(engine.nodes_labelled(&k, &v))
            }
            None => None,
        };
        let outcome = match self.outcome.as_deref().filter(|s| !s.is_empty()) {
            Some(o) => Some(RunOutcome::parse(o).ok_or_else(|| {
                Refused::bad_request(format!(
                    "outcome: expected succeeded, failed, refused, timed_out, cancelled or interrupted, found {o:?}"
                ))
            })?),
            None => None,
        };
        let state = match self.state.as_deref().filter(|s| !s.is_empty()) {
            Some(s) => {
                Some(serde_json::from_value::<RunState>(serde_json::Value::String(s.to_string())).map_err(|_| {
                    Refused::bad_request(format!(
                        "state: expected queued, pending_approval, running or finished, found {s:?}"
                    ))
                })?)
            }
            None => None,
        };
        Ok(RunFilter {
            node: self.node.clone().filter(|s| !s.is_empty()),
            gpu: self.gpu,
            runbook: self.runbook.clone().filter(|s| !s.is_empty()),
            outcome,
            state,
            since_ms: self.since_ms,
            until_ms: self.until_ms,
            cursor: self.cursor.clone().filter(|s| !s.is_empty()),
            limit: self.limit,
            nodes_any,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table: a body's node, GPU and group → the target, or the refusal.
    #[test]
    fn a_start_run_names_one_kind_of_target() {
        let body = |node: Option<&str>, gpu: Option<u32>, group: Option<&str>| StartRun {
            runbook: "r".into(),
            node: node.map(str::to_string),
            gpu,
            group: group.map(str::to_string),
            ..StartRun::default()
        };
        let cases: Vec<(StartRun, Result<Target, &str>)> = vec![
            (body(Some("n1"), None, None), Ok(Target { node: Some("n1".into()), gpu: None, group: None })),
            (body(Some("n1"), Some(3), None), Ok(Target { node: Some("n1".into()), gpu: Some(3), group: None })),
            (body(None, None, Some("pool=train")), Ok(Target::group("pool", "train"))),
            (body(None, None, Some("pool")), Err("group: expected label=value, found \"pool\"")),
            (
                body(Some("n1"), None, Some("pool=a")),
                Err("expected `node` (and optionally `gpu`) or `group`, not both"),
            ),
            (body(None, Some(1), None), Err("expected `node` (and optionally `gpu`) or `group`, not both")),
        ];
        for (b, want) in cases {
            assert_eq!(b.target(), want.map_err(str::to_string), "{b:?}");
        }
        // And back: a target's body names it again.
        for t in [Target { node: Some("n".into()), gpu: Some(2), group: None }, Target::group("rack", "r7")] {
            assert_eq!(StartRun::new("r", &t, BTreeMap::new(), false).target(), Ok(t));
        }
    }
}
