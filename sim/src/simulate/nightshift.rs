//! The `nightshift` policy: the schedule played on a [`SimFleet`] — the
//! real engine with the runbooks, the real agent code on the sim backend —
//! in virtual time that moves in 5-second ticks where something is
//! happening and in long strides where nothing is.
//!
//! Nothing here decides what nightshift does. The driver strikes each
//! fault, watches what the scheduler shows (every node's drain and GPU
//! drains, from the telemetry the engine is fed), reads the audit log for
//! actions and pages, and plays the technician: a repair starts when a
//! node or GPU is taken out of service (or a person is paged about it) and
//! ends `repair_secs` later with the class's repair on the simulated
//! hardware (a reset, a replaced GPU, a reseated link) and, for a part
//! replaced, `nodes repaired`. People still watch their dashboards: a
//! detectable fault nightshift has not taken out of service after the
//! seeds' 45 + 42 minutes is drained by a person (counted apart as
//! `left_to_people`).
//!
//! Fidelity, written down: a node without an incident is stepped, ticked
//! and read every `quiet_feed_secs` (its physics for 5 s of each stride: a
//! quiet GPU is in steady state); runs asleep on the clock wake at their
//! time or within 60 s of it; an agent's lease expiry on a quiet node is
//! seen within `quiet_feed_secs`.

use std::collections::{BTreeMap, BTreeSet};

use nightshift_engine::audit::RecordKind;
use nightshift_proto::clock::Clock;
use nightshift_proto::{Op, Request, SimFault};

use super::account::Outcome;
use super::mix::{FaultMix, Repair, Signal};
use super::operations::{Mitigation, Pager, WATCH_AFTER_RESTART_MS};
use super::schedule::Fault;
use super::{MANUAL_ALERT_LAG_MS, MANUAL_MTTR_MS, PolicyRun, SimulateError, SimulateOptions};
use crate::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use crate::scenario::{load_runbooks, sim_policy};
use nightshift_engine::config::NotificationsConfig;

/// Per fault, as the run goes.
#[derive(Debug, Clone, Default)]
struct Track {
    struck: bool,
    quarantined_ms: Option<i64>,
    repair_due_ms: Option<i64>,
    cleared_ms: Option<i64>,
    requeued_ms: Option<i64>,
    by_person: bool,
}

const TICK_MS: i64 = 5_000;
/// The utilisation of a node running work.
const BUSY_PCT: f64 = 85.0;
const HOT_WINDOW_MS: i64 = 20 * 60_000;
const ASLEEP_STRIDE_MS: i64 = 60_000;
const QUIET_PHYSICS_MS: i64 = 5_000;

pub fn node_name(i: usize) -> String {
    format!("n{i:05}")
}

pub async fn run(
    opts: &SimulateOptions,
    mix: &FaultMix,
    faults: &[Fault],
    job_nodes: usize,
) -> Result<PolicyRun, SimulateError> {
    let setup = |e: &dyn std::fmt::Display| SimulateError::Setup(e.to_string());
    let (set, script) = load_runbooks(&opts.runbooks);
    if let Some(e) = set.errors.first() {
        return Err(SimulateError::Setup(format!("the runbooks do not load: {e}")));
    }
    let names: Vec<String> = (0..opts.nodes).map(node_name).collect();
    let specs: Vec<SimNodeSpec> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut s = SimNodeSpec::new(name, &opts.profile, opts.gpus_per_node);
            s.seed = opts.seed.wrapping_add(i as u64);
            // Every node in service runs work: the job's nodes the job,
            // the standbys background jobs the job preempts (so a hang or a
            // hot GPU shows on any node, as on a busy fleet).
            let _ = job_nodes;
            s.util_pct = Some(BUSY_PCT);
            s.labels.insert("pool".into(), "train".into());
            s.labels.insert("rack".into(), format!("r{:03}", i / 16));
            s.labels.insert("nvlink_domain".into(), name.clone());
            s
        })
        .collect();
    let dir = scratch_dir().map_err(|e| setup(&e))?;
    let mut fo = SimFleetOptions::new(specs, set, script);
    fo.tick_ms = TICK_MS;
    fo.policy = Some(sim_policy());
    // Plots keep no history over a month; a quiet node is read every
    // `quiet_feed_secs`, and is not "disconnected" for that.
    fo.telemetry.history_secs = 0;
    fo.telemetry.stale_after_secs = fo.telemetry.stale_after_secs.max(2 * opts.quiet_feed_secs + 60);
    let pager = Pager::start().await.map_err(|e| setup(&e))?;
    fo.notifications = NotificationsConfig { webhooks: vec![pager.target()], ..Default::default() };
    let mut sim = SimFleet::start(fo, dir.path()).await.map_err(|e| setup(&e))?;
    // Operations: restarts and pager outages, each a schedule of times.
    let every = |secs: u64, first: u64| -> Vec<i64> {
        if secs == 0 {
            return vec![];
        }
        let (every_ms, first_ms) = (secs as i64 * 1000, first as i64 * 1000);
        (0..).map(|k| first_ms + k * every_ms).take_while(|&t| t < opts.horizon_ms()).collect()
    };
    let restarts = every(opts.engine_restart_every_secs, opts.engine_restart_every_secs / 2);
    let outages = every(opts.pager_outage_every_secs, opts.pager_outage_every_secs / 3);
    let outage_ms = opts.pager_outage_secs as i64 * 1000;
    // A GPU's limit uncapped (the profile's default power limit).
    let max_watts = nightshift_agent::backend::sim::profile(&opts.profile).map_or(0.0, |p| p.power_default_watts);
    let (mut next_restart, mut next_outage, mut pager_down_until) = (0usize, 0usize, None::<i64>);
    // (node, what was in force before the restart, watched until).
    let mut watch: Vec<(usize, Mitigation, i64)> = Vec::new();
    let mut page_seqs: Vec<u64> = Vec::new();
    let t0 = sim.clock.now_ms();
    let horizon = opts.horizon_ms();
    let quiet_feed_ms = opts.quiet_feed_secs as i64 * 1000;

    let mut track = vec![Track::default(); faults.len()];
    let mut out_since: Vec<Option<i64>> = vec![None; opts.nodes];
    let mut spans: Vec<Vec<(i64, i64)>> = vec![Vec::new(); opts.nodes];
    let mut last_change: Vec<i64> = vec![i64::MIN / 2; opts.nodes];
    let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, f) in faults.iter().enumerate() {
        by_node.entry(f.node).or_default().push(i);
    }
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    let mut out = PolicyRun::default();
    let mut steps = 0u64;
    let mut next_fault = 0usize;
    let mut last_full = i64::MIN / 2;
    let mut seq = 0u64;
    let mut req = 0u64;
    let mut next_id = || {
        req += 1;
        format!("simulate-{req}")
    };
    loop {
        let now = sim.clock.now_ms() - t0;
        if now >= horizon {
            break;
        }
        // Faults due.
        while next_fault < faults.len() && faults[next_fault].at_ms <= now {
            let i = next_fault;
            next_fault += 1;
            let f = &faults[i];
            let class = &mix.classes[f.class];
            let node = &names[f.node];
            track[i].struck = true;
            last_change[f.node] = now;
            if class.signal == Signal::HungJob && out_since[f.node].is_none() {
                // In service, the node runs the job again, whatever moved
                // it off before (the workload model does the same when a
                // node is resumed).
                sim.sims[node].clear_requeued();
            }
            for fault in strike(class.signal, class.xid_code, f.gpu, &class.name) {
                let r = sim.agents[node].handle(Request::new(next_id(), Op::SimFault(fault))).await;
                if !r.ok {
                    return Err(SimulateError::Setup(format!(
                        "fault {} ({}) on {node}: the sim refused it: {:?}",
                        f.id, class.name, r.error
                    )));
                }
            }
            match class.signal {
                Signal::PersonDrain => {
                    track[i].quarantined_ms = Some(now);
                    track[i].repair_due_ms = Some(now + class.repair_ms());
                }
                Signal::None => track[i].cleared_ms = Some(now),
                _ if class.repair == Repair::None && class.signal != Signal::HungJob => {
                    // A transient signal: it is over once seen.
                    track[i].cleared_ms = Some(now);
                }
                _ => {}
            }
        }
        // Repairs due.
        for (i, f) in faults.iter().enumerate() {
            let t = &mut track[i];
            if t.cleared_ms.is_some() || t.repair_due_ms.is_none_or(|d| d > now) {
                continue;
            }
            let class = &mix.classes[f.class];
            let node = &names[f.node];
            let mut fixes = repair(class.signal, class.repair, f.gpu);
            if t.by_person {
                // The person who drained it puts it back.
                fixes.push(SimFault::PersonResume {});
            }
            for fault in fixes {
                let _ = sim.agents[node].handle(Request::new(next_id(), Op::SimFault(fault))).await;
            }
            if matches!(class.repair, Repair::Reseat | Repair::Rma) && class.signal.hardware() {
                let _ = sim.engine.mark_repaired(node, Some(f.gpu), "person:technician", "part replaced").await;
            }
            t.cleared_ms = Some(now);
            last_change[f.node] = now;
        }
        // People's fallback: a detectable fault still in service after the
        // seeds' alert lag and repair time.
        for (i, f) in faults.iter().enumerate() {
            let class = &mix.classes[f.class];
            let t = &mut track[i];
            if !t.struck
                || t.quarantined_ms.is_some()
                || t.requeued_ms.is_some()
                || t.cleared_ms.is_some()
                || !class.signal.detectable()
                || now < f.at_ms + MANUAL_ALERT_LAG_MS + MANUAL_MTTR_MS
            {
                continue;
            }
            let node = &names[f.node];
            out.counts.left_to_people += 1;
            last_change[f.node] = now;
            if class.signal == Signal::HungJob {
                // A hung job is not a node's fault: the person restarts it.
                let stop = SimFault::JobStall { active: false };
                let _ = sim.agents[node].handle(Request::new(next_id(), Op::SimFault(stop))).await;
                t.requeued_ms = Some(now);
                t.cleared_ms = Some(now);
                continue;
            }
            let drain = SimFault::PersonDrain { reason: format!("oncall: {} on gpu {}", class.name, f.gpu) };
            let _ = sim.agents[node].handle(Request::new(next_id(), Op::SimFault(drain))).await;
            t.by_person = true;
        }

        // The pager goes down, and comes back.
        if let Some(until) = pager_down_until
            && now >= until
        {
            pager.set_down(false);
            pager_down_until = None;
        }
        if pager_down_until.is_none() && outages.get(next_outage).is_some_and(|&t| t <= now) {
            next_outage += 1;
            pager.set_down(true);
            pager_down_until = Some(now + outage_ms);
            out.counts.pager_outages += 1;
        }
        // An upgrade: the engine restarts. What is in force on every node
        // with a fault is read from its agent first.
        if restarts.get(next_restart).is_some_and(|&t| t <= now) {
            next_restart += 1;
            for (&n, fs) in &by_node {
                if !fs.iter().any(|&i| track[i].struck && track[i].cleared_ms.is_none()) {
                    continue;
                }
                if let Ok(t) = sim.agents[&names[n]].telemetry().await {
                    let m = Mitigation::of(&t);
                    let max_watts = t.gpus.iter().map(|g| g.power_limit_watts).fold(0.0, f64::max).max(max_watts);
                    if m.any(max_watts) {
                        out.counts.mitigations_in_force_at_restart += 1;
                    }
                    watch.push((n, m, now + WATCH_AFTER_RESTART_MS));
                }
            }
            sim.restart_engine().await.map_err(|e| setup(&e))?;
            out.counts.engine_restarts += 1;
            tracing::debug!(at_secs = now / 1000, watched = watch.len(), "simulate: engine restarted");
        }

        // How far to go.
        let hot: BTreeSet<String> = (0..opts.nodes)
            .filter(|&n| {
                now - last_change[n] < HOT_WINDOW_MS
                    || watch.iter().any(|w| w.0 == n)
                    || by_node.get(&n).is_some_and(|fs| {
                        fs.iter().any(|&i| {
                            let t = &track[i];
                            // Not yet out of service; or a thermal fault,
                            // mitigated but not repaired: its holds end and
                            // the GPU heats again (no steady state).
                            t.struck
                                && t.cleared_ms.is_none()
                                && (t.quarantined_ms.is_none()
                                    || mix.classes[faults[i].class].signal == Signal::Thermal)
                        })
                    })
            })
            .map(|n| names[n].clone())
            .collect();
        let next_event = faults
            .get(next_fault)
            .map(|f| f.at_ms)
            .into_iter()
            .chain(track.iter().filter(|t| t.cleared_ms.is_none()).filter_map(|t| t.repair_due_ms))
            .chain(restarts.get(next_restart).copied())
            .chain(outages.get(next_outage).copied())
            .chain(pager_down_until)
            .min()
            .unwrap_or(horizon)
            .min(horizon);
        let full_due = last_full + quiet_feed_ms;
        let mut advance = if !hot.is_empty() {
            TICK_MS
        } else if sim.engine.running() > 0 {
            let wake = sim.clock.next_deadline().map(|d| d - t0).unwrap_or(now + ASLEEP_STRIDE_MS);
            (wake - now).clamp(TICK_MS, ASLEEP_STRIDE_MS)
        } else {
            (full_due - now).max(TICK_MS)
        };
        advance = advance.min((next_event - now).max(TICK_MS)).min((full_due - now).max(TICK_MS));
        let all = now + advance >= full_due;
        let fed = sim.step_sparse(advance, QUIET_PHYSICS_MS, &hot, all).await.map_err(|e| setup(&e))?;
        steps += 1;
        let now = sim.clock.now_ms() - t0;
        if all {
            last_full = now;
        }
        // What the scheduler shows.
        for (name, tel) in &fed {
            let Some(&n) = index.get(name.as_str()) else { continue };
            // A mitigation in force before a restart, while its fault is
            // still there.
            let persists =
                by_node.get(&n).is_some_and(|fs| fs.iter().any(|&i| track[i].struck && track[i].cleared_ms.is_none()));
            if let Some(w) = watch.iter().position(|w| w.0 == n) {
                if let Some(what) = persists.then(|| watch[w].1.weakened_in(&Mitigation::of(tel))).flatten() {
                    tracing::warn!(node = %name, at_secs = now / 1000, %what, "simulate: a restart weakened a mitigation");
                    out.counts.mitigations_weakened_by_restart += 1;
                    watch.remove(w);
                } else if !persists || now >= watch[w].2 {
                    watch.remove(w);
                }
            }
            let is_out = tel.node_metrics.drained || tel.gpus.iter().any(|g| g.gpu_drained);
            match (is_out, out_since[n]) {
                (true, None) => out_since[n] = Some(now),
                (false, Some(since)) => {
                    spans[n].push((since, now));
                    out_since[n] = None;
                    last_change[n] = now;
                    // Back in service: the scheduler places work on it again.
                    sim.sims[name].clear_requeued();
                    let work = SimFault::Load { gpu: None, util_pct: BUSY_PCT };
                    let _ = sim.agents[name].handle(Request::new(next_id(), Op::SimFault(work))).await;
                }
                _ => {}
            }
            if let Some(fs) = by_node.get(&n) {
                for &i in fs {
                    let t = &mut track[i];
                    if !t.struck || t.cleared_ms.is_some_and(|c| c < now - TICK_MS) {
                        continue;
                    }
                    let class = &mix.classes[faults[i].class];
                    if is_out && t.quarantined_ms.is_none() {
                        t.quarantined_ms = Some(now);
                    }
                    if class.signal == Signal::HungJob
                        && t.requeued_ms.is_none()
                        && (is_out || sim.sims[name].jobs_requeued())
                    {
                        t.requeued_ms = Some(now);
                        t.cleared_ms = Some(now);
                        let stop = SimFault::JobStall { active: false };
                        let _ = sim.agents[name].handle(Request::new(next_id(), Op::SimFault(stop))).await;
                    }
                    if t.quarantined_ms.is_some() && t.repair_due_ms.is_none() && class.repair != Repair::None {
                        t.repair_due_ms = Some(now + class.repair_ms());
                    }
                }
            }
        }
        // What nightshift did, from its audit log.
        let records = sim.engine.audit().tail(seq, usize::MAX).map_err(|e| setup(&e))?;
        for r in &records {
            seq = seq.max(r.seq);
            if matches!(r.kind, RecordKind::Escalation | RecordKind::Notification)
                && let Some(rb) = &r.runbook
            {
                *out.told_by_runbook.entry(rb.clone()).or_default() += 1;
            }
            tracing::trace!(at_secs = now / 1000, kind = ?r.kind, node = ?r.node, gpu = ?r.gpu, data = %r.data, "simulate: audit");
            let Some(n) = r.node.as_deref().and_then(|n| index.get(n)).copied() else {
                if r.kind == RecordKind::Escalation
                    || (r.kind == RecordKind::Notification && r.data["follows"].is_u64())
                {
                    out.pages.push((now, "no_fault".into()));
                    page_seqs.push(r.seq);
                } else if r.kind == RecordKind::Notification {
                    out.chat_messages.push((now, "no_fault".into()));
                }
                continue;
            };
            let present: Vec<usize> = by_node
                .get(&n)
                .map(|fs| {
                    fs.iter()
                        .copied()
                        .filter(|&i| track[i].struck && track[i].cleared_ms.is_none_or(|c| c + HOT_WINDOW_MS > now))
                        .collect()
                })
                .unwrap_or_default();
            match r.kind {
                RecordKind::ActionResult => {
                    let op = r.data["op"].as_str().unwrap_or("");
                    let applied = r.data["applied"] == true && r.data["dry_run"] != true;
                    if !applied || !Op::is_mutating_name(op) || matches!(op, "release" | "resume" | "reset_fan") {
                        continue;
                    }
                    out.counts.actions += 1;
                    last_change[n] = now;
                    let on_fault = present.iter().any(|&i| r.gpu.is_none() || r.gpu == Some(faults[i].gpu));
                    if !on_fault {
                        out.counts.healthy_gpu_actions += 1;
                    }
                    // A thermal fault is mitigated by its first change.
                    for &i in &present {
                        let t = &mut track[i];
                        if mix.classes[faults[i].class].signal == Signal::Thermal && t.quarantined_ms.is_none() {
                            t.quarantined_ms = Some(now);
                        }
                    }
                }
                RecordKind::Escalation | RecordKind::Notification => {
                    let class = present
                        .iter()
                        .max_by_key(|&&i| faults[i].at_ms)
                        .map(|&i| mix.classes[faults[i].class].name.clone())
                        .unwrap_or_else(|| "no_fault".into());
                    let page = r.kind == RecordKind::Escalation || r.data["follows"].is_u64();
                    if page {
                        out.pages.push((now, class));
                        page_seqs.push(r.seq);
                    } else {
                        out.chat_messages.push((now, class));
                    }
                    // A person told about a node starts its repair.
                    for &i in &present {
                        let class = &mix.classes[faults[i].class];
                        let t = &mut track[i];
                        if t.repair_due_ms.is_none() && t.cleared_ms.is_none() && class.repair != Repair::None {
                            t.repair_due_ms = Some(now + class.repair_ms());
                        }
                    }
                }
                RecordKind::Refusal if r.data["code"] == "blast_radius" => {
                    out.counts.refused_by_blast_radius += 1;
                }
                RecordKind::HealthChanged if r.data["to"] == "rma" => {
                    let had = by_node.get(&n).is_some_and(|fs| {
                        fs.iter().any(|&i| {
                            track[i].struck
                                && mix.classes[faults[i].class].signal.hardware()
                                && r.gpu.is_none_or(|g| g == faults[i].gpu)
                        })
                    });
                    if !had {
                        out.counts.wrong_rma += 1;
                    }
                }
                _ => {}
            }
        }
    }
    for (i, f) in faults.iter().enumerate() {
        let t = &track[i];
        tracing::debug!(
            fault = i,
            class = %mix.classes[f.class].name,
            node = %names[f.node],
            gpu = f.gpu,
            at_secs = f.at_ms / 1000,
            quarantined_secs = ?t.quarantined_ms.map(|q| q / 1000),
            requeued_secs = ?t.requeued_ms.map(|q| q / 1000),
            cleared_secs = ?t.cleared_ms.map(|q| q / 1000),
            by_person = t.by_person,
            "simulate: fault outcome"
        );
    }
    // The pager back, the engine's outbox given time to send what it kept
    // (its retries back off to `retry_max_secs`): a page still not taken
    // is lost.
    pager.set_down(false);
    for _ in 0..(2 * 3600 / (TICK_MS / 1000)) {
        if sim.engine.gauges().pages_pending == 0 {
            break;
        }
        sim.step_sparse(TICK_MS, QUIET_PHYSICS_MS, &BTreeSet::new(), false).await.map_err(|e| setup(&e))?;
    }
    let received = pager.received();
    out.counts.pages_lost = page_seqs.iter().filter(|s| !received.contains(s)).count() as u64;
    let end = horizon;
    for (n, since) in out_since.iter().enumerate() {
        if let Some(s) = since {
            spans[n].push((*s, end));
        }
    }
    out.outcomes = track
        .iter()
        .map(|t| Outcome { quarantined_ms: t.quarantined_ms, cleared_ms: t.cleared_ms, requeued_ms: t.requeued_ms })
        .collect();
    out.out_of_service = spans;
    tracing::debug!(steps, "simulate: the nightshift policy ran");
    drop(sim);
    Ok(out)
}

/// The simulated faults that make a class's signal. A link fault is what
/// NVML shows for a broken NVLink cable or switch port: XID 74 on the GPU
/// and its links down until the technician's repair (a reseat; the
/// simulator has no InfiniBand: a fabric fault is played as this one). The
/// sim retrains the links at any reset of the GPU: nightshift resets none
/// itself, it tells a person to.
pub fn strike(signal: Signal, xid: Option<u32>, gpu: u32, class: &str) -> Vec<SimFault> {
    vec![match signal {
        Signal::Xid => SimFault::Xid { gpu, code: xid.unwrap_or(79) },
        Signal::EccDbe => SimFault::EccDbe { gpu, count: 1 },
        Signal::GpuLost => SimFault::GpuLost { gpu },
        Signal::RowRemapFailure => SimFault::RowRemapFailure { gpu },
        Signal::LinkFault => return vec![SimFault::NvlinkMisconfig { active: true }, SimFault::Xid { gpu, code: 74 }],
        Signal::Thermal => SimFault::HeatsinkDegradation { gpu, factor: 2.0 },
        Signal::HungJob => SimFault::JobStall { active: true },
        Signal::PersonDrain => SimFault::PersonDrain { reason: format!("maintenance: {class}") },
        Signal::None => return vec![],
    }]
}

/// What the technician does to the simulated hardware when the repair is
/// done.
pub fn repair(signal: Signal, how: Repair, gpu: u32) -> Vec<SimFault> {
    let part = matches!(how, Repair::Reseat | Repair::Rma);
    match signal {
        Signal::Xid | Signal::EccDbe | Signal::GpuLost | Signal::RowRemapFailure => {
            vec![if part || signal == Signal::RowRemapFailure {
                SimFault::GpuReplace { gpu }
            } else {
                SimFault::GpuReset { gpu }
            }]
        }
        Signal::LinkFault => vec![SimFault::NvlinkMisconfig { active: false }, SimFault::GpuReset { gpu }],
        Signal::Thermal => vec![SimFault::HeatsinkDegradation { gpu, factor: 1.0 }],
        Signal::PersonDrain => vec![SimFault::PersonResume {}],
        Signal::HungJob | Signal::None => vec![],
    }
}
