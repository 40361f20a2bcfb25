//! Pages that must reach a person (invariant 19): the durable outbox's
//! state — pages not delivered yet and escalations still open — kept in
//! `Core`; what sends, retries, rebuilds and resolves them is `pages.rs`.
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

use std::collections::BTreeMap;

/// Pages not yet delivered, by (notice record, target name); and the
/// escalations still open at the pager, by node.
#[derive(Debug, Default)]
pub struct Outbox {
    items: BTreeMap<(u64, String), Pending>,
    /// Pages recorded undeliverable since this engine started.
    undeliverable: u64,
    open: BTreeMap<String, Vec<OpenPage>>,
    /// (runbook, node, GPU, what it said with its figures left out) → the
    /// escalation that paged it last (seq, time): the same runbook saying
    /// the same about the same target pages again only after
    /// `notifications.repage_after_secs`, or once the GPU was repaired or a
    /// person took over. Anything else it says pages. Notifications the
    /// same (their shape [`said_shape`], within `remind_after_secs`).
    paged: BTreeMap<PagedKey, SaidAt>,
}

/// Where a finding was last said: its record, when, and how big it was
/// (a script's `notify(text, size)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SaidAt {
    pub seq: u64,
    pub ts_ms: i64,
    pub size: Option<f64>,
}

/// How a finding said again because it grew begins:
/// `worse than when told (audit #12: 30 → 45): …` ([`worse_text`]).
const WORSE_PREFIX: &str = "worse than when told (audit #";

/// `text`, said again because its size grew from `was` to `now` since
/// record `seq` said it.
pub(crate) fn worse_text(seq: u64, was: f64, now: f64, text: &str) -> String {
    format!("{WORSE_PREFIX}{seq}: {was} → {now}): {text}")
}

/// Whether saying something again says anything new.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Said {
    /// Not said before (or long enough ago): say it.
    New,
    /// Said in record `seq`, no bigger since: a note, not a message.
    Again { seq: u64 },
    /// Said in record `seq` when it was `was`; it has grown past
    /// `notifications.worse_by_pct`: say it again, as worse.
    Worse { seq: u64, was: f64 },
}

impl Said {
    /// `size` now against the finding as last said, grown by at least
    /// `worse_by_pct` percent (a size of 0 or less grows by any rise).
    pub(crate) fn of(at: SaidAt, size: Option<f64>, worse_by_pct: f64) -> Said {
        match (at.size, size) {
            (Some(was), Some(now)) if now > was && now >= was.max(0.0) * (1.0 + worse_by_pct / 100.0) => {
                Said::Worse { seq: at.seq, was }
            }
            _ => Said::Again { seq: at.seq },
        }
    }
}

/// (runbook, node, GPU, the text's shape: [`finding_shape`]).
pub(crate) type PagedKey = (String, String, Option<u32>, String);

/// What an escalation says with its figures left out ("GPU 5 … power
/// 381.0 W" and "… 377.0 W" say the same; "cannot drain" says something
/// else).
/// A notification's shape: [`finding_shape`], kept apart from an
/// escalation's (the same words notified and escalated are two things).
pub fn said_shape(text: &str) -> String {
    format!("notify:{}", finding_shape(text))
}

pub fn finding_shape(text: &str) -> String {
    // A finding said again because it got worse is the same finding.
    let text = text.strip_prefix(WORSE_PREFIX).and_then(|rest| rest.split_once("): ").map(|(_, t)| t)).unwrap_or(text);
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod shape_tests {
    use super::{Said, SaidAt, finding_shape};

    #[test]
    fn a_finding_is_worse_once_it_grows_by_the_stated_share() {
        let at = |size| SaidAt { seq: 7, ts_ms: 0, size };
        // (size last said, size now) → what saying it again is, at 25 %.
        let cases = [
            (Some(30.0), Some(30.0), Said::Again { seq: 7 }),
            (Some(30.0), Some(37.0), Said::Again { seq: 7 }),
            (Some(30.0), Some(37.5), Said::Worse { seq: 7, was: 30.0 }),
            (Some(30.0), Some(20.0), Said::Again { seq: 7 }),
            (Some(0.0), Some(0.5), Said::Worse { seq: 7, was: 0.0 }),
            (Some(0.0), Some(0.0), Said::Again { seq: 7 }),
            (None, Some(90.0), Said::Again { seq: 7 }),
            (Some(30.0), None, Said::Again { seq: 7 }),
        ];
        for (was, now, want) in cases {
            assert_eq!(Said::of(at(was), now, 25.0), want, "was {was:?}, now {now:?}");
        }
    }

    #[test]
    fn figures_do_not_make_a_new_finding_and_words_do() {
        let a = finding_shape("GPU 5 on n00003 only stays cool with the mitigation (power 381.0 W); kept for 7200 s");
        let b = finding_shape("GPU 5 on n00003 only stays cool with the mitigation (power 377.0 W); kept for 7200 s");
        assert_eq!(a, b);
        assert_eq!(a, "GPU # on n# only stays cool with the mitigation (power # W); kept for # s");
        assert_ne!(a, finding_shape("cannot drain n00003 (refused); GPU 5 at 95 °C needs a person now"));
        assert_ne!(finding_shape("GPU 5 on n1 is hot"), finding_shape("GPU 5 on n1 is lost"));
        // Said again as worse: the same finding.
        let worse = super::worse_text(12, 30.0, 45.5, "n1: all-reduce is 45.5% of step time");
        assert_eq!(worse, "worse than when told (audit #12: 30 → 45.5): n1: all-reduce is 45.5% of step time");
        assert_eq!(finding_shape(&worse), finding_shape("n1: all-reduce is 30% of step time"));
    }
}

/// An escalation whose page is open: it ends when its fault is handled,
/// repaired or taken over by a person (or at its target's `firing_secs`).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenPage {
    pub seq: u64,
    pub gpu: Option<u32>,
    pub run: Option<String>,
    pub ts_ms: i64,
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

    /// Pages recorded undeliverable since this engine started.
    pub(crate) fn undeliverable(&self) -> u64 {
        self.undeliverable
    }

    /// Page (`seq`, `target`) is still to be sent: kept with `p` (its tries
    /// so far, when the next is due) — unless it is already kept.
    pub(crate) fn keep(&mut self, seq: u64, target: String, p: Pending) {
        self.items.entry((seq, target)).or_insert(p);
    }

    /// Page (`seq`, `target`) failed again: its next try is `p`'s.
    pub(crate) fn retry_later(&mut self, seq: u64, target: String, p: Pending) {
        self.items.insert((seq, target), p);
    }

    /// Page (`seq`, `target`) is done with: delivered, or given up
    /// (`undeliverable`: counted), or nothing left to send it with.
    pub(crate) fn done(&mut self, seq: u64, target: &str, undeliverable: bool) {
        self.items.remove(&(seq, target.to_string()));
        if undeliverable {
            self.undeliverable += 1;
        }
    }

    /// Escalation `page` on `node` is open at the pager.
    pub(crate) fn open_page(&mut self, node: &str, page: OpenPage) {
        self.open.entry(node.to_string()).or_default().push(page);
    }

    /// The newest page on `node` still firing at `now` (a page fires
    /// `firing_ms` by itself).
    pub(crate) fn newest_open(&self, node: &str, now: i64, firing_ms: i64) -> Option<u64> {
        self.open.get(node)?.iter().filter(|p| now.saturating_sub(p.ts_ms) < firing_ms).map(|p| p.seq).max()
    }

    /// Take the open pages on `node` (of GPU `gpu` only, when given; not
    /// those run `except_run` sent) to end them.
    pub(crate) fn take_open(&mut self, node: &str, gpu: Option<u32>, except_run: Option<&str>) -> Vec<OpenPage> {
        let Some(open) = self.open.get_mut(node) else { return Vec::new() };
        let (take, keep): (Vec<OpenPage>, Vec<OpenPage>) = std::mem::take(open).into_iter().partition(|p| {
            gpu.is_none_or(|g| p.gpu == Some(g)) && (except_run.is_none() || p.run.as_deref() != except_run)
        });
        *open = keep;
        take
    }

    /// A finding (`key`) was said at `at`.
    pub(crate) fn said(&mut self, key: PagedKey, at: SaidAt) {
        self.paged.insert(key, at);
    }

    /// When a finding (`key`) was said last, if it is remembered.
    pub(crate) fn said_at(&self, key: &PagedKey) -> Option<SaidAt> {
        self.paged.get(key).copied()
    }

    /// Forget what `runbook` notified about `node`/`gpu` (its
    /// notifications' findings; pages keep their own rule). Whether there
    /// was any.
    pub(crate) fn forget_said(&mut self, runbook: &str, node: &str, gpu: Option<u32>) -> bool {
        let before = self.paged.len();
        self.paged
            .retain(|(rb, n, g, shape), _| !(rb == runbook && n == node && *g == gpu && shape.starts_with("notify:")));
        self.paged.len() != before
    }

    /// The GPU was repaired, or a person took the node over: what was
    /// paged about it is forgotten (its next fault pages again).
    pub(crate) fn forget_paged(&mut self, node: &str, gpu: Option<u32>) {
        self.paged.retain(|(_, n, g, _), _| !(n == node && (gpu.is_none() || g.is_none() || *g == gpu)));
    }

    /// Whether (`seq`, `target`) is waiting.
    pub fn contains(&self, seq: u64, target: &str) -> bool {
        self.items.contains_key(&(seq, target.to_string()))
    }

    /// The pages due at `now`, marked busy.
    pub(crate) fn take_due(&mut self, now: i64) -> Vec<(u64, String, u32)> {
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

/// The pause before a page's `k`-th retry (1-based): 30 s doubling, at
/// most `max_ms` (`notifications.retry_max_secs`, 5 min by default).
pub fn backoff_ms(k: u32, max_ms: i64) -> i64 {
    (30_000i64 << k.saturating_sub(1).min(6)).min(max_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_grows_to_five_minutes() {
        let pauses: Vec<i64> = (1..=7).map(|k| backoff_ms(k, 300_000)).collect();
        assert_eq!(pauses, vec![30_000, 60_000, 120_000, 240_000, 300_000, 300_000, 300_000]);
        assert_eq!(backoff_ms(1, 10_000), 10_000, "a shorter cap is the first pause too");
        assert_eq!(backoff_ms(40, 3_600_000), 1_920_000, "no overflow however many tries");
    }

    #[test]
    fn due_pages_are_taken_once() {
        let mut ob = Outbox::default();
        ob.keep(7, "pager".into(), Pending { first_ms: 0, attempts: 3, next_ms: 100, busy: false });
        ob.keep(8, "pager".into(), Pending { first_ms: 0, attempts: 3, next_ms: 900, busy: false });
        assert_eq!(ob.take_due(500), vec![(7, "pager".to_string(), 3)]);
        assert!(ob.take_due(500).is_empty(), "in flight: not taken twice");
        assert_eq!(ob.take_due(1000), vec![(8, "pager".to_string(), 3)]);
    }

    #[test]
    fn open_pages_are_taken_by_gpu_and_run_and_kept_otherwise() {
        let mut ob = Outbox::default();
        let page = |seq, gpu, run: &str| OpenPage { seq, gpu, run: Some(run.into()), ts_ms: seq as i64 };
        ob.open_page("n1", page(1, Some(0), "r1"));
        ob.open_page("n1", page(2, Some(1), "r1"));
        ob.open_page("n1", page(3, Some(1), "r2"));
        assert_eq!(ob.newest_open("n1", 3, 10), Some(3));
        assert_eq!(ob.newest_open("n1", 12, 10), Some(3), "3 fires until 13");
        assert_eq!(ob.newest_open("n1", 13, 10), None, "past its firing time");
        // GPU 1's pages but those run r2 sent.
        assert_eq!(ob.take_open("n1", Some(1), Some("r2")), vec![page(2, Some(1), "r1")]);
        assert_eq!(ob.take_open("n1", None, None).len(), 2, "the rest, once");
        assert!(ob.take_open("n1", None, None).is_empty() && ob.take_open("n2", None, None).is_empty());
    }

    #[test]
    fn a_repair_forgets_the_pages_and_a_cleared_finding_only_its_notifications() {
        let mut ob = Outbox::default();
        let at = SaidAt { seq: 1, ts_ms: 0, size: None };
        let key = |shape: &str, gpu| ("rb".to_string(), "n1".to_string(), gpu, shape.to_string());
        ob.said(key("hot", Some(0)), at);
        ob.said(key("notify:hot", Some(0)), at);
        ob.said(key("hot", Some(1)), at);
        assert!(ob.forget_said("rb", "n1", Some(0)));
        assert!(!ob.forget_said("rb", "n1", Some(0)), "nothing left to forget");
        assert!(ob.said_at(&key("hot", Some(0))).is_some(), "a page keeps its own rule");
        ob.forget_paged("n1", Some(0));
        assert!(ob.said_at(&key("hot", Some(0))).is_none() && ob.said_at(&key("hot", Some(1))).is_some());
        ob.done(9, "pager", true);
        assert_eq!(ob.undeliverable(), 1);
    }
}
