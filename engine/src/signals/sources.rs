//! Pulled telemetry: a Prometheus server's HTTP API (instant queries) or
//! dcgm-exporter endpoints (text exposition), mapped onto nightshift's
//! metrics and inventory.
//!
//! - Names: classic DCGM names and the DCGM 4.6 renames map to the same
//!   metric (`DCGM_FI_DEV_GPU_TEMP` = `DCGM_FI_DEV_GPU_TEMP_CELSIUS`, …).
//! - Node: `Hostname`/`hostname`, else `instance` without its port, else
//!   `node`; it must be an inventory node.
//! - GPU: the `gpu` label, else the `UUID`/`uuid` label looked up in the
//!   node's inventory.
//! - Anything else — other series, unknown hosts, unparsable values — is
//!   ignored and counted, never an error.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::base::metrics::{MetricId, ids};

/// One sample as Prometheus has it (the workspace's one reader of the
/// text format is `nightshift_proto::exposition`).
pub use nightshift_proto::exposition::Sample as PromSample;
use nightshift_proto::exposition::parse_value;

/// Why a response could not be read at all (one bad series is not this).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    #[error("{url}: {message}")]
    Fetch { url: String, message: String },
    #[error("{url}: expected a Prometheus query response with status success and a vector, found {found}")]
    Response { url: String, found: String },
}

/// The DCGM series nightshift reads, by name.
pub fn dcgm_metric(name: &str) -> Option<DcgmField> {
    use DcgmField::*;
    Some(match name {
        "DCGM_FI_DEV_GPU_TEMP" | "DCGM_FI_DEV_GPU_TEMP_CELSIUS" => Metric(ids::TEMPERATURE),
        "DCGM_FI_DEV_MEMORY_TEMP" => Metric(ids::MEM_TEMP),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" | "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" => ClockReasons,
        "DCGM_FI_DEV_POWER_USAGE" | "DCGM_FI_DEV_BOARD_POWER_WATTS" => Metric(ids::POWER),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT" => Metric(ids::POWER_LIMIT),
        "DCGM_FI_DEV_GPU_UTIL" => Metric(ids::UTIL),
        "DCGM_FI_DEV_SM_CLOCK" => Metric(ids::SM_CLOCK),
        "DCGM_FI_DEV_FAN_SPEED" => Metric(ids::FAN),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" => Metric(ids::ECC_SBE),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" => Metric(ids::ECC_DBE),
        "DCGM_FI_DEV_XID_ERRORS" | "DCGM_FI_DEV_XID_ERROR" => Metric(ids::XID),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE" => Metric(ids::REMAP_FAILURE),
        "DCGM_FI_DEV_ROW_REMAP_PENDING" => Metric(ids::REMAP_PENDING),
        "DCGM_FI_PROF_SM_ACTIVE" => Ratio(ids::SM_ACTIVE),
        "DCGM_FI_DEV_FB_USED" => FbUsed,
        "DCGM_FI_DEV_FB_FREE" => FbFree,
        // A job's own readings (see the agent's job textfile contract), when
        // node_exporter's textfile collector serves the same files.
        "nightshift_gpu_mem_fragmentation_pct" => Metric(ids::MEM_FRAG),
        "nightshift_gpu_mem_peak_allocated_pct" => Metric(ids::MEM_PEAK),
        "nightshift_job_oom_events_total" => Metric(ids::OOM_EVENTS),
        "nightshift_job_progress" => Metric(ids::JOB_PROGRESS),
        "nightshift_comm_overhead_pct" => Metric(ids::COMM_OVERHEAD),
        "nightshift_allreduce_p99_ms" => Metric(ids::ALLREDUCE_P99),
        "nightshift_nvlink_p2p_latency_us" => Metric(ids::P2P_LATENCY),
        "nightshift_job_last_progress_timestamp_seconds" => LastProgress,
        "nightshift_job_world_size" => Metric(ids::JOB_WORLD_SIZE),
        _ => return None,
    })
}

/// `gpu.mem_need_pct` for the samples of `out` from `from` on: the job's
/// peak allocated where it exports it, else framebuffer used (the fallback
/// counts the allocator's cache) — as the agent's telemetry derives it. One
/// rule for the live pull and the recording's replay.
pub fn add_memory_need<N: Clone + Eq + std::hash::Hash>(
    out: &mut Vec<(N, Option<u32>, MetricId, i64, f64)>,
    from: usize,
) {
    let peaks: std::collections::HashSet<(N, u32)> =
        out[from..].iter().filter(|s| s.2 == ids::MEM_PEAK).filter_map(|s| Some((s.0.clone(), s.1?))).collect();
    let need: Vec<_> = out[from..]
        .iter()
        .filter(|s| {
            s.2 == ids::MEM_PEAK || (s.2 == ids::MEM_USED && s.1.is_some_and(|g| !peaks.contains(&(s.0.clone(), g))))
        })
        .map(|s| (s.0.clone(), s.1, ids::MEM_NEED, s.3, s.4))
        .collect();
    out.extend(need);
}

/// What a DCGM series becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcgmField {
    Metric(MetricId),
    /// A ratio (0–1) of the metric, a percentage: DCGM's profiling fields.
    Ratio(MetricId),
    /// Framebuffer MiB: used and free make `gpu.mem_used_pct`.
    FbUsed,
    FbFree,
    /// A job heartbeat's "progress last advanced at" (UNIX seconds):
    /// `job.stalled_secs` is the time since, at the sample's time.
    LastProgress,
    /// NVML's clocks-event reasons as a bitmask: `gpu.throttled` is 1
    /// when a thermal bit is set, or the hardware slowdown without the
    /// power brake (`thermal_slowdown`).
    ClockReasons,
}

/// Whether a clocks-event bitmask (NVML's `nvmlClocksEventReasons`, DCGM
/// field 112) says heat holds the clocks ([`nightshift_proto::thermal_slowdown`]).
pub use nightshift_proto::thermal_slowdown;

/// Every name [`dcgm_metric`] knows, for the Prometheus query.
pub const DCGM_NAMES: &[&str] = &[
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_FAN_SPEED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "nightshift_gpu_mem_fragmentation_pct",
    "nightshift_gpu_mem_peak_allocated_pct",
    "nightshift_job_oom_events_total",
    "nightshift_job_progress",
    "nightshift_comm_overhead_pct",
    "nightshift_allreduce_p99_ms",
    "nightshift_nvlink_p2p_latency_us",
    "nightshift_job_last_progress_timestamp_seconds",
    "nightshift_job_world_size",
];

/// The instant query that fetches them all.
pub fn prometheus_query() -> String {
    format!("{{__name__=~\"{}\"}}", DCGM_NAMES.join("|"))
}

/// The range query that rebuilds the plot history: the names whose metric
/// is plotted (and the framebuffer pair for memory).
pub fn plotted_query() -> String {
    let names: Vec<&str> = DCGM_NAMES
        .iter()
        .copied()
        .filter(|n| match dcgm_metric(n) {
            Some(DcgmField::Metric(m)) => crate::signals::history::History::plotted(m),
            Some(DcgmField::FbUsed | DcgmField::FbFree) => true,
            _ => false,
        })
        .collect();
    format!("{{__name__=~\"{}\"}}", names.join("|"))
}

/// Parse a `/api/v1/query_range` response (a matrix): one sample per value.
pub fn parse_range_response(url: &str, body: &[u8]) -> Result<Vec<PromSample>, SourceError> {
    parse_response(url, body, "matrix")
}

/// Parse the text exposition format. Lines that do not parse are counted in
/// the second value, not fatal.
pub fn parse_exposition(text: &str) -> (Vec<PromSample>, usize) {
    nightshift_proto::exposition::parse(text)
}

/// Parse a `/api/v1/query` response (a vector).
pub fn parse_query_response(url: &str, body: &[u8]) -> Result<Vec<PromSample>, SourceError> {
    parse_response(url, body, "vector")
}

/// A Prometheus answer of `result_type`: every value of every series as a
/// sample (a vector's one `value`, a matrix's `values`).
fn parse_response(url: &str, body: &[u8], result_type: &str) -> Result<Vec<PromSample>, SourceError> {
    let bad = |found: String| SourceError::Response { url: url.to_string(), found };
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON ({e})")))?;
    if v["status"] != "success" {
        return Err(bad(format!("status {} ({})", v["status"], v["error"])));
    }
    if v["data"]["resultType"] != result_type {
        return Err(bad(format!("resultType {} (expected {result_type})", v["data"]["resultType"])));
    }
    let mut out = Vec::new();
    for r in v["data"]["result"].as_array().into_iter().flatten() {
        let Some(metric) = r["metric"].as_object() else { continue };
        let labels: BTreeMap<String, String> =
            metric.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect();
        let Some(name) = labels.get("__name__").cloned() else { continue };
        let points: Vec<&Value> = match result_type {
            "vector" => vec![&r["value"]],
            _ => r["values"].as_array().into_iter().flatten().collect(),
        };
        for p in points {
            let (Some(ts), Some(val)) = (p[0].as_f64(), p[1].as_str().and_then(parse_value)) else { continue };
            out.push(PromSample {
                name: name.clone(),
                labels: labels.clone(),
                value: val,
                ts_ms: Some((ts * 1000.0).round() as i64),
            });
        }
    }
    Ok(out)
}

/// The host a series is about.
pub fn host_of(labels: &BTreeMap<String, String>) -> Option<String> {
    if let Some(h) = labels.get("Hostname").or_else(|| labels.get("hostname")) {
        return Some(h.clone());
    }
    if let Some(i) = labels.get("instance") {
        // host:port, [v6]:port
        let host = match i.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
            _ => i.as_str(),
        };
        return Some(host.trim_start_matches('[').trim_end_matches(']').to_string());
    }
    labels.get("node").cloned()
}

/// Samples ready for the engine: (node, gpu, metric, ts, value).
pub type Mapped = Vec<(String, Option<u32>, MetricId, i64, f64)>;

/// Framebuffer (latest ts, used MiB, free MiB) of one GPU.
type FbParts = (i64, Option<f64>, Option<f64>);

/// What a mapping pass found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MapStats {
    pub mapped: usize,
    /// Not a DCGM series nightshift reads.
    pub other_series: usize,
    /// No host label, or a host not in the inventory.
    pub unknown_host: usize,
    /// No `gpu` label and a UUID the inventory does not know.
    pub unknown_gpu: usize,
    /// NaN or infinite.
    pub bad_value: usize,
}

/// Map samples to inventory nodes and GPUs. `is_node(name)` says whether a
/// host is in the inventory; `gpu_by_uuid(node, uuid)` finds a GPU index.
pub fn map_samples(
    samples: &[PromSample],
    now_ms: i64,
    is_node: &dyn Fn(&str) -> bool,
    gpu_by_uuid: &dyn Fn(&str, &str) -> Option<u32>,
) -> (Mapped, MapStats) {
    let mut out = Vec::new();
    let mut st = MapStats::default();
    // (node, gpu) → (ts, used, free) for the memory percentage.
    let mut fb: BTreeMap<(String, u32), FbParts> = BTreeMap::new();
    for s in samples {
        let Some(field) = dcgm_metric(&s.name) else {
            st.other_series += 1;
            continue;
        };
        // DCGM's profiling fields are ratios (0–1): percent here.
        let (field, value) = match field {
            DcgmField::Ratio(m) => (DcgmField::Metric(m), s.value * 100.0),
            DcgmField::ClockReasons if s.value.is_finite() && s.value >= 0.0 => {
                (DcgmField::Metric(ids::THROTTLED), thermal_slowdown(s.value as u64) as u8 as f64)
            }
            f => (f, s.value),
        };
        let Some(node) = host_of(&s.labels).filter(|h| is_node(h)) else {
            st.unknown_host += 1;
            continue;
        };
        if !value.is_finite() {
            st.bad_value += 1;
            continue;
        }
        if let DcgmField::LastProgress = field {
            let ts = s.ts_ms.unwrap_or(now_ms);
            out.push((node, None, ids::JOB_STALLED, ts, (ts as f64 / 1000.0 - value).max(0.0).floor()));
            st.mapped += 1;
            continue;
        }
        // Node readings (a job's progress, its communication share) have no GPU.
        if let DcgmField::Metric(m) = field
            && !crate::base::metrics::metric(m).gpu_scoped
        {
            out.push((node, None, m, s.ts_ms.unwrap_or(now_ms), value));
            st.mapped += 1;
            continue;
        }
        let gpu = match s.labels.get("gpu").and_then(|g| g.parse::<u32>().ok()) {
            Some(g) => g,
            None => match s.labels.get("UUID").or_else(|| s.labels.get("uuid")).and_then(|u| gpu_by_uuid(&node, u)) {
                Some(g) => g,
                None => {
                    st.unknown_gpu += 1;
                    continue;
                }
            },
        };
        if !value.is_finite() {
            st.bad_value += 1;
            continue;
        }
        let ts = s.ts_ms.unwrap_or(now_ms);
        match field {
            DcgmField::Metric(m) | DcgmField::Ratio(m) => {
                out.push((node, Some(gpu), m, ts, value));
                st.mapped += 1;
            }
            DcgmField::FbUsed => {
                let e = fb.entry((node, gpu)).or_insert((ts, None, None));
                e.0 = e.0.max(ts);
                e.1 = Some(value);
                st.mapped += 1;
            }
            DcgmField::FbFree => {
                let e = fb.entry((node, gpu)).or_insert((ts, None, None));
                e.0 = e.0.max(ts);
                e.2 = Some(value);
                st.mapped += 1;
            }
            DcgmField::LastProgress | DcgmField::ClockReasons => {}
        }
    }
    for ((node, gpu), (ts, used, free)) in fb {
        if let (Some(u), Some(f)) = (used, free)
            && u + f > 0.0
        {
            out.push((node, Some(gpu), ids::MEM_USED, ts, u / (u + f) * 100.0));
        }
    }
    add_memory_need(&mut out, 0);
    (out, st)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DCGM_TEXT: &str = r#"# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aa",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-a1"} 71
DCGM_FI_DEV_GPU_TEMP_CELSIUS{gpu="1",UUID="GPU-bb",device="nvidia1",modelName="NVIDIA B200",Hostname="gpu-a1"} 64.5 1790000000123
DCGM_FI_DEV_BOARD_POWER_WATTS{UUID="GPU-bb",Hostname="gpu-a1"} 612.5
DCGM_FI_DEV_FB_USED{gpu="0",Hostname="gpu-a1"} 30000
DCGM_FI_DEV_FB_FREE{gpu="0",Hostname="gpu-a1"} 50000
DCGM_FI_DEV_XID_ERROR{gpu="0",instance="gpu-a1:9400"} 79
DCGM_FI_PROF_SM_ACTIVE{gpu="0",Hostname="gpu-a1"} 0.5
DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="elsewhere"} 99
DCGM_FI_DEV_GPU_TEMP{UUID="GPU-zz",Hostname="gpu-a1"} 99
DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="gpu-a1",note="a \"quoted\" \\ value"} NaN
this is not a metric line
"#;

    #[test]
    fn dcgm_text_maps_classic_and_new_names_and_counts_the_rest() {
        let (samples, bad) = parse_exposition(DCGM_TEXT);
        assert_eq!(bad, 1);
        assert_eq!(samples.len(), 10);
        assert_eq!(samples[9].labels["note"], "a \"quoted\" \\ value");
        assert_eq!(samples[1].ts_ms, Some(1_790_000_000_123));
        let (mapped, st) =
            map_samples(&samples, 5, &|h| h == "gpu-a1", &|n, u| (n == "gpu-a1" && u == "GPU-bb").then_some(1));
        let find = |m: MetricId, g: u32| mapped.iter().find(|x| x.2 == m && x.1 == Some(g)).map(|x| (x.3, x.4));
        assert_eq!(find(ids::TEMPERATURE, 0), Some((5, 71.0)));
        assert_eq!(find(ids::TEMPERATURE, 1), Some((1_790_000_000_123, 64.5)));
        assert_eq!(find(ids::POWER, 1), Some((5, 612.5)), "GPU found by UUID");
        assert_eq!(find(ids::XID, 0), Some((5, 79.0)), "host from instance, DCGM 4.6 name");
        assert_eq!(find(ids::MEM_USED, 0), Some((5, 37.5)));
        assert_eq!(find(ids::SM_ACTIVE, 0), Some((5, 50.0)), "a profiling ratio, in percent");
        assert_eq!(
            st,
            MapStats { mapped: 7, other_series: 0, unknown_host: 1, unknown_gpu: 1, bad_value: 1 },
            "{mapped:?}"
        );
    }

    /// NVML's clocks-event bits: heat, or the hardware slowdown without the
    /// power brake; the power cap, idling and the brake are not heat.
    #[test]
    fn clock_event_reasons_say_whether_heat_holds_the_clocks() {
        for (bits, hot) in [
            (0x0, false),
            (0x1, false),
            (0x4, false),
            (0x20, true),
            (0x40, true),
            (0x48, true),
            (0x8, true),
            (0x88, false),
            (0xC8, true),
            (0x84, false),
        ] {
            assert_eq!(thermal_slowdown(bits), hot, "{bits:#x}");
        }
        let text = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu=\"0\",Hostname=\"gpu-a1\"} 72\n\
                    DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu=\"1\",Hostname=\"gpu-a1\"} 136\n\
                    DCGM_FI_DEV_MEMORY_TEMP{gpu=\"0\",Hostname=\"gpu-a1\"} 93\n";
        let (samples, _) = parse_exposition(text);
        let (mapped, st) = map_samples(&samples, 5, &|h| h == "gpu-a1", &|_, _| None);
        assert_eq!(st.mapped, 3, "{st:?}");
        assert!(mapped.contains(&("gpu-a1".to_string(), Some(0), ids::THROTTLED, 5, 1.0)));
        assert!(mapped.contains(&("gpu-a1".to_string(), Some(1), ids::THROTTLED, 5, 0.0)), "the power brake");
        assert!(mapped.contains(&("gpu-a1".to_string(), Some(0), ids::MEM_TEMP, 5, 93.0)));
    }

    #[test]
    fn job_textfile_series_map_to_node_and_gpu_readings() {
        // node_exporter's textfile collector serving a job's file.
        let text = "nightshift_job_progress{instance=\"gpu-a1:9100\"} 1234\n\
                    nightshift_comm_overhead_pct{instance=\"gpu-a1:9100\"} 34\n\
                    nightshift_gpu_mem_fragmentation_pct{instance=\"gpu-a1:9100\",gpu=\"1\"} 28.5\n";
        let (samples, bad) = parse_exposition(text);
        assert_eq!(bad, 0);
        let (mapped, st) = map_samples(&samples, 5, &|h| h == "gpu-a1", &|_, _| None);
        assert_eq!(st.mapped, 3, "{st:?}");
        assert!(mapped.contains(&("gpu-a1".to_string(), None, ids::JOB_PROGRESS, 5, 1234.0)));
        assert!(mapped.contains(&("gpu-a1".to_string(), None, ids::COMM_OVERHEAD, 5, 34.0)));
        assert!(mapped.contains(&("gpu-a1".to_string(), Some(1), ids::MEM_FRAG, 5, 28.5)));
    }

    #[test]
    fn prometheus_query_responses() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_TEMP","gpu":"2","Hostname":"n1","instance":"10.0.0.1:9400","job":"dcgm"},"value":[1790000000.5,"88"]},
            {"metric":{"gpu":"2"},"value":[1790000000.5,"1"]}]}}"#;
        let s = parse_query_response("http://p", body).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].value, s[0].ts_ms), (88.0, Some(1_790_000_000_500)));
        assert_eq!(host_of(&s[0].labels).as_deref(), Some("n1"));
        let e = parse_query_response("http://p", br#"{"status":"error","error":"bad query"}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "http://p: expected a Prometheus query response with status success and a vector, found status \"error\" (\"bad query\")"
        );
        assert!(parse_query_response("http://p", b"<html>").is_err());
        let mut l = BTreeMap::new();
        l.insert("instance".to_string(), "[::1]:9400".to_string());
        assert_eq!(host_of(&l).as_deref(), Some("::1"));
        assert!(prometheus_query().starts_with("{__name__=~\"DCGM_FI_DEV_GPU_TEMP|"));
    }
}
