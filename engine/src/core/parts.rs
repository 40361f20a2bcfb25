//! `Core`'s construction and its parts, each read through one method (a
//! child module: the fields are `Core`'s own). The locked parts come
//! locked — a guard, never the lock.

use std::sync::{Arc, Mutex, MutexGuard};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::ssh::client::AgentTransport;

use super::{Core, Ids, lock};
use crate::audit::AuditStore;
use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::fleet::Fleet;
use crate::fleet::inventory::NodeSpec;
use crate::notify::Notifier;
use crate::runbooks::runbook::RunbookSet;
use crate::runstate::runtable::RunTable;
use crate::signals::brain::Brain;

/// What [`Core::build`] is made of (the engine's parts, less what it
/// builds from them first).
pub struct CoreParts {
    pub config: EngineConfig,
    pub clock: SharedClock,
    pub audit: AuditStore,
    /// `(spec, address, transport)` for every node.
    pub nodes: Vec<(NodeSpec, String, Arc<dyn AgentTransport>)>,
    pub script: Arc<rhai::Engine>,
    pub runbooks: RunbookSet,
}

impl Core {
    /// The engine's state from its parts, the trigger brain and plot
    /// history already built; `runs_so_far` seeds the run ids.
    pub fn build(parts: CoreParts, brain: Brain, history: crate::signals::history::History, runs_so_far: u64) -> Core {
        let id_seed = parts.clock.id_seed();
        let modes = crate::runbooks::modes::ModeBook::load(&parts.audit, &parts.config.data_dir);
        Core {
            clock: parts.clock,
            audit: parts.audit,
            fleet: Fleet::new(parts.nodes),
            script: parts.script,
            runbooks: crate::runbooks::runbook::Loaded::new(parts.runbooks),
            brain: Mutex::new(brain),
            history: Mutex::new(history),
            xid_history: Mutex::new(Default::default()),
            table: Mutex::new(RunTable::new(parts.config.limits.alert_dedup_entries)),
            handle: tokio::runtime::Handle::current(),
            ids: Ids::seeded(runs_so_far, id_seed),
            backlog: Default::default(),
            notifier: Notifier::new(&parts.config.notifications),
            outbox: Mutex::new(Default::default()),
            counters: Counters::default(),
            lifecycle: Default::default(),
            tokens: crate::tokens::TokenBook::new(parts.config.auth.clone()),
            modes,
            agent_clients: Default::default(),
            verify_cache: Default::default(),
            windows: Default::default(),
            reloading: tokio::sync::Mutex::new(()),
            health: Mutex::new(crate::health::HealthModel::new(
                parts.config.limits.max_repairs_in_window,
                (parts.config.limits.repair_window_secs as i64).saturating_mul(1000),
            )),
            repair: Mutex::new(Default::default()),
            config: parts.config,
        }
    }
}

/// Each part through one method.
impl Core {
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub fn audit(&self) -> &AuditStore {
        &self.audit
    }

    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The Rhai engine runbook scripts run in.
    pub fn script(&self) -> &Arc<rhai::Engine> {
        &self.script
    }

    /// The runbook set in force, to read or replace whole.
    pub fn runbooks(&self) -> &crate::runbooks::runbook::Loaded {
        &self.runbooks
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    pub fn ids(&self) -> &Ids {
        &self.ids
    }

    /// Events taken in and not yet handled.
    pub fn backlog(&self) -> &crate::signals::backlog::Backlog {
        &self.backlog
    }

    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether the engine stops, and the tasks a stop ends.
    pub fn lifecycle(&self) -> &crate::lifecycle::Lifecycle {
        &self.lifecycle
    }

    pub fn tokens(&self) -> &crate::tokens::TokenBook {
        &self.tokens
    }

    /// One reload at a time: hold the guard for the whole reload.
    pub async fn reloading(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reloading.lock().await
    }

    pub fn modes(&self) -> &crate::runbooks::modes::ModeBook {
        &self.modes
    }

    pub fn agent_clients(&self) -> &crate::fleet::AgentClients {
        &self.agent_clients
    }

    pub fn verify_cache(&self) -> &crate::verify_cache::VerifyCache {
        &self.verify_cache
    }

    pub fn windows(&self) -> &crate::fleet::windows::WindowBook {
        &self.windows
    }

    pub fn table(&self) -> MutexGuard<'_, RunTable> {
        lock(&self.table)
    }

    pub fn brain(&self) -> MutexGuard<'_, Brain> {
        lock(&self.brain)
    }

    pub fn health(&self) -> MutexGuard<'_, crate::health::HealthModel> {
        lock(&self.health)
    }

    pub fn history(&self) -> MutexGuard<'_, crate::signals::history::History> {
        lock(&self.history)
    }

    pub fn xid_history(&self) -> MutexGuard<'_, crate::health::xid_history::XidHistory> {
        lock(&self.xid_history)
    }

    pub fn outbox(&self) -> MutexGuard<'_, crate::outbox::Outbox> {
        lock(&self.outbox)
    }

    /// What the repair loop remembers between readings.
    pub fn repair(&self) -> MutexGuard<'_, crate::health::repair_memory::RepairMemory> {
        lock(&self.repair)
    }
}
