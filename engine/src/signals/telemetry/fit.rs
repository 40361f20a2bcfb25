//! Running sums of a sliding window, kept as a series' points arrive, so a
//! trigger's average and least-squares slope over its window cost the same
//! at 121 points as at 2 (the per-sample path of rate, predict and averaged
//! thresholds; everything else still reads the window through
//! [`super::stats_of`]).
//!
//! The sums are exact: times as integer ms from a base, values in fixed
//! point (`v × 2⁴⁰`, exact for any `f32` telemetry reading between 2⁻¹⁷ and
//! 2²⁴ in magnitude, or with few enough significant bits). Adding and
//! removing a point are exact inverses, so nothing drifts over a month. The
//! four sums [`super::stats_of`] forms are then rebuilt from them, centred on
//! the window's first point as it centres, and fed to the same expression:
//! wherever the scan's own sums were exact (every window of readings at
//! whole-second spacing and telemetry's precision) the result is the scan's,
//! bit for bit; elsewhere it is the exact sum rounded once. A point that is
//! not exact in fixed point (NaN, infinite, huge or tiny) is counted, and
//! while a window holds one the caller scans instead.

use std::collections::VecDeque;

use super::{Point, gap_of, value_of};

/// `2⁴⁰`: the fixed-point scale of a value.
const SCALE: f64 = (1u64 << 40) as f64;
/// Values at or above `2²⁴` in magnitude are not kept in fixed point.
const LIMIT: f64 = (1u128 << 64) as f64;
/// `2⁶³`: below it a fixed-point value converts through `i64`.
const I64_LIMIT: f64 = (1u64 << 63) as f64;
/// The base is moved to the window's front once a time is this far past it.
const REBASE_MS: i64 = 1 << 32;
/// Longest window kept as running sums (24.8 days); longer ones are scanned.
pub(crate) const MAX_FIT_MS: i64 = 1 << 31;

/// A value in fixed point, when that is exact.
fn fixed(v: f32) -> Option<i128> {
    let x = v as f64 * SCALE;
    // Through `i64` when it fits: one conversion each way tells whether it
    // is whole (`fract` is a library call on this target, and so is the
    // 128-bit conversion).
    if x.abs() < I64_LIMIT {
        let i = x as i64;
        return (i as f64 == x).then_some(i as i128);
    }
    if x.fract() != 0.0 || x.abs() >= LIMIT {
        return None;
    }
    Some(x as i128)
}

/// The running sums of the points of one window length: those at or after
/// `newest − len_ms`. `front` is the index, in the series' window, of the
/// first of them; the window's own retention is at least `len_ms`, so they
/// are all still there.
#[derive(Debug, Clone)]
pub(super) struct Fit {
    pub(super) len_ms: i64,
    pub(super) front: u32,
    pub(super) front_ms: i64,
    pub(super) n: u32,
    /// Points whose value is not exact in fixed point.
    inexact: u32,
    /// The sums lost track of the window (never while the window keeps at
    /// least `len_ms`): scanned until the window restarts.
    broken: bool,
    base_ms: i64,
    /// Σ(t − base), Σ(t − base)² over every point (the first fits 64
    /// bits: under 2³⁰ points of under 2³³ ms each).
    s1: i64,
    s2: i128,
    /// ΣV, Σ(t − base)·V over the exact points (V = v × 2⁴⁰).
    sv: i128,
    sxv: i128,
}

/// What a window's running sums give: what [`super::WindowStats`] gives,
/// but its minimum and maximum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowFit {
    pub count: usize,
    pub avg: f64,
    pub first: (i64, f64),
    pub last: (i64, f64),
    /// Least-squares slope, per second.
    pub slope_per_sec: f64,
}

impl From<super::WindowStats> for WindowFit {
    fn from(s: super::WindowStats) -> WindowFit {
        WindowFit { count: s.count, avg: s.avg, first: s.first, last: s.last, slope_per_sec: s.slope_per_sec }
    }
}

/// `a` rounded to the nearest `f64` — through `i64` when it fits (one
/// instruction; the same rounding as the 128-bit conversion, which is a
/// library call).
fn float(a: i128) -> f64 {
    match i64::try_from(a) {
        Ok(x) => x as f64,
        Err(_) => a as f64,
    }
}

/// `a ÷ K` as the scan forms it: exact when `K` divides `a` (in 64 bits
/// when `a` fits; past that without 128-bit division, a library call: the
/// remainder from `a`'s two halves, the quotient by the inverse of `K`'s odd
/// part modulo 2¹²⁸).
fn div<const K: i64>(a: i128) -> f64 {
    match i64::try_from(a) {
        Ok(a) if a % K == 0 => (a / K) as f64,
        Ok(a) => a as f64 / K as f64,
        Err(_) if rem::<K>(a) == 0 => float(exact_quotient::<K>(a)),
        Err(_) => a as f64 / K as f64,
    }
}

/// `|a| mod K` (0 exactly when `K` divides `a`), `K` below 2³².
fn rem<const K: i64>(a: i128) -> u64 {
    let k = K as u64;
    let m = a.unsigned_abs();
    let (hi, lo) = ((m >> 64) as u64, m as u64);
    // 2⁶⁴ mod K; both products stay under 2⁶⁴.
    let p = ((u64::MAX % k) + 1) % k;
    ((hi % k) * p % k + lo % k) % k
}

/// `a ÷ K` for `a` a multiple of `K`: shift out `K`'s twos, then multiply
/// by the inverse of its odd part modulo 2¹²⁸ (exact, negatives too).
fn exact_quotient<const K: i64>(a: i128) -> i128 {
    let twos = K.trailing_zeros();
    let odd = (K >> twos) as u128;
    // Newton's step doubles the bits right: an odd number is its own
    // inverse modulo 8, so 3 → 6 → … → 192 bits in six steps.
    let mut inv = odd;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u128.wrapping_sub(odd.wrapping_mul(inv)));
    }
    ((a >> twos) as u128).wrapping_mul(inv) as i128
}

impl Fit {
    pub(super) fn new(len_ms: i64) -> Fit {
        Fit { len_ms, front: 0, front_ms: 0, n: 0, inexact: 0, broken: false, base_ms: 0, s1: 0, s2: 0, sv: 0, sxv: 0 }
    }

    /// Forget every point (the window restarted).
    pub(super) fn clear(&mut self) {
        *self = Fit::new(self.len_ms);
    }

    fn shift(&mut self, t: i64, v: f32, sign: i128) {
        let x = (t - self.base_ms) as i128;
        self.s1 = self.s1.wrapping_add((sign * x) as i64);
        self.s2 = self.s2.wrapping_add(sign * x * x);
        match fixed(v) {
            Some(fv) => {
                self.sv = self.sv.wrapping_add(sign * fv);
                self.sxv = self.sxv.wrapping_add((sign * x).wrapping_mul(fv));
            }
            None if sign > 0 => self.inexact += 1,
            None => self.inexact -= 1,
        }
    }

    /// Take in the window's newest point, at index `index`.
    pub(super) fn add(&mut self, index: u32, t: i64, v: f32) {
        if self.broken {
            return;
        }
        if self.n == 0 {
            *self = Fit { front: index, front_ms: t, base_ms: t, ..Fit::new(self.len_ms) };
        } else if t - self.base_ms >= REBASE_MS {
            // Keep times small: move the base to the front, exactly.
            let d = (self.front_ms - self.base_ms) as i128;
            let n = self.n as i128;
            self.s2 = self.s2.wrapping_sub(2 * d * self.s1 as i128).wrapping_add(n * d * d);
            self.s1 = self.s1.wrapping_sub((n * d) as i64);
            self.sxv = self.sxv.wrapping_sub(d.wrapping_mul(self.sv));
            self.base_ms = self.front_ms;
        }
        self.shift(t, v, 1);
        self.n += 1;
    }

    /// Let go of the points before `newest_ms − len_ms`, read from the
    /// window (its gaps and values, indexed as the window holds them).
    pub(super) fn evict(&mut self, newest_ms: i64, points: &VecDeque<Point>) {
        if self.broken {
            return;
        }
        let horizon = newest_ms - self.len_ms;
        while self.n > 0 && self.front_ms < horizon {
            let i = self.front as usize;
            let Some(p) = points.get(i) else {
                // The window no longer holds the front: scan until it
                // restarts.
                self.broken = true;
                return;
            };
            self.shift(self.front_ms, value_of(p), -1);
            self.n -= 1;
            self.front += 1;
            self.front_ms += points.get(i + 1).map_or(0, |p| gap_of(p) as i64);
        }
        if self.n == 0 {
            self.clear();
        }
    }

    /// The window dropped its first point.
    pub(super) fn popped(&mut self) {
        if self.front > 0 {
            self.front -= 1;
        } else if self.n > 0 {
            // Never the case while the window keeps at least `len_ms`; if it
            // were, these sums would name points gone: scan until the window
            // restarts.
            self.broken = true;
        }
    }

    /// The average, first point, slope — `None` while a point of the window
    /// is not exact (the caller scans).
    pub(super) fn result(&self, points: &VecDeque<Point>, last: (i64, f64)) -> Option<WindowFit> {
        if self.n == 0 || self.inexact > 0 || self.broken {
            return None;
        }
        let first = (self.front_ms, value_of(points.get(self.front as usize)?) as f64);
        let n = self.n as i128;
        // Centre on the first point, as the scan does.
        let d = (self.front_ms - self.base_ms) as i128;
        let c1 = (self.s1 as i128).wrapping_sub(n * d);
        let c2 = self.s2.wrapping_sub(2 * d * self.s1 as i128).wrapping_add(n * d * d);
        let cxv = self.sxv.wrapping_sub(d.wrapping_mul(self.sv));
        let sum = float(self.sv) / SCALE;
        let (sx, sxx, sxy, sy) = (div::<1000>(c1), div::<1_000_000>(c2), div::<1000>(cxv) / SCALE, sum);
        let nf = self.n as f64;
        let denom = nf * sxx - sx * sx;
        let slope = if self.n >= 2 && denom.abs() > 1e-12 { (nf * sxy - sx * sy) / denom } else { 0.0 };
        Some(WindowFit { count: self.n as usize, avg: sum / nf, first, last, slope_per_sec: slope })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SeriesKey, TelemetryStore, WindowFit};
    use crate::base::metrics::{METRICS, ids};

    /// What `fixed` and `div` computed with 128-bit library calls, before.
    fn fixed_by_fract(v: f32) -> Option<i128> {
        let x = v as f64 * super::SCALE;
        (x.fract() == 0.0 && x.abs() < super::LIMIT).then_some(x as i128)
    }
    fn div_by_library(a: i128, k: i64) -> f64 {
        if a % k as i128 == 0 { (a / k as i128) as f64 } else { a as f64 / k as f64 }
    }

    #[test]
    fn fixed_point_and_division_are_the_128_bit_ones_bit_for_bit() {
        let values = [0.0f32, -0.0, 1.0, -1.5, 62.3, 1e-12, 3e-6, 8_388_607.5, 1.6e7, 1.7e7, -2.5e7, 1e30];
        for v in values.into_iter().chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE]) {
            assert_eq!(super::fixed(v), fixed_by_fract(v), "{v}");
        }
        let mut a: i128 = 1;
        let mut cases = vec![0i128, 1, -1, 999, 1000, -1000, i64::MAX as i128 + 1, i128::MAX / 3, i128::MIN / 7];
        for i in 0..400 {
            // Multiples of both divisors and their neighbours, at every size.
            a = a.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407 + i);
            let m = a >> (i % 100);
            cases.extend([m, m - m % 1000, m - m % 1_000_000, (m - m % 1000) + 1, -(m - m % 1_000_000)]);
        }
        for a in cases {
            assert_eq!(super::div::<1000>(a).to_bits(), div_by_library(a, 1000).to_bits(), "{a} / 1000");
            assert_eq!(super::div::<1_000_000>(a).to_bits(), div_by_library(a, 1_000_000).to_bits(), "{a} / 1e6");
        }
    }

    const T0: i64 = 1_790_000_000_000;

    fn key() -> SeriesKey {
        SeriesKey { node: 0, gpu: Some(0), metric: ids::TEMPERATURE }
    }

    /// A store keeping `keep_ms` of temperature, with running sums of
    /// `lens` (and one without, to scan).
    fn stores(keep_ms: i64, lens: &[i64]) -> (TelemetryStore, TelemetryStore) {
        let mut retention = vec![0; METRICS.len()];
        retention[ids::TEMPERATURE as usize] = keep_ms;
        let mut fits = vec![Vec::new(); METRICS.len()];
        fits[ids::TEMPERATURE as usize] = lens.to_vec();
        (TelemetryStore::new(retention.clone()).with_fits(&fits), TelemetryStore::new(retention))
    }

    fn bits(f: &WindowFit) -> (usize, u64, (i64, u64), (i64, u64), u64) {
        (
            f.count,
            f.avg.to_bits(),
            (f.first.0, f.first.1.to_bits()),
            (f.last.0, f.last.1.to_bits()),
            f.slope_per_sec.to_bits(),
        )
    }

    /// Feed `points` to both stores; after each, every length's fit from
    /// the running sums against the scan: bit for bit when `exact`, else
    /// the same points and sums within rounding. Returns how many fits the
    /// sums answered (not the scan).
    fn check(name: &str, keep_ms: i64, lens: &[i64], points: &[(i64, f64)], exact: bool) -> usize {
        let (mut fit, mut scan) = stores(keep_ms, lens);
        let mut from_sums = 0;
        for (i, &(t, v)) in points.iter().enumerate() {
            let (a, b) = (fit.push(key(), t, v), scan.push(key(), t, v));
            assert_eq!(a.is_some(), b.is_some(), "{name}: point {i}");
            let Some(r) = a else { continue };
            let shard = &fit.shards()[0];
            let series = &shard.series[r.slot as usize];
            for &len in lens {
                let w = shard.window_of(series).unwrap();
                let sums = shard
                    .fits_of(series)
                    .iter()
                    .find(|f| f.len_ms == len)
                    .and_then(|f| f.result(&w.points, series.last()));
                from_sums += sums.is_some() as usize;
                let got = fit.shards()[0].fit_slot(r.slot, t, len).unwrap();
                assert!(sums.is_none_or(|s| s == got), "{name}: point {i}: the sums were not what answered");
                let want = WindowFit::from(scan.stats(key(), t - len).unwrap());
                if exact {
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{name}: point {i} at {t}, window {len} ms: {got:?} vs {want:?}"
                    );
                } else {
                    assert_eq!(
                        (got.count, got.first, got.last),
                        (want.count, want.first, want.last),
                        "{name}: point {i}"
                    );
                    let near = |a: f64, b: f64| {
                        (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs())) || a.to_bits() == b.to_bits()
                    };
                    assert!(near(got.avg, want.avg), "{name}: point {i}, avg {} vs {}", got.avg, want.avg);
                    assert!(
                        near(got.slope_per_sec, want.slope_per_sec),
                        "{name}: point {i}, slope {} vs {}",
                        got.slope_per_sec,
                        want.slope_per_sec
                    );
                }
            }
        }
        from_sums
    }

    /// A small deterministic generator (no dependency for a test).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn running_sums_give_the_scans_bits_at_whole_seconds() {
        let mut seed = 7;
        let every = |step_s: i64, n: usize, f: &mut dyn FnMut(usize) -> f64| -> Vec<(i64, f64)> {
            (0..n).map(|i| (T0 + i as i64 * step_s * 1000, f(i))).collect()
        };
        // Name, retention, window lengths, points.
        type Case = (&'static str, i64, Vec<i64>, Vec<(i64, f64)>);
        let cases: Vec<Case> = vec![
            ("steady at 15 s", 1_805_000, vec![1_800_000], every(15, 400, &mut |_| 62.3)),
            (
                "a climb at 15 s with tenths",
                1_805_000,
                vec![1_800_000, 120_000],
                every(15, 500, &mut |i| 62.0 + (i % 50) as f64 * 0.1),
            ),
            (
                "noisy readings at 1 s, three lengths",
                125_000,
                vec![30_000, 60_000, 120_000],
                every(1, 1_000, &mut |_| (40.0 + 50.0 * lcg(&mut seed)) as f32 as f64),
            ),
            ("whole-degree quantised at 1 s", 125_000, vec![120_000], every(1, 600, &mut |i| (60 + i / 37) as f64)),
            (
                "power in watts, any f32, at 15 s",
                905_000,
                vec![900_000],
                every(15, 300, &mut |i| 600.0 + (i as f64 * 0.731).sin() * 90.0),
            ),
            ("negative headroom", 125_000, vec![30_000, 120_000], every(1, 300, &mut |i| 5.0 - i as f64 * 0.05)),
            (
                "duplicate times",
                60_000,
                vec![30_000],
                (0..200).map(|i| (T0 + (i / 2) * 1000, (i % 7) as f64)).collect(),
            ),
            (
                "a telemetry outage restarts the window",
                125_000,
                vec![120_000],
                (0..300)
                    .map(|i| (T0 + i * 1000 + if i >= 150 { 100_000 } else { 0 }, 70.0 + (i % 11) as f64))
                    .collect(),
            ),
            (
                "a gap longer than the window empties the sums but not the retention",
                185_000,
                vec![60_000],
                (0..300).map(|i| (T0 + i * 1000 + if i >= 150 { 65_000 } else { 0 }, 70.0 + (i % 11) as f64)).collect(),
            ),
            (
                "NaN and huge values: the window is scanned while it holds one",
                60_000,
                vec![30_000],
                every(1, 200, &mut |i| match i {
                    50 => f64::NAN,
                    90 => 1e30,
                    120 => 1e-30,
                    140 => f64::INFINITY,
                    _ => 50.0 + i as f64,
                }),
            ),
        ];
        for (name, keep, lens, points) in cases {
            let fits = points.len() * lens.len();
            let from_sums = check(name, keep, &lens, &points, true);
            if name.starts_with("NaN") {
                // Scanned from each odd value (at 50, 90, 120, 140 s) until
                // it leaves the 30 s window: points 50–80 and 90–170.
                assert_eq!(from_sums, fits - 31 - 81, "{name}: {from_sums} of {fits} from the sums");
            } else {
                assert_eq!(from_sums, fits, "{name}: every fit from the running sums");
            }
        }
    }

    #[test]
    fn running_sums_stay_within_rounding_at_any_spacing() {
        let mut seed = 11;
        // Jittered scrapes: times not whole seconds, values any f32.
        let mut t = T0;
        let points: Vec<(i64, f64)> = (0..3_000)
            .map(|_| {
                t += 900 + (lcg(&mut seed) * 300.0) as i64;
                (t, (20.0 + 80.0 * lcg(&mut seed)) as f32 as f64)
            })
            .collect();
        assert_eq!(check("jittered 1 s scrapes", 605_000, &[60_000, 600_000], &points, false), 6_000);
    }

    #[test]
    fn running_sums_outlive_their_base() {
        // 60 days at 60 s: the base moves (every 2³² ms ≈ 49.7 days)
        // without losing a bit.
        let points: Vec<(i64, f64)> =
            (0..60 * 1_440).map(|i| (T0 + i * 60_000, 60.0 + (i % 13) as f64 * 0.5)).collect();
        assert_eq!(check("60 days at 60 s", 605_000, &[600_000], &points, true), points.len());
    }

    #[test]
    fn sums_that_lose_the_window_give_way_to_the_scan() {
        use super::Fit;
        let mut points = std::collections::VecDeque::new();
        let mut f = Fit::new(10_000);
        for i in 0..3u32 {
            points.push_back(super::super::point(if i == 0 { 0 } else { 1000 }, 1.0));
            f.add(i, T0 + i as i64 * 1000, 1.0);
        }
        let last = (T0 + 2000, 1.0);
        assert_eq!(f.result(&points, last).map(|r| r.count), Some(3));
        // The window let go of the sums' first point (it never does while
        // it keeps their length): no answer from them until it restarts.
        f.popped();
        assert_eq!(f.result(&points, last), None);
        f.add(3, T0 + 3000, 1.0);
        assert_eq!(f.result(&points, last), None);
        f.clear();
        f.add(0, T0 + 3000, 1.0);
        assert_eq!(f.result(&points, (T0 + 3000, 1.0)).map(|r| r.count), Some(1));
    }

    #[test]
    fn lengths_past_the_retention_are_scanned_not_kept() {
        let (mut fit, _) = stores(60_000, &[30_000, 120_000, 0, -5]);
        let r = fit.push(key(), T0, 1.0).unwrap();
        let shard = &fit.shards()[0];
        let fits = shard.fits_of(&shard.series[r.slot as usize]);
        assert_eq!(fits.iter().map(|f| f.len_ms).collect::<Vec<_>>(), vec![30_000]);
        // The longer length still answers, by scanning.
        assert_eq!(fit.shards()[0].fit_slot(r.slot, T0, 120_000).unwrap().count, 1);
    }
}

#[cfg(test)]
mod size {
    /// Scenario 7 holds 1.2 M series, most without a window, and 170,000
    /// running sums: their sizes are the engine's memory at fleet scale.
    #[test]
    fn series_and_sums_stay_small() {
        assert!(size_of::<super::super::Series>() <= 40, "a series is {} bytes", size_of::<super::super::Series>());
        assert!(size_of::<super::Fit>() <= 96, "running sums are {} bytes", size_of::<super::Fit>());
        assert!(size_of::<super::super::Window>() <= 40, "a window is {} bytes", size_of::<super::super::Window>());
    }
}
