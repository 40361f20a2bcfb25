//! nightshift-engine: the brain that answers the page.
//!
//! Flow: telemetry or an alert → [`triggers`] → a run request → the
//! [`executor`] (dedup, cooldown, budgets, blast radius, approval) → the
//! runbook's Rhai [`script`] → actions sent to agents → every step in the
//! [`audit`] log.
#![forbid(unsafe_code)]

pub mod alerts;
pub mod audit;
pub mod config;
pub mod engine;
pub mod fleet;
pub mod host;
pub mod inventory;
pub mod manifest;
pub mod metrics;
pub mod notify;
pub mod runbook;
pub mod runs;
pub mod script;
pub mod serve;
pub mod sources;
pub mod telemetry;
pub mod triggers;
