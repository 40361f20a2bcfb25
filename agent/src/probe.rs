//! `nightshift-agent probe`: what the agent sees on this machine — the
//! backend's inventory, one telemetry sample, which readings the backend
//! provides, and each action's limits — without starting SSH or changing
//! anything. `scripts/gpu-check.sh` compares it with `nvidia-smi`.

use std::collections::BTreeMap;

use serde::Serialize;

use nightshift_proto::{GpuInfo, GpuTelemetry, NodeTelemetry};

use crate::backend::Backend;
use crate::envelope::Policy;

/// Everything `probe` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub backend: String,
    pub gpus: Vec<ProbeGpu>,
    pub node: NodeTelemetry,
    /// Each reading nightshift knows, and whether this backend provides it
    /// (`false`: a runbook needing it must get it from a job textfile or a
    /// Prometheus mapping).
    pub readings: BTreeMap<&'static str, bool>,
    /// Each action, and what bounds it here (device ∩ policy), or why it
    /// does not apply.
    pub actions: BTreeMap<&'static str, String>,
}

/// One GPU: its inventory and one sample, side by side.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeGpu {
    #[serde(flatten)]
    pub info: GpuInfo,
    pub sample: GpuTelemetry,
    /// Memory in use, in MiB (from the sample's share of the total).
    pub mem_used_mib: u64,
}

/// Probe `backend` under `policy` (the built-in defaults when no config).
pub fn probe(backend: &dyn Backend, policy: &Policy) -> Result<ProbeReport, crate::backend::BackendError> {
    let (samples, mut node) = backend.sample()?;
    if node.cpu_util_pct.is_none() {
        // As the agent does: /proc, over a short interval.
        let host = crate::node::host::HostStats::default();
        host.cpu_util_pct();
        std::thread::sleep(std::time::Duration::from_millis(200));
        node.cpu_util_pct = host.cpu_util_pct();
    }
    let mut gpus = Vec::new();
    for info in backend.gpus() {
        let sample = samples.iter().find(|s| s.index == info.index).cloned().unwrap_or_default();
        let mem_used_mib = ((sample.mem_used_pct / 100.0) * info.mem_total_mib as f64).round() as u64;
        let mut info = info.clone();
        let (lo, hi) = policy.power_bounds(&info);
        info.envelope_power_min_watts = Some(lo);
        info.envelope_power_max_watts = Some(hi);
        gpus.push(ProbeGpu { info, sample, mem_used_mib });
    }
    let any = |f: &dyn Fn(&GpuTelemetry) -> bool| samples.iter().any(f);
    let mut readings = BTreeMap::new();
    readings.insert("gpu.temperature_c", !samples.is_empty());
    readings.insert("gpu.power_watts", !samples.is_empty());
    readings.insert("gpu.power_limit_watts", !samples.is_empty());
    readings.insert("gpu.util_pct", !samples.is_empty());
    readings.insert("gpu.mem_used_pct", !samples.is_empty());
    readings.insert("gpu.fan_pct", any(&|s| s.fan_pct.is_some()));
    readings.insert("gpu.mem_fragmentation_pct", any(&|s| s.mem_fragmentation_pct.is_some()));
    readings.insert("gpu.sm_clock_mhz", any(&|s| s.sm_clock_mhz.is_some()));
    readings.insert("gpu.xid_last", any(&|s| s.xid_last.is_some()));
    readings.insert("node.cpu_util_pct", node.cpu_util_pct.is_some());
    readings.insert("node.nvlink_links_down", node.nvlink_links_total.is_some());
    readings.insert("node.nvlink_errors_total", node.nvlink_errors_total.is_some());
    readings.insert("node.nvlink_p2p_latency_us", node.nvlink_p2p_latency_us.is_some());
    readings.insert("node.allreduce_p99_ms", node.allreduce_p99_ms.is_some());
    readings.insert("node.comm_overhead_pct", node.comm_overhead_pct.is_some());
    readings.insert("job.progress", node.job_progress.is_some());
    let mut actions = BTreeMap::new();
    let fmt = |w: f64| format!("{w:.0}");
    actions.insert(
        "set_power_limit",
        gpus.iter()
            .map(|g| {
                format!(
                    "GPU {}: {}–{} W (device {}–{} W)",
                    g.info.index,
                    fmt(g.info.envelope_power_min_watts.unwrap_or(g.info.power_min_watts)),
                    fmt(g.info.envelope_power_max_watts.unwrap_or(g.info.power_max_watts)),
                    fmt(g.info.power_min_watts),
                    fmt(g.info.power_max_watts)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    actions.insert(
        "set_fan_curve",
        gpus.iter()
            .map(|g| {
                format!(
                    "GPU {}: {}",
                    g.info.index,
                    if g.info.fan_control {
                        format!("points from {}% up", policy.fan.min_pct)
                    } else {
                        "not applicable (no GPU-controllable fan)".into()
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    actions.insert(
        "set_clocks",
        gpus.iter()
            .map(|g| match (g.info.clock_min_mhz, g.info.clock_max_mhz) {
                (Some(lo), Some(hi)) => {
                    format!("GPU {}: {}–{} MHz", g.info.index, lo.max(policy.clocks.min_mhz.unwrap_or(0)), hi)
                }
                _ => format!("GPU {}: range not reported", g.info.index),
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    actions.insert(
        "rate_limits",
        policy
            .rate_limits
            .iter()
            .map(|(k, r)| format!("{} {} per {} s", k.as_str(), r.max_changes, r.window_secs))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Ok(ProbeReport { backend: backend.name().to_string(), gpus, node, readings, actions })
}

/// The report as a person reads it.
pub fn render(r: &ProbeReport) -> String {
    let mut out = format!("backend {}, {} GPU(s)\n", r.backend, r.gpus.len());
    for g in &r.gpus {
        let s = &g.sample;
        out.push_str(&format!(
            "GPU {} {} ({})\n  {:.0} °C, {:.1} W of {:.0} W (limit {:.0}–{:.0} W, default {:.0} W), util {:.0}%, memory {} of {} MiB{}\n",
            g.info.index,
            g.info.name,
            g.info.uuid.as_deref().unwrap_or("no uuid"),
            s.temperature_c,
            s.power_watts,
            s.power_limit_watts,
            g.info.power_min_watts,
            g.info.power_max_watts,
            g.info.power_default_watts,
            s.util_pct,
            g.mem_used_mib,
            g.info.mem_total_mib,
            s.fan_pct.map(|f| format!(", fan {f:.0}%")).unwrap_or_default()
        ));
    }
    out.push_str("readings from this backend:\n");
    for (k, v) in &r.readings {
        out.push_str(&format!("  {k:<28} {}\n", if *v { "yes" } else { "no (job textfile or Prometheus mapping)" }));
    }
    out.push_str("actions:\n");
    for (k, v) in &r.actions {
        out.push_str(&format!("  {k:<16} {v}\n"));
    }
    out
}
