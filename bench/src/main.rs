//! `nightshift-bench`: the benchmark harness, outside the production CLI
//! (issue 44). It drives the engine's parts directly (`nightshift_engine::embed`),
//! hosts simulated agents in its own process or (scenario 2) in a child
//! process of its own (`apart.rs`), and starts the `nightshift`
//! binary for the scenarios that need one of their own (failover, the
//! fleet-month). Every figure is printed beside the machine's own limits,
//! measured first (scenario 0); see `bench.rs` for the scenarios.
//!
//! Exit codes: 0 measured, 1 a scenario failed, 2 usage.
#![forbid(unsafe_code)]

mod apart;
mod args;
mod bench;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

use crate::args::BenchArgs;

/// How to print: colour only on a terminal and never with `NO_COLOR`, JSON
/// on request.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    pub color: bool,
    pub json: bool,
}

impl Out {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color { format!("\x1b[{code}m{s}\x1b[0m") } else { s.to_string() }
    }
    pub fn green(&self, s: &str) -> String {
        self.paint("32", s)
    }
    pub fn red(&self, s: &str) -> String {
        self.paint("31", s)
    }
}

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    let color =
        !args.no_color && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let out = Out { color, json: args.json };
    // Only errors from the engine's parts: the figures are the output.
    let filter = tracing_subscriber::EnvFilter::try_from_env("NIGHTSHIFT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.agent_fleet {
        builder.worker_threads(apart::worker_threads(n));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let run = async {
        match (args.agent_fleet, &args.agent_state) {
            (Some(n), Some(dir)) => apart::serve(n, args.agent_gpus, args.agent_interval_ms, dir).await,
            _ => bench::bench(&args, &out).await,
        }
    };
    match rt.block_on(run) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(1)
        }
    }
}
