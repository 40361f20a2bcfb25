//! The NVML backend against a fake `libnvidia-ml.so` built from
//! `fake_nvml/fake_nvml.c` by this test: real loading, real symbol lookup,
//! real unit conversion and error mapping — without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

use nightshift_agent::backend::nvml::NvmlBackend;
use nightshift_agent::backend::{Backend, Support};

/// The path whose existence makes the fake's GPU 1 lost.
fn lost_flag(dir: &Path) -> PathBuf {
    dir.join("gpu1-lost")
}

fn build_fake(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
    let out = dir.join("libnvidia-ml.so.1");
    let status = Command::new("cc")
        .arg(format!("-DFAKE_LOST_PATH=\"{}\"", lost_flag(dir).display()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("a C compiler (`cc`) is needed to build the fake NVML library");
    assert!(status.success(), "building the fake NVML library failed");
    out
}

// One test: the fake library keeps global state, shared by every load in
// this process.
#[test]
fn nvml_backend_against_the_fake_library() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_fake(dir.path());
    let b = NvmlBackend::open(Some(&lib)).expect("open fake nvml");

    // Inventory: power constraints arrive in milliwatts and leave in watts.
    let gpus = b.gpus();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!((gpus[0].power_min_watts, gpus[0].power_max_watts), (200.0, 700.0));
    assert_eq!(gpus[0].mem_total_mib, 81_920);
    assert!(!gpus[0].fan_control, "NotSupported fan count means no fan control");
    assert!(gpus[1].fan_control);
    assert_eq!(gpus[0].slowdown_temp_c, Some(92.0));
    assert_eq!(gpus[0].shutdown_temp_c, Some(97.0));
    assert_eq!(gpus[0].mem_max_temp_c, Some(95.0), "NVML's memory max threshold is the HBM's limit");
    assert_eq!(gpus[1].mem_max_temp_c, None, "a board without one reports none");

    // Telemetry with the right units.
    let (t, node) = b.sample().unwrap();
    assert_eq!(t[0].power_watts, 612.345);
    assert_eq!(t[0].power_limit_watts, 700.0);
    assert_eq!(t[0].temperature_c, 71.0);
    assert_eq!(t[0].mem_used_pct, 50.0);
    assert_eq!(t[0].util_pct, 93.0);
    assert_eq!(t[0].ecc_dbe_total, 2);
    assert_eq!(t[0].ecc_sbe_total, 5);
    assert_eq!(t[0].fan_pct, None);
    assert_eq!(t[1].fan_pct, Some(41.0));
    assert!(t[1].throttled && !t[0].throttled, "HW thermal slowdown bit maps to throttled");
    assert_eq!(t[1].throttle_reasons, ["hw_thermal_slowdown"]);
    assert_eq!(
        t[0].throttle_reasons,
        ["sw_power_cap", "hw_power_brake_slowdown"],
        "the power brake is named, and is not heat"
    );
    assert_eq!(node.nvlink_links_total, None, "NVLink state NotSupported: no link readings");

    // Setting a power limit sends milliwatts: 450.5 W reads back as 450.5 W.
    assert_eq!(b.set_power_limit(0, 450.5).unwrap(), Support::Done(()));
    assert_eq!(b.sample().unwrap().0[0].power_limit_watts, 450.5);

    // NO_PERMISSION is an error that says what to do.
    let err = b.set_power_limit(1, 250.0).unwrap_err().to_string();
    assert!(err.contains("must run as root"), "{err}");

    // Fanless board: "does not apply", not a failure.
    assert!(matches!(b.set_fan_speed(0, 80.0).unwrap(), Support::NotSupported(_)));
    assert_eq!(b.set_fan_speed(1, 80.0).unwrap(), Support::Done(()));
    assert_eq!(b.sample().unwrap().0[1].fan_pct, Some(80.0));
    assert_eq!(b.reset_fan(1).unwrap(), Support::Done(()));
    assert_eq!(b.sample().unwrap().0[1].fan_pct, Some(41.0));

    assert_eq!(b.clear_ecc(0).unwrap(), Support::Done(()));
    assert_eq!(b.sample().unwrap().0[0].ecc_dbe_total, 0);

    // A symbol the "driver" lacks fails when called, with advice.
    let err = b.set_clocks(0, 1000, 1500).unwrap_err().to_string();
    assert!(err.contains("the installed driver lacks") && err.contains("upgrade the driver"), "{err}");

    // Out-of-range GPU index.
    assert!(b.set_power_limit(5, 300.0).unwrap_err().to_string().contains("no GPU 5"));

    // GPU 1 falls off the bus: its reading says lost, GPU 0 still reports,
    // and the node's sample does not fail.
    std::fs::write(lost_flag(dir.path()), "").unwrap();
    let (t, _) = b.sample().expect("one lost GPU must not blind the node");
    assert_eq!(t.len(), 2);
    assert!(!t[0].lost);
    assert_eq!((t[0].temperature_c, t[0].power_watts), (71.0, 612.345));
    assert!(t[1].lost, "{:?}", t[1]);
    let detail = t[1].lost_detail.clone().unwrap_or_default();
    assert!(!detail.is_empty(), "a lost GPU says why");
    assert_eq!(t[1].temperature_c, 0.0, "a lost GPU reports nothing it did not read");
    // It answers again (a reset): no longer lost.
    std::fs::remove_file(lost_flag(dir.path())).unwrap();
    let (t, _) = b.sample().unwrap();
    assert!(!t[1].lost && t[1].temperature_c == 66.0, "{:?}", t[1]);
}

#[test]
fn missing_library_is_reported_plainly() {
    let err = NvmlBackend::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err().to_string();
    assert!(err.starts_with("nvml: the NVIDIA driver library could not be loaded"), "{err}");
    let err = nightshift_agent::backend::open_auto(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no GPU found by any backend") && err.contains("--backend sim"), "{err}");
}
