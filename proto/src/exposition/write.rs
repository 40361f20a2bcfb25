//! Writing what nightshift exposes: metric families gathered as plain data
//! at scrape time ([`Family`]) and written by the `prometheus-client`
//! crate's text encoder (format 0.0.4) through a collector of constant
//! metrics — the crate's names, escapes, value and `le` formatting, not
//! ours. The engine's `/metrics` and the agent's own series use it.
//!
//! The agent's DCGM fields are the one exception (`agent/src/exporter.rs`):
//! dcgm-exporter names its counters without `_total`
//! (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, …), and the crate appends
//! `_total` to every counter it writes, so those lines keep dcgm-exporter's
//! names through [`super::escape`] and [`super::fmt_value`].

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// A sample's labels, in the order they are written.
pub type Labels = Vec<(String, String)>;

/// One metric family as gathered at scrape time.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// As exposed: a counter's name ends in `_total`.
    pub name: String,
    pub help: String,
    pub samples: Samples,
}

/// A family's samples, by type.
#[derive(Debug, Clone, PartialEq)]
pub enum Samples {
    Counter(Vec<(Labels, u64)>),
    /// A whole value below 2⁵³ is written as an integer; NaN and ±Inf as
    /// the format spells them.
    Gauge(Vec<(Labels, f64)>),
    Histogram(Vec<(Labels, Histogram)>),
}

/// A histogram as counted: each upper bound with the observations at or
/// below it (cumulative, as the format shows them), then all of them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub cumulative: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

impl Family {
    /// A counter without labels; `name` ends in `_total`.
    pub fn counter(name: &str, help: &str, value: u64) -> Family {
        Family::counters(name, help, vec![(Vec::new(), value)])
    }

    pub fn counters(name: &str, help: &str, samples: Vec<(Labels, u64)>) -> Family {
        Family { name: name.into(), help: help.into(), samples: Samples::Counter(samples) }
    }

    /// A gauge without labels.
    pub fn gauge(name: &str, help: &str, value: f64) -> Family {
        Family::gauges(name, help, vec![(Vec::new(), value)])
    }

    pub fn gauges(name: &str, help: &str, samples: Vec<(Labels, f64)>) -> Family {
        Family { name: name.into(), help: help.into(), samples: Samples::Gauge(samples) }
    }

    pub fn histograms(name: &str, help: &str, samples: Vec<(Labels, Histogram)>) -> Family {
        Family { name: name.into(), help: help.into(), samples: Samples::Histogram(samples) }
    }
}

/// Labels from `(key, value)` pairs.
pub fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Why families could not be written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WriteError {
    #[error("metric {name}: expected a counter's name to end in `_total`, found `{name}`")]
    CounterName { name: String },
    #[error("the exposition could not be encoded")]
    Encode,
}

/// `families` in the Prometheus text format (0.0.4), in the order given.
pub fn write(families: Vec<Family>) -> Result<String, WriteError> {
    for f in &families {
        if matches!(f.samples, Samples::Counter(_)) && !f.name.ends_with("_total") {
            return Err(WriteError::CounterName { name: f.name.clone() });
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Gathered(families)));
    let mut out = String::with_capacity(4096);
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).map_err(|_| WriteError::Encode)?;
    Ok(out)
}

/// The families of one scrape, as a collector the registry encodes.
#[derive(Debug)]
struct Gathered(Vec<Family>);

impl prometheus_client::collector::Collector for Gathered {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let (name, kind) = match &f.samples {
                // The encoder appends `_total` to a counter's name.
                Samples::Counter(_) => (f.name.strip_suffix("_total").unwrap_or(&f.name), MetricType::Counter),
                Samples::Gauge(_) => (f.name.as_str(), MetricType::Gauge),
                Samples::Histogram(_) => (f.name.as_str(), MetricType::Histogram),
            };
            let mut metric = encoder.encode_descriptor(name, &f.help, None, kind)?;
            match &f.samples {
                Samples::Counter(s) => {
                    for (l, v) in s {
                        Count(*v).encode(metric.encode_family(l)?)?;
                    }
                }
                Samples::Gauge(s) => {
                    for (l, v) in s {
                        Level(*v).encode(metric.encode_family(l)?)?;
                    }
                }
                Samples::Histogram(s) => {
                    for (l, h) in s {
                        h.encode(metric.encode_family(l)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

struct Count(u64);

impl EncodeMetric for Count {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.0, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

struct Level(f64);

impl EncodeMetric for Level {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let v = self.0;
        // 2^53: every whole f64 below it is exactly an i64.
        if v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0 {
            encoder.encode_gauge(&(v as i64))
        } else {
            encoder.encode_gauge(&v)
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        // The encoder takes each bucket's own observations and sums them.
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = self
            .cumulative
            .iter()
            .map(|(b, n)| {
                let own = n.saturating_sub(below);
                below = below.max(*n);
                (*b, own)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the crate writes for each kind, read back by our own parser to
    /// the same values: names (a counter's `_total` once), labels in order
    /// and escaped, whole gauges as integers, NaN, cumulative buckets.
    #[test]
    fn families_are_written_as_the_format_says_and_read_back() {
        let text = write(vec![
            Family::counter("x_runs_total", "Runs.", 3),
            Family::counters(
                "x_told_total",
                "Told, by runbook.",
                vec![(labels([("runbook", "a\"b\\c\nd"), ("kind", "page")]), 2)],
            ),
            Family::gauge("x_depth", "Depth.", 2.0),
            Family::gauge("x_age_seconds", "Age.", f64::NAN),
            Family::gauge("x_ratio", "Ratio.", 0.25),
            Family::histograms(
                "x_seconds",
                "Seconds.",
                vec![(
                    labels([("kind", "dbe")]),
                    Histogram { cumulative: vec![(60.0, 1), (300.0, 1), (900.0, 2)], count: 3, sum: 400.5 },
                )],
            ),
        ])
        .unwrap();
        for want in [
            "# HELP x_runs_total Runs.\n# TYPE x_runs_total counter\nx_runs_total 3\n",
            "x_told_total{runbook=\"a\\\"b\\\\c\\nd\",kind=\"page\"} 2\n",
            "# TYPE x_depth gauge\nx_depth 2\n",
            "x_age_seconds NaN\n",
            "x_ratio 0.25\n",
            "# TYPE x_seconds histogram\n",
            "x_seconds_bucket{kind=\"dbe\",le=\"60\"} 1\n",
            "x_seconds_bucket{kind=\"dbe\",le=\"300\"} 1\n",
            "x_seconds_bucket{kind=\"dbe\",le=\"900\"} 2\n",
            "x_seconds_bucket{kind=\"dbe\",le=\"+Inf\"} 3\n",
            "x_seconds_count{kind=\"dbe\"} 3\n",
        ] {
            assert!(text.contains(want), "expected {want:?} in:\n{text}");
        }
        assert!(!text.contains("_total_total"), "{text}");
        let (samples, bad) = super::super::parse(&text);
        assert_eq!(bad, 0, "{text}");
        let told = samples.iter().find(|s| s.name == "x_told_total").unwrap();
        assert_eq!(told.labels.get("runbook").map(String::as_str), Some("a\"b\\c\nd"));
        assert_eq!(samples.iter().find(|s| s.name == "x_seconds_sum").map(|s| s.value), Some(400.5));
    }

    #[test]
    fn a_counter_not_named_total_is_refused() {
        let e = write(vec![Family::counter("x_runs", "Runs.", 1)]).unwrap_err();
        assert_eq!(e.to_string(), "metric x_runs: expected a counter's name to end in `_total`, found `x_runs`");
    }
}
