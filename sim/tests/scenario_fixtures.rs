//! Scenario fixtures: every file in `fixtures/scenarios/valid` loads (and
//! its param overrides resolve); every file in `invalid` is refused with
//! exactly the message in its `.err` file (file:line:column: what was
//! expected and found) — when it loads, or, for what needs the runbooks
//! (param overrides), when it runs. `NIGHTSHIFT_BLESS=1` rewrites the
//! `.err` files after an intended change.

use std::path::{Path, PathBuf};

use nightshift_sim::scenario::{Scenario, run, scenario_files};

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
        let expect_path = path.with_extension("err");
        if bless {
            std::fs::write(&expect_path, format!("{got}\n")).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expect_path)
            .unwrap_or_else(|_| panic!("{} is missing (run with NIGHTSHIFT_BLESS=1)", expect_path.display()));
        if got != want.trim_end() {
            failures.push(format!("{}:\n  got  {got}\n  want {}", path.display(), want.trim_end()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
