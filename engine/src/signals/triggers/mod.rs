//! Trigger evaluation: small state machines fed by telemetry, one per
//! (trigger, series) — or per (trigger, label group) for fleet triggers.
//!
//! Every state machine fires once per episode: a threshold re-arms only
//! after the value passes its clear level (hysteresis), a prediction only
//! after it stops predicting a crossing, a change trigger on each new edge.

use std::collections::HashMap;

use crate::base::metrics::{self, MetricId};
use crate::runbooks::manifest::{Aggregate, Manifest, PredictModel, Scope, Trigger};
use crate::signals::telemetry::{SeriesKey, SeriesRef, StoreShard, TelemetryStore};

mod groups;
mod series;

pub use groups::{GroupCache, GroupLister};

/// Direction of a level comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Level {
    Above(f64),
    Below(f64),
}

impl Level {
    fn breached(self, v: f64) -> bool {
        match self {
            Level::Above(l) => v > l,
            Level::Below(l) => v < l,
        }
    }
}

/// A trigger ready to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub enum Compiled {
    Threshold {
        metric: MetricId,
        level: Level,
        for_ms: i64,
        clear: Level,
        /// Compare the window's average (`average: true`).
        average: bool,
    },
    Rate {
        metric: MetricId,
        per_min: Level,
        window_ms: i64,
        min_samples: usize,
    },
    Predict {
        metric: MetricId,
        crosses: f64,
        horizon_ms: i64,
        window_ms: i64,
        min_samples: usize,
        model: PredictModel,
    },
    Change {
        metric: MetricId,
        to_any_of: Vec<f64>,
        increase: bool,
    },
    Fleet {
        metric: MetricId,
        agg: Aggregate,
        group_by: String,
        where_above: Option<f64>,
        level: Level,
        for_ms: i64,
        clear: Level,
    },
}

fn levels(
    above: Option<f64>,
    below: Option<f64>,
    clear_below: Option<f64>,
    clear_above: Option<f64>,
) -> (Level, Level) {
    match (above, below) {
        (Some(a), _) => (Level::Above(a), Level::Below(clear_below.unwrap_or(a))),
        (None, Some(b)) => (Level::Below(b), Level::Above(clear_above.unwrap_or(b))),
        _ => (Level::Above(f64::INFINITY), Level::Below(f64::INFINITY)),
    }
}

impl Compiled {
    /// Compile a telemetry trigger (`None` for alert, schedule, manual).
    pub fn from_manifest(m: &Manifest) -> Option<Compiled> {
        let metric = m.metric_id()?;
        Some(match &m.trigger {
            Trigger::Threshold { above, below, for_secs, clear_below, clear_above, average, .. } => {
                let (level, clear) = levels(*above, *below, *clear_below, *clear_above);
                Compiled::Threshold { metric, level, for_ms: *for_secs as i64 * 1000, clear, average: *average }
            }
            Trigger::Rate { per_min_above, per_min_below, window_secs, min_samples, .. } => Compiled::Rate {
                metric,
                per_min: match per_min_above {
                    Some(a) => Level::Above(*a),
                    None => Level::Below(per_min_below.unwrap_or(0.0)),
                },
                window_ms: *window_secs as i64 * 1000,
                min_samples: *min_samples,
            },
            Trigger::Predict { crosses, horizon_secs, window_secs, min_samples, model, .. } => Compiled::Predict {
                metric,
                crosses: *crosses,
                horizon_ms: *horizon_secs as i64 * 1000,
                window_ms: *window_secs as i64 * 1000,
                min_samples: *min_samples,
                model: *model,
            },
            Trigger::Change { to_any_of, increase, .. } => {
                Compiled::Change { metric, to_any_of: to_any_of.clone(), increase: *increase }
            }
            Trigger::Fleet { agg, group_by, above, below, where_above, for_secs, clear_below, clear_above, .. } => {
                let (level, clear) = levels(*above, *below, *clear_below, *clear_above);
                Compiled::Fleet {
                    metric,
                    agg: *agg,
                    group_by: group_by.clone(),
                    where_above: *where_above,
                    level,
                    for_ms: *for_secs as i64 * 1000,
                    clear,
                }
            }
            _ => return None,
        })
    }

    pub fn metric(&self) -> MetricId {
        match self {
            Compiled::Threshold { metric, .. }
            | Compiled::Rate { metric, .. }
            | Compiled::Predict { metric, .. }
            | Compiled::Change { metric, .. }
            | Compiled::Fleet { metric, .. } => *metric,
        }
    }

    /// History the trigger needs, in ms.
    pub fn window_ms(&self) -> i64 {
        match self {
            Compiled::Threshold { for_ms, .. } | Compiled::Fleet { for_ms, .. } => *for_ms,
            Compiled::Rate { window_ms, .. } | Compiled::Predict { window_ms, .. } => *window_ms,
            Compiled::Change { .. } => 0,
        }
    }
}

/// Per-series state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct State {
    pending_since: Option<i64>,
    fired: bool,
    last: Option<f64>,
}

/// A trigger that fired.
#[derive(Debug, Clone, PartialEq)]
pub struct Fire {
    /// Index of the trigger in the set (same as the runbook's index).
    pub trigger: usize,
    pub node: Option<u32>,
    pub gpu: Option<u16>,
    pub group: Option<(String, String)>,
    pub value: f64,
    pub ts_ms: i64,
    pub detail: String,
}

/// Evaluate a threshold-style machine on `v` at `t`; true when it fires.
pub fn step_threshold(st: &mut State, level: Level, clear: Level, for_ms: i64, v: f64, t: i64) -> bool {
    if st.fired {
        if clear.breached(v) {
            st.fired = false;
            st.pending_since = None;
        }
        return false;
    }
    if level.breached(v) {
        let since = *st.pending_since.get_or_insert(t);
        if t - since >= for_ms {
            st.fired = true;
            st.pending_since = None;
            return true;
        }
    } else {
        st.pending_since = None;
    }
    false
}

/// One telemetry trigger and its states.
#[derive(Debug)]
pub struct Entry {
    pub compiled: Compiled,
    pub scope: Scope,
    group_states: HashMap<String, State>,
    /// Times a fleet trigger was evaluated on a group (per tick), and fired.
    group_evaluations: u64,
    group_fires: u64,
}

/// The per-series trigger states of one shard of the store (the series of
/// its nodes): what a thread filling that shard changes, and nothing else.
#[derive(Debug, Default)]
pub struct ShardStates {
    /// Per entry: per series of its metric in the shard, by ordinal.
    states: Vec<Vec<State>>,
    /// Per entry: times it was evaluated on a sample, and fired.
    evaluations: Vec<u64>,
    fires: Vec<u64>,
}

/// The triggers' rules, shared read-only by the threads filling shards.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    entries: &'a [Option<Entry>],
    by_metric: &'a [Vec<usize>],
}

/// The loaded telemetry triggers, indexed by metric.
#[derive(Debug, Default)]
pub struct TriggerSet {
    pub entries: Vec<Option<Entry>>,
    /// Per metric: the entries that watch it.
    by_metric: Vec<Vec<usize>>,
    /// Per store shard.
    shards: Vec<ShardStates>,
}

/// An aggregate over a group's latest values.
fn aggregate(agg: Aggregate, where_above: Option<f64>, vals: &[f64]) -> f64 {
    match agg {
        Aggregate::Avg => vals.iter().sum::<f64>() / vals.len() as f64,
        Aggregate::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        Aggregate::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        Aggregate::Sum => vals.iter().sum(),
        Aggregate::Count => vals.iter().filter(|v| **v > where_above.unwrap_or(f64::INFINITY)).count() as f64,
    }
}

fn fmt_v(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

impl TriggerSet {
    /// Build from the runbooks' manifests, index for index.
    pub fn new<'a>(manifests: impl Iterator<Item = &'a Manifest>) -> TriggerSet {
        let mut set =
            TriggerSet { entries: Vec::new(), by_metric: vec![Vec::new(); metrics::METRICS.len()], shards: Vec::new() };
        for (i, m) in manifests.enumerate() {
            let entry = Compiled::from_manifest(m).map(|compiled| {
                if !matches!(compiled, Compiled::Fleet { .. })
                    && let Some(v) = set.by_metric.get_mut(compiled.metric() as usize)
                {
                    v.push(i);
                }
                Entry { compiled, scope: m.scope, group_states: HashMap::new(), group_evaluations: 0, group_fires: 0 }
            });
            set.entries.push(entry);
        }
        set
    }

    /// Retention each metric needs, in ms (for the telemetry store).
    pub fn retention_ms(&self) -> Vec<i64> {
        let mut r = vec![0i64; metrics::METRICS.len()];
        for e in self.entries.iter().flatten() {
            let m = e.compiled.metric() as usize;
            r[m] = r[m].max(e.compiled.window_ms() + 5_000);
        }
        r
    }

    /// Per metric, the window lengths its triggers read on every sample
    /// (averaged thresholds, rates, predictions): for the store to keep as
    /// running sums ([`TelemetryStore::with_fits`]).
    pub fn fits_ms(&self) -> Vec<Vec<i64>> {
        let mut r = vec![Vec::new(); metrics::METRICS.len()];
        for e in self.entries.iter().flatten() {
            let len = match &e.compiled {
                Compiled::Threshold { for_ms, average: true, .. } => *for_ms,
                Compiled::Rate { window_ms, .. } | Compiled::Predict { window_ms, .. } => *window_ms,
                _ => continue,
            };
            r[e.compiled.metric() as usize].push(len);
        }
        r
    }

    /// Whether any trigger is a fleet aggregate.
    pub fn has_fleet(&self) -> bool {
        self.entries.iter().flatten().any(|e| matches!(e.compiled, Compiled::Fleet { .. }))
    }

    /// Whether any trigger watches this metric (samples of other metrics
    /// need no evaluation).
    pub fn watches(&self, metric: MetricId) -> bool {
        self.by_metric.get(metric as usize).is_some_and(|v| !v.is_empty())
    }

    /// Times trigger `i` was evaluated (on samples and groups), and fired.
    pub fn counts(&self, i: usize) -> (u64, u64) {
        let Some(Some(e)) = self.entries.get(i) else { return (0, 0) };
        let on = |v: &Vec<u64>| v.get(i).copied().unwrap_or(0);
        let ev = self.shards.iter().map(|s| on(&s.evaluations)).sum::<u64>() + e.group_evaluations;
        let fi = self.shards.iter().map(|s| on(&s.fires)).sum::<u64>() + e.group_fires;
        (ev, fi)
    }

    /// The rules and one state table per store shard (at least `shards`),
    /// to evaluate each shard's samples on a thread of its own.
    pub fn split_mut(&mut self, shards: usize) -> (Rules<'_>, &mut [ShardStates]) {
        if self.shards.len() < shards {
            self.shards.resize_with(shards, ShardStates::default);
        }
        (Rules { entries: &self.entries, by_metric: &self.by_metric }, &mut self.shards)
    }

    /// Evaluate the triggers on `metric` after a new point of `key` was
    /// pushed into `store`.
    pub fn on_sample(&mut self, store: &TelemetryStore, r: SeriesRef, ts_ms: i64, v: f64, out: &mut Vec<Fire>) {
        let Some(shard) = store.shards().get(r.shard as usize) else { return };
        let (rules, states) = self.split_mut(store.shards().len());
        rules.on_sample(&mut states[r.shard as usize], shard, r, ts_ms, v, out);
    }
}

impl TriggerSet {
    /// Evaluate fleet triggers over the groups' latest values, kept by
    /// `cache`; `list(label, metric)` lists (value, series keys of the
    /// metric in that group) for the live, undrained nodes when the cache
    /// has no list.
    pub fn on_tick(
        &mut self,
        store: &TelemetryStore,
        cache: &mut GroupCache,
        now_ms: i64,
        list: GroupLister<'_>,
        out: &mut Vec<Fire>,
    ) {
        let mut vals: Vec<f64> = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            let Some(e) = e.as_mut() else { continue };
            let Compiled::Fleet { metric, agg, group_by, where_above, level, for_ms, clear } = &e.compiled else {
                continue;
            };
            for (value, latest) in cache.latest(store, group_by, *metric, list) {
                vals.clear();
                vals.extend(latest.iter().flatten());
                if vals.is_empty() {
                    continue;
                }
                let x = aggregate(*agg, *where_above, &vals);
                e.group_evaluations += 1;
                let st = e.group_states.entry(value.clone()).or_default();
                if step_threshold(st, *level, *clear, *for_ms, x, now_ms) {
                    e.group_fires += 1;
                    let agg_name = format!("{agg:?}").to_lowercase();
                    let (op, l) = match level {
                        Level::Above(l) => ("above", *l),
                        Level::Below(l) => ("below", *l),
                    };
                    out.push(Fire {
                        trigger: i,
                        node: None,
                        gpu: None,
                        group: Some((group_by.clone(), value.clone())),
                        value: x,
                        ts_ms: now_ms,
                        detail: format!(
                            "{agg_name} {} over {group_by}={value} is {} ({op} {}) for {} s",
                            metrics::metric(*metric).name,
                            fmt_v(x),
                            fmt_v(l),
                            for_ms / 1000
                        ),
                    });
                }
            }
        }
    }

    /// Whether trigger `idx`'s condition holds now for the series of
    /// `targets` (node, GPU): the level without its `for_secs`, the rate over
    /// its window, a fleet aggregate over the given series. `None` when it
    /// cannot be told: edges (`change`) and predictions, and series without
    /// readings.
    pub fn still_true(
        &self,
        store: &TelemetryStore,
        idx: usize,
        targets: &[(u32, Option<u16>)],
        now_ms: i64,
    ) -> Option<(bool, String)> {
        let e = self.entries.get(idx)?.as_ref()?;
        let metric = e.compiled.metric();
        let gpu_scoped = metrics::metric(metric).gpu_scoped;
        let keys: Vec<SeriesKey> = targets
            .iter()
            .map(|(node, gpu)| SeriesKey { node: *node, gpu: if gpu_scoped { *gpu } else { None }, metric })
            .collect();
        let name = metrics::metric(metric).name;
        let latest = |k: &SeriesKey| store.latest(*k).map(|(_, v)| v);
        match &e.compiled {
            Compiled::Threshold { level, average: true, for_ms, .. } => {
                let vals: Vec<f64> =
                    keys.iter().filter_map(|k| store.stats(*k, now_ms - for_ms).map(|s| s.avg)).collect();
                if vals.is_empty() {
                    return None;
                }
                let hit = vals.iter().any(|v| level.breached(*v));
                let worst = vals.iter().cloned().fold(f64::NAN, f64::max);
                Some((hit, format!("{name} averages {}", fmt_v(worst))))
            }
            Compiled::Threshold { level, .. } => {
                // For a node target of a GPU metric, any GPU breaching keeps it.
                let keys: Vec<SeriesKey> = if gpu_scoped && targets.iter().all(|(_, g)| g.is_none()) {
                    (0..64u16)
                        .filter_map(|g| {
                            let k = SeriesKey { node: targets.first()?.0, gpu: Some(g), metric };
                            store.latest(k).map(|_| k)
                        })
                        .collect()
                } else {
                    keys
                };
                let vals: Vec<f64> = keys.iter().filter_map(latest).collect();
                if vals.is_empty() {
                    return None;
                }
                let hit = vals.iter().any(|v| level.breached(*v));
                let worst = vals.iter().cloned().fold(f64::NAN, f64::max);
                Some((hit, format!("{name} is {}", fmt_v(worst))))
            }
            Compiled::Rate { per_min, window_ms, min_samples, .. } => {
                let k = keys.first()?;
                let s = store.stats(*k, now_ms - window_ms)?;
                if s.count < *min_samples {
                    return None;
                }
                let rate = s.slope_per_sec * 60.0;
                Some((per_min.breached(rate), format!("{name} changing {} per min", fmt_v(rate))))
            }
            Compiled::Fleet { agg, where_above, level, .. } => {
                let vals: Vec<f64> = keys.iter().filter_map(latest).collect();
                if vals.is_empty() {
                    return None;
                }
                let x = aggregate(*agg, *where_above, &vals);
                Some((level.breached(x), format!("{:?} {name} is {}", agg, fmt_v(x)).to_lowercase()))
            }
            Compiled::Predict { .. } | Compiled::Change { .. } => None,
        }
    }

    /// Forget states for a target (after a run ends, so a still-present
    /// fault can fire again once the cooldown has passed).
    pub fn rearm(&mut self, store: &TelemetryStore, trigger: usize, node: Option<u32>, group: Option<&str>) {
        if let Some(Some(e)) = self.entries.get_mut(trigger) {
            if let Some(n) = node
                && !matches!(e.compiled, Compiled::Change { .. })
            {
                let metric = e.compiled.metric();
                // The node's series are all in its shard.
                let k = store.shard_of(n);
                if let (Some(shard), Some(states)) =
                    (store.shards().get(k), self.shards.get_mut(k).and_then(|s| s.states.get_mut(trigger)))
                {
                    for (ord, st) in states.iter_mut().enumerate() {
                        if shard.key_by_ordinal(metric, ord as u32).is_some_and(|k| k.node == n) {
                            st.fired = false;
                            st.pending_since = None;
                        }
                    }
                }
            }
            if let Some(g) = group
                && let Some(st) = e.group_states.get_mut(g)
            {
                st.fired = false;
                st.pending_since = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::metrics::ids;
    use std::path::Path;

    fn manifest(trigger: &str, scope: &str) -> Manifest {
        let text = format!("version: 1\nname: t\ndescription: d\nscope: {scope}\nscript: t.rhai\ntrigger:\n{trigger}");
        Manifest::parse(&text, Path::new("t.yaml")).unwrap()
    }

    fn key(gpu: u16) -> SeriesKey {
        SeriesKey { node: 0, gpu: Some(gpu), metric: ids::TEMPERATURE }
    }

    /// Feed `series` (one point per second from t=0) and return the times
    /// (s) at which the trigger fired — the same with the windows kept as
    /// running sums as with every window scanned, fire for fire.
    fn fires(trigger: &str, series: &[f64]) -> Vec<i64> {
        let m = manifest(trigger, "gpu");
        let mut set = TriggerSet::new(std::iter::once(&m));
        let mut scanned = TriggerSet::new(std::iter::once(&m));
        let mut store = TelemetryStore::new(set.retention_ms()).with_fits(&set.fits_ms());
        let mut scan_store = TelemetryStore::new(set.retention_ms());
        let (mut out, mut scan_out) = (Vec::new(), Vec::new());
        let mut at = Vec::new();
        for (i, v) in series.iter().enumerate() {
            let t = i as i64 * 1000;
            let r = store.push(key(0), t, *v).unwrap();
            set.on_sample(&store, r, t, *v, &mut out);
            let r = scan_store.push(key(0), t, *v).unwrap();
            scanned.on_sample(&scan_store, r, t, *v, &mut scan_out);
            assert_eq!(out, scan_out, "at {t} ms: running sums and the scan disagree");
            if !out.is_empty() {
                at.push(i as i64);
                out.clear();
                scan_out.clear();
            }
        }
        at
    }

    /// A first-order approach from `from` toward `to` with time constant
    /// `tau` seconds, one point per second.
    fn settle(from: f64, to: f64, tau: f64, secs: usize) -> Vec<f64> {
        (0..secs).map(|t| to - (to - from) * (-(t as f64) / tau).exp()).collect()
    }

    fn ramp(from: f64, to: f64, secs: usize) -> Vec<f64> {
        (0..secs).map(|i| from + (to - from) * i as f64 / (secs - 1).max(1) as f64).collect()
    }

    /// Table: trigger text, input series, expected firing times.
    #[test]
    fn telemetry_triggers_table() {
        let thr = "  type: threshold\n  metric: gpu.temperature_c\n  above: 85\n  for_secs: 3\n  clear_below: 80\n";
        let cat = |parts: &[&[f64]]| parts.concat();
        let cases: Vec<(&str, &str, Vec<f64>, Vec<i64>)> = vec![
            ("threshold fires after for_secs", thr, cat(&[&[70.0; 3], &[90.0; 6]]), vec![6]),
            ("threshold needs the whole for_secs", thr, cat(&[&[90.0, 90.0, 70.0, 90.0, 90.0, 70.0]]), vec![]),
            ("threshold does not fire below", thr, vec![84.9; 10], vec![]),
            ("hysteresis: dipping to 82 does not re-arm", thr, cat(&[&[90.0; 4], &[82.0; 3], &[90.0; 5]]), vec![3]),
            ("hysteresis: falling below 80 re-arms", thr, cat(&[&[90.0; 4], &[79.0; 2], &[90.0; 5]]), vec![3, 9]),
            (
                "whole-degree jitter around the level breaks a per-sample run",
                thr,
                [86.0, 85.0, 87.0, 86.0, 85.0, 86.0, 87.0, 85.0, 86.0, 86.0].repeat(3),
                vec![],
            ),
            (
                "the average over for_secs sees the same jitter as above the level",
                "  type: threshold\n  metric: gpu.temperature_c\n  above: 85\n  for_secs: 3\n  clear_below: 80\n  average: true\n",
                [86.0, 85.0, 87.0, 86.0, 85.0, 86.0, 87.0, 85.0, 86.0, 86.0].repeat(3),
                vec![3],
            ),
            (
                "an average that dips below the clear level re-arms",
                "  type: threshold\n  metric: gpu.temperature_c\n  above: 85\n  for_secs: 3\n  clear_below: 80\n  average: true\n",
                cat(&[&[90.0; 6], &[70.0; 6], &[90.0; 6]]),
                vec![3, 15],
            ),
            (
                "below with clear_above",
                "  type: threshold\n  metric: gpu.temperature_c\n  below: 20\n  clear_above: 25\n",
                cat(&[&[30.0, 10.0, 22.0, 10.0, 26.0, 10.0]]),
                vec![1, 5],
            ),
            (
                "rate fires on a steep rise",
                "  type: rate\n  metric: gpu.temperature_c\n  per_min_above: 30\n  window_secs: 10\n",
                cat(&[&[60.0; 12], &ramp(60.0, 80.0, 20)]),
                vec![17],
            ),
            (
                "rate ignores a slow rise",
                "  type: rate\n  metric: gpu.temperature_c\n  per_min_above: 30\n  window_secs: 10\n",
                ramp(60.0, 70.0, 60),
                vec![],
            ),
            (
                "predict fires before the crossing",
                "  type: predict\n  metric: gpu.temperature_c\n  crosses: 90\n  horizon_secs: 20\n  window_secs: 20\n",
                // 0.5 °C/s from 60 °C: 20 s ahead reaches 90 °C once at 80 °C (t = 40 s).
                ramp(60.0, 89.0, 59),
                vec![40],
            ),
            (
                "predict stays quiet when the horizon is short",
                "  type: predict\n  metric: gpu.temperature_c\n  crosses: 90\n  horizon_secs: 5\n  window_secs: 20\n",
                ramp(60.0, 80.0, 40),
                vec![],
            ),
            (
                "first-order predict fires when the settling level is above the limit",
                "  type: predict\n  metric: gpu.temperature_c\n  crosses: 85\n  horizon_secs: 300\n  window_secs: 30\n  model: {first_order: {time_constant_secs: 90}}\n",
                // Crosses 85 °C at t = 116 s; predicted as soon as 15 s of the window is in.
                settle(74.0, 90.0, 100.0, 300),
                vec![15],
            ),
            (
                "first-order predict stays quiet when a load step settles below the limit",
                "  type: predict\n  metric: gpu.temperature_c\n  crosses: 85\n  horizon_secs: 300\n  window_secs: 30\n  model: {first_order: {time_constant_secs: 90}}\n",
                settle(74.0, 81.0, 90.0, 400),
                vec![],
            ),
            (
                "predict stays quiet on a flat series",
                "  type: predict\n  metric: gpu.temperature_c\n  crosses: 90\n  horizon_secs: 600\n  window_secs: 20\n",
                vec![80.0; 60],
                vec![],
            ),
            (
                "change fires on each new matching edge",
                "  type: change\n  metric: gpu.temperature_c\n  to_any_of: [79, 48]\n",
                vec![0.0, 0.0, 79.0, 79.0, 79.0, 13.0, 48.0, 48.0],
                vec![2, 6],
            ),
            (
                "change on a counter increase",
                "  type: change\n  metric: gpu.temperature_c\n  increase: true\n",
                vec![3.0, 3.0, 4.0, 4.0, 0.0, 1.0],
                vec![2, 5],
            ),
            (
                "a sticky value present at start is a baseline, not an edge",
                "  type: change\n  metric: gpu.temperature_c\n  to_any_of: [79]\n",
                vec![79.0; 5],
                vec![],
            ),
        ];
        for (name, trigger, series, want) in cases {
            assert_eq!(fires(trigger, &series), want, "{name}");
        }
    }

    #[test]
    fn fleet_aggregates_over_groups() {
        let m = manifest(
            "  type: fleet\n  metric: gpu.power_pct_of_limit\n  agg: avg\n  group_by: pool\n  above: 90\n  for_secs: 2\n  clear_below: 80\n",
            "group",
        );
        let mut set = TriggerSet::new(std::iter::once(&m));
        let mut store = TelemetryStore::new(set.retention_ms());
        let k = |node: u32, gpu: u16| SeriesKey { node, gpu: Some(gpu), metric: ids::POWER_PCT };
        let groups = |label: &str, _m: MetricId| -> Vec<(String, Vec<SeriesKey>)> {
            assert_eq!(label, "pool");
            vec![("a".into(), vec![k(0, 0), k(0, 1), k(1, 0)]), ("b".into(), vec![k(2, 0)])]
        };
        let mut cache = GroupCache::default();
        let mut fired = Vec::new();
        for t in 0..6i64 {
            // Pool a averages 93.3 %, pool b 50 %.
            for (n, g, v) in [(0, 0, 95.0), (0, 1, 95.0), (1, 0, 90.0), (2, 0, 50.0)] {
                store.push(k(n, g), t * 1000, v);
                cache.touch(n);
            }
            cache.refresh(vec![], &store);
            let mut out = Vec::new();
            set.on_tick(&store, &mut cache, t * 1000, &groups, &mut out);
            fired.extend(out.into_iter().map(|f| (t, f.group.unwrap().1, f.detail)));
        }
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert_eq!(fired[0].0, 2);
        assert_eq!(fired[0].1, "a");
        assert!(fired[0].2.starts_with("avg gpu.power_pct_of_limit over pool=a is 93.33 (above 90)"), "{}", fired[0].2);
        // Count aggregate.
        let m = manifest(
            "  type: fleet\n  metric: gpu.power_pct_of_limit\n  agg: count\n  where_above: 92\n  group_by: pool\n  above: 1\n",
            "group",
        );
        let mut set = TriggerSet::new(std::iter::once(&m));
        let mut out = Vec::new();
        set.on_tick(&store, &mut cache, 6_000, &groups, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, 2.0);
    }

    #[test]
    fn retention_is_sized_by_triggers() {
        let m = manifest(
            "  type: predict\n  metric: gpu.temperature_c\n  crosses: 90\n  horizon_secs: 60\n  window_secs: 300\n",
            "gpu",
        );
        let set = TriggerSet::new(std::iter::once(&m));
        let r = set.retention_ms();
        assert_eq!(r[ids::TEMPERATURE as usize], 305_000);
        assert_eq!(r[ids::POWER as usize], 0);
    }
}
