//! DESIGN.md: the simulator is seeded and deterministic. Runs that overlap
//! take turns in run-number order on the virtual clock, and ids come from
//! the seed, so the same scenario gives the same actions, runs and words
//! every time — here 20 times over, for scenarios where several runs of
//! several runbooks overlap on one node.

use std::path::Path;

use nightshift_sim::scenario::run;

const RUNS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_scenarios_are_byte_identical_across_twenty_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut said = 0;
    for name in ["h8-four-xids-one-node", "h2-mi300x-chassis-airflow", "h8-xid-during-open-breaker"] {
        let file = root.join("scenarios").join(format!("{name}.yaml"));
        let mut first: Option<String> = None;
        for i in 0..RUNS {
            let r = run(&file, &root).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(r.passed, "{name} run {i}: {:?}", r.failures);
            assert!(r.actions.len() > 1, "{name}: nothing overlapped to compare");
            said += r.said.len();
            let got = serde_json::to_string_pretty(&(&r.actions, &r.runs, &r.said)).unwrap();
            match &first {
                None => first = Some(got),
                Some(f) if *f == got => {}
                Some(f) => {
                    let diff = f
                        .lines()
                        .zip(got.lines())
                        .enumerate()
                        .find(|(_, (a, b))| a != b)
                        .map(|(n, (a, b))| format!("line {n}: first {a:?}, now {b:?}"))
                        .unwrap_or_else(|| "lengths differ".into());
                    panic!("{name}: run {i} differs from run 0 — {diff}");
                }
            }
        }
    }
    assert!(said > 0, "no notification or escalation was compared");
}
