//! A fleet's fault mix as data: how often each class of interruption
//! happens (counts over the source's GPU-days, so any fleet size scales
//! them), which simulated fault produces its real signals, what it does to
//! a job, and how long its repair takes once started.
//!
//! ```yaml
//! version: 1
//! name: llama3-405b
//! source: "The Llama 3 Herd of Models (2024), Table 5"
//! gpu_days: 884736            # 16,384 GPUs × 54 days
//! classes:
//!   - {name: faulty-gpu, count: 148, signal: gpu_lost, effect: kill, repair: reseat, repair_secs: 14400}
//!   - {name: hbm3, count: 72, signal: ecc_dbe, effect: kill, repair: reset, repair_secs: 1800}
//! ```
//!
//! [`FaultMix::parse`] refuses a typo, an unknown class or signal, a
//! negative or non-finite count and a missing repair time with
//! `file:line:column` and what was expected.

use std::path::Path;

use serde::{Deserialize, Serialize};

use nightshift_engine::embed::LoadError;

/// What a fault looks like on the node: the simulated fault that makes its
/// real signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// An XID on one GPU (`xid_code`).
    Xid,
    /// Double-bit ECC errors on one GPU.
    EccDbe,
    /// The GPU falls off the bus (XID 79).
    GpuLost,
    /// A row remap fails: no spare row left (XID 64).
    RowRemapFailure,
    /// A physical link fault on one GPU: XID 74 and its NVLink links down
    /// (errors rising) until the link is reseated.
    LinkFault,
    /// The GPU's thermal interface fails (its thermal resistance rises).
    Thermal,
    /// The node's job stops advancing (a collective that never returns).
    HungJob,
    /// A person drains the node for planned work (host maintenance).
    PersonDrain,
    /// Nothing any telemetry sees (a software bug, silent corruption, a
    /// part nightshift has no reading for).
    None,
}

impl Signal {
    /// Whether the signal is a hardware signal nightshift can see (the
    /// faults `time_to_quarantine_secs` is measured over).
    pub fn hardware(self) -> bool {
        matches!(
            self,
            Signal::Xid
                | Signal::EccDbe
                | Signal::GpuLost
                | Signal::RowRemapFailure
                | Signal::LinkFault
                | Signal::Thermal
        )
    }

    /// Whether anything can be seen at all (a person with dashboards, or
    /// nightshift).
    pub fn detectable(self) -> bool {
        self.hardware() || self == Signal::HungJob
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Xid => "xid",
            Signal::EccDbe => "ecc_dbe",
            Signal::GpuLost => "gpu_lost",
            Signal::RowRemapFailure => "row_remap_failure",
            Signal::LinkFault => "link_fault",
            Signal::Thermal => "thermal",
            Signal::HungJob => "hung_job",
            Signal::PersonDrain => "person_drain",
            Signal::None => "none",
        }
    }
}

/// What the fault does to the job on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The job dies at once (its scheduler restarts it).
    Kill,
    /// The job stops advancing until it is requeued.
    Hang,
    /// The job goes on, slower (`slowdown_pct`), while the node is in it.
    Slow,
    /// The job does not notice.
    None,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Kill => "kill",
            Effect::Hang => "hang",
            Effect::Slow => "slow",
            Effect::None => "none",
        }
    }
}

/// What repairs the fault once someone starts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Repair {
    /// A GPU reset.
    Reset,
    /// A node reboot.
    Reboot,
    /// A technician reseats or replaces a part.
    Reseat,
    /// The GPU or board is replaced under RMA.
    Rma,
    /// Nothing to repair: the fault is gone once the job has moved.
    None,
}

impl Repair {
    pub fn as_str(self) -> &'static str {
        match self {
            Repair::Reset => "reset",
            Repair::Reboot => "reboot",
            Repair::Reseat => "reseat",
            Repair::Rma => "rma",
            Repair::None => "none",
        }
    }
}

/// One class of interruption.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultClass {
    pub name: String,
    /// Interruptions of this class over the source's `gpu_days`.
    pub count: f64,
    pub signal: Signal,
    /// The XID, for `signal: xid`.
    #[serde(default)]
    pub xid_code: Option<u32>,
    pub effect: Effect,
    /// For `effect: slow`: the share of the job's speed lost while the
    /// node is in it (default 30).
    #[serde(default)]
    pub slowdown_pct: Option<f64>,
    pub repair: Repair,
    /// How long the repair takes once started (not for `repair: none`).
    #[serde(default)]
    pub repair_secs: Option<u64>,
}

/// A fault mix file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultMix {
    pub version: u32,
    pub name: String,
    /// Where the counts come from.
    pub source: String,
    /// GPU-days the counts were observed over (GPUs × days).
    pub gpu_days: f64,
    pub classes: Vec<FaultClass>,
}

impl FaultClass {
    pub fn slowdown(&self) -> f64 {
        self.slowdown_pct.unwrap_or(30.0) / 100.0
    }

    pub fn repair_ms(&self) -> i64 {
        self.repair_secs.unwrap_or(0) as i64 * 1000
    }
}

impl FaultMix {
    pub fn load(path: &Path) -> Result<FaultMix, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError {
            file: path.into(),
            line: 0,
            column: 0,
            message: format!("cannot read the fault mix: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parse and validate a mix; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<FaultMix, LoadError> {
        let m: FaultMix = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            LoadError { file: path.into(), line, column, message }
        })?;
        let err = |needle: &str, message: String| {
            let (line, column) = nightshift_proto::yaml::locate(text, needle);
            LoadError { file: path.into(), line, column, message }
        };
        if m.version != 1 {
            return Err(err("version", format!("unsupported fault mix version: expected 1, found {}", m.version)));
        }
        if !(m.gpu_days.is_finite() && m.gpu_days > 0.0) {
            return Err(err("gpu_days", format!("gpu_days: expected a number of GPU-days > 0, found {}", m.gpu_days)));
        }
        if m.classes.is_empty() {
            return Err(err("classes", "classes: expected at least one fault class".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in m.classes.iter().enumerate() {
            let at = |key: &str| format!("classes.{i}.{key}");
            let ok_name = !c.name.is_empty()
                && c.name.len() <= 64
                && c.name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == '_');
            if !ok_name {
                return Err(err(
                    &at("name"),
                    format!(
                        "classes.{i}.name: expected 1 to 64 of a-z, 0-9, `-` and `_`, found {:?}",
                        c.name.chars().take(80).collect::<String>()
                    ),
                ));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(err(&at("name"), format!("classes.{i}.name: `{}` is given twice", c.name)));
            }
            if !(c.count.is_finite() && c.count >= 0.0) {
                return Err(err(
                    &at("count"),
                    format!("class `{}`: count: expected a number of interruptions ≥ 0, found {}", c.name, c.count),
                ));
            }
            match (c.signal, c.xid_code) {
                (Signal::Xid, None) => {
                    return Err(err(
                        &at("signal"),
                        format!("class `{}`: signal xid needs xid_code (e.g. 48, 79, 119), found none", c.name),
                    ));
                }
                (s, Some(_)) if s != Signal::Xid => {
                    return Err(err(
                        &at("xid_code"),
                        format!("class `{}`: xid_code is for signal xid, found signal {}", c.name, s.as_str()),
                    ));
                }
                _ => {}
            }
            if let Some(p) = c.slowdown_pct {
                if c.effect != Effect::Slow {
                    return Err(err(
                        &at("slowdown_pct"),
                        format!(
                            "class `{}`: slowdown_pct is for effect slow, found effect {}",
                            c.name,
                            c.effect.as_str()
                        ),
                    ));
                }
                if !(p.is_finite() && p > 0.0 && p <= 100.0) {
                    return Err(err(
                        &at("slowdown_pct"),
                        format!("class `{}`: slowdown_pct: expected more than 0 and at most 100, found {p}", c.name),
                    ));
                }
            }
            match (c.repair, c.repair_secs) {
                (Repair::None, Some(_)) => {
                    return Err(err(
                        &at("repair_secs"),
                        format!("class `{}`: repair none takes no repair_secs (nothing is repaired)", c.name),
                    ));
                }
                (Repair::None, None) => {}
                (_, None) => {
                    return Err(err(
                        &at("repair"),
                        format!("class `{}`: repair needs repair_secs (how long it takes once started)", c.name),
                    ));
                }
                (_, Some(s)) if s == 0 || s > 90 * 86_400 => {
                    return Err(err(
                        &at("repair_secs"),
                        format!("class `{}`: repair_secs: expected 1 to 7776000 (90 days), found {s}", c.name),
                    ));
                }
                _ => {}
            }
            if c.repair != Repair::None && !c.signal.hardware() && c.signal != Signal::PersonDrain {
                return Err(err(
                    &at("repair"),
                    format!(
                        "class `{}`: signal {} leaves nothing on the node to repair: expected repair none, found {}",
                        c.name,
                        c.signal.as_str(),
                        c.repair.as_str()
                    ),
                ));
            }
            if c.signal == Signal::PersonDrain && c.repair == Repair::None {
                return Err(err(
                    &at("repair"),
                    format!(
                        "class `{}`: a person's drain needs repair and repair_secs (how long the work takes)",
                        c.name
                    ),
                ));
            }
        }
        Ok(m)
    }

    /// The expected number of faults of `class` on `gpus` GPUs over `days`.
    pub fn expected(&self, class: &FaultClass, gpus: u64, days: f64) -> f64 {
        class.count * gpus as f64 * days / self.gpu_days
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "version: 1\nname: t\nsource: s\ngpu_days: 100\nclasses:\n  - {name: hbm, count: 3, signal: ecc_dbe, effect: kill, repair: reset, repair_secs: 600}\n";

    #[test]
    fn a_good_mix_loads_and_scales_with_the_fleet() {
        let m = FaultMix::parse(GOOD, Path::new("m.yaml")).unwrap();
        assert_eq!(m.classes.len(), 1);
        // 3 over 100 GPU-days; 50 GPUs for 4 days are 200 GPU-days.
        assert_eq!(m.expected(&m.classes[0], 50, 4.0), 6.0);
    }

    #[test]
    fn bad_values_are_refused_where_they_are() {
        // The exact messages and positions are in the golden folder
        // (`sim/tests/fixtures/faults/invalid`); these are the rules.
        let cases = [
            ("count: 3", "count: -3", "count: expected a number of interruptions ≥ 0, found -3"),
            ("signal: ecc_dbe", "signal: xid", "signal xid needs xid_code"),
            ("repair_secs: 600", "repair_secs: 0", "repair_secs: expected 1 to 7776000"),
            ("name: t\n", "name: t\nfoo: 1\n", "unknown field `foo`"),
            ("signal: ecc_dbe", "signal: none", "signal none leaves nothing on the node to repair"),
        ];
        for (from, to, want) in cases {
            let text = GOOD.replace(from, to);
            let e = FaultMix::parse(&text, Path::new("m.yaml")).unwrap_err().to_string();
            assert!(e.contains(want), "{to}: {e}");
        }
    }
}
