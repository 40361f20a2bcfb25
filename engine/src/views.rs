//! What people and tools read — runs, records, nodes, runbooks — and the
//! few node facts the serving loops set (connected, inventory, hands-off).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nightshift_proto::{HoldInfo, Inventory, NoArgs, Op, Reply, Request};

use crate::audit::{AuditRecord, NewRecord, RecordKind, RunFilter, RunPage, VerifyReport};
use crate::base::metrics::{self, MetricId};
use crate::core::Brain;
use crate::engine::{Engine, EngineError};
use crate::fleet::NodeState;
use crate::runs::RunSummary;
use crate::signals::telemetry::SeriesKey;

/// A snapshot of one node for the API and UI.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub labels: BTreeMap<String, String>,
    pub standby: bool,
    pub state: NodeState,
    pub drained_by_person: bool,
    /// Latest readings: per GPU, metric name → value.
    pub gpus: Vec<BTreeMap<String, f64>>,
    pub node_metrics: BTreeMap<String, f64>,
    /// The exclusive run holding the node right now.
    pub locked_by: Option<String>,
    /// Holds in effect on the node and its GPUs, from its agent.
    pub holds: Vec<HoldInfo>,
}

/// A runbook for the API and UI.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunbookView {
    pub name: String,
    pub description: String,
    pub handbook: Option<String>,
    pub trigger: String,
    pub scope: String,
    pub class: String,
    pub priority: String,
    /// `act` or `shadow`, as in force now (an admin's promotion or
    /// demotion, else the manifest's).
    pub mode: String,
    /// Where the trigger's input comes from on a real fleet.
    pub input: String,
    pub manifest_path: String,
    pub manifest: Value,
    pub script_path: String,
    pub script: String,
}

impl Engine {
    pub fn runs(&self, f: &RunFilter) -> Result<RunPage, EngineError> {
        Ok(self.core.audit().runs(f)?)
    }

    pub fn run(&self, id: &str) -> Result<Option<RunSummary>, EngineError> {
        Ok(self.core.audit().run(id)?)
    }

    pub fn run_records(&self, id: &str) -> Result<Vec<AuditRecord>, EngineError> {
        Ok(self.core.audit().run_records(id)?)
    }

    pub fn verify(&self) -> Result<VerifyReport, EngineError> {
        Ok(self.core.audit().verify()?)
    }

    /// [`Engine::verify`] off the async threads (it reads the whole store,
    /// and waits out a store stuck on damaged data). One at a time: callers
    /// wait for the walk in progress, and a report is served again while
    /// the head has not moved (for at most `VERIFY_CACHE_SECS`) — page
    /// loads cannot stack up full-chain walks.
    pub(crate) async fn verify_in_background(&self) -> Result<VerifyReport, EngineError> {
        let head = self.core.audit().head_seq();
        self.core
            .verify_cache()
            .report(head, || async {
                let audit = self.core.audit().clone();
                self.core.counters().add(crate::base::counters::Count::VerifyWalks, 1);
                let r = tokio::task::spawn_blocking(move || audit.verify())
                    .await
                    .map_err(|e| crate::audit::AuditError::Read(format!("the verify task failed: {e}")))??;
                Ok(r)
            })
            .await
    }

    /// Runs waiting for approval.
    /// On a standby, from its copy of the chain (the run table is the
    /// leader's): the approvals page reads the same through either engine.
    pub(crate) fn pending_approvals(&self) -> Vec<RunSummary> {
        if self.core.acting() {
            return self.core.runs().pending_approvals();
        }
        let f = crate::audit::RunFilter {
            state: Some(crate::runs::RunState::PendingApproval),
            limit: Some(1000),
            ..Default::default()
        };
        let mut v = self.core.audit().runs(&f).map(|p| p.runs).unwrap_or_default();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// The fleet's node names.
    pub fn node_names(&self) -> Vec<String> {
        self.core.fleet().nodes().iter().map(|n| n.spec.name.clone()).collect()
    }

    /// GPUs the fleet's inventories report.
    pub fn fleet_gpus(&self) -> usize {
        self.core.fleet().nodes().iter().map(|n| n.state().gpu_count()).sum()
    }

    /// Agents with a live connection (or recent telemetry).
    /// What `/metrics`, the status line and the tests count, read at once:
    /// a lock each and one pass over the nodes (not for a per-step loop).
    pub fn gauges(&self) -> Gauges {
        let (pages_pending, pages_undeliverable) = self.pages_pending();
        let (telemetry_series, telemetry_points) = self.telemetry_size();
        Gauges {
            queue_depth: self.queue_depth(),
            alert_backlog: self.alert_backlog(),
            pages_pending,
            pages_undeliverable,
            agents_connected: self.connected_agents(),
            telemetry_series,
            telemetry_points,
        }
    }

    pub(crate) fn connected_agents(&self) -> usize {
        self.core.fleet().nodes().iter().filter(|n| n.state().connected).count()
    }

    /// A node's view.
    pub fn node(&self, name: &str) -> Option<NodeView> {
        let n = self.core.fleet().get(name)?;
        let state = n.state().clone();
        let b = self.core.signals().brain();
        let latest = |b: &Brain, gpu: Option<u16>, i: usize| {
            b.store().latest(SeriesKey { node: n.idx, gpu, metric: i as MetricId }).map(|(_, v)| v)
        };
        let gpu_count = state.gpu_count().max(usize::from(state.inventory.is_some()));
        let gpus = (0..gpu_count)
            .filter_map(|g| u16::try_from(g).ok())
            .map(|g| {
                metrics::METRICS
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m.gpu_scoped)
                    .filter_map(|(i, m)| latest(&b, Some(g), i).map(|v| (m.name.to_string(), v)))
                    .collect()
            })
            .collect();
        let node_metrics = metrics::METRICS
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.gpu_scoped)
            .filter_map(|(i, m)| latest(&b, None, i).map(|v| (m.name.to_string(), v)))
            .collect();
        drop(b);
        let locked_by = self.core.runs().node_lock(name);
        Some(NodeView {
            name: n.spec.name.clone(),
            address: n.addr.clone(),
            labels: n.spec.labels.clone(),
            standby: n.spec.standby,
            drained_by_person: state.drained_by_person(),
            holds: state.holds.clone(),
            state,
            gpus,
            node_metrics,
            locked_by,
        })
    }

    /// Every hold in effect on the fleet, as the agents last reported
    /// them: `(node, hold)`.
    pub fn active_holds(&self) -> Vec<(String, nightshift_proto::HoldInfo)> {
        self.core
            .fleet()
            .nodes()
            .iter()
            .flat_map(|n| {
                let name = n.spec.name.clone();
                n.state().holds.clone().into_iter().map(move |h| (name.clone(), h))
            })
            .collect()
    }

    /// A plotted series of a node (or one of its GPUs) between two times:
    /// `(ts_ms, value)`, one point per history step (`signals/history.rs`).
    pub fn series(&self, node: &str, gpu: Option<u32>, metric: MetricId, from_ms: i64, to_ms: i64) -> Vec<(i64, f64)> {
        let Some(n) = self.core.fleet().get(node) else { return Vec::new() };
        let Ok(gpu) = gpu.map(u16::try_from).transpose() else { return Vec::new() };
        self.core.signals().history().range((n.idx, gpu, metric), from_ms, to_ms)
    }

    /// Every node's view.
    pub fn nodes(&self) -> Vec<NodeView> {
        self.node_names().iter().filter_map(|n| self.node(n)).collect()
    }

    /// Every runbook's view.
    pub(crate) fn runbooks(&self) -> Vec<RunbookView> {
        self.runbook_set()
            .runbooks
            .iter()
            .map(|r| RunbookView {
                name: r.manifest.name.clone(),
                description: r.manifest.description.clone(),
                handbook: r.manifest.handbook.clone(),
                trigger: r.manifest.trigger.kind().into(),
                scope: format!("{:?}", r.manifest.scope).to_lowercase(),
                class: format!("{:?}", r.manifest.class).to_lowercase(),
                priority: r.manifest.priority.as_str().into(),
                mode: self.runbook_mode(&r.manifest.name).as_str().into(),
                input: r.manifest.input_source(),
                manifest_path: r.manifest_path.display().to_string(),
                manifest: serde_json::to_value(&r.manifest).unwrap_or(Value::Null),
                script_path: r.script_path.display().to_string(),
                script: r.script_source.clone(),
            })
            .collect()
    }

    /// How often each runbook's trigger was evaluated and fired:
    /// `(runbook, evaluations, fires)`. Alert triggers count the alerts
    /// with their alertname; manual runbooks are never evaluated.
    pub fn trigger_stats(&self) -> Vec<(String, u64, u64)> {
        let set = self.runbook_set();
        let b = self.core.signals().brain();
        let alerts = self.core.counters().alert_evaluations();
        let offers = self.core.counters().fault_offers();
        let health = self.core.counters().get(crate::base::counters::Count::HealthEvaluations);
        set.runbooks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (mut ev, mut fi) = b.triggers().counts(i);
                ev += alerts.get(&r.manifest.name).copied().unwrap_or(0);
                if let crate::runbooks::manifest::Trigger::Fault { .. } = r.manifest.trigger {
                    // A fault trigger looks at every GPU's health on every
                    // agent reading, and on every pulled one that brings
                    // fault evidence or finds the node on record.
                    ev += health;
                    fi += offers.get(&r.manifest.name).copied().unwrap_or(0);
                }
                (r.manifest.name.clone(), ev, fi)
            })
            .collect()
    }

    /// Send a reading request straight to a node's agent (ping, inventory,
    /// holds).
    pub(crate) async fn agent_call(&self, node: &str, op: Op) -> Result<Reply, EngineError> {
        if op.is_mutating() {
            return Err(EngineError::NotReadOnly { op: op.name().to_string() });
        }
        let n = self.core.fleet().get(node).ok_or_else(|| EngineError::UnknownNode(node.into()))?;
        let req = Request::new(self.core.ids().request(&format!("cli-{}", op.name())), op);
        n.transport
            .call(req)
            .await
            .map_err(|e| EngineError::AgentUnreachable { node: node.to_string(), message: e.to_string() })
    }

    /// Set or clear the engine-side hands-off marker of a node (admin).
    /// `on`: set it, saying why (`reason`); off: clear it, the reason
    /// recorded too ("hands-off ended" when none is given).
    pub(crate) async fn set_hands_off(
        &self,
        node: &str,
        by: &str,
        on: bool,
        reason: Option<&str>,
        until_ms: Option<i64>,
    ) -> Result<(), EngineError> {
        let n = self.core.fleet().get(node).ok_or_else(|| EngineError::UnknownNode(node.into()))?;
        if let Some(problem) = reason.and_then(|r| nightshift_proto::names::free_text_problem("reason", r)) {
            return Err(EngineError::BadParams(problem));
        }
        let reason = reason.map(str::trim).filter(|r| !r.is_empty());
        let why = if on { Some(reason.unwrap_or("maintenance")) } else { None };
        let until_ms = until_ms.filter(|_| on);
        // Durable first: a hands-off holds across a restart (rebuilt from
        // the chain), so it is not in force before its record is.
        let recorded = if on { why } else { Some(reason.unwrap_or("hands-off ended")) };
        let payload = crate::audit::data::HandsOff { hands_off: on, reason: recorded.map(str::to_string), until_ms };
        self.core.audit().append(NewRecord::typed(RecordKind::HandsOff, by, &payload).node(Some(node)), None).await?;
        {
            let mut st = n.state();
            st.engine_hands_off = why.map(|w| (by.to_string(), w.to_string()));
            st.engine_hands_off_until_ms = until_ms;
        }
        if let Some(w) = why {
            self.resolve_pages(node, None, &format!("taken over by {by}: hands-off ({w})"), None).await;
        }
        Ok(())
    }

    /// End every engine hands-off whose time is up, audited as the
    /// engine's with who set it and until when.
    pub(crate) async fn expire_hands_off(&self) {
        let now = self.core.now();
        for n in self.core.fleet().nodes().iter() {
            let (by, until) = {
                let st = n.state();
                match (&st.engine_hands_off, st.engine_hands_off_until_ms) {
                    (Some((by, _)), Some(until)) if until <= now => (by.clone(), until),
                    _ => continue,
                }
            };
            let why = format!(
                "the hands-off {by} set ended at {} as they asked",
                crate::signals::alerts::format_rfc3339_ms(until)
            );
            let payload = crate::audit::data::HandsOff { hands_off: false, reason: Some(why), until_ms: None };
            let rec = NewRecord::typed(RecordKind::HandsOff, "engine", &payload).node(Some(&n.spec.name));
            match self.core.audit().append(rec, None).await {
                Ok(_) => {
                    let mut st = n.state();
                    st.engine_hands_off = None;
                    st.engine_hands_off_until_ms = None;
                    tracing::info!(node = %n.spec.name, set_by = %by, "hands-off expired");
                }
                Err(e) => tracing::error!(node = %n.spec.name, error = %e, "cannot audit a hands-off's end: it stays"),
            }
        }
    }

    /// The newest record: its sequence number and hash anchor the chain.
    pub(crate) fn audit_head(&self) -> Result<Option<AuditRecord>, EngineError> {
        let seq = self.core.audit().head_seq();
        if seq == 0 {
            return Ok(None);
        }
        Ok(self.core.audit().get(seq)?)
    }

    /// Post the audit head to every target with `audit_anchors: true`; each
    /// delivery is audited (`notification_delivery`, kind `audit_anchor`).
    pub(crate) async fn post_audit_anchor(&self) -> Result<usize, EngineError> {
        let targets = self.core.notifier().anchor_targets();
        let Some(head) = self.audit_head()? else { return Ok(0) };
        if targets.is_empty() {
            return Ok(0);
        }
        for t in &targets {
            let d = self.core.notifier().deliver(t, &crate::notify::anchor_body(t.format, &head)).await;
            self.core
                .audit()
                .append(
                    NewRecord::typed(
                        RecordKind::NotificationDelivery,
                        "engine",
                        &crate::audit::data::Delivery {
                            kind: Some("audit_anchor".into()),
                            target: t.name.clone(),
                            anchored_seq: Some(head.seq),
                            anchored_hash: Some(head.hash.clone()),
                            ok: d.ok,
                            attempts: d.attempts,
                            detail: d.detail.clone(),
                            ..Default::default()
                        },
                    ),
                    None,
                )
                .await?;
        }
        Ok(targets.len())
    }

    /// Put a new runbook set in force. Trigger states start over.
    pub fn replace_runbooks(&self, set: crate::runbooks::runbook::RunbookSet) {
        let brain = Brain::build(
            &set,
            (self.core.config().telemetry.script_window_secs as i64).saturating_mul(1000),
            self.core.config().telemetry.ingest_shards as usize,
        );
        *self.core.signals().brain() = brain;
        self.core.runbooks().loaded().replace(set);
    }

    /// Fetch every agent's inventory once (node state, GPU counts, vendor).
    pub async fn refresh_inventories(&self) {
        for n in self.core.fleet().nodes().iter() {
            self.fetch_inventory(n).await;
        }
    }

    /// Fetch `node`'s inventory if this engine has none yet (a connection's
    /// first call): a new engine knows a node only after this.
    pub async fn ensure_inventory(&self, node: &str) {
        let Some(n) = self.core.fleet().get(node) else { return };
        let known = n.state().inventory.is_some();
        if !known {
            self.fetch_inventory(&n).await;
        }
    }

    async fn fetch_inventory(&self, n: &crate::fleet::Node) {
        let req = Request::new(self.core.ids().request(&format!("inv-{}", n.spec.name)), Op::Inventory(NoArgs {}));
        match n.transport.call(req).await {
            Ok(r) if r.ok => {
                let inv = r.result.and_then(|v| serde_json::from_value(v).ok());
                let mut st = n.state();
                st.inventory = inv;
                st.last_error = None;
            }
            Ok(r) => n.state().last_error = r.error.map(|e| e.message),
            Err(e) => n.state().last_error = Some(e.to_string()),
        }
    }

    /// Record a node's inventory (from its agent).
    pub(crate) fn set_node_inventory(&self, node: &str, inv: Option<Inventory>, error: Option<String>) {
        if let Some(n) = self.core.fleet().get(node) {
            let mut st = n.state();
            if inv.is_some() {
                st.inventory = inv;
            }
            st.last_error = error;
        }
    }

    /// A node's agent answered (used when telemetry does not come from the
    /// agent's stream).
    pub(crate) fn mark_alive(&self, node: &str) {
        if let Some(n) = self.core.fleet().get(node) {
            let now = self.core.now();
            let mut st = n.state();
            st.connected = true;
            st.last_seen_ms = st.last_seen_ms.max(now);
            st.last_error = None;
        }
    }

    /// Mark a node unreachable, with why.
    pub(crate) fn set_node_disconnected(&self, node: &str, error: &str) {
        if let Some(n) = self.core.fleet().get(node) {
            let mut st = n.state();
            if st.connected || st.last_error.as_deref() != Some(error) {
                tracing::warn!(node, error, "agent unreachable");
            }
            st.connected = false;
            st.last_error = Some(error.to_string());
        }
    }

    /// The index of a node's GPU with this UUID (from its inventory).
    pub(crate) fn gpu_by_uuid(&self, node: &str, uuid: &str) -> Option<u32> {
        let n = self.core.fleet().get(node)?;
        let st = n.state();
        st.inventory.as_ref()?.gpus.iter().find(|g| g.uuid.as_deref() == Some(uuid)).map(|g| g.index)
    }

    /// Whether `node` is in the inventory.
    pub(crate) fn has_node(&self, node: &str) -> bool {
        self.core.fleet().get(node).is_some()
    }
}

impl Engine {
    /// A runbook's mode now: what an admin set, else its manifest's.
    pub(crate) fn runbook_mode(&self, name: &str) -> crate::runbooks::manifest::Mode {
        // A standby follows the chain: the leader's promotions and
        // demotions, as they are recorded.
        if !self.core.acting()
            && let Ok(records) = self.core.audit().records_of_kind(crate::audit::RecordKind::RunbookMode)
        {
            if let Some(m) = crate::runbooks::modes::modes_from_records(&records).get(name) {
                return *m;
            }
        } else if let Some(m) = self.core.runbooks().modes().get(name) {
            return m;
        }
        self.runbook_set().get(name).map(|(_, rb)| rb.manifest.mode).unwrap_or_default()
    }

    /// Promote (`act`) or demote (`shadow`) a runbook, saying why. Audited
    /// (`runbook_mode`, by `by`) before it takes effect; kept across
    /// restarts.
    pub async fn set_runbook_mode(
        &self,
        name: &str,
        mode: crate::runbooks::manifest::Mode,
        by: &str,
        reason: &str,
    ) -> Result<crate::runbooks::manifest::Mode, EngineError> {
        let set = self.runbook_set();
        if set.get(name).is_none() {
            return Err(EngineError::UnknownRunbook { name: name.into(), known: set.names().join(", ") });
        }
        if nightshift_proto::names::has_visible_text(reason)
            && let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason)
        {
            return Err(EngineError::BadModeChange(problem));
        }
        if !nightshift_proto::names::has_visible_text(reason) {
            return Err(EngineError::BadModeChange(format!(
                "reason: expected why {name} goes to {}, found no visible character",
                mode.as_str()
            )));
        }
        let from = self.runbook_mode(name);
        if from == mode {
            return Err(EngineError::BadModeChange(format!(
                "{name} is already in {} mode: expected a change",
                mode.as_str()
            )));
        }
        self.core
            .audit()
            .append(
                NewRecord::typed(
                    RecordKind::RunbookMode,
                    by,
                    &crate::audit::data::RunbookMode {
                        from: from.as_str().into(),
                        to: mode.as_str().into(),
                        reason: Some(reason.to_string()),
                    },
                )
                .runbook(name),
                None,
            )
            .await?;
        self.core.runbooks().modes().set(name, mode);
        Ok(mode)
    }
}

impl Engine {
    /// Take the runbook modes the shard's audit chain says an admin set (a
    /// new leader: the last leader's promotions and demotions hold here
    /// too), and keep them in `data_dir/runbook-modes.json`.
    pub(crate) fn adopt_modes(&self, modes: &BTreeMap<String, String>) {
        // The chain's modes, and only those: a mode the file holds with no
        // record behind it does not hold.
        let mut held = BTreeMap::new();
        for (name, mode) in modes {
            match serde_json::from_value::<crate::runbooks::manifest::Mode>(json!(mode)) {
                Ok(m) => {
                    held.insert(name.clone(), m);
                }
                Err(e) => {
                    tracing::error!(runbook = %name, error = %e, "an audited runbook mode cannot be read: the manifest's holds")
                }
            }
        }
        self.core.runbooks().modes().replace(held);
    }
}

/// The engine's counts now ([`Engine::gauges`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gauges {
    /// Runs waiting to start: queued or pending approval.
    pub queue_depth: usize,
    /// Alerts acknowledged and not yet handled.
    pub alert_backlog: u64,
    /// Pages kept for another try.
    pub pages_pending: usize,
    /// Pages given up on since the start.
    pub pages_undeliverable: u64,
    /// Agents connected now.
    pub agents_connected: usize,
    /// Series in the telemetry store, and points held across them.
    pub telemetry_series: usize,
    pub telemetry_points: usize,
}

impl Gauges {
    /// `(pending, undeliverable)` pages.
    pub fn pages(&self) -> (usize, u64) {
        (self.pages_pending, self.pages_undeliverable)
    }
}

/// Where this engine stands in its shard (`/api/v1/ha`, `/metrics`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HaStatus {
    /// `sled` (one engine, always leading) or `postgres`.
    pub backend: String,
    pub shard: Option<String>,
    /// This engine's name in the lease table.
    pub holder: Option<String>,
    /// `leader`, `taking_over` (caught up, recovering: writes wait),
    /// `standby` or `deposed`.
    pub role: String,
    /// The term this engine leads at.
    pub term: Option<u64>,
    /// The leader as this engine last read the lease row.
    pub leader: Option<crate::ha::LeaseRow>,
    /// Since the lease was last taken or renewed (leader only).
    pub lease_age_ms: Option<i64>,
    /// Why this engine stopped leading.
    pub deposed: Option<String>,
    /// From taking the lease to acting, when this engine took over.
    pub takeover_ms: Option<u64>,
}

impl Engine {
    /// The audit store's shared connection for reads (PostgreSQL backend).
    fn pg_reads(&self) -> Result<&crate::audit::PgReads, String> {
        self.core.audit().pg_reads().ok_or_else(|| "the sled backend has no database: leave out shards=all".into())
    }

    /// Runs, newest first, filtered: with PostgreSQL in SQL (this engine's
    /// shard, from the database), else from the sled store.
    pub(crate) async fn runs_page(&self, f: &RunFilter) -> Result<RunPage, EngineError> {
        let Some(pg) = self.core.audit().postgres() else { return self.runs(f) };
        let page = self
            .pg_reads()
            .map_err(crate::audit::AuditError::Read)?
            .runs(f, Some(&pg.shard))
            .await
            .map_err(crate::audit::AuditError::Read)?;
        Ok(RunPage { runs: page.runs.into_iter().map(|r| r.run).collect(), next_cursor: page.next_cursor })
    }

    /// The runs of every shard of this engine's database, filtered in SQL.
    pub(crate) async fn runs_all_shards(&self, f: &RunFilter) -> Result<crate::audit::pg::ShardRunPage, String> {
        self.pg_reads()?.runs(f, None).await
    }

    /// Verify every shard's chain in this engine's database, each by name.
    pub(crate) async fn verify_shards(&self) -> Result<BTreeMap<String, VerifyReport>, String> {
        self.pg_reads()?.verify_shards().await
    }

    /// Every shard of this engine's database: who leads it, at what term,
    /// and its chain's head (empty with the sled backend).
    pub(crate) async fn ha_shards(&self) -> Result<Vec<crate::ha::ShardRow>, String> {
        match self.core.audit().pg_reads() {
            Some(db) => db.shards().await,
            None => Ok(Vec::new()),
        }
    }

    /// Every engine of every shard, as each last announced itself.
    pub(crate) async fn ha_engines(&self) -> Result<Vec<crate::ha::EngineRow>, String> {
        match self.core.audit().pg_reads() {
            Some(db) => db.engines().await,
            None => Ok(Vec::new()),
        }
    }

    /// Leadership as this engine sees it.
    pub fn ha_status(&self) -> HaStatus {
        let takeover = self.core.counters().failover_ms();
        match self.core.leadership() {
            None => HaStatus {
                backend: "sled".into(),
                shard: None,
                holder: None,
                role: "leader".into(),
                term: None,
                leader: None,
                lease_age_ms: None,
                deposed: None,
                takeover_ms: None,
            },
            Some(l) => {
                let deposed = l.deposed().borrow().clone();
                HaStatus {
                    backend: "postgres".into(),
                    shard: Some(l.cfg.shard.clone()),
                    holder: Some(l.cfg.holder.clone()),
                    role: if l.is_ready() {
                        "leader"
                    } else if l.is_leader() {
                        "taking_over"
                    } else if deposed.is_some() {
                        "deposed"
                    } else {
                        "standby"
                    }
                    .into(),
                    term: l.term(),
                    leader: l.leader(),
                    lease_age_ms: l.lease_age_ms(),
                    deposed,
                    takeover_ms: (takeover > 0).then_some(takeover),
                }
            }
        }
    }
}
