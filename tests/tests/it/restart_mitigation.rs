//! Invariant 18 across real processes: `nightshift serve` with a loopback
//! sim agent over real SSH, the shipped over-temperature runbook, and a
//! heatsink that stays clogged. Once the GPU is capped the engine is
//! stopped with SIGTERM and started again, then killed with SIGKILL and
//! started again; after each start the GPU's power limit, read from the
//! agent every 100 ms, stays capped for 10 minutes of the fault, and no run
//! ends failed or interrupted. Engine and agent run 20× faster than wall
//! time on one shared time origin (`time_origin_ms`, `sim_time_origin_ms`),
//! so a restarted engine goes on from the agent's time as a real one does.
//! The runbook's hold time is raised to an hour here, so the only thing that
//! could take the cap off in these 20 minutes is a restart.

use std::path::Path;
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_proto::ssh::client::AgentConnection;
use nightshift_proto::{NoArgs, Op, Request, SimFault, Telemetry};
use nightshift_tests::external::{Daemon, free_port, workspace_bin_dir};
use nightshift_tests::{TestAgent, engine_setup};

const SCALE: f64 = 20.0;
/// Virtual seconds the cap is watched after each restart.
const WATCH_SECS: f64 = 600.0;

fn start_engine(dir: &Path, port: u16, n: usize) -> Daemon {
    let argv = [
        workspace_bin_dir().join("nightshift").display().to_string(),
        "--config".into(),
        dir.join("engine.yaml").display().to_string(),
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ];
    Daemon::start_in(&argv, &dir.join(format!("engine-{n}.log")), dir)
}

async fn power_limit(conn: &AgentConnection, n: u64) -> Option<f64> {
    let r = conn.call(&Request::new(format!("probe-{n}"), Op::Telemetry(NoArgs {}))).await.ok()?;
    let t: Telemetry = serde_json::from_value(r.result?).ok()?;
    Some(t.gpus.first()?.power_limit_watts)
}

fn wait_exit(d: &mut Daemon, secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if d.child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the engine did not exit within {secs} s:\n{}", d.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_overheat_keeps_its_cap_through_sigterm_and_kill_9() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let origin = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let clock = format!("sim_time_scale: {SCALE}\nsim_time_origin_ms: {origin}\n");
    let agent = TestAgent::start(dir, "h1", SimConfig { gpus: 1, seed: 3, ..SimConfig::default() }, &clock).await;
    engine_setup(
        dir,
        &[&agent],
        &[],
        &format!("auth: {{allow_anonymous: admin}}\ntime_scale: {SCALE}\ntime_origin_ms: {origin}\n"),
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let manifest = std::fs::read_to_string(repo.join("gpu-overheat.yaml")).unwrap();
    let held = manifest.replace("hold_secs: { type: int, default: 300,", "hold_secs: { type: int, default: 3600,");
    assert_ne!(held, manifest, "the shipped manifest's hold_secs line moved: update this test");
    std::fs::write(dir.join("runbooks/gpu-overheat.yaml"), held).unwrap();
    std::fs::copy(repo.join("gpu-overheat.rhai"), dir.join("runbooks/gpu-overheat.rhai")).unwrap();

    let conn = AgentConnection::connect(&agent.client_config()).await.unwrap();
    let r = conn
        .call(&Request::new("clog", Op::SimFault(SimFault::HeatsinkDegradation { gpu: 0, factor: 1.6 })))
        .await
        .unwrap();
    assert!(r.ok, "{r:?}");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut engine = start_engine(dir, port, 0);

    // The ladder caps the GPU (about 5 virtual minutes: 15 s).
    let end = Instant::now() + Duration::from_secs(120);
    let mut probe = 0u64;
    loop {
        probe += 1;
        if power_limit(&conn, probe).await.is_some_and(|w| w < 700.0) {
            break;
        }
        assert!(Instant::now() < end, "never capped:\n{}", engine.log_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let the ladder settle into its hold before the first stop.
    tokio::time::sleep(Duration::from_secs_f64(300.0 / SCALE)).await;

    for (n, (how, signal)) in
        [("SIGTERM", nix::sys::signal::Signal::SIGTERM), ("kill -9", nix::sys::signal::Signal::SIGKILL)]
            .into_iter()
            .enumerate()
    {
        let pid = nix::unistd::Pid::from_raw(engine.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
        wait_exit(&mut engine, 30);
        engine = start_engine(dir, port, n + 1);
        let watch = Duration::from_secs_f64(WATCH_SECS / SCALE);
        let t0 = Instant::now();
        let (mut reads, mut highest) = (0usize, 0.0f64);
        while t0.elapsed() < watch {
            probe += 1;
            if let Some(w) = power_limit(&conn, probe).await {
                reads += 1;
                highest = highest.max(w);
                assert!(
                    w < 700.0,
                    "after {how}: the cap was off ({w} W) {:.0} virtual s after the restart\n{}",
                    t0.elapsed().as_secs_f64() * SCALE,
                    engine.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(reads > 100, "after {how}: only {reads} readings of the agent");
        eprintln!("after {how}: {reads} readings over {WATCH_SECS} virtual s, the limit at most {highest} W");
    }

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let page: serde_json::Value = http.get(format!("{base}/api/v1/runs")).send().await.unwrap().json().await.unwrap();
    let runs = page["runs"].as_array().cloned().unwrap_or_default();
    assert!(!runs.is_empty(), "{page}");
    for run in &runs {
        let outcome = run["outcome"].as_str().unwrap_or("in flight");
        assert!(
            !matches!(outcome, "failed" | "interrupted" | "skipped"),
            "run {} ended {outcome}: {}\n{}",
            run["id"],
            run["why"],
            engine.log_text()
        );
    }
    let first = runs.iter().map(|r| r["id"].as_str().unwrap().to_string()).min().unwrap();
    let detail: serde_json::Value =
        http.get(format!("{base}/api/v1/runs/{first}")).send().await.unwrap().json().await.unwrap();
    let records = detail["records"].as_array().cloned().unwrap_or_default();
    let resumed = records.iter().filter(|r| r["data"]["resumed"].is_u64()).count();
    // Resumed after each restart it was in flight for. Resumed with its cap
    // in force, the ladder keeps it rather than testing the cooling again:
    // it may end (succeeded, its holds kept) before the second restart,
    // and then its kept hold is what carries the cap through it (the
    // readings above).
    let ended_keeping = records
        .iter()
        .any(|r| r["kind"] == "run_finished" && r["data"]["holds_kept"].as_array().is_some_and(|h| !h.is_empty()));
    assert!(
        resumed == 2 || (resumed == 1 && ended_keeping),
        "the first run was resumed after each restart it was in flight for ({resumed}), ended keeping its holds: {ended_keeping}: {}",
        detail["records"]
    );
}
