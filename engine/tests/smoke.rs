mod common;

use common::*;
use nightshift_agent::proto::SimFault;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::runs::RunOutcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_gpu_fires_a_runbook_whose_actions_land_in_order() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "cool-down",
        "trigger:\n  type: threshold\n  metric: gpu.temperature_c\n  above: 85\n  for_secs: 10\n  clear_below: 80\nscope: gpu\n",
        r#"
        note(`cooling ${target.node} gpu ${target.gpu}`);
        let r = set_power_limit(200);
        if !r.ok { fail(r.error); }
        let cool = wait_until(|| metric("gpu.temperature_c") < 80, 600);
        if !cool { escalate("still hot"); }
        "#,
    );
    let sim = start(vec![node("n1", "rtx6000-ada")], rb.path(), |_| {}).await;
    let t0 = std::time::Instant::now();
    sim.fleet.run_for(10).await.unwrap();
    sim.fleet.sim("n1").inject(&SimFault::HeatsinkDegradation { gpu: 1, factor: 1.8 }).unwrap();
    sim.fleet.run_for(600).await.unwrap();
    let page = sim.fleet.engine.runs(&Default::default()).unwrap();
    assert_eq!(page.runs.len(), 1, "{:?}", page.runs);
    let run = &page.runs[0];
    eprintln!("{run:#?}\nwall {:?}", t0.elapsed());
    let recs = records(&sim.fleet);
    let k = kinds(&recs, &run.id);
    let intent = k.iter().position(|k| *k == RecordKind::ActionIntent).unwrap();
    let result = k.iter().position(|k| *k == RecordKind::ActionResult).unwrap();
    assert!(intent < result);
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded));
}
