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

    /// The run table, locked.
    pub(crate) fn table(&self) -> MutexGuard<'_, runtable::RunTable> {
        crate::base::locks::lock(&self.table)
    }
}
