//! High availability end to end: two `nightshift serve` processes on one
//! real PostgreSQL, four sim agents over SSH, runs started through either
//! engine's API (a standby forwards them to the leader).
//!
//! 1. kill -9 the leader at random points during runs, N times
//!    (`NIGHTSHIFT_HA_KILLS`, default 20): each time the standby takes the
//!    lease within TTL + 2 s and then recovers and acts, and the killed
//!    engine comes back as a standby.
//! 2. SIGSTOP the leader past its TTL; the standby takes over and acts;
//!    SIGCONT: the old leader writes nothing, nothing it sends is applied,
//!    and it exits saying it was deposed.
//!    Between them an admin demotes the runbook through the standby, and
//!    the next leader keeps it demoted.
//! 3. Crash PostgreSQL mid-run: the leader stops acting while the database
//!    is gone and resumes after, at the same term.
//! 4. Keep PostgreSQL down past the TTL: the leader steps down and exits 75;
//!    once the database is back an engine leads at a new term and acts.
//!
//! An Alertmanager post to the standby runs the alert's runbook on the
//! leader.
//!
//! Afterwards: every run an engine accepted is in the database and
//! finished (completed — resumed by the next leader's recovery where one
//! was in flight — or interrupted after three resumes); no
//! agent applied any request twice, and no action was intended twice; the
//! chain verifies in the database; a standby's copy holds every record.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::statelog::StateLog;
use nightshift_engine::audit::{RecordKind, pg};
use nightshift_tests::external::{Daemon, PgCluster, free_port, postgres_bin_dir, workspace_bin_dir};
use nightshift_tests::{TestAgent, engine_setup};
use serde_json::{Value, json};

/// Lease TTL and renewal in this test.
const TTL_MS: u64 = 2_000;
const RENEW_MS: u64 = 250;

fn kills() -> usize {
    std::env::var("NIGHTSHIFT_HA_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// One engine process.
struct Eng {
    name: &'static str,
    config: PathBuf,
    url: String,
    daemon: Option<Daemon>,
    starts: usize,
    dir: PathBuf,
}

impl Eng {
    fn start(&mut self) {
        self.starts += 1;
        let argv = [
            workspace_bin_dir().join("nightshift").display().to_string(),
            "--config".into(),
            self.config.display().to_string(),
            "serve".into(),
        ];
        let log = self.dir.join(format!("{}-{}.log", self.name, self.starts));
        self.daemon = Some(Daemon::start(&argv, &log));
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.daemon.as_ref().expect("running").child.id() as i32)
    }

    fn log(&self) -> String {
        self.daemon.as_ref().map(|d| d.log_text()).unwrap_or_default()
    }

    async fn ha(&self, http: &reqwest::Client) -> Option<Value> {
        let r = http.get(format!("{}/api/v1/ha", self.url)).send().await.ok()?;
        r.json().await.ok()
    }

    async fn role(&self, http: &reqwest::Client) -> Option<String> {
        self.ha(http).await.and_then(|v| v["role"].as_str().map(str::to_string))
    }
}

/// Wait until exactly one engine leads; its index.
async fn leader(engines: &[Eng], http: &reqwest::Client, secs: u64) -> usize {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let mut leading = Vec::new();
        for (i, e) in engines.iter().enumerate() {
            if e.role(http).await.as_deref() == Some("leader") {
                leading.push(i);
            }
        }
        if leading.len() == 1 {
            return leading[0];
        }
        assert!(
            Instant::now() < end,
            "expected one leader, found {leading:?}; logs:\n{}\n---\n{}",
            engines[0].log(),
            engines[1].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kill -9 the leader `l`; wait until the other engine holds the lease
/// (`taking_over` or `leader`: at most TTL + 2 s), then until it has
/// recovered and acts; how long taking the lease took.
async fn kill_and_wait_for_takeover(engines: &mut [Eng], l: usize, http: &reqwest::Client, what: &str) -> Duration {
    let killed = Instant::now();
    let d = engines[l].daemon.as_mut().unwrap();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    wait_for_takeover(engines, 1 - l, http, killed, what).await
}

/// Engine `next` holds the lease within TTL + 2 s of `since`, and is ready
/// to act soon after.
async fn wait_for_takeover(
    engines: &[Eng],
    next: usize,
    http: &reqwest::Client,
    since: Instant,
    what: &str,
) -> Duration {
    let end = since + Duration::from_millis(TTL_MS + 2_000);
    let took = loop {
        if matches!(engines[next].role(http).await.as_deref(), Some("taking_over" | "leader")) {
            break since.elapsed();
        }
        assert!(
            Instant::now() < end,
            "{what}: the standby did not take the lease within TTL + 2 s; its log:\n{}",
            engines[next].log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    while engines[next].role(http).await.as_deref() != Some("leader") {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{what}: the new leader never got ready:\n{}",
            engines[next].log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    took
}

/// Wait until engine `i` (just started) answers as a standby that knows
/// the leader (until its first campaign it forwards nowhere: 503).
async fn wait_standby(engines: &[Eng], i: usize, http: &reqwest::Client) {
    let t = Instant::now();
    while !engines[i].ha(http).await.is_some_and(|v| v["role"] == "standby" && v["leader"]["holder"].is_string()) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the restarted engine is no standby; log:\n{}",
            engines[i].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start a run of `runbook` on node/gpu through `via`; the accepted run's id.
async fn start_run(http: &reqwest::Client, via: &Eng, runbook: &str, node: &str, gpu: u32) -> Option<String> {
    let r = http
        .post(format!("{}/api/v1/runs", via.url))
        .json(&json!({"runbook": runbook, "node": node, "gpu": gpu}))
        .send()
        .await
        .ok()?;
    if r.status().as_u16() != 202 {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    v["run"]["id"].as_str().map(str::to_string)
}

/// GET `url` as JSON (the test's reads of either engine's API).
async fn get_json(http: &reqwest::Client, url: String) -> Value {
    http.get(&url).send().await.unwrap().json().await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

async fn db(conninfo: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    c
}

/// Every record of the shard, oldest first.
async fn all_records(c: &tokio_postgres::Client) -> Vec<nightshift_engine::audit::AuditRecord> {
    let mut out = Vec::new();
    loop {
        let after = out.last().map_or(0, |r: &nightshift_engine::audit::AuditRecord| r.seq);
        let page = pg::records_after(c, "default", after, 5000).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page.into_iter().map(|(r, _)| r));
    }
}

/// Request ids each agent journaled as `pending` (applied) more than once.
fn applied_twice(agents: &[&TestAgent]) -> Vec<String> {
    let mut twice = Vec::new();
    for a in agents {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for line in StateLog::journal_lines(&a.cfg.state_dir).unwrap_or_default() {
            if let JournalLine::Pending { id, .. } = line {
                *seen.entry(id).or_default() += 1;
            }
        }
        twice.extend(seen.into_iter().filter(|(_, n)| *n > 1).map(|(id, n)| format!("{}: {id} ×{n}", a.cfg.node)));
    }
    twice
}

/// Journal lines of run `run`'s own actions in its first life (not a later
/// leader's release of its holds, nor a resumed life's `<run>-r<k>-a<n>`),
/// over every agent.
fn journal_lines(agents: &[&TestAgent], run: &str) -> usize {
    let prefix = format!("{run}-a");
    agents
        .iter()
        .map(|a| {
            StateLog::journal_lines(&a.cfg.state_dir)
                .unwrap_or_default()
                .iter()
                .filter(|l| match l {
                    JournalLine::Pending { id, .. }
                    | JournalLine::Done { id, .. }
                    | JournalLine::Reverted { id, .. } => id.starts_with(&prefix),
                })
                .count()
        })
        .sum()
}

/// Engine `name` on `port`, one of the shard's engines on `ports` (its
/// peers, sharing the secret in `peer-token`).
fn write_engine(dir: &Path, base: &str, name: &str, port: u16, ports: &[u16]) -> PathBuf {
    if !dir.join("peer-token").exists() {
        std::fs::write(dir.join("peer-token"), "0123456789abcdef0123456789abcdef-ha-failover\n").unwrap();
        std::fs::set_permissions(dir.join("peer-token"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let peers: Vec<String> = ports.iter().map(|p| format!("'http://127.0.0.1:{p}'")).collect();
    let text = base.replace("listen_addr: 127.0.0.1:0", &format!("listen_addr: 127.0.0.1:{port}")).replace(
        "data_dir: engine-data",
        &format!(
            "data_dir: data-{name}\naudit:\n  backend: postgres\n  postgres: {{url_file: pg-url, lease_ttl_ms: {TTL_MS}, lease_renew_ms: {RENEW_MS}, follow_ms: 100, peer_token_file: peer-token, peers: [{}]}}",
            peers.join(", ")
        ),
    );
    let path = dir.join(format!("engine-{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_stopped_or_cut_off_from_its_database_never_acts_twice() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pgdir = dir.join("pg");
    std::fs::create_dir_all(&pgdir).unwrap();
    let mut cluster = PgCluster::start(&pgdir, &bin);
    std::fs::write(dir.join("pg-url"), &cluster.conninfo).unwrap();

    let sim = SimConfig { gpus: 2, seed: 11, ..SimConfig::default() };
    // Every GPU is capped many times over: the envelope's rate limit is
    // raised (its refusals are not what this test is about).
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "version: 1\nrate_limits:\n  power_limit: {{max_changes: 10000, window_secs: 600}}\nhands_off_marker_path: {}\n",
            dir.join("HANDS_OFF").display()
        ),
    )
    .unwrap();
    let mut agents = Vec::new();
    for n in ["h1", "h2", "h3", "h4"] {
        agents.push(TestAgent::start(dir, n, sim.clone(), &format!("policy_path: {}\n", policy.display())).await);
    }
    let refs: Vec<&TestAgent> = agents.iter().collect();
    // A run caps the GPU, waits, caps it again: kills land before, between
    // and after its actions.
    engine_setup(
        dir,
        &refs,
        &[
            (
                "cap-twice",
                "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\nmax_attempts_per_day: 10000\n",
                "let a = set_power_limit(600);\nif !a.ok { fail(a.error); }\nsleep(1);\n\
                 let b = set_power_limit(550);\nif !b.ok { fail(b.error); }\n",
            ),
            (
                "gpu-hot",
                "trigger: {type: alert, alertname: GpuHot}\nscope: gpu\n",
                "let a = set_power_limit(650);\nif !a.ok { fail(a.error); }\n",
            ),
        ],
        "auth: {allow_anonymous: admin}\n",
    );
    let base = std::fs::read_to_string(dir.join("engine.yaml")).unwrap();
    let mut engines = Vec::new();
    let ports = [free_port(), free_port()];
    for (name, port) in ["a", "b"].into_iter().zip(ports) {
        engines.push(Eng {
            name,
            config: write_engine(dir, &base, name, port, &ports),
            url: format!("http://127.0.0.1:{port}"),
            daemon: None,
            starts: 0,
            dir: dir.to_path_buf(),
        });
    }
    for e in &mut engines {
        e.start();
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let seed = std::env::var("NIGHTSHIFT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("seed {seed}");
    let mut rng = Lcg(seed);
    let mut accepted: BTreeSet<String> = BTreeSet::new();
    let targets: Vec<(String, u32)> =
        ["h1", "h2", "h3", "h4"].iter().flat_map(|n| [(n.to_string(), 0), (n.to_string(), 1)]).collect();
    let mut takeovers = Vec::new();

    // 1. kill -9, again and again.
    let mut l = leader(&engines, &http, 60).await;
    for k in 0..kills() {
        let standby = 1 - l;
        // Runs through the standby (forwarded) and the leader.
        for (i, (node, gpu)) in targets.iter().enumerate().skip(k % 2).step_by(2) {
            let via = if i % 4 < 2 { &engines[standby] } else { &engines[l] };
            if let Some(id) = start_run(&http, via, "cap-twice", node, *gpu).await {
                accepted.insert(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.next() % 1500)).await;
        let killed = kill_and_wait_for_takeover(&mut engines, l, &http, &format!("kill {k}")).await;
        takeovers.push(killed);
        engines[l].start();
        l = standby;
    }
    if !takeovers.is_empty() {
        takeovers.sort();
        eprintln!(
            "{} kills: lease taken after p50 {:?}, max {:?} (TTL {TTL_MS} ms)",
            takeovers.len(),
            takeovers[takeovers.len() / 2],
            takeovers.last().unwrap()
        );
    }
    let l = leader(&engines, &http, 30).await;
    let old = 1 - l;
    // The restarted engine comes up as a standby.
    wait_standby(&engines, old, &http).await;

    // An admin's demotion, sent to the standby (forwarded), holds after a
    // failover: the new leader reads the modes from the chain.
    let r = http
        .post(format!("{}/api/v1/runbooks/cap-twice/mode", engines[old].url))
        .json(&json!({"mode": "shadow", "reason": "ha test: hold still"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    kill_and_wait_for_takeover(&mut engines, l, &http, "after the demotion").await;
    engines[l].start();
    wait_standby(&engines, l, &http).await;
    let (l, old) = (old, l);
    let rb: Value = get_json(&http, format!("{}/api/v1/runbooks/cap-twice", engines[l].url)).await;
    assert_eq!(rb["runbook"]["mode"], "shadow", "{rb}");
    let r = http
        .post(format!("{}/api/v1/runbooks/cap-twice/mode", engines[l].url))
        .json(&json!({"mode": "act", "reason": "ha test: act again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());

    // The fleet's mode, as the standby reads it from its copy of the chain
    // (it keeps what it read until a record of the kind comes): read once,
    // then changed through the leader and back — the standby's reads follow
    // each change.
    let standby_mode = |i: usize| {
        let (http, url) = (http.clone(), format!("{}/api/v1/fleet/mode", engines[i].url));
        async move { get_json(&http, url).await["mode"].as_str().unwrap_or_default().to_string() }
    };
    let before = standby_mode(old).await;
    let other = if before == "shadow" { "act" } else { "shadow" };
    for (to, why) in [(other, "ha test: the standby follows"), (before.as_str(), "ha test: as it was")] {
        let r = http
            .post(format!("{}/api/v1/fleet/mode", engines[l].url))
            .json(&json!({"mode": to, "reason": why}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
        let t = Instant::now();
        while standby_mode(old).await != to {
            assert!(t.elapsed() < Duration::from_secs(10), "the standby still reads the fleet's mode as before {to}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // 2. SIGSTOP the leader between a run's two actions.
    let (node, gpu) = ("h1", 0);
    let paused_run = loop {
        if let Some(id) = start_run(&http, &engines[l], "cap-twice", node, gpu).await {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    accepted.insert(paused_run.clone());
    let first_action = Instant::now();
    while journal_lines(&refs, &paused_run) < 2 {
        assert!(first_action.elapsed() < Duration::from_secs(20), "the run's first action never reached h1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    nix::sys::signal::kill(engines[l].pid(), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let lines_at_stop = journal_lines(&refs, &paused_run);
    let stopped = Instant::now();
    wait_for_takeover(&engines, old, &http, stopped, "after SIGSTOP").await;
    // The new leader acts (on the same GPU: recovery resumed the paused
    // run, under action ids of its own, and once that run has ended a new
    // one is admitted).
    let acted = loop {
        if let Some(id) = start_run(&http, &engines[old], "cap-twice", node, gpu).await {
            break id;
        }
        assert!(stopped.elapsed() < Duration::from_secs(30), "the new leader accepts no run");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    accepted.insert(acted.clone());
    let t = Instant::now();
    while journal_lines(&refs, &acted) < 4 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the new leader's run did not act; log:\n{}",
            engines[old].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(engines[l].pid(), nix::sys::signal::Signal::SIGCONT).unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = engines[l].daemon.as_mut().unwrap().child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the deposed leader did not exit; log:\n{}", engines[l].log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(75), "exit status of a deposed engine; log:\n{}", engines[l].log());
    assert!(engines[l].log().contains("deposed"), "it says so:\n{}", engines[l].log());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        journal_lines(&refs, &paused_run),
        lines_at_stop,
        "the paused leader's run reached no agent after it woke"
    );
    // Nor did it record anything more of that run: its second action's
    // intent never landed (the fence), so nothing could be sent for it.
    let c = db(&cluster.conninfo).await;
    let second = format!("{paused_run}-a2");
    let landed: Vec<_> =
        all_records(&c).await.into_iter().filter(|r| r.data["action_id"].as_str() == Some(second.as_str())).collect();
    assert!(landed.is_empty(), "the deposed leader's write landed: {landed:?}");
    drop(c);
    engines[l].start();
    wait_standby(&engines, l, &http).await;
    let l = leader(&engines, &http, 30).await;

    // 3. PostgreSQL crashes between a run's two actions; the leader waits
    //    and resumes at the same term.
    let term_before = engines[l].ha(&http).await.unwrap()["term"].as_u64().unwrap();
    let run = loop {
        if let Some(id) = start_run(&http, &engines[l], "cap-twice", "h2", 1).await {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    accepted.insert(run.clone());
    let t = Instant::now();
    while journal_lines(&refs, &run) < 2 {
        if t.elapsed() > Duration::from_secs(20) {
            let r =
                http.get(format!("{}/api/v1/runs/{run}", engines[l].url)).send().await.unwrap().text().await.unwrap();
            panic!("the run's first action never reached h2: {r}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let down = cluster.crash_and_restart(Duration::from_millis(300));
    eprintln!("postgres was down for {down:?}");
    // Issue 46 point 12: this step failed under load, "the run did not
    // resume". The cause: a 300 ms crash is not a 300 ms outage on a loaded
    // machine — the database took 3.0–3.1 s to answer again (three CPU hogs
    // on two cores), longer than the 2 s lease. The leader then rightly
    // stepped down (exit 75, as in step 4) and the next leader's recovery
    // resumed the run from its top (its holds left in place). The step
    // now checks what the design promises for the outage that happened:
    // within what a lease survives, the run resumes at the same term;
    // past it, the leader steps down saying why and the run ends once.
    let t = Instant::now();
    let stepped_down = loop {
        if journal_lines(&refs, &run) >= 4 {
            break None;
        }
        if let Some(st) = engines[l].daemon.as_mut().unwrap().child.try_wait().unwrap() {
            break Some(st);
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the run did not resume; log:\n{}", engines[l].log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let survivable = down < Duration::from_millis(TTL_MS - 2 * RENEW_MS);
    let l = match stepped_down {
        None => {
            if survivable {
                let ha = engines[l].ha(&http).await.unwrap();
                assert_eq!((ha["role"].as_str(), ha["term"].as_u64()), (Some("leader"), Some(term_before)), "{ha}");
            }
            l
        }
        Some(status) => {
            assert!(!survivable, "the leader stepped down after an outage of {down:?}; log:\n{}", engines[l].log());
            assert_eq!(status.code(), Some(75), "{}", engines[l].log());
            // Why, in either of its two words: the renewals failed for the
            // TTL, or the database came back and the lease had run out by
            // its clock (seen: a 1.7 s outage under load).
            let log = engines[l].log();
            assert!(
                log.contains("could not be renewed") || log.contains("expired before it was renewed"),
                "it says why:\n{log}"
            );
            engines[l].start();
            let old = l;
            let l = leader(&engines, &http, 30).await;
            let t = Instant::now();
            let outcome = loop {
                let r = get_json(&http, format!("{}/api/v1/runs/{run}", engines[l].url)).await;
                if let Some(o) = r["run"]["outcome"].as_str() {
                    break o.to_string();
                }
                assert!(t.elapsed() < Duration::from_secs(30), "the run never ended: {r}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(["succeeded", "interrupted"].contains(&outcome.as_str()), "{outcome}");
            eprintln!("the leader stepped down after {down:?}; the run ended {outcome}");
            if old != l {
                wait_standby(&engines, old, &http).await;
            }
            l
        }
    };

    // 4. PostgreSQL gone for longer than the TTL: the leader cannot know it
    //    still leads, so it steps down and exits 75; once the database is
    //    back an engine takes the lease at a new term and acts.
    let ha = engines[l].ha(&http).await.unwrap();
    let term_before = ha["term"].as_u64().unwrap();
    let down = cluster.crash_and_restart(Duration::from_millis(TTL_MS + 1_500));
    eprintln!("postgres was down for {down:?} (TTL {TTL_MS} ms)");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = engines[l].daemon.as_mut().unwrap().child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the cut-off leader did not step down; log:\n{}",
            engines[l].log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(75), "{}", engines[l].log());
    assert!(engines[l].log().contains("could not be renewed"), "it says why:\n{}", engines[l].log());
    engines[l].start();
    let l = leader(&engines, &http, 30).await;
    let ha = engines[l].ha(&http).await.unwrap();
    assert!(ha["term"].as_u64().unwrap() > term_before, "a new term: {ha}");
    let after = loop {
        if let Some(id) = start_run(&http, &engines[l], "cap-twice", "h2", 0).await {
            break id;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no run taken after the outage");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    accepted.insert(after);

    // Let every accepted run finish.
    let l = leader(&engines, &http, 30).await;
    let t = Instant::now();
    let runs = loop {
        let page: Value = get_json(&http, format!("{}/api/v1/runs?limit=1000", engines[l].url)).await;
        let runs: BTreeMap<String, Value> = page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["id"].as_str().unwrap().to_string(), r.clone()))
            .collect();
        if accepted.iter().all(|id| runs.get(id).is_some_and(|r| r["state"] == "finished")) {
            break runs;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "runs left unfinished: {runs:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for id in &accepted {
        *outcomes.entry(runs[id]["outcome"].as_str().unwrap_or("?").to_string()).or_default() += 1;
    }
    eprintln!("{} runs accepted: {outcomes:?}", accepted.len());
    assert!(outcomes.get("succeeded").copied().unwrap_or(0) > 0, "{outcomes:?}");
    for o in outcomes.keys() {
        assert!(["succeeded", "interrupted", "failed", "cancelled"].contains(&o.as_str()), "{outcomes:?}");
    }

    // Nothing applied twice, nothing intended twice.
    assert_eq!(applied_twice(&refs), Vec::<String>::new());
    let c = db(&cluster.conninfo).await;
    let records = all_records(&c).await;
    let mut intents: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| r.kind == RecordKind::ActionIntent) {
        *intents.entry(r.data["action_id"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    let twice: Vec<_> = intents.iter().filter(|(_, n)| **n > 1).collect();
    if let Some((id, _)) = twice.first() {
        let run = id.rsplit_once("-a").map_or("", |(r, _)| r);
        let of_run: Vec<String> = records
            .iter()
            .filter(|r| r.run.as_deref() == Some(run) || r.kind == RecordKind::EngineStarted)
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        panic!("actions intended twice: {twice:?}; records:\n{}", of_run.join("\n"));
    }
    let starts = records.iter().filter(|r| r.kind == RecordKind::EngineStarted).count();
    assert!(starts > kills(), "an engine_started record per leader: {starts}");
    // The chain verifies in the database, and the standby's copy has it all.
    let v = pg::verify(&c, "default").await.unwrap();
    assert!(v.ok, "{v:?}");
    let standby = 1 - l;
    let t = Instant::now();
    loop {
        let head: Value = get_json(&http, format!("{}/api/v1/audit/head", engines[standby].url)).await;
        let (seq, _) = pg::head(&c, "default").await.unwrap().unwrap();
        if head["seq"].as_u64() == Some(seq) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the standby's copy lags: {head} vs {seq}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v: Value = get_json(&http, format!("{}/api/v1/audit/verify", engines[standby].url)).await;
    assert_eq!(v["ok"], true, "{v}");

    // The standby's live tail streams what the leader writes.
    let (head, _) = pg::head(&c, "default").await.unwrap().unwrap();
    let mut tail = http
        .get(format!("{}/api/v1/events/stream?after_seq={head}", engines[standby].url))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let tailed_run = loop {
        if let Some(id) = start_run(&http, &engines[l], "cap-twice", "h3", 0).await {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut seen = String::new();
    let t = Instant::now();
    while !seen.contains(&tailed_run) {
        assert!(t.elapsed() < Duration::from_secs(10), "the standby's tail showed no record of {tailed_run}: {seen}");
        if let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(1), tail.chunk()).await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    drop(tail);

    // Alertmanager may post to any engine: the standby forwards the alert
    // and the leader runs the alert's runbook.
    let now = nightshift_engine::embed::format_rfc3339_ms(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64,
    );
    let payload = json!({
        "version": "4", "status": "firing", "receiver": "nightshift", "groupKey": "ha",
        "truncatedAlerts": 0, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{"status": "firing", "labels": {"alertname": "GpuHot", "Hostname": "h4", "gpu": "1"},
            "annotations": {}, "startsAt": now, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
            "fingerprint": "ha-hot-h4-1"}],
    });
    let r =
        http.post(format!("{}/api/v1/alerts/alertmanager", engines[standby].url)).json(&payload).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap_or_default());
    let t = Instant::now();
    loop {
        let page: Value = get_json(&http, format!("{}/api/v1/runs?runbook=gpu-hot", engines[l].url)).await;
        let done = page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["trigger"] == "alert" && r["outcome"] == "succeeded" && r["target"]["node"] == "h4");
        if done {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the forwarded alert ran nothing on the leader: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A burst of 100 writes through the standby at once: every one is
    // answered by the leader (accepted, or suppressed as a repeat), none
    // fails in the forwarding.
    let t = Instant::now();
    let burst: Vec<_> = (0..100)
        .map(|i| {
            let (http, url) = (http.clone(), engines[standby].url.clone());
            tokio::spawn(async move {
                let body =
                    json!({"runbook": "cap-twice", "node": format!("h{}", 1 + i % 4), "gpu": i % 2, "dry_run": true});
                let r = http.post(format!("{url}/api/v1/runs")).json(&body).send().await.unwrap();
                let leader = r.headers().get("x-nightshift-leader").is_some();
                (r.status().as_u16(), leader, r.text().await.unwrap_or_default())
            })
        })
        .collect();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    for b in burst {
        let (status, via_leader, text) = b.await.unwrap();
        assert!(status < 500 && via_leader, "{status}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        *answers.entry(format!("{status} {}", v["status"].as_str().unwrap_or("?"))).or_default() += 1;
    }
    assert!(answers.keys().any(|k| k.starts_with("202 queued")), "{answers:?}");
    eprintln!("100 forwarded writes answered in {:?}: {answers:?}", t.elapsed());

    // What an operator reads: either engine names the leader and the
    // shard's head; /metrics says who leads; `nightshift ha` prints it.
    let (seq, _) = pg::head(&c, "default").await.unwrap().unwrap();
    let leader_ha = engines[l].ha(&http).await.unwrap();
    let standby_ha = engines[standby].ha(&http).await.unwrap();
    assert_eq!(standby_ha["leader"]["holder"], leader_ha["holder"], "{standby_ha}");
    let shards = standby_ha["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 1, "{standby_ha}");
    assert_eq!(shards[0]["holder"], leader_ha["holder"], "{standby_ha}");
    // (Records may have come since: an agent's hold ending, say.)
    assert!(shards[0]["head_seq"].as_u64().unwrap() >= seq, "{standby_ha} vs {seq}");
    for (i, want) in [(l, "1"), (standby, "0")] {
        let m = http.get(format!("{}/metrics", engines[i].url)).send().await.unwrap().text().await.unwrap();
        assert!(m.contains(&format!("nightshift_ha_leader{{shard=\"default\"}} {want}")), "{m}");
    }
    let out = std::process::Command::new(workspace_bin_dir().join("nightshift"))
        .args(["ha", "--server", &engines[standby].url, "--no-color"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("this engine: standby of shard default"), "{text}");
    assert!(text.contains(leader_ha["holder"].as_str().unwrap()), "{text}");
    let out = std::process::Command::new(workspace_bin_dir().join("nightshift"))
        .args(["audit", "verify", "--all-shards", "--server", &engines[standby].url, "--no-color"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("ok: shard default: chain verified up to record"), "{text}");

    // Every shard's runs, from the database, on the standby: the API, the
    // CLI and the page.
    let page: Value = get_json(&http, format!("{}/api/v1/runs?shards=all&limit=1000", engines[standby].url)).await;
    let listed: BTreeSet<String> =
        page["runs"].as_array().unwrap().iter().map(|r| r["run"]["id"].as_str().unwrap().to_string()).collect();
    assert!(accepted.is_subset(&listed), "missing: {:?}", accepted.difference(&listed).collect::<Vec<_>>());
    assert!(page["runs"].as_array().unwrap().iter().all(|r| r["shard"] == "default"));
    let out = std::process::Command::new(workspace_bin_dir().join("nightshift"))
        .args(["audit", "list", "--all-shards", "--limit", "5", "--server", &engines[standby].url, "--no-color"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("SHARD") && text.contains("cap-twice"), "{text}");
    let html = http.get(format!("{}/?shards=all", engines[standby].url)).send().await.unwrap().text().await.unwrap();
    assert!(html.contains("Timeline — every shard") && html.contains(&tailed_run), "{html}");
}

/// A fault's lifecycle across takeovers: a DBE quarantines a node under one
/// leader; the standby shows the same state (it rebuilds the model from the
/// chain it follows); after a kill -9 the new leader keeps the node out and
/// the fault as it was; a person's "repaired" is sent and the leader killed
/// at once, and the next leader finishes the verification (it fails: no
/// reset); after the reset the GPU is verified and the node returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_lifecycle_survives_takeovers() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pgdir = dir.join("pg");
    std::fs::create_dir_all(&pgdir).unwrap();
    let cluster = PgCluster::start(&pgdir, &bin);
    std::fs::write(dir.join("pg-url"), &cluster.conninfo).unwrap();
    let sim = SimConfig { gpus: 2, seed: 5, ..SimConfig::default() };
    let mut agents = Vec::new();
    for n in ["h1", "h2"] {
        agents.push(TestAgent::start(dir, n, sim.clone(), "").await);
    }
    let refs: Vec<&TestAgent> = agents.iter().collect();
    engine_setup(dir, &refs, &[], "auth: {allow_anonymous: admin}\n");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in ["ecc-dbe-drain.yaml", "ecc-dbe-drain.rhai"] {
        std::fs::copy(repo.join("runbooks").join(f), dir.join("runbooks").join(f)).unwrap();
    }
    let base = std::fs::read_to_string(dir.join("engine.yaml")).unwrap();
    let mut engines = Vec::new();
    let ports = [free_port(), free_port()];
    for (name, port) in ["a", "b"].into_iter().zip(ports) {
        engines.push(Eng {
            name,
            config: write_engine(dir, &base, name, port, &ports),
            url: format!("http://127.0.0.1:{port}"),
            daemon: None,
            starts: 0,
            dir: dir.to_path_buf(),
        });
    }
    for e in &mut engines {
        e.start();
    }
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let l = leader(&engines, &http, 60).await;
    wait_standby(&engines, 1 - l, &http).await;
    let agent_call = |op: nightshift_proto::Op, id: &str| {
        let cfg = agents[0].client_config();
        let id = id.to_string();
        async move {
            let c = nightshift_proto::ssh::client::AgentConnection::connect(&cfg).await.unwrap();
            let r = c.call(&nightshift_proto::Request::new(id, op)).await.unwrap();
            c.close().await;
            r
        }
    };
    let urls: Vec<String> = engines.iter().map(|e| e.url.clone()).collect();
    let gpu1 = |e: usize| {
        let url = format!("{}/api/v1/nodes/h1/health", urls[e]);
        let http = http.clone();
        async move {
            let v = get_json(&http, url).await;
            v["gpus"][1].clone()
        }
    };
    let drained = |e: usize| {
        let url = format!("{}/api/v1/nodes/h1", urls[e]);
        let http = http.clone();
        async move { get_json(&http, url).await["node"]["state"]["drained"] == true }
    };
    let until = |what: &'static str, secs: u64| (what, Instant::now() + Duration::from_secs(secs));

    // 1. The DBE, under the first leader: quarantined, awaiting a reset.
    let r =
        agent_call(nightshift_proto::Op::SimFault(nightshift_proto::SimFault::EccDbe { gpu: 1, count: 1 }), "ha-dbe")
            .await;
    assert!(r.ok, "{r:?}");
    let (what, end) = until("awaiting repair under the first leader", 60);
    while gpu1(l).await["state"] != "awaiting_repair" || !drained(l).await {
        assert!(Instant::now() < end, "{what}: {}\n{}", gpu1(l).await, engines[l].log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = gpu1(l).await;
    // The standby follows the chain: the same state, the same fault.
    let (what, end) = until("the standby's view", 20);
    while gpu1(1 - l).await["state"] != "awaiting_repair" {
        assert!(Instant::now() < end, "{what}: {}", gpu1(1 - l).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(gpu1(1 - l).await["fault"], before["fault"]);

    // 2. kill -9: the new leader keeps the fault, and the node out.
    kill_and_wait_for_takeover(&mut engines, l, &http, "mid-lifecycle").await;
    engines[l].start();
    let n = 1 - l;
    wait_standby(&engines, l, &http).await;
    let after = gpu1(n).await;
    assert_eq!((after["state"].clone(), after["fault"].clone()), (before["state"].clone(), before["fault"].clone()));
    assert_eq!(after["lifecycle"]["timestamps"]["seen_ms"], before["lifecycle"]["timestamps"]["seen_ms"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(drained(n).await, "the node went back into service after the takeover");

    // 3. "Repaired" (no reset), and the leader killed at once: the next one
    //    finishes the verification, which fails and keeps the node out.
    let r = http
        .post(format!("{}/api/v1/nodes/h1/repaired", engines[n].url))
        .json(&json!({"gpu": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    kill_and_wait_for_takeover(&mut engines, n, &http, "mid-verification").await;
    engines[n].start();
    let m = l;
    let (what, end) = until("the verification finished by the next leader", 120);
    loop {
        let g = gpu1(m).await;
        if g["state"] == "awaiting_repair" && g["check_failures"].as_array().is_some_and(|f| !f.is_empty()) {
            break;
        }
        assert!(Instant::now() < end, "{what}: {g}\n{}", engines[m].log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The node is still out: the agent says so (the engine's view follows
    // its telemetry).
    let t = agent_call(nightshift_proto::Op::Telemetry(nightshift_proto::NoArgs {}), "ha-probe").await;
    let t: nightshift_proto::Telemetry = serde_json::from_value(t.result.unwrap()).unwrap();
    assert!(t.node_metrics.drained, "back in service without a reset: {:?}\n{}", t.node_metrics, engines[m].log());
    let (what, end) = until("the new leader's view of the drain", 15);
    while !drained(m).await {
        assert!(Instant::now() < end, "{what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 4. The reset: verified, back in service.
    let r =
        agent_call(nightshift_proto::Op::SimFault(nightshift_proto::SimFault::GpuReset { gpu: 1 }), "ha-reset").await;
    assert!(r.ok, "{r:?}");
    let (what, end) = until("healthy after the reset", 120);
    while gpu1(m).await["state"] != "healthy" || drained(m).await {
        assert!(Instant::now() < end, "{what}: {}\n{}", gpu1(m).await, engines[m].log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let g = gpu1(m).await;
    let past = &g["history"][0]["phases"];
    assert!(past["quarantined"].is_number() && past["verified"].is_number(), "{g}");
    drop(cluster);
}
