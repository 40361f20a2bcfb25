//! The engine's shared state, [`Core`], and what both the executor and a
//! running script's host need of it: readings from the telemetry store,
//! run ids and request ids, audit appends for a run, notification delivery,
//! the blast radius.
//!
//! Who depends on whom: `engine`, `executor`, `ingest`, `recovery`, `views`
//! and `host` use this module; it uses none of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use nightshift_proto::clock::SharedClock;
use nightshift_proto::{Op, ReleaseArgs, Reply, Request};

use crate::audit::{AuditError, AuditRecord, AuditStore, NewRecord, RecordKind};
use crate::base::counters::Counters;
use crate::base::metrics;
use crate::config::EngineConfig;
use crate::fleet::{Fleet, Node};
use crate::notify::Notifier;
use crate::runbooks::manifest::Trigger;
use crate::runbooks::runbook::RunbookSet;
use crate::runbooks::script::{Agg, Reading};
use crate::runs::{RunSummary, Target};
use crate::signals::telemetry::SeriesKey;

mod parts;
pub use parts::EngineParts;

pub use crate::signals::brain::Brain;

/// Run ids and request ids that never repeat: a random epoch chosen at each
/// engine start, then a counter. A restart, a suppressed trigger or a
/// restored backup can never hand out an id an agent has journaled.
pub struct Ids {
    epoch: String,
    runs: AtomicU64,
    requests: AtomicU64,
}

impl Ids {
    /// Number runs after `runs_so_far` at least (a standby that took over:
    /// the runs its copy of the chain gained while it stood by).
    pub fn advance_to(&self, runs_so_far: u64) {
        self.runs.fetch_max(runs_so_far, Ordering::SeqCst);
    }

    /// Counters starting after `runs_so_far` (for readable, growing run
    /// numbers; the epoch makes them unique), with the epoch from `seed` when given (a deterministic
    /// simulation: its clock hands out a new seed per engine start, so a
    /// restart still gets a new epoch).
    pub fn seeded(runs_so_far: u64, seed: Option<u64>) -> Ids {
        const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyz23456789";
        let epoch: String = match seed {
            Some(mut x) => (0..6)
                .map(|_| {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ALPHABET[((x >> 33) % ALPHABET.len() as u64) as usize] as char
                })
                .collect(),
            None => (0..6).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect(),
        };
        Ids { epoch, runs: AtomicU64::new(runs_so_far), requests: AtomicU64::new(0) }
    }

    /// `r000042-k7qxm2`.
    pub fn run(&self) -> String {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        format!("r{n:06}-{}", self.epoch)
    }

    /// A request id for calls outside runs: `<what>-<epoch>-<n>`.
    pub fn request(&self, what: &str) -> String {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{what}-{}-{n}", self.epoch)
    }

    /// This start's epoch.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }
}

/// Everything the engine is made of, shared by every task.
pub struct Core {
    config: EngineConfig,
    clock: SharedClock,
    audit: AuditStore,
    /// The fleet subsystem: the nodes, their SSH clients, the maintenance
    /// windows (`fleet/mod.rs::Fleet`).
    fleet: Fleet,
    /// The runbooks subsystem: the set in force, the script engine, the
    /// modes, the reload gate (`runbooks/mod.rs::Runbooks`).
    runbooks: crate::runbooks::Runbooks,
    /// The signals subsystem: trigger brain, plot history, backlog
    /// (`signals/mod.rs::Signals`).
    signals: crate::signals::Signals,
    /// The health subsystem: the model, the repair loop's pacing, XID
    /// history (`health/subsystem.rs::Health`).
    health: crate::health::Health,
    /// The runs subsystem's state: the run table (`runstate/mod.rs::Runs`).
    runs: crate::runstate::Runs,
    handle: tokio::runtime::Handle,
    ids: Ids,
    notifier: Notifier,
    /// Pages not delivered yet (invariant 19), retried by the tick.
    outbox: Mutex<crate::base::outbox::Outbox>,
    counters: Counters,
    /// Whether the engine stops, and the tasks a stop ends.
    lifecycle: crate::base::lifecycle::Lifecycle,
    /// Tokens as last loaded (engine.yaml's `auth`, replaced by a reload)
    /// and their generation (`tokens.rs`).
    tokens: crate::config::tokens::TokenBook,
    /// One chain walk at a time, its report kept while the head stays
    /// (`verify_cache.rs`).
    verify_cache: crate::base::verify_cache::VerifyCache,
}

/// Lease a run's holds get: its timeout and two minutes, so an engine that
/// dies leaves nothing held for long. At most a day.
pub fn hold_lease_secs(timeout_secs: u64) -> u64 {
    timeout_secs.saturating_add(120).min(86_400)
}

/// The `action_result` of a request `sent` to an agent: on a yes, `on_ok`'s
/// outcome and whether it applied, and what is on the device after; a
/// refusal's code and message; a transport error.
pub fn action_result(
    action_id: &str,
    op: &str,
    dry_run: bool,
    sent: &Result<(Reply, f64), SendError>,
    on_ok: (&str, bool),
) -> crate::audit::data::ActionResult {
    use crate::audit::data::ActionResult;
    let base = ActionResult { action_id: action_id.into(), op: op.into(), dry_run, ..Default::default() };
    match sent {
        Ok((r, _)) if r.ok => {
            ActionResult { ok: true, outcome: on_ok.0.into(), applied: on_ok.1, after: r.result.clone(), ..base }
        }
        Ok((r, _)) => ActionResult {
            outcome: "refused".into(),
            code: r.code().map(|c| c.as_str().to_string()),
            error: r.error.as_ref().map(|e| e.message.clone()),
            ..base
        },
        Err(e) => ActionResult {
            outcome: "error".into(),
            code: Some("transport".into()),
            error: Some(e.message.clone()),
            ..base
        },
    }
}

/// Who a change is sent for: the hold's owner (a run's id, or
/// `person:<name>`), the audit's actor, and a person's reason.
#[derive(Debug, Clone, Copy)]
pub struct SentBy<'a> {
    pub owner: &'a str,
    pub actor: &'a str,
    pub reason: Option<&'a str>,
}

/// Why a change did not come back with a reply: `left` when the request
/// may have reached the agent (a broken connection, no reply in time) —
/// it may have been applied — and not when it never left (not the leader,
/// the intent not durable, the store stopped, the lease not sure).
#[derive(Debug, Clone, PartialEq)]
pub struct SendError {
    pub message: String,
    pub left: bool,
}

impl SendError {
    fn not_sent(message: impl Into<String>) -> SendError {
        SendError { message: message.into(), left: false }
    }

    fn left(message: impl Into<String>) -> SendError {
        SendError { message: message.into(), left: true }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl serde::Serialize for SendError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.message)
    }
}

/// How much lease a send needs left: a tenth of the TTL, at least 50 ms —
/// what a request may take to reach its agent.
pub fn send_margin(ttl: std::time::Duration) -> std::time::Duration {
    (ttl / 10).max(std::time::Duration::from_millis(50))
}

pub(crate) use crate::base::locks::lock;

impl Core {
    /// The leader lease, with the PostgreSQL backend.
    pub fn leadership(&self) -> Option<&Arc<crate::ha::Leadership>> {
        self.audit.postgres().map(|p| &p.leadership)
    }

    /// Whether this engine acts now: always with sled; with PostgreSQL,
    /// once it leads and has recovered (a standby connects to no agent).
    pub fn acting(&self) -> bool {
        self.leadership().is_none_or(|l| l.is_ready())
    }
}

impl Core {
    /// The loaded runbooks.
    pub fn runbook_set(&self) -> Arc<RunbookSet> {
        self.runbooks.loaded().get()
    }

    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The nodes a target covers.
    pub fn target_nodes(&self, target: &Target) -> Vec<Arc<Node>> {
        match (&target.node, &target.group) {
            (Some(n), _) => self.fleet.get(n).into_iter().collect(),
            (None, Some((k, v))) => self.fleet.group(k, v),
            _ => Vec::new(),
        }
    }

    /// A reading for a script: latest, or a window aggregate; across the
    /// GPUs of a node, the worst one. Two decimals (readings are kept as
    /// `f32`; scripts get no float noise).
    pub fn reading(&self, q: &Reading) -> Option<f64> {
        let n = self.fleet.get(&q.node)?;
        let gpu_count = n.state().gpu_count();
        let b = self.signals.brain();
        let now = self.now();
        let gpus: Vec<Option<u16>> = match (metrics::metric(q.metric).gpu_scoped, q.gpu) {
            (true, Some(g)) => vec![Some(u16::try_from(g).ok()?)],
            (true, None) => (0..gpu_count).filter_map(|g| u16::try_from(g).ok()).map(Some).collect(),
            (false, _) => vec![None],
        };
        let vals: Vec<f64> = gpus
            .into_iter()
            .filter_map(|g| {
                let key = SeriesKey { node: n.idx, gpu: g, metric: q.metric };
                match q.agg {
                    Agg::Latest => b.store().latest(key).map(|(_, v)| v),
                    agg => b.store().stats(key, now.saturating_sub(q.window_ms.max(1))).map(|s| match agg {
                        Agg::Avg => s.avg,
                        Agg::Max => s.max,
                        Agg::Min => s.min,
                        _ => s.slope_per_sec * 60.0,
                    }),
                }
            })
            .collect();
        vals.into_iter()
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
            .map(|v| (v * 100.0).round() / 100.0)
    }

    /// Append a record about run `s` with a typed payload (and store its
    /// summary with it).
    pub async fn record_run<P: crate::audit::data::Payload>(
        &self,
        kind: RecordKind,
        s: &RunSummary,
        data: &P,
    ) -> Result<AuditRecord, AuditError> {
        self.record_run_as(kind, s, &s.requested_by, data).await
    }

    /// [`Core::record_run`] with `actor` as who acted (a person who
    /// approved, rejected or cancelled the run; the engine stopping).
    pub async fn record_run_as<P: crate::audit::data::Payload>(
        &self,
        kind: RecordKind,
        s: &RunSummary,
        actor: &str,
        data: &P,
    ) -> Result<AuditRecord, AuditError> {
        let rec = NewRecord::typed(kind, actor, data)
            .run(&s.id)
            .node(s.target.node.as_deref())
            .gpu(s.target.gpu)
            .runbook(&s.runbook);
        self.audit.append(rec, Some(s.clone())).await
    }

    /// [`Core::record_run`] without waiting: durable before any later
    /// awaited record (see [`AuditStore::append_ordered`]).
    pub fn record_run_ordered<P: crate::audit::data::Payload>(
        &self,
        kind: RecordKind,
        s: &RunSummary,
        data: &P,
    ) -> Result<(), AuditError> {
        let rec = NewRecord::typed(kind, &s.requested_by, data)
            .run(&s.id)
            .node(s.target.node.as_deref())
            .gpu(s.target.gpu)
            .runbook(&s.runbook);
        self.audit.append_ordered(rec, Some(s.clone()))
    }

    /// A notification or escalation record: the text, and where it goes
    /// (the log at once; webhooks, each confirmed by its own
    /// `notification_delivery` record). A dry run's text goes nowhere.
    pub fn notice_record(
        &self,
        kind: RecordKind,
        text: &str,
        severity: &str,
        dry_run: bool,
        shadow: bool,
    ) -> NewRecord {
        let said = crate::audit::data::Notice { text: text.into(), severity: severity.into(), ..Default::default() };
        self.notice_record_from(kind, said, dry_run, shadow)
    }

    /// [`Core::notice_record`] from what was said (`text`, `severity`, and a
    /// script's `follows` — the open escalation it follows up, kept for a
    /// live notice only — and `size`), with its targets filled in.
    pub fn notice_record_from(
        &self,
        kind: RecordKind,
        said: crate::audit::data::Notice,
        dry_run: bool,
        shadow: bool,
    ) -> NewRecord {
        let names = |targets: Vec<crate::config::WebhookTarget>| targets.into_iter().map(|t| t.name).collect();
        let base = crate::audit::data::Notice { follows: said.follows.filter(|_| !dry_run && !shadow), ..said };
        let notice = if shadow {
            crate::audit::data::Notice {
                dry_run: Some(true),
                shadow: Some(true),
                would_notify: Some(names(self.notifier.targets_for(kind))),
                note: Some("shadow run: nothing is sent".into()),
                ..base
            }
        } else if dry_run {
            crate::audit::data::Notice {
                dry_run: Some(true),
                webhooks: names(self.notifier.dry_run_targets_for(kind)),
                note: Some(
                    "dry run: would have been sent (only to targets with dry_runs: true, marked as a dry run)".into(),
                ),
                ..base
            }
        } else {
            crate::audit::data::Notice {
                delivered_to: vec!["log".into()],
                webhooks: names(self.notifier.targets_for(kind)),
                ..base
            }
        };
        NewRecord::typed(kind, "engine", &notice)
    }

    /// Send a mutating request for run `s` to `node`'s agent, with its intent
    /// audited (durably) before it leaves and its result after. The one path
    /// every change takes.
    pub async fn send_audited(
        &self,
        s: &RunSummary,
        node: &str,
        gpu: Option<u32>,
        req: Request,
    ) -> Result<(Reply, f64), SendError> {
        self.send_audited_by(Some(s), SentBy { owner: &s.id, actor: "engine", reason: None }, node, gpu, req).await
    }

    /// [`Core::send_audited`] for `by.owner` (a run's id, or
    /// `person:<name>` for a person's own control), its intent recorded as
    /// `by.actor`'s, with the person's reason, and under `run` when there
    /// is one.
    pub async fn send_audited_by(
        &self,
        run: Option<&RunSummary>,
        by: SentBy<'_>,
        node: &str,
        gpu: Option<u32>,
        mut req: Request,
    ) -> Result<(Reply, f64), SendError> {
        let Some(n) = self.fleet.get(node) else {
            return Err(SendError::not_sent(format!("{node} is not in the inventory")));
        };
        let SentBy { owner, actor, reason } = by;
        req.owner = Some(owner.to_string());
        // With a leader lease, the request carries its term: an agent that
        // has seen a newer leader refuses it (`stale_leader`).
        if let Some(l) = self.leadership() {
            match l.term() {
                Some(t) => req.term = Some(t),
                None => return Err(SendError::not_sent("this engine is not the leader: it sends nothing")),
            }
        }
        // An agent records a term only from an announce: one this node has
        // not acknowledged goes first (an agent the takeover could not
        // reach, or a new connection). Not heard, the change still goes:
        // its term fences it, and the agent refuses it if a newer leader
        // spoke meanwhile.
        if let Some(t) = req.term.filter(|t| n.announced() < *t) {
            self.announce_to(&n, t).await;
        }
        // (`Node::announce` is the one way a term reaches an agent.)
        let data = crate::audit::data::ActionIntent {
            action_id: req.id.clone(),
            op: req.op.name().into(),
            args: req.op.args(),
            dry_run: req.dry_run,
            lease_secs: req.revert_after_secs,
            owner: run.is_none().then(|| owner.to_string()),
            url: None,
            reason: reason.map(str::to_string),
        };
        let mut intent = NewRecord::typed(RecordKind::ActionIntent, actor, &data).node(Some(node)).gpu(gpu);
        if let Some(s) = run {
            intent = intent.run(&s.id).runbook(&s.runbook);
        }
        // Write ahead: nothing leaves before its intent is durable.
        self.audit
            .append(intent, run.cloned())
            .await
            .map_err(|e| SendError::not_sent(format!("cannot audit the intent: {e}")))?;
        // A store that stopped at a durability failure (this intent may
        // be its last record) stops every send: the engine acts only while
        // it can record what it does.
        if let Some(e) = self.audit.stopped() {
            return Err(SendError::not_sent(format!("not sent: {e}")));
        }
        // Fence at the send: the lease must be surely ours for a margin
        // more, and the request carries the deadline past which the agent
        // refuses it (a leader frozen here, resumed after a takeover).
        if let Some(l) = self.leadership() {
            let left = l.lease_left().unwrap_or_default();
            let margin = send_margin(l.cfg.ttl);
            if left <= margin {
                return Err(SendError::not_sent(format!(
                    "not sent: this engine's lease is sure for {} ms more, under the {} ms margin a send needs — \
                     it may no longer lead",
                    left.as_millis(),
                    margin.as_millis()
                )));
            }
            req.not_after_ms = Some(self.now().saturating_add((left - margin).as_millis() as i64));
        }
        let timeout = std::time::Duration::from_secs(self.config.limits.action_timeout_secs);
        let started = std::time::Instant::now();
        let reply = tokio::time::timeout(timeout, n.transport.call(req)).await;
        let secs = started.elapsed().as_secs_f64();
        match reply {
            Ok(Ok(r)) => Ok((r, secs)),
            Ok(Err(e)) => Err(SendError::left(e.to_string())),
            Err(_) => Err(SendError::left(format!("no reply from {node} within {} s", timeout.as_secs()))),
        }
    }

    /// Release run `s`'s holds (not the kept ones) on `node`, audited.
    pub async fn release_run_holds(&self, s: &RunSummary, node: &str) -> Result<Value, String> {
        let req = Request::new(
            self.next_action_id(&s.id),
            Op::Release(ReleaseArgs { owner: Some(s.id.clone()), ..Default::default() }),
        );
        let action_id = req.id.clone();
        let result = self.send_audited(s, node, None, req).await;
        let released = matches!(&result, Ok((r, _)) if r.release().is_some_and(|x| !x.released.is_empty()));
        let data = action_result(
            &action_id,
            "release",
            false,
            &result,
            (if released { "released" } else { "unchanged" }, released),
        );
        let rec =
            NewRecord::typed(RecordKind::ActionResult, "engine", &data).run(&s.id).node(Some(node)).runbook(&s.runbook);
        if let Err(e) = self.audit.append(rec, Some(s.clone())).await {
            tracing::error!(run = %s.id, error = %e, "cannot audit a release");
        }
        match result {
            Ok((r, _)) if r.ok => Ok(r.result.unwrap_or(Value::Null)),
            Ok((r, _)) => Err(r.error.map(|e| e.message).unwrap_or_default()),
            Err(e) => Err(e.message),
        }
    }

    /// Keep run `s`'s holds on `node` past its end, for `lease_secs`,
    /// audited: a resumed run that could not decide leaves its mitigation
    /// in force for a person (invariant 18).
    pub async fn keep_run_holds(&self, s: &RunSummary, node: &str, lease_secs: u64) -> Result<(), String> {
        let req = Request::new(
            self.next_action_id(&s.id),
            Op::Renew(nightshift_proto::RenewArgs { hold: None, owner: Some(s.id.clone()), lease_secs, keep: true }),
        );
        let action_id = req.id.clone();
        let result = self.send_audited(s, node, None, req).await;
        let data = action_result(&action_id, "renew", false, &result, ("kept", false));
        let rec =
            NewRecord::typed(RecordKind::ActionResult, "engine", &data).run(&s.id).node(Some(node)).runbook(&s.runbook);
        if let Err(e) = self.audit.append(rec, Some(s.clone())).await {
            tracing::error!(run = %s.id, error = %e, "cannot audit a kept hold");
        }
        match result {
            Ok((r, _)) if r.ok => Ok(()),
            Ok((r, _)) => Err(r.error.map(|e| e.message).unwrap_or_default()),
            Err(e) => Err(e.message),
        }
    }

    /// Whether the trigger's condition still holds for the run's target:
    /// `Some((holds, how))`, or `None` when it cannot be told (edges,
    /// predictions, manual and scheduled runs). An alert-started run of a
    /// runbook with its own telemetry trigger holds only while the alert
    /// fires *and* the agents' readings meet that trigger (issue 42 point 6).
    pub fn condition_holds(&self, m: &crate::runbooks::manifest::Manifest, s: &RunSummary) -> Option<(bool, String)> {
        if let Trigger::Fault { .. } = m.trigger {
            let (node, gpu) = (s.target.node.as_deref()?, s.target.gpu?);
            let state = self.health.model().state(node, gpu);
            return Some((
                state == crate::health::HealthState::Faulted,
                format!("{node} GPU {gpu} is {}", state.as_str()),
            ));
        }
        if matches!(m.trigger, Trigger::Alert { .. }) || s.trigger == "alert" {
            s.event.get("fingerprint").and_then(Value::as_str)?;
            if self.runs.table().episode_resolved(&s.event) {
                return Some((false, "the alert resolved".into()));
            }
            // An alert is someone else's reading (a Prometheus rule, maybe
            // one threshold for every vendor): where the runbook has its own
            // condition on the agents' telemetry, that decides too.
            if let Some((false, why)) = self.own_condition(m, s) {
                return Some((false, format!("the alert is firing, but the agent's reading does not show it: {why}")));
            }
            return Some((true, "the alert is firing".into()));
        }
        self.own_condition(m, s)
    }

    /// The runbook's own telemetry trigger, evaluated on the run's target
    /// now (`None`: it has none, or there is no reading).
    fn own_condition(&self, m: &crate::runbooks::manifest::Manifest, s: &RunSummary) -> Option<(bool, String)> {
        if let Trigger::Alert { confirm: Some(c), .. } = &m.trigger {
            return self.confirmed(c, s);
        }
        // The compiled triggers are indexed by the loaded set's order.
        let idx = self.runbook_set().get(&m.name)?.0;
        let now = self.now();
        let b = self.signals.brain();
        match (&s.target.node, &s.target.group) {
            (Some(node), _) => {
                let n = self.fleet.get(node)?;
                let gpu = s.target.gpu.and_then(|g| u16::try_from(g).ok());
                b.triggers().still_true(b.store(), idx, &[(n.idx, gpu)], now)
            }
            (None, Some((label, value))) => {
                let nodes: Vec<(u32, Option<u16>)> = self
                    .fleet
                    .group(label, value)
                    .iter()
                    .filter(|n| {
                        let st = n.state();
                        st.connected && !st.drained
                    })
                    .flat_map(|n| {
                        let count = n.state().gpu_count().max(1);
                        (0..count).filter_map(|g| u16::try_from(g).ok()).map(move |g| (n.idx, Some(g)))
                    })
                    .collect();
                b.triggers().still_true(b.store(), idx, &nodes, now)
            }
            _ => None,
        }
    }

    /// An alert trigger's `confirm:` on the target's latest reading (a node
    /// target of a GPU metric: any GPU); `None` without a reading.
    fn confirmed(&self, c: &crate::runbooks::manifest::Confirm, s: &RunSummary) -> Option<(bool, String)> {
        let id = crate::base::metrics::metric_id(&c.metric)?;
        let n = self.fleet.get(s.target.node.as_deref()?)?;
        let b = self.signals.brain();
        let read =
            |gpu: Option<u16>| b.store().latest(crate::signals::telemetry::SeriesKey { node: n.idx, gpu, metric: id });
        let vals: Vec<f64> = if !crate::base::metrics::metric(id).gpu_scoped {
            read(None).map(|(_, v)| v).into_iter().collect()
        } else if let Some(g) = s.target.gpu.and_then(|g| u16::try_from(g).ok()) {
            read(Some(g)).map(|(_, v)| v).into_iter().collect()
        } else {
            (0..n.state().gpu_count().max(1))
                .filter_map(|g| u16::try_from(g).ok())
                .filter_map(|g| read(Some(g)).map(|(_, v)| v))
                .collect()
        };
        let hit = vals.iter().find(|v| c.holds(**v)).or(vals.first())?;
        let want = match (c.below, c.above) {
            (Some(x), _) => format!("below {x}"),
            (_, Some(x)) => format!("above {x}"),
            _ => String::new(),
        };
        Some((c.holds(*hit), format!("{} is {hit} (confirm: {want})", c.metric)))
    }

    /// The next request id of run `run`: `<run>-a<n>`, never repeated (run
    /// ids are unique forever, and `n` counts up within the run).
    pub fn next_action_id(&self, run: &str) -> String {
        let mut t = self.runs.table();
        let n = t.run_mut(run).map(|r| {
            r.next_action += 1;
            (r.resumed, r.next_action)
        });
        match n {
            Some((0, n)) => format!("{run}-a{n}"),
            // A resumed run: ids no earlier engine of this run can have used.
            Some((k, n)) => format!("{run}-r{k}-a{n}"),
            // A run no longer in the table (recovery): a fresh request id.
            None => self.ids.request(&format!("{run}-x")),
        }
    }

    /// What became of request `action_id` on `node`, by the agent's own
    /// journal (`action_status`, read-only): the reply it sent, when it
    /// answered one that was lost on the way back. `Err` with the status
    /// when there is no reply to take (unknown, indeterminate, unreachable).
    pub async fn lost_reply(&self, node: &str, action_id: &str) -> Result<Reply, Value> {
        let Some(n) = self.fleet.get(node) else { return Err(json!({"state": "unknown node"})) };
        let req = Request::new(
            format!("{action_id}-status"),
            Op::ActionStatus(nightshift_proto::ActionStatusArgs { request_id: action_id.to_string() }),
        );
        let timeout = std::time::Duration::from_secs(self.config.limits.action_timeout_secs);
        let status = match tokio::time::timeout(timeout, n.transport.call(req)).await {
            Ok(Ok(r)) => r.result.unwrap_or(Value::Null),
            Ok(Err(e)) => json!({"state": "unreachable", "error": e.to_string()}),
            Err(_) => json!({"state": "unreachable", "error": format!("no answer within {} s", timeout.as_secs())}),
        };
        match (status["state"].as_str(), serde_json::from_value::<Reply>(status["reply"].clone())) {
            (Some("done"), Ok(reply)) => Ok(reply),
            _ => Err(status),
        }
    }

    /// A new leader tells every agent its term (a read with the term, at
    /// most 2 s each, all at once) before it acts; the number that heard.
    pub async fn announce_term(&self) -> usize {
        let Some(term) = self.leadership().and_then(|l| l.term()) else { return 0 };
        let nodes = self.fleet.nodes();
        let calls = nodes.iter().map(|n| self.announce_to(n, term));
        futures::future::join_all(calls).await.into_iter().filter(|ok| *ok).count()
    }

    /// Announce `term` to one node's agent (the read of the holds with the
    /// term: the only request an agent records a term from), at most 2 s;
    /// whether it acknowledged. Remembered on the node, so a change is
    /// preceded by one announce per term, not by one each.
    pub async fn announce_to(&self, n: &crate::fleet::Node, term: u64) -> bool {
        n.announce(self.ids.request("term"), term).await
    }

    /// A node's holds as its agent has them now (`holds`, read-only); the
    /// last telemetry's when the agent does not answer.
    pub async fn current_holds(&self, node: &str) -> Vec<nightshift_proto::HoldInfo> {
        let Some(n) = self.fleet.get(node) else { return Vec::new() };
        let req = Request::new(self.ids.request("holds"), Op::Holds(nightshift_proto::NoArgs {}));
        match n.transport.call(req).await {
            Ok(r) if r.ok => r
                .result
                .and_then(|v| serde_json::from_value::<Vec<nightshift_proto::SettingView>>(v).ok())
                .map(|views| views.into_iter().flat_map(|v| v.holds).collect())
                .unwrap_or_else(|| n.state().holds.clone()),
            _ => n.state().holds.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_never_repeat_across_starts() {
        let a = Ids::seeded(41, None);
        let b = Ids::seeded(41, None);
        let (ra, rb) = (a.run(), b.run());
        assert!(ra.starts_with("r000042-"), "{ra}");
        assert_ne!(ra, rb, "two starts from the same store (a restored backup) still differ");
        assert_ne!(a.request("cli"), a.request("cli"));
        assert_eq!(a.epoch().len(), 6);
    }
}
