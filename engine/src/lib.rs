//! nightshift-engine: the brain that answers the page.
//!
//! Flow: telemetry or an alert ([`ingest`]) → [`signals::triggers`] → a run request
//! → [`runstate::admission`] (stale, dedup, cooldown, breaker, budget, hands-off,
//! capacity, approval) → the [`run::executor`] and its [`run::queue`] (classes and
//! priorities, re-check at start, holds released at the end) → the runbook's Rhai [`runbooks::script`] through the [`host`]
//! → holds and actions sent to agents → every step in the [`audit`] log.
//! The executor's memory ([`runstate::runtable`]) is rebuilt from the log on start
//! ([`run::recovery`]).
//!
//! Dependency rule: this crate uses `nightshift-proto`, never the agent
//! daemon (checked by `tests/tests/it/architecture.rs`).
#![forbid(unsafe_code)]
// Library code says what went wrong instead of panicking (issue 44): no
// `unwrap`/`expect` outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub(crate) mod alert_intake;
pub mod api;
pub(crate) mod base;
mod blast;
/// The audit log, its own crate (`nightshift-audit`), under its old path.
pub use nightshift_audit as audit;
pub mod config;
pub(crate) mod control;
pub(crate) mod core;
pub mod embed;
pub mod engine;
pub(crate) mod evidence;
pub(crate) mod fleet;
pub(crate) mod fleet_mode;
pub use nightshift_audit::ha;
pub(crate) mod health;
mod holdreports;
pub(crate) mod host;
pub(crate) mod ingest;
pub(crate) mod maintenance;
pub(crate) mod node_filter;
pub(crate) mod notify;
pub(crate) mod pages;
pub(crate) mod repair;
pub(crate) mod run;
pub use nightshift_audit::runs;
pub(crate) mod runbooks;
pub(crate) mod runstate;
mod server;
/// The production start (`server/serve.rs`), under its old path.
pub use server::serve;
pub(crate) mod shadow;
pub(crate) mod signals;
pub(crate) mod views;
