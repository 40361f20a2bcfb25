//! The handbook: every scenario in `runbooks/scenarios` runs against the
//! runbooks in `runbooks/` on a simulated fleet in virtual time and must pass.
//! (How fast they run is measured by `nightshift-bench`, not asserted here.)

use std::path::Path;

use nightshift_sim::scenario::{run, scenario_files};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_handbook_scenario_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let files = scenario_files(&root.join("scenarios"));
    assert!(files.len() >= 12, "found {} scenarios", files.len());
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for f in &files {
        let r = run(f, &root).await.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        eprintln!(
            "{:<36} {:<4} {:<5} {:>6} s virtual {:>6} ms wall  {} actions",
            r.name,
            r.handbook.clone().unwrap_or_default(),
            if r.passed { "pass" } else { "FAIL" },
            r.virtual_secs,
            r.wall_ms,
            r.actions.len()
        );
        if !r.passed {
            for a in &r.actions {
                eprintln!(
                    "    {:>7.0}s {} {} {}{} {}",
                    a.t_secs,
                    a.runbook,
                    a.op,
                    a.node,
                    a.gpu.map(|g| format!("/gpu{g}")).unwrap_or_default(),
                    a.outcome
                );
            }
            for run in &r.runs {
                eprintln!("    run {} {} {}", run.0, run.1, run.2);
            }
            failed.push(format!("{}: {}", r.name, r.failures.join("; ")));
        }
    }
    eprintln!("{} scenarios in {:?}", files.len(), started.elapsed());
    assert!(failed.is_empty(), "\n{}", failed.join("\n"));
}

#[test]
fn the_handbook_is_complete_and_documented() {
    use nightshift_sim::scenario::{Scenario, load_runbooks};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let (set, _) = load_runbooks(&root);
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let scenarios: Vec<Scenario> =
        scenario_files(&root.join("scenarios")).iter().map(|f| Scenario::load(f).unwrap()).collect();
    for row in 1..=12 {
        let h = format!("H{row}");
        assert!(set.runbooks.iter().any(|r| r.manifest.rows().contains(&h.as_str())), "no runbook for {h}");
        assert!(scenarios.iter().any(|s| s.handbook.as_deref() == Some(h.as_str())), "no scenario for {h}");
    }
    for rb in &set.runbooks {
        let name = &rb.manifest.name;
        assert!(readme.contains(&format!("`{name}`")), "runbooks/README.md does not list {name}");
        let row = rb.manifest.handbook.clone().unwrap_or_else(|| panic!("{name} names no handbook row"));
        assert!(
            rb.script_source.starts_with(&format!("// {row}")),
            "{name}: the script must open with a comment naming its row ({row})"
        );
        // Named on purpose: a scenario that loads every runbook does not
        // count as a test of each.
        let tested = scenarios.iter().any(|s| {
            s.runbooks.as_ref().is_some_and(|l| l.contains(name)) || s.expect.runs.iter().any(|r| &r.runbook == name)
        });
        assert!(tested, "no scenario names {name}");
    }
}

/// `runbooks/alerts/` answers every paging rule of
/// `examples/prometheus-rules.yml` with its row's runbook, and names only
/// alerts those rules define; every row but H4 (a pool decision) has one.
#[test]
fn every_paging_rule_has_its_alert_runbook() {
    use nightshift_engine::embed::Trigger;
    use nightshift_sim::scenario::load_runbooks;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (set, _) = load_runbooks(&root.join("runbooks/alerts"));
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("examples/prometheus-rules.yml")).unwrap()).unwrap();
    let gpu_rules: Vec<(String, String)> = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|g| g["name"] == "gpu-faults")
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| (r["alert"].as_str().unwrap().to_string(), r["labels"]["handbook"].as_str().unwrap_or("").to_string()))
        .collect();
    let answered: Vec<(String, Vec<&str>)> = set
        .runbooks
        .iter()
        .map(|r| match &r.manifest.trigger {
            Trigger::Alert { alertname, .. } => (alertname.clone(), r.manifest.rows()),
            other => panic!("{}: an alert variant with a {} trigger", r.manifest.name, other.kind()),
        })
        .collect();
    for (alert, rows) in &answered {
        let rule = gpu_rules.iter().find(|(a, _)| a == alert);
        let (_, row) = rule.unwrap_or_else(|| panic!("runbooks/alerts answers {alert}, which no rule defines"));
        assert!(rows.contains(&row.as_str()), "{alert} is labelled {row}, its runbook is for {rows:?}");
    }
    for (alert, row) in &gpu_rules {
        if row == "H4" {
            continue;
        }
        assert!(answered.iter().any(|(a, _)| a == alert), "no runbook in runbooks/alerts answers {alert} ({row})");
    }
    for row in (1..=12).map(|i| format!("H{i}")).filter(|h| h != "H4") {
        assert!(answered.iter().any(|(_, rows)| rows.contains(&row.as_str())), "no alert variant for {row}");
    }
}

/// One folder serves a Prometheus shop: `runbooks/` starts each telemetry
/// row from its paging rule too (`alert_triggers:`), names only alerts the
/// rules define, for its own row, and keeps the rows only the engine's own
/// triggers give (H3's short-window trend, H4's pool decisions).
#[test]
fn the_main_folder_answers_the_paging_rules_too() {
    use nightshift_sim::scenario::load_runbooks;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (set, _) = load_runbooks(&root.join("runbooks"));
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("examples/prometheus-rules.yml")).unwrap()).unwrap();
    let rule_row = |alert: &str| -> Option<String> {
        rules["groups"].as_sequence()?.iter().flat_map(|g| g["rules"].as_sequence().into_iter().flatten()).find_map(
            |r| {
                (r["alert"].as_str() == Some(alert)).then(|| r["labels"]["handbook"].as_str().unwrap_or("").to_string())
            },
        )
    };
    let mut answered = Vec::new();
    for r in &set.runbooks {
        for (alert, _) in r.manifest.alerts() {
            let row =
                rule_row(alert).unwrap_or_else(|| panic!("{} answers {alert}, which no rule defines", r.manifest.name));
            assert!(
                r.manifest.rows().contains(&row.as_str()),
                "{alert} is labelled {row}; {} is for {:?}",
                r.manifest.name,
                r.manifest.rows()
            );
            answered.push(row);
        }
    }
    // Faults (H8) come from the agent's own telemetry and the durable fault
    // lifecycle; every other row but H4 has its alert here.
    for row in ["H1", "H3", "H5", "H6", "H7", "H9", "H10", "H11", "H12"] {
        assert!(answered.iter().any(|r| r == row), "no runbook in runbooks/ answers {row}'s alert");
    }
    for must in ["gpu-temp-trend", "pool-scale-out", "pool-scale-in"] {
        assert!(set.get(must).is_some(), "runbooks/ keeps {must}");
    }
}

/// Issue-level promise: every row that applies to them is proven on an AMD
/// MI300X and on an NVIDIA B200 (not only on the H100 the rows were first
/// written for). H1's AMD case is H2's own row; H2 is the AMD row.
#[test]
fn every_row_has_an_mi300x_and_a_b200_scenario() {
    use nightshift_sim::scenario::Scenario;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let scenarios: Vec<Scenario> =
        scenario_files(&root.join("scenarios")).iter().map(|f| Scenario::load(f).unwrap()).collect();
    assert!(scenarios.len() >= 45, "{} scenarios", scenarios.len());
    let mut missing = Vec::new();
    for row in 1..=12 {
        let h = format!("H{row}");
        for profile in ["mi300x", "b200"] {
            if (h == "H1" && profile == "mi300x") || (h == "H2" && profile == "b200") {
                continue;
            }
            let has = scenarios
                .iter()
                .any(|s| s.handbook.as_deref() == Some(h.as_str()) && s.fleet.iter().any(|n| n.profile == profile));
            if !has {
                missing.push(format!("{h} on {profile}"));
            }
        }
    }
    assert!(missing.is_empty(), "no scenario for {missing:?}");
}

/// Issue 42 point 7, "a page needs a reason": every shipped runbook has a
/// scenario that bounds what it tells people (an `escalations` or
/// `notifications` range with a maximum), so a row that starts paging more
/// than it should fails a test, not an on-call.
#[test]
fn every_runbook_has_a_scenario_that_counts_its_pages() {
    use nightshift_sim::scenario::Scenario;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let scenarios: Vec<Scenario> =
        scenario_files(&root.join("scenarios")).iter().map(|f| Scenario::load(f).unwrap()).collect();
    let mut runbooks = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            runbooks.push(path.file_stem().unwrap().to_string_lossy().to_string());
        }
    }
    runbooks.sort();
    assert!(runbooks.len() >= 12, "{runbooks:?}");
    let missing: Vec<&String> = runbooks
        .iter()
        .filter(|name| {
            !scenarios.iter().any(|s| {
                s.runbooks.as_ref().is_some_and(|r| r.contains(name))
                    && [&s.expect.escalations, &s.expect.notifications]
                        .iter()
                        .any(|r| r.as_ref().is_some_and(|r| r.max.is_some()))
            })
        })
        .collect();
    assert!(missing.is_empty(), "no scenario bounds the pages of {missing:?}");
}

/// Invariant 18: every shipped runbook that holds a power cap, a fan curve
/// or the chassis fans has a shipped scenario that restarts the engine
/// while its fault persists (the simulated restart is a real one's: no
/// telemetry history, inventory only after the first poll).
#[test]
fn every_runbook_that_holds_cooling_or_power_has_an_engine_restart_scenario() {
    use nightshift_sim::scenario::{Restart, Scenario};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let scenarios: Vec<Scenario> =
        scenario_files(&root.join("scenarios")).iter().map(|f| Scenario::load(f).unwrap()).collect();
    let mut holding = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rhai") {
            let script = std::fs::read_to_string(&path).unwrap();
            if ["set_power_limit(", "set_fan_curve(", "set_chassis_fans("].iter().any(|op| script.contains(op)) {
                holding.push(path.file_stem().unwrap().to_string_lossy().to_string());
            }
        }
    }
    holding.sort();
    assert!(holding.len() >= 3, "{holding:?}");
    let missing: Vec<&String> = holding
        .iter()
        .filter(|name| {
            !scenarios.iter().any(|s| {
                s.runbooks.as_ref().is_some_and(|r| r.contains(name))
                    && s.timeline.iter().any(|e| e.restart == Some(Restart::Engine))
            })
        })
        .collect();
    assert!(missing.is_empty(), "no engine-restart scenario for {missing:?}");
}

/// The workload rows (H6, H7, H9, H10, H12) state in their manifests which
/// signals they decide on and what they fall back to, and their scripts
/// read nothing else (issue 57): a row that starts reading another metric
/// says so where an operator looks, or this fails.
#[test]
fn the_workload_rows_declare_every_signal_they_read() {
    use nightshift_engine::embed::METRICS;
    use nightshift_sim::scenario::load_runbooks;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let mut checked = 0;
    for dir in [root.clone(), root.join("alerts")] {
        let (set, _) = load_runbooks(&dir);
        assert!(set.errors.is_empty(), "{:?}", set.errors);
        for rb in &set.runbooks {
            let m = &rb.manifest;
            if !m.rows().iter().any(|r| ["H6", "H7", "H9", "H10", "H12"].contains(r)) {
                continue;
            }
            checked += 1;
            let sig = m.signals.as_ref().unwrap_or_else(|| panic!("{}: no `signals:` in its manifest", m.name));
            let declared = |name: &str| sig.uses.iter().chain(&sig.fallback).any(|d| d == name);
            if let Some(t) = m.trigger.metric() {
                assert!(sig.uses.iter().any(|u| u == t), "{}: its trigger's {t} is not in signals.uses", m.name);
            }
            for metric in METRICS.iter().map(|d| d.name) {
                if rb.script_source.contains(&format!("\"{metric}\"")) {
                    assert!(declared(metric), "{}: the script reads {metric}, not in its signals", m.name);
                }
            }
            assert!(sig.when_absent.is_some(), "{}: signals.when_absent says what it does without them", m.name);
        }
    }
    assert_eq!(checked, 10, "five rows, each with its alert-started twin");
}

/// Issue 57, "counted": every shipped scenario of a workload row (H6, H7,
/// H9, H10, H12) states how many notifications it sends — a finding told
/// twice, or a healthy job told once, fails its own scenario — and each
/// row's runbook runs in a night-long (≥ 8 h) or engine-restart case.
#[test]
fn every_workload_row_scenario_counts_its_notifications() {
    use nightshift_sim::scenario::{Restart, Scenario};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let scenarios: Vec<Scenario> =
        scenario_files(&root.join("scenarios")).iter().map(|f| Scenario::load(f).unwrap()).collect();
    let rows = ["H6", "H7", "H9", "H10", "H12"];
    let of_rows: Vec<&Scenario> =
        scenarios.iter().filter(|s| s.handbook.as_deref().is_some_and(|h| rows.contains(&h))).collect();
    assert!(of_rows.len() >= 25, "{} workload-row scenarios", of_rows.len());
    let uncounted: Vec<&str> =
        of_rows.iter().filter(|s| s.expect.notifications.is_none()).map(|s| s.name.as_str()).collect();
    assert!(uncounted.is_empty(), "scenarios that do not count their notifications: {uncounted:?}");
    let row_runbooks = ["mem-fragmentation", "mem-headroom", "gpu-starved", "util-swing", "comm-overhead"];
    for rb in row_runbooks {
        let long_or_restart = of_rows.iter().any(|s| {
            s.runbooks.as_ref().is_some_and(|r| r.iter().any(|n| n == rb))
                && (s.duration_secs >= 8 * 3600 || s.timeline.iter().any(|e| e.restart == Some(Restart::Engine)))
        });
        assert!(long_or_restart, "{rb}: no night-long or engine-restart scenario");
    }
}

/// Issue 42 point 12: the no-op check. Every scenario runs again with its
/// runbooks' scripts replaced by ones that do nothing; a scenario that
/// still passes proves nothing about what its runbook does, so it must say
/// why (`passes_with_a_no_op`: a trigger test, or one whose point is that
/// nothing happens) — and one that says so must still pass that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_that_passes_with_a_no_op_script_says_why() {
    use nightshift_sim::scenario::{Scenario, run_no_op};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let files = scenario_files(&root.join("scenarios"));
    let (mut undeclared, mut stale, mut declared) = (Vec::new(), Vec::new(), 0);
    for f in &files {
        let s = Scenario::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let r = run_no_op(f, &root).await.unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        match (r.passed, &s.passes_with_a_no_op) {
            (true, None) => undeclared.push(s.name.clone()),
            (false, Some(_)) => stale.push(format!("{}: {}", s.name, r.failures.join("; "))),
            (true, Some(_)) => declared += 1,
            (false, None) => {}
        }
    }
    eprintln!("{} scenarios; {declared} pass with a no-op script and say why", files.len());
    assert!(
        undeclared.is_empty(),
        "these pass with every script a no-op: say why in `passes_with_a_no_op`, or make them assert what the runbook does:\n{}",
        undeclared.join("\n")
    );
    assert!(
        stale.is_empty(),
        "these say they pass with a no-op but fail so: drop `passes_with_a_no_op`:\n{}",
        stale.join("\n")
    );
}

/// Issue 42 point 11: the shipped `GpuXidFatal` rule pages on every XID the
/// health model's table calls a fault — 48 aside, which `GpuEccDoubleBit`
/// pages on (one page for a DBE, not two) — and on nothing else.
#[test]
fn the_fatal_xid_rule_covers_every_fault_of_the_xid_table() {
    let rules = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/prometheus-rules.yml"))
        .unwrap();
    let expr = rules
        .split("alert: GpuXidFatal")
        .nth(1)
        .and_then(|rest| rest.lines().find_map(|l| l.trim().strip_prefix("expr:")))
        .expect("the GpuXidFatal rule and its expr");
    let mut in_rule: Vec<u32> = expr
        .split(" or ")
        .map(|term| {
            let code = term.trim().strip_prefix("DCGM_FI_DEV_XID_ERRORS == ").unwrap_or_else(|| panic!("{term:?}"));
            code.trim().parse().unwrap_or_else(|_| panic!("{term:?}"))
        })
        .collect();
    in_rule.sort();
    let faults: Vec<u32> = nightshift_engine::embed::XidPolicy::shipped()
        .entries()
        .filter(|x| x.action.is_fault() && x.code != 48)
        .map(|x| x.code)
        .collect();
    assert_eq!(in_rule, faults, "GpuXidFatal's codes against the XID table (48 is GpuEccDoubleBit's)");
}

/// An alert variant is its row's runbook started another way: it keeps the
/// row's limits and parameters (breaker, blast radius, budgets, class,
/// params…) — a storm of alerts meets the same breaker as a storm of
/// readings. Only the name, description, trigger, signals and the script's
/// path differ.
#[test]
fn alert_variants_keep_their_rows_limits() {
    use nightshift_sim::scenario::load_runbooks;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (main, _) = load_runbooks(&root.join("runbooks"));
    let (alerts, _) = load_runbooks(&root.join("runbooks/alerts"));
    assert!(main.errors.is_empty() && alerts.errors.is_empty(), "{:?} {:?}", main.errors, alerts.errors);
    let limits = |m: &nightshift_engine::embed::Manifest| {
        let mut v = serde_json::to_value(m).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["name", "description", "trigger", "alert_triggers", "signals", "script"] {
            o.remove(k);
        }
        v
    };
    let mut drift = Vec::new();
    for a in &alerts.runbooks {
        let base_name = a.manifest.script.trim_start_matches("../").trim_end_matches(".rhai");
        let base = main.runbooks.iter().find(|r| r.manifest.name == base_name);
        let base = base.unwrap_or_else(|| panic!("{}: no runbook {base_name} in runbooks/", a.manifest.name));
        let (va, vb) = (limits(&a.manifest), limits(&base.manifest));
        for (k, want) in vb.as_object().unwrap() {
            let found = &va[k];
            if found != want {
                drift.push(format!("{}: {k} expected {want} (as {base_name}), found {found}", a.manifest.name));
            }
        }
    }
    assert!(drift.is_empty(), "alert variants drift from their rows:\n{}", drift.join("\n"));
}
