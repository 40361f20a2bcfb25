//! Notifications leave the engine: `notify` and `escalate` reach the
//! configured webhooks (nightshift's JSON and a Slack body), a failed try is
//! retried, a dead endpoint gives up after its tries, and each delivery is
//! audited by target name — never by URL.

use std::time::Duration;

use nightshift_agent::backend::sim::SimConfig;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::runs::{RunOutcome, Target};
use nightshift_tests::external::receiver;
use nightshift_tests::{TestAgent, engine_setup, eventually, manual_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_webhooks_with_retries_and_are_audited() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "w1", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let (ops_url, ops) = receiver(1).await;
    let (pager_url, pager) = receiver(0).await;
    let dead_url = format!("http://127.0.0.1:{}/secret-path-abc123", nightshift_tests::external::free_port());
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "tell",
            "trigger: {type: manual}\nscope: gpu\n",
            "notify(\"heads up: GPU warm\");\nescalate(\"still hot after the cap\");\n",
        )],
        &format!(
            "notifications:\n  webhooks:\n\
             \x20   - {{name: ops, url: '{ops_url}', max_attempts: 3}}\n\
             \x20   - {{name: pager, url: '{pager_url}', format: slack, escalations_only: true}}\n\
             \x20   - {{name: dead, url: '{dead_url}', max_attempts: 2, timeout_secs: 1}}\n"
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let s = engine.submit(manual_run("tell", Target::gpu("w1", 0))).await.unwrap();
    let id = s.run().unwrap().id.clone();
    let run = eventually(20, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    // It paged a person: its work is not done without one.
    assert_eq!(run.outcome, Some(RunOutcome::NeedsPerson), "{run:?}");

    // notify → ops, dead; escalate → ops, pager, dead: five deliveries.
    let deliveries = eventually(30, || {
        let d: Vec<_> = engine
            .audit()
            .tail(0, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|r| r.kind == RecordKind::NotificationDelivery)
            .collect();
        (d.len() == 5).then_some(d)
    })
    .await
    .expect("five delivery records");
    let records = engine.run_records(&id).unwrap();
    let notify = records.iter().find(|r| r.kind == RecordKind::Notification).unwrap();
    let escalate = records.iter().find(|r| r.kind == RecordKind::Escalation).unwrap();
    assert_eq!(notify.data["webhooks"], serde_json::json!(["ops", "dead"]));
    assert_eq!(escalate.data["webhooks"], serde_json::json!(["ops", "pager", "dead"]));
    let find = |target: &str, seq: u64| {
        deliveries
            .iter()
            .find(|d| d.data["target"] == target && d.data["for_seq"] == seq)
            .unwrap_or_else(|| panic!("{target} {seq}"))
    };
    // ops: its first request failed (HTTP 500) and was retried. The two
    // deliveries run concurrently, so either may have met the 500: one took
    // two tries, the other one.
    let (a, b) = (find("ops", notify.seq), find("ops", escalate.seq));
    assert_eq!((a.data["ok"].clone(), b.data["ok"].clone()), (true.into(), true.into()), "{a:?} {b:?}");
    let mut tries = [a.data["attempts"].as_u64(), b.data["attempts"].as_u64()];
    tries.sort();
    assert_eq!(tries, [Some(1), Some(2)], "{a:?} {b:?}");
    let p = find("pager", escalate.seq);
    assert_eq!(p.data["ok"], true);
    for seq in [notify.seq, escalate.seq] {
        let d = find("dead", seq);
        assert_eq!((d.data["ok"].clone(), d.data["attempts"].clone()), (false.into(), 2.into()), "{d:?}");
        assert!(!d.data["detail"].as_str().unwrap().contains("secret-path"), "the URL stays out: {d:?}");
    }
    assert_eq!(a.run.as_deref(), Some(id.as_str()));

    // What the receivers got.
    let ops = ops.lock().unwrap().clone();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(ops.iter().all(|b| b["source"] == "nightshift" && b["run"] == id.as_str()));
    assert!(ops.iter().any(|b| b["kind"] == "escalation" && b["text"] == "still hot after the cap"));
    let pager = pager.lock().unwrap().clone();
    assert_eq!(pager.len(), 1);
    assert_eq!(
        pager[0]["text"],
        format!(":rotating_light: *escalation* tell on w1/0 ({id}): still hot after the cap").as_str()
    );
    let export = serde_json::to_string(&engine.audit().tail(0, usize::MAX).unwrap()).unwrap();
    assert!(!export.contains(&dead_url) && !export.contains(&ops_url), "no webhook URL in the audit log");
    tokio::time::sleep(Duration::from_millis(100)).await;
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_that_would_escalate_sends_nothing_except_to_targets_that_opted_in() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "w1", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let (ops_url, ops) = receiver(0).await;
    let (rehearsal_url, rehearsal) = receiver(0).await;
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[(
            "tell",
            "trigger: {type: manual}\nscope: gpu\n",
            "notify(\"heads up: GPU warm\");\nescalate(\"still hot after the cap\");\nannotate(\"nightshift.io/state\", \"hot\");\n",
        )],
        &format!(
            "notifications:\n  webhooks:\n\
             \x20   - {{name: ops, url: '{ops_url}'}}\n\
             \x20   - {{name: rehearsal, url: '{rehearsal_url}', format: slack, escalations_only: true, dry_runs: true}}\n"
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    let mut req = manual_run("tell", Target::gpu("w1", 0));
    req.dry_run = true;
    let id = engine.submit(req).await.unwrap().run().unwrap().id.clone();
    let run = eventually(20, || engine.run(&id).unwrap().filter(|r| r.outcome.is_some())).await.unwrap();
    assert_eq!(run.outcome, Some(RunOutcome::Succeeded), "{run:?}");
    // The opted-in target gets the escalation, marked; nothing else is sent.
    let got = eventually(20, || {
        let g = rehearsal.lock().unwrap().clone();
        (!g.is_empty()).then_some(g)
    })
    .await
    .expect("the opted-in target receives the dry run's escalation");
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0]["text"].as_str().unwrap().starts_with("[dry run] :rotating_light:"), "{got:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(ops.lock().unwrap().is_empty(), "a dry run sent {:?}", ops.lock().unwrap());
    let records = engine.run_records(&id).unwrap();
    for kind in [RecordKind::Notification, RecordKind::Escalation] {
        let r = records.iter().find(|r| r.kind == kind).unwrap();
        assert_eq!(r.data["dry_run"], true, "{r:?}");
        assert_eq!(r.data["delivered_to"], serde_json::json!([]), "{r:?}");
    }
    let ann = records.iter().find(|r| r.kind == RecordKind::NodeAnnotated).expect("the annotation is audited");
    assert_eq!(ann.data["dry_run"], true, "{ann:?}");
    assert!(engine.node("w1").unwrap().state.annotations.is_empty(), "a dry run changed a live annotation");
    let deliveries: Vec<_> = engine
        .audit()
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::NotificationDelivery)
        .collect();
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    assert_eq!(deliveries[0].data["target"], "rehearsal");
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}

/// The audit head is posted to the targets that asked for it (at start,
/// then every `audit_anchor_every_secs`): its sequence number and hash are
/// the store's, the delivery is audited, and other targets get nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_head_is_anchored_outside_the_store() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "w2", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let (anchor_url, anchors) = receiver(0).await;
    let (ops_url, ops) = receiver(0).await;
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("noop", "trigger: {type: manual}\nscope: node\n", "note(\"x\");\n")],
        &format!(
            "notifications:\n  audit_anchor_every_secs: 60\n  webhooks:\n\
             \x20   - {{name: ledger, url: '{anchor_url}', audit_anchors: true}}\n\
             \x20   - {{name: ops, url: '{ops_url}'}}\n"
        ),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let got = eventually(20, || anchors.lock().unwrap().first().cloned()).await.expect("an anchor posted at start");
    assert_eq!(got["kind"], "audit_anchor");
    let seq = got["seq"].as_u64().unwrap();
    let rec = engine.audit().get(seq).unwrap().expect("the anchored record");
    assert_eq!(got["hash"], rec.hash.as_str());
    assert!(got["text"].as_str().unwrap().contains(&rec.hash));
    let delivery = eventually(20, || {
        engine
            .audit()
            .tail(seq, usize::MAX)
            .unwrap()
            .into_iter()
            .find(|r| r.kind == RecordKind::NotificationDelivery && r.data["kind"] == "audit_anchor")
    })
    .await
    .expect("the anchor's delivery is audited");
    assert_eq!((delivery.data["target"].clone(), delivery.data["ok"].clone()), ("ledger".into(), true.into()));
    assert_eq!(delivery.data["anchored_seq"], seq);
    assert!(ops.lock().unwrap().is_empty(), "a target without audit_anchors got {:?}", ops.lock().unwrap());
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}

/// Issue 46 point 11: a webhook answering 307 to an internal URL got the
/// notification's body POSTed there, while the audit said "200 ok". A
/// redirect is never followed now: the delivery is audited as what it was
/// (HTTP 307, failed) and the internal URL receives nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_never_follows_a_redirect() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(dir.path(), "w1", SimConfig { gpus: 1, ..SimConfig::default() }, "").await;
    let (internal_url, internal) = receiver(0).await;
    let redirector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirect_url = format!("http://{}/hook", redirector.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = redirector.accept().await {
            let internal_url = internal_url.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = s.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: {internal_url}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    let cfg = engine_setup(
        dir.path(),
        &[&agent],
        &[("tell", "trigger: {type: manual}\nscope: gpu\n", "notify(\"heads up\");\n")],
        &format!("notifications:\n  webhooks:\n\x20   - {{name: ops, url: '{redirect_url}', max_attempts: 1}}\n"),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    assert!(eventually(20, || (engine.gauges().agents_connected == 1).then_some(())).await.is_some());
    engine.submit(manual_run("tell", Target::gpu("w1", 0))).await.unwrap();
    let d = eventually(20, || {
        engine.audit().tail(0, usize::MAX).unwrap().into_iter().find(|r| r.kind == RecordKind::NotificationDelivery)
    })
    .await
    .expect("a delivery record");
    assert_eq!((d.data["ok"].clone(), d.data["detail"].as_str()), (false.into(), Some("HTTP 307")), "{:?}", d.data);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(internal.lock().unwrap().is_empty(), "the body went to the redirect's target");
    engine.shutdown().await;
    let mut agent = agent;
    agent.stop().await;
}
