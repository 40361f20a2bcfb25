//! `Core`'s construction and its parts, each read through one method (a
//! child module: the fields are `Core`'s own). The locked parts come
//! locked — a guard, never the lock.

use std::sync::{Arc, Mutex, MutexGuard};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::ssh::client::AgentTransport;

use super::{Core, Ids, lock};
use crate::audit::AuditStore;
use crate::base::counters::Counters;
use crate::config::EngineConfig;
use crate::fleet::Fleet;
use crate::fleet::inventory::NodeSpec;
use crate::notify::Notifier;
use crate::runbooks::runbook::RunbookSet;
use crate::runstate::runtable::RunTable;
use crate::signals::brain::Brain;

/// Everything needed to build an engine (`Engine::new`), which
/// [`Core::build`] takes whole.
pub struct EngineParts {
    pub config: EngineConfig,
    pub clock: SharedClock,
    pub audit: AuditStore,
    /// `(spec, address, transport)` for every node.
    pub nodes: Vec<(NodeSpec, String, Arc<dyn AgentTransport>)>,
    pub script: Arc<rhai::Engine>,
    pub runbooks: RunbookSet,
}

impl Core {
    /// The engine's state from its parts: the trigger brain built for the
    /// runbooks, the plot history sized for the fleet, run ids going on
    /// from the audit log's count.
    pub fn build(parts: EngineParts) -> Core {
        let brain = Brain::build(
            &parts.runbooks,
            (parts.config.telemetry.script_window_secs as i64) * 1000,
            parts.config.telemetry.ingest_shards as usize,
        );
        let runs_so_far = parts.audit.run_count().unwrap_or(0);
        let t = &parts.config.telemetry;
        let (history, step) = crate::signals::history::History::for_fleet(
            t.history_secs,
            t.history_step_secs,
            parts.nodes.len(),
            t.history_max_mib.saturating_mul(1024 * 1024),
        );
        if step != t.history_step_secs {
            tracing::info!(
                nodes = parts.nodes.len(),
                step_secs = step,
                configured_step_secs = t.history_step_secs,
                history_max_mib = t.history_max_mib,
                "plot history: one point per {step} s to keep {} nodes within telemetry.history_max_mib",
                parts.nodes.len()
            );
        }
        let id_seed = parts.clock.id_seed();
        let modes = crate::runbooks::modes::ModeBook::load(&parts.audit, &parts.config.data_dir);
        Core {
            clock: parts.clock,
            audit: parts.audit,
            fleet: Fleet::new(parts.nodes),
            runbooks: crate::runbooks::Runbooks::new(parts.runbooks, parts.script, modes),
            signals: crate::signals::Signals::new(brain, history),
            runs: crate::runstate::Runs::new(RunTable::new(parts.config.limits.alert_dedup_entries)),
            handle: tokio::runtime::Handle::current(),
            ids: Ids::seeded(runs_so_far, id_seed),
            notifier: Notifier::new(&parts.config.notifications),
            outbox: Mutex::new(Default::default()),
            counters: Counters::default(),
            lifecycle: Default::default(),
            tokens: crate::config::tokens::TokenBook::new(parts.config.auth.clone()),
            verify_cache: Default::default(),
            health: crate::health::Health::new(crate::health::HealthModel::new(
                parts.config.limits.max_repairs_in_window,
                (parts.config.limits.repair_window_secs as i64).saturating_mul(1000),
            )),
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

    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    pub fn ids(&self) -> &Ids {
        &self.ids
    }

    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether the engine stops, and the tasks a stop ends.
    pub fn lifecycle(&self) -> &crate::base::lifecycle::Lifecycle {
        &self.lifecycle
    }

    pub fn tokens(&self) -> &crate::config::tokens::TokenBook {
        &self.tokens
    }

    pub fn verify_cache(&self) -> &crate::base::verify_cache::VerifyCache {
        &self.verify_cache
    }

    /// The runbooks subsystem: the set in force, the script engine, the
    /// modes, the reload gate.
    pub(crate) fn runbooks(&self) -> &crate::runbooks::Runbooks {
        &self.runbooks
    }

    /// The signals subsystem: trigger brain, plot history, backlog.
    pub(crate) fn signals(&self) -> &crate::signals::Signals {
        &self.signals
    }

    /// The health subsystem: the model, the repair loop's pacing, XID
    /// history.
    pub(crate) fn health(&self) -> &crate::health::Health {
        &self.health
    }

    /// The runs subsystem: the run table behind its lock.
    pub(crate) fn runs(&self) -> &crate::runstate::Runs {
        &self.runs
    }

    pub fn outbox(&self) -> MutexGuard<'_, crate::base::outbox::Outbox> {
        lock(&self.outbox)
    }
}
