//! The fleet triggers' groups and their latest values ([`GroupCache`]),
//! kept between ticks: a tick re-reads only the series of the nodes whose
//! telemetry came in since the last one, and lists the groups again only
//! when the fleet changed. On 2,048 nodes × 8 GPUs a tick near one incident
//! read 16,384 series per fleet trigger before; now it reads that node's 8.

use std::collections::HashMap;

use crate::base::metrics::MetricId;
use crate::signals::telemetry::{SeriesKey, TelemetryStore};

/// Lists `(label value, series keys)` for a label and metric (the fleet's
/// live, undrained nodes).
pub type GroupLister<'a> = &'a dyn Fn(&str, MetricId) -> Vec<(String, Vec<SeriesKey>)>;

/// One label's groups for one metric.
#[derive(Debug, Default)]
struct Listed {
    /// `(label value, series keys)`, in the lister's order.
    keys: Vec<(String, Vec<SeriesKey>)>,
    /// `(label value, latest value of each key)`, the same shape.
    latest: Vec<(String, Vec<Option<f64>>)>,
    /// Per node: `(group, position)` of each of its keys.
    by_node: HashMap<u32, Vec<(usize, usize)>>,
}

impl Listed {
    fn new(keys: Vec<(String, Vec<SeriesKey>)>, store: &TelemetryStore) -> Listed {
        let mut by_node: HashMap<u32, Vec<(usize, usize)>> = HashMap::new();
        let latest = keys
            .iter()
            .enumerate()
            .map(|(g, (value, ks))| {
                for (p, k) in ks.iter().enumerate() {
                    by_node.entry(k.node).or_default().push((g, p));
                }
                (value.clone(), ks.iter().map(|k| store.latest(*k).map(|(_, v)| v)).collect())
            })
            .collect();
        Listed { keys, latest, by_node }
    }

    fn reread(&mut self, node: u32, store: &TelemetryStore) {
        for &(g, p) in self.by_node.get(&node).into_iter().flatten() {
            self.latest[g].1[p] = store.latest(self.keys[g].1[p]).map(|(_, v)| v);
        }
    }
}

/// The fleet triggers' group lists and latest values, kept while what the
/// lists came from — the `basis`, one number per fact that goes into them
/// (the node list's generation, each node's index, liveness and GPU count) —
/// is the same, and while every telemetry batch [`touch`](Self::touch)es
/// its nodes. The values are the store's, read again per touched node: the
/// aggregates are the ones a full read would give, bit for bit (the same
/// keys in the same order).
#[derive(Debug, Default)]
pub struct GroupCache {
    basis: Vec<u64>,
    lists: HashMap<(String, MetricId), Listed>,
    /// Nodes whose telemetry came in since the last refresh.
    touched: Vec<u32>,
    /// Lists built since the start (one per label and metric per change of
    /// the fleet), and series read: what a test reads to know the cache held.
    pub built: u64,
    pub reads: u64,
}

impl GroupCache {
    /// A batch of `node`'s telemetry went into the store.
    pub fn touch(&mut self, node: u32) {
        if !self.lists.is_empty() && self.touched.last() != Some(&node) {
            self.touched.push(node);
        }
    }

    /// Before a tick: forget every list unless `basis` is the one they were
    /// listed from, and read again the series of the nodes touched since.
    pub fn refresh(&mut self, basis: Vec<u64>, store: &TelemetryStore) {
        if basis != self.basis {
            self.lists.clear();
            self.basis = basis;
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for l in self.lists.values_mut() {
            for &n in &touched {
                self.reads += l.by_node.get(&n).map_or(0, Vec::len) as u64;
                l.reread(n, store);
            }
        }
    }

    /// `(label value, latest value of each series)` of the groups of `label`
    /// for `metric`, listed by `list` when missing.
    pub fn latest(
        &mut self,
        store: &TelemetryStore,
        label: &str,
        metric: MetricId,
        list: GroupLister<'_>,
    ) -> &[(String, Vec<Option<f64>>)] {
        let key = (label.to_string(), metric);
        if !self.lists.contains_key(&key) {
            self.built += 1;
            let l = Listed::new(list(label, metric), store);
            self.reads += l.keys.iter().map(|(_, k)| k.len() as u64).sum::<u64>();
            self.lists.insert(key.clone(), l);
        }
        self.lists.get(&key).map_or(&[], |l| &l.latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::metrics::ids;

    #[test]
    fn values_are_read_again_for_touched_nodes_and_lists_until_the_fleet_changes() {
        let k = |node: u32| SeriesKey { node, gpu: Some(0), metric: ids::POWER_PCT };
        let mut store = TelemetryStore::new(vec![]);
        let mut cache = GroupCache::default();
        let members = std::cell::RefCell::new(vec![0u32, 1]);
        let list = |label: &str, _m: MetricId| -> Vec<(String, Vec<SeriesKey>)> {
            assert_eq!(label, "pool");
            vec![("a".into(), members.borrow().iter().map(|n| k(*n)).collect())]
        };
        let tick = |cache: &mut GroupCache, store: &TelemetryStore, basis: Vec<u64>| -> Vec<Option<f64>> {
            cache.refresh(basis, store);
            cache.latest(store, "pool", ids::POWER_PCT, &list)[0].1.clone()
        };
        store.push(k(0), 1_000, 50.0);
        // Listed once; a node without a reading yet has none.
        assert_eq!(tick(&mut cache, &store, vec![7, 1, 3]), vec![Some(50.0), None]);
        // A reading that came in with its touch is seen, tick after tick,
        // with the list kept.
        for (t, v) in [(2_000, 60.0), (3_000, 70.0)] {
            store.push(k(1), t, v);
            cache.touch(1);
            assert_eq!(tick(&mut cache, &store, vec![7, 1, 3]), vec![Some(50.0), Some(v)]);
        }
        assert_eq!((cache.built, cache.reads), (1, 4));
        // Untouched nodes are not read again.
        tick(&mut cache, &store, vec![7, 1, 3]);
        assert_eq!(cache.reads, 4);
        // The fleet changed (node 1 drained): listed again, without it.
        members.borrow_mut().pop();
        assert_eq!(tick(&mut cache, &store, vec![7, 1, 2]), vec![Some(50.0)]);
        assert_eq!(cache.built, 2);
        // Another label or metric is a list of its own.
        cache.latest(&store, "pool", ids::TEMPERATURE, &|_, _| Vec::new());
        assert_eq!(cache.built, 3);
    }
}
