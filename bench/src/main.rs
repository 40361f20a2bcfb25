//! `nightshift-bench`: the benchmark harness, outside the production CLI
//! (issue 44). It drives the engine's parts directly (`nightshift_engine::embed`),
//! hosts simulated agents in its own process, and starts the `nightshift`
//! binary for the scenarios that need one of their own (failover, the
//! fleet-month). Every figure is printed beside the machine's own limits,
//! measured first (scenario 0); see `bench.rs` for the scenarios.
//!
//! Exit codes: 0 measured, 1 a scenario failed, 2 usage.
#![forbid(unsafe_code)]

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
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(bench::bench(&args, &out)) {
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
