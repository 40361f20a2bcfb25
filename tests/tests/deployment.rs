//! The systemd units in `examples/systemd/` are valid for systemd (checked
//! by `systemd-analyze verify`, with the real binaries in place of
//! `/usr/local/bin`) and keep their hardening. Their command lines are
//! checked against the CLIs by unit tests in `agent/src/main.rs` and
//! `cli/src/main.rs`.

use std::path::Path;
use std::process::Command;

use nightshift_tests::external::{require, workspace_bin_dir};

fn unit(name: &str) -> String {
    let path = format!("{}/../examples/systemd/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn units_keep_their_hardening() {
    let common = [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictNamespaces", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("UMask", "0077"),
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
    ];
    let engine_only = [
        ("User", "nightshift"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("CapabilityBoundingSet", ""),
        ("ReadWritePaths", "/var/lib/nightshift"),
    ];
    for (name, extra) in [("nightshift-agent.service", &[][..]), ("nightshift-engine.service", &engine_only[..])] {
        let s = settings(&unit(name));
        for (k, v) in common.iter().chain(extra) {
            assert!(
                s.iter().any(|(a, b)| a == k && b == v),
                "{name} lost its hardening: expected {k}={v}, found {:?}",
                s.iter().filter(|(a, _)| a == k).collect::<Vec<_>>()
            );
        }
    }
    // The agent's state dir is writable, and it runs no helper as anyone else.
    let agent = settings(&unit("nightshift-agent.service"));
    assert!(agent.iter().any(|(k, v)| k == "ReadWritePaths" && v.contains("/var/lib/nightshift-agent")));
    assert!(!agent.iter().any(|(k, _)| k == "User"), "the agent runs as root; its envelope limits it");
}

#[test]
fn systemd_accepts_the_units() {
    let Some(analyze) = require("systemd-analyze", "systemd") else { return };
    let bins = workspace_bin_dir();
    let dir = tempfile::tempdir().unwrap();
    for name in ["nightshift-agent.service", "nightshift-engine.service"] {
        // The real binaries where the unit expects them installed.
        let text = unit(name)
            .replace("/usr/local/bin/nightshift-agent", &bins.join("nightshift-agent").display().to_string())
            .replace("/usr/local/bin/nightshift ", &format!("{} ", bins.join("nightshift").display()));
        assert!(!text.contains("/usr/local/bin"), "{name}: every binary path was replaced");
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new(&analyze)
            .args(["verify", "--man=no"])
            .arg(&path)
            .current_dir(Path::new("/"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Unknown keys and bad values are warnings on stderr with exit 0:
        // any line naming the unit is a finding.
        let findings: Vec<&str> = stderr.lines().filter(|l| l.contains(name)).collect();
        assert!(out.status.success() && findings.is_empty(), "systemd-analyze verify {name}:\n{stderr}");
    }
}
