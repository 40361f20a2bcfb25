//! A simulated fleet driven in virtual time: real engine, real agent code on
//! the `sim` backend, in-process transports, one [`VirtualClock`]. A
//! 30-minute incident runs in well under a second.
//!
//! Each [`SimFleet::step`] advances the clock one tick, steps every node's
//! physics, runs the agents' periodic work, feeds their telemetry to the
//! engine, ticks the engine, then waits until every run is asleep on the
//! clock or finished — so time never moves under a run that is working.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use serde::{Deserialize, Serialize};

use nightshift_agent::LocalAgent;
use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::envelope::Policy;
pub use nightshift_agent::node::configs::Consumer;
use nightshift_agent::node::configs::ManagedConfig;
use nightshift_agent::service::{Agent, AgentOptions};
use nightshift_proto::clock::{SharedClock, VirtualClock};
use nightshift_proto::ssh::client::{AgentTransport, ClientError};
use nightshift_proto::{Op, Reply, Request, SimFault};

use nightshift_engine::audit::AuditStore;
use nightshift_engine::config::{AuthConfig, EngineConfig, Limits, TelemetryConfig};
use nightshift_engine::embed::NodeSpec;
use nightshift_engine::embed::RunbookSet;
use nightshift_engine::embed::ScriptLimits;
use nightshift_engine::engine::{Engine, EngineParts};

/// One simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimNodeSpec {
    pub name: String,
    #[serde(default = "d_profile")]
    pub profile: String,
    #[serde(default = "d_gpus")]
    pub gpus: u32,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub standby: bool,
    /// Starts drained with this reason (`nightshift: …` for its own).
    #[serde(default)]
    pub drained: Option<String>,
    /// Managed config files and their initial content.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    #[serde(default)]
    pub util_pct: Option<f64>,
    /// Once the node is drained, its running jobs go on this long before
    /// they end (a drain stops new work, not running jobs). Default 1200.
    #[serde(default)]
    pub jobs_end_after_drain_secs: Option<u64>,
    /// Who reads each managed config (`files`, `jobs`, `unit`): a change
    /// takes effect when that consumer restarts. Default: a config whose
    /// name holds `fabric` is read by the `nvidia-fabricmanager` unit, any
    /// other by the jobs.
    #[serde(default)]
    pub consumers: BTreeMap<String, Consumer>,
    /// GPUs in the jobs placed here, across nodes (default: this node's).
    #[serde(default)]
    pub job_world_size: Option<u32>,
    /// The scheduler's power saving has this node powered down: its agent
    /// does not answer until a `power_node` powers it up, and it then takes
    /// `boot_secs` to boot (default 300).
    #[serde(default)]
    pub powered_off: bool,
    #[serde(default)]
    pub boot_secs: Option<u64>,
    /// The node's BMC lets nightshift drive the chassis fans (default yes;
    /// `false`: a board without GPU fans has nothing nightshift can turn
    /// up).
    #[serde(default = "yes")]
    pub bmc: bool,
}

fn yes() -> bool {
    true
}

/// A simulated node's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    On,
    Off,
    /// Booting; up at this time (ms).
    Booting(i64),
}

/// Every node's power, shared by the fleet, its links and the power hook.
pub type PowerMap = Arc<std::sync::Mutex<BTreeMap<String, (Power, i64)>>>;

/// The default consumer of a managed config by its name.
pub fn default_consumer(name: &str) -> Consumer {
    if name.contains("fabric") { Consumer::Unit } else { Consumer::Jobs }
}

fn d_profile() -> String {
    "h100-sxm".into()
}
fn d_gpus() -> u32 {
    2
}

/// Options for [`SimFleet::start`].
pub struct SimFleetOptions {
    pub nodes: Vec<SimNodeSpec>,
    pub runbooks: RunbookSet,
    pub script_engine: Arc<rhai::Engine>,
    /// Virtual seconds per step.
    pub tick_ms: i64,
    pub start_ms: i64,
    pub policy: Option<Policy>,
    pub limits: Limits,
    /// Wrap each node's transport (fault injection in tests).
    pub wrap_transport: Option<TransportWrapper>,
    /// API tokens (for web tests).
    pub auth: AuthConfig,
    /// Grafana links on the pages.
    pub grafana: Option<nightshift_engine::config::GrafanaConfig>,
    /// The autoscaler webhook, if the test runs one.
    pub autoscaler: Option<nightshift_engine::config::AutoscalerConfig>,
    /// The engine's telemetry settings (a backtest keeps no plot history).
    pub telemetry: TelemetryConfig,
    /// Where pages go (a test's receiver).
    pub notifications: nightshift_engine::config::NotificationsConfig,
    /// The site's XID policy overrides (engine.yaml `fault_policy_path`).
    pub fault_policy_path: Option<PathBuf>,
}

impl SimNodeSpec {
    /// A serving node with `gpus` GPUs of `profile`, no labels, no drain, no
    /// managed configs.
    pub fn new(name: &str, profile: &str, gpus: u32) -> SimNodeSpec {
        SimNodeSpec {
            name: name.into(),
            profile: profile.into(),
            gpus,
            seed: 1,
            labels: Default::default(),
            standby: false,
            drained: None,
            configs: Default::default(),
            util_pct: None,
            jobs_end_after_drain_secs: None,
            consumers: Default::default(),
            job_world_size: None,
            powered_off: false,
            boot_secs: None,
            bmc: true,
        }
    }
}

/// Wraps a node's transport: `(node name, transport) → transport`.
pub type TransportWrapper = Box<dyn Fn(&str, Arc<dyn AgentTransport>) -> Arc<dyn AgentTransport> + Send + Sync>;

impl SimFleetOptions {
    pub fn new(nodes: Vec<SimNodeSpec>, runbooks: RunbookSet, script_engine: Arc<rhai::Engine>) -> SimFleetOptions {
        SimFleetOptions {
            nodes,
            runbooks,
            script_engine,
            tick_ms: 1000,
            start_ms: 1_790_000_000_000,
            policy: None,
            limits: Limits::default(),
            wrap_transport: None,
            auth: AuthConfig::default(),
            grafana: None,
            autoscaler: None,
            telemetry: TelemetryConfig::default(),
            notifications: Default::default(),
            fault_policy_path: None,
        }
    }
}

/// The running simulation.
pub struct SimFleet {
    pub clock: VirtualClock,
    pub engine: Engine,
    pub agents: BTreeMap<String, Arc<Agent>>,
    pub sims: BTreeMap<String, Arc<SimBackend>>,
    pub tick_ms: i64,
    pub dir: PathBuf,
    /// Each node's power (power saving), and how long it boots.
    pub power: PowerMap,
    /// What a restart needs to build the same engine and agents again.
    rebuild: Rebuild,
}

/// The parts of a fleet a restart builds again.
struct Rebuild {
    /// Each node's agent options and the slot the engine reaches it through.
    agents: BTreeMap<String, (AgentOptions, AgentSlot)>,
    specs: Vec<NodeSpec>,
    runbooks: RunbookSet,
    script: Arc<rhai::Engine>,
    wrap_transport: Option<TransportWrapper>,
    /// Cut when the engine that uses these links "dies".
    links_alive: Arc<AtomicBool>,
    engine_generation: u32,
}

/// The agent currently serving a node; an agent restart swaps it.
#[derive(Clone)]
struct AgentSlot(Arc<RwLock<Arc<Agent>>>);

impl AgentSlot {
    fn get(&self) -> Arc<Agent> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One engine's connection to one node: the current agent behind the slot,
/// until the engine it belongs to is restarted (then every call fails, as a
/// dead process's connections do), and only while the node is powered.
struct EngineLink {
    slot: AgentSlot,
    alive: Arc<AtomicBool>,
    power: PowerMap,
}

impl AgentTransport for EngineLink {
    fn call(&self, req: Request) -> BoxFuture<'_, Result<Reply, ClientError>> {
        Box::pin(async move {
            if !self.alive.load(Ordering::SeqCst) {
                return Err(ClientError::Channel {
                    addr: self.slot.get().node().to_string(),
                    message: "the engine that owned this connection was restarted".into(),
                });
            }
            let node = self.slot.get().node().to_string();
            let power = self.power.lock().unwrap_or_else(|e| e.into_inner()).get(&node).map(|p| p.0);
            if power.is_some_and(|p| p != Power::On) {
                return Err(ClientError::Connect {
                    addr: node,
                    message: "the node is powered off (power saving)".into(),
                });
            }
            let agent = self.slot.get();
            LocalAgent(agent).call(req).await
        })
    }
}

/// The simulation stopped making progress.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulation stuck: runs kept working for {0:?} of real time without sleeping or finishing: {1:?}")]
    Stuck(Duration, Vec<String>),
    #[error("{0}")]
    Setup(String),
}

/// A folder for a simulation's state: in /dev/shm when there is one (fast
/// fsync), else the system temp folder.
pub fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { tempfile::Builder::new().prefix("nightshift-sim").tempdir_in(shm) } else { tempfile::tempdir() }
}

impl SimFleet {
    /// Build the agents and the engine in `dir`.
    pub async fn start(opts: SimFleetOptions, dir: &Path) -> Result<SimFleet, SimError> {
        // Runs take turns in run order and ids come from the seed: the same
        // scenario gives the same result, byte for byte.
        let clock = VirtualClock::serial(opts.start_ms, 0x5eed ^ opts.nodes.len() as u64);
        let shared: SharedClock = Arc::new(clock.clone());
        let mut agents = BTreeMap::new();
        let mut sims = BTreeMap::new();
        let mut specs = Vec::new();
        let mut slots = BTreeMap::new();
        let power: PowerMap = Arc::new(std::sync::Mutex::new(
            opts.nodes
                .iter()
                .map(|n| {
                    let state = if n.powered_off { Power::Off } else { Power::On };
                    (n.name.clone(), (state, n.boot_secs.unwrap_or(300) as i64 * 1000))
                })
                .collect(),
        ));
        let hook: nightshift_agent::backend::sim::PowerHook = {
            let power = power.clone();
            let clock = clock.clone();
            Arc::new(move |node: &str, up: bool| {
                let mut p = power.lock().unwrap_or_else(|e| e.into_inner());
                let Some((state, boot_ms)) = p.get_mut(node) else {
                    return Err(format!("the scheduler knows no node {node}"));
                };
                let now = nightshift_proto::clock::Clock::now_ms(&clock);
                *state = match (up, *state) {
                    (true, Power::Off) => Power::Booting(now + *boot_ms),
                    (true, s) => s,
                    (false, _) => Power::Off,
                };
                Ok(())
            })
        };
        for (i, n) in opts.nodes.iter().enumerate() {
            let sim = Arc::new(
                SimBackend::new(SimConfig {
                    profile: n.profile.clone(),
                    gpus: n.gpus,
                    seed: n.seed.wrapping_add(i as u64 * 7919),
                    util_pct: n.util_pct.unwrap_or(85.0),
                    ..SimConfig::default()
                })
                .map_err(|e| SimError::Setup(format!("node {}: {e}", n.name)))?,
            );
            // The agent's folder by position, not by name: a name from a
            // recording or a scenario never becomes a path.
            let state = dir.join("agents").join(format!("node-{i:05}"));
            let mut o = AgentOptions::new(&n.name, state.clone());
            if let Some(p) = &opts.policy {
                o.policy = Policy { hands_off_marker_path: state.join("hands-off"), ..p.clone() };
            }
            let mut job_configs = Vec::new();
            for (name, content) in &n.configs {
                let path = state.join(format!("{name}.conf"));
                std::fs::create_dir_all(&state).map_err(|e| SimError::Setup(e.to_string()))?;
                std::fs::write(&path, content).map_err(|e| SimError::Setup(e.to_string()))?;
                // What the node booted with is in effect.
                sim.on_config_applied(name, content);
                sim.on_consumer_restarted(name);
                let consumer = n.consumers.get(name).copied().unwrap_or_else(|| default_consumer(name));
                if consumer == Consumer::Jobs {
                    job_configs.push(name.clone());
                }
                o.configs.insert(
                    name.clone(),
                    ManagedConfig {
                        path,
                        consumer,
                        unit: (consumer == Consumer::Unit).then(|| "nvidia-fabricmanager".to_string()),
                        // The simulated host has no systemd: the restart is
                        // a real process that does nothing, then the model
                        // restarts the service.
                        systemctl_path: "true".into(),
                    },
                );
            }
            sim.set_job_configs(job_configs);
            sim.set_power_hook(hook.clone());
            sim.set_bmc(n.bmc);
            if let Some(w) = n.job_world_size {
                sim.set_job_world_size(w);
            }
            let backend: Arc<dyn Backend> = sim.clone();
            let agent =
                Arc::new(Agent::new(o.clone(), backend, shared.clone()).map_err(|e| SimError::Setup(e.to_string()))?);
            if let Some(reason) = &n.drained {
                agent
                    .handle(Request::new("setup-drain", Op::SimFault(SimFault::PersonDrain { reason: reason.clone() })))
                    .await;
            }
            specs.push(NodeSpec {
                name: n.name.clone(),
                address: format!("sim:{}", n.name),
                host_key: "SHA256:sim".into(),
                labels: n.labels.clone(),
                standby: n.standby,
                power_saving: n.powered_off || n.boot_secs.is_some(),
            });
            slots.insert(n.name.clone(), (o, AgentSlot(Arc::new(RwLock::new(agent.clone())))));
            agents.insert(n.name.clone(), agent);
            sims.insert(n.name.clone(), sim);
        }
        let links_alive = Arc::new(AtomicBool::new(true));
        let nodes = links(&specs, &slots, &links_alive, &power, opts.wrap_transport.as_ref());
        // The runbooks' files where the engine's config says they are, so a
        // reload reads the same set (an empty or missing folder is refused).
        let rb_dir = dir.join("runbooks");
        std::fs::create_dir_all(&rb_dir).map_err(|e| SimError::Setup(format!("runbook folder: {e}")))?;
        for rb in &opts.runbooks.runbooks {
            for f in [&rb.manifest_path, &rb.script_path] {
                if let Some(name) = f.file_name() {
                    let _ = std::fs::copy(f, rb_dir.join(name));
                }
            }
        }
        let config = EngineConfig {
            version: 1,
            listen_addr: "127.0.0.1:0".into(),
            data_dir: dir.join("engine"),
            runbook_dir: dir.join("runbooks"),
            inventory_path: dir.join("fleet.yaml"),
            engine_key_path: dir.join("engine_key"),
            initial_fleet_mode: Default::default(),
            limits: opts.limits.clone(),
            script: ScriptLimits::default(),
            telemetry: opts.telemetry.clone(),
            auth: opts.auth.clone(),
            sources: Default::default(),
            notifications: opts.notifications.clone(),
            time_scale: 1.0,
            time_origin_ms: None,
            grafana: opts.grafana.clone(),
            autoscaler: opts.autoscaler.clone(),
            audit: Default::default(),
            fault_policy_path: opts.fault_policy_path.clone(),
            source_path: None,
        };
        let audit = AuditStore::open(&config.data_dir, shared.clone()).map_err(|e| SimError::Setup(e.to_string()))?;
        let engine = Engine::new(EngineParts {
            config,
            clock: shared,
            audit,
            nodes,
            script: opts.script_engine.clone(),
            runbooks: opts.runbooks.clone(),
        });
        engine.load_fault_policy().map_err(|e| SimError::Setup(e.to_string()))?;
        engine.refresh_inventories().await;
        let rebuild = Rebuild {
            agents: slots,
            specs,
            runbooks: opts.runbooks,
            script: opts.script_engine,
            wrap_transport: opts.wrap_transport,
            links_alive,
            engine_generation: 0,
        };
        let fleet =
            SimFleet { clock, engine, agents, sims, tick_ms: opts.tick_ms, dir: dir.to_path_buf(), power, rebuild };
        fleet.feed().await;
        Ok(fleet)
    }

    /// The engine's data folder (it changes with each engine restart).
    pub fn engine_dir(&self) -> PathBuf {
        self.engine.config().data_dir.clone()
    }

    /// The engine process dies and a new one starts on what its data
    /// folder held at that moment: the old engine's connections are cut
    /// (its runs can send nothing more), its folder is copied as it is on
    /// disk, and a new engine opens the copy, recovers and announces its
    /// start. Returns the runs recovery interrupted.
    pub async fn restart_engine(&mut self) -> Result<Vec<String>, SimError> {
        let now = self.engine_dir();
        self.restart_engine_from(&now).await
    }

    /// Copy the engine's data folder as it is now (a backup).
    pub fn snapshot_engine(&self, to: &Path) -> Result<(), SimError> {
        copy_dir(&self.engine_dir(), to).map_err(|e| SimError::Setup(format!("engine snapshot: {e}")))
    }

    /// [`SimFleet::restart_engine`], starting from the data folder `from`
    /// (the current one, or a backup taken earlier with
    /// [`SimFleet::snapshot_engine`]: "restore a backup and start").
    pub async fn restart_engine_from(&mut self, from: &Path) -> Result<Vec<String>, SimError> {
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(format!("engine restart: {e}"));
        self.rebuild.links_alive.store(false, Ordering::SeqCst);
        self.rebuild.engine_generation += 1;
        let new = self.dir.join(format!("engine.{}", self.rebuild.engine_generation));
        // The disk as the process died: copied before its runs are told to
        // stop (a dead process writes nothing after; a run that noticed the
        // cancel first would record an end no crash records).
        copy_dir(from, &new).map_err(|e| setup(&e))?;
        self.engine.cancel_all();
        self.clock.poke();
        self.stop_old_runs().await.map_err(|e| setup(&e))?;
        let alive = Arc::new(AtomicBool::new(true));
        let nodes =
            links(&self.rebuild.specs, &self.rebuild.agents, &alive, &self.power, self.rebuild.wrap_transport.as_ref());
        self.rebuild.links_alive = alive;
        let mut config = self.engine.config().clone();
        config.data_dir = new;
        let shared: SharedClock = Arc::new(self.clock.clone());
        let audit = AuditStore::open(&config.data_dir, shared.clone()).map_err(|e| setup(&e))?;
        let engine = Engine::new(EngineParts {
            config,
            clock: shared,
            audit,
            nodes,
            script: self.rebuild.script.clone(),
            runbooks: self.rebuild.runbooks.clone(),
        });
        // As a real start: the site's XID overrides as they are on disk now.
        engine.load_fault_policy().map_err(|e| setup(&e))?;
        let old = std::mem::replace(&mut self.engine, engine);
        drop(old);
        // As a real engine starts: it records its start and recovers before
        // it has connected to anyone — no inventory, no telemetry history;
        // each node's inventory comes with its first poll and its readings
        // at the scrape interval (the next steps' `feed`). Runs it resumes
        // start as soon as the queue lets them (DESIGN.md, "Simulated
        // hardware": never kinder than a real restart).
        let interrupted = self.engine.begin().await.map_err(|e| setup(&e))?;
        self.settle().await?;
        Ok(interrupted)
    }

    /// Wait (at most 30 s) until the dying engine's runs — cancelled, their
    /// links cut — have ended and given back their turns on the shared
    /// clock. A dead process runs nothing: a run of the old engine still
    /// going when the new one starts could share a turn key with one of
    /// the new engine's (the same queued run started again by recovery),
    /// and the clock's turns are per key — the one that left took the
    /// other's place in line, and the other waited for good (a CI hang).
    async fn stop_old_runs(&self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let (holder, waiting, _) = self.clock.turns();
            let running = self.engine.running();
            if running == 0 && holder.is_none() && waiting.is_empty() {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "the old engine's runs did not stop within 30 s: running {running}, turn held by {holder:?}, \
                     waiting {waiting:?}; runs: {:?}",
                    self.engine.active_runs()
                ));
            }
            self.engine.cancel_all();
            self.clock.poke();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A node's agent process restarts: a new agent on the same state
    /// folder and the same hardware (which keeps whatever was applied).
    pub fn restart_agent(&mut self, node: &str) -> Result<(), SimError> {
        let (opts, slot) = self
            .rebuild
            .agents
            .get(node)
            .ok_or_else(|| SimError::Setup(format!("agent restart: node `{node}` is not in the fleet")))?;
        let backend: Arc<dyn Backend> = self.sims[node].clone();
        let shared: SharedClock = Arc::new(self.clock.clone());
        // The old process is gone: it holds the state dir no longer.
        if let Some(old) = self.agents.get(node) {
            old.close();
        }
        let agent = Arc::new(
            Agent::new(opts.clone(), backend, shared)
                .map_err(|e| SimError::Setup(format!("agent restart on {node}: {e}")))?,
        );
        *slot.0.write().unwrap_or_else(|e| e.into_inner()) = agent.clone();
        self.agents.insert(node.to_string(), agent);
        Ok(())
    }

    /// The simulated hardware of a node.
    pub fn sim(&self, node: &str) -> &SimBackend {
        &self.sims[node]
    }

    /// A node's agent.
    pub fn agent(&self, node: &str) -> &Arc<Agent> {
        &self.agents[node]
    }

    /// Whether a node is powered (not powered off or booting).
    pub fn powered(&self, node: &str) -> bool {
        self.power.lock().unwrap_or_else(|e| e.into_inner()).get(node).is_none_or(|p| p.0 == Power::On)
    }

    /// Nodes that finished booting by the clock's time are up.
    fn finish_boots(&self) {
        let now = nightshift_proto::clock::Clock::now_ms(&self.clock);
        let mut p = self.power.lock().unwrap_or_else(|e| e.into_inner());
        for (state, _) in p.values_mut() {
            if let Power::Booting(at) = *state
                && at <= now
            {
                *state = Power::On;
            }
        }
    }

    /// Send telemetry from every powered agent to the engine.
    pub async fn feed(&self) {
        for name in self.agents.keys() {
            self.feed_one(name).await;
        }
    }

    /// Send one powered node's telemetry to the engine, and return it.
    async fn feed_one(&self, name: &str) -> Option<nightshift_proto::Telemetry> {
        let a = self.agents.get(name)?;
        if !self.powered(name) {
            return None;
        }
        // A connection's first call is the inventory (a restarted engine
        // has none until then).
        self.engine.ensure_inventory(name).await;
        let t = a.telemetry().await.ok()?;
        self.engine.ingest_telemetry(&t).await;
        Some(t)
    }

    /// Wait until no run is working (all asleep on the clock or done).
    pub async fn settle(&self) -> Result<(), SimError> {
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        let mut idle_checks = 0;
        loop {
            // A run whose hold just ended may start now.
            self.engine.pump().await;
            if self.engine.busy() == 0 {
                idle_checks += 1;
                if idle_checks >= 3 {
                    return Ok(());
                }
            } else {
                idle_checks = 0;
            }
            if start.elapsed() > limit {
                let mut runs = self.engine.active_runs();
                runs.push(format!(
                    "running {}, clock sleepers {} ({} not due), busy {}, turns {:?}",
                    self.engine.running(),
                    self.clock.sleepers(),
                    nightshift_proto::clock::Clock::idle_sleepers(&self.clock),
                    self.engine.busy(),
                    self.clock.turns()
                ));
                return Err(SimError::Stuck(limit, runs));
            }
            tokio::task::yield_now().await;
            std::thread::yield_now();
        }
    }

    /// One tick of virtual time.
    pub async fn step(&self) -> Result<(), SimError> {
        // Whatever was started before this step finishes its work at the
        // current time first.
        self.settle().await?;
        // The hardware lives through the tick with the settings it has
        // now; only then does the clock move (waking runs that act at the
        // new time). Stepping it after the clock moved raced the woken
        // runs: an action landed before or after the physics by thread
        // timing, and a loaded machine gave a different scenario.
        let dt = self.tick_ms as f64 / 1000.0;
        for s in self.sims.values() {
            s.step(dt);
        }
        self.clock.advance(self.tick_ms);
        self.finish_boots();
        // Woken runs act at the new time before the agents' own clocks
        // (lease expiries) do: one order, whatever the threads do.
        self.settle().await?;
        for a in self.agents.values() {
            a.tick().await;
        }
        self.settle().await?;
        self.feed().await;
        self.engine.tick().await;
        self.settle().await
    }

    /// Move virtual time to `ts_ms` and feed `samples` (recorded readings,
    /// already mapped to nodes, GPUs and metrics: a backtest's interned
    /// series, nothing allocated per sample) instead of the simulated
    /// hardware's: a backtest's step. The agents still answer actions (as
    /// dry runs, for a shadow engine) and run their leases.
    pub async fn step_to_mapped(&self, ts_ms: i64, samples: &[crate::recording::Mapped]) -> Result<(), SimError> {
        self.step_to_mapped_timed(ts_ms, samples, true, &mut [Duration::ZERO; 3]).await
    }

    /// [`SimFleet::step_to_mapped`], adding the time of its three phases
    /// to `spent`: the replay agents advanced, the samples ingested
    /// (windows, triggers, health), the engine's tick and its runs settled.
    /// Without `tick_agents` the clock moves and the agents are not ticked
    /// (a backtest step with no run in flight: nothing for them to answer).
    pub async fn step_to_mapped_timed(
        &self,
        ts_ms: i64,
        samples: &[crate::recording::Mapped],
        tick_agents: bool,
        spent: &mut [Duration; 3],
    ) -> Result<(), SimError> {
        let t = Instant::now();
        if tick_agents {
            self.advance_agents_to(ts_ms).await?;
        } else {
            self.settle().await?;
            let now = nightshift_proto::clock::Clock::now_ms(&self.clock);
            if ts_ms > now {
                self.clock.advance(ts_ms - now);
            }
        }
        spent[0] += t.elapsed();
        let t = Instant::now();
        self.engine.ingest_samples(samples).await;
        spent[1] += t.elapsed();
        let t = Instant::now();
        self.engine.tick().await;
        let r = self.settle().await;
        spent[2] += t.elapsed();
        r
    }

    /// A backtest step's first half: virtual time to `ts_ms`, every agent
    /// ticked (leases, dry runs answered), all settled.
    async fn advance_agents_to(&self, ts_ms: i64) -> Result<(), SimError> {
        self.settle().await?;
        let now = nightshift_proto::clock::Clock::now_ms(&self.clock);
        if ts_ms > now {
            self.clock.advance(ts_ms - now);
        }
        for a in self.agents.values() {
            a.tick().await;
        }
        self.settle().await
    }

    /// A fleet-month's step (`nightshift simulate`): the clock moves
    /// `advance_ms`, but only the nodes in `hot` (an incident on them) live
    /// through it in full — physics for the whole interval, their agents
    /// ticked, their telemetry fed — unless `all`, when every node is, with
    /// its physics for at most `quiet_physics_ms` (a quiet node is in steady
    /// state; stepping hours of it in half seconds would cost hours). The
    /// same order as [`SimFleet::step`]. Returns the telemetry fed, by
    /// node, so the caller sees what the scheduler shows without asking
    /// again.
    pub async fn step_sparse(
        &self,
        advance_ms: i64,
        quiet_physics_ms: i64,
        hot: &std::collections::BTreeSet<String>,
        all: bool,
    ) -> Result<Vec<(String, nightshift_proto::Telemetry)>, SimError> {
        self.settle().await?;
        // The nodes that live through this step: every one when `all`,
        // else only the hot ones — looked up by name, so a step near one
        // incident costs the same on 16 nodes as on 2,048.
        let live: Vec<&String> =
            if all { self.sims.keys().collect() } else { hot.iter().filter(|n| self.sims.contains_key(*n)).collect() };
        for name in &live {
            let s = &self.sims[*name];
            if hot.contains(*name) {
                s.step(advance_ms as f64 / 1000.0);
            } else {
                s.step(advance_ms.min(quiet_physics_ms) as f64 / 1000.0);
            }
        }
        self.clock.advance(advance_ms.max(1));
        self.finish_boots();
        self.settle().await?;
        for name in &live {
            if let Some(a) = self.agents.get(*name) {
                a.tick().await;
            }
        }
        self.settle().await?;
        let mut fed = Vec::new();
        for name in &live {
            if let Some(t) = self.feed_one(name).await {
                fed.push(((*name).clone(), t));
            }
        }
        self.engine.tick().await;
        self.settle().await?;
        Ok(fed)
    }

    /// Run `secs` of virtual time.
    pub async fn run_for(&self, secs: u64) -> Result<(), SimError> {
        let steps = secs as i64 * 1000 / self.tick_ms.max(1);
        for _ in 0..steps {
            self.step().await?;
        }
        Ok(())
    }

    /// Virtual seconds since the start.
    pub fn elapsed_secs(&self, start_ms: i64) -> f64 {
        (nightshift_proto::clock::Clock::now_ms(&self.clock) - start_ms) as f64 / 1000.0
    }
}

/// The engine's transports to every node, through `alive`.
fn links(
    specs: &[NodeSpec],
    slots: &BTreeMap<String, (AgentOptions, AgentSlot)>,
    alive: &Arc<AtomicBool>,
    power: &PowerMap,
    wrap: Option<&TransportWrapper>,
) -> Vec<(NodeSpec, String, Arc<dyn AgentTransport>)> {
    specs
        .iter()
        .map(|spec| {
            let slot = slots[&spec.name].1.clone();
            let mut t: Arc<dyn AgentTransport> =
                Arc::new(EngineLink { slot, alive: alive.clone(), power: power.clone() });
            if let Some(w) = wrap {
                t = w(&spec.name, t);
            }
            (spec.clone(), spec.address.clone(), t)
        })
        .collect()
}

/// Copy a folder tree (an engine's data folder "as on disk").
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()))?;
        } else {
            std::fs::copy(&p, to.join(e.file_name()))?;
        }
    }
    Ok(())
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        // Runs asleep on the virtual clock would never wake: cancel them.
        self.engine.cancel_all();
        self.clock.poke();
    }
}
