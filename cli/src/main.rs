//! `nightshift`: the on-call engineer's CLI, the server (`serve`), and the
//! one-command tour (`demo`).
//!
//! Exit codes: 0 success, 1 the run (or check) failed, 2 usage or config
//! error, 3 refused (approval, blast radius, hands-off, budget), 4 engine or
//! agent unreachable.
#![forbid(unsafe_code)]

mod bench;
mod conn;
mod demo;
mod out;
mod run;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

use nightshift_engine::audit::RunFilter;
use nightshift_engine::runs::RunOutcome;

use crate::conn::{Conn, Local, Remote};
use crate::out::{Out, clip, time};

/// An error that carries its exit code.
#[derive(Debug)]
pub struct Fail(pub u8);

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Fail {}

/// nightshift: incident runbooks for GPU fleets.
#[derive(Parser)]
#[command(name = "nightshift", version, about, long_about = None)]
struct Cli {
    /// Talk to a running engine at this URL instead of starting one here.
    #[arg(long, global = true, env = "NIGHTSHIFT_SERVER")]
    server: Option<String>,
    /// API token for --server (or NIGHTSHIFT_TOKEN).
    #[arg(long, global = true, env = "NIGHTSHIFT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Engine config for the embedded engine.
    #[arg(long, short, global = true, env = "NIGHTSHIFT_CONFIG", default_value = "engine.yaml")]
    config: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// No colour (also when NO_COLOR is set or stdout is not a terminal).
    #[arg(long, global = true)]
    no_color: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine and the web UI/API until SIGINT or SIGTERM.
    ///
    /// Example: nightshift serve --config /etc/nightshift/engine.yaml
    Serve {
        /// Override the config's listen_addr.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Run a runbook against a node, a GPU or a group: shows the plan, asks
    /// before changing anything (unless --yes), streams each step.
    ///
    /// Example: nightshift run gpu-overheat --node gpu-a1 --gpu 3 --param target_c=78 --dry-run
    Run {
        runbook: String,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        gpu: Option<u32>,
        /// A label group, e.g. pool=a.
        #[arg(long)]
        group: Option<String>,
        /// Override a parameter (repeatable): name=value.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// Send every action with dry_run: nothing changes.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
    },
    /// Runbooks: list, show, validate, test.
    #[command(subcommand)]
    Runbooks(RunbooksCmd),
    /// The audit log: list runs, show one, follow, verify, export.
    #[command(subcommand)]
    Audit(AuditCmd),
    /// Agents: list, ping, inventory.
    #[command(subcommand)]
    Agents(AgentsCmd),
    /// Approve a run that waits for approval (needs --server).
    ///
    /// Example: nightshift approve r000042 --server http://nightshift:8080
    Approve { run: String },
    /// Reject a run that waits for approval (needs --server).
    ///
    /// Example: nightshift reject r000042 --reason "not during the training run"
    Reject {
        run: String,
        #[arg(long)]
        reason: String,
    },
    /// Generate the engine's SSH key (mode 0600) and print what agents need.
    ///
    /// Example: nightshift keygen --out /var/lib/nightshift/engine_key
    Keygen {
        /// Where to write it (default: the config's engine_key_path, else ./engine_key).
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        force: bool,
    },
    /// Make an API token and print the config line that grants it.
    ///
    /// Example: nightshift token --name alice --role operator
    Token {
        #[arg(long)]
        name: String,
        /// viewer, operator or admin.
        #[arg(long, default_value = "viewer")]
        role: String,
    },
    /// Print shell completions.
    ///
    /// Example: nightshift completions bash > /etc/bash_completion.d/nightshift
    Completions { shell: clap_complete::Shell },
    /// A simulated fleet, the engine and the web UI, with a fault script.
    ///
    /// Example: nightshift demo --nodes 8 --duration-secs 60
    Demo(demo::DemoArgs),
    /// Measure detection, action and audit speed; print a table and write JSON.
    ///
    /// Example: nightshift bench --smoke --out target/bench.json
    Bench(bench::BenchArgs),
}

#[derive(Subcommand)]
enum RunbooksCmd {
    /// List loaded runbooks.
    ///
    /// Example: nightshift runbooks list
    List,
    /// Show a runbook's manifest and script.
    ///
    /// Example: nightshift runbooks show gpu-overheat
    Show { name: String },
    /// Check manifests and scripts in a folder (file:line:column errors).
    ///
    /// Example: nightshift runbooks validate runbooks/
    Validate { path: Option<PathBuf> },
    /// Run the scenarios in <dir>/scenarios in virtual time.
    ///
    /// Example: nightshift runbooks test gpu-overheat --dir runbooks
    Test {
        /// Only scenarios of this runbook (or whose name starts with this).
        name: Option<String>,
        /// The runbook folder (default: the config's runbook_dir, else ./runbooks).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum AuditCmd {
    /// Runs, newest first.
    ///
    /// Example: nightshift audit list --node gpu-a1 --outcome failed --since 24h
    List {
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        runbook: Option<String>,
        #[arg(long)]
        outcome: Option<String>,
        /// 30m, 6h, 2d, or an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One run: summary and every record.
    ///
    /// Example: nightshift audit show r000042
    Show { run: String },
    /// Print records as they are written (Ctrl-C to stop).
    ///
    /// Example: nightshift audit follow --server http://127.0.0.1:8080
    Follow,
    /// Walk the hash chain; exit 1 if it is broken.
    ///
    /// Example: nightshift audit verify
    Verify,
    /// Every record, oldest first.
    ///
    /// Example: nightshift audit export --format jsonl > audit.jsonl
    Export {
        #[arg(long, default_value = "jsonl")]
        format: String,
    },
}

#[derive(Subcommand)]
enum AgentsCmd {
    /// Every node: connection, drain state, readings.
    ///
    /// Example: nightshift agents list
    List,
    /// Round trip to a node's agent.
    ///
    /// Example: nightshift agents ping gpu-a1
    Ping { node: String },
    /// A node's GPUs and envelope.
    ///
    /// Example: nightshift agents inventory gpu-a1
    Inventory { node: String },
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Fail(2)).context(msg.into())
}

fn conn(cli: &Cli, out: &Out) -> Result<Conn> {
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
    if !out.json {
        eprintln!("{}", out.dim(&c.describe()));
    }
    Ok(c)
}

/// `30m`, `6h`, `2d` or RFC 3339 → ms since the epoch.
fn parse_since(s: &str) -> Result<i64> {
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

fn parse_params(v: &[String]) -> Result<BTreeMap<String, String>> {
    v.iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| usage(format!("--param: expected NAME=VALUE, found {p:?}")))
        })
        .collect()
}

fn init_logging(default: &str) {
    use tracing_subscriber::EnvFilter;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("NIGHTSHIFT_LOG").unwrap_or_else(|_| EnvFilter::new(default)))
        .with_writer(std::io::stderr)
        .try_init();
}

async fn real_main(cli: Cli) -> Result<u8> {
    let out = Out::new(cli.json, cli.no_color);
    match &cli.command {
        Command::Serve { listen } => {
            init_logging("info");
            serve(&cli, listen.clone()).await
        }
        Command::Run { runbook, node, gpu, group, params, dry_run, yes } => {
            init_logging("warn");
            let mut c = conn(&cli, &out)?;
            let r = run::run(
                &mut c,
                &out,
                runbook,
                node.clone(),
                *gpu,
                group.clone(),
                parse_params(params)?,
                *dry_run,
                *yes,
            )
            .await;
            c.close().await;
            r
        }
        Command::Runbooks(cmd) => runbooks(&cli, &out, cmd).await,
        Command::Audit(cmd) => audit(&cli, &out, cmd).await,
        Command::Agents(cmd) => {
            init_logging("warn");
            let mut c = conn(&cli, &out)?;
            let r = agents(&mut c, &out, cmd).await;
            c.close().await;
            r
        }
        Command::Approve { run } => {
            let mut c = conn(&cli, &out)?;
            let s = c.decide(run, true, None).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("approved {} ({} on {}): it starts now", s.id, s.runbook, s.target);
            }
            Ok(0)
        }
        Command::Reject { run, reason } => {
            let mut c = conn(&cli, &out)?;
            let s = c.decide(run, false, Some(reason)).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("rejected {} ({} on {})", s.id, s.runbook, s.target);
            }
            Ok(0)
        }
        Command::Keygen { out: path, force } => {
            let path = match path {
                Some(p) => p.clone(),
                None => nightshift_engine::config::EngineConfig::load(&cli.config)
                    .map(|c| c.engine_key_path)
                    .unwrap_or_else(|_| PathBuf::from("engine_key")),
            };
            if path.exists() && !force {
                return Err(usage(format!(
                    "{} already exists: pass --force to replace it (agents will need the new .pub)",
                    path.display()
                )));
            }
            let key = nightshift_proto::ssh::keys::generate("nightshift-engine")?;
            nightshift_proto::ssh::keys::write_keypair(&key, &path)?;
            let public = key.public_key().to_openssh()?;
            println!(
                "wrote {} (mode 0600) and {}",
                path.display(),
                nightshift_proto::ssh::keys::pub_path(&path).display()
            );
            println!("fingerprint {}", nightshift_proto::ssh::keys::fingerprint(key.public_key()));
            println!("add this line to every agent's authorized_keys:\n{public}");
            Ok(0)
        }
        Command::Token { name, role } => {
            let role_ok = ["viewer", "operator", "admin"].contains(&role.as_str());
            if !role_ok {
                return Err(usage(format!("--role: expected viewer, operator or admin, found {role:?}")));
            }
            let bytes: [u8; 24] = rand::random();
            let token = format!("ns_{}", hex::encode(bytes));
            println!("token (give it to {name}; it is not stored anywhere): {token}");
            println!("add to engine.yaml under auth.tokens:");
            println!("  - {{name: {name}, role: {role}, sha256: {}}}", nightshift_web::auth::hash_token(&token));
            Ok(0)
        }
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "nightshift", &mut std::io::stdout());
            Ok(0)
        }
        Command::Demo(args) => {
            // The demo prints its own live log; only errors from below.
            init_logging("error");
            demo::demo(args, &out).await
        }
        Command::Bench(args) => {
            init_logging("error");
            bench::bench(args, &out).await
        }
    }
}

async fn serve(cli: &Cli, listen: Option<String>) -> Result<u8> {
    let mut config = nightshift_engine::config::EngineConfig::load(&cli.config).map_err(|e| usage(e.to_string()))?;
    if let Some(l) = listen {
        config.listen_addr = l;
    }
    let addr = config.listen_addr.clone();
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|e| usage(format!("cannot listen on {addr}: {e}")))?;
    let engine = nightshift_engine::serve::start(config).await.map_err(|e| match e {
        nightshift_engine::serve::StartError::Audit(nightshift_engine::audit::AuditError::Locked { path, .. }) => {
            usage(format!("{} is in use by another nightshift process", path.display()))
        }
        other => usage(other.to_string()),
    })?;
    eprintln!(
        "nightshift serving on http://{} ({} nodes, {} runbooks)",
        listener.local_addr()?,
        engine.node_names().len(),
        engine.runbook_set().runbooks.len()
    );
    let e2 = engine.clone();
    let shutdown = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
        e2.shutdown().await;
    };
    nightshift_web::serve(engine, listener, shutdown).await?;
    Ok(0)
}

async fn runbooks(cli: &Cli, out: &Out, cmd: &RunbooksCmd) -> Result<u8> {
    match cmd {
        RunbooksCmd::List => {
            let mut c = conn(cli, out)?;
            let list = c.runbooks().await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|r| {
                        vec![
                            r.handbook.clone().unwrap_or_default(),
                            r.name.clone(),
                            r.trigger.clone(),
                            r.scope.clone(),
                            clip(&r.description, 90),
                        ]
                    })
                    .collect();
                out.table(&["ROW", "RUNBOOK", "TRIGGER", "SCOPE", "DESCRIPTION"], &rows);
            }
            Ok(0)
        }
        RunbooksCmd::Show { name } => {
            let mut c = conn(cli, out)?;
            let r = c.runbook(name).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("{} {}", out.bold(&r.name), r.handbook.clone().unwrap_or_default());
                println!("{}\n", r.description);
                println!("{}", out.dim(&format!("# {}", r.manifest_path)));
                println!("{}", serde_json::to_string_pretty(&r.manifest)?);
                println!("{}", out.dim("# script"));
                for (i, l) in r.script.lines().enumerate() {
                    println!("{} {l}", out.dim(&format!("{:>4}", i + 1)));
                }
            }
            Ok(0)
        }
        RunbooksCmd::Validate { path } => {
            let dir = match path {
                Some(p) => p.clone(),
                None => default_runbook_dir(cli),
            };
            let engine = nightshift_engine::script::build_engine(&Default::default());
            let set = nightshift_engine::runbook::load_dir(&dir, &engine);
            if out.json {
                let errors: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"loaded": set.names(), "errors": errors}))?
                );
            } else {
                for e in &set.errors {
                    println!("{} {e}", out.red("error:"));
                }
                println!("{} runbook(s) valid, {} error(s) in {}", set.runbooks.len(), set.errors.len(), dir.display());
            }
            Ok(if set.errors.is_empty() { 0 } else { 2 })
        }
        RunbooksCmd::Test { name, dir } => {
            let dir = dir.clone().unwrap_or_else(|| default_runbook_dir(cli));
            run::test_scenarios(out, &dir, name.as_deref()).await
        }
    }
}

fn default_runbook_dir(cli: &Cli) -> PathBuf {
    nightshift_engine::config::EngineConfig::load(&cli.config)
        .map(|c| c.runbook_dir)
        .unwrap_or_else(|_| PathBuf::from("runbooks"))
}

async fn audit(cli: &Cli, out: &Out, cmd: &AuditCmd) -> Result<u8> {
    let mut c = conn(cli, out)?;
    match cmd {
        AuditCmd::List { node, runbook, outcome, since, limit } => {
            let outcome = match outcome {
                Some(o) => Some(RunOutcome::parse(o).ok_or_else(|| {
                    usage(format!("--outcome: expected succeeded, failed, refused, timed_out, cancelled or interrupted, found {o:?}"))
                })?),
                None => None,
            };
            let f = RunFilter {
                node: node.clone(),
                runbook: runbook.clone(),
                outcome,
                since_ms: since.as_deref().map(parse_since).transpose()?,
                limit: Some(*limit),
                ..Default::default()
            };
            let page = c.runs(&f).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&page)?);
            } else {
                let rows: Vec<Vec<String>> = page
                    .runs
                    .iter()
                    .map(|r| {
                        let status = r.outcome.map(|o| o.as_str().to_string()).unwrap_or_else(|| {
                            serde_json::to_value(r.state)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default()
                        });
                        vec![
                            time(r.created_ms),
                            r.id.clone(),
                            r.runbook.clone(),
                            r.target.to_string(),
                            out.status(&status),
                            r.actions.to_string(),
                            clip(&r.why, 80),
                        ]
                    })
                    .collect();
                out.table(&["CREATED (UTC)", "RUN", "RUNBOOK", "TARGET", "STATUS", "ACTIONS", "WHY"], &rows);
                if page.next_cursor.is_some() {
                    println!("{}", out.dim("(more: raise --limit)"));
                }
            }
            Ok(0)
        }
        AuditCmd::Show { run } => {
            let (r, records) = c.run(run).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({"run": r, "records": records}))?);
                return Ok(0);
            }
            println!(
                "{} {} on {}  {}",
                out.bold(&r.id),
                r.runbook,
                r.target,
                out.status(r.outcome.map(|o| o.as_str()).unwrap_or("active"))
            );
            println!("{}", r.why);
            println!(
                "{}",
                out.dim(&format!(
                    "requested by {} · trigger {} · created {}",
                    r.requested_by,
                    r.trigger,
                    time(r.created_ms)
                ))
            );
            for rec in &records {
                println!("{}", run::describe_record(out, rec, r.created_ms));
            }
            Ok(0)
        }
        AuditCmd::Follow => match &c {
            Conn::Remote(remote) => {
                remote
                    .follow(|rec| {
                        println!("{}", run::describe_record(out, &rec, rec.ts_ms));
                        true
                    })
                    .await?;
                Ok(0)
            }
            Conn::Local(_) => {
                let mut last = c.records_after(0, usize::MAX).await?.last().map(|r| r.seq).unwrap_or(0);
                loop {
                    for rec in c.records_after(last, 1000).await? {
                        last = rec.seq;
                        println!("{}", run::describe_record(out, &rec, rec.ts_ms));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            }
        },
        AuditCmd::Verify => {
            let v = c.verify().await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if v.ok {
                println!(
                    "{} chain verified up to record {} ({} records)",
                    out.green("ok:"),
                    v.verified_up_to,
                    v.records
                );
            } else {
                println!(
                    "{} the chain breaks at record {}: {}",
                    out.red("broken:"),
                    v.first_bad_seq.unwrap_or(0),
                    v.problem.clone().unwrap_or_default()
                );
            }
            Ok(if v.ok { 0 } else { 1 })
        }
        AuditCmd::Export { format } => {
            if format != "jsonl" {
                return Err(usage(format!("--format: expected jsonl, found {format:?}")));
            }
            let mut after = 0;
            loop {
                let batch = c.records_after(after, 1000).await?;
                let Some(last) = batch.last() else { break };
                after = last.seq;
                for r in &batch {
                    println!("{}", serde_json::to_string(r)?);
                }
            }
            Ok(0)
        }
    }
}

async fn agents(c: &mut Conn, out: &Out, cmd: &AgentsCmd) -> Result<u8> {
    match cmd {
        AgentsCmd::List => {
            let nodes = c.nodes().await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    let hottest = n
                        .gpus
                        .iter()
                        .filter_map(|g| g.get("gpu.temperature_c"))
                        .cloned()
                        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
                    let drain = if n.state.drained {
                        if n.drained_by_person {
                            out.yellow("drained (person)")
                        } else {
                            out.blue("drained (nightshift)")
                        }
                    } else {
                        "in service".into()
                    };
                    vec![
                        n.name.clone(),
                        n.address.clone(),
                        if n.state.connected { out.green("connected") } else { out.red("unreachable") },
                        drain,
                        hottest.map(|t| format!("{t:.1} °C")).unwrap_or_else(|| "—".into()),
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
                    ]
                })
                .collect();
            out.table(&["NODE", "ADDRESS", "AGENT", "DRAIN", "HOTTEST", "LABELS"], &rows);
            Ok(0)
        }
        AgentsCmd::Ping { node } => {
            let v = c.agent(node, "ping").await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if v["ok"] == true {
                println!("{node}: ok in {} ms", v["round_trip_ms"]);
            } else {
                println!("{node}: {}", v["error"]);
                return Ok(4);
            }
            Ok(0)
        }
        AgentsCmd::Inventory { node } => {
            let v = c.agent(node, "inventory").await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(0);
            }
            println!(
                "{} · backend {} · scheduler {} · agent {}",
                v["node"].as_str().unwrap_or(node),
                v["backend"],
                v["scheduler"],
                v["agent_version"]
            );
            let rows: Vec<Vec<String>> = v["gpus"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|g| {
                    vec![
                        g["index"].to_string(),
                        g["name"].as_str().unwrap_or("").to_string(),
                        format!("{}–{} W", g["power_min_watts"], g["power_max_watts"]),
                        format!("{}–{} W", g["envelope_power_min_watts"], g["envelope_power_max_watts"]),
                        if g["fan_control"] == true { "yes".into() } else { "no".into() },
                        format!("{} MiB", g["mem_total_mib"]),
                    ]
                })
                .collect();
            out.table(&["GPU", "MODEL", "DEVICE POWER", "ENVELOPE", "FAN CONTROL", "MEMORY"], &rows);
            Ok(0)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli).await {
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

#[cfg(test)]
mod unit_file_tests {
    use super::*;

    /// The shipped systemd unit starts the engine with arguments this CLI
    /// accepts (no drift between examples/systemd and the flags).
    #[test]
    fn the_systemd_unit_command_lines_parse() {
        let unit = include_str!("../../examples/systemd/nightshift-engine.service");
        let lines: Vec<&str> = unit.lines().filter_map(|l| l.strip_prefix("ExecStart")).collect();
        assert_eq!(lines.len(), 2, "ExecStartPre and ExecStart");
        for line in lines {
            let cmd = line.split_once('=').unwrap().1;
            let mut argv: Vec<&str> = cmd.split_whitespace().collect();
            assert_eq!(argv[0], "/usr/local/bin/nightshift");
            argv[0] = argv[0].rsplit('/').next().unwrap_or(argv[0]);
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{cmd}: {e}"));
            assert_eq!(cli.config, PathBuf::from("/etc/nightshift/engine.yaml"), "{cmd}");
            assert!(
                matches!(cli.command, Command::Serve { .. } | Command::Runbooks(RunbooksCmd::Validate { path: None })),
                "{cmd}: expected serve or runbooks validate"
            );
        }
    }
}
