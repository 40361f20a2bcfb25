//! Pages that must reach a person (invariant 19): sending them through
//! the durable outbox (`outbox.rs`), trying again, rebuilding what is
//! still to send after a restart, and ending a page when its fault is
//! handled, repaired or taken over by a person.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::audit::{AuditRecord, NewRecord, RecordKind, data};
use crate::base::outbox::{OpenPage, Pending, Said, SaidAt, backoff_ms, finding_shape, said_shape};
use crate::config::WebhookTarget;
use crate::core::Core;
use crate::engine::Engine;

impl Engine {
    /// A run found nothing to do: the findings its runbook told about the
    /// target are over — said so on the run (the next one is told again;
    /// rebuilt from this record after a restart).
    pub(crate) async fn clear_findings(&self, s: &crate::runs::RunSummary) {
        let Some(node) = s.target.node.as_deref() else { return };
        if !self.core.forget_said(&s.runbook, node, s.target.gpu) {
            return;
        }
        let rec = Core::findings_cleared_note(
            &s.runbook,
            node,
            s.target.gpu,
            "the finding told about this target is over (this run found nothing to do): the next one is told".into(),
        )
        .run(&s.id);
        if let Err(e) = self.core.audit().append(rec, None).await {
            tracing::error!(run = %s.id, error = %e, "cannot audit a finding's end");
        }
    }
}

impl Core {
    /// Send a durable notification record to the webhooks (in the
    /// background) and audit each delivery. Dry-run records go only to
    /// targets that opted in with `dry_runs: true` (marked as dry runs).
    pub fn deliver(core: &Arc<Core>, rec: &AuditRecord) {
        let Ok(notice) = rec.payload::<crate::audit::data::Notice>() else {
            tracing::error!(seq = rec.seq, "not a notification: nothing delivered");
            return;
        };
        // A shadow run notifies no one.
        if notice.shadow == Some(true) {
            return;
        }
        // The targets the record names (a resolution: those its page went
        // to), as they are configured now.
        let targets: Vec<crate::config::WebhookTarget> =
            notice.webhooks.iter().filter_map(|n| core.notifier().target(n)).collect();
        if rec.kind == RecordKind::Escalation && notice.dry_run != Some(true) {
            core.open_page(rec);
        }
        if rec.kind == RecordKind::Notification {
            core.remember_said(rec, &notice);
        }
        for target in targets {
            let (core2, rec) = (core.clone(), rec.clone());
            core.handle().spawn(async move { core2.send_page(&rec, &target, 0, true).await });
        }
    }

    /// Escalation record `rec` was sent: its page is open.
    pub(crate) fn open_page(&self, rec: &AuditRecord) {
        let Some(node) = &rec.node else { return };
        let page = OpenPage { seq: rec.seq, gpu: rec.gpu, run: rec.run.clone(), ts_ms: rec.ts_ms };
        let mut ob = self.outbox();
        ob.open_page(node, page);
        if let (Some(rb), Ok(n)) = (&rec.runbook, rec.payload::<data::Notice>()) {
            ob.said(
                (rb.clone(), node.clone(), rec.gpu, finding_shape(&n.text)),
                SaidAt { seq: rec.seq, ts_ms: rec.ts_ms, size: None },
            );
        }
    }

    /// Whether `runbook` said `text` (figures aside) about `node`/`gpu`
    /// already, with no repair, takeover or end of the finding since: an
    /// escalation within `notifications.repage_after_secs` (saying it again
    /// pages nobody twice), a notification within `remind_after_secs` (one
    /// finding, said once) — unless the notification's `size` grew by
    /// `worse_by_pct` since (it is worse: said again).
    pub fn already_said(
        &self,
        escalation: bool,
        runbook: &str,
        node: &str,
        gpu: Option<u32>,
        text: &str,
        size: Option<f64>,
    ) -> Said {
        let n = &self.config().notifications;
        let (secs, shape) = if escalation {
            (n.repage_after_secs, finding_shape(text))
        } else {
            (n.remind_after_secs, said_shape(text))
        };
        let Some(at) = self.outbox().said_at(&(runbook.to_string(), node.to_string(), gpu, shape)) else {
            return Said::New;
        };
        if self.now().saturating_sub(at.ts_ms) >= (secs as i64).saturating_mul(1000) {
            return Said::New;
        }
        Said::of(at, size.filter(|_| !escalation), n.worse_by_pct)
    }

    /// Forget what `runbook` told about `node`/`gpu` (its notifications'
    /// findings; pages keep their own rule). Whether there was any.
    pub(crate) fn forget_said(&self, runbook: &str, node: &str, gpu: Option<u32>) -> bool {
        self.outbox().forget_said(runbook, node, gpu)
    }

    /// The note that ends `runbook`'s findings on `node`/`gpu` (what the
    /// rebuild after a restart forgets them by).
    pub(crate) fn findings_cleared_note(runbook: &str, node: &str, gpu: Option<u32>, text: String) -> NewRecord {
        NewRecord::typed(
            RecordKind::Note,
            "engine",
            &data::Note { text, findings_cleared: Some(true), ..Default::default() },
        )
        .node(Some(node))
        .gpu(gpu)
        .runbook(runbook)
    }

    /// Notification record `rec` was written: remember its finding.
    fn remember_said(&self, rec: &AuditRecord, n: &data::Notice) {
        if let (Some(rb), Some(node), None | Some(false), None | Some(false), None) =
            (&rec.runbook, &rec.node, n.dry_run, n.shadow, n.resolves)
        {
            self.outbox().said(
                (rb.clone(), node.clone(), rec.gpu, said_shape(&n.text)),
                SaidAt { seq: rec.seq, ts_ms: rec.ts_ms, size: n.size },
            );
        }
    }

    /// The newest page still open on `node` (a notice about the node
    /// follows it).
    pub fn open_page_on(&self, node: &str) -> Option<u64> {
        let now = self.now();
        self.outbox().newest_open(node, now, self.firing_ms())
    }

    /// How long an escalation's page stays firing by itself: the longest
    /// `firing_secs` of the Alertmanager targets (one hour without one).
    fn firing_ms(&self) -> i64 {
        let secs = self
            .config()
            .notifications
            .webhooks
            .iter()
            .filter(|t| t.format == crate::config::WebhookFormat::Alertmanager)
            .map(|t| t.firing_secs)
            .max()
            .unwrap_or(3600);
        (secs as i64).saturating_mul(1000)
    }

    /// One delivery of page `rec` to `target` (`before` tries already
    /// made; `quick`: the target's own quick tries, else one), recorded
    /// when it lands, when it first fails (pending) and when it expires
    /// (undeliverable); kept in the outbox until then. A first failure
    /// hands the page to the target's fallback too.
    pub(crate) async fn send_page(
        self: &Arc<Core>,
        rec: &AuditRecord,
        target: &WebhookTarget,
        before: u32,
        quick: bool,
    ) {
        let resolves = rec.payload::<data::Notice>().ok().and_then(|n| n.resolves);
        let body = match resolves.and_then(|seq| self.audit().get(seq).ok().flatten()) {
            Some(page) => self.notifier().resolution_body(target, rec, &page),
            None => self.notifier().body(target, rec),
        };
        let d = if quick {
            self.notifier().deliver(target, &body).await
        } else {
            self.notifier().deliver_tries(target, &body, 1).await
        };
        let attempts = before.saturating_add(d.attempts);
        let now = self.now();
        let expiry_ms = (self.config().notifications.page_expiry_secs as i64).saturating_mul(1000);
        let key = (rec.seq, target.name.clone());
        let expired = !d.ok && now.saturating_sub(rec.ts_ms) >= expiry_ms;
        let first_failure = !d.ok && before == 0;
        {
            let mut ob = self.outbox();
            if d.ok || expired {
                ob.done(key.0, &key.1, expired);
            } else {
                let retry = attempts.saturating_sub(target.max_attempts.max(1)).saturating_add(1);
                ob.retry_later(
                    key.0,
                    key.1,
                    Pending {
                        first_ms: rec.ts_ms,
                        attempts,
                        next_ms: now.saturating_add(backoff_ms(
                            retry,
                            (self.config().notifications.retry_max_secs as i64).saturating_mul(1000),
                        )),
                        busy: false,
                    },
                );
            }
        }
        if d.ok {
            if before > 0 {
                tracing::info!(target = %target.name, seq = rec.seq, attempts, "page delivered after retries");
            }
        } else {
            tracing::warn!(target = %target.name, seq = rec.seq, attempts, detail = %d.detail, expired, "page not delivered");
        }
        // Recorded: delivered, the first failure (pending), the expiry.
        // Retries that fail in between go to the log only.
        if d.ok || expired || first_failure {
            let payload = data::Delivery {
                target: target.name.clone(),
                format: Some(serde_json::json!(target.format)),
                for_seq: Some(rec.seq),
                ok: d.ok,
                attempts,
                detail: d.detail.clone(),
                pending: (!d.ok && !expired).then_some(true),
                undeliverable: expired.then_some(true),
                ..Default::default()
            };
            let mut r =
                NewRecord::typed(RecordKind::NotificationDelivery, "engine", &payload).node(rec.node.as_deref());
            if let Some(run) = &rec.run {
                r = r.run(run);
            }
            if let Some(rb) = &rec.runbook {
                r = r.runbook(rb);
            }
            if let Err(e) = self.audit().append(r, None).await {
                tracing::error!(error = %e, "cannot audit a notification delivery");
            }
        }
        if first_failure
            && !expired
            && let Some(fb) = target.fallback.as_deref().and_then(|n| self.notifier().target(n))
            && !self.outbox().contains(rec.seq, &fb.name)
        {
            tracing::warn!(target = %target.name, fallback = %fb.name, seq = rec.seq, "page handed to the fallback route");
            Box::pin(self.send_page(rec, &fb, 0, true)).await;
        }
    }
}

impl Engine {
    /// End the open pages on `node` (of GPU `gpu` only, when given; not
    /// those run `except_run` sent): each gets a resolving notice, sent
    /// through the outbox to the targets its page went to — to
    /// Alertmanager, the page's own alert with its end (invariant 19).
    pub(crate) async fn resolve_pages(&self, node: &str, gpu: Option<u32>, why: &str, except_run: Option<&str>) {
        let taken: Vec<OpenPage> = {
            let mut ob = self.core.outbox();
            if except_run.is_none() {
                ob.forget_paged(node, gpu);
            }
            ob.take_open(node, gpu, except_run)
        };
        let now = self.core.now();
        for p in taken {
            // Past its own firing time the pager has ended it already.
            if now.saturating_sub(p.ts_ms) >= self.core.firing_ms() {
                continue;
            }
            let Ok(Some(page)) = self.core.audit().get(p.seq) else { continue };
            let Ok(n) = page.payload::<data::Notice>() else { continue };
            let notice = data::Notice {
                text: format!("resolved: {why}"),
                severity: "info".into(),
                delivered_to: vec!["log".into()],
                webhooks: n.webhooks.clone(),
                resolves: Some(p.seq),
                ..Default::default()
            };
            let mut r = NewRecord::typed(RecordKind::Notification, "engine", &notice).node(Some(node)).gpu(page.gpu);
            if let Some(run) = &page.run {
                r = r.run(run);
            }
            if let Some(rb) = &page.runbook {
                r = r.runbook(rb);
            }
            match self.core.audit().append(r, None).await {
                Ok(rec) => {
                    tracing::info!(node, seq = p.seq, why, "page resolved");
                    Core::deliver(&self.core, &rec);
                }
                Err(e) => tracing::error!(error = %e, "cannot audit a page's resolution"),
            }
        }
    }

    /// Pages waiting for a delivery, and pages given up since this engine
    /// started (`/metrics`).
    pub(crate) fn pages_pending(&self) -> (usize, u64) {
        let ob = self.core.outbox();
        (ob.len(), ob.undeliverable())
    }

    /// Try again every page whose pause is over (the tick's).
    pub(crate) async fn retry_pages(&self) {
        let due = self.core.outbox().take_due(self.core.now());
        for (seq, name, attempts) in due {
            let core = self.core.clone();
            self.core.handle().spawn(async move {
                let rec = core.audit().get(seq).ok().flatten();
                match (rec, core.notifier().target(&name)) {
                    (Some(rec), Some(target)) => core.send_page(&rec, &target, attempts, false).await,
                    // The record or the target is gone (a reload removed
                    // it): nothing to send it with.
                    _ => {
                        core.outbox().done(seq, &name, false);
                        tracing::error!(seq, target = %name, "a pending page's record or target is gone: dropped from the outbox");
                    }
                }
            });
        }
    }

    /// Pages to send after a restart or takeover: each notice in `records`
    /// younger than the expiry whose targets have no delivered or
    /// undeliverable record. Returns how many.
    pub(crate) fn rebuild_outbox(&self, records: &[AuditRecord]) -> usize {
        let now = self.core.now();
        let expiry_ms = (self.core.config().notifications.page_expiry_secs as i64).saturating_mul(1000);
        let mut done: BTreeSet<(u64, String)> = BTreeSet::new();
        let mut tried: BTreeMap<(u64, String), u32> = BTreeMap::new();
        for r in records.iter().filter(|r| r.kind == RecordKind::NotificationDelivery) {
            let Ok(d) = r.payload::<data::Delivery>() else { continue };
            let Some(seq) = d.for_seq else { continue };
            if d.ok || d.undeliverable == Some(true) {
                done.insert((seq, d.target));
            } else {
                *tried.entry((seq, d.target)).or_default() += d.attempts;
            }
        }
        let resolved: BTreeSet<u64> = records
            .iter()
            .filter(|r| r.kind == RecordKind::Notification)
            .filter_map(|r| r.payload::<data::Notice>().ok()?.resolves)
            .collect();
        let firing_ms = self.core.firing_ms();
        let repage_ms = (self.core.config().notifications.repage_after_secs as i64).saturating_mul(1000);
        let remind_ms = (self.core.config().notifications.remind_after_secs as i64).saturating_mul(1000);
        let mut ob = self.core.outbox();
        // What each runbook paged about, in order: forgotten at a repair
        // or a person's takeover (`resolve_pages` without a run).
        for r in records {
            match r.kind {
                RecordKind::Escalation if now.saturating_sub(r.ts_ms) < repage_ms => {
                    let Ok(n) = r.payload::<data::Notice>() else { continue };
                    if let (Some(rb), Some(node), None | Some(false), None | Some(false)) =
                        (&r.runbook, &r.node, n.dry_run, n.shadow)
                    {
                        let at = SaidAt { seq: r.seq, ts_ms: r.ts_ms, size: None };
                        ob.said((rb.clone(), node.clone(), r.gpu, finding_shape(&n.text)), at);
                    }
                }
                RecordKind::HealthChanged if matches!(r.data["to"].as_str(), Some("healthy" | "verifying")) => {
                    if let Some(node) = &r.node {
                        ob.forget_paged(node, r.gpu);
                    }
                }
                RecordKind::Notification
                    if r.data["resolves"].is_u64()
                        && r.data["text"].as_str().is_some_and(|t| t.starts_with("resolved: taken over by")) =>
                {
                    if let Some(node) = &r.node {
                        ob.forget_paged(node, r.gpu);
                    }
                }
                RecordKind::Note if r.data["findings_cleared"] == true => {
                    if let (Some(rb), Some(node)) = (&r.runbook, &r.node) {
                        ob.forget_said(rb, node, r.gpu);
                    }
                }
                RecordKind::Notification if now.saturating_sub(r.ts_ms) < remind_ms => {
                    let Ok(n) = r.payload::<data::Notice>() else { continue };
                    if let (Some(rb), Some(node), None | Some(false), None | Some(false), None) =
                        (&r.runbook, &r.node, n.dry_run, n.shadow, n.resolves)
                    {
                        let at = SaidAt { seq: r.seq, ts_ms: r.ts_ms, size: n.size };
                        ob.said((rb.clone(), node.clone(), r.gpu, said_shape(&n.text)), at);
                    }
                }
                _ => {}
            }
        }
        for r in records.iter().filter(|r| r.kind == RecordKind::Escalation && !resolved.contains(&r.seq)) {
            let Ok(n) = r.payload::<data::Notice>() else { continue };
            if n.dry_run == Some(true) || now.saturating_sub(r.ts_ms) >= firing_ms {
                continue;
            }
            if let Some(node) = &r.node {
                ob.open_page(node, OpenPage { seq: r.seq, gpu: r.gpu, run: r.run.clone(), ts_ms: r.ts_ms });
            }
        }
        let before = ob.len();
        for r in records {
            if !matches!(r.kind, RecordKind::Notification | RecordKind::Escalation) {
                continue;
            }
            let Ok(n) = r.payload::<data::Notice>() else { continue };
            if n.shadow == Some(true) || now.saturating_sub(r.ts_ms) >= expiry_ms {
                continue;
            }
            for name in n.webhooks {
                let key = (r.seq, name);
                if done.contains(&key) || self.core.notifier().target(&key.1).is_none() {
                    continue;
                }
                let attempts = tried.get(&key).copied().unwrap_or(0);
                ob.keep(key.0, key.1, Pending { first_ms: r.ts_ms, attempts, next_ms: now, busy: false });
            }
        }
        ob.len() - before
    }
}
