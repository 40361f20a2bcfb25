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
//!
//! Never kinder than hardware (DESIGN.md, "Simulated hardware"), each with a
//! test below:
//! - temperatures are whole degrees with about ±1 °C of jitter, as NVML
//!   reports them; AMD Instinct reports its *junction* (hotspot) sensor,
//!   which runs well above the die average under load;
//! - boards without GPU fans (HGX SXM, AMD OAM) are cooled by node-level
//!   chassis fans behind the BMC; a chassis airflow fault heats every GPU;
//! - a cache flush helps only the GPUs whose process registered for the
//!   signal and answers, and can fail;
//! - a managed config takes effect only when its consumer restarts (the
//!   jobs for the NCCL environment, the unit for the fabric manager); a bad
//!   config raises P2P latency with every link up, a physical link fault
//!   takes links down and drives their error counters;
//! - a hung job goes silent: its training loop stops writing progress (the
//!   agent drops the stale reading after 120 s) while its heartbeat says how
//!   long since progress last advanced, and its GPUs spin;
//! - a GPU that fell off the bus stops reporting while its neighbours go
//!   on, and its job hangs, until a person resets it;
//! - load can change in phases; slow faults are slow (a heatsink ramp).

use std::sync::Mutex;

use super::{Backend, BackendError, FlushOutcome, PcieLink, Support};
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
    /// The sensor `temperature_c` reads (`gpu`, or AMD's `junction`).
    pub sensor: &'static str,
    /// How far the reported sensor runs above the die average, per kW
    /// drawn (a junction hotspot; 0 for NVIDIA's GPU sensor).
    pub hotspot_c_per_kw: f64,
    /// The HBM's maximum operating temperature (`None`: GDDR, no HBM
    /// reading): past it the memory slows the GPU like heat on the die.
    /// 95 °C on every HBM board here: nvidia-smi's "Memory Max Operating
    /// Temp" on A100 and H100; modelled, not read from a datasheet, for the
    /// others (the real agent reads each device's own threshold).
    pub mem_max_c: Option<f64>,
    /// How far the HBM sits above the inlet, as a multiple of the die's rise.
    pub hbm_rise_per_die_rise: f64,
}

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
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: Some(95.0),
        hbm_rise_per_die_rise: 1.08,
    },
    SimProfile {
        key: "h200-sxm",
        name: "NVIDIA H200",
        vendor: Vendor::Nvidia,
        power_min_watts: 200.0,
        power_max_watts: 700.0,
        power_default_watts: 700.0,
        idle_watts: 75.0,
        load_watts: 690.0,
        mem_total_mib: 143_771,
        heat_capacity_j_per_k: 1_250.0,
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
        mem_clock_mhz: 3201,
        row_remap: true,
        link_gbytes_per_sec: 25.0,
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: Some(95.0),
        // Six HBM3e stacks at a higher rate than the H100's five HBM3:
        // the memory runs further above the die.
        hbm_rise_per_die_rise: 1.15,
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
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: Some(95.0),
        hbm_rise_per_die_rise: 1.08,
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
        g_fan_w_per_k: 16.0,
        fan_control: false,
        chassis_airflow_pct: 70.0,
        slowdown_c: 100.0,
        shutdown_c: 110.0,
        clock_min_mhz: 500,
        clock_max_mhz: 2_100,
        p2p_latency_us: 12.0,
        links_per_gpu: 7,
        mem_clock_mhz: 1300,
        row_remap: false,
        link_gbytes_per_sec: 64.0,
        sensor: "junction",
        hotspot_c_per_kw: 20.0,
        mem_max_c: Some(95.0),
        hbm_rise_per_die_rise: 1.0,
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
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: Some(95.0),
        hbm_rise_per_die_rise: 1.08,
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
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: Some(95.0),
        hbm_rise_per_die_rise: 1.08,
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
        sensor: "gpu",
        hotspot_c_per_kw: 0.0,
        mem_max_c: None,
        hbm_rise_per_die_rise: 1.08,
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

/// The clocks-event reasons NVML would report for a GPU's state (names as
/// in `nightshift_proto::THROTTLE_REASONS`).
fn throttle_reasons(g: &GpuState) -> Vec<String> {
    let mut out = Vec::new();
    if g.util_now_pct < 1.0 && !g.lost {
        out.push("gpu_idle".to_string());
    }
    if g.power_capped {
        out.push("sw_power_cap".to_string());
    }
    if g.throttled {
        out.push("hw_slowdown".to_string());
        out.push("hw_thermal_slowdown".to_string());
    }
    out
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
    /// The HBM's rise above the inlet, times its healthy rise (a degraded
    /// interface over the stacks).
    hbm_factor: f64,
    /// A slow degradation in progress: (factor per second, final factor).
    heatsink_ramp: Option<(f64, f64)>,
    util_target_pct: f64,
    /// Load in phases: (high, low, period in seconds).
    phases: Option<(f64, f64, u64)>,
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
    /// Fatal XID events (a counter the gauge cannot show).
    xid_events: u64,
    /// Every XID event by code, fatal or not.
    xid_counts: std::collections::BTreeMap<u32, u64>,
    /// The last fatal XID since the GPU was last reset.
    fatal_xid_since_reset: Option<u32>,
    drained: bool,
    throttled: bool,
    /// At its power limit (the limit, not heat, holds the clocks).
    power_capped: bool,
    util_now_pct: f64,
    /// SM activity (DCGM profiling): below NVML's utilisation, far below
    /// it while the GPU spins in a collective.
    sm_active_now_pct: f64,
    /// Energy since the driver loaded.
    energy_mj: f64,
    /// Bytes moved over this GPU's links.
    nvlink_bytes: f64,
    /// Fallen off the bus: no readings, no compute, until a reset.
    lost: bool,
    /// A remapped row waits for a reset to take effect.
    remap_pending: bool,
    /// A remap failed (no spare row): RMA.
    remap_failed: bool,
    /// The GPU's process registered for the flush signal.
    flush_registered: bool,
}

impl GpuState {
    /// An XID event on this GPU, as NVML's event API reports one: the gauge
    /// takes the code, its count grows, and a fatal one counts and holds
    /// until a reset.
    fn saw_xid(&mut self, code: u32) {
        self.xid_last = Some(code);
        *self.xid_counts.entry(code).or_default() += 1;
        if fatal_xid(code) {
            self.xid_events += 1;
            self.fatal_xid_since_reset = Some(code);
        }
    }

    fn xid_count_list(&self) -> Vec<nightshift_proto::XidCount> {
        self.xid_counts.iter().map(|(&code, &events)| nightshift_proto::XidCount { code, events }).collect()
    }
}

/// The node's job, as its integration reports it (the job textfile):
/// progress from the training loop, a heartbeat from a thread beside it.
#[derive(Debug, Clone)]
struct SimJob {
    progress: f64,
    /// When progress last advanced (simulated seconds).
    last_advance_t: f64,
    hung: bool,
    world_size: u32,
}

/// How long a stale job file is still read (the agent's
/// `job_metrics_max_age_secs` default).
const JOB_FILE_MAX_AGE_SECS: f64 = 120.0;

/// SM activity per point of NVML utilisation on a training job's GPU: a
/// kernel that keeps NVML at 100 % rarely occupies every SM.
const SM_ACTIVE_PER_UTIL: f64 = 0.85;

#[derive(Debug, Clone)]
struct NodeState {
    t_secs: f64,
    ticks: u64,
    /// A physical link fault (links down, error counters rising).
    nvlink_fault: bool,
    /// Managed configs as written on disk (what a restart would read).
    written_configs: std::collections::BTreeMap<String, String>,
    /// Managed configs as their consumers read them last (in effect).
    active_configs: std::collections::BTreeMap<String, String>,
    /// Configs the jobs read at start (a requeue or a new job picks up the
    /// file); the others have a service consumer.
    job_configs: std::collections::BTreeSet<String>,
    nvlink_errors: f64,
    cpu_bottleneck: bool,
    /// The starved GPUs wait in a spinning collective (NVML busy).
    collective_spin: bool,
    util_swing: bool,
    comm_overhead_override: Option<f64>,
    /// Out-of-memory errors the job caught (a need at 98 % or more).
    oom_events: u64,
    job: Option<SimJob>,
    /// World size of the jobs placed here.
    job_world_size: u32,
    /// The BMC was told to run the chassis fans at full speed.
    chassis_full: bool,
    chassis_actual_pct: f64,
    /// Chassis airflow multiplier (a failed fan module: below 1).
    chassis_airflow_factor: f64,
    /// Registered processes do not answer the flush signal.
    flush_failing: bool,
    /// The BMC lets the agent drive the chassis fans.
    bmc: bool,
    /// Jobs waiting in the scheduler's queue for this node's pool, as a
    /// scheduler would tell (`None`: no scheduler to ask).
    pending_jobs: Option<u64>,
}

impl NodeState {
    /// A bad config in effect (P2P latency up, links up).
    fn config_bad(&self) -> bool {
        self.active_configs.values().any(|c| config_breaks_p2p(c))
    }

    fn nvlink_bad(&self) -> bool {
        self.nvlink_fault || self.config_bad()
    }
}

#[derive(Debug)]
struct SimState {
    gpus: Vec<GpuState>,
    node: NodeState,
    /// The node's jobs were requeued (moved off); cleared when it resumes.
    requeued: bool,
}

/// The simulated scheduler's power saving: power `node` up (`true`) or
/// down, as `scontrol update State=POWER_UP` would (the simulated fleet
/// boots the node in minutes).
pub type PowerHook = std::sync::Arc<dyn Fn(&str, bool) -> Result<(), String> + Send + Sync>;

/// The simulated node.
#[derive(Debug)]
pub struct SimBackend {
    profile: &'static SimProfile,
    config: SimConfig,
    info: Vec<GpuInfo>,
    state: Mutex<SimState>,
    /// Where the "hardware" keeps its settings across agent restarts.
    persist: Option<std::path::PathBuf>,
    power: Mutex<Option<PowerHookSlot>>,
}

/// A [`PowerHook`] in a slot `Debug` can print.
pub struct PowerHookSlot(pub PowerHook);

impl std::fmt::Debug for PowerHookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PowerHook")
    }
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
    #[serde(default)]
    lost: bool,
    #[serde(default)]
    xid_last: Option<u32>,
    #[serde(default)]
    fatal_xid_since_reset: Option<u32>,
    #[serde(default)]
    remap_pending: bool,
    #[serde(default)]
    remap_failed: bool,
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

/// Whether an XID code leaves the GPU unfit until it is reset.
fn fatal_xid(code: u32) -> bool {
    super::FATAL_XIDS.contains(&code)
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
                        g.lost = p.lost;
                        g.xid_last = p.xid_last;
                        g.fatal_xid_since_reset = p.fatal_xid_since_reset;
                        g.remap_pending = p.remap_pending;
                        g.remap_failed = p.remap_failed;
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
                lost: g.lost,
                xid_last: g.xid_last,
                fatal_xid_since_reset: g.fatal_xid_since_reset,
                remap_pending: g.remap_pending,
                remap_failed: g.remap_failed,
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
                temperature_sensor: Some(profile.sensor.to_string()),
                mem_max_temp_c: profile.mem_max_c,
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
                hbm_factor: 1.0,
                heatsink_ramp: None,
                util_target_pct: config.util_pct,
                phases: None,
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
                xid_events: 0,
                xid_counts: Default::default(),
                fatal_xid_since_reset: None,
                drained: false,
                throttled: false,
                power_capped: false,
                util_now_pct: config.util_pct,
                sm_active_now_pct: config.util_pct * SM_ACTIVE_PER_UTIL,
                energy_mj: 0.0,
                nvlink_bytes: 0.0,
                lost: false,
                remap_pending: false,
                remap_failed: false,
                flush_registered: true,
            })
            .collect();
        let job = (config.util_pct > 5.0).then_some(SimJob {
            progress: 0.0,
            last_advance_t: 0.0,
            hung: false,
            world_size: config.gpus,
        });
        let sim = SimBackend {
            profile,
            info,
            state: Mutex::new(SimState {
                gpus,
                node: NodeState {
                    t_secs: 0.0,
                    ticks: 0,
                    nvlink_fault: false,
                    written_configs: Default::default(),
                    active_configs: Default::default(),
                    job_configs: Default::default(),
                    nvlink_errors: 0.0,
                    cpu_bottleneck: false,
                    collective_spin: false,
                    util_swing: false,
                    comm_overhead_override: None,
                    oom_events: 0,
                    job,
                    job_world_size: config.gpus,
                    chassis_full: false,
                    chassis_actual_pct: profile.chassis_airflow_pct,
                    chassis_airflow_factor: 1.0,
                    flush_failing: false,
                    bmc: true,
                    pending_jobs: None,
                },
                requeued: false,
            }),
            config,
            persist: None,
            power: Mutex::new(None),
        };
        if sim.config.start_warm {
            // Settle to the loaded steady state (20 simulated minutes), then
            // reset the clock-derived counters.
            sim.step(1_200.0);
            let mut st = sim.lock();
            st.node.t_secs = 0.0;
            if let Some(j) = st.node.job.as_mut() {
                j.progress = 0.0;
                j.last_advance_t = 0.0;
            }
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

    /// A lost GPU refuses every change, as a GPU off the bus does.
    fn check_reachable(&self, gpu: u32) -> Result<usize, BackendError> {
        let i = self.check_gpu(gpu)?;
        if self.lock().gpus[i].lost {
            return Err(failed(format!("GPU {gpu} is lost (fallen off the bus): it does not answer")));
        }
        Ok(i)
    }

    /// Whether the node's jobs were requeued (and have not come back).
    pub fn jobs_requeued(&self) -> bool {
        self.lock().requeued
    }

    /// The node takes work again (it was resumed).
    pub fn clear_requeued(&self) {
        self.lock().requeued = false;
    }

    /// Let this node's agent power other nodes up and down through the
    /// simulated scheduler (the fleet's power saving).
    pub fn set_power_hook(&self, hook: PowerHook) {
        *self.power.lock().unwrap_or_else(|e| e.into_inner()) = Some(PowerHookSlot(hook));
    }

    /// Whether the node's BMC lets the agent drive the chassis fans (the
    /// default); without it nothing nightshift does reaches them.
    pub fn set_bmc(&self, on: bool) {
        self.lock().node.bmc = on;
    }

    /// Which managed configs the jobs read when they start (the others
    /// have a service consumer that the agent restarts).
    pub fn set_job_configs(&self, names: impl IntoIterator<Item = String>) {
        self.lock().node.job_configs = names.into_iter().collect();
    }

    /// The world size of the jobs placed on this node (GPUs across nodes).
    pub fn set_job_world_size(&self, n: u32) {
        let mut st = self.lock();
        st.node.job_world_size = n;
        if let Some(j) = st.node.job.as_mut() {
            j.world_size = n;
        }
    }

    /// A new job starts (the workload placed work on an idle node): it
    /// reads the job configs as they are on disk.
    fn start_job(st: &mut SimState) {
        let t = st.node.t_secs;
        st.node.job =
            Some(SimJob { progress: 0.0, last_advance_t: t, hung: false, world_size: st.node.job_world_size });
        let node = &mut st.node;
        for name in node.job_configs.clone() {
            if let Some(c) = node.written_configs.get(&name).cloned() {
                node.active_configs.insert(name, c);
            }
        }
        // A fresh process: a fresh allocator.
        for g in st.gpus.iter_mut() {
            g.frag_pct = g.frag_pct.min(4.0);
        }
    }

    /// Advance the model by `dt_secs` of simulated time.
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

    /// The temperature the GPU's sensor reads (junction sensors run above
    /// the die average by the hotspot rise).
    fn sensor_c(&self, g: &GpuState) -> f64 {
        g.temp_c + self.profile.hotspot_c_per_kw * g.power_watts / 1000.0
    }

    /// The HBM's temperature: it rises with the die it sits beside (further
    /// with a degraded interface over the stacks).
    fn hbm_c(&self, g: &GpuState) -> f64 {
        let ambient = self.config.ambient_c;
        ambient + (g.temp_c - ambient) * self.profile.hbm_rise_per_die_rise * g.hbm_factor
    }

    fn substep(&self, st: &mut SimState, dt: f64) {
        let p = self.profile;
        let ambient = self.config.ambient_c;
        let t = st.node.t_secs;
        // Chassis fans: the BMC's setting (or full), with a few seconds of
        // lag, times whatever is left of the airflow.
        let chassis_target = if st.node.chassis_full { 100.0 } else { p.chassis_airflow_pct };
        st.node.chassis_actual_pct += (chassis_target - st.node.chassis_actual_pct) * (1.0 - (-dt / 5.0).exp());
        let chassis_airflow = st.node.chassis_actual_pct * st.node.chassis_airflow_factor;
        let job_hung = st.node.job.as_ref().is_some_and(|j| j.hung);
        let node = st.node.clone();
        let mut compute_sum = 0.0;
        let mut any_lost = false;
        for g in st.gpus.iter_mut() {
            // Cooling that degrades slowly.
            if let Some((rate, target)) = g.heatsink_ramp {
                g.heatsink_factor += rate * dt;
                if (rate >= 0.0 && g.heatsink_factor >= target) || (rate < 0.0 && g.heatsink_factor <= target) {
                    g.heatsink_factor = target;
                    g.heatsink_ramp = None;
                }
            }
            any_lost |= g.lost;
            // Workload.
            let mut util = match g.phases {
                Some((high, low, period)) => {
                    let half = (period.max(2) / 2) as f64;
                    if ((t / half).floor() as u64).is_multiple_of(2) { high } else { low }
                }
                None => g.util_target_pct,
            };
            if node.job.is_none() {
                util = util.min(0.0);
            }
            // SM activity of a kernel that keeps NVML busy: a spinning
            // collective occupies a few SMs.
            let mut spinning = false;
            if node.cpu_bottleneck && node.collective_spin && node.job.is_some() {
                util = util.max(97.0);
                spinning = true;
            } else if node.cpu_bottleneck {
                util = util.min(12.0);
            }
            if node.util_swing {
                // Topology-blind all-reduce: compute phases alternate with
                // long communication stalls, 40 s period.
                let phase = (t / 40.0).fract();
                util = if phase < 0.5 { util.max(90.0) } else { util.min(25.0) };
            }
            if job_hung && node.job.is_some() {
                // A hung collective spins: the GPU looks busy, nothing moves.
                util = 100.0;
            }
            if g.drained {
                util = util.min(2.0);
            }
            if g.lost {
                util = 0.0;
            }
            g.util_now_pct = util;
            g.sm_active_now_pct = if spinning && !g.lost && !g.drained { 6.0 } else { util * SM_ACTIVE_PER_UTIL };
            let spin = if job_hung { 0.55 } else { 1.0 };
            let mut demand = p.idle_watts + (p.load_watts - p.idle_watts) * util / 100.0 * g.surge * spin;
            if g.lost {
                demand = p.idle_watts * 0.5;
            }
            if let Some((_, max_mhz)) = g.clocks_locked {
                let f = (max_mhz as f64 / p.clock_max_mhz as f64).clamp(0.05, 1.0);
                demand = p.idle_watts + (demand - p.idle_watts) * f;
            }
            // Thermal slowdown pulls the effective cap down as the sensor
            // heats past the slowdown threshold.
            let sensor = self.sensor_c(g);
            let mut thermal = if sensor > p.slowdown_c {
                (1.0 - (sensor - p.slowdown_c) / (p.shutdown_c - p.slowdown_c)).clamp(0.1, 1.0)
            } else {
                1.0
            };
            // HBM past its maximum operating temperature slows the GPU too
            // (a hardware thermal slowdown, whatever the die reads).
            if let Some(mem_max) = p.mem_max_c {
                let hbm = self.hbm_c(g);
                if hbm > mem_max {
                    thermal = thermal.min((1.0 - (hbm - mem_max) / 10.0).clamp(0.1, 1.0));
                }
            }
            let cap = (g.power_limit_watts * thermal).max(p.idle_watts);
            g.throttled = thermal < 1.0 && demand > cap;
            g.power_capped = !g.throttled && demand > g.power_limit_watts;
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

            // Airflow: the GPU's own fan, or its share of the chassis fans.
            let fan_target = if g.fan_failed {
                0.0
            } else if p.fan_control {
                g.fan_cmd_pct.unwrap_or_else(|| fan_curve_speed(FIRMWARE_FAN_CURVE, g.temp_c))
            } else {
                chassis_airflow
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
            if !job_hung {
                g.frag_pct = (g.frag_pct + dt / 3600.0 * 0.2 * util / 100.0).min(95.0);
            }
        }
        let n = st.gpus.len().max(1) as f64;
        let overhead = self.comm_overhead_pct(&node) / 100.0;
        if let Some(job) = st.node.job.as_mut() {
            // A GPU of the job fell off the bus: its collectives never
            // complete.
            if any_lost {
                job.hung = true;
            }
            if !job.hung {
                let advance = dt * compute_sum / n * (1.0 - overhead);
                if advance > 0.0 {
                    job.progress += advance;
                    job.last_advance_t = t + dt;
                }
            }
        }
        if node.nvlink_fault {
            st.node.nvlink_errors += 40.0 * dt;
        }
        st.node.t_secs += dt;
    }

    fn comm_overhead_pct(&self, node: &NodeState) -> f64 {
        if let Some(v) = node.comm_overhead_override {
            return v;
        }
        if node.nvlink_bad() {
            34.0
        } else if node.util_swing {
            // Topology-blind all-reduce: the low half of each swing is the
            // job waiting on communication.
            41.0
        } else {
            9.0
        }
    }

    /// GPU `i` reset: its error state cleared, its settings back to their
    /// defaults; an NVLink error it caused retrained away; a hung job on
    /// the node died with it (the scheduler restarts work when the node
    /// takes it).
    fn reset_gpu(&self, st: &mut SimState, i: usize) {
        let g = &mut st.gpus[i];
        g.lost = false;
        g.dbe = 0;
        g.sbe = 0;
        g.remap_pending = false;
        g.fatal_xid_since_reset = None;
        g.fan_cmd_pct = None;
        g.clocks_locked = None;
        g.power_limit_watts = self.profile.power_default_watts;
        if st.gpus.iter().all(|g| g.fatal_xid_since_reset != Some(74)) {
            st.node.nvlink_fault = false;
        }
        if st.node.job.as_ref().is_some_and(|j| j.hung) {
            st.node.job = None;
        }
    }

    /// Apply a fault or workload change.
    pub fn inject(&self, fault: &SimFault) -> Result<(), BackendError> {
        if let Some(g) = fault.gpu() {
            self.check_gpu(g)?;
        }
        fault.validate(self.info.len() as u32).map_err(failed)?;
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
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.heatsink_factor = *factor;
                g.heatsink_ramp = None;
            }
            SimFault::HbmCooling { gpu, factor } => st.gpus[self.check_gpu(*gpu)?].hbm_factor = *factor,
            SimFault::HeatsinkRamp { gpu, factor, over_secs } => {
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.heatsink_ramp = Some(((factor - g.heatsink_factor) / *over_secs as f64, *factor));
            }
            SimFault::Load { gpu, util_pct } => {
                let u = check_pct("util_pct", *util_pct)?;
                for i in pick(*gpu)? {
                    st.gpus[i].util_target_pct = u;
                    st.gpus[i].phases = None;
                }
                // Work placed on an idle node starts a job.
                if u > 5.0 && st.node.job.is_none() && !st.requeued {
                    Self::start_job(&mut st);
                }
            }
            SimFault::LoadPhases { gpu, high_pct, low_pct, period_secs } => {
                let (h, l) = (check_pct("high_pct", *high_pct)?, check_pct("low_pct", *low_pct)?);
                for i in pick(*gpu)? {
                    st.gpus[i].phases = Some((h, l, *period_secs));
                }
                if st.node.job.is_none() && !st.requeued {
                    Self::start_job(&mut st);
                }
            }
            SimFault::LoadSurge { gpu, factor } => {
                for i in pick(*gpu)? {
                    st.gpus[i].surge = *factor;
                }
            }
            SimFault::NvlinkMisconfig { active } => st.node.nvlink_fault = *active,
            SimFault::EccDbe { gpu, count } => {
                let row_remap = self.profile.row_remap;
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.dbe += count;
                g.saw_xid(48);
                if row_remap {
                    // Each uncorrectable error takes a spare row, which
                    // becomes active at the next reset; past the spares the
                    // remap fails.
                    g.remap_pending = true;
                    if g.dbe > SPARE_ROWS {
                        g.remap_failed = true;
                    }
                }
            }
            SimFault::Xid { gpu, code } => {
                let links = self.profile.links_per_gpu;
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.saw_xid(*code);
                match code {
                    79 => g.lost = true,
                    74 if links > 0 => st.node.nvlink_fault = true,
                    63 if self.profile.row_remap => g.remap_pending = true,
                    64 if self.profile.row_remap => g.remap_failed = true,
                    _ => {}
                }
            }
            SimFault::GpuLost { gpu } => {
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.lost = true;
                g.saw_xid(79);
            }
            SimFault::GpuReset { gpu } => self.reset_gpu(&mut st, self.check_gpu(*gpu)?),
            SimFault::GpuReplace { gpu } => {
                // A new GPU: reset, and what a reset does not clear (a
                // failed remap, its XID history, a broken fan or heatsink).
                let i = self.check_gpu(*gpu)?;
                self.reset_gpu(&mut st, i);
                let g = &mut st.gpus[i];
                g.remap_failed = false;
                g.xid_last = None;
                g.xid_counts.clear();
                g.fan_failed = false;
                g.heatsink_factor = 1.0;
                g.hbm_factor = 1.0;
                g.heatsink_ramp = None;
            }
            SimFault::RowRemapFailure { gpu } => {
                let g = &mut st.gpus[self.check_gpu(*gpu)?];
                g.remap_failed = true;
                g.saw_xid(64);
            }
            SimFault::ChassisAirflow { factor } => {
                st.node.chassis_airflow_factor = *factor;
            }
            SimFault::FlushRegistration { gpu, registered } => {
                for i in pick(*gpu)? {
                    st.gpus[i].flush_registered = *registered;
                }
            }
            SimFault::FlushFailure { active } => st.node.flush_failing = *active,
            SimFault::JobEnd {} => {
                st.node.job = None;
                for g in st.gpus.iter_mut() {
                    g.util_target_pct = 0.0;
                    g.phases = None;
                    // The process exits: its allocator goes with it.
                    g.frag_pct = g.frag_pct.min(4.0);
                }
            }
            SimFault::PersonPowerLimit { gpu, watts } => {
                let i = self.check_gpu(*gpu)?;
                let p = self.profile;
                if !(p.power_min_watts..=p.power_max_watts).contains(watts) {
                    return Err(failed(format!(
                        "power limit {watts} W outside the device range {}–{} W",
                        p.power_min_watts, p.power_max_watts
                    )));
                }
                st.gpus[i].power_limit_watts = *watts;
            }
            SimFault::Fragmentation { gpu, pct } => {
                st.gpus[self.check_gpu(*gpu)?].frag_pct = check_pct("pct", *pct)?;
            }
            SimFault::MemoryUsed { gpu, pct } => {
                let v = check_pct("pct", *pct)?;
                for i in pick(*gpu)? {
                    st.gpus[i].mem_used_pct = v;
                }
                if v >= 98.0 {
                    st.node.oom_events += 1;
                }
            }
            SimFault::CpuBottleneck { active, collective_spin } => {
                st.node.cpu_bottleneck = *active;
                st.node.collective_spin = *active && *collective_spin;
            }
            SimFault::UtilSwing { active } => st.node.util_swing = *active,
            SimFault::JobStall { active } => {
                let t = st.node.t_secs;
                if let Some(j) = st.node.job.as_mut() {
                    j.hung = *active;
                    if !*active {
                        j.last_advance_t = t;
                    }
                }
            }
            SimFault::CommOverhead { pct } => st.node.comm_overhead_override = Some(check_pct("pct", *pct)?),
            SimFault::PersonDrain { .. } | SimFault::PersonResume {} => {
                return Err(failed(
                    "person_drain and person_resume are handled by the node's scheduler adapter".into(),
                ));
            }
            SimFault::PendingJobs { jobs } => st.node.pending_jobs = *jobs,
            SimFault::Clear {} => {
                for g in st.gpus.iter_mut() {
                    g.fan_failed = false;
                    g.heatsink_factor = 1.0;
                    g.hbm_factor = 1.0;
                    g.heatsink_ramp = None;
                    g.surge = 1.0;
                    g.util_target_pct = self.config.util_pct;
                    g.phases = None;
                    g.mem_used_pct = self.config.mem_used_pct;
                    g.flush_registered = true;
                }
                st.node.nvlink_fault = false;
                st.node.cpu_bottleneck = false;
                st.node.collective_spin = false;
                st.node.util_swing = false;
                st.node.comm_overhead_override = None;
                st.node.chassis_airflow_factor = 1.0;
                st.node.flush_failing = false;
                if let Some(j) = st.node.job.as_mut() {
                    j.hung = false;
                }
            }
        }
        drop(st);
        self.save();
        Ok(())
    }

    /// Current die temperature, without noise (for tests).
    pub fn true_temperature_c(&self, gpu: u32) -> f64 {
        self.lock().gpus.get(gpu as usize).map(|g| g.temp_c).unwrap_or(f64::NAN)
    }

    /// The reported sensor's temperature without noise or rounding.
    pub fn true_sensor_c(&self, gpu: u32) -> f64 {
        self.lock().gpus.get(gpu as usize).map(|g| self.sensor_c(g)).unwrap_or(f64::NAN)
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
        let has_job = st.node.job.is_some();
        let gpus = st
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let i = i as u32;
                if g.lost {
                    // Off the bus: nothing to read. The XID still reaches
                    // the kernel log (and NVML's event API).
                    return GpuTelemetry {
                        index: i,
                        lost: true,
                        lost_detail: Some("GPU is lost (fallen off the bus): NVML answers GPU_IS_LOST".into()),
                        xid_last: Some(g.xid_last.unwrap_or(0)),
                        xid_events_total: Some(g.xid_events),
                        xid_counts: g.xid_count_list(),
                        ..GpuTelemetry::default()
                    };
                }
                // Whole degrees, as NVML and ROCm SMI report them, with
                // about a degree of jitter.
                let sensor = self.sensor_c(g);
                GpuTelemetry {
                    index: i,
                    temperature_c: (sensor + 0.7 * noise(seed, i, tick, 1)).round(),
                    power_watts: round2(g.power_watts * (1.0 + 0.01 * noise(seed, i, tick, 2))),
                    power_limit_watts: g.power_limit_watts,
                    fan_pct: p.fan_control.then(|| g.fan_actual_pct.round()),
                    util_pct: (g.util_now_pct + 1.5 * noise(seed, i, tick, 3)).clamp(0.0, 100.0).round(),
                    // Framebuffer used, as NVML reads it: with a job, its
                    // caching allocator keeps what it once reserved (a busy
                    // training GPU reads 85–95 % whatever it needs); without
                    // one, the driver's own few hundred MiB.
                    mem_used_pct: round2(if has_job {
                        (g.mem_used_pct + 0.75 * (100.0 - g.mem_used_pct)).min(99.5)
                    } else {
                        0.4
                    }),
                    // What the job needs (its allocator's peak), exported by
                    // the job like PyTorch's max_memory_allocated.
                    mem_peak_allocated_pct: has_job.then(|| round2(g.mem_used_pct)),
                    // DCGM profiling: NVIDIA only (datacenter Volta and newer).
                    sm_active_pct: (p.vendor == Vendor::Nvidia)
                        .then(|| round2((g.sm_active_now_pct + 1.0 * noise(seed, i, tick, 5)).clamp(0.0, 100.0))),
                    mem_fragmentation_pct: Some(round2(g.frag_pct)),
                    sm_clock_mhz: Some(g.sm_clock_mhz),
                    ecc_sbe_total: g.sbe,
                    ecc_dbe_total: g.dbe,
                    // Like DCGM's gauge: 0 until the first XID.
                    xid_last: Some(g.xid_last.unwrap_or(0)),
                    xid_events_total: Some(g.xid_events),
                    xid_counts: g.xid_count_list(),
                    throttled: g.throttled,
                    throttle_reasons: throttle_reasons(g),
                    gpu_drained: g.drained,
                    mem_clock_mhz: Some(p.mem_clock_mhz),
                    // HBM runs a little hotter than the die it sits beside;
                    // GDDR boards report none.
                    mem_temperature_c: p.mem_max_c.map(|_| self.hbm_c(g).round()),
                    energy_mj: Some(g.energy_mj as u64),
                    // The simulator models no PCIe faults: no retries.
                    pcie_replay_total: Some(0),
                    nvlink_bytes_total: (p.links_per_gpu > 0).then_some(g.nvlink_bytes as u64),
                    // Each uncorrectable error takes a spare row; a
                    // correctable one does after repeated hits on its row.
                    remapped_rows_correctable: p.row_remap.then_some(g.sbe / 64),
                    remapped_rows_uncorrectable: p.row_remap.then_some(g.dbe.min(SPARE_ROWS)),
                    row_remap_failure: p.row_remap.then_some(g.remap_failed),
                    row_remap_pending: p.row_remap.then_some(g.remap_pending),
                    lost: false,
                    lost_detail: None,
                    reset_required: None,
                }
            })
            .collect();
        let node = &st.node;
        let n = self.info.len() as u32;
        let links_total = p.links_per_gpu * n;
        let bad = node.nvlink_bad();
        let t = node.t_secs;
        let (progress, stalled, running, world) = match &node.job {
            Some(j) => {
                let stalled = (t - j.last_advance_t).max(0.0);
                // The training loop writes progress; hung, its file goes
                // stale and the agent stops reading it.
                let progress = (stalled <= JOB_FILE_MAX_AGE_SECS).then(|| (j.progress * 1000.0).round() / 1000.0);
                (progress, Some(stalled.floor()), 1, Some(j.world_size))
            }
            None => (None, None, 0, None),
        };
        let registered = st.gpus.iter().filter(|g| g.flush_registered && !g.lost).count() as u32;
        let node_t = NodeTelemetry {
            cpu_util_pct: Some(round2(
                (if node.cpu_bottleneck { 97.0 } else { 45.0 } + 1.0 * noise(seed, 99, tick, 4)).clamp(0.0, 100.0),
            )),
            // NVML's link state: a bad config leaves every link up; a
            // physical fault takes a third of them down.
            nvlink_links_up: (links_total > 0)
                .then(|| if node.nvlink_fault { links_total - links_total / 3 } else { links_total }),
            nvlink_links_total: (links_total > 0).then_some(links_total),
            nvlink_errors_total: (links_total > 0).then_some(node.nvlink_errors as u64),
            nvlink_p2p_latency_us: running
                .gt(&0)
                .then(|| round2(if bad { 50.0 } else { p.p2p_latency_us } * (1.0 + 0.03 * noise(seed, 99, tick, 5)))),
            allreduce_p99_ms: running
                .gt(&0)
                .then(|| round2(if bad { 8.5 } else { 2.2 } * (1.0 + 0.05 * noise(seed, 99, tick, 6)))),
            comm_overhead_pct: running.gt(&0).then(|| round2(self.comm_overhead_pct(node))),
            job_progress: progress,
            job_stalled_secs: stalled,
            jobs_running: Some(running),
            job_world_size: world,
            job_oom_events_total: has_job.then_some(node.oom_events),
            flush_registered: Some(if running > 0 { registered } else { 0 }),
            chassis_fan_pct: (!p.fan_control).then(|| (node.chassis_actual_pct * node.chassis_airflow_factor).round()),
            drained: false,
            drain_reason: None,
            marks: Vec::new(),
            hands_off: false,
            state_degraded: None,
            holds: Vec::new(),
            ended_holds: Vec::new(),
            reapplied: Vec::new(),
            drifted: Vec::new(),
        };
        Ok((gpus, node_t))
    }

    fn set_power_limit(&self, gpu: u32, watts: f64) -> Result<Support<()>, BackendError> {
        let i = self.check_reachable(gpu)?;
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
        let i = self.check_reachable(gpu)?;
        if !self.profile.fan_control {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.profile.name)));
        }
        self.lock().gpus[i].fan_cmd_pct = Some(pct.clamp(0.0, 100.0));
        self.save();
        Ok(Support::Done(()))
    }

    fn reset_fan(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_reachable(gpu)?;
        if !self.profile.fan_control {
            return Ok(Support::NotSupported(format!("{} has no controllable fan", self.profile.name)));
        }
        self.lock().gpus[i].fan_cmd_pct = None;
        self.save();
        Ok(Support::Done(()))
    }

    fn set_clocks(&self, gpu: u32, min_mhz: u32, max_mhz: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_reachable(gpu)?;
        self.lock().gpus[i].clocks_locked = Some((min_mhz, max_mhz));
        self.save();
        Ok(Support::Done(()))
    }

    fn reset_clocks(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_reachable(gpu)?;
        self.lock().gpus[i].clocks_locked = None;
        self.save();
        Ok(Support::Done(()))
    }

    fn clear_ecc(&self, gpu: u32) -> Result<Support<()>, BackendError> {
        let i = self.check_reachable(gpu)?;
        let mut st = self.lock();
        st.gpus[i].sbe = 0;
        st.gpus[i].dbe = 0;
        drop(st);
        self.save();
        Ok(Support::Done(()))
    }

    fn set_gpu_drain(&self, gpu: u32, drained: bool) -> Result<Support<()>, BackendError> {
        // NVML's drain state is kept by the driver for the PCI slot: it can
        // be set for a GPU that fell off the bus.
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
        st.node.job = None;
        for g in st.gpus.iter_mut() {
            g.util_target_pct = 0.0;
            g.phases = None;
            g.frag_pct = g.frag_pct.min(4.0);
        }
    }

    fn pending_jobs(&self) -> Option<u64> {
        self.lock().node.pending_jobs
    }

    fn on_jobs_restarted(&self) {
        // Requeued on a node that takes work: the jobs start again here and
        // read their configs as they are on disk.
        let mut st = self.lock();
        if st.node.job.is_some() {
            Self::start_job(&mut st);
        }
    }

    fn flush_gpu_processes(&self) -> Option<FlushOutcome> {
        // Only a process that registered for the signal and answers it
        // releases its cached blocks (torch.cuda.empty_cache()); the rest
        // keep theirs, and no process means nothing to flush.
        let mut st = self.lock();
        let running = st.node.job.is_some();
        let failing = st.node.flush_failing;
        let mut out = FlushOutcome::default();
        for (i, g) in st.gpus.iter_mut().enumerate() {
            if !running || g.lost || !g.flush_registered {
                continue;
            }
            out.registered.push(i as u32);
            if failing {
                continue;
            }
            out.answered.push(i as u32);
            // Released cached blocks; what live tensors hold stays.
            g.frag_pct = g.frag_pct.min(6.0);
        }
        Some(out)
    }

    fn on_config_applied(&self, name: &str, content: &str) {
        self.lock().node.written_configs.insert(name.to_string(), content.to_string());
    }

    fn on_consumer_restarted(&self, name: &str) {
        let mut st = self.lock();
        let node = &mut st.node;
        match node.written_configs.get(name).cloned() {
            Some(c) => {
                node.active_configs.insert(name.to_string(), c);
            }
            None => {
                node.active_configs.remove(name);
            }
        }
    }

    fn set_chassis_fans(&self, full: bool) -> Result<Support<()>, BackendError> {
        if !self.lock().node.bmc {
            return Ok(Support::NotSupported("this node's BMC gives no chassis fan control".into()));
        }
        if self.profile.fan_control {
            return Ok(Support::NotSupported(format!(
                "{} boards have their own fans: the chassis fans do not cool them",
                self.profile.name
            )));
        }
        self.lock().node.chassis_full = full;
        Ok(Support::Done(()))
    }

    fn chassis_fans_full(&self) -> Option<bool> {
        let st = self.lock();
        (!self.profile.fan_control && st.node.bmc).then_some(st.node.chassis_full)
    }

    fn pcie_link(&self, gpu: u32) -> Option<PcieLink> {
        let st = self.lock();
        let g = st.gpus.get(gpu as usize)?;
        (!g.lost).then_some(PcieLink { width: 16, max_width: 16, generation: 5, max_generation: 5 })
    }

    fn fatal_xid_since_reset(&self, gpu: u32) -> Option<u32> {
        self.lock().gpus.get(gpu as usize)?.fatal_xid_since_reset
    }

    fn power_node(&self, node: &str, up: bool) -> Option<Result<(), String>> {
        let hook = self.power.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|h| h.0.clone());
        hook.map(|h| h(node, up))
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
        let sim = node("rtx6000-ada", 4);
        run(&sim, 60);
        let before = sim.true_temperature_c(0);
        assert_eq!(sim.set_fan_speed(0, 100.0).unwrap(), Support::Done(()));
        run(&sim, 600);
        assert!(sim.true_temperature_c(0) < before - 5.0);
        for fanless in ["h100-sxm", "mi300x"] {
            let f = node(fanless, 4);
            assert!(matches!(f.set_fan_speed(0, 100.0).unwrap(), Support::NotSupported(_)), "{fanless}");
        }
    }

    /// Old sim: MI300X had a GPU fan the agent could drive. An OAM board has
    /// none: the chassis fans behind the BMC cool it, and a chassis airflow
    /// fault heats every GPU of the node at once.
    #[test]
    fn oam_boards_are_cooled_by_chassis_fans() {
        let sim = node("mi300x", 9);
        assert!(!sim.gpus()[0].fan_control);
        run(&sim, 60);
        let (g, n) = sim.sample().unwrap();
        assert_eq!(g[0].fan_pct, None, "no GPU fan to read");
        assert_eq!(n.chassis_fan_pct, Some(70.0));
        let healthy = [sim.true_temperature_c(0), sim.true_temperature_c(1)];
        sim.inject(&SimFault::ChassisAirflow { factor: 0.6 }).unwrap();
        run(&sim, 900);
        for (i, h) in healthy.iter().enumerate() {
            let hot = sim.true_temperature_c(i as u32);
            assert!(hot > h + 8.0, "GPU {i}: {h:.1} → {hot:.1} °C with 60 % of the airflow");
        }
        let hot = sim.true_temperature_c(0);
        assert_eq!(sim.set_chassis_fans(true).unwrap(), Support::Done(()));
        run(&sim, 900);
        assert!(sim.true_temperature_c(0) < hot - 4.0, "full chassis fans help");
        assert!(matches!(node("rtx6000-ada", 1).set_chassis_fans(true).unwrap(), Support::NotSupported(_)));
    }

    /// Old sim: temperatures at 0.01 °C with ±0.2 °C of noise, and AMD read
    /// like NVIDIA's GPU sensor. NVML and ROCm SMI report whole degrees;
    /// an Instinct reports its junction, well above the die under load.
    #[test]
    fn readings_are_whole_degrees_and_amd_reads_its_junction() {
        let sim = node("h100-sxm", 11);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..120 {
            sim.step(1.0);
            let t = sim.sample().unwrap().0[0].temperature_c;
            assert_eq!(t.fract(), 0.0, "{t}");
            seen.insert(t as i64);
        }
        assert!(seen.len() >= 2, "about a degree of jitter: {seen:?}");
        let amd = node("mi300x", 11);
        run(&amd, 60);
        let (g, _) = amd.sample().unwrap();
        assert_eq!(amd.gpus()[0].temperature_sensor.as_deref(), Some("junction"));
        assert!(g[0].temperature_c > amd.true_temperature_c(0) + 10.0, "junction {} °C", g[0].temperature_c);
        assert!(g[0].temperature_c > 85.0, "a healthy loaded MI300X reads above NVIDIA's 85 °C alert");
        assert!(g[0].temperature_c < amd.gpus()[0].slowdown_temp_c.unwrap() - 5.0);
    }

    /// Old sim: every flush cured every GPU. Only a process that registered
    /// for the signal and answers releases its blocks; a flush can fail.
    #[test]
    fn a_flush_helps_only_registered_processes_that_answer() {
        let sim = node("a100-sxm", 12);
        sim.inject(&SimFault::Fragmentation { gpu: 0, pct: 30.0 }).unwrap();
        sim.inject(&SimFault::Fragmentation { gpu: 1, pct: 30.0 }).unwrap();
        sim.inject(&SimFault::FlushRegistration { gpu: Some(1), registered: false }).unwrap();
        let o = sim.flush_gpu_processes().unwrap();
        assert_eq!((o.registered.clone(), o.answered.clone()), (vec![0], vec![0]));
        let (g, _) = sim.sample().unwrap();
        assert!(g[0].mem_fragmentation_pct.unwrap() <= 6.0);
        assert_eq!(g[1].mem_fragmentation_pct, Some(30.0), "unregistered: untouched");
        sim.inject(&SimFault::Fragmentation { gpu: 0, pct: 30.0 }).unwrap();
        sim.inject(&SimFault::FlushFailure { active: true }).unwrap();
        let o = sim.flush_gpu_processes().unwrap();
        assert!(o.answered.is_empty() && o.registered == vec![0]);
        assert_eq!(sim.sample().unwrap().0[0].mem_fragmentation_pct, Some(30.0));
    }

    /// Old sim: a config change took effect the moment the file changed. A
    /// bad NCCL environment or fabric-manager mode takes effect when its
    /// consumer restarts — and so does the rollback. A bad config leaves
    /// every link up; a physical link fault takes links down and drives the
    /// error counters.
    #[test]
    fn configs_take_effect_when_their_consumer_restarts() {
        let sim = node("h100-sxm", 5);
        run(&sim, 10);
        let (_, healthy) = sim.sample().unwrap();
        assert!(healthy.nvlink_p2p_latency_us.unwrap() < 6.0);
        sim.on_config_applied("nccl-env", "NCCL_DEBUG=WARN\nNCCL_P2P_DISABLE=1\n");
        run(&sim, 10);
        assert!(sim.sample().unwrap().1.nvlink_p2p_latency_us.unwrap() < 6.0, "the running job read the old file");
        sim.on_consumer_restarted("nccl-env");
        run(&sim, 10);
        let (_, bad) = sim.sample().unwrap();
        assert!(bad.nvlink_p2p_latency_us.unwrap() > 40.0);
        assert!(bad.allreduce_p99_ms.unwrap() > 5.0);
        assert_eq!(bad.nvlink_links_up, bad.nvlink_links_total, "a config takes no link down");
        assert_eq!(bad.nvlink_errors_total, healthy.nvlink_errors_total, "nor raises link errors");
        sim.on_config_applied("nccl-env", "NCCL_DEBUG=WARN\n");
        run(&sim, 2);
        assert!(sim.sample().unwrap().1.nvlink_p2p_latency_us.unwrap() > 40.0, "rolled back on disk only");
        // Jobs that read the file restart with it.
        sim.set_job_configs(["nccl-env".to_string()]);
        sim.on_jobs_restarted();
        run(&sim, 2);
        assert!(sim.sample().unwrap().1.nvlink_p2p_latency_us.unwrap() < 6.0);
        // A physical fault.
        sim.inject(&SimFault::NvlinkMisconfig { active: true }).unwrap();
        run(&sim, 10);
        let (_, phys) = sim.sample().unwrap();
        assert!(phys.nvlink_links_up < phys.nvlink_links_total);
        assert!(phys.nvlink_errors_total > healthy.nvlink_errors_total);
    }

    /// Old sim: a stalled job kept reporting flat progress. A hung job's
    /// training loop stops writing (the reading goes after 120 s), its
    /// heartbeat says how long since progress advanced, and its GPUs spin.
    /// An idle node has neither.
    #[test]
    fn a_hung_job_goes_silent_and_an_idle_node_reports_no_job() {
        let sim = node("h100-sxm", 13);
        run(&sim, 30);
        let (_, n) = sim.sample().unwrap();
        assert!(n.job_progress.unwrap() > 0.0 && n.job_stalled_secs.unwrap() < 2.0);
        sim.inject(&SimFault::JobStall { active: true }).unwrap();
        run(&sim, 60);
        let (g, n) = sim.sample().unwrap();
        assert!(n.job_progress.is_some(), "within 120 s the last file still reads");
        assert!(g[0].util_pct > 95.0, "a hung collective spins at {} %", g[0].util_pct);
        run(&sim, 120);
        let (_, n) = sim.sample().unwrap();
        assert_eq!(n.job_progress, None, "the training loop's file went stale");
        assert!(n.job_stalled_secs.unwrap() >= 179.0, "{:?}", n.job_stalled_secs);
        sim.inject(&SimFault::JobEnd {}).unwrap();
        run(&sim, 10);
        let (g, n) = sim.sample().unwrap();
        assert_eq!((n.job_progress, n.job_stalled_secs, n.jobs_running), (None, None, Some(0)));
        assert!(g[0].util_pct < 5.0);
    }

    /// Old sim: a GPU that fell off the bus kept computing and reporting.
    #[test]
    fn a_lost_gpu_stops_reporting_while_its_neighbours_go_on() {
        let sim = node("h100-sxm", 14);
        run(&sim, 10);
        sim.inject(&SimFault::Xid { gpu: 1, code: 79 }).unwrap();
        run(&sim, 10);
        let (g, n) = sim.sample().unwrap();
        assert!(g[1].lost && g[1].temperature_c == 0.0 && g[1].xid_last == Some(79));
        assert!(!g[0].lost && g[0].temperature_c > 50.0);
        assert!(sim.set_power_limit(1, 500.0).is_err(), "a lost GPU takes no change");
        assert_eq!(sim.fatal_xid_since_reset(1), Some(79));
        run(&sim, 150);
        assert_eq!(sim.sample().unwrap().1.job_progress, None, "the job hung with its GPU");
        assert!(n.jobs_running == Some(1));
        sim.inject(&SimFault::GpuReset { gpu: 1 }).unwrap();
        run(&sim, 5);
        let (g, _) = sim.sample().unwrap();
        assert!(!g[1].lost && g[1].xid_last == Some(79), "the gauge keeps its value");
        assert_eq!(sim.fatal_xid_since_reset(1), None);
    }

    /// Old sim: load changed only when told. An RL job alternates rollout
    /// and training phases.
    #[test]
    fn load_changes_in_phases() {
        let sim = node("h100-sxm", 15);
        sim.inject(&SimFault::LoadPhases { gpu: None, high_pct: 85.0, low_pct: 60.0, period_secs: 600 }).unwrap();
        let mut utils = Vec::new();
        for _ in 0..1200 {
            sim.step(1.0);
            utils.push(sim.sample().unwrap().0[0].util_pct);
        }
        assert!(
            utils[100] > 80.0 && utils[400] < 65.0 && utils[700] > 80.0,
            "{} {} {}",
            utils[100],
            utils[400],
            utils[700]
        );
    }

    #[test]
    fn same_seed_gives_the_same_trace() {
        let trace = |seed| {
            let sim = node("b200", seed);
            sim.inject(&SimFault::LoadSurge { gpu: Some(1), factor: 1.2 }).unwrap();
            (0..120)
                .map(|_| {
                    sim.step(1.0);
                    serde_json::to_string(&sim.sample().unwrap()).unwrap()
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
        sim.inject(&SimFault::CpuBottleneck { active: true, collective_spin: false }).unwrap();
        run(&sim, 30);
        let (gpus, n) = sim.sample().unwrap();
        assert_eq!(gpus[1].ecc_dbe_total, 2);
        assert_eq!(gpus[1].xid_last, Some(48));
        assert_eq!(gpus[1].row_remap_pending, Some(true), "a DBE's spare row waits for a reset");
        assert_eq!(sim.fatal_xid_since_reset(1), Some(48));
        assert!(gpus[0].mem_fragmentation_pct.unwrap() > 30.0);
        assert!(gpus[0].util_pct < 20.0 && n.cpu_util_pct.unwrap() > 90.0);
        sim.inject(&SimFault::GpuReset { gpu: 1 }).unwrap();
        let g = &sim.sample().unwrap().0[1];
        assert_eq!((g.ecc_dbe_total, g.row_remap_pending), (0, Some(false)), "a reset clears volatile counters");
        sim.inject(&SimFault::RowRemapFailure { gpu: 1 }).unwrap();
        assert_eq!(sim.sample().unwrap().0[1].row_remap_failure, Some(true));
        assert!(sim.inject(&SimFault::Load { gpu: Some(9), util_pct: 5.0 }).is_err());
        assert!(sim.inject(&SimFault::Load { gpu: None, util_pct: 500.0 }).is_err());
        assert!(sim.inject(&SimFault::ChassisAirflow { factor: 0.0 }).is_err());
    }

    #[test]
    fn unknown_profiles_name_the_known_ones() {
        let err = SimBackend::new(SimConfig { profile: "h300".into(), ..SimConfig::default() }).unwrap_err();
        assert!(err.to_string().contains("expected one of h100-sxm, h200-sxm, b200, mi300x"), "{err}");
    }
}
