//! `nightshift`: the on-call engineer's CLI, the server (`serve`), and the
//! one-command tour (`demo`).
//!
//! Exit codes: 0 success, 1 the run (or check) failed, 2 usage or config
//! error, 3 refused (approval, blast radius, hands-off, budget), 4 engine or
//! agent unreachable.
#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod args;
mod cmd;
mod complete;
mod conn;
mod remote;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::args::{Cli, Command};
use crate::out::Out;

/// An error that carries its exit code.
#[derive(Debug)]
pub struct Fail(pub u8);

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Fail {}

/// Logs on stderr, one event per line: colour only on a terminal (a file or
/// the journal gets plain text), JSON with `NIGHTSHIFT_LOG_FORMAT=json`.
fn init_logging(default: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("NIGHTSHIFT_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if std::env::var("NIGHTSHIFT_LOG_FORMAT").as_deref() == Ok("json") {
        b.json().try_init()
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
}

async fn real_main(cli: Cli) -> Result<u8> {
    let out = Out::new(cli.json, cli.no_color);
    match &cli.command {
        Command::Serve { listen } => {
            init_logging("info");
            cmd::serve::serve(&cli, listen.clone()).await
        }
        Command::Run { runbook, node, gpu, group, params, dry_run, yes } => {
            init_logging("warn");
            let mut c = cmd::conn_announced(&cli, &out)?;
            let ask = cmd::run::Ask {
                runbook,
                node: node.clone(),
                gpu: *gpu,
                group: group.clone(),
                params: cmd::parse_params(params)?,
                dry_run: *dry_run,
                yes: *yes,
            };
            let r = cmd::run::run(&mut c, &out, ask).await;
            c.close().await;
            r
        }
        Command::Runbooks(c) => cmd::runbooks::runbooks(&cli, &out, c).await,
        Command::Audit(c) => cmd::audit::audit(&cli, &out, c).await,
        Command::Agents(a) => {
            init_logging("warn");
            let mut c = cmd::conn(&cli, &out)?;
            let r = cmd::agents::agents(&mut c, &out, a).await;
            c.close().await;
            r
        }
        Command::Nodes(crate::args::NodesCmd::Resume { node, reason, yes }) => {
            init_logging("warn");
            cmd::control::nodes_resume(&cli, &out, node, reason, *yes).await
        }
        Command::Nodes(crate::args::NodesCmd::Drain { node, reason }) => {
            init_logging("warn");
            cmd::control::nodes_drain(&cli, &out, node, reason).await
        }
        Command::Nodes(crate::args::NodesCmd::HandsOff { node, on, off: _, reason, for_span }) => {
            init_logging("warn");
            let for_secs = match for_span {
                Some(s) => Some(cmd::parse_span_secs("--for", s)?),
                None => None,
            };
            cmd::control::nodes_hands_off(&cli, &out, node, *on, reason.as_deref(), for_secs).await
        }
        Command::Nodes(n) => {
            init_logging("warn");
            let mut c = cmd::conn(&cli, &out)?;
            let r = cmd::agents::nodes(&mut c, &out, n).await;
            c.close().await;
            r
        }
        Command::Holds(crate::args::HoldsCmd::Release { node, gpu, owner, hold, kind, all, force, reason }) => {
            init_logging("warn");
            let what = cmd::control::Release {
                gpu: *gpu,
                owner: owner.as_deref(),
                hold: hold.as_deref(),
                kind: kind.as_deref(),
                all: *all,
                force: *force,
            };
            cmd::control::holds_release(&cli, &out, node, what, reason).await
        }
        Command::Fleet(crate::args::FleetCmd::Import {
            slurm,
            topology,
            inventory,
            out: path,
            port,
            labels,
            timeout_secs,
            yes,
            skip_unreachable,
            accept_changed,
        }) => {
            init_logging("warn");
            let opts = cmd::fleet::ImportOpts {
                out: path.clone(),
                topology: topology.clone(),
                port: *port,
                labels: labels.clone(),
                timeout: std::time::Duration::from_secs((*timeout_secs).max(1)),
                yes: *yes,
                skip_unreachable: *skip_unreachable,
                accept_changed: *accept_changed,
            };
            cmd::fleet::import(&out, slurm.as_deref(), inventory.as_deref(), opts).await
        }
        Command::Maintenance(m) => {
            init_logging("warn");
            cmd::maintenance::maintenance(&cli, &out, m).await
        }
        Command::Fleet(crate::args::FleetCmd::Mode { mode, reason }) => {
            init_logging("warn");
            cmd::fleet::mode(&cli, &out, mode.as_deref(), reason.as_deref()).await
        }
        Command::Runs(crate::args::RunsCmd::List(a)) => {
            cmd::audit::audit(&cli, &out, &crate::args::AuditCmd::List(a.clone())).await
        }
        Command::Approvals(crate::args::ApprovalsCmd::List(a)) => {
            let a = crate::args::RunListArgs { state: Some("pending_approval".into()), ..a.clone() };
            cmd::audit::audit(&cli, &out, &crate::args::AuditCmd::List(a)).await
        }
        Command::Holds(crate::args::HoldsCmd::List(a)) => cmd::agents::holds_list(&cli, &out, a).await,
        Command::Runs(crate::args::RunsCmd::Cancel { run, reason }) => {
            init_logging("warn");
            cmd::control::runs_cancel(&cli, &out, run, reason.as_deref()).await
        }
        Command::Approve { run } => cmd::decide::approve(&cli, &out, run).await,
        Command::Reject { run, reason } => cmd::decide::reject(&cli, &out, run, reason).await,
        Command::Reload { allow_partial } => cmd::decide::reload(&cli, &out, *allow_partial).await,
        Command::Ha => cmd::decide::ha(&cli, &out).await,
        Command::Keygen { out: path, force } => cmd::setup::keygen(&cli, path.as_deref(), *force),
        Command::Token { name, role, webhook } => cmd::setup::token(name, role, *webhook),
        Command::Completions { shell } => cmd::setup::completions(*shell),
        Command::Demo(args) => {
            // The demo prints its own live log; only errors from below.
            init_logging("error");
            cmd::demo::demo(args, &out).await
        }
        Command::Backtest(args) => {
            init_logging("error");
            cmd::backtest::backtest(&cli, args, &out).await
        }
        Command::Bench { args } => Err(cmd::usage(format!(
            "the benchmarks are their own binary now, outside the production CLI: cargo build --release -p nightshift -p nightshift-bench && ./target/release/nightshift-bench {} (docs/BENCHMARKS.md)",
            args.join(" ")
        )
        .trim_end()
        .to_string())),
        Command::Simulate(args) => {
            init_logging("error");
            cmd::simulate::simulate(&cli, args, &out).await
        }
    }
}

fn main() -> ExitCode {
    // A shell asking for completions (COMPLETE=bash …): answer and exit,
    // before any runtime starts (the completers start their own).
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command).complete();
    let cli = Cli::parse_from(args::simulate_json_file(std::env::args_os().collect()));
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(real_main(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = e.chain().find_map(|c| c.downcast_ref::<Fail>()).map_or(1, |f| f.0);
            let msgs: Vec<String> =
                e.chain().filter(|c| c.downcast_ref::<Fail>().is_none()).map(|c| c.to_string()).collect();
            eprintln!("error: {}", msgs.first().cloned().unwrap_or_else(|| "failed".into()));
            for m in msgs.iter().skip(1) {
                eprintln!("  caused by: {m}");
            }
            ExitCode::from(code)
        }
    }
}
