//! `nightshift demo`: simulated agents on loopback (real SSH), the engine
//! and the web UI, and a fault script — an overheating GPU (H1), a pool at its
//! power limit (H4), a bad NVLink config (H5), fragmentation (H6), an ECC
//! error (H8) and an MI300X running hot (H2) — remediated live. Time runs
//! `--time-scale` times faster, so minutes of incident pass in seconds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use nightshift_engine::audit::data;

use nightshift_agent::backend::Backend;
use nightshift_agent::backend::sim::{SimBackend, SimConfig};
use nightshift_agent::config::AgentConfig;
use nightshift_agent::node::configs::ManagedConfig;
use nightshift_agent::runtime::{self, StartedAgent};
use nightshift_agent::service::Agent;
use nightshift_engine::api::RunSummary;
use nightshift_engine::audit::{AuditRecord, RecordKind, RunFilter};
use nightshift_proto::clock::{ScaledClock, SharedClock};
use nightshift_proto::{NoArgs, Op, Request, SimFault, Telemetry};
use nightshift_sim::workload::{PoolLoad, Workload};

use crate::Fail;
use crate::args::DemoArgs;
use crate::out::Out;

struct DemoNode {
    name: &'static str,
    profile: &'static str,
    labels: &'static [(&'static str, &'static str)],
    standby: bool,
}

const LAYOUT: &[DemoNode] = &[
    DemoNode {
        name: "a1",
        profile: "h100-sxm",
        labels: &[("pool", "a"), ("nvlink_domain", "a1"), ("rack", "r1")],
        standby: false,
    },
    DemoNode {
        name: "a2",
        profile: "h100-sxm",
        labels: &[("pool", "a"), ("nvlink_domain", "a2"), ("rack", "r1")],
        standby: false,
    },
    DemoNode {
        name: "a3",
        profile: "h100-sxm",
        labels: &[("pool", "a"), ("nvlink_domain", "a3"), ("rack", "r2")],
        standby: false,
    },
    DemoNode {
        name: "s1",
        profile: "h100-sxm",
        labels: &[("pool", "a"), ("nvlink_domain", "s1"), ("rack", "r2")],
        standby: true,
    },
    DemoNode {
        name: "ws1",
        profile: "rtx6000-ada",
        labels: &[("pool", "viz"), ("nvlink_domain", "ws1"), ("rack", "r3")],
        standby: false,
    },
    DemoNode {
        name: "g1",
        profile: "a100-sxm",
        labels: &[("pool", "b"), ("nvlink_domain", "g1"), ("rack", "r3")],
        standby: false,
    },
    DemoNode {
        name: "b1",
        profile: "h100-sxm",
        labels: &[("pool", "b"), ("nvlink_domain", "b1"), ("rack", "r4")],
        standby: false,
    },
    DemoNode {
        name: "mi1",
        profile: "mi300x",
        labels: &[("pool", "amd"), ("nvlink_domain", "mi1"), ("rack", "r4")],
        standby: false,
    },
];

const NCCL_GOOD: &str = "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5\nNCCL_SOCKET_IFNAME=eth0\n";
const NCCL_BAD: &str = "NCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5\nNCCL_SOCKET_IFNAME=eth0\nNCCL_P2P_DISABLE=1\n";

/// One scripted fault and what became of it.
struct Fault {
    row: &'static str,
    what: &'static str,
    node: &'static str,
    /// A group target (`pool=a`) instead of the node.
    group: Option<(&'static str, &'static str)>,
    injected_ms: Option<i64>,
}

enum Step {
    Fault(SimFault),
    Repair(SimFault),
    Pool(PoolLoad),
    BadConfig,
}

fn label_map(n: &DemoNode) -> BTreeMap<String, String> {
    n.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A running demo: the data folder, the clock, the agents, the engine and
/// its web server.
struct Stage {
    dir: PathBuf,
    /// Removes the folder when the demo ends (unless `--data-dir`).
    _tmp: Option<tempfile::TempDir>,
    clock: SharedClock,
    t0: i64,
    names: Vec<String>,
    started: Vec<StartedAgent>,
    agents: BTreeMap<String, Arc<Agent>>,
    engine: nightshift_engine::engine::Engine,
    web: tokio::task::JoinHandle<()>,
    url: String,
}

/// The tour, as named steps: check the arguments, start the agents, start
/// the engine and web UI, play the fault script, print the summary, stop.
pub async fn demo(args: &DemoArgs, out: &Out) -> Result<u8> {
    check_args(args)?;
    let stage = start(args).await?;
    print_banner(&stage, args, out);
    wait_connected(&stage).await;
    let log = spawn_live_log(&stage, out);
    let (faults, interrupted) = play_script(&stage, args, out).await;
    log.abort();
    let all_ok = summarize(&stage, &faults, args, out).await?;
    if args.keep_serving && !interrupted {
        outln!("keeping the web UI up: Ctrl-C to stop");
        let _ = tokio::signal::ctrl_c().await;
    }
    stop(stage).await;
    Ok(if all_ok { 0 } else { 1 })
}

fn usage(msg: String) -> anyhow::Error {
    anyhow::Error::new(Fail(2)).context(msg)
}

fn check_args(args: &DemoArgs) -> Result<()> {
    if args.nodes < 7 {
        return Err(usage(format!("--nodes: expected at least 7, found {}", args.nodes)));
    }
    if !(1.0..=200.0).contains(&args.time_scale) {
        return Err(usage(format!("--time-scale: expected 1 to 200, found {}", args.time_scale)));
    }
    Ok(())
}

/// The nodes of the demo fleet: the layout, then extra `b` nodes.
fn layout(nodes: usize) -> Vec<(String, &'static DemoNode)> {
    static EXTRA: DemoNode =
        DemoNode { name: "", profile: "h100-sxm", labels: &[("pool", "b"), ("rack", "r5")], standby: false };
    let mut layout: Vec<(String, &DemoNode)> = LAYOUT.iter().map(|n| (n.name.to_string(), n)).collect();
    for i in LAYOUT.len()..nodes {
        layout.push((format!("b{}", i - LAYOUT.len() + 2), &EXTRA));
    }
    layout.truncate(nodes);
    layout
}

/// Data folder, engine key, the agents behind real SSH servers, the
/// inventory, the engine and its web server.
async fn start(args: &DemoArgs) -> Result<Stage> {
    let (dir, tmp) = match &args.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (d.clone(), None)
        }
        None => {
            let tmp = tempfile::Builder::new().prefix("nightshift-demo").tempdir()?;
            (tmp.path().to_path_buf(), Some(tmp))
        }
    };
    let runbook_dir =
        args.runbooks.clone().unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../runbooks")));
    if !runbook_dir.join("gpu-overheat.yaml").exists() {
        return Err(usage(format!("no runbooks in {}: pass --runbooks DIR", runbook_dir.display())));
    }
    let clock: SharedClock = Arc::new(ScaledClock::new(args.time_scale));
    let t0 = clock.now_ms();

    // The engine key; agents trust its public half.
    let key_path = dir.join("engine_key");
    let (key, _) = nightshift_proto::ssh::keys::load_or_create(&key_path, "nightshift-demo-engine")?;
    std::fs::write(dir.join("authorized_keys"), format!("{}\n", key.public_key().to_openssh()?))?;

    // The agents: sim backends behind real SSH servers on loopback.
    let layout = layout(args.nodes);
    let mut started = Vec::new();
    let mut agents: BTreeMap<String, Arc<Agent>> = BTreeMap::new();
    let mut fleet = String::from("# written by nightshift demo\nversion: 1\nnodes:\n");
    for (i, (name, spec)) in layout.iter().enumerate() {
        let state = dir.join("agents").join(name);
        std::fs::create_dir_all(&state)?;
        let nccl = state.join("nccl.env");
        std::fs::write(&nccl, NCCL_GOOD)?;
        let cfg = AgentConfig {
            sim_time_scale: args.time_scale,
            configs: [("nccl-env".to_string(), ManagedConfig::file(nccl))].into(),
            ..AgentConfig::sim_node(
                name,
                &state,
                &dir.join("authorized_keys"),
                SimConfig { profile: spec.profile.into(), gpus: 4, seed: 100 + i as u64, ..SimConfig::default() },
            )
        };
        let sim = Arc::new(SimBackend::new(cfg.sim.clone())?);
        let backend: Arc<dyn Backend> = sim;
        let s = runtime::start_with(&cfg, backend, clock.clone())
            .await
            .with_context(|| format!("starting agent {name}"))?;
        if spec.standby {
            s.agent
                .handle(Request::new(
                    "demo-standby",
                    Op::SimFault(SimFault::PersonDrain { reason: "nightshift: demo standby (spare capacity)".into() }),
                ))
                .await;
        }
        let labels: Vec<String> = label_map(spec).iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let labels = if spec.name.is_empty() {
            format!("{{pool: b, rack: r5, nvlink_domain: {name}}}")
        } else {
            format!("{{{}}}", labels.join(", "))
        };
        fleet.push_str(&format!(
            "  - name: {name}\n    address: {}\n    host_key: {}\n    labels: {labels}\n    standby: {}\n",
            s.server.local_addr, s.host_key_fingerprint, spec.standby
        ));
        agents.insert(name.clone(), s.agent.clone());
        started.push(s);
    }
    std::fs::write(dir.join("fleet.yaml"), &fleet)?;

    // The engine and the web UI.
    let engine_yaml = format!(
        "# written by nightshift demo\nversion: 1\nlisten_addr: {listen}\ndata_dir: {data}\nrunbook_dir: {rb}\ninventory_path: fleet.yaml\nengine_key_path: engine_key\ntime_scale: {scale}\nauth:\n  allow_anonymous: operator\n",
        listen = args.listen,
        data = dir.join("engine").display(),
        rb = runbook_dir.display(),
        scale = args.time_scale,
    );
    let engine_cfg_path = dir.join("engine.yaml");
    std::fs::write(&engine_cfg_path, engine_yaml)?;
    let config = nightshift_engine::config::EngineConfig::load(&engine_cfg_path).map_err(|e| usage(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| usage(format!("cannot listen on {}: {e} (pass --listen HOST:PORT)", args.listen)))?;
    let url = format!("http://{}", listener.local_addr()?);
    let engine =
        nightshift_engine::serve::start_with_clock(config, clock.clone()).await.map_err(|e| usage(e.to_string()))?;
    let web_engine = engine.clone();
    let mut stop_web = engine.shutdown_signal();
    let web = tokio::spawn(async move {
        let _ = nightshift_web::serve(web_engine, listener, async move {
            let _ = stop_web.wait_for(|v| *v).await;
        })
        .await;
    });
    let names = layout.iter().map(|(n, _)| n.clone()).collect();
    Ok(Stage { dir, _tmp: tmp, clock, t0, names, started, agents, engine, web, url })
}

fn print_banner(st: &Stage, args: &DemoArgs, out: &Out) {
    outln!("{}", out.bold("nightshift demo"));
    outln!("  web UI     {}", st.url);
    outln!(
        "  fleet      {} simulated nodes (real SSH on loopback), {} runbooks",
        st.names.len(),
        st.engine.runbook_set().runbooks.len()
    );
    outln!(
        "  time       {}× faster: {} s of demo = {} min of incident; [mm:ss] below is simulated time",
        args.time_scale,
        args.duration_secs,
        (args.duration_secs as f64 * args.time_scale / 60.0).round()
    );
    outln!("  data       {}", st.dir.display());
    outln!();
}

/// Wait (up to 20 s) until every agent is connected.
async fn wait_connected(st: &Stage) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while st.engine.gauges().agents_connected < st.names.len() && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Print the records worth a line as they are written.
fn spawn_live_log(st: &Stage, out: &Out) -> tokio::task::JoinHandle<()> {
    let mut rx = st.engine.audit().subscribe();
    let out = *out;
    let t0 = st.t0;
    tokio::spawn(async move {
        while let Ok(r) = rx.recv().await {
            if let Some(line) = live_line(&out, &r, t0) {
                outln!("{line}");
            }
        }
    })
}

/// The faults of the script, and when each step happens (simulated
/// seconds after the start).
/// When (simulated seconds), which fault of the script, on which node, what.
type Timed = (u64, usize, &'static str, Step);

fn script(agents: &BTreeMap<String, Arc<Agent>>) -> (Vec<Fault>, Vec<Timed>) {
    let mut faults = vec![
        Fault {
            row: "H1",
            what: "clogged heatsink on an RTX 6000 (GPU 0)",
            node: "ws1",
            group: None,
            injected_ms: None,
        },
        Fault {
            row: "H4",
            what: "pool a runs at its power limit",
            node: "",
            group: Some(("pool", "a")),
            injected_ms: None,
        },
        Fault {
            row: "H5",
            what: "a person applies an NCCL config that disables P2P",
            node: "a2",
            group: None,
            injected_ms: None,
        },
        Fault { row: "H6", what: "A100 GPU 1 memory 28% fragmented", node: "g1", group: None, injected_ms: None },
        Fault { row: "H8", what: "double-bit ECC error on GPU 2", node: "b1", group: None, injected_ms: None },
        Fault { row: "H2", what: "clogged heatsink on an MI300X (GPU 0)", node: "mi1", group: None, injected_ms: None },
    ];
    faults.retain(|f| f.group.is_some() || agents.contains_key(f.node));
    let mut steps: Vec<Timed> = vec![
        (20, 0, "ws1", Step::Fault(SimFault::HeatsinkDegradation { gpu: 0, factor: 2.0 })),
        (40, 1, "", Step::Pool(PoolLoad { label: "pool".into(), value: "a".into(), total_util_pct: 300.0 })),
        (60, 2, "a2", Step::BadConfig),
        (80, 3, "g1", Step::Fault(SimFault::Fragmentation { gpu: 1, pct: 28.0 })),
        (100, 4, "b1", Step::Fault(SimFault::EccDbe { gpu: 2, count: 1 })),
        (120, 5, "mi1", Step::Fault(SimFault::HeatsinkDegradation { gpu: 0, factor: 1.8 })),
        (560, 0, "ws1", Step::Repair(SimFault::HeatsinkDegradation { gpu: 0, factor: 1.0 })),
        (620, 5, "mi1", Step::Repair(SimFault::HeatsinkDegradation { gpu: 0, factor: 1.0 })),
    ];
    steps.retain(|(_, _, node, _)| node.is_empty() || agents.contains_key(*node));
    (faults, steps)
}

/// Play the fault script until `--duration-secs` (or Ctrl-C); returns the
/// faults with their injection times, and whether Ctrl-C ended it.
async fn play_script(st: &Stage, args: &DemoArgs, out: &Out) -> (Vec<Fault>, bool) {
    let (mut faults, mut steps) = script(&st.agents);
    let (clock, t0, agents) = (&st.clock, st.t0, &st.agents);
    let mut workload = Workload::new(st.names.iter().map(|n| (n.clone(), 85.0)).collect());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.duration_secs);
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    let mut interrupted = false;
    loop {
        let elapsed = ((clock.now_ms() - t0) / 1000) as u64;
        while let Some(pos) = steps.iter().position(|(at, ..)| *at <= elapsed) {
            let (_, fi, node, step) = steps.remove(pos);
            let injected = clock.now_ms();
            match step {
                Step::Fault(f) | Step::Repair(f) => {
                    let repair = matches!(f, SimFault::HeatsinkDegradation { factor, .. } if factor == 1.0);
                    agents[node].handle(Request::new(format!("demo-fault-{injected}"), Op::SimFault(f))).await;
                    if repair {
                        outln!(
                            "{} {}",
                            stamp(out, injected, t0),
                            out.dim(&format!("repaired: {node} cooling cleaned"))
                        );
                        continue;
                    }
                }
                Step::Pool(p) => workload.set_pool(p),
                Step::BadConfig => {
                    // A person edits the managed file by hand (not through
                    // nightshift; the agent adopts it as a new version)…
                    let agent = &agents[node];
                    match agent.options().configs.get("nccl-env") {
                        Some(m) => match std::fs::write(&m.path, NCCL_BAD) {
                            Ok(()) => {
                                // …and relaunches the job, which reads it.
                                agent.backend().on_config_applied("nccl-env", NCCL_BAD);
                                agent.backend().on_consumer_restarted("nccl-env");
                            }
                            Err(e) => outln!("cannot write {}: {e}", m.path.display()),
                        },
                        None => outln!("{node} manages no nccl-env config"),
                    }
                }
            }
            if let Some(f) = faults.get_mut(fi)
                && f.injected_ms.is_none()
            {
                f.injected_ms = Some(injected);
                outln!("{} {} {}", stamp(out, injected, t0), out.yellow(&format!("FAULT {}", f.row)), f.what);
            }
        }
        workload.apply(&st.engine, agents).await;
        let tick = Duration::from_millis(((1000.0 / args.time_scale) as u64).clamp(10, 200));
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = &mut ctrl_c => { interrupted = true; break; }
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    (faults, interrupted)
}

/// The summary table and the audit check; whether every fault was
/// remediated and the chain verifies.
/// What is still in effect on the fleet: every GPU at its baseline limit,
/// or the holds that keep it from it, each with the run that placed it and
/// whether the run kept it on purpose. Returns false when a hold is in
/// effect that no run meant to keep.
async fn holds_at_the_end(st: &Stage, runs: &[RunSummary], out: &Out) -> bool {
    let mut rows = Vec::new();
    let mut capped = Vec::new();
    let mut all_intended = true;
    for (name, agent) in &st.agents {
        let r = agent.handle(Request::new("demo-summary", Op::Telemetry(NoArgs {}))).await;
        let Some(t) = r.result.and_then(|v| serde_json::from_value::<Telemetry>(v).ok()) else { continue };
        let inv = agent.inventory();
        for (g, info) in t.gpus.iter().zip(&inv.gpus) {
            if g.power_limit_watts < info.power_default_watts {
                capped.push(format!(
                    "{name}/gpu{} at {:.0} of {:.0} W",
                    g.index, g.power_limit_watts, info.power_default_watts
                ));
            }
        }
        for h in &t.node_metrics.holds {
            let run = runs.iter().find(|r| r.id == h.owner);
            let intended = h.sticky() || h.kept || run.is_none_or(|r| r.outcome.is_none());
            all_intended &= intended;
            let why = match (run, h.sticky(), h.kept) {
                (_, true, _) => "sticky: a person releases it".to_string(),
                (Some(r), _, true) => format!("kept on purpose by {} ({})", r.runbook, r.id),
                (Some(r), _, false) if r.outcome.is_none() => format!("{} ({}) is still running", r.runbook, r.id),
                (Some(r), _, false) => format!("left by {} ({}) without meaning to", r.runbook, r.id),
                (None, _, _) => format!("placed by {}", h.owner),
            };
            let until = h
                .expires_at_ms
                .map(|t| format!("{:.0} s more", (t - st.clock.now_ms()) as f64 / 1000.0))
                .unwrap_or_else(|| "—".into());
            rows.push(vec![
                name.clone(),
                h.setting.to_string(),
                h.value.to_string(),
                until,
                if intended { why } else { out.red(&why) },
            ]);
        }
    }
    outln!();
    if rows.is_empty() {
        if capped.is_empty() {
            outln!("holds      {} none in effect: every GPU is at its baseline power limit", out.green("ok:"));
            return true;
        }
        outln!("holds      {} none in effect, yet below the default limit: {}", out.red("check:"), capped.join(", "));
        return false;
    }
    outln!("{}", out.bold("Holds still in effect"));
    out.table(&["NODE", "SETTING", "VALUE", "LEASE", "WHY"], &rows);
    if capped.is_empty() {
        outln!("power      every GPU is at its default power limit");
    } else {
        outln!("power      below the default limit (held above): {}", capped.join(", "));
    }
    all_intended
}

async fn summarize(st: &Stage, faults: &[Fault], args: &DemoArgs, out: &Out) -> Result<bool> {
    let engine = &st.engine;
    let runs = engine.runs(&RunFilter { limit: Some(1000), ..Default::default() })?.runs;
    let records = engine.audit().tail(0, usize::MAX)?;
    outln!();
    outln!("{}", out.bold("Summary"));
    let mut rows = Vec::new();
    let mut all_ok = true;
    for f in faults {
        let Some(at) = f.injected_ms else {
            rows.push(vec![
                f.row.into(),
                f.what.into(),
                "—".into(),
                "0".into(),
                "—".into(),
                out.yellow("not injected (demo ended first)"),
            ]);
            all_ok = false;
            continue;
        };
        let mine: Vec<_> = runs
            .iter()
            .filter(|r| r.created_ms >= at)
            .filter(|r| match f.group {
                Some((k, v)) => r.target.group.as_ref() == Some(&(k.to_string(), v.to_string())),
                None => r.target.node.as_deref() == Some(f.node),
            })
            .collect();
        let ids: Vec<&str> = mine.iter().map(|r| r.id.as_str()).collect();
        let first_action = records
            .iter()
            .filter(|r| {
                r.kind == RecordKind::ActionResult
                    && r.run.as_deref().is_some_and(|id| ids.contains(&id))
                    && r.payload::<data::ActionResult>().is_ok_and(|a| a.applied)
            })
            .map(|r| r.ts_ms)
            .min();
        let actions: u32 = mine.iter().map(|r| r.actions).sum();
        let book: Vec<String> =
            mine.iter().map(|r| r.runbook.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let left: Vec<&String> = mine.iter().flat_map(|r| r.holds_left.iter()).collect();
        let outcome = if mine.is_empty() {
            "no run".to_string()
        } else if mine.iter().any(|r| r.outcome.is_none()) {
            "still running".into()
        } else if !left.is_empty() {
            format!("holds left by mistake: {}", left.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; "))
        } else if mine.iter().all(|r| r.outcome == Some(nightshift_engine::api::RunOutcome::Succeeded)) {
            "remediated".into()
        } else if mine.iter().all(|r| r.outcome.is_some_and(|o| o.did_its_work())) {
            // Its part done, a person's to come (a reset, an RMA): said so.
            "remediated, needs a person".into()
        } else {
            mine.iter().map(|r| r.outcome.map(|o| o.as_str()).unwrap_or("?")).collect::<Vec<_>>().join(",")
        };
        if !outcome.starts_with("remediated") {
            all_ok = false;
        }
        rows.push(vec![
            f.row.into(),
            f.what.into(),
            book.join(", "),
            actions.to_string(),
            first_action.map(|t| format!("{:.0} s", (t - at) as f64 / 1000.0)).unwrap_or_else(|| "—".into()),
            if outcome == "remediated" {
                out.green(&outcome)
            } else if outcome.starts_with("remediated") {
                out.yellow(&outcome)
            } else {
                out.red(&outcome)
            },
        ]);
    }
    out.table(&["ROW", "FAULT", "RUNBOOK", "ACTIONS", "FIRST ACTION", "OUTCOME"], &rows);
    outln!("{}", out.dim("(times are simulated seconds from the fault to the first applied action)"));
    all_ok &= holds_at_the_end(st, &runs, out).await;
    let v = engine.verify()?;
    if v.ok {
        outln!("audit      {} chain verified up to record {}", out.green("ok:"), v.verified_up_to);
    } else {
        outln!("audit      {} breaks at record {:?}: {:?}", out.red("broken:"), v.first_bad_seq, v.problem);
        all_ok = false;
    }
    outln!("web UI     was at {}", st.url);
    outln!(
        "data       {}{}",
        st.dir.display(),
        if args.data_dir.is_none() { " (temporary: removed on exit)" } else { "" }
    );
    Ok(all_ok)
}

/// Stop the engine, the web server and every agent.
async fn stop(st: Stage) {
    st.engine.shutdown().await;
    let _ = st.web.await;
    for s in st.started {
        s.shutdown().await;
    }
}

fn stamp(out: &Out, ms: i64, t0: i64) -> String {
    let s = (ms - t0).max(0) / 1000;
    out.dim(&format!("[{:02}:{:02}]", s / 60, s % 60))
}

/// The records worth a line in the live log.
fn live_line(out: &Out, r: &AuditRecord, t0: i64) -> Option<String> {
    let run = r.run.clone().unwrap_or_default();
    let text = match r.kind {
        RecordKind::RunQueued => format!(
            "{} {} {} — {}",
            out.blue("run"),
            run,
            r.runbook.clone().unwrap_or_default(),
            r.payload::<data::RunQueued>().unwrap_or_default().detail
        ),
        RecordKind::ActionResult => {
            let a: data::ActionResult = r.payload().ok()?;
            if !a.applied && a.ok {
                return None;
            }
            format!(
                "  {} {} {}{} {}",
                run,
                a.op,
                r.node.clone().unwrap_or_default(),
                r.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default(),
                if a.ok { out.green("applied") } else { out.red(a.error.as_deref().unwrap_or("refused")) }
            )
        }
        RecordKind::Notification | RecordKind::Escalation => {
            let text = r.payload::<data::Notice>().unwrap_or_default().text;
            let tag = if r.kind == RecordKind::Notification { out.yellow("notify") } else { out.red("escalate") };
            format!("  {tag} {text}")
        }
        RecordKind::BreakerTripped => {
            format!("  {} {}", out.red("breaker"), r.payload::<data::BreakerTripped>().unwrap_or_default().reason)
        }
        RecordKind::RunFinished => {
            let outcome = r.payload::<data::RunFinished>().unwrap_or_default().outcome;
            format!("{} {} {}", out.blue("end"), run, out.status(if outcome.is_empty() { "?" } else { &outcome }))
        }
        _ => return None,
    };
    Some(format!("{} {text}", stamp(out, r.ts_ms, t0)))
}
