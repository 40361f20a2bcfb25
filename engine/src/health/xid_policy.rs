//! The XID policy: what each XID means and what the H8 ladder does about
//! it. Data — the shipped table (`engine/data/xid-policy.yaml`, docs/XID.md
//! with its sources) and a site's overrides (engine.yaml
//! `fault_policy_path`), validated with file:line:column and re-read by a
//! reload. No engine state: the health model classifies with the policy in
//! force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::runbooks::manifest::LoadError;
pub use nightshift_proto::wire::FATAL_XIDS;

/// What to do about an XID: NVIDIA's catalog's immediate-action bucket, as
/// nightshift acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum XidAction {
    /// The application's fault: restart the job; the GPU stays in service.
    RestartApp,
    /// A consequence of another error (a killed job), informational, or
    /// benign at this site: not a fault.
    Ignore,
    /// Drain, move the jobs, reset the GPU, check it.
    ResetGpu,
    /// Drain, move the jobs, reboot the node (a GPU off the bus), check it.
    RebootNode,
    /// Replace the GPU.
    Rma,
}

impl XidAction {
    pub fn as_str(self) -> &'static str {
        match self {
            XidAction::RestartApp => "restart_app",
            XidAction::Ignore => "ignore",
            XidAction::ResetGpu => "reset_gpu",
            XidAction::RebootNode => "reboot_node",
            XidAction::Rma => "rma",
        }
    }

    /// Whether the GPU leaves service for it.
    pub fn is_fault(self) -> bool {
        matches!(self, XidAction::ResetGpu | XidAction::RebootNode | XidAction::Rma)
    }
}

/// One XID code: its meaning and what to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct XidInfo {
    pub code: u32,
    pub mnemonic: String,
    pub meaning: String,
    pub action: XidAction,
    /// Why the shipped row differs from the catalog's bucket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Set by a site override: why this site acts otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site_reason: Option<String>,
}

/// The shipped table, compiled in (a test checks it loads).
pub const SHIPPED_POLICY: &str = include_str!("../../data/xid-policy.yaml");
const SHIPPED_PATH: &str = "engine/data/xid-policy.yaml";

/// One file's form: the shipped table and a site's overrides alike.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    version: u32,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    xids: Vec<XidEntry>,
    #[serde(default)]
    repeats: Option<RepeatsEntry>,
}

/// The history rule's form in a file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RepeatsEntry {
    more_than: u32,
    window_secs: u64,
    #[serde(default)]
    note: Option<String>,
    /// Overrides only: why the site counts otherwise (audited).
    #[serde(default)]
    reason: Option<String>,
}

/// The history rule: the same XID that is not a fault by itself, on one
/// GPU, more than `more_than` times within `window_secs` makes the GPU
/// suspect (runbook `xid-repeat`: tell a person, drain the GPU once idle).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepeatRule {
    pub more_than: u32,
    pub window_secs: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site_reason: Option<String>,
}

/// The longest repeat window a file may give (the history kept per GPU).
pub const MAX_REPEAT_WINDOW_SECS: u64 = 7 * 86_400;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct XidEntry {
    code: u32,
    #[serde(default)]
    mnemonic: Option<String>,
    #[serde(default)]
    meaning: Option<String>,
    action: XidAction,
    #[serde(default)]
    note: Option<String>,
    /// Overrides only: why the site acts otherwise (audited).
    #[serde(default)]
    reason: Option<String>,
}

/// The XID policy in force: the shipped table with a site's overrides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct XidPolicy {
    table: BTreeMap<u32, XidInfo>,
    /// The history rule (the shipped file always has one).
    pub repeats: RepeatRule,
    /// The overrides file read, if any.
    pub overrides_path: Option<PathBuf>,
}

impl Default for XidPolicy {
    /// The shipped table.
    fn default() -> XidPolicy {
        XidPolicy::shipped().clone()
    }
}

/// A rule that never trips: what a policy starts from before its file.
const NO_REPEATS: RepeatRule = RepeatRule { more_than: u32::MAX, window_secs: 0, site_reason: None };

/// The highest XID code a file may name (the catalog ends below 200 today).
pub const MAX_XID: u32 = 999;

impl XidPolicy {
    /// The shipped table.
    pub fn shipped() -> &'static XidPolicy {
        static SHIPPED: OnceLock<XidPolicy> = OnceLock::new();
        SHIPPED.get_or_init(|| {
            let mut p = XidPolicy { table: BTreeMap::new(), repeats: NO_REPEATS, overrides_path: None };
            // Checked by `the_shipped_xid_policy_loads`: a broken shipped
            // table fails the build's tests, never an engine.
            if let Err(e) = p.merge(SHIPPED_POLICY, Path::new(SHIPPED_PATH), false) {
                tracing::error!(error = %e, "the shipped XID policy does not load");
            }
            p
        })
    }

    /// The shipped table with the overrides in `path` (none: the shipped
    /// table alone).
    pub fn load(path: Option<&Path>) -> Result<Arc<XidPolicy>, LoadError> {
        let Some(path) = path else { return Ok(Arc::new(XidPolicy::shipped().clone())) };
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.into(),
            line: 0,
            column: 0,
            message: format!("cannot read the XID policy overrides: {e}"),
        })?;
        XidPolicy::with_overrides(&text, path).map(Arc::new)
    }

    /// The shipped table with the overrides in `text` (`path` names it in
    /// errors).
    pub fn with_overrides(text: &str, path: &Path) -> Result<XidPolicy, LoadError> {
        let mut p = XidPolicy::shipped().clone();
        p.merge(text, path, true)?;
        p.overrides_path = Some(path.to_path_buf());
        Ok(p)
    }

    fn merge(&mut self, text: &str, path: &Path, site: bool) -> Result<(), LoadError> {
        let err = |needle: &str, message: String| {
            let (line, column) = crate::runbooks::manifest::locate(text, needle);
            LoadError { file: path.into(), line, column, message }
        };
        let f: PolicyFile = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            LoadError { file: path.into(), line, column, message }
        })?;
        if f.version != 1 {
            return Err(err("version", format!("version: expected 1, found {}", f.version)));
        }
        let _ = f.source;
        if let Some(r) = f.repeats {
            if !(1..=1000).contains(&r.more_than) {
                return Err(err(
                    "repeats.more_than",
                    format!("repeats.more_than: expected 1 to 1000, found {}", r.more_than),
                ));
            }
            if !(60..=MAX_REPEAT_WINDOW_SECS).contains(&r.window_secs) {
                return Err(err(
                    "repeats.window_secs",
                    format!(
                        "repeats.window_secs: expected 60 to {MAX_REPEAT_WINDOW_SECS} (a week), found {}",
                        r.window_secs
                    ),
                ));
            }
            let reason = r.reason.as_deref().map(str::trim).filter(|t| !t.is_empty()).map(str::to_string);
            if site && reason.is_none() {
                return Err(err(
                    "repeats",
                    "repeats: a site override of the history rule says why (`reason:`, audited), found none".into(),
                ));
            }
            if !site && reason.is_some() {
                return Err(err("repeats.reason", "repeats.reason: only a site override has one".into()));
            }
            let _ = r.note;
            self.repeats = RepeatRule { more_than: r.more_than, window_secs: r.window_secs, site_reason: reason };
        }
        let mut seen = BTreeMap::new();
        for (i, x) in f.xids.into_iter().enumerate() {
            let at = format!("xids.{i}");
            if x.code == 0 || x.code > MAX_XID {
                return Err(err(
                    &format!("{at}.code"),
                    format!("xids[{i}].code: expected an XID code from 1 to {MAX_XID}, found {}", x.code),
                ));
            }
            if let Some(first) = seen.insert(x.code, i) {
                return Err(err(
                    &format!("{at}.code"),
                    format!("xids[{i}]: XID {} is listed twice (first as xids[{first}]): keep one", x.code),
                ));
            }
            let text_of = |v: &Option<String>, what: &str| -> Result<Option<String>, LoadError> {
                match v.as_deref().map(str::trim) {
                    Some("") => {
                        Err(err(&format!("{at}.{what}"), format!("xids[{i}].{what}: expected text, found none")))
                    }
                    other => Ok(other.map(str::to_string)),
                }
            };
            let (mnemonic, meaning, note, reason) = (
                text_of(&x.mnemonic, "mnemonic")?,
                text_of(&x.meaning, "meaning")?,
                text_of(&x.note, "note")?,
                text_of(&x.reason, "reason")?,
            );
            if site && reason.is_none() {
                return Err(err(
                    &format!("{at}.code"),
                    format!("xids[{i}]: a site override of XID {} says why (`reason:`, audited), found none", x.code),
                ));
            }
            if !site && reason.is_some() {
                return Err(err(&format!("{at}.reason"), format!("xids[{i}].reason: only a site override has one")));
            }
            if site && x.action.is_fault() && !FATAL_XIDS.contains(&x.code) {
                return Err(err(
                    &format!("{at}.action"),
                    format!(
                        "xids[{i}].action: XID {} can be `ignore` or `restart_app` here, found `{}`: the agents count only the shipped fatal XIDs ({}) as fault events; a site marks one of those benign or changes its repair, and asks for a new one in the shipped table",
                        x.code,
                        x.action.as_str(),
                        FATAL_XIDS.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            let known = self.table.get(&x.code);
            let (Some(mnemonic), Some(meaning)) = (
                mnemonic.or_else(|| known.map(|k| k.mnemonic.clone())),
                meaning.or_else(|| known.map(|k| k.meaning.clone())),
            ) else {
                return Err(err(
                    &format!("{at}.code"),
                    format!(
                        "xids[{i}]: XID {} is not in the shipped table: give its `mnemonic:` and `meaning:` (from NVIDIA's Xid catalog)",
                        x.code
                    ),
                ));
            };
            let note = note.or_else(|| known.and_then(|k| k.note.clone()));
            self.table.insert(
                x.code,
                XidInfo { code: x.code, mnemonic, meaning, action: x.action, note, site_reason: reason },
            );
        }
        Ok(())
    }

    /// What the policy says about an XID, if it is one nightshift knows.
    pub fn info(&self, code: u32) -> Option<&XidInfo> {
        self.table.get(&code)
    }

    /// Whether an XID is a hardware fault (the GPU leaves service).
    pub fn is_fault(&self, code: u32) -> bool {
        self.info(code).is_some_and(|x| x.action.is_fault())
    }

    /// Every code, in order.
    pub fn entries(&self) -> impl Iterator<Item = &XidInfo> {
        self.table.values()
    }

    /// What changed from `old`, one line per code (`XID 109: reset_gpu →
    /// ignore (benign here)`): what a reload audits.
    pub fn changes_from(&self, old: &XidPolicy) -> Vec<String> {
        let mut out = Vec::new();
        if self.repeats != old.repeats {
            let r = &self.repeats;
            out.push(format!(
                "repeats: more than {} in {} s → more than {} in {} s{}",
                old.repeats.more_than,
                old.repeats.window_secs,
                r.more_than,
                r.window_secs,
                r.site_reason.as_deref().map_or_else(|| " (the shipped rule)".to_string(), |w| format!(" ({w})"))
            ));
        }
        let codes: std::collections::BTreeSet<u32> = self.table.keys().chain(old.table.keys()).copied().collect();
        for code in codes {
            match (old.info(code), self.info(code)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => out.push(format!(
                    "XID {code}: {} → {}{}",
                    a.action.as_str(),
                    b.action.as_str(),
                    b.site_reason.as_deref().map_or_else(|| " (the shipped row)".to_string(), |r| format!(" ({r})"))
                )),
                (None, Some(b)) => out.push(format!(
                    "XID {code} added: {}{}",
                    b.action.as_str(),
                    b.site_reason.as_deref().map_or_else(String::new, |r| format!(" ({r})"))
                )),
                (Some(a), None) => out.push(format!("XID {code} removed (was {})", a.action.as_str())),
                (None, None) => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_xid_policy_loads() {
        let mut p = XidPolicy { table: BTreeMap::new(), repeats: NO_REPEATS, overrides_path: None };
        p.merge(SHIPPED_POLICY, Path::new(SHIPPED_PATH), false).expect("the shipped table loads");
        assert_eq!((p.repeats.more_than, p.repeats.window_secs), (3, 86_400), "the shipped history rule");
        assert_eq!(&p, XidPolicy::shipped());
        for code in [13, 31, 43, 45, 46, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 140, 143, 154, 158] {
            assert!(p.info(code).is_some(), "XID {code}");
        }
        assert_eq!(p.info(79).unwrap().action, XidAction::RebootNode);
        assert_eq!(p.info(64).unwrap().action, XidAction::Rma);
        assert!(!p.is_fault(13) && p.is_fault(95) && !p.is_fault(145) && !p.is_fault(7));
        // What the agents count as fatal events is what the table calls a
        // fault: no more (a reset check on a benign code), no less (a fault
        // no event would show).
        let faults: Vec<u32> = p.entries().filter(|x| x.action.is_fault()).map(|x| x.code).collect();
        assert_eq!(faults, FATAL_XIDS, "the shipped faults against the agents' FATAL_XIDS");
    }

    #[test]
    fn a_site_override_changes_one_row_and_says_why() {
        let text = "version: 1\nxids:\n  - { code: 109, action: ignore, reason: benign on driver 550 here }\n  - { code: 74, action: rma, reason: our NVLink faults never reset clean }\n  - { code: 201, mnemonic: NEW_ONE, meaning: a new app fault, action: restart_app, reason: seen in the field }\n";
        let p = XidPolicy::with_overrides(text, Path::new("site.yaml")).unwrap();
        assert!(!p.is_fault(109) && !p.is_fault(201) && p.is_fault(79) && p.is_fault(74));
        assert_eq!(p.info(74).unwrap().action, XidAction::Rma);
        assert_eq!(p.info(109).unwrap().mnemonic, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "the shipped text is kept");
        assert_eq!(
            p.changes_from(XidPolicy::shipped()),
            vec![
                "XID 74: reset_gpu → rma (our NVLink faults never reset clean)",
                "XID 109: reset_gpu → ignore (benign on driver 550 here)",
                "XID 201 added: restart_app (seen in the field)"
            ]
        );
        assert!(XidPolicy::shipped().changes_from(XidPolicy::shipped()).is_empty());
        let p = XidPolicy::with_overrides(
            "version: 1\nrepeats: { more_than: 10, window_secs: 3600, reason: noisy inference jobs }\n",
            Path::new("site.yaml"),
        )
        .unwrap();
        assert_eq!(
            p.changes_from(XidPolicy::shipped()),
            vec!["repeats: more than 3 in 86400 s → more than 10 in 3600 s (noisy inference jobs)"]
        );
    }

    #[test]
    fn the_example_overrides_load() {
        let text = include_str!("../../../examples/xid-overrides.yaml");
        let p = XidPolicy::with_overrides(text, Path::new("examples/xid-overrides.yaml")).unwrap();
        assert_eq!(p.changes_from(XidPolicy::shipped()).len(), 2);
    }

    /// Every refusal says where, what was expected and what was found.
    #[test]
    fn a_bad_override_is_refused_with_its_place() {
        for (text, want) in [
            ("version: 2\nxids: []\n", "site.yaml:1:1: version: expected 1, found 2"),
            ("version: 1\nxids:\n  - { code: 109, action: benign, reason: x }\n", "site.yaml:3:"),
            (
                "version: 1\nxids:\n  - { code: 109, action: ignore }\n",
                "site.yaml:3:7: xids[0]: a site override of XID 109 says why",
            ),
            ("version: 1\nxids:\n  - { code: -1, action: ignore, reason: x }\n", "site.yaml:3:"),
            (
                "version: 1\nxids:\n  - { code: 0, action: ignore, reason: x }\n",
                "expected an XID code from 1 to 999, found 0",
            ),
            ("version: 1\nxids:\n  - { code: 5000, action: ignore, reason: x }\n", "found 5000"),
            (
                "version: 1\nxids:\n  - { code: 300, action: ignore, reason: x }\n",
                "site.yaml:3:7: xids[0]: XID 300 is not in the shipped table",
            ),
            (
                "version: 1\nxids:\n  - { code: 13, action: reset_gpu, reason: x }\n",
                "site.yaml:3:17: xids[0].action: XID 13 can be `ignore` or `restart_app` here, found `reset_gpu`",
            ),
            (
                "version: 1\nxids:\n  - { code: 74, action: rma, reason: x }\n  - { code: 74, action: ignore, reason: y }\n",
                "site.yaml:4:7: xids[1]: XID 74 is listed twice",
            ),
            ("version: 1\nxid:\n  - { code: 74, action: rma, reason: x }\n", "site.yaml:2:1: unknown field `xid`"),
            (
                "version: 1\nxids:\n  - { code: 74, action: rma, reason: \"  \" }\n",
                "xids[0].reason: expected text, found none",
            ),
            (
                "version: 1\nrepeats: { more_than: 0, window_secs: 3600, reason: x }\n",
                "site.yaml:2:12: repeats.more_than: expected 1 to 1000, found 0",
            ),
            (
                "version: 1\nrepeats: { more_than: 3, window_secs: 9999999, reason: x }\n",
                "repeats.window_secs: expected 60 to 604800 (a week), found 9999999",
            ),
            (
                "version: 1\nrepeats: { more_than: 3, window_secs: 3600 }\n",
                "site.yaml:2:1: repeats: a site override of the history rule says why",
            ),
            ("version: 1\nrepeats: { more: 3, window_secs: 3600, reason: x }\n", "unknown field `more`"),
        ] {
            let e = XidPolicy::with_overrides(text, Path::new("site.yaml")).expect_err(text).to_string();
            assert!(e.starts_with(want) || e.contains(want), "{text:?}: {e}");
            assert!(e.starts_with("site.yaml:"), "{e}");
        }
    }
}
