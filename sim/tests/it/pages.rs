//! Invariant 19, a page is never silently lost: a page its target cannot
//! take is kept in the durable outbox, retried on the engine's clock
//! across an engine restart until the target is back, and given up only
//! after `notifications.page_expiry_secs` — recorded `undeliverable` and
//! counted. A second route (`fallback`) takes a page the first could not.
//! The receiver is real HTTP on loopback; "down" is its port refusing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use nightshift_engine::audit::RecordKind;
use nightshift_engine::config::{NotificationsConfig, WebhookFormat, WebhookTarget};
use nightshift_engine::runs::Target;
use nightshift_sim::fleet::SimFleet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nothing listens on (yet).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An HTTP receiver on `port` that answers 200 and keeps each body.
async fn receiver_on(port: u16) -> Arc<Mutex<Vec<serde_json::Value>>> {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let got: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let g = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(k) = s.read(&mut chunk).await {
                if k == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..k]);
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        if let Ok(v) = serde_json::from_slice(&buf[end + 4..end + 4 + len]) {
                            g.lock().unwrap().push(v);
                        }
                        break;
                    }
                }
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        }
    });
    got
}

fn target(name: &str, port: u16) -> WebhookTarget {
    WebhookTarget {
        name: name.into(),
        url: format!("http://127.0.0.1:{port}/hook"),
        format: WebhookFormat::Generic,
        escalations_only: false,
        timeout_secs: 2,
        max_attempts: 1,
        dry_runs: false,
        audit_anchors: false,
        firing_secs: 3600,
        fallback: None,
    }
}

async fn start_with(targets: Vec<WebhookTarget>, expiry_secs: u64) -> (Sim, tempfile::TempDir) {
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "page",
        "trigger:\n  type: manual\nscope: gpu\ncooldown_secs: 0\n",
        "escalate(`GPU ${target.gpu} on ${target.node} needs a person`);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |o| {
        o.notifications =
            NotificationsConfig { webhooks: targets, page_expiry_secs: expiry_secs, ..Default::default() };
    })
    .await;
    (sim, rb)
}

/// Step `secs` of virtual time, letting the spawned deliveries (real HTTP)
/// land between steps.
async fn pass(f: &SimFleet, secs: u64) {
    for _ in 0..secs {
        f.step().await.unwrap();
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn deliveries(f: &SimFleet) -> Vec<serde_json::Value> {
    f.engine
        .audit()
        .tail(0, usize::MAX)
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RecordKind::NotificationDelivery)
        .map(|r| r.data)
        .collect()
}

/// Step until `cond` holds (at most `secs` virtual seconds, 50 ms of real
/// time after each 10).
async fn until(f: &SimFleet, secs: u64, mut cond: impl FnMut(&SimFleet) -> bool) -> bool {
    for _ in 0..secs / 10 {
        if cond(f) {
            return true;
        }
        pass(f, 10).await;
    }
    cond(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_outlives_its_pagers_outage_and_an_engine_restart() {
    let port = closed_port();
    let (mut sim, _rb) = start_with(vec![target("pager", port)], 21_600).await;
    let id = run_id(&sim.fleet.engine.submit(manual("page", Target::gpu("n1", 1), "user:alice")).await.unwrap());
    until_finished(&sim.fleet, &id, 60).await;
    assert!(
        until(&sim.fleet, 60, |f| deliveries(f).iter().any(|d| d["pending"] == true)).await,
        "the first failure is recorded as pending: {:?}",
        deliveries(&sim.fleet)
    );
    assert_eq!(sim.fleet.engine.gauges().pages(), (1, 0));
    // Down for five minutes, and the engine restarts meanwhile.
    pass(&sim.fleet, 150).await;
    sim.fleet.restart_engine().await.unwrap();
    assert_eq!(sim.fleet.engine.gauges().pages(), (1, 0), "rebuilt from the audit log");
    pass(&sim.fleet, 150).await;
    let got = receiver_on(port).await;
    // Back: the page lands within one pause (at most five minutes).
    let f = &sim.fleet;
    let delivered = |f: &SimFleet| deliveries(f).iter().any(|d| d["ok"] == true);
    assert!(
        until(f, 330, |f| !got.lock().unwrap().is_empty() && delivered(f)).await,
        "never delivered: {:?}",
        deliveries(f)
    );
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "one page, once: {got:?}");
    assert_eq!(got[0]["run"], id.as_str());
    assert!(got[0]["text"].as_str().unwrap().contains("GPU 1 on n1 needs a person"), "{got:?}");
    let ok = deliveries(f).into_iter().find(|d| d["ok"] == true).expect("the delivery is recorded");
    assert!(ok["attempts"].as_u64().unwrap() > 2, "{ok}");
    assert_eq!(f.engine.gauges().pages(), (0, 0));
    assert!(f.engine.verify().unwrap().ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_never_delivered_is_recorded_undeliverable_and_counted() {
    let port = closed_port();
    let (sim, _rb) = start_with(vec![target("pager", port)], 600).await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("page", Target::gpu("n1", 1), "user:alice")).await.unwrap());
    until_finished(f, &id, 60).await;
    assert!(
        until(f, 900, |f| f.engine.gauges().pages() == (0, 1)).await,
        "not given up: {:?} {:?}",
        f.engine.gauges().pages(),
        deliveries(f)
    );
    let gave_up: Vec<_> = deliveries(f).into_iter().filter(|d| d["undeliverable"] == true).collect();
    assert_eq!(gave_up.len(), 1, "{gave_up:?}");
    assert!(gave_up[0]["attempts"].as_u64().unwrap() >= 4, "{gave_up:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_the_first_route_cannot_take_goes_by_the_second() {
    let (down, up) = (closed_port(), closed_port());
    let got = receiver_on(up).await;
    let first = WebhookTarget { fallback: Some("phone".into()), escalations_only: true, ..target("pager", down) };
    let (sim, _rb) = start_with(vec![first, target("phone", up)], 21_600).await;
    let f = &sim.fleet;
    let id = run_id(&f.engine.submit(manual("page", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    until_finished(f, &id, 60).await;
    // `phone` takes every page itself and, as the fallback, the one `pager`
    // could not: twice, the second marked as such by its record.
    let phone_ok = |f: &SimFleet| deliveries(f).iter().filter(|d| d["target"] == "phone" && d["ok"] == true).count();
    assert!(until(f, 60, |f| got.lock().unwrap().len() >= 2 && phone_ok(f) >= 2).await, "{:?}", deliveries(f));
    let ds = deliveries(f);
    assert!(ds.iter().any(|d| d["target"] == "pager" && d["pending"] == true), "{ds:?}");
    assert_eq!(ds.iter().filter(|d| d["target"] == "phone" && d["ok"] == true).count(), 2, "{ds:?}");
    assert_eq!(f.engine.gauges().pages(), (1, 0), "the first route is still retried");
}

/// Invariant 19, a page's life follows its fault: an escalation's page is
/// open until a run handles its target (or a person takes over, or it is
/// repaired); a notice about the node meanwhile is marked as its follow-up;
/// the handling run's end resolves the page, through the same outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_ends_when_its_fault_is_handled_and_its_follow_up_is_marked() {
    let port = closed_port();
    let got = receiver_on(port).await;
    let rb = tempfile::tempdir().unwrap();
    write_runbook(
        rb.path(),
        "stuck",
        "trigger:\n  type: manual\nscope: gpu\ncooldown_secs: 0\n",
        "escalate(`GPU ${target.gpu} on ${target.node} could not be drained: drain it by hand`);\n",
    );
    write_runbook(
        rb.path(),
        "handle",
        "trigger:\n  type: manual\nscope: gpu\ncooldown_secs: 0\n",
        "set_power_limit(450);\nnotify(`GPU ${target.gpu} capped at 450 W: reset it when its job ends`);\n",
    );
    let sim = start(vec![node("n1", "h100-sxm")], rb.path(), |o| {
        o.notifications = NotificationsConfig { webhooks: vec![target("pager", port)], ..Default::default() };
    })
    .await;
    let f = &sim.fleet;
    let stuck = run_id(&f.engine.submit(manual("stuck", Target::gpu("n1", 1), "user:alice")).await.unwrap());
    until_finished(f, &stuck, 60).await;
    assert!(until(f, 60, |_| got.lock().unwrap().len() == 1).await);
    let recs = || f.engine.audit().tail(0, usize::MAX).unwrap();
    let page = recs().into_iter().find(|r| r.kind == RecordKind::Escalation).unwrap();
    // A run on another GPU handles nothing of this page.
    let other = run_id(&f.engine.submit(manual("handle", Target::gpu("n1", 0), "user:alice")).await.unwrap());
    until_finished(f, &other, 60).await;
    assert!(!recs().iter().any(|r| r.data["resolves"] == page.seq), "another GPU's run resolved the page");
    let handle = run_id(&f.engine.submit(manual("handle", Target::gpu("n1", 1), "user:alice")).await.unwrap());
    until_finished(f, &handle, 60).await;
    let all = recs();
    let follow = all
        .iter()
        .find(|r| r.kind == RecordKind::Notification && r.run.as_deref() == Some(handle.as_str()))
        .expect("the handling run's notice");
    assert_eq!(follow.data["follows"], page.seq, "{follow:?}");
    let resolution = all
        .iter()
        .find(|r| r.kind == RecordKind::Notification && r.data["resolves"] == page.seq)
        .expect("the page is resolved");
    assert_eq!(resolution.run.as_deref(), Some(stuck.as_str()), "the resolution is on the page's own run");
    assert!(resolution.data["text"].as_str().unwrap().contains(&format!("handled by run {handle}")), "{resolution:?}");
    // The person heard all of it: the page, the other run's and the
    // handling run's notices, the resolution.
    assert!(until(f, 60, |_| got.lock().unwrap().len() == 4).await, "{:?}", got.lock().unwrap());
    let texts: Vec<String> =
        got.lock().unwrap().iter().map(|b| b["text"].as_str().unwrap_or_default().to_string()).collect();
    assert!(texts[3].starts_with("resolved: handled by run"), "{texts:?}");
    // Resolved once: a second handling run resolves nothing more.
    let again = run_id(&f.engine.submit(manual("handle", Target::gpu("n1", 1), "user:alice")).await.unwrap());
    until_finished(f, &again, 60).await;
    assert_eq!(recs().iter().filter(|r| r.data["resolves"] == page.seq).count(), 1);
}
