//! The safety envelope: what this node will accept, whatever the engine asks.
//!
//! The envelope is the device's own limits intersected with the node's policy
//! file. Every refusal names the rule, the value and the limit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use nightshift_proto::{ActionKind, FanPoint, GpuInfo};

/// The policy file (`policy.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Always 1.
    pub version: u32,
    #[serde(default)]
    pub power: PowerPolicy,
    #[serde(default)]
    pub fan: FanPolicy,
    #[serde(default)]
    pub clocks: ClockPolicy,
    /// Most changes of one kind per GPU (or per node, for node actions) in a
    /// sliding window.
    #[serde(default = "default_rate_limits")]
    pub rate_limits: BTreeMap<ActionKind, RateLimit>,
    /// When this file exists every mutating op is refused (a person is
    /// working on the node).
    #[serde(default = "default_marker")]
    pub hands_off_marker_path: PathBuf,
    /// Longest lease a hold may have (`revert_after_secs`, `renew`).
    #[serde(default = "default_max_lease")]
    pub max_lease_secs: u64,
    /// The lease of a hold whose request names none.
    #[serde(default = "default_lease")]
    pub default_lease_secs: u64,
    /// The node's BMC, for chassis fans on boards without GPU fans
    /// (`ipmitool` with vendor raw commands, as argument vectors — never a
    /// shell). Absent: chassis fans are not nightshift's to drive.
    #[serde(default)]
    pub bmc: Option<BmcPolicy>,
    /// When a node is fit to go back into service.
    #[serde(default)]
    pub health: HealthPolicy,
    /// What `collect_evidence` runs for an RMA, how long and how much.
    #[serde(default)]
    pub evidence: crate::evidence::EvidencePolicy,
}

/// The BMC commands that drive the chassis fans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcPolicy {
    /// Chassis fans to full speed, e.g. `[ipmitool, raw, 0x30, 0x45, 0x01, 0x01]`.
    pub fans_full_argv: Vec<String>,
    /// Back to the BMC's own fan control, e.g. `[ipmitool, raw, 0x30, 0x45, 0x01, 0x00]`.
    pub fans_auto_argv: Vec<String>,
    #[serde(default = "default_bmc_timeout")]
    pub timeout_secs: u64,
}

fn default_bmc_timeout() -> u64 {
    15
}

/// Health checks: how fresh a passing check must be for nightshift to put
/// the node back into service, and DCGM's diagnostic where installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthPolicy {
    /// A passing check older than this does not count: a resume or a
    /// repair drain's release runs a new one.
    #[serde(default = "default_health_age")]
    pub max_age_secs: u64,
    /// `dcgmi` (DCGM's CLI): `dcgmi diag -r 1 -j` joins the check. Absent:
    /// used when `/usr/bin/dcgmi` exists.
    #[serde(default)]
    pub dcgmi_path: Option<PathBuf>,
    #[serde(default = "default_dcgm_timeout")]
    pub dcgm_timeout_secs: u64,
    /// A drain hold whose lease runs out on an unhealthy node is extended
    /// by this much instead of putting the node back into service.
    #[serde(default = "default_unhealthy_extend")]
    pub unhealthy_extend_secs: u64,
}

fn default_health_age() -> u64 {
    600
}
fn default_dcgm_timeout() -> u64 {
    180
}
fn default_unhealthy_extend() -> u64 {
    900
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            max_age_secs: default_health_age(),
            dcgmi_path: None,
            dcgm_timeout_secs: default_dcgm_timeout(),
            unhealthy_extend_secs: default_unhealthy_extend(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PowerPolicy {
    /// Lowest power limit the agent will set, unless a model rule says
    /// otherwise. The device minimum applies when higher.
    #[serde(default)]
    pub floor_watts: Option<f64>,
    /// Highest power limit the agent will set. The device maximum applies
    /// when lower.
    #[serde(default)]
    pub ceiling_watts: Option<f64>,
    /// Per-model floors and ceilings; `match` is a substring of the GPU name.
    #[serde(default)]
    pub models: Vec<ModelPowerPolicy>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPowerPolicy {
    #[serde(rename = "match")]
    pub name_contains: String,
    #[serde(default)]
    pub floor_watts: Option<f64>,
    #[serde(default)]
    pub ceiling_watts: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FanPolicy {
    /// No point of a curve may ask for less than this.
    #[serde(default = "default_fan_min")]
    pub min_pct: f64,
    #[serde(default = "default_fan_points")]
    pub max_points: usize,
}

impl Default for FanPolicy {
    fn default() -> Self {
        FanPolicy { min_pct: default_fan_min(), max_points: default_fan_points() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ClockPolicy {
    /// Lowest clock the agent will lock a GPU's maximum to.
    #[serde(default)]
    pub min_mhz: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub max_changes: u32,
    pub window_secs: u64,
}

fn default_fan_min() -> f64 {
    30.0
}
fn default_fan_points() -> usize {
    16
}
fn default_marker() -> PathBuf {
    PathBuf::from("/etc/nightshift/hands-off")
}
fn default_max_lease() -> u64 {
    86_400
}
fn default_lease() -> u64 {
    3_600
}

/// The longest lease any policy may allow: 30 days.
pub const MAX_LEASE_SECS: u64 = 30 * 86_400;

/// Rate limits when the policy names none: generous enough for a runbook's
/// ladder, tight enough to stop a loop.
pub fn default_rate_limits() -> BTreeMap<ActionKind, RateLimit> {
    use ActionKind::*;
    [
        (PowerLimit, RateLimit { max_changes: 10, window_secs: 600 }),
        (Fan, RateLimit { max_changes: 10, window_secs: 600 }),
        (Clocks, RateLimit { max_changes: 10, window_secs: 600 }),
        (Ecc, RateLimit { max_changes: 4, window_secs: 3600 }),
        (GpuDrain, RateLimit { max_changes: 6, window_secs: 3600 }),
        (NodeDrain, RateLimit { max_changes: 6, window_secs: 3600 }),
        (FlushCaches, RateLimit { max_changes: 12, window_secs: 3600 }),
        (Config, RateLimit { max_changes: 10, window_secs: 3600 }),
        (ChassisFans, RateLimit { max_changes: 10, window_secs: 600 }),
        (Power, RateLimit { max_changes: 6, window_secs: 3600 }),
        (Mark, RateLimit { max_changes: 12, window_secs: 3600 }),
    ]
    .into_iter()
    .collect()
}

/// An argument vector a policy names: a program and its arguments, no
/// shell, no empty or control-character argument.
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    let Some(prog) = argv.first() else {
        return Err("expected a program and its arguments, found an empty list".into());
    };
    let base = std::path::Path::new(prog).file_name().and_then(|f| f.to_str()).unwrap_or("");
    if matches!(base, "sh" | "bash" | "dash" | "zsh" | "ksh" | "csh" | "fish" | "env") {
        return Err(format!(
            "expected the program itself (e.g. ipmitool), found the shell `{prog}`: nothing runs a shell"
        ));
    }
    if argv.iter().any(|a| a.is_empty() || a.chars().any(char::is_control)) {
        return Err("expected non-empty arguments without control characters".into());
    }
    Ok(())
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 1,
            power: PowerPolicy::default(),
            fan: FanPolicy::default(),
            clocks: ClockPolicy::default(),
            rate_limits: default_rate_limits(),
            hands_off_marker_path: default_marker(),
            max_lease_secs: default_max_lease(),
            default_lease_secs: default_lease(),
            bmc: None,
            health: HealthPolicy::default(),
            evidence: Default::default(),
        }
    }
}

/// A policy file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
}

impl Policy {
    /// Read and validate a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.into(), source })?;
        let mut policy = Policy::parse(&text, path)?;
        // A relative marker path is relative to the policy file.
        if policy.hands_off_marker_path.is_relative()
            && let Some(dir) = path.parent()
        {
            policy.hands_off_marker_path = dir.join(&policy.hands_off_marker_path);
        }
        Ok(policy)
    }

    /// Parse and validate policy text; `path` is used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        let policy: Policy = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            PolicyError::Parse { path: path.into(), line, column, message }
        })?;
        policy.validate().map_err(|(needle, message)| {
            let (line, column) = nightshift_proto::yaml::locate(text, &needle);
            PolicyError::Parse { path: path.into(), line, column, message }
        })?;
        Ok(policy)
    }

    /// Check what serde cannot: ranges, finiteness, floors under ceilings.
    /// An error names the key to point at (`needle`) and what was found.
    fn validate(&self) -> Result<(), (String, String)> {
        let fail = |needle: &str, message: String| Err((needle.to_string(), message));
        if self.version != 1 {
            return fail("version", format!("unsupported policy version: expected 1, found {}", self.version));
        }
        let watts = |v: Option<f64>| v.is_none_or(|w| w.is_finite() && (0.0..=100_000.0).contains(&w));
        if !watts(self.power.floor_watts) || !watts(self.power.ceiling_watts) {
            return fail(
                "power",
                format!(
                    "power: expected floor_watts and ceiling_watts as finite watts from 0 to 100000, found {:?} and {:?}",
                    self.power.floor_watts, self.power.ceiling_watts
                ),
            );
        }
        if let (Some(f), Some(c)) = (self.power.floor_watts, self.power.ceiling_watts)
            && f > c
        {
            return fail("floor_watts", format!("power.floor_watts {f} is above power.ceiling_watts {c}"));
        }
        for m in &self.power.models {
            if m.name_contains.is_empty() {
                return fail(
                    "match",
                    "power.models: `match` must name part of a GPU model, found an empty string".into(),
                );
            }
            if !watts(m.floor_watts) || !watts(m.ceiling_watts) {
                return fail(
                    &m.name_contains,
                    format!(
                        "power.models[{}]: expected floor_watts and ceiling_watts as finite watts from 0 to 100000, found {:?} and {:?}",
                        m.name_contains, m.floor_watts, m.ceiling_watts
                    ),
                );
            }
            // The floor and ceiling that apply to this model, its own or the
            // node-wide ones.
            let floor = m.floor_watts.or(self.power.floor_watts);
            let ceiling = m.ceiling_watts.or(self.power.ceiling_watts);
            if let (Some(f), Some(c)) = (floor, ceiling)
                && f > c
            {
                return fail(
                    &m.name_contains,
                    format!("power.models[{}]: the floor {f} W is above the ceiling {c} W", m.name_contains),
                );
            }
        }
        if !(0.0..=100.0).contains(&self.fan.min_pct) {
            return fail("min_pct", format!("fan.min_pct: expected 0 to 100, found {}", self.fan.min_pct));
        }
        if !(2..=64).contains(&self.fan.max_points) {
            return fail("max_points", format!("fan.max_points: expected 2 to 64, found {}", self.fan.max_points));
        }
        for (kind, r) in &self.rate_limits {
            if r.window_secs == 0 || r.window_secs > MAX_LEASE_SECS || r.max_changes == 0 {
                return fail(
                    kind.as_str(),
                    format!(
                        "rate_limits.{}: expected max_changes ≥ 1 and window_secs 1 to {MAX_LEASE_SECS}, found {} and {}",
                        kind.as_str(),
                        r.max_changes,
                        r.window_secs
                    ),
                );
            }
        }
        if let Some(b) = &self.bmc {
            for (key, argv) in [("fans_full_argv", &b.fans_full_argv), ("fans_auto_argv", &b.fans_auto_argv)] {
                if let Err(m) = check_argv(argv) {
                    return fail(key, format!("bmc.{key}: {m}"));
                }
            }
            if !(1..=600).contains(&b.timeout_secs) {
                return fail("timeout_secs", format!("bmc.timeout_secs: expected 1 to 600, found {}", b.timeout_secs));
            }
        }
        let h = &self.health;
        if !(10..=86_400).contains(&h.max_age_secs) {
            return fail(
                "max_age_secs",
                format!("health.max_age_secs: expected 10 to 86400, found {}", h.max_age_secs),
            );
        }
        if !(60..=MAX_LEASE_SECS).contains(&h.unhealthy_extend_secs) {
            return fail(
                "unhealthy_extend_secs",
                format!(
                    "health.unhealthy_extend_secs: expected 60 to {MAX_LEASE_SECS}, found {}",
                    h.unhealthy_extend_secs
                ),
            );
        }
        if !(1..=3600).contains(&h.dcgm_timeout_secs) {
            return fail(
                "dcgm_timeout_secs",
                format!("health.dcgm_timeout_secs: expected 1 to 3600, found {}", h.dcgm_timeout_secs),
            );
        }
        let ev = &self.evidence;
        if !(1..=600).contains(&ev.timeout_secs) {
            return fail(
                "evidence",
                format!(
                    "evidence.timeout_secs: expected 1 to 600 (each tool; the engine waits 30 minutes for all), found {}",
                    ev.timeout_secs
                ),
            );
        }
        if !(4096..=(16u64 << 30)).contains(&ev.max_bytes) || !(1..=1000).contains(&ev.keep) {
            return fail(
                "evidence",
                format!(
                    "evidence: expected max_bytes from 4096 to 17179869184 (16 GiB) and keep from 1 to 1000, found {} and {}",
                    ev.max_bytes, ev.keep
                ),
            );
        }
        if !(1..=MAX_LEASE_SECS).contains(&self.max_lease_secs) {
            return fail(
                "max_lease_secs",
                format!("max_lease_secs: expected 1 to {MAX_LEASE_SECS} (30 days), found {}", self.max_lease_secs),
            );
        }
        if !(1..=self.max_lease_secs).contains(&self.default_lease_secs) {
            return fail(
                "default_lease_secs",
                format!(
                    "default_lease_secs: expected 1 to max_lease_secs ({}), found {}",
                    self.max_lease_secs, self.default_lease_secs
                ),
            );
        }
        Ok(())
    }

    /// The power range this node accepts for `gpu`: device limits ∩ policy.
    pub fn power_bounds(&self, gpu: &GpuInfo) -> (f64, f64) {
        let mut floor = self.power.floor_watts;
        let mut ceiling = self.power.ceiling_watts;
        for m in &self.power.models {
            if gpu.name.contains(&m.name_contains) {
                floor = m.floor_watts.or(floor);
                ceiling = m.ceiling_watts.or(ceiling);
            }
        }
        let lo = floor.map_or(gpu.power_min_watts, |f| f.max(gpu.power_min_watts));
        let hi = ceiling.map_or(gpu.power_max_watts, |c| c.min(gpu.power_max_watts));
        (lo, hi)
    }

    /// Check a power limit against the envelope.
    pub fn check_power(&self, gpu: &GpuInfo, watts: f64) -> Result<(), String> {
        if !watts.is_finite() {
            return Err(format!("power limit must be a number of watts, found {watts}"));
        }
        let (lo, hi) = self.power_bounds(gpu);
        if watts < lo {
            return Err(format!(
                "power limit {} W is below the floor {} W for GPU {} ({})",
                fmt_num(watts),
                fmt_num(lo),
                gpu.index,
                gpu.name
            ));
        }
        if watts > hi {
            return Err(format!(
                "power limit {} W is above the ceiling {} W for GPU {} ({})",
                fmt_num(watts),
                fmt_num(hi),
                gpu.index,
                gpu.name
            ));
        }
        Ok(())
    }

    /// Check a fan curve: 2..=max points, temperatures strictly increasing,
    /// speeds never decreasing, every speed within min_pct..=100.
    pub fn check_fan_curve(&self, gpu: &GpuInfo, points: &[FanPoint]) -> Result<(), String> {
        let max = self.fan.max_points;
        if points.len() < 2 || points.len() > max {
            return Err(format!("fan curve for GPU {} needs 2 to {max} points, found {}", gpu.index, points.len()));
        }
        for (i, p) in points.iter().enumerate() {
            if !p.temp_c.is_finite() || !(0.0..=120.0).contains(&p.temp_c) {
                return Err(format!("fan curve point {i}: temperature {} °C is outside 0–120 °C", p.temp_c));
            }
            if !p.speed_pct.is_finite() || p.speed_pct < self.fan.min_pct || p.speed_pct > 100.0 {
                return Err(format!(
                    "fan curve point {i}: speed {}% is below the minimum {}% or above 100% for GPU {} ({})",
                    fmt_num(p.speed_pct),
                    fmt_num(self.fan.min_pct),
                    gpu.index,
                    gpu.name
                ));
            }
        }
        for (i, w) in points.windows(2).enumerate() {
            if w[1].temp_c <= w[0].temp_c {
                return Err(format!(
                    "fan curve is not monotonic: point {} temperature {} °C is not above point {i}'s {} °C",
                    i + 1,
                    fmt_num(w[1].temp_c),
                    fmt_num(w[0].temp_c)
                ));
            }
            if w[1].speed_pct < w[0].speed_pct {
                return Err(format!(
                    "fan curve is not monotonic: point {} speed {}% is below point {i}'s {}%",
                    i + 1,
                    fmt_num(w[1].speed_pct),
                    fmt_num(w[0].speed_pct)
                ));
            }
        }
        Ok(())
    }

    /// Check a clock lock against the device range and the policy minimum.
    pub fn check_clocks(&self, gpu: &GpuInfo, min_mhz: u32, max_mhz: u32) -> Result<(), String> {
        if min_mhz > max_mhz {
            return Err(format!("clock range {min_mhz}–{max_mhz} MHz is empty: min_mhz is above max_mhz"));
        }
        if let Some(dev_max) = gpu.clock_max_mhz
            && max_mhz > dev_max
        {
            return Err(format!(
                "clock {max_mhz} MHz is above the device maximum {dev_max} MHz for GPU {} ({})",
                gpu.index, gpu.name
            ));
        }
        let floor = self.clocks.min_mhz.unwrap_or(0).max(gpu.clock_min_mhz.unwrap_or(0));
        if max_mhz < floor {
            return Err(format!(
                "clock {max_mhz} MHz is below the floor {floor} MHz for GPU {} ({})",
                gpu.index, gpu.name
            ));
        }
        Ok(())
    }

    /// Check a lease length.
    pub fn check_lease(&self, secs: u64) -> Result<(), String> {
        if secs == 0 || secs > self.max_lease_secs {
            return Err(format!("lease (revert_after_secs) must be 1 to {} s, found {secs}", self.max_lease_secs));
        }
        Ok(())
    }

    /// Whether the maintenance marker is present.
    pub fn hands_off(&self) -> bool {
        self.hands_off_marker_path.exists()
    }
}

/// Render a number without a needless `.0`.
pub fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v:.1}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> GpuInfo {
        GpuInfo {
            power_min_watts: 200.0,
            power_max_watts: 700.0,
            power_default_watts: 700.0,
            mem_total_mib: 81_559,
            fan_control: false,
            clock_min_mhz: Some(345),
            clock_max_mhz: Some(1980),
            ..GpuInfo::new(0, "NVIDIA H100 80GB HBM3", nightshift_proto::Vendor::Nvidia)
        }
    }

    fn policy() -> Policy {
        Policy::parse(
            "version: 1\npower:\n  floor_watts: 300\n  models:\n    - match: H100\n      floor_watts: 350\nfan:\n  min_pct: 30\n",
            Path::new("policy.yaml"),
        )
        .unwrap()
    }

    /// The shipped example loads, its evidence limits included; limits out
    /// of range are refused where they are.
    #[test]
    fn the_example_policy_loads_and_evidence_limits_are_checked() {
        let text = include_str!("../../examples/policy.yaml");
        let p = Policy::parse(text, Path::new("examples/policy.yaml")).unwrap();
        assert_eq!((p.evidence.timeout_secs, p.evidence.keep), (300, 20));
        for (extra, want) in [
            ("evidence: {timeout_secs: 0}\n", "evidence.timeout_secs: expected 1 to 600"),
            ("evidence: {timeout_secs: 3600}\n", "found 3600"),
            ("evidence: {max_bytes: 10}\n", "expected max_bytes from 4096"),
            ("evidence: {keep: 0}\n", "keep from 1 to 1000"),
            ("evidence: {timeout: 5}\n", "unknown field `timeout`"),
        ] {
            let e = Policy::parse(&format!("version: 1\n{extra}"), Path::new("policy.yaml")).unwrap_err().to_string();
            assert!(e.starts_with("policy.yaml:2:") && e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn power_values_are_checked_against_device_and_policy() {
        let p = policy();
        let g = h100();
        let cases: &[(f64, Option<&str>)] = &[
            (90.0, Some("power limit 90 W is below the floor 350 W for GPU 0 (NVIDIA H100 80GB HBM3)")),
            (349.5, Some("power limit 349.5 W is below the floor 350 W")),
            (350.0, None),
            (700.0, None),
            (701.0, Some("power limit 701 W is above the ceiling 700 W for GPU 0")),
            (f64::NAN, Some("power limit must be a number of watts")),
        ];
        for (w, want) in cases {
            match (p.check_power(&g, *w), want) {
                (Ok(()), None) => {}
                (Err(e), Some(needle)) => assert!(e.contains(needle), "{w}: {e}"),
                (got, want) => panic!("{w}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn fan_curves_must_be_monotonic_and_above_the_minimum() {
        let p = policy();
        let g = h100();
        let pt = |t, s| FanPoint { temp_c: t, speed_pct: s };
        let cases: Vec<(Vec<FanPoint>, Option<&str>)> = vec![
            (vec![pt(40.0, 30.0), pt(80.0, 100.0)], None),
            (vec![pt(40.0, 20.0), pt(80.0, 100.0)], Some("point 0: speed 20% is below the minimum 30%")),
            (vec![pt(40.0, 60.0), pt(80.0, 50.0)], Some("point 1 speed 50% is below point 0's 60%")),
            (vec![pt(60.0, 40.0), pt(60.0, 50.0)], Some("point 1 temperature 60 °C is not above point 0's 60 °C")),
            (vec![pt(60.0, 40.0)], Some("needs 2 to 16 points, found 1")),
            (vec![pt(40.0, 40.0), pt(80.0, 101.0)], Some("above 100%")),
        ];
        for (points, want) in cases {
            match (p.check_fan_curve(&g, &points), want) {
                (Ok(()), None) => {}
                (Err(e), Some(needle)) => assert!(e.contains(needle), "{points:?}: {e}"),
                (got, want) => panic!("{points:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn clocks_are_checked() {
        let p = policy();
        assert!(p.check_clocks(&h100(), 300, 1500).is_ok());
        assert!(p.check_clocks(&h100(), 1500, 300).unwrap_err().contains("min_mhz is above max_mhz"));
        assert!(p.check_clocks(&h100(), 300, 2500).unwrap_err().contains("above the device maximum 1980 MHz"));
        assert!(p.check_clocks(&h100(), 100, 200).unwrap_err().contains("below the floor 345 MHz"));
    }

    #[test]
    fn bad_policy_files_say_where() {
        let err = Policy::parse("version: 1\npower:\n  floor_wats: 3\n", Path::new("p.yaml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("p.yaml:3:3: power: unknown field `floor_wats`"), "{msg}");
        let cases = [
            ("version: 2\n", "p.yaml:1:1: unsupported policy version: expected 1, found 2"),
            (
                "version: 1\npower: {floor_watts: 500, ceiling_watts: 400}\n",
                "p.yaml:2:9: power.floor_watts 500 is above power.ceiling_watts 400",
            ),
            // Values that would quietly weaken the envelope.
            (
                "version: 1\npower:\n  floor_watts: .nan\n",
                "p.yaml:2:1: power: expected floor_watts and ceiling_watts as finite watts from 0 to 100000, found Some(NaN) and None",
            ),
            (
                "version: 1\npower:\n  floor_watts: 300\n  models:\n    - {match: H100, ceiling_watts: 250}\n",
                "p.yaml:5:15: power.models[H100]: the floor 300 W is above the ceiling 250 W",
            ),
            (
                "version: 1\npower:\n  models:\n    - {match: MI300X, floor_watts: 800, ceiling_watts: 600}\n",
                "p.yaml:4:15: power.models[MI300X]: the floor 800 W is above the ceiling 600 W",
            ),
            (
                "version: 1\nmax_lease_secs: 18446744073709551615\n",
                "p.yaml:2:1: max_lease_secs: expected 1 to 2592000 (30 days), found 18446744073709551615",
            ),
            (
                "version: 1\nrate_limits:\n  power_limit: {max_changes: 0, window_secs: 600}\n",
                "p.yaml:3:3: rate_limits.power_limit: expected max_changes ≥ 1 and window_secs 1 to 2592000, found 0 and 600",
            ),
            ("version: 1\nfan: {min_pct: .nan}\n", "p.yaml:2:7: fan.min_pct: expected 0 to 100, found NaN"),
        ];
        for (text, want) in cases {
            assert_eq!(Policy::parse(text, Path::new("p.yaml")).unwrap_err().to_string(), want, "{text}");
        }
    }
}
