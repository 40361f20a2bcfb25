//! A series trigger's step on one new point (threshold, averaged
//! threshold, rate, predict, change) within one shard of the store: the
//! code a shard's thread runs for each of its samples.

use super::*;

impl Rules<'_> {
    /// Whether any trigger watches this metric.
    pub fn watches(&self, metric: MetricId) -> bool {
        self.by_metric.get(metric as usize).is_some_and(|v| !v.is_empty())
    }

    /// [`TriggerSet::on_sample`] within one shard: its states, its store.
    pub fn on_sample(
        &self,
        states: &mut ShardStates,
        store: &StoreShard,
        r: SeriesRef,
        ts_ms: i64,
        v: f64,
        out: &mut Vec<Fire>,
    ) {
        let Some(key) = store.key(r.slot) else { return };
        let Some(idx) = self.by_metric.get(key.metric as usize) else { return };
        let ord = r.ordinal as usize;
        if states.states.len() < self.entries.len() {
            states.states.resize_with(self.entries.len(), Vec::new);
            states.evaluations.resize(self.entries.len(), 0);
            states.fires.resize(self.entries.len(), 0);
        }
        for &i in idx {
            let Some(e) = self.entries[i].as_ref() else { continue };
            let series = &mut states.states[i];
            if series.len() <= ord {
                series.resize(ord + 1, State::default());
            }
            states.evaluations[i] += 1;
            let st = &mut series[ord];
            let name = metrics::metric(key.metric).name;
            let fired = match &e.compiled {
                Compiled::Threshold { level, for_ms, clear, average: true, .. } => {
                    // The window's average, once the window is covered.
                    let stats = store.fit_slot(r.slot, ts_ms, *for_ms);
                    let covered = stats.is_some_and(|s| ts_ms - s.first.0 >= for_ms * 9 / 10 && s.count >= 3);
                    let avg = stats.map_or(v, |s| s.avg);
                    let breach = covered && level.breached(avg);
                    let fired = if st.fired {
                        if clear.breached(avg) {
                            st.fired = false;
                        }
                        false
                    } else if breach {
                        st.fired = true;
                        true
                    } else {
                        false
                    };
                    fired.then(|| {
                        let (op, l) = match level {
                            Level::Above(l) => ("above", *l),
                            Level::Below(l) => ("below", *l),
                        };
                        format!("{name} averaging {} {op} {} over {} s", fmt_v(avg), fmt_v(l), for_ms / 1000)
                    })
                }
                Compiled::Threshold { level, for_ms, clear, .. } => {
                    step_threshold(st, *level, *clear, *for_ms, v, ts_ms).then(|| {
                        let (op, l) = match level {
                            Level::Above(l) => ("above", *l),
                            Level::Below(l) => ("below", *l),
                        };
                        format!("{name} {} {op} {} for {} s", fmt_v(v), fmt_v(l), for_ms / 1000)
                    })
                }
                Compiled::Rate { per_min, window_ms, min_samples, .. } => {
                    let stats = store.fit_slot(r.slot, ts_ms, *window_ms);
                    let covered =
                        stats.is_some_and(|s| s.count >= *min_samples && ts_ms - s.first.0 >= window_ms * 8 / 10);
                    let rate = stats.map_or(0.0, |s| s.slope_per_sec * 60.0);
                    let breach = covered && per_min.breached(rate);
                    if st.fired {
                        if !breach {
                            st.fired = false;
                        }
                        None
                    } else if breach {
                        st.fired = true;
                        Some(format!("{name} changing {} per min over {} s", fmt_v(rate), window_ms / 1000))
                    } else {
                        None
                    }
                }
                Compiled::Predict { crosses, horizon_ms, window_ms, min_samples, model, .. } => {
                    let horizon_s = *horizon_ms as f64 / 1000.0;
                    let stats = store.fit_slot(r.slot, ts_ms, *window_ms);
                    let predicted = stats.and_then(|s| {
                        if s.count < *min_samples || ts_ms - s.first.0 < window_ms / 2 {
                            return None;
                        }
                        let now_v = s.last.1;
                        let secs = match model {
                            PredictModel::Linear => {
                                let future = now_v + s.slope_per_sec * horizon_s;
                                let rising = now_v < *crosses && future >= *crosses && s.slope_per_sec > 0.0;
                                let falling = now_v > *crosses && future <= *crosses && s.slope_per_sec < 0.0;
                                (rising || falling).then(|| (*crosses - now_v) / s.slope_per_sec)?
                            }
                            PredictModel::FirstOrder { time_constant_secs } => {
                                // A first-order system is (T∞ − T)/τ from its
                                // level: T∞ = T + τ·dT/dt.
                                let tau = *time_constant_secs as f64;
                                let asymptote = now_v + tau * s.slope_per_sec;
                                let rising = now_v < *crosses && asymptote > *crosses;
                                let falling = now_v > *crosses && asymptote < *crosses;
                                if !(rising || falling) {
                                    return None;
                                }
                                // Time to reach the level on the fitted curve.
                                let t = tau * ((asymptote - now_v) / (asymptote - *crosses)).ln();
                                (t.is_finite() && t >= 0.0 && t <= horizon_s).then_some(t)?
                            }
                        };
                        Some((s, secs))
                    });
                    match (st.fired, predicted) {
                        (true, None) => {
                            st.fired = false;
                            None
                        }
                        (false, Some((s, secs))) => {
                            st.fired = true;
                            Some(format!(
                                "{name} {} rising {} per min: crosses {} in about {:.0} s",
                                fmt_v(s.last.1),
                                fmt_v(s.slope_per_sec * 60.0),
                                fmt_v(*crosses),
                                secs.max(0.0)
                            ))
                        }
                        _ => None,
                    }
                }
                Compiled::Change { to_any_of, increase, .. } => {
                    let prev = st.last.replace(v);
                    match prev {
                        Some(p) if p != v => {
                            let hit = (!to_any_of.is_empty() && to_any_of.contains(&v)) || (*increase && v > p);
                            hit.then(|| format!("{name} changed {} → {}", fmt_v(p), fmt_v(v)))
                        }
                        _ => None,
                    }
                }
                Compiled::Fleet { .. } => None,
            };
            if let Some(detail) = fired {
                states.fires[i] += 1;
                out.push(Fire { trigger: i, node: Some(key.node), gpu: key.gpu, group: None, value: v, ts_ms, detail });
            }
        }
    }
}
