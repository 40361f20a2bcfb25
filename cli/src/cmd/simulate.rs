//! `nightshift simulate`: a fault mix played on a whole fleet in virtual
//! time under three policies (`nightshift_sim::simulate`); a summary here,
//! the report as JSON and as a page.

use anyhow::{Context, Result};

use nightshift_sim::simulate::mix::FaultMix;
use nightshift_sim::simulate::report::{Report, SeedsReport};
use nightshift_sim::simulate::{SimulateError, SimulateOptions, simulate as run_simulation};

use crate::args::{Cli, SimulateArgs};
use crate::cmd::{default_runbook_dir, usage};
use crate::out::Out;

/// MemAvailable from /proc/meminfo, in bytes (`None` off Linux).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A field of /proc/self/status in bytes (VmHWM: peak resident memory).
fn peak_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn write(path: &std::path::Path, text: &str, what: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write the {what} to {}", path.display()))
}

pub async fn simulate(cli: &Cli, args: &SimulateArgs, out: &Out) -> Result<u8> {
    let mix = FaultMix::load(&args.faults).map_err(|e| usage(e.to_string()))?;
    let runbooks = match &args.runbooks {
        Some(d) => d.clone(),
        None => default_runbook_dir(cli)?,
    };
    let mut opts = SimulateOptions::new(args.nodes, args.days, args.seed);
    opts.gpus_per_node = args.gpus_per_node;
    opts.profile = args.profile.clone();
    opts.runbooks = runbooks;
    opts.standby_pct = args.standby_pct;
    opts.checkpoint_secs = args.checkpoint_secs;
    opts.restart_secs = args.restart_secs;
    opts.engine_restart_every_secs = args.engine_restart_every_secs;
    opts.pager_outage_every_secs = args.pager_outage_every_secs;
    opts.pager_outage_secs = args.pager_outage_secs;
    opts.check(mem_available()).map_err(|e| usage(e.to_string()))?;
    if args.seed.checked_add(args.seeds - 1).is_none() {
        return Err(usage(format!("--seed {} --seeds {}: the last seed is past u64", args.seed, args.seeds)));
    }
    let started = std::time::Instant::now();
    let mut reports: Vec<Report> = Vec::new();
    for k in 0..args.seeds {
        let mut o = opts.clone();
        o.seed = args.seed + k;
        eprintln!(
            "simulate: {} nodes × {} GPUs, {} days, seed {} ({} of {})",
            o.nodes,
            o.gpus_per_node,
            o.days,
            o.seed,
            k + 1,
            args.seeds
        );
        let r = run_simulation(&o, &mix).await.map_err(|e| match e {
            SimulateError::Options(m) => usage(m),
            SimulateError::Mix(e) => usage(e.to_string()),
            SimulateError::Setup(m) => anyhow::anyhow!("the simulation could not start: {m}"),
        })?;
        reports.push(r);
    }
    eprintln!(
        "simulate: {:.1} s wall{}",
        started.elapsed().as_secs_f64(),
        peak_rss().map(|b| format!(", peak memory {} MiB (VmHWM)", b >> 20)).unwrap_or_default()
    );
    if reports.len() == 1 {
        let r = &reports[0];
        if let Some(p) = &args.out {
            write(p, &r.to_json(), "report")?;
        }
        if let Some(p) = &args.html {
            write(p, &r.to_html(), "page")?;
        }
        if out.json {
            out!("{}", r.to_json());
        } else {
            out!("{}", r.summary());
        }
    } else {
        if let Some(p) = &args.html {
            write(p, &reports[0].to_html(), "page (first seed)")?;
        }
        let all = SeedsReport::of(reports).context("no seed ran")?;
        if let Some(p) = &args.out {
            write(p, &all.to_json(), "report")?;
        }
        if out.json {
            out!("{}", all.to_json());
        } else {
            out!("{}", all.summary());
        }
    }
    Ok(0)
}
