//! Typed record payloads: the ones recovery reads back. Each is one struct
//! that the engine writes ([`crate::NewRecord::typed`]) and recovery reads
//! ([`crate::AuditRecord::payload`]), so renaming a field is a compile
//! error on both sides instead of a silent break of the one code path that
//! must never break. Field names are the keys the chains on disk already
//! have; a field an older record lacks reads as its default. The hash is
//! over the stored bytes, so nothing here changes what verifies.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RecordKind;
use crate::runs::Target;

/// A payload type and the record kinds that carry it.
pub trait Payload: Serialize + DeserializeOwned {
    /// The kinds a record with this payload has.
    const KINDS: &'static [RecordKind];
}

/// Why a record's payload could not be read as a type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PayloadError {
    #[error("record {seq}: expected a record of kind {expected}, found {found}")]
    Kind { seq: u64, expected: String, found: String },
    #[error("record {seq} ({kind}): its payload does not read as expected: {message}")]
    Shape { seq: u64, kind: String, message: String },
}

/// `run_queued`: what a run was queued for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunQueued {
    /// The trigger type: `threshold`, `alert`, `manual`, `fault`, …
    pub trigger: String,
    pub detail: String,
    /// The event that started it (an alert's labels, a fire's value).
    pub event: Value,
    pub dry_run: bool,
    pub target: Option<Target>,
    pub priority: String,
    pub class: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
    /// A shadow run: the approval the live run would have needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_need_approval: Option<String>,
}

impl Payload for RunQueued {
    const KINDS: &'static [RecordKind] = &[RecordKind::RunQueued];
}

/// `run_started`: what the run starts with, and what it waited for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStarted {
    pub params: Value,
    pub waited_ms: i64,
    /// What held the run back while it waited (holds, approvals, slots).
    pub waited_for: Value,
}

impl Payload for RunStarted {
    const KINDS: &'static [RecordKind] = &[RecordKind::RunStarted];
}

/// `run_finished`: how a run ended and whether its cooldown starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunFinished {
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why admission refused it, or why a person cancelled or rejected it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The person who cancelled or rejected it (also the record's actor).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actions: Option<u32>,
    pub target: Option<Target>,
    /// Each setting given back: `{node, setting, outcome, detail}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds_released: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds_kept: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds_left: Option<Vec<String>>,
    /// Ended by recovery after a crash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    /// `Some(false)`: the run never finished its work (skipped,
    /// interrupted, a fault run) and starts no cooldown; absent (older
    /// records) means it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_cooldown: Option<bool>,
    /// The run decided there was nothing to do (succeeded, no action, told
    /// nobody): the attempt admitted at this time is not counted against
    /// `max_attempts_per_day`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_refunded_ms: Option<i64>,
}

impl Payload for RunFinished {
    const KINDS: &'static [RecordKind] = &[RecordKind::RunFinished];
}

/// `trigger_suppressed`: the first suppression of an episode — and every
/// alert held back by an active run (each such alert says on the chain
/// which run held it), with what a restart needs to offer it again should
/// that run end without doing its work. An alert suppressed by a cooldown
/// or a breaker is noted once per episode, as a telemetry fire is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TriggerSuppressed {
    pub reason: String,
    pub detail: String,
    pub trigger: String,
    pub target: Option<Target>,
    /// An alert held back by the record's run: the alert's event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<Value>,
    /// An alert held back by the record's run: when it started (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_ts_ms: Option<i64>,
}

impl Payload for TriggerSuppressed {
    const KINDS: &'static [RecordKind] = &[RecordKind::TriggerSuppressed];
}

/// `breaker_tripped`: a runbook's breaker open until a time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BreakerTripped {
    pub reason: String,
    pub tripped_until_ms: Option<i64>,
    /// The storm's nodes: a later storm over mostly the same nodes (another
    /// runbook seeing the same rack's cooling) is the same shared cause,
    /// told once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// What kind of symptom the storm was (`temperature` for the H1–H3
    /// rows, else the handbook row): only a later storm of the same kind
    /// over the same nodes is the same shared cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symptom: Option<String>,
}

impl Payload for BreakerTripped {
    const KINDS: &'static [RecordKind] = &[RecordKind::BreakerTripped];
}

/// `hold_ended`: an agent says a hold ended (audited once: recovery keeps
/// the ones it has seen).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HoldEnded {
    pub hold_id: String,
    pub owner: String,
    pub setting: String,
    pub kind: String,
    pub value: String,
    pub reason: String,
    pub placed_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub how: String,
    pub by: String,
    pub outcome: Value,
    pub now: String,
}

impl Payload for HoldEnded {
    const KINDS: &'static [RecordKind] = &[RecordKind::HoldEnded];
}

/// `hold_reapplied`: a held setting found at its default and applied again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HoldReapplied {
    pub setting: String,
    pub kind: String,
    /// What the device had (its default), and what was put back.
    pub found: String,
    pub applied: String,
    pub at_ms: i64,
    pub owners: Vec<String>,
}

impl Payload for HoldReapplied {
    const KINDS: &'static [RecordKind] = &[RecordKind::HoldReapplied];
}

/// `hold_drifted`: a held setting not in force, and what was found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HoldDrifted {
    pub setting: String,
    pub kind: String,
    pub why: String,
    pub owners: Vec<String>,
}

impl Payload for HoldDrifted {
    const KINDS: &'static [RecordKind] = &[RecordKind::HoldDrifted];
}

/// `event_received` of an Alertmanager alert: acknowledged once durable,
/// handled by a later `event_handled` (recovery handles any it lacks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AlertReceived {
    /// `alertmanager` (other sources write other payloads).
    pub source: String,
    pub acked: bool,
    pub posted_by: String,
    pub alertname: String,
    pub status: String,
    pub fingerprint: String,
    pub starts_at: String,
    pub ends_at: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl AlertReceived {
    /// The `source` an Alertmanager alert's record has.
    pub const SOURCE: &'static str = "alertmanager";
}

impl Payload for AlertReceived {
    const KINDS: &'static [RecordKind] = &[RecordKind::EventReceived];
}

/// `event_handled`: an event's handling finished (its key: status and
/// episode for an alert).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventHandled {
    pub source: String,
    pub key: String,
}

impl Payload for EventHandled {
    const KINDS: &'static [RecordKind] = &[RecordKind::EventHandled];
}

/// What every `action_intent` and `action_result` says: the action it is
/// about, its op, whether it was a dry run (to pair a result with its
/// intent, and to pick the payload type of the rest).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionRef {
    pub action_id: String,
    pub op: String,
    pub dry_run: bool,
}

impl Payload for ActionRef {
    const KINDS: &'static [RecordKind] = &[RecordKind::ActionIntent, RecordKind::ActionResult];
}

/// `action_intent`: a change about to be sent to an agent, durable before
/// it leaves.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionIntent {
    pub action_id: String,
    pub op: String,
    pub args: Value,
    pub dry_run: bool,
    /// The hold's lease, when it has one.
    pub lease_secs: Option<u64>,
    /// A person's own control (no run): who it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// An autoscaler request: where it goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A person's own control: why, as they gave it (the intent says it
    /// before anything leaves, not only the result after).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Payload for ActionIntent {
    const KINDS: &'static [RecordKind] = &[RecordKind::ActionIntent];
}

/// `action_result` of a change sent to an agent: the agent's answer (its
/// fields beyond these in `more`), or why there was none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct ActionResult {
    pub action_id: String,
    pub op: String,
    pub ok: bool,
    /// `applied`, `unchanged`, `released`, `kept`, `refused`, `error`, …
    pub outcome: String,
    pub applied: bool,
    pub dry_run: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the agent says is on the device after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// A person's control: their reason, and who.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// A shadow run's: whether the live run would have acted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_act: Option<bool>,
    /// The rest of the agent's answer (`held`, `before`, …).
    #[serde(flatten)]
    pub more: serde_json::Map<String, Value>,
}

impl Payload for ActionResult {
    const KINDS: &'static [RecordKind] = &[RecordKind::ActionResult];
}

/// `refusal`: a change the engine would not send, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Refusal {
    pub op: String,
    pub code: String,
    pub reason: String,
}

impl Payload for Refusal {
    const KINDS: &'static [RecordKind] = &[RecordKind::Refusal];
}

/// `action_result` written by recovery for an intent whose answer a crash
/// cut off: what the agent says became of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActionReconciled {
    pub action_id: String,
    pub op: String,
    pub reconciled: bool,
    pub agent_status: Value,
}

impl Payload for ActionReconciled {
    const KINDS: &'static [RecordKind] = &[RecordKind::ActionResult];
}

/// `runbook_mode`: a runbook moved between shadow and act (the newest one
/// is the runbook's mode after a restart).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunbookMode {
    pub from: String,
    pub to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Payload for RunbookMode {
    const KINDS: &'static [RecordKind] = &[RecordKind::RunbookMode];
}

/// `fleet_mode`: the whole fleet moved between `act`, `shadow` and
/// `paused` (the newest one is the fleet's mode, after a restart and on
/// every engine of the shard).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FleetMode {
    pub from: String,
    pub to: String,
    pub reason: String,
}

impl Payload for FleetMode {
    const KINDS: &'static [RecordKind] = &[RecordKind::FleetMode];
}

/// `action_result` of an autoscaler request (`op: autoscale`): what the
/// cluster's autoscaler was asked for, and whether it took it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoscaleResult {
    pub action_id: String,
    /// `autoscale`.
    pub op: String,
    pub pool: String,
    /// `out` or `in`.
    pub direction: String,
    pub count: i64,
    pub dry_run: bool,
    pub ok: bool,
    pub applied: bool,
    /// `applied`, `dry_run` or `error`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AutoscaleResult {
    pub const OP: &'static str = "autoscale";

    /// The change to the pool's count of nodes asked for, if applied.
    pub fn applied_change(&self) -> Option<(&str, i64)> {
        self.applied.then(|| (self.pool.as_str(), if self.direction == "in" { -self.count } else { self.count }))
    }
}

impl Payload for AutoscaleResult {
    const KINDS: &'static [RecordKind] = &[RecordKind::ActionResult];
}

/// `engine_started`: what this engine loaded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineStarted {
    pub version: String,
    /// The run and request ids' epoch (ids never repeat across starts).
    pub id_epoch: String,
    pub runbooks: Vec<String>,
    pub runbook_errors: Vec<String>,
    pub nodes: usize,
}

impl Payload for EngineStarted {
    const KINDS: &'static [RecordKind] = &[RecordKind::EngineStarted];
}

/// `approval_requested`: a run waits for a second person.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalRequested {
    pub reason: String,
    pub expires_in_secs: u64,
    pub nodes_changed: u32,
}

impl Payload for ApprovalRequested {
    const KINDS: &'static [RecordKind] = &[RecordKind::ApprovalRequested];
}

/// `config_reloaded`: a reload (SIGHUP, the API), what it changed, or why
/// it was refused (`ok: false`, `error`). The report's fields are in
/// `report`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConfigReloaded {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub report: serde_json::Map<String, Value>,
}

impl Payload for ConfigReloaded {
    const KINDS: &'static [RecordKind] = &[RecordKind::ConfigReloaded];
}

/// `node_annotated`: a node's mark set (`value`) or removed (none) — the
/// marks outlive a restart (`power`: nightshift powered the node up).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeAnnotated {
    pub key: String,
    pub value: Option<String>,
    /// A dry run's: what would have been set, not set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Payload for NodeAnnotated {
    const KINDS: &'static [RecordKind] = &[RecordKind::NodeAnnotated];
}

/// `note`: a line in a run's timeline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Note {
    pub text: String,
    /// The alert that started the run resolved (Alertmanager).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert_resolved: Option<Value>,
    /// A restarted engine resumed the run (the k-th time): it runs its
    /// script again from the top, its holds left in place meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<u32>,
    /// A run of this runbook on this target found nothing to do: the
    /// findings it told about the target are over (the next is told again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings_cleared: Option<bool>,
    /// The run is one node of a shared cause (its runbook's breaker tripped
    /// with `on_trip: reversible_only`): the breaker's reason. From here on
    /// it takes reversible steps only and pages no one itself; a resumed run
    /// reads it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cause: Option<String>,
}

impl Payload for Note {
    const KINDS: &'static [RecordKind] = &[RecordKind::Note];
}

/// `notification` and `escalation`: a text for people, and where it goes
/// (the log at once; each webhook confirmed by a `notification_delivery`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Notice {
    pub text: String,
    /// `info`, `warning` or `escalation`.
    pub severity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<bool>,
    pub delivered_to: Vec<String>,
    pub webhooks: Vec<String>,
    /// A shadow run's: who the live run would have told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_notify: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// This notice ends the page of escalation record `resolves` (its
    /// fault handled, repaired, or taken over by a person): sent to the
    /// targets that page went to, as its resolution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolves: Option<u64>,
    /// A follow-up of escalation record `follows`, still open on the node:
    /// it goes to the person that page reached, never muted by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follows: Option<u64>,
    /// How big the finding is, as the script told it (`notify(text,
    /// size)`, larger is worse): the finding is said again once it grows by
    /// `notifications.worse_by_pct` (rebuilt from this after a restart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<f64>,
}

impl Payload for Notice {
    const KINDS: &'static [RecordKind] = &[RecordKind::Notification, RecordKind::Escalation];
}

/// `notification_delivery`: one webhook's answer to a notification (or to
/// the audit anchor: `kind: audit_anchor`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Delivery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<Value>,
    /// The notification delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub for_seq: Option<u64>,
    /// The anchor's head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchored_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchored_hash: Option<String>,
    pub ok: bool,
    pub attempts: u32,
    pub detail: String,
    /// Not delivered yet: retried until delivered or expired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
    /// Not delivered within `notifications.page_expiry_secs`: given up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undeliverable: Option<bool>,
}

impl Payload for Delivery {
    const KINDS: &'static [RecordKind] = &[RecordKind::NotificationDelivery];
}

/// `approved` / `rejected`: a person's answer to a run waiting for one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Approval {
    pub by: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Payload for Approval {
    const KINDS: &'static [RecordKind] = &[RecordKind::Approved, RecordKind::Rejected];
}

/// `event_dropped`: an event nothing runs for, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventDropped {
    pub reason: String,
}

impl Payload for EventDropped {
    const KINDS: &'static [RecordKind] = &[RecordKind::EventDropped];
}

/// `hands_off`: a person set or cleared the engine's hands-off on a node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HandsOff {
    pub hands_off: bool,
    pub reason: Option<String>,
    /// It ends by itself at this time (and is audited as expired then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
}

impl Payload for HandsOff {
    const KINDS: &'static [RecordKind] = &[RecordKind::HandsOff];
}

/// `maintenance`: a person set a maintenance window (`set`), or it ended
/// (`set: false`: a person ended it, or its end time came). A window makes
/// the nodes it matches hands-off from `starts_ms` to `ends_ms`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Maintenance {
    pub id: String,
    pub set: bool,
    /// Node labels a node must all have (`pool: train`), as set.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub matchers: BTreeMap<String, String>,
    /// Nodes by name, as set (a node matches by name or by labels).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_ms: Option<i64>,
    pub reason: String,
}

impl Payload for Maintenance {
    const KINDS: &'static [RecordKind] = &[RecordKind::Maintenance];
}

/// `evidence_collected`: RMA evidence gathered on the node (`node`,
/// `gpu` of the record): the bundle's id, where it is on the node, its
/// files and the SHA-256 of its manifest; or why it could not be.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvidenceCollected {
    pub bundle: String,
    pub dir: String,
    pub sha256: String,
    pub reason: String,
    /// Each file: name, bytes, sha256 and what went wrong making it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<nightshift_proto::EvidenceFile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Payload for EvidenceCollected {
    const KINDS: &'static [RecordKind] = &[RecordKind::EvidenceCollected];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AuditRecord, NewRecord};

    fn stored(rec: NewRecord) -> AuditRecord {
        AuditRecord { seq: 7, ts_ms: 1, ..rec.unchained() }
    }

    /// What is written is what is read.
    #[test]
    fn a_payload_reads_back_as_written() {
        let p = RunFinished {
            outcome: "succeeded".into(),
            target: Some(Target { node: Some("n1".into()), gpu: Some(2), group: None }),
            starts_cooldown: Some(false),
            holds_left: Some(vec!["n1: drifted".into()]),
            ..Default::default()
        };
        let r = stored(NewRecord::typed(RecordKind::RunFinished, "engine", &p));
        assert_eq!(r.payload::<RunFinished>().unwrap(), p);
        assert_eq!(r.data["starts_cooldown"], false, "the key the chains on disk have");
    }

    /// Records written before the types (keys by hand, some missing, some
    /// null) still read: the replay of an old chain does not change.
    #[test]
    fn records_from_before_the_types_read() {
        let old = |kind, data: Value| stored(NewRecord::new(kind, "engine", data));
        let r = old(
            RecordKind::RunFinished,
            serde_json::json!({"outcome": "refused", "reason": "cooldown", "target": {"node": "n1"}}),
        );
        let p = r.payload::<RunFinished>().unwrap();
        assert_eq!((p.starts_cooldown, p.reason.as_deref()), (None, Some("cooldown")));
        let r = old(
            RecordKind::RunFinished,
            serde_json::json!({"outcome": "failed", "error": null, "note": null, "actions": 2, "target": {"node": "n1"},
                "holds_released": [], "holds_kept": [], "holds_left": [], "starts_cooldown": true}),
        );
        assert_eq!(r.payload::<RunFinished>().unwrap().starts_cooldown, Some(true));
        let r = old(RecordKind::BreakerTripped, serde_json::json!({"reason": "3 nodes in 600 s"}));
        assert_eq!(r.payload::<BreakerTripped>().unwrap().tripped_until_ms, None);
        // A field of the wrong type is an error that says where.
        let r = old(RecordKind::BreakerTripped, serde_json::json!({"tripped_until_ms": "soon"}));
        let e = r.payload::<BreakerTripped>().unwrap_err().to_string();
        assert!(
            e.starts_with("record 7 (breaker_tripped): its payload does not read as expected: invalid type"),
            "{e}"
        );
        // The wrong kind is refused.
        let e = r.payload::<RunFinished>().unwrap_err().to_string();
        assert_eq!(e, "record 7: expected a record of kind run_finished, found breaker_tripped");
    }
}
