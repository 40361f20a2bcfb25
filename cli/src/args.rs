//! The command line, as clap sees it: every command, flag and help text.
//! The commands' bodies are in `cmd/`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use clap_complete::engine::ArgValueCompleter;

/// nightshift: incident runbooks for GPU fleets.
#[derive(Parser)]
#[command(name = "nightshift", version, about, long_about = None)]
pub struct Cli {
    /// Talk to a running engine at this URL instead of starting one here.
    #[arg(long, global = true, env = "NIGHTSHIFT_SERVER")]
    pub server: Option<String>,
    /// API token for --server (or NIGHTSHIFT_TOKEN).
    #[arg(long, global = true, env = "NIGHTSHIFT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Engine config for the embedded engine.
    #[arg(long, short, global = true, env = "NIGHTSHIFT_CONFIG", default_value = "engine.yaml")]
    pub config: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// No colour (also when NO_COLOR is set or stdout is not a terminal).
    #[arg(long, global = true)]
    pub no_color: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Exit status: 0 succeeded, 4 it did its part and needs a person (it
    /// paged one, or left a node drained for one), 3 refused or rejected,
    /// 1 anything else.
    ///
    /// Example: nightshift run gpu-overheat --node gpu-a1 --gpu 3 --param target_c=78 --dry-run
    Run {
        /// The runbook to run (`nightshift runbooks list`).
        #[arg(add = ArgValueCompleter::new(crate::complete::runbooks))]
        runbook: String,
        /// The node to run it on (GPU- and node-scoped runbooks).
        #[arg(long, add = ArgValueCompleter::new(crate::complete::nodes))]
        node: Option<String>,
        /// The GPU to run it on (GPU-scoped runbooks).
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
    /// Agents: list, ping, inventory, holds, health.
    #[command(subcommand)]
    Agents(AgentsCmd),
    /// Nodes: repaired, resume, hands-off.
    #[command(subcommand)]
    Nodes(NodesCmd),
    /// Holds: release them as yourself (needs --server).
    #[command(subcommand)]
    Holds(HoldsCmd),
    /// Runs: cancel one (needs --server).
    #[command(subcommand)]
    Runs(RunsCmd),
    /// The fleet inventory: build fleet.yaml from Slurm or an inventory.
    #[command(subcommand)]
    Fleet(FleetCmd),
    /// Maintenance windows, like Alertmanager silences: the nodes they
    /// match are hands-off from their start to their end.
    #[command(subcommand)]
    Maintenance(MaintenanceCmd),
    /// Runs waiting for a person's approval, where kubectl users look.
    ///
    /// Example: nightshift approvals list --server http://nightshift:8080
    #[command(subcommand)]
    Approvals(ApprovalsCmd),
    /// Approve a run that waits for approval (needs --server).
    ///
    /// Example: nightshift approve r000042 --server http://nightshift:8080
    Approve {
        /// The run id (r000042-k3x9qa; `nightshift audit list`).
        #[arg(add = ArgValueCompleter::new(crate::complete::runs))]
        run: String,
    },
    /// Reject a run that waits for approval (needs --server).
    ///
    /// Example: nightshift reject r000042 --reason "not during the training run"
    Reject {
        /// The run id (r000042-k3x9qa; `nightshift audit list`).
        #[arg(add = ArgValueCompleter::new(crate::complete::runs))]
        run: String,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
    },
    /// Make a running engine read fleet.yaml, its tokens and the runbooks
    /// again, as SIGHUP does (needs --server and an admin token); prints
    /// what changed.
    ///
    /// Example: nightshift reload --server http://nightshift:8080
    Reload {
        /// Put the runbooks that load in force even if others fail to load
        /// (by default a broken runbook refuses the whole reload, so none
        /// is dropped silently).
        #[arg(long)]
        allow_partial: bool,
    },
    /// Leadership (PostgreSQL backend): whether this engine leads its shard,
    /// at what term, who leads, and every shard of the database.
    ///
    /// Example: nightshift ha --server http://nightshift-b:8080
    Ha,
    /// Generate the engine's SSH key (mode 0600) and print what agents need.
    ///
    /// Example: nightshift keygen --out /var/lib/nightshift/engine_key
    Keygen {
        /// Where to write it (default: the config's engine_key_path, else ./engine_key).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Replace a key file that exists.
        #[arg(long)]
        force: bool,
    },
    /// Make an API token and print the config line that grants it.
    ///
    /// Example: nightshift token --name alice --role operator
    Token {
        /// Who holds the token (the audit log says `user:<name>`), or the webhook token's name.
        #[arg(long)]
        name: String,
        /// viewer, operator or admin.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// A token for Alertmanager's webhook (auth.webhook_tokens) instead
        /// of a person's; it can post alerts and nothing else.
        #[arg(long, conflicts_with = "role")]
        webhook: bool,
    },
    /// Print the shell's completion script: commands and flags, and runbook,
    /// node and run names looked up when you press Tab (the script calls
    /// nightshift back with COMPLETE set).
    ///
    /// Example: nightshift completions bash > /etc/bash_completion.d/nightshift
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// A simulated fleet, the engine and the web UI, with a fault script.
    ///
    /// Example: nightshift demo --nodes 8 --duration-secs 60
    Demo(DemoArgs),
    /// Replay recorded history (Prometheus or an OpenMetrics file) through
    /// the runbooks in virtual time, every action a dry run: when each would
    /// have fired, on what, what it would have done and what was refused.
    ///
    /// Example: nightshift backtest --all --prometheus http://prometheus:9090 --start 7d --end 0s --step 15s
    Backtest(BacktestArgs),
    /// Play a fleet's fault mix for weeks of virtual time under three
    /// policies on one schedule — nightshift (the real engine and your
    /// runbooks), manual (the seeds' 45 + 42 minutes) and oracle (the
    /// instant) — and report what each cost: ETTR, GPU-hours lost by cause,
    /// time to quarantine, pages, actions on healthy GPUs.
    ///
    /// Example: nightshift simulate --faults examples/faults/llama3-405b.yaml --nodes 256 --days 54 --seed 7 --json out.json
    Simulate(SimulateArgs),
    /// The benchmarks moved out of the production CLI: `nightshift-bench`.
    #[command(hide = true, disable_help_flag = true)]
    Bench {
        /// Whatever was passed: the harness takes the same flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `nightshift simulate … --json FILE` means `--out FILE`: the report is
/// a file (the global `--json`, a switch, prints JSON instead of the
/// summary). Only after `simulate`, and only when a value follows.
pub fn simulate_json_file(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(at) = args.iter().skip(1).position(|a| a == "simulate").map(|i| i + 1) else { return args };
    let mut out = args;
    let mut i = at + 1;
    while i < out.len() {
        let arg = out[i].to_string_lossy().into_owned();
        if arg == "--json" && out.get(i + 1).is_some_and(|v| !v.to_string_lossy().starts_with('-')) {
            out[i] = "--out".into();
            i += 1;
        } else if let Some(v) = arg.strip_prefix("--json=") {
            out[i] = format!("--out={v}").into();
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod simulate_json_tests {
    use super::simulate_json_file;

    fn rewrite(line: &str) -> String {
        let args = line.split(' ').map(std::ffi::OsString::from).collect();
        simulate_json_file(args).iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn json_with_a_file_after_simulate_writes_the_report_there() {
        for (given, want) in [
            ("nightshift simulate --nodes 16 --json out.json", "nightshift simulate --nodes 16 --out out.json"),
            ("nightshift simulate --json=out.json --days 7", "nightshift simulate --out=out.json --days 7"),
            // A switch: prints JSON.
            ("nightshift simulate --json --nodes 16", "nightshift simulate --json --nodes 16"),
            ("nightshift simulate --nodes 16 --json", "nightshift simulate --nodes 16 --json"),
            // Before the command it is the global switch.
            ("nightshift --json simulate --nodes 16", "nightshift --json simulate --nodes 16"),
            // Other commands are left alone.
            ("nightshift runs list --json x", "nightshift runs list --json x"),
        ] {
            assert_eq!(rewrite(given), want, "{given}");
        }
    }
}

/// `nightshift simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// The fault mix (docs/OUTCOME.md: the format).
    #[arg(long, value_name = "FILE")]
    pub faults: PathBuf,
    /// Nodes in the fleet.
    #[arg(long)]
    pub nodes: usize,
    /// Days of virtual time.
    #[arg(long)]
    pub days: f64,
    /// The schedule's seed (the same seed gives the same report, byte for byte).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run this many seeds (seed, seed+1, …) and report the mean and range.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub seeds: u64,
    /// GPUs in each node (1 to 8).
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// The sim profile of every node.
    #[arg(long, default_value = "h100-sxm")]
    pub profile: String,
    /// The runbook folder (default: the config's runbook_dir, else ./runbooks).
    #[arg(long)]
    pub runbooks: Option<PathBuf>,
    /// Share of the nodes kept as standbys, outside the job.
    #[arg(long, default_value_t = 2.0)]
    pub standby_pct: f64,
    /// The job checkpoints this often.
    #[arg(long, default_value_t = 1800)]
    pub checkpoint_secs: u64,
    /// A restart of the job takes this long.
    #[arg(long, default_value_t = 600)]
    pub restart_secs: u64,
    /// Restart the engine (an upgrade) this often, the first at half the
    /// period; 0: never. The report counts mitigations a restart weakened.
    #[arg(long, default_value_t = 7 * 86_400)]
    pub engine_restart_every_secs: u64,
    /// Take the pager down this often, the first at a third of the period;
    /// 0: never. The report counts pages it never took.
    #[arg(long, default_value_t = 2 * 86_400)]
    pub pager_outage_every_secs: u64,
    /// Each pager outage lasts this long.
    #[arg(long, default_value_t = 1800)]
    pub pager_outage_secs: u64,
    /// Write the report as JSON here (`--json` alone prints it instead of
    /// the summary, as for every command).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write the report as a web page here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum RunbooksCmd {
    /// List loaded runbooks.
    ///
    /// Example: nightshift runbooks list
    List,
    /// Show a runbook's manifest and script.
    ///
    /// Example: nightshift runbooks show gpu-overheat
    Show {
        /// The runbook's name.
        #[arg(add = ArgValueCompleter::new(crate::complete::runbooks))]
        name: String,
    },
    /// Let a runbook's automatic runs act (admin; needs --server). Audited
    /// with who and why.
    ///
    /// Example: nightshift runbooks promote gpu-temp-drift --reason "a week in shadow, 3 fires, all right"
    Promote {
        /// The runbook's name.
        #[arg(add = ArgValueCompleter::new(crate::complete::runbooks))]
        name: String,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
    },
    /// Put a runbook in shadow mode (admin; needs --server): its automatic
    /// runs send every action as a dry run, change nothing, notify no one,
    /// and record what they would have done.
    ///
    /// Example: nightshift runbooks demote pool-scale-in --reason "new fleet, watch it first"
    Demote {
        /// The runbook's name.
        #[arg(add = ArgValueCompleter::new(crate::complete::runbooks))]
        name: String,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
    },
    /// What a shadow runbook would have done: each fire, its target, the
    /// actions with the agents' answers, refusals, and what happened on the
    /// target afterwards.
    ///
    /// Example: nightshift runbooks shadow-report gpu-temp-drift --since 7d
    ShadowReport {
        /// The runbook's name.
        #[arg(add = ArgValueCompleter::new(crate::complete::runbooks))]
        name: String,
        /// 7d, 24h, or an RFC 3339 time.
        #[arg(long, default_value = "7d")]
        since: String,
    },
    /// Check manifests and scripts in a folder (file:line:column errors).
    ///
    /// Example: nightshift runbooks validate runbooks/
    Validate {
        /// A runbook folder or one manifest (default: the config's runbook_dir, else ./runbooks).
        path: Option<PathBuf>,
    },
    /// Run the scenarios in <dir>/scenarios in virtual time.
    ///
    /// Example: nightshift runbooks test gpu-overheat --dir runbooks
    Test {
        /// Only scenarios of this runbook (or whose name starts with this).
        name: Option<String>,
        /// The runbook folder (default: the config's runbook_dir, else ./runbooks).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print the fleet's state every SECS of virtual time (drains, holds,
        /// each GPU's temperature, power and limit).
        #[arg(long, value_name = "SECS")]
        trace: Option<u64>,
    },
}

/// Which runs a listing shows (`audit list`, `runs list`).
#[derive(clap::Args, Clone, Debug)]
pub struct RunListArgs {
    /// Only runs on this node.
    #[arg(long, add = ArgValueCompleter::new(crate::complete::nodes))]
    pub node: Option<String>,
    /// Only runs of this runbook.
    #[arg(long, add = ArgValueCompleter::new(crate::complete::runbooks))]
    pub runbook: Option<String>,
    /// Only runs that ended so: succeeded, needs_person, failed, refused, timed_out, cancelled, interrupted, skipped.
    #[arg(long)]
    pub outcome: Option<String>,
    /// 30m, 6h, 2d, or an RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many runs.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// With PostgreSQL: the runs of every shard of the database, each
    /// with its shard (needs --server).
    #[arg(long)]
    pub all_shards: bool,
    /// Only runs in this state: queued, pending_approval, running or
    /// finished.
    #[arg(long)]
    pub state: Option<String>,
    /// Only runs on the nodes that carry this label now (key=value, as in
    /// fleet.yaml).
    #[arg(long, value_name = "KEY=VALUE")]
    pub label: Option<String>,
}

#[derive(Subcommand)]
pub enum AuditCmd {
    /// Runs, newest first (the same as `nightshift runs list`).
    ///
    /// Example: nightshift audit list --node gpu-a1 --outcome failed --since 24h
    List(RunListArgs),
    /// One run: summary and every record.
    ///
    /// Example: nightshift audit show r000042
    Show {
        /// The run id (r000042-k3x9qa; `nightshift audit list`).
        #[arg(add = ArgValueCompleter::new(crate::complete::runs))]
        run: String,
    },
    /// Print records as they are written (Ctrl-C to stop).
    ///
    /// Example: nightshift audit follow --server http://127.0.0.1:8080
    Follow,
    /// Walk the hash chain; exit 1 if it is broken, naming the first record
    /// that cannot be read or does not check out (line, byte and record of
    /// the record log). On a stopped engine's data dir it opens nothing
    /// for writing: the record log and records.idx are only read, and sled
    /// is read from a copy in a temporary folder.
    ///
    /// Example: nightshift audit verify
    /// Example: nightshift audit verify --head 48213:9f2c…   # a head kept from `audit head`
    Verify {
        /// With PostgreSQL: every shard of the engine's database, each
        /// named with its result (needs --server).
        #[arg(long)]
        all_shards: bool,
        /// A head kept elsewhere (`nightshift audit head`), as SEQ:HASH:
        /// the chain must still hold that record with that hash.
        #[arg(long, value_name = "SEQ:HASH")]
        head: Option<String>,
        /// A copy of an RMA evidence bundle (its folder, `manifest.json`
        /// inside): every file must match the manifest, and the manifest
        /// the SHA-256 the chain recorded when nightshift collected it.
        #[arg(long, value_name = "DIR")]
        evidence: Option<std::path::PathBuf>,
    },
    /// Copy every record that still checks out (and the run summaries the
    /// chain vouches for, the others rebuilt) from a damaged store into a
    /// new one, with a `salvaged` record saying what was lost. Point
    /// `data_dir` at the new folder to start again. Local only; the engine
    /// must be stopped.
    ///
    /// Example: nightshift audit salvage --to /var/lib/nightshift/data.salvaged
    Salvage {
        /// An empty folder for the new store.
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// The newest record's sequence number and hash. Keep the line
    /// somewhere the engine cannot write (a ticket, a chat, another
    /// machine): a later `verify` must reach the same hash at that record,
    /// so a rewritten history shows. The engine can post it itself
    /// (notifications.audit_anchor_every_secs).
    ///
    /// Example: nightshift audit head --server http://nightshift:8080
    Head,
    /// Copy the local audit store (its record log, with the run summaries)
    /// into PostgreSQL, chain intact, then verify it there. Resumes where
    /// an earlier copy stopped; refuses a database holding another chain.
    /// The engine must be stopped. The connection string is read from a
    /// file or an environment variable, never from the command line.
    ///
    /// Example: nightshift audit migrate --to postgres --url-file /etc/nightshift/pg.url
    Migrate {
        /// The target backend: postgres.
        #[arg(long)]
        to: String,
        /// A file holding the connection string (`host=… user=… dbname=…`
        /// or `postgres://…`).
        #[arg(long, conflicts_with = "url_env")]
        url_file: Option<std::path::PathBuf>,
        /// An environment variable holding it. With neither, engine.yaml's
        /// `audit.postgres` (url_file/url_env, ca_file) is used.
        #[arg(long)]
        url_env: Option<String>,
        /// The CA certificate(s) that sign the server's (PEM), for
        /// `sslmode=require` (default: engine.yaml's `audit.postgres.ca_file`,
        /// else the Mozilla roots) — the same TLS connection as the engine's.
        #[arg(long)]
        ca_file: Option<std::path::PathBuf>,
        /// The shard the records belong to.
        #[arg(long, default_value = "default")]
        shard: String,
    },
    /// Every record, oldest first.
    ///
    /// Example: nightshift audit export --format jsonl > audit.jsonl
    Export {
        /// jsonl (one record a line) or json.
        #[arg(long, default_value = "jsonl")]
        format: String,
    },
}

#[derive(Subcommand)]
pub enum AgentsCmd {
    /// Every node: connection, drain state, readings.
    ///
    /// Example: nightshift agents list --state faulted --label pool=train
    List(NodeListArgs),
    /// Round trip to a node's agent.
    ///
    /// Example: nightshift agents ping gpu-a1
    Ping {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
    },
    /// Tell a simulated node a fault (admin, needs --server; agents with
    /// the sim backend only — real hardware refuses): a lab's way to see
    /// the whole path, from the fault to the drain and the page. Audited
    /// as a note under your name.
    ///
    /// Example: nightshift agents sim-fault gpu-node-01 ecc-dbe --gpu 3
    SimFault {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// ecc-dbe, xid (with --code), gpu-lost, gpu-reset, fan-failure,
        /// row-remap-failure, gpu-replace, …
        kind: String,
        /// The GPU.
        #[arg(long)]
        gpu: Option<u32>,
        /// How many errors (ecc-dbe; default 1).
        #[arg(long)]
        count: Option<u64>,
        /// The XID (xid).
        #[arg(long)]
        code: Option<u32>,
    },
    /// A node's GPUs and envelope.
    ///
    /// Example: nightshift agents inventory gpu-a1
    Inventory {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
    },
    /// What is held on a node: each setting's baseline, what is in effect,
    /// and every hold behind it (owner, value, lease).
    ///
    /// Example: nightshift agents holds gpu-a1
    Holds {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
    },
    /// A node's health: each GPU's state (healthy, faulted, quarantined,
    /// awaiting repair, verifying, RMA), its fault, what to do, and how long
    /// each phase of its repair took.
    ///
    /// Example: nightshift agents show gpu-a1
    Show {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
    },
    /// Run the agent's read-only health check now (GPUs visible, ECC,
    /// row remaps, PCIe, NVLink, recent fatal XIDs, `dcgmi diag` where
    /// installed); exits 1 when it fails.
    ///
    /// Example: nightshift agents health-check gpu-a1
    HealthCheck {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
    },
    /// The RMA evidence bundles collected on a node, from the audit chain:
    /// where each is on the node, its files (and what went wrong making
    /// one), and the SHA-256 a copy must match (`nightshift audit verify
    /// --evidence DIR`).
    ///
    /// With `--fetch DIR`: copy a bundle off the node (the newest, or
    /// `--bundle ID`) into DIR/ID through the engine, and check the copy
    /// against the record the chain holds.
    ///
    /// Example: nightshift agents evidence gpu-a1
    /// Example: nightshift agents evidence gpu-a1 --fetch ./rma
    Evidence {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// Copy the bundle into this folder (a subfolder named by the bundle).
        #[arg(long, value_name = "DIR")]
        fetch: Option<std::path::PathBuf>,
        /// Which bundle to copy (default: the newest collected).
        #[arg(long, value_name = "ID", requires = "fetch")]
        bundle: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum HoldsCmd {
    /// Every hold in effect across the fleet: node, setting, value, owner
    /// (a run, a person), lease.
    ///
    /// Example: nightshift holds list --label pool=train --server http://nightshift:8080
    List(NodeListArgs),
    /// Release holds on a node as yourself (`person:<you>`), audited: a
    /// run's, a kept one, a sticky repair or RMA drain, another person's.
    /// Every hold on the node only with --all (or, on a terminal, after
    /// you say yes to the list of what goes). A drain nightshift keeps on a
    /// GPU that is still broken (faulted, quarantined, awaiting repair,
    /// RMA) goes with `nightshift nodes repaired` (the health check ends
    /// it), or an admin's --force; an admin's hands-off refuses an
    /// operator's release.
    ///
    /// Example: nightshift holds release gpu-a1 --gpu 3 --reason "cap no longer needed" --server http://nightshift:8080
    Release {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// Only holds on this GPU.
        #[arg(long)]
        gpu: Option<u32>,
        /// Only this owner's holds (a run id, or person:NAME).
        #[arg(long, conflicts_with = "hold")]
        owner: Option<String>,
        /// Only this hold (its id, from `nightshift agents holds NODE`).
        #[arg(long)]
        hold: Option<String>,
        /// Only holds of this kind: power_limit, fan_curve, clocks,
        /// gpu_drain, node_drain, config, chassis_fans, mark.
        #[arg(long)]
        kind: Option<String>,
        /// Every hold on the node, without asking.
        #[arg(long, conflicts_with_all = ["gpu", "owner", "hold", "kind"])]
        all: bool,
        /// Admin: release a repair drain of a GPU still broken too (say why).
        #[arg(long)]
        force: bool,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
pub enum FleetCmd {
    /// Build fleet.yaml from Slurm's node list or an Ansible-style inventory,
    /// collecting each agent's host key over SSH (trust on first use: every
    /// key is printed for review, and nothing is written until you confirm).
    /// Nodes already in --out keep their labels; a host key that changed is
    /// refused unless --accept-changed.
    ///
    /// Example: scontrol --oneliner show nodes | nightshift fleet import --slurm - --out /etc/nightshift/fleet.yaml
    Import {
        /// `scontrol --oneliner show nodes` output (a file, or - for stdin):
        /// NodeName, NodeAddr, the first of Partitions as label `pool` (all
        /// of them as `partitions`), the GPUs of Gres as `gpu_model` and
        /// `gpu_count`.
        #[arg(long, value_name = "FILE", conflicts_with = "inventory", required_unless_present = "inventory")]
        slurm: Option<PathBuf>,
        /// Slurm's topology — topology.conf, or `scontrol show topology`
        /// output: each node's leaf switch as label `switch` (with --slurm).
        #[arg(long, value_name = "FILE", requires = "slurm")]
        topology: Option<PathBuf>,
        /// An INI inventory (Ansible's format): `[group]` sections, host lines
        /// `name [ansible_host=ADDR] [key=value …]`; the group is label
        /// `pool` unless the line sets one, `nightshift_standby=true` marks a spare.
        #[arg(long, value_name = "FILE")]
        inventory: Option<PathBuf>,
        /// The fleet.yaml to write (merged with it when it exists).
        #[arg(long, default_value = "fleet.yaml")]
        out: PathBuf,
        /// The agents' SSH port (fleet.yaml `defaults.port`).
        #[arg(long, default_value_t = 2222)]
        port: u16,
        /// A label for every imported node (repeatable): key=value.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Seconds to wait for each agent's host key.
        #[arg(long, default_value_t = 5)]
        timeout_secs: u64,
        /// Write without asking (after reviewing the keys another way).
        #[arg(long, short)]
        yes: bool,
        /// Write the nodes that answered and leave out the others (by
        /// default one unreachable agent writes nothing).
        #[arg(long)]
        skip_unreachable: bool,
        /// Accept host keys that differ from the ones in --out (a
        /// reinstalled node; otherwise a sign of a machine in the middle).
        #[arg(long)]
        accept_changed: bool,
    },
    /// Show or set the whole fleet's mode: `act` (each runbook in its own
    /// mode), `shadow` (every automatic run sends its actions as dry runs
    /// and records what it would have done) or `paused` (no automatic run
    /// starts; runs already going go on; a faulted GPU is told to a
    /// person). Manual runs are never held back. Setting needs an admin
    /// token and --server; audited with who and why (`fleet_mode`).
    ///
    /// Example: nightshift fleet mode shadow --reason "first week on this fleet" --server http://nightshift:8080
    Mode {
        /// The mode to set; without it, the mode now.
        #[arg(value_parser = ["act", "shadow", "paused"])]
        mode: Option<String>,
        /// Why (required to set): kept in the audit record.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum MaintenanceCmd {
    /// Windows in force or to come: what they match, until when, who set
    /// them and why, and the nodes each covers now.
    ///
    /// Example: nightshift maintenance list --server http://nightshift:8080
    List,
    /// Set a window (admin, needs --server): the nodes it matches — every
    /// --match and, when given, one of the --node names, as in a silence —
    /// are hands-off from --from (default now) until --until or for --for:
    /// nightshift starts no automatic run there, a run's change waits, and
    /// their open pages end as taken over. It always ends (30 days at
    /// most), audited; a node joining the pool meanwhile is covered too.
    ///
    /// Example: nightshift maintenance add --match pool=train --match rack=r12 --for 4h --reason "PDU firmware, CHG-1142"
    Add {
        /// A node label the window matches (KEY=VALUE; repeat: all must hold).
        #[arg(long = "match", value_name = "KEY=VALUE")]
        matchers: Vec<String>,
        /// A node it matches by name (repeat for more).
        #[arg(long = "node", add = ArgValueCompleter::new(crate::complete::nodes))]
        nodes: Vec<String>,
        /// When it starts: an RFC 3339 time, or a span from now (2h).
        #[arg(long)]
        from: Option<String>,
        /// How long from its start (30m, 4h, 2d).
        #[arg(long = "for", value_name = "SPAN", conflicts_with = "until", required_unless_present = "until")]
        for_span: Option<String>,
        /// When it ends: an RFC 3339 time.
        #[arg(long)]
        until: Option<String>,
        /// Why: kept in the audit record and shown on each node.
        #[arg(long)]
        reason: String,
    },
    /// End a window before its time (admin, needs --server), saying why.
    ///
    /// Example: nightshift maintenance end mw-k3x9qa-1 --reason "done early"
    End {
        /// The window's id (`nightshift maintenance list`).
        id: String,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
    },
}

/// Which nodes a listing shows (`agents list`, `holds list`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NodeListArgs {
    /// Only this node.
    #[arg(long, add = ArgValueCompleter::new(crate::complete::nodes))]
    pub node: Option<String>,
    /// Only nodes with this label value (key=value, e.g. pool=train).
    #[arg(long, value_name = "KEY=VALUE")]
    pub label: Option<String>,
    /// Only nodes in this state: in_service, drained, hands_off, faulted or
    /// disconnected.
    #[arg(long)]
    pub state: Option<String>,
}

#[derive(Subcommand)]
pub enum ApprovalsCmd {
    /// Runs waiting for approval, newest first (`runs list --state
    /// pending_approval`); approve one with `nightshift approve RUN`.
    ///
    /// Example: nightshift approvals list --node gpu-a1
    List(RunListArgs),
}

#[derive(Subcommand)]
pub enum RunsCmd {
    /// Runs, newest first (the same as `nightshift audit list`).
    ///
    /// Example: nightshift runs list --outcome failed --since 24h
    List(RunListArgs),
    /// Cancel a queued, pending or running run: a running one stops at
    /// its next step and gives back its holds.
    ///
    /// The audit records you as who cancelled it, with your reason.
    ///
    /// Example: nightshift runs cancel r000042-k3x9qa --reason "wrong node" --server http://nightshift:8080
    Cancel {
        /// The run id (r000042-k3x9qa; `nightshift audit list`).
        #[arg(add = ArgValueCompleter::new(crate::complete::runs))]
        run: String,
        /// Why: kept in the audit record beside your name.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum NodesCmd {
    /// Every node: connection, drain state, readings (the same as `agents
    /// list`, where kubectl users look).
    ///
    /// Example: nightshift nodes list --state drained --label pool=train
    List(NodeListArgs),
    /// Say a node (or one GPU) was repaired: its GPUs awaiting repair go to
    /// verifying, and the agent's health check decides whether they return
    /// to service (a failing one sends them back, saying why).
    ///
    /// Example: nightshift nodes repaired gpu-a1 --gpu 3 --note "reseated GPU 3"
    Repaired {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// One GPU (default: every GPU awaiting repair).
        #[arg(long)]
        gpu: Option<u32>,
        /// What was done; kept in the audit record.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Put a node back into service yourself (`person:<you>`), audited:
    /// every drain on it ends — nightshift's, a sticky repair or RMA drain,
    /// another person's. (`repaired` is the lifecycle's step instead: the
    /// health check decides.) Needs --server.
    ///
    /// Where the repair lifecycle holds a GPU of the node not healthy, it
    /// says which and asks first (without a terminal: refused, exit 3).
    ///
    /// Example: nightshift nodes resume gpu-a1 --reason "RMA replacement installed and tested"
    Resume {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// Why: kept in the audit record.
        #[arg(long)]
        reason: String,
        /// Put it back without asking, GPUs not healthy in the repair
        /// lifecycle too.
        #[arg(long)]
        yes: bool,
    },
    /// Drain a node yourself (`person:<you>`), audited: the scheduler
    /// places no new work there and running jobs finish. It is your drain:
    /// its reason in the scheduler names you, nightshift never ends it and
    /// its blast radius does not count it; `nodes resume` ends it. Needs
    /// --server.
    ///
    /// Example: nightshift nodes drain gpu-a1 --reason "firmware update, ticket OPS-4711"
    Drain {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// Why: kept in the audit record and written as the scheduler's
        /// drain reason.
        #[arg(long)]
        reason: String,
    },
    /// Set or clear hands-off in the engine (admin): nightshift changes
    /// nothing on the node while it is set — across restarts — until it is
    /// cleared or its --for runs out (then audited as ended). Needs --server.
    ///
    /// Example: nightshift nodes hands-off gpu-a1 --on --for 4h --reason "firmware update"
    HandsOff {
        /// The node, as fleet.yaml names it.
        #[arg(add = ArgValueCompleter::new(crate::complete::nodes))]
        node: String,
        /// Set it.
        #[arg(long, conflicts_with = "off", required_unless_present = "off")]
        on: bool,
        /// Clear it.
        #[arg(long)]
        off: bool,
        /// Why: kept in the audit record (needed with --on).
        #[arg(long, required_if_eq("on", "true"))]
        reason: Option<String>,
        /// With --on: it ends by itself after this long (30m, 4h, 2d; at
        /// most 30 days). Without it, a person ends it.
        #[arg(long = "for", value_name = "SPAN", requires = "on")]
        for_span: Option<String>,
    },
}

/// `nightshift demo`.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Simulated nodes (at least 7).
    #[arg(long, default_value_t = 8)]
    pub nodes: usize,
    /// How long the demo runs, in real seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Web UI address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Keep keys, inventory and the audit log here (default: a temporary dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 30.0)]
    pub time_scale: f64,
    /// The runbook folder (default: the repository's runbooks/).
    #[arg(long)]
    pub runbooks: Option<PathBuf>,
    /// After the script ends, keep the web UI up until Ctrl-C.
    #[arg(long)]
    pub keep_serving: bool,
}

/// `nightshift backtest`.
#[derive(clap::Args, Debug, Clone)]
pub struct BacktestArgs {
    /// Only this runbook (repeatable).
    #[arg(long, add = ArgValueCompleter::new(crate::complete::runbooks))]
    pub runbook: Vec<String>,
    /// Every runbook of the folder.
    #[arg(long, conflicts_with = "runbook")]
    pub all: bool,
    /// Pull the recording from this Prometheus (range queries).
    #[arg(long, conflicts_with = "from", requires_all = ["start", "end"])]
    pub prometheus: Option<String>,
    /// Start of the range: an RFC 3339 time or a span back from now (7d).
    #[arg(long)]
    pub start: Option<String>,
    /// End of the range, the same way (0s: now).
    #[arg(long)]
    pub end: Option<String>,
    /// Resolution of the range queries.
    #[arg(long, default_value = "15s")]
    pub step: String,
    /// Read the recording from an OpenMetrics file instead (timestamps in
    /// seconds, as `promtool tsdb create-blocks-from openmetrics` takes).
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// The runbook folder (default: the config's runbook_dir, else ./runbooks).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The envelope the replay nodes' agents enforce (default: the agent's
    /// built-in policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the report as a web page here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Stop with a clear message (instead of being killed by the kernel)
    /// when the replay's resident memory passes this: 800MiB, 2GiB.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Replay the telemetry windows and triggers in this many shards by
    /// node, one thread each (default: the machine's cores). The report is
    /// the same for any count.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: Option<u16>,
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

#[cfg(test)]
mod help_tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of every subcommand says what it is for (`--help`
    /// with an empty line beside an argument helps no one at 3 a.m.).
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "nightshift", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:#?}");
    }
}
