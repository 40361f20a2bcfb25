//! Node actions that are not GPU settings: drain and resume through the
//! scheduler, cache flushes, and versioned config files.

pub mod caches;
pub mod configs;
pub mod scheduler;

/// The reason prefix nightshift writes on every drain it makes. A drain
/// whose reason lacks it belongs to a person and is never undone.
pub const OWNER_PREFIX: &str = "nightshift:";

/// Whether a drain reason is nightshift's own.
pub fn owned_by_nightshift(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.trim_start().starts_with(OWNER_PREFIX))
}

/// A node action that failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Process(#[from] crate::procs::ProcError),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unexpected(String),
}
