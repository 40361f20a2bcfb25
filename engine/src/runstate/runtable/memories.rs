//! The run table's smaller memories — how many runs of a runbook run,
//! drains in flight, schedules, alerts seen and handled, hold ends seen,
//! releases to retry, the autoscaler's requests, held-back alerts — each
//! changed only through these methods (a child module: the fields are the
//! table's own).

use super::{AlertDurable, Key, RunTable, WaitingAlert};
use crate::runs::RunSummary;

/// The table's smaller memories, each changed only through these (the run
/// entries, the queue and admission's keys are still the table's fields).
impl RunTable {
    /// When the last run of `key` that did its work finished (its
    /// cooldown counts from there).
    pub(crate) fn last_finished(&self, key: &Key) -> Option<i64> {
        self.last_finished.get(key).copied()
    }

    /// A run of `key` finished at `now`: its cooldown starts.
    pub(crate) fn finished(&mut self, key: Key, now: i64) {
        self.last_finished.insert(key, now);
    }

    /// Whether `key`'s suppression was already audited in this episode.
    pub(crate) fn suppression_noted(&self, key: &Key) -> bool {
        self.suppression_noted.contains(key)
    }

    /// `key`'s suppression is audited (the episode's first).
    pub(crate) fn note_suppression(&mut self, key: Key) {
        self.suppression_noted.insert(key);
    }

    /// A run of `key` was admitted at `now`: an attempt against its daily
    /// budget, and a new episode for its suppressions.
    pub(crate) fn admitted(&mut self, key: &Key, now: i64) {
        self.attempts.entry(key.clone()).or_default().push_back(now);
        self.suppression_noted.remove(key);
    }

    /// Runs of `key` admitted at `since` or later.
    pub(crate) fn attempts_since(&self, key: &Key, since: i64) -> usize {
        self.attempts.get(key).map_or(0, |q| q.iter().filter(|ts| **ts >= since).count())
    }

    /// How many runs are running.
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// The exclusive run holding `node`, if one does.
    pub(crate) fn node_lock(&self, node: &str) -> Option<&String> {
        self.node_locks.get(node)
    }

    /// Exclusive run `run` holds `node` (it may already).
    pub(crate) fn lock_node(&mut self, node: &str, run: &str) {
        self.node_locks.insert(node.to_string(), run.to_string());
    }

    /// Every node exclusive run `run` holds is free again.
    pub(crate) fn unlock_nodes_of(&mut self, run: &str) {
        self.node_locks.retain(|_, holder| holder != run);
    }

    /// How many runs of `runbook` are running.
    pub(crate) fn running_of(&self, runbook: &str) -> usize {
        self.running_per_runbook.get(runbook).copied().unwrap_or(0)
    }

    /// A run of `runbook` starts running.
    pub(crate) fn start_running(&mut self, runbook: &str) {
        self.running += 1;
        *self.running_per_runbook.entry(runbook.to_string()).or_default() += 1;
    }

    /// A run of `runbook` stops running.
    pub(crate) fn stop_running(&mut self, runbook: &str) {
        self.running = self.running.saturating_sub(1);
        if let Some(c) = self.running_per_runbook.get_mut(runbook) {
            *c = c.saturating_sub(1);
        }
    }

    /// Nodes whose drain is in flight (the blast radius counts them out).
    pub(crate) fn drains_in_flight(&self) -> impl Iterator<Item = &String> {
        self.drains_in_flight.iter()
    }

    /// A drain of `node` is in flight (the blast radius reserved it).
    pub(crate) fn reserve_drain(&mut self, node: &str) {
        self.drains_in_flight.insert(node.to_string());
    }

    /// The drain of `node` is no longer in flight (done or given up).
    pub(crate) fn drain_ended(&mut self, node: &str) {
        self.drains_in_flight.remove(node);
    }

    /// Whether scheduled runbook `runbook` is due at `now` (every
    /// `every_ms`, the first one `every_ms` after it was first asked); when
    /// it is, the next is `every_ms` on.
    pub(crate) fn schedule_due(&mut self, runbook: &str, now: i64, every_ms: i64) -> bool {
        let next = self.schedule_next.entry(runbook.to_string()).or_insert(now.saturating_add(every_ms));
        if *next <= now {
            *next = now.saturating_add(every_ms);
            true
        } else {
            false
        }
    }

    /// Whether the alert `key` (`alert_key`) was seen: by this engine or,
    /// rebuilt on start, a previous one.
    pub(crate) fn alert_seen(&self, key: &str) -> bool {
        self.alerts_seen.contains(key)
    }

    /// The alert `key` is seen now.
    pub(crate) fn see_alert(&mut self, key: String) {
        self.alerts_seen.insert(key);
    }

    /// Until when the seen alert `key`'s record is not yet durable, if it
    /// is not: what a duplicate's answer waits for.
    pub(crate) fn alert_pending(&self, key: &str) -> Option<AlertDurable> {
        self.alerts_pending.get(key).cloned()
    }

    /// The alert `key`'s record becomes durable with `d`, or (`None`) is.
    pub(crate) fn alert_durable(&mut self, key: &str, d: Option<AlertDurable>) {
        match d {
            Some(d) => {
                self.alerts_pending.insert(key.to_string(), d);
            }
            None => {
                self.alerts_pending.remove(key);
            }
        }
    }

    /// Whether the alert `key` was handled (its `event_handled` is on the
    /// chain).
    pub(crate) fn alert_handled(&self, key: &str) -> bool {
        self.handled.contains(key)
    }

    /// The alert episode `ep` resolved at `now`, remembered `kept_ms`.
    pub(crate) fn resolve_episode(&mut self, ep: String, now: i64, kept_ms: i64) {
        self.resolved.insert_at(ep, now, kept_ms);
    }

    /// Whether the hold end `key` is new (then it is seen from now on).
    pub(crate) fn first_hold_end(&mut self, key: String) -> bool {
        self.holds_ended.insert(key)
    }

    /// A run's holds on `node` to release again later (the release failed
    /// or the node is not reachable).
    pub(crate) fn release_later(&mut self, s: RunSummary, node: String) {
        self.pending_releases.push((s, node));
    }

    /// The releases to try now — those on nodes `ready` says are — taken
    /// out; the rest wait.
    pub(crate) fn releases_due(&mut self, ready: impl Fn(&str) -> bool) -> Vec<(RunSummary, String)> {
        let (due, wait): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending_releases).into_iter().partition(|(_, node)| ready(node));
        self.pending_releases = wait;
        due
    }

    /// Nodes nightshift asked the autoscaler for in `pool` and has not given
    /// back.
    pub(crate) fn autoscaled(&self, pool: &str) -> i64 {
        self.autoscaled.get(pool).copied().unwrap_or(0)
    }

    /// The autoscaler applied a change of `delta` nodes in `pool`.
    pub(crate) fn autoscale_applied(&mut self, pool: &str, delta: i64) {
        let e = self.autoscaled.entry(pool.to_string()).or_default();
        *e = (*e + delta).max(0);
    }

    /// Firing alert `w`, held back by active run `run`, waits for it (the
    /// latest one a run held back).
    pub(crate) fn hold_alert(&mut self, run: String, w: WaitingAlert) {
        self.waiting_alerts.insert(run, w);
    }

    /// The alert run `run` held back, taken out.
    pub(crate) fn take_waiting_alert(&mut self, run: &str) -> Option<WaitingAlert> {
        self.waiting_alerts.remove(run)
    }

    /// The alerts whose offer a replayed log owes (each with the run that
    /// held it back and how that run ended), taken out — but those whose
    /// alert has resolved since: an offer dropped without a record would
    /// otherwise come back at every restart for as long as the log holds it.
    pub(crate) fn take_owed_offers(&mut self) -> Vec<(WaitingAlert, String, crate::runs::RunOutcome)> {
        let owed = std::mem::take(&mut self.owed_offers);
        owed.into_iter()
            .filter(|(_, (w, _))| !self.episode_resolved(&w.event))
            .map(|(run, (w, outcome))| (w, run, outcome))
            .collect()
    }
}
