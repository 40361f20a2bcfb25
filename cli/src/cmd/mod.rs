//! One module per command. Shared here: how a command reaches the engine
//! (`--server` or embedded), and the parsers for `--since` and `--param`.

pub mod agents;
pub mod audit;
pub mod backtest;
pub mod control;
pub mod decide;
pub mod demo;
pub mod fleet;
pub mod maintenance;
pub mod run;
pub mod runbooks;
pub mod serve;
pub mod setup;
pub mod simulate;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::Fail;
use crate::args::Cli;
use crate::conn::{Conn, Local};
use crate::out::Out;
use crate::remote::Remote;

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Fail(2)).context(msg.into())
}

pub fn conn(cli: &Cli, out: &Out) -> Result<Conn> {
    connect(cli, out, false)
}

/// [`conn`] for commands that change something (`run`, `approve`,
/// `reject`): they say which engine they act through; readers stay quiet.
pub fn conn_announced(cli: &Cli, out: &Out) -> Result<Conn> {
    connect(cli, out, true)
}

fn connect(cli: &Cli, out: &Out, announce: bool) -> Result<Conn> {
    let c = match &cli.server {
        Some(url) => Conn::Remote(Remote::new(url, cli.token.clone())?),
        None => {
            if !cli.config.exists() {
                return Err(usage(format!(
                    "no engine config at {}: pass --config FILE, or --server URL to use a running engine",
                    cli.config.display()
                )));
            }
            Conn::Local(Box::new(Local::new(&cli.config)?))
        }
    };
    if announce && !out.json {
        eprintln!("{}", out.dim(&c.describe()));
    }
    Ok(c)
}

/// `30m`, `6h`, `2d`, `1h30m` (any span jiff reads, ISO 8601's `PT6H`
/// too) back from now, or an RFC 3339 time → ms since the epoch.
pub fn parse_since(s: &str) -> Result<i64> {
    since_at(s, jiff::Timestamp::now().as_millisecond())
}

/// A span forward (`30m`, `4h`, `2d`), in seconds, for `flag`.
pub fn parse_span_secs(flag: &str, s: &str) -> Result<u64> {
    let expected = || usage(format!("{flag}: expected a span (30m, 4h, 2d, 1h30m), found {s:?}"));
    let span: jiff::Span = s.trim().parse().map_err(|_| expected())?;
    let d = span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()).map_err(|_| expected())?;
    if d.is_negative() || d.is_zero() {
        return Err(expected());
    }
    Ok(d.as_secs().max(1) as u64)
}

fn since_at(s: &str, now_ms: i64) -> Result<i64> {
    if let Some(ms) = nightshift_engine::api::parse_rfc3339_ms(s) {
        return Ok(ms);
    }
    let expected = || {
        usage(format!(
            "--since: expected a span back from now (30m, 6h, 2d, 1h30m) or an RFC 3339 time (2026-11-30T03:00:00Z), found {s:?}"
        ))
    };
    let span: jiff::Span = s.trim().parse().map_err(|_| expected())?;
    let d = span.to_duration(jiff::SpanRelativeTo::days_are_24_hours()).map_err(|_| expected())?;
    if d.is_negative() {
        return Err(expected());
    }
    Ok(now_ms.saturating_sub(d.as_millis().min(i64::MAX as i128) as i64))
}

#[cfg(test)]
#[test]
fn since_takes_spans_and_times_and_refuses_the_rest() {
    let now = 1_790_000_000_000;
    for (s, want) in [
        ("30m", now - 1_800_000),
        ("6h", now - 21_600_000),
        ("2d", now - 172_800_000),
        ("1h30m", now - 5_400_000),
        ("PT6H", now - 21_600_000),
        ("2026-11-30T03:00:00Z", 1_796_007_600_000),
    ] {
        assert_eq!(since_at(s, now).unwrap(), want, "{s}");
    }
    for bad in ["", "yesterday", "30x", "2026-02-31T00:00:00Z", "-5m"] {
        assert!(since_at(bad, now).is_err(), "{bad}");
    }
}

pub fn parse_params(v: &[String]) -> Result<BTreeMap<String, String>> {
    v.iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| usage(format!("--param: expected NAME=VALUE, found {p:?}")))
        })
        .collect()
}

/// The runbook folder of the config, else `./runbooks` when there is no
/// config file. A config that exists but does not load is an error (exit
/// 2) naming its line: guessing a folder would hide it.
pub fn default_runbook_dir(cli: &Cli) -> Result<PathBuf> {
    if !cli.config.exists() {
        return Ok(PathBuf::from("runbooks"));
    }
    nightshift_engine::config::EngineConfig::load(&cli.config)
        .map(|c| c.runbook_dir)
        .map_err(|e| usage(format!("{e} (or name the folder: nightshift runbooks validate DIR)")))
}
