//! `nightshift simulate`: a fleet's fault mix played for weeks of virtual
//! time under three policies on the *same* schedule, and what each cost.
//!
//! - [`mix`]: the fault mix file (classes, counts over GPU-days, signals,
//!   effects, repairs), validated with file:line:column;
//! - [`schedule`]: the faults drawn from it for a fleet, a horizon, a seed;
//! - [`nightshift`]: the `nightshift` policy — the real engine and runbooks
//!   on a [`crate::fleet::SimFleet`];
//! - [`account`]: one accounting for every policy (the job, ETTR, GPU-hours
//!   lost by cause, time to quarantine);
//! - [`report`]: the JSON report (no wall-clock field: a seed gives the same
//!   bytes) and its HTML page.
//!
//! `manual` is the seeds' process: a person sees a detectable fault 45
//! minutes after it ([`MANUAL_ALERT_LAG_MS`]) and needs 42 more minutes
//! ([`MANUAL_MTTR_MS`]) to drain it, move its work and start the repair.
//! `oracle` is the physical limit: every detectable fault quarantined and
//! its work moved the instant it happens. The same repair model applies to
//! all three: a repair starts when the node is taken out of service and
//! takes the class's `repair_secs`.

pub mod account;
pub mod mix;
pub mod nightshift;
pub mod operations;
pub mod report;
pub mod schedule;

use std::collections::BTreeMap;
use std::path::PathBuf;

use account::{Accounting, JobModel, Outcome};
use mix::{FaultMix, Repair, Signal};
use schedule::Fault;

/// The seeds' alert lag: a person sees a fault this long after it.
pub const MANUAL_ALERT_LAG_MS: i64 = 45 * 60_000;
/// The seeds' MTTR: from the alert to the node drained and its work moved.
pub const MANUAL_MTTR_MS: i64 = 42 * 60_000;

/// Memory a simulated node takes (engine windows and trigger states,
/// agent, sim state), measured on the shipped runbooks: see
/// docs/BENCHMARKS.md. A run that would need more than the machine has
/// free is refused before it starts.
pub const BYTES_PER_NODE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Mix(#[from] nightshift_engine::embed::LoadError),
    #[error("{0}")]
    Options(String),
    #[error("{0}")]
    Setup(String),
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    pub nodes: usize,
    pub days: f64,
    pub seed: u64,
    pub gpus_per_node: u32,
    pub profile: String,
    pub runbooks: PathBuf,
    /// Share of nodes kept as standbys (not in the job).
    pub standby_pct: f64,
    pub checkpoint_secs: u64,
    pub restart_secs: u64,
    /// A node with no incident is stepped and read this often.
    pub quiet_feed_secs: u64,
    /// The engine is restarted (an upgrade) this often, the first at half
    /// the period; 0: never.
    pub engine_restart_every_secs: u64,
    /// The pager is down for `pager_outage_secs` this often, the first at
    /// a third of the period; 0: never.
    pub pager_outage_every_secs: u64,
    pub pager_outage_secs: u64,
}

impl SimulateOptions {
    pub fn new(nodes: usize, days: f64, seed: u64) -> SimulateOptions {
        SimulateOptions {
            nodes,
            days,
            seed,
            gpus_per_node: 8,
            profile: "h100-sxm".into(),
            runbooks: PathBuf::from("runbooks"),
            standby_pct: 2.0,
            checkpoint_secs: 1800,
            restart_secs: 600,
            quiet_feed_secs: 600,
            engine_restart_every_secs: 7 * 86_400,
            pager_outage_every_secs: 2 * 86_400,
            pager_outage_secs: 1800,
        }
    }

    pub fn horizon_ms(&self) -> i64 {
        (self.days * 86_400_000.0) as i64
    }

    /// Nodes in the job (the rest are standbys; at least one node works).
    pub fn job_nodes(&self) -> usize {
        let standby = (self.nodes as f64 * self.standby_pct / 100.0).round() as usize;
        self.nodes.saturating_sub(standby).max(1)
    }

    /// Refuse what cannot run, before anything starts.
    pub fn check(&self, free_bytes: Option<u64>) -> Result<(), SimulateError> {
        let bad = |m: String| Err(SimulateError::Options(m));
        if self.nodes == 0 || self.nodes > 20_000 {
            return bad(format!("--nodes: expected 1 to 20000, found {}", self.nodes));
        }
        if !(self.days.is_finite() && self.days > 0.0 && self.days <= 366.0) {
            return bad(format!("--days: expected more than 0 and at most 366, found {}", self.days));
        }
        if self.gpus_per_node == 0 || self.gpus_per_node > 8 {
            return bad(format!("--gpus-per-node: expected 1 to 8, found {}", self.gpus_per_node));
        }
        if nightshift_agent::backend::sim::profile(&self.profile).is_none() {
            return bad(format!(
                "--profile: expected one of {}, found {:?}",
                nightshift_agent::backend::sim::profile_keys(),
                self.profile
            ));
        }
        if !(self.standby_pct.is_finite() && (0.0..=50.0).contains(&self.standby_pct)) {
            return bad(format!("--standby-pct: expected 0 to 50, found {}", self.standby_pct));
        }
        if self.checkpoint_secs < 60 || self.checkpoint_secs > 86_400 {
            return bad(format!("--checkpoint-secs: expected 60 to 86400, found {}", self.checkpoint_secs));
        }
        if self.engine_restart_every_secs != 0 && self.engine_restart_every_secs < 3600 {
            return bad(format!(
                "--engine-restart-every-secs: expected 0 (never) or at least 3600, found {}",
                self.engine_restart_every_secs
            ));
        }
        if self.pager_outage_every_secs != 0
            && (self.pager_outage_secs == 0 || self.pager_outage_secs >= self.pager_outage_every_secs)
        {
            return bad(format!(
                "--pager-outage-secs: expected more than 0 and less than --pager-outage-every-secs ({}), found {}",
                self.pager_outage_every_secs, self.pager_outage_secs
            ));
        }
        if self.restart_secs == 0 || self.restart_secs > 86_400 {
            return bad(format!("--restart-secs: expected 1 to 86400, found {}", self.restart_secs));
        }
        let need = self.nodes as u64 * BYTES_PER_NODE;
        if let Some(free) = free_bytes
            && need > free
        {
            return bad(format!(
                "--nodes {}: the simulated fleet needs about {} MiB and this machine has {} MiB free; expected at most {} nodes here",
                self.nodes,
                need >> 20,
                free >> 20,
                free / BYTES_PER_NODE
            ));
        }
        Ok(())
    }

    fn job(&self) -> JobModel {
        JobModel {
            nodes: self.nodes,
            job_nodes: self.job_nodes(),
            gpus_per_node: self.gpus_per_node,
            checkpoint_ms: self.checkpoint_secs as i64 * 1000,
            restart_ms: self.restart_secs as i64 * 1000,
            horizon_ms: self.horizon_ms(),
        }
    }
}

/// The most faults one run draws: each is played on the real engine.
pub const MAX_FAULTS: f64 = 1_000_000.0;

/// Refuse a mix that would draw more faults than a run can play (a huge
/// count, or GPU-days near zero), before drawing any.
pub fn check_fault_count(opts: &SimulateOptions, mix: &FaultMix) -> Result<(), SimulateError> {
    let gpus = opts.nodes as u64 * opts.gpus_per_node as u64;
    let expected: f64 = mix.classes.iter().map(|c| mix.expected(c, gpus, opts.days)).sum();
    if !(expected.is_finite() && expected <= MAX_FAULTS) {
        return Err(SimulateError::Options(format!(
            "the mix draws about {expected:.3e} faults for {} nodes × {} GPUs × {} days: expected at most {MAX_FAULTS:.0}; check its counts and gpu_days",
            opts.nodes, opts.gpus_per_node, opts.days
        )));
    }
    Ok(())
}

/// One policy's run, before it becomes the report.
#[derive(Debug, Clone, Default)]
pub struct PolicyRun {
    pub accounting: Accounting,
    pub outcomes: Vec<Outcome>,
    pub out_of_service: Vec<Vec<(i64, i64)>>,
    /// Pages (ms, class or `no_fault`): what reaches the on-call person —
    /// for `nightshift` an escalation, or a notification that follows up a
    /// page (the shipped Alertmanager routes send both to on-call).
    pub pages: Vec<(i64, String)>,
    /// Messages to the team's chat (ms, class or `no_fault`): nightshift's
    /// notifications that are not follow-ups of a page.
    pub chat_messages: Vec<(i64, String)>,
    /// Pages and chat messages together, by the runbook that said them
    /// (`nightshift` only): which rows talk.
    pub told_by_runbook: BTreeMap<String, u64>,
    pub counts: Counts,
}

/// What a policy did, counted: the same fields in its run and its report.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    /// Mutating actions on a node or GPU with no fault at that moment.
    pub healthy_gpu_actions: u64,
    /// GPUs sent to RMA without a hardware fault.
    pub wrong_rma: u64,
    pub refused_by_blast_radius: u64,
    /// Mutating actions applied (releases not counted).
    pub actions: u64,
    /// Faults a person had to take out of service (for `nightshift`: ones
    /// it had not after the seeds' 87 minutes).
    pub left_to_people: u64,
    /// Engine restarts played (the `nightshift` policy only).
    pub engine_restarts: u64,
    /// Nodes with a drain or a cap in force, over every restart.
    pub mitigations_in_force_at_restart: u64,
    /// Nodes whose drain or cap, in force before a restart, was not for
    /// the next 10 minutes while their fault persisted.
    pub mitigations_weakened_by_restart: u64,
    /// Pager outages played.
    pub pager_outages: u64,
    /// Pages (escalations and follow-ups) the pager never took.
    pub pages_lost: u64,
}

/// A person (or the oracle) acting after `delay_ms` on every detectable
/// fault; `pages_for_hands_only`: page only for a fault that needs hands
/// (the oracle), else for every fault a person must look at (manual).
pub fn scripted(
    mix: &FaultMix,
    faults: &[Fault],
    nodes: usize,
    delay_ms: i64,
    pages_for_hands_only: bool,
) -> PolicyRun {
    let mut outcomes = Vec::with_capacity(faults.len());
    let mut out = vec![Vec::new(); nodes];
    let mut pages = Vec::new();
    for f in faults {
        let c = &mix.classes[f.class];
        let at = f.at_ms;
        let o = match c.signal {
            Signal::PersonDrain => {
                out[f.node].push((at, at + c.repair_ms()));
                Outcome { quarantined_ms: Some(at), cleared_ms: Some(at + c.repair_ms()), requeued_ms: None }
            }
            Signal::None => Outcome { quarantined_ms: None, cleared_ms: Some(at), requeued_ms: None },
            Signal::HungJob => {
                Outcome { quarantined_ms: None, cleared_ms: Some(at + delay_ms), requeued_ms: Some(at + delay_ms) }
            }
            _ if c.repair == Repair::None => {
                Outcome { quarantined_ms: Some(at + delay_ms), cleared_ms: Some(at), requeued_ms: None }
            }
            _ => {
                let q = at + delay_ms;
                out[f.node].push((q, q + c.repair_ms()));
                Outcome { quarantined_ms: Some(q), cleared_ms: Some(q + c.repair_ms()), requeued_ms: None }
            }
        };
        let needs_hands = c.repair != Repair::None && c.signal != Signal::PersonDrain;
        let seen = c.signal.detectable();
        if (pages_for_hands_only && needs_hands) || (!pages_for_hands_only && seen) {
            pages.push((at + delay_ms.min(MANUAL_ALERT_LAG_MS), c.name.clone()));
        }
        outcomes.push(o);
    }
    PolicyRun { outcomes, out_of_service: out, pages, ..PolicyRun::default() }
}

/// Run the three policies on one schedule.
pub async fn simulate(opts: &SimulateOptions, mix: &FaultMix) -> Result<report::Report, SimulateError> {
    opts.check(None)?;
    check_fault_count(opts, mix)?;
    let faults = schedule::draw(mix, opts.nodes, opts.gpus_per_node, opts.days, opts.seed);
    let job = opts.job();
    let mut runs = std::collections::BTreeMap::new();
    let mut p = nightshift::run(opts, mix, &faults, job.job_nodes).await?;
    p.accounting = account::account(job, &mix.classes, &faults, &p.outcomes, &p.out_of_service);
    runs.insert("nightshift", p);
    for (name, delay, hands_only) in [("manual", MANUAL_ALERT_LAG_MS + MANUAL_MTTR_MS, false), ("oracle", 0, true)] {
        let mut p = scripted(mix, &faults, opts.nodes, delay, hands_only);
        p.accounting = account::account(job, &mix.classes, &faults, &p.outcomes, &p.out_of_service);
        if name == "manual" {
            p.counts.left_to_people =
                p.outcomes.iter().filter(|o| o.quarantined_ms.is_some() || o.requeued_ms.is_some()).count() as u64;
        }
        runs.insert(name, p);
    }
    Ok(report::build(opts, mix, &faults, &runs))
}
