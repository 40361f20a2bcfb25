//! [`Backlog`]: events taken in and not yet handled — alert batches and
//! telemetry batches on background tasks, and the alerts in them. The
//! counts are its own: what is taken in is counted in, what is handled out;
//! `busy` (the simulator's "is anything still moving"), the webhook's
//! shedding and `/metrics` read them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Events handed to background tasks and not yet handled.
#[derive(Default)]
pub(crate) struct Backlog {
    /// Event batches handed to background tasks and not yet processed.
    batches: AtomicU64,
    /// Alerts accepted by a webhook call (or found unhandled by a restart)
    /// and not yet handled.
    alerts: AtomicU64,
}

impl Backlog {
    /// A batch handed to a background task.
    pub(crate) fn batch_started(&self) {
        self.batches.fetch_add(1, Ordering::SeqCst);
    }

    /// A batch handled.
    pub(crate) fn batch_done(&self) {
        self.batches.fetch_sub(1, Ordering::SeqCst);
    }

    /// Batches not yet handled.
    pub(crate) fn batches(&self) -> u64 {
        self.batches.load(Ordering::SeqCst)
    }

    /// `n` alerts accepted, to be handled.
    pub(crate) fn alerts_in(&self, n: u64) {
        self.alerts.fetch_add(n, Ordering::SeqCst);
    }

    /// One alert handled.
    pub(crate) fn alert_out(&self) {
        self.alerts.fetch_sub(1, Ordering::SeqCst);
    }

    /// Alerts accepted and not yet handled.
    pub(crate) fn alerts(&self) -> u64 {
        self.alerts.load(Ordering::SeqCst)
    }
}
