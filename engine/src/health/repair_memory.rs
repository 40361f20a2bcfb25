//! [`RepairMemory`]: what the repair loop (`repair.rs`) remembers between
//! readings — not health state (that is `health/mod.rs`'s model, the fold of
//! the chain), but its pacing: when a pending fault was last offered or
//! taken, whom it told, when a GPU's health check last ran. Kept apart from
//! the loop so the engine core holds it without depending on the loop.

use std::collections::{BTreeMap, BTreeSet};

/// Pacing for the repair loop (`repair.rs`), its fields its own.
#[derive(Debug, Default)]
pub struct RepairMemory {
    /// (node, gpu) → when its pending fault was last offered.
    tried: BTreeMap<(String, u32), i64>,
    /// (node, gpu, fault seen) already told about a suppression or a
    /// missing runbook.
    told: BTreeSet<(String, u32, i64)>,
    /// (node, gpu) → when its health check last ran.
    checked: BTreeMap<(String, u32), i64>,
    /// (node, gpu) → when a run last took its pending fault.
    ran: BTreeMap<(String, u32), i64>,
    /// (node, gpu, fault seen, runbook) a shadow run already answered.
    shadowed: BTreeSet<(String, u32, i64, String)>,
    /// (node, gpu, fault seen) a person was told was put back in service by
    /// hand before its repair.
    resumed_told: BTreeSet<(String, u32, i64)>,
}

impl RepairMemory {
    /// Whether the pending fault of (`node`, `gpu`) may be offered at `now`:
    /// `after_run_ms` after a run last took it, else `pending_ms` after it
    /// was last offered. When it may, it counts as offered now.
    pub(crate) fn offer_due(&mut self, node: &str, gpu: u32, now: i64, after_run_ms: i64, pending_ms: i64) -> bool {
        let key = (node.to_string(), gpu);
        let pause = if self.ran.get(&key).is_some_and(|t| now.saturating_sub(*t) < after_run_ms) {
            after_run_ms
        } else {
            pending_ms
        };
        if self.tried.get(&key).is_some_and(|t| now.saturating_sub(*t) < pause) {
            return false;
        }
        self.tried.insert(key, now);
        true
    }

    /// A run took the pending fault of (`node`, `gpu`) at `now`; `shadow`:
    /// a shadow run of that runbook, for that fault (answered once).
    pub(crate) fn ran(&mut self, node: &str, gpu: u32, now: i64, shadow: Option<(String, u32, i64, String)>) {
        self.ran.insert((node.to_string(), gpu), now);
        if let Some(k) = shadow {
            self.shadowed.insert(k);
        }
    }

    /// Whether a shadow run of this runbook already answered this fault.
    pub(crate) fn shadow_answered(&self, k: &(String, u32, i64, String)) -> bool {
        self.shadowed.contains(k)
    }

    /// Whether this is the first time a person is told about the fault
    /// (`node`, `gpu`, seen at `seen_ms`) — a suppression or no runbook.
    pub(crate) fn first_telling(&mut self, node: &str, gpu: u32, seen_ms: i64) -> bool {
        self.told.insert((node.to_string(), gpu, seen_ms))
    }

    /// Whether this is the first time a person is told the node was put
    /// back in service by hand before this fault's repair.
    pub(crate) fn first_resume_telling(&mut self, node: &str, gpu: u32, seen_ms: i64) -> bool {
        self.resumed_told.insert((node.to_string(), gpu, seen_ms))
    }

    /// Whether (`node`, `gpu`)'s health check is due at `now` (`every_ms`
    /// after the last).
    pub(crate) fn check_due(&self, node: &str, gpu: u32, now: i64, every_ms: i64) -> bool {
        self.checked.get(&(node.to_string(), gpu)).is_none_or(|t| now.saturating_sub(*t) >= every_ms)
    }

    /// `node`'s health check ran at `now` for `gpus`.
    pub(crate) fn checked(&mut self, node: &str, gpus: &[u32], now: i64) {
        for g in gpus {
            self.checked.insert((node.to_string(), *g), now);
        }
    }

    /// The fleet goes to act: a fault only shadow runs answered is offered
    /// at the next reading, not after the pause a real run earns.
    pub(crate) fn forget_pacing(&mut self) {
        self.ran.clear();
        self.tried.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::RepairMemory;

    #[test]
    fn a_fault_is_offered_paced_and_after_a_run_later() {
        let mut m = RepairMemory::default();
        assert!(m.offer_due("n1", 0, 0, 600, 60));
        assert!(!m.offer_due("n1", 0, 59, 600, 60), "within the pause");
        assert!(m.offer_due("n1", 1, 59, 600, 60), "another GPU is its own");
        assert!(m.offer_due("n1", 0, 60, 600, 60));
        m.ran("n1", 0, 60, None);
        assert!(!m.offer_due("n1", 0, 200, 600, 60), "a run took it: the longer pause");
        m.forget_pacing();
        assert!(m.offer_due("n1", 0, 200, 600, 60), "the fleet went to act: at once");
        assert!(m.first_telling("n1", 0, 5) && !m.first_telling("n1", 0, 5) && m.first_telling("n1", 0, 6));
        assert!(m.check_due("n1", 0, 0, 30));
        m.checked("n1", &[0], 10);
        assert!(!m.check_due("n1", 0, 39, 30) && m.check_due("n1", 0, 40, 30));
    }
}
