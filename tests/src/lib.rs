//! Shared helpers for the cross-process tests in `tests/tests/`: start real
//! agents (sim backend, real SSH on loopback) in a temporary folder, with an
//! engine key they trust.
#![forbid(unsafe_code)]

pub mod external;
pub mod serial;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::config::AgentConfig;
use nightshift_agent::runtime::{self, StartedAgent};
use nightshift_proto::ssh::client::{AgentClient, ClientConfig};
use nightshift_proto::ssh::keys::{self, PrivateKey};

/// A test agent and everything needed to talk to it.
pub struct TestAgent {
    pub started: Option<StartedAgent>,
    pub cfg: AgentConfig,
    pub engine_key: Arc<PrivateKey>,
    pub dir: PathBuf,
}

/// Write an engine key pair under `dir` (once) and return it.
pub fn engine_key(dir: &Path) -> Arc<PrivateKey> {
    let path = dir.join("engine_key");
    let (k, _) = keys::load_or_create(&path, "nightshift-engine").expect("engine key");
    Arc::new(k)
}

/// An agent config for a sim node in `dir`, listening on a free loopback port.
pub fn sim_agent_config(dir: &Path, node: &str, sim: SimConfig, extra_yaml: &str) -> AgentConfig {
    sim_agent_config_at(dir, node, sim, extra_yaml, "127.0.0.1:0")
}

/// As [`sim_agent_config`], listening on `listen` (another loopback address:
/// several agents on one port, as a fleet has).
pub fn sim_agent_config_at(dir: &Path, node: &str, sim: SimConfig, extra_yaml: &str, listen: &str) -> AgentConfig {
    let node_dir = dir.join(node);
    std::fs::create_dir_all(&node_dir).unwrap();
    let text = format!(
        "version: 1\nnode: {node}\nlisten_addr: {listen}\nstate_dir: {node}/state\nhost_key_path: {node}/host_key\n\
         authorized_keys_path: engine_key.pub\nbackend: sim\nsim: {sim}\n\
         flush_caches: {{drop_caches_path: {node}/drop_caches, registry_dir: {node}/flush.d}}\n\
         configs:\n  nccl-env:\n    path: {node}/nccl.env\n{extra_yaml}",
        sim = serde_json::to_string(&sim).unwrap(),
    );
    let path = dir.join(format!("{node}.yaml"));
    std::fs::write(&path, text).unwrap();
    AgentConfig::load(&path).expect("valid test agent config")
}

impl TestAgent {
    /// Start a sim agent named `node` in `dir`.
    pub async fn start(dir: &Path, node: &str, sim: SimConfig, extra_yaml: &str) -> TestAgent {
        let engine_key = engine_key(dir);
        let cfg = sim_agent_config(dir, node, sim, extra_yaml);
        let started = runtime::start(&cfg, None).await.expect("agent starts");
        TestAgent { started: Some(started), cfg, engine_key, dir: dir.to_path_buf() }
    }

    /// Start a sim agent listening on `listen`.
    pub async fn start_at(dir: &Path, node: &str, sim: SimConfig, extra_yaml: &str, listen: &str) -> TestAgent {
        let engine_key = engine_key(dir);
        let cfg = sim_agent_config_at(dir, node, sim, extra_yaml, listen);
        let started = runtime::start(&cfg, None).await.expect("agent starts");
        TestAgent { started: Some(started), cfg, engine_key, dir: dir.to_path_buf() }
    }

    fn running(&self) -> &StartedAgent {
        self.started.as_ref().expect("agent is running")
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        self.running().server.local_addr.to_string()
    }

    /// The pinned host key.
    pub fn fingerprint(&self) -> String {
        self.running().host_key_fingerprint.clone()
    }

    /// A client config that pins this agent's host key.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new(self.addr(), self.fingerprint(), self.engine_key.clone());
        c.backoff_min = std::time::Duration::from_millis(20);
        c
    }

    /// A reconnecting client.
    pub fn client(&self) -> AgentClient {
        AgentClient::new(self.client_config())
    }

    /// Stop the agent (its state dir stays; its port is remembered).
    pub async fn stop(&mut self) {
        if let Some(s) = self.started.take() {
            self.cfg.listen_addr = s.server.local_addr.to_string();
            s.shutdown().await;
        }
    }

    /// Start it again on the same state dir and port.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.started = Some(runtime::start(&self.cfg, None).await.expect("agent restarts"));
    }
}

/// Write an engine config, inventory and runbook folder for `agents` into
/// `dir`, and return the config.
pub fn engine_setup(
    dir: &Path,
    agents: &[&TestAgent],
    runbooks: &[(&str, &str, &str)],
    extra_yaml: &str,
) -> nightshift_engine::config::EngineConfig {
    let rb = dir.join("runbooks");
    std::fs::create_dir_all(&rb).unwrap();
    for (name, manifest, script) in runbooks {
        std::fs::write(
            rb.join(format!("{name}.yaml")),
            format!("version: 1\nname: {name}\ndescription: test runbook {name}\nscript: {name}.rhai\n{manifest}"),
        )
        .unwrap();
        std::fs::write(rb.join(format!("{name}.rhai")), script).unwrap();
    }
    let mut fleet = String::from("version: 1\nnodes:\n");
    for a in agents {
        fleet.push_str(&format!(
            "  - name: {}\n    address: {}\n    host_key: {}\n    labels: {{pool: a}}\n",
            a.cfg.node,
            a.addr(),
            a.fingerprint()
        ));
    }
    std::fs::write(dir.join("fleet.yaml"), fleet).unwrap();
    let text = format!(
        "version: 1\nlisten_addr: 127.0.0.1:0\ndata_dir: engine-data\nrunbook_dir: runbooks\ninventory_path: fleet.yaml\nengine_key_path: engine_key\n{extra_yaml}"
    );
    let path = dir.join("engine.yaml");
    std::fs::write(&path, text).unwrap();
    nightshift_engine::config::EngineConfig::load(&path).expect("valid engine config")
}

/// Poll `f` every 50 ms for up to `secs` real seconds.
pub async fn eventually<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if let Some(v) = f() {
            return Some(v);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    None
}

/// A manual, non-dry run of `runbook` on `target`, requested by `user:test`.
pub fn manual_run(runbook: &str, target: nightshift_engine::runs::Target) -> nightshift_engine::engine::RunRequest {
    nightshift_engine::engine::RunRequest {
        runbook: runbook.into(),
        target,
        trigger: "manual".into(),
        detail: "test".into(),
        event: serde_json::json!({}),
        event_ts_ms: 0,
        params: Default::default(),
        dry_run: false,
        requested_by: "user:test".into(),
    }
}

/// `BIN serve` run in `dir` (its `engine.yaml`) on `127.0.0.1:port`, its
/// logs at `warn` and out of the way: an engine process to kill and start
/// again.
pub fn spawn_serve(bin: &str, dir: &Path, port: u16) -> std::process::Child {
    std::process::Command::new(bin)
        .current_dir(dir)
        .args(["serve", "--config", "engine.yaml", "--listen", &format!("127.0.0.1:{port}")])
        .env("NIGHTSHIFT_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nightshift serve starts")
}

/// Until `base`'s `/healthz` answers success (at most 60 s).
pub async fn wait_healthy(http: &reqwest::Client, base: &str) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(std::time::Instant::now() < end, "the engine at {base} did not come up");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
