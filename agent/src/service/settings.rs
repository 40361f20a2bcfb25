//! Each held setting's two device operations, side by side: **read** (the
//! baseline when the first hold is placed, and the read-back that tells a
//! person's change from the agent's own) and **write** (put a value on the
//! device).
//!
//! Fan curves and clock locks cannot be read back from the device (NVML
//! reports speeds and clocks, not who set them), so drift is not detected
//! for them: their restore is always applied.

use serde_json::json;

use nightshift_proto::{ConfigApplyArgs, HoldValue, Setting};

use super::{Agent, Refusal, backend_refusal, node_refusal};

impl Agent {
    /// The device's current value of `s`, or `None` where it cannot be read
    /// (fan curves, clock locks).
    pub(super) async fn read_setting(&self, s: &Setting) -> Result<Option<HoldValue>, Refusal> {
        Ok(match s {
            Setting::PowerLimit { gpu } => {
                Some(HoldValue::PowerLimit { watts: self.gpu_sample(*gpu)?.power_limit_watts })
            }
            Setting::GpuDrain { gpu } => Some(HoldValue::GpuDrain { drained: self.gpu_sample(*gpu)?.gpu_drained }),
            Setting::NodeDrain {} => {
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                Some(HoldValue::NodeDrain { drained: st.drained, reason: st.reason })
            }
            Setting::Config { name } => {
                // What is in the file, not what the history says: a person
                // may have edited it by hand.
                let h = self.configs.history(name, self.clock.now_ms()).map_err(node_refusal)?;
                Some(HoldValue::Config { version: self.configs.version_on_disk(&h) })
            }
            Setting::ChassisFans {} => self.backend.chassis_fans_full().map(|full| HoldValue::ChassisFans { full }),
            Setting::Mark { mark } => {
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                Some(HoldValue::Mark {
                    set: match mark {
                        nightshift_proto::MarkKind::NoPack => st.no_pack,
                        nightshift_proto::MarkKind::Quarantine => st.quarantine,
                    },
                })
            }
            Setting::FanCurve { .. } | Setting::Clocks { .. } => None,
        })
    }

    /// Whether `baseline` may be put back on `s`: a value the device itself
    /// could have had. A baseline comes from the state log; one crafted or
    /// damaged there (a power limit past the device's range, or under the
    /// policy's floor and not the device's own default) is refused, never
    /// written.
    pub(super) fn baseline_allowed(&self, s: &Setting, baseline: &HoldValue) -> Result<(), String> {
        if let (Setting::PowerLimit { gpu }, HoldValue::PowerLimit { watts }) = (s, baseline) {
            let info = self.backend.gpu(*gpu).map_err(|e| e.to_string())?;
            let in_range = watts.is_finite() && *watts >= info.power_min_watts && *watts <= info.power_max_watts;
            let is_default = (watts - info.power_default_watts).abs() < 0.5;
            if !in_range || (!is_default && self.opts.policy.check_power(info, *watts).is_err()) {
                return Err(format!(
                    "expected a power limit within {}–{} W for GPU {gpu} ({}) and the policy's envelope, or its \
                     default {} W, found {}",
                    crate::envelope::fmt_num(info.power_min_watts),
                    crate::envelope::fmt_num(info.power_max_watts),
                    info.name,
                    crate::envelope::fmt_num(info.power_default_watts),
                    crate::envelope::fmt_num(*watts)
                ));
            }
        }
        Ok(())
    }

    /// Whether the holds' value `v` on `s` is inside the envelope now (the
    /// policy may have changed since it was placed).
    pub(super) fn held_value_allowed(&self, s: &Setting, v: &HoldValue) -> Result<(), String> {
        if let (Setting::PowerLimit { gpu }, HoldValue::PowerLimit { watts }) = (s, v) {
            let info = self.backend.gpu(*gpu).map_err(|e| e.to_string())?;
            self.opts.policy.check_power(info, *watts)?;
        }
        Ok(())
    }

    /// The value `s` has when nothing of nightshift's holds it: read from
    /// the device, or the firmware's own control for fans and clocks.
    pub(super) async fn baseline_of(&self, s: &Setting) -> Result<HoldValue, Refusal> {
        Ok(match s {
            Setting::FanCurve { gpu } => {
                self.backend.gpu(*gpu).map_err(backend_refusal)?;
                HoldValue::FanCurve { points: None }
            }
            Setting::Clocks { gpu } => {
                self.backend.gpu(*gpu).map_err(backend_refusal)?;
                HoldValue::Clocks { locked_mhz: None }
            }
            // A BMC cannot be asked what it runs: its own control.
            Setting::ChassisFans {} => {
                HoldValue::ChassisFans { full: self.backend.chassis_fans_full().unwrap_or(false) }
            }
            Setting::Config { name } => {
                // A file changed by hand becomes a recorded version first,
                // so it can be restored (or marked bad and never restored).
                let h = self.configs.adopt_disk(name, self.clock.now_ms()).map_err(node_refusal)?;
                HoldValue::Config { version: h.current }
            }
            other => match self.read_setting(other).await? {
                Some(v) => v,
                None => return Err((nightshift_proto::ErrorCode::Internal, format!("cannot read {other}"))),
            },
        })
    }

    /// Put `v` on the device. `content` is the new text of a config being
    /// applied (a new version); without it a config write is a rollback to
    /// the version named.
    pub(super) async fn write_setting(
        &self,
        s: &Setting,
        v: &HoldValue,
        content: Option<&ConfigApplyArgs>,
    ) -> Result<serde_json::Value, Refusal> {
        self.write_setting_with(s, v, content, true).await
    }

    /// [`Agent::write_setting`]; `restart_consumer: false` writes a config
    /// file without restarting what reads it.
    pub(super) async fn write_setting_with(
        &self,
        s: &Setting,
        v: &HoldValue,
        content: Option<&ConfigApplyArgs>,
        restart_consumer: bool,
    ) -> Result<serde_json::Value, Refusal> {
        let now = self.clock.now_ms();
        match (s, v) {
            (Setting::PowerLimit { gpu }, HoldValue::PowerLimit { watts }) => {
                self.support(self.backend.set_power_limit(*gpu, *watts).map_err(backend_refusal)?)?;
                Ok(json!({"power_limit_watts": self.gpu_sample(*gpu)?.power_limit_watts}))
            }
            (Setting::FanCurve { gpu }, HoldValue::FanCurve { points }) => match points {
                Some(p) => {
                    self.run_fan_curve(*gpu, p)?;
                    Ok(json!({"fan_curve": p}))
                }
                None => {
                    self.support(self.backend.reset_fan(*gpu).map_err(backend_refusal)?)?;
                    Ok(json!({"fan_curve": null}))
                }
            },
            (Setting::Clocks { gpu }, HoldValue::Clocks { locked_mhz }) => match locked_mhz {
                Some((lo, hi)) => {
                    self.support(self.backend.set_clocks(*gpu, *lo, *hi).map_err(backend_refusal)?)?;
                    Ok(json!({"clocks_locked_mhz": [lo, hi]}))
                }
                None => {
                    self.support(self.backend.reset_clocks(*gpu).map_err(backend_refusal)?)?;
                    Ok(json!({"clocks_locked_mhz": null}))
                }
            },
            (Setting::GpuDrain { gpu }, HoldValue::GpuDrain { drained }) => {
                self.support(self.backend.set_gpu_drain(*gpu, *drained).map_err(backend_refusal)?)?;
                Ok(json!({"gpu_drained": self.gpu_sample(*gpu)?.gpu_drained}))
            }
            (Setting::NodeDrain {}, HoldValue::NodeDrain { drained, reason }) => {
                if *drained {
                    self.scheduler.drain(reason.as_deref().unwrap_or("nightshift: drained")).await
                } else {
                    self.scheduler.resume().await
                }
                .map_err(node_refusal)?;
                let st = self.drain_state(true).await.map_err(node_refusal)?;
                Ok(json!({"drained": st.drained, "reason": st.reason}))
            }
            (Setting::ChassisFans {}, HoldValue::ChassisFans { full }) => {
                match &self.opts.policy.bmc {
                    Some(b) => {
                        let argv = if *full { &b.fans_full_argv } else { &b.fans_auto_argv };
                        crate::procs::run(argv, std::time::Duration::from_secs(b.timeout_secs))
                            .await
                            .map_err(|e| node_refusal(crate::node::NodeError::Process(e)))?;
                    }
                    None => self.support(self.backend.set_chassis_fans(*full).map_err(backend_refusal)?)?,
                }
                Ok(json!({"chassis_fans_full": full}))
            }
            (Setting::Mark { mark }, HoldValue::Mark { set }) => {
                let done = self.scheduler.mark(*mark, *set, "nightshift").await.map_err(node_refusal)?;
                if !done {
                    return Err((
                        nightshift_proto::ErrorCode::BackendError,
                        format!("the {} scheduler has no {} mark", self.scheduler.kind(), mark.as_str()),
                    ));
                }
                *self.drain_cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok(json!({"mark": mark.as_str(), "set": set}))
            }
            (Setting::Config { name }, HoldValue::Config { version }) => {
                let restart = content.is_none_or(|a| a.restart_consumer) && restart_consumer;
                let h = match (content, version) {
                    (Some(a), _) => {
                        let h = self.configs.apply(name, &a.content, a.note.clone(), now).map_err(node_refusal)?;
                        self.backend.on_config_applied(name, &a.content);
                        h
                    }
                    (None, Some(v)) => {
                        let (h, text) = self.configs.rollback(name, *v, now).map_err(node_refusal)?;
                        self.backend.on_config_applied(name, &text);
                        h
                    }
                    (None, None) => {
                        return Err((
                            nightshift_proto::ErrorCode::NotFound,
                            format!("`{name}` had no version before nightshift managed it: nothing to put back"),
                        ));
                    }
                };
                let consumer = if restart { self.restart_consumer(name).await? } else { json!("not restarted") };
                Ok(json!({"name": name, "current_version": h.current, "consumer_restarted": consumer}))
            }
            (s, v) => Err((nightshift_proto::ErrorCode::Internal, format!("{s}: a {v} value does not fit"))),
        }
    }

    /// Restart what reads managed config `name` so its new content takes
    /// effect: nothing for files read at every use, a requeue of the running
    /// jobs, or `systemctl restart <unit>` (argv, timeout).
    pub(super) async fn restart_consumer(&self, name: &str) -> Result<serde_json::Value, Refusal> {
        use crate::node::configs::Consumer;
        let Some(m) = self.opts.configs.get(name) else { return Ok(json!("none declared")) };
        let what = match m.consumer {
            Consumer::Files => json!("files: read at every use"),
            Consumer::Jobs => {
                // The jobs start again (here or elsewhere) and read the file.
                let moved = self.scheduler.requeue().await.map_err(node_refusal)?;
                self.backend.on_jobs_restarted();
                json!({"jobs_requeued": moved})
            }
            Consumer::Unit => {
                let unit = m.unit.clone().unwrap_or_default();
                let argv = vec![m.systemctl_path.clone(), "restart".to_string(), unit.clone()];
                crate::procs::run(&argv, std::time::Duration::from_secs(60))
                    .await
                    .map_err(|e| node_refusal(crate::node::NodeError::Process(e)))?;
                json!({"unit_restarted": unit})
            }
        };
        self.backend.on_consumer_restarted(name);
        tracing::info!(node = %self.opts.node, config = name, consumer = %what, "restarted a managed config's consumer");
        Ok(what)
    }

    /// Whether a config version is marked bad (never restored).
    pub(super) fn config_version_bad(&self, name: &str, version: Option<u32>) -> bool {
        let Some(v) = version else { return false };
        self.configs
            .history(name, self.clock.now_ms())
            .is_ok_and(|h| h.versions.iter().any(|x| x.version == v && x.good == Some(false)))
    }
}
