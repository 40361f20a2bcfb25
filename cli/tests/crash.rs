//! The engine crash loop: `nightshift serve` is killed with SIGKILL at random
//! points while runs are in flight, and restarted, again and again. After
//! each kill the audit store opens and its chain verifies; every record the
//! engine published (SSE, which only carries durable records) and every run
//! it acknowledged (HTTP 202) is still there; after each restart every run
//! that was running is resumed by the new engine (a `note` saying so, its
//! holds left in place) or, resumed three times already, `interrupted`;
//! and across everything no agent
//! applied any request id twice, and every request an agent applied has its
//! `action_intent` in the audit log (written ahead). Each run also asks for
//! a power limit below the envelope: no such request is ever applied, and
//! no applied power limit is outside the agent's envelope.
//!
//! `NIGHTSHIFT_CRASH_ITERATIONS` sets the number of kills (CI: 12; the
//! documented long run: 50). `NIGHTSHIFT_SEED` replays a sequence.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::statelog::StateLog;
use nightshift_engine::audit::{AuditStore, RecordKind};
use nightshift_engine::runs::RunOutcome;
use nightshift_proto::clock::SystemClock;
use nightshift_proto::{Inventory, NoArgs, Op, Request};
use nightshift_tests::external::free_port;
use nightshift_tests::{TestAgent, engine_setup};

const SCRIPT: &str = r#"
let g = if target.node.ends_with("1") { 1 } else { 0 };
// Outside the envelope: the agent must refuse it, crash or no crash.
let probe = set_power_limit(g, 100);
if probe.ok { fail("envelope breached: 100 W was applied"); }
for i in 0..4 {
    let r = set_power_limit(g, 450 + i * 50);
    if !r.ok { fail(r.error); }
    sleep(0.03);
}
note("done");
"#;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn spawn_engine(dir: &std::path::Path, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .current_dir(dir)
        .args(["serve", "--config", "engine.yaml", "--listen", &format!("127.0.0.1:{port}")])
        .env("NIGHTSHIFT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nightshift serve starts")
}

async fn wait_ready(http: &reqwest::Client, base: &str, agents: usize) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && v["agents_connected"].as_u64() == Some(agents as u64)
        {
            return;
        }
        assert!(Instant::now() < end, "the engine did not come up with {agents} agents");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Collect (seq, hash) of records published on the live stream.
fn follow(http: reqwest::Client, url: String, seen: Arc<Mutex<BTreeMap<u64, String>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(resp) = http.get(url).send().await else { return };
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else { continue };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim())
                    && let (Some(seq), Some(hash)) = (v["seq"].as_u64(), v["hash"].as_str())
                {
                    seen.lock().unwrap().insert(seq, hash.to_string());
                }
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_survives_kill_9_in_a_loop() {
    let iterations: usize =
        std::env::var("NIGHTSHIFT_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let seed = std::env::var("NIGHTSHIFT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let sim = SimConfig { gpus: 2, ..SimConfig::default() };
    // A loose rate limit: this test is about crashes, not the envelope.
    std::fs::write(
        dir.path().join("policy.yaml"),
        "version: 1\nrate_limits:\n  power_limit: {max_changes: 100000, window_secs: 60}\n",
    )
    .unwrap();
    let mut agents = Vec::new();
    for i in 0..4 {
        agents.push(TestAgent::start(dir.path(), &format!("n{i}"), sim.clone(), "policy_path: policy.yaml\n").await);
    }
    let names: Vec<String> = agents.iter().map(|a| a.cfg.node.clone()).collect();
    engine_setup(
        dir.path(),
        &agents.iter().collect::<Vec<_>>(),
        &[(
            "work",
            "trigger: {type: manual}\nscope: node\ncooldown_secs: 0\nmax_concurrent: 16\nmax_attempts_per_day: 100000\n",
            SCRIPT,
        )],
        "auth: {allow_anonymous: admin}\n",
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let published: Arc<Mutex<BTreeMap<u64, String>>> = Arc::default();
    let mut acknowledged: BTreeSet<String> = BTreeSet::new();
    let mut to_check_interrupted: Vec<(String, u64)> = Vec::new();
    let (mut interrupted_seen, mut runs_submitted, mut kills_mid_action) = (0usize, 0usize, 0usize);
    let mut resumed_seen = 0usize;
    let started = Instant::now();

    for it in 0..=iterations {
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let mut child = spawn_engine(dir.path(), port);
        wait_ready(&http, &base, agents.len()).await;

        // Runs that were running at the last kill are resumed now (or,
        // resumed too often, interrupted); queued ones queue again.
        for (id, resumed_before) in to_check_interrupted.drain(..) {
            let v: serde_json::Value =
                http.get(format!("{base}/api/v1/runs/{id}")).send().await.unwrap().json().await.unwrap();
            let resumed = resumes(&v["records"]);
            if v["run"]["outcome"] == "interrupted" {
                assert_eq!(
                    resumed, 3,
                    "iteration {it} (seed {seed}): run {id} interrupted before 3 resumes: {}",
                    v["run"]
                );
                interrupted_seen += 1;
            } else {
                let was_running = resumed_before != u64::MAX;
                assert!(
                    !was_running || resumed > resumed_before,
                    "iteration {it} (seed {seed}): run {id} neither resumed nor interrupted after the restart: {}",
                    v["run"]
                );
                resumed_seen += usize::from(was_running);
            }
        }
        if it == iterations {
            // Let the last engine finish its runs (the resumed ones too).
            let t = Instant::now();
            for id in &acknowledged {
                loop {
                    let v: serde_json::Value =
                        http.get(format!("{base}/api/v1/runs/{id}")).send().await.unwrap().json().await.unwrap();
                    if !v["run"]["outcome"].is_null() {
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(120), "seed {seed}: run {id} never ended: {}", v["run"]);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            break;
        }

        let stream = follow(http.clone(), format!("{base}/api/v1/events/stream"), published.clone());
        // Load: runs on random nodes, some while others are still going.
        let kill_after = Duration::from_millis(50 + rng.next() % 400);
        let t0 = Instant::now();
        while t0.elapsed() < kill_after {
            let node = &names[(rng.next() % names.len() as u64) as usize];
            let r = http
                .post(format!("{base}/api/v1/runs"))
                .json(&serde_json::json!({"runbook": "work", "node": node}))
                .send()
                .await;
            if let Ok(r) = r
                && r.status() == 202
            {
                let v: serde_json::Value = r.json().await.unwrap();
                if let Some(id) = v["run"]["id"].as_str() {
                    acknowledged.insert(id.to_string());
                    runs_submitted += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.next() % 40)).await;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        stream.abort();

        // The store, as the dead engine left it.
        let store = AuditStore::open(&dir.path().join("engine-data"), Arc::new(SystemClock))
            .unwrap_or_else(|e| panic!("iteration {it} (seed {seed}): the store does not open: {e}"));
        let report = store.verify().unwrap();
        assert!(report.ok, "iteration {it} (seed {seed}): {report:?}");
        for (seq, hash) in published.lock().unwrap().iter() {
            let r = store
                .get(*seq)
                .unwrap()
                .unwrap_or_else(|| panic!("iteration {it} (seed {seed}): published record {seq} is gone"));
            assert_eq!(&r.hash, hash, "iteration {it} (seed {seed}): record {seq} changed");
        }
        for id in &acknowledged {
            assert!(store.run(id).unwrap().is_some(), "iteration {it} (seed {seed}): acknowledged run {id} is gone");
        }
        let unfinished = store.unfinished_runs().unwrap();
        for r in &unfinished {
            let recs = store.run_records(&r.id).unwrap();
            let intents = recs.iter().filter(|x| x.kind == RecordKind::ActionIntent).count();
            let results = recs.iter().filter(|x| x.kind == RecordKind::ActionResult).count();
            if intents > results {
                kills_mid_action += 1;
            }
            // A running run must be resumed past its count now; a queued
            // one (never started since) only queues again: u64::MAX.
            let before = if r.state == nightshift_engine::runs::RunState::Running {
                recs.iter().filter_map(|x| x.data["resumed"].as_u64()).max().unwrap_or(0)
            } else {
                u64::MAX
            };
            to_check_interrupted.push((r.id.clone(), before));
        }
        drop(store);
    }

    // No agent applied any request id twice; every request an agent applied
    // has its intent in the audit log.
    let store = AuditStore::open(&dir.path().join("engine-data"), Arc::new(SystemClock)).unwrap();
    assert!(store.verify().unwrap().ok);
    let mut intents: BTreeSet<String> = BTreeSet::new();
    for r in store.tail(0, usize::MAX).unwrap() {
        if r.kind == RecordKind::ActionIntent
            && let Some(id) = r.data["action_id"].as_str()
        {
            intents.insert(id.to_string());
        }
    }
    let mut applied_total = 0usize;
    for a in &agents {
        let mut pending: HashMap<String, usize> = HashMap::new();
        for line in StateLog::journal_lines(&a.cfg.state_dir).unwrap() {
            if let JournalLine::Pending { id, .. } = line {
                *pending.entry(id).or_default() += 1;
            }
        }
        for (id, n) in &pending {
            assert_eq!(*n, 1, "{}: request {id} applied {n} times (seed {seed})", a.cfg.node);
            if !id.ends_with("-status") {
                assert!(
                    intents.contains(id),
                    "{}: applied {id} with no intent in the audit log (seed {seed})",
                    a.cfg.node
                );
            }
        }
        applied_total += pending.len();
    }
    // Zero envelope violations: every applied power limit is inside the
    // envelope the agents report, and the 100 W probes were all refused.
    let inv = {
        let c = nightshift_proto::ssh::client::AgentConnection::connect(&agents[0].client_config()).await.unwrap();
        let r = c.call(&Request::new("inv", Op::Inventory(NoArgs {}))).await.unwrap();
        c.close().await;
        serde_json::from_value::<Inventory>(r.result.unwrap()).unwrap()
    };
    let floor = inv.gpus[0].envelope_power_min_watts.expect("the sim agent reports its floor");
    let ceiling = inv.gpus[0].envelope_power_max_watts.unwrap_or(f64::MAX);
    let (mut probes_refused, mut limits_applied) = (0usize, 0usize);
    let records = store.tail(0, usize::MAX).unwrap();
    for r in records.iter().filter(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "set_power_limit") {
        if r.data["applied"] == true {
            let w = r.data["after"]["power_limit_watts"].as_f64().unwrap();
            assert!((floor..=ceiling).contains(&w), "envelope violation: {w} W applied ({r:?})");
            limits_applied += 1;
        } else if r.data["code"] == "out_of_envelope" {
            probes_refused += 1;
        }
    }
    let probes_sent = records
        .iter()
        .filter(|r| r.kind == RecordKind::ActionIntent && r.data["args"]["watts"].as_f64() == Some(100.0))
        .count();
    assert!(probes_sent > 0 && probes_refused > 0, "the envelope probes ran");
    for r in records.iter().filter(|r| r.kind == RecordKind::ActionResult && r.data["applied"] == true) {
        assert_ne!(r.data["after"]["power_limit_watts"].as_f64(), Some(100.0), "a probe was applied: {r:?}");
    }
    let outcomes: Vec<Option<RunOutcome>> =
        acknowledged.iter().map(|id| store.run(id).unwrap().unwrap().outcome).collect();
    assert!(outcomes.iter().all(|o| o.is_some()), "every acknowledged run has an outcome");
    let mut by_outcome: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().flatten() {
        *by_outcome.entry(o.as_str().to_string()).or_default() += 1;
    }
    eprintln!(
        "engine kill -9: {iterations} kills ({kills_mid_action} with an action in flight), {runs_submitted} runs acknowledged, \
         {resumed_seen} resumed and {interrupted_seen} marked interrupted after a restart, {applied_total} requests applied by agents, none twice, \
         {} records published and all present, {limits_applied} power limits applied all within {floor}-{ceiling} W, \
         {probes_refused} of {probes_sent} out-of-envelope probes refused (the rest cut by a kill), outcomes {by_outcome:?}, seed {seed}, {:.1} s",
        published.lock().unwrap().len(),
        started.elapsed().as_secs_f64()
    );
    for mut a in agents {
        a.stop().await;
    }
}

/// How many times a run was resumed, by its records (the API's `records`).
fn resumes(records: &serde_json::Value) -> u64 {
    records.as_array().into_iter().flatten().filter_map(|r| r["data"]["resumed"].as_u64()).max().unwrap_or(0)
}
