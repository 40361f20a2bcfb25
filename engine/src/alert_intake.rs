//! An Alertmanager alert after its receipt is durable: a resolution is
//! noted on the runs its episode started; a firing alert is checked (its
//! host a node of the fleet, not chosen by a job's label, not from the
//! future) and offered to every runbook that takes it — and one that no
//! runbook takes is audited as dropped, saying why (invariant 12: nothing
//! accepted is silently ignored).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::audit::data::AlertReceived;
use crate::audit::{NewRecord, RecordKind};
use crate::engine::{Engine, EngineError, RunRequest};
use crate::runbooks::manifest::Scope;
use crate::runs::Target;
use crate::signals::alerts::Alert;

impl Engine {
    /// What an alert leads to, once its `event_received` is on the chain;
    /// then `event_handled`, so a recovery does not handle it again.
    pub(crate) async fn handle_alert(&self, a: Alert, poster: &str) {
        self.act_on_alert(&a, poster).await;
        let rec = NewRecord::typed(
            RecordKind::EventHandled,
            "engine",
            &crate::audit::data::EventHandled {
                source: AlertReceived::SOURCE.into(),
                key: crate::runstate::runtable::alert_key(&a.status, &a.key()),
            },
        );
        if let Err(e) = self.core.audit().append_ordered(rec, None) {
            tracing::error!(error = %e, "cannot audit an alert's handling");
        }
    }

    /// Put an alert's resolution on the runs its episode started (the run
    /// page and the audit then show when the condition cleared, whatever
    /// the run's own outcome).
    fn note_resolved(&self, a: &Alert, node: &str, actor: &str) {
        let filter = crate::audit::RunFilter {
            node: Some(node.to_string()),
            since_ms: Some(a.starts_at_ms().saturating_sub(60_000)),
            limit: Some(200),
            ..Default::default()
        };
        let runs = match self.core.audit().runs(&filter) {
            Ok(p) => p.runs,
            Err(e) => {
                tracing::error!(error = %e, "cannot look up the runs of a resolved alert");
                return;
            }
        };
        let resolved_at = if a.ends_at.starts_with("0001-") { None } else { Some(a.ends_at.clone()) };
        for r in runs.iter().filter(|r| {
            r.event.get("fingerprint").and_then(Value::as_str) == Some(a.fingerprint.as_str())
                && r.event.get("starts_at").and_then(Value::as_str) == Some(a.starts_at.as_str())
        }) {
            let text = format!(
                "alert {} resolved{} (Alertmanager){}",
                a.name(),
                resolved_at.as_deref().map(|t| format!(" at {t}")).unwrap_or_default(),
                if r.outcome.is_none() { "; the run goes on until its own steps end" } else { "" }
            );
            let rec = NewRecord::typed(
                RecordKind::Note,
                actor,
                &crate::audit::data::Note {
                    text,
                    alert_resolved: Some(json!({"alertname": a.name(), "fingerprint": a.fingerprint,
                        "starts_at": a.starts_at, "ends_at": resolved_at})),
                    ..Default::default()
                },
            )
            .run(&r.id)
            .node(Some(node));
            if let Err(e) = self.core.audit().append_ordered(rec, None) {
                tracing::error!(error = %e, run = %r.id, "cannot audit an alert's resolution on its run");
            }
        }
    }

    async fn act_on_alert(&self, a: &Alert, poster: &str) {
        let a = a.clone();
        let host = a.host();
        let node = host.as_deref().and_then(|h| self.core.fleet().get(h));
        let actor = format!("alertmanager:{poster}");
        if a.status == "resolved" {
            // An episode (fingerprint, startsAt) resolved — not the alert
            // for ever: its next firing has a new startsAt and runs again.
            let now = self.core.now();
            self.core.runs().resolve_episode(crate::runstate::runtable::episode(&a.fingerprint, &a.starts_at), now);
            if let Some(node) = &node {
                self.note_resolved(&a, &node.spec.name, &actor);
            }
            return;
        }
        // A host label is data: checked against the fleet's charset before
        // it goes anywhere (a lookup, a reason on a page).
        if let Some(h) = &host
            && let Err(why) = nightshift_proto::names::check_node_name(h)
        {
            self.core.counters().add(crate::base::counters::Count::AlertsUnknownNode, 1);
            let reason = format!("alert {}: its host label is no node name: {why}; not acted on", a.name());
            if let Err(e) = self.drop_event(&reason, None).await {
                tracing::error!(error = %e, "cannot audit a dropped alert");
            }
            return;
        }
        let Some(node) = node else {
            self.core.counters().add(crate::base::counters::Count::AlertsUnknownNode, 1);
            let reason =
                format!("alert {} names host {:?}, which is not in the inventory", a.name(), host.unwrap_or_default());
            if let Err(e) = self.drop_event(&reason, None).await {
                tracing::error!(error = %e, "cannot audit a dropped alert");
            }
            return;
        };
        // Labels a job writes cannot choose a node (issue 46 point 10): a
        // job's metrics may carry any `Hostname`, but `instance` is the
        // scrape target Prometheus set. Both naming nodes, and different
        // ones: the alert is not acted on.
        if let Some(src) = a.instance_host()
            && let Some(from) = self.core.fleet().by_source(&src)
            && from.spec.name != node.spec.name
        {
            let reason = format!(
                "alert {} names host {:?} but was scraped from {} (instance {:?}): a label a job writes cannot \
                 choose a node; not acted on — drop the job's own Hostname label (honor_labels: false, or a \
                 metric_relabel_configs rule)",
                a.name(),
                node.spec.name,
                from.spec.name,
                a.labels.get("instance").map(String::as_str).unwrap_or("")
            );
            if let Err(e) = self.drop_event(&reason, Some(&from.spec.name)).await {
                tracing::error!(error = %e, "cannot audit a dropped alert");
            }
            return;
        }
        // An alert from the future is never stale (its age is negative):
        // beyond any clock skew, it is refused.
        let ahead_ms = a.starts_at_ms().saturating_sub(self.core.now());
        if ahead_ms > MAX_ALERT_FUTURE_MS {
            let reason = format!(
                "alert {} starts at {}, {} s ahead of this engine's clock: expected at most {} s ahead (clock \
                 skew); not acted on — check the clocks of Prometheus, Alertmanager and this engine",
                a.name(),
                a.starts_at,
                ahead_ms / 1000,
                MAX_ALERT_FUTURE_MS / 1000
            );
            if let Err(e) = self.drop_event(&reason, Some(&node.spec.name)).await {
                tracing::error!(error = %e, "cannot audit a dropped alert");
            }
            return;
        }
        let set = self.runbook_set();
        // Runbooks that take this alertname, and whether any was offered
        // the alert (or said why not): one nobody takes is audited.
        let mut named: Vec<&str> = Vec::new();
        let mut accounted = false;
        for rb in &set.runbooks {
            if !rb.manifest.alerts().any(|(name, _)| name == a.name()) {
                continue;
            }
            named.push(&rb.manifest.name);
            self.core.counters().alert_evaluated(&rb.manifest.name);
            let labels_match =
                |m: &std::collections::BTreeMap<String, String>| m.iter().all(|(k, v)| a.labels.get(k) == Some(v));
            if !rb.manifest.alerts().any(|(name, m)| name == a.name() && labels_match(m)) {
                continue;
            }
            if !self.selector_matches(rb, &node) {
                continue;
            }
            accounted = true;
            let gpu = match a.gpu_label() {
                Ok(g) => g,
                Err(why) => {
                    let reason = format!("alert {} on {}: {why}", a.name(), node.spec.name);
                    if let Err(e) = self.drop_event(&reason, Some(&node.spec.name)).await {
                        tracing::error!(error = %e, "cannot audit a dropped alert");
                    }
                    return;
                }
            };
            let target = match (rb.manifest.scope, gpu) {
                (Scope::Gpu, Some(g)) => Target::gpu(&node.spec.name, g),
                (Scope::Gpu, None) => {
                    let reason =
                        format!("alert {} has no gpu label but runbook {} acts on a GPU", a.name(), rb.manifest.name);
                    if let Err(e) = self.drop_event(&reason, Some(&node.spec.name)).await {
                        tracing::error!(error = %e, "cannot audit a dropped alert");
                    }
                    continue;
                }
                _ => Target::node(&node.spec.name),
            };
            let req = RunRequest {
                runbook: rb.manifest.name.clone(),
                target,
                trigger: "alert".into(),
                detail: format!(
                    "alert {} on {}{}",
                    a.name(),
                    node.spec.name,
                    a.annotations.get("summary").map(|s| format!(": {s}")).unwrap_or_default()
                ),
                event: json!({
                    "kind": "alert",
                    "alertname": a.name(),
                    "fingerprint": a.fingerprint,
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "starts_at": a.starts_at,
                    "posted_by": actor,
                }),
                event_ts_ms: a.starts_at_ms(),
                params: BTreeMap::new(),
                dry_run: false,
                requested_by: actor.clone(),
            };
            match self.submit_inner(req, None).await {
                // Refused as asked (a GPU past the node's, a bad param): on
                // the chain with why, not only in the log.
                Err(e @ (EngineError::BadTarget(_) | EngineError::BadParams(_))) => {
                    let reason =
                        format!("alert {} on {} not run by {}: {e}", a.name(), node.spec.name, rb.manifest.name);
                    if let Err(e) = self.drop_event(&reason, Some(&node.spec.name)).await {
                        tracing::error!(error = %e, "cannot audit a dropped alert");
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot submit an alert run"),
                Ok(_) => {}
            }
        }
        if !accounted {
            let reason = if named.is_empty() {
                let mut taken: Vec<&str> =
                    set.runbooks.iter().flat_map(|rb| rb.manifest.alerts().map(|(name, _)| name)).collect();
                taken.sort_unstable();
                taken.dedup();
                format!(
                    "alert {} on {}: no loaded runbook takes it (the runbooks take {}); not acted on",
                    a.name(),
                    node.spec.name,
                    if taken.is_empty() { "no alert".to_string() } else { taken.join(", ") }
                )
            } else {
                format!(
                    "alert {} on {}: {} take(s) {} but not with its labels or not on this node (label matchers, \
                     selector); not acted on",
                    a.name(),
                    node.spec.name,
                    named.join(", "),
                    a.name()
                )
            };
            if let Err(e) = self.drop_event(&reason, Some(&node.spec.name)).await {
                tracing::error!(error = %e, "cannot audit a dropped alert");
            }
        }
    }
}

/// How far ahead of the engine's clock an alert's `startsAt` may be (clock
/// skew between Prometheus, Alertmanager and the engine).
pub const MAX_ALERT_FUTURE_MS: i64 = 3_600_000;
