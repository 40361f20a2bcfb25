//! Scenario fixtures: every file in `fixtures/scenarios/valid` loads (and
//! its param overrides resolve); every file in `invalid` is refused with
//! exactly the message in its `.err` file (file:line:column: what was
//! expected and found) — when it loads, or, for what needs the runbooks
//! (param overrides), when it runs. `NIGHTSHIFT_BLESS=1` rewrites the
//! `.err` files after an intended change. The same for fault mixes
//! (`fixtures/faults`, `nightshift simulate --faults`).

use std::path::{Path, PathBuf};

use nightshift_sim::scenario::{Scenario, run, scenario_files};
use nightshift_sim::simulate::mix::FaultMix;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scenarios")
}

fn runbooks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_scenarios_load_and_run() {
    let files = scenario_files(&fixtures().join("valid"));
    assert!(files.len() >= 3);
    for f in files {
        Scenario::load(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let r = run(&f, &runbooks()).await.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(r.passed, "{}: {:?}", f.display(), r.failures);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_scenarios_are_refused_with_the_exact_message() {
    let dir = fixtures().join("invalid");
    let bless = std::env::var("NIGHTSHIFT_BLESS").is_ok();
    let files = scenario_files(&dir);
    assert!(files.len() >= 16, "found {}", files.len());
    let mut failures = Vec::new();
    for path in files {
        let got = match Scenario::load(&path) {
            Err(e) => e.to_string(),
            Ok(_) => match run(&path, &runbooks()).await {
                Err(e) => e.to_string(),
                Ok(r) => {
                    failures.push(format!(
                        "{}: ran ({} failures) instead of being refused",
                        path.display(),
                        r.failures.len()
                    ));
                    continue;
                }
            },
        };
        let got = got.replace(&format!("{}/", dir.display()), "");
        check_golden(&path, &got, bless, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn mixes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/faults")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

/// Every valid fault mix loads, and so does every shipped one in
/// `examples/faults`.
#[test]
fn valid_and_shipped_fault_mixes_load() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/faults");
    let files: Vec<PathBuf> = yaml_files(&mixes().join("valid")).into_iter().chain(yaml_files(&shipped)).collect();
    assert!(files.len() >= 3, "found {}", files.len());
    for f in files {
        let m = FaultMix::load(&f).unwrap_or_else(|e| panic!("{e}"));
        assert!(!m.classes.is_empty(), "{}", f.display());
    }
}

/// Every invalid fault mix is refused with exactly the message in its
/// `.err` file (file:line:column, expected and found).
#[test]
fn invalid_fault_mixes_are_refused_with_the_exact_message() {
    let dir = mixes().join("invalid");
    let bless = std::env::var("NIGHTSHIFT_BLESS").is_ok();
    let files = yaml_files(&dir);
    assert!(files.len() >= 20, "found {}", files.len());
    let mut failures = Vec::new();
    for path in files {
        let got = match FaultMix::load(&path) {
            Err(e) => e.to_string().replace(&format!("{}/", dir.display()), ""),
            Ok(_) => {
                failures.push(format!("{}: loaded instead of being refused", path.display()));
                continue;
            }
        };
        check_golden(&path, &got, bless, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `got` against the `.err` file beside `path` (rewritten instead with
/// `NIGHTSHIFT_BLESS=1`); a difference is added to `failures`.
fn check_golden(path: &Path, got: &str, bless: bool, failures: &mut Vec<String>) {
    let expect_path = path.with_extension("err");
    if bless {
        std::fs::write(&expect_path, format!("{got}\n")).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&expect_path)
        .unwrap_or_else(|_| panic!("{} is missing (run with NIGHTSHIFT_BLESS=1)", expect_path.display()));
    if got != want.trim_end() {
        failures.push(format!("{}:\n  got  {got}\n  want {}", path.display(), want.trim_end()));
    }
}
