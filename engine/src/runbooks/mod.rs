//! Runbooks as the engine holds them: the manifest (YAML, validated with
//! file:line:column), the sealed Rhai host its script runs in, a loaded
//! runbook and the set in force, and the modes an admin set (act or
//! shadow). None of it drives the engine: the run path (`run/`) and the
//! reload (`reload.rs`) use it.

pub(crate) mod manifest;
pub(crate) mod modes;
pub(crate) mod runbook;
pub(crate) mod script;

use std::sync::Arc;

/// The runbooks subsystem's state: the set in force (replaced whole by a
/// reload), the Rhai engine scripts run in, the modes an admin set, and
/// the gate that lets one reload run at a time. `Core` holds one.
pub(crate) struct Runbooks {
    loaded: runbook::Loaded,
    script: Arc<rhai::Engine>,
    modes: modes::ModeBook,
    reloading: tokio::sync::Mutex<()>,
}

impl Runbooks {
    pub(crate) fn new(set: runbook::RunbookSet, script: Arc<rhai::Engine>, modes: modes::ModeBook) -> Runbooks {
        Runbooks { loaded: runbook::Loaded::new(set), script, modes, reloading: tokio::sync::Mutex::new(()) }
    }

    /// The runbook set in force, to read or replace whole.
    pub(crate) fn loaded(&self) -> &runbook::Loaded {
        &self.loaded
    }

    /// The Rhai engine runbook scripts run in.
    pub(crate) fn script(&self) -> &Arc<rhai::Engine> {
        &self.script
    }

    /// Runbook modes an admin set (promote/demote), over the manifests'.
    pub(crate) fn modes(&self) -> &modes::ModeBook {
        &self.modes
    }

    /// One reload at a time: hold the guard for the whole reload.
    pub(crate) async fn reloading(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reloading.lock().await
    }
}
