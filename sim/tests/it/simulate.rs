//! The fleet-month's first slice (`nightshift simulate`): a small fleet —
//! 16 nodes × 8 GPUs for 7 virtual days, three fault classes (a GPU off the
//! bus, a double-bit ECC error, a hung collective) — through the real
//! engine and the shipped runbooks, beside the seeds' manual process and
//! the oracle on the same schedule. What is asserted is what nightshift
//! did, read from its own audit log and the scheduler's view: nothing
//! here models its decisions.

use std::path::{Path, PathBuf};

use nightshift_sim::simulate::mix::FaultMix;
use nightshift_sim::simulate::{SimulateOptions, simulate};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn opts(seed: u64) -> SimulateOptions {
    let mut o = SimulateOptions::new(16, 7.0, seed);
    o.runbooks = root().join("runbooks");
    // Two standbys: a job of 14 nodes that can restart around one fault.
    o.standby_pct = 12.5;
    o
}

fn mix_named(name: &str) -> FaultMix {
    FaultMix::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/faults/valid/{name}.yaml")))
        .unwrap()
}

fn mix() -> FaultMix {
    mix_named("three-classes")
}

async fn report(seed: u64) -> (String, Value) {
    let r = simulate(&opts(seed), &mix()).await.unwrap();
    let json = r.to_json();
    let v: Value = serde_json::from_str(&json).unwrap();
    (json, v)
}

fn n(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("expected a number, found {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_fleet_week_nightshift_quarantines_in_seconds_touches_no_healthy_gpu_and_pages_nobody() {
    let (_, r) = report(7).await;
    let by_class = &r["faults_by_class"];
    for class in ["gpu-lost", "hbm", "nccl-hang"] {
        assert!(n(&by_class[class]) >= 1.0, "seed 7 draws every class: {by_class}");
    }
    let ns = &r["policies"]["nightshift"];
    let manual = &r["policies"]["manual"];
    let oracle = &r["policies"]["oracle"];
    let ctx = serde_json::to_string_pretty(ns).unwrap();

    // Every hardware fault out of service within two minutes, none left to
    // people, none of the job's restarts onto a broken node.
    let ttq = &ns["time_to_quarantine_secs"];
    assert_eq!(n(&ttq["count"]), n(&by_class["gpu-lost"]) + n(&by_class["hbm"]), "{ctx}");
    assert!(n(&ttq["p99"]) <= 120.0, "time to quarantine p99: expected ≤ 120 s, found {}", ttq["p99"]);
    assert_eq!(ns["undetected"], 0, "{ctx}");
    assert_eq!(ns["restarts_onto_broken_nodes"], 0, "{ctx}");
    // The hung jobs are moved by nightshift, inside H11's grace period (a
    // notice at 10 minutes, the drain and requeue at 20), not by a person.
    let hung = &ns["hung_job_time_to_requeue_secs"];
    assert_eq!(n(&hung["count"]), n(&by_class["nccl-hang"]), "{ctx}");
    assert!(n(&hung["max"]) <= 1500.0, "hung job moved after {} s: {ctx}", hung["max"]);
    assert_eq!(ns["left_to_people"], 0, "{ctx}");

    // Nothing done to a healthy GPU, no RMA without a hardware fault.
    assert_eq!(ns["healthy_gpu_actions"], 0, "{ctx}");
    assert_eq!(ns["wrong_rma"], 0, "{ctx}");
    assert!(n(&ns["actions"]) >= n(&r["faults"]), "every fault acted on: {ctx}");

    // No page for a fault nightshift handled on its own: the drained GPUs
    // await their repair in the team's chat, a requeued job is done.
    assert_eq!(ns["pages"], 0, "{ctx}");
    // The manual process pages for every fault it sees.
    assert_eq!(n(&manual["pages"]), n(&r["faults"]), "{manual}");
    // A week of busy training jobs (framebuffer ~90 % used by the caching
    // allocator, a 9 % all-reduce share) with no workload fault: the
    // workload rows say nothing.
    for row in ["mem-fragmentation", "mem-headroom", "gpu-starved", "util-swing", "comm-overhead"] {
        assert_eq!(ns["told_by_runbook"].get(row), None, "{row} told people about a healthy job: {ctx}");
    }

    // Against the same schedule: better than the manual process, within a
    // quarter of the physical limit.
    let lost = n(&ns["gpu_hours_lost"]);
    assert!(lost < n(&manual["gpu_hours_lost"]), "nightshift lost {lost} GPU-h, manual {}", manual["gpu_hours_lost"]);
    assert!(
        lost <= 1.25 * n(&oracle["gpu_hours_lost"]) + 1.0,
        "nightshift lost {lost} GPU-h, the oracle {}",
        oracle["gpu_hours_lost"]
    );
    assert!(n(&ns["ettr"]) > n(&manual["ettr"]), "ETTR {} vs manual {}", ns["ettr"], manual["ettr"]);
    assert!(n(&oracle["ettr"]) >= n(&ns["ettr"]), "the oracle is the limit: {} vs {}", oracle["ettr"], ns["ettr"]);
    // The manual process sees each fault after 45 + 42 minutes.
    assert_eq!(manual["time_to_quarantine_secs"]["max"], 5220, "{manual}");
    assert_eq!(oracle["time_to_quarantine_secs"]["max"], 0, "{oracle}");
}

/// One page at most per fault that needs hands (per fault, not per GPU,
/// retry or restart), none for a fault nothing needs hands for.
fn pages_once_per_fault(mix: &FaultMix, r: &Value) {
    let ns = &r["policies"]["nightshift"];
    let ctx = serde_json::to_string_pretty(ns).unwrap();
    for class in &mix.classes {
        let faults = n(&r["faults_by_class"][&class.name]);
        let pages = ns["pages_by_class"].get(&class.name).map(n).unwrap_or(0.0);
        let needs_hands = class.repair != nightshift_sim::simulate::mix::Repair::None
            && class.signal != nightshift_sim::simulate::mix::Signal::PersonDrain;
        if needs_hands {
            assert!(pages <= faults, "{}: {pages} pages for {faults} faults: {ctx}", class.name);
        } else {
            assert_eq!(pages, 0.0, "{}: a page for a fault nothing needs hands for: {ctx}", class.name);
        }
    }
}

/// Every kind of incident meeting every other (the dense mix: a GPU off
/// the bus, HBM and GSP faults, a physical link fault, a degraded thermal
/// interface, hung collectives, software crashes nobody sees, people's
/// maintenance drains): one page at most per fault that needs hands, none
/// for what nightshift recovered on its own, every hardware fault out of
/// service or mitigated within two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_mix_pages_once_per_fault_that_needs_hands_and_never_for_what_recovered() {
    let mix = mix_named("dense");
    let r = simulate(&opts(7), &mix).await.unwrap();
    let r: Value = serde_json::from_str(&r.to_json()).unwrap();
    let ns = &r["policies"]["nightshift"];
    let ctx = serde_json::to_string_pretty(ns).unwrap();
    pages_once_per_fault(&mix, &r);
    assert_eq!(ns["pages_by_class"].get("no_fault"), None, "a page about no fault: {ctx}");
    assert!(n(&ns["time_to_quarantine_secs"]["p99"]) <= 120.0, "{ctx}");
    assert!(n(&ns["time_to_quarantine_secs"]["count"]) >= 15.0, "{ctx}");
    assert_eq!(ns["healthy_gpu_actions"], 0, "{ctx}");
    assert_eq!(ns["wrong_rma"], 0, "{ctx}");
    assert_eq!(ns["left_to_people"], 0, "{ctx}");
    assert!(n(&ns["ettr"]) > n(&r["policies"]["manual"]["ettr"]), "{ctx}");
}

/// Operations meet the faults (issue 56, point 9): the engine restarted
/// every 6 hours (28 upgrades in the week, several while a drain or a cap
/// is in force) and the pager down for 30 minutes twice a day. Measured on
/// the simulated hardware and at the pager's HTTP receiver: no mitigation
/// weaker for the 10 minutes after a restart while its fault persists, no
/// page lost, and quarantine as fast as without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_every_six_hours_weaken_no_mitigation_and_pager_outages_lose_no_page() {
    let mix = mix_named("dense");
    let mut o = opts(7);
    o.engine_restart_every_secs = 6 * 3600;
    o.pager_outage_every_secs = 12 * 3600;
    o.pager_outage_secs = 1800;
    let r = simulate(&o, &mix).await.unwrap();
    let r: Value = serde_json::from_str(&r.to_json()).unwrap();
    let ns = &r["policies"]["nightshift"];
    let ctx = serde_json::to_string_pretty(ns).unwrap();
    assert_eq!(ns["engine_restarts"], 28, "{ctx}");
    assert!(n(&ns["mitigations_in_force_at_restart"]) >= 3.0, "restarts while something is held: {ctx}");
    assert_eq!(ns["mitigations_weakened_by_restart"], 0, "{ctx}");
    assert_eq!(ns["pager_outages"], 14, "{ctx}");
    pages_once_per_fault(&mix, &r);
    assert!(n(&ns["pages"]) >= 1.0, "pages to lose: {ctx}");
    assert_eq!(ns["pages_lost"], 0, "{ctx}");
    assert!(n(&ns["time_to_quarantine_secs"]["p99"]) <= 120.0, "{ctx}");
    assert_eq!(ns["healthy_gpu_actions"], 0, "{ctx}");
    assert_eq!(ns["left_to_people"], 0, "{ctx}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_bytes_and_another_seed_another_fleet_week() {
    let (a, _) = report(11).await;
    let (b, _) = report(11).await;
    assert!(a == b, "seed 11 twice gave two reports:\n{a}\n---\n{b}");
    assert!(!a.contains("wall"), "no wall-clock field in the report");
    let (c, _) = report(12).await;
    assert_ne!(a, c, "seeds 11 and 12 gave the same report");
}

/// A mix whose counts would draw more faults than a run can play (GPU-days
/// near zero) is refused at once, before anything is drawn.
#[tokio::test]
async fn a_mix_that_would_draw_billions_of_faults_is_refused_at_once() {
    let text = "version: 1\nname: tiny\nsource: s\ngpu_days: 1e-9\nclasses:\n  - {name: hbm, count: 3, signal: ecc_dbe, effect: kill, repair: reset, repair_secs: 600}\n";
    let mix = FaultMix::parse(text, Path::new("tiny.yaml")).unwrap();
    let started = std::time::Instant::now();
    let e = simulate(&opts(1), &mix).await.unwrap_err().to_string();
    assert!(
        e.starts_with("the mix draws about 2.688e12 faults for 16 nodes × 8 GPUs × 7 days: expected at most 1000000"),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn impossible_runs_are_refused_before_they_start() {
    for (edit, want) in [
        ((|o: &mut SimulateOptions| o.nodes = 0) as fn(&mut SimulateOptions), "--nodes: expected 1 to 20000, found 0"),
        (|o| o.days = f64::NAN, "--days: expected more than 0 and at most 366, found NaN"),
        (|o| o.days = -1.0, "--days: expected more than 0 and at most 366, found -1"),
        (|o| o.gpus_per_node = 9, "--gpus-per-node: expected 1 to 8, found 9"),
        (|o| o.checkpoint_secs = 0, "--checkpoint-secs: expected 60 to 86400, found 0"),
        (|o| o.standby_pct = 80.0, "--standby-pct: expected 0 to 50, found 80"),
        (
            |o| o.engine_restart_every_secs = 60,
            "--engine-restart-every-secs: expected 0 (never) or at least 3600, found 60",
        ),
        (
            |o| o.pager_outage_secs = 3 * 86_400,
            "--pager-outage-secs: expected more than 0 and less than --pager-outage-every-secs (172800), found 259200",
        ),
    ] {
        let mut o = opts(1);
        edit(&mut o);
        let e = o.check(None).unwrap_err().to_string();
        assert_eq!(e, want);
    }
    // More nodes than the memory this machine has free.
    let mut o = opts(1);
    o.nodes = 4096;
    let e = o.check(Some(1 << 30)).unwrap_err().to_string();
    assert!(e.starts_with("--nodes 4096: the simulated fleet needs about 4096 MiB"), "{e}");
    assert!(e.ends_with("expected at most 1024 nodes here"), "{e}");
}
