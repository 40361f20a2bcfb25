//! Counters the engine keeps for `/metrics`: events in, runs out, action
//! latency. Counted only through [`Counters`]' methods; read whole as a
//! [`CounterSnapshot`], plain data (what the web crate renders).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::locks::lock;

/// A plain count (each only goes up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    SamplesIngested,
    /// Alertmanager alerts received, duplicates included.
    AlertsReceived,
    AlertsDuplicate,
    AlertsUnknownNode,
    EventsDropped,
    EventsShed,
    /// Samples taken from Prometheus / exporters and mapped to the fleet.
    SourceSamples,
    /// Pulled samples ignored: other series, unknown hosts or GPUs, NaN.
    SourceIgnored,
    /// Pulls that failed (unreachable, bad response).
    SourceErrors,
    TriggersFired,
    /// Faults the health model recorded (new `faulted` states).
    FaultsSeen,
    /// GPUs' evidence evaluated against their health (every reading).
    HealthEvaluations,
    RunsSuppressed,
    /// Runs cancelled so a critical run could go first.
    RunsPreempted,
    /// Full-chain verify walks this engine ran (the API serves a report
    /// again while the head stays).
    VerifyWalks,
}

const COUNTS: usize = Count::VerifyWalks as usize + 1;

/// Counters for `/metrics`, changed only through their methods.
#[derive(Debug, Default)]
pub struct Counters {
    counts: [AtomicU64; COUNTS],
    /// Faults offered to each fault runbook.
    fault_offers: Mutex<BTreeMap<String, u64>>,
    runs_by_outcome: Mutex<HashMap<&'static str, u64>>,
    /// What scripts told people, by (runbook, `notification` | `escalation`
    /// | `repeat_noted` — a finding said again, kept as a note).
    told: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Alerts each alert-triggered runbook looked at (its alertname matched).
    alert_evaluations: Mutex<HashMap<String, u64>>,
    action_latency: Mutex<Histogram>,
    /// PostgreSQL backend: from taking the lease to acting (caught up,
    /// recovered, loops started), in ms; 0 until this engine led.
    failover_ms: AtomicU64,
}

impl Counters {
    /// `n` more of `c`.
    pub(crate) fn add(&self, c: Count, n: u64) {
        self.counts[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self, c: Count) -> u64 {
        self.counts[c as usize].load(Ordering::Relaxed)
    }

    /// A fault was offered to `runbook`.
    pub(crate) fn offered(&self, runbook: &str) {
        *lock(&self.fault_offers).entry(runbook.to_string()).or_default() += 1;
    }

    /// A run ended with `outcome`.
    pub(crate) fn ended(&self, outcome: &'static str) {
        *lock(&self.runs_by_outcome).entry(outcome).or_default() += 1;
    }

    /// `runbook`'s script told people (`what`: notification, escalation,
    /// repeat_noted).
    pub(crate) fn told(&self, runbook: &str, what: &'static str) {
        *lock(&self.told).entry((runbook.to_string(), what)).or_default() += 1;
    }

    /// An alert with `runbook`'s alertname was looked at.
    pub(crate) fn alert_evaluated(&self, runbook: &str) {
        *lock(&self.alert_evaluations).entry(runbook.to_string()).or_default() += 1;
    }

    /// An action's reply came `secs` after it was sent.
    pub(crate) fn action_took(&self, secs: f64) {
        lock(&self.action_latency).observe(secs);
    }

    /// This engine took over as leader and acted `ms` after taking the lease.
    pub(crate) fn set_failover_ms(&self, ms: u64) {
        self.failover_ms.store(ms, Ordering::SeqCst);
    }

    pub(crate) fn failover_ms(&self) -> u64 {
        self.failover_ms.load(Ordering::SeqCst)
    }

    /// Alerts looked at, by runbook.
    pub(crate) fn alert_evaluations(&self) -> HashMap<String, u64> {
        lock(&self.alert_evaluations).clone()
    }

    /// Faults offered, by runbook.
    pub(crate) fn fault_offers(&self) -> BTreeMap<String, u64> {
        lock(&self.fault_offers).clone()
    }

    /// Every counter now, as plain data.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            samples_ingested: self.get(Count::SamplesIngested),
            alerts_received: self.get(Count::AlertsReceived),
            alerts_duplicate: self.get(Count::AlertsDuplicate),
            alerts_unknown_node: self.get(Count::AlertsUnknownNode),
            events_dropped: self.get(Count::EventsDropped),
            events_shed: self.get(Count::EventsShed),
            source_samples: self.get(Count::SourceSamples),
            source_ignored: self.get(Count::SourceIgnored),
            source_errors: self.get(Count::SourceErrors),
            triggers_fired: self.get(Count::TriggersFired),
            faults_seen: self.get(Count::FaultsSeen),
            health_evaluations: self.get(Count::HealthEvaluations),
            runs_suppressed: self.get(Count::RunsSuppressed),
            runs_preempted: self.get(Count::RunsPreempted),
            verify_walks: self.get(Count::VerifyWalks),
            fault_offers: self.fault_offers(),
            runs_by_outcome: lock(&self.runs_by_outcome).iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            told: lock(&self.told).iter().map(|((rb, what), n)| ((rb.clone(), what.to_string()), *n)).collect(),
            alert_evaluations: lock(&self.alert_evaluations).iter().map(|(k, v)| (k.clone(), *v)).collect(),
            action_latency: lock(&self.action_latency).clone(),
            failover_ms: self.failover_ms(),
        }
    }
}

/// The engine's counters at one moment (`Engine::counters`): plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CounterSnapshot {
    pub samples_ingested: u64,
    /// Alertmanager alerts received, duplicates included.
    pub alerts_received: u64,
    /// Alerts dropped as repeats of a fingerprint and startsAt.
    pub alerts_duplicate: u64,
    pub alerts_unknown_node: u64,
    pub events_dropped: u64,
    pub events_shed: u64,
    pub source_samples: u64,
    pub source_ignored: u64,
    pub source_errors: u64,
    pub triggers_fired: u64,
    pub faults_seen: u64,
    pub health_evaluations: u64,
    pub runs_suppressed: u64,
    pub runs_preempted: u64,
    pub verify_walks: u64,
    /// Faults offered, by fault runbook.
    pub fault_offers: BTreeMap<String, u64>,
    /// Finished runs by outcome (`succeeded`, `failed`, …).
    pub runs_by_outcome: BTreeMap<String, u64>,
    /// What runbooks told people, by (runbook, kind).
    pub told: BTreeMap<(String, String), u64>,
    /// Alerts looked at, by alert-triggered runbook.
    pub alert_evaluations: BTreeMap<String, u64>,
    /// Time from sending an action to the agent's reply.
    pub action_latency: Histogram,
    /// From taking the lease to acting, ms (0 until this engine led).
    pub failover_ms: u64,
}

/// A latency histogram (seconds), Prometheus-style cumulative buckets.
#[derive(Debug, Clone, PartialEq)]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each count lands in its own field of the snapshot, and the keyed
    /// ones by their key.
    #[test]
    fn a_snapshot_shows_each_count_where_it_was_counted() {
        let c = Counters::default();
        c.add(Count::AlertsReceived, 3);
        c.add(Count::AlertsDuplicate, 1);
        c.add(Count::VerifyWalks, 2);
        c.offered("gpu-fault");
        c.ended("succeeded");
        c.ended("succeeded");
        c.told("gpu-fault", "escalation");
        c.alert_evaluated("gpu-overheat");
        c.action_took(0.003);
        c.set_failover_ms(1_500);
        let s = c.snapshot();
        assert_eq!((s.alerts_received, s.alerts_duplicate, s.verify_walks, s.samples_ingested), (3, 1, 2, 0));
        assert_eq!(s.fault_offers.get("gpu-fault"), Some(&1));
        assert_eq!(s.runs_by_outcome.get("succeeded"), Some(&2));
        assert_eq!(s.told.get(&("gpu-fault".to_string(), "escalation".to_string())), Some(&1));
        assert_eq!(s.alert_evaluations.get("gpu-overheat"), Some(&1));
        assert_eq!((s.action_latency.count, s.action_latency.counts[1], s.action_latency.counts[0]), (1, 0, 0));
        assert_eq!(s.action_latency.counts[2], 1, "3 ms is in the 5 ms bucket");
        assert_eq!(s.failover_ms, 1_500);
    }
}
