//! Notification delivery: `notify`, `escalate`, approval requests and
//! breaker trips go to the configured webhooks — nightshift's own JSON
//! (`generic`) or a Slack incoming-webhook body (`slack`) — with a timeout
//! and retries (1 s, 2 s, 4 s … between tries). Every delivery ends in a
//! `notification_delivery` audit record naming the target (never its URL:
//! Slack webhook URLs are secrets), the tries and the result.

use std::time::Duration;

use serde_json::{Value, json};

use crate::audit::{AuditRecord, RecordKind};
use crate::config::{NotificationsConfig, WebhookFormat, WebhookTarget};

/// The configured targets and one HTTP client for them.
#[derive(Debug, Clone)]
pub struct Notifier {
    targets: Vec<WebhookTarget>,
    http: reqwest::Client,
}

/// How one delivery went.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub ok: bool,
    pub attempts: u32,
    /// `HTTP 200`, or the last error (without the URL).
    pub detail: String,
}

impl Notifier {
    pub fn new(cfg: &NotificationsConfig) -> Notifier {
        // Never follow a redirect: a 307 to an internal URL would get the
        // body posted there while the audit said where it was meant to go.
        // A redirect is the delivery's answer, audited as such (not 2xx:
        // a failure).
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Notifier { targets: cfg.webhooks.clone(), http }
    }

    /// Targets for a record of this kind.
    pub fn targets_for(&self, kind: RecordKind) -> Vec<WebhookTarget> {
        let escalation = kind == RecordKind::Escalation;
        self.targets.iter().filter(|t| escalation || !t.escalations_only).cloned().collect()
    }

    /// The targets a dry run's notification of `kind` goes to: only those
    /// that opted in with `dry_runs: true`.
    pub fn dry_run_targets_for(&self, kind: RecordKind) -> Vec<WebhookTarget> {
        self.targets_for(kind).into_iter().filter(|t| t.dry_runs).collect()
    }

    /// Send `body` to `target`, retrying failures (network errors and
    /// non-2xx answers).
    pub async fn deliver(&self, target: &WebhookTarget, body: &Value) -> Delivery {
        let mut detail = String::new();
        let max = target.max_attempts.max(1);
        for attempt in 1..=max {
            let r =
                self.http.post(&target.url).timeout(Duration::from_secs(target.timeout_secs)).json(body).send().await;
            match r {
                Ok(resp) if resp.status().is_success() => {
                    return Delivery {
                        ok: true,
                        attempts: attempt,
                        detail: format!("HTTP {}", resp.status().as_u16()),
                    };
                }
                Ok(resp) => detail = format!("HTTP {}", resp.status().as_u16()),
                Err(e) => detail = e.without_url().to_string(),
            }
            if attempt < max {
                let wait = Duration::from_millis((1000u64 << (attempt - 1).min(4)).min(16_000));
                tokio::time::sleep(wait).await;
            }
        }
        Delivery { ok: false, attempts: max, detail }
    }
}

/// The targets that take the audit head.
impl Notifier {
    pub fn anchor_targets(&self) -> Vec<WebhookTarget> {
        self.targets.iter().filter(|t| t.audit_anchors).cloned().collect()
    }
}

/// The request body for an audit anchor: the head's sequence number and
/// hash (generic) or a line saying them (Slack).
pub fn anchor_body(format: WebhookFormat, head: &AuditRecord) -> Value {
    let text = format!(
        "nightshift audit head: record {} at {}, hash {} — keep this line; `nightshift audit verify` must reach the same hash at that record",
        head.seq,
        crate::alerts::format_rfc3339_ms(head.ts_ms),
        head.hash
    );
    match format {
        WebhookFormat::Generic => json!({"kind": "audit_anchor", "seq": head.seq, "hash": head.hash,
            "ts": crate::alerts::format_rfc3339_ms(head.ts_ms), "text": text}),
        WebhookFormat::Slack => json!({"text": text}),
    }
}

/// The request body for a notification record.
pub fn body(format: WebhookFormat, rec: &AuditRecord) -> Value {
    let notice = rec.payload::<crate::audit::data::Notice>().unwrap_or_default();
    let text = notice.text.as_str();
    let severity = if notice.severity.is_empty() { "info" } else { notice.severity.as_str() };
    let dry_run = notice.dry_run == Some(true);
    let target = match (&rec.node, rec.gpu) {
        (Some(n), Some(g)) => format!("{n}/{g}"),
        (Some(n), None) => n.clone(),
        _ => String::new(),
    };
    match format {
        WebhookFormat::Generic => json!({
            "source": "nightshift",
            "kind": rec.kind.as_str(),
            "severity": severity,
            "text": text,
            "run": rec.run,
            "runbook": rec.runbook,
            "node": rec.node,
            "gpu": rec.gpu,
            "audit_seq": rec.seq,
            "ts_ms": rec.ts_ms,
            "dry_run": dry_run,
        }),
        WebhookFormat::Slack => {
            let icon = if rec.kind == RecordKind::Escalation { ":rotating_light:" } else { ":information_source:" };
            let mut head = format!("{}{icon} *{severity}*", if dry_run { "[dry run] " } else { "" });
            if let Some(rb) = &rec.runbook {
                head.push_str(&format!(" {rb}"));
            }
            if !target.is_empty() {
                head.push_str(&format!(" on {target}"));
            }
            if let Some(run) = &rec.run {
                head.push_str(&format!(" ({run})"));
            }
            json!({"text": format!("{head}: {text}")})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: RecordKind) -> AuditRecord {
        AuditRecord {
            seq: 42,
            ts_ms: 1_790_000_000_000,
            kind,
            run: Some("r000007".into()),
            node: Some("gpu-a1".into()),
            gpu: Some(3),
            runbook: Some("gpu-overheat".into()),
            actor: "engine".into(),
            data: json!({"text": "still at 91 C after the power cap", "severity": "escalation"}),
            prev_hash: String::new(),
            hash: String::new(),
            v: None,
        }
    }

    #[test]
    fn bodies() {
        let g = body(WebhookFormat::Generic, &rec(RecordKind::Escalation));
        assert_eq!(g["kind"], "escalation");
        assert_eq!(g["audit_seq"], 42);
        assert_eq!(g["gpu"], 3);
        let s = body(WebhookFormat::Slack, &rec(RecordKind::Escalation));
        assert_eq!(
            s,
            json!({"text": ":rotating_light: *escalation* gpu-overheat on gpu-a1/3 (r000007): still at 91 C after the power cap"})
        );
        let n = Notifier::new(&NotificationsConfig {
            webhooks: vec![
                WebhookTarget {
                    name: "all".into(),
                    url: "http://x".into(),
                    format: WebhookFormat::Generic,
                    escalations_only: false,
                    timeout_secs: 1,
                    max_attempts: 1,
                    dry_runs: false,
                    audit_anchors: false,
                },
                WebhookTarget {
                    name: "pager".into(),
                    url: "http://y".into(),
                    format: WebhookFormat::Slack,
                    escalations_only: true,
                    timeout_secs: 1,
                    max_attempts: 1,
                    dry_runs: true,
                    audit_anchors: true,
                },
            ],
            audit_anchor_every_secs: None,
        });
        assert_eq!(n.targets_for(RecordKind::Notification).len(), 1);
        assert_eq!(n.targets_for(RecordKind::Escalation).len(), 2);
        // Dry runs reach only the target that opted in, marked.
        assert!(n.dry_run_targets_for(RecordKind::Notification).is_empty());
        let dry: Vec<String> = n.dry_run_targets_for(RecordKind::Escalation).into_iter().map(|t| t.name).collect();
        assert_eq!(dry, vec!["pager".to_string()]);
        let mut r = rec(RecordKind::Escalation);
        r.data["dry_run"] = json!(true);
        assert!(body(WebhookFormat::Slack, &r)["text"].as_str().unwrap().starts_with("[dry run] :rotating_light:"));
        assert_eq!(body(WebhookFormat::Generic, &r)["dry_run"], true);
        assert_eq!(body(WebhookFormat::Generic, &rec(RecordKind::Escalation))["dry_run"], false);
    }
}
