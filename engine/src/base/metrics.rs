//! The metric names nightshift understands, in one table.
//!
//! Each metric's `from` says where it comes from on real hardware (the
//! `sim` backend provides every one): the agent's GPU backend (NVML, ROCm
//! SMI), the agent's host readings (`/proc`), a job textfile (see the
//! agent's `node::jobfile`), or a Prometheus/exporter series (`sources:`).
//! `nightshift runbooks list` shows it for each runbook's trigger.

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
    /// Where it comes from on real hardware.
    pub from: &'static str,
}

const fn gpu(name: &'static str, unit: &'static str, help: &'static str, from: &'static str) -> MetricDef {
    MetricDef { name, gpu_scoped: true, unit, help, from }
}
const fn node(name: &'static str, unit: &'static str, help: &'static str, from: &'static str) -> MetricDef {
    MetricDef { name, gpu_scoped: false, unit, help, from }
}

/// Every metric, indexed by [`MetricId`].
pub const METRICS: &[MetricDef] = &[
    gpu("gpu.temperature_c", "°C", "GPU die temperature", "agent (NVML, ROCm SMI); DCGM_FI_DEV_GPU_TEMP"),
    gpu("gpu.power_watts", "W", "GPU board power draw", "agent (NVML, ROCm SMI); DCGM_FI_DEV_POWER_USAGE"),
    gpu(
        "gpu.power_limit_watts",
        "W",
        "GPU power limit in force",
        "agent (NVML, ROCm SMI); DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ),
    gpu("gpu.power_pct_of_limit", "%", "power draw as a share of the power limit", "derived: power ÷ limit"),
    gpu("gpu.fan_pct", "%", "fan speed", "agent (boards with GPU fans); DCGM_FI_DEV_FAN_SPEED"),
    gpu("gpu.util_pct", "%", "GPU utilisation", "agent (NVML, ROCm SMI); DCGM_FI_DEV_GPU_UTIL"),
    gpu("gpu.mem_used_pct", "%", "GPU memory in use", "agent (NVML, ROCm SMI); DCGM_FI_DEV_FB_USED/FB_FREE"),
    gpu(
        "gpu.mem_fragmentation_pct",
        "%",
        "GPU memory fragmentation",
        "job textfile (allocator 1 − allocated/reserved); nightshift_gpu_mem_fragmentation_pct",
    ),
    gpu("gpu.sm_clock_mhz", "MHz", "SM clock", "agent (NVML, ROCm SMI); DCGM_FI_DEV_SM_CLOCK"),
    gpu(
        "gpu.ecc_sbe_total",
        "count",
        "single-bit ECC errors (volatile)",
        "agent (NVML, ROCm SMI); DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    gpu(
        "gpu.ecc_dbe_total",
        "count",
        "double-bit ECC errors (volatile)",
        "agent (NVML, ROCm SMI); DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    gpu(
        "gpu.xid_last",
        "code",
        "last XID seen (holds its value)",
        "DCGM_FI_DEV_XID_ERRORS (dcgm-exporter, Prometheus)",
    ),
    gpu(
        "gpu.throttled",
        "0/1",
        "thermal slowdown active (the GPU or its HBM; not the power brake)",
        "agent (NVML clocks-event reasons); DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    node("node.cpu_util_pct", "%", "host CPU utilisation", "agent (/proc/stat)"),
    node("node.nvlink_links_down", "count", "NVLink links not up", "agent (NVML NVLink state)"),
    node("node.nvlink_errors_total", "count", "NVLink error counters, summed", "agent (NVML NVLink error counters)"),
    node(
        "node.nvlink_p2p_latency_us",
        "µs",
        "GPU-to-GPU P2P latency",
        "job textfile (a P2P probe job); nightshift_nvlink_p2p_latency_us",
    ),
    node(
        "node.allreduce_p99_ms",
        "ms",
        "all-reduce p99 latency",
        "job textfile (NCCL timing); nightshift_allreduce_p99_ms",
    ),
    node(
        "node.comm_overhead_pct",
        "%",
        "all-reduce share of step time",
        "job textfile (NCCL timing); nightshift_comm_overhead_pct",
    ),
    node(
        "node.util_swing_pct",
        "%",
        "max − min GPU utilisation over the last 60 s",
        "derived: max − min of gpu.util_pct",
    ),
    node("job.progress", "steps", "training progress counter", "job textfile (training loop); nightshift_job_progress"),
    node("node.drained", "0/1", "node drained in the scheduler", "agent (Slurm, Kubernetes)"),
    gpu("gpu.lost", "0/1", "the GPU does not answer (fallen off the bus)", "agent (NVML GPU_IS_LOST, ROCm SMI)"),
    gpu("gpu.xid_events_total", "count", "fatal XID events since the agent started", "agent (NVML event API)"),
    gpu(
        "gpu.row_remap_failure",
        "0/1",
        "a row remap failed (no spare row)",
        "agent (NVML remapped rows); DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    gpu(
        "gpu.row_remap_pending",
        "0/1",
        "a row remap waits for a reset",
        "agent (NVML remapped rows); DCGM_FI_DEV_ROW_REMAP_PENDING",
    ),
    gpu("gpu.reset_required", "0/1", "a fatal XID since the GPU's last reset", "agent (NVML event API)"),
    gpu(
        "gpu.thermal_headroom_c",
        "°C",
        "how far the GPU is below its nearest thermal limit: its sensor's slowdown temperature (per model and sensor) or its HBM's maximum, whichever is closer",
        "derived: min(the device's slowdown temperature − gpu.temperature_c, gpu.mem_thermal_headroom_c)",
    ),
    node(
        "job.stalled_secs",
        "s",
        "seconds since a running job's progress last advanced (the worst job); absent on an idle node",
        "job textfile heartbeat (nightshift_job_last_progress_timestamp_seconds)",
    ),
    node("node.jobs_running", "count", "jobs with a live heartbeat", "job textfile heartbeat"),
    node("node.chassis_fan_pct", "%", "chassis fan speed (boards without GPU fans)", "agent (BMC / simulator)"),
    node(
        "job.world_size",
        "GPUs",
        "GPUs in the largest job on the node, across nodes",
        "job textfile (nightshift_job_world_size)",
    ),
    node(
        "node.flush_registered",
        "count",
        "GPU processes registered for the flush signal",
        "agent (the flush registry folder)",
    ),
    gpu(
        "gpu.mem_peak_allocated_pct",
        "%",
        "the job's peak allocated GPU memory, without its allocator's cache (absent where the job does not export it)",
        "job textfile (PyTorch torch.cuda.max_memory_allocated); nightshift_gpu_mem_peak_allocated_pct",
    ),
    gpu(
        "gpu.mem_need_pct",
        "%",
        "GPU memory the work needs: the job's peak allocated where it exports it, else framebuffer used (a fallback that counts the allocator's cache)",
        "derived: gpu.mem_peak_allocated_pct, else gpu.mem_used_pct",
    ),
    node(
        "job.oom_events_total",
        "count",
        "out-of-memory errors the node's jobs caught (a counter)",
        "job textfile; nightshift_job_oom_events_total",
    ),
    gpu(
        "gpu.sm_active_pct",
        "%",
        "share of cycles an SM had work (what utilisation means to a training job; absent without DCGM profiling)",
        "DCGM_FI_PROF_SM_ACTIVE (dcgm-exporter, a 0–1 ratio), through Prometheus; the simulator's NVIDIA profiles",
    ),
    gpu(
        "gpu.mem_fragmentation_over_limit_pct",
        "%",
        "how far memory fragmentation is above the GPU model's own limit (H6: V100 30 %, A100 25 %, Instinct 15 %, others 25 %)",
        "derived: gpu.mem_fragmentation_pct − the model's limit",
    ),
    gpu(
        "gpu.mem_temperature_c",
        "°C",
        "HBM temperature (absent on boards without an HBM sensor)",
        "agent (NVML memory temperature, ROCm SMI memory sensor); DCGM_FI_DEV_MEMORY_TEMP",
    ),
    gpu(
        "gpu.mem_thermal_headroom_c",
        "°C",
        "how far the HBM is below its own maximum operating temperature",
        "derived: the device's memory max temperature (95 °C where it reports none) − gpu.mem_temperature_c",
    ),
    gpu(
        "gpu.xid_repeats_over_limit",
        "count",
        "how far the GPU's most frequent non-fatal XID is over the XID policy's repeat rule (more than 3 of one code in a day, shipped); 0 when none is",
        "derived: the agent's XID event counts by code (NVML event API), against the policy's `repeats:`",
    ),
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
    pub const LOST: MetricId = 22;
    pub const XID_EVENTS: MetricId = 23;
    pub const REMAP_FAILURE: MetricId = 24;
    pub const REMAP_PENDING: MetricId = 25;
    pub const RESET_REQUIRED: MetricId = 26;
    pub const THERMAL_HEADROOM: MetricId = 27;
    pub const JOB_STALLED: MetricId = 28;
    pub const JOBS_RUNNING: MetricId = 29;
    pub const CHASSIS_FAN: MetricId = 30;
    pub const JOB_WORLD_SIZE: MetricId = 31;
    pub const FLUSH_REGISTERED: MetricId = 32;
    pub const MEM_PEAK: MetricId = 33;
    pub const MEM_NEED: MetricId = 34;
    pub const OOM_EVENTS: MetricId = 35;
    pub const SM_ACTIVE: MetricId = 36;
    pub const MEM_FRAG_OVER: MetricId = 37;
    pub const MEM_TEMP: MetricId = 38;
    pub const MEM_HEADROOM: MetricId = 39;
    pub const XID_REPEATS: MetricId = 40;
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
            (ids::LOST, "gpu.lost"),
            (ids::XID_EVENTS, "gpu.xid_events_total"),
            (ids::REMAP_FAILURE, "gpu.row_remap_failure"),
            (ids::REMAP_PENDING, "gpu.row_remap_pending"),
            (ids::RESET_REQUIRED, "gpu.reset_required"),
            (ids::THERMAL_HEADROOM, "gpu.thermal_headroom_c"),
            (ids::JOB_STALLED, "job.stalled_secs"),
            (ids::JOBS_RUNNING, "node.jobs_running"),
            (ids::CHASSIS_FAN, "node.chassis_fan_pct"),
            (ids::JOB_WORLD_SIZE, "job.world_size"),
            (ids::FLUSH_REGISTERED, "node.flush_registered"),
            (ids::MEM_PEAK, "gpu.mem_peak_allocated_pct"),
            (ids::MEM_NEED, "gpu.mem_need_pct"),
            (ids::OOM_EVENTS, "job.oom_events_total"),
            (ids::SM_ACTIVE, "gpu.sm_active_pct"),
            (ids::MEM_FRAG_OVER, "gpu.mem_fragmentation_over_limit_pct"),
            (ids::MEM_TEMP, "gpu.mem_temperature_c"),
            (ids::MEM_HEADROOM, "gpu.mem_thermal_headroom_c"),
            (ids::XID_REPEATS, "gpu.xid_repeats_over_limit"),
        ];
        for (id, name) in pairs {
            assert_eq!(metric(id).name, name);
            assert_eq!(metric_id(name), Some(id));
        }
        assert_eq!(METRICS.len(), ids::XID_REPEATS as usize + 1);
    }
}
