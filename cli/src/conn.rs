//! Where the engine runs: a server reached over its HTTP API (`--server`),
//! or embedded in this process on the local config and data dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow};
use serde_json::Value;

use nightshift_engine::api::{
    AgentHolds, AgentPing, Cancel, FleetModeView, HaReply, HealthCheckReply, NewWindow, NodeHealth, NodeView, Plan,
    Reason, ReloadReply, Repaired, RunDetail, RunSummary, RunbookModeReply, SetFleetMode, SetRunbookMode, ShadowReport,
    SimFaultReply, StartRun, Verifying, WindowReply, Windows,
};
use nightshift_engine::audit::{AuditRecord, AuditStore, RunFilter, RunPage, VerifyReport};
use nightshift_engine::config::EngineConfig;
use nightshift_engine::engine::{Engine, RunRequest, Submitted};

use crate::Fail;
use crate::remote::{Remote, fail, unreachable};
use nightshift_engine::api::{EngineApi, RecordsQuery, RunsQuery, Session};

/// A runbook as the CLI shows it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RunbookInfo {
    pub name: String,
    pub description: String,
    pub handbook: Option<String>,
    pub trigger: String,
    pub scope: String,
    /// Where the trigger's input comes from on a real fleet.
    #[serde(default)]
    pub input: String,
    #[serde(default)]
    pub manifest: Value,
    #[serde(default)]
    pub script: String,
    #[serde(default)]
    pub manifest_path: String,
    /// `act` or `shadow`: what an admin set, else the manifest's.
    #[serde(default)]
    pub mode: String,
}

impl From<nightshift_engine::api::RunbookBrief> for RunbookInfo {
    fn from(r: nightshift_engine::api::RunbookBrief) -> RunbookInfo {
        RunbookInfo {
            name: r.name,
            description: r.description,
            handbook: r.handbook,
            trigger: r.trigger,
            scope: r.scope,
            input: r.input,
            mode: r.mode,
            ..RunbookInfo::default()
        }
    }
}

impl From<nightshift_engine::api::RunbookView> for RunbookInfo {
    fn from(r: nightshift_engine::api::RunbookView) -> RunbookInfo {
        RunbookInfo {
            name: r.name,
            description: r.description,
            handbook: r.handbook,
            trigger: r.trigger,
            scope: r.scope,
            input: r.input,
            manifest: r.manifest,
            script: r.script,
            manifest_path: r.manifest_path,
            mode: r.mode,
        }
    }
}

/// The engine in this process.
pub struct Local {
    pub config: EngineConfig,
    pub config_path: PathBuf,
    pub engine: Option<Engine>,
    audit: Option<AuditStore>,
}

pub enum Conn {
    Remote(Remote),
    Local(Box<Local>),
}

impl Local {
    /// Read the config; open nothing yet.
    pub fn new(path: &Path) -> Result<Local> {
        let config = EngineConfig::load(path).map_err(|e| anyhow::Error::new(Fail(2)).context(e.to_string()))?;
        Ok(Local { config, config_path: path.into(), engine: None, audit: None })
    }

    /// The audit store (opening it takes the data dir's lock).
    pub fn audit(&mut self) -> Result<AuditStore> {
        if let Some(e) = &self.engine {
            return Ok(e.audit().clone());
        }
        if let Some(a) = &self.audit {
            return Ok(a.clone());
        }
        let clock: nightshift_proto::clock::SharedClock = std::sync::Arc::new(nightshift_proto::clock::SystemClock);
        let a = AuditStore::open(&self.config.data_dir, clock).map_err(|e| locked(e, &self.config.data_dir))?;
        self.audit = Some(a.clone());
        Ok(a)
    }

    /// Start the engine here, with connections to the agents.
    pub async fn engine(&mut self) -> Result<Engine> {
        if let Some(e) = &self.engine {
            return Ok(e.clone());
        }
        if self.audit.is_some() {
            return Err(anyhow!("internal: the audit store is already open"));
        }
        let engine = nightshift_engine::serve::start(self.config.clone()).await.map_err(|e| match e {
            nightshift_engine::serve::StartError::Audit(a) => locked(a, &self.config.data_dir),
            other => anyhow::Error::new(Fail(2)).context(other.to_string()),
        })?;
        self.engine = Some(engine.clone());
        Ok(engine)
    }

    /// Runbooks from the configured folder (no engine needed).
    pub fn runbooks(&self) -> Result<Vec<RunbookInfo>> {
        let script = nightshift_engine::embed::build_engine(&self.config.script);
        let set = nightshift_engine::embed::load_dir(&self.config.runbook_dir, &script);
        // Promotions and demotions as the engine last saved them (its cache
        // of the chain; the engine rewrites it from the chain at start).
        let set_modes: std::collections::BTreeMap<String, nightshift_engine::api::Mode> =
            std::fs::read(nightshift_engine::api::modes_path(&self.config.data_dir))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
        Ok(set
            .runbooks
            .iter()
            .map(|r| RunbookInfo {
                name: r.manifest.name.clone(),
                description: r.manifest.description.clone(),
                handbook: r.manifest.handbook.clone(),
                trigger: r.manifest.trigger.kind().into(),
                scope: format!("{:?}", r.manifest.scope).to_lowercase(),
                input: r.manifest.input_source(),
                manifest: serde_json::to_value(&r.manifest).unwrap_or(Value::Null),
                script: r.script_source.clone(),
                manifest_path: r.manifest_path.display().to_string(),
                mode: set_modes.get(&r.manifest.name).copied().unwrap_or(r.manifest.mode).as_str().into(),
            })
            .collect())
    }

    /// Wait until `nodes` are connected (the embedded engine just started).
    pub async fn wait_connected(&self, nodes: &[String], secs: u64) -> Result<()> {
        let Some(engine) = &self.engine else { return Ok(()) };
        let end = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let missing: Vec<(String, Option<String>)> = nodes
                .iter()
                .filter_map(|n| match engine.node(n) {
                    Some(v) if v.state.connected => None,
                    Some(v) => Some((n.clone(), v.state.last_error.clone())),
                    None => Some((n.clone(), Some("not in the inventory".into()))),
                })
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if std::time::Instant::now() > end {
                let list: Vec<String> = missing
                    .iter()
                    .map(|(n, e)| format!("{n} ({})", e.clone().unwrap_or_else(|| "no telemetry yet".into())))
                    .collect();
                return Err(anyhow::Error::new(Fail(4)).context(format!("agents unreachable: {}", list.join(", "))));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn locked(e: nightshift_engine::audit::AuditError, dir: &Path) -> anyhow::Error {
    match e {
        nightshift_engine::audit::AuditError::Locked { .. } => anyhow::Error::new(Fail(2)).context(format!(
            "the data dir {} is in use by another nightshift process (is `nightshift serve` running?): talk to it with --server URL instead",
            dir.display()
        )),
        other => anyhow::Error::new(Fail(2)).context(other.to_string()),
    }
}

/// The engine's operations in one mode: the server over HTTP, or the
/// engine in this process answering as you.
pub enum Api<'a> {
    Remote(&'a Remote),
    Local(Session),
}

impl Api<'_> {
    pub fn get(&self) -> &dyn EngineApi {
        match self {
            Api::Remote(r) => *r,
            Api::Local(s) => s,
        }
    }
}

/// Who the embedded engine acts as: `$USER` (recorded as `user:$USER`),
/// an admin of the data dir it opened.
fn local_user() -> String {
    std::env::var("USER").unwrap_or_else(|_| "cli".into())
}

impl Conn {
    /// The front door in this mode (starting the embedded engine when it
    /// is the first call that needs it): each operation one implementation,
    /// `nightshift_engine::api::Session`'s, here or behind the server.
    pub async fn api(&mut self) -> Result<Api<'_>> {
        Ok(match self {
            Conn::Remote(r) => Api::Remote(r),
            Conn::Local(l) => Api::Local(Session::new(l.engine().await?, &local_user(), true)),
        })
    }

    /// Say which engine this is.
    pub fn describe(&self) -> String {
        match self {
            Conn::Remote(r) => format!("using the engine at {}", r.url),
            Conn::Local(l) => format!(
                "using the engine embedded on {} (data in {})",
                l.config_path.display(),
                l.config.data_dir.display()
            ),
        }
    }

    /// Runs, newest first; with `label`, only those on the nodes that carry
    /// it now (resolved by the running engine for `--server`, from the
    /// embedded engine's fleet here: the audit store knows no labels).
    pub async fn runs(&mut self, f: &RunFilter, label: Option<&(String, String)>) -> Result<RunPage> {
        match self {
            Conn::Remote(r) => r.runs(RunsQuery::of(f, label)).await.map_err(fail),
            // From the store (a stopped engine's data dir reads too); a
            // label asks the embedded engine which nodes carry it.
            Conn::Local(l) => {
                let mut f = f.clone();
                if let Some((k, v)) = label {
                    let by_label = RunsQuery { label: Some(format!("{k}={v}")), ..Default::default() };
                    f.nodes_any = by_label.filter(&l.engine().await?).map_err(fail)?.nodes_any;
                }
                Ok(l.audit()?.runs(&f)?)
            }
        }
    }

    /// The runs of every shard of a PostgreSQL database.
    pub async fn runs_all_shards(
        &mut self,
        f: &RunFilter,
        label: Option<&(String, String)>,
    ) -> Result<nightshift_engine::audit::pg::ShardRunPage> {
        match self {
            Conn::Remote(r) => r.runs_all_shards(RunsQuery::of(f, label)).await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "--all-shards asks a running engine on PostgreSQL: pass --server URL (or set NIGHTSHIFT_SERVER)",
            )),
        }
    }

    pub async fn run(&mut self, id: &str) -> Result<RunDetail> {
        match self {
            Conn::Remote(r) => r.run(id).await.map_err(fail),
            // From the store: a stopped engine's data dir reads too.
            Conn::Local(l) => {
                let a = l.audit()?;
                let run = a.run(id)?.ok_or_else(|| anyhow::Error::new(Fail(2)).context(format!("no run {id:?}")))?;
                Ok(RunDetail { run, records: a.run_records(id)? })
            }
        }
    }

    pub async fn submit(&mut self, req: RunRequest) -> Result<Submitted> {
        match self {
            Conn::Remote(r) => {
                // One key for this submission: a retry after a lost answer
                // (the engine restarting, a dropped connection) gets the
                // run the first try started, never a second one.
                let key = format!("cli-{:032x}", rand::random::<u128>());
                let body = StartRun::new(&req.runbook, &req.target, req.params.clone(), req.dry_run);
                let mut tries = 0;
                loop {
                    tries += 1;
                    match r.submit(body.clone(), Some(key.clone())).await {
                        Err(e) if tries < 3 && e.status == 0 => {
                            eprintln!("{e}: trying again with the same Idempotency-Key ({tries} of 3)");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        other => break other.map_err(fail),
                    }
                }
            }
            Conn::Local(_) => {
                let body = StartRun::new(&req.runbook, &req.target, req.params.clone(), req.dry_run);
                self.api().await?.get().submit(body, None).await.map_err(fail)
            }
        }
    }

    /// Walk the chain (and check `anchor`, a head kept from `audit head`).
    /// Here, on a stopped engine's data dir, nothing is opened for writing.
    pub async fn verify(&mut self, anchor: Option<(u64, String)>) -> Result<VerifyReport> {
        match self {
            Conn::Remote(r) => {
                let mut v = r.verify().await.map_err(fail)?;
                if let Some((seq, hash)) = anchor.filter(|_| v.ok) {
                    let found = r
                        .records(RecordsQuery { after_seq: seq - 1, limit: Some(1) })
                        .await
                        .map_err(fail)?
                        .into_iter()
                        .next()
                        .filter(|rec| rec.seq == seq)
                        .map(|rec| rec.hash);
                    if let Some(problem) =
                        nightshift_engine::audit::anchor_check(v.verified_up_to, seq, &hash, found.as_deref())
                    {
                        (v.ok, v.first_bad_seq, v.problem) = (false, Some(seq), Some(problem));
                    }
                }
                Ok(v)
            }
            Conn::Local(l) => {
                if l.config.audit.backend == nightshift_engine::config::AuditBackend::Postgres {
                    return Err(anyhow::Error::new(Fail(2)).context(
                        "with audit.backend: postgres the chain is in the database: pass --server URL of any engine of the shard",
                    ));
                }
                let dir = l.config.data_dir.clone();
                let d = dir.clone();
                tokio::task::spawn_blocking(move || {
                    nightshift_engine::audit::verify_dir(&d, anchor.as_ref().map(|(s, h)| (*s, h.as_str())))
                })
                .await?
                .map_err(|e| locked(e, &dir))
            }
        }
    }

    /// Whether this is the engine's data dir here (not a server).
    pub fn is_local(&self) -> bool {
        matches!(self, Conn::Local(_))
    }

    /// The newest record (none in an empty store).
    pub async fn audit_head(&mut self) -> Result<Option<AuditRecord>> {
        match self {
            Conn::Remote(r) => {
                let seq = r.audit_head().await.map_err(fail)?.seq;
                if seq == 0 {
                    return Ok(None);
                }
                Ok(r.records(RecordsQuery { after_seq: seq - 1, limit: Some(1) })
                    .await
                    .map_err(fail)?
                    .into_iter()
                    .next())
            }
            Conn::Local(l) => {
                let a = l.audit()?;
                let seq = a.head_seq();
                if seq == 0 { Ok(None) } else { Ok(a.get(seq)?) }
            }
        }
    }

    pub async fn records_after(&mut self, after: u64, limit: usize) -> Result<Vec<AuditRecord>> {
        match self {
            Conn::Remote(r) => r.records(RecordsQuery { after_seq: after, limit: Some(limit) }).await.map_err(fail),
            Conn::Local(l) => Ok(l.audit()?.tail(after, limit)?),
        }
    }

    /// The nodes `f` selects (every page of them). Embedded, the engine
    /// first waits a moment for its agents (a node's state is its agent's).
    pub async fn nodes_filtered(&mut self, f: &nightshift_engine::api::NodeFilter) -> Result<Vec<NodeView>> {
        if let Conn::Local(l) = self {
            let names = l.engine().await?.node_names();
            let _ = l.wait_connected(&names, 5).await;
        }
        let mut query = nightshift_engine::api::NodesQuery::of(f);
        let mut out = Vec::new();
        loop {
            let page = self.api().await?.get().nodes(query.clone()).await.map_err(fail)?;
            out.extend(page.nodes);
            match page.next_cursor {
                // Names are listed in order: a cursor that does not move on
                // would page forever.
                Some(c) if query.cursor.as_ref().is_none_or(|prev| c > *prev) => query.cursor = Some(c),
                Some(c) => {
                    return Err(anyhow::anyhow!(
                        "the node listing's next cursor did not move on: expected a name after {:?}, found {c:?}",
                        query.cursor.unwrap_or_default()
                    ));
                }
                None => return Ok(out),
            }
        }
    }

    /// One round trip to `node`'s agent, timed.
    /// One round trip to `node`'s agent, timed.
    pub async fn ping(&mut self, node: &str) -> Result<AgentPing> {
        self.api().await?.get().ping(node).await.map_err(fail)
    }

    /// What `node`'s agent holds, setting by setting.
    /// What `node`'s agent holds, setting by setting.
    pub async fn holds(&mut self, node: &str) -> Result<AgentHolds> {
        self.api().await?.get().holds(node).await.map_err(fail)
    }

    /// `node`'s inventory, as its agent reads it.
    pub async fn inventory(&mut self, node: &str) -> Result<nightshift_proto::Inventory> {
        self.api().await?.get().inventory(node).await.map_err(fail)
    }

    /// A node's health (the engine's health model).
    pub async fn node_health(&mut self, node: &str) -> Result<NodeHealth> {
        // An engine started for this command has read no inventory yet and
        // knows none of the node's GPUs: read the node's first.
        if let Conn::Local(l) = self {
            l.engine().await?.ensure_inventory(node).await;
        }
        self.api().await?.get().node_health(node).await.map_err(fail)
    }

    /// One file of an RMA evidence bundle on `node`, copied off the node
    /// into `out` as it comes (the engine asks the agent piece by piece).
    /// The bytes written.
    pub async fn evidence_file(
        &mut self,
        node: &str,
        bundle: &str,
        file: &str,
        out: &mut impl std::io::Write,
    ) -> Result<u64> {
        let mut n = 0u64;
        match self {
            Conn::Remote(r) => {
                let path = format!(
                    "/api/v1/nodes/{}/evidence/{}/{}",
                    crate::out::urlencode(node),
                    crate::out::urlencode(bundle),
                    crate::out::urlencode(file)
                );
                // A bug report is up to the bundle's limit (256 MiB): an hour.
                let mut resp = r
                    .req(reqwest::Method::GET, &path)
                    .timeout(Duration::from_secs(3600))
                    .send()
                    .await
                    .map_err(|e| unreachable(&r.url, e))?;
                let status = resp.status();
                if !status.is_success() {
                    let body = resp.text().await.map_err(|e| unreachable(&r.url, e))?;
                    r.answer::<serde::de::IgnoredAny>(status, body)?;
                    return Ok(0);
                }
                while let Some(chunk) = resp.chunk().await.map_err(|e| unreachable(&r.url, e))? {
                    out.write_all(&chunk)?;
                    n += chunk.len() as u64;
                }
            }
            Conn::Local(l) => {
                let e = l.engine().await?;
                loop {
                    let c = e.read_evidence(node, bundle, file, n).await.map_err(|err| {
                        let code = match err {
                            nightshift_engine::api::EvidenceReadError::Unreachable(_) => 4,
                            _ => 2,
                        };
                        anyhow::Error::new(Fail(code)).context(format!("{node}: {err}"))
                    })?;
                    let data = hex::decode(&c.data_hex)?;
                    out.write_all(&data)?;
                    n += data.len() as u64;
                    if c.eof || data.is_empty() {
                        break;
                    }
                }
            }
        }
        Ok(n)
    }

    /// The agent's health check, now.
    pub async fn health_check(&mut self, node: &str) -> Result<HealthCheckReply> {
        self.api().await?.get().health_check(node).await.map_err(fail)
    }

    /// A person says `node` (or one GPU) was repaired.
    /// What the engine would decide for `req` (target nodes, nodes
    /// changed, approval), changing nothing.
    pub async fn plan(&mut self, req: &RunRequest) -> Result<Plan> {
        let body = StartRun::new(&req.runbook, &req.target, req.params.clone(), req.dry_run);
        self.api().await?.get().plan(body).await.map_err(fail)
    }

    /// Cancel a run (the running engine's, or this process's own).
    pub async fn cancel(&mut self, run: &str, reason: &str) -> Result<()> {
        let body = Cancel { reason: Some(reason.to_string()) };
        self.api().await?.get().cancel(run, body).await.map_err(fail)?;
        Ok(())
    }

    pub async fn repaired(&mut self, node: &str, gpu: Option<u32>, note: &str) -> Result<Verifying> {
        let body = Repaired { gpu, note: note.to_string() };
        self.api().await?.get().repaired(node, body).await.map_err(fail)
    }

    pub async fn runbooks(&mut self) -> Result<Vec<RunbookInfo>> {
        match self {
            Conn::Remote(r) => {
                Ok(r.runbooks().await.map_err(fail)?.runbooks.into_iter().map(RunbookInfo::from).collect())
            }
            // From the folder: no engine needed.
            Conn::Local(l) => l.runbooks(),
        }
    }

    pub async fn runbook(&mut self, name: &str) -> Result<RunbookInfo> {
        match self {
            Conn::Remote(r) => Ok(RunbookInfo::from(r.runbook(name).await.map_err(fail)?.runbook)),
            Conn::Local(l) => l.runbooks()?.into_iter().find(|r| r.name == name).ok_or_else(|| {
                anyhow::Error::new(Fail(2))
                    .context(format!("no runbook {name:?} in {}", l.config.runbook_dir.display()))
            }),
        }
    }

    pub async fn decide(&mut self, run: &str, approve: bool, reason: Option<&str>) -> Result<RunSummary> {
        match self {
            Conn::Remote(r) if approve => r.approve(run).await.map_err(fail),
            Conn::Remote(r) => {
                r.reject(run, Reason { reason: reason.unwrap_or_default().to_string() }).await.map_err(fail)
            }
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "approvals live in a running engine: pass --server URL (or set NIGHTSHIFT_SERVER) to approve or reject",
            )),
        }
    }

    /// The whole fleet's mode: `{mode, set_by, reason}`.
    pub async fn fleet_mode(&mut self) -> Result<FleetModeView> {
        self.api().await?.get().fleet_mode().await.map_err(fail)
    }

    /// Set the whole fleet's mode on a running engine (admin).
    pub async fn set_fleet_mode(
        &mut self,
        mode: nightshift_engine::api::FleetMode,
        reason: &str,
    ) -> Result<FleetModeView> {
        match self {
            Conn::Remote(r) => r.set_fleet_mode(SetFleetMode { mode, reason: reason.to_string() }).await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "the fleet's mode changes a running engine: pass --server URL (or set NIGHTSHIFT_SERVER) with an admin token",
            )),
        }
    }

    /// Tell a simulated node a fault (`SimFault` as JSON) on a running engine (admin).
    pub async fn sim_fault(&mut self, node: &str, fault: &nightshift_proto::SimFault) -> Result<SimFaultReply> {
        match self {
            Conn::Remote(r) => r.sim_fault(node, fault.clone()).await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "a simulated fault goes to a running engine's agent: pass --server URL (or set NIGHTSHIFT_SERVER) with an admin token",
            )),
        }
    }

    /// Maintenance windows in force or to come.
    pub async fn windows(&mut self) -> Result<Windows> {
        self.api().await?.get().windows().await.map_err(fail)
    }

    /// Set a maintenance window on a running engine (admin).
    pub async fn set_window(&mut self, body: NewWindow) -> Result<WindowReply> {
        self.running("a maintenance window changes a running engine")?.set_window(body).await.map_err(fail)
    }

    /// End a maintenance window before its time on a running engine (admin).
    pub async fn end_window(&mut self, id: &str, reason: &str) -> Result<WindowReply> {
        let body = Reason { reason: reason.to_string() };
        self.running("a maintenance window changes a running engine")?.end_window(id, body).await.map_err(fail)
    }

    /// The running engine, for what changes one: a `--server`.
    pub fn running(&self, what: &str) -> Result<&Remote> {
        match self {
            Conn::Remote(r) => Ok(r),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2))
                .context(format!("{what}: pass --server URL (or set NIGHTSHIFT_SERVER) with an admin token"))),
        }
    }

    /// Promote or demote a runbook on a running engine (admin).
    pub async fn set_mode(
        &mut self,
        name: &str,
        mode: nightshift_engine::api::Mode,
        reason: &str,
    ) -> Result<RunbookModeReply> {
        match self {
            Conn::Remote(r) => {
                r.set_runbook_mode(name, SetRunbookMode { mode, reason: reason.to_string() }).await.map_err(fail)
            }
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "promotion and demotion change a running engine: pass --server URL (or set NIGHTSHIFT_SERVER) with an admin token",
            )),
        }
    }

    /// A shadow runbook's report since `since_ms`.
    pub async fn shadow_report(&mut self, name: &str, since_ms: i64) -> Result<ShadowReport> {
        self.api().await?.get().shadow_report(name, Some(since_ms), None).await.map_err(fail)
    }

    /// Ask a running engine to reload (admin).
    pub async fn reload(&mut self, allow_partial: bool) -> Result<ReloadReply> {
        match self {
            Conn::Remote(r) => r.reload(allow_partial).await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "a reload changes a running engine: pass --server URL (or set NIGHTSHIFT_SERVER), or send the engine SIGHUP (systemctl reload nightshift-engine)",
            )),
        }
    }

    /// Every shard's chain verified in the engine's database.
    pub async fn verify_shards(&self) -> Result<std::collections::BTreeMap<String, VerifyReport>> {
        match self {
            Conn::Remote(r) => r.verify_shards().await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "--all-shards asks a running engine on PostgreSQL: pass --server URL (or set NIGHTSHIFT_SERVER)",
            )),
        }
    }

    /// `/api/v1/ha`, or for an engine.yaml here, what its database says.
    pub async fn ha(&self) -> Result<HaReply> {
        match self {
            Conn::Remote(r) => r.ha().await.map_err(fail),
            Conn::Local(_) => Err(anyhow::Error::new(Fail(2)).context(
                "leadership is a running engine's: pass --server URL (or set NIGHTSHIFT_SERVER) of any engine of the shard",
            )),
        }
    }

    /// Shut an embedded engine down cleanly.
    pub async fn close(&mut self) {
        if let Conn::Local(l) = self
            && let Some(e) = l.engine.take()
        {
            e.shutdown().await;
        }
    }
}
