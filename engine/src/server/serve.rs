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

use crate::audit::{AuditError, AuditStore, PgOptions};
use crate::config::{AuditBackend, EngineConfig};
use crate::engine::{Engine, EngineError, EngineParts};
use crate::fleet::inventory::Inventory;
use crate::ha::{Leadership, LeaseConfig};
use crate::runbooks::manifest::LoadError;
use crate::runbooks::runbook::load_dir;
use crate::runbooks::script::build_engine;

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
    /// engine.yaml's `audit.postgres` cannot be used as written.
    #[error("{0}")]
    Config(String),
}

/// The clock a config asks for.
pub fn clock_for(config: &EngineConfig) -> SharedClock {
    match (config.time_scale > 1.0, config.time_origin_ms) {
        (true, Some(origin)) => Arc::new(ScaledClock::anchored(config.time_scale, origin)),
        (true, None) => Arc::new(ScaledClock::new(config.time_scale)),
        (false, _) => Arc::new(SystemClock),
    }
}

/// Start the engine with SSH connections to every agent and its background
/// loops. Broken runbooks are reported (log and audit) and left out; the
/// good ones run.
pub async fn start(config: EngineConfig) -> Result<Engine, StartError> {
    start_with_clock(config.clone(), clock_for(&config)).await
}

/// [`start`] with a given clock. With the sled backend the engine acts at
/// once. With PostgreSQL it opens its copy of the shard's chain and stands
/// by — serving reads, following the database — while a lease loop
/// campaigns; once it holds the lease it recovers as a restart would and
/// starts acting (see [`crate::ha`]).
pub async fn start_with_clock(config: EngineConfig, clock: SharedClock) -> Result<Engine, StartError> {
    let mut inventory = Inventory::load(&config.inventory_path)?;
    config.select_shard(&mut inventory);
    let key = keys::load(&config.engine_key_path)
        .map_err(|e| StartError::Key { path: config.engine_key_path.display().to_string(), message: e.to_string() })?;
    let key = Arc::new(key);
    let audit = open_audit(&config, clock.clone()).await?;
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
    for change in engine.load_fault_policy()? {
        tracing::info!(change = %change, "a site override of the XID policy is in force");
    }
    engine.core.fleet().agent_clients().keep(|_| false, clients);
    match engine.core.leadership().cloned() {
        None => activate(&engine).await?,
        Some(l) => {
            tracing::info!(shard = %l.cfg.shard, holder = %l.cfg.holder, "standing by: campaigning for the shard's lease");
            let e = engine.clone();
            let l2 = l.clone();
            tokio::spawn(async move { lease_loop(e, l).await });
            let e = engine.clone();
            tokio::spawn(async move { announce_loop(e, l2).await });
        }
    }
    Ok(engine)
}

/// Open the audit store engine.yaml asks for.
async fn open_audit(config: &EngineConfig, clock: SharedClock) -> Result<AuditStore, StartError> {
    let Some(pgc) = config.audit.postgres.as_ref().filter(|_| config.audit.backend == AuditBackend::Postgres) else {
        return Ok(AuditStore::open(&config.data_dir, clock)?);
    };
    let url = pgc.url().map_err(StartError::Config)?;
    // Checked now: a standby that cannot forward would only say so at the
    // first write.
    pgc.peer_token().map_err(StartError::Config)?;
    let lease = LeaseConfig {
        shard: pgc.shard.clone(),
        holder: holder_id(),
        ttl: Duration::from_millis(pgc.lease_ttl_ms),
        renew_every: Duration::from_millis(pgc.lease_renew_ms),
        url: pgc.advertise_url.clone().unwrap_or_else(|| format!("http://{}", config.listen_addr)),
    };
    lease.check().map_err(|e| StartError::Config(e.to_string()))?;
    let opts = PgOptions {
        url,
        ca_file: pgc.ca_file.clone(),
        shard: pgc.shard.clone(),
        leadership: Leadership::new(lease),
        follow_every: Duration::from_millis(pgc.follow_ms),
    };
    let dir = config.data_dir.clone();
    std::fs::create_dir_all(&dir)
        .map_err(|e| AuditError::Open { path: dir.clone(), message: format!("cannot create the data dir: {e}") })?;
    tokio::task::spawn_blocking(move || AuditStore::open_postgres(&dir, clock, opts))
        .await
        .map_err(|e| StartError::Config(format!("opening the audit store failed: {e}")))?
        .map_err(StartError::from)
}

/// This process among the shard's engines: host, pid and a random part.
fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{}-{}-{:04x}", if host.is_empty() { "engine" } else { &host }, std::process::id(), rand::random::<u16>())
}

/// Start acting: record the start, recover what the last leader (or the
/// last run of this engine) left unfinished, then connect to every agent
/// and start the pulls and the tick.
async fn activate(engine: &Engine) -> Result<(), StartError> {
    let config = engine.config().clone();
    let recovered = engine.begin().await?;
    if !recovered.is_empty() {
        tracing::warn!(runs = ?recovered, "runs left unfinished by the last stop, resumed too often or whose runbook is gone, are now interrupted");
    }
    // The fleet as it is now (a standby may have reloaded it since start).
    let clients: Vec<(String, Arc<AgentClient>)> = engine.core.fleet().agent_clients().all();
    for (name, client) in clients {
        let Some(node) = engine.core.fleet().get(&name) else { continue };
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
    // The charts of the hours before this engine led (a takeover, a
    // restart): rebuilt from Prometheus when it is a source.
    if let Some(src) = config.sources.prometheus.clone() {
        let e = engine.clone();
        engine.add_task(tokio::spawn(async move {
            match backfill_history(&e, &src.url, Duration::from_secs(src.timeout_secs.max(30))).await {
                Ok(points) => tracing::info!(points, url = %src.url, "plot history rebuilt from Prometheus"),
                Err(e) => tracing::warn!(error = %e, "plot history not rebuilt from Prometheus (charts start now)"),
            }
        }));
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
    Ok(())
}

/// Campaign for the shard's lease until this engine holds it; then catch
/// up, recover and act, renewing the lease every `renew_every`. The lease
/// is lost when a renewal finds another holder, or when none succeeded for
/// the TTL (the database unreachable: by then another engine may hold it):
/// the engine is then deposed — it writes and sends nothing more, cancels
/// its runs and says so (`nightshift serve` exits for its service manager to
/// start it again, as a standby). A shutdown hands the lease back at once.
/// Tell the database this engine is alive and in what role, every couple
/// of seconds, on a connection of its own (the lease loop's renewals stay
/// one round trip each); at shutdown, that it stopped.
async fn announce_loop(engine: Engine, l: Arc<Leadership>) {
    let Some(mut db) = engine.audit().lease_db() else { return };
    let mut shutdown = engine.shutdown_signal();
    let every = l.cfg.renew_every.max(Duration::from_secs(2));
    loop {
        let stopping = *shutdown.borrow();
        if db.connect_within(Duration::from_secs(5)).await.is_ok() {
            let st = engine.ha_status();
            let role = if stopping { "stopped" } else { st.role.as_str() };
            let r = tokio::time::timeout(Duration::from_secs(5), db.announce(&l.cfg, role, st.term.unwrap_or(0))).await;
            if !matches!(r, Ok(Ok(()))) {
                tracing::debug!("could not announce this engine in nightshift_engines (retrying)");
                db.forget();
            }
        }
        if stopping {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn lease_loop(engine: Engine, l: Arc<Leadership>) {
    let Some(mut db) = engine.audit().lease_db() else { return };
    let mut shutdown = engine.shutdown_signal();
    // Standing by.
    let mut warned = false;
    let mut campaign_sent: std::time::Instant;
    let term = loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(e) = db.connect_within(Duration::from_secs(5)).await
            && !warned
        {
            tracing::warn!(error = %e, "standby: cannot reach postgres to campaign (retrying)");
            warned = true;
        }
        if db.is_connected() {
            campaign_sent = std::time::Instant::now();
            match db.campaign(&l.cfg).await {
                Ok(Some(term)) => break term,
                Ok(None) => {
                    if let Ok(row) = db.lease_row(&l.cfg.shard).await {
                        l.set_leader(row);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "standby: campaign failed (retrying)");
                    db.forget();
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(l.cfg.renew_every) => {}
            _ = shutdown.changed() => return,
        }
    };
    let took = std::time::Instant::now();
    l.secured(campaign_sent);
    l.lead(term);
    // Renewals start now, before catching up: over a slow link catching up
    // takes round trips a lease TTL may not cover.
    let renewals = {
        let (engine, l, db) = (engine.clone(), l.clone(), db.clone());
        tokio::spawn(async move { renew_loop(engine, l, db, term, campaign_sent).await })
    };
    if let Ok(row) = db.lease_row(&l.cfg.shard).await {
        l.set_leader(row);
    }
    tracing::warn!(term, holder = %l.cfg.holder, shard = %l.cfg.shard, "took the lease: this engine leads");
    let head = match engine.audit().lead(term).await {
        Ok(h) => h,
        Err(e) => {
            step_down(&engine, &l, format!("cannot catch up with the database's chain: {e}"));
            return;
        }
    };
    engine.core.ids().advance_to(engine.audit().run_count().unwrap_or(0));
    // Promotions and demotions live in the chain: what the last leader was
    // told holds here (a runbook demoted to shadow stays in shadow).
    match db.runbook_modes(&l.cfg.shard).await {
        Ok(modes) => engine.adopt_modes(&modes),
        Err(e) => {
            step_down(&engine, &l, format!("cannot read the runbook modes: {e}"));
            return;
        }
    }
    drop(db);
    if let Err(e) = activate(&engine).await {
        step_down(&engine, &l, format!("cannot start acting: {e}"));
        return;
    }
    engine.core.counters().set_failover_ms(took.elapsed().as_millis() as u64);
    l.set_ready();
    tracing::info!(term, head, "leading: recovered and acting");
    let _ = renewals.await;
}

/// Keep the lease at `term` until it is lost (depose) or the engine shuts
/// down (hand it back).
async fn renew_loop(
    engine: Engine,
    l: Arc<Leadership>,
    mut db: crate::audit::LeaseDb,
    term: u64,
    campaign_sent: std::time::Instant,
) {
    let mut shutdown = engine.shutdown_signal();
    // When the last renewal that succeeded (first: the campaign that took
    // the lease) was *sent*: the database's expiry is at least this late,
    // so the lease is surely still ours until this + TTL on this host's
    // clock.
    let mut renewed_at = campaign_sent;
    // Renewals start every `renew_every` from the last one's start, not
    // `renew_every` after it answered: a slow round trip does not stretch
    // the period (a 600 ms RTT renews every 600 ms, not every 1.1 s).
    let mut next = tokio::time::Instant::now() + l.cfg.renew_every;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.changed() => {
                // Deposed already (its own shutdown): nothing to hand back.
                if l.is_leader() {
                    hand_back(&engine, &l, &db, term).await;
                }
                return;
            }
        }
        if !l.is_leader() {
            return;
        }
        let sent = std::time::Instant::now();
        next = tokio::time::Instant::now() + l.cfg.renew_every;
        // A renewal may take as long as the lease has left (less a margin),
        // not one renew interval: a slow but working database keeps a
        // healthy leader; only a lease that would run out deposes it.
        let budget = || {
            let left = l.cfg.ttl.saturating_sub(renewed_at.elapsed());
            left.saturating_sub(l.cfg.ttl / 10).max(Duration::from_millis(50))
        };
        if db.connect_within(budget()).await.is_ok() {
            let budget = budget();
            match tokio::time::timeout(budget, db.renew(&l.cfg, term)).await {
                Ok(Ok(true)) => {
                    renewed_at = sent;
                    l.secured(sent);
                    l.renewed();
                }
                Ok(Ok(false)) => {
                    let now = db.lease_row(&l.cfg.shard).await.ok().flatten();
                    let why = match now {
                        Some(r) if r.holder != l.cfg.holder => {
                            format!("{} took the lease at term {} (this engine led at term {term})", r.holder, r.term)
                        }
                        _ => format!("the lease at term {term} expired before it was renewed"),
                    };
                    step_down(&engine, &l, why);
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot renew the lease (retrying)");
                    db.forget();
                }
                Err(_) => {
                    tracing::warn!(
                        budget_ms = budget.as_millis() as u64,
                        "a lease renewal did not answer in time (retrying)"
                    );
                    // The connection stays: its answer arrives later and is
                    // dropped, and a new connection would cost more round
                    // trips than the lease may have left. A broken one shows
                    // as an error or as closed, and is replaced then.
                }
            }
        }
        if renewed_at.elapsed() >= l.cfg.ttl {
            step_down(
                &engine,
                &l,
                format!(
                    "the lease could not be renewed for {} ms (the database unreachable): another engine may lead now",
                    l.cfg.ttl.as_millis()
                ),
            );
            return;
        }
    }
}

/// Stop leading for good: refuse every append, stop acting, say why.
fn step_down(engine: &Engine, l: &Leadership, why: String) {
    tracing::error!(holder = %l.cfg.holder, why = %why, "deposed: this engine stops acting and writes nothing more");
    l.depose(why);
    let e = engine.clone();
    tokio::spawn(async move { e.shutdown().await });
}

/// At shutdown, let running scripts finish their records, then expire the
/// lease so a standby takes over now rather than after the TTL.
async fn hand_back(engine: &Engine, l: &Leadership, db: &crate::audit::LeaseDb, term: u64) {
    for _ in 0..100 {
        if engine.running() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    l.depose("this engine shut down and handed the lease back".into());
    match db.release(&l.cfg, term).await {
        Ok(()) => tracing::info!(term, "handed the lease back"),
        Err(e) => tracing::warn!(error = %e, "cannot hand the lease back: a standby takes over when it expires"),
    }
}

/// An SSH client for one node of the inventory.
pub(crate) fn client_for(
    spec: &crate::fleet::inventory::NodeSpec,
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
pub(crate) async fn node_loop(engine: Engine, node: Arc<crate::fleet::Node>, client: Arc<AgentClient>) {
    let mut shutdown = engine.shutdown_signal();
    let interval = engine.config().telemetry.interval_ms;
    let name = node.spec.name.clone();
    let mut attempt: u64 = 0;
    let retired = |engine: &Engine| !engine.core.fleet().is_current(&node);
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
            // Every connection begins with the announce of the leader's
            // term (a read of the holds with it, the only request an agent
            // records a term from): an agent the takeover could not reach
            // learns it when it comes back.
            node.set_announced(0);
            if let Some(term) = engine.core.leadership().and_then(|l| l.term()) {
                let announce = crate::fleet::announce_request(format!("term-{name}-{attempt}"), term);
                if conn.call(&announce).await?.ok {
                    node.set_announced(term);
                }
            }
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

/// One range query over the plot history's length, at its step, into the
/// history. Returns the points kept.
pub async fn backfill_history(engine: &Engine, url: &str, timeout: Duration) -> Result<usize, String> {
    let (step_ms, keep_ms) = engine.history_span_ms();
    if keep_ms == 0 {
        return Ok(0);
    }
    let end = engine.clock().now_ms() / 1000;
    let start = end - keep_ms / 1000;
    let step = (step_ms / 1000).max(1);
    let http = reqwest::Client::builder().timeout(timeout).build().map_err(|e| e.to_string())?;
    let resp = http
        .get(format!("{}/api/v1/query_range", url.trim_end_matches('/')))
        .query(&[
            ("query", crate::signals::sources::plotted_query()),
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", format!("{step}s")),
        ])
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let body = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    let samples = crate::signals::sources::parse_range_response(url, &body).map_err(|e| e.to_string())?;
    Ok(engine.backfill_history(&samples))
}

/// One pull.
pub async fn pull_once(
    http: &reqwest::Client,
    url: &str,
    is_prometheus: bool,
) -> Result<Vec<crate::signals::sources::PromSample>, crate::signals::sources::SourceError> {
    use crate::signals::sources::{SourceError, parse_exposition, parse_query_response, prometheus_query};
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
