//! `nightshift audit follow` against a live tail that misbehaves the way
//! networks do: a multi-byte character ("°", "→") split across TCP writes,
//! and the connection dropped mid-tail. Every record is printed whole, once,
//! in order: the client resumes with `Last-Event-ID`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn record(seq: u64, text: &str) -> String {
    serde_json::json!({
        "seq": seq, "ts_ms": 1_790_000_000_000i64 + seq as i64, "kind": "note", "run": "r000001-abcdef",
        "node": "g1", "gpu": null, "runbook": "cap", "actor": "engine", "data": {"text": text},
        "prev_hash": "0".repeat(64), "hash": "1".repeat(64)
    })
    .to_string()
}

#[test]
fn a_split_character_and_a_dropped_stream_lose_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (seen_tx, seen_rx) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let mut s = conn.unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut b).unwrap() == 0 {
                    break;
                }
                head.push(b[0]);
            }
            let head = String::from_utf8_lossy(&head).to_lowercase();
            let last_id = head.lines().find_map(|l| l.strip_prefix("last-event-id:").map(|v| v.trim().to_string()));
            seen_tx.send(last_id).unwrap();
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
            if n == 0 {
                // Record 1, its "°" split between two writes; then record 2
                // and a drop.
                let ev = format!("id: 1\nevent: note\ndata: {}\n\n", record(1, "GPU at 91 °C → capped"));
                let cut = ev.find('°').unwrap() + 1; // inside the two bytes of "°"
                s.write_all(&ev.as_bytes()[..cut]).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(300));
                s.write_all(&ev.as_bytes()[cut..]).unwrap();
                s.write_all(format!("id: 2\nevent: note\ndata: {}\n\n", record(2, "second")).as_bytes()).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(300));
                // Dropped here.
            } else {
                s.write_all(format!("id: 3\nevent: note\ndata: {}\n\n", record(3, "after the drop")).as_bytes())
                    .unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_secs(30));
            }
        }
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(["--server", &url, "--token", "t", "audit", "follow"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    while got.len() < 3 {
        match lines.next() {
            Some(Ok(l)) => got.push(l),
            _ => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].contains("note: GPU at 91 °C → capped"), "{got:?}");
    assert!(got[1].contains("note: second"), "{got:?}");
    assert!(got[2].contains("note: after the drop"), "{got:?}");
    assert_eq!(seen_rx.recv().unwrap(), None, "the first connection sends no Last-Event-ID");
    assert_eq!(seen_rx.recv().unwrap().as_deref(), Some("2"), "the reconnect resumes after record 2");
}
