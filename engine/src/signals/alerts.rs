//! Alertmanager webhook payloads (version 4), split into single alerts.
//!
//! Delivery is at least once and an HA pair sends duplicates, so each alert
//! is keyed by `fingerprint` + `startsAt`: a repeat is a no-op.

use std::collections::{BTreeMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

/// The payload as Alertmanager sends it. Unknown top-level fields are
/// accepted (newer senders add some); the alert fields we rely on are not
/// optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookPayload {
    pub version: String,
    #[serde(default)]
    pub group_key: String,
    #[serde(default)]
    pub truncated_alerts: u64,
    pub status: String,
    #[serde(default)]
    pub receiver: String,
    #[serde(default)]
    pub group_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_annotations: BTreeMap<String, String>,
    #[serde(default, rename = "externalURL")]
    pub external_url: String,
    pub alerts: Vec<Alert>,
}

/// One alert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub status: String,
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub starts_at: String,
    #[serde(default)]
    pub ends_at: String,
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    pub fingerprint: String,
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AlertError {
    #[error("not an Alertmanager webhook payload: {0}")]
    Json(String),
    #[error("unsupported webhook payload version: expected \"4\", found {0:?}")]
    Version(String),
    #[error("alerts[{index}].{field}: {message}")]
    Field { index: usize, field: &'static str, message: String },
}

impl WebhookPayload {
    /// Parse and check a payload.
    pub fn parse(bytes: &[u8]) -> Result<WebhookPayload, AlertError> {
        // A key given twice (two `Hostname` labels) is refused, as in every
        // other body: the last would win while a reader sees the first.
        nightshift_proto::json::check_no_duplicate_keys(bytes).map_err(AlertError::Json)?;
        let p: WebhookPayload = serde_json::from_slice(bytes).map_err(|e| AlertError::Json(e.to_string()))?;
        if p.version != "4" {
            return Err(AlertError::Version(p.version));
        }
        for (index, a) in p.alerts.iter().enumerate() {
            if a.status != "firing" && a.status != "resolved" {
                return Err(AlertError::Field {
                    index,
                    field: "status",
                    message: format!("expected firing or resolved, found {:?}", a.status),
                });
            }
            if a.fingerprint.is_empty() {
                return Err(AlertError::Field {
                    index,
                    field: "fingerprint",
                    message: "expected a fingerprint, found \"\"".into(),
                });
            }
            parse_rfc3339_ms(&a.starts_at).ok_or_else(|| AlertError::Field {
                index,
                field: "startsAt",
                message: format!("expected an RFC 3339 time, found {:?}", a.starts_at),
            })?;
            if !a.labels.contains_key("alertname") {
                return Err(AlertError::Field {
                    index,
                    field: "labels",
                    message: "expected an alertname label".into(),
                });
            }
        }
        Ok(p)
    }
}

impl Alert {
    /// The alert's name.
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map(String::as_str).unwrap_or("")
    }

    /// The host the alert is about: `Hostname`/`hostname` (dcgm-exporter's
    /// node name), else `instance` (port stripped; in Kubernetes that is the
    /// exporter's pod, not the node), else `node` — the same order as the
    /// Prometheus source.
    pub fn host(&self) -> Option<String> {
        if let Some(h) = ["Hostname", "hostname"].iter().find_map(|k| self.labels.get(*k)) {
            return Some(h.clone());
        }
        if let Some(h) = self.instance_host() {
            return Some(h);
        }
        self.labels.get("node").cloned()
    }

    /// The host of the `instance` label: the scrape target Prometheus
    /// itself set (a scraped series' own `instance` becomes
    /// `exported_instance` unless `honor_labels`), so the one host label a
    /// job writing metrics cannot choose.
    pub fn instance_host(&self) -> Option<String> {
        self.labels.get("instance").map(|i| address_host(i).unwrap_or(i).to_string())
    }

    /// The GPU index from the `gpu` label, if any (read strictly, see
    /// [`Alert::gpu_label`]).
    pub fn gpu(&self) -> Option<u32> {
        self.gpu_label().ok().flatten()
    }

    /// The `gpu` label as a GPU index: decimal digits only, no sign, no
    /// leading zero (`+1` and `007` are not GPUs 1 and 7: a label written
    /// some other way is a mistake to refuse, not to guess at).
    pub fn gpu_label(&self) -> Result<Option<u32>, String> {
        let Some(g) = self.labels.get("gpu") else { return Ok(None) };
        let canonical = !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) && (g == "0" || !g.starts_with('0'));
        match g.parse::<u32>() {
            Ok(n) if canonical => Ok(Some(n)),
            _ => Err(format!(
                "expected the gpu label to be a GPU index (0, 1, 2 … in decimal, no sign or leading zero), found {g:?}"
            )),
        }
    }

    /// `startsAt` in ms since the epoch.
    pub fn starts_at_ms(&self) -> i64 {
        parse_rfc3339_ms(&self.starts_at).unwrap_or(0)
    }

    /// The deduplication key.
    pub fn key(&self) -> String {
        format!("{}@{}", self.fingerprint, self.starts_at)
    }
}

/// Parse an RFC 3339 timestamp (`2026-11-30T03:04:05.123Z`, offsets
/// allowed) to ms since the epoch, with `jiff` (which checks the calendar:
/// no 31 February). Years before 1970 (Alertmanager's
/// `0001-01-01T00:00:00Z` for "no end") give negative values. A date
/// without a time or an offset is refused.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let ts: jiff::Timestamp = s.parse().ok()?;
    Some(ts.as_millisecond())
}

/// Format ms since the epoch as RFC 3339 UTC (for display and payloads),
/// always with milliseconds; out-of-range values are clamped to the years
/// jiff can represent (-9999 to 9999).
pub fn format_rfc3339_ms(ms: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A bounded set of seen keys (oldest forgotten first): at most `cap`
/// keys, and with [`SeenSet::insert_at`] none older than a maximum age.
#[derive(Debug)]
pub struct SeenSet {
    set: HashSet<String>,
    /// Keys in insertion order, with when they were seen (if told).
    order: VecDeque<(String, Option<i64>)>,
    cap: usize,
}

impl Default for SeenSet {
    fn default() -> Self {
        SeenSet::new(100_000)
    }
}

impl SeenSet {
    pub fn new(cap: usize) -> SeenSet {
        SeenSet { set: HashSet::new(), order: VecDeque::new(), cap: cap.max(1) }
    }

    /// True when `key` is new (and remembers it).
    pub fn insert(&mut self, key: String) -> bool {
        self.insert_inner(key, None)
    }

    /// [`SeenSet::insert`] of a key seen at `at_ms`, first forgetting the
    /// keys seen more than `max_age_ms` before it (in time order, as the
    /// audit log replays them and live events come).
    pub fn insert_at(&mut self, key: String, at_ms: i64, max_age_ms: i64) -> bool {
        let cutoff = at_ms.saturating_sub(max_age_ms);
        while let Some((_, Some(t))) = self.order.front() {
            if *t >= cutoff {
                break;
            }
            if let Some((old, _)) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.insert_inner(key, Some(at_ms))
    }

    fn insert_inner(&mut self, key: String, at_ms: Option<i64>) -> bool {
        if self.set.contains(&key) {
            return false;
        }
        if self.order.len() >= self.cap
            && let Some((old, _)) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.set.insert(key.clone());
        self.order.push_back((key, at_ms));
        true
    }

    pub fn contains(&self, key: &str) -> bool {
        self.set.contains(key)
    }
}

/// The host of `host:port` or `[v6]:port` (`None` without a numeric port).
pub fn address_host(a: &str) -> Option<&str> {
    if let Some(rest) = a.strip_prefix('[') {
        return rest.find(']').map(|end| &rest[..end]);
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) => Some(h),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload in the shape Alertmanager 0.27 sends (captured format).
    pub const SAMPLE: &str = r#"{
  "receiver": "nightshift",
  "status": "firing",
  "alerts": [
    {
      "status": "firing",
      "labels": {"alertname": "GpuTempHigh", "Hostname": "gpu-a1", "gpu": "3", "instance": "gpu-a1:9400", "job": "dcgm", "severity": "critical", "UUID": "GPU-9a1b"},
      "annotations": {"summary": "GPU 3 on gpu-a1 at 91 C"},
      "startsAt": "2026-11-30T03:00:12.345Z",
      "endsAt": "0001-01-01T00:00:00Z",
      "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP+%3E+85",
      "fingerprint": "5e2c9a1f0b7d3e44"
    }
  ],
  "groupLabels": {"alertname": "GpuTempHigh"},
  "commonLabels": {"alertname": "GpuTempHigh", "severity": "critical"},
  "commonAnnotations": {},
  "externalURL": "http://alertmanager:9093",
  "version": "4",
  "groupKey": "{}:{alertname=\"GpuTempHigh\"}",
  "truncatedAlerts": 0,
  "notification_reason": "new"
}"#;

    #[test]
    fn parses_the_real_format() {
        let p = WebhookPayload::parse(SAMPLE.as_bytes()).unwrap();
        let a = &p.alerts[0];
        assert_eq!(a.name(), "GpuTempHigh");
        assert_eq!(a.host().as_deref(), Some("gpu-a1"));
        assert_eq!(a.gpu(), Some(3));
        for bad in ["+1", "007", "-1", "1.0", " 1", "4294967296", ""] {
            let mut b = a.clone();
            b.labels.insert("gpu".into(), bad.into());
            assert!(b.gpu_label().unwrap_err().contains(&format!("found {bad:?}")), "{bad}");
            assert_eq!(b.gpu(), None);
        }
        assert_eq!(a.starts_at_ms(), parse_rfc3339_ms("2026-11-30T03:00:12.345Z").unwrap());
        assert_eq!(a.key(), "5e2c9a1f0b7d3e44@2026-11-30T03:00:12.345Z");
    }

    #[test]
    fn refuses_bad_payloads_naming_the_field() {
        let cases = [
            ("{", "not an Alertmanager webhook payload: EOF while parsing"),
            (
                r#"{"version":"3","status":"firing","alerts":[]}"#,
                "unsupported webhook payload version: expected \"4\", found \"3\"",
            ),
            (
                r#"{"version":"4","status":"firing","alerts":[{"status":"burning","labels":{"alertname":"x"},"startsAt":"2026-01-01T00:00:00Z","fingerprint":"f"}]}"#,
                "alerts[0].status: expected firing or resolved, found \"burning\"",
            ),
            (
                r#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"x"},"startsAt":"yesterday","fingerprint":"f"}]}"#,
                "alerts[0].startsAt: expected an RFC 3339 time, found \"yesterday\"",
            ),
            (
                r#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{}}]}"#,
                "missing field `startsAt`",
            ),
            // Issue 46 point 8: two `Hostname` labels, the last one won.
            (
                r#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"x","Hostname":"a","Hostname":"b"},"startsAt":"2026-01-01T00:00:00Z","fingerprint":"f"}]}"#,
                "duplicate key \"Hostname\": expected each key once in an object",
            ),
        ];
        for (input, want) in cases {
            let e = WebhookPayload::parse(input.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{input}: {e}");
        }
    }

    #[test]
    fn host_label_precedence() {
        let mk = |pairs: &[(&str, &str)]| Alert {
            status: "firing".into(),
            labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            annotations: Default::default(),
            starts_at: "2026-01-01T00:00:00Z".into(),
            ends_at: String::new(),
            generator_url: String::new(),
            fingerprint: "f".into(),
        };
        assert_eq!(mk(&[("instance", "10.0.0.7:9400"), ("Hostname", "n1")]).host().as_deref(), Some("n1"));
        assert_eq!(mk(&[("instance", "n1")]).host().as_deref(), Some("n1"));
        assert_eq!(mk(&[("instance", "[fd00::1]:9400")]).host().as_deref(), Some("fd00::1"));
        assert_eq!(mk(&[("Hostname", "n2")]).host().as_deref(), Some("n2"));
        assert_eq!(mk(&[("hostname", "n3"), ("node", "n4")]).host().as_deref(), Some("n3"));
        assert_eq!(mk(&[("node", "n4")]).host().as_deref(), Some("n4"));
        assert_eq!(mk(&[]).host(), None);
        // The scrape target's host, whatever Hostname says (issue 46 point 10).
        assert_eq!(
            mk(&[("instance", "10.0.0.7:9400"), ("Hostname", "n1")]).instance_host().as_deref(),
            Some("10.0.0.7")
        );
        assert_eq!(mk(&[("Hostname", "n1")]).instance_host(), None);
        for (a, h) in
            [("10.0.0.7:2222", Some("10.0.0.7")), ("[fd00::1]:22", Some("fd00::1")), ("sim:n1", None), ("n1", None)]
        {
            assert_eq!(address_host(a), h, "{a}");
        }
    }

    #[test]
    fn rfc3339_round_trip() {
        for s in ["1970-01-01T00:00:00.000Z", "2026-11-30T03:00:12.345Z", "2000-02-29T23:59:59.999Z"] {
            assert_eq!(format_rfc3339_ms(parse_rfc3339_ms(s).unwrap()), s);
        }
        assert_eq!(parse_rfc3339_ms("2026-11-30T05:00:00+02:00"), parse_rfc3339_ms("2026-11-30T03:00:00Z"));
        assert!(parse_rfc3339_ms("0001-01-01T00:00:00Z").unwrap() < 0);
        assert_eq!(format_rfc3339_ms(parse_rfc3339_ms("0001-01-01T00:00:00Z").unwrap()), "0001-01-01T00:00:00.000Z");
        // What the hand-written parser let through or got wrong.
        for bad in [
            "2026-11-30",                // no time
            "2026-02-31T00:00:00Z",      // 31 February
            "2025-02-29T00:00:00Z",      // not a leap year
            "2026-04-31T12:00:00Z",      // 31 April
            "2026-11-30T24:00:00Z",      // hour 24
            "2026-11-30T03:00:00",       // no offset
            "2026-11-30T03:00:00+2:00",  // short offset
            "2026-11-30T03:00:00Z junk", // trailing text
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
        assert_eq!(parse_rfc3339_ms("2026-11-30t03:00:00.5z"), parse_rfc3339_ms("2026-11-30T03:00:00.500Z"));
        assert!(format_rfc3339_ms(i64::MAX).starts_with("9999-"));
    }

    #[test]
    fn seen_set_is_bounded() {
        let mut s = SeenSet::new(2);
        assert!(s.insert("a".into()));
        assert!(!s.insert("a".into()));
        assert!(s.insert("b".into()));
        assert!(s.insert("c".into()));
        assert_eq!(s.order.len(), 2);
        assert!(s.insert("a".into()), "a was forgotten");
    }

    /// Resolved episodes are forgotten by age too (issue 26: memory of
    /// episodes bounded by age), in time order.
    #[test]
    fn seen_set_forgets_by_age() {
        let mut s = SeenSet::new(100);
        assert!(s.insert_at("e1".into(), 1_000, 10_000));
        assert!(s.insert_at("e2".into(), 5_000, 10_000));
        assert!(s.contains("e1") && s.contains("e2"));
        assert!(s.insert_at("e3".into(), 12_000, 10_000));
        assert!(!s.contains("e1"), "older than the age: forgotten");
        assert!(s.contains("e2") && s.contains("e3"));
        assert!(!s.insert_at("e3".into(), 13_000, 10_000), "still known");
        assert_eq!(s.order.len(), 2);
    }
}
