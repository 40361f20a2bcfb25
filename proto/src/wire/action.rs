//! Argument and result types of the protocol's operations.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Ops that take no arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Ops that name one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuArgs {
    pub gpu: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeArgs {
    /// Sample interval; the agent's configured interval when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionStatusArgs {
    pub request_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPowerLimitArgs {
    pub gpu: u32,
    pub watts: f64,
}

/// One point of a fan curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FanPoint {
    pub temp_c: f64,
    pub speed_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetFanCurveArgs {
    pub gpu: u32,
    /// Temperature→speed points, temperatures strictly increasing, speeds
    /// never decreasing.
    pub points: Vec<FanPoint>,
}

/// Fan speed for a temperature on a curve: linear between points, flat
/// beyond the ends.
pub fn fan_curve_speed(points: &[FanPoint], temp_c: f64) -> f64 {
    match points {
        [] => 0.0,
        [only] => only.speed_pct,
        _ => {
            let first = points[0];
            let last = points[points.len() - 1];
            if temp_c <= first.temp_c {
                return first.speed_pct;
            }
            if temp_c >= last.temp_c {
                return last.speed_pct;
            }
            for pair in points.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if temp_c <= b.temp_c {
                    let t = (temp_c - a.temp_c) / (b.temp_c - a.temp_c);
                    return a.speed_pct + t * (b.speed_pct - a.speed_pct);
                }
            }
            last.speed_pct
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetClocksArgs {
    pub gpu: u32,
    pub min_mhz: u32,
    pub max_mhz: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetGpuDrainArgs {
    pub gpu: u32,
    pub drained: bool,
    /// No lease: a GPU out for a fault stays out until the repair
    /// lifecycle (or a person) ends it — never on a timer (invariant 13).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    /// A sticky drain its owner may end after a passing health check (a
    /// repair); without it only a person does (an RMA).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainArgs {
    /// Why; the agent writes `nightshift: <run> <reason>` as the drain reason.
    pub reason: String,
    /// The run asking, recorded in the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// No lease: the drain stays until a person releases it (RMA, repair).
    /// Only node drains may be sticky.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    /// A sticky drain for a repair (a reset, a reboot), not an RMA: besides
    /// a person, its owner may release it once the agent's own health
    /// check has passed after the drain was placed. Only with `sticky`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

fn yes() -> bool {
    true
}

/// `flush_caches`: signal the GPU processes that registered for it to
/// release their cached allocator blocks. The OS page cache has nothing to
/// do with GPU memory (and dropping it slows data loaders): it is dropped
/// only when asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushCachesArgs {
    #[serde(default)]
    pub drop_page_cache: bool,
    #[serde(default = "yes")]
    pub signal_processes: bool,
}

/// `requeue`: stop the jobs running on a drained node so the scheduler
/// starts them elsewhere (Slurm `scontrol requeue`, Kubernetes eviction).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueArgs {
    pub reason: String,
    /// The GPU at fault, for a run about one: on a node someone else
    /// drained (whose jobs are theirs to move), the agent moves them only
    /// when it sees that GPU's hardware fault itself — a job on a GPU that
    /// fell off the bus cannot run, whoever drained the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

impl Default for FlushCachesArgs {
    fn default() -> Self {
        FlushCachesArgs { drop_page_cache: false, signal_processes: true }
    }
}

/// `set_chassis_fans`: the node's chassis fans, driven by its BMC, at full
/// speed (`full: true`) or back on the BMC's own control. Boards without
/// GPU fans (HGX SXM, AMD OAM) are cooled by these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetChassisFansArgs {
    pub full: bool,
}

/// `collect_evidence`: gather what a vendor asks for with an RMA (NVIDIA:
/// `nvidia-bug-report.sh`; AMD: `amd-smi` static, metric and bad-page
/// reports) and the agent's last health check (with its `dcgmi diag`) into
/// a bundle on the node, each file hashed; argv and a timeout, never a
/// shell, and a size limit (the agent's `evidence:` policy). Changes no
/// hardware.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectEvidenceArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    pub reason: String,
}

/// One file of an evidence bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct EvidenceFile {
    pub name: String,
    pub bytes: u64,
    /// SHA-256 of the file as kept, hex.
    pub sha256: String,
    /// What went wrong producing it (a timeout, a failed tool, the size
    /// limit): the file then holds what there was, or this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An evidence bundle: a folder on the node whose `manifest.json` lists
/// every file with its hash; `sha256` is the manifest's own hash (what the
/// engine puts on the audit chain).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceBundle {
    pub id: String,
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    pub reason: String,
    pub created_ms: i64,
    pub files: Vec<EvidenceFile>,
}

/// The file in a bundle's folder that lists the others.
pub const EVIDENCE_MANIFEST: &str = "manifest.json";

/// `read_evidence`: a piece of one file of an evidence bundle on the node,
/// for a copy elsewhere (`nightshift agents evidence NODE --fetch DIR`, the
/// node page): the bundle by its id, the file by a name its manifest lists
/// (or the manifest itself). Nothing else on the node can be read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadEvidenceArgs {
    pub bundle: String,
    pub file: String,
    #[serde(default)]
    pub offset: u64,
}

/// The most one `read_evidence` answers (hex doubles it on the wire).
pub const EVIDENCE_CHUNK_BYTES: usize = 128 * 1024;

/// What `read_evidence` answers: the bytes from `offset` (hex), the file's
/// size, and whether they reach its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceChunk {
    pub offset: u64,
    pub size: u64,
    pub data_hex: String,
    pub eof: bool,
}

/// Whether `name` can be a bundle id or a file name inside a bundle: one
/// path component of plain characters (no separator, no `..`, not hidden).
pub fn plain_evidence_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// What `collect_evidence` answers: the bundle, where it is on the node,
/// and the SHA-256 of its manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceCollected {
    pub bundle: EvidenceBundle,
    pub dir: String,
    pub sha256: String,
}

/// Check a bundle's folder: every file listed in its manifest is there with
/// the size and hash the manifest says, nothing else is; returns the
/// manifest and its SHA-256 (compare it with the audit chain's).
pub fn verify_evidence_dir(dir: &std::path::Path) -> Result<(EvidenceBundle, String), String> {
    use sha2::Digest;
    let path = dir.join(EVIDENCE_MANIFEST);
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let bundle: EvidenceBundle = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: expected an evidence manifest, found: {e}", path.display()))?;
    for f in &bundle.files {
        if f.name.contains('/') || f.name.contains("..") || f.name == EVIDENCE_MANIFEST {
            return Err(format!("{}: file name {:?} is not a plain name in the folder", path.display(), f.name));
        }
        let fp = dir.join(&f.name);
        let data = std::fs::read(&fp)
            .map_err(|e| format!("{} is listed in the manifest but cannot be read: {e}", fp.display()))?;
        let sha = hex::encode(sha2::Sha256::digest(&data));
        if data.len() as u64 != f.bytes || sha != f.sha256 {
            return Err(format!(
                "{}: expected {} bytes with sha256 {}, found {} bytes with sha256 {sha}",
                fp.display(),
                f.bytes,
                f.sha256,
                data.len()
            ));
        }
    }
    let listed: std::collections::BTreeSet<&str> = bundle.files.iter().map(|f| f.name.as_str()).collect();
    for e in std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != EVIDENCE_MANIFEST && !listed.contains(name.as_str()) {
            return Err(format!("{}: {name} is not in the manifest", dir.display()));
        }
    }
    Ok((bundle, hex::encode(sha2::Sha256::digest(&bytes))))
}

/// `health_check` (read-only): is the node fit to take work? One GPU, or
/// every GPU when `gpu` is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

/// `scheduler_pending` (read-only): the work waiting in the scheduler's
/// queue for `partition` (absent: every partition), as the node's agent
/// reads it (Slurm: `squeue --states=PENDING`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerPendingArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

/// What `scheduler_pending` answers: jobs (and the GPUs they ask for)
/// waiting; `None` where the scheduler cannot say (none configured,
/// Kubernetes for now).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingWork {
    pub scheduler: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default)]
    pub jobs: Option<u64>,
    #[serde(default)]
    pub gpus: Option<u64>,
}

/// One GPU's part of a health check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct GpuCheck {
    pub index: u32,
    pub ok: bool,
    /// What failed, one sentence each (empty when `ok`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// What was checked, by name (`visible`, `row_remap`, `ecc_stable`,
    /// `pcie_link`, `recent_xid`, `dcgm_diag`…); what the backend cannot
    /// read is left out, not passed.
    pub checked: Vec<String>,
}

/// The result of `health_check`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    pub ok: bool,
    pub at_ms: i64,
    pub gpus: Vec<GpuCheck>,
    /// Node-wide failures (NVLink links down, DCGM diag).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_failures: Vec<String>,
    /// `dcgmi diag -r 1`'s verdict when DCGM is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dcgm: Option<String>,
}

impl HealthCheck {
    /// Every failure, node-wide first, then per GPU.
    pub fn failures(&self) -> Vec<String> {
        let mut v = self.node_failures.clone();
        for g in &self.gpus {
            v.extend(g.failures.iter().map(|f| format!("GPU {}: {f}", g.index)));
        }
        v
    }
}

/// `power_node`: a standby node powered up or down through the scheduler's
/// power saving (Slurm: `scontrol update NodeName=<node> State=POWER_UP`,
/// which runs the site's `ResumeProgram`). Sent to an agent that can reach
/// the scheduler (`power_control` in its config), for another node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerNodeArgs {
    pub node: String,
    pub up: bool,
}

/// `mark`: a scheduler mark held on the node — `no_pack` (place no more
/// work here: Slurm a high node `Weight`, Kubernetes a `PreferNoSchedule`
/// taint) or `quarantine` (Kubernetes a `NoSchedule` taint beside the
/// cordon). A hold like any other: leased, restored to what the scheduler
/// had when the hold goes, and a mark a person set (or changed) is never
/// removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkArgs {
    pub mark: MarkKind,
    pub set: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The marks a scheduler can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    NoPack,
    Quarantine,
}

impl MarkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MarkKind::NoPack => "no_pack",
            MarkKind::Quarantine => "quarantine",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigListArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigApplyArgs {
    pub name: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Restart the file's consumer (as declared in the agent's config: a
    /// systemd unit, or the running jobs) so the change takes effect.
    /// Default true; false only writes the file.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub restart_consumer: bool,
}

fn is_true(b: &bool) -> bool {
    *b
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRollbackArgs {
    pub name: String,
    /// The version to go back to; the last known good one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_version: Option<u32>,
    /// As for `config_apply`: restart the consumer so the rollback takes
    /// effect for running work (default true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub restart_consumer: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMarkArgs {
    pub name: String,
    pub version: u32,
    pub good: bool,
}

/// Families of changes, for rate limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    PowerLimit,
    Fan,
    Clocks,
    Ecc,
    GpuDrain,
    NodeDrain,
    FlushCaches,
    Config,
    ChassisFans,
    Power,
    Mark,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::PowerLimit => "power_limit",
            ActionKind::Fan => "fan",
            ActionKind::Clocks => "clocks",
            ActionKind::Ecc => "ecc",
            ActionKind::GpuDrain => "gpu_drain",
            ActionKind::NodeDrain => "node_drain",
            ActionKind::FlushCaches => "flush_caches",
            ActionKind::Config => "config",
            ActionKind::ChassisFans => "chassis_fans",
            ActionKind::Power => "power",
            ActionKind::Mark => "mark",
        }
    }
}

/// What happened to a mutating request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The change was made.
    Applied,
    /// Dry run: the change passed every check and was not made.
    DryRun,
    /// Nothing to do: the state already was what was asked.
    Unchanged,
    /// The device or node does not support this action (e.g. fan control on
    /// a fanless SXM board). A normal result, not a failure.
    NotApplicable,
    /// The hold was recorded; a more restrictive hold already decides the
    /// device's value, so nothing on the device changed.
    Held,
}

/// An automatic revert the agent will perform on its own clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseInfo {
    pub revert_at_ms: i64,
}

/// The result of a mutating op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionResult {
    pub outcome: Outcome,
    /// The state the change touches, captured before it.
    pub before: Value,
    /// The state after (or, for a dry run, what it would be).
    pub after: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    /// The hold this change placed (or updated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<super::HoldInfo>,
    /// Holds this request released (`reset_fan`, `resume`, …), and what
    /// became of their settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<super::ReleaseResult>,
}

/// Faults and workload the `sim` backend can be told to model. Refused on
/// real hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SimFault {
    /// The GPU's fan (or, on fanless boards, its share of chassis airflow)
    /// stops.
    FanFailure { gpu: u32 },
    /// Undo a fan failure.
    FanRepair { gpu: u32 },
    /// Thermal resistance multiplied by `factor` (dust, dried paste).
    HeatsinkDegradation { gpu: u32, factor: f64 },
    /// The thermal interface over a GPU's HBM stacks degrades: the memory
    /// rises `factor` times as far above the inlet as before, while the
    /// GPU's own sensor reads as usual (HBM that overheats under a cool
    /// die).
    HbmCooling { gpu: u32, factor: f64 },
    /// Cooling that degrades slowly: thermal resistance rises linearly to
    /// `factor` over `over_secs` (the field report's climb from 65 to 95 °C
    /// in six hours).
    HeatsinkRamp { gpu: u32, factor: f64, over_secs: u64 },
    /// Set the workload's utilisation on one GPU or all of them.
    Load {
        #[serde(default)]
        gpu: Option<u32>,
        util_pct: f64,
    },
    /// Multiply power demand by `factor` (a heavier kernel mix).
    LoadSurge {
        #[serde(default)]
        gpu: Option<u32>,
        factor: f64,
    },
    /// A physical NVLink fault: links down, error counters rising, P2P
    /// latency ~50 µs, all-reduce p99 above 5 ms. (A bad NCCL or fabric
    /// manager config raises latency with every link up.)
    NvlinkMisconfig { active: bool },
    /// Double-bit ECC errors on a GPU.
    EccDbe { gpu: u32, count: u64 },
    /// An XID event on a GPU (the reading holds its last value). XID 79
    /// (fallen off the bus) also loses the GPU, XID 74 an NVLink link.
    Xid { gpu: u32, code: u32 },
    /// The GPU falls off the bus: it stops reporting (its neighbours go
    /// on) and its jobs hang, until it is reset.
    GpuLost { gpu: u32 },
    /// A person resets the GPU (`nvidia-smi -r`, or a reboot): it reports
    /// again, its volatile ECC counters and pending row remaps clear; the
    /// XID gauge keeps its last value.
    GpuReset { gpu: u32 },
    /// A row remap fails (no spare row left): the GPU needs an RMA.
    RowRemapFailure { gpu: u32 },
    /// A technician replaces the GPU (an RMA, a reseat of a new part): it
    /// answers again with no error history — no ECC counts, no XID, no
    /// failed or pending remap, a clean thermal interface.
    GpuReplace { gpu: u32 },
    /// The node's chassis airflow multiplied by `factor` (a failed fan
    /// module, a blocked inlet): every GPU cooled by chassis fans runs
    /// hotter.
    ChassisAirflow { factor: f64 },
    /// Whether a GPU's processes registered for the flush signal (the
    /// default is yes); unregistered processes keep their cached blocks.
    FlushRegistration {
        #[serde(default)]
        gpu: Option<u32>,
        registered: bool,
    },
    /// Registered processes stop answering the flush signal (a flush fails).
    FlushFailure { active: bool },
    /// Load in phases: `high_pct` and `low_pct` alternating every
    /// `period_secs / 2` (an RL job's rollout and training phases).
    LoadPhases {
        #[serde(default)]
        gpu: Option<u32>,
        high_pct: f64,
        low_pct: f64,
        period_secs: u64,
    },
    /// The node's job finishes: the GPUs idle, its heartbeat stops (its
    /// files go stale).
    JobEnd {},
    /// A person sets a GPU's power limit by hand (`nvidia-smi -pl`), not
    /// through nightshift.
    PersonPowerLimit { gpu: u32, watts: f64 },
    /// A person resumes the node in the scheduler by hand.
    PersonResume {},
    /// Memory fragmentation on a GPU, in percent.
    Fragmentation { gpu: u32, pct: f64 },
    /// Memory in use on a GPU, in percent.
    MemoryUsed {
        #[serde(default)]
        gpu: Option<u32>,
        pct: f64,
    },
    /// Data-loader bottleneck: GPUs starve while the CPU is pegged.
    /// `collective_spin`: they wait for input inside a spinning collective
    /// (a starved rank holds the others in an all-reduce) — NVML reads
    /// them busy, SM activity does not.
    CpuBottleneck {
        active: bool,
        #[serde(default)]
        collective_spin: bool,
    },
    /// Utilisation swings between high and low (topology-blind all-reduce).
    UtilSwing { active: bool },
    /// Training progress stops advancing.
    JobStall { active: bool },
    /// All-reduce share of step time, in percent.
    CommOverhead { pct: f64 },
    /// A person drains the node through the scheduler (not nightshift).
    PersonDrain { reason: String },
    /// The scheduler's queue as this node's agent reads it: `jobs` waiting
    /// for the node's pool (none: the scheduler cannot say).
    PendingJobs {
        #[serde(default)]
        jobs: Option<u64>,
    },
    /// Clear every fault and restore the default workload.
    Clear {},
}

impl SimFault {
    /// The fault's GPU, when it names one.
    pub fn gpu(&self) -> Option<u32> {
        use SimFault::*;
        match self {
            FanFailure { gpu }
            | FanRepair { gpu }
            | HeatsinkDegradation { gpu, .. }
            | HbmCooling { gpu, .. }
            | HeatsinkRamp { gpu, .. }
            | EccDbe { gpu, .. }
            | Xid { gpu, .. }
            | GpuLost { gpu }
            | GpuReset { gpu }
            | RowRemapFailure { gpu }
            | GpuReplace { gpu }
            | PersonPowerLimit { gpu, .. }
            | Fragmentation { gpu, .. } => Some(*gpu),
            Load { gpu, .. }
            | LoadSurge { gpu, .. }
            | FlushRegistration { gpu, .. }
            | LoadPhases { gpu, .. }
            | MemoryUsed { gpu, .. } => *gpu,
            _ => None,
        }
    }

    /// Check the fault's values against their ranges and a node with
    /// `gpus` GPUs: a scenario refuses a bad one when it loads, the sim
    /// backend when it is injected.
    pub fn validate(&self, gpus: u32) -> Result<(), String> {
        use SimFault::*;
        if let Some(g) = self.gpu()
            && g >= gpus
        {
            return Err(format!(
                "gpu {g}: expected 0 to {}, found {g} (the node has {gpus} GPUs)",
                gpus.saturating_sub(1)
            ));
        }
        let pct = |field: &str, v: f64| {
            if (0.0..=100.0).contains(&v) { Ok(()) } else { Err(format!("{field}: expected 0 to 100, found {v}")) }
        };
        match self {
            HeatsinkDegradation { factor, .. } if !(1.0..=10.0).contains(factor) => {
                Err(format!("heatsink factor: expected 1 to 10, found {factor}"))
            }
            HbmCooling { factor, .. } if !(1.0..=5.0).contains(factor) => {
                Err(format!("hbm cooling factor: expected 1 to 5, found {factor}"))
            }
            HeatsinkRamp { factor, over_secs, .. }
                if !(1.0..=10.0).contains(factor) || !(1..=7 * 86_400).contains(over_secs) =>
            {
                Err(format!(
                    "heatsink ramp: expected factor 1 to 10 and over_secs 1 to 604800, found {factor} and {over_secs}"
                ))
            }
            Load { util_pct, .. } => pct("util_pct", *util_pct),
            LoadPhases { high_pct, low_pct, period_secs, .. } => {
                pct("high_pct", *high_pct)?;
                pct("low_pct", *low_pct)?;
                if (2..=86_400).contains(period_secs) {
                    Ok(())
                } else {
                    Err(format!("load phases: period_secs: expected 2 to 86400, found {period_secs}"))
                }
            }
            LoadSurge { factor, .. } if !(0.1..=2.0).contains(factor) => {
                Err(format!("surge factor: expected 0.1 to 2, found {factor}"))
            }
            ChassisAirflow { factor } if !(0.05..=1.0).contains(factor) => {
                Err(format!("chassis airflow factor: expected 0.05 to 1, found {factor}"))
            }
            PersonPowerLimit { watts, .. } if !(watts.is_finite() && *watts > 0.0 && *watts <= 100_000.0) => {
                Err(format!("person power limit: expected watts from 1 to 100000, found {watts}"))
            }
            Fragmentation { pct: v, .. } => pct("pct", *v),
            MemoryUsed { pct: v, .. } => pct("pct", *v),
            CommOverhead { pct: v } => pct("pct", *v),
            EccDbe { count, .. } if *count == 0 || *count > 1_000_000 => {
                Err(format!("ecc_dbe count: expected 1 to 1000000, found {count}"))
            }
            Xid { code, .. } if *code == 0 || *code > 1_000 => {
                Err(format!("xid code: expected 1 to 1000, found {code}"))
            }
            _ => Ok(()),
        }
    }
}
