//! The load scenario 5 of `nightshift-bench` puts on a store, here so that
//! the bench and the crate's own harness (`examples/appends.rs`) measure
//! the same thing: `writers` tasks, each appending `per_writer` notes and
//! awaiting every append (durable on return).

use std::time::Instant;

use serde_json::json;

use crate::store::AuditStore;
use crate::{AuditError, NewRecord, RecordKind};

/// Durable appends per second from `writers` tasks spawned on the current
/// tokio runtime, each appending `per_writer` records and awaiting every
/// one. `keyed`: each record about a run and a node, as the engine's are
/// (two more index keys each). The first failed append is the error.
pub async fn appends_per_sec(
    store: &AuditStore,
    writers: usize,
    per_writer: usize,
    keyed: bool,
) -> Result<f64, AuditError> {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_writer {
                let mut rec = NewRecord::new(
                    RecordKind::Note,
                    "bench",
                    json!({"writer": w, "i": i, "text": "a durable record of what happened"}),
                );
                if keyed {
                    rec = rec.run(&format!("bench-{w}-{}", i / 10)).node(Some(&format!("node{:03}", i % 100)));
                }
                s.append(rec, None).await?;
            }
            Ok::<_, AuditError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| AuditError::Write(format!("a writer task of the load panicked or was cancelled: {e}")))??;
    }
    Ok(writers as f64 * per_writer as f64 / t.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nightshift_proto::clock::SystemClock;

    use super::*;

    /// Every append of the load is in the store, in one chain that
    /// verifies, and the keyed load names a run and a node in each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_load_appends_every_record_durably() {
        for keyed in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = AuditStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
            let rate = appends_per_sec(&store, 4, 25, keyed).await.unwrap();
            assert!(rate.is_finite() && rate > 0.0, "a rate, found {rate}");
            assert_eq!(store.head_seq(), 100);
            let last = store.get(100).unwrap().unwrap();
            assert_eq!((last.run.is_some(), last.node.is_some()), (keyed, keyed));
            assert!(store.verify().unwrap().ok);
        }
    }

    /// A store that fails mid-load ends the load with its error, not a
    /// rate: the log's first write fails, and so does every later append.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_store_ends_the_load_with_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = AuditStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
        crate::log::FAIL_NEXT_APPEND.lock().unwrap().push(dir.path().join(crate::LOG_FILE));
        match appends_per_sec(&store, 4, 25, false).await {
            Err(AuditError::Write(m)) => assert!(m.contains("injected write failure"), "the log's error, found {m:?}"),
            other => panic!("expected the store's write error, found {other:?}"),
        }
        assert!(store.stopped().is_some(), "the store says it stopped");
    }
}
