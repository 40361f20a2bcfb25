//! Temperature against load: H3 tells a cooling fault from a load change.
//!
//! A GPU's temperature settles at `T = T_inlet + R·P`: it rises with every
//! load step (an RL job's phases, a new job) at an unchanged thermal
//! resistance `R`, and rises at constant load when `R` grows (dust, a
//! failing fan, dried paste). Fitting `T = a + b·P + c·t` over a window by
//! least squares gives both: `b` (°C per kW, the load's share) and `c` (°C
//! per minute the load does not explain). Neither needs the inlet
//! temperature, which no GPU library reports.

/// A fit over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Temperature change per minute at constant power.
    pub per_min: f64,
    /// Temperature change per kW at constant time (≈ the thermal
    /// resistance while the cooling holds).
    pub per_kw: f64,
    pub samples: usize,
    /// Max − min power in the window.
    pub power_range_watts: f64,
}

/// Fit temperature points against power points taken at the same times.
/// `None` with fewer than 20 joint points.
pub fn fit(temps: &[(i64, f64)], power: &[(i64, f64)]) -> Option<Fit> {
    let by_ts: std::collections::HashMap<i64, f64> = power.iter().copied().collect();
    let pts: Vec<(f64, f64, f64)> = temps
        .iter()
        .filter_map(|(t, temp)| by_ts.get(t).map(|p| (*t as f64 / 60_000.0, p / 1000.0, *temp)))
        .collect();
    let n = pts.len();
    if n < 20 {
        return None;
    }
    let mean = |f: &dyn Fn(&(f64, f64, f64)) -> f64| pts.iter().map(f).sum::<f64>() / n as f64;
    let (mt, mp, my) = (mean(&|x| x.0), mean(&|x| x.1), mean(&|x| x.2));
    let (mut stt, mut spp, mut stp, mut sty, mut spy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (t, p, y) in &pts {
        let (dt, dp, dy) = (t - mt, p - mp, y - my);
        stt += dt * dt;
        spp += dp * dp;
        stp += dt * dp;
        sty += dt * dy;
        spy += dp * dy;
    }
    let range = pts.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max)
        - pts.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    let det = stt * spp - stp * stp;
    // The load barely moved (or moved in step with time): the load's share
    // cannot be told apart; all of the trend is the time term.
    if spp < 1e-9 || det.abs() < 1e-9 * stt.max(1e-9) * spp.max(1e-9) {
        let per_min = if stt > 0.0 { sty / stt } else { 0.0 };
        return Some(Fit { per_min, per_kw: 0.0, samples: n, power_range_watts: range * 1000.0 });
    }
    let per_min = (sty * spp - spy * stp) / det;
    let per_kw = (spy * stt - sty * stp) / det;
    Some(Fit { per_min, per_kw, samples: n, power_range_watts: range * 1000.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `T = 30 + 70·P(kW) + drift·t(min)`, whole degrees, one point a second.
    fn series(power: impl Fn(i64) -> f64, drift_per_min: f64, secs: i64) -> (Vec<(i64, f64)>, Vec<(i64, f64)>) {
        let mut t = Vec::new();
        let mut p = Vec::new();
        for s in 0..secs {
            let w = power(s);
            let temp = (30.0 + 70.0 * w / 1000.0 + drift_per_min * s as f64 / 60.0).round();
            t.push((s * 1000, temp));
            p.push((s * 1000, w));
        }
        (t, p)
    }

    #[test]
    fn a_load_step_is_the_load_and_a_clogging_heatsink_is_not() {
        // A step from 380 W to 630 W half-way, no drift: the rise is load.
        let (t, p) = series(|s| if s < 900 { 380.0 } else { 630.0 }, 0.0, 1800);
        let f = fit(&t, &p).unwrap();
        assert!(f.per_min.abs() < 0.01, "{f:?}");
        assert!((f.per_kw - 70.0).abs() < 3.0, "{f:?}");
        // RL phases every 5 minutes, no drift.
        let (t, p) = series(|s| if (s / 150) % 2 == 0 { 430.0 } else { 600.0 }, 0.0, 1800);
        assert!(fit(&t, &p).unwrap().per_min.abs() < 0.01);
        // Constant load, cooling degrading 0.08 °C/min (the seeds' climb).
        let (t, p) = series(|_| 600.0, 0.08, 1800);
        let f = fit(&t, &p).unwrap();
        assert!((f.per_min - 0.08).abs() < 0.01, "{f:?}");
        // Phases and a drift together: the drift is still seen.
        let (t, p) = series(|s| if (s / 150) % 2 == 0 { 430.0 } else { 600.0 }, 0.08, 1800);
        assert!((fit(&t, &p).unwrap().per_min - 0.08).abs() < 0.01);
        assert!(fit(&t[..10], &p[..10]).is_none(), "too few points");
    }
}
