//! Hostile runbooks: each is stopped or refused, recorded with the right
//! outcome and line, and the engine keeps serving other runs.

use crate::common::*;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_engine::runs::{RunOutcome, Target};

const MANUAL_NODE: &str = "trigger:\n  type: manual\nscope: node\ntimeout_secs: 60\n";

/// (name, script, expected outcome, text the error must contain)
fn hostile() -> Vec<(&'static str, &'static str, RunOutcome, &'static str)> {
    vec![
        (
            "spin",
            "let x = 0;\nloop {\n  x += 1;\n}\n",
            RunOutcome::Failed,
            "spin.rhai:3:8: stopped by the operation limit (1000000 operations): runaway loop?",
        ),
        (
            "sleepy",
            "loop {\n  try { sleep(10); } catch { }\n}\n",
            RunOutcome::TimedOut,
            "stopped at its deadline (60 s)",
        ),
        ("recurse", "fn f(x) { f(x + 1) }\nf(0);\n", RunOutcome::Failed, "stopped by the call depth limit"),
        ("strings", "let s = \"xx\";\nloop { s += s; }\n", RunOutcome::Failed, "stopped by a size limit"),
        ("arrays", "let a = [];\nloop { a.push(a.len()); }\n", RunOutcome::Failed, "stopped by a size limit"),
        // Rhai checks map size on literals, not on index assignment: the
        // operation limit bounds this one.
        (
            "maps",
            "let m = #{};\nlet i = 0;\nloop { m[`k${i}`] = i; i += 1; }\n",
            RunOutcome::Failed,
            "maps.rhai:3:24: stopped by the operation limit",
        ),
        (
            "dyn-eval",
            "let f = Fn(\"eval\");\nf.call(\"40 + 2\");\n",
            RunOutcome::Failed,
            "dyn-eval.rhai:1:12: Syntax error: 'eval' is a reserved keyword",
        ),
        (
            "failing",
            "note(\"about to fail\");\nfail(\"nothing to do\");\n",
            RunOutcome::Failed,
            "failing.rhai:2:1: fail(\"nothing to do\")",
        ),
        ("catch-fail", "try { fail(\"x\"); } catch { }\nnote(\"escaped\");\n", RunOutcome::Failed, "fail(\"x\")"),
        ("runtime-error", "let x = 1;\nlet y = x / 0;\n", RunOutcome::Failed, "runtime-error.rhai:2"),
        ("bad-metric", "metric(\"gpu.tempreature\");\n", RunOutcome::Failed, "unknown metric `gpu.tempreature`"),
        // Numbers at the edges: no overflow, no truncation, no NaN sent.
        ("huge-sleep", "sleep(9223372036854775807);\n", RunOutcome::TimedOut, "stopped at its deadline (60 s)"),
        ("huge-wait", "wait_until(|| false, 1e300);\n", RunOutcome::TimedOut, "stopped at its deadline (60 s)"),
        (
            "nan-wait",
            "wait_until(|| false, 0.0 / 0.0);\n",
            RunOutcome::Failed,
            "timeout_secs: expected a finite number, found NaN",
        ),
        (
            "wide-gpu",
            "set_power_limit(4294967296, 650);\n",
            RunOutcome::Failed,
            "gpu: expected an index from 0 to 4294967295, found 4294967296",
        ),
        ("nan-watts", "set_power_limit(0, 0.0 / 0.0);\n", RunOutcome::Failed, "watts: expected a finite number"),
        (
            "nan-size",
            "notify(\"a finding\", 0.0 / 0.0);\n",
            RunOutcome::Failed,
            "notify's size: expected a finite number, found NaN",
        ),
        (
            "text-size",
            "notify(\"a finding\", \"big\");\n",
            RunOutcome::Failed,
            "notify's size: expected a number, found string",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_scripts_are_stopped_and_recorded() {
    let rb = tempfile::tempdir().unwrap();
    for (name, script, _, _) in hostile() {
        write_runbook(rb.path(), name, MANUAL_NODE, script);
    }
    write_runbook(rb.path(), "notes", MANUAL_NODE, "for i in 0..500 { note(`note ${i}`); }\n");
    write_runbook(
        rb.path(),
        "outside",
        MANUAL_NODE,
        "let r = drain_node(\"n9\", \"not mine\");\nif r.ok { fail(\"drained outside\"); }\nnote(r.error);\n",
    );
    write_runbook(
        rb.path(),
        "good",
        MANUAL_NODE,
        "sleep(20);\nlet r = set_power_limit(0, 500);\nif !r.ok { fail(r.error); }\n",
    );
    let nodes: Vec<_> = (1..=9).map(|i| node(&format!("n{i}"), "h100-sxm")).collect();
    let sim = start(nodes, rb.path(), |_| {}).await;
    let engine = &sim.fleet.engine;

    // Start every hostile run at once on node n1..n8 (one per node, so the
    // node lock does not serialise them), plus a well-behaved one on n9.
    let mut ids = Vec::new();
    let all = hostile();
    for (i, (name, _, outcome, needle)) in all.iter().enumerate() {
        let node = format!("n{}", i % 8 + 1);
        // Runs on the same node queue behind each other: that is the rule.
        let s = engine.submit(manual(name, Target::node(&node), "user:mallory")).await.unwrap();
        ids.push((run_id(&s), *outcome, *needle, name.to_string()));
    }
    let good = run_id(&engine.submit(manual("good", Target::node("n9"), "user:alice")).await.unwrap());
    for (id, outcome, needle, name) in &ids {
        let r = until_finished(&sim.fleet, id, 400).await;
        assert_eq!(r.outcome, Some(*outcome), "{name}: {r:?}");
        let err = r.error.clone().unwrap_or_default();
        assert!(err.contains(needle), "{name}: error {err:?} lacks {needle:?}");
    }
    let g = until_finished(&sim.fleet, &good, 400).await;
    assert_eq!(g.outcome, Some(RunOutcome::Succeeded), "the engine kept serving: {g:?}");

    // Note spam is capped and says so.
    let id = run_id(&engine.submit(manual("notes", Target::node("n1"), "user:mallory")).await.unwrap());
    let r = until_finished(&sim.fleet, &id, 100).await;
    assert_eq!(r.outcome, Some(RunOutcome::Succeeded));
    let recs = engine.run_records(&id).unwrap();
    let notes: Vec<_> = recs.iter().filter(|r| r.kind == RecordKind::Note).collect();
    assert_eq!(notes.len(), 101);
    assert!(notes[100].data["text"].as_str().unwrap().contains("note limit of 100 reached"));

    // Acting outside the target is refused and audited; nothing is drained.
    let id = run_id(&engine.submit(manual("outside", Target::node("n2"), "user:mallory")).await.unwrap());
    let r = until_finished(&sim.fleet, &id, 100).await;
    assert_eq!(r.outcome, Some(RunOutcome::Refused), "its only change was refused: {r:?}");
    assert!(r.why.contains("refusing to act on n9 outside it"), "{}", r.why);
    let recs = engine.run_records(&id).unwrap();
    let refusal = recs.iter().find(|r| r.kind == RecordKind::Refusal).expect("a refusal record");
    assert_eq!(refusal.data["code"], "outside_target");
    assert!(!recs.iter().any(|r| r.kind == RecordKind::ActionIntent), "no action was even attempted");
    assert!(!sim.fleet.engine.node("n9").unwrap().state.drained);
    assert!(engine.verify().unwrap().ok);
}

#[test]
fn eval_import_and_print_are_refused_at_load_with_their_line() {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(rb.path(), "uses-eval", MANUAL_NODE, "let x = 1;\nlet y = eval(\"x + 1\");\n");
    write_runbook(rb.path(), "uses-import", MANUAL_NODE, "import \"os\" as os;\n");
    write_runbook(rb.path(), "uses-print", MANUAL_NODE, "let a = 1;\n\nprint(a);\n");
    write_runbook(rb.path(), "unknown-var", MANUAL_NODE, "let a = 1;\nb + a;\n");
    let script = build_engine(&ScriptLimits::default());
    let set = load_dir(rb.path(), &script);
    assert!(set.runbooks.is_empty());
    let mut msgs: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
    msgs.sort();
    let dir = rb.path().display().to_string();
    let want = [
        format!("{dir}/unknown-var.rhai:2:1: script does not compile: Undefined variable: b"),
        format!("{dir}/uses-eval.rhai:2:9: script does not compile: reserved keyword 'eval' is disabled"),
        format!("{dir}/uses-import.rhai:1:1: script does not compile: 'import' is a reserved keyword"),
        format!("{dir}/uses-print.rhai:3:1: script does not compile: reserved keyword 'print' is disabled"),
    ];
    for (got, want) in msgs.iter().zip(want.iter()) {
        assert!(got.starts_with(want.as_str()), "got  {got}\nwant {want}");
    }
    assert_eq!(msgs.len(), 4);
}
