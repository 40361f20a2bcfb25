//! One module per command. Shared here: how a command reaches the engine
//! (`--server` or embedded), and the parsers for `--since` and `--param`.

pub mod agents;
pub mod audit;
pub mod bench;
pub mod decide;
pub mod demo;
pub mod run;
pub mod runbooks;
pub mod serve;
pub mod setup;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::Fail;
use crate::args::Cli;
use crate::conn::{Conn, Local, Remote};
use crate::out::Out;

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

/// `30m`, `6h`, `2d` or RFC 3339 → ms since the epoch.
pub fn parse_since(s: &str) -> Result<i64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    if let Some(ms) = nightshift_engine::alerts::parse_rfc3339_ms(s) {
        return Ok(ms);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 =
        num.parse().map_err(|_| usage(format!("--since: expected 30m, 6h, 2d or an RFC 3339 time, found {s:?}")))?;
    let mult = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(usage(format!("--since: expected a unit s, m, h or d, found {s:?}"))),
    };
    Ok(now - n * mult)
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
