//! Plot history: a short, bounded record of every GPU's and node's main
//! series (temperature, power, power limit, fan, utilisation, memory, the
//! double-bit ECC and fatal XID counters, and a few node readings), one point per `step_secs` bucket (the last sample in
//! it) for `keep_secs` — what the run and node pages draw. Separate from the
//! trigger windows (`telemetry.rs`), which keep only what triggers need, at
//! full rate.
//!
//! Memory: 8 bytes a point, up to twice that with a ring's spare room, and
//! ~100 bytes a series. At the defaults (6 h at 10 s, 2,160 points) a GPU's
//! series take ~100 KiB — 8 GiB for 10,000 nodes — so the step is widened
//! at start to keep the whole fleet within `telemetry.history_max_mib`
//! ([`History::for_fleet`]); `nightshift-bench` (scenario 7) measures it.

use std::collections::{HashMap, VecDeque};

use crate::base::metrics::{MetricId, ids};

/// The series kept for plots.
pub const PLOTTED: &[MetricId] = &[
    ids::TEMPERATURE,
    ids::POWER,
    ids::POWER_LIMIT,
    ids::FAN,
    ids::UTIL,
    ids::MEM_USED,
    ids::MEM_FRAG,
    ids::ECC_DBE,
    ids::XID_EVENTS,
    ids::CPU_UTIL,
    ids::P2P_LATENCY,
    ids::COMM_OVERHEAD,
    ids::JOB_PROGRESS,
];

/// Plotted series a node of 8 GPUs has (for sizing the history).
const SERIES_PER_NODE: usize = 8 * 7 + 4;
/// A series' map entry and ring header, about.
const SERIES_OVERHEAD_BYTES: u64 = 100;
/// A point, with the ring's spare room at worst.
const WORST_BYTES_PER_POINT: u64 = 16;

/// Fault counters, kept as their changes only (a point when the value
/// moves, at most [`STEPPED_POINTS`]): a step on the chart is the moment a
/// fault landed, and a counter that never moves costs one point.
pub const STEPPED: &[MetricId] = &[ids::ECC_DBE, ids::XID_EVENTS];
/// Changes kept per counter.
const STEPPED_POINTS: usize = 8;
/// A node's counters at worst (8 GPUs, every change slot used).
const STEPPED_BYTES_PER_NODE: u64 =
    (8 * STEPPED.len()) as u64 * (SERIES_OVERHEAD_BYTES + STEPPED_POINTS as u64 * WORST_BYTES_PER_POINT);

/// `(node index, gpu, metric)`.
pub type Key = (u32, Option<u16>, MetricId);

/// The history of every plotted series.
#[derive(Debug)]
pub struct History {
    step_ms: i64,
    points: usize,
    series: HashMap<Key, VecDeque<(u32, f32)>>,
}

impl History {
    /// Keep `keep_secs` at one point per `step_secs`; `keep_secs` 0 keeps
    /// nothing (a backtest draws no pages).
    pub fn new(keep_secs: u64, step_secs: u64) -> History {
        let step = step_secs.max(1);
        History {
            step_ms: (step as i64).saturating_mul(1000),
            points: if keep_secs == 0 { 0 } else { (keep_secs / step).clamp(1, 1 << 20) as usize },
            series: HashMap::new(),
        }
    }

    /// Keep `keep_secs` at one point per `step_secs`, or per a wider step
    /// if `nodes` nodes of 8 GPUs would take more than `max_bytes`. Returns
    /// the history and the step chosen.
    pub fn for_fleet(keep_secs: u64, step_secs: u64, nodes: usize, max_bytes: u64) -> (History, u64) {
        let series = (nodes.max(1) * SERIES_PER_NODE) as u64;
        let for_series = max_bytes.saturating_sub(nodes.max(1) as u64 * STEPPED_BYTES_PER_NODE);
        let per_series = (for_series / series).saturating_sub(SERIES_OVERHEAD_BYTES);
        let points = (per_series / WORST_BYTES_PER_POINT).max(1);
        let step = step_secs.max(1).max(keep_secs.div_ceil(points));
        (History::new(keep_secs, step), step)
    }

    /// Whether it keeps anything (a backtest's keeps nothing).
    pub fn keeps(&self) -> bool {
        self.points > 0
    }

    /// Whether a metric is kept.
    pub fn plotted(metric: MetricId) -> bool {
        PLOTTED.contains(&metric)
    }

    /// Record a sample: it replaces the bucket's point, or starts a new one.
    pub fn push(&mut self, key: Key, ts_ms: i64, value: f64) {
        if self.points == 0 || !value.is_finite() || ts_ms < 0 {
            return;
        }
        let secs = u32::try_from(ts_ms / 1000).unwrap_or(u32::MAX);
        if STEPPED.contains(&key.2) {
            let ring = self.series.entry(key).or_insert_with(|| VecDeque::with_capacity(2));
            if ring.back().is_none_or(|last| last.1 != value as f32 && last.0 <= secs) {
                ring.push_back((secs, value as f32));
                while ring.len() > STEPPED_POINTS {
                    ring.pop_front();
                }
            }
            return;
        }
        let bucket = ts_ms / self.step_ms;
        let cap = self.points.min(16);
        let ring = self.series.entry(key).or_insert_with(|| VecDeque::with_capacity(cap));
        match ring.back_mut() {
            Some(last) if i64::from(last.0) * 1000 / self.step_ms == bucket => *last = (secs, value as f32),
            Some(last) if i64::from(last.0) * 1000 / self.step_ms > bucket => {} // out of order: dropped
            _ => {
                ring.push_back((secs, value as f32));
                while ring.len() > self.points {
                    ring.pop_front();
                }
            }
        }
    }

    /// The points of a series between `from_ms` and `to_ms`, as
    /// `(ts_ms, value)`.
    pub fn range(&self, key: Key, from_ms: i64, to_ms: i64) -> Vec<(i64, f64)> {
        let Some(ring) = self.series.get(&key) else { return Vec::new() };
        if STEPPED.contains(&key.2) {
            return stepped(ring, from_ms, to_ms);
        }
        ring.iter()
            .map(|(s, v)| (i64::from(*s) * 1000, f64::from(*v)))
            .filter(|(t, _)| *t >= from_ms && *t <= to_ms)
            .collect()
    }

    /// The step and how long points are kept, in ms.
    pub fn step_ms(&self) -> i64 {
        self.step_ms
    }
    pub fn keep_ms(&self) -> i64 {
        self.step_ms.saturating_mul(self.points as i64)
    }

    /// An empty history with this one's step and length.
    pub fn like(&self) -> History {
        History { step_ms: self.step_ms, points: self.points, series: HashMap::new() }
    }

    /// Put `older`'s points before this history's own (a history rebuilt
    /// from Prometheus after a takeover, merged under what arrived live
    /// since): for each series, the older points before its first one,
    /// then its own, the oldest dropped past the length.
    pub fn merge_older(&mut self, older: History) {
        for (key, old) in older.series {
            let ring = self.series.entry(key).or_default();
            let first = ring.front().map(|p| p.0);
            let mut merged: VecDeque<(u32, f32)> = old.into_iter().filter(|p| first.is_none_or(|f| p.0 < f)).collect();
            if STEPPED.contains(&key.2)
                && let (Some(a), Some(b)) = (merged.back(), ring.front())
                && a.1 == b.1
            {
                ring.pop_front();
            }
            merged.extend(ring.drain(..));
            let cap = if STEPPED.contains(&key.2) { STEPPED_POINTS } else { self.points };
            while merged.len() > cap {
                merged.pop_front();
            }
            *ring = merged;
        }
    }
}

/// A counter's changes drawn as steps over `[from_ms, to_ms]`: the value
/// in force at `from_ms`, each change as a vertical step, the last value
/// held to `to_ms`.
fn stepped(ring: &VecDeque<(u32, f32)>, from_ms: i64, to_ms: i64) -> Vec<(i64, f64)> {
    let at = |s: u32| i64::from(s) * 1000;
    let mut out = Vec::new();
    // The value in force at `from_ms`: the last change before it.
    let mut current = ring.iter().take_while(|(s, _)| at(*s) < from_ms).last().map(|(_, v)| f64::from(*v));
    if let Some(c) = current {
        out.push((from_ms, c));
    }
    for (s, v) in ring {
        let (t, v) = (at(*s), f64::from(*v));
        if t < from_ms {
            continue;
        }
        if t > to_ms {
            break;
        }
        if let Some(c) = current {
            out.push((t, c));
        }
        out.push((t, v));
        current = Some(v);
    }
    if let Some(c) = current {
        out.push((to_ms, c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points held, in all.
    fn len(h: &History) -> usize {
        h.series.values().map(VecDeque::len).sum()
    }

    #[test]
    fn one_point_per_bucket_bounded_in_time() {
        let mut h = History::new(60, 10);
        let k = (0, Some(1), ids::TEMPERATURE);
        for s in 0..200 {
            h.push(k, s * 1000, s as f64);
        }
        let all = h.range(k, 0, i64::MAX);
        assert_eq!(all.len(), 6, "60 s at 10 s: {all:?}");
        // The last sample of each bucket.
        assert_eq!(all.last(), Some(&(199_000, 199.0)));
        assert_eq!(all[0], (149_000, 149.0));
        // Non-finite values and other series stay out.
        h.push(k, 300_000, f64::NAN);
        assert_eq!(h.range(k, 0, i64::MAX).len(), 6);
        assert!(h.range((0, Some(2), ids::TEMPERATURE), 0, i64::MAX).is_empty());
        assert_eq!(h.range(k, 180_000, 190_000), vec![(189_000, 189.0)]);
        assert!(History::plotted(ids::POWER_LIMIT) && !History::plotted(ids::ECC_SBE));
    }

    /// A small fleet keeps the configured step; a large one gets a wider
    /// step that keeps the whole history within the budget.
    #[test]
    fn no_history_keeps_nothing() {
        let mut h = History::new(0, 10);
        let k = (0, Some(1), ids::TEMPERATURE);
        h.push(k, 10_000, 70.0);
        assert!(h.range(k, 0, i64::MAX).is_empty());
        assert_eq!(len(&h), 0);
    }

    /// A fault counter keeps its changes only and draws as steps: flat at
    /// the value in force, straight up at the moment it moved.
    #[test]
    fn counters_keep_their_changes_and_draw_as_steps() {
        let mut h = History::new(3600, 10);
        let k = (0, Some(5), ids::ECC_DBE);
        for s in 0..600 {
            h.push(
                k,
                s * 1000,
                if s < 300 {
                    0.0
                } else if s < 450 {
                    1.0
                } else {
                    3.0
                },
            );
        }
        assert_eq!(len(&h), 3, "three values, three points");
        assert_eq!(
            h.range(k, 100_000, 599_000),
            [(100_000, 0.0), (300_000, 0.0), (300_000, 1.0), (450_000, 1.0), (450_000, 3.0), (599_000, 3.0)]
        );
        assert_eq!(h.range(k, 500_000, 599_000), [(500_000, 3.0), (599_000, 3.0)], "the value in force");
        for s in 600..700 {
            h.push(k, s * 1000, s as f64);
        }
        assert_eq!(len(&h), STEPPED_POINTS, "a counter that keeps moving keeps its last changes");
    }

    /// Rebuilt points go under the live ones: older before, nothing
    /// overlapping, a counter's equal value at the seam kept once.
    #[test]
    fn an_older_history_merges_under_the_live_one() {
        let mut live = History::new(3600, 10);
        let t = (0, Some(0), ids::TEMPERATURE);
        let c = (0, Some(0), ids::ECC_DBE);
        for s in 600..700 {
            live.push(t, s * 1000, 70.0);
        }
        live.push(c, 600_000, 1.0);
        let mut old = live.like();
        for s in 0..650 {
            old.push(t, s * 1000, 50.0);
        }
        old.push(c, 0, 0.0);
        old.push(c, 300_000, 1.0);
        live.merge_older(old);
        let pts = live.range(t, 0, i64::MAX);
        assert_eq!(pts.first(), Some(&(9_000, 50.0)), "older points first (last of each bucket)");
        assert!(pts.windows(2).all(|w| w[0].0 < w[1].0), "in order, no overlap");
        assert_eq!(pts.iter().filter(|p| p.1 == 50.0).count(), 60, "only the points before the live ones");
        assert_eq!(live.range(c, 0, 700_000), [(0, 0.0), (300_000, 0.0), (300_000, 1.0), (700_000, 1.0)]);
    }

    #[test]
    fn the_step_widens_to_fit_the_fleet_in_the_budget() {
        let mib = 1024 * 1024;
        for (nodes, max_mib, expect_step) in [(10, 256, 10), (500, 256, 40), (10_000, 256, 1271), (10_000, 4096, 50)] {
            let (h, step) = History::for_fleet(6 * 3600, 10, nodes, max_mib * mib);
            assert_eq!(step, expect_step, "{nodes} nodes in {max_mib} MiB");
            let worst = (nodes * SERIES_PER_NODE) as u64
                * (SERIES_OVERHEAD_BYTES + h.points as u64 * WORST_BYTES_PER_POINT)
                + nodes as u64 * STEPPED_BYTES_PER_NODE;
            assert!(worst <= max_mib * mib || step == 10, "{nodes} nodes: {worst} bytes at worst");
        }
    }
}
