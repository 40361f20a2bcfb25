//! `nightshift backtest`: recorded history through the runbooks in virtual
//! time (`nightshift_sim::backtest`), from Prometheus range queries or an
//! OpenMetrics file; a table, and the report as JSON and a page.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use nightshift_sim::backtest::{BacktestOptions, Recording, html, run};

use crate::args::{BacktestArgs, Cli};
use crate::cmd::{default_runbook_dir, parse_since, usage};
use crate::out::{Out, clip};

/// Most points one range query may ask for (Prometheus refuses past 11,000).
const POINTS_PER_QUERY: i64 = 10_000;

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

/// The recording from Prometheus: range queries in windows of at most
/// 10,000 points, through the same metric names as the live source.
async fn from_prometheus(url: &str, start_ms: i64, end_ms: i64, step: i64) -> Result<Recording> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let mut bodies = Vec::new();
    let mut from = start_ms / 1000;
    let end = end_ms / 1000;
    while from <= end {
        let to = (from + step * (POINTS_PER_QUERY - 1)).min(end);
        let resp = http
            .get(format!("{}/api/v1/query_range", url.trim_end_matches('/')))
            .query(&[
                ("query", nightshift_engine::sources::prometheus_query()),
                ("start", from.to_string()),
                ("end", to.to_string()),
                ("step", step.to_string()),
            ])
            .send()
            .await
            .map_err(|e| anyhow::Error::new(crate::Fail(4)).context(format!("{url} is unreachable: {e}")))?;
        bodies.push(resp.bytes().await?.to_vec());
        eprintln!("backtest: pulled {} of {} s from {url}", to - start_ms / 1000, end - start_ms / 1000);
        from = to + step;
    }
    Recording::from_range_responses(&bodies, url).map_err(|e| usage(e.to_string()))
}

pub async fn backtest(cli: &Cli, args: &BacktestArgs, out: &Out) -> Result<u8> {
    if args.runbook.is_empty() && !args.all {
        return Err(usage("name what to test: --runbook NAME (repeatable) or --all"));
    }
    let step = step_secs(&args.step)?;
    let rec = match (&args.prometheus, &args.from) {
        (Some(url), None) => {
            let start = parse_since(args.start.as_deref().unwrap_or_default())?;
            let end = parse_since(args.end.as_deref().unwrap_or_default())?;
            if end <= start {
                return Err(usage(format!(
                    "--start must be before --end: found {} and {}",
                    nightshift_engine::alerts::format_rfc3339_ms(start),
                    nightshift_engine::alerts::format_rfc3339_ms(end)
                )));
            }
            from_prometheus(url, start, end, step).await?
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--from {}: cannot read it: {e}", path.display())))?;
            Recording::from_openmetrics(&text, &path.display().to_string()).map_err(|e| usage(e.to_string()))?
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
    let script = Arc::new(nightshift_engine::script::build_engine(&script_limits));
    let mut set = nightshift_engine::runbook::load_dir(&dir, &script);
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
    let hosts = rec.hosts();
    eprintln!(
        "backtest: {} samples, {} steps, {} nodes, {} runbooks, {} → {}",
        rec.len(),
        rec.steps.len(),
        hosts.len(),
        set.runbooks.len(),
        nightshift_engine::alerts::format_rfc3339_ms(rec.steps.first().map_or(0, |s| s.0)),
        nightshift_engine::alerts::format_rfc3339_ms(rec.steps.last().map_or(0, |s| s.0))
    );
    let scratch = nightshift_sim::fleet::scratch_dir().context("a scratch folder for the replay")?;
    let mut last_pct = usize::MAX;
    let mut progress = |done: usize, total: usize| {
        let pct = done * 100 / total.max(1);
        if pct / 10 != last_pct / 10 || pct == 100 {
            eprintln!("backtest: {pct}% ({done} of {total} steps)");
            last_pct = pct;
        }
    };
    let report = run(&rec, BacktestOptions { runbooks: set, script, policy, limits }, scratch.path(), &mut progress)
        .await
        .map_err(|e| anyhow::anyhow!("the replay stopped: {e}"))?;
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
                nightshift_engine::alerts::format_rfc3339_ms(f.fire.ts_ms)[..19].to_string(),
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
    outln!("{}", report.totals());
    Ok(0)
}
