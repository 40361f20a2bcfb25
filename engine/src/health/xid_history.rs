//! Each GPU's XID history: every event by code, from the agents' counts
//! (`GpuTelemetry::xid_counts`), kept for the XID policy's repeat window, so
//! the same non-fatal XID again and again on one GPU is seen — the
//! `xid_last` gauge holds only the last code, and the same code twice is no
//! change on it.
//!
//! In memory: an engine that restarts starts counting again (it misses
//! repeats from before, never invents one). An agent that restarts counts
//! from zero: a count lower than the last one read is that, not a loss.

use std::collections::{BTreeMap, HashMap, VecDeque};

use nightshift_proto::XidCount;

use crate::health::xid_policy::{MAX_REPEAT_WINDOW_SECS, XidPolicy};

/// At most this many event times kept per GPU and code (a flood is more
/// than any rule counts).
const MAX_EVENTS: usize = 256;

/// One XID code repeating on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeat {
    pub code: u32,
    /// Its events within the window.
    pub events: usize,
}

#[derive(Debug, Default)]
pub struct XidHistory {
    /// (node, GPU) → the counts read last.
    last: HashMap<(u32, u32), BTreeMap<u32, u64>>,
    /// (node, GPU) → code → when its events were seen, oldest first.
    events: HashMap<(u32, u32), BTreeMap<u32, VecDeque<i64>>>,
}

impl XidHistory {
    /// One GPU's counts read at `ts_ms`: the events since the last reading
    /// are remembered. The first reading of a GPU is its baseline (when
    /// its earlier events happened is unknown). Whether any event was new.
    pub fn observe(&mut self, node: u32, gpu: u32, ts_ms: i64, counts: &[XidCount]) -> bool {
        let now: BTreeMap<u32, u64> = counts.iter().map(|c| (c.code, c.events)).collect();
        if self.last.get(&(node, gpu)) == Some(&now) {
            return false;
        }
        let Some(before) = self.last.insert((node, gpu), now.clone()) else { return false };
        // Fewer events than before under any code: the agent restarted and
        // counts from zero.
        let restarted = before.iter().any(|(code, n)| now.get(code).copied().unwrap_or(0) < *n);
        let mut any = false;
        for (code, n) in now {
            let was = if restarted { 0 } else { before.get(&code).copied().unwrap_or(0) };
            let new = n.saturating_sub(was).min(MAX_EVENTS as u64) as usize;
            if new == 0 {
                continue;
            }
            any = true;
            let q = self.events.entry((node, gpu)).or_default().entry(code).or_default();
            for _ in 0..new {
                q.push_back(ts_ms);
            }
            while q.len() > MAX_EVENTS {
                q.pop_front();
            }
        }
        if any {
            self.forget_before(ts_ms - MAX_REPEAT_WINDOW_SECS as i64 * 1000);
        }
        any
    }

    /// The codes that are not a fault by `policy` seen on the GPU more than
    /// the policy's `repeats.more_than` times within its window up to
    /// `now_ms`, the most frequent first.
    pub fn repeats(&self, node: u32, gpu: u32, now_ms: i64, policy: &XidPolicy) -> Vec<Repeat> {
        let rule = &policy.repeats;
        let from = now_ms.saturating_sub((rule.window_secs as i64).saturating_mul(1000));
        let Some(codes) = self.events.get(&(node, gpu)) else { return Vec::new() };
        let mut out: Vec<Repeat> = codes
            .iter()
            .filter(|(code, _)| !policy.is_fault(**code))
            .map(|(code, q)| Repeat { code: *code, events: q.iter().filter(|t| **t > from).count() })
            .filter(|r| r.events > rule.more_than as usize)
            .collect();
        out.sort_by(|a, b| b.events.cmp(&a.events).then(a.code.cmp(&b.code)));
        out
    }

    /// How far the GPU's most frequent repeating code is over the rule (0:
    /// none over it): the `gpu.xid_repeats_over_limit` reading.
    pub fn over_limit(&self, node: u32, gpu: u32, now_ms: i64, policy: &XidPolicy) -> f64 {
        self.repeats(node, gpu, now_ms, policy)
            .first()
            .map_or(0.0, |r| (r.events - policy.repeats.more_than as usize) as f64)
    }

    fn forget_before(&mut self, ts_ms: i64) {
        self.events.retain(|_, codes| {
            codes.retain(|_, q| {
                while q.front().is_some_and(|t| *t < ts_ms) {
                    q.pop_front();
                }
                !q.is_empty()
            });
            !codes.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(u32, u64)]) -> Vec<XidCount> {
        pairs.iter().map(|&(code, events)| XidCount { code, events }).collect()
    }

    #[test]
    fn the_same_app_xid_four_times_in_a_day_is_a_repeat_and_a_fault_code_is_not() {
        let policy = XidPolicy::shipped();
        let mut h = XidHistory::default();
        let hour = 3_600_000;
        // The baseline: two XID 31s from before this engine saw the GPU.
        assert!(!h.observe(0, 2, 0, &counts(&[(31, 2)])));
        for i in 1..=3 {
            assert!(h.observe(0, 2, i * hour, &counts(&[(31, 2 + i as u64)])));
        }
        assert!(h.repeats(0, 2, 3 * hour, policy).is_empty(), "three in the window: the rule is more than 3");
        assert!(h.observe(0, 2, 4 * hour, &counts(&[(31, 6), (79, 5)])));
        assert_eq!(h.repeats(0, 2, 4 * hour, policy), vec![Repeat { code: 31, events: 4 }], "79 is a fault already");
        assert_eq!(h.over_limit(0, 2, 4 * hour, policy), 1.0);
        // Another GPU, another node: their own histories.
        assert!(h.repeats(0, 3, 4 * hour, policy).is_empty() && h.repeats(1, 2, 4 * hour, policy).is_empty());
        // A day after the first, it has left the window.
        assert!(h.repeats(0, 2, 25 * hour + 1, policy).is_empty());
        assert_eq!(h.over_limit(0, 2, 25 * hour + 1, policy), 0.0);
    }

    #[test]
    fn an_agent_restart_counts_from_zero_and_a_flood_is_bounded() {
        let policy = XidPolicy::shipped();
        let mut h = XidHistory::default();
        h.observe(0, 0, 0, &counts(&[(13, 10)]));
        // The agent restarted: 3 new events, not a loss of 7.
        assert!(h.observe(0, 0, 1_000, &counts(&[(13, 3)])));
        assert!(h.repeats(0, 0, 1_000, policy).is_empty());
        assert!(h.observe(0, 0, 2_000, &counts(&[(13, 4)])));
        assert_eq!(h.repeats(0, 0, 2_000, policy), vec![Repeat { code: 13, events: 4 }]);
        h.observe(0, 0, 3_000, &counts(&[(13, 1_000_000)]));
        assert_eq!(h.repeats(0, 0, 3_000, policy)[0].events, MAX_EVENTS);
        // No new events: nothing new.
        assert!(!h.observe(0, 0, 4_000, &counts(&[(13, 1_000_000)])));
    }
}
