//! Fault kinds: what the health model can find wrong with a GPU (the XID
//! policy, `health/xid_policy.rs`, says which XIDs are faults). Plain data, no
//! engine state: manifests validate against it.

use serde::{Deserialize, Serialize};

/// What kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Double-bit ECC errors (XID 48).
    Dbe,
    /// A fatal XID (the table below says which).
    Xid,
    /// The GPU fell off the bus (XID 79): it does not answer.
    GpuLost,
    /// A row remap failed: no spare row left (XID 64): RMA.
    RowRemapFailure,
    /// A row remap waits for a reset (XID 63).
    RowRemapPending,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] =
        [FaultKind::Dbe, FaultKind::Xid, FaultKind::GpuLost, FaultKind::RowRemapFailure, FaultKind::RowRemapPending];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Dbe => "dbe",
            FaultKind::Xid => "xid",
            FaultKind::GpuLost => "gpu_lost",
            FaultKind::RowRemapFailure => "row_remap_failure",
            FaultKind::RowRemapPending => "row_remap_pending",
        }
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}
