#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one() {
    let Ok(name) = std::env::var("SCENARIO") else { return };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let r = nightshift_engine::scenario::run(&root.join(format!("scenarios/{name}.yaml")), &root).await.unwrap();
    for a in &r.actions { eprintln!("{:>7.0}s {} {} {}{:?} {}", a.t_secs, a.runbook, a.op, a.node, a.gpu, a.outcome); }
    for x in &r.runs { eprintln!("run {x:?}"); }
    for f in &r.failures { eprintln!("FAIL {f}"); }
}
