//! The agent's config file (`agent.yaml`): config → validate → build.
//!
//! Relative paths are resolved against the config file's folder, so an
//! example folder works wherever it is checked out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::backend::sim::SimConfig;
use crate::envelope::Policy;
use crate::node::caches::FlushConfig;
use crate::node::configs::ManagedConfig;
use crate::node::scheduler::SchedulerConfig;
use crate::service::AgentOptions;

/// `agent.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Always 1.
    pub version: u32,
    /// This node's name, as in the engine's inventory and the scheduler.
    pub node: String,
    /// SSH listen address, e.g. `0.0.0.0:2222`.
    pub listen_addr: String,
    /// Holds the journal, leases, config history and (for `none`) the drain
    /// state.
    pub state_dir: PathBuf,
    /// Generated on first start (mode 0600) when missing.
    pub host_key_path: PathBuf,
    /// Public keys allowed in: the engine's.
    pub authorized_keys_path: PathBuf,
    /// The safety policy; built-in defaults when absent.
    #[serde(default)]
    pub policy_path: Option<PathBuf>,
    #[serde(default = "default_backend")]
    pub backend: BackendKind,
    /// Load NVML from this file instead of `libnvidia-ml.so.1`.
    #[serde(default)]
    pub nvml_lib_path: Option<PathBuf>,
    /// The simulated node (backend `sim`).
    #[serde(default)]
    pub sim: SimConfig,
    /// Run simulated time this many times faster than wall time (demo).
    #[serde(default = "one")]
    pub sim_time_scale: f64,
    /// With `sim_time_scale`: the moment (Unix ms) the scaled time counts
    /// from, shared with the engine's `time_origin_ms` (tests, demos).
    #[serde(default)]
    pub sim_time_origin_ms: Option<i64>,
    #[serde(default = "default_interval")]
    pub telemetry_interval_ms: u64,
    #[serde(default = "default_max_request")]
    pub max_request_bytes: usize,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    #[serde(default)]
    pub flush_caches: Option<FlushConfig>,
    /// Managed config files by name.
    #[serde(default)]
    pub configs: BTreeMap<String, ManagedConfig>,
    /// Serve telemetry in dcgm-exporter's format at this address (`:9400`).
    #[serde(default)]
    pub exporter_listen_addr: Option<String>,
    /// How long and how many connections may wait to authenticate.
    #[serde(default)]
    pub ssh: crate::ssh::server::ConnLimits,
    /// A folder where training jobs write their readings (progress,
    /// allocator fragmentation, communication share): see `node::jobfile`
    /// and `examples/pytorch/nightshift_textfile.py`.
    #[serde(default)]
    pub job_metrics_dir: Option<PathBuf>,
    /// Job files older than this are ignored (the job stopped writing).
    #[serde(default = "default_job_age")]
    pub job_metrics_max_age_secs: u64,
    /// `nightshift-agent run --new-state`: a state dir used before may
    /// start without its state log (never read from the file).
    #[serde(skip)]
    pub new_state: bool,
}

fn default_job_age() -> u64 {
    120
}

fn default_backend() -> BackendKind {
    BackendKind::Auto
}
fn one() -> f64 {
    1.0
}
fn default_interval() -> u64 {
    1000
}
fn default_max_request() -> usize {
    32 * 1024
}

/// A config that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error(transparent)]
    Policy(#[from] crate::envelope::PolicyError),
}

impl AgentConfig {
    /// An in-process sim node on a loopback port, its host key and cache
    /// flush paths under `state_dir`, every other field at its default —
    /// for the demo and the benchmarks, which then set what differs.
    pub fn sim_node(node: &str, state_dir: &Path, authorized_keys_path: &Path, sim: SimConfig) -> AgentConfig {
        AgentConfig {
            version: 1,
            node: node.to_string(),
            listen_addr: "127.0.0.1:0".into(),
            state_dir: state_dir.to_path_buf(),
            host_key_path: state_dir.join("host_key"),
            authorized_keys_path: authorized_keys_path.to_path_buf(),
            policy_path: None,
            backend: BackendKind::Sim,
            nvml_lib_path: None,
            sim,
            sim_time_scale: one(),
            sim_time_origin_ms: None,
            telemetry_interval_ms: default_interval(),
            max_request_bytes: default_max_request(),
            scheduler: SchedulerConfig::default(),
            flush_caches: Some(FlushConfig {
                drop_caches_path: state_dir.join("drop_caches"),
                registry_dir: state_dir.join("flush.d"),
                ..FlushConfig::default()
            }),
            configs: BTreeMap::new(),
            exporter_listen_addr: None,
            ssh: Default::default(),
            job_metrics_dir: None,
            job_metrics_max_age_secs: default_job_age(),
            new_state: false,
        }
    }

    /// Read, resolve relative paths, validate.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        Self::parse(&text, path)
    }

    /// Parse text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<AgentConfig, ConfigError> {
        let mut cfg: AgentConfig = nightshift_proto::yaml::from_str(text).map_err(|e| {
            let (line, column, message) = nightshift_proto::yaml::error_parts(&e);
            ConfigError::Parse { path: path.into(), line, column, message }
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve(base);
        cfg.validate().map_err(|(needle, message)| {
            let (line, column) = nightshift_proto::yaml::locate(text, &needle);
            ConfigError::Parse { path: path.into(), line, column, message }
        })?;
        Ok(cfg)
    }

    fn resolve(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut self.state_dir);
        fix(&mut self.host_key_path);
        fix(&mut self.authorized_keys_path);
        if let Some(p) = self.policy_path.as_mut() {
            fix(p);
        }
        if let Some(p) = self.nvml_lib_path.as_mut() {
            fix(p);
        }
        if let Some(f) = self.flush_caches.as_mut() {
            fix(&mut f.drop_caches_path);
            fix(&mut f.registry_dir);
        }
        for m in self.configs.values_mut() {
            fix(&mut m.path);
        }
        if let Some(p) = self.job_metrics_dir.as_mut() {
            fix(p);
        }
    }

    /// Check what serde cannot; an error names the key to point at.
    fn validate(&self) -> Result<(), (String, String)> {
        let fail = |needle: &str, message: String| Err((needle.to_string(), message));
        if self.version != 1 {
            return fail("version", format!("unsupported config version: expected 1, found {}", self.version));
        }
        if self.node.trim().is_empty() {
            return fail("node", "node: expected a node name, found an empty string".into());
        }
        if self.listen_addr.parse::<std::net::SocketAddr>().is_err() {
            return fail(
                "listen_addr",
                format!("listen_addr: expected host:port such as 0.0.0.0:2222, found {:?}", self.listen_addr),
            );
        }
        if !(1.0..=1000.0).contains(&self.sim_time_scale) {
            return fail(
                "sim_time_scale",
                format!("sim_time_scale: expected 1 to 1000, found {}", self.sim_time_scale),
            );
        }
        if let Some(origin) = self.sim_time_origin_ms
            && (self.sim_time_scale <= 1.0 || origin < 0)
        {
            return fail(
                "sim_time_origin_ms",
                format!(
                    "sim_time_origin_ms: expected a Unix time in ms (0 or more) with a sim_time_scale above 1, found {origin} with sim_time_scale {}",
                    self.sim_time_scale
                ),
            );
        }
        if !(10..=60_000).contains(&self.telemetry_interval_ms) {
            return fail(
                "telemetry_interval_ms",
                format!("telemetry_interval_ms: expected 10 to 60000, found {}", self.telemetry_interval_ms),
            );
        }
        if !(1024..=60_000).contains(&self.max_request_bytes) {
            return fail(
                "max_request_bytes",
                format!("max_request_bytes: expected 1024 to 60000, found {}", self.max_request_bytes),
            );
        }
        if self.backend == BackendKind::Sim
            && let Err((key, m)) = self.sim.check()
        {
            return fail(key, m);
        }
        if let Some(a) = &self.exporter_listen_addr
            && a.parse::<std::net::SocketAddr>().is_err()
        {
            return fail(
                "exporter_listen_addr",
                format!("exporter_listen_addr: expected host:port such as 0.0.0.0:9400, found {a:?}"),
            );
        }
        if let Err((key, m)) = self.ssh.check() {
            return fail(key, m);
        }
        if !(1..=86_400).contains(&self.job_metrics_max_age_secs) {
            return fail(
                "job_metrics_max_age_secs",
                format!("job_metrics_max_age_secs: expected 1 to 86400, found {}", self.job_metrics_max_age_secs),
            );
        }
        if let Some(f) = &self.flush_caches {
            f.signal().map_err(|m| ("flush_caches".to_string(), m))?;
            f.check().map_err(|m| ("flush_caches".to_string(), m))?;
        }
        Ok(())
    }

    /// The policy file's content, or the defaults (marker in the state dir).
    pub fn policy(&self) -> Result<Policy, ConfigError> {
        match &self.policy_path {
            Some(p) => Ok(Policy::load(p)?),
            None => Ok(Policy { hands_off_marker_path: self.state_dir.join("hands-off"), ..Policy::default() }),
        }
    }

    /// Build the service options.
    pub fn options(&self) -> Result<AgentOptions, ConfigError> {
        let mut o = AgentOptions::new(&self.node, self.state_dir.clone());
        o.policy = self.policy()?;
        o.scheduler = self.scheduler.clone();
        if let Some(f) = &self.flush_caches {
            o.flush = f.clone();
        } else {
            o.flush = FlushConfig::default();
        }
        o.configs = self.configs.clone();
        o.telemetry_interval_ms = self.telemetry_interval_ms;
        o.max_request_bytes = self.max_request_bytes;
        o.job_metrics_dir = self.job_metrics_dir.clone();
        o.job_metrics_max_age_secs = self.job_metrics_max_age_secs;
        o.new_state = self.new_state;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agent.yaml");
        let cfg = AgentConfig::load(&path).unwrap();
        assert_eq!(cfg.version, 1);
        assert!(cfg.state_dir.is_absolute());
        cfg.policy().unwrap();
    }

    #[test]
    fn errors_say_where_and_what() {
        let cases = [
            (
                "version: 1\nnode: a\nlisten_addr: 1.2.3.4:22\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\nbackend: cuda\n",
                "agent.yaml:7:10: backend: unknown variant `cuda`, expected one of `auto`, `sim`, `nvml`, `rocm`",
            ),
            (
                "version: 1\nnode: a\nlisten_addr: nope\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\n",
                "agent.yaml:3:1: listen_addr: expected host:port such as 0.0.0.0:2222, found \"nope\"",
            ),
            (
                "version: 1\nnode: a\nlisten_addr: 1.2.3.4:22\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\nbackend: sim\nsim: {profile: h300-sxm}\n",
                "agent.yaml:8:7: sim: unknown profile `h300-sxm`: expected one of h100-sxm",
            ),
            (
                "version: 1\nnode: a\nlisten_addr: 1.2.3.4:22\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\nbackend: sim\nsim: {gpus: 0}\n",
                "agent.yaml:8:7: sim: gpus must be 1 to 16, found 0",
            ),
            ("version: 1\nnode: a\n", "agent.yaml:1:1: missing field `listen_addr`"),
            // Issue 46 point 8: a second entry of one name, last one won.
            (
                "version: 1\nnode: a\nlisten_addr: 1.2.3.4:22\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\nconfigs:\n  nccl-env: {path: /etc/nccl.conf}\n  nccl-env: {path: /etc/shadow}\n",
                "agent.yaml:8:3: configs: duplicate entry with key \"nccl-env\"",
            ),
            (
                "version: 1\nnode: a\nlisten_addr: 1.2.3.4:22\nstate_dir: s\nhost_key_path: k\nauthorized_keys_path: a\nsim: {gpus: many}\n",
                "agent.yaml:7:13: sim.gpus: invalid type: string \"many\", expected u32",
            ),
        ];
        for (text, want) in cases {
            let err = AgentConfig::parse(text, Path::new("agent.yaml")).unwrap_err().to_string();
            assert!(err.starts_with(want), "got {err:?}\nwant {want:?}");
        }
    }
}
