//! The runs subsystem's state (issue 44, What to build #1): the run table
//! (runs in flight, the queue, what admission remembers between runs,
//! rebuilt from the audit log on start) and admission (a pure function of
//! the table, the manifest, the request and the time). A run's path — the
//! executor, the queue's pump, recovery, the tick, the breakers — is
//! `run/`, above `core`, which holds the table; one folder with both would
//! be a module cycle.

pub(crate) mod admission;
pub(crate) mod runtable;

use std::sync::{Mutex, MutexGuard};

/// The runs subsystem's state behind its own lock: the run table. `Core`
/// holds one.
pub(crate) struct Runs {
    table: Mutex<runtable::RunTable>,
}

impl Runs {
    pub(crate) fn new(table: runtable::RunTable) -> Runs {
        Runs { table: Mutex::new(table) }
    }

    /// The run table, locked: for the run's own path (`run/`) and what
    /// must see several runs at once under one lock. Who takes it is listed
    /// in `architecture.rs::RUN_TABLE_TAKERS`; a running script's host is
    /// not among them — it reaches its own run through the methods below.
    pub(crate) fn table(&self) -> MutexGuard<'_, runtable::RunTable> {
        crate::base::locks::lock(&self.table)
    }

    /// `f` of run `id`'s entry, or `None` once the run left the table.
    pub(crate) fn read_run<T>(&self, id: &str, f: impl FnOnce(&runtable::RunEntry) -> T) -> Option<T> {
        self.table().run(id).map(f)
    }

    /// `f` on run `id`'s entry, or `None` once the run left the table.
    pub(crate) fn update_run<T>(&self, id: &str, f: impl FnOnce(&mut runtable::RunEntry) -> T) -> Option<T> {
        self.table().run_mut(id).map(f)
    }

    /// The newest storm told about since `since_ms` that is the same shared
    /// cause as one of `symptom` over `nodes` (the same kind, more than half
    /// of them named), and then
    /// `told_now` remembered (the storm being told, if its record is
    /// durable): one look under one lock.
    pub(crate) fn shared_cause(
        &self,
        nodes: &std::collections::BTreeSet<String>,
        symptom: &str,
        since_ms: i64,
        told_now: Option<runtable::SharedCause>,
    ) -> Option<runtable::SharedCause> {
        let mut t = self.table();
        let told = t.shared_cause_told(nodes, symptom, since_ms);
        if let Some(c) = told_now {
            t.note_shared_cause(c);
        }
        told
    }

    /// How many runs of `key` started since `since_ms` (a runbook's
    /// `runs_within`).
    pub(crate) fn attempts_since(&self, key: &runtable::Key, since_ms: i64) -> usize {
        self.table().attempts_since(key, since_ms)
    }

    /// Lock `node` for the exclusive run `run`; `Err` names the exclusive
    /// run that holds it already.
    pub(crate) fn lock_node_for(&self, node: &str, run: &str) -> Result<(), String> {
        let mut t = self.table();
        match t.node_lock(node) {
            Some(holder) if holder != run => Err(holder.clone()),
            _ => {
                t.lock_node(node, run);
                Ok(())
            }
        }
    }

    /// Nodes asked of `pool`'s autoscaler so far (out minus in).
    pub(crate) fn autoscaled(&self, pool: &str) -> i64 {
        self.table().autoscaled(pool)
    }

    /// The autoscaler took `delta` nodes for `pool` (negative: gave back).
    pub(crate) fn autoscale_applied(&self, pool: &str, delta: i64) {
        self.table().autoscale_applied(pool, delta)
    }

    /// Whether the alert episode `event` belongs to has resolved.
    pub(crate) fn episode_resolved(&self, event: &serde_json::Value) -> bool {
        self.table().episode_resolved(event)
    }

    /// The alert episode `ep` resolved at `now` (kept a week).
    pub(crate) fn resolve_episode(&self, ep: String, now: i64) {
        self.table().resolve_episode(ep, now, runtable::RESOLVED_KEPT_MS)
    }

    /// Whether a run of `key` is queued, waiting or running.
    pub(crate) fn has_active(&self, key: &runtable::Key) -> bool {
        self.table().active_run(key).is_some()
    }

    /// The exclusive run holding `node`, if one does.
    pub(crate) fn node_lock(&self, node: &str) -> Option<String> {
        self.table().node_lock(node).cloned()
    }

    /// Runs waiting for a person's approval, oldest first.
    pub(crate) fn pending_approvals(&self) -> Vec<crate::runs::RunSummary> {
        self.table().pending_approvals()
    }

    /// The runbook of run `id` while it is in the table or has just left
    /// it ([`runtable::RunTable::runbook_of`]).
    pub(crate) fn runbook_of(&self, id: &str) -> Option<String> {
        self.table().runbook_of(id).map(str::to_string)
    }

    /// Whether this is the first report of the hold end `key` (it is
    /// remembered: a second report of the same end answers `false`).
    pub(crate) fn first_hold_end(&self, key: String) -> bool {
        self.table().first_hold_end(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exclusive run keeps its node; another is told who holds it; the
    /// holder may lock it again.
    #[test]
    fn a_node_locked_for_one_exclusive_run_is_refused_to_another() {
        let runs = Runs::new(runtable::RunTable::default());
        assert_eq!(runs.lock_node_for("n1", "r1"), Ok(()));
        assert_eq!(runs.lock_node_for("n1", "r2"), Err("r1".to_string()));
        assert_eq!(runs.lock_node_for("n1", "r1"), Ok(()));
        assert_eq!(runs.lock_node_for("n2", "r2"), Ok(()));
        assert_eq!(runs.read_run("r1", |_| ()), None, "no entry: the lock is not a run");
    }
}
