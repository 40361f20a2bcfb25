//! The health model: hardware faults are durable states with a repair
//! lifecycle, not edges with timers.
//!
//! ```text
//!   healthy ──evidence──► faulted ──drained──► quarantined ──told──► awaiting_repair
//!      ▲                     │  (pending while a breaker,              │ repair evidence
//!      │                     │   cooldown or queue holds it)           ▼ or a person
//!      └──── passing health check ◄──────────────────────────────── verifying
//!                                  (a failing one: back to awaiting_repair)
//!   any state ──► rma (only a person leaves it)
//! ```
//!
//! Every transition is a `health_changed` audit record (who, why, the
//! evidence, what a person should do); the model is the fold of those
//! records, rebuilt on every start and takeover from the chain's own index
//! (`AuditStore::records_of_kind`). Evidence is evaluated on every reading
//! — and so on the first reading after a start — against what the last
//! verified repair acknowledged (the ECC counter, the XID events), so a
//! double-bit error that landed while the engine was down is seen the
//! moment the engine reads the GPU again.
//!
//! Nothing broken returns to service on a timer: a fault runbook's repair
//! drain is sticky, and only a passing health check (the agent's own, which
//! the agent checks again before it lets the drain go) or a person ends it.

//! The folder is the health subsystem (issue 44, What to build #1): this
//! model, the XID policy that says which XIDs are faults
//! ([`xid_policy`]), each GPU's XID history ([`xid_history`]) and the
//! repair loop's pacing ([`repair_memory`]). State and rules only: the
//! repair loop that acts on them is `repair.rs`, above `core`.

pub(crate) mod repair_memory;
pub(crate) mod xid_history;
pub(crate) mod xid_policy;

mod subsystem;
pub(crate) use subsystem::Health;

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::audit::{AuditRecord, NewRecord, RecordKind};

/// Where a GPU stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    #[default]
    Healthy,
    /// Evidence of a fault; nothing has acted on it yet (a run is due, or
    /// it is pending behind a breaker, a cooldown or a full queue).
    Faulted,
    /// Drained (its jobs moved off); the fault is being classified.
    Quarantined,
    /// A person has been told what to do (reset, reboot, reseat).
    AwaitingRepair,
    /// Repair evidence arrived; the health check decides.
    Verifying,
    /// Only a person leaves it: the GPU is to be replaced.
    Rma,
}

impl HealthState {
    pub const ALL: [HealthState; 6] = [
        HealthState::Healthy,
        HealthState::Faulted,
        HealthState::Quarantined,
        HealthState::AwaitingRepair,
        HealthState::Verifying,
        HealthState::Rma,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Faulted => "faulted",
            HealthState::Quarantined => "quarantined",
            HealthState::AwaitingRepair => "awaiting_repair",
            HealthState::Verifying => "verifying",
            HealthState::Rma => "rma",
        }
    }

    /// How bad, for a node's summary of its GPUs.
    pub fn rank(self) -> u8 {
        match self {
            HealthState::Healthy => 0,
            HealthState::Verifying => 1,
            HealthState::AwaitingRepair => 2,
            HealthState::Quarantined => 3,
            HealthState::Faulted => 4,
            HealthState::Rma => 5,
        }
    }
}

pub use crate::base::faults::FaultKind;
pub use crate::health::xid_policy::{XidAction, XidPolicy};

/// What the readings of one GPU say about faults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Evidence {
    pub dbe_total: u64,
    #[serde(default)]
    pub xid_last: Option<u32>,
    /// Fatal XID events counted by the agent (NVML's event API); absent
    /// with DCGM's gauge alone.
    #[serde(default)]
    pub xid_events: Option<u64>,
    #[serde(default)]
    pub lost: bool,
    #[serde(default)]
    pub remap_failure: bool,
    #[serde(default)]
    pub remap_pending: bool,
    /// A fatal XID since the GPU's last reset, where the agent tracks it
    /// (`Some(false)`: the GPU was reset since).
    #[serde(default)]
    pub reset_required: Option<bool>,
}

/// What the last verified repair (or the first sight of a healthy GPU)
/// acknowledged: only evidence beyond it is a new fault.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    pub dbe_total: u64,
    #[serde(default)]
    pub xid_last: Option<u32>,
    #[serde(default)]
    pub xid_events: Option<u64>,
}

impl From<&Evidence> for Ack {
    fn from(e: &Evidence) -> Ack {
        Ack { dbe_total: e.dbe_total, xid_last: e.xid_last, xid_events: e.xid_events }
    }
}

/// A fault: its kind, the XID where there is one, and the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Fault {
    pub kind: FaultKind,
    #[serde(default)]
    pub xid: Option<u32>,
    pub detail: String,
    pub evidence: Evidence,
    pub seen_ms: i64,
}

/// The timestamps of one lifecycle (fault seen → back in service).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Lifecycle {
    pub seen_ms: i64,
    #[serde(default)]
    pub quarantined_ms: Option<i64>,
    #[serde(default)]
    pub requeued_ms: Option<i64>,
    #[serde(default)]
    pub repaired_ms: Option<i64>,
    #[serde(default)]
    pub verified_ms: Option<i64>,
}

/// Seconds from the fault being seen to each phase reached (absent: not
/// reached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Phases {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<f64>,
}

impl Phases {
    /// `(phase, seconds from the fault)` for each phase reached.
    pub fn reached(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("quarantined", self.quarantined),
            ("requeued", self.requeued),
            ("repaired", self.repaired),
            ("verified", self.verified),
        ]
        .into_iter()
        .filter_map(|(p, v)| v.map(|v| (p, v)))
    }
}

impl Lifecycle {
    /// Seconds from the fault to each phase reached.
    pub fn phases(&self) -> Phases {
        let d = |t: Option<i64>| t.map(|t| (t - self.seen_ms).max(0) as f64 / 1000.0);
        Phases {
            quarantined: d(self.quarantined_ms),
            requeued: d(self.requeued_ms),
            repaired: d(self.repaired_ms),
            verified: d(self.verified_ms),
        }
    }
}

/// One GPU's health.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuHealth {
    pub state: HealthState,
    pub since_ms: i64,
    pub fault: Option<Fault>,
    pub ack: Ack,
    /// The run that acted on the fault (its holds are the repair drain).
    pub run: Option<String>,
    /// What a person should do, in words.
    pub instruction: Option<String>,
    pub why: String,
    pub lifecycle: Option<Lifecycle>,
    /// When earlier faults of this GPU were quarantined (repeat offenders).
    pub repairs: VecDeque<i64>,
    /// Finished lifecycles, newest last (bounded).
    pub history: VecDeque<(FaultKind, Lifecycle)>,
    /// The last failing health check's failures.
    pub check_failures: Vec<String>,
    /// When a health check last refuted a repair (verifying → awaiting
    /// repair): the same evidence does not count again until
    /// [`REFUTED_RECHECK_MS`] has passed, so a GPU the check keeps failing
    /// is checked every so often, not on every reading; new evidence (a
    /// reset since) counts at once.
    pub refuted_ms: Option<i64>,
    /// The failures of the last refuting check (kept across the verifying
    /// state, so a person is told again only when they change).
    pub refuted_failures: Vec<String>,
    /// The evidence the refuting check saw.
    pub refuted_evidence: Option<Evidence>,
}

/// How long a repair the health check refuted waits before the same
/// evidence is checked again.
pub const REFUTED_RECHECK_MS: i64 = 600_000;

/// A transition to record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub node: String,
    pub gpu: u32,
    pub from: HealthState,
    pub to: HealthState,
    #[serde(default)]
    pub fault: Option<Fault>,
    /// Who: `engine`, a run id, `user:<name>`.
    pub by: String,
    pub why: String,
    #[serde(default)]
    pub instruction: Option<String>,
    #[serde(default)]
    pub run: Option<String>,
    /// The counters this transition acknowledges (a verified repair).
    #[serde(default)]
    pub ack: Option<Ack>,
    /// A phase the lifecycle reached without a state change (`requeued`).
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub check_failures: Vec<String>,
    /// The evidence a failing health check saw (it refuted a repair: the
    /// same evidence does not count as a repair again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
}

impl crate::audit::data::Payload for Transition {
    const KINDS: &'static [RecordKind] = &[RecordKind::HealthChanged];
}

impl Transition {
    /// The audit record of this transition.
    pub fn record(&self, actor: &str) -> NewRecord {
        let mut rec =
            NewRecord::typed(RecordKind::HealthChanged, actor, self).node(Some(&self.node)).gpu(Some(self.gpu));
        if let Some(r) = &self.run {
            rec = rec.run(r);
        }
        rec
    }
}

/// How many past lifecycles a GPU keeps in memory.
const HISTORY: usize = 16;

/// Every GPU's health.
#[derive(Debug, Clone, Default)]
pub struct HealthModel {
    gpus: BTreeMap<(String, u32), GpuHealth>,
    /// The nodes with a record in `gpus`: a lookup for any other (most GPUs,
    /// at every reading) answers without building a key.
    nodes: std::collections::BTreeSet<String>,
    /// Repeat offenders: a GPU remediated more than this many times within
    /// the window goes to a person instead of round after round.
    max_repairs: usize,
    repair_window_ms: i64,
    /// The XID policy in force (shipped table and site overrides; a reload
    /// replaces it).
    policy: std::sync::Arc<XidPolicy>,
}

impl HealthModel {
    /// The XID policy in force.
    pub fn policy(&self) -> std::sync::Arc<XidPolicy> {
        self.policy.clone()
    }

    /// Put `policy` in force; what changed from the one before, one line per
    /// code.
    pub(crate) fn set_policy(&mut self, policy: std::sync::Arc<XidPolicy>) -> Vec<String> {
        let changes = policy.changes_from(&self.policy);
        if *policy != *self.policy {
            self.policy = policy;
        }
        changes
    }

    pub fn new(max_repairs: usize, repair_window_ms: i64) -> HealthModel {
        let policy = std::sync::Arc::new(XidPolicy::shipped().clone());
        HealthModel { gpus: BTreeMap::new(), nodes: Default::default(), max_repairs, repair_window_ms, policy }
    }

    pub fn get(&self, node: &str, gpu: u32) -> Option<&GpuHealth> {
        if !self.nodes.contains(node) {
            return None;
        }
        self.gpus.get(&(node.to_string(), gpu))
    }

    /// A GPU's state (healthy when never seen faulty).
    pub fn state(&self, node: &str, gpu: u32) -> HealthState {
        self.get(node, gpu).map_or(HealthState::Healthy, |h| h.state)
    }

    /// The worst state of a node's GPUs.
    pub fn node_state(&self, node: &str) -> HealthState {
        self.node_gpus(node).map(|(_, h)| h.state).max_by_key(|s| s.rank()).unwrap_or(HealthState::Healthy)
    }

    /// A node's GPUs with a health record.
    pub fn node_gpus<'a>(&'a self, node: &'a str) -> impl Iterator<Item = (u32, &'a GpuHealth)> + 'a {
        let known = self.nodes.contains(node);
        known
            .then(|| self.gpus.range((node.to_string(), 0)..=(node.to_string(), u32::MAX)))
            .into_iter()
            .flatten()
            .map(|((_, g), h)| (*g, h))
    }

    /// Every GPU with a health record.
    pub fn all(&self) -> impl Iterator<Item = (&(String, u32), &GpuHealth)> {
        self.gpus.iter()
    }

    /// GPUs in a state.
    pub fn in_state(&self, state: HealthState) -> Vec<(String, u32)> {
        self.gpus.iter().filter(|(_, h)| h.state == state).map(|(k, _)| k.clone()).collect()
    }

    /// Counts per state (GPUs never faulty are not counted here).
    pub fn counts(&self) -> BTreeMap<HealthState, usize> {
        let mut m = BTreeMap::new();
        for h in self.gpus.values() {
            *m.entry(h.state).or_default() += 1;
        }
        m
    }

    /// Times this GPU was quarantined within the window before `now`.
    pub fn repairs_in_window(&self, node: &str, gpu: u32, now: i64) -> usize {
        self.get(node, gpu)
            .map_or(0, |h| h.repairs.iter().filter(|t| **t >= now.saturating_sub(self.repair_window_ms)).count())
    }

    /// Whether this GPU has been remediated too often to try again.
    pub fn repeat_offender(&self, node: &str, gpu: u32, now: i64) -> bool {
        self.max_repairs > 0 && self.repairs_in_window(node, gpu, now) >= self.max_repairs
    }

    /// Whether a new fault shows in `ev`, beyond what was acknowledged. Only
    /// a healthy GPU gets a new fault; one already in the lifecycle keeps
    /// its own.
    pub fn observe(&self, node: &str, gpu: u32, ev: &Evidence, now: i64) -> Option<Transition> {
        let h = self.get(node, gpu);
        let state = h.map_or(HealthState::Healthy, |h| h.state);
        // A GPU in its lifecycle keeps its fault (one being verified too:
        // the health check decides, and a failing one sends it back).
        if state != HealthState::Healthy {
            return None;
        }
        let ack = h.map(|h| h.ack).unwrap_or_default();
        let fault = fault_in(ev, &ack, now, &self.policy)?;
        let why = format!("{}: {}", fault.kind.as_str(), fault.detail);
        Some(Transition {
            node: node.to_string(),
            gpu,
            from: state,
            to: HealthState::Faulted,
            fault: Some(fault),
            by: "engine".into(),
            why,
            ..Transition::default()
        })
    }

    /// Take a `health_changed` record into the model (as it is written, and
    /// when the model is rebuilt from the chain).
    pub fn replay(&mut self, r: &AuditRecord) {
        if r.kind != RecordKind::HealthChanged {
            return;
        }
        let t = match r.payload::<Transition>() {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "a health_changed record cannot be read: the model skips it");
                return;
            }
        };
        self.apply(&t, r.ts_ms);
    }

    /// Apply a transition at `ts_ms`.
    pub fn apply(&mut self, t: &Transition, ts_ms: i64) {
        let window = self.repair_window_ms;
        if !self.nodes.contains(&t.node) {
            self.nodes.insert(t.node.clone());
        }
        let h = self.gpus.entry((t.node.clone(), t.gpu)).or_default();
        if let Some(phase) = &t.phase {
            if let Some(l) = h.lifecycle.as_mut()
                && phase == "requeued"
            {
                l.requeued_ms.get_or_insert(ts_ms);
            }
            return;
        }
        h.state = t.to;
        h.since_ms = ts_ms;
        h.why = t.why.clone();
        if t.run.is_some() {
            h.run = t.run.clone();
        }
        if t.instruction.is_some() {
            h.instruction = t.instruction.clone();
        }
        h.check_failures = t.check_failures.clone();
        match t.to {
            HealthState::Faulted => {
                h.fault = t.fault.clone();
                h.run = t.run.clone();
                h.instruction = None;
                h.lifecycle = Some(Lifecycle { seen_ms: ts_ms, ..Lifecycle::default() });
                h.refuted_ms = None;
                h.refuted_failures.clear();
                h.refuted_evidence = None;
            }
            HealthState::Quarantined => {
                if let Some(l) = h.lifecycle.as_mut() {
                    l.quarantined_ms.get_or_insert(ts_ms);
                }
                h.repairs.push_back(ts_ms);
                while h.repairs.front().is_some_and(|x| *x < ts_ms.saturating_sub(window.max(0))) {
                    h.repairs.pop_front();
                }
            }
            HealthState::Verifying => {
                if let Some(l) = h.lifecycle.as_mut() {
                    l.repaired_ms.get_or_insert(ts_ms);
                }
            }
            HealthState::Healthy => {
                if let Some(l) = h.lifecycle.as_mut() {
                    l.verified_ms.get_or_insert(ts_ms);
                }
                if let Some(a) = t.ack {
                    h.ack = a;
                }
                h.refuted_ms = None;
                h.refuted_failures.clear();
                h.refuted_evidence = None;
                if let (Some(f), Some(l)) = (h.fault.take(), h.lifecycle.take()) {
                    h.history.push_back((f.kind, l));
                    while h.history.len() > HISTORY {
                        h.history.pop_front();
                    }
                }
                h.run = None;
                h.instruction = None;
            }
            HealthState::AwaitingRepair => {
                // A health check that failed: that was no repair; the next
                // one counts.
                if t.from == HealthState::Verifying {
                    if let Some(l) = h.lifecycle.as_mut() {
                        l.repaired_ms = None;
                    }
                    h.refuted_ms = Some(ts_ms);
                    h.refuted_failures = t.check_failures.clone();
                    h.refuted_evidence = t.evidence;
                }
            }
            HealthState::Rma => {}
        }
    }
}

/// The fault `ev` shows beyond `ack`, worst first: a lost GPU, a failed
/// remap, new double-bit errors, a new XID `policy` calls a fault, a
/// pending remap.
pub fn fault_in(ev: &Evidence, ack: &Ack, now: i64, policy: &XidPolicy) -> Option<Fault> {
    let f = |kind, xid, detail: String| Some(Fault { kind, xid, detail, evidence: *ev, seen_ms: now });
    if ev.lost {
        return f(FaultKind::GpuLost, Some(79), "the GPU does not answer (fallen off the bus)".into());
    }
    if ev.remap_failure {
        return f(FaultKind::RowRemapFailure, Some(64), "a row remap failed: no spare row left".into());
    }
    if ev.dbe_total > ack.dbe_total {
        return f(
            FaultKind::Dbe,
            Some(48),
            format!("{} double-bit ECC error(s) (acknowledged {})", ev.dbe_total, ack.dbe_total),
        );
    }
    if let Some(x) = ev.xid_last.filter(|x| policy.is_fault(*x)) {
        let new = match (ev.xid_events, ack.xid_events) {
            (Some(now_n), Some(acked)) => now_n > acked,
            (Some(now_n), None) => now_n > 0,
            // DCGM's gauge alone: a code other than the acknowledged one.
            (None, _) => ack.xid_last != Some(x),
        };
        if new {
            let what = policy.info(x).map_or("a fatal XID", |i| i.meaning.as_str());
            return f(FaultKind::Xid, Some(x), format!("XID {x}: {what}"));
        }
    }
    if ev.remap_pending && ev.reset_required != Some(false) && ev.dbe_total == ack.dbe_total && ack.dbe_total == 0 {
        return f(FaultKind::RowRemapPending, Some(63), "a row remap waits for a GPU reset".into());
    }
    None
}

/// Whether `ev` shows the repair a GPU awaiting it needs: the evidence of
/// its fault is gone (it answers again, its volatile counters were cleared
/// by a reset, the pending remap took effect).
pub fn repair_evidence(fault: &Fault, ev: &Evidence) -> Option<String> {
    if ev.lost {
        return None;
    }
    let reset = ev.reset_required == Some(false);
    match fault.kind {
        FaultKind::GpuLost => Some("the GPU answers again".into()),
        FaultKind::Dbe if ev.dbe_total < fault.evidence.dbe_total || (reset && ev.dbe_total == 0) => {
            Some("the GPU was reset: its double-bit ECC counter is clear".into())
        }
        FaultKind::RowRemapPending if !ev.remap_pending => Some("the pending row remap took effect".into()),
        FaultKind::Xid if reset => Some("the GPU was reset since the XID".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, ts: i64, t: &Transition) -> AuditRecord {
        AuditRecord {
            seq,
            ts_ms: ts,
            kind: RecordKind::HealthChanged,
            run: t.run.clone(),
            node: Some(t.node.clone()),
            gpu: Some(t.gpu),
            runbook: None,
            actor: "engine".into(),
            data: serde_json::to_value(t).unwrap(),
            prev_hash: String::new(),
            hash: String::new(),
            v: None,
        }
    }

    fn to(state: HealthState, from: HealthState) -> Transition {
        Transition {
            node: "n1".into(),
            gpu: 0,
            from,
            to: state,
            by: "r1".into(),
            why: "test".into(),
            run: Some("r1".into()),
            ..Transition::default()
        }
    }

    /// Table: evidence against an acknowledgement → the fault found.
    #[test]
    fn evidence_table() {
        let zero = Ack::default();
        type Case<'a> = (&'a str, Evidence, Ack, Option<(FaultKind, Option<u32>)>);
        let cases: Vec<Case<'_>> = vec![
            ("healthy", Evidence::default(), zero, None),
            ("a DBE", Evidence { dbe_total: 2, ..Evidence::default() }, zero, Some((FaultKind::Dbe, Some(48)))),
            (
                "an acknowledged DBE",
                Evidence { dbe_total: 2, ..Evidence::default() },
                Ack { dbe_total: 2, ..zero },
                None,
            ),
            (
                "lost beats everything",
                Evidence { lost: true, dbe_total: 5, ..Evidence::default() },
                zero,
                Some((FaultKind::GpuLost, Some(79))),
            ),
            (
                "remap failure",
                Evidence { remap_failure: true, dbe_total: 600, ..Evidence::default() },
                zero,
                Some((FaultKind::RowRemapFailure, Some(64))),
            ),
            (
                "XID 95 by events",
                Evidence { xid_last: Some(95), xid_events: Some(1), ..Evidence::default() },
                zero,
                Some((FaultKind::Xid, Some(95))),
            ),
            (
                "the same XID counted twice",
                Evidence { xid_last: Some(79), xid_events: Some(2), ..Evidence::default() },
                Ack { xid_last: Some(79), xid_events: Some(1), ..zero },
                Some((FaultKind::Xid, Some(79))),
            ),
            (
                "an acknowledged XID",
                Evidence { xid_last: Some(79), xid_events: Some(1), ..Evidence::default() },
                Ack { xid_last: Some(79), xid_events: Some(1), ..zero },
                None,
            ),
            (
                "gauge only: a new code",
                Evidence { xid_last: Some(94), ..Evidence::default() },
                Ack { xid_last: Some(79), ..zero },
                Some((FaultKind::Xid, Some(94))),
            ),
            (
                "gauge only: the acknowledged code",
                Evidence { xid_last: Some(79), ..Evidence::default() },
                Ack { xid_last: Some(79), ..zero },
                None,
            ),
            (
                "an application XID",
                Evidence { xid_last: Some(13), xid_events: Some(1), ..Evidence::default() },
                zero,
                None,
            ),
            ("XID 45 follows a killed job", Evidence { xid_last: Some(45), ..Evidence::default() }, zero, None),
            (
                "a pending remap alone",
                Evidence { remap_pending: true, ..Evidence::default() },
                zero,
                Some((FaultKind::RowRemapPending, Some(63))),
            ),
        ];
        for (name, ev, ack, want) in cases {
            let got = fault_in(&ev, &ack, 1, XidPolicy::shipped()).map(|f| (f.kind, f.xid));
            assert_eq!(got, want, "{name}");
        }
    }

    /// The policy in force decides what an XID is: a site that marks 109
    /// benign gets no fault from it; the evidence still makes one.
    #[test]
    fn the_policy_in_force_classifies_xids() {
        let site = XidPolicy::with_overrides(
            "version: 1\nxids:\n  - { code: 109, action: ignore, reason: benign here }\n  - { code: 79, action: ignore, reason: wrong but allowed }\n",
            std::path::Path::new("site.yaml"),
        )
        .unwrap();
        let xid = |x| Evidence { xid_last: Some(x), xid_events: Some(1), ..Evidence::default() };
        let lost = Evidence { lost: true, xid_last: Some(79), ..Evidence::default() };
        for (name, ev, policy, want) in [
            ("109, shipped", xid(109), XidPolicy::shipped(), Some((FaultKind::Xid, Some(109)))),
            ("109, benign here", xid(109), &site, None),
            ("13 anywhere", xid(13), &site, None),
            ("a lost GPU whatever 79 says", lost, &site, Some((FaultKind::GpuLost, Some(79)))),
        ] {
            let got = fault_in(&ev, &Ack::default(), 1, policy).map(|f| (f.kind, f.xid));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_lifecycle_replays_to_the_same_state_and_counts_repairs() {
        let mut m = HealthModel::new(2, 86_400_000);
        let ev = Evidence { dbe_total: 2, ..Evidence::default() };
        let fault = m.observe("n1", 0, &ev, 1_000).expect("a fault");
        let steps = [
            (1_000, fault.clone()),
            (2_000, to(HealthState::Quarantined, HealthState::Faulted)),
            (
                2_500,
                Transition { phase: Some("requeued".into()), ..to(HealthState::Quarantined, HealthState::Quarantined) },
            ),
            (3_000, to(HealthState::AwaitingRepair, HealthState::Quarantined)),
            (9_000, to(HealthState::Verifying, HealthState::AwaitingRepair)),
            (
                10_000,
                Transition {
                    ack: Some(Ack { dbe_total: 0, ..Ack::default() }),
                    ..to(HealthState::Healthy, HealthState::Verifying)
                },
            ),
        ];
        let mut replayed = HealthModel::new(2, 86_400_000);
        for (i, (ts, t)) in steps.iter().enumerate() {
            m.apply(t, *ts);
            replayed.replay(&rec(i as u64 + 1, *ts, t));
        }
        assert_eq!(m.get("n1", 0), replayed.get("n1", 0), "the chain rebuilds exactly what was applied");
        let h = m.get("n1", 0).unwrap();
        assert_eq!(h.state, HealthState::Healthy);
        let (kind, l) = h.history.back().unwrap();
        assert_eq!(*kind, FaultKind::Dbe);
        let reached: Vec<(&str, f64)> = l.phases().reached().collect();
        assert_eq!(reached, vec![("quarantined", 1.0), ("requeued", 1.5), ("repaired", 8.0), ("verified", 9.0)]);
        assert_eq!(m.repairs_in_window("n1", 0, 10_000), 1);
        assert!(!m.repeat_offender("n1", 0, 10_000));
        // A second fault and quarantine: two in the window.
        let t = m
            .observe("n1", 0, &Evidence { dbe_total: 1, ..Evidence::default() }, 20_000)
            .expect("a new DBE after the reset");
        m.apply(&t, 20_000);
        m.apply(&to(HealthState::Quarantined, HealthState::Faulted), 21_000);
        assert!(m.repeat_offender("n1", 0, 22_000));
        assert!(
            m.observe("n1", 0, &Evidence { dbe_total: 9, ..Evidence::default() }, 23_000).is_none(),
            "a GPU in the lifecycle keeps its fault"
        );
        assert_eq!(m.node_state("n1"), HealthState::Quarantined);
        assert_eq!(m.node_state("n2"), HealthState::Healthy);
    }

    #[test]
    fn repair_evidence_is_the_fault_gone() {
        let lost = Fault {
            kind: FaultKind::GpuLost,
            xid: Some(79),
            detail: String::new(),
            evidence: Evidence { lost: true, ..Evidence::default() },
            seen_ms: 0,
        };
        assert!(repair_evidence(&lost, &Evidence { lost: true, ..Evidence::default() }).is_none());
        assert!(repair_evidence(&lost, &Evidence::default()).is_some());
        let dbe = Fault {
            kind: FaultKind::Dbe,
            xid: Some(48),
            detail: String::new(),
            evidence: Evidence { dbe_total: 2, ..Evidence::default() },
            seen_ms: 0,
        };
        assert!(repair_evidence(&dbe, &Evidence { dbe_total: 2, ..Evidence::default() }).is_none());
        assert!(
            repair_evidence(&dbe, &Evidence { dbe_total: 0, reset_required: Some(false), ..Evidence::default() })
                .is_some()
        );
        let xid = Fault {
            kind: FaultKind::Xid,
            xid: Some(95),
            detail: String::new(),
            evidence: Evidence::default(),
            seen_ms: 0,
        };
        assert!(
            repair_evidence(&xid, &Evidence { xid_last: Some(95), reset_required: Some(true), ..Evidence::default() })
                .is_none()
        );
        assert!(
            repair_evidence(&xid, &Evidence { xid_last: Some(95), reset_required: Some(false), ..Evidence::default() })
                .is_some()
        );
        let rma = Fault {
            kind: FaultKind::RowRemapFailure,
            xid: Some(64),
            detail: String::new(),
            evidence: Evidence::default(),
            seen_ms: 0,
        };
        assert!(repair_evidence(&rma, &Evidence::default()).is_none(), "only a person ends an RMA");
    }
}
