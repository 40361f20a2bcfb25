//! The live tail: resumes after Last-Event-ID with no gap and no duplicate,
//! and ends cleanly when the engine shuts down.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use nightshift_engine::audit::{NewRecord, RecordKind};
use nightshift_engine::config::AuthConfig;
use nightshift_engine::embed::RunbookSet;
use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_sim::fleet::{SimFleet, SimFleetOptions, SimNodeSpec, scratch_dir};
use serde_json::json;
use tower::ServiceExt;

async fn sim() -> (SimFleet, tempfile::TempDir) {
    let node = SimNodeSpec::new("n1", "h100-sxm", 1);
    let mut opts =
        SimFleetOptions::new(vec![node], RunbookSet::default(), Arc::new(build_engine(&ScriptLimits::default())));
    opts.auth = AuthConfig { allow_anonymous: Some(nightshift_engine::config::Role::Viewer), ..Default::default() };
    let dir = scratch_dir().unwrap();
    (SimFleet::start(opts, dir.path()).await.unwrap(), dir)
}

/// Read SSE events (id, event) from a body until `n` are seen or it ends.
async fn read_events(body: &mut Body, n: usize) -> (Vec<(u64, String)>, bool) {
    let mut buf = String::new();
    let mut out = Vec::new();
    loop {
        if out.len() >= n {
            return (out, false);
        }
        let frame =
            tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await.expect("an event in time");
        let Some(frame) = frame else { return (out, true) };
        let frame = frame.unwrap();
        if let Some(data) = frame.data_ref() {
            buf.push_str(&String::from_utf8_lossy(data));
        }
        while let Some(i) = buf.find("\n\n") {
            let ev: String = buf.drain(..i + 2).collect();
            let id = ev.lines().find_map(|l| l.strip_prefix("id:")).map(|s| s.trim().parse::<u64>().unwrap());
            let kind = ev.lines().find_map(|l| l.strip_prefix("event:")).map(|s| s.trim().to_string());
            if let (Some(id), Some(kind)) = (id, kind) {
                out.push((id, kind));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_without_gaps_or_duplicates_and_ends_on_shutdown() {
    let (sim, _dir) = sim().await;
    let engine = sim.engine.clone();
    for i in 0..30 {
        engine.audit().append(NewRecord::new(RecordKind::Note, "engine", json!({"i": i})), None).await.unwrap();
    }
    let head = engine.audit().head_seq();
    // Resume after record 10: 11, 12, … with nothing skipped or repeated,
    // then live records as they come.
    let req =
        Request::builder().uri("/api/v1/events/stream").header("last-event-id", "10").body(Body::empty()).unwrap();
    let resp = nightshift_web::router(engine.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = resp.into_body();
    let (first, _) = read_events(&mut body, (head - 10) as usize).await;
    let ids: Vec<u64> = first.iter().map(|e| e.0).collect();
    assert_eq!(ids, (11..=head).collect::<Vec<_>>());
    // Live: appended while the stream is open, in a burst larger than the
    // broadcast buffer could lose.
    let e2 = engine.clone();
    let writer = tokio::spawn(async move {
        for i in 0..200 {
            e2.audit().append(NewRecord::new(RecordKind::Note, "engine", json!({"live": i})), None).await.unwrap();
        }
    });
    let (live, _) = read_events(&mut body, 200).await;
    writer.await.unwrap();
    let ids: Vec<u64> = live.iter().map(|e| e.0).collect();
    assert_eq!(ids, (head + 1..=head + 200).collect::<Vec<_>>(), "gap-free and duplicate-free");
    assert!(live.iter().all(|(_, k)| k == "note"));
    // ?after_seq= works like Last-Event-ID.
    let req =
        Request::builder().uri(format!("/api/v1/events/stream?after_seq={}", head + 198)).body(Body::empty()).unwrap();
    let resp = nightshift_web::router(engine.clone()).oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    let (tail, _) = read_events(&mut body, 2).await;
    assert_eq!(tail.iter().map(|e| e.0).collect::<Vec<_>>(), vec![head + 199, head + 200]);

    // Shutdown ends the stream.
    engine.shutdown().await;
    let (_, ended) = read_events(&mut body, usize::MAX).await;
    assert!(ended, "the stream ends on shutdown");
}
