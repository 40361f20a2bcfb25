//! The engine's side of the repair lifecycle (`health/mod.rs` is the model):
//!
//! - on every reading of a node, each GPU's evidence is compared with what
//!   its last verified repair acknowledged — a new fault is recorded at
//!   once (`health_changed`, durable), then handed to the fault runbook
//!   that takes its kind (a `fault` trigger); a fault that admission
//!   suppresses (breaker, cooldown, full queue) stays pending and is tried
//!   again, and a person is told the node by name the moment it is;
//! - a GPU awaiting repair moves to `verifying` when the evidence of its
//!   fault is gone (it answers again, a reset cleared its counters) or a
//!   person says it was repaired;
//! - on the engine's tick a verifying GPU gets the agent's `health_check`:
//!   passing, it is healthy again (the counters it shows are acknowledged)
//!   and, once every GPU of the node is, the run that quarantined it
//!   releases its repair drain (the agent checks again before it lets the
//!   drain go); failing, it waits for repair again and a person is told
//!   what failed.
//!
//! Memory here is only pacing (when a pending fault was last tried, who was
//! told); every state is on the chain.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use nightshift_proto::{HealthCheck, HealthCheckArgs, Op, ReleaseArgs, Request};

use crate::audit::{NewRecord, RecordKind};
use crate::base::metrics::{MetricId, ids};
use crate::engine::{Engine, RunRequest, Submitted};
use crate::fleet::Node;
use crate::health::{Ack, Evidence, FaultKind, HealthState, Transition, repair_evidence};
use crate::runbooks::manifest::Trigger;
use crate::runs::{RunSummary, Target};
use crate::signals::telemetry::SeriesKey;

/// How often a pending fault is offered to admission again.
const RETRY_PENDING_MS: i64 = 10_000;
/// How long a fault waits to be offered again after a run took it and it
/// is still faulted (the run could not drain: a blast radius, a refusal).
const RETRY_AFTER_RUN_MS: i64 = 900_000;
/// How often a verifying GPU's health check is run again after a failure
/// to reach the agent.
const RECHECK_MS: i64 = 30_000;

impl Engine {
    /// The evidence the telemetry store holds for a GPU (`None` when it has
    /// no reading at all).
    pub(crate) fn evidence(&self, node: &Node, gpu: u32) -> Option<Evidence> {
        evidence_in(self.core.signals().brain().store(), node, gpu)
    }

    /// Record a transition (durably) and take it into the model.
    pub(crate) async fn record_health(&self, t: &Transition, actor: &str) -> Result<(), String> {
        let rec = t.record(actor);
        let r = self.core.audit().append(rec, None).await.map_err(|e| format!("cannot audit a health change: {e}"))?;
        self.core.health().replay([&r]);
        tracing::info!(
            node = %t.node, gpu = t.gpu, from = t.from.as_str(), to = t.to.as_str(), by = %t.by, why = %t.why,
            "health changed"
        );
        // Repaired (evidence of a repair, or a person says so): the GPU's
        // pages end.
        if matches!(t.to, HealthState::Healthy | HealthState::Verifying) {
            let why = format!("GPU {} {} ({})", t.gpu, t.to.as_str(), t.why);
            Box::pin(self.resolve_pages(&t.node, Some(t.gpu), &why, None)).await;
        }
        Ok(())
    }

    /// Look at every GPU of `node` after a reading: new faults, pending
    /// faults, repair evidence.
    pub(crate) async fn evaluate_health(&self, node: &Arc<Node>) {
        if !self.core.acting() {
            return;
        }
        let gpus = node.state().gpu_count() as u32;
        let now = self.core.now();
        // One reading's evidence for every GPU, under one look at the store;
        // what it shows, under one look at the health model (a GPU's fault
        // is its own: another's transition below does not change it).
        let name = node.spec.name.as_str();
        let evidence: Vec<(u32, Evidence)> = {
            let b = self.core.signals().brain();
            (0..gpus).filter_map(|gpu| evidence_in(b.store(), node, gpu).map(|ev| (gpu, ev))).collect()
        };
        let generation = self.core.health().policy_generation();
        let (observed, on_record) = {
            let m = self.core.health().model();
            let observed: Vec<_> =
                evidence.into_iter().map(|(gpu, ev)| (gpu, ev, m.observe(name, gpu, &ev, now))).collect();
            (observed, m.node_gpus(name).next().is_some())
        };
        self.core.counters().add(crate::base::counters::Count::HealthEvaluations, observed.len() as u64);
        // Nothing new on a node with no record: the same evidence under the
        // same policy finds nothing again (`take_samples` skips it).
        let quiet = !on_record && observed.iter().all(|(_, _, new)| new.is_none());
        node.state().evidence_judged = quiet.then_some((generation, gpus));
        for (gpu, ev, new) in observed {
            // Healthy, never faulted, nothing new: nothing more to look at.
            if new.is_none() && !on_record {
                continue;
            }
            if let Some(t) = new {
                if let Err(e) = self.record_health(&t, "engine").await {
                    tracing::error!(node = name, gpu, error = %e, "a fault could not be recorded");
                    continue;
                }
                self.core.counters().add(crate::base::counters::Count::FaultsSeen, 1);
            }
            let h = self.core.health().model().get(name, gpu).cloned();
            let Some(h) = h else { continue };
            match h.state {
                // Repaired before anything acted (a person rebooted the rack
                // after a storm the breaker held): the health check decides.
                HealthState::Faulted if h.fault.as_ref().and_then(|f| repair_evidence(f, &ev)).is_none() => {
                    self.offer_fault(node, gpu, now).await
                }
                HealthState::Faulted | HealthState::AwaitingRepair => {
                    // A repair the health check refuted: the same evidence
                    // is checked again only every so often.
                    let refuted = h.refuted_evidence == Some(ev)
                        && h.refuted_ms.is_some_and(|t| now.saturating_sub(t) < crate::health::REFUTED_RECHECK_MS);
                    if !refuted
                        && let Some(f) = &h.fault
                        && let Some(why) = repair_evidence(f, &ev)
                    {
                        let t = Transition {
                            node: name.to_string(),
                            gpu,
                            from: h.state,
                            to: HealthState::Verifying,
                            by: "engine".into(),
                            why,
                            ..Transition::default()
                        };
                        if let Err(e) = self.record_health(&t, "engine").await {
                            tracing::error!(node = name, gpu, error = %e, "cannot record repair evidence");
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// A faulted GPU with no run acting on it: offer its fault to the
    /// runbook that takes it (paced; admission decides).
    async fn offer_fault(&self, node: &Arc<Node>, gpu: u32, now: i64) {
        let name = node.spec.name.clone();
        if !self.core.health().repair().offer_due(&name, gpu, now, RETRY_AFTER_RUN_MS, RETRY_PENDING_MS) {
            return;
        }
        let Some(h) = self.core.health().model().get(&name, gpu).cloned() else { return };
        let Some(fault) = h.fault.clone() else { return };
        let set = self.runbook_set();
        let rb = set.runbooks.iter().find(|rb| {
            matches!(&rb.manifest.trigger, Trigger::Fault { kinds } if kinds.iter().any(|k| k == fault.kind.as_str()))
                && self.selector_matches(rb, node)
        });
        let target = Target::gpu(&name, gpu);
        let Some(rb) = rb else {
            // An alert-started runbook may be handling it (it sets the run);
            // say nothing takes it only once it has waited five minutes.
            if h.run.is_some() || now.saturating_sub(fault.seen_ms) < 300_000 {
                return;
            }
            self.tell_once(
                &name,
                gpu,
                fault.seen_ms,
                None,
                format!(
                    "{name} GPU {gpu}: {} — and no runbook takes `{}` faults (a `fault` trigger): nothing will act on it; a person must drain {name} and repair it",
                    fault.detail,
                    fault.kind.as_str()
                ),
            )
            .await;
            return;
        };
        // A run already on this GPU's fault (queued, waiting, running).
        if self.core.runs().has_active(&(rb.manifest.name.clone(), target.clone())) {
            return;
        }
        // A node under maintenance (the hands-off marker): nothing acts, and
        // a refused run would start a cooldown that outlasts the marker. The
        // fault stays pending, a person is told once, and it is offered the
        // moment the marker goes.
        let hands_off = node.state().hands_off_words(&name);
        if let Some(words) = hands_off {
            self.tell_once(
                &name,
                gpu,
                fault.seen_ms,
                Some(&rb.manifest.name),
                format!(
                    "{name} GPU {gpu}: {} is pending — {words}: {} acts when it ends; look at {name} now",
                    fault.detail, rb.manifest.name
                ),
            )
            .await;
            return;
        }
        // A runbook in shadow answers a fault once: its dry run changes
        // nothing, so the fault stays pending, and offering it again every
        // cooldown would report one fault as many.
        // (The runbook in shadow, or the whole fleet.)
        let shadow = self.runbook_mode(&rb.manifest.name) == crate::runbooks::manifest::Mode::Shadow
            || self.fleet_mode().0 == crate::runbooks::modes::FleetMode::Shadow;
        let shadow_key = shadow.then(|| (name.clone(), gpu, fault.seen_ms, rb.manifest.name.clone()));
        if let Some(k) = &shadow_key
            && self.core.health().repair().shadow_answered(k)
        {
            return;
        }
        self.core.counters().offered(&rb.manifest.name);
        let req = RunRequest {
            runbook: rb.manifest.name.clone(),
            target: target.clone(),
            trigger: "fault".into(),
            detail: format!("{name} GPU {gpu}: {}", fault.detail),
            event: json!({
                "kind": "fault",
                "fault": fault.kind.as_str(),
                "xid": fault.xid,
                "detail": fault.detail,
                "evidence": fault.evidence,
                "node": name,
                "gpu": gpu,
                "seen_ms": fault.seen_ms,
            }),
            // A fault is a state: it is current whenever it is offered.
            event_ts_ms: now,
            params: BTreeMap::new(),
            dry_run: false,
            requested_by: "engine".into(),
        };
        match self.submit_inner(req, None).await {
            Ok(Submitted::Suppressed { reason, .. }) | Ok(Submitted::Dropped { reason }) => {
                self.tell_once(
                    &name,
                    gpu,
                    fault.seen_ms,
                    Some(&rb.manifest.name),
                    format!(
                        "{name} GPU {gpu}: {} is pending — {}: {} does not act until that ends, and it will then; look at {name} now",
                        fault.detail, reason, rb.manifest.name
                    ),
                )
                .await;
            }
            Ok(_) => {
                self.core.health().repair().ran(&name, gpu, now, shadow_key);
            }
            Err(e) => tracing::error!(node = %name, gpu, error = %e, "cannot submit a fault run"),
        }
    }

    /// A person put `node` back in service (the scheduler's resume) while
    /// a GPU of it still waits for its repair: the node serves again — their
    /// call — and the broken GPU stays out (its own drain has no lease).
    /// Told once per fault, with the fault.
    pub(crate) async fn resumed_before_repair(&self, node: &Arc<Node>) {
        if !self.core.acting() {
            return;
        }
        let name = node.spec.name.clone();
        let broken: Vec<(u32, crate::health::GpuHealth)> = (0..node.state().gpu_count() as u32)
            .filter_map(|g| self.core.health().model().get(&name, g).cloned().map(|h| (g, h)))
            .filter(|(_, h)| matches!(h.state, HealthState::Faulted | HealthState::AwaitingRepair | HealthState::Rma))
            .collect();
        for (gpu, h) in broken {
            let Some(f) = &h.fault else { continue };
            let fresh = self.core.health().repair().first_resume_telling(&name, gpu, f.seen_ms);
            if !fresh {
                continue;
            }
            let text = format!(
                "{name} was put back in service by hand while GPU {} is {} ({}): the node takes work again, GPU {} stays out (its own drain ends only with its repair); after the repair: nightshift nodes repaired {name} --gpu {}",
                gpu,
                h.state.as_str().replace('_', " "),
                f.detail,
                gpu,
                gpu
            );
            tracing::warn!(node = %name, gpu, "resumed by hand before the repair");
            let rec = self
                .core
                .notice_record(RecordKind::Escalation, &text, "escalation", false, false)
                .node(Some(&name))
                .gpu(Some(gpu));
            match self.core.audit().append(rec, None).await {
                Ok(r) => crate::core::Core::deliver(&self.core, &r),
                Err(e) => tracing::error!(node = %name, error = %e, "cannot audit a resume before a repair"),
            }
        }
    }

    /// Escalate once per fault: the text names the node.
    async fn tell_once(&self, node: &str, gpu: u32, seen_ms: i64, runbook: Option<&str>, text: String) {
        let fresh = self.core.health().repair().first_telling(node, gpu, seen_ms);
        if !fresh {
            return;
        }
        tracing::warn!(node, gpu, text = %text, "fault pending");
        let mut rec = self
            .core
            .notice_record(RecordKind::Escalation, &text, "escalation", false, false)
            .node(Some(node))
            .gpu(Some(gpu));
        if let Some(rb) = runbook {
            rec = rec.runbook(rb);
        }
        match self.core.audit().append(rec, None).await {
            Ok(r) => crate::core::Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(node, error = %e, "cannot audit a pending fault"),
        }
    }

    /// The tick's part: health checks for verifying GPUs.
    pub(crate) async fn health_tick(&self, now: i64) {
        if !self.core.acting() {
            return;
        }
        let verifying = self.core.health().model().in_state(HealthState::Verifying);
        let mut by_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (node, gpu) in verifying {
            let due = self.core.health().repair().check_due(&node, gpu, now, RECHECK_MS);
            if due {
                by_node.entry(node).or_default().push(gpu);
            }
        }
        for (node, gpus) in by_node {
            self.verify_node(&node, &gpus, now).await;
        }
    }

    /// Run the agent's health check and move each verifying GPU on.
    async fn verify_node(&self, node: &str, gpus: &[u32], now: i64) {
        self.core.health().repair().checked(node, gpus, now);
        let Some(n) = self.core.fleet().get(node) else { return };
        let check = match self.health_check_call(&n).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(node, error = %e, "health check not answered; trying again");
                return;
            }
        };
        for gpu in gpus {
            let Some(h) = self.core.health().model().get(node, *gpu).cloned() else { continue };
            let gc = check.gpus.iter().find(|g| g.index == *gpu);
            let mut failures: Vec<String> =
                gc.map(|g| g.failures.clone()).unwrap_or_else(|| vec!["not in the check".into()]);
            failures.extend(check.node_failures.iter().cloned());
            let passed = failures.is_empty();
            let ev = self.evidence(&n, *gpu).unwrap_or_default();
            let t = Transition {
                node: node.to_string(),
                gpu: *gpu,
                from: h.state,
                to: if passed { HealthState::Healthy } else { HealthState::AwaitingRepair },
                by: "engine".into(),
                why: if passed {
                    format!("health check passed ({})", gc.map(|g| g.checked.join(", ")).unwrap_or_default())
                } else {
                    format!("health check failed: {}", failures.join("; "))
                },
                ack: passed.then(|| Ack::from(&ev)),
                check_failures: failures.clone(),
                evidence: (!passed).then_some(ev),
                ..Transition::default()
            };
            if let Err(e) = self.record_health(&t, "engine").await {
                tracing::error!(node, gpu, error = %e, "cannot record a health check");
                continue;
            }
            // Told when the check refutes a repair, and again only when what
            // fails changes (it is re-checked every ten minutes).
            if !passed && failures != h.refuted_failures {
                let text = format!(
                    "{node} GPU {gpu} failed its health check after the repair: {}. It stays out of service{}; the vendor's evidence is being collected on the node (nightshift agents evidence {node})",
                    failures.join("; "),
                    h.instruction.as_deref().map(|i| format!("; {i}")).unwrap_or_default()
                );
                // What the vendor asks for with a return, beside the check
                // that refuted the repair (in the background: a bug report
                // takes minutes, the other checks do not wait for it).
                let (e, n, g, why, run) = (
                    self.clone(),
                    node.to_string(),
                    *gpu,
                    format!("health check failed: {}", failures.join("; ")),
                    h.run.clone(),
                );
                tokio::spawn(async move {
                    let _ = e.collect_evidence(&n, Some(g), &why, run.as_deref(), "engine").await;
                });
                let rec = self
                    .core
                    .notice_record(RecordKind::Notification, &text, "warning", false, false)
                    .node(Some(node))
                    .gpu(Some(*gpu));
                if let Ok(r) = self.core.audit().append(rec, None).await {
                    crate::core::Core::deliver(&self.core, &r);
                }
            }
        }
        self.return_to_service(node).await;
    }

    /// The agent's health check (read-only; not a change, so not an action).
    pub(crate) async fn health_check_call(&self, n: &Node) -> Result<HealthCheck, String> {
        let req = Request::new(self.core.ids().request("health"), Op::HealthCheck(HealthCheckArgs { gpu: None }));
        match n.transport.call(req).await {
            Ok(r) if r.ok => serde_json::from_value(r.result.unwrap_or(Value::Null))
                .map_err(|e| format!("the agent's health check does not read: {e}")),
            Ok(r) => Err(r.error.map(|e| e.message).unwrap_or_default()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Once every GPU of a node is healthy, the runs that quarantined it
    /// release what they hold there (the repair drain with them; the agent
    /// checks health again before it lets the drain go).
    async fn return_to_service(&self, node: &str) {
        if self.core.health().model().node_state(node) != HealthState::Healthy {
            return;
        }
        let Some(n) = self.core.fleet().get(node) else { return };
        let holds = self.core.current_holds(node).await;
        // Runs whose holds on this node were placed for a fault: the repair
        // drain is sticky with `repair`.
        let owners: BTreeSet<String> = holds.iter().filter(|h| h.repair).map(|h| h.owner.clone()).collect();
        for owner in owners {
            let Ok(Some(summary)) = self.core.audit().run(&owner) else { continue };
            self.release_fault_holds(&summary, &n, &holds).await;
        }
    }

    async fn release_fault_holds(&self, s: &RunSummary, n: &Node, holds: &[nightshift_proto::HoldInfo]) {
        let node = n.spec.name.as_str();
        let mut ids: Vec<String> =
            holds.iter().filter(|h| h.owner == s.id && h.sticky()).map(|h| h.id.clone()).collect();
        ids.sort();
        let mut reqs: Vec<Request> = ids
            .into_iter()
            .map(|id| {
                Request::new(
                    self.core.ids().request(&format!("{}-repaired", s.id)),
                    Op::Release(ReleaseArgs { hold: Some(id), owner: None, include_kept: false }),
                )
            })
            .collect();
        reqs.push(Request::new(
            self.core.ids().request(&format!("{}-repaired", s.id)),
            Op::Release(ReleaseArgs { hold: None, owner: Some(s.id.clone()), include_kept: true }),
        ));
        for req in reqs {
            let action_id = req.id.clone();
            let sent = self.core.send_audited(s, node, None, req).await;
            let mut data = crate::core::action_result(&action_id, "release", false, &sent, ("released", true));
            if data.ok {
                data.why = Some("repaired: the health check passed".into());
            }
            let ok = data.ok;
            let rec = NewRecord::typed(RecordKind::ActionResult, "engine", &data)
                .run(&s.id)
                .node(Some(node))
                .runbook(&s.runbook);
            if let Err(e) = self.core.audit().append(rec, None).await {
                tracing::error!(run = %s.id, error = %e, "cannot audit a repair release");
            }
            if !ok {
                tracing::warn!(node, run = %s.id, "a repaired node's hold was not released: it stays out of service");
            }
        }
    }

    /// [`Engine::mark_repaired`]'s work (the façade, `engine.rs`, forwards here).
    pub(crate) async fn record_repaired(
        &self,
        node: &str,
        gpu: Option<u32>,
        who: &str,
        note: &str,
    ) -> Result<Vec<u32>, String> {
        let n = self.core.fleet().get(node).ok_or_else(|| format!("{node} is not in the inventory"))?;
        let candidates: Vec<(u32, HealthState)> = self
            .core
            .health()
            .model()
            .node_gpus(node)
            .filter(|(g, h)| {
                gpu.is_none_or(|x| x == *g)
                    && matches!(
                        h.state,
                        HealthState::Faulted
                            | HealthState::AwaitingRepair
                            | HealthState::Quarantined
                            | HealthState::Rma
                    )
            })
            .map(|(g, h)| (g, h.state))
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "{node}{} has nothing awaiting repair: see `nightshift agents show {node}`",
                gpu.map(|g| format!(" GPU {g}")).unwrap_or_default()
            ));
        }
        let mut out = Vec::new();
        for (g, from) in candidates {
            let t = Transition {
                node: node.to_string(),
                gpu: g,
                from,
                to: HealthState::Verifying,
                by: who.to_string(),
                why: if note.is_empty() { format!("{who} says it was repaired") } else { format!("{who}: {note}") },
                ..Transition::default()
            };
            self.record_health(&t, who).await?;
            out.push(g);
        }
        drop(n);
        Ok(out)
    }

    /// A node's health as people read it: every GPU of its inventory (one
    /// no fault touched is healthy), state, fault, what a person should do,
    /// the lifecycle's timestamps and past lifecycles. `None`: not in the
    /// inventory.
    pub(crate) fn node_health(&self, node: &str) -> Option<NodeHealth> {
        let n = self.core.fleet().get(node)?;
        let model = self.health_model();
        let now = self.core.now();
        // Every GPU of the inventory, and any the model knows beyond it (a
        // standby, or an engine that has not read the inventory yet).
        let known = model.node_gpus(node).map(|(g, _)| g + 1).max().unwrap_or(0);
        let count = (n.state().gpu_count() as u32).max(known);
        let mut gpus: BTreeMap<u32, GpuHealthView> =
            (0..count).map(|g| (g, GpuHealthView::of(g, &crate::health::GpuHealth::default(), now))).collect();
        for (g, h) in model.node_gpus(node) {
            gpus.insert(g, GpuHealthView::of(g, h, now));
        }
        Some(NodeHealth { node: node.to_string(), state: model.node_state(node), gpus: gpus.into_values().collect() })
    }

    /// Run the agent's health check on `node` by hand (read-only).
    pub(crate) async fn health_check_node(&self, node: &str) -> Result<HealthCheck, String> {
        let n = self.core.fleet().get(node).ok_or_else(|| format!("{node} is not in the inventory"))?;
        self.health_check_call(&n).await
    }

    /// Rebuild the health model and the node marks from the chain (start,
    /// takeover, restore).
    pub(crate) fn rebuild_health(&self) -> Result<usize, crate::audit::AuditError> {
        let records = self.core.audit().records_of_kind(RecordKind::HealthChanged)?;
        self.core.health().replay(&records);
        let marks = self.core.audit().records_of_kind(RecordKind::NodeAnnotated)?;
        for r in &marks {
            let p = match r.payload::<crate::audit::data::NodeAnnotated>() {
                Ok(p) if p.dry_run != Some(true) && !p.key.is_empty() => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "a node mark cannot be read: it is skipped");
                    continue;
                }
            };
            let Some(n) = r.node.as_deref().and_then(|node| self.core.fleet().get(node)) else { continue };
            let mut st = n.state();
            match p.value {
                Some(v) => st.annotations.insert(p.key, v),
                None => st.annotations.remove(&p.key),
            };
        }
        // An admin's hands-off outlives a restart (and moves to the next
        // leader): each node's newest `hands_off` record.
        let hands_off = self.core.audit().records_of_kind(RecordKind::HandsOff)?;
        for r in &hands_off {
            let (Some(n), Ok(p)) = (
                r.node.as_deref().and_then(|node| self.core.fleet().get(node)),
                r.payload::<crate::audit::data::HandsOff>(),
            ) else {
                continue;
            };
            let mut st = n.state();
            st.engine_hands_off = p.hands_off.then(|| (r.actor.clone(), p.reason.unwrap_or_default()));
            st.engine_hands_off_until_ms = p.until_ms.filter(|_| p.hands_off);
        }
        Ok(records.len() + marks.len() + hands_off.len())
    }
}

/// A node's health as people read it (`GET /api/v1/nodes/{name}/health`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeHealth {
    pub node: String,
    /// The node's state: its worst GPU's.
    pub state: HealthState,
    pub gpus: Vec<GpuHealthView>,
}

impl NodeHealth {
    /// The GPUs not healthy.
    pub fn unhealthy(&self) -> impl Iterator<Item = &GpuHealthView> {
        self.gpus.iter().filter(|g| g.state != HealthState::Healthy)
    }
}

/// One GPU's health: state, fault, what a person should do, its lifecycle
/// and the lifecycles before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuHealthView {
    pub gpu: u32,
    pub state: HealthState,
    pub since_ms: i64,
    pub why: String,
    pub fault: Option<crate::health::Fault>,
    /// The run that acted on the fault.
    pub run: Option<String>,
    /// What a person should do, in words.
    pub instruction: Option<String>,
    pub check_failures: Vec<String>,
    pub lifecycle: Option<LifecycleView>,
    pub repairs_in_window: usize,
    /// Finished lifecycles, oldest first.
    pub history: Vec<PastLifecycle>,
    /// Seconds in this state.
    pub age_secs: Option<i64>,
}

impl GpuHealthView {
    fn of(gpu: u32, h: &crate::health::GpuHealth, now: i64) -> GpuHealthView {
        GpuHealthView {
            gpu,
            state: h.state,
            since_ms: h.since_ms,
            why: h.why.clone(),
            fault: h.fault.clone(),
            run: h.run.clone(),
            instruction: h.instruction.clone(),
            check_failures: h.check_failures.clone(),
            lifecycle: h.lifecycle.map(|l| LifecycleView { timestamps: l, phases: l.phases() }),
            repairs_in_window: h.repairs.len(),
            history: h
                .history
                .iter()
                .map(|(k, l)| PastLifecycle { kind: *k, lifecycle: *l, phases: l.phases() })
                .collect(),
            age_secs: (h.since_ms > 0).then(|| (now - h.since_ms).max(0) / 1000),
        }
    }
}

/// A lifecycle under way: its timestamps and the seconds to each phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LifecycleView {
    pub timestamps: crate::health::Lifecycle,
    pub phases: crate::health::Phases,
}

/// A finished lifecycle: the fault's kind, its timestamps and phases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PastLifecycle {
    pub kind: FaultKind,
    pub lifecycle: crate::health::Lifecycle,
    pub phases: crate::health::Phases,
}

/// Every metric [`evidence_in`] reads — it reads them through this list
/// alone — so a batch of samples without one of them for a node leaves its
/// fault evidence as it was.
pub(crate) const EVIDENCE_METRICS: [MetricId; 7] =
    [ids::LOST, ids::ECC_DBE, ids::XID, ids::XID_EVENTS, ids::REMAP_FAILURE, ids::REMAP_PENDING, ids::RESET_REQUIRED];

/// The evidence `store` holds for a GPU (`None` when it has no reading at
/// all).
fn evidence_in(store: &crate::signals::telemetry::TelemetryStore, node: &Node, gpu: u32) -> Option<Evidence> {
    let g = u16::try_from(gpu).ok()?;
    let get = |m| store.latest(SeriesKey { node: node.idx, gpu: Some(g), metric: m }).map(|(_, v)| v);
    let [lost, dbe, xid, xid_events, remap_failure, remap_pending, reset_required] = EVIDENCE_METRICS.map(get);
    if lost.is_none() && dbe.is_none() && xid.is_none() {
        return None;
    }
    Some(Evidence {
        dbe_total: dbe.unwrap_or(0.0).max(0.0) as u64,
        xid_last: xid.filter(|x| *x > 0.0).map(|x| x as u32),
        xid_events: xid_events.map(|x| x.max(0.0) as u64),
        lost: lost.is_some_and(|v| v > 0.5),
        remap_failure: remap_failure.is_some_and(|v| v > 0.5),
        remap_pending: remap_pending.is_some_and(|v| v > 0.5),
        reset_required: reset_required.map(|v| v > 0.5),
    })
}
