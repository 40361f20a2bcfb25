//! Maintenance windows as plain data: what a person asks for
//! ([`WindowSpec`]), a window in force or to come ([`Window`]), what a
//! covered node's state says ([`Cover`]), and the checks — pure, so core,
//! fleet and the engine's `maintenance.rs` all use them without a cycle.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The longest window: a month. Longer is a node out of the fleet, not
/// maintenance (`nodes drain`, or take it out of the inventory).
pub const MAX_WINDOW_SECS: i64 = 30 * 86_400;

/// What a person asks for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    #[serde(default)]
    pub matchers: BTreeMap<String, String>,
    #[serde(default)]
    pub nodes: Vec<String>,
    /// None: now.
    #[serde(default)]
    pub starts_ms: Option<i64>,
    pub ends_ms: i64,
    pub reason: String,
}

/// A window in force or to come.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Window {
    pub id: String,
    /// Who set it.
    pub by: String,
    pub reason: String,
    pub matchers: BTreeMap<String, String>,
    pub nodes: Vec<String>,
    pub starts_ms: i64,
    pub ends_ms: i64,
    /// Nodes it covers now (empty before it starts).
    #[serde(default)]
    pub covers: Vec<String>,
}

/// What a node's state says about the window covering it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Cover {
    pub id: String,
    pub by: String,
    pub reason: String,
    pub ends_ms: i64,
}

impl Window {
    /// In force at `now`.
    pub fn active(&self, now: i64) -> bool {
        self.starts_ms <= now && now < self.ends_ms
    }

    /// Whether it covers a node of this name and labels (every matcher).
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.nodes.is_empty() || self.nodes.iter().any(|n| n == name))
            && self.matchers.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// In words for a refusal or a page.
    pub fn words(&self) -> String {
        let mut what: Vec<String> = self.matchers.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !self.nodes.is_empty() {
            what.push(format!("node {}", self.nodes.join(",")));
        }
        format!("{} ({}: {}; {})", self.id, self.by, self.reason, what.join(" "))
    }
}

/// The maintenance windows an engine knows: in force or to come, by id
/// (rebuilt from the chain at start and takeover), and whether any covered
/// a node at the last apply. Its state is reached only through these
/// methods (`maintenance.rs` is the one caller).
#[derive(Debug, Default)]
pub struct WindowBook {
    by_id: std::sync::Mutex<BTreeMap<String, Window>>,
    /// Some node may be under a window: the tick looks at every node only
    /// then (a fleet-month of ticks on 2,000 nodes with no window costs
    /// nothing).
    cover: std::sync::atomic::AtomicBool,
}

impl WindowBook {
    fn book(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Window>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn put(&self, w: Window) {
        self.book().insert(w.id.clone(), w);
    }

    pub fn get(&self, id: &str) -> Option<Window> {
        self.book().get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        self.book().remove(id);
    }

    /// Every window, by id.
    pub fn all(&self) -> Vec<Window> {
        self.book().values().cloned().collect()
    }

    /// Those whose end is at or before `now`.
    pub fn ended_by(&self, now: i64) -> Vec<Window> {
        self.book().values().filter(|w| w.ends_ms <= now).cloned().collect()
    }

    /// Start again from the chain's windows.
    pub fn replace(&self, open: BTreeMap<String, Window>) {
        *self.book() = open;
    }

    /// The windows in force at `now`, to apply to the nodes — or none when
    /// nothing is in force and nothing was covered at the last call.
    pub fn to_apply(&self, now: i64) -> Option<Vec<Window>> {
        let active: Vec<Window> = self.book().values().filter(|w| w.active(now)).cloned().collect();
        let covered_before = self.cover.swap(!active.is_empty(), std::sync::atomic::Ordering::SeqCst);
        if active.is_empty() && !covered_before {
            return None;
        }
        Some(active)
    }
}

/// Check a window before it is recorded: something to match, a reason,
/// an end after now and at most [`MAX_WINDOW_SECS`] after its start, label
/// names as inventories write them, nodes that exist.
pub fn validate(spec: &WindowSpec, now: i64, known: &dyn Fn(&str) -> bool) -> Result<(), String> {
    if spec.matchers.is_empty() && spec.nodes.is_empty() {
        return Err("a maintenance window needs at least one node or label matcher (--node NODE, --match label=value), found none; to stop the whole fleet use `nightshift fleet mode paused`".into());
    }
    if spec.matchers.len() > 20 || spec.nodes.len() > 1000 {
        return Err(format!(
            "expected at most 20 matchers and 1000 nodes, found {} and {}",
            spec.matchers.len(),
            spec.nodes.len()
        ));
    }
    for (k, v) in &spec.matchers {
        let ok = |s: &str| {
            !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        };
        if !ok(k) || !ok(v) {
            return Err(format!(
                "matcher {k:?}={v:?}: expected a label and a value of letters, digits, '.', '_', '-' or '/'"
            ));
        }
    }
    for n in &spec.nodes {
        if !known(n) {
            return Err(format!("node {n:?} is not in the inventory (`nightshift nodes list`)"));
        }
    }
    let reason = spec.reason.trim();
    if reason.is_empty() {
        return Err("reason: expected why (kept in the audit record and shown on each node), found nothing".into());
    }
    if let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason) {
        return Err(problem);
    }
    let start = spec.starts_ms.unwrap_or(now).max(now);
    if spec.ends_ms <= start {
        return Err(format!(
            "end: expected a time after {}, found {}",
            crate::signals::alerts::format_rfc3339_ms(start),
            crate::signals::alerts::format_rfc3339_ms(spec.ends_ms)
        ));
    }
    if spec.ends_ms - start > MAX_WINDOW_SECS * 1000 {
        return Err(format!(
            "end: expected at most 30 days after the start, found {} days; a node out for longer is drained (`nightshift nodes drain`)",
            (spec.ends_ms - start) / 86_400_000
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_790_000_000_000;

    /// The book answers "apply" while a window is in force, once more after
    /// the last one ends (so its marks are cleared), and then not at all —
    /// a tick with no window looks at no node.
    #[test]
    fn the_book_applies_while_in_force_and_once_after() {
        let book = WindowBook::default();
        assert_eq!(book.to_apply(NOW), None, "nothing set, nothing covered");
        let w = Window {
            id: "mw-1".into(),
            by: "user:ana".into(),
            reason: "PDU".into(),
            matchers: BTreeMap::new(),
            nodes: vec!["n1".into()],
            starts_ms: NOW + 1_000,
            ends_ms: NOW + 2_000,
            covers: Vec::new(),
        };
        book.put(w.clone());
        assert_eq!(book.to_apply(NOW), None, "set but not yet in force");
        assert_eq!(book.to_apply(NOW + 1_500), Some(vec![w.clone()]));
        assert_eq!(book.ended_by(NOW + 2_000), vec![w.clone()]);
        book.remove("mw-1");
        assert_eq!(book.to_apply(NOW + 2_500), Some(vec![]), "once more, to clear the marks");
        assert_eq!(book.to_apply(NOW + 3_000), None);
        assert!(book.all().is_empty() && book.get("mw-1").is_none());
    }

    fn spec(matchers: &[(&str, &str)], nodes: &[&str], ends_in_secs: i64, reason: &str) -> WindowSpec {
        WindowSpec {
            matchers: matchers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            starts_ms: None,
            ends_ms: NOW + ends_in_secs * 1000,
            reason: reason.into(),
        }
    }

    #[test]
    fn a_window_is_refused_saying_what_was_expected() {
        let known = |n: &str| n.starts_with("gpu-");
        let cases: Vec<(WindowSpec, &str)> = vec![
            (spec(&[], &[], 3600, "fw"), "needs at least one node or label matcher"),
            (spec(&[("pool", "a")], &[], 3600, "  "), "reason: expected why"),
            (spec(&[("pool", "a")], &[], 0, "fw"), "end: expected a time after"),
            (spec(&[("pool", "a")], &[], -60, "fw"), "end: expected a time after"),
            (spec(&[("pool", "a")], &[], 31 * 86_400, "fw"), "expected at most 30 days after the start, found 31 days"),
            (spec(&[("pool", "a b")], &[], 3600, "fw"), "matcher \"pool\"=\"a b\": expected a label"),
            (spec(&[("", "a")], &[], 3600, "fw"), "expected a label and a value"),
            (spec(&[], &["db-1"], 3600, "fw"), "node \"db-1\" is not in the inventory"),
        ];
        for (s, want) in cases {
            let e = validate(&s, NOW, &known).unwrap_err();
            assert!(e.contains(want), "{s:?}: {e}");
        }
        assert_eq!(validate(&spec(&[("pool", "a")], &["gpu-1"], 3600, "firmware"), NOW, &known), Ok(()));
        assert_eq!(validate(&spec(&[], &["gpu-1"], 30 * 86_400, "rack move"), NOW, &known), Ok(()));
    }

    #[test]
    fn every_matcher_must_hold_as_in_a_silence() {
        let w = |matchers: &[(&str, &str)], nodes: &[&str]| Window {
            id: "mw-1".into(),
            by: "user:ana".into(),
            reason: "fw".into(),
            matchers: matchers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            starts_ms: NOW,
            ends_ms: NOW + 60_000,
            covers: vec![],
        };
        let labels = |l: &[(&str, &str)]| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let a12: BTreeMap<String, String> = labels(&[("pool", "a"), ("rack", "r12")]);
        let a13: BTreeMap<String, String> = labels(&[("pool", "a"), ("rack", "r13")]);
        let cases = [
            (w(&[("pool", "a")], &[]), "n1", &a12, true),
            (w(&[("pool", "a"), ("rack", "r12")], &[]), "n1", &a12, true),
            (w(&[("pool", "a"), ("rack", "r12")], &[]), "n2", &a13, false),
            (w(&[], &["n1"]), "n1", &a13, true),
            (w(&[], &["n1"]), "n2", &a12, false),
            // A name and a label: both must hold.
            (w(&[("rack", "r12")], &["n1", "n2"]), "n2", &a13, false),
            (w(&[("rack", "r12")], &["n1", "n2"]), "n1", &a12, true),
            (w(&[("gpu_model", "H100")], &[]), "n1", &a12, false),
        ];
        for (w, name, labels, want) in cases {
            assert_eq!(w.matches(name, labels), want, "{w:?} on {name} {labels:?}");
        }
        let x = w(&[("pool", "a")], &[]);
        assert!(!x.active(NOW - 1) && x.active(NOW) && x.active(NOW + 59_999) && !x.active(NOW + 60_000));
    }
}
