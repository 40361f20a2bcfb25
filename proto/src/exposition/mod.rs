//! The Prometheus text exposition format (0.0.4), read and written once for
//! the whole workspace: the engine's pull sources and the simulator's
//! recordings read it with [`parse`], the agent's job textfiles line by
//! line with [`parse_line`]; the web server's `/metrics` and the agent's
//! own series are written by the `prometheus-client` crate through
//! [`write()`] (`write.rs`); the agent's DCGM lines, which keep
//! dcgm-exporter's counter names, with [`escape`] and [`fmt_value`]. The
//! reader follows Prometheus' own parser where they could differ (checked
//! against a real server by
//! `tests/tests/it/prometheus.rs`): blanks between a name and its labels and
//! around `=`, only `\\`, `\"` and `\n` as escapes, an empty value as no
//! label, `NaN`/`+Inf`/`-Inf`, an optional integer timestamp (ms).

use std::collections::BTreeMap;

mod write;
pub use write::{Family, Histogram, Labels, Samples, WriteError, labels, write};

/// One sample as Prometheus has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    pub ts_ms: Option<i64>,
}

/// A line that is not a sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected `name{{label=\"value\",…}} value [timestamp]`, found {line:?}")]
pub struct LineError {
    pub line: String,
}

/// Every sample of an exposition; lines that do not parse are counted in
/// the second value, not fatal. Blank lines and comments (`# HELP`,
/// `# TYPE`) are neither.
pub fn parse(text: &str) -> (Vec<Sample>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok(s) => out.push(s),
            Err(_) => bad += 1,
        }
    }
    (out, bad)
}

/// One sample line (not a comment, not blank).
pub fn parse_line(line: &str) -> Result<Sample, LineError> {
    sample(line.trim()).ok_or_else(|| LineError { line: line.chars().take(200).collect() })
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return None;
    }
    let mut labels = BTreeMap::new();
    // Prometheus allows blanks between the name and its labels.
    let mut rest = line[name_end..].trim_start();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let consumed;
        loop {
            // Skip separators.
            while chars.next_if(|(_, c)| *c == ',' || c.is_whitespace()).is_some() {}
            let (i, c) = chars.next()?;
            if c == '}' {
                consumed = i + 1;
                break;
            }
            let start = i;
            let mut key_end = None;
            for (j, c) in chars.by_ref() {
                if c == '=' {
                    key_end = Some(j);
                    break;
                }
            }
            let key = r[start..key_end?].trim().to_string();
            if key.is_empty()
                || key.starts_with(|c: char| c.is_ascii_digit())
                || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return None;
            }
            // Blanks may follow the `=`, as Prometheus allows.
            let quote = loop {
                match chars.next()?.1 {
                    c if c.is_whitespace() => continue,
                    c => break c,
                }
            };
            if quote != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    // The format's three escapes; any other backslash is
                    // kept as written (as Prometheus keeps it).
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c @ ('\\' | '"') => value.push(c),
                        other => {
                            value.push('\\');
                            value.push(other);
                        }
                    },
                    other => value.push(other),
                }
            }
            // An empty value is no label at all, for Prometheus.
            if !value.is_empty() {
                labels.insert(key, value);
            }
        }
        rest = &r[consumed..];
    }
    let mut parts = rest.split_whitespace();
    let value = parse_value(parts.next()?)?;
    let ts_ms = match parts.next() {
        Some(t) => Some(t.parse::<i64>().ok()?),
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Sample { name: name.to_string(), labels, value, ts_ms })
}

/// A sample value as the format (and the HTTP API's JSON strings) write it.
pub fn parse_value(v: &str) -> Option<f64> {
    match v {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// A label value as the format writes it: `\`, `"` and a newline escaped.
pub fn escape(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// A sample value as the format writes it (`NaN`, `+Inf`, `-Inf`).
pub fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_finite() {
        format!("{v}")
    } else if v > 0.0 {
        "+Inf".into()
    } else {
        "-Inf".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the parser and Prometheus' own disagreed (found by
    /// `tests/tests/it/prometheus.rs`, which diffs the two on a real server).
    #[test]
    fn reads_lines_as_prometheus_does() {
        let labels = |line: &str| parse_line(line).ok().map(|s| s.labels.into_iter().collect::<Vec<_>>());
        let l = |pairs: &[(&str, &str)]| Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        for (line, want) in [
            // Blanks between name and labels, and around `=`.
            ("m {  a = \"1\" , b=\"2\" ,} 3", l(&[("a", "1"), ("b", "2")])),
            // Only \\, \" and \n are escapes; another backslash stays.
            (r#"m{t="a\tb",q="\"x\"",b="c:\\d"} 1"#, l(&[("b", r"c:\d"), ("q", "\"x\""), ("t", r"a\tb")])),
            // An empty value is no label.
            ("m{e=\"\",f=\"1\"} 1", l(&[("f", "1")])),
            // A value with the separators in it.
            ("m{job=\"a,b} c\",gpu=\"1\"} 1", l(&[("gpu", "1"), ("job", "a,b} c")])),
            // Not a label name.
            ("m{1a=\"x\"} 1", None),
            ("m{a-b=\"x\"} 1", None),
            // Not a value, a timestamp that is not an integer, one too many.
            ("m 1x", None),
            ("m 1 2.5", None),
            ("m 1 2 3", None),
        ] {
            assert_eq!(labels(line), want, "{line}");
        }
    }

    #[test]
    fn values_and_timestamps_read_as_written() {
        let v = |line: &str| parse_line(line).map(|s| (s.value, s.ts_ms));
        assert_eq!(v("m 1.5"), Ok((1.5, None)));
        assert_eq!(v("m{a=\"1\"} -2 1790000000123"), Ok((-2.0, Some(1_790_000_000_123))));
        assert_eq!(v("m +Inf"), Ok((f64::INFINITY, None)));
        assert!(parse_line("m NaN").is_ok_and(|s| s.value.is_nan()));
        assert_eq!(
            parse_line("just words").unwrap_err().to_string(),
            "expected `name{label=\"value\",…} value [timestamp]`, found \"just words\""
        );
    }

    /// What [`escape`] and [`fmt_value`] write, [`parse`] reads back.
    #[test]
    fn what_is_written_reads_back() {
        for value in ["plain", "a \"quoted\" \\ value", "two\nlines", "c:\\d", ""] {
            for v in [0.5, 700.0, f64::INFINITY, f64::NEG_INFINITY] {
                let line = format!("m{{note=\"{}\",gpu=\"3\"}} {}", escape(value), fmt_value(v));
                let s = parse_line(&line).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(s.labels.get("note").map(String::as_str), (!value.is_empty()).then_some(value), "{line}");
                assert_eq!(s.value, v, "{line}");
            }
        }
        assert_eq!(fmt_value(f64::NAN), "NaN");
        assert_eq!(fmt_value(700.0), "700");
    }
}
