//! Starting an agent from its config: keys, backend, clock, the SSH server
//! and the background loops (leases and fan curves; sim physics). Used by
//! the `nightshift-agent` binary, by `nightshift demo` and by tests.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{self, Backend, BackendError, BackendKind};
use crate::config::{AgentConfig, ConfigError};
use crate::service::{Agent, AgentError};
use crate::ssh::server::{RunningAgentServer, ServerOptions, serve};
use nightshift_proto::clock::{ScaledClock, SharedClock, SystemClock};
use nightshift_proto::ssh::keys::{self, KeyError};

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
}

/// A running agent.
pub struct StartedAgent {
    pub agent: Arc<Agent>,
    pub server: RunningAgentServer,
    pub host_key_fingerprint: String,
    pub host_key_created: bool,
    /// Where the dcgm-exporter-compatible `/metrics` listens, if enabled.
    pub exporter_addr: Option<std::net::SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StartedAgent {
    /// Stop the loops and the server, and let go of the state dir.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.server.shutdown().await;
        self.agent.close();
    }

    /// Stop at once, without waiting (a crash, for tests: as a process
    /// that dies, it lets go of the state dir).
    pub fn kill(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.server.abort();
        self.agent.close();
    }
}

/// Open the configured backend (or `kind` when given).
pub fn open_backend(cfg: &AgentConfig, kind: Option<BackendKind>) -> Result<Arc<dyn Backend>, BackendError> {
    Ok(match kind.unwrap_or(cfg.backend) {
        BackendKind::Sim => Arc::new(
            backend::sim::SimBackend::new(cfg.sim.clone())?.persist_to(cfg.state_dir.join("sim-hardware.json")),
        ),
        BackendKind::Nvml => Arc::new(backend::nvml::NvmlBackend::open(cfg.nvml_lib_path.as_deref())?),
        BackendKind::Rocm => Arc::from(backend::open_rocm()?),
        BackendKind::Auto => Arc::from(backend::open_auto(cfg.nvml_lib_path.as_deref())?),
    })
}

/// The clock the config asks for.
pub fn clock_for(cfg: &AgentConfig) -> SharedClock {
    match (cfg.sim_time_scale > 1.0, cfg.sim_time_origin_ms) {
        (true, Some(origin)) => Arc::new(ScaledClock::anchored(cfg.sim_time_scale, origin)),
        (true, None) => Arc::new(ScaledClock::new(cfg.sim_time_scale)),
        (false, _) => Arc::new(SystemClock),
    }
}

/// Start an agent from its config.
pub async fn start(cfg: &AgentConfig, kind: Option<BackendKind>) -> Result<StartedAgent, StartError> {
    let backend = open_backend(cfg, kind)?;
    start_with(cfg, backend, clock_for(cfg)).await
}

/// Start an agent with a given backend and clock.
pub async fn start_with(
    cfg: &AgentConfig,
    backend: Arc<dyn Backend>,
    clock: SharedClock,
) -> Result<StartedAgent, StartError> {
    // A host key from an earlier start says the state dir was used: its
    // state log must be there (the agent first, so that a start that fails
    // before its state log exists leaves no key behind to say otherwise).
    let mut opts = cfg.options()?;
    if cfg.host_key_path.exists() {
        opts.used_before = Some(format!("its host key {} exists", cfg.host_key_path.display()));
    }
    let authorized = keys::load_authorized(&cfg.authorized_keys_path)?;
    let agent = Arc::new(Agent::new(opts, backend.clone(), clock.clone())?);
    let (host_key, created) = keys::load_or_create(&cfg.host_key_path, &format!("nightshift-agent@{}", cfg.node))?;
    let fingerprint = keys::fingerprint(host_key.public_key());
    let listener = tokio::net::TcpListener::bind(&cfg.listen_addr)
        .await
        .map_err(|source| StartError::Listen { addr: cfg.listen_addr.clone(), source })?;
    let server = serve(
        agent.clone(),
        listener,
        ServerOptions {
            host_key,
            authorized,
            authorized_path: Some(cfg.authorized_keys_path.clone()),
            limits: cfg.ssh.clone(),
        },
    )
    .map_err(|source| StartError::Listen { addr: cfg.listen_addr.clone(), source })?;
    let mut tasks = Vec::new();
    let a = agent.clone();
    // Under a sped-up clock the loops speed up too (at most one simulated
    // second between physics steps; fan curves and leases keep pace).
    let scale = clock.scale().max(1.0);
    let tick_ms = ((250.0 / scale) as u64).clamp(10, 250);
    let physics_ms = ((1000.0 / scale) as u64).clamp(10, 100);
    tasks.push(tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(tick_ms));
        loop {
            every.tick().await;
            a.tick().await;
        }
    }));
    if backend.sim().is_some() {
        let b = backend.clone();
        let scale = clock.scale();
        tasks.push(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(physics_ms));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = tokio::time::Instant::now();
            loop {
                every.tick().await;
                let now = tokio::time::Instant::now();
                let dt = (now - last).as_secs_f64() * scale;
                last = now;
                if let Some(sim) = b.sim() {
                    sim.step(dt);
                }
            }
        }));
    }
    let mut exporter_addr = None;
    if let Some(addr) = &cfg.exporter_listen_addr {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr: addr.clone(), source })?;
        exporter_addr = l.local_addr().ok();
        tasks.push(tokio::spawn(crate::exporter::serve(agent.clone(), l)));
        tracing::info!(addr = ?exporter_addr, "dcgm-compatible exporter listening");
    }
    tracing::info!(
        node = %cfg.node, addr = %server.local_addr, backend = backend.name(),
        host_key = %fingerprint, host_key_created = created, "agent started"
    );
    Ok(StartedAgent {
        agent,
        server,
        host_key_fingerprint: fingerprint,
        host_key_created: created,
        exporter_addr,
        tasks,
    })
}
