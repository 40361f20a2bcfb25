//! The executor's memory: runs in flight, the queue, and what admission
//! remembers between runs — alert dedup keys, cooldowns, attempt budgets,
//! breaker windows, pending approvals.
//!
//! Nothing here is kept anywhere but memory, and nothing needs to be: every
//! entry is derived from audit records, and [`RunTable::replay`] rebuilds
//! it from the last day of the log when the engine starts (see
//! `run/recovery.rs`). So a restart — a crash, an upgrade, `Restart=on-failure`
//! — does not forget a cooldown and re-run a still-firing alert.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::Value;

use crate::audit::{AuditRecord, RecordKind, data};
use crate::runbooks::manifest::{BreakerCount, Priority};
use crate::runs::{RunOutcome, RunState, RunSummary, Target};
use crate::signals::alerts::SeenSet;

mod entries;
#[cfg(test)]
pub(crate) use entries::test_entry;
mod memories;

/// A (runbook, target) pair: what dedup, cooldowns and budgets are about.
pub type Key = (String, Target);

/// The trigger series to re-arm when a run ends.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRef {
    pub trigger: usize,
    pub node: Option<u32>,
    pub group: Option<String>,
}

/// A run the engine is responsible for: queued, waiting for approval, or
/// running.
pub struct RunEntry {
    pub summary: RunSummary,
    pub priority: Priority,
    pub exclusive: bool,
    /// Not started before this (breaker hold).
    pub not_before_ms: i64,
    /// A pending approval expires at this time.
    pub approval_deadline_ms: i64,
    pub cancel: Arc<AtomicBool>,
    /// The queued record is durable; the run may start.
    pub announced: bool,
    pub fire: Option<FireRef>,
    pub next_action: u32,
    /// When the event that started it happened.
    pub event_ts_ms: i64,
    /// The run has sent its first mutating action (the condition was
    /// re-checked then).
    pub acted: bool,
    /// Nodes where the run placed holds (released when it ends).
    pub held_on: Vec<String>,
    /// Nodes where it asked to keep its holds past its end.
    pub keeps_on: Vec<String>,
    /// Why it was cancelled, when another run preempted it.
    pub preempted_by: Option<String>,
    /// Who cancelled it (or rejected it), and why: the actor of its end.
    pub cancelled_by: Option<CancelledBy>,
    /// It notified or escalated: a run that tells a person is never free.
    pub told: bool,
    /// It said again a finding already told (kept as a note): the finding
    /// is still there, so its end does not clear it.
    pub repeated: bool,
    /// How many times an engine's restart resumed it (0: never stopped).
    /// A resumed run starts its script again from the top, under action
    /// ids of its own (`<run>-r<k>-a<n>`), and is never stale by age.
    pub resumed: u32,
    /// A resumed run waits, until this moment at most, for its nodes'
    /// inventory and a first reading from this engine before it starts
    /// (none: not resumed, or ready).
    pub resume_wait_until_ms: Option<i64>,
    /// What its changes and words came to: the outcome of a script that
    /// ended normally is derived from it ([`Achieved::outcome`]).
    pub achieved: Achieved,
    /// It is one of the nodes of a shared cause (its runbook's breaker
    /// tripped with `on_trip: reversible_only`), and the breaker's reason:
    /// from then on it takes reversible steps only and pages no one itself.
    /// Durable as a note on the run (`Note::shared_cause`), so a resumed
    /// run keeps it.
    pub shared_cause: Option<String>,
}

/// What a run achieved, as its script went (issue 43 point 9: a run whose
/// changes were all refused, or that left a node drained and hot, is not
/// "succeeded"). Counted for real changes only: a dry or shadow run keeps
/// its script's outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Achieved {
    /// Changes the agent applied (or found already in place).
    pub applied: u32,
    /// Changes refused — by the agent's envelope or by a rule of the
    /// engine (blast radius, hands-off, a target outside the run's) — as
    /// `op on node: why`.
    pub refused: Vec<String>,
    /// Changes that could not be sent or answered, as `op on node: why`.
    pub failed: Vec<String>,
    /// The first page it sent (or found already sent): a person is needed.
    pub paged: Option<String>,
    /// A drain it left for a person to end (sticky: an RMA, a repair, a
    /// cooling fault), as `node drained until a person ends it (why)`.
    pub left_for_person: Option<String>,
}

impl Achieved {
    /// How a run whose script ended normally ended, by what it achieved,
    /// and why when that is not plain success:
    /// - it tried changes and none went through: `refused` (every one
    ///   refused) or `failed` (one could not be sent);
    /// - else it paged a person, or left a node drained for one:
    ///   `needs_person`, saying what for;
    /// - else `succeeded`.
    pub fn outcome(&self) -> (RunOutcome, Option<String>) {
        let list = |v: &[String]| {
            let mut s = v.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
            if v.len() > 3 {
                s.push_str(&format!("; and {} more", v.len() - 3));
            }
            s
        };
        let paged = self.paged.as_ref().map(|p| format!("; paged a person: {p}")).unwrap_or_default();
        if self.applied == 0 && !self.failed.is_empty() {
            let n = self.failed.len() + self.refused.len();
            return (
                RunOutcome::Failed,
                Some(format!(
                    "none of its {n} change(s) went through: {}{paged}",
                    list(&[self.failed.clone(), self.refused.clone()].concat())
                )),
            );
        }
        if self.applied == 0 && !self.refused.is_empty() {
            return (
                RunOutcome::Refused,
                Some(format!("every change it tried was refused: {}{paged}", list(&self.refused))),
            );
        }
        match (&self.paged, &self.left_for_person) {
            (Some(p), _) => (RunOutcome::NeedsPerson, Some(format!("paged a person: {p}"))),
            (None, Some(d)) => (RunOutcome::NeedsPerson, Some(d.clone())),
            (None, None) => (RunOutcome::Succeeded, None),
        }
    }
}

impl RunEntry {
    /// A run's entry as its manifest says (class, priority, exclusive),
    /// its approval expiring `expire_secs` after it was created, nothing
    /// done yet; callers set what differs (a breaker's hold, a resume).
    pub fn new(summary: RunSummary, m: &crate::runbooks::manifest::Manifest) -> RunEntry {
        RunEntry {
            priority: m.priority,
            exclusive: m.exclusive,
            not_before_ms: 0,
            approval_deadline_ms: summary
                .created_ms
                .saturating_add((m.approval.expire_secs as i64).saturating_mul(1000)),
            cancel: Arc::new(AtomicBool::new(false)),
            announced: false,
            fire: None,
            next_action: 0,
            event_ts_ms: summary.event_ts_ms,
            acted: false,
            held_on: Vec::new(),
            keeps_on: Vec::new(),
            preempted_by: None,
            cancelled_by: None,
            told: false,
            repeated: false,
            resumed: 0,
            resume_wait_until_ms: None,
            achieved: Achieved::default(),
            shared_cause: None,
            summary,
        }
    }
}

/// A person's cancel (or rejection) of a run: recorded as theirs, not as
/// the run's requester's.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledBy {
    pub by: String,
    pub reason: Option<String>,
    /// Ended because the fleet's mode changed under it (a shadow run when
    /// the fleet goes to act): it did not do its work, so it earns no
    /// cooldown and what it held back is offered again.
    pub mode_switch: bool,
}

impl CancelledBy {
    /// `by alice` or `by alice: wrong node`.
    pub fn words(&self) -> String {
        match &self.reason {
            Some(r) => format!("by {}: {r}", self.by),
            None => format!("by {}", self.by),
        }
    }
}

/// One fire counted by a breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerFire {
    pub ts_ms: i64,
    pub node: String,
    pub gpu: Option<u32>,
}

/// A runbook's storm breaker.
#[derive(Debug, Default)]
pub struct Breaker {
    pub fires: VecDeque<BreakerFire>,
    pub tripped_until: i64,
    /// Why it last tripped (the nodes and what they share): what a run of
    /// the storm admitted while it is open is told it belongs to.
    pub reason: String,
}

/// A storm a breaker tripped on: its record, when, whose, and its nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedCause {
    pub seq: u64,
    pub ts_ms: i64,
    pub runbook: String,
    /// What kind of symptom (`symptom_of` in `run/breaker.rs`).
    pub symptom: String,
    pub nodes: BTreeSet<String>,
}

impl Breaker {
    /// Distinct targets in the window ending at `now`: nodes, or GPUs.
    pub fn distinct(&mut self, now: i64, window_ms: i64, count: BreakerCount) -> usize {
        while self.fires.front().is_some_and(|f| f.ts_ms < now.saturating_sub(window_ms)) {
            self.fires.pop_front();
        }
        match count {
            BreakerCount::Nodes => self.fires.iter().map(|f| &f.node).collect::<HashSet<_>>().len(),
            BreakerCount::Gpus => self.fires.iter().map(|f| (&f.node, f.gpu)).collect::<HashSet<_>>().len(),
        }
    }
}

/// Everything admission and the executor remember.
#[derive(Default)]
pub struct RunTable {
    runs: HashMap<String, RunEntry>,
    /// Waiting runs, in start order (priority, then age).
    queue: Vec<String>,
    active_by_key: HashMap<Key, String>,
    last_finished: HashMap<Key, i64>,
    /// Keys whose suppression was already audited in this episode.
    suppression_noted: HashSet<Key>,
    attempts: HashMap<Key, VecDeque<i64>>,
    /// Node → the exclusive run holding it.
    node_locks: HashMap<String, String>,
    /// The runs that left the table lately → their runbook, the newest
    /// [`RECENT_RUNS`] in the order they left (`entries.rs`).
    recent_runbooks: (HashMap<String, String>, VecDeque<String>),
    running: usize,
    running_per_runbook: HashMap<String, usize>,
    drains_in_flight: HashSet<String>,
    breakers: HashMap<String, Breaker>,
    /// The storms breakers told about, oldest first (rebuilt from
    /// `breaker_tripped`): what a later storm over mostly the same nodes is
    /// part of.
    shared_causes: VecDeque<SharedCause>,
    schedule_next: HashMap<String, i64>,
    /// Alert dedup: `status|fingerprint@startsAt`.
    alerts_seen: SeenSet,
    /// Alerts accepted whose `event_received` is not durable yet, with the
    /// future that ends when it is: a duplicate (an Alertmanager HA pair
    /// sends both) is answered only after the original is durable.
    alerts_pending: HashMap<String, AlertDurable>,
    /// Ended holds already audited (`node|hold id|ended_at_ms`).
    holds_ended: SeenSet,
    /// Accepted alerts whose handling is on the chain ([`alert_key`]).
    handled: SeenSet,
    /// Resolved alert episodes ([`episode`]: fingerprint and startsAt).
    resolved: SeenSet,
    /// Releases a finished run could not make (the node was hands-off or
    /// unreachable): (run, node), tried again on the tick until they work.
    pending_releases: Vec<(RunSummary, String)>,
    /// Per pool (`label=value`): nodes nightshift asked the autoscaler for
    /// and has not given back (from the audited requests: rebuilt on start).
    autoscaled: HashMap<String, i64>,
    /// Manual runs by their submitter's `Idempotency-Key`
    /// ([`idempotency_key`]): the run and when it was queued. Kept
    /// [`IDEMPOTENCY_KEPT_MS`]; rebuilt from `run_queued` records on start.
    idempotent: HashMap<String, (String, i64)>,
    /// Active run → the latest firing alert suppressed because of it: if
    /// that run ends without doing its work (skipped, interrupted), the
    /// alert is offered again rather than lost (issue 46 point 5). At most
    /// one per active run.
    waiting_alerts: HashMap<String, WaitingAlert>,
    /// Rebuilt on start only: a run that ended without doing its work →
    /// the alert it held back and how it ended, while no later record shows
    /// that alert offered again (the engine died between the end and the
    /// offer). Recovery offers them ([`RunTable::take_owed_offers`]).
    owed_offers: std::collections::BTreeMap<String, (WaitingAlert, crate::runs::RunOutcome)>,
}

/// A firing alert's run request, suppressed by an active run, kept to be
/// offered again (the parts an alert's request has; no params, not dry).
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingAlert {
    pub runbook: String,
    pub target: Target,
    pub detail: String,
    pub event: Value,
    pub event_ts_ms: i64,
    pub requested_by: String,
}

/// Ends when an accepted alert's `event_received` is durable (or says why
/// it is not), for every caller that waits on it.
pub type AlertDurable = futures::future::Shared<futures::future::BoxFuture<'static, Result<(), String>>>;

/// How long a run is found again by its `Idempotency-Key`.
pub const IDEMPOTENCY_KEPT_MS: i64 = 24 * 3_600_000;

/// The key a manual run is known by: who asked, and their key (two people
/// may use the same key for different runs).
pub fn idempotency_key(requested_by: &str, key: &str) -> String {
    format!("{requested_by}|{key}")
}

/// The dedup key of one alert notification: its status and episode.
pub fn alert_key(status: &str, episode_key: &str) -> String {
    format!("{status}|{episode_key}")
}

/// How long a resolved episode is remembered: a run queued for an episode
/// that resolved is skipped within this; later memory is bounded by age as
/// well as by count (a week of resolves outlives any queued run).
pub const RESOLVED_KEPT_MS: i64 = 7 * 24 * 3_600_000;

/// An alert episode: its fingerprint and when it started firing.
/// Alertmanager keeps `startsAt` for the life of one firing and sends a
/// new one when the alert fires again, so "resolved" is about one episode.
pub fn episode(fingerprint: &str, starts_at: &str) -> String {
    format!("{fingerprint}@{starts_at}")
}

/// The dedup key of an ended hold.
pub fn ended_key(node: &str, hold_id: &str, ended_at_ms: i64) -> String {
    format!("{node}|{hold_id}|{ended_at_ms}")
}

/// The key a `hold_reapplied` record is known by (in the same seen set).
pub fn reapplied_key(node: &str, setting: &str, at_ms: i64) -> String {
    format!("reapplied|{node}|{setting}|{at_ms}")
}

/// The key a `hold_drifted` record is known by (in the same seen set).
pub fn drifted_key(node: &str, setting: &str, why: &str) -> String {
    format!("drifted|{node}|{setting}|{why}")
}

impl RunTable {
    pub fn new(dedup_entries: usize) -> RunTable {
        RunTable {
            alerts_seen: SeenSet::new(dedup_entries),
            holds_ended: SeenSet::new(dedup_entries),
            resolved: SeenSet::new(dedup_entries),
            handled: SeenSet::new(dedup_entries),
            ..RunTable::default()
        }
    }

    /// The run a key was given for within [`IDEMPOTENCY_KEPT_MS`] of `now`.
    pub fn idempotent_run(&self, key: &str, now: i64) -> Option<String> {
        self.idempotent.get(key).filter(|(_, at)| now - at < IDEMPOTENCY_KEPT_MS).map(|(id, _)| id.clone())
    }

    /// Remember `key` for run `id`, forgetting keys past their time.
    pub fn remember_idempotent(&mut self, key: String, id: String, at_ms: i64) {
        self.idempotent.retain(|_, (_, t)| at_ms - *t < IDEMPOTENCY_KEPT_MS);
        self.idempotent.insert(key, (id, at_ms));
    }

    /// Queue a run: after every run of its priority or higher, before lower
    /// ones.
    pub fn enqueue(&mut self, id: String, priority: Priority) {
        let pos = self
            .queue
            .iter()
            .position(|q| self.runs.get(q).is_some_and(|r| r.priority < priority))
            .unwrap_or(self.queue.len());
        self.queue.insert(pos, id);
    }

    /// Whether the alert episode a run's `event` came from has resolved.
    pub fn episode_resolved(&self, event: &Value) -> bool {
        let Some(fp) = event.get("fingerprint").and_then(Value::as_str) else { return false };
        let starts = event.get("starts_at").and_then(Value::as_str).unwrap_or_default();
        self.resolved.contains(&episode(fp, starts))
    }

    /// Take an audit record into account, as if it had just been written:
    /// how the table is rebuilt after a restart. `breaker_of` says whether a
    /// runbook has a breaker.
    ///
    /// Payloads are read as their types (`nightshift_audit::data`); a record
    /// whose payload does not read is passed over, and said.
    pub fn replay(&mut self, r: &AuditRecord, breaker_of: &dyn Fn(&str) -> bool) {
        fn read<P: data::Payload>(r: &AuditRecord) -> Option<P> {
            r.payload::<P>()
                .map_err(|e| tracing::warn!(error = %e, "recovery passes over a record it cannot read"))
                .ok()
        }
        match r.kind {
            RecordKind::RunQueued => {
                let p = read::<data::RunQueued>(r);
                if let Some(p) = &p {
                    self.owed_offers.retain(|_, (w, _)| w.event != p.event);
                }
                if let (Some(p), Some(run)) = (&p, &r.run)
                    && let Some(k) = p.event["idempotency_key"].as_str()
                {
                    self.remember_idempotent(idempotency_key(&r.actor, k), run.clone(), r.ts_ms);
                }
                if let Some(key) = p.and_then(|p| key_of(r, p.target)) {
                    self.attempts.entry(key.clone()).or_default().push_back(r.ts_ms);
                    if breaker_of(&key.0)
                        && let Some(node) = key.1.node.clone().or_else(|| r.node.clone())
                    {
                        self.breakers.entry(key.0.clone()).or_default().fires.push_back(BreakerFire {
                            ts_ms: r.ts_ms,
                            node,
                            gpu: key.1.gpu,
                        });
                    }
                }
            }
            RecordKind::RunFinished => {
                let Some(p) = read::<data::RunFinished>(r) else { return };
                if let Some(key) = key_of(r, p.target) {
                    // Runs that never finished their work (skipped,
                    // interrupted, cancelled by a shutdown) start no cooldown.
                    if p.starts_cooldown != Some(false) {
                        self.last_finished.insert(key.clone(), r.ts_ms);
                    }
                    if let Some(at) = p.budget_refunded_ms {
                        self.refund_attempt(&key, at);
                    }
                    self.suppression_noted.remove(&key);
                }
                // Its end offered what it held back, in the life it ended —
                // if that life lived to make the offer: an end without the
                // run's work owes its alert an offer until a record of the
                // offer (`run_queued`, `trigger_suppressed` with the alert's
                // event) follows.
                if let Some(run) = &r.run
                    && let Some(w) = self.waiting_alerts.remove(run)
                {
                    let owed = match p.outcome.as_str() {
                        "skipped" => Some(crate::runs::RunOutcome::Skipped),
                        "interrupted" => Some(crate::runs::RunOutcome::Interrupted),
                        _ => None,
                    };
                    if let Some(outcome) = owed {
                        self.owed_offers.insert(run.clone(), (w, outcome));
                    }
                }
            }
            RecordKind::ActionResult => {
                if read::<data::ActionRef>(r).is_some_and(|a| a.op == data::AutoscaleResult::OP)
                    && let Some(p) = read::<data::AutoscaleResult>(r)
                    && let Some((pool, d)) = p.applied_change()
                {
                    let e = self.autoscaled.entry(pool.to_string()).or_default();
                    *e = (*e + d).max(0);
                }
            }
            RecordKind::TriggerSuppressed => {
                let Some(p) = read::<data::TriggerSuppressed>(r) else { return };
                if let Some(event) = &p.event {
                    self.owed_offers.retain(|_, (w, _)| w.event != *event);
                }
                // An alert an active run held back waits for that run again:
                // offered anew if it ends without doing its work.
                if let (Some(run), Some(event), Some(event_ts_ms), "alert") =
                    (&r.run, &p.event, p.event_ts_ms, p.trigger.as_str())
                    && let Some((runbook, target)) = key_of(r, p.target.clone())
                {
                    self.waiting_alerts.insert(
                        run.clone(),
                        WaitingAlert {
                            runbook,
                            target,
                            detail: p.detail.clone(),
                            event: event.clone(),
                            event_ts_ms,
                            requested_by: r.actor.clone(),
                        },
                    );
                }
                if let Some(key) = key_of(r, p.target) {
                    self.suppression_noted.insert(key);
                }
            }
            RecordKind::BreakerTripped => {
                if let (Some(rb), Some(until)) =
                    (&r.runbook, read::<data::BreakerTripped>(r).and_then(|p| p.tripped_until_ms))
                {
                    let p = read::<data::BreakerTripped>(r).unwrap_or_default();
                    let b = self.breakers.entry(rb.clone()).or_default();
                    b.tripped_until = until;
                    b.reason = p.reason;
                    if !p.nodes.is_empty() {
                        self.shared_causes.push_back(SharedCause {
                            seq: r.seq,
                            ts_ms: r.ts_ms,
                            runbook: rb.clone(),
                            symptom: p.symptom.unwrap_or_else(|| format!("runbook {rb}")),
                            nodes: p.nodes.into_iter().collect(),
                        });
                    }
                }
            }
            RecordKind::HoldEnded => {
                let Some(p) = read::<data::HoldEnded>(r) else { return };
                if let (Some(node), false, Some(at)) = (&r.node, p.hold_id.is_empty(), p.ended_at_ms) {
                    self.holds_ended.insert(ended_key(node, &p.hold_id, at));
                }
            }
            RecordKind::HoldReapplied => {
                if let (Some(node), Some(p)) = (&r.node, read::<data::HoldReapplied>(r)) {
                    self.holds_ended.insert(reapplied_key(node, &p.setting, p.at_ms));
                }
            }
            RecordKind::HoldDrifted => {
                if let (Some(node), Some(p)) = (&r.node, read::<data::HoldDrifted>(r)) {
                    self.holds_ended.insert(drifted_key(node, &p.setting, &p.why));
                }
            }
            RecordKind::EventHandled => {
                if let Some(p) = read::<data::EventHandled>(r).filter(|p| !p.key.is_empty()) {
                    self.handled.insert(p.key);
                }
            }
            RecordKind::EventReceived => {
                // Other sources' events carry other payloads.
                let Ok(p) = r.payload::<data::AlertReceived>() else { return };
                if p.source != data::AlertReceived::SOURCE
                    || p.status.is_empty()
                    || p.fingerprint.is_empty()
                    || p.starts_at.is_empty()
                {
                    return;
                }
                let ep = episode(&p.fingerprint, &p.starts_at);
                self.alerts_seen.insert(alert_key(&p.status, &ep));
                if p.status == "resolved" {
                    self.resolved.insert_at(ep, r.ts_ms, RESOLVED_KEPT_MS);
                }
            }
            _ => {}
        }
    }

    /// Give back the attempt a run admitted at `at_ms` spent (the first one
    /// counted at or after it): the run decided there was nothing to do.
    pub fn refund_attempt(&mut self, key: &Key, at_ms: i64) {
        if let Some(q) = self.attempts.get_mut(key)
            && let Some(i) = q.iter().position(|ts| *ts >= at_ms)
        {
            q.remove(i);
        }
    }

    /// A summary's (runbook, target) key.
    pub fn key(s: &RunSummary) -> Key {
        (s.runbook.clone(), s.target.clone())
    }

    /// Runs waiting for a person.
    pub fn pending_approvals(&self) -> Vec<RunSummary> {
        let mut v: Vec<RunSummary> = self
            .runs
            .values()
            .filter(|r| r.summary.state == RunState::PendingApproval)
            .map(|r| r.summary.clone())
            .collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }
}

/// The (runbook, target) a run record is about: its payload's `target`
/// where it carries one, else the record's node and GPU fields.
fn key_of(r: &AuditRecord, target: Option<Target>) -> Option<Key> {
    let runbook = r.runbook.clone()?;
    let target = target.unwrap_or_else(|| Target { node: r.node.clone(), gpu: r.gpu, group: None });
    Some((runbook, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of `key` in the 24 h before `now`.
    fn attempts_since(t: &mut RunTable, key: &Key, now: i64) -> usize {
        let a = t.attempts.entry(key.clone()).or_default();
        while a.front().is_some_and(|x| *x < now.saturating_sub(86_400_000)) {
            a.pop_front();
        }
        a.len()
    }
    use serde_json::json;

    pub(super) fn rec(seq: u64, ts: i64, kind: RecordKind, data: Value) -> AuditRecord {
        AuditRecord {
            seq,
            ts_ms: ts,
            kind,
            run: Some("r1".into()),
            node: Some("n1".into()),
            gpu: Some(0),
            runbook: Some("rb".into()),
            actor: "engine".into(),
            data,
            prev_hash: String::new(),
            hash: String::new(),
            v: None,
        }
    }

    /// Issue 43 point 9: a run's outcome says what it achieved.
    #[test]
    fn a_run_ends_by_what_it_achieved() {
        let refused = |s: &str| vec![s.to_string()];
        let cases: Vec<(Achieved, RunOutcome, Option<&str>)> = vec![
            (Achieved::default(), RunOutcome::Succeeded, None),
            (Achieved { applied: 2, ..Default::default() }, RunOutcome::Succeeded, None),
            // One change refused, another went through: it did its work.
            (
                Achieved { applied: 1, refused: refused("set_fan_curve on n1: no fan"), ..Default::default() },
                RunOutcome::Succeeded,
                None,
            ),
            (
                Achieved { refused: refused("drain on n1: blast radius"), ..Default::default() },
                RunOutcome::Refused,
                Some("every change it tried was refused: drain on n1: blast radius"),
            ),
            (
                Achieved {
                    refused: refused("drain on n1: hands-off"),
                    paged: Some("drain by hand".into()),
                    ..Default::default()
                },
                RunOutcome::Refused,
                Some("every change it tried was refused: drain on n1: hands-off; paged a person: drain by hand"),
            ),
            (
                Achieved { failed: refused("drain on n1: unreachable"), ..Default::default() },
                RunOutcome::Failed,
                Some("none of its 1 change(s) went through: drain on n1: unreachable"),
            ),
            (
                Achieved { applied: 3, paged: Some("cooling needs a person".into()), ..Default::default() },
                RunOutcome::NeedsPerson,
                Some("paged a person: cooling needs a person"),
            ),
            // Paged without changing anything (nothing it could do).
            (
                Achieved { paged: Some("no standby".into()), ..Default::default() },
                RunOutcome::NeedsPerson,
                Some("paged a person: no standby"),
            ),
            (
                Achieved {
                    applied: 2,
                    left_for_person: Some("n1 drained until a person ends it (hot)".into()),
                    ..Default::default()
                },
                RunOutcome::NeedsPerson,
                Some("n1 drained until a person ends it (hot)"),
            ),
        ];
        for (a, outcome, why) in cases {
            assert_eq!(a.outcome(), (outcome, why.map(str::to_string)), "{a:?}");
        }
        let many = Achieved { refused: (0..5).map(|i| format!("op{i}")).collect(), ..Default::default() };
        assert_eq!(many.outcome().1.unwrap(), "every change it tried was refused: op0; op1; op2; and 2 more");
    }

    /// A replayed end without the run's work owes its held-back alert an
    /// offer; a later record of the offer pays it; an alert resolved since
    /// is owed nothing.
    #[test]
    fn a_replayed_end_owes_its_held_back_alert_an_offer_until_one_is_on_record() {
        let target = json!({"node": "n1"});
        let event = |fp: &str| json!({"fingerprint": fp, "starts_at": "2026-01-01T00:00:00Z"});
        let held = |seq, fp: &str| {
            rec(
                seq,
                1_000,
                RecordKind::TriggerSuppressed,
                json!({"target": target, "trigger": "alert", "event": event(fp), "event_ts_ms": 1_000, "detail": "d"}),
            )
        };
        let ended = |seq, outcome: &str| {
            rec(seq, 2_000, RecordKind::RunFinished, json!({"target": target, "outcome": outcome}))
        };
        let owed = |records: &[AuditRecord]| {
            let mut t = RunTable::new(100);
            for r in records {
                t.replay(r, &|_| false);
            }
            t.take_owed_offers()
                .into_iter()
                .map(|(w, run, o)| (w.event["fingerprint"].clone(), run, o))
                .collect::<Vec<_>>()
        };
        assert_eq!(owed(&[held(1, "f2"), ended(2, "skipped")]), vec![(json!("f2"), "r1".into(), RunOutcome::Skipped)]);
        assert_eq!(owed(&[held(1, "f2"), ended(2, "succeeded")]), vec![], "a run that did its work owes nothing");
        let queued = rec(3, 3_000, RecordKind::RunQueued, json!({"target": target, "event": event("f2")}));
        assert_eq!(owed(&[held(1, "f2"), ended(2, "interrupted"), queued]), vec![], "the offer is on record");
        let resolved = rec(
            3,
            3_000,
            RecordKind::EventReceived,
            json!({"source": "alertmanager", "status": "resolved", "fingerprint": "f2", "starts_at": "2026-01-01T00:00:00Z"}),
        );
        assert_eq!(owed(&[held(1, "f2"), ended(2, "skipped"), resolved]), vec![], "resolved since: nothing to offer");
    }

    #[test]
    fn the_log_rebuilds_cooldowns_budgets_breakers_and_dedup() {
        let mut t = RunTable::new(100);
        let target = json!({"node": "n1", "gpu": 0});
        let records = [
            rec(1, 1_000, RecordKind::RunQueued, json!({"target": target})),
            rec(2, 2_000, RecordKind::RunFinished, json!({"target": target})),
            rec(3, 3_000, RecordKind::RunQueued, json!({"target": {"group": ["pool", "a"]}})),
            rec(
                4,
                3_500,
                RecordKind::EventReceived,
                json!({"source": "alertmanager", "status": "firing", "fingerprint": "f1", "starts_at": "2026-01-01T00:00:00Z"}),
            ),
            rec(5, 3_600, RecordKind::BreakerTripped, json!({"tripped_until_ms": 90_000})),
        ];
        for r in &records {
            t.replay(r, &|rb| rb == "rb");
        }
        let key: Key = ("rb".into(), Target::gpu("n1", 0));
        assert_eq!(t.last_finished.get(&key), Some(&2_000), "cooldown");
        assert_eq!(attempts_since(&mut t, &key, 5_000), 1, "budget");
        assert_eq!(attempts_since(&mut t, &("rb".into(), Target::group("pool", "a")), 5_000), 1);
        assert!(t.alerts_seen.contains("firing|f1@2026-01-01T00:00:00Z"), "dedup");
        let b = t.breakers.get_mut("rb").unwrap();
        assert_eq!(b.tripped_until, 90_000);
        assert_eq!(b.distinct(5_000, 60_000, BreakerCount::Nodes), 1);
        // A budget window slides.
        assert_eq!(attempts_since(&mut t, &key, 1_000 + 86_400_001), 0);
        // A run interrupted by a crash (or skipped, or cancelled by a
        // shutdown) starts no cooldown; the earlier one still counts.
        t.replay(&rec(6, 9_000, RecordKind::RunFinished, json!({"target": target, "starts_cooldown": false})), &|_| {
            false
        });
        assert_eq!(t.last_finished.get(&key), Some(&2_000));
    }

    #[test]
    fn breakers_count_nodes_unless_told_gpus() {
        let mut b = Breaker::default();
        for g in 0..4 {
            b.fires.push_back(BreakerFire { ts_ms: 1_000, node: "n1".into(), gpu: Some(g) });
        }
        b.fires.push_back(BreakerFire { ts_ms: 1_000, node: "n2".into(), gpu: Some(0) });
        assert_eq!(b.distinct(2_000, 60_000, BreakerCount::Nodes), 2);
        assert_eq!(b.distinct(2_000, 60_000, BreakerCount::Gpus), 5);
        assert_eq!(b.distinct(100_000, 60_000, BreakerCount::Nodes), 0, "the window slides");
    }
}
