//! A standby forwards writes only to a configured peer, and never a
//! person's credential (issue 27 item 9: one database `UPDATE` of the lease
//! row's URL captured an operator token). Two `nightshift serve` processes
//! on one real PostgreSQL:
//!
//! 1. a run posted to the standby with an operator token reaches the
//!    leader as that operator (the standby checked the token; the leader
//!    gave the name its own role) — the token itself never left;
//! 2. the leader frozen, its lease row's URL rewritten to a listener of
//!    ours: the standby refuses to forward there (503 naming the URL and
//!    `peers`) and the listener gets no connection;
//! 3. the leader resumed: its next renewal writes its own URL back;
//! 4. a request to the leader carrying a wrong engine secret is refused.
//!
//! And a standby reads right (issue 30): `nightshift run` through it
//! follows the run to its end (it used to exit 2, "404 no run"), its
//! approvals list has the leader's pending run, and a demotion on the
//! leader shows on the standby; `nightshift ha` lists both engines with
//! their roles, `agents list` names the leader as the agents' holder; a
//! real Prometheus scraping the pair with the shipped rules has no
//! nightshift alert pending (the standby's zero agents page no one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_tests::external::{Daemon, PgCluster, free_port, postgres_bin_dir, workspace_bin_dir};
use nightshift_tests::{TestAgent, engine_setup};
use serde_json::{Value, json};

const OPERATOR: &str = "op-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";

fn write_engine(dir: &Path, base: &str, name: &str, port: u16, ports: &[u16]) -> PathBuf {
    let peers: Vec<String> = ports.iter().map(|p| format!("'http://127.0.0.1:{p}'")).collect();
    let text = base.replace("listen_addr: 127.0.0.1:0", &format!("listen_addr: 127.0.0.1:{port}")).replace(
        "data_dir: engine-data",
        &format!(
            "data_dir: data-{name}\naudit:\n  backend: postgres\n  postgres: {{url_file: pg-url, lease_ttl_ms: 3000, lease_renew_ms: 250, follow_ms: 50, peer_token_file: peer-token, peers: [{}]}}",
            peers.join(", ")
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

async fn ha(http: &reqwest::Client, url: &str) -> Value {
    match http.get(format!("{url}/api/v1/ha")).bearer_auth(OPERATOR).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// `nightshift --server URL --token OPERATOR --no-color ARGS…`.
fn cli(url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(workspace_bin_dir().join("nightshift"))
        .args(["--server", url, "--token", OPERATOR, "--no-color"])
        .args(args)
        .output()
        .unwrap()
}

/// `GET url` as the operator, as JSON.
async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).bearer_auth(OPERATOR).send().await.unwrap().json().await.unwrap()
}

async fn until(what: &str, d: &Daemon, mut f: impl AsyncFnMut() -> bool) {
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < Duration::from_secs(30), "{what}; log:\n{}", d.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_forwards_to_configured_peers_only_and_never_a_token() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(bin) = postgres_bin_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pgdir = dir.join("pg");
    std::fs::create_dir_all(&pgdir).unwrap();
    let cluster = PgCluster::start(&pgdir, &bin);
    std::fs::write(dir.join("pg-url"), &cluster.conninfo).unwrap();
    std::fs::write(dir.join("peer-token"), "9f86d081884c7d659a2feaa0c55ad015-shared\n").unwrap();
    std::fs::set_permissions(dir.join("peer-token"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let agent = TestAgent::start(dir, "h1", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    engine_setup(
        dir,
        &[&agent],
        &[
            ("cap", "trigger: {type: manual}\nscope: gpu\ncooldown_secs: 0\n", "set_power_limit(600);\n"),
            ("careful", "trigger: {type: manual}\nscope: node\napproval: {always: true}\n", "note(\"ok\");\n"),
        ],
        &format!(
            "auth: {{tokens: [{{name: ops, role: operator, sha256: {}}}, {{name: boss, role: admin, sha256: {}}}]}}\n",
            nightshift_web::auth::hash_token(OPERATOR),
            nightshift_web::auth::hash_token(ADMIN)
        ),
    );
    let base = std::fs::read_to_string(dir.join("engine.yaml")).unwrap();
    let ports = [free_port(), free_port()];
    let (ua, ub) = (format!("http://127.0.0.1:{}", ports[0]), format!("http://127.0.0.1:{}", ports[1]));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let a = start(dir, &write_engine(dir, &base, "a", ports[0], &ports), "a");
    until("a leads", &a, async || ha(&http, &ua).await["role"] == "leader").await;
    let b = start(dir, &write_engine(dir, &base, "b", ports[1], &ports), "b");
    until("b is a standby that knows the leader", &b, async || {
        let v = ha(&http, &ub).await;
        v["role"] == "standby" && v["leader"]["url"] == json!(ua)
    })
    .await;

    // `nightshift ha` through the standby lists both engines of the shard
    // with their roles, not only the leader.
    until("both engines announced", &b, async || {
        let v = ha(&http, &ub).await;
        let roles: Vec<&str> =
            v["engines"].as_array().into_iter().flatten().filter_map(|e| e["role"].as_str()).collect();
        roles.contains(&"leader") && roles.contains(&"standby")
    })
    .await;
    let out = cli(&ub, &["ha"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let (ha_a, ha_b) = (ha(&http, &ua).await, ha(&http, &ub).await);
    for (engine, role) in [(&ha_a, "leader"), (&ha_b, "standby")] {
        let holder = engine["holder"].as_str().unwrap();
        let line = text.lines().find(|l| l.contains(holder) && l.contains(role));
        assert!(line.is_some(), "`nightshift ha` lists {holder} as {role}:\n{text}");
    }

    // `agents list` through the standby: the leader's view (issue 43 point
    // 6: a standby reads no agent), connected, not "unreachable".
    let out = cli(&ub, &["agents", "list"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let leader = ha_a["holder"].as_str().unwrap();
    assert!(out.status.success() && text.contains("connected"), "{text}");
    assert!(!text.contains("unreachable"), "{text}");

    // 1. Forwarded as the operator, checked by the standby.
    let post = |url: &str| {
        http.post(format!("{url}/api/v1/runs"))
            .bearer_auth(OPERATOR)
            .json(&json!({"runbook": "cap", "node": "h1", "gpu": 0, "dry_run": true}))
            .send()
    };
    let r = post(&ub).await.unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let v: Value = r.json().await.unwrap();
    let run = v["run"]["id"].as_str().unwrap().to_string();
    let got: Value = get_json(&http, &format!("{ua}/api/v1/runs/{run}")).await;
    assert_eq!(got["run"]["requested_by"], "user:ops", "{got}");
    // Ended before the next run of the same runbook on the same GPU (it
    // would be suppressed as "already active" otherwise).
    until("the forwarded run ends", &a, async || {
        let v: Value = get_json(&http, &format!("{ua}/api/v1/runs/{run}")).await;
        !v["run"]["outcome"].is_null()
    })
    .await;
    // A wrong token is refused by the standby itself.
    let r = http
        .post(format!("{ub}/api/v1/runs"))
        .bearer_auth("not-a-token")
        .json(&json!({"runbook": "cap", "node": "h1", "gpu": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // The standby reads right. `nightshift run` through it, to the end:
    let o = cli(&ub, &["run", "cap", "--node", "h1", "--gpu", "0", "--dry-run"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("succeeded"), "{}", String::from_utf8_lossy(&o.stdout));
    // A pending approval on the leader is on the standby's list:
    let r = http
        .post(format!("{ua}/api/v1/runs"))
        .bearer_auth(OPERATOR)
        .json(&json!({"runbook": "careful", "node": "h1"}))
        .send()
        .await
        .unwrap();
    let pending: Value = r.json().await.unwrap();
    let pending = pending["run"]["id"].as_str().unwrap().to_string();
    until("the standby lists the leader's pending approval", &b, async || {
        let v: Value = get_json(&http, &format!("{ub}/api/v1/approvals")).await;
        v.as_array().is_some_and(|a| a.iter().any(|r| r["id"] == json!(pending)))
    })
    .await;
    // … and its approvals page shows it as the leader's does.
    for url in [&ua, &ub] {
        let page =
            http.get(format!("{url}/approvals")).bearer_auth(OPERATOR).send().await.unwrap().text().await.unwrap();
        assert!(page.contains(&pending) && page.contains("careful"), "{url}/approvals lacks {pending}:\n{page}");
    }
    // A demotion on the leader shows on the standby:
    let r = http
        .post(format!("{ua}/api/v1/runbooks/cap/mode"))
        .bearer_auth(ADMIN)
        .json(&json!({"mode": "shadow", "reason": "watch it first"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    until("the standby shows the demotion", &b, async || {
        let v: Value = get_json(&http, &format!("{ub}/api/v1/runbooks/cap")).await;
        v["mode"] == "shadow" || v["runbook"]["mode"] == "shadow"
    })
    .await;

    // Its node and nodes pages, the fleet page and the nodes API are the
    // leader's (a standby reads no agent, so its own would not know a
    // drain): forwarded, marked with the leader's name, the same as the
    // leader's own.
    for path in ["/nodes/h1", "/nodes", "/fleet", "/api/v1/nodes", "/api/v1/maintenance"] {
        let r = http.get(format!("{ub}{path}")).bearer_auth(OPERATOR).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(
            r.headers().get("x-nightshift-leader").and_then(|v| v.to_str().ok()),
            Some(leader),
            "{path} is the leader's answer"
        );
        let page = r.text().await.unwrap();
        assert!(!page.contains(">unreachable<") && !page.contains("This engine is an HA standby"), "{path}: {page}");
    }
    let page = http.get(format!("{ub}/nodes")).bearer_auth(OPERATOR).send().await.unwrap().text().await.unwrap();
    assert!(page.contains(">in service</span>"), "the leader knows: {page}");
    // A read the standby can answer itself stays its own.
    let r = http.get(format!("{ub}/api/v1/runs")).bearer_auth(OPERATOR).send().await.unwrap();
    assert!(r.headers().get("x-nightshift-leader").is_none(), "{:?}", r.headers());
    // Without a credential: the standby's own answer (sign in first), not
    // the leader's.
    let r = http.get(format!("{ub}/api/v1/nodes")).send().await.unwrap();
    assert_eq!(r.status(), 401);

    // A real Prometheus scraping both engines with the shipped rules: the
    // standby (connected to no agent) puts no NightshiftAgentsDisconnected
    // in pending, nor does anything else page; the rule's condition
    // without its standby clause would (the control).
    if let Some(prometheus) = nightshift_tests::external::require("prometheus", "prometheus") {
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/prometheus-rules.yml");
        std::fs::write(dir.join("prom-token"), OPERATOR).unwrap();
        std::fs::write(
            dir.join("prom.yml"),
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: ['{}']\n\
                 scrape_configs:\n  - job_name: nightshift\n    authorization: {{credentials_file: '{}'}}\n\
                 \x20   static_configs: [{{targets: ['127.0.0.1:{}', '127.0.0.1:{}']}}]\n",
                rules.display(),
                dir.join("prom-token").display(),
                ports[0],
                ports[1]
            ),
        )
        .unwrap();
        let (prom, purl) = nightshift_tests::external::start_prometheus(
            &prometheus,
            &dir.join("prom.yml"),
            &dir.join("prom-tsdb"),
            &[],
            &dir.join("prometheus.log"),
        )
        .await;
        let query = async |q: &str| -> Vec<Value> {
            let v: Value = http
                .get(format!("{purl}/api/v1/query"))
                .query(&[("query", q)])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["data"]["result"].as_array().cloned().unwrap_or_default()
        };
        until("Prometheus scrapes both engines and evaluates the rules", &prom, async || {
            query("up{job=\"nightshift\"} == 1").await.len() == 2
                && query("nightshift_ha_leader").await.len() == 2
                && query("count(ALERTS) or vector(0)").await.len() == 1
        })
        .await;
        // A few evaluations with both engines' series present.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let standby_instance = format!("127.0.0.1:{}", ports[1]);
        let control = query("nightshift_agents_connected < nightshift_agents").await;
        assert!(
            control.iter().any(|r| r["metric"]["instance"] == standby_instance.as_str()),
            "the control: the standby reports fewer agents connected than the inventory: {control:?}"
        );
        let alerts = query("ALERTS{component=\"nightshift\"}").await;
        assert!(alerts.is_empty(), "no nightshift alert pending or firing for an HA pair at rest: {alerts:?}");
        drop(prom);
    }

    // 2. The row points at our listener while the leader is frozen.
    let capture = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cap_url = format!("http://{}", capture.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let c2 = connections.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = capture.accept().await {
            c2.fetch_add(1, Ordering::SeqCst);
        }
    });
    let (db, conn) = tokio_postgres::connect(&cluster.conninfo, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let pid = nix::unistd::Pid::from_raw(a.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let n = db.execute("UPDATE nightshift_lease SET url = $1 WHERE shard = 'default'", &[&cap_url]).await.unwrap();
    assert_eq!(n, 1);
    until("b reads the rewritten row", &b, async || ha(&http, &ub).await["leader"]["url"] == json!(cap_url)).await;
    let r = post(&ub).await.unwrap();
    assert_eq!(r.status(), 503);
    let text = r.text().await.unwrap();
    assert!(text.contains(&format!("at {cap_url}, which is not one of audit.postgres.peers")), "{text}");
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing was sent to the URL the row named");

    // 3. The leader's next renewal writes its own URL back.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    until("the leader re-asserts its URL", &a, async || {
        let row = db.query_one("SELECT url FROM nightshift_lease WHERE shard = 'default'", &[]).await.unwrap();
        row.get::<_, String>(0) == ua
    })
    .await;
    assert_eq!(ha(&http, &ua).await["role"], "leader", "renewed, not deposed");

    // 4. The engines' secret is checked.
    let r = http
        .post(format!("{ua}/api/v1/runs"))
        .header("x-nightshift-peer", "guessed")
        .header("x-nightshift-as", "user ops")
        .json(&json!({"runbook": "cap", "node": "h1", "gpu": 0, "dry_run": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("the engines' shared secret is not valid"));
    drop(b);
    drop(a);
}
