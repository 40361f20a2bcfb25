//! The run table's entries, its queue, admission's active keys and the
//! breakers — read and changed only through these methods (a child
//! module: the fields are the table's own). A run enters with its key
//! ([`RunTable::activate`]) and leaves with it ([`RunTable::forget_run`]),
//! so no caller can leave a key naming a run that is gone.

use std::collections::BTreeSet;

use super::{Breaker, Key, RunEntry, RunTable, SharedCause};

/// How many runs that left the table [`RunTable::runbook_of`] still knows.
pub(crate) const RECENT_RUNS: usize = 4096;

impl RunTable {
    /// The active run `id` (queued, pending approval or running).
    pub(crate) fn run(&self, id: &str) -> Option<&RunEntry> {
        self.runs.get(id)
    }

    /// The active run `id`, to change.
    pub(crate) fn run_mut(&mut self, id: &str) -> Option<&mut RunEntry> {
        self.runs.get_mut(id)
    }

    /// Every active run, in no order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &RunEntry> {
        self.runs.values()
    }

    /// Every active run, to change, in no order.
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut RunEntry> {
        self.runs.values_mut()
    }

    /// Run `entry` is active as `key`'s run: admission sees it from now.
    /// Queuing it is [`RunTable::enqueue`]'s.
    pub(crate) fn activate(&mut self, key: Key, entry: RunEntry) {
        self.active_by_key.insert(key, entry.summary.id.clone());
        self.runs.insert(entry.summary.id.clone(), entry);
    }

    /// Run `id` leaves the table: its entry, its place in the queue, and
    /// its key if the key still names it (a later run of the key keeps
    /// its own).
    pub(crate) fn forget_run(&mut self, id: &str) -> Option<RunEntry> {
        let e = self.runs.remove(id)?;
        let (runbooks, order) = &mut self.recent_runbooks;
        if runbooks.insert(id.to_string(), e.summary.runbook.clone()).is_none() {
            order.push_back(id.to_string());
        }
        while order.len() > RECENT_RUNS
            && let Some(old) = order.pop_front()
        {
            runbooks.remove(&old);
        }
        self.queue.retain(|q| q != id);
        let key = RunTable::key(&e.summary);
        if self.active_by_key.get(&key).is_some_and(|a| a == id) {
            self.active_by_key.remove(&key);
        }
        Some(e)
    }

    /// The runbook of run `id` while it is in the table or one of the last
    /// [`RECENT_RUNS`] to leave it (what an agent reports about a hold
    /// names its run, mostly one that just ended; older ones are the
    /// chain's to say).
    pub(crate) fn runbook_of(&self, id: &str) -> Option<&str> {
        match self.runs.get(id) {
            Some(e) => Some(&e.summary.runbook),
            None => self.recent_runbooks.0.get(id).map(String::as_str),
        }
    }

    /// The run ids waiting to start, in start order.
    pub(crate) fn queue(&self) -> &[String] {
        &self.queue
    }

    /// The queued runs' entries, in start order.
    pub(crate) fn queued_entries(&self) -> impl Iterator<Item = &RunEntry> {
        self.queue.iter().filter_map(|id| self.runs.get(id))
    }

    /// Take the `i`th queued run out of the queue (it starts).
    pub(crate) fn dequeue_at(&mut self, i: usize) -> String {
        self.queue.remove(i)
    }

    /// The active run of `key`, if any (admission's "one run per key").
    pub(crate) fn active_run(&self, key: &Key) -> Option<&String> {
        self.active_by_key.get(key)
    }

    /// Runbook `name`'s breaker, if it ever counted a fire.
    pub(crate) fn breaker(&self, name: &str) -> Option<&Breaker> {
        self.breakers.get(name)
    }

    /// Runbook `name`'s breaker, to change, if it ever counted a fire.
    pub(crate) fn breaker_mut(&mut self, name: &str) -> Option<&mut Breaker> {
        self.breakers.get_mut(name)
    }

    /// Runbook `name`'s breaker, made empty the first time.
    pub(crate) fn breaker_or_new(&mut self, name: &str) -> &mut Breaker {
        self.breakers.entry(name.to_string()).or_default()
    }

    /// The newest storm of the same kind of symptom told about since
    /// `since_ms` that names more than half of `nodes`: the same shared
    /// cause (one rack's cooling seen by the trend runbook, then by the
    /// over-temperature one). A storm of another kind over the same nodes
    /// (a bad push on the rack whose cooling failed this morning) is not.
    /// Older storms are forgotten.
    pub(crate) fn shared_cause_told(
        &mut self,
        nodes: &BTreeSet<String>,
        symptom: &str,
        since_ms: i64,
    ) -> Option<SharedCause> {
        while self.shared_causes.front().is_some_and(|c| c.ts_ms < since_ms) {
            self.shared_causes.pop_front();
        }
        self.shared_causes
            .iter()
            .rev()
            .find(|c| c.symptom == symptom && c.nodes.intersection(nodes).count() * 2 > nodes.len())
            .cloned()
    }

    /// Remember a storm a breaker told about.
    pub(crate) fn note_shared_cause(&mut self, c: SharedCause) {
        self.shared_causes.push_back(c);
    }
}

/// A queued run of `key` named `id` (tests: admission's cases need an
/// active run of a key).
#[cfg(test)]
pub(crate) fn test_entry(id: &str, key: &Key) -> RunEntry {
    let s: crate::runs::RunSummary = serde_json::from_value(serde_json::json!({
        "id": id, "runbook": key.0, "target": key.1, "trigger": "manual", "event": null,
        "params": {}, "dry_run": false, "requested_by": "engine", "state": "queued", "why": "",
        "created_ms": 0, "actions": 0,
    }))
    .expect("a run summary");
    let m = crate::runbooks::manifest::Manifest::parse(
        "version: 1\nname: rb\ndescription: d\nscript: rb.rhai\ntrigger:\n  type: manual\nscope: node\n",
        std::path::Path::new("rb.yaml"),
    )
    .expect("a manifest");
    RunEntry::new(s, &m)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::audit::{AuditRecord, RecordKind};
    use crate::runs::Target;

    fn entry(id: &str, node: &str) -> RunEntry {
        test_entry(id, &("rb".into(), Target { node: Some(node.into()), gpu: None, group: None }))
    }

    /// A run leaves with its key, but a later run of the same key keeps
    /// the key it was given.
    #[test]
    fn a_run_leaves_with_its_key_and_leaves_a_later_runs_key_alone() {
        let mut t = RunTable::new(16);
        let a = entry("a", "n1");
        let key = RunTable::key(&a.summary);
        t.activate(key.clone(), a);
        t.enqueue("a".into(), crate::runbooks::manifest::Priority::Normal);
        assert_eq!(t.active_run(&key).map(String::as_str), Some("a"));
        assert_eq!(t.queue(), ["a".to_string()]);
        assert!(t.forget_run("a").is_some());
        assert_eq!((t.active_run(&key), t.queue().len(), t.run("a").is_none()), (None, 0, true));

        // "b" took the key while "a" was still in the table (a restart's
        // resumed run beside a new one): "a" leaving leaves "b"'s key.
        t.activate(key.clone(), entry("a", "n1"));
        t.activate(key.clone(), entry("b", "n1"));
        t.forget_run("a");
        assert_eq!(t.active_run(&key).map(String::as_str), Some("b"));
        assert!(t.forget_run("nobody").is_none());
    }

    /// A run's runbook is known while the run is in the table and after it
    /// left, for the last [`RECENT_RUNS`] to leave — the oldest forgotten
    /// first, a run that leaves twice counted once.
    #[test]
    fn the_runbook_of_a_run_is_known_for_the_last_runs_to_leave() {
        let mut t = RunTable::new(16);
        let run = |t: &mut RunTable, id: &str| {
            let mut e = entry(id, "n1");
            e.summary.runbook = format!("rb-{id}");
            t.activate(RunTable::key(&e.summary), e);
        };
        run(&mut t, "a");
        assert_eq!(t.runbook_of("a"), Some("rb-a"), "in the table");
        t.forget_run("a");
        assert_eq!(t.runbook_of("a"), Some("rb-a"), "just left");
        run(&mut t, "a");
        t.forget_run("a");
        for i in 0..RECENT_RUNS - 1 {
            run(&mut t, &format!("r{i}"));
            t.forget_run(&format!("r{i}"));
        }
        assert_eq!(t.runbook_of("a"), Some("rb-a"), "the oldest of the last {RECENT_RUNS}");
        run(&mut t, "last");
        t.forget_run("last");
        assert_eq!(t.runbook_of("a"), None, "one more left after it");
        assert_eq!(t.runbook_of("r0"), Some("rb-r0"));
        assert_eq!(t.runbook_of("last"), Some("rb-last"));
        assert_eq!(t.recent_runbooks.0.len(), RECENT_RUNS);
        assert_eq!(t.runbook_of("nobody"), None);
    }

    /// A `breaker_tripped` record of the runbook `trend`.
    fn rec(seq: u64, ts_ms: i64, data: Value) -> AuditRecord {
        let mut r = super::super::tests::rec(seq, ts_ms, RecordKind::BreakerTripped, data);
        (r.run, r.node, r.gpu, r.runbook) = (None, None, None, Some("trend".into()));
        r
    }

    /// A storm told about is the same shared cause for a later storm of the
    /// same kind of symptom over more than half of its nodes, within the
    /// window, across a restart (rebuilt from `breaker_tripped`'s nodes and
    /// symptom); a storm elsewhere, of another kind, or after the window is
    /// new.
    #[test]
    fn a_storm_over_the_nodes_of_one_told_is_the_same_shared_cause() {
        let mut t = RunTable::default();
        let tripped = json!({"reason": "r7", "tripped_until_ms": 70_000, "nodes": ["a", "b", "c", "e"], "symptom": "temperature"});
        t.replay(&rec(7, 10_000, tripped), &|_| true);
        let set = |ns: &[&str]| ns.iter().map(|n| n.to_string()).collect::<BTreeSet<String>>();
        let told = t.shared_cause_told(&set(&["b", "c", "d", "e"]), "temperature", 0).expect("three of four named");
        assert_eq!((told.seq, told.runbook.as_str()), (7, "trend"));
        assert!(t.shared_cause_told(&set(&["b", "c", "d", "e"]), "H5", 0).is_none(), "a push on that rack is new");
        let half = t.shared_cause_told(&set(&["c", "d", "x", "y"]), "temperature", 0);
        assert!(half.is_none(), "half is not more than half");
        assert!(t.shared_cause_told(&set(&["x", "y", "z", "w"]), "temperature", 0).is_none(), "another rack");
        // A trip recorded before nodes were (an older chain) names none, and
        // one without a symptom is its runbook's own kind.
        t.replay(&rec(8, 11_000, json!({"tripped_until_ms": 70_000})), &|_| true);
        t.replay(&rec(9, 12_000, json!({"tripped_until_ms": 70_000, "nodes": ["p", "q"]})), &|_| true);
        assert_eq!(t.shared_cause_told(&set(&["b", "c", "d"]), "temperature", 0).map(|c| c.seq), Some(7));
        assert_eq!(t.shared_cause_told(&set(&["p", "q"]), "runbook trend", 0).map(|c| c.seq), Some(9));
        // Forgotten once older than the window.
        assert!(t.shared_cause_told(&set(&["a", "b", "c"]), "temperature", 10_001).is_none());
        let overheat = SharedCause {
            seq: 10,
            ts_ms: 20_000,
            runbook: "overheat".into(),
            symptom: "temperature".into(),
            nodes: set(&["a", "b"]),
        };
        t.note_shared_cause(overheat);
        assert_eq!(t.shared_cause_told(&set(&["a", "b", "c"]), "temperature", 10_001).map(|c| c.seq), Some(10));
    }
}
