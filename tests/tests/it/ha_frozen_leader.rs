//! A leader frozen between its intent and its send never acts after a
//! takeover (issue 26, item 7), end to end: two `nightshift serve`
//! processes on one real PostgreSQL and a sim agent over SSH. The leader's
//! path to the agent goes through a loopback proxy that can hold what the
//! engine sends; the standby cannot reach the agent at all.
//!
//! The leader starts a run; its intent is durable and the request is on
//! its way (its SSH exec packet held at the proxy: the first large packet
//! after the proxy is armed — the channel open before it, small, passes)
//! when the leader is frozen (SIGSTOP). The
//! standby takes the lease and — unable to reach the agent — never tells
//! it its term. Then the held request is delivered: the agent refuses it
//! (`stale_leader`: it arrived after its leader's lease deadline), and the
//! GPU is untouched. Before the deadline travelled with each request, the
//! agent applied it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_agent::journal::JournalLine;
use nightshift_agent::statelog::StateLog;
use nightshift_engine::audit::{RecordKind, pg};
use nightshift_proto::ErrorCode;
use nightshift_tests::external::{Daemon, PgCluster, free_port, postgres_bin_dir, workspace_bin_dir};
use nightshift_tests::{TestAgent, engine_setup};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TTL_MS: u64 = 2_000;
const RENEW_MS: u64 = 250;

/// The proxy passes everything.
const PASS: u8 = 0;
/// The proxy holds the engine's first packet of at least [`LARGE`] bytes
/// and everything after it.
const ARMED: u8 = 1;
const HOLDING: u8 = 2;
/// An exec request carrying a JSON request is a few hundred bytes; a
/// channel open or window adjust well under this.
const LARGE: usize = 160;

/// Forward `127.0.0.1:listen` to `to`; what the client (the engine) sends
/// is kept back, in order, while `gate` says so, and delivered once it is
/// back to [`PASS`]. The other direction always flows.
async fn gated_proxy(listen: u16, to: String, hold: Arc<AtomicU8>) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", listen)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let to = to.clone();
            let hold = hold.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&to).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if n >= LARGE {
                        let _ = hold.compare_exchange(ARMED, HOLDING, Ordering::SeqCst, Ordering::SeqCst);
                    }
                    while hold.load(Ordering::SeqCst) == HOLDING {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

fn write_engine(dir: &Path, base: &str, name: &str, port: u16, fleet: &str) -> PathBuf {
    let text = base
        .replace("listen_addr: 127.0.0.1:0", &format!("listen_addr: 127.0.0.1:{port}"))
        .replace("inventory_path: fleet.yaml", &format!("inventory_path: {fleet}"))
        .replace(
            "data_dir: engine-data",
            &format!(
                "data_dir: data-{name}\naudit:\n  backend: postgres\n  postgres: {{url_file: pg-url, lease_ttl_ms: {TTL_MS}, lease_renew_ms: {RENEW_MS}, follow_ms: 100}}"
            ),
        );
    let path = dir.join(format!("engine-{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start(dir: &Path, config: &Path, name: &str) -> Daemon {
    let argv = [
        workspace_bin_dir().join("nightshift").display().to_string(),
        "--config".into(),
        config.display().to_string(),
        "serve".into(),
    ];
    Daemon::start(&argv, &dir.join(format!("{name}.log")))
}

async fn role(http: &reqwest::Client, url: &str) -> Option<String> {
    let v: Value = http.get(format!("{url}/api/v1/ha")).send().await.ok()?.json().await.ok()?;
    v["role"].as_str().map(str::to_string)
}

async fn wait_role(http: &reqwest::Client, url: &str, want: &str, d: &Daemon) {
    let t = Instant::now();
    while role(http, url).await.as_deref() != Some(want) {
        assert!(t.elapsed() < Duration::from_secs(30), "{url} never became {want}; log:\n{}", d.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leaders_request_is_refused_after_a_takeover_that_never_reached_the_agent() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pgdir = dir.join("pg");
    std::fs::create_dir_all(&pgdir).unwrap();
    let cluster = PgCluster::start(&pgdir, &bin);
    std::fs::write(dir.join("pg-url"), &cluster.conninfo).unwrap();
    let agent = TestAgent::start(dir, "h1", SimConfig { gpus: 1, seed: 3, ..SimConfig::default() }, "").await;
    engine_setup(
        dir,
        &[&agent],
        &[(
            "cap",
            "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n",
            "let a = set_power_limit(600);\nif !a.ok { fail(a.error); }\n",
        )],
        "auth: {allow_anonymous: admin}\n",
    );
    // The leader reaches the agent through the proxy; the standby not at all.
    let hold = Arc::new(AtomicU8::new(PASS));
    let proxy = free_port();
    gated_proxy(proxy, agent.addr(), hold.clone()).await;
    let fleet = std::fs::read_to_string(dir.join("fleet.yaml")).unwrap();
    assert!(fleet.contains(&agent.addr()), "{fleet}");
    std::fs::write(dir.join("fleet-a.yaml"), fleet.replace(&agent.addr(), &format!("127.0.0.1:{proxy}"))).unwrap();
    std::fs::write(dir.join("fleet-b.yaml"), fleet.replace(&agent.addr(), &format!("127.0.0.1:{}", free_port())))
        .unwrap();
    let base = std::fs::read_to_string(dir.join("engine.yaml")).unwrap();
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (format!("http://127.0.0.1:{pa}"), format!("http://127.0.0.1:{pb}"));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let t0 = Instant::now();
    let mut a = start(dir, &write_engine(dir, &base, "a", pa, "fleet-a.yaml"), "a");
    wait_role(&http, &ua, "leader", &a).await;
    eprintln!("leader up after {} ms", t0.elapsed().as_millis());
    let b = start(dir, &write_engine(dir, &base, "b", pb, "fleet-b.yaml"), "b");
    wait_role(&http, &ub, "standby", &b).await;
    eprintln!("leader and standby up after {} ms", t0.elapsed().as_millis());
    let before = agent.started.as_ref().unwrap().agent.backend().sample().unwrap().0[0].power_limit_watts;

    // The run's request leaves the leader and is held on the way.
    hold.store(ARMED, Ordering::SeqCst);
    let r =
        http.post(format!("{ua}/api/v1/runs")).json(&json!({"runbook": "cap", "node": "h1", "gpu": 0})).send().await;
    let v: Value = r.unwrap().json().await.unwrap();
    let run = v["run"]["id"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    let (c, conn) = tokio_postgres::connect(&cluster.conninfo, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let t = Instant::now();
    let action_id = loop {
        let recs = pg::records_after(&c, "default", 0, 5000).await.unwrap();
        if let Some(r) = recs.iter().find(|(r, _)| r.kind == RecordKind::ActionIntent && r.run.as_deref() == Some(&run))
        {
            break r.0.data["action_id"].as_str().unwrap().to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no intent for {run}; log:\n{}", a.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The intent is durable; the send follows at once. Then the leader
    // freezes.
    let t = Instant::now();
    while hold.load(Ordering::SeqCst) != HOLDING {
        assert!(t.elapsed() < Duration::from_secs(10), "the request never left the leader; log:\n{}", a.log_text());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = nix::unistd::Pid::from_raw(a.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();
    wait_role(&http, &ub, "leader", &b).await;
    eprintln!("the standby took over {} ms after the freeze", frozen.elapsed().as_millis());
    let state = agent.cfg.state_dir.clone();
    let handled = |id: &str| {
        StateLog::journal_lines(&state).unwrap_or_default().into_iter().find_map(|l| match l {
            JournalLine::Done { id: i, reply, .. } if i == id => Some(reply),
            _ => None,
        })
    };
    assert!(handled(&action_id).is_none(), "the held request reached the agent early");

    // Delivered now, long after the old leader's lease ran out.
    hold.store(PASS, Ordering::SeqCst);
    let t = Instant::now();
    let reply = loop {
        if let Some(r) = handled(&action_id) {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the held request never reached the agent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reply.code(), Some(ErrorCode::StaleLeader), "{reply:?}");
    let msg = reply.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
    assert!(msg.contains("after its leader's lease deadline"), "{msg}");
    let after = agent.started.as_ref().unwrap().agent.backend().sample().unwrap().0[0].power_limit_watts;
    assert_eq!(after, before, "the frozen leader's cap was not applied");
    assert!(agent.started.as_ref().unwrap().agent.held().is_empty(), "and nothing is held");
    assert!(
        !StateLog::journal_lines(&state)
            .unwrap()
            .iter()
            .any(|l| matches!(l, JournalLine::Pending { id, .. } if *id == action_id)),
        "never marked as being applied"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = a.child.wait();
}
