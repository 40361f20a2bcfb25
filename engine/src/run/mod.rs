//! A run's path through the engine, in one folder: a request is
//! submitted (`executor.rs`: checked, put through `admission::admit`,
//! queued, waiting for approval or refused), started in its turn and
//! finished (`queue.rs`: priority, locks, preemption, the re-check before
//! acting, the script on a blocking thread through `host/`, holds released
//! at the end), and after a restart rebuilt or interrupted (`recovery.rs`);
//! the periodic tick and the queue's counters are `tick.rs`; a storm's
//! breaker (refuse the storm's runs, or keep them reversible) `breaker.rs`.
//! Each is an `impl Engine` block; the run table they share is
//! `runtable.rs` and the pure admission decision `admission.rs` (both used
//! by `core` and `host` too, so they stay beside this folder).

pub(crate) mod breaker;
pub mod executor;
pub mod queue;
pub mod recovery;
pub mod tick;
