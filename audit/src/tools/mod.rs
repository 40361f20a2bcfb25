//! Tools over a store, above the façade: `salvage` (a new store from
//! every record that checks out) and `migrate` (a record log into
//! PostgreSQL). `verify` is the store's own (`AuditStore::verify`,
//! `verify.rs`): the same chain walk open uses.

pub mod migrate;
pub mod salvage;
