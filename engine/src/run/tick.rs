//! The periodic tick (approval expiry, stale nodes, hands-off that ended,
//! fleet triggers, schedules, releases retried); `Engine::tick` in
//! `engine.rs` runs it. The queue's counters (running, busy, queue depth)
//! are the façade's, in `engine.rs`.

use std::collections::BTreeMap;

use serde_json::json;

use crate::engine::{Engine, RunRequest};
use crate::runbooks::manifest::Trigger;
use crate::runs::{RunOutcome, RunState, RunSummary, Target};

impl Engine {
    pub(crate) async fn tick_inner(&self) {
        self.expire_hands_off().await;
        self.apply_windows().await;
        self.retry_pages().await;
        let now = self.core.now();
        let expired: Vec<String> = self
            .core
            .runs()
            .table()
            .entries()
            .filter(|r| r.summary.state == RunState::PendingApproval && r.approval_deadline_ms <= now)
            .map(|r| r.summary.id.clone())
            .collect();
        for id in expired {
            if let Err(e) = self
                .finish(&id, RunOutcome::Cancelled, Some("approval expired: nobody approved it in time".into()), None)
                .await
            {
                tracing::error!(run = %id, error = %e, "cannot expire an approval");
            }
        }
        let stale_ms = (self.core.config().telemetry.stale_after_secs as i64).saturating_mul(1000);
        for n in self.core.fleet().nodes().iter() {
            let mut st = n.state();
            if st.connected && now.saturating_sub(st.last_seen_ms) > stale_ms {
                st.connected = false;
            }
        }
        self.fleet_triggers(now).await;
        self.schedules(now).await;
        self.health_tick(now).await;
        self.retry_releases().await;
        self.pump().await;
    }

    /// Releases finished runs could not make: again, once their node is no
    /// longer hands-off and its agent answers.
    async fn retry_releases(&self) {
        let due: Vec<(RunSummary, String)> = {
            let fleet = &self.core.fleet();
            self.core.runs().table().releases_due(|node| {
                fleet.get(node).is_none_or(|n| {
                    let st = n.state();
                    st.connected && !st.hands_off()
                })
            })
        };
        if due.is_empty() {
            return;
        }
        for (s, node) in due {
            if self.core.fleet().get(&node).is_none() {
                continue;
            }
            if let Err(e) = self.core.release_run_holds(&s, &node).await {
                tracing::warn!(run = %s.id, node = %node, error = %e, "holds still not released: trying again");
                self.core.runs().table().release_later(s, node);
            }
        }
    }

    async fn schedules(&self, now: i64) {
        let set = self.runbook_set();
        for rb in &set.runbooks {
            let Trigger::Schedule { every_secs } = rb.manifest.trigger else { continue };
            let every_ms = (every_secs as i64).saturating_mul(1000);
            let due = { self.core.runs().table().schedule_due(&rb.manifest.name, now, every_ms) };
            if !due {
                continue;
            }
            for n in self.core.fleet().nodes().iter().cloned() {
                if !self.selector_matches(rb, &n) || !n.state().connected {
                    continue;
                }
                let req = RunRequest {
                    runbook: rb.manifest.name.clone(),
                    target: Target::node(&n.spec.name),
                    trigger: "schedule".into(),
                    detail: format!("scheduled every {every_secs} s"),
                    event: json!({"kind": "schedule", "every_secs": every_secs}),
                    event_ts_ms: now,
                    params: BTreeMap::new(),
                    dry_run: false,
                    requested_by: "engine".into(),
                };
                if let Err(e) = self.submit_inner(req, None).await {
                    tracing::error!(runbook = %rb.manifest.name, error = %e, "cannot submit a scheduled run");
                }
            }
        }
    }
}
