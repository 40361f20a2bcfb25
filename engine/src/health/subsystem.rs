//! [`Health`]: the health subsystem's state as `Core` holds it — the
//! model, the repair loop's pacing and each GPU's XID history, each
//! behind its own lock, handed out as a guard.

use crate::base::locks::lock;

/// The health subsystem's state, each part behind its own lock: the
/// model (every GPU's place in its repair lifecycle), the repair loop's
/// pacing, each GPU's XID history. `Core` holds one.
pub(crate) struct Health {
    model: std::sync::Mutex<super::HealthModel>,
    repair: std::sync::Mutex<super::repair_memory::RepairMemory>,
    xid_history: std::sync::Mutex<super::xid_history::XidHistory>,
}

impl Health {
    pub(crate) fn new(model: super::HealthModel) -> Health {
        Health { model: std::sync::Mutex::new(model), repair: Default::default(), xid_history: Default::default() }
    }

    /// Every GPU's place in its repair lifecycle (the fold of the chain's
    /// `health_changed` records).
    pub(crate) fn model(&self) -> std::sync::MutexGuard<'_, super::HealthModel> {
        lock(&self.model)
    }

    /// What the repair loop remembers between readings.
    pub(crate) fn repair(&self) -> std::sync::MutexGuard<'_, super::repair_memory::RepairMemory> {
        lock(&self.repair)
    }

    /// Each GPU's XID events by code (the policy's repeat rule).
    pub(crate) fn xid_history(&self) -> std::sync::MutexGuard<'_, super::xid_history::XidHistory> {
        lock(&self.xid_history)
    }
}
