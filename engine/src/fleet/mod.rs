//! The fleet: every node in the inventory, how to reach its agent, and what
//! the engine knows about it now (connected, drained and by whom,
//! hands-off, notes left by runbooks).
//!
//! The folder is the fleet subsystem (issue 44, What to build #1): the
//! nodes, their inventory file ([`inventory`]) and their maintenance
//! windows ([`windows`]). What acts on nodes — a run's host, hand-made
//! changes, the blast radius — is above `core`.

pub(crate) mod inventory;
pub(crate) mod windows;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use nightshift_proto::owner::owned_by_nightshift;
use nightshift_proto::ssh::client::AgentTransport;
use nightshift_proto::{Inventory as AgentInventory, Vendor};

use crate::fleet::inventory::NodeSpec;

/// What the engine knows about a node right now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeState {
    pub connected: bool,
    pub last_seen_ms: i64,
    pub drained: bool,
    pub drain_reason: Option<String>,
    /// The agent's maintenance marker is present.
    pub agent_hands_off: bool,
    /// An admin set hands-off in the engine: `(who, why)`.
    pub engine_hands_off: Option<(String, String)>,
    /// When the engine's hands-off ends by itself (none: a person ends it).
    #[serde(default)]
    pub engine_hands_off_until_ms: Option<i64>,
    /// The maintenance window that covers the node now (`maintenance.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<crate::fleet::windows::Cover>,
    /// Notes runbooks left on the node (e.g. `no-pack`).
    pub annotations: BTreeMap<String, String>,
    pub inventory: Option<AgentInventory>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// Holds in effect on the node and its GPUs (from the agent).
    #[serde(default)]
    pub holds: Vec<nightshift_proto::HoldInfo>,
    /// The agent cannot record changes durably: what it said.
    #[serde(default)]
    pub state_degraded: Option<String>,
    /// When this engine got its first reading of the node (none yet: a
    /// new engine knows nothing of it). What a resumed run may judge from
    /// starts here (invariant 18).
    #[serde(skip)]
    pub first_reading_ms: Option<i64>,
    /// The node's fault evidence was last judged in full, finding nothing
    /// left to do, under this XID policy generation and GPU count: until
    /// evidence arrives again, the node is on record or either changes,
    /// judging it again finds the same (`Engine::take_samples`).
    #[serde(skip)]
    pub evidence_judged: Option<(u64, u32)>,
}

impl NodeState {
    /// Drained by someone other than nightshift.
    pub fn drained_by_person(&self) -> bool {
        self.drained && !owned_by_nightshift(self.drain_reason.as_deref())
    }

    /// A reading of the node at `ts_ms` arrived (`i64::MIN`: none).
    pub fn saw_reading(&mut self, ts_ms: i64) {
        self.last_seen_ms = self.last_seen_ms.max(ts_ms);
        if ts_ms > i64::MIN {
            self.first_reading_ms.get_or_insert(ts_ms);
        }
    }

    /// Why node `name` is hands-off, in words for a page: the admin's own
    /// reason, or the agent's maintenance marker (none: it is not).
    pub fn hands_off_words(&self, name: &str) -> Option<String> {
        match (&self.engine_hands_off, self.agent_hands_off, &self.maintenance) {
            (Some((by, why)), _, _) => Some(format!("node {name} is hands-off ({by}: {why})")),
            (None, true, _) => Some(format!("node {name} is hands-off (the maintenance marker on the node)")),
            (None, false, Some(w)) => Some(format!(
                "node {name} is in maintenance window {} ({}: {}) until {}",
                w.id,
                w.by,
                w.reason,
                crate::signals::alerts::format_rfc3339_ms(w.ends_ms)
            )),
            (None, false, None) => None,
        }
    }

    pub fn hands_off(&self) -> bool {
        self.agent_hands_off || self.engine_hands_off.is_some() || self.maintenance.is_some()
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
    /// The highest leader term this node's agent acknowledged an announce
    /// of (0: none yet, or its connection was renewed since).
    announced: std::sync::atomic::AtomicU64,
}

/// The announce of a leader's `term`: a read of the holds carrying it,
/// the one request an agent records a term from.
pub fn announce_request(id: String, term: u64) -> nightshift_proto::Request {
    let mut req = nightshift_proto::Request::new(id, nightshift_proto::Op::Holds(nightshift_proto::NoArgs {}));
    req.term = Some(term);
    req
}

impl Node {
    fn new(idx: u32, spec: NodeSpec, addr: String, transport: Arc<dyn AgentTransport>, state: NodeState) -> Node {
        Node { idx, spec, addr, transport, state: Mutex::new(state), announced: Default::default() }
    }

    /// The highest term this node's agent acknowledged an announce of.
    pub fn announced(&self) -> u64 {
        self.announced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Tell this node's agent the leader's `term` (a read of the holds
    /// with it, request `id`: the only request an agent records a term
    /// from), at most 2 s; whether it acknowledged (then remembered).
    pub async fn announce(&self, id: String, term: u64) -> bool {
        let req = announce_request(id, term);
        let heard = matches!(tokio::time::timeout(std::time::Duration::from_secs(2), self.transport.call(req)).await,
            Ok(Ok(r)) if r.ok);
        if heard {
            self.set_announced(term);
        }
        heard
    }

    /// The agent acknowledged the announce of `term`; `0` forgets what it
    /// heard (a new connection: perhaps a new agent on a new state folder).
    pub fn set_announced(&self, term: u64) {
        if term == 0 {
            self.announced.store(0, std::sync::atomic::Ordering::SeqCst);
        } else {
            self.announced.fetch_max(term, std::sync::atomic::Ordering::SeqCst);
        }
    }

    pub fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.spec.labels.get(key).map(String::as_str)
    }
}

/// One version of the node list.
struct Members {
    nodes: Arc<Vec<Arc<Node>>>,
    by_name: HashMap<String, usize>,
    by_idx: HashMap<u32, usize>,
    /// The host of each agent's address, where one node alone has it
    /// (several agents on one machine share theirs: no entry).
    by_host: HashMap<String, Option<usize>>,
}

impl Members {
    fn new(nodes: Vec<Arc<Node>>) -> Members {
        let by_name = nodes.iter().enumerate().map(|(i, n)| (n.spec.name.clone(), i)).collect();
        let by_idx = nodes.iter().enumerate().map(|(i, n)| (n.idx, i)).collect();
        let mut by_host: HashMap<String, Option<usize>> = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            if let Some(h) = crate::signals::alerts::address_host(&n.spec.address) {
                by_host.entry(h.to_string()).and_modify(|e| *e = None).or_insert(Some(i));
            }
        }
        Members { nodes: Arc::new(nodes), by_name, by_idx, by_host }
    }
}

/// What a fleet reload changed, by node name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct FleetChange {
    pub added: Vec<String>,
    /// Address, host key, labels or standby changed: a new connection.
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

impl FleetChange {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// All nodes. The list can be replaced at run time (a reload of
/// fleet.yaml); readers take a snapshot. A node keeps its `idx` for as long
/// as it is in the list; a new node gets one never used before, so telemetry
/// keyed by index never mixes two nodes.
pub struct Fleet {
    members: std::sync::RwLock<Members>,
    next_idx: std::sync::atomic::AtomicU32,
    /// Bumped by every [`Fleet::replace`]: what is derived from the node
    /// list (labels, groups) is stale when it moves.
    generation: std::sync::atomic::AtomicU64,
    /// The SSH client of each node.
    clients: AgentClients,
    /// Maintenance windows in force or to come (`maintenance.rs` keeps
    /// them through `WindowBook`'s methods).
    windows: windows::WindowBook,
}

impl Fleet {
    /// Build from inventory entries and a transport for each.
    pub fn new(nodes: Vec<(NodeSpec, String, Arc<dyn AgentTransport>)>) -> Fleet {
        let nodes: Vec<Arc<Node>> = nodes
            .into_iter()
            .enumerate()
            .map(|(i, (spec, addr, transport))| {
                Arc::new(Node::new(i as u32, spec, addr, transport, NodeState::default()))
            })
            .collect();
        let next = nodes.len() as u32;
        Fleet {
            members: std::sync::RwLock::new(Members::new(nodes)),
            next_idx: std::sync::atomic::AtomicU32::new(next),
            generation: std::sync::atomic::AtomicU64::new(0),
            clients: Default::default(),
            windows: Default::default(),
        }
    }

    /// The SSH client of each node (the fleet subsystem's own).
    pub(crate) fn agent_clients(&self) -> &AgentClients {
        &self.clients
    }

    /// The maintenance windows (the fleet subsystem's own).
    pub(crate) fn windows(&self) -> &windows::WindowBook {
        &self.windows
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Members> {
        self.members.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Every node now (a snapshot).
    pub fn nodes(&self) -> Arc<Vec<Arc<Node>>> {
        self.read().nodes.clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        let m = self.read();
        m.by_name.get(name).map(|i| m.nodes[*i].clone())
    }

    /// The node a scrape target's host is: a node's name, or the host of
    /// one node's agent address alone.
    pub fn by_source(&self, host: &str) -> Option<Arc<Node>> {
        let m = self.read();
        let i = m.by_name.get(host).copied().or_else(|| m.by_host.get(host).copied().flatten())?;
        Some(m.nodes[i].clone())
    }

    pub fn by_idx(&self, idx: u32) -> Option<Arc<Node>> {
        let m = self.read();
        m.by_idx.get(&idx).map(|i| m.nodes[*i].clone())
    }

    pub fn len(&self) -> usize {
        self.read().nodes.len()
    }

    /// Whether `node` is the fleet's current node of that name (not one a
    /// reload replaced or removed).
    pub fn is_current(&self, node: &Arc<Node>) -> bool {
        self.get(&node.spec.name).is_some_and(|n| Arc::ptr_eq(&n, node))
    }

    /// Replace the node list. Nodes whose spec and address are unchanged
    /// stay as they are (connection, state); a changed one is rebuilt with a
    /// new transport from `connect`, keeping its index and state; removed
    /// ones leave. Returns the change and the nodes that need a connection
    /// loop (added and changed).
    pub fn replace(
        &self,
        specs: Vec<(NodeSpec, String)>,
        mut connect: impl FnMut(&NodeSpec, &str) -> Arc<dyn AgentTransport>,
    ) -> (FleetChange, Vec<Arc<Node>>) {
        let mut members = self.members.write().unwrap_or_else(|e| e.into_inner());
        let mut change = FleetChange::default();
        let mut fresh = Vec::new();
        let mut nodes = Vec::with_capacity(specs.len());
        for (spec, addr) in specs {
            let old = members.by_name.get(&spec.name).map(|i| members.nodes[*i].clone());
            match old {
                Some(o) if o.spec == spec && o.addr == addr => nodes.push(o),
                Some(o) => {
                    let state = o.state().clone();
                    let n = Arc::new(Node::new(o.idx, spec.clone(), addr.clone(), connect(&spec, &addr), state));
                    change.changed.push(spec.name.clone());
                    fresh.push(n.clone());
                    nodes.push(n);
                }
                None => {
                    let idx = self.next_idx.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let n = Arc::new(Node::new(
                        idx,
                        spec.clone(),
                        addr.clone(),
                        connect(&spec, &addr),
                        NodeState::default(),
                    ));
                    change.added.push(spec.name.clone());
                    fresh.push(n.clone());
                    nodes.push(n);
                }
            }
        }
        let kept: std::collections::HashSet<&str> = nodes.iter().map(|n| n.spec.name.as_str()).collect();
        change.removed = members
            .nodes
            .iter()
            .filter(|n| !kept.contains(n.spec.name.as_str()))
            .map(|n| n.spec.name.clone())
            .collect();
        let next = Members::new(nodes);
        *members = next;
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (change, fresh)
    }

    /// How many times the node list was replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Nodes whose label `key` is `value`.
    pub fn group(&self, key: &str, value: &str) -> Vec<Arc<Node>> {
        self.nodes().iter().filter(|n| n.label(key) == Some(value)).cloned().collect()
    }

    /// Distinct values of label `key`, with their nodes.
    pub fn groups(&self, key: &str) -> BTreeMap<String, Vec<Arc<Node>>> {
        let mut out: BTreeMap<String, Vec<Arc<Node>>> = BTreeMap::new();
        for n in self.nodes().iter() {
            if let Some(v) = n.label(key) {
                out.entry(v.to_string()).or_default().push(n.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::ssh::client::ClientError;
    use nightshift_proto::{Reply, Request};

    /// Answers every request and remembers what it was sent.
    #[derive(Default)]
    struct Heard(Mutex<Vec<(String, Option<u64>)>>);

    impl AgentTransport for Heard {
        fn call(&self, req: Request) -> futures::future::BoxFuture<'_, Result<Reply, ClientError>> {
            self.0.lock().unwrap().push((req.op.name().to_string(), req.term));
            Box::pin(async move { Ok(Reply::ok(&req.id, serde_json::json!([]))) })
        }
    }

    /// Issue 46 point 9: an agent records a term only from the announce,
    /// so the engine remembers per node which term was heard — one
    /// announce per term, again after a new connection forgot it.
    #[tokio::test]
    async fn a_term_is_announced_once_per_node_until_the_connection_is_renewed() {
        let heard = Arc::new(Heard::default());
        let spec: NodeSpec = serde_yaml::from_str("name: n1\naddress: 127.0.0.1:2222\nhost_key: SHA256:abc\n").unwrap();
        let n = Node::new(0, spec, "127.0.0.1:2222".into(), heard.clone(), NodeState::default());
        assert_eq!(n.announced(), 0);
        assert!(n.announce("t1".into(), 3).await);
        assert_eq!(n.announced(), 3);
        n.set_announced(2);
        assert_eq!(n.announced(), 3, "an older term never lowers what was heard");
        n.set_announced(0);
        assert_eq!(n.announced(), 0, "a new connection forgets it");
        assert_eq!(*heard.0.lock().unwrap(), vec![("holds".to_string(), Some(3))]);
    }
}

/// The SSH client of each node (`serve.rs`; a reload replaces them): what a
/// leader's node loops are started with when it begins to act. Kept in step
/// with the fleet by [`AgentClients::keep`], the only way to change it.
#[derive(Default)]
pub(crate) struct AgentClients {
    by_node: Mutex<HashMap<String, Arc<nightshift_proto::ssh::client::AgentClient>>>,
}

impl AgentClients {
    /// Every node's client, by name.
    pub(crate) fn all(&self) -> Vec<(String, Arc<nightshift_proto::ssh::client::AgentClient>)> {
        self.lock().iter().map(|(n, c)| (n.clone(), c.clone())).collect()
    }

    /// Keep only the nodes `still` says are in the fleet, and put `fresh`'s
    /// clients in (new or changed nodes).
    pub(crate) fn keep(
        &self,
        still: impl Fn(&str) -> bool,
        fresh: impl IntoIterator<Item = (String, Arc<nightshift_proto::ssh::client::AgentClient>)>,
    ) {
        let mut held = self.lock();
        held.retain(|name, _| still(name));
        held.extend(fresh);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<nightshift_proto::ssh::client::AgentClient>>> {
        self.by_node.lock().unwrap_or_else(|e| e.into_inner())
    }
}
