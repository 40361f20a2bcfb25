//! The scheduler's view of work on a simulated fleet, as hard as a real
//! one: a drain (Slurm `DRAIN`, `kubectl cordon`) stops *new* work, not the
//! jobs already running — a drained node keeps its load until those jobs
//! end (`jobs_end_after_drain_secs`, 20 minutes unless a scenario says
//! otherwise) or are moved off with `requeue`, then idles. A pool's total work spreads over its nodes that
//! take new work; other nodes keep their own load. Scenarios and the demo
//! drive the sim agents' utilisation through it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use nightshift_agent::service::Agent;
use nightshift_proto::{Op, Request, SimFault};

use nightshift_engine::engine::Engine;

/// A pool's total work, in GPU-percent (300 = three fully busy nodes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolLoad {
    pub label: String,
    pub value: String,
    pub total_util_pct: f64,
}

/// How long the jobs running on a node go on after it is drained.
pub const DEFAULT_JOBS_END_AFTER_DRAIN_SECS: u64 = 1200;

/// Desired utilisation per node, applied to sim agents when it changes.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    desired: BTreeMap<String, f64>,
    pools: Vec<PoolLoad>,
    last_sent: BTreeMap<String, f64>,
    /// Request ids must never repeat (agents journal them).
    sent: u64,
    /// Per node: when its jobs end once drained (default
    /// [`DEFAULT_JOBS_END_AFTER_DRAIN_SECS`]).
    jobs_end_after_drain_secs: BTreeMap<String, u64>,
    /// Per drained node: (when the drain was first seen, the load its jobs
    /// had then).
    draining: BTreeMap<String, (i64, f64)>,
}

impl Workload {
    /// Start from each node's own utilisation.
    pub fn new(base: BTreeMap<String, f64>) -> Workload {
        Workload { last_sent: base.clone(), desired: base, ..Workload::default() }
    }

    /// How long `node`'s running jobs go on after a drain.
    pub fn set_jobs_end_after_drain(&mut self, node: &str, secs: u64) {
        self.jobs_end_after_drain_secs.insert(node.to_string(), secs);
    }

    /// A node's own load (outside any pool model).
    pub fn set_node(&mut self, node: &str, util_pct: f64) {
        self.desired.insert(node.to_string(), util_pct);
        self.last_sent.insert(node.to_string(), util_pct);
    }

    /// Set (or replace) a pool's total work.
    pub fn set_pool(&mut self, p: PoolLoad) {
        self.pools.retain(|x| !(x.label == p.label && x.value == p.value));
        self.pools.push(p);
    }

    /// Push the utilisation each node should have now to its sim agent.
    pub async fn apply(&mut self, engine: &Engine, agents: &BTreeMap<String, Arc<Agent>>) {
        let views = engine.nodes();
        let now = nightshift_proto::clock::Clock::now_ms(engine.clock().as_ref());
        for v in &views {
            let Some(agent) = agents.get(&v.name) else { continue };
            let pool = self.pools.iter().find(|p| v.labels.get(&p.label) == Some(&p.value));
            let sim = agent.backend().sim();
            if !v.state.drained {
                self.draining.remove(&v.name);
                if let Some(sim) = sim {
                    sim.clear_requeued();
                }
            } else if !self.draining.contains_key(&v.name) {
                let running = self.last_sent.get(&v.name).copied().unwrap_or(0.0);
                self.draining.insert(v.name.clone(), (now, running));
            }
            let util = if let Some((since, running)) = self.draining.get(&v.name) {
                let lasts =
                    self.jobs_end_after_drain_secs.get(&v.name).copied().unwrap_or(DEFAULT_JOBS_END_AFTER_DRAIN_SECS)
                        as i64
                        * 1000;
                // The drain stops new work; the running jobs go on until
                // they end or are requeued elsewhere.
                let requeued = sim.is_some_and(|s| s.jobs_requeued());
                if now.saturating_sub(*since) < lasts && !requeued { *running } else { 0.0 }
            } else if let Some(p) = pool {
                let active = views
                    .iter()
                    .filter(|n| n.labels.get(&p.label) == Some(&p.value) && !n.state.drained && n.state.connected)
                    .count()
                    .max(1);
                (p.total_util_pct / active as f64).min(100.0)
            } else {
                self.desired.get(&v.name).copied().unwrap_or(85.0)
            };
            if self.last_sent.get(&v.name) != Some(&util) {
                self.last_sent.insert(v.name.clone(), util);
                self.sent += 1;
                let req = Request::new(
                    format!("workload-{}", self.sent),
                    Op::SimFault(SimFault::Load { gpu: None, util_pct: util }),
                );
                let r = agent.handle(req).await;
                if !r.ok {
                    tracing::warn!(node = %v.name, error = ?r.error, "workload change refused");
                }
            }
        }
    }
}
