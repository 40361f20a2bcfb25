//! No secret is ever written down: `nightshift serve` runs with the most
//! verbose logging while it is used with an operator token (bearer and
//! login cookie), a webhook token and a wrong token; afterwards neither its
//! log, nor the audit export, nor any byte of its data dir contains a token
//! or the engine's private key.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nightshift_agent::backend::sim::SimConfig;
use nightshift_tests::{TestAgent, engine_setup};
use sha2::Digest;

fn sha256_hex(s: &str) -> String {
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_keys_never_reach_logs_or_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "s1", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let operator = format!("ns_{}", hex::encode(rand::random::<[u8; 24]>()));
    let webhook = format!("ns_{}", hex::encode(rand::random::<[u8; 24]>()));
    let wrong = format!("ns_{}", hex::encode(rand::random::<[u8; 24]>()));
    engine_setup(
        dir.path(),
        &[&agent],
        &[
            ("cap", "trigger: {type: manual}\nscope: gpu\n", "let r = set_power_limit(500);\nnote(`done`);\n"),
            ("hot", "trigger: {type: alert, alertname: GpuHot}\nscope: gpu\n", "note(\"alert\");\n"),
        ],
        &format!(
            "auth:\n  tokens:\n    - {{name: alice, role: operator, sha256: {}}}\n  webhook_token_sha256: {}\n",
            sha256_hex(&operator),
            sha256_hex(&webhook)
        ),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log_path = dir.path().join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .current_dir(dir.path())
        .args(["serve", "--config", "engine.yaml", "--listen", &format!("127.0.0.1:{port}")])
        .env("NIGHTSHIFT_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{base}/healthz")).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && v["agents_connected"] == 1
        {
            break;
        }
        assert!(Instant::now() < end, "the engine came up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Use every secret, the way people and Alertmanager do.
    let r = http.get(format!("{base}/api/v1/runs")).bearer_auth(&operator).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http.get(format!("{base}/api/v1/runs")).bearer_auth(&wrong).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(format!("{base}/api/v1/runs"))
        .bearer_auth(&operator)
        .json(&serde_json::json!({"runbook": "cap", "node": "s1", "gpu": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = no_redirect.post(format!("{base}/login")).form(&[("token", operator.as_str())]).send().await.unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    let cookie = r.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    assert!(!cookie.contains(&operator), "a session id, not the token: {cookie}");
    let r = http.get(format!("{base}/")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The token itself in the cookie is no session.
    let r = no_redirect
        .get(format!("{base}/"))
        .header("cookie", format!("nightshift_session={operator}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers().get("location").map(|v| v.to_str().unwrap()), Some("/login"), "{}", r.status());
    let alert = serde_json::json!({
        "version": "4", "status": "firing", "receiver": "nightshift", "groupKey": "g", "truncatedAlerts": 0,
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
        "alerts": [{"status": "firing", "labels": {"alertname": "GpuHot", "Hostname": "s1", "gpu": "0"},
                    "annotations": {}, "startsAt": "2026-11-30T03:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "", "fingerprint": "f1"}]
    });
    let r = http
        .post(format!("{base}/api/v1/alerts/alertmanager"))
        .bearer_auth(&webhook)
        .json(&alert)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r =
        http.post(format!("{base}/api/v1/alerts/alertmanager")).bearer_auth(&wrong).json(&alert).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Let the runs finish and be written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let export = http.get(format!("{base}/api/v1/audit/export")).bearer_auth(&operator).send().await.unwrap();
    assert_eq!(export.status(), 200);
    let export = export.text().await.unwrap();
    assert!(export.contains("user:alice"), "the audit log names who, not with what");
    let _ = child.kill();
    let _ = child.wait();

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.lines().count() > 10, "trace logging was on:\n{log}");
    let key_text = std::fs::read_to_string(dir.path().join("engine_key")).unwrap();
    let key_lines: Vec<&str> = key_text.lines().filter(|l| !l.starts_with("-----") && l.len() >= 20).collect();
    assert!(!key_lines.is_empty());
    let mut haystacks: Vec<(String, Vec<u8>)> =
        vec![("serve log".into(), log.into_bytes()), ("audit export".into(), export.into_bytes())];
    let mut files = Vec::new();
    files_under(&dir.path().join("engine-data"), &mut files);
    assert!(!files.is_empty());
    for f in files {
        haystacks.push((f.display().to_string(), std::fs::read(&f).unwrap()));
    }
    for (name, hay) in &haystacks {
        for (what, secret) in [("operator token", &operator), ("webhook token", &webhook), ("wrong token", &wrong)] {
            assert!(!contains(hay, secret.as_bytes()), "the {what} is in {name}");
        }
        for l in &key_lines {
            assert!(!contains(hay, l.as_bytes()), "engine private key material is in {name}");
        }
    }
    let mut agent = agent;
    agent.stop().await;
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
