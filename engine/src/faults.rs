//! Fault kinds and the XID table: what each fault means and what the H8
//! ladder does about it (docs/XID.md is the same table with its sources).
//! Plain data, no engine state: manifests validate against it, the health
//! model classifies with it.

use serde::{Deserialize, Serialize};

/// What kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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

/// What NVIDIA's XID catalog says to do first ("resolution bucket,
/// immediate action").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XidAction {
    /// The application's fault: restart the job; the GPU stays in service.
    RestartApp,
    /// A consequence of another error (a killed job): ignore unless alone.
    Ignore,
    /// Drain, move the jobs, reset the GPU, check it.
    ResetGpu,
    /// Drain, move the jobs, reboot the node (a GPU off the bus), check it.
    RebootNode,
    /// Replace the GPU.
    Rma,
}

impl XidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            XidAction::RestartApp => "restart_app",
            XidAction::Ignore => "ignore",
            XidAction::ResetGpu => "reset_gpu",
            XidAction::RebootNode => "reboot_node",
            XidAction::Rma => "rma",
        }
    }
}

/// One XID code: its meaning and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct XidInfo {
    pub code: u32,
    pub mnemonic: &'static str,
    pub meaning: &'static str,
    pub action: XidAction,
}

/// The XIDs nightshift knows, from NVIDIA's XID catalog for Ampere and newer
/// ("Analyzing Xid Errors with the Xid Catalog",
/// docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) — the
/// immediate-action bucket — with the field reports' practice for repeats
/// (docs/XID.md explains each row; re-check against the catalog of the
/// driver you run, which can change a bucket).
pub const XID_TABLE: &[XidInfo] = &[
    XidInfo {
        code: 13,
        mnemonic: "ROBUST_CHANNEL_GR_EXCEPTION",
        meaning: "graphics engine exception (the application's fault)",
        action: XidAction::RestartApp,
    },
    XidInfo {
        code: 31,
        mnemonic: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        meaning: "GPU memory page fault (the application's fault)",
        action: XidAction::RestartApp,
    },
    XidInfo {
        code: 43,
        mnemonic: "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        meaning: "GPU stopped processing (the application's fault)",
        action: XidAction::RestartApp,
    },
    XidInfo {
        code: 45,
        mnemonic: "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        meaning: "preemptive cleanup after an earlier error (a killed job)",
        action: XidAction::Ignore,
    },
    XidInfo { code: 48, mnemonic: "DBE", meaning: "double-bit ECC error", action: XidAction::ResetGpu },
    XidInfo {
        code: 61,
        mnemonic: "PMU_BREAKPOINT",
        meaning: "internal micro-controller breakpoint",
        action: XidAction::ResetGpu,
    },
    XidInfo {
        code: 62,
        mnemonic: "PMU_HALT_ERROR",
        meaning: "internal micro-controller halt",
        action: XidAction::ResetGpu,
    },
    XidInfo {
        code: 63,
        mnemonic: "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPER_EVENT",
        meaning: "a page retired or a row marked for remapping: a reset activates it",
        action: XidAction::ResetGpu,
    },
    XidInfo {
        code: 64,
        mnemonic: "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPER_FAILURE",
        meaning: "page retirement or row remapping failed: no spare left",
        action: XidAction::Rma,
    },
    XidInfo { code: 74, mnemonic: "NVLINK_ERROR", meaning: "NVLink error", action: XidAction::ResetGpu },
    XidInfo {
        code: 79,
        mnemonic: "GPU_HAS_FALLEN_OFF_THE_BUS",
        meaning: "the GPU fell off the bus",
        action: XidAction::RebootNode,
    },
    XidInfo {
        code: 92,
        mnemonic: "EXCESSIVE_SBE_INTERRUPTS",
        meaning: "high single-bit ECC error rate",
        action: XidAction::ResetGpu,
    },
    XidInfo {
        code: 94,
        mnemonic: "CONTAINED_ERROR",
        meaning: "contained memory error (the job that hit it died)",
        action: XidAction::ResetGpu,
    },
    XidInfo {
        code: 95,
        mnemonic: "UNCONTAINED_ERROR",
        meaning: "uncontained memory error",
        action: XidAction::ResetGpu,
    },
    XidInfo { code: 119, mnemonic: "GSP_RPC_TIMEOUT", meaning: "GSP RPC timeout", action: XidAction::ResetGpu },
    XidInfo { code: 120, mnemonic: "GSP_ERROR", meaning: "GSP error", action: XidAction::ResetGpu },
    XidInfo {
        code: 154,
        mnemonic: "GPU_RECOVERY_ACTION_CHANGED",
        meaning: "the driver asks for a recovery action (reset, or reboot)",
        action: XidAction::ResetGpu,
    },
];

/// What the table says about an XID, if it is one nightshift knows.
pub fn xid_info(code: u32) -> Option<&'static XidInfo> {
    XID_TABLE.iter().find(|x| x.code == code)
}

/// Whether an XID is a hardware fault (the GPU leaves service).
pub fn xid_is_fault(code: u32) -> bool {
    xid_info(code).is_some_and(|x| matches!(x.action, XidAction::ResetGpu | XidAction::RebootNode | XidAction::Rma))
}
