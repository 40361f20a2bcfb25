//! What the engine hears: Alertmanager's alerts split into single ones,
//! pulled telemetry (Prometheus, dcgm-exporter), the windows it is kept in,
//! the triggers watching them and the brain that holds both, the plot
//! history, and the backlog of batches taken in and not yet handled. State
//! and evaluation only: taking a batch in and turning a fire into a run is
//! `ingest.rs` and `alert_intake.rs`, above `core`.

pub(crate) mod alerts;
pub(crate) mod backlog;
pub(crate) mod brain;
pub(crate) mod history;
pub(crate) mod sources;
pub(crate) mod telemetry;
pub(crate) mod thermal;
pub(crate) mod triggers;

use std::sync::{Mutex, MutexGuard};

use crate::base::locks::lock;

/// The signals subsystem's state, each part behind its own lock: the
/// trigger brain (windows and triggers), the plot history, the backlog of
/// batches taken in. `Core` holds one.
pub(crate) struct Signals {
    brain: Mutex<brain::Brain>,
    history: Mutex<history::History>,
    backlog: backlog::Backlog,
}

impl Signals {
    pub(crate) fn new(brain: brain::Brain, history: history::History) -> Signals {
        Signals { brain: Mutex::new(brain), history: Mutex::new(history), backlog: Default::default() }
    }

    /// The telemetry windows and the triggers watching them.
    pub(crate) fn brain(&self) -> MutexGuard<'_, brain::Brain> {
        lock(&self.brain)
    }

    /// What the pages plot.
    pub(crate) fn history(&self) -> MutexGuard<'_, history::History> {
        lock(&self.history)
    }

    /// Events taken in and not yet handled.
    pub(crate) fn backlog(&self) -> &backlog::Backlog {
        &self.backlog
    }
}
