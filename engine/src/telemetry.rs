//! Telemetry windows: per-series ring buffers of (time, value), each kept
//! only as long as the loaded triggers need (never unbounded).

use std::collections::{HashMap, VecDeque};

use nightshift_agent::proto::Telemetry;

use crate::metrics::{METRICS, MetricId, ids};

/// Identifies one series: a metric on a node, or on one of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub node: u32,
    pub gpu: Option<u16>,
    pub metric: MetricId,
}

impl SeriesKey {
    fn packed(self) -> u64 {
        ((self.node as u64) << 32) | ((self.gpu.map_or(0xffff, |g| g) as u64) << 16) | self.metric as u64
    }
}

/// Summary of a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowStats {
    pub count: usize,
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub first: (i64, f64),
    pub last: (i64, f64),
    /// Least-squares slope, per second.
    pub slope_per_sec: f64,
}

#[derive(Debug, Default)]
struct Series {
    points: VecDeque<(i64, f32)>,
}

/// The store. Values are kept as `f32` (telemetry has no more precision than
/// that) to halve memory at fleet scale.
#[derive(Debug)]
pub struct TelemetryStore {
    series: HashMap<u64, Series>,
    /// Per metric: how long to keep points (0 = latest only).
    retention_ms: Vec<i64>,
    samples_in: u64,
}

impl TelemetryStore {
    /// A store keeping each metric for `retention_ms[metric]` (missing = 0:
    /// only the latest point).
    pub fn new(mut retention_ms: Vec<i64>) -> TelemetryStore {
        retention_ms.resize(METRICS.len(), 0);
        // The utilisation swing is derived from a minute of utilisation.
        retention_ms[ids::UTIL as usize] = retention_ms[ids::UTIL as usize].max(60_000);
        TelemetryStore { series: HashMap::new(), retention_ms, samples_in: 0 }
    }

    /// How long a metric is kept.
    pub fn retention_ms(&self, metric: MetricId) -> i64 {
        self.retention_ms[metric as usize]
    }

    /// Add a point.
    pub fn push(&mut self, key: SeriesKey, ts_ms: i64, value: f64) {
        self.samples_in += 1;
        let keep = self.retention_ms[key.metric as usize];
        let s = self.series.entry(key.packed()).or_default();
        // Out-of-order points (a late scrape) are dropped rather than
        // breaking the window's order.
        if s.points.back().is_some_and(|(t, _)| *t > ts_ms) {
            return;
        }
        s.points.push_back((ts_ms, value as f32));
        let horizon = ts_ms - keep;
        while s.points.len() > 1 && s.points.front().is_some_and(|(t, _)| *t < horizon) {
            s.points.pop_front();
        }
    }

    /// The latest point.
    pub fn latest(&self, key: SeriesKey) -> Option<(i64, f64)> {
        self.series.get(&key.packed())?.points.back().map(|(t, v)| (*t, *v as f64))
    }

    /// Points at or after `since_ms`.
    pub fn window(&self, key: SeriesKey, since_ms: i64) -> Vec<(i64, f64)> {
        self.series
            .get(&key.packed())
            .map(|s| s.points.iter().filter(|(t, _)| *t >= since_ms).map(|(t, v)| (*t, *v as f64)).collect())
            .unwrap_or_default()
    }

    /// Statistics of the points at or after `since_ms`.
    pub fn stats(&self, key: SeriesKey, since_ms: i64) -> Option<WindowStats> {
        let s = self.series.get(&key.packed())?;
        stats_of(s.points.iter().filter(|(t, _)| *t >= since_ms).map(|(t, v)| (*t, *v as f64)))
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    /// Points held across all series.
    pub fn points(&self) -> usize {
        self.series.values().map(|s| s.points.len()).sum()
    }

    /// Samples pushed since start.
    pub fn samples_in(&self) -> u64 {
        self.samples_in
    }
}

/// Statistics of a sequence of points, with a least-squares slope.
pub fn stats_of(points: impl Iterator<Item = (i64, f64)>) -> Option<WindowStats> {
    let mut n = 0usize;
    let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    let mut first = None;
    let mut last = (0, 0.0);
    // Centre times on the first point for numerical stability.
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for (t, v) in points {
        let t0 = *first.get_or_insert((t, v));
        let x = (t - t0.0) as f64 / 1000.0;
        n += 1;
        min = min.min(v);
        max = max.max(v);
        sum += v;
        sx += x;
        sy += v;
        sxx += x * x;
        sxy += x * v;
        last = (t, v);
    }
    let first = first?;
    let nf = n as f64;
    let denom = nf * sxx - sx * sx;
    let slope = if n >= 2 && denom.abs() > 1e-12 { (nf * sxy - sx * sy) / denom } else { 0.0 };
    Some(WindowStats { count: n, min, max, avg: sum / nf, first, last, slope_per_sec: slope })
}

/// The samples in one agent telemetry message: (gpu, metric, value).
pub fn samples_from(t: &Telemetry) -> Vec<(Option<u16>, MetricId, f64)> {
    let mut out = Vec::with_capacity(t.gpus.len() * 12 + 8);
    for g in &t.gpus {
        let i = Some(g.index as u16);
        out.push((i, ids::TEMPERATURE, g.temperature_c));
        out.push((i, ids::POWER, g.power_watts));
        out.push((i, ids::POWER_LIMIT, g.power_limit_watts));
        if g.power_limit_watts > 0.0 {
            out.push((i, ids::POWER_PCT, g.power_watts / g.power_limit_watts * 100.0));
        }
        if let Some(f) = g.fan_pct {
            out.push((i, ids::FAN, f));
        }
        out.push((i, ids::UTIL, g.util_pct));
        out.push((i, ids::MEM_USED, g.mem_used_pct));
        if let Some(f) = g.mem_fragmentation_pct {
            out.push((i, ids::MEM_FRAG, f));
        }
        if let Some(c) = g.sm_clock_mhz {
            out.push((i, ids::SM_CLOCK, c as f64));
        }
        out.push((i, ids::ECC_SBE, g.ecc_sbe_total as f64));
        out.push((i, ids::ECC_DBE, g.ecc_dbe_total as f64));
        if let Some(x) = g.xid_last {
            out.push((i, ids::XID, x as f64));
        }
        out.push((i, ids::THROTTLED, g.throttled as u8 as f64));
    }
    let n = &t.node_metrics;
    if let Some(v) = n.cpu_util_pct {
        out.push((None, ids::CPU_UTIL, v));
    }
    if let (Some(up), Some(total)) = (n.nvlink_links_up, n.nvlink_links_total) {
        out.push((None, ids::NVLINK_DOWN, total.saturating_sub(up) as f64));
    }
    if let Some(v) = n.nvlink_errors_total {
        out.push((None, ids::NVLINK_ERRORS, v as f64));
    }
    if let Some(v) = n.nvlink_p2p_latency_us {
        out.push((None, ids::P2P_LATENCY, v));
    }
    if let Some(v) = n.allreduce_p99_ms {
        out.push((None, ids::ALLREDUCE_P99, v));
    }
    if let Some(v) = n.comm_overhead_pct {
        out.push((None, ids::COMM_OVERHEAD, v));
    }
    if let Some(v) = n.job_progress {
        out.push((None, ids::JOB_PROGRESS, v));
    }
    out.push((None, ids::DRAINED, n.drained as u8 as f64));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(metric: MetricId) -> SeriesKey {
        SeriesKey { node: 0, gpu: Some(0), metric }
    }

    #[test]
    fn windows_are_bounded_by_retention() {
        let mut retention = vec![0; METRICS.len()];
        retention[ids::TEMPERATURE as usize] = 10_000;
        let mut s = TelemetryStore::new(retention);
        for i in 0..100 {
            s.push(key(ids::TEMPERATURE), i * 1000, i as f64);
            s.push(key(ids::POWER), i * 1000, i as f64);
        }
        assert_eq!(s.window(key(ids::TEMPERATURE), 0).len(), 11);
        assert_eq!(s.window(key(ids::POWER), 0).len(), 1, "no trigger needs power history: latest only");
        assert_eq!(s.latest(key(ids::POWER)), Some((99_000, 99.0)));
        // Late points are dropped.
        s.push(key(ids::TEMPERATURE), 5_000, -1.0);
        assert_eq!(s.latest(key(ids::TEMPERATURE)), Some((99_000, 99.0)));
    }

    #[test]
    fn least_squares_slope() {
        let pts = (0..10).map(|i| (i * 2_000, 50.0 + 0.5 * (i * 2) as f64));
        let st = stats_of(pts).unwrap();
        assert!((st.slope_per_sec - 0.5).abs() < 1e-9, "{}", st.slope_per_sec);
        assert_eq!((st.min, st.max, st.count), (50.0, 59.0, 10));
        assert!(stats_of(std::iter::empty()).is_none());
        let one = stats_of(std::iter::once((5, 1.0))).unwrap();
        assert_eq!(one.slope_per_sec, 0.0);
    }
}
