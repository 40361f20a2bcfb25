//! Counters the engine keeps for `/metrics`: events in, runs out, action
//! latency.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub samples_ingested: AtomicU64,
    pub alerts_received: AtomicU64,
    pub alerts_duplicate: AtomicU64,
    pub alerts_unknown_node: AtomicU64,
    pub events_dropped: AtomicU64,
    pub events_shed: AtomicU64,
    /// Samples taken from Prometheus / exporters and mapped to the fleet.
    pub source_samples: AtomicU64,
    /// Pulled samples ignored: other series, unknown hosts or GPUs, NaN.
    pub source_ignored: AtomicU64,
    /// Pulls that failed (unreachable, bad response).
    pub source_errors: AtomicU64,
    pub triggers_fired: AtomicU64,
    /// Faults the health model recorded (new `faulted` states).
    pub faults_seen: AtomicU64,
    /// GPUs' evidence evaluated against their health (every reading).
    pub health_evaluations: AtomicU64,
    /// Faults offered to each fault runbook.
    pub fault_offers: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    pub runs_suppressed: AtomicU64,
    /// Runs cancelled so a critical run could go first.
    pub runs_preempted: AtomicU64,
    pub runs_by_outcome: Mutex<HashMap<&'static str, u64>>,
    /// What scripts told people, by (runbook, `notification` | `escalation`
    /// | `repeat_noted` — a finding said again, kept as a note).
    pub told: Mutex<std::collections::BTreeMap<(String, &'static str), u64>>,
    /// Alerts each alert-triggered runbook looked at (its alertname matched).
    pub alert_evaluations: Mutex<HashMap<String, u64>>,
    pub action_latency: Mutex<Histogram>,
    /// PostgreSQL backend: from taking the lease to acting (caught up,
    /// recovered, loops started), in ms; 0 until this engine led.
    pub failover_ms: AtomicU64,
    /// Full-chain verify walks this engine ran (the API serves a report
    /// again while the head stays).
    pub verify_walks: AtomicU64,
}

/// A latency histogram (seconds), Prometheus-style cumulative buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        let bounds = vec![0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
        Histogram { counts: vec![0; bounds.len()], bounds, sum: 0.0, count: 0 }
    }
}

impl Histogram {
    pub fn observe(&mut self, secs: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if secs <= *b {
                *c += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }
}
