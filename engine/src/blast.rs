//! The blast radius: how many serving nodes nightshift may have drained at
//! once (`max_drained_pct` of the serving fleet, at least one: its own
//! budget, counted over its own drains and those in flight — never
//! people's, nor a node out for a confirmed hardware fault: that is not a
//! guess), and how many nodes of one group may be out of service
//! (`max_per_group` per label value: every node out counts, whoever took
//! it out — a group's capacity does not care). Never in the way of a
//! confirmed fault's quarantine (the breaker stops storms at admission).

use std::collections::HashSet;
use std::sync::Arc;

use crate::core::Core;
use crate::fleet::Node;
use crate::health::HealthState;
use crate::runbooks::manifest::BlastRadius;

impl Core {
    /// Reserve a drain under the blast radius, or say why not.
    ///
    /// The limits count the serving fleet: standby nodes (spare capacity) are
    /// neither counted nor limited. At least one serving node may always be
    /// drained, however small the fleet. People's drains do not spend the
    /// budget, nor do nodes out for a confirmed fault (a GPU the health
    /// model holds quarantined, awaiting repair, verifying or for RMA: it
    /// would be out under any policy). A `confirmed` fault's drain (hardware evidence the health
    /// model holds) is never refused: a storm of false positives is the
    /// breaker's to stop, at admission; a GPU off the bus must go.
    /// `Ok(true)` when this call reserved the drain (release it with
    /// [`Core::release_drain`]); `Ok(false)` when the node needs none (it is
    /// a standby, already drained, or another run's drain is in flight).
    pub fn reserve_drain(&self, run: &str, node: &str, rb: &BlastRadius, confirmed: bool) -> Result<bool, String> {
        self.drain_under_radius(run, node, rb, true, confirmed)
    }

    /// Whether a drain would pass the blast radius now, reserving nothing
    /// (a shadow run's check).
    pub fn check_drain(&self, run: &str, node: &str, rb: &BlastRadius, confirmed: bool) -> Result<(), String> {
        self.drain_under_radius(run, node, rb, false, confirmed).map(|_| ())
    }

    fn drain_under_radius(
        &self,
        run: &str,
        node: &str,
        rb: &BlastRadius,
        reserve: bool,
        confirmed: bool,
    ) -> Result<bool, String> {
        let Some(target) = self.fleet().get(node) else { return Ok(false) };
        if target.spec.standby || target.state().drained {
            return Ok(false);
        }
        // Out for a confirmed fault: not nightshift's guess (read before
        // the run table's lock).
        let confirmed_out: HashSet<String> = {
            let h = self.health().model();
            self.fleet()
                .nodes()
                .iter()
                .filter(|n| !matches!(h.node_state(&n.spec.name), HealthState::Healthy | HealthState::Faulted))
                .map(|n| n.spec.name.clone())
                .collect()
        };
        let mut t = self.runs().table();
        let all = self.fleet().nodes();
        let serving: Vec<&Arc<Node>> = all.iter().filter(|n| !n.spec.standby).collect();
        let total = serving.len().max(1);
        let by_people = serving.iter().filter(|n| n.state().drained_by_person()).count();
        let mut drained: HashSet<String> = serving
            .iter()
            .filter(|n| n.state().drained && !n.state().drained_by_person())
            .map(|n| n.spec.name.clone())
            .collect();
        drained.extend(t.drains_in_flight().cloned());
        // This node is being drained already (another run's drain in
        // flight): it is out once, not twice.
        if drained.contains(node) {
            return Ok(false);
        }
        if confirmed {
            if reserve {
                t.reserve_drain(node);
            }
            return Ok(reserve);
        }
        let guesses = drained.iter().filter(|d| !confirmed_out.contains(*d)).count();
        let confirmed_note = if guesses < drained.len() {
            format!(" ({} more out for a confirmed fault, not counted)", drained.len() - guesses)
        } else {
            String::new()
        };
        let after = guesses + 1;
        let cap_pct = rb.max_drained_pct.min(self.config().limits.max_drained_pct);
        let allowed = ((total as f64 * cap_pct / 100.0).floor() as usize).max(1);
        if after > allowed {
            let people = if by_people > 0 {
                format!(" ({by_people} more drained by people, not counted)")
            } else {
                String::new()
            };
            return Err(format!(
                "blast radius: draining {node} would take {after} of {total} serving nodes out by nightshift{people}{confirmed_note}; max_drained_pct {cap_pct}% allows {allowed} (run {run})"
            ));
        }
        if let (Some(limit), Some(label)) = (rb.max_per_group, &rb.group_by)
            && let Some(v) = target.label(label)
        {
            // Out of service in the group: nightshift's drains and those in
            // flight, and people's.
            let ours =
                drained.iter().filter(|d| self.fleet().get(d).is_some_and(|n| n.label(label) == Some(v))).count();
            let people = serving
                .iter()
                .filter(|n| n.label(label) == Some(v) && n.state().drained_by_person())
                .filter(|n| !drained.contains(&n.spec.name))
                .count();
            let out = ours + people;
            if out as u32 >= limit {
                let whose = if people > 0 { format!(" ({people} drained by people)") } else { String::new() };
                return Err(format!(
                    "blast radius: {out} node(s) with {label}={v} already out of service{whose} (max_per_group {limit}); not draining {node} (run {run})"
                ));
            }
        }
        if reserve {
            t.reserve_drain(node);
        }
        Ok(reserve)
    }

    pub fn release_drain(&self, node: &str) {
        self.runs().table().drain_ended(node);
    }
}
