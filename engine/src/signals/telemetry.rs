//! Telemetry windows: per-series ring buffers of (time, value), each kept
//! only as long as the loaded triggers need (never unbounded).

use std::collections::VecDeque;

use nightshift_proto::Telemetry;

use crate::base::metrics::{METRICS, MetricId, ids};

mod fit;
mod layout;

pub use fit::WindowFit;
use fit::{Fit, MAX_FIT_MS};

/// Identifies one series: a metric on a node, or on one of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub node: u32,
    pub gpu: Option<u16>,
    pub metric: MetricId,
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

/// One series: its key, its ordinal among the series of its metric (trigger
/// states are dense vectors indexed by it), its newest point, and — for
/// metrics a trigger keeps history of — a window: the shard's `windows`
/// at `window` (`NO_WINDOW`: none), its running sums the shard's `fits`
/// from `fits`, `nfits` of them. Series, windows and sums each lie in one
/// vector in the order the series first arrived, which is the order a
/// scrape brings them in again: read in order, not chased; and a series
/// without a window (most of them) costs no window's bytes.
#[derive(Debug)]
struct Series {
    key: SeriesKey,
    ordinal: u32,
    last_v: f32,
    last_ms: i64,
    window: u32,
    fits: u32,
    nfits: u8,
}

/// [`Series::window`] of a series that keeps none.
const NO_WINDOW: u32 = u32::MAX;

/// One point of a window, 6 bytes: the gap to the previous point in ms
/// (`u16`) and the value (`f32`: telemetry has no more precision than
/// that), little-endian — one ring, so the newest and the oldest point are
/// one cache line each.
type Point = [u8; 6];

fn point(gap_ms: u16, value: f32) -> Point {
    let (g, v) = (gap_ms.to_le_bytes(), value.to_le_bytes());
    [g[0], g[1], v[0], v[1], v[2], v[3]]
}

fn gap_of(p: &Point) -> u16 {
    u16::from_le_bytes([p[0], p[1]])
}

fn value_of(p: &Point) -> f32 {
    f32::from_le_bytes([p[2], p[3], p[4], p[5]])
}

/// The points of a window. A gap longer than 65.5 s restarts the window —
/// a trend across a telemetry outage is not evidence of anything.
///
/// The series' running sums ([`fit`]), passed in, are advanced with the
/// window, before the window lets go of anything.
#[derive(Debug, Default)]
struct Window {
    front_ms: i64,
    points: VecDeque<Point>,
}

impl Window {
    fn iter(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        let mut t = self.front_ms;
        self.points.iter().map(move |p| {
            t += gap_of(p) as i64;
            (t, value_of(p) as f64)
        })
    }

    fn pop_front(&mut self, fits: &mut [Fit]) {
        self.points.pop_front();
        if let Some(p) = self.points.front_mut() {
            self.front_ms += gap_of(p) as i64;
            *p = point(0, value_of(p));
        }
        for f in fits {
            f.popped();
        }
    }

    /// Start over at one point.
    fn restart(&mut self, fits: &mut [Fit], ts_ms: i64, value: f32) {
        self.points.clear();
        self.front_ms = ts_ms;
        self.points.push_back(point(0, value));
        for f in fits {
            f.clear();
            f.add(0, ts_ms, value);
        }
    }

    /// Append (`ts_ms` ≥ the newest point), evicting points older than
    /// `ts_ms - keep_ms`.
    fn push(&mut self, fits: &mut [Fit], last_ms: i64, ts_ms: i64, value: f32, keep_ms: i64) {
        let gap = ts_ms.saturating_sub(last_ms);
        if self.points.is_empty() || gap > u16::MAX as i64 {
            self.restart(fits, ts_ms, value);
            return;
        }
        // The running sums first, while the window still holds what they
        // let go of.
        for f in fits.iter_mut() {
            f.evict(ts_ms, &self.points);
        }
        let horizon = ts_ms - keep_ms;
        while !self.points.is_empty() && self.front_ms < horizon {
            self.pop_front(fits);
        }
        if self.points.is_empty() {
            self.restart(fits, ts_ms, value);
            return;
        }
        let len = self.points.len();
        if len == self.points.capacity() {
            // Grow to what the retention needs at the observed interval
            // rather than doubling: a 10-minute window at 1 Hz holds ~605
            // points, not 1024.
            let want = if len >= 2 {
                let interval = ((last_ms - self.front_ms) / (len as i64 - 1)).max(1);
                ((keep_ms / interval) as usize + 3).clamp(len + 1, len * 2 + 4)
            } else {
                len + 2
            };
            self.points.reserve_exact(want.saturating_sub(len));
        }
        self.points.push_back(point(gap as u16, value));
        let index = self.points.len() as u32 - 1;
        for f in fits {
            f.add(index, ts_ms, value);
        }
    }
}

impl Series {
    fn last(&self) -> (i64, f64) {
        (self.last_ms, self.last_v as f64)
    }

    /// Points at or after `since_ms` (the newest alone when no window is
    /// kept).
    fn iter_from<'a>(&'a self, w: Option<&'a Window>, since_ms: i64) -> Box<dyn Iterator<Item = (i64, f64)> + 'a> {
        match w {
            Some(w) => Box::new(w.iter().skip_while(move |(t, _)| *t < since_ms)),
            None => Box::new(std::iter::once(self.last()).filter(move |(t, _)| *t >= since_ms)),
        }
    }

    fn len(&self, w: Option<&Window>) -> usize {
        w.map_or(1, |w| w.points.len())
    }

    /// [`stats_of`] the points at or after `since_ms`, without the boxed
    /// iterator of [`Series::iter_from`] (the per-sample trigger path: the
    /// same points in the same order, so the same bits).
    fn stats_from(&self, w: Option<&Window>, since_ms: i64) -> Option<WindowStats> {
        match w {
            Some(w) => stats_of(w.iter().skip_while(move |(t, _)| *t < since_ms)),
            None => stats_of(std::iter::once(self.last()).filter(move |(t, _)| *t >= since_ms)),
        }
    }

    /// The fit of the `len_ms` before `newest_ms`: from the running sums
    /// (`fits`, this series' own) when they are kept for that length and
    /// the newest point is at `newest_ms` and every point is exact in them;
    /// else scanned.
    fn fit(&self, w: Option<&Window>, fits: &[Fit], newest_ms: i64, len_ms: i64) -> Option<WindowFit> {
        if let Some(w) = w
            && self.last_ms == newest_ms
            && let Some(f) = fits.iter().find(|f| f.len_ms == len_ms)
            && let Some(r) = f.result(&w.points, self.last())
        {
            return Some(r);
        }
        self.stats_from(w, newest_ms - len_ms).map(WindowFit::from)
    }
}

/// A handle to a series returned by [`TelemetryStore::push`]: its shard,
/// its slot there and its ordinal among that shard's series of its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesRef {
    pub shard: u32,
    pub slot: u32,
    pub ordinal: u32,
}

/// One shard of the store: the series of the nodes whose index is the
/// shard's number modulo the shard count. Series live in a vector; a dense
/// per-node table (node index × GPU × metric) finds a key's slot without
/// hashing.
#[derive(Debug)]
pub struct StoreShard {
    number: u32,
    count: u32,
    /// Per node of the shard (index ÷ shards): slot + 1 by
    /// `(gpu + 1) × metrics + metric` (0 = none).
    table: Vec<Vec<u32>>,
    series: Vec<Series>,
    /// The windows of the series that keep one.
    windows: Vec<Window>,
    /// Per metric: the slots of its series, by ordinal.
    by_metric: Vec<Vec<u32>>,
    /// Per metric: how long to keep points (0 = latest only).
    retention_ms: Vec<i64>,
    /// Per metric: the window lengths kept as running sums.
    fits_ms: Vec<Vec<i64>>,
    /// The running sums of every series, each series' together, in the
    /// order of the series.
    fits: Vec<Fit>,
    samples_in: u64,
    /// The order of a large batch's pushes, while one is noted
    /// ([`StoreShard::note_order`]; `layout.rs`).
    order: layout::Order,
}

/// The store: per-series windows, split by node into shards that can be
/// filled in parallel (each owns its nodes' series outright). A series'
/// points, and so every statistic and trigger state, do not depend on the
/// shard count.
#[derive(Debug)]
pub struct TelemetryStore {
    shards: Vec<StoreShard>,
}

impl StoreShard {
    fn cell(key: SeriesKey) -> usize {
        key.gpu.map_or(0, |g| g as usize + 1) * METRICS.len() + key.metric as usize
    }

    fn row(&self, node: u32) -> usize {
        (node / self.count) as usize
    }

    fn slot_of(&self, key: SeriesKey) -> Option<u32> {
        let slot = *self.table.get(self.row(key.node))?.get(Self::cell(key))?;
        slot.checked_sub(1)
    }

    /// Add a point (see [`TelemetryStore::push`]).
    pub fn push(&mut self, key: SeriesKey, ts_ms: i64, value: f64) -> Option<SeriesRef> {
        self.samples_in += 1;
        let keep = *self.retention_ms.get(key.metric as usize)?;
        // The slot the last noted batch had at this place, if it is this
        // key's: a batch like the one before finds its series without the
        // table (a cache miss a sample on a fleet).
        let hinted = self.order.hint(&self.series, key);
        if hinted.is_some() {
            self.order.hit();
        }
        let slot = match hinted.or_else(|| self.slot_of(key)) {
            Some(slot) => slot,
            None => {
                let slot = self.series.len() as u32;
                let per_metric = &mut self.by_metric[key.metric as usize];
                let ordinal = per_metric.len() as u32;
                per_metric.push(slot);
                let at = self.fits.len() as u32;
                let mut nfits = 0u8;
                if keep > 0 {
                    for len in self.fits_ms.get(key.metric as usize).into_iter().flatten().take(u8::MAX as usize) {
                        self.fits.push(Fit::new(*len));
                        nfits += 1;
                    }
                }
                let window = if keep > 0 && self.windows.len() < NO_WINDOW as usize {
                    self.windows.push(Window::default());
                    self.windows.len() as u32 - 1
                } else {
                    NO_WINDOW
                };
                self.series.push(Series {
                    key,
                    ordinal,
                    last_v: value as f32,
                    last_ms: i64::MIN,
                    window,
                    fits: at,
                    nfits,
                });
                let row = self.row(key.node);
                if self.table.len() <= row {
                    self.table.resize_with(row + 1, Vec::new);
                }
                let row = &mut self.table[row];
                let cell = Self::cell(key);
                if row.len() <= cell {
                    // Whole GPUs at a time.
                    row.resize((cell / METRICS.len() + 1) * METRICS.len(), 0);
                }
                row[cell] = slot + 1;
                slot
            }
        };
        self.order.saw(slot);
        let s = &mut self.series[slot as usize];
        if s.last_ms > ts_ms {
            return None;
        }
        if let Some(w) = self.windows.get_mut(s.window as usize) {
            let fits = &mut self.fits[s.fits as usize..s.fits as usize + s.nfits as usize];
            w.push(fits, s.last_ms, ts_ms, value as f32, keep);
        }
        s.last_ms = ts_ms;
        s.last_v = value as f32;
        Some(SeriesRef { shard: self.number, slot, ordinal: s.ordinal })
    }

    /// The key of a slot.
    pub fn key(&self, slot: u32) -> Option<SeriesKey> {
        self.series.get(slot as usize).map(|s| s.key)
    }

    /// The key of the `ordinal`-th series of `metric` in this shard.
    pub fn key_by_ordinal(&self, metric: MetricId, ordinal: u32) -> Option<SeriesKey> {
        let slot = *self.by_metric.get(metric as usize)?.get(ordinal as usize)?;
        self.key(slot)
    }

    fn get(&self, key: SeriesKey) -> Option<&Series> {
        self.slot_of(key).map(|slot| &self.series[slot as usize])
    }

    fn window_of(&self, s: &Series) -> Option<&Window> {
        self.windows.get(s.window as usize)
    }

    /// Statistics of a slot's points at or after `since_ms`.
    pub fn stats_slot(&self, slot: u32, since_ms: i64) -> Option<WindowStats> {
        let s = self.series.get(slot as usize)?;
        s.stats_from(self.window_of(s), since_ms)
    }

    /// The fit (count, average, first and last point, slope) of a slot's
    /// points in the `len_ms` before `newest_ms`: what [`Self::stats_slot`]
    /// from `newest_ms − len_ms` gives, in constant time when the length is
    /// kept as running sums ([`TelemetryStore::with_fits`]).
    pub fn fit_slot(&self, slot: u32, newest_ms: i64, len_ms: i64) -> Option<WindowFit> {
        let s = self.series.get(slot as usize)?;
        s.fit(self.window_of(s), self.fits_of(s), newest_ms, len_ms)
    }

    fn fits_of(&self, s: &Series) -> &[Fit] {
        self.fits.get(s.fits as usize..s.fits as usize + s.nfits as usize).unwrap_or_default()
    }
}

impl TelemetryStore {
    /// A store keeping each metric for `retention_ms[metric]` (missing = 0:
    /// only the latest point), in one shard.
    pub fn new(retention_ms: Vec<i64>) -> TelemetryStore {
        TelemetryStore::with_shards(retention_ms, 1)
    }

    /// The same in `shards` shards (at least one).
    pub fn with_shards(mut retention_ms: Vec<i64>, shards: usize) -> TelemetryStore {
        retention_ms.resize(METRICS.len(), 0);
        // The utilisation swing is derived from a minute of utilisation.
        retention_ms[ids::UTIL as usize] = retention_ms[ids::UTIL as usize].max(60_000);
        let count = shards.clamp(1, 256) as u32;
        TelemetryStore {
            shards: (0..count)
                .map(|number| StoreShard {
                    number,
                    count,
                    table: Vec::new(),
                    series: Vec::new(),
                    windows: Vec::new(),
                    by_metric: vec![Vec::new(); METRICS.len()],
                    retention_ms: retention_ms.clone(),
                    fits_ms: vec![Vec::new(); METRICS.len()],
                    fits: Vec::new(),
                    samples_in: 0,
                    order: Default::default(),
                })
                .collect(),
        }
    }

    /// The same, keeping running sums of the given window lengths per
    /// metric (the lengths the triggers read on every sample), so their
    /// fits cost constant time. A length longer than the metric's
    /// retention, or than 24.8 days, is not kept (it is scanned). Series
    /// already held keep scanning.
    pub fn with_fits(mut self, fits_ms: &[Vec<i64>]) -> TelemetryStore {
        for shard in &mut self.shards {
            for (m, lens) in fits_ms.iter().enumerate().take(METRICS.len()) {
                let keep = shard.retention_ms[m];
                let mut v: Vec<i64> =
                    lens.iter().copied().filter(|l| *l > 0 && *l <= keep && *l <= MAX_FIT_MS).collect();
                v.sort_unstable();
                v.dedup();
                shard.fits_ms[m] = v;
            }
        }
        self
    }

    /// The shard holding a node's series.
    pub fn shard_of(&self, node: u32) -> usize {
        (node % self.shards.len() as u32) as usize
    }

    /// Every shard, each to be filled on a thread of its own.
    pub fn shards_mut(&mut self) -> &mut [StoreShard] {
        &mut self.shards
    }

    /// The shards.
    pub fn shards(&self) -> &[StoreShard] {
        &self.shards
    }

    /// How long a metric is kept.
    pub fn retention_ms(&self, metric: MetricId) -> i64 {
        self.shards[0].retention_ms[metric as usize]
    }

    /// Add a point. Returns the series' handle, or `None` when the point
    /// was older than the newest one held (a late scrape) and was dropped
    /// rather than break the window's order, or the metric is unknown.
    pub fn push(&mut self, key: SeriesKey, ts_ms: i64, value: f64) -> Option<SeriesRef> {
        let shard = self.shard_of(key.node);
        self.shards[shard].push(key, ts_ms, value)
    }

    /// The key a handle names.
    pub fn key(&self, r: SeriesRef) -> Option<SeriesKey> {
        self.shards.get(r.shard as usize)?.key(r.slot)
    }

    fn get(&self, key: SeriesKey) -> Option<(&StoreShard, &Series)> {
        let shard = &self.shards[self.shard_of(key.node)];
        Some((shard, shard.get(key)?))
    }

    /// The latest point.
    pub fn latest(&self, key: SeriesKey) -> Option<(i64, f64)> {
        Some(self.get(key)?.1.last())
    }

    /// Points at or after `since_ms`.
    pub fn window(&self, key: SeriesKey, since_ms: i64) -> Vec<(i64, f64)> {
        self.get(key).map(|(sh, s)| s.iter_from(sh.window_of(s), since_ms).collect()).unwrap_or_default()
    }

    /// Statistics of the points at or after `since_ms`.
    pub fn stats(&self, key: SeriesKey, since_ms: i64) -> Option<WindowStats> {
        let (shard, s) = self.get(key)?;
        s.stats_from(shard.window_of(s), since_ms)
    }

    /// Statistics of a handle's points at or after `since_ms`.
    pub fn stats_ref(&self, r: SeriesRef, since_ms: i64) -> Option<WindowStats> {
        self.shards.get(r.shard as usize)?.stats_slot(r.slot, since_ms)
    }

    /// Number of series held.
    pub fn series_count(&self) -> usize {
        self.shards.iter().map(|s| s.series.len()).sum()
    }

    /// Points held across all series.
    pub fn points(&self) -> usize {
        self.shards.iter().flat_map(|sh| sh.series.iter().map(|s| s.len(sh.window_of(s)))).sum()
    }

    /// Bytes reserved for window points (6 a point).
    pub fn point_bytes(&self) -> usize {
        self.shards.iter().flat_map(|s| &s.windows).map(|w| w.points.capacity() * size_of::<Point>()).sum()
    }

    /// Samples pushed since start.
    pub fn samples_in(&self) -> u64 {
        self.shards.iter().map(|s| s.samples_in).sum()
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
    let mut out = Vec::with_capacity(t.gpus.len() * 16 + 12);
    for g in &t.gpus {
        let i = Some(g.index as u16);
        out.push((i, ids::LOST, g.lost as u8 as f64));
        if let Some(x) = g.xid_last {
            out.push((i, ids::XID, x as f64));
        }
        if let Some(n) = g.xid_events_total {
            out.push((i, ids::XID_EVENTS, n as f64));
        }
        if g.lost {
            // A GPU off the bus has no readings: its zeros are not
            // measurements.
            continue;
        }
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
        if let Some(p) = g.mem_peak_allocated_pct {
            out.push((i, ids::MEM_PEAK, p));
        }
        out.push((i, ids::MEM_NEED, g.mem_peak_allocated_pct.unwrap_or(g.mem_used_pct)));
        if let Some(a) = g.sm_active_pct {
            out.push((i, ids::SM_ACTIVE, a));
        }
        if let Some(f) = g.mem_fragmentation_pct {
            out.push((i, ids::MEM_FRAG, f));
        }
        if let Some(c) = g.sm_clock_mhz {
            out.push((i, ids::SM_CLOCK, c as f64));
        }
        out.push((i, ids::ECC_SBE, g.ecc_sbe_total as f64));
        out.push((i, ids::ECC_DBE, g.ecc_dbe_total as f64));
        out.push((i, ids::THROTTLED, g.throttled as u8 as f64));
        if let Some(m) = g.mem_temperature_c {
            out.push((i, ids::MEM_TEMP, m));
        }
        if let Some(b) = g.row_remap_failure {
            out.push((i, ids::REMAP_FAILURE, b as u8 as f64));
        }
        if let Some(b) = g.row_remap_pending {
            out.push((i, ids::REMAP_PENDING, b as u8 as f64));
        }
        if let Some(b) = g.reset_required {
            out.push((i, ids::RESET_REQUIRED, b as u8 as f64));
        }
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
    if let Some(v) = n.job_oom_events_total {
        out.push((None, ids::OOM_EVENTS, v as f64));
    }
    if let Some(v) = n.comm_overhead_pct {
        out.push((None, ids::COMM_OVERHEAD, v));
    }
    if let Some(v) = n.job_progress {
        out.push((None, ids::JOB_PROGRESS, v));
    }
    if let Some(v) = n.job_stalled_secs {
        out.push((None, ids::JOB_STALLED, v));
    }
    if let Some(v) = n.jobs_running {
        out.push((None, ids::JOBS_RUNNING, v as f64));
    }
    if let Some(v) = n.job_world_size {
        out.push((None, ids::JOB_WORLD_SIZE, v as f64));
    }
    if let Some(v) = n.chassis_fan_pct {
        out.push((None, ids::CHASSIS_FAN, v));
    }
    if let Some(v) = n.flush_registered {
        out.push((None, ids::FLUSH_REGISTERED, v as f64));
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
    fn times_survive_a_rebase_and_windows_are_sized_to_retention() {
        let mut retention = vec![0; METRICS.len()];
        retention[ids::TEMPERATURE as usize] = 60 * 86_400_000;
        retention[ids::POWER as usize] = 600_000;
        let mut s = TelemetryStore::new(retention);
        // Gaps up to 65.5 s are kept exactly; a longer one restarts the
        // window.
        let t0 = 1_790_000_000_000;
        for dt in [0i64, 1, 65_536, 131_071, 200_000, 200_500] {
            s.push(key(ids::TEMPERATURE), t0 + dt, dt as f64);
        }
        let w = s.window(key(ids::TEMPERATURE), 0);
        let expected: Vec<(i64, f64)> = [200_000, 200_500].iter().map(|d| (t0 + d, *d as f64)).collect();
        assert_eq!(w, expected);
        assert_eq!(s.latest(key(ids::TEMPERATURE)), Some((t0 + 200_500, 200_500.0)));
        let mut s2 = TelemetryStore::new(vec![0; METRICS.len()].into_iter().map(|_| 600_000).collect());
        for dt in [0i64, 1, 65_535, 131_070] {
            s2.push(key(ids::TEMPERATURE), t0 + dt, dt as f64);
        }
        assert_eq!(s2.window(key(ids::TEMPERATURE), 0).len(), 4);
        assert_eq!(s2.window(key(ids::TEMPERATURE), t0 + 2).len(), 2);
        // A 10-minute window at 1 Hz reserves about 605 points, not 1024.
        for i in 0..2_000 {
            s.push(key(ids::POWER), t0 + i * 1000, 1.0);
        }
        assert_eq!(s.window(key(ids::POWER), 0).len(), 601);
        let bytes = s.point_bytes() - s.window(key(ids::TEMPERATURE), 0).len() * 6;
        assert!(bytes <= 620 * 6, "{bytes} bytes reserved for 601 points");
        assert_eq!(s.stats(key(ids::POWER), t0 + 1_990_000).unwrap().count, 10);
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
