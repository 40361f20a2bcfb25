//! The `rocm` backend: AMD Instinct GPUs through ROCm SMI (feature `rocm`).
//!
//! Power caps and fan speeds go through the checked wrapper in [`ffi`]; power
//! is converted from the library's microwatts. Clock locks, ECC clearing and
//! GPU drain have no ROCm SMI 5.2.3 call here and answer "does not apply".

mod ffi;

use super::{Backend, BackendError, Support};
use nightshift_proto::{GpuInfo, GpuTelemetry, NodeTelemetry, Vendor};

/// AMD GPUs through ROCm SMI.
#[derive(Debug)]
pub struct RocmBackend {
    info: Vec<GpuInfo>,
}

fn failed(e: ffi::RsmiError) -> BackendError {
    let hint = if e.permission() { " (the agent must run as root to change GPU settings)" } else { "" };
    BackendError::Failed { backend: "rocm", message: format!("{e}{hint}") }
}

fn support(r: Result<(), ffi::RsmiError>, what: &str) -> Result<Support<()>, BackendError> {
    match r {
        Ok(()) => Ok(Support::Done(())),
        Err(e) if e.not_supported() => Ok(Support::NotSupported(format!("{what} is not supported on this GPU"))),
        Err(e) => Err(failed(e)),
    }
}

impl RocmBackend {
    /// Initialise ROCm SMI and read the inventory; with no AMD GPU (no DRM
    /// device), says so plainly.
    pub fn open() -> Result<RocmBackend, BackendError> {
        ffi::init().map_err(|e| {
            BackendError::Unavailable(format!(
                "rocm: no AMD GPU found (ROCm SMI could not initialise: {e}); is the amdgpu driver loaded?"
            ))
        })?;
        let n = ffi::num_devices().map_err(failed)?;
        if n == 0 {
            return Err(BackendError::Unavailable("rocm: ROCm SMI initialised but reports no AMD GPU".into()));
        }
        let mut info = Vec::new();
        for i in 0..n {
            let (min, max) = ffi::power_cap_range_watts(i).map_err(failed)?;
            let (_, total) = ffi::vram_bytes(i).unwrap_or((0, 0));
            info.push(GpuInfo {
                power_min_watts: min,
                power_max_watts: max,
                power_default_watts: max,
                mem_total_mib: total / (1024 * 1024),
                fan_control: ffi::fan_pct(i).is_ok(),
                mem_max_temp_c: ffi::mem_critical_c(i).ok().filter(|c| *c > 0.0),
                ..GpuInfo::new(i, ffi::name(i).unwrap_or_else(|_| "AMD GPU".into()), Vendor::Amd)
            });
        }
        Ok(RocmBackend { info })
    }
}

impl Backend for RocmBackend {
    fn name(&self) -> &'static str {
        "rocm"
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.info
    }

    fn sample(&self) -> Result<(Vec<GpuTelemetry>, NodeTelemetry), BackendError> {
        let mut gpus = Vec::new();
        for g in &self.info {
            let i = g.index;
            // A GPU that does not answer is that GPU's reading (lost), not
            // the node's: its neighbours still report.
            let read = || -> Result<GpuTelemetry, BackendError> {
                let (used, total) = ffi::vram_bytes(i).unwrap_or((0, 0));
                let ecc = ffi::ecc_umc(i).ok();
                Ok(GpuTelemetry {
                    index: i,
                    temperature_c: ffi::temperature_c(i).map_err(failed)?,
                    power_watts: ffi::power_watts(i).map_err(failed)?,
                    power_limit_watts: ffi::power_cap_watts(i).map_err(failed)?,
                    fan_pct: if g.fan_control { ffi::fan_pct(i).ok() } else { None },
                    util_pct: ffi::busy_pct(i).unwrap_or(0.0),
                    mem_used_pct: if total > 0 { used as f64 / total as f64 * 100.0 } else { 0.0 },
                    ecc_sbe_total: ecc.map_or(0, |e| e.0),
                    ecc_dbe_total: ecc.map_or(0, |e| e.1),
                    mem_temperature_c: ffi::mem_temperature_c(i).ok(),
                    ..GpuTelemetry::default()
                })
            };
            gpus.push(read().unwrap_or_else(|e| GpuTelemetry {
                index: i,
                lost: true,
                lost_detail: Some(e.to_string()),
                ..GpuTelemetry::default()
            }));
        }
        Ok((gpus, NodeTelemetry::default()))
    }

    fn set_power_limit(&self, gpu: u32, watts: f64) -> Result<Support<()>, BackendError> {
        self.gpu(gpu)?;
        support(ffi::set_power_cap_watts(gpu, watts), "setting the power cap")
    }

    fn set_fan_speed(&self, gpu: u32, pct: f64) -> Result<Support<()>, BackendError> {
        if !self.gpu(gpu)?.fan_control {
            return Ok(Support::NotSupported("this GPU has no controllable fan".into()));
        }
        support(ffi::set_fan_pct(gpu, pct), "setting fan speed")
    }

    fn reset_fan(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        if !self.gpu(gpu)?.fan_control {
            return Ok(Support::NotSupported("this GPU has no controllable fan".into()));
        }
        support(ffi::fan_reset(gpu), "resetting the fan")
    }

    fn set_clocks(&self, gpu: u32, _min: u32, _max: u32) -> Result<Support<()>, BackendError> {
        self.gpu(gpu)?;
        Ok(Support::NotSupported("clock locking is not offered by the rocm backend".into()))
    }

    fn reset_clocks(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        self.gpu(gpu)?;
        Ok(Support::NotSupported("clock locking is not offered by the rocm backend".into()))
    }

    fn clear_ecc(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        self.gpu(gpu)?;
        Ok(Support::NotSupported("clearing ECC counters is not offered by the rocm backend".into()))
    }

    fn set_gpu_drain(&self, gpu: u32, _drained: bool) -> Result<Support<()>, BackendError> {
        self.gpu(gpu)?;
        Ok(Support::NotSupported("GPU drain state is NVML-only".into()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_an_amd_gpu_it_says_so() {
        match super::RocmBackend::open() {
            Ok(b) => assert!(!super::Backend::gpus(&b).is_empty()),
            Err(e) => assert!(e.to_string().starts_with("rocm: "), "{e}"),
        }
    }
}
