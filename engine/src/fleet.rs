//! The fleet: every node in the inventory, how to reach its agent, and what
//! the engine knows about it now (connected, drained and by whom,
//! hands-off, notes left by runbooks).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use nightshift_proto::owner::owned_by_nightshift;
use nightshift_proto::ssh::client::AgentTransport;
use nightshift_proto::{Inventory as AgentInventory, Vendor};

use crate::inventory::NodeSpec;

/// What the engine knows about a node right now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    pub connected: bool,
    pub last_seen_ms: i64,
    pub drained: bool,
    pub drain_reason: Option<String>,
    /// The agent's maintenance marker is present.
    pub agent_hands_off: bool,
    /// An admin set hands-off in the engine: `(who, why)`.
    pub engine_hands_off: Option<(String, String)>,
    /// Notes runbooks left on the node (e.g. `no-pack`).
    pub annotations: BTreeMap<String, String>,
    pub inventory: Option<AgentInventory>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// Holds in effect on the node and its GPUs (from the agent).
    #[serde(default)]
    pub holds: Vec<nightshift_proto::HoldInfo>,
}

impl NodeState {
    /// Drained by someone other than nightshift.
    pub fn drained_by_person(&self) -> bool {
        self.drained && !owned_by_nightshift(self.drain_reason.as_deref())
    }

    pub fn hands_off(&self) -> bool {
        self.agent_hands_off || self.engine_hands_off.is_some()
    }

    pub fn vendor(&self) -> Option<Vendor> {
        self.inventory.as_ref().and_then(|i| i.gpus.first()).map(|g| g.vendor)
    }

    pub fn gpu_count(&self) -> usize {
        self.inventory.as_ref().map_or(0, |i| i.gpus.len())
    }
}

/// One node.
pub struct Node {
    pub idx: u32,
    pub spec: NodeSpec,
    pub addr: String,
    pub transport: Arc<dyn AgentTransport>,
    state: Mutex<NodeState>,
}

impl Node {
    pub fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.spec.labels.get(key).map(String::as_str)
    }
}

/// All nodes.
pub struct Fleet {
    pub nodes: Vec<Arc<Node>>,
    by_name: HashMap<String, u32>,
}

impl Fleet {
    /// Build from inventory entries and a transport for each.
    pub fn new(nodes: Vec<(NodeSpec, String, Arc<dyn AgentTransport>)>) -> Fleet {
        let mut by_name = HashMap::new();
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(i, (spec, addr, transport))| {
                by_name.insert(spec.name.clone(), i as u32);
                Arc::new(Node { idx: i as u32, spec, addr, transport, state: Mutex::new(NodeState::default()) })
            })
            .collect();
        Fleet { nodes, by_name }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Node>> {
        self.by_name.get(name).map(|i| &self.nodes[*i as usize])
    }

    pub fn by_idx(&self, idx: u32) -> Option<&Arc<Node>> {
        self.nodes.get(idx as usize)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes whose label `key` is `value`.
    pub fn group(&self, key: &str, value: &str) -> Vec<Arc<Node>> {
        self.nodes.iter().filter(|n| n.label(key) == Some(value)).cloned().collect()
    }

    /// Distinct values of label `key`, with their nodes.
    pub fn groups(&self, key: &str) -> BTreeMap<String, Vec<Arc<Node>>> {
        let mut out: BTreeMap<String, Vec<Arc<Node>>> = BTreeMap::new();
        for n in &self.nodes {
            if let Some(v) = n.label(key) {
                out.entry(v.to_string()).or_default().push(n.clone());
            }
        }
        out
    }

    /// Names of drained nodes.
    pub fn drained(&self) -> Vec<String> {
        self.nodes.iter().filter(|n| n.state().drained).map(|n| n.spec.name.clone()).collect()
    }
}
