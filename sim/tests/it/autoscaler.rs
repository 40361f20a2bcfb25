//! H4 beyond the standby nodes nightshift knows: with no standby left,
//! `pool-scale-out` asks the cluster's autoscaler (a generic webhook) for
//! nodes — the request audited before it is sent, with the run, the pool
//! and a bearer token, bounded by the runbook's max_nodes_changed and the
//! autoscaler's per-pool budget — and judges the pool afterwards by its
//! serving nodes' power share; `pool-scale-in` gives back only what
//! nightshift asked for, a count rebuilt from the audit log after a restart.

use std::path::Path;
use std::sync::{Arc, Mutex};

use nightshift_engine::audit::RecordKind;
use nightshift_engine::config::AutoscalerConfig;
use nightshift_engine::embed::load_dir;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_proto::{Op, Request, SimFault};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A real HTTP endpoint that records each request (headers, body) and
/// answers 202.
async fn autoscaler() -> (String, Arc<Mutex<Vec<(String, serde_json::Value)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/scale", listener.local_addr().unwrap());
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let seen = s2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    if let Some(i) = text.find("\r\n\r\n") {
                        let head = text[..i].to_string();
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                            })
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= i + 4 + len {
                            let body = serde_json::from_slice(&buf[i + 4..i + 4 + len]).unwrap_or_default();
                            seen.lock().unwrap().push((head, body));
                            let _ = sock
                                .write_all(
                                    b"HTTP/1.1 202 Accepted\r\ncontent-length: 8\r\nconnection: close\r\n\r\naccepted",
                                )
                                .await;
                            break;
                        }
                    }
                }
            });
        }
    });
    (url, seen)
}

async fn load(f: &SimFleet, util: f64, n: &mut u32) {
    for node in ["a1", "a2"] {
        *n += 1;
        let r = f
            .agent(node)
            .handle(Request::new(format!("load-{n}"), Op::SimFault(SimFault::Load { gpu: None, util_pct: util })))
            .await;
        assert!(r.ok, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_standby_left_asks_the_autoscaler_and_gives_back_only_its_nodes() {
    let (url, seen) = autoscaler().await;
    let rb = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    for name in ["pool-scale-out", "pool-scale-in"] {
        for ext in ["yaml", "rhai"] {
            std::fs::copy(repo.join(format!("{name}.{ext}")), rb.path().join(format!("{name}.{ext}"))).unwrap();
        }
    }
    let script = Arc::new(build_engine(&ScriptLimits::default()));
    let set = load_dir(rb.path(), &script);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let nodes = ["a1", "a2"]
        .iter()
        .map(|n| SimNodeSpec {
            labels: [("pool".to_string(), "a".to_string())].into(),
            ..SimNodeSpec::new(n, "h100-sxm", 2)
        })
        .collect();
    let token = rb.path().join("autoscaler-token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut opts = SimFleetOptions::new(nodes, set, script);
    opts.autoscaler = Some(AutoscalerConfig { url, token_file: Some(token), timeout_secs: 5, max_nodes_per_pool: 1 });
    let dir = scratch_dir().unwrap();
    let mut f = SimFleet::start(opts, dir.path()).await.unwrap();
    let mut n = 0;

    // The pool runs at its limit; nobody is on standby.
    load(&f, 100.0, &mut n).await;
    f.run_for(2700).await.unwrap();
    let asked = seen.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "one request within the budget (max_nodes_per_pool 1): {asked:?}");
    let (head, body) = &asked[0];
    assert!(head.to_ascii_lowercase().contains("authorization: bearer s3cret"), "{head}");
    assert_eq!(body["direction"], "out");
    assert_eq!(body["count"], 1);
    assert_eq!(body["pool"], serde_json::json!({"label": "pool", "value": "a"}));
    let run = body["run"].as_str().unwrap().to_string();
    // Audited before it was sent: the intent, then the result, in order.
    let recs = f.engine.run_records(&run).unwrap();
    let i = recs.iter().position(|r| r.kind == RecordKind::ActionIntent && r.data["op"] == "autoscale").unwrap();
    let j = recs.iter().position(|r| r.kind == RecordKind::ActionResult && r.data["op"] == "autoscale").unwrap();
    assert!(i < j && recs[j].data["applied"] == true && recs[j].data["status"] == 202, "{recs:?}");
    assert_eq!(recs[i].data["args"]["request_id"], body["request_id"]);
    // No node came (the sim's fleet is fixed): the pool stays at its limit,
    // a person is told; the next scale-out is over the budget and says so.
    let all = f.engine.audit().tail(0, usize::MAX).unwrap();
    let texts: Vec<String> = all
        .iter()
        .filter(|r| r.kind == RecordKind::Escalation)
        .filter_map(|r| r.data["text"].as_str().map(str::to_string))
        .collect();
    assert!(texts.iter().any(|t| t.contains("the autoscaler took the request")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("max_nodes_per_pool")), "{texts:?}");

    // A restart: what nightshift asked for comes back from the audit log.
    f.restart_engine().await.unwrap();
    // The pool idles: scale-in gives back the one node, and no more.
    load(&f, 5.0, &mut n).await;
    f.run_for(3600).await.unwrap();
    let asked = seen.lock().unwrap().clone();
    let ins: Vec<_> = asked.iter().filter(|(_, b)| b["direction"] == "in").collect();
    assert_eq!(ins.len(), 1, "{asked:?}");
    assert_eq!(ins[0].1["count"], 1);
    let all = f.engine.audit().tail(0, usize::MAX).unwrap();
    assert!(
        all.iter().any(|r| r.kind == RecordKind::Note
            && r.data["text"].as_str().is_some_and(|t| t.contains("nightshift asked for 0 node(s)"))),
        "a second scale-in is refused: nothing of nightshift's is left"
    );
    assert!(f.engine.verify().unwrap().ok);
}
