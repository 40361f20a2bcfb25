//! Pages that must reach a person (invariant 19): the durable outbox.
//!
//! What is to be sent is durable before it is sent — the notification or
//! escalation record names its targets (`Notice::webhooks`) — and what
//! was delivered is durable after (`notification_delivery`). A delivery
//! that fails its quick tries (`WebhookTarget::max_attempts`) is recorded
//! as `pending` and kept here; the tick tries it again with a growing
//! pause (30 s, 1, 2, 4 min, then every 5 min, on the engine's clock) until
//! it is delivered or older than `notifications.page_expiry_secs`, when it
//! is recorded `undeliverable` and counted. A target with a `fallback`
//! hands a page it could not take to that target as well. A restart (or a
//! takeover) rebuilds the outbox from the audit log: a notice whose
//! targets have no delivered or undeliverable record is still to be sent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::audit::{AuditRecord, NewRecord, RecordKind, data};
use crate::config::WebhookTarget;
use crate::core::Core;
use crate::engine::Engine;

/// Pages not yet delivered, by (notice record, target name).
#[derive(Debug, Default)]
pub struct Outbox {
    items: BTreeMap<(u64, String), Pending>,
    /// Pages recorded undeliverable since this engine started.
    pub undeliverable: u64,
}

/// One page still to be delivered to one target.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// When the notice was recorded (its expiry counts from here).
    pub first_ms: i64,
    /// Tries so far, across restarts.
    pub attempts: u32,
    /// The next try is due.
    pub next_ms: i64,
    /// A try is in flight.
    pub busy: bool,
}

impl Outbox {
    /// Pages waiting for a delivery.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether (`seq`, `target`) is waiting.
    pub fn contains(&self, seq: u64, target: &str) -> bool {
        self.items.contains_key(&(seq, target.to_string()))
    }

    /// The pages due at `now`, marked busy.
    fn take_due(&mut self, now: i64) -> Vec<(u64, String, u32)> {
        let mut due = Vec::new();
        for ((seq, target), p) in self.items.iter_mut() {
            if !p.busy && p.next_ms <= now {
                p.busy = true;
                due.push((*seq, target.clone(), p.attempts));
            }
        }
        due
    }
}

/// The pause before a page's `k`-th retry (1-based): 30 s doubling to 5 min.
pub fn backoff_ms(k: u32) -> i64 {
    (30_000i64 << k.saturating_sub(1).min(4)).min(300_000)
}

impl Core {
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
        let body = self.notifier.body(target, rec);
        let d = if quick {
            self.notifier.deliver(target, &body).await
        } else {
            self.notifier.deliver_tries(target, &body, 1).await
        };
        let attempts = before.saturating_add(d.attempts);
        let now = self.now();
        let expiry_ms = (self.config.notifications.page_expiry_secs as i64).saturating_mul(1000);
        let key = (rec.seq, target.name.clone());
        let expired = !d.ok && now.saturating_sub(rec.ts_ms) >= expiry_ms;
        let first_failure = !d.ok && before == 0;
        {
            let mut ob = crate::core::lock(&self.outbox);
            if d.ok || expired {
                ob.items.remove(&key);
                if expired {
                    ob.undeliverable += 1;
                }
            } else {
                let retry = attempts.saturating_sub(target.max_attempts.max(1)).saturating_add(1);
                ob.items.insert(
                    key,
                    Pending {
                        first_ms: rec.ts_ms,
                        attempts,
                        next_ms: now.saturating_add(backoff_ms(retry)),
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
            if let Err(e) = self.audit.append(r, None).await {
                tracing::error!(error = %e, "cannot audit a notification delivery");
            }
        }
        if first_failure
            && !expired
            && let Some(fb) = target.fallback.as_deref().and_then(|n| self.notifier.target(n))
            && !crate::core::lock(&self.outbox).contains(rec.seq, &fb.name)
        {
            tracing::warn!(target = %target.name, fallback = %fb.name, seq = rec.seq, "page handed to the fallback route");
            Box::pin(self.send_page(rec, &fb, 0, true)).await;
        }
    }
}

impl Engine {
    /// Pages waiting for a delivery, and pages given up since this engine
    /// started (`/metrics`).
    pub fn pages_pending(&self) -> (usize, u64) {
        let ob = crate::core::lock(&self.core.outbox);
        (ob.len(), ob.undeliverable)
    }

    /// Try again every page whose pause is over (the tick's).
    pub async fn retry_pages(&self) {
        let due = crate::core::lock(&self.core.outbox).take_due(self.core.now());
        for (seq, name, attempts) in due {
            let core = self.core.clone();
            self.core.handle.spawn(async move {
                let rec = core.audit.get(seq).ok().flatten();
                match (rec, core.notifier.target(&name)) {
                    (Some(rec), Some(target)) => core.send_page(&rec, &target, attempts, false).await,
                    // The record or the target is gone (a reload removed
                    // it): nothing to send it with.
                    _ => {
                        crate::core::lock(&core.outbox).items.remove(&(seq, name.clone()));
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
        let expiry_ms = (self.core.config.notifications.page_expiry_secs as i64).saturating_mul(1000);
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
        let mut ob = crate::core::lock(&self.core.outbox);
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
                if done.contains(&key) || self.core.notifier.target(&key.1).is_none() {
                    continue;
                }
                let attempts = tried.get(&key).copied().unwrap_or(0);
                ob.items.entry(key).or_insert(Pending { first_ms: r.ts_ms, attempts, next_ms: now, busy: false });
            }
        }
        ob.len() - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_grows_to_five_minutes() {
        let pauses: Vec<i64> = (1..=7).map(backoff_ms).collect();
        assert_eq!(pauses, vec![30_000, 60_000, 120_000, 240_000, 300_000, 300_000, 300_000]);
    }

    #[test]
    fn due_pages_are_taken_once() {
        let mut ob = Outbox::default();
        ob.items.insert((7, "pager".into()), Pending { first_ms: 0, attempts: 3, next_ms: 100, busy: false });
        ob.items.insert((8, "pager".into()), Pending { first_ms: 0, attempts: 3, next_ms: 900, busy: false });
        assert_eq!(ob.take_due(500), vec![(7, "pager".to_string(), 3)]);
        assert!(ob.take_due(500).is_empty(), "in flight: not taken twice");
        assert_eq!(ob.take_due(1000), vec![(8, "pager".to_string(), 3)]);
    }
}
