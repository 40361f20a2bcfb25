//! `nightshift backtest` against a real Prometheus backfilled with a
//! recording (`promtool tsdb create-blocks-from openmetrics`): the seeds'
//! six-hour temperature climb on one GPU (H3, then H1 as it passes 85 °C)
//! and a double-bit ECC error on another (H8), on an 8-GPU node whose other
//! GPUs are healthy. The whole handbook runs in shadow; the report names
//! those fires at the right times and targets, and nothing else.

use std::process::Command;

use nightshift_tests::external::{require, start_prometheus, workspace_bin_dir};

const STEP: i64 = 15;
/// The climb starts this long after the recording does.
const FLAT_SECS: i64 = 1800;
/// The DBE arrives this long after the recording starts.
const DBE_SECS: i64 = 4 * 3600;

fn temp(g: u32, t: i64) -> f64 {
    if g == 3 && t >= FLAT_SECS {
        // 5 °C an hour (the field report: 65 → 95 °C in six hours).
        65.0 + (t - FLAT_SECS) as f64 / 3600.0 * 5.0
    } else {
        62.0 + if g % 2 == 1 { 0.3 } else { 0.0 }
    }
}

fn recording(start_s: i64, hours: i64) -> String {
    let fields = [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ];
    let mut out = String::new();
    for f in fields {
        out.push_str(&format!("# TYPE {f} gauge\n"));
        for i in 0..=hours * 3600 / STEP {
            let t = i * STEP;
            for g in 0..8u32 {
                let v = match f {
                    "DCGM_FI_DEV_GPU_TEMP" => format!("{:.2}", temp(g, t)),
                    "DCGM_FI_DEV_POWER_USAGE" => "610".into(),
                    "DCGM_FI_DEV_POWER_MGMT_LIMIT" => "700".into(),
                    "DCGM_FI_DEV_GPU_UTIL" => "92".into(),
                    _ => (if g == 5 && t >= DBE_SECS { "1" } else { "0" }).into(),
                };
                out.push_str(&format!(
                    "{f}{{gpu=\"{g}\",UUID=\"GPU-bt1-{g}\",device=\"nvidia{g}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"bt1\"}} {v} {}\n",
                    start_s + t
                ));
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

#[test]
fn a_backtest_on_recorded_history_finds_the_fires_and_nothing_else() {
    let _serial = nightshift_tests::serial::module(module_path!());
    let Some(promtool) = require("promtool", "prometheus") else { return };
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let start_s = (now_s - 7 * 3600) / STEP * STEP;
    let end_s = start_s + 6 * 3600;
    std::fs::write(dir.path().join("rec.om"), recording(start_s, 6)).unwrap();
    let tsdb = dir.path().join("tsdb");
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(dir.path().join("rec.om"))
        .arg(&tsdb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(dir.path().join("p.yml"), "global: {scrape_interval: 15s}\n").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (prom, url) = rt.block_on(start_prometheus(
        &prometheus,
        &dir.path().join("p.yml"),
        &tsdb,
        &["--storage.tsdb.retention.time=30d"],
        &dir.path().join("prometheus.log"),
    ));

    let rfc = |s: i64| nightshift_engine::embed::format_rfc3339_ms(s * 1000);
    let runbooks = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runbooks");
    let report_path = dir.path().join("report.json");
    let out = Command::new(workspace_bin_dir().join("nightshift"))
        .current_dir(dir.path())
        .args([
            "backtest",
            "--all",
            "--prometheus",
            &url,
            "--start",
            &rfc(start_s),
            "--end",
            &rfc(end_s),
            "--step",
            "15s",
        ])
        .arg("--dir")
        .arg(&runbooks)
        .arg("--out")
        .arg(&report_path)
        .arg("--html")
        .arg(dir.path().join("report.html"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "backtest failed:\n{stdout}{stderr}\nprometheus log:\n{}", prom.log_text());
    assert!(stderr.contains("backtest: 100%"), "progress is shown: {stderr}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    // Everything recorded came back through Prometheus.
    assert_eq!(r["samples"], 5 * 8 * (6 * 3600 / STEP + 1), "{}", r["samples"]);
    assert_eq!((r["nodes"].clone(), r["gpus"].clone()), (1.into(), 8.into()));
    let fires: Vec<(String, String, i64)> = r["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["runbook"].as_str().unwrap().to_string(),
                f["target"].as_str().unwrap().to_string(),
                f["ts_ms"].as_i64().unwrap() / 1000,
            )
        })
        .collect();
    // Nothing else: only the climbing GPU's temperature runbooks and the
    // DBE's drain.
    for (rb, target, _) in &fires {
        let expected = matches!(
            (rb.as_str(), target.as_str()),
            ("gpu-temp-drift" | "gpu-temp-trend" | "gpu-overheat", "bt1/gpu3") | ("ecc-dbe-drain", "bt1/gpu5")
        );
        assert!(expected, "an unexpected fire: {rb} on {target}\n{stdout}");
    }
    let first = |rb: &str| fires.iter().filter(|f| f.0 == rb).map(|f| f.2 - start_s).min();
    // H3: the slow climb is caught within its first hour, before H1.
    let h3 = first("gpu-temp-drift").unwrap_or_else(|| panic!("no H3 fire:\n{stdout}"));
    assert!((FLAT_SECS..FLAT_SECS + 3600).contains(&h3), "H3 at +{h3} s\n{stdout}");
    // H1: once the GPU has been above 85 °C for 30 s.
    let crosses = FLAT_SECS + 4 * 3600; // 65 + 20 = 85 °C
    let h1 = first("gpu-overheat").unwrap_or_else(|| panic!("no H1 fire:\n{stdout}"));
    assert!(
        (crosses + 30..=crosses + 30 + 2 * STEP).contains(&h1),
        "H1 at +{h1} s, the GPU crossed 85 °C at +{crosses} s\n{stdout}"
    );
    // H8: at the DBE, on its GPU.
    let h8 = first("ecc-dbe-drain").unwrap_or_else(|| panic!("no H8 fire:\n{stdout}"));
    assert!((DBE_SECS..=DBE_SECS + STEP).contains(&h8), "H8 at +{h8} s, the DBE at +{DBE_SECS} s\n{stdout}");
    assert_eq!(fires.iter().filter(|f| f.0 == "ecc-dbe-drain").count(), 1, "one DBE, one drain\n{stdout}");
    // The RMA drain counts as drained from then to the end.
    assert_eq!(r["max_drained_at_once"], 1);
    // The terminal table and the page say the same.
    assert!(stdout.contains("ecc-dbe-drain") && stdout.contains("bt1/gpu5"), "{stdout}");
    let page = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(page.contains("gpu-overheat") && page.contains("bt1/gpu3"), "{page}");

    // The same recording from the file (streamed in two passes, never held)
    // gives the same report.
    let from_file = dir.path().join("from-file.json");
    let out = Command::new(workspace_bin_dir().join("nightshift"))
        .current_dir(dir.path())
        .args(["backtest", "--all", "--from"])
        .arg(dir.path().join("rec.om"))
        .arg("--dir")
        .arg(&runbooks)
        .arg("--out")
        .arg(&from_file)
        .args(["--max-memory", "4GiB"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "backtest --from failed:\n{stderr}");
    assert!(stderr.contains("peak memory"), "{stderr}");
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(&from_file).unwrap()).unwrap();
    for k in [
        "samples",
        "steps",
        "nodes",
        "gpus",
        "fires",
        "max_drained_at_once",
        "blast_radius_refusals",
        "start_ms",
        "end_ms",
    ] {
        assert_eq!(f[k], r[k], "{k} differs between --prometheus and --from");
    }
    // A memory bound the replay cannot keep stops it with a clear message.
    let out = Command::new(workspace_bin_dir().join("nightshift"))
        .current_dir(dir.path())
        .args(["backtest", "--all", "--from"])
        .arg(dir.path().join("rec.om"))
        .arg("--dir")
        .arg(&runbooks)
        .args(["--max-memory", "1MiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is above --max-memory 1 MiB"), "{stderr}");
}

/// The charts survive a takeover (or a restart): an engine whose source
/// is Prometheus rebuilds its plot history from it when it starts leading.
/// Two recorded hours of one GPU — a flat 58 °C and a double-bit ECC error
/// an hour in — show on the node's charts of an engine that just started,
/// and its triggers never saw them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plot_history_is_rebuilt_from_prometheus_when_an_engine_starts_leading() {
    let _serial = nightshift_tests::serial::module(module_path!());
    use nightshift_engine::embed::ids;
    let Some(promtool) = require("promtool", "prometheus") else { return };
    let Some(prometheus) = require("prometheus", "prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (start_s, end_s) = ((now_s - 3 * 3600) / STEP * STEP, (now_s - 4200) / STEP * STEP);
    let dbe_s = start_s + 3600;
    let mut om = String::new();
    for (f, v) in [("DCGM_FI_DEV_GPU_TEMP", None), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Some(dbe_s))] {
        om.push_str(&format!("# TYPE {f} gauge\n"));
        let mut t = start_s;
        while t <= end_s {
            let value = match v {
                None => "58".to_string(),
                Some(at) => (if t >= at { "1" } else { "0" }).to_string(),
            };
            om.push_str(&format!("{f}{{gpu=\"0\",UUID=\"GPU-ph-0\",Hostname=\"ph1\"}} {value} {t}\n"));
            t += STEP;
        }
    }
    om.push_str("# EOF\n");
    std::fs::write(dir.path().join("rec.om"), om).unwrap();
    let tsdb = dir.path().join("tsdb");
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(dir.path().join("rec.om"))
        .arg(&tsdb)
        .output()
        .unwrap();
    assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.path().join("p.yml"), "global: {scrape_interval: 15s}\n").unwrap();
    let (_prom, url) = start_prometheus(
        &prometheus,
        &dir.path().join("p.yml"),
        &tsdb,
        &["--storage.tsdb.retention.time=30d"],
        &dir.path().join("prometheus.log"),
    )
    .await;

    let sim = nightshift_agent::backend::sim::SimConfig { gpus: 1, ..Default::default() };
    let agent = nightshift_tests::TestAgent::start(dir.path(), "ph1", sim, "").await;
    let cfg = nightshift_tests::engine_setup(
        dir.path(),
        &[&agent],
        &[],
        &format!("sources: {{prometheus: {{url: '{url}', interval_secs: 3600}}}}\n"),
    );
    let engine = nightshift_engine::serve::start(cfg).await.unwrap();
    let (from, to) = (start_s * 1000, end_s * 1000);
    let temps = nightshift_tests::eventually(30, || {
        let t = engine.series("ph1", Some(0), ids::TEMPERATURE, from, to);
        (!t.is_empty()).then_some(t)
    })
    .await
    .expect("the recorded hours are on the chart");
    assert!(temps.iter().all(|p| p.1 == 58.0 && p.0 >= from && p.0 <= to), "{temps:?}");
    assert!(temps.len() >= 6, "points across the recorded hours: {}", temps.len());
    let dbe = engine.series("ph1", Some(0), ids::ECC_DBE, from, to);
    let step = dbe.iter().position(|p| p.1 == 1.0).map(|i| dbe[i].0);
    assert!(step.is_some_and(|t| (t - dbe_s * 1000).abs() <= 600_000), "the DBE's step near its time: {dbe:?}");
    // Charts only: no trigger acted on the recorded DBE.
    assert!(engine.runs(&Default::default()).unwrap().runs.is_empty());
    engine.shutdown().await;
}
