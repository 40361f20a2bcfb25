//! The harness's command line: what to measure, at which size, where to
//! write the figures.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::Parser;

/// `nightshift-bench`: measure detection, action and audit speed; print a
/// table and write JSON.
///
/// Example: nightshift-bench --smoke --out target/bench.json
#[derive(Parser, Debug, Clone)]
#[command(name = "nightshift-bench", version)]
pub struct BenchArgs {
    /// A reduced size for CI (under two minutes in all).
    #[arg(long)]
    pub smoke: bool,
    /// Only these scenarios (1–10, repeatable; the machine's limits, 0, are always measured first).
    #[arg(long = "only")]
    pub only: Vec<u32>,
    /// Write the results here as JSON.
    #[arg(long, default_value = "target/bench.json")]
    pub out: PathBuf,
    /// Runs per figure (the median is reported).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Agents for the fan-out scenario.
    #[arg(long)]
    pub fanout_agents: Option<usize>,
    /// Nodes for the memory scenario.
    #[arg(long)]
    pub memory_nodes: Option<usize>,
    /// A PostgreSQL database (libpq URL or key=value string) for the
    /// PostgreSQL figures: audit appends beside sled (5) and failover (9).
    /// `scripts/bench-postgres` starts a throwaway one and passes it.
    #[arg(long, env = "NIGHTSHIFT_BENCH_POSTGRES", hide_env_values = true)]
    pub postgres: Option<String>,
    /// SQLite's durable rows per second with 8 threads on the same disk
    /// (`scripts/bench-sqlite` prints it): scenario 5's 8-writer target is
    /// ten times that. Without it that figure is not compared.
    #[arg(long, value_name = "ROWS_PER_S", value_parser = positive_rate)]
    pub sqlite_8_rows_per_s: Option<f64>,
    /// Leader kills for the failover scenario (9).
    #[arg(long)]
    pub ha_kills: Option<usize>,
    /// Scenario 8 replays the whole week (7 days × 1,000 nodes at 15 s: 968 M
    /// samples) instead of a day; scenario 10 plays the paper's fleet
    /// (2,048 nodes × 54 days) instead of 256 nodes.
    #[arg(long)]
    pub full: bool,
    /// The `nightshift` binary the failover (9) and fleet-month (10)
    /// scenarios start as child processes (default: the one beside this
    /// binary, as `cargo build -p nightshift` leaves it).
    #[arg(long, value_name = "PATH")]
    pub nightshift: Option<PathBuf>,
    /// Scenario 2 hosts its agents in this process, as it did before issue
    /// 45 (they compete with the engine for its runtime): for comparison.
    #[arg(long)]
    pub agents_in_process: bool,
    /// Scenario 2 at these rates only (alerts per second, repeatable),
    /// without its knee: to profile one rate.
    #[arg(long = "alert-rate", value_name = "PER_S", value_parser = positive_rate)]
    pub alert_rates: Vec<f64>,
    /// Internal: serve this many sim agents in this process until stdin
    /// closes (scenario 2 starts its agents so, in a process of their own).
    #[arg(long, hide = true, value_name = "N", requires = "agent_state")]
    pub agent_fleet: Option<usize>,
    /// Internal: the agents' folder (with `authorized_keys`) for --agent-fleet.
    #[arg(long, hide = true, value_name = "DIR")]
    pub agent_state: Option<PathBuf>,
    /// Internal: GPUs per agent for --agent-fleet.
    #[arg(long, hide = true, default_value_t = 8)]
    pub agent_gpus: u32,
    /// Internal: the agents' telemetry interval for --agent-fleet.
    #[arg(long, hide = true, default_value_t = 1000)]
    pub agent_interval_ms: u64,
    /// Print the figures as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No colour, even on a terminal.
    #[arg(long)]
    pub no_color: bool,
}

/// A rate: a finite number above zero.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a number per second above zero, found {s:?}")),
    }
}

impl BenchArgs {
    /// The `nightshift` binary scenario `n` starts, or what to do when it
    /// is not there.
    pub fn nightshift_exe(&self, n: u32) -> Result<PathBuf> {
        let path = match &self.nightshift {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("nightshift"),
        };
        if path.is_file() {
            Ok(path)
        } else {
            Err(anyhow!(
                "scenario {n} starts `nightshift` as a child process: expected the binary at {}, found nothing (build it: cargo build -p nightshift, in the same profile; or pass --nightshift PATH)",
                path.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `bench --sqlite-8-rows-per-s` takes a rate: a finite number above
    /// zero, and says what it found otherwise.
    #[test]
    fn a_reference_rate_is_a_positive_finite_number() {
        for (input, want) in [
            ("4869", Ok(4869.0)),
            ("4869.5", Ok(4869.5)),
            ("0", Err("expected a number per second above zero, found \"0\"")),
            ("-3", Err("expected a number per second above zero, found \"-3\"")),
            ("NaN", Err("expected a number per second above zero, found \"NaN\"")),
            ("inf", Err("expected a number per second above zero, found \"inf\"")),
            ("fast", Err("expected a number per second above zero, found \"fast\"")),
        ] {
            assert_eq!(positive_rate(input), want.map_err(String::from), "{input}");
        }
    }

    /// Every argument says what it is for.
    #[test]
    fn every_argument_has_help() {
        let missing: Vec<String> = BenchArgs::command()
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .filter(|a| a.get_help().is_none_or(|h| h.to_string().trim().is_empty()))
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }

    /// A missing `nightshift` binary is named, with how to build it.
    #[test]
    fn a_missing_nightshift_binary_says_how_to_build_it() {
        let a = BenchArgs::try_parse_from(["nightshift-bench", "--nightshift", "/nonexistent/nightshift"]).unwrap();
        let e = a.nightshift_exe(10).unwrap_err().to_string();
        assert!(e.starts_with("scenario 10 starts `nightshift` as a child process: expected the binary at /nonexistent/nightshift, found nothing (build it: cargo build -p nightshift"), "{e}");
    }
}
