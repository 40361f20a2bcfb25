//! The `nightshift` binary against real agents over SSH on loopback, with
//! the engine embedded and served: exit codes, `--json` shapes, dry runs,
//! refusals, approvals.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_proto::{NoArgs, Op, Request, Telemetry};
use nightshift_tests::external::free_port;
use nightshift_tests::{TestAgent, engine_setup};
use serde_json::Value;

const OPERATOR: &str = "ns_test_operator_token";
const ADMIN: &str = "ns_test_admin_token";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nightshift"))
}

fn run(dir: &Path, args: &[&str]) -> Output {
    let out = bin()
        .current_dir(dir)
        .args(args)
        .env_remove("NIGHTSHIFT_SERVER")
        .env_remove("NIGHTSHIFT_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("the nightshift binary runs");
    eprintln!(
        "$ nightshift {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

async fn power(a: &TestAgent, gpu: usize) -> f64 {
    let r = a.started.as_ref().unwrap().agent.handle(Request::new("probe", Op::Telemetry(NoArgs {}))).await;
    let t: Telemetry = serde_json::from_value(r.result.unwrap()).unwrap();
    t.gpus[gpu].power_limit_watts
}

async fn setup(dir: &Path) -> (TestAgent, TestAgent) {
    let sim = SimConfig { profile: "h100-sxm".into(), gpus: 2, ..SimConfig::default() };
    let g1 = TestAgent::start(dir, "g1", sim.clone(), "").await;
    let g2 = TestAgent::start(dir, "g2", sim, "").await;
    let tokens = format!(
        "auth:\n  tokens:\n    - {{name: alice, role: operator, sha256: {}}}\n    - {{name: root, role: admin, sha256: {}}}\n",
        nightshift_web::auth::hash_token(OPERATOR),
        nightshift_web::auth::hash_token(ADMIN)
    );
    engine_setup(
        dir,
        &[&g1, &g2],
        &[
            (
                "cap",
                "trigger: {type: manual}\nscope: gpu\nparams:\n  watts: {type: float, default: 500}\n",
                "let r = set_power_limit(params.watts);\nif !r.ok { fail(r.error); }\nkeep_holds(3600);\n",
            ),
            (
                "careful",
                "trigger: {type: manual}\nscope: node\napproval: {always: true}\n",
                "note(\"approved work\");\n",
            ),
            (
                "shrink",
                "trigger: {type: manual}\nscope: group\nmax_nodes_changed: 2\nnodes_changed_param: n\nparams:\n  n: {type: int, default: 1}\napproval: {above_nodes: 1}\n",
                "note(`would give back ${params.n} node(s)`);\n",
            ),
            (
                "fault",
                "trigger: {type: manual}\nscope: gpu\n",
                "let f = declare_fault(\"dbe\", 48, \"double-bit ECC errors (test)\");\nif f.state != \"faulted\" { fail(`${f}`); }\n",
            ),
            (
                "rma",
                "trigger: {type: manual}\nscope: node\nsticky_drain: true\n",
                "let r = drain_sticky(\"GPU 1 to be replaced\");\nif !r.ok { fail(r.error); }\n",
            ),
        ],
        &tokens,
    );
    (g1, g2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_engine() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (g1, g2) = setup(d).await;

    let o = run(d, &["runbooks", "list", "--json"]);
    assert_eq!(code(&o), 0);
    let names: Vec<String> =
        json(&o).as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, vec!["cap", "careful", "fault", "rma", "shrink"]);

    // A dry run changes nothing.
    let o = run(d, &["run", "cap", "--node", "g1", "--gpu", "0", "--param", "watts=450", "--dry-run"]);
    assert_eq!(code(&o), 0);
    assert!(String::from_utf8_lossy(&o.stdout).contains("dry run"));
    assert_eq!(power(&g1, 0).await, 700.0, "--dry-run left the agent untouched");

    // A live run without --yes and without a terminal is refused as usage.
    let o = run(d, &["run", "cap", "--node", "g1", "--gpu", "0"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("confirm with --yes"));

    // For real.
    let o = run(d, &["run", "cap", "--node", "g1", "--gpu", "0", "--param", "watts=450", "--yes"]);
    assert_eq!(code(&o), 0);
    assert_eq!(power(&g1, 0).await, 450.0);

    // The envelope refuses: the run fails (exit 1) with the agent's words.
    let o = run(d, &["run", "cap", "--node", "g1", "--gpu", "1", "--param", "watts=90", "--yes"]);
    assert_eq!(code(&o), 1);
    assert!(String::from_utf8_lossy(&o.stdout).contains("below the floor"));

    // Hands-off on the node: refused before it starts (exit 3, with why).
    std::fs::write(g2.cfg.state_dir.join("hands-off"), "dave: swapping a PSU").unwrap();
    let o = run(d, &["run", "cap", "--node", "g2", "--gpu", "0", "--yes"]);
    assert_eq!(code(&o), 3);
    assert!(String::from_utf8_lossy(&o.stdout).contains("hands-off"));
    assert_eq!(power(&g2, 0).await, 700.0);

    // Usage errors: exit 2.
    assert_eq!(code(&run(d, &["run", "cap", "--node", "nope", "--gpu", "0", "--yes"])), 2);
    assert_eq!(code(&run(d, &["run", "nope", "--node", "g1", "--yes"])), 2);
    assert_eq!(code(&run(d, &["audit", "list", "--outcome", "great"])), 2);
    assert_eq!(code(&run(d, &["--config", "missing.yaml", "audit", "list"])), 2);

    // Approvals need a server.
    let o = run(d, &["approve", "r000001"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--server"));

    // The audit log.
    let o = run(d, &["audit", "list", "--json", "--limit", "10"]);
    assert_eq!(code(&o), 0);
    let runs = json(&o)["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 4, "{runs:?}");
    let outcomes: Vec<&str> = runs.iter().map(|r| r["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, vec!["refused", "failed", "succeeded", "succeeded"]);
    let id = runs[1]["id"].as_str().unwrap().to_string();
    let o = run(d, &["audit", "show", &id, "--json"]);
    assert_eq!(json(&o)["run"]["id"], id.as_str());
    let o = run(d, &["audit", "list", "--node", "g1", "--outcome", "succeeded", "--since", "1h", "--json"]);
    assert_eq!(json(&o)["runs"].as_array().unwrap().len(), 2);
    let o = run(d, &["audit", "verify"]);
    assert_eq!(code(&o), 0);
    assert!(String::from_utf8_lossy(&o.stdout).contains("chain verified up to record"));
    let o = run(d, &["audit", "export", "--format", "jsonl"]);
    let lines: Vec<Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() > 10);
    assert_eq!(lines[0]["seq"], 1);
    // The head: the last exported record's sequence number and hash.
    let o = run(d, &["audit", "head", "--json"]);
    assert_eq!(code(&o), 0);
    let head = json(&o);
    let last = lines.last().unwrap();
    assert_eq!((head["seq"].clone(), head["hash"].clone()), (last["seq"].clone(), last["hash"].clone()));
    let o = run(d, &["audit", "head"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.starts_with(&format!("record {} at ", last["seq"])) && text.contains(last["hash"].as_str().unwrap()),
        "{text}"
    );
    // `audit export | head -1`: the reader leaves after a line.
    let mut child = bin()
        .current_dir(d)
        .args(["audit", "export", "--format", "jsonl"])
        .env_remove("NIGHTSHIFT_SERVER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert!(first.starts_with("{\"seq\":1,"), "{first}");
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));

    // Agents.
    let o = run(d, &["agents", "list", "--json"]);
    assert_eq!(json(&o).as_array().unwrap().len(), 2);
    let o = run(d, &["agents", "ping", "g1", "--json"]);
    assert_eq!(json(&o)["ok"], true);
    let o = run(d, &["agents", "inventory", "g1", "--json"]);
    assert_eq!(json(&o)["gpus"][0]["envelope_power_min_watts"], 200.0);
    // The cap run kept its hold for an hour: the agent lists it with its
    // owner, lease and the baseline it goes back to; g2 holds nothing.
    let o = run(d, &["agents", "holds", "g1", "--json"]);
    let v = json(&o);
    assert_eq!(v["settings"][0]["baseline"]["watts"], 700.0, "{v}");
    assert_eq!(v["settings"][0]["effective"]["watts"], 450.0, "{v}");
    assert_eq!(v["settings"][0]["holds"][0]["kept"], true, "{v}");
    let o = run(d, &["agents", "holds", "g1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("GPU 0 power limit") && text.contains("kept") && text.contains("700 W"), "{text}");
    let o = run(d, &["agents", "holds", "g2"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("g2: nothing held"), "{o:?}");
    // Health: every GPU healthy, the agent's check passes, and a repair
    // nobody awaits is refused with where to look.
    let o = run(d, &["agents", "show", "g1", "--json"]);
    let v = json(&o);
    assert_eq!(v["state"], "healthy", "{v}");
    assert!(v["gpus"].as_array().is_some_and(|g| !g.is_empty() && g.iter().all(|g| g["state"] == "healthy")), "{v}");
    let o = run(d, &["agents", "show", "g1"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("QUARANTINED"), "{o:?}");
    let o = run(d, &["agents", "health-check", "g1"]);
    assert_eq!(code(&o), 0, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("g1: health check passed"), "{o:?}");
    let o = run(d, &["nodes", "repaired", "g1", "--gpu", "0"]);
    assert_eq!(code(&o), 3, "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing awaiting repair"), "{o:?}");

    // Validate, with a broken file.
    let o = run(d, &["runbooks", "validate", "runbooks"]);
    assert_eq!(code(&o), 0);
    std::fs::write(
        d.join("runbooks/broken.yaml"),
        "version: 1\nname: broken\ndescription: x\nscript: x.rhai\nscope: node\ntrigger: {type: sometimes}\n",
    )
    .unwrap();
    let o = run(d, &["runbooks", "validate", "runbooks"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stdout).contains("broken.yaml:6:17: trigger.type: unknown variant `sometimes`"));
    drop(g2);
}

fn wait_healthy(url: &str) {
    for _ in 0..200 {
        if let Ok(mut s) = std::net::TcpStream::connect(url.trim_start_matches("http://")) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.contains("200 OK") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not come up at {url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_engine() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (g1, g2) = setup(d).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = bin()
        .current_dir(d)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("NIGHTSHIFT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(&url);
    let srv = |args: &[&str], token: &str| {
        let mut all = vec!["--server", url.as_str(), "--token", token];
        all.extend_from_slice(args);
        run(d, &all)
    };

    // An embedded engine on the same data dir is refused, clearly.
    let o = run(d, &["audit", "list"]);
    assert_eq!(code(&o), 2);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in use by another nightshift process"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Runs through the server.
    let o = srv(&["run", "cap", "--node", "g1", "--gpu", "1", "--param", "watts=400", "--dry-run"], OPERATOR);
    assert_eq!(code(&o), 0);
    assert_eq!(power(&g1, 1).await, 700.0);
    let o = srv(&["run", "cap", "--node", "g1", "--gpu", "1", "--param", "watts=400", "--yes"], OPERATOR);
    assert_eq!(code(&o), 0);
    assert_eq!(power(&g1, 1).await, 400.0);
    let o = srv(&["audit", "list", "--json"], OPERATOR);
    assert_eq!(json(&o)["runs"].as_array().unwrap().len(), 2);
    let o = srv(&["audit", "head", "--json"], OPERATOR);
    assert!(json(&o)["seq"].as_u64().unwrap() > 0 && json(&o)["hash"].as_str().unwrap().len() == 64, "{o:?}");

    // Completion asks the engine for run names (fish's protocol: one
    // `value<TAB>help` per line).
    let complete = |line: &[&str]| {
        let mut args = vec!["--", "nightshift"];
        args.extend_from_slice(line);
        let o =
            bin().current_dir(d).args(&args).env("COMPLETE", "fish").env_remove("NIGHTSHIFT_SERVER").output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let runs = json(&srv(&["audit", "list", "--json"], OPERATOR))["runs"].as_array().unwrap().clone();
    let first = runs[0]["id"].as_str().unwrap();
    let text = complete(&["--server", &url, "--token", OPERATOR, "audit", "show", "r"]);
    assert!(text.lines().any(|l| l.starts_with(&format!("{first}\tcap on g1"))), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with('r')).count(), runs.len(), "{text}");
    // Runbook and node names come from the config's files.
    assert_eq!(
        complete(&["run", "ca"]).lines().map(|l| l.split('\t').next().unwrap()).collect::<Vec<_>>(),
        ["cap", "careful"]
    );
    let nodes = complete(&["agents", "ping", "g"]);
    assert_eq!(nodes.lines().map(|l| l.split('\t').next().unwrap()).collect::<Vec<_>>(), ["g1", "g2"], "{nodes}");
    assert!(nodes.contains("pool=a"), "{nodes}");
    // The script a shell sources registers that completer.
    let script = String::from_utf8_lossy(&run(d, &["completions", "bash"]).stdout).into_owned();
    assert!(script.contains("COMPLETE=\"bash\"") || script.contains("COMPLETE=bash"), "{script}");

    // A run that needs approval waits; the requester cannot approve it; the
    // admin can.
    let mut waiting = bin()
        .current_dir(d)
        .args(["--server", &url, "--token", OPERATOR, "run", "careful", "--node", "g1", "--yes"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pending = None;
    for _ in 0..100 {
        let o = srv(&["audit", "list", "--json"], OPERATOR);
        pending = json(&o)["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "pending_approval")
            .map(|r| r["id"].as_str().unwrap().to_string());
        if pending.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pending = pending.expect("a pending run");
    let o = srv(&["approve", &pending], OPERATOR);
    assert_eq!(code(&o), 3, "self-approval is a conflict");
    let o = srv(&["approve", &pending], ADMIN);
    assert_eq!(code(&o), 0);
    let status = waiting.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the waiting run finished");

    // Rejected: exit 3.
    let mut waiting = bin()
        .current_dir(d)
        .args(["--server", &url, "--token", OPERATOR, "run", "careful", "--node", "g1", "--yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut pending = None;
    for _ in 0..100 {
        let o = srv(&["audit", "list", "--json"], OPERATOR);
        pending = json(&o)["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "pending_approval")
            .map(|r| r["id"].as_str().unwrap().to_string());
        if pending.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = srv(&["reject", &pending.unwrap(), "--reason", "not during training"], ADMIN);
    assert_eq!(code(&o), 0);
    assert_eq!(waiting.wait().unwrap().code(), Some(3));

    // The plan the CLI shows is the engine's decision, both ways (it used
    // to count the group's members, 2 > 1, and say "needs approval" for a
    // run the engine started at once).
    let o = srv(&["run", "shrink", "--group", "pool=a", "--yes"], OPERATOR);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(code(&o), 0, "{text}");
    assert!(!text.contains("needs approval"), "one node a run: no approval: {text}");
    assert!(text.contains("succeeded"), "{text}");
    let waiting = bin()
        .current_dir(d)
        .args(["--server", &url, "--token", OPERATOR, "run", "shrink", "--group", "pool=a", "--param", "n=2", "--yes"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pending = None;
    for _ in 0..100 {
        let o = srv(&["audit", "list", "--json"], OPERATOR);
        pending = json(&o)["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "pending_approval" && r["runbook"] == "shrink")
            .map(|r| r["id"].as_str().unwrap().to_string());
        if pending.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pending = pending.expect("two nodes a run waits for approval");
    assert_eq!(code(&srv(&["reject", &pending, "--reason", "one at a time"], ADMIN)), 0);
    let out = waiting.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("needs approval by another operator (changes up to 2 nodes (approval above 1))"),
        "the plan said so before it was sent: {text}"
    );

    // A person's controls (issue 30), through the server, as themselves.
    // Where kubectl users look: the fleet's holds, and runs list = audit list.
    let o = srv(&["holds", "list"], OPERATOR);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(code(&o) == 0 && text.contains("g1") && text.contains("400 W"), "{text}");
    let runs = json(&srv(&["runs", "list", "--json"], OPERATOR));
    assert_eq!(runs["runs"], json(&srv(&["audit", "list", "--json"], OPERATOR))["runs"]);
    // Every hold on a node only with --all or a yes (no terminal here: a no).
    let o = srv(&["holds", "release", "g1", "--reason", "slip of the keyboard"], OPERATOR);
    assert_eq!(code(&o), 3, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected a yes, or --all"), "{o:?}");
    assert_eq!(power(&g1, 1).await, 400.0, "nothing released");
    // The kept cap on g1 GPU 1 (400 W) is released:
    let o = srv(&["holds", "release", "g1", "--gpu", "1", "--reason", "the cap is no longer needed"], OPERATOR);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(code(&o), 0, "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("done: g1: released hold") && text.contains("back to its baseline"), "{text}");
    assert_eq!(power(&g1, 1).await, 700.0, "released on the agent");
    let o = srv(&["holds", "release", "g1", "--gpu", "1", "--reason", "again"], OPERATOR);
    assert_eq!(code(&o), 2, "nothing left to release");
    assert!(String::from_utf8_lossy(&o.stderr).contains("g1 has no hold on GPU 1"));
    // A sticky RMA drain ends only by a person:
    let o = srv(&["run", "rma", "--node", "g2", "--yes"], OPERATOR);
    // Exit 4: it did its part, a person ends the drain.
    assert_eq!(code(&o), 4, "{}", String::from_utf8_lossy(&o.stdout));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("needs_person — g2 drained until a person ends it (GPU 1 to be replaced)"), "{said}");
    let drained = |a: &TestAgent| {
        let agent = a.started.as_ref().unwrap().agent.clone();
        async move { agent.telemetry().await.unwrap().node_metrics.drained }
    };
    assert!(drained(&g2).await);
    // GPU 1 faulted in the repair lifecycle: a resume says so and asks
    // (no terminal here: refused), or takes --yes.
    let o = srv(&["run", "fault", "--node", "g2", "--gpu", "1", "--yes"], OPERATOR);
    assert_eq!(code(&o), 0, "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let o = srv(&["nodes", "resume", "g2", "--reason", "GPU 1 replaced and tested"], OPERATOR);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(code(&o), 3, "{err}");
    // (the sim's counter is clear, so the engine has moved it on to
    // verifying by now: not healthy either way)
    assert!(err.contains("does not hold healthy:\n  GPU 1 ") && err.contains("or --yes"), "{err}");
    assert!(drained(&g2).await, "nothing was sent");
    let o = srv(&["nodes", "resume", "g2", "--reason", "GPU 1 replaced and tested", "--yes"], OPERATOR);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("done: g2: put back into service"));
    assert!(!drained(&g2).await, "resumed on the agent");
    // A person's drain (where kubectl users look: `nodes drain`): theirs in
    // the scheduler (named, not nightshift's prefix), held with no lease by
    // the person; a person's resume ends it.
    let o = srv(&["nodes", "drain", "g2", "--reason", "firmware update, ticket OPS-4711"], OPERATOR);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("done: g2: drained as yours"), "{o:?}");
    let g2_agent = g2.started.as_ref().unwrap().agent.clone();
    let m = g2_agent.telemetry().await.unwrap().node_metrics;
    assert!(m.drained, "drained on the agent");
    assert_eq!(m.drain_reason.as_deref(), Some("drained by alice: firmware update, ticket OPS-4711"));
    let o = srv(&["agents", "holds", "g2"], OPERATOR);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.lines().any(|l| l.contains("person:alice") && l.contains("sticky")), "{text}");
    assert_eq!(code(&srv(&["nodes", "drain", "g2"], OPERATOR)), 2, "no reason: a usage error");
    let o = srv(&["nodes", "resume", "g2", "--reason", "firmware done", "--yes"], OPERATOR);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!drained(&g2).await, "a person's resume ends a person's drain");
    // All are in the audit under the person's name.
    let o = srv(&["audit", "export"], OPERATOR);
    let export = String::from_utf8_lossy(&o.stdout).into_owned();
    let by_alice: Vec<&str> =
        export.lines().filter(|l| l.contains("\"actor\":\"user:alice\"") && l.contains("\"action_intent\"")).collect();
    assert!(
        by_alice.iter().any(|l| l.contains("\"op\":\"release\""))
            && by_alice.iter().any(|l| l.contains("\"op\":\"resume\""))
            && by_alice.iter().any(|l| l.contains("\"op\":\"drain\"") && l.contains("OPS-4711")),
        "{export}"
    );
    // Hands-off: an admin's; an operator is refused.
    let o = srv(&["nodes", "hands-off", "g2", "--on", "--reason", "firmware update"], OPERATOR);
    assert_eq!(code(&o), 2);
    let o = srv(&["nodes", "hands-off", "g2", "--on", "--for", "2h", "--reason", "firmware update"], ADMIN);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("changes nothing on it until 20"), "{o:?}");
    let o = srv(&["agents", "list"], OPERATOR);
    assert!(String::from_utf8_lossy(&o.stdout).contains("yes (user:root, until"), "{o:?}");
    let nodes = srv(&["nodes", "list", "--state", "hands-off"], OPERATOR);
    let text = String::from_utf8_lossy(&nodes.stdout).into_owned();
    assert!(text.contains("g2") && !text.contains("g1 "), "nodes list = agents list, filtered: {text}");
    assert_eq!(code(&srv(&["nodes", "hands-off", "g2", "--on", "--for", "soon", "--reason", "x"], ADMIN)), 2);
    let o = srv(&["nodes", "hands-off", "g2", "--off"], ADMIN);
    assert_eq!(code(&o), 0);
    // A maintenance window on g2 by name: listed, shown, ended early.
    let o = srv(&["maintenance", "add", "--node", "g2", "--reason", "PDU swap"], ADMIN);
    assert_eq!(code(&o), 2, "no end: a usage error: {o:?}");
    let o = srv(&["maintenance", "add", "--node", "g2", "--for", "3h", "--reason", "PDU swap"], OPERATOR);
    assert_eq!(code(&o), 2, "an admin's: {o:?}");
    let o = srv(&["maintenance", "add", "--node", "g2", "--match", "rack", "--for", "3h", "--reason", "x"], ADMIN);
    assert!(code(&o) == 2 && String::from_utf8_lossy(&o.stderr).contains("--match: expected KEY=VALUE"), "{o:?}");
    let o = srv(&["maintenance", "add", "--node", "g2", "--for", "3h", "--reason", "PDU swap"], ADMIN);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(code(&o), 0, "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("set maintenance window mw-") && text.contains("1 node(s) covered now"), "{text}");
    let listed = json(&srv(&["maintenance", "list", "--json"], OPERATOR));
    let id = listed["windows"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(listed["windows"][0]["covers"], serde_json::json!(["g2"]), "{listed}");
    let o = srv(&["maintenance", "list"], OPERATOR);
    assert!(String::from_utf8_lossy(&o.stdout).contains("PDU swap"), "{o:?}");
    let o = srv(&["agents", "list"], OPERATOR);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("yes (window {id}, until")), "{o:?}");
    let o = srv(&["maintenance", "end", &id, "--reason", "done early"], ADMIN);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&srv(&["maintenance", "list", "--json"], OPERATOR))["windows"], serde_json::json!([]));
    // A finished run cannot be cancelled; an unknown one is not found.
    let done_run = json(&srv(&["audit", "list", "--json"], OPERATOR))["runs"][0]["id"].as_str().unwrap().to_string();
    let o = srv(&["runs", "cancel", &done_run], OPERATOR);
    assert_eq!(code(&o), 3);
    assert!(String::from_utf8_lossy(&o.stderr).contains("already finished"));
    assert_eq!(code(&srv(&["runs", "cancel", "r999999-nope"], OPERATOR)), 2);
    // Without a server the controls say how.
    let o = run(d, &["nodes", "resume", "g2", "--reason", "x"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("pass --server URL"));

    // The fleet's mode: shown to anyone, set by an admin with a reason.
    let o = srv(&["fleet", "mode"], OPERATOR);
    assert_eq!(code(&o), 0);
    assert!(String::from_utf8_lossy(&o.stdout).contains("the fleet is in act mode"), "{o:?}");
    assert_eq!(code(&srv(&["fleet", "mode", "paused"], ADMIN)), 2, "no reason: a usage error");
    assert_eq!(code(&srv(&["fleet", "mode", "paused", "--reason", "upgrade"], OPERATOR)), 2, "not an admin");
    let o = srv(&["fleet", "mode", "paused", "--reason", "driver upgrade"], ADMIN);
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let o = srv(&["fleet", "mode", "--json"], OPERATOR);
    assert_eq!((json(&o)["mode"].as_str(), json(&o)["reason"].as_str()), (Some("paused"), Some("driver upgrade")));
    assert_eq!(code(&srv(&["fleet", "mode", "act", "--reason", "done"], ADMIN)), 0);

    // Bad token: exit 2; wrong role: exit 2 with the role named.
    let o = srv(&["audit", "list"], "wrong");
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"));

    // What the server answers, to compare with the embedded engine below.
    let asked: [&[&str]; 4] = [
        &["fleet", "mode", "--json"],
        &["maintenance", "list", "--json"],
        &["agents", "show", "g1", "--json"],
        &["agents", "holds", "g1", "--json"],
    ];
    let served: Vec<Value> = asked.iter().map(|a| json(&srv(a, OPERATOR))).collect();

    // Graceful shutdown on SIGTERM.
    let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
    let status = server.wait().unwrap();
    assert_eq!(status.code(), Some(0));

    // Nobody there: exit 4.
    let o = srv(&["audit", "list"], OPERATOR);
    assert_eq!(code(&o), 4);
    assert!(String::from_utf8_lossy(&o.stderr).contains("unreachable"));

    // Issue 44: both modes are one implementation of each command — the
    // engine embedded on the same data dir answers what the server did.
    for (a, served) in asked.iter().zip(&served) {
        let o = run(d, a);
        assert_eq!(code(&o), 0, "{a:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(&json(&o), served, "{a:?}: the embedded engine and the server differ");
    }
}

#[test]
fn every_subcommand_has_an_example_in_its_help() {
    let subs: &[&[&str]] = &[
        &["serve"],
        &["run"],
        &["runbooks", "list"],
        &["runbooks", "show"],
        &["runbooks", "validate"],
        &["runbooks", "test"],
        &["audit", "list"],
        &["audit", "show"],
        &["audit", "follow"],
        &["audit", "verify"],
        &["audit", "export"],
        &["agents", "list"],
        &["agents", "ping"],
        &["agents", "inventory"],
        &["agents", "holds"],
        &["agents", "show"],
        &["agents", "health-check"],
        &["nodes", "repaired"],
        &["nodes", "list"],
        &["nodes", "resume"],
        &["nodes", "drain"],
        &["nodes", "hands-off"],
        &["holds", "release"],
        &["runs", "cancel"],
        &["approve"],
        &["reject"],
        &["keygen"],
        &["token"],
        &["completions"],
        &["demo"],
    ];
    for s in subs {
        let mut args = s.to_vec();
        args.push("--help");
        let o = bin().args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("Example: nightshift"), "{} --help has no example:\n{text}", s.join(" "));
    }
    let o = bin().args(["completions", "bash"]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("_nightshift"));
    // The benchmarks' old command says where they went, with the flags given.
    let o = bin().args(["bench", "--only", "2", "--smoke"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 2, "{err}");
    assert!(err.contains("./target/release/nightshift-bench --only 2 --smoke (docs/BENCHMARKS.md)"), "{err}");
}

#[test]
fn the_demo_remediates_every_scripted_fault() {
    let o = bin()
        .args(["demo", "--duration-secs", "25", "--time-scale", "75", "--listen", "127.0.0.1:0"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    eprintln!("{text}\n{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0));
    let summary = text.split("Summary").nth(1).expect("a summary");
    for row in ["H1", "H4", "H5", "H6", "H8", "H2"] {
        let line = summary.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no {row} row"));
        // The DBE's GPU waits for a person's reset: said so, not "succeeded".
        let done = if row == "H8" { "remediated, needs a person" } else { "remediated" };
        assert!(line.ends_with(done), "{line}");
    }
    assert!(summary.contains("chain verified up to record"));
    // Every GPU ends at its baseline limit unless a run keeps a hold on
    // purpose, and the summary says which holds remain and why.
    assert!(
        summary.contains("every GPU is at its default power limit")
            || summary.contains("none in effect: every GPU is at its baseline power limit"),
        "{summary}"
    );
    assert!(!summary.contains("without meaning to"), "{summary}");
    assert!(summary.contains("web UI     was at http://127.0.0.1:"));
}

#[test]
fn a_broken_engine_config_is_named_not_hidden_behind_a_guessed_folder() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("engine.yaml"),
        "version: 1\ndata_dir: d\nrunbook_dir: r\ninventory_path: i\nengine_key_path: k\nlimits: {queue_capasity: 1}\n",
    )
    .unwrap();
    for args in [&["runbooks", "validate"][..], &["runbooks", "test"][..]] {
        let o = run(d.path(), args);
        assert_eq!(code(&o), 2, "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("engine.yaml:6:10: limits: unknown field `queue_capasity`"), "{args:?}: {err}");
    }
    // Without a config file the folder is ./runbooks.
    std::fs::remove_file(d.path().join("engine.yaml")).unwrap();
    let o = run(d.path(), &["runbooks", "validate"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("in runbooks"), "{o:?}");
}

#[test]
fn anonymous_access_is_never_served_beyond_loopback_even_with_listen() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("engine.yaml"),
        "version: 1\nlisten_addr: 127.0.0.1:0\ndata_dir: d\nrunbook_dir: r\ninventory_path: i\nengine_key_path: k\nauth: {allow_anonymous: operator}\n",
    )
    .unwrap();
    let o = run(d.path(), &["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(code(&o), 2, "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--listen: auth.allow_anonymous is only allowed on a loopback listen_addr, found 0.0.0.0:0"),
        "{err}"
    );
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    // The read end is closed before the command writes: every write gets
    // EPIPE, as with `| head` once head has its line.
    for args in [&["completions", "zsh"][..], &["completions", "bash"][..], &["--help"][..]] {
        let mut child =
            bin().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).spawn().unwrap();
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(o.status.code(), Some(101), "{args:?}: {err}");
    }
}

/// Issue 46 point 6: an engine started while PostgreSQL is down answered
/// nothing, not even `/healthz`, until the database came back. Now the port
/// answers at once: 503, not ready, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_waiting_for_its_database_says_so_on_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("rb")).unwrap();
    std::fs::write(d.join("fleet.yaml"), "version: 1\nnodes: []\n").unwrap();
    assert_eq!(code(&run(d, &["keygen", "--out", "key"])), 0);
    std::fs::write(
        d.join("engine.yaml"),
        "version: 1\ndata_dir: data\nrunbook_dir: rb\ninventory_path: fleet.yaml\nengine_key_path: key\n\
         audit:\n  backend: postgres\n  postgres: {url_env: NIGHTSHIFT_TEST_PG}\n",
    )
    .unwrap();
    // Nothing listens at this port: the database is "down".
    let pg_port = free_port();
    let port = free_port();
    let mut child = bin()
        .current_dir(d)
        .args(["serve", "--config", "engine.yaml", "--listen", &format!("127.0.0.1:{port}")])
        .env("NIGHTSHIFT_TEST_PG", format!("postgres://nightshift@127.0.0.1:{pg_port}/nightshift"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    let get = |path: &str| {
        let r = http.get(format!("http://127.0.0.1:{port}{path}")).send();
        async move {
            let r = r.await.ok()?;
            Some((r.status().as_u16(), r.json::<Value>().await.unwrap_or_default()))
        }
    };
    let mut answered = None;
    for _ in 0..100 {
        if let Some(a) = get("/healthz").await {
            answered = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = answered.expect("healthz answered while the database is down");
    assert_eq!(status, 503, "{body}");
    assert_eq!((body["ok"].clone(), body["ready"].clone()), (Value::Bool(false), Value::Bool(false)), "{body}");
    assert!(body["starting"].as_str().is_some_and(|s| s.contains("PostgreSQL")), "{body}");
    let (status, body) = get("/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    let (status, body) = get("/api/v1/runs").await.unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("starting")), "{body}");
    let _ = child.kill();
    let _ = child.wait();
}
