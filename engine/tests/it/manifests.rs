//! Manifest fixtures: every file in `fixtures/manifests/valid` loads; every
//! file in `invalid` fails with exactly the message in its `.err` file
//! (file:line:column: what was expected and found). Set
//! `NIGHTSHIFT_BLESS=1` to rewrite the `.err` files after an intended change.

use std::path::{Path, PathBuf};

use nightshift_engine::embed::{ScriptLimits, build_engine};
use nightshift_engine::embed::{load_dir, load_file};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/manifests")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

#[test]
fn valid_manifests_load() {
    let engine = build_engine(&ScriptLimits::default());
    let set = load_dir(&fixtures().join("valid"), &engine);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    assert_eq!(set.runbooks.len(), yaml_files(&fixtures().join("valid")).len());
}

#[test]
fn invalid_manifests_fail_with_the_exact_message() {
    let engine = build_engine(&ScriptLimits::default());
    let dir = fixtures().join("invalid");
    let bless = std::env::var("NIGHTSHIFT_BLESS").is_ok();
    let mut failures = Vec::new();
    for path in yaml_files(&dir) {
        let err = load_file(&path, &engine).expect_err(&format!("{} should not load", path.display()));
        let got = err.to_string().replace(&format!("{}/", dir.display()), "");
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

#[test]
fn a_folder_reports_every_bad_file() {
    let engine = build_engine(&ScriptLimits::default());
    let set = load_dir(&fixtures().join("invalid"), &engine);
    assert!(set.runbooks.is_empty());
    assert_eq!(set.errors.len(), yaml_files(&fixtures().join("invalid")).len());
    for e in &set.errors {
        assert!(e.line >= 1 && e.column >= 1, "{e}");
    }
}
