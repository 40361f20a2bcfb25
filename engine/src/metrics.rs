//! The metric names nightshift understands, in one table.
//!
//! | name | scope | unit | from |
//! |---|---|---|---|
//! | `gpu.temperature_c` | gpu | °C | agent, DCGM `GPU_TEMP` |
//! | `gpu.power_watts` | gpu | W | agent, DCGM `POWER_USAGE` |
//! | `gpu.power_limit_watts` | gpu | W | agent |
//! | `gpu.power_pct_of_limit` | gpu | % | derived: power ÷ limit |
//! | `gpu.fan_pct` | gpu | % | agent (boards with fans) |
//! | `gpu.util_pct` | gpu | % | agent, DCGM `GPU_UTIL` |
//! | `gpu.mem_used_pct` | gpu | % | agent, DCGM `FB_USED`/`FB_FREE` |
//! | `gpu.mem_fragmentation_pct` | gpu | % | agent (sim; external allocator stats) |
//! | `gpu.sm_clock_mhz` | gpu | MHz | agent |
//! | `gpu.ecc_sbe_total` | gpu | count | agent, DCGM `ECC_SBE_VOL_TOTAL` |
//! | `gpu.ecc_dbe_total` | gpu | count | agent, DCGM `ECC_DBE_VOL_TOTAL` |
//! | `gpu.xid_last` | gpu | code | agent, DCGM `XID_ERRORS` (holds its value: an edge) |
//! | `gpu.throttled` | gpu | 0/1 | agent |
//! | `node.cpu_util_pct` | node | % | agent |
//! | `node.nvlink_links_down` | node | count | derived: total − up |
//! | `node.nvlink_errors_total` | node | count | agent, DCGM NVLink error counters |
//! | `node.nvlink_p2p_latency_us` | node | µs | agent (sim; a probe job elsewhere) |
//! | `node.allreduce_p99_ms` | node | ms | agent (sim; training telemetry) |
//! | `node.comm_overhead_pct` | node | % | agent (sim; training telemetry) |
//! | `node.util_swing_pct` | node | % | derived: max − min GPU util over 60 s |
//! | `job.progress` | node | steps | agent (sim; training telemetry) |
//! | `node.drained` | node | 0/1 | agent (scheduler state) |

use serde::Serialize;

/// A metric's compact id.
pub type MetricId = u16;

/// One known metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MetricDef {
    pub name: &'static str,
    pub gpu_scoped: bool,
    pub unit: &'static str,
    pub help: &'static str,
}

const fn gpu(name: &'static str, unit: &'static str, help: &'static str) -> MetricDef {
    MetricDef { name, gpu_scoped: true, unit, help }
}
const fn node(name: &'static str, unit: &'static str, help: &'static str) -> MetricDef {
    MetricDef { name, gpu_scoped: false, unit, help }
}

/// Every metric, indexed by [`MetricId`].
pub const METRICS: &[MetricDef] = &[
    gpu("gpu.temperature_c", "°C", "GPU die temperature"),
    gpu("gpu.power_watts", "W", "GPU board power draw"),
    gpu("gpu.power_limit_watts", "W", "GPU power limit in force"),
    gpu("gpu.power_pct_of_limit", "%", "power draw as a share of the power limit"),
    gpu("gpu.fan_pct", "%", "fan speed"),
    gpu("gpu.util_pct", "%", "GPU utilisation"),
    gpu("gpu.mem_used_pct", "%", "GPU memory in use"),
    gpu("gpu.mem_fragmentation_pct", "%", "GPU memory fragmentation"),
    gpu("gpu.sm_clock_mhz", "MHz", "SM clock"),
    gpu("gpu.ecc_sbe_total", "count", "single-bit ECC errors (volatile)"),
    gpu("gpu.ecc_dbe_total", "count", "double-bit ECC errors (volatile)"),
    gpu("gpu.xid_last", "code", "last XID seen (holds its value)"),
    gpu("gpu.throttled", "0/1", "thermal slowdown active"),
    node("node.cpu_util_pct", "%", "host CPU utilisation"),
    node("node.nvlink_links_down", "count", "NVLink links not up"),
    node("node.nvlink_errors_total", "count", "NVLink error counters, summed"),
    node("node.nvlink_p2p_latency_us", "µs", "GPU-to-GPU P2P latency"),
    node("node.allreduce_p99_ms", "ms", "all-reduce p99 latency"),
    node("node.comm_overhead_pct", "%", "all-reduce share of step time"),
    node("node.util_swing_pct", "%", "max − min GPU utilisation over the last 60 s"),
    node("job.progress", "steps", "training progress counter"),
    node("node.drained", "0/1", "node drained in the scheduler"),
];

/// Look a metric up by name.
pub fn metric_id(name: &str) -> Option<MetricId> {
    METRICS.iter().position(|m| m.name == name).map(|i| i as MetricId)
}

/// The definition of a metric id.
pub fn metric(id: MetricId) -> &'static MetricDef {
    &METRICS[id as usize]
}

/// All metric names, for error messages.
pub fn metric_names() -> String {
    METRICS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// Fixed ids of the metrics the engine itself derives or reads.
pub mod ids {
    use super::MetricId;
    pub const TEMPERATURE: MetricId = 0;
    pub const POWER: MetricId = 1;
    pub const POWER_LIMIT: MetricId = 2;
    pub const POWER_PCT: MetricId = 3;
    pub const FAN: MetricId = 4;
    pub const UTIL: MetricId = 5;
    pub const MEM_USED: MetricId = 6;
    pub const MEM_FRAG: MetricId = 7;
    pub const SM_CLOCK: MetricId = 8;
    pub const ECC_SBE: MetricId = 9;
    pub const ECC_DBE: MetricId = 10;
    pub const XID: MetricId = 11;
    pub const THROTTLED: MetricId = 12;
    pub const CPU_UTIL: MetricId = 13;
    pub const NVLINK_DOWN: MetricId = 14;
    pub const NVLINK_ERRORS: MetricId = 15;
    pub const P2P_LATENCY: MetricId = 16;
    pub const ALLREDUCE_P99: MetricId = 17;
    pub const COMM_OVERHEAD: MetricId = 18;
    pub const UTIL_SWING: MetricId = 19;
    pub const JOB_PROGRESS: MetricId = 20;
    pub const DRAINED: MetricId = 21;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ids_match_the_table() {
        let pairs = [
            (ids::TEMPERATURE, "gpu.temperature_c"),
            (ids::POWER_PCT, "gpu.power_pct_of_limit"),
            (ids::XID, "gpu.xid_last"),
            (ids::CPU_UTIL, "node.cpu_util_pct"),
            (ids::UTIL_SWING, "node.util_swing_pct"),
            (ids::JOB_PROGRESS, "job.progress"),
            (ids::DRAINED, "node.drained"),
        ];
        for (id, name) in pairs {
            assert_eq!(metric(id).name, name);
            assert_eq!(metric_id(name), Some(id));
        }
        assert_eq!(METRICS.len(), ids::DRAINED as usize + 1);
    }
}
