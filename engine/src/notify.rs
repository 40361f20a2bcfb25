//! Notification delivery: `notify`, `escalate`, approval requests and
//! breaker trips go to the configured webhooks — nightshift's own JSON
//! (`generic`), a Slack incoming-webhook body (`slack`), or an alert posted
//! to Alertmanager's v2 API (`alertmanager`: the site's own routes page a
//! person), each with the links to its run's and node's pages when
//! `notifications.ui_url` is set — with a timeout
//! and retries (1 s, 2 s, 4 s … between tries); a page those do not
//! deliver stays in the durable outbox (`outbox.rs`) until it is delivered
//! or expires. Deliveries are `notification_delivery` audit records naming
//! the target (never its URL: Slack webhook URLs are secrets), the tries
//! and the result.

use std::time::Duration;

use serde_json::{Value, json};

use crate::audit::{AuditRecord, RecordKind};
use crate::config::{NotificationsConfig, WebhookFormat, WebhookTarget};

/// The configured targets and one HTTP client for them.
#[derive(Debug, Clone)]
pub struct Notifier {
    targets: Vec<WebhookTarget>,
    http: reqwest::Client,
    /// The web UI's URL, for the links in each notification.
    ui_url: Option<String>,
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
        let ui_url = cfg.ui_url.as_ref().map(|u| u.trim_end_matches('/').to_string());
        Notifier { targets: cfg.webhooks.clone(), http, ui_url }
    }

    /// The request body of notification record `rec` for `target`.
    pub fn body(&self, target: &WebhookTarget, rec: &AuditRecord) -> Value {
        body(target, rec, &Links::of(self.ui_url.as_deref(), rec))
    }

    /// The body of `rec`, which resolves the page of escalation record
    /// `page`: to Alertmanager, that page's own alert (the same labels)
    /// ending at `rec`'s time; to other targets, `rec`'s text.
    pub fn resolution_body(&self, target: &WebhookTarget, rec: &AuditRecord, page: &AuditRecord) -> Value {
        if target.format != WebhookFormat::Alertmanager {
            return self.body(target, rec);
        }
        let mut v = body(target, page, &Links::of(self.ui_url.as_deref(), page));
        v[0]["endsAt"] = json!(crate::signals::alerts::format_rfc3339_ms(rec.ts_ms.max(page.ts_ms)));
        let why = rec.payload::<crate::audit::data::Notice>().map(|n| n.text).unwrap_or_default();
        v[0]["annotations"]["resolution"] = json!(why);
        v
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

    /// The target named `name`.
    pub fn target(&self, name: &str) -> Option<WebhookTarget> {
        self.targets.iter().find(|t| t.name == name).cloned()
    }

    /// Send `body` to `target`, retrying failures (network errors and
    /// non-2xx answers) `max_attempts` times in all.
    pub async fn deliver(&self, target: &WebhookTarget, body: &Value) -> Delivery {
        self.deliver_tries(target, body, target.max_attempts).await
    }

    /// [`Notifier::deliver`] with `tries` tries.
    pub async fn deliver_tries(&self, target: &WebhookTarget, body: &Value, tries: u32) -> Delivery {
        let mut detail = String::new();
        let max = tries.max(1);
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
        crate::signals::alerts::format_rfc3339_ms(head.ts_ms),
        head.hash
    );
    match format {
        WebhookFormat::Generic => json!({"kind": "audit_anchor", "seq": head.seq, "hash": head.hash,
            "ts": crate::signals::alerts::format_rfc3339_ms(head.ts_ms), "text": text}),
        WebhookFormat::Slack => json!({"text": text}),
        // Refused by validation (an anchor must not be resolved away); an
        // informational alert if one is configured anyway.
        WebhookFormat::Alertmanager => json!([{
            "labels": {"alertname": "NightshiftAuditAnchor", "component": "nightshift", "severity": "info"},
            "annotations": {"summary": text},
            "startsAt": crate::signals::alerts::format_rfc3339_ms(head.ts_ms),
        }]),
    }
}

/// The pages a notification links to: its run's and its node's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Links {
    pub run: Option<String>,
    pub node: Option<String>,
    pub ui: Option<String>,
}

impl Links {
    pub fn of(ui_url: Option<&str>, rec: &AuditRecord) -> Links {
        let Some(ui) = ui_url else { return Links::default() };
        Links {
            run: rec.run.as_ref().map(|r| format!("{ui}/runs/{r}")),
            node: rec.node.as_ref().map(|n| format!("{ui}/nodes/{n}")),
            ui: Some(ui.to_string()),
        }
    }
}

/// The request body for a notification record.
pub fn body(t: &WebhookTarget, rec: &AuditRecord, links: &Links) -> Value {
    let notice = rec.payload::<crate::audit::data::Notice>().unwrap_or_default();
    let text = notice.text.as_str();
    let severity = if notice.severity.is_empty() { "info" } else { notice.severity.as_str() };
    let dry_run = notice.dry_run == Some(true);
    let target = match (&rec.node, rec.gpu) {
        (Some(n), Some(g)) => format!("{n}/{g}"),
        (Some(n), None) => n.clone(),
        _ => String::new(),
    };
    match t.format {
        WebhookFormat::Alertmanager => alert_body(rec, text, dry_run, &target, links, t.firing_secs),
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
            "run_url": links.run,
            "node_url": links.node,
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
                match &links.run {
                    Some(url) => head.push_str(&format!(" (<{url}|{run}>)")),
                    None => head.push_str(&format!(" ({run})")),
                }
            }
            json!({"text": format!("{head}: {text}")})
        }
    }
}

/// A finding's identity: the runbook, node, GPU and what it says with its
/// figures left out (`outbox.rs::finding_shape`), hashed to 12 hex digits —
/// the same finding told by two runs (a reminder, a restart) carries the
/// same `finding` label, so Alertmanager groups them (`group_by: [finding]`).
pub fn finding_id(rec: &AuditRecord, text: &str) -> Option<String> {
    use sha2::{Digest, Sha256};
    let rb = rec.runbook.as_deref()?;
    let mut h = Sha256::new();
    h.update(format!("{rb}\n{}\n{:?}\n", rec.node.as_deref().unwrap_or(""), rec.gpu));
    h.update(crate::base::outbox::finding_shape(text).as_bytes());
    Some(hex::encode(&h.finalize()[..6]))
}

/// A notification as one alert for Alertmanager's `POST /api/v2/alerts`:
/// an escalation is `NightshiftEscalation` with `severity="page"`, any
/// other notice `NightshiftNotification` with `severity="info"`; both carry
/// `component="nightshift"` (so the example routes send them to people,
/// never back to nightshift), the node as `Hostname` (as dcgm-exporter's
/// series), the GPU, runbook, run and finding ([`finding_id`]) as labels,
/// and the text and links as annotations. It fires from the record's time
/// for `firing_secs`.
fn alert_body(rec: &AuditRecord, text: &str, dry_run: bool, target: &str, links: &Links, firing_secs: u64) -> Value {
    let escalation = rec.kind == RecordKind::Escalation;
    let mut labels = serde_json::Map::new();
    let mut label = |k: &str, v: String| {
        labels.insert(k.to_string(), Value::String(v));
    };
    label("alertname", if escalation { "NightshiftEscalation" } else { "NightshiftNotification" }.into());
    label("component", "nightshift".into());
    label("severity", if escalation { "page" } else { "info" }.into());
    if let Some(n) = &rec.node {
        label("Hostname", n.clone());
    }
    if let Some(g) = rec.gpu {
        label("gpu", g.to_string());
    }
    if let Some(rb) = &rec.runbook {
        label("runbook", rb.clone());
    }
    if let Some(r) = &rec.run {
        label("run", r.clone());
    }
    if let Some(f) = finding_id(rec, text) {
        label("finding", f);
    }
    if dry_run {
        label("dry_run", "true".into());
    }
    // A follow-up of an open page: routed to the person that page reached
    // and never muted by it (examples/alertmanager.yml).
    let follows = rec.payload::<crate::audit::data::Notice>().ok().and_then(|n| n.follows);
    if !escalation && follows.is_some() {
        label("followup", "true".into());
    }
    let what = match (&rec.runbook, target.is_empty()) {
        (Some(rb), false) => format!("{rb} on {target}"),
        (Some(rb), true) => rb.clone(),
        (None, false) => target.to_string(),
        (None, true) => "nightshift".into(),
    };
    let mut annotations = serde_json::Map::new();
    let mut note = |k: &str, v: String| {
        annotations.insert(k.to_string(), Value::String(v));
    };
    note("summary", format!("{}{what}: {text}", if dry_run { "[dry run] " } else { "" }));
    note("description", text.to_string());
    note("audit_seq", rec.seq.to_string());
    if let Some(u) = &links.run {
        note("run_url", u.clone());
    }
    if let Some(u) = &links.node {
        note("node_url", u.clone());
    }
    let mut alert = json!({
        "labels": labels,
        "annotations": annotations,
        "startsAt": crate::signals::alerts::format_rfc3339_ms(rec.ts_ms),
        "endsAt": crate::signals::alerts::format_rfc3339_ms(rec.ts_ms.saturating_add((firing_secs as i64).saturating_mul(1000))),
    });
    if let Some(u) = links.run.as_ref().or(links.node.as_ref()).or(links.ui.as_ref()) {
        alert["generatorURL"] = json!(u);
    }
    json!([alert])
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

    fn target(format: WebhookFormat) -> WebhookTarget {
        WebhookTarget {
            name: "t".into(),
            url: "http://x".into(),
            format,
            escalations_only: false,
            timeout_secs: 1,
            max_attempts: 1,
            dry_runs: false,
            audit_anchors: false,
            firing_secs: 3600,
            fallback: None,
        }
    }

    fn body(format: WebhookFormat, rec: &AuditRecord) -> Value {
        super::body(&target(format), rec, &Links::default())
    }

    #[test]
    fn bodies() {
        let g = body(WebhookFormat::Generic, &rec(RecordKind::Escalation));
        assert_eq!(g["kind"], "escalation");
        assert_eq!(g["audit_seq"], 42);
        assert_eq!(g["gpu"], 3);
        assert_eq!(g["run_url"], Value::Null, "no ui_url: no link");
        let s = body(WebhookFormat::Slack, &rec(RecordKind::Escalation));
        assert_eq!(
            s,
            json!({"text": ":rotating_light: *escalation* gpu-overheat on gpu-a1/3 (r000007): still at 91 C after the power cap"})
        );
        let n = Notifier::new(&NotificationsConfig {
            webhooks: vec![
                WebhookTarget { name: "all".into(), ..target(WebhookFormat::Generic) },
                WebhookTarget {
                    name: "pager".into(),
                    url: "http://y".into(),
                    escalations_only: true,
                    dry_runs: true,
                    audit_anchors: true,
                    ..target(WebhookFormat::Slack)
                },
            ],
            audit_anchor_every_secs: None,
            ui_url: None,
            page_expiry_secs: 3600,
            retry_max_secs: 300,
            repage_after_secs: 86_400,
            remind_after_secs: 86_400,
            worse_by_pct: 25.0,
            shared_cause_secs: 3_600,
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

    /// A page's resolution is the page's own alert (the same labels, so
    /// Alertmanager ends that alert) ending at the resolution's time; a
    /// follow-up notice is labelled so the routes send it to the person
    /// the page reached and the inhibition leaves it alone.
    #[test]
    fn a_resolution_ends_the_pages_own_alert_and_a_follow_up_is_labelled() {
        let n = Notifier::new(&NotificationsConfig {
            webhooks: vec![target(WebhookFormat::Alertmanager)],
            audit_anchor_every_secs: None,
            ui_url: Some("https://ns.example/".into()),
            page_expiry_secs: 3600,
            retry_max_secs: 300,
            repage_after_secs: 86_400,
            remind_after_secs: 86_400,
            worse_by_pct: 25.0,
            shared_cause_secs: 3_600,
        });
        let page = rec(RecordKind::Escalation);
        let mut resolution = rec(RecordKind::Notification);
        resolution.ts_ms = page.ts_ms + 600_000;
        resolution.data = json!({"text": "resolved: handled by run r000009", "severity": "info", "delivered_to": [],
            "webhooks": ["t"], "resolves": page.seq});
        let open = n.body(&n.targets[0], &page);
        let ended = n.resolution_body(&n.targets[0], &resolution, &page);
        assert_eq!(ended[0]["labels"], open[0]["labels"], "the same alert");
        assert_eq!(ended[0]["startsAt"], open[0]["startsAt"]);
        assert_eq!(ended[0]["endsAt"], json!(crate::signals::alerts::format_rfc3339_ms(resolution.ts_ms)));
        assert_eq!(ended[0]["annotations"]["resolution"], "resolved: handled by run r000009");
        let mut follow = rec(RecordKind::Notification);
        follow.data = json!({"text": "GPU 3 capped: reset it", "severity": "warning", "delivered_to": [],
            "webhooks": ["t"], "follows": page.seq});
        let b = n.body(&n.targets[0], &follow);
        assert_eq!(b[0]["labels"]["alertname"], "NightshiftNotification");
        assert_eq!(b[0]["labels"]["followup"], "true", "{b}");
        assert!(n.body(&n.targets[0], &rec(RecordKind::Notification))[0]["labels"].get("followup").is_none());
    }

    #[test]
    fn an_escalation_is_an_alert_with_its_links_for_alertmanager() {
        let n = Notifier::new(&NotificationsConfig {
            webhooks: vec![target(WebhookFormat::Alertmanager)],
            audit_anchor_every_secs: None,
            ui_url: Some("https://ns.example/".into()),
            page_expiry_secs: 3600,
            retry_max_secs: 300,
            repage_after_secs: 86_400,
            remind_after_secs: 86_400,
            worse_by_pct: 25.0,
            shared_cause_secs: 3_600,
        });
        let b = n.body(&n.targets[0], &rec(RecordKind::Escalation));
        assert_eq!(
            b,
            json!([{
                "labels": {"alertname": "NightshiftEscalation", "component": "nightshift", "severity": "page",
                    "Hostname": "gpu-a1", "gpu": "3", "runbook": "gpu-overheat", "run": "r000007",
                    "finding": "ecf927796c56"},
                "annotations": {"summary": "gpu-overheat on gpu-a1/3: still at 91 C after the power cap",
                    "description": "still at 91 C after the power cap", "audit_seq": "42",
                    "run_url": "https://ns.example/runs/r000007", "node_url": "https://ns.example/nodes/gpu-a1"},
                "startsAt": "2026-09-21T14:13:20.000Z",
                "endsAt": "2026-09-21T15:13:20.000Z",
                "generatorURL": "https://ns.example/runs/r000007",
            }])
        );
        // One finding in other figures is the same `finding`; other words,
        // another GPU or another runbook are findings of their own.
        let r = rec(RecordKind::Escalation);
        let f = |r: &AuditRecord, t: &str| finding_id(r, t).unwrap();
        assert_eq!(f(&r, "still at 93 C after the power cap"), "ecf927796c56");
        assert_ne!(f(&r, "cannot drain the node"), "ecf927796c56");
        let mut other = r.clone();
        other.gpu = Some(4);
        assert_ne!(f(&other, "still at 91 C after the power cap"), "ecf927796c56");
        other.runbook = None;
        assert_eq!(finding_id(&other, "text"), None, "an engine notice is no runbook's finding");
        // A notice is information, not a page; links in every format.
        let i = n.body(&n.targets[0], &rec(RecordKind::Notification));
        assert_eq!(
            (i[0]["labels"]["alertname"].as_str(), i[0]["labels"]["severity"].as_str()),
            (Some("NightshiftNotification"), Some("info"))
        );
        let g = super::body(
            &target(WebhookFormat::Generic),
            &rec(RecordKind::Notification),
            &Links::of(Some("https://ns.example"), &rec(RecordKind::Notification)),
        );
        assert_eq!(g["node_url"], "https://ns.example/nodes/gpu-a1");
        let s = super::body(
            &target(WebhookFormat::Slack),
            &rec(RecordKind::Escalation),
            &Links::of(Some("https://ns.example"), &rec(RecordKind::Escalation)),
        );
        assert!(s["text"].as_str().unwrap().contains("(<https://ns.example/runs/r000007|r000007>)"), "{s}");
    }
}
