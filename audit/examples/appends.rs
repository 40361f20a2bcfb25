//! Scenario 5 on the audit crate alone: durable appends per second from
//! tokio tasks that each await every append — the load `nightshift-bench
//! --only 5` times (`tools/load.rs`) — without building the harness (a release
//! build of this crate takes minutes, the harness's about fifteen). For trying
//! a change to the write path: alternate two builds one run at a time,
//! since this VM's fdatasync rate moves ±25 % between minutes
//! (docs/BENCHMARKS.md).
//!
//! ```text
//! cargo run --release -p nightshift-audit --example appends -- [WRITERS [PER_WRITER [RUNS]]] [--keyed] [--no-verify]
//! ```
//!
//! Defaults: 64 writers, 2,000 records each, 3 runs, each run on a fresh
//! store under `$TMPDIR`. `--keyed` names a run and a node in every record
//! (two sled keys each, as the engine's records); `--no-verify` skips the
//! chain check after each run (it reads every record back, which takes
//! longer than the appends).

use std::error::Error;
use std::sync::Arc;

use nightshift_audit::AuditStore;
use nightshift_audit::tools::load::appends_per_sec;
use nightshift_proto::clock::SystemClock;

struct Args {
    writers: usize,
    per_writer: usize,
    runs: usize,
    keyed: bool,
    verify: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args { writers: 64, per_writer: 2000, runs: 3, keyed: false, verify: true };
    let mut numbers = 0;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--keyed" => a.keyed = true,
            "--no-verify" => a.verify = false,
            n => {
                let v: usize = n
                    .parse()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("expected a positive whole number or a flag, found {n:?}"))?;
                match numbers {
                    0 => a.writers = v,
                    1 => a.per_writer = v,
                    2 => a.runs = v,
                    _ => {
                        return Err(format!("expected at most three numbers (writers, per writer, runs), found {n:?}"));
                    }
                }
                numbers += 1;
            }
        }
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("appends: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let a = args().map_err(|e| format!("{e}\nusage: appends [WRITERS [PER_WRITER [RUNS]]] [--keyed] [--no-verify]"))?;
    let rt = tokio::runtime::Runtime::new()?;
    let mut rates = Vec::new();
    for _ in 0..a.runs {
        let tmp = tempfile::Builder::new().prefix("nightshift-appends").tempdir()?;
        let store = AuditStore::open(tmp.path(), Arc::new(SystemClock))?;
        let rate = rt.block_on(appends_per_sec(&store, a.writers, a.per_writer, a.keyed))?;
        if a.verify && !store.verify()?.ok {
            return Err("the chain does not verify".into());
        }
        rates.push(rate);
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{} writer(s){}: median {:.0} records/s (runs: {})",
        a.writers,
        if a.keyed { ", keyed" } else { "" },
        sorted[sorted.len() / 2],
        rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}
