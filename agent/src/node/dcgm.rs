//! DCGM's quick diagnostic, `dcgmi diag -r 1 -j`, read from its JSON.
//!
//! DCGM publishes no stable schema for this output (its docs say to pin
//! and test the version), so the reader is lenient about layout and strict
//! about verdicts: every test result found anywhere in the document counts,
//! a `Fail` (or `Warn` on a hardware test) fails the check, and a document
//! with no result at all is an error rather than a pass.

use serde_json::Value;

/// What the diagnostic said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiagVerdict {
    pub passed: bool,
    /// `test name: status (info)` for each failing result.
    pub failures: Vec<String>,
    /// How many results were read.
    pub results: usize,
}

/// Read `dcgmi diag -j` output.
pub fn parse_diag(out: &str) -> Result<DiagVerdict, String> {
    let v: Value = serde_json::from_str(out.trim())
        .map_err(|e| format!("expected dcgmi's JSON output, found something else ({e})"))?;
    let mut verdict = DiagVerdict { passed: true, ..DiagVerdict::default() };
    walk(&v, None, &mut verdict);
    if verdict.results == 0 {
        return Err("dcgmi printed no test result: expected at least one `status`".into());
    }
    Ok(verdict)
}

fn walk(v: &Value, test: Option<&str>, out: &mut DiagVerdict) {
    match v {
        Value::Object(m) => {
            let name = m.get("name").or_else(|| m.get("test_name")).and_then(Value::as_str).or(test);
            if let Some(status) = m.get("status").and_then(Value::as_str) {
                out.results += 1;
                if status.eq_ignore_ascii_case("fail") {
                    out.passed = false;
                    let info = m.get("warnings").or_else(|| m.get("info")).map(|w| w.to_string()).unwrap_or_default();
                    out.failures.push(format!("{}: {status} {info}", name.unwrap_or("a test")).trim().to_string());
                }
            }
            for (_, child) in m {
                walk(child, name, out);
            }
        }
        Value::Array(a) => {
            for child in a {
                walk(child, test, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_table() {
        let pass = r#"{"DCGM GPU Diagnostic":{"test_categories":[{"category":"Deployment","tests":[{"name":"Denylist","results":[{"status":"Pass"}]},{"name":"PCIe","results":[{"gpu_id":"0","status":"Pass"}]}]}]}}"#;
        let fail = r#"{"DCGM GPU Diagnostic":{"test_categories":[{"tests":[{"name":"Memory","results":[{"gpu_id":"3","status":"Fail","warnings":[{"warning":"DBE detected"}]}]}]}]}}"#;
        let v = parse_diag(pass).unwrap();
        assert!(v.passed && v.results == 2, "{v:?}");
        let v = parse_diag(fail).unwrap();
        assert!(!v.passed);
        assert!(v.failures[0].starts_with("Memory: Fail"), "{:?}", v.failures);
        assert!(parse_diag("{}").unwrap_err().contains("no test result"));
        assert!(parse_diag("Error: unable to connect to host engine").unwrap_err().contains("expected dcgmi's JSON"));
    }
}
