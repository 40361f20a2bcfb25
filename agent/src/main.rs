//! `nightshift-agent`: run the node agent, make keys, check a config.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nightshift_agent::backend::BackendKind;
use nightshift_agent::config::AgentConfig;
use nightshift_agent::runtime;
use nightshift_proto::ssh::keys;

/// The nightshift node agent: safe GPU and node actions over SSH.
#[derive(Parser)]
#[command(name = "nightshift-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent.
    ///
    /// Example: nightshift-agent run --config /etc/nightshift/agent.yaml
    Run {
        #[arg(long, short)]
        config: PathBuf,
        /// Override the config's backend: auto, sim, nvml or rocm.
        #[arg(long)]
        backend: Option<BackendKind>,
        /// Start with no holds on a state dir used before whose state.log
        /// is missing or empty (the start is refused otherwise: the holds,
        /// baselines and leases it kept would be forgotten silently).
        #[arg(long)]
        new_state: bool,
    },
    /// Generate an Ed25519 key (mode 0600) and its .pub; print the fingerprint.
    ///
    /// Example: nightshift-agent keygen --out /var/lib/nightshift-agent/host_key
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing key.
        #[arg(long)]
        force: bool,
    },
    /// Print the host key fingerprint to pin in the engine's inventory.
    ///
    /// Example: nightshift-agent fingerprint --config /etc/nightshift/agent.yaml
    Fingerprint {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check a config, its policy and authorized keys; print a summary.
    /// Offline by default (the unit runs it before every start, and a
    /// scheduler down for a minute must not keep the agent from starting):
    /// a managed config file that is missing is a warning. With --live it
    /// also asks the scheduler for this node's state (scontrol or kubectl,
    /// with the config's timeout) and a missing managed file is an error —
    /// run it once after installing a node.
    ///
    /// Example: nightshift-agent check-config --config /etc/nightshift/agent.yaml --live
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
        /// Contact the scheduler and require every managed file.
        #[arg(long)]
        live: bool,
    },
    /// What the agent sees on this machine: inventory, one telemetry
    /// sample, which readings the backend provides, each action's limits.
    /// Starts no SSH server and changes nothing.
    ///
    /// Example: nightshift-agent probe --backend nvml --json
    Probe {
        /// auto (default), sim, nvml or rocm.
        #[arg(long)]
        backend: Option<BackendKind>,
        /// Use this agent config's backend settings and policy (limits).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Load NVML from this file instead of the system's.
        #[arg(long)]
        nvml_lib: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Logs on stderr, one event per line: colour only on a terminal (a file or
/// the journal gets plain text), JSON with `NIGHTSHIFT_LOG_FORMAT=json`.
fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("NIGHTSHIFT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if std::env::var("NIGHTSHIFT_LOG_FORMAT").as_deref() == Ok("json") {
        b.json().init();
    } else {
        b.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

async fn real_main(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Run { config, backend, new_state } => {
            init_logging();
            let mut cfg = AgentConfig::load(&config).map_err(|e| e.to_string())?;
            cfg.new_state = new_state;
            let started = runtime::start(&cfg, backend).await.map_err(|e| e.to_string())?;
            println!(
                "nightshift-agent {} on {} (backend {}), host key {}{}",
                cfg.node,
                started.server.local_addr,
                started.agent.backend().name(),
                started.host_key_fingerprint,
                if started.host_key_created { " (new)" } else { "" }
            );
            tokio::select! {
                _ = wait_for_signal() => {}
                e = started.server.stopped() => {
                    // Unreachable without its listener: exit non-zero so the
                    // supervisor (systemd Restart=on-failure) starts it again.
                    started.shutdown().await;
                    return Err(format!("the ssh listener on {} died: {e}", cfg.listen_addr));
                }
            }
            tracing::info!("shutting down");
            started.shutdown().await;
            Ok(())
        }
        Command::Keygen { out, force } => {
            if out.exists() && !force {
                return Err(format!("{} already exists: pass --force to replace it", out.display()));
            }
            let key = keys::generate("nightshift").map_err(|e| e.to_string())?;
            keys::write_keypair(&key, &out).map_err(|e| e.to_string())?;
            println!("{}", keys::fingerprint(key.public_key()));
            Ok(())
        }
        Command::Fingerprint { config } => {
            let cfg = AgentConfig::load(&config).map_err(|e| e.to_string())?;
            if !cfg.host_key_path.exists() {
                return Err(format!(
                    "no host key at {} yet: run `nightshift-agent keygen --out {}` or start the agent once",
                    cfg.host_key_path.display(),
                    cfg.host_key_path.display()
                ));
            }
            let key = keys::load(&cfg.host_key_path).map_err(|e| e.to_string())?;
            println!("{}", keys::fingerprint(key.public_key()));
            Ok(())
        }
        Command::Probe { backend, config, nvml_lib, json } => {
            let (backend, policy) = match &config {
                Some(path) => {
                    let mut cfg = AgentConfig::load(path).map_err(|e| e.to_string())?;
                    if nvml_lib.is_some() {
                        cfg.nvml_lib_path = nvml_lib.clone();
                    }
                    let policy = cfg.policy().map_err(|e| e.to_string())?;
                    (runtime::open_backend(&cfg, backend).map_err(|e| e.to_string())?, policy)
                }
                None => {
                    let b: std::sync::Arc<dyn nightshift_agent::backend::Backend> =
                        match backend.unwrap_or(BackendKind::Auto) {
                            BackendKind::Sim => std::sync::Arc::new(
                                nightshift_agent::backend::sim::SimBackend::new(Default::default())
                                    .map_err(|e| e.to_string())?,
                            ),
                            BackendKind::Nvml => std::sync::Arc::new(
                                nightshift_agent::backend::nvml::NvmlBackend::open(nvml_lib.as_deref())
                                    .map_err(|e| e.to_string())?,
                            ),
                            BackendKind::Rocm => {
                                std::sync::Arc::from(nightshift_agent::backend::open_rocm().map_err(|e| e.to_string())?)
                            }
                            BackendKind::Auto => std::sync::Arc::from(
                                nightshift_agent::backend::open_auto(nvml_lib.as_deref()).map_err(|e| e.to_string())?,
                            ),
                        };
                    (b, nightshift_agent::envelope::Policy::default())
                }
            };
            let report = nightshift_agent::probe::probe(backend.as_ref(), &policy).map_err(|e| e.to_string())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
            } else {
                print!("{}", nightshift_agent::probe::render(&report));
            }
            Ok(())
        }
        Command::CheckConfig { config, live } => {
            let cfg = AgentConfig::load(&config).map_err(|e| e.to_string())?;
            let policy = cfg.policy().map_err(|e| e.to_string())?;
            let authorized = keys::load_authorized(&cfg.authorized_keys_path).map(|k| k.len());
            println!("config       {} (node {}, listen {})", config.display(), cfg.node, cfg.listen_addr);
            println!(
                "backend      {}",
                serde_json::to_value(cfg.backend).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
            );
            println!(
                "policy       {}",
                cfg.policy_path.as_ref().map_or("built-in defaults".into(), |p| p.display().to_string())
            );
            let watts = |w: Option<f64>, none: &str| w.map_or(none.to_string(), |w| format!("{w} W"));
            println!(
                "power        floor {}, ceiling {}{}; fan minimum {}%",
                watts(policy.power.floor_watts, "the device minimum"),
                watts(policy.power.ceiling_watts, "the device maximum"),
                policy
                    .power
                    .models
                    .iter()
                    .map(|m| format!(
                        "; {}: floor {}, ceiling {}",
                        m.name_contains,
                        watts(m.floor_watts.or(policy.power.floor_watts), "the device minimum"),
                        watts(m.ceiling_watts.or(policy.power.ceiling_watts), "the device maximum")
                    ))
                    .collect::<String>(),
                policy.fan.min_pct
            );
            println!(
                "hands-off    {} ({})",
                policy.hands_off_marker_path.display(),
                if policy.hands_off() { "PRESENT" } else { "absent" }
            );
            match authorized {
                Ok(n) => println!("authorized   {n} key(s) in {}", cfg.authorized_keys_path.display()),
                Err(e) => return Err(e.to_string()),
            }
            let mut problems: Vec<String> = Vec::new();
            for (name, c) in &cfg.configs {
                match std::fs::metadata(&c.path) {
                    Ok(m) if m.is_file() => println!("config       {name}: {} ({} bytes)", c.path.display(), m.len()),
                    Ok(_) => problems.push(format!("config {name}: {} is not a file", c.path.display())),
                    Err(e) if live => problems.push(format!(
                        "config {name}: {}: {e}: create it (the agent snapshots it before each change) or remove it from configs",
                        c.path.display()
                    )),
                    Err(e) => println!(
                        "config       {name}: {}: {e} (a warning: `check-config --live` requires it)",
                        c.path.display()
                    ),
                }
            }
            let scheduler = nightshift_agent::node::scheduler::Scheduler::new(
                cfg.scheduler.clone(),
                &cfg.node,
                cfg.state_dir.join("node-drain.json"),
            );
            match (scheduler.kind(), live) {
                ("none", _) => println!("scheduler    none: drains are the agent's own file"),
                (kind, false) => println!("scheduler    {kind}: not contacted (`check-config --live` asks it)"),
                (kind, true) => match scheduler.state().await {
                    Ok(st) => println!(
                        "scheduler    {kind}: contacted; the node is {}{}",
                        if st.drained { "drained" } else { "in service" },
                        st.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                    ),
                    Err(e) => problems.push(format!(
                        "scheduler {kind}: cannot read this node's state: {e}; check the scheduler section of {} (node_name, the path, slurm_conf or kubeconfig)",
                        config.display()
                    )),
                },
            }
            if !problems.is_empty() {
                return Err(problems.join("\n       "));
            }
            println!("ok");
            Ok(())
        }
    }
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped systemd unit starts the agent with arguments this CLI
    /// accepts (no drift between examples/systemd and the flags).
    #[test]
    fn the_systemd_unit_command_lines_parse() {
        let unit = include_str!("../../examples/systemd/nightshift-agent.service");
        let lines: Vec<&str> = unit.lines().filter_map(|l| l.strip_prefix("ExecStart")).collect();
        assert_eq!(lines.len(), 2, "ExecStartPre and ExecStart");
        for line in lines {
            let cmd = line.split_once('=').unwrap().1;
            let mut argv: Vec<&str> = cmd.split_whitespace().collect();
            assert_eq!(argv[0], "/usr/local/bin/nightshift-agent");
            argv[0] = argv[0].rsplit('/').next().unwrap_or(argv[0]);
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{cmd}: {e}"));
            match cli.command {
                Command::Run { config, .. } | Command::CheckConfig { config, .. } => {
                    assert_eq!(config, PathBuf::from("/etc/nightshift/agent.yaml"))
                }
                _ => panic!("{cmd}: expected run or check-config"),
            }
        }
    }
}
