//! Inventory and telemetry types. Units are in the field names.

use serde::{Deserialize, Serialize};

/// GPU vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    /// `nvidia` or `amd`.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }
}

/// One GPU as the backend sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub vendor: Vendor,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub power_min_watts: f64,
    pub power_max_watts: f64,
    pub power_default_watts: f64,
    pub mem_total_mib: u64,
    /// Whether the agent can drive this GPU's fan (fanless SXM boards: no).
    pub fan_control: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_temp_c: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_temp_c: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_min_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_max_mhz: Option<u32>,
    /// The power range this agent's envelope accepts (device ∩ policy);
    /// filled in by the agent's `inventory` op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope_power_min_watts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope_power_max_watts: Option<f64>,
    /// The lowest fan speed a curve may ask for here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envelope_fan_min_pct: Option<f64>,
    /// `00000000:18:00.0`, as NVML and dcgm-exporter's `pci_bus_id` write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Which sensor `temperature_c` reads: `gpu` (NVIDIA's GPU core
    /// sensor), `junction` (AMD's hotspot), `edge`. The slowdown and
    /// shutdown temperatures are for that sensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_sensor: Option<String>,
    /// The HBM's maximum operating temperature (NVML's memory max
    /// threshold; the vendor's HBM limit where the library has none): the
    /// limit `mem_temperature_c` is judged against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_max_temp_c: Option<f64>,
}

impl GpuInfo {
    /// A GPU known only by index, name and vendor: every number zero,
    /// every optional reading unset. Backends fill in what they read with
    /// struct update syntax (`GpuInfo { power_max_watts: 700.0, ..GpuInfo::new(0, name, vendor) }`).
    pub fn new(index: u32, name: impl Into<String>, vendor: Vendor) -> GpuInfo {
        GpuInfo {
            index,
            name: name.into(),
            vendor,
            uuid: None,
            power_min_watts: 0.0,
            power_max_watts: 0.0,
            power_default_watts: 0.0,
            mem_total_mib: 0,
            fan_control: false,
            slowdown_temp_c: None,
            shutdown_temp_c: None,
            clock_min_mhz: None,
            clock_max_mhz: None,
            envelope_power_min_watts: None,
            envelope_power_max_watts: None,
            envelope_fan_min_pct: None,
            pci_bus_id: None,
            temperature_sensor: None,
            mem_max_temp_c: None,
        }
    }
}

/// The node's inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub node: String,
    pub backend: String,
    pub agent_version: String,
    pub scheduler: String,
    pub gpus: Vec<GpuInfo>,
    pub configs: Vec<String>,
    /// The GPU driver's version, where the backend reads one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The agent can drive the chassis fans (a BMC command in its policy,
    /// or the simulator's chassis).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chassis_fan_control: bool,
}

/// One GPU's sample. Optional fields are what the backend cannot read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GpuTelemetry {
    pub index: u32,
    pub temperature_c: f64,
    pub power_watts: f64,
    pub power_limit_watts: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_pct: Option<f64>,
    pub util_pct: f64,
    pub mem_used_pct: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_fragmentation_pct: Option<f64>,
    /// The job's peak allocated memory, % of the GPU's (its allocator's own
    /// count — PyTorch's `max_memory_allocated` — without its cache): the
    /// headroom signal. Only a job that exports it has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_peak_allocated_pct: Option<f64>,
    /// SM activity, % of cycles an SM had a warp (DCGM profiling's
    /// `DCGM_FI_PROF_SM_ACTIVE` as a percentage): what utilisation means
    /// to a training job. Where the agent can read it — the simulator's
    /// NVIDIA profiles; NVML and ROCm SMI cannot (DCGM serves it to
    /// Prometheus instead), and AMD GPUs have no such field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    #[serde(default)]
    pub ecc_sbe_total: u64,
    #[serde(default)]
    pub ecc_dbe_total: u64,
    /// The last XID seen; it holds its value (treat it as an edge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_last: Option<u32>,
    /// A thermal slowdown is active (a thermal reason among
    /// `throttle_reasons`).
    #[serde(default)]
    pub throttled: bool,
    /// Why the clocks are held down, as the device reports it (NVML's
    /// clocks-event reasons, named as in [`THROTTLE_REASONS`]); empty where
    /// the backend cannot read them or nothing holds the clocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    #[serde(default)]
    pub gpu_drained: bool,
    /// Memory clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_clock_mhz: Option<u32>,
    /// HBM temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_temperature_c: Option<f64>,
    /// Energy used since the driver loaded, in millijoules (a counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_mj: Option<u64>,
    /// PCIe retries (a counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replay_total: Option<u64>,
    /// NVLink traffic on all of this GPU's links, in bytes (a counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_bytes_total: Option<u64>,
    /// Rows remapped for correctable / uncorrectable errors (counters), and
    /// whether a remap failed (no spare row left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_correctable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_failure: Option<bool>,
    /// A row remap waits for a GPU reset to take effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_pending: Option<bool>,
    /// The GPU does not answer (fallen off the bus): its other readings are
    /// absent (zero), not measured. `lost_detail` says what the backend
    /// got.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_detail: Option<String>,
    /// Fatal XID events seen since the agent started (a counter: the same
    /// code twice is two events, which the `xid_last` gauge cannot show).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_events_total: Option<u64>,
    /// A fatal XID since the GPU was last reset (where the agent tracks XID
    /// events): `Some(false)` once a reset cleared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_required: Option<bool>,
    /// Every XID event since the agent started, by code, fatal or not
    /// (where the agent sees XID events: NVML's event API, the simulator):
    /// the same application XID again and again on one GPU is a history
    /// the `xid_last` gauge cannot show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_counts: Vec<XidCount>,
}

/// How many events of one XID code an agent has seen on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidCount {
    pub code: u32,
    pub events: u64,
}

/// The XIDs an agent counts as fatal: `xid_events_total` counts them and
/// `reset_required` holds for them until a reset. The engine's shipped XID
/// policy (`engine/data/xid-policy.yaml`) calls exactly these a fault (a
/// test checks both); a site's overrides may mark one benign or change its
/// repair, not add one (the agents would not count it).
pub const FATAL_XIDS: &[u32] =
    &[46, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 109, 110, 119, 120, 136, 140, 143, 154, 155, 156, 158];

/// The clocks-event reasons an agent reports, with what each means (NVML's
/// `nvmlClocksEventReasons`, DCGM's `DCGM_FI_DEV_CLOCKS_EVENT_REASONS`
/// bits). `hw_thermal_slowdown` covers the GPU and its HBM on Hopper and
/// later; `hw_power_brake_slowdown` is an external signal (the PSU or the
/// BMC pulling the brake), not heat.
pub const THROTTLE_REASONS: &[(&str, &str)] = &[
    ("gpu_idle", "nothing runs"),
    ("applications_clocks", "application clocks set below the maximum"),
    ("sw_power_cap", "at its power limit"),
    ("hw_slowdown", "the hardware slows it (heat or the power brake)"),
    ("sync_boost", "held with the other GPUs of a sync-boost group"),
    ("sw_thermal_slowdown", "the driver slows it: GPU or HBM above its max operating temperature"),
    ("hw_thermal_slowdown", "the hardware slows it for heat"),
    ("hw_power_brake_slowdown", "the power brake is asserted (PSU or BMC)"),
    ("display_clocks", "display clock setting"),
];

/// Whether a reason in [`THROTTLE_REASONS`] is about heat.
pub fn thermal_throttle(reason: &str) -> bool {
    matches!(reason, "sw_thermal_slowdown" | "hw_thermal_slowdown")
}

/// A reason's bit in NVML's clocks-event bitmask (and DCGM's field 112):
/// its position in [`THROTTLE_REASONS`].
pub fn throttle_reason_bit(reason: &str) -> Option<u64> {
    THROTTLE_REASONS.iter().position(|(name, _)| *name == reason).map(|i| 1 << i)
}

/// Whether a clocks-event bitmask says heat holds the clocks: a thermal
/// reason, or the hardware slowdown without the power brake (older drivers
/// set only `hw_slowdown` for heat).
pub fn thermal_slowdown(bits: u64) -> bool {
    let has = |r: &str| throttle_reason_bit(r).is_some_and(|b| bits & b != 0);
    THROTTLE_REASONS.iter().any(|(r, _)| thermal_throttle(r) && has(r))
        || (has("hw_slowdown") && !has("hw_power_brake_slowdown"))
}

/// Node-wide readings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeTelemetry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_util_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_links_up: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_links_total: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_errors_total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_p2p_latency_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_overhead_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_progress: Option<f64>,
    /// Seconds since a running job's progress last advanced, from a
    /// heartbeat written outside its training loop (the worst job). Absent
    /// when no job runs: an idle node is never stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_stalled_secs: Option<f64>,
    /// Jobs with a live heartbeat on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs_running: Option<u32>,
    /// The largest world size (GPUs in the job, across nodes) of those jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_world_size: Option<u32>,
    /// Out-of-memory errors the node's jobs caught (a counter, summed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_oom_events_total: Option<u64>,
    /// GPU processes registered for the flush signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_registered: Option<u32>,
    /// Chassis fan speed (boards cooled by chassis fans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis_fan_pct: Option<f64>,
    /// Drained through the scheduler adapter.
    #[serde(default)]
    pub drained: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_reason: Option<String>,
    /// Scheduler marks in effect (`no_pack`, `quarantine`), and who set
    /// each: nightshift's own, or a person's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<super::NodeMark>,
    /// The maintenance marker is present.
    #[serde(default)]
    pub hands_off: bool,
    /// The agent cannot record changes durably (a full or failing disk
    /// under its state dir): what failed. It refuses every change until a
    /// write succeeds again, and retries the ends it could not record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_degraded: Option<String>,
    /// Every active hold on the node and its GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<super::HoldInfo>,
    /// Holds that ended in the last few minutes, newest last (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ended_holds: Vec<super::EndedHold>,
    /// Held settings found at their default (a reset, a reboot) and applied
    /// again in the last few minutes, with the holds' owners.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reapplied: Vec<super::ReappliedSetting>,
    /// Held settings not in force (a person's value, or a re-apply the
    /// envelope refused): each with what was found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drifted: Vec<super::DriftedSetting>,
}

/// One sample of the whole node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Telemetry {
    pub node: String,
    pub ts_ms: i64,
    pub gpus: Vec<GpuTelemetry>,
    pub node_metrics: NodeTelemetry,
}

/// A scheduler mark on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeMark {
    pub mark: super::MarkKind,
    /// Set by nightshift (else by a person, and never removed by it).
    pub ours: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's order is NVML's bit order (`nvmlClocksEventReason*`:
    /// 0x1 idle … 0x100 display): the exporter writes and the engine reads
    /// DCGM's bitmask by it.
    #[test]
    fn throttle_reasons_sit_at_nvmls_bits() {
        for (name, bit) in [
            ("gpu_idle", 0x1),
            ("applications_clocks", 0x2),
            ("sw_power_cap", 0x4),
            ("hw_slowdown", 0x8),
            ("sync_boost", 0x10),
            ("sw_thermal_slowdown", 0x20),
            ("hw_thermal_slowdown", 0x40),
            ("hw_power_brake_slowdown", 0x80),
            ("display_clocks", 0x100),
        ] {
            assert_eq!(throttle_reason_bit(name), Some(bit), "{name}");
        }
        assert_eq!(throttle_reason_bit("overheated"), None);
    }
}
