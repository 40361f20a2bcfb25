//! Hardware backends behind one trait: `sim` (a physical model), `nvml`
//! (NVIDIA, through nvml-wrapper) and `rocm` (AMD, behind the `rocm`
//! feature).
//!
//! "Not supported on this device" is a normal answer ([`Support::NotSupported`]),
//! not an error: a fanless SXM board simply has no fan to drive.

pub mod nvml;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod sim;

use nightshift_proto::{GpuInfo, GpuTelemetry, NodeTelemetry};

/// Whether the device did the thing or the thing does not apply to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Support<T> {
    Done(T),
    /// The device does not offer this; the text says what is missing.
    NotSupported(String),
}

/// A hardware library failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("no GPU {index} on this node: expected an index below {count}")]
    NoSuchGpu { index: u32, count: u32 },
    #[error("{backend}: {message}")]
    Failed { backend: &'static str, message: String },
    #[error("{0}")]
    Unavailable(String),
}

/// One node's GPUs, read and driven through a vendor library or the model.
///
/// Setters take values in the protocol's units (watts, percent, MHz); each
/// backend converts to its library's units.
pub trait Backend: Send + Sync {
    /// `sim`, `nvml` or `rocm`.
    fn name(&self) -> &'static str;
    /// The GPUs, read once at start.
    fn gpus(&self) -> &[GpuInfo];
    /// The GPU driver's version, where the backend can read it.
    fn driver_version(&self) -> Option<String> {
        None
    }
    /// One sample of every GPU and of the node.
    fn sample(&self) -> Result<(Vec<GpuTelemetry>, NodeTelemetry), BackendError>;
    fn set_power_limit(&self, gpu: u32, watts: f64) -> Result<Support<()>, BackendError>;
    fn set_fan_speed(&self, gpu: u32, pct: f64) -> Result<Support<()>, BackendError>;
    fn reset_fan(&self, gpu: u32) -> Result<Support<()>, BackendError>;
    fn set_clocks(&self, gpu: u32, min_mhz: u32, max_mhz: u32) -> Result<Support<()>, BackendError>;
    fn reset_clocks(&self, gpu: u32) -> Result<Support<()>, BackendError>;
    fn clear_ecc(&self, gpu: u32) -> Result<Support<()>, BackendError>;
    fn set_gpu_drain(&self, gpu: u32, drained: bool) -> Result<Support<()>, BackendError>;
    /// The GPU processes registered for the flush signal, signalled by the
    /// model: `Some` only where the backend simulates the processes (real
    /// backends leave it to the agent, which signals the registered pids).
    fn flush_gpu_processes(&self) -> Option<FlushOutcome> {
        None
    }
    /// Called after the node's jobs were requeued (they stop here).
    fn on_jobs_requeued(&self) {}
    /// The simulator's scheduler queue (jobs waiting for the pool), where
    /// no real scheduler is configured; real backends have none.
    fn pending_jobs(&self) -> Option<u64> {
        None
    }
    /// Called after the node's jobs were requeued to restart (a config they
    /// read changed) on a node that still takes work.
    fn on_jobs_restarted(&self) {}
    /// Called after a managed config file changed on disk. The change takes
    /// effect when the file's consumer restarts ([`Backend::on_consumer_restarted`]).
    fn on_config_applied(&self, _name: &str, _content: &str) {}
    /// Called after the consumer of a managed config (a systemd unit, the
    /// jobs) restarted and read the file again.
    fn on_consumer_restarted(&self, _name: &str) {}
    /// Drive the chassis fans (simulated chassis only; on real nodes the
    /// agent runs the BMC command from its policy).
    fn set_chassis_fans(&self, _full: bool) -> Result<Support<()>, BackendError> {
        Ok(Support::NotSupported("this backend cannot reach the chassis fans (configure policy.bmc)".into()))
    }
    /// Whether the chassis fans are held at full speed, where the backend
    /// can tell.
    fn chassis_fans_full(&self) -> Option<bool> {
        None
    }
    /// The GPU's PCIe link: (current width, max width, current generation,
    /// max generation), where the backend reads it.
    fn pcie_link(&self, _gpu: u32) -> Option<PcieLink> {
        None
    }
    /// A fatal XID on the GPU since its last reset, where the backend tracks
    /// XID events (NVML's event API, the simulator).
    fn fatal_xid_since_reset(&self, _gpu: u32) -> Option<u32> {
        None
    }
    /// Power another node up or down where the backend simulates the
    /// scheduler's power saving (the simulated fleet); `None` elsewhere.
    fn power_node(&self, _node: &str, _up: bool) -> Option<Result<(), String>> {
        None
    }
    /// The simulator, when this backend is one.
    fn sim(&self) -> Option<&sim::SimBackend> {
        None
    }

    /// The GPU's inventory entry, or the error naming the valid range.
    fn gpu(&self, index: u32) -> Result<&GpuInfo, BackendError> {
        let gpus = self.gpus();
        gpus.iter().find(|g| g.index == index).ok_or(BackendError::NoSuchGpu { index, count: gpus.len() as u32 })
    }
}

/// What signalling the registered GPU processes did (simulated processes).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FlushOutcome {
    /// GPUs whose process registered for the signal.
    pub registered: Vec<u32>,
    /// Of those, the GPUs whose process answered (released its blocks).
    pub answered: Vec<u32>,
}

/// A GPU's PCIe link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PcieLink {
    pub width: u32,
    pub max_width: u32,
    pub generation: u32,
    pub max_generation: u32,
}

/// XIDs that leave a GPU unfit for work until it is reset or replaced
/// (NVIDIA's XID catalog; the engine's XID policy has each code's meaning
/// and action).
pub use nightshift_proto::wire::FATAL_XIDS;

/// Which backend to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// NVML, then ROCm; an error (suggesting `sim`) if neither finds a GPU.
    Auto,
    Sim,
    Nvml,
    Rocm,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(BackendKind::Auto),
            "sim" => Ok(BackendKind::Sim),
            "nvml" => Ok(BackendKind::Nvml),
            "rocm" => Ok(BackendKind::Rocm),
            other => Err(format!("unknown backend `{other}`: expected auto, sim, nvml or rocm")),
        }
    }
}

/// Open the ROCm backend, or say why not.
pub fn open_rocm() -> Result<Box<dyn Backend>, BackendError> {
    #[cfg(feature = "rocm")]
    {
        rocm::RocmBackend::open().map(|b| Box::new(b) as Box<dyn Backend>)
    }
    #[cfg(not(feature = "rocm"))]
    {
        Err(BackendError::Unavailable(
            "rocm: this agent was built without ROCm support; rebuild with `--features rocm`".into(),
        ))
    }
}

/// Pick a hardware backend for `auto`: NVML first, then ROCm. Never falls
/// back to the simulator: with no GPU it fails and says so.
pub fn open_auto(nvml_lib_path: Option<&std::path::Path>) -> Result<Box<dyn Backend>, BackendError> {
    let nvml_err = match nvml::NvmlBackend::open(nvml_lib_path) {
        Ok(b) => return Ok(Box::new(b)),
        Err(e) => e,
    };
    let rocm_err = match open_rocm() {
        Ok(b) => return Ok(b),
        Err(e) => e,
    };
    Err(BackendError::Unavailable(format!(
        "no GPU found by any backend: {nvml_err}; {rocm_err}; to run without hardware use `--backend sim`"
    )))
}
