//! Issue 29: a backtest replayed in shards (the engine's telemetry windows
//! and triggers split by node, one thread each per step), and with its
//! fast path (replay agents left unticked while no run is in flight), gives
//! the report a one-shard replay ticking every agent gives — the same fires in the same order with the
//! same run ids, refusals, drains and overlaps — on a recording where much
//! fires at once on nodes of different shards: GPUs overheating in the
//! same step, double-bit ECC errors draining nodes until breakers trip.

use std::collections::BTreeMap;
use std::sync::Arc;

use nightshift_engine::embed::PromSample;
use nightshift_sim::backtest::{BacktestOptions, BacktestReport, run_steps};

const NODES: usize = 200;
const GPUS: u32 = 8;
const STEP_S: i64 = 15;
const STEPS: usize = 80;

fn sample(name: &str, host: &str, gpu: u32, value: f64) -> PromSample {
    PromSample {
        name: name.into(),
        labels: [("gpu".to_string(), gpu.to_string()), ("Hostname".to_string(), host.to_string())].into(),
        value,
        ts_ms: None,
    }
}

/// 200 nodes × 8 GPUs × 3 fields: 4,800 samples a step (5,000 with each
/// temperature's headroom), past the size the engine ingests in parallel.
fn steps() -> impl Iterator<Item = (i64, Vec<PromSample>)> {
    let start_ms = 1_790_000_000_000i64;
    (0..STEPS).map(move |i| {
        let t = i as i64 * STEP_S;
        let mut step = Vec::with_capacity(NODES * GPUS as usize * 3);
        for n in 0..NODES {
            let host = format!("bt{n:03}");
            for g in 0..GPUS {
                // Every 7th node's GPU 2 heats past its slowdown margin at
                // 5 minutes, all in the same step; every 13th node climbs
                // slowly (the short-window trend).
                let temp = match (n % 7, n % 13, g) {
                    (0, _, 2) if t >= 300 => 88.0,
                    (_, 0, 5) => 70.0 + t as f64 / 60.0,
                    _ => 60.0 + ((n as u32 + g) % 4) as f64 * 0.5,
                };
                step.push(sample("DCGM_FI_DEV_GPU_TEMP", &host, g, temp));
                step.push(sample("DCGM_FI_DEV_POWER_USAGE", &host, g, 600.0 + (n % 3) as f64));
                // Twelve nodes take a double-bit error on GPU 1, eight of
                // them in the same step: more drains than the blast radius.
                let dbe = match n {
                    n if n % 17 == 0 && n < 136 && t >= 450 => 1.0,
                    n if n % 17 == 0 && t >= 600 => 1.0,
                    _ => 0.0,
                };
                step.push(sample("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &host, g, if g == 1 { dbe } else { 0.0 }));
            }
        }
        (start_ms + t * 1000, step)
    })
}

async fn replay(shards: usize, idle_agents_untouched: bool) -> BacktestReport {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let script = Arc::new(nightshift_engine::embed::build_engine(&Default::default()));
    let set = nightshift_engine::embed::load_dir(&dir, &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let hosts: BTreeMap<String, (u32, String)> =
        (0..NODES).map(|n| (format!("bt{n:03}"), (GPUS, "h100-sxm".to_string()))).collect();
    let scratch = tempfile::tempdir().unwrap();
    let opts = BacktestOptions {
        runbooks: set,
        script,
        policy: None,
        limits: Default::default(),
        shards,
        idle_agents_untouched,
    };
    run_steps(hosts, STEPS, steps(), opts, scratch.path(), &mut |_, _| Ok(())).await.expect("the replay")
}

fn comparable(r: &BacktestReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    v["wall_secs"] = serde_json::Value::Null;
    v["profile"] = serde_json::Value::Null;
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_and_one_shard_replays_give_identical_reports() {
    // The reference: one shard, every replay agent ticked at every step.
    let one = replay(1, false).await;
    // What the recording is for: much fires, on nodes of every shard, and
    // the blast radius refuses some of it.
    let runbooks: std::collections::BTreeSet<&str> = one.fires.iter().map(|f| f.runbook.as_str()).collect();
    assert!(
        runbooks.contains("gpu-overheat") && runbooks.contains("ecc-dbe-drain"),
        "the recording fires overheat and ECC drains: {runbooks:?}"
    );
    assert!(one.fires.len() >= 40, "{} fires", one.fires.len());
    // The fleet-wide limits couple the nodes: the ECC drains trip breakers.
    assert!(one.breaker_trips + one.blast_radius_refusals > 0, "the fleet-wide limits bite: {}", one.totals());
    let nodes: std::collections::BTreeSet<u32> = one
        .fires
        .iter()
        .filter_map(|f| f.fire.target.trim_start_matches("bt").get(..3).and_then(|n| n.parse().ok()))
        .collect();
    for shards in [2u32, 3] {
        assert!(
            (0..shards).all(|k| nodes.iter().any(|n| n % shards == k)),
            "fires on nodes of every one of {shards} shards: {nodes:?}"
        );
    }
    let want = comparable(&one);
    // Then the fast path alone (agents left unticked on steps with no run
    // in flight), and with it 2 and 3 shards.
    for (shards, fast) in [(1, true), (2, true), (3, true)] {
        let got = comparable(&replay(shards, fast).await);
        if got != want {
            let (a, b) = (serde_json::to_string_pretty(&want).unwrap(), serde_json::to_string_pretty(&got).unwrap());
            let diff = a
                .lines()
                .zip(b.lines())
                .enumerate()
                .find(|(_, (x, y))| x != y)
                .map(|(n, (x, y))| format!("line {n}: reference {x:?}, {shards} shard(s) {y:?}"))
                .unwrap_or_else(|| "lengths differ".into());
            panic!("{shards} shard(s), idle agents untouched: {fast}, gave another report — {diff}");
        }
    }
}
