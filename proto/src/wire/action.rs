//! Argument and result types of the protocol's operations.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Ops that take no arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Ops that name one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuArgs {
    pub gpu: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeArgs {
    /// Sample interval; the agent's configured interval when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionStatusArgs {
    pub request_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPowerLimitArgs {
    pub gpu: u32,
    pub watts: f64,
}

/// One point of a fan curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FanPoint {
    pub temp_c: f64,
    pub speed_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetFanCurveArgs {
    pub gpu: u32,
    /// Temperature→speed points, temperatures strictly increasing, speeds
    /// never decreasing.
    pub points: Vec<FanPoint>,
}

/// Fan speed for a temperature on a curve: linear between points, flat
/// beyond the ends.
pub fn fan_curve_speed(points: &[FanPoint], temp_c: f64) -> f64 {
    match points {
        [] => 0.0,
        [only] => only.speed_pct,
        _ => {
            let first = points[0];
            let last = points[points.len() - 1];
            if temp_c <= first.temp_c {
                return first.speed_pct;
            }
            if temp_c >= last.temp_c {
                return last.speed_pct;
            }
            for pair in points.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if temp_c <= b.temp_c {
                    let t = (temp_c - a.temp_c) / (b.temp_c - a.temp_c);
                    return a.speed_pct + t * (b.speed_pct - a.speed_pct);
                }
            }
            last.speed_pct
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetClocksArgs {
    pub gpu: u32,
    pub min_mhz: u32,
    pub max_mhz: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetGpuDrainArgs {
    pub gpu: u32,
    pub drained: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainArgs {
    /// Why; the agent writes `nightshift: <run> <reason>` as the drain reason.
    pub reason: String,
    /// The run asking, recorded in the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// No lease: the drain stays until a person releases it (RMA, repair).
    /// Only node drains may be sticky.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushCachesArgs {
    #[serde(default = "yes")]
    pub drop_page_cache: bool,
    #[serde(default = "yes")]
    pub signal_processes: bool,
}

/// `requeue`: stop the jobs running on a drained node so the scheduler
/// starts them elsewhere (Slurm `scontrol requeue`, Kubernetes eviction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueArgs {
    pub reason: String,
}

impl Default for FlushCachesArgs {
    fn default() -> Self {
        FlushCachesArgs { drop_page_cache: true, signal_processes: true }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigListArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigApplyArgs {
    pub name: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRollbackArgs {
    pub name: String,
    /// The version to go back to; the last known good one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_version: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMarkArgs {
    pub name: String,
    pub version: u32,
    pub good: bool,
}

/// Families of changes, for rate limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    PowerLimit,
    Fan,
    Clocks,
    Ecc,
    GpuDrain,
    NodeDrain,
    FlushCaches,
    Config,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::PowerLimit => "power_limit",
            ActionKind::Fan => "fan",
            ActionKind::Clocks => "clocks",
            ActionKind::Ecc => "ecc",
            ActionKind::GpuDrain => "gpu_drain",
            ActionKind::NodeDrain => "node_drain",
            ActionKind::FlushCaches => "flush_caches",
            ActionKind::Config => "config",
        }
    }
}

/// What happened to a mutating request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The change was made.
    Applied,
    /// Dry run: the change passed every check and was not made.
    DryRun,
    /// Nothing to do: the state already was what was asked.
    Unchanged,
    /// The device or node does not support this action (e.g. fan control on
    /// a fanless SXM board). A normal result, not a failure.
    NotApplicable,
    /// The hold was recorded; a more restrictive hold already decides the
    /// device's value, so nothing on the device changed.
    Held,
}

/// An automatic revert the agent will perform on its own clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseInfo {
    pub revert_at_ms: i64,
}

/// The result of a mutating op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionResult {
    pub outcome: Outcome,
    /// The state the change touches, captured before it.
    pub before: Value,
    /// The state after (or, for a dry run, what it would be).
    pub after: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    /// The hold this change placed (or updated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<super::HoldInfo>,
    /// Holds this request released (`reset_fan`, `resume`, …), and what
    /// became of their settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<super::ReleaseResult>,
}

/// Faults and workload the `sim` backend can be told to model. Refused on
/// real hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SimFault {
    /// The GPU's fan (or, on fanless boards, its share of chassis airflow)
    /// stops.
    FanFailure { gpu: u32 },
    /// Undo a fan failure.
    FanRepair { gpu: u32 },
    /// Thermal resistance multiplied by `factor` (dust, dried paste).
    HeatsinkDegradation { gpu: u32, factor: f64 },
    /// Cooling that degrades slowly: thermal resistance rises linearly to
    /// `factor` over `over_secs` (the field report's climb from 65 to 95 °C
    /// in six hours).
    HeatsinkRamp { gpu: u32, factor: f64, over_secs: u64 },
    /// Set the workload's utilisation on one GPU or all of them.
    Load {
        #[serde(default)]
        gpu: Option<u32>,
        util_pct: f64,
    },
    /// Multiply power demand by `factor` (a heavier kernel mix).
    LoadSurge {
        #[serde(default)]
        gpu: Option<u32>,
        factor: f64,
    },
    /// Links down, error counters rising, P2P latency ~50 µs, all-reduce
    /// p99 above 5 ms.
    NvlinkMisconfig { active: bool },
    /// Double-bit ECC errors on a GPU.
    EccDbe { gpu: u32, count: u64 },
    /// An XID event on a GPU (the reading holds its last value).
    Xid { gpu: u32, code: u32 },
    /// Memory fragmentation on a GPU, in percent.
    Fragmentation { gpu: u32, pct: f64 },
    /// Memory in use on a GPU, in percent.
    MemoryUsed {
        #[serde(default)]
        gpu: Option<u32>,
        pct: f64,
    },
    /// Data-loader bottleneck: GPUs starve while the CPU is pegged.
    CpuBottleneck { active: bool },
    /// Utilisation swings between high and low (topology-blind all-reduce).
    UtilSwing { active: bool },
    /// Training progress stops advancing.
    JobStall { active: bool },
    /// All-reduce share of step time, in percent.
    CommOverhead { pct: f64 },
    /// A person drains the node through the scheduler (not nightshift).
    PersonDrain { reason: String },
    /// Clear every fault and restore the default workload.
    Clear {},
}
