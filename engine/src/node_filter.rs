//! Which nodes a listing shows (`GET /api/v1/nodes`, `agents list`,
//! `holds list`): by name, label and state, a page at a time.

use crate::engine::Engine;
use crate::views::NodeView;

impl Engine {
    /// The nodes `f` selects, by name, a page of them, and where the next
    /// page starts (none: this was the last).
    /// The nodes that carry `label` = `value` now (a runs listing's label
    /// filter: the audit store does not know labels).
    pub(crate) fn nodes_labelled(&self, label: &str, value: &str) -> Vec<String> {
        self.core
            .fleet()
            .nodes()
            .iter()
            .filter(|n| n.label(label) == Some(value))
            .map(|n| n.spec.name.clone())
            .collect()
    }

    pub(crate) fn nodes_filtered(&self, f: &NodeFilter) -> (Vec<NodeView>, Option<String>) {
        let mut names = self.node_names();
        names.sort();
        let mut out = Vec::new();
        let limit = f.limit.unwrap_or(usize::MAX).max(1);
        for name in names.iter().filter(|n| f.after.as_ref().is_none_or(|a| *n > a)) {
            if f.node.as_ref().is_some_and(|want| want != name) {
                continue;
            }
            let Some(v) = self.node(name) else { continue };
            if let Some((k, val)) = &f.label
                && v.labels.get(k) != Some(val)
            {
                continue;
            }
            if let Some(st) = f.state
                && !self.node_in_state(&v, st)
            {
                continue;
            }
            if out.len() == limit {
                let next = names_last(&out);
                return (out, Some(next));
            }
            out.push(v);
        }
        (out, None)
    }

    fn node_in_state(&self, v: &NodeView, st: NodeStateFilter) -> bool {
        match st {
            NodeStateFilter::Drained => v.state.drained,
            NodeStateFilter::HandsOff => v.state.hands_off(),
            NodeStateFilter::Disconnected => !v.state.connected,
            NodeStateFilter::Faulted => {
                self.core.health().model().node_state(&v.name) != crate::health::HealthState::Healthy
            }
            NodeStateFilter::InService => {
                !v.state.drained
                    && !v.state.hands_off()
                    && v.state.connected
                    && self.core.health().model().node_state(&v.name) == crate::health::HealthState::Healthy
            }
        }
    }
}

fn names_last(v: &[NodeView]) -> String {
    v.last().map(|n| n.name.clone()).unwrap_or_default()
}

/// Which nodes a listing shows (`GET /api/v1/nodes`, `agents list`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFilter {
    /// Only this node.
    pub node: Option<String>,
    /// Only nodes with this label value.
    pub label: Option<(String, String)>,
    pub state: Option<NodeStateFilter>,
    /// A page starts after this node name (the last page's cursor).
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// A node's state, as a listing filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStateFilter {
    /// Connected, not drained, not hands-off, every GPU healthy.
    InService,
    Drained,
    HandsOff,
    /// A GPU not healthy in the repair lifecycle.
    Faulted,
    Disconnected,
}

impl NodeStateFilter {
    pub const ALL: [(&'static str, NodeStateFilter); 5] = [
        ("in_service", NodeStateFilter::InService),
        ("drained", NodeStateFilter::Drained),
        ("hands_off", NodeStateFilter::HandsOff),
        ("faulted", NodeStateFilter::Faulted),
        ("disconnected", NodeStateFilter::Disconnected),
    ];

    /// `state`: one of [`NodeStateFilter::ALL`]'s names (`hands-off` too).
    pub fn parse(s: &str) -> Result<NodeStateFilter, String> {
        let s = s.replace('-', "_");
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, f)| *f).ok_or_else(|| {
            format!(
                "state: expected one of {}, found {s:?}",
                Self::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// `key=value` for a label filter.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("label: expected key=value (pool=train), found {s:?}")),
    }
}
