//! What a policy cost, from what happened: each fault's times (when it
//! struck, when it was quarantined, when its job was moved, when it was
//! repaired) and each node's time out of service. One function for every
//! policy, so the three are measured the same way; only where the times
//! come from differs (the real engine's actions for `nightshift`, the
//! seeds' delays for `manual`, the instant for `oracle`).
//!
//! The workload is one large synchronous job on `job_nodes` nodes (the
//! rest are standbys). Its life, event by event:
//!
//! - running: it advances at full speed, slower while a node with a
//!   `slow` fault is in it; it checkpoints every `checkpoint_ms`;
//! - a `kill` fault on one of its nodes, or one of its nodes taken out of
//!   service (a drain requeues it): it dies, loses the work since its last
//!   checkpoint, and restarts after `restart_ms`;
//! - a `hang` fault: it stops advancing until one of its nodes is taken
//!   out of service or its job is requeued, then restarts as above;
//! - a restart takes the nodes it had that are still in service and fills
//!   up with in-service standbys in order; too few: it waits. A restart
//!   onto a node whose repairable fault is still there fails, and restarts
//!   again (`restarts_onto_broken_nodes`).
//!
//! GPU-hours lost, by cause (node-seconds × GPUs per node, no second
//! counted twice for the job's nodes): the work redone since the last
//! checkpoint; restarts; the job's time lost to a broken node left in
//! service (failed restarts onto it, a hang not yet moved, the share a slow
//! node costs); the job waiting for capacity; and the fleet's nodes out of
//! service, with a fault (quarantined awaiting repair) or without one
//! (healthy but drained). A standby idle and healthy costs nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::mix::{Effect, FaultClass, Repair};
use super::schedule::Fault;

/// The job.
#[derive(Debug, Clone, Copy)]
pub struct JobModel {
    pub nodes: usize,
    pub job_nodes: usize,
    pub gpus_per_node: u32,
    pub checkpoint_ms: i64,
    pub restart_ms: i64,
    pub horizon_ms: i64,
}

/// One fault's times under one policy (ms from the start).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Its node or GPU taken out of service, or (a thermal fault) its
    /// first mitigation; for a hang, its job moved.
    pub quarantined_ms: Option<i64>,
    /// The fault is gone (repaired, or a transient one over). `None`: still
    /// there at the end.
    pub cleared_ms: Option<i64>,
    /// Its job requeued without a drain (a hung job moved by a person).
    pub requeued_ms: Option<i64>,
}

/// Percentiles of a set of durations, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    pub count: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Stats {
    pub fn of(mut v: Vec<u64>) -> Stats {
        v.sort_unstable();
        let q = |p: f64| -> u64 {
            if v.is_empty() {
                return 0;
            }
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        Stats { count: v.len(), p50: q(0.5), p90: q(0.9), p99: q(0.99), max: v.last().copied().unwrap_or(0) }
    }
}

/// What one policy cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Accounting {
    pub ettr: f64,
    pub gpu_hours_lost: f64,
    pub gpu_hours_lost_by_cause: BTreeMap<String, f64>,
    /// Over faults with a hardware signal; one never quarantined counts
    /// until the end of the run.
    pub time_to_quarantine_secs: Stats,
    /// Over hung jobs: until the job was moved.
    pub hung_job_time_to_requeue_secs: Stats,
    pub job_interruptions: u64,
    pub restarts_onto_broken_nodes: u64,
    /// Detectable faults never quarantined (nor their job moved).
    pub undetected: u64,
}

pub const CAUSES: [&str; 7] = [
    "broken_but_in_service",
    "healthy_but_drained",
    "lost_since_checkpoint",
    "quarantined_awaiting_repair",
    "restarts",
    "waiting_for_capacity",
    "hung_not_moved",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    // In this order at one instant: a node back in service, then a fault
    // (before its own end, for one that is over at once), what ends, what
    // starts.
    OutEnd(usize),
    Struck(usize),
    Cleared(usize),
    OutStart(usize),
    Requeued(usize),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Running {
        since_ms: i64,
    },
    Hung {
        since_ms: i64,
        lost_ms: i64,
    },
    /// Restarting until `until_ms`; `onto_broken`: a retry after a restart
    /// onto a broken node.
    Restarting {
        until_ms: i64,
        onto_broken: bool,
    },
    Waiting,
}

fn repairable(c: &FaultClass) -> bool {
    c.repair != Repair::None
}

/// Account a policy's run.
pub fn account(
    job: JobModel,
    classes: &[FaultClass],
    faults: &[Fault],
    outcomes: &[Outcome],
    out_of_service: &[Vec<(i64, i64)>],
) -> Accounting {
    let horizon = job.horizon_ms;
    let mut events: Vec<(i64, Ev)> = Vec::new();
    for (n, spans) in out_of_service.iter().enumerate() {
        for &(a, b) in spans {
            if a < horizon && b > a {
                events.push((a.max(0), Ev::OutStart(n)));
                events.push((b.min(horizon), Ev::OutEnd(n)));
            }
        }
    }
    for (i, f) in faults.iter().enumerate() {
        if f.at_ms >= horizon {
            continue;
        }
        events.push((f.at_ms, Ev::Struck(i)));
        if let Some(c) = outcomes[i].cleared_ms.filter(|c| *c < horizon) {
            events.push((c.max(f.at_ms), Ev::Cleared(i)));
        }
        if let Some(r) = outcomes[i].requeued_ms.filter(|r| *r < horizon) {
            events.push((r.max(f.at_ms), Ev::Requeued(i)));
        }
    }
    events.sort();

    let mut out_depth = vec![0u32; job.nodes];
    // Present faults per node: repairable ones, slow ones (with their
    // slowdown), hang ones.
    let mut present: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); job.nodes];
    let mut alloc: BTreeSet<usize> = (0..job.job_nodes.min(job.nodes)).collect();
    let mut phase = Phase::Running { since_ms: 0 };
    let mut lost: BTreeMap<&'static str, f64> = CAUSES.iter().map(|c| (*c, 0.0)).collect();
    let mut useful_ms = 0.0f64;
    let mut interruptions = 0u64;
    let mut onto_broken = 0u64;
    let mut last = 0i64;
    let mut i = 0usize;
    let broken = |present: &Vec<BTreeSet<usize>>, n: usize| {
        present[n].iter().any(|&f| {
            let c = &classes[faults[f].class];
            repairable(c) && matches!(c.effect, Effect::Kill | Effect::Hang)
        })
    };
    let speed = |present: &Vec<BTreeSet<usize>>, alloc: &BTreeSet<usize>| {
        let mut s = 1.0f64;
        for &n in alloc {
            for &f in &present[n] {
                let c = &classes[faults[f].class];
                if c.effect == Effect::Slow {
                    s = s.min(1.0 - c.slowdown());
                }
            }
        }
        s
    };
    loop {
        // The next instant: an event, or the restart timer.
        let timer = match phase {
            Phase::Restarting { until_ms, .. } => Some(until_ms),
            _ => None,
        };
        let next_ev = events.get(i).map(|e| e.0);
        let t = match (next_ev, timer) {
            (Some(e), Some(tm)) => e.min(tm),
            (Some(e), None) => e,
            (None, Some(tm)) => tm,
            (None, None) => horizon,
        }
        .min(horizon);
        // Account [last, t).
        let dt = (t - last).max(0) as f64;
        if dt > 0.0 {
            let j = alloc.len() as f64;
            match phase {
                Phase::Running { .. } => {
                    let s = speed(&present, &alloc);
                    useful_ms += dt * s;
                    *lost.entry("broken_but_in_service").or_default() += dt * (1.0 - s) * j;
                }
                Phase::Hung { .. } => *lost.entry("hung_not_moved").or_default() += dt * j,
                Phase::Restarting { onto_broken: true, .. } => {
                    *lost.entry("broken_but_in_service").or_default() += dt * job.job_nodes as f64
                }
                Phase::Restarting { .. } => *lost.entry("restarts").or_default() += dt * job.job_nodes as f64,
                Phase::Waiting => *lost.entry("waiting_for_capacity").or_default() += dt * job.job_nodes as f64,
            }
            for n in 0..job.nodes {
                if out_depth[n] > 0 {
                    let cause = if present[n].iter().any(|&f| repairable(&classes[faults[f].class])) {
                        "quarantined_awaiting_repair"
                    } else {
                        "healthy_but_drained"
                    };
                    *lost.entry(cause).or_default() += dt;
                }
            }
        }
        last = t;
        if t >= horizon {
            break;
        }
        // Apply every event at t.
        let mut struck = Vec::new();
        let mut requeued = false;
        let mut went_out = false;
        while i < events.len() && events[i].0 == t {
            match events[i].1 {
                Ev::OutEnd(n) => out_depth[n] = out_depth[n].saturating_sub(1),
                Ev::OutStart(n) => {
                    out_depth[n] += 1;
                    went_out |= alloc.contains(&n);
                }
                Ev::Cleared(f) => {
                    present[faults[f].node].remove(&f);
                }
                Ev::Struck(f) => {
                    present[faults[f].node].insert(f);
                    struck.push(f);
                }
                Ev::Requeued(f) => requeued |= alloc.contains(&faults[f].node),
            }
            i += 1;
        }
        let since_ckpt = |since: i64| ((t - since) % job.checkpoint_ms.max(1)) as f64;
        let kill = |phase: &mut Phase, lost: &mut BTreeMap<&'static str, f64>, rework: f64| {
            *lost.entry("lost_since_checkpoint").or_default() += rework * job.job_nodes as f64;
            *phase = Phase::Restarting { until_ms: t + job.restart_ms, onto_broken: false };
        };
        match phase {
            Phase::Running { since_ms } => {
                let killed = struck
                    .iter()
                    .any(|&f| alloc.contains(&faults[f].node) && classes[faults[f].class].effect == Effect::Kill);
                let hung = struck
                    .iter()
                    .any(|&f| alloc.contains(&faults[f].node) && classes[faults[f].class].effect == Effect::Hang);
                if killed || went_out {
                    interruptions += 1;
                    let rework = since_ckpt(since_ms);
                    // The work since the checkpoint was counted as useful.
                    useful_ms -= rework;
                    kill(&mut phase, &mut lost, rework);
                } else if hung && requeued {
                    // Moved the instant it hung: a restart, like a kill.
                    interruptions += 1;
                    let rework = since_ckpt(since_ms);
                    useful_ms -= rework;
                    kill(&mut phase, &mut lost, rework);
                } else if hung {
                    interruptions += 1;
                    let rework = since_ckpt(since_ms);
                    useful_ms -= rework;
                    phase = Phase::Hung { since_ms: t, lost_ms: rework as i64 };
                }
            }
            Phase::Hung { lost_ms, .. } => {
                if went_out || requeued {
                    kill(&mut phase, &mut lost, lost_ms as f64);
                }
            }
            Phase::Restarting { until_ms, .. } if until_ms <= t => {
                phase = start(&mut alloc, &out_depth, &present, job, t, &broken, &mut onto_broken);
            }
            Phase::Waiting => {
                let free = (0..job.nodes).filter(|&n| out_depth[n] == 0).count();
                if free >= job.job_nodes {
                    phase = Phase::Restarting { until_ms: t + job.restart_ms, onto_broken: false };
                }
            }
            Phase::Restarting { .. } => {}
        }
    }

    let gpus = job.gpus_per_node as f64;
    let to_gpu_hours = |node_ms: f64| node_ms * gpus / 3_600_000.0;
    let by_cause: BTreeMap<String, f64> = lost.iter().map(|(k, v)| (k.to_string(), round3(to_gpu_hours(*v)))).collect();
    let total = round3(lost.values().map(|v| to_gpu_hours(*v)).sum());
    let mut ttq = Vec::new();
    let mut hung_ttq = Vec::new();
    let mut undetected = 0;
    for (i, f) in faults.iter().enumerate() {
        let c = &classes[f.class];
        if f.at_ms >= horizon || !c.signal.detectable() {
            continue;
        }
        let q = outcomes[i].quarantined_ms.or(outcomes[i].requeued_ms);
        if q.is_none() {
            undetected += 1;
        }
        let secs = ((q.unwrap_or(horizon).min(horizon) - f.at_ms).max(0) / 1000) as u64;
        if c.signal.hardware() { ttq.push(secs) } else { hung_ttq.push(secs) }
    }
    Accounting {
        ettr: round6((useful_ms / horizon.max(1) as f64).max(0.0)),
        gpu_hours_lost: total,
        gpu_hours_lost_by_cause: by_cause,
        time_to_quarantine_secs: Stats::of(ttq),
        hung_job_time_to_requeue_secs: Stats::of(hung_ttq),
        job_interruptions: interruptions,
        restarts_onto_broken_nodes: onto_broken,
        undetected,
    }
}

/// A restart is done: place the job.
fn start(
    alloc: &mut BTreeSet<usize>,
    out_depth: &[u32],
    present: &Vec<BTreeSet<usize>>,
    job: JobModel,
    t: i64,
    broken: &dyn Fn(&Vec<BTreeSet<usize>>, usize) -> bool,
    onto_broken: &mut u64,
) -> Phase {
    alloc.retain(|&n| out_depth[n] == 0);
    for (n, depth) in out_depth.iter().enumerate().take(job.nodes) {
        if alloc.len() >= job.job_nodes {
            break;
        }
        if *depth == 0 {
            alloc.insert(n);
        }
    }
    if alloc.len() < job.job_nodes {
        return Phase::Waiting;
    }
    if alloc.iter().any(|&n| broken(present, n)) {
        // It dies at its first collective and is restarted again.
        *onto_broken += 1;
        return Phase::Restarting { until_ms: t + job.restart_ms, onto_broken: true };
    }
    Phase::Running { since_ms: t }
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::mix::{FaultClass, Signal};

    fn class(effect: Effect, repair: Repair) -> FaultClass {
        FaultClass {
            name: "c".into(),
            count: 1.0,
            signal: Signal::EccDbe,
            xid_code: None,
            effect,
            slowdown_pct: None,
            repair,
            repair_secs: (repair != Repair::None).then_some(3600),
        }
    }

    const H: i64 = 3_600_000;

    fn job() -> JobModel {
        JobModel {
            nodes: 4,
            job_nodes: 3,
            gpus_per_node: 8,
            checkpoint_ms: H / 2,
            restart_ms: H / 6,
            horizon_ms: 10 * H,
        }
    }

    #[test]
    fn a_quiet_fleet_trains_all_the_time_and_loses_nothing() {
        let a = account(job(), &[], &[], &[], &vec![vec![]; 4]);
        assert_eq!(a.ettr, 1.0);
        assert_eq!(a.gpu_hours_lost, 0.0);
        assert_eq!(a.job_interruptions, 0);
    }

    #[test]
    fn a_fault_quarantined_at_once_costs_the_checkpoint_the_restart_and_the_repair() {
        // A kill at 1 h 10 min on node 0, drained at once, repaired in 1 h.
        let at = H + H / 6;
        let faults = [Fault { id: 0, class: 0, node: 0, gpu: 0, at_ms: at }];
        let outcomes = [Outcome { quarantined_ms: Some(at), cleared_ms: Some(at + H), requeued_ms: None }];
        let mut out = vec![vec![]; 4];
        out[0] = vec![(at, at + H)];
        let a = account(job(), &[class(Effect::Kill, Repair::Reset)], &faults, &outcomes, &out);
        let c = &a.gpu_hours_lost_by_cause;
        // 10 minutes since the 1 h checkpoint × 3 nodes × 8 GPUs = 4 GPU-hours.
        assert_eq!(c["lost_since_checkpoint"], 4.0);
        // One 10-minute restart on the standby: 4 GPU-hours.
        assert_eq!(c["restarts"], 4.0);
        // The node out for its 1 h repair: 8 GPU-hours.
        assert_eq!(c["quarantined_awaiting_repair"], 8.0);
        assert_eq!(c["broken_but_in_service"], 0.0);
        assert_eq!(a.restarts_onto_broken_nodes, 0);
        assert_eq!(a.job_interruptions, 1);
        assert_eq!(a.time_to_quarantine_secs.max, 0);
        // 20 minutes of the job lost over 10 hours.
        assert!((a.ettr - (1.0 - (1.0 / 3.0) / 10.0)).abs() < 1e-6, "{}", a.ettr);
    }

    #[test]
    fn a_broken_node_left_in_service_takes_every_restart_down_until_it_is_drained() {
        // Killed at 1 h; the node is drained only 87 minutes later.
        let at = H;
        let q = at + 87 * 60_000;
        let faults = [Fault { id: 0, class: 0, node: 0, gpu: 0, at_ms: at }];
        let outcomes = [Outcome { quarantined_ms: Some(q), cleared_ms: Some(q + H), requeued_ms: None }];
        let mut out = vec![vec![]; 4];
        out[0] = vec![(q, q + H)];
        let a = account(job(), &[class(Effect::Kill, Repair::Reset)], &faults, &outcomes, &out);
        // Restarts at 1:10, 1:20, … each onto the broken node, until the drain at 2:27.
        assert_eq!(a.restarts_onto_broken_nodes, 8);
        assert!(a.gpu_hours_lost_by_cause["broken_but_in_service"] > 30.0, "{a:?}");
        assert_eq!(a.time_to_quarantine_secs.max, 87 * 60);
    }

    #[test]
    fn a_hang_stops_the_job_until_it_is_moved() {
        let at = H;
        let faults = [Fault { id: 0, class: 0, node: 1, gpu: 0, at_ms: at }];
        let outcomes = [Outcome { quarantined_ms: None, cleared_ms: Some(at + H), requeued_ms: Some(at + H) }];
        let mut c = class(Effect::Hang, Repair::None);
        c.signal = Signal::HungJob;
        let a = account(job(), &[c], &faults, &outcomes, &vec![vec![]; 4]);
        assert_eq!(a.gpu_hours_lost_by_cause["hung_not_moved"], 24.0);
        assert_eq!(a.hung_job_time_to_requeue_secs.max, 3600);
        assert_eq!(a.time_to_quarantine_secs.count, 0);
    }

    #[test]
    fn a_healthy_node_drained_costs_its_capacity_and_the_job_it_interrupted() {
        let mut out = vec![vec![]; 4];
        out[2] = vec![(H, 2 * H)];
        let a = account(job(), &[], &[], &[], &out);
        assert_eq!(a.gpu_hours_lost_by_cause["healthy_but_drained"], 8.0);
        assert_eq!(a.job_interruptions, 1);
    }
}
