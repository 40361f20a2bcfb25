//! [`lock`]: a mutex's guard even if a holder panicked — the engine's state
//! stays readable after a bug in one task. A leaf, so every subsystem below
//! `core` uses the same one.

use std::sync::{Mutex, MutexGuard};

/// Lock a mutex, taking its value even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
