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
        let client = client_for(spec, &addr, &inventory, &key, &config);
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
        let Some(node) = engine.core.fleet.get(&name) else { continue };
        let e = engine.clone();
        engine.add_task(tokio::spawn(async move { node_loop(e, node, client).await }));
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
    if let Some(every) = config.notifications.audit_anchor_every_secs {
        let e = engine.clone();
        engine.add_task(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(every));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if let Err(err) = e.post_audit_anchor().await {
                    tracing::error!(error = %err, "cannot post the audit anchor");
                }
            }
        }));
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

/// An SSH client for one node of the inventory.
fn client_for(
    spec: &crate::inventory::NodeSpec,
    addr: &str,
    inventory: &Inventory,
    key: &Arc<keys::PrivateKey>,
    config: &EngineConfig,
) -> Arc<AgentClient> {
    let mut cc = ClientConfig::new(addr.to_string(), spec.host_key.clone(), key.clone());
    cc.user = inventory.defaults.user.clone();
    cc.request_timeout = Duration::from_secs(config.limits.action_timeout_secs);
    Arc::new(AgentClient::new(cc))
}

/// Keep one agent connected: inventory, then a telemetry stream into the
/// engine; on any failure mark the node disconnected and try again after the
/// client's backoff. Ends when a reload replaces or removes the node.
async fn node_loop(engine: Engine, node: Arc<crate::fleet::Node>, client: Arc<AgentClient>) {
    let mut shutdown = engine.shutdown_signal();
    let interval = engine.config().telemetry.interval_ms;
    let name = node.spec.name.clone();
    let mut attempt: u64 = 0;
    let retired = |engine: &Engine| !engine.core.fleet.is_current(&node);
    loop {
        if *shutdown.borrow() {
            return;
        }
        if retired(&engine) {
            tracing::info!(node = %name, "node replaced or removed by a reload: its connection closes");
            client.reset().await;
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
                    if retired(&engine) {
                        return Ok(());
                    }
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
                        Some(t) if retired(&engine) => {
                            drop(t);
                            client.reset().await;
                            return Ok(());
                        }
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
            Ok(()) => {
                if retired(&engine) {
                    client.reset().await;
                }
                return;
            }
            Err(_) if retired(&engine) => {
                // The node's state belongs to its replacement now.
                client.reset().await;
                return;
            }
            Err(e) => {
                engine.set_node_disconnected(&name, &e.to_string());
                match e {
                    ClientError::Backoff { retry_in_ms, .. } => Duration::from_millis(retry_in_ms.min(30_000)),
                    // Jittered, so nodes that dropped together do not retry together.
                    _ => Duration::from_millis(rand::random_range(100..400)),
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReloadReport {
    pub nodes: crate::fleet::FleetChange,
    /// API tokens by name.
    pub tokens_added: Vec<String>,
    pub tokens_removed: Vec<String>,
    /// Same name, another role or hash.
    pub tokens_changed: Vec<String>,
    pub webhook_tokens_changed: bool,
    /// Whether any runbook's manifest or script changed (trigger states
    /// then start over).
    pub runbooks_changed: bool,
    pub runbooks: usize,
    pub runbook_errors: Vec<String>,
    /// engine.yaml settings that differ from the running ones and take
    /// effect only at a restart.
    pub restart_needed: Vec<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot read the engine key {path}: {message}; nothing was reloaded")]
    Key { path: String, message: String },
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Fingerprint of a runbook set: what a reload compares.
fn runbook_digest(set: &crate::runbook::RunbookSet) -> Vec<(String, String, String)> {
    let mut d: Vec<(String, String, String)> = set
        .runbooks
        .iter()
        .map(|r| {
            (r.manifest.name.clone(), serde_json::to_string(&r.manifest).unwrap_or_default(), r.script_source.clone())
        })
        .collect();
    d.extend(set.errors.iter().map(|e| (String::new(), e.to_string(), String::new())));
    d.sort();
    d
}

/// Read fleet.yaml, engine.yaml's tokens and the runbooks again and put
/// what changed in force: new nodes are connected, changed ones reconnected
/// (their state kept), removed ones let go (runs already holding them finish
/// on them); tokens are replaced; runbooks swapped when they changed. All
/// files are read and checked first: if one is broken, nothing changes.
/// Audited either way (`config_reloaded`, by `by`). Other engine.yaml
/// settings are listed as needing a restart.
pub async fn reload(engine: &Engine, by: &str) -> Result<ReloadReport, ReloadError> {
    let _one = engine.core.reloading.lock().await;
    let result = reload_files(engine);
    let record = match &result {
        Ok(r) => {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["ok"] = true.into();
            v
        }
        Err(e) => serde_json::json!({"ok": false, "error": e.to_string()}),
    };
    engine
        .core
        .audit
        .append(crate::audit::NewRecord::new(crate::audit::RecordKind::ConfigReloaded, by, record), None)
        .await?;
    match &result {
        Ok(r) => tracing::info!(by, added = ?r.nodes.added, changed = ?r.nodes.changed, removed = ?r.nodes.removed,
            tokens_added = ?r.tokens_added, tokens_removed = ?r.tokens_removed, runbooks_changed = r.runbooks_changed,
            restart_needed = ?r.restart_needed, "reloaded"),
        Err(e) => tracing::error!(by, error = %e, "reload refused: nothing changed"),
    }
    result
}

fn reload_files(engine: &Engine) -> Result<ReloadReport, ReloadError> {
    let running = engine.config();
    let mut report = ReloadReport::default();
    // 1. Read and check everything; change nothing yet.
    let new_config = match &running.source_path {
        Some(path) => Some(EngineConfig::load(path)?),
        None => None,
    };
    let inventory = match &new_config {
        Some(_) => Some(Inventory::load(&running.inventory_path)?),
        None => None,
    };
    let key = match &inventory {
        Some(_) => Some(Arc::new(keys::load(&running.engine_key_path).map_err(|e| ReloadError::Key {
            path: running.engine_key_path.display().to_string(),
            message: e.to_string(),
        })?)),
        None => None,
    };
    let set = load_dir(&running.runbook_dir, &engine.core.script);
    if let Some(new) = &new_config {
        for (name, a, b) in [
            ("listen_addr", j(&running.listen_addr), j(&new.listen_addr)),
            ("data_dir", j(&running.data_dir), j(&new.data_dir)),
            ("runbook_dir", j(&running.runbook_dir), j(&new.runbook_dir)),
            ("inventory_path", j(&running.inventory_path), j(&new.inventory_path)),
            ("engine_key_path", j(&running.engine_key_path), j(&new.engine_key_path)),
            ("limits", j(&running.limits), j(&new.limits)),
            ("script", j(&running.script), j(&new.script)),
            ("telemetry", j(&running.telemetry), j(&new.telemetry)),
            ("sources", j(&running.sources), j(&new.sources)),
            ("notifications", j(&running.notifications), j(&new.notifications)),
            ("time_scale", j(&running.time_scale), j(&new.time_scale)),
            ("grafana", j(&running.grafana), j(&new.grafana)),
            ("auth.allow_anonymous", j(&running.auth.allow_anonymous), j(&new.auth.allow_anonymous)),
        ] {
            if a != b {
                report.restart_needed.push(name.to_string());
            }
        }
    }
    // 2. Put it in force.
    if let (Some(inventory), Some(key)) = (inventory, key) {
        let mut clients = std::collections::HashMap::new();
        let specs: Vec<_> = inventory.nodes.iter().map(|s| (s.clone(), s.addr(&inventory.defaults))).collect();
        let (change, fresh) = engine.core.fleet.replace(specs, |spec, addr| {
            let c = client_for(spec, addr, &inventory, &key, running);
            clients.insert(spec.name.clone(), c.clone());
            c as Arc<dyn AgentTransport>
        });
        for node in fresh {
            let Some(client) = clients.remove(&node.spec.name) else { continue };
            let e = engine.clone();
            engine.add_task(tokio::spawn(async move { node_loop(e, node, client).await }));
        }
        report.nodes = change;
    }
    if let Some(new) = new_config {
        let (_, old) = engine.auth();
        let mut auth = new.auth.clone();
        auth.allow_anonymous = old.allow_anonymous;
        if auth != *old {
            for t in &auth.tokens {
                match old.tokens.iter().find(|o| o.name == t.name) {
                    None => report.tokens_added.push(t.name.clone()),
                    Some(o) if o != t => report.tokens_changed.push(t.name.clone()),
                    Some(_) => {}
                }
            }
            report.tokens_removed = old
                .tokens
                .iter()
                .filter(|o| !auth.tokens.iter().any(|t| t.name == o.name))
                .map(|o| o.name.clone())
                .collect();
            report.webhook_tokens_changed =
                auth.webhook_token_sha256 != old.webhook_token_sha256 || auth.webhook_tokens != old.webhook_tokens;
            *engine.core.auth.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
            engine.core.auth_generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    report.runbooks = set.runbooks.len();
    report.runbook_errors = set.errors.iter().map(|e| e.to_string()).collect();
    for e in &set.errors {
        tracing::error!(error = %e, "runbook not loaded");
    }
    if runbook_digest(&set) != runbook_digest(&engine.runbook_set()) {
        report.runbooks_changed = true;
        engine.replace_runbooks(set);
    }
    Ok(report)
}

/// A setting as JSON, for comparing old and new.
fn j<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
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
