//! The telemetry windows and the triggers watching them ([`Brain`]): built
//! for a runbook set, filled a batch at a time — in shards by node, one
//! thread a shard for a large batch, with the fires put back in sample
//! order so that what fires never depends on the shard count.

use crate::base::metrics::{self, MetricId};
use crate::runbooks::runbook::RunbookSet;
use crate::signals::telemetry::{SeriesKey, StoreShard, TelemetryStore};
use crate::signals::triggers::{Fire, GroupCache, GroupLister, ShardStates, TriggerSet};

/// The telemetry store and the triggers watching it.
pub struct Brain {
    store: TelemetryStore,
    triggers: TriggerSet,
    fires: Vec<Fire>,
    /// The fleet triggers' groups while the fleet is unchanged.
    groups: GroupCache,
}

/// Metric names that appear as string literals in a script: those get the
/// script window of history.
fn metrics_named_in(source: &str) -> Vec<MetricId> {
    metrics::METRICS
        .iter()
        .enumerate()
        .filter(|(_, m)| source.contains(&format!("\"{}\"", m.name)))
        .map(|(i, _)| i as MetricId)
        .collect()
}

/// Below this many samples a batch is ingested on the caller's thread
/// whatever the shard count (a thread costs more than it saves).
const PARALLEL_MIN_SAMPLES: usize = 4096;

impl Brain {
    /// The telemetry windows, to read.
    pub fn store(&self) -> &TelemetryStore {
        &self.store
    }

    /// The triggers, to read (counts, whether a condition still holds).
    pub fn triggers(&self) -> &TriggerSet {
        &self.triggers
    }

    /// Fire trigger `trigger` again for `node` (or `group`) if its
    /// condition still holds (a run it started was suppressed or ended).
    pub(crate) fn rearm(&mut self, trigger: usize, node: Option<u32>, group: Option<&str>) {
        self.triggers.rearm(&self.store, trigger, node, group);
    }

    /// The fleet triggers' tick at `now`: the groups listed again when the
    /// fleet's `basis` changed (`GroupCache::refresh`), each fleet trigger
    /// evaluated over `list`'s series; what fired.
    pub(crate) fn fleet_tick(&mut self, basis: Vec<u64>, now: i64, list: GroupLister<'_>) -> Vec<Fire> {
        let Brain { store, triggers, fires, groups } = self;
        groups.refresh(basis, store);
        triggers.on_tick(store, groups, now, list, fires);
        std::mem::take(fires)
    }

    /// Triggers for `set`, and a store keeping what they and the scripts
    /// need, in `shards` shards (`telemetry.ingest_shards`).
    pub fn build(set: &RunbookSet, script_window_ms: i64, shards: usize) -> Brain {
        let triggers = TriggerSet::new(set.runbooks.iter().map(|r| &r.manifest));
        let mut retention = triggers.retention_ms();
        for rb in &set.runbooks {
            let keep = script_window_ms.max(rb.manifest.history_secs.map_or(0, |h| h as i64 * 1000));
            let mut named = metrics_named_in(&rb.script_source);
            // `thermal_fit` reads temperature against power, and the fan
            // speeds to find where the airflow last changed.
            if rb.script_source.contains("thermal_fit(") {
                named.extend([
                    metrics::ids::TEMPERATURE,
                    metrics::ids::POWER,
                    metrics::ids::FAN,
                    metrics::ids::CHASSIS_FAN,
                ]);
            }
            for m in named {
                retention[m as usize] = retention[m as usize].max(keep);
            }
        }
        Brain {
            store: TelemetryStore::with_shards(retention, shards).with_fits(&triggers.fits_ms()),
            triggers,
            fires: Vec::new(),
            groups: GroupCache::default(),
        }
    }

    /// Push samples and step the triggers watching them; what fired, in
    /// sample order.
    ///
    /// With more than one shard and a large batch (a Prometheus pull, a
    /// backtest step) each shard's samples are pushed and evaluated on a
    /// thread of its own — a shard owns its nodes' series and their trigger
    /// states outright — and the fires are put back in sample order: the
    /// result is the one-shard result, bit for bit.
    pub fn ingest(&mut self, samples: &[(SeriesKey, i64, f64)]) -> Vec<Fire> {
        let Brain { store, triggers, fires, groups } = self;
        for (key, _, _) in samples {
            groups.touch(key.node);
        }
        let n = store.shards().len();
        // A large batch's order is noted: a shard whose series lie in
        // another order is laid out in this one (`telemetry/layout.rs`).
        let large = samples.len() >= PARALLEL_MIN_SAMPLES;
        if n == 1 || !large {
            if large {
                store.shards_mut().iter_mut().for_each(StoreShard::note_order);
            }
            for &(key, ts, v) in samples {
                if let Some(r) = store.push(key, ts, v)
                    && triggers.watches(key.metric)
                {
                    triggers.on_sample(store, r, ts, v, fires);
                }
            }
            if large {
                store.shards_mut().iter_mut().for_each(|sh| {
                    sh.settle_order();
                });
            }
            return std::mem::take(fires);
        }
        let mut parts: Vec<Vec<u32>> = vec![Vec::with_capacity(samples.len() / n + 1); n];
        for (i, (key, _, _)) in samples.iter().enumerate() {
            parts[store.shard_of(key.node)].push(i as u32);
        }
        let (rules, states) = triggers.split_mut(n);
        let fill = |shard: &mut StoreShard, st: &mut ShardStates, idx: &[u32]| -> Vec<(u32, Fire)> {
            let (mut out, mut tagged) = (Vec::new(), Vec::new());
            shard.note_order();
            for &i in idx {
                let (key, ts, v) = samples[i as usize];
                if let Some(r) = shard.push(key, ts, v)
                    && rules.watches(key.metric)
                {
                    rules.on_sample(st, shard, r, ts, v, &mut out);
                    tagged.extend(out.drain(..).map(|f| (i, f)));
                }
            }
            shard.settle_order();
            tagged
        };
        let fill = &fill;
        let mut tagged = std::thread::scope(|scope| {
            let mut work = store.shards_mut().iter_mut().zip(states.iter_mut()).zip(&parts);
            let Some(((first, first_states), first_idx)) = work.next() else { return Vec::new() };
            let others: Vec<_> = work.map(|((sh, st), idx)| scope.spawn(move || fill(sh, st, idx))).collect();
            let mut all = fill(first, first_states, first_idx);
            for h in others {
                match h.join() {
                    Ok(v) => all.extend(v),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            all
        });
        // One sample's fires come from one shard, in entry order: a stable
        // sort by sample keeps them so.
        tagged.sort_by_key(|(i, _)| *i);
        tagged.into_iter().map(|(_, f)| f).collect()
    }
}
