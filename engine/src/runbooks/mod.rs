//! Runbooks as the engine holds them: the manifest (YAML, validated with
//! file:line:column), the sealed Rhai host its script runs in, a loaded
//! runbook and the set in force, and the modes an admin set (act or
//! shadow). None of it drives the engine: the run path (`run/`) and the
//! reload (`reload.rs`) use it.

pub(crate) mod manifest;
pub(crate) mod modes;
pub(crate) mod runbook;
pub(crate) mod script;
