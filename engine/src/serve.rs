//! Running the engine for real: load config, inventory, key and runbooks;
//! open the audit store; reach every agent over SSH (pinned host keys);
//! recover runs a crash left behind; keep a telemetry subscription open to
//! every agent, reconnecting with backoff; tick.

use std::sync::Arc;
use std::time::Duration;

use nightshift_proto::clock::{ScaledClock, SharedClock, SystemClock};
use nightshift_proto::ssh::client::{AgentClient, AgentTransport, ClientConfig, ClientError};
use nightshift_proto::ssh::keys;
use nightshift_proto::{NoArgs, Op, Request};

use crate::audit::{AuditError, AuditStore};
use crate::config::EngineConfig;
use crate::engine::{Engine, EngineError, EngineParts};
use crate::inventory::Inventory;
use crate::manifest::LoadError;
use crate::runbook::load_dir;
use crate::script::build_engine;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot read the engine key {path}: {message}; create one with `nightshift keygen --out {path}`")]
    Key { path: String, message: String },
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The clock a config asks for.
pub fn clock_for(config: &EngineConfig) -> SharedClock {
    if config.time_scale > 1.0 { Arc::new(ScaledClock::new(config.time_scale)) } else { Arc::new(SystemClock) }
}

/// Start the engine with SSH connections to every agent and its background
/// loops. Broken runbooks are reported (log and audit) and left out; the
/// good ones run.
pub async fn start(config: EngineConfig) -> Result<Engine, StartError> {
    start_with_clock(config.clone(), clock_for(&config)).await
}

/// [`start`] with a given clock.
pub async fn start_with_clock(config: EngineConfig, clock: SharedClock) -> Result<Engine, StartError> {
    let inventory = Inventory::load(&config.inventory_path)?;
    let key = keys::load(&config.engine_key_path)
        .map_err(|e| StartError::Key { path: config.engine_key_path.display().to_string(), message: e.to_string() })?;
    let key = Arc::new(key);
    let audit = AuditStore::open(&config.data_dir, clock.clone())?;
    let script = Arc::new(build_engine(&config.script));
    let runbooks = load_dir(&config.runbook_dir, &script);
    for e in &runbooks.errors {
        tracing::error!(error = %e, "runbook not loaded");
    }
    let mut clients = Vec::new();
    let mut nodes = Vec::new();
    for spec in &inventory.nodes {
        let addr = spec.addr(&inventory.defaults);
        let mut cc = ClientConfig::new(addr.clone(), spec.host_key.clone(), key.clone());
        cc.user = inventory.defaults.user.clone();
        cc.request_timeout = Duration::from_secs(config.limits.action_timeout_secs);
        let client = Arc::new(AgentClient::new(cc));
        clients.push((spec.name.clone(), client.clone()));
        nodes.push((spec.clone(), addr, client as Arc<dyn AgentTransport>));
    }
    let engine = Engine::new(EngineParts { config: config.clone(), clock, audit, nodes, script, runbooks });
    engine.announce_start().await?;
    let recovered = engine.recover().await?;
    if !recovered.is_empty() {
        tracing::warn!(runs = ?recovered, "runs left unfinished by the last stop are now interrupted");
    }
    for (name, client) in clients {
        let e = engine.clone();
        engine.add_task(tokio::spawn(async move { node_loop(e, name, client).await }));
    }
    let pulls = config
        .sources
        .prometheus
        .iter()
        .map(|p| (p.clone(), true))
        .chain(config.sources.exporters.iter().map(|p| (p.clone(), false)));
    for (src, is_prometheus) in pulls {
        let e = engine.clone();
        engine.add_task(tokio::spawn(async move { pull_loop(e, src, is_prometheus).await }));
    }
    let e = engine.clone();
    let tick_ms = ((250.0 / e.clock().scale().max(1.0)) as u64).clamp(10, 250);
    engine.add_task(tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(tick_ms));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            e.tick().await;
        }
    }));
    tracing::info!(nodes = engine.node_names().len(), runbooks = engine.runbook_set().runbooks.len(), "engine started");
    Ok(engine)
}

/// Keep one agent connected: inventory, then a telemetry stream into the
/// engine; on any failure mark the node disconnected and try again after the
/// client's backoff.
async fn node_loop(engine: Engine, name: String, client: Arc<AgentClient>) {
    let mut shutdown = engine.shutdown_signal();
    let interval = engine.config().telemetry.interval_ms;
    let mut attempt: u64 = 0;
    loop {
        if *shutdown.borrow() {
            return;
        }
        attempt += 1;
        let result: Result<(), ClientError> = async {
            let conn = client.connection().await?;
            let inv = conn.call(&Request::new(format!("inv-{name}-{attempt}"), Op::Inventory(NoArgs {}))).await?;
            engine.set_node_inventory(&name, inv.result.and_then(|v| serde_json::from_value(v).ok()), None);
            if !engine.config().telemetry.stream_from_agents {
                // Telemetry comes from `sources`; keep the connection for
                // actions and check the agent is there.
                let every = Duration::from_millis((engine.config().telemetry.stale_after_secs * 1000 / 3).max(200));
                let mut n = 0u64;
                loop {
                    engine.mark_alive(&name);
                    tokio::select! {
                        _ = tokio::time::sleep(every) => {}
                        _ = shutdown.changed() => return Ok(()),
                    }
                    n += 1;
                    conn.call(&Request::new(format!("ping-{name}-{attempt}-{n}"), Op::Inventory(NoArgs {}))).await?;
                }
            }
            let mut rx = conn.subscribe(&format!("sub-{name}-{attempt}"), Some(interval)).await?;
            tracing::info!(node = %name, "telemetry subscription open");
            loop {
                tokio::select! {
                    t = rx.recv() => match t {
                        Some(t) => engine.ingest_telemetry(&t).await,
                        None => break,
                    },
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            client.reset().await;
            Err(ClientError::Channel { addr: client.addr().to_string(), message: "telemetry stream ended".into() })
        }
        .await;
        if *shutdown.borrow() {
            return;
        }
        let wait = match result {
            Ok(()) => return,
            Err(e) => {
                engine.set_node_disconnected(&name, &e.to_string());
                match e {
                    ClientError::Backoff { retry_in_ms, .. } => Duration::from_millis(retry_in_ms.min(30_000)),
                    _ => Duration::from_millis(100),
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Pull a Prometheus server (instant query for the DCGM series) or a
/// dcgm-exporter endpoint every `interval_secs`, into the engine.
async fn pull_loop(engine: Engine, src: crate::config::PullSource, is_prometheus: bool) {
    let mut shutdown = engine.shutdown_signal();
    let http = match reqwest::Client::builder().timeout(Duration::from_secs(src.timeout_secs)).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(url = %src.url, error = %e, "cannot build an HTTP client: source disabled");
            return;
        }
    };
    let mut every = tokio::time::interval(Duration::from_secs(src.interval_secs));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = shutdown.changed() => return,
        }
        let result = pull_once(&http, &src.url, is_prometheus).await;
        match result {
            Ok(samples) => {
                let st = engine.ingest_pulled(&samples).await;
                if failing {
                    tracing::info!(url = %src.url, "source reachable again");
                    failing = false;
                }
                tracing::debug!(url = %src.url, mapped = st.mapped, other = st.other_series, unknown_host = st.unknown_host, "pulled");
            }
            Err(e) => {
                engine.count_source_error();
                if !failing {
                    tracing::warn!(url = %src.url, error = %e, "telemetry source failed");
                    failing = true;
                }
            }
        }
    }
}

/// One pull.
pub async fn pull_once(
    http: &reqwest::Client,
    url: &str,
    is_prometheus: bool,
) -> Result<Vec<crate::sources::PromSample>, crate::sources::SourceError> {
    use crate::sources::{SourceError, parse_exposition, parse_query_response, prometheus_query};
    let fetch = |message: String| SourceError::Fetch { url: url.to_string(), message };
    let req = if is_prometheus {
        http.get(format!("{}/api/v1/query", url.trim_end_matches('/'))).query(&[("query", prometheus_query())])
    } else {
        http.get(url)
    };
    let resp = req.send().await.map_err(|e| fetch(e.to_string()))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| fetch(e.to_string()))?;
    if is_prometheus {
        // Prometheus answers errors with a JSON body too.
        return parse_query_response(url, &body);
    }
    if !status.is_success() {
        return Err(fetch(format!("expected HTTP 200, found {status}")));
    }
    Ok(parse_exposition(&String::from_utf8_lossy(&body)).0)
}
