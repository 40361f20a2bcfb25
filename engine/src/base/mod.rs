//! The engine's shared vocabulary, at the bottom of its module graph: plain
//! types and small holders every subsystem may use and that use none of
//! them (checked by `no_crate_has_a_module_cycle` and the module DAG test).
//!
//! - `faults.rs`, `metrics.rs` — fault kinds and the one table of metric names;
//! - `counters.rs` — what `/metrics` counts, counted only through methods;
//! - `lifecycle.rs`, `locks.rs` — stopping, and a poison-tolerant lock;
//! - `outbox.rs` — pages not delivered yet (invariant 19), as state;
//! - `verify_cache.rs` — one chain walk at a time.

pub(crate) mod counters;
pub(crate) mod faults;
pub(crate) mod lifecycle;
pub(crate) mod locks;
pub(crate) mod metrics;
pub(crate) mod outbox;
pub(crate) mod verify_cache;
