//! Holds: every setting nightshift changes is held by an owner (a run or a
//! person), with a lease, and the agent applies the most restrictive of the
//! active holds. When the last hold on a setting goes, the agent restores
//! the baseline it read from the device when the first was placed — unless
//! a person changed the setting meanwhile (`drifted`: left alone, reported).
//!
//! Types only; the rules live in the agent (`nightshift_agent::holds`).

use serde::{Deserialize, Serialize};

use super::FanPoint;

/// A setting that can be held. GPU settings name their GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Setting {
    PowerLimit {
        gpu: u32,
    },
    FanCurve {
        gpu: u32,
    },
    Clocks {
        gpu: u32,
    },
    GpuDrain {
        gpu: u32,
    },
    NodeDrain {},
    Config {
        name: String,
    },
    /// The node's chassis fans (through the BMC).
    ChassisFans {},
    /// A scheduler mark on the node (`no_pack`, `quarantine`).
    Mark {
        mark: super::MarkKind,
    },
}

impl Setting {
    /// The setting's kind as a word (`power_limit`, `node_drain`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Setting::PowerLimit { .. } => "power_limit",
            Setting::FanCurve { .. } => "fan_curve",
            Setting::Clocks { .. } => "clocks",
            Setting::GpuDrain { .. } => "gpu_drain",
            Setting::NodeDrain {} => "node_drain",
            Setting::Config { .. } => "config",
            Setting::ChassisFans {} => "chassis_fans",
            Setting::Mark { .. } => "mark",
        }
    }

    /// The GPU a GPU setting is about.
    pub fn gpu(&self) -> Option<u32> {
        match self {
            Setting::PowerLimit { gpu }
            | Setting::FanCurve { gpu }
            | Setting::Clocks { gpu }
            | Setting::GpuDrain { gpu } => Some(*gpu),
            _ => None,
        }
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Config { name } => write!(f, "config {name}"),
            Setting::NodeDrain {} => f.write_str("node drain"),
            Setting::ChassisFans {} => f.write_str("chassis fans"),
            Setting::Mark { mark } => write!(f, "mark {}", mark.as_str()),
            s => write!(f, "GPU {} {}", s.gpu().unwrap_or(0), s.kind().replace('_', " ")),
        }
    }
}

/// A held (or baseline) value of a setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HoldValue {
    PowerLimit {
        watts: f64,
    },
    /// `None`: the firmware's own control (no curve).
    FanCurve {
        #[serde(default)]
        points: Option<Vec<FanPoint>>,
    },
    /// `None`: clocks not locked.
    Clocks {
        #[serde(default)]
        locked_mhz: Option<(u32, u32)>,
    },
    GpuDrain {
        drained: bool,
    },
    NodeDrain {
        drained: bool,
        #[serde(default)]
        reason: Option<String>,
    },
    Config {
        #[serde(default)]
        version: Option<u32>,
    },
    /// `full: false`: the BMC's own fan control.
    ChassisFans {
        full: bool,
    },
    Mark {
        set: bool,
    },
}

impl std::fmt::Display for HoldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldValue::PowerLimit { watts } => write!(f, "{} W", trim(*watts)),
            HoldValue::FanCurve { points: None } => f.write_str("firmware fan control"),
            HoldValue::FanCurve { points: Some(p) } => write!(
                f,
                "fan curve {}",
                p.iter().map(|p| format!("{}°C→{}%", trim(p.temp_c), trim(p.speed_pct))).collect::<Vec<_>>().join(" ")
            ),
            HoldValue::Clocks { locked_mhz: None } => f.write_str("clocks unlocked"),
            HoldValue::Clocks { locked_mhz: Some((a, b)) } => write!(f, "clocks {a}–{b} MHz"),
            HoldValue::GpuDrain { drained } => f.write_str(if *drained { "GPU drained" } else { "GPU in service" }),
            HoldValue::NodeDrain { drained: true, reason } => {
                write!(f, "node drained ({})", reason.as_deref().unwrap_or("no reason"))
            }
            HoldValue::NodeDrain { drained: false, .. } => f.write_str("node in service"),
            HoldValue::Config { version: Some(v) } => write!(f, "version {v}"),
            HoldValue::Config { version: None } => f.write_str("no version"),
            HoldValue::ChassisFans { full: true } => f.write_str("chassis fans at full speed"),
            HoldValue::ChassisFans { full: false } => f.write_str("chassis fans on BMC control"),
            HoldValue::Mark { set } => f.write_str(if *set { "marked" } else { "not marked" }),
        }
    }
}

impl HoldValue {
    /// The value as the device state it stands for, in the shape before and
    /// after states have on the wire: `{"power_limit_watts": 450}`,
    /// `{"fan_curve": [...]}`, `{"clocks_locked_mhz": [lo, hi]}`,
    /// `{"gpu_drained": true}`, `{"drained": true, "reason": "…"}`,
    /// `{"name": "nccl-env", "current_version": 3}`.
    pub fn device_view(&self, setting: &Setting) -> serde_json::Value {
        use serde_json::json;
        match self {
            HoldValue::PowerLimit { watts } => json!({"power_limit_watts": watts}),
            HoldValue::FanCurve { points } => json!({"fan_curve": points}),
            HoldValue::Clocks { locked_mhz } => json!({"clocks_locked_mhz": locked_mhz.map(|(a, b)| [a, b])}),
            HoldValue::GpuDrain { drained } => json!({"gpu_drained": drained}),
            HoldValue::NodeDrain { drained, reason } => json!({"drained": drained, "reason": reason}),
            HoldValue::ChassisFans { full } => json!({"chassis_fans_full": full}),
            HoldValue::Mark { set } => {
                let mark = match setting {
                    Setting::Mark { mark } => mark.as_str(),
                    _ => "",
                };
                json!({"mark": mark, "set": set})
            }
            HoldValue::Config { version } => {
                let name = match setting {
                    Setting::Config { name } => name.as_str(),
                    _ => "",
                };
                json!({"name": name, "current_version": version})
            }
        }
    }
}

fn trim(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v:.1}") }
}

/// One hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HoldInfo {
    /// The id of the request that placed it.
    pub id: String,
    /// A run id, `person:<name>`, or `manual`.
    pub owner: String,
    pub setting: Setting,
    pub value: HoldValue,
    pub reason: String,
    pub placed_at_ms: i64,
    /// `None` only for sticky holds (a node drain for RMA or repair).
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    /// Outlives its run (renewed with `keep`); released by a lease, a later
    /// run or a person.
    #[serde(default)]
    pub kept: bool,
    /// A sticky node drain for a repair (not an RMA): its owner may release
    /// it once the agent's own health check passed after it was placed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
}

impl HoldInfo {
    /// Whether the hold has no lease (only a person releases it).
    pub fn sticky(&self) -> bool {
        self.expires_at_ms.is_none()
    }
}

/// A held setting as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SettingView {
    pub setting: Setting,
    /// What the device had when the first hold was placed.
    pub baseline: HoldValue,
    /// What the holds ask for together (the most restrictive).
    pub effective: HoldValue,
    /// A person changed the setting since the agent applied it; the agent
    /// leaves it alone. The text says what was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drifted: Option<String>,
    pub holds: Vec<HoldInfo>,
    /// The last time the agent found the setting back at its baseline
    /// while held (a GPU reset, a reboot, a driver reload) and applied the
    /// held value again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reapplied: Option<Reapplied>,
}

/// A held setting found at its default and applied again, in telemetry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReappliedSetting {
    pub setting: Setting,
    pub reapplied: Reapplied,
    /// The owners of the holds on it (a run id, `person:…`).
    pub owners: Vec<String>,
}

/// A held setting not in force, in telemetry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftedSetting {
    pub setting: Setting,
    pub why: String,
    pub owners: Vec<String>,
}

/// A held setting found at its default and applied again (invariant 16:
/// a hold is what the device does).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Reapplied {
    pub at_ms: i64,
    /// What the device had (its default).
    pub found: HoldValue,
    /// What the agent put back (what the holds ask for).
    pub applied: HoldValue,
}

/// `release`: by hold id, or every hold of an owner.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// With `owner`: also the holds it kept past its run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_kept: bool,
}

/// `renew`: a new lease for a hold, or for every hold of an owner; `keep`
/// marks them to outlive the run that placed them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub lease_secs: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
}

/// What became of one setting when holds on it went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreOutcome {
    /// The last hold went; the baseline is back on the device.
    Restored,
    /// A person changed the setting; the agent left it as it was.
    Drifted,
    /// Other holds remain; their value is in effect.
    StillHeld,
    /// The baseline is a config version marked bad: the held version stays.
    KeptBadBaseline,
    /// The maintenance marker exists: the restore waits until it is gone.
    Deferred,
    /// Putting the baseline back failed (the detail says why).
    Failed,
}

/// One setting's line in a release (or expiry) report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingRelease {
    pub setting: Setting,
    pub outcome: RestoreOutcome,
    /// What is on the device now (or would be, when deferred).
    pub now: HoldValue,
    pub detail: String,
}

/// The result of `release` (and of lease expiry, in the journal).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseResult {
    /// Ids of the holds released.
    pub released: Vec<String>,
    pub settings: Vec<SettingRelease>,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldEnd {
    /// Its owner (or a person) released it.
    Released,
    /// Its lease ran out on the agent's clock.
    Expired,
    /// A person changed the setting by hand; the hold ended with it.
    TakenOver,
    /// The config version it asked for was marked bad.
    Superseded,
}

impl HoldEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldEnd::Released => "released",
            HoldEnd::Expired => "expired",
            HoldEnd::TakenOver => "taken_over",
            HoldEnd::Superseded => "superseded",
        }
    }
}

/// A hold that ended, as the agent tells it. Telemetry carries the recent
/// ones, so the engine audits ends it did not ask for (expiries, a
/// person's release, a hand edit) as well as its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndedHold {
    pub hold: HoldInfo,
    pub ended_at_ms: i64,
    pub how: HoldEnd,
    /// Who released it (the request's owner); empty for an expiry.
    #[serde(default)]
    pub by: String,
    /// What became of the setting.
    pub outcome: RestoreOutcome,
    /// What is on the device now.
    pub now: HoldValue,
}
