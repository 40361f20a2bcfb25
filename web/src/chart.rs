//! Server-rendered SVG line charts (no script, no CDN): up to two series,
//! each on its own axis (left and right), with the run's steps marked on the
//! time axis. maud escapes every label.

use maud::{Markup, html};

/// One line.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub unit: &'static str,
    /// `(ts_ms, value)`, oldest first.
    pub points: Vec<(i64, f64)>,
    /// CSS class: the line's colour.
    pub class: &'static str,
}

/// A vertical marker: a step of the run, a hold placed or ended.
#[derive(Debug, Clone)]
pub struct Mark {
    pub ts_ms: i64,
    pub label: String,
    pub class: &'static str,
}

const W: f64 = 760.0;
const H: f64 = 190.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 48.0;
const TOP: f64 = 32.0;
const BOTTOM: f64 = 22.0;

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

/// Minutes and seconds from `t0`.
fn rel(ms: i64) -> String {
    let s = ms / 1000;
    if s.abs() < 60 { format!("{s}s") } else { format!("{}m", s / 60) }
}

/// The marks inside the window, those within 1 % of it merged into one
/// ("start, set_fan_curve").
fn merged(marks: &[Mark], from_ms: i64, to_ms: i64) -> Vec<Mark> {
    let near = ((to_ms - from_ms) / 100).max(1);
    let mut out: Vec<Mark> = Vec::new();
    for m in marks.iter().filter(|m| m.ts_ms >= from_ms && m.ts_ms <= to_ms) {
        match out.last_mut() {
            Some(last) if (m.ts_ms - last.ts_ms).abs() <= near => {
                if !last.label.split(", ").any(|l| l == m.label) {
                    last.label.push_str(", ");
                    last.label.push_str(&m.label);
                }
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// The smallest range a series' axis shows: 20 °C, 100 W, 20 points of a
/// percentage, else a tenth of its size.
fn min_span(unit: &str, hi: f64) -> f64 {
    match unit {
        "°C" => 20.0,
        "W" => 100.0,
        "%" => 20.0,
        _ => (hi.abs() * 0.1).max(1.0),
    }
}

/// `[lo, hi]` widened about its middle to at least `span`.
fn widen(lo: f64, hi: f64, span: f64) -> (f64, f64) {
    if hi - lo >= span {
        return (lo, hi);
    }
    let mid = (lo + hi) / 2.0;
    (mid - span / 2.0, mid + span / 2.0)
}

/// A chart of `series` between `from_ms` and `to_ms`, the x axis labelled
/// relative to `t0_ms` (the event), with `marks`.
pub fn chart(title: &str, series: &[Series], marks: &[Mark], from_ms: i64, to_ms: i64, t0_ms: i64) -> Markup {
    let span = (to_ms - from_ms).max(1) as f64;
    let x = |t: i64| LEFT + (t - from_ms) as f64 / span * (W - LEFT - RIGHT);
    let drawn: Vec<&Series> = series.iter().filter(|s| !s.points.is_empty()).take(2).collect();
    let has_data = !drawn.is_empty();
    // Each series on its own scale, with a little headroom.
    let scales: Vec<(f64, f64)> = drawn
        .iter()
        .map(|s| {
            let lo = s.points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            let hi = s.points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            // A minimum span per unit, so a flat line stays flat instead of
            // a 1 W wobble filling the chart.
            let (lo, hi) = widen(lo, hi, min_span(s.unit, hi));
            let pad = ((hi - lo) * 0.1).max(1.0);
            // A count never goes below zero: no axis label of -1 errors.
            let floor = if s.unit == "count" && lo >= 0.0 { 0.0 } else { f64::NEG_INFINITY };
            ((lo - pad).max(floor), hi + pad)
        })
        .collect();
    let y = |v: f64, (lo, hi): (f64, f64)| TOP + (1.0 - (v - lo) / (hi - lo).max(1e-9)) * (H - TOP - BOTTOM);
    let ticks: Vec<i64> = (0..=4).map(|i| from_ms + (span as i64) * i / 4).collect();
    html! {
        figure.chart {
            figcaption {
                (title)
                @for s in &drawn { " " span class={"key " (s.class)} { "━ " (s.label) " (" (s.unit) ")" } }
            }
            svg viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) preserveAspectRatio="none" {
                rect.frame x=(LEFT) y=(TOP) width=(W - LEFT - RIGHT) height=(H - TOP - BOTTOM) {}
                @for t in &ticks {
                    line.grid x1=(x(*t)) x2=(x(*t)) y1=(TOP) y2=(H - BOTTOM) {}
                    text.tick x=(x(*t)) y=(H - 6.0) text-anchor="middle" { (rel(*t - t0_ms)) }
                }
                @for (i, (s, sc)) in drawn.iter().zip(&scales).enumerate() {
                    @let ax = if i == 0 { 4.0 } else { W - 4.0 };
                    @let anchor = if i == 0 { "start" } else { "end" };
                    text class={"axis " (s.class)} x=(ax) y=(TOP + 10.0) text-anchor=(anchor) { (fmt(sc.1)) }
                    text class={"axis " (s.class)} x=(ax) y=(H - BOTTOM) text-anchor=(anchor) { (fmt(sc.0)) }
                    polyline class={"line " (s.class)} fill="none"
                        points=(s.points.iter().map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v, *sc))).collect::<Vec<_>>().join(" ")) {}
                }
                @for (i, m) in merged(marks, from_ms, to_ms).iter().enumerate() {
                    line class={"mark " (m.class)} x1=(x(m.ts_ms)) x2=(x(m.ts_ms)) y1=(TOP) y2=(H - BOTTOM) {}
                    // Two rows of labels, so neighbours do not overlap.
                    text class={"marklabel " (m.class)} x=(x(m.ts_ms) + 3.0) y=(TOP - 4.0 - 11.0 * (i % 2) as f64) { (m.label) }
                }
                @if !has_data {
                    text.empty x=(W / 2.0) y=(H / 2.0) text-anchor="middle" { "no readings in this window (history keeps the last hours)" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_marks_and_escaping() {
        let s = Series {
            label: "temperature".into(),
            unit: "°C",
            points: vec![(0, 70.0), (60_000, 90.0), (120_000, 80.0)],
            class: "temp",
        };
        let m = Mark { ts_ms: 60_000, label: "set_power_limit <450 W>".into(), class: "action" };
        let html = chart("GPU 0", &[s], &[m], 0, 120_000, 0).into_string();
        assert!(html.contains("<polyline"), "{html}");
        // Three points: left edge, middle, right edge.
        assert!(html.contains(&format!("points=\"{:.1},", LEFT)), "{html}");
        assert!(html.contains("set_power_limit &lt;450 W&gt;"), "labels are escaped: {html}");
        assert!(html.contains(">1m<"), "{html}");
        let empty = chart("none", &[], &[], 0, 1, 0).into_string();
        assert!(empty.contains("no readings"));
    }
}

#[cfg(test)]
mod span_tests {
    use super::*;

    /// A flat 700 W limit with a 1 W wobble is drawn on at least 100 W, not
    /// on 699–701 (issue 30: node charts autoscaled to noise); a real
    /// swing keeps its own range.
    #[test]
    fn an_axis_spans_at_least_its_units_minimum() {
        assert_eq!(widen(699.0, 701.0, min_span("W", 701.0)), (650.0, 750.0));
        assert_eq!(widen(30.0, 79.0, min_span("°C", 79.0)), (30.0, 79.0));
        assert_eq!(widen(50.0, 50.0, min_span("%", 50.0)), (40.0, 60.0));
        assert_eq!(widen(3.0, 3.0, min_span("count", 3.0)), (2.5, 3.5));
    }
}
