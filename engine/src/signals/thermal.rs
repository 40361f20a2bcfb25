//! Temperature against load: H3 tells a cooling fault from a load change.
//!
//! A GPU's temperature settles at `T = T_inlet + R·P`: it rises with every
//! load step (an RL job's phases, a new job) at an unchanged thermal
//! resistance `R`, and rises at constant load when `R` grows (dust, a
//! failing fan, dried paste). Fitting `T = a + b·P + c·t` over a window by
//! least squares gives both: `b` (°C per kW, the load's share) and `c` (°C
//! per minute the load does not explain). Neither needs the inlet
//! temperature, which no GPU library reports. The power enters through a
//! first-order lag (the heatsink takes minutes to follow a step), its time
//! constant chosen by the fit.

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
    /// The heatsink time constant that explained the window best.
    pub tau_secs: f64,
}

/// The heatsink's time constants tried (seconds): a GPU's temperature
/// follows a power step over minutes, not at once, and a fit against the
/// instantaneous power reads that lag as a drift.
const TAUS_SECS: [f64; 15] =
    [0.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0, 105.0, 120.0, 150.0, 180.0, 210.0, 240.0, 300.0, 360.0];

/// Fit temperature points against power points taken at the same times.
/// `None` with fewer than 20 joint points. The power goes in through a
/// first-order lag (`P_f`, the heat the heatsink has caught up with), with
/// the time constant that explains the window best: `T = a + b·P_f + c·t`.
pub fn fit(temps: &[(i64, f64)], power: &[(i64, f64)]) -> Option<Fit> {
    let by_ts: std::collections::HashMap<i64, f64> = power.iter().copied().collect();
    let joint: Vec<(i64, f64, f64)> =
        temps.iter().filter_map(|(t, temp)| by_ts.get(t).map(|p| (*t, *p, *temp))).collect();
    if joint.len() < 20 {
        return None;
    }
    let range = joint.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max)
        - joint.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    let mut best: Option<(f64, Fit)> = None;
    for tau in TAUS_SECS {
        let mut pf = joint[0].1;
        let mut last_t = joint[0].0;
        let pts: Vec<(f64, f64, f64)> = joint
            .iter()
            .map(|(t, p, y)| {
                if tau > 0.0 {
                    let a = 1.0 - (-((t - last_t) as f64 / 1000.0) / tau).exp();
                    pf += a * (p - pf);
                } else {
                    pf = *p;
                }
                last_t = *t;
                (*t as f64 / 60_000.0, pf / 1000.0, *y)
            })
            .collect();
        let (f, sse) = least_squares(&pts, range);
        if best.as_ref().is_none_or(|(b, _)| sse < *b - 1e-9) {
            best = Some((sse, Fit { tau_secs: tau, ..f }));
        }
    }
    best.map(|(_, f)| f)
}

/// `y = a + b·p + c·t` by least squares over `(t_min, p_kw, y)`, with its
/// sum of squared residuals.
fn least_squares(pts: &[(f64, f64, f64)], power_range_watts: f64) -> (Fit, f64) {
    let n = pts.len();
    let mean = |f: &dyn Fn(&(f64, f64, f64)) -> f64| pts.iter().map(f).sum::<f64>() / n as f64;
    let (mt, mp, my) = (mean(&|x| x.0), mean(&|x| x.1), mean(&|x| x.2));
    let (mut stt, mut spp, mut stp, mut sty, mut spy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (t, p, y) in pts {
        let (dt, dp, dy) = (t - mt, p - mp, y - my);
        stt += dt * dt;
        spp += dp * dp;
        stp += dt * dp;
        sty += dt * dy;
        spy += dp * dy;
    }
    let det = stt * spp - stp * stp;
    // The load barely moved (or moved in step with time): the load's share
    // cannot be told apart; all of the trend is the time term.
    let (per_min, per_kw) = if spp < 1e-9 || det.abs() < 1e-9 * stt.max(1e-9) * spp.max(1e-9) {
        (if stt > 0.0 { sty / stt } else { 0.0 }, 0.0)
    } else {
        ((sty * spp - spy * stp) / det, (spy * stt - sty * stp) / det)
    };
    let sse = pts.iter().map(|(t, p, y)| (y - my - per_min * (t - mt) - per_kw * (p - mp)).powi(2)).sum();
    (Fit { per_min, per_kw, samples: n, power_range_watts, tau_secs: 0.0 }, sse)
}

/// When the airflow last changed abruptly in a fan-speed series: the last
/// reading `min_step_pct` or more from one in the minute before it (a
/// command, a release, a failed module; so up to a minute after the change
/// itself). A firmware curve that follows the temperature moves a
/// point or two at a time and is not a step. Temperatures before such a
/// step were made by other cooling, so a fit judges only what came after.
pub fn last_airflow_step(fan: &[(i64, f64)], min_step_pct: f64) -> Option<i64> {
    // Fans spin up and down over seconds: compare each reading with the
    // one a minute before it, not only with its neighbour.
    let mut j = fan.len();
    for i in (0..fan.len()).rev() {
        let (t, v) = fan[i];
        j = j.min(i);
        while j > 0 && fan[j - 1].0 >= t - 60_000 {
            j -= 1;
        }
        let lo = if j > 0 { j - 1 } else { j };
        if fan[lo..=i].iter().any(|(_, w)| (v - w).abs() >= min_step_pct) {
            return Some(t);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `T = 30 + 70·P(kW) + drift·t(min)`, whole degrees, one point a second.
    type Series = Vec<(i64, f64)>;

    fn series(power: impl Fn(i64) -> f64, drift_per_min: f64, secs: i64) -> (Series, Series) {
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

    /// The heatsink follows a step over minutes (τ = 100 s here, as on the
    /// sim's H100 and on hardware): the catching-up is the load, not a
    /// drift — and a real drift on top is still seen.
    #[test]
    fn the_heatsink_lag_after_a_load_step_is_not_a_drift() {
        for drift in [0.0, 0.08] {
            let (mut t, mut p) = (Vec::new(), Vec::new());
            let mut temp = 58.0f64;
            for s in (0..1440).step_by(5) {
                let w = if s < 600 { 378.0 } else { 628.0 };
                let settled = 30.0 + 72.0 * w / 1000.0 + drift * s as f64 / 60.0;
                temp += (settled - temp) * (1.0 - (-5.0f64 / 100.0).exp());
                t.push((s * 1000, temp.round()));
                p.push((s * 1000, w));
            }
            let f = fit(&t, &p).unwrap();
            eprintln!("drift {drift}: {f:?}");
            // What H3 decides with (min_drift 0.03 °C/min): no drift is
            // not one, a real one is.
            assert_eq!(f.per_min > 0.03, drift > 0.0, "drift {drift}: {f:?}");
            assert_eq!(f.power_range_watts, 250.0);
            assert!(f.tau_secs >= 60.0, "{f:?}");
        }
    }

    #[test]
    fn only_abrupt_fan_changes_are_airflow_steps() {
        // A firmware curve creeping up a point a minute (a slow climb): no
        // step.
        let creep: Vec<(i64, f64)> = (0..100).map(|s| (s * 10_000, 45.0 + (s / 6) as f64)).collect();
        assert_eq!(last_airflow_step(&creep, 5.0), None);
        // Chassis fans released from 100 % to 70 % at 40 s, then set again
        // at 70 s: the last one counts.
        let mut v: Vec<(i64, f64)> = (0..300).map(|s| (s * 1000, if s < 40 { 100.0 } else { 70.0 })).collect();
        assert_eq!(last_airflow_step(&v, 5.0), Some(100_000));
        for x in v.iter_mut().skip(170) {
            x.1 = 100.0;
        }
        assert_eq!(last_airflow_step(&v, 5.0), Some(230_000));
        // A spin-down over 20 s, never 5 points between two readings: a step.
        let slow: Vec<(i64, f64)> = (0..100).map(|s| (s * 1000, 100.0 - 1.5 * (s.clamp(40, 60) - 40) as f64)).collect();
        assert!(last_airflow_step(&slow, 5.0).is_some_and(|t| (60_000..=120_000).contains(&t)));
    }
}
