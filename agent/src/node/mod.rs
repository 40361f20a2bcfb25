//! Node actions that are not GPU settings: drain and resume through the
//! scheduler, cache flushes, and versioned config files. Drain ownership
//! (`nightshift: …` reasons) is `nightshift_proto::owner`.

pub mod caches;
pub mod configs;
pub mod dcgm;
pub mod host;
pub mod jobfile;
pub mod scheduler;

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
