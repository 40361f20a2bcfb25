//! What a script tells people (`note`, `notify`, `escalate`): recorded
//! before it is sent, and said once per finding — a note on the run when
//! the same runbook already said the same about the same target, until a
//! reminder is due or (a sized notification) it has grown worse.

use crate::audit::{NewRecord, RecordKind};
use crate::base::outbox::Said;
use crate::core::Core;
use crate::runbooks::script::{RunCtx, TextKind};

use super::Host;

impl Host {
    pub(super) fn tell(&self, ctx: &RunCtx, kind: TextKind, text: &str, size: Option<f64>) {
        let (rk, severity): (RecordKind, &str) = match kind {
            TextKind::Note => (RecordKind::Note, "info"),
            TextKind::Notify => (RecordKind::Notification, "warning"),
            TextKind::Escalate => (RecordKind::Escalation, "escalation"),
        };
        let mut text: String = text.chars().take(2000).collect();
        let mut kind = kind;
        let mut rk = rk;
        // Said again about a target this runbook paged about or told (a run
        // resumed after a restart, the ladder again after its hold expired,
        // the cause still there at the next run): the people have it — a
        // note, not a second page or message, until a reminder is due or
        // (a notification with a size) it has grown worse.
        let escalation = kind == TextKind::Escalate;
        // One node of a shared cause: the breaker paged once for all of
        // them; what the run says goes on the run as a note (and a page it
        // wanted is the breaker's: the run still needs a person).
        if kind != TextKind::Note
            && !ctx.dry_run
            && self
                .own_mut(|r| {
                    let cause = r.shared_cause.clone()?;
                    if escalation {
                        r.achieved.paged.get_or_insert_with(|| format!("the shared cause's page ({cause})"));
                    }
                    Some(())
                })
                .flatten()
                .is_some()
        {
            let did = if escalation { "paged" } else { "told" };
            text = format!("not {did}: one node of a shared cause, paged once for all of them: {text}");
            kind = TextKind::Note;
            rk = RecordKind::Note;
        }
        // A page (new, or one already sent): the run needs a person.
        if escalation && kind != TextKind::Note && !ctx.dry_run {
            self.own_mut(|r| {
                r.achieved.paged.get_or_insert_with(|| text.clone());
            });
        }
        if kind != TextKind::Note
            && !ctx.dry_run
            && let Some(node) = ctx.target.node.as_deref()
        {
            match self.core.already_said(escalation, &ctx.runbook, node, ctx.target.gpu, &text, size) {
                Said::New => {}
                Said::Worse { seq, was } => {
                    text = crate::base::outbox::worse_text(seq, was, size.unwrap_or(was), &text);
                }
                Said::Again { seq } => {
                    let did = if escalation { "paged" } else { "said" };
                    text = format!("already {did} (audit #{seq}), not {did} again: {text}");
                    kind = TextKind::Note;
                    rk = RecordKind::Note;
                    if !escalation {
                        self.own_mut(|r| r.repeated = true);
                    }
                }
            }
        }
        let what = match kind {
            TextKind::Notify => Some("notification"),
            TextKind::Escalate => Some("escalation"),
            TextKind::Note if text.starts_with("already ") => Some("repeat_noted"),
            TextKind::Note => None,
        };
        if let (Some(what), false) = (what, ctx.dry_run) {
            self.core.counters().told(&ctx.runbook, what);
        }
        if kind == TextKind::Note {
            self.append(
                ctx,
                NewRecord::typed(rk, "engine", &crate::audit::data::Note { text, ..Default::default() })
                    .node(ctx.target.node.as_deref())
                    .gpu(ctx.target.gpu),
            );
            return;
        }
        if !ctx.dry_run {
            tracing::warn!(run = %self.run, runbook = %ctx.runbook, severity, text = %text, "notification");
        }
        self.own_mut(|r| r.told = true);
        let shadow = self.summary().is_some_and(|s| s.shadow);
        // A notice about a node whose page is open follows that page.
        let follows = match (kind, ctx.target.node.as_deref()) {
            (TextKind::Notify, Some(node)) => self.core.open_page_on(node),
            _ => None,
        };
        let said = crate::audit::data::Notice { text, severity: severity.into(), follows, size, ..Default::default() };
        let rec = self
            .core
            .notice_record_from(rk, said, ctx.dry_run, shadow)
            .run(&self.run)
            .node(ctx.target.node.as_deref())
            .gpu(ctx.target.gpu)
            .runbook(&ctx.runbook);
        match self.core.audit().append_blocking(rec, self.summary()) {
            Ok(r) => Core::deliver(&self.core, &r),
            Err(e) => tracing::error!(run = %self.run, error = %e, "cannot audit from a script"),
        }
    }
}
