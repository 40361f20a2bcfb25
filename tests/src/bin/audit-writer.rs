//! The child process of the audit kill -9 test (`tests/tests/it/audit_kill.rs`):
//! opens the audit store in DIR, appends records from eight tasks as fast as
//! it can, and prints `ack SEQ HASH` for every append that returned — that
//! is, every record the store acknowledged as durable — until it is killed.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nightshift_engine::audit::{AuditStore, NewRecord, RecordKind};
use nightshift_proto::clock::SystemClock;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: audit-writer DIR");
        std::process::exit(2);
    };
    let store = match AuditStore::open(&dir, Arc::new(SystemClock)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("audit-writer: {e}");
            std::process::exit(3);
        }
    };
    let out = Arc::new(Mutex::new(std::io::stdout()));
    {
        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(o, "open {}", store.head_seq());
        let _ = o.flush();
    }
    let mut tasks = Vec::new();
    for w in 0..8u32 {
        let (s, out) = (store.clone(), out.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0u64.. {
                // Vary the size and the indexes touched (run, node).
                let rec = NewRecord::new(
                    RecordKind::Note,
                    "test:audit-writer",
                    serde_json::json!({"w": w, "i": i, "pad": "x".repeat((i as usize * 37) % 700)}),
                )
                .run(&format!("r{w}-{}", i / 10))
                .node(Some(&format!("n{}", i % 5)));
                match s.append(rec, None).await {
                    Ok(r) => {
                        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(o, "ack {} {}", r.seq, r.hash);
                        let _ = o.flush();
                    }
                    Err(e) => {
                        eprintln!("audit-writer: append: {e}");
                        std::process::exit(4);
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}
