//! `scripts/gpu-check.sh` against the fake NVML library and a stand-in
//! `nvidia-smi` reporting the same GPUs: it passes when they agree and
//! fails, naming the field, when they do not.

use std::path::{Path, PathBuf};
use std::process::Command;

fn build_fake(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
    let out = dir.join("libnvidia-ml.so.1");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("a C compiler (`cc`) is needed to build the fake NVML library");
    assert!(status.success());
    out
}

fn gpu_check(lib: &Path, temp0: &str) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fake_bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml");
    let path = format!("{}:{}", fake_bin.display(), std::env::var("PATH").unwrap_or_default());
    Command::new(root.join("scripts/gpu-check.sh"))
        .env("PATH", path)
        .env("NIGHTSHIFT_AGENT", env!("CARGO_BIN_EXE_nightshift-agent"))
        .env("NIGHTSHIFT_NVML_LIB", lib)
        .env("FAKE_SMI_TEMP_0", temp0)
        .output()
        .expect("bash runs scripts/gpu-check.sh")
}

#[test]
fn gpu_check_compares_probe_with_nvidia_smi() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_fake(dir.path());
    let o = gpu_check(&lib, "71");
    let text = String::from_utf8_lossy(&o.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("gpu-check: ok (2 GPU(s), backend nvml)"), "{text}");
    // nvidia-smi says GPU 0 is at 90 °C; NVML through nightshift says 71.
    let o = gpu_check(&lib, "90");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("GPU 0 temperature C: nightshift 71.0, nvidia-smi 90.0"), "{text}");
}
