//! `nightshift backtest`: recorded history through the runbooks in virtual
//! time (`nightshift_sim::backtest`), from Prometheus range queries or an
//! OpenMetrics file; a table, and the report as JSON and a page.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use std::collections::BTreeMap;

use nightshift_sim::backtest::{BacktestOptions, RecordingError, html, run_file, run_mapped};
use nightshift_sim::recording::{Mapped, OpenMetricsFile, SeriesTable};

use crate::args::{BacktestArgs, Cli};
use crate::cmd::{default_runbook_dir, parse_since, usage};
use crate::out::{Out, clip};

/// Most points one range query may ask for (Prometheus refuses past 11,000).
const POINTS_PER_QUERY: i64 = 10_000;
/// Samples one window of range queries holds at most (a window is parsed
/// while the one before is replayed: two are in memory at a time).
const SAMPLES_PER_WINDOW: i64 = 400_000;

fn step_secs(s: &str) -> Result<i64> {
    let bad = || usage(format!("--step: expected a span such as 15s or 1m, found {s:?}"));
    let span: jiff::Span = s.parse().map_err(|_| bad())?;
    let d = span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()).map_err(|_| bad())?;
    let secs = d.as_secs();
    if !(1..=3600).contains(&secs) {
        return Err(usage(format!("--step: expected 1s to 1h, found {s:?}")));
    }
    Ok(secs)
}

/// `800MiB`, `2GiB`, `1500MB` → bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim() {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        _ => 0.0,
    };
    match num.parse::<f64>() {
        Ok(n) if mult > 0.0 && n > 0.0 && n.is_finite() => Ok((n * mult) as u64),
        _ => Err(usage(format!("--max-memory: expected a size such as 800MiB or 2GiB, found {s:?}"))),
    }
}

/// A field of /proc/self/status in bytes (VmRSS, VmHWM).
fn proc_status_bytes(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

#[derive(serde::Deserialize)]
struct RangeResponse {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<RangeData>,
}

#[derive(serde::Deserialize)]
struct RangeData {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Vec<RangeSeries>,
}

#[derive(serde::Deserialize)]
struct RangeSeries {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

#[derive(serde::Deserialize)]
struct SeriesResponse {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Vec<BTreeMap<String, String>>,
}

fn series_key(name: &str, labels: &BTreeMap<String, String>) -> String {
    let mut key = String::with_capacity(64);
    key.push_str(name);
    key.push('{');
    for (i, (k, v)) in labels.iter().filter(|(k, _)| k.as_str() != "__name__").enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(&format!("{k}=\"{v}\""));
    }
    key.push('}');
    key
}

/// A window of range queries as steps `(ts_ms, [(series, value)])`.
type Window = Vec<(i64, Vec<(u32, f64)>)>;

/// The recording pulled from Prometheus window by window: the series list
/// first (`/api/v1/series`: the hosts, and how long a window may be), then
/// each window's range query fetched while the one before is replayed.
struct PromWindows {
    url: String,
    http: reqwest::Client,
    table: SeriesTable,
    step: i64,
    window_secs: i64,
    next_from: i64,
    end: i64,
    total_steps: usize,
}

impl PromWindows {
    async fn open(url: &str, start_ms: i64, end_ms: i64, step: i64) -> Result<PromWindows> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
        let unreachable =
            |e: reqwest::Error| anyhow::Error::new(crate::Fail(4)).context(format!("{url} is unreachable: {e}"));
        let resp = http
            .get(format!("{}/api/v1/series", url.trim_end_matches('/')))
            .query(&[
                ("match[]", nightshift_engine::embed::prometheus_query()),
                ("start", (start_ms / 1000).to_string()),
                ("end", (end_ms / 1000).to_string()),
            ])
            .send()
            .await
            .map_err(unreachable)?;
        let body = resp.bytes().await.map_err(unreachable)?;
        let list: SeriesResponse = serde_json::from_slice(&body)
            .map_err(|e| usage(format!("{url}: expected a /api/v1/series answer, found {e}")))?;
        if list.status != "success" {
            return Err(usage(format!("{url}: the series list failed: {}", list.error.unwrap_or_default())));
        }
        let mut table = SeriesTable::new();
        for labels in &list.data {
            let Some(name) = labels.get("__name__") else { continue };
            let clean: BTreeMap<String, String> =
                labels.iter().filter(|(k, _)| k.as_str() != "__name__").map(|(k, v)| (k.clone(), v.clone())).collect();
            table
                .intern(&series_key(name, &clean), name, &clean)
                .map_err(|m| usage(format!("{url}: series {name}: {m}")))?;
        }
        let series = table.len().max(1) as i64;
        let points = (SAMPLES_PER_WINDOW / series).clamp(1, POINTS_PER_QUERY);
        let (from, end) = (start_ms / 1000, end_ms / 1000);
        Ok(PromWindows {
            url: url.to_string(),
            http,
            table,
            step,
            window_secs: step * points,
            next_from: from,
            end,
            total_steps: ((end - from) / step + 1).max(1) as usize,
        })
    }

    /// The next window's range (start, end) in seconds, or `None` when done.
    fn take_range(&mut self) -> Option<(i64, i64)> {
        if self.next_from > self.end {
            return None;
        }
        let from = self.next_from;
        let to = (from + self.window_secs - self.step).min(self.end);
        self.next_from = to + self.step;
        Some((from, to))
    }

    async fn fetch(
        http: reqwest::Client,
        url: String,
        from: i64,
        to: i64,
        step: i64,
    ) -> Result<Vec<RangeSeries>, String> {
        let resp = http
            .get(format!("{}/api/v1/query_range", url.trim_end_matches('/')))
            .query(&[
                ("query", nightshift_engine::embed::prometheus_query()),
                ("start", from.to_string()),
                ("end", to.to_string()),
                ("step", step.to_string()),
            ])
            .send()
            .await
            .map_err(|e| format!("{url} is unreachable: {e}"))?;
        let body = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
        let r: RangeResponse =
            serde_json::from_slice(&body).map_err(|e| format!("{url}: expected a range query answer, found {e}"))?;
        match r.data {
            Some(d) if r.status == "success" && d.result_type == "matrix" => Ok(d.result),
            _ => Err(format!("{url}: the range query failed: {}", r.error.unwrap_or(r.status))),
        }
    }

    /// A window's series as steps, interning any series new since the list.
    fn steps_of(&mut self, result: Vec<RangeSeries>) -> Result<Window, String> {
        let mut by_ts: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
        for s in result {
            let Some(name) = s.metric.get("__name__").cloned() else { continue };
            let labels: BTreeMap<String, String> = s.metric.into_iter().filter(|(k, _)| k != "__name__").collect();
            let id = self
                .table
                .intern(&series_key(&name, &labels), &name, &labels)
                .map_err(|m| format!("series {name}: {m}"))?;
            if !self.table.is_read(id) {
                continue;
            }
            for (ts, v) in s.values {
                let Ok(v) = v.parse::<f64>() else { continue };
                by_ts.entry((ts * 1000.0).round() as i64).or_default().push((id, v));
            }
        }
        Ok(by_ts.into_iter().collect())
    }
}

/// The windows as the replay's steps.
struct PromSteps {
    w: PromWindows,
    current: std::vec::IntoIter<(i64, Vec<(u32, f64)>)>,
    pending: Option<tokio::task::JoinHandle<Result<Vec<RangeSeries>, String>>>,
    handle: tokio::runtime::Handle,
    pulled: usize,
}

impl PromSteps {
    fn start(mut w: PromWindows) -> PromSteps {
        let handle = tokio::runtime::Handle::current();
        let pending = w
            .take_range()
            .map(|(from, to)| handle.spawn(PromWindows::fetch(w.http.clone(), w.url.clone(), from, to, w.step)));
        PromSteps { w, current: Vec::new().into_iter(), pending, handle, pulled: 0 }
    }
}

impl Iterator for PromSteps {
    type Item = Result<(i64, Vec<Mapped>, usize), RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        let err = |message: String| RecordingError::Response { what: "Prometheus".into(), message };
        loop {
            if let Some((ts, ids)) = self.current.next() {
                let mut out = Vec::with_capacity(ids.len());
                let n = self.w.table.map_step(ts, &ids, &mut out);
                return Some(Ok((ts, out, n)));
            }
            let task = self.pending.take()?;
            let got = tokio::task::block_in_place(|| self.handle.block_on(task));
            // The next window is fetched while this one is replayed.
            if let Some((from, to)) = self.w.take_range() {
                let (http, url, step) = (self.w.http.clone(), self.w.url.clone(), self.w.step);
                self.pending = Some(self.handle.spawn(PromWindows::fetch(http, url, from, to, step)));
            }
            let series = match got {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Some(Err(err(e))),
                Err(e) => return Some(Err(err(format!("the pull stopped: {e}")))),
            };
            match self.w.steps_of(series) {
                Ok(steps) => {
                    self.pulled += steps.len();
                    self.current = steps.into_iter();
                }
                Err(e) => return Some(Err(err(e))),
            }
        }
    }
}

pub async fn backtest(cli: &Cli, args: &BacktestArgs, out: &Out) -> Result<u8> {
    if args.runbook.is_empty() && !args.all {
        return Err(usage("name what to test: --runbook NAME (repeatable) or --all"));
    }
    let step = step_secs(&args.step)?;
    let max_memory = args.max_memory.as_deref().map(parse_size).transpose()?;
    enum Source {
        Prometheus(PromWindows),
        File(OpenMetricsFile),
    }
    let source = match (&args.prometheus, &args.from) {
        (Some(url), None) => {
            let start = parse_since(args.start.as_deref().unwrap_or_default())?;
            let end = parse_since(args.end.as_deref().unwrap_or_default())?;
            if end <= start {
                return Err(usage(format!(
                    "--start must be before --end: found {} and {}",
                    nightshift_engine::api::format_rfc3339_ms(start),
                    nightshift_engine::api::format_rfc3339_ms(end)
                )));
            }
            Source::Prometheus(PromWindows::open(url, start, end, step).await?)
        }
        (None, Some(path)) => {
            eprintln!("backtest: reading {} (first pass: checking every line)", path.display());
            let p = path.clone();
            let om = tokio::task::spawn_blocking(move || OpenMetricsFile::scan(&p))
                .await?
                .map_err(|e| usage(format!("--from {e}")))?;
            Source::File(om)
        }
        _ => return Err(usage("name the recording: --prometheus URL --start T --end T, or --from FILE")),
    };
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => default_runbook_dir(cli)?,
    };
    let (script_limits, limits) = match nightshift_engine::config::EngineConfig::load(&cli.config) {
        Ok(c) => (c.script, c.limits),
        Err(_) => (Default::default(), Default::default()),
    };
    let script = Arc::new(nightshift_engine::embed::build_engine(&script_limits));
    let mut set = nightshift_engine::embed::load_dir(&dir, &script);
    if !set.errors.is_empty() {
        let errs: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
        return Err(usage(format!("runbooks that do not load: {}", errs.join("; "))));
    }
    if !args.all {
        for name in &args.runbook {
            if set.get(name).is_none() {
                return Err(usage(format!("--runbook {name}: expected one of [{}]", set.names().join(", "))));
            }
        }
        set.runbooks.retain(|r| args.runbook.contains(&r.manifest.name));
    }
    let policy = match &args.policy {
        Some(p) => Some(nightshift_agent::envelope::Policy::load(p).map_err(|e| usage(e.to_string()))?),
        None => None,
    };
    let hosts = match &source {
        Source::Prometheus(w) => w.table.hosts(),
        Source::File(om) => om.table.hosts(),
    };
    if hosts.is_empty() {
        return Err(usage(
            "the recording names no host (no Hostname, hostname, node or instance label on the DCGM series)",
        ));
    }
    match &source {
        Source::File(om) => eprintln!(
            "backtest: {} samples, {} steps, {} series, {} nodes, {} runbooks, {} → {} ({} runs in the file)",
            om.samples,
            om.steps(),
            om.table.len(),
            hosts.len(),
            set.runbooks.len(),
            nightshift_engine::api::format_rfc3339_ms(om.first_ms),
            nightshift_engine::api::format_rfc3339_ms(om.last_ms),
            om.runs()
        ),
        Source::Prometheus(w) => eprintln!(
            "backtest: {} series, {} nodes, {} runbooks, {} steps of {} s, pulled {} s at a time",
            w.table.len(),
            hosts.len(),
            set.runbooks.len(),
            w.total_steps,
            w.step,
            w.window_secs
        ),
    }
    let scratch = nightshift_sim::fleet::scratch_dir().context("a scratch folder for the replay")?;
    let started = std::time::Instant::now();
    let mut last_pct = usize::MAX;
    let mut progress = |done: usize, total: usize| -> Result<(), String> {
        let rss = proc_status_bytes("VmRSS:");
        if let (Some(max), Some(rss)) = (max_memory, rss)
            && rss > max
        {
            return Err(format!(
                "resident memory {} is above --max-memory {}: replay a shorter range (--start/--end) or allow more",
                mib(rss),
                mib(max)
            ));
        }
        let pct = done * 100 / total.max(1);
        if pct / 10 != last_pct / 10 || pct == 100 {
            let secs = started.elapsed().as_secs_f64();
            let eta = if done > 0 && done < total { secs / done as f64 * (total - done) as f64 } else { 0.0 };
            eprintln!(
                "backtest: {pct}% ({done} of {total} steps) after {secs:.0} s{}, memory {}",
                if eta > 0.0 { format!(", about {eta:.0} s to go") } else { String::new() },
                rss.map(mib).unwrap_or_else(|| "?".into())
            );
            last_pct = pct;
        }
        Ok(())
    };
    let shards = args.shards.map_or_else(default_shards, usize::from);
    let opts = BacktestOptions { runbooks: set, script, policy, limits, shards, idle_agents_untouched: true };
    let result = match source {
        Source::File(om) => run_file(std::sync::Arc::new(om), opts, scratch.path(), &mut progress).await,
        Source::Prometheus(w) => {
            let total = w.total_steps;
            run_mapped(hosts, total, PromSteps::start(w), opts, scratch.path(), &mut progress).await
        }
    };
    let report = result.map_err(|e| anyhow::anyhow!("the replay stopped: {e}"))?;
    if let Some(peak) = proc_status_bytes("VmHWM:") {
        eprintln!(
            "backtest: peak memory {} (VmHWM), {} samples in {:.1} s",
            mib(peak),
            report.samples,
            report.wall_secs
        );
    }
    eprintln!("backtest: where the time went: {}", report.profile.sentence(report.wall_secs));
    if let Some(p) = &args.out {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?).with_context(|| format!("--out {}", p.display()))?;
    }
    if let Some(p) = &args.html {
        std::fs::write(p, html(&report)).with_context(|| format!("--html {}", p.display()))?;
    }
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = report
        .fires
        .iter()
        .map(|f| {
            let acts: Vec<String> = f
                .fire
                .would_act
                .iter()
                .map(|w| format!("{}{}", w.op, if w.agent_ok { "" } else { " (refused)" }))
                .collect();
            vec![
                nightshift_engine::api::format_rfc3339_ms(f.fire.ts_ms)[..19].to_string(),
                f.handbook.clone().unwrap_or_default(),
                f.runbook.clone(),
                f.fire.target.clone(),
                clip(&acts.join(", "), 60),
                clip(&f.fire.refusals.join("; "), 40),
            ]
        })
        .collect();
    out.table(&["WHEN (UTC)", "ROW", "RUNBOOK", "TARGET", "WOULD", "REFUSED"], &rows);
    for l in &report.closed_loops {
        outln!("{} {}", out.yellow("note:"), l.sentence());
    }
    for l in &report.cannot_fire {
        outln!("{} {l}", out.red("blind:"));
    }
    outln!("{}", report.totals());
    Ok(0)
}

/// One shard a core (at most 16: past that, a step's threads cost more
/// than they save).
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(16)
}
