//! What agents report about their holds, audited once each: a hold's end
//! (`hold_ended`), a held setting found at its default and applied again
//! (`hold_reapplied`), one not in force (`hold_drifted`) — each on the run
//! that placed the hold. The seen set is rebuilt from the log on start
//! (`runtable.rs`).

use nightshift_proto::EndedHold;
use serde_json::json;

use crate::audit::{NewRecord, RecordKind};
use crate::engine::Engine;
use crate::runstate::runtable::ended_key;

impl Engine {
    /// Run `id` and its runbook, if `id` is a run: from the run table while
    /// it is there or has just left it (a hold ends as its run ends, on
    /// the busiest path), else from the chain — whose reads wait for its
    /// index.
    fn run_and_runbook(&self, id: &str) -> Option<(String, String)> {
        if let Some(rb) = self.core.runs().runbook_of(id) {
            return Some((id.to_string(), rb));
        }
        let r = self.core.audit().run(id).ok().flatten()?;
        Some((r.id, r.runbook))
    }

    /// Audit each hold end an agent reports, once (the agent repeats recent
    /// ends in every telemetry message; the seen set is rebuilt from the
    /// audit log on start). An end on a run's hold goes on that run's page.
    pub(crate) async fn audit_ended_holds(&self, node: &str, ended: &[EndedHold]) {
        let fresh: Vec<&EndedHold> = ended
            .iter()
            .filter(|e| self.core.runs().first_hold_end(ended_key(node, &e.hold.id, e.ended_at_ms)))
            .collect();
        for e in fresh {
            let run = self.run_and_runbook(&e.hold.owner);
            let mut rec = NewRecord::typed(
                RecordKind::HoldEnded,
                &format!("agent:{node}"),
                &crate::audit::data::HoldEnded {
                    hold_id: e.hold.id.clone(),
                    owner: e.hold.owner.clone(),
                    setting: e.hold.setting.to_string(),
                    kind: e.hold.setting.kind().into(),
                    value: e.hold.value.to_string(),
                    reason: e.hold.reason.clone(),
                    placed_at_ms: e.hold.placed_at_ms,
                    expires_at_ms: e.hold.expires_at_ms,
                    ended_at_ms: Some(e.ended_at_ms),
                    how: e.how.as_str().into(),
                    by: e.by.clone(),
                    outcome: json!(e.outcome),
                    now: e.now.to_string(),
                },
            )
            .node(Some(node))
            .gpu(e.hold.setting.gpu());
            if let Some((id, runbook)) = &run {
                rec = rec.run(id).runbook(runbook);
            }
            tracing::info!(node, hold = %e.hold.id, owner = %e.hold.owner, how = e.how.as_str(), outcome = ?e.outcome, "hold ended");
            if let Err(err) = self.core.audit().append(rec, None).await {
                tracing::error!(node, hold = %e.hold.id, error = %err, "cannot audit a hold's end");
            }
        }
    }

    /// Audit, once each, what an agent found reading its held settings
    /// back from the device: a setting back at its default and applied
    /// again (`hold_reapplied`, with the reading), or one not in force
    /// (`hold_drifted`, with what was found) — on the run of the hold's
    /// owner when it is one. The seen set is rebuilt from the log on start.
    pub(crate) async fn audit_holds_not_in_force(&self, node: &str, m: &nightshift_proto::NodeTelemetry) {
        let mut recs: Vec<(String, NewRecord, Vec<String>)> = Vec::new();
        for r in &m.reapplied {
            let key = crate::runstate::runtable::reapplied_key(node, &r.setting.to_string(), r.reapplied.at_ms);
            let payload = crate::audit::data::HoldReapplied {
                setting: r.setting.to_string(),
                kind: r.setting.kind().into(),
                found: r.reapplied.found.to_string(),
                applied: r.reapplied.applied.to_string(),
                at_ms: r.reapplied.at_ms,
                owners: r.owners.clone(),
            };
            let rec = NewRecord::typed(RecordKind::HoldReapplied, &format!("agent:{node}"), &payload)
                .node(Some(node))
                .gpu(r.setting.gpu());
            recs.push((key, rec, r.owners.clone()));
        }
        for d in &m.drifted {
            let key = crate::runstate::runtable::drifted_key(node, &d.setting.to_string(), &d.why);
            let payload = crate::audit::data::HoldDrifted {
                setting: d.setting.to_string(),
                kind: d.setting.kind().into(),
                why: d.why.clone(),
                owners: d.owners.clone(),
            };
            let rec = NewRecord::typed(RecordKind::HoldDrifted, &format!("agent:{node}"), &payload)
                .node(Some(node))
                .gpu(d.setting.gpu());
            recs.push((key, rec, d.owners.clone()));
        }
        for (key, mut rec, owners) in recs {
            if !self.core.runs().first_hold_end(key) {
                continue;
            }
            if let Some((id, runbook)) = owners.iter().find_map(|o| self.run_and_runbook(o)) {
                rec = rec.run(&id).runbook(&runbook);
            }
            tracing::warn!(node, kind = rec.kind.as_str(), setting = %rec.data["setting"], "a held setting was not in force on the device");
            if let Err(err) = self.core.audit().append(rec, None).await {
                tracing::error!(node, error = %err, "cannot audit a held setting's read-back");
            }
        }
    }
}
