//! A shard's memory follows its batches: series, window headers and running
//! sums lie in the order a large batch (a scrape, a backtest's step) brings
//! them, so that filling them reads memory in order (the rings of points
//! stay where they were allocated).
//!
//! Series are laid out in the order they first arrived. When that is not
//! the order the batches bring them — a replay's engine first heard every
//! metric of a GPU together from its agents, and the recording brings three
//! fields a GPU; derived series come at a batch's end — each push lands
//! lines away from the one before: several cache misses a sample on a
//! fleet's worth of series, one after another. A noted batch whose pushes
//! jump more than a quarter of the time lays the shard out again in its
//! order. Only slots move: keys, ordinals, points and sums are the same, so
//! every statistic, fit and trigger state is too (nothing outside a shard
//! keeps a slot beyond one push: trigger states are by ordinal, fleet
//! groups by key).

use super::{StoreShard, Window};

/// Below this many pushes in a shard a batch is not worth a layout.
const MIN_PUSHES: usize = 1024;

/// After a layout, this many noted batches go by before the next one may
/// (batches of shapes that alternate then cost one layout in this many).
const QUIET_BATCHES: u32 = 16;

/// The pushes of the batch being noted, in order.
#[derive(Debug, Default)]
pub(super) struct Order {
    noting: bool,
    slots: Vec<u32>,
    /// Pushes that did not land on the slot after the one before.
    jumps: usize,
    /// Noted batches still to go by before a layout may happen.
    quiet: u32,
    /// The last noted batch's slots, in order: where this one's pushes
    /// probably land.
    hints: Vec<u32>,
    /// Pushes of the batch that found their slot by its hint.
    hits: usize,
}

impl Order {
    /// The slot the last noted batch pushed at this place, when it holds
    /// `key` (keys are unique in a shard, so then it is `key`'s slot).
    #[inline]
    pub(super) fn hint(&self, series: &[super::Series], key: super::SeriesKey) -> Option<u32> {
        if !self.noting {
            return None;
        }
        let h = *self.hints.get(self.slots.len())?;
        series.get(h as usize).is_some_and(|s| s.key == key).then_some(h)
    }

    /// A push found its slot by the hint.
    #[inline]
    pub(super) fn hit(&mut self) {
        self.hits += 1;
    }

    #[inline]
    pub(super) fn saw(&mut self, slot: u32) {
        if self.noting {
            if self.slots.last().is_some_and(|last| last.wrapping_add(1) != slot) {
                self.jumps += 1;
            }
            self.slots.push(slot);
        }
    }
}

impl StoreShard {
    /// Note the order of the pushes until [`StoreShard::settle_order`] (a
    /// large batch).
    pub fn note_order(&mut self) {
        let o = &mut self.order;
        o.noting = true;
        std::mem::swap(&mut o.hints, &mut o.slots);
        o.slots.clear();
        o.jumps = 0;
        o.hits = 0;
    }

    /// The noted batch is over: when more than a quarter of its pushes
    /// jumped, lay the shard out in its order (the next batch like it reads
    /// its series in order). Whether it did.
    pub fn settle_order(&mut self) -> bool {
        let o = &mut self.order;
        if !o.noting {
            return false;
        }
        o.noting = false;
        if o.quiet > 0 {
            o.quiet -= 1;
            return false;
        }
        if o.slots.len() < MIN_PUSHES || o.jumps * 4 <= o.slots.len() {
            return false;
        }
        o.quiet = QUIET_BATCHES;
        let first = std::mem::take(&mut o.slots);
        let moved = self.lay_out(&first);
        // The hints for the next batch: where its series lie now.
        self.order.slots = first.iter().map(|s| moved.get(*s as usize).copied().unwrap_or(u32::MAX)).collect();
        true
    }

    /// Put the series in `first` first, in that order (each once), then the
    /// rest in their order; window headers and running sums follow their
    /// series. The rings stay where they are: reallocating them in the new
    /// order measured no faster, and would hold every ring twice for the
    /// moment. Returns each old slot's new one.
    fn lay_out(&mut self, first: &[u32]) -> Vec<u32> {
        let n = self.series.len();
        let mut placed = vec![false; n];
        let mut order: Vec<u32> = Vec::with_capacity(n);
        for &s in first {
            if let Some(p) = placed.get_mut(s as usize)
                && !*p
            {
                *p = true;
                order.push(s);
            }
        }
        order.extend((0..n as u32).filter(|s| !placed[*s as usize]));
        let mut old: Vec<Option<super::Series>> = std::mem::take(&mut self.series).into_iter().map(Some).collect();
        let mut old_windows: Vec<Option<Window>> = std::mem::take(&mut self.windows).into_iter().map(Some).collect();
        let old_fits = std::mem::take(&mut self.fits);
        let mut series = Vec::with_capacity(n);
        let mut windows = Vec::with_capacity(old_windows.len());
        let mut fits = Vec::with_capacity(old_fits.len());
        let mut moved = vec![u32::MAX; n];
        for slot in order {
            // `order` names every slot once.
            let Some(mut s) = old.get_mut(slot as usize).and_then(Option::take) else { continue };
            if let Some(w) = old_windows.get_mut(s.window as usize).and_then(Option::take) {
                windows.push(w);
                s.window = windows.len() as u32 - 1;
            }
            let at = fits.len() as u32;
            fits.extend(
                old_fits.get(s.fits as usize..s.fits as usize + s.nfits as usize).unwrap_or_default().iter().cloned(),
            );
            s.fits = at;
            let new = series.len() as u32;
            moved[slot as usize] = new;
            if let Some(o) = self.by_metric.get_mut(s.key.metric as usize).and_then(|v| v.get_mut(s.ordinal as usize)) {
                *o = new;
            }
            let (row, cell) = (self.row(s.key.node), Self::cell(s.key));
            if let Some(c) = self.table.get_mut(row).and_then(|r| r.get_mut(cell)) {
                *c = new + 1;
            }
            series.push(s);
        }
        self.series = series;
        self.windows = windows;
        self.fits = fits;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SeriesKey, TelemetryStore};
    use crate::base::metrics::{METRICS, ids};

    /// Everything a reader can see of a store, by key.
    fn seen(s: &TelemetryStore, keys: &[SeriesKey], now: i64) -> Vec<String> {
        keys.iter()
            .map(|k| {
                let sh = &s.shards()[s.shard_of(k.node)];
                let slot = sh.slot_of(*k);
                let ordinal = slot.and_then(|x| sh.series.get(x as usize)).map(|x| x.ordinal);
                let fits: Vec<_> = [60_000, 300_000, 1_800_000]
                    .iter()
                    .map(|len| slot.and_then(|x| sh.fit_slot(x, now, *len)))
                    .collect();
                format!(
                    "{k:?} {ordinal:?} {:?} {:?} {:?} {fits:?} {:?}",
                    s.latest(*k),
                    s.window(*k, 0),
                    s.stats(*k, now - 300_000),
                    ordinal.and_then(|o| sh.key_by_ordinal(k.metric, o)),
                )
            })
            .collect()
    }

    #[test]
    fn a_batch_out_of_order_lays_the_shard_out_in_its_order_and_nothing_read_changes() {
        let mut retention = vec![0; METRICS.len()];
        retention[ids::TEMPERATURE as usize] = 1_800_000;
        retention[ids::POWER as usize] = 300_000;
        let mut fits = vec![Vec::new(); METRICS.len()];
        fits[ids::TEMPERATURE as usize] = vec![300_000, 1_800_000];
        let build = || TelemetryStore::with_shards(retention.clone(), 2).with_fits(&fits);
        // First heard GPU by GPU with every metric (an agent's reading);
        // then batches of two fields a GPU, one field after the other, the
        // first from the last GPU back (so that the sums move too).
        let metrics = [ids::TEMPERATURE, ids::POWER, ids::UTIL, ids::FAN, ids::MEM_USED];
        let mut keys = Vec::new();
        for node in 0..160u32 {
            for gpu in 0..8u16 {
                for m in metrics {
                    keys.push(SeriesKey { node, gpu: Some(gpu), metric: m });
                }
            }
        }
        let batch: Vec<SeriesKey> = keys
            .iter()
            .filter(|k| k.metric == ids::TEMPERATURE)
            .rev()
            .chain(keys.iter().filter(|k| k.metric == ids::POWER))
            .copied()
            .collect();
        let t0 = 1_790_000_000_000i64;
        // One step of the batch: a climb, noise, a NaN once, a missing
        // sample, one series jumping ahead (a gap that restarts its window,
        // then late samples dropped). Whether some shard was laid out.
        let step = |s: &mut TelemetryStore, step: i64, noted: bool| -> bool {
            if noted {
                s.shards_mut().iter_mut().for_each(|sh| sh.note_order());
            }
            let ts = t0 + step * 15_000;
            for (i, k) in batch.iter().enumerate() {
                let v = if step == 50 && i == 3 { f64::NAN } else { 60.0 + step as f64 * 0.01 + (i % 7) as f64 };
                if step == 80 && i == 5 {
                    continue;
                }
                s.push(*k, if i == 9 && step >= 100 { ts + 70_000 } else { ts }, v);
            }
            noted && s.shards_mut().iter_mut().map(|sh| sh.settle_order()).fold(false, |a, b| a | b)
        };
        let (mut laid, mut plain) = (build(), build());
        for s in [&mut laid, &mut plain] {
            for k in &keys {
                s.push(*k, t0, 1.0);
            }
        }
        let probe: Vec<SeriesKey> = keys.iter().step_by(7).copied().collect();
        let mut layouts = Vec::new();
        for n in 1..200i64 {
            if step(&mut laid, n, true) {
                layouts.push(n);
            }
            step(&mut plain, n, false);
            if n == 2 {
                for sh in laid.shards() {
                    assert_eq!(sh.order.hits, 1280, "the batch after the layout finds its series where they moved");
                }
            }
            if n % 40 == 0 || n == 1 || n == 101 {
                let now = t0 + n * 15_000;
                assert_eq!(seen(&laid, &probe, now), seen(&plain, &probe, now), "step {n}");
            }
        }
        assert_eq!(layouts, vec![1], "laid out once, after the first batch");
        // Batch 199 found its series by the hints, the slots they moved to
        // at 1.
        for sh in laid.shards() {
            assert_eq!(sh.order.hits, 1280, "pushes of 1280 that found their slot by the hint");
        }
        // The batch now pushes each shard's series in slot order.
        laid.shards_mut().iter_mut().for_each(|sh| sh.note_order());
        step(&mut laid, 300, false);
        for sh in laid.shards() {
            assert_eq!((sh.order.jumps, sh.order.slots.len()), (0, 1280), "series lie in the batch's order");
            assert_eq!(sh.order.hits, 1280, "every push found its slot by the hint");
        }
        // A store that first heard the batch's order is not laid out, nor
        // is a batch too small to be worth it.
        let mut in_order = build();
        assert!(!step(&mut in_order, 1, true) && !step(&mut in_order, 2, true));
        let mut small = build();
        for k in &keys {
            small.push(*k, t0, 1.0);
        }
        small.shards_mut().iter_mut().for_each(|sh| sh.note_order());
        for k in batch.iter().take(1000) {
            small.push(*k, t0 + 15_000, 1.0);
        }
        assert!(small.shards_mut().iter_mut().all(|sh| !sh.settle_order()));
    }
}
