//! The applied-request journal: what makes request ids idempotent, across
//! agent restarts.
//!
//! Every mutating request is journaled: a `pending` line before the change
//! is made (durable, in the same state-log line as the holds it places), a
//! `done` line with the reply after. A repeated id returns the recorded
//! reply. An id left `pending` by a crash is *indeterminate*: the agent
//! will never apply it again, and says so. Lease reverts are journaled
//! too. The lines live in the agent's state log (`statelog`); this is the
//! index over them, in memory.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use nightshift_proto::Reply;

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum JournalLine {
    Pending { id: String, digest: String, op: String, at_ms: i64 },
    Done { id: String, digest: String, op: String, at_ms: i64, reply: Reply },
    Reverted { id: String, at_ms: i64, ok: bool, detail: String },
}

/// What the journal knows about an id.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub digest: String,
    pub op: String,
    /// `None` while (or if, after a crash) the change is in flight.
    pub reply: Option<Reply>,
    pub reverted: Option<(i64, bool, String)>,
}

/// The journal's index: every id's state, oldest first.
#[derive(Debug, Default)]
pub struct Journal {
    entries: HashMap<String, Entry>,
    order: Vec<String>,
}

/// Most ids kept; the oldest are dropped (down to half) when the state log
/// is compacted with more.
pub const KEEP: usize = 100_000;

impl Journal {
    /// What is known about `id`.
    pub fn lookup(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// How many ids it knows.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Take one line in (written to the log, or replayed from it).
    pub fn apply(&mut self, line: JournalLine) {
        apply_line(&mut self.entries, &mut self.order, line);
    }

    /// Drop the oldest ids, down to half of [`KEEP`], once there are more
    /// than [`KEEP`].
    pub fn trim(&mut self) {
        if self.order.len() > KEEP {
            let drop = self.order.len() - KEEP / 2;
            for id in self.order.drain(..drop) {
                self.entries.remove(&id);
            }
        }
    }

    /// The lines that rebuild the journal (a snapshot's).
    pub fn lines(&self) -> Vec<JournalLine> {
        self.order.iter().flat_map(|id| lines_for(id, &self.entries[id])).collect()
    }
}

/// The line saying `id` is about to be applied.
pub fn pending(id: &str, digest: &str, op: &str, at_ms: i64) -> JournalLine {
    JournalLine::Pending { id: id.into(), digest: digest.into(), op: op.into(), at_ms }
}

/// The line recording `id`'s reply.
pub fn done(id: &str, digest: &str, op: &str, at_ms: i64, reply: &Reply) -> JournalLine {
    JournalLine::Done { id: id.into(), digest: digest.into(), op: op.into(), at_ms, reply: reply.clone() }
}

fn apply_line(entries: &mut HashMap<String, Entry>, order: &mut Vec<String>, line: JournalLine) {
    match line {
        JournalLine::Pending { id, digest, op, .. } => {
            if !entries.contains_key(&id) {
                order.push(id.clone());
            }
            entries.insert(id, Entry { digest, op, reply: None, reverted: None });
        }
        JournalLine::Done { id, digest, op, reply, .. } => {
            if !entries.contains_key(&id) {
                order.push(id.clone());
            }
            let e = entries.entry(id).or_insert(Entry {
                digest: digest.clone(),
                op: op.clone(),
                reply: None,
                reverted: None,
            });
            e.reply = Some(reply);
        }
        JournalLine::Reverted { id, at_ms, ok, detail } => {
            if let Some(e) = entries.get_mut(&id) {
                e.reverted = Some((at_ms, ok, detail));
            }
        }
    }
}

fn lines_for(id: &str, e: &Entry) -> Vec<JournalLine> {
    let mut v = vec![JournalLine::Pending { id: id.into(), digest: e.digest.clone(), op: e.op.clone(), at_ms: 0 }];
    if let Some(r) = &e.reply {
        v.push(JournalLine::Done {
            id: id.into(),
            digest: e.digest.clone(),
            op: e.op.clone(),
            at_ms: 0,
            reply: r.clone(),
        });
    }
    if let Some((at, ok, d)) = &e.reverted {
        v.push(JournalLine::Reverted { id: id.into(), at_ms: *at, ok: *ok, detail: d.clone() });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_proto::ErrorCode;

    #[test]
    fn lines_rebuild_the_same_index_and_trim_keeps_the_newest() {
        let mut j = Journal::default();
        j.apply(pending("a", "d1", "set_power_limit", 1));
        j.apply(done("a", "d1", "set_power_limit", 2, &Reply::ok("a", serde_json::json!({"x":1}))));
        j.apply(pending("b", "d2", "drain", 3));
        j.apply(JournalLine::Reverted { id: "a".into(), at_ms: 9, ok: true, detail: "back".into() });
        let mut again = Journal::default();
        for l in j.lines() {
            again.apply(l);
        }
        assert_eq!(again.lookup("a"), j.lookup("a"));
        assert_eq!(again.lookup("b").unwrap().reply, None, "b stays pending: indeterminate");
        for i in 0..=KEEP {
            j.apply(done(&format!("x{i}"), "d", "drain", 4, &Reply::err("x", ErrorCode::HandsOff, "no")));
        }
        j.trim();
        assert_eq!(j.len(), KEEP / 2);
        assert!(j.lookup("a").is_none() && j.lookup(&format!("x{KEEP}")).is_some());
    }
}
