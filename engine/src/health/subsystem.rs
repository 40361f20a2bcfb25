//! [`Health`]: the health subsystem's state as `Core` holds it — the
//! model, the repair loop's pacing and each GPU's XID history, each
//! behind its own lock. The model is handed out to read only
//! ([`ModelView`]); it changes through [`Health::replay`] and
//! [`Health::set_policy`] alone.

use crate::base::locks::lock;

/// The health subsystem's state, each part behind its own lock: the
/// model (every GPU's place in its repair lifecycle), the repair loop's
/// pacing, each GPU's XID history. `Core` holds one.
pub(crate) struct Health {
    model: std::sync::Mutex<super::HealthModel>,
    repair: std::sync::Mutex<super::repair_memory::RepairMemory>,
    xid_history: std::sync::Mutex<super::xid_history::XidHistory>,
    /// How many times the XID policy in force changed: evidence judged
    /// under one generation is judged again under the next.
    policy_generation: std::sync::atomic::AtomicU64,
}

impl Health {
    pub(crate) fn new(model: super::HealthModel) -> Health {
        Health {
            model: std::sync::Mutex::new(model),
            repair: Default::default(),
            xid_history: Default::default(),
            policy_generation: Default::default(),
        }
    }

    /// Every GPU's place in its repair lifecycle, to read: the model
    /// changes only by folding the chain's `health_changed` records
    /// ([`Health::replay`]) or by a new XID policy ([`Health::set_policy`]),
    /// so nothing outside this folder holds it mutably.
    pub(crate) fn model(&self) -> ModelView<'_> {
        ModelView(lock(&self.model))
    }

    /// Fold `records` (each a `health_changed`; others are ignored) into
    /// the model, under one lock.
    pub(crate) fn replay<'a>(&self, records: impl IntoIterator<Item = &'a crate::audit::AuditRecord>) {
        let mut m = lock(&self.model);
        for r in records {
            m.replay(r);
        }
    }

    /// Put a (re)loaded XID policy in force; returns what it changed.
    pub(crate) fn set_policy(&self, policy: std::sync::Arc<super::XidPolicy>) -> Vec<String> {
        let mut m = lock(&self.model);
        let before = m.policy();
        let changes = m.set_policy(policy);
        if !std::sync::Arc::ptr_eq(&before, &m.policy()) {
            self.policy_generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        changes
    }

    /// Changes of the XID policy in force so far ([`Health::set_policy`]);
    /// read it before judging evidence, so that a change meanwhile counts
    /// as after.
    pub(crate) fn policy_generation(&self) -> u64 {
        self.policy_generation.load(std::sync::atomic::Ordering::SeqCst)
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

/// The health model under its lock, to read: it derefs to
/// [`super::HealthModel`] and never mutably (the model is the fold of the
/// chain; see [`Health::model`]).
pub(crate) struct ModelView<'a>(std::sync::MutexGuard<'a, super::HealthModel>);

impl std::ops::Deref for ModelView<'_> {
    type Target = super::HealthModel;

    fn deref(&self) -> &super::HealthModel {
        &self.0
    }
}
