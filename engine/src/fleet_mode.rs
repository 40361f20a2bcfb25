//! The whole fleet's switch (act, shadow, paused): read from the chain's
//! newest `fleet_mode` record, changed by an admin with a reason (audited
//! first), taking effect at once — going to act ends the shadow runs in
//! flight — and saying what is still in flight.

use crate::audit::{NewRecord, RecordKind};
use crate::engine::{Engine, EngineError};

impl Engine {
    /// The whole fleet's mode now, with who set it and why (`None`: the
    /// config's `initial_fleet_mode`, nobody set one yet). The chain's
    /// newest `fleet_mode` record decides — on a standby too, and after a
    /// restart or a takeover. Read from the chain again only when a record
    /// of a kind indexed by kind was appended or followed since the last
    /// read (every run asks; the chain's read waits for its index).
    pub(crate) fn fleet_mode(&self) -> crate::runbooks::modes::FleetModeNow {
        let modes = self.core.runbooks().modes();
        // Read before the chain: a record answered after it makes the next
        // call read again.
        let version = self.core.audit().kind_changes();
        if let Some(m) = modes.fleet_read_at(version) {
            return m;
        }
        let m = match self.core.audit().newest_of_kind(RecordKind::FleetMode) {
            Ok(Some(r)) => {
                let reason = r.payload::<crate::audit::data::FleetMode>().map(|p| p.reason).unwrap_or_default();
                (crate::runbooks::modes::FleetMode::of_record(&r), Some((r.actor.clone(), reason)))
            }
            Ok(None) => (self.core.config().initial_fleet_mode, None),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the fleet's mode: taken as in shadow");
                return (crate::runbooks::modes::FleetMode::Shadow, None);
            }
        };
        modes.keep_fleet(version, m.clone());
        m
    }

    /// Put the whole fleet in `mode`, saying why: audited (`fleet_mode`, by
    /// `by`) before it takes effect, for every engine of the shard.
    pub(crate) async fn set_fleet_mode(
        &self,
        mode: crate::runbooks::modes::FleetMode,
        by: &str,
        reason: &str,
    ) -> Result<FleetModeChange, EngineError> {
        if nightshift_proto::names::has_visible_text(reason)
            && let Some(problem) = nightshift_proto::names::free_text_problem("reason", reason)
        {
            return Err(EngineError::BadModeChange(problem));
        }
        if !nightshift_proto::names::has_visible_text(reason) {
            return Err(EngineError::BadModeChange(format!(
                "reason: expected why the fleet goes to {}, found no visible character",
                mode.as_str()
            )));
        }
        let (from, _) = self.fleet_mode();
        if from == mode {
            return Err(EngineError::BadModeChange(format!(
                "the fleet is already in {} mode: expected a change",
                mode.as_str()
            )));
        }
        let payload = crate::audit::data::FleetMode {
            from: from.as_str().into(),
            to: mode.as_str().into(),
            reason: reason.trim().to_string(),
        };
        self.core.audit().append(NewRecord::typed(RecordKind::FleetMode, by, &payload), None).await?;
        tracing::warn!(from = from.as_str(), to = mode.as_str(), by, reason, "fleet mode changed");
        // To act at once: a run in shadow only because the fleet was (its
        // runbook acts) ends now, under who switched, so the real trigger
        // can run on its target; it earns no cooldown.
        let mut ended = Vec::new();
        if mode == crate::runbooks::modes::FleetMode::Act {
            // A fault only shadow runs answered is still pending: offered
            // at the next reading, not after the pause a real run earns.
            self.core.health().repair().forget_pacing();
        }
        if mode == crate::runbooks::modes::FleetMode::Act {
            let shadow_runs: Vec<String> = {
                let t = self.core.runs().table();
                t.entries()
                    .filter(|r| r.summary.shadow && r.summary.trigger != "manual")
                    .filter(|r| self.runbook_mode(&r.summary.runbook) == crate::runbooks::manifest::Mode::Act)
                    .map(|r| r.summary.id.clone())
                    .collect()
            };
            let why =
                format!("the fleet went to act ({}): this shadow run ends so the real one can run", reason.trim());
            for id in shadow_runs {
                match self.cancel_as(&id, by, Some(&why), true).await {
                    Ok(()) => ended.push(id),
                    Err(e) => tracing::warn!(run = %id, error = %e, "a shadow run could not be ended"),
                }
            }
        }
        Ok(FleetModeChange { mode, ended, in_flight: self.in_flight() })
    }

    /// Runs not finished, as `id runbook target state`: what a pause or a
    /// mode change leaves going.
    pub(crate) fn in_flight(&self) -> Vec<String> {
        let t = self.core.runs().table();
        let mut v: Vec<String> = t
            .entries()
            .map(|r| {
                let kind = if r.summary.shadow { " (shadow)" } else { "" };
                format!(
                    "{} {} {} {}{kind}",
                    r.summary.id,
                    r.summary.runbook,
                    r.summary.target,
                    r.summary.state.as_str()
                )
            })
            .collect();
        v.sort();
        v
    }
}

/// What a fleet mode change did: the mode now, the shadow runs it ended
/// (going to act), and the runs still in flight (`id runbook target
/// state`) — a pause stops new runs, not these.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FleetModeChange {
    pub mode: crate::runbooks::modes::FleetMode,
    pub ended: Vec<String>,
    pub in_flight: Vec<String>,
}
