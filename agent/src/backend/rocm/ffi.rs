//! The only unsafe code in nightshift: a thin wrapper over the raw ROCm SMI
//! calls (`rocm_smi_lib_sys`) that checks every status code.
//!
//! The high-level `rocm_smi_lib` crate is not used: its `init()` ignores the
//! `rsmi_init` error and a getter after a failed init crashed (see
//! REFERENCE.md). Only functions present in ROCm SMI 5.2.3 (Debian's
//! `librocm-smi-dev`) are called, so the build links there.
#![allow(unsafe_code)]

use rocm_smi_lib_sys::bindings as rsmi;

/// A non-success status, with ROCm SMI's own text for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RsmiError {
    pub status: u32,
    pub text: String,
}

impl RsmiError {
    pub fn not_supported(&self) -> bool {
        self.status == rsmi::rsmi_status_t_RSMI_STATUS_NOT_SUPPORTED
    }
    pub fn permission(&self) -> bool {
        self.status == rsmi::rsmi_status_t_RSMI_STATUS_PERMISSION
    }
}

impl std::fmt::Display for RsmiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rocm-smi status {}: {}", self.status, self.text)
    }
}

fn check(status: rsmi::rsmi_status_t) -> Result<(), RsmiError> {
    if status == rsmi::rsmi_status_t_RSMI_STATUS_SUCCESS {
        return Ok(());
    }
    let mut ptr: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: rsmi_status_string only writes a pointer to a static,
    // NUL-terminated string into `ptr`; we pass a valid pointer to a local.
    let rc = unsafe { rsmi::rsmi_status_string(status, &mut ptr) };
    let text = if rc == rsmi::rsmi_status_t_RSMI_STATUS_SUCCESS && !ptr.is_null() {
        // SAFETY: on success `ptr` points to a static C string owned by the
        // library, valid for the life of the process.
        unsafe { std::ffi::CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    } else {
        "unknown error".to_string()
    };
    Err(RsmiError { status, text })
}

/// Initialise the library. Must succeed before any other call.
pub fn init() -> Result<(), RsmiError> {
    // SAFETY: rsmi_init takes flags by value and has no pointer arguments.
    check(unsafe { rsmi::rsmi_init(0) })
}

pub fn num_devices() -> Result<u32, RsmiError> {
    let mut n: u32 = 0;
    // SAFETY: `n` is a valid, writable u32 for the duration of the call.
    check(unsafe { rsmi::rsmi_num_monitor_devices(&mut n) })?;
    Ok(n)
}

pub fn name(dev: u32) -> Result<String, RsmiError> {
    let mut buf = [0 as std::os::raw::c_char; 128];
    // SAFETY: we pass the buffer and its true length; the library writes at
    // most `len` bytes including the terminator.
    check(unsafe { rsmi::rsmi_dev_name_get(dev, buf.as_mut_ptr(), buf.len()) })?;
    // Ensure termination even if the library filled the buffer.
    buf[buf.len() - 1] = 0;
    // SAFETY: `buf` is NUL-terminated (forced above) and lives across the call.
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Junction temperature in °C (the library reports millidegrees).
pub fn temperature_c(dev: u32) -> Result<f64, RsmiError> {
    temp_metric(
        dev,
        rsmi::rsmi_temperature_type_t_RSMI_TEMP_TYPE_JUNCTION,
        rsmi::rsmi_temperature_metric_t_RSMI_TEMP_CURRENT,
    )
}

/// The HBM's temperature in °C.
pub fn mem_temperature_c(dev: u32) -> Result<f64, RsmiError> {
    temp_metric(
        dev,
        rsmi::rsmi_temperature_type_t_RSMI_TEMP_TYPE_MEMORY,
        rsmi::rsmi_temperature_metric_t_RSMI_TEMP_CURRENT,
    )
}

/// The HBM's critical temperature in °C (its limit).
pub fn mem_critical_c(dev: u32) -> Result<f64, RsmiError> {
    temp_metric(
        dev,
        rsmi::rsmi_temperature_type_t_RSMI_TEMP_TYPE_MEMORY,
        rsmi::rsmi_temperature_metric_t_RSMI_TEMP_CRITICAL,
    )
}

fn temp_metric(
    dev: u32,
    sensor: rsmi::rsmi_temperature_type_t,
    metric: rsmi::rsmi_temperature_metric_t,
) -> Result<f64, RsmiError> {
    let mut v: i64 = 0;
    // SAFETY: `v` is a valid, writable i64; the enum arguments are passed by value.
    check(unsafe { rsmi::rsmi_dev_temp_metric_get(dev, sensor, metric, &mut v) })?;
    Ok(v as f64 / 1000.0)
}

/// The memory controller's (UMC) ECC counts: (correctable, uncorrectable)
/// — the RAS counters H8 reads on AMD (an uncorrectable one is a DBE).
pub fn ecc_umc(dev: u32) -> Result<(u64, u64), RsmiError> {
    let mut ec = rsmi::rsmi_error_count_t { correctable_err: 0, uncorrectable_err: 0 };
    // SAFETY: `ec` is a valid, writable rsmi_error_count_t (repr(C), the
    // layout bindgen checked); the block is passed by value.
    check(unsafe { rsmi::rsmi_dev_ecc_count_get(dev, rsmi::rsmi_gpu_block_t_RSMI_GPU_BLOCK_UMC, &mut ec) })?;
    Ok((ec.correctable_err, ec.uncorrectable_err))
}

/// Average power in watts (the library reports microwatts).
pub fn power_watts(dev: u32) -> Result<f64, RsmiError> {
    let mut v: u64 = 0;
    // SAFETY: `v` is a valid, writable u64.
    check(unsafe { rsmi::rsmi_dev_power_ave_get(dev, 0, &mut v) })?;
    Ok(v as f64 / 1e6)
}

pub fn power_cap_watts(dev: u32) -> Result<f64, RsmiError> {
    let mut v: u64 = 0;
    // SAFETY: `v` is a valid, writable u64.
    check(unsafe { rsmi::rsmi_dev_power_cap_get(dev, 0, &mut v) })?;
    Ok(v as f64 / 1e6)
}

/// (min, max) power cap in watts.
pub fn power_cap_range_watts(dev: u32) -> Result<(f64, f64), RsmiError> {
    let (mut max, mut min) = (0u64, 0u64);
    // SAFETY: both pointers are valid, writable u64 locals.
    check(unsafe { rsmi::rsmi_dev_power_cap_range_get(dev, 0, &mut max, &mut min) })?;
    Ok((min as f64 / 1e6, max as f64 / 1e6))
}

pub fn set_power_cap_watts(dev: u32, watts: f64) -> Result<(), RsmiError> {
    let uw = (watts * 1e6).round().max(0.0) as u64;
    // SAFETY: value arguments only.
    check(unsafe { rsmi::rsmi_dev_power_cap_set(dev, 0, uw) })
}

/// Fan speed as a percentage of its maximum.
pub fn fan_pct(dev: u32) -> Result<f64, RsmiError> {
    let (mut speed, mut max) = (0i64, 0u64);
    // SAFETY: `speed` and `max` are valid, writable locals.
    check(unsafe { rsmi::rsmi_dev_fan_speed_get(dev, 0, &mut speed) })?;
    // SAFETY: as above.
    check(unsafe { rsmi::rsmi_dev_fan_speed_max_get(dev, 0, &mut max) })?;
    Ok(if max == 0 { 0.0 } else { speed as f64 / max as f64 * 100.0 })
}

pub fn set_fan_pct(dev: u32, pct: f64) -> Result<(), RsmiError> {
    let mut max = 0u64;
    // SAFETY: `max` is a valid, writable local.
    check(unsafe { rsmi::rsmi_dev_fan_speed_max_get(dev, 0, &mut max) })?;
    let speed = (pct.clamp(0.0, 100.0) / 100.0 * max as f64).round() as u64;
    // SAFETY: value arguments only.
    check(unsafe { rsmi::rsmi_dev_fan_speed_set(dev, 0, speed) })
}

pub fn fan_reset(dev: u32) -> Result<(), RsmiError> {
    // SAFETY: value arguments only.
    check(unsafe { rsmi::rsmi_dev_fan_reset(dev, 0) })
}

pub fn busy_pct(dev: u32) -> Result<f64, RsmiError> {
    let mut v: u32 = 0;
    // SAFETY: `v` is a valid, writable u32.
    check(unsafe { rsmi::rsmi_dev_busy_percent_get(dev, &mut v) })?;
    Ok(v as f64)
}

/// (used, total) VRAM in bytes.
pub fn vram_bytes(dev: u32) -> Result<(u64, u64), RsmiError> {
    let (mut used, mut total) = (0u64, 0u64);
    // SAFETY: valid, writable locals; the memory type is passed by value.
    check(unsafe { rsmi::rsmi_dev_memory_usage_get(dev, rsmi::rsmi_memory_type_t_RSMI_MEM_TYPE_VRAM, &mut used) })?;
    // SAFETY: as above.
    check(unsafe { rsmi::rsmi_dev_memory_total_get(dev, rsmi::rsmi_memory_type_t_RSMI_MEM_TYPE_VRAM, &mut total) })?;
    Ok((used, total))
}
