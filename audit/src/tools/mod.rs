//! Tools over a store, above the façade: `salvage` (a new store from
//! every record that checks out), `migrate` (a record log into
//! PostgreSQL) and `load` (the appends `nightshift-bench` times).
//! `verify` is the store's own (`AuditStore::verify`, `verify.rs`): the
//! same chain walk open uses.

pub mod load;
pub mod migrate;
pub mod salvage;
