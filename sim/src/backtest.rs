//! Backtesting: a fleet's recorded history replayed through the real
//! trigger engine and runbooks in virtual time. The recording (Prometheus
//! range queries, or an OpenMetrics file) goes through the same DCGM
//! mapping as the live sources; every node seen in it becomes a replay node
//! whose agent answers each action as a dry run under the policy; every
//! runbook runs in shadow mode. The report says when each runbook would
//! have fired, on what, what it would have done, what the engine or an
//! agent refused, how many nodes would have been drained at once, and which
//! runs would have overlapped on a node.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use nightshift_agent::envelope::Policy;
use nightshift_engine::config::Limits;
use nightshift_engine::embed::RunbookSet;
use nightshift_engine::embed::ShadowFire;
use nightshift_engine::embed::{PromSample, host_of};

use crate::fleet::{SimError, SimFleet, SimFleetOptions, SimNodeSpec};

pub use crate::recording::{RecordingError, profile_for};

/// Recorded readings, grouped by time.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// `(ts_ms, samples at that time)`, oldest first.
    pub steps: Vec<(i64, Vec<PromSample>)>,
}

impl Recording {
    fn from_samples(samples: Vec<PromSample>, what: &str) -> Result<Recording, RecordingError> {
        let mut by_ts: BTreeMap<i64, Vec<PromSample>> = BTreeMap::new();
        for s in samples {
            if nightshift_engine::embed::dcgm_metric(&s.name).is_none() {
                continue;
            }
            if let Some(ts) = s.ts_ms {
                by_ts.entry(ts).or_default().push(s);
            }
        }
        if by_ts.is_empty() {
            return Err(RecordingError::Empty(what.to_string()));
        }
        Ok(Recording { steps: by_ts.into_iter().collect() })
    }

    /// An OpenMetrics export (what `promtool tsdb create-blocks-from
    /// openmetrics` reads): timestamps in seconds; `#` lines and `# EOF`
    /// skipped; samples without a timestamp refused.
    pub fn from_openmetrics(text: &str, what: &str) -> Result<Recording, RecordingError> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            // The value and the timestamp are the last two fields.
            let bad =
                || RecordingError::Line { what: what.to_string(), line: i + 1, found: l.chars().take(120).collect() };
            let (head, ts) = l.rsplit_once(' ').ok_or_else(bad)?;
            let ts: f64 = ts.parse().map_err(|_| bad())?;
            if !ts.is_finite() {
                return Err(bad());
            }
            let (parsed, badn) = nightshift_engine::embed::parse_exposition(head);
            let (Some(mut s), 0) = (parsed.into_iter().next(), badn) else { return Err(bad()) };
            // A node name from a label becomes a replay node: checked here,
            // where the line is known.
            if let Some(h) = host_of(&s.labels)
                && let Err(message) = nightshift_proto::names::check_node_name(&h)
            {
                return Err(RecordingError::Label { what: what.to_string(), line: i + 1, message });
            }
            s.ts_ms = Some((ts * 1000.0).round() as i64);
            samples.push(s);
        }
        Self::from_samples(samples, what)
    }

    /// A Prometheus `/api/v1/query_range` answer (a matrix).
    pub fn from_range_responses(bodies: &[Vec<u8>], what: &str) -> Result<Recording, RecordingError> {
        let mut samples = Vec::new();
        for body in bodies {
            let bad = |message: String| RecordingError::Response { what: what.to_string(), message };
            let v: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| bad(format!("expected JSON, found {e}")))?;
            if v["status"] != "success" || v["data"]["resultType"] != "matrix" {
                return Err(bad(format!(
                    "expected a successful matrix, found status {} ({}) and resultType {}",
                    v["status"], v["error"], v["data"]["resultType"]
                )));
            }
            for series in v["data"]["result"].as_array().into_iter().flatten() {
                let labels: BTreeMap<String, String> = series["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect();
                let Some(name) = labels.get("__name__").cloned() else { continue };
                if let Some(h) = host_of(&labels) {
                    nightshift_proto::names::check_node_name(&h).map_err(|m| bad(format!("series {name}: {m}")))?;
                }
                for p in series["values"].as_array().into_iter().flatten() {
                    let (Some(ts), Some(val)) = (p[0].as_f64(), p[1].as_str().and_then(|s| s.parse::<f64>().ok()))
                    else {
                        continue;
                    };
                    samples.push(PromSample {
                        name: name.clone(),
                        labels: labels.clone(),
                        value: val,
                        ts_ms: Some((ts * 1000.0).round() as i64),
                    });
                }
            }
        }
        Self::from_samples(samples, what)
    }

    /// Samples in all.
    pub fn len(&self) -> usize {
        self.steps.iter().map(|(_, s)| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Every host seen, with the GPU count and a simulator profile for its
    /// model (the replay node's envelope).
    pub fn hosts(&self) -> BTreeMap<String, (u32, String)> {
        let mut out: BTreeMap<String, (u32, String)> = BTreeMap::new();
        for (_, samples) in &self.steps {
            for s in samples {
                let Some(h) = host_of(&s.labels) else { continue };
                let e = out.entry(h).or_insert((1, "h100-sxm".into()));
                if let Some(g) = s.labels.get("gpu").and_then(|g| g.parse::<u32>().ok()) {
                    e.0 = e.0.max(g.saturating_add(1)).min(16);
                }
                if let Some(m) = s.labels.get("modelName").or_else(|| s.labels.get("model_name")) {
                    e.1 = profile_for(m).into();
                }
            }
        }
        out
    }
}

/// What to replay and how.
pub struct BacktestOptions {
    pub runbooks: RunbookSet,
    pub script: Arc<rhai::Engine>,
    /// The replay nodes' envelope (the shipped policy by default).
    pub policy: Option<Policy>,
    pub limits: Limits,
    /// Shards of the engine's telemetry windows and triggers, one thread
    /// each per step (`--shards`; the report does not depend on it).
    pub shards: usize,
    /// Leave the replay agents unticked on steps that begin with no run in
    /// flight or queued: in a replay they only answer dry runs, which place
    /// no holds (the report does not depend on it:
    /// `sim/tests/it/backtest_shards.rs`).
    pub idle_agents_untouched: bool,
}

/// A fire, with its runbook.
#[derive(Debug, Clone, Serialize)]
pub struct Fire {
    pub runbook: String,
    pub handbook: Option<String>,
    pub finished_ms: Option<i64>,
    #[serde(flatten)]
    pub fire: ShadowFire,
}

/// A runbook whose actions change what it measures: on a recording the
/// measurements cannot react to its would-be actions, so what it does after
/// its first action is an estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClosedLoop {
    pub runbook: String,
    /// The metric its trigger reads.
    pub metric: String,
    /// The actions of its script that move that metric.
    pub acts_with: Vec<String>,
}

impl ClosedLoop {
    pub fn sentence(&self) -> String {
        format!(
            "{} is a closed loop: it measures {} and acts on it ({}); the recording cannot react to its would-be actions, so its steps after the first are estimates on recorded data",
            self.runbook,
            self.metric,
            self.acts_with.join(", ")
        )
    }
}

/// Which action functions move which metric (a script that calls one on
/// the metric its trigger reads is a closed loop).
const MOVES: &[(&[&str], &[&str])] = &[
    (
        &[
            "gpu.temperature_c",
            "gpu.thermal_headroom_c",
            "gpu.power_watts",
            "gpu.power_pct_of_limit",
            "gpu.power_limit_watts",
        ],
        &[
            "set_power_limit",
            "set_fan_curve",
            "set_clocks",
            "drain",
            "drain_sticky",
            "drain_repair",
            "scale_out",
            "scale_in",
            "requeue",
        ],
    ),
    (&["gpu.mem_fragmentation_pct", "gpu.mem_fragmentation_over_limit_pct"], &["flush_caches"]),
    (
        &["node.nvlink_p2p_latency_us", "node.comm_overhead_pct", "node.allreduce_p99_ms"],
        &["config_rollback", "config_apply"],
    ),
    (&["gpu.util_pct", "node.cpu_util_pct"], &["drain", "drain_sticky", "drain_repair", "requeue"]),
];

/// The closed loops among `set`'s runbooks.
pub fn closed_loops(set: &RunbookSet) -> Vec<ClosedLoop> {
    let mut out = Vec::new();
    for rb in &set.runbooks {
        let Some(metric) = rb.manifest.trigger.metric() else { continue };
        let acts: Vec<String> = MOVES
            .iter()
            .filter(|(metrics, _)| metrics.contains(&metric))
            .flat_map(|(_, fns)| fns.iter())
            .filter(|f| rb.script_source.contains(&format!("{f}(")))
            .map(|f| f.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !acts.is_empty() {
            out.push(ClosedLoop { runbook: rb.manifest.name.clone(), metric: metric.to_string(), acts_with: acts });
        }
    }
    out
}

/// Runbooks whose trigger needs more samples in its window than the
/// recording's step can give: on this recording they cannot fire at all
/// (say so, rather than report a quiet month).
pub fn cannot_fire(set: &RunbookSet, step_ms: i64) -> Vec<String> {
    use nightshift_engine::embed::Trigger;
    if step_ms <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for rb in &set.runbooks {
        let (window_secs, min_samples) = match &rb.manifest.trigger {
            Trigger::Rate { window_secs, min_samples, .. } | Trigger::Predict { window_secs, min_samples, .. } => {
                (*window_secs, *min_samples)
            }
            _ => continue,
        };
        let most = (window_secs as i64 * 1000 / step_ms + 1) as usize;
        if most < min_samples {
            out.push(format!(
                "{} cannot fire on this recording: its trigger needs {min_samples} samples in {window_secs} s, a {} s step gives at most {most} (replay at --step {} s or finer)",
                rb.manifest.name,
                step_ms / 1000,
                (window_secs as usize / min_samples.saturating_sub(1).max(1)).max(1)
            ));
        }
    }
    out
}

/// Two runs on one node at the same time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overlap {
    pub node: String,
    pub runs: (String, String),
    pub runbooks: (String, String),
}

/// The backtest's findings.
#[derive(Debug, Clone, Serialize)]
pub struct BacktestReport {
    pub start_ms: i64,
    pub end_ms: i64,
    pub steps: usize,
    pub samples: usize,
    pub nodes: usize,
    pub gpus: u32,
    pub runbooks: Vec<String>,
    pub fires: Vec<Fire>,
    /// Drains the blast radius would have refused.
    pub blast_radius_refusals: usize,
    pub breaker_trips: usize,
    /// The most nodes that would have been drained at one time.
    pub max_drained_at_once: usize,
    pub overlaps: Vec<Overlap>,
    /// Runbooks that act on what they measure: their later steps are
    /// estimates on recorded data.
    pub closed_loops: Vec<ClosedLoop>,
    /// Runbooks the recording's step leaves blind (too few samples in their
    /// trigger's window), each as a sentence.
    pub cannot_fire: Vec<String>,
    /// Wall time the replay took.
    pub wall_secs: f64,
    /// Where that time went (measured, so it differs run to run: leave it
    /// and `wall_secs` out when comparing reports).
    pub profile: ReplayProfile,
}

/// The replay's wall time by phase, in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayProfile {
    /// Waiting for the next step (read, parsed, mapped).
    pub reading_secs: f64,
    /// The replay agents advanced to the step's time (leases, physics, dry
    /// runs answered).
    pub agents_secs: f64,
    /// The samples into the engine's windows and triggers, and each node's
    /// health looked at.
    pub ingest_secs: f64,
    /// The engine's tick (fleet triggers, schedules) and what fired run to
    /// rest: admission, runs, their dry-run actions.
    pub runs_secs: f64,
    /// Runs still going after the last step, let finish; then the report.
    pub finish_secs: f64,
}

impl ReplayProfile {
    /// One line: each phase's seconds and share.
    pub fn sentence(&self, wall_secs: f64) -> String {
        let share = |s: f64| if wall_secs > 0.0 { s / wall_secs * 100.0 } else { 0.0 };
        [
            ("reading steps", self.reading_secs),
            ("replay agents", self.agents_secs),
            ("windows, triggers and health", self.ingest_secs),
            ("tick and runs", self.runs_secs),
            ("finish and report", self.finish_secs),
        ]
        .iter()
        .map(|(what, s)| format!("{what} {s:.1} s ({:.0} %)", share(*s)))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// Called with `(steps done, steps)` now and then; an `Err` stops the
/// replay with that reason (`--max-memory`).
pub type Progress<'a> = &'a mut (dyn FnMut(usize, usize) -> Result<(), String> + Send);

/// Replay `rec` through `opts.runbooks` in shadow mode.
pub async fn run(
    rec: &Recording,
    opts: BacktestOptions,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<BacktestReport, SimError> {
    let steps = rec.steps.iter().map(|(t, s)| (*t, s.clone()));
    run_steps(rec.hosts(), rec.steps.len(), steps, opts, dir, progress).await
}

/// [`run`] on steps made as they are needed (a recording too big to hold,
/// or a generated one): `hosts` as [`Recording::hosts`] gives them, `total`
/// the number of steps. The samples are interned as they come.
pub async fn run_steps(
    hosts: BTreeMap<String, (u32, String)>,
    total: usize,
    steps: impl Iterator<Item = (i64, Vec<PromSample>)>,
    opts: BacktestOptions,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<BacktestReport, SimError> {
    let mut table = crate::recording::SeriesTable::new();
    let mapped = steps.map(move |(ts, batch)| {
        let ids = table.intern_step(&batch).map_err(|m| RecordingError::Label {
            what: "a step".into(),
            line: 0,
            message: m,
        })?;
        let mut out = Vec::with_capacity(ids.len());
        let n = table.map_step(ts, &ids, &mut out);
        Ok((ts, out, n))
    });
    run_mapped(hosts, total, mapped, opts, dir, progress).await
}

/// Steps read ahead of the replay: the reader parses on its own thread
/// (the second core) while the replay runs, holding at most this many.
const READ_AHEAD_STEPS: usize = 4;

/// [`run`] on an OpenMetrics file read as a stream (two passes, never
/// held): the second pass parses and maps on a thread of its own, a few
/// steps ahead of the replay.
///
/// Call it on a multi-threaded tokio runtime (the CLI's): the replay waits
/// for the reader with `block_in_place`.
pub async fn run_file(
    om: Arc<crate::recording::OpenMetricsFile>,
    opts: BacktestOptions,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<BacktestReport, SimError> {
    type Item = Result<(i64, Vec<crate::recording::Mapped>, usize), RecordingError>;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Item>(READ_AHEAD_STEPS);
    let reader = om.clone();
    let thread = std::thread::Builder::new()
        .name("backtest-reader".into())
        .spawn(move || {
            let stream = match reader.stream() {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            for r in stream {
                let item = r.map(|(ts, ids)| {
                    let mut out = Vec::with_capacity(ids.len());
                    let n = reader.table.map_step(ts, &ids, &mut out);
                    (ts, out, n)
                });
                // The replay stopped (an error, --max-memory): stop reading.
                if tx.send(item).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| SimError::Setup(format!("cannot start the reader thread: {e}")))?;
    let steps = std::iter::from_fn(move || tokio::task::block_in_place(|| rx.recv().ok()));
    let report = run_mapped(om.table.hosts(), om.steps(), steps, opts, dir, progress).await;
    let _ = thread.join();
    report
}

/// The replay itself, on mapped steps `(ts, samples, samples read)`.
pub async fn run_mapped(
    hosts: BTreeMap<String, (u32, String)>,
    total: usize,
    steps: impl Iterator<Item = Result<(i64, Vec<crate::recording::Mapped>, usize), RecordingError>>,
    opts: BacktestOptions,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<BacktestReport, SimError> {
    let t0 = std::time::Instant::now();
    if hosts.is_empty() {
        return Err(SimError::Setup(
            "the recording names no host (no Hostname, hostname, node or instance label)".into(),
        ));
    }
    let nodes: Vec<SimNodeSpec> =
        hosts.iter().map(|(name, (gpus, profile))| SimNodeSpec::new(name, profile, *gpus)).collect();
    let names = opts.runbooks.names();
    let idle_skip = opts.idle_agents_untouched;
    let loops = closed_loops(&opts.runbooks);
    let set_for_step = opts.runbooks.clone();
    let mut steps = steps.peekable();
    let start_ms = match steps.peek() {
        Some(Ok((t, _, _))) => *t,
        _ => 0,
    };
    let mut end_ms = start_ms;
    let mut samples = 0usize;
    let mut so = SimFleetOptions::new(nodes, opts.runbooks, opts.script);
    so.start_ms = start_ms;
    so.policy = opts.policy;
    so.limits = opts.limits;
    // Nobody looks at a replay's plots: keep none.
    so.telemetry.history_secs = 0;
    so.telemetry.ingest_shards = opts.shards.max(1) as u64;
    let sim = SimFleet::start(so, dir).await?;
    for n in &names {
        // Every runbook in shadow: its actions are dry runs, answered by the
        // replay nodes' agents under the policy.
        let _ = sim
            .engine
            .set_runbook_mode(
                n,
                nightshift_engine::embed::Mode::Shadow,
                "backtest",
                "backtest: every action is a dry run",
            )
            .await;
    }
    let every = (total / 100).max(1);
    let mut done = 0;
    let (mut reading, mut spent) = (std::time::Duration::ZERO, [std::time::Duration::ZERO; 3]);
    let mut waited = std::time::Instant::now();
    // The time between one step's end and the next one's start is the
    // wait for the step (the iterator reads, parses, maps it).
    for (i, step) in steps.enumerate() {
        reading += waited.elapsed();
        let (ts, batch, read) = step.map_err(|e| SimError::Setup(e.to_string()))?;
        let tick = !idle_skip || sim.engine.running() > 0 || sim.engine.queue_depth() > 0;
        sim.step_to_mapped_timed(ts, &batch, tick, &mut spent).await?;
        end_ms = ts;
        samples += read;
        done = i + 1;
        if i % every == 0 {
            progress(i, total).map_err(|why| SimError::Setup(format!("stopped at step {i} of {total}: {why}")))?;
        }
        waited = std::time::Instant::now();
    }
    let finishing = std::time::Instant::now();
    let total = done;
    // Let runs started by the last samples finish (their sleeps and watches
    // end in virtual time), for at most an hour after the recording.
    for _ in 0..3600 {
        if sim.engine.running() == 0 && sim.engine.queue_depth() == 0 {
            break;
        }
        let now = nightshift_proto::clock::Clock::now_ms(&sim.clock);
        sim.step_to_mapped(now + 1000, &[]).await?;
    }
    progress(total, total).map_err(|why| SimError::Setup(format!("stopped after the last step: {why}")))?;
    let engine = &sim.engine;
    let set = engine.runbook_set();
    let mut fires = Vec::new();
    for n in &names {
        let handbook = set.get(n).and_then(|(_, rb)| rb.manifest.handbook.clone());
        let report = nightshift_engine::api::ShadowReport::of(engine, n, i64::MIN / 2, 1_000_000)
            .map_err(|e| SimError::Setup(e.to_string()))?;
        for f in report.fires {
            let finished_ms = engine.run(&f.run).ok().flatten().and_then(|r| r.finished_ms);
            fires.push(Fire { runbook: n.clone(), handbook: handbook.clone(), finished_ms, fire: f });
        }
    }
    fires.sort_by_key(|f| f.fire.ts_ms);
    let blast_radius_refusals =
        fires.iter().flat_map(|f| &f.fire.refusals).filter(|r| r.starts_with("blast_radius")).count();
    let breaker_trips = engine
        .audit()
        .tail(0, usize::MAX)
        .map_err(|e| SimError::Setup(e.to_string()))?
        .iter()
        .filter(|r| r.kind == nightshift_engine::audit::RecordKind::BreakerTripped)
        .count();
    // Drains that would have happened: from the drain to the run's end, or
    // to the end of the recording for a sticky (RMA) drain only a person
    // releases.
    let mut events: Vec<(i64, i32, String)> = Vec::new();
    for f in &fires {
        for w in f.fire.would_act.iter().filter(|w| w.agent_ok && w.op.starts_with("drain")) {
            let node = w.node.clone().unwrap_or_default();
            let until = if w.args["sticky"] == true { end_ms } else { f.finished_ms.unwrap_or(end_ms) };
            events.push((w.ts_ms, 1, node.clone()));
            events.push((until.max(w.ts_ms), -1, node));
        }
    }
    // At one instant, drains start before others end.
    events.sort_by_key(|(t, d, n)| (*t, -*d, n.clone()));
    let mut drained: BTreeMap<String, i32> = BTreeMap::new();
    let mut max_drained_at_once = 0;
    for (_, d, node) in events {
        *drained.entry(node).or_default() += d;
        max_drained_at_once = max_drained_at_once.max(drained.values().filter(|v| **v > 0).count());
    }
    let mut overlaps = Vec::new();
    for (i, a) in fires.iter().enumerate() {
        for b in &fires[i + 1..] {
            let node = |f: &Fire| f.fire.target.split('/').next().unwrap_or("").to_string();
            let end = |f: &Fire| f.finished_ms.unwrap_or(end_ms);
            if node(a) == node(b) && b.fire.ts_ms < end(a) && a.fire.ts_ms < end(b) {
                overlaps.push(Overlap {
                    node: node(a),
                    runs: (a.fire.run.clone(), b.fire.run.clone()),
                    runbooks: (a.runbook.clone(), b.runbook.clone()),
                });
            }
        }
    }
    let report = BacktestReport {
        start_ms,
        end_ms,
        steps: total,
        samples,
        nodes: hosts.len(),
        gpus: hosts.values().map(|(g, _)| *g).sum(),
        runbooks: names,
        fires,
        blast_radius_refusals,
        breaker_trips,
        max_drained_at_once,
        overlaps,
        closed_loops: loops,
        cannot_fire: cannot_fire(&set_for_step, if total > 1 { (end_ms - start_ms) / (total as i64 - 1) } else { 0 }),
        wall_secs: t0.elapsed().as_secs_f64(),
        profile: ReplayProfile {
            reading_secs: reading.as_secs_f64(),
            agents_secs: spent[0].as_secs_f64(),
            ingest_secs: spent[1].as_secs_f64(),
            runs_secs: spent[2].as_secs_f64(),
            finish_secs: finishing.elapsed().as_secs_f64(),
        },
    };
    sim.engine.shutdown().await;
    Ok(report)
}

/// The report as a page (a file to open in a browser; no script, no CDN).
impl BacktestReport {
    /// The totals in one sentence (the command's last line and the page's
    /// heading say the same).
    pub fn totals(&self) -> String {
        format!(
            "{} fires; {} blast-radius refusals; {} breaker trips; at most {} node(s) drained at once; {} overlapping run pairs; replayed in {:.1} s",
            self.fires.len(),
            self.blast_radius_refusals,
            self.breaker_trips,
            self.max_drained_at_once,
            self.overlaps.len(),
            self.wall_secs
        )
    }
}

pub fn html(r: &BacktestReport) -> String {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let t = nightshift_engine::embed::format_rfc3339_ms;
    let mut rows = String::new();
    for f in &r.fires {
        let acts: Vec<String> = f
            .fire
            .would_act
            .iter()
            .map(|w| {
                format!(
                    "{} {} — {}",
                    esc(&w.op),
                    esc(&w.args.to_string()),
                    if w.agent_ok { "agent: would apply".to_string() } else { esc(&w.answer) }
                )
            })
            .collect();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(&t(f.fire.ts_ms)),
            esc(&format!("{} {}", f.handbook.clone().unwrap_or_default(), f.runbook)),
            esc(&f.fire.target),
            esc(&f.fire.why),
            acts.join("<br>"),
            esc(&f.fire.refusals.join("; "))
        ));
    }
    let notes: String = r
        .closed_loops
        .iter()
        .map(|l| format!("<p><b>Note:</b> {}</p>", esc(&l.sentence())))
        .chain(r.cannot_fire.iter().map(|b| format!("<p><b>Blind:</b> {}</p>", esc(b))))
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>nightshift backtest</title>\
         <style>body{{font:14px system-ui;margin:24px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}</style></head><body>\
         <h1>Backtest {} → {}</h1><p>{} nodes, {} GPUs, {} samples in {} steps; {} runbooks; {}.</p>{notes}\
         <table><tr><th>When</th><th>Runbook</th><th>Target</th><th>Why</th><th>Would have</th><th>Refused</th></tr>\n{rows}</table></body></html>\n",
        esc(&t(r.start_ms)),
        esc(&t(r.end_ms)),
        r.nodes,
        r.gpus,
        r.samples,
        r.steps,
        r.runbooks.len(),
        esc(&r.totals())
    )
}

#[cfg(test)]
mod tests {
    /// The closed loops among the shipped runbooks (issue 30: a backtest
    /// predicted a sticky drain that did not happen live, and did not say
    /// that recorded temperatures cannot react to would-be caps).
    /// A recording too coarse for a trigger's window says so: the shipped
    /// drift runbook (120 samples in 30 min) is blind at 30 s, not at 15 s.
    #[test]
    fn a_step_too_coarse_for_a_trigger_is_named() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
        let script = std::sync::Arc::new(nightshift_engine::embed::build_engine(&Default::default()));
        let set = nightshift_engine::embed::load_dir(&dir, &script);
        let blind = cannot_fire(&set, 30_000);
        assert!(
            blind.iter().any(|b| b.starts_with("gpu-temp-drift cannot fire on this recording: its trigger needs 120 samples in 1800 s, a 30 s step gives at most 61")),
            "{blind:?}"
        );
        assert!(!cannot_fire(&set, 15_000).iter().any(|b| b.starts_with("gpu-temp-drift")));
        assert!(cannot_fire(&set, 1_000).is_empty());
    }

    #[test]
    fn the_report_names_the_runbooks_that_act_on_what_they_measure() {
        let engine = nightshift_engine::embed::build_engine(&nightshift_engine::embed::ScriptLimits::default());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
        let set = nightshift_engine::embed::load_dir(&dir, &engine);
        let loops = closed_loops(&set);
        let names: Vec<&str> = loops.iter().map(|l| l.runbook.as_str()).collect();
        assert!(names.contains(&"gpu-overheat") && names.contains(&"mem-fragmentation"), "{names:?}");
        assert!(!names.contains(&"ecc-dbe-drain"), "a fault counter does not react: {names:?}");
        let overheat = loops.iter().find(|l| l.runbook == "gpu-overheat").unwrap();
        assert!(overheat.acts_with.contains(&"set_power_limit".to_string()), "{overheat:?}");
        assert!(overheat.sentence().contains("its steps after the first are estimates on recorded data"));
    }

    use super::*;

    #[test]
    fn openmetrics_lines_need_a_timestamp_and_group_by_time() {
        let text = "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n\
            DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"n1\",modelName=\"NVIDIA B200\"} 61 1790000000\n\
            DCGM_FI_DEV_GPU_TEMP{gpu=\"3\",Hostname=\"n1\"} 62 1790000000\n\
            DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"n1\"} 63 1790000015.5\n\
            other_metric{Hostname=\"n1\"} 1 1790000000\n# EOF\n";
        let r = Recording::from_openmetrics(text, "rec.om").unwrap();
        assert_eq!(
            r.steps.iter().map(|(t, s)| (*t, s.len())).collect::<Vec<_>>(),
            [(1_790_000_000_000, 2), (1_790_000_015_500, 1)]
        );
        assert_eq!(r.hosts(), [("n1".to_string(), (4, "b200".to_string()))].into());
        // Regression (issue 27 item 5): a Hostname label that is a path
        // is refused with where, before anything is written.
        for host in ["../../x", "/var/lib/nightshift-agent"] {
            let text = format!(
                "DCGM_FI_DEV_GPU_TEMP{{gpu=\"0\",Hostname=\"gpu-a1\"}} 61 1790000000\n\
                 DCGM_FI_DEV_GPU_TEMP{{gpu=\"0\",Hostname=\"{host}\"}} 61 1790000000\n"
            );
            let err = Recording::from_openmetrics(&text, "rec.om").unwrap_err().to_string();
            assert!(err.starts_with("rec.om:2: node name") && err.contains("found '/'"), "{err}");
        }
        // A GPU index at the type's end does not overflow (it panicked).
        let r = Recording::from_openmetrics(
            "DCGM_FI_DEV_GPU_TEMP{gpu=\"4294967295\",Hostname=\"gpu-a1\"} 61 1790000000\n",
            "rec.om",
        )
        .unwrap();
        assert_eq!(r.hosts()["gpu-a1"].0, 16);
        let err = Recording::from_openmetrics("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 61\n", "rec.om").unwrap_err();
        assert_eq!(
            err.to_string(),
            "rec.om:1: expected `name{labels} value timestamp` with the timestamp in seconds, found \"DCGM_FI_DEV_GPU_TEMP{gpu=\\\"0\\\"} 61\""
        );
        assert!(matches!(Recording::from_openmetrics("other 1 2\n", "x"), Err(RecordingError::Empty(_))));
    }
}
