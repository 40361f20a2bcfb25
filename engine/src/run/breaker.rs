//! A runbook's storm breaker: more distinct targets firing within its
//! window than `max_targets` is one shared cause, not that many broken
//! targets. It is judged in the queue's pump once the first fire's hold is
//! over (so every node that fired with it is seen), recorded, and paged
//! once, naming the nodes and the labels they share. Then, by the
//! manifest's `on_trip`, the storm's runs are either refused before their
//! scripts start (`refuse`: a stall or XID storm, where a drain or requeue
//! per node only moves the cause around), or go on with reversible steps
//! only (`reversible_only`: a rack's cooling failing, where every GPU still
//! needs its power cap). A run of such a storm is marked — durably, a note
//! on the run that a resumed run reads back — and the host refuses its
//! drains, requeues and power-offs (`host::takes_capacity`) and keeps its
//! pages as notes.

use std::collections::BTreeSet;

use crate::audit::{AuditRecord, NewRecord, RecordKind, data};
use crate::core::Core;
use crate::engine::Engine;
use crate::runbooks::manifest::{BreakerCount, OnTrip};
use crate::runbooks::runbook::RunbookSet;
use crate::runs::{RunOutcome, RunSummary};
use crate::runstate::runtable::{RunTable, SharedCause};

/// A breaker that tripped in this pass of the pump, to record and page.
pub(super) struct Trip {
    runbook: String,
    reason: String,
    until: i64,
    on_trip: OnTrip,
    /// An observe row's storm is told (a notification), an acting row's
    /// paged: a finding on many nodes is still a finding, not an alarm.
    observe: bool,
    /// Runs of a `reversible_only` storm marked now: each gets its note.
    marked: Vec<RunSummary>,
    /// The storm's nodes.
    nodes: BTreeSet<String>,
    /// What kind of symptom ([`symptom_of`]).
    symptom: String,
}

impl Trip {
    /// Whether this trip refuses the queued runs of `runbook`.
    pub(super) fn refuses(&self, runbook: &str) -> bool {
        self.runbook == runbook && self.on_trip == OnTrip::Refuse
    }
}

impl Engine {
    /// Trip every breaker whose storm is seen whole now (under the run
    /// table's lock, before the pump picks a run): a `reversible_only`
    /// storm's active runs are marked at once.
    pub(super) fn judge_breakers(&self, t: &mut RunTable, set: &RunbookSet, now: i64) -> Vec<Trip> {
        let mut trips = Vec::new();
        for rb in &set.runbooks {
            let Some(b) = &rb.manifest.breaker else { continue };
            let name = &rb.manifest.name;
            let window_ms = (b.window_secs as i64).saturating_mul(1000);
            // The storm is judged once its first fire's hold is over, so
            // every node that fired with it is seen.
            let held_over = t.queued_entries().any(|r| r.summary.runbook == *name && r.not_before_ms <= now);
            let Some(br) = t.breaker_mut(name) else { continue };
            let distinct = br.distinct(now, window_ms, b.count);
            if distinct as u32 <= b.max_targets || br.tripped_until > now || !held_over {
                continue;
            }
            br.tripped_until = now.saturating_add(window_ms);
            let what = match b.count {
                BreakerCount::Nodes => "nodes",
                BreakerCount::Gpus => "GPUs",
            };
            let nodes: BTreeSet<String> = br.fires.iter().map(|f| f.node.clone()).collect();
            let reason = format!(
                "breaker tripped: {distinct} {what} fired within {} s (max_targets {}): one shared cause, not {distinct} broken {what} — {}",
                b.window_secs,
                b.max_targets,
                self.shared_by(&nodes)
            );
            br.reason = reason.clone();
            let until = br.tripped_until;
            let mut marked = Vec::new();
            if b.on_trip == OnTrip::ReversibleOnly {
                for r in t.entries_mut() {
                    if r.summary.runbook == *name && joins(&r.summary) && r.shared_cause.is_none() {
                        r.shared_cause = Some(reason.clone());
                        marked.push(r.summary.clone());
                    }
                }
            }
            let observe = rb.manifest.class == crate::runbooks::manifest::RunClass::Observe;
            let symptom = symptom_of(&rb.manifest);
            trips.push(Trip {
                runbook: name.clone(),
                reason,
                until,
                on_trip: b.on_trip,
                observe,
                marked,
                nodes,
                symptom,
            });
        }
        trips
    }

    /// The nodes of a storm and what they have in common: every label
    /// they all carry with one value (`rack=r12`, `storage=nfs-a`) — where
    /// a person looks first.
    fn shared_by(&self, nodes: &BTreeSet<String>) -> String {
        let labels: Vec<std::collections::BTreeMap<String, String>> =
            nodes.iter().filter_map(|n| self.core.fleet().get(n)).map(|n| n.spec.labels.clone()).collect();
        let common: Vec<String> = labels
            .first()
            .map(|first| {
                first
                    .iter()
                    .filter(|(k, v)| labels.iter().all(|l| l.get(*k) == Some(*v)))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect()
            })
            .unwrap_or_default();
        // A page names twenty nodes at most: a fleet-wide storm is counted.
        let mut listed = nodes.iter().take(20).cloned().collect::<Vec<_>>().join(", ");
        if nodes.len() > 20 {
            listed.push_str(&format!(" and {} more", nodes.len() - 20));
        }
        if common.is_empty() {
            format!("nodes {listed}, with no label in common")
        } else {
            format!("nodes {listed}, all with {}", common.join(", "))
        }
    }

    /// Record a trip and say it once — a page, or for an observe row a
    /// notification: the held runs of a refusing breaker are refused; the
    /// marked runs of a reversible-only one are told.
    pub(super) async fn trip_breaker(&self, trip: Trip) {
        let Trip { runbook, reason, until, on_trip, observe, marked, nodes, symptom } = trip;
        let runbook = runbook.as_str();
        let tripped = self
            .core
            .audit()
            .append(
                NewRecord::typed(
                    RecordKind::BreakerTripped,
                    "engine",
                    &data::BreakerTripped {
                        reason: reason.clone(),
                        tripped_until_ms: Some(until),
                        nodes: nodes.iter().cloned().collect(),
                        symptom: Some(symptom.clone()),
                    },
                )
                .runbook(runbook),
                None,
            )
            .await;
        // A storm of the same kind over mostly the nodes of one told about
        // within `notifications.shared_cause_secs` is the same shared cause
        // (the trend runbook saw the rack's cooling fail, now the
        // over-temperature one does): recorded, not said again.
        let remembered_ms = (self.core.config().notifications.shared_cause_secs as i64).saturating_mul(1000);
        let now_told = tripped.as_ref().ok().map(|r| SharedCause {
            seq: r.seq,
            ts_ms: r.ts_ms,
            runbook: runbook.to_string(),
            symptom: symptom.clone(),
            nodes: nodes.clone(),
        });
        let since = self.core.now().saturating_sub(remembered_ms);
        let told = self.core.runs().shared_cause(&nodes, &symptom, since, now_told).filter(|_| remembered_ms > 0);
        if let Err(e) = tripped {
            tracing::error!(error = %e, "cannot audit a breaker trip");
        }
        let text = match on_trip {
            OnTrip::Refuse => {
                let held: Vec<String> = {
                    let t = self.core.runs().table();
                    t.queued_entries().filter(|r| r.summary.runbook == runbook).map(|r| r.summary.id.clone()).collect()
                };
                for id in &held {
                    if let Err(e) = self.finish(id, RunOutcome::Refused, Some(reason.clone()), None).await {
                        tracing::error!(run = %id, error = %e, "cannot refuse a held run");
                    }
                }
                if observe {
                    format!("{runbook}: {reason}; told once here, not by each node ({} runs held back)", held.len())
                } else {
                    format!("{runbook}: {reason}; {} held runs refused", held.len())
                }
            }
            OnTrip::ReversibleOnly => {
                for s in &marked {
                    if let Err(e) = self.core.record_run(RecordKind::Note, s, &note(reason.clone())).await {
                        tracing::error!(run = %s.id, error = %e, "cannot mark a run of a shared cause");
                    }
                }
                if observe {
                    format!(
                        "{runbook}: {reason}; told once here, not by each node: each run's finding is a note on its run"
                    )
                } else {
                    format!(
                        "{runbook}: {reason}; its runs go on with reversible steps only (power caps, fans, config rollbacks): no node is drained, no job requeued and no node paged on its own for it"
                    )
                }
            }
        };
        if let Some(c) = told {
            let text = format!(
                "already {} as one shared cause (audit #{}, {}'s breaker), not again: {text}",
                if observe { "told" } else { "paged" },
                c.seq,
                c.runbook
            );
            tracing::warn!(runbook, reason, told = c.seq, "breaker tripped on a shared cause already told");
            let rec = NewRecord::typed(RecordKind::Note, "engine", &data::Note { text, ..Default::default() })
                .runbook(runbook);
            if let Err(e) = self.core.audit().append(rec, None).await {
                tracing::error!(error = %e, "cannot audit a breaker's note");
            }
            return;
        }
        let (kind, severity) =
            if observe { (RecordKind::Notification, "warning") } else { (RecordKind::Escalation, "escalation") };
        let rec = self
            .core
            .notice_record(
                kind,
                &text,
                severity,
                false,
                self.runbook_mode(runbook) == crate::runbooks::manifest::Mode::Shadow,
            )
            .runbook(runbook);
        tracing::warn!(runbook, reason, "breaker tripped");
        match self.core.audit().append(rec, None).await {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(error = %e, "cannot audit a breaker's notice"),
        }
    }
}

/// What kind of symptom a runbook's storm is: the temperature rows (H1–H3)
/// are one kind — a rack's cooling failing is seen by the over-temperature,
/// trend and drift runbooks alike —, any other row its own, a runbook
/// outside the handbook only itself.
pub(crate) fn symptom_of(m: &crate::runbooks::manifest::Manifest) -> String {
    match m.handbook.as_deref() {
        Some(h) if h.split('/').all(|r| matches!(r.trim(), "H1" | "H2" | "H3")) => "temperature".into(),
        Some(h) => h.to_string(),
        None => format!("runbook {}", m.name),
    }
}

/// The note that marks a run as one node of a shared cause.
pub(crate) fn note(reason: String) -> data::Note {
    data::Note {
        text: format!(
            "one node of a shared cause ({reason}): from here on this run takes reversible steps only and pages no one itself"
        ),
        shared_cause: Some(reason),
        ..Default::default()
    }
}

/// The shared cause a run's records say it belongs to (a resumed run keeps
/// its mark).
pub(crate) fn from_records(records: &[AuditRecord]) -> Option<String> {
    records.iter().filter(|r| r.kind == RecordKind::Note).find_map(|r| r.payload::<data::Note>().ok()?.shared_cause)
}

/// Whether a run of a reversible-only storm is one of its nodes: an
/// automatic run, real or in shadow (a shadow run meets the breaker as a
/// real one would); never a person's manual run.
pub(crate) fn joins(s: &RunSummary) -> bool {
    s.trigger != "manual" && (!s.dry_run || s.shadow)
}

/// The shared cause a run rebuilt after a restart belongs to: its own note
/// or — the engine stopped between the trip and the note — its runbook's
/// reversible-only breaker, still open (rebuilt from `breaker_tripped`).
pub(crate) fn after_restart(
    t: &RunTable,
    m: &crate::runbooks::manifest::Manifest,
    s: &RunSummary,
    records: &[AuditRecord],
    now: i64,
) -> Option<String> {
    from_records(records).or_else(|| {
        m.breaker.as_ref().filter(|b| b.on_trip == OnTrip::ReversibleOnly)?;
        let br = t.breaker(&m.name).filter(|br| br.tripped_until > now)?;
        joins(s).then(|| br.reason.clone())
    })
}

#[cfg(test)]
mod tests {
    use nightshift_proto::{DrainArgs, Op, PowerNodeArgs, RequeueArgs, SetGpuDrainArgs, SetPowerLimitArgs};

    use crate::host::takes_capacity;

    use super::*;

    /// The temperature rows are one kind of symptom; any other row its own;
    /// a runbook outside the handbook only itself.
    #[test]
    fn the_temperature_rows_are_one_kind_of_symptom() {
        for (handbook, want) in [
            ("handbook: H1/H2\n", "temperature"),
            ("handbook: H3\n", "temperature"),
            ("handbook: H5\n", "H5"),
            ("handbook: H8\n", "H8"),
            ("", "runbook rb"),
        ] {
            let m = crate::runbooks::manifest::Manifest::parse(
                &format!("version: 1\nname: rb\n{handbook}description: d\nscript: rb.rhai\ntrigger:\n  type: manual\nscope: node\n"),
                std::path::Path::new("rb.yaml"),
            )
            .expect("a manifest");
            assert_eq!(symptom_of(&m), want, "{handbook}");
        }
    }

    /// Who is one of a storm's nodes: automatic runs, real or in shadow;
    /// never a person's manual run, nor a person's dry run.
    #[test]
    fn a_storm_takes_the_automatic_runs_not_a_persons() {
        let summary = |trigger: &str, dry_run, shadow| {
            let mut s: RunSummary = serde_json::from_value(serde_json::json!({
                "id": "r1", "runbook": "rb", "target": {"node": "n1"}, "trigger": trigger,
                "state": "queued", "created_ms": 0, "dry_run": dry_run, "event": {},
                "requested_by": "engine", "params": {}, "detail": "", "why": "", "actions": 0,
            }))
            .unwrap();
            s.shadow = shadow;
            s
        };
        for (trigger, dry_run, shadow, joins_it) in [
            ("telemetry", false, false, true),
            ("alert", false, false, true),
            ("telemetry", true, true, true),
            ("manual", false, false, false),
            ("manual", true, false, false),
        ] {
            assert_eq!(
                joins(&summary(trigger, dry_run, shadow)),
                joins_it,
                "{trigger} dry_run={dry_run} shadow={shadow}"
            );
        }
    }

    #[test]
    fn a_shared_cause_keeps_the_reversible_steps() {
        let gpu_drain = |drained| SetGpuDrainArgs { gpu: 0, drained, sticky: false, repair: false };
        let cases: Vec<(Op, bool)> = vec![
            (Op::Drain(DrainArgs { reason: "r".into(), run: None, sticky: false, repair: false }), true),
            (Op::Requeue(RequeueArgs { reason: "r".into(), gpu: None }), true),
            (Op::SetGpuDrain(gpu_drain(true)), true),
            (Op::SetGpuDrain(gpu_drain(false)), false),
            (Op::PowerNode(PowerNodeArgs { node: "n".into(), up: false }), true),
            (Op::PowerNode(PowerNodeArgs { node: "n".into(), up: true }), false),
            (Op::SetPowerLimit(SetPowerLimitArgs { gpu: 0, watts: 500.0 }), false),
        ];
        for (op, takes) in cases {
            assert_eq!(takes_capacity(&op), takes, "{}", op.name());
        }
    }
}
