//! The run table's entries, its queue, admission's active keys and the
//! breakers — read and changed only through these methods (a child
//! module: the fields are the table's own). A run enters with its key
//! ([`RunTable::activate`]) and leaves with it ([`RunTable::forget_run`]),
//! so no caller can leave a key naming a run that is gone.

use super::{Breaker, Key, RunEntry, RunTable};

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
        self.queue.retain(|q| q != id);
        let key = RunTable::key(&e.summary);
        if self.active_by_key.get(&key).is_some_and(|a| a == id) {
            self.active_by_key.remove(&key);
        }
        Some(e)
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
    use super::*;
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
}
