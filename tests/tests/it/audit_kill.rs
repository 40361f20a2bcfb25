//! Sled durability under kill -9: a child process appends audit records in a
//! burst and is killed at a random point; every record it was told is
//! durable must be there, byte for byte (same hash), the store must reopen
//! and the chain verify. `NIGHTSHIFT_AUDIT_KILL_ITERATIONS` sets the count
//! (CI: 100; the documented long run: 1000).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nightshift_engine::audit::AuditStore;
use nightshift_proto::clock::SystemClock;

fn iterations() -> usize {
    std::env::var("NIGHTSHIFT_AUDIT_KILL_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

/// A small deterministic generator (the seed is printed on failure).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn acknowledged_audit_records_survive_kill_9() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let seed = std::env::var("NIGHTSHIFT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    let mut rng = Lcg(seed);
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    let (mut kills, mut during_open) = (0usize, 0usize);
    let n = iterations();
    let started = Instant::now();
    for it in 0..n {
        let mut child = Command::new(env!("CARGO_BIN_EXE_audit-writer"))
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Kill at a random point: one time in ten while it opens the store,
        // otherwise somewhere in the first 40 ms of the burst.
        let while_opening = rng.next().is_multiple_of(10);
        let delay = Duration::from_micros(rng.next() % if while_opening { 20_000 } else { 40_000 });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        if !while_opening {
            let end = Instant::now() + Duration::from_secs(20);
            while let Ok(l) = rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                let open = l.starts_with("open ");
                lines.push(l);
                if open {
                    break;
                }
            }
        }
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        kills += 1;
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(
            status.code().is_none() && !stderr.contains("audit-writer:"),
            "iteration {it} (seed {seed}): the writer failed on its own: {status} {stderr}"
        );
        if !lines.iter().any(|l| l.starts_with("open ")) {
            during_open += 1;
        }
        for l in &lines {
            // A line cut by the kill has no hash; it was never complete.
            let mut p = l.split(' ');
            if let (Some("ack"), Some(seq), Some(hash)) = (p.next(), p.next(), p.next())
                && hash.len() == 64
            {
                acked.insert(seq.parse().unwrap(), hash.to_string());
            }
        }
        let store = AuditStore::open(dir.path(), Arc::new(SystemClock))
            .unwrap_or_else(|e| panic!("iteration {it} (seed {seed}): the store does not reopen: {e}"));
        let report = store.verify().unwrap();
        assert!(report.ok, "iteration {it} (seed {seed}): chain broken: {report:?}");
        for (seq, hash) in acked.range(acked.keys().next_back().map_or(0, |m| m.saturating_sub(2_000))..) {
            let r = store.get(*seq).unwrap().unwrap_or_else(|| {
                panic!("iteration {it} (seed {seed}): acknowledged record {seq} is gone (head {})", store.head_seq())
            });
            assert_eq!(&r.hash, hash, "iteration {it} (seed {seed}): record {seq} changed");
        }
        drop(store);
    }
    // A final full check of every acknowledged record.
    let store = AuditStore::open(dir.path(), Arc::new(SystemClock)).unwrap();
    for (seq, hash) in &acked {
        assert_eq!(store.get(*seq).unwrap().map(|r| r.hash).as_ref(), Some(hash), "record {seq} (seed {seed})");
    }
    let report = store.verify().unwrap();
    assert!(report.ok);
    eprintln!(
        "audit kill -9: {kills} kills ({during_open} before the store was open), {} acknowledged records all present, \
         {} records in the chain, seed {seed}, {:.1} s",
        acked.len(),
        store.head_seq(),
        started.elapsed().as_secs_f64()
    );
}
