//! nightshift-engine: triggers, runbooks, executor, audit log.
#![forbid(unsafe_code)]
