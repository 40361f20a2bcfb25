//! What each mutating op means, op by op: a hold to place (with the
//! envelope check of its value), holds to release, or a one-shot action.
//! The pipeline that carries these out (journal, hands-off, leases, rate
//! limits, dry runs) is in `service/mod.rs`; device reads and writes per
//! setting are in `service/settings.rs`.

use nightshift_proto::owner::{OWNER_PREFIX, owned_by_nightshift};
use nightshift_proto::*;

use super::{Agent, Refusal, backend_refusal, node_refusal};

/// A hold to place.
pub(super) struct Placement {
    pub setting: Setting,
    pub value: HoldValue,
    /// Why, in the caller's words.
    pub reason: String,
    /// No lease (node drains for RMA or repair only).
    pub sticky: bool,
    /// A sticky drain for a repair: its owner may release it after a
    /// passing health check.
    pub repair: bool,
    /// The rate-limit family a device change counts against.
    pub kind: ActionKind,
    /// A config apply: the new content (a new version).
    pub content: Option<ConfigApplyArgs>,
}

/// A change that is not a setting: it happens once and has nothing to
/// restore.
pub(super) enum OneShot {
    ClearEcc { gpu: u32 },
    Flush(FlushCachesArgs),
    ConfigMark(ConfigMarkArgs),
    Requeue(RequeueArgs),
    Power(PowerNodeArgs),
}

/// What a mutating request asks for.
pub(super) enum Intent {
    Place(Placement),
    /// Release these holds (by id).
    Release(Vec<String>),
    /// Nothing to do; the text says why.
    Unchanged(HoldValue, String),
    /// The device does not offer this (a fanless board's fan).
    NotApplicable(String),
    OneShot(OneShot),
}

/// The scheduler's reason for a person's drain: `drained by <who>: <why>`,
/// control characters blanked, at most 200 characters — never with
/// nightshift's owner prefix (`proto::owner`), whatever the person is
/// called, so it reads as the person's own.
fn person_drain_reason(owner: &str, why: &str) -> String {
    let clean = |s: &str| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
    let who = owner.strip_prefix("person:").unwrap_or(owner);
    let mut r = format!("drained by {}: {}", clean(who), clean(why.trim()));
    r.truncate(r.char_indices().nth(200).map_or(r.len(), |(i, _)| i));
    r
}

fn envelope(m: String) -> Refusal {
    (ErrorCode::OutOfEnvelope, m)
}

impl Agent {
    /// `nightshift: <run> <why>`, control characters blanked, at most 200
    /// characters.
    pub(super) fn drain_reason(&self, run: &str, why: &str) -> String {
        let clean = |s: &str| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
        let mut r = format!("{OWNER_PREFIX} {} {}", clean(run), clean(why.trim()));
        r.truncate(r.char_indices().nth(200).map_or(r.len(), |(i, _)| i));
        r
    }

    /// The intent of a mutating `op` sent by `owner`.
    pub(super) async fn intent(&self, op: &Op, owner: &str) -> Result<Intent, Refusal> {
        let policy = &self.opts.policy;
        let place = |setting, value, reason: String, kind| {
            Intent::Place(Placement { setting, value, reason, sticky: false, repair: false, kind, content: None })
        };
        Ok(match op {
            Op::SetPowerLimit(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                policy.check_power(&info, a.watts).map_err(envelope)?;
                place(
                    Setting::PowerLimit { gpu: a.gpu },
                    HoldValue::PowerLimit { watts: a.watts },
                    format!("power limit {} W", crate::envelope::fmt_num(a.watts)),
                    ActionKind::PowerLimit,
                )
            }
            Op::SetFanCurve(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                if !info.fan_control {
                    return Ok(Intent::NotApplicable(format!(
                        "GPU {} ({}) has no controllable fan: fan curves do not apply",
                        a.gpu, info.name
                    )));
                }
                policy.check_fan_curve(&info, &a.points).map_err(envelope)?;
                place(
                    Setting::FanCurve { gpu: a.gpu },
                    HoldValue::FanCurve { points: Some(a.points.clone()) },
                    "fan curve".into(),
                    ActionKind::Fan,
                )
            }
            Op::ResetFan(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                if !info.fan_control {
                    return Ok(Intent::NotApplicable(format!("GPU {} ({}) has no controllable fan", a.gpu, info.name)));
                }
                self.release_own(Setting::FanCurve { gpu: a.gpu }, owner, HoldValue::FanCurve { points: None })
            }
            Op::SetClocks(a) => {
                let info = self.backend.gpu(a.gpu).map_err(backend_refusal)?.clone();
                policy.check_clocks(&info, a.min_mhz, a.max_mhz).map_err(envelope)?;
                place(
                    Setting::Clocks { gpu: a.gpu },
                    HoldValue::Clocks { locked_mhz: Some((a.min_mhz, a.max_mhz)) },
                    format!("clocks {}–{} MHz", a.min_mhz, a.max_mhz),
                    ActionKind::Clocks,
                )
            }
            Op::ResetClocks(a) => {
                self.backend.gpu(a.gpu).map_err(backend_refusal)?;
                self.release_own(Setting::Clocks { gpu: a.gpu }, owner, HoldValue::Clocks { locked_mhz: None })
            }
            Op::ClearEcc(a) => {
                self.backend.gpu(a.gpu).map_err(backend_refusal)?;
                Intent::OneShot(OneShot::ClearEcc { gpu: a.gpu })
            }
            Op::SetGpuDrain(a) => {
                self.backend.gpu(a.gpu).map_err(backend_refusal)?;
                let setting = Setting::GpuDrain { gpu: a.gpu };
                let own_drain = self
                    .holds()
                    .hold_of(&setting, owner)
                    .is_some_and(|h| h.value == HoldValue::GpuDrain { drained: true });
                if a.sticky && !a.drained {
                    return Err((
                        ErrorCode::BadRequest,
                        "a sticky GPU drain takes the GPU out: expected drained: true, found false".into(),
                    ));
                }
                if !a.drained && own_drain {
                    self.release_own(setting, owner, HoldValue::GpuDrain { drained: false })
                } else if a.sticky {
                    Intent::Place(Placement {
                        setting,
                        value: HoldValue::GpuDrain { drained: true },
                        reason: if a.repair {
                            "GPU drain for a repair".into()
                        } else {
                            "GPU drain until a person ends it".into()
                        },
                        sticky: true,
                        repair: a.repair,
                        kind: ActionKind::GpuDrain,
                        content: None,
                    })
                } else {
                    place(
                        setting,
                        HoldValue::GpuDrain { drained: a.drained },
                        if a.drained { "GPU drain".into() } else { "GPU in service".into() },
                        ActionKind::GpuDrain,
                    )
                }
            }
            Op::Drain(a) => {
                let run = a.run.as_deref().unwrap_or(owner);
                // A person's drain is theirs: the scheduler's reason names
                // them, not nightshift (so nothing of nightshift's ever
                // undoes it, nor counts it in its blast radius), and it has
                // no lease — a person ends it.
                let by_person = owner.starts_with("person:");
                let drain_reason =
                    if by_person { person_drain_reason(owner, &a.reason) } else { self.drain_reason(run, &a.reason) };
                Intent::Place(Placement {
                    setting: Setting::NodeDrain {},
                    value: HoldValue::NodeDrain { drained: true, reason: Some(drain_reason) },
                    reason: a.reason.trim().chars().take(200).collect(),
                    sticky: a.sticky || by_person,
                    repair: a.sticky && a.repair,
                    kind: ActionKind::NodeDrain,
                    content: None,
                })
            }
            Op::Resume(_) => {
                let setting = Setting::NodeDrain {};
                let own_drain = self
                    .holds()
                    .hold_of(&setting, owner)
                    .is_some_and(|h| matches!(h.value, HoldValue::NodeDrain { drained: true, .. }));
                if own_drain && !owner.starts_with("person:") {
                    return Ok(self.release_own(setting, owner, HoldValue::NodeDrain { drained: false, reason: None }));
                }
                // Other runs' drains (not a person's, not a sticky one for
                // RMA or repair): resuming undoes what nightshift did. A
                // person resuming ends every drain, sticky and other
                // people's too: it is their call.
                let by_person = owner.starts_with("person:");
                let others: Vec<String> = self
                    .holds()
                    .get(&setting)
                    .map(|h| {
                        h.holds
                            .iter()
                            .filter(|x| {
                                matches!(x.value, HoldValue::NodeDrain { drained: true, .. })
                                    && (by_person || (!x.sticky() && !x.owner.starts_with("person:")))
                            })
                            .map(|x| x.id.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                if !others.is_empty() {
                    return Ok(Intent::Release(others));
                }
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                if !st.drained {
                    return Ok(Intent::Unchanged(
                        HoldValue::NodeDrain { drained: false, reason: None },
                        "node is not drained".into(),
                    ));
                }
                place(
                    setting,
                    HoldValue::NodeDrain { drained: false, reason: None },
                    "in service".into(),
                    ActionKind::NodeDrain,
                )
            }
            Op::FlushCaches(a) => Intent::OneShot(OneShot::Flush(a.clone())),
            Op::Requeue(a) => Intent::OneShot(OneShot::Requeue(a.clone())),
            Op::ConfigApply(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                let next = h.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
                if self.configs.is_current(&h, &a.content) {
                    return Ok(Intent::Unchanged(
                        HoldValue::Config { version: h.current },
                        format!("`{}` already has this content", a.name),
                    ));
                }
                Intent::Place(Placement {
                    setting: Setting::Config { name: a.name.clone() },
                    value: HoldValue::Config { version: Some(next) },
                    reason: a.note.clone().unwrap_or_else(|| format!("new version of {}", a.name)),
                    sticky: false,
                    repair: false,
                    kind: ActionKind::Config,
                    content: Some(a.clone()),
                })
            }
            Op::ConfigRollback(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                let target = self.configs.rollback_target(&h, a.to_version).map_err(node_refusal)?;
                place(
                    Setting::Config { name: a.name.clone() },
                    HoldValue::Config { version: Some(target) },
                    format!("roll back to version {target}"),
                    ActionKind::Config,
                )
            }
            Op::ConfigMark(a) => {
                let h = self.configs.history(&a.name, self.clock.now_ms()).map_err(node_refusal)?;
                self.configs.rollback_target(&h, Some(a.version)).map_err(node_refusal)?;
                Intent::OneShot(OneShot::ConfigMark(a.clone()))
            }
            Op::SetChassisFans(a) => {
                if policy.bmc.is_none() && self.backend.chassis_fans_full().is_none() {
                    return Ok(Intent::NotApplicable(format!(
                        "{} has no chassis fan control nightshift may drive (no `bmc` commands in its policy): \
                         a person must check the chassis fans",
                        self.opts.node
                    )));
                }
                if !a.full {
                    return Ok(self.release_own(
                        Setting::ChassisFans {},
                        owner,
                        HoldValue::ChassisFans { full: false },
                    ));
                }
                place(
                    Setting::ChassisFans {},
                    HoldValue::ChassisFans { full: true },
                    "chassis fans at full speed".into(),
                    ActionKind::ChassisFans,
                )
            }
            Op::Mark(a) => {
                let setting = Setting::Mark { mark: a.mark };
                if !a.set {
                    return Ok(self.release_own(setting, owner, HoldValue::Mark { set: false }));
                }
                if self.scheduler.mark_argv(a.mark, true, "", 1).is_none() {
                    return Ok(Intent::NotApplicable(format!(
                        "the {} scheduler has no {} mark (on Slurm a drain is the quarantine)",
                        self.scheduler.kind(),
                        a.mark.as_str()
                    )));
                }
                place(
                    setting,
                    HoldValue::Mark { set: true },
                    a.reason.clone().unwrap_or_else(|| a.mark.as_str().to_string()).chars().take(200).collect(),
                    ActionKind::Mark,
                )
            }
            Op::PowerNode(a) => {
                if !crate::node::scheduler::valid_node_name(&a.node) {
                    return Err((
                        ErrorCode::BadRequest,
                        format!("power_node: node name {:?}: expected letters, digits, `-`, `_` or `.`", a.node),
                    ));
                }
                if self.scheduler.power_argv(&a.node, a.up).is_none() && self.backend.sim().is_none() {
                    return Ok(Intent::NotApplicable(format!(
                        "the {} scheduler has no power saving: use the autoscaler webhook",
                        self.scheduler.kind()
                    )));
                }
                Intent::OneShot(OneShot::Power(a.clone()))
            }
            other => return Err((ErrorCode::Internal, format!("{} is not a hold or an action", other.name()))),
        })
    }

    /// Release `owner`'s hold on `setting`, or say there is none.
    fn release_own(&self, setting: Setting, owner: &str, unheld: HoldValue) -> Intent {
        let store = self.holds();
        match store.hold_of(&setting, owner) {
            Some(h) => Intent::Release(vec![h.id.clone()]),
            None => {
                let others = store.get(&setting).map_or(0, |h| h.holds.len());
                let now = store.get(&setting).map(|h| h.effective()).unwrap_or(unheld);
                Intent::Unchanged(
                    now,
                    if others == 0 {
                        format!("{setting} is not held: nothing to release")
                    } else {
                        format!("{owner} holds no {setting}; {others} hold(s) of others stay in effect")
                    },
                )
            }
        }
    }

    /// Whether a hold putting the node in service may be placed over
    /// `baseline`: never over a person's drain.
    pub(super) fn check_in_service(&self, baseline: &HoldValue) -> Result<(), Refusal> {
        if let HoldValue::NodeDrain { drained: true, reason } = baseline
            && !owned_by_nightshift(reason.as_deref())
        {
            return Err((
                ErrorCode::NotOwner,
                format!(
                    "node {} was drained by someone else (reason: {:?}); nightshift only resumes nodes it drained",
                    self.opts.node,
                    reason.as_deref().unwrap_or("")
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::person_drain_reason;
    use nightshift_proto::owner::owned_by_nightshift;

    #[test]
    fn a_persons_drain_reason_names_them_and_is_never_nightshifts() {
        let cases = [
            ("person:alice", "firmware update", "drained by alice: firmware update"),
            ("person:nightshift", "a person called nightshift", "drained by nightshift: a person called nightshift"),
            ("person:bob", "  line\nbreak\t ", "drained by bob: line break"),
        ];
        for (owner, why, want) in cases {
            let r = person_drain_reason(owner, why);
            assert_eq!(r, want);
            assert!(!owned_by_nightshift(Some(&r)), "{r}");
        }
        assert_eq!(person_drain_reason("person:carol", &"x".repeat(500)).chars().count(), 200);
    }
}
