//! The `nvml` backend: NVIDIA GPUs through `nvml-wrapper`.
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`, or a chosen path). NVML
//! speaks milliwatts for power; everything here converts at the boundary so
//! the rest of the agent speaks watts. `NotSupported` (a fanless H100 SXM has
//! no fan to set) maps to [`Support::NotSupported`], not to an error.
//!
//! XIDs come from NVML's event API on a thread of their own
//! (`nvmlEventSetWait` blocks): critical XID and double-bit ECC events, per
//! GPU, so H8 has an input without DCGM. Several XIDs between two waits
//! report only the last (NVML's own limit). A GPU that does not answer is
//! that GPU's reading (`lost`), not the node's: its neighbours still report.

use std::path::Path;
use std::sync::{Arc, Mutex};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use nvml_wrapper::error::NvmlError;

use super::{Backend, BackendError, Support};
use nightshift_proto::{GpuInfo, GpuTelemetry, NodeTelemetry, Vendor};

/// NVLink links a GPU can have (NVML_NVLINK_MAX_LINKS).
const MAX_LINKS: u32 = 18;

/// What NVML's event API told about a GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct XidState {
    pub last: Option<u32>,
    /// Fatal XID events since the agent started.
    pub events: u64,
    /// The last fatal XID since the GPU was last seen to come back (a
    /// reset or a reboot makes a lost GPU answer again).
    pub fatal_since_reset: Option<u32>,
    /// The GPU did not answer at the last sample.
    pub lost: bool,
    /// Every XID event by code, fatal or not.
    pub counts: std::collections::BTreeMap<u32, u64>,
}

/// NVIDIA GPUs through NVML.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    info: Vec<GpuInfo>,
    fans: Vec<u32>,
    xids: Arc<Mutex<Vec<XidState>>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").field("gpus", &self.info.len()).finish()
    }
}

fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            format!("the NVIDIA driver library could not be loaded ({inner}); is the NVIDIA driver installed?")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        NvmlError::NoPermission => "permission denied: the agent must run as root to change GPU settings".into(),
        NvmlError::FailedToLoadSymbol(s) => format!("the installed driver lacks {s}; upgrade the driver"),
        other => other.to_string(),
    }
}

fn failed(e: NvmlError) -> BackendError {
    BackendError::Failed { backend: "nvml", message: describe(&e) }
}

/// Map an NVML result: `NotSupported` is an answer, anything else an error.
fn support<T>(r: Result<T, NvmlError>, what: &str) -> Result<Support<T>, BackendError> {
    match r {
        Ok(v) => Ok(Support::Done(v)),
        Err(NvmlError::NotSupported) => Ok(Support::NotSupported(format!("{what} is not supported on this GPU"))),
        Err(e) => Err(failed(e)),
    }
}

/// An optional reading: unsupported or failing reads are simply absent.
fn opt<T>(r: Result<T, NvmlError>) -> Option<T> {
    r.ok()
}

/// The XID events seen on a GPU, by code.
fn xid_counts(x: &XidState) -> Vec<nightshift_proto::XidCount> {
    x.counts.iter().map(|(&code, &events)| nightshift_proto::XidCount { code, events }).collect()
}

/// NVML's clocks-event bits by the names of `nightshift_proto::THROTTLE_REASONS`.
fn reason_names(r: ThrottleReasons) -> Vec<String> {
    [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, "applications_clocks"),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clocks"),
    ]
    .into_iter()
    .filter(|(bit, _)| r.contains(*bit))
    .map(|(_, name)| name.to_string())
    .collect()
}

fn mw_to_w(mw: u32) -> f64 {
    mw as f64 / 1000.0
}

/// Watts to NVML's milliwatts.
pub fn w_to_mw(w: f64) -> u32 {
    (w * 1000.0).round().clamp(0.0, u32::MAX as f64) as u32
}

/// NVML field ids (nvml.h) for readings without a call of their own.
const NVML_FI_DEV_MEMORY_TEMP: u32 = 82;
const NVML_FI_DEV_REMAPPED_COR: u32 = 142;
const NVML_FI_DEV_REMAPPED_UNC: u32 = 143;
const NVML_FI_DEV_REMAPPED_PENDING: u32 = 144;
const NVML_FI_DEV_REMAPPED_FAILURE: u32 = 145;

/// Readings NVML gives only as field values; each absent where the GPU
/// does not support it.
#[derive(Default)]
struct Fields {
    mem_temp_c: Option<f64>,
    remapped_cor: Option<u64>,
    remapped_unc: Option<u64>,
    remap_failure: Option<u64>,
    remap_pending: Option<u64>,
}

fn field_values(d: &nvml_wrapper::Device<'_>) -> Fields {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let ids = [
        NVML_FI_DEV_MEMORY_TEMP,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
    ];
    let Ok(samples) = d.field_values_for(&ids.map(FieldId)) else { return Fields::default() };
    let mut f = Fields::default();
    for s in samples.into_iter().flatten() {
        let v = match s.value {
            Ok(SampleValue::F64(v)) => v,
            Ok(SampleValue::U32(v)) => f64::from(v),
            Ok(SampleValue::U64(v)) => v as f64,
            Ok(SampleValue::I64(v)) => v as f64,
            Err(_) => continue,
        };
        match s.field.0 {
            NVML_FI_DEV_MEMORY_TEMP => f.mem_temp_c = Some(v),
            NVML_FI_DEV_REMAPPED_COR => f.remapped_cor = Some(v as u64),
            NVML_FI_DEV_REMAPPED_UNC => f.remapped_unc = Some(v as u64),
            NVML_FI_DEV_REMAPPED_FAILURE => f.remap_failure = Some(v as u64),
            NVML_FI_DEV_REMAPPED_PENDING => f.remap_pending = Some(v as u64),
            _ => {}
        }
    }
    f
}

impl NvmlBackend {
    /// Load NVML (from `lib_path` when given) and read the inventory.
    pub fn open(lib_path: Option<&Path>) -> Result<NvmlBackend, BackendError> {
        let nvml = match lib_path {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| BackendError::Unavailable(format!("nvml: {}", describe(&e))))?;
        let count = nvml.device_count().map_err(failed)?;
        if count == 0 {
            return Err(BackendError::Unavailable("nvml: the driver is loaded but reports no NVIDIA GPU".into()));
        }
        let mut info = Vec::new();
        let mut fans = Vec::new();
        for i in 0..count {
            let d = nvml.device_by_index(i).map_err(failed)?;
            let c = d.power_management_limit_constraints().map_err(failed)?;
            let (min_mw, max_mw) = (c.min_limit, c.max_limit);
            let default_mw = d.power_management_limit_default().unwrap_or(max_mw);
            let n_fans = d.num_fans().unwrap_or(0);
            fans.push(n_fans);
            info.push(GpuInfo {
                uuid: opt(d.uuid()),
                power_min_watts: mw_to_w(min_mw),
                power_max_watts: mw_to_w(max_mw),
                power_default_watts: mw_to_w(default_mw),
                mem_total_mib: d.memory_info().map(|m| m.total / (1024 * 1024)).unwrap_or(0),
                fan_control: n_fans > 0,
                slowdown_temp_c: opt(d.temperature_threshold(TemperatureThreshold::Slowdown)).map(f64::from),
                shutdown_temp_c: opt(d.temperature_threshold(TemperatureThreshold::Shutdown)).map(f64::from),
                clock_max_mhz: opt(d.max_clock_info(Clock::SM)),
                pci_bus_id: opt(d.pci_info()).map(|p| p.bus_id),
                mem_max_temp_c: opt(d.temperature_threshold(TemperatureThreshold::MemoryMax))
                    .filter(|c| *c > 0)
                    .map(f64::from),
                ..GpuInfo::new(i, d.name().map_err(failed)?, Vendor::Nvidia)
            });
        }
        let nvml = Arc::new(nvml);
        let xids = Arc::new(Mutex::new(vec![XidState::default(); info.len()]));
        spawn_xid_watch(nvml.clone(), xids.clone(), info.iter().filter_map(|g| g.uuid.clone()).collect());
        Ok(NvmlBackend { nvml, info, fans, xids })
    }

    fn xid(&self, gpu: u32) -> XidState {
        self.xids.lock().unwrap_or_else(|e| e.into_inner()).get(gpu as usize).cloned().unwrap_or_default()
    }

    /// A GPU that did not answer: its entry says so, its neighbours go on.
    fn lost_gpu(&self, i: u32, e: &BackendError) -> GpuTelemetry {
        let x = {
            let mut all = self.xids.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(x) = all.get_mut(i as usize) {
                x.lost = true;
            }
            all.get(i as usize).cloned().unwrap_or_default()
        };
        GpuTelemetry {
            index: i,
            lost: true,
            lost_detail: Some(e.to_string()),
            xid_last: x.last,
            xid_events_total: Some(x.events),
            xid_counts: xid_counts(&x),
            ..GpuTelemetry::default()
        }
    }

    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, BackendError> {
        self.gpu(gpu)?;
        self.nvml.device_by_index(gpu).map_err(failed)
    }

    fn read_gpu(&self, i: u32) -> Result<GpuTelemetry, BackendError> {
        let d = self.device(i)?;
        // It answers: if it was lost, it came back (a reset or a reboot).
        let xid = {
            let mut all = self.xids.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(x) = all.get_mut(i as usize)
                && x.lost
            {
                x.lost = false;
                x.fatal_since_reset = None;
            }
            all.get(i as usize).cloned().unwrap_or_default()
        };
        let mem = opt(d.memory_info());
        let fields = field_values(&d);
        let fan = if self.fans[i as usize] > 0 { opt(d.fan_speed(0)).map(f64::from) } else { None };
        let reasons = opt(d.current_throttle_reasons());
        let throttled = reasons
            .map(|r| {
                // Heat: a thermal bit, or the hardware slowdown without the
                // power brake (older drivers set only HW_SLOWDOWN).
                r.intersects(ThrottleReasons::SW_THERMAL_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN)
                    || (r.contains(ThrottleReasons::HW_SLOWDOWN)
                        && !r.contains(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN))
            })
            .unwrap_or(false);
        Ok(GpuTelemetry {
            index: i,
            temperature_c: d.temperature(TemperatureSensor::Gpu).map_err(failed)? as f64,
            power_watts: mw_to_w(d.power_usage().map_err(failed)?),
            power_limit_watts: mw_to_w(
                d.enforced_power_limit().or_else(|_| d.power_management_limit()).map_err(failed)?,
            ),
            fan_pct: fan,
            util_pct: opt(d.utilization_rates()).map(|u| u.gpu as f64).unwrap_or(0.0),
            mem_used_pct: mem
                .filter(|m| m.total > 0)
                .map(|m| (m.used as f64 / m.total as f64 * 10_000.0).round() / 100.0)
                .unwrap_or(0.0),
            mem_fragmentation_pct: None,
            // Only the job knows its allocator (the job textfile).
            mem_peak_allocated_pct: None,
            // DCGM profiling, not NVML: read from dcgm-exporter by the
            // engine's Prometheus source.
            sm_active_pct: None,
            sm_clock_mhz: opt(d.clock_info(Clock::SM)),
            ecc_sbe_total: opt(d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)).unwrap_or(0),
            ecc_dbe_total: opt(d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)).unwrap_or(0),
            xid_last: xid.last,
            xid_events_total: Some(xid.events),
            xid_counts: xid_counts(&xid),
            throttled,
            throttle_reasons: reasons.map(reason_names).unwrap_or_default(),
            gpu_drained: opt(d.is_drain_enabled(None)).unwrap_or(false),
            mem_clock_mhz: opt(d.clock_info(Clock::Memory)),
            mem_temperature_c: fields.mem_temp_c,
            energy_mj: opt(d.total_energy_consumption()),
            pcie_replay_total: opt(d.pcie_replay_counter()).map(u64::from),
            nvlink_bytes_total: None,
            remapped_rows_correctable: fields.remapped_cor,
            remapped_rows_uncorrectable: fields.remapped_unc,
            row_remap_failure: fields.remap_failure.map(|v| v != 0),
            row_remap_pending: fields.remap_pending.map(|v| v != 0),
            lost: false,
            lost_detail: None,
            reset_required: None,
        })
    }

    fn read_links(&self) -> (Option<u32>, Option<u32>, Option<u64>) {
        let (mut up, mut total, mut errors) = (0u32, 0u32, 0u64);
        for gpu in &self.info {
            let Ok(d) = self.nvml.device_by_index(gpu.index) else { continue };
            for l in 0..MAX_LINKS {
                let link = d.link_wrapper_for(l);
                match link.is_active() {
                    Ok(active) => {
                        total += 1;
                        up += active as u32;
                        for c in [
                            ErrorCounter::DlReplay,
                            ErrorCounter::DlRecovery,
                            ErrorCounter::DlCrcFlit,
                            ErrorCounter::DlCrcData,
                        ] {
                            errors += link.error_counter(c).unwrap_or(0);
                        }
                    }
                    Err(_) => break,
                }
            }
        }
        if total == 0 { (None, None, None) } else { (Some(up), Some(total), Some(errors)) }
    }
}

/// Watch NVML's event API for critical XIDs and double-bit ECC errors on
/// every GPU (by UUID), on a thread of its own. A driver without the event
/// API (an old one, a fake library) is logged once and the thread ends.
fn spawn_xid_watch(nvml: Arc<Nvml>, xids: Arc<Mutex<Vec<XidState>>>, uuids: Vec<String>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let spawned = std::thread::Builder::new().name("nvml-xid".into()).spawn(move || {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %describe(&e), "NVML has no event API here: XIDs come only from DCGM");
                return;
            }
        };
        for i in 0..uuids.len() as u32 {
            let Ok(d) = nvml.device_by_index(i) else { continue };
            set = match d.register_events(EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR, set) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(gpu = i, error = %describe(&e.error), "cannot watch XID events on this GPU");
                    return;
                }
            };
        }
        loop {
            match set.wait(5_000) {
                Ok(ev) => {
                    let uuid = ev.device.uuid().ok();
                    let Some(idx) = uuid.and_then(|u| uuids.iter().position(|x| *x == u)) else { continue };
                    let code = match ev.event_data {
                        Some(XidError::Value(v)) => u32::try_from(v).ok(),
                        _ if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) => Some(48),
                        _ => None,
                    };
                    let Some(code) = code else { continue };
                    let mut all = xids.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(x) = all.get_mut(idx) {
                        x.last = Some(code);
                        *x.counts.entry(code).or_default() += 1;
                        if super::FATAL_XIDS.contains(&code) {
                            x.events += 1;
                            x.fatal_since_reset = Some(code);
                        }
                    }
                    tracing::warn!(gpu = idx, xid = code, "XID event");
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    tracing::warn!(error = %describe(&e), "NVML event wait failed; retrying in 5 s");
                    std::thread::sleep(std::time::Duration::from_secs(5));
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the XID watch thread");
    }
}

impl Backend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.info
    }

    fn driver_version(&self) -> Option<String> {
        opt(self.nvml.sys_driver_version())
    }

    fn sample(&self) -> Result<(Vec<GpuTelemetry>, NodeTelemetry), BackendError> {
        let gpus = self
            .info
            .iter()
            .map(|g| self.read_gpu(g.index).unwrap_or_else(|e| self.lost_gpu(g.index, &e)))
            .collect::<Vec<_>>();
        let (up, total, errors) = self.read_links();
        let node = NodeTelemetry {
            nvlink_links_up: up,
            nvlink_links_total: total,
            nvlink_errors_total: errors,
            ..NodeTelemetry::default()
        };
        Ok((gpus, node))
    }

    fn set_power_limit(&self, gpu: u32, watts: f64) -> Result<Support<()>, BackendError> {
        let mut d = self.device(gpu)?;
        support(d.set_power_management_limit(w_to_mw(watts)), "setting the power limit")
    }

    fn set_fan_speed(&self, gpu: u32, pct: f64) -> Result<Support<()>, BackendError> {
        let n = self.fans[self.gpu(gpu)?.index as usize];
        if n == 0 {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.info[gpu as usize].name)));
        }
        let mut d = self.device(gpu)?;
        for fan in 0..n {
            if let Support::NotSupported(why) = support(d.set_fan_speed(fan, pct.round() as u32), "setting fan speed")?
            {
                return Ok(Support::NotSupported(why));
            }
        }
        Ok(Support::Done(()))
    }

    fn reset_fan(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let n = self.fans[self.gpu(gpu)?.index as usize];
        if n == 0 {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.info[gpu as usize].name)));
        }
        let mut d = self.device(gpu)?;
        for fan in 0..n {
            if let Support::NotSupported(why) = support(d.set_default_fan_speed(fan), "resetting the fan")? {
                return Ok(Support::NotSupported(why));
            }
        }
        Ok(Support::Done(()))
    }

    fn set_clocks(&self, gpu: u32, min_mhz: u32, max_mhz: u32) -> Result<Support<()>, BackendError> {
        let mut d = self.device(gpu)?;
        support(
            d.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric { min_clock_mhz: min_mhz, max_clock_mhz: max_mhz }),
            "locking clocks",
        )
    }

    fn reset_clocks(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let mut d = self.device(gpu)?;
        support(d.reset_gpu_locked_clocks(), "unlocking clocks")
    }

    fn clear_ecc(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let mut d = self.device(gpu)?;
        support(d.clear_ecc_error_counts(EccCounter::Volatile), "clearing ECC counters")
    }

    fn set_gpu_drain(&self, gpu: u32, drained: bool) -> Result<Support<()>, BackendError> {
        let mut d = self.device(gpu)?;
        support(d.set_drain(drained, None), "the NVML drain state")
    }

    fn pcie_link(&self, gpu: u32) -> Option<super::PcieLink> {
        let d = self.device(gpu).ok()?;
        Some(super::PcieLink {
            width: d.current_pcie_link_width().ok()?,
            max_width: d.max_pcie_link_width().ok()?,
            generation: d.current_pcie_link_gen().ok()?,
            max_generation: d.max_pcie_link_gen().ok()?,
        })
    }

    fn fatal_xid_since_reset(&self, gpu: u32) -> Option<u32> {
        self.xid(gpu).fatal_since_reset
    }
}
