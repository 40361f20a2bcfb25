//! The job textfile path, end to end: a real `python3` process runs the
//! PyTorch helper (`examples/pytorch/nightshift_textfile.py`, its torch
//! calls replaced by the helper's simulation) and writes its readings into
//! the agent's `job_metrics_dir`; the agent reads them over the backend's;
//! the engine, over SSH, runs the shipped H6, H11 and H12 runbooks on them —
//! a cache flush for the fragmented GPU, a drain for the stalled job, a
//! note to the owner about the communication share. The runbooks are the
//! shipped scripts; only their trigger windows and waits are shortened to
//! seconds so the test runs in real time.

use std::path::Path;
use std::process::{Command, Stdio};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::RecordKind;
use nightshift_tests::{TestAgent, engine_setup, eventually};

/// Copy a shipped runbook into `dir`, with `edits` (from → to) applied to
/// its manifest.
fn ship(dir: &Path, name: &str, edits: &[(&str, &str)]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut manifest = std::fs::read_to_string(src.join(format!("{name}.yaml"))).unwrap();
    for (from, to) in edits {
        assert!(manifest.contains(from), "{name}.yaml has no {from:?}");
        manifest = manifest.replace(from, to);
    }
    std::fs::write(dir.join(format!("{name}.yaml")), manifest).unwrap();
    std::fs::copy(src.join(format!("{name}.rhai")), dir.join(format!("{name}.rhai"))).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_training_job_drives_h6_h11_and_h12_through_the_agent() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(python) = nightshift_tests::external::require("python3", "python3") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let jobs = d.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    // An 8-GPU RTX 6000 node: not an Instinct, so H6's default threshold
    // (25 %); past four GPUs, so H12's 15 % budget applies.
    let sim = SimConfig { profile: "rtx6000-ada".into(), gpus: 8, ..SimConfig::default() };
    let agent = TestAgent::start(d, "t1", sim, &format!("job_metrics_dir: {}\n", jobs.display())).await;
    let cfg = engine_setup(d, &[&agent], &[], "telemetry: {interval_ms: 250}\n");
    let rb = d.join("runbooks");
    ship(
        &rb,
        "mem-fragmentation",
        &[
            ("for_secs: 60", "for_secs: 2"),
            ("wait_idle_secs: { type: int, default: 300 }", "wait_idle_secs: { type: int, default: 1 }"),
        ],
    );
    ship(
        &rb,
        "training-stall",
        &[
            ("above: 600", "above: 5"),
            ("for_secs: 10", "for_secs: 1"),
            ("clear_below: 60", "clear_below: 2"),
            ("grace_secs: { type: int, default: 600", "grace_secs: { type: int, default: 2"),
            ("moving_secs: { type: float, default: 60", "moving_secs: { type: float, default: 2"),
            // The storm breaker's hold (a storm is seen whole) in seconds too.
            ("hold_secs: 60", "hold_secs: 1"),
        ],
    );
    ship(&rb, "comm-overhead", &[("for_secs: 300", "for_secs: 2"), ("hold_secs: 60", "hold_secs: 1")]);
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    assert!(engine.runbook_set().errors.is_empty(), "{:?}", engine.runbook_set().errors);

    // The job: GPU 1's allocator 32 % fragmented, all-reduce 34 % of each
    // step, its loop hangs after 20 steps (its heartbeat thread goes on).
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pytorch/nightshift_textfile.py");
    let mut job = Command::new(python)
        .arg(helper)
        .args(["--dir", &jobs.display().to_string(), "--job", "llm", "--gpus", "8"])
        .args(["--fragmented-gpu", "1", "--fragmentation-pct", "32", "--comm-share-pct", "34"])
        .args(["--steps-per-sec", "20", "--stall-after", "20", "--seconds", "60"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();

    let applied = |op: &str, runbook: &str| {
        engine.audit().tail(0, usize::MAX).unwrap().into_iter().find(|r| {
            r.kind == RecordKind::ActionResult
                && r.data["op"] == op
                && r.data["applied"] == true
                && r.runbook.as_deref() == Some(runbook)
        })
    };
    // H6: the fragmented GPU's caches are flushed.
    let started = std::time::Instant::now();
    let flush = eventually(30, || applied("flush_caches", "mem-fragmentation")).await;
    eprintln!("H6 flush after {:?}", started.elapsed());
    // H12: the owner hears about the communication share.
    let note = eventually(30, || {
        engine
            .audit()
            .tail(0, usize::MAX)
            .unwrap()
            .into_iter()
            .find(|r| r.kind == RecordKind::Notification && r.runbook.as_deref() == Some("comm-overhead"))
    })
    .await;
    // H11: the stalled job's node is drained.
    eprintln!("H12 note after {:?}", started.elapsed());
    let drain = eventually(40, || applied("drain", "training-stall")).await;
    eprintln!("H11 drain after {:?}", started.elapsed());
    let _ = job.kill();
    let _ = job.wait();
    let flush = flush.expect("H6 flushed the caches");
    let run = engine.run(flush.run.as_deref().unwrap()).unwrap().unwrap();
    assert_eq!(run.target.gpu, Some(1), "for the fragmented GPU: {run:?}");
    let note = note.expect("H12 told the owner");
    assert!(note.data["text"].as_str().unwrap().contains("all-reduce is 34"), "{note:?}");
    if drain.is_none() {
        for r in engine.runs(&Default::default()).unwrap().runs {
            eprintln!("{} {} {:?} {}", r.id, r.runbook, r.outcome, r.why);
            for rec in engine.run_records(&r.id).unwrap() {
                eprintln!("   {:?} {}", rec.kind, rec.data);
            }
        }
        let t = engine.node("t1").unwrap();
        eprintln!("node metrics {:?}", t.node_metrics);
    }
    drain.expect("H11 drained the stalled node");
    engine.shutdown().await;
}
