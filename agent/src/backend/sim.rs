//! The `sim` backend: a physical model of a GPU node, seeded and
//! deterministic.
//!
//! Each GPU is a lumped thermal mass heated by its power draw and cooled by
//! airflow:
//!
//! ```text
//! dT/dt = (P − (T − T_ambient) / R(fan)) / C        R(fan) = 1 / (G_passive + G_fan · (fan/100)^0.8)
//! ```
//!
//! Power follows the workload's utilisation, clipped by the power limit, the
//! clock lock and thermal slowdown. The fan follows the active curve (the
//! firmware's, or one the agent runs) with a few seconds of lag. Faults —
//! fan failure, heatsink degradation, load surges, NVLink misconfiguration,
//! ECC/XID errors, memory fragmentation, data-loader starvation, stalled
//! training — change the model's inputs, never its outputs directly.
//!
//! Calibration (tested): a loaded GPU on its default airflow settles at
//! 70–78 °C; with its fan failed it passes 90 °C within a few minutes.
//! Sensor noise comes from a hash of (seed, GPU, tick), so reading the model
//! never perturbs it and the same seed gives the same trace.

use std::sync::Mutex;

use super::{Backend, BackendError, Support};
use nightshift_proto::{FanPoint, GpuInfo, GpuTelemetry, NodeTelemetry, SimFault, Vendor, fan_curve_speed};

/// A GPU model's physical constants.
#[derive(Debug, Clone, PartialEq)]
pub struct SimProfile {
    /// Short key used in configs (`h100-sxm`).
    pub key: &'static str,
    /// Marketing name, as NVML/ROCm would report it.
    pub name: &'static str,
    pub vendor: Vendor,
    pub power_min_watts: f64,
    pub power_max_watts: f64,
    pub power_default_watts: f64,
    pub idle_watts: f64,
    /// Power drawn at 100 % utilisation with no limit in the way.
    pub load_watts: f64,
    pub mem_total_mib: u64,
    /// Thermal mass of die, package and heatsink.
    pub heat_capacity_j_per_k: f64,
    /// Conductance to the inlet air with no airflow.
    pub g_passive_w_per_k: f64,
    /// Extra conductance at 100 % airflow.
    pub g_fan_w_per_k: f64,
    /// Whether the GPU's fan can be driven (fanless SXM boards: no).
    pub fan_control: bool,
    /// Airflow from the chassis fans for boards without their own.
    pub chassis_airflow_pct: f64,
    pub slowdown_c: f64,
    pub shutdown_c: f64,
    pub clock_min_mhz: u32,
    pub clock_max_mhz: u32,
    /// Healthy GPU-to-GPU latency: NVLink ~5 µs, Infinity Fabric ~12 µs.
    pub p2p_latency_us: f64,
    /// Interconnect links per GPU.
    pub links_per_gpu: u32,
    /// Memory clock at full speed.
    pub mem_clock_mhz: u32,
    /// Whether the memory remaps rows on errors (A100 and later data
    /// centre boards; V100 retires pages instead).
    pub row_remap: bool,
    /// One link's bandwidth, one direction.
    pub link_gbytes_per_sec: f64,
}

/// The firmware's fan curve on boards with fans.
/// The firmware's fan curve on boards with fans: tuned for noise, it only
/// reaches full speed at 95 °C (which is why a steeper curve helps).
pub const FIRMWARE_FAN_CURVE: &[FanPoint] = &[
    FanPoint { temp_c: 40.0, speed_pct: 30.0 },
    FanPoint { temp_c: 65.0, speed_pct: 45.0 },
    FanPoint { temp_c: 80.0, speed_pct: 60.0 },
    FanPoint { temp_c: 90.0, speed_pct: 80.0 },
    FanPoint { temp_c: 95.0, speed_pct: 100.0 },
];

/// The models the simulator knows. Power ranges are the vendors' published
/// limits.
pub const PROFILES: &[SimProfile] = &[
    SimProfile {
        key: "h100-sxm",
        name: "NVIDIA H100 80GB HBM3",
        vendor: Vendor::Nvidia,
        power_min_watts: 200.0,
        power_max_watts: 700.0,
        power_default_watts: 700.0,
        idle_watts: 70.0,
        load_watts: 690.0,
        mem_total_mib: 81_559,
        heat_capacity_j_per_k: 1_200.0,
        g_passive_w_per_k: 3.0,
        g_fan_w_per_k: 14.1,
        fan_control: false,
        chassis_airflow_pct: 70.0,
        slowdown_c: 90.0,
        shutdown_c: 97.0,
        clock_min_mhz: 345,
        clock_max_mhz: 1_980,
        p2p_latency_us: 4.6,
        links_per_gpu: 18,
        mem_clock_mhz: 2619,
        row_remap: true,
        link_gbytes_per_sec: 25.0,
    },
    SimProfile {
        key: "b200",
        name: "NVIDIA B200",
        vendor: Vendor::Nvidia,
        power_min_watts: 200.0,
        power_max_watts: 1_000.0,
        power_default_watts: 1_000.0,
        idle_watts: 120.0,
        load_watts: 980.0,
        mem_total_mib: 183_359,
        heat_capacity_j_per_k: 1_700.0,
        g_passive_w_per_k: 4.0,
        g_fan_w_per_k: 20.4,
        fan_control: false,
        chassis_airflow_pct: 70.0,
        slowdown_c: 90.0,
        shutdown_c: 97.0,
        clock_min_mhz: 345,
        clock_max_mhz: 1_965,
        p2p_latency_us: 4.2,
        links_per_gpu: 18,
        mem_clock_mhz: 3996,
        row_remap: true,
        link_gbytes_per_sec: 50.0,
    },
    SimProfile {
        key: "mi300x",
        name: "AMD Instinct MI300X",
        vendor: Vendor::Amd,
        power_min_watts: 300.0,
        power_max_watts: 750.0,
        power_default_watts: 750.0,
        idle_watts: 140.0,
        load_watts: 735.0,
        mem_total_mib: 196_608,
        heat_capacity_j_per_k: 1_400.0,
        g_passive_w_per_k: 3.0,
        g_fan_w_per_k: 18.8,
        fan_control: true,
        chassis_airflow_pct: 70.0,
        slowdown_c: 90.0,
        shutdown_c: 100.0,
        clock_min_mhz: 500,
        clock_max_mhz: 2_100,
        p2p_latency_us: 12.0,
        links_per_gpu: 7,
        mem_clock_mhz: 1300,
        row_remap: false,
        link_gbytes_per_sec: 64.0,
    },
    SimProfile {
        key: "a100-sxm",
        name: "NVIDIA A100-SXM4-80GB",
        vendor: Vendor::Nvidia,
        power_min_watts: 100.0,
        power_max_watts: 400.0,
        power_default_watts: 400.0,
        idle_watts: 55.0,
        load_watts: 395.0,
        mem_total_mib: 81_920,
        heat_capacity_j_per_k: 900.0,
        g_passive_w_per_k: 1.8,
        g_fan_w_per_k: 8.0,
        fan_control: false,
        chassis_airflow_pct: 70.0,
        slowdown_c: 88.0,
        shutdown_c: 95.0,
        clock_min_mhz: 210,
        clock_max_mhz: 1_410,
        p2p_latency_us: 4.9,
        links_per_gpu: 12,
        mem_clock_mhz: 1593,
        row_remap: true,
        link_gbytes_per_sec: 25.0,
    },
    SimProfile {
        key: "v100-sxm",
        name: "Tesla V100-SXM2-32GB",
        vendor: Vendor::Nvidia,
        power_min_watts: 150.0,
        power_max_watts: 300.0,
        power_default_watts: 300.0,
        idle_watts: 40.0,
        load_watts: 295.0,
        mem_total_mib: 32_768,
        heat_capacity_j_per_k: 700.0,
        g_passive_w_per_k: 1.3,
        g_fan_w_per_k: 6.0,
        fan_control: false,
        chassis_airflow_pct: 70.0,
        slowdown_c: 87.0,
        shutdown_c: 92.0,
        clock_min_mhz: 135,
        clock_max_mhz: 1_530,
        p2p_latency_us: 5.0,
        links_per_gpu: 6,
        mem_clock_mhz: 877,
        row_remap: false,
        link_gbytes_per_sec: 25.0,
    },
    SimProfile {
        key: "rtx6000-ada",
        name: "NVIDIA RTX 6000 Ada Generation",
        vendor: Vendor::Nvidia,
        power_min_watts: 100.0,
        power_max_watts: 300.0,
        power_default_watts: 300.0,
        idle_watts: 25.0,
        load_watts: 296.0,
        mem_total_mib: 49_140,
        heat_capacity_j_per_k: 600.0,
        g_passive_w_per_k: 1.0,
        g_fan_w_per_k: 7.8,
        fan_control: true,
        chassis_airflow_pct: 0.0,
        slowdown_c: 90.0,
        shutdown_c: 96.0,
        clock_min_mhz: 210,
        clock_max_mhz: 2_505,
        p2p_latency_us: 9.0,
        links_per_gpu: 0,
        mem_clock_mhz: 10001,
        row_remap: false,
        link_gbytes_per_sec: 0.0,
    },
];

/// Find a profile by key (`h100-sxm`, `b200`, `mi300x`, …).
pub fn profile(key: &str) -> Option<&'static SimProfile> {
    PROFILES.iter().find(|p| p.key == key)
}

/// Every profile key, for error messages.
pub fn profile_keys() -> String {
    PROFILES.iter().map(|p| p.key).collect::<Vec<_>>().join(", ")
}

/// How to build a simulated node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Profile key, e.g. `h100-sxm`.
    #[serde(default = "default_profile")]
    pub profile: String,
    #[serde(default = "default_gpus")]
    pub gpus: u32,
    #[serde(default)]
    pub seed: u64,
    /// Inlet air temperature.
    #[serde(default = "default_ambient")]
    pub ambient_c: f64,
    /// Workload utilisation at start.
    #[serde(default = "default_util")]
    pub util_pct: f64,
    /// Memory in use at start.
    #[serde(default = "default_mem_used")]
    pub mem_used_pct: f64,
    /// Start at the loaded steady state instead of at ambient.
    #[serde(default = "yes")]
    pub start_warm: bool,
}

fn default_profile() -> String {
    "h100-sxm".into()
}

impl SimConfig {
    /// What `SimBackend::new` would refuse, found at config-check time:
    /// `(key, message)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if profile(&self.profile).is_none() {
            return Err((
                "profile",
                format!("sim: unknown profile `{}`: expected one of {}", self.profile, profile_keys()),
            ));
        }
        if !(1..=16).contains(&self.gpus) {
            return Err(("gpus", format!("sim: gpus must be 1 to 16, found {}", self.gpus)));
        }
        for (key, v, lo, hi) in [
            ("ambient_c", self.ambient_c, -20.0, 60.0),
            ("util_pct", self.util_pct, 0.0, 100.0),
            ("mem_used_pct", self.mem_used_pct, 0.0, 100.0),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err((key, format!("sim.{key}: expected {lo} to {hi}, found {v}")));
            }
        }
        Ok(())
    }
}
fn default_gpus() -> u32 {
    8
}
fn default_ambient() -> f64 {
    30.0
}
fn default_util() -> f64 {
    85.0
}
fn default_mem_used() -> f64 {
    62.0
}
fn yes() -> bool {
    true
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            profile: default_profile(),
            gpus: default_gpus(),
            seed: 0,
            ambient_c: default_ambient(),
            util_pct: default_util(),
            mem_used_pct: default_mem_used(),
            start_warm: true,
        }
    }
}

#[derive(Debug, Clone)]
struct GpuState {
    temp_c: f64,
    fan_actual_pct: f64,
    /// Commanded speed; `None` is firmware control.
    fan_cmd_pct: Option<f64>,
    fan_failed: bool,
    heatsink_factor: f64,
    /// A slow degradation in progress: (factor per second, final factor).
    heatsink_ramp: Option<(f64, f64)>,
    util_target_pct: f64,
    surge: f64,
    power_limit_watts: f64,
    power_watts: f64,
    clocks_locked: Option<(u32, u32)>,
    sm_clock_mhz: u32,
    mem_used_pct: f64,
    frag_pct: f64,
    sbe: u64,
    dbe: u64,
    xid_last: Option<u32>,
    drained: bool,
    throttled: bool,
    util_now_pct: f64,
    /// Energy since the driver loaded.
    energy_mj: f64,
    /// Bytes moved over this GPU's links.
    nvlink_bytes: f64,
}

#[derive(Debug, Clone)]
struct NodeState {
    t_secs: f64,
    ticks: u64,
    nvlink_fault: bool,
    nvlink_config_bad: bool,
    /// Managed configs whose current content breaks GPU-to-GPU traffic.
    bad_configs: std::collections::BTreeSet<String>,
    nvlink_errors: f64,
    cpu_bottleneck: bool,
    util_swing: bool,
    job_stall: bool,
    comm_overhead_override: Option<f64>,
    job_progress: f64,
}

impl NodeState {
    fn nvlink_bad(&self) -> bool {
        self.nvlink_fault || self.nvlink_config_bad
    }
}

#[derive(Debug)]
struct SimState {
    gpus: Vec<GpuState>,
    node: NodeState,
    /// The node's jobs were requeued (moved off); cleared when it resumes.
    requeued: bool,
}

/// The simulated node.
#[derive(Debug)]
pub struct SimBackend {
    profile: &'static SimProfile,
    config: SimConfig,
    info: Vec<GpuInfo>,
    state: Mutex<SimState>,
    /// Where the "hardware" keeps its settings across agent restarts.
    persist: Option<std::path::PathBuf>,
}

/// What a GPU keeps when the agent process restarts: its settings and its
/// error counters (the physics starts over).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct PersistedGpu {
    power_limit_watts: f64,
    fan_cmd_pct: Option<f64>,
    clocks_locked: Option<(u32, u32)>,
    drained: bool,
    sbe: u64,
    dbe: u64,
}

/// Spare rows for remapping on a simulated board; past them a remap fails.
const SPARE_ROWS: u64 = 512;

/// The PCI addresses of an HGX baseboard's eight GPUs, in NVML's format.
const HGX_BUS_IDS: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// A GPU's PCI address on the simulated board.
fn sim_pci_bus_id(i: u32) -> String {
    let bus = HGX_BUS_IDS.get(i as usize).copied().unwrap_or(0xe0u8.wrapping_add(i as u8));
    format!("00000000:{bus:02X}:00.0")
}

/// SplitMix64: a tiny, well-mixed hash for deterministic noise.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Noise in [-1, 1] from (seed, gpu, tick, channel).
fn noise(seed: u64, gpu: u32, tick: u64, channel: u64) -> f64 {
    let h = mix(seed ^ mix(gpu as u64 ^ mix(tick ^ mix(channel))));
    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

impl SimBackend {
    /// Keep the GPUs' settings and error counters in `path`, as hardware
    /// keeps them while the agent restarts; load them now if present.
    pub fn persist_to(self, path: std::path::PathBuf) -> SimBackend {
        if let Ok(bytes) = std::fs::read(&path) {
            match serde_json::from_slice::<Vec<PersistedGpu>>(&bytes) {
                Ok(saved) => {
                    let mut st = self.lock();
                    for (g, p) in st.gpus.iter_mut().zip(saved) {
                        g.power_limit_watts = p.power_limit_watts;
                        g.fan_cmd_pct = p.fan_cmd_pct;
                        g.clocks_locked = p.clocks_locked;
                        g.drained = p.drained;
                        g.sbe = p.sbe;
                        g.dbe = p.dbe;
                    }
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "sim: ignoring unreadable hardware state"),
            }
        }
        SimBackend { persist: Some(path), ..self }
    }

    fn save(&self) {
        let Some(path) = &self.persist else { return };
        let saved: Vec<PersistedGpu> = self
            .lock()
            .gpus
            .iter()
            .map(|g| PersistedGpu {
                power_limit_watts: g.power_limit_watts,
                fan_cmd_pct: g.fan_cmd_pct,
                clocks_locked: g.clocks_locked,
                drained: g.drained,
                sbe: g.sbe,
                dbe: g.dbe,
            })
            .collect();
        let bytes = serde_json::to_vec(&saved).unwrap_or_default();
        if let Err(e) = nightshift_proto::fsutil::write_atomic(path, &bytes) {
            tracing::warn!(path = %path.display(), error = %e, "sim: cannot save hardware state");
        }
    }

    /// Build a node from its config, or say which profile keys exist.
    pub fn new(config: SimConfig) -> Result<SimBackend, BackendError> {
        config.check().map_err(|(_, m)| BackendError::Unavailable(m))?;
        let profile = profile(&config.profile).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "sim: unknown profile `{}`: expected one of {}",
                config.profile,
                profile_keys()
            ))
        })?;
        if config.gpus == 0 || config.gpus > 16 {
            return Err(BackendError::Unavailable(format!("sim: gpus must be 1 to 16, found {}", config.gpus)));
        }
        let info = (0..config.gpus)
            .map(|i| GpuInfo {
                uuid: Some(format!("GPU-sim-{:08x}-{i:02}", mix(config.seed) as u32)),
                power_min_watts: profile.power_min_watts,
                power_max_watts: profile.power_max_watts,
                power_default_watts: profile.power_default_watts,
                mem_total_mib: profile.mem_total_mib,
                fan_control: profile.fan_control,
                slowdown_temp_c: Some(profile.slowdown_c),
                shutdown_temp_c: Some(profile.shutdown_c),
                clock_min_mhz: Some(profile.clock_min_mhz),
                clock_max_mhz: Some(profile.clock_max_mhz),
                pci_bus_id: Some(sim_pci_bus_id(i)),
                ..GpuInfo::new(i, profile.name, profile.vendor)
            })
            .collect();
        let gpus = (0..config.gpus)
            .map(|_| GpuState {
                temp_c: config.ambient_c,
                fan_actual_pct: if profile.fan_control { 30.0 } else { profile.chassis_airflow_pct },
                fan_cmd_pct: None,
                fan_failed: false,
                heatsink_factor: 1.0,
                heatsink_ramp: None,
                util_target_pct: config.util_pct,
                surge: 1.0,
                power_limit_watts: profile.power_default_watts,
                power_watts: profile.idle_watts,
                clocks_locked: None,
                sm_clock_mhz: profile.clock_max_mhz,
                mem_used_pct: config.mem_used_pct,
                frag_pct: 4.0,
                sbe: 0,
                dbe: 0,
                xid_last: None,
                drained: false,
                throttled: false,
                util_now_pct: config.util_pct,
                energy_mj: 0.0,
                nvlink_bytes: 0.0,
            })
            .collect();
        let sim = SimBackend {
            profile,
            info,
            state: Mutex::new(SimState {
                gpus,
                node: NodeState {
                    t_secs: 0.0,
                    ticks: 0,
                    nvlink_fault: false,
                    nvlink_config_bad: false,
                    bad_configs: Default::default(),
                    nvlink_errors: 0.0,
                    cpu_bottleneck: false,
                    util_swing: false,
                    job_stall: false,
                    comm_overhead_override: None,
                    job_progress: 0.0,
                },
                requeued: false,
            }),
            config,
            persist: None,
        };
        if sim.config.start_warm {
            // Settle to the loaded steady state (20 simulated minutes), then
            // reset the clock-derived counters.
            sim.step(1_200.0);
            let mut st = sim.lock();
            st.node.t_secs = 0.0;
            st.node.job_progress = 0.0;
        }
        Ok(sim)
    }

    /// The profile this node is built from.
    pub fn profile(&self) -> &'static SimProfile {
        self.profile
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_gpu(&self, gpu: u32) -> Result<usize, BackendError> {
        if (gpu as usize) < self.info.len() {
            Ok(gpu as usize)
        } else {
            Err(BackendError::NoSuchGpu { index: gpu, count: self.info.len() as u32 })
        }
    }

    /// Advance the model by `dt_secs` of simulated time.
    /// Whether the node's jobs were requeued (and have not come back).
    pub fn jobs_requeued(&self) -> bool {
        self.lock().requeued
    }

    /// The node takes work again (it was resumed).
    pub fn clear_requeued(&self) {
        self.lock().requeued = false;
    }

    pub fn step(&self, dt_secs: f64) {
        if dt_secs <= 0.0 || !dt_secs.is_finite() {
            return;
        }
        let mut st = self.lock();
        let mut remaining = dt_secs;
        while remaining > 1e-9 {
            let dt = remaining.min(0.5);
            remaining -= dt;
            self.substep(&mut st, dt);
        }
        st.node.ticks += 1;
    }

    fn substep(&self, st: &mut SimState, dt: f64) {
        let p = self.profile;
        let ambient = self.config.ambient_c;
        let t = st.node.t_secs;
        let node = st.node.clone();
        let mut compute_sum = 0.0;
        for g in st.gpus.iter_mut() {
            // Cooling that degrades slowly.
            if let Some((rate, target)) = g.heatsink_ramp {
                g.heatsink_factor += rate * dt;
                if (rate >= 0.0 && g.heatsink_factor >= target) || (rate < 0.0 && g.heatsink_factor <= target) {
                    g.heatsink_factor = target;
                    g.heatsink_ramp = None;
                }
            }
            // Workload.
            let mut util = g.util_target_pct;
            if node.cpu_bottleneck {
                util = util.min(12.0);
            }
            if node.util_swing {
                // Topology-blind all-reduce: compute phases alternate with
                // long communication stalls, 40 s period.
                let phase = (t / 40.0).fract();
                util = if phase < 0.5 { util.max(90.0) } else { util.min(25.0) };
            }
            if g.drained {
                util = util.min(2.0);
            }
            g.util_now_pct = util;
            let mut demand = p.idle_watts + (p.load_watts - p.idle_watts) * util / 100.0 * g.surge;
            if let Some((_, max_mhz)) = g.clocks_locked {
                let f = (max_mhz as f64 / p.clock_max_mhz as f64).clamp(0.05, 1.0);
                demand = p.idle_watts + (demand - p.idle_watts) * f;
            }
            // Thermal slowdown pulls the effective cap down as the die heats
            // past the slowdown threshold.
            let thermal = if g.temp_c > p.slowdown_c {
                (1.0 - (g.temp_c - p.slowdown_c) / (p.shutdown_c - p.slowdown_c)).clamp(0.1, 1.0)
            } else {
                1.0
            };
            let cap = (g.power_limit_watts * thermal).max(p.idle_watts);
            g.throttled = thermal < 1.0 && demand > cap;
            let power = demand.min(cap);
            // Power follows demand within about a second.
            g.power_watts += (power - g.power_watts) * (1.0 - (-dt / 0.8).exp());
            let share = if demand > p.idle_watts {
                ((g.power_watts - p.idle_watts) / (demand - p.idle_watts)).clamp(0.0, 1.0)
            } else {
                1.0
            };
            g.sm_clock_mhz = ((p.clock_min_mhz as f64) + (p.clock_max_mhz - p.clock_min_mhz) as f64 * share.powf(0.7))
                .round() as u32;
            if let Some((_, max_mhz)) = g.clocks_locked {
                g.sm_clock_mhz = g.sm_clock_mhz.min(max_mhz);
            }
            compute_sum += share * util / 100.0;

            // Airflow.
            let fan_target = if g.fan_failed {
                0.0
            } else if p.fan_control {
                g.fan_cmd_pct.unwrap_or_else(|| fan_curve_speed(FIRMWARE_FAN_CURVE, g.temp_c))
            } else {
                p.chassis_airflow_pct
            };
            g.fan_actual_pct += (fan_target - g.fan_actual_pct) * (1.0 - (-dt / 3.0).exp());
            let airflow = (g.fan_actual_pct / 100.0).clamp(0.0, 1.0);
            let conductance = (p.g_passive_w_per_k + p.g_fan_w_per_k * airflow.powf(0.8)) / g.heatsink_factor;
            // dT/dt = (P − (T − T_amb)/R) / C
            let d_temp = (g.power_watts - conductance * (g.temp_c - ambient)) / p.heat_capacity_j_per_k * dt;
            g.temp_c += d_temp;

            // Counters: energy is the integral of power; link traffic is
            // the communication share of the job, at the links' rate.
            g.energy_mj += g.power_watts * dt * 1000.0;
            let comm = self.comm_overhead_pct(&node) / 100.0;
            g.nvlink_bytes += p.link_gbytes_per_sec * 1e9 * p.links_per_gpu as f64 * comm * util / 100.0 * dt
                / if node.nvlink_bad() { 3.0 } else { 1.0 };

            // Fragmentation creeps up with job churn.
            g.frag_pct = (g.frag_pct + dt / 3600.0 * 0.2 * util / 100.0).min(95.0);
        }
        let n = st.gpus.len().max(1) as f64;
        if !node.job_stall {
            let overhead = self.comm_overhead_pct(&node) / 100.0;
            st.node.job_progress += dt * compute_sum / n * (1.0 - overhead);
        }
        if node.nvlink_bad() {
            st.node.nvlink_errors += 40.0 * dt;
        }
        st.node.t_secs += dt;
    }

    fn comm_overhead_pct(&self, node: &NodeState) -> f64 {
        if let Some(v) = node.comm_overhead_override {
            return v;
        }
        if node.nvlink_bad() { 34.0 } else { 9.0 }
    }

    /// Apply a fault or workload change.
    pub fn inject(&self, fault: &SimFault) -> Result<(), BackendError> {
        let mut st = self.lock();
        let all: Vec<usize> = (0..st.gpus.len()).collect();
        let pick = |gpu: Option<u32>| -> Result<Vec<usize>, BackendError> {
            match gpu {
                Some(g) => Ok(vec![self.check_gpu(g)?]),
                None => Ok(all.clone()),
            }
        };
        match fault {
            SimFault::FanFailure { gpu } => st.gpus[self.check_gpu(*gpu)?].fan_failed = true,
            SimFault::FanRepair { gpu } => st.gpus[self.check_gpu(*gpu)?].fan_failed = false,
            SimFault::HeatsinkDegradation { gpu, factor } => {
                if !(1.0..=10.0).contains(factor) {
                    return Err(failed(format!("heatsink factor must be 1 to 10, found {factor}")));
                }
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.heatsink_factor = *factor;
                g.heatsink_ramp = None;
            }
            SimFault::HeatsinkRamp { gpu, factor, over_secs } => {
                if !(1.0..=10.0).contains(factor) || !(1..=7 * 86_400).contains(over_secs) {
                    return Err(failed(format!(
                        "heatsink ramp: expected factor 1 to 10 and over_secs 1 to 604800, found {factor} and {over_secs}"
                    )));
                }
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.heatsink_ramp = Some(((factor - g.heatsink_factor) / *over_secs as f64, *factor));
            }
            SimFault::Load { gpu, util_pct } => {
                let u = check_pct("util_pct", *util_pct)?;
                for i in pick(*gpu)? {
                    st.gpus[i].util_target_pct = u;
                }
            }
            SimFault::LoadSurge { gpu, factor } => {
                if !(0.1..=2.0).contains(factor) {
                    return Err(failed(format!("surge factor must be 0.1 to 2, found {factor}")));
                }
                for i in pick(*gpu)? {
                    st.gpus[i].surge = *factor;
                }
            }
            SimFault::NvlinkMisconfig { active } => st.node.nvlink_fault = *active,
            SimFault::EccDbe { gpu, count } => {
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.dbe += count;
                g.xid_last = Some(48);
            }
            SimFault::Xid { gpu, code } => st.gpus[self.check_gpu(*gpu)?].xid_last = Some(*code),
            SimFault::Fragmentation { gpu, pct } => {
                st.gpus[self.check_gpu(*gpu)?].frag_pct = check_pct("pct", *pct)?;
            }
            SimFault::MemoryUsed { gpu, pct } => {
                let v = check_pct("pct", *pct)?;
                for i in pick(*gpu)? {
                    st.gpus[i].mem_used_pct = v;
                }
            }
            SimFault::CpuBottleneck { active } => st.node.cpu_bottleneck = *active,
            SimFault::UtilSwing { active } => st.node.util_swing = *active,
            SimFault::JobStall { active } => st.node.job_stall = *active,
            SimFault::CommOverhead { pct } => st.node.comm_overhead_override = Some(check_pct("pct", *pct)?),
            SimFault::PersonDrain { .. } => {
                return Err(failed("person_drain is handled by the node's scheduler adapter".into()));
            }
            SimFault::Clear {} => {
                for g in st.gpus.iter_mut() {
                    g.fan_failed = false;
                    g.heatsink_factor = 1.0;
                    g.heatsink_ramp = None;
                    g.surge = 1.0;
                    g.util_target_pct = self.config.util_pct;
                    g.mem_used_pct = self.config.mem_used_pct;
                }
                st.node.nvlink_fault = false;
                st.node.cpu_bottleneck = false;
                st.node.util_swing = false;
                st.node.job_stall = false;
                st.node.comm_overhead_override = None;
            }
        }
        Ok(())
    }

    /// Current die temperature, without noise (for tests).
    pub fn true_temperature_c(&self, gpu: u32) -> f64 {
        self.lock().gpus.get(gpu as usize).map(|g| g.temp_c).unwrap_or(f64::NAN)
    }

    /// Simulated seconds since start.
    pub fn elapsed_secs(&self) -> f64 {
        self.lock().node.t_secs
    }
}

fn failed(message: String) -> BackendError {
    BackendError::Failed { backend: "sim", message }
}

fn check_pct(field: &str, v: f64) -> Result<f64, BackendError> {
    if (0.0..=100.0).contains(&v) { Ok(v) } else { Err(failed(format!("{field} must be 0 to 100, found {v}"))) }
}

/// Whether a config file's content breaks GPU-to-GPU P2P the way the field
/// reports describe: NCCL told to avoid NVLink P2P entirely.
pub fn config_breaks_p2p(content: &str) -> bool {
    content.lines().map(str::trim).any(|l| {
        let l = l.strip_prefix("export ").unwrap_or(l);
        // NCCL told to avoid P2P; or the NVSwitch fabric manager put into a
        // shared (virtualised) fabric mode on a bare-metal host, which
        // leaves the NVLink partitions unset.
        l == "NCCL_P2P_DISABLE=1"
            || l == "NCCL_P2P_LEVEL=LOC"
            || l.replace(' ', "") == "FABRIC_MODE=1"
            || l.replace(' ', "") == "FABRIC_MODE=2"
    })
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.info
    }

    fn driver_version(&self) -> Option<String> {
        Some(format!("sim-{}", env!("CARGO_PKG_VERSION")))
    }

    fn sample(&self) -> Result<(Vec<GpuTelemetry>, NodeTelemetry), BackendError> {
        let st = self.lock();
        let seed = self.config.seed;
        let tick = st.node.ticks;
        let p = self.profile;
        let ambient = self.config.ambient_c;
        let gpus = st
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let i = i as u32;
                GpuTelemetry {
                    index: i,
                    temperature_c: round2(g.temp_c + 0.2 * noise(seed, i, tick, 1)),
                    power_watts: round2(g.power_watts * (1.0 + 0.01 * noise(seed, i, tick, 2))),
                    power_limit_watts: g.power_limit_watts,
                    fan_pct: p.fan_control.then(|| round2(g.fan_actual_pct)),
                    util_pct: round2((g.util_now_pct + 1.5 * noise(seed, i, tick, 3)).clamp(0.0, 100.0)),
                    mem_used_pct: round2(g.mem_used_pct),
                    mem_fragmentation_pct: Some(round2(g.frag_pct)),
                    sm_clock_mhz: Some(g.sm_clock_mhz),
                    ecc_sbe_total: g.sbe,
                    ecc_dbe_total: g.dbe,
                    // Like DCGM's gauge: 0 until the first XID.
                    xid_last: Some(g.xid_last.unwrap_or(0)),
                    throttled: g.throttled,
                    gpu_drained: g.drained,
                    mem_clock_mhz: Some(p.mem_clock_mhz),
                    // HBM runs a little hotter than the die it sits beside.
                    mem_temperature_c: Some(round2(ambient + (g.temp_c - ambient) * 1.08)),
                    energy_mj: Some(g.energy_mj as u64),
                    // The simulator models no PCIe faults: no retries.
                    pcie_replay_total: Some(0),
                    nvlink_bytes_total: (p.links_per_gpu > 0).then_some(g.nvlink_bytes as u64),
                    // Each uncorrectable error takes a spare row; a
                    // correctable one does after repeated hits on its row.
                    remapped_rows_correctable: p.row_remap.then_some(g.sbe / 64),
                    remapped_rows_uncorrectable: p.row_remap.then_some(g.dbe.min(SPARE_ROWS)),
                    row_remap_failure: p.row_remap.then_some(g.dbe > SPARE_ROWS),
                }
            })
            .collect();
        let node = &st.node;
        let n = self.info.len() as u32;
        let links_total = p.links_per_gpu * n;
        let bad = node.nvlink_bad();
        let node_t = NodeTelemetry {
            cpu_util_pct: Some(round2(
                (if node.cpu_bottleneck { 97.0 } else { 45.0 } + 1.0 * noise(seed, 99, tick, 4)).clamp(0.0, 100.0),
            )),
            nvlink_links_up: (links_total > 0).then(|| if bad { links_total - links_total / 3 } else { links_total }),
            nvlink_links_total: (links_total > 0).then_some(links_total),
            nvlink_errors_total: (links_total > 0).then_some(node.nvlink_errors as u64),
            nvlink_p2p_latency_us: Some(round2(
                if bad { 50.0 } else { p.p2p_latency_us } * (1.0 + 0.03 * noise(seed, 99, tick, 5)),
            )),
            allreduce_p99_ms: Some(round2(if bad { 8.5 } else { 2.2 } * (1.0 + 0.05 * noise(seed, 99, tick, 6)))),
            comm_overhead_pct: Some(round2(self.comm_overhead_pct(node))),
            job_progress: Some((node.job_progress * 1000.0).round() / 1000.0),
            drained: false,
            drain_reason: None,
            hands_off: false,
            holds: Vec::new(),
            ended_holds: Vec::new(),
        };
        Ok((gpus, node_t))
    }

    fn set_power_limit(&self, gpu: u32, watts: f64) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        let p = self.profile;
        if !(p.power_min_watts..=p.power_max_watts).contains(&watts) {
            return Err(failed(format!(
                "power limit {watts} W outside the device range {}–{} W",
                p.power_min_watts, p.power_max_watts
            )));
        }
        self.lock().gpus[i].power_limit_watts = watts;
        self.save();
        Ok(Support::Done(()))
    }

    fn set_fan_speed(&self, gpu: u32, pct: f64) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        if !self.profile.fan_control {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.profile.name)));
        }
        self.lock().gpus[i].fan_cmd_pct = Some(pct.clamp(0.0, 100.0));
        self.save();
        Ok(Support::Done(()))
    }

    fn reset_fan(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        if !self.profile.fan_control {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.profile.name)));
        }
        self.lock().gpus[i].fan_cmd_pct = None;
        self.save();
        Ok(Support::Done(()))
    }

    fn set_clocks(&self, gpu: u32, min_mhz: u32, max_mhz: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        self.lock().gpus[i].clocks_locked = Some((min_mhz, max_mhz));
        self.save();
        Ok(Support::Done(()))
    }

    fn reset_clocks(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        self.lock().gpus[i].clocks_locked = None;
        self.save();
        Ok(Support::Done(()))
    }

    fn clear_ecc(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        let mut st = self.lock();
        st.gpus[i].sbe = 0;
        st.gpus[i].dbe = 0;
        drop(st);
        self.save();
        Ok(Support::Done(()))
    }

    fn set_gpu_drain(&self, gpu: u32, drained: bool) -> Result<Support<()>, BackendError> {
        let i = self.check_gpu(gpu)?;
        self.lock().gpus[i].drained = drained;
        self.save();
        Ok(Support::Done(()))
    }

    fn on_jobs_requeued(&self) {
        // The jobs leave: the GPUs idle until new work is placed (the
        // workload model places none on a drained node).
        let mut st = self.lock();
        st.requeued = true;
        for g in st.gpus.iter_mut() {
            g.util_target_pct = 0.0;
        }
    }

    fn on_caches_flushed(&self) {
        // Jobs that registered for the signal release their cached blocks
        // (torch.cuda.empty_cache()); fragmentation drops to a fresh start.
        let mut st = self.lock();
        for g in st.gpus.iter_mut() {
            g.frag_pct = g.frag_pct.min(3.0);
        }
    }

    fn on_config_applied(&self, name: &str, content: &str) {
        let mut st = self.lock();
        if config_breaks_p2p(content) {
            st.node.bad_configs.insert(name.to_string());
        } else {
            st.node.bad_configs.remove(name);
        }
        st.node.nvlink_config_bad = !st.node.bad_configs.is_empty();
    }

    fn sim(&self) -> Option<&SimBackend> {
        Some(self)
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(profile: &str, seed: u64) -> SimBackend {
        SimBackend::new(SimConfig { profile: profile.into(), gpus: 2, seed, ..SimConfig::default() }).unwrap()
    }

    fn run(sim: &SimBackend, secs: u32) {
        for _ in 0..secs {
            sim.step(1.0);
        }
    }

    #[test]
    fn loaded_gpus_settle_in_the_calibrated_band() {
        for p in PROFILES {
            let sim = node(p.key, 1);
            run(&sim, 600);
            let t = sim.true_temperature_c(0);
            eprintln!("{}: {t:.1} °C", p.key);
            assert!((70.0..=78.0).contains(&t), "{}: steady state {t:.1} °C outside 70–78 °C", p.key);
        }
    }

    #[test]
    fn a_failed_fan_passes_90_c_within_minutes() {
        for p in PROFILES {
            let sim = node(p.key, 2);
            sim.inject(&SimFault::FanFailure { gpu: 0 }).unwrap();
            let mut crossed_at = None;
            for s in 0..600 {
                sim.step(1.0);
                if sim.true_temperature_c(0) > 90.0 {
                    crossed_at = Some(s);
                    break;
                }
            }
            let at = crossed_at.unwrap_or_else(|| panic!("{}: never passed 90 °C", p.key));
            assert!(at <= 300, "{}: took {at} s", p.key);
            // The healthy neighbour is unaffected.
            assert!(sim.true_temperature_c(1) < 80.0);
        }
    }

    #[test]
    fn a_lower_power_limit_cools_the_gpu() {
        let sim = node("h100-sxm", 3);
        run(&sim, 60);
        let hot = sim.true_temperature_c(0);
        sim.set_power_limit(0, 400.0).unwrap();
        run(&sim, 600);
        let cool = sim.true_temperature_c(0);
        assert!(cool < hot - 10.0, "400 W cap: {hot:.1} → {cool:.1} °C");
        let (gpus, _) = sim.sample().unwrap();
        assert!(gpus[0].power_watts <= 404.0, "power {} above the 400 W limit", gpus[0].power_watts);
    }

    #[test]
    fn fan_curve_commands_change_temperature_on_boards_with_fans() {
        let sim = node("mi300x", 4);
        run(&sim, 60);
        let before = sim.true_temperature_c(0);
        assert_eq!(sim.set_fan_speed(0, 100.0).unwrap(), Support::Done(()));
        run(&sim, 600);
        assert!(sim.true_temperature_c(0) < before - 5.0);
        let fanless = node("h100-sxm", 4);
        assert!(matches!(fanless.set_fan_speed(0, 100.0).unwrap(), Support::NotSupported(_)));
    }

    #[test]
    fn nvlink_misconfiguration_raises_latency_and_errors() {
        let sim = node("h100-sxm", 5);
        run(&sim, 10);
        let (_, healthy) = sim.sample().unwrap();
        assert!(healthy.nvlink_p2p_latency_us.unwrap() < 6.0);
        assert!(healthy.allreduce_p99_ms.unwrap() < 5.0);
        sim.on_config_applied("nccl-env", "NCCL_DEBUG=WARN\nNCCL_P2P_DISABLE=1\n");
        run(&sim, 10);
        let (_, bad) = sim.sample().unwrap();
        assert!(bad.nvlink_p2p_latency_us.unwrap() > 40.0);
        assert!(bad.allreduce_p99_ms.unwrap() > 5.0);
        assert!(bad.nvlink_errors_total.unwrap() > healthy.nvlink_errors_total.unwrap());
        assert!(bad.nvlink_links_up < bad.nvlink_links_total);
        run(&sim, 10);
        let (_, later) = sim.sample().unwrap();
        assert!(later.nvlink_errors_total > bad.nvlink_errors_total, "error counters keep rising");
        sim.on_config_applied("nccl-env", "NCCL_DEBUG=WARN\n");
        run(&sim, 2);
        let (_, fixed) = sim.sample().unwrap();
        assert!(fixed.nvlink_p2p_latency_us.unwrap() < 6.0);
    }

    #[test]
    fn same_seed_gives_the_same_trace() {
        let trace = |seed| {
            let sim = node("b200", seed);
            sim.inject(&SimFault::LoadSurge { gpu: Some(1), factor: 1.2 }).unwrap();
            (0..120)
                .map(|_| {
                    sim.step(1.0);
                    serde_json::to_string(&sim.sample().unwrap().0).unwrap()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(trace(7), trace(7));
        assert_ne!(trace(7), trace(8));
    }

    #[test]
    fn faults_change_what_they_should() {
        let sim = node("a100-sxm", 6);
        sim.inject(&SimFault::EccDbe { gpu: 1, count: 2 }).unwrap();
        sim.inject(&SimFault::Fragmentation { gpu: 0, pct: 31.0 }).unwrap();
        sim.inject(&SimFault::CpuBottleneck { active: true }).unwrap();
        run(&sim, 30);
        let (gpus, n) = sim.sample().unwrap();
        assert_eq!(gpus[1].ecc_dbe_total, 2);
        assert_eq!(gpus[1].xid_last, Some(48));
        assert!(gpus[0].mem_fragmentation_pct.unwrap() > 30.0);
        assert!(gpus[0].util_pct < 20.0 && n.cpu_util_pct.unwrap() > 90.0);
        sim.on_caches_flushed();
        assert!(sim.sample().unwrap().0[0].mem_fragmentation_pct.unwrap() <= 3.0);
        let p0 = n.job_progress.unwrap();
        sim.inject(&SimFault::JobStall { active: true }).unwrap();
        run(&sim, 30);
        assert_eq!(sim.sample().unwrap().1.job_progress.unwrap(), p0);
        assert!(sim.inject(&SimFault::Load { gpu: Some(9), util_pct: 5.0 }).is_err());
        assert!(sim.inject(&SimFault::Load { gpu: None, util_pct: 500.0 }).is_err());
    }

    #[test]
    fn unknown_profiles_name_the_known_ones() {
        let err = SimBackend::new(SimConfig { profile: "h300".into(), ..SimConfig::default() }).unwrap_err();
        assert!(err.to_string().contains("expected one of h100-sxm, b200, mi300x"), "{err}");
    }
}
